//! The pipeline's lock: one `skipprd` process at a time runs a pipeline, so two never stream
//! the same slot or commit the same tables.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use crate::config::Config;
use crate::error::{Context, Error, ErrorKind, Result};

/// An exclusive lock on a pipeline, held for the life of the value.
pub struct PipelineLock {
    _file: File,
}

impl PipelineLock {
    pub fn acquire(config: &Config, pipeline: &str) -> Result<Self> {
        let dir = config.storage_path.join("pipelines");
        std::fs::create_dir_all(&dir).with_context(|| {
            format!(
                "cannot create the state folder {}; check skipprd_el_storage_path and its permissions",
                dir.display()
            )
        })?;
        let path = lock_path(config, pipeline);
        let mut file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {
                // The holder's pid, for `skipprd reload` (read only while the lock is held).
                file.set_len(0)
                    .and_then(|()| file.write_all(std::process::id().to_string().as_bytes()))
                    .and_then(|()| file.flush())
                    .with_context(|| format!("writing the lock file {}", path.display()))?;
                Ok(Self { _file: file })
            }
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(
                ErrorKind::Source,
                format!(
                    "pipeline `{pipeline}` is already running in another skipprd process (lock {}); stop it first",
                    path.display()
                ),
            )),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(Error::from(e)).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

/// The pipeline's lock file, in the state folder.
pub(super) fn lock_path(config: &Config, pipeline: &str) -> PathBuf {
    config
        .storage_path
        .join("pipelines")
        .join(format!("{pipeline}.lock"))
}
