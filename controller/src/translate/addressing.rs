//! Gateway addressing: each Gateway gets a controller-owned Service (in the controller's
//! namespace by default, or in the Gateway's: [`Params::gateway_service_namespace`]) whose
//! ports map the Gateway's listener ports onto dataplane container ports allocated here,
//! stable across restarts (existing Services are read back) and never colliding. A Gateway's
//! Service is read back from either place, the current one first, so a release that moves
//! the Services (or a change of the setting) keeps each Gateway's container ports.
//!
//! Allocation ([`allocate`]) is deterministic and stable per listener: first every Gateway
//! keeps the container ports its existing Service already maps (when still free and in
//! range), then each remaining listener port takes the first free port at or after its
//! [`preferred_port`], a SHA-256 of `<namespace>/<name>:<port>` within
//! `[gateway_port_min, gateway_port_max]` (wrapping), older Gateways first. A listener's port
//! thus does not depend on which other Gateways exist, and a port a deleted Gateway freed is
//! not handed to the next Gateway that needs one (the lowest-free rule of before did, and
//! moved a Gateway whose Service was not in the cache yet onto another's port).

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
#[derive(Clone, Debug)]
pub struct PortRequest {
    /// The Gateway's namespace.
    pub namespace: String,
    /// The Gateway's name.
    pub name: String,
    /// Its `metadata.creationTimestamp` as RFC 3339 text (empty when unknown): with
    /// namespace/name, the age order in which Gateways claim ports they both want.
    pub created: String,
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

/// The container port where the probe for listener port `port` of Gateway `namespace/name`
/// starts: `min + (h mod (max - min + 1))`, `h` the first 8 bytes (big-endian) of
/// SHA-256(`<namespace>/<name>:<port>`). SHA-256 and not Rust's `DefaultHasher` (SipHash
/// with a per-process random key in `HashMap`, unspecified across releases): the port must be
/// the same in every controller process and release, so a controller whose Service cache is
/// behind (or a restarted one) picks what the Services it wrote map. `/` cannot occur
/// in a namespace or a name and `:` not in a name, so the text spells each listener once.
/// The modulo bias is below 2^-48 for any range.
pub fn preferred_port(namespace: &str, name: &str, port: u16, min: u16, max: u16) -> u16 {
    let digest = Sha256::digest(format!("{namespace}/{name}:{port}").as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let size = u64::from(max.saturating_sub(min)) + 1;
    // `h % size < size <= 65536`, and `min + that <= max`.
    min + u16::try_from(u64::from_be_bytes(head) % size).unwrap_or(0)
}

/// Allocate container ports for `requests` (any order: the result does not depend on it).
///
/// Pass 1: every listener port that the Gateway's existing Service maps keeps that container
/// port, when in range, not an Ingress port and not kept already by an older Gateway (age:
/// creation time, then namespace/name); Services in the controller's namespace first, then
/// (with `--gateway-service-namespace=gateway` only) the Service in the Gateway's own
/// namespace, which its tenant can write. Pass 2: every other listener port probes upwards
/// from its [`preferred_port`] (wrapping at `gateway_port_max`) for the first port that is
/// free. Not free: a port given out in this allocation, an Ingress container port, a port
/// that a Service in the controller's namespace of no requesting Gateway maps (a deleted
/// Gateway's, until its Service is gone), and a port that another Gateway's Service in the
/// controller's namespace maps (until that Service is rewritten without it). Gateways probe
/// in age order, so a new Gateway never takes a port an older one would probe to.
///
/// So a listener's container port depends on its own identity, not on which other Gateways
/// exist: it keeps its port when others come and go, and when its Service is missing from
/// the cache (just created, or a fresh controller) it picks the same port again unless a
/// collision moved it. A port freed by a deleted Gateway goes to another one only when that
/// one's probe lands there (chance 1 in the range size per listener), and never while any
/// Service still maps it. Within one allocation no container port is given twice, so one
/// dataplane config never has two Gateways' listeners on one port (the dataplane's config
/// check refuses that too).
pub fn allocate(snapshot: &Snapshot, params: &Params, requests: &[PortRequest]) -> Allocation {
    let (min, max) = (params.gateway_port_min, params.gateway_port_max);
    let range = min..=max;
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
    let mapped = |s: &Service| -> Vec<(u16, u16)> {
        s.spec
            .iter()
            .flat_map(|sp| sp.ports.iter().flatten())
            .filter_map(|p| Some((u16::try_from(p.port).ok()?, target_port(p)?)))
            .collect()
    };
    // Per request, what its Services map, by trust. Only the operator and this controller
    // write Services in the controller's namespace; a Service in a Gateway's namespace is
    // writable by that namespace's tenant, who could copy our labels and annotation onto a
    // Service of its own. So: what a Service in the controller's namespace maps is kept
    // first, reserves its ports and, when its Gateway is gone, keeps them from everyone;
    // what a Service in a Gateway's own namespace maps is kept only where that is where its
    // Services live (`--gateway-service-namespace=gateway`), only for that Gateway's own
    // listener ports, after every claim from the controller's namespace, and reserves
    // nothing (a tenant's copy could otherwise claim another's port or the whole range).
    let mut trusted: Vec<Vec<(u16, u16)>> = vec![Vec::new(); requests.len()];
    let mut own: Vec<Vec<(u16, u16)>> = vec![Vec::new(); requests.len()];
    // Ports a Service in the controller's namespace of no requesting Gateway maps (a
    // deleted Gateway's, until its Service is deleted): given to nobody.
    let mut taken: BTreeSet<u16> = BTreeSet::new();
    for s in &owned {
        let ns = s.metadata.namespace.as_deref();
        let in_controller_ns = ns == Some(params.namespace.as_str());
        match (0..requests.len()).find(|&g| belongs(s, g)) {
            Some(g) if in_controller_ns => trusted[g].extend(mapped(s)),
            Some(g) if ns == Some(params.gateway_service_namespace(&requests[g].namespace)) => {
                own[g].extend(mapped(s));
            }
            Some(_) => {}
            None if in_controller_ns => taken.extend(mapped(s).into_iter().map(|(_, t)| t)),
            None => {}
        }
    }
    // The Ingress listeners' fixed container ports, should the range include them.
    taken.extend([params.ingress_http_port, params.ingress_https_port]);
    // Who else's Service maps a port: a port held by Gateway `g`'s Service is free for `g`
    // only.
    let mut holders: BTreeMap<u16, BTreeSet<usize>> = BTreeMap::new();
    for (g, ports) in trusted.iter().enumerate() {
        for &(_, target) in ports {
            holders.entry(target).or_default().insert(g);
        }
    }
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&g| {
        (
            &requests[g].created,
            &requests[g].namespace,
            &requests[g].name,
        )
    });
    let mut out: Allocation = requests
        .iter()
        .map(|r| r.ports.iter().map(|p| (*p, None)).collect())
        .collect();
    // Pass 1: keep what existing Services map, those in the controller's namespace first.
    for held in [&trusted, &own] {
        for &g in &order {
            for &(port, target) in &held[g] {
                if let Some(slot) = out[g].get_mut(&port) {
                    if slot.is_none() && range.contains(&target) && !taken.contains(&target) {
                        *slot = Some(target);
                        taken.insert(target);
                    }
                }
            }
        }
    }
    // Pass 2: probe from each listener's preferred port.
    if range.is_empty() {
        return out;
    }
    let size = u32::from(max - min) + 1;
    for &g in &order {
        let r = &requests[g];
        for (&port, slot) in out[g].iter_mut().filter(|(_, s)| s.is_none()) {
            let start = preferred_port(&r.namespace, &r.name, port, min, max);
            let free = |p: &u16| {
                !taken.contains(p) && holders.get(p).is_none_or(|h| h.iter().all(|&o| o == g))
            };
            let found = (0..size)
                .map(|i| {
                    let offset = (u32::from(start - min) + i) % size;
                    // `offset < size`, so `min + offset <= max`.
                    min + u16::try_from(offset).unwrap_or(0)
                })
                .find(free);
            if let Some(p) = found {
                *slot = Some(p);
                taken.insert(p);
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
            created: String::new(),
            ports: ports.iter().copied().collect(),
        }
    }

    /// The Services the controller writes for `alloc` (what the cache holds after a sync):
    /// one per Gateway with a port, in the controller's namespace, mapping each listener
    /// port that has a container port.
    fn services_for(params: &Params, requests: &[PortRequest], alloc: &Allocation) -> Vec<Service> {
        use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
        requests
            .iter()
            .zip(alloc)
            .filter(|(_, a)| a.values().any(Option::is_some))
            .map(|(r, a)| Service {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(service_name(&r.namespace, &r.name)),
                    namespace: Some(params.namespace.clone()),
                    labels: Some(
                        [
                            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                            (GATEWAY_NAME_LABEL.to_string(), label_value(&r.name)),
                            (OWNER_LABEL.to_string(), label_value(&params.namespace)),
                        ]
                        .into(),
                    ),
                    annotations: Some(
                        [(
                            GATEWAY_ANNOTATION.to_string(),
                            format!("{}/{}", r.namespace, r.name),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    ports: Some(
                        a.iter()
                            .filter_map(|(&port, &target)| {
                                Some(ServicePort {
                                    name: Some(format!("tcp-{port}")),
                                    port: i32::from(port),
                                    target_port: Some(IntOrString::Int(i32::from(target?))),
                                    ..Default::default()
                                })
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    }

    fn cache(services: impl IntoIterator<Item = Service>) -> Snapshot {
        Snapshot {
            services: services.into_iter().map(std::sync::Arc::new).collect(),
            ..Snapshot::default()
        }
    }

    /// The container ports of Gateway `ns/name` in `alloc`.
    fn ports_of(
        requests: &[PortRequest],
        alloc: &Allocation,
        ns: &str,
        name: &str,
    ) -> BTreeMap<u16, Option<u16>> {
        let g = requests
            .iter()
            .position(|r| r.namespace == ns && r.name == name)
            .unwrap();
        alloc[g].clone()
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
    fn existing_mapping_kept_and_held_ports_given_to_nobody_else() {
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
        let (min, max) = (params.gateway_port_min, params.gateway_port_max);
        let requests = [req("b", "gw", &[80, 443]), req("a", "gw", &[80])];
        let a = allocate(&snapshot, &params, &requests);
        assert_eq!(
            a[0][&80],
            Some(20005),
            "existing mapping kept (found by the Gateway it names, under an older name)"
        );
        assert_eq!(a[0][&443], Some(preferred_port("b", "gw", 443, min, max)));
        assert_eq!(a[1][&80], Some(preferred_port("a", "gw", 80, min, max)));
        // Two ports: the stale Service's 20000 is given to nobody.
        let tight = Params {
            gateway_port_min: 20000,
            gateway_port_max: 20001,
            ..Params::default()
        };
        let a = allocate(&snapshot, &tight, &[req("c", "gw", &[80, 81])]);
        assert_eq!(a[0][&80], Some(20001));
        assert_eq!(a[0][&81], None, "range exhausted");
        // A range that covers the Ingress listeners' container ports leaves them out.
        let over_ingress = Params {
            gateway_port_min: 8080,
            gateway_port_max: 8082,
            ..Params::default()
        };
        let a = allocate(
            &cache([]),
            &over_ingress,
            &[req("c", "gw", &[80, 443, 444])],
        );
        let given: BTreeSet<u16> = a[0].values().flatten().copied().collect();
        assert_eq!(given, BTreeSet::from([8081, 8082]));
    }

    /// A port that Gateway x's Service still maps, for a listener x no longer has, is not
    /// given to Gateway y until that Service is rewritten without it: until then clients of
    /// x's Service on that port would reach y's listener. (The allocator of before gave it
    /// to y at once.)
    #[test]
    fn a_port_another_gateways_service_maps_waits_until_it_is_unmapped() {
        let params = Params {
            gateway_port_min: 20000,
            gateway_port_max: 20001,
            ..Params::default()
        };
        let before = [req("a", "x", &[80, 443])];
        let mapped = allocate(&cache([]), &params, &before);
        assert_eq!(mapped[0].len(), 2);
        let x443 = mapped[0][&443].unwrap();
        // x drops listener 443; y (younger) wants a port.
        let mut y = req("b", "y", &[80]);
        y.created = "2026-01-01T00:00:00Z".into();
        let mut now = vec![req("a", "x", &[80]), y];
        now[0].created = "2025-01-01T00:00:00Z".into();
        let stale = cache(services_for(&params, &before, &mapped));
        let a = allocate(&stale, &params, &now);
        assert_eq!(a[0][&80], mapped[0][&80], "x keeps its port");
        assert_eq!(a[1][&80], None, "x's Service still maps {x443}");
        // x's Service rewritten (only 80 now): the port is free.
        let rewritten = cache(services_for(&params, &now[..1], &a[..1].to_vec()));
        let a = allocate(&rewritten, &params, &now);
        assert_eq!(a[1][&80], Some(x443));
    }

    /// A Service of our name, labels and annotation in a tenant's namespace (which the tenant
    /// can write) claims nothing in the default layout, reserves nothing in any layout, and
    /// in `--gateway-service-namespace=gateway` keeps only its own Gateway's listener ports,
    /// after what Services in the controller's namespace keep. The allocator of before let
    /// such a copy take another Gateway's port (`a/evil`, older, took `v/web`'s) and reserve
    /// the whole range (`a/ghost`).
    #[test]
    fn a_tenants_copy_of_our_service_claims_and_reserves_nothing() {
        use super::super::GatewayServiceNamespace;
        let params = Params::default();
        let (min, max) = (params.gateway_port_min, params.gateway_port_max);
        let victim = preferred_port("v", "web", 443, min, max);
        let copy = |ns: &str, gw: &str, ports: &[(u16, u16)]| {
            let ports: Vec<String> = ports
                .iter()
                .map(|(p, t)| format!("{{name: tcp-{p}, port: {p}, targetPort: {t}}}"))
                .collect();
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {}, namespace: {ns}, \
                 labels: {{app.kubernetes.io/managed-by: sweety, sweety.dev/gateway-name: {gw}, \
                 sweety.dev/owner: sweety}}, annotations: {{sweety.dev/gateway: {ns}/{gw}}}}}\n\
                 spec: {{ports: [{}]}}\n",
                service_name(ns, gw),
                ports.join(", ")
            )
        };
        let mut evil = req("a", "evil", &[443]);
        evil.created = "2025-01-01T00:00:00Z".into();
        let mut web = req("v", "web", &[443]);
        web.created = "2026-01-01T00:00:00Z".into();
        let requests = [evil, web];
        let (snapshot, _) = Snapshot::from_yaml(&copy("a", "evil", &[(443, victim)])).unwrap();
        let a = allocate(&snapshot, &params, &requests);
        assert_eq!(a[1][&443], Some(victim), "v/web keeps its port");
        assert_eq!(a[0][&443], Some(preferred_port("a", "evil", 443, min, max)));
        // A copy naming no Gateway, mapping the whole (small) range.
        let tight = Params {
            gateway_port_min: 20000,
            gateway_port_max: 20003,
            ..Params::default()
        };
        let all: Vec<(u16, u16)> = (0..4).map(|i| (80 + i, 20000 + i)).collect();
        let (snapshot, _) = Snapshot::from_yaml(&copy("a", "ghost", &all)).unwrap();
        let a = allocate(&snapshot, &tight, &requests[1..]);
        assert!(a[0][&443].is_some(), "the range is not reserved by a copy");
        // Gateway layout: the Service in the Gateway's namespace is kept for its own ports,
        // after a claim from the controller's namespace. `x`: a port a/evil would not get by
        // its hash.
        let x = (20000..=20003)
            .find(|&p| p != preferred_port("a", "evil", 443, 20000, 20003))
            .unwrap();
        let gateway_layout = Params {
            gateway_service_namespace: GatewayServiceNamespace::Gateway,
            ..tight.clone()
        };
        let text = format!(
            "{}---\n{}",
            copy("a", "evil", &[(443, x)]),
            copy("sweety", "web", &[(443, x)]).replace("sweety/web", "v/web")
        );
        let (snapshot, _) = Snapshot::from_yaml(&text).unwrap();
        let a = allocate(&snapshot, &gateway_layout, &requests);
        assert_eq!(a[1][&443], Some(x), "the controller's namespace first");
        assert_ne!(a[0][&443], Some(x));
        let (snapshot, _) = Snapshot::from_yaml(&copy("a", "evil", &[(443, x)])).unwrap();
        let a = allocate(&snapshot, &gateway_layout, &requests);
        assert_eq!(a[0][&443], Some(x), "its own Service, where they live");
        let a = allocate(&snapshot, &tight, &requests);
        assert_ne!(a[0][&443], Some(x), "not where they do not live");
    }

    /// Gateways come and go around the ones that stay: with or without their Services in
    /// the cache, the survivors keep their ports, and a new Gateway does not get the ports a
    /// just-deleted one freed (it gets what it would get alone). The allocator of before
    /// (lowest free port, Gateways in namespace/name order) gave the new `a/zero` the ports
    /// `b/two` had, and moved `c/three` down when its Service was missing.
    #[test]
    fn churn_moves_no_survivor_and_hands_out_no_freed_port() {
        let params = Params::default();
        let first = [
            req("a", "one", &[80, 443]),
            req("b", "two", &[80, 443]),
            req("c", "three", &[80, 443, 8443]),
        ];
        let alloc1 = allocate(&cache([]), &params, &first);
        let freed: BTreeSet<u16> = alloc1[1].values().flatten().copied().collect();
        // b/two is deleted (and its Service with it), a/zero is created; a/one is changed
        // (listener 8080 added).
        let second = [
            req("a", "one", &[80, 443, 8080]),
            req("c", "three", &[80, 443, 8443]),
            req("a", "zero", &[80, 443]),
        ];
        let all_services = services_for(&params, &first, &alloc1);
        let survivors: Vec<Service> = all_services
            .iter()
            .filter(|s| !s.metadata.name.as_deref().unwrap().contains("-b-two-"))
            .cloned()
            .collect();
        let alone = allocate(&cache([]), &params, &[req("a", "zero", &[80, 443])]);
        for (what, snapshot) in [
            ("Services in the cache", cache(survivors.clone())),
            ("no Service in the cache", cache([])),
            ("c/three's Service missing", cache(survivors[..1].to_vec())),
        ] {
            let alloc2 = allocate(&snapshot, &params, &second);
            for (ns, name) in [("a", "one"), ("c", "three")] {
                let before = ports_of(&first, &alloc1, ns, name);
                let after = ports_of(&second, &alloc2, ns, name);
                for (port, target) in &before {
                    assert_eq!(after[port], *target, "{what}: {ns}/{name}:{port} moved");
                }
            }
            let zero = ports_of(&second, &alloc2, "a", "zero");
            assert_eq!(zero, alone[0], "{what}: a/zero gets what it gets alone");
            for target in zero.values().flatten() {
                assert!(!freed.contains(target), "{what}: a/zero got freed {target}");
            }
        }
        // While b/two's Service is still in the cache, its ports stay given to nobody.
        let alloc2 = allocate(&cache(all_services), &params, &second);
        for g in &alloc2 {
            assert!(g.values().flatten().all(|t| !freed.contains(t)));
        }
    }

    /// A Gateway whose Service is not in the cache (just created, or a controller that has
    /// not listed Services yet) gets the ports its Service maps, so the Service is not
    /// re-pointed while its old target is served by another Gateway. The allocator of
    /// before gave it the lowest free port, which after any deletion was another's old one.
    #[test]
    fn a_gateway_missing_its_service_gets_the_same_ports() {
        let params = Params::default();
        let first = [
            req("app", "a", &[80]),
            req("app", "b", &[80, 443]),
            req("app", "c", &[443]),
        ];
        let alloc1 = allocate(&cache([]), &params, &first);
        let services = services_for(&params, &first, &alloc1);
        // app/a is deleted with its Service; app/b's Service is not in the cache.
        let rest = &first[1..];
        let without_b: Vec<Service> = services
            .iter()
            .filter(|s| !s.metadata.name.as_deref().unwrap().contains("-app-b-"))
            .skip(1)
            .cloned()
            .collect();
        assert_eq!(without_b.len(), 1);
        let alloc2 = allocate(&cache(without_b), &params, rest);
        assert_eq!(alloc2[0], alloc1[1], "app/b without its Service");
        assert_eq!(alloc2[1], alloc1[2], "app/c with its Service");
        let with_b = allocate(&cache(services[1..].to_vec()), &params, rest);
        assert_eq!(with_b, alloc2);
    }

    fn gateway_set() -> impl proptest::strategy::Strategy<Value = Vec<PortRequest>> {
        use proptest::prelude::*;
        // Few names and ports: collisions within small ranges are the point.
        proptest::collection::vec(
            (
                "[ab]{1,2}",
                "[a-c]{1,2}",
                0u8..4,
                proptest::collection::btree_set(
                    prop_oneof![Just(80u16), Just(443), Just(8080), Just(8443), 1u16..100],
                    0..4,
                ),
            ),
            0..8,
        )
        .prop_map(|v| {
            let mut seen = BTreeSet::new();
            v.into_iter()
                .filter(|(ns, name, _, _)| seen.insert((ns.clone(), name.clone())))
                .map(|(ns, name, age, ports)| PortRequest {
                    namespace: ns,
                    name,
                    created: format!("2026-01-0{}T00:00:00Z", age + 1),
                    ports,
                })
                .collect()
        })
    }

    fn tagged(
        requests: &[PortRequest],
        alloc: &Allocation,
    ) -> BTreeMap<(String, String, u16), Option<u16>> {
        requests
            .iter()
            .zip(alloc)
            .flat_map(|(r, a)| {
                a.iter()
                    .map(|(&p, &t)| ((r.namespace.clone(), r.name.clone(), p), t))
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// Allocation gives no container port twice, stays in range (Ingress ports left
        /// out), fills the range before it leaves a listener without a port, does not depend
        /// on the order of the requests, and a Gateway's ports do not depend on Gateways
        /// younger than it, nor (with its Service in the cache) on any other Gateway coming
        /// or going. The allocator of before failed the younger-Gateways property: a
        /// younger Gateway earlier in namespace/name order took the lowest ports.
        #[test]
        fn allocation_is_injective_in_range_and_independent_of_others(
            old in gateway_set(),
            young in gateway_set(),
            min in 8070u16..8090,
            span in 0u16..24,
            keep in proptest::collection::vec(proptest::bool::ANY, 8),
            reverse in proptest::bool::ANY,
        ) {
            let params = Params {
                gateway_port_min: min,
                gateway_port_max: min + span,
                ..Params::default()
            };
            // The younger set: created after every old Gateway, names distinct from them.
            let young: Vec<PortRequest> = young
                .iter()
                .filter(|y| !old.iter().any(|o| o.namespace == y.namespace && o.name == y.name))
                .map(|y| PortRequest { created: format!("2027{}", &y.created[4..]), ..y.clone() })
                .collect();
            let alloc = allocate(&cache([]), &params, &old);
            let mut seen = BTreeSet::new();
            let free = (min..=min + span)
                .filter(|p| ![params.ingress_http_port, params.ingress_https_port].contains(p))
                .count();
            let wanted: usize = old.iter().map(|r| r.ports.len()).sum();
            let given = alloc.iter().flat_map(|a| a.values().flatten()).count();
            proptest::prop_assert_eq!(given, wanted.min(free));
            for t in alloc.iter().flat_map(|a| a.values().flatten()) {
                proptest::prop_assert!(seen.insert(*t), "{} twice", t);
                proptest::prop_assert!((min..=min + span).contains(t));
                proptest::prop_assert!(*t != 8080 && *t != 8443);
            }
            // Deterministic, whatever the order of the requests.
            let mut shuffled: Vec<PortRequest> = old.to_vec();
            if reverse {
                shuffled.reverse();
            } else {
                shuffled.rotate_left(old.len() / 2);
            }
            let again = allocate(&cache([]), &params, &shuffled);
            proptest::prop_assert_eq!(tagged(&old, &alloc), tagged(&shuffled, &again));
            // Younger Gateways added: the older ones keep their ports.
            let both: Vec<PortRequest> = old.iter().chain(&young).cloned().collect();
            let with_young = tagged(&both, &allocate(&cache([]), &params, &both));
            for (k, t) in tagged(&old, &alloc) {
                proptest::prop_assert_eq!(with_young[&k], t, "{:?} moved", k);
            }
            // With the Services in the cache, some old Gateways deleted (Services too) and
            // the young ones added, of any age: the survivors keep their ports.
            let services = services_for(&params, &old, &alloc);
            let kept: Vec<PortRequest> = old
                .iter()
                .zip(keep.iter().cycle())
                .filter(|(_, k)| **k)
                .map(|(r, _)| r.clone())
                .collect();
            let kept_services: Vec<Service> = services
                .into_iter()
                .filter(|s| {
                    kept.iter().any(|r| {
                        s.metadata.name.as_deref() == Some(service_name(&r.namespace, &r.name).as_str())
                    })
                })
                .collect();
            let mut now: Vec<PortRequest> = kept.to_vec();
            now.extend(young.iter().map(|y| PortRequest { created: String::new(), ..y.clone() }));
            let after = tagged(&now, &allocate(&cache(kept_services), &params, &now));
            let before = tagged(&old, &alloc);
            for r in &kept {
                for p in &r.ports {
                    let k = (r.namespace.clone(), r.name.clone(), *p);
                    if before[&k].is_some() {
                        proptest::prop_assert_eq!(after[&k], before[&k], "{:?} moved", k);
                    }
                }
            }
        }
    }
}
