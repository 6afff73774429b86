# Shared by the benchmarks: a private Postgres cluster with logical WAL, and timing helpers.
# Source it; it defines start_cluster, timed, median, skipprd_bin, build_release,
# stop_leftover_serve and run_driver.

bench_dir="${SKIPPR_BENCH_DIR:-/tmp/skippr-bench}"
bench_port="${SKIPPR_BENCH_PORT:-55439}"
pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"

start_cluster() {
  export PGHOST="$bench_dir/socket" PGPORT="$bench_port" PGUSER=postgres
  if [ ! -f "$bench_dir/pgdata/PG_VERSION" ]; then
    mkdir -p "$bench_dir/pgdata" "$PGHOST"
    chown -R postgres:postgres "$bench_dir"
    runuser -u postgres -- "$pg_bin/initdb" -D "$bench_dir/pgdata" -U postgres --auth=trust >/dev/null
    cat >>"$bench_dir/pgdata/postgresql.conf" <<CONF
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
listen_addresses = '127.0.0.1'
port = $bench_port
unix_socket_directories = '$PGHOST'
shared_buffers = 1GB
max_wal_size = 8GB
synchronous_commit = off
CONF
  fi
  # 100 benchmark clients next to the writers and skipprd's own connections (initdb writes
  # its own max_connections line; the last one in the file wins, and it needs a restart).
  if ! grep -q '^max_connections = 250' "$bench_dir/pgdata/postgresql.conf"; then
    echo "max_connections = 250" >>"$bench_dir/pgdata/postgresql.conf"
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$bench_dir/pgdata" status >/dev/null 2>&1 \
      && runuser -u postgres -- "$pg_bin/pg_ctl" -D "$bench_dir/pgdata" -l "$bench_dir/postgres.log" -w restart >/dev/null
  fi
  touch "$bench_dir/postgres.log"; chown postgres:postgres "$bench_dir/postgres.log" "$PGHOST"
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$bench_dir/pgdata" status >/dev/null 2>&1 \
    || runuser -u postgres -- "$pg_bin/pg_ctl" -D "$bench_dir/pgdata" -l "$bench_dir/postgres.log" -w start >/dev/null
}

# timed OUTFILE CMD...: runs CMD, appends "<seconds> <peak RSS KiB>" to OUTFILE.
timed() {
  local out="$1"; shift
  /usr/bin/time -f "%e %M" -o "$out.one" "$@"
  cat "$out.one" >>"$out"
}

# median COLUMN FILE
median() {
  awk -v c="$1" '{print $c}' "$2" | sort -g | awk '{a[NR]=$1} END {print (NR%2==1) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}

skipprd_bin() {
  echo "${SKIPPRD_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/skippr/target-release}/release/skipprd}"
}

build_release() {
  # SKIPPRD_BIN names a binary to measure instead of building one.
  [ -n "${SKIPPRD_BIN:-}" ] && return 0
  (cd "$(dirname "$0")/.." && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/skippr/target-release}" cargo build --release --quiet --bin skipprd)
}

# stop_leftover_serve WORK BIN: the Python drivers stop their `serve` processes themselves; this
# catches what they could not (killed, or timed out): the pid recorded in WORK/serve.pid, if
# that process is still BIN running `serve`.
stop_leftover_serve() {
  local work="$1" bin="$2" pid
  pid="$(cat "$work/serve.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  case "$(tr '\0' ' ' <"/proc/$pid/cmdline")" in
  "$bin "*" serve "*)
    echo "stopping the leftover skipprd serve (pid $pid)" >&2
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true ;;
  esac
}

# run_driver NAME DRIVER LIMIT MODULES: what the Python-driven benchmarks share. A Python with
# MODULES (SKIPPR_PYTHON, default the venv tests/run sets up), the binary (built, or
# SKIPPRD_BIN), the cluster, a fresh work folder $bench_dir/NAME, then DRIVER (a file beside
# this one) bounded by BENCH_TIMEOUT (default LIMIT seconds), with a `serve` it left running
# stopped on the way out. Exits with the driver's exit code.
run_driver() {
  local name="$1" driver="$2" limit="$3" modules="$4" rc=0 python
  python="${SKIPPR_PYTHON:-$HOME/.cache/skippr/venv/bin/python}"
  "$python" -c "import $modules" || { echo "$python lacks one of: $modules (tests/run sets up that venv)" >&2; exit 1; }
  build_release
  bench_bin="$(skipprd_bin)"
  [ -x "$bench_bin" ] || { echo "no skipprd binary at $bench_bin" >&2; exit 1; }
  start_cluster
  bench_work="$bench_dir/$name"
  trap 'stop_leftover_serve "$bench_work" "$bench_bin"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  rm -rf "$bench_work"; mkdir -p "$bench_work"
  SKIPPRD="$bench_bin" BENCH_WORK="$bench_work" BENCH_PG_PORT="$bench_port" PG_BIN="$pg_bin" \
    PG_DATA="$bench_dir/pgdata" PG_LOG="$bench_dir/postgres.log" \
    timeout --foreground -k 60 "${BENCH_TIMEOUT:-$limit}" "$python" "$(dirname "${BASH_SOURCE[0]}")/$driver" || rc=$?
  [ "$rc" -ne 124 ] || echo "$name benchmark: stopped after ${BENCH_TIMEOUT:-$limit}s (BENCH_TIMEOUT); logs in $bench_work" >&2
  exit "$rc"
}
