"""`skipprd query "SQL"` over the synced Iceberg tables (`analytics.<table>`), in the three
output formats, compared with the same SQL run on Postgres."""

from __future__ import annotations

import csv
import io
import json
import secrets
from decimal import Decimal

import pytest

from conftest import Database, Skippr, _drop_database, assert_no_panic, describe_run

SETUP = """
CREATE TABLE customers (id integer PRIMARY KEY, name text, city text, balance numeric(10,2),
                        active boolean, joined date);
INSERT INTO customers VALUES
    (1, 'Ada', 'London', 100.50, true, '2020-01-01'),
    (2, 'Bob, Jr.', 'Paris', -5.25, false, '2021-06-15'),
    (3, 'Cé "Q"', 'Berlin', NULL, true, NULL),
    (4, NULL, 'London', 0, NULL, '2024-02-29');
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer NOT NULL, amount numeric(10,2) NOT NULL);
INSERT INTO orders SELECT i, 1 + i % 4, (i * 3.75)::numeric(10,2) FROM generate_series(1, 40) i;
CREATE TABLE empty_table (id integer PRIMARY KEY);
CREATE TABLE amounts (id integer PRIMARY KEY, big numeric(38,10), tiny numeric(12,10));
INSERT INTO amounts VALUES (1, 1234567890123456789012345678.0123456789, 0.0000000001),
                           (2, -9999999999999999999999999999.9999999999, 1.1);
"""


@pytest.fixture(scope="module")
def synced(pg, tmp_path_factory):
    """One database, synced once, shared by the read-only query tests of this module."""
    name = "t_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        db = Database(pg, name)
        db.execute(SETUP)
        workdir = tmp_path_factory.mktemp("query") / "work"
        workdir.mkdir()
        skippr = Skippr(db=db, workdir=workdir)
        skippr.write_config(["customers", "orders", "empty_table", "amounts"], cdc_mode="snapshot_only")
        skippr.sync_once()
        yield skippr
    finally:
        _drop_database(pg, name)


def query(skippr: Skippr, sql: str, fmt: str | None = None, check: bool = True):
    args = ["query", sql]
    if fmt:
        args += ["--format", fmt]
    proc = skippr.run(*args, check=False)
    assert_no_panic(proc)
    if check:
        assert proc.returncode == 0, describe_run(proc)
    return proc


def csv_rows(proc) -> list[list[str]]:
    return list(csv.reader(io.StringIO(proc.stdout)))


def json_rows(proc) -> list[dict]:
    rows = []
    for line in proc.stdout.splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line, parse_float=Decimal))
            except json.JSONDecodeError as e:
                pytest.fail(describe_run(proc, f"line is not a JSON object: {line!r} ({e})"))
    return rows


def table_lines(proc) -> list[str]:
    return [l for l in proc.stdout.splitlines() if l.strip()]


def test_table_format_is_aligned_with_header_separator_and_footer(synced):
    proc = query(synced, "SELECT id, name, city FROM analytics.customers ORDER BY id")
    lines = table_lines(proc)
    assert len(lines) == 1 + 1 + 4 + 1, describe_run(proc, "expected header, separator, 4 rows, footer")
    header, sep, *rows, footer = lines
    assert [h.strip() for h in header.split("|")] == ["id", "name", "city"], header
    assert set(sep.strip()) <= {"-", "+"} and "+" in sep and "-" in sep, f"separator {sep!r}"
    assert footer.strip() == "(4 rows)", footer
    bars = [i for i, ch in enumerate(header) if ch == "|"]
    pluses = [i for i, ch in enumerate(sep) if ch == "+"]
    assert bars == pluses, f"separator '+' at {pluses}, header '|' at {bars}:\n{proc.stdout}"
    for row in rows:
        assert [i for i, ch in enumerate(row) if ch == "|"] == bars, f"row not aligned with header:\n{proc.stdout}"
    cells = [[c.strip() for c in r.split("|")] for r in rows]
    assert cells == [["1", "Ada", "London"], ["2", "Bob, Jr.", "Paris"], ["3", 'Cé "Q"', "Berlin"], ["4", "", "London"]]


def test_table_format_single_and_zero_rows(synced):
    one = table_lines(query(synced, "SELECT count(*) AS n FROM analytics.customers"))
    assert one[-1].strip() in ("(1 row)", "(1 rows)"), one
    assert one[0].strip() == "n" and one[2].strip() == "4", one
    zero = table_lines(query(synced, "SELECT id FROM analytics.customers WHERE id < 0"))
    assert zero[-1].strip() == "(0 rows)", zero
    assert zero[0].strip() == "id", zero


def test_csv_format(synced):
    proc = query(synced, "SELECT id, name, city, balance FROM analytics.customers ORDER BY id", "csv")
    rows = csv_rows(proc)
    assert rows[0] == ["id", "name", "city", "balance"], rows
    assert [r[:3] for r in rows[1:]] == [
        ["1", "Ada", "London"], ["2", "Bob, Jr.", "Paris"], ["3", 'Cé "Q"', "Berlin"], ["4", "", "London"]]
    assert [Decimal(r[3]) if r[3] else None for r in rows[1:]] == [Decimal("100.50"), Decimal("-5.25"), None, Decimal("0")]
    empty = csv_rows(query(synced, "SELECT id, name FROM analytics.customers WHERE id < 0", "csv"))
    assert empty == [["id", "name"]], empty


def test_unnamed_columns_are_named_as_postgres_names_them(synced):
    """The headers `skipprd query` prints are the ones psql prints for the same SQL."""
    sql = "SELECT count(*), sum(amount), max(id) + 1, o.id, CAST(o.customer_id AS text) FROM {s}orders o WHERE o.id = 7 GROUP BY o.id, o.customer_id"
    header = csv_rows(query(synced, sql.format(s="analytics."), "csv"))[0]
    with synced.db.connect() as conn:
        cur = conn.execute(sql.format(s=""))
        expected = [d.name for d in cur.description]
    assert header == expected == ["count", "sum", "?column?", "id", "customer_id"], header


def _dec(v):
    return None if v is None else Decimal(str(v))


def test_json_format_is_one_object_per_row(synced):
    proc = query(synced, "SELECT id, name, balance, active, joined FROM analytics.customers ORDER BY id", "json")
    rows = json_rows(proc)
    assert len(rows) == 4, describe_run(proc)
    for r in rows:
        assert set(r) == {"id", "name", "balance", "active", "joined"}, \
            f"every object must carry every column, NULL as null: {r}"
    assert [r["id"] for r in rows] == [1, 2, 3, 4]
    assert [r["name"] for r in rows] == ["Ada", "Bob, Jr.", 'Cé "Q"', None]
    assert [_dec(r["balance"]) for r in rows] == [Decimal("100.50"), Decimal("-5.25"), None, Decimal("0")]
    assert [r["active"] for r in rows] == [True, False, True, None]
    assert [r["joined"] for r in rows] == ["2020-01-01", "2021-06-15", None, "2024-02-29"]
    assert json_rows(query(synced, "SELECT id FROM analytics.customers WHERE id < 0", "json")) == []


def test_aggregate_join_matches_postgres(synced):
    sql = ("SELECT c.city, count(*) AS n, sum(o.amount) AS total FROM {s}orders o "
           "JOIN {s}customers c ON c.id = o.customer_id GROUP BY c.city ORDER BY c.city")
    expected = synced.db.execute(sql.format(s="public."))
    rows = csv_rows(query(synced, sql.format(s="analytics."), "csv"))
    assert rows[0] == ["city", "n", "total"]
    got = [(r[0], int(r[1]), Decimal(r[2])) for r in rows[1:]]
    assert got == [(c, n, Decimal(t)) for c, n, t in expected]


def test_full_table_matches_postgres(synced):
    expected = synced.db.execute("SELECT id, customer_id, amount FROM orders ORDER BY id")
    rows = json_rows(query(synced, "SELECT * FROM analytics.orders ORDER BY id", "json"))
    got = [(r["id"], r["customer_id"], _dec(r["amount"])) for r in rows]
    assert got == [(i, c, Decimal(a)) for i, c, a in expected]


def test_decimals_are_printed_exactly(synced):
    expected = [("1", "1234567890123456789012345678.0123456789", "0.0000000001"),
                ("2", "-9999999999999999999999999999.9999999999", "1.1000000000")]
    rows = csv_rows(query(synced, "SELECT id, big, tiny FROM analytics.amounts ORDER BY id", "csv"))
    assert rows[0] == ["id", "big", "tiny"]
    assert [(r[0], Decimal(r[1]), Decimal(r[2])) for r in rows[1:]] == \
        [(i, Decimal(b), Decimal(t)) for i, b, t in expected], rows
    objs = json_rows(query(synced, "SELECT id, big, tiny FROM analytics.amounts ORDER BY id", "json"))
    assert [(str(o["id"]), _dec(o["big"]), _dec(o["tiny"])) for o in objs] == \
        [(i, Decimal(b), Decimal(t)) for i, b, t in expected], objs
    table = query(synced, "SELECT big FROM analytics.amounts ORDER BY id").stdout
    assert "1234567890123456789012345678.0123456789" in table, table


def test_empty_table(synced):
    rows = csv_rows(query(synced, "SELECT count(*) AS n FROM analytics.empty_table", "csv"))
    assert rows == [["n"], ["0"]]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM analytics.no_such_table",
    "SELECT no_such_column FROM analytics.customers",
    "SELEC 1",
])
def test_sql_error_exits_1_with_message(synced, sql):
    proc = query(synced, sql, check=False)
    assert proc.returncode == 1, describe_run(proc, "expected exit 1 for a SQL error")
    assert any(l.startswith("error:") for l in proc.stderr.splitlines()), describe_run(proc, "no `error: ...` line")
    assert proc.stdout.strip() == "", describe_run(proc, "printed results for a failed query")
