//! Status as `translate` computes it: the Kubernetes shapes minus anything clock-dependent.
//!
//! Conditions carry no `lastTransitionTime`; the status writer adds it (keeping the old time when
//! type, status and reason did not change), so `translate` stays pure and its goldens stable.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One condition, as in `metav1.Condition` without `lastTransitionTime`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type, e.g. `Accepted`, `Programmed`, `ResolvedRefs`.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// CamelCase cause, e.g. `NoMatchingParent`; the Gateway API lists the standard ones.
    pub reason: String,
    /// What a user should read: the object or field at fault and why.
    pub message: String,
    /// `metadata.generation` of the object the condition was computed from.
    pub observed_generation: i64,
}

impl Condition {
    /// A condition with status "True" or "False".
    pub fn new(
        type_: &str,
        ok: bool,
        reason: &str,
        message: impl Into<String>,
        generation: i64,
    ) -> Self {
        Condition {
            type_: type_.to_string(),
            status: if ok { "True" } else { "False" }.to_string(),
            reason: reason.to_string(),
            message: message.into(),
            observed_generation: generation,
        }
    }
}

/// Identifies one object whose status `translate` computed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    /// Kind, e.g. `HTTPRoute`, `Gateway`, `Ingress`, `SweetySite`.
    pub kind: String,
    /// Empty for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Object name.
    pub name: String,
}

impl ObjectKey {
    /// The key of object `name` of `kind` in `namespace` (empty for cluster-scoped kinds).
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        ObjectKey {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// A reference to a parent (Gateway or ListenerSet) in route status.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// API group; absent means `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Gateway` or `ListenerSet`; absent means `Gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Absent means the route's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Parent name.
    pub name: String,
    /// The listener the route asked for, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// The listener port the route asked for, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `status.parents[]` of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent exactly as the route referenced it.
    pub parent_ref: ParentRef,
    /// This controller's name (the GatewayClass `controllerName`).
    pub controller_name: String,
    /// `Accepted` and `ResolvedRefs` of the route on this parent.
    pub conditions: Vec<Condition>,
}

/// Status of an HTTPRoute, GRPCRoute, TLSRoute, TCPRoute or UDPRoute. Only the parents this
/// controller manages are listed; the writer leaves other controllers' entries alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// One entry per parent of ours the route references.
    pub parents: Vec<RouteParentStatus>,
}

/// `status.listeners[]` of a Gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// The listener's name in the Gateway.
    pub name: String,
    /// Route kinds the listener accepts (after its `allowedRoutes.kinds`).
    pub supported_kinds: Vec<RouteGroupKind>,
    /// Routes accepted on the listener.
    pub attached_routes: i32,
    /// `Accepted`, `Programmed`, `ResolvedRefs` and `Conflicted` of the listener.
    pub conditions: Vec<Condition>,
}

/// A route kind a listener accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// API group of the kind, e.g. `gateway.networking.k8s.io`.
    pub group: String,
    /// Route kind, e.g. `HTTPRoute`.
    pub kind: String,
}

/// `status.addresses[]` of a Gateway (and SweetySite).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Address {
    /// `IPAddress` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The IP address or host name.
    pub value: String,
}

/// Status of a Gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Where clients reach the Gateway (its Service's load-balancer addresses).
    pub addresses: Vec<Address>,
    /// `Accepted` and `Programmed` of the Gateway.
    pub conditions: Vec<Condition>,
    /// One entry per listener, in spec order.
    pub listeners: Vec<ListenerStatus>,
    /// ListenerSets attached and accepted (left out when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attached_listener_sets: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// Status of a ListenerSet: its conditions and its listeners (as a Gateway's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SetStatus {
    /// `Accepted` and `Programmed` of the ListenerSet.
    pub conditions: Vec<Condition>,
    /// One entry per listener of the set, in spec order.
    pub listeners: Vec<ListenerStatus>,
}

/// Status of a GatewayClass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    /// `Accepted` of the class (false when its parameters are invalid).
    pub conditions: Vec<Condition>,
    /// Feature names, sorted, as `status.supportedFeatures[].name`.
    pub supported_features: Vec<String>,
}

/// Status of a BackendTLSPolicy: one ancestor entry per Gateway it takes effect through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// One entry per Gateway (ancestor) the policy applies through.
    pub ancestors: Vec<RouteParentStatus>,
}

/// Ingress `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    /// The address when the load balancer has an IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The DNS name when the load balancer has one instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// Status of an Ingress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct IngressStatus {
    /// Addresses of the Ingress Service (`Params::ingress_service`).
    pub load_balancer: Vec<LoadBalancerIngress>,
}

/// Status of a SweetySite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SiteStatus {
    /// `Accepted`, `ResolvedRefs` and `Programmed` of the Site.
    pub conditions: Vec<Condition>,
    /// Where clients reach the Site.
    pub addresses: Vec<Address>,
}

/// The status `translate` computed for one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ObjectStatus {
    /// A GatewayClass's conditions and supported features.
    GatewayClass(GatewayClassStatus),
    /// A Gateway's addresses, conditions and listeners.
    Gateway(GatewayStatus),
    /// A ListenerSet's conditions and listeners.
    ListenerSet(SetStatus),
    /// A route's entries for our parents.
    Route(RouteStatus),
    /// A BackendTLSPolicy's ancestor entries.
    Policy(PolicyStatus),
    /// An Ingress's load-balancer addresses.
    Ingress(IngressStatus),
    /// A SweetySite's conditions and addresses.
    Site(SiteStatus),
    /// Conditions only (SweetyProxyConfig, IngressClass diagnostics).
    Conditions(Vec<Condition>),
}

/// All statuses, in a deterministic order.
pub type Statuses = BTreeMap<ObjectKey, ObjectStatus>;
