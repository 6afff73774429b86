//! Byte ranges of committed Parquet files for the query reader: what a scan or a lookup asks
//! for, read as it asks, merged across gaps only where a request costs more than the bytes.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use iceberg::io::FileRead;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

/// On object storage, ranges closer than this are fetched as one request: a request's
/// latency costs more than the bytes between them.
const REMOTE_GAP_BYTES: u64 = 1 << 20;
/// Remote ranges fetched at once.
const REMOTE_CONCURRENCY: usize = 8;
/// Bytes read from the end of a file for its footer in one go (the page index usually sits
/// just before it and comes with it).
const FOOTER_HINT_BYTES: usize = 64 << 10;

/// A committed file opened for reading.
///
/// Iceberg's own reader merges every pair of ranges closer than 1 MiB. A lookup asks for
/// one page of each column, and the columns' chunks of a row group are each well under
/// 1 MiB apart, so on a local disk it read (and allocated, and faulted in) most of the row
/// group for the 4 pages it decoded. Local files are read range by range; remote ones are
/// merged as before.
pub(super) struct PartReader {
    read: Box<dyn FileRead>,
    size: u64,
    remote: bool,
}

impl PartReader {
    pub(super) fn new(path: &str, read: Box<dyn FileRead>, size: u64) -> Self {
        Self {
            read,
            size,
            remote: is_remote(path),
        }
    }
}

/// Whether `path` is on object storage (a scheme other than the local file system's).
fn is_remote(path: &str) -> bool {
    match path.split_once("://") {
        Some((scheme, _)) => !matches!(scheme, "file" | "memory"),
        None => false,
    }
}

impl AsyncFileReader for PartReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.read
                .read(range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let (gap, concurrency) = if self.remote {
                (REMOTE_GAP_BYTES, REMOTE_CONCURRENCY)
            } else {
                (0, 1)
            };
            let fetch = merge(&ranges, gap);
            let read = &self.read;
            let fetched: Vec<Bytes> = futures::stream::iter(fetch.iter().cloned())
                .map(|r| async move {
                    read.read(r)
                        .await
                        .map_err(|e| ParquetError::External(Box::new(e)))
                })
                .buffered(concurrency)
                .try_collect()
                .await?;
            ranges
                .iter()
                .map(|r| {
                    let i = fetch
                        .partition_point(|f| f.start <= r.start)
                        .saturating_sub(1);
                    let (f, bytes) = (&fetch[i], &fetched[i]);
                    let (start, end) = ((r.start - f.start) as usize, (r.end - f.start) as usize);
                    if end > bytes.len() {
                        return Err(ParquetError::EOF(format!(
                            "expected bytes {}..{} of the file, got {} from {}",
                            r.start,
                            r.end,
                            bytes.len(),
                            f.start
                        )));
                    }
                    Ok(bytes.slice(start..end))
                })
                .collect()
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let mut reader = ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(FOOTER_HINT_BYTES))
                .with_metadata_options(options.map(|o| o.metadata_options().clone()));
            if let Some(o) = options {
                reader = reader
                    .with_column_index_policy(o.column_index_policy())
                    .with_offset_index_policy(o.offset_index_policy());
            }
            let size = self.size;
            Ok(Arc::new(reader.load_and_finish(self, size).await?))
        }
        .boxed()
    }
}

/// `ranges` (in any order) merged where they overlap or lie at most `gap` bytes apart,
/// sorted by start.
fn merge(ranges: &[Range<u64>], gap: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.to_vec();
    sorted.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(gap) => {
                last.end = last.end.max(r.end);
            }
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ranges_are_read_apart_and_remote_ones_merged_across_small_gaps() {
        let asked = [200..300, 0..100, 100..150, 5_000..5_100];
        assert_eq!(merge(&asked, 0), vec![0..150, 200..300, 5_000..5_100]);
        assert_eq!(merge(&asked, 1 << 20), vec![0..5_100]);
        assert_eq!(merge(&[0..100, 50..80], 0), vec![0..100]);
        assert!(merge(&[], 0).is_empty());
    }

    #[test]
    fn object_storage_is_told_from_local_paths() {
        assert!(is_remote("s3://bucket/wh/t/data/a.parquet"));
        assert!(is_remote("gs://bucket/a.parquet"));
        assert!(!is_remote("/var/wh/t/data/a.parquet"));
        assert!(!is_remote("file:///var/wh/a.parquet"));
        assert!(!is_remote("memory://wh/a.parquet"));
    }
}
