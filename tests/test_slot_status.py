"""The WAL a pipeline's replication slot holds, visible and bounded (issue 41, item 2).

Per pipeline, `skipprd status` (text and `--format json`), the `skippr.sources` system table
(`skipprd query`) and the metrics of a running `sync` show the slot's retained WAL
(`pg_current_wal_lsn() - restart_lsn`), `wal_status`, `safe_wal_size`, the lag behind the server
in bytes and seconds, and `max_retained_wal`; past `max_retained_wal` each of them warns, and so
does the log. `discover` reports the server's `max_slot_wal_keep_size` and warns when it is
unlimited (-1). WAL is held on purpose here by an open transaction that has written: Postgres
cannot move a logical slot's `restart_lsn` past the start of a transaction still in progress.

One cluster of this module's own (its `max_slot_wal_keep_size` is changed with ALTER SYSTEM), one
database, one pipeline, synced once for the whole module.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from typing import Iterable

import psycopg
import pytest

from conftest import (
    LSN_RE,
    Database,
    PgCluster,
    Skippr,
    assert_no_panic,
    describe_run,
    fresh_database,
    free_port,
    start_cluster,
    stop_cluster,
)
from test_cdc import SLOT, bg_log, stop, wait_slot_inactive

MiB = 1024 * 1024
GiB = 1024 * MiB
#: `max_retained_wal` when the config does not set it.
DEFAULT_MAX_RETAINED = 10 * GiB

SETUP = """
CREATE TABLE orders (id bigint PRIMARY KEY, amount int);
INSERT INTO orders SELECT i, i FROM generate_series(1, 100) i;
CREATE TABLE noise (id bigserial PRIMARY KEY, v text);
"""

STATUS_KEYS = {"retained_wal_bytes", "wal_status", "safe_wal_size", "lag_bytes", "lag_seconds",
               "max_retained_wal", "warnings"}
SOURCES_COLUMNS = {"pipeline", "source", "slot", "wal_status", "retained_wal_bytes", "safe_wal_size",
                   "lag_bytes", "lag_seconds", "max_retained_wal", "confirmed_flush_lsn", "current_lsn",
                   "restart_lsn", "warning", "error"}


@pytest.fixture(scope="module")
def cluster() -> Iterable[PgCluster]:
    c = start_cluster()
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def mdb(cluster: PgCluster) -> Iterable[Database]:
    yield from fresh_database(cluster)


@pytest.fixture(scope="module")
def synced(mdb: Database, tmp_path_factory: pytest.TempPathFactory) -> Skippr:
    """Pipeline `app` on `orders` (`noise` is not in it), snapshot taken, slot made."""
    mdb.execute(SETUP)
    sk = Skippr(db=mdb, workdir=tmp_path_factory.mktemp("slot-status"))
    sk.write_config(["orders"])
    sk.sync_once()
    return sk


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def status_json(skippr: Skippr) -> dict:
    proc = skippr.run("status", "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "status failed")
    [p] = json.loads(proc.stdout)
    assert p["pipeline"] == "app", p
    missing = STATUS_KEYS - set(p)
    assert not missing, f"status --format json lacks {sorted(missing)}: {json.dumps(p, indent=1)}"
    return p


def status_text(skippr: Skippr) -> str:
    proc = skippr.run("status", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "status failed")
    return proc.stdout


def warning_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().lower().startswith("warning:")]


def sources_rows(skippr: Skippr) -> list[dict]:
    proc = skippr.run("query", "SELECT * FROM skippr.sources", "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "querying skippr.sources failed")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def pg_retained(db: Database) -> int:
    return int(db.scalar(
        "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
        (SLOT,)))


def write_wal(db: Database, mib: int) -> None:
    """About `mib` MiB of WAL into `noise`, a table the pipeline does not follow."""
    db.execute("INSERT INTO noise (v) SELECT lpad('', 1900, md5(g::text)) FROM generate_series(1, %s) g",
               (mib * 600,))


def hold_wal(db: Database) -> psycopg.Connection:
    """An open transaction that has written: the slot's restart_lsn cannot pass its start."""
    conn = db.connect(autocommit=False)
    conn.execute("INSERT INTO noise (v) VALUES ('held open')")
    return conn


def discover(skippr: Skippr, *fmt: str) -> subprocess.CompletedProcess:
    proc = skippr.run("discover", "--pipeline", "app", *fmt, check=False)
    assert_no_panic(proc)
    return proc


def keep_size_texts(skippr: Skippr) -> tuple[list[str], list[str]]:
    """What discover says about max_slot_wal_keep_size: (json check texts, text lines).
    Discover must pass: the setting is a warning at most, never a failure."""
    proc = discover(skippr, "--format", "json")
    assert proc.returncode == 0, describe_run(proc, "discover failed on a ready source")
    doc = json.loads(proc.stdout)
    entries = list(doc.get("checks", [])) + list(doc.get("warnings", []))
    found = []
    for e in entries:
        text = json.dumps(e) if not isinstance(e, str) else e
        if "max_slot_wal_keep_size" in text:
            found.append(text)
            if isinstance(e, dict) and "ok" in e:
                assert e["ok"] is not False, f"max_slot_wal_keep_size must not fail discover: {e}"
    assert found, describe_run(proc, "discover --format json does not name max_slot_wal_keep_size")
    text = discover(skippr)
    assert text.returncode == 0, describe_run(text)
    lines = [line for line in (text.stdout + text.stderr).splitlines() if "max_slot_wal_keep_size" in line]
    assert lines, describe_run(text, "discover does not name max_slot_wal_keep_size")
    return found, lines


def scrape(port: int) -> dict[str, float]:
    """Series name (with labels) -> value, from `/metrics`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_status_and_sources_show_the_slot_within_its_limits(synced: Skippr, mdb: Database):
    synced.write_config(["orders"])
    before = pg_retained(mdb)
    p = status_json(synced)
    after = pg_retained(mdb)
    assert isinstance(p["retained_wal_bytes"], int), p
    assert before - MiB <= p["retained_wal_bytes"] <= after + MiB, \
        f"retained_wal_bytes {p['retained_wal_bytes']}, Postgres says {before}..{after}: {p}"
    assert p["wal_status"] in ("reserved", "extended"), p
    assert p["safe_wal_size"] is None, f"safe_wal_size with max_slot_wal_keep_size = -1 (unlimited): {p}"
    assert isinstance(p["lag_bytes"], int) and p["lag_bytes"] >= 0, p
    assert p["lag_seconds"] is None or (isinstance(p["lag_seconds"], (int, float)) and p["lag_seconds"] >= 0), p
    assert p["max_retained_wal"] == DEFAULT_MAX_RETAINED, f"max_retained_wal default is 10GiB: {p}"
    assert p["warnings"] == [], f"warnings for a slot far within its limit: {p}"

    text = status_text(synced)
    assert re.search(r"retained", text, re.I), f"status text shows no retained WAL:\n{text}"
    assert warning_lines(text) == [], f"status text warns for a slot far within its limit:\n{text}"

    [row] = sources_rows(synced)
    missing = SOURCES_COLUMNS - set(row)
    assert not missing, f"skippr.sources lacks {sorted(missing)}: {row}"
    assert (row["pipeline"], row["source"], row["slot"]) == ("app", "app_db", SLOT), row
    assert isinstance(row["retained_wal_bytes"], int) and row["retained_wal_bytes"] >= 0, row
    assert row["max_retained_wal"] == DEFAULT_MAX_RETAINED, row
    for col in ("confirmed_flush_lsn", "current_lsn", "restart_lsn"):
        assert LSN_RE.match(row[col] or ""), f"{col} is not an LSN: {row}"
    assert row["warning"] is None and row["error"] is None, row

    # The cluster's max_slot_wal_keep_size is -1: discover warns that the slot may hold WAL
    # without bound, and does not fail.
    found, lines = keep_size_texts(synced)
    assert any("-1" in t or "unlimited" in t.lower() for t in found), found
    assert any("-1" in t or "unlimited" in t.lower() for t in lines), lines


def test_max_slot_wal_keep_size_shows_in_discover_and_safe_wal_size(synced: Skippr, mdb: Database, cluster: PgCluster):
    synced.write_config(["orders"])
    cluster.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'")
    cluster.execute("SELECT pg_reload_conf()")
    try:
        deadline = time.monotonic() + 10
        while mdb.scalar("SHOW max_slot_wal_keep_size") != "1GB":
            assert time.monotonic() < deadline, "the server did not take max_slot_wal_keep_size = 1GB"
            time.sleep(0.1)
        found, lines = keep_size_texts(synced)
        for t in found + lines:
            assert "unlimited" not in t.lower(), f"max_slot_wal_keep_size is 1GB, not unlimited: {t}"
        assert any(v in t for t in lines for v in ("1GB", "1024MB", "1073741824", "1 GB", "1GiB")), lines

        p = status_json(synced)
        expected = int(mdb.scalar(
            "SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)))
        assert isinstance(p["safe_wal_size"], int), f"no safe_wal_size with max_slot_wal_keep_size 1GB: {p}"
        # Postgres counts in whole WAL segments from the current one: a little over 1 GiB at most
        assert 0 < p["safe_wal_size"] <= GiB + 64 * MiB, p
        assert abs(p["safe_wal_size"] - expected) <= 16 * MiB, f"safe_wal_size {p['safe_wal_size']}, Postgres says {expected}"
    finally:
        cluster.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        cluster.execute("SELECT pg_reload_conf()")


def test_retained_wal_past_max_retained_wal_warns_everywhere(synced: Skippr, mdb: Database):
    port = free_port()
    synced.write_config(["orders"], extra_source={"max_retained_wal": "1MB"},
                        extra_pipeline={"commit_interval": "1s"}, metrics_listen=f"127.0.0.1:{port}")
    wait_slot_inactive(mdb)
    holder = hold_wal(mdb)
    proc: subprocess.Popen | None = None
    try:
        write_wal(mdb, 4)
        assert pg_retained(mdb) > 2 * MiB

        # The pipeline is stopped: status and skippr.sources still read the slot and warn.
        p = status_json(synced)
        assert p["max_retained_wal"] in (10**6, MiB), p
        assert p["retained_wal_bytes"] > 2 * MiB, p
        assert any("max_retained_wal" in w for w in p["warnings"]), f"no warning naming max_retained_wal: {p}"
        lines = warning_lines(status_text(synced))
        assert any("max_retained_wal" in line for line in lines), f"status text has no warning line: {lines}"
        [row] = sources_rows(synced)
        assert row["warning"] and "max_retained_wal" in row["warning"], row

        # A running sync: the metrics show the slot, over its limit, and the log warns.
        proc = synced.start("sync", "--pipeline", "app")
        deadline = time.monotonic() + 40
        metrics: dict[str, float] = {}
        key = '{pipeline="app"}'
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"sync exited with {proc.returncode}\n{bg_log(synced)}"
            try:
                metrics = scrape(port)
            except OSError:
                metrics = {}
            # lag_seconds comes once the stream holds the slot (the first sample may precede it).
            if (
                metrics.get(f"skippr_slot_retained_wal_over_limit{key}") == 1.0
                and f"skippr_slot_lag_seconds{key}" in metrics
            ):
                break
            time.sleep(0.5)
        slot_metrics = {k: v for k, v in metrics.items() if k.startswith("skippr_slot_")}
        assert metrics.get(f"skippr_slot_retained_wal_over_limit{key}") == 1.0, slot_metrics
        assert metrics.get(f"skippr_slot_retained_wal_bytes{key}", 0) > 2 * MiB, slot_metrics
        for name in ("skippr_slot_lag_bytes", "skippr_slot_lag_seconds"):
            assert f"{name}{key}" in metrics, f"no {name}: {slot_metrics}"
        deadline = time.monotonic() + 15
        while "max_retained_wal" not in (synced.workdir / "bg.stderr").read_text(errors="replace"):
            assert time.monotonic() < deadline, f"the log does not warn about max_retained_wal\n{bg_log(synced)}"
            time.sleep(0.5)
        warn = [line for line in (synced.workdir / "bg.stderr").read_text(errors="replace").splitlines()
                if "max_retained_wal" in line]
        assert any("WARN" in line for line in warn), warn

        # The transaction ends: the slot lets go of the WAL (at the next running-transactions
        # record, which a checkpoint writes) and the warning goes.
        holder.rollback()
        holder.close()
        deadline = time.monotonic() + 30
        while True:
            mdb.execute("CHECKPOINT")
            p = status_json(synced)
            if not p["warnings"] or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert p["warnings"] == [], f"the warning stayed after the WAL was let go (Postgres: {pg_retained(mdb)}): {p}"
        assert p["retained_wal_bytes"] < MiB, p
        assert proc.poll() is None, f"sync exited with {proc.returncode}\n{bg_log(synced)}"
        rc = stop(proc, signal.SIGTERM)
        assert rc == 0, f"sync exited {rc} after SIGTERM\n{bg_log(synced)}"
    finally:
        if not holder.closed:
            holder.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "panicked" not in bg_log(synced), bg_log(synced)
