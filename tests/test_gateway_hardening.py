"""The gateway's hardening, driven with real clients (psql, psycopg, pgjdbc) and raw sockets.

- `TABLE name` runs wherever a query does: simple and extended protocol, EXPLAIN, COPY (TABLE
  x) TO STDOUT, PREPARE, cursors.
- Malformed protocol messages (truncated fields, counts that disagree, lying lengths) get a
  FATAL 08P01 ErrorResponse and their connection closes; nothing panics and the server keeps
  serving.
- Each statement of a multi-statement simple query has its own `statement_timeout`.
- Every refusal answers psql and pgjdbc as it answers psycopg.
- On SIGTERM a client connected over TLS is told 57P01 before its connection closes.
"""

from __future__ import annotations

import shutil
import socket
import statistics
import struct
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from conftest import describe_run
from test_gateway_clients import (
    JDBC_JAR,
    Gateway,
    make_cert,
    psql,
    psql_path,
    run_tool,
    small_source,
    sqlstate_of,
    start_gateway,
    stop_gateway,
    unique_workspace,
    watchdog,  # noqa: F401  (bounds every test of this module too)
)
from test_gateway_security import REFUSED, SLOW, compile_java, count_items, sgw  # noqa: F401  (fixture)

# --------------------------------------------------------------------------------------------
# pgjdbc: one JVM runs a list of statements on one connection
# --------------------------------------------------------------------------------------------

JAVA_STATEMENTS = r"""
import java.nio.file.*;
import java.sql.*;
import java.util.*;

public class StatementsProbe {
    public static void main(String[] a) throws Exception {
        String url = a[0], user = a[1], password = a[2];
        List<String> lines = Files.readAllLines(Paths.get(a[3]));
        try (Connection c = DriverManager.getConnection(url, user, password)) {
            for (String sql : lines) {
                if (sql.isBlank()) continue;
                String got;
                try (Statement s = c.createStatement()) {
                    boolean rows = s.execute(sql);
                    StringBuilder b = new StringBuilder("ok");
                    // The last result set of the statement(s), as values joined by commas.
                    do {
                        if (rows) {
                            b = new StringBuilder("ok");
                            try (ResultSet r = s.getResultSet()) {
                                int n = r.getMetaData().getColumnCount();
                                while (r.next()) {
                                    b.append('\t');
                                    for (int i = 1; i <= n; i++) {
                                        String v = r.getString(i);
                                        b.append(i > 1 ? "," : "").append(v == null ? "null" : v.replace('\n', ' '));
                                    }
                                }
                            }
                        }
                        rows = s.getMoreResults();
                    } while (rows || s.getUpdateCount() != -1);
                    got = b.toString();
                } catch (SQLException e) {
                    got = "error\t" + e.getSQLState();
                }
                String prepared;
                try (PreparedStatement p = c.prepareStatement(sql)) {
                    p.execute();
                    prepared = "ok";
                } catch (SQLException e) {
                    prepared = e.getSQLState();
                }
                String after;
                try (Statement s2 = c.createStatement(); ResultSet r = s2.executeQuery("SELECT 41 + 1")) {
                    r.next();
                    after = r.getString(1);
                }
                System.out.println(got + "\u001f" + prepared + "\u001f" + after);
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def statements_probe(tmp_path_factory) -> Path:
    return compile_java(tmp_path_factory, "StatementsProbe", JAVA_STATEMENTS)


def run_statements_jdbc(classes: Path, gw: Gateway, statements: list[str], tmp: Path) -> list[tuple[str, str, str]]:
    """Runs each statement with pgjdbc (plain, then prepared, then `SELECT 41 + 1`); returns
    (result, prepared result, answer after) per statement."""
    java = shutil.which("java")
    assert java, "java not installed"
    listing = tmp / "statements.sql"
    listing.write_text("\n".join(statements) + "\n")
    url = f"jdbc:postgresql://{gw.host}:{gw.port}/{gw.dbname}?connectTimeout=10&socketTimeout=120"
    proc = run_tool([java, "-cp", f"{classes}:{JDBC_JAR}", "StatementsProbe", url, gw.user,
                     gw.password or "", listing], timeout=300)
    assert proc.returncode == 0, describe_run(proc, "the pgjdbc probe failed")
    out = [tuple(line.split("\x1f")) for line in proc.stdout.splitlines()]
    assert len(out) == len(statements), proc.stdout
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# TABLE name
# --------------------------------------------------------------------------------------------


def test_table_command_with_psycopg(sgw):
    s = sgw.schema
    first3 = [(1, "v1"), (2, "v2"), (3, "v3")]
    with sgw.connect() as conn:
        assert len(conn.execute(f"TABLE {s}.items").fetchall()) == 25
        assert conn.execute("TABLE items ORDER BY id LIMIT 3").fetchall() == first3, "the default schema"
        assert conn.execute(f"table {s}.items order by id limit 3; ").fetchall() == first3
        # Extended protocol (a prepared statement), with a parameter after TABLE.
        got = conn.execute(f"TABLE {s}.items ORDER BY id LIMIT %s", (3,), prepare=True).fetchall()
        assert got == first3
        plan = conn.execute(f"EXPLAIN TABLE {s}.items").fetchall()
        assert plan and "items" in str(plan)
        assert conn.execute(f"TABLE {s}.items UNION ALL TABLE {s}.items").rowcount == 50
        assert conn.execute(f"SELECT count(*) FROM (TABLE {s}.items) t").fetchone() == (25,)
        conn.execute(f"PREPARE t AS TABLE {s}.items")
        assert len(conn.execute("EXECUTE t").fetchall()) == 25
        conn.execute("DEALLOCATE t")
        conn.execute("BEGIN")
        conn.execute(f"DECLARE c CURSOR FOR TABLE {s}.items ORDER BY id")
        assert conn.execute("FETCH 3 FROM c").fetchall() == first3
        conn.execute("COMMIT")
        with conn.cursor().copy(f"COPY (TABLE {s}.items ORDER BY id LIMIT 2) TO STDOUT") as cp:
            data = b"".join(bytes(chunk) for chunk in cp)
        assert data == b"1\tv1\n2\tv2\n"
        # Still read-only: a write through TABLE is refused as the write it is.
        with pytest.raises(psycopg.Error) as err:
            conn.execute(f"INSERT INTO {s}.items TABLE {s}.items")
        assert sqlstate_of(err.value) == "25006"
        with pytest.raises(psycopg.Error) as err:
            conn.execute("TABLE no_such_table")
        assert sqlstate_of(err.value) == "42P01", err.value


def test_table_command_with_psql_and_pgjdbc(sgw, statements_probe, tmp_path):
    s = sgw.schema
    proc = psql(sgw.conninfo(), f"TABLE {s}.items ORDER BY id LIMIT 2", unaligned=True)
    assert proc.stdout.splitlines()[1:3] == ["1\x1fv1", "2\x1fv2"], proc.stdout
    out = tmp_path / "items.txt"
    psql(sgw.conninfo(), f"\\copy (TABLE {s}.items ORDER BY id LIMIT 2) to '{out}'")
    assert out.read_text() == "1\tv1\n2\tv2\n"
    got = run_statements_jdbc(statements_probe, sgw, [
        f"TABLE {s}.items ORDER BY id LIMIT 2",
        f"EXPLAIN TABLE {s}.items",
    ], tmp_path)
    assert got[0] == ("ok\t1,v1\t2,v2", "ok", "42"), got
    assert got[1][0].startswith("ok\t") and got[1][1:] == ("ok", "42"), got


# --------------------------------------------------------------------------------------------
# Every refusal, with psql and pgjdbc too
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", list(REFUSED))
def test_every_refusal_with_psql(sgw, tmp_path, template):
    out = tmp_path / "written_by_server"
    sql = template.format(s=sgw.schema, out=out)
    cmd = [str(psql_path()), sgw.conninfo(), "-X", "-q", "-A", "-t", "-v", "VERBOSITY=verbose",
           "-c", sql, "-c", f"SELECT count(*) FROM {sgw.schema}.items"]
    proc = run_tool(cmd, env={"PGCONNECT_TIMEOUT": "10"})
    assert "ERROR:" in proc.stderr, describe_run(proc, f"psql accepted {sql}")
    assert any(f"ERROR:  {c}:" in proc.stderr for c in REFUSED[template]), \
        describe_run(proc, f"expected SQLSTATE {REFUSED[template]}")
    assert "25" in proc.stdout.split(), describe_run(proc, "the session did not go on")
    assert not out.exists(), f"{sql} wrote {out} on the server"


def test_every_refusal_with_pgjdbc(sgw, statements_probe, tmp_path):
    out = tmp_path / "written_by_server"
    templates = list(REFUSED)
    got = run_statements_jdbc(statements_probe, sgw,
                              [t.format(s=sgw.schema, out=out) for t in templates], tmp_path)
    for template, (plain, prepared, after) in zip(templates, got):
        codes = REFUSED[template]
        assert plain.startswith("error\t") and plain.split("\t")[1] in codes, (template, plain)
        assert prepared in codes, (template, prepared)
        assert after == "42", (template, after)
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# statement_timeout per statement of a multi-statement query
# --------------------------------------------------------------------------------------------


def medium_query(conn: psycopg.Connection) -> tuple[str, float]:
    """A query that runs for a measured while (at least ~0.3 s): the statement and its median
    duration."""
    n = 1_000_000
    while True:
        sql = f"SELECT count(*) FROM generate_series(1, {n}) AS g(v) WHERE v % 7 = 3"
        times = []
        for _ in range(3):
            t0 = time.monotonic()
            conn.execute(sql).fetchall()
            times.append(time.monotonic() - t0)
        took = statistics.median(times)
        if took >= 0.3 or n >= 64_000_000:
            return sql, took
        n *= 2


def test_statement_timeout_applies_to_each_statement(sgw, statements_probe, tmp_path):
    """`SET statement_timeout = 3t; q; q; q; q; q; q; q; q` (each q taking about t) succeeds:
    the timeout covers each statement, not the whole message (as Postgres 13+). A statement
    over its own timeout still stops with 57014."""
    with sgw.connect() as conn:
        medium, took = medium_query(conn)
        limit_ms = max(300, int(3 * took * 1000))
        eight = "; ".join([medium] * 8)
        expected = conn.execute(medium).fetchone()
        conn.execute(f"SET statement_timeout = {limit_ms}")
        t0 = time.monotonic()
        assert conn.execute(eight).fetchone() == expected
        whole = time.monotonic() - t0
        assert whole > limit_ms / 1000, f"the message ran {whole:.2f}s, not more than one timeout ({limit_ms} ms)"
        with pytest.raises(psycopg.errors.QueryCanceled) as err:
            conn.execute(f"SELECT 1; {SLOW}")
        assert "statement timeout" in str(err.value)
        assert count_items(conn, sgw) == 25
    # psql sends `-c` text as one simple-query message too.
    proc = psql(sgw.conninfo(), f"SET statement_timeout = {limit_ms}; {eight}", unaligned=True, check=False)
    assert proc.returncode == 0 and str(expected[0]) in proc.stdout.split(), describe_run(proc)
    proc = psql(sgw.conninfo(), f"SET statement_timeout = {limit_ms}; {medium}; {SLOW}", check=False)
    assert "canceling statement due to statement timeout" in proc.stderr, describe_run(proc)
    # pgjdbc sends the statements of one execute() as a batch of extended-protocol messages.
    got = run_statements_jdbc(statements_probe, sgw, [f"SET statement_timeout = {limit_ms}; {eight}",
                                                      f"SET statement_timeout = {limit_ms}; {SLOW}"], tmp_path)
    assert got[0][0] == f"ok\t{expected[0]}", got
    assert got[1][0] == "error\t57014", got


# --------------------------------------------------------------------------------------------
# Malformed protocol messages
# --------------------------------------------------------------------------------------------


def message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", 4 + len(body)) + body


def read_messages(s: socket.socket) -> list[tuple[bytes, bytes]]:
    """Every message until the server closes the connection."""
    data = b""
    s.settimeout(15)
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    out = []
    while len(data) >= 5:
        kind, length = data[:1], struct.unpack("!i", data[1:5])[0]
        out.append((kind, data[5:1 + length]))
        data = data[1 + length:]
    return out


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return fields


def started(gw: Gateway) -> socket.socket:
    """A raw connection past start-up (trust on loopback), ready for a query."""
    s = socket.create_connection((gw.host, gw.port), timeout=10)
    params = f"user\0{gw.user}\0database\0{gw.dbname}\0\0".encode()
    s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
    data = b""
    while not data.endswith(b"Z\0\0\0\x05I"):
        chunk = s.recv(4096)
        assert chunk, f"the server closed the connection during start-up: {data!r}"
        data += chunk
    return s


BIND_HEAD = b"\0\0"  # unnamed portal, unnamed statement
MALFORMED = {
    "Bind cut short": message(b"B", BIND_HEAD + b"\0\0\0\x01"),
    "Bind value longer than the message": message(b"B", BIND_HEAD + b"\0\0\0\x01" + struct.pack("!i", 100) + b"abc\0\0"),
    "Bind with two formats for one value": message(b"B", BIND_HEAD + b"\0\x02\0\0\0\0\0\x01" + struct.pack("!i", 1) + b"1\0\0"),
    "Bind with bytes after its last field": message(b"B", BIND_HEAD + b"\0\0\0\0\0\0junk"),
    "Parse without its query": message(b"P", b"\0"),
    "Parse with types it does not carry": message(b"P", b"s\0SELECT 1\0\0\x03"),
    "Describe without a target": message(b"D", b""),
    "Describe of an unknown kind": message(b"D", b"Zs\0"),
    "Execute without its row limit": message(b"E", b"\0"),
    "Close without a target": message(b"C", b""),
    "Sync with a body": message(b"S", b"xx"),
    "Query without its terminator": message(b"Q", b"SELECT 1"),
    "a length below 4": b"Q" + struct.pack("!i", 2),
    "a negative length": b"B" + struct.pack("!i", -1),
    "an unknown message type": message(b"Y", b""),
    # Well formed each, but the Bind names 2 result formats for a query of 3 columns.
    "result formats that do not match the columns": (
        message(b"P", b"\0SELECT 1 AS a, 2 AS b, 3 AS c\0\0\0")
        + message(b"B", BIND_HEAD + b"\0\0\0\0\0\x02\0\x01\0\x01")
        + message(b"E", b"\0\0\0\0\0")
    ),
}


def test_malformed_messages_get_08P01_and_close(sgw):
    for name, raw in MALFORMED.items():
        with started(sgw) as s:
            s.sendall(raw + message(b"S", b""))
            replies = read_messages(s)
        errors = [error_fields(body) for kind, body in replies if kind == b"E"]
        assert errors, f"{name}: no ErrorResponse in {replies}\n{sgw.log()[max(0, sgw.log().find('panicked') - 300):][:2500]}"
        assert errors[-1].get("C") == "08P01" and errors[-1].get("S") == "FATAL", f"{name}: {errors}"
        assert replies[-1][0] == b"E", f"{name}: the connection went on after the error: {replies}"
    # The server keeps serving: a fresh client, and nothing panicked.
    with sgw.connect() as fresh:
        assert count_items(fresh, sgw) == 25
        assert fresh.execute("SELECT 1, 2, 3", prepare=True).fetchone() == (1, 2, 3)
    assert "panicked" not in sgw.log(), sgw.log()[-4000:]


# --------------------------------------------------------------------------------------------
# SIGTERM tells TLS clients too
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tls_gateway(db, workdir) -> Iterator[Gateway]:
    small_source(db)
    crt, key = make_cert(workdir)
    password = "tls; 'pw'"
    with start_gateway(db, workdir, ["items"], workspace=unique_workspace(),
                       query={"tls": {"cert": crt.name, "key": key.name},
                              "users": [{"name": "analyst", "password": "${ANALYST_PASSWORD}"}]},
                       env={"ANALYST_PASSWORD": password}, user="analyst", password=password) as gw:
        yield gw


def test_sigterm_sends_57P01_over_tls(tls_gateway):
    gw = tls_gateway
    idle = gw.connect(sslmode="require")
    in_transaction = gw.connect(sslmode="require")
    try:
        assert idle.pgconn.ssl_in_use and in_transaction.pgconn.ssl_in_use
        assert count_items(idle, gw) == 25
        in_transaction.execute("BEGIN")
        assert count_items(in_transaction, gw) == 25
        assert gw.proc is not None
        assert stop_gateway(gw.proc) == 0, gw.log()
        for conn in (idle, in_transaction):
            with pytest.raises(psycopg.OperationalError) as err:
                conn.execute("SELECT 1")
            assert "terminating connection due to administrator command" in str(err.value), repr(err.value)
            assert sqlstate_of(err.value) in (None, "57P01"), repr(err.value)
        assert "panicked" not in gw.log()
    finally:
        idle.close()
        in_transaction.close()


# --------------------------------------------------------------------------------------------
# skipprd query honours the same limits
# --------------------------------------------------------------------------------------------

RUNAWAY_JOIN = ("SELECT count(*) FROM generate_series(1, 30000000) a(x) "
                "JOIN generate_series(1, 30000000) b(y) ON a.x = b.y")


def test_cli_query_honours_statement_timeout_and_memory(db, skippr):
    small_source(db)
    skippr.write_config(["items"], query={"statement_timeout": "1s", "max_query_memory": "64MiB"})
    skippr.sync_once()
    proc = skippr.run("query", "SELECT count(*) FROM analytics.items", check=False)
    assert proc.returncode == 0 and "25" in proc.stdout, describe_run(proc)
    t0 = time.monotonic()
    proc = skippr.run("query", SLOW, check=False)
    took = time.monotonic() - t0
    assert proc.returncode == 1, describe_run(proc, "a runaway CLI query must fail")
    assert "canceling statement due to statement timeout" in proc.stderr, describe_run(proc)
    assert "skippr.query.statement_timeout" in proc.stderr, describe_run(proc)
    assert took < 30, f"the CLI query stopped after {took:.1f}s"
    # Memory: a timeout long enough for the join to hit its pool first.
    skippr.write_config(["items"], query={"statement_timeout": "5min", "max_query_memory": "64MiB"})
    proc = skippr.run("query", RUNAWAY_JOIN, check=False)
    assert proc.returncode == 1, describe_run(proc, "a CLI query over its memory must fail")
    assert "Resources exhausted" in proc.stderr and "skippr.query.max_query_memory" in proc.stderr, \
        describe_run(proc)
    assert "panicked" not in proc.stderr


def test_cli_query_only_reads(db, skippr, tmp_path):
    """`skipprd query` plans with the gateway's read-only options: no COPY to a file, no DDL."""
    small_source(db)
    skippr.write_config(["items"])
    skippr.sync_once()
    target = tmp_path / "out.csv"
    for sql in (f"COPY (SELECT * FROM analytics.items) TO '{target}'",
                f"COPY analytics.items TO '{target}'",
                f"CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{tmp_path}'",
                "CREATE TABLE y AS SELECT 1",
                "SET datafusion.execution.batch_size = 1"):
        proc = skippr.run("query", sql, check=False)
        assert proc.returncode != 0, describe_run(proc, f"the CLI ran a write: {sql}")
        assert "not supported" in proc.stderr, describe_run(proc)
        assert "panicked" not in proc.stderr
    assert not target.exists()
    proc = skippr.run("query", "SELECT count(*) FROM analytics.items", check=False)
    assert proc.returncode == 0 and "25" in proc.stdout, describe_run(proc)
