#!/usr/bin/env bash
# Partitioned tables: what `partition_by: [day(created_at)]` (30 partitions) costs the writes
# and saves the reads. One source table of 30 days of rows, followed by two pipelines side by
# side in the same run: `plain` (unpartitioned) and `parted` (partitioned by day). Measured:
# the snapshot, then CDC (inserts, updates that move rows to other days, deletes), each
# pipeline's `sync --once` timed; then a one-day query through each one's gateway (`serve`,
# once its pipeline streams), its time and the bytes the server read for it (/proc/PID/io
# rchar), with Postgres's own time for the same query as the baseline.
#   benches/partitions.sh [ROWS] [RUNS]     (defaults: 3000000 rows, 3 runs)
# The source rows are laid out in key order with the days interleaved (row i is on day
# i*7 mod 30), so the snapshot writes every partition at once: the partitioned writer's worst case.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
rows="${1:-3000000}"; runs="${2:-3}"; queries="${QUERIES:-9}"
build_release
bin="$(skipprd_bin)"
start_cluster
work="$bench_dir/partitions"; rm -rf "$work"; mkdir -p "$work"
day="2026-10-05"
query="SELECT count(*), sum(amount) FROM events WHERE created_at >= timestamptz '$day 00:00:00+00' AND created_at < timestamptz '$day 00:00:00+00' + interval '1 day'"

config() { # NAME PORT LAYOUT
  mkdir -p "$work/$1"
  cat >"$work/$1/skippr.yml" <<YAML
skippr: {workspace: $1, query: {listen: "127.0.0.1:$2"}}
pipelines: {p: {data_source: data_sources.db, data_sink: data_sinks.lake, maintenance: {enabled: false}$3}}
data_sources:
  db: {Postgres: {host: 127.0.0.1, port: $bench_port, user: postgres, database: bench_parts, tables: [events]}}
data_sinks:
  lake: {LocalIceberg: {warehouse: ./warehouse}}
YAML
}

# query_through NAME PORT: median seconds and median bytes read of $queries runs of the query.
query_through() {
  local name="$1" port="$2" pid out="$work/$1/query.txt"
  "$bin" --config "$work/$name/skippr.yml" serve >"$work/$name/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do psql -h 127.0.0.1 -p "$port" -d "$name" -qAt -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.5; done
  # Steady state: the pipeline has started streaming (its start-up work, which shares the
  # cores, is over), then a second for it to settle.
  for _ in $(seq 120); do
    [ "$(psql -h 127.0.0.1 -p "$port" -d "$name" -qAt -c "SELECT pipeline_state FROM skippr.tables LIMIT 1" 2>/dev/null)" = streaming ] && break
    sleep 0.5
  done
  sleep 1
  psql -h 127.0.0.1 -p "$port" -d "$name" -qAt -c "$query" >/dev/null   # warm: footers, listing
  # One session runs the query $queries times; psql's \timing gives each one's round trip.
  local r0 r1 args=(-c "\\timing on")
  for _ in $(seq "$queries"); do args+=(-c "$query"); done
  r0=$(awk '/^rchar/ {print $2}' "/proc/$pid/io")
  psql -h 127.0.0.1 -p "$port" -d "$name" -qAt "${args[@]}" >"$work/$name/timing.txt"
  r1=$(awk '/^rchar/ {print $2}' "/proc/$pid/io")
  grep -v '^Time:' "$work/$name/timing.txt" | grep -v '^Timing' | head -n 1 >"$work/$name/answer.txt"
  grep '^Time:' "$work/$name/timing.txt" | awk '{printf "%.4f\n", $2 / 1000}' >"$out"
  if [ "${EXPLAIN:-}" = 1 ]; then
    psql -h 127.0.0.1 -p "$port" -d "$name" -qAt -c "EXPLAIN ANALYZE $query" | grep -i -E "files|scan" | sed "s/^/  $name: /" >&2 || true
  fi
  kill -TERM "$pid"; wait "$pid" || true
  echo "$(median 1 "$out") $(( (r1 - r0) / queries ))"
}

rm -f "$work"/*.txt
for run in $(seq "$runs"); do
  psql -q -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('skippr_plain_p', 'skippr_parted_p')" >/dev/null
  psql -q -d postgres -c "DROP DATABASE IF EXISTS bench_parts" -c "CREATE DATABASE bench_parts"
  psql -q -d bench_parts <<SQL
CREATE TABLE events (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, customer_id integer NOT NULL,
                     amount numeric(12,2) NOT NULL, note text);
INSERT INTO events SELECT i, timestamptz '2026-10-01 00:00:00+00' + ((i * 7) % 30) * interval '1 day' + (i % 86400) * interval '1 second',
       (i * 7919 % 100000)::int, (i * 104729 % 1000000) / 100.0, 'event ' || i
FROM generate_series(1::bigint, $rows) i;
VACUUM ANALYZE events;
SQL
  rm -rf "$work/plain" "$work/parted"
  config plain 55461 ""
  config parted 55462 ", tables: {events: {partition_by: [\"day(created_at)\"]}}"
  for name in plain parted; do
    timed "$work/snapshot-$name.txt" "$bin" --config "$work/$name/skippr.yml" sync --pipeline p --once >/dev/null 2>"$work/$name/snapshot.log"
  done
  # The changes, in transactions of 10k rows: 10% of the rows inserted, 20% updated (a third
  # of them moved to another day), 5% deleted.
  ins=$((rows / 10)); upd=$((rows / 5)); del=$((rows / 20))
  psql -q -d bench_parts <<SQL
DO \$\$
DECLARE b bigint;
BEGIN
  FOR b IN 0..($ins - 1) / 10000 LOOP
    INSERT INTO events SELECT i, timestamptz '2026-10-01 00:00:00+00' + ((i * 7) % 30) * interval '1 day', 1, 1, 'new'
    FROM generate_series($rows + 1 + b * 10000, least($rows + (b + 1) * 10000, $((rows + ins)))) i;
    COMMIT;
  END LOOP;
  FOR b IN 0..($upd - 1) / 10000 LOOP
    UPDATE events SET amount = amount + 1,
           created_at = CASE WHEN id % 3 = 0 THEN created_at + interval '1 day' ELSE created_at END
    WHERE id BETWEEN 1 + b * 10000 AND least((b + 1) * 10000, $upd);
    COMMIT;
  END LOOP;
  FOR b IN 0..($del - 1) / 10000 LOOP
    DELETE FROM events WHERE id BETWEEN $upd + 1 + b * 10000 AND least($upd + (b + 1) * 10000, $((upd + del)));
    COMMIT;
  END LOOP;
END \$\$;
SQL
  for name in plain parted; do
    timed "$work/cdc-$name.txt" "$bin" --config "$work/$name/skippr.yml" sync --pipeline p --once >/dev/null 2>"$work/$name/cdc.log"
  done
  want=$(psql -qAt -d bench_parts -c "SELECT count(*), sum(amount) FROM events")
  for name in plain parted; do
    got=$("$bin" --config "$work/$name/skippr.yml" query --format csv "SELECT count(*) AS n, sum(amount) AS s FROM events" | tail -n 1 | tr ',' '|')
    [ "$want" = "$got" ] || { echo "run $run: Postgres has $want, $name has $got" >&2; exit 1; }
  done
done

# The one-day query: Postgres (its own time for the same query, from psql), then each gateway.
pg_args=(-c "\\timing on"); for _ in $(seq "$queries"); do pg_args+=(-c "$query"); done
psql -q -d bench_parts -At "${pg_args[@]}" >"$work/pg-timing.txt"
grep -v '^Time:' "$work/pg-timing.txt" | grep -v '^Timing' | head -n 1 >"$work/pg-answer.txt"
grep '^Time:' "$work/pg-timing.txt" | awk '{printf "%.4f\n", $2 / 1000}' >"$work/pg-query.txt"
read -r plain_q plain_b < <(query_through plain 55461)
read -r parted_q parted_b < <(query_through parted 55462)
cmp -s "$work/plain/answer.txt" "$work/pg-answer.txt" || { echo "plain answered $(cat "$work/plain/answer.txt"), Postgres $(cat "$work/pg-answer.txt")" >&2; exit 1; }
cmp -s "$work/parted/answer.txt" "$work/pg-answer.txt" || { echo "parted answered $(cat "$work/parted/answer.txt"), Postgres $(cat "$work/pg-answer.txt")" >&2; exit 1; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
sp=$(median 1 "$work/snapshot-plain.txt"); sq=$(median 1 "$work/snapshot-parted.txt")
cp=$(median 1 "$work/cdc-plain.txt"); cq=$(median 1 "$work/cdc-parted.txt")
echo "rows=$rows runs=$runs changes=$((ins + upd + del)) (inserts=$ins updates=$upd deletes=$del)"
echo "snapshot: plain_s=$sp parted_s=$sq ratio=$(ratio "$sq" "$sp") plain_peak_rss_mib=$(( $(median 2 "$work/snapshot-plain.txt") / 1024 )) parted_peak_rss_mib=$(( $(median 2 "$work/snapshot-parted.txt") / 1024 ))"
echo "cdc: plain_s=$cp parted_s=$cq ratio=$(ratio "$cq" "$cp") plain_peak_rss_mib=$(( $(median 2 "$work/cdc-plain.txt") / 1024 )) parted_peak_rss_mib=$(( $(median 2 "$work/cdc-parted.txt") / 1024 ))"
echo "files: plain=$(find "$work/plain/warehouse" -name '*.parquet' | wc -l) parted=$(find "$work/parted/warehouse" -name '*.parquet' | wc -l)"
echo "one-day query: postgres_s=$(median 1 "$work/pg-query.txt") plain_s=$plain_q parted_s=$parted_q time_ratio=$(ratio "$parted_q" "$plain_q") plain_read_mib=$(ratio "$plain_b" 1048576) parted_read_mib=$(ratio "$parted_b" 1048576) bytes_ratio=$(ratio "$parted_b" "$plain_b")"
