"""Hundreds of tables in one pipeline: 300 tables snapshot and then stream through one slot,
with writes to 10 of them. Every table equals Postgres; a commit round commits only the
tables that changed (the idle ones keep their one snapshot); the daemon's peak memory stays
within the aim while it streams. Time is measured by benches/many_tables.sh, not here."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import Skippr, assert_no_panic, describe_run

TABLES, BUSY, ROWS = 300, 10, 20


def names() -> list[str]:
    return [f"t{i:03d}" for i in range(TABLES)]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.concurrent
def test_three_hundred_tables_stream_and_rounds_commit_only_what_changed(skippr: Skippr):
    skippr.db.execute(
        "DO $$ BEGIN FOR i IN 0.." + str(TABLES - 1) + " LOOP "
        "EXECUTE format('CREATE TABLE t%s (id bigint PRIMARY KEY, v int NOT NULL)', lpad(i::text, 3, '0')); "
        "EXECUTE format('INSERT INTO t%s SELECT g, g FROM generate_series(1, " + str(ROWS) + ") g', "
        "lpad(i::text, 3, '0')); END LOOP; END $$"
    )
    skippr.write_config(names(), extra_pipeline={"commit_interval": "1s"})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        deadline = time.time() + 600
        while skippr.pipeline_status()["state"] != "streaming":
            assert proc.poll() is None, (skippr.workdir / "bg.stderr").read_text()[-3000:]
            assert time.time() < deadline, "the pipeline did not reach streaming within 600 s"
            time.sleep(0.5)

        # Writes to the busy tables, spread over several commit rounds.
        busy = names()[:BUSY]
        for step in range(5):
            for n, t in enumerate(busy):
                skippr.db.execute(
                    f"INSERT INTO {t} VALUES ({ROWS + 1 + step}, {step});"
                    f"UPDATE {t} SET v = v + 100 WHERE id = {1 + (step + n) % ROWS};"
                    f"DELETE FROM {t} WHERE id = {ROWS - step}"
                )
            time.sleep(1.2)
        expected_rounds = 2
        deadline = time.time() + 120
        while True:
            p = skippr.pipeline_status()
            if p["commit_rounds"]["count"] >= expected_rounds and all(
                    t["tail_changes"] == 0 for t in p["tables"]):
                break
            assert time.time() < deadline, p["commit_rounds"]
            time.sleep(0.5)
        rounds = p["commit_rounds"]
        assert 1 <= rounds["last_tables"] <= BUSY, rounds
        assert len(p["tables"]) == TABLES
        peak = peak_rss_mib(proc.pid)
        print(f"300 tables, 10 busy: peak RSS {peak:.0f} MiB, rounds {rounds}")
        assert peak <= 512, f"peak RSS {peak:.0f} MiB over the 512 MiB aim for 300 tables"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (skippr.workdir / "bg.stderr").read_text()[-3000:]

    # Every table equals Postgres.
    for start in range(0, TABLES, 100):
        part = names()[start:start + 100]
        sql = " UNION ALL ".join(
            f"SELECT '{t}' AS t, count(*) AS n, coalesce(sum(v), 0) AS s FROM {t}" for t in part)
        got = skippr.run("query", "--format", "json", sql, check=False)
        assert_no_panic(got)
        assert got.returncode == 0, describe_run(got, "query failed")
        rows = {r["t"]: (int(r["n"]), int(r["s"]))
                for r in (json.loads(line) for line in got.stdout.splitlines() if line.strip())}
        for t in part:
            want = skippr.db.execute(f"SELECT count(*), coalesce(sum(v), 0) FROM {t}")[0]
            assert rows.get(t) == (int(want[0]), int(want[1])), t

    # A round commits only the tables with changes: the idle ones keep their snapshot's commit.
    catalog = skippr.catalog()
    for t in names():
        snapshots = catalog.load_table((skippr.workspace, t)).snapshots()
        if t in busy:
            assert len(snapshots) > 1, t
        else:
            assert len(snapshots) == 1, (t, [s.summary for s in snapshots])
