#!/usr/bin/env bash
# The quickstart, end to end on the embedded default: a local Postgres with logical WAL
# (installed and started here unless PGHOST names one), sample data from sql/, then
# skipprd discover, sync and query into a local Iceberg warehouse; then `skipprd serve` with psql
# against its gateway, a change made in Postgres shown live, and the daemon stopped.
#
#   ./tests/quickstart.sh                     # everything local, in ./quickstart/
#   PGHOST=db PGPORT=5432 PGUSER=postgres PGPASSWORD=... ./tests/quickstart.sh
# Environment: SKIPPR_QUICKSTART_DIR (work folder, default ./quickstart), CARGO_TARGET_DIR (build
# folder, default ~/.cache/skippr/target: the one tests/run uses, so the crate compiles once),
# SKIPPR_GATEWAY_PORT (default 55433), SKIPPR_METRICS_PORT (default 59187).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${SKIPPR_QUICKSTART_DIR:-$repo/quickstart}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
gateway_port="${SKIPPR_GATEWAY_PORT:-55433}"
metrics_port="${SKIPPR_METRICS_PORT:-59187}"
export APP_DB_PASSWORD="${APP_DB_PASSWORD:-quickstart-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')}"

say() { printf '\n==> %s\n' "$*"; }

if [ -z "${PGHOST:-}" ]; then
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    say "installing PostgreSQL (Debian package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  # The server runs as the `postgres` user, which cannot enter a folder only its owner may
  # (root's home is one): then its data folder lives in the temp dir, one per work folder.
  pgroot="$work"
  if ! runuser -u postgres -- test -x "$work" 2>/dev/null; then
    pgroot="${TMPDIR:-/tmp}/skippr-quickstart-$(printf '%s' "$work" | cksum | cut -d' ' -f1)"
    say "the postgres user cannot enter $work; its cluster goes to $pgroot"
    mkdir -p "$pgroot"
    chmod 0711 "$pgroot"
  fi
  pgdata="$pgroot/pgdata"
  export PGHOST="$pgroot/socket" PGPORT="${PGPORT:-54329}" PGUSER=postgres
  mkdir -p "$PGHOST"
  if [ ! -f "$pgdata/PG_VERSION" ]; then
    say "creating a Postgres cluster with wal_level=logical in $pgdata"
    mkdir -p "$pgdata"
    chown -R postgres:postgres "$pgdata" "$PGHOST"
    runuser -u postgres -- "$bin/initdb" -D "$pgdata" -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    cat >>"$pgdata/postgresql.conf" <<CONF
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$PGHOST'
CONF
  fi
  chown postgres:postgres "$PGHOST"
  touch "$pgroot/postgres.log" && chown postgres:postgres "$pgroot/postgres.log"
  if ! runuser -u postgres -- "$bin/pg_ctl" -D "$pgdata" status >/dev/null 2>&1; then
    say "starting Postgres on 127.0.0.1:$PGPORT"
    runuser -u postgres -- "$bin/pg_ctl" -D "$pgdata" -l "$pgroot/postgres.log" -w start >/dev/null
  fi
  db_host=127.0.0.1
else
  db_host="$PGHOST"
fi
db_port="${PGPORT:-5432}"

say "loading sample data into database app"
psql -v ON_ERROR_STOP=1 -qAt -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'app'" | grep -q 1 \
  || psql -v ON_ERROR_STOP=1 -q -d postgres -c "CREATE DATABASE app"
psql -v ON_ERROR_STOP=1 -q -d app -f "$repo/sql/sample.sql"
psql -v ON_ERROR_STOP=1 -q -d app -v pw="$APP_DB_PASSWORD" -f "$repo/sql/roles.sql" >/dev/null

say "building skipprd (cargo build --bins, the build tests/run makes)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/skippr/target}"
(cd "$repo" && cargo build --quiet --bins)
skipprd="$CARGO_TARGET_DIR/debug/skipprd"

cat >"$work/skippr.yml" <<YAML
skippr:
  workspace: analytics
  skipprd_el_storage_mode: local
  query:
    listen: 127.0.0.1:$gateway_port
  metrics:
    listen: 127.0.0.1:$metrics_port

pipelines:
  app:
    data_source: data_sources.app_db
    data_sink: data_sinks.lake

data_sources:
  app_db:
    Postgres:
      host: $db_host
      port: $db_port
      user: skippr_reader
      password: \${APP_DB_PASSWORD}
      database: app
      tables: [orders, customers]
      cdc_mode: snapshot_then_cdc

data_sinks:
  lake:
    LocalIceberg:
      warehouse: ./warehouse
YAML
# A fresh run each time: the sample data was just reloaded.
rm -rf "$work/warehouse" "$work/.skippr"
psql -q -d app -c "SELECT pg_drop_replication_slot('skippr_analytics_app') FROM pg_replication_slots WHERE slot_name = 'skippr_analytics_app'" >/dev/null

cd "$work"
say "skipprd validate";  "$skipprd" validate
say "skipprd discover --pipeline app";  "$skipprd" discover --pipeline app
say "skipprd sync --pipeline app --once";  "$skipprd" sync --pipeline app --once
say 'skipprd query "SELECT count(*), sum(amount) FROM analytics.orders"'
"$skipprd" query "SELECT count(*), sum(amount) FROM analytics.orders"
say "the same on the source"
psql -d app -c "SELECT count(*), sum(amount) FROM orders"

say "skipprd serve: live SQL for any Postgres client on 127.0.0.1:$gateway_port"
"$skipprd" serve >"$work/serve.log" 2>&1 &
serve_pid=$!
stop_serve() { kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true; }
trap stop_serve EXIT
gateway() { psql "host=127.0.0.1 port=$gateway_port user=analyst dbname=analytics" "$@"; }
for _ in $(seq 1 120); do
  gateway -qAt -c "SELECT 1" >/dev/null 2>&1 && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; echo "skipprd serve stopped; its log is above" >&2; exit 1; }
  sleep 0.5
done
say "psql against the gateway"
gateway -c "SELECT status, count(*) AS orders, sum(amount) AS amount FROM analytics.orders GROUP BY status ORDER BY status"

say "a new order committed in Postgres ..."
new_id="$(psql -qAt -d app -c "INSERT INTO orders (id, customer_id, status, amount, ordered_at)
  SELECT max(id) + 1, 1, 'pending', 42.00, now() FROM orders RETURNING id")"
echo "order $new_id"
say "... is live through the gateway"
start=$(date +%s%N)
for _ in $(seq 1 100); do
  [ "$(gateway -qAt -c "SELECT count(*) FROM analytics.orders WHERE id = $new_id")" = 1 ] && break
  sleep 0.1
done
gateway -c "SELECT id, status, amount FROM analytics.orders WHERE id = $new_id"
echo "visible $(( ($(date +%s%N) - start) / 1000000 )) ms after the commit"
gateway -c "SELECT table_name, committed_lsn, pipeline_state FROM skippr.tables"

say "stopping skipprd serve"
stop_serve
trap - EXIT
say "done: the Iceberg warehouse is $work/warehouse (catalog: $work/warehouse/catalog.db)"
