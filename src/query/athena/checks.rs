//! `skipprd discover`'s end-to-end checks of an `AthenaIceberg` sink, run before the source
//! is looked at: the warehouse bucket takes and gives back a probe object, the Glue database
//! exists (or is created, as `sync` would), and Athena runs `SELECT 1` in the workgroup.

use std::time::Duration;

use bytes::Bytes;
use iceberg::NamespaceIdent;
use serde::Serialize;

use super::{Athena, AthenaTarget, Failure, Interrupt};
use crate::catalog::SinkCatalog;
use crate::config::AthenaIcebergSink;
use crate::error::{Error, ErrorKind};
use crate::storage::{aws, Location, Store};

/// How long the `SELECT 1` check waits for Athena before stopping the query.
const ATHENA_CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// One check of the sink, in the shape of discover's source checks.
#[derive(Debug, Clone, Serialize)]
pub struct SinkCheck {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// What to do when it failed.
    pub fix: Option<String>,
}

fn passed(name: String, detail: String) -> SinkCheck {
    SinkCheck {
        name,
        ok: true,
        detail,
        fix: None,
    }
}

fn failed(name: String, detail: String, fix: String) -> SinkCheck {
    SinkCheck {
        name,
        ok: false,
        detail,
        fix: Some(fix),
    }
}

/// Every check of sink `name`, in order: bucket, Glue database, Athena.
pub async fn check_sink(name: &str, sink: &AthenaIcebergSink) -> Vec<SinkCheck> {
    let key = |field: &str| format!("data_sinks.{name}.AthenaIceberg.{field}");
    let region = aws::region(Some(sink.region.as_str()));
    vec![
        check_bucket(sink, &region, &key("warehouse")).await,
        check_glue(sink, &region, &key("glue_database_name")).await,
        check_athena(AthenaTarget::from_sink(name, sink)).await,
    ]
}

/// Puts and deletes a small object under the warehouse prefix.
async fn check_bucket(sink: &AthenaIcebergSink, region: &str, key: &str) -> SinkCheck {
    let name = format!("sink bucket {}", sink.warehouse);
    let location = match Location::parse_s3(&sink.warehouse) {
        Ok(l) => l,
        Err(e) => return failed(name, e, format!("fix {key}")),
    };
    let Location::S3 { bucket, prefix } = &location else {
        return failed(name, "not an S3 location".into(), format!("fix {key}"));
    };
    let probe = format!(".skippr-discover-probe-{}", uuid::Uuid::new_v4());
    let store = match Store::open(&location, Some(region)) {
        Ok(s) => s,
        Err(e) => return failed(name, e.report(), format!("fix {key} and the AWS settings")),
    };
    let arn = if prefix.is_empty() {
        format!("arn:aws:s3:::{bucket}/*")
    } else {
        format!("arn:aws:s3:::{bucket}/{prefix}/*")
    };
    let result = match store
        .put(&probe, Bytes::from_static(b"skipprd discover probe"))
        .await
    {
        Ok(_) => store
            .delete(&probe)
            .await
            .map_err(|e| ("s3:DeleteObject", e)),
        Err(e) => Err(("s3:PutObject", e)),
    };
    match result {
        Ok(()) => passed(
            name,
            format!("bucket `{bucket}` is reachable and writable (a probe object was written and removed)"),
        ),
        Err((action, e)) => {
            let report = e.report();
            let (detail, fix) = if report.contains("NoSuchBucket") {
                (
                    format!("bucket `{bucket}` does not exist"),
                    format!(
                        "create it (aws s3 mb s3://{bucket} --region {region}) or fix {key}"
                    ),
                )
            } else if report.contains("AccessDenied") || report.contains("Forbidden") {
                (
                    format!(
                        "the credentials in use may not write to {} ({action} was refused)",
                        location.display()
                    ),
                    format!(
                        "grant s3:PutObject, s3:GetObject and s3:DeleteObject on {arn}, and s3:ListBucket on arn:aws:s3:::{bucket}"
                    ),
                )
            } else {
                (
                    report,
                    format!(
                        "check that bucket `{bucket}` exists in region {region}, the network, AWS_REGION and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL"
                    ),
                )
            };
            failed(name, detail, fix)
        }
    }
}

/// The Glue database exists, or is created now (as `sync` would create it).
async fn check_glue(sink: &AthenaIcebergSink, region: &str, key: &str) -> SinkCheck {
    let db = &sink.glue_database_name;
    let name = format!("sink Glue database {db}");
    let fix_for = |e: &Error, action: &str| {
        let report = e.report();
        if report.contains("AccessDenied") || report.contains("not authorized") {
            format!(
                "grant the credentials in use the IAM actions glue:GetDatabase and glue:CreateDatabase on arn:aws:glue:{region}:<account>:catalog and arn:aws:glue:{region}:<account>:database/{db} (the sink also needs glue:GetTable, glue:GetTables, glue:CreateTable, glue:UpdateTable, glue:DeleteTable); the call that failed was {action}"
            )
        } else {
            format!(
                "check the network, AWS_REGION and AWS_ENDPOINT_URL_GLUE / AWS_ENDPOINT_URL, or set {key} to an existing database"
            )
        }
    };
    let catalog = match SinkCatalog::open_glue(sink) {
        Ok(c) => c,
        Err(e) => return failed(name, e.report(), format!("fix the sink's settings ({key})")),
    };
    let ns = NamespaceIdent::new(db.clone());
    match catalog.catalog.namespace_exists(&ns).await {
        Ok(true) => passed(name, format!("database `{db}` exists in region {region}")),
        Ok(false) => match catalog.ensure_namespace(db).await {
            Ok(_) => passed(
                name,
                format!("database `{db}` did not exist in region {region} and was created (sync would create it)"),
            ),
            Err(e) => {
                let fix = fix_for(&e, "glue:CreateDatabase");
                failed(name, format!("database `{db}` does not exist and cannot be created: {}", e.report()), fix)
            }
        },
        Err(e) => {
            let e = Error::from(e);
            let fix = fix_for(&e, "glue:GetDatabase");
            failed(name, e.report(), fix)
        }
    }
}

/// `SELECT 1` in the workgroup, stopped after [`ATHENA_CHECK_TIMEOUT`].
async fn check_athena(target: AthenaTarget) -> SinkCheck {
    let name = format!("sink Athena workgroup {}", target.workgroup);
    let athena = match Athena::connect(target.clone()) {
        Ok(a) => a,
        Err(e) => {
            return failed(
                name,
                e.report(),
                "fix the sink's region and the AWS settings".into(),
            )
        }
    };
    let timeout = async {
        tokio::time::sleep(ATHENA_CHECK_TIMEOUT).await;
        Interrupt {
            what: format!(
                "Athena did not finish SELECT 1 in workgroup `{}` within {} s",
                target.workgroup,
                ATHENA_CHECK_TIMEOUT.as_secs()
            ),
            fix: "check the workgroup's capacity and queue in the Athena console, then run discover again".into(),
        }
    };
    match athena.run("SELECT 1", &mut |_, _| {}, timeout).await {
        Ok(out) => passed(
            name,
            format!(
                "Athena ran SELECT 1 in workgroup `{}` (query {}), results in {}",
                target.workgroup, out.id, target.output_location
            ),
        ),
        Err(Failure { detail, fix, kind }) => {
            let fix = if kind == ErrorKind::Query && detail.contains("FAILED") {
                format!(
                    "{fix}; Athena writes results to {}: the credentials need s3:PutObject, s3:GetObject, s3:ListBucket and s3:GetBucketLocation there",
                    target.output_location
                )
            } else {
                fix
            };
            failed(name, detail, fix)
        }
    }
}
