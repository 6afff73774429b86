"""Changelog tables (`pipelines.<p>.tables.<t>.changelog`): every change of a table as a row
of an append-only Iceberg table beside it, committed in the same round and at the same LSN.

Read back with PyIceberg, as an engine outside Skippr would: replaying each changelog's rows
in (`_skippr_lsn`, `_skippr_seq`) order rebuilds the table exactly (which equals Postgres);
every snapshot of a changelog is an `append`; reading each snapshot's added files once yields
every change once; after SIGKILLs of a running `sync`, no change is missing or twice."""

from __future__ import annotations

import json
import random
import signal
import time

from conftest import Skippr, assert_no_panic
from test_cdc import bg_log, stop, wait_paused

META = ["_skippr_op", "_skippr_lsn", "_skippr_commit_time", "_skippr_seq"]

SETUP = """
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL,
                       doc text, tags text[]);
ALTER TABLE accounts ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE pairs (a integer, b integer, v text, PRIMARY KEY (a, b));
INSERT INTO accounts SELECT i, 'owner ' || i, i * 10, NULL, ARRAY['t' || i] FROM generate_series(1, 50) i;
INSERT INTO pairs SELECT a, b, 'v' FROM generate_series(1, 5) a, generate_series(1, 4) b;
"""


def snapshots(table) -> list:
    return sorted(table.metadata.snapshots, key=lambda s: s.sequence_number)


def changelog_rows(skippr: Skippr, name: str) -> list[dict]:
    return [dict(r) for r in skippr.table(name).scan().to_arrow().to_pylist()]


def replay(rows: list[dict], key: list[str]) -> dict[tuple, dict]:
    """The table a changelog's rows rebuild: applied in (`_skippr_lsn`, `_skippr_seq`) order."""
    state: dict[tuple, dict] = {}
    for r in sorted(rows, key=lambda r: (r["_skippr_lsn"], r["_skippr_seq"])):
        k = tuple(r[c] for c in key)
        values = {c: v for c, v in r.items() if c not in META}
        if r["_skippr_op"] == "delete":
            assert k in state, f"a delete of {k} that the changelog never inserted: {r}"
            del state[k]
        elif r["_skippr_op"] == "update":
            assert k in state, f"an update of {k} that the changelog never inserted: {r}"
            state[k] = values
        else:
            assert r["_skippr_op"] == "insert", r
            state[k] = values
    return state


def assert_changelog_rebuilds(skippr: Skippr, table: str, changelog: str, key: list[str]) -> list[dict]:
    """The changelog replays to the state table (which equals Postgres), every snapshot of it
    is an append, and the snapshots' added files hold each change once."""
    skippr.assert_table_matches(table, readers=("pyiceberg",))
    rows = changelog_rows(skippr, changelog)
    seen = [(r["_skippr_lsn"], r["_skippr_seq"]) for r in rows]
    assert len(seen) == len(set(seen)), "a change is in the changelog twice"
    state_rows = skippr.read_pyiceberg(table)
    expected = {tuple(r[c] for c in key): dict(r) for r in state_rows}
    rebuilt = replay(rows, key)
    assert rebuilt.keys() == expected.keys(), (
        f"keys rebuilt from the changelog differ: missing {sorted(expected.keys() - rebuilt.keys())[:5]}, "
        f"extra {sorted(rebuilt.keys() - expected.keys())[:5]}")
    for k, v in expected.items():
        assert rebuilt[k] == v, f"{table} {k}: the changelog rebuilds {rebuilt[k]}, the table holds {v}"
    log = skippr.table(changelog)
    ops = [s.summary.operation.value for s in snapshots(log)]
    # Appends of changes; and `replace` snapshots of maintenance that merge files (the same
    # rows), which streaming readers skip by design.
    assert ops and all(op in ("append", "replace") for op in ops), f"snapshots of {changelog}: {ops}"
    for s in snapshots(log):
        if s.summary.operation.value == "replace":
            assert s.summary["skippr.maintenance"] == "compaction", s.summary
            assert s.summary["added-records"] == s.summary["deleted-records"], s.summary
    # An incremental reader: each append's added data files, read once, give every change once.
    import pyarrow.parquet as pq

    added = 0
    retained = {s.snapshot_id for s in log.metadata.snapshots}
    for s in snapshots(log):
        if s.summary.operation.value != "append":
            continue
        for m in s.manifests(log.io):
            if m.added_snapshot_id != s.snapshot_id:
                continue
            for e in m.fetch_manifest_entry(log.io, discard_deleted=True):
                path = e.data_file.file_path.removeprefix("file://")
                added += pq.ParquetFile(path).metadata.num_rows
    if all(s.parent_snapshot_id is None or s.parent_snapshot_id in retained for s in log.metadata.snapshots):
        # Every append is still there (none expired): together they added each row once.
        assert added == len(rows), f"the appends of {changelog} added {added} rows; the table holds {len(rows)}"
    return rows


def test_changelog_rebuilds_the_table_and_every_snapshot_appends(skippr: Skippr) -> None:
    db = skippr.db
    db.execute(SETUP)
    skippr.write_config(
        ["accounts", "pairs"],
        extra_pipeline={"tables": {"accounts": {"changelog": True},
                                   "pairs": {"changelog": {"table": "pairs_history"}}}},
    )
    skippr.sync_once()
    rows = assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])
    # The first snapshot: one insert per row, at the snapshot's LSN.
    assert len(rows) == 50 and {r["_skippr_op"] for r in rows} == {"insert"}, rows[:3]
    assert len({r["_skippr_lsn"] for r in rows}) == 1
    snapshot_lsn = rows[0]["_skippr_lsn"]
    assert_changelog_rebuilds(skippr, "pairs", "pairs_history", ["a", "b"])

    big = "x" * 200_000  # stored out of line (TOAST): an update of other columns leaves it unchanged
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("UPDATE accounts SET doc = %s WHERE id <= 3", (big,))
        with conn.transaction():
            # Inserted and deleted in one transaction: two rows.
            conn.execute("INSERT INTO accounts VALUES (1000, 'brief', 1, NULL, NULL)")
            conn.execute("DELETE FROM accounts WHERE id = 1000")
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 5")
        with conn.transaction():
            # A key change: a delete of the old key, an insert of the new one.
            conn.execute("UPDATE accounts SET id = 2000 WHERE id = 10")
            conn.execute("UPDATE pairs SET b = 40 WHERE a = 1 AND b = 4")
            conn.execute("DELETE FROM pairs WHERE a = 2")
        conn.execute("DELETE FROM accounts WHERE id BETWEEN 20 AND 25")
    skippr.sync_once()
    rows = assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])
    assert_changelog_rebuilds(skippr, "pairs", "pairs_history", ["a", "b"])
    after = sorted((r for r in rows if r["_skippr_lsn"] > snapshot_lsn),
                   key=lambda r: (r["_skippr_lsn"], r["_skippr_seq"]))
    ops = [(r["_skippr_op"], r["id"]) for r in after]
    assert ops[:3] == [("update", 1), ("update", 2), ("update", 3)], ops
    assert ops[3:5] == [("insert", 1000), ("delete", 1000)], ops
    assert ("delete", 10) in ops and ("insert", 2000) in ops, ops
    assert ops.index(("delete", 10)) + 1 == ops.index(("insert", 2000)), ops
    # Updates whose TOASTed value was unchanged hold it (read from the table's previous row).
    for r in after:
        if r["_skippr_op"] == "update" and r["id"] in (1, 2, 3):
            assert r["doc"] == big, f"update of {r['id']} lacks the unchanged TOASTed value"
    deletes = [r for r in after if r["_skippr_op"] == "delete" and 20 <= r["id"] <= 25]
    assert len(deletes) == 6 and all(r["owner"] is None for r in deletes), deletes  # the old key only
    assert all(r["_skippr_commit_time"] is not None for r in after)

    # A column added at the source reaches the changelog; so does a TRUNCATE (a delete per row).
    with db.connect() as conn:
        conn.execute("ALTER TABLE accounts ADD COLUMN region text")
        conn.execute("INSERT INTO accounts VALUES (3000, 'new', 3, NULL, NULL, 'eu')")
        conn.execute("TRUNCATE pairs")
        conn.execute("INSERT INTO pairs VALUES (9, 9, 'after')")
    skippr.sync_once()
    rows = assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])
    assert [r["region"] for r in rows if r["id"] == 3000] == ["eu"]
    assert_changelog_rebuilds(skippr, "pairs", "pairs_history", ["a", "b"])
    # `skipprd query` reads it as the committed history it is.
    proc = skippr.run("query", "SELECT _skippr_op, count(*) AS n FROM analytics.pairs_history "
                      "GROUP BY _skippr_op ORDER BY _skippr_op", "--format", "json")
    counts = {r["_skippr_op"]: r["n"] for r in (json.loads(x) for x in proc.stdout.splitlines() if x.strip())}
    logged = changelog_rows(skippr, "pairs_history")
    assert counts == {op: sum(1 for r in logged if r["_skippr_op"] == op)
                      for op in {r["_skippr_op"] for r in logged}}, counts


def test_a_changelog_after_sigkills_holds_every_change_once(skippr: Skippr) -> None:
    """A writer changes the table while `sync` commits every 200 ms and is killed six times;
    after a last `sync --once`, the changelog has every change once and rebuilds the table."""
    db = skippr.db
    db.execute(SETUP)
    skippr.write_config(["accounts"], extra_pipeline={"commit_interval": "200ms",
                                                     "tables": {"accounts": {"changelog": True}}})
    skippr.sync_once()
    rng = random.Random(7)
    next_id = 10_000
    with db.connect() as conn:
        for kill in range(6):
            proc = skippr.start("sync", "--pipeline", "app")
            deadline = time.monotonic() + rng.uniform(1.0, 3.0)
            while time.monotonic() < deadline:
                with conn.transaction():
                    for _ in range(rng.randint(1, 5)):
                        pick = rng.random()
                        if pick < 0.4:
                            next_id += 1
                            conn.execute("INSERT INTO accounts VALUES (%s, 'w', 1, NULL, NULL)", (next_id,))
                        elif pick < 0.8:
                            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = "
                                         "(SELECT id FROM accounts ORDER BY random() LIMIT 1)")
                        else:
                            conn.execute("DELETE FROM accounts WHERE id = "
                                         "(SELECT id FROM accounts ORDER BY random() LIMIT 1)")
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL, bg_log(skippr)
    assert_no_panic(skippr.sync_once())
    rows = assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])
    assert len(rows) > 100, len(rows)


def test_changelog_maintenance_merges_files_and_expires_snapshots(skippr: Skippr) -> None:
    """With maintenance due at every run, a changelog's small files are merged in `replace`
    snapshots (the same rows) and its old snapshots expire; the history still rebuilds the
    table."""
    db = skippr.db
    db.execute(SETUP)
    skippr.write_config(["accounts"], extra_pipeline={
        "tables": {"accounts": {"changelog": True}},
        "maintenance": {"check_interval": "100ms", "snapshot_retention": "1s", "min_snapshots_to_keep": 2,
                        "orphan_file_age": "1s", "compaction_min_files": 3},
    })
    skippr.sync_once()
    with db.connect() as conn:
        for i in range(6):
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id %% 6 = %s", (i,))
            conn.execute("INSERT INTO accounts VALUES (%s, 'm', 0, NULL, NULL)", (5000 + i,))
            skippr.sync_once()
            time.sleep(1.1)
    log = skippr.table("accounts_changelog")
    files = list(log.scan().plan_files())
    assert len(files) < 7, f"{len(files)} data files after 7 commits: small files were not merged"
    assert len(log.metadata.snapshots) < 7, f"{len(log.metadata.snapshots)} snapshots kept: none expired"
    assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])


def test_a_consistent_cut_tags_the_changelog_with_its_table(skippr: Skippr) -> None:
    """`consistent_cuts`: the changelog's current snapshot carries the same cut tag as its
    table's; read at the tag, the changelog rebuilds the table as tagged."""
    db = skippr.db
    db.execute(SETUP)
    skippr.write_config(["accounts"], extra_pipeline={
        "tables": {"accounts": {"changelog": True}}, "consistent_cuts": {"every": "1s", "keep": 5}})
    skippr.sync_once()
    with db.connect() as conn:
        conn.execute("UPDATE accounts SET balance = balance + 7 WHERE id <= 10")
    time.sleep(1.1)
    skippr.sync_once()
    state, log = skippr.table("accounts"), skippr.table("accounts_changelog")
    tags = {n for n, r in state.metadata.refs.items() if n.startswith("skippr-cut-")}
    assert tags, state.metadata.refs
    assert tags == {n for n, r in log.metadata.refs.items() if n.startswith("skippr-cut-")}, log.metadata.refs
    newest = max(tags)
    at_state = state.scan(snapshot_id=state.metadata.refs[newest].snapshot_id).to_arrow().to_pylist()
    at_log = log.scan(snapshot_id=log.metadata.refs[newest].snapshot_id).to_arrow().to_pylist()
    rebuilt = replay(at_log, ["id"])
    assert rebuilt == {(r["id"],): r for r in at_state}


def query_rows(skippr: Skippr, sql: str) -> list[dict]:
    proc = skippr.run("query", sql, "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, f"query failed: {sql}\n{proc.stderr}"
    return [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]


def test_a_changelog_reads_live_before_its_commit(skippr: Skippr) -> None:
    """While the changes are still only in the WAL (commit_interval 1h), `skipprd query` reads
    a changelog with their rows already, exactly the rows the commit then writes: TOASTed
    values an update left unchanged (from the committed row and from an earlier update in the
    tail), an insert and delete in one transaction, key changes, TRUNCATE of committed and
    tail rows."""
    from test_live import wait_live

    db = skippr.db
    db.execute(SETUP)
    skippr.write_config(
        ["accounts", "pairs"],
        extra_pipeline={"commit_interval": "1h",
                        "tables": {"accounts": {"changelog": True},
                                   "pairs": {"changelog": {"table": "pairs_history"}}}},
    )
    big = "y" * 200_000  # stored out of line (TOAST)
    db.execute("UPDATE accounts SET doc = %s WHERE id <= 4", (big,))
    skippr.sync_once()
    before = {t: skippr.table(t).current_snapshot().snapshot_id for t in ("accounts_changelog", "pairs_history")}
    committed = {t: len(query_rows(skippr, f"SELECT _skippr_lsn FROM analytics.{t}")) for t in before}
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        with db.connect() as conn:
            # Unchanged TOASTed values: from the committed row, then from the tail's own update.
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 3")
            conn.execute("UPDATE accounts SET owner = 'again' WHERE id = 2")
            with conn.transaction():
                conn.execute("INSERT INTO accounts VALUES (1000, 'brief', 1, NULL, NULL)")
                conn.execute("DELETE FROM accounts WHERE id = 1000")
                conn.execute("UPDATE accounts SET id = 2000 WHERE id = 10")
                conn.execute("UPDATE accounts SET id = 2004, balance = 0 WHERE id = 4")  # key change, TOAST kept
            conn.execute("DELETE FROM accounts WHERE id BETWEEN 20 AND 22")
            with conn.transaction():
                conn.execute("INSERT INTO pairs VALUES (7, 7, 'tail')")
                conn.execute("UPDATE pairs SET v = 'changed' WHERE a = 1")
                conn.execute("DELETE FROM pairs WHERE a = 2 AND b = 1")
                conn.execute("TRUNCATE pairs")
                conn.execute("INSERT INTO pairs VALUES (9, 9, 'after')")
        wait_live(skippr, ["accounts", "pairs"], proc)
        columns = {"accounts_changelog": "id, owner, balance, doc, tags", "pairs_history": "a, b, v"}
        live = {t: query_rows(skippr, f"SELECT {c}, {', '.join(META)} FROM analytics.{t} "
                                      f"ORDER BY _skippr_lsn, _skippr_seq") for t, c in columns.items()}
        for t, snap in before.items():
            assert skippr.table(t).current_snapshot().snapshot_id == snap, f"{t} was committed during the test"
        tail = {t: live[t][committed[t]:] for t in live}
        ops = [(r["_skippr_op"], r["id"]) for r in tail["accounts_changelog"]]
        assert ops == [("update", 1), ("update", 2), ("update", 3), ("update", 2),
                       ("insert", 1000), ("delete", 1000), ("delete", 10), ("insert", 2000),
                       ("delete", 4), ("insert", 2004),
                       ("delete", 20), ("delete", 21), ("delete", 22)], ops
        assert all(r["doc"] == big for r in tail["accounts_changelog"]
                   if r["_skippr_op"] in ("update", "insert") and r["id"] in (1, 2, 3, 2004)), (
            "a live change row lacks the TOASTed value its update left unchanged")
        pairs = [(r["_skippr_op"], r["a"], r["b"]) for r in tail["pairs_history"]]
        # 20 committed rows, one inserted in the tail, one deleted before the TRUNCATE.
        assert len([p for p in pairs if p[0] == "delete"]) == 1 + 20, pairs
        assert pairs[-1] == ("insert", 9, 9), pairs
        # Filters reach the tail's rows too.
        recent = query_rows(skippr, "SELECT count(*) AS n FROM analytics.accounts_changelog "
                                    "WHERE _skippr_commit_time > now() - interval '5 minutes' AND _skippr_op = 'delete'")
        # (The committed rows are the first copy's inserts.)
        assert recent[0]["n"] == sum(1 for op, _ in ops if op == "delete"), recent
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    skippr.sync_once()
    for t, c in columns.items():
        after = query_rows(skippr, f"SELECT {c}, {', '.join(META)} FROM analytics.{t} ORDER BY _skippr_lsn, _skippr_seq")
        assert skippr.table(t).current_snapshot().snapshot_id != before[t], f"{t} was not committed"
        assert after == live[t], f"{t}: the committed changelog differs from what was read live"
    assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])
    assert_changelog_rebuilds(skippr, "pairs", "pairs_history", ["a", "b"])


def test_a_resnapshot_records_the_difference_its_copy_makes(skippr: Skippr) -> None:
    """`sync --resnapshot` copies the tables again, and the changes made while nothing followed
    them reach each changelog as the difference between the table's old rows and the copy (at
    the copy's LSN, rows that did not change get none), exactly once across a SIGKILL between
    the copy's commit and the changelog's: replaying the changelog still rebuilds the table."""
    db = skippr.db
    db.execute(SETUP + """
CREATE TABLE notes (v text, n integer);
ALTER TABLE notes REPLICA IDENTITY FULL;
INSERT INTO notes VALUES ('a', 1), ('a', 1), ('b', 2), ('c', 3);
""")
    names = ["accounts", "pairs", "notes"]
    skippr.write_config(names, extra_pipeline={"tables": {t: {"changelog": True} for t in names}})
    skippr.sync_once()
    seeded = {t: changelog_rows(skippr, f"{t}_changelog") for t in names}
    assert [len(seeded[t]) for t in names] == [50, 20, 4]

    # Changes the re-snapshot's copy brings (it drops the slot that held them).
    with db.connect() as conn:
        conn.execute("UPDATE accounts SET balance = balance + 100 WHERE id IN (1, 2)")
        conn.execute("UPDATE accounts SET balance = balance WHERE id = 4")  # no difference
        conn.execute("DELETE FROM accounts WHERE id = 3")
        conn.execute("INSERT INTO accounts VALUES (500, 'late', 5, NULL, ARRAY['x'])")
        conn.execute("UPDATE pairs SET v = 'w' WHERE a = 1 AND b = 1")
        conn.execute("DELETE FROM notes WHERE v = 'b'")
        conn.execute("INSERT INTO notes VALUES ('a', 1), ('d', 4)")

    # Killed after the copies committed and before any changelog took their difference.
    point = "before-copy-difference"
    proc = skippr.start("sync", "--pipeline", "app", "--once", "--resnapshot",
                        env={"SKIPPR_TEST_PAUSE_AT": point})
    try:
        wait_paused(skippr, proc, point, "the re-snapshot")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    for t in names:
        assert len(changelog_rows(skippr, f"{t}_changelog")) == len(seeded[t]), f"{t}: a killed copy changed its changelog"

    skippr.sync_once()
    rows = assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])
    copy_lsn = max(r["_skippr_lsn"] for r in rows)
    assert copy_lsn > seeded["accounts"][0]["_skippr_lsn"]
    diff = sorted((r["_skippr_op"], r["id"]) for r in rows if r["_skippr_lsn"] == copy_lsn)
    assert diff == [("delete", 3), ("insert", 500), ("update", 1), ("update", 2)], diff
    by_id = {r["id"]: r for r in rows if r["_skippr_lsn"] == copy_lsn}
    assert by_id[3]["owner"] == "owner 3", "a delete of the copy holds the row as it was"
    state = {r["id"]: r for r in skippr.read_pyiceberg("accounts", ["id"])}
    assert by_id[1]["balance"] == state[1]["balance"], "an update of the copy holds the new values"
    pairs = assert_changelog_rebuilds(skippr, "pairs", "pairs_changelog", ["a", "b"])
    assert [(r["_skippr_op"], r["a"], r["b"], r["v"]) for r in pairs if r["_skippr_lsn"] > seeded["pairs"][0]["_skippr_lsn"]] \
        == [("update", 1, 1, "w")]

    # Without a key, the changelog's rows are a multiset: inserts count up, deletes down.
    from collections import Counter
    notes = changelog_rows(skippr, "notes_changelog")
    counted: Counter = Counter()
    for r in notes:
        counted[(r["v"], r["n"])] += -1 if r["_skippr_op"] == "delete" else 1
    expected = Counter(tuple(r) for r in db.execute("SELECT v, n FROM notes"))
    assert +counted == expected and not -counted, (counted, expected)
    late = sorted((r["_skippr_op"], r["v"]) for r in notes if r["_skippr_lsn"] > seeded["notes"][0]["_skippr_lsn"])
    assert late == [("delete", "b"), ("insert", "a"), ("insert", "d")], late
    ops = [s.summary.operation.value for s in snapshots(skippr.table("notes_changelog"))]
    assert set(ops) == {"append"}, ops

    # Recorded once: a later run adds nothing more for the copy.
    skippr.sync_once()
    assert len(changelog_rows(skippr, "accounts_changelog")) == len(rows)


def test_a_changelog_reads_live_across_a_column_added_in_the_tail(skippr: Skippr) -> None:
    """A column added at the source while its change rows are only in the WAL: the changelog
    reads live with it (NULL before, the values after), and equals what the commit then writes."""
    from test_live import wait_live

    db = skippr.db
    db.execute(SETUP)
    skippr.write_config(["accounts"], extra_pipeline={"commit_interval": "1h",
                                                      "tables": {"accounts": {"changelog": True}}})
    skippr.sync_once()
    before = skippr.table("accounts_changelog").current_snapshot().snapshot_id
    proc = skippr.start("sync", "--pipeline", "app")
    try:
        with db.connect() as conn:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            conn.execute("ALTER TABLE accounts ADD COLUMN region text")
            conn.execute("INSERT INTO accounts VALUES (3000, 'new', 3, NULL, NULL, 'eu')")
            conn.execute("UPDATE accounts SET region = 'us' WHERE id = 2")
        wait_live(skippr, ["accounts"], proc)
        sql = ("SELECT id, balance, region, _skippr_op FROM analytics.accounts_changelog "
               "WHERE _skippr_lsn > (SELECT min(_skippr_lsn) FROM analytics.accounts_changelog) "
               "ORDER BY _skippr_lsn, _skippr_seq")
        live = query_rows(skippr, sql)
        assert skippr.table("accounts_changelog").current_snapshot().snapshot_id == before, "committed during the test"
        assert [(r["_skippr_op"], r["id"], r["region"]) for r in live] == \
            [("update", 1, None), ("insert", 3000, "eu"), ("update", 2, "us")], live
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    skippr.sync_once()
    assert skippr.table("accounts_changelog").current_snapshot().snapshot_id != before
    assert query_rows(skippr, sql) == live, "the committed changelog differs from what was read live"
    assert_changelog_rebuilds(skippr, "accounts", "accounts_changelog", ["id"])


def test_a_cdc_only_resnapshot_records_the_emptied_table(skippr: Skippr) -> None:
    """With `cdc_mode: cdc_only` a table copied again starts empty at the new slot's position:
    its changelog records a delete of every row it held, so the replay still equals the table."""
    db = skippr.db
    db.execute("CREATE TABLE events (id bigint PRIMARY KEY, kind text)")
    skippr.write_config(["events"], cdc_mode="cdc_only",
                        extra_pipeline={"tables": {"events": {"changelog": True}}})
    skippr.sync_once()
    db.execute("INSERT INTO events SELECT i, 'k' || i FROM generate_series(1, 5) i")
    skippr.sync_once()
    assert len(skippr.read_pyiceberg("events")) == 5
    proc = skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot")
    assert_no_panic(proc)
    assert skippr.read_pyiceberg("events") == [], "cdc_only copied existing rows"
    rows = changelog_rows(skippr, "events_changelog")
    assert sorted(r["id"] for r in rows if r["_skippr_op"] == "delete") == [1, 2, 3, 4, 5], rows
    assert replay(rows, ["id"]) == {}
    db.execute("INSERT INTO events VALUES (6, 'after')")
    skippr.sync_once()
    # The table now holds what cdc_only followed since the copy (not Postgres's older rows).
    state = {(r["id"],): r for r in skippr.read_pyiceberg("events")}
    assert list(state) == [(6,)], state
    assert replay(changelog_rows(skippr, "events_changelog"), ["id"]) == state
    ops = {s.summary.operation.value for s in snapshots(skippr.table("events_changelog"))}
    assert ops == {"append"}, ops


def test_a_resnapshot_that_changes_columns_asks_for_the_changelog_to_start_over(skippr: Skippr) -> None:
    """A copy under new columns (changed while nothing followed the table) has no row-by-row
    difference with the rows before it: the run stops naming the fix, changes nothing of the
    changelog, and once the changelog table is dropped it starts over from the copy's rows."""
    db = skippr.db
    db.execute("CREATE TABLE shaped (id integer PRIMARY KEY, amount integer);"
               "INSERT INTO shaped SELECT i, i FROM generate_series(1, 10) i")
    skippr.write_config(["shaped"], extra_pipeline={"tables": {"shaped": {"changelog": True}}})
    skippr.sync_once()
    logged = changelog_rows(skippr, "shaped_changelog")
    db.execute("ALTER TABLE shaped ALTER COLUMN amount TYPE numeric(12,2)")
    db.execute("UPDATE shaped SET amount = amount * 1.5 WHERE id < 4")
    proc = skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot", check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, "a copy under new columns was recorded in the changelog"
    assert "drop the changelog table" in proc.stderr, proc.stderr
    assert changelog_rows(skippr, "shaped_changelog") == logged, "the refused difference changed the changelog"
    skippr.catalog().drop_table(f"{skippr.workspace}.shaped_changelog")
    skippr.sync_once()
    rows = assert_changelog_rebuilds(skippr, "shaped", "shaped_changelog", ["id"])
    assert len(rows) == 10 and {r["_skippr_op"] for r in rows} == {"insert"}, rows
