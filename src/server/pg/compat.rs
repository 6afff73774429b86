//! Gateway, SQL compatibility: rewrites of plans for Postgres constructs the query engine
//! spells differently. `LIKE ... ESCAPE '<c>'` (SQLAlchemy's reflection escapes with `/`)
//! becomes the equivalent pattern with the backslash escape the engine supports; a timestamp
//! cast to text reads as Postgres prints it (`2024-03-01 08:00:00.5`, not ISO's `T`), which
//! keys and hashes built from text depend on (dbt's snapshot ids, surrogate keys).

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DfResult;
use datafusion::functions::string::expr_fn::replace;
use std::sync::Arc;

use arrow::array::{Array, AsArray, StringArray};
use arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};
use datafusion::common::ExprSchema;
use datafusion::logical_expr::expr::{Like, ScalarFunction};
use datafusion::logical_expr::{lit, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarUDF};

use super::udf;
use datafusion::optimizer::AnalyzerRule;

/// Rewrites `LIKE` patterns with a non-backslash escape character.
#[derive(Debug, Default)]
pub struct LikeEscape;

fn rewrite(e: Expr) -> DfResult<Transformed<Expr>> {
    match e {
        Expr::Like(like) if like.escape_char.is_some_and(|c| c != '\\') => {
            let esc = like.escape_char.unwrap_or('\\');
            // Backslashes are literal under the old escape: escape them, then turn the old
            // escape character into the backslash.
            let pattern = replace(
                replace(*like.pattern, lit("\\"), lit("\\\\")),
                lit(esc.to_string()),
                lit("\\"),
            );
            Ok(Transformed::yes(Expr::Like(Like {
                negated: like.negated,
                expr: like.expr,
                pattern: Box::new(pattern),
                escape_char: Some('\\'),
                case_insensitive: like.case_insensitive,
            })))
        }
        other => Ok(Transformed::no(other)),
    }
}

impl AnalyzerRule for LikeEscape {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| node.map_expressions(|e| e.transform_up(rewrite)))
            .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "skippr_like_escape"
    }
}

/// Casts of timestamps to text, printed as Postgres prints them.
#[derive(Debug)]
pub struct TimestampText {
    udf: Arc<ScalarUDF>,
}

impl Default for TimestampText {
    fn default() -> Self {
        Self {
            udf: Arc::new(udf::function(
                "skippr_timestamp_text",
                DataType::Utf8,
                |args| {
                    let a = udf::arg(args, 0, "skippr_timestamp_text")?;
                    Ok(ColumnarValue::Array(Arc::new(timestamp_text(&a)?)))
                },
            )),
        }
    }
}

/// Timestamps as Postgres's text output (DateStyle ISO) spells them: `YYYY-MM-DD
/// HH:MM:SS`, then the fraction without trailing zeros; with a time zone, in UTC with `+00`.
fn timestamp_text(a: &arrow::array::ArrayRef) -> DfResult<StringArray> {
    let zoned = matches!(a.data_type(), DataType::Timestamp(_, Some(_)));
    let micros = arrow::compute::cast(a, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let micros = micros.as_primitive::<TimestampMicrosecondType>();
    Ok((0..micros.len())
        .map(|i| {
            if micros.is_null(i) {
                return None;
            }
            let t = chrono::DateTime::from_timestamp_micros(micros.value(i))?.naive_utc();
            let mut text = t.format("%Y-%m-%d %H:%M:%S").to_string();
            let fraction = t.and_utc().timestamp_subsec_micros();
            if fraction > 0 {
                let digits = format!("{fraction:06}");
                text.push('.');
                text.push_str(digits.trim_end_matches('0'));
            }
            if zoned {
                text.push_str("+00");
            }
            Some(text)
        })
        .collect())
}

impl TimestampText {
    fn rewrite(&self, e: Expr, schema: &dyn ExprSchema) -> DfResult<Transformed<Expr>> {
        let (inner, to) = match &e {
            Expr::Cast(c) => (&c.expr, &c.data_type),
            Expr::TryCast(c) => (&c.expr, &c.data_type),
            _ => return Ok(Transformed::no(e)),
        };
        if !matches!(
            to,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) {
            return Ok(Transformed::no(e));
        }
        let Ok(DataType::Timestamp(_, _)) = inner.get_type(schema) else {
            return Ok(Transformed::no(e));
        };
        let text = Expr::ScalarFunction(ScalarFunction::new_udf(
            self.udf.clone(),
            vec![(**inner).clone()],
        ));
        Ok(Transformed::yes(match to {
            DataType::Utf8 => text,
            other => Expr::Cast(datafusion::logical_expr::Cast::new(
                Box::new(text),
                other.clone(),
            )),
        }))
    }
}

impl AnalyzerRule for TimestampText {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            // Expressions read the node's input; only nodes of one input are rewritten.
            let schema = match node.inputs().as_slice() {
                [input] => Arc::clone(input.schema()),
                _ => return Ok(Transformed::no(node)),
            };
            node.map_expressions(|e| e.transform_up(|e| self.rewrite(e, schema.as_ref())))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "skippr_timestamp_text"
    }
}

/// A string literal compared with a boolean reads as a boolean (`indisprimary = 'f'`, which
/// SQLAlchemy's reflection sends): Postgres gives an untyped literal the type of what it is
/// compared with. Runs before the engine's type coercion, which refuses `Boolean = Utf8`.
#[derive(Debug, Default)]
pub struct UnknownLiterals;

/// A boolean's text as Postgres reads it (`t`, `true`, `yes`, `on`, `1` and their opposites,
/// any case, any unique prefix of the words).
fn boolean_text(s: &str) -> Option<bool> {
    let t = s.trim().to_ascii_lowercase();
    if t.is_empty() {
        return None;
    }
    let prefix_of = |word: &str| word.starts_with(t.as_str());
    match t.as_str() {
        "1" | "on" => Some(true),
        "0" | "of" | "off" => Some(false),
        _ if prefix_of("true") || prefix_of("yes") => Some(true),
        _ if prefix_of("false") || prefix_of("no") => Some(false),
        _ => None,
    }
}

impl UnknownLiterals {
    fn rewrite(e: Expr, schema: &dyn ExprSchema) -> DfResult<Transformed<Expr>> {
        use datafusion::logical_expr::{BinaryExpr, Operator};
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &e else {
            return Ok(Transformed::no(e));
        };
        if !matches!(
            op,
            Operator::Eq
                | Operator::NotEq
                | Operator::Lt
                | Operator::LtEq
                | Operator::Gt
                | Operator::GtEq
                | Operator::IsDistinctFrom
                | Operator::IsNotDistinctFrom
        ) {
            return Ok(Transformed::no(e));
        }
        let as_boolean = |literal: &Expr, other: &Expr| -> Option<Expr> {
            let Expr::Literal(
                datafusion::common::ScalarValue::Utf8(Some(s))
                | datafusion::common::ScalarValue::Utf8View(Some(s))
                | datafusion::common::ScalarValue::LargeUtf8(Some(s)),
                _,
            ) = literal
            else {
                return None;
            };
            matches!(other.get_type(schema), Ok(DataType::Boolean))
                .then(|| boolean_text(s).map(lit))
                .flatten()
        };
        let (l, r) = (left.as_ref(), right.as_ref());
        let new = match (as_boolean(l, r), as_boolean(r, l)) {
            (Some(b), _) => Expr::BinaryExpr(BinaryExpr::new(Box::new(b), *op, right.clone())),
            (_, Some(b)) => Expr::BinaryExpr(BinaryExpr::new(left.clone(), *op, Box::new(b))),
            _ => return Ok(Transformed::no(e)),
        };
        Ok(Transformed::yes(new))
    }
}

/// Rewrites every expression of `plan` (subqueries included) bottom-up with `rewrite`, which
/// is given the schema the node's expressions read (its input's, or its inputs' together for a
/// join's condition). Result names stay as planned, so the nodes above still find them.
pub(super) fn rewrite_expressions(
    plan: LogicalPlan,
    rewrite: impl Fn(Expr, &dyn ExprSchema) -> DfResult<Transformed<Expr>>,
) -> DfResult<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let schema = match node.inputs().as_slice() {
            [] => return Ok(Transformed::no(node)),
            [input] => Arc::clone(input.schema()),
            many => {
                let mut merged = datafusion::common::DFSchema::empty();
                for input in many {
                    merged.merge(input.schema());
                }
                Arc::new(merged)
            }
        };
        let names = datafusion::logical_expr::expr_rewriter::NamePreserver::new(&node);
        node.map_expressions(|e| {
            let saved = names.save(&e);
            Ok(e.transform_up(|e| rewrite(e, schema.as_ref()))?
                .update_data(|e| saved.restore(e)))
        })
    })
    .map(|t| t.data)
}

impl AnalyzerRule for UnknownLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        rewrite_expressions(plan, Self::rewrite)
    }

    fn name(&self) -> &str {
        "skippr_unknown_literals"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn strings_compared_with_booleans_read_as_booleans() -> DfResult<()> {
        let ctx = datafusion::prelude::SessionContext::new();
        let mut builder =
            datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state());
        if let Some(analyzer) = builder.analyzer().as_mut() {
            analyzer.rules.insert(0, Arc::new(UnknownLiterals));
        }
        let ctx = datafusion::prelude::SessionContext::new_with_state(builder.build());
        let batches = ctx
            .sql(
                "SELECT count(*) AS n FROM (VALUES (true), (false), (false)) AS v(b) \
                 WHERE b = 'f' AND 'no' = b AND b <> 'TRUE'",
            )
            .await?
            .collect()
            .await?;
        let n = arrow::compute::cast(batches[0].column(0), &DataType::Utf8)?;
        assert_eq!(n.as_string::<i32>().value(0), "2");
        assert_eq!(boolean_text("of"), Some(false));
        assert_eq!(boolean_text("o"), None);
        assert_eq!(boolean_text(" Yes "), Some(true));
        Ok(())
    }

    #[tokio::test]
    async fn timestamps_read_as_postgres_prints_them() -> DfResult<()> {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(TimestampText::default()));
        let batches = ctx
            .sql(
                "SELECT CAST(TIMESTAMP '2024-03-01 08:00:00.250' AS VARCHAR) AS a, \
                 CAST(TIMESTAMP '2024-03-01 08:00:00' AS TEXT) || '|' AS b, \
                 CAST(DATE '2024-03-01' AS VARCHAR) AS c",
            )
            .await?
            .collect()
            .await?;
        let row = |c: usize| -> DfResult<String> {
            let text = arrow::compute::cast(batches[0].column(c), &DataType::Utf8)?;
            Ok(text.as_string::<i32>().value(0).to_string())
        };
        assert_eq!(row(0)?, "2024-03-01 08:00:00.25");
        assert_eq!(row(1)?, "2024-03-01 08:00:00|");
        assert_eq!(row(2)?, "2024-03-01");
        Ok(())
    }
}
