//! `SweetyProxyConfig`: dataplane settings referenced from a GatewayClass `parametersRef` or
//! an IngressClass `parameters` (limits, timeouts, HTTP/3 default, access log, trusted
//! proxies, the Gateway Service shape). How the controller merges several of them into the
//! one dataplane's settings: `controller/src/translate/proxy_settings.rs` and docs/crds.md.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Dataplane settings for every Gateway of a GatewayClass (and every Ingress of an
/// IngressClass) that points here.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sweety.dev",
    version = "v1alpha1",
    kind = "SweetyProxyConfig",
    namespaced,
    shortname = "spc",
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.service.type"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SweetyProxyConfigSpec {
    /// Connection, request and body limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProxyLimits>,
    /// Serve HTTP/3 on HTTPS listeners unless a listener says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http3: Option<bool>,
    /// Access log settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<Logging>,
    /// Where the client address comes from (proxies in front of Sweety).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<ClientIpSpec>,
    /// Shape of the Service created for each Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<GatewayServiceSpec>,
    /// OpenTelemetry tracing (W3C trace context, spans exported over OTLP/HTTP or gRPC);
    /// off when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingSpec>,
    /// Settings of the Ingresses of the IngressClasses whose `spec.parameters` name this
    /// config (ingress-nginx ConfigMap keys); not dataplane-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressSettings>,
}

/// Settings of the Ingresses of a class, as ingress-nginx's ConfigMap sets them for its
/// controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressSettings {
    /// The status of a request refused by `limit-rps` / `limit-rpm` (ingress-nginx's
    /// `limit-req-status-code`); default 503, as nginx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 400, max = 599))]
    pub limit_req_status_code: Option<i32>,
    /// The status of a request refused by `limit-connections` (ingress-nginx's
    /// `limit-conn-status-code`); default 503, as nginx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 400, max = 599))]
    pub limit_conn_status_code: Option<i32>,
    /// Longest wait for the backend between two reads (ingress-nginx's `proxy-read-timeout`),
    /// for the class's Ingresses without the annotation; default `60s`, as nginx; at most
    /// `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub proxy_read_timeout: Option<String>,
    /// Longest wait for the backend to take the next chunk of the request (ingress-nginx's
    /// `proxy-send-timeout`), for the class's Ingresses without the annotation; default `60s`,
    /// as nginx; at most `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub proxy_send_timeout: Option<String>,
    /// Connect timeout to a backend endpoint (ingress-nginx's `proxy-connect-timeout`), for
    /// the class's Ingresses without the annotation; default: the backend's own (5 s, as
    /// nginx); at most `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub proxy_connect_timeout: Option<String>,
    /// Let the class's Ingresses use `nginx.ingress.kubernetes.io/ssl-passthrough`
    /// (ingress-nginx's `--enable-ssl-passthrough` flag): TLS connections for the host of such
    /// an Ingress's rule pass through unterminated, by SNI, to the Service of the rule's `/`
    /// path. Default false: an Ingress with `ssl-passthrough: "true"` is refused (its paths
    /// answer 403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssl_passthrough: Option<bool>,
}

/// OpenTelemetry tracing: where spans go and which requests are sampled.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracingSpec {
    /// The OTLP endpoint. `http/protobuf`: the traces URL, e.g.
    /// `http://otel-collector.observability:4318/v1/traces`; `grpc`: the receiver's
    /// `scheme://host:port`, e.g. `http://otel-collector.observability:4317`. `https://` sends
    /// over TLS.
    #[schemars(length(min = 8, max = 2048), extend("pattern" = "^https?://[^/@ ]+(/[!-~]*)?$"))]
    pub otlp_endpoint: String,
    /// The transport, by OpenTelemetry's `OTEL_EXPORTER_OTLP_PROTOCOL` values: `http/protobuf`
    /// (default) or `grpc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// A ConfigMap in this config's namespace whose `ca.crt` is the only CA the receiver's
    /// certificate is verified with (`https://` endpoints only); default: the well-known public
    /// CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificate_ref: Option<crate::site::ConfigMapRef>,
    /// A `kubernetes.io/tls` Secret in this config's namespace whose `tls.crt` and `tls.key`
    /// are presented to the receiver (mTLS; `https://` endpoints only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_ref: Option<SecretRef>,
    /// Share of new traces sampled (default 1/100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_fraction: Option<SamplingFraction>,
    /// Follow an incoming `traceparent`'s sampled flag (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_based: Option<bool>,
    /// `service.name` of the exported spans (default `sweety`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub service_name: Option<String>,
}

/// How spans travel to the OTLP receiver.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (the OpenTelemetry Collector's port 4318).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC (the OpenTelemetry Collector's port 4317).
    #[serde(rename = "grpc")]
    Grpc,
}

/// A Secret in the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Secret name.
    #[schemars(extend("minLength" = 1))]
    pub name: String,
}

/// `numerator / denominator` of requests (Envoy Gateway's shape; no floating point in the
/// API).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.numerator <= (has(self.denominator) ? self.denominator : 100)",
     "message": "numerator must not exceed denominator"}
]))]
pub struct SamplingFraction {
    /// Sampled requests per `denominator`.
    #[schemars(range(min = 0))]
    pub numerator: i32,
    /// Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub denominator: Option<i32>,
}

/// Dataplane limits. Durations are written `500ms`, `30s`, `5m`, `1h`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyLimits {
    /// Open client connections, all listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_connections: Option<i64>,
    /// Requests in flight, all listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_requests_in_flight: Option<i64>,
    /// Largest request body, bytes (413 past it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_request_body_bytes: Option<i64>,
    /// Time to receive a full request header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub header_read_timeout: Option<String>,
    /// Idle keep-alive connection lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub idle_timeout: Option<String>,
    /// Longest pause while reading a request body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub body_idle_timeout: Option<String>,
    /// Time in-flight requests get to finish on shutdown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[0-9]+(ms|s|m|h)$"))]
    pub drain_timeout: Option<String>,
}

/// Proxies trusted to report the client address (`X-Forwarded-For`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpSpec {
    /// Addresses or CIDRs (`10.0.0.0/8`, `192.0.2.7`) of proxies whose `X-Forwarded-For` is
    /// believed. Unset or empty: the peer address is the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub trusted_proxies: Option<Vec<String>>,
    /// At most this many `X-Forwarded-For` entries are walked from the right while they
    /// belong to trusted proxies (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub forwarded_for_depth: Option<i32>,
}

/// Access log settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Logging {
    /// Write an access log line per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<bool>,
    /// `json` (default) or `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
}

/// Log line format.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Service created per Gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.externalTrafficPolicy) || !has(self.type) || self.type != 'ClusterIP'",
     "message": "externalTrafficPolicy needs a LoadBalancer or NodePort Service"}
]))]
pub struct GatewayServiceSpec {
    /// `LoadBalancer` (default), `NodePort` or `ClusterIP`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,
    /// `Cluster` (default) or `Local` (keeps client source addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<ExternalTrafficPolicy>,
}

/// Kubernetes Service type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    /// An external load balancer (default).
    LoadBalancer,
    /// A port on every node.
    NodePort,
    /// Cluster-internal only.
    ClusterIP,
}

/// Kubernetes `externalTrafficPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExternalTrafficPolicy {
    /// Spread over all nodes (client address lost).
    Cluster,
    /// Only nodes running the dataplane (client address kept).
    Local,
}
