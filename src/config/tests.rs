//! Unit tests of config loading: the happy path and every kind of error.

use super::*;

const GOOD: &str = r#"skippr:
  workspace: analytics
  skipprd_el_storage_mode: local

pipelines:
  app:
    data_source: data_sources.app_db
    data_sink: data_sinks.lake

data_sources:
  app_db:
    Postgres:
      host: 127.0.0.1
      user: skippr_reader
      password: ${APP_DB_PASSWORD}
      database: app
      tables: [orders, sales.customers]
      cdc_mode: snapshot_then_cdc

data_sinks:
  lake:
    LocalIceberg:
      warehouse: ./warehouse
"#;

fn env(name: &str) -> Option<String> {
    (name == "APP_DB_PASSWORD").then(|| "s3cret".to_string())
}

fn load(text: &str) -> Result<Config, ConfigErrors> {
    Config::from_str(Path::new("/tmp/cfg/skippr.yml"), text, &env)
}

fn one_error(text: &str) -> Problem {
    let errs = load(text).unwrap_err();
    assert_eq!(errs.0.len(), 1, "{errs}");
    errs.0.into_iter().next().unwrap()
}

/// Pipeline `app` of `text`, which must load.
fn app(text: &str) -> PipelineConfig {
    load(text).unwrap().pipeline("app").unwrap().clone()
}

/// GOOD written to `skippr.yml` in a new temporary folder (which lives as long as the
/// returned handle).
fn good_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(&path, GOOD).unwrap();
    (dir, path)
}

/// The entries of one `connect pipeline --pipeline app` call, as its flags give them.
#[derive(Default)]
struct PipelineFlags {
    partition_by: Vec<(String, String)>,
    sort_by: Vec<(String, String)>,
    exclude_columns: Vec<(String, String)>,
    changelog: Vec<(String, Option<String>)>,
}

/// What `connect pipeline --pipeline app` with `flags` writes to the file at `path`, or its
/// refusal.
fn connect_app(path: &Path, flags: PipelineFlags) -> crate::error::Result<String> {
    let PipelineFlags {
        partition_by,
        sort_by,
        exclude_columns,
        changelog,
    } = flags;
    connect::apply(
        path,
        None,
        None,
        None,
        Some(connect::Connect::Pipeline {
            pipeline: "app".into(),
            partition_by,
            sort_by,
            exclude_columns,
            changelog,
        }),
    )
}

#[test]
fn loads_the_embedded_default() {
    let c = load(GOOD).unwrap();
    assert_eq!(c.workspace, "analytics");
    let p = c.pipeline("app").unwrap();
    assert_eq!(p.source.port, 5432);
    assert_eq!(p.source.password.as_deref(), Some("s3cret"));
    assert_eq!(p.source.tables[1].iceberg_name(), "sales_customers");
    assert_eq!(p.source.slot, "skippr_analytics_app");
    // The raw model keeps the reference, never the value.
    let raw = serde_yaml::to_string(&c.raw).unwrap();
    assert!(raw.contains("${APP_DB_PASSWORD}"));
    assert!(!raw.contains("s3cret"));
    match &p.sink {
        SinkConfig::LocalIceberg { warehouse, .. } => assert!(warehouse.ends_with("warehouse")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn loads_athena_with_schema_sink() {
    let text = GOOD.replace(
        "    LocalIceberg:\n      warehouse: ./warehouse\n",
        "    AthenaIceberg:\n      warehouse: s3://wh-bucket/\n      glue_database_name: analytics\n      athena_workgroup_name: primary\n      athena_results_s3_bucket: r\n      region: us-east-1\n    schema_sink: schema_sinks.s\nschema_sinks:\n  s:\n    AthenaIceberg: {warehouse: s3://wh-bucket/, glue_database_name: analytics, athena_workgroup_name: primary, athena_results_s3_bucket: r, region: us-east-1}\n",
    );
    let c = load(&text).unwrap();
    assert_eq!(c.pipelines[0].schema_sink.as_deref(), Some("s"));
}

#[test]
fn unknown_key_names_line_and_allowed_keys() {
    let p = one_error(&GOOD.replace(
        "      database: app\n",
        "      database: app\n      databse: x\n",
    ));
    assert_eq!(p.path, "data_sources.app_db.Postgres.databse");
    assert_eq!(p.position.unwrap().line, 17);
    assert!(p.message.contains("expected one of"), "{}", p.message);
    assert!(p.message.contains("database"), "{}", p.message);
}

#[test]
fn bad_enum_lists_values() {
    let p = one_error(&GOOD.replace("cdc_mode: snapshot_then_cdc", "cdc_mode: sometimes"));
    assert_eq!(p.path, "data_sources.app_db.Postgres.cdc_mode");
    assert_eq!(p.position.unwrap().line, 18);
    assert!(p.message.contains("snapshot_only"), "{}", p.message);
}

#[test]
fn wrong_type() {
    let p = one_error(&GOOD.replace(
        "      user: skippr_reader\n",
        "      user: skippr_reader\n      port: abc\n",
    ));
    assert_eq!(p.path, "data_sources.app_db.Postgres.port");
    assert!(p.message.contains("port number"), "{}", p.message);
}

#[test]
fn dangling_reference() {
    let p = one_error(&GOOD.replace("data_sinks.lake\n", "data_sinks.nope\n"));
    assert_eq!(p.path, "pipelines.app.data_sink");
    assert_eq!(p.position.unwrap().line, 8);
    assert!(p.message.contains("data_sinks.lake"), "{}", p.message);
}

#[test]
fn missing_env_names_variable_only() {
    let text = GOOD.replace("${APP_DB_PASSWORD}", "${NOT_SET_ANYWHERE}");
    let p = one_error(&text);
    assert!(p.message.contains("NOT_SET_ANYWHERE"));
    assert_eq!(p.path, "data_sources.app_db.Postgres.password");
    assert_eq!(p.position.unwrap().line, 15);
}

#[test]
fn yaml_syntax_error_has_line() {
    let p = one_error("skippr:\n  workspace: [a\n");
    assert!(p.position.is_some());
    assert!(p.message.contains("YAML syntax error"));
}

#[test]
fn expand_forms() {
    let e = |n: &str| (n == "A").then(|| "x".to_string());
    assert_eq!(expand("a${A}b", &e).unwrap().as_deref(), Some("axb"));
    assert_eq!(expand("$${A}", &e).unwrap().as_deref(), Some("${A}"));
    assert_eq!(expand("${B:-d}", &e).unwrap().as_deref(), Some("d"));
    assert!(expand("${B}", &e).is_err());
    assert_eq!(expand("plain", &e).unwrap(), None);
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = GOOD
        .replace("data_sinks.lake\n", "data_sinks.nope\n")
        .replace(
            "      user: skippr_reader\n",
            "      user: skippr_reader\n      port: abc\n",
        )
        .replace("cdc_mode: snapshot_then_cdc", "cdc_mode: sometimes");
    let errs = load(&text).unwrap_err();
    let paths: Vec<_> = errs.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "pipelines.app.data_sink",
            "data_sources.app_db.Postgres.port",
            "data_sources.app_db.Postgres.cdc_mode"
        ],
        "{errs}"
    );
}

#[test]
fn two_pipelines_writing_one_table_are_refused() {
    let text = GOOD.replace(
        "pipelines:\n  app:\n    data_source: data_sources.app_db\n    data_sink: data_sinks.lake\n",
        "pipelines:\n  app:\n    data_source: data_sources.app_db\n    data_sink: data_sinks.lake\n  billing:\n    data_source: data_sources.billing_db\n    data_sink: data_sinks.lake2\n",
    )
    .replace(
        "data_sinks:\n",
        "  billing_db:\n    Postgres:\n      host: 127.0.0.1\n      user: u\n      database: billing\n      tables: [public.orders, invoices]\n\ndata_sinks:\n  lake2:\n    LocalIceberg:\n      warehouse: ./sub/../warehouse\n",
    );
    let p = one_error(&text);
    assert_eq!(p.path, "pipelines.billing");
    assert!(p.message.contains("`orders`"), "{}", p.message);
    assert!(p.message.contains("pipeline `app`"), "{}", p.message);

    // Another warehouse is another table.
    let apart = text.replace("./sub/../warehouse", "./other");
    assert!(load(&apart).is_ok());
}

#[test]
fn reconnect_settings_have_defaults_and_are_checked() {
    use std::time::Duration;
    let c = load(GOOD).unwrap();
    assert_eq!(c.reconnect.max_backoff, Duration::from_secs(30));
    assert_eq!(c.reconnect.give_up_after, Duration::from_secs(300));
    assert_eq!(c.reconnect.peer_timeout, Duration::from_secs(30));
    assert_eq!(c.pipelines[0].source.peer_timeout, Duration::from_secs(30));
    let text = GOOD.replace(
        "  skipprd_el_storage_mode: local\n",
        "  skipprd_el_storage_mode: local\n  reconnect:\n    max_backoff: 5s\n    peer_timeout: 10s\n",
    );
    let c = load(&text).unwrap();
    assert_eq!(c.reconnect.max_backoff, Duration::from_secs(5));
    assert_eq!(c.pipelines[0].source.peer_timeout, Duration::from_secs(10));
    let bad = GOOD.replace(
        "  skipprd_el_storage_mode: local\n",
        "  skipprd_el_storage_mode: local\n  reconnect:\n    give_up_after: 10ms\n",
    );
    let p = one_error(&bad);
    assert_eq!(p.path, "skippr.reconnect.give_up_after");
    assert!(p.message.contains("at least 1s"), "{}", p.message);
}

#[test]
fn memory_budgets_default_and_are_validated() {
    type Field = fn(&PipelineConfig) -> u64;
    let cases: [(&str, Field, &str); 2] = [
        (
            "transaction_memory_budget_mb",
            |p| p.transaction_memory_budget,
            "spill to disk",
        ),
        (
            "key_index_memory_budget_mb",
            |p| p.key_index_memory_budget,
            "local disk",
        ),
    ];
    for (key, field, beyond) in cases {
        let p = app(GOOD);
        assert_eq!(field(&p), 256 * 1024 * 1024, "{key}");
        let with = |v: &str| {
            GOOD.replace(
                "    data_sink: data_sinks.lake\n",
                &format!("    data_sink: data_sinks.lake\n    {key}: {v}\n"),
            )
        };
        let p = app(&with("8"));
        assert_eq!(field(&p), 8 * 1024 * 1024, "{key}");
        for bad in ["0", "1048577"] {
            let e = one_error(&with(bad)).to_string();
            assert!(e.contains(key), "{e}");
            assert!(e.contains("between 1 and 1048576"), "{e}");
            assert!(e.contains(beyond), "{e}");
        }
        assert!(load(&with("lots")).is_err(), "{key}");
    }
}

/// GOOD with `tables:` under the pipeline (its first line is line 9).
fn with_tables(tables: &str) -> String {
    GOOD.replace(
        "    data_sink: data_sinks.lake\n",
        &format!("    data_sink: data_sinks.lake\n    tables:\n{tables}"),
    )
}

#[test]
fn table_layouts_resolve_in_file_order() {
    let text = with_tables(
        "      sales.customers:\n        sort_by: [name desc nulls last]\n      orders:\n        partition_by: [day(created_at), bucket(16, customer_id)]\n        sort_by: [created_at]\n",
    );
    let p = app(&text);
    let orders = p.layout(&TableRef::parse("orders").unwrap());
    assert_eq!(
        orders.to_string(),
        "partitioned by day(created_at), bucket(16, customer_id); sorted by created_at"
    );
    let customers = p.layout(&TableRef::parse("sales.customers").unwrap());
    // Descending puts nulls last unless told otherwise: that needs no words.
    assert_eq!(customers.to_string(), "unpartitioned; sorted by name desc");
    // Every entry knows its line (the flow list's second entry was split by YAML at its
    // comma, and is still one entry at the place it starts).
    let origin = &p.layout_origins[&TableRef::parse("orders").unwrap()];
    let lines: Vec<_> = origin
        .partition_by
        .iter()
        .map(|l| l.position.unwrap().line)
        .collect();
    assert_eq!(lines, vec![13, 13]);
    assert_eq!(
        origin.partition_by[1].to_string(),
        format!(
            "/tmp/cfg/skippr.yml:13:{}: pipelines.app.tables.orders.partition_by[1]",
            "        partition_by: [day(created_at), ".len() + 1
        )
    );
    // The file's order is kept in the model.
    let file: SkipprFile = serde_yaml::from_str(&text.replace("${APP_DB_PASSWORD}", "x")).unwrap();
    let names: Vec<_> = file.pipelines["app"]
        .tables
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(names, vec!["sales.customers", "orders"]);
    // A table not named is one unsorted partition.
    let other = TableRef::parse("elsewhere").unwrap();
    assert!(p.layout(&other).is_plain());
}

#[test]
fn block_lists_and_empty_settings_are_read() {
    let text = with_tables(
        "      public.orders:\n        partition_by:\n          - bucket(16, customer_id)\n          - truncate(4, \"Note\")\n      sales.customers:\n",
    );
    let p = app(&text);
    assert_eq!(
        p.layout(&TableRef::parse("orders").unwrap()).to_string(),
        "partitioned by bucket(16, customer_id), truncate(4, Note)"
    );
    assert_eq!(
        p.layout(&TableRef::parse("sales.customers").unwrap())
            .to_string(),
        "unpartitioned"
    );
}

#[test]
fn a_malformed_entry_names_its_line() {
    let p = one_error(&with_tables(
        "      orders:\n        partition_by: [day(created_at), days_since(created_at)]\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.orders.partition_by[1]");
    assert_eq!(p.position.unwrap().line, 11);
    assert!(
        p.message.contains("`days_since` is not a transform"),
        "{}",
        p.message
    );
    assert!(p.message.contains("bucket(N, c)"), "{}", p.message);
    assert!(p.to_string().starts_with("/tmp/cfg/skippr.yml:11:"), "{p}");

    let p = one_error(&with_tables(
        "      orders:\n        sort_by:\n          - created_at\n          - created_at sideways\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.orders.sort_by[1]");
    assert_eq!(p.position.unwrap().line, 13);
    assert!(
        p.message.contains("[asc|desc] [nulls first|last]"),
        "{}",
        p.message
    );

    let p = one_error(&with_tables(
        "      orders:\n        partition_by: [bucket(0, id)]\n",
    ));
    assert!(p.message.contains("above 0"), "{}", p.message);

    let p = one_error(&with_tables(
        "      orders:\n        partition_by: [id, id]\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.orders.partition_by");
    assert!(p.message.contains("given twice"), "{}", p.message);
}

#[test]
fn an_unknown_key_or_wrong_type_names_its_line() {
    let p = one_error(&with_tables("      orders:\n        partition: [id]\n"));
    assert_eq!(p.path, "pipelines.app.tables.orders.partition");
    assert_eq!(p.position.unwrap().line, 11);
    assert!(p.message.contains("partition_by"), "{}", p.message);
    let p = one_error(&with_tables("      orders:\n        partition_by: id\n"));
    assert_eq!(p.path, "pipelines.app.tables.orders.partition_by");
    assert!(p.message.contains("wrong type"), "{}", p.message);
    let p = one_error(&GOOD.replace(
        "    data_sink: data_sinks.lake\n",
        "    data_sink: data_sinks.lake\n    tables: [orders]\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables");
    assert!(
        p.message.contains("mapping from table name"),
        "{}",
        p.message
    );
}

#[test]
fn a_table_the_source_does_not_list_is_refused() {
    let p = one_error(&with_tables(
        "      orders:\n        sort_by: [id]\n      invoices:\n        sort_by: [id]\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.invoices");
    assert_eq!(p.position.unwrap().line, 12);
    assert!(
        p.message.contains("orders, sales.customers"),
        "{}",
        p.message
    );
    assert!(
        p.message.contains("data_sources.app_db.Postgres.tables"),
        "{}",
        p.message
    );

    let p = one_error(&with_tables(
        "      orders:\n        sort_by: [id]\n      public.orders:\n        sort_by: [id]\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.public.orders");
    assert!(
        p.message.contains("same table as `orders`"),
        "{}",
        p.message
    );

    let p = one_error(&with_tables("      a.b.c:\n        sort_by: [id]\n"));
    assert!(p.message.contains("is not a table name"), "{}", p.message);
}

#[test]
fn rejoin_joins_what_a_flow_list_split() {
    let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        layouts::rejoin(&items(&[
            "day(c)",
            "bucket(16",
            "customer_id)",
            "truncate(4",
            " x)"
        ])),
        vec![
            (0, "day(c)".to_string()),
            (1, "bucket(16, customer_id)".to_string()),
            (3, "truncate(4, x)".to_string())
        ]
    );
    // An entry left open stays as written: the parser names the missing parenthesis.
    assert_eq!(
        layouts::rejoin(&items(&["a", "bucket(16"])),
        vec![(0, "a".to_string()), (1, "bucket(16".to_string())]
    );
}

#[test]
fn layouts_round_trip_through_the_canonical_writer() {
    let text = with_tables(
        "      users:\n        partition_by: [day(created_at), bucket(16, customer_id)]\n        sort_by: [created_at desc]\n      orders:\n        sort_by: [id]\n",
    )
    .replace("tables: [orders, sales.customers]", "tables: [orders, users]");
    // What `connect` writes: entries whole (quoted where YAML needs it), tables in the
    // file's order (not sorted as known keys such as `users` would be).
    let written = rewritten(&text, |c| c.pipelines[0].layouts.clone());
    assert!(
        written.contains(
            "    tables:\n      users:\n        partition_by: ['day(created_at)', 'bucket(16, customer_id)']\n        sort_by: ['created_at desc']\n      orders:\n        sort_by: [id]\n"
        ),
        "{written}"
    );
}

/// `text` as `connect` writes it back with nothing to add, asserted to read back as `text`
/// reads (`read` takes what the test is about) and to be written again unchanged.
fn rewritten<T: PartialEq + std::fmt::Debug>(text: &str, read: impl Fn(&Config) -> T) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(&path, text).unwrap();
    let written = connect::apply(&path, None, None, None, None).unwrap();
    let before = Config::from_str(&path, text, &env).unwrap();
    let after = Config::from_str(&path, &written, &env).unwrap();
    assert_eq!(read(&before), read(&after));
    assert_eq!(
        emit::to_canonical_yaml(&serde_yaml::from_str(&written).unwrap()),
        written
    );
    written
}

#[test]
fn connect_pipeline_writes_layouts_and_refuses_bad_entries() {
    let (_dir, path) = good_file();
    let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
    let set = |partition_by: Vec<(String, String)>, sort_by: Vec<(String, String)>| {
        let flags = PipelineFlags {
            partition_by,
            sort_by,
            ..Default::default()
        };
        connect_app(&path, flags)
    };
    let written = set(
        vec![
            pair("orders", "day(created_at)"),
            pair("orders", "bucket(16, customer_id)"),
        ],
        vec![pair("orders", "created_at")],
    )
    .unwrap();
    assert!(
        written.contains("    data_sink: data_sinks.lake\n    tables:\n      orders:\n        partition_by: ['day(created_at)', 'bucket(16, customer_id)']\n        sort_by: [created_at]\n\n"),
        "{written}"
    );
    let c = Config::from_str(&path, &written, &env).unwrap();
    assert_eq!(
        c.pipelines[0]
            .layout(&TableRef::parse("orders").unwrap())
            .to_string(),
        "partitioned by day(created_at), bucket(16, customer_id); sorted by created_at"
    );
    // The same command again changes nothing; an empty entry clears a list, and a table
    // left with no settings goes.
    assert_eq!(
        set(
            vec![
                pair("orders", "day(created_at)"),
                pair("orders", "bucket(16, customer_id)"),
            ],
            vec![pair("orders", "created_at")],
        )
        .unwrap(),
        written
    );
    let cleared = set(vec![pair("orders", "")], vec![]).unwrap();
    assert!(
        cleared.contains("      orders:\n        sort_by: [created_at]\n"),
        "{cleared}"
    );
    let cleared = set(vec![], vec![pair("orders", "")]).unwrap();
    assert!(!cleared.contains("tables:\n      orders"), "{cleared}");
    assert_eq!(
        cleared,
        emit::to_canonical_yaml(&serde_yaml::from_str(GOOD).unwrap())
    );
    // Clearing what is not there changes nothing (and makes no pipeline).
    assert_eq!(set(vec![pair("orders", "")], vec![]).unwrap(), cleared);

    for (partition_by, sort_by, message) in [
        (
            vec![pair("orders", "days(created_at")],
            vec![],
            "closing parenthesis",
        ),
        (
            vec![pair("orders", "week(created_at)")],
            vec![],
            "`week` is not a transform",
        ),
        (vec![], vec![pair("orders", "id up")], "[asc|desc]"),
        (
            vec![pair("invoices", "id")],
            vec![],
            "orders, sales.customers",
        ),
        (vec![pair("a.b.c", "id")], vec![], "not a table name"),
    ] {
        let e = set(partition_by, sort_by).unwrap_err().to_string();
        assert!(e.contains(message), "{e}");
        assert!(e.contains("--"), "{e}");
    }
    // Nothing was written by the refused calls.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), cleared);
}

#[test]
fn only_a_pipelines_tables_keep_their_order_when_written() {
    // A pipeline may itself be called `tables`: its keys still take the canonical order.
    let doc: serde_yaml::Value = serde_yaml::from_str(
        "skippr: {workspace: w}\npipelines:\n  tables:\n    data_sink: data_sinks.lake\n    data_source: data_sources.db\n    tables: {users: {sort_by: [id]}, key: {sort_by: [id]}}\n",
    )
    .unwrap();
    assert_eq!(
        emit::to_canonical_yaml(&doc),
        "skippr:\n  workspace: w\n\npipelines:\n  tables:\n    data_source: data_sources.db\n    data_sink: data_sinks.lake\n    tables:\n      users:\n        sort_by: [id]\n      key:\n        sort_by: [id]\n"
    );
}

#[path = "tests_rest.rs"]
mod rest;

#[path = "tests_source.rs"]
mod source;

#[path = "tests_query.rs"]
mod query;

#[test]
fn consistent_cuts_take_any_duration_of_a_second_or_more() {
    let with = |cuts: &str| {
        GOOD.replace(
            "    data_sink: data_sinks.lake\n",
            &format!("    data_sink: data_sinks.lake\n    consistent_cuts: {cuts}\n"),
        )
    };
    assert_eq!(load(GOOD).unwrap().pipelines[0].consistent_cuts, None);
    let c = load(&with("{every: 1d, keep: 7}")).unwrap();
    assert_eq!(
        c.pipelines[0].consistent_cuts,
        Some(crate::config::CutSettings {
            every: std::time::Duration::from_secs(86_400),
            keep: 7
        })
    );
    let c = load(&with("{}")).unwrap();
    let cuts = c.pipelines[0].consistent_cuts.unwrap();
    assert_eq!((cuts.every.as_secs(), cuts.keep), (3600, 48));

    let p = one_error(&with("{every: 500ms}"));
    assert_eq!(p.path, "pipelines.app.consistent_cuts.every");
    assert!(p.message.contains("at least 1s"), "{}", p.message);
    assert!(p.message.contains("`1h`"), "{}", p.message);
    let p = one_error(&with("{every: 1h, keep: 0}"));
    assert_eq!(p.path, "pipelines.app.consistent_cuts.keep");
    assert!(p.message.contains("between 1 and"), "{}", p.message);
    let p = one_error(&with("{every: 1h, kept: 3}"));
    assert_eq!(p.path, "pipelines.app.consistent_cuts.kept");
}

#[path = "tests_changelog.rs"]
mod changelog;
