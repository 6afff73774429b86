//! Gateway, limits: what stops one statement (its `statement_timeout`, a client's cancel
//! request), the memory one statement may use, and the slots that bound how many clients
//! are connected at once. A running statement is interrupted by dropping its work: the
//! planning future or the stream of result batches, which stops the engine's tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::sqlstate;
use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::LogicalPlan;
use futures::{Stream, StreamExt};
use pgwire::api::cancel::CancelHandler;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::cancel::CancelRequest;
use tokio::sync::watch;
use tokio::time::Instant;

/// SQLSTATE `query_canceled`, for a timeout and for a cancel request alike.
pub const QUERY_CANCELED: &str = sqlstate::QUERY_CANCELED;

/// Why a statement was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    Timeout,
    Cancel,
}

impl Interruption {
    pub fn error(self) -> PgWireError {
        let message = match self {
            Interruption::Timeout => crate::query::limits::TIMEOUT_MESSAGE,
            Interruption::Cancel => "canceling statement due to user request",
        };
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".to_string(),
            QUERY_CANCELED.to_string(),
            message.to_string(),
        )))
    }
}

/// The interruption state of one connection: whether a statement runs, when it times out,
/// and whether a cancel request arrived for it. Streams of the connection (results,
/// portals, cursors) consult it whenever they are polled, so a statement that spans several
/// messages (FETCH from a cursor, Execute with a row limit) is covered by each of them.
#[derive(Debug)]
pub struct Interrupts {
    running: AtomicBool,
    cancelled: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    /// Bumped on a cancel request or a new deadline, to wake the waiters.
    wake: watch::Sender<u64>,
}

impl Default for Interrupts {
    fn default() -> Self {
        Self {
            running: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            deadline: Mutex::new(None),
            wake: watch::channel(0).0,
        }
    }
}

/// A statement running on a connection; ends it when dropped.
pub struct Running<'a>(&'a Interrupts);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::SeqCst);
        *self.0.deadline.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Interrupts {
    /// Starts a statement that may run for `timeout` (`None`: no limit). A cancel request
    /// that arrived before it does not stop it.
    pub fn begin(&self, timeout: Option<Duration>) -> Running<'_> {
        self.cancelled.store(false, Ordering::SeqCst);
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) =
            timeout.map(|t| Instant::now() + t);
        self.running.store(true, Ordering::SeqCst);
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
        Running(self)
    }

    /// The next statement of the same message starts: a new deadline of `timeout` from
    /// now. Unlike [`Interrupts::begin`], a cancel request that arrived for the message
    /// still applies.
    pub fn restart(&self, timeout: Option<Duration>) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) =
            timeout.map(|t| Instant::now() + t);
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A client's cancel request: stops the statement running now, if any.
    pub fn cancel(&self) {
        if self.running.load(Ordering::SeqCst) {
            self.cancelled.store(true, Ordering::SeqCst);
            self.wake.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn check(&self) -> Option<Interruption> {
        if !self.running.load(Ordering::SeqCst) {
            return None;
        }
        if self.cancelled.load(Ordering::SeqCst) {
            return Some(Interruption::Cancel);
        }
        let deadline = *self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        deadline
            .filter(|d| Instant::now() >= *d)
            .map(|_| Interruption::Timeout)
    }

    /// Resolves when the running statement must stop; never while none runs.
    pub async fn interrupted(&self) -> Interruption {
        loop {
            // Subscribe before checking, so that a change between the two is not missed.
            let mut rx = self.wake.subscribe();
            if let Some(why) = self.check() {
                return why;
            }
            let deadline = *self.deadline.lock().unwrap_or_else(|e| e.into_inner());
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                }
                _ = sleep_until(deadline) => {}
            }
        }
    }

    /// Runs `work` unless the statement is interrupted first (then `work` is dropped).
    pub async fn run<T>(
        &self,
        work: impl std::future::Future<Output = PgWireResult<T>>,
    ) -> PgWireResult<T> {
        tokio::select! {
            biased;
            why = self.interrupted() => Err(why.error()),
            done = work => done,
        }
    }

    /// `batches`, ended with the interruption's error as soon as the statement polling it
    /// is interrupted; the inner stream (and the engine's work) is dropped then.
    pub fn guard(
        self: Arc<Self>,
        batches: impl Stream<Item = DfResult<RecordBatch>> + Send + 'static,
    ) -> impl Stream<Item = Result<RecordBatch, Interrupted>> + Send + 'static {
        let batches = Box::pin(batches);
        futures::stream::unfold(Some((self, batches)), |state| async move {
            let (me, mut batches) = state?;
            let next = tokio::select! {
                biased;
                why = me.interrupted() => Err(why),
                item = batches.next() => Ok(item),
            };
            match next {
                Err(why) => Some((Err(Interrupted::Stopped(why)), None)),
                Ok(None) => None,
                Ok(Some(Ok(b))) => Some((Ok(b), Some((me, batches)))),
                Ok(Some(Err(e))) => Some((Err(Interrupted::Failed(e)), None)),
            }
        })
    }
}

/// A guarded stream's error: the engine's, or the interruption.
#[derive(Debug)]
pub enum Interrupted {
    Failed(datafusion::error::DataFusionError),
    Stopped(Interruption),
}

impl From<Interrupted> for PgWireError {
    fn from(e: Interrupted) -> Self {
        match e {
            Interrupted::Failed(e) => PgWireError::ApiError(Box::new(e)),
            Interrupted::Stopped(why) => why.error(),
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// (process id, secret key) of a connection.
type KeyOf = (i32, Vec<u8>);

/// The connections a cancel request may name, by (process id, secret key) as announced in
/// BackendKeyData.
#[derive(Debug, Default)]
pub struct CancelKeys {
    keys: Mutex<HashMap<KeyOf, Weak<Interrupts>>>,
}

/// A connection's entry in [`CancelKeys`], removed when dropped.
pub struct CancelKey {
    keys: Arc<CancelKeys>,
    key: KeyOf,
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        self.keys
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

impl CancelKeys {
    pub fn register(
        self: &Arc<Self>,
        pid: i32,
        secret: Vec<u8>,
        interrupts: &Arc<Interrupts>,
    ) -> CancelKey {
        let key = (pid, secret);
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), Arc::downgrade(interrupts));
        CancelKey {
            keys: self.clone(),
            key,
        }
    }

    fn find(&self, pid: i32, secret: &[u8]) -> Option<Arc<Interrupts>> {
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(pid, secret.to_vec()))
            .and_then(Weak::upgrade)
    }
}

/// Answers CancelRequest messages (each arrives on a connection of its own).
pub struct Canceller(pub Arc<CancelKeys>);

#[async_trait]
impl CancelHandler for Canceller {
    async fn on_cancel_request(&self, request: CancelRequest) {
        match self.0.find(request.pid, &request.secret_key.to_bytes()) {
            Some(interrupts) => {
                tracing::info!(pid = request.pid, "cancel request for a running statement");
                interrupts.cancel();
            }
            // As Postgres: an unknown key is ignored, and the requester learns nothing.
            None => tracing::debug!(pid = request.pid, "cancel request matches no connection"),
        }
    }
}

/// Admission of statements: at most `skippr.query.max_concurrent_statements` run at once;
/// the next ones wait their turn in arrival order (tokio's semaphore is fair), the wait
/// counting toward their `statement_timeout` and ended by a cancel like any other.
pub struct Admission {
    slots: Arc<tokio::sync::Semaphore>,
    queued: std::sync::atomic::AtomicUsize,
    running: std::sync::atomic::AtomicUsize,
}

/// A statement's turn: held while its rows stream, given back when dropped.
pub struct Turn {
    _permit: tokio::sync::OwnedSemaphorePermit,
    admission: Arc<Admission>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let running = self.admission.running.fetch_sub(1, Ordering::Relaxed) - 1;
        publish_running(running);
    }
}

impl Admission {
    /// Publishes both gauges at 0 at once, so that they exist before the first statement
    /// (a dashboard or an alert on `skippr_statements_queued` sees 0, not "no data").
    pub fn new(max_concurrent: usize) -> Arc<Self> {
        publish_queued(0);
        publish_running(0);
        Arc::new(Self {
            slots: Arc::new(tokio::sync::Semaphore::new(max_concurrent.max(1))),
            queued: Default::default(),
            running: Default::default(),
        })
    }

    /// Waits for a turn (run it under the statement's interruptions); `queued` is set while
    /// it waits (`pg_stat_activity.wait_event_type`).
    pub async fn enter(self: &Arc<Self>, queued: &AtomicBool) -> PgWireResult<Turn> {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let waiting = Waiting::new(self, queued);
                let permit = self.slots.clone().acquire_owned().await.map_err(|_| {
                    PgWireError::ApiError(Box::new(crate::error::Error::fatal(
                        "the gateway is shutting down",
                    )))
                })?;
                drop(waiting);
                permit
            }
        };
        let running = self.running.fetch_add(1, Ordering::Relaxed) + 1;
        publish_running(running);
        Ok(Turn {
            _permit: permit,
            admission: self.clone(),
        })
    }
}

/// Counts a statement in the queue while it waits (however the wait ends), and marks its
/// session as waiting.
struct Waiting<'a>(&'a Admission, &'a AtomicBool);

impl<'a> Waiting<'a> {
    fn new(a: &'a Admission, session: &'a AtomicBool) -> Self {
        session.store(true, Ordering::SeqCst);
        let queued = a.queued.fetch_add(1, Ordering::Relaxed) + 1;
        publish_queued(queued);
        Self(a, session)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.1.store(false, Ordering::SeqCst);
        let queued = self.0.queued.fetch_sub(1, Ordering::Relaxed) - 1;
        publish_queued(queued);
    }
}

/// Whether a statement's plan waits for a turn: any that reads a table, runs a table function
/// (`generate_series`), unnests or recurses does. One that reads only the catalog
/// (`pg_catalog`, `information_schema`) or no table at all runs at once, so that
/// `pg_stat_activity`, `pg_cancel_backend` and a client's catalog queries answer while every
/// turn is taken.
pub fn needs_turn(plan: &LogicalPlan) -> bool {
    let mut needs = false;
    let _ = plan.apply_with_subqueries(|node| {
        let light = match node {
            LogicalPlan::TableScan(scan) => matches!(
                scan.table_name.schema(),
                Some("pg_catalog" | "information_schema")
            ),
            LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => true,
            LogicalPlan::Unnest(_) | LogicalPlan::RecursiveQuery(_) | LogicalPlan::Extension(_) => {
                false
            }
            other => !other.inputs().is_empty(),
        };
        if light {
            Ok(TreeNodeRecursion::Continue)
        } else {
            needs = true;
            Ok(TreeNodeRecursion::Stop)
        }
    });
    needs
}

fn publish_running(n: usize) {
    crate::telemetry::metrics::set(
        "skippr_statements_running",
        "Statements of the gateway running now.",
        &[],
        n as f64,
    );
}

fn publish_queued(n: usize) {
    crate::telemetry::metrics::set(
        "skippr_statements_queued",
        "Statements of the gateway waiting for their turn (skippr.query.max_concurrent_statements).",
        &[],
        n as f64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_timeout_interrupts_only_a_running_statement() {
        let i = Interrupts::default();
        assert_eq!(i.check(), None);
        {
            let _running = i.begin(Some(Duration::from_millis(20)));
            let why = tokio::time::timeout(Duration::from_secs(5), i.interrupted()).await;
            assert_eq!(why.ok(), Some(Interruption::Timeout));
        }
        assert_eq!(i.check(), None, "no statement runs after the guard dropped");
    }

    #[tokio::test]
    async fn a_cancel_stops_the_running_statement_and_not_the_next() {
        let i = Arc::new(Interrupts::default());
        i.cancel(); // nothing runs: ignored
        let running = i.begin(None);
        assert_eq!(i.check(), None);
        let waiter = {
            let i = i.clone();
            tokio::spawn(async move { i.interrupted().await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        i.cancel();
        let why = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(why, Ok(Ok(Interruption::Cancel))));
        drop(running);
        let _next = i.begin(None);
        assert_eq!(i.check(), None, "a cancel applies to one statement only");
    }

    #[tokio::test]
    async fn each_statement_of_a_message_gets_its_own_deadline() {
        let i = Interrupts::default();
        let _running = i.begin(Some(Duration::from_millis(300)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        i.restart(Some(Duration::from_millis(300)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(i.check(), None, "the second statement has its own 300 ms");
        i.cancel();
        i.restart(Some(Duration::from_secs(60)));
        assert_eq!(
            i.check(),
            Some(Interruption::Cancel),
            "a pending cancel still applies"
        );
    }

    #[tokio::test]
    async fn only_statements_that_read_data_wait_for_a_turn() -> DfResult<()> {
        let ctx = datafusion::prelude::SessionContext::new();
        for sql in [
            "CREATE SCHEMA pg_catalog",
            "CREATE TABLE t AS SELECT 1 AS x",
            "CREATE TABLE pg_catalog.pg_stat_activity AS SELECT 1 AS x",
        ] {
            ctx.sql(sql).await?.collect().await?;
        }
        async fn needs(ctx: &datafusion::prelude::SessionContext, sql: &str) -> DfResult<bool> {
            let plan = ctx.sql(sql).await?.into_optimized_plan()?;
            Ok(needs_turn(&plan))
        }
        assert!(!needs(&ctx, "SELECT 1").await?);
        assert!(!needs(&ctx, "SELECT x FROM pg_catalog.pg_stat_activity").await?);
        assert!(needs(&ctx, "SELECT x FROM t").await?);
        assert!(needs(&ctx, "SELECT count(*) FROM generate_series(1, 10)").await?);
        let sub = "SELECT x FROM pg_catalog.pg_stat_activity WHERE x IN (SELECT x FROM t)";
        assert!(needs(&ctx, sub).await?);
        Ok(())
    }

    #[tokio::test]
    async fn a_statement_waiting_for_its_turn_marks_its_session() -> PgWireResult<()> {
        let admission = Admission::new(1);
        let (a, b) = (AtomicBool::new(false), Arc::new(AtomicBool::new(false)));
        let first = admission.enter(&a).await?;
        assert!(!a.load(Ordering::SeqCst));
        let waiter = {
            let (admission, b) = (admission.clone(), b.clone());
            tokio::spawn(async move { admission.enter(&b).await.map(drop) })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !b.load(Ordering::SeqCst) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(b.load(Ordering::SeqCst), "the second statement waits");
        drop(first);
        let done = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(done, Ok(Ok(Ok(())))));
        assert!(!b.load(Ordering::SeqCst), "no longer waiting");
        Ok(())
    }

    #[tokio::test]
    async fn cancel_keys_find_only_live_connections() {
        let keys = Arc::new(CancelKeys::default());
        let i = Arc::new(Interrupts::default());
        let key = keys.register(7, vec![1, 2, 3, 4], &i);
        assert!(keys.find(7, &[1, 2, 3, 4]).is_some());
        assert!(keys.find(7, &[1, 2, 3, 5]).is_none());
        drop(key);
        assert!(keys.find(7, &[1, 2, 3, 4]).is_none());
    }
}
