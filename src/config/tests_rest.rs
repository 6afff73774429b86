//! Configuration tests, the REST catalog sinks (`RestIceberg`, `S3TablesIceberg`,
//! `GlueRestIceberg`): loading, checks, the canonical writer and `connect`.

use super::*;

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

/// The REST catalog sink of `c`'s first pipeline: its name, the connector key it was
/// written with, its settings and its namespace.
fn rest_sink(c: &Config) -> (&str, &'static str, &RestIcebergSink, &Option<String>) {
    let SinkConfig::RestIceberg {
        name,
        kind,
        sink,
        namespace,
    } = &c.pipelines[0].sink
    else {
        panic!("not a REST sink: {:?}", c.pipelines[0].sink);
    };
    (name, kind, sink, namespace)
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
    let (name, kind, sink, namespace) = rest_sink(&c);
    assert_eq!((name, kind, namespace), ("lake", "RestIceberg", &None));
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
    let (_, _, sink, _) = rest_sink(&c);
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
    let (_, kind, sink, namespace) = rest_sink(&c);
    assert_eq!(kind, "S3TablesIceberg");
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
    let (_, kind, sink, namespace) = rest_sink(&c);
    assert_eq!(kind, "GlueRestIceberg");
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
