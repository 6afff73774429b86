#!/usr/bin/env bash
# Slot safety (issue 41): what the heartbeat costs, and how far the replication slot trails the
# server while only unpublished tables are written. Two parts in one run, on the benchmarks'
# Postgres cluster (benches/common.sh, port 55439), in a fresh database `bench_slot` with a
# published table `orders` (200 rows, idle) and an unpublished one `noise`:
# 1. Heartbeat cost. A `skipprd sync` daemon on the idle database for WINDOW seconds with
#    heartbeat_interval 0, 1m (the default) and 1s (which multiplies the heartbeats, so one is
#    measured precisely): the WAL the server wrote over the window (pg_current_wal_insert_lsn()
#    difference), its records by type (pg_waldump --stats), the `skippr.heartbeat` messages among
#    them, skipprd's CPU (utime+stime of /proc/PID/stat) and the server's (the postmaster and all
#    its children). A CHECKPOINT just before each window, so no timed checkpoint falls inside one.
#    The cluster is shared: a window with WAL records a heartbeat does not explain, or with
#    sessions in other databases, is measured again (TRIES times at most).
#    Per heartbeat: the 1s window against the 0 one; per hour at 1m: the 1m window scaled.
# 2. Slot lag under writes to an unpublished table. While the published table stays idle, a writer
#    puts WAL into `noise` (500 rows of 1.9 kB per transaction, the table truncated every 128 MiB)
#    at RATE_MB MiB/s for WRITE_S seconds, then unpaced for WRITE_S seconds or MAX_GB GiB of WAL,
#    whichever comes first. Streaming at the same time: the skipprd daemon (default heartbeat) and
#    the baseline, `pg_recvlogical` on its own pgoutput slot of the same publication
#    (proto_version 1, acknowledging every second: --fsync-interval 1 -s 1, to /dev/null).
#    pg_replication_slots is sampled every second (psql's \watch 1); per slot: retained WAL
#    (pg_current_wal_lsn() - restart_lsn), unacknowledged WAL (pg_current_wal_lsn() -
#    confirmed_flush_lsn) and pg_stat_replication's flush_lag, p50/p99/max while writing, and the
#    seconds from the writer's end until retained WAL is under 16 MiB (AFTER_MAX at most).
#   benches/slot_safety.sh                                  (about 10 minutes)
#   WINDOW=30 WRITE_S=15 MAX_GB=1 benches/slot_safety.sh    (a smoke run)
# Environment: WINDOW (120) SETTLE (20: seconds between the daemon taking its slot and a window)
# TRIES (3) RATE_MB (8) WRITE_S (60) MAX_GB (2: the cluster's pg_wal holds it until the next
# checkpoint, longer if another slot lags) AFTER_MAX (90); SKIPPRD_BIN: a binary to measure
# (default: the release build, built if needed). Results also in
# /tmp/skippr-bench/slot_safety/results.txt; samples, pg_waldump breakdowns and logs beside it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/common.sh"
window="${WINDOW:-120}"; settle="${SETTLE:-20}"; rate_mb="${RATE_MB:-8}"; write_s="${WRITE_S:-60}"
max_gb="${MAX_GB:-2}"; after_max="${AFTER_MAX:-90}"; tries="${TRIES:-3}"
build_release
bin="$(skipprd_bin)"
[ -x "$bin" ] || { echo "no skipprd binary at $bin" >&2; exit 1; }
start_cluster
work="$bench_dir/slot_safety"; rm -rf "$work"; mkdir -p "$work"
db=bench_slot; slot=skippr_slotbench_p; recv_slot=bench_slot_recv
mib=1048576; hz="$(getconf CLK_TCK)"
results="$work/results.txt"; : >"$results"
say() { echo "$*" | tee -a "$results"; }
q() { psql -qAtX -d "$db" -c "$1"; }

daemon=""; recv=""; sampler=""
stop_pid() { # PID: SIGTERM, then SIGKILL after 30 s
  local pid="$1"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }; sleep 0.5; done
  kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
}
cleanup() {
  stop_pid "$sampler"; stop_pid "$daemon"; stop_pid "$recv"
  # Leave no slot behind on the shared cluster: an idle slot would hold WAL for the next benchmark.
  psql -qAtX -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('$slot', '$recv_slot') AND NOT active" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

psql -qAtX -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('$slot', '$recv_slot')" >/dev/null
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
psql -qX -d "$db" <<SQL
CREATE TABLE orders (id bigint PRIMARY KEY, amount int, note text);
INSERT INTO orders SELECT i, i, 'order ' || i FROM generate_series(1, 200) i;
CREATE TABLE noise (id bigserial PRIMARY KEY, v text) WITH (autovacuum_enabled = off);
VACUUM ANALYZE orders;
SQL

config() { # HEARTBEAT_INTERVAL (empty: the default)
  cat >"$work/skippr.yml" <<YAML
skippr: {workspace: slotbench}
pipelines: {p: {data_source: data_sources.db, data_sink: data_sinks.lake}}
data_sources:
  db: {Postgres: {host: 127.0.0.1, port: $bench_port, user: postgres, database: $db, tables: [orders]${1:+, heartbeat_interval: $1}}}
data_sinks:
  lake: {LocalIceberg: {warehouse: ./warehouse}}
YAML
}

wait_active() { # SLOT PID
  for _ in $(seq 240); do
    [ "$(q "SELECT active FROM pg_replication_slots WHERE slot_name = '$1'")" = t ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "the process streaming $1 exited; logs in $work" >&2; exit 1; }
    sleep 0.5
  done
  echo "slot $1 was not taken within 120 s; logs in $work" >&2; exit 1
}

start_daemon() { # LOG
  "$bin" --config "$work/skippr.yml" sync --pipeline p >"$1" 2>&1 &
  daemon=$!
  wait_active "$slot" "$daemon"
}

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # utime + stime of PID, in clock ticks

# server_ticks FILE: "pid ticks" of the postmaster and all its children.
server_ticks() {
  local pm p
  pm=$(head -n 1 "$bench_dir/pgdata/postmaster.pid")
  for p in "$pm" $(ps --ppid "$pm" -o pid=); do
    [ -r "/proc/$p/stat" ] && echo "$p $(ticks "$p" 2>/dev/null || echo 0)"
  done >"$1" || true
}
# foreign_sessions: sessions of other databases, and slots streaming other than this script's.
foreign_sessions() {
  q "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('client backend', 'walsender') AND datname IS DISTINCT FROM '$db')
          + (SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name NOT IN ('$slot', '$recv_slot'))"
}
# server_delta BEFORE AFTER: CPU seconds between the two, per process (a process that started in
# between counts whole; one that exited in between is lost: none does while the database idles).
server_delta() {
  awk -v hz="$hz" 'NR == FNR {b[$1] = $2; next} {d += $2 - (($1 in b) ? b[$1] : 0)} END {printf "%.3f", d / hz}' "$1" "$2"
}

# ------------------------------------------------------------------------------------------
# The snapshot (creates the slot and the publication), then part 1: the heartbeat's cost.
# ------------------------------------------------------------------------------------------
config ""
"$bin" --config "$work/skippr.yml" sync --pipeline p --once >"$work/snapshot.log" 2>&1 \
  || { echo "the snapshot failed; see $work/snapshot.log" >&2; exit 1; }
pub=$(q "SELECT string_agg(pubname, ',') FROM pg_publication")
[ -n "$pub" ] && [ "${pub#*,}" = "$pub" ] || { echo "expected one publication in $db, found '$pub'" >&2; exit 1; }
ckpt_timeout=$(q "SELECT setting::int FROM pg_settings WHERE name = 'checkpoint_timeout'")

say "binary: $bin ($("$bin" --version 2>/dev/null | head -n 1 || true)); Postgres $(q 'SHOW server_version'); $(nproc) cores"
say "part 1: idle database, window ${window}s after ${settle}s of settling, CHECKPOINT before each window"
for hb in 0 1m 1s; do
  config "$hb"
  for try in $(seq "$tries"); do
    start_daemon "$work/sync-hb-$hb.log"
    sleep "$settle"
    c0=$(q "SELECT pg_current_wal_insert_lsn()"); psql -qX -d "$db" -c CHECKPOINT
    l0=$(q "SELECT pg_current_wal_insert_lsn()")
    ck=$(q "SELECT pg_wal_lsn_diff('$l0', '$c0')::bigint")
    f0=$(foreign_sessions)
    server_ticks "$work/srv0"; t0=$(ticks "$daemon"); s0=$(date +%s.%N)
    sleep "$window"
    l1=$(q "SELECT pg_current_wal_insert_lsn()")
    server_ticks "$work/srv1"; t1=$(ticks "$daemon"); s1=$(date +%s.%N)
    f1=$(foreign_sessions)
    kill -0 "$daemon" || { echo "sync exited during the window; see $work/sync-hb-$hb.log" >&2; exit 1; }
    stop_pid "$daemon"; daemon=""
    wal=$(q "SELECT pg_wal_lsn_diff('$l1', '$l0')::bigint")
    "$pg_bin/pg_waldump" -p "$bench_dir/pgdata/pg_wal" -s "$l0" -e "$l1" --stats=record >"$work/waldump-hb-$hb.txt" 2>&1 || true
    # Per record type: "type count bytes" (the "(percent)" columns dropped first).
    records=$(sed -n '/^Type/,$p' "$work/waldump-hb-$hb.txt" | awk 'NR > 2 {gsub(/\([ 0-9.]*\)/, "")} NR > 2 && $2 > 0 && $1 != "Total" {print $1, $2, $5}')
    # Records a heartbeat does not explain (anything but logical messages, running-transactions
    # records and checkpoints), or sessions outside this database: something else used the
    # shared cluster during the window, which is then measured again.
    other=$(echo "$records" | awk '$1 !~ /^(LogicalMessage\/MESSAGE|Standby\/RUNNING_XACTS|XLOG\/CHECKPOINT_ONLINE)$/ && NF {b += $3; t = t " " $1} END {print b + 0 t}')
    [ "$other" = 0 ] && [ "$f0" = 0 ] && [ "$f1" = 0 ] && break
    say "heartbeat_interval=$hb, try $try: the cluster was not idle ($f0 and $f1 sessions elsewhere at the start and the end; other WAL records, bytes and types: $other); measuring again"
    [ "$try" -lt "$tries" ] || { echo "the cluster was never idle for ${window}s; run again when nothing else uses it" >&2; exit 1; }
  done
  beats=$({ "$pg_bin/pg_waldump" -p "$bench_dir/pgdata/pg_wal" -s "$l0" -e "$l1" -r LogicalMessage 2>/dev/null || true; } | grep -c 'skippr.heartbeat' || true)
  secs=$(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%.1f", b - a}')
  cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN{printf "%.3f", (b - a) / hz}')
  srv=$(server_delta "$work/srv0" "$work/srv1")
  echo "$hb $secs $wal $beats $cpu $srv" >>"$work/heartbeat.txt"
  say "heartbeat_interval=$hb window_s=$secs wal_bytes=$wal heartbeats=$beats skipprd_cpu_s=$cpu server_cpu_s=$srv (the CHECKPOINT before: $ck bytes)"
  echo "$records" | awk 'NF {print "    " $1 " n=" $2 " bytes=" $3}' | tee -a "$results"
done
read -r _ w0s w0 n0 c0cpu s0cpu < <(awk '$1 == "0"' "$work/heartbeat.txt")
read -r _ w1ms w1m n1m c1mcpu s1mcpu < <(awk '$1 == "1m"' "$work/heartbeat.txt")
read -r _ w1ss w1s n1s c1scpu s1scpu < <(awk '$1 == "1s"' "$work/heartbeat.txt")
awk -v w0="$w0" -v w1s="$w1s" -v n0="$n0" -v n1s="$n1s" -v c0="$c0cpu" -v c1s="$c1scpu" -v s0="$s0cpu" -v s1s="$s1scpu" \
    -v t0="$w0s" -v t1s="$w1ss" 'BEGIN {
  n = n1s - n0; if (n <= 0) { print "per heartbeat: no more heartbeats at 1s than at 0"; exit }
  # CPU per second of window, so windows of slightly different lengths compare.
  printf "per heartbeat (1s against 0): wal_bytes=%.1f skipprd_cpu_ms=%.3f server_cpu_ms=%.3f\n",
    (w1s - w0) / n, (c1s / t1s - c0 / t0) * t1s / n * 1000, (s1s / t1s - s0 / t0) * t1s / n * 1000 }' | tee -a "$results"
awk -v w="$w1m" -v n="$n1m" -v t="$w1ms" -v c="$c1mcpu" -v s="$s1mcpu" -v w0="$w0" -v t0="$w0s" -v c0="$c0cpu" -v s0="$s0cpu" 'BEGIN {
  printf "per hour at 1m (the 1m window scaled): wal_kib=%.1f heartbeats=%.0f skipprd_cpu_s=%.2f server_cpu_s=%.2f; with heartbeat_interval 0: wal_kib=%.1f skipprd_cpu_s=%.2f server_cpu_s=%.2f\n",
    w * 3600 / t / 1024, n * 3600 / t, c * 3600 / t, s * 3600 / t, w0 * 3600 / t0 / 1024, c0 * 3600 / t0, s0 * 3600 / t0 }' | tee -a "$results"
say "timed checkpoints: one each ${ckpt_timeout}s while anything writes (the last CHECKPOINT wrote $ck bytes)"

# ------------------------------------------------------------------------------------------
# Part 2: slot lag under writes to the unpublished table, skipprd and pg_recvlogical side by side.
# ------------------------------------------------------------------------------------------
config ""
q "SELECT pg_create_logical_replication_slot('$recv_slot', 'pgoutput')" >/dev/null
start_daemon "$work/sync-lag.log"
"$pg_bin/pg_recvlogical" -d "$db" -h 127.0.0.1 -p "$bench_port" -U postgres --slot "$recv_slot" --start \
  -o proto_version=1 -o "publication_names=$pub" --fsync-interval=1 -s 1 -f /dev/null >"$work/recvlogical.log" 2>&1 &
recv=$!
wait_active "$recv_slot" "$recv"

sample_sql="SELECT extract(epoch FROM clock_timestamp()), s.slot_name, (pg_current_wal_lsn() - s.restart_lsn)::bigint,
  (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, s.active, s.wal_status, coalesce(extract(epoch FROM r.flush_lag), 0)
  FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
  WHERE s.slot_name IN ('$slot', '$recv_slot')"
max_retained() { q "SELECT coalesce(max((pg_current_wal_lsn() - restart_lsn)::bigint), 0) FROM pg_replication_slots WHERE slot_name IN ('$slot', '$recv_slot')"; }
settle_under() { # SECONDS: until both slots retain under 16 MiB; prints the seconds waited
  local i
  for i in $(seq 0 "$1"); do
    [ "$(max_retained)" -lt $((16 * mib)) ] && { echo "$i"; return 0; }
    sleep 1
  done
  echo ">$1"
}
# pct P FILE: the P-th percentile (nearest rank) of the numbers in FILE.
pct() { sort -g "$2" | awk -v p="$1" '{a[NR] = $1} END {if (NR == 0) {print "nan"; exit} i = int(p / 100 * NR + 0.999999); if (i < 1) i = 1; print a[i]}'; }

say "part 2: writer into the unpublished table, ${write_s}s per rate, pg_replication_slots sampled every second"
say "| writer | client | retained p50 / p99 / max (MiB) | unacknowledged p50 / p99 / max (MiB) | flush_lag p50 / max (s) | under 16 MiB after the writer (s) |"
for mode in paced unpaced; do
  if [ "$mode" = paced ]; then rate=$((rate_mb * mib)); else rate=0; fi
  waited=$(settle_under 120)
  samples="$work/samples-$mode.txt"
  printf '%s\n\\watch 1\n' "$sample_sql" | psql -qAtX -d "$db" >"$samples" 2>"$work/sampler.err" &
  sampler=$!
  sleep 2
  fa=$(foreign_sessions)
  ws=$(date +%s.%N)
  out=$(psql -qAtX -d "$db" -c "
DO \$\$
DECLARE
  t0 timestamptz := clock_timestamp();
  l0 pg_lsn := pg_current_wal_insert_lsn();
  written bigint := 0; truncated_at bigint := 0; due float8;
BEGIN
  LOOP
    EXIT WHEN extract(epoch FROM clock_timestamp() - t0) >= $write_s OR written >= $max_gb::bigint * 1073741824;
    IF $rate > 0 THEN
      due := $rate * extract(epoch FROM clock_timestamp() - t0);
      IF written >= due THEN
        PERFORM pg_sleep(least(0.05, (written - due) / $rate + 0.001));
        CONTINUE;
      END IF;
    END IF;
    INSERT INTO noise (v) SELECT lpad('', 1900, md5(g::text || clock_timestamp()::text)) FROM generate_series(1, 500) g;
    COMMIT;
    written := (pg_current_wal_insert_lsn() - l0)::bigint;
    IF written - truncated_at > 128 * 1048576 THEN
      TRUNCATE noise;
      COMMIT;
      truncated_at := written;
    END IF;
  END LOOP;
  RAISE NOTICE 'wrote % %', written, extract(epoch FROM clock_timestamp() - t0);
END \$\$;" 2>&1)
  we=$(date +%s.%N)
  fb=$(foreign_sessions)
  read -r wrote wsecs < <(echo "$out" | sed -n 's/.*wrote \([0-9]*\) \([0-9.]*\).*/\1 \2/p')
  [ -n "${wrote:-}" ] || { echo "the writer failed: $out" >&2; exit 1; }
  after=$(settle_under "$after_max")
  sleep 2
  stop_pid "$sampler"; sampler=""
  kill -0 "$daemon" && kill -0 "$recv" || { echo "a client exited during the workload; logs in $work" >&2; exit 1; }
  wrate=$(awk -v b="$wrote" -v s="$wsecs" -v m="$mib" 'BEGIN{printf "%.1f", b / s / m}')
  label="$mode ($wrate MiB/s, $((wrote / mib)) MiB in ${wsecs%.*} s)"
  [ "$fa" = 0 ] && [ "$fb" = 0 ] || say "warning: $fa and $fb sessions outside $db at the writer's start and end: another workload shared the cluster"
  for who in "$slot" "$recv_slot"; do
    awk -F'|' -v s="$who" -v a="$ws" -v b="$we" '$2 == s && $1 >= a && $1 <= b' "$samples" >"$work/during.txt"
    cut -d'|' -f3 "$work/during.txt" >"$work/col.txt"; r50=$(pct 50 "$work/col.txt"); r99=$(pct 99 "$work/col.txt"); rmax=$(pct 100 "$work/col.txt")
    cut -d'|' -f4 "$work/during.txt" >"$work/col.txt"; u50=$(pct 50 "$work/col.txt"); u99=$(pct 99 "$work/col.txt"); umax=$(pct 100 "$work/col.txt")
    cut -d'|' -f7 "$work/during.txt" >"$work/col.txt"; f50=$(pct 50 "$work/col.txt"); fmax=$(pct 100 "$work/col.txt")
    n=$(wc -l <"$work/during.txt")
    # The first sample after the writer's end with under 16 MiB retained.
    fall=$(awk -F'|' -v s="$who" -v b="$we" -v lim=$((16 * mib)) '$2 == s && $1 > b && $3 < lim {printf "%.0f", $1 - b; found = 1; exit} END {if (!found) print "never"}' "$samples")
    statuses=$(awk -F'|' -v s="$who" '$2 == s {print $6}' "$samples" | sort -u | tr '\n' ' ')
    m() { awk -v v="$1" -v m="$mib" 'BEGIN{printf "%.1f", v / m}'; }
    if [ "$who" = "$slot" ]; then client=skipprd; else client=pg_recvlogical; fi
    say "| $label | $client | $(m "$r50") / $(m "$r99") / $(m "$rmax") | $(m "$u50") / $(m "$u99") / $(m "$umax") | $(printf %.2f "$f50") / $(printf %.2f "$fmax") | $fall |"
    echo "  $mode $client: samples=$n wal_status=[$statuses] settled_before_s=$waited settle_after_s=$after" >>"$results"
  done
  psql -qX -d "$db" -c "TRUNCATE noise" -c CHECKPOINT   # between the rates (outside the measurement), so pg_wal is recycled
done
"$bin" --config "$work/skippr.yml" status --format json >"$work/status.json" 2>"$work/status.err" || true
# The pipeline's own fields (its tables' come after "tables").
say "skipprd status --format json at the end: $(tr -d '\n ' <"$work/status.json" | sed 's/"tables".*//' | grep -o '"\(retained_wal_bytes\|wal_status\|safe_wal_size\|lag_bytes\|lag_seconds\|warnings\)":[^,}]*' | tr '\n' ' ')"
stop_pid "$daemon"; daemon=""; stop_pid "$recv"; recv=""
echo "samples, WAL breakdowns and logs in $work" >&2
