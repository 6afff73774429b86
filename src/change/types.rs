//! Postgres types as they leave the source: how each column maps to an Iceberg type, and how
//! a value in Postgres' text format (COPY and pgoutput both speak it) becomes an Arrow value.
//!
//! The mapping is lossless. Types without a native Iceberg counterpart travel as their
//! Postgres text output; values Iceberg cannot hold (an `infinity` timestamp, a numeric
//! `NaN`, more fractional digits than the column's scale) stop the sync with an error rather
//! than being rounded or dropped.

use std::sync::Arc;

use arrow::array::NullBufferBuilder;
use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder,
    Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, ListArray,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, FieldRef};
use iceberg::spec::{ListType, NestedField, PrimitiveType, Type};

/// Precision and scale used for `numeric` without a declared precision.
pub const UNCONSTRAINED_NUMERIC: (u32, u32) = (38, 18);
/// Largest decimal precision Iceberg can store.
const MAX_DECIMAL_PRECISION: u32 = 38;

/// A Postgres column type, reduced to what decides its Iceberg type and its decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgType {
    Int2,
    Int4,
    Int8,
    Oid,
    Numeric {
        precision: u32,
        scale: u32,
        constrained: bool,
    },
    Float4,
    Float8,
    Bool,
    /// text, varchar, char(n), name, enums, json, jsonb, xml, and every text fallback.
    Text,
    Date,
    Time,
    Timestamp,
    Timestamptz,
    Uuid,
    Bytea,
    /// A one-dimensional array.
    Array(Box<PgType>),
}

/// Catalog facts about a column's type (the neutral model's: the WAL stores them).
pub use crate::change::TypeInfo;

/// How a Postgres type maps, with a note when the mapping is a text fallback.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub pg: PgType,
    pub fallback: Option<&'static str>,
}

impl PgType {
    /// Maps catalog facts to a Postgres type. Never fails: unknown types become text.
    pub fn from_info(info: &TypeInfo) -> Mapping {
        if let Some(elem) = &info.element {
            let inner = PgType::from_info(elem);
            return match inner.pg {
                PgType::Array(_) => Mapping {
                    pg: PgType::Text,
                    fallback: Some("nested array type, stored as Postgres text"),
                },
                pg => Mapping {
                    pg: PgType::Array(Box::new(pg)),
                    fallback: inner.fallback,
                },
            };
        }
        if info.typtype == 'e' {
            return Mapping {
                pg: PgType::Text,
                fallback: None,
            };
        }
        let pg = match info.oid {
            21 => PgType::Int2,
            23 => PgType::Int4,
            20 => PgType::Int8,
            26 => PgType::Oid,
            1700 => numeric_from_typmod(info.typmod),
            700 => PgType::Float4,
            701 => PgType::Float8,
            16 => PgType::Bool,
            25 | 1043 | 1042 | 18 | 19 | 114 | 3802 => PgType::Text,
            1082 => PgType::Date,
            1083 => PgType::Time,
            1114 => PgType::Timestamp,
            1184 => PgType::Timestamptz,
            2950 => PgType::Uuid,
            17 => PgType::Bytea,
            _ => {
                return Mapping {
                    pg: PgType::Text,
                    fallback: Some("no native Iceberg type; stored as its Postgres text output"),
                }
            }
        };
        // numeric(p>38) cannot be an Iceberg decimal: keep its exact text.
        if let PgType::Numeric { precision, .. } = pg {
            if precision > MAX_DECIMAL_PRECISION {
                return Mapping {
                    pg: PgType::Text,
                    fallback: Some("numeric precision above 38; stored as exact text"),
                };
            }
        }
        Mapping { pg, fallback: None }
    }

    /// The decoding for a column of an existing Iceberg table, from its Arrow type.
    pub fn from_arrow(dt: &DataType) -> PgType {
        match dt {
            DataType::Int32 => PgType::Int4,
            DataType::Int64 => PgType::Int8,
            DataType::Decimal128(p, s) => PgType::Numeric {
                precision: *p as u32,
                scale: (*s).max(0) as u32,
                constrained: (*p as u32, (*s).max(0) as u32) != UNCONSTRAINED_NUMERIC,
            },
            DataType::Float32 => PgType::Float4,
            DataType::Float64 => PgType::Float8,
            DataType::Boolean => PgType::Bool,
            DataType::Date32 => PgType::Date,
            DataType::Time64(_) => PgType::Time,
            DataType::Timestamp(_, None) => PgType::Timestamp,
            DataType::Timestamp(_, Some(_)) => PgType::Timestamptz,
            DataType::FixedSizeBinary(16) => PgType::Uuid,
            DataType::LargeBinary | DataType::Binary => PgType::Bytea,
            DataType::List(f) => PgType::Array(Box::new(PgType::from_arrow(f.data_type()))),
            _ => PgType::Text,
        }
    }

    /// The Iceberg type for this column.
    pub fn iceberg_type(&self, next_id: &mut i32) -> Type {
        match self {
            PgType::Int2 | PgType::Int4 => Type::Primitive(PrimitiveType::Int),
            PgType::Int8 | PgType::Oid => Type::Primitive(PrimitiveType::Long),
            PgType::Numeric {
                precision, scale, ..
            } => Type::Primitive(PrimitiveType::Decimal {
                precision: *precision,
                scale: *scale,
            }),
            PgType::Float4 => Type::Primitive(PrimitiveType::Float),
            PgType::Float8 => Type::Primitive(PrimitiveType::Double),
            PgType::Bool => Type::Primitive(PrimitiveType::Boolean),
            PgType::Text => Type::Primitive(PrimitiveType::String),
            PgType::Date => Type::Primitive(PrimitiveType::Date),
            PgType::Time => Type::Primitive(PrimitiveType::Time),
            PgType::Timestamp => Type::Primitive(PrimitiveType::Timestamp),
            PgType::Timestamptz => Type::Primitive(PrimitiveType::Timestamptz),
            PgType::Uuid => Type::Primitive(PrimitiveType::Uuid),
            PgType::Bytea => Type::Primitive(PrimitiveType::Binary),
            PgType::Array(inner) => {
                *next_id += 1;
                let id = *next_id;
                let elem = inner.iceberg_type(next_id);
                Type::List(ListType::new(Arc::new(NestedField::list_element(
                    id, elem, false,
                ))))
            }
        }
    }

    /// A short name of the Iceberg type, for `discover`.
    pub fn iceberg_type_name(&self) -> String {
        let mut id = 0;
        type_name(&self.iceberg_type(&mut id))
    }
}

fn type_name(t: &Type) -> String {
    match t {
        Type::Primitive(p) => p.to_string(),
        Type::List(l) => format!("list<{}>", type_name(&l.element_field.field_type)),
        Type::Struct(_) => "struct".into(),
        Type::Map(_) => "map".into(),
    }
}

fn numeric_from_typmod(typmod: i32) -> PgType {
    if typmod < 4 {
        let (precision, scale) = UNCONSTRAINED_NUMERIC;
        return PgType::Numeric {
            precision,
            scale,
            constrained: false,
        };
    }
    let t = typmod - 4;
    let precision = ((t >> 16) & 0xffff) as u32;
    // Postgres 15 stores the scale as an 11-bit signed number.
    let raw_scale = t & 0x7ff;
    let scale = if raw_scale & 0x400 != 0 {
        raw_scale - 0x800
    } else {
        raw_scale
    };
    let (precision, scale) = if scale < 0 {
        (precision + scale.unsigned_abs(), 0)
    } else {
        let s = scale as u32;
        (precision.max(s), s)
    };
    PgType::Numeric {
        precision,
        scale,
        constrained: true,
    }
}

/// Why a value could not be stored; the caller adds the table and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError(pub String);

type VResult<T> = Result<T, ValueError>;

fn bad(what: &str, value: &str) -> ValueError {
    // Never include the value itself: it may be sensitive. Its length helps debugging.
    ValueError(format!(
        "cannot parse a {what} value (length {})",
        value.len()
    ))
}

/// Builds one Arrow column from Postgres text values.
pub enum ColumnBuilder {
    Int32(Int32Builder),
    Int64(Int64Builder),
    Decimal {
        b: Decimal128Builder,
        precision: u32,
        scale: u32,
        constrained: bool,
    },
    Float32(Float32Builder),
    Float64(Float64Builder),
    Bool(BooleanBuilder),
    Utf8(StringBuilder),
    Date(Date32Builder),
    Time(Time64MicrosecondBuilder),
    Timestamp(TimestampMicrosecondBuilder),
    Timestamptz(TimestampMicrosecondBuilder),
    Uuid(FixedSizeBinaryBuilder),
    Binary(LargeBinaryBuilder),
    List {
        field: FieldRef,
        child: Box<ColumnBuilder>,
        offsets: Vec<i32>,
        nulls: NullBufferBuilder,
    },
}

impl ColumnBuilder {
    /// A builder for `pg`, producing the Arrow type `dt` (taken from the Iceberg schema).
    pub fn new(pg: &PgType, dt: &DataType, capacity: usize) -> Self {
        match pg {
            PgType::Int2 | PgType::Int4 => Self::Int32(Int32Builder::with_capacity(capacity)),
            PgType::Int8 | PgType::Oid => Self::Int64(Int64Builder::with_capacity(capacity)),
            PgType::Numeric {
                precision,
                scale,
                constrained,
            } => Self::Decimal {
                b: Decimal128Builder::with_capacity(capacity)
                    .with_data_type(DataType::Decimal128(*precision as u8, *scale as i8)),
                precision: *precision,
                scale: *scale,
                constrained: *constrained,
            },
            PgType::Float4 => Self::Float32(Float32Builder::with_capacity(capacity)),
            PgType::Float8 => Self::Float64(Float64Builder::with_capacity(capacity)),
            PgType::Bool => Self::Bool(BooleanBuilder::with_capacity(capacity)),
            PgType::Text => Self::Utf8(StringBuilder::with_capacity(capacity, capacity * 16)),
            PgType::Date => Self::Date(Date32Builder::with_capacity(capacity)),
            PgType::Time => Self::Time(Time64MicrosecondBuilder::with_capacity(capacity)),
            PgType::Timestamp => {
                Self::Timestamp(TimestampMicrosecondBuilder::with_capacity(capacity))
            }
            PgType::Timestamptz => {
                let tz = match dt {
                    DataType::Timestamp(_, Some(tz)) => tz.clone(),
                    _ => Arc::from("+00:00"),
                };
                Self::Timestamptz(
                    TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone(tz),
                )
            }
            PgType::Uuid => Self::Uuid(FixedSizeBinaryBuilder::with_capacity(capacity, 16)),
            PgType::Bytea => {
                Self::Binary(LargeBinaryBuilder::with_capacity(capacity, capacity * 16))
            }
            PgType::Array(inner) => {
                let field = match dt {
                    DataType::List(f) => f.clone(),
                    _ => Arc::new(arrow::datatypes::Field::new(
                        "element",
                        DataType::Null,
                        true,
                    )),
                };
                let child = ColumnBuilder::new(inner, field.data_type(), capacity);
                let mut offsets = Vec::with_capacity(capacity + 1);
                offsets.push(0);
                Self::List {
                    field,
                    child: Box::new(child),
                    offsets,
                    nulls: NullBufferBuilder::new(capacity),
                }
            }
        }
    }

    /// Appends a NULL.
    pub fn append_null(&mut self) {
        match self {
            Self::Int32(b) => b.append_null(),
            Self::Int64(b) => b.append_null(),
            Self::Decimal { b, .. } => b.append_null(),
            Self::Float32(b) => b.append_null(),
            Self::Float64(b) => b.append_null(),
            Self::Bool(b) => b.append_null(),
            Self::Utf8(b) => b.append_null(),
            Self::Date(b) => b.append_null(),
            Self::Time(b) => b.append_null(),
            Self::Timestamp(b) | Self::Timestamptz(b) => b.append_null(),
            Self::Uuid(b) => b.append_null(),
            Self::Binary(b) => b.append_null(),
            Self::List { offsets, nulls, .. } => {
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last);
                nulls.append_null();
            }
        }
    }

    /// Appends a value written in Postgres' text output format.
    pub fn append_text(&mut self, v: &str) -> VResult<()> {
        match self {
            Self::Int32(b) => b.append_value(v.parse::<i32>().map_err(|_| bad("integer", v))?),
            Self::Int64(b) => b.append_value(v.parse::<i64>().map_err(|_| bad("bigint", v))?),
            Self::Decimal {
                b,
                precision,
                scale,
                constrained,
            } => b.append_value(parse_decimal(v, *precision, *scale, *constrained)?),
            Self::Float32(b) => b.append_value(parse_float32(v)?),
            Self::Float64(b) => b.append_value(parse_float(v)?),
            Self::Bool(b) => b.append_value(match v {
                "t" => true,
                "f" => false,
                _ => return Err(bad("boolean", v)),
            }),
            Self::Utf8(b) => b.append_value(v),
            Self::Date(b) => b.append_value(parse_date(v)?),
            Self::Time(b) => b.append_value(parse_time(v)?),
            Self::Timestamp(b) => b.append_value(parse_timestamp(v, false)?),
            Self::Timestamptz(b) => b.append_value(parse_timestamp(v, true)?),
            Self::Uuid(b) => {
                let u = uuid::Uuid::parse_str(v).map_err(|_| bad("uuid", v))?;
                b.append_value(u.as_bytes())
                    .map_err(|e| ValueError(format!("uuid: {e}")))?
            }
            Self::Binary(b) => b.append_value(parse_bytea(v)?),
            Self::List {
                child,
                offsets,
                nulls,
                ..
            } => {
                let n = parse_array(v, |elem| match elem {
                    None => {
                        child.append_null();
                        Ok(())
                    }
                    Some(s) => child.append_text(s),
                })?;
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last + n as i32);
                nulls.append_non_null();
            }
        }
        Ok(())
    }

    /// Number of values appended so far.
    pub fn len(&self) -> usize {
        use arrow::array::ArrayBuilder;
        match self {
            Self::Int32(b) => b.len(),
            Self::Int64(b) => b.len(),
            Self::Decimal { b, .. } => b.len(),
            Self::Float32(b) => b.len(),
            Self::Float64(b) => b.len(),
            Self::Bool(b) => b.len(),
            Self::Utf8(b) => b.len(),
            Self::Date(b) => b.len(),
            Self::Time(b) => b.len(),
            Self::Timestamp(b) | Self::Timestamptz(b) => b.len(),
            Self::Uuid(b) => b.len(),
            Self::Binary(b) => b.len(),
            Self::List { offsets, .. } => offsets.len() - 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finishes the column and resets the builder.
    pub fn finish(&mut self) -> ArrayRef {
        match self {
            Self::Int32(b) => Arc::new(b.finish()),
            Self::Int64(b) => Arc::new(b.finish()),
            Self::Decimal { b, .. } => Arc::new(b.finish()),
            Self::Float32(b) => Arc::new(b.finish()),
            Self::Float64(b) => Arc::new(b.finish()),
            Self::Bool(b) => Arc::new(b.finish()),
            Self::Utf8(b) => Arc::new(b.finish()),
            Self::Date(b) => Arc::new(b.finish()),
            Self::Time(b) => Arc::new(b.finish()),
            Self::Timestamp(b) | Self::Timestamptz(b) => Arc::new(b.finish()),
            Self::Uuid(b) => Arc::new(b.finish()),
            Self::Binary(b) => Arc::new(b.finish()),
            Self::List {
                field,
                child,
                offsets,
                nulls,
            } => {
                let values = child.finish();
                let offs = std::mem::replace(offsets, vec![0]);
                let array = ListArray::new(
                    field.clone(),
                    OffsetBuffer::new(offs.into()),
                    values,
                    nulls.finish(),
                );
                Arc::new(array)
            }
        }
    }
}

fn parse_float32(v: &str) -> VResult<f32> {
    match v {
        "NaN" => Ok(f32::NAN),
        "Infinity" => Ok(f32::INFINITY),
        "-Infinity" => Ok(f32::NEG_INFINITY),
        _ => v.parse::<f32>().map_err(|_| bad("real", v)),
    }
}

fn parse_float(v: &str) -> VResult<f64> {
    match v {
        "NaN" => Ok(f64::NAN),
        "Infinity" => Ok(f64::INFINITY),
        "-Infinity" => Ok(f64::NEG_INFINITY),
        _ => v.parse::<f64>().map_err(|_| bad("floating point", v)),
    }
}

/// Parses a Postgres numeric into an i128 scaled by `scale`, refusing any loss.
pub fn parse_decimal(v: &str, precision: u32, scale: u32, constrained: bool) -> VResult<i128> {
    if v == "NaN" || v.ends_with("Infinity") {
        return Err(ValueError(format!(
            "numeric `{v}` has no Iceberg decimal representation"
        )));
    }
    let (neg, digits) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    // Postgres prints numerics in plain notation, never with an exponent.
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(bad("numeric", v));
    }
    let frac_kept = if frac_part.len() > scale as usize {
        let (kept, dropped) = frac_part.split_at(scale as usize);
        if dropped.bytes().any(|c| c != b'0') {
            let hint = if constrained {
                String::new()
            } else {
                format!(
                    "; unconstrained numeric maps to decimal({},{}): declare the column as numeric(p,s) with the scale you need",
                    UNCONSTRAINED_NUMERIC.0, UNCONSTRAINED_NUMERIC.1
                )
            };
            return Err(ValueError(format!(
                "a numeric value has {} fractional digits, more than the {scale} the Iceberg column keeps{hint}",
                frac_part.len()
            )));
        }
        kept
    } else {
        frac_part
    };
    let int_trimmed = int_part.trim_start_matches('0');
    if int_trimmed.len() + scale as usize > precision as usize {
        return Err(ValueError(format!(
            "a numeric value has {} integer digits, more than decimal({precision},{scale}) holds",
            int_trimmed.len()
        )));
    }
    let mut acc: i128 = 0;
    for c in int_trimmed.bytes().chain(frac_kept.bytes()) {
        if !c.is_ascii_digit() {
            return Err(bad("numeric", v));
        }
        acc = acc * 10 + (c - b'0') as i128;
    }
    for _ in frac_kept.len()..scale as usize {
        acc *= 10;
    }
    Ok(if neg { -acc } else { acc })
}

fn two(v: &[u8], i: usize) -> Option<u32> {
    let a = v.get(i)?.wrapping_sub(b'0');
    let b = v.get(i + 1)?.wrapping_sub(b'0');
    (a < 10 && b < 10).then_some((a * 10 + b) as u32)
}

/// Days since 1970-01-01 for `YYYY-MM-DD[ BC]`.
fn parse_date(v: &str) -> VResult<i32> {
    let (body, bc) = match v.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (v, false),
    };
    let date = parse_ymd(body, bc).ok_or_else(|| not_representable_or_bad("date", v))?;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).ok_or_else(|| bad("date", v))?;
    i32::try_from((date - epoch).num_days()).map_err(|_| bad("date", v))
}

fn not_representable_or_bad(what: &str, v: &str) -> ValueError {
    if v.contains("infinity") {
        ValueError(format!(
            "{what} `{v}` has no Iceberg representation (Iceberg has no infinite {what}s)"
        ))
    } else {
        bad(what, v)
    }
}

fn parse_ymd(s: &str, bc: bool) -> Option<chrono::NaiveDate> {
    let dash = s.find('-')?;
    let year: i32 = s[..dash].parse().ok()?;
    let rest = &s.as_bytes()[dash + 1..];
    if rest.len() != 5 || rest[2] != b'-' {
        return None;
    }
    let month = two(rest, 0)?;
    let day = two(rest, 3)?;
    let year = if bc { 1 - year } else { year };
    chrono::NaiveDate::from_ymd_opt(year, month, day)
}

/// Microseconds since midnight for `HH:MM:SS[.ffffff]`.
fn parse_time(v: &str) -> VResult<i64> {
    parse_hms(v.as_bytes()).ok_or_else(|| bad("time", v))
}

fn parse_hms(b: &[u8]) -> Option<i64> {
    if b.len() < 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let h = two(b, 0)? as i64;
    let m = two(b, 3)? as i64;
    let s = two(b, 6)? as i64;
    let mut micros = 0i64;
    if b.len() > 8 {
        if b[8] != b'.' {
            return None;
        }
        let frac = &b[9..];
        if frac.is_empty() || frac.len() > 6 {
            return None;
        }
        for &c in frac {
            let d = c.wrapping_sub(b'0');
            if d >= 10 {
                return None;
            }
            micros = micros * 10 + d as i64;
        }
        for _ in frac.len()..6 {
            micros *= 10;
        }
    }
    if h > 24 || m > 59 || s > 60 {
        return None;
    }
    Some(((h * 60 + m) * 60 + s) * 1_000_000 + micros)
}

/// Microseconds since the Unix epoch for `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]`.
fn parse_timestamp(v: &str, with_tz: bool) -> VResult<i64> {
    let what = if with_tz { "timestamptz" } else { "timestamp" };
    let (body, bc) = match v.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (v, false),
    };
    let (date_part, time_part) = body
        .split_once(' ')
        .ok_or_else(|| not_representable_or_bad(what, v))?;
    let date = parse_ymd(date_part, bc).ok_or_else(|| bad(what, v))?;
    // Split off a UTC offset: the first '+' or '-' after the seconds.
    let after_seconds = time_part.get(8..).unwrap_or("");
    let (clock, offset_secs) = match after_seconds.find(['+', '-']) {
        Some(i) => {
            let at = 8 + i;
            let off = parse_offset(&time_part[at..]).ok_or_else(|| bad(what, v))?;
            (&time_part[..at], off)
        }
        None => (time_part, 0),
    };
    let micros = parse_hms(clock.as_bytes()).ok_or_else(|| bad(what, v))?;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).ok_or_else(|| bad(what, v))?;
    let days = (date - epoch).num_days();
    days.checked_mul(86_400_000_000)
        .and_then(|d| d.checked_add(micros))
        .and_then(|t| t.checked_sub(offset_secs * 1_000_000))
        .ok_or_else(|| bad(what, v))
}

fn parse_offset(s: &str) -> Option<i64> {
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let mut secs = 0i64;
    for (i, part) in s[1..].split(':').enumerate() {
        let n: i64 = part.parse().ok()?;
        secs += n * [3600, 60, 1].get(i)?;
    }
    Some(sign * secs)
}

/// Decodes bytea's hex output, `\x0a0b...`.
fn parse_bytea(v: &str) -> VResult<Vec<u8>> {
    let hex = v.strip_prefix("\\x").ok_or_else(|| {
        ValueError("bytea value is not in hex format; set bytea_output = 'hex'".into())
    })?;
    let b = hex.as_bytes();
    if b.len() % 2 != 0 {
        return Err(bad("bytea", v));
    }
    let nib = |c: u8| -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    };
    b.chunks(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| bad("bytea", v))
}

/// Parses a one-dimensional array literal `{a,"b c",NULL}`, calling `f` per element.
/// Returns the number of elements.
pub fn parse_array(v: &str, mut f: impl FnMut(Option<&str>) -> VResult<()>) -> VResult<usize> {
    if v.starts_with('[') {
        return Err(ValueError(
            "arrays with explicit bounds (not starting at 1) have no Iceberg representation".into(),
        ));
    }
    let inner = v
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| bad("array", v))?;
    if inner.is_empty() {
        return Ok(0);
    }
    let b = inner.as_bytes();
    let mut i = 0;
    let mut n = 0;
    let mut buf = String::new();
    loop {
        if b.get(i) == Some(&b'{') {
            return Err(ValueError(
                "multi-dimensional arrays have no Iceberg list representation".into(),
            ));
        }
        if b.get(i) == Some(&b'"') {
            buf.clear();
            i += 1;
            loop {
                match b.get(i) {
                    Some(b'\\') => {
                        let c = inner[i + 1..]
                            .chars()
                            .next()
                            .ok_or_else(|| bad("array", v))?;
                        buf.push(c);
                        i += 1 + c.len_utf8();
                    }
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(_) => {
                        let c = inner[i..].chars().next().ok_or_else(|| bad("array", v))?;
                        buf.push(c);
                        i += c.len_utf8();
                    }
                    None => return Err(bad("array", v)),
                }
            }
            f(Some(&buf))?;
        } else {
            let start = i;
            while i < b.len() && b[i] != b',' {
                i += 1;
            }
            let tok = &inner[start..i];
            if tok == "NULL" {
                f(None)?;
            } else {
                f(Some(tok))?;
            }
        }
        n += 1;
        match b.get(i) {
            None => break,
            Some(b',') => i += 1,
            Some(_) => return Err(bad("array", v)),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
