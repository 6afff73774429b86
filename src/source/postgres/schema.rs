//! Reads a source table's shape from the Postgres catalog: columns and their types (through
//! domains and arrays), the primary key, the replica identity and the size. Discovery prints
//! it; the snapshot and the Iceberg schema are built from it.

use tokio_postgres::Client;

pub use crate::change::schema::{Column, TableSchema};
use crate::change::types::{Mapping, PgType, TypeInfo};
use crate::config::TableRef;
use crate::error::{Context, Error, Result};

// A partitioned table has no storage of its own: its size is that of its partitions (the
// largest one for the blocks, which only decide how the copy is split).
const TABLE_SQL: &str = "
SELECT c.oid, c.relkind::text, c.relreplident::text,
       CASE WHEN c.relkind = 'p' THEN
         (SELECT coalesce(sum(greatest(p.reltuples, 0)), 0)::bigint
          FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid WHERE t.isleaf)
       ELSE c.reltuples::bigint END,
       (CASE WHEN c.relkind = 'p' THEN
         (SELECT coalesce(max(pg_relation_size(t.relid)), 0)
          FROM pg_partition_tree(c.oid) t WHERE t.isleaf)
       ELSE pg_relation_size(c.oid) END / current_setting('block_size')::bigint)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2";

const PARTITIONS_SQL: &str = "
SELECT n.nspname::text || '.' || c.relname::text || ' ' || c.oid::text || ' ' || i.xmin::text
       || ' ' || c.relfilenode::text
FROM pg_partition_tree($1::oid::regclass) t
JOIN pg_class c ON c.oid = t.relid::oid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_inherits i ON i.inhrelid = t.relid::oid
WHERE t.level > 0
ORDER BY 1";

const ANCESTORS_SQL: &str = "
SELECT n.nspname::text, c.relname::text
FROM pg_partition_ancestors($1::oid::regclass) WITH ORDINALITY AS a(relid, ord)
JOIN pg_class c ON c.oid = a.relid::oid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE a.relid::oid <> $1::oid
ORDER BY a.ord";

// Columns with their type resolved through domains; arrays expose their element type.
const COLUMNS_SQL: &str = "
WITH RECURSIVE cols AS (
  SELECT a.attnum, a.attname::text AS attname, format_type(a.atttypid, a.atttypmod) AS type_name,
         a.attnotnull, a.atttypid AS tid, a.atttypmod AS tmod, 0 AS depth,
         a.atttypid AS decl_oid, a.atttypmod AS decl_mod, a.attgenerated::text AS gen
  FROM pg_attribute a
  WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT c.attnum, c.attname, c.type_name, c.attnotnull, t.typbasetype,
         CASE WHEN c.tmod = -1 THEN t.typtypmod ELSE c.tmod END, c.depth + 1,
         c.decl_oid, c.decl_mod, c.gen
  FROM cols c JOIN pg_type t ON t.oid = c.tid
  WHERE t.typtype = 'd' AND c.depth < 16
)
SELECT DISTINCT ON (c.attnum) c.attnum, c.attname, c.type_name, c.attnotnull,
       t.oid, c.tmod, t.typtype::text, e.oid, e.typtype::text, t.typcategory::text,
       c.decl_oid, c.decl_mod, c.gen
FROM cols c
JOIN pg_type t ON t.oid = c.tid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
ORDER BY c.attnum, c.depth DESC";

const PK_SQL: &str = "
SELECT a.attname::text
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND i.indisprimary
ORDER BY k.ord";

/// Reads the schema of `table`. A missing table is an error that names it.
pub async fn describe(client: &Client, table: &TableRef) -> Result<TableSchema> {
    let row = client
        .query_opt(TABLE_SQL, &[&table.schema, &table.name])
        .await
        .with_context(|| format!("reading the catalog entry of table {table}"))?;
    let Some(row) = row else {
        return Err(Error::source_err(format!(
            "table {table} does not exist in the source database (or this user cannot see it); create it, or remove it from `tables:` in skippr.yml"
        )));
    };
    let oid: u32 = row.get(0);
    let relkind: String = row.get(1);
    if relkind != "r" && relkind != "p" {
        return Err(Error::source_err(format!(
            "{table} is not a table (relkind `{relkind}`): only ordinary and partitioned tables can be replicated"
        )));
    }
    let ident: String = row.get(2);
    let replica_identity = match ident.as_str() {
        "d" => "default",
        "f" => "full",
        "i" => "index",
        "n" => "nothing",
        _ => "unknown",
    }
    .to_string();
    let row_estimate: i64 = row.get(3);
    let blocks: i64 = row.get(4);

    let rows = client
        .query(COLUMNS_SQL, &[&oid])
        .await
        .with_context(|| format!("reading the columns of table {table}"))?;
    let mut columns = Vec::with_capacity(rows.len());
    let mut generated = Vec::new();
    for r in rows {
        let gen: String = r.get(12);
        if let Some(kind) = gen.chars().next() {
            generated.push((r.get::<_, String>(1), kind));
        }
        let info = type_info(&r, 4);
        let Mapping { pg, fallback } = PgType::from_info(&info);
        columns.push(Column {
            name: r.get(1),
            pg_type_name: r.get(2),
            pg,
            fallback,
            not_null: r.get(3),
            type_oid: r.get(10),
            typmod: r.get(11),
            attnum: r.get(0),
        });
    }
    let primary_key = client
        .query(PK_SQL, &[&oid])
        .await
        .with_context(|| format!("reading the primary key of table {table}"))?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let partitioned = relkind == "p";
    let partitions = if partitioned {
        client
            .query(PARTITIONS_SQL, &[&oid])
            .await
            .with_context(|| format!("reading the partitions of table {table}"))?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect()
    } else {
        Vec::new()
    };
    let partition_of = client
        .query(ANCESTORS_SQL, &[&oid])
        .await
        .with_context(|| format!("reading the partitioned tables above {table}"))?
        .iter()
        .map(|r| TableRef {
            schema: r.get(0),
            name: r.get(1),
        })
        .collect();
    Ok(TableSchema {
        table: table.clone(),
        oid,
        columns,
        primary_key,
        replica_identity,
        row_estimate: row_estimate.max(0),
        blocks,
        partitioned,
        partitions,
        partition_of,
        generated,
    })
}

/// Reads the schema of `table` as the pipeline follows it: without the columns its
/// `exclude_columns` leaves out. An excluded column the table does not have, or one of its
/// primary key, is refused by name.
pub async fn describe_followed(
    client: &Client,
    p: &crate::config::PipelineConfig,
    table: &TableRef,
) -> Result<TableSchema> {
    let mut ts = describe(client, table).await?;
    let excluded = p.source.excluded(table);
    let pipeline = &p.name;
    let key = table.config_key();
    for name in excluded {
        if !ts.columns.iter().any(|c| &c.name == name) {
            return Err(Error::config(format!(
                "pipelines.{pipeline}.tables.{key}.exclude_columns names `{name}`, which table {table} does not have (its columns: {}); correct or remove the entry",
                ts.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        if ts.primary_key.contains(name) {
            return Err(Error::config(format!(
                "pipelines.{pipeline}.tables.{key}.exclude_columns names `{name}`, a column of the table's primary key: rows are merged by their key, so it must be kept; remove the entry"
            )));
        }
    }
    ts.exclude(excluded);
    Ok(ts)
}

/// Refuses a partition listed in `tables:` together with a partitioned table above it: its
/// rows are already followed through that table, and would land twice.
pub fn check_partition_overlap(schemas: &[TableSchema]) -> Result<()> {
    for ts in schemas {
        if let Some(parent) = ts
            .partition_of
            .iter()
            .find(|a| schemas.iter().any(|o| &o.table == *a))
        {
            return Err(Error::source_err(format!(
                "table {} is a partition of {parent}, which is also in `tables:`; its rows are already followed (and copied) through {parent}, so they would land twice: remove {} from `tables:` in skippr.yml",
                ts.table, ts.table
            )));
        }
    }
    Ok(())
}

/// Reads a resolved type from five consecutive columns starting at `at`: oid, typmod,
/// typtype, element oid (arrays), element typtype.
pub(super) fn type_info(r: &tokio_postgres::Row, at: usize) -> TypeInfo {
    let first = |s: Option<String>| s.as_deref().and_then(|s| s.chars().next()).unwrap_or('b');
    let typmod: i32 = r.get(at + 1);
    let elem_oid: Option<u32> = r.get(at + 3);
    TypeInfo {
        oid: r.get(at),
        typmod,
        typtype: first(r.get(at + 2)),
        element: elem_oid.map(|oid| {
            Box::new(TypeInfo {
                oid,
                // An array column's typmod applies to its elements.
                typmod,
                typtype: first(r.get(at + 4)),
                element: None,
            })
        }),
    }
}
