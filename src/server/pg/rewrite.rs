//! Gateway, SQL rewriting: between a client's statement and the planner. Postgres type
//! casts the query engine does not know are rewritten on the statement's syntax tree:
//! `regclass` casts become catalog lookups ([`super::regclass`]), `oid[]` an integer array,
//! `'name'::regtype` a `to_regtype()` call; whole client queries with a known shape are
//! replaced ([`super::known`]). The types a client gives its parameters by casting them
//! (`$1::oid[]`) are kept, to describe the parameters as Postgres would. A correlated
//! scalar subquery that selects one plain value is aggregated (`max`), as the engine
//! requires to decorrelate it: it gives the same answer for the zero or one row Postgres
//! allows (where Postgres fails on more rows, the greatest value is taken). A truth value
//! such a subquery's select list reads from enclosing tables only is evaluated outside it.
//! `unnest()`/`generate_subscripts()` of the catalog's vector columns (held as text) work
//! on their values.

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken;
use datafusion::sql::sqlparser::ast::{
    AccessExpr, ArrayElemTypeDef, BinaryOperator, CaseWhen, CastKind, DataType as SqlType, Expr,
    Function, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, GroupByExpr,
    Ident, ObjectName, Query, SelectItem, SetExpr, Statement, Subscript, TableFactor,
    UnaryOperator, Value, ValueWithSpan, Visit, VisitMut, Visitor, VisitorMut,
};
use pgwire::api::Type;

use super::known;
use super::regclass::{REGCLASS_NAME, REGCLASS_OID};

/// What rewriting a client's statements found.
#[derive(Debug, Default)]
pub struct Rewritten {
    /// Whether anything changed.
    pub changed: bool,
    /// Postgres types the client cast parameters to, by parameter index (0 for `$1`).
    pub declared: HashMap<usize, Type>,
    /// Whether the statement looks relations up by name (a `regclass` cast).
    pub uses_relations: bool,
    /// Whether it reads view definitions or comments by oid (`pg_get_viewdef`,
    /// `obj_description`, `col_description`).
    pub uses_descriptions: bool,
}

/// Rewrites parsed `statements` in place: known client queries replaced, result columns
/// named as Postgres names them when `name_columns` (see
/// [`crate::query::naming::name_like_postgres`]), then the casts.
pub fn rewrite_parsed(statements: &mut [Statement], name_columns: bool) -> Rewritten {
    let mut changed = false;
    for statement in statements.iter_mut() {
        if let Some(replacement) = known::replacement(statement) {
            *statement = replacement;
            changed = true;
        }
    }
    // Result columns named as Postgres names them, from the statement as the client wrote it.
    for statement in statements.iter_mut().filter(|_| name_columns) {
        changed |= crate::query::naming::name_like_postgres(statement);
    }
    let mut visitor = CastRewrite::default();
    for statement in statements.iter_mut() {
        let _ = statement.visit(&mut visitor);
    }
    Rewritten {
        changed: changed || visitor.changed,
        declared: visitor.declared,
        uses_relations: visitor.uses_relations,
        uses_descriptions: visitor.uses_descriptions,
    }
}

/// The Postgres name of a cast's target type: lower case, without `pg_catalog.`.
fn type_name(t: &SqlType) -> String {
    let name = t.to_string().to_ascii_lowercase();
    match name.strip_prefix("pg_catalog.") {
        Some(rest) => rest.to_string(),
        None => name,
    }
}

/// The inner expression of `CAST(inner AS <type>)` when `e` is such a cast.
fn cast_of<'a>(e: &'a Expr, type_names: &[&str]) -> Option<&'a Expr> {
    match e {
        Expr::Cast {
            expr, data_type, ..
        } if type_names.contains(&type_name(data_type).as_str()) => Some(expr),
        _ => None,
    }
}

/// The index of a `$n` parameter (0 for `$1`).
fn placeholder_index(e: &Expr) -> Option<usize> {
    match e {
        Expr::Value(ValueWithSpan {
            value: Value::Placeholder(p),
            ..
        }) => p.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1),
        _ => None,
    }
}

/// `name(args...)`.
fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| FunctionArg::Unnamed(FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

const TEXT_TYPES: &[&str] = &["text", "varchar", "character varying", "name"];
const OID_TYPES: &[&str] = &["oid", "int", "integer", "int4", "bigint", "int8"];

#[derive(Default)]
struct CastRewrite {
    changed: bool,
    uses_relations: bool,
    uses_descriptions: bool,
    declared: HashMap<usize, Type>,
}

impl CastRewrite {
    fn declare(&mut self, e: &Expr, t: Type) {
        if let Some(i) = placeholder_index(e) {
            self.declared.entry(i).or_insert(t);
        }
    }

    fn regclass(&mut self, name: &str, inner: &Expr) -> Expr {
        self.changed = true;
        self.uses_relations = true;
        call(name, vec![inner.clone()])
    }
}

/// Aggregates that make a subquery give one row.
const AGGREGATES: &[&str] = &[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "array_agg",
    "string_agg",
    "bool_and",
    "bool_or",
    "every",
    "json_agg",
    "jsonb_agg",
    "json_object_agg",
    "first_value",
    "last_value",
];

/// Whether `e` calls an aggregate function.
fn has_aggregate(e: &Expr) -> bool {
    struct Finder(bool);
    impl Visitor for Finder {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if let Expr::Function(f) = e {
                let name = f.name.to_string().to_ascii_lowercase();
                let name = name.rsplit('.').next().unwrap_or_default();
                if AGGREGATES.contains(&name) {
                    self.0 = true;
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut f = Finder(false);
    let _ = e.visit(&mut f);
    f.0
}

/// The names a query's own FROM items go by (aliases, else table names), lower case.
fn own_tables(q: &Query) -> Vec<String> {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Vec::new();
    };
    let mut own: Vec<String> = Vec::new();
    for twj in &select.from {
        for factor in std::iter::once(&twj.relation).chain(twj.joins.iter().map(|j| &j.relation)) {
            if let TableFactor::Table { name, alias, .. } = factor {
                match alias {
                    Some(a) => own.push(a.name.value.to_ascii_lowercase()),
                    None => {
                        if let Some(last) = name.0.last() {
                            own.push(last.to_string().trim_matches('"').to_ascii_lowercase());
                        }
                    }
                }
            }
        }
    }
    own
}

/// The tables the qualified columns of `node` name, and whether it also holds unqualified
/// columns or subqueries (which cannot be placed).
fn referenced_tables<V: Visit>(node: &V) -> (Vec<String>, bool) {
    struct Refs(Vec<String>, bool);
    impl Visitor for Refs {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            match e {
                Expr::CompoundIdentifier(parts) if parts.len() >= 2 => self
                    .0
                    .push(parts[parts.len() - 2].value.to_ascii_lowercase()),
                Expr::Identifier(_) | Expr::Subquery(_) | Expr::Exists { .. } => self.1 = true,
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let mut refs = Refs(Vec::new(), false);
    let _ = node.visit(&mut refs);
    (refs.0, refs.1)
}

/// Whether the query refers to a table of an enclosing query: a qualified column whose
/// table is not one of its own FROM items.
fn is_correlated(q: &Query) -> bool {
    let own = own_tables(q);
    let (tables, _) = referenced_tables(q);
    tables.iter().any(|t| !own.contains(t))
}

/// The conditions of `AND`-ed `e`.
fn conjuncts(e: Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(*left, out);
            conjuncts(*right, out);
        }
        Expr::Nested(inner)
            if matches!(
                inner.as_ref(),
                Expr::BinaryOp {
                    op: BinaryOperator::And,
                    ..
                }
            ) =>
        {
            conjuncts(*inner, out)
        }
        other => out.push(other),
    }
}

fn and_all(mut conditions: Vec<Expr>) -> Option<Expr> {
    let first = conditions.pop()?;
    Some(
        conditions
            .into_iter()
            .rev()
            .fold(first, |acc, c| Expr::BinaryOp {
                left: Box::new(c),
                op: BinaryOperator::And,
                right: Box::new(acc),
            }),
    )
}

/// Takes out of a scalar subquery's WHERE the conditions on enclosing tables only (the
/// engine cannot decorrelate them): `(SELECT v FROM t WHERE outer.c AND t.k = outer.k)`
/// is `CASE WHEN outer.c THEN (SELECT v FROM t WHERE t.k = outer.k) END`, the same value.
fn hoist_outer_conditions(q: &mut Query) -> Option<Expr> {
    let own = own_tables(q);
    let SetExpr::Select(select) = q.body.as_mut() else {
        return None;
    };
    let selection = select.selection.take()?;
    let mut all = Vec::new();
    conjuncts(selection, &mut all);
    let (outer, inner): (Vec<Expr>, Vec<Expr>) = all.into_iter().partition(|c| {
        let (tables, unplaceable) = referenced_tables(c);
        !unplaceable && !tables.is_empty() && tables.iter().all(|t| !own.contains(t))
    });
    select.selection = and_all(inner);
    and_all(outer)
}

/// The plain arguments of a function call.
fn plain_args(f: &Function) -> Option<Vec<&Expr>> {
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    list.args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        })
        .collect()
}

/// Set-returning calls the engine lacks, as `unnest` of a list: `generate_subscripts(a,
/// dim)` is `unnest(skippr_subscripts(a, dim))` (from 1, or from 0 for a vector: see
/// [`super::arrays`]); `information_schema._pg_expandarray(a)` (pgjdbc's key and index
/// metadata) unnests `(x, n)` records.
fn array_set_function(f: &Function) -> Option<Expr> {
    let name = f.name.to_string().to_ascii_lowercase();
    let name = name.rsplit('.').next().unwrap_or_default();
    let args = plain_args(f)?;
    match (name, args.as_slice()) {
        // A set of (x, n) records: each element of the array with its position from 1.
        ("_pg_expandarray", [a]) => Some(call(
            "unnest",
            vec![call("skippr_expandarray", vec![(*a).clone()])],
        )),
        ("generate_subscripts", [a, dim]) => Some(call(
            "unnest",
            vec![call(
                "skippr_subscripts",
                vec![(*a).clone(), (*dim).clone()],
            )],
        )),
        _ => None,
    }
}

/// Whether `e` is a truth value by its form (a comparison, a logical operator, a test).
fn is_boolean(e: &Expr) -> bool {
    use BinaryOperator as B;
    match e {
        Expr::Nested(inner) => is_boolean(inner),
        Expr::BinaryOp { op, .. } => matches!(
            op,
            B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq | B::And | B::Or
        ),
        Expr::UnaryOp {
            op: UnaryOperator::Not,
            ..
        }
        | Expr::IsNull(_)
        | Expr::IsNotNull(_)
        | Expr::IsTrue(_)
        | Expr::IsNotTrue(_)
        | Expr::IsFalse(_)
        | Expr::IsNotFalse(_)
        | Expr::IsDistinctFrom(..)
        | Expr::IsNotDistinctFrom(..)
        | Expr::InList { .. }
        | Expr::Between { .. }
        | Expr::Like { .. }
        | Expr::ILike { .. } => true,
        _ => false,
    }
}

/// The first truth value in a correlated scalar subquery's select list that reads only
/// enclosing tables' columns (the engine cannot decorrelate a select list that reads them).
fn outer_truth_value(q: &Query) -> Option<Expr> {
    struct Finder<'a> {
        own: &'a [String],
        found: Option<Expr>,
        /// How deep in nested queries (whose FROM items are not this query's) the visit is.
        nested: usize,
    }
    impl Visitor for Finder<'_> {
        type Break = ();
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.nested += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.nested = self.nested.saturating_sub(1);
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if self.nested == 0 && is_boolean(e) {
                let (tables, unplaceable) = referenced_tables(e);
                if !unplaceable
                    && !tables.is_empty()
                    && tables.iter().all(|t| !self.own.contains(t))
                {
                    self.found = Some(e.clone());
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        }
    }
    let own = own_tables(q);
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    let mut finder = Finder {
        own: &own,
        found: None,
        nested: 0,
    };
    for item in &select.projection {
        if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
            let _ = e.visit(&mut finder);
            if finder.found.is_some() {
                break;
            }
        }
    }
    finder.found
}

/// `q` with `target` in its select list replaced by `value`.
fn substitute_in_projection(q: &Query, target: &Expr, value: Value) -> Query {
    struct Substitute<'a> {
        target: &'a Expr,
        value: Value,
    }
    impl VisitorMut for Substitute<'_> {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if e == self.target {
                *e = Expr::value(self.value.clone());
            }
            ControlFlow::Continue(())
        }
    }
    let mut out = q.clone();
    if let SetExpr::Select(select) = out.body.as_mut() {
        let mut substitute = Substitute { target, value };
        for item in select.projection.iter_mut() {
            if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
                let _ = e.visit(&mut substitute);
            }
        }
    }
    out
}

/// Evaluates outside a correlated scalar subquery a truth value its select list reads
/// from enclosing tables only: `(SELECT f(outer.a = 'x', t.v) FROM t WHERE ...)` is
/// `CASE WHEN outer.a = 'x' THEN (SELECT f(true, t.v) ...) WHEN NOT outer.a = 'x' THEN
/// (SELECT f(false, t.v) ...) ELSE (SELECT f(NULL, t.v) ...) END`, the same value.
fn split_outer_truth_value(q: &Query) -> Option<Expr> {
    if !is_correlated(q) {
        return None;
    }
    let target = outer_truth_value(q)?;
    let with = |v: Value| Expr::Subquery(Box::new(substitute_in_projection(q, &target, v)));
    Some(Expr::Case {
        case_token: AttachedToken::empty(),
        end_token: AttachedToken::empty(),
        operand: None,
        conditions: vec![
            CaseWhen {
                condition: Expr::Nested(Box::new(target.clone())),
                result: with(Value::Boolean(true)),
            },
            CaseWhen {
                condition: Expr::UnaryOp {
                    op: UnaryOperator::Not,
                    expr: Box::new(Expr::Nested(Box::new(target.clone()))),
                },
                result: with(Value::Boolean(false)),
            },
        ],
        else_result: Some(Box::new(with(Value::Null))),
    })
}

/// `max(<value>)` in place of the single value a correlated scalar subquery selects.
fn aggregate_scalar_subquery(q: &mut Query) -> bool {
    if q.limit_clause.is_some() || q.fetch.is_some() || !is_correlated(q) {
        return false;
    }
    let SetExpr::Select(select) = q.body.as_mut() else {
        return false;
    };
    let grouped = match &select.group_by {
        GroupByExpr::Expressions(exprs, _) => !exprs.is_empty(),
        GroupByExpr::All(_) => true,
    };
    if grouped || select.having.is_some() || select.projection.len() != 1 {
        return false;
    }
    let value = match &mut select.projection[0] {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
        _ => return false,
    };
    if has_aggregate(value) {
        return false;
    }
    *value = call("max", vec![value.clone()]);
    true
}

impl VisitorMut for CastRewrite {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if let Expr::Subquery(q) = e {
            if let Some(split) = split_outer_truth_value(q) {
                // The three subqueries are rewritten as they are visited.
                self.changed = true;
                *e = split;
                return ControlFlow::Continue(());
            }
            self.changed |= aggregate_scalar_subquery(q);
            if let Some(condition) = hoist_outer_conditions(q) {
                self.changed = true;
                *e = Expr::Case {
                    case_token: AttachedToken::empty(),
                    end_token: AttachedToken::empty(),
                    operand: None,
                    conditions: vec![CaseWhen {
                        condition,
                        result: Expr::Subquery(q.clone()),
                    }],
                    else_result: None,
                };
            }
            return ControlFlow::Continue(());
        }
        if let Expr::CompoundFieldAccess { root, access_chain } = e {
            // `(record).field`, Postgres's access to a field of a composite value, is the
            // engine's `record['field']`.
            if matches!(root.as_ref(), Expr::Nested(_)) {
                for access in access_chain.iter_mut() {
                    if let AccessExpr::Dot(Expr::Identifier(field)) = access {
                        self.changed = true;
                        // Unquoted, the field's name folds to lower case, as Postgres folds it.
                        let name = match field.quote_style {
                            Some(_) => field.value.clone(),
                            None => field.value.to_lowercase(),
                        };
                        *access = AccessExpr::Subscript(Subscript::Index {
                            index: Expr::value(Value::SingleQuotedString(name)),
                        });
                    }
                }
            }
            return ControlFlow::Continue(());
        }
        if let Expr::Function(f) = e {
            let name = f.name.to_string().to_ascii_lowercase();
            let name = name.trim_start_matches("pg_catalog.");
            if super::regclass::LOOKUPS.contains(&name) {
                // Answered from the session's snapshot of the catalog, read before planning.
                self.uses_relations = true;
                self.uses_descriptions = true;
            }
            self.changed |= super::datetime::translate_call(f);
            if let Some(replacement) = array_set_function(f) {
                self.changed = true;
                *e = replacement;
            }
            return ControlFlow::Continue(());
        }
        let Expr::Cast {
            expr: inner,
            data_type,
            ..
        } = &*e
        else {
            return ControlFlow::Continue(());
        };
        let target = type_name(data_type);
        let replacement = match target.as_str() {
            "regclass" => Some(self.regclass(REGCLASS_OID, inner)),
            t if OID_TYPES.contains(&t) => {
                if t == "oid" {
                    self.declare(inner, Type::OID);
                }
                cast_of(inner, &["regclass"]).map(|x| self.regclass(REGCLASS_OID, x))
            }
            t if TEXT_TYPES.contains(&t) => {
                if let Some(x) = cast_of(inner, &["regclass"]) {
                    Some(self.regclass(REGCLASS_NAME, x))
                } else if let Some(x) = cast_of(inner, &["regtype"]) {
                    // A type's name, as format_type() prints it.
                    self.changed = true;
                    Some(call(
                        "format_type",
                        vec![x.clone(), Expr::value(Value::Null)],
                    ))
                } else {
                    None
                }
            }
            "regtype" => match inner.as_ref() {
                Expr::Value(ValueWithSpan {
                    value: Value::SingleQuotedString(_),
                    ..
                }) => {
                    self.changed = true;
                    Some(call("to_regtype", vec![(**inner).clone()]))
                }
                _ => None,
            },
            "int2vector" | "oidvector" => {
                self.changed = true;
                Some(call(&target, vec![(**inner).clone()]))
            }
            "\"char\"" => {
                // A one-character text type: text to the engine.
                self.changed = true;
                Some(Expr::Cast {
                    kind: CastKind::Cast,
                    expr: inner.clone(),
                    data_type: SqlType::Varchar(None),
                    array: false,
                    format: None,
                })
            }
            "oid[]" | "regclass[]" | "regtype[]" => {
                self.declare(inner, Type::OID_ARRAY);
                self.changed = true;
                Some(Expr::Cast {
                    kind: CastKind::Cast,
                    expr: inner.clone(),
                    data_type: SqlType::Array(ArrayElemTypeDef::SquareBracket(
                        Box::new(SqlType::Int(None)),
                        None,
                    )),
                    array: false,
                    format: None,
                })
            }
            _ => None,
        };
        if let Some(r) = replacement {
            *e = r;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests;
