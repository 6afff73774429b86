//! Queries, time travel: a pipeline's read view moved back to an earlier source LSN or
//! instant (`SET skippr.as_of`), rebuilt from the Iceberg snapshot each table kept at or
//! before it and the WAL tail after that snapshot, or refused with a clear error where that
//! state cannot be rebuilt exactly; or to a consistent cut, each table at the snapshot its
//! tag `skippr-cut-...` points to.

use std::collections::HashMap;

use iceberg::spec::SnapshotRef;
use iceberg::table::Table;

use super::pipeline_view::PipelineView;
use crate::change::Lsn;
use crate::error::{Error, Result};
use crate::table::cuts::{cut_name, cut_time, cuts_of, snapshot_lsn, CUT_PREFIX};
use crate::table::{
    PG_EPOCH_MICROS, SUMMARY_COMMIT_TIME, SUMMARY_FIRST_COMMIT_TIME, SUMMARY_FIRST_LSN, SUMMARY_LSN,
};
use crate::wal::Record;

/// The session setting: `SET skippr.as_of = '0/16B3748'` or `= '2026-12-01 10:00:00+00'`.
pub const AS_OF: &str = "skippr.as_of";

/// The start of the message of a time travel that cannot be answered exactly (the gateway
/// answers it with SQLSTATE 72000, Postgres's `snapshot_too_old`).
pub const AS_OF_MESSAGE: &str = "skippr.as_of cannot be answered exactly";

/// What a refused `SET skippr.as_of` says it accepts.
pub const AS_OF_FORMS: &str =
    "an LSN ('0/16B3748'), a timestamp with a time zone ('2026-12-01 10:00:00+00') or a consistent cut ('skippr-cut-20261201T100000Z')";

/// The point a session travels to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsOf {
    /// A source commit LSN: the state after every transaction ending at or before it.
    Lsn(Lsn),
    /// An instant, microseconds since 1970-01-01 UTC: the state after every source
    /// transaction committed at or before it.
    Micros(i64),
    /// The consistent cut taken at this second (since 1970-01-01 UTC), named
    /// `skippr-cut-<UTC time>`: every table at the snapshot the cut's tag points to.
    Cut(i64),
}

impl AsOf {
    /// Reads a setting's value: an LSN, or a timestamp that names its time zone.
    pub fn parse(text: &str) -> Option<AsOf> {
        let t = text.trim();
        if t.starts_with(CUT_PREFIX) {
            return cut_time(t).map(AsOf::Cut);
        }
        if t.contains('/') {
            return Lsn::parse(t).ok().map(AsOf::Lsn);
        }
        if let Ok(d) = chrono::DateTime::parse_from_rfc3339(t) {
            return Some(AsOf::Micros(d.timestamp_micros()));
        }
        ["%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%dT%H:%M:%S%.f%#z"]
            .iter()
            .find_map(|f| chrono::DateTime::parse_from_str(t, f).ok())
            .map(|d| AsOf::Micros(d.timestamp_micros()))
    }
}

/// The session's time travel, from its settings: none unless `skippr.as_of` is set.
pub fn as_of_of(meta: &HashMap<String, String>) -> Option<AsOf> {
    AsOf::parse(meta.get(AS_OF)?)
}

/// One snapshot written by skipprd in a table's history.
struct Step<'a> {
    snapshot: &'a SnapshotRef,
    lsn: Lsn,
    /// The first transaction the snapshot holds a change of (`skippr.first-lsn`).
    first: Option<Lsn>,
}

/// The table's skipprd snapshots the metadata still holds, oldest first, following parents
/// from the current one; and whether the walk reached the table's first snapshot (false:
/// older ones were expired).
fn history(table: &Table) -> (Vec<Step<'_>>, bool) {
    let meta = table.metadata();
    let mut steps = Vec::new();
    let mut next = meta.current_snapshot();
    let mut complete = false;
    // Bounded by the number of snapshots, so a malformed parent cycle cannot loop forever.
    for _ in 0..=meta.snapshots().len() {
        let Some(s) = next else { break };
        let props = &s.summary().additional_properties;
        if let Some(lsn) = props.get(SUMMARY_LSN).and_then(|v| Lsn::parse(v).ok()) {
            steps.push(Step {
                snapshot: s,
                lsn,
                first: props
                    .get(SUMMARY_FIRST_LSN)
                    .and_then(|v| Lsn::parse(v).ok()),
            });
        }
        match s.parent_snapshot_id() {
            None => {
                complete = true;
                break;
            }
            Some(id) => next = meta.snapshot_by_id(id),
        }
    }
    steps.reverse();
    (steps, complete)
}

/// `table` with `snapshot_id` as its current snapshot, in memory only: every reader (the
/// committed scan, the floor of the tail) then sees the table as it was then.
fn at_snapshot(table: &Table, snapshot_id: i64) -> Result<Table> {
    crate::table::summary::at_snapshot(table, snapshot_id).map_err(|e| {
        Error::query(format!(
            "reading table {} at snapshot {snapshot_id}: {e}",
            table.identifier()
        ))
    })
}

/// Table `name` as it was at `lsn`: its newest snapshot at or before `lsn`, when the state
/// at `lsn` follows exactly from it (see [`travel`]); `wal_from` is the LSN from which the
/// view's WAL read holds every transaction.
fn table_at(name: &str, table: &Table, lsn: Lsn, wal_from: Lsn) -> Result<Table> {
    let (steps, complete) = history(table);
    let Some(i) = steps.iter().rposition(|s| s.lsn <= lsn) else {
        let oldest = steps.first().map(|s| s.lsn);
        return Err(Error::query(match (oldest, complete) {
            (Some(oldest), true) => format!(
                "{AS_OF_MESSAGE}: {lsn} is before table {name} was first copied (at {oldest}); its history starts there"
            ),
            (Some(oldest), false) => format!(
                "{AS_OF_MESSAGE}: {lsn} is beyond the retention of table {name}: its oldest kept snapshot is at {oldest} (the pipeline's maintenance settings snapshot_retention and min_snapshots_to_keep set how far back snapshots are kept)"
            ),
            (None, _) => format!(
                "{AS_OF_MESSAGE}: table {name} keeps no snapshot written by skipprd at or before {lsn}"
            ),
        }));
    };
    let step = &steps[i];
    let next = steps.get(i + 1);
    // Exact when the WAL holds every transaction after the snapshot; when the snapshot is
    // the newest (the table committed everything up to where the WAL was removed, so it
    // did not change between its LSN and there); or when the next snapshot's first change
    // comes after `lsn` (the table did not change in between).
    let exact = step.lsn >= wal_from
        || next.is_none()
        || next.is_some_and(|n| n.first.is_some_and(|f| lsn < f));
    if !exact {
        let after = next.map(|n| n.lsn.to_string()).unwrap_or_default();
        return Err(Error::query(format!(
            "{AS_OF_MESSAGE}: table {name} has snapshots at {} and {after}, and the WAL between them was removed; the nearest LSNs it can answer at are {} and {after}",
            step.lsn, step.lsn
        )));
    }
    tracing::debug!(table = name, snapshot = step.snapshot.snapshot_id(), snapshot_lsn = %step.lsn, lsn = %lsn, "time travel");
    at_snapshot(table, step.snapshot.snapshot_id())
}

/// When a step's state was reached in the source: the source commit time of its newest
/// transaction, or (written before that was recorded) when Iceberg recorded it, which is
/// later.
fn reached_at(step: &Step<'_>) -> i64 {
    step.snapshot
        .summary()
        .additional_properties
        .get(SUMMARY_COMMIT_TIME)
        .and_then(|v| v.parse().ok())
        .unwrap_or(step.snapshot.timestamp_ms() * 1000)
}

fn micros_text(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .map(|d| d.to_rfc3339())
        .unwrap_or_default()
}

/// The LSN an instant stands for in `view`: that of the last source transaction committed at
/// or before it. Known from the WAL's transactions (each carries its commit time) and from
/// the snapshots (`skippr.commit-time`); exact when the WAL holds every transaction after
/// that LSN (`wal_from`), or when every table's next snapshot holds only transactions
/// committed after the instant (`skippr.first-commit-time`). An instant newer than
/// everything the view holds is the view's own LSN.
pub fn lsn_at(view: &PipelineView, micros: i64, wal_from: Lsn) -> Result<Lsn> {
    let mut reached: Option<Lsn> = None;
    let mut later = false;
    let mut oldest: Option<i64> = None;
    let mut note = |lsn: Lsn, at: i64| {
        oldest = Some(oldest.map_or(at, |o| o.min(at)));
        if at <= micros {
            reached = Some(reached.map_or(lsn, |r| r.max(lsn)));
        } else {
            later = true;
        }
    };
    for (_, records) in &view.read.segments {
        for r in records.iter() {
            if let Record::Txn(t) = r {
                note(t.end_lsn, t.commit_time_micros + PG_EPOCH_MICROS);
            }
        }
    }
    for table in view.tables.values() {
        for step in history(table).0 {
            note(step.lsn, reached_at(&step));
        }
    }
    if !later {
        return Ok(view.lsn);
    }
    let Some(lsn) = reached.map(|r| r.min(view.lsn)) else {
        return Err(Error::query(format!(
            "{AS_OF_MESSAGE}: {} is beyond the retention of pipeline {}: its oldest kept state is from {} (the pipeline's maintenance settings snapshot_retention and min_snapshots_to_keep set how far back snapshots are kept)",
            micros_text(micros),
            view.pipeline,
            oldest.map(micros_text).unwrap_or_default()
        )));
    };
    if lsn >= wal_from {
        return Ok(lsn);
    }
    for (name, table) in &view.tables {
        let (steps, _) = history(table);
        let Some(next) = steps.iter().find(|s| s.lsn > lsn) else {
            continue;
        };
        if first_commit_time(next).is_none_or(|f| f <= micros) {
            return Err(Error::query(format!(
                "{AS_OF_MESSAGE}: table {name} changed between {lsn} and {} and the WAL of that time was removed, so the state at {} is not known; the nearest instants it can answer at are {} and {}",
                next.lsn,
                micros_text(micros),
                steps
                    .iter()
                    .rfind(|s| s.lsn <= lsn)
                    .map(|s| micros_text(reached_at(s)))
                    .unwrap_or_default(),
                micros_text(reached_at(next)),
            )));
        }
    }
    Ok(lsn)
}

/// The source commit time of the first transaction a step holds (`skippr.first-commit-time`).
fn first_commit_time(step: &Step<'_>) -> Option<i64> {
    step.snapshot
        .summary()
        .additional_properties
        .get(SUMMARY_FIRST_COMMIT_TIME)
        .and_then(|v| v.parse::<i64>().ok())
}

/// The oldest position after which travel to `as_of` may need the WAL's transactions: the
/// newest snapshot at or before the point of each table that changed across it (its next
/// snapshot holds a transaction from at or before the point; by source commit time for an
/// instant). `None` when no table needs any: each is then exactly its snapshot at the point
/// (or, after its newest snapshot, the live WAL's tail), or is refused. A time-travel view
/// reads the WAL's history only from here, so its memory is bounded by the commits around
/// the point, not by `snapshot_retention`.
pub fn wal_needed_from(view: &PipelineView, as_of: AsOf) -> Option<Lsn> {
    let mut floor: Option<Lsn> = None;
    for table in view.tables.values() {
        let (steps, _) = history(table);
        let (at, changed) = match as_of {
            AsOf::Cut(_) => return None,
            AsOf::Lsn(l) => {
                let i = steps.iter().rposition(|s| s.lsn <= l);
                let next = steps.get(i.map_or(0, |i| i + 1));
                (i, next.is_some_and(|n| n.first.is_none_or(|f| f <= l)))
            }
            AsOf::Micros(m) => {
                let i = steps.iter().rposition(|s| reached_at(s) <= m);
                let next = steps.get(i.map_or(0, |i| i + 1));
                (
                    i,
                    next.is_some_and(|n| first_commit_time(n).is_none_or(|f| f <= m)),
                )
            }
        };
        if let (Some(i), true) = (at, changed) {
            let from = steps[i].lsn;
            floor = Some(floor.map_or(from, |f| f.min(from)));
        }
    }
    floor
}

/// Moves `view` (read live, at or after `as_of`) back to `as_of`: each table at its newest
/// snapshot at or before the LSN, the tail over (that snapshot, LSN] from the WAL read.
/// Refuses, rather than answering a state the source never had, where a table's state at
/// the LSN is not known exactly: a statement that reads such a table fails. Later than the
/// view is the view itself (the caller waited for an LSN; an instant newer than everything
/// held is the live state). `wal_from` is the position after which `view.read` holds every
/// transaction (the WAL's history included, see [`crate::wal::WalHistory`]).
pub fn travel(mut view: PipelineView, as_of: AsOf, wal_from: Lsn) -> Result<PipelineView> {
    let lsn = match as_of {
        AsOf::Lsn(l) => l,
        AsOf::Micros(m) => lsn_at(&view, m, wal_from)?,
        AsOf::Cut(secs) => return at_cut(view, &cut_name(secs)),
    };
    if lsn >= view.lsn {
        return Ok(view);
    }
    let mut tables = HashMap::with_capacity(view.tables.len());
    for (name, table) in &view.tables {
        match table_at(name, table, lsn, wal_from) {
            Ok(t) => {
                tables.insert(name.clone(), t);
            }
            // Only a statement that reads the table fails (a table added to the pipeline
            // later does not stop time travel over the others).
            Err(e) => {
                view.refused.insert(name.clone(), e.message().to_string());
            }
        }
    }
    view.tables = tables;
    view.lsn = lsn;
    Ok(view)
}

/// Moves `view` to the consistent cut `name`: each table at the snapshot its tag points to,
/// the view at the cut's LSN (the newest `skippr.lsn` of those snapshots: no table changed
/// between its snapshot and it, so the WAL tail adds nothing). A table without the tag (added
/// to the pipeline after the cut) is refused; a cut no table holds is an error.
fn at_cut(mut view: PipelineView, name: &str) -> Result<PipelineView> {
    let mut tables = HashMap::with_capacity(view.tables.len());
    let mut lsn: Option<Lsn> = None;
    let mut missing = Vec::new();
    for (table_name, table) in &view.tables {
        let meta = table.metadata();
        let Some(cut) = cuts_of(meta)?.into_iter().find(|c| c.name == name) else {
            missing.push(table_name.clone());
            continue;
        };
        if let Some(l) = snapshot_lsn(meta, cut.snapshot_id) {
            lsn = Some(lsn.map_or(l, |x| x.max(l)));
        }
        tables.insert(table_name.clone(), at_snapshot(table, cut.snapshot_id)?);
    }
    let Some(lsn) = lsn else {
        return Err(Error::query(format!(
            "{AS_OF_MESSAGE}: pipeline {} holds no consistent cut {name}: it was never taken or was dropped (consistent_cuts.keep); `SELECT DISTINCT cut_name FROM skippr.cuts` lists the cuts kept",
            view.pipeline
        )));
    };
    for table_name in missing {
        view.refused.insert(
            table_name.clone(),
            format!("{AS_OF_MESSAGE}: table {table_name} is not part of consistent cut {name} (it joined the pipeline after the cut was taken)"),
        );
    }
    tracing::debug!(pipeline = %view.pipeline, cut = name, lsn = %lsn, "time travel to a consistent cut");
    view.tables = tables;
    view.lsn = lsn;
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_an_lsn_or_a_timestamp_with_a_zone() {
        assert_eq!(AsOf::parse("0/16B3748"), Some(AsOf::Lsn(Lsn(0x16B3748))));
        let t = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .map(|d| d.timestamp_micros())
            .ok();
        for text in [
            "2026-12-01 10:00:00+00",
            "2026-12-01 10:00:00.000+00:00",
            "2026-12-01T10:00:00Z",
            "2026-12-01 12:00:00+02",
        ] {
            assert_eq!(
                AsOf::parse(text).map(|a| match a {
                    AsOf::Micros(m) => Some(m),
                    AsOf::Lsn(_) | AsOf::Cut(_) => None,
                }),
                Some(t),
                "{text}"
            );
        }
        assert_eq!(AsOf::parse("2026-12-01 10:00:00"), None, "no zone");
        assert_eq!(AsOf::parse("yesterday"), None);
        assert_eq!(
            AsOf::parse(" skippr-cut-20261201T100000Z "),
            t.map(|m| AsOf::Cut(m / 1_000_000))
        );
        assert_eq!(AsOf::parse("skippr-cut-2026"), None);
        assert_eq!(AsOf::parse("0/xyz"), None);
    }
}
