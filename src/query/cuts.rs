//! Queries, system table `skippr.cuts`: one row per consistent cut and table (the cut's name,
//! the LSN it shows the source at, when it was taken, the table and the snapshot its tag
//! points to), read from the tables' tags when a query reads it, for the engines that travel
//! by snapshot id (Athena, DuckDB, PyIceberg).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::Workspace;
use crate::change::Lsn;
use crate::table::cuts::{cuts_of, snapshot_lsn};

/// Name of the consistent-cuts system table.
pub const CUTS: &str = "cuts";

/// Columns of `skippr.cuts`.
pub fn cuts_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("cut_name", DataType::Utf8, false),
        Field::new("lsn", DataType::Utf8, true),
        Field::new(
            "cut_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            false,
        ),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("snapshot_id", DataType::Int64, false),
    ]))
}

/// One table's tag of one cut.
struct Row {
    cut: String,
    time: i64,
    table: String,
    snapshot_id: i64,
    lsn: Option<Lsn>,
}

/// Builds the rows of `skippr.cuts` now, oldest cut first. A cut's LSN is the newest
/// `skippr.lsn` among its tagged snapshots (of the pipeline that took it): every table of the
/// cut shows the source exactly there.
pub async fn cuts_batch(ws: &Workspace) -> crate::error::Result<RecordBatch> {
    let mut rows = Vec::new();
    // (pipeline, cut) -> the cut's LSN.
    let mut lsns: BTreeMap<(Option<String>, String), Lsn> = BTreeMap::new();
    for (pipeline, table) in ws.committed_tables().await? {
        let meta = table.metadata();
        for c in cuts_of(meta)? {
            let lsn = snapshot_lsn(meta, c.snapshot_id);
            if let Some(l) = lsn {
                let at = lsns.entry((pipeline.clone(), c.name.clone())).or_default();
                *at = (*at).max(l);
            }
            rows.push((
                pipeline.clone(),
                Row {
                    cut: c.name,
                    time: c.time,
                    table: table.identifier().name().to_string(),
                    snapshot_id: c.snapshot_id,
                    lsn,
                },
            ));
        }
    }
    rows.sort_by(|a, b| (a.1.time, &a.0, &a.1.table).cmp(&(b.1.time, &b.0, &b.1.table)));
    let lsn_of = |pipeline: &Option<String>, r: &Row| {
        lsns.get(&(pipeline.clone(), r.cut.clone()))
            .copied()
            .or(r.lsn)
            .map(|l| l.to_string())
    };
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(_, r)| r.cut.as_str()),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|(p, r)| lsn_of(p, r)).collect::<Vec<_>>(),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(
                rows.iter().map(|(_, r)| r.time.saturating_mul(1_000_000)),
            )
            .with_timezone("+00:00"),
        ),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(_, r)| r.table.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|(_, r)| r.snapshot_id),
        )),
    ];
    Ok(RecordBatch::try_new(cuts_schema(), arrays)?)
}
