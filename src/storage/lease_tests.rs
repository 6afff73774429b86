//! Unit tests of pipeline leases on the local store (the same conditional puts as on S3,
//! which tests/test_athena_iceberg.py exercises against a local S3 stand-in).

use std::time::Duration;

use super::*;
use crate::storage::Location;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&Location::Local(dir.path().to_path_buf()), None).expect("open");
    (dir, store)
}

fn quick() -> LeaseSettings {
    LeaseSettings {
        renew_every: Duration::from_millis(200),
        expire_after: Duration::from_millis(800),
    }
}

fn slow() -> LeaseSettings {
    LeaseSettings {
        renew_every: Duration::from_secs(30),
        expire_after: Duration::from_secs(120),
    }
}

async fn record(store: &Store, key: &str) -> Result<LeaseRecord> {
    let (bytes, _) = store
        .get(key)
        .await?
        .ok_or_else(|| Error::fatal("no lease object"))?;
    decode(store, key, &bytes)
}

#[tokio::test]
async fn a_live_lease_refuses_a_second_holder_and_names_the_first() -> Result<()> {
    let (_dir, store) = store();
    let first =
        Lease::acquire(store.clone(), "pipelines/a.lease.json", "lease_t_a", slow()).await?;
    first.check()?;
    let e = Lease::acquire(store.clone(), "pipelines/a.lease.json", "lease_t_a", slow())
        .await
        .err()
        .ok_or_else(|| Error::fatal("a second holder was let in"))?;
    let msg = e.message();
    assert!(msg.contains("already running"), "{msg}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    assert!(msg.contains(&host_name()), "{msg}");
    assert!(msg.contains("since "), "{msg}");
    assert!(msg.contains("expire_after"), "{msg}");
    assert_eq!(e.kind(), ErrorKind::Source);
    assert!(held_elsewhere(&e));
    assert!(!held_elsewhere(&Error::source_err("something else")));
    drop(first);
    Ok(())
}

#[tokio::test]
async fn a_clean_stop_releases_at_once() -> Result<()> {
    let (_dir, store) = store();
    let key = "pipelines/b.lease.json";
    let first = Lease::acquire(store.clone(), key, "lease_t_b", slow()).await?;
    drop(first);
    assert!(record(&store, key).await?.released);
    let second = Lease::acquire(store.clone(), key, "lease_t_b", slow()).await?;
    assert!(!record(&store, key).await?.released);
    drop(second);
    Ok(())
}

#[tokio::test]
async fn renewals_push_the_expiry_ahead() -> Result<()> {
    let (_dir, store) = store();
    let key = "pipelines/c.lease.json";
    let lease = Lease::acquire(store.clone(), key, "lease_t_c", quick()).await?;
    let before = record(&store, key).await?;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = record(&store, key).await?;
    assert!(after.expires_at > before.expires_at);
    assert_eq!(after.token, before.token);
    // Renewed in the background: still live past the first expiry, and still ours.
    lease.check()?;
    assert!(Lease::acquire(store.clone(), key, "lease_t_c", quick())
        .await
        .is_err());
    Ok(())
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_the_old_holder_fails_closed() -> Result<()> {
    let (_dir, store) = store();
    let key = "pipelines/d.lease.json";
    let old = Lease::acquire(store.clone(), key, "lease_t_d", quick()).await?;
    // The old holder stalls (its renewals stop, as for a paused or dying process).
    let Some(renewer) = old.renewer.as_ref() else {
        return Err(Error::fatal("no renewal task"));
    };
    renewer.abort();
    tokio::time::sleep(Duration::from_millis(900)).await;
    // Fail closed even before anyone took over: no renewal for too long.
    let e = old
        .check()
        .err()
        .ok_or_else(|| Error::fatal("a stale lease still passed"))?;
    assert!(e.message().contains("stopped writing"), "{}", e.message());
    let new = Lease::acquire(store.clone(), key, "lease_t_d", quick()).await?;
    new.check()?;
    // The old holder's next renewal finds the object taken: lost for good, named.
    let e = old
        .renew()
        .await
        .err()
        .ok_or_else(|| Error::fatal("a taken-over lease was renewed"))?;
    assert!(e.message().contains("taken over"), "{}", e.message());
    assert!(old.check().is_err());
    // Dropping the old one must not release the new holder's lease.
    drop(old);
    let now = record(&store, key).await?;
    assert!(!now.released);
    new.check()?;
    Ok(())
}

#[tokio::test]
async fn two_racing_holders_one_wins() -> Result<()> {
    let (_dir, store) = store();
    let key = "pipelines/e.lease.json";
    let (a, b) = tokio::join!(
        Lease::acquire(store.clone(), key, "lease_t_e", slow()),
        Lease::acquire(store.clone(), key, "lease_t_e", slow()),
    );
    assert!(
        a.is_ok() != b.is_ok(),
        "exactly one of two racing holders must win"
    );
    Ok(())
}

#[tokio::test]
async fn ensure_held_follows_the_registered_lease() -> Result<()> {
    let (_dir, store) = store();
    ensure_held("lease_t_f")?;
    let lease = hold_pipeline(store.clone(), "lease_t_f", quick()).await?;
    ensure_held("lease_t_f")?;
    if let Some(r) = lease.renewer.as_ref() {
        r.abort();
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(ensure_held("lease_t_f").is_err());
    drop(lease);
    // Without a lease (a local pipeline) nothing is checked.
    ensure_held("lease_t_f")?;
    Ok(())
}

#[tokio::test]
async fn a_damaged_lease_is_an_error_naming_the_fix() -> Result<()> {
    let (_dir, store) = store();
    let key = "pipelines/g.lease.json";
    store.put(key, Bytes::from_static(b"{nope")).await?;
    let e = Lease::acquire(store.clone(), key, "lease_t_g", slow())
        .await
        .err()
        .ok_or_else(|| Error::fatal("a damaged lease was accepted"))?;
    assert!(e.message().contains("delete the object"), "{}", e.message());
    Ok(())
}
