//! Gateways into the output: which Gateways are ours, their container ports, the dataplane
//! listeners (one per Gateway and port) with their virtual hosts or L4 routes, the
//! per-Gateway Service and the Gateway status.

use super::attach;
use super::classes::ClassInfo;
use super::client_cert;
use super::frontend;
use super::listeners::{self, Proto};
use super::listenersets;
use super::routes::{self, Collected, HttpEntry, L4Entry, SortKey};
use super::OwnedGateway;
use crate::translate::addressing::{self, Allocation, PortRequest};
use crate::translate::status::{Condition, GatewayStatus, ObjectKey, ObjectStatus};
use crate::translate::{Builder, GatewayService, Params, ServicePort};
use std::collections::{BTreeMap, BTreeSet};
use sweety_config::{
    Filter, L4Route, Listener, ListenerProtocol, ListenerTls, Route, TlsVersion, VirtualHost,
};

/// Our Gateways (class ours and accepted), sorted by namespace/name, listeners validated.
/// Gateways of our class that is not accepted get a status saying so.
pub(super) fn gateways(
    b: &mut Builder<'_>,
    classes: &BTreeMap<String, ClassInfo>,
) -> Vec<OwnedGateway> {
    let mut list: Vec<_> = b.snapshot.gateways.to_vec();
    list.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut out = Vec::new();
    for gw in list {
        let ns = gw.metadata.namespace.clone().unwrap_or_default();
        let name = gw.metadata.name.clone().unwrap_or_default();
        let generation = gw.metadata.generation.unwrap_or(0);
        let Some(class) = classes.get(&gw.spec.gateway_class_name) else {
            continue;
        };
        if !class.accepted {
            let msg = format!(
                "GatewayClass {} is not accepted",
                gw.spec.gateway_class_name
            );
            b.status(
                ObjectKey::new("Gateway", &ns, &name),
                ObjectStatus::Gateway(GatewayStatus {
                    addresses: Vec::new(),
                    conditions: vec![
                        Condition::new("Accepted", false, "Invalid", &msg, generation),
                        Condition::new("Programmed", false, "Invalid", &msg, generation),
                    ],
                    listeners: Vec::new(),
                    attached_listener_sets: 0,
                }),
            );
            continue;
        }
        let mut frontends = listeners::Frontends::new();
        let mut listeners = listeners::validate(b.snapshot, &gw, &mut frontends);
        let listener_sets =
            listenersets::attach_sets(b.snapshot, &gw, &ns, &mut listeners, &mut frontends);
        let rejected = invalid_parameters(&gw).or(requested_addresses(&gw).1);
        let backend_client_cert = client_cert::resolve(b.snapshot, &gw, &ns);
        out.push(OwnedGateway {
            backend_client_cert,
            client_certs: BTreeMap::new(),
            listener_sets,
            gateway: gw,
            namespace: ns,
            name,
            generation,
            listeners,
            rejected,
            service_refused: None,
            http3: class.http3.unwrap_or(b.params.http3),
            class: class.clone(),
        });
    }
    refuse_service_conflicts(b, &mut out, &addressing::service_name);
    out
}

/// Defence in depth for the per-Gateway Services, which share one namespace by default:
/// [`addressing::service_name`] is injective up to an 80-bit hash collision, but should two
/// Gateways still map to one Service, the older one (Gateway API's conflict order: creation
/// time, then namespace/name) keeps it and the later ones are refused; and when a Service of
/// that name exists that this installation did not make for the older one
/// ([`addressing::is_service_of`]: a user's own, another installation's, another Gateway's),
/// every claimant is refused and the Service is left alone (`gateway_services` never adopts
/// it). A refused Gateway gets `Accepted: False` with reason `ServiceNameTaken` naming the
/// Service and who holds it; its listeners get no container ports, its routes no parent.
/// `service_name` is [`addressing::service_name`] (a parameter so a test can make names collide).
fn refuse_service_conflicts(
    b: &Builder<'_>,
    gateways: &mut [OwnedGateway],
    service_name: &dyn Fn(&str, &str) -> String,
) {
    let mut by_service: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (i, g) in gateways.iter().enumerate() {
        let key = (
            b.params.gateway_service_namespace(&g.namespace).to_string(),
            service_name(&g.namespace, &g.name),
        );
        by_service.entry(key).or_default().push(i);
    }
    for ((svc_ns, svc), mut claimants) in by_service {
        claimants.sort_by_cached_key(|&i| routes::meta_key(&gateways[i].gateway.metadata));
        let first = &gateways[claimants[0]];
        let foreign = b.snapshot.services.iter().any(|s| {
            s.metadata.namespace.as_deref() == Some(svc_ns.as_str())
                && s.metadata.name.as_deref() == Some(svc.as_str())
                && !addressing::is_service_of(s, b.params, &first.namespace, &first.name)
        });
        let older = format!("{}/{}", first.namespace, first.name);
        for (k, &i) in claimants.iter().enumerate() {
            let why = if foreign {
                format!(
                    "Service {svc_ns}/{svc}, this Gateway's, exists and was not made by this \
                     controller for Gateway {older}; it is left alone: remove it, or rename \
                     the Gateway"
                )
            } else if k > 0 {
                format!(
                    "Service {svc_ns}/{svc} is already the Service of the older Gateway \
                     {older}; rename this Gateway"
                )
            } else {
                continue;
            };
            let g = &mut gateways[i];
            g.rejected.get_or_insert_with(|| why.clone());
            g.service_refused = Some(why);
        }
    }
}

/// Allocate container ports for every usable listener.
pub(super) fn allocate(b: &Builder<'_>, gateways: &mut [OwnedGateway]) -> Allocation {
    let requests: Vec<PortRequest> = gateways
        .iter()
        .map(|g| PortRequest {
            namespace: g.namespace.clone(),
            name: g.name.clone(),
            created: routes::meta_key(&g.gateway.metadata).0,
            ports: g
                .listeners
                .iter()
                .filter(|l| g.rejected.is_none() && l.usable())
                .map(|l| l.port)
                .collect(),
        })
        .collect();
    let allocation = addressing::allocate(b.snapshot, b.params, &requests);
    for (g, gw) in gateways.iter_mut().enumerate() {
        for l in gw.listeners.iter_mut().filter(|l| l.usable()) {
            if gw.rejected.is_some() {
                continue;
            }
            l.container_port = allocation[g].get(&l.port).copied().flatten();
        }
    }
    allocation
}

/// A redirect without scheme and port keeps the Gateway listener's port. It is always written
/// out: the dataplane listens on an allocated container port, which is what it would use
/// otherwise. (The dataplane leaves a scheme's well-known port out of `Location`.)
fn fix_redirect_port(route: &mut Route, port: u16) {
    for f in &mut route.filters {
        if let Filter::Redirect(r) = f {
            if r.scheme.is_none() && r.port.is_none() {
                r.port = Some(port);
            }
        }
    }
}

/// An L4 route of a Gateway port: its sort key, the listener it came through, the route.
pub(super) type PortL4Route = (SortKey, usize, L4Route);

fn sort_routes(mut v: Vec<(SortKey, Route)>) -> Vec<Route> {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.into_iter().map(|(_, r)| r).collect()
}

/// One dataplane listener of a Gateway: its programmed listeners sharing a port (and
/// transport). Depends on the Gateway and its listeners only, not on routes.
pub(super) struct Group {
    pub port: u16,
    pub udp: bool,
    /// The Gateway listeners on this port (indices into `OwnedGateway::listeners`).
    pub idx: Vec<usize>,
    pub proto: Proto,
    /// The dataplane listener, without L4 routes.
    pub listener: Listener,
}

impl Group {
    /// Serves HTTP routes (virtual hosts), not L4 routes.
    pub(super) fn is_http(&self) -> bool {
        matches!(self.proto, Proto::Http | Proto::Https)
    }
}

/// The dataplane listeners of one Gateway and the ports of its Service.
pub(super) struct GatewayLayout {
    pub groups: Vec<Group>,
    pub service_ports: Vec<ServicePort>,
}

/// The dataplane listeners of every Gateway (in Gateway order), before routes are placed.
pub(super) fn layout(b: &Builder<'_>, gateways: &[OwnedGateway]) -> Vec<GatewayLayout> {
    gateways.iter().map(|gw| gw_layout(b, gw)).collect()
}

fn gw_layout(b: &Builder<'_>, gw: &OwnedGateway) -> GatewayLayout {
    let prefix = format!("gw/{}/{}", gw.namespace, gw.name);
    // Programmed listeners by (port, udp).
    let mut groups: BTreeMap<(u16, bool), Vec<usize>> = BTreeMap::new();
    for (i, l) in gw.listeners.iter().enumerate() {
        if let (true, Some(p)) = (l.programmed(), l.protocol) {
            groups.entry((l.port, p.is_udp())).or_default().push(i);
        }
    }
    let udp_ports: BTreeSet<u16> = groups.keys().filter(|k| k.1).map(|k| k.0).collect();
    let mut service_ports = Vec::new();
    let mut out = Vec::new();
    for ((port, udp), idx) in groups {
        let first = &gw.listeners[idx[0]];
        let (Some(proto), Some(cport)) = (first.protocol, first.container_port) else {
            continue;
        };
        // TLS listeners on one port share a dataplane listener: `tls` (per-route
        // passthrough or terminate) when one of them terminates, else `tls_passthrough`.
        let terminating: Vec<usize> = idx
            .iter()
            .copied()
            .filter(|&i| gw.listeners[i].protocol == Some(Proto::TlsTerminate))
            .collect();
        let proto = match proto {
            p if p.is_tls_route() && !terminating.is_empty() => Proto::TlsTerminate,
            p if p.is_tls_route() => Proto::TlsPassthrough,
            p => p,
        };
        let name = if udp {
            format!("{prefix}/{port}/udp")
        } else {
            format!("{prefix}/{port}")
        };
        let transport = if udp { "UDP" } else { "TCP" };
        service_ports.push(ServicePort {
            name: format!("{}-{port}", transport.to_lowercase()),
            protocol: transport.into(),
            port,
            target_port: cport,
        });
        let mut listener = Listener {
            name,
            address: b.params.listen_address.clone(),
            port: cport,
            protocol: match proto {
                Proto::Http => ListenerProtocol::Http,
                Proto::Https => ListenerProtocol::Https,
                Proto::TlsPassthrough => ListenerProtocol::TlsPassthrough,
                Proto::TlsTerminate => ListenerProtocol::Tls,
                Proto::Tcp => ListenerProtocol::Tcp,
                Proto::Udp => ListenerProtocol::Udp,
            },
            tls: None,
            http3: true,
            max_requests_in_flight: None,
            // Clients reach the Gateway on its listener port, not the container port;
            // only HTTPS advertises it (in Alt-Svc).
            advertised_port: (proto == Proto::Https).then_some(port),
            l4_routes: Vec::new(),
        };
        if proto == Proto::Https {
            listener.tls = Some(ListenerTls {
                certificates: idx
                    .iter()
                    .flat_map(|&i| gw.listeners[i].certificates.iter().cloned())
                    .collect(),
                min_version: TlsVersion::Tls12,
                // Per port: the same for every listener of the group.
                client_auth: first.client_auth.clone(),
                // Per listener hostname: SweetySecurityPolicy client certificates.
                host_client_auth: idx
                    .iter()
                    .filter_map(|i| gw.client_certs.get(i)?.entry.clone().ok())
                    .collect(),
            });
            listener.http3 = gw.http3 && !udp_ports.contains(&port);
            if listener.http3 {
                service_ports.push(ServicePort {
                    name: format!("udp-{port}"),
                    protocol: "UDP".into(),
                    port,
                    target_port: cport,
                });
            }
        }
        if proto == Proto::TlsTerminate {
            listener.tls = Some(ListenerTls {
                certificates: terminating
                    .iter()
                    .flat_map(|&i| gw.listeners[i].certificates.iter().cloned())
                    .collect(),
                min_version: TlsVersion::Tls12,
                // Gateway spec.tls.frontend covers HTTPS listeners only.
                client_auth: None,
                host_client_auth: Vec::new(),
            });
        }
        out.push(Group {
            port,
            udp,
            idx,
            proto,
            listener,
        });
    }
    GatewayLayout {
        groups: out,
        service_ports,
    }
}

/// Where an HTTP route entry of an HTTP group is served: (hostname, "" for any; the route
/// with the port filled into redirects), one per hostname its listener does not lose to a
/// more specific listener on the same port.
pub(super) fn place_http(
    gw: &OwnedGateway,
    group: &Group,
    hostnames: &[String],
    listener: usize,
    mut route: Route,
) -> Vec<(String, Route)> {
    fix_redirect_port(&mut route, group.port);
    let any = [String::new()];
    let hosts = if hostnames.is_empty() {
        &any[..]
    } else {
        hostnames
    };
    // A request for `h` is served by the most specific listener on this port; routes reach
    // it only through that listener.
    let served: Vec<&String> = hosts
        .iter()
        .filter(|h| {
            let own = attach::specificity(gw.listeners[listener].hostname.as_deref(), h);
            h.is_empty()
                || !group
                    .idx
                    .iter()
                    .any(|&o| attach::specificity(gw.listeners[o].hostname.as_deref(), h) > own)
        })
        .collect();
    let mut out = Vec::with_capacity(served.len());
    if let Some((last, rest)) = served.split_last() {
        for h in rest {
            out.push(((*h).clone(), route.clone()));
        }
        out.push(((*last).clone(), route));
    }
    out
}

/// The name of the virtual host of `host` ("" for any) in `group`.
pub(super) fn virtual_host_name(group: &Group, host: &str) -> String {
    let host = if host.is_empty() { "*" } else { host };
    format!("{}/{host}", group.listener.name)
}

/// The virtual host of one hostname ("" for any) of an HTTP group; `routes` in order.
pub(super) fn virtual_host(group: &Group, host: String, routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        name: virtual_host_name(group, &host),
        hostnames: if host.is_empty() { vec![] } else { vec![host] },
        listeners: vec![group.listener.name.clone()],
        routes,
    }
}

/// The dataplane listener of an L4 group with its routes (`routes` in collection order).
/// A group without a route left (none attached yet, or every backend of every rule
/// unresolved) still gets its listener, without routes: the listener is programmed in
/// status and its Service forwards to the port, so the dataplane must accept there and close
/// the connection, as for a connection no route matches. Leaving the port closed made clients
/// see "connection refused" (a RST from the Pod, once kube-proxy forwards straight to it)
/// where the Gateway API wants an accepted and then closed connection.
pub(super) fn l4_listener(
    gw: &OwnedGateway,
    group: &Group,
    mut routes: Vec<PortL4Route>,
) -> Listener {
    let mut listener = group.listener.clone();
    routes.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, li, mut r) in routes {
        // As for HTTP: a name is served through the most specific listener on the port, so
        // a copy of the route reached through a less specific one (e.g. Passthrough
        // `*.example.com` beside Terminate `a.example.com`) does not take it.
        if !r.hostnames.is_empty() {
            let own = gw.listeners[li].hostname.as_deref();
            r.hostnames.retain(|h| {
                let mine = attach::specificity(own, h);
                !group
                    .idx
                    .iter()
                    .any(|&o| attach::specificity(gw.listeners[o].hostname.as_deref(), h) > mine)
            });
            if r.hostnames.is_empty() {
                continue;
            }
        }
        listener.l4_routes.push(r);
    }
    unique_l4_names(&mut listener.l4_routes);
    listener
}

/// An L4 entry as its group keeps it: reached through a Terminate listener, the dataplane
/// terminates TLS for it.
pub(super) fn l4_entry(gw: &OwnedGateway, e: L4Entry) -> PortL4Route {
    let l = &gw.listeners[e.listener];
    let mut route = e.route;
    route.terminate = l.protocol == Some(Proto::TlsTerminate);
    (e.key, e.listener, route)
}

/// The group (index into `GatewayLayout::groups`) an entry through `listener` lands in.
pub(super) fn group_of(
    gw: &OwnedGateway,
    layout: &GatewayLayout,
    listener: usize,
) -> Option<usize> {
    let l = &gw.listeners[listener];
    let udp = l.protocol.is_some_and(Proto::is_udp);
    layout
        .groups
        .iter()
        .position(|g| g.port == l.port && g.udp == udp)
}

/// Emit dataplane listeners, virtual hosts, Services and Gateway statuses.
pub(super) fn emit(
    b: &mut Builder<'_>,
    gateways: &[OwnedGateway],
    _alloc: &Allocation,
    out: Collected,
) {
    let layout = layout(b, gateways);
    let mut http: BTreeMap<(usize, u16), Vec<HttpEntry>> = BTreeMap::new();
    // Backends replaced by a client-certificate variant somewhere (maybe unused afterwards).
    let mut replaced = BTreeSet::new();
    for mut e in out.http {
        if let Ok(Some(cc)) = &gateways[e.gw].backend_client_cert {
            replaced.extend(client_cert::apply(&mut b.backends, &mut e.route, cc));
        }
        let port = gateways[e.gw].listeners[e.listener].port;
        http.entry((e.gw, port)).or_default().push(e);
    }
    let mut l4: BTreeMap<(usize, u16, bool), Vec<PortL4Route>> = BTreeMap::new();
    for e in out.l4 {
        let l = &gateways[e.gw].listeners[e.listener];
        let key = (e.gw, l.port, l.protocol.is_some_and(Proto::is_udp));
        l4.entry(key)
            .or_default()
            .push(l4_entry(&gateways[e.gw], e));
    }
    for ((g, gw), lay) in gateways.iter().enumerate().zip(layout) {
        for group in &lay.groups {
            if group.is_http() {
                let mut by_host: BTreeMap<String, Vec<(SortKey, Route)>> = BTreeMap::new();
                for e in http.remove(&(g, group.port)).unwrap_or_default() {
                    for (h, route) in place_http(gw, group, &e.hostnames, e.listener, e.route) {
                        let list = by_host.entry(h).or_default();
                        // The same rule reached through two listeners on this port once.
                        if !list.iter().any(|(k, _)| *k == e.key) {
                            list.push((e.key.clone(), route));
                        }
                    }
                }
                for (host, routes) in by_host {
                    b.virtual_hosts
                        .push(virtual_host(group, host, sort_routes(routes)));
                }
                b.listeners.push(group.listener.clone());
            } else {
                let routes = l4.remove(&(g, group.port, group.udp)).unwrap_or_default();
                b.listeners.push(l4_listener(gw, group, routes));
            }
        }
        status(b, gw);
        b.gateway_services
            .extend(service(gw, lay.service_ports, b.params));
    }
    client_cert::drop_unused(b, &replaced);
}

/// A rule reached through two listeners on one port (e.g. a TLSRoute attached to a
/// passthrough and a terminating listener) appears twice; later copies get a numbered name,
/// as route names must be unique within a dataplane listener.
fn unique_l4_names(routes: &mut [L4Route]) {
    let mut seen = BTreeSet::new();
    for r in routes.iter_mut() {
        if !seen.insert(r.name.clone()) {
            let mut n = 2;
            while seen.contains(&format!("{}#{n}", r.name)) {
                n += 1;
            }
            r.name = format!("{}#{n}", r.name);
            seen.insert(r.name.clone());
        }
    }
}

/// Gateway `spec.addresses`: the supported ones as (type, value), and why one is not.
type Requested = (Vec<(String, String)>, Option<String>);

fn requested_addresses(gw: &sweety_gateway_api::gateways::Gateway) -> Requested {
    let mut requested = Vec::new();
    let mut bad = None;
    for a in gw.spec.addresses.iter().flatten() {
        let t = a.r#type.clone().unwrap_or_else(|| "IPAddress".into());
        let v = a.value.clone().unwrap_or_default();
        match t.as_str() {
            // An IPAddress without a value asks for any address: the Service's, as without one.
            "IPAddress" if v.is_empty() => {}
            "IPAddress" if v.parse::<std::net::IpAddr>().is_ok() => requested.push((t, v)),
            "Hostname" if !v.is_empty() => requested.push((t, v)),
            _ => bad = Some(format!("address {v:?} of type {t} is not supported")),
        }
    }
    (requested, bad)
}

/// Gateway `spec.infrastructure.parametersRef`: this implementation has no per-Gateway
/// parameters kind, so any reference is one to an unsupported kind.
fn invalid_parameters(gw: &sweety_gateway_api::gateways::Gateway) -> Option<String> {
    let p = gw.spec.infrastructure.as_ref()?.parameters_ref.as_ref()?;
    Some(format!(
        "infrastructure.parametersRef {}.{} {:?}: sweety has no per-Gateway parameters kind",
        p.kind, p.group, p.name
    ))
}

/// The Service the controller owns for the Gateway, when it has `ports`.
pub(super) fn service(
    gw: &OwnedGateway,
    ports: Vec<ServicePort>,
    params: &Params,
) -> Option<GatewayService> {
    if ports.is_empty() {
        return None;
    }
    let (requested, _) = requested_addresses(&gw.gateway);
    // Gateway `spec.infrastructure` labels and annotations go on the Service we create.
    let infra = gw.gateway.spec.infrastructure.as_ref();
    let mut ports = ports;
    ports.sort();
    Some(GatewayService {
        gateway_namespace: gw.namespace.clone(),
        gateway_name: gw.name.clone(),
        namespace: params.gateway_service_namespace(&gw.namespace).to_string(),
        name: addressing::service_name(&gw.namespace, &gw.name),
        service_type: gw
            .class
            .service_type
            .clone()
            .unwrap_or_else(|| params.gateway_service_type.clone()),
        external_traffic_policy: gw.class.external_traffic_policy.clone(),
        owner: gw.class.owner.clone(),
        ports,
        requested_addresses: requested
            .into_iter()
            .filter(|(t, _)| t == "IPAddress")
            .map(|(_, v)| v)
            .collect(),
        labels: infra.and_then(|i| i.labels.clone()).unwrap_or_default(),
        annotations: infra
            .and_then(|i| i.annotations.clone())
            .unwrap_or_default(),
    })
}

/// The Gateway's status (and its ListenerSets').
pub(super) fn status(b: &mut Builder<'_>, gw: &OwnedGateway) {
    let generation = gw.generation;
    let service = addressing::service_name(&gw.namespace, &gw.name);
    let service_namespace = b.params.gateway_service_namespace(&gw.namespace);
    let (requested, bad_address) = requested_addresses(&gw.gateway);
    // A refused Gateway's Service (if any) is not its own: nothing of it is reported.
    let addresses = if gw.service_refused.is_some() {
        Vec::new()
    } else {
        addressing::addresses(b.snapshot, service_namespace, &requested, &service)
    };
    // The Gateway's own listeners; ListenerSet listeners report in their set's status.
    let own: Vec<&listeners::ValidatedListener> =
        gw.listeners.iter().filter(|l| l.owner.is_none()).collect();
    let listeners: Vec<_> = own
        .iter()
        .map(|l| l.status(generation, gw.rejected.is_some()))
        .collect();
    let invalid: Vec<&str> = own
        .iter()
        .filter(|l| !l.programmed())
        .map(|l| l.name.as_str())
        .collect();
    let any_programmed = gw.listeners.iter().any(|l| l.programmed());
    let bad_parameters = invalid_parameters(&gw.gateway);
    let accepted = if let Some(msg) = &bad_parameters {
        Condition::new(
            "Accepted",
            false,
            "InvalidParameters",
            msg.clone(),
            generation,
        )
    } else if let Some(msg) = &bad_address {
        Condition::new(
            "Accepted",
            false,
            "UnsupportedAddress",
            msg.clone(),
            generation,
        )
    } else if let Some(msg) = &gw.service_refused {
        Condition::new(
            "Accepted",
            false,
            "ServiceNameTaken",
            msg.clone(),
            generation,
        )
    } else if invalid.is_empty() {
        Condition::new("Accepted", true, "Accepted", "gateway accepted", generation)
    } else {
        let msg = format!("invalid listeners: {}", invalid.join(", "));
        let some_valid = invalid.len() < own.len();
        Condition::new("Accepted", some_valid, "ListenersNotValid", msg, generation)
    };
    let static_ips: Vec<&str> = requested
        .iter()
        .filter(|(t, _)| t == "IPAddress")
        .map(|(_, v)| v.as_str())
        .collect();
    let unusable = match static_ips.as_slice() {
        [] => None,
        // The Service asks its load balancer for the one address.
        [_] if gw.service_refused.is_none() => {
            addressing::address_unusable(b.snapshot, service_namespace, &service)
        }
        [_] => None,
        many => Some(format!(
            "a Gateway's Service gets one load-balancer address; {} IP addresses were requested",
            many.len()
        )),
    };
    let programmed = if let Some(msg) = gw
        .service_refused
        .as_ref()
        .filter(|_| bad_address.is_none() && bad_parameters.is_none())
    {
        Condition::new("Programmed", false, "Invalid", msg.clone(), generation)
    } else if bad_address.is_some() || bad_parameters.is_some() || !any_programmed {
        Condition::new(
            "Programmed",
            false,
            "Invalid",
            "no listener could be programmed",
            generation,
        )
    } else if let Some(why) = unusable {
        Condition::new("Programmed", false, "AddressNotUsable", why, generation)
    } else if addresses.is_empty()
        || static_ips
            .iter()
            .any(|ip| !addresses.iter().any(|a| a.value == *ip))
    {
        Condition::new(
            "Programmed",
            false,
            "AddressNotAssigned",
            match static_ips.first() {
                None => format!("Service {service_namespace}/{service} has no address yet"),
                Some(ip) => format!(
                    "Service {service_namespace}/{service} has not been given the requested address {ip} yet"
                ),
            },
            generation,
        )
    } else {
        Condition::new(
            "Programmed",
            true,
            "Programmed",
            "gateway programmed",
            generation,
        )
    };
    // Gateway-level references (the backend client certificate), summarising the listeners'.
    let unresolved_listeners: Vec<&str> = own
        .iter()
        .filter(|l| l.unresolved.is_some() || l.ca_problem.is_some())
        .map(|l| l.name.as_str())
        .collect();
    let resolved = match &gw.backend_client_cert {
        Err((reason, msg)) => {
            Condition::new("ResolvedRefs", false, reason, msg.clone(), generation)
        }
        Ok(_) if !unresolved_listeners.is_empty() => Condition::new(
            "ResolvedRefs",
            false,
            "ListenersNotResolved",
            format!(
                "listeners with unresolved references: {}",
                unresolved_listeners.join(", ")
            ),
            generation,
        ),
        Ok(_) => Condition::new(
            "ResolvedRefs",
            true,
            "ResolvedRefs",
            "all references resolved",
            generation,
        ),
    };
    let mut conditions = vec![accepted, programmed, resolved];
    let insecure: BTreeSet<u16> = gw
        .listeners
        .iter()
        .filter(|l| l.protocol == Some(Proto::Https))
        .map(|l| l.port)
        .filter(|&p| frontend::insecure_fallback(&gw.gateway, p))
        .collect();
    if !insecure.is_empty() {
        let ports: Vec<String> = insecure.iter().map(u16::to_string).collect();
        conditions.push(Condition::new(
            "InsecureFrontendValidationMode",
            true,
            "ConfigurationChanged",
            format!(
                "client certificate validation on port(s) {} is AllowInsecureFallback: clients without a valid certificate are served",
                ports.join(", ")
            ),
            generation,
        ));
    }
    b.status(
        ObjectKey::new("Gateway", &gw.namespace, &gw.name),
        ObjectStatus::Gateway(GatewayStatus {
            addresses,
            conditions,
            listeners,
            attached_listener_sets: (0..gw.listener_sets.len())
                .filter(|&i| gw.listener_sets[i].accepted(&gw.listeners, i))
                .count() as i32,
        }),
    );
    listenersets::statuses(b, &gw.listener_sets, &gw.listeners, gw.rejected.is_some());
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::{Action, FixedResponse, Redirect, Timeouts};

    fn route(redirect: Redirect) -> Route {
        Route {
            name: "r".into(),
            matches: Vec::new(),
            filters: vec![Filter::Redirect(redirect)],
            action: Action::Fixed(FixedResponse {
                status: 500,
                body: String::new(),
                content_type: None,
            }),
            timeouts: Timeouts::default(),
            retry: None,
            max_request_body_bytes: None,
        }
    }

    fn port(r: &Route) -> Option<u16> {
        match &r.filters[0] {
            Filter::Redirect(r) => r.port,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_service_name_collision_refuses_the_later_gateway() {
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sweety, generation: 1}
spec: {controllerName: sweety.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: a, namespace: early, creationTimestamp: "2024-06-01T00:00:00Z"}
spec: {gatewayClassName: sweety, listeners: [{name: http, port: 80, protocol: HTTP}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: z, namespace: zz, creationTimestamp: "2024-01-01T00:00:00Z"}
spec: {gatewayClassName: sweety, listeners: [{name: http, port: 80, protocol: HTTP}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: y, namespace: zz, creationTimestamp: "2024-01-01T00:00:00Z"}
spec: {gatewayClassName: sweety, listeners: [{name: http, port: 80, protocol: HTTP}]}
"#,
        )
        .unwrap();
        let params = Params::default();
        let mut b = Builder::new(&snapshot, &params);
        let classes = super::super::classes::translate(&mut b);
        let mut gws = gateways(&mut b, &classes);
        assert!(
            gws.iter().all(|g| g.service_refused.is_none()),
            "real names do not collide"
        );
        // Force a collision: the oldest (zz/y: same time as zz/z, then by name) keeps it.
        refuse_service_conflicts(&b, &mut gws, &|_, _| "sweety-gw-same".into());
        let refused: Vec<_> = gws
            .iter()
            .map(|g| {
                (
                    g.namespace.as_str(),
                    g.name.as_str(),
                    g.service_refused.clone(),
                )
            })
            .collect();
        assert_eq!(refused[0].2.as_deref(), Some("Service sweety/sweety-gw-same is already the Service of the older Gateway zz/y; rename this Gateway"));
        assert_eq!((refused[1].1, &refused[1].2), ("y", &None));
        assert!(refused[2]
            .2
            .as_deref()
            .unwrap()
            .contains("older Gateway zz/y"));
        assert!(gws[0].rejected.is_some() && gws[1].rejected.is_none());
        // Its status says why; the winner's does not.
        allocate(&b, &mut gws);
        status(&mut b, &gws[0]);
        status(&mut b, &gws[1]);
        let cond = |name: &str| {
            let key = ObjectKey::new("Gateway", if name == "a" { "early" } else { "zz" }, name);
            match b.statuses.get(&key) {
                Some(ObjectStatus::Gateway(g)) => g.conditions[0].clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            (cond("a").status.as_str(), cond("a").reason.as_str()),
            ("False", "ServiceNameTaken")
        );
        assert_eq!(cond("y").status, "True");
    }

    #[test]
    fn redirect_keeps_the_listener_port_only_without_scheme_and_port() {
        let mut r = route(Redirect::default());
        fix_redirect_port(&mut r, 8080);
        assert_eq!(port(&r), Some(8080));
        // Written out even when it is the scheme's default: the dataplane's own port is the
        // allocated container port, not the Gateway listener's.
        let mut r = route(Redirect::default());
        fix_redirect_port(&mut r, 80);
        assert_eq!(port(&r), Some(80));
        let mut r = route(Redirect::default());
        fix_redirect_port(&mut r, 443);
        assert_eq!(port(&r), Some(443));
        let mut r = route(Redirect {
            scheme: Some("https".into()),
            ..Redirect::default()
        });
        fix_redirect_port(&mut r, 8080);
        assert_eq!(port(&r), None, "a scheme implies its well-known port");
        let mut r = route(Redirect {
            port: Some(9000),
            ..Redirect::default()
        });
        fix_redirect_port(&mut r, 8080);
        assert_eq!(port(&r), Some(9000));
    }
}
