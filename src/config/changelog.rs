//! Config, the changelog table of each table (`pipelines.<name>.tables.<table>.changelog`):
//! its Iceberg name, refused at its `skippr.yml` line when no catalog takes it, when it is
//! the name of a table the pipeline already writes, or when the source sends no changes.

use std::collections::BTreeMap;

use super::locate::Segment;
use super::model::{changelog_name, ChangelogDef};
use super::{keys, PipelineDef, TableRef, Validator};

impl Validator<'_> {
    /// `pipelines.<p>.tables.<t>.changelog`: the Iceberg name of each table's changelog
    /// table. `listed`: the data source's name and its `tables:`; `snapshot_only`: whether it
    /// only copies the tables (and so has no changes to record).
    pub(super) fn changelogs(
        &mut self,
        pipeline: &str,
        def: &PipelineDef,
        listed: Option<(&str, &[String])>,
        snapshot_only: bool,
    ) -> BTreeMap<TableRef, String> {
        // The Iceberg tables the pipeline writes, and what each one holds.
        let mut written: BTreeMap<String, String> = listed
            .map(|(_, tables)| tables)
            .unwrap_or_default()
            .iter()
            .filter_map(|t| TableRef::parse(t))
            .map(|t| {
                (
                    t.iceberg_name(),
                    format!("the Iceberg table of `{}`", t.config_key()),
                )
            })
            .collect();
        let mut out = BTreeMap::new();
        for (key, t) in def.tables.iter() {
            let Some(table) = TableRef::parse(key) else {
                continue; // reported with the table's layout
            };
            let mut at = keys(&["pipelines", pipeline, "tables", key, "changelog"]);
            let name = match &t.changelog {
                None | Some(ChangelogDef::On(false)) => continue,
                Some(ChangelogDef::On(true)) => format!("{}_changelog", table.iceberg_name()),
                Some(ChangelogDef::Named(n)) => {
                    at.push(Segment::Key("table".into()));
                    let name = n.table.trim();
                    if let Err(msg) = changelog_name(name) {
                        self.report(at, msg);
                        continue;
                    }
                    name.to_string()
                }
            };
            if snapshot_only {
                let source = listed.map(|(s, _)| s).unwrap_or_default();
                self.report(
                    keys(&["pipelines", pipeline, "tables", key, "changelog"]),
                    format!("a changelog records the changes replication brings, and data source `{source}` has `cdc_mode: snapshot_only`: set `cdc_mode: snapshot_then_cdc` (or `cdc_only`), or remove `changelog`"),
                );
                continue;
            }
            if let Some(holds) = written.get(&name) {
                let fix = if matches!(t.changelog, Some(ChangelogDef::On(true))) {
                    "name it yourself with `changelog: {table: <name>}`"
                } else {
                    "give the changelog table another name"
                };
                self.report(at, format!("{}: {fix}", taken(key, &name, holds)));
                continue;
            }
            written.insert(name.clone(), format!("the changelog of `{key}`"));
            out.insert(table, name);
        }
        out
    }
}

/// The changelog of `table` would be Iceberg table `name`, which already `holds` another.
pub fn taken(table: &str, name: &str, holds: &str) -> String {
    format!("the changelog of `{table}` would be Iceberg table `{name}`, which is already {holds}")
}
