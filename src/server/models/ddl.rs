//! Gateway, models, definitions: `CREATE SCHEMA`, `CREATE [OR REPLACE] VIEW`, `CREATE
//! [TEMPORARY] TABLE ... AS`, `CREATE TABLE (...)`, `ALTER TABLE|VIEW ... RENAME TO`, `DROP
//! TABLE|VIEW|SCHEMA [IF EXISTS] ... [CASCADE]`, `COMMENT ON` and `GRANT` (accepted, and
//! nothing to do: the gateway's users are its configured ones). A table's rows are written
//! as Parquet and its metadata staged before the catalog names it.

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::sql::sqlparser::ast::{
    visit_relations, ColumnOption, CommentObject, CreateTable, CreateView, ObjectName, ObjectType,
    Query,
};
use datafusion_postgres::hooks::HookClient;
use iceberg::{NamespaceIdent, TableIdent};
use pgwire::api::results::{Response, Tag};
use pgwire::error::PgWireResult;
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::PgWireBackendMessage;

use super::rows::{self, relation_of};
use super::{internal, user_error, Leftovers, Run};
use crate::catalog::models::{ModelsState, Op, RelKind, RelName, ViewDef};
use crate::error::sqlstate;
use crate::query::models::ModelsView;
use crate::server::names::{parts, qualify_view};
use crate::sink::iceberg::models as sink;
use crate::sink::iceberg::SourceColumn;

pub(super) fn done(tag: &str) -> PgWireResult<Response> {
    Ok(Response::Execution(Tag::new(tag)))
}

/// Sends a NOTICE (`... already exists, skipping`), as Postgres does.
pub(crate) async fn notice(
    client: &mut dyn HookClient,
    code: &str,
    message: String,
) -> PgWireResult<()> {
    let info = pgwire::error::ErrorInfo::new("NOTICE".to_string(), code.to_string(), message);
    client
        .send_message(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
            info,
        )))
        .await
}

/// Whether `schema` names the session's temporary schema.
pub(crate) fn is_temp(run: &Run<'_>, schema: &str) -> bool {
    schema == run.models.temp_schema() || schema == "pg_temp"
}

pub(super) fn unsupported(what: &str) -> pgwire::error::PgWireError {
    user_error(
        sqlstate::FEATURE_NOT_SUPPORTED,
        format!("{what} is not supported for models: the gateway builds models with CREATE SCHEMA/VIEW/TABLE [AS], INSERT, DELETE, UPDATE, TRUNCATE, ALTER ... RENAME TO, DROP, COMMENT ON and GRANT"),
    )
}

pub(super) async fn create_schema(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    name: &ObjectName,
    if_not_exists: bool,
) -> PgWireResult<Response> {
    let schema = parts(name).join(".");
    if run.models.state().namespaces.contains(&schema) {
        if if_not_exists {
            notice(
                client,
                sqlstate::DUPLICATE_SCHEMA,
                format!("schema \"{schema}\" already exists, skipping"),
            )
            .await?;
            return done("CREATE SCHEMA");
        }
        return Err(user_error(
            sqlstate::DUPLICATE_SCHEMA,
            format!("schema \"{schema}\" already exists"),
        ));
    }
    run.models.models()?;
    run.models
        .record(
            client,
            vec![Op::CreateNamespace(schema)],
            Leftovers::default(),
        )
        .await?;
    done("CREATE SCHEMA")
}

pub(super) async fn create_view(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    v: &CreateView,
) -> PgWireResult<Response> {
    let rel = relation_of(run, &v.name)?;
    let state = run.models.state();
    if v.if_not_exists && state.exists(&rel) {
        notice(
            client,
            sqlstate::DUPLICATE_TABLE,
            format!("relation \"{}\" already exists, skipping", rel.1),
        )
        .await?;
        return done("CREATE VIEW");
    }
    let mut query = (*v.query).clone();
    let depends = qualify_view(&mut query, run.default_schema, run.models.temp_schema())
        .ok_or_else(|| {
            user_error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                format!("view {} reads a temporary table: a view outlives the session, so it can read only tables and views of schemas", rel.1),
            )
        })?;
    let names: Vec<String> = v
        .columns
        .iter()
        .map(|c| crate::server::names::fold(&c.name))
        .collect();
    let plan = rows::plan_query(run, &query, &names).await?;
    let columns = plan
        .schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect();
    let definition = printed_definition(run, &query, &names).await;
    let def = ViewDef {
        sql: query.to_string(),
        columns,
        depends,
        definition,
    };
    let op = Op::CreateView {
        rel,
        def,
        replace: v.or_replace,
    };
    run.models
        .record(client, vec![op], Leftovers::default())
        .await?;
    done("CREATE VIEW")
}

/// The Arrow type of a column a `CREATE TABLE` declares, and the Postgres type it records.
fn declared_type(
    data_type: &datafusion::sql::sqlparser::ast::DataType,
) -> PgWireResult<arrow::datatypes::DataType> {
    use arrow::datatypes::DataType as A;
    use datafusion::sql::sqlparser::ast::DataType as S;
    Ok(match data_type {
        S::Text | S::Varchar(_) | S::CharacterVarying(_) | S::Char(_) | S::Character(_) | S::String(_) => A::Utf8,
        S::JSON | S::JSONB | S::Uuid => A::Utf8,
        S::Int(_) | S::Integer(_) | S::Int4(_) => A::Int32,
        S::SmallInt(_) | S::Int2(_) => A::Int16,
        S::BigInt(_) | S::Int8(_) => A::Int64,
        S::Real | S::Float4 => A::Float32,
        S::DoublePrecision | S::Float8 | S::Double(_) | S::Float(_) => A::Float64,
        S::Boolean | S::Bool => A::Boolean,
        S::Date => A::Date32,
        S::Bytea => A::Binary,
        S::Numeric(info) | S::Decimal(info) => {
            use datafusion::sql::sqlparser::ast::ExactNumberInfo as E;
            match info {
                E::PrecisionAndScale(p, s) => A::Decimal128(*p as u8, *s as i8),
                E::Precision(p) => A::Decimal128(*p as u8, 0),
                // Postgres's numeric has no fixed scale; Iceberg's must have one.
                E::None => A::Decimal128(38, 10),
            }
        }
        S::Timestamp(_, tz) => {
            use datafusion::sql::sqlparser::ast::TimezoneInfo as Z;
            match tz {
                Z::WithTimeZone | Z::Tz => A::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("+00:00".into())),
                _ => A::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None),
            }
        }
        S::Time(..) => A::Time64(arrow::datatypes::TimeUnit::Microsecond),
        other => {
            return Err(user_error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                format!("type {other} is not supported in a model table: use text, integer, bigint, numeric(p,s), double precision, boolean, date, timestamp or timestamptz"),
            ))
        }
    })
}

pub(super) async fn create_table(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    c: &CreateTable,
) -> PgWireResult<Response> {
    let rel = if c.temporary {
        let name = parts(&c.name);
        match name.as_slice() {
            [n] => (run.models.temp_schema().to_string(), n.clone()),
            [s, n] if is_temp(run, s) => (run.models.temp_schema().to_string(), n.clone()),
            _ => {
                return Err(user_error(
                    sqlstate::INVALID_TABLE_DEFINITION,
                    "cannot create temporary relation in non-temporary schema",
                ))
            }
        }
    } else {
        relation_of(run, &c.name)?
    };
    let temporary = is_temp(run, &rel.0);
    let exists = if temporary {
        run.models.temp_names().contains(&rel.1)
    } else {
        run.models.state().exists(&rel)
    };
    if exists {
        if c.if_not_exists {
            notice(
                client,
                sqlstate::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists, skipping", rel.1),
            )
            .await?;
            return done("CREATE TABLE AS");
        }
        return Err(user_error(
            sqlstate::DUPLICATE_TABLE,
            format!("relation \"{}\" already exists", rel.1),
        ));
    }
    let names: Vec<String> = c
        .columns
        .iter()
        .map(|col| crate::server::names::fold(&col.name))
        .collect();
    let (schema, required, declared, plan) = match &c.query {
        Some(q) => {
            let plan = rows::plan_query(run, q, &names).await?;
            let schema = rows::schema_of(&plan);
            let declared = declared_by_sources(&schema);
            (schema, Vec::new(), declared, Some(plan))
        }
        None => {
            let mut fields = Vec::with_capacity(c.columns.len());
            let mut required = Vec::new();
            let mut declared = Vec::new();
            for (col, name) in c.columns.iter().zip(&names) {
                let dt = declared_type(&col.data_type)?;
                let not_null = col.options.iter().any(|o| {
                    matches!(
                        o.option,
                        ColumnOption::NotNull | ColumnOption::PrimaryKey(_)
                    )
                });
                if not_null {
                    required.push(name.clone());
                }
                let (oid, typmod) = crate::server::pg::types::declared_oid(&col.data_type, &dt);
                declared.push(SourceColumn {
                    name: name.clone(),
                    oid: oid.unsigned_abs(),
                    typmod,
                    field: None,
                    attnum: None,
                });
                fields.push(arrow::datatypes::Field::new(name, dt, !not_null));
            }
            (
                Arc::new(arrow::datatypes::Schema::new(fields)),
                required,
                Some(declared),
                None,
            )
        }
    };
    if temporary {
        let (schema, batches) = match plan {
            Some(plan) => rows::collect(run, plan, run.models.temp_budget).await?,
            None => (schema, Vec::new()),
        };
        let n: usize = batches.iter().map(|b| b.num_rows()).sum();
        let table = rows::mem_table(schema, batches)?;
        run.models
            .temp_provider()
            .register_table(rel.1.clone(), table)
            .map_err(|e| internal(e.into()))?;
        return Ok(Response::Execution(tag_for(c, n)));
    }
    let models = run.models.models()?;
    if !run.models.state().namespaces.contains(&rel.0) {
        return Err(user_error(
            sqlstate::INVALID_SCHEMA_NAME,
            format!("schema \"{}\" does not exist", rel.0),
        ));
    }
    let ice_schema = sink::iceberg_schema(&schema, &required)
        .map_err(|e| user_error(sqlstate::FEATURE_NOT_SUPPORTED, e.to_string()))?;
    let location = models.catalog().new_location(&rel);
    let folder = location.clone();
    let ident = TableIdent::new(NamespaceIdent::new(rel.0.clone()), rel.1.clone());
    let table = sink::create(
        models.catalog().file_io(),
        ident,
        location,
        ice_schema,
        declared,
    )
    .await
    .map_err(internal)?;
    let (table, n) = match plan {
        Some(plan) => {
            let (files, n) = rows::write_plan(run, &table, plan).await?;
            let staged = sink::stage(&table, files, false, "CREATE TABLE AS")
                .await
                .map_err(internal)?;
            (staged.table, n as usize)
        }
        None => (table, 0),
    };
    models.remember(&table);
    let op = Op::CreateTable {
        rel,
        location: super::location_of(&table)?,
    };
    let files = Leftovers {
        created: vec![folder],
        ..Leftovers::default()
    };
    run.models.record(client, vec![op], files).await?;
    Ok(Response::Execution(tag_for(c, n)))
}

/// `SELECT n` after CREATE TABLE AS (as Postgres tags it), `CREATE TABLE` otherwise.
fn tag_for(c: &CreateTable, rows: usize) -> Tag {
    if c.query.is_some() {
        Tag::new("SELECT").with_rows(rows)
    } else {
        Tag::new("CREATE TABLE")
    }
}

pub(super) async fn rename(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    from: &ObjectName,
    to: &ObjectName,
    if_exists: bool,
) -> PgWireResult<Response> {
    let rel = relation_of(run, from)?;
    let new_name = match parts(to).as_slice() {
        [n] => n.clone(),
        [s, n] if *s == rel.0 => n.clone(),
        _ => {
            return Err(user_error(
                sqlstate::SYNTAX_ERROR,
                "RENAME TO takes the new name alone, without a schema",
            ))
        }
    };
    if is_temp(run, &rel.0) {
        let temp = run.models.temp_provider();
        let Some(table) = temp
            .deregister_table(&rel.1)
            .map_err(|e| internal(e.into()))?
        else {
            return missing(client, &rel, if_exists, "ALTER TABLE").await;
        };
        temp.register_table(new_name, table)
            .map_err(|e| internal(e.into()))?;
        return done("ALTER TABLE");
    }
    if !run.models.state().exists(&rel) {
        return missing(client, &rel, if_exists, "ALTER TABLE").await;
    }
    run.models
        .record(
            client,
            vec![Op::Rename { rel, to: new_name }],
            Leftovers::default(),
        )
        .await?;
    done("ALTER TABLE")
}

/// `... does not exist`: an error, or a NOTICE with IF EXISTS.
async fn missing(
    client: &mut dyn HookClient,
    rel: &RelName,
    if_exists: bool,
    tag: &str,
) -> PgWireResult<Response> {
    let message = format!("relation \"{}.{}\" does not exist", rel.0, rel.1);
    if if_exists {
        notice(
            client,
            sqlstate::SUCCESSFUL_COMPLETION,
            format!("{message}, skipping"),
        )
        .await?;
        return done(tag);
    }
    Err(user_error(sqlstate::UNDEFINED_TABLE, message))
}

pub(super) async fn drop(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    object_type: ObjectType,
    names: &[ObjectName],
    if_exists: bool,
    cascade: bool,
) -> PgWireResult<Response> {
    let (kind, tag) = match object_type {
        ObjectType::Table => (Some(RelKind::Table), "DROP TABLE"),
        ObjectType::View => (Some(RelKind::View), "DROP VIEW"),
        _ => (None, "DROP SCHEMA"),
    };
    let mut ops = Vec::new();
    let mut planned = (*run.models.state()).clone();
    for name in names {
        if kind.is_none() {
            let schema = parts(name).join(".");
            if !planned.namespaces.contains(&schema) {
                if if_exists {
                    notice(
                        client,
                        sqlstate::SUCCESSFUL_COMPLETION,
                        format!("schema \"{schema}\" does not exist, skipping"),
                    )
                    .await?;
                    continue;
                }
                return Err(user_error(
                    sqlstate::INVALID_SCHEMA_NAME,
                    format!("schema \"{schema}\" does not exist"),
                ));
            }
            if cascade {
                let inside: Vec<RelName> = planned
                    .tables
                    .keys()
                    .chain(planned.views.keys())
                    .filter(|(s, _)| *s == schema)
                    .cloned()
                    .collect();
                for rel in inside {
                    drop_cascading(&mut planned, &mut ops, &rel)?;
                }
            }
            push(&mut planned, &mut ops, Op::DropNamespace(schema))?;
            continue;
        }
        let rel = relation_of(run, name)?;
        if is_temp(run, &rel.0) {
            let dropped = run
                .models
                .temp_provider()
                .deregister_table(&rel.1)
                .map_err(|e| internal(e.into()))?;
            if dropped.is_none() && !if_exists {
                return Err(user_error(
                    sqlstate::UNDEFINED_TABLE,
                    format!("table \"{}\" does not exist", rel.1),
                ));
            }
            continue;
        }
        match planned.kind(&rel) {
            None => {
                if if_exists {
                    notice(
                        client,
                        sqlstate::SUCCESSFUL_COMPLETION,
                        format!("relation \"{}.{}\" does not exist, skipping", rel.0, rel.1),
                    )
                    .await?;
                    continue;
                }
                return Err(user_error(
                    sqlstate::UNDEFINED_TABLE,
                    format!("relation \"{}.{}\" does not exist", rel.0, rel.1),
                ));
            }
            Some(k) if Some(k) != kind => {
                return Err(user_error(
                    sqlstate::WRONG_OBJECT_TYPE,
                    format!(
                        "\"{}.{}\" is not a {}: use DROP {}",
                        rel.0,
                        rel.1,
                        tag[5..].to_lowercase(),
                        if k == RelKind::View { "VIEW" } else { "TABLE" }
                    ),
                ))
            }
            Some(_) if cascade => drop_cascading(&mut planned, &mut ops, &rel)?,
            Some(k) => push(&mut planned, &mut ops, Op::Drop { rel, kind: k })?,
        }
    }
    run.models.record(client, ops, Leftovers::default()).await?;
    done(tag)
}

/// Applies `op` to the planned state and keeps it.
fn push(planned: &mut ModelsState, ops: &mut Vec<Op>, op: Op) -> PgWireResult<()> {
    planned.apply(&op).map_err(super::refusal)?;
    ops.push(op);
    Ok(())
}

/// Drops `rel` and, first, every view that reads it (and the views that read those).
fn drop_cascading(planned: &mut ModelsState, ops: &mut Vec<Op>, rel: &RelName) -> PgWireResult<()> {
    let Some(kind) = planned.kind(rel) else {
        return Ok(());
    };
    for dependent in planned.dependents(rel) {
        if dependent != *rel {
            drop_cascading(planned, ops, &dependent)?;
        }
    }
    push(
        planned,
        ops,
        Op::Drop {
            rel: rel.clone(),
            kind,
        },
    )
}

pub(super) async fn comment_on(
    run: &Run<'_>,
    client: &mut dyn HookClient,
    object_type: CommentObject,
    name: &ObjectName,
    text: Option<String>,
) -> PgWireResult<Response> {
    let (relation, column) = match object_type {
        CommentObject::Column => {
            let mut p = name.0.clone();
            let column = p.pop().map(|c| match c {
                datafusion::sql::sqlparser::ast::ObjectNamePart::Identifier(i) => {
                    crate::server::names::fold(&i)
                }
                other => other.to_string(),
            });
            (ObjectName(p), column)
        }
        _ => (name.clone(), None),
    };
    let rel = relation_of(run, &relation)?;
    if is_temp(run, &rel.0) {
        return done("COMMENT");
    }
    run.models
        .record(
            client,
            vec![Op::Comment { rel, column, text }],
            Leftovers::default(),
        )
        .await?;
    done("COMMENT")
}

/// The Postgres types of a `CREATE TABLE AS` model's columns: a column that is a replicated
/// column as it is keeps the type the source declared (`smallint`, `varchar(20)`, `json`);
/// any other has the type of its Arrow type. `None` when no column comes from the source.
fn declared_by_sources(schema: &arrow::datatypes::Schema) -> Option<Vec<SourceColumn>> {
    let from_source = |f: &arrow::datatypes::Field| -> Option<(u32, i32)> {
        let (oid, typmod) = f
            .metadata()
            .get(crate::query::live::PG_DECLARED_META)?
            .split_once(':')?;
        let (oid, typmod): (u32, i32) = (oid.parse().ok()?, typmod.parse().ok()?);
        // A cast keeps its column's field metadata: the declared type holds only while the
        // column is held as the replicated column is (text, or the Arrow type of that type).
        let (held, held_typmod) = crate::server::pg::types::arrow_type_oid(f.data_type());
        let text_held = [19, 25, 114, 1042, 1043, 1186, 3802];
        let same = (held as u32 == oid && (oid != 1700 || held_typmod == typmod))
            || (oid == 21 && f.data_type() == &arrow::datatypes::DataType::Int32)
            || (held == 25 && text_held.contains(&oid));
        same.then_some((oid, typmod))
    };
    if !schema.fields().iter().any(|f| from_source(f).is_some()) {
        return None;
    }
    Some(
        schema
            .fields()
            .iter()
            .map(|f| {
                let (oid, typmod) = from_source(f).unwrap_or_else(|| {
                    let (oid, typmod) = crate::server::pg::types::arrow_type_oid(f.data_type());
                    (oid.unsigned_abs(), typmod)
                });
                SourceColumn {
                    name: f.name().clone(),
                    oid,
                    typmod,
                    field: None,
                    attnum: None,
                }
            })
            .collect(),
    )
}

/// The view's definition as Postgres prints it, from the columns of the relations it reads
/// (`None` where the query is printed as written).
async fn printed_definition(run: &Run<'_>, query: &Query, names: &[String]) -> Option<String> {
    let mut relations: Vec<ObjectName> = Vec::new();
    let _ = visit_relations(query, |name| {
        relations.push(name.clone());
        ControlFlow::<()>::Continue(())
    });
    let mut columns = super::viewdef::Columns::new();
    for name in relations {
        let p = parts(&name);
        let [schema, table] = p.as_slice() else {
            return None;
        };
        let provider = run
            .ctx
            .table_provider(TableReference::partial(schema.as_str(), table.as_str()))
            .await
            .ok()?;
        let fields = provider
            .schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect();
        columns.insert(p, fields);
    }
    super::viewdef::deparse(query, names, run.default_schema, &columns)
}
