//! Unit tests of the REST catalog client's pieces that need no catalog: path encoding, the
//! requirements of a commit, and how a round stages changes.

use std::collections::BTreeMap;

use iceberg::spec::{NestedField, PrimitiveType, Schema, SortOrder, Type, UnboundPartitionSpec};
use iceberg::{NamespaceIdent, TableIdent, TableRequirement, TableUpdate};

use super::*;
use crate::catalog::Round;

fn metadata() -> TableMetadata {
    let schema = Schema::builder()
        .with_fields(vec![NestedField::required(
            1,
            "id",
            Type::Primitive(PrimitiveType::Long),
        )
        .into()])
        .build()
        .expect("schema");
    crate::table::fixtures::metadata(
        schema,
        UnboundPartitionSpec::builder().build(),
        SortOrder::unsorted_order(),
    )
}

fn sink() -> RestIcebergSink {
    RestIcebergSink {
        uri: "http://127.0.0.1:9/api/catalog/".into(),
        warehouse: Some("wh".into()),
        credential: None,
        token: Some("t".into()),
        scope: None,
        sigv4: None,
        properties: BTreeMap::new(),
    }
}

#[test]
fn paths_encode_names_and_namespace_levels() {
    assert_eq!(segment("orders"), "orders");
    assert_eq!(segment("a b/c%"), "a%20b%2Fc%25");
    let ns = NamespaceIdent::from_strs(["analytics", "eu"]).expect("ns");
    assert_eq!(namespace_segment(&ns), "analytics%1Feu");
}

#[test]
fn a_data_commit_asserts_the_table_and_its_main_snapshot() {
    let meta = metadata();
    let reqs = requirements(&meta, &[]);
    assert_eq!(
        reqs,
        vec![
            TableRequirement::UuidMatch { uuid: meta.uuid() },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: "main".into(),
                snapshot_id: None
            },
        ]
    );
}

#[test]
fn a_schema_change_also_asserts_the_current_schema() {
    let meta = metadata();
    let updates = vec![TableUpdate::SetCurrentSchema { schema_id: -1 }];
    let reqs = requirements(&meta, &updates);
    assert!(reqs.contains(&TableRequirement::CurrentSchemaIdMatch {
        current_schema_id: meta.current_schema_id()
    }));
    assert!(reqs.contains(&TableRequirement::LastAssignedFieldIdMatch {
        last_assigned_field_id: meta.last_column_id()
    }));
}

#[tokio::test]
async fn a_round_stages_changes_and_merges_a_tables_second_change() {
    let catalog = RestCatalog::new(&sink(), None).expect("catalog");
    assert_eq!(catalog.uri(), "http://127.0.0.1:9/api/catalog");
    let ident = TableIdent::from_strs(["analytics", "orders"]).expect("ident");
    let change = |id: i32| TableChange {
        identifier: None,
        requirements: Vec::new(),
        updates: vec![TableUpdate::SetCurrentSchema { schema_id: id }],
    };
    // Outside a round the change comes back: it is committed on its own.
    assert!(Round::stage("k", &catalog, &ident, change(1)).is_some());
    let round = Round::default();
    round
        .run(async {
            assert!(Round::stage("k", &catalog, &ident, change(1)).is_none());
            assert!(Round::stage("k", &catalog, &ident, change(2)).is_none());
        })
        .await;
    assert_eq!(round.staged_tables(), 1, "one entry per table");
}

#[test]
fn the_glue_shortcut_maps_every_table_to_its_database() {
    let catalog = RestCatalog::new(&sink(), Some("sales_db")).expect("catalog");
    let ident = TableIdent::from_strs(["analytics", "orders"]).expect("ident");
    assert_eq!(
        catalog.remote(&ident),
        TableIdent::from_strs(["sales_db", "orders"]).expect("ident")
    );
    assert_eq!(
        catalog.table_path(&ident),
        "namespaces/sales_db/tables/orders"
    );
}
