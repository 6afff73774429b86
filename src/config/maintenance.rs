//! Validation of `pipelines.<name>.maintenance`: how a pipeline compacts its Iceberg tables,
//! expires their snapshots and removes unreferenced files (the settings and their defaults
//! are defined here, the work is done in sink/iceberg/maintenance.rs); and
//! of `pipelines.<name>.consistent_cuts`, the tagged snapshots expiry keeps (pipeline/cuts.rs).

use std::time::Duration;

use super::{keys, parse_duration, ConsistentCutsDef, MaintenanceDef, Validator};

/// Default `consistent_cuts.every`.
pub const DEFAULT_CUT_EVERY: &str = "1h";
/// Default `consistent_cuts.keep`.
pub const DEFAULT_CUT_KEEP: u64 = 48;
/// The most cuts `consistent_cuts.keep` may ask for.
pub const MAX_CUT_KEEP: u64 = 100_000;
/// The shortest `consistent_cuts.every`: cut names count whole seconds.
pub const MIN_CUT_EVERY: Duration = Duration::from_secs(1);

/// How a pipeline takes consistent cuts (`pipelines.<name>.consistent_cuts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutSettings {
    /// A cut is taken once this long has passed since the last one.
    pub every: Duration,
    /// How many cuts are kept; the tags of older ones are removed.
    pub keep: usize,
}

/// Default `maintenance.check_interval`.
pub const DEFAULT_CHECK_INTERVAL: &str = "1m";
/// Default `maintenance.snapshot_retention`.
pub const DEFAULT_SNAPSHOT_RETENTION: &str = "1h";
/// Default `maintenance.min_snapshots_to_keep`.
pub const DEFAULT_MIN_SNAPSHOTS_TO_KEEP: u64 = 10;
/// Default `maintenance.orphan_file_age`.
pub const DEFAULT_ORPHAN_FILE_AGE: &str = "1h";
/// Default `maintenance.compaction_min_files`.
pub const DEFAULT_COMPACTION_MIN_FILES: u64 = 8;
/// Orphan files are looked for at most this often (or every `orphan_file_age`, if shorter).
const CLEANUP_EVERY: Duration = Duration::from_secs(10 * 60);

/// How a pipeline maintains its tables (`pipelines.<name>.maintenance`).
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceSettings {
    pub enabled: bool,
    /// How often each table is checked, after a commit.
    pub check_interval: Duration,
    /// A snapshot is expired once it was replaced longer ago than this.
    pub snapshot_retention: Duration,
    /// Never fewer snapshots than this.
    pub min_snapshots_to_keep: usize,
    /// Files that no retained snapshot references are removed once older than this.
    pub orphan_file_age: Duration,
    /// A compaction runs once this many small data files, or delete files, gather.
    pub compaction_min_files: usize,
    /// Size of the data files compaction writes; files below 3/4 of it count as small.
    pub target_file_size: u64,
    /// The AWS region of an `s3://` warehouse (for listing it).
    pub region: Option<String>,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            check_interval: Duration::from_secs(60),
            snapshot_retention: Duration::from_secs(3600),
            min_snapshots_to_keep: DEFAULT_MIN_SNAPSHOTS_TO_KEEP as usize,
            orphan_file_age: Duration::from_secs(3600),
            compaction_min_files: DEFAULT_COMPACTION_MIN_FILES as usize,
            target_file_size: 128 * 1024 * 1024,
            region: None,
        }
    }
}

impl MaintenanceSettings {
    /// How often orphan files are looked for.
    pub fn cleanup_every(&self) -> Duration {
        self.orphan_file_age
            .min(CLEANUP_EVERY)
            .max(self.check_interval)
    }
}

impl Validator<'_> {
    /// The settings, or `None` after reporting every value out of range.
    pub(super) fn maintenance(
        &mut self,
        pipeline: &str,
        def: Option<&MaintenanceDef>,
    ) -> Option<MaintenanceSettings> {
        let d = def.cloned().unwrap_or_default();
        let mut ok = true;
        let mut duration = |key: &str, value: Option<&str>, default: &str, min: Duration| {
            let text = value.unwrap_or(default);
            match parse_duration(text) {
                Some(d) if d >= min => Some(d),
                _ => {
                    self.report(
                        keys(&["pipelines", pipeline, "maintenance", key]),
                        format!(
                            "`{text}` is not a duration of at least {}: write e.g. `30s`, `10m` or `2h`",
                            if min < Duration::from_secs(1) {
                                format!("{}ms", min.as_millis())
                            } else {
                                format!("{}s", min.as_secs())
                            }
                        ),
                    );
                    ok = false;
                    None
                }
            }
        };
        let check_interval = duration(
            "check_interval",
            d.check_interval.as_deref(),
            DEFAULT_CHECK_INTERVAL,
            Duration::from_millis(100),
        );
        let snapshot_retention = duration(
            "snapshot_retention",
            d.snapshot_retention.as_deref(),
            DEFAULT_SNAPSHOT_RETENTION,
            Duration::from_secs(1),
        );
        let orphan_file_age = duration(
            "orphan_file_age",
            d.orphan_file_age.as_deref(),
            DEFAULT_ORPHAN_FILE_AGE,
            Duration::from_secs(1),
        );
        let mut count = |key: &str, value: Option<u64>, default: u64, min: u64| {
            let v = value.unwrap_or(default);
            if v < min || v > 1_000_000 {
                self.report(
                    keys(&["pipelines", pipeline, "maintenance", key]),
                    format!("must be between {min} and 1000000 (default {default})"),
                );
                ok = false;
            }
            v as usize
        };
        let min_snapshots_to_keep = count(
            "min_snapshots_to_keep",
            d.min_snapshots_to_keep,
            DEFAULT_MIN_SNAPSHOTS_TO_KEEP,
            1,
        );
        let compaction_min_files = count(
            "compaction_min_files",
            d.compaction_min_files,
            DEFAULT_COMPACTION_MIN_FILES,
            2,
        );
        if !ok {
            return None;
        }
        Some(MaintenanceSettings {
            enabled: d.enabled.unwrap_or(true),
            check_interval: check_interval?,
            snapshot_retention: snapshot_retention?,
            min_snapshots_to_keep,
            orphan_file_age: orphan_file_age?,
            compaction_min_files,
            ..MaintenanceSettings::default()
        })
    }

    /// The cut settings (`None` inside when the pipeline takes no cuts), or `None` after
    /// reporting every value out of range.
    pub(super) fn consistent_cuts(
        &mut self,
        pipeline: &str,
        def: Option<&ConsistentCutsDef>,
    ) -> Option<Option<CutSettings>> {
        let Some(d) = def else {
            return Some(None);
        };
        let text = d.every.as_deref().unwrap_or(DEFAULT_CUT_EVERY);
        let every = match parse_duration(text) {
            Some(e) if e >= MIN_CUT_EVERY => Some(e),
            _ => {
                self.report(
                    keys(&["pipelines", pipeline, "consistent_cuts", "every"]),
                    format!(
                        "`{text}` is not a duration of at least 1s (a cut is named after its UTC time to the second): write e.g. `10s`, `15m`, `1h` or `1d`"
                    ),
                );
                None
            }
        };
        let keep = d.keep.unwrap_or(DEFAULT_CUT_KEEP);
        let keep = if (1..=MAX_CUT_KEEP).contains(&keep) {
            Some(keep as usize)
        } else {
            self.report(
                keys(&["pipelines", pipeline, "consistent_cuts", "keep"]),
                format!(
                    "`{keep}` cuts cannot be kept: write the number of cuts to keep, between 1 and {MAX_CUT_KEEP} (default {DEFAULT_CUT_KEEP})"
                ),
            );
            None
        };
        Some(Some(CutSettings {
            every: every?,
            keep: keep?,
        }))
    }
}
