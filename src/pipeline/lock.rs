//! The pipeline's lock: one `skipprd` process at a time runs a pipeline, so two never stream
//! the same slot or commit the same tables.

use std::fs::File;

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
        let path = dir.join(format!("{pipeline}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
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
