#!/usr/bin/env bash
# Changelog tables: what `changelog: true` costs CDC. One source table, followed side by side
# by two pipelines of the same binary: `plain` (the table alone) and `logged` (the table and
# its changelog table). Measured, in the same run:
#   1. CDC throughput: after both copied the table, a batch of changes (inserts, updates,
#      deletes, in transactions of 10,000 rows), each pipeline's `sync --once` timed;
#   2. commit latency: each pipeline's continuous `sync` (commit_interval 1s, one after the
#      other) under the same paced writer (small transactions for DURATION seconds), the
#      `commit round` durations it logs (p50, p99).
# Baseline: the plain pipeline. Both pipelines' tables, and the changelog replayed, are
# checked equal to Postgres.
#   benches/changelog.sh [ROWS] [RUNS]     (defaults: 1000000 rows, 3 runs; DURATION=30)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
rows="${1:-1000000}"; runs="${2:-3}"; duration="${DURATION:-30}"
build_release
bin="$(skipprd_bin)"
start_cluster
work="$bench_dir/changelog"; rm -rf "$work"; mkdir -p "$work"

config() { # NAME LAYOUT
  mkdir -p "$work/$1"
  cat >"$work/$1/skippr.yml" <<YAML
skippr: {workspace: $1}
pipelines: {p: {data_source: data_sources.db, data_sink: data_sinks.lake, commit_interval: 1s, maintenance: {enabled: false}$2}}
data_sources:
  db: {Postgres: {host: 127.0.0.1, port: $bench_port, user: postgres, database: bench_changelog, tables: [orders]}}
data_sinks:
  lake: {LocalIceberg: {warehouse: ./warehouse}}
YAML
}

# rounds LOG: "p50 p99 count" of the round_ms of the `commit round` lines of a JSON log.
rounds() {
  python3 - "$1" <<'PY'
import json, sys
ms = []
for line in open(sys.argv[1], errors="replace"):
    if '"commit round"' not in line:
        continue
    try:
        f = json.loads(line).get("fields", {})
    except json.JSONDecodeError:
        continue
    if f.get("message") == "commit round" and f.get("tables", 0) > 0:
        ms.append(float(f["round_ms"]))
ms = sorted(ms[2:])  # the first rounds warm the caches
def pct(p):
    return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))] if ms else float("nan")
print(f"{pct(50):.1f} {pct(99):.1f} {len(ms)}")
PY
}

rm -f "$work"/*.txt
for run in $(seq "$runs"); do
  psql -q -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('skippr_plain_p', 'skippr_logged_p')" >/dev/null
  psql -q -d postgres -c "DROP DATABASE IF EXISTS bench_changelog" -c "CREATE DATABASE bench_changelog"
  psql -q -d bench_changelog <<SQL
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer NOT NULL, amount numeric(12,2) NOT NULL,
                     status text NOT NULL, note text, updated_at timestamptz NOT NULL);
INSERT INTO orders SELECT i, (i * 7919 % 100000)::int, (i * 104729 % 1000000) / 100.0, 'new', 'order ' || i,
       timestamptz '2026-10-01 00:00:00+00' + i * interval '1 second'
FROM generate_series(1::bigint, $rows) i;
VACUUM ANALYZE orders;
SQL
  rm -rf "$work/plain" "$work/logged"
  config plain ""
  config logged ", tables: {orders: {changelog: true}}"
  for name in plain logged; do
    "$bin" --config "$work/$name/skippr.yml" sync --pipeline p --once >/dev/null 2>"$work/$name/snapshot.log"
  done
  # 1. Throughput: 35% of the rows changed, in transactions of 10k rows.
  ins=$((rows / 10)); upd=$((rows / 5)); del=$((rows / 20))
  psql -q -d bench_changelog <<SQL
DO \$\$
DECLARE b bigint;
BEGIN
  FOR b IN 0..($ins - 1) / 10000 LOOP
    INSERT INTO orders SELECT i, 1, 1, 'new', 'added', now()
    FROM generate_series($rows + 1 + b * 10000, least($rows + (b + 1) * 10000, $((rows + ins)))) i;
    COMMIT;
  END LOOP;
  FOR b IN 0..($upd - 1) / 10000 LOOP
    UPDATE orders SET amount = amount + 1, status = 'paid', updated_at = now()
    WHERE id BETWEEN 1 + b * 10000 AND least((b + 1) * 10000, $upd);
    COMMIT;
  END LOOP;
  FOR b IN 0..($del - 1) / 10000 LOOP
    DELETE FROM orders WHERE id BETWEEN $upd + 1 + b * 10000 AND least($upd + (b + 1) * 10000, $((upd + del)));
    COMMIT;
  END LOOP;
END \$\$;
SQL
  for name in plain logged; do
    timed "$work/cdc-$name.txt" "$bin" --config "$work/$name/skippr.yml" sync --pipeline p --once >/dev/null 2>"$work/$name/cdc.log"
  done
  # 2. Commit latency: each pipeline's continuous sync under the same paced writer.
  for name in plain logged; do
    base=$((rows + ins + run * 10000000)); [ "$name" = logged ] && base=$((base + 5000000))
    RUST_LOG="skippr=debug,skipprd=info,warn" "$bin" --config "$work/$name/skippr.yml" --log-format json \
      sync --pipeline p >/dev/null 2>"$work/$name/sync.log" &
    pid=$!
    sleep 3
    psql -q -v ON_ERROR_STOP=1 -d bench_changelog >/dev/null <<SQL
DO \$\$
DECLARE i bigint; t0 timestamptz := clock_timestamp();
BEGIN
  i := 0;
  WHILE clock_timestamp() < t0 + interval '$duration seconds' LOOP
    UPDATE orders SET amount = amount + 1, updated_at = now() WHERE id = 1 + (i * 7919) % $upd;
    INSERT INTO orders VALUES ($base + 1 + i, 2, 2, 'live', NULL, now());
    COMMIT;
    i := i + 1;
    PERFORM pg_sleep(0.004);
  END LOOP;
END \$\$;
SQL
    sleep 3
    kill -TERM "$pid"; wait "$pid" || true
    echo "$(rounds "$work/$name/sync.log")" >>"$work/rounds-$name.txt"
  done
  # Both equal to Postgres; the changelog replayed in (lsn, seq) order equals it too.
  want=$(psql -qAt -d bench_changelog -c "SELECT count(*), sum(amount) FROM orders")
  for name in plain logged; do
    "$bin" --config "$work/$name/skippr.yml" sync --pipeline p --once >/dev/null 2>>"$work/$name/cdc.log"
    got=$("$bin" --config "$work/$name/skippr.yml" query --format csv "SELECT count(*) AS n, sum(amount) AS s FROM orders" | tail -n 1 | tr ',' '|')
    [ "$want" = "$got" ] || { echo "run $run: Postgres has $want, $name has $got" >&2; exit 1; }
  done
  replay=$("$bin" --config "$work/logged/skippr.yml" query --format csv "
    SELECT count(*) AS n, sum(amount) AS s FROM (
      SELECT *, row_number() OVER (PARTITION BY id ORDER BY _skippr_lsn DESC, _skippr_seq DESC) AS rn
      FROM orders_changelog) last WHERE rn = 1 AND _skippr_op <> 'delete'" | tail -n 1 | tr ',' '|')
  [ "$want" = "$replay" ] || { echo "run $run: Postgres has $want, the replayed changelog $replay" >&2; exit 1; }
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
cp=$(median 1 "$work/cdc-plain.txt"); cl=$(median 1 "$work/cdc-logged.txt")
rp50=$(median 1 "$work/rounds-plain.txt"); rl50=$(median 1 "$work/rounds-logged.txt")
rp99=$(median 2 "$work/rounds-plain.txt"); rl99=$(median 2 "$work/rounds-logged.txt")
echo "rows=$rows runs=$runs changes=$((ins + upd + del)) (inserts=$ins updates=$upd deletes=$del) writer=${duration}s"
echo "cdc: plain_s=$cp logged_s=$cl ratio=$(ratio "$cl" "$cp") plain_peak_rss_mib=$(( $(median 2 "$work/cdc-plain.txt") / 1024 )) logged_peak_rss_mib=$(( $(median 2 "$work/cdc-logged.txt") / 1024 ))"
echo "commit round ms: plain_p50=$rp50 logged_p50=$rl50 ratio_p50=$(ratio "$rl50" "$rp50") plain_p99=$rp99 logged_p99=$rl99 ratio_p99=$(ratio "$rl99" "$rp99") rounds_per_run=$(median 3 "$work/rounds-plain.txt")"
