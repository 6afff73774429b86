//! Gateway, models, transactions: `BEGIN`, `COMMIT`, `ROLLBACK` as Postgres answers them. A
//! `BEGIN` inside a transaction is a WARNING (psycopg2, and so dbt, sends its own `BEGIN`
//! before dbt's), a `COMMIT` outside one too; `COMMIT` makes the transaction's model changes
//! visible to every session at once, `ROLLBACK` (or `COMMIT` of a failed transaction)
//! forgets them. After an error inside a transaction, every other statement is refused
//! until it ends (25P02).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::hooks::HookClient;
use pgwire::api::results::{Response, Tag};
use pgwire::error::{ErrorInfo, PgWireResult};
use pgwire::messages::response::{NoticeResponse, TransactionStatus};
use pgwire::messages::PgWireBackendMessage;

use super::{user_error, SessionModels};
use crate::error::sqlstate;
use crate::server::statements::{placeholder_plan, Answer};

/// Answers transaction control for one session.
pub struct TransactionHook {
    pub models: Arc<SessionModels>,
}

async fn warning(client: &mut dyn HookClient, code: &str, message: &str) -> PgWireResult<()> {
    let info = ErrorInfo::new("WARNING".to_string(), code.to_string(), message.to_string());
    client
        .send_message(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
            info,
        )))
        .await
}

fn is_control(statement: &Statement) -> bool {
    matches!(
        statement,
        Statement::StartTransaction { .. }
            | Statement::Commit { .. }
            | Statement::Rollback {
                savepoint: None,
                ..
            }
    )
}

impl TransactionHook {
    async fn respond(
        &self,
        statement: &Statement,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        let status = client.transaction_status();
        match statement {
            Statement::StartTransaction { .. } => Some(match status {
                TransactionStatus::Idle => Ok(Response::TransactionStart(Tag::new("BEGIN"))),
                TransactionStatus::Transaction => {
                    match warning(
                        client,
                        sqlstate::ACTIVE_SQL_TRANSACTION,
                        "there is already a transaction in progress",
                    )
                    .await
                    {
                        Ok(()) => Ok(Response::Execution(Tag::new("BEGIN"))),
                        Err(e) => Err(e),
                    }
                }
                TransactionStatus::Error => Err(aborted()),
            }),
            Statement::Commit { .. } => Some(match status {
                TransactionStatus::Idle => {
                    match warning(
                        client,
                        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                        "there is no transaction in progress",
                    )
                    .await
                    {
                        Ok(()) => Ok(Response::TransactionEnd(Tag::new("COMMIT"))),
                        Err(e) => Err(e),
                    }
                }
                TransactionStatus::Transaction => match self.models.commit().await {
                    Ok(()) => Ok(Response::TransactionEnd(Tag::new("COMMIT"))),
                    // The transaction ends either way, as Postgres's does on a failed
                    // COMMIT; the client learns why.
                    Err(e) => {
                        client.set_transaction_status(TransactionStatus::Idle);
                        Err(e)
                    }
                },
                TransactionStatus::Error => {
                    self.models.rollback().await;
                    Ok(Response::TransactionEnd(Tag::new("ROLLBACK")))
                }
            }),
            Statement::Rollback {
                savepoint: None, ..
            } => {
                if status == TransactionStatus::Idle {
                    if let Err(e) = warning(
                        client,
                        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                        "there is no transaction in progress",
                    )
                    .await
                    {
                        return Some(Err(e));
                    }
                }
                self.models.rollback().await;
                Some(Ok(Response::TransactionEnd(Tag::new("ROLLBACK"))))
            }
            _ if status == TransactionStatus::Error => Some(Err(aborted())),
            _ => None,
        }
    }
}

fn aborted() -> pgwire::error::PgWireError {
    user_error(
        sqlstate::IN_FAILED_SQL_TRANSACTION,
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

#[async_trait]
impl Answer for TransactionHook {
    async fn answer(
        &self,
        statement: &Statement,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        self.respond(statement, client).await
    }

    fn describe(&self, statement: &Statement) -> Option<PgWireResult<LogicalPlan>> {
        is_control(statement)
            .then(|| placeholder_plan(datafusion::arrow::datatypes::Schema::empty(), false))
    }
}
