//! Gateway, one client connection's message loop: TLS negotiation, then every message read
//! through the frame check ([`super::frames`]) and handed to the protocol library's
//! dispatcher. The loop owns the connection's stream, plain or TLS, so it can end the
//! session in the protocol's own terms: 08P01 for a message that breaks the protocol, 57P01
//! when the server shuts down (mid-statement too, once the grace period is over) or when
//! `pg_terminate_backend` names the session (at once, whatever it is doing).

use std::io;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::PgWireMessageServerCodec;
use pgwire::tokio::server::{negotiate_tls, process_error, process_message, MaybeTls};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::codec::{Framed, FramedParts};

use super::activity::TERMINATED_MESSAGE;
use super::frames::{violation_of, Checked};
use super::planning::Stmt;
use super::session::ConnHandlers;
use crate::error::sqlstate;

/// How long a client has to finish start-up and authentication (as the protocol library).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the last message to a client may take to go out before the socket is dropped.
const GOODBYE_TIME: Duration = Duration::from_secs(2);

/// SQLSTATE `protocol_violation`.
pub const PROTOCOL_VIOLATION: &str = sqlstate::PROTOCOL_VIOLATION;
/// SQLSTATE `admin_shutdown`.
pub const ADMIN_SHUTDOWN: &str = sqlstate::ADMIN_SHUTDOWN;
/// What a client is told when the server shuts down.
pub const SHUTDOWN_MESSAGE: &str =
    "terminating connection due to administrator command: skipprd is shutting down; reconnect once it is back";

type Socket = Framed<Checked<MaybeTls>, PgWireMessageServerCodec<Stmt>>;

/// Serves one client until it leaves, breaks the protocol, or `closing` turns true.
pub(super) async fn serve(
    socket: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handlers: ConnHandlers,
    closing: watch::Receiver<bool>,
) -> io::Result<()> {
    let peer = socket.peer_addr().ok();
    let startup_timeout = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_timeout);
    let negotiated = tokio::select! {
        _ = &mut startup_timeout => return Ok(()),
        _ = wait_true(closing.clone()) => return Ok(()),
        n = negotiate_tls::<Stmt>(socket, tls) => n?,
    };
    // A client that asked for TLS directly when none is configured.
    let Some(framed) = negotiated else {
        return Ok(());
    };
    let parts = framed.into_parts();
    let secure = parts.codec.client_info.is_secure;
    let mut checked = Checked::new(parts.io, parts.read_buf);
    if secure && checked.has_buffered() {
        // Bytes sent in the clear before the handshake must not count as sent over TLS.
        checked.refuse("received unencrypted data after the TLS request");
    }
    let mut new_parts = FramedParts::new(checked, parts.codec);
    new_parts.write_buf = parts.write_buf;
    let mut socket: Socket = Framed::from_parts(new_parts);

    // The session by its own type: the dispatcher needs its statement type.
    let startup = handlers.startup.clone();
    let simple = handlers.service.clone();
    let extended = handlers.service.clone();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    let terminated = handlers.terminated();
    let mut authenticated = false;
    loop {
        let starting = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        if !starting && !authenticated {
            authenticated = true;
            socket.get_mut().authenticated();
        }
        let next = tokio::select! {
            biased;
            _ = wait_true(closing.clone()) => {
                goodbye(&mut socket, ADMIN_SHUTDOWN, SHUTDOWN_MESSAGE).await;
                return Ok(());
            }
            _ = wait_true(terminated.clone()) => {
                goodbye(&mut socket, ADMIN_SHUTDOWN, TERMINATED_MESSAGE).await;
                return Ok(());
            }
            _ = &mut startup_timeout, if starting => return Ok(()),
            msg = socket.next() => msg,
        };
        let message = match next {
            None => return Ok(()),
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                broken(&mut socket, e, peer).await;
                return Ok(());
            }
        };
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            return Ok(());
        }
        let is_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let outcome = tokio::select! {
            biased;
            _ = wait_true(closing.clone()) => Err(SHUTDOWN_MESSAGE),
            _ = wait_true(terminated.clone()) => Err(TERMINATED_MESSAGE),
            r = process_message(
                message,
                &mut socket,
                startup.clone(),
                simple.clone(),
                extended.clone(),
                copy.clone(),
                cancel.clone(),
            ) => Ok(r),
        };
        match outcome {
            Err(why) => {
                goodbye(&mut socket, ADMIN_SHUTDOWN, why).await;
                return Ok(());
            }
            Ok(Ok(())) => {}
            Ok(Err(mut e)) => {
                errors.on_error(&socket, &mut e);
                let info = ErrorInfo::from(e);
                let fatal = info.is_fatal();
                process_error(
                    &mut socket,
                    PgWireError::UserError(Box::new(info)),
                    is_extended,
                )
                .await?;
                if fatal {
                    return Ok(());
                }
            }
        }
    }
}

/// A message that could not be read: a protocol violation gets 08P01 and the connection
/// ends; a broken socket just ends.
async fn broken(socket: &mut Socket, e: PgWireError, peer: Option<std::net::SocketAddr>) {
    let problem = match &e {
        PgWireError::IoError(io) => match violation_of(io) {
            Some(v) => v.to_string(),
            None => {
                tracing::debug!(error = %io, "client connection ended with an error");
                return;
            }
        },
        // The library's own decoding errors (an unknown protocol version, say).
        other => other.to_string(),
    };
    tracing::warn!(peer = ?peer, problem = %problem, "closed a client connection that broke the protocol");
    goodbye(socket, PROTOCOL_VIOLATION, &problem).await;
}

/// Sends one FATAL `ErrorResponse` and closes the connection (TLS included), giving up
/// after [`GOODBYE_TIME`] on a client that does not read.
async fn goodbye(socket: &mut Socket, code: &str, message: &str) {
    let info = ErrorInfo::new("FATAL".to_string(), code.to_string(), message.to_string());
    let send = async {
        socket
            .send(PgWireBackendMessage::ErrorResponse(info.into()))
            .await?;
        socket.close().await
    };
    let _ = tokio::time::timeout(GOODBYE_TIME, send).await;
}

/// Resolves once `rx` holds true (or its sender is gone).
pub(super) async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}
