#!/usr/bin/env bash
# CDC benchmark: skipprd applying a stream of mixed changes (30% inserts, 50% updates, 20%
# deletes) to Iceberg, against pg_recvlogical decoding the same changes with pgoutput to
# /dev/null, in the same run. Both read their own slot, created at the same position.
#   benches/cdc.sh [CHANGES] [RUNS]     (defaults: 1000000 changes, 3 runs)
#   SEED=2000000 benches/cdc.sh 1000000 1   (the table holds SEED rows before the changes;
#                                            default: the rows the updates and deletes need)
#   KEY_INDEX_MB=32 ...                      (the pipeline's key_index_memory_budget_mb: a
#                                            smaller budget keeps the key index on local disk)
#   TX_MB=64 ...                             (the pipeline's transaction_memory_budget_mb: staged
#                                            changes beyond it are spilled to data files)
#   REBUILD_INDEX=1 ...                      (the measured run rebuilds the key index from the
#                                            data files instead of reading its saved copy)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
changes="${1:-1000000}"; runs="${2:-3}"
build_release
bin="$(skipprd_bin)"
start_cluster
work="$bench_dir/cdc"; rm -rf "$work"; mkdir -p "$work"
rm -f "$work/recv.txt" "$work/skipprd.txt"
# The mix of the performance issue: 30% inserts, 50% updates, 20% deletes.
ins=$((changes * 3 / 10)); upd=$((changes / 2)); del=$((changes - ins - upd))
seed="${SEED:-$((upd + del))}"
[ "$seed" -ge $((upd + del)) ] || { echo "SEED must be at least $((upd + del)) (the rows updated and deleted)" >&2; exit 1; }
for run in $(seq "$runs"); do
  psql -q -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('bench_recv', 'skippr_bench_p')" >/dev/null
  psql -q -d postgres -c "DROP DATABASE IF EXISTS bench_cdc" -c "CREATE DATABASE bench_cdc"
  psql -q -d bench_cdc <<SQL
CREATE TABLE events (id bigint PRIMARY KEY, kind text NOT NULL, amount numeric(12,2), at timestamptz NOT NULL, payload jsonb);
INSERT INTO events SELECT i, 'seed', i / 100.0, timestamptz '2024-01-01' + i * interval '1 second', '{"seed": true}' FROM generate_series(1, $seed) i;
CREATE PUBLICATION skippr_bench_p FOR TABLE events;
SQL
  rm -rf "$work/warehouse" "$work/.skippr"
  cat >"$work/skippr.yml" <<YAML
skippr: {workspace: bench}
pipelines: {p: {data_source: data_sources.db, data_sink: data_sinks.lake${KEY_INDEX_MB:+, key_index_memory_budget_mb: $KEY_INDEX_MB}${TX_MB:+, transaction_memory_budget_mb: $TX_MB}}}
data_sources:
  db: {Postgres: {host: 127.0.0.1, port: $bench_port, user: postgres, database: bench_cdc, tables: [events]}}
data_sinks:
  lake: {LocalIceberg: {warehouse: ./warehouse}}
YAML
  "$bin" --config "$work/skippr.yml" sync --pipeline p --once >/dev/null 2>&1
  psql -q -d bench_cdc -c "SELECT pg_create_logical_replication_slot('bench_recv', 'pgoutput')" >/dev/null
  # The changes: batches of 10k per transaction.
  psql -q -d bench_cdc <<SQL
DO \$\$
DECLARE b bigint;
BEGIN
  FOR b IN 0..($ins - 1) / 10000 LOOP
    INSERT INTO events SELECT i, 'new', i / 100.0, now(), '{"n": 1}' FROM generate_series($seed + 1 + b * 10000, least($seed + (b + 1) * 10000, $((seed + ins)))) i;
    COMMIT;
  END LOOP;
  FOR b IN 0..($upd - 1) / 10000 LOOP
    UPDATE events SET amount = amount + 1, kind = 'updated' WHERE id BETWEEN 1 + b * 10000 AND least((b + 1) * 10000, $upd);
    COMMIT;
  END LOOP;
  FOR b IN 0..($del - 1) / 10000 LOOP
    DELETE FROM events WHERE id BETWEEN $upd + 1 + b * 10000 AND least($upd + (b + 1) * 10000, $((upd + del)));
    COMMIT;
  END LOOP;
END \$\$;
SQL
  end=$(psql -qAt -d bench_cdc -c "SELECT pg_current_wal_lsn()")
  timed "$work/recv.txt" "$pg_bin/pg_recvlogical" -d bench_cdc -h 127.0.0.1 -p "$bench_port" -U postgres --slot bench_recv --start \
      -o proto_version=1 -o publication_names=skippr_bench_p --endpos "$end" --no-loop -f /dev/null
  if [ -n "${REBUILD_INDEX:-}" ]; then rm -f "$work"/.skippr/keyindex/*/*.keyindex; fi
  timed "$work/skipprd.txt" "$bin" --config "$work/skippr.yml" sync --pipeline p --once >"$work/sync.log" 2>&1
  # Where the key index was: its memory and, beyond its budget, its file on local disk.
  grep -o 'key index loaded.*index_disk_mib=[0-9]*' "$work/sync.log" | sed 's/^/  /' || true
  a=$(psql -qAt -d bench_cdc -c "SELECT count(*), sum(amount) FROM events")
  b=$("$bin" --config "$work/skippr.yml" query --format csv "SELECT count(*) AS n, sum(amount) AS s FROM events" | tail -n 1 | tr ',' '|')
  [ "$a" = "$b" ] || { echo "run $run: Postgres has $a, Iceberg has $b" >&2; exit 1; }
done
recv=$(median 1 "$work/recv.txt"); ours=$(median 1 "$work/skipprd.txt"); rss=$(median 2 "$work/skipprd.txt")
echo "seed_rows=$seed key_index_mb=${KEY_INDEX_MB:-default} tx_mb=${TX_MB:-default} rebuild_index=${REBUILD_INDEX:-0} changes=$changes (inserts=$ins updates=$upd deletes=$del) runs=$runs pg_recvlogical_s=$recv skipprd_s=$ours ratio=$(awk -v a="$ours" -v b="$recv" 'BEGIN{printf "%.2f", a/b}') skipprd_peak_rss_mib=$((rss / 1024))"
