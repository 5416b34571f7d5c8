//! Per-connection and per-request context handed through the pipeline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// The client-facing protocol of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// HTTP/1.0 or HTTP/1.1.
    Http1,
    /// HTTP/2 (over TLS or h2c).
    Http2,
    /// HTTP/3 over QUIC.
    Http3,
}

impl Protocol {
    /// Label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "HTTP/1.1",
            Protocol::Http2 => "HTTP/2",
            Protocol::Http3 => "HTTP/3",
        }
    }
}

/// `addr` with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack socket
/// reports for an IPv4 client) turned into the plain IPv4 address, so one client has one
/// address everywhere: rate-limit and hash keys, access lists, logs and forwarding headers.
pub fn canonical_addr(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// Facts about the connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Listener name from the config.
    pub listener: Arc<str>,
    /// Client address.
    pub peer: SocketAddr,
    /// Local address the client connected to.
    pub local: SocketAddr,
    /// True when TLS (or QUIC) was terminated here.
    pub tls: bool,
    /// SNI server name sent in the handshake, lower-cased.
    pub sni: Option<Arc<str>>,
    /// The client certificate chain the TLS handshake got (leaf first): asked for only by a
    /// listener's `client_auth` or for an SNI under its `host_client_auth`
    /// ([`crate::client_cert`]).
    pub client_cert: Option<crate::client_cert::PeerChain>,
    /// The verdict on `client_cert`, made at the first request of a host that checks it.
    pub client_cert_verdict: crate::client_cert::VerdictCache,
    /// Negotiated TLS version (`TLSv1.2`, `TLSv1.3`), for the access log.
    pub tls_version: Option<&'static str>,
    /// Negotiated cipher suite (rustls' name, e.g. `TLS13_AES_128_GCM_SHA256`), when known.
    pub tls_cipher: Option<&'static str>,
    /// The file bytes this connection may hold read ahead of its client, all its requests
    /// together (`limits.static_read_ahead`); `None`: unbounded (internal requests).
    pub read_budget: Option<crate::static_files::ReadBudget>,
    /// The forwarding fields of the connection's last proxied request (as lines for an
    /// HTTP/1.1 backend, as values for an HTTP/2 one), reused by the next one with the same host ([`crate::proxy::forward::ForwardingCache`]); a copy of
    /// this info starts with none.
    pub forwarding: crate::proxy::forward::ForwardingCache,
}

/// Request extension set by the HTTP/3 adapter on a request received in TLS early data
/// (0-RTT), before the handshake completed. Such a request can be replayed by an attacker, so
/// the pipeline serves it only for safe methods and answers anything else 425 Too Early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EarlyData;

/// Whether a request with this method may be served from early data (RFC 8470): the safe
/// methods, which a replay cannot turn into a second side effect.
pub fn early_data_allowed(method: &http::Method) -> bool {
    use http::Method;
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Per-request context.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    /// The connection.
    pub conn: Arc<ConnInfo>,
    /// Protocol of this request.
    pub protocol: Protocol,
    /// When the request head was received.
    pub start: Instant,
    /// Whether the access log is on or the request is traced: the proxy then records what it
    /// did ([`crate::proxy::UpstreamInfo`]); off, nothing is allocated for it.
    pub log: bool,
}

impl RequestCtx {
    /// `https` or `http`, as seen by the client.
    pub fn scheme(&self) -> &'static str {
        if self.conn.tls {
            "https"
        } else {
            "http"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_safe_methods_are_served_from_early_data() {
        for m in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            assert!(early_data_allowed(&m.parse().unwrap()), "{m}");
        }
        for m in ["POST", "PUT", "DELETE", "PATCH", "CONNECT", "PURGE"] {
            assert!(!early_data_allowed(&m.parse().unwrap()), "{m}");
        }
    }
}
