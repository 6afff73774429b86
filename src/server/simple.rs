//! Gateway, a simple-query message (`Query`), statement by statement: each statement of
//! "SELECT 1; SELECT ..." is planned, run and has its rows sent before the next one starts,
//! each under its own `statement_timeout` (as Postgres 13+), and an error ends the message
//! there (the statements before it have answered, the ones after it do not run).

use std::fmt::Debug;

use futures::{Sink, SinkExt};
use pgwire::api::copy::{send_copy_both_response, send_copy_in_response, send_copy_out_response};
use pgwire::api::query::{send_execution_response, send_query_response, send_ready_for_query};
use pgwire::api::results::Response;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireConnectionState};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::response::EmptyQueryResponse;
use pgwire::messages::simplequery::Query;
use pgwire::messages::PgWireBackendMessage;

use super::session::{statement_timeout, Session};

/// A message of only semicolons and white space is an empty query (as Postgres).
fn is_empty_query(q: &str) -> bool {
    q.chars().all(|c| c == ';' || c.is_whitespace())
}

impl Session {
    /// Answers one `Query` message: the statements' responses, then ReadyForQuery. An
    /// error is returned for the protocol library to send (with ReadyForQuery).
    pub(super) async fn query_message<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        if is_empty_query(&query.query) {
            send_response(client, Response::EmptyQuery).await?;
        } else {
            // Parsing and rewriting count towards the first statement.
            let limits = self.begin(&*client);
            let statements = self.parse_message(client, &query.query).await?;
            if statements.is_empty() {
                send_response(client, Response::EmptyQuery).await?;
            }
            for (i, (statement, allowed)) in statements.iter().enumerate() {
                if i > 0 {
                    // A new deadline from the session's setting now (an earlier statement
                    // of the message may have SET it); a cancel request still pending
                    // stops this statement too.
                    self.exec.interrupts.restart(statement_timeout(&*client));
                }
                let response = self.statement_response(client, statement, *allowed).await?;
                let sent = send_response(client, response).await?;
                // Notices the statement raised (a signal's WARNING) follow its response.
                self.exec.activity.send_notices(client).await?;
                if !sent {
                    break;
                }
            }
            drop(limits);
        }
        if !matches!(client.state(), PgWireConnectionState::CopyInProgress(_)) {
            client.set_state(PgWireConnectionState::ReadyForQuery);
            send_ready_for_query(client, client.transaction_status()).await?;
        }
        Ok(())
    }
}

/// Sends one statement's response and tracks the transaction status it implies. Returns
/// false when the statement failed (its error sent), so that the message ends there.
async fn send_response<C>(client: &mut C, response: Response) -> PgWireResult<bool>
where
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let status = client.transaction_status();
    match response {
        Response::EmptyQuery => {
            client
                .feed(PgWireBackendMessage::EmptyQueryResponse(
                    EmptyQueryResponse::new(),
                ))
                .await?;
        }
        Response::Query(results) => send_query_response(client, results, true).await?,
        Response::Execution(tag) => send_execution_response(client, tag).await?,
        Response::TransactionStart(tag) => {
            send_execution_response(client, tag).await?;
            client.set_transaction_status(status.to_in_transaction_state());
        }
        Response::TransactionEnd(tag) => {
            send_execution_response(client, tag).await?;
            client.set_transaction_status(status.to_idle_state());
        }
        Response::Error(e) => {
            client
                .feed(PgWireBackendMessage::ErrorResponse((*e).into()))
                .await?;
            client.set_transaction_status(status.to_error_state());
            return Ok(false);
        }
        Response::CopyIn(result) => {
            send_copy_in_response(client, result).await?;
            client.set_state(PgWireConnectionState::CopyInProgress(false));
        }
        Response::CopyOut(result) => send_copy_out_response(client, result).await?,
        Response::CopyBoth(result) => {
            send_copy_both_response(client, result).await?;
            client.set_state(PgWireConnectionState::CopyInProgress(false));
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::is_empty_query;

    #[test]
    fn only_semicolons_and_spaces_are_empty() {
        assert!(is_empty_query(" ; ;\n"));
        assert!(is_empty_query(""));
        assert!(!is_empty_query("SELECT 1;"));
    }
}
