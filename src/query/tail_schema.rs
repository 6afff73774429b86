//! Queries, the live schema: when the WAL tail carries a schema change the next commit has
//! not made yet (an added column, a widened type, an incompatible type change), the live
//! table shows it already, as the commit will: the added column or the sibling column
//! `<column>__<type>` appears with the first change that carries it, a widened column reads
//! with its wider type. Every type (built-in, enum, domain, extension) is named by the
//! relation description in the WAL itself: the source is never asked.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::wal_read::WalRead;
use crate::change::types::{PgType, TypeInfo};
use crate::change::{RelColumn, Relation};
use crate::config::TableRef;
use crate::table::SourceColumn;
use crate::wal::{Op, Record};

/// What a query needs to know about a table to read its tail.
#[derive(Clone)]
pub struct TableShape {
    pub source: TableRef,
    /// The live schema (the Iceberg table's, as DataFusion reads it).
    pub schema: SchemaRef,
    /// Primary key columns (indices into `schema`); empty for tables keyed by the whole row.
    pub key: Vec<usize>,
    /// Columns making up the whole-row key of a table without a primary key.
    pub row_key: Vec<usize>,
    /// Source columns as the Iceberg table records them (name -> field, declared type).
    pub columns: Option<Vec<SourceColumn>>,
    /// Source columns of the tail's newest relation that the committed table does not
    /// record yet (see `tail_schema`), and the live field each one fills.
    pub tail_columns: Vec<SourceColumn>,
}

impl TableShape {
    pub(super) fn keyed(&self) -> bool {
        !self.key.is_empty()
    }

    pub(crate) fn key_columns(&self) -> &[usize] {
        if self.keyed() {
            &self.key
        } else {
            &self.row_key
        }
    }

    pub(super) fn pg_types(&self) -> Vec<PgType> {
        self.schema
            .fields()
            .iter()
            .map(|f| PgType::from_arrow(f.data_type()))
            .collect()
    }
}

/// The Arrow type a column's values are stored as, and its type's name (`pg_type.typname`),
/// as the relation description in the WAL says; `None` when Iceberg has no such type.
fn column_type(c: &RelColumn) -> Option<(DataType, String)> {
    Some((arrow_type(&c.storage)?, c.type_name.clone()))
}

fn arrow_type(info: &TypeInfo) -> Option<DataType> {
    let pg = PgType::from_info(info).pg;
    // Field ids only matter for reading Parquet files, which never hold these columns.
    let mut id = i32::MAX / 2;
    let ty = pg.iceberg_type(&mut id);
    iceberg::arrow::type_to_arrow_type(&ty).ok()
}

/// Whether values of type `from` read correctly as `to` (an Iceberg type promotion).
fn promotable(from: &DataType, to: &DataType) -> bool {
    match (from, to) {
        (DataType::Int32, DataType::Int64) | (DataType::Float32, DataType::Float64) => true,
        (DataType::Decimal128(p1, s1), DataType::Decimal128(p2, s2)) => s1 == s2 && p2 >= p1,
        _ => false,
    }
}

/// The relation messages of the shape's table in the WAL read, oldest first.
fn relations<'a>(shape: &TableShape, read: &'a WalRead) -> Vec<&'a Relation> {
    let mut out = Vec::new();
    let mine = |r: &Relation| r.namespace == shape.source.schema && r.name == shape.source.name;
    for (_, records) in &read.segments {
        for rec in records.iter() {
            match rec {
                Record::Relation(r) if mine(r) => out.push(r),
                Record::Relation(_) => {}
                Record::Txn(t) => out.extend(
                    t.changes
                        .iter()
                        .filter(|c| c.op == Op::Relation)
                        .filter_map(|c| c.relation.as_ref())
                        .filter(|r| mine(r)),
                ),
            }
        }
    }
    out
}

/// Extends `shape` with the schema changes of the tail's relation messages that the
/// committed table does not have yet, in the order they came (as the sink applies them):
/// `shape.schema` gains the added and sibling columns (and widened types), and
/// `shape.tail_columns` says which field each new source column fills. A relation the
/// commit already covers finds every column in place and changes nothing.
pub fn extend(shape: &mut TableShape, read: &WalRead) {
    let Some(recorded) = shape.columns.clone() else {
        return;
    };
    let relations = relations(shape, read);
    if relations.is_empty() {
        return;
    }
    let key_names: Vec<String> = shape
        .key_columns()
        .iter()
        .map(|i| shape.schema.field(*i).name().clone())
        .collect();
    let mut fields: Vec<Field> = shape
        .schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut working = recorded;
    let mut mapped: Vec<SourceColumn> = Vec::new();
    for relation in relations {
        let mut next: Vec<SourceColumn> = Vec::with_capacity(relation.columns.len());
        for c in &relation.columns {
            let before = working.iter().find(|r| r.name == c.name);
            let mut entry = SourceColumn {
                name: c.name.clone(),
                oid: c.type_oid,
                typmod: c.typmod,
                field: before.and_then(|b| b.field.clone()),
                attnum: c.attnum,
            };
            if before.is_some_and(|r| r.oid == c.type_oid && r.typmod == c.typmod) {
                next.push(entry);
                continue;
            }
            let Some((dt, typname)) = column_type(c) else {
                next.push(entry);
                continue;
            };
            let position =
                |fields: &[Field], name: &str| fields.iter().position(|f| f.name() == name);
            // A field that holds this type as it is (the column's own, or its current
            // target) takes the values; then a widening of the target; then a sibling.
            let fits = |f: &Field| f.data_type() == &dt || promotable(&dt, f.data_type());
            let own = position(&fields, &c.name);
            let target = match (before, own) {
                (_, Some(i)) if fits(&fields[i]) => c.name.clone(),
                (Some(r), _) => match position(&fields, r.target()) {
                    None => String::new(),
                    Some(t) if fits(&fields[t]) => r.target().to_string(),
                    Some(t) if promotable(fields[t].data_type(), &dt) => {
                        fields[t] = fields[t].clone().with_data_type(dt.clone());
                        r.target().to_string()
                    }
                    // A key column: the commit stops with an error naming the fix.
                    Some(_) if key_names.contains(&c.name) => String::new(),
                    Some(_) => sibling(&mut fields, &c.name, &typname, &dt),
                },
                (None, Some(_)) => sibling(&mut fields, &c.name, &typname, &dt),
                (None, None) => {
                    fields.push(Field::new(&c.name, dt.clone(), true));
                    c.name.clone()
                }
            };
            if !target.is_empty() {
                entry.field = (target != c.name).then_some(target);
                mapped.push(entry.clone());
            }
            next.push(entry);
        }
        working = next;
    }
    if mapped.is_empty() {
        return;
    }
    shape.schema = Arc::new(Schema::new_with_metadata(
        fields,
        shape.schema.metadata().clone(),
    ));
    shape.tail_columns = mapped;
}

/// The sibling column `<column>__<typname>` for a new type: an existing one of that type,
/// or a new field. Empty when a field of that name holds another type.
fn sibling(fields: &mut Vec<Field>, column: &str, typname: &str, dt: &DataType) -> String {
    let name = format!("{column}__{typname}");
    match fields.iter().find(|f| f.name() == &name) {
        Some(f) if f.data_type() == dt => name,
        Some(_) => String::new(),
        None => {
            fields.push(Field::new(&name, dt.clone(), true));
            name
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(oid: u32, typmod: i32, typtype: char, name: &str) -> RelColumn {
        let mut c = RelColumn::plain(false, "c", oid, typmod, name);
        c.storage.typtype = typtype;
        c
    }

    #[test]
    fn types_come_from_the_description_like_the_sink_maps_them() {
        assert_eq!(
            column_type(&typed(23, -1, 'b', "int4")),
            Some((DataType::Int32, "int4".into()))
        );
        // numeric(12,2): typmod = (12 << 16 | 2) + 4
        assert_eq!(
            column_type(&typed(1700, (12 << 16 | 2) + 4, 'b', "numeric")),
            Some((DataType::Decimal128(12, 2), "numeric".into()))
        );
        // An enum (any oid) is text, named by its own type name.
        assert_eq!(
            column_type(&typed(16_385, -1, 'e', "mood")),
            Some((DataType::Utf8, "mood".into()))
        );
        // A domain over int8 is stored as its base type.
        let mut domain = typed(16_390, -1, 'b', "positive_big");
        domain.storage.oid = 20;
        assert_eq!(
            column_type(&domain),
            Some((DataType::Int64, "positive_big".into()))
        );
        let mut list = typed(1009, -1, 'b', "_text");
        list.storage.element = Some(Box::new(TypeInfo {
            oid: 25,
            typmod: -1,
            typtype: 'b',
            element: None,
        }));
        let (dt, name) = column_type(&list).unwrap_or((DataType::Null, String::new()));
        assert_eq!(name, "_text");
        assert!(matches!(dt, DataType::List(f) if f.data_type() == &DataType::Utf8));
        assert!(promotable(&DataType::Int32, &DataType::Int64));
        assert!(!promotable(&DataType::Int64, &DataType::Int32));
        assert!(promotable(
            &DataType::Decimal128(10, 2),
            &DataType::Decimal128(12, 2)
        ));
    }
}
