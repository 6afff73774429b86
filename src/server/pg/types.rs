//! Gateway, Postgres imitation, types: the Postgres type of each column the catalog lists
//! (the source's declared type a replicated table records, the type a `CREATE TABLE`
//! declared, or the one that carries its Arrow type), as `pg_attribute`,
//! `information_schema.columns` and `to_regtype` report them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int32Type, Int64Type, Schema};
use datafusion::error::Result as DfResult;
use datafusion::sql::sqlparser::ast::DataType as SqlType;

use crate::table::SourceColumn;

/// The declared Postgres type of each column of a table, by attnum - 1: (oid, typmod).
pub(super) type ColumnTypes = Vec<(i32, i32)>;

/// Built-in types by name, for `to_regtype`.
pub(crate) const TYPE_OIDS: &[(&str, i64)] = &[
    ("bool", 16),
    ("boolean", 16),
    ("bytea", 17),
    ("char", 18),
    ("name", 19),
    ("int8", 20),
    ("bigint", 20),
    ("int2", 21),
    ("smallint", 21),
    ("int4", 23),
    ("integer", 23),
    ("int", 23),
    ("text", 25),
    ("oid", 26),
    ("json", 114),
    ("float4", 700),
    ("real", 700),
    ("float8", 701),
    ("double precision", 701),
    ("varchar", 1043),
    ("character varying", 1043),
    ("date", 1082),
    ("time", 1083),
    ("timestamp", 1114),
    ("timestamptz", 1184),
    ("interval", 1186),
    ("numeric", 1700),
    ("uuid", 2950),
    ("jsonb", 3802),
];

/// The Postgres type of each column: the source's declared type as the table records it
/// (`skippr.columns`), or the type of its Iceberg field (columns without a record, such as
/// dropped ones).
pub(crate) fn column_types(schema: &Schema, props: &HashMap<String, String>) -> ColumnTypes {
    let recorded: Vec<SourceColumn> = crate::table::source_columns(props).unwrap_or_default();
    schema
        .fields()
        .iter()
        .map(|f| {
            recorded
                .iter()
                .find(|c| c.target() == f.name())
                .map(|c| (c.oid as i32, c.typmod))
                .unwrap_or_else(|| arrow_type_oid(f.data_type()))
        })
        .collect()
}

/// The Postgres type that carries an Arrow type: (oid, typmod).
pub(crate) fn arrow_type_oid(dt: &DataType) -> (i32, i32) {
    match dt {
        DataType::Boolean => (16, -1),
        DataType::Int16 => (21, -1),
        DataType::Int32 => (23, -1),
        DataType::Int64 => (20, -1),
        DataType::Float32 => (700, -1),
        DataType::Float64 => (701, -1),
        DataType::Decimal128(p, s) => (1700, ((*p as i32) << 16 | (*s as i32)) + 4),
        DataType::Binary | DataType::LargeBinary => (17, -1),
        DataType::FixedSizeBinary(16) => (2950, -1),
        DataType::Date32 => (1082, -1),
        DataType::Time64(_) => (1083, -1),
        DataType::Timestamp(_, Some(_)) => (1184, -1),
        DataType::Timestamp(_, None) => (1114, -1),
        DataType::List(inner) => {
            let (elem, typmod) = arrow_type_oid(inner.data_type());
            let array = match elem {
                16 => 1000,
                17 => 1001,
                21 => 1005,
                23 => 1007,
                20 => 1016,
                700 => 1021,
                701 => 1022,
                1700 => 1231,
                2950 => 2951,
                1082 => 1182,
                1083 => 1183,
                1184 => 1185,
                1114 => 1115,
                _ => 1009,
            };
            (array, typmod)
        }
        _ => (25, -1),
    }
}

/// Array type oids (for `attndims`).
fn is_array_oid(oid: i32) -> bool {
    matches!(
        oid,
        1000 | 1001
            | 1005
            | 1007
            | 1009
            | 1014
            | 1015
            | 1016
            | 1021
            | 1022
            | 1115
            | 1182
            | 1183
            | 1185
            | 1231
            | 2951
            | 199
            | 3807
    )
}

/// Rewrites `atttypid`, `atttypmod` and `attndims` of the workspace's columns.
pub(crate) fn declared_types(
    batch: RecordBatch,
    types: &HashMap<i64, ColumnTypes>,
) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let idx = |n: &str| schema.index_of(n).ok();
    let (Some(rel), Some(num), Some(typ), Some(typmod)) = (
        idx("attrelid"),
        idx("attnum"),
        idx("atttypid"),
        idx("atttypmod"),
    ) else {
        return Ok(batch);
    };
    let dims = idx("attndims");
    let rels = arrow::compute::cast(batch.column(rel), &DataType::Int64)?;
    let rels = rels.as_primitive::<Int64Type>();
    let nums = arrow::compute::cast(batch.column(num), &DataType::Int64)?;
    let nums = nums.as_primitive::<Int64Type>();
    let mut typ_out = Vec::with_capacity(batch.num_rows());
    let mut mod_out = Vec::with_capacity(batch.num_rows());
    let mut dim_out = Vec::with_capacity(batch.num_rows());
    let old_typ = arrow::compute::cast(batch.column(typ), &DataType::Int32)?;
    let old_typ = old_typ.as_primitive::<Int32Type>();
    let old_mod = arrow::compute::cast(batch.column(typmod), &DataType::Int32)?;
    let old_mod = old_mod.as_primitive::<Int32Type>();
    for i in 0..batch.num_rows() {
        let declared = types
            .get(&rels.value(i))
            .and_then(|cols| cols.get((nums.value(i) - 1).max(0) as usize).copied())
            .filter(|_| nums.value(i) > 0);
        let (t, m) = declared.unwrap_or((old_typ.value(i), old_mod.value(i)));
        typ_out.push(t);
        mod_out.push(m);
        dim_out.push(if is_array_oid(t) { 1 } else { 0 });
    }
    let mut columns = batch.columns().to_vec();
    let typed = |v: Vec<i32>, like: &ArrayRef| -> DfResult<ArrayRef> {
        Ok(arrow::compute::cast(
            &(Arc::new(arrow::array::Int32Array::from(v)) as ArrayRef),
            like.data_type(),
        )?)
    };
    columns[typ] = typed(typ_out, &columns[typ])?;
    columns[typmod] = typed(mod_out, &columns[typmod])?;
    if let Some(d) = dims {
        columns[d] = typed(dim_out, &columns[d])?;
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The Postgres type a `CREATE TABLE` column declares, where it says more than the Arrow
/// type that holds it (`varchar(20)`, `json`, `uuid`): (oid, typmod).
pub(crate) fn declared_oid(declared: &SqlType, holder: &DataType) -> (i32, i32) {
    match declared {
        SqlType::Varchar(Some(len)) | SqlType::CharacterVarying(Some(len)) => {
            (1043, length(len).map_or(-1, |n| n + 4))
        }
        SqlType::Varchar(None) | SqlType::CharacterVarying(None) => (1043, -1),
        SqlType::Char(len) | SqlType::Character(len) => {
            (1042, len.as_ref().and_then(length).map_or(5, |n| n + 4))
        }
        SqlType::JSON => (114, -1),
        SqlType::JSONB => (3802, -1),
        SqlType::Uuid => (2950, -1),
        _ => arrow_type_oid(holder),
    }
}

/// The number of a character length, when it is one.
fn length(len: &datafusion::sql::sqlparser::ast::CharacterLength) -> Option<i32> {
    match len {
        datafusion::sql::sqlparser::ast::CharacterLength::IntegerLength { length, .. } => {
            i32::try_from(*length).ok()
        }
        datafusion::sql::sqlparser::ast::CharacterLength::Max => None,
    }
}
