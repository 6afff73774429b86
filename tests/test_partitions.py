"""Partitioned, sorted tables (`pipelines.<name>.tables.<table>.partition_by` / `sort_by`).

One table of 30 days of orders, partitioned by `day(created_at)` and `bucket(8, id)` and sorted
by `created_at`, goes through a snapshot, CDC rounds (inserts, updates that move rows between
days, deletes), a change of spec mid-stream and a compaction. After each step every reader
(PyIceberg, DuckDB, `skipprd query`) equals Postgres, and the metadata itself is checked: the
spec and sort order are the table's, each data file holds the rows of exactly one partition
(its manifest entry's), rows inside a file follow `sort_by`, every position-delete file is
scoped to one partition, and a filtered PyIceberg `plan_files()` returns only the matching
partition's files. Spark (3.5, Iceberg 1.10) reads the table equal to Postgres, across specs
too, and plans exactly PyIceberg's files for a one-day filter.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

from conftest import Database, Skippr, describe_run, free_port
from test_cdc import ALL_READERS, stop
from test_live import connect_gateway
from test_spark import assert_spark_matches

DAYS = 30
PER_DAY = 40
START = dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc)
LAYOUT = {"events": {"partition_by": ["day(created_at)", "bucket(8, id)"], "sort_by": ["created_at"]}}
MONTHLY = {"events": {"partition_by": ["month(created_at)"], "sort_by": ["created_at desc"]}}
MAINTENANCE = {"enabled": True, "check_interval": "1s", "compaction_min_files": 2}


def setup_events(db: Database) -> None:
    db.execute("DROP TABLE IF EXISTS events")
    db.execute(
        "CREATE TABLE events (id bigint PRIMARY KEY, created_at timestamptz NOT NULL,"
        " customer_id int, amount numeric(12,2), note text)")
    db.execute(
        "INSERT INTO events SELECT g, %s::timestamptz + (g %% %s) * interval '1 day' + g * interval '1 second',"
        " g %% 17, g * 1.25, 'note ' || g FROM generate_series(1, %s) g",
        (START, DAYS, DAYS * PER_DAY))


def write_config(skippr: Skippr, tables: dict[str, Any], compact: bool = False, query: dict | None = None) -> None:
    """Compaction only when asked: before that, the commits' own files are what is checked."""
    maintenance = MAINTENANCE if compact else {"enabled": False}
    skippr.write_config(["events"], query=query, extra_pipeline={
        "tables": tables, "maintenance": maintenance,
        # A transaction past 1 MiB is spilled and written in parts (see the large one below).
        "transaction_memory_budget_mb": 1})


def sync(skippr: Skippr) -> None:
    proc = skippr.run("sync", "--once", check=False)
    assert proc.returncode == 0, describe_run(proc, "sync --once failed")


def norm(v: Any) -> Any:
    """A partition value as Iceberg stores it (PyIceberg shows a day as a date)."""
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return (v - dt.date(1970, 1, 1)).days
    return v


def day_of(ts: dt.datetime) -> int:
    return (ts.astimezone(dt.timezone.utc).date() - dt.date(1970, 1, 1)).days


def expected_partition(spec, schema, row: dict) -> tuple:
    """The partition tuple of a row under `spec`, computed with PyIceberg's own transforms."""
    values = []
    for f in spec.fields:
        source = schema.find_field(f.source_id)
        values.append(f.transform.transform(source.field_type)(_iceberg_value(row[source.name], source.field_type)))
    return tuple(values)


def _iceberg_value(v: Any, t: Any) -> Any:
    if isinstance(v, dt.datetime):
        return int(v.timestamp() * 1_000_000)
    return v


def check_metadata(skippr: Skippr) -> None:
    """Each data file holds exactly its manifest entry's partition, in sort order; each
    delete file is scoped to one partition."""
    table = skippr.table("events")
    schema = table.schema()
    specs = table.specs()
    files = table.inspect.files().to_pylist()
    assert files, "the table has no files"
    partition_of: dict[str, tuple] = {}
    for f in files:
        if f["content"] != 0:
            continue
        spec = specs[f["spec_id"]]
        part = f["partition"] or {}
        got = tuple(norm(part.get(pf.name)) for pf in spec.fields)
        partition_of[f["file_path"]] = (f["spec_id"], got)
        rows = pq.read_table(f["file_path"].removeprefix("file://")).to_pylist()
        assert rows, f"empty data file {f['file_path']}"
        seen = {expected_partition(spec, schema, r) for r in rows}
        assert seen == {got}, f"{f['file_path']}: manifest partition {got}, rows of {seen}"
        order = table.sort_order()
        if f["spec_id"] == table.spec().spec_id and order.fields:
            field = order.fields[0]
            name = schema.find_field(field.source_id).name
            values = [r[name] for r in rows]
            want = sorted(values, reverse=field.direction.name == "DESC")
            assert values == want, f"{f['file_path']}: rows not in sort order {order}"
    for f in files:
        if f["content"] != 1:
            continue
        refs = set(pq.read_table(f["file_path"].removeprefix("file://"), columns=["file_path"])
                   .column("file_path").to_pylist())
        parts = {partition_of.get(r) for r in refs}
        assert len(parts) == 1 and None not in parts, (
            f"delete file {f['file_path']} covers data files of partitions {parts}")
        spec = specs[f["spec_id"]]
        part = f["partition"] or {}
        assert (f["spec_id"], tuple(norm(part.get(pf.name)) for pf in spec.fields)) in parts, (
            f"delete file {f['file_path']} has partition {part}, its data files {parts}")


def assert_equal(skippr: Skippr) -> None:
    skippr.assert_table_matches("events", ALL_READERS)
    check_metadata(skippr)


def assert_spark_prunes_as_pyiceberg(spark, skippr: Skippr, day: dt.datetime) -> None:
    """Spark plans, for a one-day filter, exactly the data files PyIceberg plans."""
    lo, hi = day.isoformat(), (day + dt.timedelta(days=1)).isoformat()
    planned = skippr.table("events").scan(
        row_filter=And(GreaterThanOrEqual("created_at", lo), LessThan("created_at", hi))).plan_files()
    want = frozenset(t.file.file_path for t in planned)
    df = spark.table(skippr.warehouse, skippr.workspace, "events")
    got = spark.scanned_files(df.filter(f"created_at >= timestamp'{lo}' AND created_at < timestamp'{hi}'"))
    assert got.data == want, f"Spark plans {sorted(got.data)}, PyIceberg {sorted(want)}"
    everything = spark.scanned_files(df)
    assert len(got.data) < len(everything.data), "Spark pruned nothing for a one-day filter"


def test_a_partitioned_sorted_table_through_snapshot_cdc_spec_change_and_compaction(skippr: Skippr, db: Database, spark):
    setup_events(db)
    write_config(skippr, LAYOUT)
    sync(skippr)

    table = skippr.table("events")
    spec = table.spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [
        ("created_at_day", "day"), ("id_bucket", "bucket[8]")], spec
    order = table.sort_order()
    assert [(table.schema().find_field(f.source_id).name, f.direction.name) for f in order.fields] == [
        ("created_at", "ASC")], order
    assert_equal(skippr)
    data_files = [f for f in table.inspect.files().to_pylist() if f["content"] == 0]
    assert len({f["partition"]["created_at_day"] for f in data_files}) == DAYS

    # A filtered scan plans only the files of the day asked for.
    day = START + dt.timedelta(days=4)
    planned = list(table.scan(row_filter=And(GreaterThanOrEqual("created_at", day.isoformat()),
                                             LessThan("created_at", (day + dt.timedelta(days=1)).isoformat()))).plan_files())
    assert planned, "a filter on one day planned no file"
    wanted = day_of(day)
    by_path = {f["file_path"]: f for f in data_files}
    days = {norm(by_path[t.file.file_path]["partition"]["created_at_day"]) for t in planned}
    assert days == {wanted}, days

    # CDC: inserts, updates that move rows to other days, deletes, a key change.
    db.execute(
        "INSERT INTO events SELECT g, %s::timestamptz + (g %% %s) * interval '1 day', g %% 5, g, 'new'"
        " FROM generate_series(100001, 100200) g", (START, DAYS))
    db.execute("UPDATE events SET created_at = created_at + interval '3 days' WHERE id % 11 = 0")
    db.execute("UPDATE events SET amount = amount + 1 WHERE id % 13 = 0")
    db.execute("DELETE FROM events WHERE id % 17 = 0")
    db.execute("UPDATE events SET id = id + 500000 WHERE id % 19 = 0")
    sync(skippr)
    assert_equal(skippr)
    files = skippr.table("events").inspect.files().to_pylist()
    assert any(f["content"] == 1 for f in files), "no position deletes after updates and deletes"
    assert_spark_matches(spark, skippr, db, ["events"])
    assert_spark_prunes_as_pyiceberg(spark, skippr, day)

    # A transaction larger than memory: spilled, written in parts, each part's files one
    # partition each, committed once.
    with db.connect() as conn:
        with conn.transaction():
            conn.execute(
                "INSERT INTO events SELECT g, %s::timestamptz + (g %% %s) * interval '1 day', 3, g,"
                " repeat(md5(g::text), 16) FROM generate_series(110001, 118000) g", (START, DAYS))
            conn.execute("UPDATE events SET created_at = created_at - interval '2 days', note = 'big'"
                         " WHERE id BETWEEN 110001 AND 118000 AND id % 10 = 0")
            conn.execute("DELETE FROM events WHERE id BETWEEN 110001 AND 118000 AND id % 9 = 0")
    big = skippr.run("--log-format", "json", "sync", "--once")
    assert "spilling" in big.stderr, describe_run(big, "the large transaction did not spill")
    assert_equal(skippr)

    # A change of spec mid-stream: a new spec id, old files keep theirs, new ones use it.
    write_config(skippr, MONTHLY)
    db.execute("UPDATE events SET note = 'moved', created_at = created_at - interval '20 days' WHERE id % 23 = 0")
    db.execute("INSERT INTO events SELECT g, %s::timestamptz + g * interval '1 hour', 1, 1, 'late'"
               " FROM generate_series(200001, 200050) g", (START,))
    sync(skippr)
    table = skippr.table("events")
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("created_at_month", "month")], table.spec()
    assert table.spec().spec_id != spec.spec_id
    assert len(table.specs()) >= 2
    assert_spark_matches(spark, skippr, db, ["events"])
    listed = skippr.run("query", "SELECT partition_spec_id, partition_by, sort_by FROM skippr.tables"
                        " WHERE table_name = 'events'", "--format", "json")
    assert [json.loads(line) for line in listed.stdout.splitlines()] == [{"partition_spec_id": table.spec().spec_id,
                                          "partition_by": "month(created_at)",
                                          "sort_by": "created_at desc"}], listed.stdout
    assert_equal(skippr)

    # Compaction (due at the next check) rewrites every file of the old spec into the new one.
    write_config(skippr, MONTHLY, compact=True)
    db.execute("UPDATE events SET amount = 0 WHERE id % 29 = 0")
    sync(skippr)
    db.execute("UPDATE events SET amount = 1 WHERE id % 31 = 0")
    sync(skippr)
    table = skippr.table("events")
    specs_in_use = Counter(f["spec_id"] for f in table.inspect.files().to_pylist() if f["content"] == 0)
    assert set(specs_in_use) == {table.spec().spec_id}, f"files of an old spec after compaction: {specs_in_use}"
    summaries = [s.summary.operation.value for s in table.snapshots() if s.summary]
    assert "replace" in summaries, f"no compaction ran: {summaries}"
    assert_equal(skippr)

    # The gateway: a one-day query equals Postgres, scans only that day's files (EXPLAIN
    # ANALYZE), and still shows a row of that day not yet committed (the WAL tail).
    port = free_port()
    write_config(skippr, MONTHLY, query={"listen": f"127.0.0.1:{port}"})
    proc = skippr.start("serve")
    try:
        gw = connect_gateway(skippr, proc, port)
        lo = START + dt.timedelta(days=25)
        hi = lo + dt.timedelta(days=1)
        one_day = "SELECT id, amount, note FROM {t} WHERE created_at >= %s AND created_at < %s ORDER BY id"
        want = db.execute(one_day.format(t="events"), (lo, hi))
        assert want, "no rows on the day asked for"
        assert gw.execute(one_day.format(t="analytics.events"), (lo, hi)).fetchall() == want
        plan = "\n".join(" ".join(map(str, r)) for r in gw.execute(
            "EXPLAIN ANALYZE " + one_day.format(t="analytics.events"), (lo, hi)).fetchall())
        scanned = re.search(r"(?<![a-z_])files_scanned=(\d+)", plan)
        total = re.search(r"(?<![a-z_])files_in_table=(\d+)", plan)
        assert scanned and total and 0 < int(scanned.group(1)) < int(total.group(1)), plan
        db.execute("INSERT INTO events VALUES (400001, %s, 1, 1, 'live')", (lo + dt.timedelta(hours=1),))
        want = db.execute(one_day.format(t="events"), (lo, hi))
        deadline = time.monotonic() + 30
        while gw.execute(one_day.format(t="analytics.events"), (lo, hi)).fetchall() != want:
            assert time.monotonic() < deadline, "the gateway never showed the row not yet committed"
            time.sleep(0.2)
        gw.close()
    finally:
        stop(proc)

    # Back to unpartitioned: removing the layout adds an unpartitioned spec the same way.
    write_config(skippr, {}, compact=True)
    db.execute("INSERT INTO events VALUES (300001, now(), 1, 1, 'plain')")
    sync(skippr)
    table = skippr.table("events")
    assert table.spec().is_unpartitioned(), table.spec()
    assert_equal(skippr)
