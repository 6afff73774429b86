//! Errors for every stage of the data flow: one `Error` with a kind, the source chain kept.
//!
//! Foreign library errors are mapped here, in one place, so every other module can use `?`
//! and add context with [`Context::context`].

use std::fmt;

pub mod sqlstate;
pub mod stops;

/// What the operator (or a retry loop) can do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The configuration is wrong: fix `skippr.yml` (exit code 2).
    Config,
    /// The source is not ready for what the pipeline needs (missing privilege, slot, table...).
    Source,
    /// A value or schema cannot be represented losslessly at the destination: fail closed.
    Unrepresentable,
    /// A passing failure (network, conflict) that a retry may fix.
    Retryable,
    /// Bad SQL or a query that cannot run.
    Query,
    /// Anything else: a bug or an I/O failure that needs an operator.
    Fatal,
}

/// The crate's error: a kind, a message that says what happened and what to do, and the cause.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }

    pub fn source_err(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Source, message)
    }

    pub fn unrepresentable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unrepresentable, message)
    }

    pub fn query(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Query, message)
    }

    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Retryable, message)
    }

    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Fatal, message)
    }

    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the cause is a full disk (or quota): ingest waits for space instead of
    /// failing, and the pipeline's state says so.
    pub fn is_storage_full(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if is_storage_full_io(io) {
                    return true;
                }
            }
            cause = c.source();
        }
        // Some libraries keep only the text of the I/O error.
        let report = self.report();
        STORAGE_FULL_TEXT.iter().any(|t| report.contains(t))
    }

    /// The message followed by every cause in the chain, `: `-separated, for the terminal.
    pub fn report(&self) -> String {
        let mut out = self.message.clone();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = self
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static));
        while let Some(c) = cause {
            let text = c.to_string();
            if !text.is_empty() && !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = c.source();
        }
        out
    }

    /// Process exit code for this error: 2 for configuration problems, 75 (`EX_TEMPFAIL`)
    /// for a transient fault that outlasted the retries (running again later can succeed),
    /// 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Config => 2,
            ErrorKind::Retryable => 75,
            _ => 1,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Adds a sentence of context to any error, keeping it as the source.
pub trait Context<T> {
    fn context(self, message: impl Into<String>) -> Result<T>;
    fn with_context<F: FnOnce() -> String>(self, f: F) -> Result<T>;
}

impl<T, E> Context<T> for std::result::Result<T, E>
where
    E: Into<Error>,
{
    fn context(self, message: impl Into<String>) -> Result<T> {
        self.map_err(|e| wrap(e.into(), message.into()))
    }

    fn with_context<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|e| wrap(e.into(), f()))
    }
}

fn wrap(inner: Error, message: String) -> Error {
    let kind = inner.kind;
    Error {
        kind,
        message,
        source: Some(Box::new(inner)),
    }
}

macro_rules! from_foreign {
    ($ty:ty, $kind:expr) => {
        impl From<$ty> for Error {
            fn from(e: $ty) -> Self {
                let message = e.to_string();
                Error::new($kind, message).with_source(e)
            }
        }
    };
}

from_foreign!(arrow::error::ArrowError, ErrorKind::Fatal);
from_foreign!(parquet::errors::ParquetError, ErrorKind::Fatal);
from_foreign!(serde_json::Error, ErrorKind::Fatal);

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        let kind = io_kind(&e);
        Error::new(kind, e.to_string()).with_source(e)
    }
}

/// An I/O error that a later try may not meet: the peer went away or is not there yet, the
/// operation timed out, or the disk is full (space comes back). Everything else (a missing
/// file, a permission) needs an operator.
pub fn io_kind(e: &std::io::Error) -> ErrorKind {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset
        | K::ConnectionRefused
        | K::ConnectionAborted
        | K::NotConnected
        | K::BrokenPipe
        | K::TimedOut
        | K::UnexpectedEof
        | K::Interrupted
        | K::WouldBlock
        | K::HostUnreachable
        | K::NetworkUnreachable
        | K::NetworkDown
        | K::AddrNotAvailable
        | K::StorageFull
        | K::QuotaExceeded
        | K::ResourceBusy => ErrorKind::Retryable,
        _ if e.raw_os_error() == Some(ENOSPC) => ErrorKind::Retryable,
        _ => ErrorKind::Fatal,
    }
}

/// A full disk or an exceeded quota.
pub fn is_storage_full_io(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || e.raw_os_error() == Some(ENOSPC)
}

/// `ENOSPC` on Linux and the BSDs.
const ENOSPC: i32 = 28;

/// The kind of a foreign error whose cause may be an I/O error deep in its chain (iceberg,
/// sqlx, object_store wrap them): the first I/O error decides, else `otherwise`.
fn kind_from_chain(e: &(dyn std::error::Error + 'static), otherwise: ErrorKind) -> ErrorKind {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return io_kind(io);
        }
        // Some storage layers keep only the text of the I/O error.
        if STORAGE_FULL_TEXT.iter().any(|t| c.to_string().contains(t)) {
            return ErrorKind::Retryable;
        }
        cause = c.source();
    }
    otherwise
}

/// How a full disk reads once an I/O error has been turned into text (the OS's message,
/// sqlite's SQLITE_FULL).
const STORAGE_FULL_TEXT: [&str; 2] = ["No space left on device", "database or disk is full"];

impl From<iceberg::Error> for Error {
    fn from(e: iceberg::Error) -> Self {
        let kind = if e.retryable() || e.kind() == iceberg::ErrorKind::CatalogCommitConflicts {
            ErrorKind::Retryable
        } else {
            kind_from_chain(&e, ErrorKind::Fatal)
        };
        Error::new(kind, e.to_string()).with_source(e)
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        let kind = match &e {
            sqlx::Error::Io(io) => io_kind(io),
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => ErrorKind::Retryable,
            // sqlite's primary result codes (the low byte of an extended code): SQLITE_BUSY
            // (5), SQLITE_LOCKED (6), SQLITE_IOERR (10), SQLITE_FULL (13).
            sqlx::Error::Database(db)
                if db
                    .code()
                    .and_then(|c| c.parse::<i64>().ok())
                    .is_some_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13)) =>
            {
                ErrorKind::Retryable
            }
            _ => kind_from_chain(&e, ErrorKind::Fatal),
        };
        Error::new(kind, e.to_string()).with_source(e)
    }
}

/// What a Postgres SQLSTATE means for a retry loop. Transient: the connection classes (08),
/// the server shutting down, crashing or starting up (57P01, 57P02, 57P03), too many
/// connections (53300), serialization failures and deadlocks (40001, 40P01), and a slot still
/// held by the previous session of a connection that just broke (55006: its walsender lets
/// go within `wal_sender_timeout`). Everything else (a lost slot, a missing publication, a
/// denied permission, a wrong password) needs a person.
pub fn sqlstate_kind(code: &str) -> ErrorKind {
    match code {
        c if c.starts_with("08") => ErrorKind::Retryable,
        sqlstate::ADMIN_SHUTDOWN
        | sqlstate::CRASH_SHUTDOWN
        | sqlstate::CANNOT_CONNECT_NOW
        | sqlstate::TOO_MANY_CONNECTIONS
        | sqlstate::SERIALIZATION_FAILURE
        | sqlstate::DEADLOCK_DETECTED
        | sqlstate::OBJECT_IN_USE => ErrorKind::Retryable,
        _ => ErrorKind::Source,
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        // A server error carries the useful text in its DbError; keep it whole.
        let message = match e.as_db_error() {
            Some(db) => {
                let mut m = format!("{}: {}", db.severity(), db.message());
                if let Some(detail) = db.detail() {
                    m.push_str(&format!(" ({detail})"));
                }
                if let Some(hint) = db.hint() {
                    m.push_str(&format!(" hint: {hint}"));
                }
                m
            }
            None => e.to_string(),
        };
        let kind = match e.as_db_error() {
            Some(db) => sqlstate_kind(db.code().code()),
            // No answer from the server: the connection closed, broke or timed out.
            None => ErrorKind::Retryable,
        };
        Error::new(kind, message).with_source(e)
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        let message = e.to_string();
        Error::new(ErrorKind::Query, message).with_source(e)
    }
}

/// The kind of an error of the replication protocol client: I/O by its kind, a server
/// error by its SQLSTATE, a worker that stopped as transient, the rest (authentication,
/// protocol, TLS) as a problem of the source's set-up.
pub fn replication_kind(e: &pgwire_replication::PgWireError) -> ErrorKind {
    match e {
        pgwire_replication::PgWireError::Io(io) => io_kind(io),
        pgwire_replication::PgWireError::Server(text) => match sqlstate_in(text) {
            Some(code) => sqlstate_kind(code),
            None => ErrorKind::Source,
        },
        e if e.is_transient() => ErrorKind::Retryable,
        _ => ErrorKind::Source,
    }
}

impl From<pgwire_replication::PgWireError> for Error {
    fn from(e: pgwire_replication::PgWireError) -> Self {
        Error::new(replication_kind(&e), e.to_string()).with_source(e)
    }
}

/// The SQLSTATE in a server error rendered as text (`... (SQLSTATE 57P01)`).
fn sqlstate_in(text: &str) -> Option<&str> {
    let at = text.find("SQLSTATE ")? + "SQLSTATE ".len();
    text.get(at..at + 5)
        .filter(|c| c.chars().all(|ch| ch.is_ascii_alphanumeric()))
}

impl From<Error> for datafusion::error::DataFusionError {
    fn from(e: Error) -> Self {
        datafusion::error::DataFusionError::External(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_io_errors_are_retryable_and_others_fatal() {
        use std::io::{Error as IoError, ErrorKind as K};
        for k in [
            K::ConnectionReset,
            K::ConnectionRefused,
            K::TimedOut,
            K::UnexpectedEof,
            K::BrokenPipe,
        ] {
            assert_eq!(
                Error::from(IoError::from(k)).kind(),
                ErrorKind::Retryable,
                "{k:?}"
            );
        }
        for k in [K::NotFound, K::PermissionDenied, K::InvalidData] {
            assert_eq!(
                Error::from(IoError::from(k)).kind(),
                ErrorKind::Fatal,
                "{k:?}"
            );
        }
        let full = Error::from(IoError::from_raw_os_error(28));
        assert_eq!(full.kind(), ErrorKind::Retryable);
        assert!(full.is_storage_full());
        assert!(!Error::from(IoError::from(K::ConnectionReset)).is_storage_full());
        // Context keeps the kind and the cause.
        let wrapped: Result<()> = Err(IoError::from_raw_os_error(28)).context("writing a segment");
        let e = wrapped.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Retryable);
        assert!(e.is_storage_full());
        assert_eq!(e.exit_code(), 75);
    }

    #[test]
    fn sqlstates_split_into_transient_and_fatal() {
        for code in [
            sqlstate::ADMIN_SHUTDOWN,
            sqlstate::CRASH_SHUTDOWN,
            sqlstate::CANNOT_CONNECT_NOW,
            sqlstate::CONNECTION_FAILURE,
            sqlstate::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            sqlstate::TOO_MANY_CONNECTIONS,
            sqlstate::OBJECT_IN_USE,
        ] {
            assert_eq!(sqlstate_kind(code), ErrorKind::Retryable, "{code}");
        }
        // permission denied, undefined object (slot or publication missing), slot
        // invalidated, bad password, unknown database
        for code in [
            sqlstate::INSUFFICIENT_PRIVILEGE,
            sqlstate::UNDEFINED_OBJECT,
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            sqlstate::INVALID_PASSWORD,
            sqlstate::INVALID_CATALOG_NAME,
        ] {
            assert_eq!(sqlstate_kind(code), ErrorKind::Source, "{code}");
        }
    }

    #[test]
    fn replication_server_errors_are_classified_by_their_sqlstate() {
        let restart = pgwire_replication::PgWireError::Server(
            "the database system is shutting down (SQLSTATE 57P03)".into(),
        );
        assert_eq!(Error::from(restart).kind(), ErrorKind::Retryable);
        let lost = pgwire_replication::PgWireError::Server(
            "replication slot \"s\" does not exist (SQLSTATE 42704)".into(),
        );
        assert_eq!(Error::from(lost).kind(), ErrorKind::Source);
        let reset = pgwire_replication::PgWireError::Io(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(Error::from(reset).kind(), ErrorKind::Retryable);
        let auth = pgwire_replication::PgWireError::Auth("password authentication failed".into());
        assert_eq!(Error::from(auth).kind(), ErrorKind::Source);
    }
}
