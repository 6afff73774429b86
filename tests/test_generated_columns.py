"""Columns the change stream does not carry are never NULL in silence (issue 41, item 5).

pgoutput leaves some columns out of its row messages: before Postgres 18 every generated column,
on 18 a stored one unless the publication has `publish_generated_columns = stored` and a virtual
one always, and on 15 and later any column a publication's column list leaves out. A snapshot
copies such a column, then every streamed insert and update would land it as NULL. So:

* on Debian's Postgres (15): a table with a stored generated column is refused by `discover` and
  by `sync` at start, naming the table, the column and both ways out
  (`pipelines.<p>.tables.<t>.exclude_columns`, or Postgres 18); with `exclude_columns` the
  table syncs (snapshot and CDC) and the Iceberg table has no such column in any reader. A
  sensitive column left out the same way appears nowhere in the warehouse. A publication the
  user made with a column list that leaves out a column is refused the same way, and a table
  dropped from it stops `sync` naming `--resnapshot`;
* on Postgres 18: the publication Skippr makes carries stored generated columns, so inserts
  and updates land their values (never NULL) in every reader; a virtual generated column is
  refused with `exclude_columns` as the way out.

The generated column is named `a_doubled` rather than `b`, so that "the message names the
column" is a check that can fail. One database per Postgres version for the module; each test
has its own tables and its own workspace (so its own slot and publication).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Iterable, Sequence

import pytest

from conftest import (
    Database,
    PgCluster,
    Skippr,
    assert_no_panic,
    assert_rows_equal,
    describe_run,
    expected_rows,
    fresh_database,
    pg_table_spec,
)

POSTGRES_18 = re.compile(r"Postgres(?:QL)?\s*18")


@pytest.fixture(scope="module")
def mdb(pg: PgCluster) -> Iterable[Database]:
    yield from fresh_database(pg)


@pytest.fixture(scope="module")
def mdb18(pg18: PgCluster) -> Iterable[Database]:
    yield from fresh_database(pg18)


def pipeline(db: Database, workdir: Path, workspace: str, tables: Sequence[str], *,
             exclude: dict[str, list[str]] | None = None, publication: str | None = None,
             commit_interval: str | None = None) -> Skippr:
    """A Skippr on `db` with its own workspace (slot and publication `skippr_<workspace>_app`,
    unless `publication` names one the test made)."""
    sk = Skippr(db=db, workdir=workdir)
    extra_pipeline = {}
    if exclude:
        extra_pipeline["tables"] = {t: {"exclude_columns": cols} for t, cols in exclude.items()}
    if commit_interval:
        extra_pipeline["commit_interval"] = commit_interval
    sk.write_config(tables, workspace=workspace,
                    extra_source={"publication": publication} if publication else None,
                    extra_pipeline=extra_pipeline or None)
    return sk


def refused(proc, what: str, must_name: Sequence[str], postgres_18: bool) -> None:
    assert_no_panic(proc)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, describe_run(proc, f"succeeded, but must refuse {what}")
    for word in must_name:
        assert word in out, describe_run(proc, f"does not name {word!r} ({what})")
    if postgres_18:
        assert POSTGRES_18.search(out), describe_run(proc, f"does not name Postgres 18 as a way out ({what})")


def assert_refused_everywhere(sk: Skippr, what: str, must_name: Sequence[str], postgres_18: bool = False) -> None:
    """`discover` (text and json) fails naming `must_name`, and so does `sync --once`, before
    anything reaches Iceberg."""
    for fmt in ((), ("--format", "json")):
        refused(sk.run("discover", "--pipeline", "app", *fmt, check=False), what, must_name, postgres_18)
    refused(sk.run("sync", "--pipeline", "app", "--once", check=False), what, must_name, postgres_18)
    catalog = sk.warehouse / "catalog.db"
    if catalog.exists():
        import sqlite3

        with sqlite3.connect(catalog) as conn:
            tables = conn.execute("SELECT table_name FROM iceberg_tables").fetchall()
        assert tables == [], f"sync refused {what} yet made Iceberg tables {tables}"


def assert_synced_without(sk: Skippr, table: str, excluded: Sequence[str]) -> None:
    """PyIceberg and DuckDB read `table` equal to Postgres minus `excluded`, which the Iceberg
    table does not have."""
    fields = [f.name for f in sk.table(table).schema().fields]
    for col in excluded:
        assert col not in fields, f"the Iceberg table {table} has the excluded column {col}: {fields}"
    spec = pg_table_spec(sk.db, table)
    spec.columns = [c for c in spec.columns if c.name not in excluded]
    expected = expected_rows(sk.db, spec)
    assert_rows_equal(expected, sk.read_pyiceberg(table, spec.primary_key), spec, "pyiceberg")
    assert_rows_equal(expected, sk.read_duckdb(table, spec.primary_key), spec, "duckdb")


def sync(sk: Skippr, *args: str) -> None:
    proc = sk.run("sync", "--pipeline", "app", "--once", *args, check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "sync --once failed")


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


# --------------------------------------------------------------------------------------------
# Debian's Postgres (before 18): generated columns are never streamed
# --------------------------------------------------------------------------------------------


def test_stored_generated_column_is_refused_before_postgres_18(mdb: Database, workdir: Path):
    mdb.execute("""
        CREATE TABLE gen_refused (id int PRIMARY KEY, a int, a_doubled int GENERATED ALWAYS AS (a * 2) STORED);
        INSERT INTO gen_refused (id, a) SELECT i, i FROM generate_series(1, 10) i;
    """)
    sk = pipeline(mdb, workdir, "gen_refused", ["gen_refused"])
    assert_refused_everywhere(sk, "a stored generated column on Postgres 15",
                              ["gen_refused", "a_doubled", "exclude_columns"], postgres_18=True)


def test_exclude_columns_leaves_generated_and_sensitive_columns_out(mdb: Database, workdir: Path):
    marker = "SECRET-" + secrets.token_hex(8)
    mdb.execute(f"""
        CREATE TABLE gen_excluded (
            id int PRIMARY KEY, a int, a_doubled int GENERATED ALWAYS AS (a * 2) STORED,
            ssn text, note text);
        INSERT INTO gen_excluded (id, a, ssn, note)
            SELECT i, i, '{marker}-' || i, 'note ' || i FROM generate_series(1, 50) i;
    """)
    excluded = ["a_doubled", "ssn"]
    sk = pipeline(mdb, workdir, "gen_excluded", ["gen_excluded"], exclude={"gen_excluded": excluded})
    proc = sk.run("discover", "--pipeline", "app", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "discover refused a table whose generated column is excluded")

    sync(sk)
    assert_synced_without(sk, "gen_excluded", excluded)
    # the stream: inserts, updates of the source of the generated column, deletes
    mdb.execute(f"INSERT INTO gen_excluded (id, a, ssn, note) VALUES (51, 51, '{marker}-51', 'new'), (52, NULL, NULL, NULL)")
    mdb.execute(f"UPDATE gen_excluded SET a = a + 100, ssn = '{marker}-changed' WHERE id <= 5")
    mdb.execute("UPDATE gen_excluded SET note = 'only note' WHERE id = 6")
    mdb.execute("DELETE FROM gen_excluded WHERE id IN (7, 8)")
    sync(sk)
    assert_synced_without(sk, "gen_excluded", excluded)
    assert files_containing(sk.warehouse, marker.encode()) == [], \
        "the excluded column's values are in the warehouse"

    # Another set of excluded columns on the synced table: refused (the rows in the lake were
    # copied with the old set), until --resnapshot copies the table with the new one.
    sk = pipeline(mdb, workdir, "gen_excluded", ["gen_excluded"], exclude={"gen_excluded": ["a_doubled"]})
    proc = sk.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "a changed exclude_columns was accepted on a synced table")
    for word in ("exclude_columns", "--resnapshot"):
        assert word in proc.stderr, describe_run(proc, f"the refusal does not name {word!r}")
    sync(sk, "--resnapshot")
    assert_synced_without(sk, "gen_excluded", ["a_doubled"])


def test_exclude_columns_naming_a_missing_or_key_column_is_refused(mdb: Database, workdir: Path):
    mdb.execute("CREATE TABLE gen_badexclude (id int PRIMARY KEY, a int)")
    sk = pipeline(mdb, workdir, "gen_badexclude", ["gen_badexclude"], exclude={"gen_badexclude": ["no_such_col"]})
    assert_refused_everywhere(sk, "exclude_columns naming a column the table lacks", ["no_such_col", "pipelines.app.tables.gen_badexclude.exclude_columns"])
    sk = pipeline(mdb, workdir, "gen_badexclude", ["gen_badexclude"], exclude={"gen_badexclude": ["id"]})
    assert_refused_everywhere(sk, "exclude_columns naming the primary key", ["`id`", "pipelines.app.tables.gen_badexclude.exclude_columns"])


def test_publication_column_list_leaving_out_a_column_is_refused(mdb: Database, workdir: Path):
    mdb.execute("""
        CREATE TABLE collist (id int PRIMARY KEY, a int, left_out text);
        INSERT INTO collist SELECT i, i, 'x' || i FROM generate_series(1, 20) i;
        CREATE PUBLICATION collist_pub FOR TABLE collist (id, a);
    """)
    sk = pipeline(mdb, workdir, "collist", ["collist"], publication="collist_pub")
    assert_refused_everywhere(sk, "a publication whose column list leaves out a column",
                              ["collist", "left_out", "exclude_columns"])

    # The column excluded too: the pipeline follows what the publication carries.
    sk = pipeline(mdb, workdir, "collist", ["collist"], publication="collist_pub", exclude={"collist": ["left_out"]})
    sync(sk)
    assert_synced_without(sk, "collist", ["left_out"])
    mdb.execute("INSERT INTO collist VALUES (21, 21, 'new'); UPDATE collist SET a = -a, left_out = 'y' WHERE id < 4")
    mdb.execute("DELETE FROM collist WHERE id = 10")
    sync(sk)
    assert_synced_without(sk, "collist", ["left_out"])


def test_publication_row_filter_is_refused(mdb: Database, workdir: Path):
    mdb.execute("""
        CREATE TABLE rowfilt (id int PRIMARY KEY, a int);
        INSERT INTO rowfilt SELECT i, i FROM generate_series(1, 20) i;
        CREATE PUBLICATION rowfilt_pub FOR TABLE rowfilt WHERE (a > 10);
    """)
    sk = pipeline(mdb, workdir, "rowfilt", ["rowfilt"], publication="rowfilt_pub")
    assert_refused_everywhere(sk, "a publication with a row filter", ["rowfilt", "row filter"])


def test_table_dropped_from_the_users_publication_stops_naming_resnapshot(mdb: Database, workdir: Path):
    mdb.execute("""
        CREATE TABLE pub_kept (id int PRIMARY KEY, v text);
        CREATE TABLE pub_lost (id int PRIMARY KEY, v text);
        INSERT INTO pub_kept SELECT i, 'a' FROM generate_series(1, 10) i;
        INSERT INTO pub_lost SELECT i, 'a' FROM generate_series(1, 10) i;
        CREATE PUBLICATION users_pub FOR TABLE pub_kept, pub_lost;
    """)
    sk = pipeline(mdb, workdir, "pub_lost", ["pub_kept", "pub_lost"], publication="users_pub")
    sync(sk)
    mdb.execute("ALTER PUBLICATION users_pub DROP TABLE pub_lost")
    mdb.execute("UPDATE pub_lost SET v = 'never streamed' WHERE id < 5")
    mdb.execute("INSERT INTO pub_kept VALUES (11, 'b')")
    for attempt in ("first run", "second run"):
        proc = sk.run("sync", "--pipeline", "app", "--once", check=False)
        assert_no_panic(proc)
        assert proc.returncode != 0, describe_run(proc, f"a synced table left the publication ({attempt})")
        for word in ("pub_lost", "--resnapshot"):
            assert word in proc.stderr, describe_run(proc, f"does not name {word!r} ({attempt})")
    published = {r[0] for r in mdb.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = 'users_pub'")}
    assert published == {"pub_kept"}, f"the user's publication was changed behind their back: {published}"


# --------------------------------------------------------------------------------------------
# Postgres 18: stored generated columns are carried
# --------------------------------------------------------------------------------------------


def test_postgres_18_carries_stored_generated_columns(mdb18: Database, workdir: Path):
    mdb18.execute("""
        CREATE TABLE gen18 (id int PRIMARY KEY, a int, a_doubled int GENERATED ALWAYS AS (a * 2) STORED, note text);
        INSERT INTO gen18 (id, a, note) SELECT i, i, 'n' || i FROM generate_series(1, 30) i;
    """)
    sk = pipeline(mdb18, workdir, "gen18", ["gen18"])
    proc = sk.run("discover", "--pipeline", "app", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "discover refused a stored generated column on Postgres 18")
    sync(sk)
    gencols = mdb18.scalar("SELECT pubgencols::text FROM pg_publication WHERE pubname = 'skippr_gen18_app'")
    assert gencols == "s", f"the publication does not publish stored generated columns (pubgencols {gencols!r})"

    mdb18.execute("INSERT INTO gen18 (id, a, note) VALUES (31, 31, 'new'), (32, -5, NULL)")
    mdb18.execute("UPDATE gen18 SET a = a + 1000 WHERE id <= 10")
    mdb18.execute("UPDATE gen18 SET note = 'note only' WHERE id = 11")  # a_doubled unchanged, still sent
    mdb18.execute("DELETE FROM gen18 WHERE id = 12")
    sync(sk)
    sk.assert_table_matches("gen18")
    for reader in (sk.read_pyiceberg, sk.read_duckdb):
        rows = reader("gen18", ["id"])
        nulls = [r["id"] for r in rows if r["a_doubled"] is None]
        assert nulls == [], f"a_doubled landed as NULL for ids {nulls}"


def test_postgres_18_users_publication_is_not_altered(mdb18: Database, workdir: Path):
    """A publication the user made and named is never changed behind their back: its missing
    `publish_generated_columns` is refused with the SQL to run, and honoured once run."""
    mdb18.execute("""
        CREATE TABLE gen18u (id int PRIMARY KEY, a int, a_doubled int GENERATED ALWAYS AS (a * 2) STORED);
        INSERT INTO gen18u (id, a) SELECT i, i FROM generate_series(1, 20) i;
        CREATE PUBLICATION users_gen_pub FOR TABLE gen18u;
    """)
    sk = pipeline(mdb18, workdir, "gen18u", ["gen18u"], publication="users_gen_pub")
    assert_refused_everywhere(sk, "a user's publication that does not send generated columns",
                              ["a_doubled", "publish_generated_columns = stored", "exclude_columns"])
    gencols = mdb18.scalar("SELECT pubgencols::text FROM pg_publication WHERE pubname = 'users_gen_pub'")
    assert gencols == "n", f"skipprd changed the user's publication (pubgencols {gencols!r})"

    mdb18.execute("ALTER PUBLICATION users_gen_pub SET (publish_generated_columns = stored)")
    sync(sk)
    mdb18.execute("INSERT INTO gen18u (id, a) VALUES (21, 21); UPDATE gen18u SET a = -a WHERE id < 4")
    sync(sk)
    sk.assert_table_matches("gen18u")
    nulls = [r["id"] for r in sk.read_pyiceberg("gen18u", ["id"]) if r["a_doubled"] is None]
    assert nulls == [], f"a_doubled landed as NULL for ids {nulls}"


def test_postgres_18_virtual_generated_column_is_refused(mdb18: Database, workdir: Path):
    mdb18.execute("""
        CREATE TABLE gen18v (id int PRIMARY KEY, a int, a_virtual int GENERATED ALWAYS AS (a * 3) VIRTUAL);
        INSERT INTO gen18v (id, a) SELECT i, i FROM generate_series(1, 10) i;
    """)
    sk = pipeline(mdb18, workdir, "gen18v", ["gen18v"])
    assert_refused_everywhere(sk, "a virtual generated column (never published)",
                              ["gen18v", "a_virtual", "exclude_columns"])
    sk = pipeline(mdb18, workdir, "gen18v", ["gen18v"], exclude={"gen18v": ["a_virtual"]})
    sync(sk)
    mdb18.execute("INSERT INTO gen18v (id, a) VALUES (11, 11); UPDATE gen18v SET a = 0 WHERE id = 1")
    sync(sk)
    assert_synced_without(sk, "gen18v", ["a_virtual"])
