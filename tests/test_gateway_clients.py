"""Client compatibility of `skipprd serve`, the Postgres-wire gateway over the replicated tables.

A source database with a table of many Postgres types (`types`), a table with a composite key
(`lines`) and a table outside `public` (`sales.refunds`) is synced once with `skipprd sync
--once`; then `skipprd serve` serves them as `analytics.types`, `analytics.lines` and
`analytics.sales_refunds` (schema = the workspace, `<schema>_<name>` outside `public`).

Every real client is pointed at the gateway and must see what it sees on the source:
psql (meta-commands and text output), pgcli, psycopg 3, psycopg2, pg8000, asyncpg (binary
format, prepared statements), node `pg`, pgjdbc (DatabaseMetaData, PreparedStatement) and the
SQLAlchemy inspector; plus the catalog queries Metabase and Superset send when they connect and
sync, the read-only and error behaviour (SQLSTATEs, the connection stays usable), per-session
settings, `skippr.tables`, `/metrics`, TLS, SCRAM users and the refusals at start.

Values are compared with what the same client gets from the source Postgres for the same SELECT.
`json` and `jsonb` are stored as their text (docs/types.md) and go out typed `json`/`jsonb`, so
clients parse them as they parse the source's; `interval` is stored as text, so it is selected as
`iv::text` on both sides.

Tools: psql (Debian's postgresql-client), pgcli and the Python drivers (tests/requirements.txt),
javac/java and /usr/share/java/postgresql.jar, node and the npm package `pg` in
`$SKIPPR_NODE_DIR` (default ~/.cache/skippr/node); `tests/run` installs all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import psycopg
import pytest

from conftest import (
    LSN_RE,
    Database,
    Skippr,
    _drop_database,
    _pg_bindir,
    _txt,
    assert_no_panic,
    assert_rows_equal,
    describe_run,
    expected_rows,
    free_port,
    lsn_to_int,
    pg_table_spec,
)
from test_cdc import bg_log

WORKSPACE = "analytics"

#: How long `skipprd serve` may take to accept connections, and to shut down after SIGTERM.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
#: How long one test may take: a client waiting for an answer that never comes fails the test
#: instead of hanging the suite (module fixtures are set up before it is armed).
TEST_TIMEOUT_S = float(os.environ.get("SKIPPR_GATEWAY_TEST_TIMEOUT", "180"))

#: Gateway table name -> source table.
TABLES = {"types": "public.types", "lines": "public.lines", "sales_refunds": "sales.refunds"}

#: A table whose composite key's order differs from its columns' (shared with test_reflection).
LINES_DDL = r"""-- the key's order (order_id, line_no) differs from the columns' order
CREATE TABLE lines (
    line_no smallint NOT NULL,
    order_id integer NOT NULL,
    sku text,
    qty integer,
    price numeric(10,2),
    "Note" text,
    PRIMARY KEY (order_id, line_no)
);
"""

SETUP = r"""
CREATE TABLE types (
    id integer PRIMARY KEY,
    i2 smallint, i4 integer, i8 bigint,
    n12 numeric(12,2), n numeric,
    r real, d double precision,
    b boolean,
    t text, vc varchar(20), ch char(3),
    dt date, tm time, ts timestamp, tstz timestamptz,
    u uuid, j json, jb jsonb, by bytea,
    ia integer[], ta text[],
    iv interval
);
INSERT INTO types VALUES
    (1, 1, 42, 1234567890123, 1234.50, 1.5, 3.14, 3.141592653589793, true,
     'plain text', 'varchar', 'abc', '2024-02-29', '12:34:56.789', '2024-02-29 12:34:56.789012',
     '2024-02-29 12:34:56.789012+05:30', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
     '{"k": [1, 2.5, "x"],  "nested": {"a": null}}', '{"b": 1, "a": "é"}', '\x0001ff',
     '{1,2,3}', '{a,b}', '1 day 02:03:04'),
    (2, -32768, -2147483648, 9223372036854775807, -9999999999.99,
     -12345678901234567890.123456789012345678, '-Infinity', 1e300, false,
     E'Zoë 🚀 日本 "double" it''s \\ back\nline2\ttab', 'naïve café ñ', 'ab', '0001-01-01',
     '23:59:59.999999', '1999-12-31 23:59:59.999999', '1970-01-01 00:00:00+00',
     '00000000-0000-0000-0000-000000000000', '[]',
     '{"quote": "it''s \"x\"", "uni": "日本", "n": -1.5e-7}', '\x27225c00',
     '{-1,NULL,2147483647}', '{"a b","","NULL","q\"uote",NULL,"日本"}',
     '-1 years -2 mons +3 days -04:05:06.5'),
    (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (4, 0, 0, -1, 0.00, 0, 0, -1.5e-7, false, '', '', '', '2000-01-01', '00:00:00',
     '2000-01-01 00:00:00', '2000-01-01 00:00:00+00', 'ffffffff-ffff-ffff-ffff-ffffffffffff',
     'null', '{}', '\x', '{}', '{}', '0');
INSERT INTO types (id, t, ia, ta)
    SELECT 5, repeat('long ', 4000), ARRAY(SELECT generate_series(1, 1000)),
           ARRAY(SELECT 'e' || g FROM generate_series(1, 300) g);
INSERT INTO types
    SELECT i, (i % 100) - 50, i * 1000, i::bigint * 1000000007, i * 1.25, i / 8.0, i / 4.0,
           i / 3.0, i % 2 = 0, 'row ' || i, 'vc' || i, chr(65 + i % 26), date '2024-01-01' + i,
           time '00:00' + i * interval '1 minute 0.25 second',
           timestamp '2024-01-01' + i * interval '1 hour 1.5 second',
           timestamptz '2024-01-01 00:00+00' + i * interval '1 day 0.001 second',
           md5(i::text)::uuid, json_build_object('i', i), jsonb_build_object('i', i, 's', 'x' || i),
           decode(lpad(to_hex(i), 4, '0'), 'hex'), ARRAY[i, -i], ARRAY['t' || i],
           i * interval '1 minute'
    FROM generate_series(100, 299) i;

""" + LINES_DDL + r"""INSERT INTO lines
    SELECT l, o, 'SKU-' || o || '-' || l, l * 2, round(o * l * 0.75, 2), CASE WHEN l = 1 THEN 'first' END
    FROM (VALUES (1), (2), (4)) v(o), generate_series(1, 3) l;
INSERT INTO lines SELECT 1, i, 'SKU-' || i, i % 7, i * 0.5, NULL FROM generate_series(100, 199) i;
INSERT INTO lines VALUES (9, 2, NULL, NULL, NULL, NULL);

CREATE SCHEMA sales;
CREATE TABLE sales.refunds (id bigint PRIMARY KEY, order_id integer, amount numeric(10,2), reason text);
INSERT INTO sales.refunds VALUES (1, 2, -5.25, 'damaged ''box'''), (2, NULL, NULL, NULL);
"""

#: Columns of `types`, in order.
TYPE_COLUMNS = ["id", "i2", "i4", "i8", "n12", "n", "r", "d", "b", "t", "vc", "ch", "dt", "tm",
                "ts", "tstz", "u", "j", "jb", "by", "ia", "ta", "iv"]
#: Stored as text (docs/types.md) and sent as text: compared as `::text` on both sides.
TEXT_CAST = {"iv"}
LINE_COLUMNS = ["line_no", "order_id", "sku", "qty", "price", "Note"]
REFUND_COLUMNS = ["id", "order_id", "amount", "reason"]
PRIMARY_KEYS = {"types": ["id"], "lines": ["order_id", "line_no"], "sales_refunds": ["id"]}


def types_select(schema: str, where: str = "", order: bool = True) -> str:
    """The one SELECT of every `types` column that both sides run (schema `public` on the
    source, the workspace on the gateway)."""
    cols = ", ".join(f"{c}::text AS {c}" if c in TEXT_CAST else c for c in TYPE_COLUMNS)
    return f"SELECT {cols} FROM {schema}.types{where}{' ORDER BY id' if order else ''}"


def source_name(table: str) -> str:
    return TABLES[table]


# --------------------------------------------------------------------------------------------
# The gateway process
# --------------------------------------------------------------------------------------------


@dataclass
class Gateway:
    """A running `skipprd serve`: where to connect, and the source it serves."""

    source: Database
    host: str
    port: int
    user: str
    password: str | None
    dbname: str
    schema: str
    metrics_port: int | None = None
    skippr: Skippr | None = None
    proc: subprocess.Popen | None = None

    def params(self, **overrides: Any) -> dict[str, Any]:
        p: dict[str, Any] = dict(host=self.host, port=self.port, user=self.user, dbname=self.dbname)
        if self.password is not None:
            p["password"] = self.password
        p.update(overrides)
        return {k: v for k, v in p.items() if v is not None}

    def conninfo(self, **overrides: Any) -> str:
        return psycopg.conninfo.make_conninfo(**self.params(**overrides))

    def connect(self, autocommit: bool = True, **overrides: Any) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(**overrides), autocommit=autocommit)

    def table(self, name: str) -> str:
        return f"{self.schema}.{name}"

    def log(self) -> str:
        return bg_log(self.skippr) if self.skippr is not None else "(no gateway log)"


def wait_until_serving(gw: Gateway, timeout: float = START_TIMEOUT_S) -> None:
    """Polls until a client can connect and run `SELECT 1`; fails early if the process exits."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if gw.proc is not None and gw.proc.poll() is not None:
            pytest.fail(f"`skipprd serve` exited with {gw.proc.returncode} before serving\n{gw.log()}")
        try:
            with gw.connect(connect_timeout=3) as conn:
                conn.execute("SELECT 1").fetchone()
            return
        except psycopg.OperationalError as e:
            last = e
        time.sleep(0.25)
    pytest.fail(f"`skipprd serve` did not accept connections within {timeout}s: {last}\n{gw.log()}")


def stop_gateway(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM, then waits; kills it (and returns None) if it does not exit in time."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


@contextlib.contextmanager
def start_gateway(
    source: Database,
    workdir: Path,
    tables: Sequence[str],
    *,
    workspace: str = WORKSPACE,
    listen_host: str = "127.0.0.1",
    query: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    user: str = "skippr_client",
    password: str | None = None,
) -> Iterator[Gateway]:
    """Writes skippr.yml with a `query` section (listen on a free port, plus `query`), syncs
    once, starts `skipprd serve` and waits until it serves. `user` and `password` are what
    clients log in with. Stops the process with SIGTERM on exit."""
    port, metrics_port = free_port(), free_port()
    skippr = Skippr(db=source, workdir=workdir)
    skippr.write_config(
        list(tables),
        workspace=workspace,
        query={"listen": f"{listen_host}:{port}", **(query or {})},
        metrics_listen=f"127.0.0.1:{metrics_port}",
    )
    skippr.env.update(env or {})
    skippr.sync_once()
    proc = skippr.start("serve")
    gw = Gateway(source=source, host="127.0.0.1", port=port, user=user, password=password,
                 dbname="skippr", schema=workspace, metrics_port=metrics_port, skippr=skippr,
                 proc=proc)
    try:
        wait_until_serving(gw)
        yield gw
    finally:
        # A test may have restarted the gateway: stop the process running now.
        stop_gateway(gw.proc if gw.proc is not None else proc)


@pytest.fixture(scope="module")
def gw(pg, tmp_path_factory) -> Iterator[Gateway]:
    """The module's gateway: no users (trust on loopback), over the three tables."""
    name = "t_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        source = Database(pg, name)
        source.execute(SETUP)
        workdir = tmp_path_factory.mktemp("gateway") / "work"
        workdir.mkdir()
        with start_gateway(source, workdir, ["types", "lines", "sales.refunds"]) as gateway:
            yield gateway
    finally:
        _drop_database(pg, name)


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    """Bounds every test of this module with SIGALRM. psycopg, asyncpg and pg8000 wait in
    Python-visible calls; psycopg2 does too once its wait callback is `wait_select`."""
    import psycopg2.extensions
    import psycopg2.extras

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the test did not finish within {TEST_TIMEOUT_S}s: a client is still waiting "
                           "for the gateway (SKIPPR_GATEWAY_TEST_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expire)
    wait_callback = psycopg2.extensions.get_wait_callback()
    psycopg2.extensions.set_wait_callback(psycopg2.extras.wait_select)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        psycopg2.extensions.set_wait_callback(wait_callback)


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def source_fetch(gw: Gateway, sql: str, params: Any = None) -> list[tuple]:
    with gw.source.connect() as conn:
        return conn.execute(sql, params).fetchall()


def gw_fetch(gw: Gateway, sql: str, params: Any = None, **overrides: Any) -> list[tuple]:
    with gw.connect(**overrides) as conn:
        return conn.execute(sql, params).fetchall()


def assert_same_rows(expected: Sequence[Sequence[Any]], actual: Sequence[Sequence[Any]], columns: Sequence[str],
                     label: str, norm: Callable[[Any], Any] = lambda v: v) -> None:
    """Row by row, column by column, with the first differences named."""
    problems = []
    if len(expected) != len(actual):
        problems.append(f"row count: source {len(expected)}, gateway {len(actual)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        e, a = [norm(v) for v in e], [norm(v) for v in a]
        if len(e) != len(a):
            problems.append(f"row {i}: {len(e)} columns on the source, {len(a)} on the gateway")
            continue
        for c, ev, av in zip(columns, e, a):
            if ev != av or type(ev) is not type(av):
                problems.append(f"row {i} (key {e[0]!r}) column {c}: source {ev!r} ({type(ev).__name__}), "
                                f"gateway {av!r} ({type(av).__name__})")
        if len(problems) > 20:
            break
    assert not problems, f"{label}: gateway rows differ from the source:\n" + "\n".join(problems[:20])


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE a driver reports for an error, whatever the driver."""
    for attr in ("sqlstate", "pgcode"):
        v = getattr(exc, attr, None)
        if isinstance(v, str):
            return v
    if exc.args and isinstance(exc.args[0], dict):  # pg8000
        return exc.args[0].get("C")
    return None


def run_tool(cmd: Sequence[str | Path], *, env: dict[str, str] | None = None, timeout: float = 120,
             input: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=full_env,
                              timeout=timeout, input=input, cwd=cwd,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`{' '.join(map(str, cmd))}` did not finish within {timeout}s\n{_txt(e.stdout)}\n{_txt(e.stderr)}")


def psql_path() -> Path:
    return _pg_bindir() / "psql"


def psql(conninfo: str, *commands: str, unaligned: bool = False, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    """Runs psql non-interactively, each command as its own `-c`, stopping at the first error."""
    cmd = [str(psql_path()), conninfo, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-P", "pager=off"]
    if unaligned:
        cmd += ["-A", "-F", "\x1f"]
    for c in commands:
        cmd += ["-c", c]
    proc = run_tool(cmd, env={"PGCONNECT_TIMEOUT": "10", **(env or {})})
    if check:
        assert proc.returncode == 0, describe_run(proc, f"psql failed ({proc.returncode})")
    return proc


# --------------------------------------------------------------------------------------------
# psql and pgcli
# --------------------------------------------------------------------------------------------


def test_psql_select_text_output_equals_postgres(gw):
    """psql prints every value as the gateway sends it in text format: it must be the text
    Postgres prints (same TimeZone). `n` (numeric without precision) is left out: it is stored as
    decimal(38,18), so its scale differs by design."""
    cols = [c for c in TYPE_COLUMNS if c != "n"]
    sql = "SELECT {} FROM {{}} ORDER BY id".format(", ".join(cols))
    src = psql(gw.source.dsn(), "SET TimeZone = 'UTC'", sql.format("public.types"), unaligned=True)
    out = psql(gw.conninfo(), "SET TimeZone = 'UTC'", sql.format(gw.table("types")), unaligned=True)
    assert out.stdout.splitlines() == src.stdout.splitlines(), describe_run(out)


#: Means as Postgres computes them: a numeric for integers and numerics, rounded to at least 16
#: significant digits (more below one), double precision for floats.
MEANS = [
    "SELECT avg(i2), avg(i4), avg(i8), avg(n12), avg(DISTINCT i2), avg(r) FROM {s}.types",
    "SELECT i2 % 3 AS g, avg(n12), avg(i4), count(*) FROM {s}.types GROUP BY 1 ORDER BY 1",
    "SELECT order_id, avg(price), avg(qty), avg(price) FILTER (WHERE qty > 2) FROM {s}.lines "
    "GROUP BY order_id ORDER BY avg(price) DESC NULLS LAST, order_id",
    "SELECT order_id, line_no, avg(price) OVER (ORDER BY order_id, line_no ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) "
    "FROM {s}.lines ORDER BY order_id, line_no",
    "SELECT avg(n12), avg(i4) FROM {s}.types WHERE false",
    "SELECT avg(x) FROM (VALUES (0), (0)) v(x)",
    "SELECT avg(x), avg(-x) FROM (VALUES (1), (2), (2)) v(x)",
    "SELECT avg(price) * 2, round(avg(price), 2) FROM {s}.lines",
]


def _without_trailing_zeros(text: str) -> list[str]:
    return [re.sub(r"(\.\d*?)0+(?=\D|$)", r"\1", line).replace(".\x1f", "\x1f").removesuffix(".")
            for line in text.splitlines()]


def test_psql_means_print_as_postgres_does(gw):
    """avg() of integers and numerics is a numeric with Postgres's digits, in every position
    (grouped, distinct, filtered, a window, no rows, negative). Where a mean's first digits
    equal its count's, Postgres shows four more zeros than the gateway (the value is equal)."""
    for sql in MEANS:
        src = psql(gw.source.dsn(), sql.format(s="public"), unaligned=True)
        out = psql(gw.conninfo(), sql.format(s=gw.schema), unaligned=True)
        assert _without_trailing_zeros(out.stdout) == _without_trailing_zeros(src.stdout), f"{sql}\n{describe_run(out)}"


def test_psql_list_tables(gw):
    out = psql(gw.conninfo(), f"\\dt {gw.schema}.*").stdout
    for t in TABLES:
        assert re.search(rf"^\s*{gw.schema}\s*\|\s*{t}\s*\|\s*table\s*\|", out, re.M), \
            f"`\\dt {gw.schema}.*` does not list {t} as a table:\n{out}"
    # the workspace is the default schema: a bare \dt lists its tables
    bare = psql(gw.conninfo(), "\\dt").stdout
    assert re.search(rf"^\s*{gw.schema}\s*\|\s*types\s*\|\s*table\s*\|", bare, re.M), bare


def _psql_describe(gw: Gateway, table: str) -> tuple[str, dict[str, list[str]], list[str]]:
    """`\\d schema.table` in unaligned mode: (title, column -> [type, collation, nullable,
    default], footer lines such as the Indexes section)."""
    out = psql(gw.conninfo(), f"\\d {gw.table(table)}", unaligned=True).stdout
    lines = out.splitlines()
    assert len(lines) >= 3, f"`\\d {gw.table(table)}` printed too little:\n{out}"
    title, header = lines[0], lines[1].split("\x1f")
    assert header[:4] == ["Column", "Type", "Collation", "Nullable"], out
    cols: dict[str, list[str]] = {}
    rest: list[str] = []
    for line in lines[2:]:
        parts = line.split("\x1f")
        if len(parts) >= 4 and not rest:
            cols[parts[0]] = parts[1:]
        else:
            rest.append(line)
    return title, cols, rest


#: `\d` type names the gateway must show, for the types whose Iceberg type keeps them.
PSQL_TYPES = {
    "id": "integer", "i4": "integer", "i8": "bigint", "n12": "numeric(12,2)", "r": "real",
    "d": "double precision", "b": "boolean", "t": "text", "dt": "date",
    "tm": "time without time zone", "ts": "timestamp without time zone",
    "tstz": "timestamp with time zone", "u": "uuid", "by": "bytea", "ia": "integer[]",
    "ta": "text[]",
}


def test_psql_describe_table(gw):
    title, cols, rest = _psql_describe(gw, "types")
    assert f'"{gw.schema}.types"' in title, title
    assert list(cols) == TYPE_COLUMNS, f"\\d columns {list(cols)}"
    wrong = {c: cols[c][0] for c, t in PSQL_TYPES.items() if cols[c][0] != t}
    assert not wrong, f"\\d types differ from {PSQL_TYPES}: {wrong}"
    assert cols["id"][2] == "not null", cols["id"]
    assert cols["t"][2] == "", cols["t"]
    footer = "\n".join(rest)
    assert re.search(r"PRIMARY KEY.*\(id\)", footer), f"\\d shows no primary key (id):\n{footer}"

    title, cols, rest = _psql_describe(gw, "lines")
    assert list(cols) == LINE_COLUMNS, list(cols)
    assert cols["order_id"][2] == "not null" and cols["line_no"][2] == "not null", cols
    footer = "\n".join(rest)
    assert re.search(r"PRIMARY KEY.*\(order_id, line_no\)", footer), \
        f"\\d shows no primary key (order_id, line_no):\n{footer}"


def test_psql_list_schemas_and_databases(gw):
    schemas = psql(gw.conninfo(), "\\dn").stdout
    for s in (gw.schema, "skippr"):
        assert re.search(rf"^\s*{s}\s*\|", schemas, re.M), f"\\dn does not list {s}:\n{schemas}"
    dbs = psql(gw.conninfo(), "\\l").stdout
    assert "List of databases" in dbs, dbs
    rows = [l for l in dbs.splitlines() if l.count("|") >= 3 and not l.lstrip().startswith("Name")]
    assert rows, f"\\l lists no database:\n{dbs}"


def test_pgcli(gw, tmp_path):
    """pgcli non-interactively (`-c`): a query and a meta-command. It also runs its completion
    catalog queries on connect."""
    pgcli = Path(sys.executable).parent / "pgcli"
    exe = str(pgcli) if pgcli.exists() else shutil.which("pgcli")
    assert exe, "pgcli not installed (tests/requirements.txt)"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path), "TERM": "dumb",
           "PAGER": "cat", "PGCONNECT_TIMEOUT": "10"}
    if gw.password is not None:
        env["PGPASSWORD"] = gw.password
    cmd = [exe, "-h", gw.host, "-p", str(gw.port), "-U", gw.user, "-d", gw.dbname, "-w",
           "--less-chatty", "--row-limit", "0",
           "-c", f"SELECT id, t, n12 FROM {gw.table('types')} WHERE id IN (1, 2) ORDER BY id",
           "-c", f"\\dt {gw.schema}.*"]
    proc = run_tool(cmd, env=env, timeout=120)
    assert proc.returncode == 0, describe_run(proc, "pgcli failed")
    out = proc.stdout
    assert "plain text" in out and "Zoë 🚀 日本" in out and "1234.50" in out, describe_run(proc)
    for t in TABLES:
        assert re.search(rf"\b{t}\b", out), describe_run(proc, f"pgcli \\dt does not list {t}")
    assert "error" not in proc.stderr.lower(), describe_run(proc)


# --------------------------------------------------------------------------------------------
# Python drivers
# --------------------------------------------------------------------------------------------


def test_psycopg3_every_value_equals_source(gw):
    """psycopg 3 (text format): every row and every type equals what psycopg reads from the
    source for the same SELECT; also SELECT * checked with the project's type mapping."""
    expected = source_fetch(gw, types_select("public"))
    actual = gw_fetch(gw, types_select(gw.schema))
    assert_same_rows(expected, actual, TYPE_COLUMNS, "psycopg")

    # SELECT * against the documented mapping (interval read as text); json and jsonb go out
    # typed, so psycopg parses them as it parses the source's, and an expression over them
    # (a cast to text) is text again.
    spec = pg_table_spec(gw.source, "types")
    with gw.connect() as conn:
        cur = conn.execute(f"SELECT * FROM {gw.table('types')} ORDER BY id")
        names = [d.name for d in cur.description]
        types = {d.name: d.type_code for d in cur.description}
        star = [dict(zip(names, r)) for r in cur.fetchall()]
        cast = conn.execute(f"SELECT jb::text AS jb, j AS renamed FROM {gw.table('types')} WHERE id = 2")
        cast_types = [d.type_code for d in cast.description]
        cast_row = cast.fetchone()
    assert (types["j"], types["jb"]) == (114, 3802), types
    parsed = {r[0]: (r[1], r[2]) for r in source_fetch(gw, "SELECT id, j, jb FROM public.types")}
    assert {r["id"]: (r["j"], r["jb"]) for r in star} == parsed
    assert cast_types == [25, 114], cast_types
    assert cast_row == (source_fetch(gw, "SELECT jb::text FROM public.types WHERE id = 2")[0][0], parsed[2][0])
    plain = [{**r, "j": None, "jb": None} for r in star]
    expected_plain = [{**r, "j": None, "jb": None} for r in expected_rows(gw.source, spec)]
    assert_rows_equal(expected_plain, plain, spec, "gateway psycopg SELECT *")


def test_psycopg3_parameters_joins_and_aggregates(gw):
    checks = [
        (types_select("{s}", " WHERE id = %s", order=False), (2,)),
        (types_select("{s}", " WHERE t = %s", order=False), ('Zoë 🚀 日本 "double" it\'s \\ back\nline2\ttab',)),
        (types_select("{s}", " WHERE tstz >= %s AND b = %s"), (dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), True)),
        ("SELECT t.id, t.t, count(l.line_no) AS n_lines, sum(l.qty * l.price) AS total "
         "FROM {s}.types t JOIN {s}.lines l ON l.order_id = t.id GROUP BY t.id, t.t ORDER BY t.id", None),
        ("SELECT count(*), count(t), sum(n12), min(ts), max(tstz), max(d), min(dt) FROM {s}.types", None),
        ("SELECT r.id, r.amount, l.sku FROM {s}.{refunds} r LEFT JOIN {s}.lines l "
         "ON l.order_id = r.order_id AND l.line_no = 1 ORDER BY r.id", None),
    ]
    for sql, params in checks:
        src_sql = sql.format(s="public", refunds="refunds").replace("public.refunds", "sales.refunds")
        gw_sql = sql.format(s=gw.schema, refunds="sales_refunds")
        expected = source_fetch(gw, src_sql, params)
        assert expected, f"the check selects nothing on the source: {src_sql}"
        actual = gw_fetch(gw, gw_sql, params)
        assert_same_rows(expected, actual, [f"c{i}" for i in range(len(expected[0]))], gw_sql)


def test_psycopg3_any_database_name_is_accepted(gw):
    for dbname in ("postgres", "some_other_db", gw.dbname):
        rows = gw_fetch(gw, f"SELECT count(*) FROM {gw.table('lines')}", dbname=dbname)
        assert rows == source_fetch(gw, "SELECT count(*) FROM public.lines"), dbname


def _bytes(v: Any) -> Any:
    return bytes(v) if isinstance(v, memoryview) else v


def test_psycopg2(gw):
    import psycopg2

    def fetch(params: dict[str, Any], sql: str, args: Any = None) -> list[tuple]:
        conn = psycopg2.connect(**params)
        try:
            with conn.cursor() as cur:  # psycopg2's default: inside a transaction
                cur.execute(sql, args)
                rows = cur.fetchall()
            conn.rollback()
            return rows
        finally:
            conn.close()

    src = gw.source
    src_params = dict(host=src.host, port=src.port, user=src.cluster.user, password=src.cluster.password,
                      dbname=src.name)
    assert_same_rows(fetch(src_params, types_select("public")), fetch(gw.params(), types_select(gw.schema)),
                     TYPE_COLUMNS, "psycopg2", norm=_bytes)
    where = " WHERE id = %s OR vc = %s"
    assert_same_rows(fetch(src_params, types_select("public", where), (2, "vc101")),
                     fetch(gw.params(), types_select(gw.schema, where), (2, "vc101")),
                     TYPE_COLUMNS, "psycopg2 with parameters", norm=_bytes)


def test_pg8000(gw):
    import pg8000.native

    def fetch(params: dict[str, Any], sql: str, **args: Any) -> list[list]:
        conn = pg8000.native.Connection(params["user"], host=params["host"], port=params["port"],
                                        database=params["dbname"], password=params.get("password"),
                                        timeout=30)
        try:
            return conn.run(sql, **args)
        finally:
            conn.close()

    src = gw.source
    src_params = dict(host=src.host, port=src.port, user=src.cluster.user, password=src.cluster.password,
                      dbname=src.name)
    assert_same_rows(fetch(src_params, types_select("public")), fetch(gw.params(), types_select(gw.schema)),
                     TYPE_COLUMNS, "pg8000")
    where = " WHERE id = :id OR (b = :flag AND id > :low)"
    args = dict(id=2, flag=False, low=280)
    assert_same_rows(fetch(src_params, types_select("public", where), **args),
                     fetch(gw.params(), types_select(gw.schema, where), **args),
                     TYPE_COLUMNS, "pg8000 with parameters")


def test_asyncpg_binary_format_and_prepared_statements(gw):
    """asyncpg reads results in binary format and always prepares; parameters are bound in
    binary too."""
    import asyncpg

    async def fetch_all(params: dict[str, Any], schema: str) -> dict[str, Any]:
        conn = await asyncpg.connect(host=params["host"], port=params["port"], user=params["user"],
                                     password=params.get("password"), database=params["dbname"],
                                     ssl=False, timeout=30)
        try:
            out: dict[str, Any] = {"all": [tuple(r) for r in await conn.fetch(types_select(schema))]}
            stmt = await conn.prepare(types_select(schema, " WHERE id = $1", order=False))
            out["attributes"] = [a.name for a in stmt.get_attributes()]
            out["by_id"] = [tuple(await stmt.fetchrow(i)) for i in (1, 2, 3, 4, 150)]
            out["missing"] = await stmt.fetchrow(-1)
            out["text_param"] = [tuple(r) for r in await conn.fetch(
                f"SELECT line_no, order_id, sku FROM {schema}.lines WHERE sku = $1 OR qty > $2 ORDER BY order_id, line_no",
                "SKU-2-3", 5)]
            out["means"] = [tuple(await conn.fetchrow(sql.format(s=schema))) for sql in MEANS[:1]]
            out["ts_param"] = await conn.fetchval(
                f"SELECT count(*) FROM {schema}.types WHERE tstz < $1", dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc))
            return out
        finally:
            await conn.close()

    src = gw.source
    src_params = dict(host=src.host, port=src.port, user=src.cluster.user, password=src.cluster.password,
                      dbname=src.name)
    expected = asyncio.run(fetch_all(src_params, "public"))
    actual = asyncio.run(fetch_all(gw.params(), gw.schema))
    assert_same_rows(expected["all"], actual["all"], TYPE_COLUMNS, "asyncpg")
    assert actual["attributes"] == TYPE_COLUMNS
    assert_same_rows(expected["by_id"], actual["by_id"], TYPE_COLUMNS, "asyncpg prepared, $1 = id")
    assert actual["missing"] is None
    assert_same_rows(expected["text_param"], actual["text_param"], ["line_no", "order_id", "sku"], "asyncpg text $1")
    assert actual["ts_param"] == expected["ts_param"] > 0
    assert actual["means"] == expected["means"]


# --------------------------------------------------------------------------------------------
# node pg
# --------------------------------------------------------------------------------------------

NODE_SCRIPT = r"""
const { Client } = require('pg');
function enc(v) {
  if (v === null || v === undefined) return null;
  if (Buffer.isBuffer(v)) return { bytes: v.toString('hex') };
  if (v instanceof Date) return { date: isNaN(v.getTime()) ? 'invalid' : v.toISOString() };
  if (Array.isArray(v)) return v.map(enc);
  if (typeof v === 'number' && !isFinite(v)) return { number: String(v) };
  if (typeof v === 'object') return { object: v };
  return v;
}
(async () => {
  const spec = JSON.parse(process.argv[2]);
  const client = new Client(spec.conn);
  await client.connect();
  const results = [];
  for (const q of spec.queries) {
    const res = await client.query({ text: q.text, values: q.values, rowMode: 'array' });
    results.push({ fields: res.fields.map(f => f.name), rows: res.rows.map(r => r.map(enc)) });
  }
  await client.end();
  process.stdout.write(JSON.stringify(results));
})().catch(e => { console.error('ERROR', e.code || '', e.message); process.exit(3); });
"""


def node_modules_dir() -> Path:
    base = Path(os.environ.get("SKIPPR_NODE_DIR", Path.home() / ".cache" / "skippr" / "node"))
    return base / "node_modules"


def run_node(tmp_path: Path, conn: dict[str, Any], queries: list[dict[str, Any]]) -> list[dict]:
    node = shutil.which("node")
    assert node, "node not installed (tests/run installs nodejs)"
    modules = node_modules_dir()
    assert (modules / "pg" / "package.json").exists(), \
        f"npm package pg not found in {modules} (tests/run installs it; or set SKIPPR_NODE_DIR)"
    script = tmp_path / "probe.js"
    script.write_text(NODE_SCRIPT)
    spec = json.dumps({"conn": conn, "queries": queries})
    proc = run_tool([node, script, spec], env={"NODE_PATH": str(modules), "TZ": "UTC"}, timeout=120)
    assert proc.returncode == 0, describe_run(proc, "node pg failed")
    return json.loads(proc.stdout)


def _node_norm(result: dict, decimal_cols: set[str]) -> list[list]:
    """node pg gives numeric as strings; the gateway's scale of `n` (decimal(38,18)) differs by
    design, so numeric columns compare as Decimals."""
    idx = {i for i, f in enumerate(result["fields"]) if f in decimal_cols}
    return [[Decimal(v) if i in idx and v is not None else v for i, v in enumerate(row)] for row in result["rows"]]


def test_node_pg(gw, tmp_path):
    def queries(schema: str) -> list[dict[str, Any]]:
        return [
            {"text": types_select(schema)},
            {"text": types_select(schema, " WHERE id = $1", order=False), "values": [2]},
            {"text": f"SELECT line_no, order_id, sku, price, \"Note\" FROM {schema}.lines "
                     "WHERE order_id = $1 ORDER BY line_no", "values": [2]},
        ]

    src = gw.source
    src_conn = dict(host=src.host, port=src.port, user=src.cluster.user, password=src.cluster.password,
                    database=src.name)
    gw_conn = {k if k != "dbname" else "database": v for k, v in gw.params().items()}
    expected = run_node(tmp_path, src_conn, queries("public"))
    actual = run_node(tmp_path, gw_conn, queries(gw.schema))
    for e, a in zip(expected, actual):
        assert a["fields"] == e["fields"]
        assert e["rows"], "the node query selects nothing on the source"
        assert_same_rows(_node_norm(e, {"n", "n12", "price"}), _node_norm(a, {"n", "n12", "price"}),
                         e["fields"], "node pg")


# --------------------------------------------------------------------------------------------
# pgjdbc
# --------------------------------------------------------------------------------------------

JDBC_JAR = Path("/usr/share/java/postgresql.jar")

JAVA_PROBE = r"""
import java.math.BigDecimal;
import java.sql.*;
import java.util.*;

/** Prints what pgjdbc sees, one JSON array a line: metadata, then the rows of a prepared
 *  statement executed six times (pgjdbc switches to a named server statement and binary
 *  transfer from the fifth execution). Args: url user password schema sql. */
public class GatewayProbe {
    static String q(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
            }
        }
        return b.append('"').toString();
    }
    static void emit(String... fields) {
        StringJoiner j = new StringJoiner(",", "[", "]");
        for (String f : fields) j.add(q(f));
        System.out.println(j);
    }
    static String hex(byte[] bytes) {
        StringBuilder b = new StringBuilder();
        for (byte x : bytes) b.append(String.format("%02x", x));
        return b.toString();
    }
    static String value(Object o) throws SQLException {
        if (o == null) return null;
        if (o instanceof byte[]) return "byte[]:" + hex((byte[]) o);
        if (o instanceof BigDecimal) return "BigDecimal:" + ((BigDecimal) o).stripTrailingZeros().toPlainString();
        if (o instanceof java.sql.Array) {
            Object[] items = (Object[]) ((java.sql.Array) o).getArray();
            StringJoiner j = new StringJoiner(", ", "[", "]");
            for (Object e : items) j.add(e == null ? "null" : value(e));
            return "Array:" + j;
        }
        return o.getClass().getSimpleName() + ":" + o;
    }
    public static void main(String[] a) throws Exception {
        String url = a[0], user = a[1], password = a[2], schema = a[3], sql = a[4];
        Properties p = new Properties();
        p.setProperty("user", user);
        if (!password.isEmpty()) p.setProperty("password", password);
        try (Connection c = DriverManager.getConnection(url, p)) {
            DatabaseMetaData md = c.getMetaData();
            emit("product", md.getDatabaseProductName(), md.getDatabaseProductVersion());
            try (ResultSet rs = md.getSchemas()) {
                while (rs.next()) emit("schema", rs.getString("TABLE_SCHEM"));
            }
            List<String> tables = new ArrayList<>();
            try (ResultSet rs = md.getTables(null, schema, "%", new String[] {"TABLE", "VIEW"})) {
                while (rs.next()) {
                    tables.add(rs.getString("TABLE_NAME"));
                    emit("table", rs.getString("TABLE_SCHEM"), rs.getString("TABLE_NAME"), rs.getString("TABLE_TYPE"));
                }
            }
            try (ResultSet rs = md.getColumns(null, schema, "%", "%")) {
                while (rs.next()) emit("column", rs.getString("TABLE_NAME"), rs.getString("COLUMN_NAME"),
                        String.valueOf(rs.getInt("ORDINAL_POSITION")), rs.getString("TYPE_NAME"),
                        String.valueOf(rs.getInt("NULLABLE")));
            }
            for (String t : tables) {
                try (ResultSet rs = md.getPrimaryKeys(null, schema, t)) {
                    while (rs.next()) emit("pk", t, rs.getString("COLUMN_NAME"), String.valueOf(rs.getInt("KEY_SEQ")));
                }
            }
            try (PreparedStatement ps = c.prepareStatement(sql)) {
                for (int run = 1; run <= 6; run++) {
                    ps.setInt(1, 0);
                    try (ResultSet rs = ps.executeQuery()) {
                        ResultSetMetaData m = rs.getMetaData();
                        if (run == 1) {
                            String[] names = new String[m.getColumnCount() + 1];
                            names[0] = "fields";
                            for (int i = 1; i <= m.getColumnCount(); i++) names[i] = m.getColumnName(i);
                            emit(names);
                        }
                        while (rs.next()) {
                            String[] f = new String[m.getColumnCount() + 2];
                            f[0] = "row";
                            f[1] = String.valueOf(run);
                            for (int i = 1; i <= m.getColumnCount(); i++) f[i + 1] = value(rs.getObject(i));
                            emit(f);
                        }
                    }
                }
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def java_probe(tmp_path_factory) -> Path:
    """Compiles GatewayProbe.java; returns the class folder."""
    javac = shutil.which("javac")
    assert javac, "javac not installed (tests/run installs default-jdk-headless)"
    assert JDBC_JAR.exists(), f"{JDBC_JAR} missing (tests/run installs libpostgresql-jdbc-java)"
    d = tmp_path_factory.mktemp("java")
    (d / "GatewayProbe.java").write_text(JAVA_PROBE)
    proc = run_tool([javac, "-d", d, d / "GatewayProbe.java"], timeout=300)
    assert proc.returncode == 0, describe_run(proc, "javac failed")
    return d


def run_java_probe(classes: Path, host: str, port: int, dbname: str, user: str, password: str | None,
                   schema: str, sql: str) -> list[list]:
    java = shutil.which("java")
    assert java, "java not installed"
    url = f"jdbc:postgresql://{host}:{port}/{dbname}?connectTimeout=10&socketTimeout=120"
    proc = run_tool([java, "-Duser.timezone=UTC", "-cp", f"{classes}:{JDBC_JAR}", "GatewayProbe",
                     url, user, password or "", schema, sql], timeout=80)
    assert proc.returncode == 0, describe_run(proc, "the pgjdbc probe failed")
    return [json.loads(l) for l in proc.stdout.splitlines() if l.strip()]


#: pgjdbc TYPE_NAME of the columns whose Iceberg type keeps the Postgres type.
JDBC_TYPES = {"id": "int4", "i8": "int8", "n12": "numeric", "r": "float4", "d": "float8", "b": "bool",
              "t": "text", "dt": "date", "tm": "time", "ts": "timestamp", "tstz": "timestamptz",
              "u": "uuid", "by": "bytea", "ia": "_int4", "ta": "_text"}


def test_pgjdbc_metadata_and_prepared_statement(gw, java_probe):
    sql = types_select("{}", " WHERE id >= ?")
    src = gw.source
    expected = run_java_probe(java_probe, src.host, src.port, src.name, src.cluster.user,
                              src.cluster.password, "public", sql.format("public"))
    actual = run_java_probe(java_probe, gw.host, gw.port, gw.dbname, gw.user, gw.password,
                            gw.schema, sql.format(gw.schema))

    def kind(lines: list[list], k: str) -> list[list]:
        return [l[1:] for l in lines if l[0] == k]

    assert gw.schema in [s[0] for s in kind(actual, "schema")], kind(actual, "schema")
    tables = {t[1]: t for t in kind(actual, "table")}
    assert set(tables) == set(TABLES), f"getTables({gw.schema}): {sorted(tables)}"
    assert all(t[0] == gw.schema and t[2] == "TABLE" for t in tables.values()), tables

    cols: dict[str, list[list]] = {}
    for c in kind(actual, "column"):
        cols.setdefault(c[0], []).append(c)
    assert [c[1] for c in sorted(cols["types"], key=lambda c: int(c[2]))] == TYPE_COLUMNS
    assert [c[1] for c in sorted(cols["lines"], key=lambda c: int(c[2]))] == LINE_COLUMNS
    assert [c[1] for c in sorted(cols["sales_refunds"], key=lambda c: int(c[2]))] == REFUND_COLUMNS
    type_names = {c[1]: c[3] for c in cols["types"]}
    wrong = {c: type_names.get(c) for c, t in JDBC_TYPES.items() if type_names.get(c) != t}
    assert not wrong, f"getColumns TYPE_NAME differs from {JDBC_TYPES}: {wrong}"
    nullable = {(c[0], c[1]): c[4] for cs in cols.values() for c in cs}
    assert nullable[("types", "id")] == "0" and nullable[("types", "t")] == "1"
    assert nullable[("lines", "order_id")] == "0" and nullable[("lines", "line_no")] == "0"

    pks: dict[str, list[str]] = {}
    for t, col, seq in sorted(kind(actual, "pk"), key=lambda p: (p[0], int(p[2]))):
        pks.setdefault(t, []).append(col)
    assert pks == PRIMARY_KEYS, f"getPrimaryKeys: {pks}"

    assert kind(actual, "fields") == [TYPE_COLUMNS]
    exp_rows = [r[1:] for r in kind(expected, "row") if r[0] == "1"]
    assert exp_rows, "the probe read no rows from the source"
    for run in "123456":
        got = [r[1:] for r in kind(actual, "row") if r[0] == run]
        assert_same_rows(exp_rows, got, TYPE_COLUMNS, f"pgjdbc PreparedStatement, execution {run}")


# --------------------------------------------------------------------------------------------
# SQLAlchemy (Superset reflects through it, with psycopg2)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_sqlalchemy_inspector(gw, driver):
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pgt

    url = sa.URL.create(f"postgresql+{driver}", username=gw.user, password=gw.password,
                        host=gw.host, port=gw.port, database=gw.dbname)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        insp = sa.inspect(engine)
        assert {gw.schema, "skippr"} <= set(insp.get_schema_names()), insp.get_schema_names()
        assert sorted(insp.get_table_names(schema=gw.schema)) == sorted(TABLES)
        for table, names in (("types", TYPE_COLUMNS), ("lines", LINE_COLUMNS), ("sales_refunds", REFUND_COLUMNS)):
            cols = insp.get_columns(table, schema=gw.schema)
            assert [c["name"] for c in cols] == names, (table, cols)
            pk = insp.get_pk_constraint(table, schema=gw.schema)
            assert pk["constrained_columns"] == PRIMARY_KEYS[table], (table, pk)
            # what Superset also asks for; none exist
            assert insp.get_foreign_keys(table, schema=gw.schema) == []
            assert insp.get_indexes(table, schema=gw.schema) == []
            assert insp.get_unique_constraints(table, schema=gw.schema) == []
            assert insp.get_table_comment(table, schema=gw.schema)["text"] is None
        assert insp.get_view_names(schema=gw.schema) == []
        assert insp.get_foreign_table_names(schema=gw.schema) == []

        cols = {c["name"]: c for c in insp.get_columns("types", schema=gw.schema)}
        assert cols["id"]["nullable"] is False and cols["t"]["nullable"] is True
        expect = {"id": sa.INTEGER, "i8": sa.BIGINT, "n12": sa.NUMERIC, "d": sa.DOUBLE_PRECISION,
                  "b": sa.BOOLEAN, "t": sa.TEXT, "dt": sa.DATE, "ts": pgt.TIMESTAMP, "tstz": pgt.TIMESTAMP,
                  "tm": pgt.TIME, "u": sa.UUID, "by": pgt.BYTEA, "ia": pgt.ARRAY, "ta": pgt.ARRAY}
        wrong = {c: repr(cols[c]["type"]) for c, t in expect.items() if not isinstance(cols[c]["type"], t)}
        assert not wrong, f"reflected types: {wrong}"
        assert (cols["n12"]["type"].precision, cols["n12"]["type"].scale) == (12, 2)
        assert cols["tstz"]["type"].timezone is True and cols["ts"]["type"].timezone is False
        assert isinstance(cols["ia"]["type"].item_type, sa.INTEGER)

        with engine.connect() as conn:  # a plain query through the engine (in a transaction)
            n = conn.execute(sa.text(f"SELECT count(*) FROM {gw.table('lines')} WHERE qty > :q"), {"q": 2}).scalar()
        assert n == source_fetch(gw, "SELECT count(*) FROM public.lines WHERE qty > 2")[0][0]
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------
# Read-only, errors, sessions
# --------------------------------------------------------------------------------------------

WRITES = [
    "INSERT INTO {s}.types (id) VALUES (100000)",
    "UPDATE {s}.types SET t = 'changed' WHERE id = 1",
    "DELETE FROM {s}.lines WHERE order_id = 1",
    "TRUNCATE {s}.lines",
    "CREATE TABLE {s}.new_table (id integer)",
    "ALTER TABLE {s}.types ADD COLUMN z integer",
    "DROP TABLE {s}.types",
]


@pytest.mark.parametrize("statement", WRITES, ids=lambda s: s.split("{s}")[0].strip().lower().replace(" ", "_"))
def test_writes_are_refused_with_25006(gw, statement):
    with gw.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(statement.format(s=gw.schema))
        assert err.value.sqlstate == "25006", f"{statement}: SQLSTATE {err.value.sqlstate}: {err.value}"
        # the connection stays usable and nothing changed
        for table in ("types", "lines"):
            got = conn.execute(f"SELECT count(*) FROM {gw.table(table)}").fetchall()
            assert got == source_fetch(gw, f"SELECT count(*) FROM {source_name(table)}")
        assert conn.execute(f"SELECT t FROM {gw.table('types')} WHERE id = 1").fetchone() == ("plain text",)
        cols = [r[0] for r in conn.execute(f"SELECT * FROM {gw.table('types')} LIMIT 0").description]
        assert cols == TYPE_COLUMNS


def test_write_inside_a_transaction_then_rollback(gw):
    """psycopg2 (like JDBC with autocommit off) wraps statements in BEGIN; after the refused
    write, ROLLBACK makes the connection usable again."""
    import psycopg2

    conn = psycopg2.connect(**gw.params())
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT count(*) FROM {gw.table('types')}")
        before = cur.fetchone()[0]
        with pytest.raises(psycopg2.Error) as err:
            cur.execute(f"UPDATE {gw.table('types')} SET b = NOT b")
        assert err.value.pgcode == "25006", err.value
        conn.rollback()
        cur.execute(f"SELECT count(*) FROM {gw.table('types')}")
        assert cur.fetchone()[0] == before
        conn.rollback()
    finally:
        conn.close()


BAD_SQL = [
    ("SELEC 1", "42601"),
    ("SELECT * FROM {s}.no_such_table", "42P01"),
    ("SELECT no_such_column FROM {s}.types", "42703"),
    ("SELECT id FROM {s}.types WHERE", "42601"),
]


@pytest.mark.parametrize("statement,sqlstate", BAD_SQL, ids=["syntax", "undefined_table", "undefined_column", "incomplete"])
def test_bad_sql_gets_sqlstate_and_connection_stays_usable(gw, statement, sqlstate):
    with gw.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(statement.format(s=gw.schema))
        assert err.value.sqlstate == sqlstate, f"{statement}: SQLSTATE {err.value.sqlstate} ({err.value})"
        assert err.value.diag.message_primary, "the error has no message"
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
        assert conn.execute(f"SELECT count(*) FROM {gw.table('types')}").fetchone() == \
            tuple(source_fetch(gw, "SELECT count(*) FROM public.types")[0])


def test_errors_from_other_drivers_carry_sqlstate(gw):
    import asyncpg
    import pg8000.native

    async def asyncpg_error() -> str | None:
        conn = await asyncpg.connect(**{("database" if k == "dbname" else k): v for k, v in gw.params().items()},
                                     ssl=False, timeout=30)
        try:
            with pytest.raises(asyncpg.PostgresError) as err:
                await conn.fetch(f"DELETE FROM {gw.table('types')} WHERE id = $1", 1)
            assert await conn.fetchval("SELECT 41 + 1") == 42
            return sqlstate_of(err.value)
        finally:
            await conn.close()

    assert asyncio.run(asyncpg_error()) == "25006"

    p = gw.params()
    conn = pg8000.native.Connection(p["user"], host=p["host"], port=p["port"], database=p["dbname"],
                                    password=p.get("password"), timeout=30)
    try:
        with pytest.raises(pg8000.native.DatabaseError) as err:
            conn.run(f"SELECT * FROM {gw.schema}.missing_table")
        assert sqlstate_of(err.value) == "42P01", err.value
        assert conn.run("SELECT 1") == [[1]]
    finally:
        conn.close()


def test_set_is_per_session(gw):
    with gw.connect(application_name="startup_name") as a, gw.connect() as b:
        b_tz = b.execute("SHOW TimeZone").fetchone()[0]
        b_app = b.execute("SELECT current_setting('application_name')").fetchone()[0]
        b_path = b.execute("SHOW search_path").fetchone()[0]
        assert a.execute("SHOW application_name").fetchone()[0] == "startup_name"

        a.execute("SET TimeZone = 'America/New_York'")
        a.execute("SET application_name = 'session_a'")
        a.execute("SET search_path = skippr")
        assert a.execute("SHOW TimeZone").fetchone()[0] == "America/New_York"
        assert a.execute("SELECT current_setting('application_name')").fetchone()[0] == "session_a"
        assert a.execute("SHOW search_path").fetchone()[0] == "skippr"
        # search_path resolves unqualified names in A: skippr.tables
        assert a.execute("SELECT count(*) FROM tables").fetchone()[0] >= len(TABLES)
        # TimeZone shapes timestamptz output in A
        ts = a.execute(f"SELECT tstz FROM {gw.table('types')} WHERE id = 1").fetchone()[0]
        assert ts.utcoffset() == dt.timedelta(hours=-5), ts
        assert ts == source_fetch(gw, "SELECT tstz FROM public.types WHERE id = 1")[0][0]

        # B sees none of it
        assert b.execute("SHOW TimeZone").fetchone()[0] == b_tz != "America/New_York"
        assert b.execute("SELECT current_setting('application_name')").fetchone()[0] == b_app != "session_a"
        assert b.execute("SHOW search_path").fetchone()[0] == b_path != "skippr"
        with pytest.raises(psycopg.Error) as err:
            b.execute("SELECT count(*) FROM tables")
        assert err.value.sqlstate == "42P01"
    # a new session starts from the defaults again
    with gw.connect() as c:
        assert c.execute("SHOW TimeZone").fetchone()[0] == b_tz


# --------------------------------------------------------------------------------------------
# What Metabase and Superset send
# --------------------------------------------------------------------------------------------

# Metabase's postgres driver (src/metabase/driver/postgres.clj), as honeysql renders it
# (quoted identifiers, values bound as parameters); `%%` is a literal % for psycopg.

METABASE_DESCRIBE_DATABASE = """
SELECT "n"."nspname" AS "schema", "c"."relname" AS "name",
       CASE "c"."relkind" WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE' WHEN 'v' THEN 'VIEW'
            WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE NULL END AS "type",
       "d"."description" AS "description", "stat"."n_live_tup" AS "estimated_row_count"
FROM "pg_catalog"."pg_class" AS "c"
INNER JOIN "pg_catalog"."pg_namespace" AS "n" ON "c"."relnamespace" = "n"."oid"
LEFT JOIN "pg_catalog"."pg_description" AS "d"
       ON ("c"."oid" = "d"."objoid") AND ("d"."objsubid" = 0) AND ("d"."classoid" = 'pg_class'::regclass)
LEFT JOIN "pg_stat_user_tables" AS "stat" ON ("n"."nspname" = "stat"."schemaname") AND ("c"."relname" = "stat"."relname")
WHERE ("c"."relnamespace" = "n"."oid") AND ("n"."nspname" !~ %s) AND ("n"."nspname" <> %s)
  AND c.relkind in ('r', 'p', 'v', 'f', 'm') AND ("n"."nspname" IN (%s))
ORDER BY "type" ASC, "schema" ASC, "name" ASC
"""

METABASE_DESCRIBE_FIELDS = """
SELECT "c"."column_name" AS "name",
       CASE WHEN "c"."udt_schema" IN ('public', 'pg_catalog') THEN FORMAT('%%s', "c"."udt_name")
            ELSE FORMAT('"%%s"."%%s"', "c"."udt_schema", "c"."udt_name") END AS "database-type",
       "c"."ordinal_position" - 1 AS "database-position",
       "c"."table_schema" AS "table-schema", "c"."table_name" AS "table-name",
       "pk"."column_name" IS NOT NULL AS "pk?",
       COL_DESCRIPTION(CAST(CAST(FORMAT('%%I.%%I', CAST("c"."table_schema" AS TEXT), CAST("c"."table_name" AS TEXT)) AS REGCLASS) AS OID),
                       "c"."ordinal_position") AS "field-comment",
       (("column_default" IS NULL) OR (LOWER("column_default") = 'null')) AND ("is_nullable" = 'NO')
         AND NOT ((("column_default" IS NOT NULL) AND ("column_default" LIKE '%%nextval(%%')) OR ("is_identity" <> 'NO'))
         AS "database-required",
       (("column_default" IS NOT NULL) AND ("column_default" LIKE '%%nextval(%%')) OR ("is_identity" <> 'NO')
         AS "database-is-auto-increment"
FROM "information_schema"."columns" AS "c"
LEFT JOIN (SELECT "tc"."table_schema", "tc"."table_name", "kc"."column_name"
           FROM "information_schema"."table_constraints" AS "tc"
           INNER JOIN "information_schema"."key_column_usage" AS "kc"
                   ON ("tc"."constraint_name" = "kc"."constraint_name") AND ("tc"."table_schema" = "kc"."table_schema")
                  AND ("tc"."table_name" = "kc"."table_name")
           WHERE "tc"."constraint_type" = 'PRIMARY KEY') AS "pk"
       ON ("c"."table_schema" = "pk"."table_schema") AND ("c"."table_name" = "pk"."table_name")
      AND ("c"."column_name" = "pk"."column_name")
WHERE c.table_schema !~ '^information_schema|catalog_history|pg_' AND ("c"."table_schema" IN (%s))
UNION ALL
SELECT "pa"."attname" AS "name",
       CASE WHEN "ptn"."nspname" IN ('public', 'pg_catalog') THEN FORMAT('%%s', "pt"."typname")
            ELSE FORMAT('"%%s"."%%s"', "ptn"."nspname", "pt"."typname") END AS "database-type",
       "pa"."attnum" - 1 AS "database-position", "pn"."nspname" AS "table-schema", "pc"."relname" AS "table-name",
       FALSE AS "pk?", NULL AS "field-comment", FALSE AS "database-required", FALSE AS "database-is-auto-increment"
FROM "pg_catalog"."pg_class" AS "pc"
INNER JOIN "pg_catalog"."pg_namespace" AS "pn" ON "pn"."oid" = "pc"."relnamespace"
INNER JOIN "pg_catalog"."pg_attribute" AS "pa" ON "pa"."attrelid" = "pc"."oid"
INNER JOIN "pg_catalog"."pg_type" AS "pt" ON "pt"."oid" = "pa"."atttypid"
INNER JOIN "pg_catalog"."pg_namespace" AS "ptn" ON "ptn"."oid" = "pt"."typnamespace"
WHERE ("pc"."relkind" = 'm') AND ("pa"."attnum" >= 1) AND ("pn"."nspname" IN (%s))
ORDER BY "table-schema" ASC, "table-name" ASC, "database-position" ASC
"""

_QI = "'\"' || replace({0}, '\"', '\"\"') || '\"'"
_QNAME = f"{_QI.format('t.schemaname')} || '.' || {_QI.format('t.objectname')}"
METABASE_TABLE_PRIVILEGES = "\n".join([
    "with table_privileges as (",
    " select",
    "   NULL as role,",
    "   t.schemaname as schema,",
    "   t.objectname as table,",
    f"   pg_catalog.has_any_column_privilege(current_user, {_QNAME},  'update') as update,",
    f"   pg_catalog.has_any_column_privilege(current_user, {_QNAME},  'select') as select,",
    f"   pg_catalog.has_any_column_privilege(current_user, {_QNAME},  'insert') as insert,",
    f"   pg_catalog.has_table_privilege(     current_user, {_QNAME},  'delete') as delete",
    " from (",
    "   select schemaname, tablename as objectname from pg_catalog.pg_tables",
    "   union",
    "   select schemaname, viewname as objectname from pg_catalog.pg_views",
    "   union",
    "   select schemaname, matviewname as objectname from pg_catalog.pg_matviews",
    " ) t",
    " where t.schemaname !~ '^pg_'",
    "   and t.schemaname <> 'information_schema'",
    "   and pg_catalog.has_schema_privilege(current_user, t.schemaname, 'usage')",
    ")",
    "select t.*",
    "from table_privileges t",
])

METABASE_ENUM_TYPES = ("SELECT nspname, typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                       "WHERE t.oid IN (SELECT DISTINCT enumtypid FROM pg_enum e)")


def test_metabase_sync_queries(gw):
    with gw.connect() as conn:
        assert conn.execute("show timezone;").fetchone()[0]
        conn.execute("SET SESSION TIMEZONE TO 'UTC';")
        assert conn.execute("show timezone;").fetchone()[0] == "UTC"
        ts = conn.execute(f"SELECT tstz FROM {gw.table('types')} WHERE id = 1").fetchone()[0]
        assert ts.utcoffset() == dt.timedelta(0)

        tables = conn.execute(METABASE_DESCRIBE_DATABASE, ("^pg_", "information_schema", gw.schema)).fetchall()
        assert [r[:3] for r in tables] == [(gw.schema, t, "TABLE") for t in sorted(TABLES)], tables

        fields = conn.execute(METABASE_DESCRIBE_FIELDS, (gw.schema, gw.schema)).fetchall()
        by_table: dict[str, list[tuple]] = {}
        for name, dbtype, pos, schema, table, pk, comment, required, autoinc in fields:
            assert schema == gw.schema and comment is None and autoinc is False, (name, table)
            by_table.setdefault(table, []).append((pos, name, dbtype, pk, required))
        assert sorted(by_table) == sorted(TABLES)
        for table, names in (("types", TYPE_COLUMNS), ("lines", LINE_COLUMNS), ("sales_refunds", REFUND_COLUMNS)):
            rows = by_table[table]
            assert [r[0] for r in rows] == list(range(len(names))), rows
            assert [r[1] for r in rows] == names
            assert [r[1] for r in rows if r[3]] == [c for c in names if c in PRIMARY_KEYS[table]], (table, rows)
        types = {r[1]: r[2] for r in by_table["types"]}
        assert (types["id"], types["i8"], types["tstz"], types["u"], types["ia"]) == \
            ("int4", "int8", "timestamptz", "uuid", "_int4"), types
        assert {r[1]: r[4] for r in by_table["lines"]}["order_id"] is True

        privileges = {r[2]: r for r in conn.execute(METABASE_TABLE_PRIVILEGES).fetchall() if r[1] == gw.schema}
        assert sorted(privileges) == sorted(TABLES), privileges
        for table, (_role, _schema, _name, update, select, insert, delete) in privileges.items():
            assert select is True, (table, privileges[table])
            assert (update, insert, delete) == (False, False, False), (table, privileges[table])

        assert conn.execute(METABASE_ENUM_TYPES).fetchall() == []


def test_superset_queries(gw):
    """Superset: the catalog list, its SQL Lab prequery `set search_path`, the cancel id, and
    a schema chosen by startup `options` (-csearch_path)."""
    count_lines = source_fetch(gw, "SELECT count(*) FROM public.lines")[0][0]
    with gw.connect() as conn:
        dbs = [r[0] for r in conn.execute("SELECT datname FROM pg_database\nWHERE datistemplate = false;")]
        assert dbs, "pg_database lists no database"
        conn.execute(f'set search_path = "{gw.schema}"')
        assert conn.execute("SELECT count(*) FROM lines").fetchone()[0] == count_lines
        assert isinstance(conn.execute("SELECT pg_backend_pid()").fetchone()[0], int)
    with gw.connect(options=f"-csearch_path={gw.schema}") as conn:
        assert conn.execute("SHOW search_path").fetchone()[0] == gw.schema
        assert conn.execute("SELECT count(*) FROM lines").fetchone()[0] == count_lines


#: Result shapes BI tools' generated SQL takes for granted: duplicate output names, and
#: expressions without a name named as Postgres names them. `{s}` is the schema.
RESULT_SHAPES = [
    "SELECT count(*), count(*) FROM {s}.lines",
    "SELECT 1 AS a, 2 AS a",
    "SELECT count(*) AS n, sum(qty) AS n, 'x', 1 + 1, NULL FROM {s}.lines",
    "SELECT order_id, order_id, sum(qty), max(qty) + 1, CAST(sku AS text), lower(sku), qty::bigint, "
    "CASE WHEN qty > 2 THEN 'big' END, coalesce(sku, '-') "
    "FROM {s}.lines WHERE order_id < 5 GROUP BY order_id, sku, qty ORDER BY order_id, sku, qty",
    "SELECT a.order_id, b.order_id, a.line_no, b.line_no FROM {s}.lines a JOIN {s}.lines b "
    "ON a.order_id = b.order_id AND a.line_no = b.line_no WHERE a.order_id < 5 ORDER BY 1, 3",
    "SELECT t.*, t.order_id FROM (SELECT order_id, count(*) FROM {s}.lines GROUP BY order_id) t "
    "ORDER BY 1 LIMIT 4",
    "SELECT *, order_id, qty * 2 AS total FROM {s}.lines ORDER BY total DESC, order_id, line_no LIMIT 3",
    "SELECT l.order_id, l.* FROM {s}.lines l ORDER BY l.order_id, l.line_no LIMIT 3",
    "SELECT * FROM (SELECT l.*, l.qty FROM {s}.lines l) q ORDER BY order_id, line_no LIMIT 3",
]


def _copy_out(conn: psycopg.Connection, sql: str) -> list[list[str]]:
    import csv
    import io

    buf = io.StringIO()
    with conn.cursor().copy(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv, HEADER)") as copy:
        for chunk in copy:
            buf.write(bytes(chunk).decode())
    return list(csv.reader(io.StringIO(buf.getvalue())))


@pytest.mark.parametrize("shape", RESULT_SHAPES)
def test_result_shapes_as_postgres_in_every_protocol_path(gw, shape):
    """The same names and values as Postgres through the simple protocol (psycopg's client-side
    cursor, psql), the extended protocol (psycopg prepared, asyncpg's binary format) and COPY."""
    import asyncpg

    def shapes(conn: psycopg.Connection, sql: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        simple = psycopg.ClientCursor(conn)
        simple.execute(sql)
        out["simple"] = ([d.name for d in simple.description], simple.fetchall())
        extended = conn.cursor()
        extended.execute(sql, prepare=True)
        out["extended"] = ([d.name for d in extended.description], extended.fetchall())
        out["copy"] = _copy_out(conn, sql)
        return out

    async def asyncpg_shape(params: dict[str, Any], sql: str) -> tuple[list[str], list[tuple]]:
        conn = await asyncpg.connect(host=params["host"], port=params["port"], user=params["user"],
                                     password=params.get("password"), database=params["dbname"],
                                     ssl=False, timeout=30)
        try:
            stmt = await conn.prepare(sql)
            return [a.name for a in stmt.get_attributes()], [tuple(r) for r in await stmt.fetch()]
        finally:
            await conn.close()

    source_sql, gw_sql = shape.format(s="public"), shape.format(s=gw.schema)
    with gw.source.connect() as conn:
        want = shapes(conn, source_sql)
    with gw.connect() as conn:
        got = shapes(conn, gw_sql)
    src = gw.source
    src_params = dict(host=src.host, port=src.port, user=src.cluster.user, password=src.cluster.password,
                      dbname=src.name)
    want["asyncpg"] = asyncio.run(asyncpg_shape(src_params, source_sql))
    got["asyncpg"] = asyncio.run(asyncpg_shape(gw.params(), gw_sql))
    want["psql"] = psql(src.dsn(), source_sql, unaligned=True).stdout.splitlines()[0]
    got["psql"] = psql(gw.conninfo(), gw_sql, unaligned=True).stdout.splitlines()[0]
    for path in want:
        assert got[path] == want[path], (
            f"{path}: the gateway's result differs from Postgres's for {gw_sql}\n"
            f"  Postgres: {want[path]!r}\n  gateway:  {got[path]!r}\n{gw.log()[-2000:]}")


# --------------------------------------------------------------------------------------------
# skippr.tables and /metrics
# --------------------------------------------------------------------------------------------


def test_skippr_tables(gw):
    with gw.connect() as conn:
        cur = conn.execute("SELECT * FROM skippr.tables ORDER BY table_name")
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    for col in ("table_schema", "table_name", "committed_lsn", "wal_tail_rows", "last_commit_time", "lag_seconds"):
        assert col in names, f"skippr.tables has no column {col}: {names}"
    mine = [r for r in rows if r["table_schema"] == gw.schema]
    assert sorted(r["table_name"] for r in mine) == sorted(TABLES), rows
    server_lsn = lsn_to_int(source_fetch(gw, "SELECT pg_current_wal_lsn()::text")[0][0])
    for r in mine:
        assert isinstance(r["committed_lsn"], str) and LSN_RE.match(r["committed_lsn"]), r
        assert 0 < lsn_to_int(r["committed_lsn"]) <= server_lsn, r
        assert isinstance(r["wal_tail_rows"], int) and r["wal_tail_rows"] >= 0, r
        assert isinstance(r["last_commit_time"], dt.datetime) and r["last_commit_time"].tzinfo is not None, r
        assert r["last_commit_time"] <= dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5), r
        assert float(r["lag_seconds"]) >= 0, r


def test_metrics_endpoint(gw):
    assert gw.metrics_port, "the gateway was started without a metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{gw.metrics_port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers.get("Content-Type", "").startswith("application/openmetrics-text"), resp.headers
        body = resp.read().decode()
    assert body.endswith("# EOF\n"), body[-200:]
    assert re.search(r"^# TYPE skippr_\w+ (counter|gauge)", body, re.M), body[:2000]
    assert re.search(r'^skippr_\w+(\{[^}]*\})? [-+0-9.eE]+', body, re.M), body[:2000]


# --------------------------------------------------------------------------------------------
# TLS, users, and refusals at start (each with its own small pipeline and gateway)
# --------------------------------------------------------------------------------------------


def small_source(db: Database) -> None:
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text); "
               "INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 25) i;")


def unique_workspace() -> str:
    """Its own workspace (and so replication slot) beside the module's running gateway."""
    return "ws_" + secrets.token_hex(4)


def make_cert(folder: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made with openssl."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl not installed"
    crt, key = folder / f"{name}.crt", folder / f"{name}.key"
    proc = run_tool([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt,
                     "-days", "2", "-subj", "/CN=localhost",
                     "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], timeout=60)
    assert proc.returncode == 0, describe_run(proc, "openssl failed")
    return crt, key


def test_tls(db, workdir):
    small_source(db)
    crt, key = make_cert(workdir)
    ws = unique_workspace()
    with start_gateway(db, workdir, ["items"], workspace=ws,
                       query={"tls": {"cert": crt.name, "key": key.name}}) as tls_gw:
        for mode in ({"sslmode": "require"},
                     {"sslmode": "verify-full", "sslrootcert": str(crt), "host": "127.0.0.1"}):
            with tls_gw.connect(**mode) as conn:
                assert conn.pgconn.ssl_in_use, f"{mode}: the connection is not encrypted"
                assert conn.execute(f"SELECT count(*) FROM {ws}.items").fetchone() == (25,)
        out = psql(tls_gw.conninfo(sslmode="require"), "\\conninfo", f"SELECT count(*) FROM {ws}.items").stdout
        assert "SSL connection" in out and "25" in out, out


@pytest.mark.parametrize("broken", ["missing_key", "garbage_cert"])
def test_broken_tls_section_stops_serve(db, workdir, broken):
    small_source(db)
    crt, key = make_cert(workdir)
    if broken == "missing_key":
        cert_name, key_name, must_name = crt.name, "missing.key", "missing.key"
    else:
        (workdir / "garbage.crt").write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
        cert_name, key_name, must_name = "garbage.crt", key.name, "garbage.crt"
    skippr = Skippr(db=db, workdir=workdir)
    skippr.write_config(["items"], workspace=unique_workspace(),
                        query={"listen": f"127.0.0.1:{free_port()}", "tls": {"cert": cert_name, "key": key_name}},
                        metrics_listen=f"127.0.0.1:{free_port()}")
    proc = skippr.run("serve", check=False, timeout=START_TIMEOUT_S)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "serve started with a broken tls section")
    assert must_name in proc.stderr, describe_run(proc, f"the error does not name {must_name}")


PASSWORD = "c0rrect horse; 'battery'"


def test_users_scram_and_sigterm(db, workdir):
    """With users: SCRAM-SHA-256; a wrong password or unknown user gets 28P01, the right one
    works (also when listening on 0.0.0.0). SIGTERM then stops serve with exit 0."""
    import pg8000.native

    small_source(db)
    ws = unique_workspace()
    with start_gateway(db, workdir, ["items"], workspace=ws, listen_host="0.0.0.0",
                       query={"users": [{"name": "analyst", "password": "${ANALYST_PASSWORD}"}]},
                       env={"ANALYST_PASSWORD": PASSWORD}, user="analyst", password=PASSWORD) as auth_gw:
        # libpq refuses anything but SCRAM-SHA-256 here
        with auth_gw.connect(require_auth="scram-sha-256") as conn:
            assert conn.execute(f"SELECT count(*) FROM {ws}.items").fetchone() == (25,)
        p = auth_gw.params()
        conn8 = pg8000.native.Connection("analyst", host=p["host"], port=p["port"], database=p["dbname"],
                                         password=PASSWORD, timeout=30)
        try:
            assert conn8.run(f"SELECT count(*) FROM {ws}.items") == [[25]]
        finally:
            conn8.close()

        for user, password in (("analyst", PASSWORD + "x"), ("analyst", ""), ("nobody", PASSWORD)):
            with pytest.raises(pg8000.native.DatabaseError) as err:
                pg8000.native.Connection(user, host=p["host"], port=p["port"], database=p["dbname"],
                                         password=password, timeout=30).close()
            assert sqlstate_of(err.value) == "28P01", f"{user}/{password!r}: {err.value}"
            with pytest.raises(psycopg.OperationalError):
                auth_gw.connect(user=user, password=password, connect_timeout=10).close()
        with pytest.raises(psycopg.OperationalError):  # no password at all
            auth_gw.connect(password=None, connect_timeout=10, passfile="/dev/null").close()

        rc = stop_gateway(auth_gw.proc)
        assert rc == 0, f"serve exited {rc} after SIGTERM\n{auth_gw.log()}"


def test_no_users_and_non_loopback_listen_is_refused(db, workdir):
    small_source(db)
    skippr = Skippr(db=db, workdir=workdir)
    skippr.write_config(["items"], workspace=unique_workspace(),
                        query={"listen": f"0.0.0.0:{free_port()}"}, metrics_listen=f"127.0.0.1:{free_port()}")
    proc = skippr.run("serve", check=False, timeout=START_TIMEOUT_S)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "serve accepted 0.0.0.0 without users")
    assert "0.0.0.0" in proc.stderr and "users" in proc.stderr, describe_run(proc, "unclear refusal")


# --------------------------------------------------------------------------------------------
# Live changes (last: it changes the source, and puts it back)
# --------------------------------------------------------------------------------------------


def wait_for(gw: Gateway, sql: str, expected: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    got: Any = None
    while time.monotonic() < deadline:
        if gw.proc is not None and gw.proc.poll() is not None:
            pytest.fail(f"serve exited with {gw.proc.returncode}\n{gw.log()}")
        got = gw_fetch(gw, sql)
        if got == expected:
            return
        time.sleep(0.5)
    pytest.fail(f"`{sql}` gave {got}, not {expected}, within {timeout}s\n{gw.log()}")


def test_source_changes_reach_the_gateway(gw):
    """serve follows the source: an insert and then its delete show up through the gateway."""
    probe = f"SELECT sku, qty FROM {gw.table('lines')} WHERE order_id = 424242 ORDER BY line_no"
    gw.source.execute("INSERT INTO lines VALUES (1, 424242, 'live', 7, 1.00, 'inserted while serving')")
    try:
        wait_for(gw, probe, [("live", 7)])
    finally:
        gw.source.execute("DELETE FROM lines WHERE order_id = 424242")
    wait_for(gw, probe, [])


def test_prepared_statements_see_each_execution_live(gw):
    """A named prepared statement is planned again at every execution: it sees rows
    committed after it was prepared (psycopg prepares a query after 5 executions; pgjdbc and
    asyncpg prepare every query)."""
    probe = f"SELECT count(*) FROM {gw.table('lines')} WHERE order_id = %s"
    with gw.connect() as conn:
        for _ in range(3):
            assert conn.execute(probe, (535353,), prepare=True).fetchone()[0] == 0
        gw.source.execute("INSERT INTO lines VALUES (1, 535353, 'prepared', 1, 1.00, NULL)")
        try:
            deadline = time.monotonic() + 90
            seen = 0
            while time.monotonic() < deadline and seen != 1:
                seen = conn.execute(probe, (535353,), prepare=True).fetchone()[0]
                time.sleep(0.2)
            assert seen == 1, f"the prepared statement still sees {seen} rows\n{gw.log()}"
        finally:
            gw.source.execute("DELETE FROM lines WHERE order_id = 535353")
