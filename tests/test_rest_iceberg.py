"""The `RestIceberg` sink: Skippr's tables behind an Iceberg REST catalog.

A REST catalog server on loopback (tests/rest_catalog.py: PyIceberg's SqlCatalog behind the
protocol) takes Skippr's snapshot and CDC commits. Independent clients that only know the
catalog (PyIceberg's RestCatalog, DuckDB's `ATTACH ... (TYPE iceberg)`) read what Skippr wrote,
equal to Postgres, and so does `skipprd query` through the same catalog. The request log shows
how Skippr used the protocol: OAuth2 tokens fetched again when they expire, vended credentials
asked for, a CDC round over several tables committed as one `transactions/commit` (or table by
table when the catalog has no such endpoint), a concurrent writer's commit detected (409) and
retried without overwriting it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import Database, Skippr, assert_no_panic, assert_rows_equal, describe_run, expected_rows, pg_table_spec
from rest_catalog import RestCatalogServer, s3_warehouse_props
from test_cdc import stop

TABLES = ["orders", "customers"]


def setup_tables(db: Database) -> None:
    db.execute("DROP TABLE IF EXISTS orders, customers")
    db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, tier text)")
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, amount numeric(12,2),"
               " created_at timestamptz NOT NULL DEFAULT now(), note text)")
    db.execute("INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 3 = 0 THEN 'gold' END"
               " FROM generate_series(1, 50) g")
    db.execute("INSERT INTO orders SELECT g, g % 50 + 1, g * 1.5, '2026-11-01'::timestamptz + g * interval '1 hour',"
               " 'n' || g FROM generate_series(1, 500) g")


def rest_sink(srv: RestCatalogServer, **auth: str) -> str:
    lines = ["data_sinks:", "  lake:", "    RestIceberg:", f"      uri: {srv.uri}",
             f"      warehouse: {srv.warehouse_name}"]
    lines += [f"      {k}: {v}" for k, v in auth.items()]
    return "\n".join(lines) + "\n"


def write_config(skippr: Skippr, srv: RestCatalogServer, extra_pipeline: dict | None = None, **auth: str) -> None:
    """skippr.yml with the REST sink in place of the local warehouse."""
    text = skippr.write_config(TABLES, extra_pipeline=extra_pipeline).read_text()
    head, _, _ = text.partition("data_sinks:\n")
    skippr.write_raw_config(head + rest_sink(srv, **auth))


def read_rest(srv: RestCatalogServer, table: str, order_by: str = "id") -> list[dict]:
    t = srv.client().load_table(("analytics", table))
    rows = t.scan().to_arrow().sort_by(order_by).to_pylist()
    return rows


def assert_catalog_matches(db: Database, srv: RestCatalogServer, skippr: Skippr) -> None:
    for table in TABLES:
        spec = pg_table_spec(db, table)
        expected = expected_rows(db, spec)
        assert_rows_equal(expected, read_rest(srv, table), spec, "pyiceberg-rest")
        assert_rows_equal(expected, skippr.read_query(spec), spec, "query")


def wait_for(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def commits(srv: RestCatalogServer) -> list[dict]:
    return [r for r in srv.requests() if r["method"] == "POST" and
            (r["path"].endswith("/transactions/commit") or "/tables/" in r["path"])]


@pytest.fixture
def oauth_catalog(tmp_path: Path):
    with RestCatalogServer(tmp_path / "wh", credential="skippr-client:s3cret", token_ttl=4) as srv:
        yield srv


def test_snapshot_and_cdc_through_a_rest_catalog(db: Database, skippr: Skippr, oauth_catalog: RestCatalogServer):
    srv = oauth_catalog
    setup_tables(db)
    write_config(skippr, srv, credential="skippr-client:s3cret",
                 extra_pipeline={"tables": {"orders": {"partition_by": ["day(created_at)"]}},
                                 "maintenance": {"enabled": False}})
    skippr.sync_once()
    assert_catalog_matches(db, srv, skippr)
    orders = srv.client().load_table(("analytics", "orders"))
    assert [f.transform.__class__.__name__ for f in orders.spec().fields] == ["DayTransform"]
    assert len(orders.inspect.partitions()) > 1, "the snapshot wrote one file set per day"
    log = srv.requests()
    assert any(r["path"] == "/v1/oauth/tokens" for r in log), "a token was fetched"
    assert all(r["authorized"] for r in log if r["path"].startswith("/v1/") and r["path"] != "/v1/oauth/tokens")
    loads = [r for r in log if r["method"] == "GET" and "/tables/" in r["path"]]
    assert loads and all(r["access_delegation"] == "vended-credentials" for r in loads)

    # A CDC round over both tables is one catalog request.
    db.execute("UPDATE customers SET tier = 'silver' WHERE id <= 5")
    db.execute("DELETE FROM orders WHERE id % 10 = 0")
    db.execute("INSERT INTO orders (id, customer_id, amount, note) VALUES (1001, 3, 9.99, 'late')")
    srv.reset()
    time.sleep(4.5)  # the first token has expired: the next requests need a new one
    skippr.sync_once()
    rounds = commits(srv)
    assert [r["path"] for r in rounds] == ["/v1/transactions/commit"], rounds
    assert sorted(rounds[0].get("tables") or []) == ["analytics.customers", "analytics.orders"], rounds
    assert any(r["path"] == "/v1/oauth/tokens" for r in srv.requests()), "the expired token was replaced"
    assert not [r for r in srv.requests() if r["status"] == 401 and r["path"] != "/v1/oauth/tokens"], \
        "tokens are renewed before they expire, not after a refusal"
    assert_catalog_matches(db, srv, skippr)

    # A column added in Postgres reaches the catalog's table (a schema change with its
    # requirements), and so do the rows that fill it.
    db.execute("ALTER TABLE customers ADD COLUMN region text")
    db.execute("UPDATE customers SET region = 'eu' WHERE id % 2 = 0")
    skippr.sync_once()
    assert "region" in [f.name for f in srv.client().load_table(("analytics", "customers")).schema().fields]
    assert_catalog_matches(db, srv, skippr)


def test_table_by_table_a_concurrent_writer_and_a_lost_answer(db: Database, skippr: Skippr, tmp_path: Path):
    """A catalog without `transactions/commit`, under a prefix, with a bearer token."""
    with RestCatalogServer(tmp_path / "wh", token="static-token", prefix="catalogs/wh", transactions=False) as srv:
        setup_tables(db)
        write_config(skippr, srv, token="static-token")
        skippr.sync_once()
        assert_catalog_matches(db, srv, skippr)
        assert all(r["auth_scheme"] == "Bearer" for r in srv.requests() if r["path"].startswith("/v1/"))

        # Table by table, under the prefix.
        db.execute("UPDATE customers SET name = name || '!' WHERE id % 7 = 0")
        db.execute("INSERT INTO orders (id, customer_id, amount) VALUES (2001, 1, 1.00)")
        srv.reset()
        skippr.sync_once()
        paths = sorted(r["path"] for r in commits(srv))
        assert paths == ["/v1/catalogs/wh/namespaces/analytics/tables/customers",
                         "/v1/catalogs/wh/namespaces/analytics/tables/orders"], paths
        assert_catalog_matches(db, srv, skippr)

        # Another writer commits between two of Skippr's commits: Skippr's commit is refused
        # (409), re-read and retried; the other writer's row stays.
        write_config(skippr, srv, extra_pipeline={"commit_interval": "300ms"}, token="static-token")
        proc = skippr.start("sync", "--pipeline", "app")
        try:
            db.execute("UPDATE customers SET tier = 'bronze' WHERE id = 1")
            wait_for(lambda: any(r["id"] == 1 and r["tier"] == "bronze" for r in read_rest(srv, "customers")))
            other = srv.client().load_table(("analytics", "customers"))
            foreign = other.scan(limit=1).to_arrow().slice(0, 1).to_pylist()[0]
            foreign["id"] = 9999
            foreign["name"] = "written by another engine"
            other.append(pa.Table.from_pylist([foreign], schema=other.schema().as_arrow()))
            srv.reset()
            db.execute("UPDATE customers SET tier = 'bronze' WHERE id = 2")
            wait_for(lambda: any(r["id"] == 2 and r["tier"] == "bronze" for r in read_rest(srv, "customers")))
        finally:
            assert stop(proc) == 0, (skippr.workdir / "bg.stderr").read_text()[-4000:]
        statuses = [r["status"] for r in commits(srv) if r["path"].endswith("/customers")]
        assert 409 in statuses and statuses[-1] == 200, statuses
        spec = pg_table_spec(db, "customers")
        rows = [r for r in read_rest(srv, "customers") if r["id"] != 9999]
        assert_rows_equal(expected_rows(db, spec), rows, spec, "pyiceberg-rest")
        assert [r["name"] for r in read_rest(srv, "customers") if r["id"] == 9999] == ["written by another engine"]
        srv.client().load_table(("analytics", "customers")).delete("id = 9999")

        # The catalog makes a commit and its answer is lost: the retry finds the committed LSN
        # in the table and applies nothing twice.
        db.execute("INSERT INTO orders (id, customer_id, amount) VALUES (2002, 2, 2.00), (2003, 3, 3.00)")
        db.execute("DELETE FROM orders WHERE id = 1")
        srv.reset()
        srv.set_faults([{"method": "POST", "path": r".*/tables/orders", "status": 503, "after": True}])
        skippr.sync_once()
        orders = [r for r in commits(srv) if r["path"].endswith("/orders")]
        assert orders and orders[0]["status"] == 503, orders
        assert_catalog_matches(db, srv, skippr)


def test_sigv4_signs_every_catalog_request(db: Database, skippr: Skippr, tmp_path: Path):
    """`sigv4` signs with the AWS chain (the endpoints of S3 Tables and Glue)."""
    with RestCatalogServer(tmp_path / "wh") as srv:
        setup_tables(db)
        write_config(skippr, srv)
        text = skippr.config_path.read_text() + "      sigv4: {region: eu-west-1, service: s3tables}\n"
        skippr.write_raw_config(text)
        skippr.env.update({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
                           "AWS_REGION": "eu-west-1"})
        proc = skippr.run("sync", "--pipeline", "app", "--once", check=False)
        assert_no_panic(proc)
        assert proc.returncode == 0, describe_run(proc)
        schemes = {r["auth_scheme"] for r in srv.requests() if r["path"].startswith("/v1/")}
        assert schemes == {"AWS4-HMAC-SHA256"}, schemes
        assert_catalog_matches(db, srv, skippr)


def test_s3_storage_through_vended_credentials(db: Database, skippr: Skippr, tmp_path: Path):
    """The catalog names an S3 warehouse and vends the keys to it: Skippr writes and reads the
    tables with those keys alone (no AWS settings of its own)."""
    from test_athena_iceberg import REGION, Moto

    moto = Moto(tmp_path)
    try:
        moto.client("s3").create_bucket(Bucket="lake")
        server_s3, vended = s3_warehouse_props(moto.endpoint, REGION)
        with RestCatalogServer("s3://lake/warehouse", tmp_path / "catalog.db", credential="c:s",
                               catalog_props=server_s3, vend=vended) as srv:
            setup_tables(db)
            write_config(skippr, srv, credential="c:s")
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
                skippr.env[k] = ""
            skippr.sync_once()
            db.execute("DELETE FROM orders WHERE id <= 100")
            db.execute("UPDATE customers SET tier = 'x' WHERE id > 40")
            proc = skippr.sync_once()
            assert "maintenance failed" not in proc.stderr, proc.stderr[-3000:]
            keys = moto.keys("lake", "warehouse/analytics/orders/data/")
            assert keys, "the data files are in the catalog's S3 warehouse"
            assert_catalog_matches(db, srv, skippr)
    finally:
        moto.stop()
