//! Keeps a pipeline running through transient faults: runs `pipeline::sync`, and when it
//! stops with a retryable error (the source restarting or unreachable, a broken connection,
//! a timeout, a full disk) waits with exponential backoff and jitter and runs it again. Each
//! run resumes where the WAL ends (or at the slot's confirmed position), so nothing is lost
//! or applied twice. A fatal error ends the pipeline with state `failed`.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{Config, PipelineConfig, ReconnectConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::pipeline::{self, SyncReport};
use crate::telemetry::state::{self, State};

/// First wait after a fault; it doubles on each further try, up to `max_backoff`.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(500);

/// Exponential backoff with "equal jitter": each wait is between half and all of the
/// current step, so pipelines that lost the same server do not come back in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    step: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(max: Duration) -> Self {
        Self {
            step: INITIAL_BACKOFF.min(max),
            max,
        }
    }

    /// The next wait, and the step doubles for the one after.
    pub fn next_wait(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let spread = half.as_millis() as u64;
        let jitter = if spread == 0 {
            0
        } else {
            (uuid::Uuid::new_v4().as_u128() as u64) % (spread + 1)
        };
        half + Duration::from_millis(jitter)
    }

    /// After a healthy run: the next fault starts again from the first step.
    pub fn reset(&mut self) {
        self.step = INITIAL_BACKOFF.min(self.max);
    }
}

/// How a pipeline is run.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// `sync`: gives up after `give_up_after` of the same fault (exit code 75).
    Sync { once: bool, resnapshot: bool },
    /// `serve`: never gives up on a transient fault.
    Serve,
}

/// Runs `p` until it is done (`sync --once`), stopped (`shutdown`), or fails for good.
pub async fn run(
    config: &Config,
    p: &PipelineConfig,
    mode: Mode,
    mut shutdown: watch::Receiver<bool>,
) -> Result<SyncReport> {
    state::register(&p.name, &config.storage_path);
    let r = run_inner(config, p, mode, &mut shutdown, config.reconnect).await;
    match &r {
        Ok(_) => state::set(&p.name, State::Stopped, None),
        Err(e) => state::set(&p.name, State::Failed, Some(e.report())),
    }
    r
}

async fn run_inner(
    config: &Config,
    p: &PipelineConfig,
    mode: Mode,
    shutdown: &mut watch::Receiver<bool>,
    settings: ReconnectConfig,
) -> Result<SyncReport> {
    let mut backoff = Backoff::new(settings.max_backoff);
    let (once, mut resnapshot) = match mode {
        Mode::Sync { once, resnapshot } => (once, resnapshot),
        Mode::Serve => (false, false),
    };
    let mut failing_since: Option<Instant> = None;
    let mut standing_by = false;
    // A reload may change the pipeline's tables; a restart after a fault keeps them.
    let mut p = p.clone();
    let p = &mut p;
    loop {
        state::set(&p.name, State::Starting, None);
        let e = match pipeline::sync(config, p, once, resnapshot, shutdown.clone()).await {
            Ok(report) => return Ok(report),
            Err(e) => e,
        };
        if matches!(mode, Mode::Serve) && crate::storage::lease::held_elsewhere(&e) {
            // Another process writes this pipeline (S3 mode): this replica serves reads and
            // stands by, taking the pipeline over once that process's lease expires.
            if !standing_by {
                tracing::info!(pipeline = %p.name, holder = %e.report(), "standing by: another skipprd writes this pipeline; taking over if its lease expires");
                standing_by = true;
            }
            state::retry(&p.name, State::Reconnecting, e.report());
            tokio::select! {
                _ = tokio::time::sleep(config.lease.renew_every) => continue,
                _ = shutdown.wait_for(|stop| *stop) => return Ok(SyncReport::default()),
            }
        }
        if e.kind() != ErrorKind::Retryable {
            tracing::error!(pipeline = %p.name, error = %e.report(), "pipeline stopped: this needs a person");
            return Err(e);
        }
        if *shutdown.borrow() {
            // A stop was asked while the source was away: what is durable stays in the WAL
            // and the next start commits it.
            tracing::info!(pipeline = %p.name, error = %e.report(), "stopped while retrying; the WAL keeps everything not yet committed");
            return Ok(SyncReport::default());
        }
        // The re-snapshot has happened (or started): a retry must not start it over.
        resnapshot = false;
        if state::current(&p.name).is_some_and(|s| s.state == State::Streaming) {
            // The last run got as far as streaming: this is a new fault, not the same one.
            backoff.reset();
            failing_since = None;
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        if matches!(mode, Mode::Sync { .. }) && since.elapsed() >= settings.give_up_after {
            return Err(Error::new(
                ErrorKind::Retryable,
                format!(
                    "pipeline `{}` gave up after {}s of retrying (skippr.reconnect.give_up_after); the last fault was: {}. Nothing was lost: run sync again once the cause is fixed",
                    p.name,
                    since.elapsed().as_secs(),
                    e.report()
                ),
            ));
        }
        let wait = backoff.next_wait();
        let storage_full = e.is_storage_full();
        let st = if storage_full {
            State::StorageFull
        } else {
            State::Reconnecting
        };
        let mut report = e.report();
        if storage_full && !report.contains("storage full") {
            // Whichever write met the full disk first (a WAL segment, the pipeline state, the
            // key index), the state tells the operator what it means and what to do.
            report.push_str("; storage full: free space on that disk and ingest resumes by itself (nothing was acknowledged, nothing is lost)");
        }
        state::retry(&p.name, st, report);
        if storage_full {
            tracing::warn!(pipeline = %p.name, error = %e.report(), retry_in_ms = wait.as_millis() as u64, "storage full: paused until space is freed (only what is durable is ever acknowledged); retrying");
        } else {
            tracing::warn!(pipeline = %p.name, error = %e.report(), retry_in_ms = wait.as_millis() as u64, "transient fault; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => {
                return Ok(SyncReport::default());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_maximum() {
        let mut b = Backoff::new(Duration::from_secs(4));
        let steps = [500u64, 1000, 2000, 4000, 4000, 4000];
        for step in steps {
            let w = b.next_wait().as_millis() as u64;
            assert!(
                (step / 2..=step).contains(&w),
                "wait {w} ms outside [{}, {step}]",
                step / 2
            );
        }
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(500));
    }
}
