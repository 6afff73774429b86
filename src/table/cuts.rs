//! The table layer, consistent cuts: the Iceberg tag `skippr-cut-<UTC time>` that every table
//! of a pipeline carries for one cut, named and read back here for the sink (which sets and
//! drops the tags), maintenance (which keeps tagged snapshots) and queries (`skippr.cuts`,
//! `SET skippr.as_of = 'skippr-cut-...'`). The tags are the only record of a cut.

use std::collections::HashMap;

use iceberg::spec::{SnapshotReference, SnapshotRetention, TableMetadata};
use iceberg::table::Table;

use super::SUMMARY_LSN;
use crate::change::Lsn;
pub use crate::config::{
    CutSettings, DEFAULT_CUT_EVERY, DEFAULT_CUT_KEEP, MAX_CUT_KEEP, MIN_CUT_EVERY,
};
use crate::error::{Error, Result};

/// The start of every cut's tag name.
pub const CUT_PREFIX: &str = "skippr-cut-";
/// The UTC time in a cut's name: `20261201T100000Z`.
const CUT_TIME_FORMAT: &str = "%Y%m%dT%H%M%SZ";
/// The tag name of the cut taken at `secs` (seconds since 1970-01-01 UTC).
pub fn cut_name(secs: i64) -> String {
    let time = chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default();
    format!("{CUT_PREFIX}{}", time.format(CUT_TIME_FORMAT))
}

/// When the cut named `name` was taken (seconds since 1970-01-01 UTC); `None` for a name
/// that is not a cut's.
pub fn cut_time(name: &str) -> Option<i64> {
    let text = name.strip_prefix(CUT_PREFIX)?;
    chrono::NaiveDateTime::parse_from_str(text, CUT_TIME_FORMAT)
        .ok()
        .map(|t| t.and_utc().timestamp())
}

/// A table's snapshot references, tags and branches (iceberg-rust keeps them private; the
/// metadata's own JSON form lists them).
pub fn refs(meta: &TableMetadata) -> Result<HashMap<String, SnapshotReference>> {
    let json = serde_json::to_value(meta)
        .map_err(|e| Error::fatal(format!("reading a table's snapshot references: {e}")))?;
    match json.get("refs") {
        None | Some(serde_json::Value::Null) => Ok(HashMap::new()),
        Some(refs) => serde_json::from_value(refs.clone())
            .map_err(|e| Error::fatal(format!("reading a table's snapshot references: {e}"))),
    }
}

/// One cut as one table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCut {
    pub name: String,
    /// When it was taken, seconds since 1970-01-01 UTC.
    pub time: i64,
    pub snapshot_id: i64,
}

/// The cuts a table holds (its tags named like a cut), oldest first.
pub fn cuts_of(meta: &TableMetadata) -> Result<Vec<TableCut>> {
    let mut out: Vec<TableCut> = refs(meta)?
        .into_iter()
        .filter(|(_, r)| matches!(r.retention, SnapshotRetention::Tag { .. }))
        .filter_map(|(name, r)| {
            cut_time(&name).map(|time| TableCut {
                name,
                time,
                snapshot_id: r.snapshot_id,
            })
        })
        .collect();
    out.sort_by_key(|c| c.time);
    Ok(out)
}

/// The source LSN a snapshot covers (`skippr.lsn`), if skipprd wrote it.
pub fn snapshot_lsn(meta: &TableMetadata, snapshot_id: i64) -> Option<Lsn> {
    meta.snapshot_by_id(snapshot_id)?
        .summary()
        .additional_properties
        .get(SUMMARY_LSN)
        .and_then(|v| Lsn::parse(v).ok())
}

/// The LSN at which a cut shows the source: the newest `skippr.lsn` among its tagged
/// snapshots. A table tagged at an older LSN had no change between that LSN and the cut's
/// round, so every table shows the source exactly at this one.
pub fn cut_lsn<'a>(tables: impl IntoIterator<Item = &'a Table>, name: &str) -> Result<Option<Lsn>> {
    let mut lsn: Option<Lsn> = None;
    for t in tables {
        let meta = t.metadata();
        if let Some(c) = cuts_of(meta)?.into_iter().find(|c| c.name == name) {
            if let Some(l) = snapshot_lsn(meta, c.snapshot_id) {
                lsn = Some(lsn.map_or(l, |x| x.max(l)));
            }
        }
    }
    Ok(lsn)
}

/// The cuts of several tables that fall out of the newest `keep` (with `new` counted among
/// them): the tags to remove.
pub fn dropped(held: &[TableCut], new: Option<&str>, keep: usize) -> Vec<String> {
    let mut times: Vec<(i64, &str)> = held.iter().map(|c| (c.time, c.name.as_str())).collect();
    if let Some(n) = new {
        if let Some(t) = cut_time(n) {
            times.push((t, n));
        }
    }
    times.sort();
    times.dedup();
    let excess = times.len().saturating_sub(keep);
    times[..excess].iter().map(|(_, n)| n.to_string()).collect()
}

/// The tag a cut sets: a tag (never a branch) that expires only when skipprd drops it.
pub fn cut_ref(snapshot_id: i64) -> SnapshotReference {
    SnapshotReference::new(
        snapshot_id,
        SnapshotRetention::Tag {
            max_ref_age_ms: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_time() {
        let t = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:05Z")
            .map(|d| d.timestamp())
            .unwrap();
        assert_eq!(cut_name(t), "skippr-cut-20261201T100005Z");
        assert_eq!(cut_time("skippr-cut-20261201T100005Z"), Some(t));
        assert_eq!(cut_time("skippr-cut-20261201T1000Z"), None);
        assert_eq!(cut_time("main"), None);
        assert!(cut_name(t) < cut_name(t + 1));
    }

    fn cut(time: i64) -> TableCut {
        TableCut {
            name: cut_name(time),
            time,
            snapshot_id: time,
        }
    }

    #[test]
    fn the_oldest_cuts_beyond_keep_are_dropped() {
        let held = [cut(30), cut(10), cut(20), cut(10)];
        assert_eq!(
            dropped(&held, Some(&cut_name(40)), 2),
            [cut_name(10), cut_name(20)]
        );
        assert_eq!(dropped(&held, None, 3), Vec::<String>::new());
        assert_eq!(dropped(&held, Some(&cut_name(40)), 4), Vec::<String>::new());
    }
}
