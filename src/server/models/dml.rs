//! Gateway, models, rows of models: `INSERT INTO ... VALUES|SELECT`, `DELETE FROM ... [USING]
//! WHERE` (dbt's delete+insert), `UPDATE ... SET ... [FROM] WHERE` (dbt's snapshots) and
//! `TRUNCATE` (dbt's seeds). An insert appends data files. A delete or update reads the
//! table with row numbers, lets the engine find the rows the statement's own WHERE (and
//! FROM/USING) selects, and writes the table's new rows in one snapshot that replaces the
//! old files: simple and exact, and it costs a rewrite of the table (models are rebuilt
//! whole by dbt in any case).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableProvider;
use datafusion::logical_expr::{lit, Expr, LogicalPlanBuilder};
use datafusion::sql::sqlparser::ast::{ObjectName, Statement, TableFactor, TableWithJoins};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_postgres::hooks::HookClient;
use futures::StreamExt;
use pgwire::api::results::{Response, Tag};
use pgwire::error::{PgWireError, PgWireResult};

use super::ddl::is_temp;
use super::rows::{self, relation_of};
use super::{internal, user_error, Leftovers, Run};
use crate::catalog::models::{Op, RelName};
use crate::error::sqlstate;
use crate::query::models::ModelsView;
use crate::server::planning::{plan_statement, verify_read_only};
use crate::sink::iceberg::models as sink;

/// The column of row numbers a delete or update reads its target with.
const ROW: &str = "__skippr_row";

fn df(e: impl Into<datafusion::error::DataFusionError>) -> PgWireError {
    PgWireError::ApiError(Box::new(e.into()))
}

/// The table a statement changes: a model table (with its metadata location in this
/// session's view) or one of the session's temporary tables.
enum Target {
    Model {
        table: Box<iceberg::table::Table>,
        location: String,
    },
    Temp,
}

impl Target {
    async fn open(run: &Run<'_>, rel: &RelName) -> PgWireResult<(Target, Arc<dyn TableProvider>)> {
        if is_temp(run, &rel.0) {
            let t = run
                .models
                .temp_provider()
                .table(&rel.1)
                .await
                .map_err(df)?
                .ok_or_else(|| {
                    user_error(
                        sqlstate::UNDEFINED_TABLE,
                        format!("relation \"{}\" does not exist", rel.1),
                    )
                })?;
            return Ok((Target::Temp, t));
        }
        let state = run.models.state();
        let Some(location) = state.tables.get(rel) else {
            let what = if state.views.contains_key(rel) {
                format!(
                    "cannot change view \"{}.{}\": views are read-only; change the tables it reads",
                    rel.0, rel.1
                )
            } else {
                format!("relation \"{}.{}\" does not exist", rel.0, rel.1)
            };
            return Err(user_error(
                if state.views.contains_key(rel) {
                    sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE
                } else {
                    sqlstate::UNDEFINED_TABLE
                },
                what,
            ));
        };
        let models = run.models.models()?;
        let table = models.table(rel, location).await.map_err(internal)?;
        let provider = models.provider(&table).await.map_err(internal)?;
        Ok((
            Target::Model {
                table: Box::new(table),
                location: location.clone(),
            },
            provider,
        ))
    }

    /// The Arrow schema rows of the table have.
    fn schema(&self, provider: &Arc<dyn TableProvider>) -> PgWireResult<SchemaRef> {
        match self {
            Target::Model { table, .. } => sink::write_schema(table).map_err(internal),
            Target::Temp => Ok(provider.schema()),
        }
    }
}

pub(super) async fn insert(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    name: &ObjectName,
    columns: &[String],
    source: &datafusion::sql::sqlparser::ast::Query,
) -> PgWireResult<Response> {
    let rel = relation_of(run, name)?;
    let (target, provider) = Target::open(run, &rel).await?;
    let schema = target.schema(&provider)?;
    let plan = plan_statement(run.ctx, &Statement::Query(Box::new(source.clone())))
        .await
        .map_err(df)?;
    verify_read_only(&plan).map_err(df)?;
    let named: Vec<String> = if columns.is_empty() {
        schema.fields().iter().map(|f| f.name().clone()).collect()
    } else {
        columns.to_vec()
    };
    for c in &named {
        if schema.index_of(c).is_err() {
            return Err(user_error(
                sqlstate::UNDEFINED_COLUMN,
                format!("column \"{c}\" of relation \"{}\" does not exist", rel.1),
            ));
        }
    }
    let given = plan.schema().fields().len();
    if given != named.len() {
        let more = if given > named.len() {
            "expressions than target columns"
        } else {
            "target columns than expressions"
        };
        return Err(user_error(
            sqlstate::SYNTAX_ERROR,
            format!("INSERT has more {more}"),
        ));
    }
    // The table's columns in order: the given values, NULL for the others.
    let source_columns: Vec<Expr> = plan
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    let exprs: Vec<Expr> = schema
        .fields()
        .iter()
        .map(|f| match named.iter().position(|n| n == f.name()) {
            Some(i) => source_columns[i].clone().alias(f.name()),
            None => lit(ScalarValue::Null).alias(f.name()),
        })
        .collect();
    let plan = LogicalPlanBuilder::from(plan)
        .project(exprs)
        .and_then(|b| b.build())
        .map_err(df)?;
    let n = match target {
        Target::Model { table, location } => {
            let (files, n) = rows::write_plan(run, &table, plan).await?;
            if n > 0 {
                commit(run, client, &rel, &table, &location, files, false, "INSERT").await?;
            }
            n as usize
        }
        Target::Temp => {
            let mut batches = rows::read_all(run, provider.clone()).await?;
            let mut added = rows::stream(run, plan).await?;
            let mut n = 0;
            while let Some(b) = added.next().await {
                let b = sink::conform(&b?, &schema)
                    .map_err(|e| user_error(sqlstate::NOT_NULL_VIOLATION, e.to_string()))?;
                n += b.num_rows();
                batches.push(b);
            }
            replace_temp(run, &rel, schema, batches)?;
            n
        }
    };
    Ok(Response::Execution(
        Tag::new("INSERT").with_oid(0).with_rows(n),
    ))
}

/// Stages `files` as the table's new version and records the swap.
#[allow(clippy::too_many_arguments)]
async fn commit(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    rel: &RelName,
    table: &iceberg::table::Table,
    location: &str,
    files: Vec<iceberg::spec::DataFile>,
    replace_all: bool,
    command: &str,
) -> PgWireResult<()> {
    let staged = sink::stage(table, files, replace_all, command)
        .await
        .map_err(internal)?;
    let models = run.models.models()?;
    models.remember(&staged.table);
    let op = Op::SwapTable {
        rel: rel.clone(),
        old: location.to_string(),
        new: super::location_of(&staged.table)?,
    };
    let files = Leftovers {
        created: staged.written,
        garbage: staged.garbage,
    };
    run.models.record(client, vec![op], files).await
}

/// Puts `batches` in the place of temporary table `rel`.
fn replace_temp(
    run: &Run<'_>,
    rel: &RelName,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> PgWireResult<()> {
    let temp = run.models.temp_provider();
    let table = rows::mem_table(schema, batches)?;
    temp.deregister_table(&rel.1).map_err(df)?;
    temp.register_table(rel.1.clone(), table).map_err(df)?;
    Ok(())
}

pub(super) async fn truncate(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    name: &ObjectName,
) -> PgWireResult<()> {
    let rel = relation_of(run, name)?;
    let (target, provider) = Target::open(run, &rel).await?;
    match target {
        Target::Model { table, location } => {
            commit(
                run,
                client,
                &rel,
                &table,
                &location,
                Vec::new(),
                true,
                "TRUNCATE",
            )
            .await
        }
        Target::Temp => replace_temp(run, &rel, provider.schema(), Vec::new()),
    }
}

/// DELETE (no `sets`) or UPDATE: the rows the statement selects are found by the engine
/// with row numbers, and the table is written anew.
pub(super) async fn rewrite(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    target: &TableWithJoins,
    others: &[TableWithJoins],
    selection: Option<&datafusion::sql::sqlparser::ast::Expr>,
    sets: &[(String, String)],
) -> PgWireResult<Response> {
    let TableFactor::Table { name, alias, .. } = &target.relation else {
        return Err(user_error(
            sqlstate::FEATURE_NOT_SUPPORTED,
            "the table to change must be named",
        ));
    };
    if !target.joins.is_empty() {
        return Err(user_error(
            sqlstate::FEATURE_NOT_SUPPORTED,
            "name the other tables in USING or FROM, not in a JOIN",
        ));
    }
    let rel = relation_of(run, name)?;
    let (table, provider) = Target::open(run, &rel).await?;
    let schema = table.schema(&provider)?;
    for (column, _) in sets {
        if schema.index_of(column).is_err() {
            return Err(user_error(
                sqlstate::UNDEFINED_COLUMN,
                format!(
                    "column \"{column}\" of relation \"{}\" does not exist",
                    rel.1
                ),
            ));
        }
    }
    let batches = rows::read_all(run, provider.clone()).await?;
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    if bytes > run.exec.memory {
        return Err(user_error(
            sqlstate::OUT_OF_MEMORY,
            format!(
                "{tag_name} of {}.{} reads the table whole, and it holds more than skippr.query.max_query_memory ({} bytes): raise that setting, or rebuild the model as a table (dbt: materialized='table' or --full-refresh)",
                rel.0,
                rel.1,
                run.exec.memory,
                tag_name = if sets.is_empty() { "DELETE" } else { "UPDATE" }
            ),
        ));
    }
    let all = arrow::compute::concat_batches(&provider.schema(), &batches).map_err(df)?;
    let numbered = numbered(&all)?;
    // The statement's own WHERE, over the target read with row numbers.
    let qualifier = match alias {
        Some(a) => a.name.to_string(),
        None => name.to_string(),
    };
    let mut sql = format!("SELECT {qualifier}.{ROW}");
    for (_, value) in sets {
        sql.push_str(&format!(", {value}"));
    }
    sql.push_str(&format!(" FROM {target}"));
    for t in others {
        sql.push_str(&format!(", {t}"));
    }
    if let Some(s) = selection {
        sql.push_str(&format!(" WHERE {s}"));
    }
    let found = {
        let table_with_rows = rows::mem_table(numbered.schema(), vec![numbered])?;
        let _reading = Substitution::start(run, &rel, table_with_rows, &provider)?;
        let statement = Parser::parse_sql(&PostgreSqlDialect {}, &sql)
            .map_err(|e| user_error(sqlstate::SYNTAX_ERROR, e.to_string()))?
            .pop()
            .ok_or_else(|| user_error(sqlstate::SYNTAX_ERROR, "empty statement"))?;
        let plan = plan_statement(run.ctx, &statement).await.map_err(df)?;
        verify_read_only(&plan).map_err(df)?;
        let mut out = Vec::new();
        let mut rows = rows::stream(run, plan).await?;
        while let Some(b) = rows.next().await {
            out.push(b?);
        }
        out
    };
    // First match wins, as in Postgres when a FROM gives several rows for one target row.
    let mut chosen: HashMap<u64, (usize, usize)> = HashMap::new();
    for (bi, b) in found.iter().enumerate() {
        let ids = arrow::compute::cast(b.column(0), &DataType::UInt64).map_err(df)?;
        let ids = ids.as_primitive::<UInt64Type>();
        for r in 0..b.num_rows() {
            if ids.is_valid(r) {
                chosen.entry(ids.value(r)).or_insert((bi, r));
            }
        }
    }
    let n = chosen.len();
    let tag = if sets.is_empty() { "DELETE" } else { "UPDATE" };
    if n == 0 {
        return Ok(Response::Execution(Tag::new(tag).with_rows(0)));
    }
    let new_rows = if sets.is_empty() {
        let keep: BooleanArray = (0..all.num_rows() as u64)
            .map(|i| Some(!chosen.contains_key(&i)))
            .collect();
        arrow::compute::filter_record_batch(&all, &keep).map_err(df)?
    } else {
        updated(&all, &found, &chosen, sets)?
    };
    let new_rows = sink::conform(&new_rows, &schema)
        .map_err(|e| user_error(sqlstate::NOT_NULL_VIOLATION, e.to_string()))?;
    match table {
        Target::Model { table, location } => {
            let stream = futures::stream::iter(vec![Ok(new_rows)]);
            let (files, _) = rows::write_rows(&table, stream).await?;
            commit(run, client, &rel, &table, &location, files, true, tag).await?;
        }
        Target::Temp => replace_temp(run, &rel, schema, vec![new_rows])?,
    }
    Ok(Response::Execution(Tag::new(tag).with_rows(n)))
}

/// `batch` with a last column of row numbers.
fn numbered(batch: &RecordBatch) -> PgWireResult<RecordBatch> {
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(ROW, DataType::UInt64, false));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(UInt64Array::from_iter_values(
        0..batch.num_rows() as u64,
    )));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(df)
}

/// The rows of `all` with the `sets` columns replaced where a row was chosen: value `k`
/// of a found row is column `k + 1` of its batch.
fn updated(
    all: &RecordBatch,
    found: &[RecordBatch],
    chosen: &HashMap<u64, (usize, usize)>,
    sets: &[(String, String)],
) -> PgWireResult<RecordBatch> {
    let schema = all.schema();
    let mut columns = all.columns().to_vec();
    for (k, (column, _)) in sets.iter().enumerate() {
        let at = schema.index_of(column).map_err(df)?;
        let target_type = schema.field(at).data_type().clone();
        // Every found value of this assignment, cast to the column's type, in one array.
        let parts: Vec<ArrayRef> = found
            .iter()
            .map(|b| arrow::compute::cast(b.column(k + 1), &target_type))
            .collect::<Result<_, _>>()
            .map_err(df)?;
        let offsets: Vec<usize> = parts
            .iter()
            .scan(0usize, |acc, p| {
                let start = *acc;
                *acc += p.len();
                Some(start)
            })
            .collect();
        let refs: Vec<&dyn Array> = parts.iter().map(|p| p.as_ref()).collect();
        let values = arrow::compute::concat(&refs).map_err(df)?;
        let indices: UInt32Array = (0..all.num_rows() as u64)
            .map(|i| chosen.get(&i).map(|(b, r)| (offsets[*b] + r) as u32))
            .collect();
        let taken = arrow::compute::take(values.as_ref(), &indices, None).map_err(df)?;
        let mask: BooleanArray = indices.iter().map(|i| Some(i.is_some())).collect();
        columns[at] = arrow::compute::kernels::zip::zip(&mask, &taken, &columns[at]).map_err(df)?;
    }
    RecordBatch::try_new(schema, columns).map_err(df)
}

/// The target read with row numbers while the statement's rows are found: a model table
/// through the session's substitute, a temporary table by standing in for it.
enum Substitution<'a> {
    Model {
        _reading: super::SubstituteGuard<'a>,
    },
    Temp {
        run: &'a Run<'a>,
        name: String,
        original: Arc<dyn TableProvider>,
    },
}

impl<'a> Substitution<'a> {
    fn start(
        run: &'a Run<'a>,
        rel: &RelName,
        numbered: Arc<datafusion::datasource::MemTable>,
        original: &Arc<dyn TableProvider>,
    ) -> PgWireResult<Self> {
        if is_temp(run, &rel.0) {
            let temp = run.models.temp_provider();
            temp.deregister_table(&rel.1).map_err(df)?;
            temp.register_table(rel.1.clone(), numbered).map_err(df)?;
            return Ok(Substitution::Temp {
                run,
                name: rel.1.clone(),
                original: original.clone(),
            });
        }
        Ok(Substitution::Model {
            _reading: run.models.substitute_while(rel.clone(), numbered),
        })
    }
}

impl Drop for Substitution<'_> {
    fn drop(&mut self) {
        if let Substitution::Temp {
            run,
            name,
            original,
        } = self
        {
            let temp = run.models.temp_provider();
            let _ = temp.deregister_table(name);
            let _ = temp.register_table(name.clone(), original.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};

    #[test]
    fn an_update_takes_the_first_match() -> PgWireResult<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        let all = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), Some("b"), None])),
            ],
        )
        .map_err(df)?;
        let found_schema = Arc::new(Schema::new(vec![
            Field::new(ROW, DataType::UInt64, false),
            Field::new("x", DataType::Utf8, true),
        ]));
        let found = RecordBatch::try_new(
            found_schema,
            vec![
                Arc::new(UInt64Array::from(vec![2, 0, 2])),
                Arc::new(StringArray::from(vec![Some("c"), None, Some("late")])),
            ],
        )
        .map_err(df)?;
        let chosen = HashMap::from([(2u64, (0usize, 0usize)), (0, (0, 1))]);
        let out = updated(&all, &[found], &chosen, &[("v".into(), String::new())])?;
        let v = out.column(1).as_string::<i32>();
        assert_eq!(
            (0..3)
                .map(|i| v.is_valid(i).then(|| v.value(i)))
                .collect::<Vec<_>>(),
            vec![None, Some("b"), Some("c")]
        );
        Ok(())
    }
}
