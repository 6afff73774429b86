//! The Postgres-wire gateway of `skipprd serve`: accepts clients (TLS, SCRAM-SHA-256 or
//! loopback trust), gives each connection its own DataFusion session over the live
//! workspace, keeps replicated tables read-only and maps errors to SQLSTATEs.

mod auth;
mod catalog;
mod compat;
mod errors;
mod functions;
mod info_schema;
mod known;
mod readonly;
mod rewrite;
mod session;
mod settings;
mod statements;
mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use datafusion::execution::SessionState;
use datafusion::prelude::SessionContext;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::DefaultServerParameterProvider;
use pgwire::api::ConnectionManager;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::config::QueryConfig;
use crate::error::{Context, Error, Result};
use crate::query::{self, Workspace};
pub use auth::Users;

/// State shared by every connection.
pub struct Shared {
    base: SessionState,
    workspace: String,
    ws: Arc<Workspace>,
    users: Option<Arc<Users>>,
    tls_cert_pem: Option<Vec<u8>>,
    connections: Arc<ConnectionManager>,
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
        let ctx = SessionContext::new_with_config(
            query::session_config(&ws.name).with_information_schema(false),
        );
        query::register(&ctx, &ws)?;
        let catalogs = ctx.state().catalog_list().clone();
        ctx.catalog(query::CATALOG)
            .ok_or_else(|| Error::fatal("the gateway session has no default catalog"))?
            .register_schema(
                "information_schema",
                Arc::new(info_schema::InfoSchema::new(catalogs, ws.clone())),
            )
            .map_err(Error::from)?;
        catalog::setup(&ctx, ws.clone())?;
        // After pg_catalog's own functions, which some of these replace.
        functions::register(&ctx);
        ctx.add_analyzer_rule(Arc::new(compat::LikeEscape));
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
                base: ctx.state(),
                workspace: ws.name.clone(),
                ws: ws.clone(),
                users,
                tls_cert_pem,
                connections: Arc::new(ConnectionManager::new()),
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
        tracing::info!(address = %self.addr, tls = self.tls.is_some(), auth = if self.shared.users.is_some() { "scram-sha-256" } else { "loopback trust" }, "gateway listening");
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "accepting a client failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    if self.shared.users.is_none() && !peer.ip().is_loopback() {
                        tracing::warn!(peer = %peer, "refused a client from another machine: no users are configured, so only loopback clients are accepted");
                        tokio::spawn(refuse(socket));
                        continue;
                    }
                    let _ = socket.set_nodelay(true);
                    let handlers = session::ConnHandlers::new(self.shared.clone());
                    let tls = self.tls.clone();
                    let closing = closing_rx.clone();
                    while sessions.try_join_next().is_some() {}
                    sessions.spawn(async move {
                        // A second handle on the socket, to tell the client why it is closed
                        // once the session itself has been stopped (see `close_sessions`).
                        let notice = (tls.is_none()).then(|| dup_socket(&socket)).flatten();
                        tokio::select! {
                            r = pgwire::tokio::process_socket(socket, tls, handlers) => {
                                if let Err(e) = r {
                                    tracing::debug!(peer = %peer, error = %e, "client connection ended with an error");
                                }
                            }
                            _ = wait_true(closing) => {
                                if let Some(socket) = notice {
                                    fatal_notice(socket, "57P01", "terminating connection due to administrator command: skipprd is shutting down; reconnect once it is back").await;
                                }
                            }
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
/// (admin shutdown), as Postgres sends on a fast shutdown, so clients and pools know to
/// reconnect. Over TLS the session is closed without the notice (it would need the TLS
/// stream the session owns).
async fn close_sessions(closing: watch::Sender<bool>, sessions: &mut tokio::task::JoinSet<()>) {
    let _ = closing.send(true);
    let all_closed = async { while sessions.join_next().await.is_some() {} };
    if tokio::time::timeout(CLOSE_GRACE, all_closed).await.is_err() {
        sessions.abort_all();
    }
}

/// Resolves once `rx` holds true (or its sender is gone).
async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// A second handle on the same connection.
fn dup_socket(socket: &tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = socket.as_fd().try_clone_to_owned().ok()?;
    tokio::net::TcpStream::from_std(std::net::TcpStream::from(fd)).ok()
}

/// Tells a client it may not connect, in the protocol's own terms, and closes.
async fn refuse(socket: tokio::net::TcpStream) {
    fatal_notice(
        socket,
        "28000",
        "only loopback clients may connect when skippr.query has no users; add users (name and password) to skippr.yml",
    )
    .await
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
}

/// Server parameters announced to clients at start-up.
fn server_parameters(workspace: &str) -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.search_path = workspace.to_string();
    p.server_version = format!("16.6 (Skippr {})", env!("CARGO_PKG_VERSION"));
    p.is_superuser = false;
    p.default_transaction_read_only = true;
    p
}

/// The start-up handler of one connection: SCRAM when users are configured, trust otherwise.
pub(super) fn startup_handler(shared: &Shared) -> session::Startup {
    match &shared.users {
        Some(users) => {
            let mut scram = ScramAuth::new(users.clone());
            scram.set_iterations(auth::SCRAM_ITERATIONS);
            if let Some(pem) = &shared.tls_cert_pem {
                // Channel binding (SCRAM-SHA-256-PLUS) when the certificate allows it.
                if let Err(e) = scram.configure_certificate(pem) {
                    tracing::debug!(error = %e, "SCRAM channel binding unavailable for this certificate");
                }
            }
            session::Startup::Scram(
                SASLAuthStartupHandler::new(Arc::new(server_parameters(&shared.workspace)))
                    .with_scram(scram)
                    .with_connection_manager(shared.connections.clone()),
            )
        }
        None => session::Startup::Trust(session::Trust {
            connections: shared.connections.clone(),
        }),
    }
}
