//! The snapshot phase of a pipeline: decides which tables must be copied (never copied, a
//! copy cut short, or rows that can no longer be trusted complete), runs the refusals, creates
//! the slot with an exported snapshot and copies the tables inside it, then records each
//! table's watermark.

use std::collections::HashMap;

use super::checks::{
    check_owner, check_replication_ready, require_published, require_slot_if_synced,
    require_slot_not_moved, require_via_root,
};
use super::landing::{copy_into, ChunkStart, Earlier, TableJob};
use super::resume::{self, Verdict};
use super::state::{PipelineState, TableState};
use super::SyncReport;
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::config::{CdcMode, Config, PipelineConfig, TableRef};
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::{commit, evolve, reshape::Reshape, schema as ice_schema};
use crate::source::postgres::connect::connect;
use crate::source::postgres::schema::{check_partition_overlap, describe_followed, TableSchema};
use crate::source::postgres::slot::{self, create_slot_exporting_snapshot, slot_info};

/// Clears the pipeline's WAL and slot and asks for a new copy of every table (`sync
/// --resnapshot`), which the next snapshot makes.
pub(super) async fn resnapshot_reset(config: &Config, p: &PipelineConfig) -> Result<()> {
    // The Iceberg tables stay as they are: each is replaced by its new copy in one commit,
    // so readers see the old rows until then, never an empty or half-copied table. The
    // state asks for the copy first, so a crash from here on still ends in one.
    // The WAL is cleared below, so nothing of it was removed (the server's LSNs may even
    // start lower, on a server restored from a backup).
    PipelineState {
        resnapshot: true,
        ..PipelineState::default()
    }
    .save(&p.state_file)?;
    super::wal_of(config, p)?.clear()?;
    if p.source.cdc_mode.needs_replication() {
        let client = connect(&p.source).await?;
        if slot_info(&client, &p.source.slot).await?.is_some() {
            client
                .execute("SELECT pg_drop_replication_slot($1)", &[&p.source.slot])
                .await
                .with_context(|| format!("dropping replication slot `{}` for the re-snapshot (is another process using it?)", p.source.slot))?;
        }
    }
    tracing::info!(pipeline = %p.name, "re-snapshot: WAL and slot reset; every table is copied again and replaced in one commit");
    Ok(())
}

/// A copy to run beside the stream, not started yet.
type BoxedCopy = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

/// The copy of tables new to a running pipeline, made beside its stream (see
/// [`snapshot_phase_beside`]).
pub(super) struct Beside {
    /// The log is kept after this LSN until the tables join the stream: the copy's LSN, or
    /// the LSN a table copied again had committed, whose readers go on reading it with its
    /// WAL tail meanwhile.
    pub hold: Lsn,
    pub tables: Vec<crate::config::TableRef>,
    pub copy: tokio::task::JoinHandle<Result<()>>,
}

/// The snapshot of every table that has no committed snapshot yet, or whose committed rows
/// can no longer be trusted to be complete (see [`copy_again`]).
pub(super) async fn snapshot_phase(config: &Config, p: &PipelineConfig) -> Result<SyncReport> {
    Ok(snapshot_phase_beside(config, p, &[], false).await?.0)
}

/// [`snapshot_phase`], except that, with `beside` and a slot already streaming, when the only
/// tables to copy are `added` (new to the pipeline) or asked for by `sync --resnapshot
/// --table`, their copy is started and returned instead of awaited: the stream goes on for
/// the other tables meanwhile, and the tables join it once their copy has committed (their
/// changes wait in the log).
pub(super) async fn snapshot_phase_beside(
    config: &Config,
    p: &PipelineConfig,
    added: &[crate::config::TableRef],
    beside_ok: bool,
) -> Result<(SyncReport, Option<Beside>)> {
    let cfg = &p.source;
    let catalog = LocalCatalog::for_sink(&p.sink).await?;
    let namespace = catalog.ensure_namespace(&config.workspace).await?;
    let client = connect(cfg).await?;

    let mut schemas = Vec::new();
    for t in &cfg.tables {
        schemas.push(describe_followed(&client, p, t).await?);
    }
    check_partition_overlap(&schemas)?;
    let generated_columns = cfg.cdc_mode.needs_replication()
        && crate::source::postgres::carried::keeps_generated(&schemas)
        && crate::source::postgres::carried::server_version(&client).await?
            >= crate::source::postgres::carried::GENERATED_COLUMNS_VERSION;
    if cfg.cdc_mode.needs_replication() {
        check_replication_ready(&client, p, &schemas).await?;
    }

    let prior = PipelineState::load(&p.state_file)?;
    // Tables that left `tables:` leave the state: nothing follows them any more.
    let mut state = PipelineState {
        wal_removed_through: prior
            .as_ref()
            .map(|s| s.wal_removed_through)
            .unwrap_or_default(),
        // A re-snapshot stays asked for until every copy is done (a crash or a retry in
        // between copies again, rather than trusting the old table's LSNs).
        resnapshot: prior.as_ref().is_some_and(|s| s.resnapshot),
        ..PipelineState::default()
    };
    // Tables `sync --resnapshot --table` asked to copy again (kept until their copy commits).
    let requests = super::reload::Requests::of(config, &p.name);
    let asked = requests.tables()?;
    let stale: Vec<String> = asked
        .iter()
        .filter(|t| !cfg.tables.iter().any(|f| f.to_string() == **t))
        .cloned()
        .collect();
    if !stale.is_empty() {
        tracing::warn!(pipeline = %p.name, tables = ?stale, "a new copy was asked for tables the pipeline does not follow; dropping the request");
        requests.done(&stale)?;
    }
    let mut report = SyncReport::default();
    let mut todo = Vec::new();
    // The LSN each table asked to be copied again had committed.
    let mut replaced_at = std::collections::HashMap::new();
    let mut synced_partitioned = Vec::new();
    // Copies cut short that go on from the chunks they made durable.
    let mut earlier: HashMap<TableRef, Earlier> = HashMap::new();
    for ts in schemas {
        let layout = p.layout(&ts.table);
        let table = ice_schema::create_or_load(&catalog, &namespace, &ts, &layout).await?;
        let table = evolve::apply_layout(&catalog, &table, &layout).await?;
        let committed = commit::committed_lsn(&table);
        let same = same_columns(&table, &ts);
        match resume::verdict(prior.as_ref(), &ts, &table, committed, p, same) {
            Verdict::GoOn(at, progress) => {
                if let Some(e) = resume::take_up(&table, &ts, at, progress).await? {
                    tracing::info!(table = %ts.table, lsn = %at, chunks = e.chunks.len(), "the copy of this table was cut short; it goes on from the chunks it made durable");
                    // Files of the chunk under way when it stopped go; the others stay.
                    resume::remove_uncommitted_files(&table, &e.files())?;
                    earlier.insert(ts.table.clone(), e);
                    let replace = committed.is_some();
                    todo.push(job(ts, table, replace, None)?);
                    continue;
                }
            }
            Verdict::StartOver(why, progress) => {
                tracing::warn!(table = %ts.table, reason = %why, "a copy cut short starts over");
                resume::give_up(&table, &progress).await;
            }
            Verdict::Spent(progress) => resume::give_up(&table, &progress).await,
            Verdict::Nothing => {}
        }
        let Some(lsn) = committed else {
            resume::remove_uncommitted_files(&table, &Default::default())?;
            todo.push(job(ts, table, false, None)?);
            continue;
        };
        let asked_for = asked.contains(&ts.table.to_string());
        if asked_for {
            replaced_at.insert(ts.table.clone(), lsn);
        }
        // `--resnapshot` is also how a table is handed over from another pipeline.
        if !prior.as_ref().is_some_and(|s| s.resnapshot) && !asked_for {
            check_owner(&table, &ts, p)?;
        }
        let recorded = prior.as_ref().and_then(|s| s.table(&ts.table));
        let again = if asked_for {
            Some("`sync --resnapshot --table` asked for a new copy (readers see the table as it was until the copy commits)".to_string())
        } else {
            copy_again(prior.as_ref(), recorded, &ts, lsn)
        };
        match again {
            None => {
                // Without a state yet (a pipeline from before it was kept), adopt what
                // Iceberg records.
                let watermark = recorded.map(|r| r.watermark).unwrap_or(lsn).max(lsn);
                let partitions = recorded
                    .map(|r| r.partitions.clone())
                    .unwrap_or_else(|| ts.partitions.clone());
                let excluded = recorded.map(|r| r.excluded.clone()).unwrap_or_default();
                if excluded != p.source.excluded(&ts.table) {
                    return Err(Error::config(format!(
                        "pipelines.{}.tables.{}.exclude_columns changed since the table was copied (then [{}], now [{}]): the rows already in the lake keep the columns as they were copied, so run `skipprd sync --pipeline {} --resnapshot` to copy the table with the new set",
                        p.name,
                        ts.table.config_key(),
                        excluded.join(", "),
                        p.source.excluded(&ts.table).join(", "),
                        p.name
                    )));
                }
                state.tables.insert(
                    ts.table.to_string(),
                    TableState {
                        watermark,
                        partitions,
                        copying_at: None,
                        excluded,
                        // A table copied in chunks keeps what its chunks lack while the
                        // WAL it filters may still be replayed.
                        chunked: recorded
                            .and_then(|r| r.chunked.clone())
                            .filter(|c| c.through > state.wal_removed_through),
                        copied: None,
                    },
                );
                if ts.partitioned {
                    synced_partitioned.push(ts.table.to_string());
                }
                report.skipped.push(ts.table.to_string());
            }
            Some(reason) => {
                tracing::warn!(table = %ts.table, committed_lsn = %lsn, reason = %reason, "copying the table again");
                if same_columns(&table, &ts) {
                    todo.push(job(ts, table, true, None)?);
                } else {
                    // The source's columns changed while nothing followed them: the copy is
                    // written under the source's current shape, which becomes the table's
                    // with the copy's rows in one commit.
                    let (staged, reshape) = Reshape::stage(&table, &ts, &layout)?;
                    todo.push(job(ts, staged, true, Some(reshape))?);
                }
            }
        }
    }

    resume::vet(
        config,
        &client,
        p,
        state.wal_removed_through,
        &mut earlier,
        &todo,
    )
    .await?;
    if cfg.cdc_mode.needs_replication() {
        let via_root = require_via_root(&client, p, &todo, &synced_partitioned).await?;
        require_published(&client, p, &report).await?;
        slot::ensure_publication(
            &client,
            cfg,
            slot::PublicationOptions {
                via_root,
                generated_columns,
            },
        )
        .await?;
        require_slot_if_synced(&client, p, &report).await?;
        slot::ensure_failover(&client, cfg).await?;
        require_slot_not_moved(config, &client, p, &report, prior.is_some(), &state).await?;
    }

    // A copy beside the stream, started only once the state below is saved (its task
    // records its chunks in the same file).
    let mut beside: Option<(Lsn, Vec<crate::config::TableRef>, BoxedCopy)> = None;
    // Tables copied in key chunks here, whose chunk filters their copy recorded.
    let mut chunked_now: Vec<String> = Vec::new();
    match cfg.cdc_mode {
        CdcMode::SnapshotOnly => {
            if !todo.is_empty() {
                // A plain transaction exports the snapshot; its LSN is informational.
                let exporter = connect(cfg).await?;
                exporter
                    .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
                    .context("starting the snapshot transaction")?;
                let row = exporter
                    .query_one(
                        "SELECT pg_export_snapshot(), pg_current_wal_lsn()::text",
                        &[],
                    )
                    .await
                    .context("exporting a snapshot")?;
                let name: String = row.get(0);
                let lsn = Lsn::parse(&row.get::<_, String>(1)).map_err(Error::fatal)?;
                report.copied = names(&todo);
                mark_copying(cfg, &mut state, &todo, lsn, &p.state_file)?;
                copy_into(cfg, &name, lsn, todo, &catalog, &p.name).await?;
                exporter
                    .batch_execute("COMMIT")
                    .await
                    .context("ending the snapshot")?;
            }
        }
        CdcMode::SnapshotThenCdc => {
            let existing = if todo.is_empty() {
                None
            } else {
                slot_info(&client, &cfg.slot).await?
            };
            // A copy cut short goes on from its durable chunks, at its own LSN, while the
            // pipeline's slot (and WAL) still hold the changes after it.
            let (resumed, fresh): (Vec<TableJob>, Vec<TableJob>) = todo
                .into_iter()
                .partition(|j| existing.is_some() && earlier.contains_key(&j.schema.table));
            report.copied = names(&resumed);
            report.copied.extend(names(&fresh));
            for j in &resumed {
                if let Some(e) = earlier.get(&j.schema.table) {
                    state.tables.insert(
                        j.schema.table.to_string(),
                        TableState {
                            watermark: Lsn::default(),
                            partitions: j.schema.partitions.clone(),
                            copying_at: Some(e.at),
                            excluded: cfg.excluded(&j.schema.table).to_vec(),
                            chunked: None,
                            copied: Some(e.progress.clone()),
                        },
                    );
                }
            }
            if !resumed.is_empty() {
                state.save(&p.state_file)?;
            }
            if !fresh.is_empty() {
                // The pipeline's slot is created once, with the first snapshot. A later snapshot
                // (an interrupted one, or a table added since) uses a temporary slot of its own:
                // the pipeline slot keeps what it holds, and each table records its own LSN.
                let exported = match existing {
                    None => create_slot_exporting_snapshot(cfg, &cfg.slot, false).await?,
                    Some(_) => {
                        let tmp = format!("{}_snap_{}", cfg.slot, std::process::id());
                        create_slot_exporting_snapshot(cfg, &tmp, true).await?
                    }
                };
                // Tables new to a streaming pipeline, or asked to be copied again, are
                // copied beside its stream.
                let alongside = beside_ok
                    && existing.is_some()
                    && resumed.is_empty()
                    && fresh.iter().all(|j| {
                        j.reshape.is_none()
                            && if j.replace {
                                replaced_at.contains_key(&j.schema.table)
                            } else {
                                added.contains(&j.schema.table)
                            }
                    });
                let lsn = exported.consistent_point;
                let hold = fresh
                    .iter()
                    .filter_map(|j| replaced_at.get(&j.schema.table).copied())
                    .fold(lsn, Lsn::min);
                mark_copying(cfg, &mut state, &fresh, lsn, &p.state_file)?;
                if alongside && super::landing::chunkable(&fresh) {
                    // In key chunks, each in a short transaction: no snapshot is held for
                    // longer than one chunk. The slot gives the consistent point, where the
                    // table lands and the WAL is kept from.
                    let tables = fresh.iter().map(|j| j.schema.table.clone()).collect();
                    let (cfg, catalog, pipeline) = (cfg.clone(), catalog.clone(), p.name.clone());
                    let state_file = p.state_file.clone();
                    let copy: BoxedCopy = Box::pin(async move {
                        let none = fresh.iter().map(|_| None).collect();
                        super::landing::copy_in_chunks(
                            &cfg,
                            ChunkStart::Exported(exported),
                            fresh,
                            none,
                            &catalog,
                            &pipeline,
                            &state_file,
                        )
                        .await
                    });
                    beside = Some((hold, tables, copy));
                } else if alongside {
                    let tables = fresh.iter().map(|j| j.schema.table.clone()).collect();
                    let (cfg, catalog, pipeline) = (cfg.clone(), catalog.clone(), p.name.clone());
                    let copy: BoxedCopy = Box::pin(async move {
                        let copied = copy_into(
                            &cfg,
                            &exported.snapshot_name,
                            lsn,
                            fresh,
                            &catalog,
                            &pipeline,
                        )
                        .await;
                        drop(exported.session);
                        copied
                    });
                    beside = Some((hold, tables, copy));
                } else {
                    // Large tables with an integer key in key chunks, each made durable as
                    // it ends (a copy cut short goes on from them); the others inside the
                    // exported snapshot.
                    let (chunked, whole): (Vec<TableJob>, Vec<TableJob>) =
                        fresh.into_iter().partition(|j| in_chunks(cfg, j));
                    if !whole.is_empty() {
                        copy_into(cfg, &exported.snapshot_name, lsn, whole, &catalog, &p.name)
                            .await?;
                    }
                    if chunked.is_empty() {
                        drop(exported.session);
                    } else {
                        chunked_now.extend(names(&chunked));
                        let none = chunked.iter().map(|_| None).collect();
                        super::landing::copy_in_chunks(
                            cfg,
                            ChunkStart::Exported(exported),
                            chunked,
                            none,
                            &catalog,
                            &p.name,
                            &p.state_file,
                        )
                        .await?;
                    }
                }
            }
            for j in resumed {
                let Some(e) = earlier.remove(&j.schema.table) else {
                    continue;
                };
                chunked_now.push(j.schema.table.to_string());
                super::landing::copy_in_chunks(
                    cfg,
                    ChunkStart::Resumed(e.at),
                    vec![j],
                    vec![Some(e)],
                    &catalog,
                    &p.name,
                    &p.state_file,
                )
                .await?;
            }
        }
        CdcMode::CdcOnly => {
            let start = match slot_info(&client, &cfg.slot).await? {
                Some(s) => s.confirmed_flush.unwrap_or_default(),
                None => {
                    let created = create_slot_exporting_snapshot(cfg, &cfg.slot, false).await?;
                    created.consistent_point
                }
            };
            // No snapshot: each new table starts empty at the slot's position (a copy of
            // nothing: a table copied again is emptied, and its changelog records that).
            mark_copying(cfg, &mut state, &todo, start, &p.state_file)?;
            for job in todo {
                job.land(&catalog, Vec::new(), start, "snapshot", &p.name)
                    .await?;
                report.copied.push(job.schema.table.to_string());
            }
        }
    }
    // Tables copied in key chunks here recorded what their chunks saw in the state file.
    let saved = match chunked_now.is_empty() {
        true => None,
        false => PipelineState::load(&p.state_file)?,
    };
    for (name, t) in state.tables.iter_mut() {
        // A copy beside the stream is still under way: the next snapshot phase, once it
        // committed, takes its LSN as the table's watermark.
        if beside
            .as_ref()
            .is_some_and(|(_, tables, _)| tables.iter().any(|t| t.to_string() == *name))
        {
            continue;
        }
        if let Some(lsn) = t.copying_at.take() {
            t.watermark = lsn;
            t.copied = None;
            if chunked_now.contains(name) {
                t.chunked = saved
                    .as_ref()
                    .and_then(|s| s.tables.get(name))
                    .and_then(|s| s.chunked.clone());
            }
        }
    }
    state.resnapshot = false;
    state.save(&p.state_file)?;
    // Every table is copied now: what was asked for is done.
    let done: Vec<String> = asked
        .iter()
        .filter(|t| report.copied.contains(t))
        .cloned()
        .collect();
    requests.done(&done)?;
    let beside = beside.map(|(hold, tables, copy)| Beside {
        hold,
        tables,
        copy: tokio::spawn(copy),
    });
    Ok((report, beside))
}

fn job(
    schema: TableSchema,
    table: iceberg::table::Table,
    replace: bool,
    reshape: Option<Reshape>,
) -> Result<TableJob> {
    let arrow = ice_schema::arrow_schema(&table)?;
    Ok(TableJob {
        schema,
        table,
        arrow,
        replace,
        reshape,
    })
}

/// Whether a table of a snapshot is copied in key chunks (each made durable as it ends, so
/// that a copy cut short goes on from them) rather than inside the exported snapshot: a
/// table with an integer first key column and more than two chunks of rows.
fn in_chunks(cfg: &crate::config::PostgresConfig, j: &TableJob) -> bool {
    let rows = u64::try_from(j.schema.row_estimate).unwrap_or(0);
    j.reshape.is_none() && j.chunk_key().is_some() && rows > 2 * cfg.snapshot_chunk_rows
}

/// Records the tables about to be copied at `lsn` before the copy starts, so that a copy cut
/// short is found and started over (see [`TableState::copying_at`]).
fn mark_copying(
    source: &crate::config::PostgresConfig,
    state: &mut PipelineState,
    todo: &[TableJob],
    lsn: Lsn,
    path: &super::state::StateFile,
) -> Result<()> {
    for j in todo {
        state.tables.insert(
            j.schema.table.to_string(),
            TableState {
                watermark: Lsn::default(),
                partitions: j.schema.partitions.clone(),
                copying_at: Some(lsn),
                excluded: source.excluded(&j.schema.table).to_vec(),
                chunked: None,
                copied: None,
            },
        );
    }
    state.save(path)
}

/// Why a table whose Iceberg table records `lsn` must be copied again, if it must: its
/// rows may lack changes that no slot or WAL can deliver any more.
fn copy_again(
    prior: Option<&PipelineState>,
    recorded: Option<&TableState>,
    ts: &TableSchema,
    lsn: Lsn,
) -> Option<String> {
    // Without a state the pipeline predates it: trust the Iceberg table once.
    let prior = prior?;
    if prior.resnapshot {
        return Some(
            "`sync --resnapshot` asked for a new copy (readers see the table as it was until the copy commits)".into(),
        );
    }
    let Some(recorded) = recorded else {
        return Some(
            "the pipeline did not follow it for a while (it was left out of `tables:`), so changes made meanwhile are missing".into(),
        );
    };
    if let Some(at) = recorded.copying_at {
        if lsn < at {
            return Some(format!("its copy at {at} was cut short"));
        }
        return None;
    }
    if recorded.partitions != ts.partitions {
        return Some(
            "partitions were attached or detached since it was copied; replication does not carry the rows they bring or take away".into(),
        );
    }
    let complete_through = recorded.watermark.max(lsn);
    if complete_through < prior.wal_removed_through {
        return Some(format!(
            "it is known complete only through {complete_through}, but the pipeline's WAL was already removed through {}",
            prior.wal_removed_through
        ));
    }
    None
}

/// Whether the Iceberg table was made from the source's current columns and key, so that a
/// new copy can replace its rows in place.
fn same_columns(table: &iceberg::table::Table, ts: &TableSchema) -> bool {
    let Some(recorded) = crate::sink::iceberg::evolve::recorded_columns(table) else {
        return false;
    };
    crate::table::primary_key(table.metadata().properties()) == ts.primary_key
        && recorded.len() == ts.columns.len()
        && recorded.iter().zip(&ts.columns).all(|(r, c)| {
            r.field.is_none() && r.name == c.name && r.oid == c.type_oid && r.typmod == c.typmod
        })
}

fn names(todo: &[TableJob]) -> Vec<String> {
    todo.iter().map(|j| j.schema.table.to_string()).collect()
}
