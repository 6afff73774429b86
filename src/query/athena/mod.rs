//! Athena, the query engine for history beyond one machine: `skipprd query --engine athena`
//! sends the statement to Athena (the workgroup and results bucket of the `AthenaIceberg`
//! sink, its Glue database as the default schema), polls it to completion and hands the
//! rows to the same printer as the local engine. `discover` uses the same client for its
//! `SELECT 1` check (see [`checks`]).

pub mod checks;
mod progress;
mod results;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use serde_json::{json, Value};

use crate::config::{AthenaIcebergSink, Config, SinkConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::query::format::OutputFormat;
use crate::storage::aws;
use crate::storage::aws_json::{AwsError, AwsJsonApi, AwsJsonClient};

pub use progress::{human_bytes, Progress};
pub use results::arrow_type;

/// The IAM actions `skipprd query --engine athena` needs (plus S3 on the results bucket).
pub const IAM_ACTIONS: &str = "athena:StartQueryExecution, athena:GetQueryExecution, athena:GetQueryResults, athena:StopQueryExecution";

/// The first pause between two status polls; it doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(200);
/// The longest pause between two status polls: a finished query is noticed within it.
const POLL_MAX: Duration = Duration::from_secs(2);
/// Attempts of one API call that meets throttling or no answer, before giving up.
const CALL_ATTEMPTS: u32 = 5;
/// Rows asked for per `GetQueryResults` page (Athena's maximum).
const PAGE_ROWS: u32 = 1000;

/// Where and how Athena runs a sink's queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AthenaTarget {
    /// The sink's name, to point at the config keys in messages.
    pub sink: String,
    pub workgroup: String,
    /// `s3://bucket/prefix/` where Athena writes result files.
    pub output_location: String,
    /// The Glue database, the default schema of unqualified table names.
    pub database: String,
    pub region: String,
}

impl AthenaTarget {
    pub fn from_sink(name: &str, sink: &AthenaIcebergSink) -> Self {
        let bucket = sink.athena_results_s3_bucket.trim();
        let output_location = if bucket.starts_with("s3://") {
            format!("{}/", bucket.trim_end_matches('/'))
        } else {
            format!("s3://{}/", bucket.trim_matches('/'))
        };
        Self {
            sink: name.to_string(),
            workgroup: sink.athena_workgroup_name.clone(),
            output_location,
            database: sink.glue_database_name.clone(),
            region: aws::region(Some(sink.region.as_str())),
        }
    }

    /// The Athena settings of the configuration: those of `pipeline`'s sink, or of the one
    /// `AthenaIceberg` sink when no pipeline is named.
    pub fn pick(config: &Config, pipeline: Option<&str>) -> Result<Self> {
        let candidates: Vec<(&str, AthenaTarget)> = match pipeline {
            Some(name) => vec![(name, config.pipeline(name)?)],
            None => config
                .pipelines
                .iter()
                .map(|p| (p.name.as_str(), p))
                .collect(),
        }
        .into_iter()
        .filter_map(|(pname, p)| match &p.sink {
            SinkConfig::AthenaIceberg { name, sink } => Some((pname, Self::from_sink(name, sink))),
            SinkConfig::LocalIceberg { .. } | SinkConfig::RestIceberg { .. } => None,
        })
        .collect();
        // Sinks with the same Athena settings are one engine, whatever their names.
        let same = |a: &AthenaTarget, b: &AthenaTarget| {
            (&a.workgroup, &a.output_location, &a.database, &a.region)
                == (&b.workgroup, &b.output_location, &b.database, &b.region)
        };
        let mut distinct: Vec<&(&str, AthenaTarget)> = Vec::new();
        for c in &candidates {
            if !distinct.iter().any(|d| same(&d.1, &c.1)) {
                distinct.push(c);
            }
        }
        match distinct.as_slice() {
            [] => Err(Error::config(match pipeline {
                Some(name) => format!(
                    "--engine athena needs an AthenaIceberg data sink, and pipeline `{name}` writes to a LocalIceberg sink; query it with the local engine (leave out --engine)"
                ),
                None => format!(
                    "--engine athena needs an AthenaIceberg data sink, and {} has none; query the local tables without --engine, or add one with `skipprd connect data-sink athenaiceberg`",
                    config.file.display()
                ),
            })),
            [one] => Ok(one.1.clone()),
            many => Err(Error::config(format!(
                "--engine athena: pipelines write to {} different AthenaIceberg sinks; choose one with --pipeline ({})",
                many.len(),
                many.iter().map(|c| c.0).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    fn config_key(&self, field: &str) -> String {
        format!("data_sinks.{}.AthenaIceberg.{field}", self.sink)
    }
}

/// Why an Athena step failed, split the way both callers need it: `query` prints one
/// message, `discover` shows the detail and the fix on separate lines.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: ErrorKind,
    pub detail: String,
    pub fix: String,
}

impl Failure {
    fn new(kind: ErrorKind, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Self {
        Error::new(f.kind, format!("{}; {}", f.detail, f.fix))
    }
}

/// Athena's lifecycle of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl State {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "QUEUED" => Self::Queued,
            "RUNNING" => Self::Running,
            "SUCCEEDED" => Self::Succeeded,
            "FAILED" => Self::Failed,
            "CANCELLED" => Self::Cancelled,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// What `GetQueryExecution` said about a query.
#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    /// Athena's `StateChangeReason` (why it failed or was cancelled).
    pub reason: Option<String>,
    /// `AthenaError.ErrorMessage` when it differs from the reason.
    pub error_message: Option<String>,
    pub scanned_bytes: u64,
    /// `DML` for a SELECT (its first result row repeats the column names), `DDL`, `UTILITY`.
    pub statement_type: Option<String>,
}

impl Status {
    fn parse(v: &Value) -> std::result::Result<Self, String> {
        let q = &v["QueryExecution"];
        let state_text = q["Status"]["State"].as_str().unwrap_or_default();
        let state = State::parse(state_text)
            .ok_or_else(|| format!("Athena reported an unknown query state `{state_text}`"))?;
        let text = |v: &Value| v.as_str().map(str::to_string).filter(|s| !s.is_empty());
        let reason = text(&q["Status"]["StateChangeReason"]);
        let error_message = text(&q["Status"]["AthenaError"]["ErrorMessage"])
            .filter(|m| Some(m) != reason.as_ref());
        Ok(Self {
            state,
            reason,
            error_message,
            scanned_bytes: q["Statistics"]["DataScannedInBytes"].as_u64().unwrap_or(0),
            statement_type: text(&q["StatementType"]),
        })
    }

    /// Athena's explanation, or `fallback`.
    fn why(&self, fallback: &str) -> String {
        match (&self.reason, &self.error_message) {
            (Some(r), Some(m)) => format!("{r} ({m})"),
            (Some(r), None) | (None, Some(r)) => r.clone(),
            (None, None) => fallback.to_string(),
        }
    }
}

/// Why a running query is stopped: what happened, and what to do next.
#[derive(Debug, Clone)]
pub struct Interrupt {
    pub what: String,
    pub fix: String,
}

/// Rows of a finished query, typed from Athena's column metadata.
#[derive(Debug, Clone)]
pub struct QueryOutput {
    pub id: String,
    pub status: Status,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// An Athena client bound to one sink's workgroup, results location and database.
#[derive(Debug, Clone)]
pub struct Athena {
    api: Arc<dyn AwsJsonApi>,
    target: AthenaTarget,
    /// Where requests go, for messages.
    endpoint: String,
    /// The first pause between polls (and retries); it doubles up to `pause_max`.
    pause_first: Duration,
    pause_max: Duration,
}

/// The pause after `pause`: twice as long, at most `max`.
pub fn next_pause(pause: Duration, max: Duration) -> Duration {
    (pause * 2).min(max)
}

impl Athena {
    /// Athena in the sink's region (or at `AWS_ENDPOINT_URL_ATHENA` / `AWS_ENDPOINT_URL`),
    /// with the standard AWS credential chain. Nothing is contacted yet.
    pub fn connect(target: AthenaTarget) -> Result<Self> {
        let bucket = target
            .output_location
            .trim_start_matches("s3://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let s3 = Arc::new(aws::s3_store(&bucket, Some(&target.region))?);
        let client = AwsJsonClient::new("athena", "AmazonAthena", &target.region, s3)?;
        let endpoint = client.endpoint().to_string();
        Ok(Self::with_api(Arc::new(client), target, endpoint))
    }

    /// A client over any implementation of the API (the tests' in-process double).
    pub fn with_api(api: Arc<dyn AwsJsonApi>, target: AthenaTarget, endpoint: String) -> Self {
        Self {
            api,
            target,
            endpoint,
            pause_first: POLL_FIRST,
            pause_max: POLL_MAX,
        }
    }

    /// Other pauses between polls (tests keep them short).
    pub fn with_pauses(mut self, first: Duration, max: Duration) -> Self {
        self.pause_first = first;
        self.pause_max = max;
        self
    }

    pub fn target(&self) -> &AthenaTarget {
        &self.target
    }

    /// One call, repeated with a growing pause while the answer is throttling or missing.
    async fn call(&self, operation: &str, input: Value) -> std::result::Result<Value, AwsError> {
        let mut pause = self.pause_first;
        let mut attempt = 1;
        loop {
            match self.api.call(operation, input.clone()).await {
                Err(e) if e.is_transient() && attempt < CALL_ATTEMPTS => {
                    tracing::debug!(operation, attempt, code = %e.code, "Athena call failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = next_pause(pause, self.pause_max);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// What went wrong in `operation` (which needs the IAM action `athena:<operation>`),
    /// with the fix.
    fn failure(&self, operation: &str, e: &AwsError) -> Failure {
        let t = &self.target;
        let wg = &t.workgroup;
        if e.is("AccessDeniedException") || e.message.contains("not authorized") {
            return Failure::new(
                ErrorKind::Fatal,
                format!("Athena refused {operation} in workgroup `{wg}` ({e})"),
                format!(
                    "grant the credentials in use the IAM action athena:{operation} on the workgroup (skipprd needs {IAM_ACTIONS}, and s3:GetBucketLocation, s3:GetObject, s3:PutObject, s3:ListBucket on the results location {}); see docs/config.md",
                    t.output_location
                ),
            );
        }
        if e.message.to_ascii_lowercase().contains("workgroup") {
            return Failure::new(
                ErrorKind::Config,
                format!(
                    "Athena workgroup `{wg}` cannot run queries in region {} ({e})",
                    t.region
                ),
                format!(
                    "create it (aws athena create-work-group --name {wg} --region {}), enable it, or set {} to an existing workgroup",
                    t.region,
                    t.config_key("athena_workgroup_name")
                ),
            );
        }
        if e.is("Credentials") {
            return Failure::new(
                ErrorKind::Config,
                e.message.clone(),
                "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or run with a web identity or an instance/task role".to_string(),
            );
        }
        if e.is_transient() {
            return Failure::new(
                ErrorKind::Retryable,
                format!("Athena at {} did not answer {operation} ({e})", self.endpoint),
                "check the network, AWS_REGION and AWS_ENDPOINT_URL_ATHENA / AWS_ENDPOINT_URL, then run again".to_string(),
            );
        }
        Failure::new(
            ErrorKind::Query,
            format!("Athena refused {operation} ({e})"),
            "fix the statement or the sink's Athena settings and run again".to_string(),
        )
    }

    /// Starts `sql`; the query's id.
    pub async fn start(&self, sql: &str) -> std::result::Result<String, Failure> {
        let t = &self.target;
        // The same token on every attempt: a retried start never runs the query twice.
        let token = uuid::Uuid::new_v4().to_string();
        let input = json!({
            "QueryString": sql,
            "ClientRequestToken": token,
            "WorkGroup": t.workgroup,
            "QueryExecutionContext": { "Database": t.database },
            "ResultConfiguration": { "OutputLocation": t.output_location },
        });
        let out = self
            .call("StartQueryExecution", input)
            .await
            .map_err(|e| self.failure("StartQueryExecution", &e))?;
        out["QueryExecutionId"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| {
                Failure::new(
                    ErrorKind::Fatal,
                    "Athena started the query without returning its QueryExecutionId",
                    "run again; if it persists, check AWS_ENDPOINT_URL_ATHENA points at Athena",
                )
            })
    }

    pub async fn status(&self, id: &str) -> std::result::Result<Status, Failure> {
        let out = self
            .call("GetQueryExecution", json!({ "QueryExecutionId": id }))
            .await
            .map_err(|e| self.failure("GetQueryExecution", &e))?;
        Status::parse(&out).map_err(|m| {
            Failure::new(
                ErrorKind::Fatal,
                m,
                "check AWS_ENDPOINT_URL_ATHENA points at Athena",
            )
        })
    }

    pub async fn stop(&self, id: &str) -> std::result::Result<(), Failure> {
        self.call("StopQueryExecution", json!({ "QueryExecutionId": id }))
            .await
            .map(|_| ())
            .map_err(|e| self.failure("StopQueryExecution", &e))
    }

    /// Polls `id` until it is final, pausing 0.2 s at first and at most 2 s between polls;
    /// `progress` sees every status. A failed or cancelled query is an error naming
    /// Athena's reason.
    pub async fn wait(
        &self,
        id: &str,
        progress: &mut dyn FnMut(&str, &Status),
    ) -> std::result::Result<Status, Failure> {
        let mut pause = self.pause_first;
        loop {
            let status = self.status(id).await?;
            progress(id, &status);
            match status.state {
                State::Succeeded => return Ok(status),
                State::Failed => {
                    return Err(Failure::new(
                        ErrorKind::Query,
                        format!(
                            "Athena query {id} FAILED: {}",
                            status.why("Athena gave no reason")
                        ),
                        failed_fix(&status, &self.target),
                    ))
                }
                State::Cancelled => {
                    return Err(Failure::new(
                        ErrorKind::Query,
                        format!(
                            "Athena query {id} was CANCELLED: {}",
                            status.why("stopped outside skipprd (a user, or the workgroup's limits)")
                        ),
                        format!(
                            "run it again; a workgroup's data-scanned limit cancels queries over it (see workgroup `{}`)",
                            self.target.workgroup
                        ),
                    ))
                }
                State::Queued | State::Running => {
                    tokio::time::sleep(pause).await;
                    pause = next_pause(pause, self.pause_max);
                }
            }
        }
    }

    /// Runs `sql` to completion and reads its rows. When `cancel` completes first (Ctrl-C, a
    /// deadline), the query is stopped in Athena and the result is an error saying why.
    pub async fn run(
        &self,
        sql: &str,
        progress: &mut dyn FnMut(&str, &Status),
        cancel: impl Future<Output = Interrupt>,
    ) -> std::result::Result<QueryOutput, Failure> {
        tokio::pin!(cancel);
        let id = self.start(sql).await?;
        let done = async {
            let status = self.wait(&id, progress).await?;
            let (schema, batches) = self.results(&id, &status).await?;
            Ok(QueryOutput {
                id: id.clone(),
                status,
                schema,
                batches,
            })
        };
        tokio::select! {
            out = done => out,
            why = &mut cancel => Err(self.interrupted(&id, why).await),
        }
    }

    /// Stops `id` after an interrupt and says what happened to it.
    async fn interrupted(&self, id: &str, why: Interrupt) -> Failure {
        match self.stop(id).await {
            Ok(()) => Failure::new(
                ErrorKind::Query,
                format!(
                    "{}: Athena query {id} was stopped (StopQueryExecution)",
                    why.what
                ),
                why.fix,
            ),
            Err(f) => Failure::new(
                f.kind,
                format!(
                    "{}, and stopping Athena query {id} failed: {}",
                    why.what, f.detail
                ),
                format!(
                    "stop it with `aws athena stop-query-execution --query-execution-id {id}`; {}",
                    f.fix
                ),
            ),
        }
    }

    /// Every page of the query's rows, typed by its column metadata.
    pub async fn results(
        &self,
        id: &str,
        status: &Status,
    ) -> std::result::Result<(SchemaRef, Vec<RecordBatch>), Failure> {
        let mut pages = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut input = json!({ "QueryExecutionId": id, "MaxResults": PAGE_ROWS });
            if let Some(t) = &token {
                input["NextToken"] = Value::String(t.clone());
            }
            let page = self
                .call("GetQueryResults", input)
                .await
                .map_err(|e| self.failure("GetQueryResults", &e))?;
            token = page["NextToken"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            pages.push(page);
            if token.is_none() {
                break;
            }
        }
        let header_row = status.statement_type.as_deref() == Some("DML");
        results::to_arrow(&pages, header_row).map_err(|e| {
            Failure::new(
                ErrorKind::Fatal,
                format!(
                    "the rows of Athena query {id} could not be read: {}",
                    e.report()
                ),
                "run again; if it persists, report the query's column types",
            )
        })
    }
}

/// The fix for a FAILED query, from the kind of reason Athena gave.
fn failed_fix(status: &Status, target: &AthenaTarget) -> String {
    let why = status.why("").to_ascii_lowercase();
    if why.contains("access denied") || why.contains("not authorized") {
        format!(
            "grant the credentials in use access to the tables' bucket (s3:GetObject, s3:ListBucket), the Glue catalog (glue:GetDatabase, glue:GetTable, glue:GetTables) and the results location {} (s3:PutObject, s3:GetObject, s3:ListBucket, s3:GetBucketLocation)",
            target.output_location
        )
    } else if why.contains("does not exist") || why.contains("not found") {
        format!(
            "unqualified names resolve in the Glue database `{}`: check the table name (SHOW TABLES lists them)",
            target.database
        )
    } else {
        "fix the statement and run it again".to_string()
    }
}

/// `skipprd query --engine athena`: runs `sql` with progress on stderr; Ctrl-C or SIGTERM
/// stops the query in Athena.
pub async fn query(target: AthenaTarget, sql: &str) -> Result<QueryOutput> {
    let athena = Athena::connect(target)?;
    // Registered before the query starts, so an interrupt during the start is seen as soon
    // as the query has an id to stop.
    let cancel = interrupt()?;
    let mut progress = Progress::stderr();
    let out = athena
        .run(sql, &mut |id, s| progress.update(id, s), cancel)
        .await;
    progress.finish();
    Ok(out?)
}

/// Prints a query's rows as the local engine does. A statement without a result set (DDL)
/// prints `(0 rows)` as a table and nothing as CSV or JSON.
pub fn write_output(
    out: &mut dyn std::io::Write,
    format: OutputFormat,
    output: &QueryOutput,
) -> Result<()> {
    if output.schema.fields().is_empty() {
        if format == OutputFormat::Table {
            writeln!(out, "(0 rows)")?;
        }
        return Ok(());
    }
    crate::query::format::write(out, format, &output.schema, &output.batches)
}

/// Completes on the first SIGINT or SIGTERM after this call.
fn interrupt() -> Result<impl Future<Output = Interrupt>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Error::fatal("cannot watch for Ctrl-C").with_source(e))?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Error::fatal("cannot watch for SIGTERM").with_source(e))?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        Interrupt {
            what: "interrupted".into(),
            fix: "nothing else to do; run the query again for its result".into(),
        }
    })
}
