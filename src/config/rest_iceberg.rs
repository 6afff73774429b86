//! Config, the Iceberg REST catalog sinks (`RestIceberg` and its shortcuts `S3TablesIceberg`
//! and `GlueRestIceberg`): the checks of their settings, shared by `validate` and `connect`.
//!
//! Messages never repeat a `credential`, a `token` or a property value: they may come from
//! the environment.

use super::locate::Segment;
use super::model::{
    DataSinkDef, GlueRestIcebergSink, RestIcebergSink, S3TablesIcebergSink, SchemaSinkDef,
};
use super::{keys, Validator};

/// The SigV4 signing names of AWS's Iceberg REST endpoints.
pub const SIGV4_SERVICES: [&str; 2] = ["s3tables", "glue"];

/// What is wrong with `uri` as a catalog's base URI, or `None`.
pub fn uri_problem(uri: &str) -> Option<String> {
    let example = "write the catalog's base URI as its docs give it, e.g. https://catalog.example.com/api/catalog (requests go to <uri>/v1/...)";
    if uri.trim().is_empty() {
        return Some(format!("must not be empty: {example}"));
    }
    let parsed = match url::Url::parse(uri.trim()) {
        Ok(u) => u,
        Err(_) => return Some(format!("`{uri}` is not an http(s) URL: {example}")),
    };
    if !matches!(parsed.scheme(), "http" | "https") || !parsed.has_host() {
        return Some(format!("`{uri}` is not an http(s) URL: {example}"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Not repeated: it holds a secret.
        return Some(
            "holds a user name or password: give the URI without them, and the secret in `credential` (OAuth2 client credentials) or `token`".to_string(),
        );
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Some(format!(
            "`{uri}` has a query or fragment: give the catalog's base URI only ({example})"
        ));
    }
    let path = parsed.path().trim_end_matches('/');
    if path.ends_with("/v1") {
        let base = uri.trim().trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        return Some(format!(
            "`{uri}` ends with /v1, which the client appends itself: write {base}"
        ));
    }
    None
}

/// What is wrong with `credential` (OAuth2 client credentials), or `None`. The value is
/// never repeated.
pub fn credential_problem(credential: &str) -> Option<String> {
    match credential.split_once(':') {
        Some((id, secret)) if !id.trim().is_empty() && !secret.trim().is_empty() => None,
        _ => Some(
            "is not `<client id>:<client secret>`: write it as ${CLIENT_ID}:${CLIENT_SECRET}, with the two parts in environment variables".to_string(),
        ),
    }
}

/// What is wrong with `service` as a SigV4 signing name, or `None`.
pub fn service_problem(service: &str) -> Option<String> {
    (!SIGV4_SERVICES.contains(&service)).then(|| {
        format!(
            "`{service}` is not a signing name of an AWS Iceberg REST endpoint; allowed: {} (`s3tables` for S3 Tables, `glue` for Glue)",
            SIGV4_SERVICES.join(", ")
        )
    })
}

/// What is wrong with `arn` as the ARN of an S3 table bucket in `region`, or `None`.
pub fn table_bucket_arn_problem(arn: &str, region: &str) -> Option<String> {
    let form = "write it as arn:aws:s3tables:<region>:<account>:bucket/<name>, as the S3 console or `aws s3tables list-table-buckets` shows it";
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let [arn_word, partition, service, arn_region, account, resource] = parts[..] else {
        return Some(format!("`{arn}` is not a table bucket ARN: {form}"));
    };
    let name = resource.strip_prefix("bucket/").unwrap_or_default();
    let name_ok = (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    let ok = arn_word == "arn"
        && matches!(partition, "aws" | "aws-cn" | "aws-us-gov")
        && service == "s3tables"
        && !arn_region.is_empty()
        && account.len() == 12
        && account.chars().all(|c| c.is_ascii_digit())
        && name_ok;
    if !ok {
        return Some(format!("`{arn}` is not a table bucket ARN: {form}"));
    }
    if !region.trim().is_empty() && arn_region != region.trim() {
        return Some(format!(
            "the table bucket is in {arn_region}, and `region` says {}: give the bucket's own region",
            region.trim()
        ));
    }
    None
}

/// The REST catalog a sink definition names: (connector key, the catalog, the one
/// namespace every table goes to when the connector fixes it). `None` for other kinds.
pub(super) fn rest_target(
    rest: Option<&RestIcebergSink>,
    s3_tables: Option<&S3TablesIcebergSink>,
    glue_rest: Option<&GlueRestIcebergSink>,
) -> Option<(&'static str, RestIcebergSink, Option<String>)> {
    if let Some(r) = rest {
        Some(("RestIceberg", r.clone(), None))
    } else if let Some(t) = s3_tables {
        Some(("S3TablesIceberg", t.rest(), None))
    } else {
        glue_rest.map(|g| {
            (
                "GlueRestIceberg",
                g.rest(),
                Some(g.glue_database_name.clone()),
            )
        })
    }
}

/// Whether two REST catalogs are the same catalog and warehouse.
pub(super) fn same_catalog(a: &RestIcebergSink, b: &RestIcebergSink) -> bool {
    let uri = |s: &RestIcebergSink| s.uri.trim().trim_end_matches('/').to_string();
    let warehouse = |s: &RestIcebergSink| s.warehouse.as_deref().map(str::trim).map(str::to_string);
    uri(a) == uri(b) && warehouse(a) == warehouse(b)
}

impl Validator<'_> {
    fn report_at(&mut self, at: &[&str], field: &[&str], message: impl Into<String>) {
        let mut p = keys(at);
        p.extend(field.iter().map(|f| Segment::Key((*f).to_string())));
        self.report(p, message);
    }

    /// A `RestIceberg` connector at `at`.
    pub(super) fn check_rest(&mut self, at: &[&str], r: &RestIcebergSink) {
        if let Some(problem) = uri_problem(&r.uri) {
            self.report_at(at, &["uri"], problem);
        }
        if r.warehouse.as_deref().is_some_and(|w| w.trim().is_empty()) {
            self.report_at(
                at,
                &["warehouse"],
                "must not be empty: give the warehouse as the catalog names it (a name or a location), or leave it out for the catalog's default",
            );
        }
        if let Some(c) = &r.credential {
            if let Some(problem) = credential_problem(c) {
                self.report_at(at, &["credential"], problem);
            }
        }
        if r.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            self.report_at(
                at,
                &["token"],
                "must not be empty: give the bearer token (as ${CATALOG_TOKEN}), or leave it out",
            );
        }
        if r.credential.is_some() && r.token.is_some() {
            self.report_at(
                at,
                &["token"],
                "`credential` and `token` exclude each other: give OAuth2 client credentials (`credential`) or a bearer token (`token`), not both",
            );
        }
        if r.scope.as_deref().is_some_and(|s| s.trim().is_empty()) {
            self.report_at(
                at,
                &["scope"],
                "must not be empty: give the OAuth2 scope (e.g. PRINCIPAL_ROLE:ALL), or leave it out for `catalog`",
            );
        }
        if let Some(s) = &r.sigv4 {
            if s.region.trim().is_empty() {
                self.report_at(
                    at,
                    &["sigv4", "region"],
                    "must not be empty: give the AWS region of the endpoint, e.g. us-east-1",
                );
            }
            if let Some(problem) = service_problem(&s.service) {
                self.report_at(at, &["sigv4", "service"], problem);
            }
            for (field, given) in [("credential", &r.credential), ("token", &r.token)] {
                if given.is_some() {
                    self.report_at(
                        at,
                        &[field],
                        format!("`sigv4` requests are signed with AWS credentials (found as the AWS CLI finds them), so `{field}` does not apply: remove it, or remove `sigv4` for a catalog that takes OAuth2 or a bearer token"),
                    );
                }
            }
        }
        for key in r.properties.keys() {
            if key.trim().is_empty() {
                self.report_at(
                    at,
                    &["properties", key],
                    "a property needs a name, e.g. s3.endpoint",
                );
            }
        }
    }

    /// An `S3TablesIceberg` connector at `at`.
    pub(super) fn check_s3_tables(&mut self, at: &[&str], t: &S3TablesIcebergSink) {
        if t.region.trim().is_empty() {
            self.report_at(
                at,
                &["region"],
                "must not be empty: give the table bucket's AWS region, e.g. us-east-1",
            );
        }
        if let Some(problem) = table_bucket_arn_problem(&t.table_bucket_arn, &t.region) {
            self.report_at(at, &["table_bucket_arn"], problem);
        }
    }

    /// A `GlueRestIceberg` connector at `at`.
    pub(super) fn check_glue_rest(&mut self, at: &[&str], g: &GlueRestIcebergSink) {
        if g.glue_database_name.trim().is_empty() {
            self.report_at(
                at,
                &["glue_database_name"],
                "must not be empty: give the Glue database the tables go to (created when missing)",
            );
        }
        if g.region.trim().is_empty() {
            self.report_at(
                at,
                &["region"],
                "must not be empty: give the AWS region of the Glue catalog, e.g. us-east-1",
            );
        }
    }

    /// The REST connectors of the definition `<section>.<name>` (a data or schema sink).
    pub(super) fn check_rest_kinds(
        &mut self,
        section: &str,
        name: &str,
        rest: Option<&RestIcebergSink>,
        s3_tables: Option<&S3TablesIcebergSink>,
        glue_rest: Option<&GlueRestIcebergSink>,
    ) {
        if let Some(r) = rest {
            self.check_rest(&[section, name, "RestIceberg"], r);
        }
        if let Some(t) = s3_tables {
            self.check_s3_tables(&[section, name, "S3TablesIceberg"], t);
        }
        if let Some(g) = glue_rest {
            self.check_glue_rest(&[section, name, "GlueRestIceberg"], g);
        }
    }

    /// `data_sinks.<name>.schema_sink` (`reference`) of a REST catalog sink: the schema sink
    /// must be the same catalog, warehouse and namespace.
    pub(super) fn check_rest_schema_sink(
        &mut self,
        name: &str,
        reference: &str,
        def: &DataSinkDef,
        schema_sink: &SchemaSinkDef,
    ) {
        let Some((kind, sink, namespace)) = rest_target(
            def.rest_iceberg.as_ref(),
            def.s3_tables_iceberg.as_ref(),
            def.glue_rest_iceberg.as_ref(),
        ) else {
            return;
        };
        // A sink with its own problems is compared once they are fixed.
        if self.reported_under(&["data_sinks", name]) {
            return;
        }
        let theirs = rest_target(
            schema_sink.rest_iceberg.as_ref(),
            schema_sink.s3_tables_iceberg.as_ref(),
            schema_sink.glue_rest_iceberg.as_ref(),
        );
        let same = theirs
            .as_ref()
            .is_some_and(|(_, s, ns)| same_catalog(&sink, s) && *ns == namespace);
        if same {
            return;
        }
        let settings = match (kind, &namespace) {
            ("S3TablesIceberg", _) => format!(
                "an S3TablesIceberg schema sink with the same table_bucket_arn ({})",
                sink.warehouse.as_deref().unwrap_or_default()
            ),
            (_, Some(database)) => format!(
                "a GlueRestIceberg schema sink with the same glue_database_name and region ({database}, {})",
                sink.sigv4.as_ref().map(|s| s.region.as_str()).unwrap_or_default()
            ),
            _ => format!(
                "a RestIceberg schema sink with the same uri and warehouse ({}, {})",
                sink.uri,
                sink.warehouse.as_deref().unwrap_or("the catalog's default")
            ),
        };
        self.report(
            keys(&["data_sinks", name, "schema_sink"]),
            format!("a {kind} sink registers its schemas in its own catalog: `{reference}` must be {settings}"),
        );
    }
}
