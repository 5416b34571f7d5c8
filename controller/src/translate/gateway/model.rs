//! One uniform, serde-derived view of the route specs of every Gateway API route kind.
//!
//! kopium generates a distinct Rust type per location (rule filters, backendRef filters,
//! GRPCRoute filters…) although the wire shapes are identical. Converting each spec through
//! JSON (bytes, [`from_json`]) into these types lets the rest of the front end handle them
//! with one code path.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Convert a kopium-generated spec into one of the uniform types below.
pub(super) fn convert<S: Serialize, T: DeserializeOwned>(spec: &S) -> Result<T, String> {
    let value = serde_json::to_value(spec).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// Read one of the uniform types below from a spec serialized as JSON. Route specs travel as
/// JSON bytes rather than a `serde_json::Value` tree: serializing to bytes is one buffer,
/// where a `Value` allocates a map and a string per field.
pub(super) fn from_json<T: DeserializeOwned>(json: &[u8]) -> Result<T, String> {
    serde_json::from_slice(json).map_err(|e| e.to_string())
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct ParentRefSpec {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub section_name: Option<String>,
    pub port: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct BackendRefSpec {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub port: Option<i32>,
    pub weight: Option<i32>,
    pub filters: Vec<FilterSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct FilterSpec {
    #[serde(rename = "type")]
    pub type_: String,
    pub request_header_modifier: Option<HeaderModSpec>,
    pub response_header_modifier: Option<HeaderModSpec>,
    pub request_redirect: Option<RedirectSpec>,
    pub url_rewrite: Option<RewriteSpec>,
    pub request_mirror: Option<MirrorSpec>,
    pub cors: Option<CorsSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct HeaderModSpec {
    pub set: Vec<NameValue>,
    pub add: Vec<NameValue>,
    pub remove: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct NameValue {
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct RedirectSpec {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModSpec>,
    pub port: Option<i32>,
    /// kopium models it as an enum of strings or an integer; accept both.
    pub status_code: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct PathModSpec {
    #[serde(rename = "type")]
    pub type_: String,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RewriteSpec {
    pub hostname: Option<String>,
    pub path: Option<PathModSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct MirrorSpec {
    pub backend_ref: BackendRefSpec,
    pub percent: Option<i32>,
    pub fraction: Option<FractionSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct FractionSpec {
    pub numerator: i32,
    pub denominator: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct CorsSpec {
    pub allow_origins: Vec<String>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub allow_credentials: Option<bool>,
    pub max_age: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct PathMatchSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub value: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ValueMatchSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct HttpMatchSpec {
    pub path: Option<PathMatchSpec>,
    pub headers: Vec<ValueMatchSpec>,
    pub query_params: Vec<ValueMatchSpec>,
    pub method: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct GrpcMethodSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub service: Option<String>,
    pub method: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct GrpcMatchSpec {
    pub method: Option<GrpcMethodSpec>,
    pub headers: Vec<ValueMatchSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct TimeoutsSpec {
    pub request: Option<String>,
    pub backend_request: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RetrySpec {
    pub attempts: Option<i32>,
    pub codes: Vec<i32>,
    pub backoff: Option<String>,
}

/// A rule of an HTTPRoute or GRPCRoute (GRPCRoute has no timeouts or retry; its matches are
/// converted to HTTP matches before this point).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct HttpRuleSpec {
    pub name: Option<String>,
    pub matches: Vec<HttpMatchSpec>,
    pub filters: Vec<FilterSpec>,
    pub backend_refs: Vec<BackendRefSpec>,
    pub timeouts: Option<TimeoutsSpec>,
    pub retry: Option<RetrySpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct GrpcRuleSpec {
    pub name: Option<String>,
    pub matches: Vec<GrpcMatchSpec>,
    pub filters: Vec<FilterSpec>,
    pub backend_refs: Vec<BackendRefSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct L4RuleSpec {
    pub name: Option<String>,
    pub backend_refs: Vec<BackendRefSpec>,
}

/// The spec of any route kind: hostnames, parents and rules of type `R`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct RouteSpec<R> {
    pub hostnames: Vec<String>,
    pub parent_refs: Vec<ParentRefSpec>,
    pub rules: Vec<R>,
}

impl<R> Default for RouteSpec<R> {
    fn default() -> Self {
        RouteSpec {
            hostnames: Vec::new(),
            parent_refs: Vec::new(),
            rules: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_gateway_api::httproutes::HttpRoute;

    #[test]
    fn http_route_spec_converts_with_filters_and_matches() {
        let route: HttpRoute = serde_yaml::from_str(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: app}
spec:
  parentRefs: [{name: gw, sectionName: http, port: 80}]
  hostnames: [a.example.com]
  rules:
  - matches: [{path: {type: Exact, value: /x}, method: GET, queryParams: [{name: q, value: v}]}]
    filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, statusCode: 301}
    backendRefs: [{name: web, port: 80, weight: 3}]
"#,
        )
        .unwrap();
        let spec: RouteSpec<HttpRuleSpec> = convert(&route.spec).unwrap();
        assert_eq!(spec.parent_refs[0].section_name.as_deref(), Some("http"));
        assert_eq!(spec.parent_refs[0].port, Some(80));
        let rule = &spec.rules[0];
        assert_eq!(rule.matches[0].method.as_deref(), Some("GET"));
        assert_eq!(rule.matches[0].query_params[0].name, "q");
        let redirect = rule.filters[0].request_redirect.as_ref().unwrap();
        assert_eq!(redirect.scheme.as_deref(), Some("https"));
        assert_eq!(redirect.status_code.as_ref().unwrap().to_string(), "301");
        assert_eq!(rule.backend_refs[0].weight, Some(3));
    }
}
