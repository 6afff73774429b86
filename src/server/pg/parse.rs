//! Gateway, the statement core: a client's SQL is tokenized once and parsed once, and the
//! parsed statements go on through the rewrites, the allow-list and the planner. Between
//! tokenizing and parsing, the token edits Postgres spellings need ([`super::table_command`]);
//! after parsing, the rewrites on the syntax tree ([`super::rewrite`]) and then the
//! Postgres-compatibility parser's rules, except the one that answers a scalar subquery in a
//! select list with NULL when it looks correlated (it counts a bound parameter or a table
//! named without an alias as a correlation), which silently changed answers. Those
//! subqueries are kept, rewritten like the rest of the statement, and planned by the engine,
//! which decorrelates them (or refuses, with a clear error, the correlations it cannot).
//! Statements over the emulated catalog keep the parser's answer.
//!
//! The compatibility parser also knows a few client catalog queries whole (psql's `\d`
//! ones), by their exact tokens, and answers them with queries of its own. Its list is its
//! own, so only it can tell: it is given the message's text too (a second tokenization and
//! parse) when the SQL names a `pg_` relation or function or reads a setting, as each of
//! those queries does (psql's `\d` in tests/test_gateway_clients.py goes through it). Every
//! other message is tokenized and parsed once.

use std::ops::ControlFlow;
use std::sync::LazyLock;

use datafusion::sql::sqlparser::ast::{
    visit_relations, Expr, Function, FunctionArgumentList, FunctionArguments, Ident, ObjectName,
    Query, SelectItem, SetExpr, Statement, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use super::rewrite::{rewrite_parsed, Rewritten};
use super::table_command;

/// The name of the stand-in for the `n`-th subquery taken out of a select list.
fn marker(n: usize) -> String {
    format!("__skippr_select_subquery_{n}")
}

/// A client's SQL, read: its statements ready to classify and plan, and what the rewrites
/// found on the way (parameter types declared by casts, relation lookups).
#[derive(Debug, Default)]
pub struct Parsed {
    pub statements: Vec<Statement>,
    pub rewritten: Rewritten,
}

/// Reads `sql` (one or more statements): tokenized once, edited, parsed once, rewritten
/// (catalog-shaped SQL is also given to the compatibility parser, see the module's doc).
pub fn read(sql: &str) -> Result<Parsed, ParserError> {
    let parser = compatibility_parser();
    let mut tokens = table_command::tokens(sql)?;
    let edits = table_command::edits(&tokens);
    // The text the compatibility parser would be given, edited as the tokens are.
    let asked = may_be_known_whole(&tokens)
        .then(|| table_command::apply_to_text(sql, &tokens, &edits))
        .flatten();
    table_command::apply(&mut tokens, &edits);
    let plain = Parser::new(&PostgreSqlDialect {})
        .with_tokens_with_locations(tokens)
        .parse_statements();
    if let Some(text) = asked {
        if let Ok(theirs) = parser.parse(&text) {
            let same = plain.as_ref().is_ok_and(|plain| {
                plain.len() == theirs.len()
                    && plain
                        .iter()
                        .zip(&theirs)
                        .all(|(p, t)| parser.rewrite(p.clone()) == *t)
            });
            if !same {
                // A client query it knows whole: its answer, as the client always got it.
                return Ok(Parsed {
                    statements: theirs,
                    rewritten: Rewritten::default(),
                });
            }
        }
    }
    let mut statements = plain?;
    let rewritten = rewrite_parsed(&mut statements, true);
    let statements = statements
        .into_iter()
        .map(|s| compatibility_rules(parser, s))
        .collect();
    Ok(Parsed {
        statements,
        rewritten,
    })
}

/// Whether the compatibility parser might know `tokens` whole: every query it knows names a
/// `pg_` relation or function, or reads a setting.
fn may_be_known_whole(tokens: &[TokenWithSpan]) -> bool {
    tokens.iter().any(|t| match &t.token {
        Token::Word(w) => {
            let v = w.value.as_bytes();
            v.len() >= 3 && v[..3].eq_ignore_ascii_case(b"pg_")
                || w.value.eq_ignore_ascii_case("current_setting")
        }
        _ => false,
    })
}

/// The compatibility parser's rules on `s`, keeping a select list's scalar subqueries
/// unless `s` reads the emulated catalog: client introspection (psql's `\d`, drivers'
/// metadata queries) reads it with correlations the engine cannot plan, and expects what it
/// always got.
fn compatibility_rules(parser: &PostgresCompatibilityParser, s: Statement) -> Statement {
    if has_select_subquery(&s) && !reads_catalog(&s) {
        rewrite_keeping_subqueries(parser, s)
    } else {
        parser.rewrite(s)
    }
}

/// The pg_catalog compatibility parser, one for the process: it is immutable once built,
/// and building it tokenizes every client query it knows (about half a MiB of tokens),
/// which a parser per connection held again for each of them.
pub fn compatibility_parser() -> &'static PostgresCompatibilityParser {
    static PARSER: LazyLock<PostgresCompatibilityParser> =
        LazyLock::new(PostgresCompatibilityParser::new);
    &PARSER
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
        read(text)
            .map(|p| {
                let s = p.statements;
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
        // As the compatibility parser reads them once the rewrites have been made.
        let parser = PostgresCompatibilityParser::new();
        for text in [
            "SELECT 1",
            "SELECT a FROM t WHERE b IN (SELECT c FROM u)",
            "SELECT n.nspname FROM pg_catalog.pg_namespace n",
            "SELECT c.oid::regclass FROM pg_catalog.pg_class c",
        ] {
            let ours = read(text).map(|p| p.statements).map_err(|e| e.to_string());
            let mut plain = Parser::parse_sql(&PostgreSqlDialect {}, text).unwrap_or_default();
            rewrite_parsed(&mut plain, true);
            let rewritten: Vec<String> = plain.iter().map(|s| s.to_string()).collect();
            let theirs = parser
                .parse(&rewritten.join("; "))
                .map_err(|e| e.to_string());
            assert_eq!(ours, theirs, "{text}");
        }
    }

    #[test]
    fn token_edits_read_as_the_sql_they_stand_for() {
        for (client, meant) in [
            (
                "TABLE a ORDER BY id; TABLE b",
                "SELECT * FROM a ORDER BY id; SELECT * FROM b",
            ),
            (
                "comment on view m.v is $c$it's$c$",
                "comment on TABLE m.v is 'it''s'",
            ),
            ("ABORT", "ROLLBACK"),
            ("  abort; SELECT 1", "ROLLBACK; SELECT 1"),
        ] {
            assert_eq!(sql(client), sql(meant), "{client}");
        }
        assert!(sql("SELECT abort FROM t").contains("abort"));
    }

    #[test]
    fn errors_point_into_the_client_text() {
        let got = sql("TABLE a;\nSELECT * FORM t");
        assert!(
            got.starts_with("error: ") && got.contains("Line: 2"),
            "{got}"
        );
        assert!(sql("SELECT 'unterminated").starts_with("error: "));
    }
}
