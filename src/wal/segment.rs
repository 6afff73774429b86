//! One WAL segment, below the stores that keep segments (the live WAL on disk or as objects,
//! its history): its name (the LSN range it covers), its header, and its records decoded
//! from its bytes. The live WAL (`store`), its objects, its history and the segment items
//! all read segments through these.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::codec::{decode_all, Record, MAGIC, MAGIC_PREFIX};
use crate::change::Lsn;
use crate::error::{Context, Error, Result};

/// A complete segment on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub path: PathBuf,
    /// End LSN of its first transaction.
    pub first: Lsn,
    /// End LSN of its last transaction.
    pub last: Lsn,
    pub bytes: u64,
}

/// The name of the segment of the transactions ending from `first` through `last`.
pub(super) fn segment_name(first: Lsn, last: Lsn) -> String {
    format!("{:016X}-{:016X}.seg", first.0, last.0)
}

/// The LSN range a segment's name gives (see [`segment_name`]); `None` for another file.
pub(super) fn parse_name(name: &str) -> Option<(Lsn, Lsn)> {
    let stem = name.strip_suffix(".seg")?;
    let (a, b) = stem.split_once('-')?;
    Some((
        Lsn(u64::from_str_radix(a, 16).ok()?),
        Lsn(u64::from_str_radix(b, 16).ok()?),
    ))
}

/// The folder of a segment.
pub(super) fn self_dir(seg: &SegmentInfo) -> &Path {
    seg.path.parent().unwrap_or(Path::new("."))
}

/// Checks a segment's header (its first bytes): this version's format, or a clear refusal
/// naming what to do with a segment of an earlier format or a file that is no segment.
pub(super) fn check_header(head: &[u8], name: &str, dir: &str) -> Result<()> {
    if head.starts_with(MAGIC_PREFIX) && !head.starts_with(MAGIC) {
        let version = String::from_utf8_lossy(&head[MAGIC_PREFIX.len()..]).into_owned();
        return Err(Error::fatal(format!(
            "WAL segment {name} was written in WAL format {version} by an earlier skipprd; this version reads format {} only. Either finish it with the earlier version (run `skipprd sync --once` with it until {dir} holds no .seg file), then upgrade; or run `skipprd sync --resnapshot` with this version to copy the tables again",
            String::from_utf8_lossy(&MAGIC[MAGIC_PREFIX.len()..]),
        )));
    }
    if !head.starts_with(MAGIC) {
        return Err(Error::fatal(format!(
            "WAL segment {name} is not a Skippr WAL segment (bad header); move it away only if you know its changes are in Iceberg"
        )));
    }
    Ok(())
}

/// Every record of `seg`, whose whole bytes are `data`. A damaged segment is an error,
/// never skipped.
pub(super) fn decode(seg: &SegmentInfo, data: Vec<u8>) -> Result<Vec<Record>> {
    check_header(
        &data[..data.len().min(MAGIC.len())],
        &seg.path.display().to_string(),
        &self_dir(seg).display().to_string(),
    )?;
    let body = Bytes::from(data).slice(MAGIC.len()..);
    decode_all(body).map_err(|c| {
        Error::fatal(format!(
            "WAL segment {} is damaged at byte {} ({}); skipprd stops rather than misread it. Restore the file, or run `skipprd sync --resnapshot`",
            seg.path.display(),
            c.offset + MAGIC.len(),
            c.reason
        ))
    })
}

/// Every record of the segment file `seg`; `None` when the file was removed since it was
/// listed.
pub(super) fn read_file_if_present(seg: &SegmentInfo) -> Result<Option<Vec<Record>>> {
    match std::fs::read(&seg.path) {
        Ok(data) => decode(seg, data).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading WAL segment {}", seg.path.display())),
    }
}
