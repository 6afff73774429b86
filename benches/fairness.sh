#!/usr/bin/env bash
# Fairness of the gateway under load (a benchmark, not a test): TPC-H at scale factor SF loaded
# into Postgres and snapshotted, then through one `skipprd serve` with its default limits:
#   1. a short statement (`count(*)` of `nation`) alone, then beside one session that runs a
#      CPU-heavy hash join of `orders` with itself (on o_orderdate) in a loop (p50/p99, ratio);
#   2. how late `statement_timeout` (5 s) ends a heavy statement beside that load;
#   3. how long a cancel request takes to end a heavy statement beside that load.
# Baseline in the same run: the same short statement in Postgres.
# Prints a Markdown results block (also in $SKIPPR_BENCH_DIR/fairness/results.md).
#   benches/fairness.sh                       (defaults: SF=1 SHORT_RUNS=30 TRIES=3 JOIN_ON=o_orderdate)
#   SF=0.1 JOIN_ON=o_orderpriority benches/fairness.sh   (a quick run)
# SKIPPR_PYTHON: a Python with psycopg 3 and duckdb + its tpch extension wheel.
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver fairness fairness_bench.py 7200 "psycopg, duckdb"
