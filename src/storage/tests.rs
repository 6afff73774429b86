//! Unit tests of the storage layer on local disk (S3 is covered end to end against a
//! local S3 stand-in in tests/test_athena_iceberg.py).

use bytes::Bytes;

use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&Location::Local(dir.path().to_path_buf()), None).expect("open");
    (dir, store)
}

#[tokio::test]
async fn put_get_list_delete() -> Result<()> {
    let (dir, store) = store();
    assert_eq!(store.get("a/b.bin").await?, None);
    store.put("a/b.bin", Bytes::from_static(b"one")).await?;
    store.put("a/c/d.bin", Bytes::from_static(b"two!")).await?;
    store.put("e.bin", Bytes::from_static(b"x")).await?;
    // A crash leftover and a lock file are not objects.
    std::fs::write(dir.path().join("a/z.bin.1-1.tmp"), b"partial").context("write")?;
    let (bytes, _) = store
        .get("a/b.bin")
        .await?
        .ok_or_else(|| Error::fatal("missing"))?;
    assert_eq!(&bytes[..], b"one");
    let listed = store.list("a").await?;
    assert!(listed.iter().all(|e| e.modified.is_some()));
    let listed: Vec<(String, u64)> = listed.into_iter().map(|e| (e.key, e.size)).collect();
    assert_eq!(
        listed,
        vec![("a/b.bin".to_string(), 3), ("a/c/d.bin".to_string(), 4)]
    );
    assert_eq!(store.size("a/c/d.bin").await?, Some(4));
    assert_eq!(&store.get_range("a/c/d.bin", 1..3).await?[..], b"wo");
    store.delete("a/b.bin").await?;
    store.delete("a/b.bin").await?;
    assert_eq!(store.get("a/b.bin").await?, None);
    assert_eq!(store.size("a/b.bin").await?, None);
    Ok(())
}

#[tokio::test]
async fn create_only_never_overwrites() -> Result<()> {
    let (_dir, store) = store();
    assert!(matches!(
        store
            .put_if_absent("k", Bytes::from_static(b"first"))
            .await?,
        Put::Written(_)
    ));
    assert_eq!(
        store
            .put_if_absent("k", Bytes::from_static(b"second"))
            .await?,
        Put::Conflict
    );
    let (bytes, _) = store
        .get("k")
        .await?
        .ok_or_else(|| Error::fatal("missing"))?;
    assert_eq!(&bytes[..], b"first");
    Ok(())
}

#[tokio::test]
async fn update_detects_a_concurrent_writer() -> Result<()> {
    let (_dir, store) = store();
    store.put("ptr", Bytes::from_static(b"v1")).await?;
    let (_, read_by_a) = store
        .get("ptr")
        .await?
        .ok_or_else(|| Error::fatal("missing"))?;
    let (_, read_by_b) = store
        .get("ptr")
        .await?
        .ok_or_else(|| Error::fatal("missing"))?;
    // B swaps first; A's swap, based on what it read before, must be refused.
    let Put::Written(after_b) = store
        .put_if_version("ptr", Bytes::from_static(b"v2-b"), read_by_b)
        .await?
    else {
        return Err(Error::fatal("B's swap was refused"));
    };
    assert_eq!(
        store
            .put_if_version("ptr", Bytes::from_static(b"v2-a"), read_by_a)
            .await?,
        Put::Conflict
    );
    let (bytes, now) = store
        .get("ptr")
        .await?
        .ok_or_else(|| Error::fatal("missing"))?;
    assert_eq!(&bytes[..], b"v2-b");
    assert_eq!(now, after_b);
    Ok(())
}

#[test]
fn blocking_runs_local_operations_inline() -> Result<()> {
    let (_dir, store) = store();
    store.blocking(store.put("x", Bytes::from_static(b"1")))?;
    assert_eq!(store.blocking(store.list(""))?.len(), 1);
    Ok(())
}

#[test]
fn s3_locations_parse_or_say_what_is_wrong() {
    assert_eq!(
        Location::parse_s3("s3://my-bucket/skippr/state/"),
        Ok(Location::S3 {
            bucket: "my-bucket".into(),
            prefix: "skippr/state".into()
        })
    );
    assert_eq!(
        Location::parse_s3("s3://my-bucket"),
        Ok(Location::S3 {
            bucket: "my-bucket".into(),
            prefix: String::new()
        })
    );
    assert!(Location::parse_s3("/tmp/x")
        .unwrap_err()
        .contains("s3://bucket/prefix"));
    assert!(Location::parse_s3("s3://My_Bucket/x")
        .unwrap_err()
        .contains("not a valid S3 bucket name"));
    assert!(Location::parse_s3("s3://bucket/a//x")
        .unwrap_err()
        .contains("empty"));
    let l = Location::parse_s3("s3://b1b/p").map(|l| l.join("wal/orders"));
    assert_eq!(
        l.map(|l| l.display()),
        Ok("s3://b1b/p/wal/orders".to_string())
    );
}
