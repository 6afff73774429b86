//! Tests of the view printer against what Postgres 15 prints for the same views.

use super::*;
use arrow::datatypes::TimeUnit;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

fn columns() -> Columns {
    let lines = vec![
        ("line_no".to_string(), DataType::Int16),
        ("order_id".to_string(), DataType::Int32),
        ("sku".to_string(), DataType::Utf8),
        ("price".to_string(), DataType::Decimal128(10, 2)),
    ];
    let orders = vec![
        ("id".to_string(), DataType::Int32),
        ("placed".to_string(), DataType::Date32),
    ];
    let evt = vec![
        ("id".to_string(), DataType::Int64),
        (
            "at".to_string(),
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        ("flag".to_string(), DataType::Boolean),
    ];
    HashMap::from([
        (vec!["analytics".to_string(), "lines".to_string()], lines),
        (vec!["analytics".to_string(), "orders".to_string()], orders),
        (vec!["analytics".to_string(), "evt".to_string()], evt),
    ])
}

fn deparsed(sql: &str) -> Option<String> {
    let Ok(mut s) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return None;
    };
    let Some(Statement::Query(q)) = s.pop() else {
        return None;
    };
    deparse(&q, &[], "analytics", &columns())
}

#[test]
fn a_grouped_view_prints_as_postgres_prints_it() {
    assert_eq!(
        deparsed("SELECT lines.order_id, count(*) AS n_lines, sum(lines.price) AS total FROM analytics.lines GROUP BY lines.order_id").as_deref(),
        Some(" SELECT lines.order_id,\n    count(*) AS n_lines,\n    sum(lines.price) AS total\n   FROM lines\n  GROUP BY lines.order_id")
    );
}

#[test]
fn joins_filters_and_order_print_as_postgres_prints_them() {
    assert_eq!(
        deparsed("select l.sku, o.placed from analytics.lines l join analytics.orders o on o.id = l.order_id where price > 2 and sku like 'A%' order by 2 desc, sku limit 10").as_deref(),
        Some(" SELECT l.sku,\n    o.placed\n   FROM (lines l\n     JOIN orders o ON ((o.id = l.order_id)))\n  WHERE ((l.price > (2)::numeric) AND (l.sku ~~ 'A%'::text))\n  ORDER BY o.placed DESC, l.sku\n LIMIT 10")
    );
    assert_eq!(
        deparsed("SELECT * FROM analytics.orders WHERE placed >= '2024-01-01' AND id IN (1, 2)").as_deref(),
        Some(" SELECT orders.id,\n    orders.placed\n   FROM orders\n  WHERE ((orders.placed >= '2024-01-01'::date) AND (orders.id = ANY (ARRAY[1, 2])))")
    );
}

#[test]
fn aggregates_constants_and_casts_print_as_postgres_prints_them() {
    assert_eq!(
        deparsed("SELECT lines.order_id, count(DISTINCT sku) AS skus, sum(price) FILTER (WHERE line_no > 1) AS late, sum(price * 2) AS dbl FROM analytics.lines GROUP BY 1 HAVING count(*) > 1 ORDER BY skus DESC NULLS LAST").as_deref(),
        Some(" SELECT lines.order_id,\n    count(DISTINCT lines.sku) AS skus,\n    sum(lines.price) FILTER (WHERE (lines.line_no > 1)) AS late,\n    sum((lines.price * (2)::numeric)) AS dbl\n   FROM lines\n  GROUP BY lines.order_id\n HAVING (count(*) > 1)\n  ORDER BY (count(DISTINCT lines.sku)) DESC NULLS LAST")
    );
    assert_eq!(
        deparsed("SELECT DISTINCT o.id, l.sku || '-x' AS code, (price)::integer AS p, price::numeric(12,3) AS p3 FROM analytics.orders o LEFT JOIN analytics.lines l ON l.order_id = o.id AND l.line_no = 1 WHERE l.sku IS NULL OR price BETWEEN 1 AND 10 OFFSET 5").as_deref(),
        Some(" SELECT DISTINCT o.id,\n    (l.sku || '-x'::text) AS code,\n    (l.price)::integer AS p,\n    (l.price)::numeric(12,3) AS p3\n   FROM (orders o\n     LEFT JOIN lines l ON (((l.order_id = o.id) AND (l.line_no = 1))))\n  WHERE ((l.sku IS NULL) OR ((l.price >= (1)::numeric) AND (l.price <= (10)::numeric)))\n OFFSET 5")
    );
    assert_eq!(
        deparsed("SELECT id, -1 AS neg, 10000000000 AS big, 1.5 AS half, 'x' AS s, true AS t, NOT (id > 1) AS n, id NOT IN (3, 4) AS ni, -id AS mi FROM analytics.orders WHERE placed::text <> '' ORDER BY id + 1, placed").as_deref(),
        Some(" SELECT orders.id,\n    '-1'::integer AS neg,\n    '10000000000'::bigint AS big,\n    1.5 AS half,\n    'x'::text AS s,\n    true AS t,\n    (NOT (orders.id > 1)) AS n,\n    (orders.id <> ALL (ARRAY[3, 4])) AS ni,\n    (- orders.id) AS mi\n   FROM orders\n  WHERE ((orders.placed)::text <> ''::text)\n  ORDER BY (orders.id + 1), orders.placed")
    );
    assert_eq!(
        deparsed("SELECT count(*), max(placed) FROM analytics.orders").as_deref(),
        Some(" SELECT count(*) AS count,\n    max(orders.placed) AS max\n   FROM orders")
    );
}

#[test]
fn constants_take_the_type_of_what_they_meet() {
    assert_eq!(
        deparsed("SELECT id AS \"Order Id\", coalesce(placed, '2024-01-01') AS p FROM analytics.orders").as_deref(),
        Some(" SELECT orders.id AS \"Order Id\",\n    COALESCE(orders.placed, '2024-01-01'::date) AS p\n   FROM orders")
    );
    assert_eq!(
        deparsed("SELECT l.order_id, sum(price) AS total FROM analytics.lines l GROUP BY l.order_id HAVING sum(price) > 100 ORDER BY total DESC").as_deref(),
        Some(" SELECT l.order_id,\n    sum(l.price) AS total\n   FROM lines l\n  GROUP BY l.order_id\n HAVING (sum(l.price) > (100)::numeric)\n  ORDER BY (sum(l.price)) DESC")
    );
    assert_eq!(
        deparsed("SELECT NULL AS n, '5'::integer AS five, coalesce(price, 0) AS p, lower(sku) AS l FROM analytics.lines").as_deref(),
        Some(" SELECT NULL::text AS n,\n    5 AS five,\n    COALESCE(lines.price, (0)::numeric) AS p,\n    lower(lines.sku) AS l\n   FROM lines")
    );
    assert_eq!(
        deparsed("SELECT id FROM analytics.evt WHERE at >= '2024-01-01' AND flag = 't' AND id = '7'").as_deref(),
        Some(" SELECT evt.id\n   FROM evt\n  WHERE ((evt.at >= '2024-01-01 00:00:00'::timestamp without time zone) AND (evt.flag = true) AND (evt.id = '7'::bigint))")
    );
}

#[test]
fn only_the_left_of_and_joins_its_list() {
    assert_eq!(
        deparsed("SELECT o.id FROM analytics.orders o WHERE o.id IN (5) AND (o.id > 1 AND (o.id < 9 AND o.id <> 4)) OR o.placed = '2024-02-01'").as_deref(),
        Some(" SELECT o.id\n   FROM orders o\n  WHERE (((o.id = 5) AND ((o.id > 1) AND ((o.id < 9) AND (o.id <> 4)))) OR (o.placed = '2024-02-01'::date))")
    );
}

#[test]
fn the_views_column_names_are_its_targets_names() {
    let Ok(mut s) = Parser::parse_sql(
        &PostgreSqlDialect {},
        "SELECT id, placed FROM analytics.orders",
    ) else {
        panic!("the test query parses");
    };
    let Some(Statement::Query(q)) = s.pop() else {
        panic!("a query");
    };
    assert_eq!(
        deparse(&q, &["a".into(), "b".into()], "analytics", &columns()).as_deref(),
        Some(" SELECT orders.id AS a,\n    orders.placed AS b\n   FROM orders")
    );
}

#[test]
fn queries_beyond_the_rules_are_left_to_the_caller() {
    // an integer column against a numeric constant: Postgres casts the column
    assert_eq!(
        deparsed("SELECT id FROM analytics.orders WHERE id > 1.5"),
        None
    );
    // a function whose arguments Postgres may cast, and the SQL-standard forms
    assert_eq!(
        deparsed("SELECT date_trunc('month', placed) FROM analytics.orders"),
        None
    );
    assert_eq!(
        deparsed("SELECT current_date AS d FROM analytics.orders"),
        None
    );
    // a USING join's merged column
    assert_eq!(
        deparsed("SELECT id FROM analytics.orders JOIN analytics.evt USING (id)"),
        None
    );
    // a list with a column in it is an OR chain in Postgres
    assert_eq!(
        deparsed("SELECT id FROM analytics.orders WHERE 3 IN (id, 4)"),
        None
    );
    assert_eq!(deparsed("WITH x AS (SELECT 1) SELECT * FROM x"), None);
    assert_eq!(
        deparsed("SELECT CASE WHEN id > 1 THEN 1 END AS c FROM analytics.orders"),
        None
    );
    assert_eq!(deparsed("SELECT id FROM analytics.missing"), None);
}
