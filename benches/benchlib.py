"""Helpers shared by the benchmark drivers (serve_bench.py, fence_bench.py, soak_bench.py,
s3_bench.py, maintenance_bench.py): free ports, percentiles, connections to the benchmark's
Postgres, and for the drivers that run `skipprd serve` over the `orders`/`customers`/`events`
source (serve_bench.py, fence_bench.py): that source, its paced write load, the `serve`
process, gateway connections, freshness probes, timed and checked queries, and the lines of
the report that say what was measured."""

from __future__ import annotations

import datetime as dt
import glob
import os
import random
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import psycopg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def pg_connect(port: int, dbname: str) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=dbname, autocommit=True)


# --------------------------------------------------------------------------------------------
# Waiting, timing, checking
# --------------------------------------------------------------------------------------------


class BenchError(Exception):
    """Something went wrong (not merely slow): the driver reports it and exits 1."""


def wait_for(what: str, timeout: float, check: Callable[[], Any], interval: float = 0.25,
             alive: Callable[[], None] | None = None) -> Any:
    """Polls `check` until it returns something truthy; `alive` raises if a process died."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if alive:
            alive()
        try:
            result = check()
            if result:
                return result
            last = result
        except (psycopg.Error, OSError) as e:
            last = e
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def tail(path: Path, n: int = 60) -> str:
    """The last `n` lines of a log, for an error message."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"--- last {min(n, len(lines))} lines of {path} ---\n" + "\n".join(lines[-n:])


def timed_runs(run: Callable[[], Any], runs: int) -> tuple[float, list[float], Any]:
    """One warm-up, then `runs` timed runs: (median seconds, all seconds, the last answer)."""
    answer = run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        answer = run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, answer


def fetch(conn: psycopg.Connection, sql: str, timeout: float,
          prepare: bool | None = None) -> Callable[[], list[tuple]]:
    """A function that runs `sql` on `conn` (`prepare` as psycopg's execute takes it),
    cancelled after `timeout` seconds."""
    def run() -> list[tuple]:
        timer = threading.Timer(timeout, conn.cancel)
        timer.start()
        try:
            return conn.execute(sql, prepare=prepare).fetchall()
        except psycopg.errors.QueryCanceled:
            raise BenchError(f"cancelled after {timeout:.0f}s: {sql}") from None
        finally:
            timer.cancel()
    return run


def same_answer(expected: list[tuple], actual: list[tuple]) -> bool:
    """Counts and sums must be equal; averages equal to 1e-9 relative."""
    def num(v: Any) -> Any:
        try:
            return Decimal(str(v)) if not isinstance(v, bool) else v
        except ArithmeticError:  # decimal.InvalidOperation: not a number, e.g. a region
            return v

    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual):
        if len(e) != len(a):
            return False
        for ev, av in zip(map(num, e), map(num, a)):
            if isinstance(ev, Decimal) and isinstance(av, Decimal):
                if ev != av and abs(ev - av) > abs(ev) * Decimal("1e-9"):
                    return False
            elif ev != av:
                return False
    return True


def check_same(problems: list[str], label: str, expected: list[tuple], actual: list[tuple],
               log: Callable[[str], None] | None = None) -> None:
    """Appends a problem when `actual` is not Postgres's `expected` answer (see same_answer)."""
    if same_answer(expected, actual):
        return
    problems.append(f"{label}: answer differs from Postgres: expected {expected[:10]}, got {actual[:10]}")
    if log:
        log(f"MISMATCH {label}: expected {expected[:10]}, got {actual[:10]}")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# --------------------------------------------------------------------------------------------
# The report's account of what was measured
# --------------------------------------------------------------------------------------------


def command_line(params: dict[str, str], script: str) -> str:
    """The command that reproduces the run: SKIPPRD_BIN when set, every parameter."""
    prefix = " ".join(f"{k}={v}" for k, v in params.items())
    binary = f"SKIPPRD_BIN={os.environ['SKIPPRD_BIN']} " if os.environ.get("SKIPPRD_BIN") else ""
    return f"{binary}{prefix} {script}"


def source_version(repo: Path) -> str:
    """The commit of the source tree, and whether src/ has uncommitted changes."""
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "src", "Cargo.toml", "Cargo.lock"],
                               capture_output=True, text=True).stdout.strip()
        return f"`{sha}`" + (" plus uncommitted changes in src/" if dirty else "")
    except OSError:
        return "unknown"


def binary_kind(binary: str) -> str:
    return "debug" if "/debug/" in binary else "release"


def binary_time(binary: str) -> str:
    """When the binary was built (its mtime), UTC."""
    return f"{dt.datetime.fromtimestamp(os.stat(binary).st_mtime, dt.timezone.utc):%Y-%m-%d %H:%M} UTC"


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem_gib:.0f} GiB"


# --------------------------------------------------------------------------------------------
# `skipprd serve` over the bench source: configuration, connections, status
# --------------------------------------------------------------------------------------------


@dataclass
class ServeEnv:
    """One benchmark's `serve` set-up: the binary, its work folder (skippr.yml, logs,
    warehouse), the source database on the bench cluster (PGHOST/PGPORT/PGUSER from
    common.sh; `pg_port` for skippr.yml), the workspace, the source tables of its one pipeline
    `app`, how gateway clients prepare (PREPARE: "auto" = psycopg's default, "never"), and
    where to log."""

    bin: str
    work: Path
    pg_port: int
    db: str
    ws: str
    tables: list[str]
    prepare: str
    log: Callable[[str], None]
    gw_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)

    def pg(self, dbname: str | None = None) -> psycopg.Connection:
        """The bench cluster, autocommit."""
        return psycopg.connect(dbname=dbname or self.db, autocommit=True)

    def gateway(self, timeout: float = 10) -> psycopg.Connection:
        """A gateway connection: no users configured, so any user and database on loopback."""
        conn = psycopg.connect(host="127.0.0.1", port=self.gw_port, user="bench", dbname=self.ws,
                               autocommit=True, connect_timeout=max(1, int(timeout)), sslmode="disable")
        if self.prepare == "never":
            conn.prepare_threshold = None
        return conn

    def tables_status(self, conn: psycopg.Connection) -> dict[str, dict]:
        """skippr.tables of the workspace, by table name."""
        cur = conn.execute("SELECT * FROM skippr.tables", prepare=False)  # a status poll: never prepared
        names = [d.name for d in cur.description]
        return {r["table_name"]: r for r in (dict(zip(names, row)) for row in cur.fetchall())
                if r["table_schema"] == self.ws}

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus series over the labels not given (0 if it does not exist yet)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            body = resp.read().decode()
        total = 0.0
        for line in body.splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)", line)
            if not m or m[1] != name:
                continue
            have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m[3])
        return total

    @property
    def config(self) -> Path:
        return self.work / "skippr.yml"

    def write_config(self, commit_interval: str) -> Path:
        self.config.write_text(f"""skippr:
  workspace: {self.ws}
  query:
    listen: 127.0.0.1:{self.gw_port}
  metrics:
    listen: 127.0.0.1:{self.metrics_port}
pipelines:
  app:
    data_source: data_sources.db
    data_sink: data_sinks.lake
    commit_interval: {commit_interval}
data_sources:
  db: {{Postgres: {{host: 127.0.0.1, port: {self.pg_port}, user: postgres, database: {self.db}, tables: [{', '.join(self.tables)}]}}}}
data_sinks:
  lake: {{LocalIceberg: {{warehouse: ./warehouse}}}}
""")
        return self.config

    def metadata_location(self, table: str) -> str:
        """The current metadata JSON of a table of the workspace, from the warehouse's catalog."""
        with sqlite3.connect(self.work / "warehouse" / "catalog.db") as conn:
            row = conn.execute("SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? "
                               "AND table_name = ?", (self.ws, table)).fetchone()
        if not row:
            raise BenchError(f"{self.ws}.{table} is not in {self.work}/warehouse/catalog.db")
        return row[0].removeprefix("file://")

    @staticmethod
    def duckdb(extensions: tuple[str, ...] = ("parquet", "avro", "iceberg")):
        """An in-memory DuckDB with the extensions of the duckdb-extension-* wheels loaded."""
        import duckdb

        con = duckdb.connect(config={"autoinstall_known_extensions": "false",
                                     "autoload_known_extensions": "false", "allow_unsigned_extensions": "true"})
        for name in extensions:
            found = [f for sp in sys.path if sp.endswith("site-packages")
                     for f in glob.glob(f"{sp}/duckdb_extension_{name}/**/{name}.duckdb_extension", recursive=True)]
            if not found:
                raise BenchError(f"the duckdb-extension-{name} wheel is not installed in {sys.prefix}")
            con.execute(f"LOAD '{found[0]}'")
        con.execute("SET TimeZone = 'UTC'")
        return con

    def sync_once(self, timeout: float) -> tuple[float, int]:
        """`sync --pipeline app --once` under /usr/bin/time: (seconds, peak RSS KiB)."""
        logf, timef = self.work / "sync-once.log", self.work / "sync-once.time"
        with open(logf, "w") as out:
            try:
                r = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(timef), self.bin, "--config",
                                    str(self.config), "sync", "--pipeline", "app", "--once"],
                                   cwd=self.work, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   timeout=timeout)
            except subprocess.TimeoutExpired:
                raise BenchError(f"`sync --once` did not finish within {timeout:.0f}s\n{tail(logf)}")
        if r.returncode != 0:
            raise BenchError(f"`sync --once` exited with {r.returncode}\n{tail(logf)}")
        seconds, kib = timef.read_text().split()[-2:]
        return float(seconds), int(kib)


def vm_hwm_kib(pid: int) -> int:
    """The peak resident memory of a running process (VmHWM of /proc/PID/status, KiB); 0 when
    it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Serve:
    """One `skipprd serve` process: stdout and stderr in WORK/serve-<label>.log, its pid in
    WORK/serve.pid (the shell wrapper kills it on exit if the driver could not)."""

    running: list["Serve"] = []

    def __init__(self, env: ServeEnv, label: str, commit_interval: str) -> None:
        self.env = env
        self.label = label
        self.commit_interval = commit_interval
        self.logfile = env.work / f"serve-{label}.log"
        self.returncode: int | None = None
        self.peak_rss_kib = 0
        env.write_config(commit_interval)
        out = open(self.logfile, "w")
        self.proc = subprocess.Popen([env.bin, "--config", str(env.config), "serve"], cwd=env.work,
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        (env.work / "serve.pid").write_text(f"{self.proc.pid}\n")
        Serve.running.append(self)
        env.log(f"serve[{label}] started, pid {self.proc.pid}, commit_interval {commit_interval}, log {self.logfile}")

    def _reap(self, block: bool) -> bool:
        """Reaps the process with wait4, keeping its exit code and peak RSS (ru_maxrss, KiB)."""
        if self.returncode is not None:
            return True
        pid, status, usage = os.wait4(self.proc.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # so Popen does not wait for it again
        # ru_maxrss of a child starts at the forking process's RSS (Linux keeps the larger of
        # the two across exec): a driver holding DuckDB's gigabytes would be reported as the
        # child's. VmHWM, read before the process ends (`stop`), is the child's own.
        if not self.peak_rss_kib:
            self.peak_rss_kib = usage.ru_maxrss
        Serve.running.remove(self)
        return True

    def alive(self) -> None:
        """Raises, with the log, if the process has exited."""
        if self._reap(block=False):
            raise BenchError(f"serve[{self.label}] exited with {self.returncode}\n{tail(self.logfile)}")

    def wait_ready(self, timeout: float) -> float:
        t0 = time.monotonic()

        def ready() -> bool:
            with self.env.gateway(timeout=3) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)

        try:
            wait_for(f"serve[{self.label}] to accept connections on 127.0.0.1:{self.env.gw_port}",
                     timeout, ready, alive=self.alive)
        except BenchError as e:
            raise BenchError(f"{e}\n{tail(self.logfile)}") from None
        return time.monotonic() - t0

    def stop(self, timeout: float) -> float:
        """SIGTERM (the tail is committed), waits; returns the seconds it took to exit."""
        if self._reap(block=False):
            raise BenchError(f"serve[{self.label}] had already exited with {self.returncode}\n{tail(self.logfile)}")
        self.peak_rss_kib = vm_hwm_kib(self.proc.pid)
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        while not self._reap(block=False):
            if time.monotonic() - t0 > timeout:
                self.proc.kill()
                self._reap(block=True)
                raise BenchError(f"serve[{self.label}] did not exit within {timeout:.0f}s of "
                                 f"SIGTERM (killed)\n{tail(self.logfile)}")
            time.sleep(0.05)
        took = time.monotonic() - t0
        if self.returncode != 0:
            raise BenchError(f"serve[{self.label}] exited with {self.returncode} after SIGTERM\n{tail(self.logfile)}")
        self.env.log(f"serve[{self.label}] stopped in {took:.2f}s, peak RSS {self.peak_rss_kib // 1024} MiB")
        return took

    @classmethod
    def kill_all(cls) -> None:
        for s in list(cls.running):
            try:
                s.proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 30
                while not s._reap(block=False) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if s.returncode is None:
                    s.proc.kill()
                    s._reap(block=True)
            except (OSError, ChildProcessError):
                pass


# --------------------------------------------------------------------------------------------
# The source: orders, customers, events; a paced write load
# --------------------------------------------------------------------------------------------

#: The aggregate over one table and the join of two that the serve benchmarks time.
AGG_SQL = "SELECT count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM {orders}"
JOIN_SQL = ("SELECT c.region, count(*) AS n, sum(o.amount) AS total FROM {orders} o "
            "JOIN {customers} c ON c.id = o.customer_id GROUP BY c.region ORDER BY c.region")
REGIONS = ["north", "south", "east", "west", "central", "islands", "mountains", "coast"]


def recreate_database(env: ServeEnv) -> None:
    """Drops env.db (and the replication slots of an earlier run in it) and creates it empty."""
    with env.pg("postgres") as conn:
        recreate_database_on(conn, env.db)


def recreate_database_on(conn, db: str) -> None:
    """Through `conn` (to another database): drops `db` and its replication slots, creates it empty."""
    # a slot of an earlier run (maybe still held by a stray process) blocks DROP DATABASE
    for slot, pid in conn.execute("SELECT slot_name, active_pid FROM pg_replication_slots "
                                  "WHERE database = %s", (db,)).fetchall():
        if pid:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.5)
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    conn.execute(f"CREATE DATABASE {db}")


def create_source(env: ServeEnv, rows: int, customers: int) -> None:
    """(Re)creates env.db: `customers` (ids 0..customers-1), `orders` (ids 1..rows, each with a
    customer), an empty `events` (bigserial key) for loads and probes."""
    recreate_database(env)
    regions = "ARRAY[" + ", ".join(f"'{r}'" for r in REGIONS) + "]"
    with env.pg() as conn:
        conn.execute(f"""
CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, region text NOT NULL, since date NOT NULL);
INSERT INTO customers SELECT i, 'customer ' || i, ({regions})[1 + i % {len(REGIONS)}], date '2020-01-01' + i % 1500
FROM generate_series(0, {customers - 1}) i;
CREATE TABLE orders (
  id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL,
  amount numeric(12,2) NOT NULL, ordered_at timestamptz NOT NULL, ref uuid, details jsonb);
INSERT INTO orders
SELECT i, ((i::bigint * 7919) % {customers})::int, (ARRAY['pending','paid','shipped'])[1 + i % 3],
       ((i::bigint * 104729) % 1000000) / 100.0, timestamptz '2024-01-01' + i * interval '1 second',
       md5(i::text)::uuid, jsonb_build_object('items', i % 7, 'note', 'order ' || i)
FROM generate_series(1, {rows}) i;
CREATE TABLE events (
  id bigserial PRIMARY KEY, writer integer NOT NULL, kind text NOT NULL,
  amount numeric(12,2) NOT NULL, at timestamptz NOT NULL DEFAULT now(), payload text);
""")
        conn.execute("VACUUM ANALYZE")


def create_and_copy(env: ServeEnv, rows: int, customers: int, timeout: float) -> tuple[float, int]:
    """create_source, then the snapshot by `sync --once` (commit_interval 1h in skippr.yml):
    (seconds, peak RSS KiB) of the copy."""
    env.log(f"creating {env.db}: {rows:,} orders, {customers:,} customers")
    create_source(env, rows, customers)
    env.write_config("1h")
    env.log("snapshot: sync --once")
    seconds, rss = env.sync_once(timeout)
    env.log(f"snapshot took {seconds:.1f}s, peak RSS {rss // 1024} MiB")
    return seconds, rss


class Load:
    """`writers` connections, each committing `rate / writers` transactions per second, paced
    (a writer that falls more than 1 s behind its schedule does not try to catch up). Every
    statement runs in autocommit, so one statement is one transaction.
    mix "events": 3/4 inserts into events, 1/4 updates of a recent row of the same writer.
    mix "orders": 1/2 updates of a random order (ids 1..rows), 1/2 inserts into events.
    `synchronous_commit` ("on", "off"; None: the cluster's, off in common.sh) is set on each
    writer's session."""

    running: list["Load"] = []

    def __init__(self, env: ServeEnv, rate: float, writers: int, mix: str, rows: int = 0,
                 synchronous_commit: str | None = None) -> None:
        self.env, self.rate, self.writers, self.mix, self.rows = env, rate, writers, mix, rows
        self.synchronous_commit = synchronous_commit
        self.counts = [0] * writers
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(writers)]

    def start(self) -> "Load":
        Load.running.append(self)
        for t in self.threads:
            t.start()
        return self

    def total(self) -> int:
        return sum(self.counts)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=30)
        Load.running.remove(self)
        if self.errors:
            raise BenchError(f"the load had {len(self.errors)} errors, first: {self.errors[:3]}")

    @classmethod
    def stop_all(cls) -> None:
        for load in cls.running:
            load.stopping.set()

    def _run(self, i: int) -> None:
        rng = random.Random(i)
        recent: deque[int] = deque(maxlen=1000)
        interval = self.writers / self.rate
        try:
            with self.env.pg() as conn:
                if self.synchronous_commit:
                    conn.execute(f"SET synchronous_commit = {self.synchronous_commit}")
                next_at = time.monotonic()
                while not self.stopping.is_set():
                    if self.mix == "events" and recent and rng.random() < 0.25:
                        conn.execute("UPDATE events SET amount = amount + 1, kind = 'updated' WHERE id = %s",
                                     (rng.choice(recent),))
                    elif self.mix == "orders" and rng.random() < 0.5:
                        conn.execute("UPDATE orders SET amount = amount + 1, status = 'updated' WHERE id = %s",
                                     (rng.randint(1, self.rows),))
                    else:
                        row = conn.execute(
                            "INSERT INTO events (writer, kind, amount, payload) VALUES (%s, 'load', %s, %s) RETURNING id",
                            (i, Decimal(rng.randint(0, 100000)) / 100, f"payload {rng.getrandbits(64):x}"),
                        ).fetchone()
                        recent.append(row[0])
                    self.counts[i] += 1
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    elif delay < -1:
                        next_at = time.monotonic()
        except Exception as e:  # reported by stop()
            self.errors.append(f"writer {i}: {type(e).__name__}: {e}")


# --------------------------------------------------------------------------------------------
# Freshness probes: a marker row committed in Postgres, then looked for through the gateway
# --------------------------------------------------------------------------------------------

#: The probe's marker row (writer -1) and the gateway's lookup of it.
MARKER_SQL = "INSERT INTO events (writer, kind, amount) VALUES (-1, 'probe', 0) RETURNING id"
LOOKUP_SQL = "SELECT id FROM {ws}.events WHERE id = %s"


class ProbeTimeout(Exception):
    pass


def commit_marker(src: psycopg.Connection) -> tuple[int, float]:
    """Commits a marker row on `src` (autocommit; the caller sets synchronous_commit = on):
    its id, and the perf_counter when the commit returned."""
    row_id = src.execute(MARKER_SQL).fetchone()[0]
    return row_id, time.perf_counter()


def probe_once(env: ServeEnv, src: psycopg.Connection, gw: psycopg.Connection, serve: Serve,
               poll: float, timeout: float) -> float:
    """Commits a marker row and polls the gateway every `poll` seconds until it is visible:
    seconds from the commit returning to the row being seen. ProbeTimeout (with a diagnosis)
    after `timeout` seconds."""
    lookup = LOOKUP_SQL.format(ws=env.ws)
    row_id, committed = commit_marker(src)
    while True:
        if gw.execute(lookup, (row_id,)).fetchone():
            return time.perf_counter() - committed
        if time.perf_counter() - committed > timeout:
            serve.alive()
            if gw.execute(lookup, (row_id,), prepare=False).fetchone():
                raise ProbeTimeout(
                    f"probe row {row_id} was not visible {timeout:.0f}s after its commit through the server-side "
                    "prepared statement psycopg creates after 5 executions (PREPARE=auto), but an unprepared query "
                    "(Parse per execution) sees it: the gateway's prepared statements answer from the data of their "
                    "Parse. PREPARE=never measures with unprepared statements.")
            raise ProbeTimeout(f"probe row {row_id} was not visible through the gateway {timeout:.0f}s after "
                               f"its commit (PREPARE={env.prepare})")
        time.sleep(poll)


def warm_up_probe(env: ServeEnv, src: psycopg.Connection, serve: Serve, poll: float, timeout: float) -> None:
    """One probe on an unprepared connection, not measured: shows the pipeline streams (serve
    accepts clients before it has loaded its key indexes)."""
    with env.gateway() as warm:
        warm.prepare_threshold = None
        try:
            probe_once(env, src, warm, serve, poll, timeout)
        except ProbeTimeout as e:
            raise BenchError(f"the warm-up probe failed: {e}\n{tail(serve.logfile)}") from None


def run_main(name: str, work: Path, problems: list[str], run: Callable[[], Any], report: Callable[[Any], str]) -> int:
    """The main of a driver: `run()` (the phases), then its report printed and kept in
    WORK/results.md. Exit code 1 on a failure (with the tail of the newest `serve` log) or
    when `problems` lists something wrong; loads and `serve` processes are stopped either way."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run()
    except BenchError as e:
        print(f"\n{name} benchmark FAILED: {e}", file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        logs = sorted(work.glob("serve-*.log"), key=lambda f: f.stat().st_mtime)
        print(f"\n{name} benchmark FAILED (unexpected error above)\n{tail(logs[-1]) if logs else ''}", file=sys.stderr)
        return 1
    finally:
        Load.stop_all()
        Serve.kill_all()
    text = report(result)
    (work / "results.md").write_text(text + "\n")
    print(text)
    if problems:
        print(f"\n{name} benchmark: {len(problems)} problem(s), see above", file=sys.stderr)
        return 1
    return 0
