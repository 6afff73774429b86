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
        tracing::debug!(pipeline, "consistent cut waits: the tables are not all committed through one LSN yet");
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
