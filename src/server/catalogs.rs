//! Gateway, the catalogs one session sees: the shared ones (the live workspace, `skippr`),
//! plus what is the session's own: the models schemas as it sees them (its uncommitted
//! changes included), its temporary schema, and a `pg_catalog` and `information_schema`
//! built over exactly that, so what a session creates shows at once in its catalog queries.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider};
use datafusion::error::{DataFusionError, Result as DfResult};

use super::activity::Backend;
use super::models::SessionModels;
use super::pg::info_schema::InfoSchema;
use super::Shared;
use crate::query::models::{ModelSchema, ModelsView};
use crate::query::view::ViewHandle;
use crate::query::{LiveSchema, CATALOG};

/// A session's catalogs: the shared list with the default catalog seen through
/// [`SessionCatalog`]. The session holds it strongly; the schemas inside it that read it
/// (pg_catalog, information_schema) hold it weakly, or the session's catalogs would keep
/// themselves alive forever.
#[derive(Debug)]
pub struct SessionCatalogs(Handle);

#[derive(Debug)]
enum Handle {
    Strong(Arc<Parts>),
    Weak(Weak<Parts>),
}

#[derive(Debug)]
struct Parts {
    inner: Arc<dyn CatalogProviderList>,
    catalog: Arc<SessionCatalog>,
}

impl SessionCatalogs {
    /// `own(list)` gives the session's own schemas (pg_catalog, information_schema, temp)
    /// from a weak handle on the list being built.
    pub fn new(
        inner: Arc<dyn CatalogProviderList>,
        models: Arc<SessionModels>,
        own: impl FnOnce(Arc<dyn CatalogProviderList>) -> HashMap<String, Arc<dyn SchemaProvider>>,
    ) -> DfResult<Arc<Self>> {
        let shared = inner
            .catalog(CATALOG)
            .ok_or_else(|| DataFusionError::Plan("the gateway has no default catalog".into()))?;
        let parts = Arc::new_cyclic(|weak: &Weak<Parts>| {
            let handle: Arc<dyn CatalogProviderList> =
                Arc::new(SessionCatalogs(Handle::Weak(weak.clone())));
            Parts {
                inner,
                catalog: Arc::new(SessionCatalog {
                    inner: shared,
                    own: own(handle),
                    models,
                }),
            }
        });
        Ok(Arc::new(SessionCatalogs(Handle::Strong(parts))))
    }

    /// The catalogs, while the session lives.
    fn parts(&self) -> Option<Arc<Parts>> {
        match &self.0 {
            Handle::Strong(p) => Some(p.clone()),
            Handle::Weak(w) => w.upgrade(),
        }
    }
}

impl CatalogProviderList for SessionCatalogs {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn register_catalog(
        &self,
        _name: String,
        _catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        // Sessions never register catalogs (the engine's own statements are refused).
        None
    }

    fn catalog_names(&self) -> Vec<String> {
        self.parts()
            .map(|p| p.inner.catalog_names())
            .unwrap_or_default()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let parts = self.parts()?;
        if name == CATALOG {
            Some(parts.catalog.clone())
        } else {
            parts.inner.catalog(name)
        }
    }
}

/// The default catalog as one session sees it.
#[derive(Debug)]
struct SessionCatalog {
    inner: Arc<dyn CatalogProvider>,
    own: HashMap<String, Arc<dyn SchemaProvider>>,
    models: Arc<SessionModels>,
}

impl CatalogProvider for SessionCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        let mut names = self.inner.schema_names();
        for name in self
            .own
            .keys()
            .cloned()
            .chain(self.models.state().namespaces.iter().cloned())
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if let Some(s) = self.own.get(name) {
            return Some(s.clone());
        }
        if name == "pg_temp" {
            return self.own.get(self.models.temp_schema()).cloned();
        }
        let models = self.models.models_handle();
        if let Some(models) = models.filter(|_| self.models.state().namespaces.contains(name)) {
            let view: Arc<dyn ModelsView> = self.models.clone();
            return Some(Arc::new(ModelSchema {
                name: name.to_string(),
                models,
                view,
            }));
        }
        self.inner.schema(name)
    }

    fn register_schema(
        &self,
        name: &str,
        _schema: Arc<dyn SchemaProvider>,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        Err(DataFusionError::Plan(format!(
            "schema {name} cannot be registered in a gateway session"
        )))
    }
}

/// The engine state of one session (`backend`): the shared one, with the session's own
/// catalogs (its models, temporary tables, `pg_catalog` and `information_schema`).
pub(super) fn session_state(
    shared: &Shared,
    models: &Arc<SessionModels>,
    views: &Arc<ViewHandle>,
    backend: &Arc<Backend>,
) -> crate::error::Result<datafusion::execution::SessionState> {
    let catalogs =
        SessionCatalogs::new(shared.base.catalog_list().clone(), models.clone(), |list| {
            let mut own: HashMap<String, Arc<dyn SchemaProvider>> = HashMap::new();
            own.insert(
                "information_schema".to_string(),
                Arc::new(InfoSchema::new(list.clone(), shared.ws.clone())),
            );
            if let Ok(pg) = shared.pg.session_schema(
                list,
                models.clone(),
                models.temp_schema(),
                backend.clone(),
            ) {
                own.insert("pg_catalog".to_string(), pg);
            }
            own.insert(models.temp_schema().to_string(), models.temp_provider());
            // The live tables in this session's read views (one LSN per statement).
            own.insert(
                shared.workspace.clone(),
                Arc::new(LiveSchema(shared.ws.clone(), views.clone())),
            );
            own
        })
        .map_err(crate::error::Error::from)?;
    Ok(
        datafusion::execution::SessionStateBuilder::new_from_existing(shared.base.clone())
            .with_catalog_list(catalogs)
            .build(),
    )
}
