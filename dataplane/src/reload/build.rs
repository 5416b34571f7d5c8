//! Validation and compilation for the reload side: everything a config needs before it can
//! serve (route table, upstreams, listener TLS and QUIC configs, access rules, the
//! [`Snapshot`]), built beside the serving snapshot without touching it. Whatever fails, every
//! error is collected and the config is rejected whole. No sockets here ([`super::sockets`]).

use super::{ApplyError, Reuse};
use crate::proxy::Upstreams;
use crate::router::RouteTable;
use crate::state::{http_builder, BindKey, ListenerView, Shared, Snapshot};
use std::collections::HashMap;
use std::sync::Arc;
use sweety_config::{Config, Listener, ListenerProtocol};

/// A configured listener with what its TLS built into: its index in the config, the
/// listener, the TCP TLS config and, when it serves HTTP/3, the QUIC config.
pub(super) type ListenerBuild<'c> = (
    usize,
    &'c Listener,
    Option<Arc<rustls::ServerConfig>>,
    Option<quinn::ServerConfig>,
    Option<Arc<crate::client_cert::HostAuth>>,
);

/// The listener views of a snapshot, by name and by bind key.
pub(super) type ListenerViews = (
    HashMap<Arc<str>, Arc<ListenerView>, crate::metrics::FnvBuild>,
    HashMap<BindKey, Arc<ListenerView>>,
);

/// A config compiled but not serving: its route table, upstreams and listeners.
pub(super) struct Compiled<'c> {
    pub(super) routes: RouteTable,
    pub(super) upstreams: Upstreams,
    pub(super) views: Vec<ListenerBuild<'c>>,
}

/// Validates `config` (unless `taken` holds the routes of an already validated one; with a
/// `reuse` of the same context, only its changed virtual hosts) and compiles it, taking
/// unchanged virtual hosts from `prev` when `reuse` says which they are.
pub(super) fn compile<'c>(
    shared: &Shared,
    prev: &Snapshot,
    config: &'c Config,
    reuse: Option<&Reuse<'_>>,
    taken: Option<Vec<Vec<sweety_config::Route>>>,
) -> Result<Compiled<'c>, ApplyError> {
    let validated = match (&reuse, &taken) {
        (_, Some(_)) => Ok(()),
        (Some(r), None) if r.same_context => {
            let changed = r.changed_vhost;
            config.validate_trusting(&|i| !changed(&config.virtual_hosts[i].name))
        }
        _ => config.validate(),
    };
    validated?;
    let mut errors = Vec::new();
    let unchanged = |name: &str| reuse.as_ref().is_some_and(|r| !(r.changed_vhost)(name));
    let previous: Option<(&RouteTable, crate::router::Unchanged<'_>)> = reuse
        .as_ref()
        .map(|_| (&prev.routes, &unchanged as crate::router::Unchanged<'_>));
    let routes = match taken {
        Some(routes) => RouteTable::build_taking(config, routes),
        None => RouteTable::build_reusing(config, previous),
    }
    .map_err(|e| errors.push(e.to_string()))
    .ok();
    let upstreams = Upstreams::build_with(
        &config.backends,
        Some(&prev.upstreams),
        shared.metrics.clone(),
        config.limits.proxy_read_ahead,
        config.limits.http2_client,
    )
    .map_err(|e| errors.push(e.to_string()))
    .ok();
    let mut views = Vec::new();
    for (i, l) in config.listeners.iter().enumerate() {
        let mut host_auth = None;
        let (tls, quic) = match (&l.protocol, &l.tls) {
            (ListenerProtocol::Https, Some(t)) => {
                let path = format!("listeners[{i}].tls");
                let early = l.http3.then_some(config.http3.early_data);
                match crate::tls::listener_configs(t, &path, early, &l.l4_routes) {
                    Ok(c) => {
                        let quic = c.quic.and_then(|q| {
                            crate::listen::quic::server_config(
                                q,
                                &config.http3,
                                &config.limits,
                                &path,
                                &shared.quic_sent_state,
                            )
                            .map_err(|e| errors.push(e))
                            .ok()
                        });
                        host_auth = c.host_auth;
                        (Some(c.tcp), quic)
                    }
                    Err(e) => {
                        errors.push(e.to_string());
                        (None, None)
                    }
                }
            }
            // Terminating routes of a `tls` listener: no ALPN (the bytes inside are not
            // HTTP to us), the listener's certificates chosen by SNI as for HTTPS.
            (ListenerProtocol::Tls, Some(t)) => {
                let path = format!("listeners[{i}].tls");
                match crate::tls::server_config(t, &path, &[]) {
                    Ok(c) => (Some(c), None),
                    Err(e) => {
                        errors.push(e.to_string());
                        (None, None)
                    }
                }
            }
            _ => (None, None),
        };
        views.push((i, l, tls, quic, host_auth));
    }
    let (Some(routes), Some(upstreams), true) = (routes, upstreams, errors.is_empty()) else {
        return Err(ApplyError::Invalid(errors));
    };
    Ok(Compiled {
        routes,
        upstreams,
        views,
    })
}

/// The listener views of `config`, by name and by bind key: `port` gives the port each
/// serves on (its socket's), `h3_up` whether its HTTP/3 endpoint is up (Alt-Svc is
/// advertised only then). Per-listener in-flight limits are kept across reloads in
/// `shared` (resized, or dropped with their listener).
pub(super) fn listener_views(
    shared: &Shared,
    config: &Config,
    views: &[ListenerBuild<'_>],
    port: &dyn Fn(&BindKey, u16) -> u16,
    h3_up: &dyn Fn(&BindKey) -> bool,
) -> ListenerViews {
    let mut listeners = HashMap::default();
    let mut by_key = HashMap::new();
    let mut limits = shared
        .listener_limits
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    for (_, l, tls, quic, host_auth) in views {
        let key = super::sockets::bind_key(l);
        let port = port(&key, l.port);
        let limit = l.max_requests_in_flight.map(|max| {
            let lim = limits
                .entry(l.name.clone())
                .or_insert_with(|| Arc::new(crate::limits::Limit::new(max as usize)));
            lim.resize(max as usize);
            lim.clone()
        });
        // Advertise HTTP/3 only where its UDP socket is up.
        let h3_up = quic.is_some() && h3_up(&key);
        let view = Arc::new(ListenerView {
            name: l.name.as_str().into(),
            port,
            protocol: l.protocol,
            tls: tls.clone(),
            host_auth: host_auth.clone(),
            sni_scopes: l
                .tls
                .as_ref()
                .filter(|_| tls.is_some() && l.protocol == ListenerProtocol::Https)
                .map(|t| Arc::new(crate::tls::SniScopes::new(&t.certificates))),
            limit,
            alt_svc: h3_up.then(|| {
                crate::listen::quic::alt_svc(
                    l.advertised_port.unwrap_or(port),
                    config.http3.alt_svc_max_age.get(),
                )
            }),
            l4: crate::router::l4::L4Listener::compile(l),
            passthrough: crate::router::l4::L4Listener::passthrough(l),
            proxy_protocol: crate::proxy_protocol::Expect::for_listener(&config.client_ip, &l.name),
        });
        by_key.insert(key.clone(), view.clone());
        listeners.insert(view.name.clone(), view);
    }
    limits.retain(|name, _| listeners.contains_key(name.as_str()));
    (listeners, by_key)
}

/// The snapshot of a whole config: its compiled parts, its listener views, its access rules
/// and what it keeps of the config (the settings and listeners; virtual hosts and backends
/// live on compiled). `hash` is the config's content hash when the caller has it.
pub(super) fn snapshot(
    shared: &Shared,
    config: &Config,
    hash: Option<String>,
    routes: RouteTable,
    upstreams: Upstreams,
    (listeners, by_key): ListenerViews,
) -> Snapshot {
    let access = Arc::new(crate::access::AccessRules::build(
        &config.client_ip,
        &config.user_sets,
        &routes,
        &shared.rate_zones,
    ));
    let hash = hash.unwrap_or_else(|| config.content_hash());
    let virtual_host_count = config.virtual_hosts.len();
    let backend_count = config.backends.len();
    let mut kept = sweety_config::delta::settings_of(config);
    kept.generation = config.generation;
    kept.listeners = config.listeners.clone();
    Snapshot {
        http: http_builder(&config.limits),
        hash,
        virtual_host_count,
        backend_count,
        routes,
        upstreams: Arc::new(upstreams),
        listeners,
        by_key,
        config: Arc::new(kept),
        access,
    }
}

/// The snapshot of `config`, the serving one (`prev`) with a patch of its virtual hosts
/// (`edit`) and, when `backends_changed`, its backends: only what changed is compiled;
/// listeners, their TLS and the settings are `prev`'s. The caller validated the patch.
/// Beside it, the names of the routes the replaced and removed virtual hosts had that the
/// new ones do not (a name can still be served by another virtual host).
pub(super) fn patched(
    shared: &Shared,
    prev: &Snapshot,
    config: &Config,
    hash: String,
    edit: &sweety_config::delta::ListPatch,
    backends_changed: bool,
) -> Result<(Snapshot, Vec<Arc<str>>), ApplyError> {
    let mut access_touched = false;
    // Every route of the changed virtual hosts, old and new.
    let mut touched: Vec<Arc<str>> = Vec::new();
    let routes = prev
        .routes
        .patch(config, edit, &mut |e| {
            access_touched |= crate::access::AccessRules::has_route_rules(&e.route);
            touched.push(e.name.clone());
        })
        .map_err(|e| ApplyError::Invalid(vec![e.to_string()]))?;
    let kept: std::collections::HashSet<&str> = edit
        .changed_positions(config.virtual_hosts.len())
        .into_iter()
        .flat_map(|i| config.virtual_hosts[i].routes.iter())
        .map(|r| r.name.as_str())
        .collect();
    touched.retain(|name| !kept.contains(&**name));
    touched.sort_unstable();
    touched.dedup();
    let upstreams = if backends_changed {
        let built = Upstreams::build_with(
            &config.backends,
            Some(&prev.upstreams),
            shared.metrics.clone(),
            config.limits.proxy_read_ahead,
            config.limits.http2_client,
        )
        .map_err(|e| ApplyError::Invalid(vec![e.to_string()]))?;
        Arc::new(built)
    } else {
        prev.upstreams.clone()
    };
    let access = if access_touched {
        Arc::new(crate::access::AccessRules::build(
            &config.client_ip,
            &config.user_sets,
            &routes,
            &shared.rate_zones,
        ))
    } else {
        prev.access.clone()
    };
    let mut settings = Config::clone(&prev.config);
    settings.generation = config.generation;
    let snapshot = Snapshot {
        http: http_builder(&settings.limits),
        config: Arc::new(settings),
        virtual_host_count: config.virtual_hosts.len(),
        backend_count: config.backends.len(),
        hash,
        routes,
        upstreams,
        listeners: prev.listeners.clone(),
        by_key: prev.by_key.clone(),
        access,
    };
    Ok((snapshot, touched))
}
