//! Pipelines, the source as readers see it: how far a pipeline's source has written, for
//! readers that wait until the tables show it (the gateway's `skippr.wait_for_lsn` fence),
//! and the health of its slot (`skippr.sources`). Readers ask the pipeline layer, which owns
//! every conversation with the source.

use std::sync::Arc;

use async_trait::async_trait;

use crate::change::Lsn;
use crate::config::PostgresConfig;
use crate::error::{Error, Result};
use crate::source::postgres::connect::connect;
use crate::source::postgres::slot::{self, SlotHealth};

/// Where a pipeline's source is now.
///
/// Contract: [`SourcePosition::current`] answers an LSN at or after the end of every
/// transaction the source had committed when it was asked, so that a reader that waits
/// until the pipeline's tables show it sees all of them; it fails (never guesses) when the
/// source cannot be asked.
#[async_trait]
pub trait SourcePosition: Send + Sync {
    async fn current(&self) -> Result<Lsn>;
}

/// A Postgres source's WAL insert position (`pg_current_wal_insert_lsn()`), asked over a
/// plain connection.
struct PostgresPosition {
    pipeline: String,
    source: PostgresConfig,
}

#[async_trait]
impl SourcePosition for PostgresPosition {
    async fn current(&self) -> Result<Lsn> {
        let pipeline = &self.pipeline;
        let client = connect(&self.source).await?;
        let row = client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(|e| {
                Error::query(format!(
                    "asking the source of pipeline {pipeline} for its LSN: {e}"
                ))
            })?;
        let text: String = row.get(0);
        Lsn::parse(&text).map_err(|e| {
            Error::query(format!(
                "the source of pipeline {pipeline} answered an LSN that does not read ({e})"
            ))
        })
    }
}

/// The position of pipeline `pipeline`, whose source is `source`.
pub fn of(pipeline: &str, source: &PostgresConfig) -> Arc<dyn SourcePosition> {
    Arc::new(PostgresPosition {
        pipeline: pipeline.to_string(),
        source: source.clone(),
    })
}

/// The health of the slot of a pipeline whose source is `source`, asked of the source on a
/// connection of its own (a source that cannot answer gives a health with only its error).
pub async fn slot_health(source: &PostgresConfig) -> SlotHealth {
    slot::health(source).await
}
