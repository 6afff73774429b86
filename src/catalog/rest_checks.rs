//! `skipprd discover`'s checks of a REST catalog sink, run before the source: the catalog
//! answers and authorises (its configuration is read with the sink's credentials), the
//! warehouse exists, the namespace exists or can be created, and whether commit rounds are
//! atomic across tables. Each failure carries the catalog's own answer and the fix.

use iceberg::{Catalog, NamespaceIdent};

use super::rest::RestCatalog;
use crate::config::RestIcebergSink;

/// One check's outcome.
pub struct CatalogCheck {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// What to do when it failed.
    pub fix: Option<String>,
}

/// The fix for a refusal, from the status the catalog answered with.
fn fix_for(message: &str, key: &str) -> String {
    if message.contains("(401") || message.contains("refused the client credentials") {
        format!("check {key}.credential (<client id>:<client secret>) or {key}.token, and {key}.scope; ask the catalog's admin for a principal that may use this warehouse")
    } else if message.contains("(403") {
        "grant the principal the privileges to list, create and write tables in this warehouse and namespace (for Polaris: a catalog role with CATALOG_MANAGE_CONTENT)".to_string()
    } else if message.contains("(404") {
        format!("check {key}.warehouse (the name the catalog gives it) and that {key}.uri is the catalog's base URI, without /v1")
    } else {
        format!("check {key}.uri and that the catalog is reachable from this machine (proxy, firewall, TLS)")
    }
}

/// Runs the checks of sink `name` (connector key `kind`) for `namespace`.
pub async fn check_sink(
    name: &str,
    kind: &str,
    sink: &RestIcebergSink,
    namespace: &str,
) -> Vec<CatalogCheck> {
    let key = format!("data_sinks.{name}.{kind}");
    let mut out = Vec::new();
    let catalog = match RestCatalog::new(sink, None) {
        Ok(c) => c,
        Err(e) => {
            out.push(CatalogCheck {
                name: format!("REST catalog {}", sink.uri),
                ok: false,
                detail: e.report(),
                fix: Some(fix_for(&e.report(), &key)),
            });
            return out;
        }
    };
    let reach = format!("REST catalog {} answers and authorises", sink.uri);
    if let Err(e) = catalog.check().await {
        let message = e.message().to_string();
        out.push(CatalogCheck {
            name: reach,
            ok: false,
            fix: Some(fix_for(&message, &key)),
            detail: message,
        });
        return out;
    }
    out.push(CatalogCheck {
        name: reach,
        ok: true,
        detail: format!(
            "warehouse {} found",
            sink.warehouse
                .as_deref()
                .unwrap_or("(the catalog's default)")
        ),
        fix: None,
    });
    let ns = NamespaceIdent::new(namespace.to_string());
    let ns_check = format!("namespace `{namespace}` exists or can be created");
    let outcome = match catalog.namespace_exists(&ns).await {
        Ok(true) => Ok("exists".to_string()),
        Ok(false) => catalog
            .create_namespace(&ns, Default::default())
            .await
            .map(|_| "created".to_string()),
        Err(e) => Err(e),
    };
    out.push(match outcome {
        Ok(detail) => CatalogCheck {
            name: ns_check,
            ok: true,
            detail,
            fix: None,
        },
        Err(e) => {
            let message = e.message().to_string();
            CatalogCheck {
                name: ns_check,
                ok: false,
                fix: Some(fix_for(&message, &key)),
                detail: message,
            }
        }
    });
    let atomic = catalog.offers_transactions().await.unwrap_or(false);
    out.push(CatalogCheck {
        name: "commit rounds".to_string(),
        ok: true,
        detail: if atomic {
            "atomic across tables (the catalog offers transactions/commit)".to_string()
        } else {
            "table by table (the catalog does not offer transactions/commit)".to_string()
        },
        fix: None,
    });
    out
}
