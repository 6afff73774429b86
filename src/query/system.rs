//! Queries, system tables: `skippr.tables` shows each replicated table's committed LSN, its
//! WAL tail, its last commit, its lag, the state of the pipeline that writes it and what
//! table maintenance left (files, snapshots, last compaction), computed when a query reads it.

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

use super::{committed_lsn_text, tail_lag_seconds, Workspace};
use crate::table::PROP_LAST_COMPACTION;

/// Name of the table-status system table.
pub const TABLES: &str = "tables";

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

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        vec![TABLES.to_string()]
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if name != TABLES {
            return Ok(None);
        }
        let batch = tables_batch(&self.ws)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let table = MemTable::try_new(tables_schema(), vec![vec![batch]])?;
        Ok(Some(Arc::new(table)))
    }

    fn table_exist(&self, name: &str) -> bool {
        name == TABLES
    }
}
