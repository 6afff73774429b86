//! Re-snapshot of a table whose source columns changed: the copy is written under the
//! table's new shape (schema, partition spec, sort order) staged in memory, and the new shape
//! and the new rows become current in one Iceberg commit, so every reader sees the old table
//! until that commit and the new one after it, never an empty or half table.

use std::collections::HashMap;

use iceberg::spec::{Schema, SortOrder, TableMetadataBuilder, UnboundPartitionSpec};
use iceberg::table::Table;

use crate::catalog::LocalCatalog;
use crate::change::schema::TableSchema;
use crate::change::Lsn;
use crate::error::{Context, Error, Result};
use crate::table::layout::Layout;
use crate::table::schema::{iceberg_schema_from, table_properties};

/// The metadata changes that give a table its new shape.
#[derive(Clone)]
pub struct Reshape {
    /// The table as the catalog holds it: the commit is a compare-and-swap from it.
    base: Table,
    schema: Schema,
    spec: UnboundPartitionSpec,
    order: SortOrder,
    properties: HashMap<String, String>,
}

impl Reshape {
    /// Stages `ts`'s shape (with `layout`) over `base`: returns the table as the copy must
    /// write it (new field ids, spec and order; nothing committed) and the change to commit
    /// with the copy's files.
    pub fn stage(base: &Table, ts: &TableSchema, layout: &Layout) -> Result<(Table, Reshape)> {
        let meta = base.metadata();
        let name = base.identifier().to_string();
        // Fresh field ids: the old files' columns never map onto the new ones.
        let schema = iceberg_schema_from(ts, meta.last_column_id() + 1)?;
        layout.check(&schema, &name).map_err(|problems| {
            Error::config(format!(
                "the layout skippr.yml gives {} does not fit its new columns: {}",
                ts.table,
                problems.join("; ")
            ))
        })?;
        let spec = layout
            .partition_spec(&schema)
            .with_context(|| format!("building the partition spec of {name}"))?;
        let order = layout
            .sort_order(&schema)
            .with_context(|| format!("building the sort order of {name}"))?;
        let mut properties = table_properties(ts)?;
        // Every file of the replacing snapshot follows the new sort order.
        properties.insert(
            crate::table::PROP_SORT_ORDER_SINCE.to_string(),
            meta.next_sequence_number().to_string(),
        );
        let reshape = Reshape {
            base: base.clone(),
            schema,
            spec,
            order,
            properties,
        };
        let location = base
            .metadata_location()
            .ok_or_else(|| Error::fatal(format!("Iceberg table {name} has no metadata file")))?;
        let staged = reshape
            .clone()
            .apply(TableMetadataBuilder::new_from_metadata(
                meta.clone(),
                Some(location.to_string()),
            ))
            .and_then(|b| b.build())
            .with_context(|| format!("staging the new columns of Iceberg table {name}"))?
            .metadata;
        let staged = Table::builder()
            .runtime(iceberg::Runtime::try_current().context("finding the async runtime")?)
            .file_io(base.file_io().clone())
            .metadata_location(location)
            .metadata(staged)
            .identifier(base.identifier().clone())
            .build()
            .with_context(|| format!("describing Iceberg table {name}"))?;
        Ok((staged, reshape))
    }

    /// Makes `files` (written against the staged table) the table's only rows, with its new
    /// shape, in one commit recording `lsn`. The commit is a compare-and-swap from the table
    /// the shape was staged on, so a table changed meanwhile fails it instead of mixing.
    pub async fn commit(
        &self,
        catalog: &LocalCatalog,
        staged: &Table,
        files: Vec<iceberg::spec::DataFile>,
        lsn: Lsn,
        phase: &str,
        pipeline: &str,
    ) -> Result<Table> {
        let change = self.clone();
        let table = super::rowdelta::replace_reshaped(
            catalog,
            &self.base,
            staged,
            files,
            crate::table::summary::summary(lsn, phase, pipeline),
            move |b| change.apply(b),
        )
        .await
        .with_context(|| format!("committing the new copy of {}", self.base.identifier()))?;
        tracing::info!(
            table = %table.identifier(),
            schema_id = table.metadata().current_schema_id(),
            "table copied again under its new columns"
        );
        Ok(table)
    }

    fn apply(self, b: TableMetadataBuilder) -> iceberg::Result<TableMetadataBuilder> {
        b.add_current_schema(self.schema)?
            .add_partition_spec(self.spec)?
            .set_default_partition_spec(-1)?
            .add_sort_order(self.order)?
            .set_default_sort_order(-1)?
            .set_properties(self.properties)
    }
}
