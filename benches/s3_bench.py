"""S3 benchmark driver (see s3.sh): local disk against S3 + Glue (moto), in one run.

Per run, for each target (`local`: LocalIceberg with local state; `s3`: AthenaIceberg with
`skipprd_el_storage_mode: s3`, the flagship configuration):
1. Snapshot: `sync --once` of `orders` (ROWS rows; bigint, int, text, numeric, timestamptz,
   text) from an empty state. Wall time and the peak RSS skipprd reports (`peak_rss_mib`).
2. CDC: CHANGES changes (half inserts, 30% updates, 20% deletes, 10,000 per transaction) are
   committed once; each target's `sync --once` then streams them from its own slot into its
   WAL and commits them. Wall time and peak RSS; the answer of `skipprd query` is checked
   against Postgres (count and sum).
Then, once per target, freshness through `serve`: a writer commits RATE transactions/s while a
probe commits a marker row and polls the gateway until it is visible, PROBES times; p50/p99.
Then, on the same `serve`, warm queries: an aggregate over `orders` and a point lookup by key,
each run 11 times through the gateway; the median of the last 10 (caches filled).

moto keeps objects in memory on this machine: the S3 numbers measure skipprd's object-store
path (requests, multipart, listing, Glue), not a network. Parameters (environment, defaults):
ROWS=1000000 CHANGES=300000 RUNS=3 PROBES=100 RATE=200.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psycopg

from benchlib import free_port, pct, pg_connect

P = {k: int(os.environ.get(k, v)) for k, v in {
    "ROWS": 1_000_000, "CHANGES": 300_000, "RUNS": 3, "PROBES": 100, "RATE": 200,
}.items()}
BIN = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
DB = "bench_s3"
REGION = "us-east-1"
TARGETS = ("local", "s3")
WARM_QUERIES = {
    "aggregate": "SELECT status, count(*), sum(amount) FROM orders GROUP BY status ORDER BY status",
    "point lookup": "SELECT * FROM orders WHERE id = 424242",
}
#: target -> query -> median warm seconds through the gateway.
WARM: dict[str, dict[str, float]] = {}


def log(msg: str) -> None:
    print(f"[s3 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pg(dbname: str = DB) -> psycopg.Connection:
    return pg_connect(PG_PORT, dbname)


class Moto:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(WORK / "moto.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"moto did not start; see {WORK / 'moto.log'}")
                time.sleep(0.2)

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self, service: str):
        import boto3
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def config(target: str, run: str, gateway_port: int) -> Path:
    """The pipeline of `target` for one run: its own workspace, hence its own slot and tables."""
    ws = f"bench_{target}_{run}"
    folder = WORK / ws
    folder.mkdir(parents=True, exist_ok=True)
    source = (f"  db: {{Postgres: {{host: 127.0.0.1, port: {PG_PORT}, user: postgres, database: {DB}, "
              f"tables: [orders, events]}}}}\n")
    head = (f"skippr:\n  workspace: {ws}\n  query: {{listen: '127.0.0.1:{gateway_port}'}}\n"
            f"  metrics: {{listen: '127.0.0.1:{free_port()}'}}\n")
    if target == "local":
        sink = "  lake: {LocalIceberg: {warehouse: ./warehouse}}\n"
    else:
        head += f"  skipprd_el_storage_mode: s3\n  skipprd_el_storage_path: s3://bench-state/{ws}\n"
        sink = (f"  lake: {{AthenaIceberg: {{warehouse: 's3://bench-lake/{ws}/', glue_database_name: {ws}, "
                f"athena_workgroup_name: primary, athena_results_s3_bucket: bench-results, region: {REGION}}}}}\n")
    path = folder / "skippr.yml"
    path.write_text(head
                    + "pipelines:\n  app: {data_source: data_sources.db, data_sink: data_sinks.lake, commit_interval: 10s}\n"
                    + "data_sources:\n" + source + "data_sinks:\n" + sink)
    return path


def skipprd(cfg: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, "--config", str(cfg), *args], cwd=cfg.parent, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=3600)


def sync_once(cfg: Path, env: dict[str, str]) -> tuple[float, int]:
    t0 = time.monotonic()
    done = skipprd(cfg, env, "--log-format", "json", "sync", "--pipeline", "app", "--once")
    took = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"sync --once failed ({cfg}):\n{done.stderr[-4000:]}")
    peaks = [json.loads(line)["fields"]["peak_rss_mib"] for line in done.stderr.splitlines()
             if '"peak_rss_mib"' in line]
    return took, int(peaks[-1]) if peaks else -1


def check(cfg: Path, env: dict[str, str], what: str) -> None:
    with pg() as conn:
        want = conn.execute("SELECT count(*), coalesce(sum(amount), 0) FROM orders").fetchone()
    got = skipprd(cfg, env, "query", "--format", "csv", "SELECT count(*) AS n, sum(amount) AS s FROM orders")
    line = got.stdout.strip().splitlines()[-1] if got.stdout.strip() else ""
    n, s = line.split(",") if "," in line else ("?", "?")
    if got.returncode != 0 or int(n) != want[0] or float(s) != float(want[1]):
        raise SystemExit(f"{what}: skipprd has {line!r}, Postgres ({want[0]}, {want[1]}):\n{got.stderr[-2000:]}")


def seed() -> None:
    with pg("postgres") as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'skippr_bench_%'").fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB}")
    with pg() as conn:
        conn.execute("""
            CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL,
                                 amount numeric(12,2) NOT NULL, ordered_at timestamptz NOT NULL, note text);
            CREATE TABLE events (id bigserial PRIMARY KEY, kind text NOT NULL, at timestamptz NOT NULL DEFAULT now());
        """)
        conn.execute(f"""
            INSERT INTO orders SELECT i, (i * 7919) % 100000, (ARRAY['pending','paid','shipped'])[1 + i % 3],
                   ((i * 104729) % 1000000) / 100.0, timestamptz '2024-01-01' + i * interval '1 second', 'order ' || i
            FROM generate_series(1::bigint, {P['ROWS']}) i""")
        conn.execute("VACUUM ANALYZE orders")


def changes(run: int) -> None:
    n = P["CHANGES"]
    ins, upd = n // 2, n * 3 // 10
    dele = n - ins - upd
    base = P["ROWS"] + run * n  # fresh ids each run
    # Updates and deletes touch rows of the seed no earlier run deleted.
    lo = 1 + run * (upd + dele)
    with pg() as conn:
        for b in range(0, ins, 10_000):
            conn.execute(f"""INSERT INTO orders SELECT i, i % 100000, 'new', 1.00, now(), NULL
                             FROM generate_series({base + b + 1}, {base + min(b + 10_000, ins)}) i""")
        for b in range(0, upd, 10_000):
            conn.execute(f"UPDATE orders SET amount = amount + 1, status = 'paid' "
                         f"WHERE id BETWEEN {lo + b} AND {lo + min(b + 10_000, upd) - 1}")
        for b in range(0, dele, 10_000):
            conn.execute(f"DELETE FROM orders WHERE id BETWEEN {lo + upd + b} AND {lo + upd + min(b + 10_000, dele) - 1}")


def freshness(cfg: Path, env: dict[str, str], port: int) -> list[float]:
    log_path = cfg.parent / "serve.log"
    with open(log_path, "w") as logf:
        proc = subprocess.Popen([BIN, "--config", str(cfg), "serve"], cwd=cfg.parent, env={**os.environ, **env},
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    halt = threading.Event()

    def writer() -> None:
        with pg() as conn:
            next_at = time.monotonic()
            while not halt.is_set():
                next_at += 1 / P["RATE"]
                conn.execute("INSERT INTO events (kind) VALUES ('load')")
                time.sleep(max(0.0, next_at - time.monotonic()))

    latencies: list[float] = []
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                gw = psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=DB, autocommit=True)
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"serve did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        load = threading.Thread(target=writer, daemon=True)
        load.start()
        with gw, pg() as src:
            src.execute("SET synchronous_commit = on")
            for i in range(P["PROBES"] + 1):
                kind = f"probe-{cfg.parent.name}-{i}"
                (rid,) = src.execute("INSERT INTO events (kind) VALUES (%s) RETURNING id", (kind,)).fetchone()
                t0 = time.monotonic()
                while not gw.execute("SELECT 1 FROM events WHERE id = %s", (rid,)).fetchall():
                    if time.monotonic() - t0 > 120:
                        raise SystemExit(f"probe {kind} not visible after 120 s:\n{log_path.read_text()[-3000:]}")
                    time.sleep(0.005)
                if i > 0:  # the first probe waits for serve to load its tables
                    latencies.append(time.monotonic() - t0)
                time.sleep(0.05)
            halt.set()
            # Warm queries: the same statements again and again (the first run fills the
            # caches of footers, key columns and manifests); median of the warm runs.
            for name, sql in WARM_QUERIES.items():
                times = []
                for k in range(11):
                    t0 = time.monotonic()
                    gw.execute(sql).fetchall()
                    if k > 0:
                        times.append(time.monotonic() - t0)
                WARM.setdefault(cfg.parent.name.split("_")[1], {})[name] = statistics.median(times)
    finally:
        halt.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return latencies


def main() -> int:
    moto = Moto()
    try:
        s3 = moto.client("s3")
        for bucket in ("bench-state", "bench-lake", "bench-results"):
            s3.create_bucket(Bucket=bucket)
        envs = {"local": {}, "s3": moto.env()}
        log(f"seeding {P['ROWS']} rows")
        seed()
        res: dict[str, dict[str, list]] = {t: {"snap_s": [], "snap_rss": [], "cdc_s": [], "cdc_rss": []} for t in TARGETS}
        cfgs: dict[str, Path] = {}
        for run in range(P["RUNS"]):
            # Each run alternates which target goes first.
            order = TARGETS if run % 2 == 0 else TARGETS[::-1]
            for t in order:
                cfgs[t] = config(t, f"r{run}", free_port())
                took, rss = sync_once(cfgs[t], envs[t])
                res[t]["snap_s"].append(took)
                res[t]["snap_rss"].append(rss)
                check(cfgs[t], envs[t], f"run {run} snapshot {t}")
                log(f"run {run} snapshot {t}: {took:.2f} s, peak {rss} MiB")
            changes(run)
            for t in order:
                took, rss = sync_once(cfgs[t], envs[t])
                res[t]["cdc_s"].append(took)
                res[t]["cdc_rss"].append(rss)
                check(cfgs[t], envs[t], f"run {run} CDC {t}")
                log(f"run {run} CDC {t}: {took:.2f} s, peak {rss} MiB")
        fresh: dict[str, list[float]] = {}
        for t in TARGETS:
            port = free_port()
            cfg = config(t, "fresh", port)
            sync_once(cfg, envs[t])
            fresh[t] = freshness(cfg, envs[t], port)
            log(f"freshness {t}: p50 {pct(fresh[t], 50) * 1000:.0f} ms, p99 {pct(fresh[t], 99) * 1000:.0f} ms")
    finally:
        moto.stop()

    def med(xs: list) -> float:
        return statistics.median(xs)

    def spread(xs: list) -> str:
        return f"{min(xs):.2f}-{max(xs):.2f}"

    out = [
        f"`benches/s3.sh` (ROWS={P['ROWS']} CHANGES={P['CHANGES']} RUNS={P['RUNS']} PROBES={P['PROBES']} RATE={P['RATE']})",
        "",
        "| | local disk | S3 + Glue (moto) | S3 / local |",
        "|---|---|---|---|",
    ]
    for key, label in (("snap_s", "snapshot, s (median; spread)"), ("cdc_s", "CDC `sync --once`, s (median; spread)")):
        a, b = res["local"][key], res["s3"][key]
        out.append(f"| {label} | {med(a):.2f} ({spread(a)}) | {med(b):.2f} ({spread(b)}) | {med(b) / med(a):.2f}x |")
    for key, label in (("snap_rss", "snapshot peak RSS, MiB"), ("cdc_rss", "CDC peak RSS, MiB")):
        a, b = res["local"][key], res["s3"][key]
        out.append(f"| {label} | {med(a):.0f} | {med(b):.0f} | {med(b) / med(a):.2f}x |")
    for p in (50, 99):
        a, b = pct(fresh["local"], p) * 1000, pct(fresh["s3"], p) * 1000
        out.append(f"| freshness through `serve`, p{p} ms ({P['PROBES']} probes, {P['RATE']} tx/s) | {a:.0f} | {b:.0f} | {b / a:.2f}x |")
    for name in WARM_QUERIES:
        a, b = WARM["local"][name] * 1000, WARM["s3"][name] * 1000
        out.append(f"| warm {name} through `serve`, ms (median of 10) | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    text = "\n".join(out)
    (WORK / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
