//! Writes `skippr.yml` in its canonical style: sections in a fixed order, block mappings
//! with two-space indentation, lists of scalars in flow style, and strings quoted only when
//! they would not read back as the same string. The Python package writes the same bytes.

use serde_yaml::{Mapping, Value};

/// Top-level sections, in order.
const SECTIONS: [&str; 5] = [
    "skippr",
    "pipelines",
    "data_sources",
    "data_sinks",
    "schema_sinks",
];

/// Key order inside each known mapping; unknown keys follow in their own order.
const KEY_ORDER: [&str; 81] = [
    "workspace",
    "skipprd_el_storage_mode",
    "skipprd_el_storage_path",
    "query",
    "metrics",
    "reconnect",
    "max_backoff",
    "give_up_after",
    "peer_timeout",
    "lease",
    "renew_every",
    "expire_after",
    "listen",
    "users",
    "name",
    "tls",
    "cert",
    "statement_timeout",
    "max_connections",
    "max_query_memory",
    "target_partitions",
    "max_memory",
    "spill_path",
    "max_concurrent_statements",
    "log_min_duration",
    "data_source",
    "data_sink",
    "commit_interval",
    "transaction_memory_budget_mb",
    "key_index_memory_budget_mb",
    "maintenance",
    "enabled",
    "check_interval",
    "snapshot_retention",
    "min_snapshots_to_keep",
    "orphan_file_age",
    "compaction_min_files",
    "consistent_cuts",
    "every",
    "keep",
    "partition_by",
    "sort_by",
    "exclude_columns",
    "changelog",
    "Postgres",
    "LocalIceberg",
    "AthenaIceberg",
    "RestIceberg",
    "S3TablesIceberg",
    "GlueRestIceberg",
    "host",
    "port",
    "user",
    "password",
    "admin",
    "key",
    "database",
    "sslmode",
    "sslrootcert",
    "tables",
    "cdc_mode",
    "publication",
    "slot",
    "append_only",
    "snapshot_parallelism",
    "snapshot_chunk_rows",
    "parquet_target_file_size_mb",
    "heartbeat_interval",
    "max_retained_wal",
    "failover_slot",
    "uri",
    "table_bucket_arn",
    "warehouse",
    "glue_database_name",
    "credential",
    "token",
    "scope",
    "sigv4",
    "service",
    "properties",
    "schema_sink",
];
/// Athena fields after `warehouse`, in order.
const ATHENA_ORDER: [&str; 4] = [
    "glue_database_name",
    "athena_workgroup_name",
    "athena_results_s3_bucket",
    "region",
];

fn rank(key: &str) -> usize {
    if let Some(i) = ATHENA_ORDER.iter().position(|k| *k == key) {
        // Right after `warehouse`.
        let w = KEY_ORDER
            .iter()
            .position(|k| *k == "warehouse")
            .unwrap_or(0);
        return w * 10 + 1 + i;
    }
    match KEY_ORDER.iter().position(|k| *k == key) {
        Some(i) if key == "schema_sink" => 1000 + i,
        Some(i) => i * 10,
        None => 10_000,
    }
}

fn sorted(m: &Mapping) -> Vec<(&Value, &Value)> {
    let mut entries: Vec<_> = m.iter().enumerate().collect();
    entries.sort_by_key(|(i, (k, _))| (k.as_str().map(rank).unwrap_or(10_000), *i));
    entries.into_iter().map(|(_, kv)| kv).collect()
}

/// Whether `s` can be written without quotes and read back as the same string.
fn plain_ok(s: &str, in_flow: bool) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    let first_ok = first.is_ascii_alphanumeric() || matches!(first, '_' | '.' | '/' | '$');
    let rest_ok = s.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '.' | '/' | '$' | '{' | '}' | ':' | '@' | '+' | '-')
    });
    let lower = s.to_ascii_lowercase();
    let keyword = matches!(
        lower.as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "~"
    );
    let number = s.parse::<i64>().is_ok() || s.parse::<f64>().is_ok();
    let flow_bad = in_flow && s.contains(['{', '}', '[', ']', ',']);
    // Finally, the reader itself decides: it must read the text back as this very string
    // (this catches `0x1F`, `.inf`, `.NaN` and the like).
    let reads_back = matches!(serde_yaml::from_str::<Value>(s), Ok(Value::String(ref r)) if r == s);
    first_ok && rest_ok && !s.ends_with(':') && !keyword && !number && !flow_bad && reads_back
}

fn scalar(v: &Value, in_flow: bool) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if plain_ok(s, in_flow) => s.clone(),
        Value::String(s) => format!("'{}'", s.replace('\'', "''")),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Mapping(_) | Value::Sequence(_) | Value::Tagged(_))
}

/// Writes `key: v` at `indent`; `at` holds the keys above `key`.
fn emit_value(out: &mut String, at: &[&str], key: &str, v: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    let mut here = at.to_vec();
    here.push(key);
    match v {
        Value::Mapping(m) => {
            out.push_str(&format!("{pad}{key}:\n"));
            // `pipelines.<p>.tables` is keyed by table names, which keep the file's order (a
            // table may be called `key` or `users`); so is a REST catalog's `properties`.
            // Likewise the names of pipelines, sources and sinks (a pipeline may be called
            // `tables`), which keep the order they were added in, as the Python package
            // writes them.
            let own_keys = (matches!(at, ["pipelines", _]) && key == "tables")
                || (matches!(at, [_, _, "RestIceberg"]) && key == "properties")
                || (at.is_empty() && key != "skippr");
            if own_keys {
                for (k, v) in m {
                    emit_value(out, &here, &scalar(k, false), v, indent + 2);
                }
            } else {
                emit_mapping(out, m, indent + 2, &here);
            }
        }
        Value::Sequence(items) if items.iter().all(is_scalar) => {
            let parts: Vec<String> = items.iter().map(|i| scalar(i, true)).collect();
            out.push_str(&format!("{pad}{key}: [{}]\n", parts.join(", ")));
        }
        Value::Sequence(items) => {
            out.push_str(&format!("{pad}{key}:\n"));
            for item in items {
                match item {
                    Value::Mapping(m) => {
                        let mut inner = String::new();
                        emit_mapping(&mut inner, m, indent + 4, &here);
                        let trimmed = inner.trim_start();
                        out.push_str(&format!("{pad}  - {trimmed}"));
                    }
                    other => out.push_str(&format!("{pad}  - {}\n", scalar(other, false))),
                }
            }
        }
        other => out.push_str(&format!("{pad}{key}: {}\n", scalar(other, false))),
    }
}

fn emit_mapping(out: &mut String, m: &Mapping, indent: usize, at: &[&str]) {
    for (k, v) in sorted(m) {
        emit_value(out, at, &scalar(k, false), v, indent);
    }
}

/// The canonical text of a whole file.
pub fn to_canonical_yaml(doc: &Value) -> String {
    let Value::Mapping(top) = doc else {
        return serde_yaml::to_string(doc).unwrap_or_default();
    };
    let mut blocks = Vec::new();
    let mut keys: Vec<&Value> = SECTIONS
        .iter()
        .filter_map(|s| top.keys().find(|k| k.as_str() == Some(*s)))
        .collect();
    keys.extend(
        top.keys()
            .filter(|k| !k.as_str().is_some_and(|s| SECTIONS.contains(&s))),
    );
    for k in keys {
        let v = &top[k];
        let name = scalar(k, false);
        if name != "skippr" && matches!(v, Value::Mapping(m) if m.is_empty()) {
            continue;
        }
        let mut block = String::new();
        emit_value(&mut block, &[], &name, v, 0);
        blocks.push(block);
    }
    blocks.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_style() {
        let doc: Value = serde_yaml::from_str(
            "data_sources: {db: {Postgres: {tables: [a, 'b'], host: h, user: u, database: d, password: '${P}', port: 5432}}}\nskippr: {skipprd_el_storage_mode: local, workspace: w}\n",
        )
        .unwrap();
        assert_eq!(
            to_canonical_yaml(&doc),
            "skippr:\n  workspace: w\n  skipprd_el_storage_mode: local\n\ndata_sources:\n  db:\n    Postgres:\n      host: h\n      port: 5432\n      user: u\n      password: ${P}\n      database: d\n      tables: [a, b]\n"
        );
        assert!(!plain_ok("true", false));
        assert!(!plain_ok("5432", false));
        assert!(!plain_ok("a b", false));
        assert!(plain_ok("s3://bucket/", false));
        for s in ["0x1F", "0o17", ".inf", "-.Inf", ".NaN", "+1"] {
            assert!(!plain_ok(s, false), "{s}");
        }
    }
}
