"""Soak benchmark driver (see soak.sh): serve under steady writes, gateway clients and periodic
Postgres restarts; one row of measurements per window, then a check that nothing was lost.

The write mix keeps the table's size steady (ROWS live rows), so that memory measures skipprd
and not the data growing: 30% inserts of new ids, 40% updates of a live row, 30% deletes of
the oldest live row. Each gateway client runs an aggregate over the table, then thinks for
THINK_MS.

Parameters (environment, defaults): DURATION=3600 seconds, RATE=1000 transactions/s,
CLIENTS=50 gateway clients, THINK_MS=500, RESTART_EVERY=600 seconds, WINDOW=300 seconds,
ROWS=100000 seeded rows, PROBES=20 freshness probes per window.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import psycopg

from benchlib import free_port, pct, pg_connect

P = {k: int(os.environ.get(k, v)) for k, v in {
    "DURATION": 3600, "RATE": 1000, "CLIENTS": 50, "RESTART_EVERY": 600, "WINDOW": 300,
    "ROWS": 100_000, "PROBES": 20, "THINK_MS": 500,
}.items()}
BIN = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
PG_BIN = Path(os.environ["PG_BIN"])
PG_DATA = os.environ["PG_DATA"]
PG_LOG = os.environ["PG_LOG"]
DB = "soak"


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pg(dbname: str = DB) -> psycopg.Connection:
    return pg_connect(PG_PORT, dbname)


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.values[key] = self.values.get(key, 0) + n

    def take(self) -> dict[str, int]:
        with self.lock:
            out, self.values = self.values, {}
        return out


COUNT = Counters()
HALT = threading.Event()


class Ids:
    """The live id range [oldest, next): inserts take `next`, deletes take `oldest`."""

    def __init__(self, rows: int) -> None:
        self.lock = threading.Lock()
        self.oldest, self.next = 1, rows + 1

    def insert(self) -> int:
        with self.lock:
            self.next += 1
            return self.next - 1

    def delete(self) -> int | None:
        with self.lock:
            if self.next - self.oldest <= P["ROWS"] // 2:
                return None
            self.oldest += 1
            return self.oldest - 1

    def live(self, rng: random.Random) -> int:
        with self.lock:
            return rng.randrange(self.oldest, self.next)


IDS = Ids(P["ROWS"])


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
            op = rng.random()
            gone = IDS.delete() if op >= 0.7 else None
            if op < 0.3 or (op >= 0.7 and gone is None):
                conn.execute("INSERT INTO events (id, k, v, n) VALUES (%s, %s, md5(random()::text), 0)",
                             (IDS.insert(), rng.randint(1, 1000)))
            elif op < 0.7:
                conn.execute("UPDATE events SET n = n + 1 WHERE id = %s", (IDS.live(rng),))
            else:
                conn.execute("DELETE FROM events WHERE id = %s", (gone,))
            COUNT.add("writes")
        except psycopg.Error:
            COUNT.add("write_errors")
            conn = None
            time.sleep(0.2)


def reader(port: int, seed: int) -> None:
    rng = random.Random(seed)
    conn = None
    while not HALT.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="soak", autocommit=True)
            conn.execute("SELECT count(*), max(n) FROM analytics.events WHERE k = %s", (rng.randint(1, 1000),)).fetchall()
            COUNT.add("queries")
        except psycopg.Error:
            COUNT.add("query_errors")
            conn = None
            time.sleep(0.5)
        time.sleep(P["THINK_MS"] / 1000)


def probe(src: psycopg.Connection, gw_port: int, marker: int) -> float:
    src.execute("INSERT INTO events (id, k, v, n) VALUES (%s, 0, 'probe', 0)", (marker,))
    start = time.monotonic()
    with psycopg.connect(host="127.0.0.1", port=gw_port, dbname="analytics", user="soak", autocommit=True) as gw:
        while time.monotonic() - start < 60:
            if gw.execute("SELECT 1 FROM analytics.events WHERE id = %s", (marker,)).fetchone():
                return time.monotonic() - start
            time.sleep(0.01)
    return float("inf")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def restart_postgres() -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", PG_DATA, "-l", PG_LOG,
                    "-m", "fast", "-w", "restart"], check=True, capture_output=True)


def main() -> None:
    with pg("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DB,)).fetchall():
            c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        c.execute(f"CREATE DATABASE {DB}")
    with pg() as c:
        c.execute("CREATE TABLE events (id bigserial PRIMARY KEY, k int NOT NULL, v text, n int NOT NULL)")
        c.execute("INSERT INTO events (k, v, n) SELECT g %% 1000, md5(g::text), 0 FROM generate_series(1, %s) g",
                  (P["ROWS"],))
        c.execute("SELECT setval('events_id_seq', %s)", (P["ROWS"] * 2,))
    gw_port, metrics_port = free_port(), free_port()
    (WORK / "skippr.yml").write_text(
        "skippr:\n  workspace: analytics\n"
        f"  query:\n    listen: 127.0.0.1:{gw_port}\n  metrics:\n    listen: 127.0.0.1:{metrics_port}\n"
        "pipelines:\n  app:\n    data_source: data_sources.src\n    data_sink: data_sinks.lake\n"
        "data_sources:\n  src:\n    Postgres:\n"
        f"      host: 127.0.0.1\n      port: {PG_PORT}\n      user: postgres\n      database: {DB}\n"
        "      tables: [events]\n"
        "data_sinks:\n  lake:\n    LocalIceberg:\n      warehouse: ./warehouse\n")
    stderr = open(WORK / "serve.stderr", "w")
    serve = subprocess.Popen([BIN, "--config", str(WORK / "skippr.yml"), "serve"], cwd=WORK,
                             stdout=subprocess.DEVNULL, stderr=stderr)
    (WORK / "serve.pid").write_text(str(serve.pid))
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with psycopg.connect(host="127.0.0.1", port=gw_port, dbname="analytics", user="soak") as gw:
                    if gw.execute("SELECT pipeline_state FROM skippr.tables").fetchone() == ("streaming",):
                        break
            except psycopg.Error:
                pass
            if time.monotonic() > deadline or serve.poll() is not None:
                raise SystemExit(f"serve did not start streaming; see {WORK / 'serve.stderr'}")
            time.sleep(1)
        log(f"streaming; soak for {P['DURATION']}s")
        writers = max(1, P["RATE"] // 100)
        threads = [threading.Thread(target=writer, args=(P["RATE"] / writers, i), daemon=True) for i in range(writers)]
        threads += [threading.Thread(target=reader, args=(gw_port, 1000 + i), daemon=True) for i in range(P["CLIENTS"])]
        for t in threads:
            t.start()
        rows = []
        src = pg()
        start = time.monotonic()
        next_restart = start + P["RESTART_EVERY"]
        marker = 10**12
        window = 0
        while time.monotonic() - start < P["DURATION"]:
            window += 1
            w_end = min(start + window * P["WINDOW"], start + P["DURATION"])
            fresh = []
            probes = 0
            restarts = 0
            while time.monotonic() < w_end:
                if time.monotonic() >= next_restart:
                    log("restarting Postgres (fast)")
                    restart_postgres()
                    src = pg()
                    restarts += 1
                    next_restart += P["RESTART_EVERY"]
                if probes < P["PROBES"]:
                    marker += 1
                    probes += 1
                    try:
                        fresh.append(probe(src, gw_port, marker))
                    except psycopg.Error:
                        src = pg()
                time.sleep(max(0.0, min(w_end - time.monotonic(), P["WINDOW"] / max(1, P["PROBES"]))))
            counts = COUNT.take()
            with pg() as c:
                lag = c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                                "FROM pg_replication_slots WHERE slot_name = 'skippr_analytics_app'").fetchone()
            rows.append({
                "window": window, "rss_mib": rss_kib(serve.pid) / 1024, "slot_lag_mib": (lag[0] if lag else 0) / 2**20,
                "fresh_p99_ms": pct(fresh, 99) * 1000, "writes": counts.get("writes", 0),
                "write_errors": counts.get("write_errors", 0), "queries": counts.get("queries", 0),
                "query_errors": counts.get("query_errors", 0), "restarts": restarts,
                "reconnects": metric(metrics_port, "skippr_reconnects_total"),
            })
            log(str(rows[-1]))
            assert serve.poll() is None, "serve exited"
        HALT.set()
        for t in threads:
            t.join(timeout=30)
        expected = pg().execute("SELECT id, k, v, n FROM events ORDER BY id").fetchall()
        deadline = time.monotonic() + 600
        while True:
            with psycopg.connect(host="127.0.0.1", port=gw_port, dbname="analytics", user="soak") as gw:
                got = gw.execute("SELECT id, k, v, n FROM analytics.events ORDER BY id").fetchall()
            if got == expected:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the live table differs from Postgres ({len(got)} vs {len(expected)} rows)")
            time.sleep(2)
        serve.terminate()
        code = serve.wait(timeout=300)
        head = "| window | RSS MiB | slot lag MiB | freshness p99 ms | writes | write errors | queries | query errors | PG restarts | reconnects (total) |"
        lines = [f"Soak: {P}", "", head, "|" + "---|" * 10]
        for r in rows:
            lines.append(f"| {r['window']} | {r['rss_mib']:.0f} | {r['slot_lag_mib']:.1f} | {r['fresh_p99_ms']:.0f} | "
                         f"{r['writes']} | {r['write_errors']} | {r['queries']} | {r['query_errors']} | "
                         f"{r['restarts']} | {r['reconnects']:.0f} |")
        lines += ["", f"live table equal to Postgres at the end ({len(expected)} rows); serve exit code {code}"]
        text = "\n".join(lines) + "\n"
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
    main()
