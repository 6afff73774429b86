"""`skipprd connect`: updating an existing skippr.yml keeps what is there, and every bad
flag or conflicting name is refused with a clear error, leaving the file untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_skipprd

SOURCE = ["connect", "data-source", "postgres", "--pipeline", "app", "--name", "db", "--host", "h",
          "--user", "u", "--password", "${PW}", "--database", "d", "--tables", "orders"]
SINK = ["connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "lake", "--warehouse", "./w"]


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
