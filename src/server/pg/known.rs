//! Gateway, known client catalog queries the query engine cannot run as written, answered
//! from Skippr's own metadata. pgjdbc's `DatabaseMetaData.getPrimaryKeys` expands
//! `pg_index.indkey` with the set-returning `information_schema._pg_expandarray`; the query
//! is recognised and replaced by an equivalent one over the tables' recorded keys.
//! asyncpg's type introspection (a recursive query with correlated recursive subqueries)
//! is recognised by its shape and replaced by one that gives the same answer for the types
//! the gateway has (base types and their arrays: no domains, composites or ranges).

use std::sync::LazyLock;

use datafusion::sql::sqlparser::ast::{SetExpr, Statement};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::query::Workspace;

/// The value of `<column> = E'...'` (or `'...'`) in `sql`, unescaped.
fn literal_after(sql: &str, column: &str) -> Option<String> {
    sql.match_indices(column)
        .find_map(|(at, _)| literal_at(&sql[at + column.len()..]))
}

/// The literal of `= E'...'` at the start of `rest`.
fn literal_at(rest: &str) -> Option<String> {
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('=')?.trim_start();
    let rest = rest.strip_prefix('E').unwrap_or(rest);
    let rest = rest.strip_prefix('\'')?;
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if chars.peek() == Some(&'\'') => {
                chars.next();
                out.push('\'');
            }
            '\'' => return Some(out),
            '\\' => {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            c => out.push(c),
        }
    }
    None
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A replacement for `sql` when it is a known catalog query, or `None`.
pub async fn rewrite(sql: &str, ws: &Workspace) -> Option<String> {
    // getPrimaryKeys' query (it names its columns `KEY_SEQ` and `PK_NAME`); the other
    // queries over `_pg_expandarray` (getBestRowIdentifier, getIndexInfo) plan as written.
    if !(sql.contains("_pg_expandarray") && sql.contains("indisprimary") && sql.contains("PK_NAME"))
    {
        return None;
    }
    let schema = literal_after(sql, "n.nspname");
    let table = literal_after(sql, "ct.relname");
    let mut rows = Vec::new();
    if schema.as_deref().is_none_or(|s| s == ws.name) {
        for name in ws.table_names() {
            if table.as_deref().is_some_and(|t| t != name) {
                continue;
            }
            let Ok(Some((_, props))) = ws.table_meta(&name).await else {
                continue;
            };
            for (i, col) in crate::table::primary_key(&props).iter().enumerate() {
                rows.push(format!(
                    "({}, {}, {}, {}, {})",
                    quote_literal(&ws.name),
                    quote_literal(&name),
                    quote_literal(col),
                    i + 1,
                    quote_literal(&format!("{name}_pkey"))
                ));
            }
        }
    }
    let columns = "CAST(NULL AS VARCHAR) AS table_cat, CAST(s AS VARCHAR) AS table_schem, \
                   CAST(t AS VARCHAR) AS table_name, CAST(c AS VARCHAR) AS column_name, \
                   CAST(k AS SMALLINT) AS key_seq, CAST(p AS VARCHAR) AS pk_name";
    Some(if rows.is_empty() {
        format!(
            "SELECT {columns} FROM (VALUES ('', '', '', 0, '')) AS v(s, t, c, k, p) WHERE false"
        )
    } else {
        format!(
            "SELECT {columns} FROM (VALUES {}) AS v(s, t, c, k, p) ORDER BY table_name, pk_name, key_seq",
            rows.join(", ")
        )
    })
}

/// asyncpg's type introspection (`asyncpg/introspection.py`, `INTRO_LOOKUP_TYPES`): the
/// types with oid in `$1` (an `oid[]`), then the element types of the arrays among them.
/// Same columns and order as asyncpg's query; `kind` and `elemdelim` are text, the
/// composite attributes `text[]` (asyncpg has built-in codecs for both, so reading this
/// answer needs no further introspection). The built-in types' rows of `pg_type` carry
/// Postgres's own namespace oid, which the gateway's `pg_namespace` does not list: those
/// types are in `pg_catalog`.
const ASYNCPG_TYPES: &str = "\
WITH ti AS (
    SELECT t.oid AS oid, COALESCE(ns.nspname, 'pg_catalog') AS ns, t.typname AS name,
           t.typtype AS kind,
           CAST(NULL AS INT) AS basetype, t.typelem AS elemtype, elem_t.typdelim AS elemdelim,
           CAST(NULL AS INT) AS range_subtype, CAST(NULL AS TEXT[]) AS attrtypoids,
           CAST(NULL AS TEXT[]) AS attrnames
    FROM pg_catalog.pg_type AS t
    LEFT JOIN pg_catalog.pg_namespace AS ns ON ns.oid = t.typnamespace
    LEFT JOIN pg_catalog.pg_type AS elem_t
           ON t.typlen = -1 AND t.typelem <> 0 AND t.typelem = elem_t.oid
), requested AS (
    SELECT * FROM ti WHERE ti.oid = ANY($1::oid[])
), tree AS (
    SELECT requested.*, 0 AS depth FROM requested
    UNION ALL
    SELECT ti.*, 1 AS depth FROM ti
    WHERE ti.oid IN (SELECT elemtype FROM requested WHERE elemtype <> 0)
)
SELECT DISTINCT tree.*, CAST(NULL AS TEXT) AS basetype_name, e.typname AS elemtype_name,
       CAST(NULL AS TEXT) AS range_subtype_name
FROM tree LEFT JOIN pg_catalog.pg_type AS e ON e.oid = tree.elemtype AND tree.elemtype <> 0
ORDER BY depth DESC";

/// [`ASYNCPG_TYPES`], parsed once for the process.
static ASYNCPG_TYPES_PARSED: LazyLock<Option<Statement>> = LazyLock::new(|| {
    Parser::parse_sql(&PostgreSqlDialect {}, ASYNCPG_TYPES)
        .ok()
        .and_then(|mut s| (s.len() == 1).then(|| s.remove(0)))
});

/// The replacement of a client query with a known shape, or `None`.
pub fn replacement(statement: &Statement) -> Option<Statement> {
    let Statement::Query(query) = statement else {
        return None;
    };
    let with = query.with.as_ref()?;
    let asyncpg = with.recursive
        && with
            .cte_tables
            .iter()
            .any(|cte| cte.alias.name.value == "typeinfo_tree")
        && matches!(query.body.as_ref(), SetExpr::Select(_));
    if !asyncpg {
        return None;
    }
    let replacement = ASYNCPG_TYPES_PARSED.clone();
    if replacement.is_none() {
        tracing::warn!("a known client query's replacement does not parse; planning the original");
    }
    replacement
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_asyncpg_type_introspection() {
        let parse = |s: &str| Parser::parse_sql(&PostgreSqlDialect {}, s).map(|mut v| v.remove(0));
        let asyncpg = "WITH RECURSIVE typeinfo_tree(oid, depth) AS (\
            SELECT t.oid, 0 FROM pg_type t WHERE t.oid = any($1::oid[]) UNION ALL \
            SELECT t.oid, tt.depth + 1 FROM pg_type t, typeinfo_tree tt WHERE t.oid = tt.oid) \
            SELECT DISTINCT *, oid::regtype::text AS n FROM typeinfo_tree ORDER BY depth DESC";
        let Ok(statement) = parse(asyncpg) else {
            panic!("the test query does not parse");
        };
        assert_eq!(replacement(&statement), parse(ASYNCPG_TYPES).ok());
        assert!(parse(ASYNCPG_TYPES).is_ok());
        let Ok(other) = parse("WITH RECURSIVE t(n) AS (SELECT 1) SELECT * FROM t") else {
            panic!("the test query does not parse");
        };
        assert_eq!(replacement(&other), None);
    }

    #[test]
    fn reads_pgjdbc_literals() {
        let sql = "SELECT n.nspname AS x, ct.relname AS y WHERE true  AND n.nspname = E'analytics' AND ct.relname = E'o''k\\\\s' AND i.indisprimary";
        assert_eq!(
            literal_after(sql, "n.nspname").as_deref(),
            Some("analytics")
        );
        assert_eq!(literal_after(sql, "ct.relname").as_deref(), Some("o'k\\s"));
        assert_eq!(literal_after("no filter", "ct.relname"), None);
    }
}
