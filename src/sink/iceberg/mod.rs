//! The Iceberg sink: turns source tables into Iceberg tables (schema, Parquet data files,
//! atomic commits that carry the source LSN they cover).

pub mod apply;
pub mod commit;
pub mod keys;
pub mod rowdelta;
pub mod schema;
pub mod writer;

/// Snapshot summary key: the source LSN the table's current snapshot covers.
pub const SUMMARY_LSN: &str = "skippr.lsn";
/// Snapshot summary key: which phase wrote the snapshot (`snapshot` or `cdc`).
pub const SUMMARY_PHASE: &str = "skippr.phase";
/// Snapshot summary key: the pipeline that wrote the snapshot.
pub const SUMMARY_PIPELINE: &str = "skippr.pipeline";
/// Table property: the source table, `schema.name`.
pub const PROP_SOURCE: &str = "skippr.source";
/// Table property: the primary key columns, comma-separated, in key order.
pub const PROP_PRIMARY_KEY: &str = "skippr.primary-key";
