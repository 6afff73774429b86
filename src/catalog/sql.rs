//! The embedded SQL catalog (`<warehouse>/catalog.db`, sqlite) for the `LocalIceberg` sink.
//! PyIceberg opens it with
//! `SqlCatalog("skippr", uri="sqlite:///<warehouse>/catalog.db", warehouse="file://<warehouse>")`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::LocalFsStorageFactory;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableIdent};
use iceberg_catalog_sql::{SqlCatalog, SqlCatalogBuilder};

use super::CATALOG_NAME;
use crate::error::{Context, Error, ErrorKind, Result};

/// The local warehouse folder and its catalog.
#[derive(Clone, Debug)]
pub struct LocalCatalog {
    pub warehouse: PathBuf,
    pub catalog: Arc<SqlCatalog>,
    db: PathBuf,
}

impl LocalCatalog {
    /// Opens (creating when missing) the warehouse folder and its catalog.
    pub async fn open(warehouse: &Path) -> Result<Self> {
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
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(Arc::new(LocalFsStorageFactory))
            .load(CATALOG_NAME, props)
            .await
            .with_context(|| format!("cannot open the Iceberg catalog {}", db.display()))?;
        Ok(Self {
            warehouse,
            catalog: Arc::new(catalog),
            db,
        })
    }

    /// Creates the namespace (the workspace) when missing.
    pub async fn ensure_namespace(&self, namespace: &str) -> Result<NamespaceIdent> {
        let ns = NamespaceIdent::new(namespace.to_string());
        if !self
            .catalog
            .namespace_exists(&ns)
            .await
            .context("checking the workspace namespace")?
        {
            self.catalog
                .create_namespace(&ns, HashMap::new())
                .await
                .with_context(|| format!("creating namespace `{namespace}` in the catalog"))?;
        }
        Ok(ns)
    }

    /// Points `ident` at `new` if it still points at `old`: the atomic step of a commit,
    /// the same compare-and-swap PyIceberg and the SQL catalog perform.
    pub async fn swap_metadata(&self, ident: &TableIdent, old: &str, new: &str) -> Result<()> {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&self.db)
            .busy_timeout(std::time::Duration::from_secs(30))
            .connect()
            .await
            .with_context(|| format!("opening the catalog {}", self.db.display()))?;
        let done = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ?
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
        )
        .bind(new)
        .bind(old)
        .bind(CATALOG_NAME)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .bind(old)
        .execute(&mut conn)
        .await
        .with_context(|| format!("committing to Iceberg table {ident}"))?;
        if done.rows_affected() != 1 {
            return Err(Error::new(
                ErrorKind::Retryable,
                format!("Iceberg table {ident} was changed by another writer during a commit; the commit was not applied and will be retried"),
            ));
        }
        Ok(())
    }
}
