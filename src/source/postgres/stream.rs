//! The change stream: reads the pipeline's slot (pgoutput), completes each relation message
//! from the source's catalog (see `relation`), hands whole transactions to the pipeline's
//! `TxnAppender` (Skippr's WAL, which keeps a large one on disk), has them made durable, and
//! only then acknowledges them to Postgres.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgwire_replication::{ReplicationClient, ReplicationEvent};
use tokio::sync::watch;

use super::connect::replication_session;
use super::pgoutput::{self, Message};
use crate::change::{Change, Datum, Lsn, Op, Relation, Txn, TxnAppender};
use crate::config::PostgresConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::telemetry::metrics;

/// Prefix of the logical message `sync --once` emits to know where "now" is in the stream.
pub const ONCE_MARKER_PREFIX: &str = "skippr.once";
/// Longest time a complete transaction waits before it is made durable and acknowledged.
const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// When the stream ends.
#[derive(Debug, Clone)]
pub enum StopAt {
    /// When the logical message with this content arrives (everything committed before it
    /// has then been received).
    Marker(String),
    /// Only on shutdown.
    Shutdown,
}

/// Prefix of the logical message that proves a silent replication connection alive.
pub const HEARTBEAT_PREFIX: &str = "skippr.heartbeat";

/// Asks the source for a heartbeat: a non-transactional logical message that comes back
/// through the slot. It uses its own SQL session, opened when first needed and reopened
/// after a failure; each try is bounded by the peer timeout.
struct Heartbeat {
    wake: std::sync::Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeat {
    fn spawn(cfg: PostgresConfig) -> Self {
        let wake = std::sync::Arc::new(tokio::sync::Notify::new());
        let notified = wake.clone();
        let task = tokio::spawn(async move {
            let mut session: Option<tokio_postgres::Client> = None;
            loop {
                notified.notified().await;
                let emit = async {
                    if session.as_ref().is_none_or(|c| c.is_closed()) {
                        session = Some(super::connect::connect(&cfg).await?);
                    }
                    if let Some(c) = &session {
                        c.execute(
                            "SELECT pg_logical_emit_message(false, $1, '')",
                            &[&HEARTBEAT_PREFIX],
                        )
                        .await?;
                    }
                    Ok::<(), Error>(())
                };
                match tokio::time::timeout(cfg.peer_timeout, emit).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(slot = %cfg.slot, error = %e.report(), "heartbeat failed");
                        session = None;
                    }
                    Err(_) => {
                        tracing::debug!(slot = %cfg.slot, "heartbeat got no answer");
                        session = None;
                    }
                }
            }
        });
        Self { wake, task }
    }

    fn ping(&self) {
        self.wake.notify_one();
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The columns a pipeline leaves out (`exclude_columns`), by their place in each relation's
/// tuples: they are cut from the relation's description and from every tuple of it, so
/// nothing downstream (Skippr's WAL included) ever holds their values.
#[derive(Default)]
struct LeftOut {
    places: HashMap<u32, Vec<usize>>,
}

impl LeftOut {
    /// Cuts the excluded columns out of a relation's description, noting their places.
    fn exclude(&mut self, cfg: &PostgresConfig, r: &mut Relation) {
        let table = crate::config::TableRef {
            schema: r.namespace.clone(),
            name: r.name.clone(),
        };
        let excluded = cfg.excluded(&table);
        let places: Vec<usize> = r
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| excluded.contains(&c.name))
            .map(|(i, _)| i)
            .collect();
        if places.is_empty() {
            self.places.remove(&r.id);
            return;
        }
        let mut i = 0;
        r.columns.retain(|_| {
            let keep = !places.contains(&i);
            i += 1;
            keep
        });
        self.places.insert(r.id, places);
    }

    /// A tuple of `rel` without the excluded columns' values (a tuple of another width is
    /// left as it is, for the width check to refuse).
    fn cut(&self, rel: u32, mut tuple: Vec<Datum>) -> Vec<Datum> {
        if let Some(places) = self.places.get(&rel) {
            if places.last().is_some_and(|last| *last < tuple.len()) {
                for at in places.iter().rev() {
                    tuple.remove(*at);
                }
            }
        }
        tuple
    }
}

/// Checks a change's tuples against the description of its relation in effect: a change of
/// an undescribed relation, or of another width, stops the stream before it is
/// acknowledged (never padded with NULLs).
fn check_width(
    relations: &HashMap<u32, Relation>,
    rel: u32,
    tuples: &[Option<&Vec<Datum>>],
) -> Result<()> {
    let Some(r) = relations.get(&rel) else {
        return Err(Error::fatal(format!(
            "the change stream sent a change of relation id {rel} before describing it; nothing after the last acknowledged transaction was acknowledged: restart, and if it happens again run `skipprd sync --resnapshot`"
        )));
    };
    for t in tuples.iter().flatten() {
        if t.len() != r.columns.len() {
            return Err(Error::fatal(format!(
                "{}; nothing of this transaction was acknowledged. Restart to retry; if it happens again run `skipprd sync --resnapshot`",
                r.width_mismatch(t.len())
            )));
        }
    }
    Ok(())
}

/// Streams from the slot into `out`, from `start` (the slot's confirmed position when
/// zero), for `pipeline`. Publishes each durable LSN on `durable`. Returns the last durable
/// LSN.
#[allow(clippy::too_many_arguments)]
pub async fn stream(
    cfg: &PostgresConfig,
    pipeline: &str,
    out: &mut dyn TxnAppender,
    start: Lsn,
    stop: StopAt,
    mut shutdown: watch::Receiver<bool>,
    durable: &watch::Sender<Lsn>,
) -> Result<Lsn> {
    let peer_timeout = cfg.peer_timeout;
    // Status updates at least every third of the peer timeout: the server's
    // `wal_sender_timeout` (60s by default) is then never reached while we are alive.
    let rc = replication_session(cfg, &cfg.slot)
        .await?
        .with_start_lsn(pgwire_replication::Lsn(start.0))
        .with_status_interval(Duration::from_secs(1))
        .with_wakeup_interval((peer_timeout / 3).max(Duration::from_secs(1)));
    let connecting = tokio::time::timeout(peer_timeout, ReplicationClient::connect(rc)).await;
    let mut client = match connecting {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let cause = Error::from(e);
            let hint = if cause.kind() == ErrorKind::Retryable {
                "the source is unreachable or restarting; retrying"
            } else {
                "run `skipprd discover` to check the slot and publication"
            };
            return Err(Error::new(
                cause.kind(),
                format!(
                    "cannot start replication from slot `{}`: {}; {hint}",
                    cfg.slot,
                    cause.message()
                ),
            )
            .with_source(cause));
        }
        Err(_) => {
            return Err(Error::retryable(format!(
                "cannot start replication from slot `{}`: no answer within {}s (skippr.reconnect.peer_timeout)",
                cfg.slot,
                peer_timeout.as_secs()
            )))
        }
    };
    // Descriptions in effect at this point of the stream, completed from the catalog.
    let mut relations: HashMap<u32, Relation> = HashMap::new();
    let mut left_out = LeftOut::default();
    // A plain connection for the catalog, opened at the first relation message.
    let mut catalog: Option<tokio_postgres::Client> = None;
    let mut last_end = start;
    let mut last_durable = start;
    let mut last_flush = Instant::now();
    let mut tick = tokio::time::interval(FLUSH_INTERVAL);
    let mut server_end = start;
    crate::telemetry::state::set(pipeline, crate::telemetry::state::State::Streaming, None);
    // Liveness: anything from the server proves the connection is alive. After half the
    // peer timeout of silence a heartbeat (a logical message) is asked for; after the whole
    // timeout the peer counts as dead and the stream ends with a retryable error.
    let heartbeat = Heartbeat::spawn(cfg.clone());
    let mut progress = crate::telemetry::progress::CatchUp::new(pipeline);
    let mut last_heard = Instant::now();
    let mut pinged = false;
    // `heartbeat_interval`: a heartbeat at that pace whatever the stream does, so the slot
    // moves on a server quiet in this database too (zero: only the liveness ones above).
    let mut last_beat = Instant::now();

    let flush = |out: &mut dyn TxnAppender,
                 client: &ReplicationClient,
                 last_durable: &mut Lsn|
     -> Result<()> {
        if let Some((lsn, bytes)) = out.flush()? {
            metrics::add(
                "skippr_wal_written_bytes_total",
                "Bytes written to Skippr's WAL.",
                &[("pipeline", pipeline)],
                bytes as f64,
            );
            metrics::set(
                "skippr_wal_durable_lsn",
                "Source LSN durable in Skippr's WAL (and acknowledged to Postgres).",
                &[("pipeline", pipeline)],
                lsn.0 as f64,
            );
            client.update_applied_lsn(pgwire_replication::Lsn(lsn.0));
            *last_durable = lsn;
            let _ = durable.send(lsn);
        }
        Ok(())
    };

    loop {
        let event = tokio::select! {
            ev = client.recv() => {
                last_heard = Instant::now();
                pinged = false;
                ev.map_err(|e| {
                    let cause = Error::from(e);
                    Error::new(cause.kind(), format!("replication stream from slot `{}` failed: {}", cfg.slot, cause.message())).with_source(cause)
                })?
            }
            _ = tick.tick() => {
                let silent = last_heard.elapsed();
                if silent >= peer_timeout {
                    client.abort();
                    return Err(Error::retryable(format!(
                        "the replication connection of slot `{}` sent nothing for {}s, not even a heartbeat: the source or the network is down (skippr.reconnect.peer_timeout)",
                        cfg.slot,
                        silent.as_secs()
                    )));
                }
                if !pinged && silent >= peer_timeout / 2 {
                    heartbeat.ping();
                    pinged = true;
                    last_beat = Instant::now();
                }
                if !cfg.heartbeat_interval.is_zero() && last_beat.elapsed() >= cfg.heartbeat_interval {
                    heartbeat.ping();
                    last_beat = Instant::now();
                }
                if !out.is_empty() && last_flush.elapsed() >= FLUSH_INTERVAL / 2 {
                    flush(out, &client, &mut last_durable)?;
                    last_flush = Instant::now();
                } else if out.is_empty() && out.open_changes().is_none() && last_end > last_durable {
                    // Only transactions without our tables since the last flush: nothing is
                    // pending, so their end can be acknowledged and the slot can advance.
                    out.note_acknowledged(last_end)?;
                    client.update_applied_lsn(pgwire_replication::Lsn(last_end.0));
                    last_durable = last_end;
                    let _ = durable.send(last_end);
                }
                continue;
            }
            _ = shutdown.changed() => {
                flush(out, &client, &mut last_durable)?;
                break;
            }
        };
        let Some(event) = event else {
            return Err(Error::new(
                ErrorKind::Retryable,
                format!(
                    "the replication stream from slot `{}` ended unexpectedly",
                    cfg.slot
                ),
            ));
        };
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                xid,
                commit_time_micros,
            } => {
                out.begin(Txn {
                    xid,
                    commit_lsn: Lsn(final_lsn.0),
                    end_lsn: Lsn(final_lsn.0),
                    commit_time_micros,
                    changes: Vec::new(),
                });
            }
            ReplicationEvent::XLogData { data, wal_end, .. } => {
                server_end = server_end.max(Lsn(wal_end.0));
                let msg = pgoutput::decode(data).map_err(|e| {
                    Error::new(
                        ErrorKind::Fatal,
                        format!("replication slot `{}`: {e}", cfg.slot),
                    )
                })?;
                let change = match msg {
                    Message::Relation(raw) => {
                        if catalog.is_none() {
                            catalog = Some(super::connect::connect(cfg).await?);
                        }
                        let Some(client) = catalog.as_ref() else {
                            continue;
                        };
                        let mut r = super::relation::resolve(client, raw).await?;
                        left_out.exclude(cfg, &mut r);
                        relations.insert(r.id, r.clone());
                        // Inside a transaction a new description applies from this point:
                        // keep it in the transaction, in order with the changes.
                        if out.open_changes().is_some() {
                            Some(Change {
                                op: Op::Relation,
                                rel: r.id,
                                old: None,
                                new: None,
                                relation: Some(r),
                            })
                        } else {
                            out.relation(r);
                            None
                        }
                    }
                    Message::Insert { rel, new } => Some(Change {
                        op: Op::Insert,
                        rel,
                        old: None,
                        new: Some(left_out.cut(rel, new)),
                        relation: None,
                    }),
                    Message::Update { rel, old, new } => Some(Change {
                        op: Op::Update,
                        rel,
                        old: old.map(|o| left_out.cut(rel, o)),
                        new: Some(left_out.cut(rel, new)),
                        relation: None,
                    }),
                    Message::Delete { rel, old } => Some(Change {
                        op: Op::Delete,
                        rel,
                        old: Some(left_out.cut(rel, old)),
                        new: None,
                        relation: None,
                    }),
                    Message::Truncate { rels, .. } => {
                        if out.open_changes().is_some() {
                            for rel in rels {
                                check_width(&relations, rel, &[])?;
                                out.change(Change {
                                    op: Op::Truncate,
                                    rel,
                                    old: None,
                                    new: None,
                                    relation: None,
                                })?;
                            }
                        }
                        None
                    }
                    Message::Other(_) => None,
                };
                if let Some(c) = change {
                    if c.op != Op::Relation {
                        check_width(&relations, c.rel, &[c.old.as_ref(), c.new.as_ref()])?;
                    }
                    if out.open_changes().is_none() {
                        return Err(Error::fatal(format!(
                            "replication slot `{}` sent a change outside a transaction",
                            cfg.slot
                        )));
                    }
                    out.change(c)?;
                }
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                server_end = server_end.max(Lsn(wal_end.0));
                if out.open_changes().is_none() {
                    // A logical walsender's keepalive carries the position it decoded
                    // through: every transaction committed before it was sent before this
                    // message. Once what was received is flushed, the WAL holds every change
                    // up to it, so it can be noted and acknowledged like the end of a
                    // transaction without our tables. This is what lets a reader's fence on
                    // `pg_current_wal_insert_lsn()` complete when no later change arrives.
                    last_end = last_end.max(Lsn(wal_end.0));
                }
                // Nothing received and not yet durable: caught up, whatever else the server
                // wrote meanwhile (other databases, tables outside the publication).
                let behind = if out.is_empty() && out.open_changes().is_none() {
                    progress.caught_up();
                    0
                } else {
                    server_end.0.saturating_sub(last_durable.0)
                };
                metrics::set(
                    "skippr_replication_lag_bytes",
                    "Source WAL not yet durable in Skippr's WAL, in bytes (server WAL end minus durable LSN).",
                    &[("pipeline", pipeline)],
                    behind as f64,
                );
            }
            ReplicationEvent::Commit { lsn, end_lsn, .. } => {
                if let Some(changes) = out.open_changes() {
                    progress.on_commit(changes, Lsn(end_lsn.0), server_end);
                    metrics::add(
                        "skippr_source_changes_total",
                        "Row changes received from the source.",
                        &[("pipeline", pipeline)],
                        changes as f64,
                    );
                    metrics::add(
                        "skippr_source_transactions_total",
                        "Source transactions received.",
                        &[("pipeline", pipeline)],
                        1.0,
                    );
                }
                if out.open_changes().is_some() {
                    last_end = last_end.max(Lsn(end_lsn.0));
                    out.commit(Lsn(lsn.0), Lsn(end_lsn.0))?;
                }
                if out.flush_due() {
                    flush(out, &client, &mut last_durable)?;
                    last_flush = Instant::now();
                }
            }
            ReplicationEvent::Message {
                transactional: false,
                lsn,
                prefix,
                content,
            } if prefix == ONCE_MARKER_PREFIX => {
                if let StopAt::Marker(m) = &stop {
                    // With protocol 1 a message never arrives inside a transaction; if one
                    // were open it is not in the WAL yet and will be sent again next time.
                    if content.as_ref() == m.as_bytes() {
                        // Every transaction that committed before the marker was sent before
                        // it: the stream is complete through the marker's position, even
                        // when nothing changed since the last transaction.
                        if out.open_changes().is_none() {
                            last_end = last_end.max(Lsn(lsn.0));
                        }
                        flush(out, &client, &mut last_durable)?;
                        if out.is_empty() && last_end > last_durable {
                            out.note_acknowledged(last_end)?;
                            client.update_applied_lsn(pgwire_replication::Lsn(last_end.0));
                            last_durable = last_end;
                        }
                        break;
                    }
                }
            }
            ReplicationEvent::StoppedAt { .. } => {
                flush(out, &client, &mut last_durable)?;
                break;
            }
            _ => {}
        }
    }
    // Let the final acknowledgement reach the server before closing.
    client.stop();
    let _ = tokio::time::timeout(Duration::from_secs(5), client.join()).await;
    Ok(last_durable)
}
