//! Gateway, known client catalog queries the query engine cannot run as written, answered
//! from Skippr's own metadata. pgjdbc's `DatabaseMetaData.getPrimaryKeys` expands
//! `pg_index.indkey` with the set-returning `information_schema._pg_expandarray`; the query
//! is recognised and replaced by an equivalent one over the tables' recorded keys.

use crate::query::Workspace;
use crate::sink::iceberg::PROP_PRIMARY_KEY;

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
    if !(sql.contains("_pg_expandarray") && sql.contains("indisprimary")) {
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
            let key = props.get(PROP_PRIMARY_KEY).cloned().unwrap_or_default();
            for (i, col) in key.split(',').filter(|c| !c.is_empty()).enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

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
