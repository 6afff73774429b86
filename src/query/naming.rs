//! Result column names, shared by `skipprd query` and the gateway: a column the query did not
//! name gets the name Postgres would give it (`count`, `sum`, `?column?`), so scripts see the
//! same headers from either.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema, SchemaRef};

use datafusion::sql::sqlparser::ast::{
    AccessExpr, ArrayElemTypeDef, DataType as SqlType, ExactNumberInfo, Expr, Ident,
    ObjectNamePart, Query, SelectItem, SelectItemQualifiedWildcardKind, SetExpr, Statement,
    TimezoneInfo, TrimWhereField, VisitMut, VisitorMut,
};

use crate::error::Result;

/// What follows a result column's name where the gateway names it for the engine: a
/// character of Unicode's private use area, then a number when the statement gives two
/// columns one name (the engine needs unique names). [`pg_column_name`] drops both, so
/// clients see Postgres's names; the mark also keeps the engine from confusing the name with
/// a column of the same name it adds to sort by.
pub const DUPLICATE_MARK: char = '\u{E000}';

/// Names result columns as Postgres names them. The statement's outermost select list (each
/// `SELECT` of a set operation) has every unnamed expression other than a bare column named
/// as Postgres names it (`count`, `?column?`, `date_trunc`, `case`), and in every select
/// list of the statement a name given twice is made unique; both with [`DUPLICATE_MARK`].
/// Returns whether anything was named.
pub fn name_like_postgres(statement: &mut Statement) -> bool {
    struct Namer {
        depth: usize,
        changed: bool,
    }
    impl VisitorMut for Namer {
        type Break = ();
        fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
            self.changed |= name_set_expr(q.body.as_mut(), self.depth == 0);
            self.depth += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
            self.depth = self.depth.saturating_sub(1);
            ControlFlow::Continue(())
        }
    }
    let mut namer = Namer {
        depth: 0,
        changed: false,
    };
    let _ = statement.visit(&mut namer);
    namer.changed
}

/// Names the select lists of `body`: every unnamed expression when `outermost`, else only
/// names given twice.
fn name_set_expr(body: &mut SetExpr, outermost: bool) -> bool {
    match body {
        SetExpr::Select(select) => name_select(&mut select.projection, outermost),
        SetExpr::SetOperation { left, right, .. } => {
            let l = name_set_expr(left, outermost);
            name_set_expr(right, outermost) | l
        }
        SetExpr::Query(q) => name_set_expr(q.body.as_mut(), outermost),
        _ => false,
    }
}

/// An identifier as Postgres folds it: unquoted is lower case.
fn folded(i: &Ident) -> String {
    match i.quote_style {
        Some(_) => i.value.clone(),
        None => i.value.to_lowercase(),
    }
}

/// What a select list's wildcards bring in: `*` (every column of every relation), and the
/// qualifiers of `q.*`, folded.
struct Wildcards {
    all: bool,
    qualified: Vec<String>,
}

impl Wildcards {
    fn of(items: &[SelectItem]) -> Self {
        let mut w = Wildcards {
            all: false,
            qualified: Vec::new(),
        };
        for item in items {
            match item {
                SelectItem::Wildcard(_) => w.all = true,
                SelectItem::QualifiedWildcard(
                    SelectItemQualifiedWildcardKind::ObjectName(n),
                    _,
                ) => w.qualified.push(
                    n.0.iter()
                        .filter_map(|p| p.as_ident().map(folded))
                        .collect::<Vec<_>>()
                        .join("."),
                ),
                _ => {}
            }
        }
        w
    }

    /// Whether a wildcard of the list may output the column `parts` names too: any column
    /// beside `*`, `q.c` beside `q.*` (or `s.q.*`), and, in the outermost list only (where a
    /// name given here never reaches a reference), a bare column beside `q.*`. Postgres
    /// outputs both under one name; the engine needs the second one named apart.
    fn repeats(&self, parts: &[Ident], outermost: bool) -> bool {
        let same = |a: &str, b: &str| {
            a == b || a.ends_with(&format!(".{b}")) || b.ends_with(&format!(".{a}"))
        };
        match parts {
            [] => false,
            [_] => self.all || (outermost && !self.qualified.is_empty()),
            [qualifier @ .., _] => {
                self.all || {
                    let q = qualifier.iter().map(folded).collect::<Vec<_>>().join(".");
                    self.qualified.iter().any(|w| same(w, &q))
                }
            }
        }
    }
}

fn name_select(items: &mut [SelectItem], outermost: bool) -> bool {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let wildcards = Wildcards::of(items);
    let mut changed = false;
    for item in items.iter_mut() {
        let (name, named) = match item {
            SelectItem::UnnamedExpr(e) => match e {
                Expr::Identifier(i) => (
                    folded(i),
                    !wildcards.repeats(std::slice::from_ref(i), outermost),
                ),
                Expr::CompoundIdentifier(parts) => match parts.last() {
                    Some(i) => (folded(i), !wildcards.repeats(parts, outermost)),
                    None => continue,
                },
                e => (figure_name(e), false),
            },
            SelectItem::ExprWithAlias { alias, .. } => {
                let name = folded(alias);
                match name.split_once(DUPLICATE_MARK) {
                    // Named here before (a statement is named once, but be safe).
                    Some((plain, _)) => (plain.to_string(), true),
                    None => (name, true),
                }
            }
            _ => continue,
        };
        let n = seen.entry(name.clone()).or_insert(0);
        *n += 1;
        let repeated = matches!(
            item,
            SelectItem::UnnamedExpr(Expr::Identifier(_) | Expr::CompoundIdentifier(_))
        ) && !named;
        let alias = match (*n, named) {
            (1, true) => continue,
            (1, false) if !outermost && !repeated => continue,
            (1, false) => format!("{name}{DUPLICATE_MARK}"),
            (k, _) => format!("{name}{DUPLICATE_MARK}{k}"),
        };
        if matches!(item, SelectItem::ExprWithAlias { alias: a, .. } if a.value.contains(DUPLICATE_MARK))
        {
            continue;
        }
        let alias = Ident::with_quote('"', alias);
        changed = true;
        *item = match std::mem::replace(item, SelectItem::Wildcard(Default::default())) {
            SelectItem::UnnamedExpr(expr) | SelectItem::ExprWithAlias { expr, .. } => {
                SelectItem::ExprWithAlias { expr, alias }
            }
            other => other,
        };
    }
    changed
}

/// The name Postgres gives an expression in a select list (its `FigureColname`).
pub fn figure_name(e: &Expr) -> String {
    figure(e).0.unwrap_or_else(|| "?column?".into())
}

/// Postgres's `FigureColnameInternal`: a name and how strong it is (2: a column's or a
/// function's name; 1: a type's name, or `case`; 0: none).
fn figure(e: &Expr) -> (Option<String>, u8) {
    let strong = |n: &str| (Some(n.to_string()), 2);
    match e {
        Expr::Identifier(i) => (Some(folded(i)), 2),
        Expr::CompoundIdentifier(parts) => (parts.last().map(folded), 2),
        Expr::Function(f) => match f.name.0.last() {
            Some(ObjectNamePart::Identifier(i)) => (Some(folded(i)), 2),
            _ => (None, 0),
        },
        Expr::Cast {
            expr, data_type, ..
        } => match figure(expr) {
            (_, s) if s <= 1 => (Some(type_label(data_type)), 1),
            named => named,
        },
        Expr::TypedString(t) => (Some(type_label(&t.data_type)), 1),
        Expr::Interval(_) => (Some("interval".into()), 1),
        Expr::Nested(inner) | Expr::Collate { expr: inner, .. } => figure(inner),
        Expr::CompoundFieldAccess { root, access_chain } => match access_chain.last() {
            Some(AccessExpr::Dot(Expr::Identifier(i))) => (Some(folded(i)), 2),
            _ => figure(root),
        },
        Expr::Case { else_result, .. } => match else_result.as_deref().map(figure) {
            Some(named @ (_, 2)) => named,
            _ => (Some("case".into()), 1),
        },
        Expr::Exists { .. } => strong("exists"),
        Expr::Array(_) => strong("array"),
        Expr::Tuple(_) => strong("row"),
        Expr::Extract { .. } => strong("extract"),
        Expr::Substring { .. } => strong("substring"),
        Expr::Position { .. } => strong("position"),
        Expr::Overlay { .. } => strong("overlay"),
        Expr::Ceil { .. } => strong("ceil"),
        Expr::Floor { .. } => strong("floor"),
        Expr::AtTimeZone { .. } => strong("timezone"),
        Expr::Trim { trim_where, .. } => match trim_where {
            Some(TrimWhereField::Leading) => strong("ltrim"),
            Some(TrimWhereField::Trailing) => strong("rtrim"),
            _ => strong("btrim"),
        },
        Expr::Subquery(q) => match q.body.as_ref() {
            SetExpr::Select(s) => match s.projection.first() {
                Some(SelectItem::ExprWithAlias { alias, .. }) => (Some(folded(alias)), 2),
                Some(SelectItem::UnnamedExpr(e)) => (Some(figure_name(e)), 2),
                _ => (None, 0),
            },
            _ => (None, 0),
        },
        _ => (None, 0),
    }
}

/// The name Postgres gives a cast to `t` when what it casts has none: the type's own name
/// (`int4` for `integer`, `varchar` for `character varying`).
fn type_label(t: &SqlType) -> String {
    match t {
        SqlType::Int(_) | SqlType::Integer(_) | SqlType::Int4(_) => "int4".into(),
        SqlType::BigInt(_) | SqlType::Int8(_) => "int8".into(),
        SqlType::SmallInt(_) | SqlType::Int2(_) => "int2".into(),
        SqlType::Real | SqlType::Float4 => "float4".into(),
        SqlType::DoublePrecision | SqlType::Float8 | SqlType::Double(_) => "float8".into(),
        SqlType::Float(p) => match p {
            ExactNumberInfo::Precision(p) | ExactNumberInfo::PrecisionAndScale(p, _)
                if *p <= 24 =>
            {
                "float4".into()
            }
            _ => "float8".into(),
        },
        SqlType::Boolean | SqlType::Bool => "bool".into(),
        SqlType::Varchar(_) | SqlType::CharacterVarying(_) => "varchar".into(),
        SqlType::Char(_) | SqlType::Character(_) => "bpchar".into(),
        SqlType::Numeric(_) | SqlType::Decimal(_) | SqlType::Dec(_) => "numeric".into(),
        SqlType::Timestamp(_, TimezoneInfo::Tz | TimezoneInfo::WithTimeZone) => {
            "timestamptz".into()
        }
        SqlType::Timestamp(_, _) => "timestamp".into(),
        SqlType::Time(_, TimezoneInfo::Tz | TimezoneInfo::WithTimeZone) => "timetz".into(),
        SqlType::Time(_, _) => "time".into(),
        SqlType::Array(ArrayElemTypeDef::SquareBracket(inner, _))
        | SqlType::Array(ArrayElemTypeDef::AngleBracket(inner))
        | SqlType::Array(ArrayElemTypeDef::Parenthesis(inner)) => type_label(inner),
        SqlType::Custom(name, _) => match name.0.last() {
            Some(ObjectNamePart::Identifier(i)) => folded(i),
            _ => name.to_string().to_lowercase(),
        },
        other => {
            let text = other.to_string().to_lowercase();
            text.split('(')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        }
    }
}

/// The name Postgres gives a result column the query did not name: a function call is named
/// after the function (`count(*)` is `count`), a cast after what it casts, a bare column
/// after the column, anything else `?column?`. Names the query gave stay as they are.
pub fn pg_column_name(name: &str) -> String {
    if let Some((named, _)) = name.split_once(DUPLICATE_MARK) {
        return named.to_string();
    }
    fn is_ident(s: &str) -> bool {
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
    }
    if !name.contains('(') {
        // A qualified column (`schema.table.column`) is named after the column; any other
        // name (a column called `order-id`, say) is kept.
        if name.contains('.') && name.split('.').all(is_ident) {
            return name.rsplit('.').next().unwrap_or(name).to_string();
        }
        return name.to_string();
    }
    let Some((func, rest)) = name.split_once('(') else {
        return "?column?".to_string();
    };
    // One call spanning the whole name: its opening parenthesis closes at the end.
    let mut depth = 0usize;
    let mut closes_at_end = false;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                closes_at_end = i == rest.len() - 1;
                break;
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    if !closes_at_end || !is_ident(func) {
        return "?column?".to_string();
    }
    const LITERAL_TYPES: &[&str] = &[
        "Int8",
        "Int16",
        "Int32",
        "Int64",
        "UInt8",
        "UInt16",
        "UInt32",
        "UInt64",
        "Float16",
        "Float32",
        "Float64",
        "Utf8",
        "Utf8View",
        "LargeUtf8",
        "Boolean",
        "Decimal128",
        "Date32",
        "Binary",
        "NULL",
        "Null",
    ];
    if LITERAL_TYPES.contains(&func) || func.starts_with("Timestamp") || func.starts_with("Time64")
    {
        return "?column?".to_string();
    }
    if func.eq_ignore_ascii_case("cast") || func.eq_ignore_ascii_case("try_cast") {
        let inner = &rest[..rest.len() - 1];
        let inner = inner.rsplit_once(" AS ").map(|(e, _)| e).unwrap_or(inner);
        return pg_column_name(inner.trim());
    }
    func.to_ascii_lowercase()
}

/// `schema` and `batches` with every column named as Postgres names it.
pub fn rename_like_postgres(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_name(pg_column_name(f.name())))
        .collect();
    let renamed = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let batches = batches
        .into_iter()
        .map(|b| RecordBatch::try_new(renamed.clone(), b.columns().to_vec()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((renamed, batches))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(sql: &str) -> String {
        use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
        use datafusion::sql::sqlparser::parser::Parser;
        let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).unwrap_or_default();
        for s in statements.iter_mut() {
            name_like_postgres(s);
        }
        statements
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    }

    #[test]
    fn select_lists_are_named_as_postgres_names_them() {
        let m = DUPLICATE_MARK;
        assert_eq!(
            named("SELECT count(*), count(*) FROM t"),
            format!("SELECT count(*) AS \"count{m}\", count(*) AS \"count{m}2\" FROM t")
        );
        assert_eq!(
            named("SELECT 1 AS a, 2 AS a, a.id, b.id"),
            format!("SELECT 1 AS a, 2 AS \"a{m}2\", a.id, b.id AS \"id{m}2\"")
        );
        assert_eq!(
            named("SELECT 1, x::int, 2::integer, 'a'::text, CAST(y AS varchar(3)), indkey[0], \
                   CASE WHEN true THEN 1 END, CASE WHEN v THEN '' ELSE w::text END, \
                   DATE_TRUNC('day', ts), a + b"),
            format!(
                "SELECT 1 AS \"?column?{m}\", x::INT AS \"x{m}\", 2::INTEGER AS \"int4{m}\", \
                 'a'::TEXT AS \"text{m}\", CAST(y AS VARCHAR(3)) AS \"y{m}\", indkey[0] AS \"indkey{m}\", \
                 CASE WHEN true THEN 1 END AS \"case{m}\", \
                 CASE WHEN v THEN '' ELSE w::TEXT END AS \"w{m}\", \
                 DATE_TRUNC('day', ts) AS \"date_trunc{m}\", a + b AS \"?column?{m}2\""
            )
        );
        // Each select of a union is named; subqueries only where a name repeats.
        assert_eq!(
            named("SELECT max(x) FROM (SELECT count(*), count(*) FROM t) s UNION ALL SELECT 1"),
            format!(
                "SELECT max(x) AS \"max{m}\" FROM (SELECT count(*), count(*) AS \"count{m}2\" FROM t) s \
                 UNION ALL SELECT 1 AS \"?column?{m}\""
            )
        );
        assert_eq!(
            named("SELECT a, t.b AS c FROM t"),
            "SELECT a, t.b AS c FROM t"
        );
        // A column a wildcard of the same list outputs too is named apart, in subqueries as
        // well; one the wildcard may not output is left alone.
        assert_eq!(
            named("SELECT *, id FROM t"),
            format!("SELECT *, id AS \"id{m}\" FROM t")
        );
        assert_eq!(
            named("SELECT x FROM (SELECT s.*, S.id, o.id FROM t s JOIN o ON true) q"),
            format!(
                "SELECT x FROM (SELECT s.*, S.id AS \"id{m}\", o.id AS \"id{m}2\" \
                 FROM t s JOIN o ON true) q"
            )
        );
        // A bare column beside `q.*` in a subquery may come from another relation, and an
        // outer query may name it: only the outermost list names it apart.
        assert_eq!(
            named("WITH x AS (SELECT o.*, name FROM o JOIN c USING (k)) SELECT name FROM x"),
            "WITH x AS (SELECT o.*, name FROM o JOIN c USING(k)) SELECT name FROM x"
        );
        assert_eq!(
            named("SELECT o.*, name FROM o"),
            format!("SELECT o.*, name AS \"name{m}\" FROM o")
        );
        assert_eq!(
            named("SELECT a.* FROM (SELECT s.*, o.id FROM t s JOIN o ON true) a"),
            "SELECT a.* FROM (SELECT s.*, o.id FROM t s JOIN o ON true) a"
        );
        assert_eq!(pg_column_name(&format!("count{m}2")), "count");
        assert_eq!(pg_column_name(&format!("?column?{m}")), "?column?");
    }

    #[test]
    fn unnamed_columns_are_named_like_postgres() {
        assert_eq!(pg_column_name("id"), "id");
        assert_eq!(pg_column_name("count(*)"), "count");
        assert_eq!(pg_column_name("sum(analytics.orders.amount)"), "sum");
        assert_eq!(pg_column_name("Int64(1)"), "?column?");
        assert_eq!(
            pg_column_name("analytics.orders.amount * Int64(2)"),
            "?column?"
        );
        assert_eq!(pg_column_name("order-id"), "order-id");
        assert_eq!(pg_column_name("CAST(analytics.t.id AS Utf8)"), "id");
        assert_eq!(pg_column_name("analytics.t.id"), "id");
        assert_eq!(pg_column_name("max(a) + min(b)"), "?column?");
        assert_eq!(pg_column_name("version()"), "version");
    }
}
