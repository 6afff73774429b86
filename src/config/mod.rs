//! Configuration: reads `skippr.yml`, fills `${VAR}` from the environment, checks every
//! reference, and hands the rest of the data flow a resolved, validated [`Config`].
//!
//! Errors name the file, the line, the field path and what is allowed. Values read from the
//! environment are never written back and never logged.

pub mod changelog;
pub mod connect;
pub mod emit;
pub mod layout;
pub mod layouts;
mod lease;
pub mod locate;
mod machine;
mod maintenance;
pub mod model;
mod model_rest;
mod overlap;
mod postgres;
mod query;
mod resolve;
pub mod rest_iceberg;
mod source_tls;
mod yaml;

pub use crate::change::table::{quote_ident, TableRef};
use std::fmt;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

use crate::error::Error;
use crate::storage::state_file::StateFile;
use locate::{display_path, Locator, Position, Segment};
pub use maintenance::{
    CutSettings, MaintenanceSettings, DEFAULT_CUT_EVERY, DEFAULT_CUT_KEEP, MAX_CUT_KEEP,
    MIN_CUT_EVERY,
};
pub use model::*;
pub use postgres::{parse_heartbeat_interval, parse_max_retained_wal};
pub use yaml::expand;
use yaml::{interpolate, typed_all};

/// The default config file name, looked up in the working directory.
pub const DEFAULT_CONFIG_FILE: &str = "skippr.yml";

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub position: Option<Position>,
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(p) = self.position {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        if self.path.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one config file.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<Problem>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
                write!(f, "error: ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigErrors> for Error {
    fn from(e: ConfigErrors) -> Self {
        Error::config(e.to_string())
    }
}

/// The gateway's settings, resolved.
#[derive(Debug, Clone)]
pub struct QueryConfig {
    pub listen: std::net::SocketAddr,
    /// (name, password): SCRAM-SHA-256 users. Empty: loopback clients only, no password.
    pub users: Vec<(String, String)>,
    /// (certificate, key) PEM files. When set, clients must use TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Default statement timeout of a connection; `None`: no limit.
    pub statement_timeout: Option<std::time::Duration>,
    /// Most clients connected at once.
    pub max_connections: usize,
    /// Bytes of memory one statement may use.
    pub max_query_memory: usize,
    /// Parts a statement's scans, joins and aggregates are split into.
    pub target_partitions: usize,
    /// Bytes of memory all statements together may use (`max_query_memory` at most each).
    pub max_memory: usize,
    /// Where statements spill; `None`: `tmp/spill` under the storage path.
    pub spill_path: Option<PathBuf>,
    /// Statements that run at once; the others queue.
    pub max_concurrent_statements: usize,
    /// The users of `users` that may cancel and terminate any user's sessions.
    pub admins: std::collections::HashSet<String>,
    /// Statements that take at least this long are logged when they end; `None`: none are.
    pub log_min_duration: Option<std::time::Duration>,
}

/// Retries after transient faults, resolved (see [`ReconnectSettings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectConfig {
    pub max_backoff: std::time::Duration,
    pub give_up_after: std::time::Duration,
    pub peer_timeout: std::time::Duration,
}

fn is_simple_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A resolved Postgres source.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
    /// TLS to the server (libpq's `sslmode`).
    pub sslmode: SslMode,
    /// CA certificates (PEM) the server's certificate must chain to; `None`: libpq's
    /// default, `~/.postgresql/root.crt`.
    pub sslrootcert: Option<PathBuf>,
    pub tables: Vec<TableRef>,
    pub cdc_mode: CdcMode,
    pub publication: String,
    /// `publication` was named in skippr.yml (the user's publication: skipprd changes its
    /// settings only when it made it, see `slot::publication_is_ours`).
    pub publication_named: bool,
    pub slot: String,
    pub snapshot_parallelism: usize,
    /// Rows per chunk of a copy in key chunks.
    pub snapshot_chunk_rows: u64,
    pub parquet_target_file_size: u64,
    pub append_only: Vec<TableRef>,
    /// Silence after which the replication connection counts as dead (`skippr.reconnect`).
    pub peer_timeout: std::time::Duration,
    /// How often the running stream writes a heartbeat message; zero: never.
    pub heartbeat_interval: std::time::Duration,
    /// Bytes of WAL the slot may hold back before warnings.
    pub max_retained_wal: u64,
    /// Create the slot with `FAILOVER` (Postgres 17+).
    pub failover_slot: bool,
    /// Columns of each table left out of its Iceberg table (`pipelines.<p>.tables.<t>.exclude_columns`).
    pub exclude_columns: std::collections::BTreeMap<TableRef, Vec<String>>,
}

impl PostgresConfig {
    /// The columns of `table` the pipeline leaves out.
    pub fn excluded(&self, table: &TableRef) -> &[String] {
        self.exclude_columns
            .get(table)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// The connector keys a data or schema sink may have.
pub const SINK_KINDS: &str =
    "LocalIceberg, AthenaIceberg, RestIceberg, S3TablesIceberg, GlueRestIceberg";

/// A resolved sink.
#[derive(Debug, Clone)]
pub enum SinkConfig {
    LocalIceberg {
        name: String,
        warehouse: PathBuf,
    },
    AthenaIceberg {
        name: String,
        sink: AthenaIcebergSink,
    },
    /// A REST catalog (`RestIceberg`, or the `S3TablesIceberg` / `GlueRestIceberg` shortcuts).
    RestIceberg {
        name: String,
        /// The connector key the sink was written with.
        kind: &'static str,
        sink: RestIcebergSink,
        /// The one namespace every table goes to instead of the workspace (a Glue database).
        namespace: Option<String>,
    },
}

/// A resolved pipeline.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub name: String,
    pub commit_interval: std::time::Duration,
    /// Bytes one source transaction may take in memory while it streams before it spills.
    pub transaction_memory_budget: u64,
    /// Bytes each table's key index may take in memory before it moves to local disk (in
    /// `key_index_dir`).
    pub key_index_memory_budget: u64,
    /// How the pipeline maintains its tables.
    pub maintenance: MaintenanceSettings,
    /// How the pipeline takes consistent cuts (none unless `consistent_cuts` is given).
    pub consistent_cuts: Option<CutSettings>,
    pub source: PostgresConfig,
    pub sink: SinkConfig,
    pub schema_sink: Option<String>,
    /// The pipeline's state (tables followed, their watermarks): a file in the state folder,
    /// or an object in the S3 state prefix.
    pub state_file: StateFile,
    /// The local folder where each table's key index is kept between runs (a cache: under
    /// the storage path in mode `local`, under this machine's temporary folder in mode `s3`).
    pub key_index_dir: PathBuf,
    /// Each table's layout (`pipelines.<name>.tables.<table>`: partition spec and sort
    /// order); a table not named here is unpartitioned and unsorted.
    pub layouts: std::collections::BTreeMap<TableRef, crate::config::layout::Layout>,
    /// Where each table of `layouts` is written in `skippr.yml`, entry by entry, for the
    /// messages of `discover` and `sync` when an entry does not fit the table's columns.
    pub layout_origins: std::collections::BTreeMap<TableRef, layouts::LayoutOrigin>,
    /// The tables with a changelog table (`pipelines.<name>.tables.<table>.changelog`), and
    /// its Iceberg name.
    pub changelogs: std::collections::BTreeMap<TableRef, String>,
}

impl PipelineConfig {
    /// The Iceberg name of `table`'s changelog table, when it has one.
    pub fn changelog(&self, table: &TableRef) -> Option<&str> {
        self.changelogs.get(table).map(String::as_str)
    }

    /// The layout `skippr.yml` asks for `table` (unpartitioned, unsorted when it names none).
    pub fn layout(&self, table: &TableRef) -> crate::config::layout::Layout {
        self.layouts.get(table).cloned().unwrap_or_default()
    }
}

/// The loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: PathBuf,
    pub workspace: String,
    /// The local folder of the WAL and state (mode `local`); in mode `s3`, a folder under the
    /// temporary directory that holds only this machine's process lock.
    pub storage_path: PathBuf,
    /// Where the WAL and state live: the folder above, or the S3 prefix.
    pub storage: crate::storage::Location,
    /// The gateway of `skipprd serve`.
    pub query: QueryConfig,
    /// The address of the Prometheus endpoint of `skipprd serve`.
    pub metrics_listen: std::net::SocketAddr,
    /// Whether `skippr.metrics.listen` is given: `sync` serves metrics only then.
    pub metrics_listen_set: bool,
    /// Retries after transient faults.
    pub reconnect: ReconnectConfig,
    /// How the pipeline leases of S3 mode are renewed and expire.
    pub lease: crate::storage::lease::LeaseSettings,
    pub pipelines: Vec<PipelineConfig>,
    /// The file as written, with `${VAR}` references still literal.
    pub raw: Value,
}

impl Config {
    /// Loads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![Problem {
                file: path.to_path_buf(),
                position: None,
                path: String::new(),
                message: format!(
                    "cannot read the config file: {e}; create it, or pass --config PATH"
                ),
            }])
        })?;
        Self::from_str(path, &text, &|name| std::env::var(name).ok())
    }

    /// Loads from text; `env` looks up environment variables.
    pub fn from_str(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigErrors> {
        let file = path.to_path_buf();
        let problem = |position: Option<Position>, p: &str, message: String| Problem {
            file: file.clone(),
            position,
            path: p.to_string(),
            message,
        };
        let locator = Locator::scan(text).map_err(|(pos, msg)| {
            ConfigErrors(vec![problem(
                Some(pos),
                "",
                format!("YAML syntax error: {msg}"),
            )])
        })?;
        let raw_value: Value = serde_yaml::from_str(text).map_err(|e| {
            let pos = e.location().map(|l| Position {
                line: l.line(),
                column: l.column(),
            });
            ConfigErrors(vec![problem(pos, "", format!("YAML syntax error: {e}"))])
        })?;
        if raw_value.is_null() {
            return Err(ConfigErrors(vec![problem(
                None,
                "",
                "the file is empty; it needs at least a `skippr:` section with a `workspace`"
                    .into(),
            )]));
        }

        // Fill ${VAR} from the environment on a copy; `raw` keeps the references.
        let raw = raw_value.clone();
        let mut value = raw_value;
        let mut problems = Vec::new();
        let mut at = Vec::new();
        interpolate(&mut value, &mut at, env, &mut |p, msg| {
            problems.push(problem(locator.find(p), &display_path(p), msg));
        });
        let (resolved, type_problems) = typed_all::<SkipprFile>(&value);
        for (p, msg) in type_problems {
            problems.push(problem(locator.find(&p), &display_path(&p), msg));
        }
        let Some(resolved) = resolved else {
            return Err(ConfigErrors(problems));
        };
        let base = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        let mut v = Validator {
            locator: &locator,
            problems,
            file: &file,
        };
        let config = v.resolve(&resolved, raw, &base, &file);
        if v.problems.is_empty() {
            Ok(config)
        } else {
            v.problems
                .sort_by_key(|p| p.position.map(|x| (x.line, x.column)));
            Err(ConfigErrors(v.problems))
        }
    }

    pub fn pipeline(&self, name: &str) -> crate::error::Result<&PipelineConfig> {
        self.pipelines
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let names: Vec<_> = self.pipelines.iter().map(|p| p.name.as_str()).collect();
                Error::config(format!(
                    "{}: no pipeline named `{name}`; defined pipelines: {}",
                    self.file.display(),
                    if names.is_empty() {
                        "(none)".to_string()
                    } else {
                        names.join(", ")
                    }
                ))
            })
    }
}

/// Parses `500ms`, `10s`, `2m`, `1h`, `1d`.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit.trim() {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(ms))
}

/// Parses a duration as Postgres spells `statement_timeout`: a number of milliseconds, or
/// with a unit (`ms`, `s`, `min`, `h`, `d`; `m` also means minutes).
pub fn parse_pg_duration(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" | "min" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(ms))
}

/// Parses a size: bytes, or with a unit (`KiB`, `MiB`, `GiB`, `TiB`; `kB`, `MB`, `GB`, `TB`
/// mean the same powers of 1024, as in Postgres's settings).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    let bytes = n.checked_mul(1u64 << shift)?;
    usize::try_from(bytes).ok()
}

/// Removes `.` and resolves `..` lexically, so paths print the way users expect.
fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

struct Validator<'a> {
    locator: &'a Locator,
    problems: Vec<Problem>,
    file: &'a Path,
}

fn keys(parts: &[&str]) -> Vec<Segment> {
    parts
        .iter()
        .map(|p| Segment::Key((*p).to_string()))
        .collect()
}

impl Validator<'_> {
    /// Whether a problem was already reported at or below `path` (so that a consequence of
    /// it is not reported a second time).
    fn reported_under(&self, path: &[&str]) -> bool {
        let prefix = path.join(".");
        self.problems
            .iter()
            .any(|p| p.path == prefix || p.path.starts_with(&format!("{prefix}.")))
    }

    /// A pipeline's memory budget `key` in MiB (default `default`), in bytes; `None` (and
    /// reported) when out of range. `beyond`: what happens to what does not fit.
    fn memory_budget(
        &mut self,
        pipeline: &str,
        key: &str,
        value: Option<u64>,
        default: u64,
        beyond: &str,
    ) -> Option<u64> {
        let mb = value.unwrap_or(default);
        if (1..=model::MAX_TRANSACTION_MEMORY_BUDGET_MB).contains(&mb) {
            return Some(mb * 1024 * 1024);
        }
        self.report(
            keys(&["pipelines", pipeline, key]),
            format!(
                "must be between 1 and {} (MiB); {beyond}, so the default {default} is enough for most",
                model::MAX_TRANSACTION_MEMORY_BUDGET_MB,
            ),
        );
        None
    }

    fn report(&mut self, path: Vec<Segment>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_path_buf(),
            position: self.locator.find(&path),
            path: display_path(&path),
            message: message.into(),
        });
    }

    /// Resolves `section.name`, reporting a dangling or malformed reference.
    fn reference<'m, T>(
        &mut self,
        path: Vec<Segment>,
        reference: &str,
        section: &str,
        map: &'m std::collections::BTreeMap<String, T>,
    ) -> Option<(&'m String, &'m T)> {
        let defined = if map.is_empty() {
            format!("no `{section}` are defined")
        } else {
            format!(
                "defined: {}",
                map.keys()
                    .map(|k| format!("{section}.{k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let name = match reference.split_once('.') {
            Some((s, n)) if s == section => n,
            _ => {
                self.report(
                    path,
                    format!(
                        "`{reference}` is not a reference of the form `{section}.<name>`; {defined}"
                    ),
                );
                return None;
            }
        };
        match map.get_key_value(name) {
            Some(found) => Some(found),
            None => {
                self.report(path, format!("`{reference}` refers to nothing; {defined}"));
                None
            }
        }
    }

    /// `skippr.reconnect`: every duration at least 1s.
    fn reconnect(&mut self, file: &SkipprFile) -> ReconnectConfig {
        let r = file.skippr.reconnect.clone().unwrap_or_default();
        let mut duration = |key: &str, value: Option<&str>, default: &str| {
            let text = value.unwrap_or(default);
            match parse_duration(text) {
                Some(d) if d >= std::time::Duration::from_secs(1) => d,
                _ => {
                    self.report(
                        keys(&["skippr", "reconnect", key]),
                        format!(
                            "`{text}` is not a duration of at least 1s: write e.g. `30s` or `5m`"
                        ),
                    );
                    parse_duration(default).unwrap_or_default()
                }
            }
        };
        ReconnectConfig {
            max_backoff: duration(
                "max_backoff",
                r.max_backoff.as_deref(),
                DEFAULT_RECONNECT_MAX_BACKOFF,
            ),
            give_up_after: duration(
                "give_up_after",
                r.give_up_after.as_deref(),
                DEFAULT_RECONNECT_GIVE_UP_AFTER,
            ),
            peer_timeout: duration(
                "peer_timeout",
                r.peer_timeout.as_deref(),
                DEFAULT_RECONNECT_PEER_TIMEOUT,
            ),
        }
    }

    /// The WAL and state location of `skipprd_el_storage_mode` and `_path`.
    fn storage(&mut self, s: &Settings, base: &Path) -> (PathBuf, crate::storage::Location) {
        use crate::storage::Location;
        let path = s.skipprd_el_storage_path.as_deref();
        let at = || keys(&["skippr", "skipprd_el_storage_path"]);
        match s.skipprd_el_storage_mode {
            StorageMode::Local => {
                if path.is_some_and(|p| p.starts_with("s3://")) {
                    self.report(at(), "an s3:// location needs `skipprd_el_storage_mode: s3`; with mode `local` this is a folder");
                }
                let dir = normalize(&base.join(path.unwrap_or(DEFAULT_STORAGE_PATH)));
                (dir.clone(), Location::Local(dir))
            }
            StorageMode::S3 => {
                let parsed = match path {
                    None => Err(
                        "is required with `skipprd_el_storage_mode: s3`: write s3://bucket/prefix"
                            .to_string(),
                    ),
                    Some(p) => Location::parse_s3(p),
                };
                let location = parsed.unwrap_or_else(|e| {
                    self.report(at(), e);
                    Location::Local(PathBuf::new())
                });
                // Local bookkeeping of an S3 pipeline (its process lock and scratch files)
                // lives in the temp folder, per S3 location and per config folder, so two configs on
                // one machine never share it.
                let base_tag = base
                    .to_string_lossy()
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                    });
                let lock_dir = std::env::temp_dir().join("skippr").join(format!(
                    "{}-{base_tag:016x}",
                    location
                        .display()
                        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
                ));
                (lock_dir, location)
            }
        }
    }

    fn check_athena(&mut self, at: &[&str], a: &AthenaIcebergSink) {
        if let Err(e) = crate::storage::Location::parse_s3(&a.warehouse) {
            let mut p = keys(at);
            p.push(Segment::Key("warehouse".into()));
            self.report(p, e);
        }
        for (field, value) in [
            ("glue_database_name", &a.glue_database_name),
            ("athena_workgroup_name", &a.athena_workgroup_name),
            ("athena_results_s3_bucket", &a.athena_results_s3_bucket),
            ("region", &a.region),
        ] {
            if value.trim().is_empty() {
                let mut p = keys(at);
                p.push(Segment::Key(field.into()));
                self.report(p, "must not be empty");
            }
        }
    }
}

#[cfg(test)]
mod tests;
