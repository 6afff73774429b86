//! Gateway, statements a session keeps for later: SQL `PREPARE`/`EXECUTE`/`DEALLOCATE`
//! (the protocol's own Parse/Bind/Execute live in `session.rs`) and `DECLARE ... CURSOR`.
//! The query is kept as parsed and planned again at each `EXECUTE`, read-only checked, so
//! that it sees the live tables and never runs anything but a query.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::{DFSchema, ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{LogicalPlan, Statement as PlanStatement};
use datafusion::physical_plan::ColumnarValue;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{Declare, Statement};
use datafusion_postgres::hooks::HookClient;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::results::{Response, Tag};
use pgwire::api::stmt::StoredStatement;
use pgwire::api::store::PortalStore;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::types::format::FormatOptions;

use super::planning::{plan_statement, verify_read_only};
use super::wire::{self, Exec};
use crate::error::sqlstate;

/// Prepared statements of one session, by name, as parsed.
#[derive(Debug, Default)]
pub struct Prepared {
    statements: Mutex<HashMap<String, Statement>>,
}

/// Most SQL-prepared statements a session keeps.
const PREPARED_LIMIT: usize = 1024;

fn error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        code.to_string(),
        message,
    )))
}

fn api(e: DataFusionError) -> PgWireError {
    PgWireError::ApiError(Box::new(e))
}

impl Prepared {
    /// `PREPARE name [(types)] AS <query>` (the classifier has checked the query).
    pub fn prepare(&self, statement: &Statement) -> PgWireResult<Response> {
        let Statement::Prepare { name, .. } = statement else {
            return Err(error(
                sqlstate::INTERNAL_ERROR,
                "not a PREPARE statement".into(),
            ));
        };
        let mut all = self.statements.lock().unwrap_or_else(|e| e.into_inner());
        if all.contains_key(&name.value) {
            return Err(error(
                sqlstate::DUPLICATE_PREPARED_STATEMENT,
                format!("prepared statement \"{}\" already exists", name.value),
            ));
        }
        if all.len() >= PREPARED_LIMIT {
            return Err(error(
                sqlstate::CONFIGURATION_LIMIT_EXCEEDED,
                format!(
                    "a session keeps at most {PREPARED_LIMIT} prepared statements: DEALLOCATE some"
                ),
            ));
        }
        all.insert(name.value.clone(), statement.clone());
        Ok(Response::Execution(Tag::new("PREPARE")))
    }

    /// `DEALLOCATE [PREPARE] name | ALL`.
    pub fn deallocate(&self, name: &str) -> PgWireResult<Response> {
        let mut all = self.statements.lock().unwrap_or_else(|e| e.into_inner());
        if name.eq_ignore_ascii_case("all") {
            all.clear();
            return Ok(Response::Execution(Tag::new("DEALLOCATE ALL")));
        }
        match all.remove(name) {
            Some(_) => Ok(Response::Execution(Tag::new("DEALLOCATE"))),
            None => Err(error(
                sqlstate::INVALID_SQL_STATEMENT_NAME,
                format!("prepared statement \"{name}\" does not exist"),
            )),
        }
    }

    /// `DISCARD ALL` forgets every prepared statement.
    pub fn clear(&self) {
        self.statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The plan of `EXECUTE name(args)`: the prepared query planned now, with the
    /// arguments (constant expressions) in place of its parameters.
    pub async fn plan_execute(
        &self,
        ctx: &SessionContext,
        execute: &Statement,
    ) -> PgWireResult<LogicalPlan> {
        let Statement::Execute {
            name: Some(name), ..
        } = execute
        else {
            return Err(error(
                sqlstate::SYNTAX_ERROR,
                "EXECUTE needs a prepared statement's name".into(),
            ));
        };
        let name = name.to_string();
        let prepared = self
            .statements
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
            .cloned()
            .ok_or_else(|| {
                error(
                    sqlstate::INVALID_SQL_STATEMENT_NAME,
                    format!("prepared statement \"{name}\" does not exist"),
                )
            })?;
        let LogicalPlan::Statement(PlanStatement::Prepare(prepare)) =
            plan_statement(ctx, &prepared).await.map_err(api)?
        else {
            return Err(error(
                sqlstate::INTERNAL_ERROR,
                "PREPARE did not plan as a prepared query".into(),
            ));
        };
        verify_read_only(&prepare.input).map_err(api)?;
        let LogicalPlan::Statement(PlanStatement::Execute(call)) =
            plan_statement(ctx, execute).await.map_err(api)?
        else {
            return Err(error(
                sqlstate::INTERNAL_ERROR,
                "EXECUTE did not plan as a call".into(),
            ));
        };
        let mut values = Vec::with_capacity(call.parameters.len());
        for (i, expr) in call.parameters.iter().enumerate() {
            let mut v = constant(ctx, expr).map_err(api)?;
            if let Some(field) = prepare.fields.get(i) {
                v = v.cast_to(field.data_type()).map_err(api)?;
            }
            values.push(v);
        }
        prepare
            .input
            .as_ref()
            .clone()
            .replace_params_with_values(&ParamValues::from(values))
            .map_err(api)
    }
}

/// The value of a constant expression (an `EXECUTE` argument).
fn constant(
    ctx: &SessionContext,
    expr: &datafusion::logical_expr::Expr,
) -> datafusion::error::Result<ScalarValue> {
    let physical = ctx.create_physical_expr(expr.clone(), &DFSchema::empty())?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    match physical.evaluate(&one_row)? {
        ColumnarValue::Scalar(v) => Ok(v),
        ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0),
    }
}

/// `DECLARE name CURSOR FOR <query>`: plans the query as parsed and keeps its rows as a
/// portal that `FETCH` reads (and `CLOSE` drops).
pub async fn declare(
    ctx: &SessionContext,
    declares: &[Declare],
    client: &mut dyn HookClient,
    exec: &Exec,
) -> PgWireResult<Response> {
    for d in declares {
        let (Some(name), Some(query)) = (d.names.first(), &d.for_query) else {
            return Err(error(
                sqlstate::SYNTAX_ERROR,
                "write DECLARE name CURSOR FOR <query>".into(),
            ));
        };
        let statement = Statement::Query(query.clone());
        let plan = exec
            .interrupts
            .run(async {
                let plan = plan_statement(ctx, &statement).await.map_err(api)?;
                verify_read_only(&plan).map_err(api)?;
                Ok(plan)
            })
            .await?;
        let bare = wire::bare_columns(&plan);
        let df = ctx.execute_logical_plan(plan).await.map_err(api)?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let zone = client.metadata().get("timezone").cloned();
        let rows = wire::encode_dataframe(
            df,
            &bare,
            &Format::UnifiedText,
            Some(options),
            zone.as_deref(),
            exec,
        )
        .await?;
        let stored = Arc::new(StoredStatement::new(
            name.value.clone(),
            (String::new(), None),
            vec![],
        ));
        let portal = Portal::new_cursor(name.value.clone(), stored);
        portal.start(rows).await;
        client.portal_store().put_portal(Arc::new(portal));
    }
    Ok(Response::Execution(Tag::new("DECLARE CURSOR")))
}
