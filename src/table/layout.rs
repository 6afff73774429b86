//! The table layer, layout: how a table's rows are laid out in files — its partition spec
//! and sort order — from what `skippr.yml` asks (`pipelines.<name>.tables.<table>.partition_by`
//! and `sort_by`), written as the Iceberg spec and Spark's DDL name the transforms.
//!
//! Parsing needs only the text (so `skipprd validate` can refuse a malformed entry without
//! a source); binding to a schema checks the columns and that each transform fits its
//! column's type, and gives Iceberg's partition spec and sort order.

use std::fmt;

use iceberg::spec::{
    NullOrder, Schema, SortDirection, SortField, SortOrder, Transform, Type, UnboundPartitionSpec,
};

/// One `partition_by` entry: a column and the transform of its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionEntry {
    pub column: String,
    pub transform: Transform,
}

/// One `sort_by` entry: a column, its direction and where its nulls go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortEntry {
    pub column: String,
    pub descending: bool,
    pub nulls_first: bool,
}

/// A table's layout: partitioned by, then sorted by (both empty: one unsorted partition).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    pub partition_by: Vec<PartitionEntry>,
    pub sort_by: Vec<SortEntry>,
}

/// The transforms `partition_by` takes, for messages.
pub const TRANSFORMS: &str =
    "a column name, year(c), month(c), day(c), hour(c), bucket(N, c) or truncate(W, c)";

/// A column name as written: bare (folded to lower case, as Postgres folds it) or in double
/// quotes (kept as written).
pub fn column(text: &str) -> Option<String> {
    let t = text.trim();
    if let Some(inner) = t.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        return (!inner.is_empty() && !inner.contains('"')).then(|| inner.to_string());
    }
    let ok = t
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && t.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '$');
    ok.then(|| t.to_lowercase())
}

fn width(text: &str, what: &str, entry: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "`{entry}`: {what} must be a whole number above 0, not `{}`",
            text.trim()
        )),
    }
}

impl PartitionEntry {
    /// Reads one entry: `col`, `day(col)`, `bucket(16, col)` ...
    pub fn parse(entry: &str) -> Result<Self, String> {
        let e = entry.trim();
        let Some(open) = e.find('(') else {
            return column(e)
                .map(|column| Self {
                    column,
                    transform: Transform::Identity,
                })
                .ok_or_else(|| {
                    format!("`{e}` is not a column name or a transform: use {TRANSFORMS}")
                });
        };
        let Some(args) = e[open + 1..].strip_suffix(')') else {
            return Err(format!("`{e}` is missing its closing parenthesis"));
        };
        let name = e[..open].trim().to_lowercase();
        let args: Vec<&str> = args.split(',').collect();
        let one = |args: &[&str]| match args {
            [c] => column(c).ok_or_else(|| format!("`{e}`: `{}` is not a column name", c.trim())),
            _ => Err(format!("`{e}`: {name}() takes one column")),
        };
        let (column, transform) = match name.as_str() {
            "identity" => (one(&args)?, Transform::Identity),
            "year" | "years" => (one(&args)?, Transform::Year),
            "month" | "months" => (one(&args)?, Transform::Month),
            "day" | "days" | "date" => (one(&args)?, Transform::Day),
            "hour" | "hours" | "date_hour" => (one(&args)?, Transform::Hour),
            "bucket" | "truncate" => {
                let [n, c] = args.as_slice() else {
                    return Err(format!(
                        "`{e}`: {name}() takes a width and a column, as {name}({}, c)",
                        if name == "bucket" { "N" } else { "W" }
                    ));
                };
                let c = column(c)
                    .ok_or_else(|| format!("`{e}`: `{}` is not a column name", c.trim()))?;
                if name == "bucket" {
                    (c, Transform::Bucket(width(n, "the number of buckets", e)?))
                } else {
                    (c, Transform::Truncate(width(n, "the width", e)?))
                }
            }
            other => {
                return Err(format!(
                    "`{e}`: `{other}` is not a transform: use {TRANSFORMS}"
                ))
            }
        };
        Ok(Self { column, transform })
    }

    /// The partition field's name, as Iceberg's writers name it (`created_at_day`,
    /// `customer_id_bucket`; a column by its own name).
    pub fn field_name(&self) -> String {
        let suffix = match self.transform {
            Transform::Identity => return self.column.clone(),
            Transform::Year => "year",
            Transform::Month => "month",
            Transform::Day => "day",
            Transform::Hour => "hour",
            Transform::Bucket(_) => "bucket",
            Transform::Truncate(_) => "trunc",
            _ => "part",
        };
        format!("{}_{suffix}", self.column)
    }
}

impl fmt::Display for PartitionEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.column;
        match self.transform {
            Transform::Identity => write!(f, "{c}"),
            Transform::Year => write!(f, "year({c})"),
            Transform::Month => write!(f, "month({c})"),
            Transform::Day => write!(f, "day({c})"),
            Transform::Hour => write!(f, "hour({c})"),
            Transform::Bucket(n) => write!(f, "bucket({n}, {c})"),
            Transform::Truncate(w) => write!(f, "truncate({w}, {c})"),
            other => write!(f, "{other}({c})"),
        }
    }
}

impl SortEntry {
    /// Reads one entry: `col [asc|desc] [nulls first|last]`. Nulls go first in ascending
    /// order and last in descending order unless the entry says otherwise (Spark's rule).
    pub fn parse(entry: &str) -> Result<Self, String> {
        let e = entry.trim();
        let words: Vec<&str> = e.split_whitespace().collect();
        let Some((first, rest)) = words.split_first() else {
            return Err("an empty `sort_by` entry: name a column".into());
        };
        let column =
            column(first).ok_or_else(|| format!("`{e}`: `{first}` is not a column name"))?;
        let lower: Vec<String> = rest.iter().map(|w| w.to_lowercase()).collect();
        let lower: Vec<&str> = lower.iter().map(String::as_str).collect();
        let (descending, rest) = match lower.as_slice() {
            ["desc", rest @ ..] => (true, rest),
            ["asc", rest @ ..] => (false, rest),
            rest => (false, rest),
        };
        let nulls_first = match rest {
            [] => !descending,
            ["nulls", "first"] => true,
            ["nulls", "last"] => false,
            _ => {
                return Err(format!(
                    "`{e}`: a sort entry is `column [asc|desc] [nulls first|last]`"
                ))
            }
        };
        Ok(Self {
            column,
            descending,
            nulls_first,
        })
    }
}

impl fmt::Display for SortEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.column)?;
        if self.descending {
            write!(f, " desc")?;
        }
        if self.nulls_first == self.descending {
            write!(
                f,
                " nulls {}",
                if self.nulls_first { "first" } else { "last" }
            )?;
        }
        Ok(())
    }
}

impl Layout {
    /// Reads `partition_by` and `sort_by` as written; every problem is named (all of them).
    pub fn parse(partition_by: &[String], sort_by: &[String]) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        let partition_by: Vec<PartitionEntry> = partition_by
            .iter()
            .filter_map(|p| PartitionEntry::parse(p).map_err(|e| problems.push(e)).ok())
            .collect();
        let sort_by: Vec<SortEntry> = sort_by
            .iter()
            .filter_map(|s| SortEntry::parse(s).map_err(|e| problems.push(e)).ok())
            .collect();
        for (i, p) in partition_by.iter().enumerate() {
            if partition_by[..i]
                .iter()
                .any(|q| q.field_name() == p.field_name())
            {
                problems.push(format!("`{p}` is given twice in `partition_by`"));
            }
        }
        for (i, s) in sort_by.iter().enumerate() {
            if sort_by[..i].iter().any(|q| q.column == s.column) {
                problems.push(format!("`{}` is given twice in `sort_by`", s.column));
            }
        }
        if problems.is_empty() {
            Ok(Self {
                partition_by,
                sort_by,
            })
        } else {
            Err(problems)
        }
    }

    /// The layout a table has now: its current spec and sort order, over its columns.
    pub fn of_table(meta: &iceberg::spec::TableMetadata) -> Self {
        let schema = meta.current_schema();
        let name = |id: i32| schema.name_by_field_id(id).map(str::to_string);
        let partition_by = meta
            .default_partition_spec()
            .fields()
            .iter()
            .filter_map(|f| {
                Some(PartitionEntry {
                    column: name(f.source_id)?,
                    transform: f.transform,
                })
            })
            .collect();
        let sort_by = meta
            .default_sort_order()
            .fields
            .iter()
            .filter_map(|f| {
                Some(SortEntry {
                    column: name(f.source_id)?,
                    descending: f.direction == SortDirection::Descending,
                    nulls_first: f.null_order == NullOrder::First,
                })
            })
            .collect();
        Self {
            partition_by,
            sort_by,
        }
    }

    /// `partition_by` as `skippr.yml` writes it, entries joined by `, ` (empty: none).
    pub fn partition_text(&self) -> String {
        let parts: Vec<String> = self.partition_by.iter().map(|p| p.to_string()).collect();
        parts.join(", ")
    }

    /// `sort_by` as `skippr.yml` writes it, entries joined by `, ` (empty: none).
    pub fn sort_text(&self) -> String {
        let sorts: Vec<String> = self.sort_by.iter().map(|s| s.to_string()).collect();
        sorts.join(", ")
    }

    /// Whether the table is one partition, unsorted.
    pub fn is_plain(&self) -> bool {
        self.partition_by.is_empty() && self.sort_by.is_empty()
    }

    /// Checks the layout against a table's schema: every column exists, every transform fits
    /// its column's type. Each problem is named with its fix.
    pub fn check(&self, schema: &Schema, table: &str) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let names = || {
            schema
                .as_struct()
                .fields()
                .iter()
                .map(|f| f.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for p in &self.partition_by {
            match schema.field_by_name(&p.column) {
                None => problems.push(format!(
                    "`partition_by` names `{}`, which is not a column of {table} (its columns: {})",
                    p.column,
                    names()
                )),
                Some(f) => {
                    let fits = matches!(*f.field_type, Type::Primitive(_))
                        && p.transform.result_type(&f.field_type).is_ok();
                    if !fits {
                        problems.push(format!(
                            "`{p}` does not fit {table}.{} ({}): {}",
                            p.column,
                            f.field_type,
                            takes(&p.transform)
                        ));
                    }
                }
            }
        }
        for s in &self.sort_by {
            match schema.field_by_name(&s.column) {
                None => problems.push(format!(
                    "`sort_by` names `{}`, which is not a column of {table} (its columns: {})",
                    s.column,
                    names()
                )),
                Some(f) if !matches!(*f.field_type, Type::Primitive(_)) => problems.push(format!(
                    "`sort_by` names {table}.{}, whose type ({}) has no order",
                    s.column, f.field_type
                )),
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Iceberg's partition spec for this layout over `schema` (checked first, see
    /// [`Layout::check`]).
    pub fn partition_spec(&self, schema: &Schema) -> iceberg::Result<UnboundPartitionSpec> {
        let mut b = UnboundPartitionSpec::builder();
        for p in &self.partition_by {
            let id = schema.field_id_by_name(&p.column).ok_or_else(|| {
                iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!("no column {} to partition by", p.column),
                )
            })?;
            b = b.add_partition_field(id, p.field_name(), p.transform)?;
        }
        Ok(b.build())
    }

    /// Iceberg's sort order for this layout over `schema` (order id 1; unsorted: 0).
    pub fn sort_order(&self, schema: &Schema) -> iceberg::Result<SortOrder> {
        if self.sort_by.is_empty() {
            return Ok(SortOrder::unsorted_order());
        }
        let mut b = SortOrder::builder();
        b.with_order_id(1);
        for s in &self.sort_by {
            let id = schema.field_id_by_name(&s.column).ok_or_else(|| {
                iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!("no column {} to sort by", s.column),
                )
            })?;
            b.with_sort_field(SortField {
                source_id: id,
                transform: Transform::Identity,
                direction: if s.descending {
                    SortDirection::Descending
                } else {
                    SortDirection::Ascending
                },
                null_order: if s.nulls_first {
                    NullOrder::First
                } else {
                    NullOrder::Last
                },
            });
        }
        b.build(schema)
    }
}

impl fmt::Display for Layout {
    /// As `discover` prints it: `partitioned by day(created_at), bucket(16, id); sorted by
    /// created_at`, or `unpartitioned`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |v: Vec<String>| v.join(", ");
        if self.partition_by.is_empty() {
            write!(f, "unpartitioned")?;
        } else {
            let parts = join(self.partition_by.iter().map(|p| p.to_string()).collect());
            write!(f, "partitioned by {parts}")?;
        }
        if !self.sort_by.is_empty() {
            let sorts = join(self.sort_by.iter().map(|s| s.to_string()).collect());
            write!(f, "; sorted by {sorts}")?;
        }
        Ok(())
    }
}

/// What a transform takes, for messages.
fn takes(t: &Transform) -> &'static str {
    match t {
        Transform::Year | Transform::Month | Transform::Day => {
            "it takes a date or timestamp column"
        }
        Transform::Hour => "it takes a timestamp column",
        Transform::Bucket(_) => {
            "it takes an integer, numeric, date, time, timestamp, text, uuid or bytea column"
        }
        Transform::Truncate(_) => "it takes an integer, numeric, text or bytea column",
        _ => "it takes a column of a simple type",
    }
}

#[cfg(test)]
mod tests;
