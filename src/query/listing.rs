//! The live files of a committed snapshot, listed once per snapshot from its manifests: a
//! committed scan starts from this listing instead of having Iceberg plan every statement.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result as DfResult};
use iceberg::spec::{DataContentType, Manifest, ManifestStatus, PrimitiveLiteral, Struct};
use iceberg::table::Table;

/// Memory the kept listings may take (a statement reads the current snapshot's; time travel
/// and fenced reads an older one now and then).
const LISTING_BUDGET_BYTES: u64 = 32 << 20;
/// Memory the cache of parsed manifests may hold (a manifest never changes once written,
/// and a new snapshot reuses all but the one or two its commit wrote).
const MANIFEST_BUDGET_BYTES: u64 = 32 << 20;

/// One live data file of a snapshot.
#[derive(Debug, Clone)]
pub(super) struct Listed {
    pub path: String,
    pub size: u64,
    pub rows: u64,
    /// The position delete files that may name rows of it, with their sizes.
    pub deletes: Vec<(String, u64)>,
    /// The manifest's column metrics, by field id.
    pub columns: Arc<FileColumns>,
    /// The partition spec the file was written with, and its partition's values in it.
    pub spec_id: i32,
    pub partition: Struct,
}

/// The live files of one snapshot.
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub files: Vec<Listed>,
    /// Position delete files live in the snapshot (each applies to some of `files`).
    pub delete_files: usize,
}

/// What a data file's manifest entry says of its columns, by field id: the planner's
/// statistics (row counts alone cannot tell a join which side is small, or a filter how
/// much of a table it keeps) and a lookup's file skipping come from here.
pub(super) type FileColumns = HashMap<i32, ColumnMetrics>;

/// One column of one data file, from the manifest.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ColumnMetrics {
    /// The smallest and largest value (a string's may be truncated: still a bound).
    pub lower: Option<PrimitiveLiteral>,
    pub upper: Option<PrimitiveLiteral>,
    pub nulls: Option<u64>,
    /// Bytes of the column in the file, compressed.
    pub size: Option<u64>,
}

impl Listed {
    /// Bytes the entry takes, about.
    fn weight(&self) -> usize {
        let deletes: usize = self.deletes.iter().map(|(p, _)| p.len() + 32).sum();
        let literal = |l: &Option<PrimitiveLiteral>| match l {
            Some(PrimitiveLiteral::String(s)) => s.len(),
            Some(PrimitiveLiteral::Binary(b)) => b.len(),
            _ => 0,
        };
        let columns: usize = self
            .columns
            .values()
            .map(|m| 96 + literal(&m.lower) + literal(&m.upper))
            .sum();
        std::mem::size_of::<Self>()
            + self.path.len()
            + deletes
            + columns
            + 32 * self.partition.fields().len()
    }

    /// Whether the file may hold one of `keys` (sorted) in the integer column `field`.
    pub fn may_hold(&self, field: i32, keys: &[i64]) -> bool {
        let bounds = self
            .columns
            .get(&field)
            .and_then(|m| Some((int(m.lower.as_ref()?)?, int(m.upper.as_ref()?)?)));
        match bounds {
            Some((lo, hi)) => {
                let i = keys.partition_point(|k| *k < lo);
                keys.get(i).is_some_and(|k| *k <= hi)
            }
            None => true,
        }
    }
}

fn int(literal: &PrimitiveLiteral) -> Option<i64> {
    match literal {
        PrimitiveLiteral::Int(v) => Some(i64::from(*v)),
        PrimitiveLiteral::Long(v) => Some(*v),
        _ => None,
    }
}

/// Listings by (table location, snapshot id), and the manifests they were built from.
pub(super) struct Listings {
    /// Statements that arrive while a new snapshot's listing is being built wait for that
    /// one build instead of each reading the manifests.
    snapshots: moka::future::Cache<(String, i64), Arc<Listing>>,
    manifests: moka::sync::Cache<String, Arc<Manifest>>,
}

impl Default for Listings {
    fn default() -> Self {
        Self {
            snapshots: moka::future::Cache::builder()
                .max_capacity(LISTING_BUDGET_BYTES)
                .weigher(|_: &(String, i64), listing: &Arc<Listing>| {
                    u32::try_from(listing.files.iter().map(Listed::weight).sum::<usize>())
                        .unwrap_or(u32::MAX)
                })
                .build(),
            manifests: moka::sync::Cache::builder()
                .max_capacity(MANIFEST_BUDGET_BYTES)
                .weigher(|path: &String, m: &Arc<Manifest>| {
                    u32::try_from(path.len() + 512 * m.entries().len()).unwrap_or(u32::MAX)
                })
                .build(),
        }
    }
}

impl Listings {
    /// The live data files of `table`'s current snapshot (none without a snapshot), each
    /// with the position delete files that apply to it, and whether the listing was built
    /// now (then the caller may drop what it cached of files no longer live).
    pub async fn current(&self, table: &Table) -> DfResult<(Arc<Listing>, bool)> {
        let meta = table.metadata();
        let Some(snapshot) = meta.current_snapshot() else {
            return Ok((Arc::default(), false));
        };
        let key = (meta.location().to_string(), snapshot.snapshot_id());
        if let Some(listing) = self.snapshots.get(&key).await {
            return Ok((listing, false));
        }
        let mut built = false;
        let listing = self
            .snapshots
            .try_get_with(key, async {
                built = true;
                self.build(table, snapshot).await.map(Arc::new)
            })
            .await
            .map_err(DataFusionError::Shared)?;
        Ok((listing, built))
    }

    async fn build(
        &self,
        table: &Table,
        snapshot: &iceberg::spec::SnapshotRef,
    ) -> DfResult<Listing> {
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(|e| listing_err(table, "reading the manifest list", e))?;
        // Each data file with its data sequence number, and each delete file.
        let mut data = Vec::new();
        let mut deletes: Vec<Delete> = Vec::new();
        for mf in list.entries() {
            let manifest = match self.manifests.get(&mf.manifest_path) {
                Some(m) => m,
                None => {
                    let m = Arc::new(
                        mf.load_manifest(table.file_io())
                            .await
                            .map_err(|e| listing_err(table, "reading a manifest", e))?,
                    );
                    self.manifests.insert(mf.manifest_path.clone(), m.clone());
                    m
                }
            };
            for entry in manifest.entries() {
                if entry.status() == ManifestStatus::Deleted {
                    continue;
                }
                let file = entry.data_file();
                let seq = entry.sequence_number().unwrap_or(0);
                match file.content_type() {
                    DataContentType::Data => data.push((
                        Listed {
                            path: file.file_path().to_string(),
                            size: file.file_size_in_bytes(),
                            rows: file.record_count(),
                            deletes: Vec::new(),
                            columns: Arc::new(file_columns(file)),
                            spec_id: mf.partition_spec_id,
                            partition: file.partition().clone(),
                        },
                        seq,
                    )),
                    DataContentType::PositionDeletes => deletes.push(Delete {
                        path: file.file_path().to_string(),
                        size: file.file_size_in_bytes(),
                        seq,
                        only: file.referenced_data_file(),
                        spec_id: mf.partition_spec_id,
                        partition: file.partition().clone(),
                    }),
                    DataContentType::EqualityDeletes => {
                        return Err(DataFusionError::Execution(format!(
                            "Iceberg table {} has equality deletes, which skipprd does not write or apply; it must only be written by skipprd",
                            table.identifier()
                        )))
                    }
                }
            }
        }
        let files: Vec<Listed> = data
            .into_iter()
            .map(|(mut f, seq)| {
                f.deletes = deletes
                    .iter()
                    .filter(|d| d.applies_to(&f, seq))
                    .map(|d| (d.path.clone(), d.size))
                    .collect();
                f
            })
            .collect();
        Ok(Listing {
            files,
            delete_files: deletes.len(),
        })
    }
}

/// A live position delete file, as its manifest entry lists it.
struct Delete {
    path: String,
    size: u64,
    /// Its data sequence number.
    seq: i64,
    /// The one data file it names, when it says so.
    only: Option<String>,
    spec_id: i32,
    partition: Struct,
}

impl Delete {
    /// Iceberg's rule: a position delete file applies to the data files committed at or
    /// before it (by data sequence number), of its own partition (same spec, same values),
    /// and only to the file it names when it names one. Its rows name the file they delete
    /// from, so a file of another partition is never read for it. A delete file of an
    /// unpartitioned spec is read for every data file (more than the rule asks, never less).
    fn applies_to(&self, file: &Listed, seq: i64) -> bool {
        self.seq >= seq
            && self.only.as_ref().is_none_or(|p| *p == file.path)
            && (self.partition.fields().is_empty()
                || (self.spec_id == file.spec_id && self.partition == file.partition))
    }
}

fn listing_err(table: &Table, what: &str, e: iceberg::Error) -> DataFusionError {
    DataFusionError::Execution(format!(
        "listing the files of Iceberg table {}: {what}: {e}",
        table.identifier()
    ))
}

/// A data file's column metrics from its manifest entry, by field id.
fn file_columns(file: &iceberg::spec::DataFile) -> FileColumns {
    let mut out = FileColumns::new();
    for (id, d) in file.lower_bounds() {
        out.entry(*id).or_default().lower = Some(d.literal().clone());
    }
    for (id, d) in file.upper_bounds() {
        out.entry(*id).or_default().upper = Some(d.literal().clone());
    }
    for (id, n) in file.null_value_counts() {
        out.entry(*id).or_default().nulls = Some(*n);
    }
    for (id, n) in file.column_sizes() {
        out.entry(*id).or_default().size = Some(*n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_may_hold_a_key_only_within_its_bounds() {
        let f = Listed {
            path: "a".into(),
            size: 1,
            rows: 1,
            deletes: vec![],
            spec_id: 0,
            partition: Struct::empty(),
            columns: Arc::new(HashMap::from([
                (
                    1,
                    ColumnMetrics {
                        lower: Some(PrimitiveLiteral::Long(10)),
                        upper: Some(PrimitiveLiteral::Long(20)),
                        ..Default::default()
                    },
                ),
                (
                    2,
                    ColumnMetrics {
                        lower: Some(PrimitiveLiteral::String("a".into())),
                        upper: Some(PrimitiveLiteral::String("z".into())),
                        ..Default::default()
                    },
                ),
            ])),
        };
        assert!(f.may_hold(1, &[10]));
        assert!(f.may_hold(1, &[5, 20]));
        assert!(f.may_hold(1, &[15]));
        assert!(!f.may_hold(1, &[9, 21]));
        assert!(!f.may_hold(1, &[]));
        // No integer metrics for the column: the file may hold anything.
        assert!(f.may_hold(2, &[1]));
        assert!(f.may_hold(3, &[1]));
    }
}
