//! Host ownership on the shared Ingress/SweetySite listeners: which namespace may serve a
//! hostname, so that no namespace takes another's hosts.
//!
//! - **Claims.** Every rule host of an Ingress of ours (`""` for rules without a host, the
//!   catch-all) and every hostname of a SweetySite is a claim. Canary Ingresses claim nothing
//!   (they attach to a primary of their own namespace). TLS hosts are not claims: a certificate
//!   is only used for hosts its namespace owns.
//! - **Owner.** An exact hostname, and a `*.` wildcard hostname, each as its own name, belongs
//!   to its oldest claim: `creationTimestamp`, then namespace, then name (then kind).
//! - **Pins.** An operator can pin hostnames or `*.suffix` patterns (matching every name under
//!   the suffix, and the wildcard itself) to namespaces with the Namespace annotation
//!   [`PINNED_ANNOTATION`] (comma-separated) or [`super::Params::pinned_hostnames`]. A pinned
//!   hostname is owned by the oldest claim *from a pinning namespace* and never served from
//!   another namespace, however old its claim is, so a squatter cannot keep a host its owner
//!   redeploys. An exact pin beats a pattern; among patterns, the longest matching suffix wins.
//! - **Sharing.** Ingresses of namespaces that share ([`super::Params::shared_host_namespaces`]
//!   or the Namespace annotation [`SHARE_ANNOTATION`]` = "true"`) may add rules to hosts owned
//!   by an Ingress of another sharing namespace (ingress-nginx's merge). SweetySites never
//!   share: a site serves only the hostnames whose owner it is.
//!
//! - **Extra names.** An Ingress's `server-alias` names and the other name of its
//!   `from-to-www-redirect` hosts ([`nginx::extra_hosts`]) are weak claims: they own a
//!   hostname only when no rule host and no SweetySite claims it (then the oldest weak claim,
//!   pins applying alike), so an alias never takes a host another Ingress or a site names;
//!   [`Hosts::is_rule_host`] tells the translator to skip them there, as ingress-nginx does.
//!
//! A claim that loses gets a reason naming the owner; the rest of its object still applies.

use super::ingress::nginx;
use super::Params;
use super::Snapshot;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Namespace annotation pinning hostnames or `*.suffix` patterns to the namespace.
pub const PINNED_ANNOTATION: &str = "sweety.dev/pinned-hostnames";
/// Namespace annotation (`"true"`) letting the namespace's Ingresses share hostnames.
pub const SHARE_ANNOTATION: &str = "sweety.dev/share-hosts";

/// The kind of object a claim comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClaimKind {
    /// An Ingress rule's host.
    Ingress,
    /// A SweetySite's host.
    SweetySite,
}

impl ClaimKind {
    fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Ingress => "Ingress",
            ClaimKind::SweetySite => "SweetySite",
        }
    }
}

/// One object's claim on a hostname.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    /// Creation time (RFC 3339 text compares in time order for the apiserver's format; a
    /// missing timestamp sorts first).
    created: Option<k8s_openapi::jiff::Timestamp>,
    /// Namespace of the claiming object.
    pub namespace: String,
    /// Name of the claiming object.
    pub name: String,
    /// Kind of the claiming object.
    pub kind: ClaimKind,
}

impl Claim {
    fn new(meta: &ObjectMeta, kind: ClaimKind) -> Claim {
        Claim {
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            kind,
        }
    }

    fn describe(&self) -> String {
        format!("{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// Why a claim may not serve a hostname: a condition reason (`HostTaken`, `HostPinned`) and a
/// message naming the owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Condition reason: `HostTaken` or `HostPinned`.
    pub reason: &'static str,
    /// Names the object or Namespace annotation that owns the host.
    pub message: String,
}

fn taken(message: String) -> Refusal {
    Refusal {
        reason: "HostTaken",
        message,
    }
}

/// Who owns each claimed hostname, and which namespaces may serve it.
#[derive(Debug, Default)]
pub struct Hosts {
    owners: BTreeMap<String, Claim>,
    /// Hostnames an Ingress rule or a SweetySite claims (not only a weak claim).
    rule_hosts: BTreeSet<String>,
    /// hostname → namespaces it is pinned to (only pinned hostnames that someone claims).
    pinned: BTreeMap<String, BTreeSet<String>>,
    sharing: BTreeSet<String>,
}

/// Whether an Ingress carries the ingress-nginx `canary: "true"` annotation.
pub fn is_canary(ing: &Ingress) -> bool {
    ing.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{}canary", nginx::PREFIX)))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The hosts an Ingress's rules claim (`""` for a rule without a host).
pub fn ingress_hosts(ing: &Ingress) -> Vec<String> {
    let mut out: Vec<String> = ing
        .spec
        .as_ref()
        .and_then(|s| s.rules.as_ref())
        .map(|rules| {
            rules
                .iter()
                .map(|r| r.host.clone().unwrap_or_default().to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out
}

/// Patterns (`name` or `*.suffix`) split from a comma-separated list.
fn patterns(list: &str) -> impl Iterator<Item = String> + '_ {
    list.split(',')
        .map(|p| p.trim().trim_end_matches('.').to_ascii_lowercase())
        .filter(|p| !p.is_empty())
}

/// How well `pattern` matches `host`: `Some(usize::MAX)` for the same name, the suffix length
/// for a `*.suffix` pattern covering it (any depth, the wildcard host itself included).
fn pin_match(pattern: &str, host: &str) -> Option<usize> {
    if pattern == host {
        return Some(usize::MAX);
    }
    let suffix = pattern.strip_prefix("*.")?;
    host.strip_suffix(suffix)
        .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1)
        .then_some(suffix.len())
}

impl Hosts {
    /// Ownership of every hostname claimed by `ingresses` (ours, canaries excluded by the
    /// caller or here) and the snapshot's SweetySites.
    pub fn compute(snapshot: &Snapshot, params: &Params, ingresses: &[Arc<Ingress>]) -> Hosts {
        let mut pins: Vec<(String, String)> = Vec::new(); // (pattern, namespace)
        let mut sharing: BTreeSet<String> = params.shared_host_namespaces.iter().cloned().collect();
        for (ns, list) in &params.pinned_hostnames {
            for p in list {
                pins.extend(patterns(p).map(|p| (p, ns.clone())));
            }
        }
        for n in &snapshot.namespaces {
            let name = n.metadata.name.clone().unwrap_or_default();
            let Some(a) = n.metadata.annotations.as_ref() else {
                continue;
            };
            if let Some(list) = a.get(PINNED_ANNOTATION) {
                pins.extend(patterns(list).map(|p| (p, name.clone())));
            }
            if a.get(SHARE_ANNOTATION)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            {
                sharing.insert(name);
            }
        }
        let mut claims: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for ing in ingresses.iter().filter(|i| !is_canary(i)) {
            let claim = Claim::new(&ing.metadata, ClaimKind::Ingress);
            for h in ingress_hosts(ing) {
                claims.entry(h).or_default().push(claim.clone());
            }
        }
        for site in &snapshot.sites {
            let claim = Claim::new(&site.metadata, ClaimKind::SweetySite);
            for h in &site.spec.hostnames {
                claims
                    .entry(h.to_ascii_lowercase())
                    .or_default()
                    .push(claim.clone());
            }
        }
        let rule_hosts: BTreeSet<String> = claims.keys().cloned().collect();
        // Weak claims (aliases, www names) count only for hosts nobody else names.
        for ing in ingresses.iter().filter(|i| !is_canary(i)) {
            let claim = Claim::new(&ing.metadata, ClaimKind::Ingress);
            for h in nginx::extra_hosts(ing) {
                if !rule_hosts.contains(&h) {
                    claims.entry(h).or_default().push(claim.clone());
                }
            }
        }
        let mut hosts = Hosts {
            sharing,
            rule_hosts,
            ..Default::default()
        };
        for (host, list) in claims {
            let best = pins.iter().filter_map(|(p, _)| pin_match(p, &host)).max();
            let pinned: BTreeSet<String> = match best {
                Some(score) => pins
                    .iter()
                    .filter(|(p, _)| pin_match(p, &host) == Some(score))
                    .map(|(_, ns)| ns.clone())
                    .collect(),
                None => BTreeSet::new(),
            };
            let owner = list
                .into_iter()
                .filter(|c| pinned.is_empty() || pinned.contains(&c.namespace))
                .min();
            if let Some(owner) = owner {
                hosts.owners.insert(host.clone(), owner);
            }
            if !pinned.is_empty() {
                hosts.pinned.insert(host, pinned);
            }
        }
        hosts
    }

    /// Whether an Ingress rule or a SweetySite names `host` (an alias or a www name for it is
    /// then ignored).
    pub fn is_rule_host(&self, host: &str) -> bool {
        self.rule_hosts.contains(host)
    }

    /// The owner of `host`, if anyone may serve it.
    pub fn owner(&self, host: &str) -> Option<&Claim> {
        self.owners.get(host)
    }

    fn pin_check(&self, host: &str, namespace: &str) -> Result<(), Refusal> {
        match self.pinned.get(host) {
            Some(set) if !set.contains(namespace) => Err(Refusal {
                reason: "HostPinned",
                message: format!(
                    "host {host:?} is pinned to namespace {} by the operator",
                    set.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Whether an Ingress in `namespace` may serve `host`; the error says who owns it.
    pub fn ingress_may_serve(&self, host: &str, namespace: &str) -> Result<(), Refusal> {
        self.pin_check(host, namespace)?;
        let Some(owner) = self.owners.get(host) else {
            return Err(taken(format!("host {host:?} is claimed by no Ingress")));
        };
        let shares = owner.kind == ClaimKind::Ingress
            && self.sharing.contains(namespace)
            && self.sharing.contains(&owner.namespace);
        if (owner.kind == ClaimKind::Ingress && owner.namespace == namespace) || shares {
            return Ok(());
        }
        Err(taken(format!(
            "host {host:?} belongs to namespace {} ({}, the oldest claim)",
            owner.namespace,
            owner.describe()
        )))
    }

    /// Whether SweetySite `namespace/name` may serve `host` (it must be the owner).
    pub fn site_may_serve(&self, host: &str, namespace: &str, name: &str) -> Result<(), Refusal> {
        self.pin_check(host, namespace)?;
        match self.owners.get(host) {
            Some(o)
                if o.kind == ClaimKind::SweetySite
                    && o.namespace == namespace
                    && o.name == name =>
            {
                Ok(())
            }
            Some(o) => Err(taken(format!(
                "host {host:?} belongs to {} (the oldest claim)",
                o.describe()
            ))),
            None => Err(taken(format!("host {host:?} has no owner"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_patterns() {
        assert_eq!(pin_match("a.test", "a.test"), Some(usize::MAX));
        assert_eq!(pin_match("*.a.test", "x.a.test"), Some(6));
        assert_eq!(pin_match("*.a.test", "y.x.a.test"), Some(6));
        assert_eq!(pin_match("*.a.test", "*.a.test"), Some(usize::MAX));
        assert_eq!(pin_match("*.a.test", "*.x.a.test"), Some(6));
        assert_eq!(pin_match("*.a.test", "a.test"), None);
        assert_eq!(pin_match("*.a.test", "xa.test"), None);
        assert_eq!(pin_match("*.a.test", ".a.test"), None);
        assert_eq!(pin_match("a.test", "b.a.test"), None);
    }
}
