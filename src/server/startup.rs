//! Gateway, a connection's start-up: before authentication a client is refused when TLS is
//! configured and it did not ask for it (28000, as `hostssl`), or when every connection
//! slot is taken (53300, as Postgres); then SCRAM-SHA-256 (users configured) or loopback
//! trust, with a process id unique in the process; then the connection's cancel key is
//! registered, the session is listed (`pg_stat_activity`) and its defaults are set.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{DefaultServerParameterProvider, StartupHandler};
use pgwire::api::{ClientInfo, PgWireConnectionState, PidSecretKeyGenerator};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::activity::{Backend, Registration};
use super::auth;
use super::limits::{CancelKey, Interrupts};
use super::settings::STATEMENT_TIMEOUT_KEY;
use super::Shared;
use crate::error::sqlstate;

/// Trust for loopback clients when no users are configured; process ids from the server's
/// generator.
pub struct Trust(Arc<dyn PidSecretKeyGenerator>);

#[async_trait]
impl NoopStartupHandler for Trust {
    fn pid_secret_key_generator(&self) -> &dyn PidSecretKeyGenerator {
        self.0.as_ref()
    }
}

/// How a connection authenticates.
enum Auth {
    Trust(Trust),
    Scram(Box<SASLAuthStartupHandler<DefaultServerParameterProvider>>),
}

/// The start-up handler of one connection.
pub struct Startup {
    auth: Auth,
    shared: Arc<Shared>,
    interrupts: Arc<Interrupts>,
    /// Whether the connection got a slot (else it is refused with 53300).
    admitted: bool,
    /// The cancel key, registered once start-up is done; removed with the connection.
    key: Mutex<Option<CancelKey>>,
    /// The session as `pg_stat_activity` lists it, once start-up is done.
    backend: Arc<Backend>,
    listed: Mutex<Option<Registration>>,
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_string(),
        code.to_string(),
        message,
    )))
}

impl Startup {
    pub fn new(
        shared: Arc<Shared>,
        interrupts: Arc<Interrupts>,
        backend: Arc<Backend>,
        admitted: bool,
    ) -> Self {
        let auth = match &shared.users {
            Some(users) => {
                let mut scram = ScramAuth::new(users.clone());
                scram.set_iterations(auth::SCRAM_ITERATIONS);
                if let Some(pem) = &shared.tls_cert_pem {
                    // Channel binding (SCRAM-SHA-256-PLUS) when the certificate allows it.
                    if let Err(e) = scram.configure_certificate(pem) {
                        tracing::debug!(error = %e, "SCRAM channel binding unavailable for this certificate");
                    }
                }
                Auth::Scram(Box::new(
                    SASLAuthStartupHandler::new(Arc::new(super::server_parameters(
                        &shared.workspace,
                    )))
                    .with_pid_secret_key_generator(shared.pids.clone())
                    .with_scram(scram),
                ))
            }
            None => Auth::Trust(Trust(shared.pids.clone())),
        };
        Self {
            auth,
            shared,
            interrupts,
            admitted,
            key: Mutex::new(None),
            backend,
            listed: Mutex::new(None),
        }
    }

    /// Refuses the client before authentication, when it must be.
    fn admit(&self, client: &dyn ClientInfo) -> PgWireResult<()> {
        if self.shared.tls_cert_pem.is_some() && !client.is_secure() {
            tracing::info!(peer = %client.socket_addr(), "refused a client that did not ask for TLS");
            return Err(fatal(
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                "this server accepts only TLS connections (skippr.query.tls is set): connect with sslmode=require or verify-full".to_string(),
            ));
        }
        if !self.admitted {
            tracing::warn!(
                peer = %client.socket_addr(),
                max_connections = self.shared.max_connections,
                "refused a client: every connection slot is taken"
            );
            return Err(fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                super::too_many_clients(self.shared.max_connections),
            ));
        }
        Ok(())
    }

    /// Once the client is in: its cancel key and its session defaults.
    fn started(&self, client: &mut dyn ClientInfo) {
        let mut key = self.key.lock().unwrap_or_else(|e| e.into_inner());
        if key.is_some() {
            return;
        }
        let (pid, secret) = client.pid_and_secret_key();
        *key = Some(self.shared.cancel_keys.register(
            pid,
            secret.to_bytes().to_vec(),
            &self.interrupts,
        ));
        let peer = client.socket_addr();
        *self.listed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(self.backend.register(pid, client.metadata(), Some(peer)));
        let meta = client.metadata_mut();
        if !meta.contains_key(STATEMENT_TIMEOUT_KEY) {
            // A `-c statement_timeout=...` start-up option wins over the configured default.
            let from_options = super::settings::startup_options(meta)
                .get("statement_timeout")
                .and_then(|v| crate::config::parse_pg_duration(v))
                .map(|d| d.as_millis());
            let ms = from_options.unwrap_or(self.shared.default_timeout_ms);
            meta.insert(STATEMENT_TIMEOUT_KEY.to_string(), ms.to_string());
        }
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let PgWireFrontendMessage::Startup(_) = &message {
            self.admit(&*client)?;
        }
        match &self.auth {
            Auth::Trust(t) => t.on_startup(client, message).await?,
            Auth::Scram(s) => s.on_startup(client, message).await?,
        }
        if matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            self.started(client);
        }
        Ok(())
    }
}
