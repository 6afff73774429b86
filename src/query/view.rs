//! Queries, the read view: one cut of a pipeline's WAL at a source commit LSN, with the
//! Iceberg snapshot of each of its tables pinned at the same moment, so that every table a
//! statement (or a transaction) reads shows exactly the source transactions up to that LSN.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::table::Table;

use super::as_of::{travel, AsOf};
pub use super::pipeline_view::PipelineView;
use super::wal_read::WalRead;
use super::Workspace;
use crate::change::Lsn;
use crate::error::{Error, Result};
use crate::pipeline::state::PipelineState;
use crate::table::summary::committed_lsn;

/// The start of the message of a fence that timed out (the gateway answers it with SQLSTATE
/// 57014, as Postgres answers a statement timeout).
pub const LSN_WAIT_MESSAGE: &str = "canceling statement due to LSN wait timeout";

/// How often a fence reads the WAL again while it waits.
const FENCE_POLL: Duration = Duration::from_millis(5);

/// How many times a view is read again when a commit raced with it.
const ATTEMPTS: usize = 16;

/// A fence: the view must show at least `min_lsn`, within `timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Fence {
    pub min_lsn: Lsn,
    pub timeout: Duration,
}

/// The views of one session (a gateway connection, or a `skipprd query` run): built at the
/// first table a statement reads, kept for the next statements while a transaction holds
/// them.
#[derive(Default)]
pub struct ViewHandle {
    state: Mutex<HandleState>,
    /// Serialises the building of views, so two tables of one statement share one.
    building: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct HandleState {
    current: HashMap<String, Arc<PipelineView>>,
    /// The LSN per pipeline of the last statement that read a table.
    last: HashMap<String, Lsn>,
    /// A transaction is open: statements keep the views they find.
    held: bool,
    fence: Option<Fence>,
    /// The session's time travel (`skippr.as_of`), for the views it builds.
    as_of: Option<AsOf>,
}

impl std::fmt::Debug for ViewHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ViewHandle")
    }
}

impl ViewHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, HandleState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A statement starts: outside a transaction it gets fresh views (those of the statement
    /// before are remembered for [`ViewHandle::visible`]); `fence` applies to the views it
    /// builds, and `as_of` moves them back in time (see [`super::as_of`]).
    pub fn begin_statement(&self, fence: Option<Fence>, as_of: Option<AsOf>) {
        let mut s = self.lock();
        s.fence = fence;
        s.as_of = as_of;
        if !s.held {
            forget_current(&mut s);
        }
    }

    /// A transaction starts: its statements share the views the first of them builds.
    pub fn hold(&self) {
        let mut s = self.lock();
        if !s.held {
            forget_current(&mut s);
            s.held = true;
        }
    }

    /// The transaction ended: the next statement reads afresh.
    pub fn release(&self) {
        let mut s = self.lock();
        s.held = false;
        forget_current(&mut s);
    }

    /// The LSN per pipeline that the current statement sees, or else the last statement that
    /// read a table saw.
    pub fn visible(&self) -> HashMap<String, Lsn> {
        let s = self.lock();
        if s.current.is_empty() {
            s.last.clone()
        } else {
            s.current.iter().map(|(k, v)| (k.clone(), v.lsn)).collect()
        }
    }

    /// The view of `pipeline` for this statement, built at its first use.
    pub async fn view(&self, ws: &Workspace, pipeline: &str) -> Result<Arc<PipelineView>> {
        if let Some(v) = self.lock().current.get(pipeline) {
            return Ok(v.clone());
        }
        let asked = Instant::now();
        let _building = self.building.lock().await;
        let (fence, as_of) = {
            let s = self.lock();
            if let Some(v) = s.current.get(pipeline) {
                return Ok(v.clone());
            }
            (s.fence, s.as_of)
        };
        let view = match (fence, as_of) {
            (None, None) => ws.current_view(pipeline, asked).await?,
            _ => Arc::new(ws.pipeline_view(pipeline, fence, as_of).await?),
        };
        self.lock()
            .current
            .insert(pipeline.to_string(), view.clone());
        Ok(view)
    }
}

/// The newest current view of a pipeline (no fence, no time travel) and when its reading
/// began.
#[derive(Default)]
pub struct Latest(tokio::sync::Mutex<Option<(Instant, Arc<PipelineView>)>>);

fn forget_current(s: &mut HandleState) {
    if !s.current.is_empty() {
        s.last = s.current.drain().map(|(k, v)| (k, v.lsn)).collect();
    }
}

/// Whether a view read at `lsn` may use `table` as loaded: its commit must not be newer than
/// the WAL read (a commit that raced with the read), and it must cover every segment that
/// vanished during the read. A table whose newest snapshot is its initial copy may be newer:
/// its copy is consistent with an LSN the stream has not passed yet, and no older state of
/// it exists.
pub(crate) fn fits(table: &Table, lsn: Lsn, read: &WalRead) -> bool {
    let committed = committed_lsn(table).unwrap_or_default();
    let covers_vanished = read.vanished_through().is_none_or(|v| v <= committed);
    covers_vanished && (committed <= lsn || is_copy(table))
}

/// The table's newest skipprd snapshot is a copy (or the empty start of a table followed
/// without one): its LSN is where its stream starts, not a position the WAL passed.
fn is_copy(table: &Table) -> bool {
    crate::table::summary::last_skippr_snapshot(table).is_some_and(|s| {
        s.parent_snapshot_id().is_none()
            || s.summary()
                .additional_properties
                .get(crate::table::SUMMARY_PHASE)
                .is_some_and(|p| p == "snapshot")
    })
}

/// The LSN a read shows: its newest transaction, or a later position the WAL or the state
/// record (`noted`: the stream's note that nothing of the pipeline came before it;
/// `removed`: the WAL was removed through it after every table committed it), both read
/// before the WAL was listed.
pub(crate) fn cut_of(read: &WalRead, noted: Lsn, removed: Lsn) -> Lsn {
    read.newest()
        .max(read.vanished_through().unwrap_or_default())
        .max(noted)
        .max(removed)
}

/// Postgres WAL pages are 8 KiB and each starts with a header (24 bytes; 40 on the first
/// page of a 16 MiB segment). No record ends inside a header, so the position just after
/// one (what `pg_current_wal_insert_lsn()` answers when the last record ended at the page
/// boundary) is the same point in the history as the boundary itself, where the stream
/// reports it.
pub fn same_point(lsn: Lsn) -> Lsn {
    const PAGE: u64 = 8192;
    const SEGMENT: u64 = 16 * 1024 * 1024;
    let off = lsn.0 % PAGE;
    let header = if lsn.0 % SEGMENT == 40 { 40 } else { 24 };
    if off == header {
        Lsn(lsn.0 - off)
    } else {
        lsn
    }
}

/// Adds to `view`'s WAL read the segments of the WAL's history that travel to `as_of` needs
/// (older than the live WAL's, holding transactions after `needed`: see
/// [`super::as_of::wal_needed_from`]) and returns the position from which the read then
/// holds every transaction: the later of the history's start and `needed` when the history
/// is read, else where the live WAL was removed (`removed`, or a segment removed while it
/// was read).
fn with_history(
    view: &mut PipelineView,
    history: &crate::wal::WalHistory,
    as_of: AsOf,
    removed: Lsn,
    needed: Option<Lsn>,
) -> Result<Lsn> {
    let live_from = removed.max(view.read.vanished_through().unwrap_or_default());
    let Some(needed) = needed.filter(|n| *n < live_from) else {
        return Ok(live_from);
    };
    let through = match as_of {
        // A cut reads tagged snapshots only.
        AsOf::Cut(_) => return Ok(live_from),
        AsOf::Lsn(l) if l >= view.lsn => return Ok(live_from),
        AsOf::Lsn(l) => Some(l),
        // An instant is found from the transactions' commit times: all of them.
        AsOf::Micros(_) => None,
    };
    let kept = history.read(needed, through)?;
    let Some(from) = kept.from else {
        return Ok(live_from);
    };
    // A segment listed live and then moved into the history is in both: keep one.
    let live: std::collections::HashSet<(Lsn, Lsn)> = view
        .read
        .segments
        .iter()
        .map(|(s, _)| (s.first, s.last))
        .collect();
    let moved: std::collections::HashSet<(Lsn, Lsn)> = kept
        .segments
        .iter()
        .map(|(s, _)| (s.first, s.last))
        .collect();
    // A segment that vanished from the live WAL and is not in the history either was
    // removed past it: the read is complete only after it.
    let lost = view
        .read
        .vanished
        .iter()
        .filter(|s| !moved.contains(&(s.first, s.last)))
        .map(|s| s.last)
        .max()
        .unwrap_or_default();
    let mut segments: Vec<_> = kept
        .segments
        .into_iter()
        .filter(|(s, _)| !live.contains(&(s.first, s.last)))
        .collect();
    if segments.is_empty() && from >= live_from {
        return Ok(live_from);
    }
    segments.append(&mut view.read.segments);
    segments.sort_by_key(|(s, _)| (s.first, s.last));
    view.read.segments = segments;
    Ok(from.max(lost).max(needed).min(live_from))
}

/// The error of a fence that timed out.
pub fn fence_timeout(pipeline: &str, fence: &Fence, reached: Lsn) -> Error {
    Error::query(format!(
        "{LSN_WAIT_MESSAGE}: pipeline {pipeline} reached {reached}, not {} within {} ms",
        fence.min_lsn,
        fence.timeout.as_millis()
    ))
}

impl Workspace {
    /// The current view of `pipeline` for a statement that asked for it at `asked`. Views
    /// are read one at a time per pipeline, and a view whose reading began after `asked`
    /// shows everything the statement could have read itself, so statements that arrive
    /// while one is read share the next: under many clients the WAL is listed and the
    /// tables' metadata loaded once per round instead of once per statement.
    pub async fn current_view(&self, pipeline: &str, asked: Instant) -> Result<Arc<PipelineView>> {
        let p = self
            .pipeline(pipeline)
            .ok_or_else(|| Error::query(format!("no pipeline {pipeline} in this workspace")))?;
        let mut latest = p.latest.0.lock().await;
        if let Some((began, view)) = latest.as_ref() {
            if *began > asked {
                return Ok(view.clone());
            }
        }
        let began = Instant::now();
        let view = Arc::new(self.pipeline_view(pipeline, None, None).await?);
        *latest = Some((began, view.clone()));
        Ok(view)
    }

    /// Reads one view of `pipeline`: the state and the acknowledgement note first, then the
    /// WAL (its cut is the newest of the three), then every table's current metadata; read
    /// again when a commit raced with it. With a fence, waits until the cut reaches it. With
    /// `as_of`, the view is then moved back to it (the caller fences an LSN `as_of`, so that
    /// the WAL holds it).
    pub async fn pipeline_view(
        &self,
        pipeline: &str,
        fence: Option<Fence>,
        as_of: Option<AsOf>,
    ) -> Result<PipelineView> {
        let p = self
            .pipeline(pipeline)
            .ok_or_else(|| Error::query(format!("no pipeline {pipeline} in this workspace")))?;
        let started = Instant::now();
        let mut raced = 0;
        loop {
            let store = p.wal.open();
            let noted = match &store {
                Some(s) => s.noted_acknowledged()?,
                None => Lsn::default(),
            };
            let state = PipelineState::load(&p.state_file)?;
            let removed = state
                .as_ref()
                .map(|s| s.wal_removed_through)
                .unwrap_or_default();
            let read = self.tail.read_store(store)?;
            let lsn = cut_of(&read, noted, removed);
            if let Some(f) = &fence {
                if lsn < same_point(f.min_lsn) {
                    if started.elapsed() >= f.timeout {
                        return Err(fence_timeout(pipeline, f, lsn));
                    }
                    tokio::time::sleep(FENCE_POLL).await;
                    continue;
                }
            }
            let mut tables = HashMap::new();
            let mut copying = HashMap::new();
            let mut fitting = true;
            for (name, entry) in self.entries_of(pipeline) {
                let table = self.sinks[entry.sink]
                    .load_current_of(&entry.ident, Some(pipeline))
                    .await?;
                // A table copied in key chunks shows its state only from the position after
                // which no chunk saw anything: before it, its chunks are at different points.
                let chunked_through = entry.pipeline.as_ref().and_then(|(_, _, source)| {
                    let c = state.as_ref()?.table(source)?.chunked.as_ref()?;
                    Some(c.through)
                });
                if let Some(through) = chunked_through.filter(|t| lsn < *t) {
                    copying.insert(
                        name.clone(),
                        format!("table {name} is being copied; it becomes queryable once the stream passes {through}, where its copy is complete (`skipprd status` shows how far it is)"),
                    );
                    continue;
                }
                if table.metadata().current_snapshot().is_none() {
                    // Made for a copy that has not committed yet: never shown half-copied.
                    copying.insert(
                        name.clone(),
                        format!("table {name} is being copied; it becomes queryable once its copy commits (`skipprd status` shows how far it is)"),
                    );
                    continue;
                }
                if !fits(&table, lsn, &read) {
                    fitting = false;
                    break;
                }
                tables.insert(name, table);
            }
            if fitting {
                tracing::debug!(pipeline, lsn = %lsn, "read view");
                let mut view = PipelineView {
                    pipeline: pipeline.to_string(),
                    lsn,
                    read,
                    tables,
                    refused: copying,
                };
                return match as_of {
                    Some(a) => {
                        let needed = super::as_of::wal_needed_from(&view, a);
                        let wal_from = with_history(&mut view, &p.history, a, removed, needed)?;
                        travel(view, a, wal_from)
                    }
                    None => Ok(view),
                };
            }
            raced += 1;
            if raced >= ATTEMPTS {
                return Err(Error::retryable(format!(
                    "pipeline {pipeline} kept committing while its tables were read; run the query again"
                )));
            }
            // A commit landed between the WAL read and a table's load: read both again.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::{Record, SegmentInfo, Txn};
    use std::path::PathBuf;

    fn seg(first: u64, last: u64) -> SegmentInfo {
        SegmentInfo {
            path: PathBuf::from(format!("/nonexistent/{first}.seg")),
            first: Lsn(first),
            last: Lsn(last),
            bytes: 0,
        }
    }

    fn txn(end: u64) -> Record {
        Record::Txn(Txn {
            xid: 1,
            commit_lsn: Lsn(end),
            end_lsn: Lsn(end),
            commit_time_micros: 0,
            changes: vec![],
        })
    }

    #[test]
    fn the_cut_is_the_newest_position_the_wal_proves() {
        let read = WalRead {
            segments: vec![(seg(10, 30), Arc::new(vec![txn(10), txn(30)]))],
            vanished: vec![seg(1, 8)],
        };
        assert_eq!(cut_of(&read, Lsn(0), Lsn(0)), Lsn(30));
        assert_eq!(
            cut_of(&read, Lsn(40), Lsn(0)),
            Lsn(40),
            "the stream noted 40"
        );
        let empty = WalRead::default();
        assert_eq!(
            cut_of(&empty, Lsn(0), Lsn(50)),
            Lsn(50),
            "all of the WAL was committed and removed through 50"
        );
        let vanished = WalRead {
            segments: vec![],
            vanished: vec![seg(1, 60)],
        };
        assert_eq!(cut_of(&vanished, Lsn(0), Lsn(50)), Lsn(60));
    }

    /// A segment file holding one empty transaction per end LSN.
    fn write(store: &crate::wal::WalStore, ends: &[u64]) -> SegmentInfo {
        let mut data = bytes::BytesMut::new();
        for e in ends {
            if let Record::Txn(t) = txn(*e) {
                crate::wal::codec::encode_txn(&t, &mut data);
            }
        }
        store
            .write_segment(Lsn(ends[0]), Lsn(*ends.last().unwrap()), &data)
            .unwrap()
    }

    #[test]
    fn time_travel_reads_the_wals_history_before_the_live_wal() {
        use crate::storage::Location;
        use crate::wal::{WalHistory, WalStore};
        let dir = tempfile::tempdir().unwrap();
        let history = WalHistory::for_pipeline(
            &Location::Local(dir.path().to_path_buf()),
            dir.path(),
            "p",
            Duration::from_secs(3600),
        )
        .unwrap();
        let live = WalStore::open(&dir.path().join("wal").join("p"))
            .unwrap()
            .keeping_history(history.clone());
        write(&live, &[10, 20]);
        write(&live, &[30, 40]);
        let newest = write(&live, &[50, 60]);
        // Iceberg committed through 40: both older segments move into the history.
        assert_eq!(live.remove_through(Lsn(40)).unwrap(), 2);
        let tail = super::super::wal_read::TailCache::default();
        let view_of = || PipelineView {
            pipeline: "p".into(),
            lsn: Lsn(60),
            read: tail.read_store(Some(live.clone())).unwrap(),
            tables: HashMap::new(),
            refused: HashMap::new(),
        };
        let read = |as_of| {
            let mut view = view_of();
            let from = with_history(&mut view, &history, as_of, Lsn(40), Some(Lsn(0))).unwrap();
            let ranges: Vec<(u64, u64)> = view
                .read
                .segments
                .iter()
                .map(|(s, _)| (s.first.0, s.last.0))
                .collect();
            (from, ranges)
        };
        assert_eq!(
            read(AsOf::Lsn(Lsn(60))),
            (Lsn(40), vec![(50, 60)]),
            "live: no history"
        );
        assert_eq!(
            read(AsOf::Lsn(Lsn(25))),
            (Lsn(9), vec![(10, 20), (50, 60)]),
            "the history up to the LSN, complete from before its first segment"
        );
        assert_eq!(
            read(AsOf::Micros(0)),
            (Lsn(9), vec![(10, 20), (30, 40), (50, 60)]),
            "an instant reads it all"
        );
        assert_eq!(
            read(AsOf::Cut(0)),
            (Lsn(40), vec![(50, 60)]),
            "a cut reads tagged snapshots only"
        );
        // A segment listed live and moved meanwhile is read once.
        let mut view = view_of();
        live.remove_through(Lsn(60)).unwrap();
        assert_eq!(
            with_history(&mut view, &history, AsOf::Micros(0), Lsn(40), Some(Lsn(0))).unwrap(),
            Lsn(9)
        );
        assert_eq!(view.read.segments.len(), 3, "{newest:?} once");
        // Only what the tables need: the history after their snapshots before the point.
        let mut view = view_of();
        assert_eq!(
            with_history(&mut view, &history, AsOf::Micros(0), Lsn(40), Some(Lsn(25))).unwrap(),
            Lsn(25)
        );
        assert_eq!(view.read.segments.len(), 2, "(30, 40) and (50, 60)");
        let mut view = view_of();
        assert_eq!(
            with_history(&mut view, &history, AsOf::Micros(0), Lsn(60), None).unwrap(),
            Lsn(60),
            "no table needs the WAL"
        );
        assert!(view.read.segments.is_empty());
    }

    #[test]
    fn a_position_after_a_page_header_is_the_page_boundary() {
        assert_eq!(same_point(Lsn(0x271A018)), Lsn(0x271A000));
        assert_eq!(
            same_point(Lsn(0x3000028)),
            Lsn(0x3000000),
            "segment start: long header"
        );
        assert_eq!(same_point(Lsn(0x271A020)), Lsn(0x271A020));
        assert_eq!(same_point(Lsn(0x271A000)), Lsn(0x271A000));
    }

    #[test]
    fn a_statement_outside_a_transaction_gets_a_fresh_view_and_a_transaction_keeps_one() {
        let h = ViewHandle::default();
        let view = |lsn: u64| {
            Arc::new(PipelineView {
                pipeline: "p".into(),
                lsn: Lsn(lsn),
                read: WalRead::default(),
                tables: HashMap::new(),
                refused: HashMap::new(),
            })
        };
        h.lock().current.insert("p".into(), view(10));
        assert_eq!(h.visible()["p"], Lsn(10));
        h.begin_statement(None, None);
        assert!(h.lock().current.is_empty());
        assert_eq!(h.visible()["p"], Lsn(10), "the last statement's LSN");
        h.hold();
        h.lock().current.insert("p".into(), view(20));
        h.begin_statement(None, None);
        assert_eq!(
            h.lock().current["p"].lsn,
            Lsn(20),
            "kept inside the transaction"
        );
        h.release();
        assert!(h.lock().current.is_empty());
        assert_eq!(h.visible()["p"], Lsn(20));
    }
}
