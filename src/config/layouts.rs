//! Config, the layout of each table (`pipelines.<name>.tables.<table>.partition_by` and
//! `sort_by`): read as written, refused at its `skippr.yml` line when malformed or about a
//! table the source does not list, and resolved into [`crate::config::layout::Layout`]s with
//! the place of every entry, so that `discover` and `sync` name the line of an entry that
//! does not fit the table's columns.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::locate::{display_path, Position, Segment};
use super::{keys, PipelineDef, TableRef, Validator};
use crate::config::layout::{Layout, PartitionEntry, SortEntry};

/// A place in `skippr.yml`: the file, the line and column, and the field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub file: PathBuf,
    pub position: Option<Position>,
    pub path: String,
}

impl fmt::Display for Located {
    /// `skippr.yml:12:9: pipelines.app.tables.orders.partition_by[1]`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(p) = self.position {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        write!(f, ": {}", self.path)
    }
}

/// Where a table's layout is written: the table's key and each entry, in the order of the
/// resolved [`Layout`]'s `partition_by` and `sort_by`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutOrigin {
    pub table: Located,
    pub partition_by: Vec<Located>,
    pub sort_by: Vec<Located>,
}

/// The entries of a `partition_by` or `sort_by` list, each with the index of the list item
/// it starts at. YAML splits an unquoted entry of a flow list at its commas
/// (`[day(created_at), bucket(16, customer_id)]` reads as `day(created_at)`, `bucket(16`,
/// `customer_id)`); items that leave a parenthesis open are joined back with the items that
/// close it, as they were written.
pub fn rejoin(items: &[String]) -> Vec<(usize, String)> {
    let depth = |s: &str| {
        s.chars().fold(0i64, |d, c| match c {
            '(' => d + 1,
            ')' => d - 1,
            _ => d,
        })
    };
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = 0i64;
    for (i, item) in items.iter().enumerate() {
        match out.last_mut() {
            Some((_, entry)) if open > 0 => {
                entry.push_str(", ");
                entry.push_str(item.trim());
            }
            _ => out.push((i, item.clone())),
        }
        open = match out.last() {
            Some((_, entry)) => depth(entry),
            None => 0,
        };
    }
    out
}

impl Validator<'_> {
    fn located(&self, path: &[Segment]) -> Located {
        Located {
            file: self.file.to_path_buf(),
            position: self.locator.find(path),
            path: display_path(path),
        }
    }

    /// `pipelines.<pipeline>.tables`: each table's layout and where it is written. `listed`
    /// is the data source's name and its `tables:` as written, when the pipeline's source
    /// resolves to a Postgres source.
    pub(super) fn layouts(
        &mut self,
        pipeline: &str,
        def: &PipelineDef,
        listed: Option<(&str, &[String])>,
    ) -> (BTreeMap<TableRef, Layout>, BTreeMap<TableRef, LayoutOrigin>) {
        let mut layouts = BTreeMap::new();
        let mut origins = BTreeMap::new();
        let mut seen: BTreeMap<TableRef, &str> = BTreeMap::new();
        for (key, t) in def.tables.iter() {
            let at = keys(&["pipelines", pipeline, "tables", key]);
            let Some(table) = TableRef::parse(key) else {
                self.report(
                    at,
                    format!("`{key}` is not a table name: write it as the source's `tables:` lists it, `name` (schema public) or `schema.name`"),
                );
                continue;
            };
            if let Some((source, tables)) = listed {
                let known: Vec<TableRef> =
                    tables.iter().filter_map(|t| TableRef::parse(t)).collect();
                if !known.contains(&table) {
                    self.report(
                        at.clone(),
                        format!(
                            "`{key}` is not one of the tables data source `{source}` follows ({}): add it to data_sources.{source}.Postgres.tables, or correct the name here",
                            tables.join(", ")
                        ),
                    );
                }
            }
            if let Some(first) = seen.get(&table) {
                self.report(
                    at.clone(),
                    format!("`{key}` is the same table as `{first}` above: give each table's settings once"),
                );
                continue;
            }
            seen.insert(table.clone(), key);

            let before = self.problems.len();
            let entries = |items: &[String]| -> Vec<(Segment, String)> {
                rejoin(items)
                    .into_iter()
                    .map(|(i, e)| (Segment::Index(i), e))
                    .collect()
            };
            let partition = entries(&t.partition_by);
            let sort = entries(&t.sort_by);
            let item = |field: &str, seg: &Segment| {
                let mut p = at.clone();
                p.push(Segment::Key(field.to_string()));
                p.push(seg.clone());
                p
            };
            for (seg, e) in &partition {
                if let Err(msg) = PartitionEntry::parse(e) {
                    self.report(item("partition_by", seg), msg);
                }
            }
            for (seg, e) in &sort {
                if let Err(msg) = SortEntry::parse(e) {
                    self.report(item("sort_by", seg), msg);
                }
            }
            if self.problems.len() != before {
                continue;
            }
            let texts =
                |v: &[(Segment, String)]| v.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>();
            // Entries each read; what is left is a column given twice.
            let parsed_p = Layout::parse(&texts(&partition), &[]);
            let parsed_s = Layout::parse(&[], &texts(&sort));
            for (field, problems) in [
                ("partition_by", parsed_p.as_ref().err()),
                ("sort_by", parsed_s.as_ref().err()),
            ] {
                for msg in problems.into_iter().flatten() {
                    let mut p = at.clone();
                    p.push(Segment::Key(field.to_string()));
                    self.report(p, format!("{msg}: give each entry once"));
                }
            }
            let (Ok(p), Ok(s)) = (parsed_p, parsed_s) else {
                continue;
            };
            let origin = LayoutOrigin {
                table: self.located(&at),
                partition_by: partition
                    .iter()
                    .map(|(seg, _)| self.located(&item("partition_by", seg)))
                    .collect(),
                sort_by: sort
                    .iter()
                    .map(|(seg, _)| self.located(&item("sort_by", seg)))
                    .collect(),
            };
            layouts.insert(
                table.clone(),
                Layout {
                    partition_by: p.partition_by,
                    sort_by: s.sort_by,
                },
            );
            origins.insert(table, origin);
        }
        (layouts, origins)
    }

    /// `pipelines.<p>.tables.<t>.exclude_columns`, each table's columns as names (bare ones
    /// folded to lower case, as Postgres folds them).
    pub(super) fn exclude_columns(
        &mut self,
        pipeline: &str,
        def: &PipelineDef,
    ) -> BTreeMap<TableRef, Vec<String>> {
        let mut out = BTreeMap::new();
        for (key, t) in def.tables.iter() {
            let Some(table) = TableRef::parse(key) else {
                continue; // reported with the table's layout
            };
            let mut names: Vec<String> = Vec::new();
            for (i, entry) in t.exclude_columns.iter().enumerate() {
                let at = || {
                    let mut p = keys(&["pipelines", pipeline, "tables", key, "exclude_columns"]);
                    p.push(Segment::Index(i));
                    p
                };
                match excluded_column(&names, entry) {
                    Ok(c) => names.push(c),
                    Err(msg) => self.report(at(), msg),
                }
            }
            if !names.is_empty() {
                out.insert(table, names);
            }
        }
        out
    }
}

/// One `exclude_columns` entry as a column name (bare ones folded to lower case), given
/// `names`, the table's entries before it; the error is the message `validate` and `connect`
/// give.
pub(super) fn excluded_column(names: &[String], entry: &str) -> Result<String, String> {
    match crate::config::layout::column(entry) {
        Some(c) if names.contains(&c) => {
            Err(format!("`{entry}` is given twice: give each column once"))
        }
        Some(c) => Ok(c),
        None => Err(format!(
            "`{entry}` is not a column name: write it bare (folded to lower case) or in double quotes"
        )),
    }
}
