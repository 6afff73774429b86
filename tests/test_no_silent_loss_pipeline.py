"""No silent loss, in pipeline set-up and bookkeeping: partitioned tables followed as one table
(attach, detach and truncate of partitions included), tables left out of `tables:` and added
back, slots moved outside skipprd, and Iceberg tables that other engines or other pipelines
write. After every `sync --once`, PyIceberg, DuckDB and `skipprd query` equal Postgres row for
row, or skipprd refuses with a message that names the cause and the fix."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import Skippr, assert_no_panic, describe_run, render_config
from test_cdc import (
    ALL_READERS,
    PUBLICATION,
    SLOT,
    assert_fails,
    assert_synced,
    bg_log,
    resnapshot,
    slot_row,
    stop,
    table_lsn,
    tx,
    wait_slot_inactive,
)


def state_file(skippr: Skippr) -> Path:
    return skippr.workdir / ".skippr" / "pipelines" / "app.state.json"


def snapshot_ids(skippr: Skippr, name: str) -> list[int]:
    return [s.snapshot_id for s in skippr.table(name).snapshots()]


# --------------------------------------------------------------------------------------------
# 2. Partitioned tables
# --------------------------------------------------------------------------------------------


def setup_parted(db) -> None:
    db.execute("""
        CREATE TABLE parted (id integer PRIMARY KEY, v text, n numeric(10,2)) PARTITION BY RANGE (id);
        CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (0) TO (100);
        CREATE TABLE parted_high PARTITION OF parted FOR VALUES FROM (100) TO (200);
        INSERT INTO parted SELECT i, 'v' || i, i * 1.5 FROM generate_series(1, 180) i;
    """)


def test_partitioned_table_is_followed_as_one_table(skippr: Skippr, db):
    setup_parted(db)
    skippr.write_config(["parted"])
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])
    assert db.scalar("SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (PUBLICATION,)) is True
    names = [t[1] for t in skippr.catalog().list_tables("analytics")]
    assert names == ["parted"], f"partitions must not become tables of their own: {names}"

    # Changes in every partition, a row moved across partitions, in one and several transactions.
    tx(db, "UPDATE parted SET v = 'low' WHERE id < 10", "UPDATE parted SET v = 'high' WHERE id > 170",
       "DELETE FROM parted WHERE id IN (50, 150)", "INSERT INTO parted VALUES (199, 'new', 1)")
    db.execute("UPDATE parted SET id = 195 WHERE id = 20")
    proc = skippr.sync_once()
    assert "removed from publication" not in proc.stderr
    assert_synced(skippr, db, ["parted"])
    # A third run finds the table where it left it.
    db.execute("UPDATE parted SET n = n + 1 WHERE id % 7 = 0")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])


def test_attached_detached_and_truncated_partitions_keep_the_table_equal(skippr: Skippr, db):
    setup_parted(db)
    skippr.write_config(["parted"])
    skippr.sync_once()

    # ATTACH: rows that were never inserted through the table appear in it.
    db.execute("""
        CREATE TABLE parted_more (id integer PRIMARY KEY, v text, n numeric(10,2));
        INSERT INTO parted_more SELECT i, 'more' || i, i FROM generate_series(200, 260) i;
        ALTER TABLE parted ATTACH PARTITION parted_more FOR VALUES FROM (200) TO (300);
    """)
    db.execute("UPDATE parted SET v = 'after attach' WHERE id IN (5, 205)")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])

    # DETACH: its rows leave the table; what happens to them afterwards is not the table's.
    db.execute("ALTER TABLE parted DETACH PARTITION parted_low")
    db.execute("UPDATE parted_low SET v = 'detached'")
    db.execute("UPDATE parted SET v = 'high' WHERE id = 150")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])

    # Detached, changed, and attached again between two runs: the same partitions by name.
    db.execute("ALTER TABLE parted DETACH PARTITION parted_more")
    db.execute("DELETE FROM parted_more WHERE id < 230")
    db.execute("UPDATE parted_more SET v = 'while detached'")
    db.execute("ALTER TABLE parted ATTACH PARTITION parted_more FOR VALUES FROM (200) TO (300)")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])

    # TRUNCATE of one partition is not published through the partitioned table.
    db.execute("TRUNCATE parted_high")
    db.execute("INSERT INTO parted VALUES (201, 'x', 3) ON CONFLICT (id) DO UPDATE SET v = 'y'")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])

    # And the stream goes on from there.
    tx(db, "UPDATE parted SET v = 'later'", "DELETE FROM parted WHERE id = 240")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])


def test_existing_publication_without_via_root_is_refused_with_the_fix(skippr: Skippr, db):
    setup_parted(db)
    db.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE parted")
    skippr.write_config(["parted"])
    assert_fails(skippr, must_name=["publish_via_partition_root", "ALTER PUBLICATION", PUBLICATION, "parted"],
                 what="the publication publishes the partitions under their own names")
    assert slot_row(db) is None, "a refused sync must not create the slot"
    db.execute(f"ALTER PUBLICATION {PUBLICATION} SET (publish_via_partition_root = true)")
    skippr.sync_once()
    db.execute("UPDATE parted SET v = 'u' WHERE id % 3 = 0")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted"])


def test_publication_switched_off_via_root_after_sync_asks_for_resnapshot(skippr: Skippr, db):
    setup_parted(db)
    skippr.write_config(["parted"])
    skippr.sync_once()
    db.execute(f"ALTER PUBLICATION {PUBLICATION} SET (publish_via_partition_root = false)")
    db.execute("UPDATE parted SET v = 'lost' WHERE id < 5")
    assert_fails(skippr, must_name=["publish_via_partition_root", "--resnapshot"],
                 what="changes of a synced partitioned table were published under the partitions' names")
    db.execute(f"ALTER PUBLICATION {PUBLICATION} SET (publish_via_partition_root = true)")
    resnapshot(skippr)
    assert_synced(skippr, db, ["parted"])


def test_partition_listed_with_its_parent_is_refused(skippr: Skippr, db):
    setup_parted(db)
    skippr.write_config(["parted", "parted_low"])
    proc = assert_fails(skippr, must_name=["public.parted_low", "partition of public.parted", "tables:"],
                        what="a partition and its partitioned table are both followed")
    assert "panicked" not in proc.stderr
    # discover says the same, as a failed check.
    out = skippr.run("discover", "--pipeline", "app", "--format", "json", check=False)
    assert_no_panic(out)
    checks = json.loads(out.stdout)["checks"]
    bad = [c for c in checks if c["name"] == "partitions"]
    assert bad and not bad[0]["ok"], checks
    # A partition alone is an ordinary table to follow.
    skippr.write_config(["parted_low"])
    skippr.sync_once()
    db.execute("UPDATE parted SET v = 'p' WHERE id < 30")
    skippr.sync_once()
    assert_synced(skippr, db, ["parted_low"])


def test_continuous_sync_copies_a_table_again_when_a_partition_is_attached(skippr: Skippr, db):
    setup_parted(db)
    skippr.write_config(["parted"], extra_pipeline={"commit_interval": "500ms"})
    skippr.sync_once()
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        db.execute("""
            CREATE TABLE parted_more (id integer PRIMARY KEY, v text, n numeric(10,2));
            INSERT INTO parted_more SELECT i, 'more' || i, i FROM generate_series(200, 230) i;
            ALTER TABLE parted ATTACH PARTITION parted_more FOR VALUES FROM (200) TO (300);
        """)
        db.execute("UPDATE parted SET v = 'live' WHERE id IN (1, 201)")
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"continuous sync exited\n{bg_log(skippr)}"
            try:
                skippr.assert_table_matches("parted", ("pyiceberg",))
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"attached partition never reached Iceberg\n{bg_log(skippr)}")
                time.sleep(0.5)
        db.execute("DELETE FROM parted WHERE id = 202")
        deadline = time.monotonic() + 60
        while True:
            try:
                skippr.assert_table_matches("parted", ("pyiceberg",))
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        rc = stop(proc)
    assert rc == 0, bg_log(skippr)
    assert_synced(skippr, db, ["parted"])


# --------------------------------------------------------------------------------------------
# 5. No gaps
# --------------------------------------------------------------------------------------------


def setup_two(db) -> None:
    db.execute("""
        CREATE TABLE kept (id integer PRIMARY KEY, v text);
        CREATE TABLE away (id integer PRIMARY KEY, v text);
        INSERT INTO kept SELECT i, 'k' || i FROM generate_series(1, 50) i;
        INSERT INTO away SELECT i, 'a' || i FROM generate_series(1, 50) i;
    """)


def test_table_left_out_and_added_back_is_copied_again(skippr: Skippr, db):
    setup_two(db)
    skippr.write_config(["kept", "away"])
    skippr.sync_once()
    db.execute("UPDATE away SET v = 'before' WHERE id < 5")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"])

    skippr.write_config(["kept"])
    tx(db, "UPDATE away SET v = 'meanwhile' WHERE id < 20", "DELETE FROM away WHERE id > 45",
       "INSERT INTO away VALUES (100, 'new')", "UPDATE kept SET v = 'meanwhile' WHERE id < 3")
    skippr.sync_once()
    db.execute("UPDATE kept SET v = 'again' WHERE id = 10")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept"])

    skippr.write_config(["kept", "away"])
    db.execute("UPDATE away SET v = 'after' WHERE id = 30")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"])
    db.execute("UPDATE away SET v = 'later' WHERE id = 31")
    db.execute("UPDATE kept SET v = 'later' WHERE id = 31")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"])


def test_table_added_back_after_its_columns_changed_is_copied_into_a_new_table(skippr: Skippr, db):
    setup_two(db)
    skippr.write_config(["kept", "away"])
    skippr.sync_once()
    skippr.write_config(["kept"])
    skippr.sync_once()
    db.execute("ALTER TABLE away ADD COLUMN extra integer DEFAULT 7")
    db.execute("ALTER TABLE away DROP COLUMN v")
    db.execute("UPDATE away SET extra = id WHERE id < 10")
    db.execute("UPDATE kept SET v = 'moved on'")
    skippr.sync_once()
    skippr.write_config(["kept", "away"])
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"])
    db.execute("UPDATE away SET extra = -1 WHERE id = 40")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"])


def test_idle_table_watermark_advances_without_new_snapshots(skippr: Skippr, db):
    setup_two(db)
    db.execute("CREATE TABLE unrelated (id integer PRIMARY KEY)")
    skippr.write_config(["kept", "away"])
    skippr.sync_once()
    idle_snapshots = snapshot_ids(skippr, "away")
    idle_lsn = table_lsn(skippr, "away")
    for i in range(3):
        db.execute(f"UPDATE kept SET v = 'round {i}'")
        # transactions the pipeline does not follow, acknowledged without a WAL segment
        db.execute(f"INSERT INTO unrelated VALUES ({i})")
        skippr.sync_once()
    assert snapshot_ids(skippr, "away") == idle_snapshots, "an idle table must not get empty snapshots"
    state = json.loads(state_file(skippr).read_text())
    from conftest import lsn_to_int
    watermark = lsn_to_int(state["tables"]["public.away"]["watermark"])
    assert watermark > idle_lsn, f"the idle table's watermark did not advance: {state}"
    assert watermark >= table_lsn(skippr, "kept")
    assert_synced(skippr, db, ["kept", "away"])


def test_slot_recreated_outside_skipprd_is_refused(skippr: Skippr, db):
    setup_two(db)
    skippr.write_config(["kept", "away"])
    skippr.sync_once()
    db.execute("UPDATE kept SET v = 'seen'")
    skippr.sync_once()
    before = skippr.read_pyiceberg("kept", ["id"])
    wait_slot_inactive(db)
    db.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
    db.execute("UPDATE kept SET v = 'nobody streamed this' WHERE id < 10")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    db.execute("UPDATE kept SET v = 'after the new slot' WHERE id = 20")
    assert_fails(skippr, must_name=[SLOT, "--resnapshot", "public.kept"],
                 what="the slot was recreated outside skipprd")
    assert_fails(skippr, must_name=["--resnapshot"], what="second run after the slot was recreated")
    assert skippr.read_pyiceberg("kept", ["id"]) == before, "Iceberg changed although the sync failed"
    resnapshot(skippr)
    assert_synced(skippr, db, ["kept", "away"])
    db.execute("UPDATE kept SET v = 'fine again' WHERE id < 3")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"])


def test_slot_advanced_outside_skipprd_is_refused(skippr: Skippr, db):
    setup_two(db)
    skippr.write_config(["kept", "away"])
    skippr.sync_once()
    wait_slot_inactive(db)
    # Committed synchronously: a slot advances at most to the flushed WAL, and `sync --once`
    # acknowledged through its own marker, which can be the flushed position already.
    db.execute("BEGIN; SET LOCAL synchronous_commit = on; DELETE FROM away WHERE id < 10; COMMIT")
    db.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())", (SLOT,))
    assert_fails(skippr, must_name=[SLOT, "--resnapshot", "public.away"],
                 what="the slot was advanced past changes nobody received")
    resnapshot(skippr)
    assert_synced(skippr, db, ["kept", "away"])


def test_restarts_without_changes_are_not_refused(skippr: Skippr, db):
    """The guards above must not fire on an ordinary pipeline: runs with nothing to do, runs
    after changes outside the followed tables, and a continuous run stopped and started."""
    setup_two(db)
    db.execute("CREATE TABLE unrelated (id integer PRIMARY KEY)")
    skippr.write_config(["kept", "away"], extra_pipeline={"commit_interval": "500ms"})
    skippr.sync_once()
    skippr.sync_once()
    db.execute("INSERT INTO unrelated VALUES (1)")
    skippr.sync_once()
    proc = skippr.start("sync", "--pipeline", "app")
    time.sleep(3)
    db.execute("INSERT INTO unrelated VALUES (2)")
    db.execute("UPDATE kept SET v = 'c' WHERE id = 1")
    time.sleep(3)
    assert stop(proc) == 0, bg_log(skippr)
    db.execute("INSERT INTO unrelated VALUES (3)")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept", "away"], readers=ALL_READERS)


# --------------------------------------------------------------------------------------------
# 6. Other writers
# --------------------------------------------------------------------------------------------


def test_commit_by_another_engine_keeps_the_committed_lsn(skippr: Skippr, db):
    setup_two(db)
    skippr.write_config(["kept"])
    skippr.sync_once()
    db.execute("UPDATE kept SET v = 'u1' WHERE id < 10")
    skippr.sync_once()
    lsn = table_lsn(skippr, "kept")

    # Another engine rewrites the table (same rows, new files, a snapshot without skippr.lsn).
    table = skippr.table("kept")
    table.overwrite(table.scan().to_arrow())
    table = skippr.table("kept")
    summary = dict(table.current_snapshot().summary.additional_properties)
    assert "skippr.lsn" not in summary, summary

    tx(db, "UPDATE kept SET v = 'u2' WHERE id BETWEEN 5 AND 15", "DELETE FROM kept WHERE id = 40",
       "INSERT INTO kept VALUES (60, 'n')")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept"])
    assert table_lsn(skippr, "kept") > lsn
    skippr.sync_once()
    assert_synced(skippr, db, ["kept"])


def test_table_of_another_pipeline_is_refused(skippr: Skippr, db, tmp_path):
    setup_two(db)
    skippr.write_config(["kept"])
    skippr.sync_once()
    # A second config file, pipeline `billing`, pointed at the same warehouse.
    other = tmp_path / "other"
    other.mkdir()
    text = render_config(host=db.host, port=db.port, user="skippr", password="skippr", database=db.name,
                         tables=["kept"], warehouse=str(skippr.warehouse))
    text = text.replace("  app:\n", "  billing:\n")
    (other / "skippr.yml").write_text(text)
    from conftest import run_skipprd
    proc = run_skipprd("--config", str(other / "skippr.yml"), "sync", "--pipeline", "billing", "--once",
                       cwd=other, check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "a second pipeline wrote a table of the first")
    for s in ("pipeline `app`", "billing", "kept"):
        assert s in proc.stderr, describe_run(proc, f"error does not mention {s!r}")
    db.execute("UPDATE kept SET v = 'still app'")
    skippr.sync_once()
    assert_synced(skippr, db, ["kept"])


def test_validate_refuses_two_pipelines_writing_one_table(skippr: Skippr, db):
    skippr.write_config(["kept", "sales.orders"])
    text = skippr.config_path.read_text()
    pipelines = text[text.index("pipelines:\n"):text.index("data_sources:\n")]
    second = pipelines.replace("pipelines:\n", "").replace("  app:\n", "  billing:\n")
    text = text.replace(pipelines, pipelines + second)
    skippr.write_raw_config(text)
    proc = skippr.run("validate", check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "two pipelines writing the same tables validated")
    out = proc.stdout + proc.stderr
    for s in ("pipelines.billing", "`kept`", "`sales_orders`", "pipeline `app`"):
        assert s in out, describe_run(proc, f"validate does not mention {s!r}")
