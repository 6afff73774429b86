//! Gateway, `information_schema`: the query engine's own views (tables, columns, ...) plus
//! `table_constraints` and `key_column_usage`, built from each table's recorded primary key,
//! which BI tools read to learn the keys.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use async_trait::async_trait;
use datafusion::catalog::information_schema::InformationSchemaProvider;
use datafusion::catalog::{CatalogProviderList, SchemaProvider};
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};

use crate::query::{Workspace, CATALOG};
use crate::sink::iceberg::PROP_PRIMARY_KEY;

pub struct InfoSchema {
    inner: InformationSchemaProvider,
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
            inner: InformationSchemaProvider::new(catalogs),
            ws,
        }
    }

    /// (table, key columns in order) for every table with a primary key.
    async fn keys(&self) -> crate::error::Result<Vec<(String, Vec<String>)>> {
        let mut out = Vec::new();
        for name in self.ws.table_names() {
            if let Some((_, props)) = self.ws.table_meta(&name).await? {
                let cols: Vec<String> = props
                    .get(PROP_PRIMARY_KEY)
                    .map(|k| {
                        k.split(',')
                            .filter(|c| !c.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                if !cols.is_empty() {
                    out.push((name, cols));
                }
            }
        }
        Ok(out)
    }

    async fn table_constraints(&self) -> DfResult<Arc<dyn TableProvider>> {
        let keys = self
            .keys()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let text = text_field;
        let schema = Arc::new(Schema::new(vec![
            text("constraint_catalog"),
            text("constraint_schema"),
            text("constraint_name"),
            text("table_catalog"),
            text("table_schema"),
            text("table_name"),
            text("constraint_type"),
            text("is_deferrable"),
            text("initially_deferred"),
            text("enforced"),
            text("nulls_distinct"),
        ]));
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
        let keys = self
            .keys()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let text = text_field;
        let schema = Arc::new(Schema::new(vec![
            text("constraint_catalog"),
            text("constraint_schema"),
            text("constraint_name"),
            text("table_catalog"),
            text("table_schema"),
            text("table_name"),
            text("column_name"),
            Field::new("ordinal_position", DataType::Int32, false),
            Field::new("position_in_unique_constraint", DataType::Int32, true),
        ]));
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
        match name.to_ascii_lowercase().as_str() {
            "table_constraints" => Ok(Some(self.table_constraints().await?)),
            "key_column_usage" => Ok(Some(self.key_column_usage().await?)),
            _ => self.inner.table(name).await,
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        matches!(
            name.to_ascii_lowercase().as_str(),
            "table_constraints" | "key_column_usage"
        ) || self.inner.table_exist(name)
    }
}
