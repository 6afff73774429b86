//! Sinks: where changes land after the WAL. Today every sink writes Iceberg tables.

pub mod iceberg;
