//! Atomic commits to Iceberg: new data files and the source LSN they cover land in one
//! snapshot, so a reader (and a restart) sees either all of a batch or none of it.

use std::collections::HashMap;

use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::Catalog;

use super::{SUMMARY_LSN, SUMMARY_PHASE, SUMMARY_PIPELINE};
use crate::change::Lsn;
use crate::error::{Context, Result};

/// Appends `files` in one snapshot whose summary records `lsn` and the writing phase.
pub async fn append(
    catalog: &dyn Catalog,
    table: &Table,
    files: Vec<DataFile>,
    lsn: Lsn,
    phase: &str,
    pipeline: &str,
) -> Result<Table> {
    let props = HashMap::from([
        (SUMMARY_LSN.to_string(), lsn.to_string()),
        (SUMMARY_PHASE.to_string(), phase.to_string()),
        (SUMMARY_PIPELINE.to_string(), pipeline.to_string()),
    ]);
    let tx = Transaction::new(table);
    let action = tx
        .fast_append()
        .with_check_duplicate(false)
        .set_snapshot_properties(props)
        .add_data_files(files);
    let tx = action.apply(tx)?;
    tx.commit(catalog)
        .await
        .with_context(|| format!("committing to Iceberg table {}", table.identifier()))
}

/// The source LSN covered by the table's current snapshot, if it has one written by us.
pub fn committed_lsn(table: &Table) -> Option<Lsn> {
    table
        .metadata()
        .current_snapshot()
        .and_then(|s| s.summary().additional_properties.get(SUMMARY_LSN).cloned())
        .and_then(|v| Lsn::parse(&v).ok())
}
