//! Tests of layouts: parsing what `skippr.yml` says, checking it against a schema, and the
//! Iceberg partition spec and sort order it gives.

use std::sync::Arc;

use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

use super::*;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            )),
            Arc::new(NestedField::optional(
                2,
                "created_at",
                Type::Primitive(PrimitiveType::Timestamptz),
            )),
            Arc::new(NestedField::optional(
                3,
                "customer_id",
                Type::Primitive(PrimitiveType::Int),
            )),
            Arc::new(NestedField::optional(
                4,
                "note",
                Type::Primitive(PrimitiveType::String),
            )),
            Arc::new(NestedField::optional(
                5,
                "on_day",
                Type::Primitive(PrimitiveType::Date),
            )),
        ])
        .build()
        .expect("the test schema builds")
}

#[test]
fn entries_read_as_the_iceberg_spec_and_spark_name_them() {
    let layout = Layout::parse(
        &strings(&[
            "day(created_at)",
            "bucket(16, customer_id)",
            "note",
            "truncate(4, Note)",
        ]),
        &strings(&["created_at", "id DESC", "note asc nulls last"]),
    )
    .expect("a valid layout");
    assert_eq!(
        layout.partition_by,
        vec![
            PartitionEntry {
                column: "created_at".into(),
                transform: Transform::Day
            },
            PartitionEntry {
                column: "customer_id".into(),
                transform: Transform::Bucket(16)
            },
            PartitionEntry {
                column: "note".into(),
                transform: Transform::Identity
            },
            PartitionEntry {
                column: "note".into(),
                transform: Transform::Truncate(4)
            },
        ]
    );
    assert_eq!(
        layout.sort_by,
        vec![
            SortEntry {
                column: "created_at".into(),
                descending: false,
                nulls_first: true
            },
            SortEntry {
                column: "id".into(),
                descending: true,
                nulls_first: false
            },
            SortEntry {
                column: "note".into(),
                descending: false,
                nulls_first: false
            },
        ]
    );
    assert_eq!(
        layout.to_string(),
        "partitioned by day(created_at), bucket(16, customer_id), note, truncate(4, note); \
         sorted by created_at, id desc, note nulls last"
    );
    assert_eq!(Layout::default().to_string(), "unpartitioned");
}

#[test]
fn malformed_entries_are_each_named() {
    let problems = Layout::parse(
        &strings(&[
            "week(created_at)",
            "bucket(0, id)",
            "bucket(id)",
            "day(created_at",
            "day(a b)",
        ]),
        &strings(&["id sideways", ""]),
    )
    .expect_err("every entry is wrong");
    assert_eq!(problems.len(), 7, "{problems:?}");
    assert!(
        problems[0].contains("`week` is not a transform"),
        "{problems:?}"
    );
    assert!(problems[1].contains("above 0"), "{problems:?}");
    assert!(problems[2].contains("bucket(N, c)"), "{problems:?}");
    assert!(problems[3].contains("closing parenthesis"), "{problems:?}");
    assert!(problems[4].contains("not a column name"), "{problems:?}");
    assert!(
        problems[5].contains("[asc|desc] [nulls first|last]"),
        "{problems:?}"
    );
    assert!(problems[6].contains("empty"), "{problems:?}");
    let twice = Layout::parse(&strings(&["day(created_at)", "day(created_at)"]), &[])
        .expect_err("the same field twice");
    assert!(twice[0].contains("twice"), "{twice:?}");
}

#[test]
fn columns_and_types_are_checked_against_the_schema() {
    let s = schema();
    let ok = Layout::parse(
        &strings(&["day(created_at)", "month(on_day)", "bucket(8, id)"]),
        &[],
    )
    .expect("parses");
    assert!(ok.check(&s, "orders").is_ok());
    let bad = Layout::parse(
        &strings(&[
            "day(customer_id)",
            "hour(on_day)",
            "truncate(3, created_at)",
            "missing",
        ]),
        &strings(&["nope"]),
    )
    .expect("parses");
    let problems = bad.check(&s, "orders").expect_err("nothing fits");
    assert_eq!(problems.len(), 5, "{problems:?}");
    assert!(
        problems[0].contains("day(customer_id)` does not fit orders.customer_id"),
        "{problems:?}"
    );
    assert!(problems[0].contains("date or timestamp"), "{problems:?}");
    assert!(problems[1].contains("timestamp column"), "{problems:?}");
    assert!(
        problems[3].contains("not a column of orders (its columns: id, created_at"),
        "{problems:?}"
    );
    assert!(
        problems[4].contains("`sort_by` names `nope`"),
        "{problems:?}"
    );
}

#[test]
fn the_iceberg_spec_and_order_follow_the_layout() {
    let s = schema();
    let layout = Layout::parse(
        &strings(&["day(created_at)", "bucket(8, id)"]),
        &strings(&["created_at desc"]),
    )
    .expect("parses");
    let spec = layout.partition_spec(&s).expect("a spec");
    let fields: Vec<(i32, String, Transform)> = spec
        .fields()
        .iter()
        .map(|f| (f.source_id, f.name.clone(), f.transform))
        .collect();
    assert_eq!(
        fields,
        vec![
            (2, "created_at_day".to_string(), Transform::Day),
            (1, "id_bucket".to_string(), Transform::Bucket(8)),
        ]
    );
    let order = layout.sort_order(&s).expect("an order");
    assert_eq!(order.order_id, 1);
    assert_eq!(order.fields.len(), 1);
    assert_eq!(order.fields[0].source_id, 2);
    assert_eq!(order.fields[0].direction, SortDirection::Descending);
    assert_eq!(order.fields[0].null_order, NullOrder::Last);
    assert!(Layout::default()
        .sort_order(&s)
        .expect("unsorted")
        .fields
        .is_empty());
}
