//! The AWS Glue Data Catalog API, as the Glue catalog uses it: JSON requests signed with
//! SigV4, sent with the storage layer's HTTP client and credential chain. The seam is one
//! call per operation so that the catalog's commit protocol can be tested against an
//! in-process double that checks `VersionId` as Glue does.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::ClientOptions;
use serde_json::Value;

use crate::storage::{aws, on_io};

/// A failed Glue call: Glue's exception name (`EntityNotFoundException`,
/// `ConcurrentModificationException`, ...) and message, or a transport failure.
#[derive(Debug, Clone)]
pub struct GlueError {
    /// The exception name without its namespace; `Transport` when no answer came back.
    pub code: String,
    pub message: String,
}

impl GlueError {
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }
}

impl fmt::Display for GlueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for GlueError {}

/// One Glue operation (`GetTable`, `UpdateTable`, ...) with its JSON input and output.
#[async_trait]
pub trait GlueApi: fmt::Debug + Send + Sync {
    async fn call(&self, operation: &str, input: Value) -> Result<Value, GlueError>;
}

/// Glue over HTTPS (or the `http://` endpoint of a local stand-in).
#[derive(Debug)]
pub struct HttpGlue {
    endpoint: String,
    region: String,
    /// Supplies credentials from the standard chain (the S3 client's provider).
    s3: Arc<AmazonS3>,
    client: HttpClient,
}

impl HttpGlue {
    /// Glue in `region` (or at `AWS_ENDPOINT_URL_GLUE` / `AWS_ENDPOINT_URL`), signing with
    /// the credentials `s3` uses.
    pub fn new(region: &str, s3: Arc<AmazonS3>) -> crate::error::Result<Self> {
        let endpoint =
            aws::endpoint("glue").unwrap_or_else(|| format!("https://glue.{region}.amazonaws.com"));
        let options = ClientOptions::new().with_allow_http(endpoint.starts_with("http://"));
        let client = ReqwestConnector::default().connect(&options).map_err(|e| {
            crate::error::Error::config(format!("cannot set up the Glue client for {endpoint}"))
                .with_source(e)
        })?;
        Ok(Self {
            endpoint,
            region: region.to_string(),
            s3,
            client,
        })
    }
}

fn transport(e: impl fmt::Display) -> GlueError {
    GlueError {
        code: "Transport".into(),
        message: e.to_string(),
    }
}

#[async_trait]
impl GlueApi for HttpGlue {
    async fn call(&self, operation: &str, input: Value) -> Result<Value, GlueError> {
        let (endpoint, region, s3, client) = (
            self.endpoint.clone(),
            self.region.clone(),
            self.s3.clone(),
            self.client.clone(),
        );
        let target = format!("AWSGlue.{operation}");
        let fut = async move {
            let credential = s3.credentials().get_credential().await.map_err(|e| GlueError {
                code: "Credentials".into(),
                message: format!("no AWS credentials found (environment, AWS_PROFILE, web identity, instance role): {e}"),
            })?;
            let body = serde_json::to_vec(&input).map_err(transport)?;
            let mut request = http::Request::builder()
                .method("POST")
                .uri(format!("{endpoint}/"))
                .header("content-type", "application/x-amz-json-1.1")
                .header("x-amz-target", target)
                .body(HttpRequestBody::from(body))
                .map_err(transport)?;
            AwsAuthorizer::new(&credential, "glue", &region).authorize(&mut request, None);
            let response = client.execute(request).await.map_err(transport)?;
            let status = response.status();
            let bytes = response.into_body().bytes().await.map_err(transport)?;
            let value: Value = if bytes.is_empty() {
                Value::Object(Default::default())
            } else {
                serde_json::from_slice(&bytes).map_err(|e| {
                    transport(format!(
                        "Glue answered {status} with a body that is not JSON ({e})"
                    ))
                })?
            };
            if status.is_success() {
                return Ok(value);
            }
            let code = value
                .get("__type")
                .and_then(Value::as_str)
                .map(|t| t.rsplit(['#', ':']).next().unwrap_or(t).to_string())
                .unwrap_or_else(|| format!("HTTP {status}"));
            let message = ["message", "Message"]
                .iter()
                .find_map(|k| value.get(*k).and_then(Value::as_str))
                .unwrap_or_default()
                .to_string();
            Err(GlueError { code, message })
        };
        match on_io(async move { Ok(fut.await) }).await {
            Ok(r) => r,
            Err(e) => Err(transport(e.report())),
        }
    }
}

#[cfg(test)]
pub mod fake {
    //! An in-process Glue that keeps databases and tables in memory and, unlike the local
    //! S3/Glue stand-ins, refuses an `UpdateTable` whose `VersionId` is not current.

    use std::collections::BTreeMap;
    use std::sync::Mutex;

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
