//! Unit tests of the filter conversion: the filters DataFusion pushes into a scan after its
//! coercion and simplification, as the Iceberg predicates they become.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef, TimeUnit};
use iceberg::expr::Bind;
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use super::*;

fn schema() -> SchemaRef {
    let f = |i: usize, name: &str, t: DataType| {
        Field::new(name, t, true).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_string(),
            i.to_string(),
        )]))
    };
    Arc::new(Schema::new(vec![
        f(1, "id", DataType::Int64),
        f(2, "n", DataType::Int32),
        f(3, "name", DataType::Utf8),
        f(
            4,
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        ),
        f(5, "ts", DataType::Timestamp(TimeUnit::Microsecond, None)),
        f(6, "d", DataType::Date32),
        f(7, "amount", DataType::Decimal128(10, 2)),
        f(8, "ok", DataType::Boolean),
        f(9, "x", DataType::Float64),
    ]))
}

/// The predicate the filters of `SELECT * FROM t WHERE <filter>` convert to, as text.
async fn converted(filter: &str) -> Option<String> {
    let filters = match crate::query::committed::partition_tests::pushed(schema(), filter).await {
        Ok(filters) => filters,
        Err(e) => panic!("planning {filter}: {e}"),
    };
    iceberg_predicate(&filters, &schema()).map(|p| p.to_string())
}

async fn check(filter: &str, want: Option<&str>) {
    let got = converted(filter).await;
    assert_eq!(got.as_deref(), want, "filter: {filter}");
}

#[tokio::test]
async fn comparisons_and_sets_convert_in_the_columns_types() {
    check("id = 5", Some("id = 5")).await;
    check("5 < id", Some("id > 5")).await;
    // A short list is an OR of equalities once DataFusion simplified it.
    check("id IN (1, 2)", Some("(id = 1) OR (id = 2)")).await;
    let long = converted("id IN (1, 2, 3, 4, 5)").await.unwrap_or_default();
    assert!(long.starts_with("id IN ("), "{long}");
    check("n IN (7)", Some("n = 7")).await;
    check("id BETWEEN 3 AND 9", Some("(id >= 3) AND (id <= 9)")).await;
    check("name = 'abc'", Some("name = \"abc\"")).await;
    check("ok", Some("ok = true")).await;
    check("NOT ok", Some("ok = false")).await;
    check("name IS NULL", Some("name IS NULL")).await;
    check("amount >= 10.5", Some("amount >= 10.50")).await;
}

#[tokio::test]
async fn times_and_dates_convert_whatever_unit_the_literal_has() {
    // 2024-01-02 00:00:00 UTC in microseconds.
    let day = 1_704_153_600_000_000i64;
    check(
        "at >= TIMESTAMP '2024-01-02 00:00:00'",
        Some(&format!(
            "at >= {}",
            iceberg::spec::Datum::timestamptz_micros(day)
        )),
    )
    .await;
    check(
        "ts < TIMESTAMP '2024-01-02 00:00:00'",
        Some(&format!(
            "ts < {}",
            iceberg::spec::Datum::timestamp_micros(day)
        )),
    )
    .await;
    check(
        "d >= DATE '2024-01-02'",
        Some(&format!("d >= {}", iceberg::spec::Datum::date(19724))),
    )
    .await;
    // A day of a timestamp is a range of it.
    check(
        "CAST(at AS DATE) = DATE '2024-01-02'",
        Some(&format!(
            "(at >= {}) AND (at <= {})",
            iceberg::spec::Datum::timestamptz_micros(day),
            iceberg::spec::Datum::timestamptz_micros(day + 86_400_000_000 - 1)
        )),
    )
    .await;
    // now() is folded to a nanosecond literal: whatever the plan does with the units, the
    // predicate compares microseconds (a nanosecond value read as microseconds would skip
    // every file).
    let got = converted("at >= now() - INTERVAL '1 day'").await;
    let got = got.unwrap_or_default();
    let micros: i64 = chrono::Utc::now().timestamp_micros() - 86_400_000_000;
    let low = iceberg::spec::Datum::timestamptz_micros(micros - 60_000_000).to_string();
    let high = iceberg::spec::Datum::timestamptz_micros(micros + 60_000_000).to_string();
    let value = got.trim_start_matches("at >= ");
    assert!(got.starts_with("at >= "), "{got}");
    assert!(
        value >= low.as_str() && value <= high.as_str(),
        "{got} not within a minute of {low}"
    );
}

#[tokio::test]
async fn a_prefix_converts_and_other_patterns_do_not() {
    check("name LIKE 'ab%'", Some("name STARTS WITH \"ab\"")).await;
    check("name NOT LIKE 'ab%'", Some("name NOT STARTS WITH \"ab\"")).await;
    check("starts_with(name, 'ab')", Some("name STARTS WITH \"ab\"")).await;
    check("name LIKE '%ab'", None).await;
    check("name ILIKE 'ab%'", None).await;
    // A multi-byte prefix keeps only its lower bound (see `Side::prefix`).
    check("name LIKE 'é%'", Some("name >= \"é\"")).await;
}

#[tokio::test]
async fn what_cannot_be_undone_does_not_convert() {
    // Text order is not number order.
    check("CAST(id AS VARCHAR) < '5'", None).await;
    check("CAST(x AS INT) = 5", None).await;
    // One side of an AND is enough; an OR needs both; a NOT needs an exact inner part.
    check("id = 5 AND x * 2 > 1", Some("id = 5")).await;
    check("id = 5 OR x * 2 > 1", None).await;
}

#[test]
fn only_an_exact_conversion_is_negated() {
    use datafusion::prelude::{col, lit};
    let s = schema();
    let not = |e: Expr| vec![Expr::Not(Box::new(e))];
    let loose = col("id")
        .eq(lit(5i64))
        .and((col("x") * lit(2.0)).gt(lit(1.0)));
    assert!(iceberg_predicate(&not(loose), &s).is_none());
    let tight = col("id").eq(lit(5i64)).and(col("n").eq(lit(2i32)));
    assert_eq!(
        iceberg_predicate(&not(tight), &s).map(|p| p.to_string()),
        Some("NOT ((id = 5) AND (n = 2))".to_string())
    );
    let prefix = col("name").like(lit("é%"));
    assert!(iceberg_predicate(&not(prefix), &s).is_none());
}

#[test]
fn converted_predicates_bind_to_the_iceberg_schema() -> iceberg::Result<()> {
    use iceberg::spec::{NestedField, PrimitiveType, Schema as IcebergSchema, Type};
    let ice = IcebergSchema::builder()
        .with_fields(vec![
            Arc::new(NestedField::optional(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            )),
            Arc::new(NestedField::optional(
                7,
                "amount",
                Type::Primitive(PrimitiveType::Decimal {
                    precision: 10,
                    scale: 2,
                }),
            )),
            Arc::new(NestedField::optional(
                4,
                "at",
                Type::Primitive(PrimitiveType::Timestamptz),
            )),
        ])
        .build()?;
    let filters = vec![
        datafusion::prelude::col("amount").gt_eq(datafusion::prelude::lit(
            ScalarValue::Decimal128(Some(-5), 10, 2),
        )),
        datafusion::prelude::col("at").lt(datafusion::prelude::lit(
            ScalarValue::TimestampMicrosecond(Some(7), Some("+00:00".into())),
        )),
    ];
    let p = iceberg_predicate(&filters, &schema())
        .ok_or_else(|| iceberg::Error::new(iceberg::ErrorKind::Unexpected, "no predicate"))?;
    let bound = p.bind(Arc::new(ice), true)?;
    assert_eq!(
        bound.to_string(),
        "(amount >= -0.05) AND (at < 1970-01-01 00:00:00.000007 UTC)"
    );
    Ok(())
}

#[test]
fn decimal_text_keeps_the_scale() {
    assert_eq!(decimal_text(12345, 2).as_deref(), Some("123.45"));
    assert_eq!(decimal_text(-5, 2).as_deref(), Some("-0.05"));
    assert_eq!(decimal_text(100, 0).as_deref(), Some("100"));
    assert_eq!(decimal_text(0, 3).as_deref(), Some("0.000"));
}
