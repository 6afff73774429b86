"""A transaction many times larger than `transaction_memory_budget_mb` is spilled while it
streams, applied and committed equal to Postgres. The peak resident memory of each
`sync --once` is measured (from the kernel's accounting of the finished process) and written
to the test's log for a person to compare: this is a measurement, not a timed assertion."""

from __future__ import annotations

import os
import subprocess

from conftest import Database, Skippr, describe_run
from test_cdc import ALL_READERS, tx

BUDGET_MB = 1
ROWS = 8000
ROW_BYTES = 4000  # text value per row: the transaction carries about 32 MiB of values


def sync_once_measured(skippr: Skippr, what: str) -> int:
    """Runs `sync --once`, checks it succeeded, logs and returns its peak RSS in MiB."""
    proc = skippr.start("sync", "--pipeline", "app", "--once")
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = (skippr.workdir / "bg.stderr").read_text()
    stdout = (skippr.workdir / "bg.stdout").read_text()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert proc.returncode == 0, describe_run(done, f"sync --once failed ({what})")
    peak_mb = usage.ru_maxrss // 1024  # Linux reports KiB
    line = f"peak RSS of `sync --once` ({what}): {peak_mb} MiB"
    print(line)
    with open(skippr.workdir / "memory.log", "a") as f:
        f.write(line + "\n")
    return peak_mb


def test_transaction_many_times_the_budget_is_applied_equal_and_its_memory_logged(skippr: Skippr, db: Database):
    db.execute("""
        CREATE TABLE wide (id integer PRIMARY KEY, body text, n bigint);
        INSERT INTO wide SELECT i, 'seed', i FROM generate_series(1, 10) i;
    """)
    skippr.write_config(["wide"], extra_pipeline={"transaction_memory_budget_mb": BUDGET_MB})
    sync_once_measured(skippr, "initial copy of 10 rows")
    tx(db, "INSERT INTO wide VALUES (11, 'small', 11)")
    baseline = sync_once_measured(skippr, "one small transaction")

    reps = ROW_BYTES // 32
    tx(db,
       f"INSERT INTO wide SELECT i, repeat(md5(i::text), {reps}), i FROM generate_series(100, {99 + ROWS}) i",
       "UPDATE wide SET body = 'updated ' || id WHERE id % 10 = 0",
       "DELETE FROM wide WHERE id % 13 = 0")
    size_mb = ROWS * ROW_BYTES // (1024 * 1024)
    big = sync_once_measured(skippr, f"one transaction of about {size_mb} MiB, budget {BUDGET_MB} MiB")
    print(f"the large transaction added {big - baseline} MiB of peak RSS over the small one")
    stderr = (skippr.workdir / "bg.stderr").read_text()
    assert "spilling" in stderr, f"the transaction did not spill past the {BUDGET_MB} MiB budget:\n{stderr[-3000:]}"
    skippr.assert_table_matches("wide", ALL_READERS)
