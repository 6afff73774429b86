"""Tables added to a running pipeline, and one table copied again, as a user does it:
`skipprd sync --add-table` and `skipprd reload` tell the running `serve` (SIGHUP), which copies
the new table while its other tables keep their data and the gateway never shows the new
one half-copied; `sync --resnapshot --table` copies one table again, with a daemon running
and without one. Every table ends equal to Postgres, through the gateway and PyIceberg."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psycopg
import pytest

from conftest import Skippr, assert_no_panic, chunked_copy_writer, describe_run, free_port

BIG = 200_000


def wait_streaming(skippr: Skippr, proc, tables: int, timeout: float = 180) -> dict:
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, (skippr.workdir / "bg.stderr").read_text()[-4000:]
        p = skippr.pipeline_status()
        if p["state"] == "streaming" and len(p["tables"]) == tables:
            return p
        assert time.time() < deadline, p
        time.sleep(0.3)


def gateway(port: int) -> psycopg.Connection:
    deadline = time.time() + 60
    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr",
                                   autocommit=True, connect_timeout=10)
        except psycopg.OperationalError:
            assert time.time() < deadline, "the gateway did not listen within 60 s"
            time.sleep(0.3)


def figures(skippr: Skippr, table: str) -> tuple[int, int]:
    n, s = skippr.db.execute(f"SELECT count(*), coalesce(sum(v), 0) FROM {table}")[0]
    return int(n), int(s)


def wait_equal(skippr: Skippr, conn: psycopg.Connection, table: str, timeout: float = 120) -> None:
    want = figures(skippr, table)
    deadline = time.time() + timeout
    got = None
    while time.time() < deadline:
        try:
            row = conn.execute(f"SELECT count(*), coalesce(sum(v), 0) FROM analytics.{table}").fetchone()
            got = (int(row[0]), int(row[1]))
            if got == want:
                return
        except psycopg.Error as e:
            got = str(e)
        time.sleep(0.3)
    raise AssertionError(f"{table}: gateway shows {got}, Postgres has {want}")


@pytest.mark.concurrent
def test_a_table_added_to_a_running_serve_is_copied_whole_while_the_others_stream(skippr: Skippr):
    skippr.db.execute(
        "CREATE TABLE busy (id bigint PRIMARY KEY, v int NOT NULL);"
        "INSERT INTO busy SELECT g, g FROM generate_series(1, 1000) g;"
        f"CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, pad text);"
        f"INSERT INTO big SELECT g, g % 1000, repeat('x', 40) FROM generate_series(1, {BIG}) g;"
    )
    port = free_port()
    skippr.write_config(["busy"], extra_pipeline={"commit_interval": "1s"},
                        query={"listen": f"127.0.0.1:{port}"}, metrics_listen=f"127.0.0.1:{free_port()}")
    proc = skippr.start("serve")
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        # The busy table takes a transaction every few ms; the big one takes updates, inserts
        # and deletes all through its copy (they must land exactly once, after it).
        i = 0
        try:
            with skippr.db.connect() as c:
                while not stop.is_set():
                    i += 1
                    c.execute("UPDATE busy SET v = v + 1 WHERE id = %s", (1 + i % 1000,))
                    c.execute("INSERT INTO busy VALUES (%s, 0)", (10_000 + i,))
                    if i % 3 == 0:
                        c.execute("UPDATE big SET v = v + 7 WHERE id = %s", (1 + (i * 7919) % BIG,))
                        c.execute("INSERT INTO big VALUES (%s, 1, 'new')", (BIG + i,))
                        c.execute("DELETE FROM big WHERE id = %s", (1 + (i * 104729) % BIG,))
                    time.sleep(0.005)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(repr(e))

    thread = threading.Thread(target=writer, daemon=True)
    try:
        wait_streaming(skippr, proc, 1)
        conn = gateway(port)
        thread.start()
        time.sleep(1.5)

        # A skippr.yml that does not load changes nothing: `reload` names the problem, and a
        # daemon sent SIGHUP anyway goes on with what it runs.
        good = skippr.config_path.read_text()
        skippr.config_path.write_text(good + "\nthis is: [not valid\n")
        told = skippr.run("reload", check=False)
        assert_no_panic(told)
        assert told.returncode != 0 and "YAML" in told.stderr, describe_run(told)
        os.kill(proc.pid, signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        skippr.config_path.write_text(good)
        told = skippr.run("reload", check=False)
        assert told.returncode == 0 and f"pid {proc.pid}" in told.stdout, describe_run(told)

        added = skippr.run("sync", "--pipeline", "app", "--add-table", "big", check=False)
        assert_no_panic(added)
        assert added.returncode == 0, describe_run(added, "sync --add-table failed")
        assert f"pid {proc.pid}" in added.stdout, added.stdout
        assert "big" in skippr.config_path.read_text()

        # Until its copy commits, the new table is never shown half-copied.
        deadline = time.time() + 180
        seen_whole = False
        while time.time() < deadline and not seen_whole:
            try:
                n = conn.execute("SELECT count(*) FROM analytics.big").fetchone()[0]
                assert n >= BIG * 0.95, f"big read half-copied: {n} rows"
                seen_whole = True
            except psycopg.Error as e:
                msg = str(e)
                assert any(m in msg for m in ("being copied", "does not exist", "not found")), msg
                time.sleep(0.2)
        assert seen_whole, "big never became queryable"
        p = wait_streaming(skippr, proc, 2)
        assert {t["table"] for t in p["tables"]} >= {"analytics.busy", "analytics.big"}, p["tables"]
        time.sleep(2)
    except BaseException:
        proc.kill()
        raise
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=30)
    assert not errors, errors
    try:
        wait_equal(skippr, conn, "busy")
        wait_equal(skippr, conn, "big")
        # The busy table went on committing through the add.
        rounds = skippr.pipeline_status()["commit_rounds"]["count"]
        assert rounds >= 3, rounds
    finally:
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (skippr.workdir / "bg.stderr").read_text()[-3000:]
    # An independent reader sees the same rows.
    rows = skippr.table("big").scan(selected_fields=("v",)).to_arrow()
    assert (rows.num_rows, sum(rows.column("v").to_pylist())) == figures(skippr, "big")
    log = (skippr.workdir / "bg.stderr").read_text()
    assert "reload refused" in log
    # The table was copied in key chunks, each in a short transaction of its own.
    assert "copied in key chunks" in log and "chunks=1 " not in log, log[-3000:]


def snapshot_phases(skippr: Skippr, table: str) -> list[str]:
    return [s.summary.additional_properties.get("skippr.phase", "")
            for s in skippr.table(table).snapshots()]


@pytest.mark.concurrent
def test_one_table_is_copied_again_with_and_without_a_daemon(skippr: Skippr):
    skippr.db.execute(
        "CREATE TABLE a (id bigint PRIMARY KEY, v int NOT NULL);"
        "CREATE TABLE b (id bigint PRIMARY KEY, v int NOT NULL);"
        "INSERT INTO a SELECT g, g FROM generate_series(1, 5000) g;"
        "INSERT INTO b SELECT g, g FROM generate_series(1, 5000) g;"
    )
    skippr.write_config(["a", "b"], extra_pipeline={"commit_interval": "1s"})
    first = skippr.sync_once()
    assert first.returncode == 0, describe_run(first)
    b_before = len(skippr.table("b").snapshots())

    # A table the pipeline does not follow is refused, with the command that adds it.
    wrong = skippr.run("sync", "--pipeline", "app", "--resnapshot", "--table", "nope", check=False)
    assert_no_panic(wrong)
    assert wrong.returncode != 0 and "--add-table" in wrong.stderr, describe_run(wrong)

    # A table the source does not have is refused before skippr.yml is touched.
    before = skippr.config_path.read_text()
    typo = skippr.run("sync", "--pipeline", "app", "--add-table", "nope", check=False)
    assert_no_panic(typo)
    assert typo.returncode != 0 and "nope" in typo.stderr, describe_run(typo)
    assert skippr.config_path.read_text() == before

    # Without a daemon: this sync copies `a` again, and only `a`.
    skippr.db.execute("UPDATE a SET v = v + 1 WHERE id <= 100")
    again = skippr.run("sync", "--pipeline", "app", "--resnapshot", "--table", "a", "--once", check=False)
    assert_no_panic(again)
    assert again.returncode == 0, describe_run(again)
    assert "1 table(s) copied" in again.stdout, again.stdout
    assert snapshot_phases(skippr, "a").count("snapshot") == 2, snapshot_phases(skippr, "a")
    assert len(skippr.table("b").snapshots()) == b_before
    assert not (skippr.workdir / ".skippr" / "pipelines" / "app.resnapshot.json").exists()

    # With a daemon: it is told, and makes the copy while it streams.
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        wait_streaming(skippr, proc, 2)
        skippr.db.execute("UPDATE a SET v = v + 1 WHERE id > 4900; DELETE FROM a WHERE id < 10")
        told = skippr.run("sync", "--pipeline", "app", "--resnapshot", "--table", "public.a", check=False)
        assert_no_panic(told)
        assert told.returncode == 0 and f"pid {proc.pid}" in told.stdout, describe_run(told)
        deadline = time.time() + 120
        while snapshot_phases(skippr, "a").count("snapshot") < 3:
            assert proc.poll() is None, (skippr.workdir / "bg.stderr").read_text()[-4000:]
            assert time.time() < deadline, snapshot_phases(skippr, "a")
            time.sleep(0.3)
        skippr.db.execute("INSERT INTO a VALUES (9001, 1); UPDATE b SET v = 0 WHERE id = 1")
        wait_streaming(skippr, proc, 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (skippr.workdir / "bg.stderr").read_text()[-3000:]
    last = skippr.sync_once()
    assert last.returncode == 0, describe_run(last)
    assert "0 table(s) copied" in last.stdout, last.stdout
    for t in ("a", "b"):
        got = skippr.run("query", "--format", "json",
                         f"SELECT count(*) AS n, coalesce(sum(v), 0) AS s FROM {t}", check=False)
        assert got.returncode == 0, describe_run(got)
        [row] = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
        assert (int(row["n"]), int(row["s"])) == figures(skippr, t), t


@pytest.mark.concurrent
def test_a_crash_after_an_added_table_landed_loses_and_repeats_nothing(skippr: Skippr):
    """The added table's copy has landed (in key chunks) and the process dies before the table
    joins the stream, while both tables take changes: after the restart, each key of the
    added table takes exactly the changes its chunk had not seen."""
    skippr.db.execute(
        "CREATE TABLE busy (id bigint PRIMARY KEY, v int NOT NULL);"
        "INSERT INTO busy SELECT g, g FROM generate_series(1, 1000) g;"
        "CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL);"
        f"INSERT INTO big SELECT g, g % 1000 FROM generate_series(1, {BIG}) g;"
    )
    skippr.write_config(["busy"], extra_pipeline={"commit_interval": "1s"})
    proc = skippr.start("sync", "--pipeline", "app", env={"SKIPPR_TEST_PAUSE_AT": "after-chunked-copy"})
    stop = threading.Event()

    thread = chunked_copy_writer(skippr, stop, other="busy", other_rows=1000, big_rows=BIG,
                                 new_values="2", pause=0.003)
    try:
        wait_streaming(skippr, proc, 1)
        thread.start()
        added = skippr.run("sync", "--pipeline", "app", "--add-table", "big", check=False)
        assert added.returncode == 0 and f"pid {proc.pid}" in added.stdout, describe_run(added)
        deadline = time.time() + 120
        while "paused at after-chunked-copy" not in (skippr.workdir / "bg.stderr").read_text():
            assert proc.poll() is None, (skippr.workdir / "bg.stderr").read_text()[-4000:]
            assert time.time() < deadline, "the copy never landed"
            time.sleep(0.2)
        time.sleep(2)  # the other table streams on, the WAL keeps the added table's changes
        proc.kill()
        proc.wait(timeout=30)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=30)
        if proc.poll() is None:
            proc.kill()
    crashed = (skippr.workdir / "bg.stderr").read_text()
    assert "copied in key chunks" in crashed and "chunks=1 " not in crashed, crashed[-3000:]
    again = skippr.sync_once()
    assert again.returncode == 0, describe_run(again)
    assert "0 table(s) copied" in again.stdout, again.stdout
    for t in ("busy", "big"):
        got = skippr.run("query", "--format", "json",
                         f"SELECT count(*) AS n, coalesce(sum(v), 0) AS s, coalesce(sum(id), 0) AS k FROM {t}",
                         check=False)
        assert got.returncode == 0, describe_run(got)
        [row] = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
        want = skippr.db.execute(f"SELECT count(*), coalesce(sum(v), 0), coalesce(sum(id), 0) FROM {t}")[0]
        assert (int(row["n"]), int(row["s"]), int(row["k"])) == tuple(int(x) for x in want), t
    rows = skippr.table("big").scan(selected_fields=("id", "v")).to_arrow()
    want = skippr.db.execute("SELECT count(*), sum(v), sum(id) FROM big")[0]
    assert (rows.num_rows, sum(rows.column("v").to_pylist()), sum(rows.column("id").to_pylist())) == \
        tuple(int(x) for x in want)
