//! `sweety-config`: the typed configuration shared by the Sweety controller and dataplane.
//!
//! This crate is the contract between the two halves of Sweety. The controller renders a
//! [`Config`] from Kubernetes objects and pushes it to the dataplane; the standalone dataplane
//! reads the very same schema from a YAML or JSON file. It deliberately depends on nothing
//! from kube, hyper or tokio, so both sides (and tests) can use it cheaply.
//!
//! * [`Config`] and its parts describe listeners, TLS, virtual hosts, routes, backends and limits.
//! * [`Config::from_yaml`] / [`Config::from_json`] parse, [`Config::validate`] reports *every*
//!   error with its path (`listeners[1].tls.certificates[0].cert: file not found`).
//! * [`Duration`] is a human-friendly duration (`"250ms"`, `"5s"`, `"2m"`).

mod duration;
mod model;
mod validate;

pub use duration::Duration;
pub use model::*;
pub use validate::{ValidationError, ValidationErrors};

/// Current schema version. A config with another `version` is rejected by validation.
pub const SCHEMA_VERSION: u32 = 1;

/// Errors from parsing a config document.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The YAML document is malformed or does not match the schema.
    #[error("invalid YAML config: {0}")]
    Yaml(#[source] serde_yaml::Error),
    /// The JSON document is malformed or does not match the schema.
    #[error("invalid JSON config: {0}")]
    Json(#[source] serde_json::Error),
}

impl Config {
    /// Parses a YAML document (JSON is valid YAML, so this also accepts JSON).
    ///
    /// Enum values with data are written as single-key maps (`action: {proxy: {...}}`,
    /// `cert: {file: /etc/tls/a.crt}`), exactly like the JSON form, rather than with YAML tags.
    pub fn from_yaml(text: &str) -> Result<Config, ParseError> {
        serde_yaml::with::singleton_map_recursive::deserialize(serde_yaml::Deserializer::from_str(
            text,
        ))
        .map_err(ParseError::Yaml)
    }

    /// Parses a JSON document.
    pub fn from_json(text: &[u8]) -> Result<Config, ParseError> {
        serde_json::from_slice(text).map_err(ParseError::Json)
    }

    /// Serialises to YAML, writing enums as single-key maps (the form [`Config::from_yaml`]
    /// reads and the JSON form uses).
    pub fn to_yaml(&self) -> String {
        let mut out = Vec::new();
        let mut ser = serde_yaml::Serializer::new(&mut out);
        serde_yaml::with::singleton_map_recursive::serialize(self, &mut ser)
            .expect("config always serialises");
        String::from_utf8(out).expect("YAML output is UTF-8")
    }

    /// Serialises to compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("config always serialises")
    }

    /// A stable content hash (hex SHA-256 of the canonical JSON), ignoring `generation`.
    ///
    /// Two configs that would serve the same way hash the same, so the controller can skip
    /// pushes that change nothing and the dataplane can report what it runs.
    pub fn content_hash(&self) -> String {
        use sha2::Digest;
        let mut copy = self.clone();
        copy.generation = 0;
        let digest = sha2::Sha256::digest(copy.to_json());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}
