//! Unit tests of the CDC orchestration (`cdc`): the real `catch_up_once`, `run_continuous`
//! and `apply_log` driven through the seams with the in-memory doubles of `doubles` (and,
//! where it matters, the real WAL in a temporary folder).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;

use super::cdc::{catch_up_once, run_continuous, Cadence};
use super::doubles::{delete, insert, relation, table, txn, update, MemLog, MemSource, MemTables};
use super::seams::ChangeLog;
use super::state::{PipelineState, TableState};
use crate::change::Lsn;
use crate::wal::WalStore;

const A: u32 = 1;
const B: u32 = 2;

fn source() -> MemSource {
    MemSource::new(vec![relation(A, "a"), relation(B, "b")])
}

fn rows(pairs: &[(i64, &str)]) -> BTreeMap<i64, String> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Three transactions over two tables: inserts, an update, a delete.
fn three_txns(src: &MemSource) {
    src.commit(txn(10, vec![insert(A, 1, "x"), insert(A, 2, "y")]));
    src.commit(txn(20, vec![update(A, 1, "x2"), insert(B, 1, "b")]));
    src.commit(txn(30, vec![delete(A, 2)]));
}

fn cadence() -> Cadence {
    Cadence {
        pipeline: "app".into(),
        commit_interval: Duration::from_millis(10),
        peer_timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn once_applies_every_change_then_truncates_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    three_txns(&src);
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x2")]));
    assert_eq!(tables.stored("b").rows, rows(&[(1, "b")]));
    assert_eq!(tables.stored("a").lsn, Lsn(30));
    assert_eq!(src.acks(), vec![Lsn(30)]);
    assert!(log.held().is_empty(), "committed changes stay in the log");
}

/// A table copied beside the stream (at LSN 15) joins it later: meanwhile the stream goes on
/// for the other tables, and the log keeps what came after the copy, so the table that joins
/// finds its changes there and applies only those after its copy.
#[tokio::test]
async fn a_table_copied_beside_the_stream_finds_its_changes_in_the_log_when_it_joins() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let mut streaming = MemTables::new(&["a"], dir.path());
    streaming.hold = Some(Lsn(15));
    three_txns(&src);
    catch_up_once(&mut src, &log, &streaming).await.unwrap();
    assert_eq!(
        streaming.stored("a").lsn,
        Lsn(30),
        "the other table went on"
    );
    let kept: Vec<Lsn> = log.segments().unwrap().iter().map(|s| s.last).collect();
    assert_eq!(
        kept,
        vec![Lsn(20), Lsn(30)],
        "the log after the copy is kept"
    );

    // The copy committed at 15 with the rows it saw; the table joins the stream.
    let joined = MemTables::new(&["a", "b"], dir.path());
    joined.stored("b").lsn = Lsn(15);
    joined.stored("a").lsn = Lsn(30);
    joined.stored("a").rows = streaming.stored("a").rows.clone();
    src.commit(txn(40, vec![update(B, 1, "b2")]));
    catch_up_once(&mut src, &log, &joined).await.unwrap();
    assert_eq!(joined.stored("b").rows, rows(&[(1, "b2")]));
    assert_eq!(joined.stored("b").lsn, Lsn(40));
    assert!(
        log.segments().unwrap().is_empty(),
        "with no hold, all of it goes"
    );
}

/// A table copied in key chunks applies, per key, only the transactions its chunk's snapshot
/// did not see (the doubles refuse a row inserted twice and a delete of a missing row).
#[tokio::test]
async fn a_table_copied_in_chunks_takes_what_each_chunk_did_not_see() {
    use crate::source::postgres::key_chunks::ChunkSeen;
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let mut tables = MemTables::new(&["b"], dir.path());
    // Keys below 100: a snapshot that saw transactions 10 and 20; from 100: only 10.
    let chunk = ChunkSeen::seen_below;
    tables.filters.insert(
        crate::config::TableRef {
            schema: "public".into(),
            name: "b".into(),
        },
        super::chunks::ChunkFilter {
            through: Lsn(25),
            key: "id".into(),
            chunks: vec![chunk(None, Some(100), 21), chunk(Some(100), None, 11)],
        },
    );
    tables.stored("b").lsn = Lsn(5);
    tables.stored("b").rows = rows(&[(1, "x2")]);
    src.commit(txn(10, vec![insert(B, 1, "x")]));
    src.commit(txn(20, vec![update(B, 1, "x2"), insert(B, 200, "y")]));
    src.commit(txn(30, vec![delete(B, 1), update(B, 200, "y2")]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("b").rows, rows(&[(200, "y2")]));
    assert_eq!(tables.stored("b").lsn, Lsn(30));
}

/// The process dies after every table committed and before the log is truncated; the next
/// run replays the whole log and must skip what the tables hold (the doubles refuse a row
/// inserted twice and a delete of a missing row).
async fn crash_between_commit_and_truncation<L: ChangeLog>(log: L, fail_removal: impl Fn(bool)) {
    let dir = tempfile::tempdir().unwrap();
    let mut src = source();
    let tables = MemTables::new(&["a", "b"], dir.path());
    three_txns(&src);
    fail_removal(true);
    let e = catch_up_once(&mut src, &log, &tables).await.unwrap_err();
    assert!(e.message().contains("died"), "{}", e.message());
    assert_eq!(tables.stored("a").lsn, Lsn(30), "the commit landed");
    assert_eq!(
        log.segments().unwrap().len(),
        3,
        "the log was not truncated"
    );

    fail_removal(false);
    src.commit(txn(40, vec![insert(A, 3, "z"), delete(B, 1)]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x2"), (3, "z")]));
    assert!(tables.stored("b").rows.is_empty());
    assert_eq!(tables.stored("a").commits, 2);
    assert!(log.segments().unwrap().is_empty());
}

#[tokio::test]
async fn crash_between_sink_commit_and_log_truncation_replays_without_duplicates() {
    let log = MemLog::default();
    let handle = log.clone();
    crash_between_commit_and_truncation(log, move |on| handle.fail_removal(on)).await;
}

/// The same crash with the real WAL: segments written with their relation descriptions
/// and read back, records and all.
#[tokio::test]
async fn crash_before_truncation_with_the_real_wal_replays_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let wal = WalStore::open(&dir.path().join("wal")).unwrap();
    let log = FailingRemoval {
        wal,
        fail: std::sync::Arc::default(),
    };
    let fail = log.fail.clone();
    crash_between_commit_and_truncation(log, move |on| {
        fail.store(on, std::sync::atomic::Ordering::SeqCst)
    })
    .await;
}

/// The real WAL, whose truncation can be made to fail like a process killed right before it.
#[derive(Clone)]
struct FailingRemoval {
    wal: WalStore,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ChangeLog for FailingRemoval {
    fn append(
        &self,
        relations: &[crate::change::Relation],
        txns: &[crate::change::Txn],
    ) -> crate::error::Result<Option<Lsn>> {
        self.wal.append(relations, txns)
    }
    fn segments(&self) -> crate::error::Result<Vec<crate::wal::SegmentInfo>> {
        ChangeLog::segments(&self.wal)
    }
    fn read(&self, seg: &crate::wal::SegmentInfo) -> crate::error::Result<Vec<crate::wal::Record>> {
        ChangeLog::read(&self.wal, seg)
    }
    fn items(
        &self,
        seg: &crate::wal::SegmentInfo,
    ) -> crate::error::Result<Box<dyn Iterator<Item = crate::error::Result<crate::wal::Item>> + Send>>
    {
        ChangeLog::items(&self.wal, seg)
    }
    fn remove_through(&self, lsn: Lsn) -> crate::error::Result<usize> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::error::Error::fatal("the test process died"));
        }
        ChangeLog::remove_through(&self.wal, lsn)
    }
}

#[tokio::test]
async fn a_table_that_fails_to_commit_holds_back_truncation_and_only_it_replays() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    src.commit(txn(10, vec![insert(A, 1, "x"), insert(B, 1, "b")]));
    src.commit(txn(20, vec![insert(A, 2, "y")]));
    tables.stored("b").fail_commits = 1;
    assert!(catch_up_once(&mut src, &log, &tables).await.is_err());
    assert_eq!(tables.stored("a").lsn, Lsn(20), "a committed");
    assert_eq!(tables.stored("b").lsn, Lsn(0), "b did not");
    assert!(log.removals().is_empty(), "nothing may be truncated");
    assert_eq!(log.held(), vec![Lsn(10), Lsn(20)]);

    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x"), (2, "y")]));
    assert_eq!(
        tables.stored("a").commits,
        1,
        "a has nothing to apply again"
    );
    assert_eq!(tables.stored("b").rows, rows(&[(1, "b")]));
    assert_eq!(log.removals(), vec![Lsn(20)]);
}

#[tokio::test]
async fn truncation_never_passes_the_lowest_committed_table() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    src.commit(txn(10, vec![insert(A, 1, "x"), insert(B, 1, "b")]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    // b cannot commit its change at 20; a commits through 30.
    src.commit(txn(20, vec![insert(B, 2, "c")]));
    src.commit(txn(30, vec![insert(A, 2, "y")]));
    tables.stored("b").fail_commits = 2;
    for _ in 0..2 {
        assert!(catch_up_once(&mut src, &log, &tables).await.is_err());
        let lowest = tables.stored("a").lsn.min(tables.stored("b").lsn);
        assert!(
            log.removals().iter().all(|r| *r <= lowest),
            "{:?}",
            log.removals()
        );
        assert_eq!(log.held(), vec![Lsn(20), Lsn(30)]);
    }
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("b").rows, rows(&[(1, "b"), (2, "c")]));
    assert!(log.held().is_empty());
}

#[tokio::test]
async fn an_idle_table_does_not_hold_back_truncation_and_its_watermark_advances() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    let mut state = PipelineState::default();
    for t in ["public.a", "public.b"] {
        state.tables.insert(t.into(), TableState::default());
    }
    state.save(&tables.state_file).unwrap();

    src.commit(txn(10, vec![insert(A, 1, "x")]));
    src.commit(txn(20, vec![insert(A, 2, "y")]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert!(
        log.held().is_empty(),
        "b never changed, yet holds the log back"
    );
    assert_eq!(tables.stored("b").commits, 0);
    let state = PipelineState::load(&tables.state_file).unwrap().unwrap();
    assert_eq!(state.table(&table("b")).unwrap().watermark, Lsn(20));
    assert_eq!(state.table(&table("a")).unwrap().watermark, Lsn(20));
    assert_eq!(state.wal_removed_through, Lsn(20));

    // When b changes later, its change is applied once.
    src.commit(txn(30, vec![insert(B, 1, "b")]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("b").rows, rows(&[(1, "b")]));
}

#[tokio::test]
async fn a_log_that_cannot_append_stops_before_acknowledging() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    three_txns(&src);
    log.fail_appends(true);
    let e = catch_up_once(&mut src, &log, &tables).await.unwrap_err();
    assert!(e.message().contains("full"), "{}", e.message());
    assert!(src.acks().is_empty(), "acknowledged {:?}", src.acks());
    assert_eq!(tables.stored("a").commits, 0);

    // Nothing was acknowledged, so the source delivers everything again.
    log.fail_appends(false);
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x2")]));
    assert_eq!(src.acks(), vec![Lsn(30)]);
}

#[tokio::test]
async fn a_change_the_sink_refuses_stops_every_run_and_stays_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    src.commit(txn(10, vec![insert(A, 1, "x")]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    // A delete of a row the table does not hold, then a later transaction.
    src.commit(txn(20, vec![delete(A, 5)]));
    src.commit(txn(30, vec![insert(A, 2, "y"), insert(B, 1, "b")]));
    for _ in 0..2 {
        let e = catch_up_once(&mut src, &log, &tables).await.unwrap_err();
        assert!(e.message().contains("no row 5"), "{}", e.message());
        assert_eq!(
            tables.stored("a").lsn,
            Lsn(10),
            "nothing past the miss is committed"
        );
        assert_eq!(tables.stored("b").lsn, Lsn(0));
        assert_eq!(
            log.held(),
            vec![Lsn(20), Lsn(30)],
            "the miss must not be skipped"
        );
    }
}

#[tokio::test]
async fn an_update_to_an_append_only_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut src, log) = (source(), MemLog::default());
    let mut tables = MemTables::new(&["a", "b"], dir.path());
    tables.append_only = vec![table("a")];
    src.commit(txn(10, vec![insert(A, 1, "x")]));
    src.commit(txn(20, vec![update(A, 1, "x2")]));
    let e = catch_up_once(&mut src, &log, &tables).await.unwrap_err();
    assert!(e.message().contains("append_only"), "{}", e.message());
    assert_eq!(tables.stored("a").lsn, Lsn(0));
}

#[tokio::test]
async fn continuous_run_commits_on_its_interval_and_acknowledges_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (src, log) = (source(), MemLog::default());
    let tables = std::sync::Arc::new(MemTables::new(&["a", "b"], dir.path()));
    three_txns(&src);
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = {
        let (src, log, tables) = (src.clone(), log.clone(), tables.clone());
        tokio::spawn(async move {
            run_continuous(src, &log, tables.as_ref(), &cadence(), stop_rx).await
        })
    };
    // Committed while the stream is still open, before any acknowledgement.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tables.stored("a").lsn < Lsn(30) {
        assert!(std::time::Instant::now() < deadline, "never committed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(src.acks().is_empty());
    stop_tx.send(true).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x2")]));
    assert_eq!(src.acks(), vec![Lsn(30)]);
    assert!(log.held().is_empty());
}

#[tokio::test]
async fn continuous_run_commits_what_is_durable_after_a_source_fault_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (src, log) = (source(), MemLog::default());
    let tables = MemTables::new(&["a", "b"], dir.path());
    three_txns(&src);
    src.fail_after(Some(2));
    let (stop_tx, stop_rx) = watch::channel(false);
    let e = run_continuous(src.clone(), &log, &tables, &cadence(), stop_rx.clone())
        .await
        .unwrap_err();
    assert!(e.message().contains("broke off"), "{}", e.message());
    assert!(src.acks().is_empty(), "nothing is acknowledged on a fault");
    assert_eq!(
        tables.stored("a").lsn,
        Lsn(20),
        "what was durable got committed"
    );
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x2"), (2, "y")]));

    // The next try resumes after the log's end: the third transaction, once.
    src.fail_after(None);
    stop_tx.send(true).unwrap();
    run_continuous(src.clone(), &log, &tables, &cadence(), stop_rx)
        .await
        .unwrap();
    assert_eq!(tables.stored("a").rows, rows(&[(1, "x2")]));
    assert_eq!(tables.stored("b").rows, rows(&[(1, "b")]));
    assert_eq!(src.acks(), vec![Lsn(30)]);
}

/// A transaction far larger than the memory budget is spilled table by table while it is
/// applied, and still committed once, whole, with its LSN (never a part of it).
#[tokio::test]
async fn a_transaction_beyond_the_budget_spills_and_commits_once_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = source();
    let log = WalStore::open(&dir.path().join("wal")).unwrap();
    let mut tables = MemTables::new(&["a", "b"], dir.path());
    // The doubles count 16 bytes per staged change: a spill every 10 changes of a table.
    tables.budget = 160;
    let mut changes = Vec::new();
    for k in 0..100 {
        changes.push(insert(A, k, "v"));
        changes.push(insert(B, k, "w"));
    }
    changes.push(delete(A, 7));
    src.commit(txn(10, changes));
    src.commit(txn(20, vec![update(B, 3, "w2")]));
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    let a = tables.stored("a");
    assert_eq!(a.rows.len(), 99);
    assert!(!a.rows.contains_key(&7));
    assert!(a.spills >= 9, "table a spilled {} times", a.spills);
    assert_eq!(a.commits, 1, "a transaction is committed whole, once");
    assert_eq!(a.lsn, Lsn(20));
    let b = tables.stored("b");
    assert_eq!(b.rows.get(&3).map(String::as_str), Some("w2"));
    assert!(b.spills >= 9, "table b spilled {} times", b.spills);
    assert_eq!(b.commits, 1);
}

/// `sync --once` applies what is durable while the stream goes on: a stream that breaks off
/// after its first transaction leaves that transaction applied (spilled here) but nothing
/// committed or acknowledged, and the next run commits everything once.
#[tokio::test]
async fn once_applies_while_it_streams_and_a_broken_stream_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = source();
    let log = MemLog::default();
    let mut tables = MemTables::new(&["a", "b"], dir.path());
    // The doubles count 16 bytes per staged change: a spill at every budget check.
    tables.budget = 16;
    src.commit(txn(10, (0..1100).map(|k| insert(A, k, "v")).collect()));
    src.commit(txn(20, vec![insert(B, 1, "b")]));
    src.fail_after(Some(1));
    assert!(catch_up_once(&mut src, &log, &tables).await.is_err());
    {
        let a = tables.stored("a");
        assert!(
            a.spills >= 1,
            "the first transaction was applied while streaming"
        );
        assert_eq!((a.commits, a.lsn), (0, Lsn(0)), "nothing is committed");
    }
    assert!(src.acks().is_empty(), "nothing is acknowledged");

    src.fail_after(None);
    catch_up_once(&mut src, &log, &tables).await.unwrap();
    assert_eq!(tables.stored("a").rows.len(), 1100);
    assert_eq!(tables.stored("a").commits, 1);
    assert_eq!(tables.stored("b").rows, rows(&[(1, "b")]));
    assert_eq!(src.acks(), vec![Lsn(20)]);
}
