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
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
python="${SKIPPR_PYTHON:-$HOME/.cache/skippr/venv/bin/python}"
"$python" -c 'import psycopg' || { echo "$python lacks psycopg (tests/run sets up that venv)" >&2; exit 1; }
build_release
bin="$(skipprd_bin)"
[ -x "$bin" ] || { echo "no skipprd binary at $bin" >&2; exit 1; }
start_cluster
work="$bench_dir/soak"
rm -rf "$work"; mkdir -p "$work"
SKIPPRD="$bin" BENCH_WORK="$work" BENCH_PG_PORT="$bench_port" PG_BIN="$pg_bin" \
  PG_DATA="$bench_dir/pgdata" PG_LOG="$bench_dir/postgres.log" \
  exec timeout --foreground -k 60 "$(( ${DURATION:-3600} + 1800 ))" "$python" "$here/soak_bench.py"
