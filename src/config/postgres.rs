//! Config, a Postgres data source: host and port, the tables to copy (and which are
//! append-only), publication and slot names, snapshot settings and TLS, checked and resolved
//! into a [`PostgresConfig`].

use std::collections::BTreeSet;
use std::path::Path;

use super::locate::Segment;
use super::{
    keys, parse_bytes, parse_duration, PostgresConfig, PostgresSource, TableRef, Validator,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_RETAINED_WAL, DEFAULT_PARQUET_TARGET_FILE_SIZE_MB,
    DEFAULT_RECONNECT_PEER_TIMEOUT, DEFAULT_SNAPSHOT_CHUNK_ROWS, DEFAULT_SNAPSHOT_PARALLELISM,
};

/// `heartbeat_interval` as written: a duration (`30s`, `1m`), or `0` for no heartbeat. The
/// error is the message `validate` and `connect` give.
pub fn parse_heartbeat_interval(text: &str) -> Result<std::time::Duration, String> {
    if text.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    parse_duration(text).ok_or_else(|| {
        format!("`{text}` is not a duration: write e.g. `30s`, `1m` or `0` (no heartbeat)")
    })
}

/// `max_retained_wal` as written: a size above zero (`10GiB`, `512MB`), in bytes. The error is
/// the message `validate` and `connect` give.
pub fn parse_max_retained_wal(text: &str) -> Result<u64, String> {
    parse_bytes(text)
        .filter(|b| *b > 0)
        .map(|b| b as u64)
        .ok_or_else(|| format!("`{text}` is not a size: write e.g. `10GiB` or `512MB`"))
}

impl Validator<'_> {
    pub(super) fn postgres(
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
        let chunk_rows = pg
            .snapshot_chunk_rows
            .unwrap_or(DEFAULT_SNAPSHOT_CHUNK_ROWS);
        if !(1_000..=100_000_000).contains(&chunk_rows) {
            self.report(
                at("snapshot_chunk_rows"),
                "must be between 1000 and 100000000 (rows)",
            );
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
        let heartbeat = pg
            .heartbeat_interval
            .as_deref()
            .unwrap_or(DEFAULT_HEARTBEAT_INTERVAL);
        let heartbeat_interval = parse_heartbeat_interval(heartbeat);
        if let Err(msg) = &heartbeat_interval {
            self.report(at("heartbeat_interval"), msg.clone());
        }
        let retained = pg
            .max_retained_wal
            .as_deref()
            .unwrap_or(DEFAULT_MAX_RETAINED_WAL);
        let max_retained_wal = parse_max_retained_wal(retained);
        if let Err(msg) = &max_retained_wal {
            self.report(at("max_retained_wal"), msg.clone());
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
            publication_named: pg.publication.is_some(),
            slot: pg.slot.clone().unwrap_or(default_name),
            snapshot_parallelism: parallelism,
            snapshot_chunk_rows: chunk_rows,
            parquet_target_file_size: file_mb * 1024 * 1024,
            append_only,
            peer_timeout: parse_duration(DEFAULT_RECONNECT_PEER_TIMEOUT).unwrap_or_default(),
            heartbeat_interval: heartbeat_interval.unwrap_or_default(),
            max_retained_wal: max_retained_wal.unwrap_or_default(),
            failover_slot: pg.failover_slot.unwrap_or(false),
            exclude_columns: Default::default(),
        })
    }
}
