//! Queries, committed side: the per-process caches of immutable per-file facts (a data
//! file's key column, a delete file's positions, a Parquet footer) that scans and lookups
//! share, so a file is read and parsed once across statements.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, Int64Array};
use datafusion::error::{DataFusionError, Result as DfResult};
use iceberg::io::FileIO;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::PageIndexPolicy;

use super::df_err;
use crate::query::file_read::PartReader;
use crate::query::listing::Listings;

/// Memory the per-process caches of key columns and position deletes may hold.
const CACHE_BUDGET_BYTES: u64 = 192 << 20;
/// A lookup finds its rows through a file's cached key column only up to this size of it
/// (a third of the cache): larger files are searched by their page index instead.
pub(super) const EXACT_MAX_KEY_BYTES: u64 = CACHE_BUDGET_BYTES / 3;
/// Bytes a cached key column takes per row at most: the value, and its place in the
/// key-order permutation when the file is not in key order.
pub(super) const KEY_BYTES_PER_ROW: u64 = 12;
/// Memory the per-process cache of Parquet footers (with their page indexes) may hold.
const META_BUDGET_BYTES: u64 = 64 << 20;
/// An entry no query has read for this long is dropped: a file that compaction replaced or
/// snapshot expiry removed is never read again, and must not hold memory until the budget
/// pushes it out.
const CACHE_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Immutable per-file facts shared by all queries of a process: a data file's key column
/// (single integer keys) and a delete file's positions, by path. Files never change once
/// written, so entries never go stale; they go when idle, when a full listing of their table
/// no longer has them, or past the budget (least recently used first).
pub struct ScanCaches {
    facts: moka::sync::Cache<String, Fact>,
    /// Parsed footers by path: a lookup would otherwise read and parse every candidate
    /// file's footer and page index again for each statement.
    meta: moka::sync::Cache<String, ArrowReaderMetadata>,
    /// Key columns being read, so that concurrent lookups on a file not yet cached read it
    /// once between them.
    pub(super) loading: std::sync::Mutex<HashMap<String, Arc<tokio::sync::OnceCell<KeyColumn>>>>,
    /// Each snapshot's live files, listed once.
    pub(super) listings: Listings,
}

#[derive(Clone)]
enum Fact {
    Keys(KeyColumn),
    Deletes(Arc<HashMap<String, Vec<u64>>>),
}

/// A data file's single integer key column, in file order.
#[derive(Clone)]
pub(super) struct KeyColumn {
    pub(super) values: Arc<Int64Array>,
    /// How the rows of a key are found: by binary search of the values when they ascend
    /// (files compaction and the stream write), else of this permutation, the positions in
    /// key order (a snapshot comes in the source's physical order, which updates reorder).
    /// `None` when the column has nulls or too many rows to search.
    pub(super) search: Option<Search>,
}

#[derive(Clone)]
pub(super) enum Search {
    Ascending,
    Order(Arc<[u32]>),
}

impl KeyColumn {
    pub(super) fn new(values: Int64Array) -> Self {
        let v = values.values();
        let search = if values.null_count() > 0 || u32::try_from(v.len()).is_err() {
            None
        } else if v.windows(2).all(|w| w[0] <= w[1]) {
            Some(Search::Ascending)
        } else {
            // The positions are sorted by the key they point at, in place: sorting (key,
            // position) pairs is up to twice as fast on a shuffled file, but holds 16 bytes a
            // row (80 MiB for 5M rows) on top of the column while it runs. Files out of key
            // order are mostly snapshots in the source's physical order, nearly sorted, where
            // both take the same time.
            let mut order: Vec<u32> = (0..v.len() as u32).collect();
            order.sort_unstable_by_key(|p| v[*p as usize]);
            Some(Search::Order(order.into()))
        };
        Self {
            values: Arc::new(values),
            search,
        }
    }

    /// The positions holding one of `wanted` (sorted), ascending; `None` when the column
    /// cannot be searched.
    pub(super) fn positions(&self, wanted: &[i64]) -> Option<Vec<u64>> {
        let v = self.values.values();
        let mut out = Vec::new();
        match self.search.as_ref()? {
            Search::Ascending => {
                for w in wanted {
                    let from = v.partition_point(|x| x < w);
                    let to = v.partition_point(|x| x <= w);
                    out.extend((from..to).map(|p| p as u64));
                }
            }
            Search::Order(order) => {
                for w in wanted {
                    let from = order.partition_point(|p| v[*p as usize] < *w);
                    let to = order.partition_point(|p| v[*p as usize] <= *w);
                    out.extend(order[from..to].iter().map(|p| u64::from(*p)));
                }
                out.sort_unstable();
            }
        }
        Some(out)
    }

    pub(super) fn memory_size(&self) -> usize {
        let order = match &self.search {
            Some(Search::Order(o)) => o.len() * 4,
            _ => 0,
        };
        self.values.get_array_memory_size() + order
    }
}

impl Fact {
    fn weight(&self) -> usize {
        match self {
            Fact::Keys(k) => k.memory_size(),
            Fact::Deletes(d) => d.iter().map(|(k, v)| k.len() + v.len() * 8 + 64).sum(),
        }
    }
}

impl Default for ScanCaches {
    fn default() -> Self {
        Self {
            facts: moka::sync::Cache::builder()
                .max_capacity(CACHE_BUDGET_BYTES)
                .weigher(|path: &String, fact: &Fact| {
                    u32::try_from(64 + path.len() + fact.weight()).unwrap_or(u32::MAX)
                })
                .time_to_idle(CACHE_IDLE)
                .build(),
            meta: moka::sync::Cache::builder()
                .max_capacity(META_BUDGET_BYTES)
                .weigher(|path: &String, meta: &ArrowReaderMetadata| {
                    u32::try_from(64 + path.len() + meta.metadata().memory_size())
                        .unwrap_or(u32::MAX)
                })
                .time_to_idle(CACHE_IDLE)
                .build(),
            loading: std::sync::Mutex::new(HashMap::new()),
            listings: Listings::default(),
        }
    }
}

impl fmt::Debug for ScanCaches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScanCaches")
    }
}

impl ScanCaches {
    pub(super) fn keys(&self, path: &str) -> Option<KeyColumn> {
        match self.facts.get(path) {
            Some(Fact::Keys(k)) => Some(k),
            _ => None,
        }
    }

    pub(super) fn deletes(&self, path: &str) -> Option<Arc<HashMap<String, Vec<u64>>>> {
        match self.facts.get(path) {
            Some(Fact::Deletes(d)) => Some(d),
            _ => None,
        }
    }

    pub(super) fn put_keys(&self, path: &str, keys: KeyColumn) {
        self.facts.insert(path.to_string(), Fact::Keys(keys));
    }

    pub(super) fn put_deletes(&self, path: &str, deletes: Arc<HashMap<String, Vec<u64>>>) {
        self.facts.insert(path.to_string(), Fact::Deletes(deletes));
    }

    /// A file's parsed footer; with `page_index`, only one that holds the page index.
    pub(super) fn meta(&self, path: &str, page_index: bool) -> Option<ArrowReaderMetadata> {
        self.meta.get(path).filter(|m| {
            !page_index
                || (m.metadata().column_index().is_some() && m.metadata().offset_index().is_some())
        })
    }

    pub(super) fn put_meta(&self, path: &str, meta: ArrowReaderMetadata) {
        self.meta.insert(path.to_string(), meta);
    }

    /// Drops the entries of files under `location` that none of `files` (a full listing:
    /// each data file with its delete files) names.
    pub(super) fn keep_only<'a>(
        &self,
        location: &str,
        files: impl Iterator<Item = (&'a str, &'a [(String, u64)])>,
    ) {
        let live: HashSet<&str> = files
            .flat_map(|(path, deletes)| {
                std::iter::once(path).chain(deletes.iter().map(|(p, _)| p.as_str()))
            })
            .collect();
        self.forget_dead(location, &live);
    }

    /// Drops the entries of files under `location` (a table's folder) that `live` (every
    /// data and delete file of its current snapshot) no longer lists.
    pub(super) fn forget_dead(&self, location: &str, live: &HashSet<&str>) {
        let prefix = format!("{}/", location.trim_end_matches('/'));
        for (path, _) in self.facts.iter() {
            if path.starts_with(&prefix) && !live.contains(path.as_str()) {
                self.facts.invalidate(path.as_str());
            }
        }
        for (path, _) in self.meta.iter() {
            if path.starts_with(&prefix) && !live.contains(path.as_str()) {
                self.meta.invalidate(path.as_str());
            }
        }
    }

    /// Entries held (after pending evictions run), for tests.
    #[cfg(test)]
    pub(super) fn len(&self) -> u64 {
        self.facts.run_pending_tasks();
        self.meta.run_pending_tasks();
        self.facts.entry_count() + self.meta.entry_count()
    }
}

/// A file's parsed footer, from the cache or read (and cached). With `page_index`, its
/// offset and column indexes are read too.
pub(super) async fn footer(
    file_io: &FileIO,
    caches: &ScanCaches,
    path: &str,
    size: u64,
    page_index: bool,
) -> DfResult<(PartReader, ArrowReaderMetadata)> {
    let input = file_io.new_input(path).map_err(df_err)?;
    let read = input.reader().await.map_err(df_err)?;
    let mut reader = PartReader::new(path, read, size);
    if let Some(meta) = caches.meta(path, page_index) {
        return Ok((reader, meta));
    }
    // Files written elsewhere may have no page index: then every page is read.
    let policy = if page_index {
        PageIndexPolicy::Optional
    } else {
        PageIndexPolicy::Skip
    };
    let options = ArrowReaderOptions::new().with_page_index_policy(policy);
    let meta = ArrowReaderMetadata::load_async(&mut reader, options)
        .await
        .map_err(|e| DataFusionError::Execution(format!("reading Parquet file {path}: {e}")))?;
    caches.put_meta(path, meta.clone());
    Ok((reader, meta))
}
