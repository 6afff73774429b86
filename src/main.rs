//! `skipprd`: parses the command line, loads the configuration, runs the command and maps
//! errors to exit codes (0 ok, 1 failure, 2 configuration error, 75 a transient fault that
//! outlasted the retries: run again later).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use serde_yaml::{Mapping, Value};
use skippr::cli::{
    CdcModeArg, Cli, Command, ConnectCommand, DiscoverFormat, QueryEngine, SinkKind, SourceKind,
};
use skippr::config::connect::Connect;
use skippr::config::rest_iceberg;
use skippr::config::{Config, PipelineConfig, SinkConfig};
use skippr::error::{Error, Result};
use skippr::{config, query, source, telemetry};

/// jemalloc returns freed memory to the system where glibc's per-thread arenas keep it, so a
/// long-running `serve` stays at the size of its live heap (see docs/architecture.md).
/// The `system-allocator` feature leaves the C library's allocator in place, for heap
/// profilers that trace it (heaptrack; docs/benchmarks.md, "Reproduce").
#[cfg(not(any(target_env = "msvc", feature = "system-allocator")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings: a background thread hands memory freed for a second back to the
/// system, so the resident size follows the live heap (a large transaction or a compaction
/// leaves no lasting high-water mark). `_RJEM_MALLOC_CONF` in the environment overrides them.
#[cfg(not(any(target_env = "msvc", feature = "system-allocator")))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static _rjem_malloc_conf: &[u8] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", e.report());
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn load(cli: &Cli) -> Result<Config> {
    Ok(Config::load(&cli.config)?)
}

/// `given` as one of the tables `p` follows (for `sync --resnapshot --table`).
fn followed_table(p: &PipelineConfig, given: &str) -> Result<skippr::config::TableRef> {
    let t = skippr::config::TableRef::parse(given).ok_or_else(|| {
        Error::config(format!(
            "--table: `{given}` is not a table name: write `name` or `schema.name`"
        ))
    })?;
    if !p.source.tables.contains(&t) {
        return Err(Error::config(format!(
            "--table: pipeline {} does not follow {t} (its tables: {}); add it with `skipprd sync --pipeline {} --add-table {given}`",
            p.name,
            p.source
                .tables
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            p.name
        )));
    }
    Ok(t)
}

fn pick<'c>(config: &'c Config, name: Option<&str>) -> Result<&'c PipelineConfig> {
    match name {
        Some(n) => config.pipeline(n),
        None if config.pipelines.len() == 1 => Ok(&config.pipelines[0]),
        None => Err(Error::config(format!(
            "{} defines {} pipelines; choose one with --pipeline ({})",
            config.file.display(),
            config.pipelines.len(),
            config
                .pipelines
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

async fn run(cli: Cli) -> Result<u8> {
    if let Command::Connect { what } = &cli.command {
        let change = connect_change(what)?;
        let storage = cli.storage_mode.map(|m| match m {
            skippr::cli::StorageModeArg::Local => "local",
            skippr::cli::StorageModeArg::S3 => "s3",
        });
        config::connect::apply(
            &cli.config,
            cli.workspace.as_deref(),
            storage,
            cli.storage_path.as_deref(),
            Some(change),
        )?;
        println!("wrote {}", cli.config.display());
        return Ok(0);
    }
    let config = load(&cli)?;
    let mut stdout = std::io::stdout().lock();
    match cli.command {
        Command::Validate => {
            writeln!(stdout, "ok: {} is valid", config.file.display())?;
            writeln!(stdout, "workspace: {}", config.workspace)?;
            for p in &config.pipelines {
                let sink = match &p.sink {
                    SinkConfig::LocalIceberg { name, warehouse } => {
                        format!("{name} (LocalIceberg at {})", warehouse.display())
                    }
                    SinkConfig::AthenaIceberg { name, sink } => {
                        format!("{name} (AthenaIceberg at {})", sink.warehouse)
                    }
                    SinkConfig::RestIceberg { .. } => describe_rest(&p.sink),
                };
                writeln!(
                    stdout,
                    "pipeline {}: {} (Postgres {}:{}/{}, {} tables, {}) -> {}",
                    p.name,
                    p.source.name,
                    p.source.host,
                    p.source.port,
                    p.source.database,
                    p.source.tables.len(),
                    p.source.cdc_mode.as_str(),
                    sink
                )?;
            }
            Ok(0)
        }
        Command::Discover { pipeline, format } => {
            let p = pick(&config, pipeline.as_deref())?;
            let (report, source_error) = discover(&config, p).await;
            match format {
                DiscoverFormat::Text => write!(
                    stdout,
                    "{}",
                    source::postgres::discover::render_text(&report)
                )?,
                DiscoverFormat::Json => {
                    writeln!(stdout, "{}", serde_json::to_string_pretty(&report)?)?
                }
            }
            if let Some(e) = source_error {
                return Err(e);
            }
            Ok(if report.ok() { 0 } else { 1 })
        }
        Command::Sync {
            pipeline,
            once,
            resnapshot,
            table,
            add_table,
        } => {
            let mut config = config;
            let name = pick(&config, pipeline.as_deref())?.name.clone();
            if !add_table.is_empty() {
                skippr::pipeline::reload::check_can_add(pick(&config, Some(&name))?, &add_table)
                    .await?;
                config::connect::apply(
                    &cli.config,
                    None,
                    None,
                    None,
                    Some(config::connect::Connect::AddTables {
                        pipeline: name.clone(),
                        tables: add_table.clone(),
                    }),
                )?;
                config = Config::load(&config.file)?;
                writeln!(
                    stdout,
                    "added {} to pipeline {name} in {}",
                    add_table.join(", "),
                    config.file.display()
                )?;
            }
            let p = pick(&config, Some(&name))?;
            if !table.is_empty() {
                let asked = table
                    .iter()
                    .map(|t| followed_table(p, t))
                    .collect::<Result<Vec<_>>>()?;
                skippr::pipeline::reload::Requests::of(&config, &name).ask(&asked)?;
            }
            let one_table = !table.is_empty();
            if !add_table.is_empty() || one_table {
                if let Some(pid) = skippr::pipeline::reload::signal_running(&config, &name)? {
                    writeln!(
                        stdout,
                        "told skipprd (pid {pid}), which runs pipeline {name}: it copies the table(s) now; follow with `skipprd status`"
                    )?;
                    return Ok(0);
                }
            }
            let (tx, rx) = tokio::sync::watch::channel(false);
            skippr::pipeline::trap_signals(tx);
            skippr::pipeline::reload::trap_reload(config.file.clone());
            // `--resnapshot --table` copies the tables asked for, not every table.
            let mode = skippr::supervise::Mode::Sync {
                once,
                resnapshot: resnapshot && !one_table,
            };
            // With `skippr.metrics.listen` set, sync serves the same metrics as serve.
            let metrics = if config.metrics_listen_set {
                Some(skippr::serve::spawn_sync_metrics(&config, rx.clone()).await?)
            } else {
                None
            };
            let report = skippr::supervise::run(&config, p, mode, rx).await;
            if let Some(endpoint) = metrics {
                endpoint.abort();
            }
            let report = report?;
            if let Some(peak) = skippr::telemetry::peak_rss_bytes() {
                tracing::info!(pipeline = %p.name, peak_rss_mib = peak / (1024 * 1024), "sync finished");
            }
            writeln!(
                stdout,
                "sync of pipeline {} done: {} table(s) copied, {} already up to date",
                p.name,
                report.copied.len(),
                report.skipped.len()
            )?;
            Ok(0)
        }
        Command::Reload { pipeline } => {
            let names: Vec<String> = match pipeline.as_deref() {
                Some(n) => vec![config.pipeline(n)?.name.clone()],
                None => config.pipelines.iter().map(|p| p.name.clone()).collect(),
            };
            let mut told = std::collections::BTreeMap::new();
            for name in &names {
                if let Some(pid) = skippr::pipeline::reload::running_pid(&config, name)? {
                    told.entry(pid).or_insert_with(Vec::new).push(name.clone());
                }
            }
            if told.is_empty() {
                writeln!(
                    stdout,
                    "no skipprd runs {}; the next `sync` or `serve` reads skippr.yml as it is",
                    names.join(", ")
                )?;
                return Ok(0);
            }
            for (pid, pipelines) in told {
                skippr::pipeline::reload::signal_running(&config, &pipelines[0])?;
                writeln!(
                    stdout,
                    "told skipprd (pid {pid}) to read {} again (pipelines {})",
                    config.file.display(),
                    pipelines.join(", ")
                )?;
            }
            Ok(0)
        }
        Command::Status { pipeline, format } => {
            let report = skippr::status::collect(&config, pipeline.as_deref()).await?;
            match format {
                DiscoverFormat::Text => write!(stdout, "{}", skippr::status::render_text(&report))?,
                DiscoverFormat::Json => {
                    writeln!(stdout, "{}", serde_json::to_string_pretty(&report)?)?
                }
            }
            Ok(0)
        }
        Command::Connect { .. } => Ok(0),
        Command::Serve => {
            skippr::serve::run(&config).await?;
            Ok(0)
        }
        Command::Query {
            sql,
            format,
            engine,
            pipeline,
            as_of,
        } => {
            let as_of = match as_of.as_deref() {
                None => None,
                Some(text) => Some(query::as_of::AsOf::parse(text).ok_or_else(|| {
                    Error::config(format!(
                        "--as-of `{text}` is not a point in time: write {}",
                        query::as_of::AS_OF_FORMS
                    ))
                })?),
            };
            match engine {
                QueryEngine::Local => {
                    if pipeline.is_some() {
                        return Err(Error::config(
                            "--pipeline goes with --engine athena; the local engine reads the tables of every pipeline",
                        ));
                    }
                    let ctx = query::session_as_of(&config, as_of).await?;
                    let (schema, batches) = query::run(&ctx, &sql).await?;
                    query::format::write(&mut stdout, format, &schema, &batches)?;
                }
                QueryEngine::Athena => {
                    if as_of.is_some() {
                        return Err(Error::config(
                            "--as-of goes with the local engine; in Athena write `FOR TIMESTAMP AS OF` or `FOR VERSION AS OF` (the snapshot ids are in skippr.cuts)",
                        ));
                    }
                    let target = query::athena::AthenaTarget::pick(&config, pipeline.as_deref())?;
                    let out = query::athena::query(target, &sql).await?;
                    query::athena::write_output(&mut stdout, format, &out)?;
                }
            }
            Ok(0)
        }
    }
}

/// `discover`: an AthenaIceberg sink is checked end to end first (bucket, Glue, Athena),
/// then the source. When the source cannot be read at all, the report holds the sink's
/// checks and the source's error comes back beside it.
async fn discover(
    config: &Config,
    p: &PipelineConfig,
) -> (source::postgres::discover::Report, Option<Error>) {
    use source::postgres::discover::{Check, Report};
    let check = |name, ok, detail, fix| Check {
        name,
        ok,
        detail,
        fix,
        warning: None,
    };
    let sink_checks: Vec<Check> = match &p.sink {
        SinkConfig::AthenaIceberg { name, sink } => query::athena::checks::check_sink(name, sink)
            .await
            .into_iter()
            .map(|c| check(c.name, c.ok, c.detail, c.fix))
            .collect(),
        SinkConfig::RestIceberg {
            name,
            kind,
            sink,
            namespace,
        } => skippr::catalog::rest_checks::check_sink(
            name,
            kind,
            sink,
            namespace.as_deref().unwrap_or(&config.workspace),
        )
        .await
        .into_iter()
        .map(|c| check(c.name, c.ok, c.detail, c.fix))
        .collect(),
        SinkConfig::LocalIceberg { .. } => Vec::new(),
    };
    match source::postgres::discover::discover(p, &config.workspace).await {
        Ok(mut report) => {
            report.checks.splice(0..0, sink_checks);
            layout_checks(p, &mut report);
            (report, None)
        }
        Err(e) => (
            Report {
                pipeline: p.name.clone(),
                data_source: p.source.name.clone(),
                cdc_mode: p.source.cdc_mode.as_str().to_string(),
                tables: Vec::new(),
                checks: sink_checks,
                schemas: Vec::new(),
            },
            Some(e),
        ),
    }
}

/// `discover`: the layout each table gets, and a failed check for each `partition_by` or
/// `sort_by` entry of skippr.yml that does not fit its table's columns.
fn layout_checks(p: &PipelineConfig, report: &mut source::postgres::discover::Report) {
    use source::postgres::discover::Check;
    for t in &mut report.tables {
        let table = config::TableRef {
            schema: t.schema.clone(),
            name: t.name.clone(),
        };
        t.layout = Some(p.layout(&table).to_string());
    }
    for problem in skippr::pipeline::layout::check(p, &report.schemas) {
        report.checks.push(Check {
            name: format!("layout of {}", problem.table),
            ok: false,
            detail: problem.detail,
            fix: Some(problem.fix),
            warning: None,
        });
    }
}

/// A REST catalog sink as `validate` names it: its kind, catalog and warehouse (never its
/// credential or token).
fn describe_rest(sink: &SinkConfig) -> String {
    let SinkConfig::RestIceberg {
        name,
        kind,
        sink,
        namespace,
    } = sink
    else {
        return String::new();
    };
    let mut out = format!("{name} ({kind} at {}", sink.uri);
    if let Some(w) = &sink.warehouse {
        out.push_str(&format!(", warehouse {w}"));
    }
    if let Some(database) = namespace {
        out.push_str(&format!(", Glue database {database}"));
    }
    out.push(')');
    out
}

fn put(m: &mut Mapping, k: &str, v: Option<Value>) {
    if let Some(v) = v {
        m.insert(Value::String(k.to_string()), v);
    }
}

fn s(v: &Option<String>) -> Option<Value> {
    v.clone().map(Value::String)
}

fn n<T: Into<serde_yaml::Number> + Copy>(v: Option<T>) -> Option<Value> {
    v.map(|x| Value::Number(x.into()))
}

fn list(v: &[String]) -> Option<Value> {
    (!v.is_empty()).then(|| Value::Sequence(v.iter().cloned().map(Value::String).collect()))
}

/// With `require` (a data sink) every one of `fields` must be given; without it (a schema
/// sink, which may copy its data sink's settings), all of them or none.
fn all_or_none(what: &str, fields: &[(&str, &Option<String>)], require: bool) -> Result<()> {
    let missing: Vec<String> = fields
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| format!("--{}", k.replace('_', "-")))
        .collect();
    if (require || missing.len() < fields.len()) && !missing.is_empty() {
        return Err(Error::config(format!(
            "{what} needs {}",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// The `RestIceberg` entry of `connect ... resticeberg`, checked as `validate` checks it
/// (values holding a `${VAR}` reference are checked once the file is loaded).
fn rest_fields(r: &skippr::cli::RestArgs, require: bool) -> Result<Mapping> {
    let given = r.uri.is_some()
        || r.warehouse.is_some()
        || r.credential.is_some()
        || r.token.is_some()
        || r.scope.is_some()
        || r.sigv4_region.is_some()
        || r.sigv4_service.is_some()
        || !r.property.is_empty();
    let Some(uri) = &r.uri else {
        if require || given {
            return Err(Error::config(
                "a RestIceberg sink needs --uri (the catalog's base URI, e.g. https://polaris.example.com/api/catalog)",
            ));
        }
        return Ok(Mapping::new());
    };
    let literal = |v: &str| !v.contains('$');
    if literal(uri) {
        if let Some(p) = rest_iceberg::uri_problem(uri) {
            return Err(Error::config(format!("--uri: {p}")));
        }
    }
    if let Some(c) = &r.credential {
        if literal(c) {
            if let Some(p) = rest_iceberg::credential_problem(c) {
                return Err(Error::config(format!("--credential {p}")));
            }
        }
    }
    if r.credential.is_some() && r.token.is_some() {
        return Err(Error::config(
            "--credential and --token exclude each other: give OAuth2 client credentials or a bearer token",
        ));
    }
    let sigv4 = match (&r.sigv4_region, &r.sigv4_service) {
        (None, None) => None,
        (Some(region), Some(service)) => {
            if literal(service) {
                if let Some(p) = rest_iceberg::service_problem(service) {
                    return Err(Error::config(format!("--sigv4-service: {p}")));
                }
            }
            if r.credential.is_some() || r.token.is_some() {
                return Err(Error::config(
                    "--sigv4-region and --sigv4-service sign requests with AWS credentials: leave out --credential and --token",
                ));
            }
            let mut sig = Mapping::new();
            put(&mut sig, "region", Some(Value::String(region.clone())));
            put(&mut sig, "service", Some(Value::String(service.clone())));
            Some(Value::Mapping(sig))
        }
        _ => {
            return Err(Error::config(
                "--sigv4-region and --sigv4-service go together (e.g. --sigv4-region us-east-1 --sigv4-service s3tables)",
            ))
        }
    };
    let mut m = Mapping::new();
    put(&mut m, "uri", Some(Value::String(uri.clone())));
    put(&mut m, "warehouse", s(&r.warehouse));
    put(&mut m, "credential", s(&r.credential));
    put(&mut m, "token", s(&r.token));
    put(&mut m, "scope", s(&r.scope));
    put(&mut m, "sigv4", sigv4);
    if !r.property.is_empty() {
        // An empty value removes the property (null, for `connect`'s merge).
        let mut props = Mapping::new();
        for (k, v) in &r.property {
            let v = if v.is_empty() {
                Value::Null
            } else {
                Value::String(v.clone())
            };
            props.insert(Value::String(k.clone()), v);
        }
        put(&mut m, "properties", Some(Value::Mapping(props)));
    }
    Ok(m)
}

/// Turns `connect` flags into the entry to write.
fn connect_change(what: &ConnectCommand) -> Result<Connect> {
    let sink_fields =
        |kind: &SinkKind, require: bool| -> Result<(String, String, &'static str, Mapping)> {
            let mut m = Mapping::new();
            match kind {
                SinkKind::Athenaiceberg(a) => {
                    let fields = [
                        ("warehouse", &a.warehouse),
                        ("glue_database_name", &a.glue_database_name),
                        ("athena_workgroup_name", &a.athena_workgroup_name),
                        ("athena_results_s3_bucket", &a.athena_results_s3_bucket),
                        ("region", &a.region),
                    ];
                    let missing: Vec<String> = fields
                        .iter()
                        .filter(|(_, v)| v.is_none())
                        .map(|(k, _)| format!("--{}", k.replace('_', "-")))
                        .collect();
                    let given = fields.len() - missing.len();
                    if (require || given > 0) && !missing.is_empty() {
                        return Err(Error::config(format!(
                            "an AthenaIceberg sink needs {}",
                            missing.join(", ")
                        )));
                    }
                    if let Some(w) = &a.warehouse {
                        if !w.starts_with("s3://") {
                            return Err(Error::config(format!(
                            "--warehouse `{w}` is not an S3 location: write s3://bucket/prefix/"
                        )));
                        }
                    }
                    for (k, v) in fields {
                        put(&mut m, k, s(v));
                    }
                    Ok((a.pipeline.clone(), a.name.clone(), "AthenaIceberg", m))
                }
                SinkKind::Localiceberg(l) => {
                    if require && l.warehouse.is_none() {
                        return Err(Error::config("a LocalIceberg sink needs --warehouse"));
                    }
                    put(&mut m, "warehouse", s(&l.warehouse));
                    Ok((l.pipeline.clone(), l.name.clone(), "LocalIceberg", m))
                }
                SinkKind::Resticeberg(r) => {
                    let m = rest_fields(r, require)?;
                    Ok((r.pipeline.clone(), r.name.clone(), "RestIceberg", m))
                }
                SinkKind::S3tablesiceberg(t) => {
                    let fields = [
                        ("table_bucket_arn", &t.table_bucket_arn),
                        ("region", &t.region),
                    ];
                    all_or_none("an S3TablesIceberg sink", &fields, require)?;
                    if let (Some(arn), Some(region)) = (&t.table_bucket_arn, &t.region) {
                        if !arn.contains('$') && !region.contains('$') {
                            if let Some(p) = rest_iceberg::table_bucket_arn_problem(arn, region) {
                                return Err(Error::config(format!("--table-bucket-arn: {p}")));
                            }
                        }
                    }
                    for (k, v) in fields {
                        put(&mut m, k, s(v));
                    }
                    Ok((t.pipeline.clone(), t.name.clone(), "S3TablesIceberg", m))
                }
                SinkKind::Glueresticeberg(g) => {
                    let fields = [
                        ("glue_database_name", &g.glue_database_name),
                        ("region", &g.region),
                    ];
                    all_or_none("a GlueRestIceberg sink", &fields, require)?;
                    for (k, v) in fields {
                        put(&mut m, k, s(v));
                    }
                    Ok((g.pipeline.clone(), g.name.clone(), "GlueRestIceberg", m))
                }
            }
        };
    Ok(match what {
        ConnectCommand::DataSource {
            kind: SourceKind::Postgres(a),
        } => {
            let mut m = Mapping::new();
            put(&mut m, "host", Some(Value::String(a.host.clone())));
            put(&mut m, "port", n(a.port));
            put(&mut m, "user", Some(Value::String(a.user.clone())));
            put(&mut m, "password", s(&a.password));
            put(&mut m, "database", Some(Value::String(a.database.clone())));
            put(
                &mut m,
                "sslmode",
                a.sslmode
                    .map(|v| Value::String(v.mode().as_str().to_string())),
            );
            put(&mut m, "sslrootcert", s(&a.sslrootcert));
            put(&mut m, "tables", list(&a.tables));
            put(
                &mut m,
                "cdc_mode",
                a.cdc_mode.map(|c| {
                    Value::String(
                        match c {
                            CdcModeArg::SnapshotThenCdc => "snapshot_then_cdc",
                            CdcModeArg::CdcOnly => "cdc_only",
                            CdcModeArg::SnapshotOnly => "snapshot_only",
                        }
                        .to_string(),
                    )
                }),
            );
            put(&mut m, "publication", s(&a.publication));
            put(&mut m, "slot", s(&a.slot));
            put(&mut m, "append_only", list(&a.append_only));
            put(
                &mut m,
                "snapshot_parallelism",
                n(a.snapshot_parallelism.map(|v| v as u64)),
            );
            put(&mut m, "snapshot_chunk_rows", n(a.snapshot_chunk_rows));
            put(
                &mut m,
                "parquet_target_file_size_mb",
                n(a.parquet_target_file_size_mb),
            );
            // Checked as `validate` checks them; a `${VAR}` is only known when the file loads.
            if let Some(h) = a.heartbeat_interval.as_deref().filter(|v| !v.contains('$')) {
                config::parse_heartbeat_interval(h)
                    .map_err(|e| Error::config(format!("--heartbeat-interval: {e}")))?;
            }
            if let Some(w) = a.max_retained_wal.as_deref().filter(|v| !v.contains('$')) {
                config::parse_max_retained_wal(w)
                    .map_err(|e| Error::config(format!("--max-retained-wal: {e}")))?;
            }
            put(&mut m, "heartbeat_interval", s(&a.heartbeat_interval));
            put(&mut m, "max_retained_wal", s(&a.max_retained_wal));
            put(&mut m, "failover_slot", a.failover_slot.map(Value::Bool));
            for t in &a.tables {
                if config::TableRef::parse(t).is_none() {
                    return Err(Error::config(format!(
                        "--tables `{t}` is not a table name: write `name` or `schema.name`"
                    )));
                }
            }
            Connect::DataSource {
                pipeline: a.pipeline.clone(),
                name: a.name.clone(),
                kind: "Postgres",
                fields: m,
            }
        }
        ConnectCommand::DataSink { kind } => {
            let (pipeline, name, kind, fields) = sink_fields(kind, true)?;
            Connect::DataSink {
                pipeline,
                name,
                kind,
                fields,
            }
        }
        ConnectCommand::SchemaSink { kind } => {
            let (pipeline, name, kind, fields) = sink_fields(kind, false)?;
            Connect::SchemaSink {
                pipeline,
                name,
                kind,
                fields,
            }
        }
        ConnectCommand::Pipeline(a) => {
            if a.partition_by.is_empty()
                && a.sort_by.is_empty()
                && a.exclude_column.is_empty()
                && a.changelog.is_empty()
            {
                return Err(Error::config(
                    "connect pipeline needs --partition-by TABLE=ENTRY, --sort-by TABLE=ENTRY, --exclude-column TABLE=COLUMN or --changelog TABLE[=NAME] (see `skipprd connect pipeline --help`)",
                ));
            }
            Connect::Pipeline {
                pipeline: a.pipeline.clone(),
                partition_by: a.partition_by.clone(),
                sort_by: a.sort_by.clone(),
                exclude_columns: a.exclude_column.clone(),
                changelog: a.changelog.clone(),
            }
        }
    })
}
