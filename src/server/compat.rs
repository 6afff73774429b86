//! Gateway, SQL compatibility: rewrites of plans for Postgres constructs the query engine
//! spells differently. `LIKE ... ESCAPE '<c>'` (SQLAlchemy's reflection escapes with `/`)
//! becomes the equivalent pattern with the backslash escape the engine supports.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DfResult;
use datafusion::functions::string::expr_fn::replace;
use datafusion::logical_expr::expr::Like;
use datafusion::logical_expr::{lit, Expr, LogicalPlan};
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
