"""`skipprd connect`: updating an existing skippr.yml keeps what is there, and every bad
flag or conflicting name is refused with a clear error, leaving the file untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_skipprd

SOURCE = ["connect", "data-source", "postgres", "--pipeline", "app", "--name", "db", "--host", "h",
          "--user", "u", "--password", "${PW}", "--database", "d", "--tables", "orders"]
SINK = ["connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "lake", "--warehouse", "./w"]
REST = ["connect", "data-sink", "resticeberg", "--pipeline", "app", "--name", "cat",
        "--uri", "https://catalog.example.com/api/catalog"]


def connect(cfg: Path, *args: str, check: bool = True):
    return run_skipprd("--config", cfg, *args, cwd=cfg.parent, check=check)


def refused(cfg: Path, *args: str, words: list[str]) -> None:
    before = cfg.read_bytes() if cfg.exists() else None
    proc = connect(cfg, *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "panicked" not in proc.stderr
    for w in words:
        assert w in proc.stderr, f"{w!r} not in {proc.stderr!r}"
    assert (cfg.read_bytes() if cfg.exists() else None) == before, "a refused connect changed the file"


def test_update_keeps_existing_content_and_env_references(tmp_path: Path) -> None:
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE)
    connect(cfg, *SINK)
    # A hand-written addition survives later connects.
    text = cfg.read_text().replace("      tables: [orders]\n", "      tables: [orders]\n      snapshot_parallelism: 2\n")
    cfg.write_text(text)
    connect(cfg, "connect", "schema-sink", "localiceberg", "--pipeline", "app", "--name", "lake_schema")
    out = cfg.read_text()
    assert "snapshot_parallelism: 2" in out
    assert "password: ${PW}" in out
    assert "schema_sink: schema_sinks.lake_schema" in out
    assert "lake_schema:\n    LocalIceberg:\n      warehouse: ./w\n" in out
    # Repeating a connect is a no-op; with another flag value it updates just that field.
    connect(cfg, *SOURCE)
    assert cfg.read_text() == out
    connect(cfg, *[a if a != "h" else "db.internal" for a in SOURCE])
    out = cfg.read_text()
    assert "host: db.internal" in out and "snapshot_parallelism: 2" in out
    proc = run_skipprd("--config", cfg, "validate", cwd=tmp_path, env={"PW": "x"})
    assert proc.returncode == 0, proc.stderr


def test_first_connect_needs_a_workspace(tmp_path: Path) -> None:
    refused(tmp_path / "skippr.yml", *SOURCE, words=["--workspace"])


def test_conflicting_names_are_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE)
    connect(cfg, *SINK)
    refused(cfg, "connect", "data-sink", "athenaiceberg", "--pipeline", "app", "--name", "lake",
            "--warehouse", "s3://b/", "--glue-database-name", "g", "--athena-workgroup-name", "p",
            "--athena-results-s3-bucket", "r", "--region", "x",
            words=["data_sinks.lake", "already exists as LocalIceberg"])
    # The pipeline already has a source: pointing it at another one is refused.
    second = [a if a != "db" else "db2" for a in SOURCE]
    refused(cfg, *second, words=["pipeline `app`", "data_source"])


@pytest.mark.parametrize("args,words", [
    (["--workspace", "bad name", *SOURCE], ["workspace"]),
    (["--workspace", "w", *[a if a != "app" else "bad-pipe" for a in SOURCE]], ["pipeline name"]),
    (["--workspace", "w", *SOURCE[:-1], "a.b.c"], ["--tables", "a.b.c"]),
    (["--workspace", "w", "connect", "data-sink", "athenaiceberg", "--pipeline", "app", "--name", "s3",
      "--warehouse", "s3://b/"], ["--glue-database-name", "--region"]),
    (["--workspace", "w", "connect", "data-sink", "athenaiceberg", "--pipeline", "app", "--name", "s3",
      "--warehouse", "/local", "--glue-database-name", "g", "--athena-workgroup-name", "p",
      "--athena-results-s3-bucket", "r", "--region", "x"], ["s3://"]),
    (["--workspace", "w", "connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "l"], ["--warehouse"]),
    (["--workspace", "w", "connect", "schema-sink", "localiceberg", "--pipeline", "nope", "--name", "s"], ["no data sink"]),
    (["--workspace", "w", *SOURCE, "--port", "70000"], ["70000"]),
    (["--workspace", "w", *SOURCE, "--cdc-mode", "sometimes"], ["sometimes"]),
    (["--workspace", "w", *SOURCE, "--heartbeat-interval", "5x"],
     ["--heartbeat-interval: `5x` is not a duration: write e.g. `30s`, `1m` or `0` (no heartbeat)"]),
    (["--workspace", "w", *SOURCE, "--max-retained-wal", "lots"],
     ["--max-retained-wal: `lots` is not a size: write e.g. `10GiB` or `512MB`"]),
    (["--workspace", "w", *SOURCE, "--max-retained-wal", "0"], ["--max-retained-wal: `0` is not a size"]),
    (["--workspace", "w", *SOURCE, "--failover-slot", "maybe"], ["--failover-slot", "maybe"]),
    (["--workspace", "w", "connect", "pipeline", "--pipeline", "app", "--exclude-column", "note"],
     ["--exclude-column", "TABLE=COLUMN"]),
    (["--workspace", "w", "connect", "pipeline", "--pipeline", "app", "--exclude-column", "orders=note",
      "--exclude-column", "orders=NOTE"],
     ["--exclude-column 'orders=NOTE': `NOTE` is given twice: give each column once"]),
    (["--workspace", "w", "connect", "pipeline", "--pipeline", "app", "--exclude-column", "orders=two words"],
     ["--exclude-column 'orders=two words': `two words` is not a column name"]),
    (["--workspace", "w", "connect", "pipeline", "--pipeline", "app", "--changelog", "orders=Orders History"],
     ["--changelog 'orders=Orders History': `Orders History` is not a table name every catalog takes"]),
    (["--workspace", "w", "connect", "pipeline", "--pipeline", "app", "--changelog", "=orders_history"],
     ["--changelog", "TABLE[=NAME]"]),
    (["--workspace", "w", *REST[:-2]], ["--uri"]),
    (["--workspace", "w", *REST[:-1], "catalog.example.com"], ["--uri", "not an http(s) URL"]),
    (["--workspace", "w", *REST[:-1], "https://h/api/v1"], ["ends with /v1", "write https://h/api"]),
    (["--workspace", "w", *REST, "--credential", "just-a-secret"], ["--credential", "<client id>:<client secret>"]),
    (["--workspace", "w", *REST, "--credential", "a:b", "--token", "t"], ["--credential and --token exclude each other"]),
    (["--workspace", "w", *REST, "--sigv4-region", "us-east-1"], ["--sigv4-region and --sigv4-service go together"]),
    (["--workspace", "w", *REST, "--sigv4-region", "us-east-1", "--sigv4-service", "lambda"], ["`lambda`", "s3tables, glue"]),
    (["--workspace", "w", *REST, "--sigv4-region", "r", "--sigv4-service", "glue", "--token", "t"], ["leave out --credential and --token"]),
    (["--workspace", "w", *REST, "--property", "s3.endpoint"], ["--property", "KEY=VALUE"]),
    (["--workspace", "w", *REST, "--property", "--token"], ["--property", "a value is required"]),
    (["--workspace", "w", "connect", "data-sink", "s3tablesiceberg", "--pipeline", "app", "--name", "t",
      "--table-bucket-arn", "arn:aws:s3:::bucket", "--region", "us-east-1"], ["--table-bucket-arn", "not a table bucket ARN"]),
    (["--workspace", "w", "connect", "data-sink", "s3tablesiceberg", "--pipeline", "app", "--name", "t",
      "--table-bucket-arn", "arn:aws:s3tables:us-east-1:111122223333:bucket/bkt"], ["an S3TablesIceberg sink needs --region"]),
    (["--workspace", "w", "connect", "data-sink", "glueresticeberg", "--pipeline", "app", "--name", "g",
      "--region", "us-east-1"], ["a GlueRestIceberg sink needs --glue-database-name"]),
])
def test_bad_flags_are_refused(tmp_path: Path, args: list[str], words: list[str]) -> None:
    refused(tmp_path / "skippr.yml", *args, words=words)


def test_schema_sink_of_another_kind_needs_its_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE)
    connect(cfg, *SINK)
    refused(cfg, "connect", "schema-sink", "athenaiceberg", "--pipeline", "app", "--name", "glue",
            words=["not AthenaIceberg"])


def test_a_broken_existing_file_is_not_overwritten(tmp_path: Path) -> None:
    cfg = tmp_path / "skippr.yml"
    cfg.write_text("skippr: [unclosed\n")
    refused(cfg, "--workspace", "w", *SOURCE, words=["not valid YAML"])


def rest_block(cfg: Path) -> str:
    """The `cat:` data sink as written."""
    text = cfg.read_text()
    start = text.index("  cat:\n")
    end = text.find("\n\n", start)
    return text[start:] if end < 0 else text[start : end + 1]


def test_rest_catalog_sink_is_updated_flag_by_flag(tmp_path: Path) -> None:
    """Given again, --credential, --token and --sigv4-* replace the other ways in, --property
    sets one property and keeps the others ('KEY=' removes it), and every other key stays."""
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE)
    connect(cfg, *REST, "--warehouse", "wh", "--credential", "${CLIENT_ID}:${CLIENT_SECRET}",
            "--scope", "PRINCIPAL_ROLE:ALL", "--property", "s3.endpoint=http://m:9000",
            "--property", "s3.region=us-east-1")
    assert rest_block(cfg) == (
        "  cat:\n    RestIceberg:\n      uri: https://catalog.example.com/api/catalog\n      warehouse: wh\n"
        "      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n      scope: PRINCIPAL_ROLE:ALL\n      properties:\n"
        "        s3.endpoint: http://m:9000\n        s3.region: us-east-1\n"
    ), cfg.read_text()
    env = {"PW": "x", "CLIENT_ID": "id", "CLIENT_SECRET": "Cs-secret-value", "CATALOG_TOKEN": "Tk-secret-value"}
    proc = run_skipprd("--config", cfg, "validate", cwd=tmp_path, env=env)
    assert "cat (RestIceberg at https://catalog.example.com/api/catalog, warehouse wh)" in proc.stdout
    assert "Cs-secret-value" not in proc.stdout + proc.stderr
    connect(cfg, *REST, "--token", "${CATALOG_TOKEN}", "--property", "s3.endpoint=", "--property",
            "s3.path-style-access=true")
    assert rest_block(cfg) == (
        "  cat:\n    RestIceberg:\n      uri: https://catalog.example.com/api/catalog\n      warehouse: wh\n"
        "      token: ${CATALOG_TOKEN}\n      properties:\n        s3.region: us-east-1\n"
        "        s3.path-style-access: 'true'\n"
    ), cfg.read_text()
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env=env)
    connect(cfg, *REST, "--sigv4-region", "us-east-1", "--sigv4-service", "glue", "--property", "s3.region=",
            "--property", "s3.path-style-access=")
    assert rest_block(cfg) == (
        "  cat:\n    RestIceberg:\n      uri: https://catalog.example.com/api/catalog\n      warehouse: wh\n"
        "      sigv4:\n        region: us-east-1\n        service: glue\n"
    ), cfg.read_text()
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env=env)
    # The same command again changes nothing.
    before = cfg.read_bytes()
    connect(cfg, *REST, "--sigv4-region", "us-east-1", "--sigv4-service", "glue")
    assert cfg.read_bytes() == before


def test_rest_catalog_schema_sinks(tmp_path: Path) -> None:
    """A schema sink without flags copies its data sink's settings; with some flags it needs
    --uri; on a data sink of another kind it needs its own settings."""
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE)
    connect(cfg, *REST, "--warehouse", "wh", "--token", "${CATALOG_TOKEN}")
    refused(cfg, "connect", "schema-sink", "resticeberg", "--pipeline", "app", "--name", "s",
            "--warehouse", "wh", words=["needs --uri"])
    connect(cfg, "connect", "schema-sink", "resticeberg", "--pipeline", "app", "--name", "cat_schema")
    text = cfg.read_text()
    assert "    schema_sink: schema_sinks.cat_schema\n" in text
    assert text.endswith(
        "schema_sinks:\n  cat_schema:\n    RestIceberg:\n      uri: https://catalog.example.com/api/catalog\n"
        "      warehouse: wh\n      token: ${CATALOG_TOKEN}\n"
    ), text
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env={"PW": "x", "CATALOG_TOKEN": "t"})
    refused(cfg, "connect", "schema-sink", "glueresticeberg", "--pipeline", "app", "--name", "g",
            words=["not GlueRestIceberg"])
    # An AWS shortcut's schema sink.
    connect(cfg, "connect", "data-source", "postgres", "--pipeline", "aws", "--name", "db", "--host", "h",
            "--user", "u", "--password", "${PW}", "--database", "d", "--tables", "orders")
    connect(cfg, "connect", "data-sink", "s3tablesiceberg", "--pipeline", "aws", "--name", "bucket",
            "--table-bucket-arn", "arn:aws:s3tables:us-east-1:111122223333:bucket/bkt", "--region", "us-east-1")
    connect(cfg, "connect", "schema-sink", "s3tablesiceberg", "--pipeline", "aws", "--name", "bucket_schema")
    assert "  bucket_schema:\n    S3TablesIceberg:\n      table_bucket_arn: arn:aws:s3tables:us-east-1:111122223333:bucket/bkt\n      region: us-east-1\n" in cfg.read_text()
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env={"PW": "x", "CATALOG_TOKEN": "t"})


def test_source_settings_and_excluded_columns_are_updated_flag_by_flag(tmp_path: Path) -> None:
    """`--heartbeat-interval`, `--max-retained-wal` and `--failover-slot` given again replace
    just their keys (`--failover-slot false` turns it off); the `--exclude-column` entries
    given for a table replace its list, 'TABLE=' clears it, and the table's other keys stay."""
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE, "--heartbeat-interval", "30s", "--failover-slot")
    connect(cfg, *SINK)
    assert "      tables: [orders]\n      heartbeat_interval: 30s\n      failover_slot: true\n" in cfg.read_text()
    connect(cfg, *SOURCE, "--max-retained-wal", "2GiB", "--failover-slot", "false")
    assert ("      tables: [orders]\n      heartbeat_interval: 30s\n      max_retained_wal: 2GiB\n"
            "      failover_slot: false\n") in cfg.read_text()
    table = ["connect", "pipeline", "--pipeline", "app"]
    connect(cfg, *table, "--sort-by", "orders=id", "--exclude-column", "orders=internal_note",
            "--exclude-column", 'orders="Secret"')
    assert ("    tables:\n      orders:\n        sort_by: [id]\n"
            "        exclude_columns: [internal_note, '\"Secret\"']\n") in cfg.read_text()
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env={"PW": "x"})
    connect(cfg, *table, "--exclude-column", "orders=ssn")
    assert "        sort_by: [id]\n        exclude_columns: [ssn]\n" in cfg.read_text()
    # The same command again changes nothing.
    before = cfg.read_bytes()
    connect(cfg, *table, "--exclude-column", "orders=ssn")
    assert cfg.read_bytes() == before
    connect(cfg, *table, "--exclude-column", "orders=")
    assert "exclude_columns" not in cfg.read_text()
    assert "      orders:\n        sort_by: [id]\n" in cfg.read_text()
    # A table the source does not follow is refused.
    refused(cfg, *table, "--exclude-column", "invoices=note", words=["`invoices` is not one of the tables", "orders"])


def test_changelogs_are_turned_on_named_and_removed(tmp_path: Path) -> None:
    """`--changelog T` writes `changelog: true`, `--changelog T=NAME` `changelog: {table: NAME}`
    (the table's other keys stay), 'T=' removes it; a name the pipeline already writes, or a
    table the source does not follow, is refused and the file left as it was."""
    cfg = tmp_path / "skippr.yml"
    connect(cfg, "--workspace", "analytics", *SOURCE, "--tables", "customers")
    connect(cfg, *SINK)
    table = ["connect", "pipeline", "--pipeline", "app"]
    connect(cfg, *table, "--sort-by", "orders=id", "--changelog", "orders")
    assert "    tables:\n      orders:\n        sort_by: [id]\n        changelog: true\n" in cfg.read_text()
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env={"PW": "x"})
    connect(cfg, *table, "--changelog", "orders=orders_history")
    assert "        sort_by: [id]\n        changelog:\n          table: orders_history\n" in cfg.read_text()
    run_skipprd("--config", cfg, "validate", cwd=tmp_path, env={"PW": "x"})
    refused(cfg, *table, "--changelog", "orders=customers",
            words=["--changelog 'orders=customers': the changelog of `orders` would be Iceberg table `customers`, "
                   "which is already the Iceberg table of `customers`"])
    refused(cfg, *table, "--changelog", "invoices", words=["`invoices` is not one of the tables", "orders, customers"])
    connect(cfg, *table, "--changelog", "orders=")
    assert "changelog" not in cfg.read_text()
    assert "      orders:\n        sort_by: [id]\n" in cfg.read_text()
