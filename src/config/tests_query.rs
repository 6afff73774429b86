//! Configuration tests, the gateway's server settings (`skippr.query`: memory, spilling,
//! admission, admins and the slow-statement log).

use super::*;

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
