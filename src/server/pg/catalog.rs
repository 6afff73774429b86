//! Gateway, catalog: `pg_catalog` for the live workspace, so BI tools and drivers can list
//! schemas, tables and columns, and see each table's real primary key (served from the
//! Iceberg table's own record of it) in `pg_index`, `pg_constraint` and `pg_class`, with
//! schema oids that stay the same for the life of the process.

mod extended;

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::CatalogProviderList;
use datafusion::catalog::SchemaProvider;
use datafusion::common::ScalarValue;
use datafusion::datasource::TableProvider;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::ColumnarValue;
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
use super::stat_activity;
use super::types::{column_types, ColumnTypes, TYPE_OIDS};
use super::udf;
use crate::server::activity::{Backend, Backends};

pub(super) use self::extended::{Extended, Extra};

/// What the `pg_catalog` of every session shares.
#[derive(Clone)]
pub struct PgShared {
    static_tables: Arc<PgCatalogStaticTables>,
    ws: Arc<Workspace>,
    defs: Definitions,
    namespaces: Arc<Namespaces>,
    /// The gateway's sessions (`pg_stat_activity`).
    backends: Arc<Backends>,
}

impl PgShared {
    /// The `pg_catalog` of one session (`viewer`): over its catalogs `list`, with the models
    /// as `models` shows them and its temporary schema.
    pub fn session_schema(
        &self,
        list: Arc<dyn CatalogProviderList>,
        models: Arc<dyn ModelsView>,
        temp_schema: &str,
        viewer: Arc<Backend>,
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
            backends: self.backends.clone(),
            viewer: Some(viewer),
        }))
    }
}

/// Registers `pg_catalog` (with primary keys) and the Postgres functions clients call;
/// returns what each session's own `pg_catalog` is built from.
pub fn setup(
    ctx: &SessionContext,
    ws: Arc<Workspace>,
    backends: Arc<Backends>,
) -> Result<PgShared> {
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
        backends: backends.clone(),
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
                backends,
                viewer: None,
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
    /// The gateway's sessions (`pg_stat_activity`).
    backends: Arc<Backends>,
    /// The session reading this catalog (`None`: the server's own), which sees the details
    /// of the sessions it may signal only.
    viewer: Option<Arc<Backend>>,
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

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        let mut names = self.inner.table_names();
        names.push(stat_activity::NAME.to_string());
        names
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let models = self.models.is_some();
        if name.eq_ignore_ascii_case(stat_activity::NAME) {
            let viewer = self.viewer.clone();
            return Ok(Some(stat_activity::table(self.backends.clone(), viewer)));
        }
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
                backends: self.backends.clone(),
                viewer: self.viewer.clone(),
            }),
            extra,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name) || name.eq_ignore_ascii_case(stat_activity::NAME)
    }
}

#[cfg(test)]
mod tests;
