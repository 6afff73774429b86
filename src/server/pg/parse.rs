//! Gateway, Postgres imitation, parsing: the Postgres-compatibility parser's rewrites, except the one that
//! answers a scalar subquery in a select list with NULL when it looks correlated (it counts a
//! bound parameter or a table named without an alias as a correlation), which silently
//! changed answers. Those subqueries are kept, rewritten like the rest of the statement, and
//! planned by the engine, which decorrelates them (or refuses, with a clear error, the
//! correlations it cannot). Statements over the emulated catalog keep the parser's answer.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_relations, Expr, Function, FunctionArgumentList, FunctionArguments, Ident, ObjectName,
    Query, SelectItem, SetExpr, Statement, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;

/// The name of the stand-in for the `n`-th subquery taken out of a select list.
fn marker(n: usize) -> String {
    format!("__skippr_select_subquery_{n}")
}

/// Parses `sql` as the compatibility parser does, keeping scalar subqueries in select lists.
pub fn parse(
    parser: &PostgresCompatibilityParser,
    sql: &str,
) -> Result<Vec<Statement>, ParserError> {
    let compat = parser.parse(sql)?;
    let Ok(plain) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Ok(compat);
    };
    // Client introspection (psql's `\d`, drivers' metadata queries) reads the emulated
    // catalog with correlations the engine cannot plan, and expects what it always got.
    if !plain.iter().any(has_select_subquery) || plain.iter().any(reads_catalog) {
        return Ok(compat);
    }
    // A known client query that the parser replaced whole stays replaced.
    let rules_only: Vec<Statement> = plain.iter().cloned().map(|s| parser.rewrite(s)).collect();
    if rules_only != compat {
        return Ok(compat);
    }
    Ok(plain
        .into_iter()
        .map(|s| rewrite_keeping_subqueries(parser, s))
        .collect())
}

/// Whether `s` reads a `pg_catalog` or `information_schema` relation.
fn reads_catalog(s: &Statement) -> bool {
    let mut found = false;
    let _ = visit_relations(s, |name| {
        let parts: Vec<String> = name
            .0
            .iter()
            .filter_map(|p| p.as_ident().map(|i| i.value.to_ascii_lowercase()))
            .collect();
        if parts
            .iter()
            .any(|p| p == "pg_catalog" || p == "information_schema" || p.starts_with("pg_"))
        {
            found = true;
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    found
}

fn has_select_subquery(s: &Statement) -> bool {
    let mut found = false;
    let mut visitor = Finder(&mut found);
    let mut copy = s.clone();
    let _ = copy.visit(&mut visitor);
    found
}

struct Finder<'a>(&'a mut bool);

impl VisitorMut for Finder<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_ref() {
            if select.projection.iter().any(|item| {
                matches!(
                    item,
                    SelectItem::UnnamedExpr(Expr::Subquery(_))
                        | SelectItem::ExprWithAlias {
                            expr: Expr::Subquery(_),
                            ..
                        }
                )
            }) {
                *self.0 = true;
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

/// Applies the parser's rules to `s` with its select-list subqueries set aside, then puts
/// them back, each rewritten the same way.
fn rewrite_keeping_subqueries(parser: &PostgresCompatibilityParser, mut s: Statement) -> Statement {
    let mut taken = Vec::new();
    let _ = s.visit(&mut Take(&mut taken));
    let mut s = parser.rewrite(s);
    if taken.is_empty() {
        return s;
    }
    let restored: Vec<Option<Box<Query>>> = taken
        .into_iter()
        .map(
            |q| match rewrite_keeping_subqueries(parser, Statement::Query(Box::new(q))) {
                Statement::Query(q) => Some(q),
                _ => None,
            },
        )
        .collect();
    let _ = s.visit(&mut Restore(restored));
    s
}

/// Moves each scalar subquery of a select list out, leaving a marker call in its place.
struct Take<'a>(&'a mut Vec<Query>);

impl VisitorMut for Take<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_mut() {
            for item in &mut select.projection {
                let expr = match item {
                    SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
                    _ => continue,
                };
                if matches!(expr, Expr::Subquery(_)) {
                    let call = marker_call(self.0.len());
                    if let Expr::Subquery(q) = std::mem::replace(expr, call) {
                        self.0.push(*q);
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

fn marker_call(n: usize) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(marker(n))]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![],
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// Puts the subqueries back where their markers are.
struct Restore(Vec<Option<Box<Query>>>);

impl VisitorMut for Restore {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = expr {
            let name = f.name.to_string();
            if let Some(n) = name
                .strip_prefix("__skippr_select_subquery_")
                .and_then(|n| n.parse::<usize>().ok())
            {
                if let Some(q) = self.0.get_mut(n).and_then(Option::take) {
                    *expr = Expr::Subquery(q);
                }
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str) -> String {
        let parser = PostgresCompatibilityParser::new();
        parse(&parser, text)
            .map(|s| {
                s.iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn select_list_subqueries_are_kept() {
        let got = sql("SELECT (SELECT count(*) FROM t WHERE id = $1) AS a");
        assert!(
            got.contains("SELECT count(*) FROM t WHERE id = $1"),
            "{got}"
        );
        let got = sql(
            "SELECT o.id, (SELECT max(i.n) FROM items i WHERE i.order_id = o.id) FROM orders o",
        );
        assert!(got.contains("WHERE i.order_id = o.id"), "{got}");
        assert!(!got.contains("NULL"), "{got}");
        let got = sql(
            "SELECT (SELECT (SELECT x FROM u WHERE u.k = $2) FROM t WHERE t.id = $1) AS nested",
        );
        assert!(
            got.contains("u.k = $2") && got.contains("t.id = $1"),
            "{got}"
        );
        assert!(!got.contains("__skippr"), "{got}");
    }

    #[test]
    fn other_statements_parse_as_before() {
        let parser = PostgresCompatibilityParser::new();
        for text in [
            "SELECT 1",
            "SELECT a FROM t WHERE b IN (SELECT c FROM u)",
            "SELECT n.nspname FROM pg_catalog.pg_namespace n",
        ] {
            let ours = parse(&parser, text).map_err(|e| e.to_string());
            let theirs = parser.parse(text).map_err(|e| e.to_string());
            assert_eq!(ours, theirs, "{text}");
        }
    }
}
