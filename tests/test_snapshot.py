"""`skipprd sync --pipeline app --once`: a snapshot of Postgres tables into Iceberg, checked
row by row against Postgres with two independent readers (PyIceberg and DuckDB)."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import (
    LSN_RE,
    Skippr,
    assert_no_panic,
    catalog_rows,
    describe_run,
    duckdb_connect,
    iceberg_type_strings,
    lsn_to_int,
)

# --------------------------------------------------------------------------------------------
# A table with every type of the mapping
# --------------------------------------------------------------------------------------------

ALL_TYPES_DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pair AS (a integer, b text);
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN email AS text;
CREATE TABLE all_types (
    id integer PRIMARY KEY,
    c_smallint smallint,
    c_integer integer,
    c_bigint bigint,
    c_numeric_10_2 numeric(10,2),
    c_numeric_38_10 numeric(38,10),
    c_numeric numeric,
    c_numeric_50_5 numeric(50,5),
    c_real real,
    c_double double precision,
    c_boolean boolean,
    c_text text,
    c_varchar varchar(20),
    c_char char(5),
    c_enum mood,
    c_json json,
    c_jsonb jsonb,
    c_date date,
    c_time time,
    c_timestamp timestamp,
    c_timestamptz timestamptz,
    c_uuid uuid,
    c_bytea bytea,
    c_int_array integer[],
    c_smallint_array smallint[],
    c_bigint_array bigint[],
    c_text_array text[],
    c_varchar_array varchar(10)[],
    c_bool_array boolean[],
    c_numeric_array numeric(10,2)[],
    c_date_array date[],
    c_timestamp_array timestamp[],
    c_timestamptz_array timestamptz[],
    c_uuid_array uuid[],
    c_double_array double precision[],
    c_interval interval,
    c_money money,
    c_int4range int4range,
    c_daterange daterange,
    c_point point,
    c_inet inet,
    c_cidr cidr,
    c_macaddr macaddr,
    c_composite pair,
    c_timetz timetz,
    c_bit bit(4),
    c_varbit bit varying(8),
    c_xml xml,
    c_tsvector tsvector,
    c_domain_int posint,
    c_domain_text email
);
"""

#: What each column must become in Iceberg (PyIceberg's spelling of the type).
ALL_TYPES_ICEBERG = {
    "id": "int",
    "c_smallint": "int",
    "c_integer": "int",
    "c_bigint": "long",
    "c_numeric_10_2": "decimal(10, 2)",
    "c_numeric_38_10": "decimal(38, 10)",
    "c_numeric": "decimal(38, 18)",
    "c_numeric_50_5": "string",
    "c_real": "float",
    "c_double": "double",
    "c_boolean": "boolean",
    "c_text": "string",
    "c_varchar": "string",
    "c_char": "string",
    "c_enum": "string",
    "c_json": "string",
    "c_jsonb": "string",
    "c_date": "date",
    "c_time": "time",
    "c_timestamp": "timestamp",
    "c_timestamptz": "timestamptz",
    "c_uuid": "uuid",
    "c_bytea": "binary",
    "c_int_array": "list<int>",
    "c_smallint_array": "list<int>",
    "c_bigint_array": "list<long>",
    "c_text_array": "list<string>",
    "c_varchar_array": "list<string>",
    "c_bool_array": "list<boolean>",
    "c_numeric_array": "list<decimal(10, 2)>",
    "c_date_array": "list<date>",
    "c_timestamp_array": "list<timestamp>",
    "c_timestamptz_array": "list<timestamptz>",
    "c_uuid_array": "list<uuid>",
    "c_double_array": "list<double>",
    "c_interval": "string",
    "c_money": "string",
    "c_int4range": "string",
    "c_daterange": "string",
    "c_point": "string",
    "c_inet": "string",
    "c_cidr": "string",
    "c_macaddr": "string",
    "c_composite": "string",
    "c_timetz": "string",
    "c_bit": "string",
    "c_varbit": "string",
    "c_xml": "string",
    "c_tsvector": "string",
    "c_domain_int": "int",
    "c_domain_text": "string",
}

# Rows as {column: SQL literal}; columns left out are NULL.
ALL_TYPES_ROWS = [
    {   # ordinary values
        "id": "1", "c_smallint": "1", "c_integer": "42", "c_bigint": "1234567890123",
        "c_numeric_10_2": "12345678.90",
        "c_numeric_38_10": "1234567890123456789012345678.0123456789",
        "c_numeric": "1.5",
        "c_numeric_50_5": "123456789012345678901234567890123456789012345.12345",
        "c_real": "1.1", "c_double": "3.141592653589793", "c_boolean": "true",
        "c_text": "'hello'", "c_varchar": "'varchar'", "c_char": "'ab'", "c_enum": "'happy'",
        "c_json": """'{"b": 1,  "a": [1, 2]}'""", "c_jsonb": """'{"b": 1, "a": [1, 2]}'""",
        "c_date": "'2024-02-29'", "c_time": "'13:45:59.123456'",
        "c_timestamp": "'2024-02-29 13:45:59.123456'",
        "c_timestamptz": "'2024-02-29 13:45:59.123456+00'",
        "c_uuid": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "c_bytea": r"'\x00ff10'",
        "c_int_array": "'{1,NULL,3}'", "c_smallint_array": "'{-1,2}'",
        "c_bigint_array": "'{9223372036854775807,-1}'",
        "c_text_array": """'{"a","b c",NULL,"","quote\\"d"}'""", "c_varchar_array": "'{x,yy}'",
        "c_bool_array": "'{true,false,NULL}'", "c_numeric_array": "'{1.10,-2.25,NULL}'",
        "c_date_array": "'{2024-01-01,NULL}'",
        "c_timestamp_array": """'{"2024-01-01 10:00:00","1999-12-31 23:59:59.5"}'""",
        "c_timestamptz_array": """'{"2024-01-01 00:00:00+00","1999-12-31 23:59:59.5+02"}'""",
        "c_uuid_array": "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'",
        "c_double_array": "'{1.5,-0.25}'",
        "c_interval": "'1 year 2 mons 3 days 04:05:06.789'", "c_money": "1234.56",
        "c_int4range": "'[1,10)'", "c_daterange": "'[2024-01-01,2024-02-01)'",
        "c_point": "'(1.5,2.5)'", "c_inet": "'192.168.0.1/24'", "c_cidr": "'10.0.0.0/8'",
        "c_macaddr": "'08:00:2b:01:02:03'", "c_composite": "ROW(1, 'x y')",
        "c_timetz": "'12:34:56+05:30'", "c_bit": "B'1010'", "c_varbit": "B'101'",
        "c_xml": "'<a>1</a>'", "c_tsvector": "'the quick brown fox'",
        "c_domain_int": "7", "c_domain_text": "'a@b.c'",
    },
    {"id": "2"},  # every other column NULL
    {   # minimums, empties, special floats
        "id": "3", "c_smallint": "-32768", "c_integer": "-2147483648",
        "c_bigint": "-9223372036854775808", "c_numeric_10_2": "-99999999.99",
        "c_numeric_38_10": "-9999999999999999999999999999.9999999999",
        "c_numeric": "0.000000000000000001", "c_numeric_50_5": "-0.00001",
        "c_real": "'NaN'", "c_double": "'-Infinity'", "c_boolean": "false",
        "c_text": "''", "c_varchar": "''", "c_char": "''", "c_enum": "'sad'",
        "c_json": "'[]'", "c_jsonb": "'{}'",
        "c_date": "'0001-01-01'", "c_time": "'00:00:00'", "c_timestamp": "'0001-01-01 00:00:00'",
        # local mean time: Postgres prints this with a seconds offset in Asia/Kolkata
        "c_timestamptz": "'1900-01-01 00:00:00+00'",
        "c_uuid": "'00000000-0000-0000-0000-000000000000'", "c_bytea": "''",
        "c_int_array": "'{}'", "c_smallint_array": "'{}'", "c_bigint_array": "'{}'",
        "c_text_array": "'{}'", "c_varchar_array": "'{}'", "c_bool_array": "'{}'",
        "c_numeric_array": "'{}'", "c_date_array": "'{}'", "c_timestamp_array": "'{}'",
        "c_timestamptz_array": "'{}'", "c_uuid_array": "'{}'", "c_double_array": "'{}'",
        "c_interval": "'-1 days'", "c_money": "-0.01", "c_int4range": "'empty'",
        "c_daterange": "'(,)'", "c_point": "'(0,0)'", "c_inet": "'::1'", "c_cidr": "'::/0'",
        "c_macaddr": "'00:00:00:00:00:00'", "c_composite": "ROW(NULL, NULL)",
        "c_timetz": "'00:00:00-12'", "c_bit": "B'0000'", "c_varbit": "B''", "c_xml": "''",
        "c_tsvector": "''", "c_domain_int": "1", "c_domain_text": "''",
    },
    {   # maximums, unicode, large (TOASTed) values
        "id": "4", "c_smallint": "32767", "c_integer": "2147483647",
        "c_bigint": "9223372036854775807", "c_numeric_10_2": "99999999.99",
        "c_numeric_38_10": "9999999999999999999999999999.9999999999",
        "c_numeric": "99999999999999999999.999999999999999999",
        "c_numeric_50_5": "999999999999999999999999999999999999999999999.99999",
        "c_real": "'Infinity'", "c_double": "'NaN'", "c_boolean": "true",
        "c_text": "repeat('héllo wörld ✓ 😀 ', 2000)", "c_varchar": "'ünïcödé 😀'",
        "c_char": "'äö'", "c_enum": "'ok'",
        "c_json": """'{"k": "\\u00e9", "n": 1.000}'""",
        "c_jsonb": """'{"k": "\\u00e9", "n": 1.000, "nested": {"z": [true, null]}}'""",
        "c_date": "'9999-12-31'", "c_time": "'23:59:59.999999'",
        "c_timestamp": "'9999-12-31 23:59:59.999999'",
        "c_timestamptz": "'9999-12-30 00:00:00+00'",
        "c_uuid": "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
        "c_bytea": "decode(repeat('00ff7f80', 25000), 'hex')",
        "c_int_array": "'{2147483647}'", "c_smallint_array": "'{32767}'",
        "c_bigint_array": "'{-9223372036854775808}'", "c_text_array": "'{ünï,😀}'",
        "c_varchar_array": "'{z}'", "c_bool_array": "'{true}'",
        "c_numeric_array": "'{99999999.99}'", "c_date_array": "'{9999-12-31}'",
        "c_timestamp_array": """'{"0001-01-01 00:00:00"}'""",
        "c_timestamptz_array": """'{"1900-01-01 00:00:00+00"}'""",
        "c_uuid_array": "'{ffffffff-ffff-ffff-ffff-ffffffffffff,NULL}'",
        "c_double_array": "'{NaN,Infinity,-Infinity,NULL}'",
        "c_interval": "'178000000 years'", "c_money": "'92233720368547758.07'",
        "c_int4range": "'[-2147483648,2147483647)'", "c_daterange": "'[2000-01-01,)'",
        "c_point": "'(-1e+300,1e-300)'", "c_inet": "'255.255.255.255'",
        "c_cidr": "'2001:db8::/32'", "c_macaddr": "'ff:ff:ff:ff:ff:ff'",
        "c_composite": """ROW(2147483647, 'quote " and comma ,')""",
        "c_timetz": "'23:59:59.999999+14'", "c_bit": "B'1111'", "c_varbit": "B'11111111'",
        "c_xml": """'<r a="1">ü</r>'""", "c_tsvector": "'a:1 b:2'",
        "c_domain_int": "2147483647", "c_domain_text": "'x@y.z'",
    },
    {   # around the epoch; an unconstrained numeric with a long scale that still fits exactly
        "id": "5", "c_numeric": "-12345678901234567890.123456789012345678",
        "c_numeric_10_2": "-0.01", "c_numeric_38_10": "0", "c_numeric_50_5": "0",
        "c_real": "3.4028235e+38", "c_double": "5e-324",
        "c_date": "'1970-01-01'", "c_time": "'12:00:00'",
        "c_timestamp": "'1969-12-31 23:59:59.999999'",
        "c_timestamptz": "'1969-12-31 23:59:59.999999+00'",
        "c_text": "E'line1\\nline2\\ttab \\\\ backslash'",
    },
    {   # an unconstrained numeric whose written scale exceeds 18 but whose value fits exactly
        "id": "6", "c_numeric": "2.50000000000000000000000000",
        "c_real": "-0.5", "c_double": "-1e+308",
    },
]


def insert_rows(db, table: str, rows: list[dict]) -> None:
    for row in rows:
        cols = ", ".join(row)
        vals = ", ".join(row.values())
        db.execute(f"INSERT INTO {table} ({cols}) VALUES ({vals})")


def create_all_types(db) -> None:
    db.execute(ALL_TYPES_DDL)
    insert_rows(db, "all_types", ALL_TYPES_ROWS)


def current_lsn(db) -> int:
    return lsn_to_int(db.scalar("SELECT pg_current_wal_lsn()::text"))


def assert_snapshot_lsn(skippr: Skippr, table: str, db) -> str:
    """The current snapshot records the source LSN it covers, and it is a real LSN of this
    server (not past the server's current position)."""
    snap = skippr.table(table).current_snapshot()
    assert snap is not None, f"Iceberg table {table} has no current snapshot"
    summary = dict(snap.summary.additional_properties)
    lsn = summary.get("skippr.lsn")
    assert lsn is not None, f"snapshot summary of {table} lacks skippr.lsn: {summary}"
    assert LSN_RE.match(lsn), f"skippr.lsn {lsn!r} is not a Postgres LSN"
    assert 0 < lsn_to_int(lsn) <= current_lsn(db), f"skippr.lsn {lsn} is not a position of this server"
    return lsn


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cdc_mode", ["snapshot_then_cdc", "snapshot_only"])
def test_every_type_round_trips_exactly(skippr: Skippr, db, cdc_mode):
    create_all_types(db)
    skippr.write_config(["all_types"], cdc_mode=cdc_mode)
    skippr.sync_once()

    table = skippr.table("all_types")
    types = iceberg_type_strings(table)
    wrong = {c: (want, types.get(c)) for c, want in ALL_TYPES_ICEBERG.items() if types.get(c) != want}
    assert not wrong, f"Iceberg types differ from the mapping (column: (expected, got)): {wrong}"
    assert list(types) == list(ALL_TYPES_ICEBERG), "column order differs from Postgres"
    assert table.format_version == 2
    assert table.schema().identifier_field_names() == {"id"}

    skippr.assert_table_matches("all_types")
    assert_snapshot_lsn(skippr, "all_types", db)


def test_several_tables_composite_key_empty_table_and_rerun(skippr: Skippr, db):
    db.execute("""
        CREATE SCHEMA sales;
        CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email varchar(100));
        CREATE TABLE orders (
            customer_id bigint NOT NULL, order_no integer NOT NULL,
            amount numeric(12,2), created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (customer_id, order_no));
        CREATE TABLE sales.invoices (id uuid PRIMARY KEY, total double precision, paid boolean);
        CREATE TABLE empty_table (id integer PRIMARY KEY, note text);
        CREATE TABLE not_configured (id integer PRIMARY KEY);
        INSERT INTO customers SELECT i, 'customer ' || i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'c' || i || '@example.com' END
            FROM generate_series(1, 500) i;
        INSERT INTO orders SELECT c, o, (c * 100 + o) / 7.0, timestamptz '2024-01-01 00:00:00+00' + (c * o) * interval '1 minute'
            FROM generate_series(1, 200) c, generate_series(1, 5) o;
        INSERT INTO sales.invoices SELECT md5(i::text)::uuid, i * 1.25, i % 2 = 0 FROM generate_series(1, 300) i;
        INSERT INTO not_configured VALUES (1);
    """)
    skippr.write_config(["customers", "orders", "sales.invoices", "empty_table"])
    skippr.sync_once()

    rows = catalog_rows(skippr.warehouse)
    assert {(r["catalog_name"], r["table_namespace"]) for r in rows} == {("skippr", "analytics")}, rows
    cat = skippr.catalog()
    assert ("analytics",) in cat.list_namespaces()
    names = {t[-1] for t in cat.list_tables("analytics")}
    assert names == {"customers", "orders", "sales_invoices", "empty_table"}, names

    for qualified in ("customers", "orders", "sales.invoices", "empty_table"):
        spec = skippr.assert_table_matches(qualified)
        t = skippr.table(spec.iceberg_name)
        assert t.format_version == 2
        assert t.schema().identifier_field_names() == set(spec.primary_key), qualified
    assert skippr.table("orders").schema().identifier_field_names() == {"customer_id", "order_no"}
    assert skippr.read_pyiceberg("empty_table") == []
    assert [f.name for f in skippr.table("empty_table").schema().fields] == ["id", "note"]

    first = {}
    for name in ("customers", "orders", "sales_invoices"):
        assert_snapshot_lsn(skippr, name, db)
    for name in ("customers", "orders", "sales_invoices", "empty_table"):
        snap = skippr.table(name).current_snapshot()
        first[name] = snap.snapshot_id if snap else None

    # a second run finds the snapshot done: nothing copied again, no new Iceberg snapshot
    skippr.sync_once()
    for name, snap_id in first.items():
        snap = skippr.table(name).current_snapshot()
        assert (snap.snapshot_id if snap else None) == snap_id, f"{name}: a second sync --once committed again"
    for qualified in ("customers", "orders", "sales.invoices", "empty_table"):
        skippr.assert_table_matches(qualified)


def test_snapshot_then_cdc_creates_publication_and_slot(skippr: Skippr, db):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'a'), (2, 'b');")
    skippr.write_config(["items"], cdc_mode="snapshot_then_cdc")
    skippr.sync_once()
    slots = db.execute("SELECT slot_name, plugin, slot_type FROM pg_replication_slots WHERE database = current_database()")
    assert slots, "snapshot_then_cdc created no replication slot"
    assert all(s[1] == "pgoutput" and s[2] == "logical" for s in slots), slots
    pub_tables = db.execute("SELECT pubname, schemaname, tablename FROM pg_publication_tables")
    assert any(r[1] == "public" and r[2] == "items" for r in pub_tables), \
        f"no publication covers public.items: {pub_tables}"
    skippr.assert_table_matches("items")


def test_snapshot_only_needs_no_replication_privilege(skippr: Skippr, db):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text); INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 100) i;")
    db.create_role("reader_only", "reader-pw-1", replication=False)
    skippr.write_config(["items"], cdc_mode="snapshot_only", user="reader_only", password="reader-pw-1")
    skippr.sync_once()
    skippr.assert_table_matches("items")
    slots = db.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")
    assert slots == [], f"snapshot_only left a replication slot: {slots}"


def test_snapshot_then_cdc_without_replication_privilege_fails_clearly(skippr: Skippr, db):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY); INSERT INTO items VALUES (1);")
    db.create_role("no_repl", "no-repl-pw-1", replication=False)
    # everything else a publication needs is there: only REPLICATION is missing
    db.execute("ALTER TABLE items OWNER TO no_repl")
    db.execute(f'GRANT CREATE ON DATABASE "{db.name}" TO no_repl')
    skippr.write_config(["items"], cdc_mode="snapshot_then_cdc", user="no_repl", password="no-repl-pw-1")
    proc = skippr.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "succeeded without REPLICATION privilege")
    assert "replication" in proc.stderr.lower(), describe_run(proc, "does not say REPLICATION is missing")


def test_md5_password_authentication(skippr: Skippr, db):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'x');")
    db.create_role("md5_user", "md5-pw-1", replication=False, md5=True)
    stored = db.scalar("SELECT rolpassword FROM pg_authid WHERE rolname = 'md5_user'")
    assert stored.startswith("md5"), "fixture did not store an md5 password"
    skippr.write_config(["items"], cdc_mode="snapshot_only", user="md5_user", password="md5-pw-1")
    skippr.sync_once()
    skippr.assert_table_matches("items")


def test_warehouse_is_relative_to_the_config_file(skippr: Skippr, db, tmp_path: Path):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY); INSERT INTO items VALUES (1);")
    skippr.write_config(["items"], cdc_mode="snapshot_only")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    skippr.sync_once(cwd=elsewhere)
    assert (skippr.workdir / "warehouse" / "catalog.db").exists()
    assert not (elsewhere / "warehouse").exists(), "warehouse resolved against the working directory"
    skippr.assert_table_matches("items")


@pytest.mark.parametrize(
    "pg_type,bad_literal",
    [
        ("numeric", "1.0000000000000000001"),         # 19 fractional digits: would round
        ("numeric", "123456789012345678901"),         # 21 integer digits: overflows decimal(38,18)
        ("numeric", "'NaN'"),
        ("date", "'infinity'"),
        ("timestamp", "'-infinity'"),
        ("timestamptz", "'infinity'"),
    ],
)
def test_unrepresentable_value_fails_naming_table_and_column(skippr: Skippr, db, pg_type, bad_literal):
    good = {"numeric": "1.25", "date": "'2024-01-01'", "timestamp": "'2024-01-01 00:00:00'",
            "timestamptz": "'2024-01-01 00:00:00+00'"}[pg_type]
    db.execute(f"CREATE TABLE weird_values (id integer PRIMARY KEY, odd_column {pg_type});"
               f"INSERT INTO weird_values VALUES (1, {good}), (2, {bad_literal}), (3, {good});")
    skippr.write_config(["weird_values"], cdc_mode="snapshot_only")
    proc = skippr.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, f"accepted {pg_type} {bad_literal}")
    assert "weird_values" in proc.stderr and "odd_column" in proc.stderr, \
        describe_run(proc, "error does not name the table and the column")

    # nothing rounded or substituted reached readers
    if (skippr.warehouse / "catalog.db").exists():
        from pyiceberg.exceptions import NoSuchTableError
        try:
            rows = skippr.read_pyiceberg("weird_values")
        except NoSuchTableError:
            rows = []
        assert not any(r["id"] == 2 for r in rows), f"the unrepresentable value was written as {rows}"

    # and a second run does not pretend the table is done
    again = skippr.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(again)
    assert again.returncode != 0, describe_run(again, "second run succeeded after the first one failed on data")


# --------------------------------------------------------------------------------------------
# Large tables and interruption
# --------------------------------------------------------------------------------------------

BIG_ROWS = 1_020_000

BIG_DDL = f"""
CREATE TABLE big (id bigint PRIMARY KEY, n integer, t text NOT NULL, ts timestamptz NOT NULL);
INSERT INTO big
    SELECT i, CASE WHEN i % 10 = 0 THEN NULL ELSE (i * 7) % 1000003 END, md5(i::text),
           timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second'
    FROM generate_series(1, {BIG_ROWS}) i;
-- holes and moved tuples, so that ctid-range splitting meets dead tuples and updated rows
DELETE FROM big WHERE id % 97 = 0;
UPDATE big SET t = t || '-updated' WHERE id % 101 = 0;
ANALYZE big;
"""


def big_fingerprint_postgres(db) -> tuple[int, str]:
    count, digest = db.execute(
        "SELECT count(*), md5(string_agg(concat_ws(':', id, coalesce(n::text, ''), t, "
        "(extract(epoch FROM ts) * 1000000)::bigint), E'\\n' ORDER BY id)) FROM big"
    )[0]
    return count, digest


def big_fingerprint_duckdb(metadata_location: str) -> tuple[int, int, str]:
    con = duckdb_connect()
    try:
        return con.execute(
            "SELECT count(*), count(DISTINCT id), md5(string_agg(concat_ws(':', id::VARCHAR, "
            "coalesce(n::VARCHAR, ''), t, epoch_us(ts)::VARCHAR), chr(10) ORDER BY id)) "
            f"FROM iceberg_scan('{metadata_location}')"
        ).fetchone()
    finally:
        con.close()


def big_fingerprint_pyiceberg(table) -> tuple[int, int, str]:
    import pyarrow as pa
    import pyarrow.compute as pc

    arrow = table.scan().to_arrow().sort_by([("id", "ascending")])
    s = pa.large_string()
    ts_us = pc.cast(pc.cast(arrow["ts"], pa.timestamp("us", tz="UTC")), pa.int64())
    n = pc.fill_null(pc.cast(arrow["n"], s), "")
    lines = pc.binary_join_element_wise(pc.cast(arrow["id"], s), n, pc.cast(arrow["t"], s),
                                        pc.cast(ts_us, s), pa.scalar(":", s))
    digest = hashlib.md5("\n".join(lines.to_pylist()).encode()).hexdigest()
    return arrow.num_rows, len(pc.unique(arrow["id"])), digest


def assert_big_matches(skippr: Skippr, db) -> None:
    pg_count, pg_digest = big_fingerprint_postgres(db)
    t = skippr.table("big")
    py = big_fingerprint_pyiceberg(t)
    assert py == (pg_count, pg_count, pg_digest), \
        f"PyIceberg (rows, distinct ids, md5) = {py}, Postgres (rows, md5) = {(pg_count, pg_digest)}"
    dd = big_fingerprint_duckdb(t.metadata_location)
    assert dd == (pg_count, pg_count, pg_digest), \
        f"DuckDB (rows, distinct ids, md5) = {dd}, Postgres (rows, md5) = {(pg_count, pg_digest)}"


def test_million_row_table(skippr: Skippr, db):
    db.execute(BIG_DDL)
    assert db.scalar("SELECT count(*) FROM big") >= 1_000_000
    skippr.write_config(["big"], extra_source={"snapshot_parallelism": 2, "parquet_target_file_size_mb": 16})
    started = time.monotonic()
    skippr.sync_once()
    elapsed = time.monotonic() - started
    print(f"snapshot of {BIG_ROWS} rows took {elapsed:.1f}s")
    assert_big_matches(skippr, db)
    assert skippr.table("big").schema().identifier_field_names() == {"id"}
    assert_snapshot_lsn(skippr, "big", db)


#: About a quarter of the big table's Parquet output: SIGKILL lands well inside the copy.
KILL_AFTER_BYTES = 8 * 2**20


def _bytes_written(root: Path) -> int:
    """Total size of the Parquet files under root (files may vanish while we look)."""
    total = 0
    for p in root.rglob("*.parquet"):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_interrupted_snapshot_is_invisible_then_completed(skippr: Skippr, db):
    db.execute(BIG_DDL)
    skippr.write_config(["big"], extra_source={"snapshot_parallelism": 2, "parquet_target_file_size_mb": 1})

    proc = skippr.start("sync", "--pipeline", "app", "--once")
    reason = None
    started = time.monotonic()
    try:
        with db.connect() as conn:
            while reason is None:
                if proc.poll() is not None:
                    break
                written = _bytes_written(skippr.workdir)
                if written >= KILL_AFTER_BYTES:
                    reason = f"{written / 2**20:.1f} MiB of data files written"
                    break
                busy = conn.execute(
                    "SELECT extract(epoch FROM now() - query_start) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active' "
                    "AND query ILIKE '%big%'"
                ).fetchall()
                if busy and max(b[0] for b in busy) > 4.0:
                    reason = "reading the table for 4s"
                    break
                if time.monotonic() - started > 300:
                    reason = "timeout"
                    break
                time.sleep(0.02)
        if reason is not None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = (skippr.workdir / "bg.stderr").read_text(errors="replace")
    assert "panicked" not in stderr, stderr[-4000:]
    assert reason is not None, (
        f"sync finished (exit {proc.returncode}) before it could be interrupted, "
        f"after {time.monotonic() - started:.1f}s; stderr:\n{stderr[-4000:]}"
    )
    assert reason != "timeout", f"sync neither progressed nor finished in 300s; stderr:\n{stderr[-4000:]}"
    assert proc.returncode == -signal.SIGKILL
    print(f"killed after {time.monotonic() - started:.1f}s: {reason}")

    # readers see nothing, or an empty table, or every row: never part of the table
    pg_count = db.scalar("SELECT count(*) FROM big")
    if (skippr.warehouse / "catalog.db").exists():
        from pyiceberg.exceptions import NoSuchTableError, NoSuchNamespaceError
        try:
            t = skippr.table("big")
        except (NoSuchTableError, NoSuchNamespaceError):
            t = None
        if t is not None and t.current_snapshot() is not None:
            seen = t.scan().to_arrow().num_rows
            print(f"after the kill readers see {seen} of {pg_count} rows")
            assert seen in (0, pg_count), f"after SIGKILL ({reason}) readers see {seen} of {pg_count} rows"
            con = duckdb_connect()
            try:
                seen_dd = con.execute(f"SELECT count(*) FROM iceberg_scan('{t.metadata_location}')").fetchone()[0]
            finally:
                con.close()
            assert seen_dd in (0, pg_count), f"after SIGKILL ({reason}) DuckDB sees {seen_dd} of {pg_count} rows"

    # the next run completes the table with exactly the Postgres rows
    skippr.sync_once()
    assert_big_matches(skippr, db)
    assert_snapshot_lsn(skippr, "big", db)
    snap_id = skippr.table("big").current_snapshot().snapshot_id
    skippr.sync_once()
    assert skippr.table("big").current_snapshot().snapshot_id == snap_id
