//! Configuration tests, the Postgres source's slot settings (`heartbeat_interval`,
//! `max_retained_wal`, `failover_slot`) and `exclude_columns`.

use super::*;

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
    let p = app(GOOD);
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
        let p = app(&off);
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
    let (_dir, path) = good_file();
    let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
    let set = |sort_by: Vec<(String, String)>, exclude_columns: Vec<(String, String)>| {
        let flags = PipelineFlags {
            sort_by,
            exclude_columns,
            ..Default::default()
        };
        connect_app(&path, flags)
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
