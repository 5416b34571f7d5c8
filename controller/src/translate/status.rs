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
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    pub reason: String,
    pub message: String,
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
    pub name: String,
}

impl ObjectKey {
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `status.parents[]` of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentRef,
    pub controller_name: String,
    pub conditions: Vec<Condition>,
}

/// Status of an HTTPRoute, GRPCRoute, TLSRoute, TCPRoute or UDPRoute. Only the parents this
/// controller manages are listed; the writer leaves other controllers' entries alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    pub parents: Vec<RouteParentStatus>,
}

/// `status.listeners[]` of a Gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    pub name: String,
    pub supported_kinds: Vec<RouteGroupKind>,
    pub attached_routes: i32,
    pub conditions: Vec<Condition>,
}

/// A route kind a listener accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    pub group: String,
    pub kind: String,
}

/// `status.addresses[]` of a Gateway (and SweetySite).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Address {
    /// `IPAddress` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    pub value: String,
}

/// Status of a Gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    pub addresses: Vec<Address>,
    pub conditions: Vec<Condition>,
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
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
}

/// Status of a GatewayClass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    pub conditions: Vec<Condition>,
    /// Feature names, sorted, as `status.supportedFeatures[].name`.
    pub supported_features: Vec<String>,
}

/// Status of a BackendTLSPolicy: one ancestor entry per Gateway it takes effect through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    pub ancestors: Vec<RouteParentStatus>,
}

/// Ingress `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// Status of an Ingress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct IngressStatus {
    pub load_balancer: Vec<LoadBalancerIngress>,
}

/// Status of a SweetySite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SiteStatus {
    pub conditions: Vec<Condition>,
    pub addresses: Vec<Address>,
}

/// The status `translate` computed for one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ObjectStatus {
    GatewayClass(GatewayClassStatus),
    Gateway(GatewayStatus),
    ListenerSet(SetStatus),
    Route(RouteStatus),
    Policy(PolicyStatus),
    Ingress(IngressStatus),
    Site(SiteStatus),
    /// Conditions only (SweetyProxyConfig, IngressClass diagnostics).
    Conditions(Vec<Condition>),
}

/// All statuses, in a deterministic order.
pub type Statuses = BTreeMap<ObjectKey, ObjectStatus>;
