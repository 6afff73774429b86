"""Many analysts at once on real sizes (issue 42): eight clients run TPC-H at scale factor 1
(all 22 queries, each client starting at another one) against one `skipprd serve` whose
statements share `skippr.query.max_memory: 512MiB`, while a writer keeps inserting into
another table of the same pipeline. Every answer equals Postgres's, nothing crashes, the
process's peak RSS stays within `max_memory` + 300 MiB, and the ingest loop commits all along.

At scale factor 0.1 the statements fit in memory anyway and could not tell; at 1, a hash join
or an aggregate of one statement alone needs hundreds of MiB, so this only passes when the
statements wait, spill or share the pool. It keeps both cores busy for minutes, so it runs in
the main sequence, not beside it in the `concurrent` group (whose tests mostly wait)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

import tpch
from conftest import Database, Skippr, free_port
from test_cdc import bg_log, stop
from test_consistency import connect_gateway
from test_gateway_load import vm_hwm_mib

SCALE_FACTOR = 1
CLIENTS = 8
MAX_MEMORY_MIB = 512
#: A table the writer inserts into while the clients run.
TICKS = "CREATE TABLE ticks (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"


@dataclass
class Client:
    """One analyst: a session running the 22 queries from query `first` on."""

    port: int
    texts: list[tuple[int, str]]
    first: int
    answers: dict[int, list[tuple]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    took: float = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            with psycopg.connect(host="127.0.0.1", port=self.port, dbname="analytics", user="skippr",
                                 autocommit=True) as conn:
                order = self.texts[self.first:] + self.texts[:self.first]
                for n, sql in order:
                    try:
                        self.answers[n] = conn.execute(sql).fetchall()
                    except psycopg.Error as e:
                        self.errors.append(f"Q{n}: {type(e).__name__} ({e.sqlstate}): {e}")
        except BaseException as e:  # noqa: BLE001
            self.errors.append(f"session: {type(e).__name__}: {e}")
        self.took = time.monotonic() - started


@pytest.fixture(scope="module")
def loaded(pg, tmp_path_factory) -> Iterator[tuple[Database, list[tuple[int, str]], dict[int, list[tuple]]]]:
    """A database holding TPC-H SF 1 (and `ticks`), the 22 texts and Postgres's answers."""
    from conftest import _drop_database

    name = "tpch_load"
    pg.execute(f'DROP DATABASE IF EXISTS "{name}"')
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        db = Database(pg, name)
        duck = tpch.generate(SCALE_FACTOR)
        texts = tpch.queries(duck)
        scratch = tmp_path_factory.mktemp("tpch-sf1")
        with db.connect() as src:
            tpch.load_postgres(duck, src, scratch)
            duck.close()
            src.execute(TICKS)
            # Postgres answers Q17 and Q20 (correlated subqueries on lineitem) by index lookups
            # instead of nested loops over 6M rows.
            src.execute("CREATE INDEX ON lineitem (l_partkey, l_suppkey)")
            src.execute("ANALYZE lineitem")
            started = time.monotonic()
            expected = {n: src.execute(sql).fetchall() for n, sql in texts}
            print(f"Postgres answered the 22 queries in {time.monotonic() - started:.1f}s")
        yield db, texts, expected
    finally:
        _drop_database(pg, name)


def committed_lsn(conn: psycopg.Connection) -> str | None:
    return conn.execute("SELECT committed_lsn FROM skippr.tables WHERE table_name = 'ticks'").fetchone()[0]


def test_eight_clients_on_sf1_answer_right_within_the_memory_bound_while_ingest_commits(
        loaded, tmp_path_factory) -> None:
    db, texts, expected = loaded
    workdir = tmp_path_factory.mktemp("tpch-load") / "work"
    workdir.mkdir()
    skippr = Skippr(db=db, workdir=workdir)
    port = free_port()
    skippr.write_config(
        [*tpch.TABLES, "ticks"],
        extra_pipeline={"commit_interval": "2s"},
        query={"listen": f"127.0.0.1:{port}", "max_memory": f"{MAX_MEMORY_MIB}MiB",
               "statement_timeout": "20min"},
    )
    started = time.monotonic()
    skippr.sync_once()
    print(f"sync --once copied TPC-H SF 1 in {time.monotonic() - started:.1f}s")
    proc = skippr.start("serve")
    stop_writing = threading.Event()
    written = [0]

    def write() -> None:
        with db.connect() as w:
            while not stop_writing.is_set():
                written[0] += 1
                w.execute("INSERT INTO ticks (id) VALUES (%s)", (written[0],))
                time.sleep(0.05)

    try:
        gw = connect_gateway(port, proc)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        commits: list[str] = []
        clients = [Client(port, texts, (i * 3) % len(texts)) for i in range(CLIENTS)]
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        started = time.monotonic()
        for t in threads:
            t.start()
        # The ingest loop goes on while the clients run: the committed LSN of `ticks` moves.
        while any(t.is_alive() for t in threads):
            assert proc.poll() is None, f"serve ended with {proc.returncode}\n{bg_log(skippr)}"
            lsn = committed_lsn(gw)
            if lsn is not None and (not commits or commits[-1] != lsn):
                commits.append(lsn)
            assert time.monotonic() - started < 1500, "the clients did not finish within 25 minutes"
            time.sleep(1)
        took = time.monotonic() - started
        stop_writing.set()
        writer.join(10)

        wrong = []
        for i, c in enumerate(clients):
            wrong += [f"client {i}: {e}" for e in c.errors]
            for n, sql in texts:
                if n in c.answers and not tpch.same_answer(sql, expected[n], c.answers[n]):
                    wrong.append(f"client {i}: Q{n}: expected {expected[n][:2]}... ({len(expected[n])} rows), "
                                 f"got {c.answers[n][:2]}... ({len(c.answers[n])} rows)")
        peak = vm_hwm_mib(proc.pid)
        print(f"{CLIENTS} clients x 22 queries in {took:.0f}s (each {[round(c.took) for c in clients]} s); "
              f"peak RSS {peak:.0f} MiB; {len(commits)} commits of `ticks` seen while they ran; "
              f"{written[0]} rows written")
        assert not wrong, "\n".join(wrong[:20]) + "\n" + bg_log(skippr)[-4000:]
        assert peak <= MAX_MEMORY_MIB + 300, f"VmHWM {peak:.0f} MiB > {MAX_MEMORY_MIB} + 300 MiB"
        # Commits every 2 s: at least one commit for every 20 s of load (a starved loop makes none).
        assert len(commits) >= max(3, int(took / 20)), (
            f"only {len(commits)} commits of `ticks` during {took:.0f}s of load\n{bg_log(skippr)[-4000:]}")
        # Everything written is there once the writer stopped.
        with db.connect() as src:
            lsn = src.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
        gw.execute(f"SELECT skippr.wait_lsn('{lsn}', '60s')")
        assert gw.execute("SELECT count(*) FROM ticks").fetchone()[0] == written[0]
        gw.close()
    finally:
        stop_writing.set()
        assert stop(proc) == 0, bg_log(skippr)
