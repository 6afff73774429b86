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

/// What a new publication must be created with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublicationOptions {
    /// A partitioned table is followed: publish its partitions' changes under its name.
    pub via_root: bool,
    /// A followed table keeps a stored generated column (Postgres 18): send its values.
    pub generated_columns: bool,
}

impl PublicationOptions {
    fn with_clause(self) -> String {
        let mut with = Vec::new();
        if self.via_root {
            with.push("publish_via_partition_root = true");
        }
        if self.generated_columns {
            with.push("publish_generated_columns = stored");
        }
        if with.is_empty() {
            String::new()
        } else {
            format!(" WITH ({})", with.join(", "))
        }
    }
}

/// The SQL that makes an existing publication send stored generated columns (Postgres 18).
pub fn generated_columns_fix_sql(publication: &str) -> String {
    format!(
        "ALTER PUBLICATION {} SET (publish_generated_columns = stored);",
        quote_ident(publication)
    )
}

/// The first Postgres version that creates failover slots (`FAILOVER`).
pub const FAILOVER_SLOTS_VERSION: i32 = 170_000;

/// The SQL that creates the publication, or adds the missing tables to it. With `via_root`
/// (a partitioned table is followed) a new publication publishes the changes of partitions
/// under their partitioned table's name, the one table skipprd follows.
pub fn publication_fix_sql(
    publication: &str,
    existing: Option<&[TableRef]>,
    tables: &[TableRef],
    options: PublicationOptions,
) -> Option<String> {
    match existing {
        None => Some(format!(
            "CREATE PUBLICATION {} FOR TABLE {}{}; COMMENT ON PUBLICATION {} IS '{PUBLICATION_COMMENT}';",
            quote_ident(publication),
            tables
                .iter()
                .map(TableRef::quoted)
                .collect::<Vec<_>>()
                .join(", "),
            options.with_clause(),
            quote_ident(publication),
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

/// Creates the publication or adds missing tables (and, on Postgres 18, makes it send
/// stored generated columns when a followed table keeps one). Without the privilege, the
/// error says exactly what to run. With `options.via_root` (a partitioned table is
/// followed), an existing publication must already publish through the root, which the
/// caller checks first (see [`publication_via_root`]).
pub async fn ensure_publication(
    client: &Client,
    cfg: &PostgresConfig,
    options: PublicationOptions,
) -> Result<()> {
    let existing = publication_tables(client, &cfg.publication).await?;
    let mut sql = publication_fix_sql(&cfg.publication, existing.as_deref(), &cfg.tables, options)
        .unwrap_or_default();
    if existing.is_some() && options.generated_columns {
        let sends = client
            .query_one(
                "SELECT pubgencols::text = 's' FROM pg_publication WHERE pubname = $1",
                &[&cfg.publication],
            )
            .await
            .context("reading pg_publication.pubgencols")?
            .get::<_, bool>(0);
        if !sends {
            if !publication_is_ours(client, cfg).await? {
                return Err(Error::config(format!(
                    "publication `{}` does not send stored generated columns, and skipprd does not change the settings of a publication it did not make (other subscribers may read it); run {} or leave the columns out with `exclude_columns`",
                    cfg.publication,
                    generated_columns_fix_sql(&cfg.publication)
                )));
            }
            sql.push_str(&generated_columns_fix_sql(&cfg.publication));
        }
    }
    if sql.is_empty() {
        return Ok(());
    }
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

/// The comment skipprd gives a publication it makes: the mark that it may change its settings.
pub const PUBLICATION_COMMENT: &str = "made by skipprd";

/// Whether skipprd may change the publication's settings: it has the pipeline's default name,
/// or skipprd made it (its comment says so), or it does not exist yet. A publication the user
/// made and named in skippr.yml may serve other subscribers, whose streams a changed setting
/// would change under them: it is left as it is, and what it lacks is refused with the SQL.
pub async fn publication_is_ours(client: &Client, cfg: &PostgresConfig) -> Result<bool> {
    if !cfg.publication_named {
        return Ok(true);
    }
    let row = client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&cfg.publication],
        )
        .await
        .context("reading the publication's comment")?;
    Ok(match row {
        None => true,
        Some(r) => r
            .get::<_, Option<String>>(0)
            .is_some_and(|c| c == PUBLICATION_COMMENT),
    })
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
    // The pre-Postgres-15 syntax is still accepted by every current version; a failover
    // slot needs the option list (Postgres 17 and later, which `sync` checks first). A
    // temporary slot (a later snapshot's) is never a failover slot.
    let sql = if cfg.failover_slot && !temporary && slot == cfg.slot {
        format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)",
            quote_ident(slot)
        )
    } else {
        format!(
            "CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput EXPORT_SNAPSHOT",
            quote_ident(slot),
            if temporary { "TEMPORARY " } else { "" }
        )
    };
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

/// Makes the pipeline's existing slot a failover slot when `failover_slot` asks for it and it
/// is not one yet (a slot created before the key was set). Postgres 17 and later only, which
/// the caller checks first.
pub async fn ensure_failover(client: &Client, cfg: &PostgresConfig) -> Result<()> {
    if !cfg.failover_slot {
        return Ok(());
    }
    let failover: Option<bool> = client
        .query_opt(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&cfg.slot],
        )
        .await
        .context("reading pg_replication_slots.failover")?
        .map(|r| r.get(0));
    if failover != Some(false) {
        return Ok(());
    }
    let rc = replication_session(cfg, &cfg.slot).await?;
    let mut session = ReplicationClient::connect_gated(rc).await.map_err(|e| {
        Error::new(
            replication_kind(&e),
            format!(
                "cannot open a replication connection to make slot `{}` a failover slot: {e}",
                cfg.slot
            ),
        )
    })?;
    let sql = format!(
        "ALTER_REPLICATION_SLOT {} (FAILOVER true)",
        quote_ident(&cfg.slot)
    );
    session.simple_query(&sql).await.map_err(|e| {
        Error::new(
            replication_kind(&e),
            format!("cannot make slot `{}` a failover slot: {e}; run ALTER_REPLICATION_SLOT on a replication connection, or drop the key failover_slot", cfg.slot),
        )
    })?;
    tracing::info!(slot = %cfg.slot, "replication slot is now a failover slot");
    Ok(())
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

/// How much the pipeline's slot holds back on the server, as `skipprd status`, the
/// `skippr.sources` system table and the metrics show it. `None` fields when the server
/// cannot say (no slot yet, a standby, an unreachable source: see `error`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotHealth {
    pub confirmed_flush: Option<Lsn>,
    pub restart: Option<Lsn>,
    pub current: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost` (`pg_replication_slots.wal_status`).
    pub wal_status: Option<String>,
    /// Bytes of WAL that can still be written before the slot is invalidated; `None` when
    /// `max_slot_wal_keep_size` is unlimited.
    pub safe_wal_size: Option<i64>,
    /// WAL the server keeps for the slot: its current position minus `restart_lsn`.
    pub retained_wal_bytes: Option<u64>,
    /// WAL not yet acknowledged: the current position minus `confirmed_flush_lsn`.
    pub lag_bytes: Option<u64>,
    /// How long acknowledged WAL trails the server (`pg_stat_replication.flush_lag` of the
    /// slot's connection; 0 when it has caught up; `None` while no pipeline streams).
    pub lag_seconds: Option<f64>,
    pub active: bool,
    /// Why the server could not be asked, when it could not.
    pub error: Option<String>,
}

impl SlotHealth {
    /// What deserves a user's attention, each naming the setting or the fix.
    pub fn warnings(&self, cfg: &PostgresConfig) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(retained) = self.retained_wal_bytes {
            if retained > cfg.max_retained_wal {
                out.push(format!(
                    "slot `{}` holds {} of WAL on the server, past data_sources.{}.Postgres.max_retained_wal ({}): {}",
                    cfg.slot,
                    crate::telemetry::human_bytes(retained),
                    cfg.name,
                    crate::telemetry::human_bytes(cfg.max_retained_wal),
                    if self.active {
                        "the pipeline is behind the server; see its lag and the log"
                    } else {
                        "no pipeline is streaming from it; start `skipprd sync` (or `serve`), or drop the slot if the pipeline is gone"
                    }
                ));
            }
        }
        match self.wal_status.as_deref() {
            Some("unreserved") => out.push(format!(
                "slot `{}` is past max_slot_wal_keep_size (wal_status = unreserved): Postgres will invalidate it at the next checkpoint unless the pipeline catches up",
                cfg.slot
            )),
            Some("lost") => out.push(format!(
                "slot `{}` is invalidated (wal_status = lost): run `skipprd sync --resnapshot`",
                cfg.slot
            )),
            _ => {}
        }
        out
    }
}

/// Reads the slot's health; `Ok(None)` when the slot does not exist. On a standby (a slot
/// there, Postgres 16+) the server's position is what it has replayed.
pub async fn read_health(client: &Client, slot: &str) -> Result<Option<SlotHealth>> {
    let row = client
        .query_opt(
            "SELECT s.confirmed_flush_lsn::text, s.restart_lsn::text,
                    (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                          ELSE pg_current_wal_lsn() END)::text,
                    s.wal_status, s.safe_wal_size, s.active,
                    (SELECT extract(epoch FROM r.flush_lag)::float8
                     FROM pg_stat_replication r WHERE r.pid = s.active_pid)
             FROM pg_replication_slots s WHERE s.slot_name = $1",
            &[&slot],
        )
        .await
        .context("reading the slot from pg_replication_slots")?;
    let Some(r) = row else {
        return Ok(None);
    };
    let lsn = |i: usize| {
        r.get::<_, Option<String>>(i)
            .and_then(|s| Lsn::parse(&s).ok())
    };
    let (confirmed_flush, restart, current) = (lsn(0), lsn(1), lsn(2));
    let active: bool = r.get(5);
    let flush_lag: Option<f64> = r.get(6);
    Ok(Some(SlotHealth {
        confirmed_flush,
        restart,
        current,
        wal_status: r.get(3),
        safe_wal_size: r.get(4),
        retained_wal_bytes: current.zip(restart).map(|(c, s)| c.0.saturating_sub(s.0)),
        lag_bytes: current
            .zip(confirmed_flush)
            .map(|(c, s)| c.0.saturating_sub(s.0)),
        lag_seconds: if active {
            Some(flush_lag.unwrap_or(0.0))
        } else {
            None
        },
        active,
        error: None,
    }))
}

/// The slot's health, asked of the source on a connection of its own; a source that
/// cannot answer gives a health with only `error` set.
pub async fn health(cfg: &PostgresConfig) -> SlotHealth {
    let failed = |e: String| SlotHealth {
        error: Some(e),
        ..SlotHealth::default()
    };
    let client = match super::connect::connect(cfg).await {
        Ok(c) => c,
        Err(e) => return failed(e.to_string()),
    };
    match tokio::time::timeout(cfg.peer_timeout, read_health(&client, &cfg.slot)).await {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => SlotHealth {
            current: client
                .query_one("SELECT pg_current_wal_lsn()::text", &[])
                .await
                .ok()
                .and_then(|r| r.get::<_, Option<String>>(0))
                .and_then(|s| Lsn::parse(&s).ok()),
            ..failed(format!(
                "replication slot `{}` does not exist (it is created by the first `skipprd sync`)",
                cfg.slot
            ))
        },
        Ok(Err(e)) => failed(e.to_string()),
        Err(_) => failed(format!(
            "the source did not answer within {}s",
            cfg.peer_timeout.as_secs()
        )),
    }
}
