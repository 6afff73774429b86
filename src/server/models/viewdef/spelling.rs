//! A view's definition, Postgres's spellings: identifiers quoted as `quote_identifier`
//! quotes them, type names, and constants as Postgres prints the constant a literal becomes.

use arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{DataType as SqlType, ExactNumberInfo, TimezoneInfo};

/// The family of a type, for Postgres's operators across types: integers meet integers
/// without casts; an integer meets a numeric through a cast Postgres prints.
pub(super) fn family(dt: &DataType) -> u8 {
    match dt {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => 1,
        DataType::Decimal128(..) => 2,
        DataType::Float32 | DataType::Float64 => 3,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => 4,
        DataType::Date32 => 5,
        DataType::Timestamp(_, None) => 6,
        DataType::Timestamp(_, Some(_)) => 7,
        DataType::Boolean => 8,
        _ => 0,
    }
}

/// Postgres's `quote_identifier`: bare when lower case, simple and not a keyword.
pub(super) fn quote(name: &str) -> String {
    if KEYWORDS.split_whitespace().any(|k| k == name) {
        crate::change::table::quote_ident(name)
    } else {
        crate::server::pg::catalog::ident(name)
    }
}

/// Postgres's keywords that `quote_identifier` quotes (reserved, column-name and type-function
/// ones).
const KEYWORDS: &str = "\
    all analyse analyze and any array as asc asymmetric authorization between bigint binary \
    bit boolean both case cast char character check coalesce collate collation column \
    concurrently constraint create cross current_catalog current_date current_role \
    current_schema current_time current_timestamp current_user dec decimal default \
    deferrable desc distinct do else end except exists extract false fetch float for \
    foreign freeze from full grant greatest group grouping having ilike in initially inner \
    inout int integer intersect interval into is isnull join lateral leading least left \
    like limit localtime localtimestamp national natural nchar none normalize not notnull \
    null nullif numeric offset on only or order out outer overlaps overlay placing position \
    precision primary real references returning right row select session_user setof similar \
    smallint some substring symmetric table tablesample then time timestamp to \
    trailing treat trim true union unique user using values varchar variadic verbose when \
    where window with";

/// Postgres's name for the type a column of `dt` has.
pub(super) fn pg_type(dt: &DataType) -> Option<&'static str> {
    Some(match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text",
        DataType::Boolean => "boolean",
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        DataType::Int64 => "bigint",
        DataType::Float32 => "real",
        DataType::Float64 => "double precision",
        DataType::Decimal128(..) => "numeric",
        DataType::Date32 => "date",
        DataType::Time64(_) => "time without time zone",
        DataType::Timestamp(_, None) => "timestamp without time zone",
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone",
        _ => return None,
    })
}

/// Postgres's name for a type written in a cast.
pub(super) fn sql_type(t: &SqlType) -> Option<String> {
    let exact = |name: &str, info: &ExactNumberInfo| match info {
        ExactNumberInfo::None => name.to_string(),
        ExactNumberInfo::Precision(p) => format!("{name}({p},0)"),
        ExactNumberInfo::PrecisionAndScale(p, s) => format!("{name}({p},{s})"),
    };
    Some(match t {
        SqlType::Text | SqlType::String(None) => "text".into(),
        SqlType::Varchar(None) | SqlType::CharacterVarying(None) => "character varying".into(),
        SqlType::Varchar(Some(n)) | SqlType::CharacterVarying(Some(n)) => {
            format!("character varying({n})")
        }
        SqlType::Boolean | SqlType::Bool => "boolean".into(),
        SqlType::SmallInt(None) | SqlType::Int2(None) => "smallint".into(),
        SqlType::Int(None) | SqlType::Integer(None) | SqlType::Int4(None) => "integer".into(),
        SqlType::BigInt(None) | SqlType::Int8(None) => "bigint".into(),
        SqlType::Real | SqlType::Float4 => "real".into(),
        SqlType::DoublePrecision | SqlType::Float8 | SqlType::Double(_) => {
            "double precision".into()
        }
        SqlType::Numeric(info) | SqlType::Decimal(info) | SqlType::Dec(info) => {
            exact("numeric", info)
        }
        SqlType::Date => "date".into(),
        SqlType::Timestamp(None, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            "timestamp without time zone".into()
        }
        SqlType::Timestamp(None, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => {
            "timestamp with time zone".into()
        }
        SqlType::Time(None, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            "time without time zone".into()
        }
        SqlType::Uuid => "uuid".into(),
        SqlType::JSON => "json".into(),
        SqlType::JSONB => "jsonb".into(),
        _ => return None,
    })
}

pub(super) fn is_int4(text: &str) -> bool {
    text.parse::<i32>().is_ok()
}

pub(super) fn string_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A string constant against a column of type `t`, as Postgres prints the constant it
/// becomes; `None` where its spelling would change in ways not followed here.
pub(super) fn typed_string(s: &str, t: &DataType) -> Option<String> {
    Some(match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            format!("{}::text", string_literal(s))
        }
        DataType::Int32 => s.trim().parse::<i32>().ok()?.to_string(),
        DataType::Int16 => format!("'{}'::smallint", s.trim().parse::<i16>().ok()?),
        DataType::Int64 => format!("'{}'::bigint", s.trim().parse::<i64>().ok()?),
        DataType::Boolean => match s.trim().to_ascii_lowercase().as_str() {
            "t" | "true" | "y" | "yes" | "on" | "1" => "true".into(),
            "f" | "false" | "n" | "no" | "off" | "0" => "false".into(),
            _ => return None,
        },
        DataType::Date32 => {
            let d = chrono::NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d").ok()?;
            format!("'{}'::date", d.format("%Y-%m-%d"))
        }
        DataType::Timestamp(_, None) => {
            let s = s.trim();
            let ts = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
                .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f"))
                .ok()
                .or_else(|| {
                    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
                        .ok()
                        .and_then(|d| d.and_hms_opt(0, 0, 0))
                })?;
            let text = ts.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
            let text = text.trim_end_matches('0').trim_end_matches('.');
            format!("'{text}'::timestamp without time zone")
        }
        _ => return None,
    })
}

/// The Arrow type a cast gives, as far as the printer needs to know it.
pub(super) fn cast_type(t: &SqlType) -> Option<DataType> {
    Some(match sql_type(t)?.as_str() {
        "text" | "character varying" => DataType::Utf8,
        "boolean" => DataType::Boolean,
        "smallint" => DataType::Int16,
        "integer" => DataType::Int32,
        "bigint" => DataType::Int64,
        "real" => DataType::Float32,
        "double precision" => DataType::Float64,
        "date" => DataType::Date32,
        n if n.starts_with("numeric") => DataType::Decimal128(38, 10),
        _ => return None,
    })
}
