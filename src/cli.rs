//! The command line: `skipprd validate | discover | sync | query`, with a global `--config`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::query::format::OutputFormat;

/// Live SQL over data that streams from Postgres into Apache Iceberg.
#[derive(Debug, Parser)]
#[command(
    name = "skipprd",
    version,
    about,
    after_help = "Examples:\n  skipprd validate\n  skipprd discover --pipeline app\n  skipprd sync --pipeline app --once\n  skipprd query \"SELECT count(*) FROM analytics.orders\""
)]
pub struct Cli {
    /// Path of the configuration file.
    #[arg(long, global = true, default_value = crate::config::DEFAULT_CONFIG_FILE, value_name = "PATH")]
    pub config: PathBuf,

    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscoverFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check the configuration file without connecting anywhere.
    #[command(after_help = "Example:\n  skipprd --config ./skippr.yml validate")]
    Validate,

    /// Show each table's columns and types, and check the source is ready for the pipeline.
    #[command(
        after_help = "Examples:\n  skipprd discover --pipeline app\n  skipprd discover --pipeline app --format json"
    )]
    Discover {
        /// Pipeline to inspect (may be omitted when only one is defined).
        #[arg(long)]
        pipeline: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = DiscoverFormat::Text)]
        format: DiscoverFormat,
    },

    /// Copy the pipeline's tables into Iceberg, then follow their changes.
    #[command(
        after_help = "Examples:\n  skipprd sync --pipeline app --once   # catch up and exit\n  skipprd sync --pipeline app          # run until SIGTERM or Ctrl-C"
    )]
    Sync {
        /// Pipeline to run (may be omitted when only one is defined).
        #[arg(long)]
        pipeline: Option<String>,
        /// Catch up to the source's current position, commit, and exit.
        #[arg(long)]
        once: bool,
        /// Drop the pipeline's Iceberg tables, WAL and replication slot, and copy every
        /// table again (after a lost slot, for example).
        #[arg(long)]
        resnapshot: bool,
    },

    /// Run SQL over the workspace's tables.
    #[command(
        after_help = "Examples:\n  skipprd query \"SELECT count(*), sum(amount) FROM analytics.orders\"\n  skipprd query --format csv \"SELECT * FROM analytics.customers\""
    )]
    Query {
        /// The SQL statement.
        sql: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
}
