//! Iceberg's file I/O on the storage layer: the sink writes Parquet, manifests and metadata
//! through this, so an `s3://` warehouse uses the same S3 client (credentials, endpoint,
//! runtime) as the WAL. `file://` paths (and bare paths) go to iceberg's local storage.
//!
//! Reads from S3 go through one process-wide cache of bytes (whole objects and byte ranges),
//! bounded by [`OBJECT_CACHE_BYTES`]: every file of an Iceberg table (data, deletes,
//! manifests, manifest lists, metadata JSON) is written once under a unique name and never
//! changed, so what was read once is served from memory after, and a warm query over S3
//! reads only what changed (the catalog's pointer and new files).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use serde::{Deserialize, Serialize};

use super::{Location, Store};

/// Memory the cache of S3 reads may hold.
pub const OBJECT_CACHE_BYTES: u64 = 256 * 1024 * 1024;
/// Larger whole objects (data files the sink reads whole to index them) are not cached: they
/// would push out the metadata and footers every query needs.
const CACHE_WHOLE_MAX: usize = 4 * 1024 * 1024;
/// Larger byte ranges are not cached either.
const CACHE_RANGE_MAX: usize = 16 * 1024 * 1024;

/// What the cache holds: an object's size, a whole object, or a byte range of one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Cached {
    Size(String),
    Whole(String),
    Range(String, u64, u64),
}

#[derive(Debug, Clone)]
enum CachedValue {
    Size(u64),
    Bytes(Bytes),
}

tokio::task_local! {
    /// Set while the reads of a task must not fill the cache (see [`uncached`]).
    static UNCACHED: ();
}

/// Runs `f` with its S3 reads served from the cache when they are there, but not added to
/// it: compaction reads every row group of files it is about to replace, which would only
/// push out the footers and metadata queries need (and hold memory the sync does not).
pub async fn uncached<F: std::future::Future>(f: F) -> F::Output {
    UNCACHED.scope((), f).await
}

/// Whether reads made now may be added to the cache.
fn caching() -> bool {
    UNCACHED.try_with(|_| ()).is_err()
}

fn cache() -> &'static moka::future::Cache<Cached, CachedValue> {
    static CACHE: std::sync::OnceLock<moka::future::Cache<Cached, CachedValue>> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(|| {
        moka::future::Cache::builder()
            .max_capacity(OBJECT_CACHE_BYTES)
            .weigher(|k: &Cached, v: &CachedValue| {
                let key = match k {
                    Cached::Size(p) | Cached::Whole(p) | Cached::Range(p, _, _) => p.len(),
                };
                let value = match v {
                    CachedValue::Size(_) => 8,
                    CachedValue::Bytes(b) => b.len(),
                };
                u32::try_from(64 + key + value).unwrap_or(u32::MAX)
            })
            .build()
    })
}

/// Builds [`ObjectStorage`] for a table's FileIO.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ObjectStorageFactory {
    /// The sink's region, for the S3 client (the AWS chain fills in otherwise).
    pub region: Option<String>,
    /// Where fresh credentials come from when those handed out with the table (vended by
    /// a REST catalog) expire.
    #[serde(skip)]
    pub vended: Option<Arc<dyn Vended>>,
}

/// The source of a table's storage properties, asked again when its vended credentials
/// are about to expire (a REST catalog's `loadTable`).
#[async_trait]
pub trait Vended: std::fmt::Debug + Send + Sync {
    async fn fresh_props(&self) -> crate::error::Result<HashMap<String, String>>;
}

#[typetag::serde]
impl StorageFactory for ObjectStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage {
            region: self.region.clone(),
            props: config.props().clone(),
            vended: self.vended.clone(),
            stores: Arc::default(),
        }))
    }
}

/// Iceberg `Storage` over [`Store`]: one S3 store per bucket, opened on first use.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectStorage {
    region: Option<String>,
    /// The FileIO's properties (`s3.endpoint`, `s3.access-key-id`, ...), from the catalog.
    #[serde(default)]
    props: HashMap<String, String>,
    #[serde(skip)]
    vended: Option<Arc<dyn Vended>>,
    #[serde(skip)]
    stores: Arc<Mutex<HashMap<String, Store>>>,
}

/// Iceberg's FileIO property names for S3.
mod prop {
    pub const ENDPOINT: &str = "s3.endpoint";
    pub const REGION: &str = "s3.region";
    pub const CLIENT_REGION: &str = "client.region";
    pub const PATH_STYLE: &str = "s3.path-style-access";
    pub const ACCESS_KEY: &str = "s3.access-key-id";
    pub const SECRET_KEY: &str = "s3.secret-access-key";
    pub const SESSION_TOKEN: &str = "s3.session-token";
    pub const EXPIRES_AT_MS: &str = "s3.session-token-expires-at-ms";
}

/// The S3 settings that a table's FileIO properties name (none: the standard chain).
pub fn s3_settings(
    props: &HashMap<String, String>,
    vended: Option<Arc<dyn Vended>>,
) -> super::aws::S3Settings {
    let get = |k: &str| props.get(k).filter(|v| !v.is_empty()).cloned();
    let credentials = Keys::from_props(props).map(|keys| {
        Arc::new(VendedCredentials {
            current: Mutex::new(keys),
            source: vended,
            asked_at_ms: Mutex::new(None),
        }) as object_store::aws::AwsCredentialProvider
    });
    super::aws::S3Settings {
        endpoint: get(prop::ENDPOINT).map(|e| e.trim_end_matches('/').to_string()),
        region: get(prop::REGION).or_else(|| get(prop::CLIENT_REGION)),
        path_style: get(prop::PATH_STYLE).map(|v| v.eq_ignore_ascii_case("true")),
        credentials,
    }
}

/// Keys handed out with a table, and when they expire.
#[derive(Debug, Clone)]
struct Keys {
    credential: Arc<object_store::aws::AwsCredential>,
    expires_at_ms: Option<i64>,
}

impl Keys {
    fn from_props(props: &HashMap<String, String>) -> Option<Self> {
        let get = |k: &str| props.get(k).filter(|v| !v.is_empty()).cloned();
        Some(Self {
            credential: Arc::new(object_store::aws::AwsCredential {
                key_id: get(prop::ACCESS_KEY)?,
                secret_key: get(prop::SECRET_KEY)?,
                token: get(prop::SESSION_TOKEN),
            }),
            expires_at_ms: get(prop::EXPIRES_AT_MS).and_then(|v| v.parse().ok()),
        })
    }
}

/// How long before they expire vended credentials are renewed.
const RENEW_BEFORE_MS: i64 = 5 * 60 * 1000;

/// Credentials vended with a table, renewed from their source shortly before they expire.
#[derive(Debug)]
struct VendedCredentials {
    current: Mutex<Keys>,
    source: Option<Arc<dyn Vended>>,
    /// When the catalog was last asked (it is asked at most every [`RENEW_EVERY_MS`] while
    /// the keys still work, even when it hands out keys that expire soon again).
    asked_at_ms: Mutex<Option<i64>>,
}

/// How often the catalog is asked again while the keys it gave still work.
const RENEW_EVERY_MS: i64 = 30 * 1000;

#[async_trait]
impl object_store::CredentialProvider for VendedCredentials {
    type Credential = object_store::aws::AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<Self::Credential>> {
        let keys = self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let now = chrono::Utc::now().timestamp_millis();
        let (Some(at), Some(source)) = (keys.expires_at_ms, &self.source) else {
            return Ok(keys.credential);
        };
        if now + RENEW_BEFORE_MS < at {
            return Ok(keys.credential);
        }
        {
            let mut asked = self.asked_at_ms.lock().unwrap_or_else(|e| e.into_inner());
            if now < at && asked.is_some_and(|t| now - t < RENEW_EVERY_MS) {
                return Ok(keys.credential);
            }
            *asked = Some(now);
        }
        match source.fresh_props().await.map(|p| Keys::from_props(&p)) {
            Ok(Some(fresh)) => {
                tracing::debug!(expires_at_ms = ?fresh.expires_at_ms, "vended storage credentials renewed");
                let credential = fresh.credential.clone();
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                Ok(credential)
            }
            // Still valid: used while the catalog cannot be asked.
            Ok(None) | Err(_) if now < at => Ok(keys.credential),
            Ok(None) => Err(object_store::Error::Generic {
                store: "S3",
                source: "the catalog no longer vends storage credentials for this table, and those it gave have expired".into(),
            }),
            Err(e) => Err(object_store::Error::Generic {
                store: "S3",
                source: format!("the vended storage credentials expired and renewing them failed: {}", e.report()).into(),
            }),
        }
    }
}

fn io_error(e: crate::error::Error) -> iceberg::Error {
    let retryable = e.kind() == crate::error::ErrorKind::Retryable;
    iceberg::Error::new(iceberg::ErrorKind::Unexpected, e.report()).with_retryable(retryable)
}

/// Where a path lives: on S3 (a store and a key) or on local disk.
enum Target {
    S3(Store, String),
    Local,
}

impl ObjectStorage {
    fn target(&self, path: &str) -> iceberg::Result<Target> {
        let Some(rest) = path
            .strip_prefix("s3://")
            .or_else(|| path.strip_prefix("s3a://"))
        else {
            if path.contains("://") && !path.starts_with("file://") {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::FeatureUnsupported,
                    format!("`{path}` is neither an s3:// nor a local path; skipprd warehouses live on S3 or local disk"),
                ));
            }
            return Ok(Target::Local);
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        let store = match stores.get(bucket) {
            Some(s) => s.clone(),
            None => {
                let location = Location::S3 {
                    bucket: bucket.to_string(),
                    prefix: String::new(),
                };
                let settings = s3_settings(&self.props, self.vended.clone());
                let store = Store::open_with(&location, self.region.as_deref(), &settings)
                    .map_err(io_error)?;
                stores.insert(bucket.to_string(), store.clone());
                store
            }
        };
        Ok(Target::S3(store, key.to_string()))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        match self.target(path)? {
            Target::S3(store, key) => Ok(store.size(&key).await.map_err(io_error)?.is_some()),
            Target::Local => LocalFsStorage::new().exists(path).await,
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        match self.target(path)? {
            Target::S3(store, key) => {
                let at = Cached::Size(path.to_string());
                if let Some(CachedValue::Size(size)) = cache().get(&at).await {
                    return Ok(FileMetadata { size });
                }
                match store.size(&key).await.map_err(io_error)? {
                    Some(size) => {
                        cache().insert(at, CachedValue::Size(size)).await;
                        Ok(FileMetadata { size })
                    }
                    None => Err(iceberg::Error::new(
                        iceberg::ErrorKind::DataInvalid,
                        format!("{path} does not exist"),
                    )),
                }
            }
            Target::Local => LocalFsStorage::new().metadata(path).await,
        }
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        match self.target(path)? {
            Target::S3(store, key) => {
                let at = Cached::Whole(path.to_string());
                if let Some(CachedValue::Bytes(bytes)) = cache().get(&at).await {
                    return Ok(bytes);
                }
                match store.get(&key).await.map_err(io_error)? {
                    Some((bytes, _)) => {
                        if bytes.len() <= CACHE_WHOLE_MAX && caching() {
                            cache().insert(at, CachedValue::Bytes(bytes.clone())).await;
                        }
                        Ok(bytes)
                    }
                    None => Err(iceberg::Error::new(
                        iceberg::ErrorKind::DataInvalid,
                        format!("{path} does not exist"),
                    )),
                }
            }
            Target::Local => LocalFsStorage::new().read(path).await,
        }
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        match self.target(path)? {
            Target::S3(store, key) => Ok(Box::new(ObjectRead {
                store,
                key,
                path: path.to_string(),
            })),
            Target::Local => LocalFsStorage::new().reader(path).await,
        }
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        match self.target(path)? {
            Target::S3(store, key) => store.put(&key, bs).await.map(|_| ()).map_err(io_error),
            Target::Local => LocalFsStorage::new().write(path, bs).await,
        }
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        match self.target(path)? {
            Target::S3(store, key) => Ok(Box::new(ObjectWrite {
                store,
                key,
                buf: Some(BytesMut::new()),
            })),
            Target::Local => LocalFsStorage::new().writer(path).await,
        }
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        match self.target(path)? {
            Target::S3(store, key) => store.delete(&key).await.map_err(io_error),
            Target::Local => LocalFsStorage::new().delete(path).await,
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        match self.target(path)? {
            Target::S3(store, key) => {
                let prefix = format!("{}/", key.trim_end_matches('/'));
                for entry in store.list(&prefix).await.map_err(io_error)? {
                    store.delete(&entry.key).await.map_err(io_error)?;
                }
                Ok(())
            }
            Target::Local => LocalFsStorage::new().delete_prefix(path).await,
        }
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Ranged reads of one S3 object (Parquet footers and column chunks), cached.
struct ObjectRead {
    store: Store,
    key: String,
    path: String,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        let at = Cached::Range(self.path.clone(), range.start, range.end);
        if let Some(CachedValue::Bytes(bytes)) = cache().get(&at).await {
            return Ok(bytes);
        }
        let bytes = self
            .store
            .get_range(&self.key, range)
            .await
            .map_err(io_error)?;
        if bytes.len() <= CACHE_RANGE_MAX && caching() {
            cache().insert(at, CachedValue::Bytes(bytes.clone())).await;
        }
        Ok(bytes)
    }
}

/// A file written to S3: buffered, then stored with one PUT on close, so a file is either
/// whole or absent (a data file is at most the configured target size).
struct ObjectWrite {
    store: Store,
    key: String,
    buf: Option<BytesMut>,
}

#[async_trait]
impl FileWrite for ObjectWrite {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let buf = self.buf.as_mut().ok_or_else(|| {
            iceberg::Error::new(iceberg::ErrorKind::Unexpected, "write after close")
        })?;
        buf.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let buf = self.buf.take().ok_or_else(|| {
            iceberg::Error::new(iceberg::ErrorKind::Unexpected, "file closed twice")
        })?;
        self.store
            .put(&self.key, buf.freeze())
            .await
            .map(|_| ())
            .map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_inside_uncached_are_not_added_to_the_cache_and_others_are() {
        assert!(caching());
        assert!(!uncached(async { caching() }).await);
        // Nested futures polled inside the scope see it too (the Parquet reader's range
        // fetches are futures of the stream polled there).
        let (a, b) = uncached(futures::future::join(async { caching() }, async {
            caching()
        }))
        .await;
        assert!(!a && !b);
        assert!(caching());
    }

    /// A catalog that vends keys numbered by how often it was asked, expiring `life_ms` on.
    #[derive(Debug)]
    struct Catalog {
        asked: std::sync::atomic::AtomicU32,
        life_ms: i64,
    }

    #[async_trait]
    impl Vended for Catalog {
        async fn fresh_props(&self) -> crate::error::Result<HashMap<String, String>> {
            let n = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Ok(keys(&format!("key-{n}"), self.life_ms))
        }
    }

    fn keys(id: &str, life_ms: i64) -> HashMap<String, String> {
        let at = chrono::Utc::now().timestamp_millis() + life_ms;
        HashMap::from([
            (prop::ACCESS_KEY.to_string(), id.to_string()),
            (prop::SECRET_KEY.to_string(), "secret".to_string()),
            (prop::SESSION_TOKEN.to_string(), "token".to_string()),
            (prop::EXPIRES_AT_MS.to_string(), at.to_string()),
            (
                prop::ENDPOINT.to_string(),
                "http://127.0.0.1:9/".to_string(),
            ),
            (prop::PATH_STYLE.to_string(), "true".to_string()),
        ])
    }

    #[tokio::test]
    async fn vended_keys_are_renewed_before_they_expire_and_not_before() {
        let hour = 3_600_000;
        let catalog = Arc::new(Catalog {
            asked: Default::default(),
            life_ms: hour,
        });
        // Keys that last an hour are used as they are.
        let s = s3_settings(&keys("first", hour), Some(catalog.clone()));
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(s.path_style, Some(true));
        let provider = s.credentials.expect("credentials");
        assert_eq!(
            provider.get_credential().await.expect("key").key_id,
            "first"
        );
        assert_eq!(catalog.asked.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Keys two minutes from expiry are renewed from the catalog.
        let s = s3_settings(&keys("soon", 120_000), Some(catalog.clone()));
        let provider = s.credentials.expect("credentials");
        assert_eq!(
            provider.get_credential().await.expect("key").key_id,
            "key-1"
        );
        assert_eq!(
            provider.get_credential().await.expect("key").key_id,
            "key-1"
        );
        assert_eq!(catalog.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A catalog that hands out short-lived keys again is asked at most every 30 s.
        let short = Arc::new(Catalog {
            asked: Default::default(),
            life_ms: 60_000,
        });
        let s = s3_settings(&keys("soon", 60_000), Some(short.clone()));
        let provider = s.credentials.expect("credentials");
        for _ in 0..5 {
            assert_eq!(
                provider.get_credential().await.expect("key").key_id,
                "key-1"
            );
        }
        assert_eq!(short.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Without keys in the properties, the standard chain.
        assert!(s3_settings(&HashMap::new(), None).credentials.is_none());
    }
}
