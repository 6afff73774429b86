#!/usr/bin/env bash
# Many tables in one pipeline (a benchmark, not a test): TABLES tables (most small, a few of
# 100,000 rows, BUSY of them taking a paced write load) snapshotted and then streamed through
# one slot by `skipprd sync`, against the same pipeline over the BUSY tables alone, in the same
# run. Per pipeline: the time from start to streaming (the snapshot), peak RSS while streaming,
# the commit rounds' p50, p99 and max and the most tables one round committed (`skipprd status`),
# and the time a restart takes to stream again. Every table is checked against Postgres
# (count and sum) at the end. Prints a Markdown results block (also in
# $SKIPPR_BENCH_DIR/many_tables/results.md) with the exact command; exits 1 on wrong answers.
#   benches/many_tables.sh                          (defaults: TABLES=300 BUSY=10 DURATION=60)
#   TABLES=50 DURATION=15 benches/many_tables.sh    (a quick smoke run)
# Parameters (environment): TABLES BUSY BIG SMALL_ROWS BIG_ROWS RATE DURATION COMMIT_INTERVAL,
# see benches/many_tables_bench.py; BENCH_TIMEOUT bounds the whole run (default 1 h).
# SKIPPR_PYTHON: a Python with psycopg 3. SKIPPR_BENCH_DIR / SKIPPR_BENCH_PORT: the private
# cluster's folder and port (see common.sh), SKIPPRD_BIN: a binary to measure.
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver many_tables many_tables_bench.py "3600" "psycopg"
