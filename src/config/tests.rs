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
        let p = load(GOOD).unwrap().pipeline("app").unwrap().clone();
        assert_eq!(field(&p), 256 * 1024 * 1024, "{key}");
        let with = |v: &str| {
            GOOD.replace(
                "    data_sink: data_sinks.lake\n",
                &format!("    data_sink: data_sinks.lake\n    {key}: {v}\n"),
            )
        };
        let p = load(&with("8")).unwrap().pipeline("app").unwrap().clone();
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
