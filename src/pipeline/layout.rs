//! The pipeline's layout check: each table's `partition_by` and `sort_by` from `skippr.yml`
//! against the table's columns as Iceberg types, in `discover` and before `sync` writes
//! anything. Every problem names the entry's `skippr.yml` line and the fix.

use iceberg::spec::{NestedFieldRef, Schema, Transform, Type};

use crate::change::schema::TableSchema;
use crate::config::layouts::Located;
use crate::config::{PipelineConfig, TableRef};
use crate::error::{Error, Result};
use crate::source::postgres::connect::connect;
use crate::source::postgres::schema::describe_followed;
use crate::table::layout::{Layout, PartitionEntry};
use crate::table::schema::iceberg_schema;

/// One entry of a table's layout that does not fit the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutProblem {
    pub table: TableRef,
    /// `skippr.yml:12:9: pipelines.app.tables.orders.partition_by[0]: <what is wrong>`
    pub detail: String,
    pub fix: String,
}

/// Checks the layout of every table of `schemas` that has one.
pub fn check(p: &PipelineConfig, schemas: &[TableSchema]) -> Vec<LayoutProblem> {
    let mut problems = Vec::new();
    for ts in schemas {
        let Some(layout) = p.layouts.get(&ts.table).filter(|l| !l.is_plain()) else {
            continue;
        };
        let origin = p.layout_origins.get(&ts.table);
        let name = ts.table.to_string();
        let mut push = |at: Option<&Located>, detail: String, fix: String| {
            problems.push(LayoutProblem {
                table: ts.table.clone(),
                detail: match at {
                    Some(at) => format!("{at}: {detail}"),
                    None => detail,
                },
                fix,
            })
        };
        let schema = match iceberg_schema(ts) {
            Ok(s) => s,
            Err(e) => {
                push(
                    origin.map(|o| &o.table),
                    e.report(),
                    "see docs/types.md for the types a table may have".into(),
                );
                continue;
            }
        };
        for (i, entry) in layout.partition_by.iter().enumerate() {
            let one = Layout {
                partition_by: vec![entry.clone()],
                sort_by: Vec::new(),
            };
            let at = origin.and_then(|o| o.partition_by.get(i));
            if let Err(msgs) = one.check(&schema, &name) {
                let fix = partition_fix(entry, &schema, &name, at);
                for m in msgs {
                    push(at, m, fix.clone());
                }
            }
        }
        for (i, entry) in layout.sort_by.iter().enumerate() {
            let one = Layout {
                partition_by: Vec::new(),
                sort_by: vec![entry.clone()],
            };
            let at = origin.and_then(|o| o.sort_by.get(i));
            if let Err(msgs) = one.check(&schema, &name) {
                let fix = match schema.field_by_name(&entry.column) {
                    None => unknown_column_fix(&entry.column, &schema, &name, at),
                    Some(_) => format!(
                        "{}: sort by a column of a simple type (a number, text, date or timestamp), or remove the entry",
                        place(at)
                    ),
                };
                for m in msgs {
                    push(at, m, fix.clone());
                }
            }
        }
    }
    problems
}

/// Refuses, before `sync` writes anything, a layout that does not fit its table's columns
/// (a configuration error: exit code 2). Connects to the source only when a table has a
/// layout.
pub async fn require_fit(p: &PipelineConfig) -> Result<()> {
    let tables: Vec<&TableRef> = p
        .source
        .tables
        .iter()
        .filter(|t| !p.layout(t).is_plain())
        .collect();
    if tables.is_empty() {
        return Ok(());
    }
    let client = connect(&p.source).await?;
    let mut schemas = Vec::with_capacity(tables.len());
    for t in tables {
        schemas.push(describe_followed(&client, p, t).await?);
    }
    let problems = check(p, &schemas);
    if problems.is_empty() {
        return Ok(());
    }
    let mut message = format!(
        "pipeline `{}`: {} layout entr{} of skippr.yml do{} not fit the table's columns; nothing was written",
        p.name,
        problems.len(),
        if problems.len() == 1 { "y" } else { "ies" },
        if problems.len() == 1 { "es" } else { "" }
    );
    for pr in &problems {
        message.push_str(&format!("\n  {}\n    fix: {}", pr.detail, pr.fix));
    }
    Err(Error::config(message))
}

/// "at skippr.yml line 12" (or the entry's path when its line is unknown).
fn place(at: Option<&Located>) -> String {
    match at {
        Some(Located {
            file,
            position: Some(pos),
            ..
        }) => format!("in {} line {}", file.display(), pos.line),
        Some(l) => format!("in {} ({})", l.file.display(), l.path),
        None => "in skippr.yml".into(),
    }
}

fn fields(schema: &Schema) -> impl Iterator<Item = &NestedFieldRef> {
    schema.as_struct().fields().iter()
}

fn fits(t: &Transform, f: &NestedFieldRef) -> bool {
    matches!(*f.field_type, Type::Primitive(_)) && t.result_type(&f.field_type).is_ok()
}

/// The fix for an entry naming a column the table does not have.
fn unknown_column_fix(column: &str, schema: &Schema, table: &str, at: Option<&Located>) -> String {
    let spelled = fields(schema).find(|f| f.name.to_lowercase() == column.to_lowercase());
    match spelled {
        Some(f) => format!(
            "{}: the column is spelled `{}`: write it as '\"{}\"' (double quotes inside YAML's single quotes; a bare name is folded to lower case, as Postgres folds it)",
            place(at),
            f.name,
            f.name
        ),
        None => {
            // A column the name is part of (`customer` for `customer_id`), or the other way.
            let lower = column.to_lowercase();
            let near: Vec<String> = fields(schema)
                .filter(|f| {
                    let name = f.name.to_lowercase();
                    name.contains(&lower) || lower.contains(&name)
                })
                .map(|f| format!("`{}`", f.name))
                .collect();
            let hint = if near.is_empty() {
                String::new()
            } else {
                format!(" (perhaps {})", join_or(&near))
            };
            format!(
                "{}: name one of the columns of {table}{hint} (`skipprd discover` lists them), or remove the entry",
                place(at)
            )
        }
    }
}

/// The fix for a `partition_by` entry that does not fit: the entries that fit its column,
/// and for a date or time transform the columns it fits.
fn partition_fix(
    entry: &PartitionEntry,
    schema: &Schema,
    table: &str,
    at: Option<&Located>,
) -> String {
    let Some(field) = schema.field_by_name(&entry.column) else {
        return unknown_column_fix(&entry.column, schema, table, at);
    };
    let with = |column: &str, transform: Transform| {
        PartitionEntry {
            column: column.to_string(),
            transform,
        }
        .to_string()
    };
    let width = match *field.field_type {
        Type::Primitive(iceberg::spec::PrimitiveType::String)
        | Type::Primitive(iceberg::spec::PrimitiveType::Binary) => 4,
        _ => 10,
    };
    let candidates = [
        Transform::Identity,
        Transform::Day,
        Transform::Month,
        Transform::Year,
        Transform::Hour,
        Transform::Bucket(16),
        Transform::Truncate(width),
    ];
    let fitting: Vec<String> = candidates
        .iter()
        .filter(|t| fits(t, field))
        .map(|t| format!("`{}`", with(&entry.column, *t)))
        .collect();
    let mut fix = if fitting.is_empty() {
        format!(
            "{}: {}.{} ({}) cannot be partitioned by; partition by another column, or remove the entry",
            place(at),
            table,
            entry.column,
            field.field_type
        )
    } else {
        format!(
            "{}: write an entry that fits {} ({}): {}",
            place(at),
            entry.column,
            field.field_type,
            join_or(&fitting)
        )
    };
    if matches!(
        entry.transform,
        Transform::Year | Transform::Month | Transform::Day | Transform::Hour
    ) {
        let others: Vec<String> = fields(schema)
            .filter(|f| f.name != entry.column && fits(&entry.transform, f))
            .map(|f| format!("`{}`", with(&f.name, entry.transform)))
            .collect();
        if !others.is_empty() {
            fix.push_str(&format!(
                "; or partition by {} of a column it fits: {}",
                with("...", entry.transform).replace("(...)", "()"),
                join_or(&others)
            ));
        }
    }
    fix
}

/// `a`, `a or b`, `a, b or c`.
fn join_or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::schema::Column;
    use crate::change::types::PgType;
    use crate::config::Config;
    use crate::testing::assert_contains;

    fn column(name: &str, pg: PgType, pg_type_name: &str) -> Column {
        Column::for_test(name, pg, pg_type_name)
    }

    fn orders() -> TableSchema {
        TableSchema::for_test(
            "orders",
            vec![
                column("id", PgType::Int8, "bigint"),
                column(
                    "created_at",
                    PgType::Timestamptz,
                    "timestamp with time zone",
                ),
                column("note", PgType::Text, "text"),
                column("Region", PgType::Text, "text"),
                column("tags", PgType::Array(Box::new(PgType::Text)), "text[]"),
            ],
        )
    }

    fn pipeline(tables: &str) -> PipelineConfig {
        let text = format!(
            "skippr:\n  workspace: w\npipelines:\n  app:\n    data_source: data_sources.db\n    data_sink: data_sinks.lake\n    tables:\n{tables}data_sources:\n  db:\n    Postgres: {{host: h, user: u, database: d, tables: [orders]}}\ndata_sinks:\n  lake:\n    LocalIceberg: {{warehouse: ./w}}\n"
        );
        let config = Config::from_str(std::path::Path::new("/tmp/c/skippr.yml"), &text, &|_| None)
            .expect("the test config loads");
        config.pipelines[0].clone()
    }

    #[test]
    fn a_layout_that_fits_passes() {
        let p = pipeline("      orders:\n        partition_by: [day(created_at), bucket(16, id), truncate(4, note), '\"Region\"']\n        sort_by: [created_at desc]\n");
        assert_eq!(check(&p, &[orders()]), Vec::new());
    }

    #[test]
    fn an_unknown_column_names_the_line_and_the_columns() {
        let p = pipeline("      orders:\n        partition_by:\n          - day(created_at)\n          - bucket(8, customer_id)\n        sort_by: [region]\n");
        let problems = check(&p, &[orders()]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        let d = &problems[0];
        assert!(
            d.detail.starts_with("/tmp/c/skippr.yml:11:"),
            "{}",
            d.detail
        );
        assert_contains(
            &d.detail,
            &["partition_by[1]", "customer_id", "created_at, note"],
        );
        assert_contains(&d.fix, &["line 11"]);
        // A mixed-case column written bare: the fix says how to quote it.
        let s = &problems[1];
        assert_contains(&s.detail, &["sort_by[0]"]);
        assert_contains(&s.fix, &["'\"Region\"'"]);
    }

    #[test]
    fn a_transform_that_does_not_fit_names_what_does() {
        let p = pipeline(
            "      orders:\n        partition_by: [day(note), hour(tags)]\n        sort_by: [tags]\n",
        );
        let problems = check(&p, &[orders()]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        let day = &problems[0];
        assert_contains(&day.detail, &["`day(note)` does not fit", ":9:"]);
        assert_contains(
            &day.fix,
            &[
                "`bucket(16, note)`",
                "`truncate(4, note)`",
                "`day(created_at)`",
            ],
        );
        assert_contains(&problems[1].fix, &["cannot be partitioned by"]);
        assert_contains(&problems[2].detail, &["has no order"]);
    }

    #[test]
    fn join_or_reads_as_a_sentence() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(join_or(&s(&["a"])), "a");
        assert_eq!(join_or(&s(&["a", "b"])), "a or b");
        assert_eq!(join_or(&s(&["a", "b", "c"])), "a, b or c");
    }
}
