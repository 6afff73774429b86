#!/usr/bin/env python3
"""Fairness of the gateway under load (a benchmark, not a test). Started by benches/fairness.sh,
which starts the private Postgres cluster and picks the binary.

1. TPC-H at scale factor SF (DuckDB's dbgen, tests/tpch.py) loaded into Postgres and copied by
   `sync --once`; then one `skipprd serve` with its default limits.
2. The short statement `SELECT count(*) FROM nation` SHORT_RUNS times alone, then as many times
   while another session runs HEAVY (a hash join of `orders` with itself on `o_orderdate`: about
   a billion matches at SF 1, minutes of CPU) in a loop: p50 and p99 of each, and their ratio
   (aim: short statements stay short).
3. Beside the same load, TRIES heavy statements under `statement_timeout` 5 s: how long after the
   5 s each ends with 57014 (aim: at most 1 s late).
4. Beside the same load, TRIES heavy statements cancelled (a protocol CancelRequest) 2 s after they
   start: how long the cancel takes to end each with 57014 (aim: at most 1 s).
Baseline of the same run: the short statement in Postgres.

Parameters are environment variables (defaults in PARAMS). Environment from fairness.sh:
SKIPPRD, BENCH_WORK, BENCH_PG_PORT, PGHOST/PGPORT/PGUSER.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchlib import (BenchError, Serve, ServeEnv, binary_kind, binary_time, command_line, machine, pct,
                      recreate_database, run_main, source_version)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import tpch  # noqa: E402 (tests/tpch.py, found through the path above)

PARAMS: dict[str, str] = {
    "SF": "1",            # TPC-H scale factor
    "SHORT_RUNS": "30",   # runs of the short statement, alone and beside the load
    "TRIES": "3",         # timed-out and cancelled heavy statements
    "JOIN_ON": "o_orderdate",  # the column the heavy self-join of orders matches on
}
P = {k: os.environ.get(k, v) for k, v in PARAMS.items()}
SF, SHORT_RUNS, TRIES = float(P["SF"]), int(P["SHORT_RUNS"]), int(P["TRIES"])
TIMEOUT_S = 5.0
CANCEL_AFTER_S = 2.0
WORK = Path(os.environ["BENCH_WORK"])

SHORT = "SELECT count(*) FROM nation"
HEAVY = f"SELECT count(*) FROM orders o1 JOIN orders o2 ON o1.{P['JOIN_ON']} = o2.{P['JOIN_ON']}"


def log(msg: str) -> None:
    print(f"[fairness-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


ENV = ServeEnv(bin=os.environ["SKIPPRD"], work=WORK, pg_port=int(os.environ["BENCH_PG_PORT"]), db="bench_fair",
               ws="fair", tables=tpch.TABLES, prepare="never", log=log)
R: dict[str, Any] = {}
problems: list[str] = []


def load() -> None:
    log(f"generating TPC-H at scale factor {SF:g} (dbgen)")
    duck = tpch.generate(SF)
    recreate_database(ENV)
    with ENV.pg() as conn:
        R["rows"] = tpch.load_postgres(duck, conn, WORK)
    duck.close()
    ENV.write_config("1h")
    R["sync_s"], _ = ENV.sync_once(7200)
    log(f"loaded and copied {sum(R['rows'].values()):,} rows (sync --once {R['sync_s']:.0f}s)")


def short_latencies(conn: psycopg.Connection) -> list[float]:
    out = []
    for _ in range(SHORT_RUNS):
        t0 = time.perf_counter()
        conn.execute(SHORT).fetchall()
        out.append(time.perf_counter() - t0)
        time.sleep(0.05)
    return out


class HeavyLoop:
    """One gateway session running HEAVY over and over until stopped."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.runs: list[float] = []
        self.error: BaseException | None = None
        self.conn = ENV.gateway()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                self.conn.execute(HEAVY).fetchall()
                self.runs.append(time.perf_counter() - t0)
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self) -> None:
        self.stop.set()
        self.conn.cancel()
        self.thread.join(timeout=120)
        self.conn.close()


def ends_with_57014(conn: psycopg.Connection, sql: str) -> float:
    """Runs `sql`; it must end with 57014. Returns the seconds it took."""
    t0 = time.perf_counter()
    try:
        conn.execute(sql).fetchall()
    except psycopg.errors.QueryCanceled:
        return time.perf_counter() - t0
    raise BenchError(f"`{sql}` finished instead of ending with 57014")


def measure() -> None:
    with ENV.pg() as pg:
        pg.execute(SHORT).fetchall()
        R["pg_short"] = short_latencies(pg)
    serve = Serve(ENV, "fair", "1h")
    serve.wait_ready(600)
    with ENV.gateway() as gw:
        gw.execute(SHORT).fetchall()
        R["alone"] = short_latencies(gw)
        log(f"alone: short p50 {pct(R['alone'], 50) * 1000:.1f} ms")

        heavy = HeavyLoop()
        try:
            time.sleep(1.0)
            R["beside"] = short_latencies(gw)
            log(f"beside the heavy loop: short p50 {pct(R['beside'], 50) * 1000:.1f} ms, "
                f"p99 {pct(R['beside'], 99) * 1000:.1f} ms")
            R["timeout_late"] = []
            with ENV.gateway() as t:
                t.execute(f"SET statement_timeout = '{int(TIMEOUT_S * 1000)}ms'")
                for _ in range(TRIES):
                    R["timeout_late"].append(ends_with_57014(t, HEAVY) - TIMEOUT_S)
            log(f"statement_timeout 5 s late by {max(R['timeout_late']):.2f} s at most")
            R["cancel"] = []
            with ENV.gateway() as c:
                for _ in range(TRIES):
                    sent: list[float] = []
                    timer = threading.Timer(CANCEL_AFTER_S, lambda: (sent.append(time.perf_counter()), c.cancel()))
                    t0 = time.perf_counter()
                    timer.start()
                    took = ends_with_57014(c, HEAVY)
                    timer.join()
                    R["cancel"].append(t0 + took - sent[0])
            log(f"cancel took {max(R['cancel']):.2f} s at most")
        finally:
            heavy.finish()
        if heavy.error is not None and not isinstance(heavy.error, psycopg.errors.QueryCanceled):
            problems.append(f"the heavy loop failed: {heavy.error}")
        R["heavy_runs"] = heavy.runs
    serve.stop(120)
    R["serve_rss_kib"] = serve.peak_rss_kib


def report(_: Any) -> str:
    def ms(v: float) -> str:
        return f"{v * 1000:.1f}"

    a50, a99 = pct(R["alone"], 50), pct(R["alone"], 99)
    b50, b99 = pct(R["beside"], 50), pct(R["beside"], 99)
    late = max(R["timeout_late"])
    cancel = max(R["cancel"])
    return "\n".join([
        f"#### Fairness beside a heavy join, TPC-H scale factor {SF:g}",
        "",
        f"Command: `{command_line(P, 'benches/fairness.sh')}`. {binary_kind(ENV.bin)} build of "
        f"{source_version(REPO)} (built {binary_time(ENV.bin)}), {machine()}.",
        "",
        f"Heavy statement, run in a loop by one session throughout: `{HEAVY}` "
        f"({len(R['heavy_runs'])} runs of it completed meanwhile).",
        "",
        "| | p50 (ms) | p99 (ms) | aim |",
        "|---|---:|---:|---|",
        f"| `{SHORT}` in Postgres | {ms(pct(R['pg_short'], 50))} | {ms(pct(R['pg_short'], 99))} | |",
        f"| the same through the gateway, alone | {ms(a50)} | {ms(a99)} | |",
        f"| the same beside the heavy join | {ms(b50)} | {ms(b99)} | short stays short: p99 "
        f"**{b99 / a99:.1f}x** alone |",
        "",
        "| beside the heavy join | worst of " + str(TRIES) + " (s) | all (s) | aim |",
        "|---|---:|---|---|",
        f"| `statement_timeout` 5 s: ended this long after 5 s | {late:.2f} | "
        f"{', '.join(f'{v:.2f}' for v in R['timeout_late'])} | at most 1 s: {'met' if late <= 1 else 'missed'} |",
        f"| cancel request: ended this long after it was sent | {cancel:.2f} | "
        f"{', '.join(f'{v:.2f}' for v in R['cancel'])} | at most 1 s: {'met' if cancel <= 1 else 'missed'} |",
        "",
        f"Peak RSS of `serve`: {R['serve_rss_kib'] // 1024} MiB.",
    ] + (["", "### Problems", ""] + [f"- {p}" for p in problems] if problems else []))


def phases() -> None:
    load()
    measure()


if __name__ == "__main__":
    sys.exit(run_main("fairness", WORK, problems, phases, report))
