#!/usr/bin/env bash
# The quickstart, end to end on the embedded default: a local Postgres with logical WAL
# (installed and started here unless PGHOST names one), sample data from sql/, then
# skipprd discover, sync and query into a local Iceberg warehouse.
#
#   ./tests/quickstart.sh                     # everything local, in ./quickstart/
#   PGHOST=db PGPORT=5432 PGUSER=postgres PGPASSWORD=... ./tests/quickstart.sh
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${SKIPPR_QUICKSTART_DIR:-$repo/quickstart}"
mkdir -p "$work"
export APP_DB_PASSWORD="${APP_DB_PASSWORD:-quickstart-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')}"

say() { printf '\n==> %s\n' "$*"; }

if [ -z "${PGHOST:-}" ]; then
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    say "installing PostgreSQL (Debian package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  pgdata="$work/pgdata"
  export PGHOST="$work/socket" PGPORT="${PGPORT:-54329}" PGUSER=postgres
  mkdir -p "$PGHOST"
  if [ ! -f "$pgdata/PG_VERSION" ]; then
    say "creating a Postgres cluster with wal_level=logical in $pgdata"
    mkdir -p "$pgdata"
    chown -R postgres:postgres "$work/pgdata" "$PGHOST"
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
  touch "$work/postgres.log" && chown postgres:postgres "$work/postgres.log"
  if ! runuser -u postgres -- "$bin/pg_ctl" -D "$pgdata" status >/dev/null 2>&1; then
    say "starting Postgres on 127.0.0.1:$PGPORT"
    runuser -u postgres -- "$bin/pg_ctl" -D "$pgdata" -l "$work/postgres.log" -w start >/dev/null
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

say "building skipprd"
(cd "$repo" && cargo build --quiet --bin skipprd)
skipprd="$repo/target/debug/skipprd"

cat >"$work/skippr.yml" <<YAML
skippr:
  workspace: analytics
  skipprd_el_storage_mode: local

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
say "done: the Iceberg warehouse is $work/warehouse (catalog: $work/warehouse/catalog.db)"
