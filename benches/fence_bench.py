#!/usr/bin/env python3
"""Benchmark of the read-your-writes fence and of the one-LSN cut of `skipprd serve` (a
benchmark, not a test). Started by benches/fence.sh (which starts the private Postgres cluster
and picks the binary); this script does the rest in one run, against one Postgres and one
`serve` at a time, and prints a Markdown results block with the exact command.

The source is serve_bench.py's (benchlib.create_source): `orders` (ROWS rows), `customers`
(CUSTOMERS rows) and `events`, the three tables of one pipeline `app`, snapshotted by
`sync --once`.

1. The one-LSN cut, with a live tail: `serve` with commit_interval 1h; 1% of the orders and
   1% of the customers are updated and waited for in skippr.tables. Then, through the gateway
   (median of RUNS after a warm-up, unprepared statements, the modes interleaved run by run):
   a point lookup, an aggregate over `orders` and a join of `orders` and `customers`, each
   - in autocommit: every statement builds its read view (the cut: the pipeline's WAL listed,
     its state and acknowledgement note read, the metadata of each of its tables looked up);
   - inside one BEGIN ISOLATION LEVEL REPEATABLE READ on another connection: the statements
     after the first reuse the transaction's view, so the cut costs nothing there. There is no
     setting that turns the cut off (src/query/view.rs builds one view per pipeline per
     statement outside a transaction), so this is the comparison: the difference between the
     two is what the cut costs a statement;
   - in autocommit under `SET skippr.min_lsn` already reached (a fence that need not wait).
   Beside them: `SELECT skippr.visible_lsn()` (a round trip that builds no view) and
   `SELECT skippr.wait_lsn('<reached>')` (builds one view of the pipeline, scans nothing).
   SIGTERM commits the tail.
2. The same with an empty tail, on a new `serve` with commit_interval COMMIT_INTERVAL, before
   any write.
3. Fence latency, on that `serve`, once per value of LOAD_COMMIT: WRITERS connections commit
   a paced load of RATE transactions/s into `events` with synchronous_commit = that value
   ("off" is the bench cluster's setting, see common.sh; "on" is Postgres' default); PROBES
   rounds, each running every method once (in an order that rotates), with PROBE_INTERVAL_MS
   between probes. Each probe commits one marker row (synchronous_commit = on in its session,
   so the commit is flushed when it returns) and measures from the commit returning to an
   answer that holds the row:
   - Postgres: the lookup on a second Postgres connection (the baseline);
   - freshness without a fence: the lookup through the gateway every POLL_MS until the row
     shows (serve_bench.py's probe);
   - `SET skippr.min_lsn`: `pg_current_wal_insert_lsn()` read on the source, `SET
     skippr.min_lsn = '<lsn>'` on the gateway, one lookup (the documented recipe);
   - the same with `pg_current_wal_flush_lsn()` (also at or past a synchronous commit's end,
     and never past what the source can stream yet);
   - `skippr.wait_lsn(lsn)`: the insert LSN read the same way, `SELECT skippr.wait_lsn('<lsn>',
     WAIT_TIMEOUT)`, one lookup;
   - `skippr.wait_lsn(NULL)`: `SELECT skippr.wait_lsn(NULL, WAIT_TIMEOUT)` (the gateway asks
     the source for its insert LSN over a new connection), one lookup.
   A fenced lookup that does not find its row, a fence that times out, or a visible LSN behind
   the fenced one is a miss.
4. Postgres answering the statements of 1.

Exit code 1 when something is wrong rather than slow: a wrong answer, a fenced read without its
row, a query error, a freshness probe that never saw its row (each listed under "Problems" in
the report), or a failure (the `serve` log tail is printed). Targets are reported, not failed.

Parameters are environment variables (defaults in PARAMS below). Environment from fence.sh:
SKIPPRD (binary), BENCH_WORK (work folder), BENCH_PG_PORT, PGHOST/PGPORT/PGUSER (the cluster).
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg import sql

from benchlib import (AGG_SQL, JOIN_SQL, LOOKUP_SQL, Load, ProbeTimeout, Serve, ServeEnv, binary_kind,
                      binary_time, check_same, command_line, commit_marker, create_and_copy, fetch, machine, ms, pct,
                      probe_once, run_main, source_version, wait_for, warm_up_probe)

# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------

PARAMS: dict[str, str] = {
    "ROWS": "1000000",            # rows of `orders`
    "CUSTOMERS": "10000",         # rows of `customers`
    "RUNS": "7",                  # timed runs of the aggregate and the join per mode (after one warm-up)
    "SHORT_RUNS": "50",           # timed runs of the point lookup and of the round trips per mode
    "RATE": "200",                # target transactions/s of the write load during the probes
    "WRITERS": "2",               # connections of the write load
    "PROBES": "100",              # probes per method
    "PROBE_INTERVAL_MS": "50",    # pause between probes
    "POLL_MS": "5",               # pause between gateway polls of a freshness probe
    "COMMIT_INTERVAL": "10s",     # commit_interval of the fence phase (serve_bench.py's freshness)
    "WAIT_TIMEOUT": "10s",        # skippr.wait_timeout, and the timeout given to skippr.wait_lsn
    "LOAD_COMMIT": "off,on",      # synchronous_commit of the load's sessions: phase 3 runs once per
                                  # value ("off" is the bench cluster's setting, "on" Postgres' default)
    "PREPARE": "auto",            # gateway clients of the probes: "auto" = psycopg's default (a
                                  # statement run 5 times becomes server-side prepared), "never"
}
P = {k: os.environ.get(k, v) for k, v in PARAMS.items()}
ROWS, CUSTOMERS, RUNS, SHORT_RUNS = int(P["ROWS"]), int(P["CUSTOMERS"]), int(P["RUNS"]), int(P["SHORT_RUNS"])
RATE, WRITERS, PROBES = float(P["RATE"]), int(P["WRITERS"]), int(P["PROBES"])
PROBE_INTERVAL, POLL = float(P["PROBE_INTERVAL_MS"]) / 1000, float(P["POLL_MS"]) / 1000
COMMIT_INTERVAL, WAIT_TIMEOUT = P["COMMIT_INTERVAL"], P["WAIT_TIMEOUT"]
LOAD_COMMITS = [v.strip() for v in P["LOAD_COMMIT"].split(",") if v.strip()]
if not LOAD_COMMITS or any(v not in ("on", "off") for v in LOAD_COMMITS):
    sys.exit(f"LOAD_COMMIT must be a list of on and off, not {P['LOAD_COMMIT']!r}")
if P["PREPARE"] not in ("auto", "never"):
    sys.exit(f"PREPARE must be auto or never, not {P['PREPARE']!r}")
if ROWS < 100 or CUSTOMERS < 100:
    sys.exit("ROWS and CUSTOMERS must be at least 100 (1% of each is updated)")

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
DB = "bench_fence"
WS = "fence"  # the workspace (and the slot skippr_fence_app): tables are fence.orders, fence.customers, fence.events


def log(msg: str) -> None:
    print(f"[fence-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


ENV = ServeEnv(bin=BIN, work=WORK, pg_port=PG_PORT, db=DB, ws=WS, tables=["orders", "customers", "events"],
               prepare=P["PREPARE"], log=log)

#: An order whose row is in the tail (its id is a multiple of 100), in the middle of the table.
POINT_ID = max(100, ROWS // 200 * 100)
#: The timed statements, by name; {orders} and {customers} are qualified on the gateway only.
STATEMENTS: dict[str, str] = {
    "point lookup": f"SELECT id, customer_id, status, amount FROM {{orders}} WHERE id = {POINT_ID}",
    "aggregate": AGG_SQL,
    "join + group by": JOIN_SQL,
}
#: The statements timed SHORT_RUNS times (RUNS for the others).
SHORT = {"point lookup"}
#: The modes of the gateway in phases 1 and 2.
AUTOCOMMIT, IN_TXN, FENCED = "autocommit", "in transaction", "min_lsn reached"

problems: list[str] = []
R: dict[str, Any] = {}  # results


def on_gateway(statement: str) -> str:
    return statement.format(orders=f"{WS}.orders", customers=f"{WS}.customers")


def on_source(statement: str) -> str:
    return statement.format(orders="orders", customers="customers")


def lsn_value(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def same_point(lsn: int) -> int:
    """As src/query/view.rs: a position just after a WAL page header is the page boundary."""
    off = lsn % 8192
    header = 40 if lsn % (16 * 1024 * 1024) == 40 else 24
    return lsn - off if off == header else lsn


# --------------------------------------------------------------------------------------------
# Phases 1 and 2: the cost of the one-LSN cut
# --------------------------------------------------------------------------------------------


def interleaved(modes: dict[str, Callable[[], Any]], runs: int) -> dict[str, tuple[float, list[float], Any]]:
    """One warm-up of each mode, then `runs` rounds that time each mode once, in an order that
    rotates (so that drift on the shared machine does not favour one): per mode, (median
    seconds, all seconds, the last answer)."""
    answers = {name: run() for name, run in modes.items()}
    times: dict[str, list[float]] = {name: [] for name in modes}
    names = list(modes)
    for r in range(runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            answers[name] = modes[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(times[name]), times[name], answers[name]) for name in modes}


def measure_cut(label: str, expected: dict[str, list[tuple]]) -> dict[str, Any]:
    """Phase 1 or 2 on the running `serve`: the floors, then each statement in each mode."""
    out: dict[str, Any] = {"statements": {}}
    with ENV.gateway() as ac, ENV.gateway() as tx, ENV.gateway() as fenced:
        # A reached LSN: the one the statement just before saw.
        ac.execute(f"SELECT count(*) FROM {WS}.customers", prepare=False).fetchall()
        reached = ac.execute("SELECT skippr.visible_lsn()", prepare=False).fetchone()[0]
        wait_sql = sql.SQL("SELECT skippr.wait_lsn({}, {})").format(sql.Literal(reached),
                                                                     sql.Literal(WAIT_TIMEOUT)).as_string(ac)
        floors = interleaved({
            "no view": fetch(ac, "SELECT skippr.visible_lsn()", QUERY_TIMEOUT, prepare=False),
            "one view": fetch(fenced, wait_sql, QUERY_TIMEOUT, prepare=False),
        }, SHORT_RUNS)
        out["floor_no_view"], out["floor_one_view"] = floors["no view"][0], floors["one view"][0]

        tx.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        fenced.execute(sql.SQL("SET skippr.min_lsn = {}").format(sql.Literal(reached)))
        for name, statement in STATEMENTS.items():
            text = on_gateway(statement)
            result = interleaved({
                AUTOCOMMIT: fetch(ac, text, QUERY_TIMEOUT, prepare=False),
                IN_TXN: fetch(tx, text, QUERY_TIMEOUT, prepare=False),
                FENCED: fetch(fenced, text, QUERY_TIMEOUT, prepare=False),
            }, SHORT_RUNS if name in SHORT else RUNS)
            for mode, (_, _, answer) in result.items():
                check_same(problems, f"{label}, {name}, {mode}", expected[name], answer, log)
            out["statements"][name] = {mode: (median, runs) for mode, (median, runs, _) in result.items()}
            log(f"  {label}, {name}: " + ", ".join(f"{m} {ms(v[0])}" for m, v in result.items()))
        # Which cut each read: the transaction's view was built at its first statement; the
        # autocommit statements' cut may have moved on since (the stream notes the source's
        # position on keepalives even when no change of these tables arrives).
        out["tx_lsn"] = tx.execute("SELECT skippr.visible_lsn()", prepare=False).fetchone()[0]
        out["ac_lsn"] = ac.execute("SELECT skippr.visible_lsn()", prepare=False).fetchone()[0]
        tx.execute("COMMIT")
        fenced.execute("RESET skippr.min_lsn")
    return out


def tail_status(gw: psycopg.Connection) -> dict[str, dict]:
    return {t: s for t, s in ENV.tables_status(gw).items() if t in ("orders", "customers")}


def phase_cut_live_tail() -> dict[str, list[tuple]]:
    """Phase 1; returns Postgres's answers to the statements (the data does not change until
    the probes, which write only `events`)."""
    serve = Serve(ENV, "1-tail", "1h")
    serve.wait_ready(SERVE_START_TIMEOUT)
    with ENV.gateway() as gw:
        before = {t: s["committed_lsn"] for t, s in tail_status(gw).items()}
        with ENV.pg() as src:
            t0 = time.monotonic()
            orders = src.execute("UPDATE orders SET amount = amount + 1, status = 'updated' WHERE id % 100 = 0").rowcount
            customers = src.execute("UPDATE customers SET region = 'moved' WHERE id % 100 = 0").rowcount
            expected = {name: src.execute(on_source(s)).fetchall() for name, s in STATEMENTS.items()}
        want = {"orders": orders, "customers": customers}
        log(f"updated {orders} orders and {customers} customers; waiting for them in the tail")

        def in_tail() -> dict | None:
            s = tail_status(gw)
            ok = all(s[t]["wal_tail_rows"] >= n and s[t]["wal_tail_changes"] >= n for t, n in want.items())
            return s if ok else None

        status = wait_for("the updates in skippr.tables' wal_tail_rows", TAIL_TIMEOUT, in_tail, alive=serve.alive)
        R["tail_visible_s"] = time.monotonic() - t0
        R["tail_rows"] = {t: (s["wal_tail_rows"], s["wal_tail_changes"]) for t, s in status.items()}
        log("timing the statements with the tail")
        R["cut_live"] = measure_cut("live tail", expected)
        after = tail_status(gw)
        for t, lsn in before.items():
            if after[t]["committed_lsn"] != lsn or after[t]["wal_tail_rows"] < want[t]:
                problems.append(f"{t} was committed while the tail was measured (commit_interval 1h): "
                                f"committed_lsn {lsn} -> {after[t]['committed_lsn']}")
    serve.alive()
    R["stop_commit_s"] = serve.stop(SERVE_STOP_TIMEOUT)
    return expected


# --------------------------------------------------------------------------------------------
# Phase 3: fence latency
# --------------------------------------------------------------------------------------------


class Probes:
    """The probe methods of phase 3, each on its own connections, with its latencies and
    misses. A method returns (latency seconds, {component: seconds}) or raises Miss."""

    METHODS = ["postgres", "freshness", "min_lsn", "min_lsn_flush", "wait_lsn", "wait_lsn_null"]

    class Miss(Exception):
        pass

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.lookup = LOOKUP_SQL.format(ws=WS)
        self.src = ENV.pg()
        self.src.execute("SET synchronous_commit = on")  # the marker's commit is flushed when it returns
        self.reader = ENV.pg()
        self.gw = {m: self._connect(m) for m in self.METHODS if m != "postgres"}
        self.latency: dict[str, list[float]] = {m: [] for m in self.METHODS}
        self.parts: dict[str, dict[str, list[float]]] = {m: {} for m in self.METHODS}
        self.misses: dict[str, list[str]] = {m: [] for m in self.METHODS}
        self.errors: dict[str, list[str]] = {m: [] for m in self.METHODS}

    @staticmethod
    def _connect(method: str) -> psycopg.Connection:
        conn = ENV.gateway()
        if method.startswith("min_lsn"):
            conn.execute(sql.SQL("SET skippr.wait_timeout = {}").format(sql.Literal(WAIT_TIMEOUT)))
        return conn

    def close(self) -> None:
        for c in [self.src, self.reader, *self.gw.values()]:
            c.close()

    def run(self, method: str) -> None:
        try:
            latency, parts = getattr(self, f"_{method}")()
        except Probes.Miss as e:
            self.misses[method].append(str(e))
            log(f"  MISS {method}: {e}")
            return
        except ProbeTimeout as e:
            self.misses[method].append(str(e))
            log(f"  {method}: {e}")
            return
        except psycopg.Error as e:
            self.serve.alive()
            self.errors[method].append(f"{type(e).__name__}: {str(e).strip()}")
            log(f"  ERROR {method}: {type(e).__name__}: {str(e).strip()}")
            if self.gw.get(method) is not None and self.gw[method].broken:
                self.gw[method] = self._connect(method)
            return
        self.latency[method].append(latency)
        for k, v in parts.items():
            self.parts[method].setdefault(k, []).append(v)

    def _check_visible(self, gw: psycopg.Connection, what: str, fenced: str) -> None:
        """Outside the timing: the fenced lookup's visible LSN must not be behind the fence."""
        visible = gw.execute("SELECT skippr.visible_lsn()", prepare=False).fetchone()[0]
        if visible is None or lsn_value(visible) < same_point(lsn_value(fenced)):
            raise Probes.Miss(f"{what}: the lookup saw LSN {visible}, behind the fence {fenced}")

    def _lookup(self, gw: psycopg.Connection, row_id: int) -> bool:
        try:
            return gw.execute(self.lookup, (row_id,)).fetchone() is not None
        except psycopg.errors.QueryCanceled as e:
            raise Probes.Miss(f"the fence timed out: {str(e).strip()}") from None

    def _postgres(self) -> tuple[float, dict[str, float]]:
        row_id, t0 = commit_marker(self.src)
        if self.reader.execute("SELECT id FROM events WHERE id = %s", (row_id,)).fetchone() is None:
            raise Probes.Miss(f"Postgres did not show marker {row_id} on a second connection after its commit")
        return time.perf_counter() - t0, {}

    def _freshness(self) -> tuple[float, dict[str, float]]:
        return probe_once(ENV, self.src, self.gw["freshness"], self.serve, POLL, PROBE_TIMEOUT), {}

    def _min_lsn(self) -> tuple[float, dict[str, float]]:
        return self._fenced_lookup("min_lsn", "pg_current_wal_insert_lsn")

    def _min_lsn_flush(self) -> tuple[float, dict[str, float]]:
        return self._fenced_lookup("min_lsn_flush", "pg_current_wal_flush_lsn")

    def _fenced_lookup(self, method: str, lsn_function: str) -> tuple[float, dict[str, float]]:
        """Commit, `lsn_function()` on the source, SET skippr.min_lsn to it, one lookup."""
        gw = self.gw[method]
        row_id, t0 = commit_marker(self.src)
        lsn = self.src.execute(f"SELECT {lsn_function}()::text").fetchone()[0]
        t1 = time.perf_counter()
        gw.execute(sql.SQL("SET skippr.min_lsn = {}").format(sql.Literal(lsn)))
        t2 = time.perf_counter()
        found = self._lookup(gw, row_id)
        t3 = time.perf_counter()
        if not found:
            raise Probes.Miss(f"SET skippr.min_lsn = {lsn_function}() read after the commit, then the lookup: "
                              f"marker {row_id} missing")
        self._check_visible(gw, f"SET skippr.min_lsn = {lsn_function}()", lsn)
        parts = {"LSN read on the source": t1 - t0, "SET": t2 - t1, "fenced lookup": t3 - t2}
        if method == "min_lsn":
            # The same lookup again, the row visible: what the statement costs without waiting.
            t4 = time.perf_counter()
            self._lookup(gw, row_id)
            parts["the lookup again (no wait)"] = time.perf_counter() - t4
        return t3 - t0, parts

    def _wait(self, gw: psycopg.Connection, lsn: str | None) -> str:
        call = sql.SQL("SELECT skippr.wait_lsn({}, {})").format(sql.Literal(lsn) if lsn else sql.SQL("NULL"),
                                                                  sql.Literal(WAIT_TIMEOUT))
        try:
            return gw.execute(call).fetchone()[0]
        except psycopg.errors.QueryCanceled as e:
            raise Probes.Miss(f"skippr.wait_lsn timed out: {str(e).strip()}") from None

    def _wait_lsn(self) -> tuple[float, dict[str, float]]:
        gw = self.gw["wait_lsn"]
        row_id, t0 = commit_marker(self.src)
        lsn = self.src.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
        t1 = time.perf_counter()
        reached = self._wait(gw, lsn)
        t2 = time.perf_counter()
        found = self._lookup(gw, row_id)
        t3 = time.perf_counter()
        if not found:
            raise Probes.Miss(f"skippr.wait_lsn(LSN read after the commit) returned {reached}, then the lookup: "
                              f"marker {row_id} missing")
        if lsn_value(reached) < same_point(lsn_value(lsn)):
            raise Probes.Miss(f"skippr.wait_lsn({lsn}) returned {reached}, behind it")
        self._check_visible(gw, "skippr.wait_lsn(lsn)", lsn)
        return t3 - t0, {"LSN read on the source": t1 - t0, "wait_lsn": t2 - t1, "lookup": t3 - t2}

    def _wait_lsn_null(self) -> tuple[float, dict[str, float]]:
        gw = self.gw["wait_lsn_null"]
        row_id, t0 = commit_marker(self.src)
        reached = self._wait(gw, None)
        t1 = time.perf_counter()
        found = self._lookup(gw, row_id)
        t2 = time.perf_counter()
        if not found:
            raise Probes.Miss(f"skippr.wait_lsn(NULL) returned {reached}, then the lookup: marker {row_id} missing")
        self._check_visible(gw, "skippr.wait_lsn(NULL)", reached)
        return t2 - t0, {"wait_lsn(NULL)": t1 - t0, "lookup": t2 - t1}


def source_connect_time(n: int = 20) -> float:
    """Median seconds of what skippr.wait_lsn(NULL) does per call, from this client (libpq, not
    skipprd's tokio-postgres): a new connection to the source, its insert LSN, close."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with psycopg.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname=DB, sslmode="prefer") as c:
            c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        times.append(time.perf_counter() - t0)
        time.sleep(PROBE_INTERVAL)
    return statistics.median(times)


def phase_fence(serve: Serve, load_commit: str) -> dict[str, Any]:
    """Phase 3 under a load whose sessions commit with synchronous_commit = `load_commit`."""
    log(f"fence: load of {RATE:.0f} tx/s on {WRITERS} connections (synchronous_commit = {load_commit}), "
        f"{PROBES} probes per method")
    out: dict[str, Any] = {}
    load = Load(ENV, RATE, WRITERS, "events", synchronous_commit=load_commit).start()
    probes = Probes(serve)
    try:
        time.sleep(3)  # the load settles
        commits0 = ENV.metric("skippr_commits_total", table="events")
        tx0, t0 = load.total(), time.monotonic()
        methods = Probes.METHODS
        for i in range(PROBES):
            if load.errors:
                break
            for method in methods[i % len(methods):] + methods[:i % len(methods)]:
                if len(probes.errors[method]) < 3:
                    probes.run(method)
                time.sleep(PROBE_INTERVAL)
            if (i + 1) % 25 == 0:
                log(f"  {i + 1} rounds: " + ", ".join(
                    f"{m} p50 {ms(pct(v, 50))}" for m, v in probes.latency.items() if v))
        window = time.monotonic() - t0
        out.update(tx=load.total() - tx0, window_s=window, source_connect=source_connect_time(),
                   commits=ENV.metric("skippr_commits_total", table="events") - commits0)
    finally:
        probes.close()
        load.stop()
    out["probes"] = probes
    for method in Probes.METHODS:
        what = f"load synchronous_commit = {load_commit}, {METHOD_LABELS[method]}"
        if probes.misses[method]:
            problems.append(f"{what}: {len(probes.misses[method])} of "
                            f"{len(probes.misses[method]) + len(probes.latency[method])} probes missed; first: "
                            f"{probes.misses[method][0]}")
        if probes.errors[method]:
            problems.append(f"{what}: {len(probes.errors[method])} errors; first: {probes.errors[method][0]}")
    return out


def phase_live(expected: dict[str, list[tuple]]) -> None:
    """Phase 2 (empty tail, no writes yet), then phase 3 on the same `serve`."""
    serve = Serve(ENV, "2-live", COMMIT_INTERVAL)
    serve.wait_ready(SERVE_START_TIMEOUT)
    with ENV.gateway() as gw:
        wait_for("an empty tail of orders and customers after the restart", 60,
                 lambda: all(s["wal_tail_changes"] == 0 for s in tail_status(gw).values()), alive=serve.alive)
    log("timing the statements with an empty tail")
    R["cut_empty"] = measure_cut("empty tail", expected)
    with ENV.pg() as src:
        src.execute("SET synchronous_commit = on")
        warm_up_probe(ENV, src, serve, POLL, SERVE_START_TIMEOUT)
    R["fence"] = {setting: phase_fence(serve, setting) for setting in LOAD_COMMITS}
    serve.alive()
    serve.stop(SERVE_STOP_TIMEOUT)
    R["rss_live"] = serve.peak_rss_kib


def phase_postgres() -> None:
    with ENV.pg() as src:
        R["pg"] = {name: interleaved({"pg": fetch(src, on_source(s), QUERY_TIMEOUT)},
                                     SHORT_RUNS if name in SHORT else RUNS)["pg"][0]
                   for name, s in STATEMENTS.items()}
        R["pg_workers"] = src.execute("SHOW max_parallel_workers_per_gather").fetchone()[0]
        R["pg_version"] = src.execute("SHOW server_version").fetchone()[0]


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

METHOD_LABELS = {
    "postgres": "Postgres: the lookup on a second connection",
    "freshness": f"gateway, no fence: the lookup every {P['POLL_MS']} ms until the row shows",
    "min_lsn": "gateway: `SET skippr.min_lsn = '<lsn>'`, one lookup",
    "min_lsn_flush": "gateway: the same with `pg_current_wal_flush_lsn()` (not the documented recipe)",
    "wait_lsn": f"gateway: `SELECT skippr.wait_lsn('<lsn>', '{WAIT_TIMEOUT}')`, one lookup",
    "wait_lsn_null": f"gateway: `SELECT skippr.wait_lsn(NULL, '{WAIT_TIMEOUT}')`, one lookup",
}


def report(setup: dict[str, Any]) -> str:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "n/a"

    load1, load5, _ = os.getloadavg()
    out = [
        "## Read-your-writes fence and the one-LSN cut",
        "",
        "```sh",
        command_line(P, "benches/fence.sh"),
        "```",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()} (load average at the end "
        f"{load1:.1f} / {load5:.1f} over 1 / 5 min, {R['load_start']:.1f} / {R['load_start5']:.1f} at the start); "
        f"Postgres {R['pg_version']}; skipprd {binary_kind(BIN)} build `{BIN}` of {binary_time(BIN)} (source tree at "
        f"{source_version(REPO)}). Snapshot of {ROWS:,} orders + {CUSTOMERS:,} customers by `sync --once`: "
        f"{setup['sync_s']:.1f} s. One pipeline, three tables (`orders`, `customers`, `events`).",
        "",
    ]
    for setting, f in R["fence"].items():
        probes: Probes = f["probes"]
        fresh = probes.latency["freshness"]
        out += [
            f"### Fence latency against freshness: load committing with synchronous_commit = {setting} "
            f"({f['tx'] / f['window_s']:.0f} tx/s of {RATE:.0f} on {WRITERS} connections; commit_interval "
            f"{COMMIT_INTERVAL})",
            "",
            "| method | probes (missed) | p50 | p99 | max | p50 / freshness | p99 / freshness |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in Probes.METHODS:
            v = probes.latency[m]
            missed = len(probes.misses[m]) + len(probes.errors[m])
            if v:
                rel = ("-", "-") if m == "freshness" or not fresh else (ratio(pct(v, 50), pct(fresh, 50)),
                                                                         ratio(pct(v, 99), pct(fresh, 99)))
                out.append(f"| {METHOD_LABELS[m]} | {len(v)} ({missed}) | {ms(pct(v, 50))} | {ms(pct(v, 99))} | "
                           f"{ms(max(v))} | {rel[0]} | {rel[1]} |")
            else:
                out.append(f"| {METHOD_LABELS[m]} | 0 ({missed}) | - | - | - | - | - |")
        parts = [f"{m} {part} {ms(statistics.median(v))}" for m in ("min_lsn", "min_lsn_flush", "wait_lsn",
                                                                      "wait_lsn_null")
                 for part, v in probes.parts[m].items()]
        out += [
            "",
            "Medians of the parts of a fenced probe: " + "; ".join(parts) + ". For scale: a new connection to the "
            f"source, `SELECT pg_current_wal_insert_lsn()`, close (what `skippr.wait_lsn(NULL)` does on each call; "
            f"here with libpq, under the same load): median {ms(f['source_connect'])}. "
            f"{sum(len(v) for k, v in probes.misses.items() if k != 'freshness')} fenced probes missed; "
            f"{f['commits']:.0f} Iceberg commits of `events` in the {f['window_s']:.0f} s window.",
            "",
        ]
    out += [
        f"Each round runs every method once (the order rotates), {PROBE_INTERVAL * 1000:.0f} ms apart; each probe "
        f"commits its own marker row into `events` from a session with synchronous_commit = on, and the latency "
        f"runs from that commit returning to an answer that holds the row. The lookup is "
        f"`{LOOKUP_SQL.format(ws=WS) % '$1'}` (psycopg, PREPARE={P['PREPARE']}). A fenced method must find the "
        f"row at its first lookup, and that lookup's `skippr.visible_lsn()` must not be behind the fence.",
        "",
    ]
    for phase, key in (("with a live tail", "cut_live"), ("with an empty tail", "cut_empty")):
        c = R[key]
        if phase == "with a live tail":
            tails = ", ".join(f"{t} {rows:,} rows" for t, (rows, _) in R["tail_rows"].items())
            title = f"### The one-LSN cut {phase} ({tails}; commit_interval 1h)"
        else:
            title = f"### The one-LSN cut {phase} (after SIGTERM committed it; no writes)"
        out += [
            title,
            "",
            f"Round trip without a view (`SELECT skippr.visible_lsn()`): {ms(c['floor_no_view'])}; one view of the "
            f"pipeline, no scan (`SELECT skippr.wait_lsn('<reached>')`): {ms(c['floor_one_view'])}; difference "
            f"{ms(c['floor_one_view'] - c['floor_no_view'])}. Visible LSN of the transaction's view {c['tx_lsn']}, "
            f"of the last autocommit statement {c['ac_lsn']}.",
            "",
            "| statement (median) | autocommit: a view per statement | in one REPEATABLE READ "
            "transaction: the view reused | the cut (difference) | autocommit, `skippr.min_lsn` reached | "
            "Postgres |",
            "|---|---|---|---|---|---|",
        ]
        for name, modes in c["statements"].items():
            a, t, f = modes[AUTOCOMMIT][0], modes[IN_TXN][0], modes[FENCED][0]
            out.append(f"| {name} | {ms(a)} | {ms(t)} | {ms(a - t)} ({ratio(a, t)}) | {ms(f)} | {ms(R['pg'][name])} |")
        out.append("")
    out += [
        f"Statements: point lookup `{on_gateway(STATEMENTS['point lookup'])}` (a row in the tail), aggregate "
        f"`{on_gateway(AGG_SQL)}`, join `{on_gateway(JOIN_SQL)}`; medians of {SHORT_RUNS} runs (the round trips "
        f"and the point lookup) or {RUNS} (the aggregate and the join). Unprepared; the three gateway modes on three "
        f"connections, interleaved run by run after one warm-up each; each answer checked against Postgres "
        f"(max_parallel_workers_per_gather = {R['pg_workers']}). No setting turns the cut off: outside a "
        f"transaction every statement builds one read view per pipeline it reads (lists the WAL, reads the "
        f"pipeline's state and acknowledgement note, looks up the metadata of every table of the pipeline); "
        f"inside a transaction the statements after the first reuse the first one's view. The updates reached "
        f"`skippr.tables` {R['tail_visible_s']:.1f} s after they committed; the SIGTERM that committed the tail "
        f"took {R['stop_commit_s']:.1f} s. Peak RSS of the second `serve`: {R['rss_live'] // 1024} MiB.",
    ]
    if problems:
        out += ["", "### Problems", ""] + [f"- {p}" for p in problems]
    return "\n".join(out)


def phases() -> dict[str, Any]:
    R["load_start"], R["load_start5"], _ = os.getloadavg()
    sync_s, _ = create_and_copy(ENV, ROWS, CUSTOMERS, SYNC_TIMEOUT)
    expected = phase_cut_live_tail()
    phase_live(expected)
    phase_postgres()
    return {"sync_s": sync_s}


if __name__ == "__main__":
    sys.exit(run_main("fence", WORK, problems, phases, report))
