//! Schema changes that arrive with the change stream: added columns, widened types (Iceberg
//! type promotions, no rewrite), incompatible type changes (a sibling column
//! `<column>__<type>` takes the values from then on), dropped columns (kept, NULL from
//! then on) and renames (same field id), decided against the source columns recorded on
//! the table. Everything it needs about the new columns (types, numbers, defaults) comes
//! with the relation description in the WAL: the source is never asked.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;

use super::SourceColumn;
use crate::catalog::LocalCatalog;
use crate::change::types::PgType;
use crate::change::Relation;
use crate::config::TableRef;
use crate::error::{Context, Error, Result};

/// The source columns a table was last known to have.
pub fn recorded_columns(table: &iceberg::table::Table) -> Option<Vec<SourceColumn>> {
    crate::table::source_columns(table.metadata().properties())
}

/// The columns a relation message describes.
pub fn relation_columns(r: &Relation) -> Vec<SourceColumn> {
    r.columns
        .iter()
        .map(|c| SourceColumn::new(&c.name, c.type_oid, c.typmod, c.attnum))
        .collect()
}

/// Whether `from` can be promoted to `to` without rewriting data.
fn promotable(from: &Type, to: &Type) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (Type::Primitive(a), Type::Primitive(b)) => {
            matches!((a, b), (P::Int, P::Long) | (P::Float, P::Double))
                || matches!((a, b), (P::Decimal { precision: p1, scale: s1 }, P::Decimal { precision: p2, scale: s2 }) if s1 == s2 && p2 >= p1)
        }
        _ => false,
    }
}

fn same_type(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::List(x), Type::List(y)) => {
            same_type(&x.element_field.field_type, &y.element_field.field_type)
        }
        _ => a == b,
    }
}

/// A planned schema change.
pub struct Evolution {
    pub schema: Schema,
    pub columns: Vec<SourceColumn>,
    /// Human-readable changes, for the log.
    pub changes: Vec<String>,
    /// Columns added while rows already existed (their old rows read NULL).
    pub added: Vec<String>,
    /// Of `added`, those whose old rows show a value in Postgres (a DEFAULT, or a value
    /// stored when the column was added), as the relation description says.
    pub added_with_default: Vec<String>,
}

/// Works out the new schema for `relation`, or `None` when nothing changed.
pub fn plan(
    source: &TableRef,
    table: &iceberg::table::Table,
    primary_key: &[String],
    relation: &Relation,
) -> Result<Option<Evolution>> {
    let new_cols = relation_columns(relation);
    let Some(prev) = recorded_columns(table) else {
        return Ok(None);
    };
    let same = prev.len() == new_cols.len()
        && prev
            .iter()
            .zip(&new_cols)
            .all(|(a, b)| a.name == b.name && a.oid == b.oid && a.typmod == b.typmod);
    if same {
        return Ok(None);
    }
    let meta = table.metadata();
    let schema = meta.current_schema();
    let mut fields: Vec<NestedField> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| (**f).clone())
        .collect();
    let mut next_id = meta.last_column_id() + 1;
    let identifier: Vec<i32> = schema.identifier_field_ids().collect();
    let mut changes = Vec::new();
    let mut added = Vec::new();
    let prev_by_name: HashMap<&str, &SourceColumn> =
        prev.iter().map(|c| (c.name.as_str(), c)).collect();
    let key_touched = |name: &str| primary_key.iter().any(|k| k == name);

    // A rename keeps the column's number (attnum): a new name whose number belonged to a
    // recorded column that is gone is that column renamed. Without recorded numbers (a table
    // recorded before numbers were), a change of name is a drop and an add. A number the
    // catalog could not establish for certain (it had moved on when the stream read the
    // relation) is refused when it matters: a rename and a drop-and-add differ in data.
    let mut renamed: HashMap<String, String> = HashMap::new();
    for f in new_cols
        .iter()
        .filter(|n| !prev_by_name.contains_key(n.name.as_str()))
    {
        let Some(num) = f.attnum else {
            let vanished = prev.iter().find(|p| {
                p.attnum.is_some()
                    && p.oid == f.oid
                    && p.typmod == f.typmod
                    && !new_cols.iter().any(|n| n.name == p.name)
            });
            if let Some(p) = vanished {
                return Err(Error::unrepresentable(format!(
                    "table {source}: column `{}` disappeared and column `{}` of the same type appeared, and the source's catalog had changed again before skipprd read these changes, so whether `{}` was renamed or dropped and another column added cannot be established; run `skipprd sync --resnapshot` to copy the table as it is now",
                    p.name, f.name, p.name
                )));
            }
            continue;
        };
        let Some(g) = prev.iter().find(|p| {
            p.attnum == Some(num) && p.name != f.name && !new_cols.iter().any(|n| n.name == p.name)
        }) else {
            continue;
        };
        if g.oid != f.oid || g.typmod != f.typmod || g.field.is_some() {
            continue;
        }
        if key_touched(&g.name) {
            return Err(Error::unrepresentable(format!(
                "primary key column `{}` of table {source} was renamed to `{}`; run `skipprd sync --resnapshot`",
                g.name, f.name
            )));
        }
        if let Some(field) = fields.iter_mut().find(|x| x.name == g.name) {
            field.name = f.name.clone();
            renamed.insert(f.name.clone(), g.name.clone());
            changes.push(format!("renamed column `{}` to `{}`", g.name, f.name));
        }
    }

    let mut columns = Vec::with_capacity(new_cols.len());
    let mut added_with_default = Vec::new();
    for (c, rc) in new_cols.iter().zip(&relation.columns) {
        let (storage, typname) = (&rc.storage, rc.type_name.as_str());
        let mut entry = c.clone();
        let before = prev_by_name.get(c.name.as_str()).copied().or_else(|| {
            renamed
                .get(&c.name)
                .and_then(|old| prev_by_name.get(old.as_str()).copied())
        });
        // The catalog is read now, and may already show later renames: keep the number
        // recorded before when it has none for this name.
        if entry.attnum.is_none() {
            entry.attnum = before.and_then(|b| b.attnum);
        }
        match before {
            Some(p) if p.oid == c.oid && p.typmod == c.typmod => {
                entry.field = p.field.clone();
            }
            Some(p) => {
                let new_pg = PgType::from_info(storage).pg;
                let mut probe = next_id;
                let new_ty = new_pg.iceberg_type(&mut probe);
                // A field that already holds this type (the column's own, or its current
                // target) takes the values as they are: this is also what makes replaying
                // older changes after a schema change harmless.
                let fits = |f: &NestedField| {
                    same_type(&f.field_type, &new_ty) || promotable(&new_ty, &f.field_type)
                };
                if fields.iter().any(|f| f.name == c.name && fits(f)) {
                    entry.field = None;
                    columns.push(entry);
                    continue;
                }
                let target = p.target().to_string();
                let Some(pos) = fields.iter().position(|f| f.name == target) else {
                    return Err(Error::fatal(format!(
                        "column `{target}` is missing from Iceberg table {}",
                        table.identifier()
                    )));
                };
                let old_ty = (*fields[pos].field_type).clone();
                if fits(&fields[pos]) {
                    entry.field = p.field.clone();
                } else if promotable(&old_ty, &new_ty) {
                    *fields[pos].field_type = new_ty.clone();
                    entry.field = p.field.clone();
                    changes.push(format!(
                        "widened column `{}` to {}",
                        c.name,
                        new_pg.iceberg_type_name()
                    ));
                } else {
                    if key_touched(&c.name) || primary_key.is_empty() {
                        return Err(Error::unrepresentable(format!(
                            "the type of column `{}` of table {source} changed incompatibly, and it is part of the key that identifies rows (the primary key, or the whole row without one); run `skipprd sync --resnapshot`",
                            c.name
                        )));
                    }
                    let sibling = format!("{}__{}", c.name, typname);
                    match fields.iter().find(|f| f.name == sibling) {
                        Some(f) if same_type(&f.field_type, &new_ty) => {}
                        Some(_) => {
                            return Err(Error::unrepresentable(format!(
                                "column `{}` of table {source} changed type again and its sibling column `{sibling}` has another type; run `skipprd sync --resnapshot`",
                                c.name
                            )))
                        }
                        None => {
                            let id = next_id;
                            let mut n = next_id;
                            let ty = new_pg.iceberg_type(&mut n);
                            next_id = n + 1;
                            fields.push(NestedField::optional(id, &sibling, ty));
                            changes.push(format!(
                                "column `{}` changed type incompatibly: its values go to the new column `{sibling}` from now on",
                                c.name
                            ));
                        }
                    }
                    // The original keeps its history and is NULL from now on.
                    if !identifier.contains(&fields[pos].id) {
                        fields[pos].required = false;
                    }
                    entry.field = Some(sibling);
                }
            }
            None => {
                let pg = PgType::from_info(storage).pg;
                let mut probe = next_id;
                let ty = pg.iceberg_type(&mut probe);
                match fields.iter().find(|f| f.name == c.name) {
                    // Dropped earlier and added back with the same type: reuse the field.
                    Some(f) if same_type(&f.field_type, &ty) => {}
                    Some(_) => {
                        let sibling = format!("{}__{}", c.name, typname);
                        if !fields.iter().any(|f| f.name == sibling) {
                            let id = next_id;
                            let mut n = next_id;
                            let ty = pg.iceberg_type(&mut n);
                            next_id = n + 1;
                            fields.push(NestedField::optional(id, &sibling, ty));
                        }
                        entry.field = Some(sibling);
                    }
                    None => {
                        let id = next_id;
                        let mut n = next_id;
                        let ty = pg.iceberg_type(&mut n);
                        next_id = n + 1;
                        fields.push(NestedField::optional(id, &c.name, ty));
                        changes.push(format!("added column `{}`", c.name));
                        added.push(c.name.clone());
                        if rc.has_default == Some(true) {
                            added_with_default.push(c.name.clone());
                        }
                    }
                }
            }
        }
        columns.push(entry);
    }
    // Dropped columns keep their history and read NULL from now on.
    for p in &prev {
        let still =
            columns.iter().any(|c| c.name == p.name) || renamed.values().any(|old| old == &p.name);
        if !still {
            if key_touched(&p.name) {
                return Err(Error::unrepresentable(format!(
                    "primary key column `{}` of table {source} was dropped; run `skipprd sync --resnapshot`",
                    p.name
                )));
            }
            if let Some(f) = fields.iter_mut().find(|f| f.name == p.target()) {
                if !identifier.contains(&f.id) {
                    f.required = false;
                }
            }
            changes.push(format!(
                "dropped column `{}` (kept in Iceberg, NULL from now on)",
                p.name
            ));
        }
    }
    let schema = next_schema(table, fields, identifier)?;
    Ok(Some(Evolution {
        schema,
        columns,
        changes,
        added,
        added_with_default,
    }))
}

/// The schema with every field made optional whose source column no longer has NOT NULL,
/// or `None` when there is none. Relation messages carry no nullability, so the stream reads
/// it from the catalog when one arrives and records it with the relation in the WAL; making
/// a field optional is always safe (an optional field holds everything a required one does),
/// so a catalog read newer than the message is harmless.
pub fn relax_not_null(
    r: &Relation,
    table: &iceberg::table::Table,
) -> Result<Option<(Schema, Vec<String>)>> {
    let recorded = recorded_columns(table).unwrap_or_default();
    // The Iceberg field each nullable source column writes to.
    let targets: Vec<&str> = r
        .columns
        .iter()
        .filter(|c| c.not_null == Some(false))
        .map(|c| {
            recorded
                .iter()
                .find(|x| x.name == c.name)
                .map(|x| x.target())
                .unwrap_or(c.name.as_str())
        })
        .collect();
    make_optional(table, &targets)
}

/// The schema with the required fields named in `fields` made optional (identifier fields
/// stay required), and the names of those changed; `None` when none changes.
pub fn make_optional(
    table: &iceberg::table::Table,
    names: &[&str],
) -> Result<Option<(Schema, Vec<String>)>> {
    let meta = table.metadata();
    let schema = meta.current_schema();
    let identifier: Vec<i32> = schema.identifier_field_ids().collect();
    let mut relaxed = Vec::new();
    let fields: Vec<NestedField> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            let mut f = (**f).clone();
            if f.required && !identifier.contains(&f.id) && names.contains(&f.name.as_str()) {
                f.required = false;
                relaxed.push(f.name.clone());
            }
            f
        })
        .collect();
    if relaxed.is_empty() {
        return Ok(None);
    }
    let schema = next_schema(table, fields, identifier)?;
    Ok(Some((schema, relaxed)))
}

/// The table's next schema: `fields` with the given identifier fields, one id past the current.
fn next_schema(
    table: &iceberg::table::Table,
    fields: Vec<NestedField>,
    identifier: Vec<i32>,
) -> Result<Schema> {
    Schema::builder()
        .with_schema_id(table.metadata().current_schema_id() + 1)
        .with_fields(fields.into_iter().map(Arc::new))
        .with_identifier_field_ids(identifier)
        .build()
        .with_context(|| format!("building the new schema of {}", table.identifier()))
}

/// Makes `layout` the table's current partition spec and sort order when they differ (a
/// change of `partition_by` or `sort_by` in `skippr.yml`): the new spec and order are added
/// and made the defaults in one metadata commit. Files keep the spec they were written under
/// (nothing is rewritten); new files use the new one, and compaction moves old files over.
pub async fn apply_layout(
    catalog: &LocalCatalog,
    table: &Table,
    layout: &crate::table::layout::Layout,
) -> Result<Table> {
    let meta = table.metadata();
    let schema = meta.current_schema();
    let name = table.identifier().to_string();
    layout.check(schema, &name).map_err(|problems| {
        Error::config(format!(
            "the layout skippr.yml gives Iceberg table {name} does not fit it: {}",
            problems.join("; ")
        ))
    })?;
    let spec = layout
        .partition_spec(schema)
        .with_context(|| format!("building the partition spec of {name}"))?;
    let order = layout
        .sort_order(schema)
        .with_context(|| format!("building the sort order of {name}"))?;
    let current = meta.default_partition_spec();
    let same_spec = current.fields().len() == spec.fields().len()
        && current
            .fields()
            .iter()
            .zip(spec.fields())
            .all(|(a, b)| a.source_id == b.source_id && a.transform == b.transform);
    let same_order = meta.default_sort_order().fields == order.fields;
    if same_spec && same_order {
        return Ok(table.clone());
    }
    // Files from the next commit on follow the new order; compaction sorts older ones.
    let since = meta.next_sequence_number().to_string();
    let table = super::rowdelta::commit_metadata(catalog, table, &[], |mut b| {
        if !same_spec {
            b = b.add_partition_spec(spec)?.set_default_partition_spec(-1)?;
        }
        if !same_order {
            b = b
                .add_sort_order(order)?
                .set_default_sort_order(-1)?
                .set_properties(HashMap::from([(
                    crate::table::PROP_SORT_ORDER_SINCE.to_string(),
                    since,
                )]))?;
        }
        Ok(b)
    })
    .await
    .with_context(|| format!("changing the layout of Iceberg table {name}"))?;
    tracing::info!(
        table = %table.identifier(),
        spec_id = table.metadata().default_partition_spec_id(),
        sort_order_id = table.metadata().default_sort_order_id(),
        layout = %layout,
        "table layout changed"
    );
    Ok(table)
}
