"""TPC-H on Skippr, shared by tests/test_tpch.py and benches/tpch_bench.py: the data and the 22
query texts of DuckDB's `tpch` extension (the duckdb-extension-tpch wheel), loaded into
Postgres with TPC-H's primary keys, a refresh that inserts, updates and deletes, and the rule
by which two answers are the same."""

from __future__ import annotations

import glob
import site
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

#: The tables in load order, with TPC-H's primary keys.
PRIMARY_KEYS = {
    "region": ["r_regionkey"],
    "nation": ["n_nationkey"],
    "supplier": ["s_suppkey"],
    "customer": ["c_custkey"],
    "part": ["p_partkey"],
    "partsupp": ["ps_partkey", "ps_suppkey"],
    "orders": ["o_orderkey"],
    "lineitem": ["l_orderkey", "l_linenumber"],
}
TABLES = list(PRIMARY_KEYS)

_PG_TYPES = {"BIGINT": "bigint", "INTEGER": "integer", "VARCHAR": "text", "DATE": "date"}


def _extension() -> str:
    for sp in [*site.getsitepackages(), *(p for p in sys.path if p.endswith("site-packages"))]:
        found = glob.glob(f"{sp}/duckdb_extension_tpch/**/tpch.duckdb_extension", recursive=True)
        if found:
            return found[0]
    raise RuntimeError(f"the duckdb-extension-tpch wheel is not installed in {sys.prefix}")


def generate(scale_factor: float):
    """An in-memory DuckDB holding TPC-H at `scale_factor` (dbgen), with the tpch extension
    loaded (its `tpch_queries()` gives the query texts)."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false",
                                 "allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{_extension()}'")
    con.execute(f"CALL dbgen(sf={scale_factor})")
    return con


def queries(duck) -> list[tuple[int, str]]:
    """The 22 queries: (number, text)."""
    return [(int(n), q) for n, q in duck.execute("SELECT query_nr, query FROM tpch_queries() ORDER BY 1").fetchall()]


def _pg_type(duck_type: str) -> str:
    if duck_type.startswith("DECIMAL"):
        return "numeric" + duck_type.removeprefix("DECIMAL")
    return _PG_TYPES[duck_type]


def load_postgres(duck, conn: psycopg.Connection, scratch: Path) -> dict[str, int]:
    """Creates the tables in `conn`'s database (public schema) with their primary keys and
    copies DuckDB's rows in through CSV files under `scratch`: {table: rows}."""
    counts = {}
    for table, key in PRIMARY_KEYS.items():
        columns = ", ".join(f"{name} {_pg_type(kind)} NOT NULL"
                            for name, kind, *_ in duck.execute(f"DESCRIBE {table}").fetchall())
        conn.execute(f"CREATE TABLE {table} ({columns}, PRIMARY KEY ({', '.join(key)}))")
        csv = scratch / f"{table}.csv"
        duck.execute(f"COPY {table} TO '{csv}' (FORMAT csv, HEADER false)")
        with conn.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN (FORMAT csv)") as copy, open(csv, "rb") as f:
            while chunk := f.read(1 << 20):
                copy.write(chunk)
        csv.unlink()
        counts[table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    conn.execute("ANALYZE")
    return counts


def refresh(conn: psycopg.Connection) -> None:
    """Changes in the spirit of TPC-H's refresh functions, in a few transactions: new orders
    with their line items (RF1), orders deleted with their line items (RF2), and updates of
    prices, discounts and balances that the queries aggregate."""
    top = conn.execute("SELECT max(o_orderkey) FROM orders").fetchone()[0]
    with conn.transaction():
        conn.execute("INSERT INTO orders SELECT o_orderkey + %s, o_custkey, o_orderstatus, o_totalprice, "
                     "o_orderdate, o_orderpriority, o_clerk, o_shippriority, o_comment "
                     "FROM orders WHERE o_orderkey %% 50 = 1", (top,))
        conn.execute("INSERT INTO lineitem SELECT l_orderkey + %s, l_partkey, l_suppkey, l_linenumber, "
                     "l_quantity, l_extendedprice, l_discount, l_tax, l_returnflag, l_linestatus, l_shipdate, "
                     "l_commitdate, l_receiptdate, l_shipinstruct, l_shipmode, l_comment "
                     "FROM lineitem WHERE l_orderkey %% 50 = 1", (top,))
    with conn.transaction():
        conn.execute("DELETE FROM lineitem WHERE l_orderkey % 50 = 2")
        conn.execute("DELETE FROM orders WHERE o_orderkey % 50 = 2")
    with conn.transaction():
        conn.execute("UPDATE lineitem SET l_discount = 0.10 - l_discount, l_extendedprice = l_extendedprice + 1 "
                     "WHERE l_orderkey % 13 = 0")
        conn.execute("UPDATE customer SET c_acctbal = c_acctbal + 100 WHERE c_custkey % 7 = 0")
        conn.execute("UPDATE partsupp SET ps_supplycost = ps_supplycost * 1.01 WHERE ps_partkey % 11 = 0")


def _num(v: Any) -> Any:
    if isinstance(v, (bool, str)) or v is None:
        return v
    try:
        return Decimal(str(v))
    except ArithmeticError:
        return v


def _same_value(e: Any, a: Any) -> bool:
    e, a = _num(e), _num(a)
    if isinstance(e, Decimal) and isinstance(a, Decimal):
        # Sums and counts are exact; an average may be rounded at another scale than
        # Postgres's (stricter than TPC-H's own rule, which allows a cent).
        return e == a or abs(e - a) <= max(abs(e) * Decimal("1e-9"), Decimal("1e-6"))
    return e == a


def _same_rows(expected: list[tuple], actual: list[tuple]) -> bool:
    return len(expected) == len(actual) and all(
        len(e) == len(a) and all(_same_value(x, y) for x, y in zip(e, a)) for e, a in zip(expected, actual))


def same_answer(sql: str, expected: list[tuple], actual: list[tuple]) -> bool:
    """Equal rows in the same order; rows tied in a query's ORDER BY may come in another
    order, so without a LIMIT the same rows in any order also count."""
    if _same_rows(expected, actual):
        return True
    if "limit" in sql.lower():
        return False
    key = lambda row: tuple(repr(_num(v)) for v in row)  # noqa: E731
    return _same_rows(sorted(expected, key=key), sorted(actual, key=key))
