//! Gateway, `information_schema`: the query engine's own views (tables, columns, ...) plus
//! `table_constraints` and `key_column_usage`, built from each table's recorded primary key,
//! which BI tools read to learn the keys; `columns` gains Postgres's `udt_schema`/`udt_name`
//! (the declared type's name, as Metabase reads it) and identity/generation columns.

use std::any::Any;
use std::sync::Arc;

use std::collections::HashMap;

use arrow::array::{ArrayRef, AsArray, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use async_trait::async_trait;
use datafusion::catalog::information_schema::InformationSchemaProvider;
use datafusion::catalog::{CatalogProviderList, SchemaProvider};
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::prelude::SessionContext;
use pgwire::api::Type;

use super::types::{arrow_type_oid, column_types, ColumnTypes};

use crate::query::{Workspace, CATALOG};

pub struct InfoSchema {
    inner: InformationSchemaProvider,
    catalogs: Arc<dyn CatalogProviderList>,
    ws: Arc<Workspace>,
}

impl std::fmt::Debug for InfoSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InfoSchema")
    }
}

impl InfoSchema {
    pub fn new(catalogs: Arc<dyn CatalogProviderList>, ws: Arc<Workspace>) -> Self {
        Self {
            inner: InformationSchemaProvider::new(catalogs.clone()),
            catalogs,
            ws,
        }
    }

    /// (table, key columns in order) for every table with a primary key.
    async fn keys(&self) -> DfResult<Vec<(String, Vec<String>)>> {
        let mut out = Vec::new();
        for name in self.ws.table_names() {
            let meta = self
                .ws
                .table_meta(&name)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            if let Some((_, props)) = meta {
                let cols = crate::table::primary_key(&props);
                if !cols.is_empty() {
                    out.push((name, cols));
                }
            }
        }
        Ok(out)
    }

    async fn table_constraints(&self) -> DfResult<Arc<dyn TableProvider>> {
        let keys = self.keys().await?;
        let schema = Arc::new(Schema::new(
            CONSTRAINT_COLUMNS
                .iter()
                .chain(&[
                    "constraint_type",
                    "is_deferrable",
                    "initially_deferred",
                    "enforced",
                    "nulls_distinct",
                ])
                .map(|c| text_field(c))
                .collect::<Vec<_>>(),
        ));
        let n = keys.len();
        let same = |v: &str| repeated(v, n);
        let names: ArrayRef = Arc::new(StringArray::from(
            keys.iter()
                .map(|(t, _)| format!("{t}_pkey"))
                .collect::<Vec<_>>(),
        ));
        let tables: ArrayRef = Arc::new(StringArray::from(
            keys.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(),
        ));
        let columns = vec![
            same(CATALOG),
            same(&self.ws.name),
            names,
            same(CATALOG),
            same(&self.ws.name),
            tables,
            same("PRIMARY KEY"),
            same("NO"),
            same("NO"),
            same("YES"),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns)?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }

    async fn key_column_usage(&self) -> DfResult<Arc<dyn TableProvider>> {
        let keys = self.keys().await?;
        let mut fields: Vec<Field> = CONSTRAINT_COLUMNS
            .iter()
            .chain(&["column_name"])
            .map(|c| text_field(c))
            .collect();
        fields.push(Field::new("ordinal_position", DataType::Int32, false));
        fields.push(Field::new(
            "position_in_unique_constraint",
            DataType::Int32,
            true,
        ));
        let schema = Arc::new(Schema::new(fields));
        let rows: Vec<(String, String, i32)> = keys
            .iter()
            .flat_map(|(t, cols)| {
                cols.iter()
                    .enumerate()
                    .map(move |(i, c)| (t.clone(), c.clone(), i as i32 + 1))
            })
            .collect();
        let n = rows.len();
        let same = |v: &str| repeated(v, n);
        let columns: Vec<ArrayRef> = vec![
            same(CATALOG),
            same(&self.ws.name),
            Arc::new(StringArray::from(
                rows.iter()
                    .map(|(t, _, _)| format!("{t}_pkey"))
                    .collect::<Vec<_>>(),
            )),
            same(CATALOG),
            same(&self.ws.name),
            Arc::new(StringArray::from(
                rows.iter().map(|(t, _, _)| t.clone()).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|(_, c, _)| c.clone()).collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(
                rows.iter().map(|(_, _, i)| *i).collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(vec![None; n])),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns)?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}

impl InfoSchema {
    /// The declared Postgres types of a table's columns: as the source declared them for the
    /// workspace's tables, else from their Arrow types.
    async fn declared_types(&self, schema: &str, table: &str) -> DfResult<ColumnTypes> {
        if schema == self.ws.name {
            if let Some((arrow_schema, props)) = self
                .ws
                .table_meta(table)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
            {
                return Ok(column_types(&arrow_schema, &props));
            }
        }
        let provider = match self
            .catalogs
            .catalog(CATALOG)
            .and_then(|c| c.schema(schema))
        {
            Some(s) => s.table(table).await?,
            None => None,
        };
        Ok(provider
            .map(|p| {
                p.schema()
                    .fields()
                    .iter()
                    .map(|f| arrow_type_oid(f.data_type()))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The engine's `columns`, with `udt_catalog`, `udt_schema`, `udt_name`, `is_identity`,
    /// `identity_generation` and `is_generated` added.
    async fn columns(&self) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let Some(base) = self.inner.table("columns").await? else {
            return Ok(None);
        };
        let batches = SessionContext::new()
            .read_table(base.clone())?
            .collect()
            .await?;
        // Postgres counts `ordinal_position` from 1 (the engine from 0), as an integer.
        let mut fields: Vec<Field> = base
            .schema()
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                "ordinal_position" => Field::new("ordinal_position", DataType::Int32, false),
                _ => f.as_ref().clone(),
            })
            .collect();
        for name in [
            "udt_catalog",
            "udt_schema",
            "udt_name",
            "is_identity",
            "identity_generation",
            "is_generated",
        ] {
            fields.push(text_field(name));
        }
        let schema = Arc::new(Schema::new(fields));
        let mut types: HashMap<(String, String), ColumnTypes> = HashMap::new();
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            let col = |name: &str| -> DfResult<ArrayRef> {
                let i = b.schema().index_of(name)?;
                Ok(b.column(i).clone())
            };
            let schemas = arrow::compute::cast(&col("table_schema")?, &DataType::Utf8)?;
            let schemas = schemas.as_string::<i32>();
            let tables = arrow::compute::cast(&col("table_name")?, &DataType::Utf8)?;
            let tables = tables.as_string::<i32>();
            let position_at = b.schema().index_of("ordinal_position")?;
            let positions = arrow::compute::cast(b.column(position_at), &DataType::Int64)?;
            let positions = positions.as_primitive::<Int64Type>();
            let from_one: Int32Array = positions.iter().map(|p| p.map(|p| p as i32 + 1)).collect();
            let mut names = Vec::with_capacity(b.num_rows());
            for i in 0..b.num_rows() {
                let key = (schemas.value(i).to_string(), tables.value(i).to_string());
                if !types.contains_key(&key) {
                    let declared = self.declared_types(&key.0, &key.1).await?;
                    types.insert(key.clone(), declared);
                }
                let oid = types
                    .get(&key)
                    .and_then(|t| t.get(positions.value(i).max(0) as usize))
                    .map(|(oid, _)| *oid)
                    .unwrap_or(25);
                names.push(
                    Type::from_oid(oid as u32)
                        .map(|t| t.name().to_string())
                        .unwrap_or_else(|| "text".to_string()),
                );
            }
            let n = b.num_rows();
            let mut columns = b.columns().to_vec();
            columns[position_at] = Arc::new(from_one);
            columns.push(repeated(CATALOG, n));
            columns.push(repeated("pg_catalog", n));
            columns.push(Arc::new(StringArray::from(names)));
            columns.push(repeated("NO", n));
            columns.push(Arc::new(StringArray::from(vec![None::<&str>; n])));
            columns.push(repeated("NEVER", n));
            out.push(RecordBatch::try_new(schema.clone(), columns)?);
        }
        Ok(Some(Arc::new(MemTable::try_new(schema, vec![out])?)))
    }
}

/// The columns `table_constraints` and `key_column_usage` start with.
const CONSTRAINT_COLUMNS: &[&str] = &[
    "constraint_catalog",
    "constraint_schema",
    "constraint_name",
    "table_catalog",
    "table_schema",
    "table_name",
];

/// `v`, `n` times.
fn repeated(v: &str, n: usize) -> ArrayRef {
    Arc::new(StringArray::from(vec![Some(v); n]))
}

/// A nullable text column, as information_schema's are.
fn text_field(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true)
}

#[async_trait]
impl SchemaProvider for InfoSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        let mut names = self.inner.table_names();
        names.push("table_constraints".into());
        names.push("key_column_usage".into());
        names
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let table = match name.to_ascii_lowercase().as_str() {
            "table_constraints" => Some(self.table_constraints().await?),
            "key_column_usage" => Some(self.key_column_usage().await?),
            "columns" => self.columns().await?,
            _ => self.inner.table(name).await?,
        };
        Ok(table.map(|t| super::catalog_types::Typed::wrap("information_schema", name, t)))
    }

    fn table_exist(&self, name: &str) -> bool {
        matches!(
            name.to_ascii_lowercase().as_str(),
            "table_constraints" | "key_column_usage"
        ) || self.inner.table_exist(name)
    }
}
