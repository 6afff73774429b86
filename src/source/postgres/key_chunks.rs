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
use crate::task::AbortOnDrop;

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

/// Chunks of one table's copy, at most: beyond it chunks grow past `snapshot_chunk_rows`,
/// so that the record of a copy's chunks (rewritten as each ends) stays small.
const MAX_CHUNKS: i64 = 2_000;

/// A range of keys, `lo <= key < hi`; an open end has no bound.
pub type KeyRange = (Option<i64>, Option<i64>);

/// Cuts `min..=max` into about `rows / chunk_rows` ranges of equal key span; the first and
/// last are open, so that keys written after the bounds were read are copied too.
#[cfg(test)]
fn ranges(min: i64, max: i64, rows: i64, chunk_rows: i64) -> Vec<KeyRange> {
    plan(&[min, max.saturating_add(1)], rows, chunk_rows, max)
}

/// Cuts the keys into ranges of about `chunk_rows` rows each, `rows` in all, by the key's
/// equal-depth histogram `bounds` (Postgres's `pg_stats.histogram_bounds`, about as many
/// rows between each two bounds; two bounds, the least and past the greatest key, for keys
/// taken to be dense). Keys above the last bound up to `max` (written since the histogram was
/// made) are taken to be as dense as the histogram's. The first and last ranges are open.
fn plan(bounds: &[i64], rows: i64, chunk_rows: i64, max: i64) -> Vec<KeyRange> {
    let (Some(&first), Some(&last)) = (bounds.first(), bounds.last()) else {
        return vec![(None, None)];
    };
    let m = bounds.len().saturating_sub(1).max(1);
    let mut edges: Vec<i128> = bounds.iter().map(|b| i128::from(*b)).collect();
    if edges.len() == 1 {
        edges.push(edges[0] + 1);
    }
    let per_bucket = rows.max(1) as f64 / m as f64;
    // Keys beyond the histogram: more buckets of the histogram's mean width.
    let width = ((i128::from(last) - i128::from(first)) / m as i128).max(1);
    let beyond = i128::from(max) - i128::from(last);
    if beyond > 0 {
        let more = ((beyond + width - 1) / width).min(4 * m as i128) as usize;
        let step = (beyond + more as i128 - 1) / more.max(1) as i128;
        for i in 1..=more {
            edges.push((i128::from(last) + step * i as i128).min(i128::from(max) + 1));
        }
    }
    let buckets = edges.len() - 1;
    let total = per_bucket * buckets as f64;
    let n = ((total / chunk_rows.max(1) as f64) as i64 + 1).clamp(1, MAX_CHUNKS);
    let mut cuts: Vec<i64> = Vec::new();
    for j in 1..n {
        let at = j as f64 * buckets as f64 / n as f64;
        let b = (at.floor() as usize).min(buckets - 1);
        let (lo, hi) = (edges[b], edges[b + 1]);
        let key = lo + ((hi - lo) as f64 * (at - b as f64)) as i128;
        let key = key.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        if cuts.last().is_none_or(|c| key > *c) && i128::from(key) > edges[0] {
            cuts.push(key);
        }
    }
    let mut out = Vec::new();
    let mut lo = None;
    for c in cuts {
        out.push((lo, Some(c)));
        lo = Some(c);
    }
    out.push((lo, None));
    out
}

/// The equal-depth histogram Postgres keeps of `key` (`pg_stats.histogram_bounds`), when the
/// table was analyzed; empty otherwise.
async fn histogram(
    client: &tokio_postgres::Client,
    table: &crate::config::TableRef,
    key: &str,
) -> Result<Vec<i64>> {
    let rows = client
        .query(
            "SELECT histogram_bounds::text::int8[] FROM pg_stats \
             WHERE schemaname = $1 AND tablename = $2 AND attname = $3 \
             ORDER BY inherited DESC LIMIT 1",
            &[&table.schema, &table.name, &key],
        )
        .await
        .with_context(|| format!("reading the statistics of {table}'s key"))?;
    let bounds: Option<Vec<i64>> = rows.first().and_then(|r| r.get(0));
    Ok(bounds.unwrap_or_default())
}

/// The parts of the ranges of `plan` that no chunk of `done` covers, in key order.
fn remaining(plan: Vec<KeyRange>, done: &[KeyRange]) -> Vec<KeyRange> {
    // Open ends as numbers beyond every key, so that ranges compare as intervals.
    const BELOW: i128 = -(1 << 64);
    const ABOVE: i128 = 1 << 64;
    let bounds = |(lo, hi): &KeyRange| (lo.map_or(BELOW, i128::from), hi.map_or(ABOVE, i128::from));
    let mut covered: Vec<(i128, i128)> = done.iter().map(bounds).collect();
    covered.sort();
    let mut out = Vec::new();
    for range in &plan {
        let (mut lo, hi) = bounds(range);
        for &(clo, chi) in &covered {
            if chi <= lo || clo >= hi {
                continue;
            }
            if clo > lo {
                out.push((lo, clo));
            }
            lo = lo.max(chi);
            if lo >= hi {
                break;
            }
        }
        if lo < hi {
            out.push((lo, hi));
        }
    }
    let end = |b: i128| (b != BELOW && b != ABOVE).then_some(b as i64);
    out.into_iter().map(|(lo, hi)| (end(lo), end(hi))).collect()
}

/// Copies `job` (table number `index` of `target`) in key chunks on `cfg.snapshot_parallelism`
/// connections, leaving out the ranges of `done` (chunks copied before, by a copy cut short);
/// returns what the writers finished with and the snapshot of every chunk copied now. A
/// target that keeps chunks ([`CopyTarget::keeps_chunks`]) gets each chunk finished on its
/// own and reported; otherwise a worker writes all its chunks on one writer. Rows copied are
/// added to `counter`.
pub async fn copy_in_key_chunks<T: CopyTarget>(
    cfg: &PostgresConfig,
    job: Arc<CopyJob>,
    index: usize,
    key: &str,
    done: &[KeyRange],
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
        (Some(min), Some(max)) => {
            let chunk_rows = i64::try_from(cfg.snapshot_chunk_rows).unwrap_or(i64::MAX);
            // By the key's histogram when Postgres has one (keys are rarely dense: sequences
            // skip, rows are deleted); without statistics (a table never analyzed), the keys
            // are taken to be dense.
            let mut bounds = histogram(&client, table, key).await?;
            let rows = match job.schema.row_estimate {
                r if r > 0 && bounds.len() >= 2 => r,
                _ => {
                    bounds = vec![min, max.saturating_add(1)];
                    max.saturating_sub(min).saturating_add(1)
                }
            };
            plan(&bounds, rows, chunk_rows, max)
        }
        _ => vec![(None, None)],
    };
    let plan = remaining(plan, done);
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
            let client = connect(&cfg).await?;
            let mut finished = Vec::new();
            let mut seen = Vec::new();
            let mut shared = None;
            // A chunk being finished (its last row group encoded, its files made durable and
            // reported) while the next one is copied: the connection does not wait for the
            // disk. One at a time, so a crash repeats at most two chunks per connection.
            // Aborted with this worker (another worker's error, a copy stopped beside the
            // stream): nothing is recorded once the copy has ended.
            let mut finishing: Option<AbortOnDrop<Result<_>>> = None;
            for n in 0.. {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                let Some((lo, hi)) = next else {
                    break;
                };
                if target.keeps_chunks() {
                    // Each chunk on a writer of its own, finished and reported as it ends.
                    let copied = async {
                        let mut writer = target.writer(index, format!("{prefix}-{n:05}")).await?;
                        let chunk =
                            copy_chunk(&client, &job, &key, lo, hi, &mut writer, &counter).await?;
                        Ok::<_, Error>((writer, chunk))
                    }
                    .await;
                    // The chunk before is settled (recorded or failed) before any error
                    // ends this copy, and its error comes first: it is the earlier one.
                    if let Some(previous) = finishing.take() {
                        let (done, chunk) = finished_chunk(previous, &job.schema.table).await?;
                        finished.push(done);
                        seen.push(chunk);
                    }
                    let (writer, chunk) = copied?;
                    let target = Arc::clone(&target);
                    finishing = Some(AbortOnDrop(tokio::spawn(async move {
                        let done = writer.finish().await?;
                        target.chunk_copied(index, &chunk, &done).await?;
                        Ok((done, chunk))
                    })));
                } else {
                    let writer = match &mut shared {
                        Some(w) => w,
                        None => shared.insert(target.writer(index, prefix.clone()).await?),
                    };
                    seen.push(copy_chunk(&client, &job, &key, lo, hi, writer, &counter).await?);
                }
            }
            if let Some(last) = finishing.take() {
                let (done, chunk) = finished_chunk(last, &job.schema.table).await?;
                finished.push(done);
                seen.push(chunk);
            }
            if let Some(w) = shared {
                finished.push(w.finish().await?);
            }
            Ok::<_, Error>((finished, seen))
        });
    }
    let mut done = Vec::new();
    let mut seen = Vec::new();
    while let Some(joined) = workers.join_next().await {
        let (d, s) =
            joined.map_err(|e| Error::fatal(format!("a copy task of {table} failed: {e}")))??;
        done.extend(d);
        seen.extend(s);
    }
    seen.sort_by_key(|c| c.lo);
    Ok((done, seen))
}

/// What the task finishing a chunk returned, once it is done, or why it failed.
async fn finished_chunk<D>(
    mut task: AbortOnDrop<Result<(D, ChunkSeen)>>,
    table: &crate::config::TableRef,
) -> Result<(D, ChunkSeen)> {
    (&mut task.0).await.map_err(|e| {
        Error::fatal(format!(
            "finishing a chunk of the copy of {table} failed: {e}"
        ))
    })?
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
        let r = ranges(1, 1_000, 350_000, 100_000);
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
        assert_eq!(ranges(7, 7, 10, 100_000), vec![(None, None)]);
        assert_eq!(ranges(i64::MIN, i64::MAX, 1_000_000, 100_000).len(), 11);
        // A huge table: chunks grow rather than number in the tens of thousands.
        assert_eq!(
            ranges(1, 2_000_000_000, 2_000_000_000, 100_000).len() as i64,
            MAX_CHUNKS
        );
    }

    #[test]
    fn sparse_keys_are_cut_by_their_histogram() {
        // 1,000 rows: 900 with keys 1..=900, 100 spread up to 1,000,000.
        let mut bounds: Vec<i64> = (0..=9).map(|i| 1 + i * 100).collect();
        bounds.push(1_000_000);
        let p = plan(&bounds, 1_000, 100, 1_000_000);
        // About ten ranges of about a hundred rows, not one range holding 900 of them.
        assert!((9..=12).contains(&p.len()), "{p:?}");
        assert!(p[1].0.is_some_and(|lo| lo < 300), "{p:?}");
        // Keys written after the histogram, beyond its last bound, get ranges of their own.
        let grown = plan(&[1, 101, 201], 200, 100, 400);
        assert_eq!(grown.len(), 5, "{grown:?}");
        assert!(grown[3].0.is_some_and(|lo| lo > 201), "{grown:?}");
        // A single-bound histogram or no rows: one range.
        assert_eq!(plan(&[5], 1, 100, 5), vec![(None, None)]);
        assert_eq!(plan(&[], 0, 100, 0), vec![(None, None)]);
    }

    #[test]
    fn a_copy_cut_short_goes_on_with_what_its_chunks_left() {
        let plan = ranges(1, 1_000, 400_000, 100_000);
        assert_eq!(plan.len(), 5);
        // Nothing copied: the plan itself.
        assert_eq!(remaining(plan.clone(), &[]), plan);
        // The first and third chunks done; the others remain.
        let done = [plan[0], plan[2]];
        let left = remaining(plan.clone(), &done);
        assert_eq!(left, vec![plan[1], plan[3], plan[4]]);
        // A plan made again after the keys grew: done ranges of the earlier plan are cut
        // out of the new one wherever they fall, open ends included.
        let again = ranges(1, 2_000, 400_000, 100_000);
        let left = remaining(again, &[(None, Some(300)), (Some(900), Some(1_200))]);
        assert_eq!(
            left,
            vec![
                (Some(300), Some(401)),
                (Some(401), Some(801)),
                (Some(801), Some(900)),
                (Some(1_200), Some(1_201)),
                (Some(1_201), Some(1_601)),
                (Some(1_601), None)
            ]
        );
        // Every key is in exactly one of the done or remaining ranges.
        assert_eq!(left.len(), 6);
        let all: Vec<KeyRange> = left
            .iter()
            .copied()
            .chain([(None, Some(300)), (Some(900), Some(1_200))])
            .collect();
        for key in [
            i64::MIN,
            -1,
            0,
            299,
            300,
            899,
            900,
            1_199,
            1_200,
            5_000,
            i64::MAX,
        ] {
            let n = all
                .iter()
                .filter(|(lo, hi)| lo.is_none_or(|l| key >= l) && hi.is_none_or(|h| key < h))
                .count();
            assert_eq!(n, 1, "{key}");
        }
        // Everything done: nothing left.
        assert!(remaining(plan, &[(None, None)]).is_empty());
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
