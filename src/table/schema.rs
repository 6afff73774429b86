//! The table layer, schemas: Iceberg schemas from source table schemas: field per column, the primary key as the
//! identifier fields, and the Arrow schema the writer must produce.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use super::layout::Layout;
use super::{SourceColumn, PROP_COLUMNS, PROP_PRIMARY_KEY, PROP_SOURCE};
use crate::catalog::LocalCatalog;
use crate::change::schema::TableSchema;
use crate::error::{Context, Error, Result};

/// Builds the Iceberg schema of a source table.
pub fn iceberg_schema(ts: &TableSchema) -> Result<Schema> {
    iceberg_schema_from(ts, 1)
}

/// Builds the Iceberg schema of a source table with field ids from `first_id` on (a table
/// given a new shape keeps its old ids unused, as the Iceberg spec asks).
pub fn iceberg_schema_from(ts: &TableSchema, first_id: i32) -> Result<Schema> {
    let n = ts.columns.len() as i32;
    // Top-level fields take ids first_id..first_id+n; nested (list element) ids follow.
    let mut next_nested = first_id - 1 + n;
    let mut fields = Vec::with_capacity(ts.columns.len());
    let mut identifier = Vec::new();
    for (i, c) in ts.columns.iter().enumerate() {
        let id = first_id + i as i32;
        let ty = c.pg.iceberg_type(&mut next_nested);
        let in_key = ts.primary_key.iter().any(|k| k == &c.name);
        let field = if c.not_null || in_key {
            NestedField::required(id, &c.name, ty.clone())
        } else {
            NestedField::optional(id, &c.name, ty.clone())
        };
        fields.push(Arc::new(field));
        if in_key && can_identify(&ty) {
            identifier.push(id);
        }
    }
    let mut builder = Schema::builder().with_fields(fields);
    if identifier.len() == ts.primary_key.len() && !identifier.is_empty() {
        builder = builder.with_identifier_field_ids(identifier);
    }
    builder
        .build()
        .with_context(|| format!("building the Iceberg schema of {}", ts.table))
}

/// Iceberg identifier fields must be primitive and not floating point.
fn can_identify(t: &Type) -> bool {
    matches!(t, Type::Primitive(p) if !matches!(p, PrimitiveType::Float | PrimitiveType::Double))
}

/// Loads the Iceberg table for `ts`, creating it from the source schema when missing, with
/// `layout`'s partition spec and sort order (an existing table's layout is changed by
/// `sink::iceberg::evolve::apply_layout`).
pub async fn create_or_load(
    catalog: &LocalCatalog,
    namespace: &NamespaceIdent,
    ts: &TableSchema,
    layout: &Layout,
) -> Result<Table> {
    let ident = TableIdent::new(namespace.clone(), ts.table.iceberg_name());
    if let Some(table) = load_existing(catalog, &ident).await? {
        return Ok(table);
    }
    let schema = iceberg_schema(ts)?;
    let props = table_properties(ts)?;
    layout
        .check(&schema, &ts.table.to_string())
        .map_err(|problems| {
            Error::config(format!(
                "the layout skippr.yml gives {} does not fit it: {}",
                ts.table,
                problems.join("; ")
            ))
        })?;
    let spec = layout
        .partition_spec(&schema)
        .with_context(|| format!("building the partition spec of {}", ts.table))?;
    let order = layout
        .sort_order(&schema)
        .with_context(|| format!("building the sort order of {}", ts.table))?;
    let creation = TableCreation::builder()
        .name(ts.table.iceberg_name())
        .schema(schema)
        .partition_spec(spec)
        .sort_order(order)
        .properties(props)
        .build();
    let table = create(catalog, namespace, &ident, creation).await?;
    tracing::info!(table = %ident, source = %ts.table, "created Iceberg table");
    Ok(table)
}

/// The Iceberg table `ident`, loaded; `None` when the catalog has no such table.
pub(super) async fn load_existing(
    catalog: &LocalCatalog,
    ident: &TableIdent,
) -> Result<Option<Table>> {
    let exists = catalog
        .catalog
        .table_exists(ident)
        .await
        .with_context(|| format!("looking up Iceberg table {ident}"))?;
    if !exists {
        return Ok(None);
    }
    catalog
        .catalog
        .load_table(ident)
        .await
        .with_context(|| format!("loading Iceberg table {ident}"))
        .map(Some)
}

/// Creates the Iceberg table `ident` in `namespace` as `creation` describes it.
pub(super) async fn create(
    catalog: &LocalCatalog,
    namespace: &NamespaceIdent,
    ident: &TableIdent,
    creation: TableCreation,
) -> Result<Table> {
    catalog
        .catalog
        .create_table(namespace, creation)
        .await
        .with_context(|| format!("creating Iceberg table {ident}"))
}

/// The table properties that record `ts`: source name, primary key and source columns
/// (what the stream's schema changes are compared with).
pub fn table_properties(ts: &TableSchema) -> Result<HashMap<String, String>> {
    Ok(HashMap::from([
        (PROP_SOURCE.to_string(), ts.table.to_string()),
        (PROP_PRIMARY_KEY.to_string(), ts.primary_key.join(",")),
        (
            PROP_COLUMNS.to_string(),
            serde_json::to_string(
                &ts.columns
                    .iter()
                    .map(|c| SourceColumn::new(&c.name, c.type_oid, c.typmod, Some(c.attnum)))
                    .collect::<Vec<_>>(),
            )?,
        ),
        (
            "write.parquet.compression-codec".to_string(),
            "zstd".to_string(),
        ),
    ]))
}

/// The Arrow schema matching the table's current Iceberg schema (with field ids).
pub fn arrow_schema(table: &Table) -> Result<SchemaRef> {
    Ok(Arc::new(iceberg::arrow::schema_to_arrow_schema(
        table.metadata().current_schema(),
    )?))
}
