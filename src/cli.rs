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

    /// Workspace to write into the config file (`connect` only).
    #[arg(long, global = true, value_name = "NAME")]
    pub workspace: Option<String>,

    /// Storage mode of the WAL and state to write into the config file (`connect` only).
    #[arg(long, global = true, value_enum, value_name = "MODE")]
    pub storage_mode: Option<StorageModeArg>,

    /// Where the WAL and state go, to write into the config file (`connect` only): a folder
    /// in mode `local`, `s3://bucket/prefix` in mode `s3`.
    #[arg(long, global = true, value_name = "PATH")]
    pub storage_path: Option<String>,

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
pub enum StorageModeArg {
    Local,
    S3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum CdcModeArg {
    SnapshotThenCdc,
    CdcOnly,
    SnapshotOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscoverFormat {
    Text,
    Json,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
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

    /// Create or update skippr.yml: add a data source, a data sink or a schema sink to a pipeline.
    #[command(
        after_help = "Example:\n  skipprd --workspace analytics --storage-mode local connect data-source postgres \\\n    --pipeline orders --name app_db --host db.internal --user skippr_reader \\\n    --password '${APP_DB_PASSWORD}' --database app --tables orders --tables customers"
    )]
    Connect {
        #[command(subcommand)]
        what: ConnectCommand,
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

    /// Run every pipeline continuously and serve the live tables over the Postgres wire
    /// protocol (skippr.query.listen, default 127.0.0.1:5433) with Prometheus metrics
    /// (skippr.metrics.listen, default 127.0.0.1:9187).
    #[command(
        after_help = "Examples:\n  skipprd serve\n  psql -h 127.0.0.1 -p 5433 -c \"SELECT count(*) FROM analytics.orders\"\n  curl -s http://127.0.0.1:9187/metrics"
    )]
    Serve,
}

#[derive(Debug, Subcommand)]
pub enum ConnectCommand {
    /// Add a data source to a pipeline.
    DataSource {
        #[command(subcommand)]
        kind: SourceKind,
    },
    /// Add a data sink to a pipeline.
    DataSink {
        #[command(subcommand)]
        kind: SinkKind,
    },
    /// Add a schema sink and link it to a pipeline's data sink. Without settings flags it
    /// takes them from that data sink.
    SchemaSink {
        #[command(subcommand)]
        kind: SinkKind,
    },
}

#[derive(Debug, Subcommand)]
pub enum SourceKind {
    /// A Postgres database.
    Postgres(PostgresArgs),
}

#[derive(Debug, Subcommand)]
pub enum SinkKind {
    /// Iceberg on S3 with the Glue catalog, queried by Athena.
    Athenaiceberg(AthenaArgs),
    /// Iceberg in a local warehouse folder (the embedded default).
    Localiceberg(LocalArgs),
}

#[derive(Debug, clap::Args)]
pub struct PostgresArgs {
    /// Pipeline the source feeds.
    #[arg(long, allow_hyphen_values = true)]
    pub pipeline: String,
    /// Name of the data source.
    #[arg(long, allow_hyphen_values = true)]
    pub name: String,
    #[arg(long, allow_hyphen_values = true)]
    pub host: String,
    #[arg(long, allow_hyphen_values = true)]
    pub port: Option<u16>,
    #[arg(long, allow_hyphen_values = true)]
    pub user: String,
    /// Password; pass '${VAR}' (quoted) to keep it in the environment.
    #[arg(long, allow_hyphen_values = true)]
    pub password: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub database: String,
    /// A table to follow (`name` or `schema.name`); repeat for more.
    #[arg(long = "tables", required = true, allow_hyphen_values = true)]
    pub tables: Vec<String>,
    #[arg(long, value_enum)]
    pub cdc_mode: Option<CdcModeArg>,
    #[arg(long, allow_hyphen_values = true)]
    pub publication: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub slot: Option<String>,
    /// A table without primary key that only receives inserts; repeat for more.
    #[arg(long = "append-only", allow_hyphen_values = true)]
    pub append_only: Vec<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub snapshot_parallelism: Option<usize>,
    #[arg(long, allow_hyphen_values = true)]
    pub parquet_target_file_size_mb: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct AthenaArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true)]
    pub name: String,
    #[arg(long, allow_hyphen_values = true)]
    pub warehouse: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub glue_database_name: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub athena_workgroup_name: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub athena_results_s3_bucket: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub region: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct LocalArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true)]
    pub name: String,
    /// Warehouse folder (relative to the config file).
    #[arg(long, allow_hyphen_values = true)]
    pub warehouse: Option<String>,
}
