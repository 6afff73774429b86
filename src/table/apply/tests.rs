//! Unit tests of change application against an in-memory double of the committed rows.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use bytes::Bytes;

use super::*;

fn t(v: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(v.as_bytes()))
}

fn text(d: &Datum) -> String {
    match d {
        Datum::Text(b) => String::from_utf8_lossy(b).into_owned(),
        Datum::Null => "NULL".into(),
        Datum::Unchanged => "UNCHANGED".into(),
    }
}

/// Committed rows as a list of (key, row copies), the place of a row its position in a
/// flat list of everything committed.
#[derive(Default)]
struct Rows {
    rows: Vec<(Key, Vec<Datum>)>,
    removed: Vec<usize>,
}

impl Committed for Rows {
    type Place = usize;

    fn remove(&mut self, key: &Key, _row: &[Datum], all: bool) -> Result<Option<usize>> {
        let mut found = None;
        for (i, (k, _)) in self.rows.iter().enumerate().rev() {
            if k == key && !self.removed.contains(&i) {
                self.removed.push(i);
                found = Some(i);
                if !all {
                    break;
                }
            }
        }
        Ok(found)
    }
}

fn keys(columns: Vec<usize>) -> RowKeys {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    RowKeys::new(
        TableRef {
            schema: "public".into(),
            name: "t".into(),
        },
        &schema,
        columns,
    )
}

fn live(pending: &Pending<usize>, committed: &Rows) -> Vec<String> {
    let mut out: Vec<String> = committed
        .rows
        .iter()
        .enumerate()
        .filter(|(i, _)| !committed.removed.contains(i))
        .map(|(_, (_, r))| r.iter().map(text).collect::<Vec<_>>().join(","))
        .chain(
            pending
                .rows()
                .map(|p| p.values.iter().map(text).collect::<Vec<_>>().join(",")),
        )
        .collect();
    out.sort();
    out
}

#[test]
fn a_primary_key_has_one_live_row() {
    let k = keys(vec![0]);
    let mut committed = Rows::default();
    for (id, v) in [("1", "a"), ("2", "b")] {
        let row = vec![t(id), t(v)];
        committed.rows.push((k.key_of(&row).unwrap(), row));
    }
    let mut p = Pending::new(true);
    // An insert of a committed key replaces the committed row.
    let row = vec![t("1"), t("a2")];
    p.insert(&mut committed, k.key_of(&row).unwrap(), row)
        .unwrap();
    // An update moving key 2 onto key 3, then a delete of the pending key 3.
    let (old, new) = (vec![t("2"), Datum::Null], vec![t("3"), t("c")]);
    let moved = p
        .update(
            &mut committed,
            &k.key_of(&old).unwrap(),
            Some(&old),
            k.key_of(&new).unwrap(),
            new.clone(),
        )
        .unwrap();
    assert!(moved.is_some());
    assert_eq!(live(&p, &committed), ["1,a2", "3,c"]);
    assert!(p
        .delete(&mut committed, &k.key_of(&new).unwrap(), &new)
        .unwrap());
    assert_eq!(live(&p, &committed), ["1,a2"]);
    // Nothing holds key 9.
    let gone = vec![t("9"), Datum::Null];
    assert!(!p
        .delete(&mut committed, &k.key_of(&gone).unwrap(), &gone)
        .unwrap());
    let none = p
        .update(
            &mut committed,
            &k.key_of(&gone).unwrap(),
            Some(&gone),
            k.key_of(&gone).unwrap(),
            gone.clone(),
        )
        .unwrap();
    assert!(none.is_none());
}

#[test]
fn an_update_onto_a_taken_key_replaces_that_row() {
    let k = keys(vec![0]);
    let mut committed = Rows::default();
    let mut p = Pending::new(true);
    for (id, v) in [("1", "a"), ("2", "b")] {
        let row = vec![t(id), t(v)];
        p.insert(&mut committed, k.key_of(&row).unwrap(), row)
            .unwrap();
    }
    let (old, new) = (vec![t("1"), t("a")], vec![t("2"), t("moved")]);
    p.update(
        &mut committed,
        &k.key_of(&old).unwrap(),
        Some(&old),
        k.key_of(&new).unwrap(),
        new,
    )
    .unwrap();
    assert_eq!(live(&p, &committed), ["2,moved"]);
}

#[test]
fn equal_rows_without_a_key_are_separate_copies() {
    let k = keys(vec![0, 1]);
    let row = vec![t("1"), t("a")];
    let key = k.key_of(&row).unwrap();
    let mut committed = Rows::default();
    committed.rows.push((key.clone(), row.clone()));
    committed.rows.push((key.clone(), row.clone()));
    let mut p = Pending::new(false);
    p.insert(&mut committed, key.clone(), row.clone()).unwrap();
    assert_eq!(live(&p, &committed).len(), 3, "an insert keeps the copies");
    // A delete removes one copy: the pending one first, then committed ones.
    assert!(p.delete(&mut committed, &key, &row).unwrap());
    assert_eq!(p.rows().count(), 0);
    assert_eq!(live(&p, &committed).len(), 2);
    // An update of one copy changes that copy only.
    let new = vec![t("1"), t("b")];
    p.update(
        &mut committed,
        &key,
        Some(&row),
        k.key_of(&new).unwrap(),
        new,
    )
    .unwrap();
    assert_eq!(live(&p, &committed), ["1,a", "1,b"]);
    assert!(p.delete(&mut committed, &key, &row).unwrap());
    assert!(!p.delete(&mut committed, &key, &row).unwrap());
}

#[test]
fn unchanged_values_come_from_the_row_replaced() {
    let k = keys(vec![0]);
    let mut committed = Rows::default();
    let row = vec![t("1"), t("toasted")];
    committed.rows.push((k.key_of(&row).unwrap(), row));
    let mut p = Pending::new(true);
    // The committed row's place is kept for the commit to read the value there.
    let update = vec![t("1"), Datum::Unchanged];
    let key = k.key_of(&update).unwrap();
    let first = p
        .update(&mut committed, &key, None, key.clone(), update.clone())
        .unwrap()
        .map(|r| (r.previous, text(&r.values[1])));
    assert_eq!(first, Some((Some(0), "UNCHANGED".to_string())));
    // A second update of the same key keeps pointing there.
    let second = p
        .update(&mut committed, &key, None, key.clone(), update.clone())
        .unwrap()
        .map(|r| r.previous);
    assert_eq!(second, Some(Some(0)));
    // A pending row with the value gives it directly.
    let full = vec![t("1"), t("new")];
    p.insert(&mut committed, key.clone(), full).unwrap();
    let third = p
        .update(&mut committed, &key, None, key.clone(), update.clone())
        .unwrap()
        .map(|r| (r.previous, text(&r.values[1])));
    assert_eq!(third, Some((None, "new".to_string())));
}

#[test]
fn keys_refuse_a_key_without_a_value() {
    let k = keys(vec![0]);
    let err = k.key_of(&[Datum::Unchanged, t("x")]).unwrap_err();
    assert!(err.to_string().contains("arrived without a value"), "{err}");
    assert_eq!(k.texts(&[t("7"), t("x")]), [Some("7".to_string())]);
    let mut row = vec![t("1"), Datum::Unchanged];
    fill_from_old(&mut row, &[t("1"), t("old")]);
    assert_eq!(text(&row[1]), "old");
}
