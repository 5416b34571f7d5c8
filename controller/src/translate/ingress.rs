//! Ingress v1 front end: IngressClass selection, rules, default backend, TLS and a safe subset
//! of the ingress-nginx annotations (see [`nginx`]).
//!
//! **Which Ingresses are ours.** `spec.ingressClassName` names one of
//! `Params::ingress_classes` whose IngressClass has `spec.controller ==
//! Params::ingress_controller` ([`served_classes`]: several classes can be served, e.g.
//! `sweety` and, once ingress-nginx is gone, `nginx`); an Ingress without a class is ours when
//! one of those IngressClasses carries `ingressclass.kubernetes.io/is-default-class: "true"`;
//! the legacy `kubernetes.io/ingress.class` annotation (used when no `ingressClassName` is set)
//! is honoured when it names one of our classes. The Ingresses of other classes are never
//! written to (no status, no Events), whatever they carry.
//!
//! **Listeners.** Every Ingress host is served on `ingress-http`
//! (`Params::listen_address:Params::ingress_http_port`); hosts listed under `spec.tls` whose
//! Secret resolves are also served on `ingress-https` (`ingress_https_port`, HTTP/3 per
//! `Params::http3`), which exists only while it has at least one certificate. SweetySites share
//! both listeners ([`front_listeners`]).
//!
//! **Hosts and merging.** A host belongs to one namespace ([`super::ownership`]: the oldest
//! claim across Ingresses and SweetySites, operator pins and opt-in sharing); rules of other
//! namespaces for it are left out with a `HostTaken`/`HostPinned` warning. Rules of the
//! owner's Ingresses (and sharing namespaces') for the same host become one virtual host
//! (`ingress/<host>`; `ingress/*` for rules without a host). Ingresses are taken oldest first,
//! so for the same path the oldest Ingress wins. When HTTP and HTTPS need different routes (an
//! `ssl-redirect`, on by default for hosts with TLS, or the HSTS header), the host gets two
//! virtual hosts, `ingress/<host>` on HTTPS and `ingress/<host>@http` on HTTP. HTTPS
//! responses of a host with TLS carry `Strict-Transport-Security` ([`Params::hsts_max_age`],
//! ingress-nginx's defaults).
//!
//! **SSL passthrough.** An Ingress with `ssl-passthrough` on a class that allows it
//! ([`nginx::ClassSettings::ssl_passthrough`]) does not become routes: each rule host it may
//! serve and names first (the oldest Ingress naming a host decides; `SSLPassthroughConflict`
//! for the others) becomes an `l4_routes` entry of `ingress-https` to the Service of the rule's
//! `/` path (the dataplane passes TLS with that SNI through, unterminated), and a virtual host on
//! `ingress-http` that redirects (308) to HTTPS. Rules without a host, wildcard hosts and rules
//! without `/` are refused (`SSLPassthroughInvalid`); its other paths, `spec.tls`, default
//! backend and annotations are reported ignored (`SSLPassthroughIgnored`).
//!
//! **TLS.** A `spec.tls` Secret serves a host only when its certificate covers it
//! ([`super::cert_names`]) and the Ingress's namespace may serve it; no `hosts` means the
//! Ingress's own hosts. The HTTPS listener's first certificate is
//! [`Params::default_certificate`] (connections without SNI or with an unknown name).
//!
//! **Paths.** `Exact` → exact; `Prefix` → the dataplane's element-wise prefix (`/foo` matches
//! `/foo` and `/foo/bar`, not `/foobar`; a trailing `/` is ignored, as the Ingress spec says);
//! `ImplementationSpecific` → prefix, or a regex when `use-regex` (or a `rewrite-target` with
//! capture groups) is set. ingress-nginx regex locations (`~*`) are case-insensitive and
//! anchored at the start only, so a regex path `p` becomes `(?i)p.*` (unless it ends in `$`);
//! and, as in ingress-nginx, once a host has a regex path all its prefix paths become
//! case-insensitive regexes too (its exact paths exact regexes ignoring case) and the host's
//! routes are ordered by path length, longest first (otherwise every prefix would beat every
//! regex). Routing, a rewrite's captures and the route's access rules all follow that one
//! match.
//!
//! **Default backend.** An Ingress's `spec.defaultBackend` is the last route of that
//! Ingress's own hosts (the oldest Ingress's, per host); it never reaches other hosts. The
//! catch-all virtual host and the hosts without their own default get
//! [`Params::default_backend`], the controller's setting, if any.
//!
//! **Status and problems.** Ingress has no conditions. Every Ingress of ours gets
//! `ObjectStatus::Ingress` (the load-balancer addresses of `Params::ingress_service`) under its
//! `Ingress` key. An invalid part never removes the valid ones: a path whose backend does not
//! resolve answers 503 with a body saying why, a host whose TLS Secret is missing is still
//! served on HTTP, an unsupported annotation is ignored, but an unsupported *security*
//! annotation or a snippet fails closed ([`nginx`]). Each problem is recorded as a
//! `Warning` condition (reason + message) in `ObjectStatus::Conditions` under the key
//! [`EVENT_KIND`]`/namespace/name`, which the status writer turns into Kubernetes Events on
//! the Ingress (a separate key so the load-balancer status is not lost).

pub mod nginx;

use super::backends::{BackendOptions, PortRef};
use super::cert_names;
use super::ownership::{self, Hosts};
use super::status::{Condition, IngressStatus, LoadBalancerIngress, ObjectKey, ObjectStatus};
use super::{Builder, Params, Snapshot};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use sweety_config::{
    Action, Certificate, FixedResponse, Listener, ListenerProtocol, ListenerTls, PathMatch,
    PemSource, ProxyAction, Route, RouteMatch, VirtualHost, WeightedBackend,
};

/// Shared HTTP listener of Ingresses and SweetySites.
pub const HTTP_LISTENER: &str = "ingress-http";
/// Shared HTTPS listener of Ingresses and SweetySites.
pub const HTTPS_LISTENER: &str = "ingress-https";
/// Port of the chart's Service in front of the `ingress-https` container port; advertised in
/// `Alt-Svc`.
pub const PUBLIC_HTTPS_PORT: u16 = 443;
/// Status key kind under which problems with an Ingress are recorded (as Events to emit).
pub const EVENT_KIND: &str = "IngressEvent";
/// IngressClass annotation marking the cluster default class.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// Legacy class annotation.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Make sure the shared `ingress-http` listener exists, and add `certificates` to the shared
/// `ingress-https` listener (created with the first certificate). Used by Ingress and
/// SweetySite. Certificates already present (same hostnames and PEM) are not added twice.
pub fn front_listeners(b: &mut Builder<'_>, certificates: Vec<Certificate>) {
    let p = b.params;
    if !b.listeners.iter().any(|l| l.name == HTTP_LISTENER) {
        b.listeners.push(Listener {
            name: HTTP_LISTENER.into(),
            address: p.listen_address.clone(),
            port: p.ingress_http_port,
            protocol: ListenerProtocol::Http,
            tls: None,
            http3: false,
            max_requests_in_flight: None,
            advertised_port: None,
            l4_routes: Vec::new(),
        });
    }
    if certificates.is_empty() {
        return;
    }
    let idx = https_listener(b);
    if let Some(tls) = b.listeners[idx].tls.as_mut() {
        for c in certificates {
            if !tls.certificates.contains(&c) {
                tls.certificates.push(c);
            }
        }
    }
}

/// The index of the shared `ingress-https` listener, created (with the default certificate
/// first) when it does not exist yet.
fn https_listener(b: &mut Builder<'_>) -> usize {
    let p = b.params;
    match b.listeners.iter().position(|l| l.name == HTTPS_LISTENER) {
        Some(i) => i,
        None => {
            b.listeners.push(Listener {
                name: HTTPS_LISTENER.into(),
                address: p.listen_address.clone(),
                port: p.ingress_https_port,
                protocol: ListenerProtocol::Https,
                tls: Some(ListenerTls {
                    // First: the certificate of connections without SNI or with a name no
                    // other certificate covers (the dataplane's fallback), never a tenant's.
                    certificates: default_certificate(p, &b.snapshot.secrets)
                        .into_iter()
                        .collect(),
                    min_version: Default::default(),
                    client_auth: None,
                    host_client_auth: Vec::new(),
                }),
                http3: p.http3,
                max_requests_in_flight: None,
                // Clients reach it through the chart's Service on 443, not the container port.
                advertised_port: Some(PUBLIC_HTTPS_PORT),
                l4_routes: Vec::new(),
            });
            b.listeners.len() - 1
        }
    }
}

/// The only SNI name of the default certificate on `ingress-https`: a reserved name (RFC 2606
/// `.invalid`) so it is served for connections without SNI or with a name no tenant
/// certificate covers, and for no real hostname.
pub const DEFAULT_CERTIFICATE_NAME: &str = "default.sweety.invalid";

/// The default certificate entry of `ingress-https`: the configured Secret
/// ([`Params::default_certificate_secret`]) as it is now in `secrets` when it holds a usable
/// certificate ([`default_certificate_from_secret`]; a rotation is served on the next
/// translation), else [`Params::default_certificate`] (read or generated at start).
fn default_certificate(p: &Params, secrets: &[Arc<Secret>]) -> Option<Certificate> {
    p.default_certificate_secret
        .as_deref()
        .and_then(|s| s.split_once('/'))
        .and_then(|(ns, name)| default_certificate_from_secret(secrets, ns, name).ok())
        .or_else(|| {
            p.default_certificate.as_ref().map(|d| Certificate {
                hostnames: vec![DEFAULT_CERTIFICATE_NAME.to_string()],
                cert: PemSource::Pem(d.cert.clone()),
                key: PemSource::Pem(d.key.clone()),
            })
        })
}

/// The default certificate a Secret holds, for [`DEFAULT_CERTIFICATE_NAME`]: the checks of
/// [`certificate_from_secret`] and the dataplane's own load of the pair
/// ([`cert_names::serves`]: the key is the certificate's), since it stands on every
/// `ingress-https` config and an unloadable one would make the dataplane refuse them all.
pub fn default_certificate_from_secret(
    secrets: &[Arc<Secret>],
    namespace: &str,
    name: &str,
) -> Result<Certificate, SecretError> {
    let c = certificate_from_secret(
        secrets,
        namespace,
        name,
        vec![DEFAULT_CERTIFICATE_NAME.to_string()],
    )?;
    if let (PemSource::Pem(cert), PemSource::Pem(key)) = (&c.cert, &c.key) {
        cert_names::serves(cert, key).map_err(SecretError::Invalid)?;
    }
    Ok(c)
}

/// Whether the HTTPS listener exists (has at least one certificate).
pub fn has_https(b: &Builder<'_>) -> bool {
    b.listeners.iter().any(|l| l.name == HTTPS_LISTENER)
}

/// Why a TLS Secret could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretError {
    /// No Secret of that name in that namespace (among those the snapshot holds).
    NotFound,
    /// The Secret is not of type `kubernetes.io/tls` or its certificate or key is unusable; the text says why.
    Invalid(String),
}

/// A certificate from a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`), checked enough that
/// the dataplane config stays valid.
pub fn certificate_from_secret(
    secrets: &[Arc<Secret>],
    namespace: &str,
    name: &str,
    hostnames: Vec<String>,
) -> Result<Certificate, SecretError> {
    let secret = secrets
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata.name.as_deref() == Some(name)
        })
        .ok_or(SecretError::NotFound)?;
    if let Some(t) = secret.type_.as_deref() {
        if t != "kubernetes.io/tls" {
            return Err(SecretError::Invalid(format!(
                "type is {t:?}, not kubernetes.io/tls"
            )));
        }
    }
    let field = |key: &str| -> Result<String, SecretError> {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| SecretError::Invalid(format!("no {key} in data")))?;
        String::from_utf8(data.0.clone())
            .map_err(|_| SecretError::Invalid(format!("{key} is not PEM text")))
    };
    let cert = field("tls.crt")?;
    let key = field("tls.key")?;
    if !(cert.contains("-----BEGIN CERTIFICATE-----") && cert.contains("-----END CERTIFICATE-----"))
    {
        return Err(SecretError::Invalid(
            "tls.crt holds no PEM certificate".into(),
        ));
    }
    let key_ok = key.lines().any(|l| {
        l.starts_with("-----BEGIN ") && l.ends_with("PRIVATE KEY-----") && !l.contains("ENCRYPTED")
    }) && key.contains("-----END ");
    if !key_ok {
        return Err(SecretError::Invalid(
            "tls.key holds no unencrypted PEM private key".into(),
        ));
    }
    let mut unique = Vec::new();
    for h in hostnames {
        let h = h.to_ascii_lowercase();
        if !unique.contains(&h) {
            unique.push(h);
        }
    }
    let certificate = Certificate {
        hostnames: unique,
        cert: PemSource::Pem(cert),
        key: PemSource::Pem(key),
    };
    // The dataplane's own checks, on a probe listener, so one bad Secret cannot invalidate
    // the whole config.
    let probe = sweety_config::Config {
        listeners: vec![Listener {
            name: "probe".into(),
            address: "127.0.0.1".into(),
            port: 8443,
            protocol: ListenerProtocol::Https,
            tls: Some(ListenerTls {
                certificates: vec![certificate.clone()],
                min_version: Default::default(),
                client_auth: None,
                host_client_auth: Vec::new(),
            }),
            http3: false,
            max_requests_in_flight: None,
            advertised_port: None,
            l4_routes: Vec::new(),
        }],
        ..Default::default()
    };
    probe.validate_structure().map_err(|e| {
        SecretError::Invalid(
            e.0.iter()
                .map(|e| e.message.clone())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    Ok(certificate)
}

/// Check one route on its own with the dataplane's validator (backend references aside), so a
/// bad regex, header or CORS origin from one object never invalidates the whole config.
/// Returns the route to use: itself, a 503 explaining the problem, or `None` when even its
/// match is invalid (the route is then left out).
pub(crate) fn checked_route(route: Route, report: &mut dyn FnMut(String)) -> Option<Route> {
    fn check(route: &Route) -> Result<(), String> {
        let mut r = route.clone();
        // Error pages name a backend translate registered (not in this one-route config).
        r.filters
            .retain(|f| !matches!(f, sweety_config::Filter::ErrorPages(_)));
        if let Action::Proxy(_) = r.action {
            r.action = Action::Fixed(FixedResponse {
                status: 200,
                body: String::new(),
                content_type: None,
            });
        }
        // The user sets `basic_auth` names are the config's (translate adds one with every
        // filter naming it): known here, their users checked where they are read.
        let user_sets = r
            .filters
            .iter()
            .filter_map(|f| match f {
                sweety_config::Filter::BasicAuth(a) => a.user_set.clone(),
                _ => None,
            })
            .map(|name| sweety_config::UserSet {
                name,
                users: Vec::new(),
            })
            .collect();
        let cfg = sweety_config::Config {
            virtual_hosts: vec![VirtualHost {
                name: "check".into(),
                hostnames: Vec::new(),
                listeners: Vec::new(),
                routes: vec![r],
            }],
            user_sets,
            ..Default::default()
        };
        cfg.validate_structure().map_err(|e| {
            e.0.iter()
                .map(|e| e.message.clone())
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
    let Err(why) = check(&route) else {
        return Some(route);
    };
    report(format!("route {}: {why}", route.name));
    let fallback = Route {
        filters: Vec::new(),
        action: unavailable(&format!("invalid route: {why}")),
        timeouts: Default::default(),
        retry: None,
        max_request_body_bytes: None,
        ..route
    };
    check(&fallback).is_ok().then_some(fallback)
}

/// Whether `host` has a certificate: it is one of `names` (hostname → the namespace whose
/// certificate lists it) or under a `*.` wildcard among them whose namespace may serve `host`
/// (another namespace's wildcard certificate does not put a host on HTTPS).
fn covered(names: &BTreeMap<String, String>, owners: &Hosts, host: &str) -> bool {
    names.contains_key(host)
        || host.split_once('.').is_some_and(|(_, rest)| {
            names
                .get(&format!("*.{rest}"))
                .is_some_and(|ns| owners.ingress_may_serve(host, ns).is_ok())
        })
}

/// The `Strict-Transport-Security` response header of Ingress hosts with TLS
/// ([`Params::hsts_max_age`]; ingress-nginx's defaults: a year, `includeSubDomains`), set
/// over the backend's own, as ingress-nginx does.
fn hsts_header(params: &Params) -> Option<sweety_config::HeaderModifier> {
    if params.hsts_max_age == 0 {
        return None;
    }
    let mut value = format!("max-age={}", params.hsts_max_age);
    if params.hsts_include_subdomains {
        value.push_str("; includeSubDomains");
    }
    if params.hsts_preload {
        value.push_str("; preload");
    }
    Some(sweety_config::HeaderModifier {
        set: vec![sweety_config::HeaderValue {
            name: "strict-transport-security".into(),
            value,
        }],
        ..Default::default()
    })
}

/// ingress-nginx's `no-tls-redirect-locations`: paths (HTTP-01 challenges) kept on HTTP.
fn no_tls_redirect(params: &Params, path: &str) -> bool {
    params
        .no_tls_redirect_locations
        .iter()
        .any(|l| path.starts_with(l.as_str()))
}

/// Fail one route closed: it answers 503 with `body` (its match is kept).
fn refuse_route(route: &mut Route, body: String) {
    route.filters.clear();
    route.timeouts = Default::default();
    route.retry = None;
    route.action = Action::Fixed(FixedResponse {
        status: 503,
        body,
        content_type: Some("text/plain; charset=utf-8".into()),
    });
}

/// Load-balancer addresses of the chart's ingress Service.
pub fn load_balancer(b: &Builder<'_>) -> Vec<LoadBalancerIngress> {
    let Some(name) = b.params.ingress_service.as_deref() else {
        return Vec::new();
    };
    let Some(svc) = b.services.service(&b.params.namespace, name) else {
        return Vec::new();
    };
    let mut out: Vec<LoadBalancerIngress> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|list| {
            list.iter()
                .map(|i| LoadBalancerIngress {
                    ip: i.ip.clone(),
                    hostname: i.hostname.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| (&a.ip, &a.hostname).cmp(&(&b.ip, &b.hostname)));
    out
}

fn annotation<'a>(ing: &'a Ingress, key: &str) -> Option<&'a str> {
    ing.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether an Ingress belongs to this controller, given `served`: the IngressClasses whose name
/// is in [`Params::ingress_classes`] and whose `spec.controller` is
/// [`Params::ingress_controller`] ([`served_classes`]). A class name in the list whose
/// IngressClass belongs to another controller (or does not exist) is not served, so naming
/// `nginx` while ingress-nginx still owns that class takes nothing from it.
///
/// `legacy`: the class names the legacy `kubernetes.io/ingress.class` annotation may name
/// ([`legacy_names`]).
pub fn is_ours(ing: &Ingress, served: &[&IngressClass], legacy: &[&str]) -> bool {
    let served_name = |name: &str| {
        served
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(name))
    };
    match ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
    {
        Some(name) => served_name(name),
        None => match annotation(ing, LEGACY_CLASS_ANNOTATION) {
            Some(name) => legacy.contains(&name),
            None => served.iter().any(|c| {
                c.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                    .is_some_and(|v| v == "true")
            }),
        },
    }
}

/// The class names the legacy annotation may name: those of `served`, and the names in
/// [`Params::ingress_classes`] no IngressClass object has (the annotation predates them). A
/// name whose IngressClass belongs to another controller is never ours, so listing `nginx`
/// while ingress-nginx still owns that class takes none of its annotated Ingresses either.
pub fn legacy_names<'a>(
    snapshot: &Snapshot,
    served: &[&'a IngressClass],
    params: &'a Params,
) -> Vec<&'a str> {
    let exists = |name: &str| {
        snapshot
            .ingress_classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(name))
    };
    let mut names: Vec<&str> = served
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    names.extend(
        params
            .ingress_classes
            .iter()
            .map(String::as_str)
            .filter(|n| !exists(n)),
    );
    names
}

/// The IngressClasses this controller serves: named in [`Params::ingress_classes`] and with
/// `spec.controller == Params::ingress_controller`.
pub fn served_classes<'a>(snapshot: &'a Snapshot, params: &Params) -> Vec<&'a IngressClass> {
    snapshot
        .ingress_classes
        .iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| params.ingress_classes.iter().any(|s| s == n))
                && c.spec.as_ref().and_then(|s| s.controller.as_deref())
                    == Some(params.ingress_controller.as_str())
        })
        .map(|c| c.as_ref())
        .collect()
}

/// Problems found while translating one Ingress.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) conditions: Vec<Condition>,
    generation: i64,
}

impl Report {
    pub(crate) fn warn(&mut self, reason: &str, message: impl Into<String>) {
        let c = Condition::new("Warning", true, reason, message, self.generation);
        if !self.conditions.contains(&c) {
            self.conditions.push(c);
        }
    }
}

/// One translated path, before it is placed in a virtual host.
#[derive(Clone)]
pub(crate) struct PathRoute {
    /// The route as served on HTTPS (and on HTTP unless `http_redirect`).
    pub(crate) route: Route,
    /// On HTTP this route redirects to HTTPS instead (ssl-redirect).
    pub(crate) http_redirect: Option<sweety_config::Redirect>,
    /// Redirect even when the host has no certificate here (force-ssl-redirect).
    pub(crate) force_redirect: bool,
    /// The Ingress path as written (for ordering regex hosts and canary matching).
    pub(crate) path: String,
    pub(crate) path_type: String,
    pub(crate) regex: bool,
    /// Namespace of the Ingress the path comes from (canaries attach within it only).
    pub(crate) namespace: String,
}

/// Our Ingresses (see [`is_ours`]), oldest first; names break ties so the order is total.
pub fn our_ingresses(snapshot: &Snapshot, params: &Params) -> Vec<Arc<Ingress>> {
    let served = served_classes(snapshot, params);
    let legacy = legacy_names(snapshot, &served, params);
    let mut ours: Vec<Arc<Ingress>> = snapshot
        .ingresses
        .iter()
        .filter(|i| is_ours(i, &served, &legacy))
        .cloned()
        .collect();
    ours.sort_by(|a, b| {
        let key = |i: &Ingress| {
            (
                i.metadata.creation_timestamp.clone().map(|t| t.0),
                i.metadata.namespace.clone().unwrap_or_default(),
                i.metadata.name.clone().unwrap_or_default(),
            )
        };
        key(a).cmp(&key(b))
    });
    ours
}

/// The backend of [`Params::default_backend`] (`namespace/service:port`), or why it does not
/// resolve.
fn cluster_default_backend_name(b: &mut Builder<'_>, spec: &str) -> Result<String, String> {
    let parsed = spec.split_once('/').and_then(|(ns, rest)| {
        let (svc, port) = rest.rsplit_once(':')?;
        let port = match port.parse::<i32>() {
            Ok(n) => PortRef::Number(n),
            Err(_) => PortRef::Name(port.to_string()),
        };
        (!ns.is_empty() && !svc.is_empty()).then(|| (ns.to_string(), svc.to_string(), port))
    });
    let Some((ns, svc, port)) = parsed else {
        return Err(format!(
            "the controller's default backend {spec:?} is not namespace/service:port"
        ));
    };
    b.backends
        .service(
            &b.services,
            &ns,
            &svc,
            Some(&port),
            &BackendOptions::default(),
        )
        .map_err(|e| e.to_string())
}

/// The `error_pages` filter of an Ingress's paths (ingress-nginx's `custom-http-errors` and
/// `default-backend`), without the per-path `X-Service-*` headers: the annotation's Service
/// (its first port, as ingress-nginx), else for `custom-http-errors` the controller's default
/// backend, else the built-in page. `None` when neither annotation applies.
fn error_pages(
    b: &mut Builder<'_>,
    ns: &str,
    name: &str,
    ann: &nginx::Annotations,
    report: &mut Report,
) -> Option<sweety_config::ErrorPages> {
    let mut backend = None;
    if let Some(svc) = &ann.default_backend {
        let key = format!("{}default-backend", nginx::PREFIX);
        let first_port = b.services.service(ns, svc).map(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.ports.as_deref())
                .and_then(|p| p.first())
                .map(|p| p.port)
        });
        match first_port {
            None => report.warn(
                "DefaultBackendNotFound",
                format!("{key}: Service {ns}/{svc} not found; ignored"),
            ),
            Some(None) => report.warn(
                "DefaultBackendNotFound",
                format!("{key}: Service {ns}/{svc} has no port; ignored"),
            ),
            Some(Some(port)) => {
                let r = IngressBackend {
                    service: Some(k8s_openapi::api::networking::v1::IngressServiceBackend {
                        name: svc.clone(),
                        port: Some(k8s_openapi::api::networking::v1::ServiceBackendPort {
                            number: Some(port),
                            name: None,
                        }),
                    }),
                    resource: None,
                };
                backend = resolve_backend(b, ns, &r, ann, report).ok();
            }
        }
    }
    let unavailable = backend.is_some();
    if ann.custom_errors.is_empty() && !unavailable {
        return None;
    }
    if backend.is_none() {
        backend = b
            .params
            .default_backend
            .as_deref()
            .and_then(|spec| cluster_default_backend_name(b, spec).ok());
    }
    let header = |n: &str, v: &str| sweety_config::HeaderValue {
        name: n.into(),
        value: v.into(),
    };
    Some(sweety_config::ErrorPages {
        codes: ann.custom_errors.clone(),
        backend,
        unavailable,
        headers: vec![header("X-Namespace", ns), header("X-Ingress-Name", name)],
        ..Default::default()
    })
}

/// The route of [`Params::default_backend`] (`namespace/service:port`): a proxy, or a 503
/// saying why it does not resolve.
fn cluster_default_backend(b: &mut Builder<'_>, spec: &str) -> Route {
    let action = match cluster_default_backend_name(b, spec) {
        Err(why) => unavailable(&why),
        Ok(backend) => Action::Proxy(ProxyAction {
            backends: vec![WeightedBackend {
                backend,
                weight: 1,
                filters: Vec::new(),
            }],
        }),
    };
    Route {
        name: "ingress/default-backend".into(),
        matches: Vec::new(),
        filters: Vec::new(),
        action,
        timeouts: Default::default(),
        retry: None,
        max_request_body_bytes: None,
    }
}

/// Translate every Ingress of our class. Returns the hostnames the Ingresses serve on the
/// shared listeners (a SweetySite never serves one: [`super::site::translate`]).
pub fn translate(b: &mut Builder<'_>) -> BTreeSet<String> {
    let params = b.params;
    let ours = our_ingresses(b.snapshot, params);
    if ours.is_empty() {
        return BTreeSet::new();
    }
    let owners = Hosts::compute(b.snapshot, params, &ours);
    let lb = load_balancer(b);

    // host ("" = catch-all) → routes, and hosts with a usable certificate (→ its namespace).
    let mut hosts: BTreeMap<String, Vec<PathRoute>> = BTreeMap::new();
    let mut host_defaults: BTreeMap<String, Route> = BTreeMap::new();
    let mut tls_hosts: BTreeMap<String, String> = BTreeMap::new();
    let mut certificates = Vec::new();
    let mut reports: BTreeMap<(String, String), Report> = BTreeMap::new();
    let mut canaries = Vec::new();
    // `from-to-www-redirect`: other name → the rule host it redirects to (oldest first).
    let mut www_redirects: BTreeMap<String, String> = BTreeMap::new();
    // host → (the Ingress that set it, its client certificate settings): `auth-tls-*`.
    let mut client_tls: BTreeMap<String, (String, sweety_config::HostClientAuth)> = BTreeMap::new();

    // `ssl-passthrough` hosts: host → (the Ingress, its `/` path's backend).
    let mut passthrough: BTreeMap<String, (String, String)> = BTreeMap::new();
    let snapshot = b.snapshot;
    let parsed: Vec<(Arc<Ingress>, nginx::Annotations, Report)> = ours
        .iter()
        .map(|ing| {
            let mut report = Report {
                conditions: Vec::new(),
                generation: ing.metadata.generation.unwrap_or(0),
            };
            let class = super::proxy_settings::ingress_settings(snapshot, params, ing);
            let ann =
                nginx::Annotations::parse(ing, params, &class, &snapshot.secrets, &mut report);
            (ing.clone(), ann, report)
        })
        .collect();
    let claims = first_claims(&parsed, &owners);
    // The users of each `auth-secret`, once (their `basic_auth` filters name the set); those
    // no route ends up naming are left out at the end.
    let sets_from = b.config.user_sets.len();
    for (_, ann, _) in &parsed {
        if let Some(set) = &ann.user_set {
            if !b.config.user_sets[sets_from..]
                .iter()
                .any(|s| s.name == set.name)
            {
                b.config.user_sets.push(set.clone());
            }
        }
    }

    for (ing, mut ann, mut report) in parsed {
        let ing = &ing;
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        let name = ing.metadata.name.clone().unwrap_or_default();
        if ann.canary {
            canaries.push((ing.clone(), ann));
            reports.insert((ns, name), report);
            continue;
        }
        if passes_through(&ann) {
            passthrough_ingress(b, ing, &owners, &claims, &mut passthrough, &mut report);
            reports.insert((ns, name), report);
            continue;
        }
        ann.error_pages = error_pages(b, &ns, &name, &ann, &mut report);
        let spec = ing.spec.clone().unwrap_or_default();
        let key = format!("{ns}/{name}");
        // The hosts this Ingress may serve: its own, or shared by the operator's choice.
        let mut served: Vec<String> = Vec::new();
        for h in ownership::ingress_hosts(ing) {
            match owners.ingress_may_serve(&h, &ns) {
                Ok(()) => match claims.get(&h) {
                    Some((first, true)) if *first != key => report.warn(
                        "SSLPassthroughConflict",
                        format!(
                            "host {h:?} is passed through (ssl-passthrough) by the older Ingress \
                             {first}; this Ingress's rules for it are not served"
                        ),
                    ),
                    _ => served.push(h),
                },
                Err(r) => report.warn(
                    r.reason,
                    format!(
                        "{}; the rules for {} are not served",
                        r.message,
                        if h.is_empty() {
                            "requests without a matching host".to_string()
                        } else {
                            format!("{h:?}")
                        }
                    ),
                ),
            }
        }
        // `server-alias`: more names for the first rule host, unless a rule or a site names
        // them or another namespace claims them (ownership's weak claims).
        let mut aliases: Vec<String> = Vec::new();
        for a in nginx::server_aliases(ing).0 {
            if owners.is_rule_host(&a) {
                report.warn(
                    "AliasIgnored",
                    format!(
                        "{}server-alias {a:?} is a host of an Ingress rule or a SweetySite; \
                         ignored (as ingress-nginx ignores an alias in use)",
                        nginx::PREFIX
                    ),
                );
            } else {
                match owners.ingress_may_serve(&a, &ns) {
                    Ok(()) => aliases.push(a),
                    Err(r) => report.warn(
                        r.reason,
                        format!(
                            "{}; {}server-alias {a:?} is ignored",
                            r.message,
                            nginx::PREFIX
                        ),
                    ),
                }
            }
        }
        let alias_source = served.iter().find(|h| !h.is_empty()).cloned();
        // `from-to-www-redirect`: the other name redirects to the rule host, unless a rule or
        // a site names it (silently, as ingress-nginx) or another namespace claims it.
        if nginx::from_to_www(ing) {
            for h in &served {
                let Some(other) = nginx::www_other(h) else {
                    continue;
                };
                if owners.is_rule_host(&other) || www_redirects.contains_key(&other) {
                    continue;
                }
                match owners.ingress_may_serve(&other, &ns) {
                    Ok(()) => {
                        www_redirects.insert(other, h.clone());
                    }
                    Err(r) => report.warn(
                        r.reason,
                        format!(
                            "{}; {}from-to-www-redirect from {other:?} is not served",
                            r.message,
                            nginx::PREFIX
                        ),
                    ),
                }
            }
        }
        // TLS.
        for t in spec.tls.as_deref().unwrap_or_default() {
            let tls_names: Vec<String> = t.hosts.clone().unwrap_or_default();
            let Some(secret) = t.secret_name.as_deref() else {
                report.warn(
                    "SecretNotFound",
                    format!(
                        "spec.tls for {:?} names no Secret; served on HTTP only",
                        tls_names
                    ),
                );
                continue;
            };
            // No hosts: the certificate is meant for every host of this Ingress.
            let wanted: Vec<String> = if tls_names.is_empty() {
                served.iter().filter(|h| !h.is_empty()).cloned().collect()
            } else {
                tls_names.iter().map(|h| h.to_ascii_lowercase()).collect()
            };
            match certificate_from_secret(&b.snapshot.secrets, &ns, secret, Vec::new()) {
                Ok(mut c) => {
                    let names = match &c.cert {
                        PemSource::Pem(pem) => cert_names::dns_names(pem),
                        PemSource::File(_) => Err("not inline PEM".into()),
                    };
                    let names = match names {
                        Ok(n) => n,
                        Err(why) => {
                            report.warn(
                                "InvalidSecret",
                                format!("TLS Secret {ns}/{secret}: {why}; served on HTTP only"),
                            );
                            continue;
                        }
                    };
                    let mut kept = Vec::new();
                    for h in wanted {
                        if let Some((first, true)) = claims.get(&h) {
                            report.warn(
                                "SSLPassthroughConflict",
                                format!(
                                    "TLS Secret {ns}/{secret} is not used for {h:?}: its TLS is \
                                     passed through (ssl-passthrough) by Ingress {first}"
                                ),
                            );
                        } else if let Err(r) = owners.ingress_may_serve(&h, &ns) {
                            report.warn(
                                "TLSHostNotOwned",
                                format!(
                                    "TLS Secret {ns}/{secret} is not used for {h:?}: {}",
                                    r.message
                                ),
                            );
                        } else if !cert_names::covers(&names, &h) {
                            report.warn(
                                "CertificateMismatch",
                                format!(
                                    "TLS Secret {ns}/{secret} is not used for {h:?}: its \
                                     certificate covers only {}; served on HTTP only",
                                    if names.is_empty() {
                                        "no DNS name".to_string()
                                    } else {
                                        names.join(", ")
                                    }
                                ),
                            );
                        } else if !kept.contains(&h) {
                            kept.push(h);
                        }
                    }
                    if kept.is_empty() {
                        if tls_names.is_empty() && served.iter().all(|h| h.is_empty()) {
                            report.warn(
                                "SecretNotUsed",
                                format!(
                                    "TLS Secret {ns}/{secret}: spec.tls lists no hosts and the \
                                     Ingress serves no named host"
                                ),
                            );
                        }
                        continue;
                    }
                    for h in &kept {
                        tls_hosts.insert(h.clone(), ns.clone());
                    }
                    c.hostnames = kept;
                    certificates.push(c);
                }
                Err(SecretError::NotFound) => report.warn(
                    "SecretNotFound",
                    format!(
                        "TLS Secret {ns}/{secret} not found; {} served on HTTP only",
                        host_list(&tls_names)
                    ),
                ),
                Err(SecretError::Invalid(why)) => report.warn(
                    "InvalidSecret",
                    format!(
                        "TLS Secret {ns}/{secret}: {why}; {} served on HTTP only",
                        host_list(&tls_names)
                    ),
                ),
            }
        }
        // Default backend: for this Ingress's own hosts only.
        if let Some(db) = spec.default_backend.as_ref() {
            let mut r = route_for(
                b,
                &ns,
                db,
                &ann,
                format!("ingress/{ns}/{name}/default"),
                None,
                &mut report,
            );
            r.matches = Vec::new();
            ann.guard(&mut r);
            if served.is_empty() {
                report.warn(
                    "DefaultBackendIgnored",
                    "spec.defaultBackend applies only to this Ingress's own hosts and it serves \
                     none; a default backend for every host is a controller setting \
                     (--default-backend)",
                );
            }
            for h in &served {
                match host_defaults.get(h) {
                    Some(first) => report.warn(
                        "DefaultBackendIgnored",
                        format!(
                            "host {h:?} already has the default backend of {}; this one is \
                             ignored there",
                            first.name
                        ),
                    ),
                    None => {
                        host_defaults.insert(h.clone(), r.clone());
                    }
                }
            }
        }
        // Rules.
        for (ri, rule) in spec.rules.as_deref().unwrap_or_default().iter().enumerate() {
            let host = rule.host.clone().unwrap_or_default().to_ascii_lowercase();
            if !served.contains(&host) {
                continue;
            }
            let paths = rule
                .http
                .as_ref()
                .map(|h| h.paths.as_slice())
                .unwrap_or_default();
            let start = hosts.get(&host).map_or(0, Vec::len);
            let entry = hosts.entry(host.clone()).or_default();
            if let (Some(app_root), true) = (ann.app_root.as_deref(), !paths.is_empty()) {
                let mut r = nginx::app_root_route(&ns, &name, ri, app_root);
                ann.guard(&mut r.route);
                entry.push(r);
            }
            for (pi, p) in paths.iter().enumerate() {
                let path = p.path.clone().unwrap_or_else(|| "/".into());
                // A target with capture groups makes the path a regex, as in ingress-nginx.
                let regex = p.path_type == "ImplementationSpecific"
                    && (ann.use_regex
                        || ann
                            .rewrite_target
                            .as_deref()
                            .is_some_and(|t| t.contains('$')));
                let path_match = match p.path_type.as_str() {
                    "Exact" => PathMatch::Exact(path.clone()),
                    _ if regex => PathMatch::Regex(nginx::anchor_regex(&path)),
                    _ => PathMatch::Prefix(path.clone()),
                };
                if let Some(first) = entry
                    .iter()
                    .find(|r| r.path == path && r.path_type == p.path_type)
                {
                    report.warn(
                        "PathConflict",
                        format!(
                            "host {host:?} path {path:?} ({}) is already served by {}; ignored",
                            p.path_type, first.route.name
                        ),
                    );
                    continue;
                }
                let route_name = format!("ingress/{ns}/{name}/rule-{ri}/path-{pi}");
                let mut route = route_for(
                    b,
                    &ns,
                    &p.backend,
                    &ann,
                    route_name,
                    Some(path_match),
                    &mut report,
                );
                ann.apply(&mut route, &host, &mut report);
                if host.is_empty() && ann.client_tls.is_some() {
                    // No TLS server name names a catch-all rule: nothing to ask by.
                    report.warn(
                        "AuthTLSInvalid",
                        "auth-tls-secret: rules without a host cannot ask for client \
                         certificates; they answer 503",
                    );
                    refuse_route(
                        &mut route,
                        format!(
                            "Ingress {ns}/{name} is refused: a rule without a host cannot ask \
                             for client certificates; refusing rather than serving unprotected\n"
                        ),
                    );
                }
                let Some(route) = checked_route(route, &mut |m| report.warn("InvalidPath", m))
                else {
                    continue;
                };
                // (What `apply` left of the match: a regex stays a regex.)
                let regex = matches!(
                    route.matches.first().and_then(|m| m.path.as_ref()),
                    Some(PathMatch::Regex(_))
                );
                // ingress-nginx's `no-tls-redirect-locations`: HTTP-01 challenges stay on HTTP.
                let exempt = no_tls_redirect(params, &path);
                entry.push(PathRoute {
                    http_redirect: (!exempt
                        && (ann.ssl_redirect.unwrap_or(params.ssl_redirect)
                            || ann.force_ssl_redirect))
                        .then(nginx::https_redirect),
                    force_redirect: ann.force_ssl_redirect,
                    route,
                    path: path.clone(),
                    path_type: p.path_type.clone(),
                    regex,
                    namespace: ns.clone(),
                });
            }
            // The same routes under the aliases of the first rule host.
            if alias_source.as_ref() == Some(&host) {
                let added: Vec<PathRoute> = hosts[&host][start..].to_vec();
                for a in &aliases {
                    let e = hosts.entry(a.clone()).or_default();
                    for r in &added {
                        if let Some(first) = e
                            .iter()
                            .find(|x| x.path == r.path && x.path_type == r.path_type)
                        {
                            report.warn(
                                "PathConflict",
                                format!(
                                    "alias {a:?} path {:?} ({}) is already served by {}; ignored",
                                    r.path, r.path_type, first.route.name
                                ),
                            );
                            continue;
                        }
                        e.push(r.clone());
                    }
                }
            }
        }
        if let (Some(c), None) = (&ann.client_tls, &ann.refuse) {
            // The aliases serve the same routes: they ask for the same certificates.
            for h in served.iter().filter(|h| !h.is_empty()).chain(&aliases) {
                match client_tls.get(h) {
                    Some((owner, first)) if first != c => report.warn(
                        "AuthTLSConflict",
                        format!(
                            "host {h:?} already asks for client certificates as Ingress {owner} \
                             says; this Ingress's auth-tls settings are not used there"
                        ),
                    ),
                    Some(_) => {}
                    None => {
                        client_tls.insert(h.clone(), (format!("{ns}/{name}"), c.clone()));
                    }
                }
            }
        }
        reports.insert((ns, name), report);
    }

    // Canaries join the primary route of the same host and path, in their own namespace.
    for (ing, ann) in &canaries {
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        let name = ing.metadata.name.clone().unwrap_or_default();
        let mut report = reports
            .remove(&(ns.clone(), name.clone()))
            .unwrap_or_default();
        nginx::merge_canary(b, ing, ann, &owners, &mut hosts, &mut report);
        reports.insert((ns, name), report);
    }

    certificates.sort_by(|a, b| a.hostnames.cmp(&b.hostnames));
    front_listeners(b, certificates);
    let mut served = BTreeSet::new();
    passthrough_listeners(b, passthrough, &mut served, &mut reports);
    let https = has_https(b);
    let cluster_default = params
        .default_backend
        .as_deref()
        .map(|spec| cluster_default_backend(b, spec));

    for (host, mut routes) in hosts {
        if !host.is_empty() {
            served.insert(host.clone());
        }
        nginx::order_regex_host(&mut routes);
        let served_tls = https && (host.is_empty() || covered(&tls_hosts, &owners, &host));
        let default = host_defaults
            .get(&host)
            .cloned()
            .or_else(|| cluster_default.clone());
        let hsts = hsts_header(params).filter(|_| served_tls && !host.is_empty());
        // A host that asks for client certificates (`auth-tls-*`) is served on HTTPS only:
        // plain HTTP redirects there (the ACME paths aside); without TLS here it is refused.
        if let Some((owner, c)) = client_tls.get(&host) {
            if served_tls {
                for r in routes.iter_mut() {
                    if !no_tls_redirect(params, &r.path) {
                        r.http_redirect = Some(nginx::https_redirect());
                        r.force_redirect = true;
                    }
                }
                if let Some(tls) = b
                    .listeners
                    .iter_mut()
                    .find(|l| l.name == HTTPS_LISTENER)
                    .and_then(|l| l.tls.as_mut())
                {
                    tls.host_client_auth.push(sweety_config::HostClientAuth {
                        hostnames: vec![host.clone()],
                        ..c.clone()
                    });
                }
            } else {
                let body = format!(
                    "host {host:?} asks for client certificates (Ingress {owner}) but has no \
                     TLS certificate here; refusing rather than serving unprotected\n"
                );
                // ACME HTTP-01 answers stay served: they are public, and without them the
                // host could never get the certificate it lacks.
                for r in routes
                    .iter_mut()
                    .filter(|r| !no_tls_redirect(params, &r.path))
                {
                    refuse_route(&mut r.route, body.clone());
                    r.http_redirect = None;
                }
                if let Some((ns, name)) = owner.split_once('/') {
                    if let Some(rep) = reports.get_mut(&(ns.to_string(), name.to_string())) {
                        rep.warn(
                            "AuthTLSInvalid",
                            format!(
                                "host {host:?} has no usable TLS certificate here, so no client \
                                 certificate can be asked for; its paths answer 503"
                            ),
                        );
                    }
                }
            }
        }
        let https_routes: Vec<Route> = routes
            .iter()
            .map(|r| r.route.clone())
            .chain(default.clone())
            .map(|mut r| {
                if let Some(h) = &hsts {
                    r.filters
                        .push(sweety_config::Filter::ResponseHeaders(h.clone()));
                }
                r
            })
            .collect();
        let http_routes: Vec<Route> = routes
            .iter()
            .map(|r| match &r.http_redirect {
                Some(redirect) if served_tls || r.force_redirect => {
                    let mut route = r.route.clone();
                    route.filters = vec![sweety_config::Filter::Redirect(redirect.clone())];
                    route
                }
                _ => r.route.clone(),
            })
            .chain(default)
            .collect();
        let hostnames = if host.is_empty() {
            Vec::new()
        } else {
            vec![host.clone()]
        };
        let label = if host.is_empty() { "*" } else { host.as_str() };
        if !served_tls {
            b.virtual_hosts.push(VirtualHost {
                name: format!("ingress/{label}"),
                hostnames,
                listeners: vec![HTTP_LISTENER.into()],
                routes: http_routes,
            });
        } else if http_routes == https_routes {
            b.virtual_hosts.push(VirtualHost {
                name: format!("ingress/{label}"),
                hostnames,
                listeners: vec![HTTP_LISTENER.into(), HTTPS_LISTENER.into()],
                routes: https_routes,
            });
        } else {
            b.virtual_hosts.push(VirtualHost {
                name: format!("ingress/{label}"),
                hostnames: hostnames.clone(),
                listeners: vec![HTTPS_LISTENER.into()],
                routes: https_routes,
            });
            b.virtual_hosts.push(VirtualHost {
                name: format!("ingress/{label}@http"),
                hostnames,
                listeners: vec![HTTP_LISTENER.into()],
                routes: http_routes,
            });
        }
    }
    for (other, to) in www_redirects {
        if served.contains(&other) {
            continue;
        }
        served.insert(other.clone());
        let mut listeners = vec![HTTP_LISTENER.to_string()];
        if https && covered(&tls_hosts, &owners, &other) {
            listeners.push(HTTPS_LISTENER.into());
        }
        b.virtual_hosts.push(VirtualHost {
            name: format!("ingress/{other}"),
            hostnames: vec![other.clone()],
            listeners,
            routes: vec![nginx::www_redirect_route(&other, &to)],
        });
    }
    if let Some(db) = cluster_default {
        if !b.virtual_hosts.iter().any(|v| v.name == "ingress/*") {
            let mut listeners = vec![HTTP_LISTENER.to_string()];
            if https {
                listeners.push(HTTPS_LISTENER.into());
            }
            b.virtual_hosts.push(VirtualHost {
                name: "ingress/*".into(),
                hostnames: Vec::new(),
                listeners,
                routes: vec![db],
            });
        }
    }

    let named: BTreeSet<&str> = b
        .virtual_hosts
        .iter()
        .flat_map(|v| &v.routes)
        .flat_map(|r| &r.filters)
        .filter_map(|f| match f {
            sweety_config::Filter::BasicAuth(a) => a.user_set.as_deref(),
            _ => None,
        })
        .collect();
    let mut i = sets_from;
    while i < b.config.user_sets.len() {
        if named.contains(b.config.user_sets[i].name.as_str()) {
            i += 1;
        } else {
            b.config.user_sets.remove(i);
        }
    }

    for ing in &ours {
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        let name = ing.metadata.name.clone().unwrap_or_default();
        b.status(
            ObjectKey::new("Ingress", &ns, &name),
            ObjectStatus::Ingress(IngressStatus {
                load_balancer: lb.clone(),
            }),
        );
        if let Some(r) = reports.remove(&(ns.clone(), name.clone())) {
            if !r.conditions.is_empty() {
                b.status(
                    ObjectKey::new(EVENT_KIND, &ns, &name),
                    ObjectStatus::Conditions(r.conditions),
                );
            }
        }
    }
    served
}

/// Whether an Ingress's TLS passes through (`ssl-passthrough` on a class that allows it): not
/// when it is refused (a protection it asks for cannot be given), nor for a canary.
fn passes_through(ann: &nginx::Annotations) -> bool {
    ann.ssl_passthrough && ann.refuse.is_none() && !ann.canary
}

/// For each rule host: the Ingress that names it first (oldest first, among those that may
/// serve it) and whether that Ingress passes its TLS through. It decides the host's fate: a
/// host first named by a passthrough Ingress is passed through and every other Ingress's rules
/// for it are left out; a host first named by another Ingress is not passed through.
fn first_claims(
    parsed: &[(Arc<Ingress>, nginx::Annotations, Report)],
    owners: &Hosts,
) -> BTreeMap<String, (String, bool)> {
    let mut claims = BTreeMap::new();
    for (ing, ann, _) in parsed.iter().filter(|(_, a, _)| !a.canary) {
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        let key = format!("{ns}/{}", ing.metadata.name.clone().unwrap_or_default());
        for h in ownership::ingress_hosts(ing) {
            if !h.is_empty() && owners.ingress_may_serve(&h, &ns).is_ok() {
                claims
                    .entry(h)
                    .or_insert_with(|| (key.clone(), passes_through(ann)));
            }
        }
    }
    claims
}

/// An Ingress whose TLS passes through (ingress-nginx `ssl-passthrough`): for each rule with a
/// host it may serve and names first, TLS connections whose SNI is the host go, untouched, to
/// the Service of the rule's `/` path (`passthrough`: host → (the Ingress, that backend)). The
/// rest of the Ingress (other paths, `spec.tls`, its default backend, its other annotations)
/// does not apply to those connections and is reported as ignored; rules without a host,
/// wildcard hosts and rules without a `/` path are refused.
fn passthrough_ingress(
    b: &mut Builder<'_>,
    ing: &Ingress,
    owners: &Hosts,
    claims: &BTreeMap<String, (String, bool)>,
    passthrough: &mut BTreeMap<String, (String, String)>,
    report: &mut Report,
) {
    let ns = ing.metadata.namespace.clone().unwrap_or_default();
    let key = format!("{ns}/{}", ing.metadata.name.clone().unwrap_or_default());
    let spec = ing.spec.clone().unwrap_or_default();
    let mut ignored: Vec<String> = Vec::new();
    let mut others: Vec<&str> = ing
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix(nginx::PREFIX))
        .filter(|n| *n != "ssl-passthrough")
        .collect();
    others.sort_unstable();
    if !others.is_empty() {
        ignored.push(format!("the annotations {}", others.join(", ")));
    }
    if spec.tls.as_ref().is_some_and(|t| !t.is_empty()) {
        ignored.push("spec.tls (the backend presents its own certificate)".into());
    }
    if spec.default_backend.is_some() {
        ignored.push("spec.defaultBackend".into());
    }
    for rule in spec.rules.as_deref().unwrap_or_default() {
        let host = rule.host.clone().unwrap_or_default().to_ascii_lowercase();
        let paths = rule
            .http
            .as_ref()
            .map(|h| h.paths.as_slice())
            .unwrap_or_default();
        if host.is_empty() || host.starts_with("*.") {
            report.warn(
                "SSLPassthroughInvalid",
                if host.is_empty() {
                    "ssl-passthrough: a rule without a host cannot be passed through (TLS is \
                     routed by the exact SNI name, as in ingress-nginx); its paths are not served"
                        .to_string()
                } else {
                    format!(
                        "ssl-passthrough: the wildcard host {host:?} cannot be passed through \
                         (ingress-nginx matches the exact SNI name only); its paths are not served"
                    )
                },
            );
            continue;
        }
        if let Err(r) = owners.ingress_may_serve(&host, &ns) {
            report.warn(
                r.reason,
                format!("{}; the rules for {host:?} are not served", r.message),
            );
            continue;
        }
        match claims.get(&host) {
            Some((first, _)) if *first != key => {
                report.warn(
                    "SSLPassthroughConflict",
                    format!(
                        "host {host:?} is already served by the older Ingress {first}; it is \
                         not passed through and this Ingress's rules for it are not served"
                    ),
                );
                continue;
            }
            _ => {}
        }
        if passthrough.contains_key(&host) {
            report.warn(
                "SSLPassthroughConflict",
                format!("host {host:?} is in two rules; the first one is passed through"),
            );
            continue;
        }
        let is_root = |p: &&k8s_openapi::api::networking::v1::HTTPIngressPath| {
            p.path.as_deref().unwrap_or("/") == "/"
        };
        for p in paths.iter().filter(|p| !is_root(p)) {
            ignored.push(format!(
                "path {:?} of {host:?}",
                p.path.as_deref().unwrap_or_default()
            ));
        }
        let Some(root) = paths.iter().find(is_root) else {
            report.warn(
                "SSLPassthroughInvalid",
                format!(
                    "ssl-passthrough: host {host:?} has no `/` path whose Service TLS could pass \
                     through to; it is not served"
                ),
            );
            continue;
        };
        let Some(svc) = root.backend.service.as_ref() else {
            report.warn(
                "SSLPassthroughInvalid",
                format!(
                    "ssl-passthrough: the `/` path of {host:?} names no Service; it is not served"
                ),
            );
            continue;
        };
        let port = port_ref(svc);
        match b.backends.service(
            &b.services,
            &ns,
            &svc.name,
            port.as_ref(),
            &BackendOptions::default(),
        ) {
            Ok(backend) => {
                passthrough.insert(host, (key.clone(), backend));
            }
            Err(e) => report.warn(
                e.reason(),
                format!("{e}; TLS for {host:?} is not passed through"),
            ),
        }
    }
    if !ignored.is_empty() {
        report.warn(
            "SSLPassthroughIgnored",
            format!(
                "ssl-passthrough: TLS connections for the Ingress's hosts pass through, \
                 untouched, to the Service of each rule's `/` path and plain HTTP is redirected to \
                 HTTPS, so these do not apply and are ignored: {}",
                ignored.join("; ")
            ),
        );
    }
}

/// The Service port an Ingress backend names: its number, else its name (None: neither).
fn port_ref(svc: &k8s_openapi::api::networking::v1::IngressServiceBackend) -> Option<PortRef> {
    svc.port.as_ref().and_then(|p| match (&p.number, &p.name) {
        (Some(n), _) => Some(PortRef::Number(*n)),
        (None, Some(n)) => Some(PortRef::Name(n.clone())),
        _ => None,
    })
}

/// The passthrough hosts on the shared listeners: on `ingress-https`, an `l4_routes` entry per
/// host to its backend (the dataplane passes a connection whose SNI is the host through,
/// unterminated, and refuses the name on HTTP/3); on `ingress-http`, every request for the host
/// is redirected (308) to HTTPS (the backend's port speaks TLS). `served` gets the hosts.
/// Without any certificate (no default certificate, no Ingress TLS) there is no
/// `ingress-https` (the dataplane refuses one without a certificate): nothing is passed
/// through, plain HTTP still only redirects, and each Ingress gets an `SSLPassthroughInvalid`
/// Event.
fn passthrough_listeners(
    b: &mut Builder<'_>,
    passthrough: BTreeMap<String, (String, String)>,
    served: &mut BTreeSet<String>,
    reports: &mut BTreeMap<(String, String), Report>,
) {
    if passthrough.is_empty() {
        return;
    }
    let mut idx = Some(https_listener(b));
    if let Some(i) = idx.filter(|&i| {
        b.listeners[i]
            .tls
            .as_ref()
            .is_none_or(|t| t.certificates.is_empty())
    }) {
        b.listeners.remove(i);
        idx = None;
    }
    for (host, (ingress, backend)) in passthrough {
        served.insert(host.clone());
        match idx {
            Some(idx) => b.listeners[idx].l4_routes.push(sweety_config::L4Route {
                name: format!("ingress/{host}"),
                hostnames: vec![host.clone()],
                terminate: false,
                backends: vec![WeightedBackend {
                    backend,
                    weight: 1,
                    filters: Vec::new(),
                }],
            }),
            None => {
                let (ns, name) = ingress.split_once('/').unwrap_or_default();
                if let Some(r) = reports.get_mut(&(ns.to_string(), name.to_string())) {
                    r.warn(
                        "SSLPassthroughInvalid",
                        format!(
                            "ssl-passthrough: the controller has no HTTPS listener (no default \
                             certificate and no Ingress TLS certificate), so TLS for {host:?} is \
                             not passed through; plain HTTP for it is only redirected to HTTPS"
                        ),
                    );
                }
            }
        }
        b.virtual_hosts.push(passthrough_redirect(&host, &ingress));
    }
}

/// The `ingress-http` virtual host of passthrough host `host` (of Ingress `ingress`): every
/// request is redirected (308) to HTTPS.
fn passthrough_redirect(host: &str, ingress: &str) -> VirtualHost {
    VirtualHost {
        name: format!("ingress/{host}"),
        hostnames: vec![host.to_string()],
        listeners: vec![HTTP_LISTENER.into()],
        routes: vec![nginx::redirect_route(
            format!("ingress/{ingress}/ssl-passthrough"),
            nginx::https_redirect(),
        )],
    }
}

fn host_list(hosts: &[String]) -> String {
    if hosts.is_empty() {
        "its hosts are".into()
    } else {
        format!(
            "{} {}",
            hosts.join(", "),
            if hosts.len() == 1 { "is" } else { "are" }
        )
    }
}

/// A 503 route that says why its backend is unavailable.
pub(crate) fn unavailable(why: &str) -> Action {
    Action::Fixed(FixedResponse {
        status: 503,
        body: format!("backend unavailable: {why}\n"),
        content_type: Some("text/plain; charset=utf-8".into()),
    })
}

/// The route for one Ingress backend (proxy, or a 503 when it does not resolve).
fn route_for(
    b: &mut Builder<'_>,
    ns: &str,
    backend: &IngressBackend,
    ann: &nginx::Annotations,
    name: String,
    path: Option<PathMatch>,
    report: &mut Report,
) -> Route {
    let action = match resolve_backend(b, ns, backend, ann, report) {
        Ok(backend) => Action::Proxy(ProxyAction {
            backends: vec![WeightedBackend {
                backend,
                weight: 1,
                filters: Vec::new(),
            }],
        }),
        Err(why) => unavailable(&why),
    };
    // `custom-http-errors` / `default-backend`, naming this path's Service.
    let filters = ann
        .error_pages
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if let Some(svc) = &backend.service {
                let port = svc
                    .port
                    .as_ref()
                    .and_then(|p| p.number.map(|n| n.to_string()).or_else(|| p.name.clone()));
                e.headers.push(sweety_config::HeaderValue {
                    name: "X-Service-Name".into(),
                    value: svc.name.clone(),
                });
                if let Some(port) = port {
                    e.headers.push(sweety_config::HeaderValue {
                        name: "X-Service-Port".into(),
                        value: port,
                    });
                }
            }
            sweety_config::Filter::ErrorPages(e)
        })
        .collect();
    Route {
        name,
        matches: path
            .map(|p| {
                vec![RouteMatch {
                    path: Some(p),
                    ..Default::default()
                }]
            })
            .unwrap_or_default(),
        filters,
        action,
        timeouts: Default::default(),
        retry: None,
        max_request_body_bytes: None,
    }
}

/// Resolve an Ingress backend to a dataplane backend name; the error is the 503 body reason.
pub(crate) fn resolve_backend(
    b: &mut Builder<'_>,
    ns: &str,
    backend: &IngressBackend,
    ann: &nginx::Annotations,
    report: &mut Report,
) -> Result<String, String> {
    let Some(svc) = backend.service.as_ref() else {
        let what = backend
            .resource
            .as_ref()
            .map(|r| format!("{}/{}", r.kind, r.name))
            .unwrap_or_else(|| "an empty backend".into());
        let why = format!("resource backend {what} is not supported");
        report.warn("UnsupportedBackend", why.clone());
        return Err(why);
    };
    let port = port_ref(svc);
    let options = BackendOptions {
        protocol: ann.backend_protocol,
        tls: None,
    };
    b.backends
        .service(&b.services, ns, &svc.name, port.as_ref(), &options)
        .map_err(|e| {
            report.warn(e.reason(), e.to_string());
            e.to_string()
        })
        .map(|name| {
            let name =
                ann.service_upstream_variant(b, (ns, &svc.name, port.as_ref()), name, report);
            let name = ann.backend_tls_variant(b, name, report);
            ann.balanced_backend(b, name)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::{Params, Snapshot};

    fn b64(s: &str) -> String {
        let t = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in s.as_bytes().chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(t[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    fn snapshot(text: &str) -> Snapshot {
        Snapshot::from_yaml(text).unwrap().0
    }

    const CLASSES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: sweety, annotations: {ingressclass.kubernetes.io/is-default-class: "true"}}
spec: {controller: sweety.dev/ingress-controller}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: named, namespace: a}
spec: {ingressClassName: sweety}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: other, namespace: a}
spec: {ingressClassName: nginx}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: none, namespace: a}
spec: {}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: legacy-other, namespace: a, annotations: {kubernetes.io/ingress.class: nginx}}
spec: {}
"#;

    /// `service-upstream`: the path's backend has the ClusterIP as its one endpoint, and the
    /// variants other annotations make (affinity) keep it; the same Service without the
    /// annotation keeps its endpoints; a headless Service keeps its endpoints with an Event.
    #[test]
    fn service_upstream_is_the_cluster_ip_and_other_variants_keep_it() {
        let text = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: sweety}
spec: {controller: sweety.dev/ingress-controller}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: app}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: app}
spec: {clusterIP: None, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: app, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.1.0.1]}, {addresses: [10.1.0.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: headless-1, namespace: app, labels: {kubernetes.io/service-name: headless}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.2.0.1]}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: su
  namespace: app
  annotations:
    nginx.ingress.kubernetes.io/service-upstream: "true"
    nginx.ingress.kubernetes.io/affinity: cookie
spec:
  ingressClassName: sweety
  rules:
  - host: a.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
      - {path: /h, pathType: Prefix, backend: {service: {name: headless, port: {number: 80}}}}
---
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: app}
spec: {clusterIP: "fd00::10", ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: hostile
  namespace: app
  annotations: {nginx.ingress.kubernetes.io/service-upstream: " TRUE "}
spec:
  ingressClassName: sweety
  rules:
  - host: c.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web6, port: {name: http}}}}
      - {path: /x, pathType: Prefix, backend: {service: {name: web, port: {name: nope}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: plain, namespace: app}
spec:
  ingressClassName: sweety
  rules:
  - host: b.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;
        let out = crate::translate::translate(&snapshot(text), &Params::default());
        assert!(out.config.validate_structure().is_ok());
        let backend_of = |host: &str, path: &str| {
            let vh = out
                .config
                .virtual_hosts
                .iter()
                .find(|v| v.hostnames == [host.to_string()])
                .unwrap();
            let r = vh
                .routes
                .iter()
                .find(|r| {
                    r.matches.first().and_then(|m| m.path.as_ref())
                        == Some(&sweety_config::PathMatch::Prefix(path.into()))
                })
                .unwrap();
            let Action::Proxy(p) = &r.action else {
                panic!("{r:?}")
            };
            let name = &p.backends[0].backend;
            let b = out
                .config
                .backends
                .iter()
                .find(|b| &b.name == name)
                .unwrap();
            let eps: Vec<&str> = b.endpoints.iter().map(|e| e.address.as_str()).collect();
            (name.clone(), eps.join(","), b.session_persistence.is_some())
        };
        let (name, eps, sticky) = backend_of("a.example.com", "/");
        assert!(name.starts_with("app/web:80~service-upstream"), "{name}");
        assert_eq!((eps.as_str(), sticky), ("10.96.0.10:80", true));
        let (name, eps, _) = backend_of("b.example.com", "/");
        assert_eq!(
            (name.as_str(), eps.as_str()),
            ("app/web:80", "10.1.0.1:8080,10.1.0.2:8080")
        );
        let (name, eps, _) = backend_of("a.example.com", "/h");
        assert!(!name.contains("service-upstream"), "{name}");
        assert_eq!(eps, "10.2.0.1:8080");
        let events = out
            .statuses
            .iter()
            .find(|(k, _)| k.kind == "IngressEvent" && k.name == "su")
            .map(|(_, s)| format!("{s:?}"))
            .unwrap_or_default();
        assert!(events.contains("ServiceUpstreamIgnored"), "{events}");
        assert!(events.contains("app/headless"), "{events}");
        // Hostile: an IPv6 ClusterIP (bracketed), a port by name, a padded upper-case "true";
        // a port name the Service lacks makes no variant and is reported.
        let (name, eps, _) = backend_of("c.example.com", "/");
        assert!(name.ends_with("~service-upstream"), "{name}");
        assert_eq!(eps, "[fd00::10]:80");
        let vh = out
            .config
            .virtual_hosts
            .iter()
            .find(|v| v.hostnames == ["c.example.com".to_string()])
            .unwrap();
        let x = vh
            .routes
            .iter()
            .find(|r| {
                r.matches.first().and_then(|m| m.path.as_ref())
                    == Some(&sweety_config::PathMatch::Prefix("/x".into()))
            })
            .unwrap();
        assert!(!matches!(x.action, Action::Proxy(_)), "{x:?}");
        let events = out
            .statuses
            .iter()
            .find(|(k, _)| k.kind == "IngressEvent" && k.name == "hostile")
            .map(|(_, s)| format!("{s:?}"))
            .unwrap_or_default();
        assert!(events.contains("nope"), "{events}");
    }

    #[test]
    fn class_selection() {
        let s = snapshot(CLASSES);
        let p = Params::default();
        let names = |s: &Snapshot, served: &[&IngressClass], p: &Params| -> Vec<String> {
            let legacy = legacy_names(s, served, p);
            s.ingresses
                .iter()
                .filter(|i| is_ours(i, served, &legacy))
                .map(|i| i.metadata.name.clone().unwrap())
                .collect()
        };
        assert_eq!(names(&s, &served_classes(&s, &p), &p), ["named", "none"]);
        // Without our IngressClass, neither the named nor the class-less Ingress is ours.
        assert!(names(&s, &[], &p).is_empty());
        // Naming `nginx` too takes nothing while no IngressClass `nginx` of ours exists
        // (ingress-nginx still owns it): only the legacy annotation, which has no object.
        let both = Params {
            ingress_classes: vec!["sweety".into(), "nginx".into()],
            ..Params::default()
        };
        assert_eq!(served_classes(&s, &both).len(), 1);
        assert_eq!(
            names(&s, &served_classes(&s, &both), &both),
            ["named", "none", "legacy-other"]
        );
        // An IngressClass `nginx` still owned by ingress-nginx is not served, and the
        // Ingresses its legacy annotation names stay ingress-nginx's too.
        let mut theirs = snapshot(&format!(
            "{CLASSES}---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\n\
             metadata: {{name: nginx}}\nspec: {{controller: k8s.io/ingress-nginx}}\n"
        ));
        assert_eq!(served_classes(&theirs, &both).len(), 1);
        assert_eq!(
            names(&theirs, &served_classes(&theirs, &both), &both),
            ["named", "none"]
        );
        // Once it is replaced by one of ours, its Ingresses are ours too.
        theirs = snapshot(&format!(
            "{CLASSES}---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\n\
             metadata: {{name: nginx}}\nspec: {{controller: sweety.dev/ingress-controller}}\n"
        ));
        let served = served_classes(&theirs, &both);
        assert_eq!(served.len(), 2);
        assert_eq!(
            names(&theirs, &served, &both),
            ["named", "other", "none", "legacy-other"]
        );
    }

    #[test]
    fn secret_checks() {
        let s = snapshot(
            r#"
apiVersion: v1
kind: Secret
metadata: {name: opaque, namespace: a}
type: Opaque
data: {tls.crt: eA==, tls.key: eA==}
---
apiVersion: v1
kind: Secret
metadata: {name: garbage, namespace: a}
type: kubernetes.io/tls
data: {tls.crt: bm90IGEgY2VydA==, tls.key: bm90IGEga2V5}
---
apiVersion: v1
kind: Secret
metadata: {name: nokey, namespace: a}
type: kubernetes.io/tls
data: {tls.crt: eA==}
"#,
        );
        let get = |name| certificate_from_secret(&s.secrets, "a", name, Vec::new()).unwrap_err();
        assert_eq!(get("missing"), SecretError::NotFound);
        assert!(matches!(get("opaque"), SecretError::Invalid(m) if m.contains("Opaque")));
        assert!(matches!(get("garbage"), SecretError::Invalid(m) if m.contains("tls.crt")));
        assert!(matches!(get("nokey"), SecretError::Invalid(m) if m.contains("no tls.key")));
        // A key block without its END line passes the quick look but not the dataplane's check.
        let s = snapshot(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: cut, namespace: a}}\n\
             type: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n",
            b64("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"),
            b64("-----BEGIN PRIVATE KEY-----\nAA==\n-----END RSA PRIVATE KEY-----\n"),
        ));
        let e = certificate_from_secret(&s.secrets, "a", "cut", vec!["A.example.com".into()]);
        assert!(
            matches!(&e, Err(SecretError::Invalid(m)) if m.contains("END")),
            "{e:?}"
        );
    }

    #[test]
    fn a_default_certificate_secret_is_served_only_when_its_key_is_the_certificates() {
        let secret = |cert: &str, key: &str| {
            snapshot(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: d, namespace: sweety}}\n\
                 type: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n",
                b64(cert),
                b64(key),
            ))
        };
        let fallback = |n: &str| {
            let ck = rcgen::generate_simple_self_signed(vec![n.to_string()]).unwrap();
            super::super::DefaultCertificate {
                cert: ck.cert.pem(),
                key: ck.signing_key.serialize_pem(),
            }
        };
        let (a, b, started) = (fallback("a.test"), fallback("b.test"), fallback("c.test"));
        let p = Params {
            default_certificate: Some(started.clone()),
            default_certificate_secret: Some("sweety/d".into()),
            ..Params::default()
        };
        let served = |s: &Snapshot| {
            let c = default_certificate(&p, &s.secrets).unwrap();
            assert_eq!(c.hostnames, [DEFAULT_CERTIFICATE_NAME]);
            match c.cert {
                PemSource::Pem(pem) => pem,
                PemSource::File(_) => unreachable!(),
            }
        };
        // The Secret's pair is served...
        assert_eq!(served(&secret(&a.cert, &a.key)), a.cert);
        // ...but a certificate with another one's key (the PEM looks fine) would make the
        // dataplane refuse every config: the certificate of the start is served instead.
        assert_eq!(served(&secret(&a.cert, &b.key)), started.cert);
        assert!(matches!(
            default_certificate_from_secret(&secret(&a.cert, &b.key).secrets, "sweety", "d"),
            Err(SecretError::Invalid(m)) if m.contains("not the key of the certificate")
        ));
        assert_eq!(served(&Snapshot::default()), started.cert);
    }

    #[test]
    fn shared_listeners_dedupe_certificates() {
        let s = Snapshot::default();
        let p = Params::default();
        let mut b = Builder::new(&s, &p);
        front_listeners(&mut b, Vec::new());
        assert_eq!(b.listeners.len(), 1);
        assert!(!has_https(&b));
        let cert = Certificate {
            hostnames: vec!["a.example.com".into()],
            cert: PemSource::Pem("c".into()),
            key: PemSource::Pem("k".into()),
        };
        front_listeners(&mut b, vec![cert.clone()]);
        front_listeners(&mut b, vec![cert]);
        assert_eq!(b.listeners.len(), 2);
        let https = b
            .listeners
            .iter()
            .find(|l| l.name == HTTPS_LISTENER)
            .unwrap();
        assert_eq!(https.port, 8443);
        // Alt-Svc names the Service port clients use, not the container port.
        assert_eq!(https.advertised_port, Some(443));
        assert!(https.http3);
        assert_eq!(https.tls.as_ref().unwrap().certificates.len(), 1);
    }

    /// One generated Ingress: namespace (0: app, 1: evil), the hosts it names (bits of
    /// a/b/c.example.com), ssl-passthrough, spec.tls for its hosts, a `/` path (else `/x`).
    type Gen = (usize, u8, bool, bool, bool);

    /// The objects of [`Gen`]s, oldest first, on class pt (ssl-passthrough allowed).
    fn passthrough_objects(ings: &[Gen]) -> String {
        let golden = include_str!("../../testdata/translate/ing-tls.in.yaml");
        let i = golden.find("apiVersion: v1\nkind: Secret").unwrap();
        let j = i + golden[i..].find("---\n").unwrap();
        let mut out = String::from(
            "apiVersion: v1\nkind: TranslateParams\ningressClasses: [pt]\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: pt}\n\
             spec:\n  controller: sweety.dev/ingress-controller\n  parameters: {apiGroup: \
             sweety.dev, kind: SweetyProxyConfig, scope: Namespace, namespace: sweety, name: \
             p}\n---\napiVersion: sweety.dev/v1alpha1\nkind: SweetyProxyConfig\n\
             metadata: {name: p, namespace: sweety}\nspec: {ingress: {sslPassthrough: true}}\n---\n",
        );
        for ns in ["app", "evil"] {
            out.push_str(&golden[i..j].replace("namespace: app", &format!("namespace: {ns}")));
            out.push_str(&format!(
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: {ns}}}\n\
                 spec: {{ports: [{{port: 8200}}]}}\n---\n"
            ));
        }
        for (k, (ns, hosts, pt, tls, root)) in ings.iter().enumerate() {
            let ns = ["app", "evil"][*ns];
            let names: Vec<String> = (0..3)
                .filter(|b| hosts & (1 << b) != 0)
                .map(|b| format!("{}.example.com", ["a", "b", "c"][b]))
                .collect();
            out.push_str(&format!(
                "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: i{k}\n  \
                 namespace: {ns}\n  creationTimestamp: \"2026-01-01T00:00:{k:02}Z\"\n  \
                 annotations: {{nginx.ingress.kubernetes.io/ssl-passthrough: \"{pt}\"}}\n\
                 spec:\n  ingressClassName: pt\n"
            ));
            if *tls {
                out.push_str(&format!(
                    "  tls: [{{hosts: [{}], secretName: app-tls}}]\n",
                    names.join(", ")
                ));
            }
            out.push_str("  rules:\n");
            for h in &names {
                out.push_str(&format!(
                    "  - host: {h}\n    http: {{paths: [{{path: {}, pathType: Prefix, backend: \
                     {{service: {{name: svc, port: {{number: 8200}}}}}}}}]}}\n",
                    if *root { "/" } else { "/x" }
                ));
            }
            out.push_str("---\n");
        }
        out
    }

    /// Without any certificate for `ingress-https` (no default certificate, no `spec.tls`),
    /// a passthrough Ingress still yields a config the dataplane accepts: one tenant's
    /// annotation never makes the whole config invalid.
    #[test]
    fn passthrough_without_any_certificate_keeps_the_config_valid() {
        let text = passthrough_objects(&[(0, 1, true, false, true)]);
        let (snap, overrides) = Snapshot::from_yaml(&text).unwrap();
        let mut v = overrides.unwrap();
        if let Some(m) = v.as_mapping_mut() {
            m.remove("kind");
            m.remove("apiVersion");
        }
        let params: Params = serde_yaml::from_value(v).unwrap();
        assert!(params.default_certificate.is_none());
        let out = crate::translate::translate(&snap, &params);
        let r = out.config.validate_structure();
        assert!(r.is_ok(), "{r:?}");
        // Nothing is passed through (no listener to do it on); plain HTTP only redirects.
        assert!(!out
            .config
            .listeners
            .iter()
            .any(|l| l.name == HTTPS_LISTENER));
        let vh: Vec<_> = out
            .config
            .virtual_hosts
            .iter()
            .filter(|v| v.hostnames.iter().any(|h| h == "a.example.com"))
            .collect();
        assert_eq!(vh.len(), 1);
        assert_eq!(vh[0].listeners, [HTTP_LISTENER]);
        assert!(vh[0].routes[0].name.ends_with("/ssl-passthrough"));
        assert!(matches!(vh[0].routes[0].action, Action::Fixed(ref f) if f.status == 308));
        let said = format!("{:?}", out.statuses);
        assert!(said.contains("has no HTTPS listener"), "{said}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

        /// Whatever Ingresses two namespaces create, in any order: a host passes through
        /// exactly when the oldest Ingress naming it asks for it and has a `/` path, always
        /// to a Service of the namespace that owns the host (a tenant never takes another's
        /// host via passthrough); a passthrough host is never served terminated (no virtual
        /// host on ingress-https), its plain HTTP only redirects; the config validates.
        #[test]
        fn passthrough_follows_the_oldest_claim_within_its_namespace(
            ings in proptest::collection::vec(
                (0usize..2, 1u8..8, proptest::bool::ANY, proptest::bool::ANY, proptest::bool::ANY),
                1..7,
            ),
        ) {
            let text = passthrough_objects(&ings);
            let (snap, overrides) = Snapshot::from_yaml(&text).unwrap();
            let mut params: Params = serde_yaml::from_value(overrides.map(|mut v| {
                if let Some(m) = v.as_mapping_mut() {
                    m.remove("kind");
                    m.remove("apiVersion");
                }
                v
            }).unwrap()).unwrap();
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
            params.default_certificate = Some(crate::translate::DefaultCertificate {
                cert: std::fs::read_to_string(dir.join("default-cert.pem")).unwrap(),
                key: std::fs::read_to_string(dir.join("default-key.pem")).unwrap(),
            });
            let out = crate::translate::translate(&snap, &params);
            proptest::prop_assert!(out.config.validate_structure().is_ok());
            let l4: Vec<&sweety_config::L4Route> = out
                .config
                .listeners
                .iter()
                .filter(|l| l.name == HTTPS_LISTENER)
                .flat_map(|l| &l.l4_routes)
                .collect();
            for b in 0..3 {
                let host = format!("{}.example.com", ["a", "b", "c"][b]);
                let first = ings.iter().find(|g| g.1 & (1 << b) != 0);
                let want = first.filter(|g| g.2 && g.4).map(|g| format!(
                    "{}/svc:8200",
                    ["app", "evil"][g.0]
                ));
                let got: Vec<&str> = l4
                    .iter()
                    .filter(|r| r.hostnames == [host.clone()])
                    .flat_map(|r| &r.backends)
                    .map(|w| w.backend.as_str())
                    .collect();
                proptest::prop_assert_eq!(got.first().copied(), want.as_deref(), "{}", host);
                proptest::prop_assert!(got.len() <= 1);
                if want.is_some() {
                    for vh in out.config.virtual_hosts.iter().filter(|v| v.hostnames.contains(&host)) {
                        proptest::prop_assert!(!vh.listeners.iter().any(|l| l == HTTPS_LISTENER));
                        proptest::prop_assert_eq!(vh.routes.len(), 1);
                        proptest::prop_assert!(vh.routes[0].name.ends_with("/ssl-passthrough"));
                    }
                }
            }
        }
    }
}
