//! Where a pipeline's WAL lives (a folder under the state path, or objects under the S3
//! prefix), for the pipeline that writes it and for the readers (`query`, `serve`) that must
//! not disturb it.

use std::path::{Path, PathBuf};

use super::WalStore;
use crate::error::Result;
use crate::storage::{Location, Store};

/// The WAL folder (or key prefix) of pipeline `name` under the state location.
fn prefix(name: &str) -> String {
    format!("wal/{name}")
}

impl WalStore {
    /// The WAL of pipeline `name`, opened for writing (a local folder is created and cleaned
    /// of what a crash left). `storage_path` is the local state folder, `storage` where the
    /// state lives (the same folder, or S3).
    pub fn for_pipeline(storage: &Location, storage_path: &Path, name: &str) -> Result<Self> {
        match storage {
            Location::Local(_) => Self::open(&storage_path.join("wal").join(name)),
            s3 => Ok(Self::on_objects(Store::open(s3, None)?, &prefix(name)).with_role(name, true)),
        }
    }
}

/// Where a reader (`query`, `serve`) finds a pipeline's WAL without disturbing its writer.
#[derive(Debug, Clone)]
pub enum WalReader {
    /// A local folder, which may not exist until the first segment is written.
    Dir(PathBuf),
    /// Objects under a prefix (S3 mode).
    Objects(WalStore),
}

impl WalReader {
    /// The WAL of pipeline `name`, for reading only (see [`WalStore::for_pipeline`]).
    pub fn for_pipeline(storage: &Location, storage_path: &Path, name: &str) -> Result<Self> {
        Ok(match storage {
            Location::Local(_) => Self::Dir(storage_path.join("wal").join(name)),
            s3 => Self::Objects(
                WalStore::on_objects(Store::open(s3, None)?, &prefix(name)).with_role(name, false),
            ),
        })
    }

    /// The store, once there is one to read (`None` while a local folder does not exist).
    pub fn open(&self) -> Option<WalStore> {
        match self {
            Self::Dir(dir) => WalStore::reader(dir),
            Self::Objects(store) => Some(store.clone()),
        }
    }
}
