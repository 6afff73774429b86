//! The table layer, layout: how a table's rows are laid out in files — its partition spec
//! and sort order — from what `skippr.yml` asks (`pipelines.<name>.tables.<table>.partition_by`
//! and `sort_by`), written as the Iceberg spec and Spark's DDL name the transforms.
//!
//! What `skippr.yml` asks is read by the configuration (`crate::config::layout`); here a
//! layout is bound to a table: checked against its schema (the columns exist, each transform
//! fits its column's type), made Iceberg's partition spec and sort order, and read back
//! from a table's metadata.

use iceberg::spec::{
    NullOrder, Schema, SortDirection, SortField, SortOrder, Transform, Type, UnboundPartitionSpec,
};

pub use crate::config::layout::{column, Layout, PartitionEntry, SortEntry, TRANSFORMS};

impl Layout {
    /// The layout a table has now: its current spec and sort order, over its columns.
    pub fn of_table(meta: &iceberg::spec::TableMetadata) -> Self {
        let schema = meta.current_schema();
        let name = |id: i32| schema.name_by_field_id(id).map(str::to_string);
        let partition_by = meta
            .default_partition_spec()
            .fields()
            .iter()
            .filter_map(|f| {
                Some(PartitionEntry {
                    column: name(f.source_id)?,
                    transform: f.transform,
                })
            })
            .collect();
        let sort_by = meta
            .default_sort_order()
            .fields
            .iter()
            .filter_map(|f| {
                Some(SortEntry {
                    column: name(f.source_id)?,
                    descending: f.direction == SortDirection::Descending,
                    nulls_first: f.null_order == NullOrder::First,
                })
            })
            .collect();
        Self {
            partition_by,
            sort_by,
        }
    }

    /// Checks the layout against a table's schema: every column exists, every transform fits
    /// its column's type. Each problem is named with its fix.
    pub fn check(&self, schema: &Schema, table: &str) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let names = || {
            schema
                .as_struct()
                .fields()
                .iter()
                .map(|f| f.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for p in &self.partition_by {
            match schema.field_by_name(&p.column) {
                None => problems.push(format!(
                    "`partition_by` names `{}`, which is not a column of {table} (its columns: {})",
                    p.column,
                    names()
                )),
                Some(f) => {
                    let fits = matches!(*f.field_type, Type::Primitive(_))
                        && p.transform.result_type(&f.field_type).is_ok();
                    if !fits {
                        problems.push(format!(
                            "`{p}` does not fit {table}.{} ({}): {}",
                            p.column,
                            f.field_type,
                            takes(&p.transform)
                        ));
                    }
                }
            }
        }
        for s in &self.sort_by {
            match schema.field_by_name(&s.column) {
                None => problems.push(format!(
                    "`sort_by` names `{}`, which is not a column of {table} (its columns: {})",
                    s.column,
                    names()
                )),
                Some(f) if !matches!(*f.field_type, Type::Primitive(_)) => problems.push(format!(
                    "`sort_by` names {table}.{}, whose type ({}) has no order",
                    s.column, f.field_type
                )),
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Iceberg's partition spec for this layout over `schema` (checked first, see
    /// [`Layout::check`]).
    pub fn partition_spec(&self, schema: &Schema) -> iceberg::Result<UnboundPartitionSpec> {
        let mut b = UnboundPartitionSpec::builder();
        for p in &self.partition_by {
            let id = schema.field_id_by_name(&p.column).ok_or_else(|| {
                iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!("no column {} to partition by", p.column),
                )
            })?;
            b = b.add_partition_field(id, p.field_name(), p.transform)?;
        }
        Ok(b.build())
    }

    /// Iceberg's sort order for this layout over `schema` (order id 1; unsorted: 0).
    pub fn sort_order(&self, schema: &Schema) -> iceberg::Result<SortOrder> {
        if self.sort_by.is_empty() {
            return Ok(SortOrder::unsorted_order());
        }
        let mut b = SortOrder::builder();
        b.with_order_id(1);
        for s in &self.sort_by {
            let id = schema.field_id_by_name(&s.column).ok_or_else(|| {
                iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!("no column {} to sort by", s.column),
                )
            })?;
            b.with_sort_field(SortField {
                source_id: id,
                transform: Transform::Identity,
                direction: if s.descending {
                    SortDirection::Descending
                } else {
                    SortDirection::Ascending
                },
                null_order: if s.nulls_first {
                    NullOrder::First
                } else {
                    NullOrder::Last
                },
            });
        }
        b.build(schema)
    }
}

/// What a transform takes, for messages.
fn takes(t: &Transform) -> &'static str {
    match t {
        Transform::Year | Transform::Month | Transform::Day => {
            "it takes a date or timestamp column"
        }
        Transform::Hour => "it takes a timestamp column",
        Transform::Bucket(_) => {
            "it takes an integer, numeric, date, time, timestamp, text, uuid or bytea column"
        }
        Transform::Truncate(_) => "it takes an integer, numeric, text or bytea column",
        _ => "it takes a column of a simple type",
    }
}

#[cfg(test)]
mod tests;
