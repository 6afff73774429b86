//! The table layer: Skippr's Iceberg layout, one definition for the writers (the sink, the
//! models) and the readers (`skipprd query`, the gateway). Both sides meet here:
//!
//! - the table properties Skippr writes and reads (the source table, its primary key, its
//!   columns with their declared Postgres types) and the snapshot summary keys (the LSN a
//!   commit covers, its phase and pipeline, source commit times): [`summary`];
//! - the mapping between source schemas, Iceberg schemas and Arrow schemas: [`schema`];
//! - primary keys as comparable bytes, equal from a data file and from the stream: [`keys`];
//! - what a change does to a table's rows, for the sink and the live tail alike: [`apply`];
//! - how rows are laid out in files, partition spec and sort order: [`layout`];
//! - the tags of consistent cuts, one per cut on every table of a pipeline: [`cuts`].
//!
//! Contract: a writer records a table's layout only through these names and functions, and a
//! reader learns it only from them, so a change of layout (a partition spec, a changelog
//! table) is made once for both.

use std::collections::HashMap;

pub mod apply;
pub mod changelog;
pub mod cuts;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod keys;
pub mod layout;
pub mod partition;
pub mod schema;
pub mod summary;

/// Snapshot summary key: the source LSN the table's current snapshot covers.
pub const SUMMARY_LSN: &str = "skippr.lsn";
/// Snapshot summary key: which phase wrote the snapshot (`snapshot` or `cdc`).
pub const SUMMARY_PHASE: &str = "skippr.phase";
/// Snapshot summary key: the pipeline that wrote the snapshot.
pub const SUMMARY_PIPELINE: &str = "skippr.pipeline";
/// Snapshot summary key of a CDC commit: the end LSN of the first source transaction it
/// holds a change of. The table did not change between its previous snapshot's LSN and
/// this one, which lets time travel answer there after the WAL is gone.
pub const SUMMARY_FIRST_LSN: &str = "skippr.first-lsn";
/// Snapshot summary key of a CDC commit: the source commit time (microseconds since
/// 1970-01-01 UTC) of the transaction at `skippr.lsn`.
pub const SUMMARY_COMMIT_TIME: &str = "skippr.commit-time";
/// Snapshot summary key of a CDC commit: the source commit time of the transaction at
/// `skippr.first-lsn`.
pub const SUMMARY_FIRST_COMMIT_TIME: &str = "skippr.first-commit-time";
/// Postgres commit times count from 2000-01-01; the summary's from 1970-01-01.
pub const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
/// Table property: the source table, `schema.name`.
pub const PROP_SOURCE: &str = "skippr.source";
/// Table property: the primary key columns, comma-separated, in key order.
pub const PROP_PRIMARY_KEY: &str = "skippr.primary-key";
/// Table property: the source columns, in order, with their declared Postgres type oid and
/// modifier (JSON). Schema changes in the stream are detected against it.
pub const PROP_COLUMNS: &str = "skippr.columns";

/// Snapshot summary key of a maintenance commit: what it did (`compaction`).
pub const SUMMARY_MAINTENANCE: &str = "skippr.maintenance";
/// Table property: when the last compaction was committed (Unix milliseconds).
pub const PROP_LAST_COMPACTION: &str = "skippr.last-compaction-ms";
/// Table property: the data sequence number from which on files are written in the table's
/// current sort order (files of earlier sequence numbers follow the order they were written
/// under); absent: every file follows it.
pub const PROP_SORT_ORDER_SINCE: &str = "skippr.sort-order-since";

/// Whether a data file of data sequence number `file_seq` is in the table's current sort order.
pub fn in_current_order(props: &HashMap<String, String>, file_seq: Option<i64>) -> bool {
    let since = props
        .get(PROP_SORT_ORDER_SINCE)
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    file_seq.unwrap_or(0) >= since
}

/// One entry of [`PROP_COLUMNS`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceColumn {
    pub name: String,
    pub oid: u32,
    pub typmod: i32,
    /// The Iceberg field receiving the column when it is not the column's name (a sibling
    /// column after an incompatible type change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The column's number in Postgres (`attnum`): a renamed column keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attnum: Option<i16>,
}

impl SourceColumn {
    /// A source column as the stream or a discovery describes it, written to its own field.
    pub fn new(name: &str, oid: u32, typmod: i32, attnum: Option<i16>) -> Self {
        Self {
            name: name.to_string(),
            oid,
            typmod,
            field: None,
            attnum,
        }
    }

    /// The Iceberg field this column writes to.
    pub fn target(&self) -> &str {
        self.field.as_deref().unwrap_or(&self.name)
    }
}

/// The primary key a table's properties name, in key order; empty for a table without one.
pub fn primary_key(props: &HashMap<String, String>) -> Vec<String> {
    props
        .get(PROP_PRIMARY_KEY)
        .map(|k| {
            k.split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The source columns a table's properties record (`skippr.columns`), in source order;
/// `None` where the table records none, or a record this version cannot read.
pub fn source_columns(props: &HashMap<String, String>) -> Option<Vec<SourceColumn>> {
    props
        .get(PROP_COLUMNS)
        .and_then(|c| serde_json::from_str(c).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_key_reads_in_key_order() {
        let props = HashMap::from([(PROP_PRIMARY_KEY.to_string(), "b,a".to_string())]);
        assert_eq!(primary_key(&props), ["b", "a"]);
        let empty = HashMap::from([(PROP_PRIMARY_KEY.to_string(), String::new())]);
        assert!(primary_key(&empty).is_empty());
        assert!(primary_key(&HashMap::new()).is_empty());
    }

    #[test]
    fn source_columns_read_back_what_was_written() {
        let cols = vec![SourceColumn {
            name: "id".into(),
            oid: 23,
            typmod: -1,
            field: None,
            attnum: Some(1),
        }];
        let props = HashMap::from([(
            PROP_COLUMNS.to_string(),
            serde_json::to_string(&cols).unwrap_or_default(),
        )]);
        assert_eq!(source_columns(&props), Some(cols));
        assert_eq!(source_columns(&HashMap::new()), None);
    }
}
