//! The `skippr.yml` model: the first stage of the data flow, describing sources, sinks and
//! the pipelines that connect them.
//!
//! Every struct denies unknown keys so a typo is an error, not a silently ignored setting.
//! Sources and sinks are closed sets: each definition holds exactly one connector key
//! (`Postgres`; `LocalIceberg`, `AthenaIceberg`, `RestIceberg`, `S3TablesIceberg`,
//! `GlueRestIceberg`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::model_rest::{GlueRestIcebergSink, RestIcebergSink, S3TablesIcebergSink, Sigv4};

/// Default Postgres port.
pub const DEFAULT_PG_PORT: u16 = 5432;
/// Default number of connections that copy one large table in parallel.
pub const DEFAULT_SNAPSHOT_PARALLELISM: usize = 4;
/// Rows per chunk of a copy in key chunks (`snapshot_chunk_rows`): a chunk's transaction lasts
/// a fraction of a second.
pub const DEFAULT_SNAPSHOT_CHUNK_ROWS: u64 = 100_000;
/// Default target size of a Parquet data file, in MiB.
pub const DEFAULT_PARQUET_TARGET_FILE_SIZE_MB: u64 = 128;
/// Default folder (relative to the config file) for the WAL and pipeline state.
pub const DEFAULT_STORAGE_PATH: &str = ".skippr";
/// Default interval between Iceberg commits while streaming changes.
pub const DEFAULT_COMMIT_INTERVAL: &str = "10s";
/// Default memory one source transaction may take while it streams before it is spilled
/// to disk, in MiB.
pub const DEFAULT_TRANSACTION_MEMORY_BUDGET_MB: u64 = 256;
/// Largest accepted `transaction_memory_budget_mb` and `key_index_memory_budget_mb` (1 TiB).
pub const MAX_TRANSACTION_MEMORY_BUDGET_MB: u64 = 1024 * 1024;
/// Default memory each table's key index may take before it moves to local disk, in MiB
/// (16 bytes a row for an integer key: about 16 million rows).
pub const DEFAULT_KEY_INDEX_MEMORY_BUDGET_MB: u64 = 256;

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SkipprFile {
    /// Global settings: workspace, storage of the WAL and state.
    pub skippr: Settings,
    /// Named pipelines, each joining one data source to one data sink.
    #[serde(default)]
    pub pipelines: BTreeMap<String, PipelineDef>,
    /// Named data sources.
    #[serde(default)]
    pub data_sources: BTreeMap<String, DataSourceDef>,
    /// Named data sinks.
    #[serde(default)]
    pub data_sinks: BTreeMap<String, DataSinkDef>,
    /// Named schema sinks: where table schemas are registered.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schema_sinks: BTreeMap<String, SchemaSinkDef>,
}

/// Global settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The workspace: the Iceberg namespace and the SQL schema the tables appear under.
    pub workspace: String,
    /// Where Skippr keeps its WAL and state.
    #[serde(default)]
    pub skipprd_el_storage_mode: StorageMode,
    /// Folder for the WAL and state when the storage mode is `local` (default `.skippr`
    /// beside `skippr.yml`); `s3://bucket/prefix` when it is `s3` (required then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipprd_el_storage_path: Option<String>,
    /// The Postgres-wire gateway of `skipprd serve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<QuerySettings>,
    /// The Prometheus endpoint of `skipprd serve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSettings>,
    /// How pipelines ride out transient faults (the source restarting, a broken connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect: Option<ReconnectSettings>,
    /// The pipeline leases of `skipprd_el_storage_mode: s3` (one writer per pipeline across
    /// machines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseSettingsDef>,
}

/// `skippr.lease`: with the WAL and state on S3, each running pipeline holds a lease object
/// in the state prefix; another `sync` of it is refused until the lease expires.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LeaseSettingsDef {
    /// How often the holder renews its lease (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_every: Option<String>,
    /// How long after its last renewal a lease expires and may be taken over (default 2m;
    /// at least twice `renew_every`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_after: Option<String>,
}

/// Longest wait between two tries after a transient fault.
pub const DEFAULT_RECONNECT_MAX_BACKOFF: &str = "30s";
/// How long `sync` keeps retrying one fault before it exits (`serve` never gives up).
pub const DEFAULT_RECONNECT_GIVE_UP_AFTER: &str = "5m";
/// How long the replication connection may stay silent before its peer counts as dead.
pub const DEFAULT_RECONNECT_PEER_TIMEOUT: &str = "30s";
/// `data_sources.<name>.Postgres.heartbeat_interval` by default.
pub const DEFAULT_HEARTBEAT_INTERVAL: &str = "1m";
/// `data_sources.<name>.Postgres.max_retained_wal` by default.
pub const DEFAULT_MAX_RETAINED_WAL: &str = "10GiB";

/// `skippr.reconnect`: retries after transient faults.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ReconnectSettings {
    /// Longest wait between tries (default 30s); waits start at 500ms and double, with
    /// jitter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff: Option<String>,
    /// How long `sync` retries before it exits with code 75 (default 5m). `serve` retries
    /// without limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub give_up_after: Option<String>,
    /// Silence after which the replication connection counts as dead and is reopened
    /// (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_timeout: Option<String>,
}

/// Default address of the Postgres-wire gateway.
pub const DEFAULT_QUERY_LISTEN: &str = "127.0.0.1:5433";
/// Default address of the Prometheus endpoint.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9187";

/// `skippr.query`: the Postgres-wire gateway.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct QuerySettings {
    /// `host:port` to accept clients on (default 127.0.0.1:5433).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Users allowed to log in with SCRAM-SHA-256. Without users only loopback clients are
    /// accepted, without a password.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<QueryUser>,
    /// TLS certificate and key (PEM). When set, it must load, or the gateway does not start,
    /// and clients that do not ask for TLS are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    /// Default `statement_timeout` of every connection (`500ms`, `30s`, `5min`, `1h`; `0`
    /// for none); a client may change it for its session with `SET statement_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement_timeout: Option<String>,
    /// Most clients connected at once; the next one is refused with SQLSTATE 53300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
    /// Memory one statement may use (`512MiB`, `1GiB`); beyond it the statement fails with
    /// SQLSTATE 53200 (sorts and aggregates spill to disk first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_query_memory: Option<String>,
    /// How many parts the scans, joins and aggregates of one statement are split into
    /// (default: twice the cores). More parts than cores keep every core busy when one part
    /// takes longer than the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_partitions: Option<u64>,
    /// Memory all statements together may use (default: half of the machine's memory);
    /// statements spill, then fail one at a time, before the server goes past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<String>,
    /// Folder the statements' sorts, aggregates and joins spill to, relative to `skippr.yml`
    /// (default: `tmp/spill` under `skipprd_el_storage_path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_path: Option<String>,
    /// Statements that run at once (default: twice the cores); the next ones wait their turn,
    /// the wait counting toward their `statement_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_statements: Option<u64>,
    /// Statements that take at least this long (`250ms`, `2s`; `0` for every one) are logged
    /// at INFO when they end, with their text, session, user, duration and rows (default:
    /// none are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_min_duration: Option<String>,
}

pub use super::machine::{
    default_max_concurrent_statements, default_max_memory, default_target_partitions,
};

/// Default `skippr.query.statement_timeout`.
pub const DEFAULT_STATEMENT_TIMEOUT: &str = "5min";
/// Default `skippr.query.max_connections` (as Postgres's).
pub const DEFAULT_MAX_CONNECTIONS: u64 = 100;
/// Default `skippr.query.max_query_memory`.
pub const DEFAULT_MAX_QUERY_MEMORY: &str = "1GiB";

/// A gateway user.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueryUser {
    pub name: String,
    pub password: String,
    /// May cancel and terminate any user's sessions (`pg_cancel_backend`,
    /// `pg_terminate_backend`); a user without it reaches only its own sessions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

/// PEM files for the gateway's TLS.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// Certificate chain (PEM), relative to `skippr.yml`.
    pub cert: String,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1), relative to `skippr.yml`.
    pub key: String,
}

/// `skippr.metrics`: the Prometheus endpoint.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// `host:port` serving `/metrics` (default 127.0.0.1:9187).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

/// Where the WAL and pipeline state live.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StorageMode {
    /// A folder on the local file system.
    #[default]
    Local,
    /// A prefix in an S3 bucket (`s3://bucket/prefix`), with the standard AWS credentials.
    S3,
}

/// A pipeline: one data source flowing into one data sink.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineDef {
    /// Reference to a data source, `data_sources.<name>`.
    pub data_source: String,
    /// Reference to a data sink, `data_sinks.<name>`.
    pub data_sink: String,
    /// How often streamed changes are committed to Iceberg, e.g. `10s`, `500ms`, `1m`
    /// (default 10s). Changes are visible to live queries before that, from the WAL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_interval: Option<String>,
    /// Memory, in MiB, that one source transaction may take while it streams (default 256);
    /// a larger transaction is spilled to disk under the storage path instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_memory_budget_mb: Option<u64>,
    /// Memory, in MiB, that the key index of each table may take (default 256): the primary
    /// key and location of every row, 16 to 24 bytes a row. Beyond it the index lives in a
    /// file on local disk and lookups read it from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_index_memory_budget_mb: Option<u64>,
    /// Automatic maintenance of the pipeline's Iceberg tables (compaction, snapshot expiry,
    /// orphan cleanup); on by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceDef>,
    /// Consistent cuts: every table of the pipeline tagged at one source LSN at each
    /// interval, for engines outside Skippr (off unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_cuts: Option<ConsistentCutsDef>,
    /// Settings of single tables, keyed by the table as the source lists it (`orders` or
    /// `schema.orders`), in the file's order: how each is laid out in files. A table not
    /// named here is one unsorted partition.
    #[serde(default, skip_serializing_if = "PipelineTables::is_empty")]
    pub tables: PipelineTables,
}

/// `pipelines.<name>.tables`: each table's settings, in the order the file gives them
/// (a YAML mapping from table name to [`PipelineTableDef`]; a table with no settings may be
/// written with none: `orders:`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PipelineTables(pub Vec<(String, PipelineTableDef)>);

impl PipelineTables {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (table as written, its settings), in the file's order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &PipelineTableDef)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl Serialize for PipelineTables {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PipelineTables {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Tables;
        impl<'de> serde::de::Visitor<'de> for Tables {
            type Value = PipelineTables;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping from table name to its settings (partition_by, sort_by, exclude_columns, changelog)")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(PipelineTables::default())
            }

            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(PipelineTables::default())
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(table) = map.next_key::<String>()? {
                    let settings: Option<PipelineTableDef> = map.next_value()?;
                    out.push((table, settings.unwrap_or_default()));
                }
                Ok(PipelineTables(out))
            }
        }
        deserializer.deserialize_any(Tables)
    }
}

/// `pipelines.<name>.tables.<table>`: how one table of the pipeline is laid out in files.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PipelineTableDef {
    /// The table's partitions, coarsest first: a column (its values as they are),
    /// `year(c)`, `month(c)`, `day(c)`, `hour(c)`, `bucket(N, c)` or `truncate(W, c)`; each data
    /// file holds the rows of one partition (default: one partition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_by: Vec<String>,
    /// The order of the rows inside each data file: `column [asc|desc] [nulls first|last]`
    /// (default: unsorted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sort_by: Vec<String>,
    /// Columns left out of the Iceberg table: neither copied nor streamed (a generated column
    /// before Postgres 18, or a column that must not reach the lake).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_columns: Vec<String>,
    /// A changelog table beside the table: every change as a row, appended (`true` names it
    /// `<table>_changelog`; `{table: name}` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changelog: Option<ChangelogDef>,
}

/// `pipelines.<name>.tables.<table>.changelog`: `true`, `false`, or `{table: name}`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ChangelogDef {
    On(bool),
    Named(ChangelogNamed),
}

/// Read by hand rather than untagged, so that a wrong value is named with its fix (serde's
/// untagged enums only say that no variant matched).
impl<'de> Deserialize<'de> for ChangelogDef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Changelog;
        impl<'de> serde::de::Visitor<'de> for Changelog {
            type Value = ChangelogDef;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`true`, `false` or `{table: <name>}`")
            }

            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<Self::Value, E> {
                Ok(ChangelogDef::On(on))
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Err(E::custom(changelog_text_message(s)))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                ChangelogNamed::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ChangelogDef::Named)
            }
        }
        deserializer.deserialize_any(Changelog)
    }
}

/// The message for `changelog: <text>`: a name is given as `{table: <name>}` (and `yes`
/// or `on`, booleans to YAML 1.1, are no name).
fn changelog_text_message(s: &str) -> String {
    let yes_no =
        ["yes", "no", "on", "off", "y", "n"].contains(&s.trim().to_ascii_lowercase().as_str());
    let name = if !yes_no && changelog_name(s.trim()).is_ok() {
        s.trim()
    } else {
        "<name>"
    };
    format!(
        "`{s}` is not `true`, `false` or `{{table: <name>}}`: write `changelog: true` for a changelog table named `<table>_changelog`, or `changelog: {{table: {name}}}` to name it"
    )
}

/// Checks a changelog table's name: Iceberg catalogs (Glue among them) take lower-case
/// letters, digits and underscores.
pub fn changelog_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the changelog table needs a name: use lower-case letters, digits and underscores, e.g. `orders_history`, or write `changelog: true` for `<table>_changelog`".into());
    }
    let plain = name.len() <= 255
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a table name every catalog takes: use lower-case letters, digits and underscores, e.g. `orders_history`"
        ))
    }
}

/// `changelog: {table: name}`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChangelogNamed {
    /// The changelog's Iceberg table name (default `<table>_changelog`).
    pub table: String,
}

/// `pipelines.<name>.maintenance`: how the pipeline keeps its tables compact.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceDef {
    /// Whether maintenance runs at all (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How often each table is checked, after a commit (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_interval: Option<String>,
    /// A snapshot is expired once it was replaced longer ago than this (default 1h): the
    /// reach of time travel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_retention: Option<String>,
    /// Never fewer snapshots than this (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_snapshots_to_keep: Option<u64>,
    /// Unreferenced files older than this are removed (default 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan_file_age: Option<String>,
    /// A compaction runs once this many small data files or delete files gather (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_min_files: Option<u64>,
}

/// `pipelines.<name>.consistent_cuts`: how often every table of the pipeline is tagged
/// `skippr-cut-<UTC time>` at one source LSN, and how many of those cuts are kept.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ConsistentCutsDef {
    /// How often a cut is taken, e.g. `10s`, `1h`, `1d` (default 1h, at least 1s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// How many cuts are kept (default 48); the tags of older ones are removed, and their
    /// snapshots then expire as any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u64>,
}

/// A data source definition: exactly one connector key.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataSourceDef {
    /// A Postgres database read by snapshot and logical replication.
    #[serde(rename = "Postgres", default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresSource>,
}

/// How a Postgres source is read.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum CdcMode {
    /// A consistent snapshot, then the change stream from exactly where it ended.
    #[default]
    SnapshotThenCdc,
    /// Only the change stream, from the slot's current position.
    CdcOnly,
    /// Only a consistent snapshot, no replication slot.
    SnapshotOnly,
}

impl CdcMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CdcMode::SnapshotThenCdc => "snapshot_then_cdc",
            CdcMode::CdcOnly => "cdc_only",
            CdcMode::SnapshotOnly => "snapshot_only",
        }
    }

    pub fn needs_snapshot(self) -> bool {
        !matches!(self, CdcMode::CdcOnly)
    }

    pub fn needs_replication(self) -> bool {
        !matches!(self, CdcMode::SnapshotOnly)
    }
}

/// TLS on the connections to the source Postgres, with libpq's `sslmode` names and meaning.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, plain TCP otherwise; the certificate is not checked.
    #[default]
    Prefer,
    /// TLS or no connection. The certificate is checked as with `verify-ca` when a root
    /// certificate is available (`sslrootcert`, or `~/.postgresql/root.crt`), not otherwise.
    Require,
    /// TLS with a certificate signed by a trusted CA (`sslrootcert`).
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    /// The name written in `skippr.yml` (libpq's).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Connection and replication settings of a Postgres source.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PostgresSource {
    /// Host name or address (or a Unix socket folder starting with `/`).
    pub host: String,
    /// Port, default 5432.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// User to connect as.
    pub user: String,
    /// Password; use `${VAR}` to read it from the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Database name.
    pub database: String,
    /// TLS to the server: `disable`, `prefer` (default), `require`, `verify-ca` or
    /// `verify-full`, as libpq's `sslmode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslmode: Option<SslMode>,
    /// CA certificates (PEM) the server's certificate must chain to, relative to
    /// `skippr.yml` (default `~/.postgresql/root.crt`, as libpq).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslrootcert: Option<String>,
    /// Tables to follow: `name` (schema `public`) or `schema.name`.
    pub tables: Vec<String>,
    /// How the tables are read: `snapshot_then_cdc` (default), `cdc_only`, `snapshot_only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdc_mode: Option<CdcMode>,
    /// Publication name (default `skippr_<workspace>_<pipeline>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication: Option<String>,
    /// Replication slot name (default `skippr_<workspace>_<pipeline>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// Tables without a primary key that only ever receive inserts; an update or delete
    /// on them stops the pipeline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub append_only: Vec<String>,
    /// Connections that copy one large table in parallel during a snapshot (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_parallelism: Option<usize>,
    /// Rows a chunk of a copy in key chunks takes on (default 100000): a large table's first
    /// copy, and a table added to a running pipeline, are copied in key ranges of about this
    /// many rows, each in a transaction of its own and made durable as it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_chunk_rows: Option<u64>,
    /// Target size of the Parquet files a snapshot writes, in MiB (default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet_target_file_size_mb: Option<u64>,
    /// How often a running pipeline writes a logical message to the source, so that its
    /// slot advances even when nothing in this database changes (default `1m`; `0`: never).
    /// A whole number written without quotes (`0`) is taken as its text.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "text_or_integer"
    )]
    pub heartbeat_interval: Option<String>,
    /// WAL the slot may hold back on the server before status, metrics and the log warn
    /// (default `10GiB`). A whole number written without quotes (bytes) is taken as its text.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "text_or_integer"
    )]
    pub max_retained_wal: Option<String>,
    /// Create the slot as a failover slot (Postgres 17 and later), which standbys that
    /// synchronise slots keep, so the pipeline goes on after a promotion (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_slot: Option<bool>,
}

impl PostgresSource {
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_PG_PORT)
    }

    pub fn cdc_mode(&self) -> CdcMode {
        self.cdc_mode.unwrap_or_default()
    }
}

/// A setting written as text, or as a whole number taken as its text (`heartbeat_interval: 0`).
fn text_or_integer<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(V)
}

/// Declares a sink definition: the connector keys every sink takes (exactly one of them is
/// set), then the definition's own keys. One declaration serves data sinks and schema sinks
/// alike; serde's `flatten` cannot share the keys, as it does not go with
/// `deny_unknown_fields` (nor name an unknown key with the allowed ones).
macro_rules! sink_def {
    ($(#[$doc:meta])* $name:ident { $($own:tt)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Iceberg tables in a local warehouse with an embedded sqlite catalog (as a schema
            /// sink: that catalog).
            #[serde(
                rename = "LocalIceberg",
                default,
                skip_serializing_if = "Option::is_none"
            )]
            pub local_iceberg: Option<LocalIcebergSink>,
            /// Iceberg tables on S3, registered in AWS Glue, queryable from Athena (as a schema
            /// sink: the Glue catalog).
            #[serde(
                rename = "AthenaIceberg",
                default,
                skip_serializing_if = "Option::is_none"
            )]
            pub athena_iceberg: Option<AthenaIcebergSink>,
            /// Iceberg tables behind an Iceberg REST catalog (Polaris, Lakekeeper, Nessie, Unity, ...).
            #[serde(
                rename = "RestIceberg",
                default,
                skip_serializing_if = "Option::is_none"
            )]
            pub rest_iceberg: Option<RestIcebergSink>,
            /// Iceberg tables in an S3 table bucket, through its REST endpoint.
            #[serde(
                rename = "S3TablesIceberg",
                default,
                skip_serializing_if = "Option::is_none"
            )]
            pub s3_tables_iceberg: Option<S3TablesIcebergSink>,
            /// Iceberg tables in a Glue database, through Glue's Iceberg REST endpoint.
            #[serde(
                rename = "GlueRestIceberg",
                default,
                skip_serializing_if = "Option::is_none"
            )]
            pub glue_rest_iceberg: Option<GlueRestIcebergSink>,
            $($own)*
        }

        impl $name {
            /// How many connector keys are set (a valid definition has exactly one).
            pub fn connector_count(&self) -> u8 {
                self.local_iceberg.is_some() as u8
                    + self.athena_iceberg.is_some() as u8
                    + self.rest_iceberg.is_some() as u8
                    + self.s3_tables_iceberg.is_some() as u8
                    + self.glue_rest_iceberg.is_some() as u8
            }
        }
    };
}

sink_def! {
    /// A data sink definition: exactly one connector key, plus an optional schema sink link.
    DataSinkDef {
        /// Reference to a schema sink, `schema_sinks.<name>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub schema_sink: Option<String>,
    }
}

sink_def! {
    /// A schema sink definition: exactly one connector key.
    SchemaSinkDef {}
}

/// The embedded default sink.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LocalIcebergSink {
    /// Warehouse folder; relative paths resolve against the config file's folder.
    pub warehouse: String,
}

/// Iceberg on S3 with the Glue catalog.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AthenaIcebergSink {
    /// Warehouse location, `s3://bucket/prefix/`.
    pub warehouse: String,
    /// Glue database the tables are registered in.
    pub glue_database_name: String,
    /// Athena workgroup used for queries.
    pub athena_workgroup_name: String,
    /// Bucket for Athena query results.
    pub athena_results_s3_bucket: String,
    /// AWS region.
    pub region: String,
}
