//! Atomic commits to Iceberg: new data files and the source LSN they cover land in one
//! snapshot, so a reader (and a restart) sees either all of a batch or none of it.

use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::rowdelta;
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::error::{Context, Result};
pub use crate::table::summary::{committed_lsn, committed_pipeline, last_skippr_snapshot, summary};

/// Commits `files` in one snapshot whose summary records `lsn` and the writing phase:
/// appended, or with `replace_all` replacing every file of the table (a table copied again:
/// readers see the old rows or the new ones, never a mix). The files and the new metadata
/// are fsynced before the catalog swap (see [`rowdelta::commit`]).
pub async fn commit_files(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    replace_all: bool,
    lsn: Lsn,
    phase: &str,
    pipeline: &str,
) -> Result<Table> {
    let files = rowdelta::NewFiles::data(files, replace_all, summary(lsn, phase, pipeline));
    rowdelta::commit(catalog, table, files, &rowdelta::Specs::new())
        .await
        .with_context(|| format!("committing to Iceberg table {}", table.identifier()))
}
