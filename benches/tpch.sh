#!/usr/bin/env bash
# TPC-H through `skipprd serve`, in one run against baselines of the same run (a benchmark, not
# a test): the data and the 22 query texts of DuckDB's tpch extension (dbgen at scale factor
# SF), loaded into Postgres with TPC-H's primary keys and snapshotted by `sync --once` (timed
# against `COPY ... TO STDOUT` of every table); then each query through the gateway, in DuckDB
# over the same Iceberg files (iceberg_scan of each table's metadata JSON) and in Postgres;
# every gateway answer must equal Postgres's (and DuckDB's where Postgres ran out of time).
# Prints a Markdown results block (also in $SKIPPR_BENCH_DIR/tpch/results.md) with the exact
# command; exits 1 on a wrong answer or a failed query.
#   benches/tpch.sh                       (defaults: SF=1 RUNS=3 PG_TIMEOUT=300)
#   SF=0.1 RUNS=1 benches/tpch.sh         (a quick run)
# Parameters (environment): SF RUNS PG_TIMEOUT QUERY_TIMEOUT, see benches/tpch_bench.py;
# BENCH_TIMEOUT (the whole run, default 3 h). SKIPPR_PYTHON: a Python with psycopg 3, duckdb
# and its iceberg and tpch extension wheels (default $HOME/.cache/skippr/venv/bin/python).
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver tpch tpch_bench.py 10800 "psycopg, duckdb"
