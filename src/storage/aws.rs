//! AWS settings for the storage layer and the Glue catalog: credentials, region and
//! endpoints from the standard AWS chain, so skipprd runs wherever the AWS CLI would.
//!
//! object_store's builder already reads the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`/`AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_S3`), web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`
//! with `AWS_ROLE_ARN`), ECS task roles (`AWS_CONTAINER_CREDENTIALS_*`) and the instance
//! metadata service. This module adds what it lacks: the shared `~/.aws/credentials` and
//! `~/.aws/config` files with `AWS_PROFILE`, and per-service endpoints for Glue.

use std::collections::HashMap;
use std::path::PathBuf;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};

use crate::error::{Error, Result};

/// The region used when nothing names one, as the AWS SDKs do for S3.
pub const DEFAULT_REGION: &str = "us-east-1";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn home() -> Option<PathBuf> {
    env("HOME").map(PathBuf::from)
}

/// The settings of one profile from the shared files (credentials file first, as the AWS
/// CLI does), keys lower-cased.
fn shared_profile() -> HashMap<String, String> {
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
    let mut out = HashMap::new();
    let files = [
        (
            env("AWS_SHARED_CREDENTIALS_FILE")
                .map(PathBuf::from)
                .or_else(|| home().map(|h| h.join(".aws/credentials"))),
            profile.clone(),
        ),
        (
            env("AWS_CONFIG_FILE")
                .map(PathBuf::from)
                .or_else(|| home().map(|h| h.join(".aws/config"))),
            if profile == "default" {
                profile.clone()
            } else {
                format!("profile {profile}")
            },
        ),
    ];
    for (file, section) in files {
        let Some(text) = file.and_then(|f| std::fs::read_to_string(f).ok()) else {
            continue;
        };
        for (k, v) in parse_ini_section(&text, &section) {
            out.entry(k).or_insert(v);
        }
    }
    out
}

/// `key = value` lines of `[section]` in an INI-style AWS file.
fn parse_ini_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    out
}

/// The region: explicit (the sink's `region`), then `AWS_REGION`, `AWS_DEFAULT_REGION`, the
/// profile's `region`, then us-east-1.
pub fn region(explicit: Option<&str>) -> String {
    explicit
        .map(str::to_string)
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| shared_profile().remove("region"))
        .unwrap_or_else(|| DEFAULT_REGION.to_string())
}

/// The endpoint of `service` (`s3`, `glue`, `athena`): `AWS_ENDPOINT_URL_<SERVICE>`, then
/// `AWS_ENDPOINT_URL`, then the profile's `endpoint_url`; `None` means AWS itself.
pub fn endpoint(service: &str) -> Option<String> {
    env(&format!(
        "AWS_ENDPOINT_URL_{}",
        service.to_ascii_uppercase()
    ))
    .or_else(|| env("AWS_ENDPOINT_URL"))
    .or_else(|| shared_profile().remove("endpoint_url"))
    .map(|e| e.trim_end_matches('/').to_string())
}

/// A builder with the `AWS_*` settings of the environment, as object_store's own
/// `from_env`, except that an empty variable counts as unset (as the AWS CLI has it; an
/// empty endpoint would otherwise be taken for a URL).
fn from_env() -> AmazonS3Builder {
    let mut builder = AmazonS3Builder::new();
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else {
            continue;
        };
        if !key.starts_with("AWS_") || value.is_empty() {
            continue;
        }
        if let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            builder = builder.with_config(config_key, value);
        }
    }
    builder
}

/// An S3 client for `bucket` with the standard credential chain.
pub fn s3_store(bucket: &str, region_name: Option<&str>) -> Result<AmazonS3> {
    s3_store_with(bucket, region_name, &S3Settings::default())
}

/// What a catalog says about the storage of its tables (Iceberg's `s3.*` FileIO
/// properties): each set field replaces the standard chain's.
#[derive(Debug, Clone, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// `s3.path-style-access`; `None` keeps the default (path style).
    pub path_style: Option<bool>,
    /// Credentials given with the table (vended, or static keys in the sink's properties).
    pub credentials: Option<object_store::aws::AwsCredentialProvider>,
}

/// An S3 client for `bucket` with the standard chain, except where `settings` says otherwise.
pub fn s3_store_with(
    bucket: &str,
    region_name: Option<&str>,
    settings: &S3Settings,
) -> Result<AmazonS3> {
    let mut builder = from_env().with_bucket_name(bucket);
    if let Some(credentials) = &settings.credentials {
        builder = builder.with_credentials(credentials.clone());
    }
    let chain_in_env = settings.credentials.is_some()
        || env("AWS_ACCESS_KEY_ID").is_some()
        || env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some()
        || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some();
    if !chain_in_env {
        let profile = shared_profile();
        if let Some(p) = [
            "source_profile",
            "credential_process",
            "sso_session",
            "sso_start_url",
        ]
        .iter()
        .find(|k| profile.contains_key(**k))
        {
            return Err(Error::config(format!(
                "AWS profile `{}` uses `{p}`, which skipprd does not resolve; export its credentials into the environment (`eval \"$(aws configure export-credentials --format env)\"`) or use static keys, web identity or an instance/task role",
                env("AWS_PROFILE").unwrap_or_else(|| "default".into())
            )));
        }
        for (file_key, key) in [
            ("aws_access_key_id", AmazonS3ConfigKey::AccessKeyId),
            ("aws_secret_access_key", AmazonS3ConfigKey::SecretAccessKey),
            ("aws_session_token", AmazonS3ConfigKey::Token),
            ("role_arn", AmazonS3ConfigKey::RoleArn),
            (
                "web_identity_token_file",
                AmazonS3ConfigKey::WebIdentityTokenFile,
            ),
        ] {
            if let Some(v) = profile.get(file_key) {
                builder = builder.with_config(key, v.clone());
            }
        }
    }
    builder = builder.with_region(
        settings
            .region
            .clone()
            .unwrap_or_else(|| region(region_name)),
    );
    if let Some(path_style) = settings.path_style {
        builder = builder.with_virtual_hosted_style_request(!path_style);
    }
    let endpoint = settings.endpoint.clone().or_else(|| endpoint("s3"));
    if let Some(e) = &endpoint {
        builder = builder.with_endpoint(e.clone());
    }
    // Plain HTTP only when the endpoint itself says so (a local stand-in such as moto).
    builder = builder.with_allow_http(
        endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://")),
    );
    builder.build().map_err(|e| {
        Error::config(format!(
            "cannot set up S3 access to bucket `{bucket}`; check AWS_REGION, AWS_ENDPOINT_URL and the credentials"
        ))
        .with_source(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_ini_section() {
        let text = "[default]\nregion = eu-west-1\n\n[profile dev]\n# comment\naws_access_key_id=AK\nregion= us-east-2\n";
        assert_eq!(
            parse_ini_section(text, "profile dev"),
            vec![
                ("aws_access_key_id".to_string(), "AK".to_string()),
                ("region".to_string(), "us-east-2".to_string())
            ]
        );
        assert_eq!(
            parse_ini_section(text, "default"),
            vec![("region".to_string(), "eu-west-1".to_string())]
        );
        assert!(parse_ini_section(text, "missing").is_empty());
    }
}
