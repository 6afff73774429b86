//! The command line: `skipprd connect | validate | discover | sync | query | status | serve`,
//! with a global `--config`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::query::format::OutputFormat;

/// Live SQL over data that streams from Postgres into Apache Iceberg.
#[derive(Debug, Parser)]
#[command(
    name = "skipprd",
    version,
    about,
    after_help = "Examples:\n  skipprd --workspace analytics connect data-source postgres --pipeline app --name app_db \\\n    --host 127.0.0.1 --user skippr --password '${APP_DB_PASSWORD}' --database app --tables orders\n  skipprd connect data-sink localiceberg --pipeline app --name lake --warehouse ./warehouse\n  skipprd validate\n  skipprd discover --pipeline app\n  skipprd sync --pipeline app --once\n  skipprd query \"SELECT count(*) FROM analytics.orders\"\n  skipprd status\n  skipprd serve            # then: psql -h 127.0.0.1 -p 5433 -d analytics\n\nRun `skipprd <command> --help` for each command's flags."
)]
pub struct Cli {
    /// Path of the configuration file; relative paths inside it resolve against its folder.
    #[arg(long, global = true, default_value = crate::config::DEFAULT_CONFIG_FILE, value_name = "PATH")]
    pub config: PathBuf,

    /// Workspace to write into the config file (`connect` only): the Iceberg namespace and SQL
    /// schema the tables appear under, e.g. `analytics`.
    #[arg(long, global = true, value_name = "NAME")]
    pub workspace: Option<String>,

    /// Storage mode of the WAL and state to write into the config file (`connect` only)
    /// [default: local].
    #[arg(long, global = true, value_enum, value_name = "MODE")]
    pub storage_mode: Option<StorageModeArg>,

    /// Where the WAL and state go, to write into the config file (`connect` only): a folder
    /// in mode `local`, `s3://bucket/prefix` in mode `s3`.
    #[arg(long, global = true, value_name = "PATH")]
    pub storage_path: Option<String>,

    /// Log format on stderr: `text` for people, `json` (one object a line) for log shippers.
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

/// The engine `skipprd query` runs a statement in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QueryEngine {
    /// The live tables, read by this process.
    Local,
    /// Athena, over the AthenaIceberg sink's Glue database.
    Athena,
}

/// `--sslmode` values (libpq's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SslModeArg {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslModeArg {
    /// The mode it selects in `skippr.yml`.
    pub fn mode(self) -> crate::config::SslMode {
        use crate::config::SslMode;
        match self {
            SslModeArg::Disable => SslMode::Disable,
            SslModeArg::Prefer => SslMode::Prefer,
            SslModeArg::Require => SslMode::Require,
            SslModeArg::VerifyCa => SslMode::VerifyCa,
            SslModeArg::VerifyFull => SslMode::VerifyFull,
        }
    }
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
        after_help = "Examples:\n  skipprd sync --pipeline app --once   # catch up and exit\n  skipprd sync --pipeline app          # run until SIGTERM or Ctrl-C\n  skipprd sync --pipeline app --add-table invoices        # follow one more table\n  skipprd sync --pipeline app --resnapshot --table orders # copy one table again"
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
        /// With --resnapshot: copy only this table again (repeatable). The other tables
        /// keep streaming; readers see the table as it was until its copy commits. When a
        /// skipprd runs the pipeline, it is told (SIGHUP) and makes the copy.
        #[arg(long, value_name = "TABLE", requires = "resnapshot")]
        table: Vec<String>,
        /// Add a table to the pipeline's `tables:` in skippr.yml (repeatable) and copy it,
        /// then follow its changes. When a skipprd runs the pipeline, it is told (SIGHUP) and
        /// takes the table at once; otherwise this sync does the work.
        #[arg(long = "add-table", value_name = "TABLE")]
        add_table: Vec<String>,
    },

    /// Tell the running skipprd (`serve` or `sync`) to read skippr.yml again: tables added
    /// to a pipeline are copied and followed, tables removed are no longer followed.
    #[command(
        after_help = "Example:\n  skipprd reload                 # every pipeline of skippr.yml\n  skipprd reload --pipeline app"
    )]
    Reload {
        /// Only the process that runs this pipeline.
        #[arg(long)]
        pipeline: Option<String>,
    },

    /// Create or update skippr.yml: add a data source, a data sink or a schema sink to a
    /// pipeline, or set how its tables are partitioned and sorted and which of their columns
    /// are left out.
    #[command(
        after_help = "Example:\n  skipprd --workspace analytics --storage-mode local connect data-source postgres \\\n    --pipeline orders --name app_db --host db.internal --user skippr_reader \\\n    --password '${APP_DB_PASSWORD}' --database app --tables orders --tables customers\n  skipprd connect pipeline --pipeline orders --partition-by 'orders=day(created_at)'"
    )]
    Connect {
        #[command(subcommand)]
        what: ConnectCommand,
    },

    /// Run SQL over the workspace's tables.
    #[command(
        after_help = "Examples:\n  skipprd query \"SELECT count(*), sum(amount) FROM analytics.orders\"\n  skipprd query --format csv \"SELECT * FROM analytics.customers\"\n  skipprd query --as-of '2026-12-01 10:00:00+00' \"SELECT sum(balance) FROM analytics.accounts\"\n  skipprd query --engine athena \"SELECT count(*) FROM orders\"   # in Athena, over the Glue database"
    )]
    Query {
        /// The SQL statement.
        sql: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        /// Where the statement runs: `local` reads the live tables here (committed Iceberg
        /// plus the WAL tail); `athena` runs it in Athena over the committed history in
        /// the AthenaIceberg sink's Glue database (workgroup athena_workgroup_name, results
        /// in athena_results_s3_bucket). Ctrl-C stops an Athena query.
        #[arg(long, value_enum, default_value_t = QueryEngine::Local, value_name = "ENGINE")]
        engine: QueryEngine,
        /// With `--engine athena`: the pipeline whose AthenaIceberg sink to query (may be
        /// omitted when only one AthenaIceberg sink is configured).
        #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
        pipeline: Option<String>,
        /// Read the tables as they were at a source LSN (`0/16B3748`), an instant with a
        /// time zone (`2026-12-01 10:00:00+00`) or a consistent cut
        /// (`skippr-cut-20261201T100000Z`), as the gateway's `SET skippr.as_of` does.
        #[arg(long, value_name = "POINT")]
        as_of: Option<String>,
    },

    /// Show what is running: per pipeline and table, the committed LSN, the slot's confirmed
    /// and the source's current LSN, lag in bytes and seconds, WAL size on disk, last commit
    /// time, rows and files, and a stopped or failed pipeline's error.
    #[command(
        after_help = "Examples:\n  skipprd status\n  skipprd status --pipeline app --format json"
    )]
    Status {
        /// Pipeline to show (default: every pipeline).
        #[arg(long)]
        pipeline: Option<String>,
        /// Output format: `text` for people, `json` for scripts.
        #[arg(long, value_enum, default_value_t = DiscoverFormat::Text)]
        format: DiscoverFormat,
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
    /// Set how a pipeline's tables are laid out in files: their partitions and the order of
    /// rows inside each file, the columns left out, and their changelog tables
    /// (`pipelines.<p>.tables.<table>`'s `partition_by`, `sort_by`, `exclude_columns` and
    /// `changelog`).
    #[command(
        after_help = "Example:\n  skipprd connect pipeline --pipeline app \\\n    --partition-by 'orders=day(created_at)' --partition-by 'orders=bucket(16, customer_id)' \\\n    --sort-by 'orders=created_at' --exclude-column 'orders=internal_note' \\\n    --changelog orders --changelog 'sales.refunds=refunds_history'\n\nThe entries given for a table replace its list; `--partition-by 'orders='` clears it,\nand `--changelog 'orders='` removes the table's changelog.\n`skipprd discover` then shows the layout each table gets, and refuses an entry that does\nnot fit the table's columns."
    )]
    Pipeline(PipelineArgs),
}

/// `TABLE=ENTRY`: a table of the pipeline and one entry of its list.
fn table_entry(s: &str) -> Result<(String, String), String> {
    table_pair(s, "TABLE=ENTRY", "'orders=day(created_at)'")
}

/// `TABLE=COLUMN`: a table of the pipeline and one of its columns.
fn table_column(s: &str) -> Result<(String, String), String> {
    table_pair(s, "TABLE=COLUMN", "'orders=internal_note'")
}

/// `TABLE[=NAME]`: a table of the pipeline, and the name of its changelog table when given
/// (empty: none).
fn table_changelog(s: &str) -> Result<(String, Option<String>), String> {
    if s.contains('=') || s.starts_with("--") {
        return table_pair(s, "TABLE[=NAME]", "'orders=orders_history'")
            .map(|(table, name)| (table, Some(name)));
    }
    if s.trim().is_empty() {
        return Err("give the table whose changes to keep, e.g. `--changelog orders`".into());
    }
    Ok((s.trim().to_string(), None))
}

/// `s` as `form` (`TABLE=ENTRY`, `TABLE=COLUMN`): the table, and what follows its `=`.
fn table_pair(s: &str, form: &str, example: &str) -> Result<(String, String), String> {
    if s.starts_with("--") {
        return Err(format!(
            "`{s}` is the next flag, not a value: give the flag its {form} value"
        ));
    }
    match s.split_once('=') {
        Some((table, entry)) if !table.trim().is_empty() => {
            Ok((table.trim().to_string(), entry.trim().to_string()))
        }
        _ => Err(format!(
            "`{s}` is not {form}: write e.g. {example} (quoted for the shell)"
        )),
    }
}

#[derive(Debug, clap::Args)]
pub struct PipelineArgs {
    /// Pipeline whose tables these are.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// One partition of a table, as TABLE=ENTRY; repeat for more, coarsest first. ENTRY is a
    /// column (its values as they are), `year(c)`, `month(c)`, `day(c)`, `hour(c)`,
    /// `bucket(N, c)` or `truncate(W, c)`, e.g. 'orders=day(created_at)'. The entries given
    /// for a table replace its list; 'orders=' clears it.
    #[arg(long = "partition-by", value_parser = table_entry, value_name = "TABLE=ENTRY")]
    pub partition_by: Vec<(String, String)>,
    /// The order of rows inside each data file of a table, as TABLE=ENTRY; repeat for more.
    /// ENTRY is `column [asc|desc] [nulls first|last]`, e.g. 'orders=created_at desc'. The
    /// entries given for a table replace its list; 'orders=' clears it.
    #[arg(long = "sort-by", value_parser = table_entry, value_name = "TABLE=ENTRY")]
    pub sort_by: Vec<(String, String)>,
    /// A column of a table left out of its Iceberg table (neither copied nor streamed), as
    /// TABLE=COLUMN; repeat for more, e.g. 'orders=internal_note'. COLUMN is bare (folded to
    /// lower case) or in double quotes ('orders="Note"'). The columns given for a table
    /// replace its list; 'orders=' clears it.
    #[arg(long = "exclude-column", value_parser = table_column, value_name = "TABLE=COLUMN")]
    pub exclude_column: Vec<(String, String)>,
    /// A changelog table beside a table: every change of the table as a row, appended.
    /// 'orders' names it `orders_changelog`, 'orders=orders_history' names it; 'orders='
    /// removes it. Repeat for more tables.
    #[arg(long = "changelog", value_parser = table_changelog, value_name = "TABLE[=NAME]")]
    pub changelog: Vec<(String, Option<String>)>,
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
    /// Iceberg behind an Iceberg REST catalog: Apache Polaris / Snowflake Open Catalog,
    /// Lakekeeper, Nessie, Unity Catalog, Gravitino, or AWS's S3 Tables and Glue endpoints.
    #[command(
        after_help = "Examples:\n  skipprd connect data-sink resticeberg --pipeline app --name lake \\\n    --uri https://polaris.example.com/api/catalog --warehouse analytics_wh \\\n    --credential '${CLIENT_ID}:${CLIENT_SECRET}' --scope PRINCIPAL_ROLE:ALL\n  skipprd connect data-sink resticeberg --pipeline app --name lake \\\n    --uri http://127.0.0.1:8181/catalog --warehouse lake --token '${CATALOG_TOKEN}' \\\n    --property s3.endpoint=http://127.0.0.1:9000 --property s3.path-style-access=true\n\nGiven again for an existing sink, --credential, --token and --sigv4-* replace the other\ntwo ways in; --property k=v sets one property and keeps the others, 'k=' removes it."
    )]
    Resticeberg(RestArgs),
    /// Iceberg in an S3 table bucket, through the S3 Tables Iceberg REST endpoint (a
    /// RestIceberg sink signed with SigV4).
    #[command(
        after_help = "Example:\n  skipprd connect data-sink s3tablesiceberg --pipeline app --name lake \\\n    --table-bucket-arn arn:aws:s3tables:us-east-1:111122223333:bucket/analytics \\\n    --region us-east-1"
    )]
    S3tablesiceberg(S3TablesArgs),
    /// Iceberg in a Glue database, through Glue's Iceberg REST endpoint (a RestIceberg sink
    /// signed with SigV4).
    #[command(
        after_help = "Example:\n  skipprd connect data-sink glueresticeberg --pipeline app --name lake \\\n    --glue-database-name analytics --region us-east-1"
    )]
    Glueresticeberg(GlueRestArgs),
}

/// `KEY=VALUE`: one property of a REST catalog (an empty VALUE removes it).
fn property_entry(s: &str) -> Result<(String, String), String> {
    if s.starts_with("--") {
        return Err(format!(
            "`{s}` is the next flag, not a value: give the flag its KEY=VALUE value"
        ));
    }
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!(
            "`{s}` is not KEY=VALUE: write e.g. s3.endpoint=http://127.0.0.1:9000"
        )),
    }
}

#[derive(Debug, clap::Args)]
pub struct RestArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub name: String,
    /// The catalog's base URI as its docs give it (requests go to <URI>/v1/...), e.g.
    /// `https://polaris.example.com/api/catalog` (required for a data sink; a schema sink
    /// without it takes the data sink's settings).
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "URL")]
    pub uri: Option<String>,
    /// The warehouse as the catalog names it: a name (Polaris's catalog, Lakekeeper's or
    /// Nessie's warehouse, Unity's catalog) or a location [default: the catalog's own].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
    pub warehouse: Option<String>,
    /// OAuth2 client credentials, `<client id>:<client secret>`; pass
    /// '${CLIENT_ID}:${CLIENT_SECRET}' (single-quoted) to keep them in the environment.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "ID:SECRET")]
    pub credential: Option<String>,
    /// A bearer token instead of client credentials; pass '${CATALOG_TOKEN}'.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The OAuth2 scope asked for with --credential, e.g. `PRINCIPAL_ROLE:ALL` for Polaris
    /// [default: catalog].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "SCOPE")]
    pub scope: Option<String>,
    /// Sign requests with AWS SigV4 in this region (AWS's S3 Tables and Glue endpoints);
    /// goes with --sigv4-service.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "REGION")]
    pub sigv4_region: Option<String>,
    /// The SigV4 signing name: `s3tables` or `glue`; goes with --sigv4-region.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "SERVICE")]
    pub sigv4_service: Option<String>,
    /// A catalog or storage property as KEY=VALUE, e.g. `s3.endpoint=http://127.0.0.1:9000`;
    /// repeat for more. 'KEY=' removes one written before.
    #[arg(long = "property", value_parser = property_entry, value_name = "KEY=VALUE")]
    pub property: Vec<(String, String)>,
}

#[derive(Debug, clap::Args)]
pub struct S3TablesArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub name: String,
    /// ARN of the table bucket, `arn:aws:s3tables:<region>:<account>:bucket/<name>`
    /// (required for a data sink; a schema sink without it takes the data sink's settings).
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "ARN")]
    pub table_bucket_arn: Option<String>,
    /// AWS region of the table bucket, e.g. `us-east-1`.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "REGION")]
    pub region: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct GlueRestArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub name: String,
    /// Glue database every table goes to (created when missing), e.g. `analytics`
    /// (required for a data sink; a schema sink without it takes the data sink's settings).
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
    pub glue_database_name: Option<String>,
    /// AWS region of the Glue catalog, e.g. `us-east-1`.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "REGION")]
    pub region: Option<String>,
}

/// A flag's text value. Values may start with `-` (`-.Inf`, say), but not with `--`: that is
/// the next flag, and a flag given without its value must be an error naming it rather than
/// silently taking the next flag as its value.
fn flag_value(s: &str) -> Result<String, String> {
    if s.starts_with("--") {
        return Err(format!(
            "`{s}` is the next flag, not a value: give the flag its value (a password that starts with `--` goes in an environment variable, as '${{VAR}}')"
        ));
    }
    Ok(s.to_string())
}

#[derive(Debug, clap::Args)]
pub struct PostgresArgs {
    /// Pipeline the source feeds.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// Name of the data source.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub name: String,
    /// Host name or address of the Postgres server, or a Unix socket folder starting with `/`.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "HOST")]
    pub host: String,
    /// Port of the Postgres server [default: 5432].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// User to connect as; it needs the REPLICATION attribute (or rds_replication) and SELECT
    /// on the tables.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "USER")]
    pub user: String,
    /// Password; pass '${VAR}' (single-quoted) to keep it in the environment instead of the
    /// file.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "PASSWORD")]
    pub password: Option<String>,
    /// Database that holds the tables.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "DATABASE")]
    pub database: String,
    /// TLS to the server, as libpq's sslmode: `disable`; `prefer` (TLS when offered, plain
    /// otherwise); `require` (TLS always; certificate checked only with --sslrootcert);
    /// `verify-ca` (certificate signed by the CA in --sslrootcert); `verify-full` (that, and
    /// the certificate names --host). Managed Postgres (RDS, Cloud SQL, Azure) wants
    /// `verify-full` with the provider's CA bundle [default: prefer].
    #[arg(long, value_enum, value_name = "MODE")]
    pub sslmode: Option<SslModeArg>,
    /// PEM file of the CA certificate(s) the server's certificate must chain to, relative to
    /// the config file, e.g. `./rds-global-bundle.pem` [default: ~/.postgresql/root.crt].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "PATH")]
    pub sslrootcert: Option<String>,
    /// A table to follow (`name` or `schema.name`); repeat for more.
    #[arg(long = "tables", allow_hyphen_values = true, value_parser = flag_value, required = true, value_name = "TABLE")]
    pub tables: Vec<String>,
    /// How the tables are read: a consistent snapshot then the change stream, only the change
    /// stream from the slot's current position, or only a snapshot [default: snapshot_then_cdc].
    #[arg(long, value_enum, value_name = "MODE")]
    pub cdc_mode: Option<CdcModeArg>,
    /// Publication to read the tables through; created by `sync` when missing
    /// [default: skippr_<workspace>_<pipeline>].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
    pub publication: Option<String>,
    /// Logical replication slot of the pipeline; created by `sync` when missing
    /// [default: skippr_<workspace>_<pipeline>].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
    pub slot: Option<String>,
    /// A table without primary key that only receives inserts; repeat for more.
    #[arg(long = "append-only", allow_hyphen_values = true, value_parser = flag_value, value_name = "TABLE")]
    pub append_only: Vec<String>,
    /// Connections that copy one large table in parallel during a snapshot [default: 4].
    #[arg(long, value_name = "N")]
    pub snapshot_parallelism: Option<usize>,
    /// Rows per chunk when a large table is copied in key chunks [default: 100000].
    #[arg(long, value_name = "ROWS")]
    pub snapshot_chunk_rows: Option<u64>,
    /// Target size of the Parquet data files a snapshot writes, in MiB [default: 128].
    #[arg(long, value_name = "MIB")]
    pub parquet_target_file_size_mb: Option<u64>,
    /// How often a running pipeline writes a heartbeat message to the source, so that its
    /// slot advances even while nothing in this database changes: a duration such as `30s`
    /// or `5m`, or `0` for none [default: 1m].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "DURATION")]
    pub heartbeat_interval: Option<String>,
    /// WAL the slot may hold back on the server before `status`, the metrics and the log
    /// warn, e.g. `10GiB` or `512MB` [default: 10GiB].
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "SIZE")]
    pub max_retained_wal: Option<String>,
    /// Create the slot as a failover slot (Postgres 17 and later), which standbys that
    /// synchronise slots keep, so the pipeline goes on after a promotion; `--failover-slot
    /// false` turns it off again [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub failover_slot: Option<bool>,
}

#[derive(Debug, clap::Args)]
pub struct AthenaArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub name: String,
    /// Warehouse location for data and metadata, e.g. `s3://my-bucket/warehouse/` (required
    /// for a data sink; a schema sink without it takes it from its data sink).
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "S3_URL")]
    pub warehouse: Option<String>,
    /// Glue database the tables are registered in, e.g. `analytics` (created if missing).
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
    pub glue_database_name: Option<String>,
    /// Athena workgroup that runs queries, e.g. `primary`.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "NAME")]
    pub athena_workgroup_name: Option<String>,
    /// Bucket (or `s3://bucket/prefix/`) where Athena writes query results.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "BUCKET")]
    pub athena_results_s3_bucket: Option<String>,
    /// AWS region of the bucket, Glue and Athena, e.g. `eu-west-1`.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "REGION")]
    pub region: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct LocalArgs {
    /// Pipeline whose sink this is.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub pipeline: String,
    /// Name of the sink.
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value)]
    pub name: String,
    /// Warehouse folder, relative to the config file's folder, e.g. `./warehouse` (required for
    /// a data sink; a schema sink without it takes it from its data sink).
    #[arg(long, allow_hyphen_values = true, value_parser = flag_value, value_name = "PATH")]
    pub warehouse: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command and flag says what it does: `--help` is the manual.
    fn walk(cmd: &clap::Command, path: &str, empty: &mut Vec<String>) {
        let here = format!("{path} {}", cmd.get_name());
        if cmd
            .get_about()
            .map(|a| a.to_string())
            .unwrap_or_default()
            .trim()
            .is_empty()
        {
            empty.push(format!("{here}: the command has no description"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            if help.trim().is_empty() {
                empty.push(format!("{here} --{id}: the flag has no description"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" {
                walk(sub, &here, empty);
            }
        }
    }

    #[test]
    fn every_help_page_describes_every_flag() {
        let mut empty = Vec::new();
        walk(&Cli::command(), "", &mut empty);
        assert!(
            empty.is_empty(),
            "help without description:\n{}",
            empty.join("\n")
        );
    }

    #[test]
    fn top_level_examples_cover_every_command() {
        let help = Cli::command().render_long_help().to_string();
        for cmd in ["connect", "validate", "discover", "sync", "query", "serve"] {
            assert!(
                help.contains(&format!("skipprd {cmd}")) || help.contains(&format!(" {cmd} ")),
                "no example of `{cmd}` in skipprd --help"
            );
        }
    }

    /// `skipprd connect data-source postgres` with the required flags, `host_and_more`
    /// standing where `--host` goes.
    fn connect_postgres(host_and_more: &[&'static str]) -> Vec<&'static str> {
        let mut args = vec![
            "skipprd",
            "connect",
            "data-source",
            "postgres",
            "--pipeline",
            "p",
            "--name",
            "n",
        ];
        args.extend_from_slice(host_and_more);
        args.extend_from_slice(&["--user", "u", "--database", "d", "--tables", "t"]);
        args
    }

    /// `skipprd connect pipeline --pipeline app <flags>`, parsed.
    fn connect_pipeline(flags: &[&'static str]) -> Result<PipelineArgs, clap::Error> {
        let mut args = vec!["skipprd", "connect", "pipeline", "--pipeline", "app"];
        args.extend_from_slice(flags);
        let cli = Cli::try_parse_from(args)?;
        let Command::Connect {
            what: ConnectCommand::Pipeline(args),
        } = cli.command
        else {
            panic!("not connect pipeline");
        };
        Ok(args)
    }

    #[test]
    fn a_flag_without_its_value_is_an_error_naming_it() {
        let args = connect_postgres(&["--host", "--port", "5432"]);
        let err = Cli::try_parse_from(args).expect_err("`--host` without a value must fail");
        let msg = err.to_string();
        assert!(msg.contains("--host"), "{msg}");
    }

    #[test]
    fn layout_flags_take_table_entry_pairs_in_order() {
        let args = connect_pipeline(&[
            "--partition-by",
            "orders=day(created_at)",
            "--partition-by",
            "orders=bucket(16, customer_id)",
            "--sort-by",
            "sales.refunds=id desc",
        ])
        .expect("parses");
        let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
        assert_eq!(
            args.partition_by,
            vec![
                pair("orders", "day(created_at)"),
                pair("orders", "bucket(16, customer_id)")
            ]
        );
        assert_eq!(args.sort_by, vec![pair("sales.refunds", "id desc")]);
        let err = connect_pipeline(&["--partition-by", "day(created_at)"])
            .expect_err("an entry without its table must fail");
        assert!(err.to_string().contains("TABLE=ENTRY"), "{err}");
    }

    #[test]
    fn failover_slot_takes_an_optional_value_and_exclude_column_a_pair() {
        let failover = |more: &[&'static str]| {
            let cli = Cli::try_parse_from(connect_postgres(more)).expect("parses");
            let Command::Connect {
                what:
                    ConnectCommand::DataSource {
                        kind: SourceKind::Postgres(pg),
                    },
            } = cli.command
            else {
                panic!("not a postgres data source");
            };
            pg.failover_slot
        };
        // Bare, it is `true` and leaves the next flag (`--user`) alone.
        assert_eq!(failover(&["--host", "h", "--failover-slot"]), Some(true));
        assert_eq!(
            failover(&["--host", "h", "--failover-slot", "false"]),
            Some(false)
        );
        assert_eq!(failover(&["--host", "h"]), None);

        let args = connect_pipeline(&[
            "--exclude-column",
            "orders=internal_note",
            "--exclude-column",
            "orders=",
        ])
        .expect("parses");
        let pair = |t: &str, e: &str| (t.to_string(), e.to_string());
        assert_eq!(
            args.exclude_column,
            vec![pair("orders", "internal_note"), pair("orders", "")]
        );
        let err = connect_pipeline(&["--exclude-column", "internal_note"])
            .expect_err("a column without its table must fail");
        assert!(err.to_string().contains("TABLE=COLUMN"), "{err}");
    }

    #[test]
    fn changelog_takes_a_table_and_an_optional_name() {
        let args = connect_pipeline(&[
            "--changelog",
            "orders",
            "--changelog",
            "sales.refunds=refunds_history",
            "--changelog",
            "events=",
        ])
        .expect("parses");
        assert_eq!(
            args.changelog,
            vec![
                ("orders".to_string(), None),
                (
                    "sales.refunds".to_string(),
                    Some("refunds_history".to_string())
                ),
                ("events".to_string(), Some(String::new())),
            ]
        );
        for bad in ["=orders_history", " "] {
            let err = connect_pipeline(&["--changelog", bad]).expect_err("no table must fail");
            assert!(err.to_string().contains("--changelog"), "{err}");
        }
        let err = connect_pipeline(&["--changelog", "=x"]).expect_err("no table must fail");
        assert!(err.to_string().contains("TABLE[=NAME]"), "{err}");
    }

    #[test]
    fn a_value_may_start_with_one_dash() {
        let args = connect_postgres(&["--host", "h", "--password", "-secret"]);
        let cli = Cli::try_parse_from(args).expect("parses");
        let Command::Connect {
            what:
                ConnectCommand::DataSource {
                    kind: SourceKind::Postgres(pg),
                },
        } = cli.command
        else {
            panic!("not a postgres data source");
        };
        assert_eq!(pg.password.as_deref(), Some("-secret"));
    }
}
