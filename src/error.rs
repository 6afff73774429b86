//! Errors for every stage of the data flow: one `Error` with a kind, the source chain kept.
//!
//! Foreign library errors are mapped here, in one place, so every other module can use `?`
//! and add context with [`Context::context`].

use std::fmt;

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

    /// Process exit code for this error: 2 for configuration problems, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Config => 2,
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

from_foreign!(std::io::Error, ErrorKind::Fatal);
from_foreign!(iceberg::Error, ErrorKind::Fatal);
from_foreign!(arrow::error::ArrowError, ErrorKind::Fatal);
from_foreign!(parquet::errors::ParquetError, ErrorKind::Fatal);
from_foreign!(serde_json::Error, ErrorKind::Fatal);
from_foreign!(sqlx::Error, ErrorKind::Fatal);

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
        let kind = if e.is_closed() || e.as_db_error().is_none() {
            ErrorKind::Retryable
        } else {
            ErrorKind::Source
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

impl From<pgwire_replication::PgWireError> for Error {
    fn from(e: pgwire_replication::PgWireError) -> Self {
        let kind = if e.is_transient() {
            ErrorKind::Retryable
        } else {
            ErrorKind::Source
        };
        Error::new(kind, e.to_string()).with_source(e)
    }
}

impl From<Error> for datafusion::error::DataFusionError {
    fn from(e: Error) -> Self {
        datafusion::error::DataFusionError::External(Box::new(e))
    }
}
