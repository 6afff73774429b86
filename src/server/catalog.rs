//! Gateway, catalog: `pg_catalog` for the live workspace, so BI tools and drivers can list
//! schemas, tables and columns, and see each table's real primary key (served from the
//! Iceberg table's own record of it) in `pg_index`, `pg_constraint` and `pg_class`.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::common::ScalarValue;
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::prelude::SessionContext;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;

use crate::error::{Error, Result};
use crate::query::{Workspace, CATALOG};
use crate::sink::iceberg::PROP_PRIMARY_KEY;

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
    catalog
        .register_schema("pg_catalog", Arc::new(PgCatalog { inner, ws }))
        .map_err(Error::from)?;
    Ok(())
}

/// `pg_catalog`, with the primary keys of the workspace's tables added.
struct PgCatalog {
    inner: Arc<dyn SchemaProvider>,
    ws: Arc<Workspace>,
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
    async fn primary_keys(&self) -> Result<Vec<PrimaryKey>> {
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
                out.push(PrimaryKey {
                    table_oid: oids.value(i),
                    namespace_oid: ns.value(i),
                    index_oid: INDEX_OID_BASE + oids.value(i),
                    table,
                    attnums,
                });
            }
        }
        Ok(out)
    }

    /// `base`'s rows plus one row per key, built by `value(column name, key)`.
    async fn extended(
        &self,
        name: &str,
        value: impl Fn(&str, &PrimaryKey) -> Option<Value>,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let Some(base) = self.inner.table(name).await? else {
            return Ok(None);
        };
        let keys = self
            .primary_keys()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let schema = base.schema();
        let scratch = SessionContext::new();
        let mut batches = scratch.read_table(base)?.collect().await?;
        if !keys.is_empty() {
            batches.push(rows(&schema, &keys, value)?);
        }
        Ok(Some(Arc::new(MemTable::try_new(schema, vec![batches])?)))
    }
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
                v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" "),
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
        match name.to_ascii_lowercase().as_str() {
            "pg_index" => {
                self.extended("pg_index", |col, k| {
                    let n = k.attnums.len() as i64;
                    Some(match col {
                        "indexrelid" => Value::Int(k.index_oid),
                        "indrelid" => Value::Int(k.table_oid),
                        "indnatts" | "indnkeyatts" => Value::Int(n),
                        "indisunique" | "indisprimary" | "indimmediate" | "indisvalid"
                        | "indisready" | "indislive" => Value::Bool(true),
                        "indkey" => Value::Ints(k.attnums.clone()),
                        "indoption" => Value::Ints(vec![0; k.attnums.len()]),
                        _ => return None,
                    })
                })
                .await
            }
            "pg_constraint" => {
                self.extended("pg_constraint", |col, k| {
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
                })
                .await
            }
            "pg_class" => {
                self.extended("pg_class", |col, k| {
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
                })
                .await
            }
            _ => self.inner.table(name).await,
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}
