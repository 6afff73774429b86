"""Time travel through the gateway of `skipprd serve` and `skipprd query --as-of`: an LSN or
an instant answers the state Postgres had then, exactly, or refuses with 72000.

A bank-transfer writer runs while Iceberg commits every second. At several moments the
writer is held between transactions and Postgres's LSN, clock and full tables are recorded;
some moments are then left until an Iceberg commit has covered them (a snapshot ends
exactly there), others not (the writer goes on at once, so they fall between two commits).
Every moment is asked for only after Iceberg holds all of them and their WAL has left the
live WAL: the moments between commits are answered from the snapshot before them and the
WAL's history (kept for `snapshot_retention`). Each moment is asked for by LSN and by
instant and compared with the recorded copy."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from conftest import Database, Skippr, lsn_to_int
from test_consistency import ACCOUNTS, OPENING, bank, connect_gateway, transfer  # noqa: F401 (bank: a fixture)

STATE = ["SELECT id, balance FROM accounts ORDER BY id", "SELECT id, src, dst, amount FROM transfers ORDER BY id"]


class Writer(threading.Thread):
    """Transfers in a loop; `hold()` returns once it waits between two transactions."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.run_ok = threading.Event()
        self.held = threading.Event()
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.done = 0

    def hold(self) -> None:
        self.run_ok.clear()
        assert self.held.wait(30), "the writer did not pause"

    def go(self) -> None:
        self.run_ok.set()
        # Until the writer has taken the go, `held` may still be set by its last pause (a
        # later `hold()` would then return at once while a transfer runs).
        deadline = time.monotonic() + 30
        while self.held.is_set():
            assert time.monotonic() < deadline and not self.errors, "the writer did not go on"
            time.sleep(0.001)

    def run(self) -> None:
        import random

        rnd = random.Random(11)
        try:
            with self.db.connect() as conn:
                while not self.stop_event.is_set():
                    if not self.run_ok.is_set():
                        self.held.set()
                        self.run_ok.wait(0.05)
                        continue
                    self.held.clear()
                    transfer(conn, rnd)
                    self.done += 1
        except Exception as e:  # reported by the test
            self.errors.append(repr(e))
            self.held.set()


def record(db: Database) -> dict:
    """The source's LSN, clock and tables while the writer is held."""
    with db.connect(autocommit=True) as c:
        lsn, at = c.execute("SELECT pg_current_wal_insert_lsn()::text, clock_timestamp()").fetchone()
        return {"lsn": lsn, "at": at.isoformat(sep=" "), "tables": [c.execute(q).fetchall() for q in STATE]}


def wait_committed(gw: psycopg.Connection, lsn: str, proc) -> None:
    """Until every change before `lsn` is in an Iceberg commit (the writer is held)."""
    gw.execute(f"SELECT skippr.wait_lsn('{lsn}', '30s')")
    deadline = time.monotonic() + 60
    while gw.execute("SELECT max(wal_tail_changes) FROM skippr.tables").fetchone()[0] != 0:
        assert proc.poll() is None and time.monotonic() < deadline, "no Iceberg commit covered the moment"
        time.sleep(0.2)


def answer(gw: psycopg.Connection) -> tuple[list, str]:
    tables = [gw.execute(q).fetchall() for q in STATE]
    return tables, gw.execute("SELECT skippr.visible_lsn()").fetchone()[0]


#: Iceberg commits every second, so that a run passes many of them.
FAST = {"commit_interval": "1s"}


@pytest.mark.parametrize("bank", [FAST], indirect=True)
def test_as_of_answers_the_state_postgres_had(skippr: Skippr, db: Database, bank) -> None:
    port, proc = bank
    gw = connect_gateway(port, proc)
    writer = Writer(db)
    writer.start()
    committed: list[dict] = []  # moments an Iceberg commit covered before the writer went on
    loose: list[dict] = []  # moments the writer went on from at once
    try:
        for i in range(10):
            writer.go()
            time.sleep(0.4)  # lets transfers happen; nothing is asserted about time
            writer.hold()
            assert not writer.errors, writer.errors
            moment = record(db)
            if i % 2 == 0:
                wait_committed(gw, moment["lsn"], proc)
                committed.append(moment)
            else:
                loose.append(moment)
        last = record(db)
        # Live, for comparison: the same as the newest moment. Then until Iceberg holds
        # every moment: none is answered from the live WAL.
        gw.execute(f"SELECT skippr.wait_lsn('{last['lsn']}', '30s')")
        assert answer(gw)[0] == last["tables"]
        wait_committed(gw, last["lsn"], proc)
        snapshot_lsns = {
            lsn_to_int(s.summary.additional_properties["skippr.lsn"])
            for name in ("accounts", "transfers")
            for s in skippr.table(name).snapshots()
            if "skippr.lsn" in s.summary.additional_properties
        }
        between = [m for m in loose if lsn_to_int(m["lsn"]) not in snapshot_lsns]
        assert between, "no moment fell between two commits"

        moments = sorted(committed + loose, key=lambda m: lsn_to_int(m["lsn"])) + [last]
        for m in committed + [last]:
            gw.execute(f"SET skippr.as_of = '{m['lsn']}'")
            assert gw.execute("SHOW skippr.as_of").fetchone()[0] == m["lsn"]
            tables, seen = answer(gw)
            assert tables == m["tables"], f"as of {m['lsn']}: not the state Postgres had"
            assert seen == m["lsn"], (seen, m["lsn"])
            gw.execute(f"SET skippr.as_of = '{m['at']}'")
            tables, seen = answer(gw)
            assert tables == m["tables"], f"as of {m['at']} ({m['lsn']}): not the state Postgres had"
            # The LSN reported stands for the same state: the end of the last transaction
            # committed by then, or (newer than every transaction held) the live LSN; never
            # past the first transfer after the moment, which ends before the next moment.
            later = moments[moments.index(m) + 1:]
            if later:
                assert lsn_to_int(seen) < lsn_to_int(later[0]["lsn"]), (seen, m["lsn"], later[0]["lsn"])
            gw.execute(f"SET skippr.as_of = '{seen}'")
            assert answer(gw) == (m["tables"], seen), f"as of {seen}, the LSN reported for {m['at']}"
        # Between two commits: exact, from the snapshot before and the WAL's history.
        for m in loose:
            gw.execute(f"SET skippr.as_of = '{m['lsn']}'")
            assert answer(gw) == (m["tables"], m["lsn"]), f"as of {m['lsn']}: not the state Postgres had"
            gw.execute(f"SET skippr.as_of = '{m['at']}'")
            assert answer(gw)[0] == m["tables"], f"as of {m['at']} ({m['lsn']}): not the state Postgres had"
        # `skipprd query --as-of` takes the same values and answers the same.
        for m, point in ((between[0], between[0]["lsn"]), (between[-1], between[-1]["at"]), (committed[0], committed[0]["lsn"])):
            out = skippr.run("query", "--as-of", point, "--format", "csv", STATE[0]).stdout
            rows = [tuple(int(v) for v in line.split(",")) for line in out.strip().splitlines()[1:]]
            assert rows == [tuple(r) for r in m["tables"][0]], f"skipprd query --as-of {point}"
        bad = skippr.run("query", "--as-of", "yesterday", "SELECT 1", check=False)
        assert bad.returncode != 0 and "timestamp with a time zone" in bad.stderr, bad.stderr
        # A join at a past LSN sees both tables at it: balances agree with the transfers.
        gw.execute(f"SET skippr.as_of = '{committed[1]['lsn']}'")
        total = gw.execute("SELECT sum(balance) FROM accounts").fetchone()[0]
        assert total == ACCOUNTS * OPENING

        # RESET returns to live; so does RESET ALL.
        gw.execute("RESET skippr.as_of")
        assert gw.execute("SHOW skippr.as_of").fetchone()[0] == ""
        tables, seen = answer(gw)
        assert tables == last["tables"] and lsn_to_int(seen) >= lsn_to_int(committed[-1]["lsn"])
        gw.execute(f"SET skippr.as_of = '{committed[0]['lsn']}'")
        gw.execute("RESET ALL")
        assert answer(gw)[0] == last["tables"]

        # Bad values are refused with 22023 naming the forms accepted.
        for bad in ("yesterday", "2026-12-01 10:00:00", "0/xyz"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
                gw.execute(f"SET skippr.as_of = '{bad}'")
            assert "timestamp with a time zone" in str(e.value), str(e.value)
        # Before the tables were first copied: 72000.
        gw.execute("SET skippr.as_of = '0/10'")
        with pytest.raises(psycopg.errors.SnapshotTooOld) as e:
            answer(gw)
        assert "first copied" in str(e.value), str(e.value)
        # Ahead of the source: waits like skippr.min_lsn, then fails with 57014.
        gw.execute("SET skippr.wait_timeout = '200ms'")
        gw.execute("SET skippr.as_of = 'FFFFFFF/0'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            answer(gw)
        gw.execute("RESET skippr.as_of")
    finally:
        writer.stop_event.set()
        writer.run_ok.set()
        writer.join(timeout=30)
    assert not writer.errors, writer.errors
    print(f"{writer.done} transfers; {len(between)} of {len(loose)} loose moments between two commits")
    gw.close()


@pytest.mark.parametrize("bank", [{**FAST, "maintenance": {
    "enabled": True, "check_interval": "200ms", "snapshot_retention": "1s", "min_snapshots_to_keep": 2,
    "orphan_file_age": "1h"}}], indirect=True)
def test_as_of_beyond_retention_names_the_settings(skippr: Skippr, db: Database, bank) -> None:
    port, proc = bank
    gw = connect_gateway(port, proc)
    first = record(db)
    # Several commits, each replacing the last; expiry then drops the oldest snapshots.
    for i in range(6):
        db.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        lsn = record(db)["lsn"]
        wait_committed(gw, lsn, proc)
    gw.execute(f"SET skippr.as_of = '{first['lsn']}'")
    deadline = time.monotonic() + 60
    while True:
        try:
            tables, _ = answer(gw)
            assert tables == first["tables"], "an answer at an old LSN must be exact"
        except psycopg.errors.SnapshotTooOld as e:
            assert "snapshot_retention" in str(e) and "min_snapshots_to_keep" in str(e), str(e)
            break
        assert proc.poll() is None and time.monotonic() < deadline, "the old snapshots were never expired"
        db.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")
        time.sleep(0.5)
    gw.close()
