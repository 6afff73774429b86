//! Test fixtures of the table layer, for its own tests and those of the catalogs that hold
//! its tables: Iceberg table metadata built in memory, with no catalog or file behind it.

use iceberg::spec::{
    FormatVersion, Schema, SortOrder, TableMetadata, TableMetadataBuilder, UnboundPartitionSpec,
};

/// The metadata of a new V2 table at `file:///tmp/t` with `schema`, partitioned by `spec`
/// and sorted by `order`.
pub fn metadata(schema: Schema, spec: UnboundPartitionSpec, order: SortOrder) -> TableMetadata {
    TableMetadataBuilder::new(
        schema,
        spec,
        order,
        "file:///tmp/t".to_string(),
        FormatVersion::V2,
        Default::default(),
    )
    .expect("builder")
    .build()
    .expect("metadata")
    .metadata
}
