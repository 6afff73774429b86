//! Gateway, from a client's SQL to the statements a session runs: the statement core's one
//! reading of it ([`super::pg::parse`]: known client queries, Postgres spellings the parser
//! lacks, casts the engine lacks), the
//! session's search path, its reading of names (database parts, temporary tables), and the
//! classification of each statement under what the session may write.

use std::collections::HashMap;

use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use pgwire::error::PgWireResult;

use super::errors::api_error;
use super::models::SessionModels;
use super::pg::known;
use super::pg::parse::{read, Parsed};
use super::pg::regclass::Relations;
use super::readonly::{classify, Allowed, Policy};
use super::settings::setting;
use super::Shared;

/// Reads a client's SQL ([`read`]): known client queries replaced, token edits, one parse
/// (two for catalog-shaped SQL), rewrites on the syntax tree. Reads the catalog's relation names when a
/// statement casts to `regclass`.
pub(super) async fn prepare_sql(
    sql: &str,
    ctx: &SessionContext,
    shared: &Shared,
    relations: &Relations,
) -> PgWireResult<Parsed> {
    let replaced = known::rewrite(sql, &shared.ws).await;
    let sql = replaced.as_deref().unwrap_or(sql);
    let parsed = read(sql).map_err(api_error)?;
    let rewritten = &parsed.rewritten;
    if rewritten.uses_relations {
        let schema = ctx
            .state_ref()
            .read()
            .config()
            .options()
            .catalog
            .default_schema
            .clone();
        relations
            .refresh(
                ctx,
                vec!["pg_catalog".to_string(), schema],
                rewritten.uses_descriptions,
            )
            .await
            .map_err(api_error)?;
    }
    if rewritten.changed || replaced.is_some() {
        tracing::debug!(
            known_query = replaced.is_some(),
            relations = rewritten.uses_relations,
            "client SQL rewritten for planning"
        );
    }
    Ok(parsed)
}

/// Points unqualified names at the first schema of the session's `search_path` (the
/// workspace by default), as Postgres resolves them.
pub(super) fn apply_search_path(
    ctx: &SessionContext,
    meta: &HashMap<String, String>,
    workspace: &str,
) {
    let path = setting(meta, "search_path", workspace).unwrap_or_default();
    let first = path
        .split(',')
        .map(|p| p.trim().trim_matches('"').to_string())
        .find(|p| !p.is_empty() && p != "$user" && p != "public" && p != "pg_catalog")
        .unwrap_or_else(|| workspace.to_string());
    let state = ctx.state_ref();
    let mut state = state.write();
    let options = state.config_mut().options_mut();
    if options.catalog.default_schema != first {
        options.catalog.default_schema = first;
    }
}

/// The schema unqualified names mean now (see [`apply_search_path`]).
pub(super) fn default_schema(ctx: &SessionContext) -> String {
    ctx.state_ref()
        .read()
        .config()
        .options()
        .catalog
        .default_schema
        .clone()
}

/// What this session may write: the models schemas.
pub(super) fn policy(ctx: &SessionContext, models: &SessionModels) -> Policy {
    Policy {
        models: Some(models.writable(&default_schema(ctx))),
    }
}

/// A parsed statement with its names read as this session reads them (see
/// [`super::names::normalize`]), and what the classifier allows it as.
pub(super) fn classified(
    mut statement: SqlStatement,
    ctx: &SessionContext,
    models: &SessionModels,
) -> PgWireResult<(SqlStatement, Allowed)> {
    super::names::normalize(&mut statement, &models.temp_names(), models.temp_schema());
    let allowed = classify(&statement, &policy(ctx, models)).map_err(|r| r.into_error())?;
    Ok((statement, allowed))
}
