//! Gateway, one LSN per statement and read-your-writes: `skippr.visible_lsn()` (the source
//! LSN the last statement saw), the `skippr.min_lsn` fence a session sets, and
//! `SELECT skippr.wait_lsn(lsn, timeout)`, which waits until the pipelines show `lsn`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray, StringArray};
use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, Expr, LogicalPlan, ScalarUDF, Volatility};
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response};
use pgwire::api::Type;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};

use super::udf;
use crate::change::Lsn;
use crate::error::sqlstate;
use crate::query::as_of::{as_of_of, AsOf, AS_OF};
use crate::query::view::{Fence, ViewHandle, LSN_WAIT_MESSAGE};
use crate::query::Workspace;

/// The setting that fences every statement of a session: `SET skippr.min_lsn = '0/16B3748'`.
pub const MIN_LSN: &str = "skippr.min_lsn";
/// How long a `skippr.min_lsn` fence waits: `SET skippr.wait_timeout = '2s'`.
pub const WAIT_TIMEOUT: &str = "skippr.wait_timeout";
/// `SHOW skippr.lsn`: what `skippr.visible_lsn()` returns.
pub const SHOW_LSN: &str = "skippr.lsn";
/// The fence's wait when `skippr.wait_timeout` is not set.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

// The engine resolves a qualified function name by its last part: `skippr.wait_lsn(...)`
// calls the function registered as `wait_lsn`.
const VISIBLE: &str = "visible_lsn";
const WAIT: &str = "wait_lsn";

/// The session's fence, from its settings: none unless `skippr.min_lsn` is set, or
/// `skippr.as_of` names an LSN (which the statement waits for, as for `skippr.min_lsn`,
/// when the pipeline has not reached it yet; it then answers at that LSN).
pub fn fence_of(meta: &HashMap<String, String>) -> Option<Fence> {
    let min_lsn = meta.get(MIN_LSN).and_then(|m| Lsn::parse(m.trim()).ok());
    let as_of = match as_of_of(meta) {
        Some(AsOf::Lsn(l)) => Some(l),
        _ => None,
    };
    let min_lsn = min_lsn.max(as_of)?;
    let timeout = meta
        .get(WAIT_TIMEOUT)
        .and_then(|t| crate::config::parse_pg_duration(t))
        .unwrap_or(DEFAULT_WAIT);
    Some(Fence { min_lsn, timeout })
}

/// Whether `value` is a valid value of setting `name` (the LSN and timeout settings).
pub fn valid_setting(name: &str, value: &str) -> bool {
    match name {
        MIN_LSN => Lsn::parse(value.trim()).is_ok(),
        AS_OF => AsOf::parse(value).is_some(),
        WAIT_TIMEOUT => crate::config::parse_pg_duration(value).is_some(),
        _ => true,
    }
}

/// The visible LSN as `SHOW skippr.lsn` and `skippr.visible_lsn()` report it: the one
/// pipeline's, or `pipeline`'s; none before a statement read a table.
pub fn visible_text(views: &ViewHandle, pipeline: Option<&str>) -> Option<String> {
    let visible = views.visible();
    let lsn = match pipeline {
        Some(p) => visible.get(p).copied(),
        // Several pipelines read by one statement: their LSNs are of different sources
        // (or of one source at different points); the lowest is the one all of them reached.
        None => visible.values().copied().min(),
    };
    lsn.map(|l| l.to_string())
}

/// `skippr.visible_lsn([pipeline])` and the placeholder of `skippr.wait_lsn` (which runs as
/// a statement of its own, see [`wait_call`]).
pub fn udfs(views: Arc<ViewHandle>) -> Vec<ScalarUDF> {
    let visible = udf::with_volatility(VISIBLE, DataType::Utf8, Volatility::Volatile, {
        move |args| {
            let pipeline = match args.args.first() {
                Some(ColumnarValue::Scalar(s)) if !s.is_null() => Some(s.to_string()),
                Some(ColumnarValue::Array(a)) => {
                    let a = udf::text(a)?;
                    let a = a.as_string::<i32>();
                    (a.len() > 0 && !a.is_null(0)).then(|| a.value(0).to_string())
                }
                _ => None,
            };
            let value = visible_text(&views, pipeline.as_deref());
            Ok(ColumnarValue::Array(Arc::new(StringArray::from(vec![
                value;
                args.number_rows.max(1)
            ]))))
        }
    });
    let wait = udf::with_volatility(WAIT, DataType::Utf8, Volatility::Volatile, |_| {
        Err(DataFusionError::Plan(format!(
            "skippr.{WAIT}(lsn, timeout) runs only as a statement of its own: SELECT skippr.{WAIT}('0/16B3748', '5s')"
        )))
    });
    vec![visible, wait]
}

/// A `SELECT skippr.wait_lsn(lsn [, timeout])` statement: the LSN to wait for (none: ask
/// the source) and how long.
pub struct WaitCall {
    pub lsn: Option<Lsn>,
    pub timeout: Duration,
}

/// The wait a plan asks for, when it is exactly `SELECT skippr.wait_lsn(...)`.
pub fn wait_call(plan: &LogicalPlan) -> Option<PgWireResult<WaitCall>> {
    let LogicalPlan::Projection(p) = plan else {
        return None;
    };
    if !matches!(p.input.as_ref(), LogicalPlan::EmptyRelation(_)) || p.expr.len() != 1 {
        return None;
    }
    let mut expr = &p.expr[0];
    if let Expr::Alias(a) = expr {
        expr = &a.expr;
    }
    let Expr::ScalarFunction(f) = expr else {
        return None;
    };
    if f.func.name() != WAIT {
        return None;
    }
    Some(parse_call(&f.args))
}

fn literal_text(e: &Expr) -> PgWireResult<Option<String>> {
    let e = match e {
        Expr::Cast(c) => c.expr.as_ref(),
        Expr::TryCast(c) => c.expr.as_ref(),
        e => e,
    };
    match e {
        Expr::Literal(v, _) if v.is_null() => Ok(None),
        Expr::Literal(ScalarValue::Utf8(Some(s)), _)
        | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _)
        | Expr::Literal(ScalarValue::Utf8View(Some(s)), _) => Ok(Some(s.clone())),
        Expr::Literal(v, _) => Ok(Some(v.to_string())),
        _ => Err(invalid(&format!(
            "the arguments of skippr.{WAIT} must be constants"
        ))),
    }
}

fn invalid(message: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        sqlstate::INVALID_PARAMETER_VALUE.to_string(),
        message.to_string(),
    )))
}

fn parse_call(args: &[Expr]) -> PgWireResult<WaitCall> {
    if args.is_empty() || args.len() > 2 {
        return Err(invalid(&format!(
            "skippr.{WAIT} takes an LSN (NULL: the source's current one) and a timeout"
        )));
    }
    let lsn = match literal_text(&args[0])? {
        None => None,
        Some(t) => Some(
            Lsn::parse(t.trim())
                .map_err(|e| invalid(&format!("invalid LSN \"{t}\" for skippr.{WAIT}: {e}")))?,
        ),
    };
    let timeout = match args.get(1).map(literal_text).transpose()?.flatten() {
        None => DEFAULT_WAIT,
        Some(t) => crate::config::parse_pg_duration(&t)
            .ok_or_else(|| invalid(&format!("invalid timeout \"{t}\" for skippr.{WAIT}")))?,
    };
    Ok(WaitCall { lsn, timeout })
}

/// The error a client sees when a fence timed out: 57014, as a statement timeout.
pub fn canceled(message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        super::super::limits::QUERY_CANCELED.to_string(),
        message,
    )))
}

/// Runs a wait: every pipeline of the workspace must show the LSN (with none given, the
/// LSN its source reports now, `pg_current_wal_insert_lsn()`). Answers the lowest LSN
/// reached, as text; the next statements see at least that much.
pub async fn wait(ws: &Workspace, call: WaitCall) -> PgWireResult<Response> {
    let mut reached: Option<Lsn> = None;
    for (pipeline, position) in ws.pipeline_positions() {
        let min_lsn = match call.lsn {
            Some(l) => l,
            None => position
                .current()
                .await
                .map_err(super::super::errors::api_error)?,
        };
        let fence = Fence {
            min_lsn,
            timeout: call.timeout,
        };
        let view = ws
            .pipeline_view(&pipeline, Some(fence), None)
            .await
            .map_err(|e| {
                if e.message().starts_with(LSN_WAIT_MESSAGE) {
                    canceled(e.message().to_string())
                } else {
                    super::super::errors::api_error(e)
                }
            })?;
        reached = Some(reached.map_or(view.lsn, |r| r.min(view.lsn)));
    }
    let fields = Arc::new(vec![FieldInfo::new(
        "wait_lsn".to_string(),
        None,
        None,
        Type::TEXT,
        FieldFormat::Text,
    )]);
    let mut encoder = DataRowEncoder::new(fields.clone());
    encoder.encode_field(&reached.map(|l| l.to_string()))?;
    let row = encoder.take_row();
    Ok(Response::Query(QueryResponse::new(
        fields,
        futures::stream::iter(vec![Ok(row)]),
    )))
}
