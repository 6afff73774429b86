//! A commit round: the tables a pipeline commits together. With a REST catalog that offers
//! `transactions/commit`, each table's change is staged while the round runs and all of
//! them go to the catalog in one atomic request when it ends, so every engine reading the
//! catalog sees all tables at the same LSN. Other catalogs commit table by table as before.

use std::future::Future;
use std::sync::{Arc, Mutex};

use iceberg::TableIdent;

use super::rest::{RestCatalog, TableChange};
use crate::error::{Context, Error, ErrorKind, Result};

tokio::task_local! {
    static ROUND: Round;
}

/// The changes to several tables of one catalog.
type Changes = Vec<(TableIdent, TableChange)>;

/// The changes staged in one round, in the order the tables committed.
#[derive(Clone, Default)]
pub struct Round {
    staged: Arc<Mutex<Vec<Staged>>>,
}

struct Staged {
    /// Names the catalog (see `SinkCatalog::key`).
    key: String,
    catalog: Arc<RestCatalog>,
    ident: TableIdent,
    change: TableChange,
}

impl Round {
    /// Runs `commits` inside this round: what they commit to a catalog that offers
    /// multi-table commits is staged until [`Round::finish`].
    pub async fn run<T>(&self, commits: impl Future<Output = T>) -> T {
        ROUND.scope(self.clone(), commits).await
    }

    /// Stages `change` when the calling task runs inside a round; gives it back when not.
    /// A second change to a table in the same round follows the first in one entry (its
    /// updates were built on the first's result).
    pub(super) fn stage(
        key: &str,
        catalog: &Arc<RestCatalog>,
        ident: &TableIdent,
        change: TableChange,
    ) -> Option<TableChange> {
        let Ok(round) = ROUND.try_with(Round::clone) else {
            return Some(change);
        };
        let mut staged = round.staged.lock().unwrap_or_else(|e| e.into_inner());
        match staged
            .iter_mut()
            .find(|s| s.key == key && &s.ident == ident)
        {
            Some(s) => s.change.updates.extend(change.updates),
            None => staged.push(Staged {
                key: key.to_string(),
                catalog: catalog.clone(),
                ident: ident.clone(),
                change,
            }),
        }
        None
    }

    /// How many tables the round has staged.
    pub fn staged_tables(&self) -> usize {
        self.staged.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Sends what the round staged: one atomic request per catalog. Returns how many
    /// tables were committed. A refused or unanswered request fails the round as a whole
    /// (retried from the catalog's state: the committed LSN of each table says what landed).
    pub async fn finish(self) -> Result<usize> {
        let staged = std::mem::take(&mut *self.staged.lock().unwrap_or_else(|e| e.into_inner()));
        let count = staged.len();
        let mut by_catalog: Vec<(Arc<RestCatalog>, Changes)> = Vec::new();
        let mut keys: Vec<String> = Vec::new();
        for s in staged {
            match keys.iter().position(|k| *k == s.key) {
                Some(i) => by_catalog[i].1.push((s.ident, s.change)),
                None => {
                    keys.push(s.key);
                    by_catalog.push((s.catalog, vec![(s.ident, s.change)]));
                }
            }
        }
        for (catalog, changes) in by_catalog {
            let tables = changes.len();
            let started = std::time::Instant::now();
            catalog
                .commit_transaction(changes)
                .await
                .map_err(|e| {
                    if e.retryable() || e.kind() == iceberg::ErrorKind::CatalogCommitConflicts {
                        Error::new(ErrorKind::Retryable, format!("{e}; it will be retried"))
                    } else {
                        Error::from(e)
                    }
                })
                .with_context(|| {
                    format!(
                        "committing {tables} tables in one round to the REST catalog at {}",
                        catalog.uri()
                    )
                })?;
            tracing::debug!(
                tables,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "commit round sent as one catalog transaction"
            );
        }
        Ok(count)
    }
}
