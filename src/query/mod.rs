//! Queries: a DataFusion session over the workspace's Iceberg tables, used by
//! `skipprd query` (and, later, the Postgres-wire gateway).

pub mod format;

use std::sync::Arc;

use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::prelude::{SessionConfig, SessionContext};
use iceberg::{Catalog, NamespaceIdent};
use iceberg_datafusion::IcebergStaticTableProvider;

use crate::config::{Config, SinkConfig};
use crate::error::{Context, Error, Result};
use crate::pipeline::open_sink;

/// Builds a session where every table of every pipeline's sink is visible as
/// `<workspace>.<table>`, and the workspace is the default schema.
pub async fn session(config: &Config) -> Result<SessionContext> {
    let session_config = SessionConfig::new()
        .with_information_schema(true)
        .with_default_catalog_and_schema("skippr", &config.workspace);
    let ctx = SessionContext::new_with_config(session_config);
    let schema = Arc::new(MemorySchemaProvider::new());
    let mut seen_warehouses = Vec::new();
    for p in &config.pipelines {
        if let SinkConfig::LocalIceberg { warehouse, .. } = &p.sink {
            if seen_warehouses.contains(warehouse) {
                continue;
            }
            seen_warehouses.push(warehouse.clone());
        }
        let catalog = open_sink(p).await?;
        let ns = NamespaceIdent::new(config.workspace.clone());
        if !catalog
            .catalog
            .namespace_exists(&ns)
            .await
            .context("reading the catalog")?
        {
            continue;
        }
        for ident in catalog
            .catalog
            .list_tables(&ns)
            .await
            .context("listing the workspace's tables")?
        {
            let table = catalog
                .catalog
                .load_table(&ident)
                .await
                .with_context(|| format!("loading Iceberg table {ident}"))?;
            let provider = IcebergStaticTableProvider::try_new_from_table(table)
                .await
                .with_context(|| format!("reading Iceberg table {ident}"))?;
            schema
                .register_table(ident.name().to_string(), Arc::new(provider))
                .map_err(Error::from)?;
        }
    }
    let catalog = ctx
        .catalog("skippr")
        .ok_or_else(|| Error::fatal("the query session has no default catalog"))?;
    catalog
        .register_schema(&config.workspace, schema)
        .map_err(Error::from)?;
    Ok(ctx)
}

/// Runs one SQL statement and collects its result.
pub async fn run(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(arrow::datatypes::SchemaRef, Vec<arrow::array::RecordBatch>)> {
    let df = ctx.sql(sql).await.map_err(query_error)?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await.map_err(query_error)?;
    Ok((schema, batches))
}

fn query_error(e: datafusion::error::DataFusionError) -> Error {
    Error::query(e.to_string())
}
