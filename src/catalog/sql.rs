//! The embedded SQL catalog (`<warehouse>/catalog.db`, sqlite) for the `LocalIceberg` sink.
//! PyIceberg opens it with
//! `SqlCatalog("skippr", uri="sqlite:///<warehouse>/catalog.db", warehouse="file://<warehouse>")`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::LocalFsStorageFactory;
use iceberg::{Catalog, CatalogBuilder, TableIdent};
use iceberg_catalog_sql::{SqlCatalog, SqlCatalogBuilder};

use super::CATALOG_NAME;
use crate::error::{Context, Error, ErrorKind, Result};

/// The sqlite side of a commit: where a table's metadata pointer is read and swapped.
#[derive(Clone, Debug)]
pub struct SqlPointer {
    db: PathBuf,
    /// Read-only connections for the metadata-location lookups of queries.
    reader: Arc<tokio::sync::OnceCell<sqlx::SqlitePool>>,
}

/// Opens (creating when missing) the warehouse folder and its catalog.
pub(super) async fn open(warehouse: &Path) -> Result<(Arc<dyn Catalog>, SqlPointer)> {
    std::fs::create_dir_all(warehouse).with_context(|| {
        format!(
            "cannot create the warehouse folder {}; check the `warehouse` path and its permissions",
            warehouse.display()
        )
    })?;
    let warehouse = std::fs::canonicalize(warehouse).with_context(|| {
        format!(
            "cannot resolve the warehouse folder {}",
            warehouse.display()
        )
    })?;
    let db = warehouse.join("catalog.db");
    let props = HashMap::from([
        (
            "uri".to_string(),
            format!("sqlite:{}?mode=rwc", db.display()),
        ),
        (
            "warehouse".to_string(),
            format!("file://{}", warehouse.display()),
        ),
    ]);
    let catalog: SqlCatalog = SqlCatalogBuilder::default()
        .with_storage_factory(Arc::new(LocalFsStorageFactory))
        .load(CATALOG_NAME, props)
        .await
        .with_context(|| format!("cannot open the Iceberg catalog {}", db.display()))?;
    Ok((
        Arc::new(catalog),
        SqlPointer {
            db,
            reader: Arc::default(),
        },
    ))
}

impl SqlPointer {
    /// The catalog's database file.
    pub(super) fn db(&self) -> &Path {
        &self.db
    }

    /// Where the catalog points `ident` now, or `None` when it has no such table.
    pub(super) async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        use sqlx::Row;
        let pool = self
            .reader
            .get_or_try_init(|| async {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&self.db)
                    .read_only(true)
                    .busy_timeout(std::time::Duration::from_secs(30));
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect_with(options)
                    .await
            })
            .await
            .with_context(|| format!("opening the catalog {}", self.db.display()))?;
        let row = sqlx::query(
            "SELECT metadata_location FROM iceberg_tables
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?",
        )
        .bind(CATALOG_NAME)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .fetch_optional(pool)
        .await
        .with_context(|| format!("reading the catalog entry of {ident}"))?;
        row.map(|r| r.try_get::<Option<String>, _>(0))
            .transpose()
            .with_context(|| format!("reading the catalog entry of {ident}"))
            .map(Option::flatten)
    }

    /// Points `ident` at `new` if it still points at `old`: the atomic step of a commit,
    /// the same compare-and-swap PyIceberg and the SQL catalog perform.
    pub(super) async fn swap(&self, ident: &TableIdent, old: &str, new: &str) -> Result<()> {
        self.swap_all(&[(ident, old, new)]).await
    }

    /// Several compare-and-swaps (`ident`, `old`, `new`) in one transaction: every table
    /// moves to its new metadata, or none does.
    pub(super) async fn swap_all(&self, swaps: &[(&TableIdent, &str, &str)]) -> Result<()> {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&self.db)
            .busy_timeout(std::time::Duration::from_secs(30))
            .connect()
            .await
            .with_context(|| format!("opening the catalog {}", self.db.display()))?;
        let names = || {
            swaps
                .iter()
                .map(|(i, _, _)| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut tx = conn
            .begin()
            .await
            .with_context(|| format!("starting a commit to Iceberg tables {}", names()))?;
        for (ident, old, new) in swaps {
            let done = sqlx::query(
                "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ?
                 WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
            )
            .bind(*new)
            .bind(*old)
            .bind(CATALOG_NAME)
            .bind(ident.namespace().join("."))
            .bind(ident.name())
            .bind(*old)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("committing to Iceberg table {ident}"))?;
            if done.rows_affected() != 1 {
                // Dropping the transaction rolls it back: no table of it moved.
                return Err(Error::new(
                    ErrorKind::Retryable,
                    format!("Iceberg table {ident} was changed by another writer during a commit; the commit was not applied and will be retried"),
                ));
            }
        }
        tx.commit()
            .await
            .with_context(|| format!("committing to Iceberg tables {}", names()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::LocalCatalog;
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    use iceberg::TableCreation;

    #[tokio::test]
    async fn a_reused_table_follows_the_catalog() -> Result<()> {
        let dir = tempfile::tempdir().context("temp dir")?;
        let catalog = LocalCatalog::open(dir.path()).await?;
        let ns = catalog.ensure_namespace("ws").await?;
        let schema = Schema::builder()
            .with_fields(vec![NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            )
            .into()])
            .build()?;
        let created = catalog
            .catalog
            .create_table(
                &ns,
                TableCreation::builder()
                    .name("t".into())
                    .schema(schema)
                    .build(),
            )
            .await?;
        let ident = created.identifier().clone();
        let first = catalog.load_current(&ident).await?;
        let again = catalog.load_current(&ident).await?;
        assert_eq!(first.metadata_location(), again.metadata_location());

        // Another writer commits: the catalog now names a new metadata file.
        let old = first
            .metadata_location()
            .ok_or_else(|| Error::fatal("no metadata location"))?
            .to_string();
        let new = old.replace(".metadata.json", "-next.metadata.json");
        std::fs::copy(
            old.trim_start_matches("file://"),
            new.trim_start_matches("file://"),
        )
        .context("copying the metadata file")?;
        catalog.swap_metadata(&ident, &old, &new).await?;
        let after = catalog.load_current(&ident).await?;
        assert_eq!(after.metadata_location(), Some(new.as_str()));

        // A table the catalog does not have is an error, not a stale answer.
        catalog
            .catalog
            .drop_table(&ident)
            .await
            .context("dropping the table")?;
        assert!(catalog.load_current(&ident).await.is_err());
        Ok(())
    }
}
