//! Catalogs: where Iceberg tables are registered. The local sink uses a sqlite SQL catalog
//! laid out exactly as PyIceberg's `SqlCatalog`, so any Iceberg engine can find our tables.

pub mod sql;

pub use sql::LocalCatalog;

/// The catalog name under which Skippr registers its tables.
pub const CATALOG_NAME: &str = "skippr";
