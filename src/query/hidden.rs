//! Queries, live half: the committed rows a table's WAL tail replaces (by key, and how many
//! copies), and the set a scan of the committed files probes to leave them out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::datatypes::{DataType, Int16Type, Int32Type, Int64Type, SchemaRef};
use datafusion::error::{DataFusionError, Result as DfResult};

use crate::table::keys::{Key, KeyEncoder};

/// Committed rows the tail replaces: by key, how many copies to hide (`u32::MAX`: all).
#[derive(Debug, Clone, Default)]
pub struct Hidden {
    pub all: bool,
    pub keys: HashMap<Key, u32>,
    /// The key values as text, in key order (for fast paths on integer keys).
    pub texts: HashMap<Key, Vec<Option<String>>>,
    /// The set a scan hides committed rows by, when it can be shared: built by the first
    /// scan of this tail, then reused by every statement that reads the same tail.
    pub shared: OnceLock<Option<Arc<HiddenSet>>>,
}

impl Hidden {
    pub fn is_empty(&self) -> bool {
        !self.all && self.keys.is_empty()
    }
}

/// Committed keys to hide, in the representation that is fastest to probe.
#[derive(Debug)]
pub enum HiddenSet {
    /// A single integer key column: a bitmap over the keys' range.
    Bitmap { min: i64, bits: Vec<u64> },
    /// Any other key: encoded keys, with how many copies to hide (tables keyed by the whole
    /// row may hold equal rows).
    Keys {
        encoder: KeyEncoder,
        keys: Mutex<HashMap<Key, u32>>,
    },
}

/// Keys spanning at most this many values use a bitmap (8 MiB).
const BITMAP_MAX_SPAN: i64 = 64 << 20;

impl HiddenSet {
    /// A bitmap over the range of the hidden keys, when the table is keyed by one integer
    /// column and the range is small enough.
    pub(super) fn bitmap(
        hidden: &Hidden,
        schema: &SchemaRef,
        key_cols: &[usize],
        keyed: bool,
    ) -> Option<Self> {
        let [k] = key_cols else {
            return None;
        };
        if !keyed || !crate::query::committed::int_key(schema.field(*k).data_type()) {
            return None;
        }
        let ints: Vec<i64> = hidden
            .texts
            .values()
            .map(|t| t.first().and_then(|v| v.as_deref()?.parse::<i64>().ok()))
            .collect::<Option<_>>()?;
        let min = ints.iter().copied().min().unwrap_or(0);
        let max = ints.iter().copied().max().unwrap_or(0);
        if max.saturating_sub(min) >= BITMAP_MAX_SPAN {
            return None;
        }
        let span = (max - min) as usize + 1;
        let mut bits = vec![0u64; span.div_ceil(64)];
        for v in ints {
            let o = (v - min) as usize;
            bits[o / 64] |= 1 << (o % 64);
        }
        Some(Self::Bitmap { min, bits })
    }

    /// The hidden keys, encoded, with how many copies of each to hide.
    pub(super) fn keys(hidden: &Hidden, schema: &SchemaRef, key_cols: &[usize]) -> Self {
        let types: Vec<DataType> = key_cols
            .iter()
            .map(|i| schema.field(*i).data_type().clone())
            .collect();
        Self::Keys {
            encoder: KeyEncoder::new(types),
            keys: Mutex::new(hidden.keys.clone()),
        }
    }

    /// Whether the single integer key `v` is hidden (false for other kinds of keys).
    pub fn hides_int(&self, v: i64) -> bool {
        match self {
            Self::Bitmap { min, bits } => {
                let o = v.wrapping_sub(*min);
                if o < 0 || (o as usize) / 64 >= bits.len() {
                    return false;
                }
                let o = o as usize;
                bits[o / 64] & (1 << (o % 64)) != 0
            }
            Self::Keys { .. } => false,
        }
    }

    /// Which rows of `batch` stay visible (`keys`: the key columns).
    pub fn keep(&self, keys: &[ArrayRef]) -> DfResult<BooleanArray> {
        let n = keys.first().map(|k| k.len()).unwrap_or(0);
        match self {
            Self::Bitmap { .. } => {
                let col = &keys[0];
                let hidden = |v: i64| self.hides_int(v);
                let keep: BooleanArray = match col.data_type() {
                    DataType::Int64 => col
                        .as_primitive::<Int64Type>()
                        .iter()
                        .map(|v| Some(v.is_none_or(|v| !hidden(v))))
                        .collect(),
                    DataType::Int32 => col
                        .as_primitive::<Int32Type>()
                        .iter()
                        .map(|v| Some(v.is_none_or(|v| !hidden(v as i64))))
                        .collect(),
                    DataType::Int16 => col
                        .as_primitive::<Int16Type>()
                        .iter()
                        .map(|v| Some(v.is_none_or(|v| !hidden(v as i64))))
                        .collect(),
                    other => {
                        return Err(DataFusionError::Internal(format!(
                            "integer key expected, found {other}"
                        )))
                    }
                };
                Ok(keep)
            }
            Self::Keys { encoder, keys: map } => {
                let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
                let mut out = Vec::with_capacity(n);
                for row in 0..n {
                    let visible = match encoder.from_arrays(keys, row) {
                        Some(k) => match map.get_mut(&k) {
                            Some(0) | None => true,
                            Some(c) if *c == u32::MAX => false,
                            Some(c) => {
                                *c -= 1;
                                false
                            }
                        },
                        None => true,
                    };
                    out.push(visible);
                }
                Ok(BooleanArray::from(out))
            }
        }
    }
}
