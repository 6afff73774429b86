//! Source, before the stream: columns that pgoutput would not carry. A column the snapshot
//! copies but the change stream leaves out would land as NULL with every streamed insert and
//! update, so such a table is refused at `discover` and `sync`, naming the column and the
//! ways out, unless the pipeline leaves the column out (`exclude_columns`).

use tokio_postgres::Client;

use super::connect::server_setting;
use crate::change::schema::TableSchema;
use crate::config::{quote_ident, PipelineConfig};
use crate::error::{Context, Result};

/// The first Postgres version the change stream runs on: pgoutput sends logical messages
/// (`messages 'true'`) from 14 on.
pub const MIN_VERSION: i32 = 140_000;
/// The first Postgres version whose pgoutput can send stored generated columns
/// (`publish_generated_columns = stored`).
pub const GENERATED_COLUMNS_VERSION: i32 = 180_000;
/// The first version with publication column lists (`pg_publication_tables.attnames`).
const COLUMN_LISTS_VERSION: i32 = 150_000;

/// `server_version_num` of the source.
pub async fn server_version(client: &Client) -> Result<i32> {
    let v = server_setting(client, "server_version_num").await?;
    v.trim().parse().map_err(|_| {
        crate::error::Error::fatal(format!("server_version_num `{v}` is not a number"))
    })
}

/// [`Uncarried::column`] of a row filter: rows, not a column, are left out.
pub const ROW_FILTER: &str = "(rows)";

/// One column of a followed table that the change stream would not carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncarried {
    pub table: String,
    /// The table as its key under `pipelines.<p>.tables` names it.
    pub key: String,
    pub column: String,
    /// Why, and the ways out.
    pub detail: String,
    /// Only the publication's `publish_generated_columns` setting is missing, which `sync`
    /// sets itself when it may alter the publication.
    pub publication_setting: bool,
}

/// Every followed column the stream would not carry, given the server's version and the
/// publication as it is now (a publication not made yet is made with what it needs).
pub async fn uncarried(
    client: &Client,
    p: &PipelineConfig,
    schemas: &[TableSchema],
    version: i32,
) -> Result<Vec<Uncarried>> {
    let mut out = Vec::new();
    let publishes_generated = publishes_generated(client, &p.source.publication, version).await?;
    for ts in schemas {
        let (listed, row_filter): (Option<Vec<String>>, Option<String>) =
            if version >= COLUMN_LISTS_VERSION {
                client
                    .query_opt(
                        "SELECT attnames::text[], rowfilter FROM pg_publication_tables
                         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                        &[&p.source.publication, &ts.table.schema, &ts.table.name],
                    )
                    .await
                    .context("reading the publication's column lists and row filters")?
                    .map(|r| (r.get(0), r.get(1)))
                    .unwrap_or_default()
            } else {
                (None, None)
            };
        if let Some(filter) = row_filter {
            out.push(Uncarried {
                table: ts.table.to_string(),
                key: ts.table.config_key(),
                column: ROW_FILTER.into(),
                detail: format!(
                    "publication `{}` publishes table {} with a row filter (WHERE {filter}), so changes of rows outside it are never sent and the Iceberg table would drift from the source; remove the filter (ALTER PUBLICATION {} SET TABLE {}) or follow the table through another publication",
                    p.source.publication,
                    ts.table,
                    quote_ident(&p.source.publication),
                    ts.table.quoted()
                ),
                publication_setting: false,
            });
        }
        out.extend(classify(
            p,
            ts,
            version,
            publishes_generated,
            listed.as_deref(),
        ));
    }
    Ok(out)
}

/// The columns of one table the stream would not carry: `publishes_generated` as
/// [`publishes_generated`] says, `listed` the publication's column list for the table.
fn classify(
    p: &PipelineConfig,
    ts: &TableSchema,
    version: i32,
    publishes_generated: Option<bool>,
    listed: Option<&[String]>,
) -> Vec<Uncarried> {
    let mut out = Vec::new();
    let exclude = |c: &str| {
        format!(
            "`pipelines.{}.tables.{}.exclude_columns: [{c}]` (the column stays in Postgres and out of the lake)",
            p.name,
            ts.table.config_key()
        )
    };
    for (column, kind) in &ts.generated {
        let detail = match kind {
            'v' => format!(
                "column `{column}` of table {} is a virtual generated column, which logical replication never sends, so every streamed insert and update would land it as NULL; leave it out with {}",
                ts.table,
                exclude(column)
            ),
            _ if version < GENERATED_COLUMNS_VERSION => format!(
                "column `{column}` of table {} is a stored generated column, which Postgres before 18 does not send through logical replication, so every streamed insert and update would land it as NULL; leave it out with {}, or move to Postgres 18, which sends it",
                ts.table,
                exclude(column)
            ),
            _ if publishes_generated == Some(false) => format!(
                "column `{column}` of table {} is a stored generated column and publication `{}` does not send generated columns; run ALTER PUBLICATION {} SET (publish_generated_columns = stored); or leave it out with {}",
                ts.table,
                p.source.publication,
                quote_ident(&p.source.publication),
                exclude(column)
            ),
            _ => continue,
        };
        out.push(Uncarried {
            table: ts.table.to_string(),
            key: ts.table.config_key(),
            column: column.clone(),
            detail,
            publication_setting: *kind == 's' && version >= GENERATED_COLUMNS_VERSION,
        });
    }
    if let Some(listed) = listed {
        for c in &ts.columns {
            // Before 18 a generated column is refused above; on 18 a stored one must be in
            // the list (a column list wins over publish_generated_columns), a virtual one
            // is refused above.
            let generated = ts.generated.iter().any(|(g, kind)| {
                g == &c.name && (version < GENERATED_COLUMNS_VERSION || *kind == 'v')
            });
            if !listed.contains(&c.name) && !generated {
                out.push(Uncarried {
                    table: ts.table.to_string(),
                key: ts.table.config_key(),
                    column: c.name.clone(),
                    detail: format!(
                        "publication `{}` publishes table {} with a column list that leaves out column `{}`, so every streamed insert and update would land it as NULL; add it to the publication's column list (ALTER PUBLICATION {} SET TABLE ...), or leave it out with {}",
                        p.source.publication,
                        ts.table,
                        c.name,
                        quote_ident(&p.source.publication),
                        exclude(&c.name)
                    ),
                    publication_setting: false,
                });
            }
        }
    }
    out
}

/// Whether the existing publication sends stored generated columns; `None` before Postgres
/// 18 or when the publication does not exist yet.
pub async fn publishes_generated(
    client: &Client,
    publication: &str,
    version: i32,
) -> Result<Option<bool>> {
    if version < GENERATED_COLUMNS_VERSION {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT pubgencols::text FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .context("reading pg_publication.pubgencols")?;
    Ok(row.map(|r| r.get::<_, String>(0) == "s"))
}

/// Whether any followed table has a stored generated column the pipeline keeps.
pub fn keeps_generated(schemas: &[TableSchema]) -> bool {
    schemas
        .iter()
        .any(|ts| ts.generated.iter().any(|(_, kind)| *kind == 's'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::schema::Column;
    use crate::change::types::PgType;
    use crate::testing::assert_contains;

    fn table(columns: &[&str], generated: &[(&str, char)]) -> TableSchema {
        let columns = columns
            .iter()
            .map(|n| Column {
                name: n.to_string(),
                pg_type_name: "integer".into(),
                pg: PgType::Int4,
                fallback: None,
                not_null: false,
                type_oid: 23,
                typmod: -1,
                attnum: 0,
            })
            .collect();
        TableSchema {
            generated: generated.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
            ..TableSchema::for_test("t", columns)
        }
    }

    fn pipeline() -> PipelineConfig {
        let text = "skippr:\n  workspace: w\npipelines:\n  app:\n    data_source: data_sources.db\n    data_sink: data_sinks.lake\n    tables:\n      t:\n        exclude_columns: [b]\ndata_sources:\n  db:\n    Postgres: {host: h, user: u, database: d, tables: [t]}\ndata_sinks:\n  lake:\n    LocalIceberg: {warehouse: ./w}\n";
        let config = crate::config::Config::from_str(
            &std::env::temp_dir().join("skippr.yml"),
            text,
            &|_| None,
        )
        .expect("the test config loads");
        let p = config.pipelines[0].clone();
        let t = crate::config::TableRef::parse("t").expect("a table name");
        assert_eq!(p.source.excluded(&t), ["b".to_string()]);
        p
    }

    #[test]
    fn a_stored_generated_column_is_refused_before_18_and_carried_on_18() {
        let p = pipeline();
        let ts = table(&["id", "a", "b"], &[("b", 's')]);
        let before = classify(&p, &ts, 170_000, None, None);
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].column, "b");
        assert_contains(&before[0].detail, &["exclude_columns: [b]", "Postgres 18"]);
        assert!(classify(&p, &ts, 180_000, Some(true), None).is_empty());
        assert!(classify(&p, &ts, 180_000, None, None).is_empty());
        let off = classify(&p, &ts, 180_000, Some(false), None);
        assert!(off[0].detail.contains("publish_generated_columns = stored"));
        // A virtual one is never sent.
        let virt = table(&["id", "a", "v"], &[("v", 'v')]);
        assert_eq!(classify(&p, &virt, 180_000, Some(true), None).len(), 1);
        // Excluded, it is no longer the table's.
        let mut excluded = ts.clone();
        excluded.exclude(&["b".to_string()]);
        assert!(classify(&p, &excluded, 150_000, None, None).is_empty());
        assert!(!keeps_generated(&[excluded]));
    }

    #[test]
    fn a_column_list_that_leaves_a_column_out_is_refused() {
        let p = pipeline();
        let ts = table(&["id", "a", "c"], &[]);
        let listed = vec!["id".to_string(), "a".to_string()];
        let out = classify(&p, &ts, 150_000, None, Some(&listed));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].column, "c");
        assert!(out[0].detail.contains("column list"));
        // On 18 a stored generated column left out of the list is not carried either.
        let gen = table(&["id", "a", "b"], &[("b", 's')]);
        let out = classify(&p, &gen, 180_000, Some(true), Some(&listed));
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].detail.contains("column list"));
    }
}
