#!/usr/bin/env bash
# Gateway benchmark: `skipprd serve` measured in one run against baselines of the same run:
#   1. freshness: commit-to-visible latency of marker rows under a steady write load
#      (commit_interval 10s), and the Iceberg commits in that window;
#   2. union overhead: an aggregate over a table with 1% of its rows in the WAL tail, against
#      the same aggregate after the tail was committed (empty tail);
#   3. analytics: the aggregate and a join through the gateway, DuckDB (iceberg_scan of the
#      same files) and the source Postgres;
#   4. concurrency: 100 connections of short queries while a writer ingests;
#   5. point lookups by key, 1 and 100 clients, through the gateway and on Postgres.
# Peak RSS of every `serve` process. Prints a Markdown results block (also in
# /tmp/skippr-bench/serve/results.md) with the exact command.
#   benches/serve.sh                                    (defaults: ROWS=5000000 DURATION=60)
#   ROWS=200000 DURATION=10 PROBES=200 RUNS=3 benches/serve.sh     (a quick smoke test)
# Parameters (environment): ROWS CUSTOMERS RUNS DURATION CLIENTS RATE WRITERS PROBES
# PROBE_INTERVAL_MS POLL_MS COMMIT_INTERVAL CONC_RATE LOOKUP_SECONDS PREPARE, see benches/serve_bench.py; bounds of the
# waits: SERVE_START_TIMEOUT SERVE_STOP_TIMEOUT SYNC_TIMEOUT TAIL_TIMEOUT PROBE_TIMEOUT
# QUERY_TIMEOUT (seconds), BENCH_TIMEOUT (the whole run, default 4 h). SKIPPR_PYTHON: a Python
# with psycopg 3 and duckdb + its extension wheels (default $HOME/.cache/skippr/venv/bin/python).
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver serve serve_bench.py "14400" "psycopg, duckdb"
