"""Spark 3.5 with the Iceberg 1.10 runtime, an engine users run against the same warehouse,
reads Skippr's tables equal to Postgres after a snapshot and CDC (inserts, updates, deletes,
key changes: position deletes), with Spark's own types, every type of the mapping but `time`
(Spark has none); and plans the same data files as PyIceberg for a filtered read. One Spark
session serves every test (the `spark` fixture, tests/spark.py)."""

from __future__ import annotations

from typing import Sequence

from conftest import Database, Skippr, assert_rows_equal, expected_rows, pg_table_spec
from test_cdc import MAIN_TABLES, assert_position_deletes_only, setup_main, tx
from test_snapshot import ALL_TYPES_DDL, ALL_TYPES_ROWS, insert_rows


def assert_spark_matches(spark, skippr: Skippr, db: Database, tables: Sequence[str]) -> None:
    """Every table, read by Spark at its current snapshot, equals Postgres row by row."""
    for t in tables:
        spec = pg_table_spec(db, t)
        actual = spark.read_rows(skippr.warehouse, skippr.workspace, spec.iceberg_name, spec.primary_key)
        assert_rows_equal(expected_rows(db, spec), actual, spec, "spark")


def spark_types(spark, skippr: Skippr, table: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString()
            for f in spark.table(skippr.warehouse, skippr.workspace, table).schema.fields}


def pyiceberg_files(skippr: Skippr, table: str, row_filter: str) -> tuple[set[str], set[str]]:
    """The data and delete files PyIceberg plans for a filtered scan."""
    tasks = list(skippr.table(table).scan(row_filter=row_filter).plan_files())
    return {t.file.file_path for t in tasks}, {d.file_path for t in tasks for d in t.delete_files}


def test_spark_reads_snapshot_and_cdc_equal_to_postgres(skippr: Skippr, db, spark):
    setup_main(db)
    skippr.write_config(MAIN_TABLES)
    skippr.sync_once()
    assert_spark_matches(spark, skippr, db, MAIN_TABLES)

    # Spark's own types: a timestamptz is a timestamp (an instant), a timestamp without zone
    # stays local (timestamp_ntz), numerics keep their precision and scale
    types = spark_types(spark, skippr, "accounts")
    assert types == {
        "id": "bigint", "name": "string", "balance": "decimal(12,2)", "ratio": "decimal(38,18)",
        "opened_at": "timestamp", "ext_id": "string", "attrs": "string", "tags": "array<string>",
        "active": "boolean", "born": "date", "seen": "timestamp_ntz", "score": "double",
        "counts": "array<int>",
    }, types
    assert spark_types(spark, skippr, "orders")["amount"] == "decimal(10,2)"

    # inserts, updates (values to and from NULL, timestamps moved), deletes and key changes,
    # in one transaction and in several
    tx(db,
       "SELECT add_accounts(301, 400)",
       "SELECT add_orders(51, 60, 3)",
       "SELECT add_invoices(101, 120)",
       "UPDATE accounts SET name = name || ' v2', balance = NULL, "
       "opened_at = opened_at + interval '1 day 0.000001 sec', seen = NULL WHERE id % 7 = 0",
       "UPDATE accounts SET balance = 0.01, ratio = NULL, tags = '{}' WHERE id % 11 = 0")
    db.execute("DELETE FROM accounts WHERE id % 5 = 1")
    db.execute("UPDATE orders SET order_no = order_no + 100 WHERE customer_id % 4 = 0")
    db.execute("DELETE FROM orders WHERE note IS NULL AND customer_id % 3 = 0")
    db.execute("UPDATE sales.invoices SET paid = NOT paid, total = -total WHERE issued < date '2024-01-20'")
    db.execute("DELETE FROM sales.invoices WHERE issued > date '2024-04-01'")
    skippr.sync_once()
    assert_position_deletes_only(skippr, "accounts", expect_some=True)
    assert_spark_matches(spark, skippr, db, MAIN_TABLES)

    # only new ids: a data file whose id statistics lie above every earlier file's
    db.execute("SELECT add_accounts(1001, 1100)")
    db.execute("DELETE FROM accounts WHERE id IN (1002, 1003)")
    skippr.sync_once()
    assert_spark_matches(spark, skippr, db, MAIN_TABLES)

    # a filtered read: Spark plans exactly the files PyIceberg plans, fewer than the whole table
    df = spark.table(skippr.warehouse, skippr.workspace, "accounts")
    everything = spark.scanned_files(df)
    assert (set(everything.data), set(everything.deletes)) == pyiceberg_files(skippr, "accounts", "true")
    listed = spark.metadata_table(skippr.warehouse, skippr.workspace, "accounts", "files").select("content", "file_path")
    assert {(r[0], r[1]) for r in listed.collect()} == \
        {(0, f) for f in everything.data} | {(1, f) for f in everything.deletes}
    filtered = spark.scanned_files(df.filter("id > 1050"))
    assert (set(filtered.data), set(filtered.deletes)) == pyiceberg_files(skippr, "accounts", "id > 1050")
    assert 0 < len(filtered.data) < len(everything.data), (filtered, everything)
    assert spark.scanned_files(df.filter("id > 5000")).data == frozenset()
    assert sorted(r["id"] for r in spark.rows(df.filter("id > 1050"))) == \
        [r[0] for r in db.execute("SELECT id FROM accounts WHERE id > 1050 ORDER BY id")]


def test_spark_reads_every_type_but_time(skippr: Skippr, db, spark):
    """The type test's rows (extremes, NULLs, arrays with NULLs, the lossless text fallbacks),
    without the `time` column: Spark refuses a table that has one ("Spark does not support time
    fields")."""
    db.execute(ALL_TYPES_DDL)
    insert_rows(db, "all_types", ALL_TYPES_ROWS)
    db.execute("ALTER TABLE all_types DROP COLUMN c_time")
    skippr.write_config(["all_types"])
    skippr.sync_once()
    assert_spark_matches(spark, skippr, db, ["all_types"])
    db.execute("UPDATE all_types SET id = id + 100 WHERE id % 2 = 0")
    db.execute("UPDATE all_types SET c_text = NULL, c_timestamptz = c_timestamptz - interval '1 hour' WHERE id % 3 = 0")
    skippr.sync_once()
    assert_spark_matches(spark, skippr, db, ["all_types"])
