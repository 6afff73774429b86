//! Gateway, errors: every error a client sees carries a SQLSTATE that says what kind of
//! problem it is (syntax, unknown table or column, unsupported feature, data, retry).

use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;
use pgwire::api::{ClientInfo, ErrorHandler};
use pgwire::error::{ErrorInfo, PgWireError};

use crate::error::{Error, ErrorKind};

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

impl ErrorHandler for SqlStateErrors {
    fn on_error<C>(&self, _client: &C, error: &mut PgWireError)
    where
        C: ClientInfo,
    {
        let mapped = match error {
            PgWireError::ApiError(inner) => {
                let (code, message) = if let Some(df) = inner.downcast_ref::<DataFusionError>() {
                    (sqlstate(df), df.find_root().to_string())
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
