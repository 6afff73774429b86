//! AWS's JSON protocol, as the Glue catalog and the Athena query engine speak it: one signed
//! `POST /` per operation (`X-Amz-Target: <Service>.<Operation>`), sent with the storage
//! layer's HTTP client, runtime and credential chain. The seam is one call per operation, so
//! both services can be tested against in-process doubles.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::ClientOptions;
use serde_json::Value;

use super::{aws, on_io};

/// A failed call: the service's exception name (`EntityNotFoundException`,
/// `InvalidRequestException`, ...) and message, or `Transport` / `Credentials` when no
/// answer came back.
#[derive(Debug, Clone)]
pub struct AwsError {
    /// The exception name without its namespace.
    pub code: String,
    pub message: String,
}

impl AwsError {
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }

    /// A failure that a later attempt may not see: no answer, throttling, a service fault.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code.as_str(),
            "Transport"
                | "ThrottlingException"
                | "TooManyRequestsException"
                | "InternalServiceException"
                | "InternalServerException"
                | "ServiceUnavailableException"
        )
    }
}

impl fmt::Display for AwsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for AwsError {}

/// One operation (`GetTable`, `StartQueryExecution`, ...) with its JSON input and output.
#[async_trait]
pub trait AwsJsonApi: fmt::Debug + Send + Sync {
    async fn call(&self, operation: &str, input: Value) -> Result<Value, AwsError>;
}

/// One AWS JSON service over HTTPS (or the `http://` endpoint of a local stand-in).
#[derive(Debug)]
pub struct AwsJsonClient {
    /// The signing name and endpoint prefix (`glue`, `athena`).
    service: &'static str,
    /// What precedes the operation in `X-Amz-Target` (`AWSGlue`, `AmazonAthena`).
    target_prefix: &'static str,
    endpoint: String,
    region: String,
    /// Supplies credentials from the standard chain (the S3 client's provider).
    s3: Arc<AmazonS3>,
    client: HttpClient,
}

impl AwsJsonClient {
    /// `service` in `region` (or at `AWS_ENDPOINT_URL_<SERVICE>` / `AWS_ENDPOINT_URL`),
    /// signing with the credentials `s3` uses.
    pub fn new(
        service: &'static str,
        target_prefix: &'static str,
        region: &str,
        s3: Arc<AmazonS3>,
    ) -> crate::error::Result<Self> {
        let endpoint = aws::endpoint(service)
            .unwrap_or_else(|| format!("https://{service}.{region}.amazonaws.com"));
        // Plain HTTP only when the endpoint itself says so (a local stand-in such as moto).
        let options = ClientOptions::new().with_allow_http(endpoint.starts_with("http://"));
        let client = ReqwestConnector::default().connect(&options).map_err(|e| {
            crate::error::Error::config(format!(
                "cannot set up the {service} client for {endpoint}"
            ))
            .with_source(e)
        })?;
        Ok(Self {
            service,
            target_prefix,
            endpoint,
            region: region.to_string(),
            s3,
            client,
        })
    }

    /// Where requests go, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

fn transport(e: impl fmt::Display) -> AwsError {
    AwsError {
        code: "Transport".into(),
        message: e.to_string(),
    }
}

/// The error an unsuccessful answer carries: `__type` (namespace stripped) and the message.
fn answer_error(status: http::StatusCode, value: &Value) -> AwsError {
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
    AwsError { code, message }
}

#[async_trait]
impl AwsJsonApi for AwsJsonClient {
    async fn call(&self, operation: &str, input: Value) -> Result<Value, AwsError> {
        let (service, endpoint, region, s3, client) = (
            self.service,
            self.endpoint.clone(),
            self.region.clone(),
            self.s3.clone(),
            self.client.clone(),
        );
        let target = format!("{}.{operation}", self.target_prefix);
        let fut = async move {
            let credential = s3.credentials().get_credential().await.map_err(|e| AwsError {
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
            AwsAuthorizer::new(&credential, service, &region).authorize(&mut request, None);
            let response = client.execute(request).await.map_err(transport)?;
            let status = response.status();
            let bytes = response.into_body().bytes().await.map_err(transport)?;
            let value: Value = if bytes.is_empty() {
                Value::Object(Default::default())
            } else {
                serde_json::from_slice(&bytes).map_err(|e| {
                    transport(format!(
                        "{service} answered {status} with a body that is not JSON ({e})"
                    ))
                })?
            };
            if status.is_success() {
                Ok(value)
            } else {
                Err(answer_error(status, &value))
            }
        };
        match on_io(async move { Ok(fut.await) }).await {
            Ok(r) => r,
            Err(e) => Err(transport(e.report())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_code_loses_its_namespace() {
        let v = serde_json::json!({
            "__type": "com.amazonaws.athena#InvalidRequestException",
            "Message": "WorkGroup does not exist"
        });
        let e = answer_error(http::StatusCode::BAD_REQUEST, &v);
        assert!(e.is("InvalidRequestException"), "{e}");
        assert_eq!(e.message, "WorkGroup does not exist");
        let e = answer_error(http::StatusCode::BAD_GATEWAY, &serde_json::json!({}));
        assert_eq!(e.code, "HTTP 502 Bad Gateway");
    }
}
