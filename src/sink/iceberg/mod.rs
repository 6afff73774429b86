//! The Iceberg sink: turns source tables into Iceberg tables (schema, Parquet data files,
//! atomic commits that carry the source LSN they cover).

pub mod apply;
pub mod commit;
pub mod durable;
pub mod evolve;
pub mod keyindex;
pub mod keys;
pub mod maintenance;
pub mod models;
pub mod rowdelta;
pub mod schema;
pub mod writer;

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
    /// The Iceberg field this column writes to.
    pub fn target(&self) -> &str {
        self.field.as_deref().unwrap_or(&self.name)
    }
}
