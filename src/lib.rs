//! Skippr: live SQL over data that streams from Postgres into Apache Iceberg.
//!
//! The modules follow the data: `config` describes the pipelines, `source` reads Postgres
//! (snapshot, then changes), `sink` writes Iceberg tables registered in a `catalog` in the
//! layout `table` defines for writers and readers alike, and `query` answers SQL over them. `pipeline` runs a source into a sink; `cli` and
//! `telemetry` serve the binary.

pub mod error;

pub mod change;

pub mod storage;

pub mod catalog;
pub mod config;
pub mod query;
pub mod sink;
pub mod source;
pub mod table;
pub mod wal;

pub mod cli;
pub mod pipeline;
pub mod serve;
pub mod server;
pub mod status;
pub mod supervise;
pub mod task;
pub mod telemetry;

#[cfg(test)]
mod testing;
