//! Queries, the live schema: when the WAL tail carries a schema change the next commit has
//! not made yet (an added column, a widened type, an incompatible type change), the live
//! table shows it already, as the commit will: the added column or the sibling column
//! `<column>__<type>` appears with the first change that carries it, a widened column reads
//! with its wider type. Built-in types are known here; others (enums, domains, extension
//! types) are looked up once in the source's catalog.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};

use super::tail::{TableShape, WalRead};
use crate::change::Relation;
use crate::sink::iceberg::SourceColumn;
use crate::source::postgres::types::{PgType, TypeInfo};
use crate::wal::{Op, Record};

/// Built-in Postgres types the live schema can show before a commit, by oid: the name the
/// sink gives a sibling column (`pg_type.typname`) and, for arrays, the element's oid.
/// Other types (enums, domains, extension types) need the source's catalog: their columns
/// appear with the next commit.
const BUILTIN: &[(u32, &str, Option<u32>)] = &[
    (16, "bool", None),
    (17, "bytea", None),
    (18, "char", None),
    (19, "name", None),
    (20, "int8", None),
    (21, "int2", None),
    (23, "int4", None),
    (25, "text", None),
    (26, "oid", None),
    (114, "json", None),
    (700, "float4", None),
    (701, "float8", None),
    (1042, "bpchar", None),
    (1043, "varchar", None),
    (1082, "date", None),
    (1083, "time", None),
    (1114, "timestamp", None),
    (1184, "timestamptz", None),
    (1186, "interval", None),
    (1700, "numeric", None),
    (2950, "uuid", None),
    (3802, "jsonb", None),
    (1000, "_bool", Some(16)),
    (1001, "_bytea", Some(17)),
    (1005, "_int2", Some(21)),
    (1007, "_int4", Some(23)),
    (1016, "_int8", Some(20)),
    (1009, "_text", Some(25)),
    (1014, "_bpchar", Some(1042)),
    (1015, "_varchar", Some(1043)),
    (1021, "_float4", Some(700)),
    (1022, "_float8", Some(701)),
    (1231, "_numeric", Some(1700)),
    (1182, "_date", Some(1082)),
    (1183, "_time", Some(1083)),
    (1115, "_timestamp", Some(1114)),
    (1185, "_timestamptz", Some(1184)),
    (2951, "_uuid", Some(2950)),
    (199, "_json", Some(114)),
    (3807, "_jsonb", Some(3802)),
];

/// Types the source's catalog resolved (enums, domains, extension types): by (oid,
/// typmod), the type and its `pg_type.typname`.
pub type Resolved = HashMap<(u32, i32), (TypeInfo, String)>;

/// The Arrow type a column type is stored as, and its name: built-in types from the table
/// above, others from what the source's catalog said; `None` when neither knows it.
fn column_type(oid: u32, typmod: i32, resolved: &Resolved) -> Option<(DataType, String)> {
    if let Some((dt, name)) = builtin(oid, typmod) {
        return Some((dt, name.to_string()));
    }
    let (info, name) = resolved.get(&(oid, typmod))?;
    Some((arrow_type(info)?, name.clone()))
}

fn arrow_type(info: &TypeInfo) -> Option<DataType> {
    let pg = PgType::from_info(info).pg;
    // Field ids only matter for reading Parquet files, which never hold these columns.
    let mut id = i32::MAX / 2;
    let ty = pg.iceberg_type(&mut id);
    iceberg::arrow::type_to_arrow_type(&ty).ok()
}

/// The column types of the tail's relation messages that are not built in and not in
/// `resolved`: the source's catalog must name them before the live schema can show them.
pub fn unresolved(shape: &TableShape, read: &WalRead, resolved: &Resolved) -> Vec<(u32, i32)> {
    let Some(recorded) = &shape.columns else {
        return Vec::new();
    };
    let mut out: Vec<(u32, i32)> = Vec::new();
    for r in relations(shape, read) {
        for c in &r.columns {
            let known = recorded
                .iter()
                .any(|x| x.name == c.name && x.oid == c.type_oid && x.typmod == c.typmod);
            let key = (c.type_oid, c.typmod);
            if !known
                && builtin(c.type_oid, c.typmod).is_none()
                && !resolved.contains_key(&key)
                && !out.contains(&key)
            {
                out.push(key);
            }
        }
    }
    out
}

/// The Arrow type a built-in type is stored as, and its name; `None` for other types.
fn builtin(oid: u32, typmod: i32) -> Option<(DataType, &'static str)> {
    let (_, name, element) = BUILTIN.iter().find(|(o, _, _)| *o == oid)?;
    let info = TypeInfo {
        oid,
        typmod,
        typtype: 'b',
        element: element.map(|e| {
            Box::new(TypeInfo {
                oid: e,
                // An array column's typmod applies to its elements.
                typmod,
                typtype: 'b',
                element: None,
            })
        }),
    };
    Some((arrow_type(&info)?, name))
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
pub fn extend(shape: &mut TableShape, read: &WalRead, resolved: &Resolved) {
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
                attnum: None,
            };
            if before.is_some_and(|r| r.oid == c.type_oid && r.typmod == c.typmod) {
                next.push(entry);
                continue;
            }
            let Some((dt, typname)) = column_type(c.type_oid, c.typmod, resolved) else {
                // Shown with the next commit, which reads the type from the source.
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

    #[test]
    fn builtin_types_map_like_the_sink() {
        assert_eq!(builtin(23, -1), Some((DataType::Int32, "int4")));
        assert_eq!(builtin(25, -1), Some((DataType::Utf8, "text")));
        // numeric(12,2): typmod = (12 << 16 | 2) + 4
        assert_eq!(
            builtin(1700, (12 << 16 | 2) + 4),
            Some((DataType::Decimal128(12, 2), "numeric"))
        );
        let (list, name) = builtin(1009, -1).unwrap_or((DataType::Null, ""));
        assert_eq!(name, "_text");
        assert!(matches!(list, DataType::List(f) if f.data_type() == &DataType::Utf8));
        assert_eq!(builtin(16385, -1), None);
        assert!(promotable(&DataType::Int32, &DataType::Int64));
        assert!(!promotable(&DataType::Int64, &DataType::Int32));
        assert!(promotable(
            &DataType::Decimal128(10, 2),
            &DataType::Decimal128(12, 2)
        ));
    }
}
