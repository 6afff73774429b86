"""dbt through the gateway: the project in tests/dbt_project (a view, a table, two incremental
models, a seed, a snapshot, generic and singular tests, source freshness, docs) runs against
`skipprd serve` and against the source Postgres, and every model's rows must be equal; then
the source changes (inserts, updates, deletes), the gateway follows, and a second run must pick
the changes up in the incremental models and the snapshot, then a `--full-refresh` run.

The models the gateway builds are Iceberg tables of the warehouse (namespace `dbt_models`):
PyIceberg and DuckDB read them and must see the same rows. Besides dbt, the module checks the
gateway's catalog for what dbt relies on (pg_tables, pg_views, pg_depend, pg_description,
pg_get_viewdef, obj_description, format_type, pg_is_other_temp_schema), that a model's
rebuild inside a transaction is seen whole or not at all by other sessions, that views survive a
restart, and that the replicated tables stay read-only.

dbt (dbt-core < 1.11 and dbt-postgres, tests/requirements-dbt.txt) lives in its own venv, which
tests/run creates: `$SKIPPR_DBT_VENV`, by default ~/.cache/skippr/venv-dbt.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from conftest import REPO, Database, _drop_database, load_iceberg_table, read_duckdb, read_pyiceberg
from test_gateway_clients import Gateway, start_gateway, stop_gateway, wait_until_serving

WORKSPACE = "analytics"
MODELS_SCHEMA = "dbt_models"
PROJECT = REPO / "tests" / "dbt_project"
DBT_VENV = Path(os.environ.get("SKIPPR_DBT_VENV", Path.home() / ".cache" / "skippr" / "venv-dbt"))
#: One dbt command may take this long.
DBT_TIMEOUT_S = 600

#: What the project builds, with the columns its rows are ordered by.
RELATIONS = {
    "stg_orders": ["order_id"],
    "customer_revenue": ["customer_id"],
    "orders_log": ["order_id", "updated_at"],
    "orders_current": ["order_id"],
    "regions": ["region_code"],
    "customers_snapshot": ["id", "dbt_valid_from"],
}

SOURCE = """
CREATE TABLE customers (
    id integer PRIMARY KEY,
    name text NOT NULL,
    region text NOT NULL,
    updated_at timestamp NOT NULL
);
INSERT INTO customers
    SELECT i, 'customer ' || i, (ARRAY['eu', 'na', 'ap', 'sa'])[1 + i % 4],
           timestamp '2024-03-01 08:00:00' + i * interval '37 minutes 1.5 seconds'
    FROM generate_series(1, 20) i;
CREATE TABLE orders (
    id integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers (id),
    status text NOT NULL,
    amount numeric(12,2) NOT NULL,
    ordered_at timestamp NOT NULL,
    updated_at timestamp NOT NULL
);
INSERT INTO orders
    SELECT i, 1 + i % 17, (ARRAY['placed', 'shipped', 'returned', 'cancelled'])[1 + i % 4],
           round((i * 7.31) % 500, 2), timestamp '2024-03-02 00:00:00' + i * interval '1 hour',
           timestamp '2024-03-02 00:00:00' + i * interval '1 hour 0.25 second'
    FROM generate_series(1, 200) i;
"""

CHANGES = """
INSERT INTO customers VALUES (21, 'customer 21', 'eu', timestamp '2024-04-01 09:00:00');
UPDATE customers SET name = name || ' (renamed)', updated_at = timestamp '2024-04-02 10:00:00'
    WHERE id IN (3, 7);
INSERT INTO orders
    SELECT i, 1 + i % 21, 'placed', i * 1.5, timestamp '2024-04-03 00:00:00' + i * interval '1 minute',
           timestamp '2024-04-03 00:00:00' + i * interval '1 minute'
    FROM generate_series(201, 215) i;
UPDATE orders SET status = 'shipped', amount = amount + 1, updated_at = timestamp '2024-04-04 12:00:00'
    WHERE id IN (1, 5, 9, 13, 202);
DELETE FROM orders WHERE id IN (2, 6, 10);
"""


def dbt_bin() -> Path:
    exe = DBT_VENV / "bin" / "dbt"
    if not exe.exists():
        pytest.fail(f"dbt is not installed in {DBT_VENV}: run tests/run (it creates that venv from "
                    "tests/requirements-dbt.txt), or set SKIPPR_DBT_VENV")
    return exe


class Target:
    """Where one copy of the project runs: the gateway or the source Postgres."""

    def __init__(self, name: str, project: Path, env: dict[str, str], source_schema: str,
                 connect: Any) -> None:
        self.name = name
        self.project = project
        self.env = env
        self.source_schema = source_schema
        self.connect = connect

    def dbt(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(dbt_bin()), *args, "--project-dir", str(self.project), "--profiles-dir",
               str(self.project), "--vars", json.dumps({"source_schema": self.source_schema})]
        env = {**os.environ, **self.env, "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
               "DO_NOT_TRACK": "1", "DBT_LOG_PATH": str(self.project / "logs")}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DBT_TIMEOUT_S)
        if check and proc.returncode != 0:
            log = self.project / "logs" / "dbt.log"
            tail = log.read_text(errors="replace")[-6000:] if log.exists() else ""
            pytest.fail(f"`dbt {' '.join(args)}` against {self.name} exited {proc.returncode}\n"
                        f"{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}\n--- dbt.log ---\n{tail}")
        return proc

    def rows(self, relation: str) -> tuple[list[str], list[tuple]]:
        with self.connect() as conn:
            cur = conn.execute(f'SELECT * FROM "{MODELS_SCHEMA}"."{relation}"')
            names = [d.name for d in cur.description]
            rows = [tuple(canon(v) for v in r) for r in cur.fetchall()]
        order = [names.index(c) for c in RELATIONS[relation]]
        rows.sort(key=lambda r: tuple((r[i] is None, r[i]) for i in order) + (repr(r),))
        return names, rows


def canon(value: Any) -> Any:
    """A value as both sides must agree on it: numbers by value, not by their scale."""
    if isinstance(value, float):
        return round(value, 9)
    return value


def assert_models_equal(gateway: Target, postgres: Target, when: str) -> None:
    for relation in RELATIONS:
        g_names, g_rows = gateway.rows(relation)
        p_names, p_rows = postgres.rows(relation)
        assert g_names == p_names, f"{when}: {relation} columns differ: {g_names} vs {p_names}"
        assert len(g_rows) == len(p_rows), f"{when}: {relation}: {len(g_rows)} rows vs {len(p_rows)}"
        for g, p in zip(g_rows, p_rows):
            assert g == p, f"{when}: {relation} differs:\n gateway  {g}\n postgres {p}"


def wait_until_followed(gw: Gateway, source: Database, timeout: float = 120.0) -> None:
    """Waits until the gateway's live tables equal the source's."""
    check = {"customers": "SELECT count(*), max(updated_at), string_agg(name, ',' ORDER BY id) FROM {t}",
             "orders": "SELECT count(*), sum(amount), max(updated_at) FROM {t}"}
    deadline = time.monotonic() + timeout
    while True:
        same = True
        for table, sql in check.items():
            want = source.execute(sql.format(t=table))
            with gw.connect() as conn:
                got = conn.execute(sql.format(t=f"{WORKSPACE}.{table}")).fetchall()
            same &= [tuple(canon(v) for v in r) for r in got] == [tuple(canon(v) for v in r) for r in want]
        if same:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the gateway did not follow the source changes within {timeout}s\n{gw.log()}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def dbt_gw(pg, tmp_path_factory) -> Iterator[tuple[Gateway, Database, Path]]:
    name = "dbt_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        source = Database(pg, name)
        source.execute(SOURCE)
        workdir = tmp_path_factory.mktemp("dbt") / "work"
        workdir.mkdir()
        with start_gateway(source, workdir, ["customers", "orders"], workspace=WORKSPACE) as gw:
            yield gw, source, workdir
    finally:
        _drop_database(pg, name)


def targets(gw: Gateway, source: Database, tmp: Path) -> tuple[Target, Target]:
    def copy(name: str) -> Path:
        dest = tmp / name
        shutil.copytree(PROJECT, dest, ignore=shutil.ignore_patterns("target", "logs"))
        return dest

    gateway = Target("the gateway", copy("gateway"), {
        "DBT_HOST": gw.host, "DBT_PORT": str(gw.port), "DBT_USER": gw.user,
        "DBT_DBNAME": gw.dbname, "DBT_SCHEMA": MODELS_SCHEMA}, WORKSPACE, lambda: gw.connect())
    postgres = Target("Postgres", copy("postgres"), {
        "DBT_HOST": source.host, "DBT_PORT": str(source.port), "DBT_USER": "skippr",
        "DBT_PASSWORD": "skippr", "DBT_DBNAME": source.name, "DBT_SCHEMA": MODELS_SCHEMA},
        "public", lambda: source.connect())
    return gateway, postgres


def test_dbt_project_equals_postgres(dbt_gw, tmp_path):
    gw, source, workdir = dbt_gw
    gateway, postgres = targets(gw, source, tmp_path)
    for t in (gateway, postgres):
        t.dbt("debug")
        t.dbt("seed")
        t.dbt("run")
        t.dbt("snapshot")
        t.dbt("test")
        t.dbt("source", "freshness")
    assert_models_equal(gateway, postgres, "first run")

    # A second run is incremental: it must pick up inserts, updates and deletes.
    source.execute(CHANGES)
    wait_until_followed(gw, source)
    for t in (gateway, postgres):
        t.dbt("run")
        t.dbt("snapshot")
        t.dbt("test")
    assert_models_equal(gateway, postgres, "after the source changed")
    _, log_rows = gateway.rows("orders_log")
    assert any(r[0] == 1 and r[2] == "shipped" for r in log_rows), "the append model missed an update"
    _, current = gateway.rows("orders_current")
    assert any(r[0] == 215 for r in current), "the delete+insert model missed an insert"
    _, snap = gateway.rows("customers_snapshot")
    assert sum(1 for r in snap if r[0] == 3) == 2, "the snapshot missed an update"

    for t in (gateway, postgres):
        t.dbt("run", "--full-refresh")
        t.dbt("seed", "--full-refresh")
    assert_models_equal(gateway, postgres, "after --full-refresh")

    # dbt docs generate: the catalog lists every model with its columns.
    for t in (gateway, postgres):
        t.dbt("docs", "generate")
    catalogs = [json.loads((t.project / "target" / "catalog.json").read_text()) for t in (gateway, postgres)]
    for relation in ("stg_orders", "customer_revenue", "orders_log", "orders_current"):
        key = f"model.skippr_dbt.{relation}"
        columns = [sorted(c["nodes"][key]["columns"]) for c in catalogs]
        assert columns[0] == columns[1], f"docs catalog of {relation}: {columns}"
        assert catalogs[0]["nodes"][key]["metadata"]["type"] == catalogs[1]["nodes"][key]["metadata"]["type"]
    assert catalogs[0]["nodes"]["model.skippr_dbt.customer_revenue"]["metadata"]["comment"] == "Revenue per customer."

    # The models are Iceberg tables that other engines read.
    warehouse = workdir / "warehouse"
    for relation in ("customer_revenue", "orders_current", "customers_snapshot"):
        _, expected = gateway.rows(relation)
        for reader in (read_pyiceberg, read_duckdb):
            got = reader(warehouse, MODELS_SCHEMA, relation, order_by=RELATIONS[relation])
            got = sorted((tuple(canon(v) for v in r.values()) for r in got), key=repr)
            assert got == sorted(expected, key=repr), f"{relation} read by {reader.__name__}"
        # A model keeps no history: a rewrite expires the versions before it.
        assert len(load_iceberg_table(warehouse, MODELS_SCHEMA, relation).snapshots()) == 1


def test_catalog_shows_models_as_postgres_does(dbt_gw):
    gw, _, _ = dbt_gw
    with gw.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS cat_models")
        conn.execute("CREATE TABLE cat_models.t AS SELECT id, name FROM analytics.customers")
        conn.execute("CREATE VIEW cat_models.v AS SELECT id FROM cat_models.t WHERE id > 3")
        conn.execute("COMMENT ON TABLE cat_models.t IS 'the table'")
        conn.execute("COMMENT ON COLUMN cat_models.t.name IS 'a name'")
        one = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
        assert one("SELECT tablename FROM pg_tables WHERE schemaname = 'cat_models'") == [("t",)]
        assert one("SELECT viewname FROM pg_views WHERE schemaname = 'cat_models'") == [("v",)]
        assert one("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE n.nspname = 'cat_models' ORDER BY c.relname") == [("r",), ("v",)]
        assert one("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                   "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE n.nspname = 'cat_models' AND c.relname = 't' AND a.attnum > 0 ORDER BY a.attnum") \
            == [("id", "integer"), ("name", "text")]
        assert one("SELECT column_name FROM information_schema.columns WHERE table_schema = 'cat_models' "
                   "AND table_name = 'v'") == [("id",)]
        assert one("SELECT table_type FROM information_schema.tables WHERE table_schema = 'cat_models' "
                   "ORDER BY table_name") == [("BASE TABLE",), ("VIEW",)]
        assert one("SELECT obj_description('cat_models.t'::regclass, 'pg_class'), "
                   "col_description('cat_models.t'::regclass, 2)") == [("the table", "a name")]
        # As Postgres prints it: columns through their relation, operators in parentheses.
        assert one("SELECT pg_get_viewdef('cat_models.v'::regclass)") \
            == [(" SELECT t.id\n   FROM cat_models.t\n  WHERE (t.id > 3);",)]
        assert one("SELECT pg_is_other_temp_schema(oid) FROM pg_namespace WHERE nspname = 'cat_models'") == [(False,)]
        # dbt's dependency query finds the view -> table edge.
        deps = conn.execute(
            "select distinct dependent_namespace.nspname, dependent_class.relname, "
            "referenced_namespace.nspname, referenced_class.relname "
            "from pg_class as dependent_class "
            "join pg_namespace as dependent_namespace on dependent_namespace.oid = dependent_class.relnamespace "
            "join pg_depend as dependent_depend on dependent_depend.refobjid = dependent_class.oid "
            "and dependent_depend.classid = 'pg_rewrite'::regclass and dependent_depend.refclassid = 'pg_class'::regclass "
            "and dependent_depend.deptype = 'i' "
            "join pg_depend as joining_depend on joining_depend.objid = dependent_depend.objid "
            "and joining_depend.classid = 'pg_rewrite'::regclass and joining_depend.refclassid = 'pg_class'::regclass "
            "and joining_depend.refobjid != dependent_depend.refobjid "
            "join pg_class as referenced_class on referenced_class.oid = joining_depend.refobjid "
            "join pg_namespace as referenced_namespace on referenced_namespace.oid = referenced_class.relnamespace "
            "and referenced_namespace.nspname != 'information_schema' and referenced_namespace.nspname not like 'pg\\_%'"
        ).fetchall()
        assert ("cat_models", "v", "cat_models", "t") in deps, deps
        # A temporary table is the session's own.
        conn.execute("CREATE TEMPORARY TABLE tmp_x AS SELECT 1 AS a")
        assert one("SELECT a FROM tmp_x") == [(1,)]
        temp = one("SELECT c.relpersistence, n.nspname FROM pg_class c JOIN pg_namespace n "
                   "ON n.oid = c.relnamespace WHERE c.relname = 'tmp_x'")
        assert len(temp) == 1 and temp[0][0] == "t" and temp[0][1].startswith("pg_temp_"), temp
        with gw.connect() as other:
            assert other.execute("SELECT count(*) FROM pg_class WHERE relname = 'tmp_x'").fetchone() == (0,)
        conn.execute("DROP SCHEMA cat_models CASCADE")
        assert one("SELECT count(*) FROM pg_namespace WHERE nspname = 'cat_models'") == [(0,)]


def test_a_rebuild_inside_a_transaction_is_seen_whole(dbt_gw):
    """dbt's table materialization: create the new table, rename the old one away, rename the
    new one in, commit, drop the old one. Another session reads the model all along: it must
    see the old rows or the new ones, never no table."""
    gw, _, _ = dbt_gw
    with gw.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS swap_models")
        conn.execute("DROP TABLE IF EXISTS swap_models.m")
        conn.execute("CREATE TABLE swap_models.m AS SELECT 1 AS version, id FROM analytics.customers")
    seen: set[int] = set()
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        with gw.connect() as reader:
            while not stop.is_set():
                try:
                    rows = reader.execute("SELECT DISTINCT version FROM swap_models.m").fetchall()
                    if len(rows) != 1:
                        errors.append(f"mixed versions {rows}")
                    seen.update(r[0] for r in rows)
                except psycopg.Error as e:
                    errors.append(str(e))

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for version in range(2, 6):
            import psycopg2

            conn = psycopg2.connect(**gw.params())
            try:
                cur = conn.cursor()
                cur.execute("BEGIN")  # psycopg2 already began: a warning, as on Postgres
                cur.execute(f"CREATE TABLE swap_models.m__dbt_tmp AS SELECT {version} AS version, id "
                            "FROM analytics.customers")
                cur.execute("ALTER TABLE swap_models.m RENAME TO m__dbt_backup")
                time.sleep(0.3)
                cur.execute("ALTER TABLE swap_models.m__dbt_tmp RENAME TO m")
                conn.commit()
                assert any("already a transaction" in n for n in conn.notices), conn.notices
                cur.execute("DROP TABLE IF EXISTS swap_models.m__dbt_backup CASCADE")
                conn.commit()
            finally:
                conn.close()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors[:5]
    assert 5 in seen
    with gw.connect() as conn:
        assert conn.execute("SELECT DISTINCT version FROM swap_models.m").fetchall() == [(5,)]
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'swap_models'").fetchone() == (1,)


def test_rollback_forgets_and_replicated_tables_stay_read_only(dbt_gw):
    gw, _, _ = dbt_gw
    import psycopg2

    conn = psycopg2.connect(**gw.params())
    try:
        cur = conn.cursor()
        cur.execute("CREATE SCHEMA IF NOT EXISTS rb_models")
        conn.commit()
        cur.execute("CREATE TABLE rb_models.gone AS SELECT 1 AS x")
        cur.execute("SELECT x FROM rb_models.gone")
        assert cur.fetchall() == [(1,)], "a session sees its own uncommitted table"
        with gw.connect() as other:
            assert other.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'gone'").fetchone() == (0,)
        conn.rollback()
        cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'gone'")
        assert cur.fetchone() == (0,)
        conn.rollback()
        for statement in (f"CREATE TABLE {WORKSPACE}.x AS SELECT 1", f"DELETE FROM {WORKSPACE}.orders",
                          f"DROP TABLE {WORKSPACE}.orders", f"ALTER TABLE {WORKSPACE}.orders RENAME TO o2",
                          f"INSERT INTO {WORKSPACE}.orders SELECT * FROM {WORKSPACE}.orders",
                          "CREATE SCHEMA skippr", f"CREATE SCHEMA {WORKSPACE}"):
            with pytest.raises(psycopg2.Error) as err:
                cur.execute(statement)
            assert err.value.pgcode == "25006", f"{statement}: {err.value.pgcode} {err.value}"
            conn.rollback()
    finally:
        conn.close()


def test_views_and_tables_survive_a_restart(dbt_gw):
    gw, _, _ = dbt_gw
    with gw.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS keep_models")
        conn.execute("CREATE OR REPLACE VIEW keep_models.big AS SELECT id FROM analytics.orders WHERE amount > 100")
        conn.execute("DROP TABLE IF EXISTS keep_models.seeded")
        conn.execute("CREATE TABLE keep_models.seeded (id integer NOT NULL, note varchar(20))")
        conn.execute("INSERT INTO keep_models.seeded (id, note) VALUES (1, 'one'), (2, NULL)")
        with pytest.raises(psycopg.Error) as err:
            conn.execute("INSERT INTO keep_models.seeded (note) VALUES ('no id')")
        assert err.value.sqlstate == "23502", err.value
        before = conn.execute("SELECT count(*) FROM keep_models.big").fetchone()
    assert gw.proc is not None and gw.skippr is not None
    stop_gateway(gw.proc)
    gw.proc = gw.skippr.start("serve")
    wait_until_serving(gw)
    with gw.connect() as conn:
        assert conn.execute("SELECT count(*) FROM keep_models.big").fetchone() == before
        assert conn.execute("SELECT id, note FROM keep_models.seeded ORDER BY id").fetchall() == [(1, "one"), (2, None)]
        assert conn.execute(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "WHERE c.relname = 'seeded' AND a.attname = 'note'").fetchall() == [("character varying(20)",)]
    # `skipprd query` reads the models too.
    proc = gw.skippr.run("query", "--format", "csv",
                         "SELECT s.id, s.note, (SELECT count(*) FROM keep_models.big) AS big "
                         "FROM keep_models.seeded s ORDER BY s.id")
    assert proc.stdout.splitlines() == ["id,note,big", f"1,one,{before[0]}", f"2,,{before[0]}"], proc.stdout
