//! Configuration, table layouts: what `skippr.yml` asks of a table's layout
//! (`pipelines.<name>.tables.<table>.partition_by` and `sort_by`), read as written: the
//! partition transforms and sort entries as the Iceberg spec and Spark's DDL name them.
//! Parsing needs only the text (so `skipprd validate` can refuse a malformed entry without
//! a source); binding a layout to a table's schema is the table layer's (its `layout`
//! module).

use std::fmt;

use iceberg::spec::Transform;

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
