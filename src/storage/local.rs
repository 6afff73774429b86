//! The local-disk side of the storage layer: objects are files under a folder, written to a
//! temporary name, fsynced, then linked or renamed into place with the folder fsynced too.

use std::fs::{self, File};
use std::io::{ErrorKind as IoKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use object_store::PutMode;

use super::{Entry, Put, Version};
use crate::error::{Context, Error, Result};

/// A temporary name beside `path`, unique in this process and across processes, ending in
/// `.tmp` so that a reader skips it and the WAL removes it after a crash.
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}.{}-{n}.tmp", std::process::id()))
}

/// The version of a file: its identity, modification time and size, as object_store's
/// local store derives its ETag. A rewrite (always a new file, renamed in) changes it.
fn version_of(meta: &fs::Metadata) -> Version {
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(meta);
    #[cfg(not(unix))]
    let ino = 0u64;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    Version {
        e_tag: Some(format!("{ino:x}-{mtime:x}-{:x}", meta.len())),
        version: None,
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn write_temp(path: &Path, data: &[u8]) -> std::io::Result<PathBuf> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let tmp = temp_path(path);
    let mut f = File::create(&tmp)?;
    let written = f.write_all(data).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// Writes `data` at `path` under `mode`: durable before it returns `Written`.
pub(super) fn put(path: &Path, data: &Bytes, mode: PutMode) -> Result<Put> {
    let what = || format!("writing {}", path.display());
    let parent = path.parent().unwrap_or(Path::new("."));
    match mode {
        PutMode::Overwrite => {
            let tmp = write_temp(path, data).with_context(what)?;
            fs::rename(&tmp, path)
                .and_then(|()| sync_dir(parent))
                .with_context(what)?;
        }
        PutMode::Create => {
            let tmp = write_temp(path, data).with_context(what)?;
            // A hard link fails when the name exists: the create-only step is atomic.
            let linked = fs::hard_link(&tmp, path);
            let _ = fs::remove_file(&tmp);
            match linked {
                Err(e) if e.kind() == IoKind::AlreadyExists => return Ok(Put::Conflict),
                other => other.and_then(|()| sync_dir(parent)).with_context(what)?,
            }
        }
        PutMode::Update(expected) => {
            // Writers of one object serialize on a lock file beside it; the check and the
            // rename happen while it is held.
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).with_context(what)?;
            }
            let lock_path = path.with_file_name(format!(
                "{}.lock",
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ));
            let lock = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .with_context(what)?;
            lock.lock().with_context(what)?;
            let current = match fs::metadata(path) {
                Ok(m) => Some(version_of(&m)),
                Err(e) if e.kind() == IoKind::NotFound => None,
                Err(e) => return Err(Error::from(e)).with_context(what),
            };
            if current.and_then(|v| v.e_tag) != expected.e_tag {
                return Ok(Put::Conflict);
            }
            let tmp = write_temp(path, data).with_context(what)?;
            fs::rename(&tmp, path)
                .and_then(|()| sync_dir(parent))
                .with_context(what)?;
        }
    }
    let meta = fs::metadata(path).with_context(what)?;
    Ok(Put::Written(version_of(&meta)))
}

pub(super) fn get(path: &Path) -> Result<Option<(Bytes, Version)>> {
    let what = || format!("reading {}", path.display());
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::from(e)).with_context(what),
    };
    // The version comes from the open file, so it belongs to the bytes read.
    let meta = file.metadata().with_context(what)?;
    let mut data = Vec::with_capacity(meta.len() as usize);
    std::io::Read::read_to_end(&mut &file, &mut data).with_context(what)?;
    Ok(Some((Bytes::from(data), version_of(&meta))))
}

pub(super) fn get_range(path: &Path, range: std::ops::Range<u64>) -> Result<Bytes> {
    use std::io::{Read, Seek, SeekFrom};
    let what = || format!("reading {}", path.display());
    let mut file = File::open(path).with_context(what)?;
    file.seek(SeekFrom::Start(range.start)).with_context(what)?;
    let mut data = vec![0u8; range.end.saturating_sub(range.start) as usize];
    file.read_exact(&mut data).with_context(what)?;
    Ok(Bytes::from(data))
}

/// Every file under `root/prefix`, recursively, keys relative to `root`; temporary and
/// lock files are left out.
pub(super) fn list(root: &Path, prefix: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut todo = vec![root.join(prefix)];
    while let Some(dir) = todo.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == IoKind::NotFound => continue,
            Err(e) => {
                return Err(Error::from(e)).with_context(|| format!("listing {}", dir.display()))
            }
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let path = entry.path();
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Removed between the listing and the stat: no longer there.
                Err(e) if e.kind() == IoKind::NotFound => continue,
                Err(e) => {
                    return Err(Error::from(e))
                        .with_context(|| format!("listing {}", path.display()))
                }
            };
            if meta.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().is_some_and(|e| e == "tmp" || e == "lock") {
                continue;
            }
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let key = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push(Entry {
                key,
                size: meta.len(),
                modified: meta.modified().ok(),
            });
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

pub(super) fn delete(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == IoKind::NotFound => Ok(()),
        Err(e) => Err(Error::from(e)).with_context(|| format!("removing {}", path.display())),
    }
}
