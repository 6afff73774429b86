//! Configuration: reads `skippr.yml`, fills `${VAR}` from the environment, checks every
//! reference, and hands the rest of the data flow a resolved, validated [`Config`].
//!
//! Errors name the file, the line, the field path and what is allowed. Values read from the
//! environment are never written back and never logged.

pub mod connect;
pub mod emit;
mod lease;
pub mod locate;
mod maintenance;
pub mod model;
mod overlap;
mod source_tls;

pub use crate::change::table::{quote_ident, TableRef};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

use crate::error::Error;
use crate::storage::state_file::StateFile;
use locate::{display_path, Locator, Position, Segment};
pub use model::*;

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
    pub slot: String,
    pub snapshot_parallelism: usize,
    pub parquet_target_file_size: u64,
    pub append_only: Vec<TableRef>,
    /// Silence after which the replication connection counts as dead (`skippr.reconnect`).
    pub peer_timeout: std::time::Duration,
}

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
    pub maintenance: crate::sink::iceberg::maintenance::MaintenanceSettings,
    pub source: PostgresConfig,
    pub sink: SinkConfig,
    pub schema_sink: Option<String>,
    /// The pipeline's state (tables followed, their watermarks): a file in the state folder,
    /// or an object in the S3 state prefix.
    pub state_file: StateFile,
    /// The local folder where each table's key index is kept between runs (a cache: under
    /// the storage path in mode `local`, under this machine's temporary folder in mode `s3`).
    pub key_index_dir: PathBuf,
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

/// Parses `500ms`, `10s`, `2m`, `1h`.
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

/// Deserializes `value` into `T`, collecting every type problem: after each one the
/// offending entry is set aside and the rest is checked again.
fn typed_all<T: serde::de::DeserializeOwned>(
    value: &Value,
) -> (Option<T>, Vec<(Vec<Segment>, String)>) {
    let mut v = value.clone();
    let mut problems: Vec<(Vec<Segment>, String)> = Vec::new();
    for _ in 0..64 {
        match typed::<T>(&v) {
            Ok(t) => return (Some(t), problems),
            Err((path, msg)) => {
                let missing = msg.starts_with("missing required field");
                // A required field we set aside is not a second problem.
                let ours = missing
                    && problems
                        .iter()
                        .any(|(p, _)| p.len() == path.len() + 1 && p.starts_with(&path));
                if !ours {
                    problems.push((path.clone(), msg));
                }
                if missing || !remove_at(&mut v, &path) {
                    return (None, problems);
                }
            }
        }
    }
    (None, problems)
}

/// Removes the entry at `path`; false when there is nothing to remove.
fn remove_at(v: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut cur = v;
    for seg in parents {
        cur = match (seg, cur) {
            (Segment::Key(k), Value::Mapping(m)) => match m.get_mut(k.as_str()) {
                Some(next) => next,
                None => return false,
            },
            (Segment::Index(i), Value::Sequence(s)) => match s.get_mut(*i) {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, cur) {
        (Segment::Key(k), Value::Mapping(m)) => m.remove(k.as_str()).is_some(),
        (Segment::Index(i), Value::Sequence(s)) if *i < s.len() => {
            s.remove(*i);
            true
        }
        _ => false,
    }
}

/// Deserializes a value into `T`, returning the failing path and a readable message.
fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, (Vec<Segment>, String)> {
    serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let mut path: Vec<Segment> = e
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
                serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
                serde_path_to_error::Segment::Enum { variant } => {
                    Some(Segment::Key(variant.clone()))
                }
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let inner = e.into_inner().to_string();
        let message = improve_message(&inner);
        // For an unknown field, point at the field itself.
        if let Some(field) = inner
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            if path.last() != Some(&Segment::Key(field.to_string())) {
                path.push(Segment::Key(field.to_string()));
            }
        }
        (path, message)
    })
}

/// Rewrites serde's wording into the words of the config file.
fn improve_message(msg: &str) -> String {
    let msg = msg
        .replace("unknown variant", "unknown value")
        .replace("invalid type: ", "wrong type: found ")
        .replace("u16", "a port number (1-65535)")
        .replace("usize", "a positive integer")
        .replace("u64", "a positive integer");
    let msg = msg.replace("expected one of ", "expected one of: ");
    match msg.strip_prefix("missing field ") {
        Some(rest) => format!("missing required field {rest}"),
        None => msg,
    }
}

/// Replaces `${VAR}` and `${VAR:-default}` in every string; `$$` is a literal `$`.
fn interpolate(
    value: &mut Value,
    path: &mut Vec<Segment>,
    env: &dyn Fn(&str) -> Option<String>,
    report: &mut dyn FnMut(&[Segment], String),
) {
    match value {
        Value::String(s) => match expand(s, env) {
            Ok(Some(new)) => *s = new,
            Ok(None) => {}
            Err(msg) => report(path, msg),
        },
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(Segment::Index(i));
                interpolate(item, path, env, report);
                path.pop();
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = match k {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                path.push(Segment::Key(key));
                interpolate(v, path, env, report);
                path.pop();
            }
        }
        Value::Tagged(t) => interpolate(&mut t.value, path, env, report),
        _ => {}
    }
}

/// Expands one string. `Ok(None)` means it has no reference.
pub fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, String> {
    if !s.contains('$') {
        return Ok(None);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('{') {
            let end = r.find('}').ok_or_else(|| {
                "unterminated `${` reference: write `${NAME}`, or `$$` for a literal `$`"
                    .to_string()
            })?;
            let inner = &r[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            if !is_simple_name(name) {
                return Err(format!(
                    "`${{{inner}}}` is not a valid environment variable reference: use letters, digits and `_`"
                ));
            }
            match (env(name), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set; export it before running skipprd (or write `${{{name}:-default}}`)"
                    ))
                }
            }
            rest = &r[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Some(out))
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

    fn resolve(&mut self, file: &SkipprFile, raw: Value, base: &Path, cfg_path: &Path) -> Config {
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
            let n = def.local_iceberg.is_some() as u8 + def.athena_iceberg.is_some() as u8;
            if n != 1 && !self.reported_under(&["data_sinks", name]) {
                self.report(
                    keys(&["data_sinks", name]),
                    "a data sink needs exactly one connector key; allowed: LocalIceberg, AthenaIceberg",
                );
            }
            if let Some(a) = &def.athena_iceberg {
                self.check_athena(&["data_sinks", name, "AthenaIceberg"], a);
            }
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
            }
        }
        for (name, def) in &file.schema_sinks {
            let n = def.local_iceberg.is_some() as u8 + def.athena_iceberg.is_some() as u8;
            if n != 1 && !self.reported_under(&["schema_sinks", name]) {
                self.report(
                    keys(&["schema_sinks", name]),
                    "a schema sink needs exactly one connector key; allowed: LocalIceberg, AthenaIceberg",
                );
            }
            if let Some(a) = &def.athena_iceberg {
                self.check_athena(&["schema_sinks", name, "AthenaIceberg"], a);
            }
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
            let source = source.and_then(|(sname, s)| {
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
                } else {
                    k.athena_iceberg
                        .as_ref()
                        .map(|a| SinkConfig::AthenaIceberg {
                            name: kname.clone(),
                            sink: a.clone(),
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
            if let (
                Some(source),
                Some(sink),
                Some(commit_interval),
                Some(budget),
                Some(index_budget),
                Some(mut m),
            ) = (
                source,
                sink_cfg,
                commit_interval,
                budget,
                index_budget,
                maintenance,
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

    fn socket_addr(&mut self, at: &[&str], value: &str) -> std::net::SocketAddr {
        match value.parse() {
            Ok(a) => a,
            Err(_) => {
                self.report(
                    keys(at),
                    format!("`{value}` is not an address: write `host:port` with an IP address, e.g. 127.0.0.1:5433 or 0.0.0.0:5433"),
                );
                std::net::SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }

    fn query_config(&mut self, file: &SkipprFile, base: &Path) -> QueryConfig {
        let q = file.skippr.query.clone().unwrap_or_default();
        let listen = self.socket_addr(
            &["skippr", "query", "listen"],
            q.listen.as_deref().unwrap_or(model::DEFAULT_QUERY_LISTEN),
        );
        let mut seen = std::collections::HashSet::new();
        for (i, u) in q.users.iter().enumerate() {
            let mut at = keys(&["skippr", "query", "users"]);
            at.push(Segment::Index(i));
            if u.name.is_empty() {
                let mut p = at.clone();
                p.push(Segment::Key("name".into()));
                self.report(p, "a user needs a name");
            } else if !seen.insert(u.name.clone()) {
                let mut p = at.clone();
                p.push(Segment::Key("name".into()));
                self.report(p, format!("user `{}` is listed twice", u.name));
            }
            if u.password.is_empty() {
                at.push(Segment::Key("password".into()));
                self.report(at, format!("user `{}` needs a non-empty password (for example `${{ANALYST_PASSWORD}}`)", u.name));
            }
        }
        if q.users.is_empty() && !listen.ip().is_loopback() {
            self.report(
                keys(&["skippr", "query", "listen"]),
                format!("`{listen}` accepts clients from other machines, but no users are configured, and without users only loopback clients may connect; add `users:` (name and password) or listen on 127.0.0.1"),
            );
        }
        let statement_timeout = q
            .statement_timeout
            .as_deref()
            .unwrap_or(model::DEFAULT_STATEMENT_TIMEOUT);
        let statement_timeout = match parse_pg_duration(statement_timeout) {
            Some(d) => (!d.is_zero()).then_some(d),
            None => {
                self.report(
                    keys(&["skippr", "query", "statement_timeout"]),
                    format!("`{statement_timeout}` is not a duration: write e.g. `500ms`, `30s`, `5min` or `1h` (`0` for no limit)"),
                );
                None
            }
        };
        let max_connections = q.max_connections.unwrap_or(model::DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 || max_connections > 100_000 {
            self.report(
                keys(&["skippr", "query", "max_connections"]),
                format!("{max_connections} is not between 1 and 100000"),
            );
        }
        let memory = q
            .max_query_memory
            .as_deref()
            .unwrap_or(model::DEFAULT_MAX_QUERY_MEMORY);
        let max_query_memory = match parse_bytes(memory) {
            Some(b) if b >= 1024 * 1024 => b,
            _ => {
                self.report(
                    keys(&["skippr", "query", "max_query_memory"]),
                    format!(
                        "`{memory}` is not a size of at least 1MiB: write e.g. `512MiB` or `2GiB`"
                    ),
                );
                0
            }
        };
        let target_partitions = match q.target_partitions {
            None => model::default_target_partitions(),
            Some(n @ 1..=1024) => usize::try_from(n).unwrap_or(1),
            Some(n) => {
                self.report(
                    keys(&["skippr", "query", "target_partitions"]),
                    format!("{n} is not between 1 and 1024: twice the cores suits most machines"),
                );
                1
            }
        };
        QueryConfig {
            statement_timeout,
            target_partitions,
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_query_memory,
            listen,
            users: q
                .users
                .iter()
                .map(|u| (u.name.clone(), u.password.clone()))
                .collect(),
            tls: q.tls.as_ref().map(|t| {
                (
                    normalize(&base.join(&t.cert)),
                    normalize(&base.join(&t.key)),
                )
            }),
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

    fn postgres(
        &mut self,
        source_name: &str,
        pg: &PostgresSource,
        workspace: &str,
        pipeline: &str,
        base: &Path,
    ) -> Option<PostgresConfig> {
        let at = |field: &str| keys(&["data_sources", source_name, "Postgres", field]);
        let before = self.problems.len();
        if pg.host.trim().is_empty() {
            self.report(at("host"), "must not be empty");
        }
        if pg.port == Some(0) {
            self.report(at("port"), "must be a port number (1-65535)");
        }
        if pg.tables.is_empty() {
            self.report(
                at("tables"),
                "list at least one table: `name` or `schema.name`",
            );
        }
        let mut tables = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, t) in pg.tables.iter().enumerate() {
            let mut p = at("tables");
            p.push(Segment::Index(i));
            match TableRef::parse(t) {
                Some(r) => {
                    if !seen.insert(r.iceberg_name()) {
                        self.report(p, format!("`{t}` is listed twice (or maps to the same Iceberg table name `{}` as another entry)", r.iceberg_name()));
                    } else {
                        tables.push(r);
                    }
                }
                None => self.report(
                    p,
                    format!(
                        "`{t}` is not a table name: write `name` (schema public) or `schema.name`"
                    ),
                ),
            }
        }
        let mut append_only = Vec::new();
        for (i, t) in pg.append_only.iter().enumerate() {
            let mut p = at("append_only");
            p.push(Segment::Index(i));
            match TableRef::parse(t) {
                Some(r) if tables.contains(&r) => append_only.push(r),
                _ => self.report(p, format!("`{t}` is not one of the source's `tables`")),
            }
        }
        let default_name = format!("skippr_{workspace}_{pipeline}").to_lowercase();
        for (field, value) in [("publication", &pg.publication), ("slot", &pg.slot)] {
            if let Some(v) = value {
                let ok = !v.is_empty()
                    && v.len() <= 63
                    && v.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !ok {
                    self.report(
                        at(field),
                        format!("`{v}` is not a valid {field} name: use at most 63 lower-case letters, digits and `_`"),
                    );
                }
            }
        }
        let parallelism = pg
            .snapshot_parallelism
            .unwrap_or(DEFAULT_SNAPSHOT_PARALLELISM);
        if !(1..=64).contains(&parallelism) {
            self.report(at("snapshot_parallelism"), "must be between 1 and 64");
        }
        let file_mb = pg
            .parquet_target_file_size_mb
            .unwrap_or(DEFAULT_PARQUET_TARGET_FILE_SIZE_MB);
        if !(1..=4096).contains(&file_mb) {
            self.report(
                at("parquet_target_file_size_mb"),
                "must be between 1 and 4096 (MiB)",
            );
        }
        let sslmode = pg.sslmode.unwrap_or_default();
        let sslrootcert = self.source_tls(&at, &pg.host, sslmode, pg.sslrootcert.as_deref(), base);
        if self.problems.len() != before {
            return None;
        }
        Some(PostgresConfig {
            name: source_name.to_string(),
            host: pg.host.clone(),
            port: pg.port(),
            user: pg.user.clone(),
            password: pg.password.clone(),
            database: pg.database.clone(),
            sslmode,
            sslrootcert,
            tables,
            cdc_mode: pg.cdc_mode(),
            publication: pg
                .publication
                .clone()
                .unwrap_or_else(|| default_name.clone()),
            slot: pg.slot.clone().unwrap_or(default_name),
            snapshot_parallelism: parallelism,
            parquet_target_file_size: file_mb * 1024 * 1024,
            append_only,
            peer_timeout: parse_duration(DEFAULT_RECONNECT_PEER_TIMEOUT).unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests;
