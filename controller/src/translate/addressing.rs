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
use crate::labels::{
    label_value, GATEWAY_ANNOTATION, GATEWAY_NAMESPACE_LABEL, GATEWAY_NAME_LABEL, MANAGED_BY,
    MANAGED_BY_LABEL, OWNER_LABEL,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Prefix of every per-Gateway Service name.
pub const SERVICE_PREFIX: &str = "sweety-gw-";

/// Hex digits of the hash that ends every per-Gateway Service name: 80 bits of
/// SHA-256(`<namespace>/<name>`). An accidental collision between two Gateways needs about
/// 2^40 of them; a tenant who wants its Gateway's name to equal another one's needs a second
/// preimage, about 2^80 hashes. Translate still refuses a second claimant (the Gateway
/// front end's `refuse_service_conflicts`), so even a collision cannot hand one Gateway's
/// Service to another.
pub const SERVICE_HASH_HEX: usize = 20;

/// Longest readable part of a Service name: what the 63-character DNS label leaves after
/// the prefix, a `-` and the hash.
const SERVICE_READABLE_MAX: usize = 63 - SERVICE_PREFIX.len() - 1 - SERVICE_HASH_HEX;

/// The name of a Gateway's Service: `sweety-gw-<readable>-<hash>`, a valid DNS label of at
/// most 63 characters. `<readable>` is `<namespace>-<name>` with every character outside
/// `[a-z0-9-]` turned into `-`, cut to 32 characters (for people, not for uniqueness);
/// `<hash>` is [`SERVICE_HASH_HEX`] hex digits of SHA-256 of `<namespace>/<name>`, always
/// present. `/` cannot occur in a namespace or a name, so `<namespace>/<name>` spells each
/// Gateway differently and the name is injective up to a hash collision: Gateways
/// `team-a/web` and `team/a-web` share the readable part and differ in the hash. (Envoy
/// Gateway also ends its infrastructure names with a SHA-256 of `namespace/name`, but keeps
/// 8 hex digits, 32 bits, which a tenant can match by brute force.)
pub fn service_name(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hash: String = digest[..SERVICE_HASH_HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let readable: String = format!("{namespace}-{name}")
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(SERVICE_READABLE_MAX)
        .collect();
    let readable = readable.trim_matches('-');
    if readable.is_empty() {
        format!("{SERVICE_PREFIX}{hash}")
    } else {
        format!("{SERVICE_PREFIX}{readable}-{hash}")
    }
}

/// Whether Service `s` is the one this installation made for Gateway `namespace/name`:
/// labelled `managed-by: sweety` with a Gateway name, owned by this installation (its
/// [`OWNER_LABEL`] is the controller's namespace; an older release set none and kept its
/// Services in the controller's namespace), and for this very Gateway (the
/// [`GATEWAY_ANNOTATION`] `namespace/name`, exact; an older release wrote only the labels,
/// whose values are shortened past 63 characters). Anything else of that name (a user's own
/// Service, another installation's, another Gateway's) is never adopted, overwritten or read
/// for an address.
pub fn is_service_of(s: &Service, params: &Params, namespace: &str, name: &str) -> bool {
    let labels = s.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let managed = label(MANAGED_BY_LABEL) == Some(MANAGED_BY);
    let owner = match label(OWNER_LABEL) {
        Some(o) => o == label_value(&params.namespace),
        None => s.metadata.namespace.as_deref() == Some(params.namespace.as_str()),
    };
    let gateway = match s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GATEWAY_ANNOTATION))
    {
        Some(a) => *a == format!("{namespace}/{name}"),
        None => {
            label(GATEWAY_NAME_LABEL) == Some(label_value(name).as_str())
                && label(GATEWAY_NAMESPACE_LABEL).is_none_or(|n| n == label_value(namespace))
        }
    };
    managed && owner && gateway
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
    // Whether Service `s` is (or was, before the move or a rename) the Service of request
    // `g`: by the Gateway it names when it names one, else by name.
    let belongs = |s: &Service, g: usize| {
        let gateway = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GATEWAY_ANNOTATION));
        let mine = match gateway {
            Some(a) => *a == format!("{}/{}", requests[g].namespace, requests[g].name),
            None => s.metadata.name.as_deref() == Some(names[g].as_str()),
        };
        mine && (s.metadata.namespace.as_deref() == Some(requests[g].namespace.as_str())
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

    /// A valid DNS label (RFC 1123): what a Service name must be.
    fn dns_label(n: &str) -> bool {
        let b = n.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    }

    #[test]
    fn names_are_short_valid_and_distinct() {
        let web = service_name("app", "web");
        assert!(web.starts_with("sweety-gw-app-web-"), "{web}");
        assert_eq!(web.len(), "sweety-gw-app-web-".len() + SERVICE_HASH_HEX);
        assert_eq!(web, service_name("app", "web"), "stable");
        // The review's pair: same plain form, different Gateways.
        assert_ne!(service_name("team-a", "web"), service_name("team", "a-web"));
        let long = service_name(
            "a-very-long-namespace-name-indeed",
            "and-an-even-longer-gateway-name",
        );
        assert!(long.starts_with("sweety-gw-a-very-long"));
        let dotted = service_name("app", "web.v2");
        assert!(dotted.starts_with("sweety-gw-app-web-v2-"), "{dotted}");
        assert_ne!(dotted, service_name("app", "web-v2"));
        // A name that is the plain form of another pair plus that pair's hash still differs.
        let crafted = format!("a-{}", &web["sweety-gw-app-".len()..]);
        assert_ne!(service_name("app", &crafted), web);
        for n in [&web, &long, &dotted, &service_name("", "")] {
            assert!(dns_label(n), "{n}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Distinct (namespace, name) pairs get distinct names, each a valid DNS label of at
        /// most 63 characters ending with the full hash; the inputs are drawn from a small
        /// alphabet rich in `-` and `.` so the readable parts collide often.
        #[test]
        fn service_names_are_injective_dns_labels(
            a in ("[a-c-]{1,40}", "[a-c.-]{1,80}"),
            b in ("[a-c-]{1,40}", "[a-c.-]{1,80}"),
        ) {
            let (na, nb) = (service_name(&a.0, &a.1), service_name(&b.0, &b.1));
            proptest::prop_assert!(dns_label(&na), "{}", na);
            proptest::prop_assert!(na.starts_with(SERVICE_PREFIX));
            let hash = &na[na.len() - SERVICE_HASH_HEX..];
            proptest::prop_assert!(hash.bytes().all(|c| c.is_ascii_hexdigit()));
            proptest::prop_assert_eq!(a == b, na == nb, "{:?} {:?} -> {} {}", a, b, na, nb);
        }
    }

    #[test]
    fn pairs_sharing_a_readable_form_get_distinct_names() {
        // Every split of one dashed string into namespace and name has the same readable
        // part (and, uncut, the same old-style plain name); all names differ.
        let whole = "team-a-web-prod-eu-west-1-blue";
        let names: BTreeSet<String> = whole
            .match_indices('-')
            .map(|(i, _)| service_name(&whole[..i], &whole[i + 1..]))
            .collect();
        assert_eq!(names.len(), whole.matches('-').count());
    }

    #[test]
    fn only_this_installations_service_for_this_gateway_is_ours() {
        let (snapshot, _) = Snapshot::from_yaml(
            r#"
apiVersion: v1
kind: Service
metadata: {name: a, namespace: sweety, labels: {app.kubernetes.io/managed-by: sweety, sweety.dev/gateway-name: web, sweety.dev/owner: sweety}, annotations: {sweety.dev/gateway: team-a/web}}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: sweety}
---
apiVersion: v1
kind: Service
metadata: {name: c, namespace: sweety, labels: {app.kubernetes.io/managed-by: sweety, sweety.dev/gateway-name: web, sweety.dev/owner: other}, annotations: {sweety.dev/gateway: team-a/web}}
---
apiVersion: v1
kind: Service
metadata: {name: d, namespace: sweety, labels: {app.kubernetes.io/managed-by: sweety, sweety.dev/gateway-name: web, sweety.dev/gateway-namespace: team-a}}
---
apiVersion: v1
kind: Service
metadata: {name: e, namespace: team-a, labels: {app.kubernetes.io/managed-by: sweety, sweety.dev/gateway-name: web}}
"#,
        )
        .unwrap();
        let params = Params::default();
        let svc = |n: &str| {
            snapshot
                .services
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(n))
                .unwrap()
                .clone()
        };
        assert!(is_service_of(&svc("a"), &params, "team-a", "web"));
        assert!(
            !is_service_of(&svc("a"), &params, "team", "a-web"),
            "another Gateway's"
        );
        assert!(
            !is_service_of(&svc("b"), &params, "team-a", "web"),
            "unlabelled: a user's"
        );
        assert!(
            !is_service_of(&svc("c"), &params, "team-a", "web"),
            "another installation's"
        );
        // An older release's: labels only, in the controller's namespace.
        assert!(is_service_of(&svc("d"), &params, "team-a", "web"));
        assert!(!is_service_of(&svc("d"), &params, "team", "web"));
        assert!(
            !is_service_of(&svc("e"), &params, "team-a", "web"),
            "no owner, elsewhere"
        );
    }

    #[test]
    fn lowest_free_in_gateway_order_and_existing_kept() {
        let (snapshot, _) = Snapshot::from_yaml(
            r#"
apiVersion: v1
kind: Service
metadata: {name: sweety-gw-b-gw, namespace: sweety, annotations: {sweety.dev/gateway: b/gw}}
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
        assert_eq!(
            a[0][&80],
            Some(20005),
            "existing mapping kept (found by the Gateway it names, under an older name)"
        );
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
