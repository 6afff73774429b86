"""Reflection through `skipprd serve` answers what Postgres answers (GitHub issue 45, item 2).

BI tools learn a database's tables through their drivers' reflection: Superset and most Python
tools through SQLAlchemy's Postgres dialect (1.4 in Superset, 2.x elsewhere), Metabase and
DBeaver through pgjdbc's DatabaseMetaData. For every replicated table and every model, each
reflection call must answer on the gateway exactly what Postgres answers for the same table.

The source database holds `types` (many types), `lines` (a composite key whose order differs
from the columns' order, a quoted mixed-case column), `sales.refunds` (outside `public`) and
`events` (identity and serial columns, defaults, NOT NULL columns, comments). They are synced
and served as `analytics.types`, `analytics.lines`, `analytics.sales_refunds` and
`analytics.events`. Then the same models are created, with the same SQL, through the gateway
and in the source Postgres: a table `dbt_models.stg_types` (CREATE TABLE AS) and a view
`dbt_models.order_totals`, with comments.

The probes, run once per side and client (the answers are cached for the module):

* tests/reflection_probe.py in SQLAlchemy 1.4 + psycopg2 (`$SKIPPR_SQLA14_VENV`, default
  ~/.cache/skippr/venv-sqla14, tests/requirements-sqla14.txt), 2.0 + psycopg2
  (`$SKIPPR_SQLA20_VENV`, ~/.cache/skippr/venv-sqla20, tests/requirements-sqla20.txt) and 2.1
  (this interpreter, tests/requirements.txt) with psycopg2 and with psycopg; tests/run creates
  the two extra venvs;
* tests/JdbcMetadataProbe.java with Debian's pgjdbc (/usr/share/java/postgresql.jar).

One test per (client, call), comparing the call's answers for every relation (or schema), with
a diff of both answers and the SQL the client sent to the gateway.

What is normalized in Postgres's answers before the comparison, because it must differ:

* names: schemas `public` and `sales` are the workspace `analytics`; `sales.refunds` is
  `sales_refunds`, and the name Postgres gave its key, `refunds_pkey`, is the one Postgres gives
  the key of a table named `sales_refunds`: `sales_refunds_pkey`;
* listings (table, view and schema names; pgjdbc's getSchemas and getTables) are compared in
  the order pgjdbc specifies, or sorted (SQLAlchemy 1.4 sends them without ORDER BY), since two
  source schemas become one;
* the schema `skippr` exists on the gateway only (its own `skippr.tables`);
* pgjdbc's getIndexInfo `CARDINALITY` and `PAGES` are the source index's storage statistics,
  which have no counterpart in Iceberg: left out on both sides.

And what the gateway cannot know of a replicated table (only of replicated tables; models are
compared as they are), documented exceptions:

* column defaults (`DEFAULT 'click'`, `DEFAULT now()`, a serial's `nextval(...)`), identity
  (`GENERATED ALWAYS AS IDENTITY`) and comments (`COMMENT ON TABLE/COLUMN`) of the source are
  not replicated (docs/operations.md: `col_description()`/`obj_description()` are NULL for the
  replicated tables). So SQLAlchemy's `default` is None, `autoincrement` False (it derives it
  from a `nextval` default or identity), no `identity`, `comment` None; the reflected Table's
  `server_default` None; pgjdbc's `COLUMN_DEF` and `REMARKS` NULL, `IS_AUTOINCREMENT` NO and
  `TYPE_NAME` the plain integer type where Postgres says `serial`/`bigserial`/`smallserial`
  (pgjdbc derives them from the default);
* the source's sequences (of `serial` and identity columns) are not replicated: pgjdbc's
  getTables lists no `SEQUENCE`.

NOT NULL is known (docs/types.md: a NOT NULL column is a required Iceberg field) and compared.
getTablePrivileges cannot equal the source's (the source answers for the tables' owner; the
gateway reads only): a test of its own checks that every relation is listed readable and no
replicated table writable.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import REPO, Database, _drop_database, describe_run
from test_gateway_clients import JDBC_JAR, LINES_DDL, Gateway, start_gateway

WORKSPACE = "analytics"
MODELS = "dbt_models"
#: One probe run may take this long (a debug build answers catalog queries slowly).
PROBE_TIMEOUT_S = float(os.environ.get("SKIPPR_REFLECTION_PROBE_TIMEOUT", "300"))

SOURCE = r"""
CREATE TABLE types (
    id integer PRIMARY KEY,
    i2 smallint, i4 integer, i8 bigint,
    n12 numeric(12,2), n numeric,
    r real, d double precision,
    b boolean,
    t text, vc varchar(20), ch char(3),
    dt date, tm time, ts timestamp, ts3 timestamp(3), tstz timestamptz,
    u uuid, j json, jb jsonb, by bytea,
    ia integer[], ta text[], na numeric(8,3)[],
    iv interval
);
INSERT INTO types VALUES
    (1, 1, 42, 1234567890123, 1234.50, 1.5, 3.14, 3.141592653589793, true, 'plain text', 'varchar',
     'abc', '2024-02-29', '12:34:56.789', '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789',
     '2024-02-29 12:34:56+05:30', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"k": 1}', '{"b": 1}',
     '\x0001ff', '{1,2,3}', '{a,b}', '{1.5,NULL}', '1 day 02:03:04'),
    (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);

""" + LINES_DDL + r"""INSERT INTO lines VALUES (1, 1, 'A', 2, 1.50, 'first'), (2, 1, 'B', 1, 10.00, NULL), (1, 2, 'A', 5, 1.50, NULL);

CREATE SCHEMA sales;
CREATE TABLE sales.refunds (id bigint PRIMARY KEY, order_id integer, amount numeric(10,2), reason text);
INSERT INTO sales.refunds VALUES (1, 2, -5.25, 'damaged'), (2, NULL, NULL, NULL);

-- what the gateway cannot know of a source table: defaults, identity, comments
CREATE TABLE events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    seq serial,
    kind text NOT NULL DEFAULT 'click',
    at timestamptz NOT NULL DEFAULT now(),
    score numeric(5,1) DEFAULT 0,
    payload jsonb
);
COMMENT ON TABLE events IS 'what users did';
COMMENT ON COLUMN events.kind IS 'the kind of event';
INSERT INTO events (kind, payload) VALUES ('view', '{"page": 1}'), (DEFAULT, NULL);
"""

#: The tables skippr.yml names, and what each is called on the gateway.
REPLICATED = {("public", "types"): "types", ("public", "lines"): "lines",
              ("sales", "refunds"): "sales_refunds", ("public", "events"): "events"}

#: The models, run through the gateway and in the source Postgres, statement by statement.
#: Table names are unqualified: each side's search path finds them (`public` in Postgres, the
#: workspace on the gateway). The view's text is written the way Postgres prints a view
#: (pg_get_viewdef), so both sides can print it alike.
MODEL_SQL = [
    f"CREATE SCHEMA {MODELS}",
    f"CREATE TABLE {MODELS}.stg_types AS SELECT id, i2, i8, n12, r, d, b, t, vc, ch, dt, tm, ts, tstz, u, j, jb, "
    "by, ia, ta FROM types",
    f"COMMENT ON TABLE {MODELS}.stg_types IS 'staged types'",
    f"COMMENT ON COLUMN {MODELS}.stg_types.t IS 'the text'",
    f"CREATE VIEW {MODELS}.order_totals AS SELECT lines.order_id,\n    count(*) AS n_lines,\n"
    "    sum(lines.price) AS total\n   FROM lines\n  GROUP BY lines.order_id",
    f"COMMENT ON VIEW {MODELS}.order_totals IS 'one row per order'",
]
MODEL_RELATIONS = ["stg_types", "order_totals"]

#: What each side's probes are asked about: schema -> relations.
SOURCE_GROUPS = {"public": ["types", "lines", "events"], "sales": ["refunds"], MODELS: MODEL_RELATIONS}
GATEWAY_GROUPS = {WORKSPACE: ["types", "lines", "events", "sales_refunds"], MODELS: MODEL_RELATIONS}

#: Schemas only the gateway has.
GATEWAY_ONLY_SCHEMAS = ["skippr"]


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------

def _venv_python(env: str, default: str) -> Path:
    return Path(os.environ.get(env, Path.home() / ".cache" / "skippr" / default)) / "bin" / "python"


#: SQLAlchemy clients: name -> (interpreter, driver, SQLAlchemy version prefix).
SQLA_CLIENTS: dict[str, tuple[Callable[[], Path], str, str]] = {
    "sqla1.4-psycopg2": (lambda: _venv_python("SKIPPR_SQLA14_VENV", "venv-sqla14"), "psycopg2", "1.4."),
    "sqla2.0-psycopg2": (lambda: _venv_python("SKIPPR_SQLA20_VENV", "venv-sqla20"), "psycopg2", "2.0."),
    "sqla2.1-psycopg2": (lambda: Path(sys.executable), "psycopg2", "2.1."),
    "sqla2.1-psycopg": (lambda: Path(sys.executable), "psycopg", "2.1."),
}

SQLA_RELATION_CALLS = ["get_columns", "get_pk_constraint", "get_foreign_keys", "get_indexes",
                       "get_unique_constraints", "get_check_constraints", "get_table_comment",
                       "get_view_definition", "has_table"]
SQLA2_RELATION_CALLS = ["has_index(<rel>_pkey)"]
SQLA_SCHEMA_CALLS = ["get_table_names", "get_view_names", "get_foreign_table_names", "MetaData.reflect",
                     "has_table(missing)"]
_MULTI = ["columns", "pk_constraint", "foreign_keys", "indexes", "unique_constraints", "check_constraints",
          "table_comment"]
SQLA2_SCHEMA_CALLS = ["has_schema", "get_materialized_view_names"] + [
    c for m in _MULTI for c in (f"get_multi_{m}", f"get_multi_{m}(kind=ANY, filter_names)")]
#: Listings: compared as sorted lists.
SQLA_LISTINGS = {"get_table_names", "get_view_names", "get_foreign_table_names", "get_materialized_view_names",
                 "get_schema_names"}

JDBC_RELATION_CALLS = ["getColumns", "getPrimaryKeys", "getIndexInfo(unique=false)", "getIndexInfo(unique=true)",
                       "getImportedKeys", "getExportedKeys", "getBestRowIdentifier"]
JDBC_SCHEMA_CALLS = ["getTables"]
JDBC_DATABASE_CALLS = ["getSchemas"]
#: Sort keys of the listings, as the JDBC specification orders them.
JDBC_ORDER = {"getSchemas": ["TABLE_SCHEM"], "getTables": ["TABLE_TYPE", "TABLE_SCHEM", "TABLE_NAME"],
              "getTablePrivileges": ["TABLE_SCHEM", "TABLE_NAME", "PRIVILEGE", "GRANTEE"]}


#: Known differences from Postgres, each failing its comparison until it is fixed (strict:
#: a fixed one fails the suite until it is taken off this list).
KNOWN_DIFFERENCES: dict[str, str] = {}


def _cases() -> list:
    """(client, scope, call) of every comparison."""
    out = []
    for client, (_, _, version) in SQLA_CLIENTS.items():
        is_2x = not version.startswith("1.")
        out.append((client, "database", "get_schema_names"))
        for call in SQLA_SCHEMA_CALLS + (SQLA2_SCHEMA_CALLS if is_2x else []):
            out.append((client, "schema", call))
        for call in SQLA_RELATION_CALLS + (SQLA2_RELATION_CALLS if is_2x else []):
            if call in KNOWN_DIFFERENCES:
                out.append(pytest.param(client, "relation", call, marks=pytest.mark.xfail(
                    strict=True, reason=KNOWN_DIFFERENCES[call])))
            else:
                out.append((client, "relation", call))
    out += [("pgjdbc", "database", c) for c in JDBC_DATABASE_CALLS]
    out += [("pgjdbc", "schema", c) for c in JDBC_SCHEMA_CALLS]
    out += [("pgjdbc", "relation", c) for c in JDBC_RELATION_CALLS]
    return out


# --------------------------------------------------------------------------------------------
# Normalizing Postgres's answers to the gateway's names
# --------------------------------------------------------------------------------------------

_EXACT = {"public": WORKSPACE, "sales": WORKSPACE, "refunds": "sales_refunds", "refunds_pkey": "sales_refunds_pkey"}
_IN_TEXT = [(re.compile(r"\bsales\.refunds\b"), f"{WORKSPACE}.sales_refunds"),
            (re.compile(r'"sales"\."refunds"'), f'"{WORKSPACE}"."sales_refunds"'),
            (re.compile(r"\bpublic\."), f"{WORKSPACE}."),
            (re.compile(r'"public"\.'), f'"{WORKSPACE}".'),
            (re.compile(r"\brefunds_pkey\b"), "sales_refunds_pkey")]


def rename(value: Any) -> Any:
    """Postgres's names as the gateway names the same relations (keys too)."""
    if isinstance(value, dict):
        return {rename(k): rename(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rename(v) for v in value]
    if isinstance(value, str):
        if value in _EXACT:
            return _EXACT[value]
        for pattern, repl in _IN_TEXT:
            value = pattern.sub(repl, value)
    return value


def _inner(answer: Any) -> Any:
    """A call's result without the warnings the probe may have wrapped it with."""
    if isinstance(answer, dict) and set(answer) == {"result", "warnings"}:
        return answer["result"]
    return answer


def _unknowable_column(col: dict) -> None:
    """A SQLAlchemy get_columns entry of a replicated table, as the gateway can know it."""
    col["default"] = None
    col["autoincrement"] = False
    col.pop("identity", None)
    col["comment"] = None


def _unknowable_table(table: dict) -> None:
    """A MetaData.reflect summary of a replicated table, as the gateway can know it."""
    for col in table["columns"]:
        col["server_default"] = None
        col["autoincrement"] = False
        col.pop("identity", None)
        col["comment"] = None
    table["comment"] = None


def _merge(a: Any, b: Any) -> Any:
    """Two schemas' answers to one schema-level call, as one schema's."""
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict) and "error" not in a and "error" not in b \
            and set(a) != {"result", "warnings"}:
        return {**a, **b}
    if a == b:
        return a
    return {"answers differ between the source schemas": [a, b]}


def expected_sqla(pg: dict) -> dict:
    """Postgres's answers (probe JSON) as the gateway must give them."""
    out = rename({k: v for k, v in pg.items() if k != "sql"})
    # the source's schemas public and sales both became the workspace: merge their answers
    merged: dict[str, Any] = {}
    for source_schema in ("public", "sales"):
        for call, answer in pg["schemas"][source_schema].items():
            answer = rename(answer)
            merged[call] = _merge(merged[call], answer) if call in merged else answer
    out["schemas"] = {WORKSPACE: merged, MODELS: out["schemas"][MODELS]}
    names = _inner(out["database"]["get_schema_names"])
    if isinstance(names, list):
        out["database"]["get_schema_names"] = sorted(set(names) | set(GATEWAY_ONLY_SCHEMAS))

    # What the gateway cannot know of the replicated tables (see the module's docstring).
    replicated = [f"{WORKSPACE}.{n}" for n in REPLICATED.values()]
    for key in replicated:
        rel = out["relations"][key]
        for col in _inner(rel["get_columns"]):
            _unknowable_column(col)
        _inner(rel["get_table_comment"])["text"] = None
    ws = out["schemas"][WORKSPACE]
    for call, answer in ws.items():
        answer = _inner(answer)
        if call.startswith("get_multi_columns"):
            for key in replicated:
                for col in answer.get(key, []):
                    _unknowable_column(col)
        elif call.startswith("get_multi_table_comment"):
            for key in replicated:
                if key in answer:
                    answer[key]["text"] = None
        elif call == "MetaData.reflect":
            for table in answer.values():
                _unknowable_table(table)
    return out


def normalize_listings_sqla(answers: dict) -> dict:
    for scope in answers["schemas"].values():
        for call in SQLA_LISTINGS & set(scope):
            if isinstance(scope[call], list):
                scope[call] = sorted(scope[call])
    if isinstance(answers["database"]["get_schema_names"], list):
        answers["database"]["get_schema_names"] = sorted(answers["database"]["get_schema_names"])
    return answers


def parse_jdbc(text: str) -> dict[str, dict[str, list[dict]]]:
    """The probe's lines as call -> scope -> rows (scope: '', 'schema' or 'schema.relation')."""
    def unescape(s: str) -> str | None:
        if s == "\\N":
            return None
        return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), s)

    out: dict[str, dict[str, list[dict]]] = {}
    for line in text.splitlines():
        if not line:
            continue
        call, schema, rel, *fields = line.split("\t")
        schema, rel = unescape(schema), unescape(rel)
        scope = "" if schema is None else schema if rel is None else f"{schema}.{rel}"
        row = {}
        for f in fields:
            k, _, v = f.partition("=")
            row[k] = unescape(v)
        out.setdefault(call, {}).setdefault(scope, []).append(row)
    return out


_SERIALS = {"serial": "int4", "bigserial": "int8", "smallserial": "int2"}


def normalize_jdbc(answers: dict[str, dict[str, list[dict]]], *, source: bool) -> dict:
    """Both sides' rows without the index statistics, listings in the JDBC order; on the source
    side also renamed, merged and without what the gateway cannot know."""
    out: dict[str, dict[str, list[dict]]] = {}
    for call, scopes in answers.items():
        for scope, rows in scopes.items():
            rows = [dict(r) for r in rows]
            if source:
                scope, rows = rename(scope), rename(rows)
            for r in rows:
                if call.startswith("getIndexInfo"):
                    r.pop("CARDINALITY", None)
                    r.pop("PAGES", None)
            out.setdefault(call, {}).setdefault(scope, []).extend(rows)
    if source:
        for scope, rows in out.get("getColumns", {}).items():
            if scope.startswith(f"{WORKSPACE}."):
                for r in rows:
                    if "ERROR" in r:
                        continue
                    r["REMARKS"] = None
                    r["COLUMN_DEF"] = None
                    r["IS_AUTOINCREMENT"] = "NO"
                    r["TYPE_NAME"] = _SERIALS.get(r["TYPE_NAME"], r["TYPE_NAME"])
        for scope, rows in out.get("getTables", {}).items():
            if scope == WORKSPACE:
                rows[:] = [r for r in rows if r.get("TABLE_TYPE") != "SEQUENCE"]
                for r in rows:
                    if r.get("TABLE_TYPE") == "TABLE":
                        r["REMARKS"] = None
        schemas = out.get("getSchemas", {}).get("", [])
        if schemas and all("TABLE_SCHEM" in r or "table_schem" in r for r in schemas):
            key = "TABLE_SCHEM" if "TABLE_SCHEM" in schemas[0] else "table_schem"
            seen: set[str] = set()
            deduped = []
            for r in schemas:  # public and sales both became the workspace
                if r[key] not in seen:
                    seen.add(r[key])
                    deduped.append(r)
            for name in GATEWAY_ONLY_SCHEMAS:
                deduped.append({**schemas[0], key: name})
            out["getSchemas"][""] = deduped
    for call, keys in JDBC_ORDER.items():
        for rows in out.get(call, {}).values():
            rows.sort(key=lambda r: tuple(str(_get_ci(r, k)) for k in keys))
    return out


def _get_ci(row: dict, key: str) -> Any:
    """A column of a row whatever case the driver spelled its label in."""
    for k, v in row.items():
        if k.upper() == key:
            return v
    return None


# --------------------------------------------------------------------------------------------
# The module's source, gateway, models and probes
# --------------------------------------------------------------------------------------------


class Sides:
    """Both sides of the comparison and each client's answers, probed once."""

    def __init__(self, source: Database, gw: Gateway, classes: Path, out: Path) -> None:
        self.source = source
        self.gw = gw
        self.classes = classes
        #: where each client's answers are written: <client>.postgres.json, <client>.gateway.json
        self.out = out
        self._cache: dict[str, tuple[Any, Any]] = {}

    def saved(self, client: str) -> Path:
        return self.out / f"{client}.{{postgres,gateway}}.json"

    def _keep(self, client: str, expected: Any, actual: Any) -> None:
        self._cache[client] = (expected, actual)
        for side, answers in (("postgres", expected), ("gateway", actual)):
            (self.out / f"{client}.{side}.json").write_text(
                json.dumps(answers, indent=1, sort_keys=True, ensure_ascii=False))

    def sqla(self, client: str) -> tuple[dict, dict]:
        if client not in self._cache:
            python, driver, version = SQLA_CLIENTS[client]
            exe = python()
            if not exe.exists():
                pytest.fail(f"{exe} is missing: tests/run creates it (tests/requirements-sqla14.txt, "
                            "tests/requirements-sqla20.txt), or set SKIPPR_SQLA14_VENV / SKIPPR_SQLA20_VENV")
            src = self.source
            pg_url = f"postgresql+{driver}://{src.cluster.user}:{src.cluster.password}@{src.host}:{src.port}/{src.name}"
            gw = self.gw
            auth = gw.user if gw.password is None else f"{gw.user}:{gw.password}"
            gw_url = f"postgresql+{driver}://{auth}@{gw.host}:{gw.port}/{gw.dbname}"
            pg = run_sqla_probe(exe, pg_url, SOURCE_GROUPS)
            actual = run_sqla_probe(exe, gw_url, GATEWAY_GROUPS)
            for side in (pg, actual):
                assert side["sqlalchemy"].startswith(version), \
                    f"{exe} has SQLAlchemy {side['sqlalchemy']}, not {version}x"
            self._keep(client, normalize_listings_sqla(expected_sqla(pg)), actual)
        return self._cache[client]

    def jdbc(self) -> tuple[dict, dict]:
        if "pgjdbc" not in self._cache:
            src, gw = self.source, self.gw
            pg = run_jdbc_probe(self.classes, src.host, src.port, src.name, src.cluster.user,
                                src.cluster.password, SOURCE_GROUPS)
            actual = run_jdbc_probe(self.classes, gw.host, gw.port, gw.dbname, gw.user, gw.password,
                                    GATEWAY_GROUPS)
            self._keep("pgjdbc", normalize_jdbc(pg, source=True), normalize_jdbc(actual, source=False))
        return self._cache["pgjdbc"]


def _groups(groups: dict[str, list[str]]) -> list[str]:
    return [f"{s}={','.join(rels)}" for s, rels in groups.items()]


def run_sqla_probe(python: Path, url: str, groups: dict[str, list[str]]) -> dict:
    cmd = [str(python), str(REPO / "tests" / "reflection_probe.py"), url, *_groups(groups)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    assert proc.returncode == 0, describe_run(proc, "the reflection probe failed")
    return json.loads(proc.stdout)


def run_jdbc_probe(classes: Path, host: str, port: int, dbname: str, user: str, password: str | None,
                   groups: dict[str, list[str]]) -> dict:
    java = shutil.which("java")
    assert java, "java not installed (tests/run installs default-jdk-headless)"
    url = f"jdbc:postgresql://{host}:{port}/{dbname}?connectTimeout=10&socketTimeout=120"
    cmd = [java, "-Duser.timezone=UTC", "-cp", f"{classes}:{JDBC_JAR}", "JdbcMetadataProbe", url, user,
           password or "", *_groups(groups)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    assert proc.returncode == 0, describe_run(proc, "the pgjdbc metadata probe failed")
    return parse_jdbc(proc.stdout)


@pytest.fixture(scope="module")
def jdbc_classes(tmp_path_factory) -> Path:
    """JdbcMetadataProbe.java compiled; the class folder."""
    javac = shutil.which("javac")
    assert javac, "javac not installed (tests/run installs default-jdk-headless)"
    assert JDBC_JAR.exists(), f"{JDBC_JAR} missing (tests/run installs libpostgresql-jdbc-java)"
    d = tmp_path_factory.mktemp("jdbc-probe")
    proc = subprocess.run([javac, "-d", str(d), str(REPO / "tests" / "JdbcMetadataProbe.java")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe_run(proc, "javac failed")
    return d


@pytest.fixture(scope="module")
def sides(pg, tmp_path_factory, jdbc_classes) -> Iterator[Sides]:
    name = "refl_" + secrets.token_hex(6)
    pg.execute(f'CREATE DATABASE "{name}"')
    try:
        source = Database(pg, name)
        source.execute(SOURCE)
        workdir = tmp_path_factory.mktemp("reflection") / "work"
        workdir.mkdir()
        tables = [n if s == "public" else f"{s}.{n}" for s, n in REPLICATED]
        with start_gateway(source, workdir, tables, workspace=WORKSPACE) as gw:
            for side, connect in (("Postgres", source.connect), ("the gateway", gw.connect)):
                with connect() as conn:
                    for stmt in MODEL_SQL:
                        try:
                            conn.execute(stmt)
                        except Exception as e:
                            pytest.fail(f"creating the models in {side} failed at {stmt!r}: {e}\n"
                                        f"{gw.log() if side == 'the gateway' else ''}")
            yield Sides(source, gw, jdbc_classes, tmp_path_factory.mktemp("answers"))
    finally:
        _drop_database(pg, name)


# --------------------------------------------------------------------------------------------
# The comparisons
# --------------------------------------------------------------------------------------------


def _dump(value: Any) -> list[str]:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False).splitlines()


def _errors(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, message) of every failed call in an answer."""
    if isinstance(value, dict):
        if set(value) == {"error"}:
            yield path or "(the call)", value["error"]
            return
        if "ERROR" in value:
            yield path or "(the call)", str(value["ERROR"])
            return
        for k, v in value.items():
            yield from _errors(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _errors(v, f"{path}[{i}]")


def assert_same_answer(client: str, call: str, expected: dict[str, Any], actual: dict[str, Any],
                       sql: Callable[[str], str] = lambda key: "", saved: Path | None = None) -> None:
    """`expected` and `actual` map a relation or schema to the call's answer."""
    differ = sorted(k for k in set(expected) | set(actual) if expected.get(k, "(missing)") != actual.get(k, "(missing)"))
    if not differ:
        return
    parts = [f"{client} {call}: the gateway's answer differs from Postgres's for {', '.join(differ)}"]
    if saved is not None:
        parts.append(f"(both sides' whole answers: {saved})")
    shown: dict[str, str] = {}
    for key in differ:
        e, a = expected.get(key, "(not asked)"), actual.get(key, "(not asked)")
        errors = list(_errors(a))
        if errors:
            parts.append(f"--- {key}: the gateway failed ---")
            parts.extend(f"  {where}: {msg}" for where, msg in errors[:10])
            parts.append(f"--- {key}: Postgres answered ---")
            dump = _dump(e)
            parts.extend(dump[:60] + ([f"... ({len(dump) - 60} more lines)"] if len(dump) > 60 else []))
        else:
            diff = list(difflib.unified_diff(_dump(e), _dump(a), "postgres", "gateway", lineterm="", n=3))
            parts.append(f"--- {key}: diff (- Postgres, + gateway) ---")
            parts.extend(diff[:200] + ([f"... ({len(diff) - 200} more diff lines)"] if len(diff) > 200 else []))
        statements = sql(key)
        if statements:
            shape = re.sub(r"-- parameters: .*", "", statements)
            if shape in shown:
                parts.append(f"--- {key}: SQL {client} sent to the gateway: as for {shown[shape]} ---")
            else:
                shown[shape] = key
                parts.append(f"--- {key}: SQL {client} sent to the gateway ---")
                parts.append(statements[:4000])
    raise AssertionError("\n".join(parts))


@pytest.mark.parametrize("client,scope,call", _cases(), ids=lambda v: str(v))
def test_reflection_equals_postgres(sides, client, scope, call):
    if client == "pgjdbc":
        expected, actual = sides.jdbc()
        exp, act = expected.get(call, {}), actual.get(call, {})
        if scope == "relation":
            keys = [f"{s}.{r}" for s, rels in GATEWAY_GROUPS.items() for r in rels]
        elif scope == "schema":
            keys = list(GATEWAY_GROUPS)
        else:
            keys = [""]
        # a call with no rows prints nothing: an empty answer
        assert_same_answer(client, call, {k: exp.get(k, []) for k in keys}, {k: act.get(k, []) for k in keys},
                           saved=sides.saved(client))
        return

    expected, actual = sides.sqla(client)
    actual = normalize_listings_sqla(json.loads(json.dumps(actual)))
    if scope == "database":
        exp, act = {"database": expected["database"][call]}, {"database": actual["database"][call]}
        labels = {"database": call}
    elif scope == "schema":
        exp = {s: v[call] for s, v in expected["schemas"].items()}
        act = {s: v.get(call, "(not answered)") for s, v in actual["schemas"].items()}
        labels = {s: f"{s}: {call}" for s in exp}
    else:
        exp = {k: v[call] for k, v in expected["relations"].items()}
        act = {k: v.get(call, "(not answered)") for k, v in actual["relations"].items()}
        labels = {k: f"{k}: {call}" for k in exp}
    gw_sql = actual.get("sql", {})
    assert_same_answer(client, call, exp, act, lambda key: "\n\n".join(gw_sql.get(labels.get(key, ""), [])),
                       saved=sides.saved(client))


def test_pgjdbc_table_privileges(sides):
    """getTablePrivileges (Metabase hides what it may not read): every relation the gateway
    lists is readable by the user, and no replicated table is writable. Postgres's own answer
    is for the tables' owner and cannot be compared."""
    _, actual = sides.jdbc()
    listed = {(_get_ci(r, "TABLE_SCHEM"), _get_ci(r, "TABLE_NAME"))
              for s in GATEWAY_GROUPS for r in actual.get("getTables", {}).get(s, [])
              if _get_ci(r, "TABLE_TYPE") in ("TABLE", "VIEW")}
    expected = {(s, r) for s, rels in GATEWAY_GROUPS.items() for r in rels}
    assert listed == expected, f"getTables lists {sorted(listed)}, not {sorted(expected)}"
    rows = [r for s in GATEWAY_GROUPS for r in actual.get("getTablePrivileges", {}).get(s, [])]
    errors = [r for r in rows if "ERROR" in r]
    assert not errors, f"getTablePrivileges failed: {errors}"
    privileges: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        if _get_ci(r, "GRANTEE") in (sides.gw.user, "PUBLIC"):
            privileges.setdefault((_get_ci(r, "TABLE_SCHEM"), _get_ci(r, "TABLE_NAME")), set()).add(
                _get_ci(r, "PRIVILEGE"))
    unreadable = sorted(rel for rel in expected if "SELECT" not in privileges.get(rel, set()))
    assert not unreadable, f"getTablePrivileges grants {sides.gw.user} no SELECT on {unreadable}: {rows}"
    writable = {rel: sorted(privileges.get(rel, set()) & {"INSERT", "UPDATE", "DELETE", "TRUNCATE"})
                for rel in expected if rel[0] == WORKSPACE}
    writable = {k: v for k, v in writable.items() if v}
    assert not writable, f"getTablePrivileges lets {sides.gw.user} write replicated tables: {writable}"


#: Catalog expressions clients write against Postgres's array and vector columns, on the
#: composite key of `lines` (its key's order differs from its columns').
CATALOG_ARRAYS = [
    "SELECT i.indkey::text, i.indkey::varchar, i.indkey[0], i.indkey[1], array_length(i.indkey, 1), "
    "pg_typeof(i.indkey)::text, pg_typeof(i.indkey::int4[])::text "
    "FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s AND c.relname = 'lines'",
    "SELECT a.attname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a "
    "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) JOIN pg_catalog.pg_class c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s AND c.relname = 'lines' "
    "ORDER BY a.attnum",
    "SELECT generate_subscripts(i.indkey, 1) AS s FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c "
    "ON c.oid = i.indrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = 'lines' ORDER BY s",
    "SELECT unnest(i.indkey) AS k FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s AND c.relname = 'lines' "
    "ORDER BY k",
    "SELECT con.conkey::text, array_length(con.conkey, 1), con.conkey[1], pg_typeof(con.conkey)::text, "
    "con.contype::text FROM pg_catalog.pg_constraint con JOIN pg_catalog.pg_class c ON c.oid = con.conrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(schema)s AND c.relname = 'lines'",
    "SELECT '1 2'::int2vector::text, pg_typeof('1 2'::int2vector)::text, ('{1,2}'::int2[])::text, "
    "pg_typeof('{1,2}'::int2[])::text, pg_typeof(1.5::numeric)::text",
]


def test_catalog_arrays_answer_as_postgres(sides):
    """`int2vector` and `int2[]` catalog columns answer what clients write against them as
    Postgres does: casts, subscripts (a vector's from 0), `= ANY`, `unnest`,
    `generate_subscripts`, `array_length` and `pg_typeof`, and a cast to another array type
    is that type."""
    with sides.gw.connect() as conn:
        for sql in CATALOG_ARRAYS:
            expected = sides.source.execute(sql, {"schema": "public"})
            assert expected, f"nothing on Postgres: {sql}"
            actual = conn.execute(sql, {"schema": WORKSPACE}).fetchall()
            assert [tuple(r) for r in actual] == [tuple(r) for r in expected], sql
