//! Unit tests of the WAL tail: the newest version of each key, transaction cuts, truncates,
//! keyless tables and unchanged values.

use super::*;
use crate::change::{RelColumn, Relation};
use crate::wal::{Change, Record, SegmentInfo, Txn};
use arrow::array::{AsArray, Int32Array};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use bytes::Bytes;

pub(crate) fn t(v: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(v.as_bytes()))
}

pub(crate) fn relation() -> Relation {
    Relation {
        id: 7,
        namespace: "public".into(),
        name: "t".into(),
        replica_identity: b'd',
        columns: vec![
            RelColumn::plain(true, "id", 23, -1, "int4"),
            RelColumn::plain(false, "v", 25, -1, "text"),
        ],
    }
}

pub(crate) fn shape(keyed: bool) -> TableShape {
    TableShape {
        source: TableRef {
            schema: "public".into(),
            name: "t".into(),
        },
        schema: Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("v", DataType::Utf8, true),
        ])),
        key: if keyed { vec![0] } else { vec![] },
        row_key: vec![0, 1],
        columns: None,
        tail_columns: vec![],
    }
}

pub(crate) fn change(op: Op, old: Option<Vec<Datum>>, new: Option<Vec<Datum>>) -> Change {
    Change {
        op,
        rel: 7,
        old,
        new,
        relation: None,
    }
}

pub(crate) fn read(txns: Vec<Vec<Change>>) -> WalRead {
    let mut records = vec![Record::Relation(relation())];
    for (i, changes) in txns.into_iter().enumerate() {
        let lsn = Lsn(100 + i as u64 * 10);
        records.push(Record::Txn(Txn {
            xid: i as u32,
            commit_lsn: lsn,
            end_lsn: lsn,
            commit_time_micros: 0,
            changes,
        }));
    }
    let seg = SegmentInfo {
        path: PathBuf::from("/nonexistent/a.seg"),
        first: Lsn(100),
        last: Lsn(200),
        bytes: 0,
    };
    WalRead {
        segments: vec![(seg, Arc::new(records))],
        vanished: vec![],
    }
}

fn ids(s: &TailSnapshot) -> Vec<i32> {
    let mut v: Vec<i32> = s
        .rows
        .as_ref()
        .map(|b| b.column(0).as_primitive::<Int32Type>().values().to_vec())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn keeps_the_newest_version_and_hides_replaced_keys() {
    let r = read(vec![
        vec![
            change(Op::Insert, None, Some(vec![t("1"), t("a")])),
            change(Op::Update, None, Some(vec![t("2"), t("b")])),
        ],
        vec![
            change(
                Op::Update,
                Some(vec![t("1"), Datum::Null]),
                Some(vec![t("3"), t("c")]),
            ),
            change(Op::Delete, Some(vec![t("2"), Datum::Null]), None),
        ],
    ]);
    let s = reduce(&shape(true), &r, Lsn(0), Lsn(u64::MAX)).unwrap();
    assert_eq!(ids(&s), vec![3]);
    assert_eq!(
        s.hidden.keys.len(),
        3,
        "keys 1, 2 and 3 replace committed rows"
    );
    assert_eq!(s.changes, 4);
}

#[test]
fn skips_transactions_the_snapshot_covers() {
    let r = read(vec![
        vec![change(Op::Insert, None, Some(vec![t("1"), t("a")]))],
        vec![change(Op::Insert, None, Some(vec![t("2"), t("b")]))],
    ]);
    let s = reduce(&shape(true), &r, Lsn(100), Lsn(u64::MAX)).unwrap();
    assert_eq!(ids(&s), vec![2]);
}

#[test]
fn a_cut_keeps_whole_transactions_up_to_it_and_none_after() {
    // Transactions end at 100, 110 and 120.
    let r = read(vec![
        vec![change(Op::Insert, None, Some(vec![t("1"), t("a")]))],
        vec![
            change(Op::Insert, None, Some(vec![t("2"), t("b")])),
            change(Op::Delete, Some(vec![t("1"), Datum::Null]), None),
        ],
        vec![change(Op::Insert, None, Some(vec![t("3"), t("c")]))],
    ]);
    let s = reduce(&shape(true), &r, Lsn(0), Lsn(110)).unwrap();
    assert_eq!(
        ids(&s),
        vec![2],
        "both changes of the second transaction, none of the third"
    );
    assert_eq!(s.wal_lsn, Lsn(110));
    assert_eq!(s.changes, 3);
    let s = reduce(&shape(true), &r, Lsn(0), Lsn(109)).unwrap();
    assert_eq!(
        ids(&s),
        vec![1],
        "a cut inside a transaction's range leaves it out whole"
    );
    let s = reduce(&shape(true), &r, Lsn(110), Lsn(120)).unwrap();
    assert_eq!(ids(&s), vec![3]);
    assert_eq!(r.newest(), Lsn(120));
}

#[test]
fn cuts_between_the_same_transactions_share_one_reduction() {
    // Transactions end at 100 and 110.
    let r = read(vec![
        vec![change(Op::Insert, None, Some(vec![t("1"), t("a")]))],
        vec![change(Op::Insert, None, Some(vec![t("2"), t("b")]))],
    ]);
    let cache = ReducedCache::default();
    let base = Arc::new(shape(true));
    let source = base.source.clone();
    let held = cache
        .get_or_reduce("t", &base, &source, &r, Lsn(0), Lsn(104))
        .unwrap();
    // A later cut with no transaction of the read in between (WAL of other databases).
    let fresh = cache
        .get_or_reduce("t", &base, &source, &r, Lsn(0), Lsn(109))
        .unwrap();
    assert!(Arc::ptr_eq(&held, &fresh));
    assert_eq!(ids(&fresh), vec![1]);
    let newer = cache
        .get_or_reduce("t", &base, &source, &r, Lsn(0), Lsn(110))
        .unwrap();
    assert_eq!(ids(&newer), vec![1, 2]);
}

#[test]
fn truncate_hides_everything_before_it() {
    let r = read(vec![
        vec![change(Op::Insert, None, Some(vec![t("1"), t("a")]))],
        vec![change(Op::Truncate, None, None)],
        vec![change(Op::Insert, None, Some(vec![t("5"), t("e")]))],
    ]);
    let s = reduce(&shape(true), &r, Lsn(0), Lsn(u64::MAX)).unwrap();
    assert!(s.hidden.all);
    assert_eq!(ids(&s), vec![5]);
}

#[test]
fn keyless_tables_hide_one_copy_per_delete() {
    let row = || vec![t("1"), t("a")];
    let r = read(vec![
        vec![change(Op::Delete, Some(row()), None)],
        vec![
            change(Op::Insert, None, Some(row())),
            change(Op::Insert, None, Some(row())),
        ],
        vec![change(Op::Delete, Some(row()), None)],
    ]);
    let s = reduce(&shape(false), &r, Lsn(0), Lsn(u64::MAX)).unwrap();
    // One committed copy hidden; of the two pending copies one is deleted again.
    assert_eq!(s.hidden.keys.values().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(ids(&s), vec![1]);
}

#[test]
fn unchanged_values_come_from_the_pending_row_or_are_marked_for_filling() {
    let r = read(vec![
        vec![change(
            Op::Update,
            None,
            Some(vec![t("1"), Datum::Unchanged]),
        )],
        vec![change(Op::Insert, None, Some(vec![t("2"), t("x")]))],
        vec![change(
            Op::Update,
            None,
            Some(vec![t("2"), Datum::Unchanged]),
        )],
    ]);
    let s = reduce(&shape(true), &r, Lsn(0), Lsn(u64::MAX)).unwrap();
    let batch = s.rows.as_ref().unwrap();
    let id = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int32Array>()
        .unwrap();
    let v = batch.column(1).as_string::<i32>();
    for i in 0..batch.num_rows() {
        if id.value(i) == 2 {
            assert_eq!(v.value(i), "x");
        }
    }
    assert_eq!(
        s.fill.len(),
        1,
        "row 1 needs its value from the committed row"
    );
    assert_eq!(s.fill[0].2, vec![1]);
}
