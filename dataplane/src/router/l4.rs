//! The compiled routes of a layer-4 listener (`tcp`, `udp`, `tls_passthrough`, `tls`): the
//! route for a connection by SNI (exact, longest wildcard, catch-all) or the first route.
//! The passthrough hosts of an `https` listener compile the same way ([`L4Listener::passthrough`]).
//! Pure; served by `listen::l4`.

use crate::tls::SniScopes;
use std::sync::Arc;
use sweety_config::{Listener, ListenerProtocol, WeightedBackend};

/// One compiled layer-4 route.
#[derive(Debug)]
pub struct L4RouteRt {
    /// Route name.
    pub name: Arc<str>,
    /// Terminate TLS here and forward the plaintext (`tls` listeners).
    pub terminate: bool,
    /// Backends by weight.
    pub backends: Vec<WeightedBackend>,
}

/// The layer-4 part of a listener.
#[derive(Debug)]
pub struct L4Listener {
    /// Protocol (`tcp`, `udp`, `tls_passthrough` or `tls`).
    pub protocol: ListenerProtocol,
    /// Routes in config order.
    pub routes: Vec<L4RouteRt>,
    /// Route index by SNI (the same exact / longest-wildcard / catch-all matching as the
    /// certificate scopes of HTTPS listeners).
    by_sni: SniScopes,
}

impl L4Listener {
    /// Compiles the routes of an L4 listener; `None` for HTTP(S) listeners.
    pub fn compile(l: &Listener) -> Option<Arc<L4Listener>> {
        if !l.protocol.is_l4() {
            return None;
        }
        let routes = l
            .l4_routes
            .iter()
            .map(|r| L4RouteRt {
                name: r.name.as_str().into(),
                terminate: r.terminate && l.protocol == ListenerProtocol::Tls,
                backends: r.backends.clone(),
            })
            .collect();
        Some(Arc::new(L4Listener {
            protocol: l.protocol,
            routes,
            by_sni: SniScopes::from_hostnames(l.l4_routes.iter().map(|r| r.hostnames.as_slice())),
        }))
    }

    /// The passthrough hosts of an `https` listener (its `l4_routes`, each naming at least
    /// one host, never terminating); `None` when it has none (or is not `https`), so a
    /// listener without them takes no passthrough step at all.
    pub fn passthrough(l: &Listener) -> Option<Arc<L4Listener>> {
        if l.protocol != ListenerProtocol::Https || l.l4_routes.is_empty() {
            return None;
        }
        let routes = l
            .l4_routes
            .iter()
            .map(|r| L4RouteRt {
                name: r.name.as_str().into(),
                terminate: false,
                backends: r.backends.clone(),
            })
            .collect();
        Some(Arc::new(L4Listener {
            protocol: l.protocol,
            routes,
            by_sni: SniScopes::from_hostnames(l.l4_routes.iter().map(|r| r.hostnames.as_slice())),
        }))
    }

    /// Whether connections start with a ClientHello that picks the route.
    pub fn routes_by_sni(&self) -> bool {
        matches!(
            self.protocol,
            ListenerProtocol::TlsPassthrough | ListenerProtocol::Tls | ListenerProtocol::Https
        )
    }

    /// The route for a connection with this SNI: an exact name first, then the longest
    /// matching wildcard, then a route without hostnames. TCP and UDP listeners use their
    /// first route.
    pub fn route(&self, sni: Option<&str>) -> Option<&L4RouteRt> {
        self.routes.get(self.route_index(sni)?)
    }

    /// The index in `routes` of [`L4Listener::route`]'s answer.
    pub fn route_index(&self, sni: Option<&str>) -> Option<usize> {
        if !self.routes_by_sni() {
            return (!self.routes.is_empty()).then_some(0);
        }
        match sni {
            Some(name) => self.by_sni.scope(name),
            None => self.by_sni.any(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(routes: serde_json::Value) -> Arc<L4Listener> {
        let l: Listener = serde_json::from_value(serde_json::json!({
            "name": "tls", "port": 0, "protocol": "tls_passthrough", "l4_routes": routes,
        }))
        .unwrap();
        L4Listener::compile(&l).unwrap()
    }

    #[test]
    fn sni_routing_precedence() {
        let b = serde_json::json!([{"backend": "x"}]);
        let l = listener(serde_json::json!([
            {"name": "wild", "hostnames": ["*.example.com"], "backends": b},
            {"name": "deep", "hostnames": ["*.api.example.com"], "backends": b},
            {"name": "exact", "hostnames": ["www.example.com"], "backends": b},
            {"name": "any", "backends": b},
        ]));
        let name = |sni: Option<&str>| l.route(sni).map(|r| r.name.to_string());
        assert_eq!(name(Some("www.example.com")).as_deref(), Some("exact"));
        assert_eq!(name(Some("a.example.com")).as_deref(), Some("wild"));
        assert_eq!(name(Some("v1.api.example.com")).as_deref(), Some("deep"));
        assert_eq!(name(Some("example.com")).as_deref(), Some("any"));
        assert_eq!(name(None).as_deref(), Some("any"));
        // An https listener's passthrough hosts: only the names they list, never a catch-all.
        let https: Listener = serde_json::from_value(serde_json::json!({
            "name": "web", "port": 0, "protocol": "https",
            "l4_routes": [{"name": "pt", "hostnames": ["pt.test", "*.wild.test"], "backends": b}],
        }))
        .unwrap();
        assert!(L4Listener::compile(&https).is_none());
        let pt = L4Listener::passthrough(&https).unwrap();
        assert_eq!(pt.route(Some("PT.test")).map(|r| &*r.name), Some("pt"));
        assert_eq!(pt.route(Some("a.wild.test")).map(|r| &*r.name), Some("pt"));
        assert!(pt.route(Some("other.test")).is_none());
        assert!(pt.route(None).is_none());
        assert!(!pt.routes[0].terminate);
        let mut plain = https.clone();
        plain.l4_routes.clear();
        assert!(L4Listener::passthrough(&plain).is_none());
        assert!(L4Listener::passthrough(&{
            let mut t = https.clone();
            t.protocol = ListenerProtocol::TlsPassthrough;
            t
        })
        .is_none());
        let strict = listener(serde_json::json!([
            {"name": "only", "hostnames": ["a.test"], "backends": b},
        ]));
        assert!(strict.route(Some("b.test")).is_none());
        assert!(strict.route(None).is_none());
    }
}
