"""TLS to the source: a Postgres started with `ssl = on`, a server certificate for `localhost`
signed by a test CA made with openssl, and a pg_hba.conf that accepts TCP clients only over
TLS (`hostssl`). Every successful connection of skipprd to this cluster is therefore a TLS
connection: the snapshot sessions, the slot's replication session and the change stream.

Checked: sync and CDC with `verify-full` (and `verify-ca`, which ignores the host name);
`verify-full` against a host name the certificate does not carry, `verify-ca` and
`require` with a CA that did not sign the certificate, `disable` against `hostssl`, and
`require` against a server without TLS all fail with an error that names the fix."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

import pytest

from conftest import (
    Database,
    PgCluster,
    Skippr,
    _drop_database,
    assert_no_panic,
    describe_run,
    start_cluster,
    stop_cluster,
)


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "openssl not installed (tests/run installs it)"
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, describe_run(proc, "openssl failed")


def _make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "2", "-subj", f"/CN=Skippr test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt (signed the server's certificate), other.crt (an unrelated CA), and
    server.crt/server.key for DNS name `localhost` only (no IP address entry)."""
    d = tmp_path_factory.mktemp("tls")
    _make_ca(d, "ca")
    _make_ca(d, "other")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "server.ext", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_pg(certs: Path) -> Iterable[PgCluster]:
    # The server reads its key as the `postgres` user and refuses a key others can read.
    # (pytest's own temp folders are private to root, so the files go to a folder of their own.)
    keydir = Path(tempfile.mkdtemp(prefix="skippr-pg-tls-"))
    os.chmod(keydir, 0o755)
    for f in ("server.crt", "server.key"):
        shutil.copy(certs / f, keydir / f)
    os.chmod(keydir / "server.key", 0o600)
    if os.geteuid() == 0:
        for p in (keydir, keydir / "server.crt", keydir / "server.key"):
            shutil.chown(p, "postgres", "postgres")
    cluster = start_cluster({
        "ssl": "on",
        "ssl_cert_file": f"'{keydir / 'server.crt'}'",
        "ssl_key_file": f"'{keydir / 'server.key'}'",
    })
    try:
        # TCP clients only over TLS; the Unix socket stays open for the cluster's set-up.
        (cluster.datadir / "pg_hba.conf").write_text(
            "local    all          all                    trust\n"
            "local    replication  all                    trust\n"
            "hostssl  all          all   127.0.0.1/32     md5\n"
            "hostssl  replication  all   127.0.0.1/32     md5\n"
        )
        cluster.execute("SELECT pg_reload_conf()")
        yield cluster
    finally:
        stop_cluster(cluster)
        shutil.rmtree(keydir, ignore_errors=True)


@pytest.fixture
def tls_db(tls_pg: PgCluster) -> Iterable[Database]:
    name = "t_" + secrets.token_hex(6)
    tls_pg.execute(f'CREATE DATABASE "{name}"')
    try:
        yield Database(tls_pg, name)
    finally:
        _drop_database(tls_pg, name)


def _items(db: Database) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2))")
    db.execute("INSERT INTO items SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 500) g")


def _configure(s: Skippr, host: str, **tls: str) -> None:
    s.write_config(["items"], host=host, extra_source=tls)


def _fails(s: Skippr, *needles: str) -> str:
    proc = s.run("sync", "--pipeline", "app", "--once", check=False, timeout=120)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc, "sync should have failed")
    for n in needles:
        assert n in proc.stderr, describe_run(proc, f"expected `{n}` in the error")
    # No plain-text fallback, no retry loop: a TLS set-up problem is a configuration error.
    assert proc.returncode == 2, describe_run(proc, "expected exit code 2 (configuration)")
    return proc.stderr


def test_sync_and_cdc_over_verify_full(tls_db: Database, workdir: Path, certs: Path) -> None:
    _items(tls_db)
    s = Skippr(db=tls_db, workdir=workdir)
    _configure(s, "localhost", sslmode="verify-full", sslrootcert=str(certs / "ca.crt"))
    proc = s.sync_once()
    assert proc.returncode == 0, describe_run(proc, "snapshot over verify-full failed")
    s.assert_table_matches("items")
    # Changes arrive through the replication session (also TLS: hostssl only).
    tls_db.execute("INSERT INTO items VALUES (1001, 'new', 9.99)")
    tls_db.execute("UPDATE items SET price = price + 1 WHERE id <= 10")
    tls_db.execute("DELETE FROM items WHERE id BETWEEN 400 AND 420")
    proc = s.sync_once()
    assert proc.returncode == 0, describe_run(proc, "CDC over verify-full failed")
    s.assert_table_matches("items", readers=("pyiceberg", "duckdb", "query"))
    assert s.read_pyiceberg("items", ("id",))[-1]["id"] == 1001


def test_verify_ca_ignores_the_host_name(tls_db: Database, workdir: Path, certs: Path) -> None:
    _items(tls_db)
    s = Skippr(db=tls_db, workdir=workdir)
    # The certificate names only `localhost`; verify-ca checks the chain, not the name.
    _configure(s, "127.0.0.1", sslmode="verify-ca", sslrootcert=str(certs / "ca.crt"))
    proc = s.sync_once()
    assert proc.returncode == 0, describe_run(proc, "sync over verify-ca failed")
    tls_db.execute("UPDATE items SET name = 'renamed' WHERE id = 7")
    proc = s.sync_once()
    assert proc.returncode == 0, describe_run(proc, "CDC over verify-ca failed")
    s.assert_table_matches("items")


def test_sslrootcert_is_relative_to_the_config_file(tls_db: Database, workdir: Path, certs: Path) -> None:
    _items(tls_db)
    shutil.copy(certs / "ca.crt", workdir / "db-ca.pem")
    s = Skippr(db=tls_db, workdir=workdir)
    _configure(s, "localhost", sslmode="verify-full", sslrootcert="./db-ca.pem")
    proc = s.run("sync", "--pipeline", "app", "--once", check=False, cwd=workdir.parent)
    assert proc.returncode == 0, describe_run(proc, "relative sslrootcert was not found")
    s.assert_table_matches("items", readers=("pyiceberg",))


def test_verify_full_with_a_wrong_host_name_fails(tls_db: Database, workdir: Path, certs: Path) -> None:
    _items(tls_db)
    s = Skippr(db=tls_db, workdir=workdir)
    _configure(s, "127.0.0.1", sslmode="verify-full", sslrootcert=str(certs / "ca.crt"))
    err = _fails(s, "sslmode verify-full", "not valid for host `127.0.0.1`", "verify-ca")
    assert "item " not in err


@pytest.mark.parametrize("mode", ["verify-ca", "verify-full", "require"])
def test_a_wrong_ca_fails(tls_db: Database, workdir: Path, certs: Path, mode: str) -> None:
    """`require` with an sslrootcert checks the chain too, as libpq does."""
    _items(tls_db)
    s = Skippr(db=tls_db, workdir=workdir)
    _configure(s, "localhost", sslmode=mode, sslrootcert=str(certs / "other.crt"))
    _fails(s, "not signed by a CA in sslrootcert", str(certs / "other.crt"))


def test_require_without_a_root_certificate_encrypts_without_checking(
    tls_db: Database, workdir: Path
) -> None:
    _items(tls_db)
    s = Skippr(db=tls_db, workdir=workdir)
    _configure(s, "127.0.0.1", sslmode="require")
    proc = s.sync_once(env={"HOME": str(workdir)})  # no ~/.postgresql/root.crt
    assert proc.returncode == 0, describe_run(proc, "sync over require failed")
    s.assert_table_matches("items", readers=("pyiceberg",))


def test_hostssl_only_refuses_sslmode_disable(tls_db: Database, workdir: Path) -> None:
    _items(tls_db)
    s = Skippr(db=tls_db, workdir=workdir)
    _configure(s, "127.0.0.1", sslmode="disable")
    proc = s.run("sync", "--pipeline", "app", "--once", check=False, timeout=120)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc)
    assert "no encryption" in proc.stderr, describe_run(proc)
    assert "sslmode: require" in proc.stderr, describe_run(proc, "the error should name the fix")


def test_require_against_a_server_without_tls_fails(db: Database, workdir: Path) -> None:
    """The shared test cluster runs without TLS: `prefer` (the default) connects in plain
    text there, `require` must not."""
    _items(db)
    s = Skippr(db=db, workdir=workdir)
    _configure(s, "127.0.0.1", sslmode="require")
    _fails(s, "does not accept TLS", "sslmode: prefer")


def test_bad_tls_settings_are_config_errors(db: Database, workdir: Path) -> None:
    s = Skippr(db=db, workdir=workdir)
    _configure(s, "127.0.0.1", sslmode="verify_full")
    proc = s.run("validate", check=False)
    assert proc.returncode == 2, describe_run(proc)
    assert "sslmode" in proc.stderr and "verify-full" in proc.stderr, describe_run(proc)
    _configure(s, "127.0.0.1", sslmode="verify-full", sslrootcert="./missing-ca.pem")
    proc = s.run("validate", check=False)
    assert proc.returncode == 2, describe_run(proc)
    assert "sslrootcert" in proc.stderr and "missing-ca.pem" in proc.stderr, describe_run(proc)
    _configure(s, "/var/run/postgresql", sslmode="verify-full", sslrootcert="./x")
    proc = s.run("validate", check=False)
    assert proc.returncode == 2, describe_run(proc)
    assert "Unix socket" in proc.stderr, describe_run(proc)
