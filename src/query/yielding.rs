//! Query engine, scheduling: a time slice above every operator that can emit many batches for
//! each batch it reads (joins, aggregates, sorts, windows, unnest). The engine's own yield
//! points sit at the scans and exchanges only, so a join that matches one probe batch against
//! millions of rows, or a sort emitting its output, never returned to the scheduler: one
//! statement held a worker thread for minutes, short statements of other sessions waited
//! behind it, and its `statement_timeout` or cancel took effect only when it next read its
//! input. A yield point counted in batches (tokio's budget of 128, as the engine's
//! `CooperativeExec` spends it) bounds that, but 128 batches of a heavy join are half a second
//! of one core: a short statement queued behind two such tasks waited that long at each of its
//! steps. So the yield point here counts time: once a statement's task has run
//! [`SLICE`] without giving the thread back, it yields before its next batch, and a short
//! statement waits a few milliseconds per step whatever else runs; a timeout or a cancel ends
//! a statement at its next yield.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
    SendableRecordBatchStream,
};
use futures::{Stream, StreamExt};

/// How long a statement's task runs before it gives the thread back: short next to the
/// milliseconds a short statement takes, long next to the microsecond a yield costs.
pub const SLICE: Duration = Duration::from_millis(2);

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

/// The physical optimizer rule that adds the time slices; it runs after the engine's rules.
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
                    Arc::new(TimeSliceExec::new(node)) as Arc<dyn ExecutionPlan>
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

/// Passes its input's batches through unchanged and yields once its task has run [`SLICE`].
#[derive(Debug)]
pub struct TimeSliceExec {
    input: Arc<dyn ExecutionPlan>,
}

impl TimeSliceExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }
}

impl DisplayAs for TimeSliceExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TimeSliceExec: slice={}ms", SLICE.as_millis())
    }
}

impl ExecutionPlan for TimeSliceExec {
    fn name(&self) -> &str {
        "TimeSliceExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(TimeSliceExec::new(input))),
            _ => Err(DataFusionError::Internal(
                "TimeSliceExec has exactly one input".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(TimeSliced {
            inner: self.input.execute(partition, context)?,
            running_since: None,
            yielding: None,
        }))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        self.input.partition_statistics(partition)
    }

    fn supports_limit_pushdown(&self) -> bool {
        true
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Equal
    }
}

struct TimeSliced {
    inner: SendableRecordBatchStream,
    /// When the task last got the thread, as far as this stream can tell: its first poll after
    /// the task waited (on input, or a yield).
    running_since: Option<Instant>,
    /// The yield under way: tokio's `yield_now` puts the task at the back of the run queue
    /// (a task that wakes itself is run next, ahead of the others).
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Stream for TimeSliced {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(y) = self.yielding.as_mut() {
            std::task::ready!(y.as_mut().poll(cx));
            self.yielding = None;
            self.running_since = None;
        }
        match self.running_since {
            Some(since) if since.elapsed() >= SLICE => {
                let mut y: Pin<Box<dyn Future<Output = ()> + Send>> =
                    Box::pin(tokio::task::yield_now());
                if y.as_mut().poll(cx).is_pending() {
                    self.yielding = Some(y);
                    return Poll::Pending;
                }
                self.running_since = None;
            }
            Some(_) => {}
            None => self.running_since = Some(Instant::now()),
        }
        let next = self.inner.poll_next_unpin(cx);
        if next.is_pending() {
            self.running_since = None;
        }
        next
    }
}

impl RecordBatchStream for TimeSliced {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
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
                at > 0 && lines[at - 1].starts_with("TimeSliceExec"),
                "{op} has no time slice above it:\n{text}"
            );
        }
        let rows = df.collect().await.unwrap();
        assert_eq!(rows[0].num_rows(), 1);
    }

    /// Runs a join whose one probe batch matches every build row (it emits all of its output
    /// without reading its input) beside a task that counts how often it gets the thread;
    /// returns that count and how long the join took.
    async fn ticks_beside_a_join(with_rule: bool) -> (u64, Duration) {
        let mut b = datafusion::execution::SessionStateBuilder::new()
            .with_config(datafusion::prelude::SessionConfig::new().with_target_partitions(1))
            .with_default_features();
        if with_rule {
            b = b.with_physical_optimizer_rule(Arc::new(YieldPoints));
        }
        let ctx = SessionContext::new_with_state(b.build());
        let sql = "SELECT count(*) FROM generate_series(1, 10000) a(x) JOIN generate_series(1, 10000) b(y) ON (a.x % 1) = (b.y % 1)";
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
        let started = Instant::now();
        let rows = df.collect().await.unwrap();
        let took = started.elapsed();
        ticker.abort();
        let count = rows[0]
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(count, 100_000_000);
        (ticks.load(std::sync::atomic::Ordering::Relaxed), took)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_join_that_emits_without_reading_lets_other_tasks_run() {
        let (without, _) = ticks_beside_a_join(false).await;
        let (with, took) = ticks_beside_a_join(true).await;
        eprintln!("ticks without time slices {without}, with {with} in {took:?}");
        assert!(
            with > 4 * without.max(1),
            "the other task ran {with} times beside the join with time slices, {without} without"
        );
        // It got the thread back at least once every ten slices of the join's time.
        assert!(
            SLICE * 10 * u32::try_from(with).unwrap_or(u32::MAX) >= took,
            "the other task ran {with} times in the {took:?} of the join"
        );
    }
}
