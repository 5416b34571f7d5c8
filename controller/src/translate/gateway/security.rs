//! SweetySecurityPolicy: external authentication, basic authentication, client certificates
//! and IP rules attached to Gateways and HTTPRoutes (GEP-713 local policy attachment), and
//! the policies' status per Gateway (ancestor) they take effect through.
//!
//! **Targets.** `targetRefs` name Gateways (every route attached through them; with
//! `sectionName`, through that listener of the Gateway's own) and HTTPRoutes (every rule;
//! with `sectionName`, the rule of that name) of the policy's namespace. Other kinds are
//! `Invalid`. A route's rule takes the policy of its HTTPRoute rule, else of its HTTPRoute,
//! else of its listener, else of its Gateway: the more specific policy replaces the other
//! whole (as Envoy Gateway's SecurityPolicy), except `clientCertificate`, which belongs to the
//! listener's TLS handshake and holds whatever an HTTPRoute's policy says.
//!
//! **Conflicts.** Two policies naming the same target (kind, name and section): the oldest
//! (creation time, then namespace/name) wins; the others are not applied there and say
//! `Accepted: False` / `Conflicted` and `Conflicted: True`.
//!
//! **Ancestors** (the status, GEP-713 `PolicyAncestorStatus`): a Gateway target is its own
//! ancestor (with `sectionName`); an HTTPRoute target's are the Gateways of ours its parentRefs
//! name (directly or through a ListenerSet), `Accepted` only through those that accepted the
//! route: through the others `TargetNotFound` with the route's reason. A target that does not
//! exist, or an HTTPRoute naming no Gateway of ours, is its own ancestor, `TargetNotFound`.
//!
//! **What each part becomes.** `ipRules`: an `ip_access` filter (entries read with
//! ingress-nginx's [`masked_cidr`]); `basicAuth`: a `basic_auth` filter from the Secret's
//! htpasswd file ([`sweety_config::htpasswd`], key `auth` or `.htpasswd`); `extAuth`: an
//! `external_auth` filter asking the Service's cluster address (or its DNS name when headless,
//! its `externalName` when such Services are allowed) with addresses restricted as a tenant's;
//! `clientCertificate`: a `host_client_auth` entry, for the listener's hostname, of the
//! dataplane listener of each targeted HTTPS listener (CA checked with ingress-nginx's
//! [`check_client_ca`]).
//!
//! **Fail closed.** A policy that cannot be honoured (a missing or unusable Secret, ConfigMap
//! or Service, a reference into another namespace without a ReferenceGrant, an htpasswd file
//! without a usable entry, an entry of `ipRules` that is not an address or network, a
//! `clientCertificate` on an HTTPRoute, or on a listener that is not HTTPS, has no hostname or
//! already validates client certificates through the Gateway's `spec.tls.frontend`) makes every
//! rule it would apply to answer 500 (the Gateway API's answer for a rule that cannot be
//! served) and says why in its status (`Accepted: False`, `Invalid`); the rest of the config
//! is unaffected.

use super::listeners::{Proto, RouteKind, GROUP};
use super::model::{self, HttpRuleSpec, RouteSpec};
use super::refgrant::{self, Reference};
use super::routes::meta_key;
use super::OwnedGateway;
use crate::translate::backends::PortRef;
use crate::translate::ingress::nginx::{check_client_ca, masked_cidr};
use crate::translate::snapshot::CA_KEY;
use crate::translate::status::{
    Condition, ObjectKey, ObjectStatus, ParentRef, PolicyStatus, RouteParentStatus,
};
use crate::translate::{Builder, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use sweety_config::htpasswd::{self, BasicAuth};
use sweety_config::{
    Action, ExternalAuth, Filter, FixedResponse, HostClientAuth, HostVerify, IpAccess, PemSource,
    Route,
};
use sweety_crds::security_policy::{ClientCertificateMode, ObjectRef, ServiceRef};
use sweety_crds::SweetySecurityPolicy;

/// The kind of the policy (status keys, ReferenceGrant `from`).
pub(super) const KIND: &str = "SweetySecurityPolicy";
/// Its API group.
const POLICY_GROUP: &str = "sweety.dev";
/// Most ancestors listed in a policy's status (the CRD's `maxItems`).
const MAX_ANCESTORS: usize = 16;

/// What a valid policy adds to the rules it applies to.
#[derive(Clone, Debug, Default)]
struct Settings {
    ip: Option<IpAccess>,
    basic: Option<BasicAuth>,
    ext: Option<ExternalAuth>,
    /// Without hostnames (each listener adds its own).
    client_cert: Option<HostClientAuth>,
    /// Said in `Accepted: True`'s message (htpasswd entries refused).
    notes: Vec<String>,
}

/// One policy, resolved.
struct Resolved {
    namespace: String,
    name: String,
    generation: i64,
    settings: Result<Settings, String>,
    /// `spec.clientCertificate` is set.
    has_client_cert: bool,
}

/// A target (kind, namespace, name, section).
type TargetKey = (&'static str, String, String, Option<String>);

/// What became of one `targetRefs` entry.
#[derive(Clone, Debug)]
enum Outcome {
    /// Not a Gateway or HTTPRoute of `gateway.networking.k8s.io`.
    Unsupported(String),
    /// An older policy (index) has the same target.
    Conflicted(usize),
    /// Applied (Err: why this target cannot take it, besides the policy's own validity).
    Applied(TargetKey, Result<(), String>),
}

/// The client certificate a policy gives one Gateway listener, or why it cannot.
#[derive(Clone, Debug)]
pub struct ListenerCert {
    /// The policy (index into [`SecurityPolicies`]).
    policy: usize,
    /// The `host_client_auth` entry (with the listener's hostname), or why not.
    pub entry: Result<HostClientAuth, String>,
}

/// Per targeted HTTPRoute (namespace, name), per Gateway of ours (namespace, name) its
/// parentRefs name (directly or through a ListenerSet): attached there, or why not (the
/// message of its route status's `Accepted: False`).
pub(super) type Attachments =
    BTreeMap<(String, String), BTreeMap<(String, String), Result<(), String>>>;

/// Every SweetySecurityPolicy, resolved, with the winner of each target.
#[derive(Default)]
pub struct SecurityPolicies {
    policies: Vec<Resolved>,
    /// Per policy, per `targetRefs` entry.
    outcomes: Vec<Vec<Outcome>>,
    /// The policy applied at each target, and whether it applies there.
    winners: BTreeMap<TargetKey, (usize, Result<(), String>)>,
    /// Where the HTTPRoutes some policy targets are attached: the ancestors of their
    /// policies (filled by the route translation, [`SecurityPolicies::record_attachment`]).
    pub(super) attachments: Attachments,
    /// The users of every htpasswd Secret a valid policy reads, by user set name (see
    /// [`user_set_name`]): the `basic_auth` filters name them instead of copying them.
    user_sets: BTreeMap<String, Vec<sweety_config::BasicAuthUser>>,
}

/// The name of the config's user set holding the users of htpasswd Secret `ns/name` (one
/// per Secret, whichever policies read it).
fn user_set_name(ns: &str, name: &str) -> String {
    format!("secret/{ns}/{name}")
}

/// The Services SweetySecurityPolicies name as auth services (their changes are changes of
/// the world: see `crate::translate::cache`).
pub fn services(s: &Snapshot) -> BTreeSet<(String, String)> {
    s.security_policies
        .iter()
        .filter_map(|p| {
            let r = &p.spec.ext_auth.as_ref()?.backend_ref;
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            Some((
                r.namespace.clone().unwrap_or_else(|| ns.to_string()),
                r.name.clone(),
            ))
        })
        .collect()
}

/// Resolve every policy (oldest first) and pick the winner of each target; then the client
/// certificates of the Gateways' listeners (into `gateways`).
pub(super) fn collect(b: &Builder<'_>, gateways: &mut [OwnedGateway]) -> SecurityPolicies {
    let mut list: Vec<&SweetySecurityPolicy> =
        b.snapshot.security_policies.iter().map(|p| &**p).collect();
    list.sort_by_cached_key(|p| meta_key(&p.metadata));
    let mut out = SecurityPolicies::default();
    for p in list {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let index = out.policies.len();
        let mut outcomes = Vec::new();
        for t in &p.spec.target_refs {
            let kind = match (t.group.as_str(), t.kind.as_str()) {
                (GROUP, "Gateway") => "Gateway",
                (GROUP, "HTTPRoute") => "HTTPRoute",
                (g, k) => {
                    outcomes.push(Outcome::Unsupported(format!(
                        "targetRef {k} {} of group {g:?} is not supported: a Gateway or \
                         HTTPRoute of {GROUP} only",
                        t.name
                    )));
                    continue;
                }
            };
            let key: TargetKey = (kind, ns.clone(), t.name.clone(), t.section_name.clone());
            match out.winners.get(&key) {
                Some((w, _)) if *w != index => outcomes.push(Outcome::Conflicted(*w)),
                _ => {
                    let fits = if kind == "HTTPRoute" && p.spec.client_certificate.is_some() {
                        Err(
                            "clientCertificate applies to Gateways and their listeners only \
                             (the certificate is asked for at the TLS handshake); this \
                             HTTPRoute's rules answer 500"
                                .to_string(),
                        )
                    } else {
                        Ok(())
                    };
                    out.winners.insert(key.clone(), (index, fits.clone()));
                    outcomes.push(Outcome::Applied(key, fits));
                }
            }
        }
        out.policies.push(Resolved {
            settings: settings(b, &ns, p, &mut out.user_sets),
            has_client_cert: p.spec.client_certificate.is_some(),
            namespace: ns,
            name,
            generation: p.metadata.generation.unwrap_or(0),
        });
        out.outcomes.push(outcomes);
    }
    for gw in gateways.iter_mut() {
        let mut certs = BTreeMap::new();
        for (l, lis) in gw.listeners.iter().enumerate() {
            let Some(policy) = out.gateway_policy(gw, l) else {
                continue;
            };
            let p = &out.policies[policy];
            if !p.has_client_cert {
                continue;
            }
            let entry = match &p.settings {
                Err(why) => Err(why.clone()),
                Ok(s) => listener_entry(s, lis),
            };
            certs.insert(l, ListenerCert { policy, entry });
        }
        gw.client_certs = certs;
    }
    out
}

/// The `host_client_auth` entry of a policy's client certificate on one listener.
fn listener_entry(
    s: &Settings,
    lis: &super::listeners::ValidatedListener,
) -> Result<HostClientAuth, String> {
    let Some(cc) = &s.client_cert else {
        return Err("clientCertificate has no usable settings".into());
    };
    if lis.protocol != Some(Proto::Https) {
        return Err(format!(
            "listener {} is not HTTPS: no client certificate can be asked for there (target \
             the HTTPS listener by sectionName)",
            lis.name
        ));
    }
    let Some(host) = &lis.hostname else {
        return Err(format!(
            "listener {} has no hostname: client certificates are asked for by TLS server \
             name, per hostname",
            lis.name
        ));
    };
    if lis.client_auth.is_some() {
        return Err(format!(
            "the Gateway's spec.tls.frontend already validates client certificates on port {}",
            lis.port
        ));
    }
    Ok(HostClientAuth {
        hostnames: vec![host.clone()],
        ..cc.clone()
    })
}

impl SecurityPolicies {
    /// No policy at all.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The user sets the `basic_auth` filters of the policies name (the config's
    /// `user_sets`): every one a valid policy's filter can name, so none is ever missing.
    pub fn user_sets(&self) -> Vec<sweety_config::UserSet> {
        self.user_sets
            .iter()
            .map(|(name, users)| sweety_config::UserSet {
                name: name.clone(),
                users: users.clone(),
            })
            .collect()
    }

    /// The policy of Gateway listener `l`: its own (by `sectionName`; the Gateway's own
    /// listeners only), else the Gateway's.
    fn gateway_policy(&self, gw: &OwnedGateway, l: usize) -> Option<usize> {
        let lis = &gw.listeners[l];
        let key = |section: Option<String>| -> TargetKey {
            ("Gateway", gw.namespace.clone(), gw.name.clone(), section)
        };
        lis.owner
            .is_none()
            .then(|| self.winners.get(&key(Some(lis.name.clone()))))
            .flatten()
            .or_else(|| self.winners.get(&key(None)))
            .map(|(p, _)| *p)
    }

    /// Whether a policy of Gateway `gw` (or of its listener `l`) covers that listener: its
    /// TCP, TLS and UDP routes are then not served, as none of a policy's powers can guard a
    /// byte stream (fail closed; the policy's status says so).
    pub(super) fn guards_listener(&self, gw: &OwnedGateway, l: usize) -> bool {
        !self.policies.is_empty() && self.gateway_policy(gw, l).is_some()
    }

    /// Whether some policy targets HTTPRoute `namespace/name` (its rule names are then needed).
    pub fn targets_route(&self, namespace: &str, name: &str) -> bool {
        let from: TargetKey = ("HTTPRoute", namespace.into(), name.into(), None);
        self.winners
            .range(from..)
            .next()
            .is_some_and(|(k, _)| k.0 == "HTTPRoute" && k.1 == namespace && k.2 == name)
    }

    /// Record whether HTTPRoute `namespace/name` (one some policy targets) is attached to
    /// Gateway `gw_namespace/gw_name` through one of its parentRefs: attached through any of
    /// them is attached; otherwise the first reason is kept.
    pub(super) fn record_attachment(
        &mut self,
        namespace: &str,
        name: &str,
        gw_namespace: &str,
        gw_name: &str,
        attached: Result<(), String>,
    ) {
        let per = self
            .attachments
            .entry((namespace.into(), name.into()))
            .or_default();
        let gw = (gw_namespace.to_string(), gw_name.to_string());
        if attached.is_ok() || !per.contains_key(&gw) {
            per.insert(gw, attached);
        }
    }

    /// Apply the policy in effect to one rule of a route placed on Gateway `g`'s listener `l`:
    /// `http_route` and `rule` (its name) when the route is an HTTPRoute.
    pub(super) fn apply(
        &self,
        gw: &OwnedGateway,
        l: usize,
        http_route: Option<(&str, &str)>,
        rule: Option<&str>,
        route: &mut Route,
    ) {
        if self.policies.is_empty() {
            return;
        }
        // The listener's client certificate holds whatever the route's policy says.
        if let Some(ListenerCert {
            policy,
            entry: Err(_),
        }) = gw.client_certs.get(&l)
        {
            self.refuse(*policy, route);
            return;
        }
        let on_route = http_route.and_then(|(ns, name)| {
            let key = |section: Option<&str>| -> TargetKey {
                (
                    "HTTPRoute",
                    ns.into(),
                    name.into(),
                    section.map(String::from),
                )
            };
            rule.and_then(|r| self.winners.get(&key(Some(r))))
                .or_else(|| self.winners.get(&key(None)))
        });
        let chosen = match on_route {
            Some((p, Err(_))) => {
                self.refuse(*p, route);
                return;
            }
            Some((p, Ok(()))) => Some(*p),
            None => self.gateway_policy(gw, l),
        };
        let Some(p) = chosen else { return };
        let s = match &self.policies[p].settings {
            Ok(s) => s,
            Err(_) => {
                self.refuse(p, route);
                return;
            }
        };
        let mut filters = Vec::new();
        if let Some(ip) = &s.ip {
            filters.push(Filter::IpAccess(ip.clone()));
        }
        if let Some(basic) = &s.basic {
            filters.push(Filter::BasicAuth(basic.clone()));
        }
        if let Some(ext) = &s.ext {
            filters.push(Filter::ExternalAuth(ext.clone()));
        }
        if !filters.is_empty() {
            filters.append(&mut route.filters);
            route.filters = filters;
            // What the dataplane would refuse must not reach it: one bad rule would make it
            // reject every config after this one (every tenant's). Its status says why.
            if super::http::check_route(route).is_err() {
                self.refuse(p, route);
            }
        }
    }

    /// Fail one rule closed: 500, naming the policy (why is in its status, not told clients).
    fn refuse(&self, p: usize, route: &mut Route) {
        let p = &self.policies[p];
        route.filters.clear();
        route.timeouts = Default::default();
        route.retry = None;
        route.action = Action::Fixed(FixedResponse {
            status: 500,
            body: format!(
                "{KIND} {}/{} cannot be honoured; its status says why\n",
                p.namespace, p.name
            ),
            content_type: Some("text/plain; charset=utf-8".into()),
        });
    }
}

/// The rule names of an HTTPRoute spec, in rule order.
pub(super) fn rule_names(spec: &[u8]) -> Vec<Option<String>> {
    model::from_json::<RouteSpec<HttpRuleSpec>>(spec)
        .unwrap_or_default()
        .rules
        .into_iter()
        .map(|r| r.name)
        .collect()
}

/// The settings of one policy, or why it cannot be honoured; the users of its htpasswd
/// Secret go into `user_sets` (its `basic_auth` filter names them).
fn settings(
    b: &Builder<'_>,
    ns: &str,
    p: &SweetySecurityPolicy,
    user_sets: &mut BTreeMap<String, Vec<sweety_config::BasicAuthUser>>,
) -> Result<Settings, String> {
    let spec = &p.spec;
    let mut s = Settings::default();
    if spec.ext_auth.is_none()
        && spec.basic_auth.is_none()
        && spec.client_certificate.is_none()
        && spec.ip_rules.is_none()
    {
        return Err("sets none of extAuth, basicAuth, clientCertificate, ipRules".into());
    }
    if let Some(rules) = &spec.ip_rules {
        let read = |list: &[String], field: &str| -> Result<Vec<String>, String> {
            list.iter()
                .map(|c| masked_cidr(c).map_err(|e| format!("ipRules.{field}: {e}")))
                .collect()
        };
        if rules.allow.is_empty() && rules.deny.is_empty() {
            return Err("ipRules lists no address: name at least one in allow or deny".into());
        }
        s.ip = Some(IpAccess {
            allow: read(&rules.allow, "allow")?,
            deny: read(&rules.deny, "deny")?,
        });
    }
    if let Some(basic) = &spec.basic_auth {
        let realm = basic.realm.clone().unwrap_or_default();
        htpasswd::check_realm(&realm).map_err(|e| format!("basicAuth.realm {e}"))?;
        let secret = secret(b, ns, &basic.secret_ref, "basicAuth.secretRef")?;
        let data = secret.data.as_ref();
        let text = ["auth", ".htpasswd"]
            .iter()
            .find_map(|k| data.and_then(|d| d.get(*k)))
            .ok_or_else(|| {
                format!(
                    "basicAuth: the Secret {} has no key \"auth\" or \".htpasswd\"",
                    ref_name(ns, &basic.secret_ref)
                )
            })?;
        let text = std::str::from_utf8(&text.0).map_err(|_| {
            format!(
                "basicAuth: the Secret {}'s htpasswd file is not UTF-8",
                ref_name(ns, &basic.secret_ref)
            )
        })?;
        let parsed = htpasswd::parse(text);
        if parsed.users.is_empty() {
            return Err(format!(
                "basicAuth: the Secret {} has no usable htpasswd entry (bcrypt, $apr1$ or {{SHA}})",
                ref_name(ns, &basic.secret_ref)
            ));
        }
        if !parsed.rejected.is_empty() {
            // Bounded: a Secret of a million bad lines must not make a status the apiserver
            // refuses.
            let max = crate::translate::ingress::nginx::MAX_REJECTED_REPORTED;
            let mut lines: Vec<String> = parsed
                .rejected
                .iter()
                .take(max)
                .map(|r| r.line.to_string())
                .collect();
            if parsed.rejected.len() > max {
                lines.push(format!("and {} more", parsed.rejected.len() - max));
            }
            s.notes.push(format!(
                "basicAuth: htpasswd lines {} refused (only bcrypt, $apr1$ and {{SHA}}); those \
                 users cannot log in",
                lines.join(", ")
            ));
        }
        // What the dataplane would refuse (too many users) must not reach it: a set is
        // checked with the config (not with each rule), so here.
        if let Some((field, m)) = htpasswd::check_users(&parsed.users).into_iter().next() {
            return Err(format!(
                "basicAuth: the Secret {}'s htpasswd file: {field} {m}",
                ref_name(ns, &basic.secret_ref)
            ));
        }
        let to_ns = basic.secret_ref.namespace.as_deref().unwrap_or(ns);
        let set = user_set_name(to_ns, &basic.secret_ref.name);
        user_sets.insert(set.clone(), parsed.users);
        s.basic = Some(BasicAuth {
            realm,
            users: Vec::new(),
            user_set: Some(set),
        });
    }
    if let Some(ext) = &spec.ext_auth {
        s.ext = Some(ext_auth(b, ns, ext)?);
    }
    if let Some(cc) = &spec.client_certificate {
        let mut bundle = String::new();
        for r in &cc.ca_certificate_refs {
            let pem = ca(b, ns, r)?;
            check_client_ca(&pem).map_err(|e| {
                format!(
                    "clientCertificate: {} {}'s ca.crt {e}",
                    r.kind.as_deref().unwrap_or("Secret"),
                    ref_name(ns, r)
                )
            })?;
            bundle.push_str(&pem);
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
        }
        if bundle.is_empty() {
            return Err("clientCertificate: no caCertificateRefs".into());
        }
        let max = i32::from(sweety_config::MAX_VERIFY_DEPTH);
        let depth = cc.verify_depth.unwrap_or(1);
        if !(1..=max).contains(&depth) {
            return Err(format!(
                "clientCertificate.verifyDepth {depth} is not between 1 and {max}"
            ));
        }
        s.client_cert = Some(HostClientAuth {
            hostnames: Vec::new(),
            ca: PemSource::Pem(bundle),
            verify: match cc.mode {
                ClientCertificateMode::Require => HostVerify::Require,
                ClientCertificateMode::Optional => HostVerify::Optional,
                ClientCertificateMode::OptionalNoCA => HostVerify::OptionalNoCa,
            },
            verify_depth: u8::try_from(depth).unwrap_or(1),
            pass_certificate: cc.pass_certificate_to_upstream,
            error_page: None,
            match_subject: None,
        });
    }
    Ok(s)
}

fn ref_name(ns: &str, r: &ObjectRef) -> String {
    format!("{}/{}", r.namespace.as_deref().unwrap_or(ns), r.name)
}

/// May the policy in `ns` read `kind` `to_ns/name`? (Same namespace, or a ReferenceGrant.)
fn permitted(b: &Builder<'_>, ns: &str, kind: &str, to_ns: &str, name: &str) -> bool {
    refgrant::permitted(
        b.snapshot,
        &Reference {
            from_group: POLICY_GROUP,
            from_kind: KIND,
            from_namespace: ns,
            to_group: "",
            to_kind: kind,
            to_namespace: to_ns,
            to_name: name,
        },
    )
}

/// The Secret a reference names (its group and kind checked, a grant for another namespace).
fn secret<'s>(
    b: &Builder<'s>,
    ns: &str,
    r: &ObjectRef,
    field: &str,
) -> Result<&'s k8s_openapi::api::core::v1::Secret, String> {
    if r.group.as_deref().is_some_and(|g| !g.is_empty())
        || r.kind.as_deref().is_some_and(|k| k != "Secret")
    {
        return Err(format!("{field} must name a core Secret"));
    }
    let to_ns = r.namespace.as_deref().unwrap_or(ns);
    if !permitted(b, ns, "Secret", to_ns, &r.name) {
        return Err(format!(
            "{field}: the Secret {to_ns}/{} is in another namespace and no ReferenceGrant there \
             allows it",
            r.name
        ));
    }
    b.snapshot
        .secrets
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(to_ns)
                && s.metadata.name.as_deref() == Some(r.name.as_str())
        })
        .map(|s| &**s)
        .ok_or_else(|| format!("{field}: the Secret {to_ns}/{} does not exist", r.name))
}

/// The `ca.crt` of a ConfigMap or Secret reference.
fn ca(b: &Builder<'_>, ns: &str, r: &ObjectRef) -> Result<String, String> {
    let field = "clientCertificate.caCertificateRefs";
    match r.kind.as_deref().unwrap_or("Secret") {
        "ConfigMap" if r.group.as_deref().unwrap_or_default().is_empty() => {
            let to_ns = r.namespace.as_deref().unwrap_or(ns);
            if !permitted(b, ns, "ConfigMap", to_ns, &r.name) {
                return Err(format!(
                    "{field}: the ConfigMap {to_ns}/{} is in another namespace and no \
                     ReferenceGrant there allows it",
                    r.name
                ));
            }
            match b.snapshot.config_map_ca(to_ns, &r.name) {
                None => Err(format!(
                    "{field}: the ConfigMap {to_ns}/{} does not exist",
                    r.name
                )),
                Some(None) => Err(format!(
                    "{field}: the ConfigMap {to_ns}/{} has no key \"{CA_KEY}\"",
                    r.name
                )),
                Some(Some(pem)) => Ok(pem.to_string()),
            }
        }
        _ => {
            let s = secret(b, ns, r, field)?;
            let pem = s.data.as_ref().and_then(|d| d.get(CA_KEY)).ok_or_else(|| {
                format!(
                    "{field}: the Secret {} has no key \"{CA_KEY}\"",
                    ref_name(ns, r)
                )
            })?;
            String::from_utf8(pem.0.clone()).map_err(|_| {
                format!(
                    "{field}: the Secret {}'s ca.crt is not PEM text",
                    ref_name(ns, r)
                )
            })
        }
    }
}

/// The `external_auth` filter of `extAuth`.
fn ext_auth(
    b: &Builder<'_>,
    ns: &str,
    ext: &sweety_crds::security_policy::ExtAuth,
) -> Result<ExternalAuth, String> {
    let r: &ServiceRef = &ext.backend_ref;
    if r.group.as_deref().is_some_and(|g| !g.is_empty())
        || r.kind.as_deref().is_some_and(|k| k != "Service")
    {
        return Err("extAuth.backendRef must name a core Service".into());
    }
    let to_ns = r.namespace.as_deref().unwrap_or(ns);
    if !permitted(b, ns, "Service", to_ns, &r.name) {
        return Err(format!(
            "extAuth.backendRef: the Service {to_ns}/{} is in another namespace and no \
             ReferenceGrant there allows it",
            r.name
        ));
    }
    let (svc, port) = b
        .services
        .port(to_ns, &r.name, Some(&PortRef::Number(r.port)))
        .map_err(|e| format!("extAuth.backendRef: {e}"))?;
    let spec = svc.spec.as_ref();
    let host = match spec.and_then(|s| s.type_.as_deref()) {
        Some("ExternalName") => spec
            .and_then(|s| s.external_name.clone())
            .unwrap_or_default(),
        _ => match spec.and_then(|s| s.cluster_ip.as_deref()) {
            Some(ip) if ip.contains(':') => format!("[{ip}]"),
            Some(ip) if !ip.is_empty() && ip != "None" => ip.to_string(),
            // Headless: the Service's DNS name.
            _ => format!("{}.{to_ns}.svc", r.name),
        },
    };
    let path = ext.path.as_deref().unwrap_or("/");
    let url = format!("http://{host}:{}{path}", port.port);
    sweety_config::ext_auth::parse_auth_url(&url)
        .map_err(|e| format!("extAuth: the auth URL {url:?} {e}"))?;
    let mut f = ExternalAuth::new(url);
    f.restrict_addresses = true;
    f.response_headers = ext.headers_to_backend.clone();
    f.signin = ext.signin_url.clone();
    let problems = sweety_config::ext_auth::check_external_auth(&f);
    if !problems.is_empty() {
        let field = |f: &str| match f.split('[').next().unwrap_or(f) {
            "response_headers" => "extAuth.headersToBackend",
            "signin" | "signin_redirect_param" => "extAuth.signinURL",
            _ => "extAuth",
        };
        return Err(problems
            .iter()
            .map(|(f, m)| format!("{} {m}", field(f)))
            .collect::<Vec<_>>()
            .join("; "));
    }
    Ok(f)
}

/// One ancestor entry: its reference and the result there.
type Entry = (ParentRef, Result<(), (&'static str, String)>);

fn gateway_ref(ns: &str, name: &str, section: Option<String>) -> ParentRef {
    ParentRef {
        group: Some(GROUP.into()),
        kind: Some("Gateway".into()),
        namespace: Some(ns.into()),
        name: name.into(),
        section_name: section,
        port: None,
    }
}

/// Write the status of every policy that reaches one of our Gateways (or names a target that
/// does not exist). Reads the route objects (their parents and rule names) from the snapshot.
pub(super) fn statuses(b: &mut Builder<'_>, sec: &SecurityPolicies, gateways: &[OwnedGateway]) {
    let ours = |ns: &str, name: &str| {
        gateways
            .iter()
            .position(|g| g.namespace == ns && g.name == name)
    };
    let mut all = Vec::new();
    for (i, p) in sec.policies.iter().enumerate() {
        let mut entries: Vec<Entry> = Vec::new();
        let spec = b
            .snapshot
            .security_policies
            .iter()
            .find(|o| {
                o.metadata.namespace.as_deref() == Some(&p.namespace)
                    && o.metadata.name.as_deref() == Some(&p.name)
            })
            .map(|o| o.spec.target_refs.clone())
            .unwrap_or_default();
        for (t, outcome) in spec.iter().zip(&sec.outcomes[i]) {
            let verdict = |fits: &Result<(), String>| -> Result<(), (&'static str, String)> {
                match (&p.settings, fits) {
                    (Err(why), _) | (Ok(_), Err(why)) => Err(("Invalid", why.clone())),
                    (Ok(_), Ok(())) => Ok(()),
                }
            };
            match outcome {
                Outcome::Unsupported(why) => entries.push((
                    ParentRef {
                        group: Some(t.group.clone()),
                        kind: Some(t.kind.clone()),
                        namespace: Some(p.namespace.clone()),
                        name: t.name.clone(),
                        section_name: t.section_name.clone(),
                        port: None,
                    },
                    Err(("Invalid", why.clone())),
                )),
                Outcome::Conflicted(w) => {
                    let w = &sec.policies[*w];
                    let why = format!(
                        "{KIND} {}/{} is older and targets the same {} {}{}",
                        w.namespace,
                        w.name,
                        t.kind,
                        t.name,
                        t.section_name
                            .as_deref()
                            .map(|s| format!(" section {s}"))
                            .unwrap_or_default()
                    );
                    let conflicted = Err(("Conflicted", why));
                    if t.kind == "Gateway" {
                        if ours(&p.namespace, &t.name).is_some() {
                            entries.push((
                                gateway_ref(&p.namespace, &t.name, t.section_name.clone()),
                                conflicted,
                            ));
                        }
                    } else {
                        for (r, attached) in route_reach(b.snapshot, sec, &p.namespace, &t.name) {
                            entries.push((r, attached.and(conflicted.clone())));
                        }
                    }
                }
                Outcome::Applied((kind, _, name, section), fits) => {
                    if *kind == "Gateway" {
                        let Some(g) = ours(&p.namespace, name) else {
                            if !b.snapshot.gateways.iter().any(|o| {
                                o.metadata.namespace.as_deref() == Some(&p.namespace)
                                    && o.metadata.name.as_deref() == Some(name)
                            }) {
                                entries.push((
                                    gateway_ref(&p.namespace, name, section.clone()),
                                    Err((
                                        "TargetNotFound",
                                        format!("Gateway {}/{name} does not exist", p.namespace),
                                    )),
                                ));
                            }
                            continue;
                        };
                        let gw = &gateways[g];
                        let listener = section.as_ref().map(|s| {
                            gw.listeners
                                .iter()
                                .any(|l| l.owner.is_none() && &l.name == s)
                        });
                        let mut result = verdict(fits);
                        if listener == Some(false) {
                            result = Err((
                                "TargetNotFound",
                                format!(
                                    "Gateway {}/{name} has no listener {}",
                                    p.namespace,
                                    section.as_deref().unwrap_or_default()
                                ),
                            ));
                        } else if let Some(l4) = gw.listeners.iter().find(|l| {
                            result.is_ok()
                                && l.owner.is_none()
                                && section.as_ref().is_none_or(|s| &l.name == s)
                                && l.kinds
                                    .iter()
                                    .any(|k| !matches!(k, RouteKind::Http | RouteKind::Grpc))
                        }) {
                            result = Err((
                                "Invalid",
                                format!(
                                    "listener {} of Gateway {}/{name} takes TCP, TLS or UDP routes, \
                                     which extAuth, basicAuth, clientCertificate and ipRules cannot \
                                     guard: its routes are not served while the policy covers it \
                                     (target the HTTP listeners by sectionName)",
                                    l4.name, p.namespace
                                ),
                            ));
                        } else if result.is_ok() {
                            // The listeners' client certificates of this policy.
                            let bad: Vec<&String> = gw
                                .client_certs
                                .values()
                                .filter(|c| c.policy == i)
                                .filter_map(|c| c.entry.as_ref().err())
                                .collect();
                            if let Some(first) = bad.first() {
                                result = Err((
                                    "Invalid",
                                    format!("{first}; the routes of that listener answer 500"),
                                ));
                            }
                        }
                        entries.push((gateway_ref(&p.namespace, name, section.clone()), result));
                    } else {
                        let route = find_route(b.snapshot, &p.namespace, name);
                        let has_rule = section.as_ref().is_none_or(|s| {
                            route.is_none_or(|route| {
                                route
                                    .spec
                                    .rules
                                    .iter()
                                    .flatten()
                                    .any(|r| r.name.as_ref() == Some(s))
                            })
                        });
                        let result = if has_rule {
                            verdict(fits)
                        } else {
                            Err((
                                "TargetNotFound",
                                format!(
                                    "HTTPRoute {}/{name} has no rule named {}",
                                    p.namespace,
                                    section.as_deref().unwrap_or_default()
                                ),
                            ))
                        };
                        for (r, attached) in route_reach(b.snapshot, sec, &p.namespace, name) {
                            entries.push((r, attached.and(result.clone())));
                        }
                    }
                }
            }
        }
        // One entry per ancestor: the first problem found there, else accepted.
        let mut merged: Vec<Entry> = Vec::new();
        for (r, result) in entries {
            match merged.iter_mut().find(|(o, _)| *o == r) {
                Some((_, prev)) => {
                    if prev.is_ok() && result.is_err() {
                        *prev = result;
                    }
                }
                None => merged.push((r, result)),
            }
        }
        merged.truncate(MAX_ANCESTORS);
        if merged.is_empty() {
            continue;
        }
        let note = match &p.settings {
            Ok(s) if !s.notes.is_empty() => format!("; {}", s.notes.join("; ")),
            _ => String::new(),
        };
        let g = p.generation;
        let ancestors = merged
            .into_iter()
            .map(|(parent_ref, result)| {
                let conditions = match result {
                    Ok(()) => vec![
                        Condition::new(
                            "Accepted",
                            true,
                            "Accepted",
                            format!("policy applied{note}"),
                            g,
                        ),
                        Condition::new(
                            "Conflicted",
                            false,
                            "NoConflicts",
                            "no older policy has the same target",
                            g,
                        ),
                    ],
                    Err(("Conflicted", why)) => vec![
                        Condition::new("Accepted", false, "Conflicted", why.clone(), g),
                        Condition::new("Conflicted", true, "Conflicted", why, g),
                    ],
                    Err((reason, why)) => vec![
                        Condition::new("Accepted", false, reason, why, g),
                        Condition::new(
                            "Conflicted",
                            false,
                            "NoConflicts",
                            "no older policy has the same target",
                            g,
                        ),
                    ],
                };
                RouteParentStatus {
                    parent_ref,
                    controller_name: b.params.controller_name.clone(),
                    conditions,
                }
            })
            .collect();
        all.push((
            ObjectKey::new(KIND, &p.namespace, &p.name),
            ObjectStatus::Policy(PolicyStatus { ancestors }),
        ));
    }
    for (k, s) in all {
        b.status(k, s);
    }
}

fn find_route<'s>(
    s: &'s Snapshot,
    ns: &str,
    name: &str,
) -> Option<&'s sweety_gateway_api::httproutes::HttpRoute> {
    s.http_routes
        .iter()
        .find(|r| {
            r.metadata.namespace.as_deref() == Some(ns) && r.metadata.name.as_deref() == Some(name)
        })
        .map(|r| &**r)
}

/// The ancestors of a policy targeting HTTPRoute `ns/name` (GEP-713: the Gateways the route
/// is attached to), each with Ok when the route is attached there, else `TargetNotFound` and
/// why: a Gateway of ours that the route names but that did not accept it (the reason from
/// the route's status), or, when the route does not exist or names no Gateway of ours, the
/// HTTPRoute itself (the policy takes effect nowhere).
fn route_reach(s: &Snapshot, sec: &SecurityPolicies, ns: &str, name: &str) -> Vec<Entry> {
    let itself = |why: String| {
        vec![(
            ParentRef {
                group: Some(GROUP.into()),
                kind: Some("HTTPRoute".into()),
                namespace: Some(ns.into()),
                name: name.into(),
                section_name: None,
                port: None,
            },
            Err(("TargetNotFound", why)),
        )]
    };
    if find_route(s, ns, name).is_none() {
        return itself(format!("HTTPRoute {ns}/{name} does not exist"));
    }
    let Some(per) = sec
        .attachments
        .get(&(ns.to_string(), name.to_string()))
        .filter(|per| !per.is_empty())
    else {
        return itself(format!(
            "HTTPRoute {ns}/{name} names no Gateway of this controller in its parentRefs: \
             the policy takes effect nowhere"
        ));
    };
    per.iter()
        .map(|((gns, gname), attached)| {
            let result = attached.clone().map_err(|why| {
                (
                    "TargetNotFound",
                    format!(
                        "HTTPRoute {ns}/{name} is not attached to Gateway {gns}/{gname} ({why}): \
                         the policy takes no effect through it"
                    ),
                )
            });
            (gateway_ref(gns, gname, None), result)
        })
        .collect()
}

#[cfg(test)]
mod tests;
