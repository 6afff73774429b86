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
                    tokio::spawn(async move {
                        if let Err(e) = pgwire::tokio::process_socket(socket, tls, handlers).await {
                            tracing::debug!(peer = %peer, error = %e, "client connection ended with an error");
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
        tracing::info!("gateway stopped");
        Ok(())
    }
}

/// Tells a client it may not connect, in the protocol's own terms, and closes.
async fn refuse(mut socket: tokio::net::TcpStream) {
    let mut body = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28000"),
        (
            b'M',
            "only loopback clients may connect when skippr.query has no users; add users (name and password) to skippr.yml",
        ),
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
