"""Table maintenance benchmark driver (see maintenance.sh): "a compressed day" of commits.

A ROWS-row table `events` is copied by `sync --once`, then `skipprd serve` follows a steady
mixed write load (30% inserts, 40% updates, 30% deletes of the oldest row: the table's size
stays steady) with commit_interval COMMIT_INTERVAL and the default maintenance settings except
check_interval CHECK_INTERVAL and snapshot_retention SNAPSHOT_RETENTION, until COMMITS commits
(skippr_commits_total) have happened. Before the first write and every SAMPLE_EVERY commits it
samples, for `events`:

* a point lookup and an aggregate through the gateway, median of RUNS each, and the same two
  queries directly in Postgres (the baseline, measured in the same sample);
* the current metadata.json size, snapshots and metadata-log entries in it;
* live data and delete files (skippr.tables), and every file under the table's data/ folder;
* compactions, expired snapshots and orphan files removed so far (metrics);
* serve's resident memory (VmRSS).

At the end the live table is checked against Postgres, serve is stopped, and a fresh `sync
--once` is timed to its "key index loaded" log line for `events`, as one was right after the
copy. Prints a Markdown block (also written to BENCH_WORK/results.md): the samples, a
last/first ratio row, and the start-up times.

Parameters (environment, defaults): ROWS=200000, COMMITS=2000, SAMPLE_EVERY=100, RUNS=20,
RATE=300 transactions/s, COMMIT_INTERVAL=100ms, CHECK_INTERVAL=5s, SNAPSHOT_RETENTION=60s;
ORPHAN_FILE_AGE, MIN_SNAPSHOTS_TO_KEEP, COMPACTION_MIN_FILES unset (the defaults: 1h, 10, 8);
MAX_DURATION=3600 seconds (the write phase stops there even short of COMMITS).
Environment from maintenance.sh: SKIPPRD (binary), BENCH_WORK (work folder), BENCH_PG_PORT.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import psycopg

from benchlib import BenchError, free_port, pg_connect, wait_for

PARAMS = {
    "ROWS": "200000", "COMMITS": "2000", "SAMPLE_EVERY": "100", "RUNS": "20", "RATE": "300",
    "COMMIT_INTERVAL": "100ms", "CHECK_INTERVAL": "5s", "SNAPSHOT_RETENTION": "60s",
    "ORPHAN_FILE_AGE": "", "MIN_SNAPSHOTS_TO_KEEP": "", "COMPACTION_MIN_FILES": "",
    "MAX_DURATION": "3600",
}
P = {k: os.environ.get(k, v) for k, v in PARAMS.items()}
ROWS, COMMITS, SAMPLE_EVERY, RUNS = int(P["ROWS"]), int(P["COMMITS"]), int(P["SAMPLE_EVERY"]), int(P["RUNS"])
RATE, MAX_DURATION = float(P["RATE"]), float(P["MAX_DURATION"])

BIN = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
DB = "bench_maint"
WS = "maint"  # the workspace (and slot skippr_maint_app): not one another bench uses
TABLE = "events"

LOOKUP_SQL = "SELECT id, k, v, n FROM {t} WHERE id = %s"
AGG_SQL = "SELECT count(*), sum(n), avg(k) FROM {t}"

GW_PORT = free_port()
METRICS_PORT = free_port()


def log(msg: str) -> None:
    print(f"[maintenance-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pg(dbname: str = DB) -> psycopg.Connection:
    return pg_connect(PG_PORT, dbname)


def gateway() -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=GW_PORT, user="bench", dbname=WS, autocommit=True,
                           connect_timeout=10, sslmode="disable")


def metric(name: str, table: str | None = TABLE) -> float:
    """Sum of the samples of `name` (of `table`'s label, when given); 0 before the first."""
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    total = 0.0
    for line in body.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)", line)
        if not m or m[1] != name:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        if table is None or labels.get("table") in (table, f"{WS}.{table}"):
            total += float(m[3])
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def local_path(uri: str) -> Path:
    if uri.startswith("file:"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path))
    return Path(uri)


def metadata_location() -> Path:
    """The current metadata file of `events`, from the warehouse's SQL catalog."""
    with sqlite3.connect(f"file:{WORK / 'warehouse' / 'catalog.db'}?mode=ro", uri=True, timeout=10) as c:
        row = c.execute("SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
                        (WS, TABLE)).fetchone()
    if row is None:
        raise BenchError(f"{WS}.{TABLE} is not in the catalog")
    return local_path(row[0])


def table_files() -> dict[str, Any]:
    """metadata.json size and counts, and the files under the table's data/ folder."""
    for _ in range(10):  # a commit may replace the file between the catalog read and the stat
        path = metadata_location()
        try:
            size = path.stat().st_size
            meta = json.loads(path.read_text())
            break
        except (OSError, json.JSONDecodeError):
            time.sleep(0.1)
    else:
        raise BenchError("could not read the current metadata file")
    data_dir = path.parent.parent / "data"
    on_disk = sum(len(files) for _, _, files in os.walk(data_dir))
    meta_files = sum(1 for p in path.parent.iterdir() if p.name.endswith(".metadata.json"))
    return {"metadata_kib": size / 1024, "snapshots": len(meta.get("snapshots", [])),
            "metadata_log": len(meta.get("metadata-log", [])), "data_dir_files": on_disk,
            "metadata_json_files": meta_files}


def status(conn: psycopg.Connection) -> dict:
    cur = conn.execute("SELECT * FROM skippr.tables WHERE table_name = %s", (TABLE,), prepare=False)
    names = [d.name for d in cur.description]
    row = cur.fetchone()
    return dict(zip(names, row)) if row else {}


# --------------------------------------------------------------------------------------------
# The write load: the table keeps its size (ROWS live rows, give or take)
# --------------------------------------------------------------------------------------------


class Ids:
    """The live id range [oldest, next): inserts take `next`, deletes take `oldest`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.oldest, self.next = 1, ROWS + 1

    def insert(self) -> int:
        with self.lock:
            self.next += 1
            return self.next - 1

    def delete(self) -> int | None:
        with self.lock:
            if self.next - self.oldest <= ROWS // 2:
                return None
            self.oldest += 1
            return self.oldest - 1

    def live(self, rng: random.Random) -> int:
        with self.lock:
            return rng.randrange(self.oldest, self.next)


IDS = Ids()
HALT = threading.Event()
WRITES = {"txns": 0, "errors": 0}
WRITES_LOCK = threading.Lock()


def count(key: str) -> None:
    with WRITES_LOCK:
        WRITES[key] += 1


def writer(rate: float, seed: int) -> None:
    rng = random.Random(seed)
    conn = None
    next_at = time.monotonic()
    while not HALT.is_set():
        next_at += 1 / rate
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            if conn is None or conn.closed:
                conn = pg()
            with conn.transaction():
                for _ in range(rng.randint(1, 3)):
                    op = rng.random()
                    gone = IDS.delete() if op >= 0.7 else None
                    if op < 0.3 or (op >= 0.7 and gone is None):
                        conn.execute("INSERT INTO events (id, k, v, n) VALUES (%s, %s, md5(random()::text), 0)",
                                     (IDS.insert(), rng.randint(1, 1000)))
                    elif op < 0.7:
                        conn.execute("UPDATE events SET n = n + 1, v = md5(random()::text) WHERE id = %s",
                                     (IDS.live(rng),))
                    else:
                        conn.execute("DELETE FROM events WHERE id = %s", (gone,))
            count("txns")
        except psycopg.Error:
            count("errors")
            conn = None
            time.sleep(0.2)


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def median_ms(conn: psycopg.Connection, sql: str, params_of: Callable[[], tuple]) -> float:
    """Median wall time of RUNS executions (after one warm-up), in milliseconds."""
    conn.execute(sql, params_of()).fetchall()
    times = []
    for _ in range(RUNS):
        params = params_of()
        start = time.perf_counter()
        conn.execute(sql, params).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def sample(serve: subprocess.Popen, commits: float) -> dict[str, Any]:
    rng = random.Random(int(commits))
    lookup_id = lambda: (IDS.live(rng),)  # noqa: E731
    with gateway() as gw, pg() as src:
        st = status(gw)
        row = {
            "commits": int(commits),
            "lookup_gw_ms": median_ms(gw, LOOKUP_SQL.format(t=f"{WS}.{TABLE}"), lookup_id),
            "lookup_pg_ms": median_ms(src, LOOKUP_SQL.format(t=TABLE), lookup_id),
            "agg_gw_ms": median_ms(gw, AGG_SQL.format(t=f"{WS}.{TABLE}"), lambda: ()),
            "agg_pg_ms": median_ms(src, AGG_SQL.format(t=TABLE), lambda: ()),
            "data_files": st.get("data_files"),
            "delete_files": st.get("delete_files"),
        }
    row.update(table_files())
    row.update({
        "compactions": metric("skippr_compactions_total"),
        "expired": metric("skippr_expired_snapshots_total"),
        "orphans_removed": metric("skippr_orphan_files_removed_total"),
        "maintenance_failures": metric("skippr_maintenance_failures_total"),
        "rss_mib": rss_mib(serve.pid),
    })
    log(json.dumps(row, default=str))
    return row


def startup_to_key_index(what: str) -> dict[str, Any]:
    """Runs `sync --once` and times, from the start, the "key index loaded" line of `events`
    (and the whole run)."""
    cmd = [BIN, "--config", str(WORK / "skippr.yml"), "--log-format", "json", "sync", "--pipeline", "app", "--once"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    loaded: dict[str, Any] = {}
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if not loaded and "key index loaded" in line:
            loaded = {"seconds": time.monotonic() - start}
            try:
                fields = json.loads(line).get("fields", {})
                loaded.update(rows=fields.get("rows"), files=fields.get("files"))
            except json.JSONDecodeError:
                pass
    code = proc.wait(timeout=3600)
    total = time.monotonic() - start
    (WORK / f"sync-{what}.stderr").write_text("".join(lines))
    if code != 0:
        raise BenchError(f"sync --once ({what}) exited {code}; see {WORK / f'sync-{what}.stderr'}")
    loaded["total_seconds"] = total
    log(f"sync --once ({what}): {loaded}")
    return loaded


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def write_config() -> None:
    maint = {"check_interval": P["CHECK_INTERVAL"], "snapshot_retention": P["SNAPSHOT_RETENTION"]}
    for key in ("ORPHAN_FILE_AGE", "MIN_SNAPSHOTS_TO_KEEP", "COMPACTION_MIN_FILES"):
        if P[key]:
            maint[key.lower()] = P[key]
    block = "".join(f"      {k}: {v}\n" for k, v in maint.items())
    (WORK / "skippr.yml").write_text(
        f"skippr:\n  workspace: {WS}\n"
        f"  query:\n    listen: 127.0.0.1:{GW_PORT}\n  metrics:\n    listen: 127.0.0.1:{METRICS_PORT}\n"
        "pipelines:\n  app:\n    data_source: data_sources.src\n    data_sink: data_sinks.lake\n"
        f"    commit_interval: {P['COMMIT_INTERVAL']}\n    maintenance:\n{block}"
        "data_sources:\n  src:\n    Postgres:\n"
        f"      host: 127.0.0.1\n      port: {PG_PORT}\n      user: postgres\n      database: {DB}\n"
        f"      tables: [{TABLE}]\n"
        "data_sinks:\n  lake:\n    LocalIceberg:\n      warehouse: ./warehouse\n")


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


COLUMNS = [
    ("commits", "commits", 0), ("compactions", "compactions", 0), ("expired", "expired snapshots", 0),
    ("snapshots", "snapshots", 0), ("data_files", "live data files", 0), ("delete_files", "live delete files", 0),
    ("data_dir_files", "files under data/", 0), ("metadata_kib", "metadata.json KiB", 1),
    ("metadata_json_files", "metadata.json files", 0),
    ("lookup_gw_ms", "lookup ms (gateway)", 2), ("lookup_pg_ms", "lookup ms (Postgres)", 2),
    ("agg_gw_ms", "aggregate ms (gateway)", 1), ("agg_pg_ms", "aggregate ms (Postgres)", 1),
    ("rss_mib", "serve RSS MiB", 0),
]


def report(rows: list[dict], before: dict, after: dict, elapsed: float, live_ok: str) -> str:
    lines = [
        f"Table maintenance, a compressed day: `benches/maintenance.sh`, {P}",
        "",
        "| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        cells = []
        for k, _, d in COLUMNS:
            v = r.get(k)
            cells.append(str(round(v)) if d == 0 and isinstance(v, float) else fmt(v, d))
        lines.append("| " + " | ".join(cells) + " |")
    first, last = rows[0], rows[-1]
    ratios = []
    for k, _, _ in COLUMNS:
        a, b = first.get(k), last.get(k)
        ratios.append(f"{b / a:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-")
    lines.append("| last/first | " + " | ".join(ratios[1:]) + " |")
    lines += [
        "",
        f"{rows[-1]['commits']} commits in {elapsed:.0f}s of writes ({WRITES['txns']} source transactions, "
        f"{WRITES['errors']} writer errors); maintenance failures: {fmt(rows[-1].get('maintenance_failures'), 0)}; "
        f"orphan files removed: {fmt(rows[-1].get('orphans_removed'), 0)}. {live_ok}",
        "",
        "| `sync --once` start-up | to \"key index loaded\" (s) | index rows | files indexed | whole run (s) |",
        "|---|---|---|---|---|",
    ]
    for name, s in (("after the copy", before), ("after the day", after)):
        lines.append(f"| {name} | {fmt(s.get('seconds'), 2)} | {fmt(s.get('rows'))} | {fmt(s.get('files'))} | "
                     f"{fmt(s.get('total_seconds'), 2)} |")
    if before.get("seconds") and after.get("seconds"):
        lines.append(f"| last/first | {after['seconds'] / before['seconds']:.2f}x | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    with pg("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DB,)).fetchall():
            c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        c.execute(f"CREATE DATABASE {DB}")
    with pg() as c:
        c.execute("CREATE TABLE events (id bigint PRIMARY KEY, k int NOT NULL, v text, n int NOT NULL)")
        c.execute("INSERT INTO events SELECT g, g %% 1000, md5(g::text), 0 FROM generate_series(1, %s) g", (ROWS,))
        c.execute("VACUUM ANALYZE events")
    write_config()
    log(f"copying {ROWS} rows")
    copy = subprocess.run([BIN, "--config", str(WORK / "skippr.yml"), "sync", "--pipeline", "app", "--once"],
                          cwd=WORK, capture_output=True, text=True)
    if copy.returncode != 0:
        raise BenchError(f"the copy failed:\n{copy.stderr[-4000:]}")
    before = startup_to_key_index("after-copy")

    stderr = open(WORK / "serve.stderr", "w")
    serve = subprocess.Popen([BIN, "--config", str(WORK / "skippr.yml"), "serve"], cwd=WORK,
                             stdout=subprocess.DEVNULL, stderr=stderr)
    (WORK / "serve.pid").write_text(str(serve.pid))

    def alive() -> None:
        if serve.poll() is not None:
            raise BenchError(f"serve exited {serve.returncode}; see {WORK / 'serve.stderr'}")

    threads: list[threading.Thread] = []
    try:
        def streaming() -> bool:
            with gateway() as gw:
                return status(gw).get("pipeline_state") == "streaming"

        wait_for("serve to stream", 600, streaming, interval=0.5, alive=alive)
        rows = [sample(serve, 0)]
        writers = max(1, int(RATE // 100))
        threads = [threading.Thread(target=writer, args=(RATE / writers, i), daemon=True) for i in range(writers)]
        for t in threads:
            t.start()
        started = time.monotonic()
        next_sample = SAMPLE_EVERY
        log(f"writing at {RATE:.0f} transactions/s until {COMMITS} commits")
        while True:
            alive()
            commits = metric("skippr_commits_total")
            if commits >= next_sample:
                rows.append(sample(serve, commits))
                next_sample = (int(commits) // SAMPLE_EVERY + 1) * SAMPLE_EVERY
            if commits >= COMMITS:
                break
            if time.monotonic() - started > MAX_DURATION:
                log(f"MAX_DURATION reached at {commits:.0f} commits")
                rows.append(sample(serve, commits))
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        HALT.set()
        for t in threads:
            t.join(timeout=30)

        # The live table equals Postgres once the tail is applied.
        check = "SELECT count(*), sum(n), sum(id), sum(length(v)) FROM {t}"
        with pg() as src:
            expected = src.execute(check.format(t=TABLE)).fetchone()

        def equal() -> bool:
            with gateway() as gw:
                return tuple(gw.execute(check.format(t=f"{WS}.{TABLE}")).fetchone()) == tuple(expected)

        wait_for("the live table to equal Postgres", 600, equal, interval=0.5, alive=alive)
        live_ok = f"Live table equal to Postgres at the end ({expected[0]} rows)."
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=300)
        if code != 0:
            raise BenchError(f"serve exited {code} after SIGTERM; see {WORK / 'serve.stderr'}")
        after = startup_to_key_index("after-day")
        text = report(rows, before, after, elapsed, live_ok)
        (WORK / "results.md").write_text(text)
        print(text)
    finally:
        HALT.set()
        if serve.poll() is None:
            serve.terminate()
            try:
                serve.wait(timeout=120)
            except subprocess.TimeoutExpired:
                serve.kill()


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
