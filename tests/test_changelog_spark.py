"""The reader changelog tables exist for: Spark Structured Streaming (Spark 3.5, Iceberg 1.10
runtime) follows a changelog table with default options while Skippr streams, and its sink
ends with every change exactly once; the same query on the state table fails at the first
snapshot that is not an append, as Iceberg documents.

Skippr and Spark share an Iceberg REST catalog on loopback (tests/rest_catalog.py): Spark's
streaming source refreshes its table through the catalog at every micro-batch, which a table
loaded from one metadata file (how tests/spark.py reads the sqlite warehouse) never does.

The scenario is built once for the module (`streamed`): `sync --once` takes the snapshot of
two tables with `changelog:` (a single key and a composite key with a named changelog); three
streaming queries start (`readStream.format("iceberg").load(<table>)`, nothing else set),
writing parquet folders with their checkpoints: one per changelog table and one on the state
table `accounts`. Then a continuous `sync` (commit_interval 500ms) applies rounds of a mixed
workload (inserts, updates, key-changing updates, deletes, a row inserted and deleted in one
transaction); after each round, once the state tables equal Postgres, `processAllAvailable()`
lets every changelog query catch up and what its sink holds is recorded.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from conftest import Database, PgCluster, Skippr, _drop_database
from rest_catalog import RestCatalogServer
from test_cdc import bg_log, stop, wait_until_synced
from test_changelog import assert_changelog_rebuilds, replay, snapshots

WORKSPACE = "analytics"
#: state table -> (changelog table, key)
CHANGELOGS = {"accounts": ("accounts_changelog", ["id"]), "pairs": ("pairs_history", ["a", "b"])}
ROUNDS = 4
#: between the transactions of a round: longer than the commit interval, so that a round is
#: usually several commits, which the streams follow as Skippr makes them
PAUSE = 0.6

SETUP = """
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL,
                       changed_at timestamptz NOT NULL, tags text[]);
CREATE TABLE pairs (a integer, b integer, v text, PRIMARY KEY (a, b));
INSERT INTO accounts SELECT i, 'owner ' || i, i * 10, '2026-01-01 00:00:00.000001+00'::timestamptz
                            + i * interval '1 minute', ARRAY['t' || i] FROM generate_series(1, 60) i;
INSERT INTO pairs SELECT a, b, 'v' FROM generate_series(1, 6) a, generate_series(1, 4) b;
"""


def workload_round(db: Database, n: int) -> None:
    """Round `n` (1-based): every kind of change, several in one transaction and one per
    transaction."""
    base = 1000 * n
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("INSERT INTO accounts SELECT i, 'new ' || i, i, clock_timestamp(), NULL"
                         " FROM generate_series(%s::bigint, %s::bigint) i", (base + 1, base + 20))
            conn.execute("UPDATE accounts SET balance = balance + 1, changed_at = clock_timestamp(),"
                         " tags = tags || ARRAY['r' || %s::text] WHERE id %% 7 = %s", (n, n % 7))
        time.sleep(PAUSE)
        # a key change: the delete of the old key, the insert of the new one
        conn.execute("UPDATE accounts SET id = id + 100000 WHERE id = (SELECT min(id) FROM accounts"
                     " WHERE id < 100000 AND id %% 5 = %s)", (n % 5,))
        conn.execute("DELETE FROM accounts WHERE id IN (SELECT id FROM accounts WHERE id %% 11 = %s"
                     " ORDER BY id LIMIT 3)", (n,))
        time.sleep(PAUSE)
        with conn.transaction():
            # inserted, updated and deleted in one transaction: three changes
            conn.execute("INSERT INTO accounts VALUES (%s, 'brief', 1, now(), NULL)", (base + 999,))
            conn.execute("UPDATE accounts SET owner = 'briefer' WHERE id = %s", (base + 999,))
            conn.execute("DELETE FROM accounts WHERE id = %s", (base + 999,))
            conn.execute("UPDATE accounts SET owner = owner || ' v' || %s::text WHERE id = %s", (n, base + 5))
        time.sleep(PAUSE)
        with conn.transaction():
            conn.execute("UPDATE pairs SET v = v || %s::text WHERE a = %s", (n, n))
            conn.execute("UPDATE pairs SET b = b + 10 * %s WHERE a = %s AND b = 1", (n, (n % 6) + 1))
            conn.execute("DELETE FROM pairs WHERE a = %s AND b = 2", ((n + 2) % 6 + 1,))
            conn.execute("INSERT INTO pairs VALUES (%s, 1, 'round')", (100 + n,))


@dataclass
class RestSkippr(Skippr):
    """A Skippr whose tables live behind the REST catalog: `table` and `read_pyiceberg` (which
    test_changelog's helpers and `wait_until_synced` use) read through PyIceberg's REST client."""

    srv: RestCatalogServer | None = None
    _client: object = None

    def client(self):
        if self._client is None:
            self._client = self.srv.client()
        return self._client

    def table(self, name: str):
        return self.client().load_table((self.workspace, name))

    def read_pyiceberg(self, name: str, order_by: Sequence[str] = ()) -> list[dict]:
        rows = self.table(name).scan().to_arrow().to_pylist()
        if order_by:
            rows.sort(key=lambda r: tuple((r[c] is None, r[c]) for c in order_by))
        return rows


@dataclass
class Stream:
    """One streaming query, its parquet sink and checkpoint."""

    table: str
    query: object
    sink: Path

    def rows(self, spark) -> list[dict]:
        """What the sink holds: the files the file sink's log committed."""
        if not (self.sink / "_spark_metadata").exists():
            return []
        return spark.rows(spark.session.read.parquet(str(self.sink)))


@dataclass
class Streamed:
    skippr: RestSkippr
    srv: RestCatalogServer
    changelog_streams: dict[str, Stream]
    state_stream: Stream
    #: per round, per changelog: ((lsn, seq) keys the sink held, (lsn, seq) keys of the table)
    rounds: list[dict[str, tuple[list, list]]] = field(default_factory=list)
    state_error: str = ""
    #: the state stream's sink rows when it failed
    state_rows: list[dict] = field(default_factory=list)


def configure_spark_catalog(spark, srv: RestCatalogServer) -> str:
    """The REST catalog on the shared session, as a Spark user configures one; its name. A
    new name each time: the session keeps a catalog it has loaded, whatever its conf says
    later (another module's server on another port)."""
    name = "changelog_lake_" + secrets.token_hex(4)
    conf = {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": srv.uri,
            ".warehouse": srv.warehouse_name, ".cache-enabled": "false"}
    for k, v in conf.items():
        spark.session.conf.set(f"spark.sql.catalog.{name}{k}", v)
    return name


def start_stream(spark, root: Path, catalog: str, table: str) -> Stream:
    """`readStream.format("iceberg")` with default options, into a parquet folder."""
    sink = root / "sinks" / table
    df = spark.session.readStream.format("iceberg").load(f"{catalog}.{WORKSPACE}.{table}")
    query = (df.writeStream.format("parquet")
             .option("path", str(sink))
             .option("checkpointLocation", str(root / "checkpoints" / table))
             .queryName(f"follow_{table}_{secrets.token_hex(3)}")
             .trigger(processingTime="1 second")
             .start())
    return Stream(table, query, sink)


def change_keys(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted((r["_skippr_lsn"], r["_skippr_seq"]) for r in rows)


def write_config(skippr: Skippr, srv: RestCatalogServer) -> None:
    text = skippr.write_config(
        list(CHANGELOGS), workspace=WORKSPACE,
        extra_pipeline={"commit_interval": "500ms",
                        "tables": {"accounts": {"changelog": True},
                                   "pairs": {"changelog": {"table": "pairs_history"}}}},
    ).read_text()
    head, _, _ = text.partition("data_sinks:\n")
    skippr.write_raw_config(head + "data_sinks:\n  lake:\n    RestIceberg:\n"
                            f"      uri: {srv.uri}\n      warehouse: {srv.warehouse_name}\n")


@pytest.fixture(scope="module")
def streamed(pg: PgCluster, spark, tmp_path_factory) -> Iterator[Streamed]:
    root = tmp_path_factory.mktemp("changelog_spark")
    name = "t_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    db = Database(pg, name)
    srv = RestCatalogServer(root / "wh")
    streams: list[Stream] = []
    proc = None
    try:
        srv.start()
        workdir = root / "work"
        workdir.mkdir()
        skippr = RestSkippr(db=db, workdir=workdir, srv=srv)
        write_config(skippr, srv)
        db.execute(SETUP)
        skippr.sync_once()
        catalog = configure_spark_catalog(spark, srv)

        changelog_streams = {}
        for t, (log, _) in CHANGELOGS.items():
            changelog_streams[t] = start_stream(spark, root, catalog, log)
            streams.append(changelog_streams[t])
        state_stream = start_stream(spark, root, catalog, "accounts")
        streams.append(state_stream)
        result = Streamed(skippr, srv, changelog_streams, state_stream)

        proc = skippr.start("sync", "--pipeline", "app")
        for n in range(1, ROUNDS + 1):
            workload_round(db, n)
            wait_until_synced(skippr, db, list(CHANGELOGS), proc)
            seen = {}
            for t, (log, _) in CHANGELOGS.items():
                s = changelog_streams[t]
                s.query.processAllAvailable()
                seen[t] = (change_keys(s.rows(spark)), change_keys(skippr.read_pyiceberg(log)))
            result.rounds.append(seen)
        code = stop(proc)
        assert code == 0, f"sync exited {code}\n{bg_log(skippr)}"
        proc = None

        # The state table's query has met a snapshot with deletes by now.
        deadline = time.monotonic() + 60
        while state_stream.query.isActive and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not state_stream.query.isActive, "the stream of the state table is still running"
        error = state_stream.query.exception()
        assert error is not None, "the stream of the state table ended without an error"
        result.state_error = str(error)
        result.state_rows = state_stream.rows(spark)
        yield result
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for s in streams:
            try:
                s.query.stop()
            except Exception:
                pass
        srv.stop()
        _drop_database(pg, name)


def test_spark_streams_every_change_of_each_changelog_exactly_once(streamed: Streamed, spark) -> None:
    sk = streamed.skippr
    # After every round, each changelog query's sink held exactly the changelog's rows: none
    # missing, none twice.
    for n, seen in enumerate(streamed.rounds, 1):
        for t, (streamed_keys, table_keys) in seen.items():
            assert len(set(streamed_keys)) == len(streamed_keys), f"round {n}: a change of {t} streamed twice"
            assert streamed_keys == table_keys, (
                f"round {n}: the stream of {t}'s changelog holds {len(streamed_keys)} changes, the changelog "
                f"{len(table_keys)}; missing {sorted(set(table_keys) - set(streamed_keys))[:5]}, "
                f"extra {sorted(set(streamed_keys) - set(table_keys))[:5]}")
    for t, (log, key) in CHANGELOGS.items():
        # The changelog itself rebuilds the state table (equal to Postgres), appends only.
        table_rows = assert_changelog_rebuilds(sk, t, log, key)
        assert len(snapshots(sk.table(log))) > ROUNDS, "the changelog was committed in too few snapshots"
        # What Spark streamed is the changelog, row for row, each change once...
        rows = streamed.changelog_streams[t].rows(spark)
        by_change = {(r["_skippr_lsn"], r["_skippr_seq"]): r for r in rows}
        assert len(by_change) == len(rows), f"a change of {t} streamed twice"
        expected = {(r["_skippr_lsn"], r["_skippr_seq"]): r for r in table_rows}
        assert by_change.keys() == expected.keys()
        for k, r in expected.items():
            assert by_change[k] == r, f"{log} {k}: Spark streamed {by_change[k]}, the table holds {r}"
        # ... and replaying it rebuilds the state table.
        state = {tuple(r[c] for c in key): r for r in sk.read_pyiceberg(t)}
        rebuilt = replay(rows, key)
        assert rebuilt == state, f"replaying the streamed {log} does not rebuild {t}"
        # Every kind of change went through the stream.
        ops = {r["_skippr_op"] for r in rows}
        assert ops == {"insert", "update", "delete"}, ops
    # The key changes reached the stream as a delete of the old key right before an insert of
    # the new one.
    rows = sorted(streamed.changelog_streams["accounts"].rows(spark),
                  key=lambda r: (r["_skippr_lsn"], r["_skippr_seq"]))
    moved = [i for i, r in enumerate(rows) if r["_skippr_op"] == "insert" and r["id"] > 100000]
    assert len(moved) == ROUNDS, moved
    for i in moved:
        before = rows[i - 1]
        assert before["_skippr_op"] == "delete" and before["id"] == rows[i]["id"] - 100000, (before, rows[i])
        assert before["_skippr_lsn"] == rows[i]["_skippr_lsn"]


def test_spark_stream_of_the_state_table_fails_at_the_first_delete_snapshot(streamed: Streamed, spark) -> None:
    """The same query on the state table streams the appends, then stops at the first snapshot
    with deletes ("Cannot process overwrite snapshot", or "delete snapshot" for deletes
    alone), which is why changelog tables exist."""
    table = streamed.skippr.table("accounts")
    history = snapshots(table)
    error = streamed.state_error
    found = re.search(r"Cannot process (overwrite|delete) snapshot: (\d+)", error)
    assert found, f"the stream of the state table failed otherwise: {error[:2000]}"
    first = next(s for s in history if s.summary.operation.value not in ("append", "replace"))
    assert int(found.group(2)) == first.snapshot_id, (found.group(0), first)
    assert found.group(1) == first.summary.operation.value
    assert "streaming-skip-" in error, error[:2000]
    # Until then it streamed the rows the appends before it added.
    import pyarrow.parquet as pq

    added = 0
    for s in history:
        if s.snapshot_id == first.snapshot_id:
            break
        for m in s.manifests(table.io):
            if m.added_snapshot_id == s.snapshot_id and m.content.value == 0:
                for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
                    added += pq.ParquetFile(e.data_file.file_path.removeprefix("file://")).metadata.num_rows
    assert added >= 60
    assert len(streamed.state_rows) == added, (len(streamed.state_rows), added)
    assert len({r["id"] for r in streamed.state_rows}) == added
