//! Gateway, catalog: `pg_catalog` for the live workspace, so BI tools and drivers can list
//! schemas, tables and columns, and see each table's real primary key (served from the
//! Iceberg table's own record of it) in `pg_index`, `pg_constraint` and `pg_class`, with
//! schema oids that stay the same for the life of the process.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::CatalogProviderList;
use datafusion::catalog::{SchemaProvider, Session};
use datafusion::common::ScalarValue;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableProvider;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{ColumnarValue, Expr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::{
    setup_pg_catalog, PgCatalogSchemaProvider, PgCatalogStaticTables,
};

use crate::config::quote_ident;
use crate::error::{Error, Result};
use crate::query::models::ModelsView;
use crate::query::{Workspace, CATALOG};
use crate::sink::iceberg::PROP_PRIMARY_KEY;

use super::catalog_types::Typed;
use super::relations;
use super::types::{column_types, declared_types, ColumnTypes, TYPE_OIDS};
use super::udf;

/// What the `pg_catalog` of every session shares.
#[derive(Clone)]
pub struct PgShared {
    static_tables: Arc<PgCatalogStaticTables>,
    ws: Arc<Workspace>,
    defs: Definitions,
    namespaces: Arc<Namespaces>,
}

impl PgShared {
    /// The `pg_catalog` of one session: over its catalogs `list`, with the models as
    /// `models` shows them and its temporary schema.
    pub fn session_schema(
        &self,
        list: Arc<dyn CatalogProviderList>,
        models: Arc<dyn ModelsView>,
        temp_schema: &str,
    ) -> Result<Arc<dyn SchemaProvider>> {
        let inner = PgCatalogSchemaProvider::try_new(
            list,
            self.static_tables.clone(),
            EmptyContextProvider,
        )
        .map_err(|e| Error::fatal(format!("cannot set up pg_catalog: {e}")))?;
        Ok(Arc::new(PgCatalog {
            inner: Arc::new(inner),
            ws: self.ws.clone(),
            defs: self.defs.clone(),
            namespaces: self.namespaces.clone(),
            models: Some((models, temp_schema.to_string())),
        }))
    }
}

/// Registers `pg_catalog` (with primary keys) and the Postgres functions clients call;
/// returns what each session's own `pg_catalog` is built from.
pub fn setup(ctx: &SessionContext, ws: Arc<Workspace>) -> Result<PgShared> {
    setup_pg_catalog(ctx, CATALOG, EmptyContextProvider)
        .map_err(|e| Error::fatal(format!("cannot set up pg_catalog: {e}")))?;
    let catalog = ctx
        .catalog(CATALOG)
        .ok_or_else(|| Error::fatal("the gateway session has no default catalog"))?;
    let inner = catalog
        .schema("pg_catalog")
        .ok_or_else(|| Error::fatal("pg_catalog was not registered"))?;
    let defs = Definitions::default();
    let shared = PgShared {
        static_tables: Arc::new(
            PgCatalogStaticTables::try_new()
                .map_err(|e| Error::fatal(format!("cannot set up pg_catalog: {e}")))?,
        ),
        ws: ws.clone(),
        defs: defs.clone(),
        namespaces: Arc::default(),
    };
    catalog
        .register_schema(
            "pg_catalog",
            Arc::new(PgCatalog {
                inner,
                ws,
                defs: defs.clone(),
                namespaces: shared.namespaces.clone(),
                models: None,
            }),
        )
        .map_err(Error::from)?;
    for name in ["pg_get_indexdef", "pg_get_constraintdef"] {
        let defs = defs.clone();
        let columns = name == "pg_get_indexdef";
        ctx.register_udf(udf::function(name, DataType::Utf8, move |args| {
            let oids = udf::int_arg(args, 0, name)?;
            // `pg_get_indexdef(oid, column, pretty)`: column 0 is the whole definition,
            // column k the k-th key column's name.
            let column = match args.args.get(1).filter(|_| columns) {
                Some(_) => Some(udf::int_arg(args, 1, name)?),
                None => None,
            };
            let defs = defs.0.read().unwrap_or_else(|e| e.into_inner());
            let out: arrow::array::StringArray = oids
                .iter()
                .enumerate()
                .map(|(i, oid)| {
                    let oid = oid?;
                    match column.as_ref().map(|c| c.is_valid(i).then(|| c.value(i))) {
                        Some(None) => None,
                        Some(Some(k)) if k > 0 => {
                            defs.get(&oid).and_then(|d| index_column(d, k as usize))
                        }
                        _ => defs.get(&oid).cloned(),
                    }
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }));
    }
    // `to_regtype(name)`: the oid of a built-in type, NULL for any other (so a client
    // probing for an extension type such as `hstore` learns it is absent).
    ctx.register_udf(udf::function("to_regtype", DataType::Int64, |args| {
        let names = udf::text_arg(args, 0, "to_regtype")?;
        let names = names.as_string::<i32>();
        let out: arrow::array::Int64Array = names
            .iter()
            .map(|n| {
                let n = n?.trim().trim_start_matches("pg_catalog.");
                TYPE_OIDS
                    .iter()
                    .find(|(t, _)| t.eq_ignore_ascii_case(n))
                    .map(|(_, oid)| *oid)
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }));
    ctx.register_udf(udf::constant(
        "version",
        ScalarValue::Utf8(Some(version_string())),
    ));
    Ok(shared)
}

/// What `version()` returns: clients (SQLAlchemy, JDBC tools) parse the Postgres version
/// from it.
pub fn version_string() -> String {
    format!(
        "PostgreSQL 16.6 (Skippr {}) on {}-linux, compiled by rustc, 64-bit",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    )
}

/// The `k`-th key column (from 1) of an index definition `CREATE ... (a, b)`, as Postgres's
/// `pg_get_indexdef(oid, k, _)` prints it; `None` past the last.
fn index_column(definition: &str, k: usize) -> Option<String> {
    let open = definition.rfind('(')?;
    let close = definition.rfind(')')?;
    let list = definition.get(open + 1..close)?;
    // Key columns are identifiers as `ident` prints them: a quoted one may hold a comma.
    let mut columns = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in list.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => columns.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    columns.push(current);
    columns.get(k - 1).map(|c| c.trim().to_string())
}

/// The definitions of our indexes and constraints by oid, as `pg_get_indexdef` and
/// `pg_get_constraintdef` print them; filled whenever the key catalog is read.
#[derive(Debug, Clone, Default)]
struct Definitions(Arc<RwLock<HashMap<i64, String>>>);

/// `pg_catalog`, with the primary keys of the workspace's tables added, and, in a
/// session, its model relations.
pub(super) struct PgCatalog {
    pub(super) inner: Arc<dyn SchemaProvider>,
    pub(super) ws: Arc<Workspace>,
    defs: Definitions,
    namespaces: Arc<Namespaces>,
    /// The session's models and temporary schema.
    pub(super) models: Option<(Arc<dyn ModelsView>, String)>,
}

/// Schema oids that stay the same. pg_catalog hands out a schema's oid anew whenever its
/// `pg_attribute` has been read (it then forgets the schemas' oids), so `pg_namespace` and
/// `pg_class.relnamespace` could disagree within one query, or between two. The gateway
/// gives each schema its own oid, by name, and reads the catalog tables one at a time.
#[derive(Default)]
struct Namespaces {
    /// Held while a catalog table is read.
    scans: tokio::sync::Mutex<()>,
    oids: RwLock<HashMap<String, i64>>,
}

/// Schema oids other than Postgres's own (`pg_catalog` 11, `public` 2200) start here, far
/// from the table oids pg_catalog hands out and below the index oids.
const NAMESPACE_OID_BASE: i64 = 1 << 29;

impl Namespaces {
    fn oid(&self, name: &str) -> i64 {
        match name {
            "pg_catalog" => return 11,
            "public" => return 2200,
            _ => {}
        }
        if let Some(oid) = self
            .oids
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return *oid;
        }
        let mut oids = self.oids.write().unwrap_or_else(|e| e.into_inner());
        let next = NAMESPACE_OID_BASE + oids.len() as i64;
        *oids.entry(name.to_string()).or_insert(next)
    }
}

impl std::fmt::Debug for PgCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgCatalog")
    }
}

/// One primary key: the table's and the schema's oid, the index oid, names and attnums.
struct PrimaryKey {
    table_oid: i64,
    namespace_oid: i64,
    index_oid: i64,
    table: String,
    attnums: Vec<i16>,
}

/// Index oids live far above the table oids the catalog hands out.
const INDEX_OID_BASE: i64 = 1 << 30;

impl PgCatalog {
    /// The primary keys of the workspace's tables, and each table's column types by oid.
    async fn workspace_tables(&self) -> Result<WorkspaceTables> {
        let mut types = HashMap::new();
        let scratch = SessionContext::new();
        for name in ["pg_class", "pg_namespace"] {
            let table = self
                .inner
                .table(name)
                .await
                .map_err(Error::from)?
                .ok_or_else(|| Error::fatal(format!("pg_catalog.{name} is missing")))?;
            scratch.register_table(name, table).map_err(Error::from)?;
        }
        let sql = format!(
            "SELECT CAST(c.oid AS BIGINT) AS oid, c.relname AS relname, CAST(n.oid AS BIGINT) AS nspoid \
             FROM pg_class c JOIN pg_namespace n ON c.relnamespace = n.oid \
             WHERE n.nspname = '{}' AND c.relkind = 'r'",
            self.ws.name.replace('\'', "''")
        );
        let batches = scratch
            .sql(&sql)
            .await
            .map_err(Error::from)?
            .collect()
            .await
            .map_err(Error::from)?;
        let mut views = std::collections::HashSet::new();
        for b in scratch
            .sql("SELECT CAST(oid AS BIGINT) AS oid FROM pg_class WHERE relkind = 'v'")
            .await
            .map_err(Error::from)?
            .collect()
            .await
            .map_err(Error::from)?
        {
            views.extend(b.column(0).as_primitive::<Int64Type>().iter().flatten());
        }
        let mut namespaces = HashMap::new();
        let listed = scratch
            .sql("SELECT CAST(oid AS BIGINT) AS oid, nspname FROM pg_namespace")
            .await
            .map_err(Error::from)?
            .collect()
            .await
            .map_err(Error::from)?;
        for b in listed {
            let oids = b.column(0).as_primitive::<Int64Type>();
            let names = arrow::compute::cast(b.column(1), &DataType::Utf8)?;
            let names = names.as_string::<i32>();
            for i in 0..b.num_rows() {
                if oids.is_valid(i) && names.is_valid(i) {
                    namespaces.insert(oids.value(i), self.namespaces.oid(names.value(i)));
                }
            }
        }
        let mut out = Vec::new();
        for b in batches {
            let oids = b.column(0).as_primitive::<Int64Type>();
            let names = arrow::compute::cast(b.column(1), &DataType::Utf8)?;
            let names = names.as_string::<i32>();
            let ns = b.column(2).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                let table = names.value(i).to_string();
                let Some(state) = self.ws.table_meta(&table).await? else {
                    continue;
                };
                let (schema, props) = state;
                types.insert(oids.value(i), column_types(&schema, &props));
                let Some(pk) = props.get(PROP_PRIMARY_KEY).filter(|p| !p.is_empty()) else {
                    continue;
                };
                let attnums: Vec<i16> = pk
                    .split(',')
                    .filter_map(|k| schema.index_of(k).ok().map(|i| (i + 1) as i16))
                    .collect();
                if attnums.is_empty() {
                    continue;
                }
                let columns: Vec<String> =
                    pk.split(',').filter(|k| !k.is_empty()).map(ident).collect();
                let index_oid = INDEX_OID_BASE + oids.value(i);
                {
                    let mut defs = self.defs.0.write().unwrap_or_else(|e| e.into_inner());
                    defs.insert(
                        index_oid,
                        format!(
                            "CREATE UNIQUE INDEX {} ON {}.{} USING btree ({})",
                            ident(&format!("{table}_pkey")),
                            ident(&self.ws.name),
                            ident(&table),
                            columns.join(", ")
                        ),
                    );
                    defs.insert(
                        index_oid + 1,
                        format!("PRIMARY KEY ({})", columns.join(", ")),
                    );
                }
                out.push(PrimaryKey {
                    table_oid: oids.value(i),
                    namespace_oid: namespaces
                        .get(&ns.value(i))
                        .copied()
                        .unwrap_or_else(|| ns.value(i)),
                    index_oid,
                    table,
                    attnums,
                });
            }
        }
        self.model_types(&mut types).await?;
        Ok(WorkspaceTables {
            keys: out,
            types,
            namespaces,
            views,
        })
    }
}

/// What the catalog says of the workspace's tables, read at one moment.
struct WorkspaceTables {
    keys: Vec<PrimaryKey>,
    /// Column types by table oid.
    types: HashMap<i64, ColumnTypes>,
    /// The gateway's schema oid by pg_catalog's current one.
    namespaces: HashMap<i64, i64>,
    /// The oids of the views (whose columns are all nullable, as on Postgres).
    views: std::collections::HashSet<i64>,
}

/// An identifier as Postgres prints it: bare when it is a plain lower-case name, quoted
/// otherwise.
pub(crate) fn ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        quote_ident(name)
    }
}

/// Which catalog table gains rows for the primary keys (or, in a session, for its models).
#[derive(Debug, Clone, Copy)]
pub(super) enum Extra {
    Index,
    Constraint,
    Class,
    Attribute,
    Namespace,
    Tables,
    Views,
    Rewrite,
    Depend,
    Description,
    Settings,
    Roles,
}

/// A `pg_catalog` table with one row added per primary key. The rows are built when the
/// table is scanned, never when it is only looked up: pg_catalog's own builders look up
/// every table of every schema (this one included) while they run.
pub(super) struct Extended {
    pub(super) base: Arc<dyn TableProvider>,
    pub(super) catalog: Arc<PgCatalog>,
    pub(super) extra: Extra,
}

impl std::fmt::Debug for Extended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Extended({:?})", self.extra)
    }
}

#[async_trait]
impl TableProvider for Extended {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        with_added_columns(self.base.schema(), self.extra)
    }

    fn table_type(&self) -> TableType {
        self.base.table_type()
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if matches!(self.extra, Extra::Settings | Extra::Roles) {
            let scratch = SessionContext::new();
            let mut batches = scratch.read_table(self.base.clone())?.collect().await?;
            let schema = self.base.schema();
            batches.push(match self.extra {
                // Settings clients read from the catalog (pgjdbc's `max_index_keys`).
                Extra::Settings => rows(&schema, SETTINGS, |col, (name, value, vartype)| {
                    Some(match col {
                        "name" => Value::Text(name.to_string()),
                        "setting" | "reset_val" | "boot_val" => Value::Text(value.to_string()),
                        "vartype" => Value::Text(vartype.to_string()),
                        "context" => Value::Text("internal".into()),
                        "source" => Value::Text("default".into()),
                        _ => return None,
                    })
                })?,
                // The owner of every relation (`relowner`), as `pg_get_userbyid` names it.
                _ => rows(&schema, &[()], |col, _| {
                    Some(match col {
                        "oid" => Value::Int(OWNER_OID),
                        "rolname" => Value::Text(OWNER.into()),
                        "rolinherit" => Value::Bool(true),
                        "rolsuper" | "rolcreaterole" | "rolcreatedb" | "rolcanlogin"
                        | "rolreplication" | "rolbypassrls" => Value::Bool(false),
                        "rolconnlimit" => Value::Int(-1),
                        _ => return None,
                    })
                })?,
            });
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                schema,
                projection.cloned(),
            )?);
        }
        let _one_at_a_time = self.catalog.namespaces.scans.lock().await;
        if matches!(self.extra, Extra::Namespace) {
            // Schemas only change oid, by name: the workspace's tables are not needed.
            let scratch = SessionContext::new();
            let ns = &self.catalog.namespaces;
            let batches = scratch
                .read_table(self.base.clone())?
                .collect()
                .await?
                .into_iter()
                .map(|b| remap_oids(b, "oid", |_, name| name.map(|n| ns.oid(n))))
                .collect::<DfResult<Vec<_>>>()?;
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                self.base.schema(),
                projection.cloned(),
            )?);
        }
        if let Some((models, _)) = &self.catalog.models {
            if let Some(batches) = self.model_rows(models.state().as_ref()).await? {
                return Ok(MemorySourceConfig::try_new_exec(
                    &[batches],
                    self.base.schema(),
                    projection.cloned(),
                )?);
            }
        }
        let WorkspaceTables {
            keys,
            types,
            namespaces,
            views,
        } = self
            .catalog
            .workspace_tables()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let schema = self.base.schema();
        let scratch = SessionContext::new();
        let mut batches = scratch.read_table(self.base.clone())?.collect().await?;
        if matches!(self.extra, Extra::Attribute) {
            let batches = batches
                .into_iter()
                .map(|b| declared_types(b, &types).and_then(|b| nullable_views(b, &views)))
                .collect::<DfResult<Vec<_>>>()?;
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                schema,
                projection.cloned(),
            )?);
        }
        if matches!(self.extra, Extra::Class) {
            let current = |oid: i64, _: Option<&str>| namespaces.get(&oid).copied();
            let owner = |oid: i64, _: Option<&str>| (oid == 0).then_some(OWNER_OID);
            batches = batches
                .into_iter()
                .map(|b| remap_oids(b, "relnamespace", current))
                .map(|b| b.and_then(|b| remap_oids(b, "relowner", owner)))
                .collect::<DfResult<_>>()?;
        }
        if let (Extra::Class, Some((_, temp))) = (self.extra, &self.catalog.models) {
            let temp = self.catalog.namespaces.oid(temp);
            batches = batches
                .into_iter()
                .map(|b| relations::mark_temporary(b, temp))
                .collect::<DfResult<_>>()?;
        }
        if matches!(self.extra, Extra::Class) && !keys.is_empty() {
            // Tables with a primary key have an index (psql's `\d` only looks when it is set).
            batches = batches
                .into_iter()
                .map(|b| mark_indexed(b, &keys))
                .collect::<DfResult<_>>()?;
        }
        if !keys.is_empty() {
            batches.push(match self.extra {
                Extra::Index => rows(&schema, &keys, index_value)?,
                Extra::Constraint => rows(&schema, &keys, constraint_value)?,
                Extra::Class => rows(&schema, &keys, class_value)?,
                // Handled above: columns are rewritten, not added, or rows of models.
                _ => RecordBatch::new_empty(schema.clone()),
            });
        }
        let full = self.schema();
        let batches = batches
            .into_iter()
            .map(|b| add_null_columns(b, &full))
            .collect::<DfResult<Vec<_>>>()?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            full,
            projection.cloned(),
        )?)
    }
}

/// `batch` with the oids of column `column` replaced by `new(oid, nspname)` where it gives
/// one (`nspname` when the batch has that column).
fn remap_oids(
    batch: RecordBatch,
    column: &str,
    new: impl Fn(i64, Option<&str>) -> Option<i64>,
) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let Ok(at) = schema.index_of(column) else {
        return Ok(batch);
    };
    let names = match schema.index_of("nspname") {
        Ok(n) => Some(arrow::compute::cast(batch.column(n), &DataType::Utf8)?),
        Err(_) => None,
    };
    let names = names.as_ref().map(|n| n.as_string::<i32>());
    let oids = arrow::compute::cast(batch.column(at), &DataType::Int64)?;
    let oids = oids.as_primitive::<Int64Type>();
    let remapped: arrow::array::Int64Array = (0..batch.num_rows())
        .map(|i| {
            if oids.is_null(i) {
                return None;
            }
            let name = names.filter(|n| n.is_valid(i)).map(|n| n.value(i));
            Some(new(oids.value(i), name).unwrap_or_else(|| oids.value(i)))
        })
        .collect();
    let mut columns = batch.columns().to_vec();
    columns[at] = arrow::compute::cast(&remapped, schema.field(at).data_type())?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The role that owns every relation, as `pg_get_userbyid` names it, and its oid (the
/// bootstrap superuser's on Postgres).
const OWNER: &str = "postgres";
const OWNER_OID: i64 = 10;

/// Fixed settings `pg_settings` lists besides pg_catalog's own: (name, setting, vartype).
const SETTINGS: &[(&str, &str, &str)] = &[
    ("max_index_keys", "32", "integer"),
    ("max_identifier_length", "63", "integer"),
    ("max_function_args", "100", "integer"),
    ("block_size", "8192", "integer"),
    ("integer_datetimes", "on", "bool"),
    ("server_encoding", "UTF8", "string"),
    ("server_version", "16.6", "string"),
    ("server_version_num", "160006", "integer"),
];

/// Columns Postgres has that pg_catalog's table lacks, which clients select: always NULL
/// here (`pg_class.reloptions`: no table has storage options).
fn added_columns(extra: Extra) -> Vec<Field> {
    match extra {
        Extra::Class => ["reloptions", "relacl"]
            .into_iter()
            .map(|name| {
                let pg = if name == "relacl" {
                    "aclitem[]"
                } else {
                    "text[]"
                };
                Field::new(
                    name,
                    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                    true,
                )
                .with_metadata(HashMap::from([(
                    crate::query::live::PG_TYPE_META.to_string(),
                    pg.to_string(),
                )]))
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn with_added_columns(base: SchemaRef, extra: Extra) -> SchemaRef {
    let added: Vec<Field> = added_columns(extra)
        .into_iter()
        .filter(|f| base.index_of(f.name()).is_err())
        .collect();
    if added.is_empty() {
        return base;
    }
    let mut fields: Vec<Field> = base.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.extend(added);
    Arc::new(Schema::new_with_metadata(fields, base.metadata().clone()))
}

/// Every relation's access privileges: anyone connected reads (`SELECT`), as the gateway
/// lets them, and the grant is the catalog owner's (pgjdbc's `getTablePrivileges`, which
/// Metabase uses to hide what a user may not read, parses this).
const RELACL: &str = "=r/postgres";

/// `batch` with the columns of `full` it lacks (the added ones, last): `relacl` as
/// [`RELACL`], any other NULL.
fn add_null_columns(batch: RecordBatch, full: &SchemaRef) -> DfResult<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    for field in full.fields().iter().skip(columns.len()) {
        columns.push(match field.name().as_str() {
            "relacl" => {
                let mut acl = arrow::array::ListBuilder::new(arrow::array::StringBuilder::new());
                for _ in 0..batch.num_rows() {
                    acl.values().append_value(RELACL);
                    acl.append(true);
                }
                arrow::compute::cast(&(Arc::new(acl.finish()) as ArrayRef), field.data_type())?
            }
            _ => arrow::array::new_null_array(field.data_type(), batch.num_rows()),
        });
    }
    Ok(RecordBatch::try_new(full.clone(), columns)?)
}

/// Clears `attnotnull` of the views' columns: Postgres does not carry NOT NULL into a view.
fn nullable_views(
    batch: RecordBatch,
    views: &std::collections::HashSet<i64>,
) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let (Ok(rel), Ok(flag)) = (schema.index_of("attrelid"), schema.index_of("attnotnull")) else {
        return Ok(batch);
    };
    if views.is_empty() {
        return Ok(batch);
    }
    let rels = arrow::compute::cast(batch.column(rel), &DataType::Int64)?;
    let rels = rels.as_primitive::<Int64Type>();
    let flags = batch.column(flag).as_boolean();
    let cleared: arrow::array::BooleanArray = (0..batch.num_rows())
        .map(|i| {
            let view = rels.is_valid(i) && views.contains(&rels.value(i));
            Some(!view && flags.is_valid(i) && flags.value(i))
        })
        .collect();
    let mut columns = batch.columns().to_vec();
    columns[flag] = Arc::new(cleared);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Sets `relhasindex` on the rows of tables that have a primary key.
fn mark_indexed(batch: RecordBatch, keys: &[PrimaryKey]) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let (Ok(oid_col), Ok(flag_col)) = (schema.index_of("oid"), schema.index_of("relhasindex"))
    else {
        return Ok(batch);
    };
    let oids = arrow::compute::cast(batch.column(oid_col), &DataType::Int64)?;
    let oids = oids.as_primitive::<Int64Type>();
    let flags = batch.column(flag_col).as_boolean();
    let marked: arrow::array::BooleanArray = (0..batch.num_rows())
        .map(|i| {
            let indexed = keys.iter().any(|k| k.table_oid == oids.value(i));
            Some(indexed || (flags.is_valid(i) && flags.value(i)))
        })
        .collect();
    let mut columns = batch.columns().to_vec();
    columns[flag_col] = Arc::new(marked);
    Ok(RecordBatch::try_new(schema, columns)?)
}

fn index_value(col: &str, k: &PrimaryKey) -> Option<Value> {
    let n = k.attnums.len() as i64;
    Some(match col {
        "indexrelid" => Value::Int(k.index_oid),
        "indrelid" => Value::Int(k.table_oid),
        "indnatts" | "indnkeyatts" => Value::Int(n),
        "indisunique" | "indisprimary" | "indimmediate" | "indisvalid" | "indisready"
        | "indislive" => Value::Bool(true),
        "indkey" => Value::Ints(k.attnums.clone()),
        "indoption" => Value::Ints(vec![0; k.attnums.len()]),
        _ => return None,
    })
}

fn constraint_value(col: &str, k: &PrimaryKey) -> Option<Value> {
    Some(match col {
        "oid" => Value::Int(k.index_oid + 1),
        "conname" => Value::Text(pkey_name(k)),
        "connamespace" => Value::Int(k.namespace_oid),
        "contype" => Value::Text("p".into()),
        "convalidated" | "conislocal" => Value::Bool(true),
        "condeferrable" | "condeferred" | "connoinherit" => Value::Bool(false),
        "conrelid" => Value::Int(k.table_oid),
        "conindid" => Value::Int(k.index_oid),
        "conkey" => Value::Ints(k.attnums.clone()),
        _ => return None,
    })
}

fn class_value(col: &str, k: &PrimaryKey) -> Option<Value> {
    Some(match col {
        "oid" => Value::Int(k.index_oid),
        "relname" => Value::Text(pkey_name(k)),
        "relnamespace" => Value::Int(k.namespace_oid),
        "relkind" => Value::Text("i".into()),
        "relam" => Value::Int(403),
        "relnatts" => Value::Int(k.attnums.len() as i64),
        "relpersistence" => Value::Text("p".into()),
        "relispopulated" => Value::Bool(true),
        _ => return None,
    })
}

/// A catalog value, converted to whatever type the column has.
pub(super) enum Value {
    Int(i64),
    Bool(bool),
    Text(String),
    Ints(Vec<i16>),
}

fn scalar(v: Value, field: &Field) -> DfResult<ScalarValue> {
    let dt = field.data_type();
    let s = match v {
        Value::Int(i) => ScalarValue::Int64(Some(i)).cast_to(dt)?,
        Value::Bool(b) => ScalarValue::Boolean(Some(b)).cast_to(dt)?,
        Value::Text(t) => ScalarValue::Utf8(Some(t)).cast_to(dt)?,
        Value::Ints(v) => match dt {
            DataType::List(inner) => {
                let values: Vec<ScalarValue> = v
                    .iter()
                    .map(|i| ScalarValue::Int16(Some(*i)).cast_to(inner.data_type()))
                    .collect::<DfResult<_>>()?;
                ScalarValue::List(ScalarValue::new_list_nullable(&values, inner.data_type()))
            }
            _ => ScalarValue::Utf8(Some(
                v.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ))
            .cast_to(dt)?,
        },
    };
    Ok(s)
}

/// A batch of `schema` with one row per item: each column's value as `value` gives it by
/// column name, else NULL (or the type's default in a NOT NULL column).
pub(super) fn rows<T>(
    schema: &SchemaRef,
    keys: &[T],
    value: impl Fn(&str, &T) -> Option<Value>,
) -> DfResult<RecordBatch> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let values: Vec<ScalarValue> = keys
            .iter()
            .map(|k| match value(field.name(), k) {
                Some(v) => scalar(v, field),
                None if field.is_nullable() => ScalarValue::try_from(field.data_type()),
                None => ScalarValue::new_default(field.data_type()),
            })
            .collect::<DfResult<_>>()?;
        columns.push(ScalarValue::iter_to_array(values)?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

fn pkey_name(k: &PrimaryKey) -> String {
    format!("{}_pkey", k.table)
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let models = self.models.is_some();
        let extra = match name.to_ascii_lowercase().as_str() {
            "pg_index" => Extra::Index,
            "pg_constraint" => Extra::Constraint,
            "pg_class" => Extra::Class,
            "pg_attribute" => Extra::Attribute,
            "pg_namespace" => Extra::Namespace,
            "pg_tables" if models => Extra::Tables,
            "pg_views" if models => Extra::Views,
            "pg_rewrite" if models => Extra::Rewrite,
            "pg_depend" if models => Extra::Depend,
            "pg_description" if models => Extra::Description,
            "pg_settings" => Extra::Settings,
            "pg_roles" => Extra::Roles,
            _ => {
                let table = self.inner.table(name).await?;
                return Ok(table.map(|t| Typed::wrap("pg_catalog", name, t)));
            }
        };
        let Some(base) = self.inner.table(name).await? else {
            return Ok(None);
        };
        let base = Typed::wrap("pg_catalog", name, base);
        Ok(Some(Arc::new(Extended {
            base,
            catalog: Arc::new(PgCatalog {
                inner: self.inner.clone(),
                ws: self.ws.clone(),
                defs: self.defs.clone(),
                namespaces: self.namespaces.clone(),
                models: self.models.clone(),
            }),
            extra,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

#[cfg(test)]
mod tests;
