//! Unit tests of the committed scan: planner statistics, cache eviction, row selections,
//! key-column search and file splitting.

use std::collections::{HashMap, HashSet};

use arrow::array::{Array, Int64Array};
use datafusion::common::stats::Precision;
use parquet::arrow::arrow_reader::RowSelection;

use super::cache::{KeyColumn, Search};
use super::read::{exact_selection, selection};
use super::*;
use crate::query::listing::ColumnMetrics;

fn metric(
    lower: iceberg::spec::PrimitiveLiteral,
    upper: iceberg::spec::PrimitiveLiteral,
    nulls: u64,
    size: u64,
) -> ColumnMetrics {
    ColumnMetrics {
        lower: Some(lower),
        upper: Some(upper),
        nulls: Some(nulls),
        size: Some(size),
    }
}

fn file(rows: u64, file_rows: u64, columns: FileColumns) -> DataFile {
    DataFile {
        path: "f".into(),
        size: 1,
        rows,
        file_rows,
        deletes: vec![],
        row_groups: None,
        columns: Some(Arc::new(columns)),
    }
}

#[test]
fn statistics_come_from_the_manifests_metrics_in_the_tables_types() {
    use arrow::datatypes::{Field, Schema, TimeUnit};
    use datafusion::common::ScalarValue;
    use iceberg::spec::PrimitiveLiteral as L;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("day", DataType::Date32, true),
        Field::new("amount", DataType::Decimal128(15, 2), true),
        Field::new("name", DataType::Utf8, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
    ]));
    let ids = [Some(1), Some(2), Some(3), Some(4), Some(5)];
    let a = file(
        100,
        100,
        HashMap::from([
            (1, metric(L::Long(10), L::Long(20), 0, 400)),
            (2, metric(L::Int(100), L::Int(200), 5, 300)),
            (3, metric(L::Int128(150), L::Int128(990), 0, 200)),
            (
                4,
                metric(L::String("b".into()), L::String("k".into()), 2, 1000),
            ),
            (5, metric(L::Long(7), L::Long(9), 0, 100)),
        ]),
    );
    // A piece of a file (half its rows): half its nulls and bytes. The table's `id`
    // was an int when this file was written.
    let b = file(
        50,
        100,
        HashMap::from([
            (1, metric(L::Int(1), L::Int(15), 0, 400)),
            (2, metric(L::Int(50), L::Int(150), 10, 300)),
            (3, metric(L::Int128(100), L::Int128(500), 4, 200)),
            (
                4,
                metric(L::String("a".into()), L::String("c".into()), 0, 1000),
            ),
        ]),
    );
    let stats = statistics([a.clone(), b.clone()].iter(), &schema, &ids, None);
    assert_eq!(stats.num_rows, Precision::Inexact(150));
    let [id, day, amount, name, at] = stats.column_statistics.as_slice() else {
        panic!("five columns");
    };
    assert_eq!(
        id.min_value,
        Precision::Inexact(ScalarValue::Int64(Some(1)))
    );
    assert_eq!(
        id.max_value,
        Precision::Inexact(ScalarValue::Int64(Some(20)))
    );
    assert_eq!(id.byte_size, Precision::Inexact(150 * 8));
    assert_eq!(
        day.min_value,
        Precision::Inexact(ScalarValue::Date32(Some(50)))
    );
    assert_eq!(
        day.max_value,
        Precision::Inexact(ScalarValue::Date32(Some(200)))
    );
    assert_eq!(day.null_count, Precision::Inexact(10));
    assert_eq!(
        amount.max_value,
        Precision::Inexact(ScalarValue::Decimal128(Some(990), 15, 2))
    );
    assert_eq!(amount.null_count, Precision::Inexact(2));
    assert_eq!(
        name.min_value,
        Precision::Inexact(ScalarValue::Utf8(Some("a".into())))
    );
    assert_eq!(
        name.max_value,
        Precision::Inexact(ScalarValue::Utf8(Some("k".into())))
    );
    assert_eq!(name.byte_size, Precision::Inexact(1500));
    // One file has no metric for `at`: the scan has none.
    assert_eq!(at.min_value, Precision::Absent);
    assert_eq!(at.null_count, Precision::Absent);
    // Alone, the first file's `at` bounds are timestamps.
    let alone = statistics([a.clone()].iter(), &schema, &ids, None);
    assert_eq!(
        alone.column_statistics[4].max_value,
        Precision::Inexact(ScalarValue::TimestampMicrosecond(
            Some(9),
            Some("UTC".into())
        ))
    );
    // A column without a field id (none in the files) and a limit.
    let limited = statistics(
        [a, b].iter(),
        &schema,
        &[None, None, None, None, None],
        Some(10),
    );
    assert_eq!(limited.num_rows, Precision::Inexact(10));
    assert_eq!(limited.column_statistics[0].min_value, Precision::Absent);
    assert!(limited.total_byte_size.get_value().is_some());
}

#[test]
fn a_full_listing_forgets_the_files_it_no_longer_has() {
    let caches = ScanCaches::default();
    let keys = KeyColumn::new(Int64Array::from(vec![1, 2, 3]));
    let loc = "/wh/ws/orders";
    for f in ["data/a.parquet", "data/b.parquet", "data/c-deletes.parquet"] {
        caches.put_keys(&format!("{loc}/{f}"), keys.clone());
    }
    // Another table whose name starts the same: not this table's files.
    caches.put_keys("/wh/ws/orders_archive/data/a.parquet", keys.clone());
    assert_eq!(caches.len(), 4);
    let live_path = format!("{loc}/data/b.parquet");
    let live: HashSet<&str> = [live_path.as_str()].into_iter().collect();
    caches.forget_dead(&format!("{loc}/"), &live);
    assert_eq!(caches.len(), 2);
    assert!(caches.keys(&live_path).is_some());
    assert!(caches.keys(&format!("{loc}/data/a.parquet")).is_none());
    assert!(caches
        .keys("/wh/ws/orders_archive/data/a.parquet")
        .is_some());
}

fn expand(sel: &RowSelection) -> Vec<(bool, usize)> {
    sel.iter().map(|s| (s.skip, s.row_count)).collect()
}

#[test]
fn selection_skips_each_position_once() {
    let sel = selection(vec![5, 0, 3, 3, 9, 12], &[(0, 10)]);
    assert_eq!(
        expand(&sel),
        vec![
            (true, 1),
            (false, 2),
            (true, 1),
            (false, 1),
            (true, 1),
            (false, 3),
            (true, 1)
        ]
    );
    assert_eq!(sel.row_count(), 6);
    let none = selection(vec![], &[(0, 4)]);
    assert_eq!(expand(&none), vec![(false, 4)]);
}

#[test]
fn a_key_column_finds_the_rows_of_each_key_in_or_out_of_key_order() {
    let keys = KeyColumn::new(Int64Array::from(vec![1, 3, 3, 7, 9]));
    assert!(matches!(keys.search, Some(Search::Ascending)));
    assert_eq!(keys.positions(&[3, 4, 9]), Some(vec![1, 2, 4]));
    assert_eq!(keys.positions(&[0, 10]), Some(vec![]));
    // A snapshot in the source's physical order: found through the permutation, and
    // the positions come back in file order.
    let keys = KeyColumn::new(Int64Array::from(vec![9, 3, 1, 7, 3]));
    assert!(matches!(keys.search, Some(Search::Order(_))));
    assert_eq!(keys.positions(&[1, 3, 9]), Some(vec![0, 1, 2, 4]));
    assert_eq!(keys.positions(&[2, 8, 10]), Some(vec![]));
    assert_eq!(
        keys.memory_size(),
        keys.values.get_array_memory_size() + 5 * 4
    );
    // A null key: not searchable, the page index finds the rows instead.
    let keys = KeyColumn::new(Int64Array::from(vec![Some(1), None]));
    assert!(keys.positions(&[1]).is_none());
}

#[test]
fn exact_selection_selects_only_the_positions_in_the_row_groups_read() {
    // Row groups [0,4) and [8,12) read; 2, 6 (not read) and 9 wanted.
    let sel = exact_selection(&[2, 6, 9], &[(0, 4), (8, 12)]);
    assert_eq!(
        expand(&sel),
        vec![(true, 2), (false, 1), (true, 2), (false, 1), (true, 2)]
    );
    assert_eq!(sel.row_count(), 2);
    // It lines up with the deletes' selection over the same rows.
    let both = selection(vec![9], &[(0, 4), (8, 12)]).intersection(&sel);
    assert_eq!(both.row_count(), 1);
}

#[test]
fn pieces_are_runs_of_row_groups_of_about_a_share() {
    let rgs: Vec<(usize, u64)> = (0..10).map(|i| (i, 100)).collect();
    let two = pieces(&rgs, 500);
    assert_eq!(two.len(), 2);
    assert_eq!(
        two[0].iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(
        two[1].iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![5, 6, 7, 8, 9]
    );
    // Uneven row groups: every row group once, in order, no empty piece.
    let uneven = [(3, 700), (4, 50), (7, 50), (9, 300)];
    let cut = pieces(&uneven, 400);
    let flat: Vec<usize> = cut.iter().flatten().map(|r| r.0).collect();
    assert_eq!(flat, vec![3, 4, 7, 9]);
    assert!(cut.iter().all(|p| !p.is_empty()));
    assert_eq!(cut.len(), 2);
    // Never more pieces than row groups; none for none.
    assert_eq!(pieces(&[(0, 10_000)], 10).len(), 1);
    assert!(pieces(&[], 10).is_empty());
}

#[test]
fn selection_covers_only_the_row_groups_read() {
    // Row groups [0,4) [4,8) [8,12); the middle one pruned; 2, 5 and 9 deleted.
    let sel = selection(vec![9, 5, 2], &[(0, 4), (8, 12)]);
    assert_eq!(
        expand(&sel),
        vec![(false, 2), (true, 1), (false, 2), (true, 1), (false, 2)]
    );
    assert_eq!(sel.row_count(), 6);
}
