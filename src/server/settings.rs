//! Gateway, session settings: what `SHOW` and `current_setting()` report for a connection,
//! from the values it `SET` (kept in the connection's metadata) or the gateway's defaults.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{Array, AsArray, StringArray};
use arrow::datatypes::DataType;
use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, LogicalPlan, ScalarUDF, Volatility};
use datafusion::sql::sqlparser::ast::{Reset, ResetStatement, Set, Statement};
use datafusion_postgres::hooks::HookClient;

use super::pg::{fence, udf};
use super::readonly::SESSION_SETTINGS;
use super::statements::{placeholder_plan, Answer};
use crate::error::sqlstate;
use crate::query::as_of::{AS_OF, AS_OF_FORMS};
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::{ClientInfo, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::PgWireBackendMessage;

/// Metadata key of `statement_timeout` (milliseconds; 0: none).
pub const STATEMENT_TIMEOUT_KEY: &str = "statement_timeout_ms";

/// The value of setting `name` for a connection whose metadata is `meta`.
pub fn setting(meta: &HashMap<String, String>, name: &str, workspace: &str) -> Option<String> {
    let name = name.trim().to_ascii_lowercase();
    let startup = startup_options(meta);
    let set = |k: &str| {
        meta.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .or_else(|| startup.get(k).cloned())
    };
    Some(match name.as_str() {
        "timezone" | "time zone" => set("timezone").unwrap_or_else(|| "UTC".into()),
        "search_path" => set("search_path").unwrap_or_else(|| workspace.to_string()),
        "server_version" => "16.6".into(),
        "server_version_num" => "160006".into(),
        "datestyle" => set("datestyle").unwrap_or_else(|| "ISO, MDY".into()),
        "intervalstyle" => set("intervalstyle").unwrap_or_else(|| "postgres".into()),
        "client_encoding" | "server_encoding" => "UTF8".into(),
        "standard_conforming_strings" | "integer_datetimes" => "on".into(),
        "default_transaction_read_only" | "transaction_read_only" => "on".into(),
        "transaction_isolation"
        | "default_transaction_isolation"
        | "transaction isolation level" => "read committed".into(),
        "max_identifier_length" => "63".into(),
        "max_index_keys" => "32".into(),
        "bytea_output" => set("bytea_output").unwrap_or_else(|| "hex".into()),
        "extra_float_digits" => set("extra_float_digits").unwrap_or_else(|| "1".into()),
        "application_name" => set("application_name").unwrap_or_default(),
        "is_superuser" => "off".into(),
        "jit" => set("jit").unwrap_or_else(|| "off".into()),
        "lc_collate" | "lc_ctype" | "lc_messages" | "lc_monetary" | "lc_numeric" | "lc_time" => {
            "C.UTF-8".into()
        }
        // Unset: live (empty, as Postgres shows a reset custom setting).
        AS_OF => set(AS_OF).unwrap_or_default(),
        "statement_timeout" => match set(STATEMENT_TIMEOUT_KEY) {
            Some(ms) if ms != "0" => format!("{ms}ms"),
            _ => "0".into(),
        },
        other => return set(other),
    })
}

/// Settings given at connection start as `options=-c name=value` (libpq's `options`).
pub(super) fn startup_options(meta: &HashMap<String, String>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Some(options) = meta.get("options") else {
        return out;
    };
    let mut tokens = options.split_whitespace();
    while let Some(t) = tokens.next() {
        let pair = match t {
            "-c" => tokens.next(),
            t if t.starts_with("-c") => Some(&t[2..]),
            t if t.starts_with("--") => Some(&t[2..]),
            _ => None,
        };
        if let Some((k, v)) = pair.and_then(|p| p.split_once('=')) {
            out.insert(k.to_ascii_lowercase().replace('-', "_"), v.to_string());
        }
    }
    out
}

fn unknown(name: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        sqlstate::UNDEFINED_OBJECT.to_string(),
        format!("unrecognized configuration parameter \"{name}\""),
    )))
}

/// A connection's settings, mirrored for `current_setting()` before each statement, plus
/// what `set_config()` set.
#[derive(Debug, Clone, Default)]
pub struct Mirror {
    pub meta: Arc<RwLock<HashMap<String, String>>>,
    overrides: Arc<RwLock<HashMap<String, String>>>,
}

impl Mirror {
    pub fn update(&self, meta: &HashMap<String, String>) {
        let overrides = self.overrides.read().unwrap_or_else(|e| e.into_inner());
        let mut m = self.meta.write().unwrap_or_else(|e| e.into_inner());
        let mut merged = meta.clone();
        merged.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        if *m != merged {
            *m = merged;
        }
    }

    fn set(&self, name: &str, value: &str) {
        let name = name.to_ascii_lowercase();
        self.overrides
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone(), value.to_string());
        self.meta
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, value.to_string());
    }
}

/// `set_config(name, value, is_local)`: remembered for `current_setting()`, returns the value.
pub fn set_config(mirror: Mirror) -> ScalarUDF {
    udf::with_volatility(
        "set_config",
        DataType::Utf8,
        Volatility::Volatile,
        move |args| {
            let names = udf::text_arg(args, 0, "set_config")?;
            let values = udf::text_arg(args, 1, "set_config")?;
            let (names, values) = (names.as_string::<i32>(), values.as_string::<i32>());
            let mut out = Vec::with_capacity(names.len());
            for i in 0..names.len() {
                if names.is_null(i) || values.is_null(i) {
                    out.push(None);
                    continue;
                }
                mirror.set(names.value(i), values.value(i));
                out.push(Some(values.value(i).to_string()));
            }
            Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
        },
    )
}

/// `current_setting(name [, missing_ok])` for one connection.
pub fn current_setting(mirror: Mirror, workspace: &str) -> ScalarUDF {
    let workspace = workspace.to_string();
    udf::function("current_setting", DataType::Utf8, move |args| {
        let missing_ok = match args.args.get(1) {
            Some(ColumnarValue::Scalar(s)) => s.to_string() == "true",
            _ => false,
        };
        let names = udf::text_arg(args, 0, "current_setting")?;
        let names = names.as_string::<i32>();
        let meta = mirror.meta.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            if names.is_null(i) {
                out.push(None);
                continue;
            }
            match setting(&meta, names.value(i), &workspace) {
                Some(v) => out.push(Some(v)),
                None if missing_ok => out.push(None),
                None => {
                    return Err(DataFusionError::Plan(format!(
                        "unrecognized configuration parameter \"{}\"",
                        names.value(i)
                    )))
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    })
}

/// `SHOW <setting>`, `SET` and `RESET` of session settings.
pub struct SettingsHook {
    pub workspace: String,
    /// `statement_timeout` after RESET (skippr.query.statement_timeout), in ms; 0: none.
    pub default_timeout_ms: u128,
    /// The session's read views, for `SHOW skippr.lsn`.
    pub views: Arc<crate::query::view::ViewHandle>,
}

fn show_response(name: &str, value: &str) -> PgWireResult<Response> {
    let fields = Arc::new(vec![FieldInfo::new(
        name.to_string(),
        None,
        None,
        Type::TEXT,
        FieldFormat::Text,
    )]);
    let mut encoder = DataRowEncoder::new(fields.clone());
    encoder.encode_field(&Some(value))?;
    let row = encoder.take_row();
    Ok(Response::Query(QueryResponse::new(
        fields,
        futures::stream::iter(vec![Ok(row)]),
    )))
}

impl SettingsHook {
    fn show(
        &self,
        statement: &Statement,
        client: &dyn ClientInfo,
    ) -> Option<PgWireResult<Response>> {
        let Statement::ShowVariable { variable } = statement else {
            return None;
        };
        let name = variable
            .iter()
            .map(|v| v.value.to_ascii_lowercase())
            .collect::<Vec<_>>()
            .join(" ");
        if name == "all" {
            return None;
        }
        // `SHOW skippr.lsn` arrives as two parts.
        let dotted = name.replace(' ', ".");
        let name = if dotted.starts_with("skippr.") {
            dotted
        } else {
            name
        };
        if name == fence::SHOW_LSN {
            let lsn = fence::visible_text(&self.views, None).unwrap_or_default();
            return Some(show_response(fence::SHOW_LSN, &lsn));
        }
        let label = match name.as_str() {
            "time zone" | "timezone" => "TimeZone".to_string(),
            other => other.to_string(),
        };
        Some(match setting(client.metadata(), &name, &self.workspace) {
            Some(v) => show_response(&label, &v),
            None => Err(unknown(&name)),
        })
    }

    /// Answers `SET name = value` of the settings the classifier allows (recorded in the
    /// connection's metadata, where SHOW, current_setting() and the encoders read them) and
    /// `RESET`. A setting that drivers track is reported back with ParameterStatus, as
    /// Postgres does. No SET ever reaches the query engine.
    async fn record(
        &self,
        statement: &Statement,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        match statement {
            Statement::Set(Set::SingleAssignment {
                variable, values, ..
            }) => {
                let name = variable.to_string().trim_matches('"').to_ascii_lowercase();
                let text = values.first()?.to_string();
                let text = text.trim_matches('\'').trim_matches('"').to_string();
                if text.eq_ignore_ascii_case("default") {
                    self.reset(&name, client);
                    return Some(Ok(Response::Execution(Tag::new("SET"))));
                }
                Some(self.assign(&name, text, client).await)
            }
            Statement::Reset(ResetStatement { reset }) => {
                match reset {
                    Reset::ALL => {
                        for name in SESSION_SETTINGS {
                            self.reset(name, client);
                        }
                        // Postgres resets custom settings too: back to live, unfenced.
                        for name in [AS_OF, fence::MIN_LSN] {
                            self.reset(name, client);
                        }
                    }
                    Reset::ConfigurationParameter(name) => {
                        let name = name.to_string().trim_matches('"').to_ascii_lowercase();
                        self.reset(&name, client);
                    }
                }
                Some(Ok(Response::Execution(Tag::new("RESET"))))
            }
            _ => None,
        }
    }

    fn reset(&self, name: &str, client: &mut dyn HookClient) {
        if name == "statement_timeout" {
            client.metadata_mut().insert(
                STATEMENT_TIMEOUT_KEY.to_string(),
                self.default_timeout_ms.to_string(),
            );
        } else {
            client.metadata_mut().remove(name);
        }
    }

    async fn assign(
        &self,
        name: &str,
        text: String,
        client: &mut dyn HookClient,
    ) -> PgWireResult<Response> {
        let invalid = |label: &str, text: &str| {
            Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".to_string(),
                sqlstate::INVALID_PARAMETER_VALUE.to_string(),
                format!("invalid value for parameter \"{label}\": \"{text}\""),
            ))))
        };
        if name == "statement_timeout" {
            let Some(d) = crate::config::parse_pg_duration(&text) else {
                return invalid("statement_timeout", &text);
            };
            client
                .metadata_mut()
                .insert(STATEMENT_TIMEOUT_KEY.to_string(), d.as_millis().to_string());
            return Ok(Response::Execution(Tag::new("SET")));
        }
        let name = if name == "time zone" {
            "timezone"
        } else {
            name
        };
        if name == "timezone" && text.parse::<chrono_tz::Tz>().is_err() {
            return invalid("TimeZone", &text);
        }
        if !fence::valid_setting(name, &text) {
            if name == AS_OF {
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "ERROR".to_string(),
                    sqlstate::INVALID_PARAMETER_VALUE.to_string(),
                    format!(
                        "invalid value for parameter \"{AS_OF}\": \"{text}\": expected {AS_OF_FORMS}"
                    ),
                ))));
            }
            return invalid(name, &text);
        }
        client.metadata_mut().insert(name.to_string(), text.clone());
        let reported = match name {
            "timezone" => "TimeZone",
            "datestyle" => "DateStyle",
            "intervalstyle" => "IntervalStyle",
            "application_name" => "application_name",
            "extra_float_digits" => "extra_float_digits",
            "search_path" => "search_path",
            "bytea_output" => "bytea_output",
            _ => return Ok(Response::Execution(Tag::new("SET"))),
        };
        let status =
            PgWireBackendMessage::ParameterStatus(ParameterStatus::new(reported.to_string(), text));
        client
            .send_message(status)
            .await
            .map(|_| Response::Execution(Tag::new("SET")))
    }
}

#[async_trait]
impl Answer for SettingsHook {
    async fn answer(
        &self,
        statement: &Statement,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        if let Some(done) = self.record(statement, client).await {
            return Some(done);
        }
        self.show(statement, &*client)
    }

    fn describe(&self, statement: &Statement) -> Option<PgWireResult<LogicalPlan>> {
        if !matches!(statement, Statement::ShowVariable { .. }) {
            return None;
        }
        let schema = arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "setting",
            DataType::Utf8,
            false,
        )]);
        Some(placeholder_plan(schema, true))
    }
}
