//! Sink, before a commit: data files written for a snapshot that has not been committed yet
//! (the chunks of a copy under way), listed in a manifest of their own in the table's
//! metadata folder and made durable, so that a process that dies before the commit finds
//! them again instead of copying their rows once more.

use iceberg::spec::{DataFile, Manifest, ManifestWriterBuilder};
use iceberg::table::Table;

use super::durable::sync_files;
use crate::error::{Context, Error, Result};

/// Writes a manifest named `name` listing `files` (written under the table's current
/// partition spec), and makes the files and the manifest durable; returns its location.
pub async fn write_manifest(table: &Table, files: &[DataFile], name: &str) -> Result<String> {
    let meta = table.metadata();
    let path = format!("{}/metadata/{name}.avro", meta.location());
    let out = table
        .file_io()
        .new_output(&path)
        .with_context(|| format!("opening {path}"))?;
    let spec = meta.default_partition_spec().as_ref().clone();
    let mut writer =
        ManifestWriterBuilder::new(out, None, meta.current_schema().clone(), spec).build_v2_data();
    for f in files {
        writer
            .add_file(f.clone(), -1)
            .with_context(|| format!("listing {} in {path}", f.file_path()))?;
    }
    writer
        .write_manifest_file()
        .await
        .with_context(|| format!("writing {path}"))?;
    sync_files(
        files
            .iter()
            .map(|f| f.file_path())
            .chain(std::iter::once(path.as_str())),
    )?;
    Ok(path)
}

/// The data files a manifest of [`write_manifest`] lists, each checked to exist still.
pub async fn read_manifest(table: &Table, path: &str) -> Result<Vec<DataFile>> {
    let io = table.file_io();
    let bytes = io
        .new_input(path)
        .with_context(|| format!("opening {path}"))?
        .read()
        .await
        .with_context(|| format!("reading {path}"))?;
    let manifest = Manifest::parse_avro(&bytes).with_context(|| format!("reading {path}"))?;
    let mut files = Vec::new();
    for entry in manifest.entries() {
        let file = entry.data_file().clone();
        let there = io
            .exists(file.file_path())
            .await
            .with_context(|| format!("looking for {}", file.file_path()))?;
        if !there {
            return Err(Error::fatal(format!(
                "{} lists {}, which no longer exists",
                path,
                file.file_path()
            )));
        }
        files.push(file);
    }
    Ok(files)
}

/// Removes manifests of [`write_manifest`] once their files are committed (or given up):
/// nothing reads them any more. A failure only leaves a small file behind.
pub async fn remove_manifests(table: &Table, paths: impl IntoIterator<Item = String>) {
    for path in paths {
        if let Err(e) = table.file_io().delete(&path).await {
            tracing::warn!(manifest = %path, error = %e, "could not remove the manifest of a copied chunk");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch, StringArray};

    use super::*;
    use crate::sink::iceberg::writer::TableWriter;

    #[tokio::test]
    async fn files_listed_before_a_commit_are_found_again() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (_catalog, _schema, table) = crate::testing::items_table(dir.path()).await?;
        let arrow = crate::table::schema::arrow_schema(&table)?;
        let mut writer = TableWriter::new(&table, "snap-test-0000".into(), 1 << 20).await?;
        writer
            .write(RecordBatch::try_new(
                arrow.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..10)),
                    Arc::new(StringArray::from_iter_values(
                        (0..10).map(|i| format!("n{i}")),
                    )),
                ],
            )?)
            .await?;
        let (files, rows) = writer.close().await?;
        assert_eq!(rows, 10);
        let path = write_manifest(&table, &files, "copy-test-00000").await?;
        let back = read_manifest(&table, &path).await?;
        assert_eq!(back.len(), files.len());
        assert_eq!(back[0].file_path(), files[0].file_path());
        assert_eq!(back[0].record_count(), 10);
        // A listed file that is gone makes the manifest unusable, never half-read.
        let local = files[0]
            .file_path()
            .strip_prefix("file://")
            .ok_or_else(|| Error::fatal("a local file"))?;
        std::fs::remove_file(local)?;
        let err = read_manifest(&table, &path).await.unwrap_err();
        assert!(err.to_string().contains("no longer exists"), "{err}");
        remove_manifests(&table, [path.clone()]).await;
        assert!(read_manifest(&table, &path).await.is_err());
        Ok(())
    }
}
