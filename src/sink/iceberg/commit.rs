//! Atomic commits to Iceberg: new data files and the source LSN they cover land in one
//! snapshot, so a reader (and a restart) sees either all of a batch or none of it.

use std::collections::HashMap;

use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::rowdelta;
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::error::{Context, Result};
pub use crate::table::summary::{committed_lsn, committed_pipeline, last_skippr_snapshot, summary};

/// Appends `files` in one snapshot whose summary records `lsn` and the writing phase. The
/// files and the new metadata are fsynced before the catalog swap (see [`rowdelta::commit`]).
pub async fn append(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    lsn: Lsn,
    phase: &str,
    pipeline: &str,
) -> Result<Table> {
    commit_files(catalog, table, files, false, summary(lsn, phase, pipeline)).await
}

/// Replaces every file of the table with `files` in one snapshot (a table copied again):
/// readers see the old rows or the new ones, never a mix.
pub async fn replace(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    lsn: Lsn,
    phase: &str,
    pipeline: &str,
) -> Result<Table> {
    commit_files(catalog, table, files, true, summary(lsn, phase, pipeline)).await
}

async fn commit_files(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    replace_all: bool,
    props: HashMap<String, String>,
) -> Result<Table> {
    rowdelta::commit(
        catalog,
        table,
        files,
        Vec::new(),
        replace_all,
        props,
        &rowdelta::Specs::new(),
    )
    .await
    .with_context(|| format!("committing to Iceberg table {}", table.identifier()))
}
