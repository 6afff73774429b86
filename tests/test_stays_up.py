"""Stays up: `skipprd serve` rides out the faults that happen every week, against a real
Postgres of its own (the tests restart and crash it): Postgres restarts (fast and immediate)
under a writer, SIGKILLs of serve at random moments, a full disk under the storage path,
and a network cut of the replication connection. Every test ends with the Iceberg tables
equal to Postgres, read by PyIceberg and DuckDB, and by the gateway.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import psycopg
import pytest

from conftest import (
    Database,
    PgCluster,
    Skippr,
    _as_postgres,
    _drop_database,
    assert_no_panic,
    free_port,
    lsn_to_int,
    start_cluster,
    stop_cluster,
)

TABLE = "events"


# --------------------------------------------------------------------------------------------
# A Postgres of the module's own: these tests restart and crash it.
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_pg() -> Iterable[PgCluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def sdb(own_pg: PgCluster) -> Iterable[Database]:
    name = "t_" + secrets.token_hex(6)
    own_pg.execute(f'CREATE DATABASE "{name}"')
    try:
        yield Database(own_pg, name)
    finally:
        _drop_database(own_pg, name)


@pytest.fixture
def sk(sdb: Database, workdir: Path) -> Skippr:
    return Skippr(db=sdb, workdir=workdir)


def pg_ctl(cluster: PgCluster, *args: str) -> None:
    r = _as_postgres([str(cluster.bindir / "pg_ctl"), "-D", str(cluster.datadir), "-l", str(cluster.logfile),
                      "-w", "-t", "60", *args])
    assert r.returncode == 0, f"pg_ctl {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}\n{cluster.log_tail()}"


# --------------------------------------------------------------------------------------------
# Configuration and the running daemon
# --------------------------------------------------------------------------------------------


class Serve:
    """A running `skipprd serve` with its gateway and metrics ports."""

    def __init__(self, sk: Skippr, *, port: int | None = None, storage: Path | None = None,
                 peer_timeout: str = "10s") -> None:
        self.sk = sk
        self.gw = free_port()
        self.metrics = free_port()
        sk.write_config(
            [TABLE],
            port=port,
            query={"listen": f"127.0.0.1:{self.gw}"},
            metrics_listen=f"127.0.0.1:{self.metrics}",
            extra_pipeline={"commit_interval": "1s"},
        )
        text = sk.config_path.read_text()
        extra = f"  skipprd_el_storage_path: {storage}\n" if storage else ""
        extra += f"  reconnect:\n    max_backoff: 2s\n    peer_timeout: {peer_timeout}\n"
        marker = "  skipprd_el_storage_mode: local\n"
        sk.config_path.write_text(text.replace(marker, marker + extra))
        self.storage = storage or sk.workdir / ".skippr"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = self.sk.start("serve")

    def stderr(self) -> str:
        return (self.sk.workdir / "bg.stderr").read_text(errors="replace")

    def describe(self) -> str:
        return f"--- serve stderr (tail) ---\n{self.stderr()[-6000:]}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.gw, dbname="analytics", user="skippr",
                               autocommit=True, connect_timeout=10)

    def state(self) -> tuple[str | None, str | None]:
        """(pipeline_state, pipeline_error) of the table, read through the gateway."""
        with self.connect() as c:
            row = c.execute(
                "SELECT pipeline_state, pipeline_error FROM skippr.tables WHERE table_name = %s", (TABLE,)
            ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def wait_state(self, want: Callable[[str | None, str | None], bool], what: str, timeout: float = 90) -> tuple:
        deadline = time.monotonic() + timeout
        last: tuple = (None, None)
        while time.monotonic() < deadline:
            assert self.alive(), f"serve exited ({self.proc.returncode}) while waiting for {what}\n{self.describe()}"
            try:
                last = self.state()
                if want(*last):
                    return last
            except psycopg.Error:
                pass
            time.sleep(0.3)
        pytest.fail(f"timed out waiting for {what}; last state {last}\n{self.describe()}")

    def wait_streaming(self, timeout: float = 120) -> None:
        self.wait_state(lambda s, _e: s == "streaming", "the pipeline to stream", timeout)

    def metric(self, name: str) -> float:
        import urllib.request

        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in body.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def wait_equal(self, db: Database, timeout: float = 120) -> None:
        """The live table through the gateway equals Postgres."""
        deadline = time.monotonic() + timeout
        expected = db.execute(f"SELECT id, v, n FROM {TABLE} ORDER BY id")
        got: list = []
        while time.monotonic() < deadline:
            try:
                with self.connect() as c:
                    got = c.execute(f"SELECT id, v, n FROM analytics.{TABLE} ORDER BY id").fetchall()
                if got == expected:
                    return
            except psycopg.Error:
                pass
            time.sleep(0.5)
        pytest.fail(f"the live table never equalled Postgres ({len(got)} rows vs {len(expected)})\n{self.describe()}")

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM; the process must exit by itself within `timeout`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"serve did not exit within {timeout}s of SIGTERM\n{self.describe()}")
        assert "panicked" not in self.stderr(), self.describe()
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def create_table(db: Database, rows: int = 200) -> None:
    db.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL)")
    db.execute(f"INSERT INTO {TABLE} SELECT g, 'row ' || g, 0 FROM generate_series(1, %s) g", (rows,))


class Writer(threading.Thread):
    """Mixed inserts, updates and deletes in small transactions, riding out the restarts."""

    def __init__(self, db: Database, first_id: int = 1_000_000, pause: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.next_id = first_id
        self.pause = pause
        self.halt = threading.Event()
        self.committed = 0
        self.failures = 0
        self.rng = random.Random(7)

    def run(self) -> None:
        conn = None
        while not self.halt.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self.db.connect()
                with conn.transaction():
                    for _ in range(self.rng.randint(1, 5)):
                        op = self.rng.random()
                        if op < 0.6:
                            conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, 0)", (self.next_id, f"w{self.next_id}"))
                            self.next_id += 1
                        elif op < 0.9:
                            conn.execute(f"UPDATE {TABLE} SET n = n + 1, v = v || '+' WHERE id = %s",
                                         (self.rng.randint(1, self.next_id),))
                        else:
                            conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (self.rng.randint(1, self.next_id),))
                self.committed += 1
            except psycopg.Error:
                self.failures += 1
                if conn is not None:
                    try:
                        conn.close()
                    except psycopg.Error:
                        pass
                conn = None
                time.sleep(0.2)
            time.sleep(self.pause)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)


def assert_iceberg_equal(sk: Skippr) -> None:
    sk.assert_table_matches(TABLE, readers=("pyiceberg", "duckdb"))


def wait_postgres(cluster: PgCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cluster.execute("SELECT 1")
            return
        except psycopg.Error:
            time.sleep(0.2)
    pytest.fail("Postgres did not come back")


# --------------------------------------------------------------------------------------------
# Postgres restarts
# --------------------------------------------------------------------------------------------


def test_postgres_restarts_under_load(sk: Skippr, sdb: Database, own_pg: PgCluster) -> None:
    create_table(sdb)
    serve = Serve(sk)
    serve.start()
    writer = Writer(sdb)
    try:
        serve.wait_streaming()
        writer.start()
        client = serve.connect()  # a BI client that stays connected through every restart
        seen_reconnects = 0.0
        for mode in ("fast", "fast", "immediate"):
            time.sleep(2)
            before = writer.committed
            if mode == "immediate":
                pg_ctl(own_pg, "stop", "-m", "immediate")
                # Queries keep working while the source is down: committed data and the WAL.
                for _ in range(3):
                    assert client.execute(f"SELECT count(*) FROM analytics.{TABLE}").fetchone()[0] > 0
                    time.sleep(0.5)
                pg_ctl(own_pg, "start")
            else:
                pg_ctl(own_pg, "restart", "-m", mode)
            wait_postgres(own_pg)
            # serve noticed, retried, and streams again; it never exited.
            deadline = time.monotonic() + 60
            while serve.metric("skippr_reconnects_total") <= seen_reconnects:
                assert time.monotonic() < deadline, f"no reconnect counted after the {mode} restart\n{serve.describe()}"
                assert serve.alive(), serve.describe()
                time.sleep(0.3)
            seen_reconnects = serve.metric("skippr_reconnects_total")
            serve.wait_streaming()
            assert client.execute(f"SELECT count(*) FROM analytics.{TABLE}").fetchone()[0] > 0
            # The writer got through after the restart too.
            deadline = time.monotonic() + 30
            while writer.committed <= before + 5 and time.monotonic() < deadline:
                time.sleep(0.2)
        assert serve.metric("skippr_pipeline_state") >= 1
        writer.stop()
        serve.wait_equal(sdb)
        client.close()
        stderr = serve.stderr()
        retries = [line for line in stderr.splitlines() if "transient fault; retrying" in line]
        assert retries, serve.describe()
        assert len(retries) < 200, f"{len(retries)} retry lines: a retry must be logged once\n{serve.describe()}"
        assert serve.stop() == 0, serve.describe()
    finally:
        writer.stop()
        serve.kill()
    assert writer.committed > 50
    assert_iceberg_equal(sk)


# --------------------------------------------------------------------------------------------
# SIGKILL of serve at random moments
# --------------------------------------------------------------------------------------------


def test_sigkill_loop_under_load(sk: Skippr, sdb: Database) -> None:
    # Large enough that the first kills land in the snapshot.
    create_table(sdb, rows=60_000)
    serve = Serve(sk)
    writer = Writer(sdb, pause=0.005)
    writer.start()
    rng = random.Random(1234)
    kills = 0
    try:
        for i in range(20):
            serve.start()
            # Early kills hit start-up and the snapshot; later ones streaming and commits.
            time.sleep(rng.uniform(0.2, 1.0) if i < 5 else rng.uniform(0.5, 3.0))
            assert serve.alive() or serve.proc.returncode is None, f"serve exited by itself\n{serve.describe()}"
            serve.proc.send_signal(signal.SIGKILL)
            serve.proc.wait(timeout=30)
            kills += 1
        serve.start()
        serve.wait_streaming(timeout=180)
        writer.stop()
        serve.wait_equal(sdb, timeout=180)
        assert serve.stop() == 0, serve.describe()
    finally:
        writer.stop()
        serve.kill()
    assert kills == 20
    assert writer.committed > 100
    assert_iceberg_equal(sk)


# --------------------------------------------------------------------------------------------
# A full disk under the storage path
# --------------------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterable[Path]:
    mnt = tmp_path / "state"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path) -> Path:
    """Fills the file system to the last byte."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (65536, 4096, 512, 1):
            try:
                while os.write(fd, b"\0" * chunk) > 0:
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def committed_lsn(sk: Skippr) -> str:
    """`skippr.lsn` of the table's current Iceberg snapshot."""
    snap = sk.table(TABLE).current_snapshot()
    assert snap is not None
    return snap.summary.additional_properties["skippr.lsn"]


def slot_confirmed(db: Database) -> int:
    lsn = db.scalar("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE database = current_database()"
                    " AND NOT temporary")
    return lsn_to_int(lsn)


def test_full_disk_stops_ingest_and_resumes(sk: Skippr, sdb: Database, small_tmpfs: Path) -> None:
    create_table(sdb)
    serve = Serve(sk, storage=small_tmpfs)
    serve.start()
    try:
        serve.wait_streaming()
        fill(small_tmpfs)
        acked_before = slot_confirmed(sdb)
        sdb.execute(f"INSERT INTO {TABLE} SELECT g, repeat('x', 200) || g, 1 FROM generate_series(1001, 3000) g")
        sdb.execute(f"UPDATE {TABLE} SET n = n + 10 WHERE id <= 100")
        written_to = lsn_to_int(sdb.scalar("SELECT pg_current_wal_lsn()::text"))
        _, error = serve.wait_state(lambda s, _e: s == "storage_full", "the storage_full state", timeout=60)
        assert error and "storage full" in error and "No space left on device" in error, error
        assert serve.alive()
        # Nothing of what could not be written is acknowledged to Postgres.
        time.sleep(3)
        assert slot_confirmed(sdb) < written_to
        assert slot_confirmed(sdb) >= acked_before
        # No partial segment is left behind.
        wal = small_tmpfs / "wal" / "app"
        assert not list(wal.glob("*.tmp")), list(wal.iterdir())
        # The gateway still answers, over what is committed.
        with serve.connect() as c:
            assert c.execute(f"SELECT count(*) FROM analytics.{TABLE}").fetchone()[0] >= 200
        log = serve.stderr()
        assert re.search(r"WARN.*storage full", log), serve.describe()
        # Space comes back: no restart needed.
        r = subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        serve.wait_streaming(timeout=60)
        sdb.execute(f"DELETE FROM {TABLE} WHERE id BETWEEN 1001 AND 1100")
        serve.wait_equal(sdb)
        assert serve.stop() == 0, serve.describe()
    finally:
        serve.kill()
    assert_iceberg_equal(sk)


@pytest.fixture
def full_warehouse(sk: Skippr) -> Iterable[Path]:
    """The warehouse folder is a small tmpfs."""
    mnt = sk.warehouse
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_warehouse_pauses_commits_and_resumes(sk: Skippr, sdb: Database, full_warehouse: Path) -> None:
    create_table(sdb)
    serve = Serve(sk)
    serve.start()
    try:
        serve.wait_streaming()
        fill(full_warehouse)
        sdb.execute(f"INSERT INTO {TABLE} SELECT g, repeat('y', 300) || g, 2 FROM generate_series(1001, 2000) g")
        _, error = serve.wait_state(lambda s, _e: s == "storage_full", "the storage_full state", timeout=60)
        assert error and ("No space left on device" in error or "disk is full" in error), error
        # The changes are durable in the WAL: live queries see them before any commit.
        serve.wait_equal(sdb)
        r = subprocess.run(["mount", "-o", "remount,size=128m", str(full_warehouse)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        serve.wait_streaming(timeout=60)
        sdb.execute(f"UPDATE {TABLE} SET n = 3 WHERE id BETWEEN 1 AND 50")
        serve.wait_equal(sdb)
        assert serve.stop() == 0, serve.describe()
    finally:
        serve.kill()
    assert_iceberg_equal(sk)


# --------------------------------------------------------------------------------------------
# A network cut of the replication connection
# --------------------------------------------------------------------------------------------


class FreezableProxy(threading.Thread):
    """A TCP proxy to Postgres that can be frozen: while frozen it moves no bytes in either
    direction and leaves every connection open, as a cut network (or a dead host) does."""

    def __init__(self, target_port: int) -> None:
        super().__init__(daemon=True)
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.halt = threading.Event()

    def run(self) -> None:
        self.listener.settimeout(0.2)
        while not self.halt.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        while self.frozen.is_set() and not self.halt.is_set():
            time.sleep(0.05)
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        pair = {client: upstream, upstream: client}
        try:
            while not self.halt.is_set():
                if self.frozen.is_set():
                    time.sleep(0.05)
                    continue
                ready, _, _ = select.select(list(pair), [], [], 0.1)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    pair[s].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def stop(self) -> None:
        self.halt.set()
        self.listener.close()


def test_network_cut_is_detected_and_healed(sk: Skippr, sdb: Database, own_pg: PgCluster) -> None:
    create_table(sdb)
    proxy = FreezableProxy(own_pg.port)
    proxy.start()
    serve = Serve(sk, port=proxy.port, peer_timeout="5s")
    serve.start()
    try:
        serve.wait_streaming()
        sdb.execute(f"INSERT INTO {TABLE} VALUES (5001, 'before the cut', 0)")
        serve.wait_equal(sdb)
        # An idle but healthy stream is not taken for a dead one: the heartbeats answer.
        time.sleep(12)
        assert serve.metric("skippr_reconnects_total") == 0, serve.describe()
        assert serve.state()[0] == "streaming"
        proxy.frozen.set()
        cut_at = time.monotonic()
        sdb.execute(f"INSERT INTO {TABLE} VALUES (5002, 'during the cut', 0)")
        # Detected within the peer timeout (5s) plus the time to notice, not never.
        _, error = serve.wait_state(lambda s, _e: s == "reconnecting", "the cut to be detected", timeout=40)
        detected_in = time.monotonic() - cut_at
        assert detected_in < 30, f"took {detected_in:.1f}s to notice the cut"
        assert error and ("sent nothing" in error or "no answer" in error), error
        # The gateway answers through the cut, over what is committed and in the WAL.
        with serve.connect() as c:
            assert c.execute(f"SELECT v FROM analytics.{TABLE} WHERE id = 5001").fetchone()[0] == "before the cut"
        time.sleep(3)
        proxy.frozen.clear()
        serve.wait_streaming(timeout=120)
        sdb.execute(f"UPDATE {TABLE} SET n = 9 WHERE id = 5002")
        serve.wait_equal(sdb)
        assert serve.stop() == 0, serve.describe()
    finally:
        serve.kill()
        proxy.frozen.clear()
        proxy.stop()
    assert_iceberg_equal(sk)


# --------------------------------------------------------------------------------------------
# Fatal faults stop the pipeline, not the gateway
# --------------------------------------------------------------------------------------------


def test_fatal_fault_stops_only_the_pipeline(sk: Skippr, sdb: Database) -> None:
    create_table(sdb)
    serve = Serve(sk)
    serve.start()
    try:
        serve.wait_streaming()
        sdb.execute(f"INSERT INTO {TABLE} VALUES (7001, 'committed', 0)")
        serve.wait_equal(sdb)
        # A person removes the table from the publication: the pipeline cannot go on.
        pub = sdb.scalar("SELECT pubname FROM pg_publication LIMIT 1")
        sdb.execute(f'ALTER PUBLICATION "{pub}" DROP TABLE {TABLE}')
        _, error = serve.wait_state(lambda s, _e: s == "failed", "the pipeline to fail", timeout=60)
        assert error and "publication" in error, error
        # serve itself keeps answering over what was committed and what the WAL holds.
        time.sleep(1)
        assert serve.alive(), serve.describe()
        with serve.connect() as c:
            assert c.execute(f"SELECT v FROM analytics.{TABLE} WHERE id = 7001").fetchone()[0] == "committed"
        assert serve.metric("skippr_pipeline_state") >= 1
        assert re.search(r"ERROR.*pipeline stopped", serve.stderr()), serve.describe()
        # Another process (the CLI) reads the same state from the pipeline's state file.
        status = json.loads((serve.storage / "pipelines" / "app.status.json").read_text())
        assert status["state"] == "failed" and status["pid"] == serve.proc.pid, status
        proc = sk.run("query", "SELECT pipeline_state, pipeline_error FROM skippr.tables", "--format", "json")
        assert '"failed"' in proc.stdout and "publication" in proc.stdout, proc.stdout
        assert serve.stop() == 0, serve.describe()
    finally:
        serve.kill()


# --------------------------------------------------------------------------------------------
# Clean shutdown under load
# --------------------------------------------------------------------------------------------


def test_sigterm_under_load_commits_acknowledges_and_closes_sessions(sk: Skippr, sdb: Database) -> None:
    create_table(sdb)
    serve = Serve(sk)
    serve.start()
    writer = Writer(sdb, pause=0.002)
    try:
        serve.wait_streaming()
        writer.start()
        idle_client = serve.connect()
        assert idle_client.execute("SELECT 1").fetchone()[0] == 1
        time.sleep(4)
        started = time.monotonic()
        code = serve.stop(timeout=75)
        took = time.monotonic() - started
        assert code == 0, serve.describe()
        assert took < 70, f"took {took:.1f}s to stop"
        # The client was told why: 57P01, as Postgres says on a fast shutdown.
        with pytest.raises(psycopg.Error) as err:
            idle_client.execute("SELECT 1")
        assert getattr(err.value, "sqlstate", None) == "57P01" or "administrator command" in str(err.value), \
            repr(err.value)
        # Everything durable was committed (no segment left) and acknowledged.
        wal = serve.storage / "wal" / "app"
        assert not list(wal.glob("*.seg")), sorted(p.name for p in wal.iterdir())
        assert slot_confirmed(sdb) >= lsn_to_int(committed_lsn(sk))
    finally:
        writer.stop()
        serve.kill()
    # Nothing lost: a final catch-up ends equal.
    proc = sk.sync_once()
    assert_no_panic(proc)
    assert_iceberg_equal(sk)


# --------------------------------------------------------------------------------------------
# `sync` retries too, then gives up with its documented exit code
# --------------------------------------------------------------------------------------------


def test_sync_retries_then_gives_up_with_exit_75(sk: Skippr, sdb: Database) -> None:
    create_table(sdb)
    closed_port = free_port()  # nothing listens there: connections are refused
    sk.write_config([TABLE], port=closed_port)
    text = sk.config_path.read_text()
    marker = "  skipprd_el_storage_mode: local\n"
    sk.config_path.write_text(text.replace(
        marker, marker + "  reconnect:\n    max_backoff: 1s\n    give_up_after: 4s\n"))
    started = time.monotonic()
    proc = sk.run("sync", "--pipeline", "app", "--once", check=False, timeout=120)
    took = time.monotonic() - started
    assert_no_panic(proc)
    assert proc.returncode == 75, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    assert "gave up after" in proc.stderr and "give_up_after" in proc.stderr, proc.stderr[-4000:]
    retries = [line for line in proc.stderr.splitlines() if "transient fault; retrying" in line]
    # 4s of tries at 0.25-1s each: several retries, each logged once, with its cause.
    assert 2 <= len(retries) <= 20, proc.stderr[-4000:]
    assert all("WARN" in line and "refused" in line.lower() for line in retries), proc.stderr[-4000:]
    assert 4 <= took < 60, f"took {took:.1f}s"
    # The state file says why it stopped.
    status = json.loads((sk.workdir / ".skippr" / "pipelines" / "app.status.json").read_text())
    assert status["state"] == "failed" and status["reconnects"] == len(retries), status
    assert "gave up" in status["error"], status
