//! Validation of the TLS settings of a Postgres source (`sslmode`, `sslrootcert`), the part
//! of the config stage that the source's connections (source/postgres/tls.rs) rely on.

use std::path::{Path, PathBuf};

use super::locate::Segment;
use super::{normalize, SslMode, Validator};

impl Validator<'_> {
    /// Checks `sslmode` against the host and resolves `sslrootcert` against the config
    /// file's folder. A root certificate that the mode would use must exist: a missing file
    /// is found here rather than at the first connection.
    pub(super) fn source_tls(
        &mut self,
        at: &dyn Fn(&str) -> Vec<Segment>,
        host: &str,
        mode: SslMode,
        rootcert: Option<&str>,
        base: &Path,
    ) -> Option<PathBuf> {
        // Postgres never speaks TLS on a Unix socket, and libpq does not ask for it there.
        if host.starts_with('/')
            && matches!(
                mode,
                SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
            )
        {
            self.report(
                at("sslmode"),
                format!(
                    "`{}` needs a TCP connection, but host `{host}` is a Unix socket folder, where Postgres never uses TLS: set `sslmode: disable` (or `prefer`), or connect by host name",
                    mode.as_str()
                ),
            );
        }
        let rootcert = rootcert?;
        if rootcert.trim().is_empty() {
            self.report(
                at("sslrootcert"),
                "must not be empty: give the path of the CA certificate file (PEM), or remove the key",
            );
            return None;
        }
        let path = normalize(&base.join(rootcert));
        let used = matches!(
            mode,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        );
        if used && !path.is_file() {
            self.report(
                at("sslrootcert"),
                format!(
                    "`{}` is not a readable file: give the path (relative to skippr.yml) of the PEM file with the CA certificate(s) that signed the server's certificate",
                    path.display()
                ),
            );
        }
        Some(path)
    }
}
