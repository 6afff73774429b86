"""Schema changes in the change stream: `ALTER TABLE` on a followed table reaches Iceberg as a
schema evolution, in order with the rows around it.

What the binary does, and what is checked here after every change (PyIceberg, DuckDB and
`skipprd query` against Postgres):

* ADD COLUMN: a new optional field with a new field id; rows from before read NULL. With a
  DEFAULT (or a value stored when the column was added) Postgres shows the default on the old
  rows and Iceberg shows NULL: a WARN naming DEFAULT and `--resnapshot` says so.
* widening (int -> bigint, real -> double precision, numeric(p,s) -> numeric(p2,s), p2 > p):
  the same field id with a promoted type; varchar(n) -> varchar(m) / text: nothing changes.
* an incompatible type change: a field `<column>__<typname>` takes the values from then on;
  the original field keeps its history and is NULL on rows written after the change.
* DROP COLUMN: the field stays (optional), NULL on rows written later.
* RENAME COLUMN: the field is renamed, same field id.
* a primary key column changed incompatibly, dropped or renamed: the pipeline stops, naming
  `--resnapshot`.

Several DDL statements with no row change of the table in between reach the stream as ONE
description of the table (pgoutput sends a relation message before the next change), so the
cases where that description alone is ambiguous (two renames, a rename and an add, a drop and
an add of the same type) are tested on their own.

"Written after the change" means inserted or updated after it: an update rewrites the whole
row in Iceberg, so a row updated after a DROP COLUMN has NULL in the dropped column, and a row
updated after an incompatible type change has its value in the new sibling column only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from decimal import Decimal
from typing import Any, Callable, Sequence

import psycopg
import pytest

from conftest import (
    Column,
    Database,
    PgTableSpec,
    Skippr,
    assert_no_panic,
    assert_rows_equal,
    describe_run,
    expected_rows,
    normalize,
    pg_table_spec,
    quote_ident,
)
from test_cdc import ALL_READERS, assert_fails, bg_log, stop, tx, wait_until_synced

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def ice_fields(skippr: Skippr, table: str) -> dict[str, tuple[int, str, bool]]:
    """name -> (field id, Iceberg type, required) of the table's current schema."""
    return {f.name: (f.field_id, str(f.field_type), f.required) for f in skippr.table(table).schema().fields}


def all_field_ids(skippr: Skippr, table: str) -> list[int]:
    """Every field id of the current schema, nested ones (list elements) included."""
    from pyiceberg.schema import index_by_id

    return sorted(index_by_id(skippr.table(table).schema()))


def query_columns(skippr: Skippr, table: str) -> list[str]:
    """The columns `SELECT *` has through `skipprd query` (keys of a JSON row, which carries
    NULLs as explicit nulls; the table must have a row)."""
    proc = skippr.run("query", f"SELECT * FROM {quote_ident(skippr.workspace)}.{quote_ident(table)} LIMIT 1",
                      "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, f"query of {table} failed")
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert lines, describe_run(proc, "no row")
    return list(json.loads(lines[0]))


def assert_evolved(
    skippr: Skippr,
    db: Database,
    table: str,
    columns: Sequence[Any],
    expect: Callable[[dict], dict] | None = None,
    readers: Sequence[str] = ALL_READERS,
) -> None:
    """The Iceberg table has exactly `columns` (in this order; a name takes the comparison kind of
    the Postgres column of that name, (name, kind) is for a column Postgres no longer has as
    such), and every reader returns the
    rows of Postgres passed through `expect` (Postgres row -> Iceberg row: the documented
    differences, such as values of kept columns). Keys `expect` leaves out read NULL."""
    pgspec = pg_table_spec(db, table)
    kinds = {c.name: c.kind for c in pgspec.columns}
    cols = []
    for c in columns:
        name, kind = (c, kinds[c]) if isinstance(c, str) else c
        cols.append(Column(name, f"iceberg {kind}", kind, ""))
    spec = PgTableSpec(pgspec.schema, pgspec.name, cols, pgspec.primary_key)
    names = [c.name for c in cols]

    schema_names = list(ice_fields(skippr, spec.iceberg_name))
    assert schema_names == names, f"Iceberg schema of {table}: expected columns {names}, got {schema_names}"

    expected = []
    for r in expected_rows(db, pgspec):
        m = expect(dict(r)) if expect else dict(r)
        expected.append({n: m.get(n) for n in names})
    failures = []   # every reader is tried, so that one reader's failure does not hide another's
    for reader in readers:
        try:
            if reader == "pyiceberg":
                actual = skippr.read_pyiceberg(spec.iceberg_name, spec.primary_key)
            elif reader == "duckdb":
                actual = skippr.read_duckdb(spec.iceberg_name, spec.primary_key)
            elif reader == "query":
                got_q = query_columns(skippr, spec.iceberg_name)
                assert got_q == names, f"`skipprd query` columns of {table}: expected {names}, got {got_q}"
                actual = skippr.read_query(spec)
            else:
                raise ValueError(reader)
            if spec.primary_key:
                assert_rows_equal(expected, actual, spec, reader)
            else:
                assert_same_multiset(expected, actual, spec, reader)
        except Exception as e:
            failures.append(f"[{reader}] {type(e).__name__}: {e}")
    if failures:
        raise AssertionError(f"{table} after the schema change:\n" + "\n".join(failures))


def assert_same_multiset(expected: list[dict], actual: list[dict], spec: PgTableSpec, label: str) -> None:
    """For a table without a key: the same rows, each as many times."""
    def canon(rows: list[dict]) -> Counter:
        return Counter(repr(tuple(normalize(r.get(c.name), c.kind) for c in spec.columns)) for r in rows)

    exp, got = canon(expected), canon(actual)
    if exp != got:
        missing, extra = exp - got, got - exp
        raise AssertionError(
            f"{label} read of {spec.qualified}: {sum(exp.values())} rows expected, {sum(got.values())} read\n"
            f"  missing ({sum(missing.values())}): {list(missing.items())[:6]}\n"
            f"  unexpected ({sum(extra.values())}): {list(extra.items())[:6]}"
        )


def dec(v):
    return None if v is None else Decimal(v)


def default_warnings(proc: subprocess.CompletedProcess) -> list[str]:
    """stderr lines that are WARNs about a column DEFAULT."""
    return [l for l in (proc.stderr or "").splitlines() if "WARN" in l and "DEFAULT" in l]


def assert_default_warning(proc: subprocess.CompletedProcess, column: str) -> None:
    lines = [l for l in default_warnings(proc) if "--resnapshot" in l and column in l]
    assert lines, describe_run(proc, f"no WARN naming DEFAULT, --resnapshot and column {column!r}")


def psql_c(db: Database, script: str) -> None:
    """`psql -c script`: several statements in one string run as ONE transaction."""
    c = db.cluster
    proc = subprocess.run(
        [str(c.bindir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-h", c.host, "-p", str(c.port), "-U", c.user,
         "-d", db.name, "-c", script],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": c.password}, timeout=120,
    )
    assert proc.returncode == 0, f"psql failed:\n{proc.stdout}\n{proc.stderr}"


def sync(skippr: Skippr) -> subprocess.CompletedProcess:
    return skippr.sync_once()


# --------------------------------------------------------------------------------------------
# ADD COLUMN
# --------------------------------------------------------------------------------------------


def test_add_column_new_optional_field_old_rows_null(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE items (id integer PRIMARY KEY, v text NOT NULL);
        INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 30) i;
    """)
    skippr.write_config(["items"])
    sync(skippr)
    f0 = ice_fields(skippr, "items")
    ids0 = all_field_ids(skippr, "items")

    db.execute("ALTER TABLE items ADD COLUMN score integer")
    db.execute("INSERT INTO items VALUES (31, 'v31', 310), (32, 'v32', NULL)")
    db.execute("UPDATE items SET score = 7 WHERE id = 1")
    db.execute("UPDATE items SET v = 'touched' WHERE id = 2")  # rewritten, score still NULL
    db.execute("DELETE FROM items WHERE id = 3")
    proc = sync(skippr)
    assert not default_warnings(proc), describe_run(proc, "warned about a DEFAULT for a column without one")
    f1 = ice_fields(skippr, "items")
    for name, (fid, ty, req) in f0.items():
        assert f1[name] == (fid, ty, req), f"field {name} changed: {f0[name]} -> {f1[name]}"
    sid, sty, sreq = f1["score"]
    assert sty == "int" and not sreq, f"score: {f1['score']}"
    assert sid not in ids0 and sid > max(ids0), f"score did not get a new field id: {sid}, old ids {ids0}"
    assert_evolved(skippr, db, "items", ["id", "v", "score"])

    # two more columns in one window (one schema change describing both)
    ids1 = all_field_ids(skippr, "items")
    tx(db, "ALTER TABLE items ADD COLUMN label varchar(20)", "ALTER TABLE items ADD COLUMN price numeric(8,2)",
       "INSERT INTO items VALUES (33, 'v33', 33, 'l33', 12.34)",
       "UPDATE items SET label = '', price = 0.01 WHERE id = 4")
    db.execute("UPDATE items SET score = score + 1 WHERE score IS NOT NULL")
    sync(skippr)
    f2 = ice_fields(skippr, "items")
    assert f2["label"][1] == "string" and not f2["label"][2], f2
    assert f2["price"][1] == "decimal(8, 2)" and not f2["price"][2], f2
    ids2 = all_field_ids(skippr, "items")
    new_ids = set(ids2) - set(ids1)
    assert len(new_ids) == 2 and min(new_ids) > max(ids1), f"new fields (label, price) ids: {ids1} -> {ids2}"
    assert_evolved(skippr, db, "items", ["id", "v", "score", "label", "price"])

    # steady state after the change
    db.execute("UPDATE items SET label = 'late', v = 'late' WHERE id BETWEEN 5 AND 9")
    db.execute("INSERT INTO items (id, v) VALUES (40, 'only v')")
    sync(skippr)
    assert_evolved(skippr, db, "items", ["id", "v", "score", "label", "price"])


def test_add_array_column(skippr: Skippr, db):
    """An added list column: new ids for the field and its element; old rows read NULL."""
    db.execute("""
        CREATE TABLE items (id integer PRIMARY KEY, v text);
        INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["items"])
    sync(skippr)
    ids0 = all_field_ids(skippr, "items")
    db.execute("ALTER TABLE items ADD COLUMN tags text[]")
    db.execute("INSERT INTO items VALUES (11, 'v11', ARRAY['a', NULL, 'c']), (12, 'v12', '{}')")
    db.execute("UPDATE items SET tags = ARRAY['x'] WHERE id = 1")
    sync(skippr)
    f1 = ice_fields(skippr, "items")
    assert f1["tags"][1] == "list<string>" and not f1["tags"][2], f1
    ids1 = all_field_ids(skippr, "items")
    new_ids = set(ids1) - set(ids0)
    assert len(new_ids) == 2 and min(new_ids) > max(ids0), f"new fields (tags, its element) ids: {ids0} -> {ids1}"
    assert_evolved(skippr, db, "items", ["id", "v", "tags"])


def test_add_column_with_default_warns_and_old_rows_read_null(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE stock (id integer PRIMARY KEY, v text);
        INSERT INTO stock SELECT i, 'v' || i FROM generate_series(1, 20) i;
    """)
    skippr.write_config(["stock"])
    sync(skippr)
    # ids written (inserted or updated) after each column was added: only those carry its value
    written: dict[str, set[int]] = {}

    def write(*ids: int) -> None:
        for ws in written.values():
            ws.update(ids)

    def older_rows_null(r):
        for col, ws in written.items():
            if r["id"] not in ws:
                r[col] = None
        return r

    # a DEFAULT: Postgres shows 5 on the old rows, Iceberg NULL
    db.execute("ALTER TABLE stock ADD COLUMN qty integer DEFAULT 5")
    written["qty"] = set()
    db.execute("INSERT INTO stock (id, v) VALUES (21, 'default applies')")
    db.execute("INSERT INTO stock VALUES (22, 'explicit', 7)")
    db.execute("UPDATE stock SET v = 'rewritten' WHERE id = 1")   # the new row version carries qty = 5
    write(21, 22, 1)
    assert db.scalar("SELECT qty FROM stock WHERE id = 2") == 5
    proc = sync(skippr)
    assert_default_warning(proc, "qty")
    assert not ice_fields(skippr, "stock")["qty"][2], "an added column must be optional"
    assert_evolved(skippr, db, "stock", ["id", "v", "qty"], older_rows_null)

    # a value stored when the column was added, with the DEFAULT dropped since
    db.execute("ALTER TABLE stock ADD COLUMN flag boolean DEFAULT true")
    db.execute("ALTER TABLE stock ALTER COLUMN flag DROP DEFAULT")
    written["flag"] = set()
    db.execute("INSERT INTO stock (id, v) VALUES (23, 'no default any more')")
    db.execute("UPDATE stock SET v = 'rewritten 2' WHERE id = 2")
    write(23, 2)
    assert db.scalar("SELECT flag FROM stock WHERE id = 3") is True
    assert db.scalar("SELECT flag FROM stock WHERE id = 23") is None
    proc = sync(skippr)
    assert_default_warning(proc, "flag")
    assert_evolved(skippr, db, "stock", ["id", "v", "qty", "flag"], older_rows_null)

    # NOT NULL DEFAULT: still an optional field, same documented difference
    db.execute("ALTER TABLE stock ADD COLUMN status text NOT NULL DEFAULT 'new'")
    written["status"] = set()
    db.execute("INSERT INTO stock (id, v, status) VALUES (24, 'x', 'explicit')")
    write(24)
    proc = sync(skippr)
    assert_default_warning(proc, "status")
    assert not ice_fields(skippr, "stock")["status"][2], "an added NOT NULL column must be optional in Iceberg"
    assert_evolved(skippr, db, "stock", ["id", "v", "qty", "flag", "status"], older_rows_null)
    # the documented difference is real: Postgres has no NULL there
    assert db.scalar("SELECT count(*) FROM stock WHERE qty IS NULL OR status IS NULL") == 0

    # the remedy the warning names: a re-snapshot copies the defaults
    proc = skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot")
    assert_no_panic(proc)
    skippr.assert_table_matches("stock", ALL_READERS)


# --------------------------------------------------------------------------------------------
# Widening
# --------------------------------------------------------------------------------------------


def test_widening_promotes_types_keeping_field_ids(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE wide (id integer PRIMARY KEY, n integer, s smallint, f real,
                           p numeric(10,2), q numeric(6,3), note text);
        INSERT INTO wide SELECT i, i * 1000, i, i / 8.0, i * 1234.56, i / 1000.0, 'n' || i
        FROM generate_series(1, 20) i;
    """)
    skippr.write_config(["wide"])
    sync(skippr)
    f0 = ice_fields(skippr, "wide")
    assert [f0[c][1] for c in ("n", "s", "f", "p", "q")] == ["int", "int", "float", "decimal(10, 2)", "decimal(6, 3)"], f0

    tx(db,
       "ALTER TABLE wide ALTER COLUMN n TYPE bigint",
       "ALTER TABLE wide ALTER COLUMN s TYPE bigint",
       "ALTER TABLE wide ALTER COLUMN f TYPE double precision",
       "ALTER TABLE wide ALTER COLUMN p TYPE numeric(20,2)",
       "ALTER TABLE wide ALTER COLUMN q TYPE numeric(9,3)")
    db.execute("INSERT INTO wide VALUES (21, 8000000000, -9000000000, 0.1, 123456789012345678.91, 987654.321, 'wide')")
    db.execute("INSERT INTO wide VALUES (22, -8000000000, 40000, 1e300, -99999999999999999.99, -999999.999, 'wide')")
    db.execute("UPDATE wide SET n = 9223372036854775807, f = 2.000000000000001, p = 1234567890123.45 WHERE id = 1")
    db.execute("UPDATE wide SET note = 'old values, rewritten' WHERE id = 2")
    db.execute("DELETE FROM wide WHERE id = 3")
    sync(skippr)
    f1 = ice_fields(skippr, "wide")
    want = {"n": "long", "s": "long", "f": "double", "p": "decimal(20, 2)", "q": "decimal(9, 3)"}
    for c, ty in want.items():
        assert f1[c][0] == f0[c][0], f"{c}: field id changed {f0[c][0]} -> {f1[c][0]}"
        assert f1[c][1] == ty, f"{c}: Iceberg type {f1[c][1]}, expected {ty} (promoted from {f0[c][1]})"
    assert set(f1) == set(f0), f"widening added or removed fields: {list(f0)} -> {list(f1)}"
    cols = ["id", "n", "s", "f", "p", "q", "note"]
    assert_evolved(skippr, db, "wide", cols)
    assert db.scalar("SELECT n FROM wide WHERE id = 21") == 8000000000

    # steady state: old rows (narrow data files) updated, new wide rows
    db.execute("UPDATE wide SET n = n * 1000000, s = s * 100000000 WHERE id BETWEEN 4 AND 10")
    db.execute("INSERT INTO wide VALUES (23, 1, 1, 1.5, 1.5, 1.5, 'small again')")
    sync(skippr)
    assert_evolved(skippr, db, "wide", cols)


def test_widening_the_primary_key(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE keyed (id integer PRIMARY KEY, v text);
        INSERT INTO keyed SELECT i, 'v' || i FROM generate_series(1, 50) i;
    """)
    skippr.write_config(["keyed"])
    sync(skippr)
    f0 = ice_fields(skippr, "keyed")

    db.execute("ALTER TABLE keyed ALTER COLUMN id TYPE bigint")
    db.execute("INSERT INTO keyed VALUES (8000000000, 'big key')")
    db.execute("UPDATE keyed SET v = 'updated after widening' WHERE id IN (3, 4)")
    db.execute("DELETE FROM keyed WHERE id = 5")
    db.execute("UPDATE keyed SET id = 9000000000 WHERE id = 6")
    sync(skippr)
    f1 = ice_fields(skippr, "keyed")
    assert f1["id"][0] == f0["id"][0] and f1["id"][1] == "long", f"id: {f0['id']} -> {f1['id']}"
    assert list(skippr.table("keyed").schema().identifier_field_ids) == [f0["id"][0]]
    assert_evolved(skippr, db, "keyed", ["id", "v"])

    db.execute("UPDATE keyed SET v = 'again' WHERE id IN (3, 7, 8000000000, 9000000000)")
    db.execute("DELETE FROM keyed WHERE id IN (8, 8000000000)")
    sync(skippr)
    assert_evolved(skippr, db, "keyed", ["id", "v"])


KEYLESS_CHANGES: dict[str, tuple[Any, ...]] = {
    # case: (DDL, rows in the same window, rows in the next window, Iceberg columns, expected mapping)
    "widen": (
        ["ALTER TABLE readings ALTER COLUMN n TYPE bigint", "ALTER TABLE readings ALTER COLUMN f TYPE double precision"],
        ["INSERT INTO readings VALUES ('big', 8000000000, 0.1, 'wide')",
         "UPDATE readings SET note = 'same window' WHERE n = 3"],
        ["UPDATE readings SET note = 'next window' WHERE n IN (1, 4)", "DELETE FROM readings WHERE n = 5",
         "UPDATE readings SET n = n + 8000000000 WHERE n = 8000000000"],
        ["sensor", "n", "f", "note"], None),
    "add_column": (
        ["ALTER TABLE readings ADD COLUMN extra text"],
        ["INSERT INTO readings VALUES ('new', 100, 1.5, 'n100', 'x')",
         "UPDATE readings SET note = 'same window' WHERE n = 3"],
        ["UPDATE readings SET note = 'next window' WHERE n IN (1, 4)", "DELETE FROM readings WHERE n = 5",
         "UPDATE readings SET extra = 'set later' WHERE n = 6"],
        ["sensor", "n", "f", "note", "extra"], None),
    # the dropped column keeps the values of rows not written since (n <= 20 and untouched)
    "drop_column": (
        ["ALTER TABLE readings DROP COLUMN note"],
        ["INSERT INTO readings VALUES ('new', 100, 1.5)",
         "UPDATE readings SET n = n + 1000 WHERE n = 3"],
        ["UPDATE readings SET n = n + 1000 WHERE n IN (1, 4)", "DELETE FROM readings WHERE n = 5"],
        ["sensor", "n", "f", ("note", "string")],
        lambda r: {**r, "note": f"n{r['n']}" if r["n"] <= 20 else None}),
}


@pytest.mark.parametrize("case", list(KEYLESS_CHANGES))
def test_schema_change_on_a_table_keyed_by_the_whole_row(skippr: Skippr, db, case):
    """REPLICA IDENTITY FULL without a key: the whole row identifies a row, so rows written
    before the change (older data files, narrower types, fewer columns) must still be found
    by updates and deletes after it. Rows 1 and 2 exist twice."""
    ddl, same, later, cols, expect = KEYLESS_CHANGES[case]
    db.execute("""
        CREATE TABLE readings (sensor text NOT NULL, n integer, f real, note text);
        ALTER TABLE readings REPLICA IDENTITY FULL;
        INSERT INTO readings SELECT 's' || (i % 5), i, i / 4.0, 'n' || i FROM generate_series(1, 20) i;
        INSERT INTO readings SELECT 's' || (i % 5), i, i / 4.0, 'n' || i FROM generate_series(1, 2) i;
    """)
    skippr.write_config(["readings"])
    sync(skippr)
    for s_ in ddl + same:
        db.execute(s_)
    sync(skippr)
    assert_evolved(skippr, db, "readings", cols, expect)
    for s_ in later:
        db.execute(s_)
    sync(skippr)
    assert_evolved(skippr, db, "readings", cols, expect)


def test_varchar_length_and_text_changes_keep_the_schema(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE names (id integer PRIMARY KEY, label varchar(10), note varchar(20), small smallint);
        INSERT INTO names SELECT i, 'l' || i, 'n' || i, i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["names"])
    sync(skippr)
    f0 = ice_fields(skippr, "names")

    db.execute("ALTER TABLE names ALTER COLUMN label TYPE varchar(40)")
    db.execute("INSERT INTO names VALUES (11, 'a label of forty chars, nearly....', 'n11', 11)")
    db.execute("ALTER TABLE names ALTER COLUMN note TYPE text")
    db.execute("INSERT INTO names VALUES (12, 'l12', repeat('long note ', 50), 12)")
    db.execute("UPDATE names SET note = note || ' now text, and longer than twenty' WHERE id = 1")
    db.execute("ALTER TABLE names ALTER COLUMN small TYPE integer")   # both are Iceberg int
    db.execute("INSERT INTO names VALUES (13, 'l13', 'n13', 2000000000)")
    sync(skippr)
    f1 = ice_fields(skippr, "names")
    assert f1 == f0, f"the Iceberg schema changed although every type still maps the same:\n{f0}\n{f1}"
    assert_evolved(skippr, db, "names", ["id", "label", "note", "small"])


# --------------------------------------------------------------------------------------------
# Incompatible type change: sibling column
# --------------------------------------------------------------------------------------------


def test_incompatible_type_change_goes_to_a_sibling_column(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE ledger (id integer PRIMARY KEY, amount numeric(10,2) NOT NULL, code text, qty integer);
        INSERT INTO ledger SELECT i, i * 1.25, (i * 7)::text, i FROM generate_series(1, 20) i;
    """)
    skippr.write_config(["ledger"])
    sync(skippr)
    f0 = ice_fields(skippr, "ledger")
    assert f0["amount"][1:] == ("decimal(10, 2)", True), f0

    after_amount: set[int] = set()   # rows written after amount became text
    after_code: set[int] = set()     # rows written after code became integer

    def expect(r):
        i = r["id"]
        if i in after_amount:
            r["amount__text"], r["amount"] = r["amount"], None
        else:
            r["amount"] = dec(r["amount"])
        if i in after_code:
            r["code__int4"], r["code"] = r["code"], None
        else:
            r["code"] = None if r["code"] is None else str(r["code"])
        return r

    db.execute("ALTER TABLE ledger ALTER COLUMN amount TYPE text")
    db.execute("INSERT INTO ledger VALUES (21, 'twenty-one', '147', 21)")
    db.execute("UPDATE ledger SET amount = amount || ' EUR' WHERE id = 1")
    db.execute("UPDATE ledger SET qty = 0 WHERE id = 2")   # amount itself unchanged, but the row is rewritten
    db.execute("DELETE FROM ledger WHERE id = 3")
    after_amount |= {1, 2, 21}
    sync(skippr)
    f1 = ice_fields(skippr, "ledger")
    assert f1["amount"][:2] == f0["amount"][:2], f"amount must keep its field id and type: {f0['amount']} -> {f1['amount']}"
    assert not f1["amount"][2], "amount must become optional: it is NULL on rows written after the change"
    assert "amount__text" in f1, f"no sibling column amount__text: {list(f1)}"
    sib_id, sib_ty, sib_req = f1["amount__text"]
    assert sib_ty == "string" and not sib_req and sib_id > max(v[0] for v in f0.values()), f1["amount__text"]
    cols = ["id", ("amount", "decimal"), "code", "qty", ("amount__text", "string")]
    assert_evolved(skippr, db, "ledger", cols, expect)

    # the naming rule uses pg_type.typname: integer is int4
    db.execute("ALTER TABLE ledger ALTER COLUMN code TYPE integer USING code::integer")
    db.execute("INSERT INTO ledger VALUES (22, '22.00', 154, 22)")
    db.execute("UPDATE ledger SET code = code + 1 WHERE id = 4")
    db.execute("UPDATE ledger SET amount = '5 (text)' WHERE id = 5")
    after_amount |= {22, 4, 5}
    after_code |= {22, 4, 5}
    sync(skippr)
    f2 = ice_fields(skippr, "ledger")
    assert "code__int4" in f2, f"no sibling column code__int4 (pg_type.typname of integer): {list(f2)}"
    assert f2["code__int4"][1] == "int" and f2["code"][:2] == f0["code"][:2], f2
    cols = ["id", ("amount", "decimal"), ("code", "string"), "qty", ("amount__text", "string"), ("code__int4", "int")]
    assert_evolved(skippr, db, "ledger", cols, expect)

    # steady state
    db.execute("UPDATE ledger SET qty = qty + 100 WHERE id BETWEEN 6 AND 8")
    db.execute("INSERT INTO ledger VALUES (23, 'x', NULL, NULL)")
    after_amount |= {6, 7, 8, 23}
    after_code |= {6, 7, 8, 23}
    sync(skippr)
    assert_evolved(skippr, db, "ledger", cols, expect)


# --------------------------------------------------------------------------------------------
# DROP COLUMN, RENAME COLUMN
# --------------------------------------------------------------------------------------------


def test_drop_column_keeps_the_field_and_its_history(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE people (id integer PRIMARY KEY, name text, gone text NOT NULL, age integer);
        INSERT INTO people SELECT i, 'p' || i, 'g' || i, 20 + i FROM generate_series(1, 20) i;
    """)
    skippr.write_config(["people"])
    sync(skippr)
    f0 = ice_fields(skippr, "people")
    assert f0["gone"][2], f"gone (NOT NULL) should start required: {f0}"

    after: set[int] = set()

    def expect(r):
        r["gone"] = None if r["id"] in after else f"g{r['id']}"
        return r

    db.execute("ALTER TABLE people DROP COLUMN gone")
    db.execute("INSERT INTO people VALUES (21, 'p21', 41)")
    db.execute("UPDATE people SET age = age + 1 WHERE id = 1")
    db.execute("DELETE FROM people WHERE id = 2")
    after |= {1, 21}
    sync(skippr)
    f1 = ice_fields(skippr, "people")
    assert "gone" in f1, f"the dropped column's field was removed: {list(f1)}"
    assert f1["gone"][:2] == f0["gone"][:2] and not f1["gone"][2], f"gone: {f0['gone']} -> {f1['gone']}"
    cols = ["id", "name", ("gone", "string"), "age"]
    assert_evolved(skippr, db, "people", cols, expect)

    db.execute("UPDATE people SET name = 'later' WHERE id IN (3, 4)")
    db.execute("INSERT INTO people VALUES (22, 'p22', 42)")
    after |= {3, 4, 22}
    sync(skippr)
    assert_evolved(skippr, db, "people", cols, expect)


def test_rename_column_keeps_the_field_id(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE things (id integer PRIMARY KEY, old_name text, n integer);
        INSERT INTO things SELECT i, 'o' || i, i FROM generate_series(1, 20) i;
    """)
    skippr.write_config(["things"])
    sync(skippr)
    f0 = ice_fields(skippr, "things")

    db.execute("ALTER TABLE things RENAME COLUMN old_name TO new_name")
    db.execute("INSERT INTO things VALUES (21, 'n21', 21)")
    db.execute("UPDATE things SET new_name = 'renamed then updated' WHERE id = 1")
    db.execute("DELETE FROM things WHERE id = 2")
    sync(skippr)
    f1 = ice_fields(skippr, "things")
    assert "old_name" not in f1, f"old name still in the schema: {list(f1)}"
    assert f1.get("new_name", (None,))[0] == f0["old_name"][0], f"field id: old_name {f0['old_name']} -> new_name {f1.get('new_name')}"
    assert f1["new_name"][1] == f0["old_name"][1]
    assert len(f1) == len(f0), f"a rename added fields: {list(f0)} -> {list(f1)}"
    # old rows (data files written under the old name) read under the new one
    assert_evolved(skippr, db, "things", ["id", "new_name", "n"])

    db.execute("ALTER TABLE things RENAME COLUMN n TO amount")
    db.execute("UPDATE things SET amount = -amount WHERE id > 15")
    sync(skippr)
    f2 = ice_fields(skippr, "things")
    assert f2.get("amount", (None,))[0] == f0["n"][0], f"field id: n {f0['n']} -> amount {f2.get('amount')}"
    assert_evolved(skippr, db, "things", ["id", "new_name", "amount"])


#: DDL with no row change of the table in between: the change stream describes the table once,
#: after all of it. case: (DDL, rows after, expected Iceberg columns, what must keep its field id
#: {new name: old name}, expected row mapping).
NO_DATA_BETWEEN: dict[str, tuple[Any, ...]] = {
    "two_renames": (
        ["ALTER TABLE pair RENAME COLUMN a TO a2", "ALTER TABLE pair RENAME COLUMN b TO b2"],
        ["INSERT INTO pair VALUES (11, 'a11', 'b11')"],
        ["id", "a2", "b2"], {"a2": "a", "b2": "b"}, None),
    "rename_and_add": (
        ["ALTER TABLE pair RENAME COLUMN a TO a2", "ALTER TABLE pair ADD COLUMN c text"],
        ["INSERT INTO pair VALUES (11, 'a11', 'b11', 'c11')"],
        ["id", "a2", "b", "c"], {"a2": "a", "b": "b"}, None),
    # not a rename: b keeps its history, c is a new column, NULL on the old rows (as in Postgres)
    "drop_then_add_same_type": (
        ["ALTER TABLE pair DROP COLUMN b", "ALTER TABLE pair ADD COLUMN c text"],
        ["INSERT INTO pair VALUES (11, 'a11', 'c11')"],
        ["id", "a", ("b", "string"), "c"], {"a": "a", "b": "b"},
        lambda r: {**r, "b": None if r["id"] == 11 else f"b{r['id']}"}),
}


@pytest.mark.parametrize("case", list(NO_DATA_BETWEEN))
def test_several_ddl_without_rows_in_between(skippr: Skippr, db, case):
    ddl, rows, cols, keep, expect = NO_DATA_BETWEEN[case]
    db.execute("""
        CREATE TABLE pair (id integer PRIMARY KEY, a text, b text);
        INSERT INTO pair SELECT i, 'a' || i, 'b' || i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["pair"])
    sync(skippr)
    f0 = ice_fields(skippr, "pair")
    for s in ddl:
        db.execute(s)   # separate transactions, no row change in between
    for s in rows:
        db.execute(s)
    sync(skippr)
    f1 = ice_fields(skippr, "pair")
    sample = f"first rows in Iceberg: {skippr.read_pyiceberg('pair', ['id'])[:2]}, in Postgres: " \
             f"{db.execute('SELECT * FROM pair ORDER BY id LIMIT 2')}"
    for new, old in keep.items():
        assert new in f1 and f1[new][0] == f0[old][0], \
            f"{case}: {new} must have {old}'s field id {f0[old][0]}: {f1}\n{sample}"
    new_cols = [c for c in f1 if c not in keep and c != "id"]
    for c in new_cols:
        assert f1[c][0] > max(v[0] for v in f0.values()), \
            f"{case}: added column {c} must have a new field id: {f1}\n{sample}"
    assert_evolved(skippr, db, "pair", cols, expect)


# --------------------------------------------------------------------------------------------
# DDL mixed with rows, in one transaction and in separate ones, all in one sync window
# --------------------------------------------------------------------------------------------

#: (statement, phase after it): the phase counts the schema changes so far.
MIXED = [
    ("INSERT INTO mix VALUES (21, 'a21', 21, 21.5, 'd21', 'z21')", 0),
    ("UPDATE mix SET a = 'a1 updated' WHERE id = 1", 0),
    ("ALTER TABLE mix ADD COLUMN e text", 1),
    ("INSERT INTO mix VALUES (22, 'a22', 22, 22.5, 'd22', 'z22', 'e22')", 1),
    ("UPDATE mix SET e = 'e2' WHERE id = 2", 1),
    ("ALTER TABLE mix ALTER COLUMN b TYPE bigint", 2),
    ("INSERT INTO mix VALUES (23, 'a23', 8000000000, 23.5, 'd23', 'z23', 'e23')", 2),
    ("UPDATE mix SET b = -9000000000 WHERE id = 3", 2),
    ("ALTER TABLE mix ALTER COLUMN c TYPE text", 3),
    ("INSERT INTO mix VALUES (24, 'a24', 24, 'c24 is text now', 'd24', 'z24', 'e24')", 3),
    ("UPDATE mix SET c = c || ' (text)' WHERE id = 4", 3),
    ("UPDATE mix SET a = 'a5 touched after c changed' WHERE id = 5", 3),
    ("ALTER TABLE mix DROP COLUMN d", 4),
    ("INSERT INTO mix (id, a, b, c, z, e) VALUES (25, 'a25', 25, '25', 'z25', 'e25')", 4),
    ("UPDATE mix SET a = 'a6 after drop' WHERE id = 6", 4),
    ("DELETE FROM mix WHERE id = 7", 4),
    ("ALTER TABLE mix RENAME COLUMN a TO a_renamed", 5),
    ("INSERT INTO mix (id, a_renamed, b, c, z, e) VALUES (26, 'a26', 26, '26', 'z26', 'e26')", 5),
    ("UPDATE mix SET a_renamed = 'a8 after rename' WHERE id = 8", 5),
    ("ALTER TABLE mix ADD COLUMN f integer", 6),
    ("ALTER TABLE mix ADD COLUMN g text", 6),
    ("ALTER TABLE mix DROP COLUMN z", 6),
    ("INSERT INTO mix (id, a_renamed, b, c, e, f, g) VALUES (27, 'a27', 27, '27', 'e27', 27, 'g27')", 6),
    ("UPDATE mix SET f = 9, g = 'g9' WHERE id = 9", 6),
]
MIXED_COLUMNS = ["id", "a_renamed", "b", ("c", "decimal"), ("d", "string"), ("z", "string"), "e",
                 ("c__text", "string"), "f", "g"]


def mixed_expect(phase: dict[int, int]) -> Callable[[dict], dict]:
    """Iceberg row of a `mix` row last written in `phase` (0 if not written since the snapshot)."""
    def f(r):
        i, p = r["id"], phase.get(r["id"], 0)
        if p >= 3:
            r["c__text"], r["c"] = r["c"], None
        else:
            r["c"] = dec(r["c"])
        r["d"] = f"d{i}" if p < 4 else None
        r["z"] = f"z{i}" if p < 6 else None
        return r
    return f


@pytest.mark.parametrize("how", ["psql_one_transaction", "separate_transactions"])
def test_ddl_mixed_with_rows_in_one_sync_window(skippr: Skippr, db, how):
    db.execute("""
        CREATE TABLE mix (id integer PRIMARY KEY, a text, b integer, c numeric(6,2), d text NOT NULL, z text);
        INSERT INTO mix SELECT i, 'a' || i, i, i * 1.5, 'd' || i, 'z' || i FROM generate_series(1, 20) i;
        CREATE TABLE bystander (id integer PRIMARY KEY, v text);
        INSERT INTO bystander SELECT i, 'b' || i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["mix", "bystander"])
    sync(skippr)
    f0 = ice_fields(skippr, "mix")

    phase: dict[int, int] = {}
    for stmt, p in MIXED:
        if stmt.startswith(("INSERT", "UPDATE")):
            i = int(stmt.split("VALUES (")[1].split(",")[0]) if stmt.startswith("INSERT") else int(stmt.rsplit("=", 1)[1])
            phase[i] = p
    statements = [s for s, _ in MIXED]
    if how == "psql_one_transaction":
        # the rows of the other table interleave with the DDL in the same transaction
        script = "; ".join(statements[:9] + ["UPDATE bystander SET v = 'in the ddl tx' WHERE id < 4"] + statements[9:])
        psql_c(db, script)
        xids = db.execute("SELECT DISTINCT xmin::text FROM mix WHERE id > 20")
        assert len(xids) == 1, f"psql -c did not run as one transaction: {xids}"
    else:
        for s in statements:
            db.execute(s)
            if s.startswith("ALTER"):
                db.execute("UPDATE bystander SET v = v || '+' WHERE id = 1")
    sync(skippr)

    f1 = ice_fields(skippr, "mix")
    assert f1["a_renamed"][0] == f0["a"][0], f"rename lost the field id: {f0['a']} -> {f1.get('a_renamed')}"
    assert f1["b"][:2] == (f0["b"][0], "long"), f"b: {f0['b']} -> {f1['b']}"
    assert f1["c"][:2] == f0["c"][:2], f"c: {f0['c']} -> {f1['c']}"
    assert f1["d"][0] == f0["d"][0] and not f1["d"][2], f"d: {f0['d']} -> {f1['d']}"
    assert_evolved(skippr, db, "mix", MIXED_COLUMNS, mixed_expect(phase))
    skippr.assert_table_matches("bystander", ALL_READERS)

    # after the window: plain changes on the evolved table
    db.execute("UPDATE mix SET e = 'later' WHERE id IN (10, 11)")
    db.execute("INSERT INTO mix (id, a_renamed, b, c, e, f, g) VALUES (28, 'a28', 1, 'c28', 'e28', 28, 'g28')")
    phase.update({10: 6, 11: 6, 28: 6})
    sync(skippr)
    assert_evolved(skippr, db, "mix", MIXED_COLUMNS, mixed_expect(phase))


# --------------------------------------------------------------------------------------------
# Under load: a writer keeps going while the schema changes, continuous sync running
# --------------------------------------------------------------------------------------------


class Writer(threading.Thread):
    """Inserts, updates and deletes rows with ids from 100001 on, through columns id, v (v2
    once renamed) and w, until stopped."""

    def __init__(self, db: Database):
        super().__init__(daemon=True)
        self.db = db
        self.halt = threading.Event()
        self.errors: list[str] = []
        self.vcol = "v"
        self.ids: list[int] = []
        self.next_id = 100001
        self.ops = 0

    def run(self) -> None:
        rnd = random.Random(11)
        try:
            with self.db.connect() as conn:
                while not self.halt.is_set():
                    try:
                        i = self.next_id
                        conn.execute(f"INSERT INTO live (id, {self.vcol}, w) VALUES (%s, %s, %s)", (i, f"w{i}", i))
                        self.next_id += 1
                        self.ids.append(i)
                        j = rnd.choice(self.ids)
                        conn.execute(f"UPDATE live SET {self.vcol} = {self.vcol} || '+', w = w + 1 WHERE id = %s", (j,))
                        if self.ops % 10 == 9 and len(self.ids) > 5:
                            k = self.ids.pop(rnd.randrange(len(self.ids)))
                            conn.execute("DELETE FROM live WHERE id = %s", (k,))
                        self.ops += 1
                    except psycopg.errors.UndefinedColumn:
                        self.vcol = "v2"   # renamed under the writer
                    time.sleep(0.003)
        except Exception as e:  # reported by the test
            self.errors.append(repr(e))


def live_expect(r: dict) -> dict:
    i = r["id"]
    if i <= 500:
        after_amount = i % 13 == 0 or i % 17 == 0 or i % 19 == 0
        after_drop = i % 17 == 0 or i % 19 == 0
        if after_amount:
            r["amount__text"], r["amount"] = r["amount"], None
        else:
            r["amount"] = dec(r["amount"])
        r["d"] = None if after_drop else f"d{i}"
    else:
        assert r["amount"] is None
        r["d"] = None
    return r


LIVE_COLUMNS = ["id", "v2", "w", "r", ("amount", "decimal"), ("d", "string"), "extra", ("amount__text", "string")]


def test_schema_changes_under_load_with_continuous_sync(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE live (id integer PRIMARY KEY, v text NOT NULL, w integer, r real,
                           amount numeric(10,2), d text);
        INSERT INTO live SELECT i, 'v' || i, i, i / 4.0, i * 1.25, 'd' || i FROM generate_series(1, 500) i;
    """)
    skippr.write_config(["live"], extra_pipeline={"commit_interval": "1s"})
    proc = skippr.start("sync", "--pipeline", "app")
    writer = Writer(db)
    try:
        wait_until_synced(skippr, db, ["live"], proc, timeout=120)
        writer.start()
        time.sleep(2)
        phases = [
            ["ALTER TABLE live ADD COLUMN extra text",
             "UPDATE live SET extra = 'e' || id WHERE id <= 500 AND id % 5 = 0"],
            ["ALTER TABLE live ALTER COLUMN w TYPE bigint",
             "UPDATE live SET w = 8000000000 + id WHERE id <= 500 AND id % 7 = 0"],
            ["ALTER TABLE live ALTER COLUMN r TYPE double precision",
             "UPDATE live SET r = 0.1 + id WHERE id <= 500 AND id % 11 = 0"],
            ["ALTER TABLE live ALTER COLUMN amount TYPE text",
             "UPDATE live SET amount = 'txt' || id WHERE id <= 500 AND id % 13 = 0"],
            ["ALTER TABLE live DROP COLUMN d",
             "UPDATE live SET extra = 'after drop' WHERE id <= 500 AND id % 17 = 0"],
            ["ALTER TABLE live RENAME COLUMN v TO v2",
             "UPDATE live SET v2 = 'renamed ' || id WHERE id <= 500 AND id % 19 = 0"],
        ]
        for stmts in phases:
            for s in stmts:
                db.execute(s)
            time.sleep(1.5)
            assert proc.poll() is None, f"continuous sync exited after `{stmts[0]}`\n{bg_log(skippr)}"
            assert writer.is_alive(), f"writer died: {writer.errors}"
        time.sleep(2)
        writer.halt.set()
        writer.join(timeout=60)
        assert not writer.errors, f"writer failed: {writer.errors}"
        assert writer.vcol == "v2", "the writer never saw the rename"
        print(f"writer: {writer.ops} rounds, {len(writer.ids)} rows alive")

        # the running sync catches up by itself
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"continuous sync exited\n{bg_log(skippr)}"
            try:
                assert_evolved(skippr, db, "live", LIVE_COLUMNS, live_expect, readers=("pyiceberg",))
                break
            except Exception as e:  # not there yet
                if time.monotonic() > deadline:
                    raise AssertionError(f"the continuous sync did not catch up within 90s: {e}\n{bg_log(skippr)}")
            time.sleep(1)
        rc = stop(proc, signal.SIGTERM)
    finally:
        writer.halt.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, f"sync exited {rc} after SIGTERM\n{bg_log(skippr)}"
    assert "panicked" not in bg_log(skippr), bg_log(skippr)

    sync(skippr)
    assert db.scalar("SELECT count(*) FROM live WHERE id > 100000") == len(writer.ids)
    assert_evolved(skippr, db, "live", LIVE_COLUMNS, live_expect)
    f = ice_fields(skippr, "live")
    assert (f["w"][1], f["r"][1], f["amount"][1], f["amount__text"][1]) == ("long", "double", "decimal(10, 2)", "string"), f


# --------------------------------------------------------------------------------------------
# Tables added to and removed from `tables:`
# --------------------------------------------------------------------------------------------


def test_tables_added_and_removed_later(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE main_t (id integer PRIMARY KEY, v text);
        CREATE TABLE side_t (id integer PRIMARY KEY, v text, n integer);
        INSERT INTO main_t SELECT i, 'm' || i FROM generate_series(1, 30) i;
        INSERT INTO side_t SELECT i, 's' || i, i FROM generate_series(1, 30) i;
    """)
    skippr.write_config(["main_t"])
    sync(skippr)
    db.execute("ALTER TABLE main_t ADD COLUMN extra integer")
    db.execute("UPDATE main_t SET extra = id WHERE id < 10")
    db.execute("UPDATE side_t SET v = 'before it was followed' WHERE id < 5")
    sync(skippr)
    assert_evolved(skippr, db, "main_t", ["id", "v", "extra"])
    main_snap = skippr.table("main_t").current_snapshot().snapshot_id

    # added: a snapshot of it, the other table untouched
    db.execute("UPDATE side_t SET n = -n WHERE id > 25")
    skippr.write_config(["main_t", "side_t"])
    sync(skippr)
    skippr.assert_table_matches("side_t", ALL_READERS)
    assert skippr.table("main_t").current_snapshot().snapshot_id == main_snap, \
        "adding another table committed to main_t although main_t had no changes"
    assert_evolved(skippr, db, "main_t", ["id", "v", "extra"])

    # then followed, schema changes included
    db.execute("UPDATE side_t SET v = 'followed' WHERE id BETWEEN 5 AND 9")
    db.execute("ALTER TABLE side_t ADD COLUMN flag boolean")
    db.execute("INSERT INTO side_t VALUES (31, 's31', 31, true)")
    db.execute("DELETE FROM side_t WHERE id = 10")
    db.execute("UPDATE main_t SET v = 'both' WHERE id = 1")
    sync(skippr)
    assert_evolved(skippr, db, "side_t", ["id", "v", "n", "flag"])
    assert_evolved(skippr, db, "main_t", ["id", "v", "extra"])

    # removed: no longer followed, its Iceberg data kept as it was
    side_rows = skippr.read_pyiceberg("side_t", ["id"])
    side_snap = skippr.table("side_t").current_snapshot().snapshot_id
    side_spec = pg_table_spec(db, "side_t")
    skippr.write_config(["main_t"])
    db.execute("UPDATE side_t SET v = 'after removal' WHERE id < 20")
    db.execute("ALTER TABLE side_t ADD COLUMN unseen text")
    db.execute("ALTER TABLE side_t ALTER COLUMN n TYPE text")
    db.execute("INSERT INTO side_t VALUES (32, 's32', 'n', false, 'u')")
    db.execute("DELETE FROM side_t WHERE id > 25")
    db.execute("UPDATE main_t SET v = 'after side_t left' WHERE id < 5")
    db.execute("INSERT INTO main_t VALUES (31, 'm31', 31)")
    sync(skippr)
    assert_evolved(skippr, db, "main_t", ["id", "v", "extra"])
    sync(skippr)
    assert skippr.table("side_t").current_snapshot().snapshot_id == side_snap, "side_t got a commit after it was removed"
    assert list(ice_fields(skippr, "side_t")) == ["id", "v", "n", "flag"], "side_t's schema changed after it was removed"
    assert skippr.read_pyiceberg("side_t", ["id"]) == side_rows, "side_t's rows changed after it was removed"
    kept = PgTableSpec(side_spec.schema, side_spec.name, side_spec.columns, side_spec.primary_key)
    assert_rows_equal(side_rows, skippr.read_duckdb("side_t", ["id"]), kept, "duckdb")
    assert_rows_equal(side_rows, skippr.read_query(kept), kept, "query")


# --------------------------------------------------------------------------------------------
# Primary key changes stop the pipeline
# --------------------------------------------------------------------------------------------

PK_CHANGES = {
    "type_incompatible": ("ALTER TABLE pk_t ALTER COLUMN id TYPE text", "INSERT INTO pk_t VALUES ('x', 'after')"),
    "dropped": ("ALTER TABLE pk_t DROP COLUMN id", "INSERT INTO pk_t VALUES ('after')"),
    "renamed": ("ALTER TABLE pk_t RENAME COLUMN id TO key", "INSERT INTO pk_t VALUES (99, 'after')"),
}


@pytest.mark.parametrize("case", list(PK_CHANGES))
def test_primary_key_change_stops_the_pipeline(skippr: Skippr, db, case):
    ddl, row = PK_CHANGES[case]
    db.execute("""
        CREATE TABLE pk_t (id integer PRIMARY KEY, v text);
        CREATE TABLE other_t (id integer PRIMARY KEY, v text);
        INSERT INTO pk_t SELECT i, 'v' || i FROM generate_series(1, 10) i;
        INSERT INTO other_t VALUES (1, 'a');
    """)
    skippr.write_config(["pk_t", "other_t"], extra_pipeline={"commit_interval": "1s"})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        wait_until_synced(skippr, db, ["pk_t", "other_t"], proc, timeout=120)
        db.execute("UPDATE pk_t SET v = 'seen' WHERE id = 1")
        wait_until_synced(skippr, db, ["pk_t"], proc)
        before = skippr.read_pyiceberg("pk_t", ["id"])
        db.execute(ddl)
        db.execute(row)
        db.execute("INSERT INTO other_t VALUES (2, 'b')")
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"continuous sync kept running 60s after `{ddl}`\n{bg_log(skippr)}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = bg_log(skippr)
    assert "panicked" not in log, log
    assert rc != 0, f"continuous sync exited 0 after `{ddl}`\n{log}"
    err = (skippr.workdir / "bg.stderr").read_text(errors="replace")
    assert "--resnapshot" in err, f"the error does not mention --resnapshot\n{log}"
    assert skippr.read_pyiceberg("pk_t", ["id"]) == before, "pk_t changed although the pipeline stopped"
    assert_fails(skippr, must_name=["--resnapshot"], what=f"sync --once after `{ddl}`")

    if case != "dropped":   # with a key again, a re-snapshot recovers
        assert_no_panic(skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot"))
        skippr.assert_table_matches("pk_t", ALL_READERS)
        skippr.assert_table_matches("other_t", ALL_READERS)


# --------------------------------------------------------------------------------------------
# schema_sink: a LocalIceberg schema sink on the same warehouse
# --------------------------------------------------------------------------------------------


def test_local_iceberg_schema_sink_is_accepted(skippr: Skippr, db):
    db.execute("""
        CREATE TABLE sinked (id integer PRIMARY KEY, v text);
        INSERT INTO sinked SELECT i, 'v' || i FROM generate_series(1, 10) i;
    """)
    text = skippr.write_config(["sinked"]).read_text()
    assert text.endswith("      warehouse: ./warehouse\n"), text
    skippr.write_raw_config(
        text
        + "    schema_sink: schema_sinks.lake_schema\n"
        + "schema_sinks:\n  lake_schema:\n    LocalIceberg:\n      warehouse: ./warehouse\n"
    )
    proc = skippr.run("validate", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "validate rejected a LocalIceberg schema_sink")
    sync(skippr)
    skippr.assert_table_matches("sinked", ALL_READERS)

    db.execute("ALTER TABLE sinked ADD COLUMN extra integer")
    db.execute("INSERT INTO sinked VALUES (11, 'v11', 11)")
    db.execute("ALTER TABLE sinked RENAME COLUMN v TO label")
    db.execute("UPDATE sinked SET extra = 1 WHERE id = 1")
    sync(skippr)
    assert_evolved(skippr, db, "sinked", ["id", "label", "extra"])
