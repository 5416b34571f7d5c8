//! Route attachment: which listeners of our Gateways a route's parentRefs select, whether the
//! listeners allow the route (kind, namespace: Same/All/Selector) and which hostnames result
//! from intersecting listener and route hostnames.

use super::listeners::{RouteKind, ValidatedListener, GROUP};
use super::model::{self, ParentRefSpec};
use crate::translate::Snapshot;
use serde::Deserialize;
use std::collections::BTreeMap;
use sweety_gateway_api::gateways::{
    GatewayListenersAllowedRoutes, GatewayListenersAllowedRoutesNamespacesFrom as From,
};

/// A Kubernetes label selector (`matchLabels` AND `matchExpressions`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<SelectorExpression>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct SelectorExpression {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Does the selector select an object with these labels? Unknown operators select nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !e.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// `allowedRoutes.namespaces` of a listener.
#[derive(Clone, Debug)]
pub enum AllowedNamespaces {
    Same,
    All,
    Selector(LabelSelector),
}

/// Read `allowedRoutes.namespaces` (default: Same).
pub(super) fn allowed_namespaces(a: Option<&GatewayListenersAllowedRoutes>) -> AllowedNamespaces {
    let ns = a.and_then(|a| a.namespaces.as_ref());
    match ns.and_then(|n| n.from.clone()) {
        Some(From::All) => AllowedNamespaces::All,
        Some(From::Selector) => AllowedNamespaces::Selector(
            ns.and_then(|n| n.selector.as_ref())
                .and_then(|s| model::convert(s).ok())
                .unwrap_or_default(),
        ),
        Some(From::Same) | None => AllowedNamespaces::Same,
    }
}

/// May a route in `route_ns` attach to a listener of a Gateway in `gw_ns`?
pub(super) fn namespace_allowed(
    snapshot: &Snapshot,
    allowed: &AllowedNamespaces,
    gw_ns: &str,
    route_ns: &str,
) -> bool {
    match allowed {
        AllowedNamespaces::Same => gw_ns == route_ns,
        AllowedNamespaces::All => true,
        AllowedNamespaces::Selector(sel) => {
            let labels = snapshot
                .namespaces
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(route_ns))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default();
            let mut labels = labels;
            // The API server sets this label on every Namespace; tolerate snapshots without it.
            labels
                .entry("kubernetes.io/metadata.name".into())
                .or_insert_with(|| route_ns.into());
            sel.matches(&labels)
        }
    }
}

/// Does `host` (exact) fall under `pattern` (exact, or `*.suffix` matching one or more labels)?
fn covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
        None => pattern == host,
    }
}

/// Intersect a listener hostname with one route hostname: the more specific of the two when
/// one covers the other.
pub(super) fn intersect_one(listener: &str, route: &str) -> Option<String> {
    let lw = listener.starts_with("*.");
    let rw = route.starts_with("*.");
    match (lw, rw) {
        (false, false) => (listener == route).then(|| route.to_string()),
        (true, false) => covers(listener, route).then(|| route.to_string()),
        (false, true) => covers(route, listener).then(|| listener.to_string()),
        (true, true) => {
            if listener == route || covers(listener, &route[2..]) {
                Some(route.to_string())
            } else if covers(route, &listener[2..]) {
                Some(listener.to_string())
            } else {
                None
            }
        }
    }
}

/// How specifically a listener hostname selects requests for `host` (exact or wildcard):
/// `None` when it does not cover it, otherwise a score where a higher value wins (exact >
/// longer wildcard > shorter wildcard > no hostname).
pub(super) fn specificity(listener: Option<&str>, host: &str) -> Option<usize> {
    match listener {
        None => Some(0),
        Some(l) if l == host => Some(usize::MAX),
        Some(l) => (intersect_one(l, host).as_deref() == Some(host)).then_some(l.len()),
    }
}

/// Effective hostnames of a route on a listener. `None`: no intersection. `Some(empty)`:
/// any hostname.
pub(super) fn intersect(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    match (listener, route.is_empty()) {
        (None, _) => Some(route.to_vec()),
        (Some(l), true) => Some(vec![l.to_string()]),
        (Some(l), false) => {
            let mut out: Vec<String> = Vec::new();
            for h in route {
                if let Some(x) = intersect_one(l, h) {
                    if !out.contains(&x) {
                        out.push(x);
                    }
                }
            }
            (!out.is_empty()).then_some(out)
        }
    }
}

/// The listeners a parentRef attaches to, with the effective hostnames on each; or the reason
/// it attaches to none.
pub(super) type Attachment = Result<Vec<(usize, Vec<String>)>, (&'static str, String)>;

/// Attach a route of `kind` in `route_ns` through one parentRef to a Gateway's listeners.
/// `owner`: the listeners the parentRef can reach: the Gateway's own (None) or one
/// ListenerSet's (`Some(index)`).
#[allow(clippy::too_many_arguments)]
pub(super) fn attach(
    snapshot: &Snapshot,
    gw_ns: &str,
    listeners: &[ValidatedListener],
    owner: Option<usize>,
    parent: &ParentRefSpec,
    kind: RouteKind,
    route_ns: &str,
    hostnames: &[String],
) -> Attachment {
    let mut candidates: Vec<usize> = (0..listeners.len())
        .filter(|&i| listeners[i].owner == owner)
        .collect();
    if let Some(section) = &parent.section_name {
        candidates.retain(|&i| &listeners[i].name == section);
        if candidates.is_empty() {
            return Err(("NoMatchingParent", format!("no listener named {section}")));
        }
    }
    if let Some(port) = parent.port {
        candidates.retain(|&i| i32::from(listeners[i].port) == port);
        if candidates.is_empty() {
            return Err(("NoMatchingParent", format!("no listener on port {port}")));
        }
    }
    candidates.retain(|&i| listeners[i].attachable());
    if candidates.is_empty() {
        return Err((
            "NoMatchingParent",
            "the selected listeners are not valid".into(),
        ));
    }
    candidates.retain(|&i| {
        // `Same` means the namespace of the Gateway, or of the ListenerSet.
        let home = listeners[i].home_ns.as_deref().unwrap_or(gw_ns);
        listeners[i].kinds.contains(&kind)
            && namespace_allowed(snapshot, &listeners[i].allowed, home, route_ns)
    });
    if candidates.is_empty() {
        return Err((
            "NotAllowedByListeners",
            format!(
                "no listener allows a {} from namespace {route_ns}",
                kind.name()
            ),
        ));
    }
    let uses_hostnames = matches!(kind, RouteKind::Http | RouteKind::Grpc | RouteKind::Tls);
    let out: Vec<(usize, Vec<String>)> = candidates
        .into_iter()
        .filter_map(|i| {
            if !uses_hostnames {
                return Some((i, Vec::new()));
            }
            intersect(listeners[i].hostname.as_deref(), hostnames).map(|h| (i, h))
        })
        .collect();
    if out.is_empty() {
        return Err((
            "NoMatchingListenerHostname",
            "no listener hostname matches the route's hostnames".into(),
        ));
    }
    Ok(out)
}

/// Does this parentRef point at a Gateway (the only parent kind we serve)?
pub(super) fn is_gateway_ref(p: &ParentRefSpec) -> bool {
    p.group.as_deref().unwrap_or(GROUP) == GROUP
        && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
}

/// Is the parentRef a ListenerSet?
pub(super) fn is_listener_set_ref(p: &ParentRefSpec) -> bool {
    p.group.as_deref().unwrap_or(GROUP) == GROUP && p.kind.as_deref() == Some("ListenerSet")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_intersection() {
        assert_eq!(
            intersect_one("a.example.com", "a.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(intersect_one("a.example.com", "b.example.com"), None);
        assert_eq!(
            intersect_one("*.example.com", "a.b.example.com").as_deref(),
            Some("a.b.example.com")
        );
        assert_eq!(intersect_one("*.example.com", "example.com"), None);
        assert_eq!(
            intersect_one("foo.example.com", "*.example.com").as_deref(),
            Some("foo.example.com")
        );
        assert_eq!(
            intersect_one("*.example.com", "*.foo.example.com").as_deref(),
            Some("*.foo.example.com")
        );
        assert_eq!(
            intersect_one("*.foo.example.com", "*.example.com").as_deref(),
            Some("*.foo.example.com")
        );
        assert_eq!(intersect_one("*.example.com", "*.example.org"), None);
        assert_eq!(intersect(None, &[]), Some(vec![]));
        assert_eq!(intersect(Some("x.io"), &[]), Some(vec!["x.io".to_string()]));
        assert_eq!(
            intersect(
                Some("*.x.io"),
                &["a.x.io".into(), "b.y.io".into(), "*.x.io".into()]
            ),
            Some(vec!["a.x.io".to_string(), "*.x.io".to_string()])
        );
        assert_eq!(intersect(Some("*.x.io"), &["b.y.io".into()]), None);
    }

    #[test]
    fn most_specific_listener_wins() {
        assert_eq!(specificity(None, "a.example.com"), Some(0));
        assert_eq!(
            specificity(Some("a.example.com"), "a.example.com"),
            Some(usize::MAX)
        );
        let wide = specificity(Some("*.example.com"), "a.b.example.com").unwrap();
        let narrow = specificity(Some("*.b.example.com"), "a.b.example.com").unwrap();
        assert!(narrow > wide && wide > 0);
        assert_eq!(
            specificity(Some("*.example.com"), "*.b.example.com"),
            Some(13)
        );
        assert_eq!(specificity(Some("*.b.example.com"), "*.example.com"), None);
        assert_eq!(specificity(Some("x.example.com"), "a.example.com"), None);
    }

    #[test]
    fn label_selector_operators() {
        let labels: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())]
            .into_iter()
            .collect();
        let sel = |op: &str, values: &[&str]| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![SelectorExpression {
                key: "env".into(),
                operator: op.into(),
                values: values.iter().map(|s| s.to_string()).collect(),
            }],
        };
        assert!(sel("In", &["prod", "dev"]).matches(&labels));
        assert!(!sel("NotIn", &["prod"]).matches(&labels));
        assert!(sel("Exists", &[]).matches(&labels));
        assert!(!sel("DoesNotExist", &[]).matches(&labels));
        assert!(!sel("Bogus", &[]).matches(&labels));
    }
}
