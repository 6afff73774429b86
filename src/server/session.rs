//! Gateway, one connection: its own DataFusion session (so `SET` stays private to it), the
//! statement path (parse once, classify, plan from the parsed statement with DDL, DML and
//! engine statements disabled, execute under the statement's limits), and the statement
//! accounting that metrics and a graceful stop rely on.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters;
use datafusion_postgres::arrow_pg::datatypes::into_pg_type;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::QueryHook;
use futures::Sink;
use pgwire::api::auth::StartupHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, Response};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ErrorHandler, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::simplequery::Query;
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;

use super::activity::{portal_text, Backend};
use super::catalogs::session_state;
use super::copy;
use super::errors::{api_error, SqlStateErrors};
use super::limits::{Canceller, Interrupts};
use super::lookup::Lookup;
use super::models::txn::TransactionHook;
use super::models::SessionModels;
use super::pg::fence;
use super::pg::regclass::Relations;
use super::pg::stat_activity;
use super::planning::{plan_statement, verify_read_only, Stmt};
use super::prepared::{self, Prepared};
use super::readonly::{classify, Allowed};
use super::settings::{current_setting, set_config, Mirror, SettingsHook};
use super::sql::{apply_search_path, classified, default_schema, policy, prepare_sql};
use super::startup::Startup;
use super::statements::{placeholder_plan, Hook, SessionStatementsHook};
use super::wire::{self, Exec};
use super::Shared;
use crate::error::sqlstate;
use crate::query::view::ViewHandle;
use crate::telemetry::metrics;

/// The handlers of one client connection.
pub struct ConnHandlers {
    pub(super) service: Arc<Session>,
    pub(super) startup: Arc<Startup>,
    shared: Arc<Shared>,
}

impl ConnHandlers {
    /// `admitted`: whether the connection got a slot (else start-up refuses it).
    pub(super) fn new(shared: Arc<Shared>, admitted: bool) -> crate::error::Result<Self> {
        let models = Arc::new(SessionModels::new(
            shared.ws.models.clone(),
            vec![
                shared.workspace.clone(),
                crate::query::SYSTEM_SCHEMA.to_string(),
                "pg_catalog".to_string(),
                "information_schema".to_string(),
            ],
            shared.max_query_memory,
        ));
        let views = Arc::new(ViewHandle::default());
        let interrupts = Arc::new(Interrupts::default());
        let activity = Backend::new(shared.backends.clone(), interrupts.clone());
        let state = session_state(&shared, &models, &views, &activity)?;
        let ctx = SessionContext::new_with_state(state);
        models.bind(&ctx);
        for udf in fence::udfs(views.clone()) {
            ctx.register_udf(udf);
        }
        let mirror = Mirror::default();
        ctx.register_udf(current_setting(mirror.clone(), &shared.workspace));
        ctx.register_udf(set_config(mirror.clone()));
        let relations = Relations::default();
        for udf in relations
            .udfs()
            .into_iter()
            .chain(stat_activity::udfs(activity.clone()))
        {
            ctx.register_udf(udf);
        }
        let ctx = Arc::new(ctx);
        // Every statement is classified before these run; DECLARE is planned by the
        // session itself, FETCH and CLOSE read the cursor's rows here.
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(Hook(SessionStatementsHook)),
            Arc::new(Hook(SettingsHook {
                workspace: shared.workspace.clone(),
                default_timeout_ms: shared.default_timeout_ms,
                views: views.clone(),
            })),
            Arc::new(CursorStatementHook),
            Arc::new(SetShowHook),
            Arc::new(Hook(TransactionHook {
                models: models.clone(),
            })),
        ];
        let service = Arc::new(Session {
            ctx: ctx.clone(),
            parser: Arc::new(WireParser {
                ctx: ctx.clone(),
                hooks: hooks.clone(),
                workspace: shared.workspace.clone(),
                shared: shared.clone(),
                relations: relations.clone(),
                models: models.clone(),
                declared: Default::default(),
            }),
            relations,
            hooks,
            mirror,
            prepared: Prepared::default(),
            exec: Exec {
                interrupts: interrupts.clone(),
                memory: shared.max_query_memory,
                admission: shared.admission.clone(),
                activity: activity.clone(),
            },
            models,
            views,
            shared: shared.clone(),
        });
        let startup = Arc::new(Startup::new(shared.clone(), interrupts, activity, admitted));
        Ok(Self {
            service,
            startup,
            shared,
        })
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
        self.startup.clone()
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(SqlStateErrors)
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(Canceller(self.shared.cancel_keys.clone()))
    }
}

impl ConnHandlers {
    /// Turns true when the session is terminated (`pg_terminate_backend`).
    pub(super) fn terminated(&self) -> tokio::sync::watch::Receiver<bool> {
        self.service.exec.activity.terminated()
    }
}

/// One connection's query service: its own DataFusion session, the statement hooks
/// (SET/SHOW, transactions, cursors), results encoded with Postgres types, and accounting
/// around each statement.
pub struct Session {
    ctx: Arc<SessionContext>,
    parser: Arc<WireParser>,
    hooks: Vec<Arc<dyn QueryHook>>,
    /// This connection's settings, as `current_setting()` reads them.
    mirror: Mirror,
    /// The relation names `regclass` casts look up.
    relations: Relations,
    /// SQL-level prepared statements.
    prepared: Prepared,
    /// The limits statements of this connection run under.
    pub(super) exec: Exec,
    /// The models as this session sees them, and its temporary tables.
    models: Arc<SessionModels>,
    /// The read views of the current statement (or transaction).
    views: Arc<ViewHandle>,
    shared: Arc<Shared>,
}

impl Session {
    fn finish(&self, started: Instant, ok: bool) {
        metrics::query_done(started.elapsed(), ok);
    }

    /// A statement starts: a transaction keeps its read views, anything else gets fresh
    /// ones, fenced by the session's `skippr.min_lsn` and moved back to its `skippr.as_of`.
    fn begin_view(&self, statement: &SqlStatement, meta: &HashMap<String, String>) {
        match statement {
            SqlStatement::StartTransaction { .. } => self.views.hold(),
            SqlStatement::Commit { .. } | SqlStatement::Rollback { .. } => self.views.release(),
            _ => {}
        }
        self.views
            .begin_statement(fence::fence_of(meta), crate::query::as_of::as_of_of(meta));
    }

    /// Runs a statement the classifier allowed and the hooks did not answer: a query or
    /// EXPLAIN (already planned, for the extended protocol: `plan`), COPY TO STDOUT, the
    /// SQL forms of PREPARE/EXECUTE/DEALLOCATE, DECLARE.
    async fn run_statement(
        &self,
        client: &mut dyn HookClient,
        statement: &SqlStatement,
        allowed: Allowed,
        plan: Option<LogicalPlan>,
        format: &Format,
    ) -> PgWireResult<Response> {
        let plan = match (allowed, plan) {
            (Allowed::Query | Allowed::Explain, Some(plan)) => plan,
            (Allowed::Query | Allowed::Explain, None) => {
                let planned = self.exec.interrupts.run(async {
                    let plan = plan_statement(&self.ctx, statement)
                        .await
                        .map_err(api_error)?;
                    verify_read_only(&plan).map_err(api_error)?;
                    Ok(plan)
                });
                planned.await?
            }
            (Allowed::Execute, _) => {
                let plan = self
                    .exec
                    .interrupts
                    .run(self.prepared.plan_execute(&self.ctx, statement));
                plan.await?
            }
            (Allowed::Write, _) => {
                let schema = default_schema(&self.ctx);
                let run = self
                    .models
                    .execute(client, &self.ctx, &self.exec, statement, &schema);
                return self.exec.interrupts.run(run).await;
            }
            (Allowed::Prepare, _) => return self.prepared.prepare(statement),
            (Allowed::Deallocate, _) => {
                let SqlStatement::Deallocate { name, .. } = statement else {
                    return Err(unsupported(statement));
                };
                return self.prepared.deallocate(&name.value);
            }
            (Allowed::Declare, _) => {
                let SqlStatement::Declare { stmts } = statement else {
                    return Err(unsupported(statement));
                };
                return prepared::declare(&self.ctx, stmts, client, &self.exec).await;
            }
            (Allowed::CopyOut, _) => {
                let SqlStatement::Copy {
                    source,
                    options,
                    legacy_options,
                    ..
                } = statement
                else {
                    return Err(unsupported(statement));
                };
                let format = copy::copy_format(options, legacy_options)?;
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                let zone = client.metadata().get("timezone").cloned();
                return copy::copy_out(
                    &self.ctx,
                    source,
                    format,
                    options,
                    zone.as_deref(),
                    &self.exec,
                )
                .await;
            }
            _ => return Err(unsupported(statement)),
        };
        if let Some(call) = fence::wait_call(&plan) {
            let wait = fence::wait(&self.shared.ws, call?);
            return self.exec.interrupts.run(wait).await;
        }
        let bare = wire::bare_columns(&plan);
        let optimised = self.ctx.state().optimize(&plan).map_err(api_error)?;
        let df = self
            .ctx
            .execute_logical_plan(optimised)
            .await
            .map_err(api_error)?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let zone = client.metadata().get("timezone").cloned();
        let response = wire::encode_dataframe(
            df,
            &bare,
            format,
            Some(options),
            zone.as_deref(),
            &self.exec,
        )
        .await?;
        Ok(Response::Query(response))
    }

    /// The statement's limits start: its timeout is the session's `statement_timeout`.
    pub(super) fn begin<'a, C: ClientInfo + ?Sized>(
        &'a self,
        client: &C,
    ) -> super::limits::Running<'a> {
        self.exec.interrupts.begin(statement_timeout(client))
    }
}

/// An allowed statement no handler answered (a gap between the classifier and the
/// handlers): refused, never passed to the engine.
fn unsupported(statement: &SqlStatement) -> PgWireError {
    tracing::warn!(statement = %statement.to_string().split_whitespace().next().unwrap_or(""), "an allowed statement had no handler");
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        sqlstate::FEATURE_NOT_SUPPORTED.to_string(),
        "this statement is not supported by the gateway".to_string(),
    )))
}

/// The session's `statement_timeout` (set at start-up from skippr.yml, changed by SET).
pub(super) fn statement_timeout<C: ClientInfo + ?Sized>(client: &C) -> Option<Duration> {
    client
        .metadata()
        .get(super::settings::STATEMENT_TIMEOUT_KEY)
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
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

/// Statements whose parameters were cast to a Postgres type kept for describing them, at
/// most this many (then all are forgotten, and described by their planned types).
const DECLARED_LIMIT: usize = 256;

/// Parses, classifies and plans prepared statements, and describes their results with the
/// types the rows will carry.
pub struct WireParser {
    ctx: Arc<SessionContext>,
    hooks: Vec<Arc<dyn QueryHook>>,
    workspace: String,
    shared: Arc<Shared>,
    relations: Relations,
    models: Arc<SessionModels>,
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
        let _ = types;
        apply_search_path(&self.ctx, client.metadata(), &self.workspace);
        // The models as they are now, before anything (a `regclass` lookup) reads the catalog.
        self.models.refresh().await?;
        let parsed = prepare_sql(sql, &self.ctx, &self.shared, &self.relations).await?;
        let (mut statements, rewritten) = (parsed.statements, parsed.rewritten);
        if statements.len() > 1 {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".to_string(),
                sqlstate::SYNTAX_ERROR.to_string(),
                "cannot insert multiple commands into a prepared statement".to_string(),
            ))));
        }
        let Some(statement) = statements.pop() else {
            return Ok((sql.to_string(), None));
        };
        let (statement, allowed) = classified(statement, &self.ctx, &self.models)?;
        let text = statement.to_string();
        let plan = match allowed {
            Allowed::Query | Allowed::Explain => {
                let plan = plan_statement(&self.ctx, &statement)
                    .await
                    .map_err(api_error)?;
                verify_read_only(&plan).map_err(api_error)?;
                plan
            }
            _ => {
                let mut answered = None;
                for hook in &self.hooks {
                    if let Some(plan) = hook
                        .handle_extended_parse_query(&statement, &self.ctx, client)
                        .await
                    {
                        answered = Some(plan?);
                        break;
                    }
                }
                match answered {
                    Some(plan) => plan,
                    None => placeholder_plan(datafusion::arrow::datatypes::Schema::empty(), false)?,
                }
            }
        };
        let stmt = (text, Some((statement, plan)));
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
        let statement = self.exec.activity.begin(&query.query, client.metadata());
        // Each statement runs and sends its rows under its own limits (see simple.rs).
        let result = self.query_message(client, query).await;
        statement.end(
            client.transaction_status(),
            client.metadata(),
            result.is_ok(),
        );
        self.finish(started, result.is_ok());
        result
    }

    /// Not called by `on_query` (which runs statement by statement); answers the whole
    /// message at once for any other caller, under one set of limits.
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let _limits = self.begin(&*client);
        let statements = self.parse_message(client, query).await?;
        if statements.is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        let mut results = Vec::with_capacity(statements.len());
        for (statement, allowed) in &statements {
            results.push(self.statement_response(client, statement, *allowed).await?);
        }
        Ok(results)
    }
}

impl Session {
    /// Parses a simple-query message into its statements, each classified: a refused one
    /// fails the whole message before any runs, as a syntax error would.
    pub(super) async fn parse_message<C>(
        &self,
        client: &mut C,
        query: &str,
    ) -> PgWireResult<Vec<(SqlStatement, Allowed)>>
    where
        C: ClientInfo + Send + Sync,
    {
        apply_search_path(&self.ctx, client.metadata(), &self.shared.workspace);
        self.models.refresh().await?;
        let parsed = self
            .exec
            .interrupts
            .run(prepare_sql(query, &self.ctx, &self.shared, &self.relations))
            .await?;
        parsed
            .statements
            .into_iter()
            .map(|s| {
                let (s, allowed) = classified(s, &self.ctx, &self.models)?;
                Ok((s, allowed))
            })
            .collect()
    }

    /// Runs one statement of a simple-query message: a hook answers it (SET, SHOW,
    /// transactions, cursors) or [`Session::run_statement`] does.
    pub(super) async fn statement_response<C>(
        &self,
        client: &mut C,
        statement: &SqlStatement,
        allowed: Allowed,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if allowed == Allowed::Discard {
            self.prepared.clear();
        }
        self.begin_view(statement, client.metadata());
        if allowed != Allowed::Declare {
            for hook in &self.hooks {
                if let Some(result) = hook.handle_simple_query(statement, &self.ctx, client).await {
                    return result;
                }
            }
        }
        self.mirror.update(client.metadata());
        apply_search_path(&self.ctx, client.metadata(), &self.shared.workspace);
        self.run_statement(client, statement, allowed, None, &Format::UnifiedText)
            .await
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
        let _limits = self.begin(&*client);
        let started = Instant::now();
        let text = portal_text(client, message.name.as_deref());
        let statement = self.exec.activity.begin(&text, client.metadata());
        let result = self._on_execute(client, message).await;
        statement.end(
            client.transaction_status(),
            client.metadata(),
            result.is_ok(),
        );
        self.exec.activity.send_notices(client).await?;
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
        // Classified again: a portal holds only what Parse accepted, and this is cheap.
        self.models.refresh().await?;
        let allowed =
            classify(statement, &policy(&self.ctx, &self.models)).map_err(|r| r.into_error())?;
        let types = parameter_types(plan)?;
        let refs: Vec<Option<&DataType>> = types.iter().map(|t| t.as_ref()).collect();
        let params = deserialize_parameters(portal, &refs)?;
        if allowed == Allowed::Discard {
            self.prepared.clear();
        }
        self.begin_view(statement, client.metadata());
        if allowed != Allowed::Declare {
            for hook in &self.hooks {
                if let Some(result) = hook
                    .handle_extended_query(statement, plan, &params, &self.ctx, client)
                    .await
                {
                    return result;
                }
            }
        }
        self.mirror.update(client.metadata());
        apply_search_path(&self.ctx, client.metadata(), &self.shared.workspace);
        // A lookup by primary key skips the planner (see lookup.rs).
        if allowed == Allowed::Query {
            if let Some(lookup) = Lookup::of(plan) {
                let found = self
                    .exec
                    .interrupts
                    .run(async {
                        lookup
                            .run(&self.ctx, &params, self.exec.memory)
                            .await
                            .map_err(api_error)
                    })
                    .await?;
                if let Some((schema, batches)) = found {
                    metrics::key_lookup();
                    self.exec
                        .activity
                        .count_rows(batches.iter().map(|b| b.num_rows()).sum());
                    let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                    let zone = client.metadata().get("timezone").cloned();
                    let response = wire::encode_batches(
                        &schema,
                        batches,
                        &wire::bare_columns(plan),
                        &portal.result_column_format,
                        Some(options),
                        zone.as_deref(),
                    )?;
                    return Ok(Response::Query(response));
                }
            }
        }
        let plan = match allowed {
            // Plan again at every execution: the plan made at Parse time holds the tables
            // as they were then, and a prepared statement must see the live state of each
            // run.
            Allowed::Query | Allowed::Explain => {
                let fresh = self.exec.interrupts.run(async {
                    let plan = plan_statement(&self.ctx, statement)
                        .await
                        .map_err(api_error)?;
                    verify_read_only(&plan).map_err(api_error)?;
                    Ok(plan)
                });
                Some(
                    fresh
                        .await?
                        .replace_params_with_values(&params)
                        .map_err(api_error)?,
                )
            }
            _ => None,
        };
        self.run_statement(
            client,
            statement,
            allowed,
            plan,
            &portal.result_column_format,
        )
        .await
    }
}
