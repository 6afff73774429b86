"""Consistent cuts (`pipelines.<name>.consistent_cuts`): every table of a pipeline tagged
`skippr-cut-<UTC time>` at one source LSN, read by other engines.

A bank-transfer workload moves money between `accounts` and records each move in `transfers`
while `skipprd serve` commits and takes a cut every second. Every cut, read with PyIceberg at
the snapshot ids `skippr.cuts` lists (and that the tags in the table metadata point to), shows
the invariant total and a ledger that agrees with the balances; the gateway's
`SET skippr.as_of = 'skippr-cut-...'` answers the same state. Then `keep` (the tag names and
their count), snapshot expiry keeping tagged snapshots until their cut is dropped, and the
configuration errors."""

from __future__ import annotations

import re
import threading
import time

import psycopg
import pytest
from pyiceberg.table.refs import SnapshotRefType

from conftest import Database, Skippr, duckdb_connect, free_port, run_skipprd
from test_cdc import bg_log, stop
from test_consistency import ACCOUNTS, LEDGER, OPENING, bank, connect_gateway, transfer_loop  # noqa: F401 (bank: a fixture)

CUT_NAME = re.compile(r"^skippr-cut-\d{8}T\d{6}Z$")

#: Commits twice a second, a cut every second (none dropped during the test).
CUTTING = {"commit_interval": "300ms", "consistent_cuts": {"every": "1s", "keep": 100}}


def cuts_of(gw: psycopg.Connection) -> dict[str, dict]:
    """`skippr.cuts` by cut: its LSN, time and each table's snapshot id."""
    out: dict[str, dict] = {}
    rows = gw.execute("SELECT cut_name, lsn, cut_time, table_name, snapshot_id FROM skippr.cuts"
                      " ORDER BY cut_time, table_name").fetchall()
    for name, lsn, at, table, snapshot_id in rows:
        cut = out.setdefault(name, {"lsn": lsn, "time": at, "snapshots": {}})
        assert cut["lsn"] == lsn and cut["time"] == at, f"cut {name}: one LSN and time per cut: {rows}"
        cut["snapshots"][table] = snapshot_id
    return out


def tags(table) -> dict[str, int]:
    """The cut tags in a table's metadata: name -> snapshot id."""
    out = {}
    for name, ref in table.metadata.refs.items():
        if name.startswith("skippr-cut-"):
            assert ref.snapshot_ref_type == SnapshotRefType.TAG, f"{name} is a {ref.snapshot_ref_type}"
            out[name] = ref.snapshot_id
    return out


def ledger_at(skippr: Skippr, snapshots: dict[str, int]) -> tuple[int, int, int]:
    """(total balance, accounts that disagree with the transfers, transfers) of the tables read
    with PyIceberg at the given snapshot ids."""
    accounts = skippr.table("accounts").scan(snapshot_id=snapshots["accounts"]).to_arrow().to_pylist()
    transfers = skippr.table("transfers").scan(snapshot_id=snapshots["transfers"]).to_arrow().to_pylist()
    net: dict[int, int] = {}
    for t in transfers:
        net[t["src"]] = net.get(t["src"], 0) - t["amount"]
        net[t["dst"]] = net.get(t["dst"], 0) + t["amount"]
    wrong = sum(1 for a in accounts if a["balance"] != OPENING + net.get(a["id"], 0))
    assert len(accounts) == ACCOUNTS
    return sum(a["balance"] for a in accounts), wrong, len(transfers)


@pytest.mark.parametrize("bank", [CUTTING], indirect=True)
def test_every_cut_shows_the_bank_at_one_lsn(skippr: Skippr, db: Database, bank) -> None:
    port, proc = bank
    stop_event, done, errors = threading.Event(), [0], []
    writer = threading.Thread(target=transfer_loop, args=(db, stop_event, done, errors), daemon=True)
    writer.start()
    try:
        with connect_gateway(port, proc) as gw:
            deadline = time.monotonic() + 60
            while len({c["lsn"] for c in cuts_of(gw).values()}) < 4:
                assert proc.poll() is None and time.monotonic() < deadline, bg_log(skippr)
                assert not errors, errors
                time.sleep(0.3)
            stop_event.set()
            writer.join(30)
            assert not errors, errors
            cuts = cuts_of(gw)
            checked = []
            for name, cut in cuts.items():
                assert CUT_NAME.match(name), name
                assert set(cut["snapshots"]) == {"accounts", "transfers"}, f"{name}: {cut}"
                total, wrong, n = ledger_at(skippr, cut["snapshots"])
                assert (total, wrong) == (ACCOUNTS * OPENING, 0), f"cut {name} at {cut['lsn']}: total {total}, {wrong} accounts disagree with {n} transfers"
                checked.append((name, cut["lsn"], n))
            # Cuts taken while money moved show different states, each whole.
            assert len({n for _, _, n in checked}) >= 3, checked
            # The gateway reads a cut: the same state as PyIceberg, at the cut's LSN.
            name, lsn, n = checked[len(checked) // 2]
            gw.execute(f"SET skippr.as_of = '{name}'")
            assert gw.execute("SHOW skippr.as_of").fetchone()[0] == name
            wrong, total, count, seen = gw.execute(LEDGER).fetchone()
            assert (wrong, total, count, seen) == (0, ACCOUNTS * OPENING, n, lsn)
            gw.execute("RESET skippr.as_of")
            assert gw.execute("SELECT count(*) FROM transfers").fetchone()[0] >= n
            # An unknown cut is refused with 72000 (snapshot_too_old), naming where to look.
            gw.execute("SET skippr.as_of = 'skippr-cut-20000101T000000Z'")
            with pytest.raises(psycopg.Error) as e:
                gw.execute("SELECT count(*) FROM accounts")
            assert e.value.sqlstate == "72000", e.value
            assert "skippr.cuts" in str(e.value), e.value
            gw.execute("RESET skippr.as_of")
            with pytest.raises(psycopg.Error) as e:
                gw.execute("SET skippr.as_of = 'skippr-cut-yesterday'")
            assert e.value.sqlstate == "22023" and "skippr-cut-" in str(e.value), e.value
    finally:
        stop_event.set()
    # The tags in the metadata are what `skippr.cuts` listed (the cuts taken since stay too).
    for table in ("accounts", "transfers"):
        in_metadata = tags(skippr.table(table))
        for name, cut in cuts.items():
            assert in_metadata.get(name) == cut["snapshots"][table], f"{table}: tag {name}"
    # DuckDB reads a cut by snapshot id, as docs/history.md shows.
    name, _, n = checked[len(checked) // 2]
    con = duckdb_connect()
    try:
        at = {t: f"iceberg_scan('{skippr.table(t).metadata_location}', snapshot_from_id => {cuts[name]['snapshots'][t]})"
              for t in ("accounts", "transfers")}
        total = con.execute(f"SELECT sum(balance) FROM {at['accounts']}").fetchone()[0]
        count = con.execute(f"SELECT count(*) FROM {at['transfers']}").fetchone()[0]
        assert (total, count) == (ACCOUNTS * OPENING, n)
    finally:
        con.close()


def test_keep_drops_old_cuts_and_expiry_keeps_tagged_snapshots(skippr: Skippr, db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO u VALUES (1, 'idle')")
    skippr.write_config(["t", "u"], extra_pipeline={
        "commit_interval": "200ms",
        "consistent_cuts": {"every": "2s", "keep": 2},
        "maintenance": {"check_interval": "200ms", "snapshot_retention": "1s", "min_snapshots_to_keep": 1},
    }, metrics_listen=f"127.0.0.1:{free_port()}")
    skippr.sync_once()
    proc = skippr.start("sync", "--pipeline", "app")
    seen: dict[str, int] = {}
    try:
        with db.connect() as conn:
            i, deadline = 0, time.monotonic() + 60
            # Until three cuts were dropped while rows kept arriving in t (u stays idle).
            while len(seen) < 5:
                assert proc.poll() is None and time.monotonic() < deadline, bg_log(skippr)
                i += 1
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
                time.sleep(0.05)
                t = skippr.table("t")
                current = tags(t)
                assert len(current) <= 2, f"keep: 2, the metadata holds {sorted(current)}"
                snapshots = {s.snapshot_id for s in t.metadata.snapshots}
                for name, snapshot_id in current.items():
                    assert CUT_NAME.match(name), name
                    assert snapshot_id in snapshots, f"the snapshot of cut {name} expired"
                seen.update(current)
        t = skippr.table("t")
        snapshots = {s.snapshot_id: s for s in t.metadata.snapshots}
        current = tags(t)
        assert len(current) == 2 and set(current) == set(sorted(seen)[-2:]), (sorted(seen), current)
        # The tagged snapshots outlived the retention that removed the snapshots around them.
        now_ms = time.time() * 1000
        assert len(snapshots) < i / 2, f"{len(snapshots)} snapshots kept after {i} commits: nothing expired"
        oldest = min(current, key=lambda n: n)
        assert now_ms - snapshots[current[oldest]].timestamp_ms > 1000, "the test must outlive the retention"
        # A dropped cut's snapshot expires like any other (unless a kept cut shares it).
        dropped = [n for n in sorted(seen)[:-2] if seen[n] not in current.values()]
        deadline = time.monotonic() + 30
        while any(seen[n] in {s.snapshot_id for s in skippr.table("t").metadata.snapshots} for n in dropped):
            assert time.monotonic() < deadline, f"the snapshots of dropped cuts {dropped} never expired"
            time.sleep(0.2)
    finally:
        assert stop(proc) == 0, bg_log(skippr)
    # The idle table carries every cut too, at its one snapshot.
    u = skippr.table("u")
    assert set(tags(u)) == set(tags(skippr.table("t")))
    assert set(tags(u).values()) == {u.metadata.current_snapshot_id}


@pytest.mark.parametrize("cuts, key, needle", [
    ({"every": "500ms"}, "consistent_cuts.every", "at least 1s"),
    ({"every": "hourly"}, "consistent_cuts.every", "`1h`"),
    ({"every": "1h", "keep": 0}, "consistent_cuts.keep", "between 1 and"),
])
def test_a_bad_setting_names_the_key_and_the_fix(skippr: Skippr, cuts: dict, key: str, needle: str) -> None:
    skippr.write_config(["t"], extra_pipeline={"consistent_cuts": cuts})
    proc = run_skipprd("--config", str(skippr.config_path), "validate", cwd=skippr.workdir,
                       env=skippr.env, check=False)
    assert proc.returncode != 0, proc.stdout
    assert f"pipelines.app.{key}" in proc.stderr and needle in proc.stderr, proc.stderr


def test_every_takes_days(skippr: Skippr) -> None:
    skippr.write_config(["t"], extra_pipeline={"consistent_cuts": {"every": "1d", "keep": 7}})
    proc = run_skipprd("--config", str(skippr.config_path), "validate", cwd=skippr.workdir,
                       env=skippr.env, check=False)
    assert proc.returncode == 0, proc.stderr
