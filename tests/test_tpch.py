"""TPC-H through the gateway of `skipprd serve`: the 22 queries over the replicated tables
answer exactly what Postgres answers, first over the copied snapshot, then after a refresh of
inserts, updates and deletes that is partly committed to Iceberg and partly in the WAL tail.
(Timings are benches/tpch.sh's business, not this test's.)"""

from __future__ import annotations

import psycopg

import tpch
from conftest import Database, Skippr, free_port
from test_cdc import bg_log, stop
from test_consistency import connect_gateway

SCALE_FACTOR = 0.01


def differences(gw: psycopg.Connection, src: psycopg.Connection, texts: list[tuple[int, str]]) -> list[str]:
    wrong = []
    for n, sql in texts:
        expected = src.execute(sql).fetchall()
        try:
            actual = gw.execute(sql).fetchall()
        except psycopg.Error as e:
            wrong.append(f"Q{n}: {type(e).__name__}: {e}")
            continue
        if not tpch.same_answer(sql, expected, actual):
            wrong.append(f"Q{n}: expected {expected[:3]}... ({len(expected)} rows), got {actual[:3]}... "
                         f"({len(actual)} rows)")
    return wrong


def test_tpch_answers_equal_postgres_before_and_after_a_refresh(skippr: Skippr, db: Database, tmp_path) -> None:
    duck = tpch.generate(SCALE_FACTOR)
    texts = tpch.queries(duck)
    assert len(texts) == 22
    with db.connect() as src:
        counts = tpch.load_postgres(duck, src, tmp_path)
    assert counts["lineitem"] > 50_000
    port = free_port()
    # A commit interval longer than the test: the refresh stays in the WAL tail until the
    # explicit commit below, so both the tail and the committed state are checked.
    skippr.write_config(tpch.TABLES, extra_pipeline={"commit_interval": "10m"},
                        query={"listen": f"127.0.0.1:{port}"})
    skippr.sync_once()
    proc = skippr.start("serve")
    try:
        gw = connect_gateway(port, proc)
        with db.connect() as src:
            wrong = differences(gw, src, texts)
            assert not wrong, "\n".join(wrong)
            # The planner knows from the scan's column statistics that Q4's date filter keeps
            # a few orders: it builds the semi join's hash table on them, not on lineitem.
            q4 = dict(texts)[4]
            plan = "\n".join(r[-1] for r in gw.execute("EXPLAIN " + q4).fetchall())
            join = next(line for line in plan.splitlines() if "HashJoinExec" in line)
            assert "on=[(o_orderkey" in join, plan

            tpch.refresh(src)
            lsn = src.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
            gw.execute(f"SELECT skippr.wait_lsn('{lsn}', '60s')")
            assert gw.execute("SELECT sum(wal_tail_changes) FROM skippr.tables").fetchone()[0] > 0
            wrong = differences(gw, src, texts)
            assert not wrong, "after the refresh, from the WAL tail:\n" + "\n".join(wrong)
        gw.close()
    finally:
        assert stop(proc) == 0, bg_log(skippr)

    # Committed to Iceberg (SIGTERM commits the tail), then read again.
    proc = skippr.start("serve")
    try:
        gw = connect_gateway(port, proc)
        assert gw.execute("SELECT sum(wal_tail_changes) FROM skippr.tables").fetchone()[0] == 0
        with db.connect() as src:
            wrong = differences(gw, src, texts)
            assert not wrong, "after the refresh, committed:\n" + "\n".join(wrong)
        gw.close()
    finally:
        assert stop(proc) == 0, bg_log(skippr)
