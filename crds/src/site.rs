//! `SweetySite`: hostnames, TLS and routes (static, proxy, redirect) of one site, plus
//! site-wide response headers, compression, cache and rate-limit settings.
//!
//! Admission-time checks are CEL rules (`x-kubernetes-validations`) on the types below, so a
//! route with two actions, a path without a leading `/` or a redirect with status 200 is
//! rejected by the API server before the controller ever sees it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A whole site in one object: the hostnames it answers for and what serves each path.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sweety.dev",
    version = "v1alpha1",
    kind = "SweetySite",
    namespaced,
    status = "SweetySiteStatus",
    shortname = "site",
    printcolumn = r#"{"name":"Hosts","type":"string","jsonPath":".spec.hostnames"}"#,
    printcolumn = r#"{"name":"Programmed","type":"string","jsonPath":".status.conditions[?(@.type==\"Programmed\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SweetySiteSpec {
    /// Hostnames the site answers for: exact (`www.example.com`) or one leading wildcard
    /// label (`*.example.com`). At least one.
    #[schemars(extend(
        "minItems" = 1,
        "maxItems" = 16,
        "items" = {"type": "string", "maxLength": 253},
        "x-kubernetes-validations" = [
            {"rule": "self.all(h, h.matches('^(\\\\*\\\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'))",
             "message": "hostnames must be lower-case DNS names, optionally starting with '*.'"},
            {"rule": "self.all(h, self.exists_one(o, o == h))", "message": "hostnames must be unique"}
        ]
    ))]
    pub hostnames: Vec<String>,
    /// Serve HTTPS with the certificate in this `kubernetes.io/tls` Secret (same namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SiteTls>,
    /// Offer HTTP/3 on the HTTPS listener. Default: the controller's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http3: Option<bool>,
    /// Defaults for static routes: `static` (index.html, precompressed siblings) or `spa`
    /// (also falls back to `/index.html` for unknown paths, long cache for hashed assets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// What serves each path. Longest matching path wins (exact before prefix).
    #[schemars(extend("minItems" = 1, "maxItems" = 64))]
    pub routes: Vec<SiteRoute>,
    /// Response compression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Response caching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Cache>,
    /// Per-client request rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Headers edited on every response of the site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEdits>,
}

/// TLS settings of a site.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteTls {
    /// Name of a `kubernetes.io/tls` Secret in the site's namespace.
    #[schemars(extend("minLength" = 1, "maxLength" = 253))]
    pub secret_name: String,
}

/// Static-serving defaults.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// index.html for directories, precompressed `.br`/`.gz` siblings, short cache.
    Static,
    /// Single-page app: unknown paths fall back to `/index.html`; hashed assets cached long.
    Spa,
}

/// How a route's path is compared.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PathType {
    /// The request path starts with `path` on a `/` boundary (`/docs` matches `/docs/a`, not
    /// `/docsx`).
    #[default]
    Prefix,
    /// The request path equals `path`.
    Exact,
}

/// One path of the site and the single action that serves it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "[has(self.static), has(self.proxy), has(self.redirect)].filter(x, x).size() == 1",
     "message": "exactly one of static, proxy or redirect must be set"}
]))]
pub struct SiteRoute {
    /// Request path, starting with `/`.
    #[schemars(extend(
        "maxLength" = 1024,
        "x-kubernetes-validations" = [
            {"rule": "self.startsWith('/')", "message": "path must start with '/'"},
            {"rule": "!self.contains('?') && !self.contains('#')", "message": "path must not contain '?' or '#'"}
        ]
    ))]
    pub path: String,
    /// `Prefix` (default) or `Exact`.
    #[serde(default)]
    pub path_type: PathType,
    /// Serve files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#static: Option<StaticAction>,
    /// Reverse proxy to one or more Services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyAction>,
    /// Answer with a redirect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<RedirectAction>,
}

/// Files from a ConfigMap (written to disk by the controller) or from a directory the
/// dataplane has mounted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.configMap) != has(self.directory)",
     "message": "exactly one of configMap or directory must be set"}
]))]
pub struct StaticAction {
    /// ConfigMap in the site's namespace; each `data` key is a file (text only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapRef>,
    /// Absolute directory inside the dataplane container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxLength" = 4096,
        "x-kubernetes-validations" = [
            {"rule": "self.startsWith('/') && !self.contains('..')",
             "message": "directory must be an absolute path without '..'"}
        ]
    ))]
    pub directory: Option<String>,
}

/// A ConfigMap in the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ConfigMapRef {
    /// ConfigMap name.
    #[schemars(extend("minLength" = 1))]
    pub name: String,
}

/// Reverse proxy; several backends split traffic by weight.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyAction {
    /// Services to send requests to.
    #[schemars(extend(
        "minItems" = 1,
        "maxItems" = 16,
        "x-kubernetes-validations" = [
            {"rule": "self.exists(b, !has(b.weight) || b.weight > 0)",
             "message": "at least one backend must have a weight above 0"}
        ]
    ))]
    pub backends: Vec<ProxyBackend>,
}

/// A Service port and its share of the traffic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyBackend {
    /// Service name in the site's namespace.
    #[schemars(extend("minLength" = 1))]
    pub service: String,
    /// Service port number.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Relative weight, default 1; 0 disables the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub weight: Option<i32>,
}

/// A redirect: either a full `url`, or any of scheme/host/path replacing the request's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.url) ? !(has(self.scheme) || has(self.host) || has(self.path)) : (has(self.scheme) || has(self.host) || has(self.path))",
     "message": "set either url, or at least one of scheme, host and path"}
]))]
pub struct RedirectAction {
    /// Absolute target, `http(s)://host[:port][/path]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxLength" = 2048,
        "x-kubernetes-validations" = [
        {"rule": "self.matches('^https?://[^/?#]+(/[^?#]*)?$')",
         "message": "url must be http(s)://host[:port][/path] without query or fragment"}
    ]))]
    pub url: Option<String>,
    /// `http` or `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["http", "https"]))]
    pub scheme: Option<String>,
    /// Host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Replacement path (the whole path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxLength" = 1024,
        "x-kubernetes-validations" = [
        {"rule": "self.startsWith('/')", "message": "redirect path must start with '/'"}
    ]))]
    pub path: Option<String>,
    /// 301, 302 (default), 303, 307 or 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self in [301, 302, 303, 307, 308]",
         "message": "statusCode must be 301, 302, 303, 307 or 308"}
    ]))]
    pub status_code: Option<i32>,
}

/// Response compression settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Compression {
    /// Compress responses the client accepts compressed.
    pub enabled: bool,
    /// Smallest body compressed, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub minimum_size: Option<i64>,
}

/// Response cache settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cache {
    /// How long responses may be cached, seconds.
    #[schemars(range(min = 0))]
    pub ttl_seconds: i64,
}

/// Token-bucket rate limit per client address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Sustained requests per second.
    #[schemars(range(min = 1))]
    pub requests_per_second: i32,
    /// Extra requests allowed in a burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub burst: Option<i32>,
}

/// Header edits: set (replace), add (append), remove.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderEdits {
    /// Replace or create these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<Header>,
    /// Append these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<Header>,
    /// Remove these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Header {
    /// Header name.
    #[schemars(extend("pattern" = "^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub name: String,
    /// Header value.
    pub value: String,
}

/// Observed state of a SweetySite.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SweetySiteStatus {
    /// `Accepted`, `ResolvedRefs` and `Programmed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Where the site is reachable (the ingress Service's load-balancer addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<SiteAddress>,
}

/// An address of the site.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SiteAddress {
    /// `IPAddress` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub value: String,
}
