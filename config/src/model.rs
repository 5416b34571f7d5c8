//! The config data model: listeners, TLS, virtual hosts, routes, filters, backends, limits.
//!
//! Field names are `snake_case` in YAML/JSON. Every struct rejects unknown fields so a typo is
//! an error rather than a silently ignored setting. Defaults are chosen for a production edge.

use crate::traffic::{
    ClientIp, HashPolicy, HealthCheck, IpAccess, L4Settings, RateLimit, SessionPersistence,
};
use crate::Duration;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub(crate) fn default_true() -> bool {
    true
}
pub(crate) fn is_true(b: &bool) -> bool {
    *b
}
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}
fn default_weight() -> u32 {
    1
}
fn is_default_weight(w: &u32) -> bool {
    *w == 1
}

/// The whole dataplane configuration: one immutable snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Schema version; must equal [`crate::SCHEMA_VERSION`].
    #[serde(default = "schema_version")]
    pub version: u32,
    /// Monotonically increasing generation, set by whoever produces the config.
    #[serde(default)]
    pub generation: u64,
    /// Sockets to serve on.
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// Hostname groups of routes, attached to listeners.
    #[serde(default)]
    pub virtual_hosts: Vec<VirtualHost>,
    /// Named upstream backends that routes forward to.
    #[serde(default)]
    pub backends: Vec<Backend>,
    /// Resource limits of the backpressure core.
    #[serde(default)]
    pub limits: Limits,
    /// HTTP/3 (QUIC) settings of every HTTPS listener with `http3` on.
    #[serde(default)]
    pub http3: Http3,
    /// The admin listener (health, readiness, metrics, config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<Admin>,
    /// Access log settings.
    #[serde(default)]
    pub access_log: AccessLog,
    /// Where the real client address comes from (trusted proxies, PROXY protocol).
    #[serde(default, skip_serializing_if = "ClientIp::is_default")]
    pub client_ip: ClientIp,
    /// Settings of the layer-4 (`tcp`, `udp`, `tls_passthrough`, `tls`) listeners.
    #[serde(default, skip_serializing_if = "L4Settings::is_default")]
    pub l4: L4Settings,
    /// Bounds of the in-memory response cache (used by routes with a `cache` filter).
    #[serde(default, skip_serializing_if = "crate::CacheSettings::is_default")]
    pub cache: crate::CacheSettings,
    /// How request paths are normalised before routing (default: on, encoded slashes refused).
    #[serde(default, skip_serializing_if = "crate::PathNormalization::is_default")]
    pub path_normalization: crate::PathNormalization,
    /// OpenTelemetry tracing (W3C trace context, spans exported over OTLP/HTTP); none: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Tracing>,
    /// Named user lists that `basic_auth` filters name by `user_set` instead of listing their
    /// users: one copy of an htpasswd file shared by every rule it guards.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_sets: Vec<crate::htpasswd::UserSet>,
}

fn schema_version() -> u32 {
    crate::SCHEMA_VERSION
}

impl Default for Config {
    fn default() -> Self {
        Config {
            version: crate::SCHEMA_VERSION,
            generation: 0,
            listeners: Vec::new(),
            virtual_hosts: Vec::new(),
            backends: Vec::new(),
            limits: Limits::default(),
            http3: Http3::default(),
            admin: None,
            access_log: AccessLog::default(),
            client_ip: ClientIp::default(),
            l4: L4Settings::default(),
            cache: crate::CacheSettings::default(),
            path_normalization: crate::PathNormalization::default(),
            tracing: None,
            user_sets: Vec::new(),
        }
    }
}

/// Wire protocol a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerProtocol {
    /// Plain TCP carrying HTTP/1.1 and h2c (prior knowledge).
    Http,
    /// TLS terminated here, ALPN h2 and http/1.1 (and HTTP/3 on UDP when `http3` is on).
    Https,
    /// TLS passed through to a backend chosen by SNI, not terminated.
    TlsPassthrough,
    /// TLS routed by SNI, per route: passed through unterminated like `tls_passthrough`, or
    /// (routes with `terminate: true`) terminated here with the listener's certificates and
    /// the decrypted bytes forwarded to the backend over plain TCP. Both kinds may share one
    /// listener (Gateway API TLSRoute modes Terminate and Mixed).
    Tls,
    /// Raw TCP proxy.
    Tcp,
    /// Raw UDP proxy.
    Udp,
}

impl ListenerProtocol {
    /// Layer-4 listeners (`tcp`, `udp`, `tls_passthrough`, `tls`): they forward by
    /// `l4_routes`, not virtual hosts.
    pub fn is_l4(self) -> bool {
        matches!(
            self,
            ListenerProtocol::Tcp
                | ListenerProtocol::Udp
                | ListenerProtocol::TlsPassthrough
                | ListenerProtocol::Tls
        )
    }
}

/// One socket to serve on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    /// Unique name; virtual hosts attach to listeners by name.
    pub name: String,
    /// IP address to bind (`0.0.0.0`, `::`, `127.0.0.1`…).
    #[serde(default = "default_address")]
    pub address: String,
    /// TCP (and for HTTP/3, UDP) port. 0 asks the OS for a free port (used by tests).
    pub port: u16,
    /// Wire protocol.
    pub protocol: ListenerProtocol,
    /// TLS settings; required for `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Serve HTTP/3 on UDP on the same port (HTTPS only; on by default).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub http3: bool,
    /// Per-listener cap of requests in flight (in addition to the global one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_in_flight: Option<u32>,
    /// Port clients reach this listener on (e.g. a Service's port in front of a container
    /// port), advertised in `Alt-Svc` instead of `port` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertised_port: Option<u16>,
    /// For `tcp`/`udp`/`tls_passthrough`/`tls` listeners: where to forward. Empty: the
    /// listener still binds its port, and closes every connection (drops every datagram)
    /// it gets, as for a connection that matches no route. On an `https` listener: its
    /// passthrough hosts (each route names at least one), whose TLS connections are passed
    /// through unterminated by SNI as on `tls_passthrough`; any other connection is served
    /// here as before. HTTP/3 refuses those names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub l4_routes: Vec<L4Route>,
}

fn default_address() -> String {
    "0.0.0.0".to_string()
}

/// A layer-4 forwarding rule (TCP, UDP, or TLS passthrough by SNI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L4Route {
    /// Name for metrics and logs.
    pub name: String,
    /// SNI hostnames (`tls_passthrough`, `tls` and `https` only; exact or `*.` wildcard).
    /// Empty matches any (not on `https`, where at least one is required).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// `tls` listeners only: terminate TLS here (with the listener's certificates) and forward
    /// the plaintext, instead of passing the TLS bytes through.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminate: bool,
    /// Weighted backend references.
    pub backends: Vec<WeightedBackend>,
}

/// TLS settings of an HTTPS listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// Certificates; one is chosen per handshake by SNI.
    pub certificates: Vec<Certificate>,
    /// Lowest TLS version accepted.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// Ask clients for a certificate and verify it (mutual TLS), as for a Gateway's
    /// `spec.tls.frontend` validation. None: no client certificate is requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,
    /// Client certificates per host (ingress-nginx `auth-tls-*`): a client whose TLS server
    /// name (SNI) falls under an entry's `hostnames` is asked for a certificate at the
    /// handshake, and every request whose Host falls under an entry is checked against it
    /// (421 when the connection's SNI is not under the same entry). Not with `client_auth`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_client_auth: Vec<HostClientAuth>,
}

/// Client certificate verification for some hosts of an HTTPS listener (see
/// [`ListenerTls::host_client_auth`]). The certificate is requested at the handshake only when
/// the SNI names one of `hostnames`, and verified per request, for the request's Host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostClientAuth {
    /// The hosts (exact or `*.` wildcard) this applies to; no name in two entries.
    pub hostnames: Vec<String>,
    /// CA bundle (one or more PEM certificates) client certificates must chain to.
    pub ca: PemSource,
    /// What a request without a valid certificate gets.
    #[serde(default)]
    pub verify: HostVerify,
    /// The longest chain accepted: client certificate plus intermediates (1: issued by a
    /// certificate of `ca` directly, as nginx's default `ssl_verify_depth 1`).
    #[serde(default = "default_verify_depth")]
    pub verify_depth: u8,
    /// Send the client certificate to the backend, URL-escaped PEM, in `ssl-client-cert`.
    /// `ssl-client-verify`, `ssl-client-subject-dn` and `ssl-client-issuer-dn` are always
    /// sent; a client's own copies of these four headers are always removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_certificate: bool,
    /// Redirect (302) here instead of answering 400 when the certificate is missing (in
    /// `require`) or does not verify: an absolute `http`/`https` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_page: Option<String>,
    /// A regex the subject DN (RFC 2253, e.g. `CN=client,O=Example`) must match somewhere
    /// (ingress-nginx `auth-tls-match-cn`); else 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_subject: Option<String>,
}

fn default_verify_depth() -> u8 {
    1
}

/// How [`HostClientAuth`] treats a request's client certificate (nginx `ssl_verify_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostVerify {
    /// A certificate that chains to the CA is required: 400 without one or with one that
    /// does not verify (nginx `on`).
    #[default]
    Require,
    /// Requested and verified when sent; a request without one is served (nginx `optional`).
    Optional,
    /// Requested, not verified; passed on with `ssl-client-verify` saying what verification
    /// found (nginx `optional_no_ca`).
    OptionalNoCa,
}

/// Client certificate verification on an HTTPS listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuth {
    /// CA bundle (one or more PEM certificates) client certificates must chain to.
    pub ca: PemSource,
    /// What happens to a client without a valid certificate.
    #[serde(default, skip_serializing_if = "is_default_client_auth_mode")]
    pub mode: ClientAuthMode,
}

fn is_default_client_auth_mode(m: &ClientAuthMode) -> bool {
    *m == ClientAuthMode::default()
}

/// How strictly [`ClientAuth`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMode {
    /// The handshake fails unless the client presents a certificate that chains to the CA
    /// (Gateway API `AllowValidOnly`).
    #[default]
    Require,
    /// A certificate is requested and checked, but a client without one, or with one that
    /// does not verify, is served anyway (Gateway API `AllowInsecureFallback`; authorization is
    /// left to the backend).
    AllowInsecureFallback,
}

/// TLS protocol version, written `"1.2"` or `"1.3"` (an unquoted YAML `1.3` is accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum TlsVersion {
    /// TLS 1.2 (and 1.3).
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

impl<'de> Deserialize<'de> for TlsVersion {
    // Hand-written so that `min_version: 1.3` (a YAML float) works as well as `"1.3"`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TlsVersion;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("TLS version \"1.2\" or \"1.3\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TlsVersion, E> {
                match v {
                    "1.2" => Ok(TlsVersion::Tls12),
                    "1.3" => Ok(TlsVersion::Tls13),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TlsVersion, E> {
                if v == 1.2 {
                    Ok(TlsVersion::Tls12)
                } else if v == 1.3 {
                    Ok(TlsVersion::Tls13)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A certificate chain and key, selected by SNI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// SNI names this certificate serves (exact or `*.` wildcard). Empty: the names in the
    /// certificate's SANs are used; the first certificate is also the fallback when no name
    /// matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// PEM certificate chain.
    pub cert: PemSource,
    /// PEM private key.
    pub key: PemSource,
}

/// PEM data given inline or by file path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PemSource {
    /// The PEM text itself.
    Pem(String),
    /// A path to a PEM file, read when the config is applied.
    File(PathBuf),
}

/// A group of hostnames and the routes that serve them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualHost {
    /// Unique name, used in metrics and logs.
    pub name: String,
    /// Exact (`example.com`) or wildcard (`*.example.com`) hostnames. Empty matches any host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// Listener names this virtual host is served on. Empty: every HTTP/HTTPS listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<String>,
    /// Routes, in creation order (the last tie-breaker of precedence).
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// One routing rule with Gateway API HTTPRoute semantics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Name for metrics and logs (e.g. `ns/httproute/rule-0`).
    pub name: String,
    /// Any of these matches selects the route. Empty: matches every request (prefix `/`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<RouteMatch>,
    /// Filters applied in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Filter>,
    /// What serves the request. A `redirect` filter makes the action irrelevant.
    pub action: Action,
    /// Timeouts.
    #[serde(default, skip_serializing_if = "Timeouts::is_empty")]
    pub timeouts: Timeouts,
    /// Retry policy for proxied requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// The largest request body this route accepts, bytes, in place of
    /// `limits.max_request_body_bytes` (higher or lower); `0`: no limit (ingress-nginx's
    /// `proxy-body-size: 0`). Past it: 413.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_body_bytes: Option<u64>,
}

/// Conditions a request must meet, all of them (AND).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    /// Path match; none means prefix `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    /// Header matches (case-insensitive names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// Query parameter matches (exact names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<QueryMatch>,
    /// HTTP method (`GET`, `POST`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Cookie matches: the first cookie of that name in the request's `Cookie` fields has
    /// exactly this value (surrounding double quotes aside), as session affinity reads it.
    /// Counted with the header matches for precedence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cookies: Vec<CookieMatch>,
}

/// A cookie match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CookieMatch {
    /// Cookie name (a token), compared exactly.
    pub name: String,
    /// Value, compared exactly.
    pub value: String,
}

/// A path match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PathMatch {
    /// The path equals this value.
    Exact(String),
    /// The path starts with this value on a `/` segment boundary (`/foo` matches `/foo/bar`,
    /// not `/foobar`).
    Prefix(String),
    /// The whole path matches this regular expression (RE2 syntax).
    Regex(String),
}

/// How a string value is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchKind {
    /// Byte-for-byte equality.
    #[default]
    Exact,
    /// Whole-value regular expression.
    Regex,
}

/// A header match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name, case-insensitive.
    pub name: String,
    /// Value to compare.
    pub value: String,
    /// Exact or regex.
    #[serde(default, rename = "type")]
    pub kind: MatchKind,
}

/// A query parameter match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryMatch {
    /// Parameter name, exact.
    pub name: String,
    /// Value to compare.
    pub value: String,
    /// Exact or regex.
    #[serde(default, rename = "type")]
    pub kind: MatchKind,
}

/// A filter applied to matching requests, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Filter {
    /// Modify request headers before the handler.
    RequestHeaders(HeaderModifier),
    /// Modify response headers after the handler.
    ResponseHeaders(HeaderModifier),
    /// Answer with a redirect; the action is not run.
    Redirect(Redirect),
    /// Rewrite host and/or path before the handler.
    Rewrite(UrlRewrite),
    /// Copy the request to another backend, fire-and-forget.
    Mirror(Mirror),
    /// Answer CORS preflights and decorate responses.
    Cors(Cors),
    /// Token-bucket rate limit (429 past it). Checked before the other request filters.
    RateLimit(RateLimit),
    /// IP allow and deny lists (403). Checked before the other request filters.
    IpAccess(IpAccess),
    /// Requests in flight per key at most (429 past it). Checked with the rate limits.
    ConcurrencyLimit(crate::traffic::ConcurrencyLimit),
    /// HTTP Basic authentication (401 without valid credentials). Checked after the IP lists
    /// and limits, before every other request filter.
    BasicAuth(crate::htpasswd::BasicAuth),
    /// External authentication: a subrequest to an auth service decides (401/403/302 or
    /// through, with headers from its answer). Checked after basic authentication, before
    /// every other request filter.
    ExternalAuth(crate::ext_auth::ExternalAuth),
    /// Compress responses (gzip, br, zstd) by the client's Accept-Encoding.
    Compress(crate::Compression),
    /// Cache responses in memory.
    Cache(crate::CachePolicy),
    /// gRPC options (gRPC-Web translation).
    Grpc(crate::GrpcOptions),
    /// Error pages: listed statuses of the action are replaced by a page from another backend
    /// (or the built-in one), which also serves the route while its backends have no endpoint.
    ErrorPages(crate::error_pages::ErrorPages),
}

/// Header edits: set (replace), add (append), remove.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderModifier {
    /// Replace or create these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HeaderValue>,
    /// Append these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HeaderValue>,
    /// Remove these headers (names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderValue {
    /// Header name.
    pub name: String,
    /// Header value.
    pub value: String,
}

/// A redirect reply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    /// `http` or `https`; default: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Host; default: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port; default: derived from the scheme (omitted when it is the scheme's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Path replacement; default: the request's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathRewrite>,
    /// 301, 302, 303, 307 or 308. Default 302.
    #[serde(default = "default_redirect_status")]
    pub status: u16,
}

fn default_redirect_status() -> u16 {
    302
}

/// A path replacement for rewrites and redirects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PathRewrite {
    /// Replace the whole path.
    Full(String),
    /// Replace the part of the path that the route's `prefix` match matched.
    Prefix(String),
    /// When `pattern` (a regex, searched in the path, not anchored) matches, the whole path
    /// becomes `substitution` with `$1`…`$9` replaced by the match's groups (an unmatched
    /// group is empty), as nginx's `rewrite` does; otherwise the path is kept.
    Regex {
        /// RE2 syntax (Rust `regex`).
        pattern: String,
        /// Starts with `/`; `$` only before a digit 1-9.
        substitution: String,
    },
}

/// URL rewrite before the handler runs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlRewrite {
    /// New Host / :authority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// New path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathRewrite>,
}

/// Request mirroring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    /// Backend name to copy to.
    pub backend: String,
    /// Share of requests mirrored, 0–100. Default 100.
    #[serde(default = "default_percent")]
    pub percent: f64,
}

fn default_percent() -> f64 {
    100.0
}

/// CORS policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cors {
    /// Allowed origins: exact, `*`, or with one `*` wildcard in the host (`https://*.example.com`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<String>,
    /// Allowed methods (`*` for any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    /// Allowed request headers (`*` for any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    /// Headers exposed to the page.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    /// Allow credentials.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_credentials: bool,
    /// Preflight cache lifetime in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u64>,
}

/// What serves a matched request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Reverse proxy to weighted backends.
    Proxy(ProxyAction),
    /// Serve files from a directory.
    Static(StaticSite),
    /// A fixed reply.
    Fixed(FixedResponse),
}

/// Reverse proxy to one of several weighted backends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyAction {
    /// Weighted backend references. Weights of 0 disable a backend; all-zero answers 500.
    pub backends: Vec<WeightedBackend>,
}

/// A reference to a named backend with a weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedBackend {
    /// Backend name.
    pub backend: String,
    /// Relative weight. Default 1.
    #[serde(default = "default_weight", skip_serializing_if = "is_default_weight")]
    pub weight: u32,
    /// Filters applied only when this backend is chosen (header modifiers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Filter>,
}

/// A fixed reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedResponse {
    /// Status code.
    pub status: u16,
    /// Body text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// Content type of the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// Static file serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticSite {
    /// Directory to serve from.
    pub root: PathBuf,
    /// Index files tried for a directory. Default `["index.html"]`.
    #[serde(default = "default_index")]
    pub index: Vec<String>,
    /// Candidates tried in order, `$uri` standing for the request path (e.g.
    /// `["$uri", "$uri/", "/index.html"]` for an SPA). Empty: just the path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub try_files: Vec<String>,
    /// Serve `.br`/`.gz` siblings when the client accepts them. Default on.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub precompressed: bool,
    /// `Cache-Control` header value for responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// Strip this prefix from the request path before mapping it to `root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<String>,
    /// Answer 404 for any path with a segment starting with `.` (`.git`, `.env`, `.htpasswd`),
    /// except `.well-known`. Default on.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub hide_dotfiles: bool,
}

fn default_index() -> Vec<String> {
    vec!["index.html".to_string()]
}

/// Route timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Whole request, from headers received to response headers sent (504 after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Duration>,
    /// Each try to a backend (504 after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Duration>,
    /// TCP (and TLS) connect to a backend endpoint, instead of the backend's own
    /// `connect_timeout` (504 after), as nginx's `proxy_connect_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<Duration>,
    /// Longest wait for the backend between two successive reads, as nginx's
    /// `proxy_read_timeout`: from the request sent to the response head (504 after), then
    /// between two chunks of the response body (the response is aborted after: the HTTP/1.1
    /// connection is closed, the HTTP/2 or HTTP/3 stream reset). Time spent waiting for a
    /// slow client does not count. A WebSocket tunnel of the route is closed after no byte
    /// moved either way for this long (instead of `limits.websocket_idle_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_idle: Option<Duration>,
    /// Longest wait for the backend to take the next chunk of the request (head or body), as
    /// nginx's `proxy_send_timeout` (504 after). Time spent waiting for the client's next
    /// chunk does not count (that is `limits.body_idle_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_idle: Option<Duration>,
}

/// The longest `timeouts.connect`, `timeouts.read_idle` or `timeouts.send_idle` a route may
/// set (a day: longer idle streams belong to a WebSocket or gRPC stream policy, not here).
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Timeouts {
    /// True when no timeout is set.
    pub fn is_empty(&self) -> bool {
        *self == Timeouts::default()
    }
}

/// Retry policy. Only idempotent requests (or requests whose body was never sent, on connect
/// errors) are retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Extra attempts after the first.
    pub attempts: u32,
    /// Upstream status codes that trigger a retry (e.g. 502, 503, 504).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    /// Wait between attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
    /// No new try starts once this long has passed since the first began, the backoff before
    /// it counted (ingress-nginx's `proxy-next-upstream-timeout`). Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Duration>,
}

/// Upstream wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendProtocol {
    /// HTTP/1.1 over TCP, keep-alive pooled.
    #[default]
    Http1,
    /// HTTP/2 over TCP with prior knowledge, multiplexed.
    H2c,
    /// HTTP/1.1 over TLS.
    Https,
    /// HTTP/2 over TLS, multiplexed.
    H2,
}

/// Endpoint choice within a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LbPolicy {
    /// Weighted round robin.
    #[default]
    RoundRobin,
    /// Power of two random choices, fewest requests in flight.
    LeastRequest,
}

/// A named upstream: a set of endpoints and how to talk to them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Unique name referenced by routes.
    pub name: String,
    /// Wire protocol.
    #[serde(default)]
    pub protocol: BackendProtocol,
    /// TLS settings for `https`/`h2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTls>,
    /// Endpoint selection.
    #[serde(default)]
    pub lb: LbPolicy,
    /// Endpoints (`ip:port` or `host:port`).
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    /// TCP connect timeout. Default 5s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Passive outlier ejection.
    #[serde(default)]
    pub outlier: OutlierDetection,
    /// The most idle pooled HTTP/1.1 connections kept per endpoint (0: no pooling). Under
    /// it the pool keeps only what recent demand needs: as many as were in use at once at the
    /// peak of the last 10-20 s. Default 1024.
    #[serde(default = "default_pool_idle")]
    pub max_idle_per_endpoint: u32,
    /// Session affinity by cookie or header (takes precedence over `hash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<SessionPersistence>,
    /// Consistent hashing of requests onto endpoints (replaces `lb` when the key is present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<HashPolicy>,
    /// Active health checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Send a PROXY protocol v2 header on each new connection (layer-4 listeners only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub send_proxy_protocol: bool,
    /// The endpoints come from outside the cluster's own addressing (a Kubernetes
    /// ExternalName Service): every address an endpoint resolves to (or is) is refused when it
    /// is loopback, link-local, unspecified, a cloud metadata address or one of the
    /// dataplane's own, so a tenant's name cannot reach the proxy's admin port or the node.
    #[serde(default, skip_serializing_if = "is_false")]
    pub external: bool,
}

impl Backend {
    /// A backend with default settings (HTTP/1.1, round robin, default timeouts and pool).
    pub fn new(name: impl Into<String>, endpoints: Vec<Endpoint>) -> Self {
        Backend {
            name: name.into(),
            protocol: BackendProtocol::default(),
            tls: None,
            lb: LbPolicy::default(),
            endpoints,
            connect_timeout: default_connect_timeout(),
            outlier: OutlierDetection::default(),
            max_idle_per_endpoint: default_pool_idle(),
            session_persistence: None,
            hash: None,
            health_check: None,
            send_proxy_protocol: false,
            external: false,
        }
    }
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_pool_idle() -> u32 {
    1024
}

/// One upstream address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// `ip:port` or `host:port`.
    pub address: String,
    /// Relative weight. Default 1.
    #[serde(default = "default_weight", skip_serializing_if = "is_default_weight")]
    pub weight: u32,
}

/// TLS towards a backend.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendTls {
    /// CA bundle to verify the backend with. None: the backend is not verified (insecure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PemSource>,
    /// SNI and name to verify; default: the endpoint host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Extra subject alternative names accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    /// Client certificate for mTLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<PemSource>,
    /// Client key for mTLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PemSource>,
    /// Also trust the well-known public CAs (Mozilla's root program, compiled in), as for
    /// BackendTLSPolicy `wellKnownCACertificates: System`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub well_known_ca: bool,
    /// The longest chain accepted: the backend's certificate plus intermediates (1: issued by
    /// a certificate of `ca` directly, as nginx's default `proxy_ssl_verify_depth 1`), at most
    /// [`crate::MAX_VERIFY_DEPTH`]; needs `ca` or `well_known_ca`. None: no limit of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_depth: Option<u8>,
    /// Lowest TLS version offered to the backend. None: 1.2 (TLS 1.2 and 1.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
}

/// Passive outlier ejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierDetection {
    /// Consecutive 5xx or connect errors that eject an endpoint; 0 disables. Default 5.
    #[serde(default = "default_consecutive")]
    pub consecutive_failures: u32,
    /// First ejection time; doubles on each repeat. Default 10s.
    #[serde(default = "default_ejection")]
    pub base_ejection_time: Duration,
    /// At most this share of endpoints ejected at once. Default 50.
    #[serde(default = "default_max_ejection")]
    pub max_ejection_percent: u32,
}

fn default_consecutive() -> u32 {
    5
}
fn default_ejection() -> Duration {
    Duration::from_secs(10)
}
fn default_max_ejection() -> u32 {
    50
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_failures: default_consecutive(),
            base_ejection_time: default_ejection(),
            max_ejection_percent: default_max_ejection(),
        }
    }
}

/// The limits of the backpressure core. Every limit hit is counted in metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Open client connections, all listeners. The accept loop pauses while full.
    pub max_connections: u32,
    /// Requests in flight, all listeners and protocols.
    pub max_requests_in_flight: u32,
    /// Open connections per client address (the TCP peer, or the PROXY protocol source; not
    /// counted for trusted proxies). 0: no cap (the default). Past it a new connection is
    /// closed at once.
    pub max_connections_per_client: u32,
    /// Requests in flight per client address (after `client_ip`). 0: no cap (the default).
    /// Past it: 429 with `Retry-After`.
    pub max_requests_per_client: u32,
    /// How long a request waits for an in-flight slot before a 503.
    pub queue_timeout: Duration,
    /// `Retry-After` seconds on a 503 for overload.
    pub retry_after_seconds: u32,
    /// Concurrent HTTP/2 (and HTTP/3) streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 streams reset by the client before being answered (rapid-reset flood guard,
    /// CVE-2023-44487); past it the connection is closed.
    pub max_pending_reset_streams: u32,
    /// Time to receive a full request header (slowloris guard).
    pub header_read_timeout: Duration,
    /// Longest pause while reading a request body.
    pub body_idle_timeout: Duration,
    /// A client that accepts no byte of what is written to it for this long is disconnected
    /// (slow-read guard; HTTP/1.1, HTTP/2 and each HTTP/3 response). Default 60s. Also each
    /// HTTP/2 stream's send-progress deadline on Sweety's engine: a response waiting this
    /// long for flow-control window is reset with CANCEL.
    pub send_timeout: Duration,
    /// Idle keep-alive connection lifetime.
    pub idle_timeout: Duration,
    /// Largest request header block, bytes.
    pub max_header_bytes: u32,
    /// Largest request body, bytes (413 past it).
    pub max_request_body_bytes: u64,
    /// Time in-flight requests get to finish on shutdown or listener removal.
    pub drain_timeout: Duration,
    /// A WebSocket tunnel with no byte either way for this long is closed, unless its route
    /// sets `timeouts.read_idle`. Default 5m.
    #[serde(skip_serializing_if = "crate::is_default_websocket_idle_timeout")]
    pub websocket_idle_timeout: Duration,
    /// Which HTTP/2 server implementation serves h2 and h2c connections (default: Sweety's
    /// own; hyper's stays selectable, see docs/config.md).
    #[serde(skip_serializing_if = "Http2Engine::is_default")]
    pub http2_engine: Http2Engine,
    /// Which HTTP/1.1 server implementation serves HTTP/1.1 connections (hyper's for now;
    /// Sweety's own, `sweety-h1`, selectable; see docs/config.md).
    #[serde(skip_serializing_if = "Http1Engine::is_default")]
    pub http1_engine: Http1Engine,
    /// Which HTTP/2 client carries requests to `h2c` and `h2` backends (see docs/config.md).
    #[serde(skip_serializing_if = "Http2Client::is_default")]
    pub http2_client: Http2Client,
    /// Bytes of static files one connection may hold read ahead of its client, all its
    /// streams together (at least 16384). A stream that finds it used up reads 16 KiB at a
    /// time outside it, so a connection holds at most this plus 16 KiB per stream of file
    /// data. Default 128 KiB (one 128 KiB chunk; HTTP/1.1 reads files in such chunks).
    #[serde(skip_serializing_if = "crate::is_default_static_read_ahead")]
    pub static_read_ahead: u32,
    /// Bytes of static files all connections together may hold read ahead of their clients
    /// in `static_read_ahead`'s chunks (16384 to 16 GiB). Past it, a stream reads 16 KiB at a
    /// time outside it, as past its connection's `static_read_ahead`, so the file data held
    /// is at most this plus 16 KiB per stream reading, however many connections there are.
    /// Default 16 MiB.
    #[serde(skip_serializing_if = "crate::is_default_static_read_ahead_total")]
    pub static_read_ahead_total: u64,
    /// Bytes of a proxied response one backend connection or stream may read ahead of the
    /// client (8192 to 16 MiB): an HTTP/1.1 backend connection's read buffer (so also the
    /// largest response head a backend may send) and an HTTP/2 backend stream's flow-control
    /// window. A proxied stream holds at most about twice this of its response (one chunk
    /// being written to the client, one read). Default 16 KiB.
    #[serde(skip_serializing_if = "crate::is_default_proxy_read_ahead")]
    pub proxy_read_ahead: u32,
    /// Bytes of output one HTTP/2 connection (Sweety's engine) buffers before it stops
    /// taking response data and reading requests (16 KiB to 1 MiB; it holds at most this plus
    /// one DATA frame, the TLS layer below adds its own 64 KiB). Default 32 KiB.
    #[serde(skip_serializing_if = "crate::is_default_http2_write_buffer")]
    pub http2_write_buffer: u32,
}

/// The HTTP/2 server implementation (`limits.http2_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Http2Engine {
    /// Sweety's own HTTP/2 connection layer (the default).
    #[default]
    Sweety,
    /// hyper's HTTP/2 server (the h2 crate), the fallback.
    Hyper,
}

impl Http2Engine {
    /// True for the default engine (left out when a config is written).
    pub fn is_default(&self) -> bool {
        *self == Http2Engine::default()
    }
}

/// The HTTP/1.1 server implementation (`limits.http1_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Http1Engine {
    /// Sweety's own HTTP/1.1 connection layer (`sweety-h1`, the default).
    #[default]
    Sweety,
    /// hyper's HTTP/1.1 server, the fallback.
    Hyper,
}

impl Http1Engine {
    /// True for the default engine (left out when a config is written).
    pub fn is_default(&self) -> bool {
        *self == Http1Engine::default()
    }
}

/// The HTTP/2 client of `h2c` and `h2` backends (`limits.http2_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Http2Client {
    /// Sweety's own (`sweety_h2::client`, the default).
    #[default]
    Sweety,
    /// hyper's HTTP/2 client (the h2 crate), the fallback.
    Hyper,
}

impl Http2Client {
    /// True for the default client (left out when a config is written).
    pub fn is_default(&self) -> bool {
        *self == Http2Client::default()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 25_000,
            max_requests_in_flight: 10_000,
            max_connections_per_client: 0,
            max_requests_per_client: 0,
            queue_timeout: Duration::from_millis(200),
            retry_after_seconds: 1,
            max_concurrent_streams: 128,
            max_pending_reset_streams: 32,
            header_read_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 64 * 1024,
            max_request_body_bytes: 64 * 1024 * 1024,
            drain_timeout: Duration::from_secs(20),
            websocket_idle_timeout: crate::default_websocket_idle_timeout(),
            http2_engine: Http2Engine::default(),
            http1_engine: Http1Engine::default(),
            http2_client: Http2Client::default(),
            static_read_ahead: crate::DEFAULT_STATIC_READ_AHEAD,
            static_read_ahead_total: crate::DEFAULT_STATIC_READ_AHEAD_TOTAL,
            proxy_read_ahead: crate::DEFAULT_PROXY_READ_AHEAD,
            http2_write_buffer: crate::DEFAULT_HTTP2_WRITE_BUFFER,
        }
    }
}

/// QUIC congestion controller of HTTP/3 connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Congestion {
    /// CUBIC (RFC 9438).
    #[default]
    Cubic,
    /// BBR (quinn's experimental implementation).
    Bbr,
    /// NewReno (RFC 9002).
    NewReno,
}

/// HTTP/3 (QUIC) settings, shared by every HTTPS listener with `http3` on. Requests still go
/// through [`Limits`]: the in-flight cap, body limits and timeouts apply to HTTP/3 too, and
/// QUIC connections count against `limits.max_connections`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http3 {
    /// Concurrent request streams (bidirectional) a client may open per connection (64: quinn
    /// keeps a few hundred bytes of receive state for each once used).
    pub max_concurrent_bidi_streams: u32,
    /// Flow-control window of one request stream, bytes (how much request body a client may
    /// send ahead of the server reading it; 256 KiB, as Sweety's HTTP/2 engine).
    pub stream_receive_window: u32,
    /// Flow-control window of a whole connection, bytes: the most request body quinn buffers
    /// for one connection (1 MiB, as Sweety's HTTP/2 engine).
    pub connection_receive_window: u32,
    /// Bytes of response data buffered per connection ahead of the client's acknowledgements:
    /// one connection's ceiling; all connections together share `send_budget`, so memory does
    /// not scale with connections × this.
    pub send_window: u32,
    /// Bytes of response data buffered ahead of acknowledgements by all HTTP/3 connections
    /// together: the connections with a response in flight share it (each gets at most
    /// `send_window`, at least 16 KiB), so memory under many downloads stays bounded while a
    /// lone connection keeps its full `send_window`. Also the budget of the state all
    /// connections keep for packets not yet acknowledged (docs/security.md).
    pub send_budget: u64,
    /// Congestion controller.
    pub congestion: Congestion,
    /// UDP payload size, bytes, of the first packets of a connection, before path MTU
    /// discovery (at least 1200, the size every QUIC path must carry).
    pub initial_mtu: u16,
    /// Largest UDP payload, bytes, path MTU discovery probes for (1452 fits Ethernet for IPv4
    /// and IPv6; up to 65527 on loopback or jumbo-frame networks). The client's advertised
    /// `max_udp_payload_size` caps it too.
    pub mtu_discovery_upper_bound: u16,
    /// Ack-eliciting packets the client may receive before it must acknowledge, requested
    /// with the QUIC ACK frequency extension when the client supports it. 1 is the QUIC
    /// default (an ACK for every second packet) and sends no request.
    pub ack_eliciting_threshold: u32,
    /// Interleave the data of concurrent streams of a connection packet by packet (fair) or
    /// send streams one after another (fewer frames per packet).
    pub send_fairness: bool,
    /// Size, bytes, of the chunks a static file is read in for an HTTP/3 response (16 KiB).
    /// Each stream holds at most one chunk while QUIC flow control paces it, so this bounds
    /// memory per stream (HTTP/1.1 and HTTP/2 read 128 KiB chunks).
    pub static_chunk_size: u32,
    /// Accept TLS 1.3 early data (0-RTT). Off by default; when on, only safe methods (GET,
    /// HEAD, OPTIONS, TRACE) are served from early data, anything else gets 425 Too Early.
    pub early_data: bool,
    /// `ma` (max age) of the `Alt-Svc` header advertising HTTP/3 on H1 and H2 responses.
    pub alt_svc_max_age: Duration,
}

impl Default for Http3 {
    fn default() -> Self {
        Http3 {
            max_concurrent_bidi_streams: 64,
            stream_receive_window: 256 * 1024,
            connection_receive_window: 1024 * 1024,
            send_window: 512 * 1024,
            send_budget: 8 * 1024 * 1024,
            congestion: Congestion::Cubic,
            initial_mtu: 1200,
            mtu_discovery_upper_bound: 1452,
            ack_eliciting_threshold: 1,
            send_fairness: true,
            static_chunk_size: 16 * 1024,
            early_data: false,
            alt_svc_max_age: Duration::from_secs(86_400),
        }
    }
}

/// The admin listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Address to bind. Default `127.0.0.1`.
    #[serde(default = "default_admin_address")]
    pub address: String,
    /// Port. Default 9901.
    #[serde(default = "default_admin_port")]
    pub port: u16,
}

fn default_admin_address() -> String {
    "127.0.0.1".to_string()
}
fn default_admin_port() -> u16 {
    9901
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            address: default_admin_address(),
            port: default_admin_port(),
        }
    }
}

/// Access log settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLog {
    /// Write access log lines.
    pub enabled: bool,
    /// File to append to; none means standard output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Lines queued for the writer; past it lines are dropped and counted.
    pub buffer_lines: u32,
    /// Line format: `json` (one JSON object per line, the documented schema) or `combined`
    /// (ingress-nginx's "upstreaminfo"-like text line).
    pub format: AccessLogFormat,
}

/// OpenTelemetry tracing (docs/observability.md "Tracing"): the dataplane takes part in W3C
/// trace context (`traceparent`/`tracestate`) and exports a server span per sampled request,
/// and a client span per proxied one, to an OTLP receiver over HTTP (protobuf) or gRPC, in
/// plain text or TLS. Every queue, batch and export is bounded; spans that do not fit are
/// dropped and counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tracing {
    /// The OTLP traces endpoint. `http/protobuf`: the URL spans are POSTed to, e.g.
    /// `http://otel-collector.observability:4318/v1/traces`; `grpc`: the receiver's
    /// `scheme://host:port`, e.g. `http://otel-collector.observability:4317` (no path: the
    /// method's path is fixed). `https://` sends over TLS, `http://` in plain text (for gRPC:
    /// HTTP/2 with prior knowledge), as OpenTelemetry's exporters read the scheme.
    pub otlp_endpoint: String,
    /// The transport, by OpenTelemetry's `OTEL_EXPORTER_OTLP_PROTOCOL` values:
    /// `http/protobuf` (the default, as the specification recommends) or `grpc`.
    #[serde(default, skip_serializing_if = "OtlpProtocol::is_default")]
    pub otlp_protocol: OtlpProtocol,
    /// CA bundle the receiver's certificate is verified with (`https://` endpoints only), as
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`: given, it is the only trust; absent, the well-known
    /// public CAs (Mozilla's root program, compiled in) are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_ca: Option<PemSource>,
    /// Client certificate presented to the receiver (mTLS; `https://` only, with
    /// `otlp_client_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_client_cert: Option<PemSource>,
    /// The key of `otlp_client_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_client_key: Option<PemSource>,
    /// Share of requests sampled when no sampled parent decides (0 to 1; `0.01` is 1 %).
    #[serde(default = "default_sampling_ratio")]
    pub sampling_ratio: f64,
    /// Parent-based sampling: a request with a valid incoming `traceparent` is sampled exactly
    /// when its sampled flag is set (the ratio then decides only new traces). Off: the ratio
    /// decides every request, and the incoming flag is ignored.
    #[serde(default = "default_true")]
    pub parent_based: bool,
    /// `service.name` of the exported resource.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Finished spans waiting for export at most; more are dropped and counted.
    #[serde(default = "default_trace_queue")]
    pub max_queue_spans: u32,
    /// Spans per export request at most.
    #[serde(default = "default_trace_batch")]
    pub max_batch_spans: u32,
    /// How long a span may wait for its batch to fill before the batch is sent anyway.
    #[serde(default = "default_trace_batch_delay")]
    pub batch_delay: Duration,
    /// An export request (connect, send, response) is abandoned after this; its spans are
    /// counted as failed.
    #[serde(default = "default_trace_export_timeout")]
    pub export_timeout: Duration,
}

fn default_sampling_ratio() -> f64 {
    0.01
}
fn default_service_name() -> String {
    "sweety".to_owned()
}
fn default_trace_queue() -> u32 {
    2048
}
fn default_trace_batch() -> u32 {
    512
}
fn default_trace_batch_delay() -> Duration {
    Duration::from_secs(1)
}
fn default_trace_export_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Tracing {
    /// Tracing to `otlp_endpoint` with every other setting at its default.
    pub fn to(otlp_endpoint: impl Into<String>) -> Tracing {
        Tracing {
            otlp_endpoint: otlp_endpoint.into(),
            otlp_protocol: OtlpProtocol::default(),
            otlp_ca: None,
            otlp_client_cert: None,
            otlp_client_key: None,
            sampling_ratio: default_sampling_ratio(),
            parent_based: true,
            service_name: default_service_name(),
            max_queue_spans: default_trace_queue(),
            max_batch_spans: default_trace_batch(),
            batch_delay: default_trace_batch_delay(),
            export_timeout: default_trace_export_timeout(),
        }
    }
}

/// How spans travel to the OTLP receiver (the values of OpenTelemetry's
/// `OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/HTTP: `POST` of a protobuf `ExportTraceServiceRequest` (HTTP/1.1).
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC: unary `opentelemetry.proto.collector.trace.v1.TraceService/Export` over
    /// HTTP/2.
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// Whether it is the default (`http/protobuf`), which is not written out.
    pub fn is_default(&self) -> bool {
        *self == OtlpProtocol::default()
    }
}

/// The access log's line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line (docs/observability.md "Access log").
    #[default]
    Json,
    /// An ingress-nginx-like text line: `combined` plus upstream fields and the request id.
    Combined,
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog {
            enabled: true,
            path: None,
            buffer_lines: 8192,
            format: AccessLogFormat::Json,
        }
    }
}
