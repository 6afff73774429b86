"""What SQLAlchemy's Postgres dialect reflects, as JSON: the probe tests/test_reflection.py runs
against the source Postgres and against `skipprd serve`, in each SQLAlchemy version it tests
(1.4, 2.0, 2.1), and compares.

    python reflection_probe.py URL SCHEMA=REL[,REL...] [SCHEMA=REL[,REL...] ...]

For every relation it runs each Inspector call a BI tool makes (`get_columns`,
`get_pk_constraint`, `get_foreign_keys`, `get_indexes`, `get_unique_constraints`,
`get_check_constraints`, `get_table_comment`, `get_view_definition`, `has_table`, and in 2.x
`has_index`), for every schema the listings (`get_table_names`, `get_view_names`,
`get_foreign_table_names`, and in 2.x `get_materialized_view_names`, `has_schema` and every
`get_multi_*`, once for the schema's tables and once for the named relations of any kind), a
`MetaData.reflect` of the named relations (what `Table(..., autoload_with=engine)` gives), and
`get_schema_names`. Types are printed with `repr`, defaults as text.

Each call is run on its own: an exception is recorded as its result (`{"error": ...}`) and the
next call goes on. SQLAlchemy warnings raised by a call (such as "Did not recognize type") are
part of its result. The SQL each call sent is printed under the top-level key `sql` (not part of
any result), so a failing comparison can show it.

Runs under SQLAlchemy 1.4, 2.0 and 2.1 with psycopg2 or psycopg (the URL's driver).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any, Callable

import sqlalchemy as sa

SA_VERSION = tuple(int(p) for p in sa.__version__.split(".")[:2])
IS_2X = SA_VERSION >= (2, 0)

#: Recorded statements: call label -> [sql, ...].
_SQL: dict[str, list[str]] = {}
_current: list[str] = ["(connect)"]


def plain(value: Any) -> Any:
    """A JSON-able copy of a reflection result: types and clauses as their repr/text, tuples
    as lists, dict keys as strings (2.x multi results are keyed by `(schema, name)`)."""
    if isinstance(value, dict):
        return {_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, sa.types.TypeEngine):
        return repr(value)
    if isinstance(value, sa.sql.ClauseElement):
        return str(value)
    return repr(value)


def _key(k: Any) -> str:
    if isinstance(k, tuple):
        # (schema, name): the schema part is the one the call was given, or None
        return ".".join("" if p is None else str(p) for p in k)
    return str(k)


def _error(exc: BaseException) -> dict[str, str]:
    orig = getattr(exc, "orig", None)
    source = orig if orig is not None else exc
    text = str(source).strip()
    return {"error": f"{type(source).__name__}: {text[:2000]}"}


def run(label: str, fn: Callable[[], Any]) -> Any:
    """Runs one reflection call; its result, warnings and SQL recorded under `label`."""
    _current[0] = label
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = plain(fn())
        except Exception as exc:  # every failure is an answer to compare
            result = _error(exc)
    _current[0] = "(between calls)"
    found = sorted({str(w.message) for w in caught if issubclass(w.category, sa.exc.SAWarning)})
    if found:
        return {"result": result, "warnings": found}
    return result


def table_summary(t: sa.Table) -> dict[str, Any]:
    """What a reflected Table holds: columns, constraints, indexes, comment."""
    cols = []
    for c in t.columns:
        d: dict[str, Any] = {
            "name": c.name,
            "type": repr(c.type),
            "nullable": c.nullable,
            "primary_key": c.primary_key,
            "server_default": None if c.server_default is None else str(getattr(c.server_default, "arg", c.server_default)),
            "autoincrement": c.autoincrement,
            "comment": c.comment,
        }
        identity = getattr(c, "identity", None)
        if identity is not None:
            d["identity"] = repr(identity)
        if getattr(c, "computed", None) is not None:
            d["computed"] = str(c.computed.sqltext)
        cols.append(d)
    constraints = []
    for con in t.constraints:
        d = {"kind": type(con).__name__, "name": None if con.name is None else str(con.name),
             "columns": [c.name for c in con.columns] if hasattr(con, "columns") else None}
        if isinstance(con, sa.CheckConstraint):
            d["sqltext"] = str(con.sqltext)
        if isinstance(con, sa.ForeignKeyConstraint):
            d["refers_to"] = [e.target_fullname for e in con.elements]
        constraints.append(d)
    constraints.sort(key=lambda d: (d["kind"], d["name"] or "", d["columns"] or []))
    indexes = [{"name": i.name, "unique": i.unique, "columns": [c.name for c in i.columns],
                "dialect_kwargs": plain(dict(i.dialect_kwargs))} for i in t.indexes]
    indexes.sort(key=lambda d: d["name"] or "")
    return {"name": t.name, "schema": t.schema, "columns": cols, "constraints": constraints,
            "indexes": indexes, "comment": t.comment}


def probe(url: str, groups: list[tuple[str, list[str]]]) -> dict[str, Any]:
    engine = sa.create_engine(url)

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        _SQL.setdefault(_current[0], []).append(f"{statement}\n-- parameters: {parameters!r}")

    insp = sa.inspect(engine)
    out: dict[str, Any] = {
        "sqlalchemy": sa.__version__,
        "driver": engine.dialect.driver,
        "database": {"get_schema_names": run("get_schema_names", insp.get_schema_names)},
        "schemas": {},
        "relations": {},
    }
    for schema, rels in groups:
        s: dict[str, Any] = {}
        s["get_table_names"] = run(f"{schema}: get_table_names", lambda: insp.get_table_names(schema=schema))
        s["get_view_names"] = run(f"{schema}: get_view_names", lambda: insp.get_view_names(schema=schema))
        s["get_foreign_table_names"] = run(f"{schema}: get_foreign_table_names",
                                           lambda: insp.get_foreign_table_names(schema=schema))
        if IS_2X:
            from sqlalchemy.engine.reflection import ObjectKind

            s["has_schema"] = run(f"{schema}: has_schema", lambda: insp.has_schema(schema))
            s["get_materialized_view_names"] = run(f"{schema}: get_materialized_view_names",
                                                   lambda: insp.get_materialized_view_names(schema=schema))
            for name in ("columns", "pk_constraint", "foreign_keys", "indexes", "unique_constraints",
                         "check_constraints", "table_comment"):
                fn = getattr(insp, f"get_multi_{name}")
                # the schema's tables (the default kind), then the named relations of any kind
                s[f"get_multi_{name}"] = run(f"{schema}: get_multi_{name}", lambda fn=fn: fn(schema=schema))
                s[f"get_multi_{name}(kind=ANY, filter_names)"] = run(
                    f"{schema}: get_multi_{name}(kind=ANY, filter_names)",
                    lambda fn=fn: fn(schema=schema, filter_names=rels, kind=ObjectKind.ANY))

        def reflect() -> dict[str, Any]:
            md = sa.MetaData()
            md.reflect(bind=engine, schema=schema, views=True, only=rels)
            return {t.name: table_summary(t) for t in md.tables.values()}

        s["MetaData.reflect"] = run(f"{schema}: MetaData.reflect", reflect)
        s["has_table(missing)"] = run(f"{schema}: has_table(missing)",
                                      lambda: insp.has_table("no_such_relation", schema=schema))
        out["schemas"][schema] = s

        for rel in rels:
            r: dict[str, Any] = {}
            for call in ("get_columns", "get_pk_constraint", "get_foreign_keys", "get_indexes",
                         "get_unique_constraints", "get_check_constraints", "get_table_comment",
                         "get_view_definition"):
                fn = getattr(insp, call)
                r[call] = run(f"{schema}.{rel}: {call}", lambda fn=fn: fn(rel, schema=schema))
            r["has_table"] = run(f"{schema}.{rel}: has_table", lambda: insp.has_table(rel, schema=schema))
            if IS_2X:
                # the name Postgres gives a primary key's index: get_indexes leaves it out
                r["has_index(<rel>_pkey)"] = run(f"{schema}.{rel}: has_index(<rel>_pkey)",
                                                 lambda: insp.has_index(rel, f"{rel}_pkey", schema=schema))
            out["relations"][f"{schema}.{rel}"] = r
    engine.dispose()
    out["sql"] = _SQL
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    groups = []
    for arg in argv[2:]:
        schema, _, rels = arg.partition("=")
        groups.append((schema, [r for r in rels.split(",") if r]))
    json.dump(probe(argv[1], groups), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
