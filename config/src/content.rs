//! Config types of content handling: response compression, the response cache and gRPC
//! options (`compress`, `cache` and `grpc` route filters), and the process-wide cache store
//! bounds (`cache` at the top level). Everything here is off unless configured.

use crate::Duration;
use serde::{Deserialize, Serialize};

use crate::model::{default_true, is_false, is_true};

/// A content coding Sweety can compress responses with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompressionAlgorithm {
    /// `gzip` (RFC 1952).
    Gzip,
    /// `br` (RFC 7932).
    #[serde(rename = "br")]
    Brotli,
    /// `zstd` (RFC 8878).
    Zstd,
}

impl CompressionAlgorithm {
    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            CompressionAlgorithm::Gzip => "gzip",
            CompressionAlgorithm::Brotli => "br",
            CompressionAlgorithm::Zstd => "zstd",
        }
    }
}

fn default_algorithms() -> Vec<CompressionAlgorithm> {
    vec![
        CompressionAlgorithm::Zstd,
        CompressionAlgorithm::Brotli,
        CompressionAlgorithm::Gzip,
    ]
}
fn is_default_algorithms(v: &[CompressionAlgorithm]) -> bool {
    v == default_algorithms().as_slice()
}
fn default_min_size() -> u64 {
    256
}
fn is_default_min_size(n: &u64) -> bool {
    *n == default_min_size()
}
/// The MIME types compressed when `mime_types` is not set.
pub const DEFAULT_COMPRESSIBLE_TYPES: &[&str] = &[
    "text/*",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/wasm",
    "application/manifest+json",
    "application/ld+json",
    "image/svg+xml",
    "application/grpc-web-text",
];
fn default_mime_types() -> Vec<String> {
    DEFAULT_COMPRESSIBLE_TYPES
        .iter()
        .map(|s| s.to_string())
        .collect()
}
fn is_default_mime_types(v: &[String]) -> bool {
    v.iter()
        .map(String::as_str)
        .eq(DEFAULT_COMPRESSIBLE_TYPES.iter().copied())
}

/// Response compression of a route (`compress` filter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compression {
    /// On (default) or off; `false` turns compression off for this route.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// Codings offered, in server preference (used when the client's q-values tie).
    /// Default `[zstd, br, gzip]`.
    #[serde(
        default = "default_algorithms",
        skip_serializing_if = "is_default_algorithms"
    )]
    pub algorithms: Vec<CompressionAlgorithm>,
    /// Responses with a smaller known `Content-Length` are sent as is. Default 256 bytes.
    #[serde(
        default = "default_min_size",
        skip_serializing_if = "is_default_min_size"
    )]
    pub min_size: u64,
    /// Media types compressed: `type/subtype` or `type/*`. Default: text, JSON, JS, XML,
    /// SVG, WASM and gRPC-Web text.
    #[serde(
        default = "default_mime_types",
        skip_serializing_if = "is_default_mime_types"
    )]
    pub mime_types: Vec<String>,
}

impl Default for Compression {
    fn default() -> Self {
        Compression {
            enabled: true,
            algorithms: default_algorithms(),
            min_size: default_min_size(),
            mime_types: default_mime_types(),
        }
    }
}

/// Response caching of a route (`cache` filter). Only GET and HEAD are cached.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePolicy {
    /// Freshness lifetime used instead of the response's `Cache-Control`/`Expires`.
    /// `no-store` and `private` responses are never stored, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// Request headers added to the cache key (besides method, host, path and query).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_headers: Vec<String>,
    /// How long a stale entry may still be served (`X-Cache: STALE`) while one background
    /// request refreshes it. The response's own `stale-while-revalidate` wins when larger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_while_revalidate: Option<Duration>,
    /// Serve and store requests carrying `Cookie` or `Authorization` from the shared cache
    /// (off: such requests bypass it). Responses with `Set-Cookie` or `private` are never
    /// stored either way.
    #[serde(default, skip_serializing_if = "crate::model::is_false")]
    pub with_credentials: bool,
}

/// gRPC options of a route (`grpc` filter). Errors for gRPC requests are always answered
/// in gRPC form; this only adds gRPC-Web translation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcOptions {
    /// Translate `application/grpc-web` and `application/grpc-web-text` requests to gRPC
    /// for the backend, and the responses (trailers in the body) back.
    #[serde(default, skip_serializing_if = "is_false")]
    pub web: bool,
}

fn default_cache_max_bytes() -> u64 {
    256 * 1024 * 1024
}
fn default_cache_max_entry_bytes() -> u64 {
    8 * 1024 * 1024
}

/// Bounds of the in-memory response cache shared by every route with a `cache` filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSettings {
    /// Total bytes of cached responses (bodies and headers); least recently used entries are
    /// evicted past it. Default 256 MiB.
    pub max_bytes: u64,
    /// Larger responses are passed through uncached. Default 8 MiB.
    pub max_entry_bytes: u64,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings {
            max_bytes: default_cache_max_bytes(),
            max_entry_bytes: default_cache_max_entry_bytes(),
        }
    }
}

impl CacheSettings {
    /// True when every field has its default (it is then left out of serialized configs).
    pub fn is_default(&self) -> bool {
        *self == CacheSettings::default()
    }
}

/// Default `limits.websocket_idle_timeout`.
pub fn default_websocket_idle_timeout() -> Duration {
    Duration::from_secs(300)
}

/// The default `limits.static_read_ahead`, bytes.
pub const DEFAULT_STATIC_READ_AHEAD: u32 = 128 * 1024;
/// Smallest `limits.static_read_ahead` (a stream past a full budget reads this much anyway).
pub const MIN_STATIC_READ_AHEAD: u32 = 16 * 1024;

/// True for the default `limits.static_read_ahead` (left out of serialized configs).
pub fn is_default_static_read_ahead(n: &u32) -> bool {
    *n == DEFAULT_STATIC_READ_AHEAD
}

/// The default `limits.static_read_ahead_total`, bytes: 128 connections' full
/// `static_read_ahead` at its default.
pub const DEFAULT_STATIC_READ_AHEAD_TOTAL: u64 = 16 * 1024 * 1024;
/// Largest `limits.static_read_ahead_total` (16 GiB).
pub const MAX_STATIC_READ_AHEAD_TOTAL: u64 = 16 * 1024 * 1024 * 1024;

/// True for the default `limits.static_read_ahead_total` (left out of serialized configs).
pub fn is_default_static_read_ahead_total(n: &u64) -> bool {
    *n == DEFAULT_STATIC_READ_AHEAD_TOTAL
}

/// The default `limits.proxy_read_ahead`, bytes (one HTTP/2 DATA frame of the default size).
pub const DEFAULT_PROXY_READ_AHEAD: u32 = 16 * 1024;
/// Smallest `limits.proxy_read_ahead` (hyper's smallest HTTP/1.1 read buffer).
pub const MIN_PROXY_READ_AHEAD: u32 = 8 * 1024;
/// Largest `limits.proxy_read_ahead`, also the largest `limits.static_read_ahead`.
pub const MAX_READ_AHEAD: u32 = 16 * 1024 * 1024;

/// The default `limits.http2_write_buffer`, bytes.
pub const DEFAULT_HTTP2_WRITE_BUFFER: u32 = 32 * 1024;
/// Smallest `limits.http2_write_buffer` (one DATA frame of the default size).
pub const MIN_HTTP2_WRITE_BUFFER: u32 = 16 * 1024;
/// Largest `limits.http2_write_buffer`.
pub const MAX_HTTP2_WRITE_BUFFER: u32 = 1024 * 1024;

/// True for the default `limits.http2_write_buffer` (left out of serialized configs).
pub fn is_default_http2_write_buffer(n: &u32) -> bool {
    *n == DEFAULT_HTTP2_WRITE_BUFFER
}

/// True for the default `limits.proxy_read_ahead` (left out of serialized configs).
pub fn is_default_proxy_read_ahead(n: &u32) -> bool {
    *n == DEFAULT_PROXY_READ_AHEAD
}

/// True for the default WebSocket idle timeout (left out of serialized configs).
pub fn is_default_websocket_idle_timeout(d: &Duration) -> bool {
    *d == default_websocket_idle_timeout()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_to_nothing() {
        let c: Compression = serde_json::from_str("{}").unwrap();
        assert_eq!(c, Compression::default());
        assert_eq!(serde_json::to_string(&c).unwrap(), "{}");
        let c: Compression =
            serde_json::from_str(r#"{"algorithms":["gzip","br"],"min_size":10}"#).unwrap();
        assert_eq!(
            c.algorithms,
            vec![CompressionAlgorithm::Gzip, CompressionAlgorithm::Brotli]
        );
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"algorithms":["gzip","br"],"min_size":10}"#
        );
        assert!(CacheSettings::default().is_default());
        assert!(serde_json::from_str::<Compression>(r#"{"level":3}"#).is_err());
    }
}
