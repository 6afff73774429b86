//! How requests to an Iceberg REST catalog are authorised: a bearer token, OAuth2 client
//! credentials (a token fetched from the catalog's token endpoint and fetched again before it
//! expires, or when the catalog refuses it), or AWS SigV4 (the S3 Tables and Glue endpoints).

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpClient, HttpRequestBody};
use serde::Deserialize;

/// How long before its expiry a token is fetched again (or a fifth of its life, if shorter).
const REFRESH_BEFORE: Duration = Duration::from_secs(60);

/// The authorisation of every request to one catalog.
#[derive(Debug)]
pub enum Auth {
    /// No authorisation (a catalog on a private network).
    None,
    /// A bearer token given in the sink's `token`.
    Token(String),
    /// OAuth2 client credentials (`credential: id:secret`).
    OAuth2(OAuth2),
    /// AWS SigV4 with the standard credential chain.
    Sigv4 {
        region: String,
        service: String,
        /// Supplies credentials from the standard chain (an S3 client's provider).
        chain: Arc<AmazonS3>,
    },
}

/// OAuth2 client credentials and the token they got.
#[derive(Debug)]
pub struct OAuth2 {
    pub client_id: String,
    pub client_secret: String,
    pub scope: String,
    /// The token endpoint (`oauth2-server-uri`, default `<uri>/v1/oauth/tokens`).
    pub token_uri: std::sync::Mutex<String>,
    issued: tokio::sync::Mutex<Option<Issued>>,
}

#[derive(Debug, Clone)]
struct Issued {
    token: String,
    /// When to fetch the next one (`None`: when the catalog refuses this one).
    renew_at: Option<Instant>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct OAuthError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// Why no token was issued (the token endpoint's words, never the secret).
#[derive(Debug)]
pub struct AuthError {
    pub message: String,
    /// Whether a later attempt may succeed (no answer, a server fault).
    pub transient: bool,
}

impl OAuth2 {
    pub fn new(credential: &str, scope: Option<&str>, token_uri: String) -> Self {
        let (id, secret) = credential.split_once(':').unwrap_or(("", credential));
        Self {
            client_id: id.to_string(),
            client_secret: secret.to_string(),
            scope: scope.unwrap_or("catalog").to_string(),
            token_uri: std::sync::Mutex::new(token_uri),
            issued: tokio::sync::Mutex::new(None),
        }
    }

    /// The current token, fetched first when there is none or it is about to expire.
    pub async fn token(&self, client: &HttpClient) -> Result<String, AuthError> {
        let mut issued = self.issued.lock().await;
        if let Some(i) = issued.as_ref() {
            if i.renew_at.is_none_or(|at| Instant::now() < at) {
                return Ok(i.token.clone());
            }
        }
        let fresh = self.fetch(client).await?;
        let token = fresh.token.clone();
        *issued = Some(fresh);
        Ok(token)
    }

    /// Forgets `token` (the catalog refused it), so that the next request fetches another.
    pub async fn refused(&self, token: &str) {
        let mut issued = self.issued.lock().await;
        if issued.as_ref().is_some_and(|i| i.token == token) {
            *issued = None;
        }
    }

    async fn fetch(&self, client: &HttpClient) -> Result<Issued, AuthError> {
        let uri = self
            .token_uri
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "client_credentials")
            .append_pair("client_id", &self.client_id)
            .append_pair("client_secret", &self.client_secret)
            .append_pair("scope", &self.scope)
            .finish();
        let transport = |e: &dyn std::fmt::Display| AuthError {
            message: format!("no answer from the OAuth2 token endpoint {uri}: {e}"),
            transient: true,
        };
        let request = http::Request::builder()
            .method("POST")
            .uri(&uri)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(HttpRequestBody::from(body.into_bytes()))
            .map_err(|e| transport(&e))?;
        let started = Instant::now();
        let response = client.execute(request).await.map_err(|e| transport(&e))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| transport(&e))?;
        if !status.is_success() {
            let why = match serde_json::from_slice::<OAuthError>(&bytes) {
                Ok(e) => match e.error_description {
                    Some(d) => format!("{}: {d}", e.error),
                    None => e.error,
                },
                Err(_) => String::from_utf8_lossy(&bytes).chars().take(300).collect(),
            };
            return Err(AuthError {
                message: format!(
                    "the OAuth2 token endpoint {uri} refused the client credentials ({status}: {why}); check the sink's `credential` (<client id>:<client secret>) and `scope`"
                ),
                transient: status.is_server_error(),
            });
        }
        let answer: TokenResponse = serde_json::from_slice(&bytes).map_err(|e| AuthError {
            message: format!(
                "the OAuth2 token endpoint {uri} answered without an access token: {e}"
            ),
            transient: false,
        })?;
        tracing::debug!(expires_in = ?answer.expires_in, "REST catalog token issued");
        Ok(Issued {
            token: answer.access_token,
            renew_at: answer.expires_in.map(|secs| {
                let life = Duration::from_secs(secs);
                started + life.saturating_sub(REFRESH_BEFORE.min(life / 5))
            }),
        })
    }
}

impl Auth {
    /// Authorises `request`; returns the bearer token used, if any (to forget it when the
    /// catalog refuses it).
    pub async fn authorize(
        &self,
        client: &HttpClient,
        request: &mut http::Request<HttpRequestBody>,
    ) -> Result<Option<String>, AuthError> {
        let bearer = |request: &mut http::Request<HttpRequestBody>, token: &str| {
            if let Ok(v) = http::HeaderValue::from_str(&format!("Bearer {token}")) {
                request.headers_mut().insert(http::header::AUTHORIZATION, v);
            }
        };
        match self {
            Auth::None => Ok(None),
            Auth::Token(t) => {
                bearer(request, t);
                Ok(None)
            }
            Auth::OAuth2(o) => {
                let token = o.token(client).await?;
                bearer(request, &token);
                Ok(Some(token))
            }
            Auth::Sigv4 {
                region,
                service,
                chain,
            } => {
                let credential = chain.credentials().get_credential().await.map_err(|e| AuthError {
                    message: format!("no AWS credentials found to sign REST catalog requests (environment, AWS_PROFILE, web identity, instance role): {e}"),
                    transient: false,
                })?;
                AwsAuthorizer::new(&credential, service, region).authorize(request, None);
                Ok(None)
            }
        }
    }

    /// Whether a refused request may succeed with a fresh token.
    pub fn renews(&self) -> bool {
        matches!(self, Auth::OAuth2(_))
    }
}
