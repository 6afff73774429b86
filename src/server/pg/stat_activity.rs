//! Gateway, Postgres imitation, activity: `pg_stat_activity`, built from the gateway's
//! sessions each time it is scanned ([`crate::server::activity`]), and the functions that
//! reach a session by its process id: `pg_backend_pid()`, `pg_cancel_backend(pid)` and
//! `pg_terminate_backend(pid [, timeout])`, evaluated by the query engine as a statement runs.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arrow::array::{
    Array, ArrayRef, BooleanBuilder, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::ScalarValue;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{ColumnarValue, Expr, ScalarUDF, Volatility};
use datafusion::physical_plan::ExecutionPlan;
use pgwire::error::ErrorInfo;

use super::catalog_types::Typed;
use super::udf;
use crate::error::sqlstate;
use crate::server::activity::{Activity, Backend, Backends, Signal, QUEUE_WAIT};
use crate::server::errors::PgError;

/// The relation's name in `pg_catalog`.
pub const NAME: &str = "pg_stat_activity";

/// What `backend_type` says of every session: each is a client's.
const BACKEND_TYPE: &str = "client backend";

/// What `query` shows of a session the reader may not see the details of (as Postgres).
const HIDDEN: &str = "<insufficient privilege>";

/// `pg_stat_activity` over `backends` as session `viewer` sees it (`None`: the server, which
/// sees everything), its columns typed as Postgres types them.
pub fn table(backends: Arc<Backends>, viewer: Option<Arc<Backend>>) -> Arc<dyn TableProvider> {
    Typed::wrap(
        "pg_catalog",
        NAME,
        Arc::new(StatActivity { backends, viewer }),
    )
}

/// The sessions of the gateway, one row each, read when scanned.
struct StatActivity {
    backends: Arc<Backends>,
    viewer: Option<Arc<Backend>>,
}

impl std::fmt::Debug for StatActivity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StatActivity")
    }
}

fn timestamptz() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
}

/// Postgres's columns, in its order (the Postgres types are added by [`Typed`]).
fn schema() -> SchemaRef {
    let text = |name: &str| Field::new(name, DataType::Utf8, true);
    let int = |name: &str| Field::new(name, DataType::Int32, true);
    let time = |name: &str| Field::new(name, timestamptz(), true);
    Arc::new(Schema::new(vec![
        int("datid"),
        text("datname"),
        int("pid"),
        int("leader_pid"),
        int("usesysid"),
        text("usename"),
        text("application_name"),
        text("client_addr"),
        text("client_hostname"),
        int("client_port"),
        time("backend_start"),
        time("xact_start"),
        time("query_start"),
        time("state_change"),
        text("wait_event_type"),
        text("wait_event"),
        text("state"),
        text("backend_xid"),
        text("backend_xmin"),
        Field::new("query_id", DataType::Int64, true),
        text("query"),
        text("backend_type"),
    ]))
}

fn micros(t: SystemTime) -> Option<i64> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_micros()).ok())
}

/// The rows of `sessions`. Of a session the reader may not see, only who it is (database,
/// pid, user, application) and [`HIDDEN`] as its query, the rest NULL, as Postgres shows it.
fn batch(sessions: &[Activity]) -> DfResult<RecordBatch> {
    let schema = schema();
    let nulls = |t: &DataType| arrow::array::new_null_array(t, sessions.len());
    let texts = |f: &dyn Fn(&Activity) -> Option<String>| -> ArrayRef {
        Arc::new(sessions.iter().map(f).collect::<StringArray>())
    };
    let ints = |f: &dyn Fn(&Activity) -> Option<i32>| -> ArrayRef {
        Arc::new(sessions.iter().map(f).collect::<Int32Array>())
    };
    let times = |f: &dyn Fn(&Activity) -> Option<SystemTime>| -> ArrayRef {
        Arc::new(
            sessions
                .iter()
                .map(|a| f(a).and_then(micros))
                .collect::<TimestampMicrosecondArray>()
                .with_timezone("+00:00"),
        )
    };
    let queued =
        |a: &Activity, what: &'static str| (a.visible && a.queued).then(|| what.to_string());
    let columns: Vec<ArrayRef> = vec![
        nulls(&DataType::Int32),
        texts(&|a| Some(a.database.clone())),
        ints(&|a| Some(a.pid)),
        nulls(&DataType::Int32),
        nulls(&DataType::Int32),
        texts(&|a| Some(a.user.clone())),
        texts(&|a| Some(a.application_name.clone())),
        texts(&|a| a.client.filter(|_| a.visible).map(|c| c.ip().to_string())),
        nulls(&DataType::Utf8),
        ints(&|a| a.client.filter(|_| a.visible).map(|c| i32::from(c.port()))),
        times(&|a| a.visible.then_some(a.backend_start)),
        times(&|a| a.xact_start.filter(|_| a.visible)),
        times(&|a| a.query_start.filter(|_| a.visible)),
        times(&|a| a.state_change.filter(|_| a.visible)),
        texts(&|a| queued(a, QUEUE_WAIT.0)),
        texts(&|a| queued(a, QUEUE_WAIT.1)),
        texts(&|a| a.visible.then(|| a.state.to_string())),
        nulls(&DataType::Utf8),
        nulls(&DataType::Utf8),
        Arc::new(Int64Array::new_null(sessions.len())),
        texts(&|a| {
            Some(if a.visible {
                a.query.clone()
            } else {
                HIDDEN.to_string()
            })
        }),
        texts(&|a| a.visible.then(|| BACKEND_TYPE.to_string())),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

#[async_trait]
impl TableProvider for StatActivity {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let rows = batch(&self.backends.snapshot(self.viewer.as_deref()))?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![rows]],
            schema(),
            projection.cloned(),
        )?)
    }
}

/// The functions of one session (`caller`) that name sessions by process id.
pub fn udfs(caller: Arc<Backend>) -> Vec<ScalarUDF> {
    let me = caller.clone();
    vec![
        udf::function("pg_backend_pid", DataType::Int32, move |_| {
            Ok(ColumnarValue::Scalar(ScalarValue::Int32(me.pid())))
        }),
        signal_function("pg_cancel_backend", Signal::Cancel, caller.clone()),
        signal_function("pg_terminate_backend", Signal::Terminate, caller),
    ]
}

/// `pg_cancel_backend(pid)` or `pg_terminate_backend(pid [, timeout])`: true once the
/// signal is sent (and, with a timeout in ms, once the session is gone), false with a WARNING
/// when no session has that pid; 42501 when the caller may not signal it.
fn signal_function(name: &'static str, signal: Signal, caller: Arc<Backend>) -> ScalarUDF {
    udf::with_volatility(name, DataType::Boolean, Volatility::Volatile, move |args| {
        let pids = udf::int_arg(args, 0, name)?;
        let timeouts = match (signal, args.args.len()) {
            (_, 1) => None,
            (Signal::Terminate, 2) => Some(udf::int_arg(args, 1, name)?),
            (_, n) => {
                return Err(DataFusionError::Plan(format!(
                    "function {name}() does not take {n} arguments"
                )))
            }
        };
        let mut out = BooleanBuilder::with_capacity(pids.len());
        for i in 0..pids.len() {
            let timeout = match &timeouts {
                Some(t) if t.is_null(i) => None,
                Some(t) => Some(t.value(i)),
                None => Some(0),
            };
            let (Some(timeout), false) = (timeout, pids.is_null(i)) else {
                // A strict function: NULL in, NULL out.
                out.append_null();
                continue;
            };
            if timeout < 0 {
                return Err(PgError {
                    code: sqlstate::INVALID_PARAMETER_VALUE,
                    message: "\"timeout\" must not be negative".to_string(),
                    detail: None,
                }
                .into());
            }
            let pid = pids.value(i);
            let answer = match caller.backends().signal(&caller, pid, signal)? {
                None => false,
                Some(target) if timeout > 0 && target.pid() != caller.pid() => {
                    drop(target);
                    let gone = i32::try_from(pid).is_ok_and(|p| {
                        caller
                            .backends()
                            .wait_gone(p, Duration::from_millis(timeout as u64))
                    });
                    if !gone {
                        caller.notice(ErrorInfo::new(
                            "WARNING".to_string(),
                            sqlstate::WARNING.to_string(),
                            format!(
                                "backend with PID {pid} did not terminate within {timeout} milliseconds"
                            ),
                        ));
                    }
                    gone
                }
                Some(_) => true,
            };
            out.append_value(answer);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    use crate::server::limits::Interrupts;

    #[tokio::test]
    async fn the_table_lists_the_sessions_as_they_are_when_scanned() -> DfResult<()> {
        let backends = Backends::new(HashSet::new(), true, None);
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table("pg_stat_activity", table(backends.clone(), None))?;
        async fn count(ctx: &datafusion::prelude::SessionContext) -> DfResult<usize> {
            let sql = "SELECT pid, state, query, wait_event_type, usename FROM pg_stat_activity";
            let batches = ctx.sql(sql).await?.collect().await?;
            Ok(batches.iter().map(|b| b.num_rows()).sum())
        }
        assert_eq!(count(&ctx).await?, 0);
        let b = Backend::new(backends.clone(), Arc::new(Interrupts::default()));
        let meta = HashMap::from([("user".to_string(), "ann".to_string())]);
        let client = "127.0.0.1:5555".parse().ok();
        let _r = b.register(100_000, &meta, client);
        let _s = b.begin("SELECT 42", &meta);
        assert_eq!(count(&ctx).await?, 1, "a session registered later shows");
        let batches = ctx
            .sql("SELECT pid, state, query, client_port, client_addr FROM pg_stat_activity")
            .await?
            .collect()
            .await?;
        let text = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        for want in ["100000", "active", "SELECT 42", "5555", "127.0.0.1"] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        let typed = table(backends, None).schema();
        let pg = |c: &str| {
            typed
                .field_with_name(c)
                .ok()
                .and_then(|f| super::super::catalog_types::field_pg_type(f).map(str::to_string))
        };
        assert_eq!(pg("datid").as_deref(), Some("oid"));
        assert_eq!(pg("client_addr").as_deref(), Some("inet"));
        assert_eq!(
            pg("query_start").as_deref(),
            Some("timestamp with time zone")
        );
        Ok(())
    }

    #[tokio::test]
    async fn another_users_session_shows_only_who_it_is() -> DfResult<()> {
        let backends = Backends::new(HashSet::new(), false, None);
        let meta = |u: &str| HashMap::from([("user".to_string(), u.to_string())]);
        let ann = Backend::new(backends.clone(), Arc::new(Interrupts::default()));
        let _a = ann.register(1, &meta("ann"), "127.0.0.1:5555".parse().ok());
        let _s = ann.begin("SELECT secret", &meta("ann"));
        let bob = Backend::new(backends.clone(), Arc::new(Interrupts::default()));
        let _b = bob.register(2, &meta("bob"), None);
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table("pg_stat_activity", table(backends, Some(bob.clone())))?;
        let sql = "SELECT pid, usename, state, query, client_port, backend_type \
                   FROM pg_stat_activity ORDER BY pid";
        let batches = ctx.sql(sql).await?.collect().await?;
        let text = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        assert!(text.contains(HIDDEN), "{text}");
        assert!(
            !text.contains("SELECT secret") && !text.contains("5555"),
            "{text}"
        );
        assert!(text.contains("ann") && text.contains("idle"), "{text}");
        assert_eq!(text.matches(BACKEND_TYPE).count(), 1, "{text}");
        Ok(())
    }
}
