"""Checks of the suite's own Iceberg REST catalog (tests/rest_catalog.py) with independent
clients, before any test trusts it to judge the `RestIceberg` sink: PyIceberg's `RestCatalog`
(OAuth2 client credentials and static tokens), raw HTTP for what a client library would not
send (stale commits, multi-table transactions with a failing requirement, expired tokens,
malformed bodies), and DuckDB's iceberg extension, which attaches the catalog offline, reads,
and writes through it (its multi-table transaction is one `transactions/commit` request, and
without that endpoint it falls back to one commit per table).

Two servers are shared by the module: `main` (OAuth2 client plus a static token, a path prefix)
and `short` (tokens that live one second, a read-only token, no multi-table commits). The S3
test starts moto's server (tests/test_athena_iceberg.py's `Moto`) and a third catalog whose
warehouse is in it and which vends the S3 credentials.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pytest

from rest_catalog import RestCatalogServer, pyiceberg_client, s3_warehouse_props

CLIENT = "skippr-client:s3cret-Value"
STATIC_TOKEN = "static-token-123"
SHORT_CLIENT = "short-client:short-secret"
SHORT_STATIC = "short-static-token"
READER_TOKEN = "reader-token-456"
PREFIX = "lake1"


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterable[tuple[RestCatalogServer, RestCatalogServer]]:
    base = tmp_path_factory.mktemp("rest-catalog")
    main = RestCatalogServer(base / "main", credential=CLIENT, token=STATIC_TOKEN, prefix=PREFIX,
                             warehouse_name="wh")
    short = RestCatalogServer(base / "short", credential=SHORT_CLIENT, token=SHORT_STATIC,
                              read_only_token=READER_TOKEN, token_ttl=1, transactions=False,
                              warehouse_name="short")
    try:
        # side by side: each spends most of its second importing PyIceberg
        main.start(wait=False)
        short.start(wait=False)
        main.wait_ready()
        short.wait_ready()
        yield main, short
    finally:
        main.stop()
        short.stop()


@pytest.fixture(scope="module")
def main(servers) -> RestCatalogServer:
    return servers[0]


@pytest.fixture(scope="module")
def short(servers) -> RestCatalogServer:
    return servers[1]


def _schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    return Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "amount", LongType(), required=False),
    )


def _region_spec():
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    return PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))


def _rows(ids: list[int], region: str = "eu") -> pa.Table:
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array([region] * len(ids), pa.string()),
        "amount": pa.array([i * 10 for i in ids], pa.int64()),
    })


def _ids(table) -> list[int]:
    return sorted(table.scan().to_arrow().column("id").to_pylist())


def _error(body) -> dict:
    """The ErrorModel's `error` object (fails unless the body has the spec's shape)."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and isinstance(err["type"], str) and isinstance(err["code"], int), err
    return err


# --------------------------------------------------------------------------------------------
# config, prefix, warehouse and authentication
# --------------------------------------------------------------------------------------------


def test_config_advertises_prefix_and_endpoints(main: RestCatalogServer, short: RestCatalogServer) -> None:
    status, cfg = main.http("GET", f"{main.uri}/v1/config?warehouse=wh", token=STATIC_TOKEN)
    assert status == 200, cfg
    assert cfg["overrides"]["prefix"] == PREFIX
    assert "POST /v1/{prefix}/transactions/commit" in cfg["endpoints"]
    assert "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}" in cfg["endpoints"]

    # the warehouse location itself names the warehouse too; anything else is a 404
    location = Path(main.warehouse).resolve().as_uri()
    assert main.http("GET", f"{main.uri}/v1/config?warehouse={location}", token=STATIC_TOKEN)[0] == 200
    status, body = main.http("GET", f"{main.uri}/v1/config?warehouse=other", token=STATIC_TOKEN)
    assert status == 404 and _error(body)["code"] == 404

    # routes live under the prefix only
    status, body = main.http("GET", f"{main.uri}/v1/namespaces", token=STATIC_TOKEN)
    assert status == 404 and _error(body)["code"] == 404
    assert main.http("GET", "namespaces", token=STATIC_TOKEN)[0] == 200

    # --no-transactions: not advertised, and the route is a 404
    status, cfg = short.http("GET", f"{short.uri}/v1/config", token=SHORT_STATIC)
    assert status == 200 and "prefix" not in cfg["overrides"]
    assert not any("transactions" in e for e in cfg["endpoints"])
    status, body = short.http("POST", "transactions/commit", {"table-changes": []}, token=SHORT_STATIC)
    assert status == 404 and _error(body)["code"] == 404


def test_authentication_is_required_and_checked(main: RestCatalogServer) -> None:
    # wrong secret: RFC 6749's error shape
    import urllib.error
    import urllib.parse
    import urllib.request

    cid = CLIENT.split(":")[0]
    data = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": cid,
                                   "client_secret": "wrong", "scope": "catalog"}).encode()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(main.token_url, data=data, method="POST"), timeout=10)
    assert e.value.code == 401
    assert json.loads(e.value.read())["error"] == "invalid_client"

    # a right one: an opaque bearer token with the configured lifetime
    data = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": cid,
                                   "client_secret": CLIENT.split(":", 1)[1], "scope": "catalog"}).encode()
    with urllib.request.urlopen(urllib.request.Request(main.token_url, data=data, method="POST"), timeout=10) as r:
        tok = json.load(r)
    assert tok["token_type"] == "bearer" and tok["expires_in"] == 3600 and tok["access_token"]
    assert main.http("GET", "namespaces", token=tok["access_token"])[0] == 200

    for token in (None, "not-a-token"):
        status, body = main.http("GET", "namespaces", token=token)
        err = _error(body)
        assert status == 401 and err["type"] == "NotAuthorizedException" and err["code"] == 401
    assert main.http("GET", f"{main.uri}/v1/config", token=None)[0] == 401


def test_expired_token_is_refused(short: RestCatalogServer) -> None:
    from pyiceberg.exceptions import UnauthorizedError

    token = short.fetch_token()
    no_refresh = pyiceberg_client(short.uri, token=token, warehouse="short")
    refreshing = short.client()  # OAuth2 client credentials: fetches a new token on a 401
    no_refresh.create_namespace("exp")
    time.sleep(1.5)  # tokens of this server live 1 s

    status, body = short.http("GET", "namespaces", token=token)
    err = _error(body)
    assert status == 401 and err["type"] == "NotAuthorizedException" and "expired" in err["message"]
    with pytest.raises(UnauthorizedError):
        no_refresh.list_namespaces()

    short.reset()
    assert ("exp",) in refreshing.list_namespaces()
    log = [(r["method"], r["path"], r["status"]) for r in short.requests()]
    assert log == [
        ("GET", "/v1/namespaces", 401),
        ("POST", "/v1/oauth/tokens", 200),
        ("GET", "/v1/namespaces", 200),
    ], log


def test_read_only_token_may_not_write(short: RestCatalogServer) -> None:
    assert short.http("GET", "namespaces", token=READER_TOKEN)[0] == 200
    status, body = short.http("POST", "namespaces", {"namespace": ["ro"]}, token=READER_TOKEN)
    err = _error(body)
    assert status == 403 and err["type"] == "ForbiddenException" and err["code"] == 403


# --------------------------------------------------------------------------------------------
# PyIceberg's RestCatalog
# --------------------------------------------------------------------------------------------


def test_pyiceberg_round_trip_with_credential_and_token(main: RestCatalogServer) -> None:
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchNamespaceError, NoSuchTableError

    main.reset()
    cat = main.client()  # credential=
    cat.create_namespace("sales", {"owner": "team"})
    with pytest.raises(NamespaceAlreadyExistsError):
        cat.create_namespace("sales")
    assert ("sales",) in cat.list_namespaces()
    assert cat.load_namespace_properties("sales")["owner"] == "team"
    with pytest.raises(NoSuchNamespaceError):
        cat.load_namespace_properties("nope")

    table = cat.create_table("sales.orders", _schema(), partition_spec=_region_spec())
    assert [f.name for f in table.spec().fields] == ["region"]
    table.append(_rows([1, 2], "eu"))
    table.append(_rows([3], "us"))

    # another client, with the static token, sees the same table and partitions
    reader = pyiceberg_client(main.uri, token=STATIC_TOKEN, warehouse="wh")
    assert ("sales", "orders") in reader.list_tables("sales")
    assert reader.table_exists("sales.orders") and not reader.table_exists("sales.missing")
    loaded = reader.load_table("sales.orders")
    assert _ids(loaded) == [1, 2, 3]
    assert sorted(f.file.partition[0] for f in loaded.scan().plan_files()) == ["eu", "us"]
    assert loaded.scan(row_filter="region == 'us'").to_arrow().column("id").to_pylist() == [3]
    with pytest.raises(NoSuchTableError):
        reader.load_table("sales.missing")

    # every catalog request went under the prefix with a bearer token; no secret was recorded
    log = main.requests()
    served = [r for r in log if r["path"] not in ("/v1/config", "/v1/oauth/tokens")]
    assert served and all(r["path"].startswith(f"/v1/{PREFIX}/") and r["authorized"] for r in served)
    dumped = json.dumps(log) + main.log_path.read_text()
    assert CLIENT.split(":", 1)[1] not in dumped and STATIC_TOKEN not in dumped


def test_stale_commit_gets_409(main: RestCatalogServer) -> None:
    from pyiceberg.exceptions import CommitFailedException

    cat = main.client()
    cat.create_namespace("stale")
    # PyIceberg retries a failed append after a refresh unless told not to
    cat.create_table("stale.t", _schema(), properties={"commit.retry.num-retries": "0"})
    a = cat.load_table("stale.t")
    b = cat.load_table("stale.t")  # same snapshot (none) as `a`
    main.reset()
    a.append(_rows([1]))
    with pytest.raises(CommitFailedException):
        b.append(_rows([2]))
    assert _ids(cat.load_table("stale.t")) == [1]
    commits = [r["status"] for r in main.requests() if r["method"] == "POST" and r["path"].endswith("/stale/tables/t")]
    assert commits == [200, 409]

    # with its retries, the 409 makes it reload the table and append on top of the new snapshot
    cat.create_table("stale.r", _schema())
    a = cat.load_table("stale.r")
    b = cat.load_table("stale.r")
    main.reset()
    a.append(_rows([1]))
    b.append(_rows([2]))
    assert _ids(cat.load_table("stale.r")) == [1, 2]
    log = [(r["method"], r["status"]) for r in main.requests() if r["path"].endswith("/stale/tables/r")]
    assert log[:4] == [("POST", 200), ("POST", 409), ("GET", 200), ("POST", 200)], log


def test_transaction_applies_all_or_nothing(main: RestCatalogServer) -> None:
    cat = main.client()
    cat.create_namespace("tx")
    cat.create_table("tx.a", _schema()).append(_rows([1]))
    cat.create_table("tx.b", _schema())
    a, b = cat.load_table("tx.a"), cat.load_table("tx.b")

    def change(table, requirement: dict, value: str) -> dict:
        ns, name = table.name()
        return {
            "identifier": {"namespace": [ns], "name": name},
            "requirements": [requirement],
            "updates": [{"action": "set-properties", "updates": {"batch": value}}],
        }

    a_ok = {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": a.metadata.current_snapshot_id}
    b_ok = {"type": "assert-table-uuid", "uuid": str(b.metadata.table_uuid)}
    b_stale = {"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}

    main.reset()
    status, body = main.http("POST", "transactions/commit",
                             {"table-changes": [change(a, a_ok, "1"), change(b, b_stale, "1")]}, token=STATIC_TOKEN)
    err = _error(body)
    assert status == 409 and err["type"] == "CommitFailedException", body
    for t, before in ((a, a), (b, b)):
        now = cat.load_table(t.name())
        assert now.metadata_location == before.metadata_location and "batch" not in now.properties

    # both right: one request moves both tables
    status, body = main.http("POST", "transactions/commit",
                             {"table-changes": [change(a, a_ok, "2"), change(b, b_ok, "2")]}, token=STATIC_TOKEN)
    assert status == 204, body
    assert cat.load_table("tx.a").properties["batch"] == "2" and cat.load_table("tx.b").properties["batch"] == "2"
    assert _ids(cat.load_table("tx.a")) == [1]
    log = [r for r in main.requests() if r["method"] == "POST"]
    assert [(r["path"], r["status"], r["tables"]) for r in log] == [
        (f"/v1/{PREFIX}/transactions/commit", 409, ["tx.a", "tx.b"]),
        (f"/v1/{PREFIX}/transactions/commit", 204, ["tx.a", "tx.b"]),
    ]

    # a requirement that held when loaded fails once another commit moved the table
    status, _ = main.http("POST", "transactions/commit",
                          {"table-changes": [change(a, a_ok, "3")]}, token=STATIC_TOKEN)
    assert status == 204
    cat.load_table("tx.a").append(_rows([2]))
    status, body = main.http("POST", "transactions/commit",
                             {"table-changes": [change(b, b_ok, "4"), change(a, a_ok, "4")]}, token=STATIC_TOKEN)
    assert status == 409 and cat.load_table("tx.b").properties["batch"] == "2"


def test_errors_are_error_models(main: RestCatalogServer) -> None:
    from pyiceberg.exceptions import CommitStateUnknownException

    cat = main.client()
    cat.create_namespace("err")
    cat.create_table("err.t", _schema())
    route = "namespaces/err/tables/t"

    cases = [
        ("POST", route, {"requirements": [], "updates": [{"action": "no-such-update"}]}, 400, "BadRequestException"),
        ("POST", "namespaces/err/tables/missing", {"requirements": [], "updates": []}, 404, "NoSuchTableException"),
        ("GET", "namespaces/nope/tables", None, 404, "NoSuchNamespaceException"),
        ("POST", "namespaces", {"namespace": ["err"]}, 409, "AlreadyExistsException"),
        ("POST", "namespaces/err/tables", {"name": "x"}, 400, "BadRequestException"),
        ("DELETE", "namespaces/err", None, 409, "NamespaceNotEmptyException"),
    ]
    for method, r, body, code, type_ in cases:
        status, out = main.http(method, r, body, token=STATIC_TOKEN)
        err = _error(out)
        assert (status, err["code"], err["type"]) == (code, code, type_), (method, r, out)

    # an injected server failure reaches the client as the spec's 5xx (state unknown)
    main.set_faults([{"method": "POST", "path": f"/v1/{PREFIX}/namespaces/err/tables/t", "status": 500}])
    with pytest.raises(CommitStateUnknownException):
        cat.load_table("err.t").append(_rows([1]))
    cat.load_table("err.t").append(_rows([2]))  # the fault was used up
    assert _ids(cat.load_table("err.t")) == [2]

    cat.purge_table("err.t")
    assert not cat.table_exists("err.t")
    cat.drop_namespace("err")


# --------------------------------------------------------------------------------------------
# DuckDB's iceberg extension
# --------------------------------------------------------------------------------------------
# DuckDB 1.5.5 attaches the catalog offline (`ATTACH 'wh' AS c (TYPE iceberg, ENDPOINT ...)`)
# with the extension wheels, provided httpfs is loaded too: the iceberg extension's REST client
# sends its HTTP requests through httpfs, and without it ATTACH tries to auto-install httpfs
# and fails ("Extension httpfs not found"). `duckdb_rest_connect` loads it from its wheel.
# DuckDB then honours `overrides.prefix`, authenticates with OAuth2 client credentials or a
# static token, reads, and writes: an INSERT is a commit, a transaction over two tables is one
# `transactions/commit`, and a catalog that does not advertise that endpoint gets one commit per
# table; CREATE TABLE is a staged create (`stage-create`) finished by a commit with
# `assert-create`.


def test_duckdb_reads_and_writes_through_the_catalog(main: RestCatalogServer) -> None:
    cat = main.client()
    cat.create_namespace("duck")
    cat.create_table("duck.orders", _schema(), partition_spec=_region_spec()).append(_rows([1, 2], "eu"))
    cat.create_table("duck.other", _schema())

    main.reset()
    con = main.duckdb("lake")  # OAuth2 client credentials
    try:
        assert con.execute("SELECT id, region, amount FROM lake.duck.orders ORDER BY id").fetchall() == [
            (1, "eu", 10), (2, "eu", 20)]
        con.execute("INSERT INTO lake.duck.orders VALUES (3, 'us', 30)")
        con.execute("BEGIN")
        con.execute("INSERT INTO lake.duck.orders VALUES (4, 'us', 40)")
        con.execute("INSERT INTO lake.duck.other VALUES (5, 'eu', 50)")
        con.execute("COMMIT")
        con.execute("CREATE TABLE lake.duck.made (k INTEGER, v VARCHAR)")
        con.execute("INSERT INTO lake.duck.made VALUES (1, 'x')")
    finally:
        con.close()

    assert _ids(cat.load_table("duck.orders")) == [1, 2, 3, 4]
    assert _ids(cat.load_table("duck.other")) == [5]
    assert cat.load_table("duck.made").scan().to_arrow().to_pylist() == [{"k": 1, "v": "x"}]

    log = main.requests()
    assert log[0]["path"] == "/v1/oauth/tokens" and log[1]["path"] == "/v1/config"
    assert all(r["path"].startswith(f"/v1/{PREFIX}/") for r in log[2:])
    tx = [sorted(r["tables"]) for r in log if r["path"].endswith("/transactions/commit")]
    assert ["duck.orders", "duck.other"] in tx  # the two-table transaction is one request


def test_duckdb_commits_table_by_table_without_transactions(short: RestCatalogServer) -> None:
    cat = short.client(token=SHORT_STATIC)
    cat.create_namespace("duck")
    for name in ("a", "b"):
        cat.create_table(f"duck.{name}", _schema())

    short.reset()
    con = short.duckdb("s", token=SHORT_STATIC)
    try:
        con.execute("BEGIN")
        con.execute("INSERT INTO s.duck.a VALUES (1, 'eu', 10)")
        con.execute("INSERT INTO s.duck.b VALUES (2, 'eu', 20)")
        con.execute("COMMIT")
    finally:
        con.close()
    assert _ids(cat.load_table("duck.a")) == [1] and _ids(cat.load_table("duck.b")) == [2]
    posts = sorted(r["path"] for r in short.requests() if r["method"] == "POST")
    assert posts == ["/v1/namespaces/duck/tables/a", "/v1/namespaces/duck/tables/b"]


# --------------------------------------------------------------------------------------------
# An S3 warehouse (moto) with vended credentials
# --------------------------------------------------------------------------------------------


def test_s3_warehouse_with_vended_credentials(tmp_path: Path) -> None:
    from test_athena_iceberg import REGION, Moto

    moto = Moto(tmp_path)
    try:
        moto.client("s3").create_bucket(Bucket="lake")
        server_s3, vended = s3_warehouse_props(moto.endpoint, REGION)
        with RestCatalogServer("s3://lake/warehouse", tmp_path / "catalog.db", token=STATIC_TOKEN,
                               catalog_props=server_s3, vend=vended) as srv:
            # the client is given no S3 settings: it writes and reads with what the catalog vends
            cat = srv.client()
            cat.create_namespace("db")
            table = cat.create_table("db.t", _schema(), partition_spec=_region_spec())
            assert table.io.properties["s3.access-key-id"] == "vended-key-id"
            table.append(_rows([1, 2], "eu"))
            assert _ids(cat.load_table("db.t")) == [1, 2]
            keys = moto.keys("lake", "warehouse/db/t/")
            assert any(k.endswith(".parquet") and "region=eu" in k for k in keys), keys
            assert any(k.endswith(".metadata.json") for k in keys), keys

            # without the delegation header nothing is vended
            status, body = srv.http("GET", "namespaces/db/tables/t", token=STATIC_TOKEN)
            assert status == 200 and body["config"] == {} and "storage-credentials" not in body
            status, body = srv.http("GET", "namespaces/db/tables/t", token=STATIC_TOKEN,
                                    headers={"X-Iceberg-Access-Delegation": "vended-credentials"})
            assert body["config"] == vended
            assert body["storage-credentials"] == [{"prefix": "s3://lake/warehouse/db/t", "config": vended}]

            # DuckDB has no S3 secret of its own: it reads with the vended one
            srv.reset()
            con = srv.duckdb("v")
            try:
                assert con.execute("SELECT id FROM v.db.t ORDER BY id").fetchall() == [(1,), (2,)]
                secrets = con.execute("SELECT type, provider, scope, secret_string FROM duckdb_secrets() WHERE type = 's3'").fetchall()
                assert secrets and all(s[1] == "iceberg" and s[2] == ["s3://lake/warehouse/db/t"] for s in secrets), secrets
                assert all("key_id=vended-key-id" in s[3] for s in secrets), secrets
            finally:
                con.close()
            assert all(r["access_delegation"] == "vended-credentials"
                       for r in srv.requests() if r["method"] == "GET" and "/tables/" in r["path"])
    finally:
        moto.stop()
