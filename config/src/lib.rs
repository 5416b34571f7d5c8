//! `sweety-config`: the typed configuration shared by the Sweety controller and dataplane.
//!
//! This crate is the contract between the two halves of Sweety. The controller renders a
//! [`Config`] from Kubernetes objects and pushes it to the dataplane; the standalone dataplane
//! reads the very same schema from a YAML or JSON file. It deliberately depends on nothing
//! from kube, hyper or tokio, so both sides (and tests) can use it cheaply.
//!
//! * [`Config`] and its parts describe listeners, TLS, virtual hosts, routes, backends and limits.
//! * [`Config::from_yaml`] / [`Config::from_json`] parse, [`Config::validate`] reports *every*
//!   error with its path (`listeners[1].tls.certificates[0].cert: file not found`), and
//!   [`Config::validate_structure`] does the same without touching the filesystem.
//! * `docs/config.md` is the field-by-field reference.
//! * [`Duration`] is a human-friendly duration (`"250ms"`, `"5s"`, `"2m"`).
//! * [`wire`] encodes and decodes the frames of the controller → dataplane control protocol.

mod content;
pub mod delta;
mod duration;
pub mod error_pages;
pub mod ext_auth;
pub mod htpasswd;
mod model;
mod traffic;
mod validate;
pub mod wire;

pub use content::*;
pub use duration::Duration;
pub use error_pages::ErrorPages;
pub use ext_auth::ExternalAuth;
pub use htpasswd::{BasicAuth, BasicAuthUser, UserSet};
pub use model::*;
pub use traffic::*;
pub use validate::{
    check_error_page, check_hostname, check_pem, check_substitution, PemKind, ValidationError,
    ValidationErrors, MAX_VERIFY_DEPTH,
};

/// Current schema version. A config with another `version` is rejected by validation.
pub const SCHEMA_VERSION: u32 = 1;

/// Errors from parsing a config document or a control-protocol frame ([`wire`]).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The YAML document is malformed or does not match the schema.
    #[error("invalid YAML config: {0}")]
    Yaml(#[source] serde_yaml::Error),
    /// The JSON document is malformed or does not match the schema.
    #[error("invalid JSON config: {0}")]
    Json(#[source] serde_json::Error),
    /// A control frame does not start with the protocol magic.
    #[error("not a Sweety control frame (magic {0:02x?})")]
    FrameMagic([u8; 2]),
    /// A control frame of another protocol version.
    #[error("unsupported control protocol version {0} (this side speaks {speaks})", speaks = wire::PROTOCOL_VERSION)]
    FrameVersion(u8),
    /// A control frame of an unknown type.
    #[error("unknown control frame type {0}")]
    FrameType(u8),
    /// A control frame larger than the limit.
    #[error("control frame too large: {len} bytes (limit {max})")]
    FrameTooLarge {
        /// Announced payload length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// A control frame payload shorter than its fixed part.
    #[error("truncated {kind} payload ({len} bytes)")]
    FrameTruncated {
        /// Frame type.
        kind: &'static str,
        /// Payload length.
        len: usize,
    },
    /// A control frame payload that is not the expected JSON.
    #[error("invalid {kind} payload: {source}")]
    FramePayload {
        /// Frame type.
        kind: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
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

    /// A stable content hash, ignoring `generation`: the hex SHA-256 over the SHA-256 of the
    /// settings and of each listener, virtual host and backend ([`delta::Digests::hash`]), so
    /// that it can be updated for a changed item without serializing the whole config.
    ///
    /// Two configs that would serve the same way hash the same, so the controller can skip
    /// pushes that change nothing and the dataplane can report what it runs.
    pub fn content_hash(&self) -> String {
        delta::Digests::of(self).hash()
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 15)]));
    }
    hex
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::full;

    #[test]
    fn yaml_round_trip_of_full_config() {
        let config = full();
        let yaml = config.to_yaml();
        let again = Config::from_yaml(&yaml).unwrap();
        assert_eq!(again, config);
        assert_eq!(again.to_yaml(), yaml, "serialising is stable");
        // Enums are written as single-key maps, not YAML tags.
        assert!(!yaml.contains('!'), "{yaml}");
        assert!(yaml.contains("proxy:\n"), "{yaml}");
    }

    #[test]
    fn json_round_trip_of_full_config() {
        let config = full();
        let json = config.to_json();
        assert_eq!(Config::from_json(&json).unwrap(), config);
        // JSON is YAML: the YAML reader takes the JSON form as well.
        let text = String::from_utf8(json).unwrap();
        assert_eq!(Config::from_yaml(&text).unwrap(), config);
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::from_yaml("listeners: [{name: web, port: 80, protocol: http}]").unwrap();
        assert_eq!(c.version, SCHEMA_VERSION);
        assert_eq!(c.listeners[0].address, "0.0.0.0");
        assert!(c.listeners[0].http3);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.access_log, AccessLog::default());
        assert_eq!(c.admin, None);
        c.validate().unwrap();
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_location() {
        let yaml = "listeners:\n  - name: web\n    port: 80\n    protocol: http\n    prot: x\n";
        let err = Config::from_yaml(yaml).unwrap_err().to_string();
        assert!(err.starts_with("invalid YAML config: "), "{err}");
        assert!(err.contains("unknown field `prot`"), "{err}");
        assert!(err.contains("listeners[0]"), "{err}");
        assert!(err.contains("line 5"), "{err}");

        let json = br#"{"listeners": [], "backend": []}"#;
        let err = Config::from_json(json).unwrap_err().to_string();
        assert!(err.starts_with("invalid JSON config: "), "{err}");
        assert!(err.contains("unknown field `backend`"), "{err}");

        let nested = "virtual_hosts:\n  - name: a\n    routes:\n      - name: r\n        \
                      action: {fixed: {status: 200, bdy: x}}\n";
        let err = Config::from_yaml(nested).unwrap_err().to_string();
        assert!(err.contains("unknown field `bdy`"), "{err}");
    }

    #[test]
    fn tls_min_version_accepts_quoted_and_unquoted() {
        for (text, want) in [
            ("\"1.3\"", TlsVersion::Tls13),
            ("1.3", TlsVersion::Tls13),
            ("1.2", TlsVersion::Tls12),
        ] {
            let yaml = format!(
                "listeners:\n  - name: a\n    port: 443\n    protocol: https\n    tls:\n      \
                 min_version: {text}\n      certificates: []\n"
            );
            let c = Config::from_yaml(&yaml).unwrap();
            assert_eq!(
                c.listeners[0].tls.as_ref().unwrap().min_version,
                want,
                "{text}"
            );
        }
        let bad = "listeners: [{name: a, port: 443, protocol: https, tls: {min_version: 1.1, certificates: []}}]";
        let err = Config::from_yaml(bad).unwrap_err().to_string();
        assert!(err.contains("TLS version"), "{err}");
    }

    #[test]
    fn content_hash_ignores_generation_only() {
        let a = full();
        let hash = a.content_hash();
        assert_eq!(hash.len(), 64);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));

        let mut b = a.clone();
        b.generation += 100;
        assert_eq!(b.content_hash(), hash);

        let mut c = a.clone();
        c.listeners[0].port += 1;
        assert_ne!(c.content_hash(), hash);

        let mut d = a.clone();
        d.limits.max_connections -= 1;
        assert_ne!(d.content_hash(), hash);
    }
}
