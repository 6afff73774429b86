//! The AWS Glue Data Catalog API, as the Glue catalog uses it: JSON requests signed with
//! SigV4, sent with the storage layer's HTTP client and credential chain. The seam is one
//! call per operation so that the catalog's commit protocol can be tested against an
//! in-process double that checks `VersionId` as Glue does.

use std::sync::Arc;

use object_store::aws::AmazonS3;

use crate::storage::aws_json::AwsJsonClient;
pub use crate::storage::aws_json::{AwsError as GlueError, AwsJsonApi as GlueApi};

/// Glue over HTTPS (or the `http://` endpoint of a local stand-in).
pub type HttpGlue = AwsJsonClient;

/// Glue in `region` (or at `AWS_ENDPOINT_URL_GLUE` / `AWS_ENDPOINT_URL`), signing with the
/// credentials `s3` uses.
pub fn http_glue(region: &str, s3: Arc<AmazonS3>) -> crate::error::Result<HttpGlue> {
    AwsJsonClient::new("glue", "AWSGlue", region, s3)
}

#[cfg(test)]
pub mod fake {
    //! An in-process Glue that keeps databases and tables in memory and, unlike the local
    //! S3/Glue stand-ins, refuses an `UpdateTable` whose `VersionId` is not current.

    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::Value;

    use super::*;

    #[derive(Debug, Default)]
    pub struct FakeGlue {
        pub databases: Mutex<BTreeMap<String, Value>>,
        /// (database, table) -> (table, version)
        pub tables: Mutex<BTreeMap<(String, String), (Value, u64)>>,
    }

    fn err(code: &str, message: &str) -> GlueError {
        GlueError {
            code: code.into(),
            message: message.into(),
        }
    }

    fn s(v: &Value, k: &str) -> String {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }

    #[async_trait]
    impl GlueApi for FakeGlue {
        async fn call(&self, operation: &str, input: Value) -> Result<Value, GlueError> {
            let mut dbs = self.databases.lock().unwrap_or_else(|e| e.into_inner());
            let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
            match operation {
                "GetDatabase" => dbs
                    .get(&s(&input, "Name"))
                    .map(|d| serde_json::json!({ "Database": d }))
                    .ok_or_else(|| err("EntityNotFoundException", "no database")),
                "CreateDatabase" => {
                    let d = input["DatabaseInput"].clone();
                    let name = s(&d, "Name");
                    if dbs.contains_key(&name) {
                        return Err(err("AlreadyExistsException", "database exists"));
                    }
                    dbs.insert(name, d);
                    Ok(serde_json::json!({}))
                }
                "GetTable" => {
                    let key = (s(&input, "DatabaseName"), s(&input, "Name"));
                    let (t, v) = tables
                        .get(&key)
                        .ok_or_else(|| err("EntityNotFoundException", "no table"))?;
                    let mut t = t.clone();
                    t["VersionId"] = Value::String(v.to_string());
                    t["DatabaseName"] = Value::String(key.0);
                    Ok(serde_json::json!({ "Table": t }))
                }
                "GetTables" => {
                    let db = s(&input, "DatabaseName");
                    let list: Vec<Value> = tables
                        .iter()
                        .filter(|((d, _), _)| *d == db)
                        .map(|(_, (t, _))| t.clone())
                        .collect();
                    Ok(serde_json::json!({ "TableList": list }))
                }
                "CreateTable" => {
                    let t = input["TableInput"].clone();
                    let key = (s(&input, "DatabaseName"), s(&t, "Name"));
                    if !dbs.contains_key(&key.0) {
                        return Err(err("EntityNotFoundException", "no database"));
                    }
                    if tables.contains_key(&key) {
                        return Err(err("AlreadyExistsException", "table exists"));
                    }
                    tables.insert(key, (t, 1));
                    Ok(serde_json::json!({}))
                }
                "UpdateTable" => {
                    let t = input["TableInput"].clone();
                    let key = (s(&input, "DatabaseName"), s(&t, "Name"));
                    let (current, version) = tables
                        .get_mut(&key)
                        .ok_or_else(|| err("EntityNotFoundException", "no table"))?;
                    if s(&input, "VersionId") != version.to_string() {
                        return Err(err(
                            "ConcurrentModificationException",
                            "the table was updated since this version",
                        ));
                    }
                    *current = t;
                    *version += 1;
                    Ok(serde_json::json!({}))
                }
                "DeleteTable" => {
                    let key = (s(&input, "DatabaseName"), s(&input, "Name"));
                    tables
                        .remove(&key)
                        .map(|_| serde_json::json!({}))
                        .ok_or_else(|| err("EntityNotFoundException", "no table"))
                }
                other => Err(err(
                    "InvalidInputException",
                    &format!("fake has no {other}"),
                )),
            }
        }
    }
}
