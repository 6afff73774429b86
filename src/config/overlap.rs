//! Validation across pipelines: two pipelines must never write the same Iceberg table. Each
//! would commit its own rows and LSNs on top of the other's, and neither could tell which
//! changes the table holds.

use std::collections::BTreeMap;

use super::{PipelineConfig, SinkConfig};

/// Where a sink's tables live: two pipelines with equal targets share one namespace.
fn target(workspace: &str, sink: &SinkConfig) -> String {
    match sink {
        SinkConfig::LocalIceberg { warehouse, .. } => {
            format!("warehouse {} (namespace {workspace})", warehouse.display())
        }
        SinkConfig::AthenaIceberg { sink, .. } => format!(
            "Glue database {} in {} (warehouse {})",
            sink.glue_database_name, sink.region, sink.warehouse
        ),
        SinkConfig::RestIceberg {
            sink, namespace, ..
        } => format!(
            "REST catalog {} (warehouse {}, namespace {})",
            sink.uri,
            sink.warehouse.as_deref().unwrap_or("default"),
            namespace.as_deref().unwrap_or(workspace)
        ),
    }
}

/// For every pipeline that would write an Iceberg table an earlier pipeline (in name order)
/// also writes: the pipeline's name and a message naming both, the table and the fix.
pub fn shared_tables(workspace: &str, pipelines: &[PipelineConfig]) -> Vec<(String, String)> {
    // (target, Iceberg table) -> (pipeline, source table) that writes it first.
    let mut writers: BTreeMap<(String, String), (&str, String)> = BTreeMap::new();
    let mut problems = Vec::new();
    for p in pipelines {
        let where_ = target(workspace, &p.sink);
        let written = p
            .source
            .tables
            .iter()
            .map(|t| (t.iceberg_name(), t.to_string()))
            .chain(
                p.changelogs
                    .iter()
                    .map(|(t, name)| (name.clone(), format!("the changelog of {t}"))),
            );
        for (iceberg_name, t) in written {
            let key = (where_.clone(), iceberg_name.clone());
            match writers.get(&key) {
                Some((other, other_source)) if *other != p.name => problems.push((
                    p.name.clone(),
                    format!(
                        "pipeline `{}` would write Iceberg table `{iceberg_name}` in {where_} (from {t}), which pipeline `{other}` also writes (from {other_source}); two pipelines must never write one table: remove the table from one pipeline's `tables:`, or give one of them another data sink",
                        p.name,
                    ),
                )),
                // A changelog named like another table of its own pipeline is refused at
                // its key (`Validator::changelogs`).
                Some(_) => {}
                None => {
                    writers.insert(key, (p.name.as_str(), t));
                }
            }
        }
    }
    problems
}
