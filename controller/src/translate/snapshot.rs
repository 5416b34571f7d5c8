//! The input of `translate`: every object the controller watches, as plain lists.
//!
//! The watch layer fills it from reflector stores (cheap `Arc` clones); golden tests fill it from
//! a multi-document YAML file with [`Snapshot::from_yaml`]. Order inside a list does not matter:
//! `translate` sorts whatever it iterates.

use crate::Error;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde::Deserialize;
use std::sync::Arc;
use sweety_crds::{SweetyProxyConfig, SweetySecurityPolicy, SweetySite};
use sweety_gateway_api as gw;

/// The key of a CA bundle in a ConfigMap (or Secret) that a Gateway or BackendTLSPolicy names.
pub const CA_KEY: &str = "ca.crt";

/// A consistent view of the cluster objects `translate` reads.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// IngressClasses (cluster-scoped).
    pub ingress_classes: Vec<Arc<IngressClass>>,
    /// Ingresses of every class; translate keeps its own.
    pub ingresses: Vec<Arc<Ingress>>,
    /// GatewayClasses (cluster-scoped).
    pub gateway_classes: Vec<Arc<gw::gatewayclasses::GatewayClass>>,
    /// Gateways of every class; translate keeps those of its classes.
    pub gateways: Vec<Arc<gw::gateways::Gateway>>,
    /// HTTPRoutes.
    pub http_routes: Vec<Arc<gw::httproutes::HttpRoute>>,
    /// GRPCRoutes.
    pub grpc_routes: Vec<Arc<gw::grpcroutes::GrpcRoute>>,
    /// TLSRoutes (SNI passthrough).
    pub tls_routes: Vec<Arc<gw::tlsroutes::TlsRoute>>,
    /// TCPRoutes.
    pub tcp_routes: Vec<Arc<gw::tcproutes::TcpRoute>>,
    /// UDPRoutes.
    pub udp_routes: Vec<Arc<gw::udproutes::UdpRoute>>,
    /// ReferenceGrants, which allow references into their namespace.
    pub reference_grants: Vec<Arc<gw::referencegrants::ReferenceGrant>>,
    /// BackendTLSPolicies: how HTTPS backends are verified.
    pub backend_tls_policies: Vec<Arc<gw::backendtlspolicies::BackendTlsPolicy>>,
    /// ListenerSets: listeners attached to Gateways from other objects.
    pub listener_sets: Vec<Arc<gw::listenersets::ListenerSet>>,
    /// SweetySites: whole sites in one object each.
    pub sites: Vec<Arc<SweetySite>>,
    /// SweetyProxyConfigs: dataplane settings of a GatewayClass (`parametersRef`).
    pub proxy_configs: Vec<Arc<SweetyProxyConfig>>,
    /// SweetySecurityPolicies: authentication, client certificates and IP rules attached to
    /// Gateways and HTTPRoutes.
    pub security_policies: Vec<Arc<SweetySecurityPolicy>>,
    /// Services: backends' ports and types.
    pub services: Vec<Arc<Service>>,
    /// EndpointSlices: backends' addresses and readiness.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// Only `kubernetes.io/tls` Secrets that something references.
    pub secrets: Vec<Arc<Secret>>,
    /// Only ConfigMaps that something references (static content, CA bundles).
    pub config_maps: Vec<Arc<ConfigMap>>,
    /// Namespaces (labels drive Gateway `allowedRoutes` namespace selectors).
    pub namespaces: Vec<Arc<Namespace>>,
    /// Where the route lists stand in the watch layer's journal of route changes (`None`:
    /// unknown, as for golden inputs).
    pub routes_at: Option<u64>,
    /// The route objects that changed since an earlier journal position (`None`: unknown).
    /// With it, the translate cache visits only these routes, not every route of the lists
    /// (see [`RouteChanges`]).
    pub routes_changed: Option<RouteChanges>,
    /// Where the lists stand in the watch layer's journal of objects created under a name
    /// (read before the lists, so every object it covers is in them; `None`: unknown). The
    /// status worker takes a created object from that journal only once a translation of a
    /// snapshot covering it was offered (see [`crate::status_worker`]).
    pub created_at: Option<u64>,
}

/// The route objects that may differ between the snapshot at journal position `since` and
/// this one ([`Snapshot::routes_at`]), each with its object in this snapshot (`None`: gone).
/// A route object that differs must be listed; a listed one may be unchanged. The watch
/// layer fills it from its journal; [`RouteChanges::between`] computes it by comparison.
#[derive(Clone, Debug, Default)]
pub struct RouteChanges {
    /// The journal position of the earlier snapshot.
    pub since: u64,
    /// The route objects that may have changed, each listed once.
    pub routes: Vec<ChangedRoute>,
}

/// One route object of [`RouteChanges`].
#[derive(Clone, Debug)]
pub struct ChangedRoute {
    /// `HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute` or `UDPRoute`.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The object in this snapshot; `None` when it is gone.
    pub object: Option<RouteObject>,
}

/// A route object of one of the route kinds.
#[derive(Clone, Debug)]
pub enum RouteObject {
    /// An HTTPRoute.
    Http(Arc<gw::httproutes::HttpRoute>),
    /// A GRPCRoute.
    Grpc(Arc<gw::grpcroutes::GrpcRoute>),
    /// A TLSRoute.
    Tls(Arc<gw::tlsroutes::TlsRoute>),
    /// A TCPRoute.
    Tcp(Arc<gw::tcproutes::TcpRoute>),
    /// A UDPRoute.
    Udp(Arc<gw::udproutes::UdpRoute>),
}

impl RouteChanges {
    /// The route objects of `next` that are not those of `prev` (by `Arc` identity), and
    /// those of `prev` gone from `next`: what the watch layer's journal lists between two
    /// snapshots, computed by comparing every route (tests and tools).
    pub fn between(prev: &Snapshot, next: &Snapshot) -> RouteChanges {
        use std::collections::BTreeMap;
        type Key = (&'static str, String, String);
        let mut before: BTreeMap<Key, usize> = BTreeMap::new();
        let mut routes = Vec::new();
        macro_rules! diff {
            ($list:ident, $kind:literal, $variant:ident) => {
                for r in &prev.$list {
                    before.insert(key($kind, &r.metadata), Arc::as_ptr(r) as usize);
                }
                for r in &next.$list {
                    let k = key($kind, &r.metadata);
                    if before.remove(&k) != Some(Arc::as_ptr(r) as usize) {
                        routes.push(ChangedRoute {
                            kind: $kind,
                            namespace: k.1,
                            name: k.2,
                            object: Some(RouteObject::$variant(r.clone())),
                        });
                    }
                }
            };
        }
        fn key(
            kind: &'static str,
            m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        ) -> (&'static str, String, String) {
            (
                kind,
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            )
        }
        diff!(http_routes, "HTTPRoute", Http);
        diff!(grpc_routes, "GRPCRoute", Grpc);
        diff!(tls_routes, "TLSRoute", Tls);
        diff!(tcp_routes, "TCPRoute", Tcp);
        diff!(udp_routes, "UDPRoute", Udp);
        for ((kind, namespace, name), _) in before {
            routes.push(ChangedRoute {
                kind,
                namespace,
                name,
                object: None,
            });
        }
        RouteChanges {
            since: prev.routes_at.unwrap_or_default(),
            routes,
        }
    }
}

#[derive(Deserialize)]
struct TypeMeta {
    #[serde(default)]
    kind: String,
}

impl Snapshot {
    /// The [`CA_KEY`] of ConfigMap `namespace/name`: `None` when there is no such
    /// ConfigMap, `Some(None)` when it has no `ca.crt`.
    pub fn config_map_ca(&self, namespace: &str, name: &str) -> Option<Option<&str>> {
        self.config_maps
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
                    && c.metadata.name.as_deref() == Some(name)
            })
            .map(|c| {
                c.data
                    .as_ref()
                    .and_then(|d| d.get(CA_KEY))
                    .map(String::as_str)
            })
    }

    /// Parse a multi-document YAML stream of Kubernetes objects (golden inputs, examples).
    /// Documents of kinds `translate` does not read are an error, so typos do not go unnoticed.
    /// Returns the snapshot and any `kind: TranslateParams` document (test-only overrides).
    pub fn from_yaml(text: &str) -> Result<(Snapshot, Option<serde_yaml::Value>), Error> {
        let mut s = Snapshot::default();
        let mut params = None;
        for doc in serde_yaml::Deserializer::from_str(text) {
            let value =
                serde_yaml::Value::deserialize(doc).map_err(|e| parse_err("document", e))?;
            if value.is_null() {
                continue;
            }
            let meta: TypeMeta =
                serde_yaml::from_value(value.clone()).map_err(|e| parse_err("kind", e))?;
            macro_rules! push {
                ($field:ident) => {
                    s.$field.push(Arc::new(
                        serde_yaml::from_value(value).map_err(|e| parse_err(&meta.kind, e))?,
                    ))
                };
            }
            match meta.kind.as_str() {
                "IngressClass" => push!(ingress_classes),
                "Ingress" => push!(ingresses),
                "GatewayClass" => push!(gateway_classes),
                "Gateway" => push!(gateways),
                "HTTPRoute" => push!(http_routes),
                "GRPCRoute" => push!(grpc_routes),
                "TLSRoute" => push!(tls_routes),
                "TCPRoute" => push!(tcp_routes),
                "UDPRoute" => push!(udp_routes),
                "ReferenceGrant" => push!(reference_grants),
                "ListenerSet" => push!(listener_sets),
                "BackendTLSPolicy" => push!(backend_tls_policies),
                "SweetySite" => push!(sites),
                "SweetyProxyConfig" => push!(proxy_configs),
                "SweetySecurityPolicy" => push!(security_policies),
                "Service" => push!(services),
                "EndpointSlice" => push!(endpoint_slices),
                "Secret" => push!(secrets),
                "ConfigMap" => push!(config_maps),
                "Namespace" => push!(namespaces),
                "TranslateParams" => params = Some(value),
                other => {
                    return Err(Error::Parse {
                        what: format!("unsupported kind {other:?}"),
                        source: serde::de::Error::custom("not an input of translate"),
                    })
                }
            }
        }
        Ok((s, params))
    }
}

fn parse_err(what: &str, source: serde_yaml::Error) -> Error {
    Error::Parse {
        what: what.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_map_ca_tells_missing_config_maps_from_missing_keys() {
        let (s, _) = Snapshot::from_yaml(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ca, namespace: app}\ndata: {ca.crt: PEM}\n---\n\
apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: app}\ndata: {index.html: hi}\n",
        )
        .unwrap();
        assert_eq!(s.config_map_ca("app", "ca"), Some(Some("PEM")));
        assert_eq!(s.config_map_ca("app", "other"), Some(None));
        assert_eq!(s.config_map_ca("app", "missing"), None);
        assert_eq!(s.config_map_ca("elsewhere", "ca"), None);
    }
}
