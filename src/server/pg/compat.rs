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

#[cfg(test)]
mod tests {
    use super::*;

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
