//! Gateway, statement classifier: every parsed statement is classified before anything runs
//! it, against an allow-list. What reads (queries, SHOW, plain EXPLAIN, cursors, prepared
//! queries, COPY to the client) and what only changes the session (SET of a listed setting,
//! transaction control, DISCARD) is allowed; so are the statements that build models (dbt's
//! CREATE SCHEMA/VIEW/TABLE [AS], INSERT, DELETE, ALTER ... RENAME, DROP, COMMENT, GRANT,
//! and the UPDATE and TRUNCATE of its snapshots and seeds) when every relation they change
//! is in a models schema, never a replicated one. Everything else is refused with SQLSTATE
//! 25006 (a write: the replicated tables change only through their source) or 42501
//! (something no client may do: write server files, change the process's engine settings,
//! switch role). The statement that was classified is the one that is planned: the caller
//! never re-parses.

use std::ops::ControlFlow;

use crate::error::sqlstate;
use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, CommentObject, CopySource, CopyTarget, FromTable, GrantObjects,
    ObjectName, ObjectType, Query, Reset, ResetStatement, SchemaName, Select, Set, SetExpr,
    Statement, TableFactor, TableObject, TableWithJoins, Visit, Visitor,
};
use pgwire::error::{ErrorInfo, PgWireError};

/// SQLSTATE of a write refused because the data is read-only (Postgres's
/// `read_only_sql_transaction`).
pub const READ_ONLY: &str = sqlstate::READ_ONLY_SQL_TRANSACTION;
/// SQLSTATE of something no client may do (Postgres's `insufficient_privilege`).
pub const NOT_PERMITTED: &str = sqlstate::INSUFFICIENT_PRIVILEGE;

/// What an allowed statement is, which decides how it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// `SELECT`, `WITH`, `VALUES`, `TABLE`: planned with DDL, DML and statements disabled.
    Query,
    /// `EXPLAIN` (without ANALYZE, or ANALYZE of a query) of a query.
    Explain,
    /// `SHOW <setting>`.
    Show,
    /// `SET`/`RESET` of a session setting the gateway lists.
    Set,
    /// `BEGIN`, `COMMIT`, `ROLLBACK`, savepoints, `SET TRANSACTION`.
    Transaction,
    /// `PREPARE name AS <query>`.
    Prepare,
    /// `EXECUTE name(...)`.
    Execute,
    /// `DEALLOCATE`.
    Deallocate,
    /// `DECLARE name CURSOR FOR <query>`.
    Declare,
    /// `FETCH` and `CLOSE` of a cursor.
    Cursor,
    /// `DISCARD`.
    Discard,
    /// `COPY (query) TO STDOUT` or `COPY table TO STDOUT`.
    CopyOut,
    /// A statement that builds or changes models, every relation it changes in a models
    /// schema (run by `server::models`).
    Write,
}

/// Why a statement is refused: its SQLSTATE and a message saying what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub sqlstate: &'static str,
    pub message: String,
}

impl Refusal {
    fn read_only(command: &str) -> Self {
        Self {
            sqlstate: READ_ONLY,
            message: format!(
                "cannot execute {command} in a read-only transaction: Skippr serves tables replicated from Postgres read-only; write to the source database instead, or build models in a schema of their own (CREATE SCHEMA name)"
            ),
        }
    }

    fn not_permitted(message: impl Into<String>) -> Self {
        Self {
            sqlstate: NOT_PERMITTED,
            message: message.into(),
        }
    }

    /// The error a client receives.
    pub fn into_error(self) -> PgWireError {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".to_string(),
            self.sqlstate.to_string(),
            self.message,
        )))
    }
}

/// Who may write where: nothing (the default), or the models schemas of a session.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub models: Option<Writable>,
}

/// Where a session may build models.
#[derive(Debug, Clone)]
pub struct Writable {
    /// Schemas that hold replicated or system tables: never written.
    pub read_only: Vec<String>,
    /// The schema unqualified names mean (the first of `search_path`).
    pub default_schema: String,
    /// The session's schema of temporary tables.
    pub temp_schema: String,
}

impl Writable {
    /// Whether a statement may change relations of `schema`.
    fn allows(&self, schema: &TargetSchema) -> bool {
        let name = match schema {
            TargetSchema::Temporary => return true,
            TargetSchema::Default => &self.default_schema,
            TargetSchema::Named(n) => n,
        };
        if *name == self.temp_schema || name == "pg_temp" {
            return true;
        }
        !self.read_only.iter().any(|r| r == name)
            && !name.starts_with("pg_")
            && name != "information_schema"
    }
}

/// The schema of a relation (or the schema) a statement changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetSchema {
    /// Unqualified: the session's default schema.
    Default,
    /// The session's temporary tables (`CREATE TEMPORARY TABLE`).
    Temporary,
    Named(String),
}

/// The schema a relation name is in.
fn schema_of(name: &ObjectName) -> TargetSchema {
    match super::names::parts(name).as_slice() {
        [_] => TargetSchema::Default,
        [s, _] | [_, s, _] => TargetSchema::Named(s.clone()),
        _ => TargetSchema::Default,
    }
}

/// A statement sorted before the policy is applied.
#[derive(Debug)]
enum Kind {
    Allowed(Allowed),
    /// Writes rows or changes the catalog. `targets`: the schemas of what it would change;
    /// `model`: whether it is a statement models are built with (allowed in models schemas).
    Write {
        command: &'static str,
        targets: Vec<TargetSchema>,
        model: bool,
    },
    Refused(Refusal),
}

/// Classifies `statement` under `policy`.
pub fn classify(statement: &Statement, policy: &Policy) -> Result<Allowed, Refusal> {
    decide(kind(statement), policy)
}

fn decide(kind: Kind, policy: &Policy) -> Result<Allowed, Refusal> {
    match kind {
        Kind::Allowed(a) => Ok(a),
        Kind::Write {
            command,
            targets,
            model,
        } => match &policy.models {
            Some(w) if model && !targets.is_empty() && targets.iter().all(|t| w.allows(t)) => {
                Ok(Allowed::Write)
            }
            _ => Err(Refusal::read_only(command)),
        },
        Kind::Refused(r) => Err(r),
    }
}

/// A write no models schema allows.
fn write(command: &'static str, targets: Vec<ObjectName>) -> Kind {
    Kind::Write {
        command,
        targets: targets.iter().map(schema_of).collect(),
        model: false,
    }
}

/// A statement models are built with, changing `targets`; refused like any write when a
/// query inside it writes.
fn model_write(statement: &Statement, command: &'static str, targets: Vec<TargetSchema>) -> Kind {
    let mut nested = NestedWrite::default();
    let _ = statement.visit(&mut nested);
    match nested.found {
        Some(k) => k,
        None => Kind::Write {
            command,
            targets,
            model: true,
        },
    }
}

/// `model_write` of relation names.
fn model_relations(statement: &Statement, command: &'static str, names: &[&ObjectName]) -> Kind {
    model_write(
        statement,
        command,
        names.iter().map(|n| schema_of(n)).collect(),
    )
}

fn kind(statement: &Statement) -> Kind {
    match statement {
        Statement::Query(q) => query_kind(q, Allowed::Query),
        Statement::Explain {
            analyze,
            statement: inner,
            options,
            ..
        } => explain_kind(*analyze || analyze_option(options.as_deref()), inner),
        Statement::ShowVariable { .. } => Kind::Allowed(Allowed::Show),
        Statement::Set(set) => set_kind(set),
        Statement::Reset(ResetStatement { reset }) => match reset {
            Reset::ALL => Kind::Allowed(Allowed::Set),
            Reset::ConfigurationParameter(name) => setting_kind(&name.to_string()),
        },
        Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => Kind::Allowed(Allowed::Transaction),
        Statement::Prepare { statement, .. } => match kind(statement) {
            Kind::Allowed(Allowed::Query) => Kind::Allowed(Allowed::Prepare),
            Kind::Allowed(_) => Kind::Refused(Refusal::not_permitted(
                "only a query (SELECT, WITH, VALUES, TABLE) can be prepared",
            )),
            other => not_model(other),
        },
        Statement::Execute {
            name: Some(_),
            immediate: false,
            into,
            ..
        } if into.is_empty() => Kind::Allowed(Allowed::Execute),
        Statement::Deallocate { .. } => Kind::Allowed(Allowed::Deallocate),
        Statement::Declare { stmts } => {
            for d in stmts {
                match &d.for_query {
                    Some(q) => {
                        if let Kind::Allowed(_) = query_kind(q, Allowed::Query) {
                            continue;
                        }
                        return query_kind(q, Allowed::Query);
                    }
                    None => {
                        return Kind::Refused(Refusal::not_permitted(
                            "DECLARE declares only cursors here: DECLARE name CURSOR FOR <query>",
                        ))
                    }
                }
            }
            Kind::Allowed(Allowed::Declare)
        }
        Statement::Fetch { into: None, .. } | Statement::Close { .. } => {
            Kind::Allowed(Allowed::Cursor)
        }
        Statement::Fetch { into: Some(t), .. } => write("FETCH INTO", vec![t.clone()]),
        Statement::Discard { .. } => Kind::Allowed(Allowed::Discard),
        Statement::Copy {
            source, to, target, ..
        } => copy_kind(source, *to, target),
        other => write_kind(other),
    }
}

/// `EXPLAIN`: allowed for a query; `EXPLAIN ANALYZE` runs its statement, so it is allowed
/// only for a query; a plain `EXPLAIN` of anything else is refused as that statement is.
fn explain_kind(analyze: bool, inner: &Statement) -> Kind {
    match kind(inner) {
        Kind::Allowed(Allowed::Query) => Kind::Allowed(Allowed::Explain),
        Kind::Allowed(_) if analyze => Kind::Refused(Refusal::not_permitted(
            "EXPLAIN ANALYZE runs only a query (SELECT, WITH, VALUES, TABLE) here",
        )),
        Kind::Allowed(_) => Kind::Refused(Refusal::not_permitted(
            "EXPLAIN explains only a query (SELECT, WITH, VALUES, TABLE) here",
        )),
        other => not_model(other),
    }
}

/// A write found inside another statement (a query, EXPLAIN, PREPARE): never run as a
/// model statement, whatever it changes.
fn not_model(kind: Kind) -> Kind {
    match kind {
        Kind::Write {
            command, targets, ..
        } => Kind::Write {
            command,
            targets,
            model: false,
        },
        other => other,
    }
}

/// Whether Postgres-style options (`EXPLAIN (ANALYZE, ...)`) ask to run the statement.
fn analyze_option(options: Option<&[datafusion::sql::sqlparser::ast::UtilityOption]>) -> bool {
    options.is_some_and(|opts| {
        opts.iter().any(|o| {
            o.name.value.eq_ignore_ascii_case("analyze")
                && !matches!(
                    o.arg.as_ref().map(|a| a.to_string().to_ascii_lowercase()),
                    Some(ref v) if v == "false" || v == "off" || v == "0"
                )
        })
    })
}

fn copy_kind(source: &CopySource, to: bool, target: &CopyTarget) -> Kind {
    if !to {
        let table = match source {
            CopySource::Table { table_name, .. } => vec![table_name.clone()],
            CopySource::Query(_) => vec![],
        };
        return write("COPY FROM", table);
    }
    match target {
        CopyTarget::Stdout => match source {
            CopySource::Query(q) => match query_kind(q, Allowed::CopyOut) {
                Kind::Allowed(_) => Kind::Allowed(Allowed::CopyOut),
                other => other,
            },
            CopySource::Table { .. } => Kind::Allowed(Allowed::CopyOut),
        },
        CopyTarget::File { .. } => Kind::Refused(Refusal::not_permitted(
            "COPY to a file on the server is not allowed: use COPY ... TO STDOUT (psql's \\copy) to receive the rows on the client",
        )),
        CopyTarget::Program { .. } => Kind::Refused(Refusal::not_permitted(
            "COPY to a program on the server is not allowed: use COPY ... TO STDOUT (psql's \\copy) to receive the rows on the client",
        )),
        CopyTarget::Stdin => Kind::Refused(Refusal::not_permitted(
            "COPY ... TO STDIN is not valid: use COPY ... TO STDOUT",
        )),
    }
}

/// Finds what a query would change besides reading: a data-modifying statement nested in
/// it (`WITH d AS (DELETE ... RETURNING *) SELECT ...`), `SELECT ... INTO` (creates a
/// table) or row locks (`FOR UPDATE`).
#[derive(Default)]
struct NestedWrite {
    depth: usize,
    found: Option<Kind>,
}

impl Visitor for NestedWrite {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if !query.locks.is_empty() {
            self.found = Some(write("SELECT FOR UPDATE/SHARE", vec![]));
            return ControlFlow::Break(());
        }
        if let SetExpr::Select(select) = query.body.as_ref() {
            if let Some(k) = select_into(select) {
                self.found = Some(k);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<()> {
        self.depth += 1;
        if self.depth > 1 {
            // Any statement inside a query (INSERT/UPDATE/DELETE/MERGE in a CTE or a set
            // operation) is judged as the statement it is.
            let k = kind(statement);
            if !matches!(k, Kind::Allowed(Allowed::Query)) {
                self.found = Some(match k {
                    Kind::Allowed(_) => {
                        Kind::Refused(Refusal::not_permitted("a query may contain only queries"))
                    }
                    other => not_model(other),
                });
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_statement(&mut self, _statement: &Statement) -> ControlFlow<()> {
        self.depth = self.depth.saturating_sub(1);
        ControlFlow::Continue(())
    }
}

fn select_into(select: &Select) -> Option<Kind> {
    select
        .into
        .as_ref()
        .map(|into| write("SELECT INTO", vec![into.name.clone()]))
}

/// A query is allowed as `as_kind` when nothing inside it writes.
fn query_kind(query: &Query, as_kind: Allowed) -> Kind {
    let mut v = NestedWrite {
        depth: 1,
        found: None,
    };
    let _ = query.visit(&mut v);
    match v.found {
        Some(k) => k,
        None => match query.body.as_ref() {
            SetExpr::Insert(s) | SetExpr::Update(s) | SetExpr::Delete(s) | SetExpr::Merge(s) => {
                not_model(kind(s))
            }
            _ => Kind::Allowed(as_kind),
        },
    }
}

/// Session settings a client may `SET`, `RESET` and `SHOW`. Those with an effect: TimeZone,
/// search_path, statement_timeout, DateStyle, IntervalStyle, bytea_output,
/// extra_float_digits, application_name. The others are accepted and reported back, as
/// drivers and tools set them at connect time.
pub const SESSION_SETTINGS: &[&str] = &[
    "application_name",
    "bytea_output",
    "client_encoding",
    "client_min_messages",
    "datestyle",
    "default_transaction_isolation",
    "default_transaction_read_only",
    "extra_float_digits",
    "idle_in_transaction_session_timeout",
    "intervalstyle",
    "jit",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "lock_timeout",
    "search_path",
    "standard_conforming_strings",
    "statement_timeout",
    "time zone",
    "timezone",
    "transaction_isolation",
    "transaction_read_only",
    "work_mem",
];

/// `SET`/`RESET` of `name`: a listed session setting, or a custom dotted one
/// (`myapp.tenant`, which Postgres also accepts and which only `current_setting()` reads).
/// The engine's own settings (`datafusion.*`) change how the process runs and are refused.
fn setting_kind(name: &str) -> Kind {
    let name = name.trim().trim_matches('"').to_ascii_lowercase();
    if name.starts_with("datafusion.") || name == "datafusion" {
        return Kind::Refused(Refusal::not_permitted(format!(
            "permission denied to set parameter \"{name}\": the query engine's settings are fixed by skippr.yml"
        )));
    }
    if SESSION_SETTINGS.contains(&name.as_str()) {
        return Kind::Allowed(Allowed::Set);
    }
    let custom = name.split('.').count() == 2
        && name
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'));
    if custom {
        return Kind::Allowed(Allowed::Set);
    }
    Kind::Refused(Refusal {
        sqlstate: sqlstate::UNDEFINED_OBJECT,
        message: format!(
            "unrecognized configuration parameter \"{name}\": the settings a session may change are {}",
            SESSION_SETTINGS.join(", ")
        ),
    })
}

fn set_kind(set: &Set) -> Kind {
    match set {
        Set::SingleAssignment {
            hivevar: false,
            variable,
            ..
        } => setting_kind(&variable.to_string()),
        Set::SetTimeZone { .. } | Set::SetNames { .. } | Set::SetNamesDefault {} => {
            Kind::Allowed(Allowed::Set)
        }
        Set::SetTransaction { .. } => Kind::Allowed(Allowed::Transaction),
        Set::SetRole { .. } | Set::SetSessionAuthorization(_) => Kind::Refused(
            Refusal::not_permitted("a session cannot change its role or authorization"),
        ),
        _ => Kind::Refused(Refusal::not_permitted(
            "this form of SET is not supported: write SET name = value",
        )),
    }
}

/// The relation a `FROM` list or a `TableWithJoins` starts with.
fn first_table(tables: &[TableWithJoins]) -> Option<&ObjectName> {
    match &tables.first()?.relation {
        TableFactor::Table { name, .. } => Some(name),
        _ => None,
    }
}

/// Every other statement: a write or DDL (refused as read-only unless it builds models in
/// a models schema), or something else no client may run.
fn write_kind(statement: &Statement) -> Kind {
    match statement {
        Statement::Insert(i) => match &i.table {
            TableObject::TableName(n)
                if i.on.is_none() && i.returning.is_none() && i.source.is_some() =>
            {
                model_relations(statement, "INSERT", &[n])
            }
            TableObject::TableName(n) => write("INSERT", vec![n.clone()]),
            _ => write("INSERT", vec![]),
        },
        Statement::Update(u) => match &u.table.relation {
            TableFactor::Table { name, .. } if u.returning.is_none() && u.limit.is_none() => {
                model_relations(statement, "UPDATE", &[name])
            }
            TableFactor::Table { name, .. } => write("UPDATE", vec![name.clone()]),
            _ => write("UPDATE", vec![]),
        },
        Statement::Delete(d) => {
            let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
            match first_table(from) {
                Some(name)
                    if d.tables.is_empty()
                        && from.len() == 1
                        && d.returning.is_none()
                        && d.order_by.is_empty()
                        && d.limit.is_none() =>
                {
                    model_relations(statement, "DELETE", &[name])
                }
                _ => write("DELETE", vec![]),
            }
        }
        Statement::Merge(_) => write("MERGE", vec![]),
        Statement::Truncate(t) => {
            let names: Vec<&ObjectName> = t.table_names.iter().map(|n| &n.name).collect();
            model_relations(statement, "TRUNCATE", &names)
        }
        Statement::CreateTable(c) if c.external => Kind::Refused(Refusal::not_permitted(
            "CREATE EXTERNAL TABLE is not allowed: it would read or write files on the server",
        )),
        Statement::CreateTable(c) if c.temporary => {
            model_write(statement, "CREATE TABLE", vec![TargetSchema::Temporary])
        }
        Statement::CreateTable(c) => model_relations(statement, "CREATE TABLE", &[&c.name]),
        Statement::CreateView(c) if !c.materialized && !c.temporary => {
            model_relations(statement, "CREATE VIEW", &[&c.name])
        }
        Statement::CreateView(c) => write("CREATE VIEW", vec![c.name.clone()]),
        Statement::CreateIndex(_) => write("CREATE INDEX", vec![]),
        Statement::CreateSchema {
            schema_name: SchemaName::Simple(name),
            ..
        } => model_write(
            statement,
            "CREATE SCHEMA",
            vec![TargetSchema::Named(
                super::names::parts(name).join("."),
            )],
        ),
        Statement::CreateSchema { .. } => write("CREATE SCHEMA", vec![]),
        Statement::CreateDatabase { .. } => write("CREATE DATABASE", vec![]),
        Statement::CreateFunction(_) => write("CREATE FUNCTION", vec![]),
        Statement::AlterTable(a)
            if matches!(
                a.operations.as_slice(),
                [AlterTableOperation::RenameTable { .. }]
            ) =>
        {
            model_relations(statement, "ALTER TABLE", &[&a.name])
        }
        Statement::AlterTable(_) => write("ALTER TABLE", vec![]),
        Statement::AlterView { .. } => write("ALTER VIEW", vec![]),
        Statement::AlterIndex { .. } => write("ALTER INDEX", vec![]),
        Statement::AlterSchema(_) => write("ALTER SCHEMA", vec![]),
        Statement::Drop {
            object_type: ObjectType::Table | ObjectType::View,
            names,
            ..
        } => {
            let names: Vec<&ObjectName> = names.iter().collect();
            model_relations(statement, "DROP", &names)
        }
        Statement::Drop {
            object_type: ObjectType::Schema,
            names,
            ..
        } => model_write(
            statement,
            "DROP",
            names
                .iter()
                .map(|n| TargetSchema::Named(super::names::parts(n).join(".")))
                .collect(),
        ),
        Statement::Drop { names, .. } => write("DROP", names.clone()),
        Statement::DropFunction(_) => write("DROP FUNCTION", vec![]),
        Statement::Grant(g) => match &g.objects {
            Some(GrantObjects::Tables(names)) | Some(GrantObjects::Views(names)) => {
                let names: Vec<&ObjectName> = names.iter().collect();
                model_relations(statement, "GRANT", &names)
            }
            Some(GrantObjects::Schemas(names)) => model_write(
                statement,
                "GRANT",
                names
                    .iter()
                    .map(|n| TargetSchema::Named(super::names::parts(n).join(".")))
                    .collect(),
            ),
            _ => write("GRANT", vec![]),
        },
        Statement::Revoke(_) => write("REVOKE", vec![]),
        Statement::Comment {
            object_type: CommentObject::Table,
            object_name,
            ..
        } => model_relations(statement, "COMMENT", &[object_name]),
        Statement::Comment {
            object_type: CommentObject::Column,
            object_name,
            ..
        } if object_name.0.len() >= 2 => {
            let table = ObjectName(object_name.0[..object_name.0.len() - 1].to_vec());
            model_relations(statement, "COMMENT", &[&table])
        }
        Statement::Comment { .. } => write("COMMENT", vec![]),
        Statement::Analyze(_) => write("ANALYZE", vec![]),
        Statement::Vacuum(_) => write("VACUUM", vec![]),
        other => Kind::Refused(Refusal::not_permitted(format!(
            "{} is not allowed: this gateway runs queries (SELECT, WITH, VALUES, TABLE, EXPLAIN, COPY ... TO STDOUT), SHOW, SET of session settings, transaction control, PREPARE/EXECUTE, cursors, DISCARD, and the statements that build models in a models schema",
            command_name(other)
        ))),
    }
}

/// The statement's leading words, for messages (never its values).
fn command_name(statement: &Statement) -> String {
    let text = statement.to_string();
    let words: Vec<&str> = text
        .split_whitespace()
        .take(2)
        .filter(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
        .collect();
    if words.is_empty() {
        "this statement".to_string()
    } else {
        words.join(" ").to_ascii_uppercase()
    }
}
