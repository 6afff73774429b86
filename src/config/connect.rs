//! `skipprd connect`: creates or updates `skippr.yml` from command-line flags, keeping what
//! is already there (including `${VAR}` references, which stay literal).

use std::path::Path;

use serde_yaml::{Mapping, Value};

use super::emit::to_canonical_yaml;
use crate::error::{Context, Error, Result};

/// What one `connect` call adds.
#[derive(Debug, Clone)]
pub enum Connect {
    DataSource {
        pipeline: String,
        name: String,
        kind: &'static str,
        fields: Mapping,
    },
    DataSink {
        pipeline: String,
        name: String,
        kind: &'static str,
        fields: Mapping,
    },
    SchemaSink {
        pipeline: String,
        name: String,
        kind: &'static str,
        fields: Mapping,
    },
    /// Per-table settings of a pipeline: (table, entry) pairs in the order given. The
    /// entries of one table replace its list; an empty entry (`orders=`) clears it.
    Pipeline {
        pipeline: String,
        partition_by: Vec<(String, String)>,
        sort_by: Vec<(String, String)>,
        /// (table, column) pairs of `--exclude-column`.
        exclude_columns: Vec<(String, String)>,
        /// `--changelog`: (table, `None`) turns the table's changelog on (`changelog: true`),
        /// (table, name) names it (`changelog: {table: name}`), and an empty name removes it.
        changelog: Vec<(String, Option<String>)>,
    },
    /// Tables the pipeline's data source follows from now on (`sync --add-table`).
    AddTables {
        pipeline: String,
        tables: Vec<String>,
    },
}

fn key(s: &str) -> Value {
    Value::String(s.to_string())
}

fn section<'a>(doc: &'a mut Mapping, name: &str) -> Result<&'a mut Mapping> {
    let v = doc
        .entry(key(name))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if v.is_null() {
        *v = Value::Mapping(Mapping::new());
    }
    v.as_mapping_mut().ok_or_else(|| {
        Error::config(format!(
            "`{name}` in the config file is not a mapping; fix it by hand first"
        ))
    })
}

fn valid_name(what: &str, s: &str) -> Result<()> {
    let mut chars = s.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::config(format!(
            "`{s}` is not a valid {what} name: use letters, digits and `_`, starting with a letter or `_`"
        )))
    }
}

/// The mapping `pipelines.<p>`, made when missing.
fn pipeline_entry<'d>(doc: &'d mut Mapping, pipeline: &str) -> Result<&'d mut Mapping> {
    let pipelines = section(doc, "pipelines")?;
    let p = pipelines
        .entry(key(pipeline))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    p.as_mapping_mut().ok_or_else(|| {
        Error::config(format!(
            "pipelines.{pipeline} is not a mapping; fix it by hand first"
        ))
    })
}

/// Sets `pipelines.<p>.<field>` to `reference`, refusing to repoint an existing link.
fn link(doc: &mut Mapping, pipeline: &str, field: &str, reference: &str) -> Result<()> {
    let p = pipeline_entry(doc, pipeline)?;
    match p.get(field).and_then(Value::as_str) {
        Some(existing) if existing != reference => Err(Error::config(format!(
            "pipeline `{pipeline}` already has {field}: {existing}; choose another --pipeline, or edit skippr.yml to change it"
        ))),
        _ => {
            p.insert(key(field), key(reference));
            Ok(())
        }
    }
}

/// Defines `name` (a `what`, `data source` or `data sink`) as a `kind` with `fields`, and
/// links it to `pipeline` as its `data_source` or `data_sink`.
fn connect_end(
    doc: &mut Mapping,
    what: &str,
    pipeline: &str,
    name: &str,
    kind: &str,
    fields: Mapping,
) -> Result<()> {
    valid_name("pipeline", pipeline)?;
    valid_name(what, name)?;
    let field = what.replace(' ', "_");
    let section = format!("{field}s");
    define(doc, &section, name, kind, fields)?;
    link(doc, pipeline, &field, &format!("{section}.{name}"))
}

/// Defines `section.<name>` as connector `kind` with `fields`. An existing entry of the
/// same kind is updated: the given fields replace theirs, every other key is kept. An entry
/// of another kind is a conflict.
fn define(
    doc: &mut Mapping,
    section_name: &str,
    name: &str,
    kind: &str,
    fields: Mapping,
) -> Result<()> {
    let sec = section(doc, section_name)?;
    let entry = sec
        .entry(key(name))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    let Value::Mapping(entry) = entry else {
        return Err(Error::config(format!(
            "{section_name}.{name} in the config file is not a mapping; fix it by hand first"
        )));
    };
    let other_kind = entry
        .keys()
        .filter_map(Value::as_str)
        .find(|k| k.chars().next().is_some_and(char::is_uppercase) && *k != kind)
        .map(str::to_string);
    if let Some(other) = other_kind {
        return Err(Error::config(format!(
            "{section_name}.{name} already exists as {other}, not {kind}; choose another --name, or edit skippr.yml to change it"
        )));
    }
    let connector = entry
        .entry(key(kind))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !connector.is_mapping() {
        *connector = Value::Mapping(Mapping::new());
    }
    if let Value::Mapping(m) = connector {
        for (k, v) in fields {
            // A key given now replaces the keys it cannot stand beside.
            if let Some(excluded) = k.as_str().and_then(|k| excludes(kind, k)) {
                for other in excluded {
                    m.remove(*other);
                }
            }
            merge(m, k, v);
        }
    }
    Ok(())
}

/// The keys of connector `kind` that `field` cannot stand beside: a `RestIceberg` catalog
/// is reached with OAuth2 client credentials, a bearer token, or SigV4, one at a time.
fn excludes(kind: &str, field: &str) -> Option<&'static [&'static str]> {
    match (kind, field) {
        ("RestIceberg", "credential") => Some(&["token", "sigv4"]),
        ("RestIceberg", "token") => Some(&["credential", "sigv4", "scope"]),
        ("RestIceberg", "sigv4") => Some(&["credential", "token", "scope"]),
        _ => None,
    }
}

/// Sets `k` to `v` in `m`. A mapping given for a mapping already there (a REST catalog's
/// `properties`) updates it key by key: a null value removes that key, and a mapping left
/// empty is removed.
fn merge(m: &mut Mapping, k: Value, v: Value) {
    match (m.get_mut(&k), v) {
        (Some(Value::Mapping(old)), Value::Mapping(new)) => {
            for (nk, nv) in new {
                if nv.is_null() {
                    old.remove(&nk);
                } else {
                    old.insert(nk, nv);
                }
            }
            if old.is_empty() {
                m.remove(&k);
            }
        }
        (_, Value::Mapping(new)) => {
            let kept: Mapping = new.into_iter().filter(|(_, v)| !v.is_null()).collect();
            if kept.is_empty() {
                m.remove(&k);
            } else {
                m.insert(k, Value::Mapping(kept));
            }
        }
        (_, v) => {
            m.insert(k, v);
        }
    }
}

/// Applies `--storage-mode` and `--storage-path`: an S3 mode needs an `s3://` path, and
/// switching back to `local` drops an S3 path that no longer applies.
fn storage(skippr: &mut Mapping, mode: Option<&str>, path: Option<&str>) -> Result<()> {
    let current_path = skippr
        .get("skipprd_el_storage_path")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mode_now = mode.map(str::to_string).or_else(|| {
        skippr
            .get("skipprd_el_storage_mode")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let path_now = path.map(str::to_string).or(current_path.clone());
    match (mode_now.as_deref(), path_now.as_deref()) {
        (Some("s3"), None) => {
            return Err(Error::config(
                "--storage-mode s3 needs --storage-path s3://bucket/prefix (where the WAL and state go)",
            ))
        }
        (Some("s3"), Some(p)) => {
            crate::storage::Location::parse_s3(p)
                .map_err(|e| Error::config(format!("--storage-path: {e}")))?;
        }
        (_, Some(p)) if p.starts_with("s3://") => {
            if path.is_some() {
                return Err(Error::config(format!(
                    "--storage-path `{p}` is an S3 location: add --storage-mode s3"
                )));
            }
            // Back to local: the S3 prefix no longer applies.
            skippr.remove("skipprd_el_storage_path");
        }
        _ => {}
    }
    if let Some(m) = mode {
        skippr.insert(key("skipprd_el_storage_mode"), key(m));
    }
    if let Some(p) = path {
        skippr.insert(key("skipprd_el_storage_path"), key(p));
    }
    Ok(())
}

/// The tables the pipeline's data source lists, when the file already says: (source name,
/// its `tables:`).
fn source_tables(doc: &Mapping, pipeline: &str) -> Option<(String, Vec<String>)> {
    let reference = doc
        .get("pipelines")?
        .get(pipeline)?
        .get("data_source")?
        .as_str()?;
    let name = reference.strip_prefix("data_sources.")?;
    let tables = doc
        .get("data_sources")?
        .get(name)?
        .get("Postgres")?
        .get("tables")?
        .as_sequence()?;
    let tables = tables
        .iter()
        .map(|t| t.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()?;
    Some((name.to_string(), tables))
}

/// Appends `tables` to the `tables:` of the pipeline's data source (a table already there
/// stays where it is).
fn add_tables(doc: &mut Mapping, pipeline: &str, tables: &[String]) -> Result<()> {
    let Some((source, listed)) = source_tables(doc, pipeline) else {
        return Err(Error::config(format!(
            "pipeline `{pipeline}` has no Postgres data source with a `tables:` list in the config file; add one with `skipprd connect data-source postgres --pipeline {pipeline} ... --tables TABLE`"
        )));
    };
    let mut list = listed.clone();
    for t in tables {
        let Some(r) = super::TableRef::parse(t) else {
            return Err(Error::config(format!(
                "--add-table: `{t}` is not a table name: write `name` or `schema.name`"
            )));
        };
        if !list
            .iter()
            .any(|l| super::TableRef::parse(l).as_ref() == Some(&r))
        {
            list.push(t.clone());
        }
    }
    if let Some(Value::Mapping(pg)) = doc
        .get_mut("data_sources")
        .and_then(|s| s.get_mut(source.as_str()))
        .and_then(|s| s.get_mut("Postgres"))
    {
        pg.insert(
            key("tables"),
            Value::Sequence(list.into_iter().map(Value::String).collect()),
        );
    }
    Ok(())
}

/// `table` as a table of the pipeline: a table name, and one the pipeline's data source
/// follows when the file already says which (`listed`). `given` is the flag as written, for
/// the message (`--sort-by 'orders=id'`).
fn flag_table(
    given: &str,
    table: &str,
    listed: &Option<(String, Vec<String>)>,
) -> Result<super::TableRef> {
    let Some(r) = super::TableRef::parse(table) else {
        return Err(Error::config(format!(
            "{given}: `{table}` is not a table name: write `name` or `schema.name`, as the source's `tables:` lists it"
        )));
    };
    if let Some((source, listed)) = listed {
        if !listed
            .iter()
            .any(|t| super::TableRef::parse(t).as_ref() == Some(&r))
        {
            return Err(Error::config(format!(
                "{given}: `{table}` is not one of the tables data source `{source}` follows ({}): add it with `connect data-source ... --tables {table}`, or correct the name",
                listed.join(", ")
            )));
        }
    }
    Ok(r)
}

/// Sets `pipelines.<p>.tables.<table>.<field>` from `--partition-by`, `--sort-by` or
/// `--exclude-column` (`field`): every table given gets the entries given for it, in order,
/// checked as `validate` checks them; an empty entry clears the list. Other tables and keys
/// are kept.
fn table_settings(
    doc: &mut Mapping,
    pipeline: &str,
    field: &str,
    given: &[(String, String)],
) -> Result<()> {
    use crate::config::layout::{column, PartitionEntry, SortEntry};
    let flag = match field {
        "exclude_columns" => "--exclude-column".to_string(),
        other => format!("--{}", other.replace('_', "-")),
    };
    let listed = source_tables(doc, pipeline);
    let mut tables: Vec<(&str, Vec<String>)> = Vec::new();
    for (table, entry) in given {
        flag_table(&format!("{flag} '{table}={entry}'"), table, &listed)?;
        let at = match tables.iter().position(|(t, _)| *t == table.as_str()) {
            Some(i) => i,
            None => {
                tables.push((table.as_str(), Vec::new()));
                tables.len() - 1
            }
        };
        if entry.trim().is_empty() {
            continue;
        }
        let checked = match field {
            "partition_by" => PartitionEntry::parse(entry).map(|_| ()),
            "sort_by" => SortEntry::parse(entry).map(|_| ()),
            _ => {
                // The columns given for this table before: each column once.
                let before: Vec<String> = tables[at].1.iter().filter_map(|e| column(e)).collect();
                super::layouts::excluded_column(&before, entry).map(|_| ())
            }
        };
        checked.map_err(|e| Error::config(format!("{flag} '{table}={entry}': {e}")))?;
        tables[at].1.push(entry.trim().to_string());
    }
    let values = tables
        .into_iter()
        .map(|(table, entries)| {
            let list = (!entries.is_empty())
                .then(|| Value::Sequence(entries.into_iter().map(Value::String).collect()));
            (table, list)
        })
        .collect();
    set_table_field(doc, pipeline, field, values)
}

/// Sets `pipelines.<p>.tables.<table>.changelog` from `--changelog`: `TABLE` turns it on,
/// `TABLE=NAME` names it, `TABLE=` removes it; the name is checked as `validate` checks it,
/// and must not be the Iceberg table of a table the source follows. The last flag given for
/// a table wins.
fn changelog_settings(
    doc: &mut Mapping,
    pipeline: &str,
    given: &[(String, Option<String>)],
) -> Result<()> {
    let listed = source_tables(doc, pipeline);
    let mut values: Vec<(&str, Option<Value>)> = Vec::new();
    for (table, name) in given {
        let shown = match name {
            None => format!("--changelog '{table}'"),
            Some(n) => format!("--changelog '{table}={n}'"),
        };
        let r = flag_table(&shown, table, &listed)?;
        let (value, iceberg_name) = match name.as_deref().map(str::trim) {
            None => (Value::Bool(true), format!("{}_changelog", r.iceberg_name())),
            Some("") => {
                values.retain(|(t, _)| *t != table.as_str());
                values.push((table.as_str(), None));
                continue;
            }
            Some(n) => {
                super::model::changelog_name(n)
                    .map_err(|e| Error::config(format!("{shown}: {e}")))?;
                let named = Mapping::from_iter([(key("table"), key(n))]);
                (Value::Mapping(named), n.to_string())
            }
        };
        let synced = listed
            .iter()
            .flat_map(|(_, tables)| tables)
            .find(|t| super::TableRef::parse(t).is_some_and(|t| t.iceberg_name() == iceberg_name));
        if let Some(synced) = synced {
            return Err(Error::config(format!(
                "{shown}: {}: give it another name with --changelog '{table}=<name>'",
                super::changelog::taken(
                    table,
                    &iceberg_name,
                    &format!("the Iceberg table of `{synced}`")
                ),
            )));
        }
        values.retain(|(t, _)| *t != table.as_str());
        values.push((table.as_str(), Some(value)));
    }
    set_table_field(doc, pipeline, "changelog", values)
}

/// Sets (`Some`) or removes (`None`) `pipelines.<p>.tables.<table>.<field>` for each table
/// given. A table left with no settings goes, and so does a `tables:` left empty; removing
/// what is not there makes no pipeline.
fn set_table_field(
    doc: &mut Mapping,
    pipeline: &str,
    field: &str,
    values: Vec<(&str, Option<Value>)>,
) -> Result<()> {
    let exists = doc
        .get("pipelines")
        .and_then(|p| p.get(pipeline))
        .and_then(|p| p.get("tables"))
        .is_some();
    if values.iter().all(|(_, v)| v.is_none()) && !exists {
        // Only clearing, and nothing to clear.
        return Ok(());
    }
    let p = pipeline_entry(doc, pipeline)?;
    let settings = p
        .entry(key("tables"))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if settings.is_null() {
        *settings = Value::Mapping(Mapping::new());
    }
    let settings = settings.as_mapping_mut().ok_or_else(|| {
        Error::config(format!(
            "pipelines.{pipeline}.tables is not a mapping; fix it by hand first"
        ))
    })?;
    for (table, value) in values {
        let t = settings
            .entry(key(table))
            .or_insert_with(|| Value::Mapping(Mapping::new()));
        if t.is_null() {
            *t = Value::Mapping(Mapping::new());
        }
        let t = t.as_mapping_mut().ok_or_else(|| {
            Error::config(format!(
                "pipelines.{pipeline}.tables.{table} is not a mapping; fix it by hand first"
            ))
        })?;
        match value {
            Some(v) => {
                t.insert(key(field), v);
            }
            None => {
                t.remove(field);
            }
        }
        if t.is_empty() {
            settings.remove(table);
        }
    }
    if settings.is_empty() {
        p.remove("tables");
    }
    Ok(())
}

/// Writes every `partition_by` and `sort_by` entry whole: an unquoted entry of a flow list
/// that YAML split at its commas (`bucket(16, customer_id)`) is joined back, so it is
/// written as one (quoted) entry. A table written without settings gets an empty mapping.
fn rejoin_layouts(doc: &mut Mapping) {
    let Some(Value::Mapping(pipelines)) = doc.get_mut("pipelines") else {
        return;
    };
    for (_, p) in pipelines.iter_mut() {
        let Some(Value::Mapping(tables)) = p.get_mut("tables") else {
            continue;
        };
        for (_, t) in tables.iter_mut() {
            if t.is_null() {
                *t = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(t) = t else {
                continue;
            };
            for field in ["partition_by", "sort_by"] {
                let Some(Value::Sequence(items)) = t.get_mut(field) else {
                    continue;
                };
                let Some(texts) = items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                else {
                    continue;
                };
                *items = super::layouts::rejoin(&texts)
                    .into_iter()
                    .map(|(_, e)| Value::String(e))
                    .collect();
            }
        }
    }
}

/// Applies global settings and one `connect` to the file at `path` (created if missing).
pub fn apply(
    path: &Path,
    workspace: Option<&str>,
    storage_mode: Option<&str>,
    storage_path: Option<&str>,
    what: Option<Connect>,
) -> Result<String> {
    let mut doc = if path.exists() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        match serde_yaml::from_str::<Value>(&text) {
            Ok(Value::Mapping(m)) => m,
            Ok(Value::Null) => Mapping::new(),
            Ok(_) => {
                return Err(Error::config(format!(
                    "{} is not a YAML mapping; fix it or move it away",
                    path.display()
                )))
            }
            Err(e) => {
                return Err(Error::config(format!(
                    "{} is not valid YAML ({e}); fix it or move it away",
                    path.display()
                )))
            }
        }
    } else {
        Mapping::new()
    };

    {
        let skippr = section(&mut doc, "skippr")?;
        if let Some(w) = workspace {
            valid_name("workspace", w)?;
            skippr.insert(key("workspace"), key(w));
        }
        storage(skippr, storage_mode, storage_path)?;
        if !skippr.contains_key("workspace") {
            return Err(Error::config(format!(
                "{} has no workspace yet: pass --workspace NAME (e.g. `skipprd --workspace analytics connect ...`)",
                path.display()
            )));
        }
        if !skippr.contains_key("skipprd_el_storage_mode") {
            skippr.insert(key("skipprd_el_storage_mode"), key("local"));
        }
    }

    match what {
        None => {}
        Some(Connect::DataSource {
            pipeline,
            name,
            kind,
            fields,
        }) => connect_end(&mut doc, "data source", &pipeline, &name, kind, fields)?,
        Some(Connect::DataSink {
            pipeline,
            name,
            kind,
            fields,
        }) => connect_end(&mut doc, "data sink", &pipeline, &name, kind, fields)?,
        Some(Connect::Pipeline {
            pipeline,
            partition_by,
            sort_by,
            exclude_columns,
            changelog,
        }) => {
            valid_name("pipeline", &pipeline)?;
            table_settings(&mut doc, &pipeline, "partition_by", &partition_by)?;
            table_settings(&mut doc, &pipeline, "sort_by", &sort_by)?;
            table_settings(&mut doc, &pipeline, "exclude_columns", &exclude_columns)?;
            changelog_settings(&mut doc, &pipeline, &changelog)?;
        }
        Some(Connect::AddTables { pipeline, tables }) => add_tables(&mut doc, &pipeline, &tables)?,
        Some(Connect::SchemaSink {
            pipeline,
            name,
            kind,
            fields,
        }) => {
            valid_name("schema sink", &name)?;
            let sink_ref = doc
                .get("pipelines")
                .and_then(|p| p.get(pipeline.as_str()))
                .and_then(|p| p.get("data_sink"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    Error::config(format!(
                        "pipeline `{pipeline}` has no data sink yet: run `skipprd connect data-sink ... --pipeline {pipeline}` first"
                    ))
                })?;
            let sink_name = sink_ref
                .strip_prefix("data_sinks.")
                .unwrap_or(&sink_ref)
                .to_string();
            let sink = doc
                .get("data_sinks")
                .and_then(|s| s.get(sink_name.as_str()))
                .cloned()
                .ok_or_else(|| {
                    Error::config(format!(
                        "pipeline `{pipeline}` refers to {sink_ref}, which is not defined"
                    ))
                })?;
            let fields = if fields.is_empty() {
                match sink.get(kind).and_then(Value::as_mapping) {
                    Some(m) => m.clone(),
                    None => {
                        return Err(Error::config(format!(
                            "data sink `{sink_name}` of pipeline `{pipeline}` is not {kind}: pass the schema sink's settings as flags, or use the sink's kind"
                        )))
                    }
                }
            } else {
                fields
            };
            define(&mut doc, "schema_sinks", &name, kind, fields)?;
            let sinks = section(&mut doc, "data_sinks")?;
            if let Some(Value::Mapping(s)) = sinks.get_mut(sink_name.as_str()) {
                let reference = format!("schema_sinks.{name}");
                match s.get("schema_sink").and_then(Value::as_str) {
                    Some(existing) if existing != reference => {
                        return Err(Error::config(format!(
                            "data sink `{sink_name}` already has schema_sink: {existing}; edit skippr.yml to change it"
                        )))
                    }
                    _ => {
                        s.insert(key("schema_sink"), key(&reference));
                    }
                }
            }
        }
    }

    rejoin_layouts(&mut doc);
    let text = to_canonical_yaml(&Value::Mapping(doc));
    let tmp = path.with_extension("yml.tmp");
    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(text)
}
