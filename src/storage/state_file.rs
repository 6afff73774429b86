//! One small document of pipeline bookkeeping (the watermark state), in the storage layer:
//! a file in the local state folder (mode `local`, written as before: temporary file, fsync,
//! rename, fsync of the folder), or an object in the S3 state prefix (mode `s3`), written
//! only with conditional puts so that a process that lost its pipeline's lease cannot
//! overwrite what the new holder wrote.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use super::{held, Location, Put, Store, Version};
use crate::error::{Context, Error, Result};

/// Where one state document lives.
#[derive(Debug, Clone)]
pub enum StateFile {
    /// A file on local disk.
    Local(PathBuf),
    /// An object at `key` under an S3 location.
    Object(Arc<StateObject>),
}

/// An S3 state object and the version this process last read or wrote.
#[derive(Debug)]
pub struct StateObject {
    location: Location,
    key: String,
    /// The pipeline whose state it is: while this process holds its lease, what it wrote
    /// last is read from memory (see `held`).
    pipeline: String,
    store: OnceLock<Store>,
    /// `None`: not read yet, or read as absent (the next write creates it).
    version: Mutex<Option<Version>>,
}

impl StateFile {
    /// The document at `key` under `location`.
    pub fn object(location: &Location, key: &str, pipeline: &str) -> Self {
        Self::Object(Arc::new(StateObject {
            location: location.clone(),
            key: key.to_string(),
            pipeline: pipeline.to_string(),
            store: OnceLock::new(),
            version: Mutex::new(None),
        }))
    }

    /// How a person names it.
    pub fn describe(&self) -> String {
        match self {
            Self::Local(p) => p.display().to_string(),
            Self::Object(o) => o.location.join(&o.key).display(),
        }
    }

    /// The local path, in mode `local`.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            Self::Local(p) => Some(p),
            Self::Object(_) => None,
        }
    }

    /// The document's bytes; `None` when it does not exist.
    pub fn read(&self) -> Result<Option<Bytes>> {
        match self {
            Self::Local(path) => match std::fs::read(path) {
                Ok(b) => Ok(Some(Bytes::from(b))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::from(e))
                    .with_context(|| format!("reading the pipeline state {}", path.display())),
            },
            Self::Object(o) => {
                let at = self.describe();
                if let Some(bytes) = held::get(&at, &o.pipeline) {
                    return Ok(bytes);
                }
                let store = o.store()?;
                let got = store.blocking(store.get(&o.key))?;
                let (bytes, version) = match got {
                    Some((b, v)) => (Some(b), Some(v)),
                    None => (None, None),
                };
                *o.version.lock().unwrap_or_else(|e| e.into_inner()) = version;
                held::read(&at, &o.pipeline, bytes.clone());
                Ok(bytes)
            }
        }
    }

    /// Replaces the document durably. On S3 only if it is still as this process last saw
    /// it: otherwise another process writes this pipeline now, and this one must stop.
    pub fn write(&self, bytes: Bytes) -> Result<()> {
        match self {
            Self::Local(path) => write_local(path, &bytes)
                .with_context(|| format!("writing the pipeline state {}", path.display())),
            Self::Object(o) => {
                let store = o.store()?;
                let known = o.version.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let put = match known {
                    Some(v) => store.blocking(store.put_if_version(&o.key, bytes.clone(), v))?,
                    None => store.blocking(store.put_if_absent(&o.key, bytes.clone()))?,
                };
                match put {
                    Put::Written(v) => {
                        *o.version.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
                        held::wrote(&self.describe(), &o.pipeline, Some(bytes));
                        Ok(())
                    }
                    Put::Conflict => Err(Error::fatal(format!(
                        "the pipeline state {} was changed by another process since this one read it: another skipprd writes this pipeline now (it took over the lease), so this one stops without writing",
                        store.describe(&o.key)
                    ))),
                }
            }
        }
    }

    /// Removes the document (a re-snapshot starts from nothing).
    pub fn remove(&self) -> Result<()> {
        match self {
            Self::Local(path) => match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::from(e))
                    .with_context(|| format!("removing the pipeline state {}", path.display())),
            },
            Self::Object(o) => {
                let store = o.store()?;
                store.blocking(store.delete(&o.key))?;
                *o.version.lock().unwrap_or_else(|e| e.into_inner()) = None;
                held::wrote(&self.describe(), &o.pipeline, None);
                Ok(())
            }
        }
    }
}

impl StateObject {
    fn store(&self) -> Result<&Store> {
        if let Some(s) = self.store.get() {
            return Ok(s);
        }
        let opened = Store::open(&self.location, None)?;
        Ok(self.store.get_or_init(|| opened))
    }
}

/// Temporary file, fsync, rename, fsync of the folder: a crash leaves the old document or
/// the new one, never half of one.
fn write_local(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let tmp = path.with_extension("json.tmp");
    std::fs::create_dir_all(dir)?;
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
