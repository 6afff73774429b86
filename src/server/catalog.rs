//! Gateway, catalog: `pg_catalog` for the live workspace, so BI tools and drivers can list
//! schemas, tables and columns, and see each table's real primary key (served from the
//! Iceberg table's own record of it) in `pg_index`, `pg_constraint` and `pg_class`, with
//! schema oids that stay the same for the life of the process.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session};
use datafusion::common::ScalarValue;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableProvider;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;

use crate::config::quote_ident;
use crate::error::{Error, Result};
use crate::query::{Workspace, CATALOG};
use crate::sink::iceberg::{SourceColumn, PROP_COLUMNS, PROP_PRIMARY_KEY};

/// Registers `pg_catalog` (with primary keys) and the Postgres functions clients call.
pub fn setup(ctx: &SessionContext, ws: Arc<Workspace>) -> Result<()> {
    setup_pg_catalog(ctx, CATALOG, EmptyContextProvider)
        .map_err(|e| Error::fatal(format!("cannot set up pg_catalog: {e}")))?;
    let catalog = ctx
        .catalog(CATALOG)
        .ok_or_else(|| Error::fatal("the gateway session has no default catalog"))?;
    let inner = catalog
        .schema("pg_catalog")
        .ok_or_else(|| Error::fatal("pg_catalog was not registered"))?;
    let defs = Definitions::default();
    catalog
        .register_schema(
            "pg_catalog",
            Arc::new(PgCatalog {
                inner,
                ws,
                defs: defs.clone(),
                namespaces: Arc::default(),
            }),
        )
        .map_err(Error::from)?;
    ctx.register_udf(ScalarUDF::from(DefinitionUdf::new(
        "pg_get_indexdef",
        defs.clone(),
    )));
    ctx.register_udf(ScalarUDF::from(DefinitionUdf::new(
        "pg_get_constraintdef",
        defs,
    )));
    ctx.register_udf(ScalarUDF::from(ToRegtypeUdf {
        signature: Signature::variadic_any(Volatility::Stable),
    }));
    ctx.register_udf(ScalarUDF::from(VersionUdf {
        signature: Signature::exact(vec![], Volatility::Stable),
    }));
    Ok(())
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

/// Built-in types by name, for `to_regtype`.
const TYPE_OIDS: &[(&str, i64)] = &[
    ("bool", 16),
    ("boolean", 16),
    ("bytea", 17),
    ("char", 18),
    ("name", 19),
    ("int8", 20),
    ("bigint", 20),
    ("int2", 21),
    ("smallint", 21),
    ("int4", 23),
    ("integer", 23),
    ("int", 23),
    ("text", 25),
    ("oid", 26),
    ("json", 114),
    ("float4", 700),
    ("real", 700),
    ("float8", 701),
    ("double precision", 701),
    ("varchar", 1043),
    ("character varying", 1043),
    ("date", 1082),
    ("time", 1083),
    ("timestamp", 1114),
    ("timestamptz", 1184),
    ("interval", 1186),
    ("numeric", 1700),
    ("uuid", 2950),
    ("jsonb", 3802),
];

/// `to_regtype(name)`: the oid of a built-in type, NULL for any other (so a client probing
/// for an extension type such as `hstore` learns it is absent).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ToRegtypeUdf {
    signature: Signature,
}

impl ScalarUDFImpl for ToRegtypeUdf {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "to_regtype"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(first) = args.args.first() else {
            return Err(DataFusionError::Plan(
                "to_regtype() needs a type name".into(),
            ));
        };
        let names = first.to_array(args.number_rows)?;
        let names = arrow::compute::cast(&names, &DataType::Utf8)?;
        let names = names.as_string::<i32>();
        let out: arrow::array::Int64Array = (0..names.len())
            .map(|i| {
                if names.is_null(i) {
                    return None;
                }
                let n = names.value(i).trim().trim_start_matches("pg_catalog.");
                TYPE_OIDS
                    .iter()
                    .find(|(t, _)| t.eq_ignore_ascii_case(n))
                    .map(|(_, oid)| *oid)
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `version()`, Postgres-style.
#[derive(Debug, PartialEq, Eq, Hash)]
struct VersionUdf {
    signature: Signature,
}

impl ScalarUDFImpl for VersionUdf {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "version"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            version_string(),
        ))))
    }
}

/// The definitions of our indexes and constraints by oid, as `pg_get_indexdef` and
/// `pg_get_constraintdef` print them; filled whenever the key catalog is read.
#[derive(Debug, Clone, Default)]
struct Definitions(Arc<RwLock<HashMap<i64, String>>>);

/// `pg_get_indexdef(oid [, column, pretty])` and `pg_get_constraintdef(oid [, pretty])`.
#[derive(Debug)]
struct DefinitionUdf {
    name: &'static str,
    signature: Signature,
    defs: Definitions,
}

impl DefinitionUdf {
    fn new(name: &'static str, defs: Definitions) -> Self {
        Self {
            name,
            signature: Signature::variadic_any(Volatility::Stable),
            defs,
        }
    }
}

impl PartialEq for DefinitionUdf {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for DefinitionUdf {}

impl std::hash::Hash for DefinitionUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl ScalarUDFImpl for DefinitionUdf {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(first) = args.args.first() else {
            return Err(DataFusionError::Plan(format!(
                "{}() needs an oid argument",
                self.name
            )));
        };
        let oids = first.to_array(args.number_rows)?;
        let oids = arrow::compute::cast(&oids, &DataType::Int64)?;
        let oids = oids.as_primitive::<Int64Type>();
        let defs = self.defs.0.read().unwrap_or_else(|e| e.into_inner());
        let out: arrow::array::StringArray = (0..oids.len())
            .map(|i| {
                if oids.is_null(i) {
                    None
                } else {
                    defs.get(&oids.value(i)).cloned()
                }
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `pg_catalog`, with the primary keys of the workspace's tables added.
struct PgCatalog {
    inner: Arc<dyn SchemaProvider>,
    ws: Arc<Workspace>,
    defs: Definitions,
    namespaces: Arc<Namespaces>,
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

/// The declared Postgres type of each column of a table, by attnum - 1: (oid, typmod).
pub(super) type ColumnTypes = Vec<(i32, i32)>;

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
        Ok(WorkspaceTables {
            keys: out,
            types,
            namespaces,
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
}

/// An identifier as Postgres prints it: bare when it is a plain lower-case name, quoted
/// otherwise.
pub(super) fn ident(name: &str) -> String {
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

/// Which catalog table gains rows for the primary keys.
#[derive(Debug, Clone, Copy)]
enum Extra {
    Index,
    Constraint,
    Class,
    Attribute,
    Namespace,
}

/// A `pg_catalog` table with one row added per primary key. The rows are built when the
/// table is scanned, never when it is only looked up: pg_catalog's own builders look up
/// every table of every schema (this one included) while they run.
struct Extended {
    base: Arc<dyn TableProvider>,
    catalog: Arc<PgCatalog>,
    extra: Extra,
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
        let WorkspaceTables {
            keys,
            types,
            namespaces,
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
                .map(|b| declared_types(b, &types))
                .collect::<DfResult<Vec<_>>>()?;
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                schema,
                projection.cloned(),
            )?);
        }
        if matches!(self.extra, Extra::Class) {
            let current = |oid: i64, _: Option<&str>| namespaces.get(&oid).copied();
            batches = batches
                .into_iter()
                .map(|b| remap_oids(b, "relnamespace", current))
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
                // Handled above: columns are rewritten, not added.
                Extra::Attribute | Extra::Namespace => RecordBatch::new_empty(schema.clone()),
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

/// Columns Postgres has that pg_catalog's table lacks, which clients select: always NULL
/// here (`pg_class.reloptions`: no table has storage options).
fn added_columns(extra: Extra) -> Vec<Field> {
    match extra {
        Extra::Class => vec![Field::new(
            "reloptions",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        )],
        Extra::Index | Extra::Constraint | Extra::Attribute | Extra::Namespace => Vec::new(),
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

/// `batch` with NULL values for the columns of `full` it lacks (the added ones, last).
fn add_null_columns(batch: RecordBatch, full: &SchemaRef) -> DfResult<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    for field in full.fields().iter().skip(columns.len()) {
        columns.push(arrow::array::new_null_array(
            field.data_type(),
            batch.num_rows(),
        ));
    }
    Ok(RecordBatch::try_new(full.clone(), columns)?)
}

/// The Postgres type of each column: the source's declared type as the table records it
/// (`skippr.columns`), or the type of its Iceberg field (columns without a record, such as
/// dropped ones).
pub(super) fn column_types(schema: &Schema, props: &HashMap<String, String>) -> ColumnTypes {
    let recorded: Vec<SourceColumn> = props
        .get(PROP_COLUMNS)
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_default();
    schema
        .fields()
        .iter()
        .map(|f| {
            recorded
                .iter()
                .find(|c| c.target() == f.name())
                .map(|c| (c.oid as i32, c.typmod))
                .unwrap_or_else(|| arrow_type_oid(f.data_type()))
        })
        .collect()
}

/// The Postgres type that carries an Arrow type: (oid, typmod).
pub(super) fn arrow_type_oid(dt: &DataType) -> (i32, i32) {
    match dt {
        DataType::Boolean => (16, -1),
        DataType::Int16 => (21, -1),
        DataType::Int32 => (23, -1),
        DataType::Int64 => (20, -1),
        DataType::Float32 => (700, -1),
        DataType::Float64 => (701, -1),
        DataType::Decimal128(p, s) => (1700, ((*p as i32) << 16 | (*s as i32)) + 4),
        DataType::Binary | DataType::LargeBinary => (17, -1),
        DataType::FixedSizeBinary(16) => (2950, -1),
        DataType::Date32 => (1082, -1),
        DataType::Time64(_) => (1083, -1),
        DataType::Timestamp(_, Some(_)) => (1184, -1),
        DataType::Timestamp(_, None) => (1114, -1),
        DataType::List(inner) => {
            let (elem, typmod) = arrow_type_oid(inner.data_type());
            let array = match elem {
                16 => 1000,
                17 => 1001,
                21 => 1005,
                23 => 1007,
                20 => 1016,
                700 => 1021,
                701 => 1022,
                1700 => 1231,
                2950 => 2951,
                1082 => 1182,
                1083 => 1183,
                1184 => 1185,
                1114 => 1115,
                _ => 1009,
            };
            (array, typmod)
        }
        _ => (25, -1),
    }
}

/// Array type oids (for `attndims`).
fn is_array_oid(oid: i32) -> bool {
    matches!(
        oid,
        1000 | 1001
            | 1005
            | 1007
            | 1009
            | 1014
            | 1015
            | 1016
            | 1021
            | 1022
            | 1115
            | 1182
            | 1183
            | 1185
            | 1231
            | 2951
            | 199
            | 3807
    )
}

/// Rewrites `atttypid`, `atttypmod` and `attndims` of the workspace's columns.
fn declared_types(batch: RecordBatch, types: &HashMap<i64, ColumnTypes>) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let idx = |n: &str| schema.index_of(n).ok();
    let (Some(rel), Some(num), Some(typ), Some(typmod)) = (
        idx("attrelid"),
        idx("attnum"),
        idx("atttypid"),
        idx("atttypmod"),
    ) else {
        return Ok(batch);
    };
    let dims = idx("attndims");
    let rels = arrow::compute::cast(batch.column(rel), &DataType::Int64)?;
    let rels = rels.as_primitive::<Int64Type>();
    let nums = arrow::compute::cast(batch.column(num), &DataType::Int64)?;
    let nums = nums.as_primitive::<Int64Type>();
    let mut typ_out = Vec::with_capacity(batch.num_rows());
    let mut mod_out = Vec::with_capacity(batch.num_rows());
    let mut dim_out = Vec::with_capacity(batch.num_rows());
    let old_typ = arrow::compute::cast(batch.column(typ), &DataType::Int32)?;
    let old_typ = old_typ.as_primitive::<Int32Type>();
    let old_mod = arrow::compute::cast(batch.column(typmod), &DataType::Int32)?;
    let old_mod = old_mod.as_primitive::<Int32Type>();
    for i in 0..batch.num_rows() {
        let declared = types
            .get(&rels.value(i))
            .and_then(|cols| cols.get((nums.value(i) - 1).max(0) as usize).copied())
            .filter(|_| nums.value(i) > 0);
        let (t, m) = declared.unwrap_or((old_typ.value(i), old_mod.value(i)));
        typ_out.push(t);
        mod_out.push(m);
        dim_out.push(if is_array_oid(t) { 1 } else { 0 });
    }
    let mut columns = batch.columns().to_vec();
    let typed = |v: Vec<i32>, like: &ArrayRef| -> DfResult<ArrayRef> {
        Ok(arrow::compute::cast(
            &(Arc::new(arrow::array::Int32Array::from(v)) as ArrayRef),
            like.data_type(),
        )?)
    };
    columns[typ] = typed(typ_out, &columns[typ])?;
    columns[typmod] = typed(mod_out, &columns[typmod])?;
    if let Some(d) = dims {
        columns[d] = typed(dim_out, &columns[d])?;
    }
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
enum Value {
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

fn rows(
    schema: &SchemaRef,
    keys: &[PrimaryKey],
    value: impl Fn(&str, &PrimaryKey) -> Option<Value>,
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
        let extra = match name.to_ascii_lowercase().as_str() {
            "pg_index" => Extra::Index,
            "pg_constraint" => Extra::Constraint,
            "pg_class" => Extra::Class,
            "pg_attribute" => Extra::Attribute,
            "pg_namespace" => Extra::Namespace,
            _ => return self.inner.table(name).await,
        };
        let Some(base) = self.inner.table(name).await? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Extended {
            base,
            catalog: Arc::new(PgCatalog {
                inner: self.inner.clone(),
                ws: self.ws.clone(),
                defs: self.defs.clone(),
                namespaces: self.namespaces.clone(),
            }),
            extra,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_oids_stay_the_same() {
        let ns = Namespaces::default();
        assert_eq!(ns.oid("pg_catalog"), 11);
        assert_eq!(ns.oid("public"), 2200);
        let a = ns.oid("analytics");
        let b = ns.oid("skippr");
        assert_ne!(a, b);
        assert_eq!(ns.oid("analytics"), a);
        assert!((NAMESPACE_OID_BASE..INDEX_OID_BASE).contains(&a));
    }

    #[test]
    fn oids_are_remapped_by_name() -> DfResult<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("oid", DataType::Int32, false),
            Field::new("nspname", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(arrow::array::Int32Array::from(vec![16390, 16391])),
                Arc::new(arrow::array::StringArray::from(vec!["pg_catalog", "other"])),
            ],
        )?;
        let out = remap_oids(batch, "oid", |_, name| {
            (name == Some("pg_catalog")).then_some(11)
        })?;
        let oids = out.column(0).as_primitive::<Int32Type>();
        assert_eq!((oids.value(0), oids.value(1)), (11, 16391));
        assert_eq!(out.schema().field(0).data_type(), &DataType::Int32);
        Ok(())
    }
}
