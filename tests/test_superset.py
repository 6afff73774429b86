"""Apache Superset 6.1 through the gateway: the same Superset, pointed once at the source
Postgres and once at `skipprd serve` over the same table, must answer every step of the
workflow a person runs in its UI the same way (issue 45, item 4).

The source holds `orders` (3,000 orders over 60 days: a bigint key, a customer, a status, a
numeric(12,2) amount, a timestamptz and a date, with a few NULLs); `skipprd serve` serves it as
`analytics.orders`. tests/superset_probe.py runs Superset headless in one process, once for
the whole module, and drives its REST API for each database in turn: test and save the
connection, list schemas and tables, read the table's metadata, create, read and refresh a
dataset, run charts (a group-by with COUNT(*), SUM and AVG; time series by day, week and month
with a time range; a series limit; a filter's value list) and SQL Lab (the schema dropdown, a
query with a row limit, the table preview). Each test below is one step: the step must succeed
on Postgres (and give what the source holds), and the gateway's answer must equal Postgres's.
What legitimately differs (ids, database names, the schema `public` against `analytics`,
timings) is normalized by the probe; the comparison here is plain ==. When Superset cannot create
the dataset on the gateway, the probe runs the chart steps there on a copy of the Postgres
dataset (the failure message says so), so that a failed dataset does not hide what the charts do.

Day, week and month buckets depend on the session TimeZone. The gateway's sessions start in
UTC (docs/types.md), so the source database is set to UTC too: both sides bucket the same days.

Superset lives in a venv of its own (tests/requirements-superset.txt), which tests/run creates:
`$SKIPPR_SUPERSET_VENV`, by default ~/.cache/skippr/venv-superset.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, Database, _drop_database
from test_gateway_clients import Gateway, start_gateway

SUPERSET_VENV = Path(os.environ.get("SKIPPR_SUPERSET_VENV", Path.home() / ".cache" / "skippr" / "venv-superset"))
PROBE = REPO / "tests" / "superset_probe.py"
#: The probe's whole run: Superset's set-up (about 15 s) and both workflows.
PROBE_TIMEOUT_S = 900

WORKSPACE = "analytics"
TABLE = "orders"
SQLLAB_LIMIT = 25
SQLLAB_SQL = "SELECT id, customer_id, status, amount, created_at, created_on FROM orders ORDER BY id"
#: Superset's "Advanced" time range: start inclusive, end exclusive.
TIME_RANGE = "2024-03-10T00:00:00 : 2024-04-10T00:00:00"
RANGE_START = dt.datetime(2024, 3, 10, tzinfo=dt.timezone.utc)
RANGE_END = dt.datetime(2024, 4, 10, tzinfo=dt.timezone.utc)

ORDERS = r"""
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer_id integer NOT NULL,
    status text,
    amount numeric(12,2),
    created_at timestamptz NOT NULL,
    created_on date
);
-- statuses of different sizes (no ties in a top-N), an order every 28.8 minutes for 60 days
-- from 2024-03-01 UTC, a few NULL statuses, amounts and dates
INSERT INTO orders
SELECT i,
       1 + (i * 7919) % 50,
       CASE WHEN i % 100 = 99 THEN NULL
            WHEN i % 100 < 38 THEN 'delivered'
            WHEN i % 100 < 62 THEN 'shipped'
            WHEN i % 100 < 78 THEN 'paid'
            WHEN i % 100 < 89 THEN 'placed'
            WHEN i % 100 < 95 THEN 'returned'
            ELSE 'cancelled' END,
       CASE WHEN i % 53 = 0 THEN NULL ELSE round(5 + ((i * 3571) % 50000) / 100.0, 2) END,
       timestamptz '2024-03-01 00:00:00+00' + (i - 1) * interval '28 minutes 48 seconds'
           + ((i * 7919) % 1500) * interval '1 second',
       CASE WHEN i % 71 = 0 THEN NULL
            ELSE ((timestamptz '2024-03-01 00:00:00+00' + (i - 1) * interval '28 minutes 48 seconds')
                  AT TIME ZONE 'UTC')::date END
FROM generate_series(1, 3000) i;
"""

#: The workflow's steps, in the order the probe runs them.
STEPS = [
    "test_connection", "create_database", "schemas", "tables", "table_metadata", "table_metadata_extra",
    "create_dataset", "get_dataset", "refresh_dataset", "chart_groupby", "chart_timeseries_day",
    "chart_timeseries_week", "chart_timeseries_month", "chart_series_limit", "filter_values_status",
    "filter_values_customer_id", "sqllab_schema_dropdown", "sqllab_query", "sqllab_table_preview",
]

#: The steps that run on the dataset (after `create_dataset`).
DATASET_STEPS = STEPS[STEPS.index("get_dataset"):STEPS.index("filter_values_customer_id") + 1]


@dataclass
class SupersetRun:
    """What the probe printed, and where to look when a step differs."""

    out: dict[str, Any]
    source: Database
    gateway: Gateway
    probe_log: Path

    def step(self, database: str, name: str) -> dict[str, Any]:
        steps = self.out["databases"][database]["steps"]
        assert name in steps, f"the probe did not run step {name} on {database} (it ran {sorted(steps)})"
        return steps[name]

    def answer(self, database: str, name: str) -> Any:
        return self.step(database, name)["answer"]


@pytest.fixture(scope="module")
def superset(pg, tmp_path_factory) -> Iterator[SupersetRun]:
    python = SUPERSET_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"the Superset venv {SUPERSET_VENV} does not exist: run tests/run, which creates it "
                    "from tests/requirements-superset.txt (or set SKIPPR_SUPERSET_VENV)")
    name = "t_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        source = Database(pg, name)
        source.execute(ORDERS)
        pg.execute(f"ALTER DATABASE \"{name}\" SET TimeZone = 'UTC'")
        tmp = tmp_path_factory.mktemp("superset")
        workdir = tmp / "work"
        workdir.mkdir()
        with start_gateway(source, workdir, [TABLE], workspace=WORKSPACE) as gw:
            gw_auth = gw.user + (f":{gw.password}" if gw.password else "")
            spec = {
                "table": TABLE, "key": "id",
                "databases": {
                    "postgres": {"uri": f"postgresql+psycopg2://{pg.user}:{pg.password}@{pg.host}:{pg.port}/{name}",
                                 "schema": "public"},
                    "gateway": {"uri": f"postgresql+psycopg2://{gw_auth}@{gw.host}:{gw.port}/{gw.dbname}",
                                "schema": gw.schema,
                                # the gateway's own schema (skippr.tables): not in Postgres
                                "own_schemas": ["skippr"]},
                },
                "sqllab_sql": SQLLAB_SQL, "sqllab_limit": SQLLAB_LIMIT, "time_range": TIME_RANGE,
            }
            (tmp / "spec.json").write_text(json.dumps(spec, indent=1))
            log = tmp / "probe.log"
            t = time.monotonic()
            with open(log, "w") as logf:
                try:
                    proc = subprocess.run([str(python), str(PROBE), str(tmp / "spec.json"), str(tmp / "out.json")],
                                          stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          timeout=PROBE_TIMEOUT_S, cwd=tmp)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"the Superset probe did not finish within {PROBE_TIMEOUT_S}s\n{_tail(log)}")
            if proc.returncode != 0 or not (tmp / "out.json").exists():
                pytest.fail(f"the Superset probe exited {proc.returncode} (log {log}):\n{_tail(log)}\n"
                            f"--- gateway log ---\n{gw.log()[-4000:]}")
            out = json.loads((tmp / "out.json").read_text())
            out["probe_seconds"] = round(time.monotonic() - t, 1)
            yield SupersetRun(out=out, source=source, gateway=gw, probe_log=log)
    finally:
        _drop_database(pg, name)


def _tail(path: Path, n: int = 6000) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return text if len(text) <= n else "...(cut)...\n" + text[-n:]


# --------------------------------------------------------------------------------------------
# Checking one step
# --------------------------------------------------------------------------------------------


def _failures(answer: Any, where: str = "") -> list[str]:
    """Where an answer says the step failed: an HTTP error, a failed query, a step not run."""
    problems: list[str] = []
    if isinstance(answer, dict):
        for key in ("not_run", "probe_exception"):
            if key in answer:
                problems.append(f"{where}{key}: {answer[key]}")
        status = answer.get("status")
        if isinstance(status, int) and status >= 400:
            problems.append(f"{where}HTTP {status}: {json.dumps(answer.get('error'))[:1500]}")
        if status in ("failed", "error") or (isinstance(status, str) and answer.get("error")):
            problems.append(f"{where}query {status}: {answer.get('error')}")
        for k, v in answer.items():
            if k not in ("error", "data"):  # rows are the databases' data, not Superset's verdicts
                problems += _failures(v, f"{where}{k}.")
    elif isinstance(answer, list):
        for i, v in enumerate(answer):
            problems += _failures(v, f"{where}{i}.")
    return problems


def _sql_report(step: dict[str, Any], limit: int = 12) -> str:
    """The statements Superset sent during a step: the failed ones, and the last few."""
    sent = step.get("sql", [])
    failed = [s for s in sent if s.get("error")]
    lines = [f"{len(sent)} statements sent, {len(failed)} failed"]
    for s in failed[:limit]:
        lines.append(f"  FAILED: {s['error']}\n    SQL: {_indent(s['sql'])}")
    if not failed:
        for s in sent[-4:]:
            lines.append(f"  sent: {_indent(s['sql'])}")
    return "\n".join(lines)


def _indent(sql: str, n: int = 1500) -> str:
    sql = " ".join(sql.split()) if len(sql) > 200 else sql.strip()
    return sql if len(sql) <= n else sql[:n] + " ...(cut)"


def _dump(answer: Any, n: int = 4000) -> str:
    text = json.dumps(answer, indent=1, sort_keys=True, default=str)
    return text if len(text) <= n else text[:n] + "\n...(cut)"


def assert_step(run: SupersetRun, name: str) -> Any:
    """The step succeeded on Postgres, and the gateway answered exactly what Postgres did.
    Returns Postgres's answer for step-specific checks."""
    pg_step, gw_step = run.step("postgres", name), run.step("gateway", name)
    pg_answer, gw_answer = pg_step["answer"], gw_step["answer"]
    problems = _failures(pg_answer)
    assert not problems, (
        f"Superset step {name} failed against Postgres itself (a probe or set-up problem):\n"
        + "\n".join(problems) + f"\n--- SQL ---\n{_sql_report(pg_step)}\n--- answer ---\n{_dump(pg_answer)}")
    if gw_answer != pg_answer:
        pg_text = json.dumps(pg_answer, indent=1, sort_keys=True, default=str).splitlines()
        gw_text = json.dumps(gw_answer, indent=1, sort_keys=True, default=str).splitlines()
        diff = "\n".join(list(difflib.unified_diff(pg_text, gw_text, "postgres", "gateway", lineterm="", n=2))[:120])
        # how the gateway's dataset was made matters to the steps that use it
        notes = run.out["databases"]["gateway"].get("notes") or [] if name in DATASET_STEPS else []
        pytest.fail(
            f"Superset step {name}: the gateway's answer differs from Postgres's\n"
            + "".join(f"note: {n}\n" for n in notes)
            + ("gateway errors:\n  " + "\n  ".join(_failures(gw_answer)) + "\n" if _failures(gw_answer) else "")
            + f"--- diff (postgres -> gateway) ---\n{diff}\n"
            + f"--- SQL Superset sent to the gateway ---\n{_sql_report(gw_step)}\n"
            + f"--- postgres answer ---\n{_dump(pg_answer)}\n--- gateway answer ---\n{_dump(gw_answer)}",
            pytrace=False)
    return pg_answer


def source_rows(run: SupersetRun, sql: str, params: Any = None) -> list[tuple]:
    """The source's own answer (its sessions run in UTC, like the gateway's)."""
    return run.source.execute(sql, params)


def epoch_ms(ts: dt.datetime) -> float:
    return float(int(ts.timestamp() * 1000))


def chart_data(answer: dict[str, Any]) -> dict[str, Any]:
    results = answer["body"]["result"]
    assert len(results) == 1, results
    return results[0]


# --------------------------------------------------------------------------------------------
# The steps: connection, schemas, tables, metadata
# --------------------------------------------------------------------------------------------


def test_test_connection(superset):
    answer = assert_step(superset, "test_connection")
    assert answer == {"status": 200, "body": {"message": "OK"}}, answer


def test_create_database(superset):
    answer = assert_step(superset, "create_database")
    assert answer["status"] == 201, answer
    assert answer["body"]["result"]["parameters"]["database"] == "<catalog>", answer


def test_schemas(superset):
    answer = assert_step(superset, "schemas")
    assert "<schema>" in answer["body"]["result"], answer


def test_tables(superset):
    answer = assert_step(superset, "tables")
    assert [t["value"] for t in answer["body"]["result"]] == [TABLE], answer


def test_table_metadata(superset):
    answer = assert_step(superset, "table_metadata")
    columns = [(c["name"], c["longType"]) for c in answer["body"]["columns"]]
    assert columns == [("id", "BIGINT"), ("customer_id", "INTEGER"), ("status", "TEXT"),
                       ("amount", "NUMERIC(12, 2)"), ("created_at", "TIMESTAMP"), ("created_on", "DATE")], columns


def test_table_metadata_extra(superset):
    assert_step(superset, "table_metadata_extra")


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------


DATASET_COLUMNS = {
    "id": ("BIGINT", False), "customer_id": ("INTEGER", False), "status": ("TEXT", False),
    "amount": ("NUMERIC(12, 2)", False), "created_at": ("TIMESTAMP WITH TIME ZONE", True),
    "created_on": ("DATE", True),
}


def test_create_dataset(superset):
    answer = assert_step(superset, "create_dataset")
    assert answer["status"] == 201, answer


def test_get_dataset(superset):
    answer = assert_step(superset, "get_dataset")
    result = answer["body"]["result"]
    columns = {c["column_name"]: (c["type"], c["is_dttm"]) for c in result["columns"]}
    assert columns == DATASET_COLUMNS, columns
    assert result["main_dttm_col"] == "created_at", result


def test_refresh_dataset(superset):
    answer = assert_step(superset, "refresh_dataset")
    after = answer["dataset_after_refresh"]["body"]["result"]
    assert {c["column_name"]: (c["type"], c["is_dttm"]) for c in after["columns"]} == DATASET_COLUMNS, after


# --------------------------------------------------------------------------------------------
# Charts
# --------------------------------------------------------------------------------------------


def test_chart_groupby(superset):
    data = chart_data(assert_step(superset, "chart_groupby"))
    assert data["colnames"] == ["status", "count", "SUM(amount)", "AVG(amount)"], data["colnames"]
    expected = source_rows(superset, "SELECT status, count(*), sum(amount) FROM orders GROUP BY status ORDER BY 2 DESC")
    got = [(r["status"], r["count"], r["SUM(amount)"]) for r in data["data"]]
    assert got == [(s, n, float(total)) for s, n, total in expected], got


def _assert_daily_counts(superset: SupersetRun, data: dict[str, Any], column: str, trunc: str) -> None:
    expected = source_rows(superset, f"""
        SELECT date_trunc('{trunc}', {column})::timestamp AT TIME ZONE 'UTC', count(*) FROM orders
        WHERE {column} >= %s AND {column} < %s GROUP BY 1 ORDER BY 1""", (RANGE_START, RANGE_END))
    got = [(r[column], r["count"]) for r in data["data"]]
    assert got == [(epoch_ms(ts), float(n)) for ts, n in expected], got


def test_chart_timeseries_day(superset):
    data = chart_data(assert_step(superset, "chart_timeseries_day"))
    assert "DATE_TRUNC('day', created_at)" in data["query"], data["query"]
    _assert_daily_counts(superset, data, "created_at", "day")


def test_chart_timeseries_week(superset):
    data = chart_data(assert_step(superset, "chart_timeseries_week"))
    assert "DATE_TRUNC('week', created_on)" in data["query"], data["query"]
    _assert_daily_counts(superset, data, "created_on", "week")


def test_chart_timeseries_month(superset):
    data = chart_data(assert_step(superset, "chart_timeseries_month"))
    assert "DATE_TRUNC('month', created_at)" in data["query"], data["query"]
    _assert_daily_counts(superset, data, "created_at", "month")


def test_chart_series_limit(superset):
    data = chart_data(assert_step(superset, "chart_series_limit"))
    top3 = source_rows(superset, """
        SELECT status FROM orders WHERE created_at >= %s AND created_at < %s
        GROUP BY status ORDER BY count(*) DESC LIMIT 3""", (RANGE_START, RANGE_END))
    assert data["colnames"] == ["created_at", *sorted(s for (s,) in top3)], data["colnames"]


def test_filter_values_status(superset):
    answer = assert_step(superset, "filter_values_status")
    expected = [s for (s,) in source_rows(superset, "SELECT DISTINCT status FROM orders")]
    assert sorted(answer["body"]["result"], key=str) == sorted(expected, key=str), answer


def test_filter_values_customer_id(superset):
    answer = assert_step(superset, "filter_values_customer_id")
    expected = [c for (c,) in source_rows(superset, "SELECT DISTINCT customer_id FROM orders")]
    assert sorted(answer["body"]["result"]) == sorted(expected), answer


# --------------------------------------------------------------------------------------------
# SQL Lab
# --------------------------------------------------------------------------------------------


def test_sqllab_schema_dropdown(superset):
    answer = assert_step(superset, "sqllab_schema_dropdown")
    assert "<schema>" in answer["body"]["result"], answer


def _as_sqllab_shows(row: tuple) -> dict[str, Any]:
    """A source row as SQL Lab's JSON shows it: numerics as numbers, times in ISO format."""
    id_, customer_id, status, amount, created_at, created_on = row
    return {"id": id_, "customer_id": customer_id, "status": status,
            "amount": float(amount) if amount is not None else None,
            "created_at": created_at.astimezone(dt.timezone.utc).isoformat(),
            "created_on": created_on.isoformat() if created_on is not None else None}


def test_sqllab_query(superset):
    body = assert_step(superset, "sqllab_query")["body"]
    assert body["query"]["limit"] == SQLLAB_LIMIT and body["query"]["rows"] == SQLLAB_LIMIT, body["query"]
    expected = [_as_sqllab_shows(r) for r in source_rows(superset, SQLLAB_SQL + f" LIMIT {SQLLAB_LIMIT}")]
    assert body["data"] == expected, body["data"][:3]


def test_sqllab_table_preview(superset):
    answer = assert_step(superset, "sqllab_table_preview")
    assert answer["select_star"]["body"]["result"].startswith("SELECT\n  *\nFROM <schema>.orders"), answer
    preview = answer["preview"]["body"]
    total = source_rows(superset, "SELECT count(*) FROM orders")[0][0]
    assert preview["rowcount"] == preview["distinct_keys"] > 0, preview
    assert preview["rowcount"] <= total and preview["rows_not_in_table"] == [], preview


def test_every_step_is_tested(superset):
    """The probe ran exactly the steps this module checks, on both databases."""
    for database in ("postgres", "gateway"):
        assert sorted(superset.out["databases"][database]["steps"]) == sorted(STEPS), database
