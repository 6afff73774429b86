"""The replication slot follows the server, not just the published tables (issue 41, item 1).

On loopback, with a running `skipprd sync` whose published tables stay idle:

* a writer puts about 1 GiB of WAL at about 8 MiB/s into a table the pipeline does not publish;
  `pg_replication_slots` is sampled every second: the WAL the slot retains
  (`pg_current_wal_lsn() - restart_lsn`) stays under 256 MiB during the write and falls to a
  few MiB within 30 s of the writer stopping (Postgres moves `restart_lsn` only at its
  running-transactions records, every 15 s, so this bound is what a client that acknowledges
  promptly can reach);
* with `heartbeat_interval: 2s` on a server idle in this database too, the pipeline's
  `skippr.heartbeat` logical messages (non-transactional) keep the slot's `confirmed_flush_lsn`
  within seconds of the server; with `heartbeat_interval: 0` no heartbeat is written.
  Messages are counted through a second slot with `test_decoding` in the same database.

These tests take about three minutes, mostly waiting: they are marked `concurrent`, and
`tests/run` runs that group in a second pytest process beside the main run. They use a cluster
of their own (short checkpoints, a small `max_wal_size`, so WAL is recycled as it would be on a
real server) that nothing else writes to.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

import psycopg
import pytest

from conftest import (
    Database,
    PgCluster,
    Skippr,
    fresh_database,
    lsn_to_int,
    start_cluster,
    stop_cluster,
)
from test_cdc import SLOT, bg_log, stop, wait_until_synced

pytestmark = pytest.mark.concurrent

MiB = 1024 * 1024

#: The workload of the issue.
WAL_TO_WRITE = 1024 * MiB
WRITE_RATE = 8 * MiB  # bytes per second
#: What the slot may retain while the writer runs, and how far it must fall after.
RETAINED_LIMIT = 256 * MiB
RETAINED_AFTER = 16 * MiB
SETTLE_S = 30

#: A server that recycles its WAL as a real one does: a checkpoint at least every 30 s and a
#: small max_wal_size, so only what the slot holds stays in pg_wal.
CLUSTER_CONF = {
    "checkpoint_timeout": "30s",
    "max_wal_size": "256MB",
    "min_wal_size": "80MB",
}


@pytest.fixture(scope="module")
def quiet_pg() -> Iterable[PgCluster]:
    cluster = start_cluster(CLUSTER_CONF)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def qdb(quiet_pg: PgCluster) -> Iterable[Database]:
    yield from fresh_database(quiet_pg)


@pytest.fixture
def qskippr(qdb: Database, workdir) -> Skippr:
    return Skippr(db=qdb, workdir=workdir)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

PUBLISHED = """
CREATE TABLE orders (id bigint PRIMARY KEY, amount int, note text);
INSERT INTO orders SELECT i, i, 'order ' || i FROM generate_series(1, 200) i;
"""


@dataclass
class SlotSample:
    at: float              # seconds since the sampling started
    retained: int          # pg_current_wal_lsn() - restart_lsn
    lag: int               # pg_current_wal_lsn() - confirmed_flush_lsn
    active: bool
    wal_status: str | None


def sample_slot(conn: psycopg.Connection, t0: float, slot: str = SLOT) -> SlotSample:
    row = conn.execute(
        "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint, "
        "(pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, active, wal_status "
        "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None, f"replication slot {slot} disappeared"
    return SlotSample(time.monotonic() - t0, int(row[0]), int(row[1]), bool(row[2]), row[3])


def start_streaming(skippr: Skippr, timeout: float = 60.0) -> subprocess.Popen:
    """Starts `skipprd sync --pipeline app` and waits until it holds the slot."""
    proc = skippr.start("sync", "--pipeline", "app")
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"sync exited with {proc.returncode} at start\n{bg_log(skippr)}")
        rows = skippr.db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
        if rows and rows[0][0]:
            return proc
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"sync did not take slot {SLOT} within {timeout}s\n{bg_log(skippr)}")
        time.sleep(0.2)


def finish(skippr: Skippr, proc: subprocess.Popen) -> None:
    """Stops the daemon with SIGTERM: it must still be running, and exit 0 without a panic."""
    try:
        assert proc.poll() is None, f"sync exited with {proc.returncode} during the test\n{bg_log(skippr)}"
        rc = stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = bg_log(skippr)
    assert rc == 0, f"sync exited {rc} after SIGTERM\n{log}"
    assert "panicked" not in log, log


@dataclass
class Writer:
    """Writes `total` bytes of WAL at `rate` bytes/s into the unpublished table `noise`, in
    transactions of about 1 MiB (rows of about 2 KB, stored inline, uncompressed), emptying
    the table now and then so it does not grow to the size of the WAL. Runs in a thread."""

    db: Database
    total: int
    rate: int
    written: int = 0
    seconds: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, name="wal-writer", daemon=True)
        t.start()
        return t

    def _run(self) -> None:
        try:
            with self.db.connect() as conn:
                lsn = lambda: lsn_to_int(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # noqa: E731
                start = lsn()
                t0 = time.monotonic()
                since_truncate = 0
                while self.written < self.total:
                    due = self.rate * (time.monotonic() - t0)
                    if self.written >= due:
                        time.sleep(min(0.05, (self.written - due) / self.rate + 0.001))
                        continue
                    conn.execute(
                        "INSERT INTO noise (v) SELECT lpad('', 1900, md5(g::text || clock_timestamp()::text)) "
                        "FROM generate_series(1, 500) g")
                    now = lsn()
                    since_truncate += now - start - self.written
                    self.written = now - start
                    if since_truncate > 128 * MiB:
                        conn.execute("TRUNCATE noise")
                        since_truncate = 0
                self.seconds = time.monotonic() - t0
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.done.set()


# --------------------------------------------------------------------------------------------
# Retention under a write-heavy workload to unpublished tables
# --------------------------------------------------------------------------------------------


def test_slot_retains_little_wal_while_the_server_writes_elsewhere(qskippr: Skippr, qdb: Database):
    qdb.execute(PUBLISHED)
    qdb.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, v text)")  # not in the pipeline
    qskippr.write_config(["orders"], extra_pipeline={"commit_interval": "1s"})
    qskippr.sync_once()
    proc = start_streaming(qskippr)
    try:
        with qdb.connect() as conn:
            # Before the workload: the slot holds next to nothing.
            t0 = time.monotonic()
            deadline = t0 + SETTLE_S
            while (s := sample_slot(conn, t0)).retained >= RETAINED_AFTER and time.monotonic() < deadline:
                time.sleep(1)
            assert s.retained < RETAINED_AFTER, f"the slot retained {s.retained} bytes before the workload: {s}"

            writer = Writer(qdb, WAL_TO_WRITE, WRITE_RATE)
            thread = writer.start()
            t0 = time.monotonic()
            during: list[SlotSample] = []
            while not writer.done.is_set():
                during.append(sample_slot(conn, t0))
                assert proc.poll() is None, f"sync exited with {proc.returncode} during the workload\n{bg_log(qskippr)}"
                writer.done.wait(1.0)
            thread.join()
            if writer.error is not None:
                raise writer.error
            stopped_at = time.monotonic() - t0

            after: list[SlotSample] = []
            deadline = time.monotonic() + SETTLE_S
            while True:
                after.append(sample_slot(conn, t0))
                if after[-1].retained < RETAINED_AFTER or time.monotonic() > deadline:
                    break
                time.sleep(1)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise

    rate = writer.written / writer.seconds / MiB
    peak = max(during, key=lambda s: s.retained)
    trace = "\n".join(
        f"  t={s.at:6.1f}s retained={s.retained / MiB:8.1f} MiB lag={s.lag / MiB:8.1f} MiB "
        f"active={s.active} wal_status={s.wal_status}"
        for s in (during + after)[:: max(1, len(during + after) // 40)] + after[-1:])
    summary = (f"writer: {writer.written / MiB:.0f} MiB of WAL in {writer.seconds:.0f} s ({rate:.1f} MiB/s), "
               f"stopped at t={stopped_at:.0f}s; peak retained {peak.retained / MiB:.1f} MiB at t={peak.at:.0f}s\n"
               f"{trace}")
    print(summary)  # shown with -rP: the margins of a passing run
    assert len(during) >= 60, f"too few samples while writing: {summary}"
    assert peak.retained < RETAINED_LIMIT, \
        f"the slot retained more than {RETAINED_LIMIT // MiB} MiB while only unpublished tables were written\n{summary}"
    assert after[-1].retained < RETAINED_AFTER, (
        f"retained WAL did not fall under {RETAINED_AFTER // MiB} MiB within {SETTLE_S}s of the writer stopping\n"
        f"{summary}")
    assert all(s.active for s in during + after), f"the daemon let go of the slot\n{summary}"

    # The pipeline still follows its table after all that.
    qdb.execute("INSERT INTO orders VALUES (1001, 1, 'after the workload'); UPDATE orders SET amount = 0 WHERE id < 10")
    wait_until_synced(qskippr, qdb, ["orders"], proc, timeout=60)
    finish(qskippr, proc)


# --------------------------------------------------------------------------------------------
# Heartbeats on an idle server
# --------------------------------------------------------------------------------------------

WATCH_SLOT = "hb_watch"


def create_watch_slot(db: Database) -> None:
    """A second slot (test_decoding) in the same database: it shows every logical message
    written there from now on, whoever reads the pipeline's slot."""
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (WATCH_SLOT,))


def heartbeats(db: Database) -> list[str]:
    rows = db.execute(
        "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL) WHERE data LIKE 'message:%%'",
        (WATCH_SLOT,))
    return [r[0] for r in rows if "prefix: skippr.heartbeat" in r[0]]


def with_long_peer_timeout(skippr: Skippr) -> None:
    """`skippr.reconnect.peer_timeout: 10m`: the liveness probe (a message after half the
    peer timeout of silence) stays out of the window the test watches."""
    text = skippr.config_path.read_text()
    assert text.startswith("skippr:\n"), text
    skippr.write_raw_config(text.replace("skippr:\n", "skippr:\n  reconnect:\n    peer_timeout: 10m\n", 1))


def current_lsn(db: Database) -> int:
    return lsn_to_int(db.scalar("SELECT pg_current_wal_lsn()::text"))


def confirmed_lsn(db: Database) -> int:
    return lsn_to_int(db.scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)))


def test_heartbeat_moves_the_slot_of_an_idle_server(qskippr: Skippr, qdb: Database):
    qdb.execute(PUBLISHED)
    qskippr.write_config(["orders"], extra_source={"heartbeat_interval": "2s"})
    with_long_peer_timeout(qskippr)
    qskippr.sync_once()
    create_watch_slot(qdb)
    proc = start_streaming(qskippr)
    try:
        # From here on nothing writes to this database but the pipeline's heartbeats.
        start = current_lsn(qdb)
        time.sleep(6)
        middle = current_lsn(qdb)
        assert middle > start, "the server wrote no WAL in 6 s: no heartbeat was written"
        deadline = time.monotonic() + 8
        while (confirmed := confirmed_lsn(qdb)) < middle and time.monotonic() < deadline:
            time.sleep(0.5)
        # Count over a full 12 s from the stream's start, however soon the slot moved.
        time.sleep(max(0.0, deadline - time.monotonic() - 2))
        beats = heartbeats(qdb)
        assert proc.poll() is None, f"sync exited with {proc.returncode}\n{bg_log(qskippr)}"
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finish(qskippr, proc)
    # every 2 s for about 12 s: 6 expected; 3 leaves room for a slow start
    assert len(beats) >= 3, f"{len(beats)} skippr.heartbeat messages in ~12 s with heartbeat_interval 2s: {beats}"
    assert all("transactional: 0" in b for b in beats), f"heartbeats must be non-transactional: {beats}"
    assert confirmed >= middle, (
        f"confirmed_flush_lsn {confirmed:X} did not reach {middle:X} (where the idle server was 8 s earlier; "
        f"it started at {start:X}): the heartbeats did not move the slot")


def test_heartbeat_interval_zero_writes_no_heartbeat(qskippr: Skippr, qdb: Database):
    qdb.execute(PUBLISHED)
    qskippr.write_config(["orders"], extra_source={"heartbeat_interval": "0"},
                         extra_pipeline={"commit_interval": "1s"})
    with_long_peer_timeout(qskippr)
    qskippr.sync_once()
    create_watch_slot(qdb)
    proc = start_streaming(qskippr)
    try:
        time.sleep(8)
        assert proc.poll() is None, f"sync exited with {proc.returncode} with heartbeat_interval 0\n{bg_log(qskippr)}"
        # the pipeline still streams its table
        qdb.execute("UPDATE orders SET amount = -1 WHERE id = 1")
        wait_until_synced(qskippr, qdb, ["orders"], proc, timeout=60)
        beats = heartbeats(qdb)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finish(qskippr, proc)
    assert beats == [], f"heartbeat_interval 0 still wrote {len(beats)} skippr.heartbeat messages: {beats[:5]}"
