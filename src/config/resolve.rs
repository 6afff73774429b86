//! Config, the second pass over a typed file: the workspace, storage, sources, sinks,
//! models and pipelines checked against each other and resolved into a [`Config`], every
//! problem reported at its place in the YAML.

use std::path::Path;

use serde_yaml::Value;

use super::{
    is_simple_name, keys, model, normalize, overlap, parse_duration, Config, PipelineConfig,
    PostgresConfig, SinkConfig, SkipprFile, Validator, DEFAULT_COMMIT_INTERVAL, SINK_KINDS,
};
use crate::config::CdcMode;
use crate::storage::state_file::StateFile;

impl Validator<'_> {
    pub(super) fn resolve(
        &mut self,
        file: &SkipprFile,
        raw: Value,
        base: &Path,
        cfg_path: &Path,
    ) -> Config {
        let workspace = file.skippr.workspace.clone();
        if !is_simple_name(&workspace) {
            self.report(
                keys(&["skippr", "workspace"]),
                format!("`{workspace}` is not a valid workspace name: use letters, digits and `_`, starting with a letter or `_` (it becomes the Iceberg namespace and SQL schema)"),
            );
        }
        let (storage_path, storage) = self.storage(&file.skippr, base);

        let reconnect = self.reconnect(file);
        let lease = self.lease(file);

        for (name, def) in &file.data_sources {
            if def.postgres.is_none() && !self.reported_under(&["data_sources", name]) {
                self.report(
                    keys(&["data_sources", name]),
                    "a data source needs exactly one connector key; allowed: Postgres",
                );
            }
        }
        for (name, def) in &file.data_sinks {
            if def.connector_count() != 1 && !self.reported_under(&["data_sinks", name]) {
                self.report(
                    keys(&["data_sinks", name]),
                    format!("a data sink needs exactly one connector key; allowed: {SINK_KINDS}"),
                );
            }
            if let Some(a) = &def.athena_iceberg {
                self.check_athena(&["data_sinks", name, "AthenaIceberg"], a);
            }
            self.check_rest_kinds(
                "data_sinks",
                name,
                def.rest_iceberg.as_ref(),
                def.s3_tables_iceberg.as_ref(),
                def.glue_rest_iceberg.as_ref(),
            );
            if let Some(l) = &def.local_iceberg {
                if l.warehouse.trim().is_empty() {
                    self.report(
                        keys(&["data_sinks", name, "LocalIceberg", "warehouse"]),
                        "the warehouse folder must not be empty",
                    );
                }
            }
            if let Some(r) = &def.schema_sink {
                let found = self.reference(
                    keys(&["data_sinks", name, "schema_sink"]),
                    r,
                    "schema_sinks",
                    &file.schema_sinks,
                );
                // The schema sink of a local warehouse is its own catalog.
                if let (Some(local), Some((_, schema_sink))) = (&def.local_iceberg, found) {
                    let same = schema_sink.local_iceberg.as_ref().is_some_and(|s| {
                        normalize(&base.join(&s.warehouse))
                            == normalize(&base.join(&local.warehouse))
                    });
                    if !same {
                        self.report(
                            keys(&["data_sinks", name, "schema_sink"]),
                            format!("a LocalIceberg sink registers its schemas in its own warehouse's catalog: `{r}` must be a LocalIceberg schema sink with the same warehouse ({})", local.warehouse),
                        );
                    }
                }
                // Likewise an AthenaIceberg sink registers its schemas in its own Glue database.
                if let (Some(athena), Some((_, schema_sink))) = (&def.athena_iceberg, found) {
                    let same = schema_sink.athena_iceberg.as_ref().is_some_and(|s| {
                        s.warehouse.trim_end_matches('/') == athena.warehouse.trim_end_matches('/')
                            && s.glue_database_name == athena.glue_database_name
                            && s.region == athena.region
                    });
                    if !same {
                        self.report(
                            keys(&["data_sinks", name, "schema_sink"]),
                            format!("an AthenaIceberg sink registers its schemas in its own Glue database: `{r}` must be an AthenaIceberg schema sink with the same warehouse, glue_database_name and region ({}, {}, {})", athena.warehouse, athena.glue_database_name, athena.region),
                        );
                    }
                }
                // Likewise a REST catalog sink registers its schemas in its own catalog.
                if let Some((_, schema_sink)) = found {
                    self.check_rest_schema_sink(name, r, def, schema_sink);
                }
            }
        }
        for (name, def) in &file.schema_sinks {
            if def.connector_count() != 1 && !self.reported_under(&["schema_sinks", name]) {
                self.report(
                    keys(&["schema_sinks", name]),
                    format!("a schema sink needs exactly one connector key; allowed: {SINK_KINDS}"),
                );
            }
            if let Some(a) = &def.athena_iceberg {
                self.check_athena(&["schema_sinks", name, "AthenaIceberg"], a);
            }
            self.check_rest_kinds(
                "schema_sinks",
                name,
                def.rest_iceberg.as_ref(),
                def.s3_tables_iceberg.as_ref(),
                def.glue_rest_iceberg.as_ref(),
            );
        }

        let mut pipelines = Vec::new();
        for (name, def) in &file.pipelines {
            if !is_simple_name(name) {
                self.report(
                    keys(&["pipelines", name]),
                    format!("`{name}` is not a valid pipeline name: use letters, digits and `_`"),
                );
            }
            let source = self.reference(
                keys(&["pipelines", name, "data_source"]),
                &def.data_source,
                "data_sources",
                &file.data_sources,
            );
            let sink = self.reference(
                keys(&["pipelines", name, "data_sink"]),
                &def.data_sink,
                "data_sinks",
                &file.data_sinks,
            );
            let pg_source = source.and_then(|(sname, s)| {
                s.postgres
                    .as_ref()
                    .and_then(|pg| self.postgres(sname, pg, &workspace, name, base))
                    .map(|pg| PostgresConfig {
                        peer_timeout: reconnect.peer_timeout,
                        ..pg
                    })
            });
            let sink_cfg = sink.and_then(|(kname, k)| {
                if let Some(l) = &k.local_iceberg {
                    Some(SinkConfig::LocalIceberg {
                        name: kname.clone(),
                        warehouse: normalize(&base.join(&l.warehouse)),
                    })
                } else if let Some(a) = &k.athena_iceberg {
                    Some(SinkConfig::AthenaIceberg {
                        name: kname.clone(),
                        sink: a.clone(),
                    })
                } else if let Some(r) = &k.rest_iceberg {
                    Some(SinkConfig::RestIceberg {
                        name: kname.clone(),
                        kind: "RestIceberg",
                        sink: r.clone(),
                        namespace: None,
                    })
                } else if let Some(t) = &k.s3_tables_iceberg {
                    Some(SinkConfig::RestIceberg {
                        name: kname.clone(),
                        kind: "S3TablesIceberg",
                        sink: t.rest(),
                        namespace: None,
                    })
                } else {
                    k.glue_rest_iceberg
                        .as_ref()
                        .map(|g| SinkConfig::RestIceberg {
                            name: kname.clone(),
                            kind: "GlueRestIceberg",
                            sink: g.rest(),
                            namespace: Some(g.glue_database_name.clone()),
                        })
                }
            });
            let schema_sink = sink.and_then(|(_, k)| {
                k.schema_sink
                    .as_ref()
                    .and_then(|r| r.split_once('.').map(|(_, n)| n.to_string()))
            });
            let interval = def
                .commit_interval
                .as_deref()
                .unwrap_or(DEFAULT_COMMIT_INTERVAL);
            let commit_interval = match parse_duration(interval) {
                Some(d) if d >= std::time::Duration::from_millis(100) => Some(d),
                _ => {
                    self.report(
                        keys(&["pipelines", name, "commit_interval"]),
                        format!("`{interval}` is not a duration of at least 100ms: write e.g. `500ms`, `10s` or `1m`"),
                    );
                    None
                }
            };
            let budget = self.memory_budget(
                name,
                "transaction_memory_budget_mb",
                def.transaction_memory_budget_mb,
                model::DEFAULT_TRANSACTION_MEMORY_BUDGET_MB,
                "larger transactions spill to disk",
            );
            let index_budget = self.memory_budget(
                name,
                "key_index_memory_budget_mb",
                def.key_index_memory_budget_mb,
                model::DEFAULT_KEY_INDEX_MEMORY_BUDGET_MB,
                "a larger key index lives on local disk",
            );
            let maintenance = self.maintenance(name, def.maintenance.as_ref());
            let cuts = self.consistent_cuts(name, def.consistent_cuts.as_ref());
            let listed = source.and_then(|(sname, s)| {
                s.postgres
                    .as_ref()
                    .map(|pg| (sname.as_str(), pg.tables.as_slice()))
            });
            let (layouts, layout_origins) = self.layouts(name, def, listed);
            let excluded = self.exclude_columns(name, def);
            let snapshot_only = pg_source
                .as_ref()
                .is_some_and(|s| s.cdc_mode == CdcMode::SnapshotOnly);
            let changelogs = self.changelogs(name, def, listed, snapshot_only);
            let pg_source = pg_source.map(|mut s| {
                s.exclude_columns = excluded;
                s
            });
            if let (
                Some(source),
                Some(sink),
                Some(commit_interval),
                Some(budget),
                Some(index_budget),
                Some(mut m),
                Some(consistent_cuts),
            ) = (
                pg_source,
                sink_cfg,
                commit_interval,
                budget,
                index_budget,
                maintenance,
                cuts,
            ) {
                m.target_file_size = source.parquet_target_file_size;
                if let SinkConfig::AthenaIceberg { sink, .. } = &sink {
                    m.region = Some(sink.region.clone());
                }
                pipelines.push(PipelineConfig {
                    name: name.clone(),
                    commit_interval,
                    transaction_memory_budget: budget,
                    key_index_memory_budget: index_budget,
                    maintenance: m,
                    consistent_cuts,
                    source,
                    sink,
                    schema_sink,
                    state_file: match &storage {
                        crate::storage::Location::Local(_) => StateFile::Local(
                            storage_path
                                .join("pipelines")
                                .join(format!("{name}.state.json")),
                        ),
                        s3 => StateFile::object(s3, &format!("pipelines/{name}.state.json"), name),
                    },
                    key_index_dir: storage_path.join("keyindex").join(name),
                    layouts,
                    layout_origins,
                    changelogs,
                });
            }
        }
        for (name, message) in overlap::shared_tables(&workspace, &pipelines) {
            self.report(keys(&["pipelines", &name]), message);
        }

        let query = self.query_config(file, base);
        let metrics_listen = self.socket_addr(
            &["skippr", "metrics", "listen"],
            file.skippr
                .metrics
                .as_ref()
                .and_then(|m| m.listen.as_deref())
                .unwrap_or(model::DEFAULT_METRICS_LISTEN),
        );
        let metrics_listen_set = file
            .skippr
            .metrics
            .as_ref()
            .is_some_and(|m| m.listen.is_some());
        Config {
            file: cfg_path.to_path_buf(),
            workspace,
            storage_path,
            storage,
            query,
            metrics_listen,
            metrics_listen_set,
            reconnect,
            lease,
            pipelines,
            raw,
        }
    }
}
