//! Gateway, catalog: the `pg_catalog` tables Skippr adds rows or columns to, built when
//! scanned: each primary key as an index, a constraint and an index relation, schema oids
//! that stay the same, the owner role, fixed settings, and the columns clients select that
//! pg_catalog's tables lack.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableProvider;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::{rows, PgCatalog, PrimaryKey, Value, WorkspaceTables};
use crate::server::pg::types::declared_types;

/// Which catalog table gains rows for the primary keys (or, in a session, for its models).
#[derive(Debug, Clone, Copy)]
pub(in crate::server::pg) enum Extra {
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
pub(in crate::server::pg) struct Extended {
    pub(in crate::server::pg) base: Arc<dyn TableProvider>,
    pub(in crate::server::pg) catalog: Arc<PgCatalog>,
    pub(in crate::server::pg) extra: Extra,
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
                .map(|b| mark_temporary(b, temp))
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
pub(super) fn remap_oids(
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

fn pkey_name(k: &PrimaryKey) -> String {
    format!("{}_pkey", k.table)
}

/// `pg_class` with `relpersistence` `t` for the relations of schema oid `temp` (the
/// session's temporary tables).
fn mark_temporary(batch: RecordBatch, temp: i64) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let (Ok(ns), Ok(p)) = (
        schema.index_of("relnamespace"),
        schema.index_of("relpersistence"),
    ) else {
        return Ok(batch);
    };
    let namespaces = arrow::compute::cast(batch.column(ns), &DataType::Int64)?;
    let namespaces = namespaces.as_primitive::<Int64Type>();
    let old = arrow::compute::cast(batch.column(p), &DataType::Utf8)?;
    let old = old.as_string::<i32>();
    let marked: StringArray = (0..batch.num_rows())
        .map(|i| {
            if namespaces.is_valid(i) && namespaces.value(i) == temp {
                Some("t")
            } else {
                old.is_valid(i).then(|| old.value(i))
            }
        })
        .collect();
    let mut columns = batch.columns().to_vec();
    columns[p] = arrow::compute::cast(&marked, schema.field(p).data_type())?;
    Ok(RecordBatch::try_new(schema, columns)?)
}
