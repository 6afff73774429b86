#!/usr/bin/env bash
# S3 benchmark (not for CI): the same snapshot, CDC run and live freshness with the pipeline's
# state, WAL and warehouse on local disk (LocalIceberg) and on S3 + Glue (AthenaIceberg on a
# local moto server, started and stopped here), in the same run, against one Postgres.
#   benches/s3.sh                                    (defaults: 1000000 rows, 300000 changes, 3 runs)
#   ROWS=200000 CHANGES=50000 RUNS=1 PROBES=30 benches/s3.sh     (a smoke run)
# Parameters (environment): ROWS CHANGES RUNS PROBES RATE, see s3_bench.py.
# SKIPPR_PYTHON: a Python with psycopg 3 and moto[server] (default $HOME/.cache/skippr/venv/bin/python,
# which tests/run sets up).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
python="${SKIPPR_PYTHON:-$HOME/.cache/skippr/venv/bin/python}"
"$python" -c 'import psycopg, moto, boto3' || { echo "$python lacks psycopg, moto or boto3 (tests/run sets up that venv)" >&2; exit 1; }
build_release
bin="$(skipprd_bin)"
[ -x "$bin" ] || { echo "no skipprd binary at $bin" >&2; exit 1; }
start_cluster
work="$bench_dir/s3"
rm -rf "$work"; mkdir -p "$work"
SKIPPRD="$bin" BENCH_WORK="$work" BENCH_PG_PORT="$bench_port" \
  exec timeout --foreground -k 60 7200 "$python" "$here/s3_bench.py"
