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

import psycopg
import pytest

from conftest import Database, Skippr, assert_no_panic, describe_run, free_port, quote_ident
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


FILTERS = [
    "id = 150000",                                  # updated, the update committed
    "id = 200001",                                  # deleted, the delete committed
    "id = 100",                                     # updated in the tail
    "id BETWEEN 127000 AND 132000",                 # across a row-group boundary (131,072)
    "id IN (1, 131072, 131073, 262144, 299999, 300500)",
    "grp = 7 AND id > 250000",
    "label = 'label 5'",
    "label LIKE 'label 99%'",
    "label IS NULL",
    "amount > 2999.5",
    "at >= '2026-01-03 12:00:00+00'",
    "id % 7 = 3 AND id < 1000",                     # nothing to prune with
    "id > 299990 OR id < 5",
    "id > 300000",                                  # only rows of the tail
    # Pages (8,192 rows) pruned by the page index: single pages, across page boundaries
    # within a row group, with committed deletes and tail changes on the pages kept.
    "id BETWEEN 8180 AND 8200",
    "id BETWEEN 8000 AND 25000",
    "id IN (8191, 8192, 8193, 16384, 75000, 75001, 128050)",
    "at BETWEEN '2026-01-02 10:00:00+00' AND '2026-01-02 10:30:00+00'",
    "id BETWEEN 128000 AND 128200",                 # mostly deleted in Iceberg
    "id BETWEEN 16380 AND 16400 AND grp > 10",      # two columns: row groups only
    "id < 0",
    # Proven true for every committed row group by its statistics (read without testing):
    # the tail's rows are still tested, and a NULL never passes.
    "id >= 1",
    "at >= '2026-01-01 00:00:00+00'",
    "label IS NOT NULL AND id < 100000",
    "NOT (label = 'label 5')",
]


def test_filters_skip_data_and_agree_with_postgres(skippr: Skippr, db: Database) -> None:
    """Filtered reads skip files, row groups and rows by the filters; with position deletes
    committed and changes in the tail, every answer must still equal Postgres's."""
    db.execute("CREATE TABLE big (id int PRIMARY KEY, grp int, label text, amount numeric(12,2), at timestamptz)")
    db.execute("INSERT INTO big SELECT g, g % 100, 'label ' || (g % 1000), g * 0.01,"
               " timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second'"
               " FROM generate_series(1, 300000) g")
    skippr.write_config(["big"])
    skippr.sync_once()
    # Changes committed by the next `--once` (position deletes in Iceberg) ...
    tx(db, "UPDATE big SET grp = 7, label = NULL WHERE id IN (150000, 131072, 5)",
       "DELETE FROM big WHERE id IN (200001, 262144) OR id BETWEEN 128000 AND 128100")
    proc = start_live(skippr, ["big"])
    try:
        # ... and changes only in the tail.
        tx(db, "UPDATE big SET label = 'label 5', amount = 9999 WHERE id IN (100, 131073, 299999)",
           "DELETE FROM big WHERE id BETWEEN 129000 AND 129010",
           "INSERT INTO big SELECT g, 7, NULL, 1, now() FROM generate_series(300001, 300600) g")
        wait_live(skippr, ["big"], proc)
        for where in FILTERS:
            got = query_json(skippr, f"SELECT count(*) AS n, sum(id) AS s, max(label) AS l FROM big WHERE {where}")
            (n, s, label), = db.execute(f"SELECT count(*), sum(id), max(label) FROM big WHERE {where}")
            assert (got[0]["n"], got[0]["s"], got[0]["l"]) == (n, s, label), where
        rows = query_json(skippr, "SELECT id, grp, label FROM big WHERE id IN (5, 100, 131072, 131073) ORDER BY id")
        want = db.execute("SELECT id, grp, label FROM big WHERE id IN (5, 100, 131072, 131073) ORDER BY id")
        assert [(r["id"], r["grp"], r["label"]) for r in rows] == [tuple(r) for r in want]
    finally:
        assert stop(proc) == 0, bg_log(skippr)


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


def test_schema_changes_are_live_before_their_commit(skippr: Skippr, db: Database) -> None:
    """An added column (of a built-in type, and of an enum the source's catalog names), a
    widened type and an incompatible type change show in `skipprd query` and through the
    gateway with the first change that carries them, before any commit, as the commit then
    writes them (sibling column `amount__text`)."""
    db.execute("CREATE TYPE mood AS ENUM ('ok', 'sad')")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n int, amount numeric(10,2))")
    db.execute("INSERT INTO items SELECT g, 'v' || g, g, g * 1.5 FROM generate_series(1, 30) g")
    port = free_port()
    skippr.write_config(["items"], extra_pipeline={"commit_interval": "1h"},
                        query={"listen": f"127.0.0.1:{port}"}, metrics_listen=f"127.0.0.1:{free_port()}")
    skippr.sync_once()
    committed = snapshot_id(skippr, "items")
    proc = skippr.start("serve")
    typed: set[int] = set()  # rows written after amount became text
    try:
        tx(db, "ALTER TABLE items ADD COLUMN tags text[], ADD COLUMN note text, ADD COLUMN m mood",
           "INSERT INTO items VALUES (31, 'new', 31, 4.25, ARRAY['a', NULL], 'hello', 'sad')",
           "UPDATE items SET note = 'touched' WHERE id = 2")
        tx(db, "ALTER TABLE items ALTER COLUMN n TYPE bigint",
           "UPDATE items SET n = 1099511627776 WHERE id = 3")
        tx(db, "ALTER TABLE items ALTER COLUMN amount TYPE text",
           "UPDATE items SET amount = 'n/a' WHERE id = 4",
           "INSERT INTO items (id, v, n, amount) VALUES (32, 'text amount', 32, '7 EUR')")
        typed.update({4, 32})

        def expected() -> list[dict]:
            out = []
            for id_, v, n, amount, tags, note, m in db.execute(
                    "SELECT id, v, n, amount, tags, note, m::text FROM items ORDER BY id"):
                out.append({"id": id_, "v": v, "n": n,
                            "amount": None if id_ in typed else decimal.Decimal(amount),
                            "tags": tags, "note": note, "m": m,
                            "amount__text": amount if id_ in typed else None})
            return out

        sql = "SELECT id, v, n, amount, tags, note, m, amount__text FROM items ORDER BY id"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, bg_log(skippr)
            proc_q = skippr.run("query", sql, "--format", "json", check=False)
            got = None
            if proc_q.returncode == 0:
                got = [json.loads(l, parse_float=decimal.Decimal) for l in proc_q.stdout.splitlines() if l.strip()]
                for r in got:
                    if r["amount"] is not None:
                        r["amount"] = decimal.Decimal(str(r["amount"]))
            if got == expected():
                break
            assert time.monotonic() < deadline, f"live schema not reached:\n{proc_q.stdout}{proc_q.stderr}\nwant {expected()}"
            time.sleep(0.3)
        # Nothing was committed: the new columns came from the WAL tail.
        assert snapshot_id(skippr, "items") == committed
        # The gateway shows the same, typed.
        with psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr",
                             autocommit=True) as conn:
            cur = conn.execute(sql.replace("FROM items", "FROM analytics.items"))
            rows = [dict(zip([d.name for d in cur.description], r)) for r in cur.fetchall()]
        assert rows == expected(), rows
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    # The commit wrote the same schema: every reader agrees with what the tail showed.
    fields = [f.name for f in skippr.table("items").schema().fields]
    assert fields == ["id", "v", "n", "amount", "tags", "note", "m", "amount__text"], fields
    got = query_json(skippr, sql)
    for r in got:
        if r["amount"] is not None:
            r["amount"] = decimal.Decimal(str(r["amount"]))
    assert got == expected(), got


def test_select_list_subqueries_answer_as_postgres_does(skippr: Skippr, db: Database) -> None:
    """Scalar subqueries in a select list, correlated, over a table named without an alias,
    or with a bound parameter, through the gateway's extended protocol: each answer equals
    Postgres's (a compatibility rewrite used to answer some of them with NULL)."""
    import psycopg

    from conftest import free_port

    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL, amount numeric(12,2))")
    db.execute("INSERT INTO orders SELECT g, g % 7, g * 1.5 FROM generate_series(1, 60) g")
    port = free_port()
    skippr.write_config(["orders"], query={"listen": f"127.0.0.1:{port}"})
    skippr.sync_once()
    proc = skippr.start("serve")
    queries: list[tuple[str, tuple]] = [
        ("SELECT (SELECT count(*) FROM orders WHERE id = %s) AS a", (3,)),
        ("SELECT (SELECT count(*) FROM orders WHERE id > %s) AS a, (SELECT max(amount) FROM orders WHERE customer = %s) AS b", (10, 2)),
        ("SELECT (SELECT max(orders.amount) FROM orders) AS m", ()),
        ("SELECT o.id, (SELECT count(*) FROM orders o2 WHERE o2.customer = o.customer) AS same FROM orders o WHERE o.id <= %s ORDER BY o.id", (8,)),
        ("SELECT (SELECT (SELECT count(*) FROM orders WHERE customer = %s) FROM orders WHERE id = %s) AS nested", (1, 5)),
    ]
    try:
        conn = connect_gateway(skippr, proc, port)
        with conn, db.connect() as pgc:
            problems = []
            for sql, params in queries:
                want = pgc.execute(sql, params).fetchall()
                try:
                    got = conn.execute(sql, params).fetchall()
                except psycopg.Error as e:
                    problems.append(f"{sql} {params}: {e}")
                    continue
                if got != want:
                    problems.append(f"{sql} {params}: gateway {got[:5]} != Postgres {want[:5]}")
            assert not problems, "\n".join(problems)
            # A correlation the engine cannot decorrelate (a non-equality) is refused with a
            # clear error, never answered with NULLs.
            with pytest.raises(psycopg.errors.FeatureNotSupported):
                conn.execute("SELECT o.id, (SELECT max(o2.amount) FROM orders o2 WHERE o2.customer = o.customer "
                             "AND o2.id < o.id) AS prev FROM orders o ORDER BY o.id").fetchall()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def connect_gateway(skippr: Skippr, proc: subprocess.Popen, port: int, timeout: float = 60.0) -> psycopg.Connection:
    """A connection to the gateway of `proc` (a `serve`), once it listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr", autocommit=True)
        except psycopg.OperationalError:
            assert proc.poll() is None and time.monotonic() < deadline, bg_log(skippr)
            time.sleep(0.2)


def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_lookups_by_primary_key_equal_postgres_committed_and_in_the_tail(skippr: Skippr, db: Database) -> None:
    """Prepared lookups by the whole primary key (one column and two, with an alias, a
    LIMIT, the key on either side, a json column) answer as Postgres does for rows that are
    committed, updated, deleted and inserted in the tail, and for keys that do not exist;
    they are served as lookups (`skippr_key_lookups_total` counts each), while a filter on
    part of a key still answers through the planner."""
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text, doc jsonb)")
    db.execute("INSERT INTO orders SELECT g, g * 1.5, 'n' || g, jsonb_build_object('g', g) FROM generate_series(1, 300) g")
    db.execute("CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))")
    db.execute("INSERT INTO pairs SELECT g % 20, 'b' || (g / 20), g FROM generate_series(1, 200) g")
    port, metrics = free_port(), free_port()
    skippr.write_config(["orders", "pairs"], extra_pipeline={"commit_interval": "1h"},
                        query={"listen": f"127.0.0.1:{port}"}, metrics_listen=f"127.0.0.1:{metrics}")
    skippr.sync_once()
    proc = skippr.start("serve")
    order_sqls = [
        "SELECT id, amount, note, doc FROM {t} WHERE id = %s",
        "SELECT note AS label, id FROM {t} WHERE %s = id LIMIT 1",
    ]
    pair_sql = "SELECT v, b, a FROM {t} WHERE a = %s AND b = %s"
    partial_sql = "SELECT a, b, v FROM {t} WHERE a = %s ORDER BY b"

    def compare(conn: psycopg.Connection, pgc: psycopg.Connection) -> tuple[int, list[str]]:
        lookups, wrong = 0, []
        for k in list(range(0, 310, 7)) + [2, 3, 299, 301, 305]:
            for sql in order_sqls:
                got = conn.execute(sql.format(t="orders"), (k,), prepare=True).fetchall()
                want = pgc.execute(sql.format(t="orders"), (k,)).fetchall()
                lookups += 1
                if got != want:
                    wrong.append(f"{sql} [{k}]: {got} != {want}")
        for a, b in [(0, "b1"), (3, "b0"), (19, "b9"), (5, "b10"), (7, "zz")]:
            got = conn.execute(pair_sql.format(t="pairs"), (a, b), prepare=True).fetchall()
            want = pgc.execute(pair_sql.format(t="pairs"), (a, b)).fetchall()
            lookups += 1
            if got != want:
                wrong.append(f"{pair_sql} [{a}, {b}]: {got} != {want}")
        for a in (0, 5):
            got = conn.execute(partial_sql.format(t="pairs"), (a,), prepare=True).fetchall()
            want = pgc.execute(partial_sql.format(t="pairs"), (a,)).fetchall()
            if got != want:
                wrong.append(f"{partial_sql} [{a}]: {got} != {want}")
        # A constant key in the text, through the simple protocol.
        got = conn.execute("SELECT id, note FROM orders WHERE id = 14").fetchall()
        want = pgc.execute("SELECT id, note FROM orders WHERE id = 14").fetchall()
        if got != want:
            wrong.append(f"literal key: {got} != {want}")
        return lookups, wrong

    try:
        conn = connect_gateway(skippr, proc, port)
        with conn, db.connect() as pgc:
            before = _metric(metrics, "skippr_key_lookups_total")
            lookups, wrong = compare(conn, pgc)
            assert not wrong, "committed rows:\n" + "\n".join(wrong[:10])
            served = _metric(metrics, "skippr_key_lookups_total") - before
            assert served >= lookups, f"{served} of {lookups} prepared lookups were served as lookups"
            tx(db, "UPDATE orders SET amount = -amount, note = 'changed' WHERE id % 7 = 0",
               "DELETE FROM orders WHERE id BETWEEN 20 AND 40",
               "INSERT INTO orders VALUES (301, 1, 'new', '{\"g\": 301}'), (305, 2, NULL, NULL)",
               "UPDATE orders SET id = 1000 + id WHERE id = 3",
               "UPDATE pairs SET v = -v WHERE a = 3", "DELETE FROM pairs WHERE a = 19",
               "INSERT INTO pairs VALUES (7, 'zz', 77)")
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, bg_log(skippr)
                lookups, wrong = compare(conn, pgc)
                if not wrong:
                    break
                assert time.monotonic() < deadline, "tail rows:\n" + "\n".join(wrong[:10])
                time.sleep(0.3)
    finally:
        assert stop(proc) == 0, bg_log(skippr)


def test_lookups_find_keys_in_a_file_written_out_of_key_order(skippr: Skippr, db: Database) -> None:
    """The snapshot writes rows in the source's physical order, which need not be key order:
    here the rows were inserted shuffled, so the committed file's keys do not ascend. Prepared
    lookups by key (served as lookups) must still find every committed row, miss the keys that
    do not exist, and see the tail's updates and deletes of rows anywhere in that file."""
    import pyarrow.parquet as pq

    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text)")
    db.execute("INSERT INTO orders SELECT g * 3, g * 1.5, 'n' || g FROM generate_series(1, 30000) g "
               "ORDER BY md5(g::text)")
    port, metrics = free_port(), free_port()
    skippr.write_config(["orders"], extra_pipeline={"commit_interval": "1h"},
                        query={"listen": f"127.0.0.1:{port}"}, metrics_listen=f"127.0.0.1:{metrics}")
    skippr.sync_once()
    files = [t.file.file_path for t in skippr.table("orders").scan().plan_files()]
    assert len(files) == 1, files
    ids = pq.read_table(files[0].removeprefix("file://"), columns=["id"]).column("id").to_pylist()
    assert ids != sorted(ids), "the snapshot's file is in key order: this test would not cover unordered files"
    proc = skippr.start("serve")
    sql = "SELECT id, amount, note FROM orders WHERE id = %s"
    keys = sorted(set(ids[::997] + ids[:3] + ids[-3:] + [min(ids), max(ids), 0, 1, 2, 4, 90001, 10**12]))

    def compare(conn: psycopg.Connection, pgc: psycopg.Connection) -> list[str]:
        wrong = []
        for k in keys:
            got = conn.execute(sql, (k,), prepare=True).fetchall()
            want = pgc.execute(sql, (k,)).fetchall()
            if got != want:
                wrong.append(f"[{k}]: {got} != {want}")
        return wrong

    try:
        conn = connect_gateway(skippr, proc, port)
        with conn, db.connect() as pgc:
            before = _metric(metrics, "skippr_key_lookups_total")
            wrong = compare(conn, pgc)
            assert not wrong, "committed rows:\n" + "\n".join(wrong[:10])
            assert _metric(metrics, "skippr_key_lookups_total") - before >= len(keys)
            changed = keys[1::2]
            listed = lambda ks: ", ".join(str(k) for k in ks)  # noqa: E731
            tx(db, f"UPDATE orders SET amount = -amount, note = 'changed' WHERE id IN ({listed(changed[::2])})",
               f"DELETE FROM orders WHERE id IN ({listed(changed[1::2])})")
            deadline = time.monotonic() + 60
            while wrong := compare(conn, pgc):
                assert proc.poll() is None, bg_log(skippr)
                assert time.monotonic() < deadline, "tail rows:\n" + "\n".join(wrong[:10])
                time.sleep(0.3)
    finally:
        assert stop(proc) == 0, bg_log(skippr)


def test_committed_reads_apply_each_commits_deletes_across_many_commits(skippr: Skippr, db: Database) -> None:
    """Twelve commits, maintenance off, each updating, deleting and re-inserting keys that
    earlier commits wrote or deleted: every commit adds a data file and a position delete
    file, and a delete applies only to files committed at or before it. After each commit the
    live query (whole table, and prepared lookups) equals Postgres, and so do PyIceberg and
    DuckDB reading the same snapshot."""
    db.execute("CREATE TABLE ledger (id bigint PRIMARY KEY, v int, note text)")
    db.execute("INSERT INTO ledger SELECT g, g, 'v0' FROM generate_series(1, 400) g")
    port = free_port()
    skippr.write_config(["ledger"], extra_pipeline={"maintenance": {"enabled": False}},
                        query={"listen": f"127.0.0.1:{port}"})
    skippr.sync_once()
    for r in range(1, 13):
        tx(db, f"UPDATE ledger SET v = v + 1000, note = 'u{r}' WHERE id % 13 = {r}",
           f"DELETE FROM ledger WHERE id % 17 = {r % 17}",
           f"INSERT INTO ledger SELECT g, -g, 'again {r}' FROM generate_series(1, 400) g "
           f"WHERE g % 17 = {(r - 1) % 17} ON CONFLICT (id) DO NOTHING")
        skippr.sync_once()
        skippr.assert_table_matches("ledger", ("query", "pyiceberg", "duckdb"))
    snapshots = list(skippr.table("ledger").snapshots())
    assert len(snapshots) >= 13, f"{len(snapshots)} snapshots: maintenance must not have merged the commits"
    proc = skippr.start("serve")
    try:
        conn = connect_gateway(skippr, proc, port)
        with conn, db.connect() as pgc:
            sql = "SELECT id, v, note FROM ledger WHERE id = %s"
            wrong = []
            for k in range(0, 402):
                got = conn.execute(sql, (k,), prepare=True).fetchall()
                want = pgc.execute(sql, (k,)).fetchall()
                if got != want:
                    wrong.append(f"[{k}]: {got} != {want}")
            assert not wrong, "\n".join(wrong[:10])
    finally:
        assert stop(proc) == 0, bg_log(skippr)


def test_statements_split_into_target_partitions_and_lookups_plan_one(skippr: Skippr, db: Database) -> None:
    """`skippr.query.target_partitions` reaches the engine in `serve` and in `skipprd query`:
    a whole scan of a table larger than a few row groups is split into that many parts, and
    the answer equals Postgres's; a lookup of one key by the planner reads one part."""
    db.execute("CREATE TABLE events (id bigint PRIMARY KEY, v int)")
    db.execute("INSERT INTO events SELECT g, g % 1000 FROM generate_series(1, 900000) g")
    port = free_port()
    skippr.write_config(["events"], query={"listen": f"127.0.0.1:{port}", "target_partitions": 3})
    skippr.sync_once()

    def scan_line(plan: list[str]) -> str:
        lines = [line for line in plan if "CommittedScan:" in line]
        assert len(lines) == 1, "\n".join(plan)
        return lines[0]

    whole = "SELECT v, count(*) AS n FROM events GROUP BY v ORDER BY v"
    lookup = "SELECT v FROM events WHERE id = 4242"
    cli = [r["plan"] for r in query_json(skippr, f"EXPLAIN {whole}")]
    assert "partitions=3," in scan_line("\n".join(cli).splitlines()), cli
    proc = skippr.start("serve")
    try:
        conn = connect_gateway(skippr, proc, port)
        with conn, db.connect() as pgc:
            plan = [r[1] for r in conn.execute(f"EXPLAIN {whole}").fetchall()]
            assert "partitions=3," in scan_line("\n".join(plan).splitlines()), plan
            assert conn.execute(whole).fetchall() == pgc.execute(whole).fetchall()
            plan = [r[1] for r in conn.execute(f"EXPLAIN {lookup}").fetchall()]
            assert "partitions=1," in scan_line("\n".join(plan).splitlines()), plan
            assert conn.execute(lookup).fetchall() == pgc.execute(lookup).fetchall() == [(242,)]
    finally:
        assert stop(proc) == 0, bg_log(skippr)


def test_a_filter_that_fails_on_a_replaced_committed_value_answers_from_the_tail(skippr: Skippr, db: Database) -> None:
    """The scan applies filters itself: a committed version the tail replaced is never
    shown, so a filter that cannot evaluate it (a cast of 'abc') must not fail the query."""
    db.execute("CREATE TABLE codes (id int PRIMARY KEY, s text)")
    db.execute("INSERT INTO codes SELECT g, 'abc' FROM generate_series(1, 50) g")
    proc = start_live(skippr, ["codes"])
    try:
        tx(db, "UPDATE codes SET s = '5' WHERE id = 7")
        wait_live(skippr, ["codes"], proc)
        rows = query_json(skippr, "SELECT id FROM codes WHERE id = 7 AND CAST(s AS integer) = 5")
        assert rows == [{"id": 7}], rows
        assert db.execute("SELECT id FROM codes WHERE id = 7 AND s::integer = 5") == [(7,)]
    finally:
        assert stop(proc) == 0, bg_log(skippr)
