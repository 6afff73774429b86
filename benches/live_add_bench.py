"""Driver of benches/live_add.sh: a table added to a running `skipprd serve` while a busy table
streams. Freshness of the busy table (a marker row committed in Postgres, then looked up
through the gateway every POLL_MS until it shows) is probed all along: before the add, while
the added table is copied, and after. The added table must become queryable whole (never
half-copied) and equal to Postgres; the busy table's freshness during the copy, against
before, says whether the other tables kept their freshness."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (BenchError, binary_kind, command_line, free_port, machine, pct,  # noqa: E402
                      pg_connect, recreate_database_on, source_version, wait_for)

SKIPPRD = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
DB = "bench_live_add"
REPO = Path(__file__).resolve().parent.parent

PARAMS = {
    "ADD_ROWS": os.environ.get("ADD_ROWS", "2000000"),
    "BUSY_ROWS": os.environ.get("BUSY_ROWS", "10000"),
    "RATE": os.environ.get("RATE", "200"),
    "BEFORE": os.environ.get("BEFORE", "20"),
    "AFTER": os.environ.get("AFTER", "10"),
    "POLL_MS": os.environ.get("POLL_MS", "5"),
    "COMMIT_INTERVAL": os.environ.get("COMMIT_INTERVAL", "1s"),
}
ADD_ROWS, BUSY_ROWS = int(PARAMS["ADD_ROWS"]), int(PARAMS["BUSY_ROWS"])
RATE, BEFORE, AFTER = float(PARAMS["RATE"]), float(PARAMS["BEFORE"]), float(PARAMS["AFTER"])
POLL = int(PARAMS["POLL_MS"]) / 1000


def create_source() -> None:
    with pg_connect(PG_PORT, "postgres") as admin:
        recreate_database_on(admin, DB)
    with pg_connect(PG_PORT, DB) as c:
        c.execute("CREATE TABLE busy (id bigint PRIMARY KEY, v int NOT NULL)")
        c.execute(f"INSERT INTO busy SELECT g, g FROM generate_series(1, {BUSY_ROWS}) g")
        c.execute("CREATE TABLE added (id bigint PRIMARY KEY, v int NOT NULL, note text)")
        c.execute(f"INSERT INTO added SELECT g, g % 1000, md5(g::text) FROM generate_series(1, {ADD_ROWS}) g")
        c.execute("VACUUM ANALYZE")


def copy_seconds() -> float:
    """The baseline: one `COPY ... TO STDOUT` of the table to be added, read and dropped."""
    with pg_connect(PG_PORT, DB) as c:
        started = time.perf_counter()
        with c.cursor().copy("COPY (SELECT * FROM added) TO STDOUT") as copy:
            for _ in copy:
                pass
        return time.perf_counter() - started


def write_config(work: Path, gateway: int, metrics: int) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "skippr.yml"
    cfg.write_text(
        "skippr:\n"
        "  workspace: bench\n"
        f"  query: {{listen: '127.0.0.1:{gateway}'}}\n"
        f"  metrics: {{listen: '127.0.0.1:{metrics}'}}\n"
        "pipelines:\n"
        f"  p: {{data_source: data_sources.db, data_sink: data_sinks.lake, commit_interval: {PARAMS['COMMIT_INTERVAL']}}}\n"
        "data_sources:\n"
        f"  db: {{Postgres: {{host: 127.0.0.1, port: {PG_PORT}, user: postgres, database: {DB}, "
        "slot: bench_live_add, publication: bench_live_add, tables: [busy]}}\n"
        "data_sinks:\n"
        "  lake: {LocalIceberg: {warehouse: ./warehouse}}\n")
    return cfg


def gateway(port: int) -> psycopg.Connection:
    deadline = time.monotonic() + 120
    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, dbname="bench", user="skippr",
                                   autocommit=True, prepare_threshold=None)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise BenchError("the gateway did not listen within 120 s")
            time.sleep(0.2)


def write_load(stop: threading.Event, counts: dict) -> None:
    """RATE updates a second on the busy table."""
    try:
        with pg_connect(PG_PORT, DB) as c:
            due, i = time.monotonic(), 0
            while not stop.is_set():
                i += 1
                c.execute("UPDATE busy SET v = v + 1 WHERE id = %s", (1 + i % BUSY_ROWS,))
                counts["tx"] += 1
                due += 1 / RATE
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
    except Exception as e:  # noqa: BLE001 - reported by the run
        counts["error"] = e


def probe(stop: threading.Event, gw_port: int, samples: list[tuple[float, float]], counts: dict) -> None:
    """Marker rows in the busy table, each looked up through the gateway until it shows:
    (time of the commit, seconds until seen)."""
    try:
        marker = 10_000_000
        with pg_connect(PG_PORT, DB) as src, gateway(gw_port) as gw:
            while not stop.is_set():
                marker += 1
                src.execute("INSERT INTO busy VALUES (%s, 0)", (marker,))
                committed = time.monotonic()
                while gw.execute("SELECT 1 FROM bench.busy WHERE id = %s", (marker,)).fetchone() is None:
                    if time.monotonic() - committed > 120:
                        raise BenchError(f"marker {marker} not visible 120 s after its commit")
                    time.sleep(POLL)
                samples.append((committed, time.monotonic() - committed))
                time.sleep(0.1)
    except Exception as e:  # noqa: BLE001 - reported by the run
        counts["error"] = e


def run() -> dict:
    work = WORK / "run"
    shutil.rmtree(work, ignore_errors=True)
    gw_port = free_port()
    cfg = write_config(work, gw_port, free_port())
    log = open(work / "serve.log", "ab")
    serve = subprocess.Popen([SKIPPRD, "--config", str(cfg), "serve"], stdout=log, stderr=log, cwd=work)
    try:
        conn = gateway(gw_port)
        wait_for("the busy table", 300,
                 lambda: conn.execute("SELECT count(*) FROM skippr.tables").fetchone()[0] == 1)
        stop, counts, samples = threading.Event(), {"tx": 0}, []
        threads = [threading.Thread(target=write_load, args=(stop, counts), daemon=True),
                   threading.Thread(target=probe, args=(stop, gw_port, samples, counts), daemon=True)]
        for t in threads:
            t.start()
        time.sleep(BEFORE)
        add_start = time.monotonic()
        out = subprocess.run([SKIPPRD, "--config", str(cfg), "sync", "--pipeline", "p", "--add-table", "added"],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BenchError(f"sync --add-table failed: {out.stderr[-2000:]}")
        half = []

        def whole() -> bool:
            try:
                n = conn.execute("SELECT count(*) FROM bench.added").fetchone()[0]
            except psycopg.Error:
                return False
            if n < ADD_ROWS:
                half.append(n)
            return True
        wait_for("the added table to be queryable", 3600, whole, interval=0.1)
        add_s = time.monotonic() - add_start
        time.sleep(AFTER)
        stop.set()
        for t in threads:
            t.join(timeout=130)
        if "error" in counts:
            raise BenchError(f"the load failed: {counts['error']}")
        if half:
            raise BenchError(f"the added table was read half-copied: {half[:5]} rows")
        time.sleep(3)
        with pg_connect(PG_PORT, DB) as c:
            for t in ("busy", "added"):
                want = c.execute(f"SELECT count(*), coalesce(sum(v), 0) FROM {t}").fetchone()
                got = conn.execute(f"SELECT count(*), coalesce(sum(v), 0) FROM bench.{t}").fetchone()
                if tuple(map(int, got)) != tuple(map(int, want)):
                    raise BenchError(f"{t}: the gateway has {got}, Postgres {want}")
        conn.close()
        peak = 0
        for line in Path(f"/proc/{serve.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) // 1024
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=120)
        except subprocess.TimeoutExpired:
            serve.kill()
        log.close()
    before = [s for t, s in samples if t < add_start]
    during = [s for t, s in samples if add_start <= t < add_start + add_s]
    after = [s for t, s in samples if t >= add_start + add_s]
    return {"before": before, "during": during, "after": after, "add_s": add_s, "peak_mib": peak,
            "tx": counts["tx"]}


def report(r: dict) -> str:
    cmd = command_line(PARAMS, "benches/live_add.sh")
    ms = lambda v: f"{v * 1000:.0f}"  # noqa: E731
    lines = [
        f"`{cmd}`, {binary_kind(SKIPPRD)} build of {source_version(REPO)}, {machine()}:",
        "",
        "| busy table's freshness | probes | p50 (ms) | p99 (ms) | max (ms) |",
        "|---|---|---|---|---|",
    ]
    for label in ("before", "during", "after"):
        s = r[label]
        if s:
            lines.append(f"| {label} the add | {len(s)} | {ms(pct(s, 50))} | {ms(pct(s, 99))} | {ms(max(s))} |")
        else:
            lines.append(f"| {label} the add | 0 | - | - | - |")
    ratio = (pct(r["during"], 99) / pct(r["before"], 99)) if r["during"] and r["before"] else float("nan")
    lines += [
        "",
        f"The added table ({ADD_ROWS:,} rows) was queryable whole {r['add_s']:.1f} s after `sync --add-table` "
        f"(one `COPY` of it to nowhere: {r['copy_s']:.1f} s, {r['add_s'] / r['copy_s']:.2f}x); "
        f"the busy table's freshness p99 during the copy was {ratio:.2f}x its p99 before; {r['tx']} write "
        f"transactions; peak RSS of serve {r['peak_mib']} MiB. Both tables equal to Postgres (count, sum); "
        "the added table was never read half-copied.",
    ]
    return "\n".join(lines)


def main() -> int:
    try:
        create_source()
        baseline = copy_seconds()
        r = run()
        r["copy_s"] = baseline
    except BenchError as e:
        print(f"live_add benchmark: {e}", file=sys.stderr)
        return 1
    text = report(r)
    (WORK / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
