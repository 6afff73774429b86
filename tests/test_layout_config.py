"""The per-table layout in skippr.yml (`pipelines.<p>.tables.<table>.partition_by` and
`sort_by`), the configuration side: `validate` refuses a malformed entry or an unknown table
at its line; `discover` prints the layout each table gets and refuses an unknown column or a
transform that does not fit the column's type, naming the line and the fix; `sync` refuses
the same before it writes anything; `connect pipeline` writes the keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import Skippr, assert_no_panic, describe_run, render_config, run_skipprd

SETUP = """
CREATE SCHEMA sales;
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer_id integer NOT NULL,
    created_at timestamptz NOT NULL,
    note text
);
CREATE TABLE sales.customers (id bigint PRIMARY KEY, name text, since date);
"""

# The issue's form, verbatim: a flow list whose second entry YAML splits at its comma.
ISSUE_LAYOUT = """\
    tables:
      orders:
        partition_by: [day(created_at), bucket(16, customer_id)]
        sort_by: [created_at]
"""

ERROR_RE = re.compile(r"^error: (?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<field>[^:\s]+): (?P<msg>.+)$")


def with_tables(text: str, tables: str) -> str:
    anchor = "    data_sink: data_sinks.lake\n"
    assert anchor in text
    return text.replace(anchor, anchor + tables, 1)


def line_of(text: str, needle: str) -> int:
    """1-based number of the first line containing `needle`."""
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in:\n{text}")


def offline_config(workdir: Path, tables: str) -> tuple[Path, str]:
    text = with_tables(
        render_config(host="127.0.0.1", port=1, user="u", database="app",
                      tables=["orders", "sales.customers"], password="x"),
        tables,
    )
    path = workdir / "skippr.yml"
    path.write_text(text)
    return path, text


def write_layout(skippr: Skippr, tables: str) -> str:
    skippr.write_config(["orders", "sales.customers"])
    text = with_tables(skippr.config_path.read_text(), tables)
    skippr.write_raw_config(text)
    return text


# --------------------------------------------------------------------------------------------
# validate: the file alone
# --------------------------------------------------------------------------------------------


def test_validate_accepts_the_issue_layout(workdir):
    path, _ = offline_config(workdir, ISSUE_LAYOUT)
    proc = run_skipprd("--config", str(path), "validate", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc)


def test_validate_refuses_a_bad_transform_and_an_unknown_table_with_their_lines(workdir):
    path, text = offline_config(
        workdir,
        "    tables:\n"
        "      orders:\n"
        "        partition_by: [day(created_at), weekly(created_at)]\n"
        "        sort_by:\n"
        "          - created_at sideways\n"
        "      invoices:\n"
        "        partition_by: [id]\n",
    )
    proc = run_skipprd("--config", str(path), "validate", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 2, describe_run(proc, "a bad layout is a configuration error")
    errors = [m for m in map(ERROR_RE.match, proc.stderr.splitlines()) if m]
    by_field = {m["field"]: m for m in errors}
    assert set(by_field) == {
        "pipelines.app.tables.orders.partition_by[1]",
        "pipelines.app.tables.orders.sort_by[0]",
        "pipelines.app.tables.invoices",
    }, describe_run(proc)

    bad = by_field["pipelines.app.tables.orders.partition_by[1]"]
    assert bad["file"] == str(path)
    assert int(bad["line"]) == line_of(text, "weekly(created_at)")
    assert int(bad["col"]) == text.splitlines()[int(bad["line"]) - 1].index("weekly") + 1
    assert "`weekly` is not a transform" in bad["msg"] and "bucket(N, c)" in bad["msg"], bad["msg"]

    sort = by_field["pipelines.app.tables.orders.sort_by[0]"]
    assert int(sort["line"]) == line_of(text, "created_at sideways")
    assert "[asc|desc] [nulls first|last]" in sort["msg"], sort["msg"]

    unknown = by_field["pipelines.app.tables.invoices"]
    assert int(unknown["line"]) == line_of(text, "invoices:")
    assert "orders, sales.customers" in unknown["msg"], unknown["msg"]
    assert "data_sources.app_db.Postgres.tables" in unknown["msg"], unknown["msg"]


# --------------------------------------------------------------------------------------------
# discover: against the table's columns
# --------------------------------------------------------------------------------------------


def test_discover_prints_the_layout_each_table_gets(skippr: Skippr, db):
    db.execute(SETUP)
    write_layout(skippr, ISSUE_LAYOUT)
    proc = skippr.run("discover", "--pipeline", "app", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 0, describe_run(proc)
    out = proc.stdout
    assert "\nLayout\n" in out, describe_run(proc)
    assert "  orders: partitioned by day(created_at), bucket(16, customer_id); sorted by created_at\n" in out, \
        describe_run(proc)
    assert "  sales.customers: unpartitioned\n" in out, describe_run(proc)
    # The rest of the report is as before: per-table blocks, then the checks.
    assert out.index("public.orders -> ") < out.index("\nLayout\n") < out.index("\nChecks\n"), out

    proc = skippr.run("discover", "--pipeline", "app", "--format", "json", check=False)
    assert proc.returncode == 0, describe_run(proc)
    tables = {t["name"]: t for t in json.loads(proc.stdout)["tables"]}
    assert tables["orders"]["layout"] == \
        "partitioned by day(created_at), bucket(16, customer_id); sorted by created_at"
    assert tables["customers"]["layout"] == "unpartitioned"


def test_discover_refuses_an_unknown_column_and_a_day_of_text_naming_the_fix(skippr: Skippr, db):
    db.execute(SETUP)
    text = write_layout(
        skippr,
        "    tables:\n"
        "      orders:\n"
        "        partition_by:\n"
        "          - day(note)\n"
        "          - bucket(8, customer)\n",
    )
    day_line = line_of(text, "day(note)")
    unknown_line = line_of(text, "bucket(8, customer)")

    proc = skippr.run("discover", "--pipeline", "app", "--format", "json", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 1, describe_run(proc, "a layout that does not fit is a failed check")
    doc = json.loads(proc.stdout)
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == ["layout of public.orders"] * 2, failed
    day, unknown = failed

    config = str(skippr.config_path)
    assert day["detail"].startswith(f"{config}:{day_line}:"), day
    assert "pipelines.app.tables.orders.partition_by[0]" in day["detail"], day
    assert "`day(note)` does not fit public.orders.note (string)" in day["detail"], day
    assert "date or timestamp" in day["detail"], day
    assert f"line {day_line}" in day["fix"], day
    # What fits the text column, and the column the transform fits.
    for fits in ("`bucket(16, note)`", "`truncate(4, note)`", "`day(created_at)`"):
        assert fits in day["fix"], day

    assert unknown["detail"].startswith(f"{config}:{unknown_line}:"), unknown
    assert "`customer`" in unknown["detail"], unknown
    assert "id, customer_id, created_at, note" in unknown["detail"], unknown
    assert f"line {unknown_line}" in unknown["fix"], unknown
    assert "perhaps `customer_id`" in unknown["fix"], unknown

    proc = skippr.run("discover", "--pipeline", "app", check=False)
    assert proc.returncode == 1, describe_run(proc)
    assert "[FAIL] layout of public.orders: " in proc.stdout, describe_run(proc)
    assert "fix: in " in proc.stdout and "`bucket(16, note)`" in proc.stdout, describe_run(proc)
    # discover still prints what the table would get.
    assert "  orders: partitioned by day(note), bucket(8, customer)\n" in proc.stdout, describe_run(proc)


def test_sync_refuses_a_layout_that_does_not_fit_before_writing_anything(skippr: Skippr, db):
    db.execute(SETUP)
    text = write_layout(skippr, "    tables:\n      orders:\n        sort_by: [created]\n")
    proc = skippr.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(proc)
    assert proc.returncode == 2, describe_run(proc, "a layout that does not fit is a configuration error")
    assert f"{skippr.config_path}:{line_of(text, 'created]')}:" in proc.stderr, describe_run(proc)
    assert "`created`" in proc.stderr and "nothing was written" in proc.stderr, describe_run(proc)
    assert not skippr.warehouse.exists() or not any(skippr.warehouse.rglob("*.parquet")), \
        "a refused sync wrote data files"
    # Only the run's status (what `skipprd status` shows) is recorded: no state, no WAL.
    written = [p.name for p in (skippr.workdir / ".skippr").rglob("*") if p.is_file()]
    assert written in ([], ["app.status.json"]), f"a refused sync wrote {written}"
    slots = db.scalar("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")
    assert slots == 0, "a refused sync created a replication slot"


# --------------------------------------------------------------------------------------------
# connect pipeline
# --------------------------------------------------------------------------------------------


def test_connect_pipeline_writes_the_layout_keys(workdir):
    config = workdir / "skippr.yml"

    def connect(*args: str):
        proc = run_skipprd("--config", str(config), *args, check=False, cwd=workdir)
        assert_no_panic(proc)
        return proc

    for args in (
        ["--workspace", "analytics", "connect", "data-source", "postgres", "--pipeline", "app",
         "--name", "app_db", "--host", "127.0.0.1", "--user", "u", "--database", "app",
         "--tables", "orders", "--tables", "customers"],
        ["connect", "data-sink", "localiceberg", "--pipeline", "app", "--name", "lake",
         "--warehouse", "./warehouse"],
        ["connect", "pipeline", "--pipeline", "app", "--partition-by", "orders=day(created_at)",
         "--partition-by", "orders=bucket(16, customer_id)", "--sort-by", "orders=created_at"],
    ):
        proc = connect(*args)
        assert proc.returncode == 0, describe_run(proc)
    written = config.read_text()
    assert ("    data_sink: data_sinks.lake\n    tables:\n      orders:\n"
            "        partition_by: ['day(created_at)', 'bucket(16, customer_id)']\n"
            "        sort_by: [created_at]\n") in written, written
    proc = run_skipprd("--config", str(config), "validate", check=False)
    assert proc.returncode == 0, describe_run(proc)

    for args, message in (
        (["--partition-by", "orders=week(created_at)"], "`week` is not a transform"),
        (["--partition-by", "invoices=id"], "not one of the tables data source `app_db` follows (orders, customers)"),
        (["--sort-by", "created_at"], "TABLE=ENTRY"),
    ):
        proc = connect("connect", "pipeline", "--pipeline", "app", *args)
        assert proc.returncode == 2, describe_run(proc)
        assert message in proc.stderr, describe_run(proc)
    assert config.read_text() == written, "a refused connect changed the file"
