//! Gateway, write guard: replicated tables change only through the source, so statements
//! that would write or change the schema are refused with SQLSTATE 25006, as Postgres does
//! in a read-only transaction.

use async_trait::async_trait;
use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::QueryHook;
use pgwire::api::results::Response;
use pgwire::api::ClientInfo;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};

/// Refuses writes and DDL.
pub struct ReadOnlyHook;

/// The command a statement would run, when it writes or changes the catalog.
fn write_command(statement: &Statement) -> Option<&'static str> {
    Some(match statement {
        Statement::Insert(_) => "INSERT",
        Statement::Update { .. } => "UPDATE",
        Statement::Delete(_) => "DELETE",
        Statement::Merge { .. } => "MERGE",
        Statement::Truncate { .. } => "TRUNCATE",
        Statement::Copy { to: false, .. } => "COPY FROM",
        Statement::CreateTable(_) => "CREATE TABLE",
        Statement::CreateView { .. } => "CREATE VIEW",
        Statement::CreateIndex(_) => "CREATE INDEX",
        Statement::CreateSchema { .. } => "CREATE SCHEMA",
        Statement::CreateDatabase { .. } => "CREATE DATABASE",
        Statement::CreateFunction(_) => "CREATE FUNCTION",
        Statement::AlterTable { .. } => "ALTER TABLE",
        Statement::AlterView { .. } => "ALTER VIEW",
        Statement::AlterIndex { .. } => "ALTER INDEX",
        Statement::AlterSchema(_) => "ALTER SCHEMA",
        Statement::Drop { .. } => "DROP",
        Statement::DropFunction { .. } => "DROP FUNCTION",
        Statement::Grant { .. } => "GRANT",
        Statement::Revoke { .. } => "REVOKE",
        Statement::Comment { .. } => "COMMENT",
        _ => return None,
    })
}

fn refuse(command: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        "25006".to_string(),
        format!(
            "cannot execute {command} in a read-only transaction: Skippr serves tables replicated from Postgres read-only; write to the source database instead"
        ),
    )))
}

#[async_trait]
impl QueryHook for ReadOnlyHook {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _session_context: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        write_command(statement).map(|c| Err(refuse(c)))
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _session_context: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        write_command(statement).map(|c| Err(refuse(c)))
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _logical_plan: &LogicalPlan,
        _params: &ParamValues,
        _session_context: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        write_command(statement).map(|c| Err(refuse(c)))
    }
}
