//! Config types of traffic policy: rate limits and IP access rules (route
//! filters), the real client address (trusted proxies, `X-Forwarded-For` depth, PROXY
//! protocol), session affinity and consistent hashing, active health checks, and layer-4 proxy
//! settings; request path normalisation (`path_normalization`); plus CIDR parsing and the
//! checks `validate` runs on them.
//!
//! Everything here is off by default, except path normalisation, and skipped when serialized at
//! its default, so configs that do not use these features look exactly as before.

use crate::Duration;
use serde::{Deserialize, Serialize};

use crate::model::{default_true, is_false, is_true};

// ------------------------------------------------------------------ rate limits

/// What a rate limit counts requests by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RateLimitKey {
    /// The real client IP (see [`ClientIp`]).
    #[default]
    ClientIp,
    /// The value of this request header; requests without it share one bucket.
    Header(String),
    /// The route: one bucket for every request of the route.
    Route,
}

/// A local token bucket per key: `requests` per `period`, with `burst` extra requests allowed
/// at once. Requests over it get `status` (429 by default) with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// What requests are counted by. Default: the client IP.
    #[serde(default)]
    pub key: RateLimitKey,
    /// Requests allowed per period (the refill rate).
    pub requests: u32,
    /// The period. Default 1s.
    #[serde(default = "default_period")]
    pub period: Duration,
    /// Extra requests allowed in a burst on top of `requests`. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub burst: u32,
    /// Keys tracked at most; the least recently used key is forgotten past it. Default 65536.
    #[serde(default = "default_max_keys")]
    pub max_keys: u32,
    /// Buckets are shared by every rate-limit filter with the same zone name and settings
    /// (for a limit across several routes). Default: one zone per route and filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The status refused requests get, 400-599 (nginx's `limit_req_status`). Default 429.
    #[serde(
        default = "default_limit_status",
        skip_serializing_if = "is_default_limit_status"
    )]
    pub status: u16,
    /// Client networks (`address/prefix`, host bits clear) this limit does not count: their
    /// requests always pass it and take nothing from the buckets (ingress-nginx's
    /// `limit-whitelist`). The real client IP ([`ClientIp`]) is checked, whatever `key` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<String>,
}

/// At most `max` requests in flight per key (ingress-nginx `limit-connections`); more get
/// `status` (429 by default) with `Retry-After: 1`. A key is tracked only while it has requests
/// in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyLimit {
    /// What requests are counted by. Default: the client IP.
    #[serde(default)]
    pub key: RateLimitKey,
    /// Requests in flight per key at most.
    pub max: u32,
    /// Counts are shared by every concurrency-limit filter with the same zone name and key
    /// (a limit across several routes). Default: one zone per route and filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The status refused requests get, 400-599 (nginx's `limit_conn_status`). Default 429.
    #[serde(
        default = "default_limit_status",
        skip_serializing_if = "is_default_limit_status"
    )]
    pub status: u16,
    /// Client networks this limit does not count, as [`RateLimit::exempt`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<String>,
}

/// The status of a request refused by a rate or concurrency limit unless the limit says
/// otherwise: 429 Too Many Requests (nginx answers 503 by default; ingress-nginx's
/// translation sets that explicitly).
pub const DEFAULT_LIMIT_STATUS: u16 = 429;

fn default_limit_status() -> u16 {
    DEFAULT_LIMIT_STATUS
}
fn is_default_limit_status(s: &u16) -> bool {
    *s == DEFAULT_LIMIT_STATUS
}

/// A refusal status a limit may answer: 400-599, as nginx's `limit_req_status` and
/// `limit_conn_status` accept.
pub fn check_limit_status(status: u16) -> Result<(), String> {
    if (400..=599).contains(&status) {
        Ok(())
    } else {
        Err(format!("{status} is not a status from 400 to 599"))
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
fn default_period() -> Duration {
    Duration::from_secs(1)
}
fn default_max_keys() -> u32 {
    65_536
}

/// IP access rules: `deny` is checked first, then, when `allow` is not empty, the client IP
/// must be in it. Denied requests get 403.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpAccess {
    /// CIDRs (or single addresses) allowed; empty allows every address not denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// CIDRs (or single addresses) denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

// ------------------------------------------------------------------ client address

/// How the real client address is found: behind trusted proxies from `X-Forwarded-For`,
/// and from PROXY protocol headers on listeners that expect them. The address found is what
/// access logs, rate limits, IP rules and the forwarding headers use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIp {
    /// Proxies (CIDRs or addresses) trusted to report the client address. Empty: the peer
    /// address is the client and `X-Forwarded-For` is not believed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
    /// At most this many `X-Forwarded-For` entries are walked, from the right, while they
    /// belong to trusted proxies. Default 1.
    #[serde(default = "default_depth", skip_serializing_if = "is_default_depth")]
    pub forwarded_for_depth: u32,
    /// Listeners (by name) that expect a PROXY protocol v1 or v2 header before each
    /// connection's data. With `trusted_proxies` set, headers are only accepted from them
    /// (other peers are served with their own address and may not send a header).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proxy_protocol: Vec<String>,
    /// Time to receive a PROXY protocol header. Default 5s.
    #[serde(
        default = "default_pp_timeout",
        skip_serializing_if = "is_default_pp_timeout"
    )]
    pub proxy_protocol_timeout: Duration,
}

fn default_depth() -> u32 {
    1
}
fn is_default_depth(d: &u32) -> bool {
    *d == 1
}
fn default_pp_timeout() -> Duration {
    Duration::from_secs(5)
}
fn is_default_pp_timeout(d: &Duration) -> bool {
    *d == default_pp_timeout()
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp {
            trusted_proxies: Vec::new(),
            forwarded_for_depth: default_depth(),
            proxy_protocol: Vec::new(),
            proxy_protocol_timeout: default_pp_timeout(),
        }
    }
}

impl ClientIp {
    /// True when everything is at its default (nothing configured).
    pub fn is_default(&self) -> bool {
        *self == ClientIp::default()
    }
}

// ------------------------------------------------------------------ affinity and hashing

/// Where a session token travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    /// A cookie set by Sweety.
    #[default]
    Cookie,
    /// A header: Sweety sets it on the response, the client sends it back.
    Header,
}

/// Session affinity: the first response carries a token naming the endpoint chosen; requests
/// bringing it back go to that endpoint while it is eligible (otherwise a new one is chosen
/// and a new token issued).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionPersistence {
    /// Cookie or header. Default cookie.
    #[serde(default, rename = "type")]
    pub kind: SessionKind,
    /// Cookie or header name. Default `sweety-session`.
    #[serde(default = "default_session_name")]
    pub name: String,
    /// Cookie lifetime (`Max-Age`); none: a session cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// Cookie `Path`. Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Cookie `Secure` attribute.
    #[serde(default, skip_serializing_if = "is_false")]
    pub secure: bool,
    /// Cookie `HttpOnly` attribute. Default on.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub http_only: bool,
    /// Cookie `SameSite` attribute: `Strict`, `Lax` or `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_site: Option<String>,
}

fn default_session_name() -> String {
    "sweety-session".to_string()
}

/// What a consistent hash is computed from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HashOn {
    /// The real client IP.
    ClientIp,
    /// A request header's value (requests without it are balanced normally).
    Header(String),
    /// A cookie's value (requests without it are balanced normally).
    Cookie(String),
}

/// Consistent hashing algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashAlgorithm {
    /// A ring of virtual nodes (ketama style).
    #[default]
    RingHash,
    /// Maglev lookup table.
    Maglev,
}

/// Consistent hashing of requests onto endpoints: the same key goes to the same endpoint
/// while it is eligible, and when an endpoint goes away only its keys move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HashPolicy {
    /// The key.
    pub on: HashOn,
    /// The algorithm. Default `ring_hash`.
    #[serde(default)]
    pub algorithm: HashAlgorithm,
}

// ------------------------------------------------------------------ health checks

/// How a health check probes an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheckKind {
    /// `GET path` over the backend's protocol; passes on an expected status.
    #[default]
    Http,
    /// A TCP connect; passes when it succeeds (for layer-4 backends).
    Tcp,
}

/// Active HTTP health checks of every endpoint of a backend. An endpoint that fails
/// `unhealthy_threshold` checks in a row is skipped until it passes `healthy_threshold` in a
/// row; passive outlier ejection applies on top.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// HTTP (default) or a plain TCP connect.
    #[serde(default, rename = "type")]
    pub kind: HealthCheckKind,
    /// Path requested (GET). Default `/`.
    #[serde(default = "default_hc_path")]
    pub path: String,
    /// `Host` header; default: the endpoint address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Time between checks. Default 5s.
    #[serde(default = "default_hc_interval")]
    pub interval: Duration,
    /// Time a check may take. Default 2s.
    #[serde(default = "default_hc_timeout")]
    pub timeout: Duration,
    /// Passes in a row that mark a down endpoint up. Default 2.
    #[serde(default = "default_hc_healthy")]
    pub healthy_threshold: u32,
    /// Failures in a row that mark an endpoint down. Default 3.
    #[serde(default = "default_hc_unhealthy")]
    pub unhealthy_threshold: u32,
    /// Lowest status counted as a pass. Default 200.
    #[serde(default = "default_hc_min")]
    pub expected_status_min: u16,
    /// Highest status counted as a pass. Default 399.
    #[serde(default = "default_hc_max")]
    pub expected_status_max: u16,
}

fn default_hc_path() -> String {
    "/".to_string()
}
fn default_hc_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_hc_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_hc_healthy() -> u32 {
    2
}
fn default_hc_unhealthy() -> u32 {
    3
}
fn default_hc_min() -> u16 {
    200
}
fn default_hc_max() -> u16 {
    399
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: HealthCheckKind::Http,
            path: default_hc_path(),
            host: None,
            interval: default_hc_interval(),
            timeout: default_hc_timeout(),
            healthy_threshold: default_hc_healthy(),
            unhealthy_threshold: default_hc_unhealthy(),
            expected_status_min: default_hc_min(),
            expected_status_max: default_hc_max(),
        }
    }
}

// ------------------------------------------------------------------ layer 4

/// Settings of the layer-4 listeners (`tcp`, `udp`, `tls_passthrough`). Their connections
/// count against `limits.max_connections` (a UDP session counts as one connection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct L4Settings {
    /// Time to receive a TLS ClientHello on a `tls_passthrough` listener.
    pub peek_timeout: Duration,
    /// Largest ClientHello read to find the SNI, bytes.
    pub max_peek_bytes: u32,
    /// A TCP proxy connection with no data either way for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// A UDP session with no datagram either way for this long is forgotten.
    pub udp_idle_timeout: Duration,
    /// UDP sessions per listener at most; datagrams from new clients past it are dropped.
    pub udp_max_sessions: u32,
}

impl Default for L4Settings {
    fn default() -> Self {
        L4Settings {
            peek_timeout: Duration::from_secs(5),
            max_peek_bytes: 16 * 1024,
            tcp_idle_timeout: Duration::from_secs(3600),
            udp_idle_timeout: Duration::from_secs(60),
            udp_max_sessions: 16_384,
        }
    }
}

impl L4Settings {
    /// True when everything is at its default.
    pub fn is_default(&self) -> bool {
        *self == L4Settings::default()
    }
}

// ------------------------------------------------------------------ CIDRs

/// An IP network: an address and a prefix length (`10.0.0.0/8`, `2001:db8::/32`); a bare
/// address is a single-host network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr/prefix` or a bare address. Host bits set below the prefix are an error
    /// (`10.0.0.1/8` is almost always a typo); [`Cidr::parse_masked`] clears them instead.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let c = Cidr::parse_unmasked(s)?;
        if c.network_bits(c.addr) != bits(c.addr) {
            return Err(format!(
                "{s:?} has host bits set below the /{} prefix",
                c.prefix
            ));
        }
        Ok(c)
    }

    /// Like [`Cidr::parse`], but host bits below the prefix are cleared, as nginx's
    /// `allow`/`deny` do (`10.0.0.1/8` is `10.0.0.0/8`).
    pub fn parse_masked(s: &str) -> Result<Cidr, String> {
        let c = Cidr::parse_unmasked(s)?;
        let net = c.network_bits(c.addr);
        let addr = match c.addr {
            std::net::IpAddr::V4(_) => std::net::IpAddr::V4((net as u32).into()),
            std::net::IpAddr::V6(_) => std::net::IpAddr::V6(net.into()),
        };
        Ok(Cidr {
            addr,
            prefix: c.prefix,
        })
    }

    /// The address and prefix, host bits as written. An IPv4-mapped IPv6 network
    /// (`::ffff:10.0.0.0/104`) is an error: client addresses are compared as IPv4
    /// ([`Cidr::contains`]), so it would match nobody (an allow list silently shut, a deny
    /// list silently open); write it as IPv4.
    fn parse_unmasked(s: &str) -> Result<Cidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("invalid IP address {a:?} in {s:?}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => Some(p.trim())
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("invalid prefix length {p:?} in {s:?} (0..={max})"))?,
        };
        if let std::net::IpAddr::V6(v6) = addr {
            if prefix >= 96 && v6.to_ipv4_mapped().is_some() {
                return Err(format!(
                    "{s:?} is an IPv4-mapped IPv6 network, which matches no client (clients are \
                     compared as IPv4): write it as IPv4"
                ));
            }
        }
        Ok(Cidr { addr, prefix })
    }

    fn network_bits(&self, ip: std::net::IpAddr) -> u128 {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let b = bits(ip);
        if self.prefix == 0 {
            0
        } else {
            let shift = width - u32::from(self.prefix);
            if shift >= 128 {
                0
            } else {
                (b >> shift) << shift
            }
        }
    }

    /// True when `ip` is in this network. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) match
    /// IPv4 networks.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        self.network_bits(ip) == bits(self.addr)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn bits(ip: std::net::IpAddr) -> u128 {
    match ip {
        std::net::IpAddr::V4(v) => u128::from(u32::from(v)),
        std::net::IpAddr::V6(v) => u128::from(v),
    }
}

/// Parses a list of CIDRs, every error as `(index, message)`.
pub fn parse_cidrs(list: &[String]) -> (Vec<Cidr>, Vec<(usize, String)>) {
    let mut ok = Vec::with_capacity(list.len());
    let mut errs = Vec::new();
    for (i, s) in list.iter().enumerate() {
        match Cidr::parse(s) {
            Ok(c) => ok.push(c),
            Err(e) => errs.push((i, e)),
        }
    }
    (ok, errs)
}

/// True when any of `nets` contains `ip`.
pub fn any_contains(nets: &[Cidr], ip: std::net::IpAddr) -> bool {
    nets.iter().any(|n| n.contains(ip))
}

// ------------------------------------------------------------------ checks

/// Problems of one part of the config: `(field path relative to the part, message)`.
pub(crate) type Problems = Vec<(String, String)>;

fn cidr_list(field: &str, list: &[String], out: &mut Problems) {
    for (i, msg) in parse_cidrs(list).1 {
        out.push((format!("{field}[{i}]"), msg));
    }
}

pub(crate) fn check_rate_limit(r: &RateLimit) -> Problems {
    let mut out = Vec::new();
    if let RateLimitKey::Header(h) = &r.key {
        if crate::validate::check_token(h, "token").is_err() {
            out.push(("key.header".into(), format!("invalid header name {h:?}")));
        }
    }
    if r.requests == 0 {
        out.push(("requests".into(), "must be greater than 0".into()));
    }
    if r.period.is_zero() {
        out.push(("period".into(), "must be greater than 0".into()));
    }
    if r.max_keys == 0 {
        out.push(("max_keys".into(), "must be greater than 0".into()));
    }
    if r.zone.as_deref() == Some("") {
        out.push(("zone".into(), "must not be empty when set".into()));
    }
    if let Err(e) = check_limit_status(r.status) {
        out.push(("status".into(), e));
    }
    cidr_list("exempt", &r.exempt, &mut out);
    out
}

pub(crate) fn check_concurrency_limit(c: &ConcurrencyLimit) -> Problems {
    let mut out = Vec::new();
    if let RateLimitKey::Header(h) = &c.key {
        if crate::validate::check_token(h, "token").is_err() {
            out.push(("key.header".into(), format!("invalid header name {h:?}")));
        }
    }
    if c.max == 0 {
        out.push(("max".into(), "must be greater than 0".into()));
    }
    if c.zone.as_deref() == Some("") {
        out.push(("zone".into(), "must not be empty when set".into()));
    }
    if let Err(e) = check_limit_status(c.status) {
        out.push(("status".into(), e));
    }
    cidr_list("exempt", &c.exempt, &mut out);
    out
}

pub(crate) fn check_ip_access(a: &IpAccess) -> Problems {
    let mut out = Vec::new();
    if a.allow.is_empty() && a.deny.is_empty() {
        out.push((
            String::new(),
            "allow or deny must list at least one CIDR".into(),
        ));
    }
    cidr_list("allow", &a.allow, &mut out);
    cidr_list("deny", &a.deny, &mut out);
    out
}

pub(crate) fn check_client_ip(c: &ClientIp, listeners: &[crate::Listener]) -> Problems {
    let mut out = Vec::new();
    cidr_list("trusted_proxies", &c.trusted_proxies, &mut out);
    if c.forwarded_for_depth == 0 || c.forwarded_for_depth > 64 {
        out.push((
            "forwarded_for_depth".into(),
            format!("must be in 1..=64, got {}", c.forwarded_for_depth),
        ));
    }
    for (i, name) in c.proxy_protocol.iter().enumerate() {
        match listeners.iter().find(|l| &l.name == name) {
            None => out.push((
                format!("proxy_protocol[{i}]"),
                format!("unknown listener {name:?}"),
            )),
            Some(l) if l.protocol == crate::ListenerProtocol::Udp => out.push((
                format!("proxy_protocol[{i}]"),
                format!("listener {name:?} is udp; PROXY protocol is for TCP listeners"),
            )),
            Some(_) => {}
        }
    }
    if c.proxy_protocol_timeout.is_zero() {
        out.push((
            "proxy_protocol_timeout".into(),
            "must be greater than 0".into(),
        ));
    }
    out
}

pub(crate) fn check_backend_traffic(b: &crate::Backend) -> Problems {
    let mut out = Vec::new();
    if let Some(s) = &b.session_persistence {
        if crate::validate::check_token(&s.name, "token").is_err() {
            out.push((
                "session_persistence.name".into(),
                format!(
                    "invalid {} name {:?}",
                    if s.kind == SessionKind::Cookie {
                        "cookie"
                    } else {
                        "header"
                    },
                    s.name
                ),
            ));
        }
        if let Some(p) = &s.path {
            if !p.starts_with('/') || p.bytes().any(|c| c < 0x21 || c == b';' || c == 0x7f) {
                out.push((
                    "session_persistence.path".into(),
                    format!("invalid cookie path {p:?}"),
                ));
            }
        }
        if let Some(ss) = &s.same_site {
            if !["Strict", "Lax", "None"].contains(&ss.as_str()) {
                out.push((
                    "session_persistence.same_site".into(),
                    format!("must be Strict, Lax or None, got {ss:?}"),
                ));
            }
        }
        if s.ttl.is_some_and(|t| t.is_zero()) {
            out.push((
                "session_persistence.ttl".into(),
                "must be greater than 0 when set".into(),
            ));
        }
    }
    if let Some(h) = &b.hash {
        match &h.on {
            HashOn::Header(n) | HashOn::Cookie(n)
                if crate::validate::check_token(n, "token").is_err() =>
            {
                out.push(("hash.on".into(), format!("invalid name {n:?}")));
            }
            _ => {}
        }
    }
    if let Some(hc) = &b.health_check {
        if !hc.path.starts_with('/') || hc.path.bytes().any(|c| c <= 0x20 || c == 0x7f) {
            out.push((
                "health_check.path".into(),
                format!("must be an absolute path, got {:?}", hc.path),
            ));
        }
        if let Some(h) = &hc.host {
            if h.is_empty() || h.bytes().any(|c| c <= 0x20 || c == 0x7f) {
                out.push(("health_check.host".into(), format!("invalid host {h:?}")));
            }
        }
        if hc.interval.is_zero() {
            out.push((
                "health_check.interval".into(),
                "must be greater than 0".into(),
            ));
        }
        if hc.timeout.is_zero() {
            out.push((
                "health_check.timeout".into(),
                "must be greater than 0".into(),
            ));
        }
        if hc.healthy_threshold == 0 {
            out.push((
                "health_check.healthy_threshold".into(),
                "must be greater than 0".into(),
            ));
        }
        if hc.unhealthy_threshold == 0 {
            out.push((
                "health_check.unhealthy_threshold".into(),
                "must be greater than 0".into(),
            ));
        }
        let ok = |s: u16| (100..=599).contains(&s);
        if !ok(hc.expected_status_min) {
            out.push((
                "health_check.expected_status_min".into(),
                format!("must be in 100..=599, got {}", hc.expected_status_min),
            ));
        }
        if !ok(hc.expected_status_max) || hc.expected_status_max < hc.expected_status_min {
            out.push((
                "health_check.expected_status_max".into(),
                format!(
                    "must be in expected_status_min..=599, got {}",
                    hc.expected_status_max
                ),
            ));
        }
    }
    out
}

pub(crate) fn check_l4(l: &L4Settings) -> Problems {
    let mut out = Vec::new();
    for (f, zero) in [
        ("peek_timeout", l.peek_timeout.is_zero()),
        ("tcp_idle_timeout", l.tcp_idle_timeout.is_zero()),
        ("udp_idle_timeout", l.udp_idle_timeout.is_zero()),
        ("udp_max_sessions", l.udp_max_sessions == 0),
    ] {
        if zero {
            out.push((f.to_string(), "must be greater than 0".into()));
        }
    }
    if !(512..=65_536).contains(&l.max_peek_bytes) {
        out.push((
            "max_peek_bytes".into(),
            format!("must be in 512..=65536, got {}", l.max_peek_bytes),
        ));
    }
    out
}

/// An HTTP token (header or cookie name).
#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_matching() {
        let n = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(n.contains(ip("10.1.255.3")));
        assert!(!n.contains(ip("10.2.0.1")));
        assert!(
            n.contains(ip("::ffff:10.1.2.3")),
            "v4-mapped v6 matches v4 nets"
        );
        assert!(!n.contains(ip("2001:db8::1")));
        let one = Cidr::parse("192.0.2.7").unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("255.255.255.255")) && !all.contains(ip("::1")));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("::1")));
        let odd = Cidr::parse("10.0.0.128/25").unwrap();
        assert!(odd.contains(ip("10.0.0.200")) && !odd.contains(ip("10.0.0.127")));
    }

    #[test]
    fn edge_settings_are_validated_with_paths() {
        let cfg = crate::Config::from_yaml(
            r#"
listeners:
  - {name: web, port: 80, protocol: http}
  - {name: dns, port: 53, protocol: udp, l4_routes: [{name: r, backends: [{backend: b}]}]}
client_ip:
  trusted_proxies: [10.0.0.0/8, 10.0.0.1/8]
  forwarded_for_depth: 0
  proxy_protocol: [web, dns, nope]
l4: {max_peek_bytes: 10, udp_max_sessions: 0}
virtual_hosts:
  - name: v
    routes:
      - name: r
        filters:
          - rate_limit: {key: {header: "a b"}, requests: 0, period: 0ms, max_keys: 0, zone: "",
                         exempt: [10.0.0.0/8, 10.0.0.1/8]}
          - ip_access: {}
          - ip_access: {deny: [300.0.0.1]}
          - concurrency_limit: {max: 1, exempt: [nope, "2001:db8::/32"]}
        action: {proxy: {backends: [{backend: b}]}}
backends:
  - name: b
    protocol: https
    tls: {subject_alt_names: ["spiffe://x/y", "bad name"]}
    endpoints: [{address: "10.0.0.1:80"}]
    session_persistence: {name: "a;b", path: x, same_site: lax, ttl: 0s}
    hash: {on: {cookie: ""}}
    health_check: {path: health, interval: 0s, timeout: 0s, healthy_threshold: 0,
                   unhealthy_threshold: 0, expected_status_min: 99, expected_status_max: 600}
"#,
        )
        .unwrap();
        let errs = cfg.validate_structure().unwrap_err().0;
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        for want in [
            "virtual_hosts[0].routes[0].filters[0].rate_limit.key.header",
            "virtual_hosts[0].routes[0].filters[0].rate_limit.requests",
            "virtual_hosts[0].routes[0].filters[0].rate_limit.period",
            "virtual_hosts[0].routes[0].filters[0].rate_limit.max_keys",
            "virtual_hosts[0].routes[0].filters[0].rate_limit.zone",
            "virtual_hosts[0].routes[0].filters[1].ip_access",
            "virtual_hosts[0].routes[0].filters[2].ip_access.deny[0]",
            "virtual_hosts[0].routes[0].filters[0].rate_limit.exempt[1]",
            "virtual_hosts[0].routes[0].filters[3].concurrency_limit.exempt[0]",
            "backends[0].tls.subject_alt_names",
            "backends[0].tls.subject_alt_names[1]",
            "backends[0].session_persistence.name",
            "backends[0].session_persistence.path",
            "backends[0].session_persistence.same_site",
            "backends[0].session_persistence.ttl",
            "backends[0].hash.on",
            "backends[0].health_check.path",
            "backends[0].health_check.interval",
            "backends[0].health_check.timeout",
            "backends[0].health_check.healthy_threshold",
            "backends[0].health_check.unhealthy_threshold",
            "backends[0].health_check.expected_status_min",
            "backends[0].health_check.expected_status_max",
            "client_ip.trusted_proxies[1]",
            "client_ip.forwarded_for_depth",
            "client_ip.proxy_protocol[1]",
            "client_ip.proxy_protocol[2]",
            "l4.max_peek_bytes",
            "l4.udp_max_sessions",
        ] {
            assert!(paths.contains(&want), "{want} missing from {paths:?}");
        }
        assert!(
            !paths.iter().any(|p| p.starts_with("listeners")),
            "{paths:?}"
        );
        assert!(
            !paths.contains(&"backends[0].tls.subject_alt_names[0]"),
            "URI SANs are fine"
        );
        // Good exempt entries pass.
        for fine in [
            "virtual_hosts[0].routes[0].filters[0].rate_limit.exempt[0]",
            "virtual_hosts[0].routes[0].filters[3].concurrency_limit.exempt[1]",
            "virtual_hosts[0].routes[0].filters[3].concurrency_limit.max",
        ] {
            assert!(!paths.contains(&fine), "{fine} in {paths:?}");
        }
        // Defaults serialize to nothing: configs without traffic policy look as before.
        let plain = crate::Config::default();
        let yaml = serde_yaml::to_string(&plain).unwrap();
        assert!(
            !yaml.contains("client_ip") && !yaml.contains("l4:"),
            "{yaml}"
        );
    }

    #[test]
    fn cidr_parse_errors() {
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "nope/8",
            "::/129",
            "10.0.0.0/x",
            "1.2.3.4/",
            "10.0.0.0/+8",
            "::ffff:10.0.0.0/104",
            "::ffff:10.0.0.1",
            "fe80::1%eth0/64",
            "fe80::1%eth0",
            "10.0.0.0/8 10.1.0.0/16",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad:?}");
            if bad != "10.0.0.1/8" {
                assert!(Cidr::parse_masked(bad).is_err(), "{bad:?}");
            }
        }
        assert_eq!(
            Cidr::parse_masked("10.0.0.1/8").unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            Cidr::parse(" 10.0.0.0 / 8 ").unwrap().to_string(),
            "10.0.0.0/8"
        );
        let (ok, errs) = parse_cidrs(&["10.0.0.0/8".into(), "bad".into(), "::1".into()]);
        assert_eq!(ok.len(), 2);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].0, 1);
    }

    /// Property (the fuzz target `config/fuzz` `cidr_parse` checks the same on arbitrary
    /// text): for generated addresses, prefixes and clients, `parse_masked` gives a canonical
    /// network that `parse` reads back, that contains the written address, and that contains
    /// a client exactly when their leading `prefix` bits agree (IPv4-mapped clients as IPv4);
    /// `parse` accepts only what is already canonical.
    #[test]
    fn cidr_properties() {
        let mut seed: u64 = 0x0123_4567_89ab_cdef;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let leading = |a: u128, b: u128, prefix: u32, width: u32| {
            prefix == 0 || (a >> (width - prefix)) == (b >> (width - prefix))
        };
        for i in 0..20_000 {
            let v4 = i % 2 == 0;
            let raw = u128::from(next()) << 64 | u128::from(next());
            let (addr, width): (IpAddr, u32) = if v4 {
                (std::net::Ipv4Addr::from(raw as u32).into(), 32)
            } else {
                (std::net::Ipv6Addr::from(raw).into(), 128)
            };
            let prefix = (next() % u64::from(width + 1)) as u32;
            let text = format!("{addr}/{prefix}");
            let Ok(net) = Cidr::parse_masked(&text) else {
                // Only IPv4-mapped IPv6 networks are refused.
                assert!(matches!(addr, IpAddr::V6(v) if v.to_ipv4_mapped().is_some()));
                continue;
            };
            let shown = net.to_string();
            assert_eq!(Cidr::parse(&shown), Ok(net), "{text} -> {shown}");
            assert!(net.contains(addr), "{shown} does not contain {addr}");
            assert_eq!(Cidr::parse(&text).is_ok(), text == shown, "{text}");
            // A client near the address (low bits flipped) and a random one.
            let near = bits(addr) ^ u128::from(next() % 1024);
            let far = u128::from(next()) << 64 | u128::from(next());
            for c in [near, far] {
                let client: IpAddr = if v4 {
                    std::net::Ipv4Addr::from(c as u32).into()
                } else {
                    std::net::Ipv6Addr::from(c).into()
                };
                let want = leading(bits(client), bits(addr), prefix, width);
                assert_eq!(net.contains(client), want, "{shown} contains {client}?");
                if let IpAddr::V4(c4) = client {
                    let mapped = IpAddr::V6(c4.to_ipv6_mapped());
                    assert_eq!(net.contains(mapped), want, "{shown} contains {mapped}?");
                }
            }
        }
    }
}

/// How request paths are normalised before routing (`path_normalization`, global): see
/// docs/security.md. The normalised path is what routing, access rules, the cache key, the
/// access log and the backend see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PathNormalization {
    /// Normalise at all: decode percent-encoded unreserved characters, upper-case other
    /// escapes, remove dot segments (RFC 3986 §5.2.4). Default on.
    pub enabled: bool,
    /// Merge runs of `/` into one. Default on.
    pub merge_slashes: bool,
    /// What to do with `%2F`, `%5C` and a raw `\` in a path. Default `reject` (400).
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathNormalization {
    fn default() -> Self {
        PathNormalization {
            enabled: true,
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Reject,
        }
    }
}

impl PathNormalization {
    /// True for the defaults (left out when a config is written).
    pub fn is_default(&self) -> bool {
        *self == PathNormalization::default()
    }
}

/// What path normalisation does with an encoded slash or backslash (`%2F`, `%5C`, `\`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// Refuse the request with 400 (the default: router and backend cannot disagree).
    #[default]
    Reject,
    /// Decode to `/` before dot segments are removed and routes are matched.
    Decode,
    /// Keep as it came (upper-case hex): the route sees one segment, a backend that decodes
    /// may see two.
    Keep,
}
