"""skippr.yml loading and `skipprd validate`: every bad-config case exits 2 with one
`error: <file>:<line>:<column>: <field.path>: <message>` line per problem, names what is
allowed, never panics and never prints an environment value."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from conftest import assert_no_panic, describe_run, run_skipprd

SECRET = "pw-Zq8v-never-print-me"

# The embedded example config, line by line (line numbers below are 1-based).
BASE_LINES = [
    "skippr:",                                    # 1
    "  workspace: analytics",                     # 2
    "  skipprd_el_storage_mode: local",           # 3
    "pipelines:",                                 # 4
    "  app:",                                     # 5
    "    data_source: data_sources.app_db",       # 6
    "    data_sink: data_sinks.lake",             # 7
    "data_sources:",                              # 8
    "  app_db:",                                  # 9
    "    Postgres:",                              # 10
    "      host: 127.0.0.1",                      # 11
    "      port: 5432",                           # 12
    "      user: skippr_reader",                  # 13
    "      password: ${APP_DB_PASSWORD}",         # 14
    "      database: app",                        # 15
    "      tables: [orders, customers]",          # 16
    "      cdc_mode: snapshot_then_cdc",          # 17
    "data_sinks:",                                # 18
    "  lake:",                                    # 19
    "    LocalIceberg:",                          # 20
    "      warehouse: ./warehouse",               # 21
]

ATHENA_FIELDS = [
    "warehouse: s3://lake-bucket/warehouse",
    "glue_database_name: analytics",
    "athena_workgroup_name: primary",
    "athena_results_s3_bucket: s3://lake-bucket/athena-results",
    "region: eu-west-1",
]

ERROR_RE = re.compile(r"^error: (?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<field>[^:\s]+): (?P<msg>.+)$")


def config_text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def replace_line(lineno: int, new: str) -> list[str]:
    lines = list(BASE_LINES)
    lines[lineno - 1] = new
    return lines


def insert_after(lineno: int, new: str) -> list[str]:
    lines = list(BASE_LINES)
    lines.insert(lineno, new)
    return lines


def col_of(line: str, token: str) -> int:
    return line.index(token) + 1


def run_validate(workdir: Path, text: str, env: dict | None = None, args: tuple = ("validate",)):
    cfg = workdir / "skippr.yml"
    cfg.write_text(text)
    env = {"APP_DB_PASSWORD": SECRET, **(env or {})}
    proc = run_skipprd("--config", str(cfg), *args, cwd=workdir, env=env, check=False, timeout=60)
    assert_no_panic(proc)
    for secret in [v for v in env.values() if v and (v == SECRET or "secret" in v.lower())]:
        assert secret not in proc.stdout + proc.stderr, describe_run(proc, "printed an environment value")
    return cfg, proc


def error_lines(proc) -> list[re.Match]:
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    return [ERROR_RE.match(l) or l for l in lines]


def assert_config_error(proc, cfg: Path, *, line: int, cols: set[int] | None, field_prefix: str | None,
                        msg_contains: list[str], count: int = 1) -> re.Match:
    assert proc.returncode == 2, describe_run(proc, f"exited {proc.returncode}, expected 2")
    errs = error_lines(proc)
    assert len(errs) == count, describe_run(proc, f"expected {count} error line(s), got {len(errs)}")
    bad = [e for e in errs if not isinstance(e, re.Match)]
    assert not bad, describe_run(proc, f"error lines not of the form error: <file>:<line>:<col>: <field>: <msg>: {bad}")
    match = [e for e in errs if int(e["line"]) == line]
    assert match, describe_run(proc, f"no error reported at line {line}")
    m = match[0]
    assert m["file"] == str(cfg), describe_run(proc, f"error names file {m['file']!r}, not {cfg}")
    if cols is not None:
        assert int(m["col"]) in cols, describe_run(proc, f"column {m['col']} not in {sorted(cols)}")
    if field_prefix is not None:
        assert m["field"].startswith(field_prefix), describe_run(proc, f"field path {m['field']!r} is not {field_prefix}...")
    msg = m["msg"].replace("`", "").replace("'", "").replace('"', "")
    for want in msg_contains:
        assert want in msg, describe_run(proc, f"message {m['msg']!r} does not mention {want!r}")
    return m


# --------------------------------------------------------------------------------------------
# Good configs
# --------------------------------------------------------------------------------------------


def test_help_lists_the_subcommands():
    proc = run_skipprd("--help", check=False, timeout=60)
    assert proc.returncode == 0, describe_run(proc)
    for sub in ("validate", "discover", "sync", "query"):
        assert sub in proc.stdout, describe_run(proc, f"--help does not list {sub}")


def test_validate_good_config_does_not_connect(workdir):
    # a listening socket stands in for Postgres: validate must not even connect to it
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        cfg, proc = run_validate(workdir, config_text(replace_line(12, f"      port: {port}")))
        assert proc.returncode == 0, describe_run(proc, "validate rejected a good config")
        try:
            conn, _ = listener.accept()
            conn.close()
            connected = True
        except BlockingIOError:
            connected = False
    assert not connected, "validate connected to the database"
    assert re.search(r"\bok\b", proc.stdout, re.IGNORECASE), describe_run(proc, "validate did not print ok")
    assert "app" in proc.stdout, describe_run(proc, "validate's summary does not mention the pipeline")


def test_validate_with_unreachable_host_still_ok(workdir):
    # port 1 on loopback: nothing listens there
    cfg, proc = run_validate(workdir, config_text(replace_line(12, "      port: 1")))
    assert proc.returncode == 0, describe_run(proc)


def test_config_flag_after_subcommand_and_default_path(workdir):
    cfg = workdir / "skippr.yml"
    cfg.write_text(config_text(BASE_LINES))
    env = {"APP_DB_PASSWORD": SECRET}
    after = run_skipprd("validate", "--config", str(cfg), cwd=workdir, env=env, check=False, timeout=60)
    assert after.returncode == 0, describe_run(after, "--config after the subcommand")
    default = run_skipprd("validate", cwd=workdir, env=env, check=False, timeout=60)
    assert default.returncode == 0, describe_run(default, "default ./skippr.yml")


def test_optional_postgres_keys_are_accepted(workdir):
    lines = insert_after(17, "      snapshot_parallelism: 4")
    lines.insert(18, "      parquet_target_file_size_mb: 128")
    cfg, proc = run_validate(workdir, config_text(lines))
    assert proc.returncode == 0, describe_run(proc)


@pytest.mark.parametrize("mode", ["snapshot_then_cdc", "cdc_only", "snapshot_only"])
def test_every_cdc_mode_is_accepted(workdir, mode):
    cfg, proc = run_validate(workdir, config_text(replace_line(17, f"      cdc_mode: {mode}")))
    assert proc.returncode == 0, describe_run(proc)


def test_port_defaults_to_5432(workdir):
    lines = list(BASE_LINES)
    del lines[11]
    cfg, proc = run_validate(workdir, config_text(lines))
    assert proc.returncode == 0, describe_run(proc)


def athena_lines(drop: str | None = None) -> list[str]:
    lines = BASE_LINES[:18] + [
        "  lake:",
        "    AthenaIceberg:",
        *[f"      {f}" for f in ATHENA_FIELDS if drop is None or not f.startswith(drop + ":")],
        "    schema_sink: schema_sinks.lake_schema",
        "schema_sinks:",
        "  lake_schema:",
        "    AthenaIceberg:",
        *[f"      {f}" for f in ATHENA_FIELDS],
    ]
    return lines


def test_athena_iceberg_sink_with_schema_sink_is_valid(workdir):
    cfg, proc = run_validate(workdir, config_text(athena_lines()))
    assert proc.returncode == 0, describe_run(proc)


def test_athena_sink_missing_field_names_it(workdir):
    lines = athena_lines(drop="region")
    cfg, proc = run_validate(workdir, config_text(lines))
    assert proc.returncode == 2, describe_run(proc)
    errs = error_lines(proc)
    assert errs and all(isinstance(e, re.Match) for e in errs), describe_run(proc)
    assert any("region" in e["msg"] for e in errs), describe_run(proc, "does not name the missing field")
    assert all(19 <= int(e["line"]) <= 26 for e in errs), describe_run(proc, "points outside the sink")


def test_dangling_schema_sink_reference(workdir):
    lines = athena_lines()
    idx = lines.index("    schema_sink: schema_sinks.lake_schema")
    lines[idx] = "    schema_sink: schema_sinks.nope"
    cfg, proc = run_validate(workdir, config_text(lines))
    assert_config_error(proc, cfg, line=idx + 1, cols=None, field_prefix="data_sinks.lake",
                        msg_contains=["schema_sinks.nope", "lake_schema"])


# --------------------------------------------------------------------------------------------
# Bad configs: one case per kind of mistake
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines,line,field_prefix,msg",
    [
        (insert_after(17, "      foo: 1"), 18, "data_sources.app_db.Postgres",
         ["unknown field foo", "expected one of", "host", "cdc_mode"]),
        (replace_line(2, "  worksapce: analytics"), 2, "skippr",
         ["unknown field worksapce", "workspace"]),
        (BASE_LINES + ["extra_top: 1"], 22, None, ["unknown field extra_top", "pipelines", "data_sources"]),
        (insert_after(7, "    data_sinc: data_sinks.lake"), 8, "pipelines.app",
         ["unknown field data_sinc", "data_sink"]),
    ],
    ids=["postgres-key", "skippr-key", "top-level-key", "pipeline-key"],
)
def test_unknown_key(workdir, lines, line, field_prefix, msg):
    cfg, proc = run_validate(workdir, config_text(lines))
    key_line = lines[line - 1]
    key = key_line.strip().split(":")[0]
    assert_config_error(proc, cfg, line=line, cols={col_of(key_line, key)}, field_prefix=field_prefix,
                        msg_contains=msg)


@pytest.mark.parametrize(
    "lineno,new,token,field,msg",
    [
        (12, '      port: "abc"', '"abc"', "data_sources.app_db.Postgres.port", ["abc"]),
        (12, "      port: 99999", "99999", "data_sources.app_db.Postgres.port", ["99999"]),
        (16, "      tables: {orders: 1}", "{orders", "data_sources.app_db.Postgres.tables", []),
    ],
    ids=["port-string", "port-out-of-range", "tables-map"],
)
def test_wrong_type(workdir, lineno, new, token, field, msg):
    lines = replace_line(lineno, new)
    cfg, proc = run_validate(workdir, config_text(lines))
    key = new.strip().split(":")[0]
    assert_config_error(proc, cfg, line=lineno, cols={col_of(new, key), col_of(new, token)},
                        field_prefix=field, msg_contains=msg)


def test_wrong_type_for_optional_int(workdir):
    new = "      snapshot_parallelism: many"
    lines = insert_after(17, new)
    cfg, proc = run_validate(workdir, config_text(lines))
    assert_config_error(proc, cfg, line=18, cols={col_of(new, "snapshot_parallelism"), col_of(new, "many")},
                        field_prefix="data_sources.app_db.Postgres.snapshot_parallelism", msg_contains=["many"])


def test_bad_enum_value(workdir):
    new = "      cdc_mode: snapshot_and_cdc"
    cfg, proc = run_validate(workdir, config_text(replace_line(17, new)))
    assert_config_error(proc, cfg, line=17, cols={col_of(new, "cdc_mode"), col_of(new, "snapshot_and_cdc")},
                        field_prefix="data_sources.app_db.Postgres.cdc_mode",
                        msg_contains=["snapshot_and_cdc", "expected one of",
                                      "snapshot_then_cdc", "cdc_only", "snapshot_only"])


def test_bad_sink_kind(workdir):
    new = "    LocalIcebreg:"
    cfg, proc = run_validate(workdir, config_text(replace_line(20, new)))
    assert_config_error(proc, cfg, line=20, cols=None, field_prefix="data_sinks.lake",
                        msg_contains=["LocalIcebreg", "LocalIceberg", "AthenaIceberg"])


@pytest.mark.parametrize("command", [
    ("validate",),
    ("discover", "--pipeline", "app"),
    ("sync", "--pipeline", "app", "--once"),
    ("query", "SELECT 1"),
])
def test_every_command_reports_config_errors(workdir, command):
    new = "      cdc_mode: sometimes"
    cfg, proc = run_validate(workdir, config_text(replace_line(17, new)), args=command)
    assert_config_error(proc, cfg, line=17, cols=None, field_prefix="data_sources.app_db.Postgres.cdc_mode",
                        msg_contains=["sometimes", "snapshot_then_cdc"])


def test_dangling_source_reference(workdir):
    new = "    data_source: data_sources.nope"
    cfg, proc = run_validate(workdir, config_text(replace_line(6, new)))
    assert_config_error(proc, cfg, line=6, cols={col_of(new, "data_source"), col_of(new, "data_sources.nope")},
                        field_prefix="pipelines.app.data_source", msg_contains=["data_sources.nope", "app_db"])


def test_dangling_references_are_all_reported(workdir):
    lines = replace_line(6, "    data_source: data_sources.nope")
    lines[6] = "    data_sink: data_sinks.nowhere"
    cfg, proc = run_validate(workdir, config_text(lines))
    assert_config_error(proc, cfg, line=6, cols=None, field_prefix="pipelines.app.data_source",
                        msg_contains=["data_sources.nope", "app_db"], count=2)
    assert_config_error(proc, cfg, line=7, cols=None, field_prefix="pipelines.app.data_sink",
                        msg_contains=["data_sinks.nowhere", "lake"], count=2)


def test_every_problem_is_reported_at_once(workdir):
    # three unrelated mistakes: a user fixes them in one go, not one run at a time
    lines = replace_line(6, "    data_source: data_sources.nope")
    lines[11] = '      port: "abc"'
    lines[16] = "      cdc_mode: snapshot_and_cdc"
    cfg, proc = run_validate(workdir, config_text(lines))
    assert proc.returncode == 2, describe_run(proc)
    errs = error_lines(proc)
    assert all(isinstance(e, re.Match) for e in errs), describe_run(proc)
    assert sorted(int(e["line"]) for e in errs) == [6, 12, 17], \
        describe_run(proc, "expected one error line for each of lines 6, 12 and 17")


def test_reference_to_the_wrong_section(workdir):
    new = "    data_source: data_sinks.lake"
    cfg, proc = run_validate(workdir, config_text(replace_line(6, new)))
    assert_config_error(proc, cfg, line=6, cols=None, field_prefix="pipelines.app.data_source",
                        msg_contains=["data_sinks.lake"])


def test_missing_environment_variable(workdir):
    # another variable is set and used: its value must not be printed either
    other_secret = "secret-user-value-7731"
    lines = replace_line(13, "      user: ${DB_USER_SECRET}")
    cfg = workdir / "skippr.yml"
    cfg.write_text(config_text(lines))
    proc = run_skipprd("--config", str(cfg), "validate", cwd=workdir,
                       env={"APP_DB_PASSWORD": None, "DB_USER_SECRET": other_secret}, check=False, timeout=60)
    assert_no_panic(proc)
    assert other_secret not in proc.stdout + proc.stderr, describe_run(proc, "printed an environment value")
    new = BASE_LINES[13]
    assert_config_error(proc, cfg, line=14, cols={col_of(new, "password"), col_of(new, "${")},
                        field_prefix="data_sources.app_db.Postgres.password", msg_contains=["APP_DB_PASSWORD"])


def test_set_environment_variable_resolves_and_is_not_printed(workdir):
    cfg, proc = run_validate(workdir, config_text(BASE_LINES))
    assert proc.returncode == 0, describe_run(proc)
    assert SECRET not in proc.stdout + proc.stderr


def test_yaml_syntax_error(workdir):
    new = "      user: a: b"
    cfg, proc = run_validate(workdir, config_text(replace_line(13, new)))
    assert proc.returncode == 2, describe_run(proc)
    errs = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1, describe_run(proc, "expected one error line")
    assert re.match(rf"^error: {re.escape(str(cfg))}:13:\d+: .+", errs[0]), \
        describe_run(proc, "syntax error not reported at line 13")


def test_yaml_bad_indentation(workdir):
    lines = list(BASE_LINES)
    lines[14] = "     database: app"    # one space short
    cfg, proc = run_validate(workdir, config_text(lines))
    assert proc.returncode == 2, describe_run(proc)
    errs = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert errs and re.match(rf"^error: {re.escape(str(cfg))}:1[45]:\d+: .+", errs[0]), describe_run(proc)


def test_empty_config_file(workdir):
    cfg, proc = run_validate(workdir, "")
    assert proc.returncode == 2, describe_run(proc)
    assert any(l.startswith("error:") for l in proc.stderr.splitlines()), describe_run(proc)


def test_missing_config_file(workdir):
    missing = workdir / "nope.yml"
    proc = run_skipprd("--config", str(missing), "validate", cwd=workdir, check=False, timeout=60)
    assert_no_panic(proc)
    assert proc.returncode == 2, describe_run(proc)
    assert str(missing) in proc.stderr, describe_run(proc, "error does not name the file")


def test_unknown_pipeline_is_named(workdir):
    cfg = workdir / "skippr.yml"
    cfg.write_text(config_text(BASE_LINES))
    proc = run_skipprd("--config", str(cfg), "sync", "--pipeline", "nope", "--once", cwd=workdir,
                       env={"APP_DB_PASSWORD": SECRET}, check=False, timeout=60)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc)
    assert "nope" in proc.stderr and "app" in proc.stderr, describe_run(proc, "does not name the pipeline and the defined ones")


@pytest.mark.parametrize(
    "extra,line,field_prefix,msg",
    [
        (["  query:", "    listen: localhost-5433"], 5, "skippr.query.listen",
         ["localhost-5433", "not an address", "host:port"]),
        (["  metrics:", "    listen: 127.0.0.1"], 5, "skippr.metrics.listen", ["not an address"]),
        (["  query:", "    listen: 127.0.0.1:5433", "    users:", "      - name: analyst",
          "        password: ''"], 8, "skippr.query.users[0].password", ["analyst", "non-empty password"]),
        (["  query:", "    listen: 0.0.0.0:5433", "    users:", "      - name: a", "        password: x",
          "      - name: a", "        password: y"], 9, "skippr.query.users[1].name", ["listed twice"]),
        (["  query:", "    tls:", "      cert: server.crt"], 5, "skippr.query.tls",
         ["missing required field key"]),
        (["  query:", "    target_partitions: 0"], 5, "skippr.query.target_partitions",
         ["0 is not between 1 and 1024"]),
    ],
    ids=["query-listen", "metrics-listen", "empty-password", "duplicate-user", "tls-without-key",
         "target-partitions"],
)
def test_gateway_settings_errors(workdir, extra, line, field_prefix, msg):
    lines = BASE_LINES[:3] + extra + BASE_LINES[3:]
    cfg, proc = run_validate(workdir, config_text(lines))
    assert_config_error(proc, cfg, line=line, cols=None, field_prefix=field_prefix, msg_contains=msg)


# --------------------------------------------------------------------------------------------
# Iceberg REST catalog sinks
# --------------------------------------------------------------------------------------------

REST_SINK = [
    "    RestIceberg:",                                          # 20
    "      uri: https://catalog.example.com/api/catalog",       # 21
    "      warehouse: analytics_wh",                            # 22
    "      credential: ${CLIENT_ID}:${CLIENT_SECRET}",          # 23
    "      scope: PRINCIPAL_ROLE:ALL",                          # 24
    "      properties:",                                        # 25
    "        s3.endpoint: http://127.0.0.1:9000",               # 26
    "        s3.path-style-access: true",                       # 27
]
REST_ENV = {"CLIENT_ID": "skippr", "CLIENT_SECRET": "secret-Cs-7f3a", "CATALOG_TOKEN": "secret-Tk-91c2"}


def rest_lines(sink: list[str] | None = None, more: list[str] = ()) -> list[str]:
    return BASE_LINES[:19] + (REST_SINK if sink is None else sink) + list(more)


def rest_replace(lineno: int, new: str | None) -> list[str]:
    lines = rest_lines()
    if new is None:
        del lines[lineno - 1]
    else:
        lines[lineno - 1] = new
    return lines


def test_rest_catalog_sink_is_valid_and_named_without_secrets(workdir):
    cfg, proc = run_validate(workdir, config_text(rest_lines()), env=REST_ENV)
    assert proc.returncode == 0, describe_run(proc)
    assert "lake (RestIceberg at https://catalog.example.com/api/catalog, warehouse analytics_wh)" in proc.stdout, \
        describe_run(proc)


@pytest.mark.parametrize("sink,summary", [
    (["    S3TablesIceberg:", "      table_bucket_arn: arn:aws:s3tables:us-east-1:111122223333:bucket/analytics",
      "      region: us-east-1"],
     "lake (S3TablesIceberg at https://s3tables.us-east-1.amazonaws.com/iceberg, warehouse arn:aws:s3tables:us-east-1:111122223333:bucket/analytics)"),
    (["    GlueRestIceberg: {glue_database_name: analytics, region: eu-west-1}"],
     "lake (GlueRestIceberg at https://glue.eu-west-1.amazonaws.com/iceberg, Glue database analytics)"),
    (["    RestIceberg:", "      uri: http://127.0.0.1:8181/catalog", "      token: ${CATALOG_TOKEN}"],
     "lake (RestIceberg at http://127.0.0.1:8181/catalog)"),
], ids=["s3tables", "glue", "token"])
def test_aws_shortcuts_and_tokens_are_valid(workdir, sink, summary):
    cfg, proc = run_validate(workdir, config_text(rest_lines(sink)), env=REST_ENV)
    assert proc.returncode == 0, describe_run(proc)
    assert summary in proc.stdout, describe_run(proc)


@pytest.mark.parametrize(
    "lines,line,field,msg",
    [
        (rest_replace(21, "      uri: ftp://catalog.example.com"), 21, "data_sinks.lake.RestIceberg.uri",
         ["ftp://catalog.example.com", "not an http(s) URL", "https://catalog.example.com/api/catalog"]),
        (rest_replace(21, "      uri: https://catalog.example.com/api/catalog/v1"), 21, "data_sinks.lake.RestIceberg.uri",
         ["ends with /v1", "write https://catalog.example.com/api/catalog"]),
        (rest_replace(21, None), 20, "data_sinks.lake.RestIceberg", ["missing required field uri"]),
        (rest_replace(23, "      credential: ${CLIENT_SECRET}"), 23, "data_sinks.lake.RestIceberg.credential",
         ["<client id>:<client secret>", "${CLIENT_ID}:${CLIENT_SECRET}"]),
        (rest_replace(24, "      token: ${CATALOG_TOKEN}"), 24, "data_sinks.lake.RestIceberg.token",
         ["credential and token exclude each other"]),
        (rest_replace(24, "      client_secret: x"), 24, "data_sinks.lake.RestIceberg.client_secret",
         ["unknown field client_secret", "uri", "credential", "token", "sigv4", "properties"]),
        (rest_replace(23, "      sigv4: {region: us-east-1, service: lambda}"), 23,
         "data_sinks.lake.RestIceberg.sigv4.service", ["lambda", "allowed: s3tables, glue"]),
        (rest_replace(27, "        s3.path-style-access: [true]"), 27,
         "data_sinks.lake.RestIceberg.properties.s3.path-style-access", ["wrong type", "a text value"]),
        (rest_lines(["    S3TablesIceberg:", "      table_bucket_arn: arn:aws:s3:::analytics", "      region: us-east-1"]),
         21, "data_sinks.lake.S3TablesIceberg.table_bucket_arn",
         ["not a table bucket ARN", "arn:aws:s3tables:<region>:<account>:bucket/<name>"]),
        (rest_lines(["    S3TablesIceberg:", "      table_bucket_arn: arn:aws:s3tables:us-east-1:111122223333:bucket/analytics",
                     "      region: eu-west-1"]),
         21, "data_sinks.lake.S3TablesIceberg.table_bucket_arn", ["in us-east-1", "region says eu-west-1"]),
        (rest_lines(["    GlueRestIceberg:", "      glue_database_name: ''", "      region: us-east-1"]),
         21, "data_sinks.lake.GlueRestIceberg.glue_database_name", ["must not be empty"]),
        (rest_lines(REST_SINK + ["    GlueRestIceberg: {glue_database_name: a, region: r}"]),
         19, "data_sinks.lake", ["exactly one connector key", "LocalIceberg, AthenaIceberg, RestIceberg, S3TablesIceberg, GlueRestIceberg"]),
        (rest_lines(REST_SINK + ["    schema_sink: schema_sinks.cat"],
                    ["schema_sinks:", "  cat:", "    RestIceberg: {uri: 'https://other.example.com/api/catalog', warehouse: analytics_wh}"]),
         28, "data_sinks.lake.schema_sink",
         ["schema_sinks.cat", "own catalog", "same uri and warehouse", "https://catalog.example.com/api/catalog, analytics_wh"]),
    ],
    ids=["uri-scheme", "uri-v1", "uri-missing", "credential-form", "credential-and-token", "unknown-key",
         "sigv4-service", "property-list", "arn", "arn-region", "glue-database", "two-connectors",
         "schema-sink-catalog"],
)
def test_rest_catalog_errors(workdir, lines, line, field, msg):
    cfg, proc = run_validate(workdir, config_text(lines), env=REST_ENV)
    assert_config_error(proc, cfg, line=line, cols=None, field_prefix=field, msg_contains=msg)
    m = [e for e in error_lines(proc) if int(e["line"]) == line][0]
    assert m["field"] == field, describe_run(proc, f"field path {m['field']!r} is not {field}")
