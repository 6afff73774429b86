#!/usr/bin/env bash
# Soak benchmark (not for CI): `skipprd serve` for DURATION seconds (default one hour) under a
# steady mixed write load (RATE transactions/s of inserts, updates and deletes), CLIENTS
# gateway clients running short queries, and a Postgres restart (`pg_ctl restart -m fast`)
# every RESTART_EVERY seconds. Per WINDOW it reports serve's RSS (must stay flat), the slot's
# lag in bytes, freshness p99 (commit in Postgres to visible through the gateway, from marker
# rows), gateway query errors, writer errors and reconnects. Ends with the live table compared
# to Postgres. Prints a Markdown results block (also in /tmp/skippr-bench/soak/results.md).
#   benches/soak.sh                                                   (defaults: one hour)
#   DURATION=120 RESTART_EVERY=40 WINDOW=20 RATE=200 CLIENTS=10 benches/soak.sh  (a smoke run)
# Parameters (environment): DURATION RATE CLIENTS RESTART_EVERY WINDOW ROWS, see soak_bench.py.
# SKIPPR_PYTHON: a Python with psycopg 3 (default $HOME/.cache/skippr/venv/bin/python).
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver soak soak_bench.py "$(( ${DURATION:-3600} + 1800 ))" "psycopg"
