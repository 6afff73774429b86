//! Catalogs, models: the schemas, tables, views and comments that SQL builds through the
//! gateway (dbt models), beside the replicated tables in the same sqlite catalog. Their
//! state is one value ([`ModelsState`]); a change is a list of [`Op`]s applied to it in
//! order, and a commit applies the list to the catalog's current state and writes the
//! difference in one sqlite transaction, so other sessions see all of it or none of it.

mod sqlite;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use sqlite::ModelsCatalog;

/// A relation's place: (schema, name).
pub type RelName = (String, String);

/// A view as stored: its query (names qualified when it was created), its columns and the
/// relations it reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDef {
    /// The view's query, as the gateway plans it.
    pub sql: String,
    /// The view's columns: name and Arrow type (as `DataType`'s display spells it).
    pub columns: Vec<(String, String)>,
    /// The relations its query reads, by name.
    pub depends: Vec<RelName>,
    /// Its definition as Postgres prints it (`pg_get_viewdef`), made when it was created;
    /// absent for views made before it was kept, and for queries printed as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<String>,
}

/// Every model of the catalog at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelsState {
    /// The models schemas.
    pub namespaces: BTreeSet<String>,
    /// Tables: where their current metadata is.
    pub tables: BTreeMap<RelName, String>,
    pub views: BTreeMap<RelName, ViewDef>,
    /// Comments on relations (column `""`) and on their columns: (schema, relation, column).
    pub comments: BTreeMap<(String, String, String), String>,
}

/// What kind of relation a statement names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelKind {
    Table,
    View,
}

/// One change of the models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    CreateNamespace(String),
    /// Drops an empty schema (a cascading drop lists its relations' drops first).
    DropNamespace(String),
    CreateTable {
        rel: RelName,
        location: String,
    },
    /// A new version of a table: applies only while the table is at `old`.
    SwapTable {
        rel: RelName,
        old: String,
        new: String,
    },
    CreateView {
        rel: RelName,
        def: ViewDef,
        replace: bool,
    },
    Rename {
        rel: RelName,
        to: String,
    },
    Drop {
        rel: RelName,
        kind: RelKind,
    },
    Comment {
        rel: RelName,
        column: Option<String>,
        text: Option<String>,
    },
}

/// Why an [`Op`] cannot apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// The name is taken.
    Exists,
    /// The schema or relation does not exist.
    Missing,
    /// Another session changed the table since this one read it.
    Changed,
    /// The schema still holds relations.
    NotEmpty,
    /// The relation is not of the kind the statement names.
    WrongKind,
}

/// A refused [`Op`]: the conflict and a message naming the relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub conflict: Conflict,
    pub message: String,
}

fn refused(conflict: Conflict, message: String) -> Refused {
    Refused { conflict, message }
}

/// A relation as Postgres names it in messages.
fn shown(rel: &RelName) -> String {
    format!("{}.{}", rel.0, rel.1)
}

/// `relation ... does not exist`.
fn missing(rel: &RelName) -> Refused {
    refused(
        Conflict::Missing,
        format!("relation \"{}\" does not exist", shown(rel)),
    )
}

impl ModelsState {
    /// Whether a table or a view has this name.
    pub fn exists(&self, rel: &RelName) -> bool {
        self.tables.contains_key(rel) || self.views.contains_key(rel)
    }

    /// The kind of the relation with this name.
    pub fn kind(&self, rel: &RelName) -> Option<RelKind> {
        if self.tables.contains_key(rel) {
            Some(RelKind::Table)
        } else if self.views.contains_key(rel) {
            Some(RelKind::View)
        } else {
            None
        }
    }

    /// The views that read `rel`.
    pub fn dependents(&self, rel: &RelName) -> Vec<RelName> {
        self.views
            .iter()
            .filter(|(_, v)| v.depends.contains(rel))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn need_schema(&self, schema: &str) -> Result<(), Refused> {
        if self.namespaces.contains(schema) {
            Ok(())
        } else {
            Err(refused(
                Conflict::Missing,
                format!("schema \"{schema}\" does not exist"),
            ))
        }
    }

    fn need_free(&self, rel: &RelName) -> Result<(), Refused> {
        self.need_schema(&rel.0)?;
        if self.exists(rel) {
            return Err(refused(
                Conflict::Exists,
                format!("relation \"{}\" already exists", shown(rel)),
            ));
        }
        Ok(())
    }

    /// Applies `op`, or leaves the state as it was and says why it cannot.
    pub fn apply(&mut self, op: &Op) -> Result<(), Refused> {
        match op {
            Op::CreateNamespace(ns) => {
                if !self.namespaces.insert(ns.clone()) {
                    return Err(refused(
                        Conflict::Exists,
                        format!("schema \"{ns}\" already exists"),
                    ));
                }
            }
            Op::DropNamespace(ns) => {
                self.need_schema(ns)?;
                if self.tables.keys().chain(self.views.keys()).any(|(s, _)| s == ns) {
                    return Err(refused(
                        Conflict::NotEmpty,
                        format!("cannot drop schema {ns} because other objects depend on it: use DROP SCHEMA ... CASCADE"),
                    ));
                }
                self.namespaces.remove(ns);
                self.comments.retain(|(s, _, _), _| s != ns);
            }
            Op::CreateTable { rel, location } => {
                self.need_free(rel)?;
                self.tables.insert(rel.clone(), location.clone());
            }
            Op::SwapTable { rel, old, new } => match self.tables.get_mut(rel) {
                Some(current) if current == old => *current = new.clone(),
                Some(_) => {
                    return Err(refused(
                        Conflict::Changed,
                        format!("table \"{}\" was changed by another session meanwhile; run the statement again", shown(rel)),
                    ))
                }
                None => return Err(missing(rel)),
            },
            Op::CreateView { rel, def, replace } => {
                match (self.kind(rel), replace) {
                    (Some(RelKind::View), true) => {}
                    (Some(RelKind::Table), true) => {
                        return Err(refused(
                            Conflict::WrongKind,
                            format!("\"{}\" is not a view", shown(rel)),
                        ))
                    }
                    _ => self.need_free(rel)?,
                }
                self.views.insert(rel.clone(), def.clone());
            }
            Op::Rename { rel, to } => {
                let target = (rel.0.clone(), to.clone());
                if self.exists(&target) {
                    return Err(refused(
                        Conflict::Exists,
                        format!("relation \"{}\" already exists", shown(&target)),
                    ));
                }
                if let Some(location) = self.tables.remove(rel) {
                    self.tables.insert(target.clone(), location);
                } else if let Some(def) = self.views.remove(rel) {
                    self.views.insert(target.clone(), def);
                } else {
                    return Err(missing(rel));
                }
                let moved: Vec<_> = self
                    .comments
                    .keys()
                    .filter(|(s, r, _)| *s == rel.0 && *r == rel.1)
                    .cloned()
                    .collect();
                for key in moved {
                    if let Some(text) = self.comments.remove(&key) {
                        self.comments
                            .insert((key.0, to.clone(), key.2), text);
                    }
                }
            }
            Op::Drop { rel, kind } => {
                match self.kind(rel) {
                    Some(k) if k == *kind => {}
                    Some(_) => {
                        let what = match kind {
                            RelKind::Table => "a table",
                            RelKind::View => "a view",
                        };
                        return Err(refused(
                            Conflict::WrongKind,
                            format!("\"{}\" is not {what}", shown(rel)),
                        ));
                    }
                    None => return Err(missing(rel)),
                }
                let dependents = self.dependents(rel);
                if let Some(v) = dependents.first() {
                    return Err(refused(
                        Conflict::NotEmpty,
                        format!(
                            "cannot drop {} because view {} depends on it: drop the view first, or use DROP ... CASCADE",
                            shown(rel),
                            shown(v)
                        ),
                    ));
                }
                self.tables.remove(rel);
                self.views.remove(rel);
                self.comments
                    .retain(|(s, r, _), _| !(*s == rel.0 && *r == rel.1));
            }
            Op::Comment { rel, column, text } => {
                if !self.exists(rel) {
                    return Err(missing(rel));
                }
                let key = (rel.0.clone(), rel.1.clone(), column.clone().unwrap_or_default());
                match text {
                    Some(t) => {
                        self.comments.insert(key, t.clone());
                    }
                    None => {
                        self.comments.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }

    /// The state after every op of `ops`, or the first refusal.
    pub fn after(&self, ops: &[Op]) -> Result<Self, Refused> {
        let mut next = self.clone();
        for op in ops {
            next.apply(op)?;
        }
        Ok(next)
    }

    /// The folders of the tables `self` has and `next` no longer has: the tables a change
    /// dropped (a renamed or rewritten table keeps its folder).
    pub fn dropped_folders(&self, next: &ModelsState) -> Vec<String> {
        let kept: BTreeSet<&str> = next
            .tables
            .values()
            .filter_map(|l| table_folder(l))
            .collect();
        self.tables
            .values()
            .filter_map(|l| table_folder(l))
            .filter(|f| !kept.contains(f))
            .map(str::to_string)
            .collect()
    }
}

/// The folder of a table, from the location of one of its metadata files
/// (`<folder>/metadata/<file>`).
pub fn table_folder(metadata_location: &str) -> Option<&str> {
    let (dir, _) = metadata_location.rsplit_once('/')?;
    dir.strip_suffix("/metadata")
}

#[cfg(test)]
mod tests;
