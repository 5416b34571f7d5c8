//! Gateway addressing: each Gateway gets a controller-owned Service (in the controller's
//! namespace by default, or in the Gateway's: [`Params::gateway_service_namespace`]) whose
//! ports map the Gateway's listener ports onto dataplane container ports allocated here,
//! stable across restarts (existing Services are read back) and never colliding. A Gateway's
//! Service is read back from either place, the current one first, so a release that moves
//! the Services (or a change of the setting) keeps each Gateway's container ports.
//!
//! Allocation is deterministic: first every Gateway keeps the container ports its existing
//! Service already maps (when still free and in range), then the remaining ports take the
//! lowest free port of `[gateway_port_min, gateway_port_max]`, Gateways in namespace/name order.

use super::status::Address;
use super::{Params, Snapshot};
use crate::labels::{GATEWAY_NAME_LABEL, MANAGED_BY, MANAGED_BY_LABEL};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Prefix of every per-Gateway Service name.
pub const SERVICE_PREFIX: &str = "sweety-gw-";

/// The name of a Gateway's Service: `sweety-gw-<ns>-<name>`, a valid DNS label of at most 63
/// characters. When the plain form is too long or had to be altered, it is shortened and ends
/// with a hash of `<ns>/<name>` so distinct Gateways never share a name.
pub fn service_name(namespace: &str, name: &str) -> String {
    let plain = format!("{SERVICE_PREFIX}{namespace}-{name}");
    let cleaned: String = plain
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if cleaned == plain && plain.len() <= 63 {
        return plain;
    }
    let hash = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    let keep = 63 - hex.len() - 1;
    let head = cleaned[..cleaned.len().min(keep)].trim_end_matches('-');
    format!("{head}-{hex}")
}

/// A Gateway that needs container ports for these listener ports.
pub struct PortRequest {
    /// The Gateway's namespace.
    pub namespace: String,
    /// The Gateway's name.
    pub name: String,
    /// Its listener ports (what clients connect to).
    pub ports: BTreeSet<u16>,
}

/// Container port per (gateway index, listener port); `None` when the range is exhausted.
pub type Allocation = Vec<BTreeMap<u16, Option<u16>>>;

fn target_port(p: &k8s_openapi::api::core::v1::ServicePort) -> Option<u16> {
    match &p.target_port {
        Some(IntOrString::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    }
}

/// Allocate container ports for `requests` (any order; sorted here by namespace/name).
pub fn allocate(snapshot: &Snapshot, params: &Params, requests: &[PortRequest]) -> Allocation {
    let range = params.gateway_port_min..=params.gateway_port_max;
    // (namespace, name) of every Service we own: labelled ones anywhere, and those in the
    // controller's namespace named by prefix (an older release set no labels).
    let owned: Vec<_> = snapshot
        .services
        .iter()
        .filter(|s| {
            let name = s.metadata.name.as_deref().unwrap_or("");
            let labelled = s.metadata.labels.as_ref().is_some_and(|l| {
                l.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
                    && l.contains_key(GATEWAY_NAME_LABEL)
            });
            name.starts_with(SERVICE_PREFIX)
                && (labelled || s.metadata.namespace.as_deref() == Some(params.namespace.as_str()))
        })
        .collect();
    let names: Vec<String> = requests
        .iter()
        .map(|r| service_name(&r.namespace, &r.name))
        .collect();
    // Whether Service `s` is (or was, before the move) the Service of request `g`.
    let belongs = |s: &k8s_openapi::api::core::v1::Service, g: usize| {
        s.metadata.name.as_deref() == Some(names[g].as_str())
            && (s.metadata.namespace.as_deref() == Some(requests[g].namespace.as_str())
                || s.metadata.namespace.as_deref() == Some(params.namespace.as_str()))
    };
    // The current-location Service first, then the one in the other place.
    let ports_of = |g: usize| -> Vec<(u16, u16)> {
        let mut mine: Vec<_> = owned.iter().filter(|s| belongs(s, g)).collect();
        let current = params.gateway_service_namespace(&requests[g].namespace);
        mine.sort_by_key(|s| s.metadata.namespace.as_deref() != Some(current));
        mine.iter()
            .flat_map(|s| s.spec.iter().flat_map(|sp| sp.ports.iter().flatten()))
            .filter_map(|p| Some((u16::try_from(p.port).ok()?, target_port(p)?)))
            .collect()
    };
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        (&requests[a].namespace, &requests[a].name)
            .cmp(&(&requests[b].namespace, &requests[b].name))
    });
    // Ports held by owned Services that belong to none of the requesting Gateways (stale or
    // other Gateways) stay reserved.
    let mut used: BTreeSet<u16> = owned
        .iter()
        .filter(|s| !(0..requests.len()).any(|g| belongs(s, g)))
        .flat_map(|s| s.spec.iter().flat_map(|sp| sp.ports.iter().flatten()))
        .filter_map(target_port)
        .collect();
    let mut out: Allocation = requests
        .iter()
        .map(|r| r.ports.iter().map(|p| (*p, None)).collect())
        .collect();
    // Pass 1: keep what existing Services map.
    for &g in &order {
        for (port, target) in ports_of(g) {
            if let Some(slot) = out[g].get_mut(&port) {
                if slot.is_none() && range.contains(&target) && !used.contains(&target) {
                    *slot = Some(target);
                    used.insert(target);
                }
            }
        }
    }
    // Pass 2: the lowest free port for the rest.
    let mut next = params.gateway_port_min;
    for &g in &order {
        for slot in out[g].values_mut().filter(|s| s.is_none()) {
            while next <= params.gateway_port_max && used.contains(&next) {
                next += 1;
            }
            if next <= params.gateway_port_max && range.contains(&next) {
                *slot = Some(next);
                used.insert(next);
            }
        }
    }
    out
}

/// Service status condition a load balancer sets (status False) when it cannot give the
/// Service the address requested in `spec.loadBalancerIP` (the e2e node agent's allocator
/// does; other load balancers leave the Gateway `AddressNotAssigned` instead).
pub const ADDRESS_USABLE_CONDITION: &str = "sweety.dev/LoadBalancerAddressUsable";

/// The Gateway's Service `service` in `namespace` ([`Params::gateway_service_namespace`]).
fn gateway_service<'s>(
    snapshot: &'s Snapshot,
    namespace: &str,
    service: &str,
) -> Option<&'s k8s_openapi::api::core::v1::Service> {
    snapshot
        .services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata.name.as_deref() == Some(service)
        })
        .map(|s| s.as_ref())
}

/// Gateway `status.addresses`: what the Gateway's Service was given (its load-balancer
/// ingress; with static IP addresses requested, only those of them it got), plus requested
/// Hostname addresses.
pub fn addresses(
    snapshot: &Snapshot,
    namespace: &str,
    requested: &[(String, String)],
    service: &str,
) -> Vec<Address> {
    let svc = gateway_service(snapshot, namespace, service);
    // A ClusterIP or NodePort Service (`--gateway-service-type`, or the class's
    // SweetyProxyConfig) has no load balancer: the Gateway is reached on the Service's cluster
    // IPs at its listener ports, so those are its addresses.
    if let Some(spec) = svc
        .and_then(|s| s.spec.as_ref())
        .filter(|s| matches!(s.type_.as_deref(), Some("ClusterIP" | "NodePort")))
    {
        let ips = spec
            .cluster_ips
            .clone()
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default();
        return ips
            .into_iter()
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .map(|value| Address {
                type_: "IPAddress".into(),
                value,
            })
            .collect();
    }
    let ingress = svc
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let wanted_ips: Vec<&str> = requested
        .iter()
        .filter(|(t, _)| t == "IPAddress")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut out = Vec::new();
    for i in ingress.into_iter().flatten() {
        if let Some(ip) = &i.ip {
            // Until the load balancer moves to the requested address, the one it had is not
            // the Gateway's.
            if wanted_ips.is_empty() || wanted_ips.contains(&ip.as_str()) {
                out.push(Address {
                    type_: "IPAddress".into(),
                    value: ip.clone(),
                });
            }
        } else if let Some(h) = &i.hostname {
            out.push(Address {
                type_: "Hostname".into(),
                value: h.clone(),
            });
        }
    }
    for (t, v) in requested {
        if t == "Hostname" && !out.iter().any(|a| &a.value == v) {
            out.push(Address {
                type_: t.clone(),
                value: v.clone(),
            });
        }
    }
    out
}

/// Why the load balancer cannot give the Gateway's Service its requested address: the
/// message of its [`ADDRESS_USABLE_CONDITION`] when that is False. The condition must be
/// about the current spec when both carry a generation; the API server sets none on
/// Services, so after the requested address changes a stale condition can show until the
/// load balancer rewrites it (the node agent's: on its next sync, which the Service change triggers).
pub fn address_unusable(snapshot: &Snapshot, namespace: &str, service: &str) -> Option<String> {
    let svc = gateway_service(snapshot, namespace, service)?;
    let generation = svc.metadata.generation;
    svc.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            c.type_ == ADDRESS_USABLE_CONDITION
                && c.status == "False"
                && (generation.is_none() || c.observed_generation == generation)
        })
        .map(|c| c.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ns: &str, name: &str, ports: &[u16]) -> PortRequest {
        PortRequest {
            namespace: ns.into(),
            name: name.into(),
            ports: ports.iter().copied().collect(),
        }
    }

    #[test]
    fn names_are_short_valid_and_distinct() {
        assert_eq!(service_name("app", "web"), "sweety-gw-app-web");
        let long = service_name(
            "a-very-long-namespace-name-indeed",
            "and-an-even-longer-gateway-name",
        );
        assert!(long.len() <= 63, "{long}");
        assert!(long.starts_with("sweety-gw-a-very-long"));
        let dotted = service_name("app", "web.v2");
        assert!(dotted.starts_with("sweety-gw-app-web-v2-"), "{dotted}");
        assert_ne!(dotted, service_name("app", "web-v2"));
        for n in [&long, &dotted] {
            assert!(n
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            assert!(!n.ends_with('-'));
        }
    }

    #[test]
    fn lowest_free_in_gateway_order_and_existing_kept() {
        let (snapshot, _) = Snapshot::from_yaml(
            r#"
apiVersion: v1
kind: Service
metadata: {name: sweety-gw-b-gw, namespace: sweety}
spec: {ports: [{name: tcp-80, port: 80, targetPort: 20005}]}
---
apiVersion: v1
kind: Service
metadata: {name: sweety-gw-z-gone, namespace: sweety}
spec: {ports: [{name: tcp-80, port: 80, targetPort: 20000}]}
"#,
        )
        .unwrap();
        let params = Params::default();
        // Given out of order: allocation follows namespace/name.
        let requests = [req("b", "gw", &[80, 443]), req("a", "gw", &[80])];
        let a = allocate(&snapshot, &params, &requests);
        assert_eq!(a[0][&80], Some(20005), "existing mapping kept");
        assert_eq!(
            a[1][&80],
            Some(20001),
            "20000 is held by another owned Service"
        );
        assert_eq!(a[0][&443], Some(20002));
        let tight = Params {
            gateway_port_min: 20000,
            gateway_port_max: 20001,
            ..Params::default()
        };
        let a = allocate(&snapshot, &tight, &[req("c", "gw", &[80, 81])]);
        assert_eq!(a[0][&80], Some(20001));
        assert_eq!(a[0][&81], None, "range exhausted");
    }
}
