#!/usr/bin/env python3
"""Benchmark of `skipprd serve`, the Postgres-wire gateway over the live tables. Started by
benches/serve.sh (which starts the private Postgres cluster and picks the binary); this script
does the rest in one run and prints a Markdown results block with the exact command:

1. Freshness: WRITERS connections commit a paced load of RATE transactions/s into `events`
   while `serve` runs with commit_interval COMMIT_INTERVAL (10s). A probe commits one marker
   row (its session with synchronous_commit = on, so the commit is flushed when it returns, as
   on a default server), polls the gateway every POLL_MS until the row is visible, pauses
   PROBE_INTERVAL_MS, and again, PROBES times. Reported: the achieved load, p50/p99/max of the
   latencies, and the Iceberg commits in the window (skippr_commits_total), to show commits
   are not per transaction.
2. Union overhead: `orders` (ROWS rows) is snapshotted with `sync --once`; `serve` runs with
   commit_interval 1h, 1% of the rows (id % 100 = 0, spread over the key range) are updated and
   waited for in skippr.tables; the aggregate is timed through the gateway (median of RUNS
   after a warm-up). SIGTERM commits the tail; a new `serve` (empty tail) times it again.
3. Analytics: the aggregate and a join (orders x customers, group by region) through the
   gateway (empty tail), through DuckDB's iceberg_scan of the same metadata JSON, and on the
   source Postgres. Every engine's answer is checked against Postgres.
4. Concurrency: CLIENTS gateway connections run point lookups and small aggregates for
   DURATION seconds while one writer commits CONC_RATE transactions/s (updates of `orders`,
   inserts into `events`); total queries, errors (must be 0), p50/p99 latency, and clients
   that read stale data (the same max(id) of `events` for 3 s while the writer inserts).
5. Point lookups: `SELECT id, customer_id, status, amount FROM orders WHERE id = $1` with
   random keys for LOOKUP_SECONDS, by 1 client and by CLIENTS clients, through the gateway and,
   as the baseline of the same run, on the source Postgres, while the writer of phase 4 goes
   on (queries/s, p50, p99).

Gateway clients are psycopg 3 with its default prepare_threshold (PREPARE=auto: a query run 5
times on a connection becomes a named server-side prepared statement, as pgjdbc and asyncpg do
too), or never prepared (PREPARE=never).

Peak RSS of each `serve` process is its rusage maximum (what /usr/bin/time -f %M reports),
read when it is reaped after SIGTERM.

Exit code 1 when something is wrong rather than slow: a wrong answer, a query error, stale
reads, a probe that never saw its row (each listed under "Problems" in the report), or a
failure (the `serve` log tail is printed). Targets missed are reported, not failed.

Parameters are environment variables (defaults in PARAMS below). Environment from serve.sh:
SKIPPRD (binary), BENCH_WORK (work folder), BENCH_PG_PORT, PGHOST/PGPORT/PGUSER (the cluster).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg

from benchlib import (AGG_SQL, JOIN_SQL, BenchError, Load, ProbeTimeout, Serve, ServeEnv, binary_kind,
                      binary_time, check_same as check_same_in, command_line, create_and_copy, fetch as fetch_in,
                      machine, ms, probe_once as probe_in, run_main, source_version, tail, timed_runs as timed_runs_in,
                      wait_for, warm_up_probe)

# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------

PARAMS: dict[str, str] = {
    "ROWS": "5000000",            # rows of `orders`
    "CUSTOMERS": "100000",        # rows of `customers`
    "RUNS": "7",                  # timed runs per query (after one warm-up)
    "DURATION": "60",             # seconds of the concurrency phase
    "CLIENTS": "100",             # gateway connections of the concurrency phase
    "RATE": "1000",               # target transactions/s of the freshness load
    "WRITERS": "4",               # connections of the freshness load
    "PROBES": "300",              # freshness probes
    "PROBE_INTERVAL_MS": "50",    # pause between probes
    "POLL_MS": "5",               # pause between gateway polls of one probe
    "COMMIT_INTERVAL": "10s",     # commit_interval of the freshness and concurrency phases
    "CONC_RATE": "200",           # transactions/s of the writer during the concurrency phase
    "LOOKUP_SECONDS": "20",       # seconds of each run of the lookup phase (1 client, then CLIENTS)
    "PREPARE": "auto",            # gateway clients: "auto" = psycopg's default (a statement run 5 times
                                  # on a connection becomes a server-side prepared statement), "never"
}
P = {k: os.environ.get(k, v) for k, v in PARAMS.items()}
ROWS, CUSTOMERS, RUNS, CLIENTS = int(P["ROWS"]), int(P["CUSTOMERS"]), int(P["RUNS"]), int(P["CLIENTS"])
DURATION, RATE, WRITERS, PROBES = float(P["DURATION"]), float(P["RATE"]), int(P["WRITERS"]), int(P["PROBES"])
PROBE_INTERVAL, POLL = float(P["PROBE_INTERVAL_MS"]) / 1000, float(P["POLL_MS"]) / 1000
COMMIT_INTERVAL, CONC_RATE = P["COMMIT_INTERVAL"], float(P["CONC_RATE"])
LOOKUP_SECONDS = float(P["LOOKUP_SECONDS"])
if P["PREPARE"] not in ("auto", "never"):
    sys.exit(f"PREPARE must be auto or never, not {P['PREPARE']!r}")

#: Bounds of every wait (seconds).
SERVE_START_TIMEOUT = float(os.environ.get("SERVE_START_TIMEOUT", "300"))
SERVE_STOP_TIMEOUT = float(os.environ.get("SERVE_STOP_TIMEOUT", "300"))
SYNC_TIMEOUT = float(os.environ.get("SYNC_TIMEOUT", "3600"))
TAIL_TIMEOUT = float(os.environ.get("TAIL_TIMEOUT", "300"))
PROBE_TIMEOUT = float(os.environ.get("PROBE_TIMEOUT", "30"))
QUERY_TIMEOUT = float(os.environ.get("QUERY_TIMEOUT", "600"))

BIN = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
REPO = Path(__file__).resolve().parent.parent
DB = "bench_serve"
WS = "bench"  # the workspace: tables are bench.orders, bench.customers, bench.events


def log(msg: str) -> None:
    print(f"[serve-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


ENV = ServeEnv(bin=BIN, work=WORK, pg_port=PG_PORT, db=DB, ws=WS, tables=["orders", "customers", "events"],
               prepare=P["PREPARE"], log=log)
pg, gateway, tables_status, metric = ENV.pg, ENV.gateway, ENV.tables_status, ENV.metric


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def secs(seconds: float) -> str:
    return f"{seconds:.3f}"


# --------------------------------------------------------------------------------------------
# Query timing and checks
# --------------------------------------------------------------------------------------------


def timed_runs(run: Callable[[], Any], runs: int = RUNS) -> tuple[float, list[float], Any]:
    return timed_runs_in(run, runs)


def fetch(conn: psycopg.Connection, sql: str) -> Callable[[], list[tuple]]:
    return fetch_in(conn, sql, QUERY_TIMEOUT)


problems: list[str] = []


def check_same(label: str, expected: list[tuple], actual: list[tuple]) -> None:
    check_same_in(problems, label, expected, actual, log)


# --------------------------------------------------------------------------------------------
# The phases
# --------------------------------------------------------------------------------------------

R: dict[str, Any] = {}  # results


def phase_union_and_analytics() -> None:
    """Union overhead (gateway with a 1% tail vs with an empty tail) and analytics (gateway vs
    DuckDB vs Postgres). commit_interval 1h: nothing is committed while the tail is measured."""
    # serve with a tail of 1% of the rows -------------------------------------------------
    serve = Serve(ENV, "1-tail", "1h")
    serve.wait_ready(SERVE_START_TIMEOUT)
    with gateway() as gw:
        committed_before = tables_status(gw)["orders"]["committed_lsn"]
        with pg() as src:
            t0 = time.monotonic()
            updated = src.execute("UPDATE orders SET amount = amount + 1, status = 'updated' "
                                  "WHERE id % 100 = 0").rowcount
            expected_agg = src.execute(AGG_SQL.format(orders="orders")).fetchall()
        log(f"updated {updated} orders; waiting for them in the tail")

        def in_tail() -> dict | None:
            s = tables_status(gw)["orders"]
            return s if s["wal_tail_rows"] >= updated and s["wal_tail_changes"] >= updated else None

        status = wait_for(f"{updated} updated rows of orders in skippr.tables' wal_tail_rows",
                          TAIL_TIMEOUT, in_tail, alive=serve.alive)
        R["tail_visible_s"] = time.monotonic() - t0
        R["tail_rows"], R["tail_changes"] = status["wal_tail_rows"], status["wal_tail_changes"]
        log(f"tail: {status['wal_tail_rows']} rows, {status['wal_tail_changes']} changes; timing the aggregate")
        R["agg_tail_s"], R["agg_tail_all"], answer = timed_runs(fetch(gw, AGG_SQL.format(orders=f"{WS}.orders")))
        check_same("gateway aggregate with the tail", expected_agg, answer)
        after = tables_status(gw)["orders"]
        if after["committed_lsn"] != committed_before or after["wal_tail_rows"] < updated:
            problems.append(f"orders was committed while the tail was measured (commit_interval 1h): "
                            f"committed_lsn {committed_before} -> {after['committed_lsn']}, tail {after['wal_tail_rows']} rows")
    serve.alive()
    R["stop_commit_s"] = serve.stop(SERVE_STOP_TIMEOUT)
    R["rss_tail"] = serve.peak_rss_kib

    # serve again: the tail was committed at the stop, so it is empty ----------------------
    serve = Serve(ENV, "2-empty", "1h")
    serve.wait_ready(SERVE_START_TIMEOUT)
    with gateway() as gw:
        wait_for("an empty tail of orders after the restart", 60,
                 lambda: tables_status(gw)["orders"]["wal_tail_changes"] == 0, alive=serve.alive)
        log("empty tail; timing the aggregate and the join through the gateway")
        R["agg_empty_s"], R["agg_empty_all"], answer = timed_runs(fetch(gw, AGG_SQL.format(orders=f"{WS}.orders")))
        check_same("gateway aggregate, empty tail", expected_agg, answer)
        R["gw_join_s"], _, gw_join = timed_runs(fetch(gw, JOIN_SQL.format(orders=f"{WS}.orders",
                                                                           customers=f"{WS}.customers")))
    serve.alive()
    serve.stop(SERVE_STOP_TIMEOUT)
    R["rss_empty"] = serve.peak_rss_kib

    # the same queries in DuckDB over the same Iceberg metadata, and in Postgres -------------
    log("timing DuckDB (iceberg_scan) and Postgres")
    con = ENV.duckdb()
    R["duckdb_version"] = con.execute("SELECT version()").fetchone()[0]
    R["duckdb_threads"] = con.execute("SELECT current_setting('threads')").fetchone()[0]
    for t in ("orders", "customers"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM iceberg_scan('{ENV.metadata_location(t)}')")
    R["duck_agg_s"], _, answer = timed_runs(lambda: con.execute(AGG_SQL.format(orders="orders")).fetchall())
    check_same("DuckDB aggregate", expected_agg, answer)
    R["duck_join_s"], _, duck_join = timed_runs(
        lambda: con.execute(JOIN_SQL.format(orders="orders", customers="customers")).fetchall())
    con.close()
    with pg() as src:
        R["pg_agg_s"], _, _ = timed_runs(fetch(src, AGG_SQL.format(orders="orders")))
        R["pg_join_s"], _, pg_join = timed_runs(fetch(src, JOIN_SQL.format(orders="orders", customers="customers")))
        R["pg_workers"] = src.execute("SHOW max_parallel_workers_per_gather").fetchone()[0]
    check_same("gateway join", pg_join, gw_join)
    check_same("DuckDB join", pg_join, duck_join)


def probe_once(src: psycopg.Connection, gw: psycopg.Connection, serve: Serve) -> float:
    return probe_in(ENV, src, gw, serve, POLL, PROBE_TIMEOUT)


def phase_freshness(serve: Serve) -> None:
    """Probes under a steady load, with commits every COMMIT_INTERVAL. A probe that times out is
    recorded as a problem; the phase ends after 3 of them (or the first stale-statement one)."""
    log(f"freshness: load of {RATE:.0f} tx/s on {WRITERS} connections, {PROBES} probes")
    load = Load(ENV, RATE, WRITERS, "events").start()
    timeouts: list[str] = []
    with pg() as src, gateway() as gw:
        src.execute("SET synchronous_commit = on")  # the probe's commit is flushed when it returns
        warm_up_probe(ENV, src, serve, POLL, SERVE_START_TIMEOUT)  # not measured; then the load settles
        time.sleep(3)
        commits0, events_commits0 = metric("skippr_commits_total"), metric("skippr_commits_total", table="events")
        tx0, t0 = load.total(), time.monotonic()
        latencies: list[float] = []
        for i in range(PROBES):
            if load.errors:
                break
            try:
                latencies.append(probe_once(src, gw, serve))
            except ProbeTimeout as e:
                log(f"  {e}")
                timeouts.append(str(e))
                if len(timeouts) >= 3 or "prepared statement" in str(e):
                    break
            if (i + 1) % 50 == 0 and latencies:
                log(f"  {i + 1} probes, p50 {ms(pct(latencies, 50))}, max {ms(max(latencies))}")
            time.sleep(PROBE_INTERVAL)
        window = time.monotonic() - t0
        tx = load.total() - tx0
        R["commits"] = metric("skippr_commits_total") - commits0
        R["events_commits"] = metric("skippr_commits_total", table="events") - events_commits0
        status = tables_status(gw)["events"]
    load.stop()
    R.update(fresh_window_s=window, fresh_tx=tx, fresh_rate=tx / window, latencies=latencies,
             fresh_timeouts=len(timeouts), fresh_tail_rows=status["wal_tail_rows"], fresh_lag=status["lag_seconds"])
    log(f"freshness: {tx / window:.0f} tx/s achieved, {len(latencies)} probes seen, {len(timeouts)} timed out, "
        f"{R['commits']:.0f} Iceberg commits in {window:.0f}s")
    if timeouts:
        problems.append(f"freshness: {len(timeouts)} probe(s) timed out, the phase stopped after "
                        f"{len(latencies) + len(timeouts)} probes; first: {timeouts[0]}")
    if tx / window < 500:
        problems.append(f"the freshness load reached only {tx / window:.0f} transactions/s (needs >= 500)")


def random_range(rng: random.Random) -> tuple[int, int]:
    lo = rng.randint(1, max(1, ROWS - 999))
    return lo, lo + 999


#: The short queries of the concurrency phase: name -> (SQL, parameters from an RNG).
SHORT_QUERIES: dict[str, tuple[str, Callable[[random.Random], Any]]] = {
    "orders by key": ("SELECT id, customer_id, status, amount FROM bench.orders WHERE id = %s",
                      lambda rng: (rng.randint(1, ROWS),)),
    "customers by key": ("SELECT id, name, region FROM bench.customers WHERE id = %s",
                         lambda rng: (rng.randrange(CUSTOMERS),)),
    "orders 1000-key range agg": ("SELECT count(*), sum(amount) FROM bench.orders WHERE id BETWEEN %s AND %s",
                                  random_range),
    "events agg": ("SELECT count(*), max(id) FROM bench.events", lambda rng: None),
}


#: The lookup phase's one query, by primary key; `{orders}` is bench.orders through the gateway
#: and orders in the source Postgres.
LOOKUP_SQL = "SELECT id, customer_id, status, amount FROM {orders} WHERE id = %s"
GATEWAY_LOOKUP = {"orders by key": (LOOKUP_SQL.format(orders="bench.orders"), lambda rng: (rng.randint(1, ROWS),))}
POSTGRES_LOOKUP = {"orders by key": (LOOKUP_SQL.format(orders="orders"), lambda rng: (rng.randint(1, ROWS),))}


class Clients:
    """`n` connections (the gateway's unless `connect` says otherwise); each runs random
    `queries` (SHORT_QUERIES by default) back to back from `go` until `stop_at`, recording
    latencies and errors (a broken connection is reopened)."""

    def __init__(self, n: int, queries: dict[str, tuple[str, Callable[[random.Random], Any]]] | None = None,
                 connect: Callable[[], psycopg.Connection] | None = None) -> None:
        self.queries = queries or SHORT_QUERIES
        self.connect = connect or (lambda: gateway(timeout=30))
        self.latency: dict[str, list[float]] = {k: [] for k in self.queries}
        self.errors: list[str] = []
        self.error_count = 0
        self.lock = threading.Lock()
        self.connected = threading.Barrier(n + 1)
        self.go = threading.Event()
        self.stop_at = 0.0
        #: staleness: client -> [time of its first `events agg`, max(id) of events it last saw,
        #: since when it has been seeing that value]
        self.events_seen: dict[int, list[Any]] = {}
        self.checked: set[int] = set()  # clients with two `events agg` 3 s or more apart
        self.stale: set[int] = set()    # clients that saw the same max(id) for 3 s or more
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _error(self, text: str) -> None:
        with self.lock:
            self.error_count += 1
            if len(self.errors) < 20:
                self.errors.append(text)

    def _saw_events(self, i: int, t: float, max_id: int) -> None:
        first, value, since = self.events_seen.setdefault(i, [t, max_id, t])
        if t - first >= 3:
            self.checked.add(i)
        if max_id != value:
            self.events_seen[i][1:] = [max_id, t]
        elif t - since >= 3:
            self.stale.add(i)

    def _run(self, i: int) -> None:
        rng = random.Random(1000 + i)
        conn = None
        try:
            conn = self.connect()
        except psycopg.Error as e:
            self._error(f"client {i} connect: {type(e).__name__}: {str(e).strip()}")
        try:
            self.connected.wait(timeout=120)
        except threading.BrokenBarrierError:
            return
        self.go.wait()
        mine: dict[str, list[float]] = {k: [] for k in self.queries}
        names = list(self.queries)
        while conn is not None and time.monotonic() < self.stop_at:
            name = rng.choice(names)
            sql, params = self.queries[name]
            t0 = time.perf_counter()
            try:
                rows = conn.execute(sql, params(rng)).fetchall()
                mine[name].append(time.perf_counter() - t0)
                if name == "events agg":
                    self._saw_events(i, t0, rows[0][1])
            except psycopg.Error as e:
                self._error(f"client {i} {name}: {type(e).__name__}: {str(e).strip()}")
                if conn.broken:
                    try:
                        conn = self.connect()
                    except psycopg.Error:
                        conn = None
        with self.lock:
            for k, v in mine.items():
                self.latency[k].extend(v)
        if conn is not None:
            conn.close()


def run_clients(clients: Clients, label: str, seconds: float, serve: Serve,
                connected: Callable[[], Any] | None = None) -> float:
    """Waits for the clients to connect, calls `connected`, lets them run for `seconds` while
    `serve` stays up, waits for their last answers; returns the elapsed seconds."""
    try:
        clients.connected.wait(timeout=120)
    except threading.BrokenBarrierError:
        raise BenchError(f"{label}: the {len(clients.threads)} clients did not connect within 120s; "
                         f"errors: {clients.errors[:5]}\n{tail(serve.logfile)}") from None
    if connected:
        connected()
    t0 = time.monotonic()
    clients.stop_at = t0 + seconds
    clients.go.set()
    while time.monotonic() < clients.stop_at:
        serve.alive()
        time.sleep(0.5)
    for t in clients.threads:
        t.join(timeout=max(1.0, clients.stop_at + QUERY_TIMEOUT - time.monotonic()))
    elapsed = time.monotonic() - t0
    if any(t.is_alive() for t in clients.threads):
        raise BenchError(f"{label}: clients were still waiting for an answer {QUERY_TIMEOUT:.0f}s after the end\n"
                         f"{tail(serve.logfile)}")
    return elapsed


def phase_concurrency(serve: Serve) -> None:
    log(f"concurrency: {CLIENTS} clients for {DURATION:.0f}s, writer at {CONC_RATE:.0f} tx/s")
    clients = Clients(CLIENTS)
    load = Load(ENV, CONC_RATE, 1, "orders", ROWS)
    elapsed = run_clients(clients, "concurrency", DURATION, serve, connected=load.start)
    writer_tx = load.total()
    load.stop()
    all_lat = [x for v in clients.latency.values() for x in v]
    R.update(conc_elapsed=elapsed, conc_latency=clients.latency, conc_all=all_lat, conc_errors=clients.error_count,
             conc_writer_rate=writer_tx / elapsed)
    log(f"concurrency: {len(all_lat)} queries, {clients.error_count} errors")
    # The writer inserts about CONC_RATE/2 events a second all along: a client that saw the same
    # max(id) of events for 3 s or more read stale data.
    R["conc_stale"], R["conc_checked"] = len(clients.stale), len(clients.checked)
    if clients.stale and CONC_RATE >= 10:
        problems.append(f"concurrency: {len(clients.stale)} of {len(clients.checked)} clients saw the same max(id) "
                        f"of events for 3 s or more while the writer inserted (stale answers; PREPARE={P['PREPARE']})")
    if clients.error_count:
        problems.append(f"concurrency: {clients.error_count} errors; first ones:\n  " + "\n  ".join(clients.errors[:5]))


def postgres_client() -> psycopg.Connection:
    """A connection to the source Postgres that prepares statements as the gateway clients do."""
    conn = pg()
    if P["PREPARE"] == "never":
        conn.prepare_threshold = None
    return conn


def lookups(label: str, n: int, queries: dict[str, tuple[str, Callable[[random.Random], Any]]],
            connect: Callable[[], psycopg.Connection], serve: Serve) -> dict[str, float]:
    """`n` clients run the lookup back to back for LOOKUP_SECONDS: count, queries/s, p50, p99."""
    clients = Clients(n, queries, connect)
    elapsed = run_clients(clients, f"lookups on {label}", LOOKUP_SECONDS, serve)
    if clients.error_count:
        problems.append(f"lookups on {label} ({n} clients): {clients.error_count} errors; first ones:\n  "
                        + "\n  ".join(clients.errors[:5]))
    lat = clients.latency["orders by key"]
    log(f"lookups on {label}, {n} clients: {len(lat)} in {elapsed:.1f}s")
    return {"count": len(lat), "qps": len(lat) / elapsed,
            "p50": pct(lat, 50) if lat else math.nan, "p99": pct(lat, 99) if lat else math.nan}


def phase_lookups(serve: Serve) -> None:
    log(f"lookups: 1 and {CLIENTS} clients, {LOOKUP_SECONDS:.0f}s each, gateway and Postgres, "
        f"writer at {CONC_RATE:.0f} tx/s")
    load = Load(ENV, CONC_RATE, 1, "orders", ROWS).start()
    t0 = time.monotonic()
    runs = {}
    for n in (1, CLIENTS):
        runs[("gateway", n)] = lookups("the gateway", n, GATEWAY_LOOKUP, lambda: gateway(timeout=30), serve)
        runs[("postgres", n)] = lookups("Postgres", n, POSTGRES_LOOKUP, postgres_client, serve)
    R["lookup_writer_rate"] = load.total() / (time.monotonic() - t0)
    load.stop()
    R["lookups"] = runs


def phase_live() -> None:
    """Freshness, concurrency and lookups, on one `serve` with the normal commit_interval."""
    serve = Serve(ENV, "3-live", COMMIT_INTERVAL)
    serve.wait_ready(SERVE_START_TIMEOUT)
    phase_freshness(serve)
    phase_concurrency(serve)
    phase_lookups(serve)
    R["commits_total"] = metric("skippr_commits_total")
    serve.alive()
    R["stop_live_s"] = serve.stop(SERVE_STOP_TIMEOUT)
    R["rss_live"] = serve.peak_rss_kib


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def report(setup: dict[str, Any]) -> str:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "n/a"

    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lat = R["latencies"]

    def lat_ms(p: float) -> str:
        return ms(pct(lat, p)) if lat else "-"
    with pg() as src:
        pg_version = src.execute("SHOW server_version").fetchone()[0]
    union_ratio = R["agg_tail_s"] / R["agg_empty_s"]
    out = [
        "## skipprd serve",
        "",
        "```sh",
        command_line(P, "benches/serve.sh"),
        "```",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}; "
        f"Postgres {pg_version}; skipprd {binary_kind(BIN)} build `{BIN}` of {binary_time(BIN)} (source tree at {source_version(REPO)}). "
        f"Snapshot of {ROWS:,} orders + {CUSTOMERS:,} customers by `sync --once`: {setup['sync_s']:.1f} s, "
        f"peak RSS {setup['sync_rss'] // 1024} MiB.",
        "",
        f"### Freshness (commit_interval {COMMIT_INTERVAL})",
        "",
        "| load (target) | achieved | probes seen (timed out) | p50 | p99 | max | Iceberg commits in window | target p99 <= 500 ms |",
        "|---|---|---|---|---|---|---|---|",
        f"| {RATE:.0f} tx/s on {WRITERS} connections | {R['fresh_rate']:.0f} tx/s ({R['fresh_tx']:,} tx in "
        f"{R['fresh_window_s']:.1f} s) | {len(lat)} ({R['fresh_timeouts']}) | {lat_ms(50)} | {lat_ms(99)} | "
        f"{ms(max(lat)) if lat else '-'} | {R['commits']:.0f} ({R['events_commits']:.0f} of `events`) | "
        f"{met(bool(lat) and not R['fresh_timeouts'] and pct(lat, 99) <= 0.5)} |",
        "",
        f"A probe commits one row (synchronous_commit = on), polls "
        f"`SELECT id FROM bench.events WHERE id = $1` through the gateway every {POLL * 1000:.0f} ms until it sees "
        f"the row, then pauses {PROBE_INTERVAL * 1000:.0f} ms; latency is from the commit returning to the first poll "
        f"that sees the row (psycopg, PREPARE={P['PREPARE']}; a probe times out after {PROBE_TIMEOUT:.0f} s). At the end of the window `events` had "
        f"{R['fresh_tail_rows']:,} rows in the tail, lag {float(R['fresh_lag']):.1f} s.",
        "",
        f"### Union overhead ({ROWS:,} rows, 1% updated in the tail)",
        "",
        "| tail | aggregate through the gateway (median of "
        f"{RUNS}) |",
        "|---|---|",
        f"| {R['tail_rows']:,} rows ({R['tail_changes']:,} changes), commit_interval 1h | {secs(R['agg_tail_s'])} s |",
        f"| empty (after SIGTERM committed it and a restart) | {secs(R['agg_empty_s'])} s |",
        f"| **ratio** | **{union_ratio:.2f}x** (target <= 1.2x: {met(union_ratio <= 1.2)}) |",
        "",
        f"Aggregate: `{AGG_SQL.format(orders='bench.orders')}`. The update reached `skippr.tables` "
        f"{R['tail_visible_s']:.1f} s after it committed; the SIGTERM that committed the tail took "
        f"{R['stop_commit_s']:.1f} s. Runs with the tail: {', '.join(secs(x) for x in R['agg_tail_all'])}; "
        f"empty: {', '.join(secs(x) for x in R['agg_empty_all'])}.",
        "",
        f"### Analytics (empty tail, median of {RUNS})",
        "",
        "| query | gateway (s) | DuckDB iceberg_scan (s) | Postgres (s) | gateway / DuckDB | gateway / Postgres |",
        "|---|---|---|---|---|---|",
        f"| aggregate | {secs(R['agg_empty_s'])} | {secs(R['duck_agg_s'])} | {secs(R['pg_agg_s'])} | "
        f"{ratio(R['agg_empty_s'], R['duck_agg_s'])} | {ratio(R['agg_empty_s'], R['pg_agg_s'])} |",
        f"| join + group by | {secs(R['gw_join_s'])} | {secs(R['duck_join_s'])} | {secs(R['pg_join_s'])} | "
        f"{ratio(R['gw_join_s'], R['duck_join_s'])} | {ratio(R['gw_join_s'], R['pg_join_s'])} |",
        "",
        f"Join: `{JOIN_SQL.format(orders='bench.orders', customers='bench.customers')}`. DuckDB {R['duckdb_version']} "
        f"({R['duckdb_threads']} threads) reads the tables' current metadata JSON; Postgres with "
        f"max_parallel_workers_per_gather = {R['pg_workers']}. Each engine's answer was checked against Postgres.",
        "",
        f"### Concurrency ({CLIENTS} connections, {R['conc_elapsed']:.0f} s, writer at {R['conc_writer_rate']:.0f} tx/s)",
        "",
        "| queries | queries/s | errors | clients with stale answers | p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    a = R["conc_all"]
    if a:
        out.append(f"| {len(a):,} | {len(a) / R['conc_elapsed']:.0f} | {R['conc_errors']} | {R['conc_stale']} of {R['conc_checked']} | "
                   f"{ms(pct(a, 50))} | {ms(pct(a, 99))} | {ms(max(a))} |")
    else:
        out.append(f"| 0 | 0 | {R['conc_errors']} | - | - | - | - |")
    out += ["", f"Each client (psycopg, PREPARE={P['PREPARE']}) runs one of these at random, back to back; a client "
            "has stale answers if it saw the same `max(id)` of `events` for 3 s or more while the writer inserted "
            "(counted among the clients whose reads of it span 3 s or more).",
            "", "| query | count | p50 | p99 |", "|---|---|---|---|"]
    for k, v in R["conc_latency"].items():
        out.append(f"| {k} | {len(v):,} | {ms(pct(v, 50)) if v else '-'} | {ms(pct(v, 99)) if v else '-'} |")
    out += [
        "",
        f"### Point lookups by key ({LOOKUP_SECONDS:.0f} s per run, writer at {R['lookup_writer_rate']:.0f} tx/s)",
        "",
        "| clients | gateway queries/s | gateway p50 | gateway p99 | Postgres queries/s | Postgres p50 | "
        "Postgres p99 | gateway / Postgres queries/s | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in (1, CLIENTS):
        g, b = R["lookups"][("gateway", n)], R["lookups"][("postgres", n)]
        target = (f"p50 <= 5 ms: {met(g['p50'] <= 0.005)}" if n == 1 else
                  f">= 1,000/s with p99 <= 200 ms: {met(g['qps'] >= 1000 and g['p99'] <= 0.2)}")
        out.append(f"| {n} | {g['qps']:.0f} | {ms(g['p50'])} | {ms(g['p99'])} | {b['qps']:.0f} | {ms(b['p50'])} | "
                   f"{ms(b['p99'])} | {ratio(g['qps'], b['qps'])} | {target} |")
    out += [
        "",
        f"`{LOOKUP_SQL.format(orders='bench.orders')}` with random keys, psycopg clients (PREPARE={P['PREPARE']}) "
        "in one process on the same machine; the same query on the source Postgres is the baseline.",
        "",
        f"Iceberg commits over the whole live run (freshness, concurrency, lookups): {R['commits_total']:.0f}.",
        "",
        "### Peak RSS of `skipprd serve`",
        "",
        "| run | peak RSS |",
        "|---|---|",
        f"| union phase, 1% tail (incl. the commit at SIGTERM) | {R['rss_tail'] // 1024} MiB |",
        f"| analytics, empty tail | {R['rss_empty'] // 1024} MiB |",
        f"| freshness, concurrency and lookups (commit_interval {COMMIT_INTERVAL}) | {R['rss_live'] // 1024} MiB |",
    ]
    if problems:
        out += ["", "### Problems", ""] + [f"- {p}" for p in problems]
    return "\n".join(out)


def phases() -> dict[str, Any]:
    sync_s, sync_rss = create_and_copy(ENV, ROWS, CUSTOMERS, SYNC_TIMEOUT)
    phase_union_and_analytics()
    phase_live()
    return {"sync_s": sync_s, "sync_rss": sync_rss}


if __name__ == "__main__":
    sys.exit(run_main("serve", WORK, problems, phases, report))
