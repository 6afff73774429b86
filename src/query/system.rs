//! Queries, system tables: `skippr.tables` shows each replicated table's committed LSN, its
//! WAL tail, its last commit, its lag, the state of the pipeline that writes it and what
//! table maintenance left (files, snapshots, last compaction), computed when a query reads it;
//! `skippr.sources` each pipeline's replication slot (retained WAL, lag, warnings), asked of
//! its source when a query reads it; `skippr.cuts` the consistent cuts (see `cuts.rs`).

use std::any::Any;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};

use super::cuts::{cuts_batch, cuts_schema, CUTS};
use super::{committed_lsn_text, tail_lag_seconds, Workspace};
use crate::table::PROP_LAST_COMPACTION;

/// Name of the table-status system table.
pub const TABLES: &str = "tables";
/// Name of the source-status system table (each pipeline's replication slot).
pub const SOURCES: &str = "sources";

/// The `skippr` schema.
pub struct SystemSchema {
    ws: Arc<Workspace>,
}

impl std::fmt::Debug for SystemSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SystemSchema")
    }
}

impl SystemSchema {
    pub fn new(ws: Arc<Workspace>) -> Self {
        Self { ws }
    }
}

/// Columns of `skippr.tables`.
pub fn tables_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("table_schema", DataType::Utf8, false),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("pipeline", DataType::Utf8, true),
        Field::new("committed_lsn", DataType::Utf8, false),
        Field::new("wal_lsn", DataType::Utf8, true),
        Field::new("wal_tail_changes", DataType::Int64, false),
        Field::new("wal_tail_rows", DataType::Int64, false),
        Field::new("wal_bytes", DataType::Int64, false),
        Field::new(
            "last_commit_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("lag_seconds", DataType::Float64, false),
        Field::new("pipeline_state", DataType::Utf8, true),
        Field::new("pipeline_error", DataType::Utf8, true),
        Field::new("data_files", DataType::Int64, false),
        Field::new("delete_files", DataType::Int64, false),
        Field::new("snapshots", DataType::Int64, false),
        Field::new(
            "last_compaction_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("tail_lsn", DataType::Utf8, true),
        Field::new("lag_bytes", DataType::Int64, true),
        Field::new("partition_spec_id", DataType::Int32, false),
        Field::new("partition_by", DataType::Utf8, true),
        Field::new("sort_by", DataType::Utf8, true),
    ]))
}

/// Builds the rows of `skippr.tables` now.
pub async fn tables_batch(ws: &Workspace) -> crate::error::Result<RecordBatch> {
    let states = ws.states().await?;
    let mut cols: (Vec<String>, Vec<String>, Vec<Option<String>>, Vec<String>) = Default::default();
    let mut wal_lsn = Vec::new();
    let mut changes = Vec::new();
    let mut rows = Vec::new();
    let mut bytes = Vec::new();
    let mut commit = Vec::new();
    let mut lag = Vec::new();
    let mut tail_lsn = Vec::new();
    let mut lag_bytes = Vec::new();
    let mut pipeline_state = Vec::new();
    let mut pipeline_error = Vec::new();
    let (mut data_files, mut delete_files, mut snapshots, mut compacted) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut spec_ids, mut partition_by, mut sort_by) = (Vec::new(), Vec::new(), Vec::new());
    for s in &states {
        let meta = s.table.metadata();
        let layout = crate::table::layout::Layout::of_table(meta);
        spec_ids.push(meta.default_partition_spec_id());
        partition_by.push(Some(layout.partition_text()).filter(|t| !t.is_empty()));
        sort_by.push(Some(layout.sort_text()).filter(|t| !t.is_empty()));
        let total = |k: &str| {
            meta.current_snapshot()
                .and_then(|snap| snap.summary().additional_properties.get(k))
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
        };
        data_files.push(total("total-data-files"));
        delete_files.push(total("total-delete-files"));
        snapshots.push(meta.snapshots().len() as i64);
        compacted.push(
            meta.properties()
                .get(PROP_LAST_COMPACTION)
                .and_then(|v| v.parse::<i64>().ok())
                .map(|ms| ms * 1000),
        );
        let status = s
            .pipeline
            .as_deref()
            .and_then(|p| crate::telemetry::state::read(&ws.storage_path, p));
        pipeline_state.push(status.as_ref().map(|st| st.state.as_str().to_string()));
        pipeline_error.push(status.and_then(|st| st.error));
        cols.0.push(ws.name.clone());
        cols.1.push(s.table.identifier().name().to_string());
        cols.2.push(s.pipeline.clone());
        cols.3.push(committed_lsn_text(&s.table));
        wal_lsn.push((s.tail.wal_lsn.0 > 0).then(|| s.tail.wal_lsn.max(s.tail.floor).to_string()));
        changes.push(s.tail.changes as i64);
        rows.push(
            s.tail
                .rows
                .as_ref()
                .map(|b| b.num_rows() as i64)
                .unwrap_or(0),
        );
        bytes.push(s.wal_bytes as i64);
        commit.push(
            s.table
                .metadata()
                .current_snapshot()
                .map(|snap| snap.timestamp_ms() * 1000),
        );
        lag.push(tail_lag_seconds(&s.tail));
        // The read view's cut: what a live query of the table shows through; the WAL bytes
        // between it and the commit are the lag a query bridges with the tail.
        let committed = crate::table::summary::committed_lsn(&s.table).unwrap_or_default();
        tail_lsn.push(s.visible_lsn.map(|l| l.max(committed).to_string()));
        lag_bytes.push(
            s.visible_lsn
                .map(|l| l.0.saturating_sub(committed.0) as i64),
        );
    }
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(cols.0)),
        Arc::new(StringArray::from(cols.1)),
        Arc::new(StringArray::from(cols.2)),
        Arc::new(StringArray::from(cols.3)),
        Arc::new(StringArray::from(wal_lsn)),
        Arc::new(Int64Array::from(changes)),
        Arc::new(Int64Array::from(rows)),
        Arc::new(Int64Array::from(bytes)),
        Arc::new(TimestampMicrosecondArray::from(commit).with_timezone("+00:00")),
        Arc::new(Float64Array::from(lag)),
        Arc::new(StringArray::from(pipeline_state)),
        Arc::new(StringArray::from(pipeline_error)),
        Arc::new(Int64Array::from(data_files)),
        Arc::new(Int64Array::from(delete_files)),
        Arc::new(Int64Array::from(snapshots)),
        Arc::new(TimestampMicrosecondArray::from(compacted).with_timezone("+00:00")),
        Arc::new(StringArray::from(tail_lsn)),
        Arc::new(Int64Array::from(lag_bytes)),
        Arc::new(Int32Array::from(spec_ids)),
        Arc::new(StringArray::from(partition_by)),
        Arc::new(StringArray::from(sort_by)),
    ];
    Ok(RecordBatch::try_new(tables_schema(), arrays)?)
}

/// Columns of `skippr.sources`.
pub fn sources_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("pipeline", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("slot", DataType::Utf8, false),
        Field::new("wal_status", DataType::Utf8, true),
        Field::new("retained_wal_bytes", DataType::Int64, true),
        Field::new("safe_wal_size", DataType::Int64, true),
        Field::new("lag_bytes", DataType::Int64, true),
        Field::new("lag_seconds", DataType::Float64, true),
        Field::new("max_retained_wal", DataType::Int64, false),
        Field::new("confirmed_flush_lsn", DataType::Utf8, true),
        Field::new("current_lsn", DataType::Utf8, true),
        Field::new("restart_lsn", DataType::Utf8, true),
        Field::new("warning", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
    ]))
}

/// Builds the rows of `skippr.sources` now: each pipeline's slot, asked of its source (all
/// at once, each bounded by the source's peer timeout).
pub async fn sources_batch(ws: &Workspace) -> crate::error::Result<RecordBatch> {
    let sources = ws.sources();
    let healths = futures::future::join_all(
        sources
            .iter()
            .map(|(_, cfg)| crate::pipeline::position::slot_health(cfg)),
    )
    .await;
    let int = |v: Option<u64>| v.and_then(|b| i64::try_from(b).ok());
    let text = |v: Option<crate::change::Lsn>| v.map(|l| l.to_string());
    let mut cols: [Vec<Option<String>>; 10] = Default::default();
    let (mut retained, mut safe, mut lag_bytes, mut lag_s, mut max) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((pipeline, cfg), h) in sources.iter().zip(healths) {
        let warnings = h.warnings(cfg);
        cols[0].push(Some(pipeline.clone()));
        cols[1].push(Some(cfg.name.clone()));
        cols[2].push(Some(cfg.slot.clone()));
        cols[3].push(h.wal_status.clone());
        cols[4].push(text(h.confirmed_flush));
        cols[5].push(text(h.current));
        cols[6].push(text(h.restart));
        cols[7].push((!warnings.is_empty()).then(|| warnings.join("; ")));
        cols[8].push(h.error.clone());
        retained.push(int(h.retained_wal_bytes));
        safe.push(h.safe_wal_size);
        lag_bytes.push(int(h.lag_bytes));
        lag_s.push(h.lag_seconds);
        max.push(i64::try_from(cfg.max_retained_wal).unwrap_or(i64::MAX));
    }
    let strings = |v: &Vec<Option<String>>| -> ArrayRef { Arc::new(StringArray::from(v.clone())) };
    let arrays: Vec<ArrayRef> = vec![
        strings(&cols[0]),
        strings(&cols[1]),
        strings(&cols[2]),
        strings(&cols[3]),
        Arc::new(Int64Array::from(retained)),
        Arc::new(Int64Array::from(safe)),
        Arc::new(Int64Array::from(lag_bytes)),
        Arc::new(Float64Array::from(lag_s)),
        Arc::new(Int64Array::from(max)),
        strings(&cols[4]),
        strings(&cols[5]),
        strings(&cols[6]),
        strings(&cols[7]),
        strings(&cols[8]),
    ];
    Ok(RecordBatch::try_new(sources_schema(), arrays)?)
}

/// `skippr.sources`, read from the sources when scanned.
struct SourcesTable {
    ws: Arc<Workspace>,
}

impl std::fmt::Debug for SourcesTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SourcesTable")
    }
}

#[async_trait]
impl TableProvider for SourcesTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        sources_schema()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::View
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::prelude::Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        let batch = sources_batch(&self.ws)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        MemTable::try_new(sources_schema(), vec![vec![batch]])?
            .scan(state, projection, filters, limit)
            .await
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        vec![TABLES.to_string(), SOURCES.to_string(), CUTS.to_string()]
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        match name {
            TABLES => {
                let batch = tables_batch(&self.ws)
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let table = MemTable::try_new(tables_schema(), vec![vec![batch]])?;
                Ok(Some(Arc::new(table)))
            }
            CUTS => {
                let batch = cuts_batch(&self.ws)
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let table = MemTable::try_new(cuts_schema(), vec![vec![batch]])?;
                Ok(Some(Arc::new(table)))
            }
            // Asked of the sources only when a statement scans it, not when a client lists
            // the catalog's columns.
            SOURCES => Ok(Some(Arc::new(SourcesTable {
                ws: self.ws.clone(),
            }))),
            _ => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        name == TABLES || name == SOURCES || name == CUTS
    }
}
