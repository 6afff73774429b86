"""The Python package `skippr` (python/, installed into the venv by tests/run): the issue's
snippet writes exactly the canonical bytes, which are also what the three `skipprd connect`
commands write; load/save round trips are stable; every bad input raises ConfigError naming
the field (and the file and line when it comes from a file); written files pass
`skipprd validate`; the package type-checks with `mypy --strict` for Python 3.9."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

import skippr
from skippr import (
    Config,
    ConfigError,
    DataSinkAthenaIceberg,
    DataSinkGlueRestIceberg,
    DataSinkLocalIceberg,
    DataSinkRestIceberg,
    DataSinkRestIcebergSigv4,
    DataSinkS3TablesIceberg,
    DataSourcePostgres,
    DataSourcePostgresSourceCdcMode,
    DataSourcePostgresSourceSslMode,
    EnvRef,
    LocalStorage,
    MaintenanceSettings,
    MetricsSettings,
    Pipeline,
    PipelineTable,
    QuerySettings,
    QueryTls,
    QueryUser,
    S3Storage,
)

from conftest import REPO, skipprd_bin

SNIPPET = """\
from skippr import (Config, DataSinkAthenaIceberg, DataSourcePostgres, DataSourcePostgresSourceCdcMode, EnvRef, LocalStorage, Pipeline)
cfg = Config().workspace("analytics").storage(LocalStorage())
app_db = cfg.data_source("app_db", DataSourcePostgres(host="db.internal", user="skippr_reader", password=EnvRef("APP_DB_PASSWORD"), database="app", tables=["orders", "customers"], cdc_mode=DataSourcePostgresSourceCdcMode.SNAPSHOTTHENCDC))
lake = cfg.data_sink("lake", DataSinkAthenaIceberg(warehouse="s3://my-iceberg-warehouse/", glue_database_name="analytics", athena_workgroup_name="primary", athena_results_s3_bucket="my-athena-results", region="us-east-1"), schema_sink="lake_schema")
cfg.pipeline("orders", Pipeline(data_source=app_db, data_sink=lake))
cfg.save("skippr.yml")
"""

EXPECTED = """\
skippr:
  workspace: analytics
  skipprd_el_storage_mode: local

pipelines:
  orders:
    data_source: data_sources.app_db
    data_sink: data_sinks.lake

data_sources:
  app_db:
    Postgres:
      host: db.internal
      user: skippr_reader
      password: ${APP_DB_PASSWORD}
      database: app
      tables: [orders, customers]
      cdc_mode: snapshot_then_cdc

data_sinks:
  lake:
    AthenaIceberg:
      warehouse: s3://my-iceberg-warehouse/
      glue_database_name: analytics
      athena_workgroup_name: primary
      athena_results_s3_bucket: my-athena-results
      region: us-east-1
    schema_sink: schema_sinks.lake_schema

schema_sinks:
  lake_schema:
    AthenaIceberg:
      warehouse: s3://my-iceberg-warehouse/
      glue_database_name: analytics
      athena_workgroup_name: primary
      athena_results_s3_bucket: my-athena-results
      region: us-east-1
""".encode()

CONNECT_COMMANDS = [
    [
        "--workspace", "analytics", "--storage-mode", "local",
        "connect", "data-source", "postgres", "--pipeline", "orders", "--name", "app_db",
        "--host", "db.internal", "--user", "skippr_reader", "--password", "${APP_DB_PASSWORD}",
        "--database", "app", "--tables", "orders", "--tables", "customers",
        "--cdc-mode", "snapshot_then_cdc",
    ],
    [
        "connect", "data-sink", "athenaiceberg", "--pipeline", "orders", "--name", "lake",
        "--warehouse", "s3://my-iceberg-warehouse/", "--glue-database-name", "analytics",
        "--athena-workgroup-name", "primary", "--athena-results-s3-bucket", "my-athena-results",
        "--region", "us-east-1",
    ],
    ["connect", "schema-sink", "athenaiceberg", "--pipeline", "orders", "--name", "lake_schema"],
]


def snippet_config() -> Config:
    """The issue's snippet run in-process, minus the save."""
    cfg = Config().workspace("analytics").storage(LocalStorage())
    app_db = cfg.data_source("app_db", DataSourcePostgres(host="db.internal", user="skippr_reader", password=EnvRef("APP_DB_PASSWORD"), database="app", tables=["orders", "customers"], cdc_mode=DataSourcePostgresSourceCdcMode.SNAPSHOTTHENCDC))
    lake = cfg.data_sink("lake", DataSinkAthenaIceberg(warehouse="s3://my-iceberg-warehouse/", glue_database_name="analytics", athena_workgroup_name="primary", athena_results_s3_bucket="my-athena-results", region="us-east-1"), schema_sink="lake_schema")
    cfg.pipeline("orders", Pipeline(data_source=app_db, data_sink=lake))
    return cfg


def full_config() -> Config:
    """Every optional setting, a LocalIceberg sink and an explicitly defined schema sink."""
    cfg = Config().workspace("shop").storage(LocalStorage(path="./state"))
    src = cfg.data_source(
        "app_db",
        DataSourcePostgres(
            host="127.0.0.1", port=5433, user="reader", password="it's ${SECRET}", database="app",
            sslmode=DataSourcePostgresSourceSslMode.VERIFYFULL, sslrootcert="./ca.pem",
            tables=["orders", "sales.refunds", "events"],
            cdc_mode=DataSourcePostgresSourceCdcMode.CDCONLY, publication="pub_shop",
            slot="slot_shop", append_only=["events"], snapshot_parallelism=8,
            parquet_target_file_size_mb=256, heartbeat_interval="30s", max_retained_wal="512MB",
            failover_slot=True,
        ),
    )
    schema = cfg.schema_sink("catalog", DataSinkLocalIceberg(warehouse="./warehouse"))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./warehouse"), schema_sink=schema)
    cfg.pipeline(
        "shop_pipe",
        Pipeline(data_source=src, data_sink=lake, commit_interval="500ms", transaction_memory_budget_mb=64,
                 key_index_memory_budget_mb=128),
    )
    return cfg


FULL_EXPECTED = """\
skippr:
  workspace: shop
  skipprd_el_storage_mode: local
  skipprd_el_storage_path: ./state

pipelines:
  shop_pipe:
    data_source: data_sources.app_db
    data_sink: data_sinks.lake
    commit_interval: 500ms
    transaction_memory_budget_mb: 64
    key_index_memory_budget_mb: 128

data_sources:
  app_db:
    Postgres:
      host: 127.0.0.1
      port: 5433
      user: reader
      password: 'it''s ${SECRET}'
      database: app
      sslmode: verify-full
      sslrootcert: ./ca.pem
      tables: [orders, sales.refunds, events]
      cdc_mode: cdc_only
      publication: pub_shop
      slot: slot_shop
      append_only: [events]
      snapshot_parallelism: 8
      parquet_target_file_size_mb: 256
      heartbeat_interval: 30s
      max_retained_wal: 512MB
      failover_slot: true

data_sinks:
  lake:
    LocalIceberg:
      warehouse: ./warehouse
    schema_sink: schema_sinks.catalog

schema_sinks:
  catalog:
    LocalIceberg:
      warehouse: ./warehouse
"""


def run_binary(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    child_env = dict(os.environ)
    child_env.pop("APP_DB_PASSWORD", None)
    child_env.update(env or {})
    return subprocess.run(
        [str(skipprd_bin()), *args], cwd=cwd, env=child_env, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"`{' '.join(map(str, proc.args))}` exited {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


# --------------------------------------------------------------------------------------------
# The three forms agree
# --------------------------------------------------------------------------------------------


def test_issue_snippet_runs_verbatim_and_writes_the_canonical_bytes(tmp_path: Path) -> None:
    (tmp_path / "snippet.py").write_text(SNIPPET)
    proc = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "APP_DB_PASSWORD": "must-not-appear"},
    )
    assert proc.returncode == 0, describe(proc)
    written = (tmp_path / "skippr.yml").read_bytes()
    assert written == EXPECTED, f"got:\n{written.decode()}"
    assert b"must-not-appear" not in written


def test_snippet_and_yaml_are_the_same_configuration(tmp_path: Path) -> None:
    path = tmp_path / "skippr.yml"
    path.write_bytes(EXPECTED)
    assert Config.load(path) == snippet_config()
    assert snippet_config().to_yaml().encode() == EXPECTED


def test_connect_commands_write_the_same_bytes_as_python(tmp_path: Path) -> None:
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    for args in CONNECT_COMMANDS:
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    written = config.read_bytes()
    assert Config.load(config) == snippet_config()
    assert written == EXPECTED, f"skipprd connect wrote:\n{written.decode()}"


FULL_CONNECT_COMMANDS = [
    [
        "--workspace", "shop", "connect", "data-source", "postgres", "--pipeline", "shop_pipe",
        "--name", "app_db", "--host", "127.0.0.1", "--port", "5433", "--user", "reader",
        "--password", "it's ${SECRET}", "--database", "app", "--sslmode", "verify-full",
        "--sslrootcert", "./ca.pem", "--tables", "orders",
        "--tables", "sales.refunds", "--tables", "events", "--cdc-mode", "cdc_only",
        "--publication", "pub_shop", "--slot", "slot_shop", "--append-only", "events",
        "--snapshot-parallelism", "8", "--parquet-target-file-size-mb", "256",
        "--heartbeat-interval", "30s", "--max-retained-wal", "512MB", "--failover-slot",
    ],
    ["connect", "data-sink", "localiceberg", "--pipeline", "shop_pipe", "--name", "lake", "--warehouse", "./warehouse"],
    ["connect", "schema-sink", "localiceberg", "--pipeline", "shop_pipe", "--name", "catalog"],
]


def test_connect_commands_with_every_flag_match_python(tmp_path: Path) -> None:
    """Every Postgres flag, a LocalIceberg sink and its schema sink; the settings that
    `connect` has no flag for (storage path, commit_interval) are left out of both."""
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    for args in FULL_CONNECT_COMMANDS:
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    cfg = Config().workspace("shop")
    src = cfg.data_source("app_db", full_config().data_sources["app_db"])
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./warehouse"), schema_sink="catalog")
    cfg.pipeline("shop_pipe", Pipeline(data_source=src, data_sink=lake))
    assert config.read_text() == cfg.to_yaml()


@pytest.mark.parametrize("value", ["0x1F", "0o17", ".inf", "-.Inf", ".NaN", "42", "1e3", "yes", "a b", "it's", "x:"])
def test_connect_quotes_what_yaml_would_not_read_back_as_a_string(tmp_path: Path, value: str) -> None:
    """A string that YAML reads as a number, boolean or null is quoted by both writers, so
    the written file reads back (and validates) with the same string."""
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    proc = run_binary(
        ["--config", str(config), "--workspace", "w", "connect", "data-source", "postgres",
         "--pipeline", "p", "--name", "db", "--host", "h", "--user", value, "--database", "d",
         "--tables", "t"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, describe(proc)
    cfg = Config().workspace("w")
    cfg.data_source("db", DataSourcePostgres(host="h", user=value, database="d", tables=["t"]))
    python_text = cfg.to_yaml()
    assert Config.from_yaml(python_text).data_sources["db"].user == value
    rust_text = config.read_text()
    # `connect data-source` also writes the half-made pipeline; compare the setting's line
    rust_line = [line for line in rust_text.splitlines() if line.startswith("      user:")]
    python_line = [line for line in python_text.splitlines() if line.startswith("      user:")]
    assert rust_line == python_line, f"skipprd connect wrote:\n{rust_text}\nPython wrote:\n{python_text}"


S3_EXPECTED = """\
skippr:
  workspace: analytics
  skipprd_el_storage_mode: s3
  skipprd_el_storage_path: s3://my-state-bucket/skippr/state
"""


def test_s3_storage_writes_the_same_bytes_as_connect_and_validates(tmp_path: Path) -> None:
    """`S3Storage(...)` and `--storage-mode s3 --storage-path ...` write the same file, which
    loads back as S3Storage and passes `skipprd validate`."""
    cfg = snippet_config().storage(S3Storage(path="s3://my-state-bucket/skippr/state"))
    text = cfg.to_yaml()
    assert text.startswith(S3_EXPECTED), text
    assert Config.from_yaml(text).get_storage() == S3Storage("s3://my-state-bucket/skippr/state")
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    first = ["--storage-path", "s3://my-state-bucket/skippr/state", *CONNECT_COMMANDS[0]]
    first[first.index("local")] = "s3"
    for args in [first, *CONNECT_COMMANDS[1:]]:
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path, env={"APP_DB_PASSWORD": "x"})
    assert proc.returncode == 0, describe(proc)


@pytest.mark.parametrize("args, message", [
    (["--storage-mode", "s3"], "--storage-mode s3 needs --storage-path s3://bucket/prefix"),
    (["--storage-mode", "s3", "--storage-path", "/var/skippr"], "is not an S3 location"),
    (["--storage-path", "s3://b1b/x"], "add --storage-mode s3"),
])
def test_connect_refuses_inconsistent_storage_flags(tmp_path: Path, args: list[str], message: str) -> None:
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    proc = run_binary(["--config", str(config), "--workspace", "w", *args, *CONNECT_COMMANDS[0][4:]], cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert message in proc.stderr, describe(proc)
    assert not config.exists()


def test_written_files_pass_skipprd_validate(tmp_path: Path) -> None:
    paths = []
    for name, cfg in (("issue.yml", snippet_config()), ("full.yml", full_config())):
        cfg.save(tmp_path / name)
        paths.append(tmp_path / name)
    # verify-full's sslrootcert must exist for validate to pass.
    (tmp_path / "ca.pem").write_text("")
    assert (tmp_path / "full.yml").read_text() == FULL_EXPECTED
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}: the files were written but not validated")
    for path in paths:
        proc = run_binary(
            ["--config", str(path), "validate"], cwd=tmp_path,
            env={"APP_DB_PASSWORD": "x", "SECRET": "y"},
        )
        assert proc.returncode == 0, describe(proc)


# --------------------------------------------------------------------------------------------
# load and save
# --------------------------------------------------------------------------------------------


def test_load_then_save_reproduces_the_canonical_example(tmp_path: Path) -> None:
    src = tmp_path / "in.yml"
    src.write_bytes(EXPECTED)
    out = tmp_path / "out.yml"
    Config.load(src).save(out)
    assert out.read_bytes() == EXPECTED
    Config.load(out).save(out)
    assert out.read_bytes() == EXPECTED


ROUND_TRIP_INPUTS = {
    "flow style, keys in another order": """\
{data_sinks: {lake: {schema_sink: schema_sinks.lake_schema, AthenaIceberg: {region: us-east-1,
  warehouse: 's3://my-iceberg-warehouse/', athena_results_s3_bucket: my-athena-results,
  athena_workgroup_name: primary, glue_database_name: analytics}}},
 schema_sinks: {lake_schema: {AthenaIceberg: {region: us-east-1, glue_database_name: analytics,
  warehouse: "s3://my-iceberg-warehouse/", athena_workgroup_name: primary,
  athena_results_s3_bucket: my-athena-results}}},
 data_sources: {app_db: {Postgres: {cdc_mode: snapshot_then_cdc, tables: [orders, customers],
  database: app, password: '${APP_DB_PASSWORD}', user: skippr_reader, host: db.internal}}},
 pipelines: {orders: {data_sink: data_sinks.lake, data_source: data_sources.app_db}},
 skippr: {skipprd_el_storage_mode: local, workspace: analytics}}
""",
    "block style with comments, document marker, block lists": """\
---
# the pipeline
skippr:
    workspace: "analytics"        # quoted
data_sources:
    app_db:
        Postgres:
            host: db.internal
            user: skippr_reader
            password: "${APP_DB_PASSWORD}"
            database: app
            tables:
              - orders
              - customers
            cdc_mode: snapshot_then_cdc
data_sinks:
    lake:
        schema_sink: schema_sinks.lake_schema
        AthenaIceberg:
            warehouse: s3://my-iceberg-warehouse/
            glue_database_name: analytics
            athena_workgroup_name: primary
            athena_results_s3_bucket: my-athena-results
            region: us-east-1
schema_sinks:
    lake_schema:
        AthenaIceberg: {warehouse: s3://my-iceberg-warehouse/, glue_database_name: analytics, athena_workgroup_name: primary, athena_results_s3_bucket: my-athena-results, region: us-east-1}
pipelines:
    orders: {data_source: data_sources.app_db, data_sink: data_sinks.lake}
""",
    "every optional setting": FULL_EXPECTED,
    "strings that need quotes, YAML 1.2 scalars, env references": """\
skippr:
  workspace: w
  skipprd_el_storage_path: "state dir"
pipelines:
  p: {data_source: data_sources.app-db, data_sink: data_sinks.lake, commit_interval: 1m}
data_sources:
  app-db:
    Postgres:
      host: "${PGHOST:-localhost}"
      port: 0x1538
      user: yes
      password: "p@ss: #1, 'quoted' \\u00e9"
      database: "5432"
      tables: ["${TABLE}", s.t$x, "éclair"]
      slot: ${SLOT}
      append_only: []
data_sinks:
  lake:
    LocalIceberg: {warehouse: "true"}
""",
    "no pipelines, sinks only": """\
skippr: {workspace: w}
data_sinks: {a: {LocalIceberg: {warehouse: ./a}}, b: {LocalIceberg: {warehouse: ./b}}}
""",
}


@pytest.mark.parametrize("text", ROUND_TRIP_INPUTS.values(), ids=list(ROUND_TRIP_INPUTS))
def test_load_save_round_trips_are_stable(tmp_path: Path, text: str) -> None:
    path = tmp_path / "skippr.yml"
    path.write_text(text, encoding="utf-8")
    first = Config.load(path)
    first.save(path)
    once = path.read_bytes()
    second = Config.load(path)
    assert second == first
    second.save(path)
    assert path.read_bytes() == once
    # the canonical text reads back to the same values with a generic YAML reader too
    assert yaml.safe_load(once.decode()) == yaml.safe_load(first.to_yaml())
    assert once.endswith(b"\n") and not once.endswith(b"\n\n") and b"\n\n\n" not in once


def test_quoting_reads_back_the_same_strings(tmp_path: Path) -> None:
    text = ROUND_TRIP_INPUTS["strings that need quotes, YAML 1.2 scalars, env references"]
    cfg = Config.from_yaml(text)
    out = cfg.to_yaml()
    assert "  skipprd_el_storage_path: 'state dir'\n" in out
    assert "      host: ${PGHOST:-localhost}\n" in out
    assert "      port: 5432\n" in out
    assert "      user: 'yes'\n" in out
    assert "      password: 'p@ss: #1, ''quoted'' é'\n" in out
    assert "      database: '5432'\n" in out
    assert "      tables: ['${TABLE}', s.t$x, 'éclair']\n" in out
    assert "      slot: ${SLOT}\n" in out
    assert "append_only" not in out
    assert "      warehouse: 'true'\n" in out
    src = cfg.data_sources["app-db"]
    assert src.user == "yes" and src.database == "5432" and src.port == 5432
    assert src.slot == EnvRef("SLOT") and src.host == "${PGHOST:-localhost}"
    loaded = yaml.safe_load(out)["data_sources"]["app-db"]["Postgres"]
    assert loaded["password"] == "p@ss: #1, 'quoted' é"
    assert loaded["tables"] == ["${TABLE}", "s.t$x", "éclair"]


@pytest.mark.parametrize(
    "value, written",
    [
        ("db.internal", "db.internal"),
        ("s3://my-iceberg-warehouse/", "s3://my-iceberg-warehouse/"),
        ("${APP_DB_PASSWORD}", "${APP_DB_PASSWORD}"),
        ("user@host+x-1", "user@host+x-1"),
        ("", "''"),
        ("a b", "'a b'"),
        ("it's", "'it''s'"),
        ("ends:", "'ends:'"),
        ("True", "'True'"),
        ("off", "'off'"),
        ("NULL", "'NULL'"),
        ("~", "'~'"),
        ("42", "'42'"),
        ("-1.5e3", "'-1.5e3'"),
        ("inf", "'inf'"),
        ("0x1F", "'0x1F'"),
        (".inf", "'.inf'"),
        ("-dash", "'-dash'"),
        ("#hash", "'#hash'"),
        ("*star", "'*star'"),
        ("a,b", "'a,b'"),
    ],
)
def test_scalar_style(value: str, written: str) -> None:
    cfg = Config().workspace("w")
    cfg.data_sink("s", DataSinkLocalIceberg(warehouse="w"))
    src = DataSourcePostgres(host="h", user="u", database="d", tables=["t"], password=value)
    cfg.data_source("d", src)
    out = cfg.to_yaml()
    assert f"      password: {written}\n" in out, out
    assert str(Config.from_yaml(out).data_sources["d"].password) == value
    assert yaml.safe_load(out)["data_sources"]["d"]["Postgres"]["password"] == value


def test_env_ref_is_written_literally_and_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_DB_PASSWORD", "s3cret-value")
    out = snippet_config().to_yaml()
    assert "${APP_DB_PASSWORD}" in out and "s3cret-value" not in out
    assert str(EnvRef("X")) == "${X}"
    # an exact "${NAME}" string is the same setting as EnvRef("NAME")
    a = DataSourcePostgres(host="h", user="u", database="d", tables=["t"], password="${X}")
    assert a == DataSourcePostgres(host="h", user="u", database="d", tables=["t"], password=EnvRef("X"))


def test_schema_sink_semantics() -> None:
    cfg = snippet_config()
    assert cfg.schema_sinks["lake_schema"] == cfg.data_sinks["lake"].sink
    assert cfg.data_sinks["lake"].schema_sink == "lake_schema"
    # the same call again is a no-op; the link made before is kept when not given again
    before = cfg.to_yaml()
    cfg.data_sink("lake", cfg.data_sinks["lake"].sink, schema_sink="lake_schema")
    cfg.data_sink("lake", cfg.data_sinks["lake"].sink)
    assert cfg.to_yaml() == before
    # linking an existing schema sink does not change it
    other = cfg.data_sink("other", athena(), schema_sink="lake_schema")
    assert cfg.schema_sinks["lake_schema"] == cfg.data_sinks["lake"].sink
    assert str(other) == "data_sinks.other"
    # a pipeline may name its source and sink by reference
    cfg.pipeline("by_ref", Pipeline(data_source="data_sources.app_db", data_sink="data_sinks.other"))
    assert cfg.pipelines["by_ref"].data_sink.name == "other"


def test_package_is_typed_and_python39_compatible() -> None:
    pkg = Path(skippr.__file__).parent
    assert (pkg / "py.typed").exists()
    for source in sorted((REPO / "python" / "src" / "skippr").glob("*.py")):
        ast.parse(source.read_text(), filename=str(source), feature_version=(3, 9))
    installed = {p.name: p.read_bytes() for p in pkg.glob("*.py")}
    in_repo = {p.name: p.read_bytes() for p in (REPO / "python" / "src" / "skippr").glob("*.py")}
    assert installed == in_repo, "the installed skippr package is stale: run tests/run (it installs the skipprd wheel built from python/)"


def test_mypy_strict() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.9", "--no-incremental", "--cache-dir", os.devnull,
         "src/skippr"],
        cwd=REPO / "python", capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------
# Bad input: clear errors
# --------------------------------------------------------------------------------------------


def pg(**overrides: Any) -> DataSourcePostgres:
    kwargs: dict[str, Any] = dict(host="h", user="u", database="d", tables=["orders"])
    kwargs.update(overrides)
    return DataSourcePostgres(**kwargs)


def athena(**overrides: Any) -> DataSinkAthenaIceberg:
    kwargs: dict[str, Any] = dict(
        warehouse="s3://w/", glue_database_name="g", athena_workgroup_name="a",
        athena_results_s3_bucket="b", region="r",
    )
    kwargs.update(overrides)
    return DataSinkAthenaIceberg(**kwargs)


ARN = "arn:aws:s3tables:us-east-1:111122223333:bucket/analytics"


def rest(**overrides: Any) -> DataSinkRestIceberg:
    kwargs: dict[str, Any] = dict(uri="https://catalog.example.com/api/catalog")
    kwargs.update(overrides)
    return DataSinkRestIceberg(**kwargs)


def with_source_and_sink() -> Config:
    cfg = Config().workspace("w")
    cfg.data_source("db", pg())
    cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./w"))
    return cfg


BAD_CALLS: list[tuple[str, Callable[[], object], str, str]] = [
    ("workspace name", lambda: Config().workspace("my-workspace"), "skippr.workspace", "not a valid workspace name: use letters, digits and `_`"),
    ("workspace type", lambda: Config().workspace(5), "skippr.workspace", "expected the workspace name as a string"),  # type: ignore[arg-type]
    ("pipeline name", lambda: with_source_and_sink().pipeline("9lives", Pipeline("data_sources.db", "data_sinks.lake")), "pipelines", "`9lives` is not a valid pipeline name"),
    ("source name", lambda: Config().data_source("app db", pg()), "data_sources", "`app db` is not a valid data source name"),
    ("sink name", lambda: Config().data_sink("lake!", DataSinkLocalIceberg(warehouse="w")), "data_sinks", "not a valid data sink name"),
    ("schema sink name", lambda: Config().data_sink("lake", DataSinkLocalIceberg(warehouse="w"), schema_sink="bad-name"), "data_sinks.lake.schema_sink", "not a valid schema sink name"),
    ("empty tables", lambda: pg(tables=[]), "DataSourcePostgres.tables", "list at least one table"),
    ("tables as str", lambda: pg(tables="orders"), "DataSourcePostgres.tables", "expected a list of table names, found a string ('orders')"),
    ("bad table name", lambda: pg(tables=["orders", "a.b.c"]), "DataSourcePostgres.tables[1]", "`a.b.c` is not a table name: write `name` (schema public) or `schema.name`"),
    ("table with space", lambda: pg(tables=["my table"]), "DataSourcePostgres.tables[0]", "is not a table name"),
    ("table not a str", lambda: pg(tables=[1]), "DataSourcePostgres.tables[0]", "expected a table name (a string), found an integer (1)"),
    ("table twice", lambda: pg(tables=["orders", "public.orders"]), "DataSourcePostgres.tables[1]", "is listed twice"),
    ("port zero", lambda: pg(port=0), "DataSourcePostgres.port", "0 is out of range: a port number must be between 1 and 65535"),
    ("port too big", lambda: pg(port=65536), "DataSourcePostgres.port", "between 1 and 65535"),
    ("port as str", lambda: pg(port="5432"), "DataSourcePostgres.port", "expected a port number (1-65535), found a string ('5432')"),
    ("port as bool", lambda: pg(port=True), "DataSourcePostgres.port", "found a boolean"),
    ("host type", lambda: pg(host=["h"]), "DataSourcePostgres.host", "expected a string (or an EnvRef), found a list"),
    ("host empty", lambda: pg(host=" "), "DataSourcePostgres.host", "must not be empty"),
    ("host missing", lambda: pg(host=None), "DataSourcePostgres.host", "is required"),
    ("password newline", lambda: pg(password="a\nb"), "DataSourcePostgres.password", "control character"),
    ("cdc mode value", lambda: pg(cdc_mode="sometimes"), "DataSourcePostgres.cdc_mode", "unknown value `sometimes`; allowed: snapshot_then_cdc, snapshot_only, cdc_only"),
    ("cdc mode type", lambda: pg(cdc_mode=1), "DataSourcePostgres.cdc_mode", "expected a DataSourcePostgresSourceCdcMode"),
    ("sslmode value", lambda: pg(sslmode="verify_full"), "DataSourcePostgres.sslmode", "unknown value `verify_full`; allowed: disable, prefer, require, verify-ca, verify-full"),
    ("sslmode type", lambda: pg(sslmode=True), "DataSourcePostgres.sslmode", "expected a DataSourcePostgresSourceSslMode"),
    ("sslrootcert empty", lambda: pg(sslrootcert=" "), "DataSourcePostgres.sslrootcert", "must not be empty"),
    ("publication", lambda: pg(publication="Pub-1"), "DataSourcePostgres.publication", "not a valid publication name: use at most 63 lower-case letters"),
    ("slot", lambda: pg(slot="s" * 64), "DataSourcePostgres.slot", "not a valid slot name"),
    ("append_only", lambda: pg(append_only=["events"]), "DataSourcePostgres.append_only[0]", "`events` is not one of the source's tables"),
    ("parallelism", lambda: pg(snapshot_parallelism=65), "DataSourcePostgres.snapshot_parallelism", "between 1 and 64"),
    ("file size", lambda: pg(parquet_target_file_size_mb=0), "DataSourcePostgres.parquet_target_file_size_mb", "between 1 and 4096"),
    ("heartbeat", lambda: pg(heartbeat_interval="5x"), "DataSourcePostgres.heartbeat_interval", "`5x` is not a duration: write e.g. `30s`, `1m` or `0` (no heartbeat)"),
    ("heartbeat number", lambda: pg(heartbeat_interval=30), "DataSourcePostgres.heartbeat_interval", "`30` is not a duration"),
    ("heartbeat type", lambda: pg(heartbeat_interval=1.5), "DataSourcePostgres.heartbeat_interval", "expected a string, found a number (1.5)"),
    ("retained wal", lambda: pg(max_retained_wal="lots"), "DataSourcePostgres.max_retained_wal", "`lots` is not a size: write e.g. `10GiB` or `512MB`"),
    ("retained wal zero", lambda: pg(max_retained_wal="0GiB"), "DataSourcePostgres.max_retained_wal", "`0GiB` is not a size"),
    ("retained wal fraction", lambda: pg(max_retained_wal="1.5GiB"), "DataSourcePostgres.max_retained_wal", "`1.5GiB` is not a size"),
    ("failover slot", lambda: pg(failover_slot="yes"), "DataSourcePostgres.failover_slot", "expected true or false, found a string ('yes')"),
    ("athena warehouse", lambda: athena(warehouse="/data/warehouse"), "DataSinkAthenaIceberg.warehouse", "`/data/warehouse` is not an S3 location: write `s3://bucket/prefix/`"),
    ("athena region", lambda: athena(region=""), "DataSinkAthenaIceberg.region", "must not be empty"),
    ("local warehouse", lambda: DataSinkLocalIceberg(warehouse=3), "DataSinkLocalIceberg.warehouse", "expected a string"),  # type: ignore[arg-type]
    ("storage path", lambda: LocalStorage(path=""), "LocalStorage.path", "must not be empty"),
    ("storage type", lambda: Config().storage("local"), "skippr.storage", "expected LocalStorage"),  # type: ignore[arg-type]
    ("s3 storage path", lambda: S3Storage(path="/var/skippr"), "S3Storage.path", "`/var/skippr` is not an S3 location: write it as s3://bucket/prefix"),
    ("s3 storage bucket", lambda: S3Storage(path="s3://My_Bucket/x"), "S3Storage.path", "is not a valid S3 bucket name"),
    ("local storage with s3", lambda: LocalStorage(path="s3://b1/x"), "LocalStorage.path", "needs S3Storage"),
    ("env name", lambda: EnvRef("1PASSWORD"), "EnvRef.name", "not a valid environment variable name"),
    ("commit interval", lambda: Pipeline("data_sources.a", "data_sinks.b", commit_interval="10 parsecs"), "Pipeline.commit_interval", "not a duration of at least 100ms"),
    ("commit interval short", lambda: Pipeline("data_sources.a", "data_sinks.b", commit_interval="50ms"), "Pipeline.commit_interval", "at least 100ms"),
    ("transaction budget zero", lambda: Pipeline("data_sources.a", "data_sinks.b", transaction_memory_budget_mb=0), "Pipeline.transaction_memory_budget_mb", "between 1 and 1048576"),
    ("transaction budget text", lambda: Pipeline("data_sources.a", "data_sinks.b", transaction_memory_budget_mb="1GB"), "Pipeline.transaction_memory_budget_mb", "a size in MiB"),
    ("key index budget zero", lambda: Pipeline("data_sources.a", "data_sinks.b", key_index_memory_budget_mb=0), "Pipeline.key_index_memory_budget_mb", "between 1 and 1048576"),
    ("maintenance interval", lambda: MaintenanceSettings(check_interval="10ms"), "MaintenanceSettings.check_interval", "not a duration of at least 100ms"),
    ("maintenance files", lambda: MaintenanceSettings(compaction_min_files=1), "MaintenanceSettings.compaction_min_files", "between 2 and 1000000"),
    ("maintenance switch", lambda: MaintenanceSettings(enabled="yes"), "MaintenanceSettings.enabled", "expected true or false"),  # type: ignore[arg-type]
    ("maintenance type", lambda: Pipeline("data_sources.a", "data_sinks.b", maintenance={"enabled": False}), "Pipeline.maintenance", "expected MaintenanceSettings"),  # type: ignore[arg-type]
    ("unknown transform", lambda: PipelineTable(partition_by=["day(created_at)", "week(created_at)"]), "PipelineTable.partition_by[1]", "`week(created_at)`: `week` is not a transform: use a column name, year(c), month(c), day(c), hour(c), bucket(N, c) or truncate(W, c)"),
    ("unclosed transform", lambda: PipelineTable(partition_by=["bucket(16, id"]), "PipelineTable.partition_by[0]", "is missing its closing parenthesis"),
    ("bucket width", lambda: PipelineTable(partition_by=["bucket(0, id)"]), "PipelineTable.partition_by[0]", "the number of buckets must be a whole number above 0, not `0`"),
    ("bucket arity", lambda: PipelineTable(partition_by=["bucket(id)"]), "PipelineTable.partition_by[0]", "bucket() takes a width and a column, as bucket(N, c)"),
    ("partition twice", lambda: PipelineTable(partition_by=["day(created_at)", "days(created_at)"]), "PipelineTable.partition_by", "`day(created_at)` is given twice in `partition_by`"),
    ("bad sort", lambda: PipelineTable(sort_by=["created_at sideways"]), "PipelineTable.sort_by[0]", "a sort entry is `column [asc|desc] [nulls first|last]`"),
    ("sort twice", lambda: PipelineTable(sort_by=["id", "ID desc"]), "PipelineTable.sort_by", "`id` is given twice in `sort_by`"),
    ("entries as str", lambda: PipelineTable(partition_by="day(created_at)"), "PipelineTable.partition_by", "expected a list of entries, found a string"),  # type: ignore[arg-type]
    ("excluded twice", lambda: PipelineTable(exclude_columns=["note", "Note"]), "PipelineTable.exclude_columns[1]", "`Note` is given twice: give each column once"),
    ("excluded not a column", lambda: PipelineTable(exclude_columns=["two words"]), "PipelineTable.exclude_columns[0]", "`two words` is not a column name: write it bare (folded to lower case) or in double quotes"),
    ("excluded as str", lambda: PipelineTable(exclude_columns="note"), "PipelineTable.exclude_columns", "expected a list of entries, found a string"),  # type: ignore[arg-type]
    ("changelog name", lambda: PipelineTable(changelog="Orders History"), "PipelineTable.changelog", "`Orders History` is not a table name every catalog takes: use lower-case letters, digits and underscores, e.g. `orders_history`"),
    ("changelog empty name", lambda: PipelineTable(changelog=" "), "PipelineTable.changelog", "the changelog table needs a name"),
    ("changelog type", lambda: PipelineTable(changelog=1), "PipelineTable.changelog", "expected True, False or the changelog table's name, found an integer (1)"),  # type: ignore[arg-type]
    ("changelog snapshot only", lambda: changelog_config(cdc_mode="snapshot_only"), "pipelines.app.tables.orders.changelog", "data source `app_db` has `cdc_mode: snapshot_only`: set `cdc_mode: snapshot_then_cdc` (or `cdc_only`), or remove `changelog`"),
    ("changelog taken", lambda: changelog_config(customers="orders_changelog"), "pipelines.app.tables.sales.customers.changelog.table", "the changelog of `sales.customers` would be Iceberg table `orders_changelog`, which is already the changelog of `orders`: give the changelog table another name"),
    ("tables type", lambda: Pipeline("data_sources.a", "data_sinks.b", tables=["orders"]), "Pipeline.tables", "expected a mapping of table name to PipelineTable"),  # type: ignore[arg-type]
    ("table settings type", lambda: Pipeline("data_sources.a", "data_sinks.b", tables={"orders": {"sort_by": ["id"]}}), "Pipeline.tables.orders", "expected a PipelineTable"),  # type: ignore[dict-item]
    ("table name", lambda: Pipeline("data_sources.a", "data_sinks.b", tables={"a.b.c": PipelineTable()}), "Pipeline.tables.a.b.c", "is not a table name"),
    ("table twice", lambda: Pipeline("data_sources.a", "data_sinks.b", tables={"orders": PipelineTable(), "public.orders": PipelineTable()}), "Pipeline.tables.public.orders", "the same table as `orders`"),
    ("table not followed", lambda: with_source_and_sink().pipeline("p", Pipeline("data_sources.db", "data_sinks.lake", tables={"invoices": PipelineTable(sort_by=["id"])})), "pipelines.p.tables.invoices", "`invoices` is not one of the tables data source `db` follows (orders)"),
    ("rest uri", lambda: rest(uri="catalog.example.com"), "DataSinkRestIceberg.uri", "`catalog.example.com` is not an http(s) URL: write the catalog's base URI"),
    ("rest uri v1", lambda: rest(uri="https://h/api/catalog/v1"), "DataSinkRestIceberg.uri", "ends with /v1, which the client appends itself: write https://h/api/catalog"),
    ("rest uri secret", lambda: rest(uri="https://u:pw-secret@h/x"), "DataSinkRestIceberg.uri", "holds a user name or password"),
    ("rest uri missing", lambda: DataSinkRestIceberg(uri=None), "DataSinkRestIceberg.uri", "is required"),  # type: ignore[arg-type]
    ("rest credential", lambda: rest(credential="only-a-secret"), "DataSinkRestIceberg.credential", "is not `<client id>:<client secret>`"),
    ("rest credential and token", lambda: rest(credential="a:b", token="t"), "DataSinkRestIceberg.token", "`credential` and `token` exclude each other"),
    ("rest sigv4 and token", lambda: rest(token="t", sigv4=DataSinkRestIcebergSigv4("us-east-1", "glue")), "DataSinkRestIceberg.token", "`sigv4` requests are signed with AWS credentials"),
    ("rest sigv4 type", lambda: rest(sigv4={"region": "r", "service": "glue"}), "DataSinkRestIceberg.sigv4", "expected a DataSinkRestIcebergSigv4"),  # type: ignore[arg-type]
    ("rest sigv4 service", lambda: DataSinkRestIcebergSigv4("us-east-1", "lambda"), "DataSinkRestIcebergSigv4.service", "`lambda` is not a signing name of an AWS Iceberg REST endpoint; allowed: s3tables, glue"),
    ("rest sigv4 region", lambda: DataSinkRestIcebergSigv4("", "glue"), "DataSinkRestIcebergSigv4.region", "must not be empty"),
    ("rest empty warehouse", lambda: rest(warehouse=" "), "DataSinkRestIceberg.warehouse", "must not be empty"),
    ("rest property name", lambda: rest(properties={"": "x"}), "DataSinkRestIceberg.properties.", "a property needs a name"),
    ("rest property value", lambda: rest(properties={"s3.endpoint": ["x"]}), "DataSinkRestIceberg.properties.s3.endpoint", "expected a text value"),  # type: ignore[dict-item]
    ("rest properties type", lambda: rest(properties=["s3.endpoint"]), "DataSinkRestIceberg.properties", "expected a mapping of property name to value"),  # type: ignore[arg-type]
    ("table bucket arn", lambda: DataSinkS3TablesIceberg(table_bucket_arn="arn:aws:s3:::analytics", region="us-east-1"), "DataSinkS3TablesIceberg.table_bucket_arn", "is not a table bucket ARN: write it as arn:aws:s3tables:<region>:<account>:bucket/<name>"),
    ("table bucket region", lambda: DataSinkS3TablesIceberg(table_bucket_arn=ARN, region="eu-west-1"), "DataSinkS3TablesIceberg.table_bucket_arn", "the table bucket is in us-east-1, and `region` says eu-west-1"),
    ("table bucket no region", lambda: DataSinkS3TablesIceberg(table_bucket_arn=ARN, region=""), "DataSinkS3TablesIceberg.region", "must not be empty"),
    ("glue rest database", lambda: DataSinkGlueRestIceberg(glue_database_name="", region="us-east-1"), "DataSinkGlueRestIceberg.glue_database_name", "must not be empty"),
    ("source type", lambda: Config().data_source("db", athena()), "data_sources.db", "expected a DataSourcePostgres, found a DataSinkAthenaIceberg"),
    ("sink type", lambda: Config().data_sink("lake", pg()), "data_sinks.lake", "expected a DataSinkLocalIceberg, DataSinkAthenaIceberg, DataSinkRestIceberg, DataSinkS3TablesIceberg or DataSinkGlueRestIceberg"),
    ("pipeline type", lambda: with_source_and_sink().pipeline("p", "db"), "pipelines.p", "expected a Pipeline"),  # type: ignore[arg-type]
    ("source handle is a sink", lambda: Pipeline(data_source=with_source_and_sink().data_sink("lake", DataSinkLocalIceberg(warehouse="./w")), data_sink="data_sinks.lake"), "Pipeline.data_source", "expected a data source handle"),  # type: ignore[arg-type]
    ("reference to another section", lambda: Pipeline("data_sinks.lake", "data_sinks.lake"), "Pipeline.data_source", "not a reference of the form `data_sources.<name>`"),
    ("unknown source", lambda: with_source_and_sink().pipeline("p", Pipeline("data_sources.nope", "data_sinks.lake")), "pipelines.p.data_source", "`data_sources.nope` refers to nothing; defined: data_sources.db"),
    ("unknown sink", lambda: with_source_and_sink().pipeline("p", Pipeline("data_sources.db", "data_sinks.nope")), "pipelines.p.data_sink", "`data_sinks.nope` refers to nothing; defined: data_sinks.lake"),
    ("duplicate source", lambda: with_source_and_sink().data_source("db", pg(host="other")), "data_sources.db", "already defined with other settings"),
    ("duplicate sink", lambda: with_source_and_sink().data_sink("lake", DataSinkLocalIceberg(warehouse="./elsewhere")), "data_sinks.lake", "already defined with other settings"),
    ("duplicate schema sink", lambda: snippet_config().schema_sink("lake_schema", DataSinkLocalIceberg(warehouse="w")), "schema_sinks.lake_schema", "already defined with other settings"),
    ("relinking a schema sink", lambda: snippet_config().data_sink("lake", snippet_config().data_sinks["lake"].sink, schema_sink="other"), "data_sinks.lake", "already defined with other settings"),
    ("save without workspace", lambda: Config().to_yaml(), "skippr.workspace", "is not set"),
    ("max memory", lambda: QuerySettings(max_memory="lots"), "QuerySettings.max_memory", "`lots` is not a size of at least 16MiB: write e.g. `4GiB`"),
    ("max memory small", lambda: QuerySettings(max_memory="1MiB"), "QuerySettings.max_memory", "`1MiB` is not a size of at least 16MiB"),
    ("max memory below a statement's", lambda: QuerySettings(max_query_memory="256MiB", max_memory="128MiB"), "QuerySettings.max_memory", "`128MiB` is less than skippr.query.max_query_memory, which is what one statement may use: raise max_memory or lower max_query_memory"),
    ("max query memory", lambda: QuerySettings(max_query_memory="512KiB"), "QuerySettings.max_query_memory", "`512KiB` is not a size of at least 1MiB: write e.g. `512MiB` or `2GiB`"),
    ("spill path", lambda: QuerySettings(spill_path=" "), "QuerySettings.spill_path", "must not be empty: give a folder, or leave the key out"),
    ("statements zero", lambda: QuerySettings(max_concurrent_statements=0), "QuerySettings.max_concurrent_statements", "0 is not between 1 and 10000: twice the cores suits most machines"),
    ("statements text", lambda: QuerySettings(max_concurrent_statements="8"), "QuerySettings.max_concurrent_statements", "expected a number of statements (1-10000), found a string"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("call, path, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_config_error(call: Callable[[], object], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    err = info.value
    assert isinstance(err, ValueError)
    assert err.path == path, str(err)
    assert message in err.message, str(err)
    assert str(err) == f"{path}: {err.message}"


def test_duplicate_pipeline_with_other_settings() -> None:
    cfg = snippet_config()
    cfg.data_sink("lake2", DataSinkLocalIceberg(warehouse="./w"))
    with pytest.raises(ConfigError, match=r"^pipelines\.orders: already defined with other settings"):
        cfg.pipeline("orders", Pipeline(data_source="data_sources.app_db", data_sink="data_sinks.lake2"))
    # the same definition again is fine
    cfg.pipeline("orders", Pipeline(data_source="data_sources.app_db", data_sink="data_sinks.lake"))


def test_failed_calls_change_nothing() -> None:
    cfg = snippet_config()
    before = cfg.to_yaml()
    for call in (
        lambda: cfg.data_source("app_db", pg()),
        lambda: cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./w"), schema_sink="new_schema"),
        lambda: cfg.pipeline("orders", Pipeline("data_sources.app_db", "data_sinks.nope")),
    ):
        with pytest.raises(ConfigError):
            call()
    assert cfg.to_yaml() == before


GOOD_LINES = EXPECTED.decode().splitlines()


def replaced(lineno: int, new: str) -> str:
    lines = list(GOOD_LINES)
    lines[lineno - 1] = new
    return "\n".join(lines) + "\n"


BAD_FILES: list[tuple[str, str, int, str, str]] = [
    ("syntax", replaced(17, "      tables: [orders, customers"), 18, "", "YAML syntax error"),
    ("bad indentation", replaced(14, "     user: skippr_reader"), 14, "", "YAML syntax error"),
    ("unknown key", replaced(13, "      hots: db.internal"), 13, "data_sources.app_db.Postgres.hots", "unknown key `hots`; allowed: host, port, user"),
    ("missing key", replaced(13, "      port: 5432"), 12, "data_sources.app_db.Postgres", "missing required key `host`"),
    ("tables as str", replaced(17, "      tables: orders"), 17, "data_sources.app_db.Postgres.tables", "expected a list of table names"),
    ("empty tables", replaced(17, "      tables: []"), 17, "data_sources.app_db.Postgres.tables", "list at least one table"),
    ("bad table", replaced(17, "      tables: [orders, 'a b']"), 17, "data_sources.app_db.Postgres.tables[1]", "`a b` is not a table name"),
    ("port range", replaced(13, "      host: db.internal\n      port: 99999"), 14, "data_sources.app_db.Postgres.port", "between 1 and 65535"),
    ("port quoted", replaced(13, "      host: db.internal\n      port: '5432'"), 14, "data_sources.app_db.Postgres.port", "expected a port number (1-65535), found a string ('5432')"),
    ("user int", replaced(14, "      user: 1234"), 14, "data_sources.app_db.Postgres.user", "found an integer (1234)"),
    ("cdc mode", replaced(18, "      cdc_mode: always"), 18, "data_sources.app_db.Postgres.cdc_mode", "unknown value `always`; allowed"),
    ("workspace", replaced(2, "  workspace: my-workspace"), 2, "skippr.workspace", "not a valid workspace name"),
    ("storage mode", replaced(3, "  skipprd_el_storage_mode: gcs"), 3, "skippr.skipprd_el_storage_mode", "unknown value `gcs`; allowed: local, s3"),
    ("s3 storage without path", replaced(3, "  skipprd_el_storage_mode: s3"), 1, "skippr", "skipprd_el_storage_path is required"),
    ("s3 storage path", replaced(3, "  skipprd_el_storage_mode: s3\n  skipprd_el_storage_path: /var/skippr"), 4, "skippr.skipprd_el_storage_path", "`/var/skippr` is not an S3 location"),
    ("pipeline name", replaced(6, "  my-orders:"), 6, "pipelines.my-orders", "not a valid pipeline name"),
    ("dangling source", replaced(7, "    data_source: data_sources.nope"), 7, "pipelines.orders.data_source", "`data_sources.nope` refers to nothing; defined: data_sources.app_db"),
    ("malformed reference", replaced(8, "    data_sink: lake"), 8, "pipelines.orders.data_sink", "not a reference of the form `data_sinks.<name>`"),
    ("dangling schema sink", replaced(28, "    schema_sink: schema_sinks.nope"), 28, "data_sinks.lake.schema_sink", "refers to nothing; defined: schema_sinks.lake_schema"),
    ("athena warehouse", replaced(23, "      warehouse: /tmp/w"), 23, "data_sinks.lake.AthenaIceberg.warehouse", "is not an S3 location"),
    ("two connectors", replaced(22, "    LocalIceberg: {warehouse: w}\n    AthenaIceberg:"), 21, "data_sinks.lake", "exactly one connector key"),
    ("no connector", replaced(22, "    Iceberg:"), 22, "data_sinks.lake.Iceberg", "unknown key `Iceberg`; allowed: LocalIceberg, AthenaIceberg, RestIceberg, S3TablesIceberg, GlueRestIceberg, schema_sink"),
    ("duplicate key", replaced(14, "      host: again"), 14, "data_sources.app_db.Postgres.host", "duplicate key `host`"),
    ("bad transform", replaced(8, "    data_sink: data_sinks.lake\n    tables:\n      orders:\n        partition_by: [day(created_at), bucket(16, customer_id), weekly(x)]"), 11, "pipelines.orders.tables.orders.partition_by[3]", "`weekly` is not a transform"),
    ("unknown table", replaced(8, "    data_sink: data_sinks.lake\n    tables:\n      invoices:\n        sort_by: [id]"), 10, "pipelines.orders.tables.invoices", "not one of the tables data source `app_db` follows (orders, customers)"),
    ("unknown table key", replaced(8, "    data_sink: data_sinks.lake\n    tables:\n      orders:\n        partition: [id]"), 11, "pipelines.orders.tables.orders.partition", "unknown key `partition`; allowed: partition_by, sort_by, exclude_columns"),
    ("excluded twice", replaced(8, "    data_sink: data_sinks.lake\n    tables:\n      orders:\n        exclude_columns: [note, '\"Note\"', NOTE]"), 11, "pipelines.orders.tables.orders.exclude_columns[2]", "`NOTE` is given twice: give each column once"),
    ("heartbeat", replaced(18, "      cdc_mode: snapshot_then_cdc\n      heartbeat_interval: 5x"), 19, "data_sources.app_db.Postgres.heartbeat_interval", "`5x` is not a duration"),
    ("retained wal", replaced(18, "      cdc_mode: snapshot_then_cdc\n      max_retained_wal: lots"), 19, "data_sources.app_db.Postgres.max_retained_wal", "`lots` is not a size"),
    ("failover slot", replaced(18, "      cdc_mode: snapshot_then_cdc\n      failover_slot: yes"), 19, "data_sources.app_db.Postgres.failover_slot", "expected true or false, found a string ('yes')"),
    ("unknown section", "skippr: {workspace: w}\nsources: {}\n", 2, "sources", "unknown key `sources`; allowed: skippr, pipelines"),
    ("no skippr", "pipelines: {}\n", 1, "", "missing required key `skippr`"),
    ("not a mapping", "- skippr\n", 1, "", "wrong type: found a list"),
]


@pytest.mark.parametrize("text, line, path, message", [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_bad_file_names_file_line_and_field(tmp_path: Path, text: str, line: int, path: str, message: str) -> None:
    f = tmp_path / "skippr.yml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        Config.load(f)
    err = info.value
    assert err.file == str(f) and err.line == line, str(err)
    assert err.path == path, str(err)
    assert message in err.message, str(err)
    assert str(err).startswith(f"{f}:{line}:"), str(err)


def test_unreadable_and_empty_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(ConfigError, match=r"nope\.yml: cannot read the config file"):
        Config.load(missing)
    empty = tmp_path / "empty.yml"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"empty\.yml(:\d+:\d+)?: the file is empty"):
        Config.load(empty)
    binary = tmp_path / "bin.yml"
    binary.write_bytes(b"skippr: \xff\n")
    with pytest.raises(ConfigError, match=r"bin\.yml: is not UTF-8"):
        Config.load(binary)


def gateway_config() -> Config:
    cfg = Config().workspace("shop")
    cfg.query(QuerySettings(
        listen="0.0.0.0:5433",
        users=[QueryUser("analyst", EnvRef("ANALYST_PASSWORD")), QueryUser("bi", "${BI_PASSWORD}")],
        tls=QueryTls("server.crt", "server.key"),
        statement_timeout="30s",
        max_connections=250,
        max_query_memory="512MiB",
        target_partitions=8,
        max_memory="2GiB",
        spill_path="./spill",
        max_concurrent_statements=16,
    ))
    cfg.metrics(MetricsSettings(listen="127.0.0.1:9187"))
    return cfg


def test_gateway_settings_round_trip_and_survive_connect(tmp_path: Path) -> None:
    """`skippr.query` and `skippr.metrics` written from Python read back the same, pass
    `skipprd validate`, and `skipprd connect` keeps them byte for byte while it adds entries."""
    cfg = gateway_config()
    text = cfg.to_yaml()
    assert "    users:\n      - name: analyst\n        password: ${ANALYST_PASSWORD}\n" in text, text
    assert ("      key: server.key\n    statement_timeout: 30s\n    max_connections: 250\n"
            "    max_query_memory: 512MiB\n    target_partitions: 8\n    max_memory: 2GiB\n"
            "    spill_path: ./spill\n    max_concurrent_statements: 16\n") in text, text
    with pytest.raises(ConfigError):
        QuerySettings(max_connections=0)
    with pytest.raises(ConfigError, match="target_partitions"):
        QuerySettings(target_partitions=0)
    assert Config.from_yaml(text) == cfg
    with pytest.raises(ConfigError):
        QuerySettings(users=[QueryUser("a", "x"), QueryUser("a", "y")])
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    cfg.save(config)
    for args in FULL_CONNECT_COMMANDS:
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    written = config.read_text()
    assert written.startswith(text.split("\n\n")[0]), f"skipprd connect changed skippr:\n{written}"
    loaded = Config.load(config)
    assert loaded.get_query() == cfg.get_query() and loaded.get_metrics() == cfg.get_metrics()


def test_maintenance_settings_round_trip_and_validate(tmp_path: Path) -> None:
    """`pipelines.<p>.maintenance` written by Python reads back equal, skipprd accepts it, and
    a file with it (as the docs show it) loads."""
    from skippr import MaintenanceSettings

    cfg = Config().workspace("w")
    src = cfg.data_source("db", DataSourcePostgres(host="h", user="u", database="d", tables=["t"]))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./w"))
    settings = MaintenanceSettings(enabled=False, check_interval="500ms", snapshot_retention="2h",
                                   min_snapshots_to_keep=3, orphan_file_age="30m",
                                   compaction_min_files=4)
    cfg.pipeline("p", Pipeline(data_source=src, data_sink=lake, maintenance=settings))
    path = tmp_path / "skippr.yml"
    cfg.save(path)
    text = path.read_text()
    assert ("    maintenance:\n      enabled: false\n      check_interval: 500ms\n      snapshot_retention: 2h\n"
            "      min_snapshots_to_keep: 3\n      orphan_file_age: 30m\n      compaction_min_files: 4\n") in text, text
    assert Config.load(path) == cfg
    path.write_text(text.replace("enabled: false", "enabled: true"))
    loaded = Config.load(path).pipelines["p"].maintenance
    assert loaded is not None and loaded.enabled is True
    path.write_text(text.replace("compaction_min_files: 4", "compaction_files: 4"))
    with pytest.raises(ConfigError, match="unknown key `compaction_files`"):
        Config.load(path)
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    path.write_text(text)
    proc = run_binary(["--config", str(path), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)


def test_consistent_cuts_round_trip_and_validate(tmp_path: Path) -> None:
    """`pipelines.<p>.consistent_cuts` written by Python reads back equal and skipprd accepts
    it; a bad value names the field as skipprd does."""
    from skippr import ConsistentCuts

    cfg = Config().workspace("w")
    src = cfg.data_source("db", DataSourcePostgres(host="h", user="u", database="d", tables=["t"]))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./w"))
    cfg.pipeline("p", Pipeline(data_source=src, data_sink=lake, consistent_cuts=ConsistentCuts(every="1d", keep=7)))
    path = tmp_path / "skippr.yml"
    cfg.save(path)
    text = path.read_text()
    assert "    consistent_cuts:\n      every: 1d\n      keep: 7\n" in text, text
    assert Config.load(path) == cfg
    with pytest.raises(ConfigError, match="not a duration of at least 1s"):
        ConsistentCuts(every="500ms")
    with pytest.raises(ConfigError, match="between 1 and 100000"):
        ConsistentCuts(keep=0)
    path.write_text(text.replace("keep: 7", "kept: 7"))
    with pytest.raises(ConfigError, match="unknown key `kept`"):
        Config.load(path)
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    path.write_text(text)
    proc = run_binary(["--config", str(path), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)


def test_lease_settings_round_trip_and_validate(tmp_path: Path) -> None:
    """`skippr.lease` written by Python reads back equal, and skipprd accepts it."""
    from skippr import LeaseSettings, S3Storage

    cfg = Config().workspace("w").storage(S3Storage("s3://state-bucket/prefix")).lease(
        LeaseSettings(renew_every="1s", expire_after="4s")
    )
    src = cfg.data_source("db", DataSourcePostgres(host="h", user="u", database="d", tables=["t"]))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./w"))
    cfg.pipeline("p", Pipeline(data_source=src, data_sink=lake))
    path = tmp_path / "skippr.yml"
    cfg.save(path)
    text = path.read_text()
    assert "  lease:\n    renew_every: 1s\n    expire_after: 4s\n" in text, text
    assert Config.load(path) == cfg
    with pytest.raises(ConfigError, match="not a duration of at least 1s"):
        LeaseSettings(expire_after="10ms")
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    proc = run_binary(["--config", str(path), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    path.write_text(text.replace("expire_after: 4s", "expire_after: 1s"))
    proc = run_binary(["--config", str(path), "validate"], cwd=tmp_path)
    assert proc.returncode == 2 and "at least twice renew_every" in proc.stderr, describe(proc)


LAYOUT_YAML = """\
    tables:
      orders:
        partition_by: ['day(created_at)', 'bucket(16, customer_id)']
        sort_by: ['created_at desc']
        exclude_columns: [internal_note, '"Secret"']
      customers:
        sort_by: [id]
"""


def layout_config() -> Config:
    cfg = Config().workspace("analytics")
    src = cfg.data_source("app_db", DataSourcePostgres(host="127.0.0.1", user="u", database="app", tables=["orders", "customers"]))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./warehouse"))
    cfg.pipeline("app", Pipeline(data_source=src, data_sink=lake, tables={
        "orders": PipelineTable(partition_by=["day(created_at)", "bucket(16, customer_id)"], sort_by=["created_at desc"],
                                exclude_columns=["internal_note", '"Secret"']),
        "customers": PipelineTable(sort_by=["id"]),
    }))
    return cfg


def test_table_layouts_write_the_same_bytes_as_connect_and_validate(tmp_path: Path) -> None:
    """`Pipeline(tables={...: PipelineTable(...)})` writes `pipelines.<p>.tables`, in the order
    given, byte for byte what `skipprd connect pipeline --partition-by/--sort-by` writes; the
    issue's form (a flow list YAML splits at the commas inside `bucket(16, customer_id)`)
    reads back the same; skipprd validates it."""
    cfg = layout_config()
    text = cfg.to_yaml()
    assert "    data_sink: data_sinks.lake\n" + LAYOUT_YAML + "\n" in text, text
    assert Config.from_yaml(text) == cfg
    issue_form = text.replace("['day(created_at)', 'bucket(16, customer_id)']", "[day(created_at), bucket(16, customer_id)]")
    assert issue_form != text
    loaded = Config.from_yaml(issue_form)
    assert loaded == cfg
    tables = loaded.pipelines["app"].tables
    assert tables is not None and list(tables) == ["orders", "customers"]
    assert tables["orders"].partition_by == ("day(created_at)", "bucket(16, customer_id)")
    assert tables["orders"].exclude_columns == ("internal_note", '"Secret"')
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    for args in (
        ["--workspace", "analytics", "connect", "data-source", "postgres", "--pipeline", "app", "--name", "app_db",
         "--host", "127.0.0.1", "--user", "u", "--database", "app", "--tables", "orders", "--tables", "customers"],
        ["connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "lake", "--warehouse", "./warehouse"],
        ["connect", "pipeline", "--pipeline", "app", "--partition-by", "orders=day(created_at)",
         "--partition-by", "orders=bucket(16, customer_id)", "--sort-by", "orders=created_at desc",
         "--sort-by", "customers=id", "--exclude-column", "orders=internal_note",
         "--exclude-column", 'orders="Secret"'],
    ):
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    # connect keeps what Python wrote (and joins a split flow list back when it rewrites it).
    config.write_text(issue_form)
    proc = run_binary(["--config", str(config), "connect", "data-sink", "localiceberg", "--pipeline", "app",
                       "--name", "lake", "--warehouse", "./warehouse"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text


CHANGELOG_YAML = """\
    tables:
      orders:
        sort_by: [id]
        changelog: true
      sales.customers:
        changelog:
          table: customer_history
"""


def changelog_config(customers: str = "customer_history", **source: Any) -> Config:
    """`orders` with a changelog of the default name, `sales.customers` with one named."""
    cfg = Config().workspace("analytics")
    src = cfg.data_source("app_db", DataSourcePostgres(
        host="127.0.0.1", user="u", database="app", tables=["orders", "sales.customers"], **source))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./warehouse"))
    cfg.pipeline("app", Pipeline(data_source=src, data_sink=lake, tables={
        "orders": PipelineTable(sort_by=["id"], changelog=True),
        "sales.customers": PipelineTable(changelog=customers),
    }))
    return cfg


def test_changelogs_write_the_same_bytes_as_connect_and_validate(tmp_path: Path) -> None:
    """`PipelineTable(changelog=True)` writes `changelog: true`, `changelog="name"` writes
    `changelog: {table: name}` (as a block mapping), byte for byte what `skipprd connect
    pipeline --changelog` writes; both read back the same, in flow style too; skipprd
    validates it."""
    cfg = changelog_config()
    text = cfg.to_yaml()
    assert "    data_sink: data_sinks.lake\n" + CHANGELOG_YAML + "\n" in text, text
    assert Config.from_yaml(text) == cfg
    flow = text.replace("changelog:\n          table: customer_history", "changelog: {table: customer_history}")
    assert flow != text and Config.from_yaml(flow) == cfg
    tables = cfg.pipelines["app"].tables
    assert tables is not None
    assert tables["orders"].changelog is True and tables["sales.customers"].changelog == "customer_history"
    assert tables["orders"].changelog_table("orders") == "orders_changelog"
    assert PipelineTable(changelog=True).changelog_table("sales.customers") == "sales_customers_changelog"
    assert PipelineTable(changelog=False).changelog_table("orders") is None
    # `false` is kept as written.
    assert "        changelog: false\n" in Config.from_yaml(text.replace("changelog: true", "changelog: false")).to_yaml()
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    for args in (
        ["--workspace", "analytics", "connect", "data-source", "postgres", "--pipeline", "app", "--name", "app_db",
         "--host", "127.0.0.1", "--user", "u", "--database", "app", "--tables", "orders", "--tables", "sales.customers"],
        ["connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "lake", "--warehouse", "./warehouse"],
        ["connect", "pipeline", "--pipeline", "app", "--sort-by", "orders=id", "--changelog", "orders",
         "--changelog", "sales.customers=customer_history"],
    ):
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    # connect writes the flow form back as Python writes it.
    config.write_text(flow)
    proc = run_binary(["--config", str(config), "connect", "pipeline", "--pipeline", "app", "--sort-by", "orders=id"],
                      cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text


CHANGELOG_BAD_FILES = {
    "name": ("table: customer_history", "table: Customer History"),
    "flow name": ("changelog:\n          table: customer_history", "changelog: {table: customer-history}"),
    "empty name": ("table: customer_history", "table: ''"),
    "text": ("changelog: true", "changelog: orders_history"),
    "yes": ("changelog: true", "changelog: yes"),
    "synced table": ("table: customer_history", "table: orders"),
    "default name taken": ("table: customer_history", "table: orders_changelog"),
    "snapshot only": ("      tables: [orders, sales.customers]\n",
                      "      tables: [orders, sales.customers]\n      cdc_mode: snapshot_only\n"),
}


@pytest.mark.parametrize("old, new", CHANGELOG_BAD_FILES.values(), ids=list(CHANGELOG_BAD_FILES))
def test_bad_changelogs_give_skipprds_message(tmp_path: Path, old: str, new: str) -> None:
    """A changelog name no catalog takes, a name already taken, a text value, or a
    `snapshot_only` source: the package names the same file, line, key and message as
    `skipprd validate`."""
    text = changelog_config().to_yaml()
    assert old in text
    assert_same_error_as_skipprd(tmp_path, text.replace(old, new))


def assert_same_error_as_skipprd(tmp_path: Path, text: str) -> None:
    """`text` is refused by the package, and `skipprd validate` says the same at the same place."""
    config = tmp_path / "skippr.yml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        Config.load(config)
    err = info.value
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert f"error: {config}:{err.line}:{err.column}: {err.path}: {err.message}\n" in proc.stderr, (
        f"Python: {err}\n{describe(proc)}"
    )


def source_keys_config(**keys: Any) -> Config:
    """One source with the Postgres settings `keys`, one sink, one pipeline."""
    cfg = Config().workspace("w")
    src = cfg.data_source("db", DataSourcePostgres(host="h", user="u", database="d", tables=["orders"], **keys))
    lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./w"))
    cfg.pipeline("app", Pipeline(data_source=src, data_sink=lake))
    return cfg


@pytest.mark.parametrize("flags, keys, written", [
    (["--heartbeat-interval", "0"], dict(heartbeat_interval="0"), "      heartbeat_interval: '0'\n"),
    (["--heartbeat-interval", "90s", "--max-retained-wal", "1073741824"],
     dict(heartbeat_interval="90s", max_retained_wal=1073741824),
     "      heartbeat_interval: 90s\n      max_retained_wal: '1073741824'\n"),
    (["--max-retained-wal", "${MAX_WAL}", "--failover-slot", "false"],
     dict(max_retained_wal="${MAX_WAL}", failover_slot=False),
     "      max_retained_wal: ${MAX_WAL}\n      failover_slot: false\n"),
])
def test_source_heartbeat_retained_wal_and_failover_slot_match_connect(
    tmp_path: Path, flags: list[str], keys: dict[str, Any], written: str
) -> None:
    """`DataSourcePostgres(heartbeat_interval=..., max_retained_wal=..., failover_slot=...)`
    writes what `connect data-source postgres --heartbeat-interval ... --max-retained-wal ...
    --failover-slot ...` writes (a number as its text, `0` quoted), reads back equal, and
    validates."""
    cfg = source_keys_config(**keys)
    text = cfg.to_yaml()
    assert "      tables: [orders]\n" + written + "\n" in text, text
    assert Config.from_yaml(text) == cfg
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    for args in (
        ["--workspace", "w", "connect", "data-source", "postgres", "--pipeline", "app", "--name", "db",
         "--host", "h", "--user", "u", "--database", "d", "--tables", "orders", *flags],
        ["connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "lake", "--warehouse", "./w"],
    ):
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path, env={"MAX_WAL": "2GiB"})
    assert proc.returncode == 0, describe(proc)


def test_unquoted_numbers_are_read_as_their_text(tmp_path: Path) -> None:
    """`heartbeat_interval: 0` and `max_retained_wal: 1073741824` (YAML integers) are read as
    `'0'` and `'1073741824'` by the package, as skipprd reads them."""
    text = source_keys_config(heartbeat_interval="0", max_retained_wal="1073741824").to_yaml()
    plain = text.replace("'0'", "0").replace("'1073741824'", "1073741824")
    assert plain != text
    loaded = Config.from_yaml(plain).data_sources["db"]
    assert (loaded.heartbeat_interval, loaded.max_retained_wal) == ("0", "1073741824")
    assert Config.from_yaml(plain).to_yaml() == text
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    config.write_text(plain)
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)


SOURCE_AND_TABLE_BAD_FILES = {
    "heartbeat": ("      tables: [orders]\n", "      tables: [orders]\n      heartbeat_interval: 5x\n"),
    "heartbeat number": ("      tables: [orders]\n", "      tables: [orders]\n      heartbeat_interval: 30\n"),
    "retained wal": ("      tables: [orders]\n", "      tables: [orders]\n      max_retained_wal: lots\n"),
    "retained wal zero": ("      tables: [orders]\n", "      tables: [orders]\n      max_retained_wal: 0\n"),
    "excluded twice": ("    data_sink: data_sinks.lake\n",
                       "    data_sink: data_sinks.lake\n    tables:\n      orders:\n        exclude_columns: [Note, b, note]\n"),
    "excluded not a column": ("    data_sink: data_sinks.lake\n",
                              "    data_sink: data_sinks.lake\n    tables:\n      orders:\n        exclude_columns: ['two words']\n"),
}


@pytest.mark.parametrize("old, new", SOURCE_AND_TABLE_BAD_FILES.values(), ids=list(SOURCE_AND_TABLE_BAD_FILES))
def test_bad_source_and_table_settings_give_skipprds_message(tmp_path: Path, old: str, new: str) -> None:
    """A bad `heartbeat_interval`, `max_retained_wal` or `exclude_columns` entry: the package
    names the same file, line, key and message as `skipprd validate`."""
    text = source_keys_config().to_yaml()
    assert old in text
    assert_same_error_as_skipprd(tmp_path, text.replace(old, new))


QUERY_BAD_SETTINGS = {
    "max memory": "max_memory: lots\n",
    "max memory small": "max_memory: 1MiB\n",
    "max memory below a statement's": "max_query_memory: 256MiB\n    max_memory: 128MiB\n",
    "max query memory": "max_query_memory: 10KiB\n",
    "statements zero": "max_concurrent_statements: 0\n",
    "statements too many": "max_concurrent_statements: 10001\n",
    "spill path empty": "spill_path: ''\n",
}


def with_query_section(lines: str) -> str:
    text = source_keys_config().to_yaml()
    mode = "  skipprd_el_storage_mode: local\n"
    assert mode in text, text
    return text.replace(mode, mode + "  query:\n    " + lines)


@pytest.mark.parametrize("lines", QUERY_BAD_SETTINGS.values(), ids=list(QUERY_BAD_SETTINGS))
def test_bad_query_limits_give_skipprds_message(tmp_path: Path, lines: str) -> None:
    """A bad `max_memory`, `max_query_memory`, `spill_path` or `max_concurrent_statements`:
    the package names the same file, line, key and message as `skipprd validate`."""
    assert_same_error_as_skipprd(tmp_path, with_query_section(lines))


def test_query_limits_are_written_in_connects_order(tmp_path: Path) -> None:
    """The server's memory, spill folder and admission settings, in any order in the file,
    are written by the package in the order `skipprd connect` writes them (the bytes are
    the same), read back equal, and pass `skipprd validate`; `max_memory` alone below the
    default `max_query_memory` is accepted by both."""
    shuffled = with_query_section(
        "max_concurrent_statements: 3\n    spill_path: ./spill\n    max_memory: 96MiB\n"
        "    target_partitions: 2\n    max_query_memory: 64MiB\n    statement_timeout: 1min\n"
    )
    loaded = Config.from_yaml(shuffled)
    q = loaded.get_query()
    assert q == QuerySettings(statement_timeout="1min", max_query_memory="64MiB", target_partitions=2,
                              max_memory="96MiB", spill_path="./spill", max_concurrent_statements=3)
    text = loaded.to_yaml()
    assert ("  query:\n    statement_timeout: 1min\n    max_query_memory: 64MiB\n    target_partitions: 2\n"
            "    max_memory: 96MiB\n    spill_path: ./spill\n    max_concurrent_statements: 3\n") in text, text
    assert Config.from_yaml(text) == loaded
    alone = with_query_section("max_memory: 512MiB\n")
    assert Config.from_yaml(alone).get_query() == QuerySettings(max_memory="512MiB")
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    config.write_text(shuffled)
    proc = run_binary(["--config", str(config), "connect", "data-sink", "localiceberg", "--pipeline", "app",
                       "--name", "lake", "--warehouse", "./w"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    config.write_text(alone)
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)


def test_admins_and_the_slow_statement_log_are_written_in_connects_order(tmp_path: Path) -> None:
    """`users[].admin` and `log_min_duration` are read, written where `skipprd connect`
    writes them (the bytes are the same), read back equal, and pass `skipprd validate`; a user
    without `admin` is not one, and a config without them still loads."""
    shuffled = with_query_section(
        "log_min_duration: 250ms\n    users:\n    - admin: true\n      password: a\n      name: ann\n"
        "    - name: bob\n      password: b\n    max_concurrent_statements: 3\n"
    )
    loaded = Config.from_yaml(shuffled)
    q = loaded.get_query()
    assert q == QuerySettings(users=[QueryUser("ann", "a", admin=True), QueryUser("bob", "b")],
                              max_concurrent_statements=3, log_min_duration="250ms")
    assert [u.admin for u in q.users] == [True, False]
    text = loaded.to_yaml()
    assert ("  query:\n    users:\n      - name: ann\n        password: a\n        admin: true\n"
            "      - name: bob\n        password: b\n    max_concurrent_statements: 3\n"
            "    log_min_duration: 250ms\n") in text, text
    assert Config.from_yaml(text) == loaded
    with pytest.raises(ConfigError):
        QueryUser("ann", "a", admin="yes")  # type: ignore[arg-type]
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    config.write_text(shuffled)
    proc = run_binary(["--config", str(config), "connect", "data-sink", "localiceberg", "--pipeline", "app",
                       "--name", "lake", "--warehouse", "./w"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)


# --------------------------------------------------------------------------------------------
# Iceberg REST catalogs
# --------------------------------------------------------------------------------------------

REST_CONNECT_COMMANDS = [
    ["--workspace", "analytics", "connect", "data-source", "postgres", "--pipeline", "polaris", "--name", "db",
     "--host", "db.internal", "--user", "u", "--database", "app", "--tables", "orders"],
    ["connect", "data-sink", "resticeberg", "--pipeline", "polaris", "--name", "lake",
     "--uri", "https://polaris.example.com/api/catalog", "--warehouse", "analytics_catalog",
     "--credential", "${CLIENT_ID}:${CLIENT_SECRET}", "--scope", "PRINCIPAL_ROLE:ALL",
     "--property", "s3.endpoint=http://127.0.0.1:9000", "--property", "s3.path-style-access=true",
     "--property", "s3.secret-access-key=${MINIO_SECRET}", "--property", "header.X-Tenant=it's 42"],
    ["connect", "schema-sink", "resticeberg", "--pipeline", "polaris", "--name", "lake_schema"],
    ["connect", "data-source", "postgres", "--pipeline", "unity", "--name", "db",
     "--host", "db.internal", "--user", "u", "--database", "app", "--tables", "orders"],
    ["connect", "data-sink", "resticeberg", "--pipeline", "unity", "--name", "uc",
     "--uri", "https://dbc-1.cloud.databricks.com/api/2.1/unity-catalog/iceberg-rest", "--warehouse", "main",
     "--token", "${DATABRICKS_TOKEN}"],
    ["connect", "data-source", "postgres", "--pipeline", "signed", "--name", "db",
     "--host", "db.internal", "--user", "u", "--database", "app", "--tables", "orders"],
    ["connect", "data-sink", "resticeberg", "--pipeline", "signed", "--name", "signed",
     "--uri", "https://s3tables.us-east-1.amazonaws.com/iceberg", "--warehouse", ARN,
     "--sigv4-region", "us-east-1", "--sigv4-service", "s3tables"],
    ["connect", "data-source", "postgres", "--pipeline", "tables", "--name", "db",
     "--host", "db.internal", "--user", "u", "--database", "app", "--tables", "orders"],
    ["connect", "data-sink", "s3tablesiceberg", "--pipeline", "tables", "--name", "bucket",
     "--table-bucket-arn", ARN.replace("analytics", "other"), "--region", "us-east-1"],
    ["connect", "schema-sink", "s3tablesiceberg", "--pipeline", "tables", "--name", "bucket_schema"],
    ["connect", "data-source", "postgres", "--pipeline", "glue", "--name", "db",
     "--host", "db.internal", "--user", "u", "--database", "app", "--tables", "orders"],
    ["connect", "data-sink", "glueresticeberg", "--pipeline", "glue", "--name", "glue",
     "--glue-database-name", "analytics", "--region", "us-east-1"],
]

REST_SINKS_EXPECTED = """\
data_sinks:
  lake:
    RestIceberg:
      uri: https://polaris.example.com/api/catalog
      warehouse: analytics_catalog
      credential: ${CLIENT_ID}:${CLIENT_SECRET}
      scope: PRINCIPAL_ROLE:ALL
      properties:
        s3.endpoint: http://127.0.0.1:9000
        s3.path-style-access: 'true'
        s3.secret-access-key: ${MINIO_SECRET}
        header.X-Tenant: 'it''s 42'
    schema_sink: schema_sinks.lake_schema
  uc:
    RestIceberg:
      uri: https://dbc-1.cloud.databricks.com/api/2.1/unity-catalog/iceberg-rest
      warehouse: main
      token: ${DATABRICKS_TOKEN}
  signed:
    RestIceberg:
      uri: https://s3tables.us-east-1.amazonaws.com/iceberg
      warehouse: arn:aws:s3tables:us-east-1:111122223333:bucket/analytics
      sigv4:
        region: us-east-1
        service: s3tables
  bucket:
    S3TablesIceberg:
      table_bucket_arn: arn:aws:s3tables:us-east-1:111122223333:bucket/other
      region: us-east-1
    schema_sink: schema_sinks.bucket_schema
  glue:
    GlueRestIceberg:
      glue_database_name: analytics
      region: us-east-1
"""


def rest_config() -> Config:
    """What REST_CONNECT_COMMANDS write, built in Python."""
    cfg = Config().workspace("analytics")
    db = cfg.data_source("db", DataSourcePostgres(host="db.internal", user="u", database="app", tables=["orders"]))
    sinks = {
        "polaris": cfg.data_sink("lake", DataSinkRestIceberg(
            uri="https://polaris.example.com/api/catalog", warehouse="analytics_catalog",
            credential="${CLIENT_ID}:${CLIENT_SECRET}", scope="PRINCIPAL_ROLE:ALL",
            properties={"s3.endpoint": "http://127.0.0.1:9000", "s3.path-style-access": True,
                        "s3.secret-access-key": EnvRef("MINIO_SECRET"), "header.X-Tenant": "it's 42"},
        ), schema_sink="lake_schema"),
        "unity": cfg.data_sink("uc", DataSinkRestIceberg(
            uri="https://dbc-1.cloud.databricks.com/api/2.1/unity-catalog/iceberg-rest", warehouse="main",
            token=EnvRef("DATABRICKS_TOKEN"),
        )),
        "signed": cfg.data_sink("signed", DataSinkRestIceberg(
            uri="https://s3tables.us-east-1.amazonaws.com/iceberg", warehouse=ARN,
            sigv4=DataSinkRestIcebergSigv4(region="us-east-1", service="s3tables"),
        )),
        "tables": cfg.data_sink("bucket", DataSinkS3TablesIceberg(
            table_bucket_arn=ARN.replace("analytics", "other"), region="us-east-1"), schema_sink="bucket_schema"),
        "glue": cfg.data_sink("glue", DataSinkGlueRestIceberg(glue_database_name="analytics", region="us-east-1")),
    }
    for pipeline, sink in sinks.items():
        cfg.pipeline(pipeline, Pipeline(data_source=db, data_sink=sink))
    return cfg


def test_rest_catalog_sinks_write_the_same_bytes_as_connect_and_validate(tmp_path: Path) -> None:
    """Every RestIceberg flag, a bearer token, SigV4 and the two AWS shortcuts (with schema
    sinks copied from their data sinks): Python and `skipprd connect` write the same bytes, the
    file loads back equal, and skipprd validates it without printing a secret."""
    cfg = rest_config()
    text = cfg.to_yaml()
    assert ("\n" + REST_SINKS_EXPECTED + "\n") in text, text
    assert Config.from_yaml(text) == cfg
    assert cfg.schema_sinks["lake_schema"] == cfg.data_sinks["lake"].sink
    # The properties keep their order; a boolean is written as its text.
    props = cfg.data_sinks["lake"].sink.properties  # type: ignore[union-attr]
    assert props is not None and list(props) == ["s3.endpoint", "s3.path-style-access", "s3.secret-access-key", "header.X-Tenant"]
    assert props["s3.path-style-access"] == "true" and props["s3.secret-access-key"] == EnvRef("MINIO_SECRET")
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    config = tmp_path / "skippr.yml"
    for args in REST_CONNECT_COMMANDS:
        proc = run_binary(["--config", str(config), *args], cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    assert config.read_text() == text, f"skipprd connect wrote:\n{config.read_text()}"
    secrets = {"CLIENT_ID": "skippr", "CLIENT_SECRET": "Cs-secret-0xF00D", "MINIO_SECRET": "Ms-secret-0xBEEF",
               "DATABRICKS_TOKEN": "dapi-secret-0xCAFE"}
    proc = run_binary(["--config", str(config), "validate"], cwd=tmp_path, env=secrets)
    assert proc.returncode == 0, describe(proc)
    assert "lake (RestIceberg at https://polaris.example.com/api/catalog, warehouse analytics_catalog)" in proc.stdout, describe(proc)
    assert "glue (GlueRestIceberg at https://glue.us-east-1.amazonaws.com/iceberg, Glue database analytics)" in proc.stdout, describe(proc)
    for value in list(secrets.values())[1:]:
        assert value not in proc.stdout + proc.stderr, describe(proc)
    # The Python reader takes what the binary wrote in any style.
    flow = text.replace(
        "      sigv4:\n        region: us-east-1\n        service: s3tables\n",
        "      sigv4: {service: s3tables, region: us-east-1}\n",
    ).replace("        s3.path-style-access: 'true'\n", "        s3.path-style-access: true\n")
    assert flow != text
    assert Config.from_yaml(flow) == cfg
    assert Config.from_yaml(flow).to_yaml() == text


def test_the_repr_of_a_rest_sink_hides_literal_secrets() -> None:
    sink = rest(credential="id:Cs-literal-secret", properties={"s3.endpoint": "http://m:9000"})
    assert "Cs-literal-secret" not in repr(sink) and "credential='<redacted>'" in repr(sink)
    assert "EnvRef(name='T')" in repr(rest(token=EnvRef("T")))
    assert "'s3.endpoint': 'http://m:9000'" in repr(sink)
    assert rest(properties={"a": 1}) == rest(properties={"a": "1"})
    assert hash(rest(properties={"a": True})) == hash(rest(properties={"a": "true"}))
    assert rest(properties={}).properties is None


REST_FILE = """\
skippr:
  workspace: analytics
data_sinks:
  lake:
    RestIceberg:
      uri: https://catalog.example.com/api/catalog
      credential: ${CLIENT_ID}:${CLIENT_SECRET}
      sigv4:
        region: us-east-1
        service: glue
      properties: {s3.endpoint: 'http://m:9000'}
"""

REST_BAD_FILES: list[tuple[str, str, int, str, str]] = [
    ("sigv4 beside credential", REST_FILE, 7, "data_sinks.lake.RestIceberg.credential", "`sigv4` requests are signed with AWS credentials"),
    ("bad service", REST_FILE.replace("service: glue", "service: lambda").replace("      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n", ""), 9, "data_sinks.lake.RestIceberg.sigv4.service", "`lambda` is not a signing name"),
    ("sigv4 key", REST_FILE.replace("service: glue", "signing-name: glue"), 10, "data_sinks.lake.RestIceberg.sigv4.signing-name", "unknown key `signing-name`; allowed: region, service"),
    ("no uri", REST_FILE.replace("      uri: https://catalog.example.com/api/catalog\n", ""), 5, "data_sinks.lake.RestIceberg", "missing required key `uri`"),
    ("bad uri", REST_FILE.replace("https://catalog.example.com/api/catalog", "ftp://x"), 6, "data_sinks.lake.RestIceberg.uri", "`ftp://x` is not an http(s) URL"),
    ("property list", REST_FILE.replace("'http://m:9000'", "[a, b]"), 11, "data_sinks.lake.RestIceberg.properties.s3.endpoint", "expected a text value"),
    ("unknown key", REST_FILE.replace("      credential:", "      client_secret:"), 7, "data_sinks.lake.RestIceberg.client_secret", "unknown key `client_secret`; allowed: uri, warehouse, credential, token, scope, sigv4, properties"),
    ("arn", "skippr: {workspace: w}\ndata_sinks:\n  t:\n    S3TablesIceberg: {table_bucket_arn: 'arn:aws:s3tables:us-east-1:1:bucket/b', region: us-east-1}\n", 4, "data_sinks.t.S3TablesIceberg.table_bucket_arn", "is not a table bucket ARN"),
    ("glue missing key", "skippr: {workspace: w}\nschema_sinks:\n  g:\n    GlueRestIceberg: {region: us-east-1}\n", 4, "schema_sinks.g.GlueRestIceberg", "missing required key `glue_database_name`"),
]


@pytest.mark.parametrize("text, line, path, message", [b[1:] for b in REST_BAD_FILES], ids=[b[0] for b in REST_BAD_FILES])
def test_bad_rest_catalog_file_names_file_line_and_field(tmp_path: Path, text: str, line: int, path: str, message: str) -> None:
    f = tmp_path / "skippr.yml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        Config.load(f)
    err = info.value
    assert (err.line, err.path) == (line, path), str(err)
    assert message in err.message, str(err)
    assert "CLIENT_SECRET}" not in err.message or "credential" not in path, str(err)
