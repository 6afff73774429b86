"""`skipprd status`: per pipeline and table, the committed LSN, the slot's position, lag,
WAL size, rows and files, and the pipeline's recorded state, against a real pipeline."""

from __future__ import annotations

import json
import signal
import time

from conftest import Skippr, assert_no_panic, describe_run, lsn_to_int


def status(skippr: Skippr, *extra: str) -> list[dict]:
    proc = skippr.run("status", "--format", "json", *extra, check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "status failed")
    return json.loads(proc.stdout)


def current_lsn(skippr: Skippr) -> int:
    return lsn_to_int(skippr.db.scalar("SELECT pg_current_wal_lsn()::text"))


def test_status_follows_lag_up_and_back_to_zero(skippr: Skippr):
    skippr.db.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int);"
        "INSERT INTO orders SELECT i, i FROM generate_series(1, 500) i;"
    )
    skippr.write_config(["orders"], extra_pipeline={"commit_interval": "1h"})
    skippr.sync_once()

    [p] = status(skippr)
    assert p["pipeline"] == "app"
    assert p["state"] == "stopped"
    [t] = p["tables"]
    assert t["table"] == "analytics.orders"
    assert t["rows"] == 500
    assert t["data_files"] >= 1
    assert t["tail_changes"] == 0
    assert p["slot_confirmed_lsn"] is not None and p["source_current_lsn"] is not None

    # A running sync with a long commit interval: writes land in the WAL tail and wait there.
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        skippr.db.execute("INSERT INTO orders SELECT i, i FROM generate_series(501, 800) i")
        written = current_lsn(skippr)
        deadline = time.time() + 30
        while True:
            [p] = status(skippr)
            [t] = p["tables"]
            if t["tail_changes"] >= 300 or time.time() > deadline:
                break
            time.sleep(0.3)
        assert p["state"] == "streaming", p
        assert t["tail_changes"] == 300, p
        assert t["lag_bytes"] > 0, p
        assert p["wal_bytes"] > 0, p
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (skippr.workdir / "bg.stderr").read_text()

    # SIGTERM commits the tail: nothing left behind, the committed LSN covers the writes.
    [p] = status(skippr, "--pipeline", "app")
    [t] = p["tables"]
    assert p["state"] == "stopped"
    assert t["tail_changes"] == 0
    assert t["rows"] == 800
    assert lsn_to_int(t["committed_lsn"]) >= written
    assert t["lag_seconds"] == 0


def test_status_text_and_unknown_pipeline(skippr: Skippr):
    skippr.db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    skippr.write_config(["t"])
    text = skippr.run("status", check=False)
    assert_no_panic(text)
    assert text.returncode == 0, describe_run(text)
    assert "pipeline app: unknown" in text.stdout
    assert "replication slot" in text.stdout  # not created yet: says so instead of failing
    bad = skippr.run("status", "--pipeline", "nope", check=False)
    assert_no_panic(bad)
    assert bad.returncode != 0
    assert "no pipeline named `nope`" in bad.stderr


def _scrape(port: int) -> dict[str, float]:
    """Series name (with labels) -> value, from the OpenMetrics text of `/metrics`."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers.get("Content-Type", "").startswith("application/openmetrics-text")
        body = resp.read().decode()
    assert body.endswith("# EOF\n"), body[-200:]
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def test_sync_serves_metrics_when_metrics_listen_is_set(skippr: Skippr):
    from conftest import free_port

    skippr.db.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int);"
        "INSERT INTO orders SELECT i, i FROM generate_series(1, 100) i;"
    )
    port = free_port()
    skippr.write_config(["orders"], metrics_listen=f"127.0.0.1:{port}", extra_pipeline={"commit_interval": "1h"})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        deadline = time.time() + 60
        metrics: dict[str, float] = {}
        while time.time() < deadline:
            try:
                metrics = _scrape(port)
            except OSError:
                metrics = {}
            if metrics.get('skippr_pipeline_state{pipeline="app",state="streaming"}') == 1.0:
                break
            time.sleep(0.3)
        assert metrics.get('skippr_pipeline_state{pipeline="app",state="streaming"}') == 1.0, metrics
        skippr.db.execute("INSERT INTO orders SELECT i, i FROM generate_series(101, 150) i")
        deadline = time.time() + 30
        while time.time() < deadline:
            metrics = _scrape(port)
            if metrics.get('skippr_source_changes_total{pipeline="app"}', 0) >= 50 and \
                    metrics.get('skippr_table_wal_tail_rows{table="orders"}', 0) >= 50:
                break
            time.sleep(0.3)
        assert metrics.get('skippr_source_changes_total{pipeline="app"}', 0) >= 50, metrics
        assert metrics.get('skippr_table_wal_tail_rows{table="orders"}', 0) >= 50, metrics
        assert metrics.get('skippr_table_committed_lsn{table="orders"}', 0) > 0, metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (skippr.workdir / "bg.stderr").read_text()


def test_sync_serves_no_metrics_without_metrics_listen(skippr: Skippr):
    """The default address belongs to serve: a sync without the setting binds nothing."""
    skippr.db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    skippr.write_config(["t"])
    proc = skippr.sync_once()
    assert "metrics at" not in proc.stderr
