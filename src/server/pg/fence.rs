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
use crate::pipeline::position::SourcePosition;
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
    let reached = wait_until(
        ws.pipeline_positions(),
        &call,
        |pipeline, fence| async move {
            ws.pipeline_view(&pipeline, Some(fence), None)
                .await
                .map(|view| view.lsn)
        },
    )
    .await
    .map_err(|e| {
        if e.message().starts_with(LSN_WAIT_MESSAGE) {
            canceled(e.message().to_string())
        } else {
            super::super::errors::api_error(e)
        }
    })?;
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

/// The fence of a wait, pipeline by pipeline: each pipeline's source is asked where it is
/// (unless the call names the LSN), and `view_at` waits until that pipeline's tables show
/// it, answering the LSN they show. The lowest of those is what every pipeline reached;
/// none without pipelines.
async fn wait_until<F, Fut>(
    positions: Vec<(String, Arc<dyn SourcePosition>)>,
    call: &WaitCall,
    view_at: F,
) -> crate::error::Result<Option<Lsn>>
where
    F: Fn(String, Fence) -> Fut,
    Fut: std::future::Future<Output = crate::error::Result<Lsn>>,
{
    let mut reached: Option<Lsn> = None;
    for (pipeline, position) in positions {
        let min_lsn = match call.lsn {
            Some(l) => l,
            None => position.current().await?,
        };
        let fence = Fence {
            min_lsn,
            timeout: call.timeout,
        };
        let shown = view_at(pipeline, fence).await?;
        reached = Some(reached.map_or(shown, |r| r.min(shown)));
    }
    Ok(reached)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::error::Error;

    /// A source double: answers a fixed position, or fails as an unreachable source does,
    /// and counts how often it was asked.
    struct Source {
        at: Option<Lsn>,
        asked: Mutex<usize>,
    }

    #[async_trait]
    impl SourcePosition for Source {
        async fn current(&self) -> crate::error::Result<Lsn> {
            *self.asked.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            self.at
                .ok_or_else(|| Error::query("the source cannot be reached".to_string()))
        }
    }

    fn source(at: Option<u64>) -> Arc<Source> {
        Arc::new(Source {
            at: at.map(Lsn),
            asked: Mutex::new(0),
        })
    }

    fn positions(sources: &[(&str, &Arc<Source>)]) -> Vec<(String, Arc<dyn SourcePosition>)> {
        sources
            .iter()
            .map(|(n, s)| (n.to_string(), Arc::clone(*s) as Arc<dyn SourcePosition>))
            .collect()
    }

    fn call(lsn: Option<u64>) -> WaitCall {
        WaitCall {
            lsn: lsn.map(Lsn),
            timeout: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn the_fence_is_where_each_source_is_when_asked() {
        let (a, b) = (source(Some(100)), source(Some(250)));
        let fences = Mutex::new(Vec::new());
        // Each pipeline's tables show a little more than asked for.
        let reached = wait_until(positions(&[("a", &a), ("b", &b)]), &call(None), |p, f| {
            fences
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((p, f.min_lsn));
            async move { Ok(Lsn(f.min_lsn.0 + 5)) }
        })
        .await;
        assert_eq!(reached.ok(), Some(Some(Lsn(105))));
        assert_eq!(
            fences.into_inner().unwrap_or_default(),
            vec![("a".to_string(), Lsn(100)), ("b".to_string(), Lsn(250))]
        );
        assert_eq!(*a.asked.lock().unwrap_or_else(|e| e.into_inner()), 1);
    }

    #[tokio::test]
    async fn a_named_lsn_is_not_asked_of_the_source() {
        let a = source(None);
        let reached = wait_until(
            positions(&[("a", &a)]),
            &call(Some(42)),
            |_, f| async move { Ok(f.min_lsn) },
        )
        .await;
        assert_eq!(reached.ok(), Some(Some(Lsn(42))));
        assert_eq!(*a.asked.lock().unwrap_or_else(|e| e.into_inner()), 0);
    }

    #[tokio::test]
    async fn a_source_that_cannot_answer_fails_the_wait() {
        let (a, b) = (source(Some(7)), source(None));
        let viewed = Mutex::new(0);
        let reached = wait_until(positions(&[("a", &a), ("b", &b)]), &call(None), |_, f| {
            *viewed.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            async move { Ok(f.min_lsn) }
        })
        .await;
        let Err(e) = reached else {
            panic!("a wait without the source's position must fail, not guess");
        };
        assert!(e.message().contains("cannot be reached"), "{e}");
        assert_eq!(viewed.into_inner().unwrap_or_default(), 1);
    }

    #[tokio::test]
    async fn a_view_that_times_out_fails_the_wait() {
        let a = source(Some(9));
        let reached = wait_until(positions(&[("a", &a)]), &call(None), |_, _| async move {
            Err(Error::query(format!("{LSN_WAIT_MESSAGE} 0/9")))
        })
        .await;
        assert!(matches!(reached, Err(e) if e.message().starts_with(LSN_WAIT_MESSAGE)));
        assert_eq!(
            wait_until(Vec::new(), &call(None), |_, f| async move { Ok(f.min_lsn) })
                .await
                .ok(),
            Some(None)
        );
    }
}
