//! `skipprd discover`: reads each configured table's shape and checks that the source is
//! ready for the pipeline's `cdc_mode`, saying exactly what to run for each failed check.

use serde::Serialize;
use tokio_postgres::Client;

use super::carried;
use super::connect::{connect, server_setting};
use super::schema::{check_partition_overlap, describe_followed, TableSchema};
use super::slot::{
    generated_columns_fix_sql, publication_fix_sql, publication_tables, publication_via_root,
    slot_info, via_root_fix_sql, PublicationOptions, FAILOVER_SLOTS_VERSION,
};
use crate::config::{quote_ident, PipelineConfig};
use crate::error::{Context, Result};

/// One readiness check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// What to run to fix a failed check (`null` when it passed).
    pub fix: Option<String>,
    /// A check that passed but deserves attention (not a failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ColumnReport {
    pub name: String,
    pub pg_type: String,
    pub iceberg_type: String,
    pub nullable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TableReport {
    pub schema: String,
    pub name: String,
    pub iceberg_table: String,
    pub columns: Vec<ColumnReport>,
    pub primary_key: Vec<String>,
    pub replica_identity: String,
    pub row_estimate: i64,
    /// The layout the table gets (`partitioned by day(created_at); sorted by created_at`,
    /// or `unpartitioned`), from `pipelines.<name>.tables`; filled by the caller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
}

/// Everything `discover` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub pipeline: String,
    pub data_source: String,
    pub cdc_mode: String,
    pub tables: Vec<TableReport>,
    pub checks: Vec<Check>,
    /// The shape of each table read, for the checks the caller adds (not printed).
    #[serde(skip)]
    pub schemas: Vec<TableSchema>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

fn check(name: &str, ok: bool, detail: impl Into<String>, fix: Option<String>) -> Check {
    Check {
        name: name.to_string(),
        ok,
        detail: detail.into(),
        fix: if ok { None } else { fix },
        warning: None,
    }
}

/// Runs discovery for one pipeline.
pub async fn discover(p: &PipelineConfig, workspace: &str) -> Result<Report> {
    let cfg = &p.source;
    let client = connect(cfg).await?;
    let mut checks = Vec::new();
    let mut tables = Vec::new();
    let mut schemas = Vec::new();
    for t in &cfg.tables {
        match describe_followed(&client, p, t).await {
            Ok(ts) => {
                tables.push(table_report(&ts, workspace));
                schemas.push(ts);
            }
            Err(e) if e.kind() == crate::error::ErrorKind::Config => checks.push(check(
                &format!("table {t}"),
                false,
                e.message().to_string(),
                Some(format!(
                    "correct pipelines.{}.tables.{}.exclude_columns in skippr.yml",
                    p.name,
                    t.config_key()
                )),
            )),
            Err(e) => checks.push(check(
                &format!("table {t}"),
                false,
                e.message().to_string(),
                Some(format!(
                    "create table {t} in database `{}`, or remove `{}` from data_sources.{}.Postgres.tables",
                    cfg.database, t, cfg.name
                )),
            )),
        }
    }
    if let Err(e) = check_partition_overlap(&schemas) {
        checks.push(check(
            "partitions",
            false,
            e.message().to_string(),
            Some(
                "list either the partitioned table or its partitions in `tables:`, not both".into(),
            ),
        ));
    }
    for ts in &schemas {
        let can_select: bool = client
            .query_one("SELECT has_table_privilege($1::oid, 'SELECT')", &[&ts.oid])
            .await
            .context("checking table privileges")?
            .get(0);
        checks.push(check(
            &format!("select on {}", ts.table),
            can_select,
            if can_select {
                "readable".to_string()
            } else {
                format!("user `{}` cannot read {}", cfg.user, ts.table)
            },
            Some(format!(
                "GRANT SELECT ON {} TO {};",
                ts.table.quoted(),
                quote_ident(&cfg.user)
            )),
        ));
    }
    if cfg.cdc_mode.needs_replication() {
        replication_checks(&client, p, &schemas, &mut checks).await?;
    }
    Ok(Report {
        pipeline: p.name.clone(),
        data_source: cfg.name.clone(),
        cdc_mode: cfg.cdc_mode.as_str().to_string(),
        tables,
        checks,
        schemas,
    })
}

fn table_report(ts: &TableSchema, workspace: &str) -> TableReport {
    TableReport {
        schema: ts.table.schema.clone(),
        name: ts.table.name.clone(),
        iceberg_table: format!("{workspace}.{}", ts.table.iceberg_name()),
        columns: ts
            .columns
            .iter()
            .map(|c| ColumnReport {
                name: c.name.clone(),
                pg_type: c.pg_type_name.clone(),
                iceberg_type: c.pg.iceberg_type_name(),
                nullable: !(c.not_null || ts.primary_key.contains(&c.name)),
                note: c.fallback.map(str::to_string),
            })
            .collect(),
        primary_key: ts.primary_key.clone(),
        replica_identity: ts.replica_identity.clone(),
        row_estimate: ts.row_estimate,
        layout: None,
    }
}

/// The server's bound on the WAL a slot may hold (`max_slot_wal_keep_size`), and whether a
/// failover slot can be made.
async fn slot_safety_checks(
    client: &Client,
    p: &PipelineConfig,
    version: i32,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let cfg = &p.source;
    let keep = server_setting(client, "max_slot_wal_keep_size").await?;
    let mut c = check(
        "WAL retention limit",
        true,
        format!("max_slot_wal_keep_size = {keep}"),
        None,
    );
    if keep.trim() == "-1" {
        c.warning = Some(format!(
            "unlimited: a slot that stops advancing keeps WAL until the server's disk is full; set a bound above data_sources.{}.Postgres.max_retained_wal ({} bytes), e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '{}GB'; SELECT pg_reload_conf(); (a slot past it is invalidated and the pipeline stops naming --resnapshot)",
            cfg.name,
            cfg.max_retained_wal,
            (cfg.max_retained_wal >> 30).saturating_mul(2).max(1)
        ));
    }
    checks.push(c);
    if cfg.failover_slot {
        let ok = version >= FAILOVER_SLOTS_VERSION;
        let waits_for_standby = if ok {
            client
                .query_one(
                    "SELECT coalesce(current_setting('synchronized_standby_slots', true), '') <> ''",
                    &[],
                )
                .await
                .context("reading synchronized_standby_slots")?
                .get::<_, bool>(0)
        } else {
            true
        };
        let mut c = check(
            "failover slot",
            ok,
            if ok {
                format!(
                    "slot `{}` is made a failover slot: standbys with sync_replication_slots = on keep it",
                    cfg.slot
                )
            } else {
                format!(
                    "failover_slot is set, but the source runs Postgres {} and failover slots need Postgres 17 or later",
                    version / 10_000
                )
            },
            Some(format!(
                "remove data_sources.{}.Postgres.failover_slot, or upgrade the server to Postgres 17 or later",
                cfg.name
            )),
        );
        if !waits_for_standby {
            c.warning = Some("synchronized_standby_slots is empty: the primary may send changes the standby's copy of the slot has not reached, and after a promotion they would be missing; name the standby's physical slot in synchronized_standby_slots on the primary".into());
        }
        checks.push(c);
    }
    Ok(())
}

async fn replication_checks(
    client: &Client,
    p: &PipelineConfig,
    schemas: &[TableSchema],
    checks: &mut Vec<Check>,
) -> Result<()> {
    let cfg = &p.source;
    let wal_level = server_setting(client, "wal_level").await?;
    checks.push(check(
        "wal_level",
        wal_level == "logical",
        format!("wal_level = {wal_level}"),
        Some("ALTER SYSTEM SET wal_level = logical; then restart Postgres".into()),
    ));

    let version = carried::server_version(client).await?;
    for u in carried::uncarried(client, p, schemas, version).await? {
        if u.column == carried::ROW_FILTER {
            checks.push(check(
                &format!("row filter of {}", u.table),
                false,
                u.detail,
                Some(format!(
                    "remove the row filter from publication `{}`, or follow the table through another publication",
                    cfg.publication
                )),
            ));
            continue;
        }
        let fix = if u.publication_setting {
            if crate::source::postgres::slot::publication_is_ours(client, cfg).await? {
                format!(
                    "`sync` runs this itself: {}",
                    generated_columns_fix_sql(&cfg.publication)
                )
            } else {
                format!(
                    "run {} (skipprd does not change a publication it did not make), or add `exclude_columns: [{}]` under pipelines.{}.tables.{} in skippr.yml",
                    generated_columns_fix_sql(&cfg.publication),
                    u.column,
                    p.name,
                    u.key
                )
            }
        } else {
            format!(
                "add `exclude_columns: [{}]` under pipelines.{}.tables.{} in skippr.yml{}",
                u.column,
                p.name,
                u.key,
                if version < carried::GENERATED_COLUMNS_VERSION {
                    ", or move to Postgres 18"
                } else {
                    ""
                }
            )
        };
        checks.push(check(
            &format!("column {} of {}", u.column, u.table),
            false,
            u.detail,
            Some(fix),
        ));
    }

    let row = client
        .query_one(
            "SELECT rolreplication OR rolsuper, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .context("reading the user's privileges")?;
    let can_replicate: bool = row.get(0);
    let superuser: bool = row.get(1);
    checks.push(check(
        "replication privilege",
        can_replicate,
        if can_replicate {
            format!("user `{}` may replicate", cfg.user)
        } else {
            format!("user `{}` lacks the REPLICATION privilege", cfg.user)
        },
        Some(format!(
            "ALTER ROLE {} WITH REPLICATION;",
            quote_ident(&cfg.user)
        )),
    ));

    match slot_info(client, &cfg.slot).await? {
        Some(slot) => {
            let (ok, detail, fix) = if slot.wal_status.as_deref() == Some("lost") {
                (
                    false,
                    format!("slot `{}` is invalidated (wal_status = lost): Postgres removed WAL it still needed", cfg.slot),
                    Some(format!("skipprd sync --pipeline {} --resnapshot", p.name)),
                )
            } else if slot.plugin.as_deref() != Some("pgoutput") {
                (
                    false,
                    format!(
                        "slot `{}` exists but is not a pgoutput logical slot",
                        cfg.slot
                    ),
                    Some(format!(
                        "SELECT pg_drop_replication_slot('{}'); or set `slot:` to another name",
                        cfg.slot
                    )),
                )
            } else if slot.database.as_deref() != Some(cfg.database.as_str()) {
                (
                    false,
                    format!("slot `{}` belongs to another database", cfg.slot),
                    Some("set `slot:` to another name in skippr.yml".to_string()),
                )
            } else {
                (
                    true,
                    format!(
                        "slot `{}` exists{} (confirmed up to {})",
                        cfg.slot,
                        if slot.active { " and is in use" } else { "" },
                        slot.confirmed_flush
                            .map(|l| l.to_string())
                            .unwrap_or_else(|| "-".into())
                    ),
                    None,
                )
            };
            checks.push(check("replication slot", ok, detail, fix));
        }
        None => {
            let free: i64 = client
                .query_one(
                    "SELECT current_setting('max_replication_slots')::bigint - (SELECT count(*) FROM pg_replication_slots)",
                    &[],
                )
                .await
                .context("counting replication slots")?
                .get(0);
            checks.push(check(
                "replication slot",
                free > 0,
                if free > 0 {
                    format!("slot `{}` will be created on the first sync ({free} free)", cfg.slot)
                } else {
                    "no free replication slot (max_replication_slots reached)".to_string()
                },
                Some("ALTER SYSTEM SET max_replication_slots = <more>; then restart Postgres, or drop an unused slot with SELECT pg_drop_replication_slot('<name>');".into()),
            ));
        }
    }

    let existing = publication_tables(client, &cfg.publication).await?;
    let partitioned: Vec<String> = schemas
        .iter()
        .filter(|s| s.partitioned)
        .map(|s| s.table.to_string())
        .collect();
    if !partitioned.is_empty() {
        if let Some(false) = publication_via_root(client, &cfg.publication).await? {
            checks.push(check(
                "publication of partitions",
                false,
                format!(
                    "publication `{}` publishes the changes of the partitions of {} under the partitions' own names (publish_via_partition_root is off), so skipprd would not receive them as changes of the table it follows",
                    cfg.publication,
                    partitioned.join(", ")
                ),
                Some(via_root_fix_sql(&cfg.publication)),
            ));
        }
    }
    let fix = publication_fix_sql(
        &cfg.publication,
        existing.as_deref(),
        &cfg.tables,
        PublicationOptions {
            via_root: !partitioned.is_empty(),
            generated_columns: version >= carried::GENERATED_COLUMNS_VERSION
                && carried::keeps_generated(schemas),
        },
    );
    match (&existing, &fix) {
        (Some(_), None) => checks.push(check(
            "publication",
            true,
            format!("publication `{}` covers every table", cfg.publication),
            None,
        )),
        _ => {
            // Creating or altering a publication needs ownership of the tables (or superuser).
            let mut owns_all = true;
            for ts in schemas {
                let owns: bool = client
                    .query_one(
                        "SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = $1",
                        &[&ts.oid],
                    )
                    .await
                    .context("checking table ownership")?
                    .get(0);
                owns_all &= owns;
            }
            let can_create: bool = superuser
                || client
                    .query_one(
                        "SELECT has_database_privilege(current_database(), 'CREATE')",
                        &[],
                    )
                    .await
                    .context("checking the CREATE privilege")?
                    .get(0);
            let ok = owns_all && (existing.is_some() || can_create);
            checks.push(check(
                "publication",
                ok,
                if ok {
                    format!(
                        "publication `{}` will be {} on the first sync",
                        cfg.publication,
                        if existing.is_some() {
                            "extended"
                        } else {
                            "created"
                        }
                    )
                } else {
                    format!(
                        "publication `{}` {} and user `{}` cannot {} it",
                        cfg.publication,
                        if existing.is_some() {
                            "lacks some tables"
                        } else {
                            "does not exist"
                        },
                        cfg.user,
                        if existing.is_some() {
                            "extend"
                        } else {
                            "create"
                        }
                    )
                },
                fix.clone()
                    .map(|sql| format!("as a table owner or superuser: {sql}")),
            ));
        }
    }

    for ts in schemas {
        let problem = identity_problem(client, p, ts).await?;
        let append_only = cfg.append_only.contains(&ts.table);
        let detail = match &problem {
            Some((detail, _)) => detail.clone(),
            None if append_only && ts.primary_key.is_empty() && ts.replica_identity != "full" => {
                "append_only: inserts only (an UPDATE or DELETE stops the sync)".to_string()
            }
            None if ts.primary_key.is_empty() => "replica identity full".to_string(),
            None => format!("primary key ({})", ts.primary_key.join(", ")),
        };
        checks.push(check(
            &format!("change identity of {}", ts.table),
            problem.is_none(),
            detail,
            problem.map(|(_, fix)| fix),
        ));
    }
    // After the slot checks, which name the slot first.
    slot_safety_checks(client, p, version, checks).await?;
    Ok(())
}

const IDENTITY_INDEX_SQL: &str = "
SELECT c.relname::text, array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND i.indisreplident
GROUP BY c.relname";

/// Why the updates and deletes of a table could not be applied by key, and the SQL that
/// fixes it; `None` when they can. Rows are keyed by the primary key (or by the whole row
/// with REPLICA IDENTITY FULL), so the old row Postgres sends with an UPDATE or DELETE must
/// carry every key column: a replica identity on another index, or NOTHING, would make
/// deletes and key changes unmatchable. The sync refuses such a table before it starts.
pub async fn identity_problem(
    client: &Client,
    p: &PipelineConfig,
    ts: &TableSchema,
) -> Result<Option<(String, String)>> {
    let table = &ts.table;
    if ts.replica_identity == "full" || p.source.append_only.contains(table) {
        return Ok(None);
    }
    let index = client
        .query_opt(IDENTITY_INDEX_SQL, &[&ts.oid])
        .await
        .with_context(|| format!("reading the replica identity index of table {table}"))?
        .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<String>>(1)));
    if ts.primary_key.is_empty() {
        let promote = match &index {
            Some((name, _)) => format!(
                "ALTER TABLE {} ADD PRIMARY KEY USING INDEX {};, ",
                table.quoted(),
                quote_ident(name)
            ),
            None => String::new(),
        };
        return Ok(Some((
            format!(
                "table {table} has no primary key and replica identity {}, so its updates and deletes cannot be applied",
                ts.replica_identity
            ),
            format!(
                "add a primary key ({promote}for instance), run ALTER TABLE {} REPLICA IDENTITY FULL;, or list it under `append_only:` if it only ever receives inserts; if its primary key was dropped after it was synced, also run `skipprd sync --pipeline {} --resnapshot`",
                table.quoted(),
                p.name
            ),
        )));
    }
    let fix = format!("ALTER TABLE {} REPLICA IDENTITY DEFAULT;", table.quoted());
    match (ts.replica_identity.as_str(), index) {
        ("nothing", _) => Ok(Some((
            format!(
                "table {table} has replica identity NOTHING: Postgres sends no old row with its updates and deletes (and refuses them while the table is published), so they cannot be applied"
            ),
            fix,
        ))),
        (_, Some((name, columns)))
            if !ts.primary_key.iter().all(|k| columns.contains(k)) =>
        {
            Ok(Some((
                format!(
                    "table {table} has replica identity USING INDEX {name} ({}), which does not include its primary key ({}): its deletes and key changes would arrive without the key and could not be applied",
                    columns.join(", "),
                    ts.primary_key.join(", ")
                ),
                fix,
            )))
        }
        _ => Ok(None),
    }
}

/// Prints the report for a person.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Pipeline {} (data source {}, cdc_mode {})\n",
        r.pipeline, r.data_source, r.cdc_mode
    ));
    for t in &r.tables {
        out.push_str(&format!(
            "\n{}.{} -> {}\n  primary key: {}\n  replica identity: {}\n  rows (estimate): {}\n",
            t.schema,
            t.name,
            t.iceberg_table,
            if t.primary_key.is_empty() {
                "(none)".to_string()
            } else {
                t.primary_key.join(", ")
            },
            t.replica_identity,
            t.row_estimate
        ));
        let headers = ["column", "postgres type", "iceberg type", "nullable"];
        let rows: Vec<Vec<String>> = t
            .columns
            .iter()
            .map(|c| {
                let mut iceberg = c.iceberg_type.clone();
                if let Some(n) = &c.note {
                    iceberg.push_str(&format!(" ({n})"));
                }
                vec![
                    c.name.clone(),
                    c.pg_type.clone(),
                    iceberg,
                    if c.nullable { "yes" } else { "no" }.to_string(),
                ]
            })
            .collect();
        let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, v) in widths.iter_mut().zip(row) {
                *w = (*w).max(v.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let mut s = String::from("  ");
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<w$}  ", w = *w));
                }
            }
            s.push('\n');
            s
        };
        out.push_str(&line(headers.to_vec()));
        for row in &rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
    }
    if r.tables.iter().any(|t| t.layout.is_some()) {
        out.push_str("\nLayout\n");
        for t in &r.tables {
            if let Some(layout) = &t.layout {
                let name = if t.schema == "public" {
                    t.name.clone()
                } else {
                    format!("{}.{}", t.schema, t.name)
                };
                out.push_str(&format!("  {name}: {layout}\n"));
            }
        }
    }
    out.push_str("\nChecks\n");
    for c in &r.checks {
        out.push_str(&format!(
            "  [{}] {}: {}\n",
            match (c.ok, &c.warning) {
                (false, _) => "FAIL",
                (true, Some(_)) => "warn",
                (true, None) => " ok ",
            },
            c.name,
            c.detail
        ));
        if let Some(f) = &c.fix {
            out.push_str(&format!("         fix: {f}\n"));
        }
        if let Some(w) = &c.warning {
            out.push_str(&format!("         warning: {w}\n"));
        }
    }
    if r.ok() {
        out.push_str("\nReady: every check passed.\n");
    } else {
        let n = r.checks.iter().filter(|c| !c.ok).count();
        out.push_str(&format!("\nNot ready: {n} check(s) failed.\n"));
    }
    out
}
