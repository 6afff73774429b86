//! Object storage, below the WAL, the pipeline state and the warehouse: one small API
//! (durable put, conditional put, get, list, delete) over a local folder or an S3 bucket.
//!
//! "Durable" means: on disk, the bytes and the folder entry are fsynced before `put`
//! returns; on S3, the PUT has returned (S3 acknowledges a PUT only once it is stored
//! redundantly). Conditional puts are the building block for objects that must never be
//! overwritten (create-only) and for pointer swaps (update only if the version read is
//! still the current one).

pub mod aws;
pub mod aws_json;
pub mod held;
pub mod iceberg_io;
pub mod lease;
mod local;
pub mod state_file;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::error::{Context, Error, ErrorKind, Result};

/// Where a store keeps its objects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A folder on the local file system.
    Local(PathBuf),
    /// `s3://bucket/prefix` (the prefix without leading or trailing `/`, possibly empty).
    S3 { bucket: String, prefix: String },
}

impl Location {
    /// Parses `s3://bucket[/prefix]`, naming what is wrong otherwise.
    pub fn parse_s3(url: &str) -> std::result::Result<Self, String> {
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(format!(
                "`{url}` is not an S3 location: write it as s3://bucket/prefix"
            ));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if !valid_bucket(bucket) {
            return Err(format!(
                "`{bucket}` in `{url}` is not a valid S3 bucket name: 3-63 lowercase letters, digits, `.` and `-`, starting and ending with a letter or digit"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
            && !prefix.is_empty()
        {
            return Err(format!(
                "`{url}` has an empty, `.` or `..` path segment; write the prefix as s3://{bucket}/a/b"
            ));
        }
        Ok(Self::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The location of `sub` (a `/`-separated relative path) inside this one.
    pub fn join(&self, sub: &str) -> Self {
        let sub = sub.trim_matches('/');
        match self {
            Self::Local(dir) => Self::Local(dir.join(sub)),
            Self::S3 { bucket, prefix } => Self::S3 {
                bucket: bucket.clone(),
                prefix: join_key(prefix, sub),
            },
        }
    }

    /// How a person (or an Iceberg reader) names it: a folder path or `s3://bucket/prefix`.
    pub fn display(&self) -> String {
        match self {
            Self::Local(dir) => dir.display().to_string(),
            Self::S3 { bucket, prefix } if prefix.is_empty() => format!("s3://{bucket}"),
            Self::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
        }
    }
}

fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && b.bytes().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.bytes().last().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// `a/b` joined with `c` as `a/b/c` (either may be empty).
pub fn join_key(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// The version of an object as read, for a later conditional update.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Version {
    pub e_tag: Option<String>,
    pub version: Option<String>,
}

impl From<Version> for UpdateVersion {
    fn from(v: Version) -> Self {
        UpdateVersion {
            e_tag: v.e_tag,
            version: v.version,
        }
    }
}

/// The outcome of a conditional put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// Written (durably); the new version.
    Written(Version),
    /// Not written: the object exists (create-only) or changed since it was read (update).
    Conflict,
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its key relative to the store's root, `/`-separated.
    pub key: String,
    pub size: u64,
    /// When it was last written, where the store says.
    pub modified: Option<std::time::SystemTime>,
}

/// Objects under one root: a local folder or an S3 prefix.
#[derive(Debug, Clone)]
pub struct Store {
    location: Location,
    backend: Backend,
}

#[derive(Debug, Clone)]
enum Backend {
    Local(PathBuf),
    S3 {
        store: Arc<object_store::aws::AmazonS3>,
        prefix: String,
    },
}

impl Store {
    /// A store rooted at `location`. Nothing is read or written yet; S3 credentials come
    /// from the standard AWS chain (see [`aws`]).
    pub fn open(location: &Location, region: Option<&str>) -> Result<Self> {
        Self::open_with(location, region, &aws::S3Settings::default())
    }

    /// Like [`Store::open`], with the S3 settings a catalog gives for its tables.
    pub fn open_with(
        location: &Location,
        region: Option<&str>,
        settings: &aws::S3Settings,
    ) -> Result<Self> {
        let backend = match location {
            Location::Local(dir) => Backend::Local(dir.clone()),
            Location::S3 { bucket, prefix } => Backend::S3 {
                store: Arc::new(aws::s3_store_with(bucket, region, settings)?),
                prefix: prefix.clone(),
            },
        };
        Ok(Self {
            location: location.clone(),
            backend,
        })
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The S3 client, when the store is on S3 (its credentials also sign Glue requests).
    pub fn s3(&self) -> Option<&Arc<object_store::aws::AmazonS3>> {
        match &self.backend {
            Backend::S3 { store, .. } => Some(store),
            Backend::Local(_) => None,
        }
    }

    /// How a person names `key`: a file path or an `s3://` URL.
    pub fn describe(&self, key: &str) -> String {
        self.location.join(key).display()
    }

    fn object_path(prefix: &str, key: &str) -> object_store::path::Path {
        object_store::path::Path::from(join_key(prefix, key))
    }

    /// What an S3 operation on `key` moves into its task: the client, the object's path and
    /// how a person names it.
    fn s3_target(
        &self,
        store: &Arc<object_store::aws::AmazonS3>,
        prefix: &str,
        key: &str,
    ) -> (
        Arc<object_store::aws::AmazonS3>,
        object_store::path::Path,
        String,
    ) {
        (
            store.clone(),
            Self::object_path(prefix, key),
            self.describe(key),
        )
    }

    /// Writes `bytes` at `key`, replacing what was there, durably.
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<Version> {
        match self.conditional(key, bytes, PutMode::Overwrite).await? {
            Put::Written(v) => Ok(v),
            Put::Conflict => Err(Error::fatal(format!(
                "writing {} was refused as a conflict although no condition was set",
                self.describe(key)
            ))),
        }
    }

    /// Writes `bytes` at `key` only if no object is there yet.
    pub async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<Put> {
        self.conditional(key, bytes, PutMode::Create).await
    }

    /// Replaces the object at `key` only if it is still at `version`.
    pub async fn put_if_version(&self, key: &str, bytes: Bytes, version: Version) -> Result<Put> {
        self.conditional(key, bytes, PutMode::Update(version.into()))
            .await
    }

    async fn conditional(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<Put> {
        match &self.backend {
            Backend::Local(dir) => local::put(&dir.join(key), &bytes, mode),
            Backend::S3 { store, prefix } => {
                let (store, path, what) = self.s3_target(store, prefix, key);
                on_io(async move {
                    let opts = PutOptions::from(mode);
                    match store.put_opts(&path, PutPayload::from(bytes), opts).await {
                        Ok(r) => Ok(Put::Written(Version {
                            e_tag: r.e_tag,
                            version: r.version,
                        })),
                        Err(object_store::Error::AlreadyExists { .. })
                        | Err(object_store::Error::Precondition { .. }) => Ok(Put::Conflict),
                        Err(e) => Err(s3_error(e, "writing", &what)),
                    }
                })
                .await
            }
        }
    }

    /// The object at `key` and its version, or `None` when there is none.
    pub async fn get(&self, key: &str) -> Result<Option<(Bytes, Version)>> {
        match &self.backend {
            Backend::Local(dir) => local::get(&dir.join(key)),
            Backend::S3 { store, prefix } => {
                let (store, path, what) = self.s3_target(store, prefix, key);
                on_io(async move {
                    let got = match store.get(&path).await {
                        Ok(got) => got,
                        Err(object_store::Error::NotFound { .. }) => return Ok(None),
                        Err(e) => return Err(s3_error(e, "reading", &what)),
                    };
                    let version = Version {
                        e_tag: got.meta.e_tag.clone(),
                        version: got.meta.version.clone(),
                    };
                    let bytes = got
                        .bytes()
                        .await
                        .map_err(|e| s3_error(e, "reading", &what))?;
                    Ok(Some((bytes, version)))
                })
                .await
            }
        }
    }

    /// The size of the object at `key`, or `None` when there is none.
    pub async fn size(&self, key: &str) -> Result<Option<u64>> {
        match &self.backend {
            Backend::Local(dir) => match std::fs::metadata(dir.join(key)) {
                Ok(m) => Ok(Some(m.len())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => {
                    Err(Error::from(e)).with_context(|| format!("reading {}", self.describe(key)))
                }
            },
            Backend::S3 { store, prefix } => {
                let (store, path, what) = self.s3_target(store, prefix, key);
                on_io(async move {
                    match store.head(&path).await {
                        Ok(m) => Ok(Some(m.size)),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(s3_error(e, "reading", &what)),
                    }
                })
                .await
            }
        }
    }

    /// Bytes `range` of the object at `key`.
    pub async fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        match &self.backend {
            Backend::Local(dir) => local::get_range(&dir.join(key), range),
            Backend::S3 { store, prefix } => {
                let (store, path, what) = self.s3_target(store, prefix, key);
                on_io(async move {
                    store
                        .get_range(&path, range)
                        .await
                        .map_err(|e| s3_error(e, "reading", &what))
                })
                .await
            }
        }
    }

    /// Every object under `prefix` (a folder-like key, may be empty), in key order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<Entry>> {
        match &self.backend {
            Backend::Local(dir) => local::list(dir, prefix),
            Backend::S3 {
                store,
                prefix: root,
            } => {
                use futures::TryStreamExt;
                let (store, what) = (store.clone(), self.describe(prefix));
                let root = root.clone();
                let under = Self::object_path(&root, prefix);
                on_io(async move {
                    let metas: Vec<_> = store
                        .list(Some(&under))
                        .try_collect()
                        .await
                        .map_err(|e| s3_error(e, "listing", &what))?;
                    let strip = if root.is_empty() {
                        String::new()
                    } else {
                        format!("{root}/")
                    };
                    let mut out: Vec<Entry> = metas
                        .into_iter()
                        .filter_map(|m| {
                            let key = m.location.as_ref().strip_prefix(strip.as_str())?;
                            Some(Entry {
                                key: key.to_string(),
                                size: m.size,
                                modified: Some(m.last_modified.into()),
                            })
                        })
                        .collect();
                    out.sort_by(|a, b| a.key.cmp(&b.key));
                    Ok(out)
                })
                .await
            }
        }
    }

    /// Writes the file at `path` to `key`, replacing what was there, durably, without holding
    /// it in memory: a large file goes up as a multipart upload, which S3 makes visible only
    /// when it completes (whole or not at all).
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        /// Files up to this size take one PUT; larger ones are sent in parts of this size
        /// (S3's smallest part).
        const PART: u64 = 5 * 1024 * 1024;
        /// How much of the file is read at a time.
        const READ: usize = 1024 * 1024;
        let size = std::fs::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        let Backend::S3 { store, prefix } = &self.backend else {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            self.put(key, Bytes::from(bytes)).await?;
            return Ok(());
        };
        if size <= PART {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            self.put(key, Bytes::from(bytes)).await?;
            return Ok(());
        }
        let (store, target, what) = self.s3_target(store, prefix, key);
        let source = path.to_path_buf();
        on_io(async move {
            use std::io::Read;
            let upload = store
                .put_multipart(&target)
                .await
                .map_err(|e| s3_error(e, "writing", &what))?;
            let mut writer =
                object_store::WriteMultipart::new_with_chunk_size(upload, PART as usize);
            let sent = async {
                let mut file = std::fs::File::open(&source)
                    .with_context(|| format!("reading {}", source.display()))?;
                let mut buf = vec![0u8; READ];
                loop {
                    let n = file
                        .read(&mut buf)
                        .with_context(|| format!("reading {}", source.display()))?;
                    if n == 0 {
                        break;
                    }
                    // At most two parts in flight: memory stays a few parts whatever the size.
                    writer
                        .wait_for_capacity(2)
                        .await
                        .map_err(|e| s3_error(e, "writing", &what))?;
                    writer.write(&buf[..n]);
                }
                Ok::<_, Error>(())
            }
            .await;
            match sent {
                Ok(()) => {
                    writer
                        .finish()
                        .await
                        .map_err(|e| s3_error(e, "writing", &what))?;
                    Ok(())
                }
                Err(e) => {
                    let _ = writer.abort().await;
                    Err(e)
                }
            }
        })
        .await
    }

    /// Copies the object at `from` to `to` (replacing what was there), durably; on S3 the copy
    /// is made by the service, so the bytes never pass through this process.
    pub async fn copy(&self, from: &str, to: &str) -> Result<()> {
        match &self.backend {
            Backend::Local(dir) => {
                let data = std::fs::read(dir.join(from))
                    .with_context(|| format!("reading {}", self.describe(from)))?;
                local::put(&dir.join(to), &Bytes::from(data), PutMode::Overwrite).map(|_| ())
            }
            Backend::S3 { store, prefix } => {
                let (store, src, what) = self.s3_target(store, prefix, from);
                let dst = Self::object_path(prefix, to);
                on_io(async move {
                    store
                        .copy(&src, &dst)
                        .await
                        .map_err(|e| s3_error(e, "copying", &what))
                })
                .await
            }
        }
    }

    /// Removes the object at `key`; a missing object is not an error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match &self.backend {
            Backend::Local(dir) => local::delete(&dir.join(key)),
            Backend::S3 { store, prefix } => {
                let (store, path, what) = self.s3_target(store, prefix, key);
                on_io(async move {
                    match store.delete(&path).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(s3_error(e, "removing", &what)),
                    }
                })
                .await
            }
        }
    }

    /// Runs one of this store's operations from synchronous code (the WAL's API is
    /// synchronous). Local operations run inline, exactly as blocking file calls would;
    /// S3 operations run on the storage runtime while this thread waits.
    pub fn blocking<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        futures::executor::block_on(fut)
    }

    /// The local folder, when the store is on local disk.
    pub fn local_dir(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Local(dir) => Some(dir),
            Backend::S3 { .. } => None,
        }
    }
}

/// Runs S3 work on one process-wide runtime. The HTTP client's pooled connections belong
/// to the runtime that opened them, so every request goes through the same one: this
/// lets synchronous callers (the WAL) and any async runtime share a store safely.
pub(crate) async fn on_io<T: Send + 'static>(
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    static IO: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    let rt = IO
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("skippr-storage")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::fatal(format!("cannot start the storage runtime: {e}")))?;
    rt.spawn(fut)
        .await
        .map_err(|e| Error::fatal(format!("a storage operation failed to complete: {e}")))?
}

/// Maps an object store error to ours: what was being done to which object, and what
/// to check. Network trouble is retryable; a refusal (credentials, permissions, bucket)
/// needs the operator.
fn s3_error(e: object_store::Error, doing: &str, what: &str) -> Error {
    let text = e.to_string();
    let (kind, hint) = if text.contains("AccessDenied") || text.contains("Forbidden") {
        (
            ErrorKind::Fatal,
            "; the credentials in use lack permission: check the IAM policy (s3:GetObject, s3:PutObject, s3:ListBucket, s3:DeleteObject) and AWS_PROFILE / AWS_ACCESS_KEY_ID",
        )
    } else if text.contains("NoSuchBucket") {
        (
            ErrorKind::Fatal,
            "; the bucket does not exist: create it or fix the s3:// location",
        )
    } else if matches!(e, object_store::Error::Generic { .. })
        && (text.contains("connect")
            || text.contains("timed out")
            || text.contains("error sending request"))
    {
        (
            ErrorKind::Retryable,
            "; S3 is not reachable: check the network, AWS_REGION and AWS_ENDPOINT_URL",
        )
    } else {
        (ErrorKind::Fatal, "")
    };
    Error::new(kind, format!("{doing} {what} failed{hint}")).with_source(e)
}

#[cfg(test)]
mod tests;
