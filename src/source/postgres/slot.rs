//! Replication slots and publications: the source-side state that lets CDC resume exactly
//! where the snapshot (or the last acknowledged change) ended.

use pgwire_replication::ReplicationClient;
use tokio_postgres::Client;

use super::connect::replication_session;
use crate::change::Lsn;
use crate::config::{quote_ident, PostgresConfig, TableRef};
use crate::error::{replication_kind, Context, Error, Result};

/// A slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub wal_status: Option<String>,
    pub confirmed_flush: Option<Lsn>,
    pub active: bool,
}

pub async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>> {
    let row = client
        .query_opt(
            "SELECT plugin::text, database::text, wal_status, confirmed_flush_lsn::text, active
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .context("reading pg_replication_slots")?;
    Ok(row.map(|r| SlotInfo {
        plugin: r.get(0),
        database: r.get(1),
        wal_status: r.get(2),
        confirmed_flush: r
            .get::<_, Option<String>>(3)
            .and_then(|s| Lsn::parse(&s).ok()),
        active: r.get(4),
    }))
}

/// Tables of `publication`, or `None` when it does not exist.
pub async fn publication_tables(
    client: &Client,
    publication: &str,
) -> Result<Option<Vec<TableRef>>> {
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .context("reading pg_publication")?;
    if exists.is_none() {
        return Ok(None);
    }
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await
        .context("reading pg_publication_tables")?;
    Ok(Some(
        rows.iter()
            .map(|r| TableRef {
                schema: r.get(0),
                name: r.get(1),
            })
            .collect(),
    ))
}

/// Whether `publication` publishes the changes of partitions under the name of their
/// partitioned table (`publish_via_partition_root`); `None` when it does not exist.
pub async fn publication_via_root(client: &Client, publication: &str) -> Result<Option<bool>> {
    Ok(client
        .query_opt(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .context("reading pg_publication")?
        .map(|r| r.get(0)))
}

/// The SQL that makes an existing publication publish partitions through their partitioned
/// table.
pub fn via_root_fix_sql(publication: &str) -> String {
    format!(
        "ALTER PUBLICATION {} SET (publish_via_partition_root = true);",
        quote_ident(publication)
    )
}

/// The SQL that creates the publication, or adds the missing tables to it. With `via_root`
/// (a partitioned table is followed) a new publication publishes the changes of partitions
/// under their partitioned table's name, the one table skipprd follows.
pub fn publication_fix_sql(
    publication: &str,
    existing: Option<&[TableRef]>,
    tables: &[TableRef],
    via_root: bool,
) -> Option<String> {
    match existing {
        None => Some(format!(
            "CREATE PUBLICATION {} FOR TABLE {}{};",
            quote_ident(publication),
            tables
                .iter()
                .map(TableRef::quoted)
                .collect::<Vec<_>>()
                .join(", "),
            if via_root {
                " WITH (publish_via_partition_root = true)"
            } else {
                ""
            }
        )),
        Some(have) => {
            let missing: Vec<_> = tables.iter().filter(|t| !have.contains(t)).collect();
            if missing.is_empty() {
                None
            } else {
                Some(format!(
                    "ALTER PUBLICATION {} ADD TABLE {};",
                    quote_ident(publication),
                    missing
                        .iter()
                        .map(|t| t.quoted())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
    }
}

/// Creates the publication or adds missing tables. Without the privilege, the error says
/// exactly what to run. `via_root`: a partitioned table is followed (see
/// [`publication_fix_sql`]); an existing publication must then already publish through the
/// root, which the caller checks first (see [`publication_via_root`]).
pub async fn ensure_publication(
    client: &Client,
    cfg: &PostgresConfig,
    via_root: bool,
) -> Result<()> {
    let existing = publication_tables(client, &cfg.publication).await?;
    let Some(sql) =
        publication_fix_sql(&cfg.publication, existing.as_deref(), &cfg.tables, via_root)
    else {
        return Ok(());
    };
    client.batch_execute(&sql).await.map_err(|e| {
        let reason = Error::from(e);
        Error::new(
            reason.kind(),
            format!(
                "cannot set up publication `{}` ({}); ask a table owner or superuser to run: {sql}",
                cfg.publication,
                reason.message()
            ),
        )
    })?;
    tracing::info!(publication = %cfg.publication, "publication ready");
    Ok(())
}

/// A slot just created with an exported snapshot. Keep `session` alive and idle while other
/// connections import `snapshot_name`; the snapshot ends when the session starts streaming
/// or closes.
pub struct ExportedSlot {
    pub session: ReplicationClient,
    pub consistent_point: Lsn,
    pub snapshot_name: String,
}

/// Creates a logical slot with the pgoutput plugin and exports its snapshot.
pub async fn create_slot_exporting_snapshot(
    cfg: &PostgresConfig,
    slot: &str,
    temporary: bool,
) -> Result<ExportedSlot> {
    let rc = replication_session(cfg, slot).await?;
    let mut session = ReplicationClient::connect_gated(rc).await.map_err(|e| {
        Error::new(
            replication_kind(&e),
            format!(
                "cannot open a replication connection to {}:{} as `{}`: {e}; the user needs the REPLICATION privilege (ALTER ROLE {} WITH REPLICATION;) and pg_hba.conf must allow it",
                cfg.host, cfg.port, cfg.user, quote_ident(&cfg.user)
            ),
        )
    })?;
    // The pre-Postgres-15 syntax is still accepted by every current version.
    let sql = format!(
        "CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput EXPORT_SNAPSHOT",
        quote_ident(slot),
        if temporary { "TEMPORARY " } else { "" }
    );
    let rows = session.simple_query(&sql).await.map_err(|e| {
        Error::new(
            replication_kind(&e),
            format!("cannot create replication slot `{slot}`: {e}; check max_replication_slots and that wal_level = logical"),
        )
    })?;
    let row = rows
        .into_iter()
        .next()
        .ok_or_else(|| Error::fatal("CREATE_REPLICATION_SLOT returned no row"))?;
    let text = |i: usize| -> Result<String> {
        row.get(i)
            .and_then(|v| v.as_ref())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| Error::fatal(format!("CREATE_REPLICATION_SLOT returned no column {i}")))
    };
    let consistent_point = Lsn::parse(&text(1)?).map_err(Error::fatal)?;
    let snapshot_name = text(2)?;
    tracing::info!(slot, %consistent_point, temporary, "replication slot created");
    Ok(ExportedSlot {
        session,
        consistent_point,
        snapshot_name,
    })
}

/// Moves the slot's confirmed position to `lsn` (everything before it is durable in the
/// WAL), so Postgres can recycle what it no longer needs. The stream's own status updates
/// do this while it runs; this makes the last one certain when a session ends. The slot may
/// still be held for a moment by the session that just closed, so this retries briefly.
pub async fn advance_slot(client: &Client, slot: &str, lsn: Lsn) -> Result<()> {
    if lsn == Lsn::default() {
        return Ok(());
    }
    let target = lsn.to_string();
    tracing::debug!(slot, %lsn, "acknowledging on the slot");
    let mut last_err = None;
    for _ in 0..50 {
        let res = client
            .query_opt(
                "SELECT pg_replication_slot_advance(slot_name, $2::text::pg_lsn)::text
                 FROM pg_replication_slots
                 WHERE slot_name = $1 AND confirmed_flush_lsn < $2::text::pg_lsn",
                &[&slot, &target],
            )
            .await;
        match res {
            Ok(row) => {
                tracing::debug!(slot, advanced = row.is_some(), "slot acknowledgement done");
                return Ok(());
            }
            Err(e) => {
                last_err = Some(e);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
    match last_err {
        Some(e) => Err(Error::from(e))
            .with_context(|| format!("acknowledging {lsn} on replication slot `{slot}`")),
        None => Ok(()),
    }
}
