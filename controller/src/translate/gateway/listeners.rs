//! Gateway listeners: protocol support, allowed route kinds, conflicts within a Gateway
//! (HostnameConflict, ProtocolConflict), TLS certificate references (Secrets, with
//! ReferenceGrant for other namespaces) and client certificate validation (`frontend`). The
//! result says, per listener, whether it can be programmed and why not.

use super::attach::{self, AllowedNamespaces};
use super::frontend;
use super::tls_secret::{self, RefError, SecretRef};
use crate::translate::status::{Condition, ListenerStatus, RouteGroupKind};
use crate::translate::Snapshot;
use std::collections::BTreeMap;
use sweety_config::{Certificate, ClientAuth, PemSource};
use sweety_gateway_api::gateways::{Gateway, GatewayListeners, GatewayListenersTlsMode};

/// The Gateway API group.
pub(super) const GROUP: &str = "gateway.networking.k8s.io";

/// Listener protocols this implementation knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Http,
    Https,
    TlsPassthrough,
    /// TLS terminated by the dataplane, the plaintext forwarded to TLSRoute backends.
    TlsTerminate,
    Tcp,
    Udp,
}

impl Proto {
    /// UDP listeners use a UDP socket; everything else TCP.
    pub fn is_udp(self) -> bool {
        self == Proto::Udp
    }
    /// Protocols whose listeners are told apart by hostname on a shared port.
    pub fn uses_hostname(self) -> bool {
        matches!(
            self,
            Proto::Http | Proto::Https | Proto::TlsPassthrough | Proto::TlsTerminate
        )
    }
    /// TLS listeners, passthrough or terminating: both route TLSRoutes by SNI and may share
    /// a port (Gateway API "mixed" mode).
    pub fn is_tls_route(self) -> bool {
        matches!(self, Proto::TlsPassthrough | Proto::TlsTerminate)
    }
    /// Listeners on one port must agree on this (TLS passthrough and terminate mix).
    fn port_family(self) -> Proto {
        if self.is_tls_route() {
            Proto::TlsPassthrough
        } else {
            self
        }
    }
    fn kinds(self) -> &'static [RouteKind] {
        match self {
            Proto::Http | Proto::Https => &[RouteKind::Http, RouteKind::Grpc],
            Proto::TlsPassthrough | Proto::TlsTerminate => &[RouteKind::Tls],
            Proto::Tcp => &[RouteKind::Tcp],
            Proto::Udp => &[RouteKind::Udp],
        }
    }
}

/// Route kinds a listener may accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    Http,
    Grpc,
    Tls,
    Tcp,
    Udp,
}

impl RouteKind {
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tls => "TLSRoute",
            RouteKind::Tcp => "TCPRoute",
            RouteKind::Udp => "UDPRoute",
        }
    }
    pub(super) fn from_name(kind: &str) -> Option<RouteKind> {
        [
            RouteKind::Http,
            RouteKind::Grpc,
            RouteKind::Tls,
            RouteKind::Tcp,
            RouteKind::Udp,
        ]
        .into_iter()
        .find(|k| k.name() == kind)
    }
}

/// A problem: condition reason and message.
pub(super) type Problem = (&'static str, String);

/// One Gateway listener after validation.
#[derive(Clone, Debug)]
pub struct ValidatedListener {
    pub name: String,
    pub port: u16,
    pub protocol: Option<Proto>,
    pub hostname: Option<String>,
    pub kinds: Vec<RouteKind>,
    pub allowed: AllowedNamespaces,
    pub certificates: Vec<Certificate>,
    /// Client certificate validation of the listener's port (HTTPS only).
    pub client_auth: Option<ClientAuth>,
    /// A client CA reference that did not resolve while others did (`ResolvedRefs: False`,
    /// the listener still served with the valid ones).
    pub ca_problem: Option<Problem>,
    /// Why the listener is not accepted (None: accepted).
    pub not_accepted: Option<Problem>,
    /// Conflict reason, if any.
    pub conflicted: Option<Problem>,
    /// Why references did not resolve (None: all resolved).
    pub unresolved: Option<Problem>,
    /// Set by addressing; None when no container port could be allocated.
    pub container_port: Option<u16>,
    /// Routes attached (counted while attaching).
    pub attached: i32,
    /// The ListenerSet (index into `OwnedGateway::listener_sets`) that contributed this listener;
    /// None for the Gateway's own listeners.
    pub owner: Option<usize>,
    /// The namespace of the ListenerSet (for `allowedRoutes` `Same`); None: the Gateway's.
    pub home_ns: Option<String>,
    /// `conflicted` came from listener precedence (a Gateway listener or an older ListenerSet's
    /// won): Accepted and Programmed then carry the conflict reason.
    pub lost_precedence: bool,
}

impl ValidatedListener {
    /// Routes may attach and the dataplane serves it.
    pub fn usable(&self) -> bool {
        self.not_accepted.is_none()
            && self.conflicted.is_none()
            && self.protocol.is_some()
            && !self.kinds.is_empty()
            && !matches!(self.unresolved, Some((r, _)) if r != "InvalidRouteKinds")
    }

    /// Routes may attach (and are counted in `attachedRoutes`): the listener is accepted
    /// (also not left without a container port), not conflicted and allows some route kind,
    /// even when a reference (e.g. its certificate) did not resolve. Only programmed
    /// listeners serve the routes.
    pub fn attachable(&self) -> bool {
        self.not_accepted.is_none()
            && self.conflicted.is_none()
            && self.protocol.is_some()
            && !self.kinds.is_empty()
            && (self.container_port.is_some() || !self.usable())
    }

    /// Usable and given a container port.
    pub fn programmed(&self) -> bool {
        self.usable() && self.container_port.is_some()
    }

    /// The listener's status block. `gateway_rejected`: the Gateway as a whole is not
    /// accepted, so nothing of it is programmed.
    pub fn status(&self, generation: i64, gateway_rejected: bool) -> ListenerStatus {
        let no_port = self.usable() && self.container_port.is_none() && !gateway_rejected;
        let accepted = match (&self.not_accepted, &self.conflicted) {
            (Some((r, m)), _) => Condition::new("Accepted", false, r, m.clone(), generation),
            (None, Some((r, m))) if self.lost_precedence => {
                Condition::new("Accepted", false, r, m.clone(), generation)
            }
            // Another listener of this Gateway claims the port in an incompatible way.
            (None, Some((_, m))) => {
                Condition::new("Accepted", false, "PortUnavailable", m.clone(), generation)
            }
            (None, None) if no_port => Condition::new(
                "Accepted",
                false,
                "PortUnavailable",
                "no free dataplane port in the gateway port range",
                generation,
            ),
            (None, None) => Condition::new(
                "Accepted",
                true,
                "Accepted",
                "listener accepted",
                generation,
            ),
        };
        let conflicted = match &self.conflicted {
            None => Condition::new(
                "Conflicted",
                false,
                "NoConflicts",
                "no conflicts",
                generation,
            ),
            Some((r, m)) => Condition::new("Conflicted", true, r, m.clone(), generation),
        };
        let resolved = match self.unresolved.as_ref().or(self.ca_problem.as_ref()) {
            None => Condition::new(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "all references resolved",
                generation,
            ),
            Some((r, m)) => Condition::new("ResolvedRefs", false, r, m.clone(), generation),
        };
        let programmed = if self.programmed() {
            Condition::new(
                "Programmed",
                true,
                "Programmed",
                "listener programmed",
                generation,
            )
        } else if let (true, Some((r, m))) = (self.lost_precedence, &self.conflicted) {
            Condition::new("Programmed", false, r, m.clone(), generation)
        } else {
            let why = if gateway_rejected {
                "the Gateway is not accepted"
            } else if self.usable() {
                "no dataplane port available in the gateway port range"
            } else {
                "listener is not valid"
            };
            Condition::new("Programmed", false, "Invalid", why, generation)
        };
        ListenerStatus {
            name: self.name.clone(),
            supported_kinds: self
                .kinds
                .iter()
                .map(|k| RouteGroupKind {
                    group: GROUP.into(),
                    kind: k.name().into(),
                })
                .collect(),
            attached_routes: self.attached,
            conditions: vec![accepted, conflicted, resolved, programmed],
        }
    }
}

/// Validate every listener of a Gateway, including conflicts between them. `frontends`
/// starts empty for each Gateway and goes on to [`validate_set`] for its ListenerSets.
pub(super) fn validate(
    snapshot: &Snapshot,
    gw: &Gateway,
    frontends: &mut Frontends,
) -> Vec<ValidatedListener> {
    let ns = gw.metadata.namespace.as_deref().unwrap_or_default();
    let mut out: Vec<ValidatedListener> = gw
        .spec
        .listeners
        .iter()
        .map(|l| listener(snapshot, ns, l, "Gateway"))
        .collect();
    apply_frontend(snapshot, gw, ns, &mut out, frontends);
    conflicts(&mut out);
    out
}

/// Validate the listeners of a ListenerSet (namespace `ls_ns`) attached to `gw` (namespace
/// `gw_ns`): certificates resolve from the ListenerSet's namespace (ReferenceGrants from
/// ListenerSets), client certificate validation comes from the Gateway's port settings.
/// Conflicts with the listeners before them are settled by [`precedence_conflict`].
pub(super) fn validate_set(
    snapshot: &Snapshot,
    gw: &Gateway,
    gw_ns: &str,
    ls_ns: &str,
    listeners: &[GatewayListeners],
    frontends: &mut Frontends,
) -> Vec<ValidatedListener> {
    let mut out: Vec<ValidatedListener> = listeners
        .iter()
        .map(|l| listener(snapshot, ls_ns, l, "ListenerSet"))
        .collect();
    apply_frontend(snapshot, gw, gw_ns, &mut out, frontends);
    out
}

/// Marks `new` conflicted when an earlier listener (`before`, in precedence order) that is
/// accepted and not conflicted claims its port in an incompatible way: another protocol
/// (ProtocolConflict), or the same hostname (HostnameConflict; on TCP/UDP any listener).
pub(super) fn precedence_conflict(before: &[ValidatedListener], new: &mut ValidatedListener) {
    let (None, Some(p)) = (&new.not_accepted, new.protocol) else {
        return;
    };
    for e in before {
        let (None, None, Some(ep)) = (&e.not_accepted, &e.conflicted, e.protocol) else {
            continue;
        };
        if e.port != new.port || ep.is_udp() != p.is_udp() {
            continue;
        }
        let problem = if ep.port_family() != p.port_family() {
            (
                "ProtocolConflict",
                format!(
                    "listener {} already uses port {} with another protocol",
                    e.name, e.port
                ),
            )
        } else if !p.uses_hostname() || e.hostname == new.hostname {
            (
                "HostnameConflict",
                format!(
                    "listener {} already uses port {} and hostname {}",
                    e.name,
                    e.port,
                    e.hostname.as_deref().unwrap_or("(none)")
                ),
            )
        } else {
            continue;
        };
        new.conflicted = Some(problem);
        new.lost_precedence = true;
        return;
    }
}

/// The client certificate validation (`spec.tls.frontend`) of one Gateway's HTTPS ports,
/// each port resolved once (its CA bundles read and checked) and shared by the Gateway's own
/// listeners and those of every ListenerSet attached to it.
pub(super) struct Frontends {
    by_port: BTreeMap<u16, frontend::Frontend>,
}

impl Frontends {
    pub(super) fn new() -> Self {
        Frontends {
            by_port: BTreeMap::new(),
        }
    }

    /// The validation of `port` of `gw` (namespace `ns`; always the same Gateway).
    fn port(
        &mut self,
        snapshot: &Snapshot,
        gw: &Gateway,
        ns: &str,
        port: u16,
    ) -> &frontend::Frontend {
        self.by_port
            .entry(port)
            .or_insert_with(|| frontend::resolve(snapshot, gw, ns, port))
    }

    /// How many ports were resolved.
    #[cfg(test)]
    pub(super) fn resolved(&self) -> usize {
        self.by_port.len()
    }
}

/// Client certificate validation (the Gateway's `spec.tls.frontend`, per port) for HTTPS
/// listeners.
fn apply_frontend(
    snapshot: &Snapshot,
    gw: &Gateway,
    ns: &str,
    out: &mut [ValidatedListener],
    frontends: &mut Frontends,
) {
    for l in out.iter_mut() {
        if l.protocol != Some(Proto::Https) || l.not_accepted.is_some() {
            continue;
        }
        let f = frontends.port(snapshot, gw, ns, l.port);
        if f.none_valid {
            let (reason, msg) = f.invalid_ref.clone().unwrap_or_default();
            l.not_accepted = Some((
                "NoValidCACertificate",
                format!("no valid client CA certificate for port {}: {msg}", l.port),
            ));
            l.unresolved.get_or_insert((reason, msg));
        } else {
            l.client_auth = f.auth.clone();
            l.ca_problem = f.invalid_ref.clone();
        }
    }
}

/// One listener of a Gateway or ListenerSet (`from_kind`, for ReferenceGrants) in `ns`.
fn listener(
    snapshot: &Snapshot,
    ns: &str,
    l: &GatewayListeners,
    from_kind: &str,
) -> ValidatedListener {
    let mut out = ValidatedListener {
        name: l.name.clone(),
        port: u16::try_from(l.port).unwrap_or(0),
        protocol: None,
        hostname: l.hostname.clone().filter(|h| !h.is_empty()),
        kinds: Vec::new(),
        allowed: attach::allowed_namespaces(l.allowed_routes.as_ref()),
        certificates: Vec::new(),
        client_auth: None,
        ca_problem: None,
        not_accepted: None,
        conflicted: None,
        unresolved: None,
        container_port: None,
        attached: 0,
        owner: None,
        home_ns: None,
        lost_precedence: false,
    };
    if out.port == 0 {
        out.not_accepted = Some(("UnsupportedValue", format!("invalid port {}", l.port)));
        return out;
    }
    let mode = l
        .tls
        .as_ref()
        .and_then(|t| t.mode.clone())
        .unwrap_or(GatewayListenersTlsMode::Terminate);
    let protocol = match (l.protocol.as_str(), mode) {
        ("HTTP", _) => Proto::Http,
        ("HTTPS", GatewayListenersTlsMode::Terminate) => Proto::Https,
        ("TLS", GatewayListenersTlsMode::Passthrough) => Proto::TlsPassthrough,
        ("TLS", GatewayListenersTlsMode::Terminate) => Proto::TlsTerminate,
        ("TCP", _) => Proto::Tcp,
        ("UDP", _) => Proto::Udp,
        ("HTTPS", GatewayListenersTlsMode::Passthrough) => {
            out.not_accepted = Some((
                "UnsupportedValue",
                "HTTPS listeners support only tls.mode Terminate".into(),
            ));
            return out;
        }
        (other, _) => {
            out.not_accepted = Some((
                "UnsupportedProtocol",
                format!("protocol {other:?} is not supported"),
            ));
            return out;
        }
    };
    out.protocol = Some(protocol);
    // Allowed route kinds.
    let requested = l.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref());
    match requested {
        None => out.kinds = protocol.kinds().to_vec(),
        Some(kinds) => {
            let mut invalid = Vec::new();
            for k in kinds {
                let group = k.group.as_deref().unwrap_or(GROUP);
                match RouteKind::from_name(&k.kind) {
                    Some(rk) if group == GROUP && protocol.kinds().contains(&rk) => {
                        if !out.kinds.contains(&rk) {
                            out.kinds.push(rk);
                        }
                    }
                    _ => invalid.push(format!("{}/{}", group, k.kind)),
                }
            }
            if !invalid.is_empty() {
                out.unresolved = Some((
                    "InvalidRouteKinds",
                    format!(
                        "route kinds not supported on a {} listener: {}",
                        l.protocol,
                        invalid.join(", ")
                    ),
                ));
            }
        }
    }
    if matches!(protocol, Proto::Https | Proto::TlsTerminate) {
        if let Some(problem) = certificates(snapshot, ns, l, from_kind, &mut out.certificates) {
            out.unresolved = Some(problem);
            out.certificates.clear();
        }
    }
    out
}

/// Load the listener's certificates; the first problem wins.
fn certificates(
    snapshot: &Snapshot,
    ns: &str,
    l: &GatewayListeners,
    from_kind: &str,
    out: &mut Vec<Certificate>,
) -> Option<Problem> {
    let refs = l
        .tls
        .as_ref()
        .and_then(|t| t.certificate_refs.as_deref())
        .unwrap_or_default();
    if refs.is_empty() {
        return Some((
            "InvalidCertificateRef",
            format!(
                "a {} listener terminating TLS needs at least one certificateRef",
                l.protocol
            ),
        ));
    }
    for r in refs {
        let secret_ns = r.namespace.as_deref().unwrap_or(ns);
        let secret_ref = SecretRef {
            group: r.group.as_deref(),
            kind: r.kind.as_deref(),
            namespace: r.namespace.as_deref(),
            name: &r.name,
        };
        let problem = |e: RefError| {
            e.problem(
                "certificateRef",
                "InvalidCertificateRef",
                secret_ns,
                &r.name,
            )
        };
        let pair = match tls_secret::resolve(snapshot, from_kind, ns, &secret_ref) {
            Ok(p) => p,
            Err(e) => return Some(problem(e)),
        };
        // PEM texts that can be a certificate chain and an unencrypted key.
        let pem_ok = pair.cert.contains("-----BEGIN CERTIFICATE-----")
            && pair.key.contains("PRIVATE KEY-----")
            && !pair.key.contains("BEGIN ENCRYPTED PRIVATE KEY");
        if !pem_ok {
            return Some(problem(RefError::NoKeyPair));
        }
        let (cert, key) = (pair.cert, pair.key);
        let certificate = Certificate {
            hostnames: l
                .hostname
                .iter()
                .filter(|h| !h.is_empty())
                .cloned()
                .collect(),
            cert: PemSource::Pem(cert),
            key: PemSource::Pem(key),
        };
        if let Err(why) = check_certificate(&certificate) {
            return Some((
                "InvalidCertificateRef",
                format!("Secret {secret_ns}/{}: {why}", r.name),
            ));
        }
        out.push(certificate);
    }
    None
}

/// Run sweety-config's own checks on a certificate, so a bad Secret only fails its listener
/// instead of making the whole config invalid.
fn check_certificate(c: &Certificate) -> Result<(), String> {
    let mut cfg = sweety_config::Config::default();
    cfg.listeners.push(sweety_config::Listener {
        name: "check".into(),
        address: "127.0.0.1".into(),
        port: 0,
        protocol: sweety_config::ListenerProtocol::Https,
        tls: Some(sweety_config::ListenerTls {
            certificates: vec![c.clone()],
            min_version: Default::default(),
            client_auth: None,
            host_client_auth: Vec::new(),
        }),
        http3: false,
        max_requests_in_flight: None,
        advertised_port: None,
        l4_routes: Vec::new(),
    });
    cfg.validate_structure().map_err(|e| {
        e.0.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Mark listeners that are not distinct from another one on the same port.
fn conflicts(listeners: &mut [ValidatedListener]) {
    let mut by_port: BTreeMap<(u16, bool), Vec<usize>> = BTreeMap::new();
    for (i, l) in listeners.iter().enumerate() {
        if let (None, Some(p)) = (&l.not_accepted, l.protocol) {
            by_port.entry((l.port, p.is_udp())).or_default().push(i);
        }
    }
    for ((port, _), idx) in by_port {
        let protocols: Vec<Proto> = idx.iter().filter_map(|&i| listeners[i].protocol).collect();
        if protocols
            .iter()
            .any(|p| p.port_family() != protocols[0].port_family())
        {
            for &i in &idx {
                listeners[i].conflicted = Some((
                    "ProtocolConflict",
                    format!("other listeners on port {port} use a different protocol"),
                ));
            }
            continue;
        }
        let mut by_host: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &i in &idx {
            let host = if protocols[0].uses_hostname() {
                listeners[i].hostname.as_deref().unwrap_or("")
            } else {
                ""
            };
            by_host.entry(host).or_default().push(i);
        }
        let conflicted: Vec<(usize, String)> = by_host
            .into_iter()
            .filter(|(_, v)| v.len() > 1)
            .flat_map(|(host, v)| {
                let names: Vec<String> = v.iter().map(|&i| listeners[i].name.clone()).collect();
                let msg = if host.is_empty() {
                    format!(
                        "listeners {} share port {port} without distinct hostnames",
                        names.join(", ")
                    )
                } else {
                    format!(
                        "listeners {} share port {port} and hostname {host}",
                        names.join(", ")
                    )
                };
                v.into_iter().map(move |i| (i, msg.clone()))
            })
            .collect();
        for (i, msg) in conflicted {
            listeners[i].conflicted = Some(("HostnameConflict", msg));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listeners(yaml: &str) -> Vec<ValidatedListener> {
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: app}}\nspec:\n  gatewayClassName: sweety\n  listeners:\n{yaml}"
        );
        let (s, _) = Snapshot::from_yaml(&text).unwrap();
        validate(&s, &s.gateways[0], &mut Frontends::new())
    }

    fn conflict(l: &ValidatedListener) -> Option<&'static str> {
        l.conflicted.as_ref().map(|(r, _)| *r)
    }

    #[test]
    fn conflicts_within_a_gateway() {
        let l = listeners(
            "  - {name: a, port: 80, protocol: HTTP, hostname: a.io}\n  - {name: b, port: 80, protocol: HTTP, hostname: a.io}\n  - {name: c, port: 80, protocol: HTTP}\n  - {name: d, port: 53, protocol: UDP}\n  - {name: e, port: 53, protocol: TCP}\n  - {name: f, port: 9000, protocol: TCP}\n  - {name: g, port: 9000, protocol: TCP}\n  - {name: h, port: 81, protocol: HTTP}\n  - {name: i, port: 81, protocol: TLS, tls: {mode: Passthrough}}\n",
        );
        let got: Vec<_> = l.iter().map(conflict).collect();
        assert_eq!(
            got,
            vec![
                Some("HostnameConflict"),
                Some("HostnameConflict"),
                None,
                None,
                None,
                Some("HostnameConflict"),
                Some("HostnameConflict"),
                Some("ProtocolConflict"),
                Some("ProtocolConflict"),
            ],
            "UDP and TCP on one port are distinct; two TCP listeners on one port are not"
        );
        assert!(l[2].usable() && !l[0].usable());
    }

    #[test]
    fn kinds_default_by_protocol_and_invalid_kinds_reported() {
        let l = listeners(
            "  - {name: a, port: 80, protocol: HTTP}\n  - {name: b, port: 81, protocol: HTTP, allowedRoutes: {kinds: [{kind: TLSRoute}]}}\n  - {name: c, port: 82, protocol: SCTP}\n",
        );
        assert_eq!(l[0].kinds, vec![RouteKind::Http, RouteKind::Grpc]);
        assert!(l[1].kinds.is_empty());
        assert_eq!(l[1].unresolved.as_ref().unwrap().0, "InvalidRouteKinds");
        assert!(!l[1].usable(), "no valid kind left");
        assert_eq!(l[2].not_accepted.as_ref().unwrap().0, "UnsupportedProtocol");
    }

    #[test]
    fn tls_passthrough_and_terminate_share_a_port_by_hostname() {
        let l = listeners(
            "  - {name: t, port: 8883, protocol: TLS, hostname: t.io, tls: {mode: Terminate}}
  - {name: p, port: 8883, protocol: TLS, hostname: p.io, tls: {mode: Passthrough}}
  - {name: q, port: 8883, protocol: TLS, hostname: p.io, tls: {mode: Terminate}}
  - {name: h, port: 8883, protocol: HTTPS, hostname: h.io}
",
        );
        assert_eq!(l[0].protocol, Some(Proto::TlsTerminate));
        assert_eq!(l[0].kinds, vec![RouteKind::Tls]);
        // Terminate and Passthrough mix on one port (told apart by hostname); HTTPS does not.
        let got: Vec<_> = l.iter().map(conflict).collect();
        assert_eq!(
            got,
            vec![
                Some("ProtocolConflict"),
                Some("ProtocolConflict"),
                Some("ProtocolConflict"),
                Some("ProtocolConflict")
            ]
        );
        let l = listeners(
            "  - {name: t, port: 8883, protocol: TLS, hostname: t.io, tls: {mode: Terminate}}
  - {name: p, port: 8883, protocol: TLS, hostname: p.io, tls: {mode: Passthrough}}
  - {name: q, port: 8883, protocol: TLS, hostname: p.io, tls: {mode: Terminate}}
",
        );
        let got: Vec<_> = l.iter().map(conflict).collect();
        assert_eq!(
            got,
            vec![None, Some("HostnameConflict"), Some("HostnameConflict")]
        );
        // Terminating needs a certificate, like HTTPS.
        let (reason, msg) = l[0].unresolved.clone().unwrap();
        assert_eq!(reason, "InvalidCertificateRef");
        assert!(msg.contains("needs at least one certificateRef"), "{msg}");
        assert!(l[1].unresolved.is_none(), "passthrough needs none");
    }

    #[test]
    fn listener_set_listeners_lose_to_earlier_ones() {
        let before = listeners(
            "  - {name: gw, port: 80, protocol: HTTP, hostname: a.io}\n  - {name: tcp, port: 9000, protocol: TCP}\n",
        );
        // Each candidate validated on its own (a ListenerSet's listeners are checked against
        // the ones before them, not by the Gateway's intra-listener rules).
        let mut cand: Vec<ValidatedListener> = [
            "{name: same-host, port: 80, protocol: HTTP, hostname: a.io}",
            "{name: other-host, port: 80, protocol: HTTP, hostname: b.io}",
            "{name: other-proto, port: 80, protocol: TCP}",
            "{name: tcp-again, port: 9000, protocol: TCP}",
            "{name: udp, port: 9000, protocol: UDP}",
        ]
        .iter()
        .map(|l| listeners(&format!("  - {l}\n")).remove(0))
        .collect();
        for c in cand.iter_mut() {
            precedence_conflict(&before, c);
        }
        let got: Vec<_> = cand
            .iter()
            .map(|l| (l.conflicted.as_ref().map(|c| c.0), l.lost_precedence))
            .collect();
        assert_eq!(
            got,
            vec![
                (Some("HostnameConflict"), true),
                (None, false),
                (Some("ProtocolConflict"), true),
                (Some("HostnameConflict"), true),
                (None, false),
            ]
        );
        // The loser reports the conflict reason in Accepted and Programmed.
        let st = cand[0].status(1, false);
        let reason = |t: &str| {
            st.conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        assert_eq!(
            reason("Accepted"),
            Some(("False".into(), "HostnameConflict".into()))
        );
        assert_eq!(
            reason("Programmed"),
            Some(("False".into(), "HostnameConflict".into()))
        );
    }
}
