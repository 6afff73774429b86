"""The gateway's security model and limits, driven with real clients (psql, psycopg, pgjdbc).

- Read-only for real: every write, `COPY ... TO 'file'`, `EXPLAIN ANALYZE` of a non-query,
  `CREATE EXTERNAL TABLE` and engine settings are refused with 25006 or 42501 (or 42601 when
  the statement is not even valid here), nothing is written on the server, and the connection
  stays usable; `COPY ... TO STDOUT` (psql's `\\copy`) works.
- `statement_timeout` (from skippr.yml, or SET per session) stops a running statement with
  57014 and the connection stays usable.
- A cancel request (psql's Ctrl-C, psycopg `conn.cancel()`, pgjdbc `Statement.cancel()`) stops
  the running statement with 57014.
- Limits: `max_connections` (53300 beyond it, the server keeps answering), `max_query_memory`
  (53200 for the runaway statement while ingest keeps committing).
- TLS means TLS: a client that does not ask for TLS is refused; TLS below 1.2 is refused; SCRAM
  answers an unknown user exactly as a wrong password.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from conftest import Database, _drop_database, describe_run
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
    unique_workspace,
    watchdog,  # noqa: F401  (bounds every test of this module too)
)

#: A statement that runs for minutes unless it is stopped (the engine yields while it runs).
SLOW = "SELECT count(*) FROM generate_series(1, 100000000000) AS g(v) WHERE v % 7 = 3"

#: Refusals: statement -> the SQLSTATEs that are right for it.
REFUSED = {
    "INSERT INTO {s}.items VALUES (100, 'x')": {"25006"},
    "UPDATE {s}.items SET v = 'x'": {"25006"},
    "DELETE FROM {s}.items": {"25006"},
    "TRUNCATE {s}.items": {"25006"},
    "DROP TABLE {s}.items": {"25006"},
    "CREATE TABLE {s}.t2 (a int)": {"25006"},
    "CREATE VIEW {s}.v AS SELECT 1": {"25006"},
    "COPY {s}.items TO '{out}'": {"42501"},
    "COPY (SELECT * FROM {s}.items) TO '{out}'": {"42501"},
    "COPY (SELECT 1) TO PROGRAM 'touch {out}'": {"42501"},
    "COPY {s}.items FROM '{out}'": {"25006"},
    "EXPLAIN ANALYZE COPY {s}.items TO '{out}'": {"42501"},
    "EXPLAIN ANALYZE INSERT INTO {s}.items VALUES (100, 'x')": {"25006"},
    "WITH d AS (DELETE FROM {s}.items RETURNING *) SELECT * FROM d": {"25006"},
    "SELECT * INTO {s}.copy_of FROM {s}.items": {"25006"},
    "CREATE EXTERNAL TABLE ext STORED AS CSV LOCATION '{out}'": {"42501", "42601"},
    "SET datafusion.execution.target_partitions = 1": {"42501"},
    "SET datafusion.runtime.memory_limit = '100G'": {"42501"},
    "SET ROLE postgres": {"42501"},
}


@pytest.fixture(scope="module")
def sgw(pg, tmp_path_factory) -> Iterator[Gateway]:
    """A gateway (no users, loopback) over `items`, with a default statement_timeout of 1min."""
    name = "s_" + os.urandom(6).hex()
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        source = Database(pg, name)
        small_source(source)
        workdir = tmp_path_factory.mktemp("security") / "work"
        workdir.mkdir()
        with start_gateway(source, workdir, ["items"], workspace=unique_workspace(),
                           query={"statement_timeout": "1min"}) as gateway:
            yield gateway
    finally:
        _drop_database(pg, name)


def count_items(conn: psycopg.Connection, gw: Gateway) -> int:
    return conn.execute(f"SELECT count(*) FROM {gw.schema}.items").fetchone()[0]


# --------------------------------------------------------------------------------------------
# pgjdbc
# --------------------------------------------------------------------------------------------

JAVA_PROBE = r"""
import java.sql.*;

public class SecurityProbe {
    static void state(String label, SQLException e) {
        System.out.println(label + "\t" + e.getSQLState() + "\t" + e.getMessage().replace('\n', ' '));
    }

    public static void main(String[] a) throws Exception {
        String url = a[0], user = a[1], password = a[2], mode = a[3], sql = a[4];
        try (Connection c = DriverManager.getConnection(url, user, password)) {
            Statement s = c.createStatement();
            if (mode.equals("cancel")) {
                Thread t = new Thread(() -> {
                    try { Thread.sleep(1500); s.cancel(); } catch (Exception e) { e.printStackTrace(); }
                });
                t.start();
            } else if (mode.equals("timeout")) {
                s.execute("SET statement_timeout = '1s'");
            }
            long t0 = System.nanoTime();
            try {
                ResultSet r = s.executeQuery(sql);
                while (r.next()) { }
                System.out.println("ok");
            } catch (SQLException e) {
                state("error", e);
            }
            System.out.println("seconds\t" + (System.nanoTime() - t0) / 1e9);
            // The same connection still answers.
            try (Statement s2 = c.createStatement(); ResultSet r = s2.executeQuery("SELECT 41 + 1")) {
                r.next();
                System.out.println("after\t" + r.getInt(1));
            }
            // A prepared statement takes the same path (classified, then planned).
            try (PreparedStatement p = c.prepareStatement(sql)) {
                p.executeQuery();
                System.out.println("prepared\tok");
            } catch (SQLException e) {
                state("prepared", e);
            }
        }
    }
}
"""


def compile_java(tmp_path_factory, name: str, source: str) -> Path:
    """Compiles the Java class `name` from `source`; returns the folder of its class file."""
    import shutil

    javac = shutil.which("javac")
    assert javac, "javac not installed (tests/run installs default-jdk-headless)"
    assert JDBC_JAR.exists(), f"{JDBC_JAR} missing (tests/run installs libpostgresql-jdbc-java)"
    d = tmp_path_factory.mktemp(name)
    (d / f"{name}.java").write_text(source)
    proc = run_tool([javac, "-d", d, d / f"{name}.java"], timeout=300)
    assert proc.returncode == 0, describe_run(proc, "javac failed")
    return d


@pytest.fixture(scope="module")
def security_probe(tmp_path_factory) -> Path:
    return compile_java(tmp_path_factory, "SecurityProbe", JAVA_PROBE)


def run_jdbc(classes: Path, gw: Gateway, mode: str, sql: str) -> dict[str, list[str]]:
    import shutil

    java = shutil.which("java")
    assert java, "java not installed"
    url = f"jdbc:postgresql://{gw.host}:{gw.port}/{gw.dbname}?connectTimeout=10&socketTimeout=120"
    proc = run_tool([java, "-cp", f"{classes}:{JDBC_JAR}", "SecurityProbe", url, gw.user,
                     gw.password or "", mode, sql], timeout=120)
    assert proc.returncode == 0, describe_run(proc, "the pgjdbc probe failed")
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        out[parts[0]] = parts[1:]
    return out


# --------------------------------------------------------------------------------------------
# Read-only
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", list(REFUSED))
def test_refusals_with_psycopg(sgw, tmp_path, template):
    out = tmp_path / "written_by_server"
    sql = template.format(s=sgw.schema, out=out)
    with sgw.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
        assert sqlstate_of(err.value) in REFUSED[template], f"{sql}: {sqlstate_of(err.value)} {err.value}"
        assert str(err.value).strip(), "a refusal must say why"
        assert count_items(conn, sgw) == 25, "the connection stays usable and nothing changed"
    assert not out.exists(), f"{sql} wrote {out} on the server"


@pytest.mark.parametrize("template", [t for t in REFUSED if "{out}" in t or "datafusion" in t])
def test_refusals_with_psql(sgw, tmp_path, template):
    out = tmp_path / "written_by_server"
    sql = template.format(s=sgw.schema, out=out)
    proc = psql(sgw.conninfo(), sql, check=False)
    assert proc.returncode != 0, describe_run(proc, f"psql accepted {sql}")
    assert "ERROR:" in proc.stderr, proc.stderr
    codes = REFUSED[template]
    # The same session goes on after the refusal (psql without ON_ERROR_STOP).
    cmd = [str(psql_path()), sgw.conninfo(), "-X", "-q", "-A", "-t", "-v", "VERBOSITY=verbose",
           "-c", sql, "-c", f"SELECT count(*) FROM {sgw.schema}.items"]
    proc = run_tool(cmd, env={"PGCONNECT_TIMEOUT": "10"})
    assert "25" in proc.stdout.split(), describe_run(proc, "the session did not go on")
    assert any(c in proc.stderr for c in codes), describe_run(proc, f"expected SQLSTATE {codes}")
    assert not out.exists(), f"{sql} wrote {out} on the server"


def test_refusals_with_pgjdbc(sgw, security_probe, tmp_path):
    out = tmp_path / "written_by_server"
    for template in ["COPY (SELECT * FROM {s}.items) TO '{out}'", "EXPLAIN ANALYZE COPY {s}.items TO '{out}'",
                     "DELETE FROM {s}.items", "SET datafusion.execution.target_partitions = 1"]:
        sql = template.format(s=sgw.schema, out=out)
        got = run_jdbc(security_probe, sgw, "query", sql)
        assert got.get("error", [""])[0] in REFUSED[template], f"{sql}: {got}"
        assert got.get("after") == ["42"], f"{sql}: the connection is not usable after the refusal: {got}"
        assert got.get("prepared", [""])[0] in REFUSED[template], f"{sql} prepared: {got}"
    assert not out.exists()


def test_what_a_reader_may_run(sgw):
    """Queries, SHOW, SET/RESET of session settings, transactions, EXPLAIN, SQL PREPARE/EXECUTE,
    cursors and DISCARD work."""
    s = sgw.schema
    with sgw.connect() as conn:
        assert conn.execute(f"SELECT * FROM {s}.items ORDER BY id LIMIT 1").fetchall() == [(1, "v1")]
        assert conn.execute("VALUES (1), (2)").fetchall() == [(1,), (2,)]
        conn.execute("SET application_name = 'probe'")
        assert conn.execute("SHOW application_name").fetchone() == ("probe",)
        conn.execute("SET myapp.tenant = 'a'")
        assert conn.execute("SELECT current_setting('myapp.tenant')").fetchone() == ("a",)
        conn.execute("RESET application_name")
        plan = conn.execute(f"EXPLAIN SELECT * FROM {s}.items WHERE id = 3").fetchall()
        assert plan, "EXPLAIN returns a plan"
        conn.execute(f"PREPARE p (int) AS SELECT v FROM {s}.items WHERE id = $1")
        assert conn.execute("EXECUTE p(7)").fetchone() == ("v7",)
        assert conn.execute("EXECUTE p(3 + 4)").fetchone() == ("v7",)
        conn.execute("DEALLOCATE p")
        with pytest.raises(psycopg.Error) as err:
            conn.execute("EXECUTE p(1)")
        assert sqlstate_of(err.value) == "26000"
        conn.execute("BEGIN")
        conn.execute(f"DECLARE c CURSOR FOR SELECT id FROM {s}.items ORDER BY id")
        assert conn.execute("FETCH 3 FROM c").fetchall() == [(1,), (2,), (3,)]
        conn.execute("CLOSE c")
        conn.execute("COMMIT")
        conn.execute("DISCARD ALL")
        with pytest.raises(psycopg.Error) as err:
            conn.execute("PREPARE w AS DELETE FROM items")
        assert sqlstate_of(err.value) == "25006"


def test_copy_to_stdout(sgw, tmp_path):
    """psql's \\copy ... to a client file, in text and CSV; psycopg's copy() too."""
    s = sgw.schema
    text_out, csv_out = tmp_path / "items.txt", tmp_path / "items.csv"
    psql(sgw.conninfo(), f"\\copy (SELECT id, v FROM {s}.items WHERE id <= 3 ORDER BY id) to '{text_out}'",
         f"\\copy {s}.items to '{csv_out}' with (format csv, header)")
    assert text_out.read_text() == "1\tv1\n2\tv2\n3\tv3\n"
    lines = csv_out.read_text().splitlines()
    assert lines[0] == "id,v" and len(lines) == 26 and "7,v7" in lines, lines[:5]
    with sgw.connect() as conn:
        with conn.cursor().copy(f"COPY (SELECT id, NULL::text AS n, 'a\tb' AS t FROM {s}.items WHERE id = 1) TO STDOUT") as cp:
            data = b"".join(bytes(chunk) for chunk in cp)
        assert data == b"1\t\\N\ta\\tb\n"
        assert count_items(conn, sgw) == 25


# --------------------------------------------------------------------------------------------
# statement_timeout
# --------------------------------------------------------------------------------------------


def test_statement_timeout_psycopg(sgw):
    with sgw.connect() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("60000ms",), "the skippr.yml default"
        conn.execute("SET statement_timeout = '1s'")
        t0 = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled) as err:
            conn.execute(SLOW).fetchall()
        took = time.monotonic() - t0
        assert "statement timeout" in str(err.value)
        assert took < 30, f"the timeout fired after {took:.1f}s"
        assert count_items(conn, sgw) == 25, "the connection stays usable"
        conn.execute("RESET statement_timeout")
        assert conn.execute("SHOW statement_timeout").fetchone() == ("60000ms",)
        # Also through the extended protocol (a prepared statement).
        conn.execute("SET statement_timeout = 1000")
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(SLOW.replace("%", "%%") + " AND v > %s", (0,), prepare=True).fetchall()
        assert count_items(conn, sgw) == 25
        with pytest.raises(psycopg.Error) as err:
            conn.execute("SET statement_timeout = 'soon'")
        assert sqlstate_of(err.value) == "22023"


def test_statement_timeout_covers_streaming_rows(sgw):
    """The rows of a long result are streamed: the timeout stops the statement mid-stream."""
    with sgw.connect() as conn:
        conn.execute("SET statement_timeout = '1500ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            for _ in conn.cursor().stream("SELECT v FROM generate_series(1, 100000000000) AS g(v)"):
                pass
        assert count_items(conn, sgw) == 25


def test_statement_timeout_psql_and_startup_option(sgw):
    proc = psql(sgw.conninfo(), "SET statement_timeout = '1s'", SLOW, check=False)
    assert proc.returncode != 0
    assert "canceling statement due to statement timeout" in proc.stderr, proc.stderr
    # libpq's options=-c statement_timeout=... at connect time
    proc = psql(sgw.conninfo(options="-c statement_timeout=1000"), "SHOW statement_timeout", SLOW, check=False)
    assert "1000ms" in proc.stdout, proc.stdout
    assert "statement timeout" in proc.stderr, proc.stderr


def test_statement_timeout_pgjdbc(sgw, security_probe):
    got = run_jdbc(security_probe, sgw, "timeout", SLOW)
    assert got.get("error", [""])[0] == "57014", got
    assert "statement timeout" in got["error"][1], got
    assert float(got["seconds"][0]) < 30, got
    assert got.get("after") == ["42"], got


# --------------------------------------------------------------------------------------------
# Cancel requests
# --------------------------------------------------------------------------------------------


def test_cancel_psycopg(sgw):
    with sgw.connect() as conn:
        timer = threading.Timer(1.5, conn.cancel)
        timer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(psycopg.errors.QueryCanceled) as err:
                conn.execute(SLOW).fetchall()
        finally:
            timer.cancel()
        assert "user request" in str(err.value)
        assert time.monotonic() - t0 < 30
        assert count_items(conn, sgw) == 25, "the connection stays usable"
        # A cancel with nothing running changes nothing for the next statement.
        conn.cancel()
        time.sleep(0.3)
        assert count_items(conn, sgw) == 25


def test_cancel_psql_ctrl_c(sgw):
    cmd = [str(psql_path()), sgw.conninfo(), "-X", "-v", "ON_ERROR_STOP=0", "-c", SLOW,
           "-c", f"SELECT count(*) FROM {sgw.schema}.items"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does: psql sends a CancelRequest
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "canceling statement due to user request" in err, f"{out}\n{err}"


def test_cancel_pgjdbc(sgw, security_probe):
    got = run_jdbc(security_probe, sgw, "cancel", SLOW)
    assert got.get("error", [""])[0] == "57014", got
    assert "user request" in got["error"][1], got
    assert float(got["seconds"][0]) < 30, got
    assert got.get("after") == ["42"], got


def test_cancel_with_a_wrong_key_does_nothing(sgw):
    """A CancelRequest needs the connection's secret key: a guessed one is ignored."""
    with sgw.connect() as conn:
        pid = conn.info.backend_pid
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                conn.execute("SET statement_timeout = '4s'")
                conn.execute(SLOW).fetchall()
            except psycopg.Error as e:
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()
        time.sleep(1.0)
        with socket.create_connection((sgw.host, sgw.port), timeout=5) as s:
            s.sendall(struct.pack("!iiii", 16, 80877102, pid, 12345))
        t.join(60)
        assert "statement timeout" in str(result.get("error")), result


# --------------------------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------------------------


def connect_at_once(gw, n: int, together: bool, join_s: float) -> tuple[list[psycopg.Connection], list[BaseException]]:
    """`n` clients connect from threads (released together by a barrier when `together`):
    (the connections opened, the errors of those refused)."""
    opened: list[psycopg.Connection] = []
    refused: list[BaseException] = []
    lock = threading.Lock()
    gate = threading.Barrier(n) if together else None

    def connect() -> None:
        if gate:
            gate.wait(60)
        try:
            c = gw.connect(connect_timeout=30)
            with lock:
                opened.append(c)
        except psycopg.OperationalError as e:
            with lock:
                refused.append(e)

    threads = [threading.Thread(target=connect) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return opened, refused


def test_300_connections_at_once(db, workdir):
    small_source(db)
    ws = unique_workspace()
    with start_gateway(db, workdir, ["items"], workspace=ws, query={"max_connections": 100}) as gw:
        opened, refused = connect_at_once(gw, 300, together=False, join_s=90)
        try:
            assert len(opened) + len(refused) == 300
            assert 0 < len(opened) <= 100, f"{len(opened)} connections were accepted"
            assert refused and all("too many clients" in str(e) for e in refused), sorted({str(e)[:200] for e in refused})[:5]
            # Every open connection answers, and a fresh client is told why it cannot connect.
            assert all(c.execute("SELECT 1").fetchone() == (1,) for c in opened)
            with pytest.raises(psycopg.OperationalError, match="too many clients"):
                gw.connect(connect_timeout=10)
        finally:
            for c in opened:
                c.close()
        time.sleep(0.5)
        with gw.connect(connect_timeout=10) as conn:
            assert conn.execute(f"SELECT count(*) FROM {ws}.items").fetchone() == (25,)


def test_a_flood_beyond_the_refusal_slots_is_still_told_why(db, workdir):
    """Beyond the refusals made through the full start-up, clients are refused by a lighter
    path; libpq (sslmode=prefer asks for TLS first) must still read "too many clients"."""
    small_source(db)
    ws = unique_workspace()
    with start_gateway(db, workdir, ["items"], workspace=ws, query={"max_connections": 1}) as gw:
        opened, refused = connect_at_once(gw, 400, together=True, join_s=120)
        try:
            assert len(opened) <= 1 and len(opened) + len(refused) == 400
            assert all("too many clients" in str(e) for e in refused), sorted({str(e)[:200] for e in refused})[:5]
        finally:
            for c in opened:
                c.close()


def test_runaway_query_hits_its_memory_limit_while_ingest_commits(db, workdir):
    small_source(db)
    ws = unique_workspace()
    with start_gateway(db, workdir, ["items"], workspace=ws, query={"max_query_memory": "64MiB"}) as gw:
        with gw.connect() as conn:
            before = conn.execute("SELECT max(committed_lsn) FROM skippr.tables").fetchone()[0]
            db.execute("INSERT INTO items SELECT i, 'n' || i FROM generate_series(26, 1025) i")
            with pytest.raises(psycopg.Error) as err:
                conn.execute("SELECT count(*) FROM generate_series(1, 30000000) a(x) "
                             "JOIN generate_series(1, 30000000) b(y) ON a.x = b.y").fetchall()
            assert sqlstate_of(err.value) == "53200", err.value
            # The server keeps serving, and the pipeline keeps committing.
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                n = count_items(conn, gw)
                lsn = conn.execute("SELECT max(committed_lsn) FROM skippr.tables").fetchone()[0]
                if n == 1025 and lsn != before:
                    break
                time.sleep(0.5)
            assert (n, lsn != before) == (1025, True), f"rows {n}, committed {before} -> {lsn}\n{gw.log()}"


# --------------------------------------------------------------------------------------------
# TLS and SCRAM
# --------------------------------------------------------------------------------------------

PASSWORD = "s3cret; 'quoted'"


@pytest.fixture
def tls_gw(db, workdir) -> Iterator[tuple[Gateway, Path]]:
    small_source(db)
    crt, key = make_cert(workdir)
    with start_gateway(db, workdir, ["items"], workspace=unique_workspace(),
                       query={"tls": {"cert": crt.name, "key": key.name},
                              "users": [{"name": "analyst", "password": "${ANALYST_PASSWORD}"}]},
                       env={"ANALYST_PASSWORD": PASSWORD}, user="analyst", password=PASSWORD) as gw:
        yield gw, crt


def test_tls_is_required(tls_gw, security_probe):
    gw, crt = tls_gw
    with gw.connect(sslmode="require") as conn:
        assert conn.pgconn.ssl_in_use
    with pytest.raises(psycopg.OperationalError) as err:
        gw.connect(sslmode="disable", connect_timeout=10)
    assert "TLS" in str(err.value), err.value
    proc = psql(gw.conninfo(sslmode="disable"), "SELECT 1", check=False)
    assert proc.returncode != 0 and "only TLS" in proc.stderr, proc.stderr
    # pgjdbc without ssl=true does not ask for TLS
    got = run_jdbc_failure(security_probe, gw, "?sslmode=disable")
    assert "TLS" in got, got


def run_jdbc_failure(classes: Path, gw: Gateway, params: str) -> str:
    import shutil

    java = shutil.which("java")
    url = f"jdbc:postgresql://{gw.host}:{gw.port}/{gw.dbname}{params}"
    proc = run_tool([java, "-cp", f"{classes}:{JDBC_JAR}", "SecurityProbe", url, gw.user,
                     gw.password or "", "query", "SELECT 1"], timeout=120)
    assert proc.returncode != 0, describe_run(proc, "pgjdbc connected without TLS")
    return proc.stderr


def test_tls_below_1_2_is_refused(tls_gw):
    gw, _ = tls_gw
    for version in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            ctx.minimum_version = version
            ctx.maximum_version = version
        except (ValueError, ssl.SSLError):
            continue  # this Python's OpenSSL cannot even offer it
        with socket.create_connection((gw.host, gw.port), timeout=10) as raw:
            raw.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest
            assert raw.recv(1) == b"S"
            with pytest.raises((ssl.SSLError, OSError)):
                ctx.wrap_socket(raw).do_handshake()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection((gw.host, gw.port), timeout=10) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S"
        with ctx.wrap_socket(raw) as tls:
            assert tls.version() == "TLSv1.2"


def scram_exchange(gw: Gateway, user: str) -> tuple[bytes, bytes]:
    """Starts SCRAM-SHA-256 as `user` over TLS and sends a wrong proof; returns the server's
    first SASL message and the error it ends with."""
    import base64

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((gw.host, gw.port), timeout=10)
    raw.sendall(struct.pack("!ii", 8, 80877103))
    assert raw.recv(1) == b"S"
    s = ctx.wrap_socket(raw)

    def read() -> tuple[bytes, bytes]:
        head = b""
        while len(head) < 5:
            head += s.recv(5 - len(head))
        kind, length = head[:1], struct.unpack("!i", head[1:])[0]
        body = b""
        while len(body) < length - 4:
            body += s.recv(length - 4 - len(body))
        return kind, body

    params = b"user\0" + user.encode() + b"\0database\0skippr\0\0"
    s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
    kind, body = read()
    assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 10, (kind, body)  # SASL
    first = b"n,,n=,r=abcdefghijklmnopqrstuvwx"
    mech = b"SCRAM-SHA-256\0"
    payload = mech + struct.pack("!i", len(first)) + first
    s.sendall(b"p" + struct.pack("!i", 4 + len(payload)) + payload)
    kind, server_first = read()
    assert kind == b"R" and struct.unpack("!i", server_first[:4])[0] == 11, (kind, server_first)
    attrs = dict(p.split(b"=", 1) for p in server_first[4:].split(b","))
    final = b"c=biws,r=" + attrs[b"r"] + b",p=" + base64.b64encode(b"\0" * 32)
    s.sendall(b"p" + struct.pack("!i", 4 + len(final)) + final)
    kind, error = read()
    s.close()
    assert kind == b"E", (kind, error)
    return server_first[4:], error


def test_scram_does_not_reveal_whether_a_user_exists(tls_gw):
    gw, _ = tls_gw
    known_first, known_error = scram_exchange(gw, "analyst")
    unknown_first, unknown_error = scram_exchange(gw, "nobody")
    again_first, _ = scram_exchange(gw, "nobody")

    def fields(first: bytes) -> dict[bytes, bytes]:
        return dict(p.split(b"=", 1) for p in first.split(b","))

    # Same shape, a stable salt per name, the same failure (only the name differs).
    assert fields(known_first).keys() == fields(unknown_first).keys()
    assert fields(known_first)[b"i"] == fields(unknown_first)[b"i"]
    assert len(fields(unknown_first)[b"s"]) == len(fields(known_first)[b"s"])
    assert fields(again_first)[b"s"] == fields(unknown_first)[b"s"]
    assert known_error.replace(b"analyst", b"X") == unknown_error.replace(b"nobody", b"X")
    assert b"28P01" in unknown_error


def test_malformed_messages_end_only_that_connection(sgw):
    """A damaged protocol message closes that connection; the server keeps serving."""
    with sgw.connect() as conn:
        for kind, body in ((b"B", b"\0\0\0\0\0\x01"), (b"P", b"\0"), (b"E", b""), (b"D", b"")):
            with socket.create_connection((sgw.host, sgw.port), timeout=10) as s:
                params = b"user\0x\0database\0skippr\0\0"
                s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
                time.sleep(0.2)
                s.recv(4096)
                s.sendall(kind + struct.pack("!i", 4 + len(body)) + body + b"S\0\0\0\x04")
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        assert count_items(conn, sgw) == 25
    with sgw.connect() as fresh:
        assert count_items(fresh, sgw) == 25
