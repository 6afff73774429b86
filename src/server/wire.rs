//! Gateway, results on the wire: Arrow results become Postgres rows with Postgres types.
//! Most types are encoded by arrow-pg; uuid columns (Arrow `FixedSizeBinary(16)`) are sent
//! as `uuid` (its text form, or its 16 bytes in binary format), and numerics wider than the
//! binary encoder handles are sent in their exact text form.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, StringArray};
use arrow::datatypes::{
    DataType, Decimal128Type, Field, Float32Type, Float64Type, Schema, SchemaRef,
    Time64MicrosecondType, TimeUnit, TimestampMicrosecondType,
};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::prelude::DataFrame;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use futures::{stream, StreamExt};
use pgwire::api::portal::Format;
use pgwire::api::results::{FieldFormat, FieldInfo, QueryResponse};
use pgwire::api::Type;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::types::format::FormatOptions;

use super::limits::{needs_turn, Interrupted, Interrupts};
use super::pg::arrays::fits;
use super::pg::catalog_types::{field_pg_type, is_vector, list_text};
use crate::error::sqlstate;
use crate::query::limits::statement_runtime;
use crate::query::live::PG_TYPE_META;
use crate::query::numeric::{decimal_text, display_scale, QUOTIENT_SCALE_META};

/// Widest numeric the binary numeric encoder represents exactly.
const MAX_ENCODED_DIGITS: u8 = 28;

/// How a column is changed before encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conv {
    None,
    /// uuid, text format: the canonical text form.
    UuidText,
    /// uuid, binary format: the 16 bytes.
    UuidBinary,
    /// A numeric too wide for the encoder, text format: its exact text.
    DecimalText,
    /// A numeric too wide for the encoder, binary format: Postgres's base-10000 encoding.
    DecimalBinary,
    /// time, text format: Postgres's spelling (no trailing zeros in the fraction).
    TimeText,
    /// real / double precision, text format: Postgres's shortest exact spelling.
    FloatText,
    /// timestamp, text format.
    TimestampText,
    /// timestamptz, text format, in the session's TimeZone.
    TimestampTzText,
    /// json or jsonb, text format: the stored text as it is.
    JsonText,
    /// json, binary format: the text's bytes.
    JsonBinary,
    /// jsonb, binary format: version 1, then the text's bytes.
    JsonbBinary,
    /// int2vector or oidvector, text format: the values separated by spaces.
    VectorText,
    /// A mean (`avg()`), text format: each value with the digits Postgres shows for it; the
    /// input's scale.
    MeanText(i8),
    /// A mean, binary format: Postgres's base-10000 encoding with that display scale.
    MeanBinary(i8),
}

/// Field descriptions and conversions for a result schema.
pub struct WirePlan {
    pub fields: Arc<Vec<FieldInfo>>,
    convs: Vec<Conv>,
    schema: SchemaRef,
    zone: chrono_tz::Tz,
}

/// Which result columns show a column as it is stored (possibly renamed), as opposed to an
/// expression over it: only those keep a type their Arrow type does not carry (json, jsonb).
/// Read from the statement's plan before optimisation, which keeps casts the optimiser
/// would fold away.
pub fn bare_columns(plan: &LogicalPlan) -> Vec<bool> {
    let n = plan.schema().fields().len();
    let mut node = plan;
    loop {
        match node {
            LogicalPlan::Projection(p) => {
                return p
                    .expr
                    .iter()
                    .map(|e| matches!(e.clone().unalias_nested().data, Expr::Column(_)))
                    .collect();
            }
            LogicalPlan::Sort(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::Distinct(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_) => match node.inputs().first() {
                Some(input) if input.schema().fields().len() == n => node = input,
                _ => return vec![true; n],
            },
            _ => return vec![true; n],
        }
    }
}

/// Plans how `schema` goes on the wire in `format`. `bare`: see [`bare_columns`] (missing
/// entries count as bare).
pub fn plan(
    schema: &Schema,
    bare: &[bool],
    format: &Format,
    options: Option<Arc<FormatOptions>>,
    time_zone: Option<&str>,
) -> PgWireResult<WirePlan> {
    if let Format::Individual(codes) = format {
        // One format per column or none at all: a Bind that names another count is
        // broken (and the formats would be read past their end).
        if codes.len() != schema.fields().len() {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".to_string(),
                sqlstate::PROTOCOL_VIOLATION.to_string(),
                format!(
                    "bind message has {} result formats but query has {} columns",
                    codes.len(),
                    schema.fields().len()
                ),
            ))));
        }
    }
    let zone: chrono_tz::Tz = time_zone
        .and_then(|z| z.parse().ok())
        .unwrap_or(chrono_tz::Tz::UTC);
    let mut convs = Vec::with_capacity(schema.fields().len());
    let mut wire_fields: Vec<Field> = Vec::with_capacity(schema.fields().len());
    for (i, f) in schema.fields().iter().enumerate() {
        let binary = format.format_for(i) == FieldFormat::Binary;
        let json = f
            .metadata()
            .get(PG_TYPE_META)
            .filter(|_| bare.get(i).copied().unwrap_or(true) && f.data_type() == &DataType::Utf8)
            .map(String::as_str);
        let json = json.filter(|t| matches!(*t, "json" | "jsonb"));
        let vector = field_pg_type(f).is_some_and(|t| is_vector(t) && fits(t, f.data_type()));
        let mean: Option<i8> = f
            .metadata()
            .get(QUOTIENT_SCALE_META)
            .filter(|_| bare.get(i).copied().unwrap_or(true))
            .and_then(|s| s.parse().ok());
        let (conv, dt) = match (f.data_type(), json) {
            (_, Some("jsonb")) if binary => (Conv::JsonbBinary, DataType::Binary),
            (_, Some("json")) if binary => (Conv::JsonBinary, DataType::Binary),
            (_, Some(_)) => (Conv::JsonText, DataType::Utf8),
            (DataType::List(_), None) if vector && !binary => (Conv::VectorText, DataType::Utf8),
            (DataType::Decimal128(..), None) if mean.is_some() => match mean {
                Some(s) if binary => (Conv::MeanBinary(s), DataType::Binary),
                Some(s) => (Conv::MeanText(s), DataType::Utf8),
                None => (Conv::None, f.data_type().clone()),
            },
            (other, _) => match other {
                DataType::FixedSizeBinary(16) if binary => (Conv::UuidBinary, DataType::Binary),
                DataType::FixedSizeBinary(16) => (Conv::UuidText, DataType::Utf8),
                DataType::Decimal128(p, _) if *p > MAX_ENCODED_DIGITS && !binary => {
                    (Conv::DecimalText, DataType::Utf8)
                }
                DataType::Decimal128(p, _) if *p > MAX_ENCODED_DIGITS => {
                    (Conv::DecimalBinary, DataType::Binary)
                }
                DataType::Time64(_) if !binary => (Conv::TimeText, DataType::Utf8),
                DataType::Timestamp(_, Some(_)) if !binary => {
                    (Conv::TimestampTzText, DataType::Utf8)
                }
                DataType::Timestamp(_, None) if !binary => (Conv::TimestampText, DataType::Utf8),
                DataType::Float32 | DataType::Float64 if !binary => {
                    (Conv::FloatText, DataType::Utf8)
                }
                other => (Conv::None, other.clone()),
            },
        };
        convs.push(conv);
        wire_fields.push(Field::new(f.name(), dt, f.is_nullable()));
    }
    for f in wire_fields.iter_mut() {
        let name = crate::query::naming::pg_column_name(f.name());
        if name != *f.name() {
            *f = f.clone().with_name(name);
        }
    }
    let wire_schema = Arc::new(Schema::new(wire_fields));
    let base = arrow_schema_to_pg_fields(&wire_schema, format, options.clone())?;
    let fields = base
        .into_iter()
        .zip(&convs)
        .zip(schema.fields())
        .enumerate()
        .map(|(i, ((f, conv), original))| {
            let ty = match conv {
                Conv::UuidText | Conv::UuidBinary => Type::UUID,
                Conv::DecimalText
                | Conv::DecimalBinary
                | Conv::MeanText(_)
                | Conv::MeanBinary(_) => Type::NUMERIC,
                Conv::TimeText => Type::TIME,
                Conv::TimestampText => Type::TIMESTAMP,
                Conv::TimestampTzText => Type::TIMESTAMPTZ,
                Conv::FloatText if original.data_type() == &DataType::Float32 => Type::FLOAT4,
                Conv::FloatText => Type::FLOAT8,
                Conv::JsonText | Conv::JsonBinary | Conv::JsonbBinary
                    if original.metadata().get(PG_TYPE_META).map(String::as_str)
                        == Some("jsonb") =>
                {
                    Type::JSONB
                }
                Conv::JsonText | Conv::JsonBinary | Conv::JsonbBinary => Type::JSON,
                Conv::VectorText | Conv::None => {
                    // A scalar only as it is stored (a cast keeps its column's field
                    // metadata); a list is of its type while it is a list.
                    let binary = f.format() == FieldFormat::Binary;
                    let kept = bare.get(i).copied().unwrap_or(true)
                        || (matches!(original.data_type(), DataType::List(_))
                            && field_pg_type(original)
                                .is_some_and(|t| fits(t, original.data_type())));
                    match field_pg_type(original)
                        .filter(|_| kept)
                        .and_then(|t| catalog_wire_type(t, original.data_type(), binary))
                    {
                        Some(ty) => ty,
                        None => return f,
                    }
                }
            };
            let mut out = FieldInfo::new(f.name().to_string(), None, None, ty, f.format());
            if let Some(o) = &options {
                out = out.with_format_options(o.clone());
            }
            out
        })
        .collect();
    Ok(WirePlan {
        fields: Arc::new(fields),
        convs,
        schema: wire_schema,
        zone,
    })
}

impl WirePlan {
    fn convert(&self, batch: RecordBatch) -> PgWireResult<RecordBatch> {
        if self.convs.iter().all(|c| *c == Conv::None) {
            return Ok(batch);
        }
        let columns: Vec<ArrayRef> = batch
            .columns()
            .iter()
            .zip(&self.convs)
            .map(|(col, conv)| convert_column(col, *conv, self.zone))
            .collect::<PgWireResult<_>>()?;
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| PgWireError::ApiError(Box::new(e)))
    }
}

/// The type a client is told for a column of the catalog's Postgres type `pg_type` held as
/// `dt`, where the value goes out in that type's own encoding (text, and binary where the
/// bytes are the same; `regproc`, `regtype` and `xid` are held as text, so binary results
/// keep the text type).
fn catalog_wire_type(pg_type: &str, dt: &DataType, binary: bool) -> Option<Type> {
    let list = matches!(dt, DataType::List(_));
    Some(match pg_type {
        "name" if dt == &DataType::Utf8 => Type::NAME,
        "\"char\"" if dt == &DataType::Utf8 => Type::CHAR,
        "character varying" if dt == &DataType::Utf8 => Type::VARCHAR,
        "pg_node_tree" if dt == &DataType::Utf8 => Type::PG_NODE_TREE,
        "oid" if dt == &DataType::Int32 => Type::OID,
        "regproc" if !binary => Type::REGPROC,
        "regtype" if !binary => Type::REGTYPE,
        "xid" if !binary => Type::XID,
        "inet" if !binary && dt == &DataType::Utf8 => Type::INET,
        "pg_lsn" if !binary => Type::PG_LSN,
        "int2vector" if list => Type::INT2_VECTOR,
        "oidvector" if list => Type::OID_VECTOR,
        "smallint[]" if list => Type::INT2_ARRAY,
        "oid[]" if list => Type::OID_ARRAY,
        "text[]" if list => Type::TEXT_ARRAY,
        "name[]" if list => Type::NAME_ARRAY,
        "\"char\"[]" if list => Type::CHAR_ARRAY,
        "aclitem[]" if list => Type::ACLITEM_ARRAY,
        "regtype[]" if list => Type::REGTYPE_ARRAY,
        _ => return None,
    })
}

fn convert_column(col: &ArrayRef, conv: Conv, zone: chrono_tz::Tz) -> PgWireResult<ArrayRef> {
    Ok(match conv {
        Conv::None | Conv::JsonText => col.clone(),
        Conv::VectorText => list_text(col, true).map_err(|e| PgWireError::ApiError(Box::new(e)))?,
        Conv::JsonBinary | Conv::JsonbBinary => {
            let a = col.as_string::<i32>();
            let version: &[u8] = if conv == Conv::JsonbBinary { &[1] } else { &[] };
            let out: BinaryArray = a
                .iter()
                .map(|v| v.map(|v| [version, v.as_bytes()].concat()))
                .collect();
            Arc::new(out)
        }
        Conv::UuidText => {
            let a = col.as_fixed_size_binary();
            let out: StringArray = (0..a.len())
                .map(|i| {
                    (!a.is_null(i)).then(|| {
                        uuid::Uuid::from_slice(a.value(i))
                            .map(|u| u.hyphenated().to_string())
                            .unwrap_or_default()
                    })
                })
                .collect();
            Arc::new(out)
        }
        Conv::UuidBinary => {
            let a = col.as_fixed_size_binary();
            let out: BinaryArray = (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                .collect();
            Arc::new(out)
        }
        Conv::DecimalText => arrow::compute::cast(col, &DataType::Utf8)
            .map_err(|e| PgWireError::ApiError(Box::new(e)))?,
        Conv::DecimalBinary => {
            let DataType::Decimal128(_, scale) = col.data_type() else {
                return Ok(col.clone());
            };
            let scale = *scale;
            let a = col.as_primitive::<Decimal128Type>();
            let out: BinaryArray = a
                .iter()
                .map(|v| v.map(|v| numeric_binary(v, scale)))
                .collect();
            Arc::new(out)
        }
        Conv::MeanText(input_scale) | Conv::MeanBinary(input_scale) => {
            let DataType::Decimal128(_, scale) = col.data_type() else {
                return Ok(col.clone());
            };
            let scale = *scale;
            let a = col.as_primitive::<Decimal128Type>();
            let shown = |v: i128| display_scale(v, scale, input_scale);
            if matches!(conv, Conv::MeanText(_)) {
                let out: StringArray = a
                    .iter()
                    .map(|v| v.map(|v| decimal_text(v, scale, shown(v))))
                    .collect();
                Arc::new(out)
            } else {
                // The digits past the display scale are zeros.
                let out: BinaryArray = a
                    .iter()
                    .map(|v| {
                        v.map(|v| {
                            let s = shown(v);
                            numeric_binary(v / 10_i128.pow((scale - s).max(0) as u32), s)
                        })
                    })
                    .collect();
                Arc::new(out)
            }
        }
        Conv::TimeText => {
            let micros = arrow::compute::cast(col, &DataType::Time64(TimeUnit::Microsecond))
                .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
            let a = micros.as_primitive::<Time64MicrosecondType>();
            let out: StringArray = a.iter().map(|v| v.map(time_text)).collect();
            Arc::new(out)
        }
        Conv::TimestampText | Conv::TimestampTzText => {
            let micros =
                arrow::compute::cast(col, &DataType::Timestamp(TimeUnit::Microsecond, None))
                    .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
            let a = micros.as_primitive::<TimestampMicrosecondType>();
            let with_zone = conv == Conv::TimestampTzText;
            let out: StringArray = a
                .iter()
                .map(|v| v.map(|v| timestamp_text(v, with_zone.then_some(zone))))
                .collect();
            Arc::new(out)
        }
        Conv::FloatText => {
            let out: StringArray = match col.data_type() {
                DataType::Float32 => col
                    .as_primitive::<Float32Type>()
                    .iter()
                    .map(|v| v.map(|v| float_text(v as f64, format!("{v:e}"), 6, v.to_string())))
                    .collect(),
                _ => col
                    .as_primitive::<Float64Type>()
                    .iter()
                    .map(|v| v.map(|v| float_text(v, format!("{v:e}"), 15, v.to_string())))
                    .collect(),
            };
            Arc::new(out)
        }
    })
}

/// Postgres's binary `numeric`: digit count, weight, sign, display scale, then base-10000
/// digits, all big-endian 16-bit.
fn numeric_binary(v: i128, scale: i8) -> Vec<u8> {
    let scale = scale.max(0) as usize;
    let digits = v.unsigned_abs().to_string();
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (int_part, frac_part) = digits.split_at(digits.len() - scale);
    // Integer groups from the right, fraction groups from the left.
    let pad = (4 - int_part.len() % 4) % 4;
    let int_part = format!("{}{int_part}", "0".repeat(pad));
    let frac_pad = (4 - frac_part.len() % 4) % 4;
    let frac_part = format!("{frac_part}{}", "0".repeat(frac_pad));
    let group = |s: &str| -> Vec<i16> {
        s.as_bytes()
            .chunks(4)
            .map(|c| {
                std::str::from_utf8(c)
                    .ok()
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    };
    let int_groups = group(&int_part);
    let frac_groups = group(&frac_part);
    let mut weight = int_groups.len() as i16 - 1;
    let mut all: Vec<i16> = int_groups.into_iter().chain(frac_groups).collect();
    while all.first() == Some(&0) {
        all.remove(0);
        weight -= 1;
    }
    while all.last() == Some(&0) {
        all.pop();
    }
    if all.is_empty() {
        weight = 0;
    }
    let sign: u16 = if v < 0 && !all.is_empty() { 0x4000 } else { 0 };
    let mut out = Vec::with_capacity(8 + 2 * all.len());
    out.extend_from_slice(&(all.len() as i16).to_be_bytes());
    out.extend_from_slice(&weight.to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&(scale as i16).to_be_bytes());
    for d in all {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out
}

/// `HH:MM:SS[.ffffff]` with the fraction's trailing zeros dropped, as Postgres prints time.
fn time_text(micros: i64) -> String {
    let (secs, frac) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let mut s = format!(
        "{:02}:{:02}:{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    );
    if frac > 0 {
        let f = format!("{frac:06}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` (and the zone's offset, `+HH[:MM]`), as Postgres prints
/// timestamps with DateStyle ISO.
fn timestamp_text(micros: i64, zone: Option<chrono_tz::Tz>) -> String {
    use chrono::{Offset, TimeZone};
    let Some(utc) = chrono::DateTime::from_timestamp_micros(micros) else {
        return micros.to_string();
    };
    let (local, offset) = match zone {
        Some(z) => {
            let t = z.from_utc_datetime(&utc.naive_utc());
            (t.naive_local(), Some(t.offset().fix().local_minus_utc()))
        }
        None => (utc.naive_utc(), None),
    };
    let mut s = local.format("%Y-%m-%d %H:%M:%S").to_string();
    let frac = micros.rem_euclid(1_000_000);
    if frac > 0 {
        s.push('.');
        s.push_str(format!("{frac:06}").trim_end_matches('0'));
    }
    if let Some(secs) = offset {
        let sign = if secs < 0 { '-' } else { '+' };
        let (h, m) = (secs.abs() / 3600, (secs.abs() / 60) % 60);
        s.push_str(&format!("{sign}{h:02}"));
        if m != 0 {
            s.push_str(&format!(":{m:02}"));
        }
    }
    s
}

/// Postgres's float output (extra_float_digits = 1): the shortest exact digits, in
/// positional form unless the exponent is below -4 or at least `precision` (15 for double
/// precision, 6 for real), then as `d.ddde+XX`.
fn float_text(v: f64, sci: String, precision: i32, positional: String) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return positional;
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    if v != 0.0 && (exp < -4 || exp >= precision) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        positional
    }
}

/// How a statement executes: under its connection's interruptions, with its own memory
/// pool of `memory` bytes.
#[derive(Clone)]
pub struct Exec {
    pub interrupts: Arc<Interrupts>,
    pub memory: usize,
    /// The server's statements' turns (`max_concurrent_statements`).
    pub admission: Arc<super::limits::Admission>,
    /// The session as `pg_stat_activity` shows it (waiting for a turn, rows produced).
    pub activity: Arc<super::activity::Backend>,
}

/// Plans `df` physically and starts it with its own memory pool; the batches end with an
/// error as soon as the statement is interrupted.
pub async fn execute(
    df: DataFrame,
    exec: &Exec,
) -> PgWireResult<impl futures::Stream<Item = Result<RecordBatch, Interrupted>> + Send + 'static> {
    // Its turn first: waiting counts toward the statement's timeout and ends with a cancel.
    // A statement that reads only the catalog takes none (see `needs_turn`).
    let turn = match needs_turn(df.logical_plan()) {
        true => Some(
            exec.interrupts
                .run(exec.admission.enter(exec.activity.queued()))
                .await?,
        ),
        false => None,
    };
    let task = df.task_ctx();
    let runtime = statement_runtime(&task.runtime_env(), exec.memory)
        .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
    let task = Arc::new(task.with_runtime(runtime));
    let physical = exec
        .interrupts
        .run(async {
            df.create_physical_plan()
                .await
                .map_err(|e| PgWireError::ApiError(Box::new(e)))
        })
        .await?;
    let batches = datafusion::physical_plan::execute_stream(physical, task)
        .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
    // The turn is given back with the first batch (the blocking work of sorts, aggregates
    // and join builds is done by then), at the end, or when the stream is dropped: never
    // held while a client reads at its own pace (a cursor, a portal fetched in parts).
    let mut turn = turn;
    let activity = exec.activity.clone();
    Ok(exec.interrupts.clone().guard(batches).map(move |b| {
        turn.take();
        if let Ok(batch) = &b {
            activity.count_rows(batch.num_rows());
        }
        b
    }))
}

/// A task context for a point lookup of `state`, with its own memory pool. A lookup's plan
/// is a scan whose expressions are already compiled, so the context carries no function
/// registry (copying the session's is a good part of a lookup's own cost).
pub fn lookup_task(
    state: &datafusion::execution::SessionState,
    memory: usize,
) -> datafusion::error::Result<Arc<datafusion::execution::TaskContext>> {
    let runtime = statement_runtime(state.runtime_env(), memory)?;
    Ok(Arc::new(datafusion::execution::TaskContext::new(
        None,
        state.session_id().to_string(),
        state.config().clone(),
        Default::default(),
        Default::default(),
        Default::default(),
        runtime,
    )))
}

/// Rows already computed (a point lookup's), encoded as planned for `schema`.
pub fn encode_batches(
    schema: &Schema,
    batches: Vec<RecordBatch>,
    bare: &[bool],
    format: &Format,
    options: Option<Arc<FormatOptions>>,
    time_zone: Option<&str>,
) -> PgWireResult<QueryResponse> {
    let plan = Arc::new(plan(schema, bare, format, options, time_zone)?);
    let fields = plan.fields.clone();
    let rows = stream::iter(batches)
        .map(move |batch| {
            let rows: Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> =
                match plan.convert(batch) {
                    Ok(b) => encode_recordbatch(plan.fields.clone(), b),
                    Err(e) => Box::new(std::iter::once(Err(e))),
                };
            stream::iter(rows)
        })
        .flatten();
    Ok(QueryResponse::new(fields, rows))
}

/// Executes `df` and streams its rows, encoded as planned.
pub async fn encode_dataframe(
    df: DataFrame,
    bare: &[bool],
    format: &Format,
    options: Option<Arc<FormatOptions>>,
    time_zone: Option<&str>,
    exec: &Exec,
) -> PgWireResult<QueryResponse> {
    let plan = Arc::new(plan(
        df.schema().as_arrow(),
        bare,
        format,
        options,
        time_zone,
    )?);
    let batches = execute(df, exec).await?;
    let fields = plan.fields.clone();
    let rows = batches
        .map(move |batch| {
            let rows: Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> = match batch
                .map_err(PgWireError::from)
                .and_then(|b| plan.convert(b))
            {
                Ok(b) => encode_recordbatch(plan.fields.clone(), b),
                Err(e) => Box::new(std::iter::once(Err(e))),
            };
            stream::iter(rows)
        })
        .flatten();
    Ok(QueryResponse::new(fields, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_bare_json_columns_go_out_as_json() -> datafusion::error::Result<()> {
        let jsonb =
            std::collections::HashMap::from([(PG_TYPE_META.to_string(), "jsonb".to_string())]);
        let json =
            std::collections::HashMap::from([(PG_TYPE_META.to_string(), "json".to_string())]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("doc", DataType::Utf8, true).with_metadata(jsonb),
            Field::new("raw", DataType::Utf8, true).with_metadata(json),
        ]));
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_batch("t", RecordBatch::new_empty(schema))?;
        let df = ctx
            .sql("SELECT doc, doc::text AS t, doc AS d2, id, raw FROM t ORDER BY id LIMIT 1")
            .await?;
        let bare = bare_columns(df.logical_plan());
        assert_eq!(bare, vec![true, false, true, true, true]);
        let types = |format: &Format| -> Vec<Type> {
            plan(df.schema().as_arrow(), &bare, format, None, None)
                .map(|p| p.fields.iter().map(|f| f.datatype().clone()).collect())
                .unwrap_or_default()
        };
        let want = vec![Type::JSONB, Type::TEXT, Type::JSONB, Type::INT4, Type::JSON];
        assert_eq!(types(&Format::UnifiedText), want);
        assert_eq!(types(&Format::UnifiedBinary), want);

        let doc: ArrayRef = Arc::new(StringArray::from(vec![Some("{\"a\": 1}"), None]));
        let bin = convert_column(&doc, Conv::JsonbBinary, chrono_tz::Tz::UTC)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        let bin = bin.as_binary::<i32>();
        assert_eq!(bin.value(0), b"\x01{\"a\": 1}");
        assert!(bin.is_null(1));
        let raw = convert_column(&doc, Conv::JsonBinary, chrono_tz::Tz::UTC)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        assert_eq!(raw.as_binary::<i32>().value(0), b"{\"a\": 1}");
        Ok(())
    }

    fn f64_text(v: f64) -> String {
        float_text(v, format!("{v:e}"), 15, v.to_string())
    }

    #[test]
    fn floats_print_like_postgres() {
        assert_eq!(f64_text(1e300), "1e+300");
        assert_eq!(f64_text(1.2345678901234567), "1.2345678901234567");
        assert_eq!(f64_text(0.0001), "0.0001");
        assert_eq!(f64_text(0.00001), "1e-05");
        assert_eq!(f64_text(123456789012345.0), "123456789012345");
        assert_eq!(f64_text(1234567890123456.0), "1.234567890123456e+15");
        assert_eq!(f64_text(-0.0), "-0");
        assert_eq!(f64_text(f64::NEG_INFINITY), "-Infinity");
        let v = 2.5f32;
        assert_eq!(
            float_text(v as f64, format!("{v:e}"), 6, v.to_string()),
            "2.5"
        );
        let v = 1234567.0f32;
        assert_eq!(
            float_text(v as f64, format!("{v:e}"), 6, v.to_string()),
            "1.234567e+06"
        );
    }

    #[test]
    fn timestamps_print_like_postgres() {
        assert_eq!(timestamp_text(0, None), "1970-01-01 00:00:00");
        assert_eq!(
            timestamp_text(1_500_000, Some(chrono_tz::Tz::UTC)),
            "1970-01-01 00:00:01.5+00"
        );
        let ny: chrono_tz::Tz = "America/New_York".parse().unwrap();
        assert_eq!(timestamp_text(0, Some(ny)), "1969-12-31 19:00:00-05");
        let kolkata: chrono_tz::Tz = "Asia/Kolkata".parse().unwrap();
        assert_eq!(
            timestamp_text(0, Some(kolkata)),
            "1970-01-01 05:30:00+05:30"
        );
    }

    #[test]
    fn numerics_encode_like_postgres() {
        // 1234.5 with scale 2: digits [1234, 5000], weight 0.
        assert_eq!(
            numeric_binary(123450, 2),
            vec![0, 2, 0, 0, 0, 0, 0, 2, 0x04, 0xD2, 0x13, 0x88]
        );
        // -0.0001 with scale 4: one digit [1], weight -1, negative.
        assert_eq!(
            numeric_binary(-1, 4),
            vec![0, 1, 255, 255, 0x40, 0, 0, 4, 0, 1]
        );
        // 0 with scale 3.
        assert_eq!(numeric_binary(0, 3), vec![0, 0, 0, 0, 0, 0, 0, 3]);
        // 10000: one digit [1], weight 1.
        assert_eq!(numeric_binary(10000, 0), vec![0, 1, 0, 1, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn times_print_like_postgres() {
        assert_eq!(time_text(45_296_789_000), "12:34:56.789");
        assert_eq!(time_text(0), "00:00:00");
        assert_eq!(time_text(86_399_999_999), "23:59:59.999999");
    }
}
