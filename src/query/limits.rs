//! Queries, limits: how much memory one statement may use and how long it may run
//! (`skippr.query.max_query_memory`, `skippr.query.statement_timeout`). The gateway applies
//! them to each statement of each session; `skipprd query` to its one statement, so that a
//! runaway query from the command line cannot take the machine's memory either.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};

use crate::config::QueryConfig;
use crate::error::Error;

/// What a statement stopped by its timeout reports (Postgres's words).
pub const TIMEOUT_MESSAGE: &str = "canceling statement due to statement timeout";

/// The limits of a command-line query session, kept in its session configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub statement_timeout: Option<Duration>,
    pub max_query_memory: usize,
}

impl From<&QueryConfig> for Limits {
    fn from(q: &QueryConfig) -> Self {
        Self {
            statement_timeout: q.statement_timeout,
            max_query_memory: q.max_query_memory,
        }
    }
}

/// A memory pool of `limit` bytes. Operators that can spill (sorts, aggregates, joins that
/// support it) do when it is full; others fail with "Resources exhausted", and only their
/// statement fails. The largest consumers are named in that error.
fn memory_pool(limit: usize) -> Arc<dyn MemoryPool> {
    Arc::new(TrackConsumersPool::new(
        FairSpillPool::new(limit),
        NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN),
    ))
}

/// The engine's runtime for one statement: `base`'s object stores, caches and spill disk,
/// with a memory pool of `limit` bytes of its own.
pub fn statement_runtime(base: &RuntimeEnv, limit: usize) -> DfResult<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::from_runtime_env(base)
        .with_memory_pool(memory_pool(limit))
        .build_arc()
}

/// A runtime whose statements may use `limit` bytes (a command-line session runs one).
pub fn session_runtime(limit: usize) -> DfResult<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_memory_pool(memory_pool(limit))
        .build_arc()
}

/// The error of a statement stopped after `timeout`.
pub fn timeout_error(timeout: Duration) -> Error {
    Error::query(format!(
        "{TIMEOUT_MESSAGE}: it ran longer than skippr.query.statement_timeout ({} ms); raise that setting in skippr.yml (0 for no limit) or narrow the query",
        timeout.as_millis()
    ))
}

/// The error of a statement that needed more memory than its pool, when `e` is one.
pub fn memory_error(e: &DataFusionError, limits: &Limits) -> Option<Error> {
    let root = e.find_root();
    matches!(root, DataFusionError::ResourcesExhausted(_)).then(|| {
        Error::query(format!(
            "{root}; the statement needs more memory than skippr.query.max_query_memory ({} bytes) allows: raise that setting in skippr.yml or narrow the query (a filter, fewer columns, a LIMIT)",
            limits.max_query_memory
        ))
    })
}
