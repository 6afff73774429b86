"""Readers of Skippr's tables behind an Iceberg REST catalog.

Skippr writes a snapshot and a CDC round (inserts, updates, deletes in two tables) with
`skipprd sync --once` into a REST catalog on loopback (tests/rest_catalog.py, OAuth2 client
credentials). Then every reader that only knows the catalog reads what Skippr wrote, row by
row equal to Postgres:

* Spark's REST catalog client (a catalog configured at runtime on the shared session), now
  and, with `VERSION AS OF`, at the snapshot before the CDC round;
* DuckDB's iceberg extension, `ATTACH ... (TYPE iceberg)` through the catalog;
* the gateway of `skipprd serve` over the REST tables, which also sees a further change live
  (serve keeps syncing, and commits it to the catalog);
* time travel (`SET skippr.as_of`, an LSN or an instant) through the gateway: the state
  Postgres had before the CDC round, and after it.

And `skipprd discover` names what is wrong with a REST sink, with the fix: a wrong credential
(401), a wrong warehouse (404), a read-only principal that must create the namespace (403).

One REST server, one Postgres database and one pipeline serve the whole module (the state is
built once by the `lake` fixture); the gateway is one `serve` for its tests.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from conftest import (
    Database,
    PgCluster,
    PgTableSpec,
    Skippr,
    _drop_database,
    assert_no_panic,
    assert_rows_equal,
    describe_run,
    duckdb_rows,
    expected_rows,
    free_port,
    pg_table_spec,
    quote_ident,
)
from rest_catalog import RestCatalogServer

TABLES = ["orders", "customers"]
WORKSPACE = "analytics"
CREDENTIAL = "skippr-client:s3cret"
READ_ONLY_TOKEN = "ro-" + secrets.token_hex(8)
GATEWAY_USER = "analyst"
GATEWAY_PASSWORD = "gw-" + secrets.token_hex(8)


# --------------------------------------------------------------------------------------------
# The module's state: Postgres, the catalog, Skippr's pipeline
# --------------------------------------------------------------------------------------------


def setup_tables(db: Database) -> None:
    """Two tables with the types readers disagree on most: numeric, timestamptz, date, bool,
    text[] and NULLs."""
    db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, tier text, tags text[],"
               " vip boolean)")
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, amount numeric(12,2),"
               " created_at timestamptz NOT NULL, due date, note text)")
    db.execute("INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 3 = 0 THEN 'gold' END,"
               " CASE WHEN g % 4 = 0 THEN ARRAY['t' || g, NULL] WHEN g % 4 = 1 THEN '{}'::text[] END,"
               " CASE WHEN g % 5 <> 0 THEN g % 2 = 0 END FROM generate_series(1, 60) g")
    db.execute("INSERT INTO orders SELECT g, g % 60 + 1, CASE WHEN g % 9 <> 0 THEN g * 1.25 END,"
               " '2026-11-01 00:00:00.000001+00'::timestamptz + g * interval '61 minutes 7.5 seconds',"
               " CASE WHEN g % 7 <> 0 THEN date '2026-12-01' + g END, 'n' || g FROM generate_series(1, 400) g")


def cdc_round(db: Database) -> None:
    """Inserts, updates (to and from NULL, of several columns) and deletes in both tables, in
    one transaction and in several."""
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("INSERT INTO orders SELECT g, g % 60 + 1, g * 0.5, '2026-12-24 18:30:00+05:30',"
                         " NULL, 'late ' || g FROM generate_series(1001, 1040) g")
            conn.execute("UPDATE orders SET amount = NULL, note = note || ' v2' WHERE id % 10 = 3")
            conn.execute("UPDATE customers SET tier = 'silver', tags = ARRAY['moved'] WHERE id <= 8")
        conn.execute("DELETE FROM orders WHERE id % 10 = 0")
        conn.execute("DELETE FROM customers WHERE id IN (59, 60)")
        conn.execute("UPDATE orders SET amount = 1.01, due = date '2027-01-01' WHERE id % 9 = 0")
        conn.execute("INSERT INTO customers VALUES (61, 'newcomer', NULL, NULL, true)")


@dataclass
class Moment:
    """The source as it was once a commit covered it: its LSN and clock, every table's rows
    (as `expected_rows` gives them) and the REST catalog's snapshot id of each table."""

    lsn: str
    at: str
    rows: dict[str, list[dict]]
    snapshot_ids: dict[str, int]


@dataclass
class Lake:
    db: Database
    srv: RestCatalogServer
    skippr: Skippr
    root: Path
    gateway_port: int
    specs: dict[str, PgTableSpec] = field(default_factory=dict)
    moments: dict[str, Moment] = field(default_factory=dict)

    def expected(self, table: str) -> list[dict]:
        return expected_rows(self.db, self.specs[table])

    def record(self) -> Moment:
        lsn, at = self.db.execute("SELECT pg_current_wal_insert_lsn()::text, clock_timestamp()")[0]
        cat = self.srv.client()
        ids = {t: cat.load_table((WORKSPACE, t)).current_snapshot().snapshot_id for t in TABLES}
        return Moment(lsn, at.isoformat(sep=" "), {t: self.expected(t) for t in TABLES}, ids)


def write_rest_config(skippr: Skippr, srv: RestCatalogServer, *, workspace: str = WORKSPACE,
                      query: dict | None = None, metrics_listen: str | None = None,
                      extra_pipeline: dict | None = None, **auth: str) -> None:
    """skippr.yml as conftest writes it, with a RestIceberg sink in place of the local
    warehouse (the same sink block as tests/test_rest_iceberg.py)."""
    text = skippr.write_config(TABLES, workspace=workspace, query=query, metrics_listen=metrics_listen,
                               extra_pipeline=extra_pipeline).read_text()
    head, _, _ = text.partition("data_sinks:\n")
    lines = ["data_sinks:", "  lake:", "    RestIceberg:", f"      uri: {srv.uri}",
             f"      warehouse: {auth.pop('warehouse', srv.warehouse_name)}"]
    lines += [f"      {k}: {v}" for k, v in auth.items()]
    skippr.write_raw_config(head + "\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def lake(pg: PgCluster, tmp_path_factory) -> Iterator[Lake]:
    """The snapshot and one CDC round, written by `sync --once` through the REST catalog."""
    root = tmp_path_factory.mktemp("rest_readers")
    name = "t_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    db = Database(pg, name)
    srv = RestCatalogServer(root / "wh", credential=CREDENTIAL, read_only_token=READ_ONLY_TOKEN)
    try:
        srv.start()
        workdir = root / "work"
        workdir.mkdir()
        skippr = Skippr(db=db, workdir=workdir)
        skippr.env["ANALYST_PASSWORD"] = GATEWAY_PASSWORD
        port = free_port()
        write_rest_config(
            skippr, srv, credential=CREDENTIAL,
            query={"listen": f"127.0.0.1:{port}",
                   "users": [{"name": GATEWAY_USER, "password": "${ANALYST_PASSWORD}"}]},
            metrics_listen=f"127.0.0.1:{free_port()}",
            extra_pipeline={"commit_interval": "1s"})
        lk = Lake(db, srv, skippr, root, port)
        setup_tables(db)
        lk.specs = {t: pg_table_spec(db, t) for t in TABLES}
        skippr.sync_once()
        lk.moments["snapshot"] = lk.record()
        cdc_round(db)
        skippr.sync_once()
        lk.moments["cdc"] = lk.record()
        for t in TABLES:
            assert lk.moments["cdc"].snapshot_ids[t] != lk.moments["snapshot"].snapshot_ids[t], \
                f"the CDC round made no new snapshot of {t}"
            assert lk.moments["cdc"].rows[t] != lk.moments["snapshot"].rows[t], f"the CDC round left {t} as it was"
        # Nothing but the catalog holds the tables: no local warehouse was written.
        assert not skippr.warehouse.exists(), list(skippr.warehouse.iterdir())
        yield lk
    finally:
        srv.stop()
        _drop_database(pg, name)


def assert_reader_matches(lake: Lake, label: str, read) -> None:
    """`read(table)` returns the rows of a table; each equals Postgres now."""
    for t in TABLES:
        assert_rows_equal(lake.expected(t), read(t), lake.specs[t], label)


# --------------------------------------------------------------------------------------------
# 1. Spark's REST catalog client
# --------------------------------------------------------------------------------------------


SPARK_CATALOG = "rest_lake"


def configure_spark_catalog(spark, srv: RestCatalogServer, name: str = SPARK_CATALOG) -> None:
    """An Iceberg REST catalog `name` on the shared session, as a Spark user configures one:
    OAuth2 client credentials against the catalog's token endpoint, vended credentials asked
    for (the server vends none for local paths; the header is what real catalogs need)."""
    conf = {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".type": "rest",
        ".uri": srv.uri,
        ".warehouse": srv.warehouse_name,
        ".rest.auth.type": "oauth2",
        ".credential": CREDENTIAL,
        ".oauth2-server-uri": srv.token_url,
        ".scope": "catalog",
        ".header.X-Iceberg-Access-Delegation": "vended-credentials",
        # a fresh load per read: later tests change the tables
        ".cache-enabled": "false",
    }
    for k, v in conf.items():
        spark.session.conf.set(f"spark.sql.catalog.{name}{k}", v)


def test_spark_rest_catalog_reads_equal_to_postgres(lake: Lake, spark) -> None:
    configure_spark_catalog(spark, lake.srv)
    lake.srv.reset()
    session = spark.session
    assert_reader_matches(lake, "spark-rest", lambda t: spark.rows(
        session.table(f"{SPARK_CATALOG}.{WORKSPACE}.{t}"), lake.specs[t].primary_key))
    # Spark's own types, as the REST catalog's schema gives them.
    types = {f.name: f.dataType.simpleString() for f in session.table(f"{SPARK_CATALOG}.{WORKSPACE}.orders").schema}
    assert types == {"id": "bigint", "customer_id": "int", "amount": "decimal(12,2)", "created_at": "timestamp",
                     "due": "date", "note": "string"}, types
    # The catalog lists the namespace and both tables.
    listed = {r.tableName for r in session.sql(f"SHOW TABLES IN {SPARK_CATALOG}.{WORKSPACE}").collect()}
    assert set(TABLES) <= listed, listed

    # History through the catalog: the snapshot before the CDC round holds the rows Postgres
    # had then.
    before = lake.moments["snapshot"]
    for t in TABLES:
        df = session.sql(f"SELECT * FROM {SPARK_CATALOG}.{WORKSPACE}.{t} VERSION AS OF {before.snapshot_ids[t]}")
        assert_rows_equal(before.rows[t], spark.rows(df, lake.specs[t].primary_key), lake.specs[t],
                          "spark-rest VERSION AS OF")

    # Spark went through the catalog: OAuth2 token, then authorised table loads.
    log = lake.srv.requests()
    assert any(r["path"] == "/v1/oauth/tokens" and r["status"] == 200 for r in log), log
    loads = [r for r in log if r["method"] == "GET" and r["path"].startswith(f"/v1/namespaces/{WORKSPACE}/tables/")]
    assert loads and all(r["status"] == 200 and r["auth_scheme"] == "Bearer" for r in loads), loads
    assert all(r["access_delegation"] == "vended-credentials" for r in loads), loads


# --------------------------------------------------------------------------------------------
# 2. DuckDB's iceberg extension through the catalog
# --------------------------------------------------------------------------------------------


def test_duckdb_attach_reads_equal_to_postgres(lake: Lake) -> None:
    lake.srv.reset()
    con = lake.srv.duckdb("lake")
    try:
        assert_reader_matches(lake, "duckdb-rest", lambda t: duckdb_rows(
            con, f"SELECT * FROM lake.{WORKSPACE}.{t} ORDER BY id"))
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'lake'").fetchall()}
        assert set(TABLES) <= tables, tables
    finally:
        con.close()
    # DuckDB went through the catalog, authorised.
    log = lake.srv.requests()
    loaded = {r["path"].rsplit("/", 1)[1] for r in log if r["method"] == "GET" and r["status"] == 200
              and r["auth_scheme"] == "Bearer" and r["path"].startswith(f"/v1/namespaces/{WORKSPACE}/tables/")}
    assert set(TABLES) <= loaded, log


# --------------------------------------------------------------------------------------------
# 3. and 4. The gateway of `skipprd serve`: live, and as of earlier states
# --------------------------------------------------------------------------------------------


def bg_log(skippr: Skippr) -> str:
    out = []
    for f in ("bg.stdout", "bg.stderr"):
        p = skippr.workdir / f
        if p.exists():
            out.append(f"--- {f} ---\n{p.read_text(errors='replace')[-6000:]}")
    return "\n".join(out)


@dataclass
class Gateway:
    proc: subprocess.Popen
    conn: psycopg.Connection


@pytest.fixture(scope="module")
def gateway(lake: Lake) -> Iterator[Gateway]:
    """`skipprd serve` of the module's pipeline (it syncs on, committing every second), and one
    password-authenticated connection to its gateway."""
    proc = lake.skippr.start("serve")
    conn = None
    try:
        deadline = time.monotonic() + 60
        while conn is None:
            try:
                conn = psycopg.connect(host="127.0.0.1", port=lake.gateway_port, dbname=WORKSPACE,
                                       user=GATEWAY_USER, password=GATEWAY_PASSWORD, autocommit=True)
            except psycopg.OperationalError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    f"the gateway did not start\n{bg_log(lake.skippr)}"
                time.sleep(0.2)
        yield Gateway(proc, conn)
    finally:
        if conn is not None:
            conn.close()
        proc.terminate()
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"serve did not stop within 60s of SIGTERM\n{bg_log(lake.skippr)}")
        assert code == 0, f"serve exited {code}\n{bg_log(lake.skippr)}"


def gateway_rows(conn: psycopg.Connection, table: str) -> list[dict]:
    cur = conn.execute(f"SELECT * FROM {WORKSPACE}.{quote_ident(table)} ORDER BY id")
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def rest_rows(lake: Lake, table: str) -> list[dict]:
    """The table read by PyIceberg's RestCatalog (an independent reader of the catalog)."""
    rows = lake.srv.client().load_table((WORKSPACE, table)).scan().to_arrow().to_pylist()
    rows.sort(key=lambda r: r["id"])
    return rows


def wait_equal(lake: Lake, label: str, read, timeout: float = 30.0) -> None:
    """Polls `read(table)` until every table equals Postgres."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert_reader_matches(lake, label, read)
            return
        except AssertionError as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"{label} did not reach the source state within {timeout}s:\n{e}\n"
                                     f"{bg_log(lake.skippr)}") from None
        time.sleep(0.25)


def test_gateway_answers_rest_tables_and_sees_cdc_live(lake: Lake, gateway: Gateway) -> None:
    conn = gateway.conn
    lake.srv.reset()
    # What sync --once committed, through the gateway.
    assert_reader_matches(lake, "gateway", lambda t: gateway_rows(conn, t))
    # A join over both REST tables agrees with Postgres too.
    join = ("SELECT c.tier, count(*) AS n, sum(o.amount) AS total FROM {s}orders o JOIN {s}customers c"
            " ON c.id = o.customer_id GROUP BY c.tier ORDER BY c.tier NULLS FIRST")
    assert conn.execute(join.format(s=f"{WORKSPACE}.")).fetchall() == lake.db.execute(join.format(s=""))
    # A table unchanged since the last statement is asked for with its ETag: 304, no metadata.
    loads = [r for r in lake.srv.requests() if r["method"] == "GET" and "/tables/" in r["path"]]
    assert 304 in [r["status"] for r in loads], loads

    # A further change while serve runs: seen live, then committed to the REST catalog.
    lake.db.execute("INSERT INTO orders VALUES (5000, 61, 50.00, '2027-01-02 03:04:05+00', NULL, 'live')")
    lake.db.execute("UPDATE customers SET name = 'renamed', vip = NULL WHERE id = 1")
    lake.db.execute("DELETE FROM orders WHERE id = 1")
    wait_equal(lake, "gateway", lambda t: gateway_rows(conn, t))
    assert gateway.proc.poll() is None, bg_log(lake.skippr)
    wait_equal(lake, "pyiceberg-rest after serve's commit", lambda t: rest_rows(lake, t))
    # serve read and wrote through the catalog, with its OAuth2 token.
    log = [r for r in lake.srv.requests() if r["path"].startswith("/v1/") and r["path"] != "/v1/oauth/tokens"]
    assert any(r["method"] == "POST" and r["status"] in (200, 204) and r.get("tables") for r in log), log
    assert all(r["auth_scheme"] == "Bearer" for r in log), [r for r in log if r["auth_scheme"] != "Bearer"]


def test_time_travel_through_the_gateway_answers_earlier_states(lake: Lake, gateway: Gateway) -> None:
    conn = gateway.conn
    try:
        for key in ("snapshot", "cdc"):
            m = lake.moments[key]
            conn.execute(f"SET skippr.as_of = '{m.lsn}'")
            assert conn.execute("SHOW skippr.as_of").fetchone()[0] == m.lsn
            for t in TABLES:
                assert_rows_equal(m.rows[t], gateway_rows(conn, t), lake.specs[t], f"gateway as of {key} LSN {m.lsn}")
            assert conn.execute("SELECT skippr.visible_lsn()").fetchone()[0] == m.lsn
            conn.execute(f"SET skippr.as_of = '{m.at}'")
            for t in TABLES:
                assert_rows_equal(m.rows[t], gateway_rows(conn, t), lake.specs[t], f"gateway as of {key} instant {m.at}")
        # Live again: the state now.
        conn.execute("RESET skippr.as_of")
        assert_reader_matches(lake, "gateway after RESET skippr.as_of", lambda t: gateway_rows(conn, t))
    finally:
        conn.execute("RESET skippr.as_of")


# --------------------------------------------------------------------------------------------
# 5. discover's checks of a REST sink
# --------------------------------------------------------------------------------------------


def discover_with(lake: Lake, folder: str, *, workspace: str = WORKSPACE, **auth: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`skipprd discover --format json` of the module's source with another REST sink (its
    own work folder: the module's pipeline is left as it is)."""
    workdir = lake.root / folder
    workdir.mkdir(exist_ok=True)
    sk = Skippr(db=lake.db, workdir=workdir)
    write_rest_config(sk, lake.srv, workspace=workspace, **auth)
    proc = sk.run("discover", "--pipeline", "app", "--format", "json", check=False, timeout=120)
    assert_no_panic(proc)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(describe_run(proc, f"--format json did not print one JSON document: {e}"))
    return proc, doc


def failed_catalog_check(proc: subprocess.CompletedProcess, doc: dict) -> dict:
    assert proc.returncode == 1, describe_run(proc, "a failed sink check must make discover exit 1")
    # The source's checks pass (a superuser on a wal_level=logical cluster): the one failure
    # is the catalog's.
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert len(failed) == 1, json.dumps(doc["checks"], indent=1)
    return failed[0]


def test_discover_names_a_wrong_credential(lake: Lake) -> None:
    bad_secret = "not-" + secrets.token_hex(6)
    proc, doc = discover_with(lake, "bad-credential", credential=f"skippr-client:{bad_secret}")
    check = failed_catalog_check(proc, doc)
    text = json.dumps(check)
    assert "401" in check["detail"], text
    assert bad_secret not in proc.stdout + proc.stderr, f"the secret was printed: {text}"
    assert "data_sinks.lake.RestIceberg.credential" in (check["fix"] or ""), text


def test_discover_names_a_wrong_warehouse(lake: Lake) -> None:
    proc, doc = discover_with(lake, "bad-warehouse", credential=CREDENTIAL, warehouse="no_such_wh")
    check = failed_catalog_check(proc, doc)
    text = json.dumps(check)
    assert "404" in check["detail"] and "no_such_wh" in check["detail"], text
    assert "data_sinks.lake.RestIceberg.warehouse" in (check["fix"] or ""), text


def test_discover_names_a_read_only_principal(lake: Lake) -> None:
    # The namespace does not exist yet, and this principal may only read.
    proc, doc = discover_with(lake, "read-only", workspace="fresh_ns", token=READ_ONLY_TOKEN)
    reach = [c for c in doc["checks"] if "answers and authorises" in c["name"]]
    assert reach and reach[0]["ok"], json.dumps(doc["checks"], indent=1)
    check = failed_catalog_check(proc, doc)
    text = json.dumps(check)
    assert "fresh_ns" in check["name"], text
    assert "403" in check["detail"], text
    assert "privileges" in (check["fix"] or ""), text
    assert READ_ONLY_TOKEN not in proc.stdout + proc.stderr, "the token was printed"
    # Nothing was created.
    assert ("fresh_ns",) not in lake.srv.client().list_namespaces()
