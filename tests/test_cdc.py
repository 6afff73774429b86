"""Log-based CDC: `skipprd sync` streams the pipeline's replication slot into the Skippr WAL and
commits the changes to Iceberg (position deletes for updates and deletes). After every round,
Postgres, PyIceberg, DuckDB and `skipprd query` must agree row by row.

Also: continuous `sync` (commit_interval, SIGTERM/SIGINT), the cdc modes, and every case where
the pipeline must stop rather than silently lose or invent data."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import psycopg
import pytest

from conftest import (
    LSN_RE,
    Database,
    Skippr,
    _drop_database,
    assert_no_panic,
    assert_rows_equal,
    describe_run,
    expected_rows,
    lsn_to_int,
    normalize,
    pg_table_spec,
    start_cluster,
    stop_cluster,
)

#: Slot and publication of pipeline `app` in workspace `analytics`.
SLOT = "skippr_analytics_app"
PUBLICATION = "skippr_analytics_app"

ALL_READERS = ("pyiceberg", "duckdb", "query")

# --------------------------------------------------------------------------------------------
# Helpers (also used by test_cdc_crash.py)
# --------------------------------------------------------------------------------------------


def insert_lsn(db: Database) -> int:
    """The server's WAL insert position: every record written later is at or after it."""
    return lsn_to_int(db.scalar("SELECT pg_current_wal_insert_lsn()::text"))


def tx(db: Database, *statements: str) -> None:
    """Runs `statements` in one transaction."""
    with db.connect() as conn:
        with conn.transaction():
            for s in statements:
                conn.execute(s)


def slot_row(db: Database, slot: str = SLOT) -> dict | None:
    rows = db.execute(
        "SELECT slot_name, plugin, slot_type, active, active_pid, confirmed_flush_lsn::text, wal_status "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    if not rows:
        return None
    keys = ["slot_name", "plugin", "slot_type", "active", "active_pid", "confirmed_flush_lsn", "wal_status"]
    return dict(zip(keys, rows[0]))


def wait_slot_inactive(db: Database, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = slot_row(db)
        if s is None or not s["active"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"slot {SLOT} still active after {timeout}s: {slot_row(db)}")


def table_lsn(skippr: Skippr, name: str) -> int | None:
    """`skippr.lsn` of the Iceberg table's current snapshot (None without a snapshot)."""
    snap = skippr.table(name).current_snapshot()
    if snap is None:
        return None
    summary = dict(snap.summary.additional_properties)
    lsn = summary.get("skippr.lsn")
    assert lsn is not None, f"current snapshot of {name} lacks skippr.lsn: {summary}"
    assert LSN_RE.match(lsn), f"skippr.lsn {lsn!r} of {name} is not a Postgres LSN"
    return lsn_to_int(lsn)


def sync_round(skippr: Skippr, db: Database, tables: Sequence[str], changed: Sequence[str],
               statements: Sequence[str], *, in_one_tx: bool = False, **readers: Any) -> None:
    """Runs `statements` (one transaction with `in_one_tx`), then `sync --once`, and checks
    every table of `tables` against Postgres, `changed` among them."""
    before = insert_lsn(db)
    if in_one_tx:
        tx(db, *statements)
    else:
        for st in statements:
            db.execute(st)
    skippr.sync_once()
    assert_synced(skippr, db, tables, changed_since=before, changed=changed, **readers)


def assert_synced(
    skippr: Skippr,
    db: Database,
    tables: Sequence[str],
    *,
    changed_since: int | None = None,
    changed: Iterable[str] = (),
    readers: Sequence[str] = ALL_READERS,
) -> None:
    """Every table equals Postgres with every reader. With `changed_since` (an insert LSN taken
    before the round's changes): the tables in `changed` carry a `skippr.lsn` at or past it
    (and not past the server), and the slot acknowledged at least that far."""
    for t in tables:
        skippr.assert_table_matches(t, readers)
    if changed_since is not None:
        now = lsn_to_int(db.scalar("SELECT pg_current_wal_lsn()::text"))
        for t in changed:
            name = t.replace(".", "_") if not t.startswith("public.") else t[7:]
            lsn = table_lsn(skippr, name)
            assert lsn is not None and changed_since <= lsn <= now, (
                f"{name}: skippr.lsn {lsn} of the current snapshot does not cover the round's changes "
                f"(they start at {changed_since}, server is at {now})"
            )
        s = slot_row(db)
        assert s is not None, f"replication slot {SLOT} disappeared"
        assert lsn_to_int(s["confirmed_flush_lsn"]) >= changed_since, (
            f"slot {SLOT} was not acknowledged past the synced changes: confirmed_flush_lsn "
            f"{s['confirmed_flush_lsn']}, changes started at {changed_since}"
        )


def file_contents(skippr: Skippr, name: str) -> list[int]:
    """`content` of every live file of the table: 0 data, 1 position deletes, 2 equality deletes.
    (Read from the manifests: `inspect.files()` cannot build its metrics for uuid columns.)"""
    table = skippr.table(name)
    snap = table.current_snapshot()
    if snap is None:
        return []
    return [int(e.data_file.content) for m in snap.manifests(table.io)
            for e in m.fetch_manifest_entry(table.io, discard_deleted=True)]


def assert_position_deletes_only(skippr: Skippr, name: str, expect_some: bool) -> None:
    contents = file_contents(skippr, name)
    assert 2 not in contents, f"{name} has equality delete files; updates and deletes must be position deletes"
    if expect_some:
        assert 1 in contents, f"{name} had rows deleted or updated but has no position delete file: {contents}"


def primary_key_dups(rows: list[dict], key: Sequence[str]) -> list[tuple]:
    seen, dups = set(), []
    for r in rows:
        k = tuple(r[c] for c in key)
        if k in seen:
            dups.append(k)
        seen.add(k)
    return dups


def bg_log(skippr: Skippr) -> str:
    out = []
    for f in ("bg.stdout", "bg.stderr"):
        p = skippr.workdir / f
        if p.exists():
            txt = p.read_text(errors="replace")
            out.append(f"--- {f} ---\n{txt[-6000:]}")
    return "\n".join(out)


def wait_until_synced(skippr: Skippr, db: Database, tables: Sequence[str], proc: subprocess.Popen | None,
                      timeout: float = 60.0) -> float:
    """Polls PyIceberg until every table equals Postgres; returns the seconds it took."""
    start = time.monotonic()
    last: Exception | None = None
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"continuous sync exited with {proc.returncode} while waiting\n{bg_log(skippr)}")
        try:
            for t in tables:
                skippr.assert_table_matches(t, ("pyiceberg",))
            return time.monotonic() - start
        except Exception as e:  # not there yet: no catalog, no table, or old rows
            last = e
        if time.monotonic() - start > timeout:
            raise AssertionError(
                f"changes did not reach Iceberg within {timeout}s; last difference:\n{last}\n{bg_log(skippr)}"
            )
        time.sleep(0.5)


def wait_paused(skippr: Skippr, proc: subprocess.Popen, point: str, what: str, timeout: float = 120) -> None:
    """Waits until the background `skipprd` (started with SKIPPR_TEST_PAUSE_AT=point) reports
    that it paused there; fails if it exits or does not get there in time."""
    deadline = time.monotonic() + timeout
    while f"paused at {point}" not in (skippr.workdir / "bg.stderr").read_text(errors="replace"):
        assert proc.poll() is None, f"{what} exited before the pause point {point}\n{bg_log(skippr)}"
        assert time.monotonic() < deadline, f"{what} did not reach the pause point {point}\n{bg_log(skippr)}"
        time.sleep(0.1)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"sync did not exit within {timeout}s of {signal.Signals(sig).name}")


def assert_fails(skippr: Skippr, *args: str, must_name: Sequence[str] = (), what: str = "") -> subprocess.CompletedProcess:
    """Runs `sync --pipeline app --once` (plus args); it must exit non-zero, without a panic,
    with every string of `must_name` in stderr."""
    proc = skippr.run("sync", "--pipeline", "app", "--once", *args, check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, f"succeeded, but must fail: {what}")
    for s in must_name:
        assert s in proc.stderr, describe_run(proc, f"error does not mention {s!r} ({what})")
    return proc


def resnapshot(skippr: Skippr) -> subprocess.CompletedProcess:
    proc = skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot")
    assert_no_panic(proc)
    return proc


# --------------------------------------------------------------------------------------------
# Schema of the main CDC tables
# --------------------------------------------------------------------------------------------

SETUP = """
CREATE SCHEMA sales;
CREATE TABLE accounts (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    balance numeric(12,2),
    ratio numeric,
    opened_at timestamptz,
    ext_id uuid,
    attrs jsonb,
    tags text[],
    active boolean,
    born date,
    seen timestamp,
    score double precision,
    counts integer[]
);
CREATE TABLE orders (
    customer_id bigint NOT NULL,
    order_no integer NOT NULL,
    amount numeric(10,2) NOT NULL,
    note text,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (customer_id, order_no)
);
CREATE TABLE sales.invoices (id uuid PRIMARY KEY, total double precision, paid boolean, lines jsonb, issued date);

-- deterministic row generators: `salt` makes a new version of the same key differ
CREATE FUNCTION acct(i bigint, salt text DEFAULT '') RETURNS SETOF accounts LANGUAGE sql AS $$
SELECT i,
       ('acct ' || i || salt)::text,
       (CASE WHEN i % 11 = 0 THEN NULL
             ELSE (CASE WHEN i % 4 = 0 THEN -1 ELSE 1 END) * ((i * 1234.567 + length(salt)) % 100000) END)::numeric(12,2),
       (CASE WHEN i % 13 = 0 THEN NULL ELSE round(i / 7.0 + length(salt), 9) END)::numeric,
       (CASE WHEN i % 17 = 0 THEN NULL
             ELSE timestamptz '2024-01-01 00:00:00+00' + i * interval '37 min 1.234567 sec' + length(salt) * interval '1 hour' END)::timestamptz,
       (CASE WHEN i % 19 = 0 THEN NULL ELSE md5(i::text || salt)::uuid END)::uuid,
       (CASE WHEN i % 23 = 0 THEN NULL
             ELSE jsonb_build_object('i', i, 'salt', salt, 'even', i % 2 = 0, 'nested', jsonb_build_array(i, 'x', NULL)) END)::jsonb,
       (CASE WHEN i % 29 = 0 THEN NULL WHEN i % 5 = 0 THEN '{}'::text[]
             ELSE ARRAY['t' || i, NULL, 'quote"d, ' || salt, 'ünï 😀'] END)::text[],
       (CASE WHEN i % 31 = 0 THEN NULL ELSE i % 2 = 0 END)::boolean,
       (date '2000-01-01' + (i % 10000)::int)::date,
       (timestamp '2020-02-29 12:00:00' + i * interval '1.5 sec')::timestamp,
       (CASE WHEN i % 37 = 0 THEN NULL ELSE i * 0.25 END)::double precision,
       ARRAY[(i % 1000)::int, NULL, -(i % 1000)::int]::integer[]
$$;
CREATE FUNCTION add_accounts(lo bigint, hi bigint, salt text DEFAULT '') RETURNS void LANGUAGE sql AS $$
    INSERT INTO accounts SELECT r.* FROM generate_series(lo, hi) i, LATERAL acct(i, salt) r;
$$;
CREATE FUNCTION add_orders(lo bigint, hi bigint, per integer, salt text DEFAULT '') RETURNS void LANGUAGE sql AS $$
    INSERT INTO orders
    SELECT c, o, ((c * 100 + o) / 7.0 + length(salt))::numeric(10,2),
           CASE WHEN o % 3 = 0 THEN NULL ELSE 'order ' || c || '/' || o || salt END,
           timestamptz '2023-06-01 08:00:00+02' + (c * o) * interval '1 minute 0.5 sec'
    FROM generate_series(lo, hi) c, generate_series(1, per) o;
$$;
CREATE FUNCTION add_invoices(lo integer, hi integer, salt text DEFAULT '') RETURNS void LANGUAGE sql AS $$
    INSERT INTO sales.invoices
    SELECT md5('inv' || i || salt)::uuid, i * 1.25, i % 2 = 0,
           CASE WHEN i % 4 = 0 THEN NULL ELSE jsonb_build_array(jsonb_build_object('sku', 'S' || i, 'qty', i % 5)) END,
           date '2024-01-01' + i
    FROM generate_series(lo, hi) i;
$$;
"""

MAIN_TABLES = ["accounts", "orders", "sales.invoices"]


def setup_main(db: Database) -> None:
    db.execute(SETUP)
    db.execute("SELECT add_accounts(1, 300)")
    db.execute("SELECT add_orders(1, 50, 4)")
    db.execute("SELECT add_invoices(1, 100)")


# --------------------------------------------------------------------------------------------
# 1. Change rounds with `sync --once`
# --------------------------------------------------------------------------------------------


def test_cdc_rounds_inserts_updates_deletes_key_changes_truncate(skippr: Skippr, db):
    setup_main(db)
    skippr.write_config(MAIN_TABLES)

    # round 0: the snapshot, with the slot and publication created for the change stream
    skippr.sync_once()
    assert_synced(skippr, db, MAIN_TABLES)
    s = slot_row(db)
    assert s is not None, f"snapshot_then_cdc created no slot named {SLOT}"
    assert (s["plugin"], s["slot_type"]) == ("pgoutput", "logical"), s
    assert not s["active"], f"slot still in use after sync --once exited: {s}"
    published = {(r[0], r[1]) for r in db.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (PUBLICATION,))}
    assert published == {("public", "accounts"), ("public", "orders"), ("sales", "invoices")}, published
    assert (skippr.workdir / ".skippr" / "wal" / "app").is_dir(), "no WAL folder at <config dir>/.skippr/wal/app"

    def round_(changed: Sequence[str], *statements: str, in_one_tx: bool = False) -> None:
        sync_round(skippr, db, MAIN_TABLES, changed, statements, in_one_tx=in_one_tx)

    # round 1: inserts
    round_(["accounts", "orders", "sales.invoices"],
           "SELECT add_accounts(301, 400)",
           "SELECT add_orders(51, 60, 3)",
           "SELECT add_invoices(101, 120)")

    # round 2: updates of non-key columns: values to NULL, NULL to values, the same row
    # several times in separate transactions
    round_(["accounts", "orders", "sales.invoices"],
           "UPDATE accounts SET balance = balance + 1, attrs = attrs || '{\"u\": 1}', "
           "tags = array_append(tags, 'upd'), opened_at = opened_at + interval '1 day 0.000001 sec', "
           "counts = counts || 7 WHERE id % 5 = 0",
           "UPDATE accounts SET name = 'renamed ' || id, ratio = NULL, ext_id = NULL, attrs = NULL, "
           "tags = NULL, active = NULL WHERE id % 7 = 0",
           "UPDATE accounts SET balance = 0.01, ratio = 123456789.123456789, tags = '{x}', "
           "attrs = '[1, \"two\", {\"three\": 3}]' WHERE balance IS NULL",
           "UPDATE accounts SET score = score * 2, seen = seen + interval '1 year' WHERE id = 10",
           "UPDATE accounts SET score = score * 2, born = born - 1 WHERE id = 10",
           "UPDATE accounts SET score = -score, name = 'third update' WHERE id = 10",
           "UPDATE orders SET amount = amount * 2, note = NULL WHERE order_no = 2",
           "UPDATE sales.invoices SET paid = NOT paid, lines = '{\"edited\": true}' WHERE total < 50")
    for t in ("accounts", "orders", "sales_invoices"):
        assert_position_deletes_only(skippr, t, expect_some=True)

    # round 3: deletes
    round_(["accounts", "orders", "sales.invoices"],
           "DELETE FROM accounts WHERE id % 3 = 0",
           "DELETE FROM orders WHERE customer_id = 7",
           "DELETE FROM sales.invoices WHERE total < 20")
    for t in ("accounts", "orders", "sales_invoices"):
        assert_position_deletes_only(skippr, t, expect_some=True)

    # round 4: key changes, including a key freed and reused in the same transaction
    round_(["accounts", "orders", "sales.invoices"],
           "UPDATE accounts SET id = id + 1000 WHERE id BETWEEN 1 AND 50",
           "UPDATE orders SET order_no = order_no + 100 WHERE customer_id = 3",
           "UPDATE orders SET customer_id = 9999, amount = 1.00 WHERE customer_id = 4 AND order_no = 1",
           "UPDATE sales.invoices SET id = md5('moved' || id::text)::uuid WHERE paid")
    round_(["accounts"],
           "UPDATE accounts SET id = 5000, name = 'was 100' WHERE id = 100",
           "INSERT INTO accounts SELECT * FROM acct(100, 'reused key')",
           "UPDATE accounts SET id = id + 1000 WHERE id = 1001",
           in_one_tx=True)

    # round 5: the same keys inserted, updated, deleted and inserted again, within one
    # transaction and across transactions of the round
    round_(["accounts"],
           "INSERT INTO accounts SELECT * FROM acct(9001, 'a')",
           "UPDATE accounts SET name = 'b' WHERE id = 9001",
           "DELETE FROM accounts WHERE id = 9001",
           "INSERT INTO accounts SELECT * FROM acct(9002, 'a')",
           "DELETE FROM accounts WHERE id = 9002",
           "INSERT INTO accounts SELECT * FROM acct(9002, 'second life')",
           in_one_tx=True)
    round_(["accounts"],
           "INSERT INTO accounts SELECT * FROM acct(9003, 'a')",
           "UPDATE accounts SET name = 'b', balance = NULL WHERE id = 9003",
           "DELETE FROM accounts WHERE id = 9003",
           "INSERT INTO accounts SELECT * FROM acct(9003, 'again')",
           "DELETE FROM accounts WHERE id = 200",
           "INSERT INTO accounts SELECT * FROM acct(200, 'deleted then reinserted')",
           "INSERT INTO accounts SELECT * FROM acct(9004, 'x')",
           "DELETE FROM accounts WHERE id = 9004")
    assert db.scalar("SELECT count(*) FROM accounts WHERE id IN (9001, 9004)") == 0

    # an idle round: nothing changed, nothing moves
    skippr.sync_once()
    assert_synced(skippr, db, MAIN_TABLES)

    # round 6: TRUNCATE between inserts and after them: rows inserted before the TRUNCATE vanish,
    # rows inserted after it (with keys the old rows had) stay; a table truncated with another
    round_(["accounts", "orders", "sales.invoices"],
           "SELECT add_accounts(20000, 20010, 'pre-truncate')",
           "TRUNCATE accounts",
           "SELECT add_accounts(1, 150, 'after truncate')",
           "UPDATE accounts SET name = 'post-truncate update' WHERE id < 10",
           "DELETE FROM accounts WHERE id = 5",
           "TRUNCATE orders, sales.invoices",
           "SELECT add_orders(1, 5, 2, 'after truncate')")
    assert db.scalar("SELECT count(*) FROM sales.invoices") == 0
    assert skippr.read_pyiceberg("sales_invoices") == []
    round_(["accounts"],
           "SELECT add_accounts(151, 160, 'x')",
           "TRUNCATE accounts",
           "SELECT add_accounts(1, 3, 'truncate and inserts in one transaction')",
           in_one_tx=True)
    assert db.scalar("SELECT count(*) FROM accounts") == 3

    # round 7: one transaction over several tables
    round_(["accounts", "orders", "sales.invoices"],
           "SELECT add_accounts(400, 420, 'multi')",
           "UPDATE orders SET amount = amount + 0.01",
           "DELETE FROM accounts WHERE id = 1",
           "SELECT add_invoices(1, 10, 'multi')",
           "UPDATE accounts SET id = 7777 WHERE id = 2",
           in_one_tx=True)

    for t in ("accounts", "orders", "sales_invoices"):
        assert_position_deletes_only(skippr, t, expect_some=False)


def test_cdc_large_transactions(skippr: Skippr, db):
    """A transaction of 100k inserts, then one of 50k updates and 33k deletes, then one that
    moves 40k keys."""
    setup_main(db)
    skippr.write_config(MAIN_TABLES)
    skippr.sync_once()

    before = insert_lsn(db)
    tx(db, "SELECT add_accounts(100000, 199999, 'bulk')")
    assert db.scalar("SELECT count(*) FROM accounts") == 100_300
    started = time.monotonic()
    skippr.sync_once()
    print(f"sync --once of a 100k-row transaction took {time.monotonic() - started:.1f}s")
    assert_synced(skippr, db, ["accounts"], changed_since=before, changed=["accounts"])

    before = insert_lsn(db)
    tx(db,
       "UPDATE accounts SET balance = coalesce(balance, 0) + 1, tags = array_append(tags, 'bulk upd') "
       "WHERE id >= 100000 AND id % 2 = 0",
       "DELETE FROM accounts WHERE id >= 100000 AND id % 3 = 0",
       "UPDATE orders SET note = 'bulk'")
    skippr.sync_once()
    assert_synced(skippr, db, MAIN_TABLES, changed_since=before, changed=["accounts", "orders"])

    before = insert_lsn(db)
    tx(db, "UPDATE accounts SET id = id + 1000000 WHERE id BETWEEN 100000 AND 160000")  # 40k rows left there
    skippr.sync_once()
    assert_synced(skippr, db, ["accounts"], changed_since=before, changed=["accounts"])
    rows = skippr.read_pyiceberg("accounts")
    assert not primary_key_dups(rows, ["id"]), "duplicate ids in PyIceberg's read of accounts"
    assert_position_deletes_only(skippr, "accounts", expect_some=True)


def test_every_type_through_cdc(skippr: Skippr, db):
    """Every type of the mapping arriving as change-stream text (inserts, updates, key moves,
    whole rows copied), not through the snapshot's copy."""
    from test_snapshot import ALL_TYPES_DDL, ALL_TYPES_ROWS, insert_rows

    db.execute(ALL_TYPES_DDL)
    insert_rows(db, "all_types", [r for r in ALL_TYPES_ROWS if r["id"] == "2"])
    skippr.write_config(["all_types"])
    skippr.sync_once()
    skippr.assert_table_matches("all_types")

    insert_rows(db, "all_types", [r for r in ALL_TYPES_ROWS if r["id"] != "2"])
    skippr.sync_once()
    skippr.assert_table_matches("all_types")

    # every column sent again, except large values left unchanged (TOAST)
    db.execute("UPDATE all_types SET c_varchar = coalesce(c_varchar, '') || '~'")
    skippr.sync_once()
    skippr.assert_table_matches("all_types")

    db.execute("UPDATE all_types SET id = id + 100")
    cols = ", ".join(r[0] for r in db.execute(
        "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = 'all_types'::regclass "
        "AND attnum > 1 AND NOT attisdropped ORDER BY attnum"))
    tx(db, f"INSERT INTO all_types SELECT id + 200, {cols} FROM all_types",
       f"UPDATE all_types t SET ({cols}) = (SELECT {cols} FROM all_types s WHERE s.id = 304) WHERE t.id = 102",
       f"UPDATE all_types t SET ({cols}) = (SELECT {cols} FROM all_types s WHERE s.id = 302) WHERE t.id = 104")
    assert db.scalar("SELECT c_text IS NULL FROM all_types WHERE id = 104")
    skippr.sync_once()
    skippr.assert_table_matches("all_types")


# --------------------------------------------------------------------------------------------
# Unchanged TOAST values
# --------------------------------------------------------------------------------------------

TOAST_SETUP = """
CREATE TABLE docs (id integer PRIMARY KEY, title text, version integer NOT NULL DEFAULT 0, body text, notes text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE docs ALTER COLUMN notes SET STORAGE EXTERNAL;
-- about 100 kB of random (incompressible, hence out-of-line) text
CREATE FUNCTION big_text(seed text) RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT string_agg(md5(random()::text || seed || g), '') FROM generate_series(1, 3200) g
$$;
CREATE FUNCTION add_docs(lo integer, hi integer) RETURNS void LANGUAGE sql AS $$
    INSERT INTO docs SELECT i, 'title ' || i, 0, big_text(i::text),
                            CASE WHEN i % 2 = 0 THEN NULL ELSE big_text('n' || i) END
    FROM generate_series(lo, hi) i;
$$;
"""


def assert_bodies_not_null(skippr: Skippr, db: Database) -> None:
    pg = dict(db.execute("SELECT id, md5(body) FROM docs"))
    got = {r["id"]: r["body"] for r in skippr.read_pyiceberg("docs")}
    lost = [i for i, h in pg.items() if h is not None and got.get(i) is None]
    assert not lost, f"docs: unchanged TOAST body became NULL in Iceberg for ids {sorted(lost)[:20]}"


def test_updates_keep_unchanged_toast_values(skippr: Skippr, db):
    db.execute(TOAST_SETUP)
    db.execute("SELECT add_docs(1, 20)")
    assert db.scalar("SELECT min(length(body)) FROM docs") >= 100_000
    toast_bytes = db.scalar("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'docs'")
    assert toast_bytes > 20 * 100_000, "bodies are not stored out of line: the test would prove nothing"
    skippr.write_config(["docs"])
    skippr.sync_once()
    assert_synced(skippr, db, ["docs"])

    # the previous version is in the snapshot's data files
    before = insert_lsn(db)
    db.execute("UPDATE docs SET title = title || ' v1', version = version + 1 WHERE id <= 10")
    skippr.sync_once()
    assert_bodies_not_null(skippr, db)
    assert_synced(skippr, db, ["docs"], changed_since=before, changed=["docs"])

    # the previous version is only in the WAL of the same round, or was itself written by
    # CDC, or the row moves to a new key, or one TOAST column changes and the other does not
    before = insert_lsn(db)
    db.execute("SELECT add_docs(100, 102)")
    db.execute("UPDATE docs SET title = 'new then updated' WHERE id = 100")
    db.execute("UPDATE docs SET version = version + 1 WHERE id = 100")
    db.execute("UPDATE docs SET title = title || ' v2' WHERE id = 1")
    tx(db, "UPDATE docs SET title = 'twice in one tx (1)' WHERE id = 2",
           "UPDATE docs SET title = 'twice in one tx (2)', version = 7 WHERE id = 2")
    db.execute("UPDATE docs SET notes = 'short notes now' WHERE id = 3")
    db.execute("UPDATE docs SET id = 1004, title = 'moved' WHERE id = 4")
    db.execute("UPDATE docs SET title = 'about to go' WHERE id = 5")
    db.execute("DELETE FROM docs WHERE id = 5")
    db.execute("UPDATE docs SET title = 'new body next' WHERE id = 6")
    db.execute("UPDATE docs SET body = big_text('replacement') WHERE id = 6")
    db.execute("UPDATE docs SET title = 'after new body' WHERE id = 6")
    tx(db, "UPDATE docs SET version = 100 WHERE id = 101",
           "UPDATE docs SET title = 'same tx as insert' WHERE id = 102")
    skippr.sync_once()
    assert_bodies_not_null(skippr, db)
    assert_synced(skippr, db, ["docs"], changed_since=before, changed=["docs"])

    # once more over everything: each previous version now comes from a CDC commit
    before = insert_lsn(db)
    db.execute("UPDATE docs SET version = version + 1")
    skippr.sync_once()
    assert_bodies_not_null(skippr, db)
    assert_synced(skippr, db, ["docs"], changed_since=before, changed=["docs"])


# --------------------------------------------------------------------------------------------
# Tables without a primary key
# --------------------------------------------------------------------------------------------


def assert_multiset_matches(skippr: Skippr, db: Database, qualified: str) -> None:
    """For a table without a key (identical rows allowed): each reader holds exactly the rows
    of Postgres, each as many times as Postgres has it."""
    spec = pg_table_spec(db, qualified)

    def canon(rows: list[dict]) -> Counter:
        return Counter(repr(tuple(normalize(r.get(c.name), c.kind) for c in spec.columns)) for r in rows)

    expected = canon(expected_rows(db, spec))
    for reader, read in (("pyiceberg", lambda: skippr.read_pyiceberg(spec.iceberg_name)),
                         ("duckdb", lambda: skippr.read_duckdb(spec.iceberg_name)),
                         ("query", lambda: skippr.read_query(spec))):
        got = canon(read())
        if got != expected:
            missing, extra = expected - got, got - expected
            raise AssertionError(
                f"{reader} read of {qualified} differs from Postgres: {sum(expected.values())} rows expected, "
                f"{sum(got.values())} read\n  missing ({sum(missing.values())}): {list(missing.items())[:5]}\n"
                f"  unexpected ({sum(extra.values())}): {list(extra.items())[:5]}"
            )


def test_replica_identity_full_table_without_key(skippr: Skippr, db):
    """REPLICA IDENTITY FULL, no key: the whole row identifies it, NULLs included, and
    identical rows are distinct rows."""
    db.execute("""
        CREATE TABLE readings (sensor text NOT NULL, at timestamptz NOT NULL, value numeric(8,3), qty integer, tags text[]);
        ALTER TABLE readings REPLICA IDENTITY FULL;
        INSERT INTO readings SELECT 's' || (i % 7), timestamptz '2024-01-01 00:00:00+00' + i * interval '1 min',
                                    CASE WHEN i % 9 = 0 THEN NULL ELSE i / 8.0 END,
                                    CASE WHEN i % 4 = 0 THEN NULL ELSE i END,
                                    CASE WHEN i % 5 = 0 THEN NULL ELSE ARRAY['a', i::text] END
        FROM generate_series(1, 200) i;
        INSERT INTO readings SELECT 'dup', '2024-06-01 00:00:00+00', 1.5, NULL, NULL FROM generate_series(1, 3);
    """)
    skippr.write_config(["readings"])
    skippr.sync_once()
    assert_multiset_matches(skippr, db, "readings")

    before = insert_lsn(db)
    db.execute("INSERT INTO readings VALUES ('new', '2025-01-01 00:00:00+00', NULL, NULL, NULL), "
               "('dup', '2024-06-01 00:00:00+00', 1.5, NULL, NULL)")
    db.execute("UPDATE readings SET value = value + 100 WHERE sensor = 's1'")          # rows with NULLs among them
    db.execute("UPDATE readings SET qty = NULL WHERE sensor = 's3'")
    db.execute("UPDATE readings SET qty = 7, tags = '{}' WHERE qty IS NULL AND sensor = 's4'")
    db.execute("DELETE FROM readings WHERE sensor = 's2'")
    db.execute("DELETE FROM readings WHERE ctid = (SELECT ctid FROM readings WHERE sensor = 'dup' LIMIT 1)")
    db.execute("UPDATE readings SET sensor = 'dup moved' WHERE ctid = (SELECT ctid FROM readings WHERE sensor = 'dup' LIMIT 1)")
    assert db.scalar("SELECT count(*) FROM readings WHERE sensor = 'dup'") == 2
    skippr.sync_once()
    assert_multiset_matches(skippr, db, "readings")
    lsn = table_lsn(skippr, "readings")
    assert lsn is not None and lsn >= before

    db.execute("DELETE FROM readings WHERE sensor = 'dup'")
    db.execute("UPDATE readings SET value = NULL WHERE sensor = 's5'")
    skippr.sync_once()
    assert_multiset_matches(skippr, db, "readings")


def test_unchanged_toast_values_come_from_the_right_rows_of_a_large_file(skippr: Skippr, db):
    """The previous versions are read back by position from a data file of many pages (8,192
    rows each): rows on different pages, on page boundaries and at the file's end, asked for
    in an order unlike their positions, each must get its own value."""
    db.execute(TOAST_SETUP)
    db.execute("INSERT INTO docs SELECT i, 'title ' || i, 0, 'short', NULL FROM generate_series(1, 20000) i")
    far = [1, 8192, 8193, 16384, 12000, 19999, 20000]
    db.execute(f"UPDATE docs SET body = big_text(id::text) WHERE id = ANY(ARRAY{far})")
    skippr.write_config(["docs"])
    skippr.sync_once()
    before = insert_lsn(db)
    tx(db, f"UPDATE docs SET title = 'v1 ' || id WHERE id = ANY(ARRAY{list(reversed(far))})",
           "UPDATE docs SET version = 2 WHERE id IN (5, 8191, 17000)")
    skippr.sync_once()
    pg = dict(db.execute("SELECT id, md5(body) FROM docs WHERE id = ANY(%s)", (far + [5, 8191, 17000],)))
    got = {r["id"]: r["body"] for r in skippr.read_pyiceberg("docs") if r["id"] in pg}
    assert {i: hashlib.md5(b.encode()).hexdigest() if b is not None else None for i, b in got.items()} == pg
    assert_synced(skippr, db, ["docs"], changed_since=before, changed=["docs"])


def test_replica_identity_full_keeps_unchanged_toast_values(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE blobs (name text NOT NULL, version integer NOT NULL, raw text NOT NULL);
        ALTER TABLE blobs REPLICA IDENTITY FULL;
        ALTER TABLE blobs ALTER COLUMN raw SET STORAGE EXTERNAL;
        INSERT INTO blobs SELECT 'b' || i, 0, (SELECT string_agg(md5(random()::text || i || g), '') FROM generate_series(1, 3200) g)
        FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["blobs"])
    skippr.sync_once()
    assert_multiset_matches(skippr, db, "blobs")

    db.execute("UPDATE blobs SET version = version + 1 WHERE name IN ('b1', 'b2', 'b3')")  # raw unchanged (TOAST)
    db.execute("UPDATE blobs SET name = 'renamed' WHERE name = 'b4'")
    db.execute("DELETE FROM blobs WHERE name = 'b5'")                                      # a large old tuple
    skippr.sync_once()
    assert_multiset_matches(skippr, db, "blobs")
    got = {r["name"]: r["raw"] for r in skippr.read_pyiceberg("blobs")}
    assert all(v is not None for v in got.values()), "an unchanged TOAST value became NULL"


#: Two ways a table has no primary key and no REPLICA IDENTITY FULL.
KEYLESS_DDL = {
    # default identity, no key: Postgres itself refuses its UPDATEs and DELETEs once it is
    # in a publication that publishes them
    "no_identity": "CREATE TABLE keyless_log (seq integer NOT NULL, at timestamptz NOT NULL, msg text NOT NULL, n integer);",
    # a unique index as replica identity: updates and deletes do reach the change stream
    "identity_index": "CREATE TABLE keyless_log (seq integer NOT NULL, at timestamptz NOT NULL, msg text NOT NULL, n integer);"
                      "CREATE UNIQUE INDEX keyless_log_seq ON keyless_log (seq);"
                      "ALTER TABLE keyless_log REPLICA IDENTITY USING INDEX keyless_log_seq;",
}


@pytest.mark.parametrize("kind", list(KEYLESS_DDL))
@pytest.mark.parametrize("cdc_mode", ["snapshot_then_cdc", "cdc_only"])
def test_table_without_key_or_full_identity_fails_closed(skippr: Skippr, db, cdc_mode, kind):
    db.execute("CREATE TABLE keyed (id integer PRIMARY KEY, v text); INSERT INTO keyed VALUES (1, 'a');")
    db.execute(KEYLESS_DDL[kind])
    db.execute("INSERT INTO keyless_log VALUES (1, now(), 'x', NULL)")
    skippr.write_config(["keyed", "keyless_log"], cdc_mode=cdc_mode)
    proc = assert_fails(skippr, must_name=["keyless_log"], what="a table with neither a primary key nor REPLICA IDENTITY FULL")
    err = proc.stderr.lower()
    assert "primary key" in err or "replica identity" in err, describe_run(proc, "error does not say how to fix it")

    # the same table is fine for a snapshot
    skippr.write_config(["keyed", "keyless_log"], cdc_mode="snapshot_only")
    skippr.sync_once()
    skippr.assert_table_matches("keyless_log", ALL_READERS)


@pytest.mark.parametrize("kind", list(KEYLESS_DDL))
def test_append_only_table_takes_inserts(skippr: Skippr, db, kind):
    db.execute("CREATE TABLE keyed (id integer PRIMARY KEY, v text); INSERT INTO keyed VALUES (1, 'a');")
    db.execute(KEYLESS_DDL[kind])
    db.execute("INSERT INTO keyless_log VALUES (1, '2024-01-01 00:00:00+00', 'a', 1), (2, '2024-01-01 00:00:00+00', 'a', NULL)")
    skippr.write_config(["keyed", "keyless_log"], extra_source={"append_only": ["keyless_log"]})
    skippr.sync_once()
    assert_synced(skippr, db, ["keyed", "keyless_log"])

    for round_no in range(2):
        before = insert_lsn(db)
        db.execute("INSERT INTO keyless_log SELECT 10 * %s + i, '2024-01-02 00:00:00+00', 'b', "
                   "CASE WHEN i %% 2 = 0 THEN NULL ELSE i END FROM generate_series(3, 9) i", (round_no + 1,))
        db.execute("INSERT INTO keyed VALUES (%s, 'b')", (round_no + 2,))
        skippr.sync_once()
        assert_synced(skippr, db, ["keyed", "keyless_log"], changed_since=before, changed=["keyless_log", "keyed"])


@pytest.mark.parametrize("bad_change", ["UPDATE keyless_log SET msg = 'edited' WHERE seq = 2",
                                        "DELETE FROM keyless_log WHERE seq = 2"], ids=["update", "delete"])
def test_append_only_table_stops_on_update_or_delete(skippr: Skippr, db, bad_change):
    db.execute("CREATE TABLE keyed (id integer PRIMARY KEY, v text); INSERT INTO keyed VALUES (1, 'a');")
    db.execute(KEYLESS_DDL["identity_index"])
    db.execute("INSERT INTO keyless_log VALUES (1, '2024-01-01 00:00:00+00', 'a', 1)")
    skippr.write_config(["keyed", "keyless_log"], extra_source={"append_only": ["keyless_log"]})
    skippr.sync_once()
    db.execute("INSERT INTO keyless_log VALUES (2, '2024-01-02 00:00:00+00', 'b', 2)")
    skippr.sync_once()
    assert_synced(skippr, db, ["keyed", "keyless_log"])

    rows_before = skippr.read_pyiceberg("keyless_log", ["seq"])
    db.execute(bad_change)
    db.execute("INSERT INTO keyless_log VALUES (3, '2024-01-03 00:00:00+00', 'after', 3)")
    assert_fails(skippr, must_name=["keyless_log"], what=f"append_only table got `{bad_change}`")
    assert_fails(skippr, must_name=["keyless_log"], what="second run after the append_only violation (must not skip it)")
    assert skippr.read_pyiceberg("keyless_log", ["seq"]) == rows_before, \
        "the append_only table changed in Iceberg although the sync stopped"


# --------------------------------------------------------------------------------------------
# cdc modes
# --------------------------------------------------------------------------------------------


def test_cdc_only_starts_empty_at_the_slot_position(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE items (id integer PRIMARY KEY, v text, amount numeric(10,2), at timestamptz);
        INSERT INTO items SELECT i, 'old ' || i, i, now() FROM generate_series(1, 100) i;
    """)
    skippr.write_config(["items"], cdc_mode="cdc_only")
    skippr.sync_once()
    assert slot_row(db) is not None, "cdc_only created no replication slot"
    assert skippr.read_pyiceberg("items") == [], "cdc_only copied existing rows"

    before = insert_lsn(db)
    db.execute("INSERT INTO items SELECT i, 'new ' || i, i / 3.0, '2024-05-05 05:05:05.5+03' FROM generate_series(1001, 1100) i")
    db.execute("UPDATE items SET v = 'updated', amount = NULL WHERE id BETWEEN 1001 AND 1020")
    db.execute("DELETE FROM items WHERE id BETWEEN 1090 AND 1100")
    db.execute("UPDATE items SET id = id + 1000 WHERE id BETWEEN 1021 AND 1030")
    skippr.sync_once()
    spec = pg_table_spec(db, "items")
    expected = [r for r in expected_rows(db, spec) if r["id"] > 1000]
    for reader, rows in (("pyiceberg", skippr.read_pyiceberg("items", ["id"])),
                         ("duckdb", skippr.read_duckdb("items", ["id"])),
                         ("query", skippr.read_query(spec))):
        assert_rows_equal(expected, rows, spec, reader)
    lsn = table_lsn(skippr, "items")
    assert lsn is not None and lsn >= before


def test_snapshot_only_never_creates_a_slot(skippr: Skippr, db):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'a');")
    skippr.write_config(["items"], cdc_mode="snapshot_only")  # as the superuser: it could
    skippr.sync_once()
    db.execute("INSERT INTO items VALUES (2, 'b')")
    skippr.sync_once()
    slots = db.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")
    assert slots == [], f"snapshot_only created replication slots: {slots}"


def test_cdc_as_a_replication_role_that_owns_the_tables(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE items (id integer PRIMARY KEY, v text, tags text[]);
        INSERT INTO items SELECT i, 'v' || i, ARRAY['a', i::text] FROM generate_series(1, 50) i;
    """)
    db.create_role("cdc_owner", "cdc-owner-pw-1", replication=True)
    db.execute("ALTER TABLE items OWNER TO cdc_owner")
    db.execute(f'GRANT CREATE ON DATABASE "{db.name}" TO cdc_owner')
    skippr.write_config(["items"], user="cdc_owner", password="cdc-owner-pw-1")
    skippr.sync_once()
    assert_synced(skippr, db, ["items"])
    assert db.scalar("SELECT pubowner::regrole::text FROM pg_publication WHERE pubname = %s", (PUBLICATION,)) == "cdc_owner"

    before = insert_lsn(db)
    db.execute("INSERT INTO items VALUES (51, 'new', NULL)")
    db.execute("UPDATE items SET tags = NULL, v = 'u' WHERE id < 10")
    db.execute("DELETE FROM items WHERE id > 40 AND id < 51")
    skippr.sync_once()
    assert_synced(skippr, db, ["items"], changed_since=before, changed=["items"])


def test_table_added_to_the_pipeline_later(skippr: Skippr, db):
    """A table added to `tables` after CDC started gets its own snapshot; changes to it from
    before that snapshot are not applied twice, later ones are applied."""
    db.execute("""
        CREATE TABLE first_t (id integer PRIMARY KEY, v text);
        CREATE TABLE later_t (id integer PRIMARY KEY, v text);
        INSERT INTO first_t SELECT i, 'f' || i FROM generate_series(1, 20) i;
        INSERT INTO later_t SELECT i, 'l' || i FROM generate_series(1, 20) i;
    """)
    skippr.write_config(["first_t"])
    skippr.sync_once()
    db.execute("UPDATE first_t SET v = 'u1' WHERE id < 5")
    tx(db, "UPDATE later_t SET v = 'u1' WHERE id < 5", "INSERT INTO later_t VALUES (21, 'l21')",
       "INSERT INTO first_t VALUES (21, 'f21')")
    skippr.sync_once()
    assert_synced(skippr, db, ["first_t"])

    db.execute("INSERT INTO later_t VALUES (22, 'l22')")
    db.execute("DELETE FROM later_t WHERE id = 1")
    skippr.write_config(["first_t", "later_t"])
    skippr.sync_once()
    assert_synced(skippr, db, ["first_t", "later_t"])

    before = insert_lsn(db)
    tx(db, "UPDATE later_t SET v = 'u2'", "UPDATE first_t SET v = 'u2' WHERE id > 15", "DELETE FROM later_t WHERE id = 2")
    skippr.sync_once()
    assert_synced(skippr, db, ["first_t", "later_t"], changed_since=before, changed=["first_t", "later_t"])


# --------------------------------------------------------------------------------------------
# 2. Continuous sync
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_continuous_sync_commits_every_interval_and_stops_cleanly(skippr: Skippr, db, sig):
    setup_main(db)
    skippr.write_config(MAIN_TABLES, extra_pipeline={"commit_interval": "1s"})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        took = wait_until_synced(skippr, db, MAIN_TABLES, proc, timeout=120)
        print(f"snapshot visible after {took:.1f}s")

        db.execute("SELECT add_accounts(301, 350, 'live')")
        db.execute("UPDATE accounts SET balance = -balance, tags = '{live}' WHERE id % 4 = 1")
        db.execute("DELETE FROM accounts WHERE id % 9 = 0")
        db.execute("UPDATE accounts SET id = id + 100000 WHERE id BETWEEN 10 AND 20")
        took = wait_until_synced(skippr, db, ["accounts"], proc)
        print(f"first changes visible after {took:.1f}s")

        tx(db, "SELECT add_orders(100, 110, 2, 'live')", "DELETE FROM sales.invoices WHERE paid",
           "UPDATE accounts SET name = 'multi-table' WHERE id < 100")
        took = wait_until_synced(skippr, db, MAIN_TABLES, proc)
        print(f"second changes visible after {took:.1f}s")

        # several commits while running, and still running
        time.sleep(2.5)
        assert proc.poll() is None, f"continuous sync exited on its own\n{bg_log(skippr)}"
        last = insert_lsn(db)
        db.execute("TRUNCATE orders")
        db.execute("SELECT add_orders(1, 3, 1, 'after truncate')")
        wait_until_synced(skippr, db, MAIN_TABLES, proc)

        rc = stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, f"sync exited {rc} after {signal.Signals(sig).name}\n{bg_log(skippr)}"
    assert "panicked" not in bg_log(skippr), bg_log(skippr)
    assert_synced(skippr, db, MAIN_TABLES, changed_since=last, changed=["orders"])
    wait_slot_inactive(db)

    # a clean stop loses nothing and duplicates nothing for the next run
    db.execute("UPDATE accounts SET name = 'after stop' WHERE id % 2 = 0")
    db.execute("SELECT add_invoices(500, 510, 'after stop')")
    skippr.sync_once()
    assert_synced(skippr, db, MAIN_TABLES)


def test_shutdown_flushes_changes_received_since_the_last_commit(skippr: Skippr, db):
    """With a commit interval far in the future, changes the process has already received
    must still reach Iceberg on SIGTERM."""
    db.execute("""
        CREATE TABLE items (id integer PRIMARY KEY, v text, at timestamptz);
        INSERT INTO items SELECT i, 'v' || i, '2024-01-01 00:00:00+00' FROM generate_series(1, 100) i;
    """)
    skippr.write_config(["items"], extra_pipeline={"commit_interval": "1h"})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        wait_until_synced(skippr, db, ["items"], proc, timeout=120)
        before = insert_lsn(db)
        db.execute("INSERT INTO items SELECT i, 'late', now() FROM generate_series(101, 150) i")
        db.execute("UPDATE items SET v = 'changed' WHERE id <= 20")
        db.execute("DELETE FROM items WHERE id BETWEEN 21 AND 30")
        target = insert_lsn(db)
        # wait until Postgres has sent the changes to the process
        deadline = time.monotonic() + 60
        while True:
            sent = db.execute(
                "SELECT r.sent_lsn::text FROM pg_stat_replication r JOIN pg_replication_slots s "
                "ON s.active_pid = r.pid WHERE s.slot_name = %s", (SLOT,))
            if sent and sent[0][0] and lsn_to_int(sent[0][0]) >= target:
                break
            assert proc.poll() is None, f"sync exited\n{bg_log(skippr)}"
            assert time.monotonic() < deadline, f"Postgres never sent the changes (sent_lsn {sent})\n{bg_log(skippr)}"
            time.sleep(0.2)
        time.sleep(2)
        assert len(skippr.read_pyiceberg("items")) == 100, \
            "changes were committed long before commit_interval (1h) was up"
        rc = stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, f"sync exited {rc} after SIGTERM\n{bg_log(skippr)}"
    assert_synced(skippr, db, ["items"], changed_since=before, changed=["items"])


CONTINUOUS_FAILURES = {
    # case: (what breaks the pipeline, strings the error must contain)
    "table_dropped": ("DROP TABLE watched", ["watched"]),
    "table_left_publication": (f"ALTER PUBLICATION {PUBLICATION} DROP TABLE watched", ["watched", "--resnapshot"]),
    "unrepresentable_value": ("INSERT INTO watched VALUES (99, 'infinity', 'bad')", ["watched", "ts"]),
    "append_only_update": ("UPDATE log_by_index SET msg = 'edited' WHERE seq = 1", ["log_by_index"]),
}


@pytest.mark.parametrize("case", list(CONTINUOUS_FAILURES))
def test_continuous_sync_stops_on_what_it_cannot_apply(skippr: Skippr, db, case):
    """A running pipeline fails closed too: it exits non-zero naming the table, it does not
    skip the change or keep running without the table."""
    db.execute("""
        CREATE TABLE watched (id integer PRIMARY KEY, ts timestamp, v text);
        CREATE TABLE other (id integer PRIMARY KEY, v text);
        CREATE TABLE log_by_index (seq integer NOT NULL, msg text);
        CREATE UNIQUE INDEX log_by_index_seq ON log_by_index (seq);
        ALTER TABLE log_by_index REPLICA IDENTITY USING INDEX log_by_index_seq;
        INSERT INTO watched SELECT i, '2024-01-01 00:00:00', 'v' FROM generate_series(1, 10) i;
        INSERT INTO other VALUES (1, 'a');
        INSERT INTO log_by_index VALUES (1, 'first');
    """)
    bad, must_name = CONTINUOUS_FAILURES[case]
    skippr.write_config(["watched", "other", "log_by_index"], extra_pipeline={"commit_interval": "1s"},
                        extra_source={"append_only": ["log_by_index"]})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        wait_until_synced(skippr, db, ["watched", "other"], proc, timeout=120)
        db.execute("UPDATE watched SET v = 'seen' WHERE id = 1")
        wait_until_synced(skippr, db, ["watched"], proc)
        db.execute(bad)
        db.execute("INSERT INTO other VALUES (2, 'after')")
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"continuous sync kept running 60s after `{bad}`\n{bg_log(skippr)}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = bg_log(skippr)
    assert "panicked" not in log, log
    assert rc != 0, f"continuous sync exited 0 after `{bad}`\n{log}"
    for s_ in must_name:
        assert s_ in (skippr.workdir / "bg.stderr").read_text(errors="replace"), \
            f"the error does not mention {s_!r}\n{log}"
    # and the next run does not get past it either
    assert_fails(skippr, must_name=must_name, what=f"sync --once after `{bad}` stopped the continuous sync")


# --------------------------------------------------------------------------------------------
# 4. Fail closed
# --------------------------------------------------------------------------------------------


def test_dropped_slot_fails_then_resnapshot_recovers(skippr: Skippr, db):
    setup_main(db)
    skippr.write_config(MAIN_TABLES)
    skippr.sync_once()
    db.execute("UPDATE accounts SET name = 'before drop' WHERE id < 10")
    skippr.sync_once()
    assert_synced(skippr, db, MAIN_TABLES)
    iceberg_before = skippr.read_pyiceberg("accounts", ["id"])

    wait_slot_inactive(db)
    db.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
    # changes nobody streamed
    db.execute("UPDATE accounts SET name = 'while no slot' WHERE id < 50")
    db.execute("DELETE FROM accounts WHERE id BETWEEN 50 AND 60")
    db.execute("SELECT add_accounts(1000, 1010)")

    assert_fails(skippr, must_name=["--resnapshot"], what="the replication slot was dropped after the tables were synced")
    # a failed run must not quietly make a new slot that lets the next run pass
    assert_fails(skippr, must_name=["--resnapshot"], what="second run after the slot was dropped")
    assert skippr.read_pyiceberg("accounts", ["id"]) == iceberg_before, "Iceberg changed although the sync failed"

    resnapshot(skippr)
    assert_synced(skippr, db, MAIN_TABLES)
    assert slot_row(db) is not None, "--resnapshot did not create the slot again"

    before = insert_lsn(db)
    db.execute("UPDATE accounts SET name = 'after resnapshot' WHERE id < 100")
    db.execute("DELETE FROM orders WHERE customer_id < 10")
    skippr.sync_once()
    assert_synced(skippr, db, MAIN_TABLES, changed_since=before, changed=["accounts", "orders"])


def test_resnapshot_of_a_table_whose_columns_changed_swaps_in_one_commit(skippr: Skippr, db):
    """A table whose columns changed while nothing followed them is copied again under its new
    columns (and its layout bound to them); readers see the old table until that one commit."""
    db.execute("""
        CREATE TABLE reshaped (id integer PRIMARY KEY, amount integer, note text, created date NOT NULL);
        INSERT INTO reshaped SELECT i, i, 'n' || i, DATE '2026-01-01' + (i % 5) FROM generate_series(1, 300) i;
    """)
    layout = {"tables": {"reshaped": {"partition_by": ["day(created)"], "sort_by": ["amount"]}}}
    skippr.write_config(["reshaped"], extra_pipeline=layout)
    skippr.sync_once()
    assert_synced(skippr, db, ["reshaped"], readers=("pyiceberg",))
    before = skippr.read_pyiceberg("reshaped", ["id"])
    before_duck = skippr.read_duckdb("reshaped", ["id"])

    db.execute("ALTER TABLE reshaped ALTER COLUMN amount TYPE numeric(12,2), DROP COLUMN note, "
               "ADD COLUMN label text DEFAULT 'x'")
    db.execute("UPDATE reshaped SET amount = amount * 1.5, label = 'y' WHERE id < 50")
    db.execute("INSERT INTO reshaped (id, amount, created) VALUES (1001, 2.25, DATE '2026-02-01')")

    # The copy pauses just before its one commit: every reader still sees the old table.
    point = "before-catalog-swap"
    proc = skippr.start("sync", "--pipeline", "app", "--once", "--resnapshot",
                        env={"SKIPPR_TEST_PAUSE_AT": point})
    try:
        wait_paused(skippr, proc, point, "the re-snapshot")
        assert skippr.read_pyiceberg("reshaped", ["id"]) == before, "PyIceberg saw the table change before the copy committed"
        assert skippr.read_duckdb("reshaped", ["id"]) == before_duck, "DuckDB saw the table change before the copy committed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert skippr.read_pyiceberg("reshaped", ["id"]) == before, "a killed re-snapshot changed the table"

    resnapshot(skippr)
    assert_synced(skippr, db, ["reshaped"])
    from conftest import load_iceberg_table
    t = load_iceberg_table(skippr.warehouse, skippr.workspace, "reshaped")
    schema = t.schema()
    assert [f.name for f in schema.fields] == ["id", "amount", "created", "label"], schema
    created = schema.find_field("created").field_id
    spec = t.spec()
    assert [(f.source_id, str(f.transform)) for f in spec.fields] == [(created, "day")], spec
    assert [f.source_id for f in t.sort_order().fields] == [schema.find_field("amount").field_id]
    for task in t.scan().plan_files():
        assert task.file.partition is not None and task.file.spec_id == spec.spec_id, task.file.file_path

    # and the stream goes on under the new columns
    before_lsn = insert_lsn(db)
    db.execute("UPDATE reshaped SET amount = amount + 1, label = 'z' WHERE id BETWEEN 100 AND 120")
    db.execute("DELETE FROM reshaped WHERE id > 290")
    skippr.sync_once()
    assert_synced(skippr, db, ["reshaped"], changed_since=before_lsn, changed=["reshaped"])


def test_dropped_table_fails_naming_it(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE keep_me (id integer PRIMARY KEY, v text);
        CREATE TABLE drop_me (id integer PRIMARY KEY, v text);
        INSERT INTO keep_me VALUES (1, 'a'); INSERT INTO drop_me VALUES (1, 'a');
    """)
    skippr.write_config(["keep_me", "drop_me"])
    skippr.sync_once()
    db.execute("INSERT INTO keep_me VALUES (2, 'b')")
    db.execute("INSERT INTO drop_me VALUES (2, 'b')")  # pending in the slot when the table goes
    db.execute("DROP TABLE drop_me")
    assert_fails(skippr, must_name=["drop_me"], what="a configured table was dropped")


def test_table_removed_from_publication_fails_then_resnapshot_recovers(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE stay_pub (id integer PRIMARY KEY, v text);
        CREATE TABLE gone_pub (id integer PRIMARY KEY, v text);
        INSERT INTO stay_pub SELECT i, 'a' FROM generate_series(1, 10) i;
        INSERT INTO gone_pub SELECT i, 'a' FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["stay_pub", "gone_pub"])
    skippr.sync_once()
    db.execute(f"ALTER PUBLICATION {PUBLICATION} DROP TABLE gone_pub")
    db.execute("UPDATE gone_pub SET v = 'unseen' WHERE id < 5")
    db.execute("INSERT INTO stay_pub VALUES (11, 'b')")
    proc = assert_fails(skippr, must_name=["gone_pub", "--resnapshot"], what="a synced table left the publication")
    assert_fails(skippr, must_name=["gone_pub"], what="second run after the table left the publication")

    db.execute(f"ALTER PUBLICATION {PUBLICATION} ADD TABLE gone_pub")
    resnapshot(skippr)
    assert_synced(skippr, db, ["stay_pub", "gone_pub"])
    before = insert_lsn(db)
    db.execute("UPDATE gone_pub SET v = 'seen'")
    skippr.sync_once()
    assert_synced(skippr, db, ["stay_pub", "gone_pub"], changed_since=before, changed=["gone_pub"])


@pytest.mark.parametrize(
    "pg_type,good,bad",
    [
        ("timestamp", "'2024-01-01 00:00:00'", "'infinity'"),
        ("timestamptz", "'2024-01-01 00:00:00+00'", "'-infinity'"),
        ("date", "'2024-01-01'", "'infinity'"),
        ("numeric", "1.25", "'NaN'"),
        ("numeric", "1.25", "123456789012345678901"),        # overflows decimal(38,18)
        ("numeric", "1.25", "1.0000000000000000001"),         # would round
    ],
)
@pytest.mark.parametrize("how", ["insert", "update"])
def test_unrepresentable_value_through_cdc_fails_naming_table_and_column(skippr: Skippr, db, pg_type, good, bad, how):
    db.execute(f"CREATE TABLE weird_values (id integer PRIMARY KEY, odd_column {pg_type}, other text);"
               f"INSERT INTO weird_values VALUES (1, {good}, 'x'), (3, {good}, 'y');")
    skippr.write_config(["weird_values"])
    skippr.sync_once()
    assert_synced(skippr, db, ["weird_values"])
    before_rows = skippr.read_pyiceberg("weird_values", ["id"])

    if how == "insert":
        db.execute(f"INSERT INTO weird_values VALUES (2, {bad}, 'bad')")
    else:
        db.execute(f"UPDATE weird_values SET odd_column = {bad}, other = 'bad' WHERE id = 3")
    db.execute("INSERT INTO weird_values VALUES (4, NULL, 'after the bad one')")

    assert_fails(skippr, must_name=["weird_values", "odd_column"], what=f"{how} of {pg_type} {bad} through CDC")
    assert_fails(skippr, must_name=["weird_values", "odd_column"], what="second run after the unrepresentable value")
    after_rows = skippr.read_pyiceberg("weird_values", ["id"])
    assert not any(r["other"] == "bad" for r in after_rows), f"a substitute for {bad} was written: {after_rows}"
    assert after_rows == before_rows, "Iceberg moved past a change it could not apply"


# --------------------------------------------------------------------------------------------
# A slot Postgres invalidated (wal_status = lost): a dedicated cluster with a tiny WAL budget
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_wal_db(tmp_path: Path):
    cluster = start_cluster({"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0", "min_wal_size": "32MB",
                             "max_wal_size": "64MB"})
    try:
        name = "t_" + secrets.token_hex(6)
        cluster.execute(f'CREATE DATABASE "{name}"')
        yield Database(cluster, name)
    finally:
        stop_cluster(cluster)


def test_lost_slot_fails_then_resnapshot_recovers(tiny_wal_db, workdir: Path):
    db = tiny_wal_db
    skippr = Skippr(db=db, workdir=workdir)
    db.execute("""
        CREATE TABLE items (id integer PRIMARY KEY, v text);
        CREATE TABLE filler (id serial PRIMARY KEY, pad text);
        INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 100) i;
    """)
    skippr.write_config(["items"])
    skippr.sync_once()
    assert_synced(skippr, db, ["items"])
    db.execute("UPDATE items SET v = 'unseen' WHERE id < 10")

    for _ in range(4):
        db.execute("INSERT INTO filler (pad) SELECT repeat('x', 1000) FROM generate_series(1, 3000)")
        db.execute("SELECT pg_switch_wal()")
    db.execute("CHECKPOINT")
    status = slot_row(db)
    if status is None or status["wal_status"] != "lost":
        pytest.skip(f"could not get Postgres to invalidate the slot (slot: {status})")

    assert_fails(skippr, must_name=["--resnapshot"], what="the replication slot is lost (wal_status = lost)")
    before_table = skippr.table("items")
    old_uuid = str(before_table.metadata.table_uuid)
    old_snapshot = before_table.current_snapshot().snapshot_id
    resnapshot(skippr)
    assert_synced(skippr, db, ["items"])
    # Readers saw the old rows until the new copy replaced them in one commit: the same
    # Iceberg table, one snapshot more, whose parent is the old state (never an empty table).
    after_table = skippr.table("items")
    assert str(after_table.metadata.table_uuid) == old_uuid, "the re-snapshot dropped and recreated the table"
    current = after_table.current_snapshot()
    assert current.parent_snapshot_id == old_snapshot, (
        f"the re-snapshot committed more than once: {[s.snapshot_id for s in after_table.snapshots()]}")
    assert slot_row(db)["wal_status"] != "lost"
    before = insert_lsn(db)
    db.execute("DELETE FROM items WHERE id > 90")
    skippr.sync_once()
    assert_synced(skippr, db, ["items"], changed_since=before, changed=["items"])


def test_equal_rows_inserted_and_deleted_in_one_window(skippr: Skippr, db):
    """Without a key, equal rows are separate rows: several inserted in one sync window and
    deleted (some or all) in the same window must leave exactly Postgres' multiset."""
    db.execute("""
        CREATE TABLE events (kind text NOT NULL, n integer);
        ALTER TABLE events REPLICA IDENTITY FULL;
        INSERT INTO events VALUES ('seed', 1), ('seed', 1);
    """)
    skippr.write_config(["events"])
    skippr.sync_once()
    db.execute("INSERT INTO events SELECT 'dup', 7 FROM generate_series(1, 3)")
    db.execute("INSERT INTO events SELECT 'gone', 8 FROM generate_series(1, 4)")
    db.execute("DELETE FROM events WHERE kind = 'gone'")                 # all four, same window
    db.execute("DELETE FROM events WHERE ctid = (SELECT min(ctid) FROM events WHERE kind = 'dup')")
    db.execute("DELETE FROM events WHERE ctid = (SELECT min(ctid) FROM events WHERE kind = 'seed')")
    skippr.sync_once()
    assert_multiset_matches(skippr, db, "events")


def test_the_key_index_is_kept_between_runs_and_rebuilt_when_it_does_not_match(skippr: Skippr, db):
    """A run that ends with everything committed keeps the key index on local disk (of the
    tables whose changes it applied: an index is loaded only when a change needs it); the next
    run reads it instead of every data file when it describes the table's current snapshot.
    A damaged copy, or one of an older snapshot, is ignored and the index rebuilt: the
    updates and deletes after each start land on the right rows either way."""
    db.execute("CREATE TABLE kept (id bigint PRIMARY KEY, v text NOT NULL)")
    db.execute("CREATE TABLE kept2 (a int, b text, n int NOT NULL, PRIMARY KEY (a, b))")
    db.execute("INSERT INTO kept SELECT i, 'v' || i FROM generate_series(1, 5000) i")
    db.execute("INSERT INTO kept2 SELECT i % 50, 'k' || (i / 50), i FROM generate_series(1, 3000) i")
    skippr.write_config(["kept", "kept2"])
    skippr.sync_once()

    def round_of_changes(n: int) -> None:
        tx(db, f"UPDATE kept SET v = 'u{n}' || id WHERE id % 7 = {n}",
               f"DELETE FROM kept WHERE id % 97 = {n}",
               f"INSERT INTO kept SELECT i, 'new' FROM generate_series({6000 + n * 100}, {6050 + n * 100}) i",
               f"UPDATE kept2 SET n = n + 1 WHERE a = {n}",
               f"DELETE FROM kept2 WHERE a = {n + 20}")

    def started(proc: subprocess.CompletedProcess) -> int:
        """How many tables started from their saved key index."""
        return (proc.stdout + proc.stderr).count("key index loaded from its saved copy")

    # The first run copied the tables and caught up with no change to apply: it never needed
    # the indexes, so it neither built nor kept them. The next run, with changes, builds both
    # when the first change of each arrives, and its end keeps them.
    assert sorted(skippr.workdir.rglob("*.keyindex")) == []
    round_of_changes(0)
    run = skippr.sync_once()
    assert started(run) == 0, describe_run(run, "no saved index yet")
    assert_synced(skippr, db, ["kept", "kept2"], readers=("pyiceberg",))
    saved = sorted(skippr.workdir.rglob("*.keyindex"))
    assert [p.name for p in saved] == ["analytics.kept.keyindex", "analytics.kept2.keyindex"], saved
    for n in (1, 2):
        round_of_changes(n)
        run = skippr.sync_once()
        assert started(run) == 2, describe_run(run, "both tables start from their saved index")
        assert_synced(skippr, db, ["kept", "kept2"], readers=("pyiceberg",))

    # Damaged: a byte flipped in the middle of the entries.
    data = bytearray(saved[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    saved[0].write_bytes(bytes(data))
    round_of_changes(3)
    third = skippr.sync_once()
    assert "the saved key index is damaged" in third.stdout + third.stderr, describe_run(third)
    assert started(third) == 1
    assert_synced(skippr, db, ["kept", "kept2"], readers=("pyiceberg",))

    # Of an older snapshot: the copy saved now, put back after the next run committed.
    older = saved[1].read_bytes()
    round_of_changes(4)
    skippr.sync_once()
    saved[1].write_bytes(older)
    round_of_changes(5)
    fifth = skippr.sync_once()
    assert started(fifth) == 1, describe_run(fifth, "kept2's copy names an older snapshot: rebuilt")
    assert_synced(skippr, db, ["kept", "kept2"], readers=("pyiceberg",))


def test_a_key_index_beyond_its_memory_budget_lives_on_local_disk(skippr: Skippr, db):
    """With `key_index_memory_budget_mb: 1`, tables of 120k integer keys (16 bytes a row) and
    60k composite keys (hashed, 24 bytes a row) keep their key index in files on local disk:
    it is loaded in sorted runs, updated in place, grows by merging new keys, moves with a
    compaction, is saved and read back. Every update and delete still lands on its row."""
    db.execute("CREATE TABLE wide_keys (id bigint PRIMARY KEY, v text NOT NULL)")
    db.execute("CREATE TABLE pair_keys (a int, b text, n int NOT NULL, PRIMARY KEY (a, b))")
    db.execute("INSERT INTO wide_keys SELECT i, 'v' || i FROM generate_series(1, 120000) i")
    db.execute("INSERT INTO pair_keys SELECT i % 300, 'k' || (i / 300), i FROM generate_series(1, 60000) i")
    skippr.write_config(["wide_keys", "pair_keys"], extra_pipeline={
        "key_index_memory_budget_mb": 1,
        "maintenance": {"check_interval": "100ms", "compaction_min_files": 2},
    })
    skippr.sync_once()
    assert_synced(skippr, db, ["wide_keys", "pair_keys"], readers=("pyiceberg",))

    logs = []
    for n in range(1, 4):
        if n == 3:
            # Without its saved copy the index is rebuilt from the data files, in sorted runs.
            for saved in skippr.workdir.rglob("*.keyindex"):
                saved.unlink()
        tx(db, f"UPDATE wide_keys SET v = 'u{n}' || id WHERE id % 11 = {n}",
               f"DELETE FROM wide_keys WHERE id % 13 = {n}",
               # New keys, more than a quarter of the budget: merged into the file on disk.
               f"INSERT INTO wide_keys SELECT i, 'new' FROM generate_series({200000 * n}, {200000 * n + 30000}) i",
               f"UPDATE pair_keys SET n = n + 1 WHERE a % 7 = {n}",
               f"DELETE FROM pair_keys WHERE a = {n + 100}",
               f"INSERT INTO pair_keys SELECT i % 300, 'z{n}-' || i, i FROM generate_series(1, 20000) i")
        run = skippr.sync_once()
        logs.append(run.stdout + run.stderr)
        assert_synced(skippr, db, ["wide_keys", "pair_keys"], readers=("pyiceberg",))
    text = "\n".join(logs)
    # Every run finds each index larger than its budget: rebuilt in runs in the first and
    # third, from its saved copy in the second; the memory it keeps is the directory only.
    loaded = re.findall(r"key index loaded.*?index_mib=(\d+) index_disk_mib=(\d+)", text)
    assert len(loaded) == 6, text[-4000:]
    assert all(int(mem) == 0 and int(disk) >= 1 for mem, disk in loaded), loaded
    # The copy's run applied no change, so it kept no index: the first run here builds both,
    # the second reads their saved copies, the third (copies removed) builds them again.
    assert text.count("key index loaded from its saved copy") == 2, text[-4000:]
    assert text.count("key index loaded to local disk") == 4, text[-4000:]
    # Compaction moved the locations of rows in the file on disk.
    assert "compacted table=analytics.wide_keys" in text, text[-4000:]
    assert "panicked" not in text
    # Nothing is left behind: the files on disk have no names.
    leftovers = [p.name for p in skippr.workdir.rglob("*.spill") if "keyindex" in p.name]
    assert leftovers == [], leftovers
