//! Unit tests of what a statement over a partitioned live table shows: `EXPLAIN ANALYZE`
//! prints the files the committed scan read against the files in the table (plain
//! `EXPLAIN` does not change), and rows only the WAL tail holds still answer when the
//! committed files around them are pruned.

use arrow::array::Array;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::displayable;
use datafusion::prelude::SessionContext;
use iceberg::spec::Transform;

use super::partition_tests::{rows, run, spec, TestResult, TestTable, ROWS};
use super::*;
use crate::change::Lsn;
use crate::query::hidden::Hidden;
use crate::query::live::LiveTable;
use crate::query::tail::TailSnapshot;

const FILTER: &str = "at >= '2024-01-08T00:00:00Z'";

#[tokio::test]
async fn the_scans_metrics_show_files_scanned_against_files_in_the_table() -> TestResult {
    let mut t = TestTable::new("explain", spec(&[(3, "at_day", Transform::Day)])?)?;
    t.append(0..ROWS, true).await?;
    let scan = Arc::new(t.plan(Some(FILTER), false).await?);
    // The plan's line is unchanged.
    let plain = displayable(scan.as_ref()).one_line().to_string();
    assert!(plain.starts_with("CommittedScan: files=3,"), "{plain}");
    assert!(!plain.contains("files_in_table"), "{plain}");
    run(scan.clone()).await?;
    // As EXPLAIN ANALYZE prints the scan's line.
    let analyzed = DisplayableExecutionPlan::with_metrics(scan.as_ref())
        .one_line()
        .to_string();
    assert!(
        analyzed.starts_with("CommittedScan: files=3,"),
        "{analyzed}"
    );
    for want in [
        "files_in_table=10",
        "files_scanned=3",
        "delete_files_in_table=0",
        "delete_files_scanned=0",
        "files_read=3",
    ] {
        assert!(analyzed.contains(want), "{want} in {analyzed}");
    }
    Ok(())
}

/// The text of the plans `sql` (an EXPLAIN) returns.
async fn explained(ctx: &SessionContext, sql: &str) -> DfResult<String> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut out = String::new();
    for b in &batches {
        let plans = arrow::compute::cast(b.column(1), &DataType::Utf8)?;
        let plans = plans
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .ok_or_else(|| DataFusionError::Internal("plan text".into()))?;
        for i in 0..plans.len() {
            out.push_str(plans.value(i));
            out.push('\n');
        }
    }
    Ok(out)
}

#[tokio::test]
async fn a_live_table_prunes_committed_files_and_still_shows_the_tails_rows() -> TestResult {
    let mut t = TestTable::new("live", spec(&[(3, "at_day", Transform::Day)])?)?;
    t.append(0..ROWS, true).await?;
    let table = t.table()?;
    let schema = t.arrow_schema()?;
    // A row only the WAL holds, inside the filter's days (id 300 is 2024-01-13 12:00).
    let tail = TailSnapshot {
        floor: Lsn(0),
        schema: schema.clone(),
        hidden: Hidden::default(),
        rows: Some(rows(&schema, std::iter::once(300))?),
        fill: Vec::new(),
        changes: 1,
        oldest_commit_micros: None,
        wal_lsn: Lsn(0),
    };
    let live = LiveTable::new(
        &table,
        vec![0],
        true,
        Arc::new(tail),
        Arc::new(ScanCaches::default()),
    )
    .await?;
    let ctx = SessionContext::new();
    ctx.register_table("t", Arc::new(live))?;
    let ids = super::partition_tests::ids_where(&ctx, FILTER).await?;
    let want: Vec<i64> = (168..ROWS).chain(std::iter::once(300)).collect();
    assert_eq!(ids, want);

    let plain = explained(&ctx, &format!("EXPLAIN SELECT id FROM t WHERE {FILTER}")).await?;
    assert!(plain.contains("CommittedScan: files=3,"), "{plain}");
    assert!(!plain.contains("files_scanned"), "{plain}");
    let analyzed = explained(
        &ctx,
        &format!("EXPLAIN ANALYZE SELECT id FROM t WHERE {FILTER}"),
    )
    .await?;
    let line = analyzed
        .lines()
        .find(|l| l.contains("CommittedScan"))
        .unwrap_or_default();
    assert!(line.contains("files_in_table=10"), "{analyzed}");
    assert!(line.contains("files_scanned=3"), "{analyzed}");
    Ok(())
}
