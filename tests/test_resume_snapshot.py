"""A first snapshot cut short goes on from where it was, as a user meets it: a large table is
copied in key chunks, each made durable as it ends; the process is killed with SIGKILL at 40%
of the table while both tables take inserts, updates, deletes and key moves; the next start
copies only the keys no durable chunk holds, and every reader equals Postgres."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from conftest import Skippr, chunked_copy_writer, describe_run

ROWS = 600_000
CHUNK = 20_000


def readers_equal_postgres(skippr: Skippr, table: str) -> None:
    figures = "count(*), coalesce(sum(v), 0), coalesce(sum(id), 0), coalesce(sum(id * v), 0)"
    want = tuple(int(x) for x in skippr.db.execute(f"SELECT {figures} FROM {table}")[0])
    got = skippr.run("query", "--format", "json",
                     f"SELECT count(*) AS n, coalesce(sum(v), 0) AS s, coalesce(sum(id), 0) AS k, "
                     f"coalesce(sum(id * v), 0) AS p FROM {table}", check=False)
    assert got.returncode == 0, describe_run(got)
    [row] = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
    assert (int(row["n"]), int(row["s"]), int(row["k"]), int(row["p"])) == want, table
    rows = skippr.table(table).scan(selected_fields=("id", "v")).to_arrow()
    ids, vs = rows.column("id").to_pylist(), rows.column("v").to_pylist()
    assert len(set(ids)) == len(ids), f"{table}: a key is in the lake twice"
    assert (len(ids), sum(vs), sum(ids), sum(i * v for i, v in zip(ids, vs))) == want, table


@pytest.mark.concurrent
def test_a_first_snapshot_killed_at_40_percent_goes_on_from_its_durable_chunks(skippr: Skippr):
    skippr.db.execute(
        "CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL);"
        f"INSERT INTO big SELECT g, g % 1000, repeat('x', 24) FROM generate_series(1, {ROWS}) g;"
        "ANALYZE big;"
        "CREATE TABLE small (id bigint PRIMARY KEY, v int NOT NULL);"
        "INSERT INTO small SELECT g, g FROM generate_series(1, 500) g;"
    )
    skippr.write_config(["big", "small"],
                        extra_source={"snapshot_chunk_rows": CHUNK, "snapshot_parallelism": 2})
    # The copy stops once 40% of the table's chunks are durable (each connection finishes the
    # chunk it is on), and is killed there.
    at = int(0.4 * ROWS / CHUNK)
    proc = skippr.start("sync", "--pipeline", "app", env={"SKIPPR_TEST_PAUSE_AT": f"copied-chunks:{at}"})
    stop = threading.Event()

    thread = chunked_copy_writer(skippr, stop, other="small", other_rows=500, big_rows=ROWS,
                                 new_values="2, 'new'", pause=0.002)
    thread.start()
    try:
        deadline = time.time() + 240
        stderr = skippr.workdir / "bg.stderr"
        while f"paused at copied-chunks:{at}" not in stderr.read_text():
            assert proc.poll() is None, stderr.read_text()[-4000:]
            assert time.time() < deadline, "the copy never reached 40%"
            time.sleep(0.2)
        time.sleep(1)  # the other connection makes its chunk durable, and pauses too
        # The paused copy's progress, as `status` shows it while a snapshot runs.
        [progress] = [t for t in skippr.pipeline_status().get("snapshot", []) if t["table"] == "public.big"]
        proc.kill()
        proc.wait(timeout=30)
        time.sleep(1)  # changes go on while nothing runs
        state = json.loads((skippr.workdir / ".skippr" / "pipelines" / "app.state.json").read_text())
        chunks = state["tables"]["public.big"]["copied"]["chunks"]
        # The copy goes on while the writer goes on too: the new chunks' snapshots see
        # changes the old ones did not.
        again = skippr.sync_once()
    finally:
        stop.set()
        thread.join(timeout=30)
        if proc.poll() is None:
            proc.kill()
    # While the copy ran, `status` showed its progress: rows, the estimate, rate and ETA.
    assert not progress["done"] and progress["rows_per_second"] > 0, progress
    assert 0 < progress["rows_copied"] < ROWS and abs(progress["rows_estimated"] - ROWS) < ROWS // 10, progress
    assert progress["eta_seconds"] is not None and progress["eta_seconds"] > 0, progress
    durable = sum(c["rows"] for c in chunks)
    assert len(chunks) >= at and durable >= 0.4 * ROWS, (len(chunks), durable)
    assert again.returncode == 0, describe_run(again)
    log = again.stderr
    assert "goes on from the chunks it made durable" in log, log[-3000:]
    [copied] = [line for line in log.splitlines() if "copied in key chunks" in line and "public.big" in line]
    rows_now = int(re.search(r"rows_now=(\d+)", copied).group(1))
    total = int(skippr.db.execute("SELECT count(*) FROM big")[0][0])
    # The changes made after the resumed copy started reach the lake with the next run.
    final = skippr.sync_once()
    assert final.returncode == 0, describe_run(final)
    print(f"durable={durable} rows_now={rows_now} total={total} chunks={len(chunks)}")
    # Only the keys no durable chunk held were copied again.
    assert durable + rows_now <= 1.1 * total, (durable, rows_now, total)
    assert rows_now <= 0.7 * total, (rows_now, total)
    for t in ("big", "small"):
        readers_equal_postgres(skippr, t)
    # Nothing of the copy is left over: the state no longer lists chunks, the chunks'
    # manifests are gone.
    state = json.loads((skippr.workdir / ".skippr" / "pipelines" / "app.state.json").read_text())
    assert "copied" not in state["tables"]["public.big"], state["tables"]["public.big"]
    leftovers = [c["manifest"] for c in chunks
                 if c.get("manifest") and os.path.exists(c["manifest"].removeprefix("file://"))]
    assert not leftovers, leftovers
    metadata = skippr.table("big").metadata_location.removeprefix("file://")
    stray = [f for f in os.listdir(os.path.dirname(metadata)) if f.startswith("copy-")]
    assert not stray, stray
