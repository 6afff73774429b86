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


def test_snapshot_progress_shows_while_it_runs(skippr: Skippr):
    """Rows copied, Postgres's estimate, rate and time left, per table, in `status` (JSON and
    text) and in the metrics, while the snapshot runs and once it is done."""
    from conftest import free_port

    rows = 2_000_000
    skippr.db.execute(
        "CREATE TABLE big (id bigint PRIMARY KEY, v int, h text);"
        f"INSERT INTO big SELECT i, i, md5(i::text) FROM generate_series(1, {rows}) i;"
        "ANALYZE big;"
    )
    port = free_port()
    skippr.write_config(["big"], extra_source={"snapshot_parallelism": 1},
                        metrics_listen=f"127.0.0.1:{port}", extra_pipeline={"commit_interval": "1h"})
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        samples: list[dict] = []
        text_during = None
        deadline = time.time() + 300
        while time.time() < deadline:
            [p] = status(skippr)
            snap = p.get("snapshot") or []
            if snap:
                samples.append({"state": p["state"], **snap[0]})
                if not snap[0]["done"] and snap[0]["rows_copied"] > 0 and text_during is None:
                    text_during = skippr.run("status", check=False).stdout
            if snap and snap[0]["done"] and p["state"] == "streaming":
                break
            time.sleep(0.2)
        assert samples, "status never showed the snapshot"
        final = samples[-1]
        assert final["table"] == "public.big" and final["done"], samples[-3:]
        assert final["rows_copied"] == rows and final["eta_seconds"] is None, final
        assert 0.5 * rows <= final["rows_estimated"] <= 1.5 * rows, final
        assert final["rows_per_second"] > 0, final
        # While it ran: part of the rows, a rate and the time left, in JSON and in text.
        running = [s for s in samples if not s["done"] and 0 < s["rows_copied"] < rows]
        assert running, f"no sample while the copy ran: {samples[:3]} .. {samples[-3:]}"
        assert all(s["state"] == "starting" for s in running), running
        assert any(s["eta_seconds"] is not None and s["eta_seconds"] > 0 for s in running), running
        copied = [s["rows_copied"] for s in samples]
        assert copied == sorted(copied), copied
        assert text_during is not None and "snapshot:" in text_during and "public.big" in text_during \
            and "rows/s, eta" in text_during, text_during
        metrics = _scrape(port)
        series = '{pipeline="app",table="public.big"}'
        assert metrics.get(f"skippr_snapshot_rows_copied{series}") == rows, metrics
        assert metrics.get(f"skippr_snapshot_rows_estimated{series}", 0) > 0, metrics
        assert metrics.get(f"skippr_snapshot_eta_seconds{series}") == 0, metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (skippr.workdir / "bg.stderr").read_text()
    # Once it is done, the text shows the tables again, not the finished copy.
    text = skippr.run("status", check=False).stdout
    assert "snapshot:" not in text, text
