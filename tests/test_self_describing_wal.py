"""The self-describing WAL and bounded transactions, against a real Postgres.

* Every change is applied with the relation description in effect when Postgres wrote it: a
  transaction that updates, alters the table (add, drop, rename, type change) and updates
  again comes out equal in PyIceberg, DuckDB and `skipprd query`. `sync --once` reads the
  transaction only after it committed, so the source's catalog it reads the descriptions
  against already shows every ALTER: the WAL carries what could be proved, and where a rename
  can no longer be told from a drop and an add, the sync refuses with `--resnapshot` instead
  of guessing.
* Column types travel in the WAL: an enum (and a domain) column added in the WAL tail shows
  through `skipprd query` while the source cannot be reached at all.
* A transaction several times larger than `transaction_memory_budget_mb` spills to disk while
  it streams and still comes out equal everywhere.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Skippr, assert_no_panic, describe_run, free_port, quote_ident
from test_cdc import ALL_READERS, assert_fails, bg_log, resnapshot, tx
from test_schema_evolution import assert_evolved, ice_fields


def wal_dir(skippr: Skippr) -> Path:
    return skippr.workdir / ".skippr" / "wal" / "app"


def segments(skippr: Skippr) -> list[Path]:
    d = wal_dir(skippr)
    return sorted(d.glob("*.seg")) if d.is_dir() else []


# --------------------------------------------------------------------------------------------
# Update / ALTER TABLE / update in one transaction
# --------------------------------------------------------------------------------------------

#: case: (statements of ONE transaction after the snapshot, Iceberg columns expected after,
#: field ids that must be kept {new name: old name}, Postgres row -> Iceberg row). Row 6 is
#: moved to id 106 afterwards, so it too is written after the ALTER.
IN_ONE_TX: dict[str, tuple[list[str], list[Any], dict[str, str], Any]] = {
    "add": (
        ["UPDATE t SET a = 'a1 before' WHERE id = 1",
         "ALTER TABLE t ADD COLUMN d text",
         "UPDATE t SET d = 'd2', a = 'a2 after' WHERE id = 2",
         "INSERT INTO t VALUES (11, 'a11', 11, 'c11', 'd11')"],
        ["id", "a", "b", "c", "d"], {"a": "a", "b": "b", "c": "c"}, None),
    "drop": (
        ["UPDATE t SET c = 'c1 before' WHERE id = 1",
         "ALTER TABLE t DROP COLUMN c",
         "UPDATE t SET a = 'a2 after' WHERE id = 2",
         "INSERT INTO t VALUES (11, 'a11', 11)"],
        # c keeps its history: the row updated before the drop has its value, rows written
        # after read NULL
        ["id", "a", "b", ("c", "string")], {"a": "a", "b": "b", "c": "c"},
        lambda r: {**r, "c": None if r["id"] in (2, 11, 106) else ("c1 before" if r["id"] == 1 else f"c{r['id']}")}),
    "rename": (
        ["UPDATE t SET a = 'a1 before' WHERE id = 1",
         "ALTER TABLE t RENAME COLUMN a TO a2",
         "UPDATE t SET a2 = 'a2 after' WHERE id = 2",
         "INSERT INTO t VALUES (11, 'a11', 11, 'c11')"],
        ["id", "a2", "b", "c"], {"a2": "a", "b": "b", "c": "c"}, None),
    "widen": (
        ["UPDATE t SET b = -1 WHERE id = 1",
         "ALTER TABLE t ALTER COLUMN b TYPE bigint",
         "UPDATE t SET b = 8000000000 WHERE id = 2",
         "INSERT INTO t VALUES (11, 'a11', -8000000000, 'c11')"],
        ["id", "a", "b", "c"], {"a": "a", "b": "b", "c": "c"}, None),
    "incompatible_type": (
        ["UPDATE t SET b = -1 WHERE id = 1",
         "ALTER TABLE t ALTER COLUMN b TYPE text",
         "UPDATE t SET b = 'two' WHERE id = 2",
         "INSERT INTO t VALUES (11, 'a11', 'eleven', 'c11')"],
        ["id", "a", ("b", "int"), "c", ("b__text", "string")], {"a": "a", "b": "b", "c": "c"},
        lambda r: {**r, "b": None if r["id"] in (2, 11, 106) else int(r["b"]),
                   "b__text": r["b"] if r["id"] in (2, 11, 106) else None}),
    # Every kind in one transaction, in an order whose descriptions the catalog read at the
    # end can still prove (see the refusal case below for one it cannot).
    "all_kinds": (
        ["UPDATE t SET a = 'a1 first' WHERE id = 1",
         "ALTER TABLE t ADD COLUMN d text",
         "UPDATE t SET d = 'd2' WHERE id = 2",
         "ALTER TABLE t DROP COLUMN c",
         "UPDATE t SET a = 'a3 after drop' WHERE id = 3",
         "ALTER TABLE t ALTER COLUMN b TYPE bigint",
         "UPDATE t SET b = 9000000000 WHERE id = 4",
         "ALTER TABLE t RENAME COLUMN a TO a_renamed",
         "UPDATE t SET a_renamed = 'a5 renamed' WHERE id = 5",
         "INSERT INTO t VALUES (11, 'a11', 11, 'd11')"],
        ["id", "a_renamed", "b", ("c", "string"), "d"], {"a_renamed": "a", "b": "b", "c": "c"},
        lambda r: {**r, "c": None if r["id"] in (3, 4, 5, 11, 106) else f"c{r['id']}"}),
}


def setup_t(skippr: Skippr, db) -> dict[str, tuple[int, str, bool]]:
    db.execute("""
        CREATE TABLE t (id integer PRIMARY KEY, a text, b integer, c text);
        INSERT INTO t SELECT i, 'a' || i, i, 'c' || i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["t"])
    skippr.sync_once()
    return ice_fields(skippr, "t")


@pytest.mark.parametrize("case", list(IN_ONE_TX))
def test_update_alter_update_in_one_transaction(skippr: Skippr, db, case):
    statements, cols, keep, expect = IN_ONE_TX[case]
    f0 = setup_t(skippr, db)
    # The table is described in this session's stream before the transaction, and the
    # transaction's first statement is itself a change of the old shape: replay must read it
    # with the description from before the ALTER, and the rest with the one after.
    db.execute("UPDATE t SET a = 'warm' WHERE id = 9")
    tx(db, *statements)
    proc = skippr.sync_once()
    assert proc.returncode == 0, describe_run(proc, f"{case}: sync failed")
    f1 = ice_fields(skippr, "t")
    for new, old in keep.items():
        assert new in f1 and f1[new][0] == f0[old][0], f"{case}: {new} must keep {old}'s field id: {f0} -> {f1}"
    assert_evolved(skippr, db, "t", cols, expect)
    # And plain changes afterwards, in a session that describes the table anew.
    db.execute("UPDATE t SET id = id + 100 WHERE id = 6")
    db.execute("DELETE FROM t WHERE id = 7")
    skippr.sync_once()
    assert_evolved(skippr, db, "t", cols, expect)


def test_a_rename_the_catalog_can_no_longer_prove_is_refused_then_resnapshot_recovers(skippr: Skippr, db):
    """The column is renamed and then changes type, after another column was dropped, all
    before the stream reads the transaction: the catalog it reads the descriptions against can
    no longer say whether `b` was renamed to `b2` or dropped while `b2` was added (they differ
    in data), so the sync stops, naming the table and `--resnapshot`, rather than guess."""
    setup_t(skippr, db)
    tx(db,
       "UPDATE t SET a = 'x' WHERE id = 1",
       "ALTER TABLE t DROP COLUMN a",
       "UPDATE t SET b = -2 WHERE id = 2",
       "ALTER TABLE t RENAME COLUMN b TO b2",
       "UPDATE t SET b2 = -3 WHERE id = 3",
       "ALTER TABLE t ALTER COLUMN b2 TYPE bigint",
       "UPDATE t SET b2 = 9000000000 WHERE id = 4")
    proc = assert_fails(skippr, must_name=["public.t", "b2", "--resnapshot"], what="ambiguous rename")
    assert "renamed" in proc.stderr, describe_run(proc, "the error does not say what could not be told")
    proc = resnapshot(skippr)
    assert proc.returncode == 0, describe_run(proc, "resnapshot failed")
    skippr.assert_table_matches("t", ALL_READERS)


# --------------------------------------------------------------------------------------------
# Types travel in the WAL: the tail is typed with the source unreachable
# --------------------------------------------------------------------------------------------


def query_rows(skippr: Skippr, sql: str) -> list[dict]:
    proc = skippr.run("query", sql, "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, f"query failed: {sql}")
    return [json.loads(l) for l in proc.stdout.splitlines() if l.strip()]


def test_enum_and_domain_columns_in_the_tail_need_no_source_at_query_time(skippr: Skippr, db):
    db.execute("CREATE TYPE mood AS ENUM ('ok', 'sad', 'wry')")
    db.execute("CREATE DOMAIN positive_big AS bigint CHECK (VALUE > 0)")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")
    skippr.write_config(["items"], extra_pipeline={"commit_interval": "1h"})
    skippr.sync_once()
    committed = skippr.table("items").current_snapshot().snapshot_id
    proc = skippr.start("sync", "--pipeline", "app")
    sql = f"SELECT id, v, m, n FROM {quote_ident(skippr.workspace)}.items ORDER BY id"

    def expected() -> list[dict]:
        return [{"id": i, "v": v, "m": m, "n": n}
                for i, v, m, n in db.execute("SELECT id, v, m::text, n FROM items ORDER BY id")]

    try:
        tx(db, "UPDATE items SET v = 'before' WHERE id = 1",
           "ALTER TABLE items ADD COLUMN m mood, ADD COLUMN n positive_big",
           "INSERT INTO items VALUES (21, 'new', 'wry', 8000000000)",
           "UPDATE items SET m = 'sad', n = 5 WHERE id = 2")
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, bg_log(skippr)
            q = skippr.run("query", sql, "--format", "json", check=False)
            got = [json.loads(l) for l in q.stdout.splitlines() if l.strip()] if q.returncode == 0 else None
            if got == expected():
                break
            assert time.monotonic() < deadline, f"the tail never showed the new columns:\n{q.stdout}{q.stderr}"
            time.sleep(0.3)
    finally:
        # SIGKILL: nothing is flushed or committed on the way out; the tail stays in the WAL.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert segments(skippr), "the WAL is empty: the test needs the changes in the tail"
    assert skippr.table("items").current_snapshot().snapshot_id == committed, "something was committed"

    # The source "stops": the configuration now points at a port nothing listens on.
    skippr.write_config(["items"], extra_pipeline={"commit_interval": "1h"}, port=free_port())
    rows = query_rows(skippr, sql)
    assert rows == expected(), f"with the source unreachable the tail reads differently:\n{rows}"
    # Typed as the commit will type them: the enum as text, the domain as its base type.
    typed = query_rows(skippr, f"SELECT arrow_typeof(m) AS tm, arrow_typeof(n) AS tn FROM "
                               f"{quote_ident(skippr.workspace)}.items WHERE id = 21")
    assert typed == [{"tm": "Utf8", "tn": "Int64"}], typed

    # Back online: the commit writes the same, and every reader agrees with Postgres.
    skippr.write_config(["items"], extra_pipeline={"commit_interval": "1h"})
    proc = skippr.sync_once()
    assert proc.returncode == 0, describe_run(proc, "sync failed")
    assert [f.name for f in skippr.table("items").schema().fields] == ["id", "v", "m", "n"]
    skippr.assert_table_matches("items", ALL_READERS)


# --------------------------------------------------------------------------------------------
# Bounded transactions
# --------------------------------------------------------------------------------------------


def test_a_transaction_larger_than_the_memory_budget_spills_and_comes_out_equal(skippr: Skippr, db):
    """Budget 1 MiB; one transaction of about 24 MiB of changes (inserts, updates, deletes, a
    key change and an ADD COLUMN in the middle), another of many small rows."""
    db.execute("""
        CREATE TABLE big (id integer PRIMARY KEY, body text, n bigint);
        INSERT INTO big SELECT i, repeat('s', 100), i FROM generate_series(1, 100) i;
        CREATE TABLE small (id integer PRIMARY KEY, v text);
    """)
    skippr.write_config(["big", "small"], extra_pipeline={"transaction_memory_budget_mb": 1})
    skippr.sync_once()
    tx(db,
       "INSERT INTO big SELECT i, repeat(md5(i::text), 40), i FROM generate_series(1001, 13000) i",
       "UPDATE big SET body = repeat('u', 900) WHERE id % 5 = 0",
       "DELETE FROM big WHERE id % 7 = 0",
       "ALTER TABLE big ADD COLUMN extra text",
       "UPDATE big SET extra = 'x' || id, id = id + 100000 WHERE id BETWEEN 2000 AND 2100",
       "INSERT INTO small SELECT i, 'v' || i FROM generate_series(1, 30000) i")
    proc = skippr.sync_once()
    assert proc.returncode == 0, describe_run(proc, "sync of the large transaction failed")
    assert "spilling" in proc.stderr, describe_run(proc, "the transaction did not spill past the 1 MiB budget")
    spill = wal_dir(skippr) / "spill"
    assert not spill.exists() or not any(spill.iterdir()), f"spill files left behind: {list(spill.iterdir())}"
    skippr.assert_table_matches("big", ALL_READERS)
    skippr.assert_table_matches("small", ALL_READERS)

    # A second large transaction after the first, and the table stays equal.
    tx(db, "UPDATE big SET body = repeat('w', 2000), extra = 'again' WHERE id % 3 = 0")
    proc = skippr.sync_once()
    assert proc.returncode == 0, describe_run(proc, "second sync failed")
    skippr.assert_table_matches("big", ALL_READERS)


def test_the_budget_is_validated(skippr: Skippr, db):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    for bad in (0, 2_000_000, "lots"):
        skippr.write_config(["t"], extra_pipeline={"transaction_memory_budget_mb": bad})
        proc = skippr.run("validate", check=False)
        assert_no_panic(proc)
        assert proc.returncode != 0, describe_run(proc, f"budget {bad!r} was accepted")
        assert "transaction_memory_budget_mb" in proc.stderr, describe_run(proc, "the key is not named")
