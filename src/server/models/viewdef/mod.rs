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
    BinaryOperator, CastKind, DataType as SqlType, Distinct, DuplicateTreatment, ExactNumberInfo,
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident,
    JoinConstraint, JoinOperator, LimitClause, ObjectName, OrderByExpr, OrderByKind, Query,
    SelectItem, SetExpr, TableFactor, TableWithJoins, TimezoneInfo, UnaryOperator, Value,
};

use super::names::{fold, parts};
use crate::query::naming::{figure_name, pg_column_name};

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
pub fn deparse(query: &Query, default_schema: &str, columns: &Columns) -> Option<String> {
    let mut p = Printer {
        out: String::new(),
        indent: 0,
        default_schema,
        relations: Vec::new(),
    };
    p.query(query, columns)?;
    Some(p.out)
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

/// Postgres's `quote_identifier`: bare when lower case, simple and not a keyword.
fn quote(name: &str) -> String {
    let simple = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if simple && !KEYWORDS.split_whitespace().any(|k| k == name) {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Postgres's keywords that `quote_identifier` quotes (reserved, column-name and type-function
/// ones).
const KEYWORDS: &str = "\
    all analyse analyze and any array as asc asymmetric authorization between bigint binary \
    bit boolean both case cast char character check coalesce collate collation column \
    concurrently constraint create cross current_catalog current_date current_role \
    current_schema current_time current_timestamp current_user dec decimal default \
    deferrable desc distinct do else end except exists extract false fetch float for \
    foreign freeze from full grant greatest group grouping having ilike in initially inner \
    inout int integer intersect interval into is isnull join lateral leading least left \
    like limit localtime localtimestamp national natural nchar none normalize not notnull \
    null nullif numeric offset on only or order out outer overlaps overlay placing position \
    precision primary real references returning right row select session_user setof similar \
    smallint some substring symmetric system_user table tablesample then time timestamp to \
    trailing treat trim true union unique user using values varchar variadic verbose when \
    where window with";

/// Postgres's name for the type a column of `dt` has.
fn pg_type(dt: &DataType) -> Option<&'static str> {
    Some(match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text",
        DataType::Boolean => "boolean",
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        DataType::Int64 => "bigint",
        DataType::Float32 => "real",
        DataType::Float64 => "double precision",
        DataType::Decimal128(..) => "numeric",
        DataType::Date32 => "date",
        DataType::Time64(_) => "time without time zone",
        DataType::Timestamp(_, None) => "timestamp without time zone",
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone",
        _ => return None,
    })
}

/// Postgres's name for a type written in a cast.
fn sql_type(t: &SqlType) -> Option<String> {
    let exact = |name: &str, info: &ExactNumberInfo| match info {
        ExactNumberInfo::None => name.to_string(),
        ExactNumberInfo::Precision(p) => format!("{name}({p},0)"),
        ExactNumberInfo::PrecisionAndScale(p, s) => format!("{name}({p},{s})"),
    };
    Some(match t {
        SqlType::Text | SqlType::String(None) => "text".into(),
        SqlType::Varchar(None) | SqlType::CharacterVarying(None) => "character varying".into(),
        SqlType::Varchar(Some(n)) | SqlType::CharacterVarying(Some(n)) => {
            format!("character varying({n})")
        }
        SqlType::Boolean | SqlType::Bool => "boolean".into(),
        SqlType::SmallInt(None) | SqlType::Int2(None) => "smallint".into(),
        SqlType::Int(None) | SqlType::Integer(None) | SqlType::Int4(None) => "integer".into(),
        SqlType::BigInt(None) | SqlType::Int8(None) => "bigint".into(),
        SqlType::Real | SqlType::Float4 => "real".into(),
        SqlType::DoublePrecision | SqlType::Float8 | SqlType::Double(_) => {
            "double precision".into()
        }
        SqlType::Numeric(info) | SqlType::Decimal(info) | SqlType::Dec(info) => {
            exact("numeric", info)
        }
        SqlType::Date => "date".into(),
        SqlType::Timestamp(None, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            "timestamp without time zone".into()
        }
        SqlType::Timestamp(None, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => {
            "timestamp with time zone".into()
        }
        SqlType::Time(None, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            "time without time zone".into()
        }
        SqlType::Uuid => "uuid".into(),
        SqlType::JSON => "json".into(),
        SqlType::JSONB => "jsonb".into(),
        _ => return None,
    })
}

fn is_int4(text: &str) -> bool {
    text.parse::<i32>().is_ok()
}

fn string_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
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

    fn query(&mut self, q: &Query, columns: &Columns) -> Option<()> {
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
                    targets.push((expr.clone(), pg_column_name(&fold(alias))));
                }
                SelectItem::Wildcard(_) => {
                    for r in &self.relations {
                        for (c, _) in &r.columns {
                            let e = Expr::CompoundIdentifier(vec![
                                Ident::new(r.refname.clone()),
                                Ident::new(c.clone()),
                            ]);
                            targets.push((e, c.clone()));
                        }
                    }
                }
                SelectItem::QualifiedWildcard(..) => return None,
            }
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
                JoinConstraint::Using(names) => {
                    let cols = names
                        .iter()
                        .map(|n| Some(quote(&fold(n.0.last()?.as_ident()?))))
                        .collect::<Option<Vec<_>>>()?;
                    self.out.push_str(" USING (");
                    self.out.push_str(&cols.join(", "));
                    self.out.push(')');
                }
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

    fn column_type(&self, e: &Expr) -> Option<&DataType> {
        let e = match e {
            Expr::Nested(inner) => inner,
            other => other,
        };
        let (q, c) = Self::column_parts(e)?;
        self.owner(q.as_deref(), &c).map(|(_, dt)| dt)
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
        Some(match e {
            Expr::Function(_) => format!("({text})"),
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

    /// A constant, typed as Postgres types it (`typed`: the type of what it is compared with).
    fn constant(&self, v: &Value, typed: Option<&DataType>) -> Option<String> {
        Some(match v {
            Value::Number(n, _) => {
                let integral = !n.contains(['.', 'e', 'E']);
                match typed {
                    Some(DataType::Decimal128(..)) if integral => format!("({n})::numeric"),
                    Some(DataType::Float64) => format!("({n})::double precision"),
                    _ if integral && !is_int4(n) => format!("'{n}'::bigint"),
                    _ => n.clone(),
                }
            }
            Value::SingleQuotedString(s) => {
                let label = typed.and_then(pg_type).unwrap_or("text");
                match label {
                    "smallint" | "integer" | "bigint" | "numeric" | "real" | "double precision"
                        if s.trim().parse::<f64>().is_ok() =>
                    {
                        s.trim().to_string()
                    }
                    _ => format!("{}::{label}", string_literal(s)),
                }
            }
            Value::Boolean(b) => b.to_string(),
            Value::Null => "NULL".into(),
            _ => return None,
        })
    }

    fn binary(&self, left: &Expr, op: &str, right: &Expr) -> Option<String> {
        let (l, r) = (
            self.operand(left, self.column_type(right))?,
            self.operand(right, self.column_type(left))?,
        );
        Some(format!("({l} {op} {r})"))
    }

    /// An operand: a constant takes the type of the other side's column.
    fn operand(&self, e: &Expr, other: Option<&DataType>) -> Option<String> {
        match e {
            Expr::Value(v) => self.constant(&v.value, other),
            Expr::Nested(inner) => self.operand(inner, other),
            _ => self.expr(e),
        }
    }

    /// `a AND b AND c` as one list, as Postgres holds it.
    fn flatten<'e>(e: &'e Expr, op: &BinaryOperator, out: &mut Vec<&'e Expr>) {
        match e {
            Expr::BinaryOp { left, op: o, right } if o == op => {
                Self::flatten(left, op, out);
                Self::flatten(right, op, out);
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
            Expr::Value(v) => self.constant(&v.value, None)?,
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
                let typed = self.column_type(expr);
                let items = list
                    .iter()
                    .map(|i| self.operand(i, typed))
                    .collect::<Option<Vec<_>>>()?;
                let (op, any) = if *negated {
                    ("<>", "ALL")
                } else {
                    ("=", "ANY")
                };
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
                    Expr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) => format!("{}::{ty}", string_literal(s)),
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

    fn function(&self, f: &Function) -> Option<String> {
        if f.over.is_some()
            || f.null_treatment.is_some()
            || !f.within_group.is_empty()
            || !matches!(f.parameters, FunctionArguments::None)
        {
            return None;
        }
        let name = parts(&f.name).join(".");
        let mut text = format!("{name}(");
        match &f.args {
            FunctionArguments::None => {}
            FunctionArguments::List(list) => {
                if !list.clauses.is_empty() {
                    return None;
                }
                match list.duplicate_treatment {
                    Some(DuplicateTreatment::Distinct) => text.push_str("DISTINCT "),
                    Some(DuplicateTreatment::All) | None => {}
                }
                let args = list
                    .args
                    .iter()
                    .map(|a| match a {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => self.operand(e, None),
                        FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => Some("*".into()),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?;
                text.push_str(&args.join(", "));
            }
            FunctionArguments::Subquery(_) => return None,
        }
        text.push(')');
        if let Some(filter) = &f.filter {
            text.push_str(&format!(" FILTER (WHERE {})", self.expr(filter)?));
        }
        Some(text)
    }
}

#[cfg(test)]
mod tests;
