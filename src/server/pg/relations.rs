//! Gateway, Postgres imitation, the model relations in `pg_catalog`: `pg_tables` lists
//! tables only, `pg_views` the views with their definitions, `pg_rewrite` one `_RETURN`
//! rule per view and `pg_depend` its edges (the rule's internal edge to its view, and one
//! to each relation the view reads: dbt's dependency query follows them), `pg_description`
//! the comments, and `pg_class` marks the session's temporary tables `t`. Oids are those
//! `pg_class` gives in the same session.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::prelude::SessionContext;

use super::catalog::{rows, Extended, Extra, PgCatalog, Value};
use super::types::{column_types, ColumnTypes};
use crate::catalog::models::{ModelsState, RelName, ViewDef};
use crate::error::{Error, Result};

/// Rule oids: far above table oids, below index oids.
const REWRITE_OID_BASE: i64 = 3 << 28;

/// The oid `pg_class` gives each relation, by (schema, name).
pub(super) struct RelOids(HashMap<RelName, i64>);

impl RelOids {
    /// Reads `pg_class` joined to `pg_namespace` (pg_catalog's own tables).
    pub(super) async fn read(
        pg_class: Arc<dyn TableProvider>,
        pg_namespace: Arc<dyn TableProvider>,
    ) -> DfResult<Self> {
        let scratch = SessionContext::new();
        scratch.register_table("c", pg_class)?;
        scratch.register_table("n", pg_namespace)?;
        let batches = scratch
            .sql(
                "SELECT CAST(c.oid AS BIGINT) AS oid, n.nspname AS s, c.relname AS r \
                 FROM c JOIN n ON c.relnamespace = n.oid",
            )
            .await?
            .collect()
            .await?;
        let mut by_name = HashMap::new();
        for b in batches {
            let oids = b.column(0).as_primitive::<Int64Type>();
            let s = arrow::compute::cast(b.column(1), &DataType::Utf8)?;
            let r = arrow::compute::cast(b.column(2), &DataType::Utf8)?;
            let (s, r) = (s.as_string::<i32>(), r.as_string::<i32>());
            for i in 0..b.num_rows() {
                if oids.is_valid(i) && s.is_valid(i) && r.is_valid(i) {
                    by_name.insert(
                        (s.value(i).to_string(), r.value(i).to_string()),
                        oids.value(i),
                    );
                }
            }
        }
        Ok(Self(by_name))
    }

    pub(super) fn get(&self, schema: &str, name: &str) -> Option<i64> {
        self.0.get(&(schema.to_string(), name.to_string())).copied()
    }
}

/// A batch of `schema` with a row per item, or an empty one.
fn batch<T>(
    schema: &SchemaRef,
    items: &[T],
    value: impl Fn(&str, &T) -> Option<Value>,
) -> DfResult<RecordBatch> {
    if items.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    rows(schema, items, value)
}

/// `pg_tables` without the views (pg_catalog's lists every relation).
pub(super) fn tables_only(batch: RecordBatch, state: &ModelsState) -> DfResult<RecordBatch> {
    let schema = batch.schema();
    let (Ok(s), Ok(t)) = (schema.index_of("schemaname"), schema.index_of("tablename")) else {
        return Ok(batch);
    };
    let s = arrow::compute::cast(batch.column(s), &DataType::Utf8)?;
    let t = arrow::compute::cast(batch.column(t), &DataType::Utf8)?;
    let (s, t) = (s.as_string::<i32>(), t.as_string::<i32>());
    let keep: BooleanArray = (0..batch.num_rows())
        .map(|i| {
            Some(
                !state
                    .views
                    .contains_key(&(s.value(i).to_string(), t.value(i).to_string())),
            )
        })
        .collect();
    Ok(arrow::compute::filter_record_batch(&batch, &keep)?)
}

/// `pg_views`: one row per view.
pub(super) fn views(schema: &SchemaRef, state: &ModelsState) -> DfResult<RecordBatch> {
    let views: Vec<(&RelName, &ViewDef)> = state.views.iter().collect();
    batch(schema, &views, |col, (rel, def)| {
        Some(match col {
            "schemaname" => Value::Text(rel.0.clone()),
            "viewname" => Value::Text(rel.1.clone()),
            "viewowner" => Value::Text("skippr".into()),
            "definition" => Value::Text(definition(def)),
            _ => return None,
        })
    })
}

/// A view's definition as `pg_views` and `pg_get_viewdef` show it: as Postgres prints it
/// where it was printed when made, else the query as the gateway runs it.
pub(super) fn definition(def: &ViewDef) -> String {
    match &def.definition {
        Some(printed) => format!("{printed};"),
        None => format!(" {};", def.sql),
    }
}

/// The views with their oid and the oids of what they read.
fn view_oids(state: &ModelsState, oids: &RelOids) -> Vec<(i64, Vec<i64>)> {
    state
        .views
        .iter()
        .filter_map(|(rel, def)| {
            let oid = oids.get(&rel.0, &rel.1)?;
            let reads = def
                .depends
                .iter()
                .filter_map(|(s, n)| oids.get(s, n))
                .filter(|o| *o != oid)
                .collect();
            Some((oid, reads))
        })
        .collect()
}

/// `pg_rewrite`: a `_RETURN` rule per view.
pub(super) fn rewrites(
    schema: &SchemaRef,
    state: &ModelsState,
    oids: &RelOids,
) -> DfResult<RecordBatch> {
    let views = view_oids(state, oids);
    batch(schema, &views, |col, (view, _)| {
        Some(match col {
            "oid" => Value::Int(REWRITE_OID_BASE + view),
            "rulename" => Value::Text("_RETURN".into()),
            "ev_class" => Value::Int(*view),
            "ev_type" => Value::Text("1".into()),
            "ev_enabled" => Value::Text("O".into()),
            "is_instead" => Value::Bool(true),
            _ => return None,
        })
    })
}

/// One `pg_depend` edge.
struct Edge {
    classid: i64,
    objid: i64,
    refclassid: i64,
    refobjid: i64,
    deptype: &'static str,
}

/// `pg_depend`: for each view, its rule's internal edge to the view and a normal edge to
/// each relation it reads.
pub(super) fn depends(
    schema: &SchemaRef,
    state: &ModelsState,
    oids: &RelOids,
) -> DfResult<RecordBatch> {
    let (Some(rewrite), Some(class)) = (
        oids.get("pg_catalog", "pg_rewrite"),
        oids.get("pg_catalog", "pg_class"),
    ) else {
        return Ok(RecordBatch::new_empty(schema.clone()));
    };
    let mut edges = Vec::new();
    for (view, reads) in view_oids(state, oids) {
        let rule = REWRITE_OID_BASE + view;
        let edge = |refobjid, deptype| Edge {
            classid: rewrite,
            objid: rule,
            refclassid: class,
            refobjid,
            deptype,
        };
        edges.push(edge(view, "i"));
        edges.extend(reads.into_iter().map(|r| edge(r, "n")));
    }
    batch(schema, &edges, |col, e| {
        Some(match col {
            "classid" => Value::Int(e.classid),
            "objid" => Value::Int(e.objid),
            "objsubid" | "refobjsubid" => Value::Int(0),
            "refclassid" => Value::Int(e.refclassid),
            "refobjid" => Value::Int(e.refobjid),
            "deptype" => Value::Text(e.deptype.into()),
            _ => return None,
        })
    })
}

/// `pg_description`: the comments on model relations (`objsubid` 0) and their columns
/// (`objsubid` the column's number, from `attnums`: (relation oid, column) → attnum).
pub(super) fn descriptions(
    schema: &SchemaRef,
    state: &ModelsState,
    oids: &RelOids,
    attnums: &HashMap<(i64, String), i64>,
) -> DfResult<RecordBatch> {
    let class = oids.get("pg_catalog", "pg_class").unwrap_or(1259);
    let rows_: Vec<(i64, i64, String)> = state
        .comments
        .iter()
        .filter_map(|((s, r, c), text)| {
            let oid = oids.get(s, r)?;
            let sub = if c.is_empty() {
                0
            } else {
                *attnums.get(&(oid, c.clone()))?
            };
            Some((oid, sub, text.clone()))
        })
        .collect();
    batch(schema, &rows_, |col, (oid, sub, text)| {
        Some(match col {
            "objoid" => Value::Int(*oid),
            "classoid" => Value::Int(class),
            "objsubid" => Value::Int(*sub),
            "description" => Value::Text(text.clone()),
            _ => return None,
        })
    })
}

/// Reads (relation oid, column name) → attnum from `pg_attribute`.
pub(super) async fn attnums(
    pg_attribute: Arc<dyn TableProvider>,
) -> DfResult<HashMap<(i64, String), i64>> {
    let scratch = SessionContext::new();
    scratch.register_table("a", pg_attribute)?;
    let batches = scratch
        .sql("SELECT CAST(attrelid AS BIGINT), attname, CAST(attnum AS BIGINT) FROM a")
        .await?
        .collect()
        .await?;
    let mut out = HashMap::new();
    for b in batches {
        let rel = b.column(0).as_primitive::<Int64Type>();
        let name = arrow::compute::cast(b.column(1), &DataType::Utf8)?;
        let name = name.as_string::<i32>();
        let num = b.column(2).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            if rel.is_valid(i) && name.is_valid(i) && num.is_valid(i) {
                out.insert((rel.value(i), name.value(i).to_string()), num.value(i));
            }
        }
    }
    Ok(out)
}

impl Extended {
    /// The rows of a catalog table that lists model relations (`None` for the others):
    /// pg_catalog's own rows, with the models'.
    pub(super) async fn model_rows(
        &self,
        state: &ModelsState,
    ) -> DfResult<Option<Vec<RecordBatch>>> {
        let extra = self.extra;
        if !matches!(
            extra,
            Extra::Tables | Extra::Views | Extra::Rewrite | Extra::Depend | Extra::Description
        ) {
            return Ok(None);
        }
        let schema = self.base.schema();
        let scratch = SessionContext::new();
        let mut batches = scratch.read_table(self.base.clone())?.collect().await?;
        if let Extra::Tables = extra {
            return batches
                .into_iter()
                .map(|b| tables_only(b, state))
                .collect::<DfResult<Vec<_>>>()
                .map(Some);
        }
        if let Extra::Views = extra {
            batches.push(views(&schema, state)?);
            return Ok(Some(batches));
        }
        let table = |name: &'static str| async move {
            self.catalog
                .inner
                .table(name)
                .await?
                .ok_or_else(|| DataFusionError::Plan(format!("pg_catalog.{name} is missing")))
        };
        let oids = RelOids::read(table("pg_class").await?, table("pg_namespace").await?).await?;
        batches.push(match extra {
            Extra::Rewrite => rewrites(&schema, state, &oids)?,
            Extra::Depend => depends(&schema, state, &oids)?,
            _ => {
                let attnums = if state.comments.keys().any(|(_, _, c)| !c.is_empty()) {
                    attnums(table("pg_attribute").await?).await?
                } else {
                    HashMap::new()
                };
                descriptions(&schema, state, &oids, &attnums)?
            }
        });
        Ok(Some(batches))
    }
}

impl PgCatalog {
    /// The declared column types of the model tables a `CREATE TABLE` gave types to, by
    /// table oid.
    pub(super) async fn model_types(&self, types: &mut HashMap<i64, ColumnTypes>) -> Result<()> {
        let (Some((view, _)), Some(models)) = (&self.models, &self.ws.models) else {
            return Ok(());
        };
        let state = view.state();
        if state.tables.is_empty() {
            return Ok(());
        }
        let table = |name: &'static str| async move {
            self.inner
                .table(name)
                .await
                .map_err(Error::from)?
                .ok_or_else(|| Error::fatal(format!("pg_catalog.{name} is missing")))
        };
        let oids = RelOids::read(table("pg_class").await?, table("pg_namespace").await?)
            .await
            .map_err(Error::from)?;
        for (rel, location) in &state.tables {
            let Some(oid) = oids.get(&rel.0, &rel.1) else {
                continue;
            };
            let t = models.table(rel, location).await?;
            // The types a `CREATE TABLE` declared where it recorded them, else the types
            // that hold the columns' Iceberg types (a `CREATE TABLE AS`).
            let props = t.metadata().properties();
            let schema = crate::table::schema::arrow_schema(&t)?;
            types.insert(oid, column_types(&schema, props));
        }
        Ok(())
    }
}
