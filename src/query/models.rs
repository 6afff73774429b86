//! Queries, models: the schemas, tables and views built through the gateway, as the query
//! engine reads them. A reader sees the models through a [`ModelsView`] (the committed
//! ones, plus its own changes not yet committed); a model table is read like a replicated
//! one without a tail, and a view is planned from its stored query when a statement names
//! it, so it always reads the live tables.

use std::any::Any;
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use arrow::datatypes::DataType;
use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::{TableProvider, TableType, ViewTable};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{cast, Expr, LogicalPlan, LogicalPlanBuilder};
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use super::committed::ScanCaches;
use super::live::LiveTable;
use crate::catalog::models::{ModelsCatalog, ModelsState, RelKind, RelName, ViewDef};
use crate::error::{Context, Error, Result};

/// Model tables kept loaded (by metadata location); past it the cache starts over.
const LOADED_LIMIT: usize = 512;

/// The models of a workspace: its warehouse's models catalog and the tables loaded from it.
pub struct Models {
    catalog: ModelsCatalog,
    loaded: Mutex<HashMap<String, Table>>,
    caches: Arc<ScanCaches>,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Models({:?})", self.catalog)
    }
}

impl Models {
    pub fn new(catalog: ModelsCatalog, caches: Arc<ScanCaches>) -> Self {
        Self {
            catalog,
            loaded: Mutex::default(),
            caches,
        }
    }

    pub fn catalog(&self) -> &ModelsCatalog {
        &self.catalog
    }

    /// The committed models.
    pub async fn state(&self) -> Result<Arc<ModelsState>> {
        self.catalog.state().await
    }

    /// The table `rel` whose metadata is at `location` (committed, or staged by a session).
    pub async fn table(&self, rel: &RelName, location: &str) -> Result<Table> {
        if let Some(t) = self
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(location)
        {
            return Ok(t.clone());
        }
        let file_io = self.catalog.file_io().clone();
        let metadata = TableMetadata::read_from(&file_io, location)
            .await
            .with_context(|| format!("reading the metadata of table {}.{}", rel.0, rel.1))?;
        let table = Table::builder()
            .runtime(iceberg::Runtime::try_current().context("finding the async runtime")?)
            .file_io(file_io)
            .metadata_location(location.to_string())
            .metadata(metadata)
            .identifier(TableIdent::new(
                NamespaceIdent::new(rel.0.clone()),
                rel.1.clone(),
            ))
            .build()
            .with_context(|| format!("loading table {}.{}", rel.0, rel.1))?;
        self.remember(&table);
        Ok(table)
    }

    /// Keeps a table just written (or loaded) for readers of its metadata location.
    pub fn remember(&self, table: &Table) {
        let Some(location) = table.metadata_location() else {
            return;
        };
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.len() >= LOADED_LIMIT {
            loaded.clear();
        }
        loaded.insert(location.to_string(), table.clone());
    }

    /// A model table as the query engine reads it.
    pub async fn provider(&self, table: &Table) -> Result<Arc<dyn TableProvider>> {
        Ok(Arc::new(
            LiveTable::committed(table, self.caches.clone()).await?,
        ))
    }
}

/// The models as one reader sees them.
#[async_trait]
pub trait ModelsView: Send + Sync {
    /// The models as of the reader's current statement.
    fn state(&self) -> Arc<ModelsState>;

    /// Plans a view's query for this reader.
    async fn plan(&self, sql: &str) -> DfResult<LogicalPlan>;

    /// A table the reader reads instead of `rel` during its current statement.
    fn substitute(&self, _rel: &RelName) -> Option<Arc<dyn TableProvider>> {
        None
    }
}

/// A models schema as a DataFusion schema.
pub struct ModelSchema {
    pub name: String,
    pub models: Arc<Models>,
    pub view: Arc<dyn ModelsView>,
}

impl std::fmt::Debug for ModelSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelSchema({})", self.name)
    }
}

fn df_err(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[async_trait]
impl SchemaProvider for ModelSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        let state = self.view.state();
        state
            .tables
            .keys()
            .chain(state.views.keys())
            .filter(|(s, _)| *s == self.name)
            .map(|(_, n)| n.clone())
            .collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let rel = (self.name.clone(), name.to_string());
        if let Some(t) = self.view.substitute(&rel) {
            return Ok(Some(t));
        }
        let state = self.view.state();
        if let Some(location) = state.tables.get(&rel) {
            let table = self.models.table(&rel, location).await.map_err(df_err)?;
            return self.models.provider(&table).await.map(Some).map_err(df_err);
        }
        let Some(def) = state.views.get(&rel) else {
            return Ok(None);
        };
        let plan = self.view.plan(&def.sql).await.map_err(|e| {
            DataFusionError::Plan(format!(
                "view {}.{} cannot be read: {e}; create it again (CREATE OR REPLACE VIEW)",
                rel.0, rel.1
            ))
        })?;
        let plan = shaped(plan, def).map_err(|e| {
            DataFusionError::Plan(format!(
                "view {}.{} no longer matches the relations it reads: {e}; create it again (CREATE OR REPLACE VIEW)",
                rel.0, rel.1
            ))
        })?;
        Ok(Some(Arc::new(ViewTable::new(plan, Some(def.sql.clone())))))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.view
            .state()
            .exists(&(self.name.clone(), name.to_string()))
    }

    async fn table_type(&self, name: &str) -> DfResult<Option<TableType>> {
        Ok(
            match self
                .view
                .state()
                .kind(&(self.name.clone(), name.to_string()))
            {
                Some(RelKind::Table) => Some(TableType::Base),
                Some(RelKind::View) => Some(TableType::View),
                None => None,
            },
        )
    }
}

/// The view's plan with the columns it was created with: its names, and its types (a
/// column of a table it reads may have widened since).
fn shaped(plan: LogicalPlan, def: &ViewDef) -> DfResult<LogicalPlan> {
    let fields = plan.schema().fields().clone();
    if fields.len() != def.columns.len() {
        return Err(DataFusionError::Plan(format!(
            "it was created with {} columns and now reads {}",
            def.columns.len(),
            fields.len()
        )));
    }
    let mut same = true;
    let mut exprs: Vec<Expr> = Vec::with_capacity(fields.len());
    for ((qualifier, field), (name, ty)) in plan.schema().iter().zip(&def.columns) {
        let ty = DataType::from_str(ty).map_err(|e| {
            DataFusionError::Plan(format!("its column {name} has an unknown type {ty}: {e}"))
        })?;
        let column = Expr::Column(datafusion::common::Column::from((qualifier, field)));
        let mut expr = column;
        if field.data_type() != &ty {
            same = false;
            expr = cast(expr, ty);
        }
        if field.name() != name {
            same = false;
        }
        exprs.push(expr.alias(name));
    }
    if same {
        return Ok(plan);
    }
    LogicalPlanBuilder::from(plan).project(exprs)?.build()
}

/// The models as committed when the reader was made, never changing (`skipprd query`).
pub struct Fixed {
    pub state: Arc<ModelsState>,
    /// The session that plans the views, while it lives (see [`session_of`]).
    pub session: SessionSource,
}

/// Gives the current state of a session that may have ended.
pub type SessionSource = Box<dyn Fn() -> Option<datafusion::execution::SessionState> + Send + Sync>;

/// The [`SessionSource`] of `ctx`, holding it only weakly (the session holds the schemas
/// that hold this).
pub fn session_of(ctx: &datafusion::prelude::SessionContext) -> SessionSource {
    let weak = ctx.state_weak_ref();
    Box::new(move || weak.upgrade().map(|s| s.read().clone()))
}

#[async_trait]
impl ModelsView for Fixed {
    fn state(&self) -> Arc<ModelsState> {
        self.state.clone()
    }

    async fn plan(&self, sql: &str) -> DfResult<LogicalPlan> {
        let state = (self.session)().ok_or_else(|| {
            DataFusionError::Plan("the session that reads the view has ended".into())
        })?;
        plan_sql(&state, sql).await
    }
}

/// Plans a view's stored query (Postgres syntax, as the gateway parsed it) in `state`.
pub async fn plan_sql(
    state: &datafusion::execution::SessionState,
    sql: &str,
) -> DfResult<LogicalPlan> {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| DataFusionError::Plan(format!("its query does not parse: {e}")))?;
    let statement = match (statements.pop(), statements.is_empty()) {
        (Some(s), true) => s,
        _ => {
            return Err(DataFusionError::Plan(
                "its definition is not one query".into(),
            ))
        }
    };
    state
        .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
            statement,
        )))
        .await
}
