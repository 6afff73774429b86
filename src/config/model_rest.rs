//! The `skippr.yml` model, the sinks behind an Iceberg REST catalog (`RestIceberg` and the
//! AWS shortcuts `S3TablesIceberg` and `GlueRestIceberg`), re-exported by `model`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Iceberg behind a catalog that speaks the Iceberg REST protocol. Its `Debug` leaves out
/// the secrets (`credential`, `token`, and property values that hold keys or tokens).
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RestIcebergSink {
    /// The catalog's base URI as its docs give it; requests go to `<uri>/v1/...`.
    pub uri: String,
    /// The warehouse as the catalog names it (a name or a location).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warehouse: Option<String>,
    /// OAuth2 client credentials, `<client id>:<client secret>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// A bearer token, instead of client credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The OAuth2 scope asked for with client credentials (default `catalog`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Sign requests with AWS SigV4 (the AWS endpoints of S3 Tables and Glue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigv4: Option<Sigv4>,
    /// Catalog and storage properties (`s3.endpoint`, `s3.path-style-access`, ...). A value
    /// written as a YAML boolean or number is taken as its text (`true`, `9000`).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "property_values"
    )]
    pub properties: BTreeMap<String, String>,
}

impl RestIcebergSink {
    /// Whether the property `key` holds a secret (an access key, a token, a password).
    pub fn is_secret_property(key: &str) -> bool {
        let k = key.to_ascii_lowercase();
        ["secret", "token", "password", "credential", "key"]
            .iter()
            .any(|w| k.contains(w))
    }
}

impl std::fmt::Debug for RestIcebergSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let shown = if Self::is_secret_property(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("RestIcebergSink")
            .field("uri", &self.uri)
            .field("warehouse", &self.warehouse)
            .field("credential", &hidden(&self.credential))
            .field("token", &hidden(&self.token))
            .field("scope", &self.scope)
            .field("sigv4", &self.sigv4)
            .field("properties", &properties)
            .finish()
    }
}

/// `properties`: text values; a boolean or number is taken as it is written.
fn property_values<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct Text(String);
    impl<'de> Deserialize<'de> for Text {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Text;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a text value (a string, a boolean or a number)")
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
            }
            deserializer.deserialize_any(V)
        }
    }
    let map = BTreeMap::<String, Text>::deserialize(deserializer)?;
    Ok(map.into_iter().map(|(k, v)| (k, v.0)).collect())
}

/// AWS SigV4 signing of REST catalog requests.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sigv4 {
    pub region: String,
    /// The signing name: `s3tables` or `glue`.
    pub service: String,
}

/// An S3 table bucket through the S3 Tables Iceberg REST endpoint.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct S3TablesIcebergSink {
    /// `arn:aws:s3tables:<region>:<account>:bucket/<name>`.
    pub table_bucket_arn: String,
    pub region: String,
}

/// A Glue database through Glue's Iceberg REST endpoint.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GlueRestIcebergSink {
    pub glue_database_name: String,
    pub region: String,
}

impl S3TablesIcebergSink {
    /// The REST catalog this names.
    pub fn rest(&self) -> RestIcebergSink {
        RestIcebergSink {
            uri: format!("https://s3tables.{}.amazonaws.com/iceberg", self.region),
            warehouse: Some(self.table_bucket_arn.clone()),
            credential: None,
            token: None,
            scope: None,
            sigv4: Some(Sigv4 {
                region: self.region.clone(),
                service: "s3tables".into(),
            }),
            properties: BTreeMap::new(),
        }
    }
}

impl GlueRestIcebergSink {
    /// The REST catalog this names (the account's default Glue catalog).
    pub fn rest(&self) -> RestIcebergSink {
        RestIcebergSink {
            uri: format!("https://glue.{}.amazonaws.com/iceberg", self.region),
            warehouse: None,
            credential: None,
            token: None,
            scope: None,
            sigv4: Some(Sigv4 {
                region: self.region.clone(),
                service: "glue".into(),
            }),
            properties: BTreeMap::new(),
        }
    }
}
