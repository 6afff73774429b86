//! Query engine, scheduling: a yield point above every operator that can emit many batches
//! for each batch it reads (joins, aggregates, sorts, windows, unnest). The engine's own yield
//! points sit at the scans and exchanges only, so a join that matches one probe batch against
//! millions of rows, or a sort emitting its output, never returned to the scheduler: one
//! statement held a worker thread for minutes, short statements of other sessions waited
//! behind it, and its `statement_timeout` or cancel took effect only when it next read its
//! input. With a yield point after every batch such an operator emits (tokio's task budget,
//! as the engine's `CooperativeExec` spends it), the statement's task gives the thread back
//! every 128 batches at most: the cores are shared between statements, and a timeout or a
//! cancel ends a statement at its next yield.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::ExecutionPlan;

/// Operators whose output is not paced by their input (by `ExecutionPlan::name`).
const EMIT_MANY: &[&str] = &[
    "HashJoinExec",
    "NestedLoopJoinExec",
    "CrossJoinExec",
    "SortMergeJoinExec",
    "SymmetricHashJoinExec",
    "PiecewiseMergeJoinExec",
    "AggregateExec",
    "SortExec",
    "WindowAggExec",
    "BoundedWindowAggExec",
    "UnnestExec",
    "RecursiveQueryExec",
];

/// The physical optimizer rule that adds the yield points; it runs after the engine's rules.
#[derive(Debug, Default)]
pub struct YieldPoints;

impl PhysicalOptimizerRule for YieldPoints {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if EMIT_MANY.contains(&node.name()) {
                Ok(Transformed::yes(
                    Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>
                ))
            } else {
                Ok(Transformed::no(node))
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "skippr_yield_points"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn joins_and_aggregates_get_a_yield_point_above_them() {
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(YieldPoints))
            .build();
        let ctx = SessionContext::new_with_state(state);
        let df = ctx
            .sql(
                "SELECT count(*) FROM (VALUES (1), (2)) a(x) JOIN (VALUES (1), (3)) b(y) ON a.x = b.y",
            )
            .await
            .unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let text = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for op in ["HashJoinExec", "AggregateExec"] {
            let at = lines
                .iter()
                .position(|l| l.starts_with(op))
                .unwrap_or_else(|| panic!("no {op} in\n{text}"));
            assert!(
                at > 0 && lines[at - 1].starts_with("CooperativeExec"),
                "{op} has no yield point above it:\n{text}"
            );
        }
        let rows = df.collect().await.unwrap();
        assert_eq!(rows[0].num_rows(), 1);
    }

    /// Runs a join whose one probe batch matches every build row (it emits all of its output
    /// without reading its input) beside a task that counts how often it gets the thread;
    /// returns that count.
    async fn ticks_beside_a_join(with_rule: bool) -> u64 {
        let mut b = datafusion::execution::SessionStateBuilder::new()
            .with_config(datafusion::prelude::SessionConfig::new().with_target_partitions(1))
            .with_default_features();
        if with_rule {
            b = b.with_physical_optimizer_rule(Arc::new(YieldPoints));
        }
        let ctx = SessionContext::new_with_state(b.build());
        let sql = "SELECT count(*) FROM generate_series(1, 4000) a(x) JOIN generate_series(1, 4000) b(y) ON (a.x % 1) = (b.y % 1)";
        let df = ctx.sql(sql).await.unwrap();
        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        let rows = df.collect().await.unwrap();
        ticker.abort();
        let count = rows[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(count, 16_000_000);
        ticks.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_join_that_emits_without_reading_lets_other_tasks_run() {
        let without = ticks_beside_a_join(false).await;
        let with = ticks_beside_a_join(true).await;
        eprintln!("ticks without yield points {without}, with {with}");
        assert!(
            with >= 10 && with > 4 * without.max(1),
            "the other task ran {with} times beside the join with yield points, {without} without"
        );
    }
}
