//! TLS for the replication sessions (slot creation, the change stream), the first hop of the
//! data flow. The replication client speaks plain TCP or a Unix socket only; for TLS we open
//! the TCP connection, negotiate TLS ourselves (libpq's SSLRequest, then rustls with the
//! source's `sslmode` rules from `tls.rs`), and hand the client a private Unix socket that
//! carries the bytes through that TLS session. The server sees an ordinary TLS connection
//! (`hostssl` lines of pg_hba.conf apply).

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

use super::tls::{server_name, SourceTls};
use crate::config::{PostgresConfig, SslMode};
use crate::error::{Context, Error, Result};

/// libpq's SSLRequest: length 8, then the request code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Opens the transport of one replication session. `None`: connect directly (sslmode
/// `disable`, a Unix socket, or `prefer` against a server without TLS). `Some(dir)`: connect
/// to the Unix socket folder `dir` (same port number), which leads through TLS to the server;
/// the folder is private to this process and removed once the session is connected.
pub async fn open(cfg: &PostgresConfig) -> Result<Option<PathBuf>> {
    if cfg.host.starts_with('/') || cfg.sslmode == SslMode::Disable {
        return Ok(None);
    }
    let tls = SourceTls::new(cfg)?;
    let Some(config) = tls.config.clone() else {
        return Ok(None);
    };
    let within = |what: &'static str| {
        Error::retryable(format!(
            "cannot reach Postgres at {}:{} for replication: no answer within {}s ({what}; skippr.reconnect.peer_timeout)",
            cfg.host,
            cfg.port,
            cfg.peer_timeout.as_secs()
        ))
    };
    let reach = || {
        format!(
            "cannot reach Postgres at {}:{} for replication",
            cfg.host, cfg.port
        )
    };
    let mut tcp = tokio::time::timeout(
        cfg.peer_timeout,
        TcpStream::connect((cfg.host.as_str(), cfg.port)),
    )
    .await
    .map_err(|_| within("TCP connect"))?
    .with_context(reach)?;
    tcp.set_nodelay(true).with_context(reach)?;
    let mut answer = [0u8; 1];
    let negotiated = async {
        tcp.write_all(&SSL_REQUEST).await?;
        tcp.read_exact(&mut answer).await
    };
    tokio::time::timeout(cfg.peer_timeout, negotiated)
        .await
        .map_err(|_| within("TLS request"))?
        .with_context(reach)?;
    if answer[0] != b'S' {
        if tls.mode == SslMode::Prefer {
            return Ok(None);
        }
        return Err(no_tls(cfg, tls.mode));
    }
    let name = server_name(&cfg.host).map_err(|e| tls.explain(cfg, &e))?;
    let handshake = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
    let stream = match tokio::time::timeout(cfg.peer_timeout, handshake).await {
        Err(_) => return Err(within("TLS handshake")),
        Ok(Ok(s)) => s,
        // libpq's `prefer` falls back to a plain connection when TLS fails.
        Ok(Err(e)) if tls.mode == SslMode::Prefer => {
            tracing::warn!(source = %cfg.name, error = %e, "TLS to the source failed; sslmode prefer falls back to plain TCP");
            return Ok(None);
        }
        Ok(Err(e)) => return Err(tls.explain(cfg, &e)),
    };
    let dir = std::env::temp_dir().join(format!("skippr-tls-{}", uuid::Uuid::new_v4().simple()));
    make_private_dir(&dir).with_context(|| {
        format!(
            "cannot create the private socket folder {} for the TLS replication session",
            dir.display()
        )
    })?;
    let socket = dir.join(format!(".s.PGSQL.{}", cfg.port));
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    let wait = cfg.peer_timeout.max(Duration::from_secs(1));
    let cleanup = dir.clone();
    tokio::spawn(async move {
        let accepted = tokio::time::timeout(wait, listener.accept()).await;
        // One session per tunnel: nobody else may connect, so the folder goes at once.
        drop(listener);
        let _ = std::fs::remove_dir_all(&cleanup);
        let Ok(Ok((mut local, _))) = accepted else {
            return;
        };
        let mut remote = stream;
        if let Err(e) = tokio::io::copy_bidirectional(&mut local, &mut remote).await {
            tracing::debug!(error = %e, "TLS replication tunnel ended");
        }
        let _ = remote.shutdown().await;
    });
    Ok(Some(dir))
}

/// The server answered the SSLRequest with "no".
fn no_tls(cfg: &PostgresConfig, mode: SslMode) -> Error {
    Error::config(format!(
        "Postgres at {}:{} does not accept TLS, but data source `{}` has sslmode {}: turn TLS on in the server (ssl = on with a certificate), or set sslmode: prefer (or disable)",
        cfg.host,
        cfg.port,
        cfg.name,
        mode.as_str()
    ))
}

/// The message for a SQL session refused TLS by the server (see connect.rs).
pub fn no_tls_error(cfg: &PostgresConfig, mode: SslMode) -> Error {
    no_tls(cfg, mode)
}

/// A folder only this user can enter: the socket inside it then needs no password of its own.
fn make_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}
