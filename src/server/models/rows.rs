//! Gateway, models, rows: what the model statements share. A statement's query is planned
//! from its parsed form (read-only, as every query), its columns named as Postgres names
//! them, its rows streamed under the session's limits into a model table's data files or a
//! temporary table, and a table's rows read back whole.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::sqlparser::ast::{Query, Statement};
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use pgwire::error::{PgWireError, PgWireResult};

use super::{internal, user_error, Run};
use crate::catalog::models::RelName;
use crate::error::sqlstate;
use crate::query::naming::pg_column_name;
use crate::server::planning::{plan_statement, verify_read_only};
use crate::server::wire;
use crate::sink::iceberg::models::{self as sink, ModelWriter};

fn df(e: datafusion::error::DataFusionError) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

/// Plans `query` as this session reads it (never a write), with the column names Postgres
/// gives its result; `names` replaces them (a `CREATE VIEW v (a, b)` list).
pub async fn plan_query(
    run: &Run<'_>,
    query: &Query,
    names: &[String],
) -> PgWireResult<LogicalPlan> {
    let statement = Statement::Query(Box::new(query.clone()));
    let plan = plan_statement(run.ctx, &statement).await.map_err(df)?;
    verify_read_only(&plan).map_err(df)?;
    let fields = plan.schema().fields().len();
    if !names.is_empty() && names.len() != fields {
        return Err(user_error(
            sqlstate::SYNTAX_ERROR,
            format!(
                "{} column names were given for a query of {fields} columns",
                names.len()
            ),
        ));
    }
    let mut exprs: Vec<Expr> = Vec::with_capacity(fields);
    let mut seen: Vec<String> = Vec::with_capacity(fields);
    for (i, (qualifier, field)) in plan.schema().iter().enumerate() {
        let name = names
            .get(i)
            .cloned()
            .unwrap_or_else(|| pg_column_name(field.name()));
        if seen.contains(&name) {
            return Err(user_error(
                sqlstate::DUPLICATE_COLUMN,
                format!("column \"{name}\" specified more than once: give the columns distinct names (AS ...)"),
            ));
        }
        seen.push(name.clone());
        exprs.push(Expr::Column(datafusion::common::Column::from((qualifier, field))).alias(name));
    }
    LogicalPlanBuilder::from(plan)
        .project(exprs)
        .and_then(|b| b.build())
        .map_err(df)
}

/// The rows of `plan`, in batches, under the statement's limits.
pub async fn stream(
    run: &Run<'_>,
    plan: LogicalPlan,
) -> PgWireResult<BoxStream<'static, PgWireResult<RecordBatch>>> {
    let frame = DataFrame::new(run.ctx.state(), plan);
    let batches = wire::execute(frame, run.exec).await?;
    Ok(batches.map(|b| b.map_err(PgWireError::from)).boxed())
}

/// The Arrow schema of a plan's rows, without qualifiers.
pub fn schema_of(plan: &LogicalPlan) -> SchemaRef {
    Arc::new(plan.schema().as_arrow().clone())
}

/// Writes the rows of `plan` into new data files of `table` (shaped to its columns, in
/// order): the files and the number of rows.
pub async fn write_plan(
    run: &Run<'_>,
    table: &Table,
    plan: LogicalPlan,
) -> PgWireResult<(Vec<DataFile>, u64)> {
    let rows = stream(run, plan).await?;
    write_rows(table, rows).await
}

/// Writes `rows` into new data files of `table`.
pub async fn write_rows(
    table: &Table,
    rows: impl futures::Stream<Item = PgWireResult<RecordBatch>>,
) -> PgWireResult<(Vec<DataFile>, u64)> {
    let target = sink::write_schema(table).map_err(internal)?;
    let mut writer = ModelWriter::new(table).await.map_err(internal)?;
    let mut rows = std::pin::pin!(rows);
    while let Some(batch) = rows.next().await {
        let batch = sink::conform(&batch?, &target)
            .map_err(|e| user_error(sqlstate::NOT_NULL_VIOLATION, e.to_string()))?;
        writer.write(batch).await.map_err(internal)?;
    }
    writer.close().await.map_err(internal)
}

/// Collects the rows of `plan` for a temporary table, within what the session's temporary
/// tables may still hold (`budget` bytes).
pub async fn collect(
    run: &Run<'_>,
    plan: LogicalPlan,
    budget: usize,
) -> PgWireResult<(SchemaRef, Vec<RecordBatch>)> {
    let schema = schema_of(&plan);
    let mut rows = std::pin::pin!(stream(run, plan).await?);
    let mut batches = Vec::new();
    let mut bytes = 0usize;
    while let Some(batch) = rows.next().await {
        let batch = batch?;
        bytes += batch.get_array_memory_size();
        if bytes > budget {
            return Err(user_error(
                sqlstate::OUT_OF_MEMORY,
                format!("temporary tables of this session would hold more than {budget} bytes (skippr.query.max_query_memory): build the model as a table instead"),
            ));
        }
        batches.push(batch);
    }
    Ok((schema, batches))
}

/// Every row of `provider` (a model or temporary table), in its own schema.
pub async fn read_all(
    run: &Run<'_>,
    provider: Arc<dyn TableProvider>,
) -> PgWireResult<Vec<RecordBatch>> {
    let frame = run.ctx.read_table(provider).map_err(df)?;
    let mut rows = std::pin::pin!(wire::execute(frame, run.exec).await?);
    let mut out = Vec::new();
    while let Some(batch) = rows.next().await {
        out.push(batch.map_err(PgWireError::from)?);
    }
    Ok(out)
}

/// A temporary table holding `batches`.
pub fn mem_table(schema: SchemaRef, batches: Vec<RecordBatch>) -> PgWireResult<Arc<MemTable>> {
    // Temporary tables accept NULLs anywhere (as CREATE TABLE AS in Postgres).
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batches = batches
        .into_iter()
        .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| df(e.into()))?;
    MemTable::try_new(schema, vec![batches])
        .map(Arc::new)
        .map_err(df)
}

/// The relation a model statement names, read as the session reads names.
pub fn relation_of(
    run: &Run<'_>,
    name: &datafusion::sql::sqlparser::ast::ObjectName,
) -> PgWireResult<RelName> {
    crate::server::names::relation(name, run.default_schema).ok_or_else(|| {
        user_error(
            sqlstate::SYNTAX_ERROR,
            format!("improper relation name (too many dotted names): {name}"),
        )
    })
}
