//! Gateway, from a parsed statement to its plan: the statement a session keeps between
//! parse and execute, the planner called on the syntax tree (never on text again), and the
//! read-only rules every plan is checked against, whatever the classifier said.

use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;

/// A prepared statement: its SQL as planned, and its parsed statement and plan (none for
/// an empty query). The statement hooks expect this very type in the portal store.
pub(super) type Stmt = (String, Option<(SqlStatement, LogicalPlan)>);

/// The read-only rules the engine checks on every plan.
fn read_only_options() -> SQLOptions {
    crate::query::read_only_options()
}

/// Fails unless `plan` only reads: no DDL, no DML (COPY included), no engine statement.
pub(super) fn verify_read_only(plan: &LogicalPlan) -> datafusion::error::Result<()> {
    read_only_options().verify_plan(plan)
}

/// Plans `statement` as parsed (never from its text).
pub(super) async fn plan_statement(
    ctx: &SessionContext,
    statement: &SqlStatement,
) -> datafusion::error::Result<LogicalPlan> {
    ctx.state()
        .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
            statement.clone(),
        )))
        .await
}
