#!/usr/bin/env bash
# Table maintenance benchmark, "a compressed day" (not for CI): a 200,000-row table followed by
# `skipprd serve` with commit_interval 100ms and the default maintenance settings except
# check_interval 5s and snapshot_retention 60s, under a mixed write load (inserts, updates,
# deletes; the table keeps its size) until about 2,000 commits. Every 100 commits it samples a
# point lookup and an aggregate through the gateway (median of 20) against the same queries
# in Postgres, the metadata.json size, the files under the table's data/ folder, the snapshots,
# live data and delete files, and serve's RSS. At the end: the live table against Postgres,
# and the start-up of a fresh `sync --once` up to "key index loaded", against the one timed
# right after the copy. Prints a Markdown results block (also in
# /tmp/skippr-bench/maintenance/results.md) with a last/first ratio row.
#   benches/maintenance.sh                                      (defaults: ~2,000 commits)
#   ROWS=20000 COMMITS=300 SAMPLE_EVERY=50 RUNS=5 benches/maintenance.sh     (a smoke run)
# Parameters (environment): ROWS COMMITS SAMPLE_EVERY RUNS RATE COMMIT_INTERVAL CHECK_INTERVAL
# SNAPSHOT_RETENTION ORPHAN_FILE_AGE MIN_SNAPSHOTS_TO_KEEP COMPACTION_MIN_FILES MAX_DURATION,
# see maintenance_bench.py. SKIPPRD_BIN: a binary to measure (default: a release build).
# SKIPPR_PYTHON: a Python with psycopg 3 (default $HOME/.cache/skippr/venv/bin/python).
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver maintenance maintenance_bench.py "$(( ${MAX_DURATION:-3600} + 1800 ))" "psycopg"
