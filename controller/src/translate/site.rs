//! SweetySite front end: one object describing a whole site.
//!
//! Each accepted site becomes the virtual host `site/<namespace>/<name>` on the shared
//! `ingress-http` listener, and on `ingress-https` when its TLS Secret resolves (see
//! [`super::ingress::front_listeners`]).
//!
//! - **Hostnames** belong to their oldest claim across Ingresses and SweetySites, with the
//!   operator's pins ([`super::ownership`]); a site serves only the hostnames it owns (sites
//!   never share). The others are named in the `Accepted` message (`HostnameConflict`); a site
//!   that owns none of its hostnames is `Accepted=False` with reason `HostnameConflict` and not
//!   served. Its certificate is used only for owned hostnames it covers (SAN, RFC 6125).
//! - **Presets** expand to [`StaticSite`] settings for static routes: `static` (and no preset):
//!   `index.html`, precompressed siblings; `spa`: also `try_files [$uri, $uri/, /index.html]`,
//!   `Cache-Control: no-cache` for pages, and two extra prefix routes `<path>/assets` (Vite)
//!   and `<path>/static` (create-react-app) that serve hashed assets with
//!   `public, max-age=31536000, immutable` and no fallback (a missing asset is a 404, not the
//!   app shell).
//! - **ConfigMap content**: the `data` keys become files in
//!   `<content_dir>/<namespace>/<configmap>-<first 12 hex of sha256(content)>`, listed in
//!   `Output::static_content` for the controller to write before pushing. `binaryData` is not
//!   copied (reported in the `ResolvedRefs` message).
//! - **Proxy** backends resolve through `backends.rs`; one that does not resolve is left out of
//!   the split (`ResolvedRefs=False`, `BackendNotFound`); with none left the route answers 503.
//! - **Redirect**: a full `url`, or scheme/host/path replacing the request's.
//! - **responseHeaders** → a response-header filter on every route; `cache.ttlSeconds` sets
//!   `Cache-Control: public, max-age=<ttl>` on static routes and a `cache` filter (ttl) on proxy
//!   routes; `compression.enabled` → a `compress` filter on every route (`minimumSize` →
//!   `min_size`).
//! - **rateLimit** → a per-client-IP `rate_limit` filter on every route of the site, all in one
//!   zone (`site/<ns>/<name>`), so the limit is per client across the whole site:
//!   `requestsPerSecond` per second with `burst` extra.
//! - **Status**: `Accepted`, `ResolvedRefs` (`BackendNotFound`, `SecretNotFound`,
//!   `ConfigMapNotFound`), `Programmed=True` (the status writer holds it back until the
//!   dataplane acknowledges the config), and `addresses` from the ingress Service's load
//!   balancer.

use super::backends::{BackendOptions, PortRef};
use super::cert_names;
use super::ingress::{
    certificate_from_secret, checked_route, front_listeners, load_balancer,
    nginx::parse_redirect_url, our_ingresses, unavailable, SecretError, HTTPS_LISTENER,
    HTTP_LISTENER,
};
use super::ownership::Hosts;
use super::status::{Address, Condition, ObjectKey, ObjectStatus, SiteStatus};
use super::{Builder, StaticContent};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use sweety_config::{
    Action, Filter, FixedResponse, HeaderModifier, HeaderValue, PathMatch, PathRewrite, PemSource,
    ProxyAction, RateLimit, RateLimitKey, Redirect, Route, RouteMatch, StaticSite, VirtualHost,
    WeightedBackend,
};
use sweety_crds::site::{PathType, Preset, SiteRoute, StaticAction};
use sweety_crds::SweetySite;

/// Kind used in status keys.
pub const KIND: &str = "SweetySite";

const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// Translate every SweetySite. `ingress_hosts` are the hostnames the Ingresses serve on the
/// shared listeners (what [`super::ingress::translate`] returned); with host ownership a site
/// owns none of them, and it never serves one.
pub fn translate(b: &mut Builder<'_>, ingress_hosts: &BTreeSet<String>) {
    let mut sites: Vec<Arc<SweetySite>> = b.snapshot.sites.to_vec();
    if sites.is_empty() {
        return;
    }
    sites.sort_by(|x, y| {
        let key = |s: &SweetySite| {
            (
                s.metadata.creation_timestamp.clone().map(|t| t.0),
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            )
        };
        key(x).cmp(&key(y))
    });
    // Who owns each hostname of the shared listeners (Ingresses and sites, oldest first).
    let owners = Hosts::compute(b.snapshot, b.params, &our_ingresses(b.snapshot, b.params));
    let addresses: Vec<Address> = load_balancer(b)
        .into_iter()
        .flat_map(|lb| {
            let ip = lb.ip.map(|v| Address {
                type_: "IPAddress".into(),
                value: v,
            });
            let host = lb.hostname.map(|v| Address {
                type_: "Hostname".into(),
                value: v,
            });
            ip.into_iter().chain(host)
        })
        .collect();
    front_listeners(b, Vec::new());
    for site in &sites {
        let ns = site.metadata.namespace.clone().unwrap_or_default();
        let name = site.metadata.name.clone().unwrap_or_default();
        let generation = site.metadata.generation.unwrap_or(0);
        let key = ObjectKey::new(KIND, &ns, &name);
        let cond = |t: &str, ok: bool, reason: &str, msg: String| {
            Condition::new(t, ok, reason, msg, generation)
        };
        let mut served: Vec<String> = Vec::new();
        let mut conflicts: Vec<String> = Vec::new();
        for h in &site.spec.hostnames {
            match owners.site_may_serve(&h.to_ascii_lowercase(), &ns, &name) {
                // Ownership already keeps Ingresses off a site's hosts; this keeps the two
                // disjoint whatever the rules say.
                Ok(()) if ingress_hosts.contains(&h.to_ascii_lowercase()) => {
                    conflicts.push(format!("host {h:?} is served by an Ingress"))
                }
                Ok(()) => served.push(h.clone()),
                Err(r) => conflicts.push(r.message),
            }
        }
        let header_problem = header_problem(site);
        if (served.is_empty() && !conflicts.is_empty()) || header_problem.is_some() {
            let (reason, msg) = match header_problem {
                Some(p) if conflicts.is_empty() => ("InvalidHeaders", p),
                Some(p) => ("InvalidHeaders", format!("{p}; {}", conflicts.join("; "))),
                None => (
                    "HostnameConflict",
                    format!("hostnames already in use: {}", conflicts.join("; ")),
                ),
            };
            b.status(
                key,
                ObjectStatus::Site(SiteStatus {
                    conditions: vec![
                        cond("Accepted", false, reason, msg),
                        cond(
                            "ResolvedRefs",
                            true,
                            "ResolvedRefs",
                            "references not checked: the site is not accepted".into(),
                        ),
                        cond(
                            "Programmed",
                            false,
                            "Invalid",
                            "the site is not accepted".into(),
                        ),
                    ],
                    addresses: Vec::new(),
                }),
            );
            continue;
        }
        let mut refs = Refs::default();
        let mut notes: Vec<String> = conflicts
            .iter()
            .map(|c| format!("{c}; not served by this site (HostnameConflict)"))
            .collect();

        // TLS: for the served hostnames the certificate covers.
        let mut tls_ok = false;
        if let Some(tls) = &site.spec.tls {
            match certificate_from_secret(&b.snapshot.secrets, &ns, &tls.secret_name, Vec::new()) {
                Ok(mut cert) => {
                    let names = match &cert.cert {
                        PemSource::Pem(pem) => cert_names::dns_names(pem),
                        PemSource::File(_) => Err("not inline PEM".into()),
                    };
                    match names {
                        Ok(names) => {
                            let (covered, not): (Vec<String>, Vec<String>) = served
                                .iter()
                                .map(|h| h.to_ascii_lowercase())
                                .partition(|h| cert_names::covers(&names, h));
                            if !not.is_empty() {
                                refs.fail(
                                    "CertificateMismatch",
                                    format!(
                                        "the certificate of TLS Secret {ns}/{} does not cover \
                                         {}; served on HTTP only",
                                        tls.secret_name,
                                        not.join(", ")
                                    ),
                                );
                            }
                            if !covered.is_empty() {
                                cert.hostnames = covered;
                                front_listeners(b, vec![cert]);
                                tls_ok = true;
                            }
                        }
                        Err(why) => refs.fail(
                            "SecretNotFound",
                            format!(
                                "TLS Secret {ns}/{}: {why}; served on HTTP only",
                                tls.secret_name
                            ),
                        ),
                    }
                }
                Err(SecretError::NotFound) => refs.fail(
                    "SecretNotFound",
                    format!(
                        "TLS Secret {ns}/{} not found; served on HTTP only",
                        tls.secret_name
                    ),
                ),
                Err(SecretError::Invalid(why)) => refs.fail(
                    "SecretNotFound",
                    format!(
                        "TLS Secret {ns}/{}: {why}; served on HTTP only",
                        tls.secret_name
                    ),
                ),
            }
        }
        if let Some(h3) = site.spec.http3 {
            if h3 != b.params.http3 {
                notes.push(format!(
                    "http3: {h3} is not applied: HTTP/3 is a setting of the shared HTTPS \
                     listener (currently {})",
                    b.params.http3
                ));
            }
        }

        // Routes.
        let edits = site.spec.response_headers.as_ref().map(|h| HeaderModifier {
            set: h.set.iter().map(|x| hv(&x.name, &x.value)).collect(),
            add: h.add.iter().map(|x| hv(&x.name, &x.value)).collect(),
            remove: h.remove.clone(),
        });
        let cache = site
            .spec
            .cache
            .as_ref()
            .map(|c| format!("public, max-age={}", c.ttl_seconds.max(0)));
        let mut routes = Vec::new();
        for (i, r) in site.spec.routes.iter().enumerate() {
            let route_name = format!("site/{ns}/{name}/route-{i}");
            let matches = vec![RouteMatch {
                path: Some(match r.path_type {
                    PathType::Exact => PathMatch::Exact(r.path.clone()),
                    PathType::Prefix => PathMatch::Prefix(r.path.clone()),
                }),
                ..Default::default()
            }];
            let mut extra = Vec::new();
            let (action, filters) = if let Some(st) = &r.r#static {
                let action = match static_root(b, &ns, st, &mut refs) {
                    Some(root) => {
                        let preset = site.spec.preset;
                        if preset == Some(Preset::Spa) && r.path_type == PathType::Prefix {
                            for sub in ["assets", "static"] {
                                extra.push(asset_route(
                                    &format!("{route_name}/{sub}"),
                                    r,
                                    sub,
                                    &root,
                                ));
                            }
                        }
                        Action::Static(static_site(r, preset, root, cache.clone()))
                    }
                    None => unavailable("static content not found"),
                };
                (action, Vec::new())
            } else if let Some(p) = &r.proxy {
                let mut backends = Vec::new();
                for be in &p.backends {
                    match b.backends.service(
                        &b.services,
                        &ns,
                        &be.service,
                        Some(&PortRef::Number(be.port)),
                        &BackendOptions::default(),
                    ) {
                        Ok(backend) => backends.push(WeightedBackend {
                            backend,
                            weight: be.weight.unwrap_or(1).max(0) as u32,
                            filters: Vec::new(),
                        }),
                        Err(e) => refs.fail(e.reason(), e.to_string()),
                    }
                }
                let action = if backends.iter().any(|w| w.weight > 0) {
                    Action::Proxy(ProxyAction { backends })
                } else {
                    unavailable("no proxy backend resolves")
                };
                // cache.ttlSeconds: the dataplane's response cache for proxied routes.
                let filters = site
                    .spec
                    .cache
                    .as_ref()
                    .filter(|c| c.ttl_seconds > 0)
                    .map(|c| {
                        vec![Filter::Cache(sweety_config::CachePolicy {
                            ttl: Some(sweety_config::Duration::from_secs(c.ttl_seconds as u64)),
                            ..Default::default()
                        })]
                    })
                    .unwrap_or_default();
                (action, filters)
            } else if let Some(rd) = &r.redirect {
                let status = rd.status_code.unwrap_or(302).clamp(0, 999) as u16;
                let redirect = match &rd.url {
                    Some(url) => parse_redirect_url(url, status),
                    None => Some(Redirect {
                        scheme: rd.scheme.clone(),
                        host: rd.host.clone(),
                        port: None,
                        path: rd.path.clone().map(PathRewrite::Full),
                        status,
                    }),
                };
                match redirect {
                    Some(redirect) => (
                        Action::Fixed(FixedResponse {
                            status,
                            body: String::new(),
                            content_type: None,
                        }),
                        vec![Filter::Redirect(redirect)],
                    ),
                    None => {
                        notes.push(format!("route {i}: redirect url is invalid; answers 503"));
                        (unavailable("invalid redirect"), Vec::new())
                    }
                }
            } else {
                notes.push(format!("route {i} has no action; answers 503"));
                (unavailable("route has no action"), Vec::new())
            };
            let mut route = Route {
                name: route_name,
                matches,
                filters,
                action,
                timeouts: Default::default(),
                retry: None,
                max_request_body_bytes: None,
            };
            for r in extra.iter_mut().chain(std::iter::once(&mut route)) {
                if let Some(rl) = &site.spec.rate_limit {
                    r.filters.insert(
                        0,
                        Filter::RateLimit(RateLimit {
                            key: RateLimitKey::ClientIp,
                            requests: rl.requests_per_second.max(1) as u32,
                            period: sweety_config::Duration::from_secs(1),
                            burst: rl.burst.unwrap_or(0).max(0) as u32,
                            max_keys: 65_536,
                            zone: Some(format!("site/{ns}/{name}")),
                            status: sweety_config::DEFAULT_LIMIT_STATUS,
                            exempt: Vec::new(),
                        }),
                    );
                }
                if let Some(e) = &edits {
                    r.filters.push(Filter::ResponseHeaders(e.clone()));
                }
                if let Some(c) = site.spec.compression.as_ref().filter(|c| c.enabled) {
                    r.filters.push(Filter::Compress(sweety_config::Compression {
                        min_size: c
                            .minimum_size
                            .map_or(sweety_config::Compression::default().min_size, |n| {
                                n.max(0) as u64
                            }),
                        ..Default::default()
                    }));
                }
            }
            let mut invalid = |m: String| notes.push(m);
            routes.extend(
                std::iter::once(route)
                    .chain(extra)
                    .filter_map(|r| checked_route(r, &mut invalid)),
            );
        }
        let mut listeners = vec![HTTP_LISTENER.to_string()];
        if tls_ok {
            listeners.push(HTTPS_LISTENER.into());
        }
        b.virtual_hosts.push(VirtualHost {
            name: format!("site/{ns}/{name}"),
            hostnames: served,
            listeners,
            routes,
        });
        let accepted_msg = if notes.is_empty() {
            "the site is valid".to_string()
        } else {
            format!("the site is valid; {}", notes.join("; "))
        };
        let (refs_ok, refs_reason, refs_msg) = refs.summary();
        b.status(
            key,
            ObjectStatus::Site(SiteStatus {
                conditions: vec![
                    cond("Accepted", true, "Accepted", accepted_msg),
                    cond("ResolvedRefs", refs_ok, &refs_reason, refs_msg),
                    cond(
                        "Programmed",
                        true,
                        "Programmed",
                        "the site is part of the dataplane configuration".into(),
                    ),
                ],
                addresses: addresses.clone(),
            }),
        );
    }
}

/// Failed references of one site, in the order found.
#[derive(Default)]
struct Refs {
    failures: Vec<(String, String)>,
    notes: Vec<String>,
}

impl Refs {
    fn fail(&mut self, reason: &str, message: String) {
        if !self.failures.iter().any(|(_, m)| *m == message) {
            self.failures.push((reason.into(), message));
        }
    }

    /// (ok, reason, message): the first failure's reason names the condition.
    fn summary(&self) -> (bool, String, String) {
        let mut msgs: Vec<String> = self.failures.iter().map(|(_, m)| m.clone()).collect();
        msgs.extend(self.notes.iter().cloned());
        match self.failures.first() {
            Some((reason, _)) => (false, reason.clone(), msgs.join("; ")),
            None if msgs.is_empty() => (
                true,
                "ResolvedRefs".into(),
                "all references resolved".into(),
            ),
            None => (
                true,
                "ResolvedRefs".into(),
                format!("all references resolved; {}", msgs.join("; ")),
            ),
        }
    }
}

fn hv(name: &str, value: &str) -> HeaderValue {
    HeaderValue {
        name: name.into(),
        value: value.into(),
    }
}

/// A header set twice or both set and removed would make the dataplane config invalid.
fn header_problem(site: &SweetySite) -> Option<String> {
    let h = site.spec.response_headers.as_ref()?;
    let mut seen = BTreeSet::new();
    for s in &h.set {
        if !seen.insert(s.name.to_ascii_lowercase()) {
            return Some(format!(
                "responseHeaders.set names {:?} more than once",
                s.name
            ));
        }
    }
    for r in &h.remove {
        if seen.contains(&r.to_ascii_lowercase()) {
            return Some(format!("responseHeaders: {r:?} is both set and removed"));
        }
    }
    if let Some(bad) = h
        .set
        .iter()
        .chain(&h.add)
        .find(|x| x.value.chars().any(|c| c.is_control() && c != '\t'))
    {
        return Some(format!(
            "responseHeaders: the value of {:?} contains control characters",
            bad.name
        ));
    }
    None
}

/// The directory a static route serves, registering ConfigMap content to write.
fn static_root(
    b: &mut Builder<'_>,
    ns: &str,
    st: &StaticAction,
    refs: &mut Refs,
) -> Option<PathBuf> {
    if let Some(dir) = &st.directory {
        return Some(PathBuf::from(dir));
    }
    let cm_name = &st.config_map.as_ref()?.name;
    let Some(cm) = b.snapshot.config_maps.iter().find(|c| {
        c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(cm_name)
    }) else {
        refs.fail(
            "ConfigMapNotFound",
            format!("ConfigMap {ns}/{cm_name} not found"),
        );
        return None;
    };
    let files: BTreeMap<String, String> = cm.data.clone().unwrap_or_default().into_iter().collect();
    if cm.binary_data.as_ref().is_some_and(|d| !d.is_empty()) {
        let note = format!("ConfigMap {ns}/{cm_name}: binaryData is not served (text data only)");
        if !refs.notes.contains(&note) {
            refs.notes.push(note);
        }
    }
    let mut h = Sha256::new();
    for (k, v) in &files {
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_be_bytes());
        h.update(v.as_bytes());
    }
    let hash: String = h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = format!(
        "{}/{ns}/{cm_name}-{hash}",
        b.params.content_dir.trim_end_matches('/')
    );
    if !b.static_content.iter().any(|c| c.dir == dir) {
        b.static_content.push(StaticContent {
            dir: dir.clone(),
            files,
        });
    }
    Some(PathBuf::from(dir))
}

/// StaticSite settings for a route, from the preset.
fn static_site(
    r: &SiteRoute,
    preset: Option<Preset>,
    root: PathBuf,
    cache: Option<String>,
) -> StaticSite {
    let spa = preset == Some(Preset::Spa);
    StaticSite {
        root,
        index: vec!["index.html".into()],
        try_files: if spa {
            vec!["$uri".into(), "$uri/".into(), "/index.html".into()]
        } else {
            Vec::new()
        },
        precompressed: true,
        cache_control: cache.or_else(|| spa.then(|| "no-cache".into())),
        strip_prefix: strip(r),
        hide_dotfiles: true,
    }
}

fn strip(r: &SiteRoute) -> Option<String> {
    let p = r.path.trim_end_matches('/');
    (r.path_type == PathType::Prefix && !p.is_empty()).then(|| p.to_string())
}

/// SPA preset: hashed assets under `<path>/<sub>` cached for a year, no app-shell fallback.
fn asset_route(name: &str, r: &SiteRoute, sub: &str, root: &std::path::Path) -> Route {
    let base = r.path.trim_end_matches('/');
    Route {
        name: name.into(),
        matches: vec![RouteMatch {
            path: Some(PathMatch::Prefix(format!("{base}/{sub}"))),
            ..Default::default()
        }],
        filters: Vec::new(),
        action: Action::Static(StaticSite {
            root: root.to_path_buf(),
            index: vec!["index.html".into()],
            try_files: Vec::new(),
            precompressed: true,
            cache_control: Some(IMMUTABLE.into()),
            strip_prefix: strip(r),
            hide_dotfiles: true,
        }),
        timeouts: Default::default(),
        retry: None,
        max_request_body_bytes: None,
    }
}
