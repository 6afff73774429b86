//! The pipeline's own bookkeeping, kept in its state folder beside the WAL: which source
//! tables it follows, the LSN through which each is known complete (its watermark, idle
//! tables included), the partitions a partitioned table had when it was copied, and the LSN
//! through which WAL segments have been removed. The snapshot phase reads it to decide which
//! tables must be copied again; the commit loop advances it before it truncates the WAL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::change::Lsn;
use crate::config::TableRef;
use crate::error::{Error, Result};
pub use crate::storage::state_file::StateFile;

/// Version of the file layout; an unknown newer version is refused, never guessed at.
const STATE_VERSION: u32 = 1;

/// What one pipeline knows about its tables, beyond what the Iceberg tables record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineState {
    pub version: u32,
    /// WAL segments whose transactions all end at or before this LSN have been removed: a
    /// table known complete only through an earlier LSN has lost changes.
    #[serde(default, with = "lsn_text")]
    pub wal_removed_through: Lsn,
    /// Followed source tables by `schema.name`. A table that leaves `tables:` leaves this map:
    /// nothing follows it from then on, so when it comes back it is copied again.
    #[serde(default)]
    pub tables: BTreeMap<String, TableState>,
    /// `sync --resnapshot` asked for a new copy of every table: each is copied again and
    /// replaced in one commit, readers seeing it as it was until then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resnapshot: bool,
}

/// One followed table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableState {
    /// Every change of the source table up to this LSN is in its Iceberg table, even when it
    /// had no change for a while (its last commit then records an older LSN).
    #[serde(with = "lsn_text")]
    pub watermark: Lsn,
    /// For a partitioned table: its partitions when it was last copied (see
    /// `TableSchema::partitions`). Attaching or detaching one changes the rows of the table
    /// without any change in the replication stream, so a difference means a new copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    /// Set while a copy consistent with this LSN is under way. Found at the next start, the
    /// copy finished only if the Iceberg table records this LSN (or a later one).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_lsn_text"
    )]
    pub copying_at: Option<Lsn>,
    /// The columns left out of the table when it was copied (`exclude_columns`): another
    /// set now would leave its earlier values in the lake, or its new columns NULL, so it
    /// asks for a new copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<String>,
    /// Copied in key chunks, each in a snapshot of its own: which WAL transactions each
    /// chunk still lacks, until the table has committed past them (see `pipeline::chunks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunked: Option<super::chunks::ChunkFilter>,
    /// A copy in key chunks under way (beside `copying_at`): the chunks already durable,
    /// which the next start goes on from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied: Option<super::chunks::CopyProgress>,
}

/// LSNs are kept as Postgres prints them, so the file reads like `pg_replication_slots`.
pub(super) mod lsn_text {
    use super::Lsn;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(lsn: &Lsn, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&lsn.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let text = String::deserialize(d)?;
        Lsn::parse(&text).map_err(serde::de::Error::custom)
    }
}

mod opt_lsn_text {
    use super::Lsn;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(lsn: &Option<Lsn>, s: S) -> Result<S::Ok, S::Error> {
        match lsn {
            Some(l) => s.serialize_some(&l.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Lsn>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| Lsn::parse(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl PipelineState {
    /// Reads the state; `None` when the pipeline has never written one.
    pub fn load(file: &StateFile) -> Result<Option<Self>> {
        let Some(text) = file.read()? else {
            return Ok(None);
        };
        let state: Self = serde_json::from_slice(&text).map_err(|e| {
            Error::fatal(format!(
                "the pipeline state {} is damaged ({e}); restore it, or run `skipprd sync --resnapshot` to copy every table again",
                file.describe()
            ))
        })?;
        if state.version > STATE_VERSION {
            return Err(Error::fatal(format!(
                "the pipeline state {} was written by a newer skipprd (format {}, this one reads up to {STATE_VERSION}); upgrade skipprd",
                file.describe(),
                state.version
            )));
        }
        Ok(Some(state))
    }

    /// Writes the state atomically and durably (see [`StateFile::write`]): a crash leaves
    /// the old state or the new one, never half of one.
    pub fn save(&self, file: &StateFile) -> Result<()> {
        let mut state = self.clone();
        state.version = STATE_VERSION;
        file.write(serde_json::to_vec_pretty(&state)?.into())
    }

    /// Removes the state (a re-snapshot starts from nothing).
    pub fn remove(file: &StateFile) -> Result<()> {
        file.remove()
    }

    pub fn table(&self, t: &TableRef) -> Option<&TableState> {
        self.tables.get(&t.to_string())
    }

    /// Raises the watermark of a followed table (never lowers it).
    pub fn advance(&mut self, t: &TableRef, lsn: Lsn) {
        if let Some(s) = self.tables.get_mut(&t.to_string()) {
            s.watermark = s.watermark.max(lsn);
        }
    }

    /// Drops the chunk filters no replay can need any more: the WAL they filter is removed
    /// (a table's watermark may pass them while its Iceberg table still records an older
    /// LSN, and the WAL after that LSN is replayed after a crash).
    pub fn drop_spent_filters(&mut self) {
        let removed = self.wal_removed_through;
        for t in self.tables.values_mut() {
            if t.chunked.as_ref().is_some_and(|c| removed >= c.through) {
                t.chunked = None;
            }
        }
    }
}

/// Records, after a commit and before the WAL is truncated through `removing_through`, the
/// watermark of every followed table. Written first so that a crash between the two leaves a
/// state that claims no more than Iceberg holds.
pub fn record_commit(
    path: &StateFile,
    watermarks: &[(TableRef, Lsn)],
    removing_through: Lsn,
) -> Result<()> {
    // The snapshot phase writes the state first; without one there is nothing to advance
    // (and an empty one would read as "no table followed").
    let _one_writer = writing();
    let Some(mut state) = PipelineState::load(path)? else {
        return Ok(());
    };
    let before = state.clone();
    for (t, lsn) in watermarks {
        state.advance(t, *lsn);
    }
    state.wal_removed_through = state.wal_removed_through.max(removing_through);
    state.drop_spent_filters();
    if state != before {
        state.save(path)?;
    }
    Ok(())
}

/// Serialises the read-modify-writes of state files in this process: a copy beside the
/// stream records its chunks while the stream's commits advance the watermarks.
fn writing() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that `table` was copied in key chunks (see [`TableState::chunked`]).
pub fn record_chunks(
    path: &StateFile,
    table: &TableRef,
    filter: super::chunks::ChunkFilter,
) -> Result<()> {
    let _one_writer = writing();
    let mut state = PipelineState::load(path)?.unwrap_or_default();
    let Some(t) = state.tables.get_mut(&table.to_string()) else {
        return Err(Error::fatal(format!(
            "the pipeline state {} does not list {table}, whose copy just ended",
            path.describe()
        )));
    };
    t.chunked = Some(filter);
    state.save(path)
}

/// Records one more chunk of `table`'s copy in key chunks (see [`TableState::copied`]),
/// starting the record with `start` at the first; its files are durable already. Returns how
/// many chunks the copy has recorded.
pub fn record_copied_chunk(
    path: &StateFile,
    table: &TableRef,
    start: impl FnOnce() -> super::chunks::CopyProgress,
    chunk: super::chunks::CopiedChunk,
) -> Result<usize> {
    let _one_writer = writing();
    let mut state = PipelineState::load(path)?.unwrap_or_default();
    let Some(t) = state.tables.get_mut(&table.to_string()) else {
        return Err(Error::fatal(format!(
            "the pipeline state {} does not list {table}, whose copy is under way",
            path.describe()
        )));
    };
    let progress = t.copied.get_or_insert_with(start);
    progress.chunks.push(chunk);
    let recorded = progress.chunks.len();
    state.save(path)?;
    Ok(recorded)
}

/// Takes the pipeline's lease when its WAL and state are on S3, where processes on several
/// machines could otherwise both write it (see [`crate::storage::lease`]). In local mode the
/// file lock of `sync` is enough: `None`.
pub async fn hold_lease(
    config: &crate::config::Config,
    pipeline: &str,
) -> Result<Option<crate::storage::lease::Lease>> {
    use crate::storage::{lease, Location, Store};
    match &config.storage {
        Location::Local(_) => Ok(None),
        s3 => Ok(Some(
            lease::hold_pipeline(Store::open(s3, None)?, pipeline, config.lease).await?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TableRef {
        TableRef {
            schema: "public".into(),
            name: name.into(),
        }
    }

    #[test]
    fn round_trip_and_advance() {
        let dir = tempfile::tempdir().unwrap();
        let path = StateFile::Local(dir.path().join("app.state.json"));
        assert_eq!(PipelineState::load(&path).unwrap(), None);
        let mut s = PipelineState::default();
        s.tables.insert(
            "public.a".into(),
            TableState {
                watermark: Lsn(10),
                partitions: vec!["p".into()],
                copying_at: Some(Lsn(7)),
                excluded: Vec::new(),
                chunked: None,
                copied: None,
            },
        );
        s.save(&path).unwrap();
        record_commit(&path, &[(t("a"), Lsn(30)), (t("gone"), Lsn(40))], Lsn(20)).unwrap();
        record_commit(&path, &[(t("a"), Lsn(25))], Lsn(5)).unwrap();
        let back = PipelineState::load(&path).unwrap().unwrap();
        assert_eq!(back.version, STATE_VERSION);
        assert_eq!(back.table(&t("a")).unwrap().watermark, Lsn(30));
        assert_eq!(back.wal_removed_through, Lsn(20));
        assert_eq!(back.table(&t("a")).unwrap().copying_at, Some(Lsn(7)));
        // A table not followed is not added by a commit.
        assert!(back.table(&t("gone")).is_none());
    }

    #[test]
    fn a_chunk_filter_stays_until_the_wal_it_filters_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = StateFile::Local(dir.path().join("app.state.json"));
        let mut s = PipelineState::default();
        s.tables.insert(
            "public.a".into(),
            TableState {
                copied: None,
                chunked: Some(crate::pipeline::chunks::ChunkFilter {
                    through: Lsn(50),
                    key: "id".into(),
                    chunks: Vec::new(),
                }),
                ..TableState::default()
            },
        );
        s.save(&path).unwrap();
        // The table's watermark passes 50, but the WAL before 50 may still be replayed.
        record_commit(&path, &[(t("a"), Lsn(60))], Lsn(40)).unwrap();
        let back = PipelineState::load(&path).unwrap().unwrap();
        assert!(back.table(&t("a")).unwrap().chunked.is_some());
        record_commit(&path, &[(t("a"), Lsn(70))], Lsn(50)).unwrap();
        let back = PipelineState::load(&path).unwrap().unwrap();
        assert!(back.table(&t("a")).unwrap().chunked.is_none());
    }

    #[test]
    fn damaged_state_is_an_error_that_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = StateFile::Local(dir.path().join("app.state.json"));
        std::fs::write(path.local_path().unwrap(), "{not json").unwrap();
        let e = PipelineState::load(&path).unwrap_err();
        assert!(e.message().contains("--resnapshot"), "{}", e.message());
    }
}
