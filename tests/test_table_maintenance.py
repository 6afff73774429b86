"""Table maintenance: `skipprd serve` compacts, expires snapshots and removes orphan files of
the tables it writes, after its commits, while it keeps streaming and answering queries.

Settings are aggressive (commit every 200ms, a check every 500ms, snapshots and orphans older
than 2s go, a compaction once 3 small files or delete files gather), so that a minute of
small transactions sees many compactions and expiries. Every reader must still equal
Postgres (PyIceberg, DuckDB, `skipprd query`, the gateway), a live query running across
compactions never sees a row twice or misses one, the table's file, manifest, snapshot and
metadata counts stay bounded, files referenced by the table never go, and files nobody
references do. Bad `maintenance:` settings are configuration errors naming their key.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import secrets
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

from conftest import Database, Skippr, assert_no_panic, describe_run, free_port
from test_cdc import ALL_READERS, assert_multiset_matches, bg_log, wait_until_synced
from test_config_errors import BASE_LINES, assert_config_error, config_text, run_validate

#: The per-pipeline `maintenance:` block of these tests.
MIN_FILES = 3
MAINTENANCE = {
    "enabled": True,
    "check_interval": "500ms",
    "snapshot_retention": "2s",
    "min_snapshots_to_keep": 2,
    "orphan_file_age": "2s",
    "compaction_min_files": MIN_FILES,
}
COMMIT_INTERVAL = "200ms"
#: `parquet_target_file_size_mb` of the first test: the copied table is several "large"
#: files, so compaction both leaves files untouched (their deletes are carried over into the
#: one merged delete file) and rewrites large files once 20% of their rows are deleted.
TARGET_MB = 1
SMALL_BYTES = TARGET_MB * 1024 * 1024 * 3 // 4


# --------------------------------------------------------------------------------------------
# The running daemon
# --------------------------------------------------------------------------------------------


class Serve:
    """A `skipprd serve` with the maintenance settings above, its gateway and its metrics."""

    def __init__(self, sk: Skippr, tables: list[str], extra_source: dict[str, Any] | None = None) -> None:
        self.sk = sk
        self.gw = free_port()
        self.metrics_port = free_port()
        sk.write_config(
            tables,
            query={"listen": f"127.0.0.1:{self.gw}"},
            metrics_listen=f"127.0.0.1:{self.metrics_port}",
            extra_pipeline={"commit_interval": COMMIT_INTERVAL, "maintenance": MAINTENANCE},
            extra_source=extra_source,
        )
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> None:
        # sk.start truncates bg.stderr: keep the log of the previous run for the report
        log = self.sk.workdir / "bg.stderr"
        if log.exists() and self.runs:
            (self.sk.workdir / f"bg.stderr.run{self.runs}").write_text(log.read_text(errors="replace"))
        self.runs += 1
        self.proc = self.sk.start("serve")

    def describe(self) -> str:
        return bg_log(self.sk)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.gw, dbname="analytics", user="skippr",
                               autocommit=True, connect_timeout=10)

    def tables(self) -> dict[str, dict]:
        """skippr.tables through the gateway, by table name."""
        with self.connect() as c:
            cur = c.execute("SELECT table_name, pipeline_state, pipeline_error, data_files, delete_files, "
                            "snapshots, last_compaction_time FROM skippr.tables")
            names = [d.name for d in cur.description]
            return {r[0]: dict(zip(names, r)) for r in cur.fetchall()}

    def wait_streaming(self, tables: list[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            assert self.alive(), f"serve exited ({self.proc.returncode})\n{self.describe()}"
            try:
                last = self.tables()
                if all(t in last and last[t]["pipeline_state"] == "streaming" for t in tables):
                    return
            except psycopg.Error as e:
                last = e
            time.sleep(0.3)
        pytest.fail(f"serve did not stream {tables} within {timeout}s; last skippr.tables: {last}\n{self.describe()}")

    def metric(self, name: str, table: str) -> float:
        """Sum of the samples of `name` whose `table` label is `table` (0 when none)."""
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in body.splitlines():
            m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}\s+(\S+)", line)
            if not m or m.group(1) != name:
                continue
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            if labels.get("table") in (table, f"analytics.{table}", f"public.{table}"):
                total += float(m.group(3))
        return total

    def stop(self, timeout: float = 90) -> None:
        """SIGTERM; serve must exit 0 by itself."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            pytest.fail(f"serve did not exit within {timeout}s of SIGTERM\n{self.describe()}")
        log = self.describe()
        assert "panicked" not in log, log
        assert code == 0, f"serve exited {code} after SIGTERM\n{log}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


# --------------------------------------------------------------------------------------------
# What the Iceberg table holds
# --------------------------------------------------------------------------------------------


def local_path(uri: str) -> Path:
    """A file path of the local warehouse, whether written as a file:// URI or a path."""
    if uri.startswith("file:"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path))
    return Path(uri)


def table_dir(table) -> Path:
    """The table's folder: the parent of metadata/ that holds the current metadata file."""
    return local_path(table.metadata_location).parent.parent


def summary_of(snap) -> dict[str, str]:
    return dict(snap.summary.additional_properties) if snap.summary is not None else {}


def operation_of(snap) -> str | None:
    op = snap.summary.operation if snap.summary is not None else None
    return getattr(op, "value", op)


def live_entries(table, snap) -> list:
    """The live data and delete files of `snap` (DataFile records)."""
    return [e.data_file for m in snap.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=True)]


def file_counts(table) -> tuple[int, int]:
    """(data files, delete files) of the current snapshot."""
    snap = table.current_snapshot()
    if snap is None:
        return 0, 0
    files = live_entries(table, snap)
    return sum(1 for f in files if int(f.content) == 0), sum(1 for f in files if int(f.content) != 0)


def live_data_paths(table) -> set[str]:
    snap = table.current_snapshot()
    return {f.file_path for f in live_entries(table, snap) if int(f.content) == 0} if snap else set()


def ids_in(data_file) -> list[int]:
    """The `id` values of a data file, sorted."""
    import pyarrow.parquet as pq

    return sorted(pq.read_table(local_path(data_file.file_path), columns=["id"]).column("id").to_pylist())


def referenced_paths(table) -> set[Path]:
    """Every file a retained snapshot of the table needs: manifest lists, manifests, data files
    and delete files (not the metadata log: old metadata.json files may go)."""
    paths = {local_path(table.metadata_location)}
    for snap in table.metadata.snapshots:
        paths.add(local_path(snap.manifest_list))
        for m in snap.manifests(table.io):
            paths.add(local_path(m.manifest_path))
            for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
                paths.add(local_path(e.data_file.file_path))
    return paths


class Observer:
    """Polls a table's Iceberg metadata while serve runs and keeps what it saw of every snapshot
    (the snapshots of compactions, their parents' skippr.lsn, their manifests), because
    expiry removes them within seconds."""

    def __init__(self, sk: Skippr, name: str) -> None:
        self.sk = sk
        self.name = name
        self.snapshots: dict[int, dict] = {}    # id -> {parent, operation, summary, ts}
        self.compactions: dict[int, dict] = {}  # id -> what its manifest list held (None: gone)
        self.first_snapshot: int | None = None
        self.last_seq = 0                       # last-sequence-number: commits so far

    def poll(self) -> None:
        try:
            table = self.sk.table(self.name)
        except Exception:  # a commit or a cleanup between the catalog and the file: next time
            return
        self.last_seq = table.metadata.last_sequence_number
        for snap in table.metadata.snapshots:
            if snap.snapshot_id not in self.snapshots:
                self.snapshots[snap.snapshot_id] = {
                    "parent": snap.parent_snapshot_id, "operation": operation_of(snap),
                    "summary": summary_of(snap), "ts": snap.timestamp_ms,
                }
                if self.first_snapshot is None or snap.timestamp_ms < self.snapshots[self.first_snapshot]["ts"]:
                    self.first_snapshot = snap.snapshot_id
            info = self.snapshots[snap.snapshot_id]
            if info["summary"].get("skippr.maintenance") == "compaction" and snap.snapshot_id not in self.compactions:
                try:
                    manifests = snap.manifests(table.io)
                    files = live_entries(table, snap)
                    self.compactions[snap.snapshot_id] = {
                        "data_manifests": sum(1 for m in manifests if int(m.content) == 0),
                        "delete_manifests": sum(1 for m in manifests if int(m.content) != 0),
                        "data_files": sum(1 for f in files if int(f.content) == 0),
                        "delete_files": sum(1 for f in files if int(f.content) != 0),
                        "small_data_files": sum(1 for f in files if int(f.content) == 0
                                                and f.file_size_in_bytes < SMALL_BYTES),
                    }
                except Exception:  # expired and its files removed before we looked
                    self.compactions[snap.snapshot_id] = None

    def check_compactions(self) -> int:
        """Every compaction seen is a `replace` at the LSN of the snapshot before it, with one
        data manifest, at most one delete manifest and at most one delete file. Returns how
        many compaction snapshots were inspected."""
        inspected = 0
        for sid, files in self.compactions.items():
            snap = self.snapshots[sid]
            what = f"{self.name}: compaction snapshot {sid} ({snap['summary']})"
            assert snap["operation"] == "replace", f"{what}: operation {snap['operation']!r}, expected 'replace'"
            lsn = snap["summary"].get("skippr.lsn")
            parent = self.snapshots.get(snap["parent"]) if snap["parent"] is not None else None
            assert lsn is not None, f"{what}: no skippr.lsn"
            if parent is not None:
                assert parent["summary"].get("skippr.lsn") == lsn, (
                    f"{what}: skippr.lsn {lsn} differs from the snapshot before it ({parent['summary']})")
            if files is None:
                continue
            inspected += 1
            assert files["data_manifests"] <= 1 and files["delete_manifests"] <= 1, (
                f"{what}: its manifest list holds {files['data_manifests']} data and "
                f"{files['delete_manifests']} delete manifests, expected one of each at most")
            assert files["delete_files"] <= 1, (
                f"{what}: {files['delete_files']} delete files live after it; compaction must leave one at most")
        return inspected


def skippr_tables_json(sk: Skippr) -> dict[str, dict]:
    """skippr.tables read with `skipprd query` (no serve needed), by table name."""
    import json

    proc = sk.run("query", "SELECT table_name, data_files, delete_files, snapshots, last_compaction_time "
                  "FROM skippr.tables", "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "querying skippr.tables failed")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return {r["table_name"]: r for r in rows}


def poll_until(what: str, cond: Callable[[], bool], timeout: float, serve: Serve,
               every: Callable[[], None] = lambda: None, interval: float = 0.4) -> None:
    """Polls `cond` (calling `every` before each try) until it holds; a failing try (a gateway
    error, a column not there yet) is retried and shown if time runs out."""
    deadline = time.monotonic() + timeout
    last: str = ""
    while True:
        assert serve.alive(), f"serve exited ({serve.proc.returncode}) while waiting for {what}\n{serve.describe()}"
        every()
        try:
            if cond():
                return
            last = "condition not met"
        except (psycopg.Error, OSError, KeyError, TypeError) as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last try: {last})\n{serve.describe()}")
        time.sleep(interval)


def plant_orphan(path: Path, age_s: float = 3600) -> Path:
    """A file nobody references, last modified `age_s` ago."""
    path.write_bytes(b"PAR1" + secrets.token_bytes(512) + b"PAR1")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


# --------------------------------------------------------------------------------------------
# 1. Compaction and expiry under a mixed load, across a restart
# --------------------------------------------------------------------------------------------

#: A fresh random text of 2,560 characters: stored out of line (TOAST), never compressible.
BODY_SQL = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 80) g)"

ACCOUNTS_ROWS = 20_000
HOT_IDS = 1_500  # half of the updates and deletes land here: one copied file loses >= 20% of its rows


class MixedWriter(threading.Thread):
    """Small transactions of inserts, updates (most leave the TOASTed body unchanged), key
    changes and deletes on `accounts`, and equal-row inserts, updates and deletes on `ledger`."""

    def __init__(self, db: Database, seed: int = 11, pause: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.rng = random.Random(seed)
        self.pause = pause
        self.next_id = ACCOUNTS_ROWS + 1
        self.halt = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None

    def some_id(self) -> int:
        if self.rng.random() < 0.5:
            return self.rng.randint(1, HOT_IDS)
        return self.rng.randint(1, self.next_id - 1)

    def one(self, conn: psycopg.Connection) -> None:
        r = self.rng.random()
        if r < 0.40:
            # body is not touched: it arrives as "unchanged TOAST" and must be kept
            conn.execute("UPDATE accounts SET n = n + 1, note = %s, changed_at = now() WHERE id = %s",
                         (f"u{self.committed}", self.some_id()))
        elif r < 0.47:
            conn.execute(f"UPDATE accounts SET body = {BODY_SQL}, n = n + 1 WHERE id = %s", (self.some_id(),))
        elif r < 0.61:
            conn.execute(f"INSERT INTO accounts (id, n, note, body, changed_at) "
                         f"VALUES (%s, 0, 'new', CASE WHEN %s THEN {BODY_SQL} END, now())",
                         (self.next_id, self.rng.random() < 0.3))
            self.next_id += 1
        elif r < 0.72:
            conn.execute("DELETE FROM accounts WHERE id = %s", (self.some_id(),))
        elif r < 0.78:
            conn.execute("UPDATE accounts SET id = %s, note = 'moved' WHERE id = %s", (self.next_id, self.some_id()))
            self.next_id += 1
        elif r < 0.88:
            acct, amount = self.rng.randint(0, 99), self.rng.randint(0, 4)
            conn.execute("INSERT INTO ledger VALUES (%s, %s, 'dup'), (%s, %s, 'dup')", (acct, amount, acct, amount))
        elif r < 0.94:
            conn.execute("DELETE FROM ledger WHERE ctid = (SELECT ctid FROM ledger WHERE account = %s LIMIT 1)",
                         (self.rng.randint(0, 99),))
        else:
            conn.execute("UPDATE ledger SET amount = amount + 1 WHERE ctid = "
                         "(SELECT ctid FROM ledger WHERE account = %s LIMIT 1)", (self.rng.randint(0, 99),))

    def run(self) -> None:
        try:
            with self.db.connect() as conn:
                while not self.halt.is_set():
                    with conn.transaction():
                        for _ in range(self.rng.randint(1, 4)):
                            self.one(conn)
                    self.committed += 1
                    time.sleep(self.pause)
        except BaseException as e:  # reported by the test
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert self.error is None, f"the writer failed: {self.error!r}"


def setup_accounts_and_ledger(db: Database) -> None:
    db.execute(f"""
        CREATE TABLE accounts (id bigint PRIMARY KEY, n integer NOT NULL, note text, body text,
                               balance numeric(12,2), changed_at timestamptz);
        ALTER TABLE accounts ALTER COLUMN body SET STORAGE EXTERNAL;
        INSERT INTO accounts
        SELECT i, 0, 'seed ' || i, CASE WHEN i % 5 = 0 THEN {BODY_SQL.replace('random()', 'i::text')} END,
               (i * 7.31) % 10000, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 min'
        FROM generate_series(1, {ACCOUNTS_ROWS}) i;
        CREATE TABLE ledger (account integer NOT NULL, amount integer, memo text);
        ALTER TABLE ledger REPLICA IDENTITY FULL;
        -- 100 distinct rows, 12 of each
        INSERT INTO ledger SELECT i % 100, i % 5, CASE WHEN i % 100 < 30 THEN NULL ELSE 'm' || (i % 2) END
        FROM generate_series(1, 1200) i;
    """)
    toast_bytes = db.scalar("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'accounts'")
    assert toast_bytes > ACCOUNTS_ROWS // 5 * 2000, "bodies are not stored out of line: the test would prove less"
    assert db.scalar("SELECT count(*) - count(DISTINCT (account, amount, memo)) FROM ledger") > 500


def test_compaction_and_expiry_keep_every_reader_equal(skippr: Skippr, db: Database) -> None:
    setup_accounts_and_ledger(db)
    tables = ["accounts", "ledger"]
    serve = Serve(skippr, tables, extra_source={"parquet_target_file_size_mb": TARGET_MB})
    observers = {t: Observer(skippr, t) for t in tables}

    def observe() -> None:
        for o in observers.values():
            o.poll()

    writer = MixedWriter(db)
    started = time.monotonic()
    serve.start()
    try:
        serve.wait_streaming(tables)
        observe()
        first_snapshot = observers["accounts"].first_snapshot
        assert first_snapshot is not None
        copied = skippr.table("accounts")
        copied_large = [f for f in live_entries(copied, copied.current_snapshot())
                        if int(f.content) == 0 and f.file_size_in_bytes >= SMALL_BYTES]
        print(f"accounts copied into {len(live_entries(copied, copied.current_snapshot()))} files, "
              f"{len(copied_large)} of them of at least {SMALL_BYTES} bytes")
        assert copied_large, f"the copy wrote no data file of at least {SMALL_BYTES} bytes: the test needs some"
        writer.start()

        # Phase 1: until each table has been compacted once.
        poll_until("the first compaction of both tables",
                   lambda: all(serve.tables()[t]["last_compaction_time"] is not None for t in tables),
                   timeout=60, serve=serve, every=observe)
        first_compaction = serve.tables()["accounts"]["last_compaction_time"]
        assert serve.metric("skippr_compactions_total", "accounts") >= 1, serve.describe()
        assert serve.metric("skippr_compacted_files_total", "accounts") >= 1, serve.describe()

        # A restart between compactions: the key index is rebuilt from compacted files, and
        # the updates and deletes that follow must find their rows in them.
        time.sleep(1.5)
        serve.stop()
        serve.start()
        serve.wait_streaming(tables)
        restarted = time.monotonic()

        # One copied file loses 30% of its rows in one transaction (the TOASTed body left
        # unchanged): the next compaction must rewrite it, and leave alone the copied files
        # that lost fewer.
        target = min(copied_large, key=lambda f: ids_in(f)[0])
        target_ids = ids_in(target)
        with db.connect() as conn:
            conn.execute("UPDATE accounts SET n = n + 1000, note = 'bulk' WHERE id = ANY(%s)",
                         (target_ids[: len(target_ids) * 3 // 10],))

        # Files nobody references: old ones must go, a young one must stay until it is old.
        acc_dir = table_dir(skippr.table("accounts"))
        led_dir = table_dir(skippr.table("ledger"))
        orphans = [
            plant_orphan(acc_dir / "data" / f"zz-orphan-{secrets.token_hex(4)}.parquet"),
            plant_orphan(acc_dir / "metadata" / f"zz-orphan-{secrets.token_hex(4)}-m0.avro"),
            plant_orphan(led_dir / "data" / f"zz-orphan-{secrets.token_hex(4)}.parquet"),
        ]
        young = plant_orphan(acc_dir / "data" / f"zz-young-{secrets.token_hex(4)}.parquet", age_s=0)
        planted = time.monotonic()
        time.sleep(1.0)
        if time.monotonic() - planted < 1.8:
            assert young.exists(), f"{young} was removed before it was {MAINTENANCE['orphan_file_age']} old"

        # Phase 2: more compactions, expiries and orphan removal by the restarted process.
        def phase2_done() -> bool:
            st = serve.tables()
            latest = st["accounts"]["last_compaction_time"]
            return (time.monotonic() - restarted >= 10
                    and observers["accounts"].last_seq >= 130
                    and target.file_path not in live_data_paths(skippr.table("accounts"))
                    and latest is not None and latest > first_compaction
                    and serve.metric("skippr_compactions_total", "accounts") >= 1
                    and serve.metric("skippr_compactions_total", "ledger") >= 1
                    and serve.metric("skippr_expired_snapshots_total", "accounts") >= 1
                    and serve.metric("skippr_expired_snapshots_total", "ledger") >= 1
                    and not any(p.exists() for p in orphans) and not young.exists())

        poll_until("compactions, expiries and orphan removal after the restart", phase2_done,
                   timeout=90, serve=serve, every=observe)
        assert serve.metric("skippr_orphan_files_removed_total", "accounts") >= 2, serve.describe()
        assert serve.metric("skippr_orphan_files_removed_total", "ledger") >= 1, serve.describe()
        for t in tables:
            assert serve.metric("skippr_maintenance_failures_total", t) == 0, serve.describe()

        writer.stop()
        wait_until_synced(skippr, db, tables, serve.proc, timeout=90)
        # one more check after the last commit, then stop: the readers below see a still table
        time.sleep(1.5)
        observe()
        serve.stop()
    finally:
        writer.halt.set()
        serve.kill()
    print(f"{writer.committed} source transactions; took {time.monotonic() - started:.0f}s")

    # Every reader equals Postgres: unchanged TOAST values, key changes, equal rows.
    skippr.assert_table_matches("accounts", ALL_READERS)
    assert_multiset_matches(skippr, db, "ledger")

    summaries = skippr_tables_json(skippr)
    for name in tables:
        table = skippr.table(name)
        meta = table.metadata
        obs = observers[name]
        what = f"{name} ({meta.last_sequence_number} commits)"
        # Many commits happened: the bounds below would not hold without maintenance.
        assert meta.last_sequence_number >= (130 if name == "accounts" else 100), \
            f"{what}: too few commits for the bounds below to mean anything"

        # Compactions were seen and are well formed; the copy's snapshot was expired.
        assert obs.compactions, f"{what}: no compaction snapshot was ever seen"
        assert obs.check_compactions() >= 1, f"{what}: every compaction snapshot was gone before it was read"
        assert obs.first_snapshot not in {s.snapshot_id for s in meta.snapshots}, \
            f"{what}: the snapshot of the initial copy was never expired"
        if name == "accounts":
            assert obs.first_snapshot == first_snapshot
            live = live_data_paths(table)
            assert target.file_path not in live, f"{what}: the copied file that lost 30% of its rows was not rewritten"
            if len(copied_large) >= 2:
                kept_large = [f for f in copied_large if f.file_path in live]
                assert kept_large, f"{what}: every copied file was rewritten, though the others lost few rows"
            # Files skipprd writes after the copy are in key order, rewritten ones too (merged
            # by key), so a lookup by key reads one page of one row group of each.
            import pyarrow.parquet as pq
            written = [p for p in live if Path(local_path(p)).name.startswith(("cdc-", "compact-"))]
            assert any(Path(local_path(p)).name.startswith("compact-") for p in written), \
                f"{what}: no rewritten file is live"
            for p in written:
                in_file = pq.read_table(local_path(p), columns=["id"]).column("id").to_pylist()
                assert in_file == sorted(in_file), f"{what}: {Path(local_path(p)).name} is not in key order"

        # Bounded: snapshots, metadata files, live data and delete files, files on disk.
        assert 2 <= len(meta.snapshots) <= 30, f"{what}: {len(meta.snapshots)} snapshots kept"
        tdir = table_dir(table)
        # Old metadata files go once the metadata log no longer lists them (Iceberg keeps the
        # last `write.metadata.previous-versions-max`, 100 by default).
        metadata_files = list((tdir / "metadata").glob("*.metadata.json"))
        logged = {local_path(e.metadata_file) for e in meta.metadata_log} | {local_path(table.metadata_location)}
        stale = [p.name for p in metadata_files if p not in logged]
        assert len(meta.metadata_log) <= 100, f"{what}: the metadata log lists {len(meta.metadata_log)} files"
        assert len(stale) <= 15, f"{what}: {len(stale)} metadata.json files the table no longer lists remain: {stale[:5]}"
        assert len(metadata_files) <= 100 + 1 + 15, f"{what}: {len(metadata_files)} metadata.json files"
        current = live_entries(table, table.current_snapshot())
        data = [f for f in current if int(f.content) == 0]
        deletes = [f for f in current if int(f.content) != 0]
        small = [f for f in data if f.file_size_in_bytes < SMALL_BYTES]
        total_bytes = sum(f.file_size_in_bytes for f in data)
        assert len(small) <= 2 * MIN_FILES + 1, (
            f"{what}: {len(small)} small data files live ({[f.file_size_in_bytes for f in small]})")
        assert len(deletes) <= 2 * MIN_FILES + 1, f"{what}: {len(deletes)} delete files live"
        assert len(data) <= total_bytes // SMALL_BYTES + 2 * MIN_FILES + 2, (
            f"{what}: {len(data)} data files live for {total_bytes} bytes")

        # What the table references is all there; what it does not reference is gone.
        referenced = referenced_paths(table)
        missing = sorted(str(p) for p in referenced if not p.exists())
        assert not missing, f"{what}: files referenced by retained snapshots are gone: {missing[:10]}"
        on_disk = [p for p in (tdir / "data").rglob("*") if p.is_file()]
        unreferenced = [p for p in on_disk if p not in referenced]
        assert len(unreferenced) <= 25, (
            f"{what}: {len(unreferenced)} files under data/ that no retained snapshot references, "
            f"e.g. {[p.name for p in unreferenced[:5]]}")

        read = [c for c in obs.compactions.values() if c is not None]
        print(f"{what}: {len(obs.snapshots)} snapshots seen, {len(obs.compactions)} compactions seen "
              f"(at most {max((c['data_files'] for c in read), default=0)} data files after one); "
              f"now {len(meta.snapshots)} snapshots, {len(data)} data files "
              f"({len(small)} small), {len(deletes)} delete files, {len(metadata_files)} metadata.json files, "
              f"{len(on_disk)} files under data/")

        # skippr.tables tells the same.
        row = summaries.get(name)
        assert row is not None, summaries
        assert (row["data_files"], row["delete_files"], row["snapshots"]) == (len(data), len(deletes), len(meta.snapshots)), (
            f"{what}: skippr.tables says {row}, the table holds {len(data)} data files, {len(deletes)} delete "
            f"files and {len(meta.snapshots)} snapshots")
        assert row["last_compaction_time"] is not None, row
        last = dt.datetime.fromisoformat(str(row["last_compaction_time"]).replace("Z", "+00:00"))
        now = dt.datetime.now(dt.timezone.utc)
        assert now - dt.timedelta(minutes=10) < last <= now + dt.timedelta(seconds=5), row
        kept = [s for s in meta.snapshots if summary_of(s).get("skippr.maintenance") == "compaction"]
        if kept:
            newest = max(s.timestamp_ms for s in kept) / 1000
            assert abs(last.timestamp() - newest) < 5, (
                f"{what}: last_compaction_time {last} is not the newest compaction snapshot's time "
                f"({dt.datetime.fromtimestamp(newest, dt.timezone.utc)})")

    # The junk left by hand was removed, not just hidden.
    assert not any(p.exists() for p in orphans), [str(p) for p in orphans if p.exists()]


# --------------------------------------------------------------------------------------------
# 2. Live queries across compactions
# --------------------------------------------------------------------------------------------

WALLETS = 4000
START_BALANCE = 1000
TOTAL = WALLETS * START_BALANCE


class TransferWriter(threading.Thread):
    """Moves amounts between two wallets in one transaction, and in half of them also gives
    one wallet a new key (id + 1,000,000): count, distinct ids and the sum never change."""

    def __init__(self, db: Database, pause: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.ids = list(range(1, WALLETS + 1))
        self.rng = random.Random(5)
        self.pause = pause
        self.halt = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.db.connect() as conn:
                while not self.halt.is_set():
                    a, b = self.rng.sample(range(len(self.ids)), 2)
                    amount = self.rng.randint(1, 50)
                    rekey = self.rng.random() < 0.5
                    with conn.transaction():
                        conn.execute("UPDATE wallet SET balance = balance - %s WHERE id = %s", (amount, self.ids[a]))
                        conn.execute("UPDATE wallet SET balance = balance + %s WHERE id = %s", (amount, self.ids[b]))
                        if rekey:
                            conn.execute("UPDATE wallet SET id = id + 1000000 WHERE id = %s", (self.ids[a],))
                    if rekey:
                        self.ids[a] += 1_000_000
                    self.committed += 1
                    time.sleep(self.pause)
        except BaseException as e:
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert self.error is None, f"the writer failed: {self.error!r}"


class Hammer(threading.Thread):
    """One gateway session asking the invariant query again and again."""

    QUERY = "SELECT count(*), count(DISTINCT id), sum(balance) FROM analytics.wallet"

    def __init__(self, serve: Serve) -> None:
        super().__init__(daemon=True)
        self.serve = serve
        self.halt = threading.Event()
        self.answers: list[tuple] = []
        self.errors: list[str] = []

    def run(self) -> None:
        conn = None
        while not self.halt.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self.serve.connect()
                row = conn.execute(self.QUERY).fetchone()
                self.answers.append(tuple(int(v) if v is not None else None for v in row))
            except psycopg.Error as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.1)
        if conn is not None:
            conn.close()


def test_live_queries_during_compaction_never_see_a_row_twice_or_miss_one(skippr: Skippr, db: Database) -> None:
    db.execute(f"""
        CREATE TABLE wallet (id bigint PRIMARY KEY, balance bigint NOT NULL, owner text NOT NULL);
        INSERT INTO wallet SELECT i, {START_BALANCE}, 'owner ' || i FROM generate_series(1, {WALLETS}) i;
    """)
    serve = Serve(skippr, ["wallet"])
    writer = TransferWriter(db)
    hammers = [Hammer(serve) for _ in range(3)]
    serve.start()
    try:
        serve.wait_streaming(["wallet"])
        writer.start()
        # Let the first small files gather, then count compactions from here.
        time.sleep(1.0)
        compactions_before = serve.metric("skippr_compactions_total", "wallet")
        window_start = time.monotonic()
        for h in hammers:
            h.start()

        def enough() -> bool:
            answered = sum(len(h.answers) for h in hammers)
            done = serve.metric("skippr_compactions_total", "wallet") - compactions_before
            return answered >= 300 and done >= 2 and time.monotonic() - window_start >= 8

        try:
            poll_until("300 answers across at least 2 compactions", enough, timeout=75, serve=serve, interval=0.5)
        finally:
            for h in hammers:
                h.halt.set()
            for h in hammers:
                h.join(timeout=30)
        compactions = serve.metric("skippr_compactions_total", "wallet") - compactions_before
        writer.stop()

        answers = [a for h in hammers for a in h.answers]
        errors = [e for h in hammers for e in h.errors]
        wrong = [a for a in answers if a != (WALLETS, WALLETS, TOTAL)]
        print(f"{len(answers)} answers, {len(errors)} errors, {compactions:.0f} compactions, "
              f"{writer.committed} transfers in {time.monotonic() - window_start:.1f}s")
        assert not wrong, (
            f"{len(wrong)} of {len(answers)} answers were not (count, distinct ids, sum) = "
            f"{(WALLETS, WALLETS, TOTAL)} during {compactions:.0f} compactions, e.g. {wrong[:10]}")
        assert not errors, f"{len(errors)} of {len(answers) + len(errors)} queries failed, e.g. {errors[:5]}"
        assert compactions >= 2, f"only {compactions:.0f} compactions during the window\n{serve.describe()}"
        assert serve.metric("skippr_maintenance_failures_total", "wallet") == 0, serve.describe()

        # The live table ends equal to Postgres, then Iceberg alone does too.
        expected = db.execute("SELECT id, balance FROM wallet ORDER BY id")
        got: list = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with serve.connect() as c:
                got = c.execute("SELECT id, balance FROM analytics.wallet ORDER BY id").fetchall()
            if got == expected:
                break
            time.sleep(0.5)
        assert got == expected, f"the live table never equalled Postgres ({len(got)} rows)\n{serve.describe()}"
        serve.stop()
    finally:
        writer.halt.set()
        for h in hammers:
            h.halt.set()
        serve.kill()
    skippr.assert_table_matches("wallet", ("pyiceberg", "duckdb"))


# --------------------------------------------------------------------------------------------
# 3. Configuration
# --------------------------------------------------------------------------------------------

#: Line 7 of BASE_LINES is the pipeline's `data_sink:`; the maintenance block goes after it.
AFTER_PIPELINE = 7


def with_maintenance(*lines: str) -> list[str]:
    out = list(BASE_LINES)
    out[AFTER_PIPELINE:AFTER_PIPELINE] = list(lines)
    return out


@pytest.mark.parametrize(
    "block,field,msg",
    [
        (["    maintenance:", "      snapshot_retention: banana"], "snapshot_retention", ["banana"]),
        (["    maintenance:", "      min_snapshots_to_keep: 0"], "min_snapshots_to_keep", []),
        (["    maintenance:", "      check_interval: 10ms"], "check_interval", ["10ms"]),
        (["    maintenance:", "      orphan_file_age: 500ms"], "orphan_file_age", ["500ms"]),
        (["    maintenance:", "      compaction_min_files: 1"], "compaction_min_files", []),
        (["    maintenance:", "      enabled: sometimes"], "enabled", ["sometimes"]),
        (["    maintenance:", "      compaction_min_file: 3"], "", ["unknown field compaction_min_file",
                                                                 "compaction_min_files"]),
    ],
    ids=["retention-banana", "keep-zero", "check-too-short", "orphan-age-too-short", "min-files-one",
         "enabled-not-bool", "unknown-key"],
)
def test_bad_maintenance_setting_names_its_key(workdir: Path, block: list[str], field: str, msg: list[str]) -> None:
    lines = with_maintenance(*block)
    cfg, proc = run_validate(workdir, config_text(lines))
    line = AFTER_PIPELINE + len(block)
    prefix = "pipelines.app.maintenance" + (f".{field}" if field else "")
    assert_config_error(proc, cfg, line=line, cols=None, field_prefix=prefix, msg_contains=msg)


def test_every_bad_maintenance_setting_is_reported_at_once(workdir: Path) -> None:
    lines = with_maintenance("    maintenance:", "      snapshot_retention: banana", "      min_snapshots_to_keep: 0")
    cfg, proc = run_validate(workdir, config_text(lines))
    assert_config_error(proc, cfg, line=9, cols=None, field_prefix="pipelines.app.maintenance.snapshot_retention",
                        msg_contains=["banana"], count=2)
    assert_config_error(proc, cfg, line=10, cols=None,
                        field_prefix="pipelines.app.maintenance.min_snapshots_to_keep", msg_contains=[], count=2)


def test_bad_maintenance_setting_in_flow_style(workdir: Path) -> None:
    lines = with_maintenance("    maintenance: {snapshot_retention: banana}")
    cfg, proc = run_validate(workdir, config_text(lines))
    assert_config_error(proc, cfg, line=8, cols=None, field_prefix="pipelines.app.maintenance.snapshot_retention",
                        msg_contains=["banana"])


@pytest.mark.parametrize("block", [
    ["    maintenance:", "      enabled: true", "      check_interval: 1m", "      snapshot_retention: 1h",
     "      min_snapshots_to_keep: 10", "      orphan_file_age: 1h", "      compaction_min_files: 8"],
    ["    maintenance:", "      check_interval: 100ms", "      snapshot_retention: 1s",
     "      min_snapshots_to_keep: 1", "      orphan_file_age: 1s", "      compaction_min_files: 2"],
    ["    maintenance: {enabled: false}"],
    ["    maintenance: {}"],
], ids=["documented-defaults", "the-minimums", "disabled", "empty"])
def test_good_maintenance_settings_validate(workdir: Path, block: list[str]) -> None:
    cfg, proc = run_validate(workdir, config_text(with_maintenance(*block)))
    assert proc.returncode == 0, describe_run(proc, "validate rejected a good maintenance block")
