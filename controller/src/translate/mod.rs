//! `translate`: a pure function from a [`Snapshot`] of Kubernetes objects to the dataplane
//! [`Config`] plus the status of every object it looked at.
//!
//! No I/O, no clock, no randomness: the same snapshot and [`Params`] always give the same
//! output, in a deterministic order. Invalid objects get a status condition saying why and are
//! left out; they never stop the rest from applying. Golden tests in `testdata/translate/`
//! pin the behaviour (`SWEETY_BLESS=1` regenerates them).
//!
//! Layout: `snapshot` (the input), `status` (the status shapes), `backends` (Service and
//! EndpointSlice resolution shared by every front end), `ingress`, `gateway` (Gateway API),
//! `site` (SweetySite), `ownership` (which namespace serves an Ingress/SweetySite hostname)
//! and `addressing` (per-Gateway Services and their ports); `cache`
//! (`translate_incremental`: the same output, reusing unchanged routes' translations).

pub mod addressing;
pub mod backends;
pub mod cache;
pub mod cert_names;
pub mod gateway;
pub mod ingress;
pub mod ownership;
pub mod proxy_settings;
pub mod site;
pub mod snapshot;
pub mod status;

#[cfg(test)]
mod golden_tests;

use backends::{Backends, ServiceIndex};
pub use cache::{translate_incremental, CacheStats, StatusChanges, TranslateCache, Translation};
use serde::{Deserialize, Serialize};
pub use snapshot::{ChangedRoute, RouteChanges, RouteObject, Snapshot};

/// The world `examples/scale.rs` measures: one GatewayClass and Gateway, `services` Services
/// with an EndpointSlice each, and `routes` HTTPRoutes of two rules on their own hostnames. Kept
/// in the library so the benchmark and the test that it takes the fast path share one shape.
pub fn scale_world(routes: usize, services: usize) -> String {
    let mut y = String::new();
    y.push_str(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety, generation: 1}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: bench, generation: 1}\n\
spec:\n  gatewayClassName: sweety\n  addresses: [{type: IPAddress, value: 127.0.0.1}]\n  listeners: [{name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Same}}}]\n---\n",
    );
    for s in 0..services {
        y.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: bench}}\nspec: {{ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{s}-a, namespace: bench, labels: {{kubernetes.io/service-name: svc-{s}}}}}\n\
addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.244.{}.{}]}}, {{addresses: [10.244.{}.{}]}}]\n---\n",
            s / 100, s % 100 + 1, s / 100 + 100, s % 100 + 1
        ));
    }
    for r in 0..routes {
        y.push_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r-{r}, namespace: bench, generation: 1, creationTimestamp: \"2026-01-01T00:00:00Z\"}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [r{r}.bench.test]\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: /api}}}}]\n    backendRefs: [{{name: svc-{}, port: 80}}]\n  - backendRefs: [{{name: svc-{}, port: 80}}]\n---\n",
            r % services,
            (r + 1) % services
        ));
    }
    y
}
use status::{ObjectKey, ObjectStatus, Statuses};
use std::collections::BTreeMap;
use sweety_config::{Config, Listener, VirtualHost};

/// Settings of this controller installation that shape the output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Params {
    /// GatewayClass `spec.controllerName` we own.
    pub controller_name: String,
    /// IngressClass names we serve (Ingresses naming one, or none when one is the default
    /// class); only those whose `spec.controller` is [`Params::ingress_controller`] count.
    pub ingress_classes: Vec<String>,
    /// IngressClass `spec.controller` we own.
    pub ingress_controller: String,
    /// Namespace of the controller (and of the dataplane Pods): per-Gateway Services are
    /// created here unless [`Params::gateway_service_namespace`] says `gateway`.
    pub namespace: String,
    /// The chart's Service that carries Ingress traffic; its load-balancer status becomes every
    /// Ingress's `status.loadBalancer`.
    pub ingress_service: Option<String>,
    /// Dataplane container port for Ingress (and SweetySite) HTTP.
    pub ingress_http_port: u16,
    /// Dataplane container port for Ingress (and SweetySite) HTTPS.
    pub ingress_https_port: u16,
    /// First dataplane container port handed out to Gateway listeners (≥1024).
    pub gateway_port_min: u16,
    /// Last dataplane container port handed out to Gateway listeners (inclusive).
    pub gateway_port_max: u16,
    /// Address dataplane listeners bind.
    pub listen_address: String,
    /// Directory (shared with the dataplane) where ConfigMap static content is written.
    pub content_dir: String,
    /// Serve HTTP/3 on HTTPS listeners unless a SweetyProxyConfig or SweetySite says otherwise.
    pub http3: bool,
    /// The cluster-wide default backend of Ingress (`namespace/service:port`): serves requests
    /// for unknown hosts and unmatched paths of hosts without their own `spec.defaultBackend`.
    /// Only this setting makes one; an Ingress's `spec.defaultBackend` covers its own hosts.
    pub default_backend: Option<String>,
    /// Namespaces whose Ingresses may share hostnames (ingress-nginx's merge), besides those
    /// annotated [`ownership::SHARE_ANNOTATION`]. See [`ownership`].
    pub shared_host_namespaces: Vec<String>,
    /// Hostnames or `*.` patterns pinned to namespaces (namespace → patterns), besides the
    /// [`ownership::PINNED_ANNOTATION`] of Namespaces: never served from another namespace.
    pub pinned_hostnames: BTreeMap<String, Vec<String>>,
    /// The certificate of HTTPS connections to the Ingress listener without SNI or with a name
    /// no certificate covers (never a tenant's). The controller fills it from its configured
    /// Secret or a generated self-signed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<DefaultCertificate>,
    /// The configured default-certificate Secret (`namespace/name`). While the snapshot holds
    /// it with a usable certificate, it is served instead of [`Params::default_certificate`]
    /// (what was read at start), so rotating the Secret rotates the served certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_certificate_secret: Option<String>,
    /// Serve Ingress paths whose security annotations Sweety does not implement (auth-*,
    /// modsecurity, …) without that protection, instead of answering 403.
    pub ignore_unsupported_security_annotations: bool,
    /// Serve Ingresses carrying `*-snippet` annotations without the snippet, instead of
    /// refusing the whole Ingress.
    pub ignore_snippets: bool,
    /// Resolve ExternalName Services as backends (off: such a backend answers 503).
    pub allow_external_name: bool,
    /// Redirect plain-HTTP requests for Ingress hosts with TLS to HTTPS (308) unless an
    /// Ingress says `ssl-redirect: "false"`: ingress-nginx's `ssl-redirect` default.
    pub ssl_redirect: bool,
    /// Path prefixes never redirected to HTTPS (ingress-nginx's `no-tls-redirect-locations`,
    /// default `/.well-known/acme-challenge`, so HTTP-01 challenges keep working).
    pub no_tls_redirect_locations: Vec<String>,
    /// `Strict-Transport-Security` on HTTPS responses of Ingress hosts with TLS: `max-age`
    /// in seconds (0: no header). ingress-nginx's default: a year.
    pub hsts_max_age: u64,
    /// HSTS `includeSubDomains` (ingress-nginx's default: on).
    pub hsts_include_subdomains: bool,
    /// HSTS `preload` (ingress-nginx's default: off).
    pub hsts_preload: bool,
    /// Type of the per-Gateway Services (`LoadBalancer`, `NodePort` or `ClusterIP`) unless the
    /// GatewayClass's SweetyProxyConfig sets `service.type`.
    pub gateway_service_type: String,
    /// Where the per-Gateway Services live: the controller's namespace (default, as Envoy
    /// Gateway does) or each Gateway's own namespace.
    pub gateway_service_namespace: GatewayServiceNamespace,
}

/// Where the per-Gateway Services live (`--gateway-service-namespace`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GatewayServiceNamespace {
    /// The controller's (release) namespace: a plain selector reaches the dataplane Pods, and
    /// the controller writes Services there only.
    #[default]
    Release,
    /// The Gateway's namespace: selector-less, with EndpointSlices the controller mirrors
    /// from the dataplane Service's (needs write access to Services and EndpointSlices there).
    Gateway,
}

impl std::str::FromStr for GatewayServiceNamespace {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "release" => Ok(Self::Release),
            "gateway" => Ok(Self::Gateway),
            _ => Err(format!("{s:?}: expected `release` or `gateway`")),
        }
    }
}

impl Params {
    /// The namespace of the Service of a Gateway in `gateway_namespace`.
    pub fn gateway_service_namespace<'a>(&'a self, gateway_namespace: &'a str) -> &'a str {
        match self.gateway_service_namespace {
            GatewayServiceNamespace::Release => &self.namespace,
            GatewayServiceNamespace::Gateway => gateway_namespace,
        }
    }
}

/// PEM certificate chain and key of [`Params::default_certificate`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefaultCertificate {
    /// PEM certificate chain, leaf first.
    pub cert: String,
    /// PEM private key of the leaf.
    pub key: String,
}

impl std::fmt::Debug for DefaultCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DefaultCertificate(..)")
    }
}

impl Default for Params {
    fn default() -> Self {
        Params {
            controller_name: "sweety.dev/gateway-controller".into(),
            ingress_classes: vec!["sweety".into()],
            ingress_controller: "sweety.dev/ingress-controller".into(),
            namespace: "sweety".into(),
            ingress_service: Some("sweety".into()),
            ingress_http_port: 8080,
            ingress_https_port: 8443,
            gateway_port_min: 20000,
            gateway_port_max: 29999,
            listen_address: "0.0.0.0".into(),
            content_dir: "/var/run/sweety/content".into(),
            http3: true,
            default_backend: None,
            shared_host_namespaces: Vec::new(),
            pinned_hostnames: BTreeMap::new(),
            default_certificate: None,
            default_certificate_secret: None,
            ignore_unsupported_security_annotations: false,
            ignore_snippets: false,
            allow_external_name: false,
            ssl_redirect: true,
            no_tls_redirect_locations: vec!["/.well-known/acme-challenge".into()],
            hsts_max_age: 31_536_000,
            hsts_include_subdomains: true,
            hsts_preload: false,
            gateway_service_type: "LoadBalancer".into(),
            gateway_service_namespace: GatewayServiceNamespace::Release,
        }
    }
}

/// One port of a controller-owned per-Gateway Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Port name in the Service: protocol and port, e.g. `tcp-443`, `udp-53`.
    pub name: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The Gateway listener port clients use.
    pub port: u16,
    /// The dataplane container port it maps to.
    pub target_port: u16,
}

/// The Service the controller owns for one Gateway (in [`Params::gateway_service_namespace`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayService {
    /// Namespace of the Gateway (and of its Service).
    pub gateway_namespace: String,
    /// Name of the Gateway the Service carries traffic for.
    pub gateway_name: String,
    /// Namespace of the Service: the controller's, or the Gateway's.
    pub namespace: String,
    /// Service name ([`addressing::service_name`]: `sweety-gw-<readable>-<hash of namespace/name>`).
    pub name: String,
    /// `Params::gateway_service_type` unless the GatewayClass parameters say otherwise.
    pub service_type: String,
    /// `externalTrafficPolicy` from the GatewayClass parameters (NodePort and LoadBalancer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<String>,
    /// The Gateway's GatewayClass, owner of the Service and its EndpointSlices: deleting the
    /// class (`helm uninstall`) lets the garbage collector remove them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<ClassOwner>,
    /// One port per distinct listener port and protocol.
    pub ports: Vec<ServicePort>,
    /// Addresses requested through Gateway `spec.addresses` (IP values), if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested_addresses: Vec<String>,
    /// Gateway `spec.infrastructure.labels` for the Service (ours win on a clash).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Gateway `spec.infrastructure.annotations` for the Service (ours win on a clash).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A GatewayClass as an owner reference (cluster-scoped, so it may own namespaced objects).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassOwner {
    /// The GatewayClass's name.
    pub name: String,
    /// Its `metadata.uid`, which the owner reference needs.
    pub uid: String,
}

/// A directory of static files built from a ConfigMap, to be written under
/// `Params::content_dir` before the config that serves it is pushed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticContent {
    /// Absolute directory path (inside `content_dir`, named by content hash).
    pub dir: String,
    /// File name → contents.
    pub files: BTreeMap<String, String>,
}

/// Everything `translate` produces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    /// The dataplane config to push.
    pub config: Config,
    /// The status of every object `translate` looked at, to be written when leader.
    #[serde(with = "status_list")]
    pub statuses: Statuses,
    /// The per-Gateway Services to create or update (sorted by name).
    pub gateway_services: Vec<GatewayService>,
    /// Static file directories to write before the config that serves them is pushed.
    pub static_content: Vec<StaticContent>,
}

/// Escape regex metacharacters so a literal can sit inside a dataplane regex.
pub(crate) fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Translate a snapshot. Pure: see the module docs.
pub fn translate(snapshot: &Snapshot, params: &Params) -> Output {
    let mut b = Builder::new(snapshot, params);
    let (settings, statuses) = proxy_settings::settings(snapshot, params);
    b.config = settings;
    for (key, status) in statuses {
        b.status(key, status);
    }
    gateway::translate(&mut b);
    let ingress_hosts = ingress::translate(&mut b);
    site::translate(&mut b, &ingress_hosts);
    b.finish()
}

/// Shared state the front ends (`gateway`, `ingress`, `site`) add to.
pub struct Builder<'a> {
    /// What is being translated.
    pub snapshot: &'a Snapshot,
    /// The installation's settings.
    pub params: &'a Params,
    /// Services by namespace and name, to resolve backend references.
    pub services: ServiceIndex<'a>,
    /// Backends emitted so far, by name (one per Service port and settings).
    pub backends: Backends,
    /// Listeners emitted so far.
    pub listeners: Vec<Listener>,
    /// Virtual hosts emitted so far.
    pub virtual_hosts: Vec<VirtualHost>,
    /// Statuses computed so far.
    pub statuses: Statuses,
    /// Per-Gateway Services wanted so far.
    pub gateway_services: Vec<GatewayService>,
    /// Static content directories wanted so far.
    pub static_content: Vec<StaticContent>,
    /// The settings (limits, access log, client address) of the SweetyProxyConfigs in effect
    /// ([`proxy_settings`]); `finish` adds the lists.
    pub config: Config,
}

impl<'a> Builder<'a> {
    /// An empty builder over `snapshot`; ExternalName Services resolve only if `params` allow them.
    pub fn new(snapshot: &'a Snapshot, params: &'a Params) -> Self {
        Builder {
            snapshot,
            params,
            services: {
                let mut index = ServiceIndex::new(snapshot);
                index.allow_external_name = params.allow_external_name;
                index
            },
            backends: Backends::new(),
            listeners: Vec::new(),
            virtual_hosts: Vec::new(),
            statuses: Statuses::new(),
            gateway_services: Vec::new(),
            static_content: Vec::new(),
            config: Config::default(),
        }
    }

    /// Record the status of one object (last write wins).
    pub fn status(&mut self, key: ObjectKey, status: ObjectStatus) {
        self.statuses.insert(key, status);
    }

    /// Assemble the output in a deterministic order.
    pub fn finish(self) -> Output {
        let mut config = self.config;
        let mut listeners = self.listeners;
        listeners.sort_by(|a, b| a.name.cmp(&b.name));
        let mut virtual_hosts = self.virtual_hosts;
        virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
        config.listeners = listeners;
        config.virtual_hosts = virtual_hosts;
        config.backends = self.backends.into_config();
        let mut gateway_services = self.gateway_services;
        gateway_services.sort_by(|a, b| a.name.cmp(&b.name));
        let mut static_content = self.static_content;
        static_content.sort_by(|a, b| a.dir.cmp(&b.dir));
        Output {
            config,
            statuses: self.statuses,
            gateway_services,
            static_content,
        }
    }
}

/// Statuses serialize as a list of `{kind, namespace, name, status}` (YAML maps need string keys).
mod status_list {
    use super::status::{ObjectKey, ObjectStatus, Statuses};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Entry {
        #[serde(flatten)]
        key: ObjectKey,
        status: ObjectStatus,
    }

    pub(super) fn serialize<S: Serializer>(s: &Statuses, ser: S) -> Result<S::Ok, S::Error> {
        let v: Vec<Entry> = s
            .iter()
            .map(|(k, v)| Entry {
                key: k.clone(),
                status: v.clone(),
            })
            .collect();
        v.serialize(ser)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Statuses, D::Error> {
        let v = Vec::<Entry>::deserialize(de)?;
        Ok(v.into_iter().map(|e| (e.key, e.status)).collect())
    }
}
