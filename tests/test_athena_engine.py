"""`skipprd query --engine athena` and `skipprd discover`'s checks of an AthenaIceberg sink,
against moto's server (S3, Glue and Athena at one endpoint, started and stopped by the
fixture in test_athena_iceberg.py).

What moto does not emulate, and where that is covered instead:
- moto does not execute SQL: a query's rows are whatever was queued through moto's API
  (`POST /moto-api/static/athena/query-results`), and a query without queued rows returns no
  columns. These tests queue the rows exactly as Athena returns them (the header row of a
  SELECT, every value as text, NULL as a missing `VarCharValue`), taken from the same
  Postgres rows that the local engine reads from the synced Iceberg tables, and compare what
  both engines print.
- moto never fails a query on its own (no FAILED state, no `StateChangeReason`), reports 0
  bytes scanned and checks no IAM permission: the FAILED path, Athena's reasons, throttling,
  paging over several result pages and access-denied messages are unit-tested in Rust
  against an in-process Athena (src/query/athena/tests.rs). Here a query fails the way moto
  can make it fail: a workgroup that does not exist, or a query cancelled from outside.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from conftest import Skippr, assert_no_panic, describe_run
from test_athena_iceberg import GLUE_DB, LAKE_BUCKET, Moto, flagship_config, moto  # noqa: F401

RESULTS_BUCKET = "skippr-athena-results"  # what flagship_config names


def moto_api(moto: Moto, path: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        f"{moto.endpoint}/moto-api/{path}", data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 201), resp.status


def athena_text(v: Any) -> dict[str, str]:
    """One value as Athena's GetQueryResults shows it."""
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"VarCharValue": "true" if v else "false"}
    if isinstance(v, datetime):
        return {"VarCharValue": v.strftime("%Y-%m-%d %H:%M:%S.%f")}
    if isinstance(v, (date, Decimal, int, str)):
        return {"VarCharValue": str(v)}
    raise TypeError(type(v))


def queue_result(moto: Moto, columns: list[tuple[str, str, int, int]], rows: list[tuple]) -> None:
    """Queues the rows of the next Athena query: the header row a SELECT starts with, then
    `rows`; `columns` are (name, Athena type, precision, scale)."""
    header = {"Data": [{"VarCharValue": c[0]} for c in columns]}
    moto_api(moto, "static/athena/query-results", {
        "region": "us-east-1",
        "results": [{
            "rows": [header] + [{"Data": [athena_text(v) for v in r]} for r in rows],
            "column_info": [
                {"Name": n, "Label": n, "Type": t, "Precision": p, "Scale": s,
                 "Nullable": "NULLABLE", "CaseSensitive": t == "varchar",
                 "CatalogName": "hive", "SchemaName": "", "TableName": ""}
                for (n, t, p, s) in columns
            ],
        }],
    })


def executions(moto: Moto) -> list[dict]:
    athena = moto.client("athena")
    return [athena.get_query_execution(QueryExecutionId=i)["QueryExecution"]
            for i in athena.list_query_executions()["QueryExecutionIds"]]


def keep_queries_queued(moto: Moto) -> None:
    """Athena queries stay QUEUED until stopped (moto advances them on every poll otherwise)."""
    moto_api(moto, "state-manager/set-transition", {
        "model_name": "athena::execution", "transition": {"progression": "manual", "times": 1_000_000},
    })


def start_queued_query(skippr: Skippr, moto: Moto):
    """`skipprd query --engine athena` in the background, its query held QUEUED in Athena;
    the process and the query id once Athena has it and skipprd is polling."""
    flagship_config(skippr, ["orders"])
    skippr.env.update(moto.env)
    keep_queries_queued(moto)
    proc = skippr.start("query", "--engine", "athena", "SELECT count(*) FROM orders")
    qid = started_query(moto, proc)
    time.sleep(1)
    assert proc.poll() is None, "skipprd must wait while the query is queued"
    return proc, qid


def started_query(moto: Moto, proc, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = moto.client("athena").list_query_executions()["QueryExecutionIds"]
        if ids:
            return ids[0]
        assert proc.poll() is None, "skipprd exited before starting the query"
        time.sleep(0.1)
    raise AssertionError("no Athena query was started")


def wait_exit(proc, timeout: float = 60) -> int:
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        proc.kill()
        raise


def test_athena_prints_what_the_local_engine_prints(skippr: Skippr, moto: Moto) -> None:
    """The same rows, read by the local engine from the synced tables and returned by Athena
    as text, print identically in every format: numbers typed and right-aligned, NULL as
    the local engine shows it, '' kept apart from NULL. Each statement reaches Athena with
    the sink's workgroup, Glue database and results location, with progress on stderr."""
    db = skippr.db
    db.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, big bigint, amount numeric(10,2), note text, "
        "paid boolean, day date, at timestamp)"
    )
    db.execute(
        "INSERT INTO orders VALUES "
        "(1, 9007199254740993, 12.50, 'plain', true, '2024-02-29', '2024-02-29 23:59:58.123456'), "
        "(2, -1, 0.05, 'with, comma \"quoted\"', false, '1999-12-31', '2000-01-01 00:00:00'), "
        "(3, NULL, NULL, NULL, NULL, NULL, NULL), "
        "(4, 0, 1000.00, '', true, '2024-01-01', '2024-01-01 12:00:00.5')"
    )
    flagship_config(skippr, ["orders"])
    skippr.env.update(moto.env)
    skippr.sync_once()

    sql_local = "SELECT id, big, amount, note, paid, day, at FROM analytics.orders ORDER BY id"
    sql_athena = "SELECT id, big, amount, note, paid, day, at FROM orders ORDER BY id"
    rows = db.execute("SELECT id, big, amount, note, paid, day, at FROM orders ORDER BY id")
    columns = [("id", "integer", 10, 0), ("big", "bigint", 19, 0), ("amount", "decimal", 10, 2),
               ("note", "varchar", 2147483647, 0), ("paid", "boolean", 0, 0), ("day", "date", 0, 0),
               ("at", "timestamp", 6, 0)]
    printed = {}
    for fmt in ("table", "csv", "json"):
        local = skippr.run("query", "--format", fmt, sql_local)
        queue_result(moto, columns, rows)
        athena = skippr.run("query", "--engine", "athena", "--format", fmt, sql_athena)
        assert_no_panic(athena)
        assert athena.stdout == local.stdout, (
            f"format {fmt}\n--- local ---\n{local.stdout}\n--- athena ---\n{athena.stdout}"
        )
        assert "SUCCEEDED" in athena.stderr and "scanned" in athena.stderr, describe_run(athena)
        printed[fmt] = athena.stdout
    # Numbers are right-aligned and NULL prints empty, as psql (and the local engine) do.
    cells = [line.split("|") for line in printed["table"].splitlines()[2:6]]
    assert cells[1][1].startswith("   ") and cells[1][1].endswith(" -1 "), printed["table"]
    assert [c.strip() for c in cells[2]] == ["3", "", "", "", "", "", ""], printed["table"]
    assert printed["table"].endswith("(4 rows)\n")
    assert '"big":9007199254740993' in printed["json"] and '"note":null' in printed["json"]
    table = skippr.run("query", "--engine", "athena", "SELECT 1")  # nothing queued: no columns
    assert table.stdout == "(0 rows)\n", describe_run(table)

    sent = executions(moto)
    assert len(sent) == 4
    for q in sent:
        assert q["WorkGroup"] == "primary"
        assert q["QueryExecutionContext"]["Database"] == GLUE_DB
        assert q["ResultConfiguration"]["OutputLocation"].startswith(f"s3://{RESULTS_BUCKET}/")
        assert q["Status"]["State"] == "SUCCEEDED"
    assert sorted(q["Query"] for q in sent) == sorted([sql_athena] * 3 + ["SELECT 1"])


def test_a_missing_workgroup_fails_naming_it(skippr: Skippr, moto: Moto) -> None:
    """Athena refuses the query (moto, like Athena, answers InvalidRequestException): the
    exit code is 2 and the message names the workgroup, the config key and the fix."""
    flagship_config(skippr, ["orders"])
    text = skippr.config_path.read_text().replace("athena_workgroup_name: primary", "athena_workgroup_name: analysts")
    skippr.write_raw_config(text)
    skippr.env.update(moto.env)
    proc = skippr.run("query", "--engine", "athena", "SELECT 1", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 2, describe_run(proc)
    assert "Athena workgroup `analysts`" in proc.stderr, describe_run(proc)
    assert "data_sinks.lake.AthenaIceberg.athena_workgroup_name" in proc.stderr, describe_run(proc)
    assert "aws athena create-work-group --name analysts" in proc.stderr, describe_run(proc)
    assert proc.stdout == ""


def test_a_query_cancelled_in_athena_exits_non_zero(skippr: Skippr, moto: Moto) -> None:
    """A query stopped outside skipprd (the console, another user) ends `query` with an
    error naming the CANCELLED state; nothing is printed on stdout."""
    proc, qid = start_queued_query(skippr, moto)
    moto.client("athena").stop_query_execution(QueryExecutionId=qid)
    rc = wait_exit(proc)
    out = (skippr.workdir / "bg.stdout").read_text()
    err = (skippr.workdir / "bg.stderr").read_text()
    assert rc == 1, err
    assert f"Athena query {qid} was CANCELLED" in err, err
    assert f"athena: query {qid} QUEUED" in err, err
    assert out == ""


def test_ctrl_c_stops_the_query_in_athena(skippr: Skippr, moto: Moto) -> None:
    """SIGINT while Athena runs the query: skipprd calls StopQueryExecution (moto then shows
    the query CANCELLED) and exits non-zero saying so."""
    proc, qid = start_queued_query(skippr, moto)
    proc.send_signal(signal.SIGINT)
    rc = wait_exit(proc)
    err = (skippr.workdir / "bg.stderr").read_text()
    assert rc == 1, err
    assert f"interrupted: Athena query {qid} was stopped (StopQueryExecution)" in err, err
    [q] = executions(moto)
    assert q["QueryExecutionId"] == qid and q["Status"]["State"] == "CANCELLED"


def sink_checks(report: dict) -> list[dict]:
    return [c for c in report["checks"] if c["name"].startswith("sink ")]


def test_discover_checks_the_athena_sink_first(skippr: Skippr, moto: Moto) -> None:
    """Against a working setup the bucket, Glue and Athena checks pass and come before the
    source's; the probe object is gone afterwards, the Glue database exists (created as
    sync would), and Athena saw SELECT 1 in the workgroup."""
    skippr.db.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
    flagship_config(skippr, ["orders"])
    skippr.env.update(moto.env)
    proc = skippr.run("discover", "--format", "json", check=False)
    assert_no_panic(proc)
    report = json.loads(proc.stdout)
    checks = report["checks"]
    assert [c["name"] for c in checks[:3]] == [
        f"sink bucket s3://{LAKE_BUCKET}/warehouse/",
        f"sink Glue database {GLUE_DB}",
        "sink Athena workgroup primary",
    ], checks
    assert all(c["ok"] for c in checks), json.dumps(checks, indent=1)
    assert proc.returncode == 0, describe_run(proc)
    assert [k for k in moto.keys(LAKE_BUCKET) if "probe" in k] == []
    assert moto.client("glue").get_database(Name=GLUE_DB)["Database"]["Name"] == GLUE_DB
    [q] = executions(moto)
    assert (q["Query"], q["WorkGroup"]) == ("SELECT 1", "primary")

    text = skippr.run("discover").stdout
    assert "[ ok ] sink bucket" in text and "Ready: every check passed." in text, text


def test_discover_names_a_missing_bucket_and_workgroup(skippr: Skippr, moto: Moto) -> None:
    """Without the warehouse bucket and with an unknown workgroup, both checks fail with the
    bucket or workgroup named and a fix; the Glue check still runs and passes; exit code 1."""
    skippr.db.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
    moto.client("s3").delete_bucket(Bucket=LAKE_BUCKET)
    flagship_config(skippr, ["orders"])
    text = skippr.config_path.read_text().replace("athena_workgroup_name: primary", "athena_workgroup_name: analysts")
    skippr.write_raw_config(text)
    skippr.env.update(moto.env)
    proc = skippr.run("discover", "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 1, describe_run(proc)
    bucket, glue, athena = sink_checks(json.loads(proc.stdout))
    assert not bucket["ok"] and bucket["detail"] == f"bucket `{LAKE_BUCKET}` does not exist", bucket
    assert f"aws s3 mb s3://{LAKE_BUCKET}" in bucket["fix"], bucket
    assert "data_sinks.lake.AthenaIceberg.warehouse" in bucket["fix"], bucket
    assert glue["ok"], glue
    assert not athena["ok"] and "workgroup `analysts`" in athena["detail"], athena
    assert "athena_workgroup_name" in athena["fix"], athena

    text = skippr.run("discover", check=False).stdout
    assert f"[FAIL] sink bucket s3://{LAKE_BUCKET}/warehouse/: bucket `{LAKE_BUCKET}` does not exist" in text, text
    assert "Not ready: 2 check(s) failed." in text, text


def test_engine_athena_needs_an_athena_sink(skippr: Skippr) -> None:
    """A LocalIceberg-only config: --engine athena is a configuration error that says what
    to do; --pipeline without --engine athena likewise."""
    skippr.write_config(["orders"])
    proc = skippr.run("query", "--engine", "athena", "SELECT 1", check=False)
    assert proc.returncode == 2, describe_run(proc)
    assert "--engine athena needs an AthenaIceberg data sink" in proc.stderr, describe_run(proc)
    proc = skippr.run("query", "--pipeline", "app", "SELECT 1", check=False)
    assert proc.returncode == 2, describe_run(proc)
    assert "--pipeline goes with --engine athena" in proc.stderr, describe_run(proc)
