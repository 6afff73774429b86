"""A password given through an environment variable never appears in any command's output
(even with RUST_LOG=debug) nor in any file the binary writes."""

from __future__ import annotations

import secrets

from conftest import Skippr, assert_no_panic, describe_run


def _assert_not_leaked(proc, secret: str) -> None:
    assert secret not in proc.stdout, describe_run(proc, "printed the password on stdout")
    assert secret not in proc.stderr, describe_run(proc, "printed the password on stderr")


def test_password_never_printed_or_written(skippr: Skippr, db):
    password = "Pw-" + secrets.token_hex(12)
    db.execute("CREATE TABLE items (id integer PRIMARY KEY, v text);"
               "INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 50) i;")
    db.create_role("secret_user", password, replication=True)
    db.execute("ALTER TABLE items OWNER TO secret_user")
    db.execute(f'GRANT CREATE ON DATABASE "{db.name}" TO secret_user')
    skippr.write_config(["items"], user="secret_user", password=password)
    assert password not in skippr.config_path.read_text()

    debug = {"RUST_LOG": "debug"}
    must_succeed = [
        ("validate",),
        ("sync", "--pipeline", "app", "--once"),
        ("query", "SELECT count(*) AS n FROM analytics.items"),
    ]
    may_fail = [
        ("discover", "--pipeline", "app"),
        ("discover", "--pipeline", "app", "--format", "json"),
    ]
    for args in must_succeed + may_fail:
        for env in ({}, debug):
            proc = skippr.run(*args, env=env, check=False)
            assert_no_panic(proc)
            _assert_not_leaked(proc, password)
            if args in must_succeed:
                assert proc.returncode == 0, describe_run(proc)

    needle = password.encode()
    leaked = [p for p in skippr.workdir.rglob("*") if p.is_file() and needle in p.read_bytes()]
    assert not leaked, f"password written to {leaked}"
    skippr.assert_table_matches("items")


def test_wrong_password_is_not_printed(skippr: Skippr, db):
    db.execute("CREATE TABLE items (id integer PRIMARY KEY)")
    wrong = "Wrong-" + secrets.token_hex(12)
    skippr.write_config(["items"], password=wrong)
    for args in (("discover", "--pipeline", "app"), ("sync", "--pipeline", "app", "--once")):
        proc = skippr.run(*args, env={"RUST_LOG": "debug"}, check=False)
        assert_no_panic(proc)
        assert proc.returncode != 0, describe_run(proc, "succeeded with a wrong password")
        _assert_not_leaked(proc, wrong)
        assert "password" in proc.stderr.lower() or "authentication" in proc.stderr.lower(), \
            describe_run(proc, "error does not say authentication failed")
