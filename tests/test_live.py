"""Live queries: a table is its committed Iceberg snapshot UNION the WAL tail after it, merged
by primary key. While continuous `sync` holds changes in the WAL (commit_interval 1h here, so
nothing reaches Iceberg), `skipprd query` must already equal Postgres: inserts, updates
(including of the key and of tables without a key), deletes, TRUNCATE, and large values an
update left unchanged. Iceberg itself must not have moved, which proves the tail did the work."""

from __future__ import annotations

import decimal
import json
import signal
import subprocess
import time
from typing import Sequence

from conftest import Database, Skippr, assert_no_panic, describe_run, quote_ident
from test_cdc import bg_log, stop, tx

def start_live(skippr: Skippr, tables: Sequence[str]) -> subprocess.Popen:
    """Snapshot once, then a continuous sync that never commits during the test."""
    skippr.write_config(list(tables), extra_pipeline={"commit_interval": "1h"})
    skippr.sync_once()
    return skippr.start("sync", "--pipeline", "app")


def wait_live(skippr: Skippr, tables: Sequence[str], proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Polls `skipprd query` until every table equals Postgres."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"sync exited with {proc.returncode}\n{bg_log(skippr)}")
        try:
            for t in tables:
                skippr.assert_table_matches(t, ("query",))
            return
        except AssertionError as e:
            last = e
        time.sleep(0.3)
    raise AssertionError(f"live query did not reach the source state within {timeout}s:\n{last}\n{bg_log(skippr)}")


def snapshot_id(skippr: Skippr, name: str) -> int | None:
    snap = skippr.table(name).current_snapshot()
    return None if snap is None else snap.snapshot_id


def query_json(skippr: Skippr, sql: str) -> list[dict]:
    proc = skippr.run("query", sql, "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, f"query failed: {sql}")
    return [json.loads(line, parse_float=decimal.Decimal) for line in proc.stdout.splitlines() if line.strip()]


def test_tail_is_visible_before_any_commit(skippr: Skippr, db: Database) -> None:
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2))")
    db.execute("INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 200) g")
    proc = start_live(skippr, ["accounts"])
    try:
        committed = snapshot_id(skippr, "accounts")
        before = skippr.read_pyiceberg("accounts", ["id"])
        tx(db, "INSERT INTO accounts VALUES (1001, 'new', 1.50)",
           "UPDATE accounts SET balance = balance + 1 WHERE id <= 20",
           "DELETE FROM accounts WHERE id BETWEEN 50 AND 59")
        tx(db, "UPDATE accounts SET id = 2001 WHERE id = 100",  # key change
           "UPDATE accounts SET owner = NULL WHERE id = 1001",
           "INSERT INTO accounts VALUES (55, 'back again', 0)")  # a deleted key returns
        tx(db, "DELETE FROM accounts WHERE id = 2001",
           "UPDATE accounts SET id = 100 WHERE id = 101")  # the freed key is reused
        wait_live(skippr, ["accounts"], proc)
        # Nothing was committed: the live answer came from the WAL tail.
        assert snapshot_id(skippr, "accounts") == committed
        assert skippr.read_pyiceberg("accounts", ["id"]) == before
        # Filters and projections reach both sides and agree with Postgres.
        got = query_json(skippr, "SELECT id, balance FROM accounts WHERE id < 25 OR id > 1000 ORDER BY id")
        want = db.execute("SELECT id, balance::text FROM accounts WHERE id < 25 OR id > 1000 ORDER BY id")
        assert [(r["id"], decimal.Decimal(r["balance"])) for r in got] == [(i, decimal.Decimal(b)) for i, b in want]
        agg = query_json(skippr, "SELECT count(*) AS n, sum(balance) AS s FROM accounts")
        n, s = db.execute("SELECT count(*), sum(balance)::text FROM accounts")[0]
        assert agg[0]["n"] == n and decimal.Decimal(agg[0]["s"]) == decimal.Decimal(s)
        # The system table shows the tail.
        status = query_json(skippr, "SELECT * FROM skippr.tables")
        row = next(r for r in status if r["table_name"] == "accounts")
        assert row["wal_tail_changes"] > 0 and row["wal_tail_rows"] > 0, row
        assert row["pipeline"] == "app" and row["table_schema"] == "analytics"
        assert row["lag_seconds"] >= 0
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    # After the stop everything is committed and every reader agrees.
    skippr.assert_table_matches("accounts", ("pyiceberg", "duckdb", "query"))
    status = query_json(skippr, "SELECT * FROM skippr.tables")
    row = next(r for r in status if r["table_name"] == "accounts")
    assert row["wal_tail_changes"] == 0 and row["wal_tail_rows"] == 0, row


def test_truncate_and_keyless_duplicates_in_the_tail(skippr: Skippr, db: Database) -> None:
    db.execute("CREATE TABLE events (id int PRIMARY KEY, kind text)")
    db.execute("INSERT INTO events SELECT g, 'k' || (g % 3) FROM generate_series(1, 50) g")
    db.execute("CREATE TABLE tags (name text, weight int)")
    db.execute("ALTER TABLE tags REPLICA IDENTITY FULL")
    db.execute("INSERT INTO tags VALUES ('a', 1), ('a', 1), ('a', 1), ('b', 2)")
    proc = start_live(skippr, ["events", "tags"])
    try:
        tx(db, "TRUNCATE events", "INSERT INTO events VALUES (7, 'after truncate')")
        # Remove one of three equal rows, then change another.
        tx(db, "DELETE FROM tags WHERE ctid = (SELECT ctid FROM tags WHERE name = 'a' LIMIT 1)")
        tx(db, "UPDATE tags SET weight = 5 WHERE ctid = (SELECT ctid FROM tags WHERE name = 'a' LIMIT 1)")
        tx(db, "INSERT INTO tags VALUES ('b', 2)")
        wait_live(skippr, ["events", "tags"], proc)
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    skippr.assert_table_matches("events", ("pyiceberg", "query"))
    skippr.assert_table_matches("tags", ("pyiceberg", "query"))


def test_unchanged_large_value_comes_from_the_committed_row(skippr: Skippr, db: Database) -> None:
    db.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, version int)")
    db.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
    db.execute("INSERT INTO docs SELECT g, repeat(md5(g::text), 400), 1 FROM generate_series(1, 5) g")
    proc = start_live(skippr, ["docs"])
    try:
        # The body is TOASTed and untouched: the change carries no value for it.
        tx(db, "UPDATE docs SET version = 2 WHERE id IN (1, 2)")
        tx(db, "UPDATE docs SET version = 3 WHERE id = 1")
        tx(db, "UPDATE docs SET id = 10 WHERE id = 3")
        wait_live(skippr, ["docs"], proc)
        bodies = query_json(skippr, "SELECT id, length(body) AS n FROM docs ORDER BY id")
        assert bodies == [{"id": i, "n": 12800} for i in (1, 2, 4, 5, 10)], bodies
    finally:
        assert stop(proc) == 0, bg_log(skippr)


def test_query_reads_the_wal_without_a_running_daemon(skippr: Skippr, db: Database) -> None:
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount int)")
    db.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 100) g")
    proc = start_live(skippr, ["orders"])
    tx(db, "UPDATE orders SET amount = -amount WHERE id % 10 = 0", "DELETE FROM orders WHERE id > 95")
    wait_live(skippr, ["orders"], proc)
    proc.send_signal(signal.SIGKILL)  # a crash: the changes are only in the WAL
    proc.wait()
    skippr.assert_table_matches("orders", ("query",))
    got = query_json(skippr, f"SELECT count(*) AS n FROM {quote_ident('analytics')}.orders WHERE amount < 0")
    assert got == [{"n": 9}]
