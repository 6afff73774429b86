//! Pipeline leases, in the storage layer under the WAL and the warehouse: with the WAL and
//! state on S3, one object per pipeline (`pipelines/<name>.lease.json` in the state prefix)
//! says which process may write that pipeline. It is taken and renewed only with conditional
//! puts (create-only, then update-if-unchanged), so of two processes racing for it exactly
//! one wins; the other is refused with the holder's host, pid and start time.
//!
//! The holder renews it every `renew_every`; each renewal pushes its expiry `expire_after`
//! ahead. A process that dies stops renewing, and once the expiry has passed another may
//! take the lease over. A holder that cannot renew (the object was taken, or storage is
//! unreachable) counts its lease as lost once its own last renewal is older than the expiry
//! minus one renewal period, and every commit checks [`ensure_held`] first: it stops
//! writing before anyone else may start. Expiry is judged on wall-clock time across
//! machines, so their clocks must agree to well within `expire_after` (NTP does that).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Put, Store, Version};
use crate::error::{Error, ErrorKind, Result};

/// Words of the refusal when another process holds the lease (see [`held_elsewhere`]).
const HELD_ELSEWHERE: &str = "is already running: its lease";

/// Whether `e` is the refusal of a lease that another live process holds: `serve` then
/// stands by and takes the pipeline over once that lease expires.
pub fn held_elsewhere(e: &Error) -> bool {
    e.kind() == ErrorKind::Source && e.message().contains(HELD_ELSEWHERE)
}

/// Default time between two renewals of a lease.
pub const DEFAULT_RENEW_EVERY: &str = "30s";
/// Default time after its last renewal when a lease expires and may be taken over.
pub const DEFAULT_EXPIRE_AFTER: &str = "2m";

/// How leases are renewed and when they expire (`skippr.lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    pub renew_every: Duration,
    pub expire_after: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            renew_every: Duration::from_secs(30),
            expire_after: Duration::from_secs(120),
        }
    }
}

/// The lease object's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    pub pipeline: String,
    /// Unique per acquisition: tells this holder from a later one on the same host and pid.
    pub token: String,
    pub host: String,
    pub pid: u32,
    /// When this holder took the lease.
    pub since: DateTime<Utc>,
    /// Its last renewal.
    pub renewed_at: DateTime<Utc>,
    /// Past this instant (without a renewal) anyone may take the lease over.
    pub expires_at: DateTime<Utc>,
    /// Set when the holder let go on a clean stop: free at once.
    #[serde(default)]
    pub released: bool,
}

impl LeaseRecord {
    fn free_at(&self, now: DateTime<Utc>) -> bool {
        self.released || now >= self.expires_at
    }

    fn describe(&self) -> String {
        format!(
            "host {} (pid {}) since {}, last renewed {}, expiring {} unless renewed",
            self.host,
            self.pid,
            self.since.format("%Y-%m-%d %H:%M:%S UTC"),
            self.renewed_at.format("%H:%M:%S"),
            self.expires_at.format("%H:%M:%S UTC")
        )
    }
}

/// What the renewal task and the commit checks share.
#[derive(Debug)]
struct Shared {
    /// The version of the object as last written by us.
    version: Version,
    record: LeaseRecord,
    /// When our last renewal succeeded, on this machine's monotonic clock.
    renewed: Instant,
    /// Set when the object was found taken by someone else.
    lost: Option<String>,
    settings: LeaseSettings,
    /// Unique per acquisition in this process (see [`current_hold`]).
    hold: u64,
}

/// A held lease. Dropping it stops the renewals and releases the lease.
pub struct Lease {
    store: Store,
    key: String,
    settings: LeaseSettings,
    shared: Arc<Mutex<Shared>>,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Leases held by this process, by pipeline: what [`ensure_held`] checks.
fn registry() -> &'static Mutex<HashMap<String, Arc<Mutex<Shared>>>> {
    static HELD: OnceLock<Mutex<HashMap<String, Arc<Mutex<Shared>>>>> = OnceLock::new();
    HELD.get_or_init(Default::default)
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into())
}

fn chrono_span(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

fn encode(record: &LeaseRecord) -> Result<Bytes> {
    Ok(Bytes::from(serde_json::to_vec_pretty(record)?))
}

fn decode(store: &Store, key: &str, bytes: &[u8]) -> Result<LeaseRecord> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::fatal(format!(
            "the lease {} is damaged ({e}); if no skipprd runs this pipeline, delete the object and start again",
            store.describe(key)
        ))
    })
}

impl Lease {
    /// Takes the lease of `pipeline` at `key`, or refuses with the current holder. A lease
    /// that expired (or was released) is taken over.
    pub async fn acquire(
        store: Store,
        key: &str,
        pipeline: &str,
        settings: LeaseSettings,
    ) -> Result<Self> {
        let now = Utc::now();
        let record = LeaseRecord {
            pipeline: pipeline.to_string(),
            token: uuid::Uuid::new_v4().to_string(),
            host: host_name(),
            pid: std::process::id(),
            since: now,
            renewed_at: now,
            expires_at: now + chrono_span(settings.expire_after),
            released: false,
        };
        let written = match store.get(key).await? {
            None => store.put_if_absent(key, encode(&record)?).await?,
            Some((bytes, version)) => {
                let current = decode(&store, key, &bytes)?;
                if !current.free_at(now) {
                    return Err(Error::new(
                        ErrorKind::Source,
                        format!(
                            "pipeline `{pipeline}` {HELD_ELSEWHERE} {} is held by skipprd on {}. Only one sync (or serve) may write a pipeline; stop that one first, or, if it died, wait until its lease expires (skippr.lease.expire_after, {}s) and start again",
                            store.describe(key),
                            current.describe(),
                            settings.expire_after.as_secs()
                        ),
                    ));
                }
                if !current.released {
                    tracing::warn!(pipeline, previous_host = %current.host, previous_pid = current.pid, "taking over an expired pipeline lease");
                }
                store.put_if_version(key, encode(&record)?, version).await?
            }
        };
        let version = match written {
            Put::Written(v) => v,
            Put::Conflict => {
                return Err(Error::new(
                    ErrorKind::Source,
                    format!(
                        "pipeline `{pipeline}` was just started by another skipprd (its lease {} changed while this one took it); stop one of them",
                        store.describe(key)
                    ),
                ))
            }
        };
        tracing::info!(pipeline, lease = %store.describe(key), expire_after_s = settings.expire_after.as_secs(), "pipeline lease taken");
        let shared = Arc::new(Mutex::new(Shared {
            version,
            record,
            renewed: Instant::now(),
            lost: None,
            settings,
            hold: next_hold(),
        }));
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pipeline.to_string(), shared.clone());
        let mut lease = Self {
            store,
            key: key.to_string(),
            settings,
            shared,
            renewer: None,
        };
        lease.renewer = Some(tokio::spawn(renew_loop(
            lease.store.clone(),
            lease.key.clone(),
            settings,
            lease.shared.clone(),
        )));
        Ok(lease)
    }

    /// Renews once now (the renewal task does this every `renew_every`).
    pub async fn renew(&self) -> Result<()> {
        renew_once(&self.store, &self.key, self.settings, &self.shared).await
    }

    /// Ok while the lease is ours and fresh; see [`ensure_held`].
    pub fn check(&self) -> Result<()> {
        check_shared(&lock(&self.shared))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let (pipeline, version, mut record, lost) = {
            let s = lock(&self.shared);
            (
                s.record.pipeline.clone(),
                s.version.clone(),
                s.record.clone(),
                s.lost.is_some(),
            )
        };
        {
            let mut held = registry().lock().unwrap_or_else(|e| e.into_inner());
            if held
                .get(&pipeline)
                .is_some_and(|s| Arc::ptr_eq(s, &self.shared))
            {
                held.remove(&pipeline);
            }
        }
        if lost {
            return;
        }
        // Let go at once on a clean stop, so the next start need not wait for the expiry;
        // only if the object is still ours (a conditional put).
        record.released = true;
        let Ok(bytes) = encode(&record) else { return };
        let store = self.store.clone();
        let key = self.key.clone();
        let released = store.blocking(store.put_if_version(&key, bytes, version));
        match released {
            Ok(Put::Written(_)) => tracing::info!(pipeline, "pipeline lease released"),
            Ok(Put::Conflict) => {}
            Err(e) => {
                tracing::warn!(pipeline, error = %e.report(), "cannot release the pipeline lease; it expires by itself")
            }
        }
    }
}

fn check_shared(s: &Shared) -> Result<()> {
    let settings = s.settings;
    if let Some(why) = &s.lost {
        return Err(Error::fatal(format!(
            "pipeline `{}` stopped writing: {why}",
            s.record.pipeline
        )));
    }
    // Without a renewal for (expiry - one period) another process may take over soon: stop
    // before that can happen.
    let margin = settings
        .expire_after
        .saturating_sub(settings.renew_every)
        .max(settings.expire_after / 2);
    if s.renewed.elapsed() >= margin {
        return Err(Error::new(
            ErrorKind::Retryable,
            format!(
                "pipeline `{}` stopped writing: its lease was last renewed {}s ago (storage unreachable?) and may soon be taken over by another process",
                s.record.pipeline,
                s.renewed.elapsed().as_secs()
            ),
        ));
    }
    Ok(())
}

async fn renew_once(
    store: &Store,
    key: &str,
    settings: LeaseSettings,
    shared: &Mutex<Shared>,
) -> Result<()> {
    let (version, mut record) = {
        let s = lock(shared);
        if s.lost.is_some() {
            return check_shared(&s);
        }
        (s.version.clone(), s.record.clone())
    };
    let now = Utc::now();
    record.renewed_at = now;
    record.expires_at = now + chrono_span(settings.expire_after);
    match store.put_if_version(key, encode(&record)?, version).await? {
        Put::Written(v) => {
            let mut s = lock(shared);
            s.version = v;
            s.record = record;
            s.renewed = Instant::now();
            Ok(())
        }
        Put::Conflict => {
            // Someone else wrote the object: they took the lease over (ours had expired) or
            // removed it. Either way this process must not write any more.
            let holder = match store.get(key).await {
                Ok(Some((bytes, _))) => decode(store, key, &bytes)
                    .map(|r| format!("now held by {}", r.describe()))
                    .unwrap_or_else(|e| e.report()),
                Ok(None) => "the lease object was removed".into(),
                Err(e) => e.report(),
            };
            let why = format!(
                "its lease {} was taken over ({holder}); this process lost it (was it paused longer than skippr.lease.expire_after?). Nothing more is written; the other process carries on",
                store.describe(key)
            );
            tracing::error!(pipeline = %record.pipeline, reason = %why, "pipeline lease lost");
            let mut s = lock(shared);
            s.lost = Some(why);
            check_shared(&s)
        }
    }
}

async fn renew_loop(
    store: Store,
    key: String,
    settings: LeaseSettings,
    shared: Arc<Mutex<Shared>>,
) {
    let mut tick = tokio::time::interval(settings.renew_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = renew_once(&store, &key, settings, &shared).await {
            if lock(&shared).lost.is_some() {
                return;
            }
            tracing::warn!(lease = %store.describe(&key), error = %e.report(), "cannot renew the pipeline lease; trying again");
        }
    }
}

/// Ok unless this process holds the lease of `pipeline` and lost it (or could not renew it
/// for too long). Pipelines without a lease (local storage: a file lock guards them) pass.
/// Every commit calls this just before it makes its snapshot current.
pub fn ensure_held(pipeline: &str) -> Result<()> {
    let shared = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(pipeline)
        .cloned();
    match shared {
        None => Ok(()),
        Some(s) => check_shared(&lock(&s)),
    }
}

fn next_hold() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The id of this process's current, valid hold of `pipeline`'s lease (S3 mode), or `None`
/// when it holds none (or may soon lose it). While the same id is returned, no other
/// process can have written the pipeline's WAL or tables: what this process recorded of
/// them during that hold is the whole truth.
pub fn current_hold(pipeline: &str) -> Option<u64> {
    let shared = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(pipeline)
        .cloned()?;
    let s = lock(&shared);
    check_shared(&s).ok().map(|()| s.hold)
}

/// Takes the lease of a pipeline whose state lives in `store` (S3 mode).
pub async fn hold_pipeline(store: Store, pipeline: &str, settings: LeaseSettings) -> Result<Lease> {
    Lease::acquire(
        store,
        &format!("pipelines/{pipeline}.lease.json"),
        pipeline,
        settings,
    )
    .await
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
