//! The table layer, keys: primary keys as comparable bytes, the same whether a key comes from a Parquet file
//! (typed Arrow values) or from the change stream (Postgres text).

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, LargeBinaryArray, StringArray,
};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Int32Type, Int64Type, Time64MicrosecondType, TimeUnit,
    TimestampMicrosecondType,
};

use crate::change::types::{ColumnBuilder, PgType};

/// An encoded key: fixed-width big-endian numbers and length-prefixed bytes.
pub type Key = Box<[u8]>;

/// Encodes keys of one table.
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    types: Vec<DataType>,
}

fn put_len(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

impl KeyEncoder {
    pub fn new(types: Vec<DataType>) -> Self {
        Self { types }
    }

    /// Encodes the key of row `row` of `columns` (the key columns, in key order).
    pub fn from_arrays(&self, columns: &[ArrayRef], row: usize) -> Option<Key> {
        let mut out = Vec::with_capacity(16);
        for (col, dt) in columns.iter().zip(&self.types) {
            // A tag byte per column: NULL (0) is a value too, for tables keyed by the whole row.
            if col.is_null(row) {
                out.push(0);
                continue;
            }
            out.push(1);
            match dt {
                DataType::Int32 => out.extend_from_slice(
                    &(col.as_primitive_opt::<Int32Type>()?.value(row) as i64).to_be_bytes(),
                ),
                DataType::Int64 => out.extend_from_slice(
                    &col.as_primitive_opt::<Int64Type>()?
                        .value(row)
                        .to_be_bytes(),
                ),
                DataType::Date32 => out.extend_from_slice(
                    &(col.as_primitive_opt::<Date32Type>()?.value(row) as i64).to_be_bytes(),
                ),
                DataType::Time64(TimeUnit::Microsecond) => out.extend_from_slice(
                    &col.as_primitive_opt::<Time64MicrosecondType>()?
                        .value(row)
                        .to_be_bytes(),
                ),
                DataType::Timestamp(TimeUnit::Microsecond, _) => out.extend_from_slice(
                    &col.as_primitive_opt::<TimestampMicrosecondType>()?
                        .value(row)
                        .to_be_bytes(),
                ),
                DataType::Decimal128(_, _) => out.extend_from_slice(
                    &col.as_primitive_opt::<Decimal128Type>()?
                        .value(row)
                        .to_be_bytes(),
                ),
                DataType::Boolean => {
                    out.push(col.as_any().downcast_ref::<BooleanArray>()?.value(row) as u8)
                }
                DataType::Utf8 => put_len(
                    &mut out,
                    col.as_any()
                        .downcast_ref::<StringArray>()?
                        .value(row)
                        .as_bytes(),
                ),
                DataType::FixedSizeBinary(_) => put_len(
                    &mut out,
                    col.as_any()
                        .downcast_ref::<FixedSizeBinaryArray>()?
                        .value(row),
                ),
                DataType::LargeBinary => put_len(
                    &mut out,
                    col.as_any().downcast_ref::<LargeBinaryArray>()?.value(row),
                ),
                _ => {
                    let s = arrow::util::display::array_value_to_string(col, row).ok()?;
                    put_len(&mut out, s.as_bytes());
                }
            }
        }
        Some(out.into_boxed_slice())
    }

    /// Encodes a key given as Postgres text values (the key columns, in key order).
    pub fn from_text(&self, pg: &[PgType], values: &[Option<&str>]) -> Result<Key, String> {
        let mut arrays = Vec::with_capacity(values.len());
        for ((v, t), dt) in values.iter().zip(pg).zip(&self.types) {
            let Some(v) = v else {
                arrays.push(KeyPart::Null);
                continue;
            };
            // Fast paths for the common key types.
            match dt {
                DataType::Int32 | DataType::Int64 => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| "a key value is not an integer".to_string())?;
                    arrays.push(KeyPart::Int(n));
                    continue;
                }
                DataType::Utf8 => {
                    arrays.push(KeyPart::Bytes(v.as_bytes().to_vec()));
                    continue;
                }
                _ => {}
            }
            let mut b = ColumnBuilder::new(t, dt, 1);
            b.append_text(v).map_err(|e| e.0)?;
            arrays.push(KeyPart::Array(b.finish()));
        }
        let mut out = Vec::with_capacity(16);
        for part in arrays {
            if matches!(part, KeyPart::Null) {
                out.push(0);
                continue;
            }
            out.push(1);
            match part {
                KeyPart::Null => {}
                KeyPart::Int(n) => out.extend_from_slice(&n.to_be_bytes()),
                KeyPart::Bytes(b) => put_len(&mut out, &b),
                KeyPart::Array(a) => {
                    let enc = KeyEncoder::new(vec![a.data_type().clone()]);
                    let k = enc
                        .from_arrays(&[a], 0)
                        .ok_or_else(|| "a key value cannot be encoded".to_string())?;
                    // Skip the inner tag byte: this component's tag is already written.
                    out.extend_from_slice(&k[1..]);
                }
            }
        }
        Ok(out.into_boxed_slice())
    }
}

enum KeyPart {
    Null,
    Int(i64),
    Bytes(Vec<u8>),
    Array(ArrayRef),
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn text_and_arrow_keys_agree() {
        let enc = KeyEncoder::new(vec![DataType::Int64, DataType::Utf8]);
        let a: ArrayRef = Arc::new(Int64Array::from(vec![42]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x"]));
        let k1 = enc.from_arrays(&[a, b], 0).unwrap();
        let k2 = enc
            .from_text(&[PgType::Int8, PgType::Text], &[Some("42"), Some("x")])
            .unwrap();
        assert_eq!(k1, k2);
    }
}
