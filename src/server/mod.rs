//! The Postgres-wire gateway of `skipprd serve`: accepts clients (TLS, SCRAM-SHA-256 or
//! loopback trust) up to `max_connections`, gives each connection its own DataFusion
//! session over the live workspace, runs only what the statement classifier allows, bounds
//! each statement (timeout, cancel, memory) and maps errors to SQLSTATEs.

use crate::error::sqlstate;

mod activity;
mod auth;
mod catalogs;
mod conn;
mod copy;
mod errors;
mod frames;
#[cfg(test)]
mod fuzz;
mod limits;
mod lookup;
pub(crate) mod models;
mod names;
mod pg;
mod planning;
mod prepared;
mod readonly;
pub(crate) mod session;
mod settings;
mod simple;
mod sql;
mod startup;
mod statements;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use datafusion::execution::SessionState;
use datafusion::prelude::SessionContext;
use futures::FutureExt;
use pgwire::api::auth::DefaultServerParameterProvider;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, Semaphore};

use crate::config::QueryConfig;
use crate::error::{Context, Error, Result};
use crate::query::{self, Workspace};
pub use auth::Users;

/// State shared by every connection.
pub struct Shared {
    base: SessionState,
    workspace: String,
    ws: Arc<Workspace>,
    /// What each session's own `pg_catalog` is built from.
    pg: pg::catalog::PgShared,
    users: Option<Arc<Users>>,
    /// The certificate, when TLS is configured (and so required).
    tls_cert_pem: Option<Vec<u8>>,
    /// The connections a cancel request may name.
    cancel_keys: Arc<limits::CancelKeys>,
    /// `statement_timeout` of a new session, in ms (0: none).
    default_timeout_ms: u128,
    /// Most clients connected at once.
    max_connections: usize,
    /// Memory one statement may use, in bytes.
    max_query_memory: usize,
    /// Statements' turns (`skippr.query.max_concurrent_statements`).
    admission: Arc<limits::Admission>,
    /// The sessions, as `pg_stat_activity` lists them and signals reach them.
    backends: Arc<activity::Backends>,
    /// Process ids (and cancel keys) of the connections, unique in the process.
    pids: Arc<dyn pgwire::api::PidSecretKeyGenerator>,
    /// Statements running now (a graceful stop waits for them).
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Shared {
    /// Counts a statement as running until the guard drops (also when the client goes
    /// away mid-statement and its future is dropped).
    fn begin(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self)
    }
}

/// A running statement; see [`Shared::begin`].
pub struct InFlight<'a>(&'a Shared);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Clients beyond `max_connections` being told so through the protocol's start-up (TLS
/// negotiation included) at once.
const REFUSALS_AT_ONCE: usize = 256;
/// Beyond those, clients being sent the same refusal at once without reading their start-up
/// first (libpq, pgjdbc and asyncpg report it either way); more are only disconnected.
const QUICK_REFUSALS_AT_ONCE: usize = 256;
/// How long a refused client has to send its start-up message.
const REFUSAL_TIME: Duration = Duration::from_secs(10);
/// How long a refused socket is drained after the refusal, so that the client's own unread
/// bytes do not turn the close into a reset that hides the message.
const REFUSAL_DRAIN: Duration = Duration::from_secs(1);
/// Waits after a failed accept, doubling up to the maximum.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Files kept for the pipelines (WAL segments, Parquet, catalog) when sizing the limit.
const FILES_FOR_INGEST: usize = 256;

/// A bound gateway, ready to accept clients.
pub struct Gateway {
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    pub addr: SocketAddr,
}

impl Gateway {
    /// Loads TLS, prepares the shared session and binds the listening socket. Every problem
    /// (a TLS file that does not load, a port in use) stops the start here.
    pub async fn bind(cfg: &QueryConfig, ws: Arc<Workspace>) -> Result<Self> {
        let (tls, tls_cert_pem) = match &cfg.tls {
            Some((cert, key)) => {
                let (acceptor, pem) = auth::load_tls(cert, key)?;
                (Some(acceptor), Some(pem))
            }
            None => (None, None),
        };
        // Our own information_schema (the engine's, plus key constraints) replaces the
        // built-in one.
        // One memory pool for every statement of the server (see `query::limits`).
        let spill = cfg
            .spill_path
            .clone()
            .unwrap_or_else(|| ws.storage_path.join("tmp").join("spill"));
        let ctx = SessionContext::new_with_config_rt(
            query::session_config(&ws.name, cfg.target_partitions).with_information_schema(false),
            query::limits::server_runtime(cfg.max_memory, &spill)?,
        );
        query::register(&ctx, &ws)?;
        let backends = activity::Backends::new(
            cfg.admins.clone(),
            cfg.users.is_empty(),
            cfg.log_min_duration,
        );
        let pg = pg::setup(&ctx, ws.clone(), backends.clone())?;
        // Rules that must run before the engine's type coercion go first.
        // Yield points above the operators that emit without reading (see `query::yielding`):
        // statements share the cores, and a timeout or cancel ends one within a batch.
        let mut base = datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state())
            .with_physical_optimizer_rule(Arc::new(query::yielding::YieldPoints));
        if let Some(analyzer) = base.analyzer().as_mut() {
            analyzer
                .rules
                .insert(0, Arc::new(pg::compat::UnknownLiterals));
        }
        let base = base.build();
        let listener = TcpListener::bind(cfg.listen).await.map_err(|e| {
            Error::config(format!(
                "cannot listen on {} (skippr.query.listen): {e}; choose a free port or stop the process using it",
                cfg.listen
            ))
        })?;
        let addr = listener
            .local_addr()
            .context("reading the gateway's address")?;
        let users = (!cfg.users.is_empty()).then(|| Arc::new(Users::new(&cfg.users)));
        Ok(Self {
            listener,
            tls,
            shared: Arc::new(Shared {
                base,
                workspace: ws.name.clone(),
                ws: ws.clone(),
                pg,
                users,
                tls_cert_pem,
                cancel_keys: Arc::default(),
                default_timeout_ms: cfg.statement_timeout.map_or(0, |d| d.as_millis()),
                max_connections: cfg.max_connections,
                max_query_memory: cfg.max_query_memory,
                admission: limits::Admission::new(cfg.max_concurrent_statements),
                backends,
                pids: Arc::new(pgwire::api::RandomPidSecretKeyGenerator::default()),
                in_flight: AtomicUsize::new(0),
                idle: Notify::new(),
            }),
            addr,
        })
    }

    /// Accepts clients until `shutdown` turns true, then waits (up to `grace`) for the
    /// statements in flight to finish.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>, grace: Duration) -> Result<()> {
        let (closing_tx, closing_rx) = watch::channel(false);
        let mut sessions = tokio::task::JoinSet::new();
        tracing::info!(address = %self.addr, tls = self.tls.is_some(), auth = if self.shared.users.is_some() { "scram-sha-256" } else { "loopback trust" }, max_connections = self.shared.max_connections, "gateway listening");
        warn_if_few_files(self.shared.max_connections);
        let slots = Arc::new(Semaphore::new(self.shared.max_connections));
        let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
        let quick_refusals = Arc::new(Semaphore::new(QUICK_REFUSALS_AT_ONCE));
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(a) => {
                            backoff = ACCEPT_BACKOFF_MIN;
                            a
                        }
                        Err(e) => {
                            // Out of file descriptors (or another transient failure): wait,
                            // longer each time, instead of spinning on the same error.
                            tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "accepting a client failed");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                            continue;
                        }
                    };
                    if self.shared.users.is_none() && !peer.ip().is_loopback() {
                        tracing::warn!(peer = %peer, "refused a client from another machine: no users are configured, so only loopback clients are accepted");
                        tokio::spawn(refuse(socket));
                        continue;
                    }
                    let slot = slots.clone().try_acquire_owned().ok();
                    // A client beyond max_connections is told why (53300) by a short-lived
                    // task; beyond that many refusals at once it is only disconnected.
                    let refusal = match slot {
                        Some(_) => None,
                        None => match refusals.clone().try_acquire_owned() {
                            Ok(p) => Some(p),
                            Err(_) => {
                                match quick_refusals.clone().try_acquire_owned() {
                                    Ok(permit) => {
                                        tracing::warn!(peer = %peer, max_connections = self.shared.max_connections, "refused a client: every connection slot is taken");
                                        let message = too_many_clients(self.shared.max_connections);
                                        tokio::spawn(async move {
                                            refuse_busy(socket, &message).await;
                                            drop(permit);
                                        });
                                    }
                                    Err(_) => tracing::debug!(peer = %peer, "disconnected a client: every slot is taken"),
                                }
                                continue;
                            }
                        },
                    };
                    let _ = socket.set_nodelay(true);
                    let admitted = slot.is_some();
                    let handlers = match session::ConnHandlers::new(self.shared.clone(), admitted) {
                        Ok(h) => h,
                        Err(e) => {
                            tracing::error!(peer = %peer, error = %e, "could not set up a session for a client; the connection was closed");
                            continue;
                        }
                    };
                    let tls = self.tls.clone();
                    let closing = closing_rx.clone();
                    while sessions.try_join_next().is_some() {}
                    sessions.spawn(async move {
                        let (_slot, _refusal) = (slot, refusal);
                        // The connection's loop answers the shutdown itself (57P01, over TLS
                        // too). A panic in the protocol library is not expected (messages are
                        // checked before it decodes them, see frames.rs); should one happen,
                        // it ends this connection only.
                        let work = std::panic::AssertUnwindSafe(conn::serve(
                            socket, tls, handlers, closing,
                        ))
                        .catch_unwind();
                        let ended = if admitted {
                            work.await
                        } else {
                            tokio::time::timeout(REFUSAL_TIME, work).await.unwrap_or(Ok(Ok(())))
                        };
                        match ended {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => tracing::debug!(peer = %peer, error = %e, "client connection ended with an error"),
                            Err(_) => tracing::error!(peer = %peer, "a client connection's handler panicked; the connection was closed"),
                        }
                    });
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        drop(self.listener);
        let deadline = tokio::time::Instant::now() + grace;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 {
            let idle = self.shared.idle.notified();
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                tracing::warn!(
                    statements = self.shared.in_flight.load(Ordering::SeqCst),
                    "gateway stopped with statements still running"
                );
                break;
            }
        }
        close_sessions(closing_tx, &mut sessions).await;
        tracing::info!("gateway stopped");
        Ok(())
    }
}

/// How long the sessions get to tell their clients that the server is going away.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Ends every client session: each one still open gets an `ErrorResponse` FATAL 57P01
/// (admin shutdown) from its own loop, over TLS too, as Postgres sends on a fast shutdown,
/// so clients and pools know to reconnect.
async fn close_sessions(closing: watch::Sender<bool>, sessions: &mut tokio::task::JoinSet<()>) {
    let _ = closing.send(true);
    let all_closed = async { while sessions.join_next().await.is_some() {} };
    if tokio::time::timeout(CLOSE_GRACE, all_closed).await.is_err() {
        sessions.abort_all();
    }
}

/// Tells a client it may not connect, in the protocol's own terms, and closes.
async fn refuse(socket: tokio::net::TcpStream) {
    fatal_notice(
        socket,
        sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
        "only loopback clients may connect when skippr.query has no users; add users (name and password) to skippr.yml",
    )
    .await
}

/// Refuses a client beyond `max_connections` without a session: a TLS or GSS encryption
/// request is declined first (libpq reports an error sent in answer to one only as "server
/// sent an error response during SSL exchange"), then the 53300 error is sent as the answer
/// to the start-up message that follows.
async fn refuse_busy(mut socket: tokio::net::TcpStream, message: &str) {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    let mut first = [0u8; 8];
    if let Ok(Ok(_)) = tokio::time::timeout(REFUSAL_DRAIN, socket.read_exact(&mut first)).await {
        let len = u32::from_be_bytes([first[0], first[1], first[2], first[3]]);
        let code = u32::from_be_bytes([first[4], first[5], first[6], first[7]]);
        if len == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
            let _ = socket.write_all(b"N").await;
            // Answer the start-up message, not the request: wait until it begins.
            let _ = tokio::time::timeout(REFUSAL_DRAIN, socket.read_exact(&mut first)).await;
        }
    }
    fatal_notice(socket, sqlstate::TOO_MANY_CONNECTIONS, message).await
}

/// Sends one `ErrorResponse` of severity FATAL with `code` and `message`, and closes.
async fn fatal_notice(mut socket: tokio::net::TcpStream, code: &str, message: &str) {
    let mut body = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(tag);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    msg.extend_from_slice(&body);
    let _ = socket.write_all(&msg).await;
    let _ = socket.shutdown().await;
    // Read what the client still sends (its TLS request or start-up) until it closes, so
    // that closing does not reset the connection before the client has read the refusal.
    let drain = async {
        let mut buf = [0u8; 512];
        while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(REFUSAL_DRAIN, drain).await;
}

/// The refusal of a client beyond `max_connections`, as Postgres words it.
pub(super) fn too_many_clients(max_connections: usize) -> String {
    format!(
        "sorry, too many clients already: {max_connections} are connected (skippr.query.max_connections); try again later"
    )
}

/// Server parameters announced to clients at start-up.
pub(super) fn server_parameters(workspace: &str) -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.search_path = workspace.to_string();
    p.server_version = format!("16.6 (Skippr {})", env!("CARGO_PKG_VERSION"));
    p.is_superuser = false;
    p.default_transaction_read_only = true;
    p
}

/// Warns when the process may open fewer files than the gateway's connections could take
/// with the WAL and table files beside them (read from `/proc/self/limits` where there is
/// one).
fn warn_if_few_files(max_connections: usize) {
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else {
        return;
    };
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    let needed = max_connections + REFUSALS_AT_ONCE + QUICK_REFUSALS_AT_ONCE + FILES_FOR_INGEST;
    if let Some(soft) = soft.filter(|s| *s < needed) {
        tracing::warn!(
            open_files_limit = soft,
            needed,
            "the open-files limit is low for skippr.query.max_connections: raise it (ulimit -n, LimitNOFILE=) or lower max_connections"
        );
    }
}
