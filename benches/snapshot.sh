#!/usr/bin/env bash
# Snapshot benchmark: skipprd's consistent snapshot of one table into Iceberg, against
# Postgres' own `COPY (SELECT * FROM t) TO STDOUT` of the same table, in the same run.
#   benches/snapshot.sh [ROWS] [RUNS]      (defaults: 2000000 rows, 3 runs)
# SHAPE=wide (default): bigint key, integer, text, numeric, timestamptz, uuid, jsonb.
# SHAPE=narrow: bigint key, integer, short text, numeric, timestamptz, short text (the narrow
# table exposes skipprd's per-row and fixed costs: less of the time is Postgres's own).
# CDC_MODE=snapshot_then_cdc: the pipeline's first snapshot as most users run it (slot
# created, a large table copied in key chunks made durable one by one, then the stream
# caught up); default snapshot_only (ctid ranges inside one exported snapshot).
# CHUNK_ROWS sets snapshot_chunk_rows.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
rows="${1:-2000000}"; runs="${2:-3}"
build_release
bin="$(skipprd_bin)"
start_cluster
psql -q -d postgres -c "DROP DATABASE IF EXISTS bench_snapshot" -c "CREATE DATABASE bench_snapshot"
case "${SHAPE:-wide}" in
wide) table_sql="
CREATE TABLE orders (
  id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL,
  amount numeric(12,2) NOT NULL, ordered_at timestamptz NOT NULL, ref uuid, details jsonb);
INSERT INTO orders
SELECT i, ((i::bigint * 7919) % 100000)::int, (ARRAY['pending','paid','shipped'])[1 + i % 3],
       ((i::bigint * 104729) % 1000000) / 100.0, timestamptz '2024-01-01' + i * interval '1 second',
       md5(i::text)::uuid, jsonb_build_object('items', i % 7, 'note', 'order ' || i)
FROM generate_series(1, $rows) i;" ;;
narrow) table_sql="
CREATE TABLE orders (
  id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL,
  amount numeric(12,2) NOT NULL, ordered_at timestamptz NOT NULL, channel text NOT NULL);
INSERT INTO orders
SELECT i, ((i::bigint * 7919) % 100000)::int, (ARRAY['pending','paid','shipped'])[1 + i % 3],
       ((i::bigint * 104729) % 1000000) / 100.0, timestamptz '2024-01-01' + i * interval '1 second',
       (ARRAY['web','store','phone','partner'])[1 + i % 4]
FROM generate_series(1, $rows) i;" ;;
*) echo "SHAPE must be wide or narrow, not ${SHAPE}" >&2; exit 1 ;;
esac
psql -q -d bench_snapshot -c "$table_sql" -c "VACUUM ANALYZE orders"
work="$bench_dir/snapshot"; rm -rf "$work"; mkdir -p "$work"
cat >"$work/skippr.yml" <<YAML
skippr: {workspace: bench}
pipelines: {p: {data_source: data_sources.db, data_sink: data_sinks.lake}}
data_sources:
  db: {Postgres: {host: 127.0.0.1, port: $bench_port, user: postgres, database: bench_snapshot, tables: [orders], cdc_mode: ${CDC_MODE:-snapshot_only}${CHUNK_ROWS:+, snapshot_chunk_rows: $CHUNK_ROWS}}}
data_sinks:
  lake: {LocalIceberg: {warehouse: ./warehouse}}
YAML
rm -f "$work/copy.txt" "$work/skipprd.txt"
for _ in $(seq "$runs"); do
  timed "$work/copy.txt" sh -c 'psql -d bench_snapshot -c "COPY (SELECT * FROM orders) TO STDOUT" > /dev/null'
  rm -rf "$work/warehouse" "$work/.skippr"
  psql -q -d bench_snapshot -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'skippr_bench_p%'" >/dev/null
  timed "$work/skipprd.txt" "$bin" --config "$work/skippr.yml" sync --pipeline p --once >/dev/null 2>&1
done
n=$("$bin" --config "$work/skippr.yml" query --format csv "SELECT count(*) AS n FROM orders" | tail -n 1)
[ "$n" = "$rows" ] || { echo "skipprd copied $n rows, expected $rows" >&2; exit 1; }
copy=$(median 1 "$work/copy.txt"); ours=$(median 1 "$work/skipprd.txt"); rss=$(median 2 "$work/skipprd.txt")
size=$(du -sm "$work/warehouse" | cut -f1)
echo "shape=${SHAPE:-wide} mode=${CDC_MODE:-snapshot_only} rows=$rows runs=$runs copy_s=$copy skipprd_s=$ours ratio=$(awk -v a="$ours" -v b="$copy" 'BEGIN{printf "%.2f", a/b}') skipprd_peak_rss_mib=$((rss / 1024)) warehouse_mib=$size"
