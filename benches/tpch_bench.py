#!/usr/bin/env python3
"""TPC-H through `skipprd serve` (a benchmark, not a test). Started by benches/tpch.sh (which
starts the private Postgres cluster and picks the binary); this script does the rest in one
run and prints a Markdown results block with the exact command.

1. The data: DuckDB's tpch extension generates scale factor SF (dbgen); the eight tables are
   loaded into the database `bench_tpch` with TPC-H's primary keys (tests/tpch.py, shared with
   the test suite's tests/test_tpch.py).
2. The snapshot: `COPY <table> TO STDOUT` of every table (one psql, output discarded) against
   `sync --once` of the pipeline `app` over the eight tables (time and peak RSS).
3. The queries: each of the 22 through the gateway of one `serve` (commit_interval 1h, unprepared
   statements), in DuckDB over the same Iceberg files (a view per table over iceberg_scan of its
   current metadata JSON, DuckDB's default threads), each the median of RUNS after one warm-up;
   and once in Postgres (no warm-up: the tables were just read by COPY and the snapshot), with
   statement_timeout PG_TIMEOUT (Postgres plans Q17 and Q20 as nested loops over lineitem, which
   at SF 1 take far longer than the rest together).
4. Concurrent clients (CLIENTS, default 1, 4 and 8): that many clients each run the 22 queries
   once, from its own starting point, through a fresh `serve` (throughput, p50/p99 latency,
   `serve`'s peak RSS), then DuckDB with one cursor per client over the same files; every
   answer must equal the single client's.
5. Every gateway answer is compared with Postgres's (tests/tpch.py's rule: sums and counts
   exact, an average to 1e-6), or with DuckDB's where Postgres ran out of time.

Exit code 1 on a wrong answer, a failed query or a failure (the `serve` log tail is printed).

Parameters are environment variables (defaults in PARAMS below). Environment from tpch.sh:
SKIPPRD (binary), BENCH_WORK (work folder), BENCH_PG_PORT, PGHOST/PGPORT/PGUSER (the cluster).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchlib import (BenchError, Serve, ServeEnv, binary_kind, binary_time, command_line, fetch, machine,
                      recreate_database, run_main, source_version, timed_runs)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import tpch  # noqa: E402 (tests/tpch.py, found through the path above)

PARAMS: dict[str, str] = {
    "SF": "1",                 # TPC-H scale factor
    "RUNS": "3",               # timed runs per query through the gateway and in DuckDB (after one warm-up)
    "PG_TIMEOUT": "300",       # statement_timeout of each query in Postgres, seconds
    "QUERY_TIMEOUT": "1800",   # bound of each query through the gateway and in DuckDB, seconds
    "CLIENTS": "1,4,8",        # concurrent clients, each running the 22 queries once ("" skips the phase)
}
P = {k: os.environ.get(k, v) for k, v in PARAMS.items()}
SF, RUNS = float(P["SF"]), int(P["RUNS"])
CLIENTS = [int(c) for c in P["CLIENTS"].split(",") if c.strip()]
PG_TIMEOUT, QUERY_TIMEOUT = float(P["PG_TIMEOUT"]), float(P["QUERY_TIMEOUT"])
SERVE_TIMEOUT = float(os.environ.get("SERVE_TIMEOUT", "600"))
SYNC_TIMEOUT = float(os.environ.get("SYNC_TIMEOUT", "7200"))

WORK = Path(os.environ["BENCH_WORK"])


def log(msg: str) -> None:
    print(f"[tpch-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


ENV = ServeEnv(bin=os.environ["SKIPPRD"], work=WORK, pg_port=int(os.environ["BENCH_PG_PORT"]), db="bench_tpch",
               ws="tpch", tables=tpch.TABLES, prepare="never", log=log)
R: dict[str, Any] = {}
problems: list[str] = []
#: Each query's answer through the gateway with one client, which every concurrent run must repeat.
ANSWERS: dict[int, list[tuple]] = {}


def load() -> list[tuple[int, str]]:
    log(f"generating TPC-H at scale factor {SF:g} (dbgen)")
    duck = tpch.generate(SF)
    texts = tpch.queries(duck)
    recreate_database(ENV)
    t0 = time.perf_counter()
    with ENV.pg() as conn:
        R["rows"] = tpch.load_postgres(duck, conn, WORK)
    R["load_s"] = time.perf_counter() - t0
    duck.close()
    log(f"loaded {sum(R['rows'].values()):,} rows into Postgres in {R['load_s']:.0f}s")
    return texts


def snapshot() -> None:
    copies = [a for t in tpch.TABLES for a in ("-c", f"COPY {t} TO STDOUT")]
    t0 = time.perf_counter()
    subprocess.run(["psql", "-q", "-X", "-d", ENV.db, *copies], stdout=subprocess.DEVNULL, check=True)
    R["copy_s"] = time.perf_counter() - t0
    ENV.write_config("1h")
    R["sync_s"], R["sync_rss_kib"] = ENV.sync_once(SYNC_TIMEOUT)
    R["warehouse_mib"] = sum(f.stat().st_size for f in (WORK / "warehouse").rglob("*") if f.is_file()) / 2**20
    log(f"COPY of every table {R['copy_s']:.1f}s, sync --once {R['sync_s']:.1f}s "
        f"(peak RSS {R['sync_rss_kib'] // 1024} MiB)")


def run_queries(texts: list[tuple[int, str]]) -> list[dict]:
    rows: list[dict] = []
    serve = Serve(ENV, "tpch", "1h")
    serve.wait_ready(SERVE_TIMEOUT)
    duck = ENV.duckdb()
    R["duckdb_version"] = duck.execute("SELECT version()").fetchone()[0]
    R["duckdb_threads"] = duck.execute("SELECT current_setting('threads')").fetchone()[0]
    for t in tpch.TABLES:
        duck.execute(f"CREATE VIEW {t} AS SELECT * FROM iceberg_scan('{ENV.metadata_location(t)}')")
    with ENV.gateway() as gw, ENV.pg() as pg:
        pg.execute(f"SET statement_timeout = '{PG_TIMEOUT:.0f}s'")
        for n, sql in texts:
            row: dict[str, Any] = {"q": n}
            try:
                row["gw_s"], _, gw_answer = timed_runs(fetch(gw, sql, QUERY_TIMEOUT, prepare=False), RUNS)
            except (BenchError, psycopg.Error) as e:
                problems.append(f"Q{n} through the gateway: {e}")
                serve.alive()
                rows.append(row)
                continue

            def in_duckdb(sql: str = sql) -> list[tuple]:
                return duck.execute(sql).fetchall()

            row["duck_s"], _, duck_answer = timed_runs(in_duckdb, RUNS)
            ANSWERS[n] = gw_answer
            t0 = time.perf_counter()
            try:
                pg_answer = pg.execute(sql).fetchall()
                row["pg_s"] = time.perf_counter() - t0
            except psycopg.errors.QueryCanceled:
                pg_answer = None
            if pg_answer is not None:
                row["equal"] = "Postgres"
                if not tpch.same_answer(sql, pg_answer, gw_answer):
                    problems.append(f"Q{n}: the gateway's answer differs from Postgres's: "
                                    f"expected {pg_answer[:3]}, got {gw_answer[:3]}")
                    row["equal"] = "**no**"
            else:
                row["equal"] = "DuckDB (Postgres timed out)"
                if not tpch.same_answer(sql, duck_answer, gw_answer):
                    problems.append(f"Q{n}: the gateway's answer differs from DuckDB's: "
                                    f"expected {duck_answer[:3]}, got {gw_answer[:3]}")
                    row["equal"] = "**no**"
            log(f"Q{n}: gateway {row['gw_s']:.3f}s, DuckDB {row['duck_s']:.3f}s, "
                f"Postgres {row.get('pg_s', float('nan')):.2f}s, equal to {row['equal']}")
            rows.append(row)
    serve.stop(SERVE_TIMEOUT)
    R["serve_rss_kib"] = serve.peak_rss_kib
    return rows


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def concurrent(clients: int, texts: list[tuple[int, str]], run_one, check: bool) -> dict:
    """`clients` threads, each running the 22 queries once from its own starting point
    (`run_one(client, n, sql)` answers one): throughput, latencies, and the errors (with
    `check`, an answer other than the single client's through the gateway is one)."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        start = i * len(texts) // clients
        for n, sql in texts[start:] + texts[:start]:
            t0 = time.perf_counter()
            try:
                answer = run_one(i, n, sql)
            except Exception as e:  # reported below
                with lock:
                    errors.append(f"client {i}, Q{n}: {e}")
                continue
            took = time.perf_counter() - t0
            with lock:
                latencies.append(took)
                if check and n in ANSWERS and not tpch.same_answer(sql, ANSWERS[n], answer):
                    errors.append(f"client {i}, Q{n}: not the single client's answer")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"qps": len(latencies) / wall, "wall_s": wall, "p50": pct(latencies, 50) if latencies else float("nan"),
            "p99": pct(latencies, 99) if latencies else float("nan"), "errors": errors}


def run_clients(texts: list[tuple[int, str]]) -> None:
    """The 22 queries from 1, 4 and 8 clients at once: a fresh `serve` per client count (its
    peak RSS is that run's), then DuckDB with as many threads, each with its own cursor."""
    R["clients"] = []
    duck = ENV.duckdb()
    for t in tpch.TABLES:
        duck.execute(f"CREATE VIEW {t} AS SELECT * FROM iceberg_scan('{ENV.metadata_location(t)}')")
    for c in CLIENTS:
        serve = Serve(ENV, f"clients-{c}", "1h")
        serve.wait_ready(SERVE_TIMEOUT)
        conns = [ENV.gateway() for _ in range(c)]
        try:
            gw = concurrent(c, texts, lambda i, n, sql: fetch(conns[i], sql, QUERY_TIMEOUT, prepare=False)(), True)
        finally:
            for conn in conns:
                conn.close()
        serve.stop(SERVE_TIMEOUT)
        cursors = [duck.cursor() for _ in range(c)]
        dk = concurrent(c, texts, lambda i, n, sql: cursors[i].execute(sql).fetchall(), False)
        for cur in cursors:
            cur.close()
        for e in gw["errors"]:
            problems.append(f"{c} clients through the gateway: {e}")
        for e in dk["errors"]:
            problems.append(f"{c} clients in DuckDB: {e}")
        R["clients"].append({"clients": c, "gw": gw, "duck": dk, "rss_kib": serve.peak_rss_kib})
        log(f"{c} clients: gateway {gw['qps']:.2f} queries/s (p99 {gw['p99']:.2f}s, peak RSS "
            f"{serve.peak_rss_kib // 1024} MiB), DuckDB {dk['qps']:.2f} queries/s (p99 {dk['p99']:.2f}s)")


def report(rows: list[dict]) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    done = [r for r in rows if "gw_s" in r]
    gw_total = sum(r["gw_s"] for r in done)
    duck_total = sum(r["duck_s"] for r in done)
    pg_done = [r for r in done if "pg_s" in r]
    out = [
        f"#### TPC-H at scale factor {SF:g}",
        "",
        f"Command: `{command_line(P, 'benches/tpch.sh')}`. {binary_kind(ENV.bin)} build of "
        f"{source_version(REPO)} (built {binary_time(ENV.bin)}), {machine()}; DuckDB {R['duckdb_version']} "
        f"({R['duckdb_threads']} threads).",
        "",
        f"Load: {sum(R['rows'].values()):,} rows ({R['rows']['lineitem']:,} in lineitem). Snapshot: `COPY` of "
        f"every table {R['copy_s']:.1f} s, `sync --once` {R['sync_s']:.1f} s "
        f"(**{R['sync_s'] / R['copy_s']:.2f}x**), peak RSS {R['sync_rss_kib'] // 1024} MiB; warehouse "
        f"{R['warehouse_mib']:.0f} MiB.",
        "",
        "| query | gateway (s) | DuckDB iceberg_scan (s) | Postgres (s) | gateway / DuckDB | answer equal to |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "gw_s" not in r:
            out.append(f"| Q{r['q']} | failed | | | | |")
            continue
        pg_s = s(r.get("pg_s")) if "pg_s" in r else f"> {PG_TIMEOUT:.0f}"
        out.append(f"| Q{r['q']} | {s(r['gw_s'])} | {s(r['duck_s'])} | {pg_s} | {r['gw_s'] / r['duck_s']:.2f}x "
                   f"| {r['equal']} |")
    pg_total = sum(r["pg_s"] for r in pg_done)
    out += [
        f"| **total** | **{gw_total:.2f}** | **{duck_total:.2f}** | {pg_total:.1f}"
        f"{'' if len(pg_done) == len(done) else f' + {len(done) - len(pg_done)} timed out'} "
        f"| **{gw_total / duck_total:.2f}x** | {sum(1 for r in done if r['equal'] != '**no**')}/22 |",
        "",
        f"Gateway and DuckDB: median of {RUNS} runs after a warm-up; Postgres: one run, statement_timeout "
        f"{PG_TIMEOUT:.0f} s. Peak RSS of `serve`: {R['serve_rss_kib'] // 1024} MiB.",
    ]
    if R.get("clients"):
        out += [
            "",
            "Concurrent clients, each running the 22 queries once from its own starting point (a fresh `serve` per "
            "row; DuckDB with one cursor per client over the same files):",
            "",
            "| clients | gateway queries/s | gateway p50 / p99 (s) | `serve` peak RSS | DuckDB queries/s "
            "| DuckDB p50 / p99 (s) | gateway / DuckDB throughput |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in R["clients"]:
            gw, dk = r["gw"], r["duck"]
            out.append(f"| {r['clients']} | {gw['qps']:.2f} | {gw['p50']:.2f} / {gw['p99']:.2f} | "
                       f"{r['rss_kib'] // 1024} MiB | {dk['qps']:.2f} | {dk['p50']:.2f} / {dk['p99']:.2f} | "
                       f"**{gw['qps'] / dk['qps']:.2f}x** |")
    if problems:
        out += ["", "### Problems", ""] + [f"- {p}" for p in problems]
    return "\n".join(out)


def phases() -> list[dict]:
    texts = load()
    snapshot()
    rows = run_queries(texts)
    if CLIENTS:
        run_clients(texts)
    return rows


if __name__ == "__main__":
    sys.exit(run_main("tpch", WORK, problems, phases, report))
