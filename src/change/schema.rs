//! A source table's shape as the stages after the source need it: its columns with their
//! types, primary key, replica identity, size and partitions. The source reads it from the
//! catalog (`source::postgres::schema`); the snapshot and the Iceberg schema are built from it.

use super::table::TableRef;
use crate::change::types::PgType;

/// One column of a source table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    /// `format_type()` as Postgres prints it, e.g. `numeric(12,2)`.
    pub pg_type_name: String,
    pub pg: PgType,
    /// Set when the column travels as text because Iceberg has no matching type.
    pub fallback: Option<&'static str>,
    pub not_null: bool,
    /// The declared type (a domain, not its base) and modifier, as the change stream reports them.
    pub type_oid: u32,
    pub typmod: i32,
    /// The column's number (`attnum`).
    pub attnum: i16,
}

/// A source table as the catalog describes it.
#[derive(Debug, Clone)]
pub struct TableSchema {
    pub table: TableRef,
    pub oid: u32,
    pub columns: Vec<Column>,
    pub primary_key: Vec<String>,
    /// `default`, `full`, `index` or `nothing`.
    pub replica_identity: String,
    pub row_estimate: i64,
    pub blocks: i64,
    /// A partitioned table: its rows live in its partitions, and the publication must
    /// publish them under its own name (`publish_via_partition_root`).
    pub partitioned: bool,
    /// For a partitioned table, every partition at any level as `schema.name oid xmin
    /// relfilenode` (`xmin` of its `pg_inherits` row), sorted. ATTACH and DETACH PARTITION
    /// change this list but send nothing through replication; detaching and re-attaching the
    /// same partition still changes its `xmin`. A TRUNCATE of one partition, which Postgres
    /// does not publish through the partitioned table, gives it a new `relfilenode`.
    pub partitions: Vec<String>,
    /// For a partition: the partitioned tables above it, nearest first.
    pub partition_of: Vec<TableRef>,
    /// Generated columns with their kind (`s` stored, `v` virtual), as `pg_attribute`'s
    /// `attgenerated` says.
    pub generated: Vec<(String, char)>,
}

#[cfg(test)]
impl Column {
    /// A test column `name` of type `pg` (`pg_type_name` as `format_type` gives it), nullable,
    /// with no type oid, modifier or position known.
    pub fn for_test(name: &str, pg: PgType, pg_type_name: &str) -> Self {
        Self {
            name: name.into(),
            pg_type_name: pg_type_name.into(),
            pg,
            fallback: None,
            not_null: false,
            type_oid: 0,
            typmod: -1,
            attnum: 0,
        }
    }
}

#[cfg(test)]
impl TableSchema {
    /// A test table `name` (oid 1) of `columns`, keyed by `id`, with its replica identity
    /// `default` and nothing else known.
    pub fn for_test(name: &str, columns: Vec<Column>) -> Self {
        Self {
            table: TableRef::parse(name).expect("a table name"),
            oid: 1,
            columns,
            primary_key: vec!["id".into()],
            replica_identity: "default".into(),
            row_estimate: 0,
            blocks: 0,
            partitioned: false,
            partitions: Vec::new(),
            partition_of: Vec::new(),
            generated: Vec::new(),
        }
    }
}

impl TableSchema {
    /// Leaves the named columns out.
    pub fn exclude(&mut self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        self.columns.retain(|c| !names.contains(&c.name));
        self.generated.retain(|(c, _)| !names.contains(c));
    }
}
