//! Gateway, session statements with nothing to do on read-only data: savepoints (psycopg and
//! SQLAlchemy wrap reflection in them), `SET TRANSACTION` and `DISCARD` (connection poolers
//! send it). They succeed with the tag Postgres sends.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::Schema;
use datafusion::common::{DFSchema, ParamValues};
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::QueryHook;
use pgwire::api::results::{Response, Tag};
use pgwire::api::ClientInfo;
use pgwire::error::{PgWireError, PgWireResult};

/// The plan a hook gives a statement it answers itself, so that a prepared statement can
/// describe its result (`columns`) before it is executed.
pub fn placeholder_plan(columns: Schema, one_row: bool) -> PgWireResult<LogicalPlan> {
    DFSchema::try_from(columns)
        .map(|schema| {
            LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: one_row,
                schema: Arc::new(schema),
            })
        })
        .map_err(|e| PgWireError::ApiError(Box::new(e)))
}

/// Accepts savepoints and `DISCARD`.
pub struct SessionStatementsHook;

fn tag(statement: &Statement) -> Option<&'static str> {
    Some(match statement {
        Statement::Savepoint { .. } => "SAVEPOINT",
        Statement::ReleaseSavepoint { .. } => "RELEASE",
        Statement::Rollback {
            savepoint: Some(_), ..
        } => "ROLLBACK",
        Statement::Discard { .. } => "DISCARD ALL",
        Statement::Set(datafusion::sql::sqlparser::ast::Set::SetTransaction { .. }) => "SET",
        _ => return None,
    })
}

#[async_trait]
impl Answer for SessionStatementsHook {
    async fn answer(
        &self,
        statement: &Statement,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        tag(statement).map(|t| Ok(Response::Execution(Tag::new(t))))
    }

    fn describe(&self, statement: &Statement) -> Option<PgWireResult<LogicalPlan>> {
        tag(statement)?;
        Some(placeholder_plan(Schema::empty(), false))
    }
}

/// A statement hook that answers a statement the same way in the simple and the extended
/// protocol: as [`Hook`] runs it.
#[async_trait]
pub trait Answer: Send + Sync {
    /// The response to `statement`, or `None` when this hook does not answer it.
    async fn answer(
        &self,
        statement: &Statement,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>>;

    /// The plan a prepared `statement` this hook answers describes its result with.
    fn describe(&self, statement: &Statement) -> Option<PgWireResult<LogicalPlan>>;
}

/// An [`Answer`] as a hook of both protocols.
pub struct Hook<T>(pub T);

#[async_trait]
impl<T: Answer> QueryHook for Hook<T> {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _session_context: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        self.0.answer(statement, client).await
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _session_context: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        self.0.describe(statement)
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _logical_plan: &LogicalPlan,
        _params: &ParamValues,
        _session_context: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        self.0.answer(statement, client).await
    }
}
