//! Connections to the source Postgres: plain SQL sessions (discovery, snapshot copies) and
//! replication sessions (slot creation, the change stream), all pinned to the same output
//! settings so that values arrive in one predictable text format.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use crate::config::PostgresConfig;
use crate::error::{Error, ErrorKind, Result};

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
    // The connect timeout covers the TCP connection only; the start-up exchange is bounded
    // here, so a server that accepts but never answers is a retryable fault, not a hang.
    let connecting = match tokio::time::timeout(cfg.peer_timeout, pg.connect(NoTls)).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::retryable(format!(
            "no answer within {}s (skippr.reconnect.peer_timeout)",
            cfg.peer_timeout.as_secs()
        ))),
    };
    let (client, connection) = connecting.map_err(|reason| {
        let hint = if reason.kind() == ErrorKind::Retryable {
            "the server is restarting or unreachable; if this lasts, check host and port in skippr.yml and that the server accepts connections from here"
        } else {
            "check host, port, user, password and database in skippr.yml, and that the server accepts connections from here"
        };
        Error::new(
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
        .with_source(reason)
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres connection ended");
        }
    });
    Ok(client)
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
    rc
}
