#!/usr/bin/env bash
# REST catalog commit latency (not for CI): the `commit round`s of a continuous `skipprd sync`
# (commit_interval 200ms, maintenance off) into a RestIceberg sink on the suite's loopback REST
# catalog (tests/rest_catalog.py: PyIceberg's SqlCatalog behind the protocol), with and
# without `transactions/commit`, for 1 table and for 10 tables, under a steady stream of small
# transactions touching every table; p50/p99 of the whole round and of the catalog request.
# Baselines in the same run: LocalIceberg (sqlite catalog) on the same workload, and PyIceberg's
# RestCatalog appending the same batches to the same catalog. 5 to 6 minutes on 2 cores.
#   benches/rest_commits.sh                                      (defaults: 120 rounds, 50 tx/s)
#   ROUNDS=30 WARMUP=3 benches/rest_commits.sh                   (a smoke run)
# Parameters (environment): ROUNDS WARMUP RATE TABLES_MAX SEED RUNS COMMIT_INTERVAL CATALOG_NODELAY,
# see rest_commits_bench.py. SKIPPRD_BIN: a binary to measure (default: a release build).
# SKIPPR_PYTHON: a Python with psycopg 3 and pyiceberg (default $HOME/.cache/skippr/venv/bin/python,
# which tests/run sets up). Results also in /tmp/skippr-bench/rest_commits/results.md.
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver rest_commits rest_commits_bench.py "1800" "psycopg, pyiceberg, pyarrow, sqlalchemy"
