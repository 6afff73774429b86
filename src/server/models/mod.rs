//! Gateway, models: one session's view of the models schemas and what it changes in them.
//! Statements the classifier allowed as model writes run here ([`ddl`], [`dml`]); each
//! one's changes are catalog ops. Outside a transaction they commit at once; inside one they
//! wait, visible to this session only, and commit together at COMMIT ([`txn`]), so other
//! sessions see a model's whole create / rename / drop sequence or none of it. Temporary
//! tables live in the session's memory, in its own `pg_temp_<n>` schema.

mod ddl;
mod dml;
mod rows;
pub mod txn;
mod viewdef;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, AssignmentTarget, FromTable, RenameTableNameKind, SchemaName, Statement,
    TableObject, UpdateTableFromKind,
};
use datafusion_postgres::hooks::HookClient;
use pgwire::api::results::{Response, Tag};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::response::TransactionStatus;

use super::names::{fold, parts};
use super::readonly::Writable;
use super::wire::Exec;
use crate::catalog::models::{Conflict, ModelsState, Op, Refused, RelName};
use crate::error::sqlstate;
use crate::query::models::{Models, ModelsView, SessionSource};

/// Numbers the sessions' temporary schemas (`pg_temp_<n>`).
static SESSIONS: AtomicU64 = AtomicU64::new(1);

/// How long the files of a dropped table stay, so that statements still reading it finish
/// (longer than any statement may run is not needed: `statement_timeout` ends them).
const DROP_GRACE: Duration = Duration::from_secs(600);

/// Files a statement leaves to its commit.
#[derive(Default)]
pub(crate) struct Leftovers {
    /// Folders of tables it created, and files it added to existing tables: removed if its
    /// transaction rolls back (or its commit fails).
    pub created: Vec<String>,
    /// Files only the table versions it replaced read: removed a while after it commits.
    pub garbage: Vec<String>,
}

/// The open transaction's changes, not yet committed.
#[derive(Default)]
struct Pending {
    ops: Vec<Op>,
    files: Leftovers,
}

/// One session's models: the committed ones, its own uncommitted changes, its temporary
/// tables.
pub struct SessionModels {
    models: Option<Arc<Models>>,
    /// The schema of replicated tables (and the others no statement may change).
    read_only: Vec<String>,
    temp_schema: String,
    temp: Arc<MemorySchemaProvider>,
    pending: Mutex<Pending>,
    /// The models as the current statement sees them.
    current: RwLock<Arc<ModelsState>>,
    /// A table read instead of a relation while one statement runs (UPDATE and DELETE
    /// read their target with row numbers).
    substitute: Mutex<Option<(RelName, Arc<dyn TableProvider>)>>,
    /// The session's engine, to plan views with.
    session: OnceLock<SessionSource>,
    /// Bytes temporary tables may hold in all.
    temp_budget: usize,
}

impl std::fmt::Debug for SessionModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionModels({})", self.temp_schema)
    }
}

/// A client error with a SQLSTATE.
pub(crate) fn user_error(code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        code.to_string(),
        message.into(),
    )))
}

/// A catalog refusal as the client sees it.
pub(crate) fn refusal(r: Refused) -> PgWireError {
    let schema = r.message.starts_with("schema");
    let code = match (r.conflict, schema) {
        (Conflict::Exists, true) => sqlstate::DUPLICATE_SCHEMA,
        (Conflict::Exists, false) => sqlstate::DUPLICATE_TABLE,
        (Conflict::Missing, true) => sqlstate::INVALID_SCHEMA_NAME,
        (Conflict::Missing, false) => sqlstate::UNDEFINED_TABLE,
        (Conflict::Changed, _) => sqlstate::SERIALIZATION_FAILURE,
        (Conflict::NotEmpty, _) => sqlstate::DEPENDENT_OBJECTS_STILL_EXIST,
        (Conflict::WrongKind, _) => sqlstate::WRONG_OBJECT_TYPE,
    };
    user_error(code, r.message)
}

/// Where a table's metadata is, which every table written here has.
pub(crate) fn location_of(table: &iceberg::table::Table) -> PgWireResult<String> {
    table
        .metadata_location()
        .map(str::to_string)
        .ok_or_else(|| {
            user_error(
                sqlstate::INTERNAL_ERROR,
                format!("table {} has no metadata location", table.identifier()),
            )
        })
}

/// An internal failure (I/O, catalog) while running a model statement.
pub(crate) fn internal(e: crate::error::Error) -> PgWireError {
    let code = match e.kind() {
        crate::error::ErrorKind::Retryable => sqlstate::SERIALIZATION_FAILURE,
        crate::error::ErrorKind::Fatal | crate::error::ErrorKind::Query => sqlstate::INTERNAL_ERROR,
        _ => sqlstate::INTERNAL_ERROR,
    };
    user_error(code, e.to_string())
}

impl SessionModels {
    /// `read_only`: schemas of replicated and system tables; `temp_budget`: bytes the
    /// session's temporary tables may hold.
    pub fn new(models: Option<Arc<Models>>, read_only: Vec<String>, temp_budget: usize) -> Self {
        let n = SESSIONS.fetch_add(1, Ordering::Relaxed);
        Self {
            models,
            read_only,
            temp_schema: format!("pg_temp_{n}"),
            temp: Arc::new(MemorySchemaProvider::new()),
            pending: Mutex::default(),
            current: RwLock::default(),
            substitute: Mutex::default(),
            session: OnceLock::new(),
            temp_budget,
        }
    }

    /// Binds the session whose engine plans views (once, after the session exists).
    pub fn bind(&self, ctx: &SessionContext) {
        let _ = self.session.set(crate::query::models::session_of(ctx));
    }

    pub fn temp_schema(&self) -> &str {
        &self.temp_schema
    }

    /// The session's temporary tables as a schema.
    pub fn temp_provider(&self) -> Arc<dyn SchemaProvider> {
        self.temp.clone()
    }

    /// The names of the session's temporary tables.
    pub fn temp_names(&self) -> HashSet<String> {
        self.temp.table_names().into_iter().collect()
    }

    /// Where this session may write, for the classifier.
    pub fn writable(&self, default_schema: &str) -> Writable {
        Writable {
            read_only: self.read_only.clone(),
            default_schema: default_schema.to_string(),
            temp_schema: self.temp_schema.clone(),
        }
    }

    /// The workspace's models, when it has a warehouse for them.
    pub fn models_handle(&self) -> Option<Arc<Models>> {
        self.models.clone()
    }

    fn models(&self) -> PgWireResult<&Arc<Models>> {
        self.models.as_ref().ok_or_else(|| {
            user_error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "models need a LocalIceberg warehouse to live in, and no pipeline of skippr.yml writes to one: add a LocalIceberg data sink",
            )
        })
    }

    /// Reads the committed models again, with this session's pending changes on top: the
    /// state the next statement sees.
    pub async fn refresh(&self) -> PgWireResult<()> {
        let Some(models) = &self.models else {
            return Ok(());
        };
        let committed = models.state().await.map_err(internal)?;
        let ops = self.pending_ops();
        let state = if ops.is_empty() {
            committed
        } else {
            Arc::new(committed.after(&ops).map_err(refusal)?)
        };
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = state;
        Ok(())
    }

    fn pending_ops(&self) -> Vec<Op> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ops
            .clone()
    }

    /// Records a statement's changes: committed at once outside a transaction, kept for
    /// COMMIT inside one (and visible to this session from now on).
    pub(crate) async fn record(
        &self,
        client: &dyn HookClient,
        ops: Vec<Op>,
        files: Leftovers,
    ) -> PgWireResult<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let current = self.state();
        let next = current.after(&ops).map_err(refusal)?;
        if client.transaction_status() == TransactionStatus::Transaction {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.ops.extend(ops);
            pending.files.created.extend(files.created);
            pending.files.garbage.extend(files.garbage);
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
            return Ok(());
        }
        self.commit_ops(&ops, files).await
    }

    /// Commits `ops` to the catalog in one transaction; then the files it left behind go
    /// (at once those of a failed commit, after a grace the ones it made garbage).
    async fn commit_ops(&self, ops: &[Op], files: Leftovers) -> PgWireResult<()> {
        let models = self.models()?;
        let committed = match models.catalog().commit(ops).await {
            Ok(Ok(c)) => c,
            Ok(Err(refused)) => {
                remove_later(models, files.created, Duration::ZERO);
                return Err(refusal(refused));
            }
            Err(e) => {
                remove_later(models, files.created, Duration::ZERO);
                return Err(internal(e));
            }
        };
        tracing::debug!(
            changes = ops.len(),
            dropped_tables = committed.dropped.len(),
            "models committed"
        );
        remove_later(models, committed.dropped, DROP_GRACE);
        remove_later(models, files.garbage, DROP_GRACE);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = committed.state;
        Ok(())
    }

    /// COMMIT: the transaction's changes become visible to every session at once.
    pub async fn commit(&self) -> PgWireResult<()> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.ops.is_empty() {
            return Ok(());
        }
        let done = self.commit_ops(&pending.ops, pending.files).await;
        if done.is_err() {
            let _ = self.refresh().await;
        }
        done
    }

    /// ROLLBACK: the transaction's changes are forgotten.
    pub async fn rollback(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(models) = &self.models {
            remove_later(models, pending.files.created, Duration::ZERO);
        }
        let _ = self.refresh().await;
    }

    /// Runs a statement the classifier allowed as a model write.
    pub async fn execute(
        &self,
        client: &mut dyn HookClient,
        ctx: &SessionContext,
        exec: &Exec,
        statement: &Statement,
        default_schema: &str,
    ) -> PgWireResult<Response> {
        let run = Run {
            models: self,
            ctx,
            exec,
            default_schema,
        };
        dispatch(&run, client, statement).await
    }

    /// Reads `rel` as `table` until the guard drops.
    fn substitute_while(&self, rel: RelName, table: Arc<dyn TableProvider>) -> SubstituteGuard<'_> {
        *self.substitute.lock().unwrap_or_else(|e| e.into_inner()) = Some((rel, table));
        SubstituteGuard(self)
    }
}

/// Runs one model statement: the one place that tells them apart.
async fn dispatch(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    statement: &Statement,
) -> PgWireResult<Response> {
    match statement {
        Statement::Insert(i) => {
            let TableObject::TableName(name) = &i.table else {
                return Err(user_error(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    "INSERT names its table",
                ));
            };
            let source = i.source.as_ref().ok_or_else(|| {
                user_error(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    "INSERT needs VALUES or a query",
                )
            })?;
            let columns: Vec<String> = i.columns.iter().map(fold).collect();
            dml::insert(run, client, name, &columns, source).await
        }
        Statement::Delete(d) => {
            let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
            let target = from
                .first()
                .ok_or_else(|| user_error(sqlstate::SYNTAX_ERROR, "DELETE needs a table"))?;
            let others = d.using.clone().unwrap_or_default();
            dml::rewrite(run, client, target, &others, d.selection.as_ref(), &[]).await
        }
        Statement::Update(u) => {
            let others = match &u.from {
                Some(UpdateTableFromKind::AfterSet(t) | UpdateTableFromKind::BeforeSet(t)) => {
                    t.clone()
                }
                None => Vec::new(),
            };
            let mut sets = Vec::with_capacity(u.assignments.len());
            for a in &u.assignments {
                let AssignmentTarget::ColumnName(name) = &a.target else {
                    return Err(user_error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "UPDATE ... SET (a, b) = ... is not supported: set each column",
                    ));
                };
                let column = parts(name).pop().unwrap_or_default();
                sets.push((column, a.value.to_string()));
            }
            dml::rewrite(run, client, &u.table, &others, u.selection.as_ref(), &sets).await
        }
        Statement::Truncate(t) => {
            for target in &t.table_names {
                dml::truncate(run, client, &target.name).await?;
            }
            Ok(Response::Execution(Tag::new("TRUNCATE TABLE")))
        }
        Statement::CreateSchema {
            schema_name: SchemaName::Simple(name),
            if_not_exists,
            ..
        } => ddl::create_schema(run, client, name, *if_not_exists).await,
        Statement::CreateView(v) => ddl::create_view(run, client, v).await,
        Statement::CreateTable(c) => ddl::create_table(run, client, c).await,
        Statement::AlterTable(a) => match a.operations.as_slice() {
            [AlterTableOperation::RenameTable {
                table_name: RenameTableNameKind::To(to) | RenameTableNameKind::As(to),
            }] => ddl::rename(run, client, &a.name, to, a.if_exists).await,
            _ => Err(ddl::unsupported("this ALTER TABLE")),
        },
        Statement::Drop {
            object_type,
            if_exists,
            names,
            cascade,
            ..
        } => ddl::drop(run, client, *object_type, names, *if_exists, *cascade).await,
        Statement::Comment {
            object_type,
            object_name,
            comment,
            ..
        } => ddl::comment_on(run, client, *object_type, object_name, comment.clone()).await,
        Statement::Grant(_) => ddl::done("GRANT"),
        _ => Err(ddl::unsupported("this statement")),
    }
}

/// Ends a substitution when dropped.
struct SubstituteGuard<'a>(&'a SessionModels);

impl Drop for SubstituteGuard<'_> {
    fn drop(&mut self) {
        *self.0.substitute.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One model statement being run.
pub(crate) struct Run<'a> {
    pub models: &'a SessionModels,
    pub ctx: &'a SessionContext,
    pub exec: &'a Exec,
    /// The schema unqualified names mean.
    pub default_schema: &'a str,
}

/// Removes files and table folders (of dropped tables, of tables a failed transaction
/// created, files no table version reads any more) after `grace`, in the background. Only
/// what lies in a table folder the models catalog created is touched.
fn remove_later(models: &Arc<Models>, paths: Vec<String>, grace: Duration) {
    let catalog = models.catalog();
    let paths: Vec<String> = paths
        .into_iter()
        .filter(|p| catalog.owns_folder(p) || catalog.owns_file(p))
        .collect();
    if paths.is_empty() {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        for path in paths {
            let Some(local) = path.strip_prefix("file://") else {
                continue;
            };
            let removed = match tokio::fs::metadata(local).await {
                Ok(m) if m.is_dir() => tokio::fs::remove_dir_all(local).await,
                Ok(_) => tokio::fs::remove_file(local).await,
                Err(e) => Err(e),
            };
            match removed {
                Ok(()) => tracing::debug!(path = %path, "removed a model file no table reads"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path, error = %e, "could not remove a model file no table reads; remove it by hand")
                }
            }
        }
    });
}

#[async_trait]
impl ModelsView for SessionModels {
    fn state(&self) -> Arc<ModelsState> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn plan(&self, sql: &str) -> DfResult<LogicalPlan> {
        let state = self.session.get().and_then(|s| s()).ok_or_else(|| {
            DataFusionError::Plan("the session that reads the view has ended".into())
        })?;
        crate::query::models::plan_sql(&state, sql).await
    }

    fn substitute(&self, rel: &RelName) -> Option<Arc<dyn TableProvider>> {
        self.substitute
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(r, _)| r == rel)
            .map(|(_, t)| t.clone())
    }
}
