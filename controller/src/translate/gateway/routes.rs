//! Routes of every kind: parentRef attachment to our Gateways, translation of their rules,
//! attachedRoutes counting and route status (only parents that are our Gateways are listed).

use super::attach;
use super::capture::Object;
use super::http::{self, RouteCtx};
use super::l4;
use super::listeners::{RouteKind, GROUP};
use super::model::{self, GrpcRuleSpec, HttpRuleSpec, L4RuleSpec, ParentRefSpec, RouteSpec};
use super::policy::Policies;
use super::{grpc, security, OwnedGateway};
use crate::translate::status::{
    Condition, ObjectKey, ObjectStatus, ParentRef, RouteParentStatus, RouteStatus,
};
use crate::translate::Builder;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeSet;
use sweety_config::{L4Route, Route};

/// Gateway API tie-break: creation time, namespace, name, then rule index.
pub(super) type SortKey = (String, String, String, usize);

/// An HTTP route placed on one Gateway listener.
#[derive(Clone)]
pub(super) struct HttpEntry {
    pub gw: usize,
    pub listener: usize,
    pub hostnames: Vec<String>,
    pub key: SortKey,
    pub route: Route,
}

/// An L4 route placed on one Gateway listener.
#[derive(Clone)]
pub(super) struct L4Entry {
    pub gw: usize,
    pub listener: usize,
    pub key: SortKey,
    pub route: L4Route,
}

/// What the routes contribute to the config.
#[derive(Default)]
pub(super) struct Collected {
    pub http: Vec<HttpEntry>,
    pub l4: Vec<L4Entry>,
}

/// A rule translated independently of where it attaches.
pub(super) enum Rule {
    Http(Box<http::RuleResult>),
    L4(Option<L4Route>),
}

/// Result of translating all rules of a route.
pub(super) struct Rules {
    pub rules: Vec<Rule>,
    pub unresolved: Vec<(&'static str, String)>,
    pub unsupported: Vec<String>,
    pub services: Vec<(String, String)>,
}

/// Gateway API's age order: creation time (RFC 3339 text), namespace, name.
pub(super) fn meta_key(m: &ObjectMeta) -> (String, String, String) {
    let created = m
        .creation_timestamp
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    (
        created,
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Translate every route kind.
pub(super) fn translate(
    b: &mut Builder<'_>,
    gateways: &mut [OwnedGateway],
    policies: &mut Policies,
    out: &mut Collected,
) {
    let snapshot = b.snapshot;
    let mut items: Vec<(RouteKind, &ObjectMeta, Object<'_>)> = Vec::new();
    macro_rules! add {
        ($list:expr, $kind:expr) => {
            for r in &$list {
                items.push(($kind, &r.metadata, Object::new(r, &r.spec)));
            }
        };
    }
    add!(snapshot.http_routes, RouteKind::Http);
    add!(snapshot.grpc_routes, RouteKind::Grpc);
    add!(snapshot.tls_routes, RouteKind::Tls);
    add!(snapshot.tcp_routes, RouteKind::Tcp);
    add!(snapshot.udp_routes, RouteKind::Udp);
    items.sort_by(|a, b| (a.0, &a.1.namespace, &a.1.name).cmp(&(b.0, &b.1.namespace, &b.1.name)));
    for (kind, meta, object) in items {
        route(b, gateways, policies, out, kind, meta, &object.spec());
    }
}

/// Translate one route object: its entries into `out`, its backends, attachment counts,
/// policy use and status into `b`, `gateways` and `policies`.
pub(super) fn route(
    b: &mut Builder<'_>,
    gateways: &mut [OwnedGateway],
    policies: &mut Policies,
    out: &mut Collected,
    kind: RouteKind,
    meta: &ObjectMeta,
    spec: &[u8],
) {
    let (created, ns, name) = meta_key(meta);
    let generation = meta.generation.unwrap_or(0);
    let head: RouteSpec<serde::de::IgnoredAny> = model::from_json(spec).unwrap_or_default();
    // Parents that are our Gateways, or ListenerSets attached to them (the set's index).
    let parents: Vec<(&ParentRefSpec, usize, Option<usize>)> = head
        .parent_refs
        .iter()
        .filter_map(|p| {
            let pns = p.namespace.as_deref().unwrap_or(&ns);
            if attach::is_gateway_ref(p) {
                return gateways
                    .iter()
                    .position(|g| g.namespace == pns && g.name == p.name)
                    .map(|g| (p, g, None));
            }
            if !attach::is_listener_set_ref(p) {
                return None;
            }
            gateways.iter().enumerate().find_map(|(g, gw)| {
                gw.listener_sets
                    .iter()
                    .position(|s| s.namespace == pns && s.name == p.name)
                    .map(|s| (p, g, Some(s)))
            })
        })
        .collect();
    if parents.is_empty() {
        return;
    }
    // Backends are registered in a scratch set and kept only if the route attaches somewhere.
    let kept = std::mem::take(&mut b.backends);
    let rules = translate_rules(b, policies, kind, &ns, &name, spec);
    let scratch = std::mem::replace(&mut b.backends, kept);
    let all_unsupported = !rules.rules.is_empty() && rules.unsupported.len() == rules.rules.len();
    // The rule names, when a SweetySecurityPolicy may target one (`sectionName`).
    let targeted = kind == RouteKind::Http && policies.security.targets_route(&ns, &name);
    let rule_names = if targeted {
        security::rule_names(spec)
    } else {
        Vec::new()
    };
    let http_route = (kind == RouteKind::Http).then_some((ns.as_str(), name.as_str()));
    let mut statuses = Vec::new();
    let mut attached_to: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut used_gateways: BTreeSet<(String, String)> = BTreeSet::new();
    for (p, g, set) in &parents {
        let gw = &gateways[*g];
        let set_problem = set.and_then(|s| {
            let ls = &gw.listener_sets[s];
            (!ls.accepted(&gw.listeners, s)).then(|| {
                format!(
                    "the ListenerSet {}/{} is not accepted by its Gateway",
                    ls.namespace, ls.name
                )
            })
        });
        let result = if let Some(why) = &gw.rejected {
            Err((
                "NoMatchingParent",
                format!("the Gateway is not accepted: {why}"),
            ))
        } else if let Some(why) = set_problem {
            Err(("NoMatchingParent", why))
        } else if all_unsupported {
            Err((
                "UnsupportedValue",
                format!("no rule can be served: {}", rules.unsupported.join("; ")),
            ))
        } else {
            attach::attach(
                b.snapshot,
                &gw.namespace,
                &gw.listeners,
                *set,
                p,
                kind,
                &ns,
                &head.hostnames,
            )
        };
        if targeted {
            // A policy on this route takes effect through the Gateways that accepted it.
            let attached = result.as_ref().map(|_| ()).map_err(|(_, m)| m.clone());
            policies
                .security
                .record_attachment(&ns, &name, &gw.namespace, &gw.name, attached);
        }
        let accepted = match &result {
            Ok(_) => Condition::new("Accepted", true, "Accepted", "route accepted", generation),
            Err((r, m)) => Condition::new("Accepted", false, r, m.clone(), generation),
        };
        let resolved = match rules.unresolved.first() {
            None => Condition::new(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "all references resolved",
                generation,
            ),
            Some((reason, _)) => {
                let msg: Vec<&str> = rules.unresolved.iter().map(|(_, m)| m.as_str()).collect();
                Condition::new("ResolvedRefs", false, reason, msg.join("; "), generation)
            }
        };
        let mut conditions = vec![accepted, resolved];
        if !rules.unsupported.is_empty() && !all_unsupported {
            conditions.push(Condition::new(
                "PartiallyInvalid",
                true,
                "UnsupportedValue",
                rules.unsupported.join("; "),
                generation,
            ));
        }
        statuses.push(RouteParentStatus {
            parent_ref: ParentRef {
                group: Some(GROUP.into()),
                kind: Some(
                    if set.is_some() {
                        "ListenerSet"
                    } else {
                        "Gateway"
                    }
                    .into(),
                ),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                section_name: p.section_name.clone(),
                port: p.port,
            },
            controller_name: b.params.controller_name.clone(),
            conditions,
        });
        let Ok(list) = result else { continue };
        used_gateways.insert((gw.namespace.clone(), gw.name.clone()));
        for (l, hostnames) in list {
            if !attached_to.insert((*g, l)) {
                continue;
            }
            // Attached and counted, but a listener that is not programmed serves nothing.
            if !gw.listeners[l].programmed() {
                continue;
            }
            for (i, rule) in rules.rules.iter().enumerate() {
                let key = (created.clone(), ns.clone(), name.clone(), i);
                match rule {
                    Rule::Http(r) if !r.dropped => {
                        let mut route = r.route.clone();
                        let rule = rule_names.get(i).and_then(Option::as_deref);
                        policies.security.apply(gw, l, http_route, rule, &mut route);
                        out.http.push(HttpEntry {
                            gw: *g,
                            listener: l,
                            hostnames: hostnames.clone(),
                            key,
                            route,
                        })
                    }
                    // A security policy covers the listener: a byte stream cannot be guarded,
                    // so it is not served (fail closed; the policy's status says why).
                    Rule::L4(Some(_)) if policies.security.guards_listener(gw, l) => {}
                    Rule::L4(Some(r)) => {
                        let mut r = r.clone();
                        if kind == RouteKind::Tls {
                            r.hostnames = hostnames.clone();
                        }
                        out.l4.push(L4Entry {
                            gw: *g,
                            listener: l,
                            key,
                            route: r,
                        });
                    }
                    _ => {}
                }
            }
        }
    }
    if !attached_to.is_empty() {
        for backend in scratch.into_config() {
            b.backends.insert(backend);
        }
    }
    for (g, l) in attached_to {
        gateways[g].listeners[l].attached += 1;
    }
    for (sns, sname) in &rules.services {
        for key in policies.all_for(sns, sname) {
            policies
                .used_by
                .entry(key)
                .or_default()
                .extend(used_gateways.iter().cloned());
        }
    }
    b.status(
        ObjectKey::new(kind.name(), &ns, &name),
        ObjectStatus::Route(RouteStatus { parents: statuses }),
    );
}

fn translate_rules(
    b: &mut Builder<'_>,
    policies: &Policies,
    kind: RouteKind,
    ns: &str,
    name: &str,
    spec: &[u8],
) -> Rules {
    let mut out = Rules {
        rules: Vec::new(),
        unresolved: Vec::new(),
        unsupported: Vec::new(),
        services: Vec::new(),
    };
    let http_rules: Option<Vec<HttpRuleSpec>> = match kind {
        RouteKind::Http => Some(
            model::from_json::<RouteSpec<HttpRuleSpec>>(spec)
                .unwrap_or_default()
                .rules,
        ),
        RouteKind::Grpc => Some(
            model::from_json::<RouteSpec<GrpcRuleSpec>>(spec)
                .unwrap_or_default()
                .rules
                .iter()
                .map(grpc::to_http)
                .collect(),
        ),
        _ => None,
    };
    match http_rules {
        Some(rules) => {
            let ctx = RouteCtx {
                policies,
                kind: kind.name(),
                namespace: ns.into(),
                name: name.into(),
                grpc: kind == RouteKind::Grpc,
            };
            // A route without rules behaves as one rule with no matches and no backends.
            let rules = if rules.is_empty() {
                vec![HttpRuleSpec::default()]
            } else {
                rules
            };
            for (i, rule) in rules.iter().enumerate() {
                let r = ctx.rule(b, i, rule);
                for p in &r.unresolved {
                    if !out.unresolved.contains(p) {
                        out.unresolved.push(p.clone());
                    }
                }
                if let Some(why) = &r.unsupported {
                    out.unsupported.push(format!("rule {i} answers 500: {why}"));
                }
                for s in &r.services {
                    if !out.services.contains(s) {
                        out.services.push(s.clone());
                    }
                }
                out.rules.push(Rule::Http(Box::new(r)));
            }
        }
        None => {
            let rules = model::from_json::<RouteSpec<L4RuleSpec>>(spec)
                .unwrap_or_default()
                .rules;
            for (i, rule) in rules.iter().enumerate() {
                let r = l4::rule(b, kind, ns, name, i, rule, &mut out.unresolved);
                out.rules.push(Rule::L4(r));
            }
        }
    }
    out
}
