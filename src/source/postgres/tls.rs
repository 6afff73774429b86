//! TLS to the source Postgres, the first hop of the data flow: libpq's `sslmode` semantics
//! over rustls, for the SQL sessions (a `tokio_postgres` TLS connector) and for the
//! replication sessions (see `tunnel.rs`).
//!
//! | sslmode       | TLS                    | certificate checked              |
//! |---------------|------------------------|----------------------------------|
//! | `disable`     | never                  | -                                |
//! | `prefer`      | when the server offers | no                               |
//! | `require`     | always                 | as `verify-ca` when a root certificate exists, else no |
//! | `verify-ca`   | always                 | chain to `sslrootcert`           |
//! | `verify-full` | always                 | chain, and the name of the host  |

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::config::{PostgresConfig, SslMode};
use crate::error::{Error, Result};

/// How the connections of one source use TLS, resolved from its settings.
#[derive(Clone)]
pub struct SourceTls {
    /// The mode in effect: `require` with a root certificate counts as `verify-ca`, as in libpq.
    pub mode: SslMode,
    /// The root certificate file in use, if any (for messages).
    pub rootcert: Option<PathBuf>,
    /// `None` for `disable`.
    pub config: Option<Arc<ClientConfig>>,
}

/// libpq's default root certificate file.
fn default_rootcert() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".postgresql").join("root.crt"))
}

impl SourceTls {
    /// Builds the client TLS configuration of `cfg`. A root certificate that cannot be read
    /// is a configuration error naming the file.
    pub fn new(cfg: &PostgresConfig) -> Result<Self> {
        let rootcert = cfg
            .sslrootcert
            .clone()
            .or_else(|| default_rootcert().filter(|p| p.is_file()));
        let mode = match (cfg.sslmode, &rootcert) {
            (SslMode::Require, Some(_)) => SslMode::VerifyCa,
            (m, _) => m,
        };
        let verify = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull);
        if mode == SslMode::Disable {
            return Ok(Self {
                mode,
                rootcert,
                config: None,
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        if verify {
            let Some(path) = &rootcert else {
                return Err(Error::config(format!(
                    "data source `{}`: sslmode {} needs the CA certificate that signed the server's certificate: set `sslrootcert` to its PEM file (libpq's default ~/.postgresql/root.crt does not exist), or use sslmode: require to skip the check",
                    cfg.name,
                    mode.as_str()
                )));
            };
            for cert in load_pem_certs(path, &cfg.name)? {
                roots.add(cert).map_err(|e| {
                    Error::config(format!(
                        "data source `{}`: sslrootcert {} holds a certificate rustls cannot use as a root ({e}); give the PEM file of the CA",
                        cfg.name,
                        path.display()
                    ))
                })?;
            }
        }
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::fatal(format!("TLS set-up for the source failed: {e}")))?;
        let mut config = match mode {
            SslMode::VerifyFull => builder.with_root_certificates(roots).with_no_client_auth(),
            SslMode::VerifyCa => {
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider.clone(),
                )
                .build()
                .map_err(|e| Error::fatal(format!("TLS set-up for the source failed: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(NoHostCheck {
                        chain: Some(inner),
                        algorithms: provider.signature_verification_algorithms,
                    }))
                    .with_no_client_auth()
            }
            // prefer and require without a root certificate: encrypted, not authenticated,
            // exactly as libpq.
            _ => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoHostCheck {
                    chain: None,
                    algorithms: provider.signature_verification_algorithms,
                }))
                .with_no_client_auth(),
        };
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            mode,
            rootcert,
            config: Some(Arc::new(config)),
        })
    }

    /// Explains a failed TLS handshake with `host`: what is wrong and what to change.
    pub fn explain(&self, cfg: &PostgresConfig, e: &io::Error) -> Error {
        let cause = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let root = self
            .rootcert
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let what = match cause {
            Some(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => format!(
                "the server's certificate is not valid for host `{}` ({e}); connect with a host name the certificate names, or use sslmode: verify-ca to check only the chain",
                cfg.host
            ),
            Some(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature,
            )) => format!(
                "the server's certificate is not signed by a CA in sslrootcert {root} ({e}); set sslrootcert to the PEM file of the CA that signed the server's certificate"
            ),
            Some(rustls::Error::InvalidCertificate(c)) => format!(
                "the server's certificate was refused ({c:?}); renew it on the server, or check sslrootcert {root}"
            ),
            _ => format!("{e}; check that the server's TLS set-up works (ssl = on, a valid certificate)"),
        };
        Error::config(format!(
            "TLS to Postgres at {}:{} failed for data source `{}` (sslmode {}): {what}",
            cfg.host,
            cfg.port,
            cfg.name,
            self.mode.as_str()
        ))
    }
}

/// Reads the certificates of a PEM file; a missing, unreadable or empty file is a
/// configuration error.
fn load_pem_certs(path: &Path, source: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|e| {
        Error::config(format!(
            "data source `{source}`: cannot read sslrootcert {}: {e}; give the PEM file of the CA that signed the server's certificate",
            path.display()
        ))
    })?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::config(format!(
                "data source `{source}`: sslrootcert {} is not valid PEM: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::config(format!(
            "data source `{source}`: sslrootcert {} holds no certificate (expected `-----BEGIN CERTIFICATE-----` blocks)",
            path.display()
        )));
    }
    Ok(certs)
}

/// A certificate check without the host name: `verify-ca` (`chain`: the chain must lead to a
/// trusted root), and `prefer` and `require` (no `chain`: any certificate is accepted,
/// libpq's meaning of these modes). The handshake's signatures are always checked, so the
/// session key belongs to that certificate.
#[derive(Debug)]
struct NoHostCheck {
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoHostCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Server name for SNI and verification: a DNS name, or an IP address (matched against the
/// certificate's IP entries, as libpq does).
pub fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{host}` is not a valid TLS server name: {e}"),
        )
    })
}

/// The `tokio_postgres` connector of a source: one rustls configuration for every session.
#[derive(Clone)]
pub struct MakeRustls(pub Arc<ClientConfig>);

/// One TLS handshake to `name`.
pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: io::Result<ServerName<'static>>,
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        Ok(RustlsConnect {
            config: self.0.clone(),
            name: server_name(domain),
        })
    }
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = self.name?;
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(RustlsStream(tls))
        })
    }
}

/// A TLS session to the source.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding, as libpq's default `channel_binding=prefer` does
        // when it cannot bind: the password exchange is protected by TLS itself.
        ChannelBinding::none()
    }
}

/// Whether a failed `tokio_postgres` connection failed in the TLS negotiation (the server
/// refused TLS, or the handshake failed).
pub fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_none() && e.to_string().starts_with("error performing TLS handshake")
}

/// The handshake error inside a failed `tokio_postgres` connection; `None` when the server
/// refused TLS before any handshake.
pub fn tls_cause(e: &tokio_postgres::Error) -> Option<&io::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            return Some(io);
        }
        cause = c.source();
    }
    None
}
