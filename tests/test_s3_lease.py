"""More than one machine: with the WAL and state on S3 (moto server on localhost), each
running pipeline holds a lease object in the state prefix. A second `sync` of the same
pipeline from another config folder (as from another machine: its local lock is a different
file) is refused with the holder's host, pid and start time; after the holder is killed
with SIGKILL and its lease has expired, the second takes over and the result equals
Postgres. The watermark state is an object in the state prefix too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from conftest import Skippr, assert_no_panic, assert_rows_equal, describe_run, expected_rows, pg_table_spec
from test_athena_iceberg import STATE_BUCKET, Moto, flagship_config, moto, read_glue_pyiceberg  # noqa: F401

LEASE_KEY = "skippr/pipelines/app.lease.json"
STATE_KEY = "skippr/pipelines/app.state.json"
#: Short enough for a test, long enough that a busy machine still renews in time.
RENEW_S, EXPIRE_S = 1, 6


def _with_short_lease(s: Skippr) -> None:
    text = s.config_path.read_text()
    marker = f"  skipprd_el_storage_path: s3://{STATE_BUCKET}/skippr\n"
    assert marker in text
    s.config_path.write_text(
        text.replace(marker, marker + f"  lease:\n    renew_every: {RENEW_S}s\n    expire_after: {EXPIRE_S}s\n")
    )


def _lease(moto: Moto) -> dict | None:
    s3 = moto.client("s3")
    try:
        body = s3.get_object(Bucket=STATE_BUCKET, Key=LEASE_KEY)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return json.loads(body)


def _wait(cond, what: str, timeout: float = 120, proc=None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the holder exited early ({proc.returncode}) while waiting for {what}:\n"
                                 + (log.read_text() if log else ""))
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_two_syncs_one_is_refused_then_takes_over_after_the_holder_dies(skippr: Skippr, moto: Moto, tmp_path: Path) -> None:
    db = skippr.db
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text)")
    db.execute("INSERT INTO orders SELECT g, g * 0.5, 'o' || g FROM generate_series(1, 2000) g")
    flagship_config(skippr, ["orders"], commit_interval="1s")
    _with_short_lease(skippr)
    skippr.env.update(moto.env)

    # "Another machine": the same skippr.yml in another folder, so another local lock file.
    other_dir = tmp_path / "other-machine"
    other_dir.mkdir()
    shutil.copy(skippr.config_path, other_dir / "skippr.yml")
    other = Skippr(db=db, workdir=other_dir, env=dict(skippr.env))

    holder = skippr.start("sync", "--pipeline", "app")
    try:
        log = skippr.workdir / "bg.stderr"
        _wait(lambda: _lease(moto) is not None, "the holder's lease", proc=holder, log=log)
        lease = _lease(moto)
        assert lease is not None and lease["pid"] == holder.pid and not lease["released"], lease
        # The snapshot is committed and its state is an object in the state prefix.
        _wait(lambda: STATE_KEY in moto.keys(STATE_BUCKET, "skippr/pipelines/"), "the state object",
              proc=holder, log=log)
        renewed = lease["renewed_at"]
        _wait(lambda: (_lease(moto) or {}).get("renewed_at") != renewed, "a renewal", timeout=30,
              proc=holder, log=log)

        proc = other.run("sync", "--pipeline", "app", "--once", check=False, timeout=120)
        assert_no_panic(proc)
        assert proc.returncode != 0, describe_run(proc, "a second sync of a held pipeline ran")
        for needle in ("already running", f"pid {holder.pid}", lease["host"], "since ", "expire_after",
                       "app.lease.json"):
            assert needle in proc.stderr, describe_run(proc, f"expected `{needle}` in the refusal")

        # Changes the holder streams into the WAL on S3, then it dies without a word.
        db.execute("INSERT INTO orders SELECT g, 1.25, 'late' FROM generate_series(2001, 2300) g")
        db.execute("UPDATE orders SET amount = amount + 1, note = 'upd' WHERE id % 10 = 0")
        db.execute("DELETE FROM orders WHERE id % 7 = 0")
        time.sleep(2)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)

    # Killed, but its lease is still live: still refused.
    last = _lease(moto)
    assert last is not None and not last["released"]
    proc = other.run("sync", "--pipeline", "app", "--once", check=False, timeout=120)
    assert proc.returncode != 0 and "already running" in proc.stderr, describe_run(proc)

    # More changes while nobody runs the pipeline; then past the expiry the other takes over.
    db.execute("UPDATE orders SET note = 'after' WHERE id BETWEEN 100 AND 120")
    db.execute("INSERT INTO orders VALUES (9999, 1, 'last')")
    expires = time.mktime(time.strptime(last["expires_at"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    time.sleep(max(0.0, expires - time.time()) + 1.5)
    proc = other.run("sync", "--pipeline", "app", "--once", check=False, timeout=300)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "the second sync did not take over an expired lease")
    taken = _lease(moto)
    assert taken is not None and taken["token"] != last["token"], taken
    # It let go on its clean stop.
    assert taken["released"], taken

    spec = pg_table_spec(db, "orders")
    assert_rows_equal(expected_rows(db, spec), read_glue_pyiceberg(moto, "orders", ["id"]), spec, "pyiceberg")


def test_a_serve_replica_stands_by_and_takes_over(skippr: Skippr, moto: Moto, tmp_path: Path) -> None:
    """`serve` on "another machine" does not write a pipeline whose lease is held; once the
    holder dies and its lease expires, the replica takes the pipeline over and carries on."""
    from conftest import free_port

    db = skippr.db
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text)")
    db.execute("INSERT INTO orders SELECT g, g * 0.5, 'o' || g FROM generate_series(1, 500) g")
    flagship_config(skippr, ["orders"], commit_interval="1s")
    _with_short_lease(skippr)
    skippr.env.update(moto.env)
    other_dir = tmp_path / "replica"
    other_dir.mkdir()
    text = skippr.config_path.read_text().replace(
        "  lease:\n",
        f"  query:\n    listen: 127.0.0.1:{free_port()}\n  metrics:\n    listen: 127.0.0.1:{free_port()}\n  lease:\n",
    )
    (other_dir / "skippr.yml").write_text(text)
    replica = Skippr(db=db, workdir=other_dir, env=dict(skippr.env))

    holder = skippr.start("sync", "--pipeline", "app")
    standby = None
    try:
        _wait(lambda: (_lease(moto) or {}).get("pid") == holder.pid, "the holder's lease", proc=holder,
              log=skippr.workdir / "bg.stderr")
        standby = replica.start("serve")
        log = other_dir / "bg.stderr"
        _wait(lambda: "standing by" in log.read_text(), "the replica to stand by", timeout=60, proc=standby, log=log)
        assert (_lease(moto) or {}).get("pid") == holder.pid
        db.execute("INSERT INTO orders SELECT g, 2, 'later' FROM generate_series(501, 700) g")
        db.execute("DELETE FROM orders WHERE id % 5 = 0")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        _wait(lambda: (_lease(moto) or {}).get("pid") == standby.pid, "the replica to take over",
              timeout=EXPIRE_S * 10, proc=standby, log=log)
        db.execute("UPDATE orders SET note = 'after takeover' WHERE id < 50")
        spec = pg_table_spec(db, "orders")

        def caught_up() -> bool:
            try:
                got = read_glue_pyiceberg(moto, "orders", ["id"])
                assert_rows_equal(expected_rows(db, spec), got, spec, "pyiceberg")
                return True
            except AssertionError:
                return False

        _wait(caught_up, "the replica's commits to equal Postgres", timeout=120, proc=standby, log=log)
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
        if standby is not None and standby.poll() is None:
            standby.send_signal(signal.SIGTERM)
            standby.wait(timeout=60)
    assert (_lease(moto) or {}).get("released") is True
