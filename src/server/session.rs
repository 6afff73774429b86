//! Gateway, one connection: its own DataFusion session (so `SET` stays private to it), its
//! start-up handler, and the statement accounting that metrics and a graceful stop rely on.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use datafusion::prelude::SessionContext;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::{DfSessionService, Parser, QueryHook};
use futures::Sink;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{DefaultServerParameterProvider, StartupHandler};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::Portal;
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::Response;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionManager, ErrorHandler, PgWireServerHandlers,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::simplequery::Query;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::errors::SqlStateErrors;
use super::readonly::ReadOnlyHook;
use super::statements::SessionStatementsHook;
use super::Shared;
use crate::telemetry::metrics;

/// The handlers of one client connection.
pub struct ConnHandlers {
    pub(super) shared: Arc<Shared>,
    service: Arc<Session>,
}

impl ConnHandlers {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        let ctx = Arc::new(SessionContext::new_with_state(shared.base.clone()));
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(ReadOnlyHook),
            Arc::new(SessionStatementsHook),
            Arc::new(CursorStatementHook),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
        ];
        let service = Arc::new(Session {
            inner: DfSessionService::new_with_hooks(ctx, hooks),
            shared: shared.clone(),
        });
        Self { shared, service }
    }
}

impl PgWireServerHandlers for ConnHandlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.service.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.service.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::new(self.handlers_startup())
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(SqlStateErrors)
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.shared.connections.clone()))
    }
}

/// Trust for loopback clients when no users are configured.
pub struct Trust {
    pub connections: Arc<ConnectionManager>,
}

#[async_trait]
impl NoopStartupHandler for Trust {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.connections.clone())
    }
}

/// How a connection authenticates.
pub enum Startup {
    Trust(Trust),
    Scram(SASLAuthStartupHandler<DefaultServerParameterProvider>),
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Trust(t) => t.on_startup(client, message).await,
            Startup::Scram(s) => s.on_startup(client, message).await,
        }
    }
}

/// One connection's query service: DataFusion's, with accounting around each statement.
pub struct Session {
    inner: DfSessionService,
    shared: Arc<Shared>,
}

impl Session {
    fn finish(&self, started: Instant, ok: bool) {
        self.shared.end();
        metrics::query_done(started.elapsed(), ok);
    }
}

#[async_trait]
impl SimpleQueryHandler for Session {
    async fn on_query<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.shared.begin();
        let started = Instant::now();
        let result = self._on_query(client, query).await;
        self.finish(started, result.is_ok());
        result
    }

    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        <DfSessionService as SimpleQueryHandler>::do_query(&self.inner, client, query).await
    }
}

#[async_trait]
impl ExtendedQueryHandler for Session {
    type Statement = <DfSessionService as ExtendedQueryHandler>::Statement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.inner.query_parser()
    }

    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.shared.begin();
        let started = Instant::now();
        let result = self._on_execute(client, message).await;
        self.finish(started, result.is_ok());
        result
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        <DfSessionService as ExtendedQueryHandler>::do_query(&self.inner, client, portal, max_rows)
            .await
    }
}
