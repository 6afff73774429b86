//! Catalogs, models: the ops on the state value, and commits to a real sqlite catalog.

use super::*;
use crate::catalog::LocalCatalog;
use crate::error::{Context, Result};

fn rel(s: &str, n: &str) -> RelName {
    (s.to_string(), n.to_string())
}

fn view(depends: &[RelName]) -> ViewDef {
    ViewDef {
        definition: None,
        sql: "SELECT 1".into(),
        columns: vec![("x".into(), "Int64".into())],
        depends: depends.to_vec(),
    }
}

#[test]
fn a_dbt_table_swap_applies_in_order() -> std::result::Result<(), Refused> {
    let mut s = ModelsState::default();
    s.apply(&Op::CreateNamespace("m".into()))?;
    s.apply(&Op::CreateTable {
        rel: rel("m", "t"),
        location: "f/t1/metadata/a.json".into(),
    })?;
    s.apply(&Op::CreateView {
        rel: rel("m", "v"),
        def: view(&[rel("m", "t")]),
        replace: false,
    })?;
    s.apply(&Op::Comment {
        rel: rel("m", "t"),
        column: None,
        text: Some("orders".into()),
    })?;
    // dbt: create t__dbt_tmp, rename t to t__dbt_backup, rename the new one to t, drop
    // the backup.
    let ops = vec![
        Op::CreateTable {
            rel: rel("m", "t__dbt_tmp"),
            location: "f/t2/metadata/a.json".into(),
        },
        Op::Rename {
            rel: rel("m", "t"),
            to: "t__dbt_backup".into(),
        },
        Op::Rename {
            rel: rel("m", "t__dbt_tmp"),
            to: "t".into(),
        },
        Op::Drop {
            rel: rel("m", "t__dbt_backup"),
            kind: RelKind::Table,
        },
    ];
    let next = s.after(&ops)?;
    assert_eq!(
        next.tables.get(&rel("m", "t")).map(String::as_str),
        Some("f/t2/metadata/a.json")
    );
    assert_eq!(next.tables.len(), 1);
    // The view follows the name; the comment went with the renamed table.
    assert!(next.views.contains_key(&rel("m", "v")));
    assert!(next.comments.is_empty());
    assert_eq!(s.dropped_folders(&next), vec!["f/t1".to_string()]);
    Ok(())
}

#[test]
fn refusals_name_the_relation() {
    let mut s = ModelsState::default();
    let missing = s.apply(&Op::CreateTable {
        rel: rel("m", "t"),
        location: "l".into(),
    });
    assert_eq!(missing.map_err(|r| r.conflict), Err(Conflict::Missing));
    let _ = s.apply(&Op::CreateNamespace("m".into()));
    let _ = s.apply(&Op::CreateTable {
        rel: rel("m", "t"),
        location: "l1".into(),
    });
    let _ = s.apply(&Op::CreateView {
        rel: rel("m", "v"),
        def: view(&[rel("m", "t")]),
        replace: false,
    });
    let changed = s.apply(&Op::SwapTable {
        rel: rel("m", "t"),
        old: "l0".into(),
        new: "l2".into(),
    });
    assert_eq!(changed.map_err(|r| r.conflict), Err(Conflict::Changed));
    let depended = s
        .apply(&Op::Drop {
            rel: rel("m", "t"),
            kind: RelKind::Table,
        })
        .err();
    assert!(depended.is_some_and(|r| r.conflict == Conflict::NotEmpty && r.message.contains("m.v")));
    let wrong = s.apply(&Op::Drop {
        rel: rel("m", "v"),
        kind: RelKind::Table,
    });
    assert_eq!(wrong.map_err(|r| r.conflict), Err(Conflict::WrongKind));
    let not_empty = s.apply(&Op::DropNamespace("m".into()));
    assert_eq!(not_empty.map_err(|r| r.conflict), Err(Conflict::NotEmpty));
}

#[tokio::test]
async fn commits_are_atomic_and_survive_a_reopen() -> Result<()> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let sink = LocalCatalog::open(dir.path()).await?;
    sink.ensure_namespace("analytics").await?;
    let warehouse = std::fs::canonicalize(dir.path()).context("warehouse")?;
    let db = warehouse.join("catalog.db");
    let models = ModelsCatalog::new(db.clone(), &warehouse, vec!["analytics".into()]);
    assert!(models.state().await?.namespaces.is_empty());

    let first = models
        .commit(&[
            Op::CreateNamespace("m".into()),
            Op::CreateTable {
                rel: rel("m", "t"),
                location: format!("{}/m/t-1/metadata/00000-a.metadata.json", models.warehouse),
            },
            Op::CreateView {
                rel: rel("m", "v"),
                def: view(&[rel("m", "t")]),
                replace: false,
            },
        ])
        .await?;
    assert!(first.is_ok());
    let state = models.state().await?;
    assert!(state.tables.contains_key(&rel("m", "t")));
    assert!(state.views.contains_key(&rel("m", "v")));

    // A list with one op that cannot apply writes nothing.
    let refused = models
        .commit(&[
            Op::Drop {
                rel: rel("m", "v"),
                kind: RelKind::View,
            },
            Op::CreateTable {
                rel: rel("m", "t"),
                location: "again".into(),
            },
        ])
        .await?;
    assert!(refused.is_err());
    assert!(models.state().await?.views.contains_key(&rel("m", "v")));

    // The replicated namespace is out of reach, and a schema of another kind is refused.
    assert!(models
        .commit(&[Op::CreateNamespace("analytics".into())])
        .await
        .is_err());

    let reopened = ModelsCatalog::new(db, &warehouse, vec!["analytics".into()]);
    assert_eq!(*reopened.state().await?, *state);
    let dropped = reopened
        .commit(&[
            Op::Drop {
                rel: rel("m", "v"),
                kind: RelKind::View,
            },
            Op::Drop {
                rel: rel("m", "t"),
                kind: RelKind::Table,
            },
            Op::DropNamespace("m".into()),
        ])
        .await?
        .map_err(|r| crate::error::Error::fatal(r.message))?;
    assert_eq!(dropped.dropped.len(), 1);
    assert!(reopened.owns_folder(&dropped.dropped[0]));
    assert!(!reopened.owns_folder(&format!("{}/analytics/x", reopened.warehouse)));
    assert!(models.state().await?.namespaces.is_empty());
    Ok(())
}
