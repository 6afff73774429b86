//! The change half of a pipeline, consistent cuts: right after a commit round that left every
//! table at one source LSN, once `consistent_cuts.every` has passed since the last cut, tags
//! the current snapshot of every table with the same `skippr-cut-<UTC time>` tag (one catalog
//! request with a REST catalog that offers multi-table commits) and removes the tags of the
//! cuts beyond `keep`. The tags are the cut's only record (see [`crate::table::cuts`]).

use super::seams::TableSink;
use crate::change::Lsn;
use crate::error::Result;
use crate::table::cuts::{cut_name, dropped, CutSettings, TableCut};

/// When the pipeline's next cut is due.
#[derive(Debug, Clone)]
pub struct CutClock {
    settings: CutSettings,
    /// When the newest cut was taken (seconds since 1970-01-01 UTC), read from the tables'
    /// tags at the first round; `None` before that.
    last: Option<Option<i64>>,
}

impl CutClock {
    pub fn new(settings: CutSettings) -> Self {
        Self {
            settings,
            last: None,
        }
    }
}

/// A cut taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub name: String,
    /// The LSN every table was committed through when the cut was taken.
    pub lsn: Lsn,
    /// The tags of older cuts removed with it.
    pub dropped: Vec<String>,
}

/// Every table's cuts.
fn held<T: TableSink>(tables: &[T]) -> Result<Vec<TableCut>> {
    let mut out = Vec::new();
    for t in tables {
        out.extend(t.cuts()?);
    }
    Ok(out)
}

/// Takes a cut of `tables` when one is due at `now_ms` (milliseconds since 1970-01-01 UTC)
/// and every table, with nothing staged, covers the same LSN: their current snapshots then
/// show the source exactly there. Called right after a commit round; when the tables are not
/// at one LSN yet, the cut waits for the next round. A tag that fails leaves no partial cut
/// behind where it can be helped (the tags already set are removed again) and fails the
/// round, as a failed commit does.
pub async fn cut_if_due<T: TableSink>(
    tables: &mut [T],
    clock: &mut CutClock,
    pipeline: &str,
    now_ms: i64,
) -> Result<Option<Cut>> {
    if tables.is_empty() {
        return Ok(None);
    }
    let last = match clock.last {
        Some(last) => last,
        None => {
            let last = held(tables)?.iter().map(|c| c.time).max();
            clock.last = Some(last);
            last
        }
    };
    let every_ms = i64::try_from(clock.settings.every.as_millis()).unwrap_or(i64::MAX);
    if last.is_some_and(|l| now_ms.saturating_sub(l.saturating_mul(1000)) < every_ms) {
        return Ok(None);
    }
    let lsn = tables[0].covered();
    if tables
        .iter()
        .any(|t| t.pending_changes() > 0 || t.covered() != lsn || !t.has_snapshot())
    {
        tracing::debug!(
            pipeline,
            "consistent cut waits: the tables are not all committed through one LSN yet"
        );
        return Ok(None);
    }
    let name = cut_name(now_ms.div_euclid(1000));
    let drop = dropped(&held(tables)?, Some(&name), clock.settings.keep);
    let round = crate::catalog::Round::default();
    let tagged = round
        .run(async {
            for (i, t) in tables.iter_mut().enumerate() {
                if let Err(e) = t.tag_cut(Some(&name), &drop).await {
                    return Err((i, e));
                }
            }
            Ok(())
        })
        .await;
    let outcome = match tagged {
        Ok(()) => round.finish().await.map(|_| ()),
        Err((i, e)) => {
            for t in &mut tables[..i] {
                if let Err(undo) = t.tag_cut(None, std::slice::from_ref(&name)).await {
                    tracing::warn!(pipeline, table = %t.source(), cut = %name, error = %undo.report(), "a tag of an incomplete consistent cut could not be removed; remove it, or read the cut only where every table holds it");
                }
            }
            Err(e)
        }
    };
    outcome?;
    clock.last = Some(Some(now_ms.div_euclid(1000)));
    crate::telemetry::metrics::add(
        "skippr_consistent_cuts_total",
        "Consistent cuts taken (every table of the pipeline tagged at one LSN).",
        &[("pipeline", pipeline)],
        1.0,
    );
    tracing::info!(pipeline, cut = %name, lsn = %lsn, tables = tables.len(), dropped = drop.len(), "consistent cut taken");
    Ok(Some(Cut {
        name,
        lsn,
        dropped: drop,
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::change::Change;
    use crate::pipeline::cdc::catch_up_once;
    use crate::pipeline::doubles::{insert, relation, txn, update, MemLog, MemSource, MemTables};
    use crate::table::cuts::cut_time;

    const SEC: i64 = 1000;
    /// 2026-12-01T10:00:00Z, in milliseconds.
    const T0: i64 = 1_796_119_200_000;

    fn settings(every_s: u64, keep: usize) -> CutSettings {
        CutSettings {
            every: Duration::from_secs(every_s),
            keep,
        }
    }

    /// Applies `changes` of the transaction ending at `end` to table `i` (the others only
    /// advance), then commits every table.
    async fn round<T: TableSink>(tables: &mut [T], end: u64, i: usize, change: Change) {
        tables[i].apply(&change, Lsn(end)).unwrap();
        for t in tables.iter_mut() {
            t.advance(Lsn(end));
            t.commit().await.unwrap();
        }
    }

    #[tokio::test]
    async fn every_table_is_tagged_alike_at_each_interval_and_old_cuts_go() {
        let dir = tempfile::tempdir().unwrap();
        let mem = MemTables::new(&["a", "b"], dir.path());
        let mut tables = mem.sinks();
        let mut clock = CutClock::new(settings(10, 2));
        round(&mut tables, 10, 0, insert(1, 1, "x")).await;
        let first = cut_if_due(&mut tables, &mut clock, "app", T0)
            .await
            .unwrap()
            .expect("the first round takes a cut");
        assert_eq!(first.name, "skippr-cut-20261201T100000Z");
        assert_eq!(first.lsn, Lsn(10));
        // Within `every`: no cut, whatever the rounds.
        round(&mut tables, 20, 1, insert(2, 1, "b")).await;
        assert_eq!(
            cut_if_due(&mut tables, &mut clock, "app", T0 + 9 * SEC)
                .await
                .unwrap(),
            None
        );
        let second = cut_if_due(&mut tables, &mut clock, "app", T0 + 10 * SEC)
            .await
            .unwrap()
            .expect("due after `every`");
        assert_eq!(second.name, "skippr-cut-20261201T100010Z");
        assert!(second.dropped.is_empty());
        round(&mut tables, 30, 0, update(1, 1, "x2")).await;
        let third = cut_if_due(&mut tables, &mut clock, "app", T0 + 25 * SEC)
            .await
            .unwrap()
            .expect("due");
        assert_eq!(third.dropped, std::slice::from_ref(&first.name), "keep: 2");
        for name in ["a", "b"] {
            let tags = &mem.stored(name).tags;
            assert_eq!(
                tags.keys().cloned().collect::<Vec<_>>(),
                [second.name.clone(), third.name.clone()],
                "table {name}"
            );
        }
        // Each tag shows the state at its LSN: table a's update is in the third cut only.
        assert_eq!(mem.stored("a").tags[&second.name].1[&1], "x");
        assert_eq!(mem.stored("a").tags[&third.name].1[&1], "x2");
        assert_eq!(mem.stored("b").tags[&second.name].1[&1], "b");
        // A new run learns when the last cut was from the tags.
        let mut tables = mem.sinks();
        let mut clock = CutClock::new(settings(10, 2));
        round(&mut tables, 40, 1, update(2, 1, "b2")).await;
        assert_eq!(
            cut_if_due(&mut tables, &mut clock, "app", T0 + 30 * SEC)
                .await
                .unwrap(),
            None
        );
        assert!(cut_if_due(&mut tables, &mut clock, "app", T0 + 35 * SEC)
            .await
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn a_cut_waits_until_every_table_is_at_one_lsn() {
        let dir = tempfile::tempdir().unwrap();
        let mem = MemTables::new(&["a", "b"], dir.path());
        let mut tables = mem.sinks();
        let mut clock = CutClock::new(settings(1, 5));
        // Table a holds a change through 20 still staged; b is through 20.
        tables[0].apply(&insert(1, 1, "x"), Lsn(20)).unwrap();
        tables[1].advance(Lsn(20));
        assert_eq!(
            cut_if_due(&mut tables, &mut clock, "app", T0)
                .await
                .unwrap(),
            None,
            "a change is staged"
        );
        tables[0].commit().await.unwrap();
        // Table b knows nothing past 10 yet.
        let mut tables_b_behind = mem.sinks();
        tables_b_behind[0].advance(Lsn(20));
        tables_b_behind[1].advance(Lsn(10));
        assert_eq!(
            cut_if_due(&mut tables_b_behind, &mut clock, "app", T0)
                .await
                .unwrap(),
            None,
            "the tables cover different LSNs"
        );
        assert!(mem.stored("a").tags.is_empty() && mem.stored("b").tags.is_empty());
    }

    #[tokio::test]
    async fn a_failed_tag_leaves_no_partial_cut_and_fails_the_round() {
        let dir = tempfile::tempdir().unwrap();
        let mem = MemTables::new(&["a", "b"], dir.path());
        let mut tables = mem.sinks();
        let mut clock = CutClock::new(settings(1, 5));
        round(&mut tables, 10, 0, insert(1, 1, "x")).await;
        mem.stored("b").fail_tags = 1;
        let e = cut_if_due(&mut tables, &mut clock, "app", T0)
            .await
            .unwrap_err();
        assert!(e.message().contains("test tag failed"), "{}", e.message());
        assert!(
            mem.stored("a").tags.is_empty(),
            "the partial tag was removed"
        );
        // The next round takes it.
        let cut = cut_if_due(&mut tables, &mut clock, "app", T0 + 100)
            .await
            .unwrap()
            .expect("taken at the next round");
        assert_eq!(cut_time(&cut.name), Some(T0 / SEC));
    }

    #[tokio::test]
    async fn sync_once_takes_a_cut_after_its_round() {
        let dir = tempfile::tempdir().unwrap();
        let mut src = MemSource::new(vec![relation(1, "a"), relation(2, "b")]);
        let log = MemLog::default();
        let mut mem = MemTables::new(&["a", "b"], dir.path());
        mem.cuts = Some(settings(3600, 48));
        src.commit(txn(10, vec![insert(1, 1, "x")]));
        src.commit(txn(20, vec![insert(2, 1, "y")]));
        catch_up_once(&mut src, &log, &mem).await.unwrap();
        let a = mem.stored("a").tags.clone();
        let b = mem.stored("b").tags.clone();
        assert_eq!(a.len(), 1);
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        let name = a.keys().next().unwrap();
        assert!(name.starts_with("skippr-cut-"), "{name}");
        // Both tables committed through 20 in one round, and the cut shows them there.
        assert_eq!((a[name].0, b[name].0), (Lsn(20), Lsn(20)));
        assert_eq!((a[name].1[&1].as_str(), b[name].1[&1].as_str()), ("x", "y"));
    }
}
