"""Continuous `sync` killed with SIGKILL at random moments while a writer keeps changing
several tables: after a final `sync --once`, every reader must equal Postgres exactly: no lost
change, no duplicate row."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import psycopg

from conftest import Skippr, assert_no_panic
from test_cdc import (
    ALL_READERS,
    assert_position_deletes_only,
    assert_synced,
    bg_log,
    insert_lsn,
    primary_key_dups,
    table_lsn,
    slot_row,
    wait_slot_inactive,
)

SETUP = """
CREATE TABLE c_accounts (id bigint PRIMARY KEY, balance numeric(12,2) NOT NULL, note text,
                         updated_at timestamptz NOT NULL, tags text[]);
CREATE TABLE c_events (id bigint PRIMARY KEY, account_id bigint NOT NULL, kind text NOT NULL, payload jsonb);
CREATE TABLE c_pairs (a integer, b integer, v text, n integer NOT NULL DEFAULT 0, PRIMARY KEY (a, b));
INSERT INTO c_accounts SELECT i, i * 1.5, 'initial ' || i, '2024-01-01 00:00:00+00', ARRAY['t' || i]
    FROM generate_series(1, 2000) i;
INSERT INTO c_events SELECT i, 1 + i % 2000, 'init', jsonb_build_object('i', i) FROM generate_series(1, 1000) i;
INSERT INTO c_pairs SELECT a, b, 'v', 0 FROM generate_series(1, 20) a, generate_series(1, 20) b;
"""

TABLES = ["c_accounts", "c_events", "c_pairs"]
KEYS = {"c_accounts": ["id"], "c_events": ["id"], "c_pairs": ["a", "b"]}

KILLS = 8


class Writer(threading.Thread):
    """Random transactions over the three tables until stopped."""

    def __init__(self, dsn: str, seed: int):
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.transactions = 0
        self.next_account = 1_000_000
        self.next_event = 1_000_000

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    with conn.transaction():
                        for _ in range(self.rng.randint(1, 8)):
                            self.one_change(conn)
                    self.transactions += 1
                    time.sleep(self.rng.uniform(0, 0.02))
        except BaseException as e:  # reported by the test
            self.error = e

    def one_change(self, conn) -> None:
        r = self.rng.random()
        rid = self.rng.randint(1, 2000)
        if r < 0.20:
            self.next_account += 1
            conn.execute("INSERT INTO c_accounts VALUES (%s, %s, %s, now(), %s)",
                         (self.next_account, self.rng.randint(-10000, 10000) / 100, f"new {self.next_account}",
                          [f"x{self.rng.randint(0, 9)}", None]))
        elif r < 0.40:
            conn.execute("UPDATE c_accounts SET balance = balance + 1.01, note = %s, updated_at = now(), "
                         "tags = array_append(tags, 'u') WHERE id = %s", (f"upd {self.transactions}", rid))
        elif r < 0.47:
            conn.execute("DELETE FROM c_accounts WHERE id = (SELECT id FROM c_accounts WHERE id >= %s ORDER BY id LIMIT 1)",
                         (rid,))
        elif r < 0.52:
            self.next_account += 1
            conn.execute("UPDATE c_accounts SET id = %s WHERE id = (SELECT id FROM c_accounts WHERE id >= %s "
                         "ORDER BY id LIMIT 1)", (self.next_account, rid))
        elif r < 0.70:
            self.next_event += 1
            conn.execute("INSERT INTO c_events VALUES (%s, %s, %s, %s)",
                         (self.next_event, rid, self.rng.choice(["a", "b", "c"]),
                          psycopg.types.json.Jsonb({"t": self.transactions, "r": r})))
        elif r < 0.78:
            conn.execute("DELETE FROM c_events WHERE id IN (SELECT id FROM c_events ORDER BY id LIMIT 3)")
        elif r < 0.95:
            conn.execute("INSERT INTO c_pairs VALUES (%s, %s, %s, 1) ON CONFLICT (a, b) DO UPDATE "
                         "SET n = c_pairs.n + 1, v = excluded.v",
                         (self.rng.randint(1, 25), self.rng.randint(1, 25), f"p{self.transactions}"))
        elif r < 0.98:
            conn.execute("DELETE FROM c_pairs WHERE a = %s", (self.rng.randint(1, 25),))
        else:
            # a larger batch in the same transaction
            base = self.next_event + 1
            self.next_event += 300
            conn.execute("INSERT INTO c_events SELECT i, 1, 'batch', NULL FROM generate_series(%s, %s) i",
                         (base, self.next_event))


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(skippr: Skippr, db):
    seed = int(os.environ.get("SKIPPR_CRASH_SEED", random.randrange(2**32)))
    print(f"crash test seed {seed} (set SKIPPR_CRASH_SEED to replay)")
    rng = random.Random(seed)
    db.execute(SETUP)
    skippr.write_config(TABLES, extra_pipeline={"commit_interval": "1s"})

    writer = Writer(db.dsn(), seed)
    writer.start()
    logs: list[str] = []
    seen_lsns: list[int | None] = []
    started = time.monotonic()
    try:
        for i in range(KILLS):
            proc = skippr.start("sync", "--pipeline", "app")
            # the first run takes the snapshot (and may die in it); later ones stream
            delay = rng.uniform(1.0, 6.0) if i else rng.uniform(0.3, 8.0)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert writer.error is None, f"the writer failed: {writer.error!r}"
            exited = proc.poll()
            if exited is None:
                proc.send_signal(signal.SIGKILL)
            rc = proc.wait(timeout=30)
            log = bg_log(skippr)
            logs.append(f"=== run {i + 1}: killed after {delay:.1f}s ===\n{log}")
            assert exited is None, f"continuous sync exited on its own with {rc} in run {i + 1}\n{log}"
            assert rc == -signal.SIGKILL, rc
            assert "panicked" not in log, log
            # whatever Iceberg shows at a crash has unique keys
            lsn = None
            if (skippr.warehouse / "catalog.db").exists():
                for t in TABLES:
                    try:
                        rows = skippr.read_pyiceberg(t)
                        if t == "c_accounts":
                            lsn = table_lsn(skippr, t)
                    except Exception:
                        continue  # not created yet
                    dups = primary_key_dups(rows, KEYS[t])
                    assert not dups, f"after kill {i + 1}, {t} has duplicate keys {dups[:5]}"
            seen_lsns.append(lsn)
            print(f"kill {i + 1} after {delay:.1f}s: c_accounts at skippr.lsn {lsn}")
            wait_slot_inactive(db)
    finally:
        writer.stop_event.set()
        writer.join(timeout=30)
    assert writer.error is None, f"the writer failed: {writer.error!r}"
    print(f"{KILLS} kills in {time.monotonic() - started:.1f}s; writer committed {writer.transactions} transactions")
    assert writer.transactions > 50, "the writer made too few changes for the test to mean anything"
    # the kills must have hit a pipeline that was streaming and committing, not only starting up
    assert len({l for l in seen_lsns if l is not None}) >= 2, \
        f"Iceberg never advanced between kills (skippr.lsn after each: {seen_lsns})\n" + "\n".join(logs)[-8000:]

    before_final = insert_lsn(db)
    proc = skippr.sync_once()
    assert_no_panic(proc)
    try:
        assert_synced(skippr, db, TABLES)
        for t in TABLES:
            rows = skippr.read_pyiceberg(t)
            assert not primary_key_dups(rows, KEYS[t]), f"{t}: duplicate primary keys in PyIceberg's read"
            assert len(rows) == db.scalar(f"SELECT count(*) FROM {t}")
            assert_position_deletes_only(skippr, t, expect_some=False)
        s = slot_row(db)
        assert s is not None and not s["active"]
    except AssertionError as e:
        raise AssertionError(f"{e}\n\nseed {seed}; logs of the killed runs:\n" + "\n".join(logs)[-20000:]) from None
    print(f"final sync --once from {before_final}: ok; total {time.monotonic() - started:.1f}s")
