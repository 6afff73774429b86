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
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
run_driver s3 s3_bench.py "7200" "psycopg, moto, boto3"
