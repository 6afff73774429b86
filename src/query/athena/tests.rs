//! Unit tests of the Athena engine against an in-process Athena: request building, polling,
//! paging, failures, cancellation, retries, type mapping and the printed output.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type, TimeUnit};
use async_trait::async_trait;
use serde_json::{json, Value};

use super::*;
use crate::query::format::{self, OutputFormat};

/// An Athena that answers from a script: the states `GetQueryExecution` walks through (the
/// last one repeats), the result pages (page `n` is asked for with `NextToken` `n`), and
/// errors to answer first. Every call is recorded.
#[derive(Debug, Default)]
struct FakeAthena {
    states: Mutex<VecDeque<Value>>,
    pages: Vec<Value>,
    /// Errors answered, in order, before any call succeeds.
    errors: Mutex<VecDeque<AwsError>>,
    calls: Mutex<Vec<(String, Value)>>,
}

const ID: &str = "0d6e1c2a-query";

impl FakeAthena {
    fn new(states: &[Value], pages: Vec<Value>) -> Self {
        Self {
            states: Mutex::new(states.iter().cloned().collect()),
            pages,
            ..Default::default()
        }
    }

    fn failing_first(self, errors: &[(&str, &str)]) -> Self {
        *self.errors.lock().unwrap() = errors
            .iter()
            .map(|(c, m)| AwsError {
                code: c.to_string(),
                message: m.to_string(),
            })
            .collect();
        self
    }

    fn calls(&self, operation: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(op, _)| op == operation)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

#[async_trait]
impl AwsJsonApi for FakeAthena {
    async fn call(&self, operation: &str, input: Value) -> Result<Value, AwsError> {
        self.calls
            .lock()
            .unwrap()
            .push((operation.to_string(), input.clone()));
        if let Some(e) = self.errors.lock().unwrap().pop_front() {
            return Err(e);
        }
        match operation {
            "StartQueryExecution" => Ok(json!({ "QueryExecutionId": ID })),
            "GetQueryExecution" => {
                assert_eq!(input["QueryExecutionId"], ID);
                let mut states = self.states.lock().unwrap();
                let s = if states.len() > 1 {
                    states.pop_front()
                } else {
                    states.front().cloned()
                };
                Ok(s.unwrap_or_else(|| status("RUNNING", None)))
            }
            "GetQueryResults" => {
                let n: usize = input["NextToken"]
                    .as_str()
                    .map(|t| t.parse().unwrap())
                    .unwrap_or(0);
                let mut page = self.pages[n].clone();
                if n + 1 < self.pages.len() {
                    page["NextToken"] = json!((n + 1).to_string());
                }
                Ok(page)
            }
            "StopQueryExecution" => Ok(json!({})),
            other => panic!("unexpected call {other}"),
        }
    }
}

fn status(state: &str, reason: Option<&str>) -> Value {
    let mut s = json!({ "QueryExecution": {
        "QueryExecutionId": ID,
        "StatementType": "DML",
        "Status": { "State": state },
        "Statistics": { "DataScannedInBytes": 1536 },
    }});
    if let Some(r) = reason {
        s["QueryExecution"]["Status"]["StateChangeReason"] = json!(r);
    }
    s
}

fn col(name: &str, ty: &str) -> Value {
    json!({ "Name": name, "Label": name, "Type": ty })
}

fn row(values: &[Option<&str>]) -> Value {
    let data: Vec<Value> = values
        .iter()
        .map(|v| match v {
            Some(s) => json!({ "VarCharValue": s }),
            None => json!({}),
        })
        .collect();
    json!({ "Data": data })
}

fn page(columns: &[Value], rows: &[Value]) -> Value {
    json!({ "ResultSet": {
        "Rows": rows,
        "ResultSetMetadata": { "ColumnInfo": columns },
    }})
}

fn target() -> AthenaTarget {
    AthenaTarget::from_sink(
        "lake",
        &AthenaIcebergSink {
            warehouse: "s3://lake/warehouse/".into(),
            glue_database_name: "analytics_glue".into(),
            athena_workgroup_name: "analysts".into(),
            athena_results_s3_bucket: "query-results".into(),
            region: "eu-west-1".into(),
        },
    )
}

fn athena(fake: Arc<FakeAthena>) -> Athena {
    Athena::with_api(fake, target(), "http://fake".into())
        .with_pauses(Duration::from_millis(1), Duration::from_millis(5))
}

fn never() -> impl Future<Output = Interrupt> {
    std::future::pending()
}

/// Runs `sql` against `fake`, expecting it to fail.
async fn run_err(fake: &Arc<FakeAthena>, sql: &str) -> Failure {
    athena(fake.clone())
        .run(sql, &mut |_, _| {}, never())
        .await
        .unwrap_err()
}

/// What a `StartQueryExecution` refused with `code` and `message` fails with.
async fn refused_start(code: &str, message: &str) -> Failure {
    let fake = Arc::new(FakeAthena::new(&[], vec![]).failing_first(&[(code, message)]));
    run_err(&fake, "SELECT 1").await
}

#[test]
fn results_location_is_an_s3_folder() {
    assert_eq!(target().output_location, "s3://query-results/");
    let mut sink = AthenaIcebergSink {
        warehouse: "s3://lake/".into(),
        glue_database_name: "db".into(),
        athena_workgroup_name: "primary".into(),
        athena_results_s3_bucket: "s3://results/athena".into(),
        region: "us-east-1".into(),
    };
    assert_eq!(
        AthenaTarget::from_sink("s", &sink).output_location,
        "s3://results/athena/"
    );
    sink.athena_results_s3_bucket = "s3://results/athena/".into();
    assert_eq!(
        AthenaTarget::from_sink("s", &sink).output_location,
        "s3://results/athena/"
    );
}

#[tokio::test]
async fn runs_polls_and_pages_through_the_results() {
    let cols = [col("id", "integer"), col("name", "varchar")];
    let fake = Arc::new(FakeAthena::new(
        &[
            status("QUEUED", None),
            status("RUNNING", None),
            status("SUCCEEDED", None),
        ],
        vec![
            // The first row of a SELECT's first page repeats the column names.
            page(
                &cols,
                &[
                    row(&[Some("id"), Some("name")]),
                    row(&[Some("1"), Some("a")]),
                ],
            ),
            page(&cols, &[row(&[Some("2"), None]), row(&[None, Some("id")])]),
            page(&cols, &[row(&[Some("3"), Some("")])]),
        ],
    ));
    let mut seen = Vec::new();
    let out = athena(fake.clone())
        .run(
            "SELECT id, name FROM t",
            &mut |id, s| seen.push((id.to_string(), s.state)),
            never(),
        )
        .await
        .unwrap();

    let start = &fake.calls("StartQueryExecution")[0];
    assert_eq!(start["QueryString"], "SELECT id, name FROM t");
    assert_eq!(start["WorkGroup"], "analysts");
    assert_eq!(start["QueryExecutionContext"]["Database"], "analytics_glue");
    assert_eq!(
        start["ResultConfiguration"]["OutputLocation"],
        "s3://query-results/"
    );
    assert!(start["ClientRequestToken"].as_str().unwrap().len() >= 32);

    assert_eq!(
        seen,
        vec![
            (ID.to_string(), State::Queued),
            (ID.to_string(), State::Running),
            (ID.to_string(), State::Succeeded)
        ]
    );
    let pages = fake.calls("GetQueryResults");
    assert_eq!(pages.len(), 3);
    assert_eq!(pages[0]["MaxResults"], 1000);
    assert!(pages[0].get("NextToken").is_none());
    assert_eq!(pages[1]["NextToken"], "1");
    assert_eq!(pages[2]["NextToken"], "2");

    assert_eq!(out.id, ID);
    assert_eq!(out.status.scanned_bytes, 1536);
    let b = &out.batches[0];
    assert_eq!(b.num_rows(), 4);
    let ids = b.column(0).as_primitive::<arrow::datatypes::Int32Type>();
    assert_eq!(
        (0..4)
            .map(|i| (!ids.is_null(i)).then(|| ids.value(i)))
            .collect::<Vec<_>>(),
        vec![Some(1), Some(2), None, Some(3)]
    );
    let names = b.column(1).as_string::<i32>();
    assert_eq!(names.value(0), "a");
    assert!(names.is_null(1), "a missing VarCharValue is NULL");
    assert_eq!(names.value(2), "id");
    assert!(
        !names.is_null(3) && names.value(3).is_empty(),
        "'' stays ''"
    );
}

#[test]
fn only_the_first_row_of_a_select_is_a_header() {
    let cols = [col("a", "varchar")];
    let pages = [page(
        &cols,
        &[row(&[Some("a")]), row(&[Some("a")]), row(&[Some("b")])],
    )];
    let (_, b) = results::to_arrow(&pages, true).unwrap();
    assert_eq!(
        b[0].num_rows(),
        2,
        "SELECT 'a' AS a: header, then the value"
    );
    // A DDL or utility statement (SHOW TABLES) has no header row.
    let (_, b) = results::to_arrow(&pages, false).unwrap();
    assert_eq!(b[0].num_rows(), 3);
    // A first row that is not the names is data even for a SELECT.
    let pages = [page(&cols, &[row(&[Some("x")])])];
    let (_, b) = results::to_arrow(&pages, true).unwrap();
    assert_eq!(b[0].num_rows(), 1);
}

#[test]
fn a_row_of_the_wrong_width_is_an_error() {
    let pages = [page(
        &[col("a", "varchar"), col("b", "varchar")],
        &[row(&[Some("1")])],
    )];
    let e = results::to_arrow(&pages, false).unwrap_err();
    assert!(
        e.message().contains("1 values for 2 columns"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn a_failed_query_names_athenas_reason() {
    let mut failed = status(
        "FAILED",
        Some("COLUMN_NOT_FOUND: line 1:8: Column 'nope' cannot be resolved"),
    );
    failed["QueryExecution"]["Status"]["AthenaError"] = json!({ "ErrorCategory": 2, "ErrorType": 1006, "ErrorMessage": "COLUMN_NOT_FOUND: line 1:8: Column 'nope' cannot be resolved" });
    let fake = Arc::new(FakeAthena::new(&[status("RUNNING", None), failed], vec![]));
    let f = run_err(&fake, "SELECT nope FROM t").await;
    assert_eq!(f.kind, ErrorKind::Query);
    assert!(
        f.detail.contains(&format!("Athena query {ID} FAILED")),
        "{}",
        f.detail
    );
    assert!(
        f.detail.contains("Column 'nope' cannot be resolved"),
        "{}",
        f.detail
    );
    assert_eq!(
        f.detail.matches("cannot be resolved").count(),
        1,
        "the same text is not repeated: {}",
        f.detail
    );
    assert!(fake.calls("GetQueryResults").is_empty());
    let e = Error::from(f);
    assert_eq!(e.exit_code(), 1);
}

#[tokio::test]
async fn a_failed_query_without_access_says_which_permissions() {
    let fake = Arc::new(FakeAthena::new(
        &[status(
            "FAILED",
            Some("Access denied when writing output to url: s3://query-results/x.csv"),
        )],
        vec![],
    ));
    let f = run_err(&fake, "SELECT 1").await;
    assert!(f.fix.contains("s3:PutObject"), "{}", f.fix);
    assert!(f.fix.contains("s3://query-results/"), "{}", f.fix);
}

#[tokio::test]
async fn a_cancelled_query_says_so() {
    let fake = Arc::new(FakeAthena::new(
        &[status("CANCELLED", Some("Query cancelled by user"))],
        vec![],
    ));
    let f = run_err(&fake, "SELECT 1").await;
    assert!(
        f.detail.contains("CANCELLED: Query cancelled by user"),
        "{}",
        f.detail
    );
}

#[tokio::test]
async fn an_interrupt_stops_the_query_in_athena() {
    let fake = Arc::new(FakeAthena::new(&[status("RUNNING", None)], vec![]));
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Interrupt {
            what: "interrupted".into(),
            fix: "run it again".into(),
        }
    };
    let f = athena(fake.clone())
        .run("SELECT * FROM big", &mut |_, _| {}, cancel)
        .await
        .unwrap_err();
    assert_eq!(
        f.detail,
        format!("interrupted: Athena query {ID} was stopped (StopQueryExecution)")
    );
    let stops = fake.calls("StopQueryExecution");
    assert_eq!(stops, vec![json!({ "QueryExecutionId": ID })]);
    assert!(
        fake.calls("GetQueryExecution").len() >= 2,
        "polled until interrupted"
    );
}

#[test]
fn polls_back_off_to_a_bound() {
    let mut pause = POLL_FIRST;
    let mut seen = vec![pause.as_millis()];
    for _ in 0..6 {
        pause = next_pause(pause, POLL_MAX);
        seen.push(pause.as_millis());
    }
    assert_eq!(seen, vec![200, 400, 800, 1600, 2000, 2000, 2000]);
}

#[tokio::test]
async fn throttling_is_retried_with_the_same_request_token() {
    let fake = Arc::new(
        FakeAthena::new(&[status("SUCCEEDED", None)], vec![page(&[], &[])]).failing_first(&[
            ("ThrottlingException", "Rate exceeded"),
            ("Transport", "connection reset"),
        ]),
    );
    athena(fake.clone())
        .run("SELECT 1", &mut |_, _| {}, never())
        .await
        .unwrap();
    let starts = fake.calls("StartQueryExecution");
    assert_eq!(starts.len(), 3);
    assert!(starts
        .iter()
        .all(|s| s["ClientRequestToken"] == starts[0]["ClientRequestToken"]));
}

#[tokio::test]
async fn throttling_that_persists_is_retryable() {
    let errors = [("ThrottlingException", "Rate exceeded"); 5];
    let fake = Arc::new(FakeAthena::new(&[], vec![]).failing_first(&errors));
    let f = run_err(&fake, "SELECT 1").await;
    assert_eq!(f.kind, ErrorKind::Retryable);
    assert_eq!(fake.calls("StartQueryExecution").len(), 5);
    assert_eq!(Error::from(f).exit_code(), 75);
}

/// A refused start names what to fix: a missing workgroup is a configuration error naming
/// the key; a refused permission names the IAM action and the others skipprd needs.
#[tokio::test]
async fn refused_starts_name_the_workgroup_or_the_iam_action() {
    let wg = refused_start(
        "InvalidRequestException",
        "WorkGroup analysts is not found.",
    )
    .await;
    assert_eq!(wg.kind, ErrorKind::Config);
    assert!(wg.detail.contains("workgroup `analysts`"), "{}", wg.detail);
    let key = "data_sinks.lake.AthenaIceberg.athena_workgroup_name";
    assert!(wg.fix.contains(key), "{}", wg.fix);

    let denied = refused_start(
        "AccessDeniedException",
        "User: arn:aws:iam::1:user/x is not authorized to perform: athena:StartQueryExecution",
    )
    .await;
    assert!(
        denied.fix.contains("athena:StartQueryExecution"),
        "{}",
        denied.fix
    );
    assert!(
        denied.fix.contains("athena:GetQueryResults"),
        "{}",
        denied.fix
    );
}

#[test]
fn athena_types_map_to_arrow() {
    let t = |ty: &str| arrow_type(&json!({ "Type": ty }));
    assert_eq!(t("boolean"), DataType::Boolean);
    assert_eq!(t("tinyint"), DataType::Int8);
    assert_eq!(t("smallint"), DataType::Int16);
    assert_eq!(t("integer"), DataType::Int32);
    assert_eq!(t("bigint"), DataType::Int64);
    assert_eq!(t("real"), DataType::Float32);
    assert_eq!(t("float"), DataType::Float32);
    assert_eq!(t("double"), DataType::Float64);
    assert_eq!(t("date"), DataType::Date32);
    assert_eq!(
        t("timestamp"),
        DataType::Timestamp(TimeUnit::Microsecond, None)
    );
    assert_eq!(
        t("timestamp with time zone"),
        DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
    );
    assert_eq!(
        arrow_type(&json!({ "Type": "decimal", "Precision": 12, "Scale": 2 })),
        DataType::Decimal128(12, 2)
    );
    assert_eq!(t("decimal(10,3)"), DataType::Decimal128(10, 3));
    assert_eq!(t("decimal"), DataType::Utf8, "no precision: kept as text");
    for text in [
        "varchar",
        "char",
        "string",
        "json",
        "uuid",
        "time",
        "varbinary",
        "array",
        "map",
        "row",
        "interval day to second",
        "unknown",
    ] {
        assert_eq!(t(text), DataType::Utf8, "{text}");
    }
}

#[test]
fn values_are_typed_and_unparseable_columns_stay_text() {
    let cols = [
        col("b", "boolean"),
        col("big", "bigint"),
        col("d", "double"),
        json!({ "Name": "amount", "Type": "decimal", "Precision": 10, "Scale": 2 }),
        col("day", "date"),
        col("at", "timestamp"),
        col("at_tz", "timestamp with time zone"),
        col("odd", "double"),
    ];
    let pages = [page(
        &cols,
        &[
            row(&[
                Some("true"),
                Some("9223372036854775807"),
                Some("1.0E10"),
                Some("12.30"),
                Some("2024-02-29"),
                Some("2024-02-29 23:59:58.123456"),
                Some("2024-03-01 01:00:00.000 Europe/Paris"),
                Some("1.5"),
            ]),
            row(&[
                None,
                Some("-1"),
                Some("NaN"),
                None,
                None,
                None,
                Some("2024-03-01 00:00:00.000 UTC"),
                Some("not a number"),
            ]),
        ],
    )];
    let (schema, batches) = results::to_arrow(&pages, false).unwrap();
    let types: Vec<DataType> = schema
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(
        types,
        vec![
            DataType::Boolean,
            DataType::Int64,
            DataType::Float64,
            DataType::Decimal128(10, 2),
            DataType::Date32,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            DataType::Utf8,
        ]
    );
    let b = &batches[0];
    assert_eq!(b.column(1).as_primitive::<Int64Type>().value(0), i64::MAX);
    let tz = b
        .column(6)
        .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
    assert_eq!(tz.value(0), tz.value(1), "01:00 in Paris is 00:00 UTC");
    let odd = b.column(7).as_string::<i32>();
    assert_eq!((odd.value(0), odd.value(1)), ("1.5", "not a number"));

    let mut csv = Vec::new();
    format::write(&mut csv, OutputFormat::Csv, &schema, &batches).unwrap();
    assert_eq!(
        String::from_utf8(csv).unwrap(),
        "b,big,d,amount,day,at,at_tz,odd\n\
         true,9223372036854775807,10000000000.0,12.30,2024-02-29,2024-02-29 23:59:58.123456,2024-03-01 00:00:00+00:00,1.5\n\
         ,-1,NaN,,,,2024-03-01 00:00:00+00:00,not a number\n"
    );
}

#[test]
fn printed_like_the_local_engine() {
    let cols = [col("id", "bigint"), col("name", "varchar")];
    let pages = [page(
        &cols,
        &[
            row(&[Some("id"), Some("name")]),
            row(&[Some("7"), Some("ann")]),
            row(&[Some("1234"), None]),
        ],
    )];
    let (schema, batches) = results::to_arrow(&pages, true).unwrap();
    let mut table = Vec::new();
    format::write(&mut table, OutputFormat::Table, &schema, &batches).unwrap();
    assert_eq!(
        String::from_utf8(table).unwrap(),
        "  id  | name\n------+------\n    7 | ann\n 1234 |\n(2 rows)\n"
    );
    let mut json_out = Vec::new();
    format::write(&mut json_out, OutputFormat::Json, &schema, &batches).unwrap();
    assert_eq!(
        String::from_utf8(json_out).unwrap(),
        "{\"id\":7,\"name\":\"ann\"}\n{\"id\":1234,\"name\":null}\n"
    );
}

#[test]
fn progress_lines_show_state_time_and_bytes() {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let mut p = Progress::new(false, Box::new(sink.clone()));
    let running = Status::parse(&status("RUNNING", None)).unwrap();
    p.update(ID, &running);
    p.update(ID, &running);
    p.update(ID, &Status::parse(&status("SUCCEEDED", None)).unwrap());
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "one line per state change: {text}");
    assert!(
        lines[0].starts_with(&format!("athena: query {ID} RUNNING (")),
        "{text}"
    );
    assert!(
        lines[1].contains("SUCCEEDED") && lines[1].ends_with("1.5 KiB scanned)"),
        "{text}"
    );
    assert_eq!(human_bytes(0), "0 B");

    // On a terminal one line is rewritten in place, and ended when the query stops early.
    let tty = Sink::default();
    let mut p = Progress::new(true, Box::new(tty.clone()));
    p.update(ID, &running);
    p.update(ID, &running);
    p.finish();
    let text = String::from_utf8(tty.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("\r\x1b[2K").count(), 2, "{text:?}");
    assert!(text.ends_with("scanned)\n"), "{text:?}");
    assert_eq!(human_bytes(10 * 1024 * 1024 + 1), "10.0 MiB");
}

fn config(sinks: &str) -> Config {
    let text = format!(
        "skippr:\n  workspace: analytics\n\npipelines:\n  app:\n    data_source: data_sources.db\n    data_sink: data_sinks.lake\n  other:\n    data_source: data_sources.db2\n    data_sink: data_sinks.second\n\ndata_sources:\n  db:\n    Postgres: {{host: h, user: u, database: d, tables: [a]}}\n  db2:\n    Postgres: {{host: h, user: u, database: d, tables: [b]}}\n\ndata_sinks:\n{sinks}"
    );
    Config::from_str(std::path::Path::new("/tmp/cfg/skippr.yml"), &text, &|_| {
        None
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

const ATHENA_SINK: &str = "AthenaIceberg: {warehouse: s3://lake/wh/, glue_database_name: g, athena_workgroup_name: primary, athena_results_s3_bucket: results, region: us-east-1}";

#[test]
fn the_athena_sink_is_picked_from_the_config() {
    let both = config(&format!(
        "  lake:\n    {ATHENA_SINK}\n  second:\n    LocalIceberg: {{warehouse: ./wh}}\n"
    ));
    let t = AthenaTarget::pick(&both, None).unwrap();
    assert_eq!((t.sink.as_str(), t.workgroup.as_str()), ("lake", "primary"));
    let e = AthenaTarget::pick(&both, Some("other")).unwrap_err();
    assert!(
        e.message()
            .contains("pipeline `other` writes to a LocalIceberg sink"),
        "{}",
        e.message()
    );

    let local = config("  lake:\n    LocalIceberg: {warehouse: ./a}\n  second:\n    LocalIceberg: {warehouse: ./b}\n");
    let e = AthenaTarget::pick(&local, None).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.message().contains("needs an AthenaIceberg data sink"),
        "{}",
        e.message()
    );

    let two = config(&format!(
        "  lake:\n    {ATHENA_SINK}\n  second:\n    {}\n",
        ATHENA_SINK
            .replace("primary", "etl")
            .replace("s3://lake/wh/", "s3://lake/wh2/")
    ));
    let e = AthenaTarget::pick(&two, None).unwrap_err();
    assert!(
        e.message()
            .contains("choose one with --pipeline (app, other)"),
        "{}",
        e.message()
    );
    assert_eq!(
        AthenaTarget::pick(&two, Some("other")).unwrap().workgroup,
        "etl"
    );

    // Two sinks with the same Athena settings are one engine: nothing to choose.
    let alike = config(&format!(
        "  lake:\n    {ATHENA_SINK}\n  second:\n    {}\n",
        ATHENA_SINK.replace("s3://lake/wh/", "s3://lake/wh2/")
    ));
    assert_eq!(AthenaTarget::pick(&alike, None).unwrap().sink, "lake");
}
