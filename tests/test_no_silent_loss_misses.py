"""No silent loss when the Iceberg table and Postgres have diverged: another engine deletes a
row from the Iceberg table, then Postgres updates or deletes that row. The change names a row
Iceberg does not hold, so `sync --once` must stop with an error that names the table and the
fix (`--resnapshot`), on every run (the change is never skipped), without committing
anything past it to Iceberg; the fix it names then brings every reader back to Postgres."""

from __future__ import annotations

import pytest

from conftest import Database, Skippr, assert_no_panic, describe_run
from test_cdc import assert_fails, assert_synced, insert_lsn
from test_no_silent_loss_sink import snapshot_ids, synced_round, wal_segments

SETUP = """
CREATE TABLE ledger (id integer PRIMARY KEY, v text NOT NULL, amount numeric(10,2));
CREATE TABLE bystander (id integer PRIMARY KEY, v text);
INSERT INTO ledger SELECT i, 'row ' || i, i * 1.25 FROM generate_series(1, 30) i;
INSERT INTO bystander VALUES (1, 'a');
"""

# The change that names the row another engine removed from the Iceberg table.
MISSES = {
    "update": "UPDATE ledger SET v = 'changed' WHERE id = 7",
    "key_changing_update": "UPDATE ledger SET id = 700 WHERE id = 7",
    "delete": "DELETE FROM ledger WHERE id = 7",
}


def delete_in_iceberg(skippr: Skippr, row_id: int) -> None:
    """Another engine (PyIceberg) deletes a row from the Iceberg table."""
    table = skippr.table("ledger")
    table.delete(delete_filter=f"id == {row_id}")
    ids = [r["id"] for r in skippr.read_pyiceberg("ledger", ["id"])]
    assert row_id not in ids, "PyIceberg did not delete the row"


@pytest.mark.parametrize("miss", list(MISSES))
def test_change_of_a_row_iceberg_does_not_hold_stops_and_resnapshot_fixes_it(skippr: Skippr, db: Database, miss):
    db.execute(SETUP)
    skippr.write_config(["ledger", "bystander"])
    skippr.sync_once()
    synced_round(skippr, db, "ledger", "UPDATE ledger SET amount = 0 WHERE id < 5")

    delete_in_iceberg(skippr, 7)
    rows_before = skippr.read_pyiceberg("ledger", ["id"])
    snapshots_before = snapshot_ids(skippr, "ledger")

    # changes before and after the miss, in their own transactions and in other tables
    db.execute("INSERT INTO ledger VALUES (100, 'before the miss', 1)")
    db.execute(MISSES[miss])
    db.execute("INSERT INTO ledger VALUES (101, 'after the miss', 2)")
    db.execute("UPDATE bystander SET v = 'b' WHERE id = 1")

    for attempt in ("first run", "second run (must not skip the change)"):
        proc = assert_fails(skippr, must_name=["public.ledger", "does not hold", "--resnapshot"],
                            what=f"{miss} of a row Iceberg does not hold ({attempt})")
        op = "DELETE" if miss == "delete" else "UPDATE"
        assert f"an {op} names a row" in proc.stderr, describe_run(proc)
        # nothing of the round reached Iceberg, and the change stays in the WAL
        assert skippr.read_pyiceberg("ledger", ["id"]) == rows_before, f"Iceberg changed ({attempt})"
        assert snapshot_ids(skippr, "ledger") == snapshots_before, f"a snapshot was committed ({attempt})"
        assert wal_segments(skippr), f"the WAL no longer holds the change ({attempt})"

    # the fix the message names
    proc = skippr.run("sync", "--pipeline", "app", "--once", "--resnapshot")
    assert_no_panic(proc)
    assert_synced(skippr, db, ["ledger", "bystander"])
    # and the pipeline follows the table again from there
    before = insert_lsn(db)
    db.execute("UPDATE ledger SET v = 'after the fix' WHERE id IN (8, 9)")
    db.execute("DELETE FROM ledger WHERE id = 10")
    skippr.sync_once()
    assert_synced(skippr, db, ["ledger", "bystander"], changed_since=before, changed=["ledger"])
