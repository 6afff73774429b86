//! Queries, limits: how much memory all statements together may use (`skippr.query.max_memory`,
//! one pool for the server, where spilling operators share fairly), how much one statement may
//! use (`max_query_memory`) and how long it may run (`statement_timeout`). The gateway applies
//! them to each statement of each session; `skipprd query` to its one statement, so that a
//! runaway query from the command line cannot take the machine's memory either. The ingest
//! loop's memory is outside this pool: statements never take it.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result as DfResult};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    FairSpillPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool,
};
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
    pub max_memory: usize,
}

impl From<&QueryConfig> for Limits {
    fn from(q: &QueryConfig) -> Self {
        Self {
            statement_timeout: q.statement_timeout,
            max_query_memory: q.max_query_memory,
            max_memory: q.max_memory,
        }
    }
}

/// Words in the error of a statement past its own limit (`max_query_memory`); an error
/// without them is the server's pool (`max_memory`) being full.
const STATEMENT_LIMIT: &str = "this statement's memory limit is reached";

/// The server's memory pool of `limit` bytes, shared by every statement. Operators that can
/// spill (sorts, aggregates, joins that support it) share what is left fairly and spill when
/// their share is used; others fail with "Resources exhausted", and only their statement
/// fails. The largest consumers are named in that error.
pub fn server_pool(limit: usize) -> Arc<dyn MemoryPool> {
    Arc::new(TrackConsumersPool::new(
        FairSpillPool::new(limit),
        NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN),
    ))
}

/// One statement's view of the server's pool: its reservations count there, and together
/// they may not pass `limit` (a refusal makes a spilling operator spill, as the server's
/// pool does).
#[derive(Debug)]
struct StatementPool {
    server: Arc<dyn MemoryPool>,
    limit: usize,
    used: AtomicUsize,
}

impl MemoryPool for StatementPool {
    fn register(&self, consumer: &MemoryConsumer) {
        self.server.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.server.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.server.grow(reservation, additional);
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.server.shrink(reservation, shrink);
        self.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let limit = self.limit;
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|n| *n <= limit)
            })
            .map_err(|used| {
                DataFusionError::ResourcesExhausted(format!(
                    "Failed to allocate additional {additional} bytes for {}: {STATEMENT_LIMIT} ({used} of {limit} bytes in use)",
                    reservation.consumer().name()
                ))
            })?;
        if let Err(e) = self.server.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(e);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// The engine's runtime for one statement: `base`'s object stores, caches and spill disk,
/// its reservations in `base`'s (the server's) pool, `limit` bytes at most.
pub fn statement_runtime(base: &RuntimeEnv, limit: usize) -> DfResult<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::from_runtime_env(base)
        .with_memory_pool(Arc::new(StatementPool {
            server: base.memory_pool.clone(),
            limit,
            used: AtomicUsize::new(0),
        }))
        .build_arc()
}

/// The base runtime of a server (or a command-line session): its pool of `max_memory`
/// bytes, and spill files in `spill` (created when missing).
pub fn server_runtime(max_memory: usize, spill: &Path) -> crate::error::Result<Arc<RuntimeEnv>> {
    std::fs::create_dir_all(spill).map_err(|e| {
        Error::config(format!(
            "cannot create the spill folder {} (skippr.query.spill_path): {e}; choose a folder skipprd may write",
            spill.display()
        ))
    })?;
    Ok(RuntimeEnvBuilder::new()
        .with_memory_pool(server_pool(max_memory))
        .with_disk_manager_builder(
            DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::Directories(vec![spill.to_path_buf()])),
        )
        .build_arc()?)
}

/// A runtime whose statements may use `limit` bytes of a pool of `max_memory` (a
/// command-line session runs one), spilling in `spill`.
pub fn session_runtime(
    max_memory: usize,
    limit: usize,
    spill: &Path,
) -> crate::error::Result<Arc<RuntimeEnv>> {
    let server = server_runtime(max_memory, spill)?;
    Ok(statement_runtime(&server, limit)?)
}

/// Where statements spill: `skippr.query.spill_path`, or `tmp/spill` under the storage path.
pub fn spill_path(config: &crate::config::Config) -> std::path::PathBuf {
    config
        .query
        .spill_path
        .clone()
        .unwrap_or_else(|| config.storage_path.join("tmp").join("spill"))
}

/// The error of a statement stopped after `timeout`.
pub fn timeout_error(timeout: Duration) -> Error {
    Error::query(format!(
        "{TIMEOUT_MESSAGE}: it ran longer than skippr.query.statement_timeout ({} ms); raise that setting in skippr.yml (0 for no limit) or narrow the query",
        timeout.as_millis()
    ))
}

/// What a client is told beside a "Resources exhausted" error `text`: which setting stopped
/// the statement, and what to do.
pub fn memory_hint(text: &str) -> &'static str {
    if text.contains(STATEMENT_LIMIT) {
        "the statement needs more memory than skippr.query.max_query_memory allows: raise that setting in skippr.yml or narrow the query (a filter, fewer columns, a LIMIT)"
    } else {
        "the statements running together need more memory than skippr.query.max_memory allows: try again when fewer statements run, raise max_memory, or lower skippr.query.max_concurrent_statements"
    }
}

/// The error of a statement that needed more memory than its pool, when `e` is one.
pub fn memory_error(e: &DataFusionError, limits: &Limits) -> Option<Error> {
    let root = e.find_root();
    let DataFusionError::ResourcesExhausted(text) = root else {
        return None;
    };
    Some(if text.contains(STATEMENT_LIMIT) {
        Error::query(format!(
            "{root}; the statement needs more memory than skippr.query.max_query_memory ({} bytes) allows: raise that setting in skippr.yml or narrow the query (a filter, fewer columns, a LIMIT)",
            limits.max_query_memory
        ))
    } else {
        Error::query(format!(
            "{root}; the statements running together need more memory than skippr.query.max_memory ({} bytes) allows: try again when fewer statements run, raise max_memory, or lower skippr.query.max_concurrent_statements",
            limits.max_memory
        ))
    })
}
