//! The Iceberg sink: turns source tables into Iceberg tables (schema, Parquet data files,
//! atomic commits that carry the source LSN they cover). The layout it writes (properties,
//! summary keys, schema mapping, key encoding) is the table layer's (`crate::table`).

pub mod apply;
pub mod commit;
pub mod durable;
pub mod evolve;
pub mod keyindex;
pub mod maintenance;
pub mod models;
pub mod reshape;
pub mod rowdelta;
pub mod staged;
pub mod writer;

pub use crate::table::{
    keys, schema, SourceColumn, PG_EPOCH_MICROS, PROP_COLUMNS, PROP_PRIMARY_KEY, PROP_SOURCE,
    SUMMARY_COMMIT_TIME, SUMMARY_FIRST_COMMIT_TIME, SUMMARY_FIRST_LSN, SUMMARY_LSN, SUMMARY_PHASE,
    SUMMARY_PIPELINE,
};
