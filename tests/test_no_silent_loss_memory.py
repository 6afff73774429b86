"""A transaction many times larger than `transaction_memory_budget_mb` is spilled while it
streams, read back change by change, spilled again to data files while it is applied, and
committed once, equal to Postgres. The peak resident memory of each `sync --once` (the
`VmHWM` skipprd reports) must not grow with the transaction: a transaction of 180 MiB may not
cost a third of its size over a small one. Memory, not time, is asserted; the numbers are
written to the test's log."""

from __future__ import annotations

import json

from conftest import Database, Skippr, describe_run
from test_cdc import ALL_READERS, tx

BUDGET_MB = 1
ROWS = 8000
ROW_BYTES = 8000  # text value per row: the transaction carries about 61 MiB of values


def sync_once_measured(skippr: Skippr, what: str) -> tuple[int, str]:
    """Runs `sync --once`, checks it succeeded, logs and returns its peak RSS in MiB: the
    `VmHWM` skipprd reports when it finishes. (The rusage of a child forked from pytest is no
    measure: Linux carries the forking process's high-water mark across the exec.)"""
    done = skippr.run("--log-format", "json", "sync", "--pipeline", "app", "--once", check=False)
    assert done.returncode == 0, describe_run(done, f"sync --once failed ({what})")
    peaks = [json.loads(l)["fields"]["peak_rss_mib"] for l in done.stderr.splitlines()
             if l.startswith("{") and '"peak_rss_mib"' in l]
    assert peaks, describe_run(done, "sync --once reported no peak_rss_mib")
    peak_mb = int(peaks[-1])
    line = f"peak RSS of `sync --once` ({what}): {peak_mb} MiB"
    print(line)
    with open(skippr.workdir / "memory.log", "a") as f:
        f.write(line + "\n")
    return peak_mb, done.stderr


def test_transaction_many_times_the_budget_is_applied_equal_and_its_memory_logged(skippr: Skippr, db: Database):
    db.execute("""
        CREATE TABLE wide (id integer PRIMARY KEY, body text, n bigint);
        INSERT INTO wide SELECT i, 'seed', i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["wide"], extra_pipeline={"transaction_memory_budget_mb": BUDGET_MB})
    sync_once_measured(skippr, "initial copy of 10 rows")
    tx(db, "INSERT INTO wide VALUES (11, 'small', 11)")
    baseline, _ = sync_once_measured(skippr, "one small transaction")

    reps = ROW_BYTES // 32
    tx(db,
       f"INSERT INTO wide SELECT i, repeat(md5(i::text), {reps}), i FROM generate_series(100, {99 + ROWS}) i",
       "UPDATE wide SET body = 'updated ' || id WHERE id % 10 = 0",
       "DELETE FROM wide WHERE id % 13 = 0")
    size_mb = ROWS * ROW_BYTES // (1024 * 1024)
    big, stderr = sync_once_measured(skippr, f"one transaction of about {size_mb} MiB, budget {BUDGET_MB} MiB")
    print(f"the large transaction added {big - baseline} MiB of peak RSS over the small one")
    assert "spilling" in stderr, f"the transaction did not spill past the {BUDGET_MB} MiB budget:\n{stderr[-3000:]}"
    skippr.assert_table_matches("wide", ALL_READERS)

    # Three times the rows: the memory must stay where it was (flat), far below the size.
    tx(db,
       f"INSERT INTO wide SELECT i, repeat(md5(i::text), {reps}), i FROM generate_series(100000, {99999 + 3 * ROWS}) i",
       "DELETE FROM wide WHERE id % 7 = 0 AND id >= 100000")
    bigger, _ = sync_once_measured(skippr, f"one transaction of about {3 * size_mb} MiB, budget {BUDGET_MB} MiB")
    print(f"the three times larger transaction added {bigger - baseline} MiB of peak RSS over the small one")
    assert bigger - baseline < size_mb, (
        f"applying a {3 * size_mb} MiB transaction with a {BUDGET_MB} MiB budget took {bigger - baseline} MiB "
        f"more than a small one: its memory grows with the transaction")
    skippr.assert_table_matches("wide", ALL_READERS)


def test_a_spilled_transaction_that_updates_deletes_alters_and_truncates_is_applied_equal(skippr: Skippr, db: Database):
    """Rows spilled to data files in the middle of a transaction are then updated (a large
    value left unchanged, so it is read back from the spilled file), deleted, and re-keyed;
    the table is altered in the middle; a table keyed by its whole row takes equal rows; and
    a TRUNCATE in the middle drops what was spilled before it; deletes beyond the budget
    spill to position delete files. One commit, equal."""
    db.execute("""
        CREATE TABLE big (id integer PRIMARY KEY, body text, n bigint);
        ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL;
        CREATE TABLE nokey (a integer, b text);
        ALTER TABLE nokey REPLICA IDENTITY FULL;
        CREATE TABLE cut (id integer PRIMARY KEY, body text);
        CREATE TABLE many (id integer PRIMARY KEY, n integer);
        INSERT INTO many SELECT i, 0 FROM generate_series(1, 200000) i;
        INSERT INTO big SELECT i, 'seed', i FROM generate_series(1, 10) i;
        INSERT INTO nokey VALUES (1, 'one'), (1, 'one');
        INSERT INTO cut SELECT i, 'before' FROM generate_series(1, 100) i;
    """)
    skippr.write_config(["big", "nokey", "cut", "many"], extra_pipeline={"transaction_memory_budget_mb": BUDGET_MB})
    sync_once_measured(skippr, "initial copy")
    reps = ROW_BYTES // 32
    tx(db,
       f"INSERT INTO big SELECT i, repeat(md5(i::text), {reps}), i FROM generate_series(100, 3099) i",
       f"INSERT INTO nokey SELECT i % 50, repeat('x', {ROW_BYTES}) FROM generate_series(1, 1000) i",
       f"INSERT INTO cut SELECT i, repeat('c', {ROW_BYTES}) FROM generate_series(101, 1100) i",
       # Only n changes: body (TOASTed, stored out of line) arrives unchanged.
       "UPDATE big SET n = n + 1000000 WHERE id % 3 = 0",
       "DELETE FROM big WHERE id % 5 = 0",
       "UPDATE big SET id = id + 100000 WHERE id % 7 = 0",
       "ALTER TABLE big ADD COLUMN note text",
       f"INSERT INTO big SELECT i, repeat('z', {ROW_BYTES}), i, 'after alter' FROM generate_series(5000, 5999) i",
       "UPDATE big SET note = 'touched' WHERE id % 11 = 0",
       "DELETE FROM nokey WHERE a = 3",
       "UPDATE nokey SET b = 'changed' WHERE a = 4",
       "DELETE FROM nokey WHERE a = 1 AND ctid = (SELECT min(ctid) FROM nokey WHERE a = 1)",
       "TRUNCATE cut",
       f"INSERT INTO cut SELECT i, repeat('d', {ROW_BYTES}) FROM generate_series(1, 1500) i",
       "DELETE FROM cut WHERE id % 4 = 0",
       "UPDATE cut SET body = 'short' WHERE id % 9 = 0",
       # 16 bytes a delete: 150,000 deletes spill as position delete files as well.
       "DELETE FROM many WHERE id % 4 <> 0",
       "UPDATE many SET n = 1 WHERE id % 8 = 0")
    _, stderr = sync_once_measured(skippr, f"a mixed transaction, budget {BUDGET_MB} MiB")
    assert "spilling" in stderr, f"the transaction did not spill past the {BUDGET_MB} MiB budget:\n{stderr[-3000:]}"
    def change_commit(table: str):
        """The summary of the transaction's commit (table maintenance may have compacted since)."""
        t = skippr.table(table)
        snaps = [s for s in t.metadata.snapshots if "skippr.maintenance" not in (s.summary.additional_properties or {})]
        return max(snaps, key=lambda s: s.sequence_number).summary

    for table in ("big", "nokey", "cut"):
        # Spilled while applied: one commit adds several data files (deleted rows among them).
        summary = change_commit(table)
        assert int(summary["added-data-files"]) > 1, f"{table}: {summary}"
        skippr.assert_table_matches(table, ALL_READERS)
    summary = change_commit("many")
    assert int(summary["added-delete-files"]) > 1, f"many: {summary}"
    skippr.assert_table_matches("many", ALL_READERS)
