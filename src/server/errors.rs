//! Gateway, errors: every error a client sees carries a SQLSTATE that says what kind of
//! problem it is (syntax, unknown table or column, unsupported feature, data, retry).

use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;
use pgwire::api::{ClientInfo, ErrorHandler};
use pgwire::error::{ErrorInfo, PgWireError};

use crate::error::{Error, ErrorKind};
use crate::query::as_of::AS_OF_MESSAGE;
use crate::query::view::LSN_WAIT_MESSAGE;

/// Maps query-engine errors to Postgres SQLSTATEs before they are sent.
pub struct SqlStateErrors;

/// The SQLSTATE for a query-engine error.
pub fn sqlstate(e: &DataFusionError) -> &'static str {
    let root = e.find_root();
    match root {
        DataFusionError::SQL(..) => "42601",
        DataFusionError::SchemaError(s, _) => {
            let m = s.to_string();
            if m.contains("No field named") || m.contains("not found") {
                "42703"
            } else if m.contains("ambiguous") || m.contains("Ambiguous") {
                "42702"
            } else {
                "42P18"
            }
        }
        DataFusionError::Plan(m) => {
            let lower = m.to_lowercase();
            if lower.contains("table") && lower.contains("not found") {
                "42P01"
            } else if lower.contains("invalid function") || lower.contains("no function matches") {
                "42883"
            } else if lower.contains("no field named") {
                "42703"
            } else {
                "42000"
            }
        }
        DataFusionError::NotImplemented(_) => "0A000",
        DataFusionError::ArrowError(a, _) => {
            let m = a.to_string();
            if m.contains("Divide by zero") {
                "22012"
            } else if m.contains("Cast error") || m.contains("Parser error") {
                "22P02"
            } else {
                "22000"
            }
        }
        DataFusionError::Execution(m) if m.contains("Divide by zero") => "22012",
        DataFusionError::ResourcesExhausted(_) => "53200",
        DataFusionError::External(inner) => match inner.downcast_ref::<Error>() {
            Some(err) => match err.kind() {
                ErrorKind::Query if err.message().starts_with(LSN_WAIT_MESSAGE) => {
                    super::limits::QUERY_CANCELED
                }
                // Postgres's snapshot_too_old: the state asked for is no longer kept.
                ErrorKind::Query if err.message().starts_with(AS_OF_MESSAGE) => "72000",
                ErrorKind::Retryable => "40001",
                ErrorKind::Query => "42000",
                ErrorKind::Unrepresentable => "22000",
                _ => "XX000",
            },
            None => "XX000",
        },
        _ => "XX000",
    }
}

/// The text a client sees: the root cause, without DataFusion's "External error: " wrapper
/// around errors skipprd raised itself (they name the problem and the fix on their own).
pub fn message(e: &DataFusionError) -> String {
    match e.find_root() {
        DataFusionError::External(inner) => inner.to_string(),
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
                let (code, message) = if let Some(df) = inner.downcast_ref::<DataFusionError>() {
                    (sqlstate(df), message(df))
                } else if inner.downcast_ref::<ParserError>().is_some() {
                    ("42601", inner.to_string())
                } else {
                    ("XX000", inner.to_string())
                };
                Some(ErrorInfo::new(
                    "ERROR".to_string(),
                    code.to_string(),
                    message,
                ))
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
        assert_eq!(sqlstate(&e), "42000");
        let text = message(&e);
        assert!(text.contains("no pipeline p"), "{text}");
        assert!(!text.contains("External error"), "{text}");
        let plain = DataFusionError::Plan("bad plan".into());
        assert!(message(&plain).contains("bad plan"));
    }
}
