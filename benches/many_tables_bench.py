"""Driver of benches/many_tables.sh: one pipeline over TABLES tables (BUSY of them written
to), against one over the BUSY tables alone, on the same Postgres, one after the other. What
a pipeline costs must follow the tables that change, not the tables that exist: the two
pipelines' peak RSS, commit rounds and restart time side by side say whether it does."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (BenchError, binary_kind, command_line, machine, pct, pg_connect,  # noqa: E402
                      source_version, wait_for)

SKIPPRD = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
DB = "bench_many"
REPO = Path(__file__).resolve().parent.parent

PARAMS = {
    "TABLES": os.environ.get("TABLES", "300"),
    "BUSY": os.environ.get("BUSY", "10"),
    "BIG": os.environ.get("BIG", "5"),
    "SMALL_ROWS": os.environ.get("SMALL_ROWS", "100"),
    "BIG_ROWS": os.environ.get("BIG_ROWS", "100000"),
    "RATE": os.environ.get("RATE", "200"),
    "DURATION": os.environ.get("DURATION", "60"),
    "COMMIT_INTERVAL": os.environ.get("COMMIT_INTERVAL", "1s"),
}
TABLES, BUSY, BIG = int(PARAMS["TABLES"]), int(PARAMS["BUSY"]), int(PARAMS["BIG"])
SMALL_ROWS, BIG_ROWS = int(PARAMS["SMALL_ROWS"]), int(PARAMS["BIG_ROWS"])
RATE, DURATION = float(PARAMS["RATE"]), float(PARAMS["DURATION"])


def name(i: int) -> str:
    return f"t{i:03d}"


def rows_of(i: int) -> int:
    """The busy tables first (small at the start), then the big ones, then the small rest."""
    return BIG_ROWS if BUSY <= i < BUSY + BIG else SMALL_ROWS


def create_source() -> None:
    with pg_connect(PG_PORT, "postgres") as admin:
        for slot in admin.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DB,)).fetchall():
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot[0],))
        admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.execute(f"CREATE DATABASE {DB}")
    with pg_connect(PG_PORT, DB) as c:
        for i in range(TABLES):
            c.execute(f"CREATE TABLE {name(i)} (id bigint PRIMARY KEY, v int NOT NULL, note text)")
            c.execute(f"INSERT INTO {name(i)} SELECT g, g, 'row ' || g FROM generate_series(1, {rows_of(i)}) g")
        c.execute("VACUUM ANALYZE")


def write_config(work: Path, tables: list[str], slot: str) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "skippr.yml"
    cfg.write_text(
        "skippr: {workspace: bench}\n"
        "pipelines:\n"
        f"  p: {{data_source: data_sources.db, data_sink: data_sinks.lake, commit_interval: {PARAMS['COMMIT_INTERVAL']}}}\n"
        "data_sources:\n"
        f"  db: {{Postgres: {{host: 127.0.0.1, port: {PG_PORT}, user: postgres, database: {DB}, "
        f"slot: {slot}, publication: {slot}, tables: [{', '.join(tables)}]}}}}\n"
        "data_sinks:\n"
        "  lake: {LocalIceberg: {warehouse: ./warehouse}}\n")
    return cfg


def status(cfg: Path) -> dict:
    out = subprocess.run([SKIPPRD, "--config", str(cfg), "status", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise BenchError(f"skipprd status failed: {out.stderr[-2000:]}")
    [p] = json.loads(out.stdout)
    return p


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    now = peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1])
    return now, peak


class Sync:
    """`skipprd sync` of one config, in the background."""

    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg = cfg
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([SKIPPRD, "--config", str(cfg), "sync", "--pipeline", "p"],
                                     stdout=self.log, stderr=self.log, cwd=cfg.parent)

    def wait_streaming(self, timeout: float) -> float:
        started = time.monotonic()
        state_file = self.cfg.parent / ".skippr" / "pipelines" / "p.status.json"

        def streaming() -> bool:
            if self.proc.poll() is not None:
                raise BenchError(f"skipprd sync exited with {self.proc.returncode}; see {self.log.name}")
            try:
                s = json.loads(state_file.read_text())
            except (OSError, ValueError):
                return False
            return s.get("state") == "streaming" and s.get("pid") == self.proc.pid

        wait_for("the pipeline to stream", timeout, streaming, interval=0.1)
        return time.monotonic() - started

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(timeout=300) != 0:
            raise BenchError(f"skipprd sync stopped with {self.proc.returncode}; see {self.log.name}")
        self.log.close()


def write_load(busy: list[str], stop: threading.Event, counts: dict) -> None:
    """RATE transactions a second, each an insert or an update of one row of a busy table; a
    failure is kept in `counts["error"]`."""
    try:
        _write_load(busy, stop, counts)
    except Exception as e:  # noqa: BLE001 - reported by the run
        counts["error"] = e


def _write_load(busy: list[str], stop: threading.Event, counts: dict) -> None:
    rng = random.Random(7)
    with pg_connect(PG_PORT, DB) as c:
        next_id = {t: c.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {t}").fetchone()[0] for t in busy}
        due = time.monotonic()
        while not stop.is_set():
            t = rng.choice(busy)
            if rng.random() < 0.5:
                c.execute(f"INSERT INTO {t} VALUES (%s, %s, 'new')", (next_id[t], next_id[t]))
                next_id[t] += 1
            else:
                c.execute(f"UPDATE {t} SET v = v + 1 WHERE id = %s", (rng.randint(1, SMALL_ROWS),))
            counts["tx"] += 1
            due += 1 / RATE
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)


def check_tables(cfg: Path, tables: list[str]) -> None:
    """count and sum of every table through `skipprd query`, against Postgres."""
    with pg_connect(PG_PORT, DB) as c:
        expected = {t: c.execute(f"SELECT count(*), coalesce(sum(v), 0) FROM {t}").fetchone() for t in tables}
    for start in range(0, len(tables), 50):
        part = tables[start:start + 50]
        sql = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n, coalesce(sum(v), 0) AS s FROM {t}" for t in part)
        out = subprocess.run([SKIPPRD, "--config", str(cfg), "query", "--format", "json", sql],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise BenchError(f"skipprd query failed: {out.stderr[-2000:]}")
        for row in (json.loads(line) for line in out.stdout.splitlines() if line.strip()):
            want = expected[row["t"]]
            if (int(row["n"]), int(row["s"])) != (int(want[0]), int(want[1])):
                raise BenchError(f"{row['t']}: skipprd has {row['n']} rows, sum {row['s']}; Postgres {want}")


def run_pipeline(label: str, tables: list[str], busy: list[str], slot: str) -> dict:
    work = WORK / label.replace(" ", "_")
    shutil.rmtree(work, ignore_errors=True)
    cfg = write_config(work, tables, slot)
    sync = Sync(cfg, work / "sync.log")
    snapshot_s = sync.wait_streaming(1800)
    _, after_snapshot = rss_kib(sync.proc.pid)
    stop, counts = threading.Event(), {"tx": 0}
    writer = threading.Thread(target=write_load, args=(busy, stop, counts), daemon=True)
    samples: list[int] = []
    started = time.monotonic()
    writer.start()
    while time.monotonic() - started < DURATION:
        samples.append(rss_kib(sync.proc.pid)[0])
        time.sleep(0.5)
    stop.set()
    writer.join(timeout=30)
    if "error" in counts:
        raise BenchError(f"the write load failed: {counts['error']}")
    time.sleep(3)  # the last writes reach a commit round
    _, peak = rss_kib(sync.proc.pid)
    rounds = status(cfg)["commit_rounds"]
    sync.stop()
    # A restart: from the process start to streaming again.
    again = Sync(cfg, work / "sync.log")
    restart_s = again.wait_streaming(600)
    again.stop()
    check_tables(cfg, tables)
    return {
        "label": label, "tables": len(tables), "snapshot_s": snapshot_s, "restart_s": restart_s,
        "rss_after_snapshot_mib": after_snapshot / 1024, "peak_rss_mib": peak / 1024,
        "streaming_rss_p50_mib": pct(samples, 50) / 1024, "streaming_rss_max_mib": max(samples) / 1024,
        "tx": counts["tx"], "rounds": rounds,
    }


def report(results: list[dict]) -> str:
    cmd = command_line(PARAMS, "benches/many_tables.sh")
    lines = [
        f"`{cmd}`, {binary_kind(SKIPPRD)} build of {source_version(REPO)}, {machine()}:",
        "",
        "| pipeline | tables | snapshot to streaming (s) | peak RSS (MiB) | RSS while streaming, p50 / max (MiB) "
        "| write tx | rounds | round p50 / p99 / max (ms) | most tables in a round | restart to streaming (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rd = r["rounds"]
        ms = lambda v: "-" if v is None else f"{v * 1000:.0f}"  # noqa: E731
        lines.append(
            f"| {r['label']} | {r['tables']} | {r['snapshot_s']:.1f} | {r['peak_rss_mib']:.0f} "
            f"| {r['streaming_rss_p50_mib']:.0f} / {r['streaming_rss_max_mib']:.0f} | {r['tx']} | {rd['count']} "
            f"| {ms(rd['p50_seconds'])} / {ms(rd['p99_seconds'])} / {ms(rd['max_seconds'])} | {rd['last_tables']} "
            f"| {r['restart_s']:.1f} |")
    many, few = results
    ratio = lambda a, b: (a / b) if b else float("nan")  # noqa: E731
    lines += [
        "",
        f"{many['tables']} tables against {few['tables']}: peak RSS {ratio(many['peak_rss_mib'], few['peak_rss_mib']):.2f}x, "
        f"round p99 {ratio(many['rounds']['p99_seconds'] or 0, few['rounds']['p99_seconds'] or 0):.2f}x, "
        f"restart {ratio(many['restart_s'], few['restart_s']):.2f}x. Every table equal to Postgres (count, sum).",
    ]
    return "\n".join(lines)


def main() -> int:
    busy = [name(i) for i in range(BUSY)]
    try:
        create_source()
        results = [
            run_pipeline(f"all {TABLES}", [name(i) for i in range(TABLES)], busy, "bench_many_all"),
            run_pipeline(f"busy {BUSY}", busy, busy, "bench_many_busy"),
        ]
    except BenchError as e:
        print(f"many_tables benchmark: {e}", file=sys.stderr)
        return 1
    text = report(results)
    (WORK / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
