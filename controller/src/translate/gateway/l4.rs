//! TLSRoute (passthrough by SNI), TCPRoute and UDPRoute rules into sweety-config L4 routes.
//! Backends that do not resolve are left out and reported; a rule with none left has no
//! L4 route (its connections match no route: the listener accepts and closes them).

use super::backend;
use super::listeners::{Problem, RouteKind};
use super::model::L4RuleSpec;
use super::policy::Policies;
use crate::translate::Builder;
use sweety_config::{L4Route, WeightedBackend};

/// Translate one L4 rule; hostnames are filled in per listener by the caller.
pub(super) fn rule(
    b: &mut Builder<'_>,
    kind: RouteKind,
    ns: &str,
    name: &str,
    idx: usize,
    rule: &L4RuleSpec,
    unresolved: &mut Vec<Problem>,
) -> Option<L4Route> {
    // BackendTLSPolicy does not apply to L4 traffic.
    let none = Policies::default();
    let mut backends = Vec::new();
    for r in &rule.backend_refs {
        match backend::resolve(b, &none, kind.name(), ns, r, false) {
            Ok(res) => backends.push(WeightedBackend {
                backend: res.backend,
                weight: u32::try_from(r.weight.unwrap_or(1)).unwrap_or(0),
                filters: Vec::new(),
            }),
            Err(p) => unresolved.push(p),
        }
    }
    if backends.is_empty() {
        return None;
    }
    let label = rule.name.clone().unwrap_or_else(|| format!("rule-{idx}"));
    Some(L4Route {
        name: format!("{}/{ns}/{name}/{label}", kind.name().to_lowercase()),
        hostnames: Vec::new(),
        terminate: false,
        backends,
    })
}
