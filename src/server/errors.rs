//! Gateway, errors: every error a client sees carries a SQLSTATE that says what kind of
//! problem it is (syntax, unknown table or column, unsupported feature, data, retry).

use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;
use pgwire::api::{ClientInfo, ErrorHandler};
use pgwire::error::{ErrorInfo, PgWireError};

use crate::error::sqlstate;
use crate::error::{Error, ErrorKind};
use crate::query::as_of::AS_OF_MESSAGE;
use crate::query::view::LSN_WAIT_MESSAGE;

/// Maps query-engine errors to Postgres SQLSTATEs before they are sent.
pub struct SqlStateErrors;

/// An error raised inside the engine (by a function) with Postgres's own SQLSTATE, message
/// and detail, sent to the client as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgError {
    pub code: &'static str,
    pub message: String,
    pub detail: Option<String>,
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PgError {}

impl From<PgError> for DataFusionError {
    fn from(e: PgError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

/// An engine or library error, passed to the client as pgwire reports such errors.
pub(super) fn api_error(e: impl std::error::Error + Send + Sync + 'static) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

/// The DETAIL of an engine error, when it has one (see [`PgError`]).
pub fn detail(e: &DataFusionError) -> Option<String> {
    match e.find_root() {
        DataFusionError::External(inner) => inner
            .downcast_ref::<PgError>()
            .and_then(|p| p.detail.clone()),
        _ => None,
    }
}

/// The SQLSTATE for a query-engine error.
pub fn sqlstate(e: &DataFusionError) -> &'static str {
    let root = e.find_root();
    match root {
        DataFusionError::SQL(..) => sqlstate::SYNTAX_ERROR,
        DataFusionError::SchemaError(s, _) => {
            let m = s.to_string();
            if m.contains("No field named") || m.contains("not found") {
                sqlstate::UNDEFINED_COLUMN
            } else if m.contains("ambiguous") || m.contains("Ambiguous") {
                sqlstate::AMBIGUOUS_COLUMN
            } else {
                sqlstate::INDETERMINATE_DATATYPE
            }
        }
        DataFusionError::Plan(m) => {
            let lower = m.to_lowercase();
            if lower.contains("table") && lower.contains("not found") {
                sqlstate::UNDEFINED_TABLE
            } else if lower.contains("invalid function") || lower.contains("no function matches") {
                sqlstate::UNDEFINED_FUNCTION
            } else if lower.contains("no field named") {
                sqlstate::UNDEFINED_COLUMN
            } else {
                sqlstate::SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION
            }
        }
        DataFusionError::NotImplemented(_) => sqlstate::FEATURE_NOT_SUPPORTED,
        DataFusionError::ArrowError(a, _) => {
            let m = a.to_string();
            if m.contains("Divide by zero") {
                sqlstate::DIVISION_BY_ZERO
            } else if m.contains("Cast error") || m.contains("Parser error") {
                sqlstate::INVALID_TEXT_REPRESENTATION
            } else {
                sqlstate::DATA_EXCEPTION
            }
        }
        DataFusionError::Execution(m) if m.contains("Divide by zero") => sqlstate::DIVISION_BY_ZERO,
        DataFusionError::ResourcesExhausted(_) => sqlstate::OUT_OF_MEMORY,
        DataFusionError::External(inner) if inner.is::<PgError>() => inner
            .downcast_ref::<PgError>()
            .map_or(sqlstate::INTERNAL_ERROR, |p| p.code),
        DataFusionError::External(inner) => match inner.downcast_ref::<Error>() {
            Some(err) => match err.kind() {
                ErrorKind::Query if err.message().starts_with(LSN_WAIT_MESSAGE) => {
                    super::limits::QUERY_CANCELED
                }
                // Postgres's snapshot_too_old: the state asked for is no longer kept.
                ErrorKind::Query if err.message().starts_with(AS_OF_MESSAGE) => {
                    sqlstate::SNAPSHOT_TOO_OLD
                }
                ErrorKind::Retryable => sqlstate::SERIALIZATION_FAILURE,
                ErrorKind::Query => sqlstate::SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION,
                ErrorKind::Unrepresentable => sqlstate::DATA_EXCEPTION,
                _ => sqlstate::INTERNAL_ERROR,
            },
            None => sqlstate::INTERNAL_ERROR,
        },
        _ => sqlstate::INTERNAL_ERROR,
    }
}

/// The text a client sees: the root cause, without DataFusion's "External error: " wrapper
/// around errors skipprd raised itself (they name the problem and the fix on their own).
pub fn message(e: &DataFusionError) -> String {
    match e.find_root() {
        DataFusionError::External(inner) => inner.to_string(),
        root @ DataFusionError::ResourcesExhausted(text) => {
            format!("{root}; {}", crate::query::limits::memory_hint(text))
        }
        root => root.to_string(),
    }
}

impl ErrorHandler for SqlStateErrors {
    fn on_error<C>(&self, _client: &C, error: &mut PgWireError)
    where
        C: ClientInfo,
    {
        let mapped = match error {
            PgWireError::ApiError(inner) => {
                let (code, message, more) =
                    if let Some(df) = inner.downcast_ref::<DataFusionError>() {
                        (sqlstate(df), message(df), detail(df))
                    } else if inner.downcast_ref::<ParserError>().is_some() {
                        (sqlstate::SYNTAX_ERROR, inner.to_string(), None)
                    } else {
                        (sqlstate::INTERNAL_ERROR, inner.to_string(), None)
                    };
                let mut info = ErrorInfo::new("ERROR".to_string(), code.to_string(), message);
                info.detail = more;
                Some(info)
            }
            _ => None,
        };
        if let Some(info) = mapped {
            tracing::debug!(sqlstate = %info.code, "statement failed");
            *error = PgWireError::UserError(Box::new(info));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipprd_error_reaches_the_client_without_the_wrapper() {
        let e = DataFusionError::External(Box::new(Error::query("no pipeline p")));
        assert_eq!(
            sqlstate(&e),
            sqlstate::SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION
        );
        let text = message(&e);
        assert!(text.contains("no pipeline p"), "{text}");
        assert!(!text.contains("External error"), "{text}");
        let pg: DataFusionError = PgError {
            code: sqlstate::INSUFFICIENT_PRIVILEGE,
            message: "permission denied to cancel query".into(),
            detail: Some("Only the user ...".into()),
        }
        .into();
        let wrapped = DataFusionError::Context("evaluating".into(), Box::new(pg));
        assert_eq!(sqlstate(&wrapped), sqlstate::INSUFFICIENT_PRIVILEGE);
        assert_eq!(message(&wrapped), "permission denied to cancel query");
        assert_eq!(detail(&wrapped).as_deref(), Some("Only the user ..."));
        let plain = DataFusionError::Plan("bad plan".into());
        assert!(message(&plain).contains("bad plan"));
    }
}
