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
    let c = load(&text).unwrap();
    let p = c.pipeline("app").unwrap();
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
    let p = load(&text).unwrap().pipeline("app").unwrap().clone();
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(&path, &text).unwrap();
    let written = connect::apply(&path, None, None, None, None).unwrap();
    assert!(
        written.contains(
            "    tables:\n      users:\n        partition_by: ['day(created_at)', 'bucket(16, customer_id)']\n        sort_by: ['created_at desc']\n      orders:\n        sort_by: [id]\n"
        ),
        "{written}"
    );
    let before = Config::from_str(&path, &text, &env).unwrap();
    let after = Config::from_str(&path, &written, &env).unwrap();
    assert_eq!(before.pipelines[0].layouts, after.pipelines[0].layouts);
    // And writing it again changes nothing.
    assert_eq!(
        emit::to_canonical_yaml(&serde_yaml::from_str(&written).unwrap()),
        written
    );
}

#[test]
fn connect_pipeline_writes_layouts_and_refuses_bad_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(&path, GOOD).unwrap();
    let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
    let set = |partition_by: Vec<(String, String)>, sort_by: Vec<(String, String)>| {
        connect::apply(
            &path,
            None,
            None,
            None,
            Some(connect::Connect::Pipeline {
                pipeline: "app".into(),
                partition_by,
                sort_by,
                exclude_columns: Vec::new(),
            }),
        )
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

/// GOOD with `lines` added under its Postgres source (after `cdc_mode`, line 18).
fn with_source_keys(lines: &str) -> String {
    GOOD.replace(
        "      cdc_mode: snapshot_then_cdc\n",
        &format!("      cdc_mode: snapshot_then_cdc\n{lines}"),
    )
}

#[test]
fn heartbeat_retained_wal_and_failover_slot_default_and_round_trip() {
    use std::time::Duration;
    let p = load(GOOD).unwrap().pipeline("app").unwrap().clone();
    assert_eq!(p.source.heartbeat_interval, Duration::from_secs(60));
    assert_eq!(p.source.max_retained_wal, 10 << 30);
    assert!(!p.source.failover_slot);
    assert!(p.source.exclude_columns.is_empty());

    // Written in another order (and a flow list of columns with a quoted one): the canonical
    // writer puts each key in its place, and the file reads back the same.
    let text = with_source_keys(
        "      failover_slot: true\n      max_retained_wal: 512MB\n      heartbeat_interval: 30s\n",
    )
    .replace(
        "    data_sink: data_sinks.lake\n",
        "    data_sink: data_sinks.lake\n    tables:\n      sales.customers:\n        exclude_columns: [Internal_Note, '\"Secret\"']\n        sort_by: [id]\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(&path, &text).unwrap();
    let written = connect::apply(&path, None, None, None, None).unwrap();
    assert!(
        written.contains(
            "      cdc_mode: snapshot_then_cdc\n      heartbeat_interval: 30s\n      max_retained_wal: 512MB\n      failover_slot: true\n"
        ),
        "{written}"
    );
    assert!(
        written.contains(
            "    tables:\n      sales.customers:\n        sort_by: [id]\n        exclude_columns: [Internal_Note, '\"Secret\"']\n"
        ),
        "{written}"
    );
    for t in [text.as_str(), written.as_str()] {
        let c = Config::from_str(&path, t, &env).unwrap();
        let s = &c.pipeline("app").unwrap().source;
        assert_eq!(s.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(s.max_retained_wal, 512 << 20);
        assert!(s.failover_slot);
        // Bare names are folded to lower case, quoted ones kept.
        let customers = TableRef::parse("sales.customers").unwrap();
        assert_eq!(s.excluded(&customers), ["internal_note", "Secret"]);
        assert!(s.excluded(&TableRef::parse("orders").unwrap()).is_empty());
    }
    assert_eq!(
        emit::to_canonical_yaml(&serde_yaml::from_str(&written).unwrap()),
        written
    );

    // `0` turns the heartbeat off; a bare number is read as its text (a size in bytes).
    for zero in ["'0'", "0"] {
        let off = with_source_keys(&format!(
            "      heartbeat_interval: {zero}\n      max_retained_wal: 1073741824\n"
        ));
        let p = load(&off).unwrap().pipeline("app").unwrap().clone();
        assert_eq!(p.source.heartbeat_interval, Duration::ZERO);
        assert_eq!(p.source.max_retained_wal, 1 << 30);
    }
}

#[test]
fn bad_heartbeat_retained_wal_and_exclude_columns_name_the_key() {
    let p = one_error(&with_source_keys("      heartbeat_interval: 5x\n"));
    assert_eq!(p.path, "data_sources.app_db.Postgres.heartbeat_interval");
    assert_eq!(p.position.unwrap().line, 19);
    assert!(
        p.message.contains("`5x` is not a duration") && p.message.contains("`0` (no heartbeat)"),
        "{}",
        p.message
    );

    for bad in ["lots", "0", "'0'", "1.5GiB"] {
        let p = one_error(&with_source_keys(&format!(
            "      max_retained_wal: {bad}\n"
        )));
        assert_eq!(p.path, "data_sources.app_db.Postgres.max_retained_wal");
        assert_eq!(p.position.unwrap().line, 19);
        assert!(p.message.contains("is not a size"), "{}", p.message);
        assert!(p.message.contains("`10GiB`"), "{}", p.message);
    }

    let p = one_error(&with_source_keys("      heartbeat_interval: 30\n"));
    assert!(
        p.message.contains("`30` is not a duration"),
        "{}",
        p.message
    );
    let p = one_error(&with_source_keys("      heartbeat_interval: [1m]\n"));
    assert!(p.message.contains("wrong type"), "{}", p.message);

    let p = one_error(&with_source_keys("      failover_slot: maybe\n"));
    assert_eq!(p.path, "data_sources.app_db.Postgres.failover_slot");
    assert!(p.message.contains("wrong type"), "{}", p.message);

    // A column given twice (`Note` is folded to `note`), at its line and index.
    let p = one_error(&with_tables(
        "      orders:\n        exclude_columns:\n          - note\n          - Note\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.orders.exclude_columns[1]");
    assert_eq!(p.position.unwrap().line, 13);
    assert!(
        p.message
            .contains("`Note` is given twice: give each column once"),
        "{}",
        p.message
    );
    // Quoted names are kept as written: `"Note"` and `note` are two columns.
    let c = load(&with_tables(
        "      orders:\n        exclude_columns: [note, '\"Note\"']\n",
    ))
    .unwrap();
    let orders = TableRef::parse("orders").unwrap();
    assert_eq!(
        c.pipeline("app").unwrap().source.excluded(&orders),
        ["note", "Note"]
    );

    let p = one_error(&with_tables(
        "      orders:\n        exclude_columns: [note, 'two words']\n",
    ));
    assert_eq!(p.path, "pipelines.app.tables.orders.exclude_columns[1]");
    assert!(p.message.contains("is not a column name"), "{}", p.message);
}

#[test]
fn connect_pipeline_writes_and_refuses_excluded_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(&path, GOOD).unwrap();
    let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
    let set = |sort_by: Vec<(String, String)>, exclude_columns: Vec<(String, String)>| {
        connect::apply(
            &path,
            None,
            None,
            None,
            Some(connect::Connect::Pipeline {
                pipeline: "app".into(),
                partition_by: Vec::new(),
                sort_by,
                exclude_columns,
            }),
        )
    };
    let written = set(
        vec![pair("orders", "id")],
        vec![
            pair("orders", "internal_note"),
            pair("orders", "\"Secret\""),
        ],
    )
    .unwrap();
    assert!(
        written.contains("    tables:\n      orders:\n        sort_by: [id]\n        exclude_columns: [internal_note, '\"Secret\"']\n\n"),
        "{written}"
    );
    let c = Config::from_str(&path, &written, &env).unwrap();
    let orders = TableRef::parse("orders").unwrap();
    assert_eq!(
        c.pipeline("app").unwrap().source.excluded(&orders),
        ["internal_note", "Secret"]
    );
    // The columns given for a table replace its list; the same call again changes nothing.
    let replaced = set(vec![], vec![pair("orders", "Internal_Note")]).unwrap();
    assert!(
        replaced.contains("        sort_by: [id]\n        exclude_columns: [Internal_Note]\n"),
        "{replaced}"
    );
    assert_eq!(
        set(vec![], vec![pair("orders", "Internal_Note")]).unwrap(),
        replaced
    );
    // `orders=` clears the list, and the other keys stay.
    let cleared = set(vec![], vec![pair("orders", "")]).unwrap();
    assert!(
        cleared.contains("      orders:\n        sort_by: [id]\n\n"),
        "{cleared}"
    );

    for (given, message) in [
        (
            vec![pair("orders", "note"), pair("orders", "NOTE")],
            "--exclude-column 'orders=NOTE': `NOTE` is given twice: give each column once",
        ),
        (
            vec![pair("orders", "two words")],
            "--exclude-column 'orders=two words': `two words` is not a column name",
        ),
        (vec![pair("invoices", "note")], "orders, sales.customers"),
        (vec![pair("a.b.c", "note")], "not a table name"),
    ] {
        let e = set(vec![], given).unwrap_err().to_string();
        assert!(e.contains(message), "{e}");
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

/// GOOD with its data sink `lake` replaced by `sink` (the lines under `lake:`), plus `more`
/// at the end (a `schema_sinks:` section, say).
fn with_sink(sink: &str, more: &str) -> String {
    format!(
        "{}{sink}{more}",
        GOOD.replace("    LocalIceberg:\n      warehouse: ./warehouse\n", "")
    )
}

fn rest_env(name: &str) -> Option<String> {
    match name {
        "CLIENT_ID" => Some("skippr".into()),
        "CLIENT_SECRET" => Some("Cs-very-secret".into()),
        "CATALOG_TOKEN" => Some("Tk-very-secret".into()),
        "MINIO_PORT" => Some("9000".into()),
        other => env(other),
    }
}

fn load_rest(text: &str) -> Result<Config, ConfigErrors> {
    Config::from_str(Path::new("/tmp/cfg/skippr.yml"), text, &rest_env)
}

/// The problems of `text`, as (path, message), with no secret of `rest_env` in any.
fn rest_problems(text: &str) -> Vec<(String, String)> {
    let errs = load_rest(text).expect_err("the config must be refused");
    let shown = errs.to_string();
    for secret in ["Cs-very-secret", "Tk-very-secret"] {
        assert!(!shown.contains(secret), "a secret is printed: {shown}");
    }
    errs.0.into_iter().map(|p| (p.path, p.message)).collect()
}

fn rest_problem(text: &str, path: &str, words: &[&str]) {
    let problems = rest_problems(text);
    let found = problems.iter().find(|(p, _)| p == path);
    let Some((_, message)) = found else {
        panic!("no problem at {path}: {problems:?}");
    };
    for w in words {
        assert!(
            message.contains(w),
            "{path}: {message:?} does not say {w:?}"
        );
    }
}

const REST: &str = "    RestIceberg:\n      uri: https://catalog.example.com/api/catalog\n      warehouse: analytics_wh\n      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n      scope: PRINCIPAL_ROLE:ALL\n      properties: {s3.endpoint: 'http://127.0.0.1:${MINIO_PORT}', s3.path-style-access: true, s3.connect-timeout: 5}\n";

#[test]
fn loads_a_rest_catalog_sink_with_env_references() {
    let c = load_rest(&with_sink(REST, "")).unwrap();
    let SinkConfig::RestIceberg {
        name,
        kind,
        sink,
        namespace,
    } = &c.pipelines[0].sink
    else {
        panic!("{:?}", c.pipelines[0].sink);
    };
    assert_eq!(
        (name.as_str(), *kind, namespace),
        ("lake", "RestIceberg", &None)
    );
    assert_eq!(sink.uri, "https://catalog.example.com/api/catalog");
    assert_eq!(sink.warehouse.as_deref(), Some("analytics_wh"));
    assert_eq!(sink.credential.as_deref(), Some("skippr:Cs-very-secret"));
    assert_eq!(sink.scope.as_deref(), Some("PRINCIPAL_ROLE:ALL"));
    // Booleans and numbers are taken as their text; ${VAR} works inside a property too.
    assert_eq!(sink.properties["s3.endpoint"], "http://127.0.0.1:9000");
    assert_eq!(sink.properties["s3.path-style-access"], "true");
    assert_eq!(sink.properties["s3.connect-timeout"], "5");
    // The secrets never show in a debug print of the configuration.
    let debug = format!("{:?}", c.pipelines);
    assert!(!debug.contains("Cs-very-secret"), "{debug}");
    assert!(debug.contains("analytics_wh"), "{debug}");
    // A bearer token instead.
    let token = REST
        .replace(
            "      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n      scope: PRINCIPAL_ROLE:ALL\n",
            "      token: ${CATALOG_TOKEN}\n",
        )
        .replace("      properties: {s3.endpoint: 'http://127.0.0.1:${MINIO_PORT}', s3.path-style-access: true, s3.connect-timeout: 5}\n", "      properties: {s3.secret-access-key: '${CATALOG_TOKEN}'}\n");
    let c = load_rest(&with_sink(&token, "")).unwrap();
    let SinkConfig::RestIceberg { sink, .. } = &c.pipelines[0].sink else {
        panic!("not a REST sink");
    };
    assert_eq!(sink.token.as_deref(), Some("Tk-very-secret"));
    let debug = format!("{sink:?}");
    assert!(!debug.contains("Tk-very-secret"), "{debug}");
}

#[test]
fn the_aws_shortcuts_are_rest_catalogs() {
    let c = load_rest(&with_sink(
        "    S3TablesIceberg:\n      table_bucket_arn: arn:aws:s3tables:us-east-1:111122223333:bucket/analytics\n      region: us-east-1\n",
        "",
    ))
    .unwrap();
    let SinkConfig::RestIceberg {
        kind,
        sink,
        namespace,
        ..
    } = &c.pipelines[0].sink
    else {
        panic!("not a REST sink");
    };
    assert_eq!(*kind, "S3TablesIceberg");
    assert_eq!(sink.uri, "https://s3tables.us-east-1.amazonaws.com/iceberg");
    assert_eq!(
        sink.warehouse.as_deref(),
        Some("arn:aws:s3tables:us-east-1:111122223333:bucket/analytics")
    );
    let sigv4 = sink.sigv4.as_ref().unwrap();
    assert_eq!(
        (sigv4.region.as_str(), sigv4.service.as_str()),
        ("us-east-1", "s3tables")
    );
    assert_eq!(namespace, &None);

    let c = load_rest(&with_sink(
        "    GlueRestIceberg: {glue_database_name: analytics_db, region: eu-west-1}\n",
        "",
    ))
    .unwrap();
    let SinkConfig::RestIceberg {
        kind,
        sink,
        namespace,
        ..
    } = &c.pipelines[0].sink
    else {
        panic!("not a REST sink");
    };
    assert_eq!(*kind, "GlueRestIceberg");
    assert_eq!(sink.uri, "https://glue.eu-west-1.amazonaws.com/iceberg");
    assert_eq!(sink.sigv4.as_ref().unwrap().service, "glue");
    assert_eq!(namespace.as_deref(), Some("analytics_db"));
}

#[test]
fn rest_catalog_settings_are_checked() {
    let at = "data_sinks.lake.RestIceberg";
    let bad = |from: &str, to: &str| with_sink(&REST.replace(from, to), "");
    let uri = "https://catalog.example.com/api/catalog";
    for (text, field, words) in [
        (
            bad(uri, "catalog.example.com"),
            "uri",
            &["http(s) URL", "https://"][..],
        ),
        (
            bad(uri, "ftp://catalog.example.com"),
            "uri",
            &["http(s) URL"][..],
        ),
        (
            bad(uri, "https://catalog.example.com/api/catalog/v1/"),
            "uri",
            &["appends", "write https://catalog.example.com/api/catalog"][..],
        ),
        (
            bad(uri, "https://skippr:${CLIENT_SECRET}@catalog.example.com/"),
            "uri",
            &["user name or password", "`credential`"][..],
        ),
        (
            bad("${CLIENT_ID}:${CLIENT_SECRET}", "${CLIENT_SECRET}"),
            "credential",
            &["<client id>:<client secret>"][..],
        ),
        (
            bad("${CLIENT_ID}:${CLIENT_SECRET}", "'${CLIENT_ID}:'"),
            "credential",
            &["<client id>:<client secret>"][..],
        ),
        (
            bad(
                "      scope: PRINCIPAL_ROLE:ALL\n",
                "      token: ${CATALOG_TOKEN}\n",
            ),
            "token",
            &["exclude each other", "credential"][..],
        ),
        (
            bad(
                "      scope: PRINCIPAL_ROLE:ALL\n",
                "      sigv4: {region: us-east-1, service: s3tables}\n",
            ),
            "credential",
            &["sigv4", "remove it"][..],
        ),
        (
            bad(
                "      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n",
                "      sigv4: {region: us-east-1, service: lambda}\n",
            ),
            "sigv4.service",
            &["`lambda`", "s3tables, glue"][..],
        ),
        (
            bad(
                "      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n",
                "      sigv4: {region: ' ', service: glue}\n",
            ),
            "sigv4.region",
            &["must not be empty"][..],
        ),
        (
            bad("{s3.endpoint:", "{'': x, s3.endpoint:"),
            "properties.",
            &["needs a name"][..],
        ),
        (
            bad("      warehouse: analytics_wh\n", "      warehouse: ''\n"),
            "warehouse",
            &["must not be empty"][..],
        ),
        (
            bad("      scope: PRINCIPAL_ROLE:ALL\n", "      scope: ''\n"),
            "scope",
            &["must not be empty"][..],
        ),
    ] {
        rest_problem(&text, &format!("{at}.{field}"), words);
    }
    // A property value must be text, not a list.
    rest_problem(
        &bad("s3.connect-timeout: 5", "s3.connect-timeout: [5]"),
        &format!("{at}.properties.s3.connect-timeout"),
        &["wrong type"],
    );
    // A missing uri and an unknown key are named.
    rest_problem(
        &bad("      uri: https://catalog.example.com/api/catalog\n", ""),
        "data_sinks.lake.RestIceberg",
        &["uri"],
    );
    rest_problem(
        &bad("      scope:", "      scopes:"),
        &format!("{at}.scopes"),
        &["scope"],
    );
}

#[test]
fn aws_shortcut_settings_are_checked() {
    let s3 = |arn: &str, region: &str| {
        with_sink(
            &format!("    S3TablesIceberg: {{table_bucket_arn: '{arn}', region: '{region}'}}\n"),
            "",
        )
    };
    let at = "data_sinks.lake.S3TablesIceberg";
    let good_arn = "arn:aws:s3tables:us-east-1:111122223333:bucket/analytics";
    assert!(load_rest(&s3(good_arn, "us-east-1")).is_ok());
    for arn in [
        "arn:aws:s3:::analytics",
        "arn:aws:s3tables:us-east-1:1111:bucket/analytics",
        "arn:aws:s3tables:us-east-1:111122223333:table/analytics",
        "arn:aws:s3tables:us-east-1:111122223333:bucket/Analytics",
        "analytics",
    ] {
        rest_problem(
            &s3(arn, "us-east-1"),
            &format!("{at}.table_bucket_arn"),
            &[
                "not a table bucket ARN",
                "arn:aws:s3tables:<region>:<account>:bucket/<name>",
            ],
        );
    }
    rest_problem(
        &s3(good_arn, "eu-west-1"),
        &format!("{at}.table_bucket_arn"),
        &["us-east-1", "eu-west-1"],
    );
    rest_problem(
        &s3(good_arn, " "),
        &format!("{at}.region"),
        &["must not be empty"],
    );
    let glue = |db: &str, region: &str| {
        with_sink(
            &format!("    GlueRestIceberg: {{glue_database_name: '{db}', region: '{region}'}}\n"),
            "",
        )
    };
    rest_problem(
        &glue("", "us-east-1"),
        "data_sinks.lake.GlueRestIceberg.glue_database_name",
        &["must not be empty"],
    );
    rest_problem(
        &glue("analytics", ""),
        "data_sinks.lake.GlueRestIceberg.region",
        &["must not be empty"],
    );
    // Two connector keys: the message lists every kind.
    rest_problem(
        &with_sink(
            &format!("{REST}    GlueRestIceberg: {{glue_database_name: a, region: r}}\n"),
            "",
        ),
        "data_sinks.lake",
        &["exactly one connector key", SINK_KINDS],
    );
}

#[test]
fn a_rest_sink_registers_its_schemas_in_its_own_catalog() {
    let linked = format!("{REST}    schema_sink: schema_sinks.s\n");
    let schema = |sink: &str| format!("\nschema_sinks:\n  s:\n{sink}");
    // The same catalog and warehouse, written otherwise (a token, no properties): fine.
    let same = "    RestIceberg: {uri: 'https://catalog.example.com/api/catalog/', warehouse: analytics_wh, token: x}\n";
    let c = load_rest(&with_sink(&linked, &schema(same))).unwrap();
    assert_eq!(c.pipelines[0].schema_sink.as_deref(), Some("s"));
    for other in [
        "    RestIceberg: {uri: 'https://other.example.com/api/catalog', warehouse: analytics_wh}\n",
        "    RestIceberg: {uri: 'https://catalog.example.com/api/catalog'}\n",
        "    LocalIceberg: {warehouse: ./warehouse}\n",
    ] {
        rest_problem(
            &with_sink(&linked, &schema(other)),
            "data_sinks.lake.schema_sink",
            &[
                "registers its schemas in its own catalog",
                "same uri and warehouse",
                "analytics_wh",
            ],
        );
    }
    // A GlueRestIceberg sink: the same Glue database.
    let glue = "    GlueRestIceberg: {glue_database_name: a, region: us-east-1}\n    schema_sink: schema_sinks.s\n";
    assert!(load_rest(&with_sink(
        glue,
        &schema("    GlueRestIceberg: {glue_database_name: a, region: us-east-1}\n")
    ))
    .is_ok());
    rest_problem(
        &with_sink(
            glue,
            &schema("    GlueRestIceberg: {glue_database_name: b, region: us-east-1}\n"),
        ),
        "data_sinks.lake.schema_sink",
        &["same glue_database_name and region", "a, us-east-1"],
    );
    // The shortcut and the RestIceberg it stands for are one catalog.
    let s3 = "    S3TablesIceberg: {table_bucket_arn: 'arn:aws:s3tables:us-east-1:111122223333:bucket/analytics', region: us-east-1}\n    schema_sink: schema_sinks.s\n";
    assert!(load_rest(&with_sink(
        s3,
        &schema("    RestIceberg: {uri: 'https://s3tables.us-east-1.amazonaws.com/iceberg', warehouse: 'arn:aws:s3tables:us-east-1:111122223333:bucket/analytics', sigv4: {region: us-east-1, service: s3tables}}\n")
    ))
    .is_ok());
    // Schema sinks are checked as data sinks are.
    rest_problem(
        &with_sink(REST, &schema("    RestIceberg: {uri: 'file:///tmp'}\n")),
        "schema_sinks.s.RestIceberg.uri",
        &["http(s) URL"],
    );
}

#[test]
fn rest_catalog_keys_are_written_in_their_order() {
    let doc: serde_yaml::Value = serde_yaml::from_str(
        "skippr: {workspace: w}\ndata_sinks:\n  lake:\n    schema_sink: schema_sinks.s\n    RestIceberg: {properties: {z.last: '1', region: x, a.first: '2'}, sigv4: {service: glue, region: r}, scope: s, token: t, credential: c, warehouse: w, uri: 'https://h/x'}\n  t:\n    S3TablesIceberg: {region: r, table_bucket_arn: a}\n  g:\n    GlueRestIceberg: {region: r, glue_database_name: d}\n",
    )
    .unwrap();
    assert_eq!(
        emit::to_canonical_yaml(&doc),
        "skippr:\n  workspace: w\n\ndata_sinks:\n  lake:\n    RestIceberg:\n      uri: https://h/x\n      warehouse: w\n      credential: c\n      token: t\n      scope: s\n      sigv4:\n        region: r\n        service: glue\n      properties:\n        z.last: '1'\n        region: x\n        a.first: '2'\n    schema_sink: schema_sinks.s\n  t:\n    S3TablesIceberg:\n      table_bucket_arn: a\n      region: r\n  g:\n    GlueRestIceberg:\n      glue_database_name: d\n      region: r\n"
    );
}

#[test]
fn connect_switches_a_rest_catalog_between_ways_in_and_merges_properties() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skippr.yml");
    std::fs::write(
        &path,
        GOOD.replace(
            "      warehouse: ./warehouse\n",
            "      warehouse: ./warehouse\n  other:\n    LocalIceberg: {warehouse: ./w}\n",
        ),
    )
    .unwrap();
    let text = |pairs: &[(&str, &str)]| -> serde_yaml::Mapping {
        pairs
            .iter()
            .map(|(k, v)| (serde_yaml::Value::from(*k), serde_yaml::Value::from(*v)))
            .collect()
    };
    let sink = |fields: serde_yaml::Mapping| {
        connect::apply(
            &path,
            None,
            None,
            None,
            Some(connect::Connect::DataSink {
                pipeline: "rest".into(),
                name: "cat".into(),
                kind: "RestIceberg",
                fields,
            }),
        )
        .unwrap()
    };
    let mut first = text(&[
        ("uri", "https://h/api/catalog"),
        ("credential", "${CLIENT_ID}:${CLIENT_SECRET}"),
        ("scope", "PRINCIPAL_ROLE:ALL"),
    ]);
    first.insert(
        "properties".into(),
        serde_yaml::Value::Mapping(text(&[
            ("s3.endpoint", "http://m:9000"),
            ("s3.region", "r"),
        ])),
    );
    let written = sink(first);
    assert!(written.contains("    RestIceberg:\n      uri: https://h/api/catalog\n      credential: ${CLIENT_ID}:${CLIENT_SECRET}\n      scope: PRINCIPAL_ROLE:ALL\n      properties:\n        s3.endpoint: http://m:9000\n        s3.region: r\n"), "{written}");
    // A token replaces the client credentials and their scope; a property is updated, one
    // removed (null), the others kept.
    let mut second = text(&[
        ("uri", "https://h/api/catalog"),
        ("token", "${CATALOG_TOKEN}"),
    ]);
    let mut props = text(&[("s3.region", "us-east-1")]);
    props.insert("s3.endpoint".into(), serde_yaml::Value::Null);
    second.insert("properties".into(), serde_yaml::Value::Mapping(props));
    let written = sink(second);
    assert!(written.contains("    RestIceberg:\n      uri: https://h/api/catalog\n      token: ${CATALOG_TOKEN}\n      properties:\n        s3.region: us-east-1\n"), "{written}");
    // SigV4 replaces the token; removing the last property removes `properties`.
    let mut third = text(&[("uri", "https://h/api/catalog")]);
    third.insert(
        "sigv4".into(),
        serde_yaml::Value::Mapping(text(&[("region", "us-east-1"), ("service", "glue")])),
    );
    let mut props = serde_yaml::Mapping::new();
    props.insert("s3.region".into(), serde_yaml::Value::Null);
    third.insert("properties".into(), serde_yaml::Value::Mapping(props));
    let written = sink(third);
    assert!(written.ends_with("    RestIceberg:\n      uri: https://h/api/catalog\n      sigv4:\n        region: us-east-1\n        service: glue\n"), "{written}");
}

#[test]
fn names_of_pipelines_and_sinks_keep_the_order_they_were_added_in() {
    // Names that are also known keys (`tables`, `warehouse`) are not moved ahead.
    let doc: serde_yaml::Value = serde_yaml::from_str(
        "skippr: {workspace: w}\npipelines: {zeta: {data_sink: data_sinks.lake}, tables: {data_sink: data_sinks.warehouse}}\ndata_sinks: {lake: {LocalIceberg: {warehouse: ./a}}, warehouse: {LocalIceberg: {warehouse: ./b}}}\n",
    )
    .unwrap();
    assert_eq!(
        emit::to_canonical_yaml(&doc),
        "skippr:\n  workspace: w\n\npipelines:\n  zeta:\n    data_sink: data_sinks.lake\n  tables:\n    data_sink: data_sinks.warehouse\n\ndata_sinks:\n  lake:\n    LocalIceberg:\n      warehouse: ./a\n  warehouse:\n    LocalIceberg:\n      warehouse: ./b\n"
    );
}

/// GOOD with a `skippr.query` section of `lines` (each indented under `query:`).
fn with_query(lines: &str) -> String {
    let body: String = lines
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect::<Vec<_>>()
        .concat();
    GOOD.replace(
        "  skipprd_el_storage_mode: local\n",
        &format!("  skipprd_el_storage_mode: local\n  query:\n{body}"),
    )
}

#[test]
fn server_memory_spill_and_admission_default_and_round_trip() {
    let c = load(GOOD).unwrap();
    assert_eq!(c.query.max_memory, model::default_max_memory().max(1 << 30));
    assert_eq!(c.query.spill_path, None);
    assert_eq!(
        c.query.max_concurrent_statements,
        model::default_max_concurrent_statements()
    );
    assert_eq!(c.query.max_query_memory, 1 << 30);

    let text = with_query(
        "max_query_memory: 64MiB\ntarget_partitions: 4\nmax_memory: 96MiB\nspill_path: ./scratch/../spill\nmax_concurrent_statements: 3",
    );
    let c = load(&text).unwrap();
    assert_eq!(c.query.max_query_memory, 64 << 20);
    assert_eq!(c.query.max_memory, 96 << 20);
    assert_eq!(
        c.query.spill_path.as_deref(),
        Some(Path::new("/tmp/cfg/spill"))
    );
    assert_eq!(c.query.max_concurrent_statements, 3);
    // The canonical writer keeps them, in KEY_ORDER, and reading that back changes nothing.
    let written = emit::to_canonical_yaml(&serde_yaml::from_str(&text).unwrap());
    assert!(
        written.contains(
            "  query:\n    max_query_memory: 64MiB\n    target_partitions: 4\n    max_memory: 96MiB\n    spill_path: ./scratch/../spill\n    max_concurrent_statements: 3\n"
        ),
        "{written}"
    );
    let again = load(&written).unwrap().query;
    assert_eq!(
        (
            again.max_query_memory,
            again.max_memory,
            again.spill_path,
            again.max_concurrent_statements
        ),
        (64 << 20, 96 << 20, c.query.spill_path.clone(), 3)
    );
    // The key order of the writer holds whatever order the file had.
    let shuffled = with_query(
        "max_concurrent_statements: 3\nspill_path: ./scratch/../spill\nmax_memory: 96MiB\ntarget_partitions: 4\nmax_query_memory: 64MiB",
    );
    assert_eq!(
        emit::to_canonical_yaml(&serde_yaml::from_str(&shuffled).unwrap()),
        written
    );

    // `max_memory` alone below the default `max_query_memory` (1GiB) is a whole setting:
    // one statement may then use all of it.
    let c = load(&with_query("max_memory: 512MiB")).unwrap();
    assert_eq!(
        (c.query.max_memory, c.query.max_query_memory),
        (512 << 20, 512 << 20)
    );
    let c = load(&with_query("max_memory: 8GiB")).unwrap();
    assert_eq!(
        (c.query.max_memory, c.query.max_query_memory),
        (8 << 30, 1 << 30)
    );
    // Without `max_memory`, the default pool is at least one statement's limit.
    let c = load(&with_query("max_query_memory: 64TiB")).unwrap();
    assert_eq!(c.query.max_memory, 64 << 40);
}

#[test]
fn admins_and_the_slow_statement_log_default_off_and_round_trip() {
    let c = load(GOOD).unwrap();
    assert!(c.query.admins.is_empty());
    assert_eq!(c.query.log_min_duration, None);
    let text = with_query(
        "users:\n  - name: ann\n    password: a\n    admin: true\n  - name: bob\n    password: b\n    admin: false\n  - name: cy\n    password: c\nlog_min_duration: 250ms",
    );
    let c = load(&text).unwrap();
    assert_eq!(
        c.query.admins,
        std::collections::HashSet::from(["ann".to_string()])
    );
    assert_eq!(c.query.users.len(), 3);
    assert_eq!(
        c.query.log_min_duration,
        Some(std::time::Duration::from_millis(250))
    );
    // The canonical writer keeps them, `admin` after the password.
    let written = emit::to_canonical_yaml(&serde_yaml::from_str(&text).unwrap());
    assert!(
        written.contains("- name: ann\n        password: a\n        admin: true\n"),
        "{written}"
    );
    assert!(written.contains("log_min_duration: 250ms"), "{written}");
    let again = load(&written).unwrap().query;
    assert_eq!(
        (again.admins, again.log_min_duration),
        (c.query.admins.clone(), c.query.log_min_duration)
    );
    // `0ms` logs every statement.
    let c = load(&with_query("log_min_duration: 0ms")).unwrap();
    assert_eq!(c.query.log_min_duration, Some(std::time::Duration::ZERO));
    let p = one_error(&with_query("log_min_duration: soon"));
    assert_eq!(p.path, "skippr.query.log_min_duration", "{p}");
    assert!(p.to_string().contains("`soon` is not a duration"), "{p}");
    let p = one_error(&with_query(
        "users:\n  - name: ann\n    password: a\n    admin: yes please",
    ));
    assert!(p.path.starts_with("skippr.query.users"), "{p}");
}

#[test]
fn bad_server_memory_spill_and_admission_name_the_key() {
    let cases: [(&str, &str, &[&str]); 6] = [
        (
            "max_memory: lots",
            "skippr.query.max_memory",
            &["`lots` is not a size of at least 16MiB", "`4GiB`"],
        ),
        (
            "max_memory: 1MiB",
            "skippr.query.max_memory",
            &["`1MiB` is not a size of at least 16MiB"],
        ),
        (
            "max_query_memory: 256MiB\nmax_memory: 128MiB",
            "skippr.query.max_memory",
            &[
                "`128MiB` is less than skippr.query.max_query_memory",
                "raise max_memory or lower max_query_memory",
            ],
        ),
        (
            "max_concurrent_statements: 0",
            "skippr.query.max_concurrent_statements",
            &["0 is not between 1 and 10000"],
        ),
        (
            "max_concurrent_statements: 10001",
            "skippr.query.max_concurrent_statements",
            &["10001 is not between 1 and 10000"],
        ),
        (
            "spill_path: ''",
            "skippr.query.spill_path",
            &["must not be empty: give a folder, or leave the key out"],
        ),
    ];
    for (lines, path, words) in cases {
        let p = one_error(&with_query(lines));
        assert_eq!(p.path, path, "{lines}: {p}");
        // The line of the key itself (`query:` is line 4 of the file).
        let index = lines
            .lines()
            .position(|l| path.ends_with(l.split(':').next().unwrap()))
            .unwrap();
        assert_eq!(
            p.position.map(|pos| pos.line),
            Some(5 + index),
            "{lines}: {p}"
        );
        for w in words {
            assert!(p.message.contains(w), "{lines}: {p}");
        }
    }
    // A blank folder too; and an explicit `max_query_memory` equal to `max_memory` is fine.
    let p = one_error(&with_query("spill_path: '  '"));
    assert_eq!(p.path, "skippr.query.spill_path", "{p}");
    assert!(load(&with_query("max_query_memory: 96MiB\nmax_memory: 96MiB")).is_ok());
}
