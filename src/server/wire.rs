//! Gateway, results on the wire: Arrow results become Postgres rows with Postgres types.
//! Most types are encoded by arrow-pg; uuid columns (Arrow `FixedSizeBinary(16)`) are sent
//! as `uuid` (its text form, or its 16 bytes in binary format), and numerics wider than the
//! binary encoder handles are sent in their exact text form.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::prelude::DataFrame;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use futures::{stream, StreamExt};
use pgwire::api::portal::Format;
use pgwire::api::results::{FieldFormat, FieldInfo, QueryResponse};
use pgwire::api::Type;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::types::format::FormatOptions;

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
}

/// Field descriptions and conversions for a result schema.
pub struct WirePlan {
    pub fields: Arc<Vec<FieldInfo>>,
    convs: Vec<Conv>,
    schema: SchemaRef,
}

/// Plans how `schema` goes on the wire in `format`.
pub fn plan(
    schema: &Schema,
    format: &Format,
    options: Option<Arc<FormatOptions>>,
) -> PgWireResult<WirePlan> {
    let mut convs = Vec::with_capacity(schema.fields().len());
    let mut wire_fields: Vec<Field> = Vec::with_capacity(schema.fields().len());
    for (i, f) in schema.fields().iter().enumerate() {
        let binary = format.format_for(i) == FieldFormat::Binary;
        let (conv, dt) = match f.data_type() {
            DataType::FixedSizeBinary(16) if binary => (Conv::UuidBinary, DataType::Binary),
            DataType::FixedSizeBinary(16) => (Conv::UuidText, DataType::Utf8),
            DataType::Decimal128(p, _) if *p > MAX_ENCODED_DIGITS && !binary => {
                (Conv::DecimalText, DataType::Utf8)
            }
            other => (Conv::None, other.clone()),
        };
        convs.push(conv);
        wire_fields.push(Field::new(f.name(), dt, f.is_nullable()));
    }
    let wire_schema = Arc::new(Schema::new(wire_fields));
    let base = arrow_schema_to_pg_fields(&wire_schema, format, options.clone())?;
    let fields = base
        .into_iter()
        .zip(&convs)
        .map(|(f, conv)| {
            let ty = match conv {
                Conv::UuidText | Conv::UuidBinary => Type::UUID,
                Conv::DecimalText => Type::NUMERIC,
                Conv::None => return f,
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
            .map(|(col, conv)| convert_column(col, *conv))
            .collect::<PgWireResult<_>>()?;
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| PgWireError::ApiError(Box::new(e)))
    }
}

fn convert_column(col: &ArrayRef, conv: Conv) -> PgWireResult<ArrayRef> {
    Ok(match conv {
        Conv::None => col.clone(),
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
    })
}

/// Executes `df` and streams its rows, encoded as planned.
pub async fn encode_dataframe(
    df: DataFrame,
    format: &Format,
    options: Option<Arc<FormatOptions>>,
) -> PgWireResult<QueryResponse> {
    let plan = Arc::new(plan(df.schema().as_arrow(), format, options)?);
    let batches = df
        .execute_stream()
        .await
        .map_err(|e| PgWireError::ApiError(Box::new(e)))?;
    let fields = plan.fields.clone();
    let rows = batches
        .map(move |batch| {
            let rows: Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> =
                match batch
                    .map_err(|e| PgWireError::ApiError(Box::new(e)))
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
