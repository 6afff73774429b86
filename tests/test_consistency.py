"""One LSN per statement and read-your-writes, through the gateway of `skipprd serve`.

A bank-transfer workload moves money between `accounts` and records each move in
`transfers`, one source transaction per transfer, at full speed while Iceberg commits every
two seconds. Every gateway statement must see both tables at one source transaction
boundary: the total never changes, and every account's balance equals its opening balance
plus the transfers it shows (a join of the two tables read at different LSNs breaks this).
Then the fence: a writer commits, fences on `pg_current_wal_insert_lsn()`, and reads its own
row every time; a fence that cannot be met fails with 57014 naming the LSN reached."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from conftest import Database, Skippr, free_port, lsn_to_int
from test_cdc import bg_log, stop

ACCOUNTS = 20
OPENING = 1000

# Every account whose balance disagrees with the transfers the same statement sees.
LEDGER = f"""
WITH moves AS (SELECT src AS id, -amount AS d FROM transfers
               UNION ALL SELECT dst AS id, amount AS d FROM transfers),
     net AS (SELECT id, sum(d) AS d FROM moves GROUP BY id)
SELECT count(*) AS wrong, (SELECT sum(balance) FROM accounts) AS total,
       (SELECT count(*) FROM transfers) AS n, skippr.visible_lsn() AS lsn
FROM accounts a LEFT JOIN net ON net.id = a.id
WHERE a.balance <> {OPENING} + coalesce(net.d, 0)
"""


def reached(seen: str, target: str) -> bool:
    """Whether LSN `seen` is at or after `target`; the position right after a WAL page header
    (what pg_current_wal_insert_lsn() answers when the last record ended at a page boundary)
    is the same point as the boundary."""
    s, t = lsn_to_int(seen), lsn_to_int(target)
    header = 40 if t % (16 << 20) == 40 else 24
    if t % 8192 == header:
        t -= header
    return s >= t


def connect_gateway(port: int, proc) -> psycopg.Connection:
    deadline = time.monotonic() + 60
    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr",
                                   autocommit=True)
        except psycopg.OperationalError:
            assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)


def transfer(conn: psycopg.Connection, rnd) -> None:
    """One source transaction: money moves between two accounts and the move is recorded."""
    src, dst = rnd.sample(range(1, ACCOUNTS + 1), 2)
    amount = rnd.randint(1, 50)
    with conn.transaction():
        conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, src))
        conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, dst))
        conn.execute("INSERT INTO transfers (src, dst, amount) VALUES (%s, %s, %s)", (src, dst, amount))


def transfer_loop(db: Database, stop_event: threading.Event, done: list[int], errors: list[str]) -> None:
    import random

    rnd = random.Random(7)
    try:
        with db.connect() as conn:
            while not stop_event.is_set():
                transfer(conn, rnd)
                done[0] += 1
    except Exception as e:  # reported by the test
        errors.append(repr(e))


def start_bank(skippr: Skippr, db: Database, extra_pipeline: dict):
    """Creates and copies the two tables, then starts `skipprd serve`: (gateway port, process)."""
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
    db.execute(f"INSERT INTO accounts SELECT g, {OPENING} FROM generate_series(1, {ACCOUNTS}) g")
    db.execute("CREATE TABLE transfers (id bigserial PRIMARY KEY, src int NOT NULL, dst int NOT NULL,"
               " amount bigint NOT NULL)")
    port = free_port()
    skippr.write_config(["accounts", "transfers"], extra_pipeline=extra_pipeline,
                        query={"listen": f"127.0.0.1:{port}"}, metrics_listen=f"127.0.0.1:{free_port()}")
    skippr.sync_once()
    return port, skippr.start("serve")


@pytest.fixture
def bank(skippr: Skippr, db: Database, request):
    """The bank on `skipprd serve`; a test's indirect parameter replaces the pipeline settings."""
    port, proc = start_bank(skippr, db, getattr(request, "param", {"commit_interval": "2s"}))
    try:
        yield port, proc
    finally:
        assert stop(proc) == 0, bg_log(skippr)


def test_every_statement_sees_both_tables_at_one_lsn(skippr: Skippr, db: Database, bank) -> None:
    port, proc = bank
    stop_event = threading.Event()
    done, errors = [0], []
    writer = threading.Thread(target=transfer_loop, args=(db, stop_event, done, errors), daemon=True)
    gw = connect_gateway(port, proc)
    writer.start()
    problems: list[str] = []
    lsns: list[int] = []
    commits_seen: set[str] = set()
    try:
        for i in range(300):
            assert proc.poll() is None, bg_log(skippr)
            wrong, total, n, lsn = gw.execute(LEDGER).fetchone()
            if wrong != 0 or total != ACCOUNTS * OPENING:
                problems.append(f"statement {i}: {wrong} accounts disagree with transfers, total {total}, {n} transfers, lsn {lsn}")
            assert lsn is not None
            lsns.append(lsn_to_int(lsn))
            if i % 25 == 0:
                # A transaction sees one LSN for all its statements.
                with gw.transaction():
                    first = gw.execute("SELECT count(*), skippr.visible_lsn() FROM transfers").fetchone()
                    time.sleep(0.3)
                    second = gw.execute("SELECT count(*), skippr.visible_lsn() FROM transfers").fetchone()
                    shown = gw.execute("SHOW skippr.lsn").fetchone()[0]
                if first != second or shown != first[1]:
                    problems.append(f"one transaction saw {first}, then {second}, SHOW said {shown}")
                row = gw.execute("SELECT committed_lsn FROM skippr.tables WHERE table_name = 'transfers'").fetchone()
                commits_seen.add(row[0])
    finally:
        stop_event.set()
        writer.join(timeout=30)
    assert not errors, errors
    assert not problems, problems[:10]
    assert lsns == sorted(lsns), "the visible LSN went backwards"
    assert done[0] > 100, f"only {done[0]} transfers ran"
    assert len(commits_seen) > 1, "no Iceberg commit happened during the workload"
    status = gw.execute("SELECT committed_lsn, tail_lsn, lag_bytes FROM skippr.tables ORDER BY table_name").fetchall()
    assert len(status) == 2 and all(r[1] is not None and r[2] >= 0 for r in status), status
    assert status[0][1] == status[1][1], f"both tables of the pipeline are read at one LSN: {status}"
    gw.close()


def test_a_writer_reads_its_own_commit_after_the_fence(skippr: Skippr, db: Database, bank) -> None:
    port, proc = bank
    gw = connect_gateway(port, proc)
    with db.connect(autocommit=True) as pgc:
        for i in range(40):
            new_id = pgc.execute("INSERT INTO transfers (src, dst, amount) VALUES (1, 2, %s) RETURNING id",
                                 (i + 1,)).fetchone()[0]
            lsn = pgc.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
            if i % 3 == 0:
                gw.execute(f"SET skippr.min_lsn = '{lsn}'")
            elif i % 3 == 1:
                got_to = gw.execute(f"SELECT skippr.wait_lsn('{lsn}', '10s')").fetchone()[0]
                assert reached(got_to, lsn), (got_to, lsn)
            else:
                got_to = gw.execute("SELECT skippr.wait_lsn(NULL, '10s')").fetchone()[0]
                assert reached(got_to, lsn), (got_to, lsn)
            got = gw.execute(f"SELECT amount FROM transfers WHERE id = {new_id}").fetchall()
            assert got == [(i + 1,)], f"round {i}: own write not visible after the fence at {lsn}"
            seen = gw.execute("SHOW skippr.lsn").fetchone()[0]
            assert reached(seen, lsn), (seen, lsn)
    # A fence that cannot be met times out with 57014 and names the LSN reached.
    gw.execute("SET skippr.wait_timeout = '200ms'")
    gw.execute("SET skippr.min_lsn = 'FFFFFFF/0'")
    with pytest.raises(psycopg.errors.QueryCanceled) as e:
        gw.execute("SELECT count(*) FROM accounts")
    assert "reached" in str(e.value) and "FFFFFFF/0" in str(e.value), str(e.value)
    with pytest.raises(psycopg.errors.QueryCanceled):
        gw.execute("SELECT skippr.wait_lsn('FFFFFFF/0', '100ms')")
    gw.execute("RESET skippr.min_lsn")
    assert gw.execute("SELECT count(*) FROM accounts").fetchone()[0] == ACCOUNTS
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        gw.execute("SET skippr.min_lsn = 'not an lsn'")
    gw.close()
