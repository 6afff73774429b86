//! Unit tests of SQL rewriting: regclass casts, oid arrays and regtype, correlated scalar
//! subqueries, set-returning array functions, and SQL left alone.

use super::*;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// What the rewrites alone make of `s` (the naming of result columns has its own tests):
/// the SQL they give when anything changed, and what they found.
struct Rewrote {
    sql: Option<String>,
    declared: HashMap<usize, Type>,
    uses_relations: bool,
}

fn rewrite(s: &str) -> Rewrote {
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, s).unwrap_or_default();
    let r = rewrite_parsed(&mut statements, false);
    Rewrote {
        sql: r.changed.then(|| {
            statements
                .iter()
                .map(Statement::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        }),
        declared: r.declared,
        uses_relations: r.uses_relations,
    }
}

fn sql(s: &str) -> String {
    rewrite(s).sql.unwrap_or_else(|| s.to_string())
}

#[test]
fn regclass_casts_become_lookups() {
    assert_eq!(
        sql("SELECT 1 FROM d WHERE d.classoid = 'pg_class'::regclass"),
        "SELECT 1 FROM d WHERE d.classoid = skippr_regclass('pg_class')"
    );
    assert_eq!(
        sql("SELECT CAST(CAST(FORMAT('%I.%I', s, t) AS REGCLASS) AS OID)"),
        "SELECT skippr_regclass(FORMAT('%I.%I', s, t))"
    );
    assert_eq!(
        sql("SELECT pg_get_serial_sequence(CAST(CAST(a.attrelid AS REGCLASS) AS TEXT), a.attname)"),
        "SELECT pg_get_serial_sequence(skippr_regclass_name(a.attrelid), a.attname)"
    );
    assert_eq!(
        sql("SELECT c.oid::pg_catalog.regclass FROM c"),
        "SELECT skippr_regclass(c.oid) FROM c"
    );
    let r = rewrite("SELECT 1 WHERE x = 'a'::regclass");
    assert!(r.uses_relations);
    assert!(!rewrite("SELECT 1").uses_relations);
}

#[test]
fn oid_arrays_and_regtype() {
    let r = rewrite("SELECT * FROM t WHERE t.oid = any($1::oid[])");
    assert_eq!(
        r.sql.as_deref(),
        Some("SELECT * FROM t WHERE t.oid = ANY(CAST($1 AS INT[]))")
    );
    assert_eq!(r.declared.get(&0), Some(&Type::OID_ARRAY));
    assert_eq!(
        sql("SELECT 'int4'::regtype, t::regtype::text FROM x"),
        "SELECT to_regtype('int4'), format_type(t, NULL) FROM x"
    );
    assert_eq!(rewrite("SELECT $2::oid").declared.get(&1), Some(&Type::OID));
}

#[test]
fn correlated_scalar_subqueries_are_aggregated() {
    assert_eq!(
        sql("SELECT CASE WHEN a.x THEN (SELECT d.v AS v FROM d WHERE d.id = a.id) END FROM a"),
        "SELECT CASE WHEN a.x THEN (SELECT max(d.v) AS v FROM d WHERE d.id = a.id) END FROM a"
    );
    assert_eq!(
        sql("SELECT (SELECT pg_catalog.t.n FROM pg_catalog.t WHERE pg_catalog.t.oid = pg_catalog.a.typ) FROM pg_catalog.a"),
        "SELECT (SELECT max(pg_catalog.t.n) FROM pg_catalog.t WHERE pg_catalog.t.oid = pg_catalog.a.typ) FROM pg_catalog.a"
    );
    assert_eq!(
        sql("SELECT CASE WHEN a.h THEN (SELECT d.v FROM d WHERE a.h AND d.id = a.id AND (a.k <> '' AND d.n = 1)) END FROM a"),
        "SELECT CASE WHEN a.h THEN CASE WHEN a.h AND a.k <> '' THEN (SELECT max(d.v) FROM d WHERE d.id = a.id AND d.n = 1) END END FROM a"
    );
    assert_eq!(
        sql("SELECT (SELECT f('x', a.k = 'a', d.v) FROM d WHERE d.id = a.id) FROM a"),
        "SELECT CASE WHEN (a.k = 'a') THEN (SELECT max(f('x', true, d.v)) FROM d WHERE d.id = a.id) \
         WHEN NOT (a.k = 'a') THEN (SELECT max(f('x', false, d.v)) FROM d WHERE d.id = a.id) \
         ELSE (SELECT max(f('x', NULL, d.v)) FROM d WHERE d.id = a.id) END FROM a"
    );
    for s in [
        "SELECT (SELECT count(*) FROM d WHERE d.id = a.id) FROM a",
        "SELECT (SELECT d.v FROM d WHERE d.id = 1) FROM a",
        "SELECT (SELECT d.v FROM d WHERE d.id = a.id LIMIT 1) FROM a",
    ] {
        assert_eq!(rewrite(s).sql, None, "{s}");
    }
}

#[test]
fn set_returning_array_functions_unnest_lists() {
    assert_eq!(
        sql("SELECT unnest(i.indkey) AS a, generate_subscripts(i.indkey, 1) AS o FROM i"),
        "SELECT unnest(i.indkey) AS a, unnest(skippr_subscripts(i.indkey, 1)) AS o FROM i"
    );
    assert_eq!(
        sql("SELECT (information_schema._pg_expandarray(i.indkey)).n AS k FROM i"),
        "SELECT (unnest(skippr_expandarray(i.indkey)))['n'] AS k FROM i"
    );
    assert_eq!(
        sql("SELECT 1 FROM r WHERE a = (r.keys).x"),
        "SELECT 1 FROM r WHERE a = (r.keys)['x']"
    );
    assert_eq!(rewrite("SELECT unnest(t.a), t.b.c FROM t").sql, None);
}

#[test]
fn other_sql_is_left_alone() {
    for s in [
        "SELECT a::text, CAST(b AS INT) FROM t",
        "SELECT * FROM t WHERE x = $1",
        "this is not sql",
    ] {
        assert_eq!(rewrite(s).sql, None, "{s}");
    }
}
