//! Gateway, one connection: its own DataFusion session (so `SET` stays private to it), its
//! start-up handler, and the statement accounting that metrics and a graceful stop rely on.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan, ScalarUDF};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::arrow_pg::datatypes::into_pg_type;
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::{DfSessionService, Parser, QueryHook};
use futures::Sink;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{DefaultServerParameterProvider, StartupHandler};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, Response};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionManager, ErrorHandler, PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::simplequery::Query;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::types::format::FormatOptions;

use super::errors::SqlStateErrors;
use super::functions::Relations;
use super::known;
use super::readonly::ReadOnlyHook;
use super::rewrite::{self, Rewritten};
use super::settings::{setting, CurrentSetting, Mirror, SetConfig, SettingsHook};
use super::statements::SessionStatementsHook;
use super::wire;
use super::Shared;
use crate::telemetry::metrics;

/// The handlers of one client connection.
pub struct ConnHandlers {
    pub(super) shared: Arc<Shared>,
    service: Arc<Session>,
}

impl ConnHandlers {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        let ctx = SessionContext::new_with_state(shared.base.clone());
        let mirror = Mirror::default();
        ctx.register_udf(ScalarUDF::from(CurrentSetting::new(
            mirror.clone(),
            &shared.workspace,
        )));
        ctx.register_udf(ScalarUDF::from(SetConfig::new(mirror.clone())));
        let relations = Relations::default();
        for udf in relations.udfs() {
            ctx.register_udf(udf);
        }
        let ctx = Arc::new(ctx);
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(ReadOnlyHook),
            Arc::new(SessionStatementsHook),
            Arc::new(SettingsHook {
                workspace: shared.workspace.clone(),
            }),
            Arc::new(CursorStatementHook),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
        ];
        let planner = DfSessionService::new_with_hooks(ctx.clone(), hooks.clone());
        let service = Arc::new(Session {
            ctx: ctx.clone(),
            sql_parser: PostgresCompatibilityParser::new(),
            parser: Arc::new(WireParser {
                inner: planner.query_parser(),
                ctx: ctx.clone(),
                workspace: shared.workspace.clone(),
                shared: shared.clone(),
                relations: relations.clone(),
                declared: Default::default(),
            }),
            relations,
            hooks,
            mirror,
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
        Arc::new(super::startup_handler(&self.shared))
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
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
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

/// One connection's query service: its own DataFusion session, the statement hooks
/// (write guard, SET/SHOW, transactions, cursors), results encoded with Postgres types, and
/// accounting around each statement.
pub struct Session {
    ctx: Arc<SessionContext>,
    sql_parser: PostgresCompatibilityParser,
    parser: Arc<WireParser>,
    hooks: Vec<Arc<dyn QueryHook>>,
    /// This connection's settings, as `current_setting()` reads them.
    mirror: Mirror,
    /// The relation names `regclass` casts look up.
    relations: Relations,
    shared: Arc<Shared>,
}

impl Session {
    fn finish(&self, started: Instant, ok: bool) {
        metrics::query_done(started.elapsed(), ok);
    }
}

fn api_error(e: impl std::error::Error + Send + Sync + 'static) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

/// `SET statement_timeout`, as the SET hook records it for this connection.
fn statement_timeout<C: ClientInfo + ?Sized>(client: &C) -> Option<Duration> {
    client
        .metadata()
        .get("statement_timeout_ms")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

async fn with_timeout<T>(
    timeout: Option<Duration>,
    work: impl std::future::Future<Output = datafusion::error::Result<T>>,
) -> PgWireResult<T> {
    match timeout {
        Some(t) => tokio::time::timeout(t, work)
            .await
            .map_err(|_| {
                PgWireError::UserError(Box::new(ErrorInfo::new(
                    "ERROR".to_string(),
                    "57014".to_string(),
                    "canceling statement due to statement timeout".to_string(),
                )))
            })?
            .map_err(api_error),
        None => work.await.map_err(api_error),
    }
}

/// Points unqualified names at the first schema of the session's `search_path` (the
/// workspace by default), as Postgres resolves them.
fn apply_search_path(ctx: &SessionContext, meta: &HashMap<String, String>, workspace: &str) {
    let path = setting(meta, "search_path", workspace).unwrap_or_default();
    let first = path
        .split(',')
        .map(|p| p.trim().trim_matches('"').to_string())
        .find(|p| !p.is_empty() && p != "$user" && p != "public" && p != "pg_catalog")
        .unwrap_or_else(|| workspace.to_string());
    let state = ctx.state_ref();
    let mut state = state.write();
    let options = state.config_mut().options_mut();
    if options.catalog.default_schema != first {
        options.catalog.default_schema = first;
    }
}

/// Parameter types of a prepared statement, `$1` first: inferred by the planner, or taken
/// from an explicit cast (`$1::int`).
fn parameter_types(plan: &LogicalPlan) -> PgWireResult<Vec<Option<DataType>>> {
    let mut types = plan.get_parameter_types().map_err(api_error)?;
    plan.apply(|node| {
        for expr in node.expressions() {
            expr.apply(|e| {
                if let Expr::Cast(cast) = e {
                    if let Expr::Placeholder(ph) = cast.expr.as_ref() {
                        let t = types.entry(ph.id.clone()).or_insert(None);
                        if t.is_none() {
                            *t = Some(cast.data_type.clone());
                        }
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(api_error)?;
    let mut ordered: Vec<(usize, Option<DataType>)> = types
        .into_iter()
        .map(|(id, t)| (id.trim_start_matches('$').parse().unwrap_or(usize::MAX), t))
        .collect();
    ordered.sort_by_key(|(i, _)| *i);
    Ok(ordered.into_iter().map(|(_, t)| t).collect())
}

/// Rewrites a client's SQL for planning ([`rewrite`]): known client queries replaced, then
/// Postgres casts the engine lacks. Reads the catalog's relation names first when the
/// statement casts to `regclass`.
async fn prepare_sql(
    sql: &str,
    ctx: &SessionContext,
    shared: &Shared,
    relations: &Relations,
) -> PgWireResult<(String, Rewritten)> {
    let replaced = known::rewrite(sql, &shared.ws).await;
    let sql = replaced.as_deref().unwrap_or(sql);
    let mut rewritten = rewrite::rewrite(sql);
    if rewritten.uses_relations {
        let schema = ctx
            .state_ref()
            .read()
            .config()
            .options()
            .catalog
            .default_schema
            .clone();
        relations
            .refresh(ctx, vec!["pg_catalog".to_string(), schema])
            .await
            .map_err(api_error)?;
    }
    let sql = match rewritten.sql.take() {
        Some(new) => {
            tracing::debug!(
                known_query = replaced.is_some(),
                relations = rewritten.uses_relations,
                "client SQL rewritten for planning"
            );
            new
        }
        None => sql.to_string(),
    };
    Ok((sql, rewritten))
}

/// A prepared statement: its SQL as planned, and its parsed statement and plan (none for
/// an empty query). The statement hooks expect this very type in the portal store.
type Stmt = (String, Option<(SqlStatement, LogicalPlan)>);

/// Statements whose parameters were cast to a Postgres type kept for describing them, at
/// most this many (then all are forgotten, and described by their planned types).
const DECLARED_LIMIT: usize = 256;

/// Parses and plans prepared statements (DataFusion's parser), and describes their results
/// with the types the rows will carry.
pub struct WireParser {
    inner: Arc<Parser>,
    ctx: Arc<SessionContext>,
    workspace: String,
    shared: Arc<Shared>,
    relations: Relations,
    /// The parameter types declared by casts (`$1::oid[]`), by the statement's planned SQL.
    declared: std::sync::Mutex<HashMap<String, HashMap<usize, Type>>>,
}

/// The type a parameter is described with: the one the client cast it to when its values
/// read the same as the planned type's (an `oid` is an `int4` on the wire), else the
/// planned type's.
fn described_type(declared: Option<&Type>, planned: Option<&DataType>) -> PgWireResult<Type> {
    let Some(planned) = planned else {
        return Ok(Type::UNKNOWN);
    };
    let same_wire = |t: &Type| match (t, planned) {
        (t, DataType::Int32) => *t == Type::OID,
        (t, DataType::List(item)) => *t == Type::OID_ARRAY && item.data_type() == &DataType::Int32,
        _ => false,
    };
    match declared {
        Some(t) if same_wire(t) => Ok(t.clone()),
        _ => into_pg_type(planned),
    }
}

#[async_trait]
impl QueryParser for WireParser {
    type Statement = Stmt;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Stmt>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        apply_search_path(&self.ctx, client.metadata(), &self.workspace);
        let (sql, rewritten) = prepare_sql(sql, &self.ctx, &self.shared, &self.relations).await?;
        let stmt = self.inner.parse_sql(client, &sql, types).await?;
        if !rewritten.declared.is_empty() {
            let mut declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
            if declared.len() >= DECLARED_LIMIT {
                declared.clear();
            }
            declared.insert(stmt.0.clone(), rewritten.declared);
        }
        Ok(stmt)
    }

    fn get_parameter_types(&self, stmt: &Stmt) -> PgWireResult<Vec<Type>> {
        let (sql, Some((_, plan))) = stmt else {
            return Ok(vec![]);
        };
        let declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        let declared = declared.get(sql);
        parameter_types(plan)?
            .iter()
            .enumerate()
            .map(|(i, t)| described_type(declared.and_then(|d| d.get(&i)), t.as_ref()))
            .collect()
    }

    fn get_result_schema(
        &self,
        stmt: &Stmt,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        match stmt {
            (_, Some((_, plan))) if !matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Dml(_)) => {
                let plan = wire::plan(
                    plan.schema().as_arrow(),
                    &wire::bare_columns(plan),
                    column_format.unwrap_or(&Format::UnifiedText),
                    None,
                    None,
                )?;
                Ok(plan.fields.as_ref().clone())
            }
            _ => Ok(vec![]),
        }
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
        let _running = self.shared.begin();
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
        apply_search_path(&self.ctx, client.metadata(), &self.shared.workspace);
        let (query, _) = prepare_sql(query, &self.ctx, &self.shared, &self.relations).await?;
        let statements = self.sql_parser.parse(&query).map_err(api_error)?;
        if statements.is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        let mut results = Vec::with_capacity(statements.len());
        'statements: for statement in statements {
            for hook in &self.hooks {
                if let Some(result) = hook
                    .handle_simple_query(&statement, &self.ctx, client)
                    .await
                {
                    results.push(result?);
                    continue 'statements;
                }
            }
            self.mirror.update(client.metadata());
            apply_search_path(&self.ctx, client.metadata(), &self.shared.workspace);
            let sql = statement.to_string();
            let df = with_timeout(statement_timeout(client), self.ctx.sql(&sql)).await?;
            let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
            let zone = client.metadata().get("timezone").cloned();
            let bare = wire::bare_columns(df.logical_plan());
            let response = wire::encode_dataframe(
                df,
                &bare,
                &Format::UnifiedText,
                Some(options),
                zone.as_deref(),
            )
            .await?;
            results.push(Response::Query(response));
        }
        Ok(results)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Session {
    type Statement = Stmt;
    type QueryParser = WireParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let _running = self.shared.begin();
        let started = Instant::now();
        let result = self._on_execute(client, message).await;
        self.finish(started, result.is_ok());
        result
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (_, Some((statement, plan))) = &portal.statement.statement else {
            return Ok(Response::EmptyQuery);
        };
        let types = parameter_types(plan)?;
        let refs: Vec<Option<&DataType>> = types.iter().map(|t| t.as_ref()).collect();
        let params = deserialize_parameters(portal, &refs)?;
        for hook in &self.hooks {
            if let Some(result) = hook
                .handle_extended_query(statement, plan, &params, &self.ctx, client)
                .await
            {
                return result;
            }
        }
        self.mirror.update(client.metadata());
        // Plan again at every execution: the plan made at Parse time holds the tables as
        // they were then, and a prepared statement must see the live state of each run.
        apply_search_path(&self.ctx, client.metadata(), &self.shared.workspace);
        let fresh = self
            .ctx
            .state()
            .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
                statement.clone(),
            )))
            .await
            .map_err(api_error)?;
        let plan = fresh
            .replace_params_with_values(&params)
            .map_err(api_error)?;
        let bare = wire::bare_columns(&plan);
        let optimised = self.ctx.state().optimize(&plan).map_err(api_error)?;
        let df = with_timeout(
            statement_timeout(client),
            self.ctx.execute_logical_plan(optimised),
        )
        .await?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let zone = client.metadata().get("timezone").cloned();
        let response = wire::encode_dataframe(
            df,
            &bare,
            &portal.result_column_format,
            Some(options),
            zone.as_deref(),
        )
        .await?;
        Ok(Response::Query(response))
    }
}
