//! WAL segments as objects (S3 mode): the same segment names and bytes as on local disk,
//! each segment one object, durable when its PUT returns. A PUT is atomic, so a segment is
//! whole or absent and there is no temporary object to clean up after a crash.

use std::path::PathBuf;

use bytes::Bytes;

use super::segment::{parse_name, segment_name, SegmentInfo};
use super::view;
use crate::change::Lsn;
use crate::error::{Context, Result};
use crate::storage::{held, join_key, Store};

/// The segments of one pipeline under `prefix` in `store`.
#[derive(Debug, Clone)]
pub struct ObjectWal {
    store: Store,
    prefix: String,
    /// The pipeline, and whether this handle is its writer: the writer keeps the in-process
    /// view of the segments (see `view.rs`), and readers in the same process use it.
    role: Option<(String, bool)>,
}

impl ObjectWal {
    pub fn new(store: Store, prefix: &str) -> Self {
        Self {
            store,
            prefix: prefix.trim_matches('/').to_string(),
            role: None,
        }
    }

    /// This handle writes (`writer`) or reads the WAL of `pipeline`.
    pub fn with_role(mut self, pipeline: &str, writer: bool) -> Self {
        self.role = Some((pipeline.to_string(), writer));
        self
    }

    /// The view's key: the WAL's full location.
    fn root(&self) -> String {
        self.store.describe(&self.prefix)
    }

    /// Complete segments, oldest first.
    pub fn segments(&self) -> Result<Vec<SegmentInfo>> {
        match &self.role {
            Some((pipeline, false)) => {
                if let Some(known) = view::segments(&self.root(), pipeline) {
                    return Ok(known);
                }
                self.list()
            }
            Some((pipeline, true)) => {
                let root = self.root();
                // Under a hold whose view is complete, the writer knows every segment: it
                // wrote and removed them itself, and no other process writes meanwhile. An
                // idle pipeline polls the WAL often, and each poll was a listing request.
                if let Some(known) = view::segments(&root, pipeline) {
                    return Ok(known);
                }
                let hold = view::begin_listing(&root, pipeline);
                let listed = self.list()?;
                if let Some(hold) = hold {
                    view::listed(&root, hold, &listed);
                }
                Ok(listed)
            }
            None => self.list(),
        }
    }

    /// Lists the segments in the store.
    fn list(&self) -> Result<Vec<SegmentInfo>> {
        let under = format!("{}/", self.prefix);
        let listed = self.store.blocking(self.store.list(&under))?;
        let mut out: Vec<SegmentInfo> = listed
            .into_iter()
            .filter_map(|e| {
                let name = e.key.strip_prefix(&under)?;
                let (first, last) = parse_name(name)?;
                Some(SegmentInfo {
                    path: PathBuf::from(&e.key),
                    first,
                    last,
                    bytes: e.size,
                })
            })
            .collect();
        out.sort_by_key(|s| (s.first, s.last));
        Ok(out)
    }

    /// Writes a segment assembled in the local file `file` (header included), durably.
    pub fn write_segment_file(
        &self,
        first: Lsn,
        last: Lsn,
        file: &std::path::Path,
    ) -> Result<SegmentInfo> {
        let key = join_key(&self.prefix, &segment_name(first, last));
        let bytes = std::fs::metadata(file)
            .with_context(|| format!("reading {}", file.display()))?
            .len();
        let put = self.store.blocking(self.store.put_file(&key, file));
        if put.is_err() && matches!(&self.role, Some((_, true))) {
            view::unsure(&self.root());
        }
        put.with_context(|| {
            format!(
                "cannot write WAL segment {}; nothing was acknowledged, nothing is lost",
                self.store.describe(&key)
            )
        })?;
        let seg = SegmentInfo {
            path: PathBuf::from(key),
            first,
            last,
            bytes,
        };
        if let Some((_, true)) = &self.role {
            view::written(&self.root(), &seg);
        }
        Ok(seg)
    }

    /// The segment's bytes, or `None` when it was removed since it was listed.
    pub fn get(&self, seg: &SegmentInfo) -> Result<Option<Bytes>> {
        let key = seg.path.to_string_lossy();
        let got = self
            .store
            .blocking(self.store.get(&key))
            .with_context(|| format!("reading WAL segment {}", self.store.describe(&key)))?;
        Ok(got.map(|(bytes, _)| bytes))
    }

    /// Copies a segment into `to` range by range, so that a large segment is never held in
    /// memory whole. `false` when it was removed since it was listed.
    pub fn download(&self, seg: &SegmentInfo, to: &mut impl std::io::Write) -> Result<bool> {
        const RANGE: u64 = 4 * 1024 * 1024;
        let key = seg.path.to_string_lossy();
        let what = || format!("reading WAL segment {}", self.store.describe(&key));
        let Some(size) = self
            .store
            .blocking(self.store.size(&key))
            .with_context(what)?
        else {
            return Ok(false);
        };
        let mut at = 0;
        while at < size {
            let end = size.min(at + RANGE);
            let part = self
                .store
                .blocking(self.store.get_range(&key, at..end))
                .with_context(what)?;
            to.write_all(&part).with_context(what)?;
            at = end;
        }
        Ok(true)
    }

    pub fn remove(&self, seg: &SegmentInfo) -> Result<()> {
        let key = seg.path.to_string_lossy();
        let deleted = self.store.blocking(self.store.delete(&key));
        if deleted.is_err() && matches!(&self.role, Some((_, true))) {
            view::unsure(&self.root());
        }
        deleted.with_context(|| format!("removing WAL segment {}", self.store.describe(&key)))?;
        if let Some((_, true)) = &self.role {
            view::removed(&self.root(), seg);
        }
        Ok(())
    }

    /// A small object beside the segments (the acknowledged-position marker), or `None`.
    pub fn get_marker(&self, name: &str) -> Result<Option<Bytes>> {
        let key = join_key(&self.prefix, name);
        let at = self.store.describe(&key);
        if let Some((pipeline, _)) = &self.role {
            if let Some(bytes) = held::get(&at, pipeline) {
                return Ok(bytes);
            }
        }
        let got = self
            .store
            .blocking(self.store.get(&key))
            .with_context(|| format!("reading {at}"))?
            .map(|(bytes, _)| bytes);
        if let Some((pipeline, _)) = &self.role {
            held::read(&at, pipeline, got.clone());
        }
        Ok(got)
    }

    /// Writes a small object beside the segments, durable when the PUT returns.
    pub fn put_marker(&self, name: &str, bytes: Bytes) -> Result<()> {
        let key = join_key(&self.prefix, name);
        self.store
            .blocking(self.store.put(&key, bytes.clone()))
            .with_context(|| format!("writing {}", self.store.describe(&key)))?;
        if let Some((pipeline, true)) = &self.role {
            held::wrote(&self.store.describe(&key), pipeline, Some(bytes));
        }
        Ok(())
    }

    /// Removes a small object beside the segments (absent is fine).
    pub fn remove_marker(&self, name: &str) -> Result<()> {
        let key = join_key(&self.prefix, name);
        self.store
            .blocking(self.store.delete(&key))
            .with_context(|| format!("removing {}", self.store.describe(&key)))?;
        if let Some((pipeline, true)) = &self.role {
            held::wrote(&self.store.describe(&key), pipeline, None);
        }
        Ok(())
    }

    /// How a person names a segment (an `s3://` URL).
    pub fn describe(&self, seg: &SegmentInfo) -> String {
        self.store.describe(&seg.path.to_string_lossy())
    }
}
