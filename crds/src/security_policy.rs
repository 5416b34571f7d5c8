//! `SweetySecurityPolicy`: external authentication, basic authentication, client certificates
//! and IP rules for Gateway API users, attached to Gateways (or one of their listeners) and
//! HTTPRoutes (or one of their rules) by Gateway API policy attachment (GEP-713 `targetRefs`).
//!
//! These are the powers ingress-nginx annotations give Ingress users (`auth-url`,
//! `auth-type: basic`, `auth-tls-*`, `whitelist-source-range` / `denylist-source-range`). A
//! policy on an HTTPRoute overrides one on a Gateway (the more specific wins, whole); two
//! policies on the same target: the oldest wins and the others are `Conflicted`. A policy that
//! cannot be honoured fails closed (the routes it targets answer 500) and says why in
//! `status.ancestors[]`, which follows Gateway API's `PolicyAncestorStatus`. How the
//! controller applies it: `controller/src/translate/gateway/security.rs` and docs/crds.md.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Security settings for the routes of the Gateways and HTTPRoutes it targets.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sweety.dev",
    version = "v1alpha1",
    kind = "SweetySecurityPolicy",
    namespaced,
    status = "SweetySecurityPolicyStatus",
    shortname = "ssp",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.ancestors[0].conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.extAuth) || has(self.basicAuth) || has(self.clientCertificate) || has(self.ipRules)",
     "message": "at least one of extAuth, basicAuth, clientCertificate or ipRules must be set"}
]))]
pub struct SweetySecurityPolicySpec {
    /// What the policy applies to: Gateways (all routes attached through them, or through the
    /// listener `sectionName` names) and HTTPRoutes (all their rules, or the rule
    /// `sectionName` names) of the policy's own namespace.
    #[schemars(extend("minItems" = 1, "maxItems" = 16))]
    pub target_refs: Vec<TargetRef>,
    /// Ask an HTTP auth service before serving each request (ingress-nginx `auth-url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ext_auth: Option<ExtAuth>,
    /// HTTP Basic authentication against an htpasswd file (ingress-nginx `auth-type: basic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// Client certificates (mutual TLS) on the targeted Gateway listeners (ingress-nginx
    /// `auth-tls-*`). Gateway targets only: the certificate is asked for at the TLS handshake,
    /// for the listener's hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertificate>,
    /// Client address allow and deny lists (ingress-nginx `whitelist-source-range` /
    /// `denylist-source-range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_rules: Option<IpRules>,
}

/// A GEP-713 local policy target reference: an object of the policy's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// `gateway.networking.k8s.io`.
    #[schemars(extend("maxLength" = 253))]
    pub group: String,
    /// `Gateway` or `HTTPRoute`.
    #[schemars(extend("maxLength" = 63))]
    pub kind: String,
    /// The target's name.
    #[schemars(extend("minLength" = 1, "maxLength" = 253))]
    pub name: String,
    /// A Gateway listener name, or an HTTPRoute rule name: only that part of the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 253))]
    pub section_name: Option<String>,
}

/// A reference to a Service port (the auth service).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRef {
    /// `""` (core) when set: only Services are supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Service` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Service's name.
    #[schemars(extend("minLength" = 1, "maxLength" = 253))]
    pub name: String,
    /// Its namespace; another than the policy's needs a ReferenceGrant there (from
    /// `sweety.dev` `SweetySecurityPolicy` to `""` `Service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Service port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// A reference to a Secret or ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `""` (core) when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Secret` (default) or, for CA certificates, `ConfigMap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The object's name.
    #[schemars(extend("minLength" = 1, "maxLength" = 253))]
    pub name: String,
    /// Its namespace; another than the policy's needs a ReferenceGrant there (from
    /// `sweety.dev` `SweetySecurityPolicy` to `""` `Secret` / `ConfigMap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// External authentication: a subrequest to an HTTP service decides for every request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtAuth {
    /// The auth service (plain HTTP to the Service's cluster address).
    pub backend_ref: ServiceRef,
    /// The path (and query) asked on the service; default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxLength" = 1024,
        "x-kubernetes-validations" = [
            {"rule": "self.startsWith('/')", "message": "path must start with '/'"}
        ]
    ))]
    pub path: Option<String>,
    /// Headers of the service's 2xx answer copied into the request the backend receives
    /// (a client's own copies are removed first), e.g. `X-Auth-Request-User`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub headers_to_backend: Vec<String>,
    /// Where a 401 of the service sends the client (302, the original URL in `rd`), as
    /// ingress-nginx's `auth-signin`.
    #[serde(default, rename = "signinURL", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 2048))]
    pub signin_url: Option<String>,
}

/// Basic authentication.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuth {
    /// A Secret holding an htpasswd file (bcrypt, `$apr1$` or `{SHA}` entries) under the key
    /// `auth` (ingress-nginx) or `.htpasswd`.
    pub secret_ref: ObjectRef,
    /// The realm shown to the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 256))]
    pub realm: Option<String>,
}

/// How a request without a valid client certificate is treated.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ClientCertificateMode {
    /// A certificate that chains to the CA is required: 400 otherwise (nginx `on`).
    #[default]
    Require,
    /// Verified when sent; a request without one is served (nginx `optional`).
    Optional,
    /// Asked for, not verified; the backend learns the result from `ssl-client-verify`
    /// (nginx `optional_no_ca`).
    OptionalNoCA,
}

/// Client certificate verification.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificate {
    /// ConfigMaps or Secrets whose `ca.crt` holds the CA certificates (PEM).
    #[schemars(extend("minItems" = 1, "maxItems" = 8))]
    pub ca_certificate_refs: Vec<ObjectRef>,
    /// `Require` (default), `Optional` or `OptionalNoCA`.
    #[serde(default)]
    pub mode: ClientCertificateMode,
    /// The longest chain accepted, client certificate plus intermediates (default 1: issued
    /// by a CA certificate directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8))]
    pub verify_depth: Option<i32>,
    /// Send the client certificate to the backend (URL-escaped PEM in `ssl-client-cert`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_certificate_to_upstream: bool,
}

/// Client address rules.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.allow) && size(self.allow) > 0) || (has(self.deny) && size(self.deny) > 0)",
     "message": "ipRules must list at least one address in allow or deny"}
]))]
pub struct IpRules {
    /// Only these CIDRs (or addresses) are served (403 otherwise); empty: every address not
    /// denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 256))]
    pub allow: Vec<String>,
    /// These CIDRs (or addresses) are refused (403), before `allow`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 256))]
    pub deny: Vec<String>,
}

/// Status: one entry per ancestor (Gateway) the policy takes effect through, as Gateway API's
/// `PolicyStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SweetySecurityPolicyStatus {
    /// Per ancestor: which controller wrote it and the `Accepted` condition (reasons
    /// `Accepted`, `Invalid`, `TargetNotFound`, `Conflicted`), plus `Conflicted`.
    #[serde(default)]
    #[schemars(extend("maxItems" = 16))]
    pub ancestors: Vec<PolicyAncestorStatus>,
}

/// Gateway API's `PolicyAncestorStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    /// The ancestor (a Gateway, with the listener when the target named one).
    pub ancestor_ref: AncestorRef,
    /// The controller that wrote this entry.
    pub controller_name: String,
    /// `Accepted` and `Conflicted`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Gateway API's `ParentReference`, as `ancestorRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AncestorRef {
    /// API group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// Listener or rule name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}
