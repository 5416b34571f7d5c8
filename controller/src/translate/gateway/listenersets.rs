//! ListenerSets: extra listeners attached to one of our Gateways.
//!
//! A ListenerSet whose `parentRef` names a Gateway of ours attaches when the Gateway's
//! `allowedListeners.namespaces` admits its namespace (`None`, the default, admits nothing;
//! `Same`, `All`, `Selector`); otherwise it gets `Accepted`/`Programmed` False `NotAllowed`.
//! Attached sets are taken in precedence order (creation time, then namespace/name); each of
//! their listeners is validated like a Gateway listener (certificates from the set's namespace,
//! ReferenceGrants from ListenerSets) and loses to any earlier listener it conflicts with
//! (the Gateway's own first). The listeners join the Gateway's list with `owner` set, so
//! ports, dataplane listeners and virtual hosts treat them like the Gateway's own; routes
//! reach them only through a parentRef to the ListenerSet.
//!
//! A set with at least one valid listener is `Accepted` (and `Programmed` when one is
//! programmed) and counts in the Gateway's `attachedListenerSets`; otherwise `ListenersNotValid`.

use super::attach::{self, AllowedNamespaces};
use super::listeners::{self, ValidatedListener, GROUP};
use super::routes::meta_key;
use crate::translate::status::{Condition, ObjectKey, ObjectStatus, SetStatus};
use crate::translate::Builder;
use crate::translate::Snapshot;
use sweety_gateway_api::gateways::GatewayListeners;
use sweety_gateway_api::gateways::{Gateway, GatewayAllowedListenersNamespacesFrom as From};

/// A ListenerSet that names one of our Gateways.
#[derive(Clone, Debug)]
pub struct AttachedListenerSet {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    /// Why it is not attached (`NotAllowed`); None: its listeners are in the Gateway's list.
    pub not_allowed: Option<String>,
}

impl AttachedListenerSet {
    /// Attached with at least one valid listener.
    pub fn accepted(&self, gw_listeners: &[ValidatedListener], me: usize) -> bool {
        self.not_allowed.is_none() && own(gw_listeners, me).any(|l| l.usable())
    }
}

fn own(gw_listeners: &[ValidatedListener], me: usize) -> impl Iterator<Item = &ValidatedListener> {
    gw_listeners.iter().filter(move |l| l.owner == Some(me))
}

fn allowed(snapshot: &Snapshot, gw: &Gateway, gw_ns: &str, ls_ns: &str) -> bool {
    let ns = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let rule = match ns.and_then(|n| n.from.clone()) {
        None | Some(From::None) => return false,
        Some(From::Same) => AllowedNamespaces::Same,
        Some(From::All) => AllowedNamespaces::All,
        Some(From::Selector) => AllowedNamespaces::Selector(
            ns.and_then(|n| n.selector.as_ref())
                .and_then(|s| super::model::convert(s).ok())
                .unwrap_or_default(),
        ),
    };
    attach::namespace_allowed(snapshot, &rule, gw_ns, ls_ns)
}

/// Attach the ListenerSets naming `gw` (namespace `gw_ns`): their listeners are appended to
/// `listeners` (the Gateway's own, already validated with `frontends`, whose client
/// certificate validation per port they share). Returns the sets in precedence order.
pub(super) fn attach_sets(
    snapshot: &Snapshot,
    gw: &Gateway,
    gw_ns: &str,
    listeners: &mut Vec<ValidatedListener>,
    frontends: &mut listeners::Frontends,
) -> Vec<AttachedListenerSet> {
    let gw_name = gw.metadata.name.as_deref().unwrap_or_default();
    let mut sets: Vec<_> = snapshot
        .listener_sets
        .iter()
        .filter(|ls| {
            let p = &ls.spec.parent_ref;
            let ls_ns = ls.metadata.namespace.as_deref().unwrap_or_default();
            p.group.as_deref().unwrap_or(GROUP) == GROUP
                && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
                && p.name == gw_name
                && p.namespace.as_deref().unwrap_or(ls_ns) == gw_ns
        })
        .collect();
    sets.sort_by_cached_key(|ls| meta_key(&ls.metadata));
    let mut out = Vec::new();
    for ls in sets {
        let ls_ns = ls.metadata.namespace.clone().unwrap_or_default();
        let mut state = AttachedListenerSet {
            namespace: ls_ns.clone(),
            name: ls.metadata.name.clone().unwrap_or_default(),
            generation: ls.metadata.generation.unwrap_or(0),
            not_allowed: None,
        };
        if !allowed(snapshot, gw, gw_ns, &ls_ns) {
            state.not_allowed = Some(format!(
                "Gateway {gw_ns}/{gw_name} does not allow ListenerSets from namespace {ls_ns}"
            ));
            out.push(state);
            continue;
        }
        // The ListenerSet listener has the same shape as a Gateway listener.
        let specs: Vec<GatewayListeners> = ls
            .spec
            .listeners
            .iter()
            .filter_map(|l| serde_json::to_value(l).ok())
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect();
        let me = out.len();
        for mut l in listeners::validate_set(snapshot, gw, gw_ns, &ls_ns, &specs, frontends) {
            l.owner = Some(me);
            l.home_ns = Some(ls_ns.clone());
            listeners::precedence_conflict(listeners, &mut l);
            listeners.push(l);
        }
        out.push(state);
    }
    out
}

/// Status of every ListenerSet of a Gateway. `gateway_rejected`: the Gateway itself is not
/// accepted.
pub(super) fn statuses(
    b: &mut Builder<'_>,
    sets: &[AttachedListenerSet],
    gw_listeners: &[ValidatedListener],
    gateway_rejected: bool,
) {
    for (me, s) in sets.iter().enumerate() {
        let g = s.generation;
        let (accepted, programmed) = if let Some(why) = &s.not_allowed {
            (
                Condition::new("Accepted", false, "NotAllowed", why, g),
                Condition::new("Programmed", false, "NotAllowed", why, g),
            )
        } else if gateway_rejected {
            let why = "the parent Gateway is not accepted";
            (
                Condition::new("Accepted", false, "ParentNotAccepted", why, g),
                Condition::new("Programmed", false, "ParentNotProgrammed", why, g),
            )
        } else {
            let mine: Vec<&ValidatedListener> = own(gw_listeners, me).collect();
            let invalid: Vec<&str> = mine
                .iter()
                .filter(|l| !l.usable())
                .map(|l| l.name.as_str())
                .collect();
            let accepted = if !s.accepted(gw_listeners, me) {
                Condition::new(
                    "Accepted",
                    false,
                    "ListenersNotValid",
                    "no listener is valid",
                    g,
                )
            } else if invalid.is_empty() {
                Condition::new("Accepted", true, "Accepted", "listener set accepted", g)
            } else {
                Condition::new(
                    "Accepted",
                    true,
                    "ListenersNotValid",
                    format!("invalid listeners: {}", invalid.join(", ")),
                    g,
                )
            };
            let programmed = if mine.iter().any(|l| l.programmed()) {
                Condition::new(
                    "Programmed",
                    true,
                    "Programmed",
                    "listener set programmed",
                    g,
                )
            } else {
                Condition::new(
                    "Programmed",
                    false,
                    "ListenersNotValid",
                    "no listener could be programmed",
                    g,
                )
            };
            (accepted, programmed)
        };
        let listeners = own(gw_listeners, me)
            .map(|l| l.status(g, gateway_rejected))
            .collect();
        b.status(
            ObjectKey::new("ListenerSet", &s.namespace, &s.name),
            ObjectStatus::ListenerSet(SetStatus {
                conditions: vec![accepted, programmed],
                listeners,
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::frontend;
    use super::*;

    #[test]
    fn listener_sets_share_the_gateway_frontend_validation_resolved_once_per_port() {
        let golden = include_str!(
            "../../../testdata/translate/conf-gateway-with-clientcertificate-validation.in.yaml"
        );
        let gateway = "  name: client-validation-default\n  namespace: gateway-conformance-infra\n  generation: 1\nspec:\n  gatewayClassName: sweety\n";
        assert!(golden.contains(gateway));
        let mut y = golden.replace(
            gateway,
            &format!("{gateway}  allowedListeners:\n    namespaces:\n      from: Same\n"),
        );
        for set in 0..3 {
            let tls = "tls: {certificateRefs: [{name: tls-validity-checks-certificate}]}";
            y.push_str(&format!(
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{name: set-{set}, namespace: gateway-conformance-infra}}\n\
spec:\n  parentRef: {{name: client-validation-default}}\n  listeners:\n"
            ));
            y.push_str(&format!(
                "  - {{name: a, port: 443, protocol: HTTPS, hostname: s{set}.example.org, {tls}}}\n"
            ));
            y.push_str(&format!(
                "  - {{name: b, port: 8443, protocol: HTTPS, hostname: t{set}.example.org, {tls}}}\n"
            ));
            // A port the Gateway has no listener on (validated by its `default`): resolved
            // for the first set and shared by the others.
            y.push_str(&format!(
                "  - {{name: c, port: 9443, protocol: HTTPS, hostname: u{set}.example.org, {tls}}}\n"
            ));
        }
        let (s, _) = Snapshot::from_yaml(&y).unwrap();
        let gw = s
            .gateways
            .iter()
            .find(|g| g.metadata.name.as_deref() == Some("client-validation-default"))
            .unwrap();
        let calls = || frontend::RESOLVE_CALLS.with(|c| c.get());
        let before = calls();
        let mut frontends = listeners::Frontends::new();
        let mut all = listeners::validate(&s, gw, &mut frontends);
        assert_eq!(calls() - before, 2, "the Gateway's own ports 443 and 8443");
        let own = all.len();
        let sets = attach_sets(
            &s,
            gw,
            "gateway-conformance-infra",
            &mut all,
            &mut frontends,
        );
        assert_eq!(sets.len(), 3);
        assert!(sets.iter().all(|ls| ls.not_allowed.is_none()));
        assert_eq!(all.len(), own + 9);
        // Three HTTPS ports, each resolved once for the Gateway and its three sets: 443 and
        // 8443 by the Gateway, 9443 by the first set only. Resolving per set would call
        // `frontend::resolve` 2 + 3 * 3 = 11 times.
        assert_eq!(calls() - before, 3);
        assert_eq!(frontends.resolved(), 3);
        for (port, listeners) in [(443, 4), (8443, 4), (9443, 3)] {
            let auths: Vec<_> = all
                .iter()
                .filter(|l| l.port == port)
                .map(|l| l.client_auth.clone())
                .collect();
            assert_eq!(auths.len(), listeners, "port {port}");
            assert!(auths[0].is_some(), "port {port} validates clients");
            assert!(auths.iter().all(|a| *a == auths[0]), "port {port}");
        }
    }
}
