//! Reloading a running pipeline: SIGHUP (sent by `skipprd reload`, or by `sync --add-table`
//! and `sync --resnapshot --table` when a daemon runs the pipeline) reads `skippr.yml` again
//! and hands the new configuration to every running pipeline and to the gateway; the
//! requests for one table's new copy wait in a small file beside the pipeline's lock.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use crate::config::{Config, PipelineConfig, TableRef};
use crate::error::{Context, Error, Result};

/// The configuration read at the last SIGHUP, for everything that follows it.
fn channel() -> &'static watch::Sender<Option<Arc<Config>>> {
    static RELOADS: OnceLock<watch::Sender<Option<Arc<Config>>>> = OnceLock::new();
    RELOADS.get_or_init(|| watch::channel(None).0)
}

/// A receiver of the configurations SIGHUP reads (none until the first).
pub fn reloads() -> watch::Receiver<Option<Arc<Config>>> {
    channel().subscribe()
}

/// Publishes a configuration read again (what SIGHUP does; tests call it directly).
pub fn publish(config: Config) {
    channel().send_replace(Some(Arc::new(config)));
}

/// Reads `file` again on every SIGHUP and publishes it; a file that does not load is
/// reported and changes nothing (the pipelines go on with what they run).
pub fn trap_reload(file: PathBuf) {
    // Listening starts here, before any lock records this process for `reload`.
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP: `skipprd reload` has no effect on this process");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match Config::load(&file) {
                Ok(config) => {
                    tracing::info!(config = %file.display(), "reload: skippr.yml read again");
                    publish(config);
                }
                Err(e) => tracing::error!(
                    config = %file.display(),
                    error = %e,
                    "reload refused: skippr.yml does not load; still running with the configuration read before"
                ),
            }
        }
    });
}

/// Stops the stream of `running` (through `stop`) when a reload changes its tables or a
/// table's new copy is asked for; a reload that cannot apply is reported and ignored.
pub async fn watch(
    config: Config,
    running: PipelineConfig,
    mut reloads: watch::Receiver<Option<Arc<Config>>>,
    stop: Arc<watch::Sender<bool>>,
) {
    while reloads.changed().await.is_ok() {
        let Some(new) = reloads.borrow().clone() else {
            continue;
        };
        let asked = match Requests::of(&config, &running.name).tables() {
            Ok(t) => !t.is_empty(),
            Err(e) => {
                tracing::error!(pipeline = %running.name, error = %e.report(), "reload: cannot read the tables asked to be copied again");
                false
            }
        };
        match reconfigured(&running, &new) {
            Ok(changed) if changed.is_some() || asked => {
                tracing::info!(pipeline = %running.name, "reload: stopping the stream to take the new tables");
                let _ = stop.send(true);
                return;
            }
            Ok(_) => {
                tracing::info!(pipeline = %running.name, "reload: nothing changed for this pipeline")
            }
            Err(e) => {
                tracing::error!(pipeline = %running.name, error = %e.report(), "reload refused")
            }
        }
    }
}

/// The pipeline configuration the last reload brings, when it changes `running`.
pub fn take(
    reloads: &mut watch::Receiver<Option<Arc<Config>>>,
    running: &PipelineConfig,
) -> Option<PipelineConfig> {
    let new = reloads.borrow_and_update().clone()?;
    reconfigured(running, &new).ok().flatten()
}

/// What a reload changes in a running pipeline: `None` when nothing it can apply changed.
/// Settings a running stream cannot take (the source's connection, the slot, the sink) are
/// refused with the restart they need.
pub fn reconfigured(running: &PipelineConfig, new: &Config) -> Result<Option<PipelineConfig>> {
    let Some(p) = new.pipelines.iter().find(|p| p.name == running.name) else {
        return Err(Error::config(format!(
            "pipeline `{}` is no longer in skippr.yml; stop it (SIGTERM) to stop following its tables",
            running.name
        )));
    };
    let mut same = p.clone();
    same.source.tables = running.source.tables.clone();
    same.source.exclude_columns = running.source.exclude_columns.clone();
    same.source.append_only = running.source.append_only.clone();
    same.layouts = running.layouts.clone();
    same.layout_origins = running.layout_origins.clone();
    same.changelogs = running.changelogs.clone();
    let debug = |p: &PipelineConfig| {
        format!(
            "{:?} {:?} {:?} {} {} {:?} {:?} {:?} {} {}",
            p.source,
            p.sink,
            p.commit_interval,
            p.transaction_memory_budget,
            p.key_index_memory_budget,
            p.maintenance,
            p.consistent_cuts,
            p.schema_sink,
            p.key_index_dir.display(),
            p.state_file.describe()
        )
    };
    if debug(&same) != debug(running) {
        return Err(Error::config(format!(
            "pipeline `{}`: only its tables (`tables:` and their settings) change on reload; restart skipprd to apply changes to its source, sink, storage, commit interval, maintenance or cuts",
            running.name
        )));
    }
    let changed = p.source.tables != running.source.tables
        || p.source.exclude_columns != running.source.exclude_columns
        || p.source.append_only != running.source.append_only
        || p.layouts != running.layouts
        || p.changelogs != running.changelogs;
    Ok(changed.then(|| p.clone()))
}

/// The tables `sync --resnapshot --table` asked to copy again, kept beside the pipeline's
/// lock until their copies commit: a daemon reads them at SIGHUP, a `sync` at its start.
pub struct Requests {
    path: PathBuf,
}

impl Requests {
    pub fn of(config: &Config, pipeline: &str) -> Self {
        Self {
            path: config
                .storage_path
                .join("pipelines")
                .join(format!("{pipeline}.resnapshot.json")),
        }
    }

    /// The tables asked for, by `schema.name`.
    pub fn tables(&self) -> Result<BTreeSet<String>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::config(format!(
                    "{} is damaged ({e}); remove it and ask for the copies again with `skipprd sync --resnapshot --table`",
                    self.path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
            Err(e) => Err(Error::from(e)).with_context(|| format!("reading {}", self.path.display())),
        }
    }

    /// Adds `tables` to what is asked for.
    pub fn ask(&self, tables: &[TableRef]) -> Result<()> {
        let mut all = self.tables()?;
        all.extend(tables.iter().map(|t| t.to_string()));
        self.write(&all)
    }

    /// Removes `done` (copied and committed) from what is asked for.
    pub fn done(&self, done: &[String]) -> Result<()> {
        let mut all = self.tables()?;
        let before = all.len();
        all.retain(|t| !done.contains(t));
        if all.len() == before {
            return Ok(());
        }
        if all.is_empty() {
            return match std::fs::remove_file(&self.path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => {
                    Err(Error::from(e)).with_context(|| format!("removing {}", self.path.display()))
                }
            };
        }
        self.write(&all)
    }

    fn write(&self, all: &BTreeSet<String>) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the state folder {}", dir.display()))?;
        }
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(all)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Checks, before `sync --add-table` writes skippr.yml, that the source can describe each
/// table (it exists, its key and columns are readable).
pub async fn check_can_add(p: &PipelineConfig, tables: &[String]) -> Result<()> {
    let client = crate::source::postgres::connect::connect(&p.source).await?;
    for given in tables {
        let t = TableRef::parse(given).ok_or_else(|| {
            Error::config(format!(
                "--add-table: `{given}` is not a table name: write `name` or `schema.name`"
            ))
        })?;
        crate::source::postgres::schema::describe_followed(&client, p, &t).await?;
    }
    Ok(())
}

/// The process that runs `pipeline` now, if one does (its lock is held): its pid, as the
/// lock file records it.
pub fn running_pid(config: &Config, pipeline: &str) -> Result<Option<u32>> {
    let path = super::lock::lock_path(config, pipeline);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::from(e)).with_context(|| format!("opening {}", path.display()))
        }
    };
    match file.try_lock_shared() {
        Ok(()) => return Ok(None),
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Error::from(e)).with_context(|| format!("checking {}", path.display()))
        }
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.trim().parse::<u32>().map(Some).map_err(|_| {
        Error::config(format!(
            "pipeline `{pipeline}` is running, but its lock {} does not name the process (a skipprd older than `reload`); restart it, or send it SIGHUP yourself",
            path.display()
        ))
    })
}

/// Sends SIGHUP to the process that runs `pipeline`; its pid, or `None` when none runs it.
pub fn signal_running(config: &Config, pipeline: &str) -> Result<Option<u32>> {
    let Some(pid) = running_pid(config, pipeline)? else {
        return Ok(None);
    };
    let Ok(target) = i32::try_from(pid) else {
        return Err(Error::fatal(format!("process id {pid} is out of range")));
    };
    // SAFETY: kill(2) with a pid read from the lock file and a valid signal number; it
    // touches no memory of this process.
    let rc = unsafe { libc::kill(target, libc::SIGHUP) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::config(format!(
            "cannot signal skipprd process {pid}, which runs pipeline `{pipeline}` ({e}); run this command as the same user"
        )));
    }
    Ok(Some(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_kept_until_done() {
        let dir = tempfile::tempdir().unwrap();
        let r = Requests {
            path: dir.path().join("pipelines").join("app.resnapshot.json"),
        };
        assert!(r.tables().unwrap().is_empty());
        let t = |n: &str| TableRef {
            schema: "public".into(),
            name: n.into(),
        };
        r.ask(&[t("a"), t("b")]).unwrap();
        r.ask(&[t("a")]).unwrap();
        assert_eq!(r.tables().unwrap().len(), 2);
        r.done(&["public.a".into()]).unwrap();
        assert_eq!(
            r.tables().unwrap().into_iter().collect::<Vec<_>>(),
            vec!["public.b".to_string()]
        );
        r.done(&["public.b".into()]).unwrap();
        assert!(!r.path.exists());
        std::fs::create_dir_all(r.path.parent().unwrap()).unwrap();
        std::fs::write(&r.path, "{").unwrap();
        assert!(r.tables().unwrap_err().message().contains("remove it"));
    }
}
