//! Connections to the source Postgres: plain SQL sessions (discovery, snapshot copies) and
//! replication sessions (slot creation, the change stream), all pinned to the same output
//! settings so that values arrive in one predictable text format.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::tls::{is_tls_failure, tls_cause, MakeRustls, SourceTls};
use super::tunnel;
use crate::config::{PostgresConfig, SslMode};
use crate::error::{Context, Error, ErrorKind, Result};

/// Session settings that fix the text format of every value we decode: UTC timestamps, ISO
/// dates, shortest-exact floats, hex bytea, UTF-8.
pub const SESSION_OPTIONS: &str = "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres \
-c extra_float_digits=1 -c bytea_output=hex -c client_encoding=UTF8";

/// Longest wait for the TCP connection to the source.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a SQL session. The connection task runs in the background until the client drops.
pub async fn connect(cfg: &PostgresConfig) -> Result<Client> {
    let mut pg = tokio_postgres::Config::new();
    if cfg.host.starts_with('/') {
        pg.host_path(&cfg.host);
    } else {
        pg.host(&cfg.host);
    }
    pg.port(cfg.port)
        .user(&cfg.user)
        .dbname(&cfg.database)
        .application_name("skipprd")
        .options(SESSION_OPTIONS)
        .connect_timeout(CONNECT_TIMEOUT.min(cfg.peer_timeout))
        // A peer that vanished (a cut network, a host that died) is found by the kernel
        // within about the peer timeout instead of hanging a session forever.
        .keepalives(true)
        .keepalives_idle((cfg.peer_timeout / 3).max(Duration::from_secs(1)))
        .keepalives_interval((cfg.peer_timeout / 9).max(Duration::from_secs(1)))
        .keepalives_retries(3)
        .tcp_user_timeout(cfg.peer_timeout);
    if let Some(pw) = &cfg.password {
        pg.password(pw);
    }
    let tls = SourceTls::new(cfg)?;
    pg.ssl_mode(match tls.mode {
        // Postgres never uses TLS on a Unix socket.
        _ if cfg.host.starts_with('/') => tokio_postgres::config::SslMode::Disable,
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let mut connecting = start(&pg, cfg, &tls).await;
    // libpq's `prefer` falls back to a plain connection when the TLS handshake fails.
    if tls.mode == SslMode::Prefer {
        if let Err(Failure::Tls(e)) = &connecting {
            tracing::warn!(source = %cfg.name, error = %e, "TLS to the source failed; sslmode prefer falls back to plain TCP");
            pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
            connecting = start(&pg, cfg, &tls).await;
        }
    }
    let reason = match connecting {
        Ok(client) => return Ok(client),
        Err(Failure::Tls(e)) => match tls_cause(&e) {
            Some(io) => return Err(tls.explain(cfg, io)),
            None => return Err(tunnel::no_tls_error(cfg, tls.mode)),
        },
        Err(Failure::Other(e)) => e,
    };
    let hint = if reason.kind() == ErrorKind::Retryable {
        "the server is restarting or unreachable; if this lasts, check host and port in skippr.yml and that the server accepts connections from here"
    } else if reason.message().contains("no encryption") {
        // pg_hba.conf has only `hostssl` lines for us: the server wants TLS.
        "the server accepts this user only over TLS: set `sslmode: require` (or verify-full with sslrootcert) on the data source"
    } else {
        "check host, port, user, password and database in skippr.yml, and that the server accepts connections from here"
    };
    Err(Error::new(
        reason.kind(),
        format!(
            "cannot connect to Postgres at {}:{} (database `{}`, user `{}`) for data source `{}`: {}; {hint}",
            cfg.host,
            cfg.port,
            cfg.database,
            cfg.user,
            cfg.name,
            reason.message()
        ),
    )
    .with_source(reason))
}

/// Why a connection attempt failed: TLS (explained by the caller) or anything else.
enum Failure {
    Tls(tokio_postgres::Error),
    Other(Error),
}

/// One connection attempt with `pg`, TLS per `tls`. The connection task runs in the
/// background until the client drops.
async fn start(
    pg: &tokio_postgres::Config,
    cfg: &PostgresConfig,
    tls: &SourceTls,
) -> std::result::Result<Client, Failure> {
    // The connect timeout covers the TCP connection only; the start-up exchange is bounded
    // here, so a server that accepts but never answers is a retryable fault, not a hang.
    let timed_out = || {
        Failure::Other(Error::retryable(format!(
            "no answer within {}s (skippr.reconnect.peer_timeout)",
            cfg.peer_timeout.as_secs()
        )))
    };
    let failed = |e: tokio_postgres::Error| {
        if is_tls_failure(&e) {
            Failure::Tls(e)
        } else {
            Failure::Other(Error::from(e))
        }
    };
    match &tls.config {
        Some(config) if pg.get_ssl_mode() != tokio_postgres::config::SslMode::Disable => {
            let (client, connection) =
                tokio::time::timeout(cfg.peer_timeout, pg.connect(MakeRustls(config.clone())))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(failed)?;
            spawn_connection(connection);
            Ok(client)
        }
        _ => {
            let (client, connection) = tokio::time::timeout(cfg.peer_timeout, pg.connect(NoTls))
                .await
                .map_err(|_| timed_out())?
                .map_err(failed)?;
            spawn_connection(connection);
            Ok(client)
        }
    }
}

/// Drives a session's connection until its client drops.
fn spawn_connection<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres connection ended");
        }
    });
}

/// A setting of the server, as `current_setting(name)` reads it in the session `client`.
pub async fn server_setting(client: &Client, name: &str) -> Result<String> {
    Ok(client
        .query_one("SELECT current_setting($1)", &[&name])
        .await
        .with_context(|| format!("reading {name}"))?
        .get(0))
}

/// Opens the transport of a replication session and describes it: through a TLS tunnel when
/// the source's sslmode asks for TLS and the server offers it, directly otherwise.
pub async fn replication_session(
    cfg: &PostgresConfig,
    slot: &str,
) -> Result<pgwire_replication::ReplicationConfig> {
    let mut rc = replication_config(cfg, slot);
    if let Some(dir) = tunnel::open(cfg).await? {
        rc.host = dir.to_string_lossy().into_owned();
    }
    Ok(rc)
}

/// A replication-protocol session configuration (for slots and the change stream).
pub fn replication_config(
    cfg: &PostgresConfig,
    slot: &str,
) -> pgwire_replication::ReplicationConfig {
    let mut rc = pgwire_replication::ReplicationConfig::new(
        cfg.host.clone(),
        cfg.user.clone(),
        cfg.password.clone().unwrap_or_default(),
        cfg.database.clone(),
        slot.to_string(),
        cfg.publication.clone(),
    )
    .with_port(cfg.port)
    .with_options(SESSION_OPTIONS);
    rc.application_name = Some("skipprd".into());
    rc.buffer_events = REPLICATION_BUFFER_EVENTS;
    rc
}

/// Replication messages read ahead of the decoder. Each may hold an allocation of up to
/// 64 KiB (more for a wider row), so this bounds the read-ahead to tens of MiB; the library's
/// default (8,192) let a large transaction's read-ahead grow to hundreds of MiB whatever the
/// transaction memory budget.
const REPLICATION_BUFFER_EVENTS: usize = 512;
