#!/usr/bin/env bash
# Read-your-writes benchmark of `skipprd serve`, in one run against one Postgres and one
# gateway at a time (a benchmark, not a test):
#   1. fence latency: under a paced write load (commit_interval 10s, as in serve.sh; the load
#      committing with synchronous_commit off, then on), a marker row committed in Postgres and
#      read back through the gateway with `SET skippr.min_lsn`, `skippr.wait_lsn(lsn)` and
#      `skippr.wait_lsn(NULL)`, against plain freshness (polling until the row shows) and
#      against Postgres answering the same lookup; the fenced reads must see the row every time;
#   2. cost of the one-LSN cut: a point lookup, an aggregate and a two-table join with a live
#      WAL tail and with an empty one, each statement building its read view (autocommit)
#      against the same statement reusing one (inside a REPEATABLE READ transaction), and
#      Postgres.
# Prints a Markdown results block (also in $SKIPPR_BENCH_DIR/fence/results.md) with the exact
# command; exits 1 on wrong answers or a fenced read that missed its row.
#   benches/fence.sh                                          (defaults: ROWS=1000000 PROBES=100)
#   ROWS=50000 PROBES=20 RUNS=3 benches/fence.sh              (a quick smoke run)
# Parameters (environment): ROWS CUSTOMERS RUNS SHORT_RUNS RATE WRITERS PROBES PROBE_INTERVAL_MS POLL_MS
# COMMIT_INTERVAL WAIT_TIMEOUT LOAD_COMMIT PREPARE, see benches/fence_bench.py; bounds of the waits:
# SERVE_START_TIMEOUT SERVE_STOP_TIMEOUT SYNC_TIMEOUT TAIL_TIMEOUT PROBE_TIMEOUT QUERY_TIMEOUT
# (seconds), BENCH_TIMEOUT (the whole run, default 2 h). SKIPPR_PYTHON: a Python with psycopg 3
# (default $HOME/.cache/skippr/venv/bin/python). SKIPPR_BENCH_DIR / SKIPPR_BENCH_PORT: the
# private cluster's folder and port (see common.sh), SKIPPRD_BIN: a binary to measure.
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver fence fence_bench.py "7200" "psycopg"
