"""docs/config.md against the code: every key of skippr.yml's model (src/config/model*.rs) is
documented, every documented key exists in the model, every key table is well formed, and the
documented defaults of the settings that have one are the ones the code applies, and every
example of the Iceberg REST catalogs section validates and is what its `skipprd connect`
command writes.

No Postgres needed: this reads the two files and runs `skipprd validate` and `connect`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO, describe_run, run_skipprd, skipprd_bin

#: The model's files: model.rs and the parts it re-exports (model_rest.rs, ...).
MODELS = sorted((REPO / "src" / "config").glob("model*.rs"))
DOCS = REPO / "docs" / "config.md"


def model_fields() -> dict[str, set[str]]:
    """Struct name -> its keys in skippr.yml (serde renames applied)."""
    out: dict[str, set[str]] = {}
    struct = None
    rename = None
    for line in "\n".join(m.read_text() for m in MODELS).splitlines():
        m = re.match(r"pub struct (\w+) \{", line)
        if m:
            struct = m.group(1)
            out[struct] = set()
            continue
        if struct and line.startswith("}"):
            struct = None
            continue
        if struct is None:
            continue
        r = re.search(r'\brename = "([^"]+)"', line)
        if r:
            rename = r.group(1)
            continue
        f = re.match(r"\s+pub (\w+):", line)
        if f:
            out[struct].add(rename or f.group(1))
            rename = None
    return out


def key_tables() -> list[tuple[int, list[str], list[list[str]]]]:
    """(line number, header cells, rows) of every table whose first header cell is `key`."""
    lines = DOCS.read_text().splitlines()
    tables = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("| key |"):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in re.split(r"(?<!\\)\|", lines[j].strip().strip("|"))])
                j += 1
            tables.append((i + 1, header, rows))
            i = j
        else:
            i += 1
    return tables


def documented_keys() -> set[str]:
    keys = set()
    for _, _, rows in key_tables():
        for row in rows:
            for key in re.findall(r"`([^`]+)`", row[0]):
                keys.add(key.split(".")[-1])
    return keys


def test_every_key_table_row_has_every_column():
    bad = []
    for line, header, rows in key_tables():
        for row in rows:
            if len(row) != len(header):
                bad.append(f"docs/config.md table at line {line}: {row[0]} has {len(row)} cells, the header {len(header)}")
    assert not bad, "\n".join(bad)


def test_every_model_key_is_documented():
    words = set()
    for line in DOCS.read_text().splitlines():
        if line.startswith("```"):
            continue
        for code in re.findall(r"`([^`]+)`", line):
            words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))
    missing = sorted(f"{s}.{k}" for s, keys in model_fields().items() for k in keys if k not in words)
    assert not missing, f"keys of skippr.yml that docs/config.md never names: {missing}"


def test_every_documented_key_exists():
    known = set().union(*model_fields().values())
    unknown = sorted(k for k in documented_keys() if k not in known)
    assert not unknown, f"docs/config.md documents keys the code does not read: {unknown}"


def test_the_model_parser_sees_the_structs():
    """Guards the two tests above against a parser that finds nothing."""
    fields = model_fields()
    assert "host" in fields["PostgresSource"] and "Postgres" in fields["DataSourceDef"]
    assert "statement_timeout" in fields["QuerySettings"]
    assert "uri" in fields["RestIcebergSink"] and "table_bucket_arn" in fields["S3TablesIcebergSink"]
    assert len(documented_keys()) > 30


def rest_examples() -> list[tuple[str, str, str]]:
    """(subsection, language, text) of every code block of "Iceberg REST catalogs"."""
    text = DOCS.read_text()
    start = text.index("### Iceberg REST catalogs")
    end = text.index("\n## ", start)
    out = []
    heading = ""
    lines = text[start:end].splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("#### "):
            heading = lines[i][5:]
        if lines[i].startswith("```") and lines[i] != "```":
            lang = lines[i][3:]
            j = lines.index("```", i + 1)
            out.append((heading, lang, "\n".join(lines[i + 1 : j]) + "\n"))
            i = j
        i += 1
    return out


HEAD = """\
skippr:
  workspace: analytics
  skipprd_el_storage_mode: local

pipelines:
  app:
    data_source: data_sources.db
    data_sink: data_sinks.lake

data_sources:
  db:
    Postgres:
      host: db.internal
      user: u
      database: d
      tables: [orders]

"""


def example_env(text: str) -> dict[str, str]:
    """A made-up value for every ${VAR} of an example."""
    return {name: f"{name.lower()}-value" for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)}


def test_the_rest_section_has_an_example_per_catalog():
    headings = {h for h, lang, _ in rest_examples() if lang == "yaml"}
    for catalog in ("Polaris", "Lakekeeper", "Nessie", "Unity", "Gravitino", "S3 Tables", "Glue"):
        assert any(catalog in h for h in headings), f"no yaml example under a heading naming {catalog}: {headings}"


@pytest.mark.parametrize("heading, text", [(h, t) for h, lang, t in rest_examples() if lang == "yaml"])
def test_rest_catalog_examples_validate(tmp_path: Path, heading: str, text: str):
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    cfg = tmp_path / "skippr.yml"
    cfg.write_text(HEAD + text)
    proc = run_skipprd("--config", cfg, "validate", cwd=tmp_path, env=example_env(text), check=False)
    assert proc.returncode == 0, describe_run(proc, f"the example under {heading!r} does not validate")
    assert "lake (" in proc.stdout, describe_run(proc)
    for value in example_env(text).values():
        if "secret" in value or "token" in value:
            assert value not in proc.stdout + proc.stderr, describe_run(proc, "printed a secret")


@pytest.mark.parametrize("heading, command", [(h, t) for h, lang, t in rest_examples() if lang == "sh"])
def test_rest_catalog_connect_commands_write_the_examples(tmp_path: Path, heading: str, command: str):
    """Each `skipprd connect` command of the section writes the example of its kind above it."""
    if not skipprd_bin().exists():
        pytest.skip(f"skipprd binary not found at {skipprd_bin()}")
    args = shlex.split(command.replace("\\\n", " "))
    assert args[:3] == ["skipprd", "connect", "data-sink"], command
    kind = {"resticeberg": "RestIceberg", "s3tablesiceberg": "S3TablesIceberg",
            "glueresticeberg": "GlueRestIceberg"}[args[3]]
    examples = [t for h, lang, t in rest_examples() if lang == "yaml" and h == heading and f"    {kind}:" in t]
    assert examples, f"no {kind} example under {heading!r}"
    cfg = tmp_path / "skippr.yml"
    cfg.write_text(HEAD)
    proc = run_skipprd("--config", cfg, *args[1:], cwd=tmp_path, check=False)
    assert proc.returncode == 0, describe_run(proc)
    assert cfg.read_text() == HEAD + examples[0], f"`{command}` wrote:\n{cfg.read_text()}"
