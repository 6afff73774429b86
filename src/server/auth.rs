//! Gateway, authentication and TLS: the users of `skippr.query.users` log in with
//! SCRAM-SHA-256, and the TLS certificate and key must load or the gateway does not start.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use pgwire::api::auth::sasl::scram::gen_salted_password;
use pgwire::api::auth::{AuthSource, LoginInfo, Password};
use pgwire::error::PgWireResult;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// PBKDF2 iterations of the SCRAM exchange (Postgres's default).
pub const SCRAM_ITERATIONS: usize = 4096;

/// Configured users, with their salted passwords computed once at start.
#[derive(Debug)]
pub struct Users {
    salted: HashMap<String, (Vec<u8>, Vec<u8>)>,
    /// Keys of the mock credentials of unknown user names (random per process).
    mock_keys: ([u8; 16], [u8; 16]),
}

impl Users {
    pub fn new(users: &[(String, String)]) -> Self {
        let salted = users
            .iter()
            .map(|(name, password)| {
                let salt: [u8; 16] = rand_salt();
                let hashed = gen_salted_password(password, &salt, SCRAM_ITERATIONS);
                (name.clone(), (salt.to_vec(), hashed))
            })
            .collect();
        Self {
            salted,
            mock_keys: (rand_salt(), rand_salt()),
        }
    }

    /// Credentials for a user name that does not exist, so the exchange goes on exactly as
    /// for a real user and fails at the same step with the same error (as Postgres's mock
    /// authentication): the salt is stable per name (derived with a key of the process),
    /// and no password matches the salted one.
    fn mock(&self, user: &str) -> (Vec<u8>, Vec<u8>) {
        let salt = gen_salted_password(user, &self.mock_keys.0, 1);
        let salted = gen_salted_password(user, &self.mock_keys.1, 1);
        (salt[..16].to_vec(), salted)
    }
}

fn rand_salt() -> [u8; 16] {
    *uuid::Uuid::new_v4().as_bytes()
}

#[async_trait]
impl AuthSource for Users {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let user = login.user().unwrap_or_default();
        match self.salted.get(user) {
            Some((salt, hashed)) => Ok(Password::new(Some(salt.clone()), hashed.clone())),
            None => {
                // Never tell the client: it gets the same exchange and the same failure as
                // with a wrong password.
                tracing::info!(user = %user, "login attempt for an unknown user");
                let (salt, hashed) = self.mock(user);
                Ok(Password::new(Some(salt), hashed))
            }
        }
    }
}

/// Loads the certificate chain and key. Returns the acceptor and the certificate's PEM
/// (for SCRAM channel binding).
pub fn load_tls(cert: &Path, key: &Path) -> Result<(tokio_rustls::TlsAcceptor, Vec<u8>)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |what: &str, path: &Path| -> Result<Vec<u8>> {
        std::fs::read(path).map_err(|e| {
            Error::config(format!(
                "cannot read the TLS {what} {} (skippr.query.tls.{what}): {e}; fix the path or remove the tls section (the gateway never falls back to plain text)",
                path.display()
            ))
        })
    };
    let cert_pem = read("cert", cert)?;
    let key_pem = read("key", key)?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| {
            Error::config(format!(
                "TLS certificate {} is not valid PEM: {e}",
                cert.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::config(format!(
            "TLS certificate {} holds no certificate (expected PEM `-----BEGIN CERTIFICATE-----`)",
            cert.display()
        )));
    }
    let key_der: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| Error::config(format!("TLS key {} is not valid PEM: {e}", key.display())))?
        .ok_or_else(|| {
            Error::config(format!(
                "TLS key {} holds no private key (expected PEM PKCS#8, PKCS#1 or SEC1)",
                key.display()
            ))
        })?;
    // TLS 1.2 and 1.3 only (rustls has nothing older; said here so it stays so).
    let config = rustls::ServerConfig::builder_with_protocol_versions(&[
        &rustls::version::TLS13,
        &rustls::version::TLS12,
    ])
    .with_no_client_auth()
    .with_single_cert(certs, key_der)
    .map_err(|e| {
        Error::config(format!(
            "TLS certificate {} and key {} cannot be used together: {e}",
            cert.display(),
            key.display()
        ))
    })?;
    Ok((tokio_rustls::TlsAcceptor::from(Arc::new(config)), cert_pem))
}
