//! The table layer, changelog tables: the Iceberg table beside a replicated table that holds
//! every change as a row (`pipelines.<p>.tables.<t>.changelog`). Its columns are the table's
//! own (all optional: a delete row carries the old key only), then the change's operation,
//! source commit LSN and time, and order inside its transaction. Every snapshot is an append.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::SchemaRef;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use super::schema::{create, load_existing};
use super::{PG_EPOCH_MICROS, PROP_COLUMNS, PROP_PRIMARY_KEY};
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::change::TableRef;
use crate::error::{Context, Error, Result};

/// Column: the operation, `insert`, `update` or `delete`.
pub const OP: &str = "_skippr_op";
/// Column: the source commit LSN of the change's transaction (as a number).
pub const LSN: &str = "_skippr_lsn";
/// Column: the source commit time of the change's transaction.
pub const COMMIT_TIME: &str = "_skippr_commit_time";
/// Column: the change's order inside its transaction (from 0).
pub const SEQ: &str = "_skippr_seq";
/// The four columns, in order, after the table's own.
pub const COLUMNS: [&str; 4] = [OP, LSN, COMMIT_TIME, SEQ];
/// Table property: the source table whose changes the table holds, `schema.name`.
pub const PROP_CHANGELOG_OF: &str = "skippr.changelog-of";
/// Table property: the primary key of the source table (the changelog has no key itself).
pub const PROP_SOURCE_KEY: &str = "skippr.changelog-key";

/// What a change row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOp {
    Insert,
    Update,
    Delete,
}

impl ChangeOp {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Insert => "insert",
            ChangeOp::Update => "update",
            ChangeOp::Delete => "delete",
        }
    }
}

/// The changelog schema of a table with schema `state`: its fields, all optional, then the
/// four change columns.
pub fn schema_of(state: &Schema) -> Result<Schema> {
    let mut fields: Vec<Arc<NestedField>> = state
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            let mut f = (**f).clone();
            f.required = false;
            Arc::new(f)
        })
        .collect();
    let first = state.highest_field_id() + 1;
    for (id, (name, ty)) in (first..).zip([
        (OP, PrimitiveType::String),
        (LSN, PrimitiveType::Long),
        (COMMIT_TIME, PrimitiveType::Timestamptz),
        (SEQ, PrimitiveType::Long),
    ]) {
        fields.push(Arc::new(NestedField::required(
            id,
            name,
            Type::Primitive(ty),
        )));
    }
    Schema::builder()
        .with_fields(fields)
        .build()
        .context("building a changelog table's schema")
}

/// Loads the changelog table `name` of `state` (the Iceberg table of `source`), creating it
/// when missing. A table of that name that is not `source`'s changelog is refused.
pub async fn create_or_load(
    catalog: &LocalCatalog,
    namespace: &NamespaceIdent,
    name: &str,
    source: &TableRef,
    state: &Table,
) -> Result<Table> {
    let ident = TableIdent::new(namespace.clone(), name.to_string());
    if let Some(table) = load_existing(catalog, &ident).await? {
        let of = table.metadata().properties().get(PROP_CHANGELOG_OF);
        if of.map(String::as_str) != Some(source.to_string().as_str()) {
            return Err(Error::config(format!(
                "Iceberg table {ident} exists and is not the changelog of {source}{}: name the changelog otherwise (`changelog: {{table: <name>}}` under pipelines.<p>.tables.{}) or drop that table",
                of.map(|o| format!(" (it is the changelog of {o})")).unwrap_or_default(),
                source.config_key()
            )));
        }
        return Ok(table);
    }
    let meta = state.metadata();
    let schema = schema_of(meta.current_schema())?;
    let mut props = HashMap::from([
        (PROP_CHANGELOG_OF.to_string(), source.to_string()),
        (
            "write.parquet.compression-codec".to_string(),
            "zstd".to_string(),
        ),
    ]);
    for (from, to) in [
        (PROP_COLUMNS, PROP_COLUMNS),
        (PROP_PRIMARY_KEY, PROP_SOURCE_KEY),
    ] {
        if let Some(v) = meta.properties().get(from) {
            props.insert(to.to_string(), v.clone());
        }
    }
    let creation = TableCreation::builder()
        .name(name.to_string())
        .schema(schema)
        .properties(props)
        .build();
    let table = create(catalog, namespace, &ident, creation).await?;
    tracing::info!(table = %ident, source = %source, "created changelog table");
    Ok(table)
}

/// The changelog rows of `values` (rows in the table's schema): each column of `target` by
/// name, then the change columns from `meta` (operation, commit LSN, commit time in the
/// Postgres epoch, order).
pub fn batch(
    values: &RecordBatch,
    target: &SchemaRef,
    meta: impl Iterator<Item = (ChangeOp, Lsn, i64, i64)>,
) -> Result<RecordBatch> {
    let (mut ops, mut lsns, mut times, mut seqs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (op, lsn, time, seq) in meta {
        ops.push(op.as_str());
        lsns.push(i64::try_from(lsn.0).unwrap_or(i64::MAX));
        times.push(time + PG_EPOCH_MICROS);
        seqs.push(seq);
    }
    if ops.len() != values.num_rows() {
        return Err(Error::fatal(format!(
            "{} change rows were described for {} rows of values",
            ops.len(),
            values.num_rows()
        )));
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for field in target.fields() {
        let col: ArrayRef = match field.name().as_str() {
            OP => Arc::new(StringArray::from(std::mem::take(&mut ops))),
            LSN => Arc::new(Int64Array::from(std::mem::take(&mut lsns))),
            COMMIT_TIME => Arc::new(
                TimestampMicrosecondArray::from(std::mem::take(&mut times)).with_timezone("+00:00"),
            ),
            SEQ => Arc::new(Int64Array::from(std::mem::take(&mut seqs))),
            name => match values.column_by_name(name) {
                Some(c) if c.data_type() == field.data_type() => c.clone(),
                Some(c) => arrow::compute::cast(c, field.data_type())?,
                None => arrow::array::new_null_array(field.data_type(), values.num_rows()),
            },
        };
        columns.push(col);
    }
    Ok(RecordBatch::try_new(target.clone(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_changelog_schema_is_the_tables_fields_made_optional_then_the_change_columns() {
        let state = Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    1,
                    "id",
                    Type::Primitive(PrimitiveType::Long),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "note",
                    Type::Primitive(PrimitiveType::String),
                )),
            ])
            .with_identifier_field_ids(vec![1])
            .build()
            .unwrap();
        let s = schema_of(&state).unwrap();
        let names: Vec<&str> = s
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["id", "note", OP, LSN, COMMIT_TIME, SEQ], "{s:?}");
        assert!(s.as_struct().fields()[..2].iter().all(|f| !f.required));
        assert!(s.as_struct().fields()[2..].iter().all(|f| f.required));
        assert_eq!(s.identifier_field_ids().count(), 0);
    }
}
