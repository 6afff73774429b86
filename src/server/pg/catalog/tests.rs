//! Unit tests of the gateway's pg_catalog: schema oids that stay put, oids remapped by name.

use super::extended::remap_oids;
use super::*;
use arrow::datatypes::{Int32Type, Schema};

#[test]
fn schema_oids_stay_the_same() {
    let ns = Namespaces::default();
    assert_eq!(ns.oid("pg_catalog"), 11);
    assert_eq!(ns.oid("public"), 2200);
    let a = ns.oid("analytics");
    let b = ns.oid("skippr");
    assert_ne!(a, b);
    assert_eq!(ns.oid("analytics"), a);
    assert!((NAMESPACE_OID_BASE..INDEX_OID_BASE).contains(&a));
}

#[test]
fn oids_are_remapped_by_name() -> DfResult<()> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("oid", DataType::Int32, false),
        Field::new("nspname", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(arrow::array::Int32Array::from(vec![16390, 16391])),
            Arc::new(arrow::array::StringArray::from(vec!["pg_catalog", "other"])),
        ],
    )?;
    let out = remap_oids(batch, "oid", |_, name| {
        (name == Some("pg_catalog")).then_some(11)
    })?;
    let oids = out.column(0).as_primitive::<Int32Type>();
    assert_eq!((oids.value(0), oids.value(1)), (11, 16391));
    assert_eq!(out.schema().field(0).data_type(), &DataType::Int32);
    Ok(())
}
