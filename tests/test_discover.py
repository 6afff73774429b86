"""`skipprd discover --pipeline app`: per-table columns (Postgres and Iceberg types), primary
key, replica identity, row estimate; readiness checks with the SQL that fixes each failure."""

from __future__ import annotations

import json
import secrets

import pytest

from conftest import (
    Database,
    Skippr,
    _drop_database,
    assert_no_panic,
    describe_run,
    start_cluster,
    stop_cluster,
)

SETUP = """
CREATE SCHEMA sales;
CREATE TABLE customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    balance numeric(12,2),
    tags text[],
    created timestamptz,
    score real,
    small smallint
);
CREATE TABLE events (tenant integer, seq bigint, payload jsonb, PRIMARY KEY (tenant, seq));
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE sales.invoices (id uuid PRIMARY KEY, amount money, issued date NOT NULL);
INSERT INTO customers (id, name) SELECT i, 'c' || i FROM generate_series(1, 1000) i;
ANALYZE;
"""

TABLES = ["customers", "events", "sales.invoices"]

PG_TYPE_ALIASES = {
    "bigint": {"bigint", "int8"},
    "text": {"text"},
    "numeric(12,2)": {"numeric(12,2)"},
    "text[]": {"text[]", "_text"},
    "timestamp with time zone": {"timestamp with time zone", "timestamptz"},
    "real": {"real", "float4"},
    "smallint": {"smallint", "int2"},
    "integer": {"integer", "int4"},
    "jsonb": {"jsonb"},
    "uuid": {"uuid"},
    "money": {"money"},
    "date": {"date"},
}

EXPECTED_COLUMNS = {
    "customers": [
        ("id", "bigint", "long", False),
        ("name", "text", "string", False),
        ("balance", "numeric(12,2)", "decimal(12,2)", True),
        ("tags", "text[]", "list<string>", True),
        ("created", "timestamp with time zone", "timestamptz", True),
        ("score", "real", "float", True),
        ("small", "smallint", "int", True),
    ],
    "events": [
        ("tenant", "integer", "int", False),
        ("seq", "bigint", "long", False),
        ("payload", "jsonb", "string", True),
    ],
    "invoices": [
        ("id", "uuid", "uuid", False),
        ("amount", "money", "string", True),
        ("issued", "date", "date", False),
    ],
}


def _norm_type(t: str) -> str:
    return "".join(t.lower().split())


def discover(skippr: Skippr, fmt: str | None = None, **kw):
    args = ["discover", "--pipeline", "app"]
    if fmt:
        args += ["--format", fmt]
    proc = skippr.run(*args, check=False, **kw)
    assert_no_panic(proc)
    return proc


def discover_json(skippr: Skippr, **kw):
    proc = discover(skippr, "json", **kw)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(describe_run(proc, f"--format json did not print one JSON document: {e}"))
    return proc, doc


def find_check(doc: dict, word: str) -> dict:
    found = [c for c in doc["checks"] if word in (c["name"] + " " + (c.get("detail") or "")).lower()]
    assert found, f"no check about {word!r} in {json.dumps(doc['checks'], indent=1)}"
    return found[0]


def test_discover_json_describes_tables_and_passes_checks(skippr: Skippr, db):
    db.execute(SETUP)
    skippr.write_config(TABLES)
    proc, doc = discover_json(skippr)
    assert proc.returncode == 0, describe_run(proc, "checks failed for a superuser on a wal_level=logical cluster")
    assert doc["pipeline"] == "app"

    tables = {t["name"]: t for t in doc["tables"]}
    assert set(tables) == {"customers", "events", "invoices"}, doc["tables"]
    assert tables["invoices"]["schema"] == "sales"
    assert tables["customers"]["schema"] == "public"
    assert tables["customers"]["iceberg_table"] in ("customers", "analytics.customers")
    assert tables["invoices"]["iceberg_table"] in ("sales_invoices", "analytics.sales_invoices")

    for name, expected in EXPECTED_COLUMNS.items():
        cols = tables[name]["columns"]
        assert [c["name"] for c in cols] == [e[0] for e in expected], f"{name}: columns {cols}"
        for col, (cname, pg_type, ice_type, nullable) in zip(cols, expected):
            assert col["pg_type"].lower() in PG_TYPE_ALIASES[pg_type], f"{name}.{cname}: pg_type {col['pg_type']!r}"
            assert _norm_type(col["iceberg_type"]) == _norm_type(ice_type), \
                f"{name}.{cname}: iceberg_type {col['iceberg_type']!r}, expected {ice_type!r}"
            assert col["nullable"] is nullable, f"{name}.{cname}: nullable {col['nullable']!r}"

    assert tables["customers"]["primary_key"] == ["id"]
    assert tables["events"]["primary_key"] == ["tenant", "seq"]
    assert tables["customers"]["replica_identity"].lower() in ("default", "d")
    assert tables["events"]["replica_identity"].lower() in ("full", "f")
    est = tables["customers"]["row_estimate"]
    assert isinstance(est, int) and 500 <= est <= 2000, f"row_estimate {est!r} for 1000 analyzed rows"

    assert doc["checks"], "no checks reported"
    for c in doc["checks"]:
        missing = {"name", "ok", "detail", "fix"} - set(c)
        assert not missing, f"check lacks {sorted(missing)} (fix may be null when ok): {c}"
    failed = [c for c in doc["checks"] if c["ok"] is not True]
    assert not failed, f"checks failed: {failed}"
    for word in ("wal_level", "replication", "slot", "publication"):
        find_check(doc, word)


def test_discover_text_is_readable(skippr: Skippr, db):
    db.execute(SETUP)
    skippr.write_config(TABLES)
    proc = discover(skippr)
    assert proc.returncode == 0, describe_run(proc)
    out = proc.stdout
    for word in ("customers", "events", "invoices", "balance", "payload", "bigint", "long",
                 "numeric(12,2)", "timestamptz", "wal_level", "full"):
        assert word in out.replace("decimal(12, 2)", "decimal(12,2)"), describe_run(proc, f"text output lacks {word!r}")
    assert "1000" in out, describe_run(proc, "text output lacks the row estimate")


def test_discover_without_replication_privilege_fails_with_fix(skippr: Skippr, db):
    db.execute(SETUP)
    db.execute("GRANT USAGE ON SCHEMA sales TO PUBLIC; GRANT SELECT ON ALL TABLES IN SCHEMA sales TO PUBLIC;")
    db.create_role("plain_reader", "plain-pw-1", replication=False)
    skippr.write_config(TABLES, user="plain_reader", password="plain-pw-1")

    proc, doc = discover_json(skippr)
    assert proc.returncode == 1, describe_run(proc, "expected exit 1 when a check fails")
    check = find_check(doc, "replication")
    assert check["ok"] is False, check
    assert "ALTER ROLE" in check["fix"].upper() and "REPLICATION" in check["fix"].upper(), check
    assert "plain_reader" in check["fix"], check

    text = discover(skippr)
    assert text.returncode == 1, describe_run(text)
    assert "ALTER ROLE" in text.stdout.upper() or "ALTER ROLE" in text.stderr.upper(), \
        describe_run(text, "text output does not print the fix")


def test_discover_reports_missing_table(skippr: Skippr, db):
    db.execute(SETUP)
    skippr.write_config(["customers", "no_such_table"])
    for fmt in (None, "json"):
        proc = discover(skippr, fmt)
        assert proc.returncode != 0, describe_run(proc, "a configured table that does not exist")
        assert "no_such_table" in proc.stdout + proc.stderr, describe_run(proc, "does not name the missing table")


@pytest.fixture(scope="module")
def replica_cluster():
    """A cluster that is not ready for logical replication."""
    cluster = start_cluster({"wal_level": "replica", "max_replication_slots": "0", "max_wal_senders": "2"})
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def test_discover_on_cluster_without_logical_wal(replica_cluster, workdir):
    name = "t_" + secrets.token_hex(6)
    replica_cluster.execute(f'CREATE DATABASE "{name}"')
    try:
        db = Database(replica_cluster, name)
        db.execute("CREATE TABLE customers (id integer PRIMARY KEY, name text)")
        skippr = Skippr(db=db, workdir=workdir)
        skippr.write_config(["customers"])
        proc, doc = discover_json(skippr)
        assert proc.returncode == 1, describe_run(proc)
        wal = find_check(doc, "wal_level")
        assert wal["ok"] is False, wal
        fix = wal["fix"].lower()
        assert "wal_level" in fix and "logical" in fix, wal
        slot = find_check(doc, "slot")
        assert slot["ok"] is False, f"max_replication_slots=0 yet the slot check passed: {slot}"
        assert slot["fix"], slot

        text = discover(skippr)
        assert text.returncode == 1
        assert "wal_level" in text.stdout and "logical" in text.stdout, describe_run(text, "no fix for wal_level")
    finally:
        _drop_database(replica_cluster, name)
