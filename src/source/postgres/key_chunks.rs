//! The copy of one table in key order, in short transactions: its integer key's range cut
//! into chunks, each copied in a transaction of its own that records what its snapshot saw
//! (`pg_current_snapshot()`), so that no snapshot is held for longer than one chunk. The
//! pipeline then applies, per chunk, exactly the WAL transactions that chunk's snapshot did
//! not see (see `pipeline::chunks`). Rows go to the same [`CopyTarget`] as a snapshot's.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::connect::connect;
use super::snapshot::{copy_rows, ChunkWriter, CopyJob, CopyTarget};
use crate::change::types::PgType;
use crate::config::{quote_ident, PostgresConfig};
use crate::error::{Context, Error, Result};

/// Rows a chunk takes on, by Postgres's estimate: a chunk's transaction lasts a fraction of a
/// second.
const CHUNK_ROWS: i64 = 100_000;

/// One chunk: the keys `lo <= key < hi` (an open end has no bound), and what the snapshot of
/// the transaction that copied it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSeen {
    pub lo: Option<i64>,
    pub hi: Option<i64>,
    /// `pg_current_snapshot()` of the chunk's transaction: transactions below `xmin` had
    /// ended, those at or above `xmax` had not started, those in `xip` were in progress.
    pub xmin: u64,
    pub xmax: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xip: Vec<u64>,
}

impl ChunkSeen {
    /// Whether the key falls in this chunk.
    pub fn holds(&self, key: i64) -> bool {
        self.lo.is_none_or(|lo| key >= lo) && self.hi.is_none_or(|hi| key < hi)
    }

    /// Whether the committed transaction `xid` (the 32-bit id the change stream carries) was
    /// visible to this chunk's snapshot, so that the chunk's rows already hold its changes.
    pub fn saw(&self, xid: u32) -> bool {
        // The full id of `xid` is the one nearest the snapshot's `xmax` (the transactions in
        // question ran around the copy, far less than 2^31 ids away).
        let xmax = i128::from(self.xmax);
        let base = i128::from(self.xmax & !0xffff_ffff) | i128::from(xid);
        let full = [base - (1 << 32), base, base + (1 << 32)]
            .into_iter()
            .min_by_key(|c| (c - xmax).abs())
            .unwrap_or(base);
        let (xmin, xip) = (i128::from(self.xmin), &self.xip);
        full < xmin || (full < xmax && !xip.iter().any(|x| i128::from(*x) == full))
    }

    /// A chunk whose snapshot saw every transaction below `xmax` (none in progress).
    #[cfg(test)]
    pub fn seen_below(lo: Option<i64>, hi: Option<i64>, xmax: u64) -> Self {
        Self {
            lo,
            hi,
            xmin: 5.min(xmax),
            xmax,
            xip: vec![],
        }
    }

    /// Parses `pg_current_snapshot()::text` (`xmin:xmax:xip,xip`).
    fn parse(text: &str, lo: Option<i64>, hi: Option<i64>) -> Result<Self> {
        let bad = || {
            Error::fatal(format!(
                "pg_current_snapshot() returned `{text}`, which skipprd cannot read"
            ))
        };
        let mut parts = text.trim().split(':');
        let xmin = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let xmax = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let xip = match parts.next() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|x| x.parse().map_err(|_| bad()))
                .collect::<Result<Vec<u64>>>()?,
        };
        Ok(Self {
            lo,
            hi,
            xmin,
            xmax,
            xip,
        })
    }
}

/// Waits until a new snapshot sees every transaction the exported snapshot `name` sees (its
/// slot's consistent point treats a transaction as committed once its commit record is in
/// the WAL; a new snapshot sees it only once it has finished committing, e.g. after a
/// synchronous standby answered). From then on every chunk's snapshot sees at least what the
/// exported one saw, so no transaction before the consistent point is missing from a chunk.
pub async fn settle(cfg: &PostgresConfig, name: &str) -> Result<()> {
    let client = connect(cfg).await?;
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .context("starting a transaction to read the copy's starting snapshot")?;
    client
        .batch_execute(&format!("SET TRANSACTION SNAPSHOT '{name}'"))
        .await
        .with_context(|| format!("importing snapshot {name}"))?;
    let exported = ChunkSeen::parse(&current_snapshot(&client).await?, None, None)?;
    client
        .batch_execute("COMMIT")
        .await
        .context("ending the transaction that read the copy's starting snapshot")?;
    let started = std::time::Instant::now();
    loop {
        let now = ChunkSeen::parse(&current_snapshot(&client).await?, None, None)?;
        let finishing: Vec<u64> = now
            .xip
            .iter()
            .filter(|x| **x < exported.xmax && !exported.xip.contains(x))
            .copied()
            .collect();
        if finishing.is_empty() {
            return Ok(());
        }
        if started.elapsed() > std::time::Duration::from_secs(600) {
            return Err(Error::retryable(format!(
                "transactions {finishing:?} have written their commit but have not finished committing for 10 minutes (a synchronous standby that does not answer?); the copy waits for them"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

async fn current_snapshot(client: &tokio_postgres::Client) -> Result<String> {
    client
        .query_one("SELECT pg_current_snapshot()::text", &[])
        .await
        .context("reading pg_current_snapshot() (Postgres 13 or later)")?
        .try_get(0)
        .context("reading pg_current_snapshot()")
}

/// The key column a table can be copied in key chunks by: the first column of its primary
/// key, when it is an integer. `None` for other tables (copied in one snapshot).
pub fn chunk_key(job: &CopyJob) -> Option<String> {
    let first = job.schema.primary_key.first()?;
    let column = job.schema.columns.iter().find(|c| &c.name == first)?;
    matches!(column.pg, PgType::Int2 | PgType::Int4 | PgType::Int8).then(|| first.clone())
}

/// Cuts `min..=max` into about `rows / CHUNK_ROWS` ranges; the first and last are open, so
/// that keys written after the bounds were read are copied too.
fn ranges(min: i64, max: i64, rows: i64) -> Vec<(Option<i64>, Option<i64>)> {
    let n = (rows / CHUNK_ROWS + 1).clamp(1, 100_000) as i128;
    let span = i128::from(max) - i128::from(min) + 1;
    let width = ((span + n - 1) / n).max(1);
    let mut out = Vec::new();
    let mut lo: Option<i64> = None;
    let mut next = i128::from(min) + width;
    while next <= i128::from(max) {
        let hi = next as i64;
        out.push((lo, Some(hi)));
        lo = Some(hi);
        next += width;
    }
    out.push((lo, None));
    out
}

/// Copies `job` (table number `index` of `target`) in key chunks on `cfg.snapshot_parallelism`
/// connections; returns what each worker's writer finished with and every chunk's snapshot.
/// Rows copied so far are added to `counter`.
pub async fn copy_in_key_chunks<T: CopyTarget>(
    cfg: &PostgresConfig,
    job: Arc<CopyJob>,
    index: usize,
    key: &str,
    target: Arc<T>,
    counter: Arc<AtomicU64>,
) -> Result<(Vec<<T::Writer as ChunkWriter>::Done>, Vec<ChunkSeen>)> {
    let table = &job.schema.table;
    let client = connect(cfg).await?;
    let row = client
        .query_one(
            &format!(
                "SELECT min({k})::int8, max({k})::int8 FROM {t}",
                k = quote_ident(key),
                t = table.quoted()
            ),
            &[],
        )
        .await
        .with_context(|| format!("reading the key range of {table}"))?;
    let (min, max): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
    let plan = match (min, max) {
        // Without an estimate (a table never analyzed), keys are taken to be dense.
        (Some(min), Some(max)) => {
            let rows = match job.schema.row_estimate {
                r if r > 0 => r,
                _ => max.saturating_sub(min).saturating_add(1),
            };
            ranges(min, max, rows)
        }
        _ => vec![(None, None)],
    };
    drop(client);
    let queue = Arc::new(Mutex::new(plan.into_iter().collect::<VecDeque<_>>()));
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let mut workers = JoinSet::new();
    for w in 0..cfg.snapshot_parallelism.max(1) {
        let (cfg, job, key, queue, target, counter) = (
            cfg.clone(),
            Arc::clone(&job),
            key.to_string(),
            Arc::clone(&queue),
            Arc::clone(&target),
            Arc::clone(&counter),
        );
        let prefix = format!("snap-{run_id}-{w:04}");
        workers.spawn(async move {
            let mut writer = target.writer(index, prefix).await?;
            let client = connect(&cfg).await?;
            let mut seen = Vec::new();
            loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                let Some((lo, hi)) = next else {
                    break;
                };
                seen.push(copy_chunk(&client, &job, &key, lo, hi, &mut writer, &counter).await?);
            }
            Ok::<_, Error>((writer.finish().await?, seen))
        });
    }
    let mut done = Vec::new();
    let mut seen = Vec::new();
    while let Some(joined) = workers.join_next().await {
        let (d, s) =
            joined.map_err(|e| Error::fatal(format!("a copy task of {table} failed: {e}")))??;
        done.push(d);
        seen.extend(s);
    }
    seen.sort_by_key(|c| c.lo);
    Ok((done, seen))
}

/// One chunk, in a transaction of its own: its snapshot, then its rows.
async fn copy_chunk<W: ChunkWriter>(
    client: &tokio_postgres::Client,
    job: &CopyJob,
    key: &str,
    lo: Option<i64>,
    hi: Option<i64>,
    writer: &mut W,
    counter: &AtomicU64,
) -> Result<ChunkSeen> {
    let table = &job.schema.table;
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .with_context(|| format!("starting a chunk of the copy of {table}"))?;
    // The first statement takes the transaction's snapshot; the COPY reads in the same one.
    let snapshot: String = client
        .query_one("SELECT pg_current_snapshot()::text", &[])
        .await
        .with_context(|| {
            format!("reading the snapshot of a chunk of {table} (Postgres 13 or later)")
        })?
        .get(0);
    let seen = ChunkSeen::parse(&snapshot, lo, hi)?;
    let k = quote_ident(key);
    let mut conds = Vec::new();
    if let Some(lo) = lo {
        conds.push(format!("{k} >= {lo}"));
    }
    if let Some(hi) = hi {
        conds.push(format!("{k} < {hi}"));
    }
    copy_rows(client, job, &conds, writer, counter).await?;
    client
        .batch_execute("COMMIT")
        .await
        .with_context(|| format!("ending a chunk of the copy of {table}"))?;
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_key_once() {
        let r = ranges(1, 1_000, 350_000);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0], (None, Some(251)));
        assert_eq!(r[3], (Some(751), None));
        let chunks: Vec<ChunkSeen> = r
            .iter()
            .map(|(lo, hi)| ChunkSeen {
                lo: *lo,
                hi: *hi,
                xmin: 0,
                xmax: 0,
                xip: vec![],
            })
            .collect();
        for key in [-5, 1, 250, 251, 1_000, 9_999] {
            assert_eq!(chunks.iter().filter(|c| c.holds(key)).count(), 1, "{key}");
        }
        assert_eq!(ranges(7, 7, 10), vec![(None, None)]);
        assert_eq!(ranges(i64::MIN, i64::MAX, 1_000_000).len(), 11);
    }

    #[test]
    fn a_snapshot_saw_what_ended_before_it() {
        let s = ChunkSeen::parse("100:105:101,103", None, None).unwrap();
        assert!(s.saw(99) && s.saw(100) && s.saw(102) && s.saw(104));
        assert!(!s.saw(101) && !s.saw(103) && !s.saw(105) && !s.saw(200));
        // Across a wraparound of the 32-bit ids the stream carries.
        let w = ChunkSeen::parse(
            &format!("{}:{}:", (1u64 << 32) - 2, (1u64 << 32) + 3),
            None,
            None,
        )
        .unwrap();
        assert!(w.saw(u32::MAX - 5) && w.saw(u32::MAX) && w.saw(1));
        assert!(!w.saw(3) && !w.saw(10));
        assert!(ChunkSeen::parse("x:y:", None, None).is_err());
    }
}
