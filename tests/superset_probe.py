"""Drives Apache Superset through its REST API, the way its web UI does, against two databases
and prints what Superset answered at every step of the workflow, normalized so the two answers
can be compared with ==.

Run with the Python of the Superset venv (tests/run creates it from tests/requirements-superset.txt):

    $SKIPPR_SUPERSET_VENV/bin/python tests/superset_probe.py spec.json out.json

`spec.json`:

    {"table": "orders", "key": "id",
     "databases": {"postgres": {"uri": "postgresql+psycopg2://...", "schema": "public"},
                   "gateway":  {"uri": "postgresql+psycopg2://...", "schema": "analytics",
                                "own_schemas": ["skippr"]}},
     "sqllab_sql": "SELECT ... FROM orders ORDER BY id", "sqllab_limit": 25,
     "time_range": "2024-03-10T00:00:00 : 2024-04-10T00:00:00"}

Superset runs headless in this one process, in a temp dir: a generated superset_config.py
(SQLite metadata database, no Redis, no Celery, no cache, queries run synchronously), the
metadata migrations (`superset db upgrade`), an admin user and `superset init`, all through
the Python API. Then, for each database in turn ("postgres" first), the Flask test client
logs in at /api/v1/security/login (a JWT, sent as a Bearer token afterwards) and runs the
workflow a person runs in the UI: test the connection, save it, browse schemas and tables,
read the table's metadata, create a dataset on the table, read and refresh it, build charts
(group-by, time series at three grains with a time range, a series limit, a filter's value
list) and use SQL Lab (schema dropdown, a limited query, the table preview).

`out.json`: {"superset_version", "setup_seconds", "databases": {name: {"steps": {step:
{"answer": <normalized answer>, "sql": [every statement Superset sent to the database during
the step, with the database's error if it failed], "seconds"}}, "notes": [...]}}}.

What must differ between two databases is normalized here, never in the comparison: database
ids and names, the schema name (`public` against the gateway's workspace) and the default
catalog (the database name), timings, query ids, cache keys, client ids and timestamps of
Superset's own objects. Schemas named in `own_schemas` (the gateway's own `skippr` schema)
are left out of the schema lists. Everything else (status codes, column names and types as
Superset reports them, rows, generated SQL, error messages) is kept verbatim. Rows keep the
order the database gave when the query orders them; a DISTINCT value list is sorted; the table
preview (a SELECT without ORDER BY, so any rows may come back) is answered by its row count and
the rows that are not rows of the table, as SQL Lab shows the whole table ordered by `key` on
the first database.

When the API cannot create the dataset on a database, the chart steps still run on that
database against a dataset the probe copies from the first database's (same columns and
metrics, created through Superset's models): that dataset creation failed is already the
answer of the `create_dataset` step, and the charts then show what else differs. `notes`
says when this happened.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

# --------------------------------------------------------------------------------------------
# What Superset sends to the databases: every psycopg2 cursor records its statements.
# --------------------------------------------------------------------------------------------

#: Statements of the step being run: {"sql": ..., "error": ...}.
SENT: list[dict[str, Any]] = []


def _install_statement_log() -> None:
    """Every psycopg2 connection is made with a cursor class that records what it executes
    (SQLAlchemy's reflection, Superset's raw cursors and its prequeries all use cursors)."""
    import psycopg2
    import psycopg2.extensions

    class RecordingCursor(psycopg2.extensions.cursor):
        def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 (DB-API name)
            entry: dict[str, Any] = {"sql": _statement_text(self, query, vars)}
            SENT.append(entry)
            try:
                return super().execute(query, vars)
            except Exception as e:  # recorded, then raised as Superset expects
                entry["error"] = f"{type(e).__name__}: {str(e).strip()}"
                raise

        def executemany(self, query: Any, vars_list: Any) -> Any:  # noqa: A002
            entry: dict[str, Any] = {"sql": _statement_text(self, query, None), "many": True}
            SENT.append(entry)
            try:
                return super().executemany(query, vars_list)
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {str(e).strip()}"
                raise

    original_connect = psycopg2.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", RecordingCursor)
        return original_connect(*args, **kwargs)

    psycopg2.connect = connect


def _statement_text(cursor: Any, query: Any, params: Any) -> str:
    try:
        text = cursor.mogrify(query, params) if params is not None else query
    except Exception:  # a statement psycopg2 cannot even format: keep the template
        text = query
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text)


# --------------------------------------------------------------------------------------------
# Superset, headless
# --------------------------------------------------------------------------------------------

ADMIN = "admin"
ADMIN_PASSWORD = "probe-" + secrets.token_hex(8)

CONFIG = '''\
"""Superset config of one probe run (tests/superset_probe.py): headless, in its temp dir."""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
SQLALCHEMY_DATABASE_URI = "sqlite:///" + os.path.join(_HERE, "superset.db")
SECRET_KEY = {secret!r}
WTF_CSRF_ENABLED = False
TALISMAN_ENABLED = False
AUTH_RATE_LIMITED = False
RATELIMIT_ENABLED = False
# No Redis, no Celery: no caches, SQL Lab runs queries in the request (no results backend).
CACHE_CONFIG = {{"CACHE_TYPE": "NullCache"}}
DATA_CACHE_CONFIG = {{"CACHE_TYPE": "NullCache"}}
FILTER_STATE_CACHE_CONFIG = {{"CACHE_TYPE": "NullCache"}}
EXPLORE_FORM_DATA_CACHE_CONFIG = {{"CACHE_TYPE": "NullCache"}}
RESULTS_BACKEND = None
FEATURE_FLAGS = {{"GLOBAL_ASYNC_QUERIES": False, "ALERT_REPORTS": False, "THUMBNAILS": False}}
SUPERSET_LOG_VIEW = False
'''


def _fast_sqlite() -> None:
    """The metadata database is a throw-away SQLite file: no fsync on every commit of the
    migrations and of `superset init` (they commit thousands of times)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        if type(dbapi_conn).__module__.startswith("sqlite3"):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA synchronous = OFF")
            cur.execute("PRAGMA journal_mode = MEMORY")
            cur.close()


def start_superset(home: str) -> tuple[Any, dict[str, float]]:
    """Writes the config, creates the app, migrates the metadata database, creates the admin
    and runs `superset init`. Returns the app and the seconds each phase took."""
    timings: dict[str, float] = {}
    config_path = os.path.join(home, "superset_config.py")
    with open(config_path, "w") as f:
        f.write(CONFIG.format(secret=secrets.token_urlsafe(32)))
    os.environ["SUPERSET_CONFIG_PATH"] = config_path
    os.environ["SUPERSET_HOME"] = home
    t = time.monotonic()
    _fast_sqlite()
    _install_statement_log()
    from superset.app import create_app

    app = create_app()
    timings["create_app"] = time.monotonic() - t

    with app.app_context():
        from flask_migrate import upgrade

        t = time.monotonic()
        upgrade()  # `superset db upgrade`
        timings["db_upgrade"] = time.monotonic() - t

        from superset import appbuilder, security_manager

        t = time.monotonic()
        # `superset fab create-admin`
        admin_role = security_manager.find_role("Admin") or security_manager.add_role("Admin")
        user = security_manager.add_user(ADMIN, "Probe", "Admin", "admin@example.invalid", admin_role,
                                         password=ADMIN_PASSWORD)
        if not user:
            raise RuntimeError("could not create the admin user")
        timings["create_admin"] = time.monotonic() - t

        t = time.monotonic()
        appbuilder.add_permissions(update_perms=True)  # `superset init`
        security_manager.sync_role_definitions()
        timings["init"] = time.monotonic() - t
    return app, timings


# --------------------------------------------------------------------------------------------
# The REST client
# --------------------------------------------------------------------------------------------


class Api:
    """Superset's REST API through the Flask test client, logged in with a JWT."""

    def __init__(self, app: Any) -> None:
        self.client = app.test_client()
        resp = self.client.post("/api/v1/security/login", json={
            "username": ADMIN, "password": ADMIN_PASSWORD, "provider": "db", "refresh": True})
        if resp.status_code != 200:
            raise RuntimeError(f"login failed: {resp.status_code} {resp.get_data(as_text=True)}")
        self.headers = {"Authorization": f"Bearer {resp.get_json()['access_token']}"}

    def call(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        resp = self.client.open(url, method=method, json=body, headers=self.headers)
        text = resp.get_data(as_text=True)
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = {"non_json_body": text[:2000]}
        return resp.status_code, payload


def rison_str(s: str) -> str:
    """A string in rison (the `q=` parameter of Superset's list endpoints)."""
    if re.fullmatch(r"[A-Za-z_./~][A-Za-z0-9_./~-]*", s):
        return s
    return "'" + s.replace("!", "!!").replace("'", "!'") + "'"


# --------------------------------------------------------------------------------------------
# Normalization
# --------------------------------------------------------------------------------------------

#: Keys whose values are Superset's own bookkeeping: ids, times, cache keys, owners.
DROP_KEYS = {
    "id", "pk", "uuid", "database_id", "datasource_id", "query_id", "client_id", "cache_key",
    "cached_dttm", "cache_timeout", "is_cached", "changed_on", "changed_on_utc",
    "changed_on_delta_humanized", "changed_on_humanized", "created_on", "created_on_humanized",
    "created_on_delta_humanized", "changed_by", "changed_by_name", "changed_by_fk", "created_by",
    "created_by_fk", "owners", "url", "explore_url", "edit_url", "startDttm", "endDttm",
    "start_running_time", "end_time", "start_time", "tracking_url", "sql_editor_id", "user_id",
    "tab", "tab_name", "resultsKey", "results_key", "userId", "user", "datasource_name",
    "sqlalchemy_uri", "sqlalchemy_uri_decrypted", "database_name", "dbId",
    "progress", "cancel_query", "ctas", "tempSchema", "tempTable", "catalog_name", "queried_dttm",
}
#: Keys that hold an id when their value is a number (and an object otherwise).
ID_KEYS = {"database", "datasource", "explore_database_id"}
#: Keys whose lists are the databases' answers (rows keyed by column name): nothing in them
#: is dropped, whatever the column names.
RESULT_KEYS = {"data", "label_map", "rows_not_in_table"}


def without_connection(database: dict[str, Any]) -> dict[str, Any]:
    """A saved connection without what is each URI's own (host, port, user, password); the
    database name stays, as it is the catalog."""
    database = dict(database)
    if isinstance(database.get("parameters"), dict):
        database["parameters"] = {k: v for k, v in database["parameters"].items()
                                  if k not in ("host", "port", "username", "password")}
    return database


class Normalizer:
    """Replaces what legitimately differs between the two databases by placeholders."""

    def __init__(self, replacements: dict[str, str]) -> None:
        # longest first, so that a name containing another is replaced whole
        self.items = sorted(((k, v) for k, v in replacements.items() if k), key=lambda kv: -len(kv[0]))
        self.patterns = [(re.compile(r'(?<![\w$])' + re.escape(k) + r'(?![\w$])'), v) for k, v in self.items]

    def text(self, s: str) -> str:
        for pattern, placeholder in self.patterns:
            s = pattern.sub(placeholder, s)
        return s

    def __call__(self, obj: Any, drop: set[str] = DROP_KEYS) -> Any:
        if isinstance(obj, dict) and "parameters_schema" in obj:
            obj = without_connection(obj)  # a saved connection, wherever an answer shows it
        if isinstance(obj, dict):
            return {self.text(k): self(v, set() if k in RESULT_KEYS and isinstance(v, list) else drop)
                    for k, v in obj.items()
                    if k not in drop and not (drop and k in ID_KEYS and isinstance(v, int))}
        if isinstance(obj, list):
            return [self(v, drop) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj


def sort_rows(rows: Any) -> Any:
    """Rows of an answer without ORDER BY, in one order whatever the database returned."""
    if not isinstance(rows, list):
        return rows
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


# --------------------------------------------------------------------------------------------
# The workflow
# --------------------------------------------------------------------------------------------


def metric_simple(aggregate: str, column: str) -> dict[str, Any]:
    """An ad-hoc metric as the Explore view's metric popover builds it."""
    return {"expressionType": "SIMPLE", "column": {"column_name": column}, "aggregate": aggregate,
            "label": f"{aggregate}({column})", "hasCustomLabel": False, "optionName": f"metric_{aggregate.lower()}_{column}"}


def chart_request(dataset_id: int, query: dict[str, Any], viz_type: str) -> dict[str, Any]:
    """A POST /api/v1/chart/data body as Explore sends it."""
    base_query = {
        "filters": [], "extras": {"having": "", "where": ""}, "applied_time_extras": {},
        "columns": [], "metrics": [], "orderby": [], "annotation_layers": [], "row_limit": 10000,
        "series_limit": 0, "order_desc": True, "url_params": {}, "custom_params": {},
        "custom_form_data": {}, "post_processing": [],
    }
    base_query.update(query)
    return {
        "datasource": {"id": dataset_id, "type": "table"},
        "force": True,
        "queries": [base_query],
        "form_data": {"datasource": f"{dataset_id}__table", "viz_type": viz_type, "force": True},
        "result_format": "json",
        "result_type": "full",
    }


def base_axis(column: str, grain: str) -> dict[str, Any]:
    return {"timeGrain": grain, "columnType": "BASE_AXIS", "sqlExpression": column, "label": column,
            "expressionType": "SQL"}


class Workflow:
    """One database through the whole workflow. Each step returns its answer; the SQL the
    database saw during the step is recorded beside it."""

    def __init__(self, app: Any, api: Api, name: str, conf: dict[str, Any], spec: dict[str, Any],
                 reference: "Workflow | None") -> None:
        self.app, self.api, self.name, self.conf, self.spec = app, api, name, conf, spec
        self.reference = reference
        self.schema: str = conf["schema"]
        self.table: str = spec["table"]
        self.database_name = f"probe-{name}-{secrets.token_hex(3)}"
        self.steps: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.db_id: int | None = None
        self.dataset_id: int | None = None
        self.dataset_by_api = False
        self.catalog: str | None = None
        self._table_as_shown: dict[str, Any] | None = None
        self.definition: dict[str, Any] | None = None
        self.norm = Normalizer({self.schema: "<schema>", self.database_name: "<database>"})

    # -- running a step ----------------------------------------------------------------------

    def step(self, name: str, fn: Callable[[], Any], needs: tuple[str, ...] = ()) -> None:
        missing = [n for n in needs if getattr(self, n) is None]
        SENT.clear()
        t = time.monotonic()
        if missing:
            answer: Any = {"not_run": f"needs {', '.join(missing)}, which an earlier step did not give"}
        else:
            try:
                answer = fn()
            except Exception as e:  # the probe's own failure: reported as the step's answer
                answer = {"probe_exception": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc(limit=8)}
        self.steps[name] = {"answer": self.norm(answer), "sql": list(SENT), "seconds": round(time.monotonic() - t, 3)}

    def response(self, status: int, body: Any, keep: Callable[[Any], Any] = lambda b: b) -> dict[str, Any]:
        """A response as an answer: the status, and the body (or the error) as Superset gave it."""
        if status >= 400 or not isinstance(body, dict):
            return {"status": status, "error": body}
        return {"status": status, "body": keep(body)}

    # -- the steps ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        uri = self.conf["uri"]
        extra = json.dumps({"allows_virtual_table_explore": True, "metadata_params": {}, "engine_params": {},
                            "schemas_allowed_for_file_upload": []})

        def test_connection() -> Any:
            status, body = self.api.call("POST", "/api/v1/database/test_connection/", {
                "database_name": self.database_name, "sqlalchemy_uri": uri, "impersonate_user": False,
                "extra": extra, "configuration_method": "sqlalchemy_form", "masked_encrypted_extra": "{}"})
            return self.response(status, body)

        def create_database() -> Any:
            status, body = self.api.call("POST", "/api/v1/database/", {
                "database_name": self.database_name, "sqlalchemy_uri": uri, "configuration_method": "sqlalchemy_form",
                "expose_in_sqllab": True, "allow_run_async": False, "allow_ctas": False, "allow_cvas": False,
                "allow_dml": False, "allow_file_upload": False, "impersonate_user": False, "extra": extra})
            if status == 201 and isinstance(body, dict):
                self.db_id = body["id"]
                with self.app.app_context():
                    from superset.extensions import db
                    from superset.models.core import Database

                    # what the UI's catalog dropdown preselects: current_database()
                    self.catalog = db.session.get(Database, self.db_id).get_default_catalog()
                if self.catalog:
                    self.norm = Normalizer({self.schema: "<schema>", self.database_name: "<database>",
                                            self.catalog: "<catalog>"})
            return self.response(status, body, self.database_view)

        def schemas() -> Any:
            status, body = self.api.call("GET", f"/api/v1/database/{self.db_id}/schemas/?q=(force:!f)")
            return self.response(status, body, self.schema_list)

        def tables() -> Any:
            q = f"(force:!f,schema_name:{rison_str(self.schema)})"
            status, body = self.api.call("GET", f"/api/v1/database/{self.db_id}/tables/?q={q}")
            return self.response(status, body)

        def table_metadata() -> Any:
            status, body = self.api.call(
                "GET", f"/api/v1/database/{self.db_id}/table_metadata/?name={self.table}&schema={self.schema}")
            return self.response(status, body)

        def table_metadata_extra() -> Any:
            status, body = self.api.call(
                "GET", f"/api/v1/database/{self.db_id}/table_metadata/extra/?name={self.table}&schema={self.schema}")
            return self.response(status, body)

        def create_dataset() -> Any:
            status, body = self.api.call("POST", "/api/v1/dataset/", {
                "database": self.db_id, "catalog": self.catalog, "schema": self.schema, "table_name": self.table})
            if status == 201 and isinstance(body, dict):
                self.dataset_id = body["id"]
                self.dataset_by_api = True
            return self.response(status, body)

        def get_dataset() -> Any:
            if not self.dataset_by_api:
                return {"not_run": "POST /api/v1/dataset/ did not create the dataset"}
            status, body = self.api.call("GET", f"/api/v1/dataset/{self.dataset_id}")
            return self.response(status, body, self.dataset_view)

        def refresh_dataset() -> Any:
            status, body = self.api.call("PUT", f"/api/v1/dataset/{self.dataset_id}/refresh")
            answer = self.response(status, body)
            # what the refresh left: the dataset's columns read again
            s2, b2 = self.api.call("GET", f"/api/v1/dataset/{self.dataset_id}")
            answer["dataset_after_refresh"] = self.response(s2, b2, self.dataset_view)
            return answer

        self.step("test_connection", test_connection)
        self.step("create_database", create_database)
        self.step("schemas", schemas, ("db_id",))
        self.step("tables", tables, ("db_id",))
        self.step("table_metadata", table_metadata, ("db_id",))
        self.step("table_metadata_extra", table_metadata_extra, ("db_id",))
        self.step("create_dataset", create_dataset, ("db_id",))
        if self.dataset_id is None and self.db_id is not None and self.reference is not None:
            self.copy_reference_dataset()
        self.step("get_dataset", get_dataset, ("dataset_id",))
        self.step("refresh_dataset", refresh_dataset, ("dataset_id",))
        self.chart_steps()
        self.sqllab_steps()
        self.definition = self.dataset_definition()
        self.delete_dataset()
        return {"database_name": self.database_name, "catalog": self.catalog, "steps": self.steps,
                "notes": self.notes}

    def dataset_definition(self) -> dict[str, Any] | None:
        """This database's dataset as plain data: what `copy_reference_dataset` needs."""
        if self.dataset_id is None:
            return None
        with self.app.app_context():
            from superset.connectors.sqla.models import SqlaTable, SqlMetric, TableColumn
            from superset.extensions import db

            ds = db.session.get(SqlaTable, self.dataset_id)
            # every field Superset's own dataset export carries
            return {
                "table": {f: getattr(ds, f) for f in SqlaTable.export_fields
                          if f not in ("table_name", "schema", "catalog", "database_id")},
                "columns": [{f: getattr(c, f) for f in TableColumn.update_from_object_fields} for c in ds.columns],
                "metrics": [{f: getattr(m, f) for f in SqlMetric.update_from_object_fields} for m in ds.metrics],
            }

    def copy_reference_dataset(self) -> None:
        """The API did not create the dataset: make the same one as the first database's,
        through Superset's models (no reflection), so that the chart steps can still run."""
        if self.reference is None or self.reference.definition is None:
            return
        ref = self.reference.definition
        with self.app.app_context():
            from superset.connectors.sqla.models import SqlaTable, SqlMetric, TableColumn
            from superset.extensions import db

            copy = SqlaTable(table_name=self.table, schema=self.schema, catalog=self.catalog, database_id=self.db_id,
                             **ref["table"])
            copy.columns = [TableColumn(**c) for c in ref["columns"]]
            copy.metrics = [SqlMetric(**m) for m in ref["metrics"]]
            db.session.add(copy)
            db.session.commit()
            self.dataset_id = copy.id
        self.notes.append("POST /api/v1/dataset/ failed: the chart steps ran on a copy of the "
                          f"{self.reference.name} dataset made through Superset's models")

    def delete_dataset(self) -> None:
        """Superset's migrations leave SQLite's `tables` with UNIQUE (table_name) (a constraint
        they drop by a name SQLite never gave it), so one metadata database holds one dataset
        per table name: this database's goes before the next database's is created."""
        if self.dataset_id is None:
            return
        status, body = self.api.call("DELETE", f"/api/v1/dataset/{self.dataset_id}")
        if status != 200:
            raise RuntimeError(f"deleting the dataset of {self.name} failed: {status} {body}")

    def chart_steps(self) -> None:
        time_range = self.spec["time_range"]
        count_sum_avg = ["count", metric_simple("SUM", "amount"), metric_simple("AVG", "amount")]

        def chart(query: dict[str, Any], viz_type: str) -> Callable[[], Any]:
            def run() -> Any:
                assert self.dataset_id is not None
                status, body = self.api.call("POST", "/api/v1/chart/data", chart_request(self.dataset_id, query, viz_type))
                return self.response(status, body, self.chart_view)
            return run

        self.step("chart_groupby", chart({
            "columns": ["status"], "metrics": count_sum_avg, "orderby": [["count", False]], "row_limit": 1000,
        }, "table"), ("dataset_id",))

        def timeseries(column: str, grain: str) -> dict[str, Any]:
            return {
                "columns": [base_axis(column, grain)], "metrics": ["count", metric_simple("SUM", "amount")],
                "orderby": [["count", False]], "time_range": time_range,
                "filters": [{"col": column, "op": "TEMPORAL_RANGE", "val": time_range}],
                "extras": {"having": "", "where": "", "time_grain_sqla": grain},
                "post_processing": [
                    {"operation": "pivot", "options": {"index": [column], "columns": [], "drop_missing_columns": False,
                                                       "aggregates": {"count": {"operator": "mean"},
                                                                      "SUM(amount)": {"operator": "mean"}}}},
                    {"operation": "flatten"},
                ],
            }

        self.step("chart_timeseries_day", chart(timeseries("created_at", "P1D"), "echarts_timeseries_line"),
                  ("dataset_id",))
        self.step("chart_timeseries_week", chart(timeseries("created_on", "P1W"), "echarts_timeseries_line"),
                  ("dataset_id",))
        self.step("chart_timeseries_month", chart(timeseries("created_at", "P1M"), "echarts_timeseries_bar"),
                  ("dataset_id",))

        self.step("chart_series_limit", chart({
            "columns": [base_axis("created_at", "P1W"), "status"], "series_columns": ["status"],
            "metrics": ["count"], "orderby": [["count", False]], "series_limit": 3, "series_limit_metric": "count",
            "order_desc": True, "time_range": time_range,
            "filters": [{"col": "created_at", "op": "TEMPORAL_RANGE", "val": time_range}],
            "extras": {"having": "", "where": "", "time_grain_sqla": "P1W"},
            "post_processing": [
                {"operation": "pivot", "options": {"index": ["created_at"], "columns": ["status"],
                                                   "aggregates": {"count": {"operator": "mean"}},
                                                   "drop_missing_columns": False}},
                {"operation": "rename", "options": {"columns": {"count": None}, "level": 0, "inplace": True}},
                {"operation": "flatten"},
            ],
        }, "echarts_timeseries_line"), ("dataset_id",))

        def filter_values(column: str) -> Callable[[], Any]:
            def run() -> Any:
                status, body = self.api.call(
                    "GET", f"/api/v1/datasource/table/{self.dataset_id}/column/{column}/values/")
                # DISTINCT without ORDER BY: the order is the database's
                return self.response(status, body, lambda b: {**b, "result": sort_rows(b.get("result"))})
            return run

        self.step("filter_values_status", filter_values("status"), ("dataset_id",))
        self.step("filter_values_customer_id", filter_values("customer_id"), ("dataset_id",))

    def sqllab_steps(self) -> None:
        limit = int(self.spec["sqllab_limit"])

        def execute(sql: str, query_limit: int | None) -> tuple[int, Any]:
            """What SQL Lab posts for Run: a query in the editor with its row limit, or (no
            limit, no editor) the preview of a table."""
            body: dict[str, Any] = {
                "client_id": secrets.token_hex(5)[:10], "database_id": self.db_id, "runAsync": False,
                "catalog": self.catalog, "schema": self.schema, "sql": sql, "expand_data": True}
            if query_limit is not None:
                body.update({"sql_editor_id": "1", "tab": "Untitled Query 1", "tmp_table_name": "",
                             "select_as_cta": False, "ctas_method": "TABLE", "queryLimit": query_limit,
                             "templateParams": "{}"})
            else:
                body.update({"sql_editor_id": None, "tab": ""})
            return self.api.call("POST", "/api/v1/sqllab/execute/", body)

        def schema_dropdown() -> Any:
            q = "(force:!t" + (f",catalog:{rison_str(self.catalog)}" if self.catalog else "") + ")"
            status, body = self.api.call("GET", f"/api/v1/database/{self.db_id}/schemas/?q={q}")
            return self.response(status, body, self.schema_list)

        def sqllab_query() -> Any:
            status, body = execute(self.spec["sqllab_sql"], limit)
            return self.response(status, body, self.sqllab_view)

        def table_preview() -> Any:
            status, body = self.api.call("GET", f"/api/v1/database/{self.db_id}/select_star/{self.table}/{self.schema}/")
            answer: dict[str, Any] = {"select_star": self.response(status, body)}
            if status == 200 and isinstance(body, dict):
                s2, b2 = execute(body["result"], None)
                answer["preview"] = self.response(s2, b2, self.preview_view)
            return answer

        self.step("sqllab_schema_dropdown", schema_dropdown, ("db_id",))
        self.step("sqllab_query", sqllab_query, ("db_id",))
        self.step("sqllab_table_preview", table_preview, ("db_id",))

    # -- views of the bodies -----------------------------------------------------------------

    def database_view(self, body: dict[str, Any]) -> dict[str, Any]:
        """The saved connection, without each URI's own parameters."""
        return {**body, "result": without_connection(body.get("result") or {})}

    def schema_list(self, body: dict[str, Any]) -> dict[str, Any]:
        own = set(self.conf.get("own_schemas", []))
        # sorted as shown once the schema name is normalized
        names = [self.norm.text(s) for s in body.get("result", []) if s not in own]
        return {**body, "result": sorted(names)}

    def dataset_view(self, body: dict[str, Any]) -> Any:
        result = dict(body.get("result") or {})
        # the database the dataset is on: its backend and name are what the UI shows
        if isinstance(result.get("database"), dict):
            result["database"] = {k: v for k, v in result["database"].items() if k in ("backend",)}
        # Superset's object lists are in the order of their ids: columns by name
        for key in ("columns", "metrics"):
            if isinstance(result.get(key), list):
                result[key] = sorted(result[key], key=lambda c: str(c.get("column_name") or c.get("metric_name")))
        return {**body, "result": result}

    def chart_view(self, body: dict[str, Any]) -> Any:
        out = []
        for r in body.get("result", []):
            r = dict(r)
            r.pop("annotation_data", None)
            out.append(r)
        return {**body, "result": out}

    def sqllab_view(self, body: dict[str, Any]) -> Any:
        body = dict(body)
        query = dict(body.get("query") or {})
        body["query"] = {k: query.get(k) for k in ("state", "rows", "limit", "limitingFactor", "schema", "sql",
                                                    "executedSql", "errorMessage", "catalog") if k in query}
        return body

    def preview_view(self, body: dict[str, Any]) -> Any:
        """The preview's SELECT has no ORDER BY, so which rows come back is the database's
        choice: its rows are checked against the whole table as SQL Lab shows it on the first
        database (`table_as_shown`), and the answer says how many came back and which of them
        are not rows of the table."""
        body = self.sqllab_view(body)
        rows = body.pop("data", None)
        if not isinstance(rows, list):
            return {**body, "data": rows}
        key = self.spec["key"]
        truth = (self.reference or self).table_as_shown()
        body["rowcount"] = len(rows)
        body["distinct_keys"] = len({json.dumps(r.get(key)) for r in rows})
        body["rows_not_in_table"] = [r for r in rows if truth.get(json.dumps(r.get(key))) != r][:5]
        return body

    def table_as_shown(self) -> dict[str, Any]:
        """Every row of the table as SQL Lab shows it on this database, by key (read once)."""
        if self._table_as_shown is None:
            sql = f"SELECT * FROM {self.table} ORDER BY {self.spec['key']}"
            status, body = self.api.call("POST", "/api/v1/sqllab/execute/", {
                "client_id": secrets.token_hex(5), "database_id": self.db_id, "runAsync": False,
                "catalog": self.catalog, "schema": self.schema, "sql": sql, "queryLimit": 100000,
                "expand_data": True, "templateParams": "{}"})
            if status != 200 or not isinstance(body, dict):
                raise RuntimeError(f"reading the whole table through SQL Lab failed: {status} {body}")
            self._table_as_shown = {json.dumps(r.get(self.spec["key"])): r for r in body["data"]}
        return self._table_as_shown


def main() -> int:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    home = tempfile.mkdtemp(prefix="skippr-superset-")
    try:
        t = time.monotonic()
        app, timings = start_superset(home)
        api = Api(app)
        timings["total"] = time.monotonic() - t
        import superset

        out: dict[str, Any] = {"superset_version": getattr(superset, "__version__", None) or app.config.get("VERSION_STRING"),
                               "setup_seconds": {k: round(v, 2) for k, v in timings.items()}, "databases": {}}
        reference: Workflow | None = None
        for name, conf in spec["databases"].items():
            t = time.monotonic()
            wf = Workflow(app, api, name, conf, spec, reference)
            out["databases"][name] = wf.run()
            out["databases"][name]["seconds"] = round(time.monotonic() - t, 2)
            reference = reference or wf
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True, default=str)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
