//! Shutdown and time limits for the pipeline's loops: SIGTERM/SIGINT flip one watch channel
//! that every loop selects on; a peer that stops answering turns into a retryable error.

use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, Result};

pub(super) use crate::task::AbortOnDrop;

/// Runs `f` for at most `limit`: a source that stopped answering (a cut network) gives a
/// retryable error instead of a hang.
pub async fn bounded<T>(
    limit: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::retryable(format!(
            "{what}: no answer from the source within {}s (skippr.reconnect.peer_timeout)",
            limit.as_secs()
        ))),
    }
}

/// Resolves when SIGTERM or SIGINT arrives, then flips `tx` to true.
pub fn trap_signals(tx: watch::Sender<bool>) {
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        tracing::info!("shutdown requested: flushing");
        let _ = tx.send(true);
    });
}
