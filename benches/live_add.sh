#!/usr/bin/env bash
# A table added to a running pipeline (a benchmark, not a test): `skipprd serve` streams a busy
# table under a paced write load; `skipprd sync --add-table` adds a table of ADD_ROWS rows. The
# busy table's freshness (a marker row committed in Postgres until the gateway shows it) is
# probed before, during and after the added table's copy; the added table must become
# queryable whole and equal to Postgres. Prints a Markdown results block (also in
# $SKIPPR_BENCH_DIR/live_add/results.md) with the exact command; exits 1 on wrong answers.
#   benches/live_add.sh                        (defaults: ADD_ROWS=2000000 RATE=200)
#   ADD_ROWS=200000 BEFORE=5 benches/live_add.sh   (a quick smoke run)
# Parameters (environment): ADD_ROWS BUSY_ROWS RATE BEFORE AFTER POLL_MS COMMIT_INTERVAL, see
# benches/live_add_bench.py; BENCH_TIMEOUT bounds the whole run (default 1 h).
# SKIPPR_PYTHON: a Python with psycopg 3. SKIPPR_BENCH_DIR / SKIPPR_BENCH_PORT: the private
# cluster's folder and port (see common.sh), SKIPPRD_BIN: a binary to measure.
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver live_add live_add_bench.py "3600" "psycopg"
