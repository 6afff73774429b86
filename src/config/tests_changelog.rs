//! Configuration tests, `pipelines.<p>.tables.<t>.changelog`: the name each changelog table
//! gets, the names and values refused (each at its line, with the fix), and what
//! `connect pipeline --changelog` writes.

use std::collections::BTreeMap;

use super::*;

fn changelogs(text: &str) -> BTreeMap<String, String> {
    app(text)
        .changelogs
        .iter()
        .map(|(t, n)| (t.to_string(), n.clone()))
        .collect()
}

/// Asserts the changelog table each `(table, name)` of `want` gets in pipeline `p`.
fn assert_changelogs(p: &PipelineConfig, want: &[(&str, &str)]) {
    for (table, name) in want {
        assert_eq!(
            p.changelog(&TableRef::parse(table).unwrap()),
            Some(*name),
            "{table}"
        );
    }
}

/// The one problem of `text`, asserted to be at `path`, on `line`.
fn refused_at(text: &str, path: &str, line: usize) -> Problem {
    let p = one_error(text);
    assert_eq!(p.path, path, "{}", p.message);
    assert_eq!(p.position.map(|at| at.line), Some(line), "{p}");
    p
}

#[test]
fn a_changelog_is_named_after_its_table_or_as_given() {
    let text = with_tables(
        "      orders:\n        changelog: true\n      sales.customers:\n        sort_by: [id]\n        changelog: true\n",
    );
    assert_changelogs(
        &app(&text),
        &[
            ("orders", "orders_changelog"),
            ("sales.customers", "sales_customers_changelog"),
        ],
    );

    // `{table: name}` names it; `false`, or no key, is no changelog.
    let named = changelogs(&with_tables(
        "      public.orders:\n        changelog: {table: orders_history}\n      sales.customers:\n        changelog: false\n",
    ));
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named["public.orders"], "orders_history");
    assert!(changelogs(GOOD).is_empty());
    let block = changelogs(&with_tables(
        "      orders:\n        changelog:\n          table: ' orders_history '\n",
    ));
    assert_eq!(block["public.orders"], "orders_history");
}

#[test]
fn changelogs_round_trip_through_the_canonical_writer() {
    let text = with_tables(
        "      orders:\n        changelog: {table: orders_history}\n        sort_by: [id]\n      sales.customers:\n        changelog: true\n",
    );
    let written = rewritten(&text, |c| c.pipelines[0].changelogs.clone());
    assert!(
        written.contains(
            "    tables:\n      orders:\n        sort_by: [id]\n        changelog:\n          table: orders_history\n      sales.customers:\n        changelog: true\n"
        ),
        "{written}"
    );
}

#[test]
fn a_name_no_catalog_takes_is_refused_at_its_line() {
    for bad in [
        "Orders_History",
        "'orders history'",
        "1orders",
        "orders-history",
    ] {
        let p = refused_at(
            &with_tables(&format!(
                "      orders:\n        changelog:\n          table: {bad}\n"
            )),
            "pipelines.app.tables.orders.changelog.table",
            12,
        );
        let shown = bad.trim_matches('\'');
        assert_eq!(
            p.message,
            format!("`{shown}` is not a table name every catalog takes: use lower-case letters, digits and underscores, e.g. `orders_history`")
        );
    }
    let p = refused_at(
        &with_tables("      orders:\n        changelog: {table: ' '}\n"),
        "pipelines.app.tables.orders.changelog.table",
        11,
    );
    assert_eq!(
        p.message,
        "the changelog table needs a name: use lower-case letters, digits and underscores, e.g. `orders_history`, or write `changelog: true` for `<table>_changelog`"
    );
}

#[test]
fn a_value_other_than_true_false_or_a_table_is_refused_with_the_forms() {
    let forms = "is not `true`, `false` or `{table: <name>}`: write `changelog: true` for a changelog table named `<table>_changelog`, or";
    for (value, path, message) in [
        // An unknown key inside.
        (
            "{name: orders_history}",
            "pipelines.app.tables.orders.changelog.name",
            "unknown field `name`, expected `table`".to_string(),
        ),
        // No name.
        (
            "{}",
            "pipelines.app.tables.orders.changelog",
            "missing required field `table`".to_string(),
        ),
        // A name without `{table: ...}`: the message shows the form with that name.
        (
            "orders_history",
            "pipelines.app.tables.orders.changelog",
            format!("`orders_history` {forms} `changelog: {{table: orders_history}}` to name it"),
        ),
        // `yes` is text to skipprd's YAML reader (YAML 1.2), not `true`, and no name.
        (
            "yes",
            "pipelines.app.tables.orders.changelog",
            format!("`yes` {forms} `changelog: {{table: <name>}}` to name it"),
        ),
        (
            "1",
            "pipelines.app.tables.orders.changelog",
            "wrong type: found integer `1`, expected `true`, `false` or `{table: <name>}`"
                .to_string(),
        ),
        (
            "[orders_history]",
            "pipelines.app.tables.orders.changelog",
            "wrong type: found sequence, expected `true`, `false` or `{table: <name>}`".to_string(),
        ),
    ] {
        let p = refused_at(
            &with_tables(&format!("      orders:\n        changelog: {value}\n")),
            path,
            11,
        );
        assert!(p.message.contains(&message), "{value}: {}", p.message);
    }
}

#[test]
fn a_changelog_named_like_a_table_the_pipeline_writes_is_refused() {
    // The Iceberg table of a table the source follows.
    let p = refused_at(
        &with_tables("      orders:\n        changelog: {table: sales_customers}\n"),
        "pipelines.app.tables.orders.changelog.table",
        11,
    );
    assert_eq!(
        p.message,
        "the changelog of `orders` would be Iceberg table `sales_customers`, which is already the Iceberg table of `sales.customers`: give the changelog table another name"
    );
    // The default name, taken by a table the source follows.
    let p = refused_at(
        &with_tables("      orders:\n        changelog: true\n")
            .replace("[orders, sales.customers]", "[orders, orders_changelog]"),
        "pipelines.app.tables.orders.changelog",
        11,
    );
    assert_eq!(
        p.message,
        "the changelog of `orders` would be Iceberg table `orders_changelog`, which is already the Iceberg table of `orders_changelog`: name it yourself with `changelog: {table: <name>}`"
    );
    // Two changelogs of one name: the second is refused.
    let p = refused_at(&with_tables(
        "      orders:\n        changelog: {table: history}\n      sales.customers:\n        changelog: {table: history}\n",
    ), "pipelines.app.tables.sales.customers.changelog.table", 13);
    assert!(
        p.message.ends_with(
            "which is already the changelog of `orders`: give the changelog table another name"
        ),
        "{}",
        p.message
    );
}

#[test]
fn a_changelog_another_pipeline_writes_is_refused() {
    // Pipeline `billing` writes `orders_changelog` from its own table into the same warehouse.
    let text = with_tables("      orders:\n        changelog: true\n")
        .replace(
            "data_sources:\n",
            "  billing:\n    data_source: data_sources.billing_db\n    data_sink: data_sinks.lake\n\ndata_sources:\n  billing_db:\n    Postgres:\n      host: 127.0.0.1\n      user: u\n      database: billing\n      tables: [orders_changelog]\n",
        );
    let p = refused_at(&text, "pipelines.billing", 13);
    assert!(
        p.message.contains("Iceberg table `orders_changelog`")
            && p.message.contains("(from the changelog of public.orders)")
            && p.message
                .contains("two pipelines must never write one table"),
        "{}",
        p.message
    );
}

#[test]
fn a_snapshot_only_source_has_no_changes_to_record() {
    let text = with_tables("      orders:\n        changelog: true\n")
        .replace("cdc_mode: snapshot_then_cdc", "cdc_mode: snapshot_only");
    let p = refused_at(&text, "pipelines.app.tables.orders.changelog", 11);
    assert_eq!(
        p.message,
        "a changelog records the changes replication brings, and data source `app_db` has `cdc_mode: snapshot_only`: set `cdc_mode: snapshot_then_cdc` (or `cdc_only`), or remove `changelog`"
    );
    // `changelog: false` asks for nothing.
    let off = text.replace("changelog: true", "changelog: false");
    assert!(load(&off).is_ok());
}

#[test]
fn connect_pipeline_turns_changelogs_on_names_and_removes_them() {
    let (_dir, path) = good_file();
    let on = |t: &str| (t.to_string(), None);
    let named = |t: &str, n: &str| (t.to_string(), Some(n.to_string()));
    let set = |changelog: Vec<(String, Option<String>)>| {
        let flags = PipelineFlags {
            sort_by: vec![("orders".to_string(), "id".to_string())],
            changelog,
            ..Default::default()
        };
        connect_app(&path, flags)
    };
    let written = set(vec![
        on("orders"),
        named("sales.customers", "customer_history"),
    ])
    .unwrap();
    assert!(
        written.contains("    tables:\n      orders:\n        sort_by: [id]\n        changelog: true\n      sales.customers:\n        changelog:\n          table: customer_history\n\n"),
        "{written}"
    );
    let c = Config::from_str(&path, &written, &env).unwrap();
    assert_changelogs(
        c.pipeline("app").unwrap(),
        &[
            ("orders", "orders_changelog"),
            ("sales.customers", "customer_history"),
        ],
    );
    // The same call again changes nothing; the last flag for a table wins; `T=` removes it.
    assert_eq!(
        set(vec![
            on("orders"),
            named("sales.customers", "customer_history")
        ])
        .unwrap(),
        written
    );
    let renamed = set(vec![on("orders"), named("orders", "orders_history")]).unwrap();
    assert!(
        renamed.contains("      orders:\n        sort_by: [id]\n        changelog:\n          table: orders_history\n"),
        "{renamed}"
    );
    let removed = set(vec![named("orders", ""), named("sales.customers", "")]).unwrap();
    assert!(
        removed.contains("    tables:\n      orders:\n        sort_by: [id]\n\n"),
        "{removed}"
    );

    for (given, message) in [
        (
            vec![named("orders", "Orders History")],
            "--changelog 'orders=Orders History': `Orders History` is not a table name every catalog takes: use lower-case letters, digits and underscores, e.g. `orders_history`",
        ),
        (
            vec![named("orders", "sales_customers")],
            "--changelog 'orders=sales_customers': the changelog of `orders` would be Iceberg table `sales_customers`, which is already the Iceberg table of `sales.customers`: give it another name with --changelog 'orders=<name>'",
        ),
        (
            vec![on("invoices")],
            "--changelog 'invoices': `invoices` is not one of the tables data source `app_db` follows (orders, sales.customers)",
        ),
        (vec![on("a.b.c")], "`a.b.c` is not a table name"),
    ] {
        let e = set(given).unwrap_err().to_string();
        assert!(e.contains(message), "{e}");
    }
    // Nothing was written by the refused calls.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), removed);
}
