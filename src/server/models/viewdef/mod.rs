//! A model view's definition as Postgres prints it (`pg_get_viewdef`, `pg_views.definition`,
//! SQLAlchemy's `get_view_definition`, psql's `\d+`): made once, when `CREATE VIEW` arrives
//! at the gateway, from the view's parsed query and the columns of the relations it reads.
//!
//! Postgres prints a view from its parse tree (`ruleutils.c`): one target per line, each
//! clause on a line of its own, every column named through its relation, every operator in
//! parentheses, constants with their types. This follows those rules for the queries views
//! are made of (one `SELECT` with joins, filters, grouping, ordering and limits over columns,
//! functions, aggregates, operators, casts and constants); a query beyond that (a `WITH`, a
//! set operation, a subquery, `CASE`, a window) is printed on one line instead.

use std::collections::HashMap;

use arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, CastKind, Distinct, DuplicateTreatment, Expr, Function, FunctionArg,
    FunctionArgExpr, FunctionArguments, GroupByExpr, Ident, JoinConstraint, JoinOperator,
    LimitClause, ObjectName, OrderByExpr, OrderByKind, Query, SelectItem, SetExpr, TableFactor,
    TableWithJoins, UnaryOperator, Value,
};

use crate::query::naming::{figure_name, DUPLICATE_MARK};
use crate::server::names::{fold, parts};
use spelling::{
    cast_type, family, is_int4, pg_type, quote, sql_type, string_literal, typed_string,
};

/// Postgres's indentation steps (`PRETTYINDENT_STD`, `PRETTYINDENT_JOIN`, `PRETTYINDENT_VAR`).
const STD: i32 = 8;
const JOIN: i32 = 4;
const VAR: i32 = 4;

/// The columns (name and type, in order) of a relation a view reads, by its name's parts.
pub type Columns = HashMap<Vec<String>, Vec<(String, DataType)>>;

/// The view's definition as Postgres prints it (without the leading space and trailing
/// semicolon `pg_get_viewdef` adds), or `None` when the query is beyond what is followed here.
/// `default_schema`: relations there are printed without their schema, as Postgres prints
/// the relations its search path finds.
/// `names`: the view's column names where `CREATE VIEW v (a, b)` gave them.
pub fn deparse(
    query: &Query,
    names: &[String],
    default_schema: &str,
    columns: &Columns,
) -> Option<String> {
    let mut p = Printer {
        out: String::new(),
        indent: 0,
        default_schema,
        relations: Vec::new(),
    };
    p.query(query, names, columns)?;
    Some(p.out)
}

/// Where a constant stands: on its own (a target, a function's argument), or against an
/// expression of a known type or of one not known here.
#[derive(Clone, Copy)]
enum Ctx<'t> {
    Free,
    Against(Option<&'t DataType>),
}

/// One relation of the FROM list: its reference name and columns.
struct Relation {
    refname: String,
    columns: Vec<(String, DataType)>,
}

struct Printer<'a> {
    out: String,
    indent: i32,
    default_schema: &'a str,
    relations: Vec<Relation>,
}

impl Printer<'_> {
    /// Postgres's `appendContextKeyword`: a new line, indented, then `word`.
    fn keyword(&mut self, word: &str, before: i32, after: i32, plus: i32) {
        self.indent += before;
        while self.out.ends_with(' ') {
            self.out.pop();
        }
        self.out.push('\n');
        self.out
            .push_str(&" ".repeat((self.indent.max(0) + plus) as usize));
        self.out.push_str(word);
        self.indent = (self.indent + after).max(0);
    }

    fn query(&mut self, q: &Query, names: &[String], columns: &Columns) -> Option<()> {
        if q.with.is_some() || q.fetch.is_some() || !q.locks.is_empty() {
            return None;
        }
        let SetExpr::Select(s) = q.body.as_ref() else {
            return None;
        };
        if s.top.is_some()
            || s.into.is_some()
            || !s.lateral_views.is_empty()
            || s.qualify.is_some()
            || !s.named_window.is_empty()
            || !s.sort_by.is_empty()
        {
            return None;
        }
        // The relations first: columns are named through them.
        for twj in &s.from {
            self.collect(twj, columns)?;
        }
        // The targets, expanded and named.
        let mut targets: Vec<(Expr, String)> = Vec::new();
        for item in &s.projection {
            match item {
                SelectItem::UnnamedExpr(e) => targets.push((e.clone(), figure_name(e))),
                SelectItem::ExprWithAlias { expr, alias } => {
                    let alias = fold(alias);
                    let name = alias.split(DUPLICATE_MARK).next().unwrap_or_default();
                    targets.push((expr.clone(), name.to_string()));
                }
                SelectItem::Wildcard(_) => {
                    for r in &self.relations {
                        for (c, _) in &r.columns {
                            let e = Expr::CompoundIdentifier(vec![
                                Ident::with_quote('"', r.refname.clone()),
                                Ident::with_quote('"', c.clone()),
                            ]);
                            targets.push((e, c.clone()));
                        }
                    }
                }
                SelectItem::QualifiedWildcard(..) => return None,
            }
        }
        if names.len() > targets.len() {
            return None;
        }
        for (target, name) in targets.iter_mut().zip(names) {
            target.1 = name.clone();
        }
        self.indent += STD;
        self.out.push(' ');
        self.out.push_str("SELECT");
        match &s.distinct {
            None => {}
            Some(Distinct::Distinct) => self.out.push_str(" DISTINCT"),
            Some(_) => return None,
        }
        for (i, (e, name)) in targets.iter().enumerate() {
            let mut text = self.expr(e)?;
            let bare = self.column_name(e);
            if bare.as_deref() != Some(name.as_str()) {
                text.push_str(" AS ");
                text.push_str(&quote(name));
            }
            if i == 0 {
                self.out.push(' ');
            } else {
                self.out.push(',');
                self.keyword("", -STD, STD, VAR);
            }
            self.out.push_str(&text);
        }
        for (i, twj) in s.from.iter().enumerate() {
            if i == 0 {
                self.keyword(" FROM ", -STD, STD, 2);
            } else {
                self.out.push(',');
                self.keyword("", -STD, STD, VAR);
            }
            self.print_from_item(twj)?;
        }
        if let Some(w) = &s.selection {
            self.keyword(" WHERE ", -STD, STD, 1);
            let text = self.expr(w)?;
            self.out.push_str(&text);
        }
        match &s.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => {
                if !exprs.is_empty() {
                    self.keyword(" GROUP BY ", -STD, STD, 1);
                    let items = exprs
                        .iter()
                        .map(|e| self.sort_group_item(e, &targets))
                        .collect::<Option<Vec<_>>>()?;
                    self.out.push_str(&items.join(", "));
                }
            }
            _ => return None,
        }
        if let Some(h) = &s.having {
            self.keyword(" HAVING ", -STD, STD, 0);
            let text = self.expr(h)?;
            self.out.push_str(&text);
        }
        if let Some(order) = &q.order_by {
            let OrderByKind::Expressions(items) = &order.kind else {
                return None;
            };
            if order.interpolate.is_some() {
                return None;
            }
            self.keyword(" ORDER BY ", -STD, STD, 1);
            let items = items
                .iter()
                .map(|o| self.order_item(o, &targets))
                .collect::<Option<Vec<_>>>()?;
            self.out.push_str(&items.join(", "));
        }
        match &q.limit_clause {
            None => {}
            Some(LimitClause::LimitOffset {
                limit,
                offset,
                limit_by,
            }) if limit_by.is_empty() => {
                if let Some(o) = offset {
                    self.keyword(" OFFSET ", -STD, STD, 0);
                    let text = self.expr(&o.value)?;
                    self.out.push_str(&text);
                }
                if let Some(l) = limit {
                    self.keyword(" LIMIT ", -STD, STD, 0);
                    let text = self.expr(l)?;
                    self.out.push_str(&text);
                }
            }
            Some(_) => return None,
        }
        Some(())
    }

    /// Notes the relations of one FROM item (a table and the tables it joins).
    fn collect(&mut self, twj: &TableWithJoins, columns: &Columns) -> Option<()> {
        self.relation(&twj.relation, columns)?;
        for j in &twj.joins {
            self.relation(&j.relation, columns)?;
        }
        Some(())
    }

    fn relation(&mut self, t: &TableFactor, columns: &Columns) -> Option<()> {
        let TableFactor::Table {
            name, alias, args, ..
        } = t
        else {
            return None;
        };
        if args.is_some() || alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
            return None;
        }
        let p = parts(name);
        let refname = match alias {
            Some(a) => fold(&a.name),
            None => p.last()?.clone(),
        };
        self.relations.push(Relation {
            refname,
            columns: columns.get(&p)?.clone(),
        });
        Some(())
    }

    fn table(&self, name: &ObjectName, alias: Option<&Ident>) -> Option<String> {
        let p = parts(name);
        let mut text = match p.as_slice() {
            [s, n] if s == self.default_schema => quote(n),
            [s, n] => format!("{}.{}", quote(s), quote(n)),
            [n] => quote(n),
            _ => return None,
        };
        if let Some(a) = alias {
            let a = fold(a);
            if Some(&a) != p.last() {
                text.push(' ');
                text.push_str(&quote(&a));
            }
        }
        Some(text)
    }

    fn print_from_item(&mut self, twj: &TableWithJoins) -> Option<()> {
        let table = |t: &TableFactor, p: &Self| -> Option<String> {
            let TableFactor::Table { name, alias, .. } = t else {
                return None;
            };
            p.table(name, alias.as_ref().map(|a| &a.name))
        };
        self.out.push_str(&"(".repeat(twj.joins.len()));
        let first = table(&twj.relation, self)?;
        self.out.push_str(&first);
        for j in &twj.joins {
            let (word, constraint) = match &j.join_operator {
                JoinOperator::Join(c) | JoinOperator::Inner(c) => (" JOIN ", c),
                JoinOperator::Left(c) | JoinOperator::LeftOuter(c) => (" LEFT JOIN ", c),
                JoinOperator::Right(c) | JoinOperator::RightOuter(c) => (" RIGHT JOIN ", c),
                JoinOperator::FullOuter(c) => (" FULL JOIN ", c),
                JoinOperator::CrossJoin(c) => (" CROSS JOIN ", c),
                _ => return None,
            };
            self.keyword(word, -STD, STD, JOIN);
            let right = table(&j.relation, self)?;
            self.out.push_str(&right);
            match constraint {
                JoinConstraint::On(e) => {
                    let text = self.expr(e)?;
                    self.out.push_str(" ON (");
                    self.out.push_str(&text);
                    self.out.push(')');
                }
                // The merged column of a USING join is not any one relation's.
                JoinConstraint::Using(_) => return None,
                JoinConstraint::None if word == " CROSS JOIN " => {}
                _ => return None,
            }
            self.out.push(')');
        }
        Some(())
    }

    /// The relation a column belongs to, and its type.
    fn owner(&self, qualifier: Option<&str>, column: &str) -> Option<(&Relation, &DataType)> {
        self.relations
            .iter()
            .filter(|r| qualifier.is_none_or(|q| q == r.refname))
            .find_map(|r| {
                let (_, dt) = r.columns.iter().find(|(c, _)| c == column)?;
                Some((r, dt))
            })
    }

    /// A column reference's (qualifier, column) parts.
    fn column_parts(e: &Expr) -> Option<(Option<String>, String)> {
        match e {
            Expr::Identifier(i) => Some((None, fold(i))),
            Expr::CompoundIdentifier(ids) => match ids.as_slice() {
                [t, c] => Some((Some(fold(t)), fold(c))),
                [_, t, c] => Some((Some(fold(t)), fold(c))),
                _ => None,
            },
            _ => None,
        }
    }

    /// The column's own name when `e` reads a column as it is (Postgres names such a target
    /// after it, with no `AS`).
    fn column_name(&self, e: &Expr) -> Option<String> {
        let (q, c) = Self::column_parts(e)?;
        self.owner(q.as_deref(), &c).map(|_| c)
    }

    /// The type of `e` where it is plain from the query: a column's, a cast's, and the result
    /// of the aggregates and functions whose result type follows from their argument.
    fn expr_type(&self, e: &Expr) -> Option<DataType> {
        match e {
            Expr::Nested(inner) => self.expr_type(inner),
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) => {
                let (q, c) = Self::column_parts(e)?;
                self.owner(q.as_deref(), &c).map(|(_, dt)| dt.clone())
            }
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) if is_int4(n) => Some(DataType::Int32),
                Value::Number(n, _) if !n.contains(['.', 'e', 'E']) => Some(DataType::Int64),
                Value::Number(..) => Some(DataType::Decimal128(38, 10)),
                Value::SingleQuotedString(_) => Some(DataType::Utf8),
                Value::Boolean(_) => Some(DataType::Boolean),
                _ => None,
            },
            Expr::Cast { data_type, .. } => cast_type(data_type),
            Expr::Function(f) => {
                let name = parts(&f.name).join(".");
                let arg = match &f.args {
                    FunctionArguments::List(l) => match l.args.first() {
                        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(a))) => self.expr_type(a),
                        _ => None,
                    },
                    _ => None,
                };
                match (name.as_str(), arg) {
                    ("count", _) => Some(DataType::Int64),
                    ("sum", Some(DataType::Int16 | DataType::Int32)) => Some(DataType::Int64),
                    ("sum" | "avg", Some(t)) if family(&t) <= 2 && family(&t) > 0 => {
                        Some(DataType::Decimal128(38, 10))
                    }
                    ("sum" | "avg", Some(t)) if family(&t) == 3 => Some(DataType::Float64),
                    ("min" | "max" | "coalesce" | "nullif" | "greatest" | "least", t) => t,
                    ("lower" | "upper", _) => Some(DataType::Utf8),
                    ("length", _) => Some(DataType::Int32),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// GROUP BY and ORDER BY items: an output column's number or name stands for its
    /// expression; functions are put in parentheses (so they cannot read as a number).
    fn sort_group_item(&self, e: &Expr, targets: &[(Expr, String)]) -> Option<String> {
        let target = match e {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => {
                    let i: usize = n.parse().ok()?;
                    Some(&targets.get(i.checked_sub(1)?)?.0)
                }
                _ => None,
            },
            Expr::Identifier(i) if self.column_name(e).is_none() => {
                let name = fold(i);
                targets.iter().find(|(_, n)| *n == name).map(|(t, _)| t)
            }
            _ => None,
        };
        let e = target.unwrap_or(e);
        let text = self.expr(e)?;
        // Postgres's own forms (COALESCE and the like) are not function calls there.
        let special = text.starts_with(char::is_uppercase);
        Some(match e {
            Expr::Function(_) | Expr::Cast { .. } if !special => format!("({text})"),
            _ => text,
        })
    }

    fn order_item(&self, o: &OrderByExpr, targets: &[(Expr, String)]) -> Option<String> {
        if o.with_fill.is_some() {
            return None;
        }
        let mut text = self.sort_group_item(&o.expr, targets)?;
        let desc = o.options.asc == Some(false);
        if desc {
            text.push_str(" DESC");
        }
        match o.options.nulls_first {
            Some(true) if !desc => text.push_str(" NULLS FIRST"),
            Some(false) if desc => text.push_str(" NULLS LAST"),
            _ => {}
        }
        Some(text)
    }

    /// A constant, printed as Postgres prints the constant it becomes (`ctx`: what it stands
    /// against); `None` where that is not plain from the query.
    fn constant(&self, v: &Value, ctx: Ctx<'_>) -> Option<String> {
        let against = match ctx {
            Ctx::Free => None,
            Ctx::Against(t) => Some(t),
        };
        Some(match v {
            Value::Number(n, _) => {
                let integral = !n.contains(['.', 'e', 'E']);
                let own = if !integral || is_int4(n) {
                    n.clone()
                } else {
                    format!("'{n}'::bigint")
                };
                match against {
                    None => own,
                    Some(None) => return None,
                    Some(Some(t)) => match family(t) {
                        1 if integral => own,
                        2 if integral => format!("({n})::numeric"),
                        2 => own,
                        3 => format!("({n})::double precision"),
                        _ => return None,
                    },
                }
            }
            Value::SingleQuotedString(s) => match against.flatten() {
                None => format!("{}::text", string_literal(s)),
                Some(t) => typed_string(s, t)?,
            },
            Value::Boolean(b) => b.to_string(),
            Value::Null => match against {
                None => "NULL::text".into(),
                Some(t) => format!("NULL::{}", pg_type(t?)?),
            },
            _ => return None,
        })
    }

    fn binary(&self, left: &Expr, op: &str, right: &Expr) -> Option<String> {
        let (lt, rt) = (self.expr_type(left), self.expr_type(right));
        // Across families Postgres casts one side; only same-family operators are printed.
        let constant = |e: &Expr| matches!(e, Expr::Value(_));
        if let (Some(a), Some(b)) = (&lt, &rt) {
            if !constant(left) && !constant(right) && family(a) != family(b) {
                return None;
            }
            if constant(left) && constant(right) {
                return None;
            }
        }
        let (l, r) = (
            self.operand(left, Ctx::Against(rt.as_ref()))?,
            self.operand(right, Ctx::Against(lt.as_ref()))?,
        );
        Some(format!("({l} {op} {r})"))
    }

    /// An operand: a constant takes the type of what it stands against.
    fn operand(&self, e: &Expr, ctx: Ctx<'_>) -> Option<String> {
        match e {
            Expr::Value(v) => self.constant(&v.value, ctx),
            Expr::Nested(inner) => self.operand(inner, ctx),
            _ => self.expr(e),
        }
    }

    /// `a AND b AND c` as one list, as Postgres holds it.
    fn flatten<'e>(e: &'e Expr, op: &BinaryOperator, out: &mut Vec<&'e Expr>) {
        match e {
            // Postgres's grammar adds to the list only what stands on the left.
            Expr::BinaryOp { left, op: o, right } if o == op => {
                Self::flatten(left, op, out);
                out.push(right);
            }
            Expr::Nested(inner) if matches!(inner.as_ref(), Expr::BinaryOp { op: o, .. } if o == op) => {
                Self::flatten(inner, op, out)
            }
            other => out.push(other),
        }
    }

    fn expr(&self, e: &Expr) -> Option<String> {
        Some(match e {
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) => {
                let (q, c) = Self::column_parts(e)?;
                let (r, _) = self.owner(q.as_deref(), &c)?;
                format!("{}.{}", quote(&r.refname), quote(&c))
            }
            Expr::Nested(inner) => self.expr(inner)?,
            Expr::Value(v) => self.constant(&v.value, Ctx::Free)?,
            Expr::BinaryOp { left, op, right } => match op {
                BinaryOperator::And | BinaryOperator::Or => {
                    let mut items = Vec::new();
                    Self::flatten(e, op, &mut items);
                    let items = items
                        .into_iter()
                        .map(|i| self.expr(i))
                        .collect::<Option<Vec<_>>>()?;
                    format!("({})", items.join(&format!(" {op} ")))
                }
                BinaryOperator::NotEq => self.binary(left, "<>", right)?,
                BinaryOperator::Plus
                | BinaryOperator::Minus
                | BinaryOperator::Multiply
                | BinaryOperator::Divide
                | BinaryOperator::Modulo
                | BinaryOperator::Eq
                | BinaryOperator::Lt
                | BinaryOperator::LtEq
                | BinaryOperator::Gt
                | BinaryOperator::GtEq
                | BinaryOperator::StringConcat => self.binary(left, &op.to_string(), right)?,
                _ => return None,
            },
            Expr::UnaryOp { op, expr } => match (op, expr.as_ref()) {
                (UnaryOperator::Not, inner) => format!("(NOT {})", self.expr(inner)?),
                (UnaryOperator::Minus, Expr::Value(v)) => match &v.value {
                    Value::Number(n, _) if is_int4(&format!("-{n}")) => {
                        format!("'-{n}'::integer")
                    }
                    Value::Number(n, _) if !n.contains(['.', 'e', 'E']) => {
                        format!("'-{n}'::bigint")
                    }
                    Value::Number(n, _) => format!("'-{n}'::numeric"),
                    _ => return None,
                },
                (UnaryOperator::Minus, inner) => format!("(- {})", self.expr(inner)?),
                _ => return None,
            },
            Expr::IsNull(inner) => format!("({} IS NULL)", self.expr(inner)?),
            Expr::IsNotNull(inner) => format!("({} IS NOT NULL)", self.expr(inner)?),
            Expr::Between {
                expr,
                negated: false,
                low,
                high,
            } => format!(
                "({} AND {})",
                self.binary(expr, ">=", low)?,
                self.binary(expr, "<=", high)?
            ),
            Expr::InList {
                expr,
                list,
                negated,
            } => {
                let op = if *negated { "<>" } else { "=" };
                if let [only] = list.as_slice() {
                    return self.binary(expr, op, only);
                }
                // Postgres makes an array of constants only; other lists are OR chains.
                if !list.iter().all(|i| matches!(i, Expr::Value(_))) {
                    return None;
                }
                let typed = self.expr_type(expr);
                let items = list
                    .iter()
                    .map(|i| self.operand(i, Ctx::Against(typed.as_ref())))
                    .collect::<Option<Vec<_>>>()?;
                let any = if *negated { "ALL" } else { "ANY" };
                format!(
                    "({} {op} {any} (ARRAY[{}]))",
                    self.expr(expr)?,
                    items.join(", ")
                )
            }
            Expr::Like {
                negated,
                any: false,
                expr,
                pattern,
                escape_char: None,
            } => self.binary(expr, if *negated { "!~~" } else { "~~" }, pattern)?,
            Expr::ILike {
                negated,
                any: false,
                expr,
                pattern,
                escape_char: None,
            } => self.binary(expr, if *negated { "!~~*" } else { "~~*" }, pattern)?,
            Expr::Cast {
                kind: CastKind::DoubleColon | CastKind::Cast,
                expr,
                data_type,
                format: None,
                ..
            } => {
                let ty = sql_type(data_type)?;
                match expr.as_ref() {
                    // A quoted constant is read as the type it is cast to.
                    Expr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) => match cast_type(data_type) {
                            Some(t) if !matches!(t, DataType::Decimal128(..)) => {
                                typed_string(s, &t)?
                            }
                            _ => format!("{}::{ty}", string_literal(s)),
                        },
                        Value::Number(n, _) => format!("({n})::{ty}"),
                        _ => return None,
                    },
                    inner => format!("({})::{ty}", self.expr(inner)?),
                }
            }
            Expr::Function(f) => self.function(f)?,
            _ => return None,
        })
    }

    /// Calls whose arguments Postgres takes as they are: aggregates, a few text functions,
    /// and its own forms `COALESCE`, `NULLIF`, `GREATEST`, `LEAST` (printed in capitals,
    /// their constants typed as their first argument). Any other call is left to the caller.
    fn function(&self, f: &Function) -> Option<String> {
        if f.over.is_some()
            || f.null_treatment.is_some()
            || !f.within_group.is_empty()
            || !matches!(f.parameters, FunctionArguments::None)
        {
            return None;
        }
        let name = parts(&f.name).join(".");
        let FunctionArguments::List(list) = &f.args else {
            return None;
        };
        if !list.clauses.is_empty() {
            return None;
        }
        let args: Vec<&Expr> = list
            .args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        let wildcard = matches!(
            list.args.as_slice(),
            [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)]
        );
        let (printed, ctx) = match name.as_str() {
            "count" | "sum" | "avg" | "min" | "max" | "bool_and" | "bool_or" | "every" => {
                (name.clone(), None)
            }
            "lower" | "upper" | "length"
                if args.len() == 1 && self.expr_type(args[0]).is_some_and(|t| family(&t) == 4) =>
            {
                (name.clone(), None)
            }
            "coalesce" | "nullif" | "greatest" | "least" if !args.is_empty() => {
                (name.to_uppercase(), Some(self.expr_type(args[0])))
            }
            _ => return None,
        };
        let mut text = format!("{printed}(");
        match list.duplicate_treatment {
            Some(DuplicateTreatment::Distinct) => text.push_str("DISTINCT "),
            Some(DuplicateTreatment::All) | None => {}
        }
        if wildcard && name == "count" {
            text.push('*');
        } else {
            if args.len() != list.args.len() || args.is_empty() {
                return None;
            }
            let ctx = match &ctx {
                Some(t) => Ctx::Against(t.as_ref()),
                None => Ctx::Free,
            };
            let printed = args
                .iter()
                .map(|a| self.operand(a, ctx))
                .collect::<Option<Vec<_>>>()?;
            text.push_str(&printed.join(", "));
        }
        text.push(')');
        if let Some(filter) = &f.filter {
            text.push_str(&format!(" FILTER (WHERE {})", self.expr(filter)?));
        }
        Some(text)
    }
}

mod spelling;
#[cfg(test)]
mod tests;
