"""No silent loss on the sink side: every case below either ends with PyIceberg, DuckDB and
`skipprd query` equal to Postgres row for row, or with skipprd refusing (naming the table, the
cause and the fix) before anything of the case reaches Iceberg.

* a replica identity other than the primary key (another unique index, or NOTHING) is refused
  at start with the SQL that fixes it; changed behind the pipeline's back, the first UPDATE or
  DELETE it garbles stops the sync; an UPDATE or DELETE of a row Iceberg does not hold stops it;
* a large (TOAST) value an update left unchanged keeps its value after its column was renamed;
* commits are durable and ordered: killed after the files of a commit but before the catalog
  swap, or after the swap but before the WAL is deleted, a restart ends equal to Postgres;
* a value that cannot be stored stops the sync before it is committed, and fixing the row at
  the source lets the next run through without `--resnapshot`; dropping NOT NULL at the source
  makes the Iceberg field optional."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Database, Skippr, assert_no_panic, describe_run
from test_cdc import (
    ALL_READERS,
    assert_fails,
    assert_synced,
    bg_log,
    insert_lsn,
    primary_key_dups,
    stop,
    tx,
    wait_until_synced,
)
from test_live import start_live, wait_live

PAUSE_ENV = "SKIPPR_TEST_PAUSE_AT"


def wal_segments(skippr: Skippr) -> list[Path]:
    return sorted((skippr.workdir / ".skippr" / "wal" / "app").glob("*.seg"))


def synced_round(skippr: Skippr, db: Database, table: str, *statements: str) -> None:
    """Runs `statements`, one `sync --once`, and checks every reader against Postgres."""
    before = insert_lsn(db)
    for st in statements:
        db.execute(st)
    skippr.sync_once()
    assert_synced(skippr, db, [table], changed_since=before, changed=[table])


def fails_twice(skippr: Skippr, must_name: list[str], what: str) -> list[subprocess.CompletedProcess]:
    """`sync --once` fails naming `must_name`, and fails again when run again: the change
    that stopped it is not skipped."""
    return [assert_fails(skippr, must_name=must_name, what=f"{what} ({attempt})")
            for attempt in ("first run", "second run (must not skip it)")]


def snapshot_ids(skippr: Skippr, name: str) -> list[int]:
    return [s.snapshot_id for s in skippr.table(name).snapshots()]


# --------------------------------------------------------------------------------------------
# 1. Replica identity other than the primary key
# --------------------------------------------------------------------------------------------

IDENTITY_SETUP = """
CREATE TABLE members (id integer PRIMARY KEY, email text NOT NULL, name text);
CREATE UNIQUE INDEX members_email ON members (email);
CREATE UNIQUE INDEX members_id_email ON members (id, email);
INSERT INTO members SELECT i, 'm' || i || '@example.com', 'member ' || i FROM generate_series(1, 20) i;
"""

FIX_SQL = 'ALTER TABLE "public"."members" REPLICA IDENTITY DEFAULT;'

BAD_IDENTITIES = {
    "other_index": ("ALTER TABLE members REPLICA IDENTITY USING INDEX members_email", "members_email"),
    "nothing": ("ALTER TABLE members REPLICA IDENTITY NOTHING", "NOTHING"),
}


@pytest.mark.parametrize("kind", list(BAD_IDENTITIES))
def test_replica_identity_without_the_key_is_refused_with_the_fix(skippr: Skippr, db: Database, kind):
    db.execute(IDENTITY_SETUP)
    ddl, named = BAD_IDENTITIES[kind]
    db.execute(ddl)
    skippr.write_config(["members"])

    discover = skippr.run("discover", "--pipeline", "app", check=False)
    assert_no_panic(discover)
    assert discover.returncode != 0, describe_run(discover, "discover must report the failed check")
    for s in ("members", named, FIX_SQL):
        assert s in discover.stdout, describe_run(discover, f"discover does not mention {s!r}")

    assert_fails(skippr, must_name=["members", named, FIX_SQL],
                 what=f"replica identity {kind}")
    # refused before anything: no slot, no Iceberg snapshot
    assert db.execute("SELECT 1 FROM pg_replication_slots") == []
    assert not (skippr.warehouse / "catalog.db").exists() \
        or not skippr.catalog().table_exists((skippr.workspace, "members")) \
        or skippr.table("members").current_snapshot() is None

    # the fix the message names works, and deletes and key changes then arrive keyed
    db.execute(FIX_SQL)
    skippr.sync_once()
    synced_round(skippr, db, "members",
                 "DELETE FROM members WHERE id IN (1, 2)",
                 "UPDATE members SET id = 100 WHERE id = 3",
                 "UPDATE members SET email = 'changed@example.com' WHERE id = 4",
                 "INSERT INTO members VALUES (5000, 'new@example.com', NULL)")


def test_identity_index_that_includes_the_key_is_accepted(skippr: Skippr, db: Database):
    db.execute(IDENTITY_SETUP)
    db.execute("ALTER TABLE members REPLICA IDENTITY USING INDEX members_id_email")
    skippr.write_config(["members"])
    discover = skippr.run("discover", "--pipeline", "app")
    assert "change identity of public.members: primary key (id)" in discover.stdout, discover.stdout
    skippr.sync_once()
    synced_round(skippr, db, "members",
                 "DELETE FROM members WHERE id IN (1, 2)",
                 "UPDATE members SET id = 100 WHERE id = 3",
                 "UPDATE members SET email = 'changed@example.com' WHERE id = 4",
                 "UPDATE members SET name = 'renamed' WHERE id = 5")
    rows = skippr.read_pyiceberg("members", ["id"])
    assert not primary_key_dups(rows, ["id"])


def test_identity_changed_behind_the_pipeline_stops_at_the_first_garbled_delete(skippr: Skippr, db: Database):
    db.execute(IDENTITY_SETUP)
    skippr.write_config(["members"])
    skippr.sync_once()
    rows_before = skippr.read_pyiceberg("members", ["id"])
    # between two runs: the identity moves to another index, a row is deleted (Postgres
    # sends only its email), and the identity moves back, so the start check passes
    db.execute("ALTER TABLE members REPLICA IDENTITY USING INDEX members_email")
    db.execute("DELETE FROM members WHERE id = 7")
    db.execute("ALTER TABLE members REPLICA IDENTITY DEFAULT")
    db.execute("INSERT INTO members VALUES (77, 'later@example.com', 'after')")
    for proc in fails_twice(skippr, ["members", "REPLICA IDENTITY DEFAULT", "--resnapshot"],
                            "a DELETE without its key"):
        assert "does not include its key" in proc.stderr, describe_run(proc)
    assert skippr.read_pyiceberg("members", ["id"]) == rows_before, "Iceberg changed although the sync stopped"
    proc = skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot")
    assert_no_panic(proc)
    assert_synced(skippr, db, ["members"])


# --------------------------------------------------------------------------------------------
# 4. Unchanged TOAST values after a rename
# --------------------------------------------------------------------------------------------

DOCS_SETUP = """
CREATE TABLE docs (id integer PRIMARY KEY, title text, body text, version integer NOT NULL DEFAULT 0);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE FUNCTION big_text(seed text) RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT string_agg(md5(random()::text || seed || g), '') FROM generate_series(1, 1000) g
$$;
INSERT INTO docs SELECT i, 'title ' || i, big_text(i::text), 0 FROM generate_series(1, 12) i;
"""


def assert_contents_kept(skippr: Skippr, db: Database, column: str) -> None:
    pg = dict(db.execute(f"SELECT id, md5({column}) FROM docs"))
    got = {r["id"]: r[column] for r in skippr.read_pyiceberg("docs")}
    lost = [i for i, h in pg.items() if h is not None and got.get(i) is None]
    assert not lost, f"docs: unchanged TOAST `{column}` became NULL after the rename for ids {sorted(lost)}"


def test_unchanged_toast_value_survives_a_rename(skippr: Skippr, db: Database):
    db.execute(DOCS_SETUP)
    skippr.write_config(["docs"])
    skippr.sync_once()
    # one round: the previous version is in the snapshot's file, written under the old name
    before = insert_lsn(db)
    db.execute("ALTER TABLE docs RENAME COLUMN body TO content")
    db.execute("UPDATE docs SET title = title || ' v1' WHERE id <= 4")
    tx(db, "UPDATE docs SET version = 1 WHERE id = 5", "UPDATE docs SET title = 'twice' WHERE id = 5")
    skippr.sync_once()
    assert_contents_kept(skippr, db, "content")
    assert_synced(skippr, db, ["docs"], changed_since=before, changed=["docs"])
    # next round: renamed again; previous versions in files of both names (snapshot, CDC)
    before = insert_lsn(db)
    db.execute("ALTER TABLE docs RENAME COLUMN content TO text_body")
    db.execute("UPDATE docs SET version = version + 1")
    skippr.sync_once()
    assert_contents_kept(skippr, db, "text_body")
    assert_synced(skippr, db, ["docs"], changed_since=before, changed=["docs"])


def test_live_query_fills_unchanged_toast_value_after_a_rename(skippr: Skippr, db: Database):
    """The column was renamed (committed: the Iceberg field keeps its id, the snapshot's file
    keeps the old name); updates that leave it untouched are only in the WAL tail, and
    `skipprd query` fills the value from the committed row, matched by field id."""
    db.execute(DOCS_SETUP)
    skippr.write_config(["docs"])
    skippr.sync_once()
    db.execute("ALTER TABLE docs RENAME COLUMN body TO content")
    db.execute("UPDATE docs SET version = 1 WHERE id = 12")
    skippr.sync_once()
    assert skippr.table("docs").schema().find_field("content").field_id == 3
    proc = start_live(skippr, ["docs"])
    try:
        db.execute("UPDATE docs SET title = 'live' WHERE id IN (1, 2)")
        tx(db, "UPDATE docs SET version = 5 WHERE id = 3", "UPDATE docs SET title = 't' WHERE id = 3")
        wait_live(skippr, ["docs"], proc)
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    assert_contents_kept(skippr, db, "content")
    assert_synced(skippr, db, ["docs"])


# --------------------------------------------------------------------------------------------
# 7. Durable, ordered commits: a kill between the steps of a commit
# --------------------------------------------------------------------------------------------

CRASH_SETUP = """
CREATE TABLE ledger (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, note text);
CREATE TABLE tags (a integer, b integer, v text, PRIMARY KEY (a, b));
INSERT INTO ledger SELECT i, i * 1.25, 'n' || i FROM generate_series(1, 500) i;
INSERT INTO tags SELECT a, b, 'v' FROM generate_series(1, 10) a, generate_series(1, 10) b;
"""


def kill_at(skippr: Skippr, point: str, timeout: float = 120.0) -> None:
    """Runs `sync --once` with the test hook set to `point`, waits until it pauses there, and
    SIGKILLs it."""
    proc = skippr.start("sync", "--pipeline", "app", "--once", env={PAUSE_ENV: point})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            err = (skippr.workdir / "bg.stderr").read_text(errors="replace")
            if f"paused at {point}" in err:
                break
            if proc.poll() is not None:
                raise AssertionError(f"sync exited ({proc.returncode}) before reaching {point}\n{bg_log(skippr)}")
            time.sleep(0.1)
        else:
            raise AssertionError(f"sync did not reach {point} within {timeout}s\n{bg_log(skippr)}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def crash_round(db: Database, n: int = 1) -> None:
    tx(db, f"INSERT INTO ledger SELECT i, i, 'new' FROM generate_series({n * 1000 + 1}, {n * 1000 + 100}) i",
           "UPDATE ledger SET amount = amount + 1, note = 'upd' WHERE id % 7 = 0",
           "DELETE FROM ledger WHERE id % 11 = 0")
    tx(db, f"UPDATE ledger SET id = id + {n * 10000} WHERE id BETWEEN {n * 20} AND {n * 20 + 10}",
           f"DELETE FROM tags WHERE a = {n}", "UPDATE tags SET v = 'w' WHERE b = 2",
           f"INSERT INTO tags VALUES ({n * 50}, 50, 'x')")


@pytest.mark.parametrize("point", ["before-catalog-swap", "before-wal-removal"])
def test_killed_between_the_steps_of_a_commit(skippr: Skippr, db: Database, point):
    db.execute(CRASH_SETUP)
    skippr.write_config(["ledger", "tags"])
    skippr.sync_once()
    committed = {t: snapshot_ids(skippr, t) for t in ("ledger", "tags")}
    old_rows = skippr.read_pyiceberg("ledger", ["id"])

    before = insert_lsn(db)
    crash_round(db)
    kill_at(skippr, point)
    assert wal_segments(skippr), "the changes must still be in the WAL after the kill"
    if point == "before-catalog-swap":
        # the files of the first commit are written, but no reader sees them
        assert snapshot_ids(skippr, "ledger") == committed["ledger"]
        assert skippr.read_pyiceberg("ledger", ["id"]) == old_rows
        assert skippr.read_duckdb("ledger", ["id"]) == skippr.read_pyiceberg("ledger", ["id"])
    else:
        # both tables committed; the WAL they cover was not deleted yet
        for t in ("ledger", "tags"):
            assert len(snapshot_ids(skippr, t)) == len(committed[t]) + 1, t
            skippr.assert_table_matches(t, ("pyiceberg", "duckdb"))
    # the live view is already right: Iceberg plus the WAL tail
    for t in ("ledger", "tags"):
        skippr.assert_table_matches(t, ("query",))

    skippr.sync_once()
    assert_synced(skippr, db, ["ledger", "tags"], changed_since=before, changed=["ledger", "tags"])
    assert not wal_segments(skippr), "the WAL was not removed after the restart committed it"
    for t, key in (("ledger", ["id"]), ("tags", ["a", "b"])):
        assert not primary_key_dups(skippr.read_pyiceberg(t, key), key), f"{t}: duplicates after the restart"

    # and the pipeline goes on normally
    before = insert_lsn(db)
    crash_round(db, 2)
    skippr.sync_once()
    assert_synced(skippr, db, ["ledger", "tags"], changed_since=before, changed=["ledger", "tags"])


def test_killed_before_the_swap_of_a_snapshot(skippr: Skippr, db: Database):
    """The first snapshot's commit goes through the same durable swap."""
    db.execute(CRASH_SETUP)
    skippr.write_config(["ledger", "tags"])
    kill_at(skippr, "before-catalog-swap")
    db.execute("UPDATE ledger SET note = 'after the kill' WHERE id < 10")
    skippr.sync_once()
    assert_synced(skippr, db, ["ledger", "tags"])


# --------------------------------------------------------------------------------------------
# 9. Fail before committing; a fix at the source lets the next run through
# --------------------------------------------------------------------------------------------

PRICES_SETUP = """
CREATE TABLE prices (id integer PRIMARY KEY, price numeric(10,2), label text NOT NULL);
CREATE TABLE other (id integer PRIMARY KEY, v text);
INSERT INTO prices SELECT i, i * 1.5, 'p' || i FROM generate_series(1, 10) i;
INSERT INTO other VALUES (1, 'a');
"""


def test_unrepresentable_value_stops_and_a_source_fix_resumes(skippr: Skippr, db: Database):
    db.execute(PRICES_SETUP)
    skippr.write_config(["prices", "other"])
    skippr.sync_once()
    rows_before = skippr.read_pyiceberg("prices", ["id"])

    db.execute("INSERT INTO prices VALUES (11, 'NaN', 'not a number')")
    db.execute("INSERT INTO prices VALUES (12, 3.25, 'fine')")
    db.execute("UPDATE prices SET price = 99 WHERE id = 1")
    db.execute("INSERT INTO other VALUES (2, 'b')")
    fails_twice(skippr, ["prices", "`price`", "update or delete the row"], "a NaN numeric")
    assert skippr.read_pyiceberg("prices", ["id"]) == rows_before, "prices changed although the sync stopped"

    # the fix: the row gets a representable value at the source; no --resnapshot
    before = insert_lsn(db)
    db.execute("UPDATE prices SET price = NULL WHERE id = 11")
    skippr.sync_once()
    assert_synced(skippr, db, ["prices", "other"], changed_since=before, changed=["prices"])


def test_unrepresentable_value_in_the_wal_then_continuous_sync_after_the_fix(skippr: Skippr, db: Database):
    db.execute(PRICES_SETUP)
    skippr.write_config(["prices", "other"], extra_pipeline={"commit_interval": "1s"})
    skippr.sync_once()
    db.execute("INSERT INTO prices VALUES (11, 'NaN', 'bad')")
    assert_fails(skippr, must_name=["prices", "`price`"], what="a NaN numeric")
    assert wal_segments(skippr), "the change must stay in the WAL"
    # continuous sync starts with the bad change in its WAL; the fix comes through the stream
    db.execute("DELETE FROM prices WHERE id = 11")
    db.execute("INSERT INTO prices VALUES (13, 1.00, 'after the fix')")
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        wait_until_synced(skippr, db, ["prices", "other"], proc)
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    assert_synced(skippr, db, ["prices", "other"])


def test_dropping_not_null_makes_the_field_optional(skippr: Skippr, db: Database):
    db.execute(PRICES_SETUP)
    skippr.write_config(["prices"])
    skippr.sync_once()
    assert skippr.table("prices").schema().find_field("label").required

    # detected from the catalog when the relation message arrives, before any NULL does
    db.execute("ALTER TABLE prices ALTER COLUMN label DROP NOT NULL")
    db.execute("UPDATE prices SET label = 'still set' WHERE id = 1")
    skippr.sync_once()
    assert not skippr.table("prices").schema().find_field("label").required
    assert_synced(skippr, db, ["prices"])

    synced_round(skippr, db, "prices",
                 "INSERT INTO prices VALUES (20, 1, NULL)",
                 "UPDATE prices SET label = NULL WHERE id = 2")


def test_not_null_dropped_and_null_written_in_one_window(skippr: Skippr, db: Database):
    db.execute(PRICES_SETUP)
    skippr.write_config(["prices"])
    skippr.sync_once()
    tx(db, "ALTER TABLE prices ALTER COLUMN label DROP NOT NULL",
           "INSERT INTO prices VALUES (21, 2, NULL)")
    db.execute("UPDATE prices SET label = NULL WHERE id = 3")
    skippr.sync_once()
    assert not skippr.table("prices").schema().find_field("label").required
    assert_synced(skippr, db, ["prices"])
