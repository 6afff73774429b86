//! `skipprd`: parses the command line, loads the configuration, runs the command and maps
//! errors to exit codes (0 ok, 1 failure, 2 configuration error).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use skippr::cli::{Cli, Command, DiscoverFormat};
use skippr::config::{Config, PipelineConfig, SinkConfig};
use skippr::error::{Error, Result};
use skippr::{pipeline, query, source, telemetry};

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
            let report = source::postgres::discover::discover(p, &config.workspace).await?;
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
            Ok(if report.ok() { 0 } else { 1 })
        }
        Command::Sync {
            pipeline,
            once,
            resnapshot,
        } => {
            let p = pick(&config, pipeline.as_deref())?;
            let (tx, rx) = tokio::sync::watch::channel(false);
            skippr::cdc::trap_signals(tx);
            let report = pipeline::sync(&config, p, once, resnapshot, rx).await?;
            writeln!(
                stdout,
                "sync of pipeline {} done: {} table(s) copied, {} already up to date",
                p.name,
                report.copied.len(),
                report.skipped.len()
            )?;
            Ok(0)
        }
        Command::Query { sql, format } => {
            let ctx = query::session(&config).await?;
            let (schema, batches) = query::run(&ctx, &sql).await?;
            query::format::write(&mut stdout, format, &schema, &batches)?;
            Ok(0)
        }
    }
}
