"""See and stop work, as in Postgres (issue 42, item 4): the gateway's sessions in
`pg_stat_activity`, `pg_cancel_backend` and `pg_terminate_backend` under the rule of
`skippr.query.users` (a user reaches its own sessions, a user with `admin: true` every one,
42501 otherwise), a statement waiting for its turn shown as `wait_event_type = 'Queue'`, and
`skippr.query.log_min_duration` logging slow statements.

One gateway for the module, over `items` (25 rows): three users (alice and bob, and root with
`admin: true`), `max_concurrent_statements: 1`, `log_min_duration: 500ms`. Statements that read
only the catalog (`pg_stat_activity`, the signal functions) take no turn, so they answer while
a long statement holds the only one.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import psycopg
import pytest

from conftest import Database, _drop_database
from test_gateway_clients import (
    Gateway,
    small_source,
    sqlstate_of,
    start_gateway,
    unique_workspace,
    watchdog,  # noqa: F401  (bounds every test of this module too)
)

#: A statement that runs for minutes unless it is stopped (the engine yields while it runs).
SLOW = "SELECT count(*) AS slow_marker FROM generate_series(1, 100000000000) AS g(v) WHERE v % 7 = 3"

USERS = {"alice": "alice-pw", "bob": "bob-pw", "root": "root-pw"}

#: Postgres's type oids of some of pg_stat_activity's columns.
TYPES = {"datid": 26, "datname": 19, "pid": 23, "usename": 19, "client_addr": 869,
         "client_port": 23, "backend_start": 1184, "query_start": 1184, "state": 25,
         "wait_event_type": 25, "query_id": 20, "query": 25, "backend_type": 25}

ACTIVITY = ("SELECT pid, usename, state, wait_event_type, wait_event, query, backend_type "
            "FROM pg_stat_activity WHERE pid = %s")


@pytest.fixture(scope="module")
def agw(pg, tmp_path_factory) -> Iterator[Gateway]:
    name = "a_" + os.urandom(6).hex()
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        source = Database(pg, name)
        small_source(source)
        workdir = tmp_path_factory.mktemp("activity") / "work"
        workdir.mkdir()
        users = [{"name": n, "password": p, **({"admin": True} if n == "root" else {})}
                 for n, p in USERS.items()]
        query = {"users": users, "statement_timeout": "1min", "max_concurrent_statements": 1,
                 "log_min_duration": "500ms"}
        with start_gateway(source, workdir, ["items"], workspace=unique_workspace(), query=query,
                           user="root", password=USERS["root"]) as gateway:
            yield gateway
    finally:
        _drop_database(pg, name)


def connect(gw: Gateway, user: str) -> psycopg.Connection:
    return gw.connect(user=user, password=USERS[user])


@dataclass
class Run:
    """A statement run by its own session (as `user`) in a thread: its rows or its error."""

    gw: Gateway
    user: str
    sql: str
    conn: psycopg.Connection | None = None
    pid: int = 0
    ended: float | None = None
    rows: list[tuple] | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Run":
        self.conn = connect(self.gw, self.user)
        self.pid = self.conn.info.backend_pid

        def body() -> None:
            try:
                assert self.conn is not None
                self.ready.set()
                self.rows = self.conn.execute(self.sql).fetchall()
            except BaseException as e:  # noqa: BLE001  (reported by the test)
                self.error = e
            finally:
                self.ended = time.monotonic()

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def join(self, timeout: float = 30) -> "Run":
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"`{self.sql[:60]}` still runs after {timeout}s"
        return self

    def close(self) -> None:
        if self.conn is None:
            return
        if self.thread is not None and self.thread.is_alive() and not self.conn.closed:
            self.conn.cancel()
            self.thread.join(30)
        self.conn.close()


def wait_for(what: str, check: Callable[[], Any], timeout: float, gw: Gateway) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"{what}: not within {timeout}s\n{gw.log()}")


def activity(conn: psycopg.Connection, pid: int) -> tuple | None:
    return conn.execute(ACTIVITY, (pid,)).fetchone()


def running(conn: psycopg.Connection, pid: int) -> Callable[[], tuple | None]:
    """Whether session `pid` runs its statement (and holds its turn) now."""
    def check() -> tuple | None:
        row = activity(conn, pid)
        return row if row is not None and row[2] == "active" and row[3] is None else None
    return check


def test_pg_stat_activity_lists_the_sessions_live(agw):
    """A second session sees the first running its long statement (`active`, its text), an
    idle one as `idle`, and itself as `active` with its own query; another user (not an admin)
    sees who the session is but not its statement; the columns have Postgres's types, and
    `pg_catalog.pg_stat_activity` is the same relation."""
    a = Run(agw, "alice", SLOW).start()
    try:
        with connect(agw, "bob") as idle, connect(agw, "root") as observer:
            idle.execute("SET application_name = 'idler'")
            row = wait_for("A shows as active", running(observer, a.pid), 10, agw)
            assert row[1] == "alice" and row[4] is None and row[6] == "client backend", row
            assert "slow_marker" in row[5] and "generate_series" in row[5], row
            assert activity(observer, idle.info.backend_pid)[1:4] == ("bob", "idle", None)
            # Another user's session: who it is, not what it does (as Postgres without
            # pg_read_all_stats); an admin (root, above) sees everything.
            hidden = idle.execute("SELECT usename, state, query, client_addr, query_start "
                                  "FROM pg_stat_activity WHERE pid = %s", (a.pid,)).fetchone()
            assert hidden == ("alice", None, "<insufficient privilege>", None, None), hidden
            cur = observer.execute(
                "SELECT application_name, state FROM pg_catalog.pg_stat_activity WHERE pid = %s",
                (idle.info.backend_pid,))
            assert cur.fetchone() == ("idler", "idle")
            me = observer.info.backend_pid
            own = observer.execute("SELECT state, query FROM pg_stat_activity WHERE pid = pg_backend_pid()")
            state, query = own.fetchone()
            assert state == "active" and "pg_backend_pid()" in query, (state, query)
            assert observer.execute("SELECT pg_backend_pid()").fetchone() == (me,)
            cur = observer.execute("SELECT * FROM pg_stat_activity WHERE pid = %s", (me,))
            got = {d.name: d.type_code for d in cur.description}
            assert {k: got.get(k) for k in TYPES} == TYPES, got
            r = dict(zip(got, cur.fetchone()))
            assert str(r["client_addr"]) == "127.0.0.1" and r["client_port"] > 0, r
            assert r["backend_start"] <= r["query_start"] and r["xact_start"] is not None, r
            pids = {p for (p,) in observer.execute("SELECT pid FROM pg_stat_activity").fetchall()}
            assert {a.pid, idle.info.backend_pid, me} <= pids, pids
            assert len({a.pid, idle.info.backend_pid, me}) == 3, "every session has its own pid"
    finally:
        a.close()


def test_pg_cancel_backend_ends_the_statement_as_a_cancel_request(agw):
    """Another user may not cancel alice's statement (42501 with Postgres's message and a
    DETAIL); an admin may: the statement ends with 57014 within two seconds and alice's
    session answers its next statement. Alice may cancel her own statement from another
    session. An unknown pid gives false and Postgres's WARNING."""
    with connect(agw, "bob") as bob, connect(agw, "root") as root, connect(agw, "alice") as alice2:
        a = Run(agw, "alice", SLOW).start()
        try:
            wait_for("A runs", running(root, a.pid), 10, agw)
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
                bob.execute("SELECT pg_cancel_backend(%s)", (a.pid,)).fetchall()
            assert err.value.diag.message_primary == "permission denied to cancel query", err.value
            assert "admin: true" in (err.value.diag.message_detail or ""), err.value.diag.message_detail
            assert a.ended is None, "a refused cancel stopped the statement"
            t0 = time.monotonic()
            assert root.execute("SELECT pg_cancel_backend(%s)", (a.pid,)).fetchone() == (True,)
            a.join(10)
            assert sqlstate_of(a.error) == "57014", a.error
            assert "canceling statement due to user request" in str(a.error), a.error
            assert a.ended is not None and a.ended - t0 < 2.0, f"the cancel took {a.ended - t0:.2f}s"
            assert a.conn is not None and a.conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            a.close()

        own = Run(agw, "alice", SLOW).start()
        try:
            wait_for("alice's statement runs", running(root, own.pid), 10, agw)
            cur = alice2.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                                 "WHERE usename = 'alice' AND state = 'active' AND pid <> pg_backend_pid()")
            assert cur.fetchall() == [(True,)]
            own.join(10)
            assert sqlstate_of(own.error) == "57014", own.error
        finally:
            own.close()

        notices: list[str] = []
        bob.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        assert bob.execute("SELECT pg_cancel_backend(999999)").fetchone() == (False,)
        assert notices == ["PID 999999 is not a PostgreSQL backend process"], notices
        assert bob.execute("SELECT pg_cancel_backend(NULL)").fetchone() == (None,)


def test_pg_terminate_backend_closes_the_connection(agw):
    """A non-admin may not terminate another user's session (42501); an admin terminates an
    idle session and a running one: each gets FATAL 57P01 and its connection is closed, and
    both leave pg_stat_activity. With a timeout, the call returns once the session is gone."""
    with connect(agw, "bob") as bob, connect(agw, "root") as root:
        idle = connect(agw, "alice")
        a = Run(agw, "alice", SLOW).start()
        try:
            wait_for("A runs", running(root, a.pid), 10, agw)
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
                bob.execute("SELECT pg_terminate_backend(%s)", (idle.info.backend_pid,)).fetchall()
            assert err.value.diag.message_primary == "permission denied to terminate process", err.value
            assert bob.execute("SELECT 1").fetchone() == (1,)

            pid = idle.info.backend_pid
            assert root.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
            wait_for("the idle session is gone", lambda: activity(root, pid) is None, 5, agw)
            with pytest.raises(psycopg.OperationalError):
                idle.execute("SELECT 1").fetchall()

            t0 = time.monotonic()
            cur = root.execute("SELECT pg_terminate_backend(%s, 5000)", (a.pid,))
            assert cur.fetchone() == (True,)
            assert activity(root, a.pid) is None, "still listed after the wait"
            a.join(10)
            assert a.ended is not None and a.ended - t0 < 2.0, f"terminating took {a.ended - t0:.2f}s"
            assert isinstance(a.error, psycopg.OperationalError), a.error
            assert sqlstate_of(a.error) in ("57P01", None), a.error
            assert "terminating connection due to administrator command" in str(a.error), a.error
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                root.execute("SELECT pg_terminate_backend(%s, -1)", (bob.info.backend_pid,)).fetchall()
            # The gateway goes on: the next statement takes the turn at once.
            assert root.execute(f"SELECT count(*) FROM {agw.schema}.items").fetchone() == (25,)
        finally:
            a.close()
            idle.close()


def test_a_statement_waiting_for_its_turn_shows_the_queue_and_slow_ones_are_logged(agw):
    """With one turn, alice's long statement runs and bob's waits: bob's session is `active`
    with `wait_event_type = 'Queue'`, alice's has none. Once alice's statement is cancelled,
    bob's answers; having waited past `log_min_duration` (500ms), it is logged at INFO with its
    text, pid, user, duration and rows (a quick statement is not)."""
    queued_sql = f"SELECT id AS queued_marker FROM {agw.schema}.items WHERE id <= 3 ORDER BY id"
    with connect(agw, "root") as root:
        a = Run(agw, "alice", SLOW).start()
        b: Run | None = None
        try:
            wait_for("A runs", running(root, a.pid), 10, agw)
            b = Run(agw, "bob", queued_sql).start()
            row = wait_for("B waits for its turn",
                           lambda: (r := activity(root, b.pid)) is not None and r[3] is not None and r,
                           10, agw)
            assert row[1:5] == ("bob", "active", "Queue", "StatementAdmission"), row
            assert "queued_marker" in row[5], row
            assert activity(root, a.pid)[2:5] == ("active", None, None)
            time.sleep(0.6)
            assert b.ended is None, "B ran without a turn"
            assert root.execute("SELECT 1 AS quick_marker").fetchone() == (1,)
            assert root.execute("SELECT pg_cancel_backend(%s)", (a.pid,)).fetchone() == (True,)
            b.join(20)
            assert b.error is None, b.error
            assert b.rows == [(1,), (2,), (3,)], b.rows
            a.join(10)
            assert sqlstate_of(a.error) == "57014", a.error
        finally:
            a.close()
            if b is not None:
                b.close()

    def logged() -> list[str]:
        assert agw.skippr is not None
        text = (agw.skippr.workdir / "bg.stderr").read_text(errors="replace")
        return [line for line in text.splitlines() if "skippr.query.log_min_duration" in line]

    lines = wait_for("B's statement is logged", lambda: [x for x in logged() if "queued_marker" in x], 5, agw)
    line = lines[-1]
    assert "INFO" in line and f"pid={b.pid}" in line and "user=bob" in line and "rows=3" in line, line
    ms = int(re.search(r"duration_ms=(\d+)", line).group(1))
    assert ms >= 500, line
    assert any("slow_marker" in x and f"pid={a.pid}" in x and "ok=false" in x for x in logged()), logged()
    assert not any("quick_marker" in x for x in logged()), logged()
