//! Gateway, the Postgres imitation: what makes the live workspace look like a Postgres
//! database to drivers and tools. `pg_catalog` and `information_schema` over the live and
//! model relations, the Postgres functions clients call, rewrites of Postgres syntax the
//! query engine lacks, and the known client queries answered from Skippr's metadata. The
//! wire protocol, sessions and limits stay in `server/`.

pub mod arrays;
pub mod catalog;
pub mod catalog_types;
pub mod compat;
pub mod datetime;
pub mod describe;
pub mod fence;
pub mod functions;
pub mod info_schema;
pub mod known;
pub mod parse;
pub mod regclass;
pub mod relations;
pub mod rewrite;
pub mod stat_activity;
pub mod table_command;
pub mod types;
pub mod udf;

use std::sync::Arc;

use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};
use crate::query::{self, Workspace};

/// Registers the Postgres imitation in the gateway's shared session: our own
/// `information_schema` (the engine's, plus key constraints), `pg_catalog` with primary
/// keys and the sessions of `backends` (`pg_stat_activity`), and the Postgres functions.
pub fn setup(
    ctx: &SessionContext,
    ws: Arc<Workspace>,
    backends: Arc<crate::server::activity::Backends>,
) -> Result<catalog::PgShared> {
    let catalogs = ctx.state().catalog_list().clone();
    ctx.catalog(query::CATALOG)
        .ok_or_else(|| Error::fatal("the gateway session has no default catalog"))?
        .register_schema(
            "information_schema",
            Arc::new(info_schema::InfoSchema::new(catalogs, ws.clone())),
        )
        .map_err(Error::from)?;
    let shared = catalog::setup(ctx, ws, backends)?;
    // After pg_catalog's own functions, which some of these replace.
    functions::register(ctx);
    arrays::register(ctx);
    describe::register(ctx);
    ctx.add_analyzer_rule(Arc::new(arrays::ArrayCasts));
    ctx.add_analyzer_rule(Arc::new(compat::LikeEscape));
    ctx.add_analyzer_rule(Arc::new(compat::TimestampText::default()));
    Ok(shared)
}
