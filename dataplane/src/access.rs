//! Access rules of the request path: the real client IP behind trusted proxies
//! (`X-Forwarded-For` walked to a configured depth), IP allow/deny lists (403), local
//! token-bucket rate limits per key and limits of requests in flight per key (429 with
//! `Retry-After`).
//!
//! [`AccessRules`] is built with each config snapshot: the client-IP rules and, for every route with
//! `rate_limit` or `ip_access` filters, its compiled rules. Rate-limit buckets live in
//! [`Zones`], owned by the runtime, so they survive reloads while a zone with the same name
//! and settings exists. Each zone's key table is bounded (`max_keys`): past it the least
//! recently used key is forgotten, which at worst lets that key start again with a full
//! bucket.

use crate::ctx::ConnInfo;
use crate::router::RouteTable;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sweety_config::{
    any_contains, parse_cidrs, Cidr, ClientIp, ConcurrencyLimit, Filter, IpAccess, RateLimit,
    RateLimitKey,
};

/// `X-Forwarded-For`.
static XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
/// Longest `X-Forwarded-For` value looked at, bytes; a longer one is not believed.
const MAX_XFF_BYTES: usize = 8 * 1024;
/// Header values longer than this are hashed as their first this many bytes plus the length.
const MAX_KEY_BYTES: usize = 1024;
/// Shards of a rate-limit key table (each with `max_keys / SHARDS` keys, at least 1).
const SHARDS: usize = 16;

// ------------------------------------------------------------------ client IP

/// Compiled [`ClientIp`] rules.
#[derive(Debug, Default)]
pub struct ClientIpRules {
    trusted: Vec<Cidr>,
    depth: usize,
}

impl ClientIpRules {
    /// Compiles the config section (already validated; bad CIDRs are skipped).
    pub fn new(c: &ClientIp) -> ClientIpRules {
        ClientIpRules {
            trusted: parse_cidrs(&c.trusted_proxies).0,
            depth: c.forwarded_for_depth as usize,
        }
    }

    /// True when `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        any_contains(&self.trusted, ip)
    }

    /// True when no proxy is trusted (the peer is always the client).
    pub fn is_empty(&self) -> bool {
        self.trusted.is_empty()
    }

    /// The real client address of a request from `peer` with these headers, and how many
    /// `X-Forwarded-For` entries (from the right) were consumed to find it.
    ///
    /// When `peer` is trusted, entries are walked from the right, at most `depth` of them:
    /// each becomes the client, and the walk stops at the first one that is not itself a
    /// trusted proxy. An entry that is not an IP address stops the walk (the last good address
    /// stays the client). Every `X-Forwarded-For` header line counts, in order.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> (IpAddr, usize) {
        match self.walk(peer, headers) {
            Some((client, used, _)) => (client, used),
            None => (peer, 0),
        }
    }

    /// [`ClientIpRules::client`] with the joined `X-Forwarded-For` value it walked; `None`
    /// when the header is not consulted (untrusted peer, unreadable or oversized header).
    fn walk(&self, peer: IpAddr, headers: &HeaderMap) -> Option<(IpAddr, usize, String)> {
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return None;
        }
        let mut joined = String::new();
        for v in headers.get_all(&XFF) {
            let s = v.to_str().ok()?;
            if joined.len() + s.len() > MAX_XFF_BYTES {
                return None;
            }
            if !joined.is_empty() {
                joined.push(',');
            }
            joined.push_str(s);
        }
        let mut client = peer;
        let mut used = 0;
        for entry in joined.rsplit(',').take(self.depth) {
            let Some(ip) = parse_xff_entry(entry.trim()) else {
                break;
            };
            client = ip;
            used += 1;
            if !self.is_trusted(ip) {
                break;
            }
        }
        Some((client, used, joined))
    }

    /// Resolves the client of a request: returns the connection info to use for it (a copy
    /// with `peer` replaced when the client is not the TCP peer) and drops the consumed
    /// entries from `X-Forwarded-For`, so the proxy appends the client once. The header is
    /// parsed once, by the walk.
    pub fn resolve(&self, conn: &Arc<ConnInfo>, headers: &mut HeaderMap) -> Arc<ConnInfo> {
        let Some((client, used, joined)) = self.walk(conn.peer.ip(), headers) else {
            return conn.clone();
        };
        if used == 0 {
            return conn.clone();
        }
        headers.remove(&XFF);
        let entries: Vec<&str> = joined.split(',').map(str::trim).collect();
        let keep = entries.len().saturating_sub(used);
        if keep > 0 {
            if let Ok(v) = HeaderValue::from_str(&entries[..keep].join(", ")) {
                headers.insert(XFF.clone(), v);
            }
        }
        let mut c = (**conn).clone();
        c.peer = SocketAddr::new(client, 0);
        Arc::new(c)
    }
}

/// An `X-Forwarded-For` entry: `ip`, `ip:port` or `[v6]:port`.
/// IPv4-mapped IPv6 entries are turned into the plain IPv4 address.
fn parse_xff_entry(s: &str) -> Option<IpAddr> {
    let ip = match s.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => s.parse::<SocketAddr>().ok()?.ip(),
    };
    Some(ip.to_canonical())
}

/// The reply to a refused request: 403, or the limit's status (429 unless it says otherwise;
/// ingress-nginx's `limit-*` translate to 503, nginx's default) with `Retry-After`. Counted in
/// `sweety_edge_events_total`.
pub fn refusal_response(
    refusal: Refusal,
    metrics: &crate::metrics::Metrics,
) -> http::Response<crate::body::Body> {
    use http::StatusCode;
    match refusal {
        Refusal::Forbidden => {
            metrics.edge_events.inc(&"ip_denied");
            crate::body::text_response(
                StatusCode::FORBIDDEN,
                "403 Forbidden: client address not allowed\n",
            )
        }
        Refusal::RateLimited {
            retry_after,
            status,
        } => {
            metrics.edge_events.inc(&"rate_limited");
            // Validated 400-599 by sweety-config; anything else answers 429.
            let status = StatusCode::from_u16(status)
                .ok()
                .filter(|s| s.is_client_error() || s.is_server_error())
                .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
            let text = match status {
                StatusCode::TOO_MANY_REQUESTS => {
                    "429 Too Many Requests: rate limit exceeded, retry later\n"
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    "503 Service Unavailable: rate limit exceeded, retry later\n"
                }
                _ => "rate limit exceeded, retry later\n",
            };
            let mut r = crate::body::text_response(status, text);
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
            r
        }
    }
}

// ------------------------------------------------------------------ IP rules

/// Compiled [`IpAccess`].
#[derive(Debug)]
pub struct IpRules {
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
}

impl IpRules {
    /// Compiles the rules (already validated; bad CIDRs are skipped).
    pub fn new(a: &IpAccess) -> IpRules {
        IpRules {
            allow: parse_cidrs(&a.allow).0,
            deny: parse_cidrs(&a.deny).0,
        }
    }

    /// True when `ip` may pass: not denied, and allowed when an allow list exists.
    pub fn permits(&self, ip: IpAddr) -> bool {
        !any_contains(&self.deny, ip) && (self.allow.is_empty() || any_contains(&self.allow, ip))
    }
}

// ------------------------------------------------------------------ token buckets

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
    seq: u64,
}

#[derive(Debug, Default)]
struct Shard {
    buckets: HashMap<u64, Bucket>,
    /// Last-use sequence number to key, oldest first.
    order: BTreeMap<u64, u64>,
    seq: u64,
}

/// A token bucket per key with a bounded, least-recently-used key table.
#[derive(Debug)]
pub struct Limiter {
    capacity: f64,
    /// Tokens per second.
    rate: f64,
    per_shard: usize,
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Limiter {
    /// `requests` per `period`, up to `requests + burst` at once, at most `max_keys` keys.
    pub fn new(requests: u32, period: Duration, burst: u32, max_keys: usize) -> Limiter {
        let secs = period.as_secs_f64().max(1e-3);
        Limiter {
            capacity: f64::from(requests) + f64::from(burst),
            rate: f64::from(requests) / secs,
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        if key.len() > MAX_KEY_BYTES {
            key[..MAX_KEY_BYTES].hash(&mut h);
            key.len().hash(&mut h);
        } else {
            key.hash(&mut h);
        }
        h.finish()
    }

    /// Takes a token for `key` at `now`: `Ok(())`, or `Err(wait)` with the time until one is
    /// available.
    pub fn take(&self, key: &[u8], now: Instant) -> Result<(), Duration> {
        let k = self.hash(key);
        let mut shard = self.shards[(k as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let shard = &mut *shard;
        shard.seq += 1;
        let seq = shard.seq;
        let mut b = match shard.buckets.get(&k) {
            Some(b) => {
                shard.order.remove(&b.seq);
                let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
                Bucket {
                    tokens: (b.tokens + elapsed * self.rate).min(self.capacity),
                    last: now,
                    seq,
                }
            }
            None => {
                if shard.buckets.len() >= self.per_shard {
                    if let Some((_, oldest)) = shard.order.pop_first() {
                        shard.buckets.remove(&oldest);
                    }
                }
                Bucket {
                    tokens: self.capacity,
                    last: now,
                    seq,
                }
            }
        };
        let result = if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        };
        shard.buckets.insert(k, b);
        shard.order.insert(seq, k);
        result
    }

    /// Keys currently tracked.
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).buckets.len())
            .sum()
    }
}

/// Identity of a rate-limit zone: its name and every setting that shapes its buckets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ZoneKey {
    name: String,
    key: RateLimitKey,
    requests: u32,
    period: Duration,
    burst: u32,
    max_keys: u32,
}

/// Counts of requests in flight per key, for concurrency limits. A key is present only
/// while it has requests in flight, so the table is bounded by the requests in flight.
#[derive(Debug, Default)]
pub struct InFlightTable {
    counts: Mutex<HashMap<u64, u32>>,
    hasher: std::collections::hash_map::RandomState,
}

/// A request counted in an [`InFlightTable`] until dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    table: Arc<InFlightTable>,
    key: u64,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut c = self.table.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.key);
            }
        }
    }
}

impl InFlightTable {
    /// Counts a request for `key` unless `max` are already in flight.
    pub fn try_acquire(self: &Arc<Self>, key: &[u8], max: u32) -> Option<InFlightGuard> {
        let mut h = self.hasher.build_hasher();
        key[..key.len().min(MAX_KEY_BYTES)].hash(&mut h);
        key.len().hash(&mut h);
        let k = h.finish();
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry(k).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(InFlightGuard {
            table: self.clone(),
            key: k,
        })
    }

    /// Keys with requests in flight.
    pub fn keys(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Rate-limit zones and in-flight tables by identity; outlives config reloads.
#[derive(Debug, Default)]
pub struct Zones {
    map: Mutex<HashMap<ZoneKey, Arc<Limiter>>>,
    in_flight: Mutex<HashMap<(String, RateLimitKey), Arc<InFlightTable>>>,
}

impl Zones {
    fn get(&self, key: ZoneKey, keep: &mut Vec<ZoneKey>) -> Arc<Limiter> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        keep.push(key.clone());
        map.entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Limiter::new(
                    key.requests,
                    key.period,
                    key.burst,
                    key.max_keys as usize,
                ))
            })
            .clone()
    }

    fn in_flight(
        &self,
        key: (String, RateLimitKey),
        keep: &mut Vec<(String, RateLimitKey)>,
    ) -> Arc<InFlightTable> {
        keep.push(key.clone());
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default()
            .clone()
    }

    /// Forgets every zone and table not kept (called after a config is applied).
    fn retain(&self, keep: &[ZoneKey], keep_in_flight: &[(String, RateLimitKey)]) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|k, _| keep.contains(k));
        let mut t = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        t.retain(|k, _| keep_in_flight.contains(k));
    }

    /// Number of zones.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when there are no zones.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One compiled rate limit of a route.
#[derive(Debug)]
struct RouteLimit {
    key: RateLimitKey,
    header: Option<HeaderName>,
    limiter: Arc<Limiter>,
    /// The refusal status (not part of the zone: it shapes no bucket).
    status: u16,
    /// Client networks the limit does not count (`RateLimit::exempt`).
    exempt: Vec<Cidr>,
}

/// One compiled concurrency limit of a route.
#[derive(Debug)]
struct RouteConcurrency {
    key: RateLimitKey,
    header: Option<HeaderName>,
    max: u32,
    table: Arc<InFlightTable>,
    /// The refusal status.
    status: u16,
    /// Client networks the limit does not count (`ConcurrencyLimit::exempt`).
    exempt: Vec<Cidr>,
}

impl RouteRules {
    /// The route's basic authentication, checked after [`RouteRules::check`].
    pub fn basic_auth(&self) -> Option<&Arc<crate::basic_auth::BasicAuthRules>> {
        self.basic.as_ref()
    }

    /// The route's external authentication, checked after [`RouteRules::basic_auth`].
    pub fn external_auth(&self) -> Option<&Arc<crate::ext_auth::ExtAuthRules>> {
        self.external.as_ref()
    }
}

/// The access rules of one route, in filter order.
#[derive(Debug, Default)]
pub struct RouteRules {
    ip: Vec<IpRules>,
    limits: Vec<RouteLimit>,
    concurrency: Vec<RouteConcurrency>,
    basic: Option<Arc<crate::basic_auth::BasicAuthRules>>,
    external: Option<Arc<crate::ext_auth::ExtAuthRules>>,
}

/// The bytes a limit counts a request by.
fn key_bytes<'h>(
    key: &RateLimitKey,
    header: Option<&HeaderName>,
    client: IpAddr,
    headers: &'h HeaderMap,
) -> std::borrow::Cow<'h, [u8]> {
    use std::borrow::Cow;
    match key {
        // IPv4-mapped IPv6 counts as the IPv4 address: one client, one bucket.
        RateLimitKey::ClientIp => Cow::Owned(match client.to_canonical() {
            IpAddr::V4(v) => v.octets().to_vec(),
            IpAddr::V6(v) => v.octets().to_vec(),
        }),
        RateLimitKey::Header(_) => Cow::Borrowed(
            header
                .and_then(|h| headers.get(h))
                .map_or(&[][..], |v| v.as_bytes()),
        ),
        RateLimitKey::Route => Cow::Borrowed(b""),
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client IP is denied (403).
    Forbidden,
    /// A rate or concurrency limit is exhausted: answer `status` (the limit's, 429 by
    /// default) and retry after `retry_after` seconds.
    RateLimited {
        /// Seconds until a retry may pass.
        retry_after: u64,
        /// The limit's refusal status.
        status: u16,
    },
}

impl RouteRules {
    /// Checks IP rules, then rate limits, then concurrency limits, for a request from
    /// `client`. On success the returned guards count the request in flight until dropped
    /// (hold them with [`hold`]).
    pub fn check(
        &self,
        client: IpAddr,
        headers: &HeaderMap,
        now: Instant,
    ) -> Result<Vec<InFlightGuard>, Refusal> {
        if self.ip.iter().any(|r| !r.permits(client)) {
            return Err(Refusal::Forbidden);
        }
        for l in &self.limits {
            if any_contains(&l.exempt, client) {
                continue;
            }
            let key = key_bytes(&l.key, l.header.as_ref(), client, headers);
            if let Err(wait) = l.limiter.take(&key, now) {
                return Err(Refusal::RateLimited {
                    retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
                    status: l.status,
                });
            }
        }
        let mut guards = Vec::with_capacity(self.concurrency.len());
        for c in &self.concurrency {
            if any_contains(&c.exempt, client) {
                continue;
            }
            let key = key_bytes(&c.key, c.header.as_ref(), client, headers);
            match c.table.try_acquire(&key, c.max) {
                Some(g) => guards.push(g),
                None => {
                    return Err(Refusal::RateLimited {
                        retry_after: 1,
                        status: c.status,
                    })
                }
            }
        }
        Ok(guards)
    }
}

/// The compiled access rules of one config snapshot.
#[derive(Debug, Default)]
pub struct AccessRules {
    /// Real client IP rules.
    pub client_ip: ClientIpRules,
    routes: HashMap<usize, RouteRules>,
}

impl AccessRules {
    /// True when `route` has rules compiled here (IP access lists, rate and concurrency
    /// limits): a config change that touches no such route and not `client_ip` leaves the
    /// `AccessRules` as it was.
    pub fn has_route_rules(route: &sweety_config::Route) -> bool {
        route.filters.iter().any(|f| {
            matches!(
                f,
                Filter::IpAccess(_)
                    | Filter::RateLimit(_)
                    | Filter::ConcurrencyLimit(_)
                    | Filter::BasicAuth(_)
                    | Filter::ExternalAuth(_)
            )
        })
    }

    /// Compiles the rules of `routes` (zones come from, and are kept in, `zones`; the users
    /// of `basic_auth` filters naming a set from `user_sets`, compiled once per set and realm
    /// and shared).
    pub fn build(
        client_ip: &ClientIp,
        user_sets: &[sweety_config::UserSet],
        routes: &RouteTable,
        zones: &Zones,
    ) -> AccessRules {
        let mut shared: HashMap<(&str, &str), Arc<crate::basic_auth::BasicAuthRules>> =
            HashMap::new();
        let mut out = HashMap::new();
        let mut keep = Vec::new();
        let mut keep_in_flight = Vec::new();
        for e in routes.entries() {
            if !Self::has_route_rules(&e.route) {
                continue;
            }
            let mut rules = RouteRules::default();
            for (i, f) in e.route.filters.iter().enumerate() {
                match f {
                    Filter::IpAccess(a) => rules.ip.push(IpRules::new(a)),
                    Filter::RateLimit(r) => rules.limits.push(route_limit(
                        r,
                        format!("{}/{}#{i}", e.vhost, e.name),
                        zones,
                        &mut keep,
                    )),
                    Filter::ConcurrencyLimit(c) => rules.concurrency.push(route_concurrency(
                        c,
                        format!("{}/{}#{i}", e.vhost, e.name),
                        zones,
                        &mut keep_in_flight,
                    )),
                    Filter::BasicAuth(a) if rules.basic.is_none() => {
                        rules.basic = Some(match &a.user_set {
                            None => Arc::new(crate::basic_auth::BasicAuthRules::new(a)),
                            Some(set) => shared
                                .entry((set.as_str(), a.realm.as_str()))
                                .or_insert_with(|| {
                                    // Validation refuses a name the config lacks; were one
                                    // left, no user would be let in (fail closed).
                                    let users = user_sets
                                        .iter()
                                        .find(|s| s.name == *set)
                                        .map(|s| s.users.clone())
                                        .unwrap_or_default();
                                    Arc::new(crate::basic_auth::BasicAuthRules::new(
                                        &sweety_config::BasicAuth {
                                            realm: a.realm.clone(),
                                            users,
                                            user_set: None,
                                        },
                                    ))
                                })
                                .clone(),
                        })
                    }
                    Filter::ExternalAuth(a) if rules.external.is_none() => {
                        rules.external = Some(Arc::new(crate::ext_auth::ExtAuthRules::new(a)))
                    }
                    _ => {}
                }
            }
            if !rules.ip.is_empty()
                || !rules.limits.is_empty()
                || !rules.concurrency.is_empty()
                || rules.basic.is_some()
                || rules.external.is_some()
            {
                out.insert(Arc::as_ptr(&e.route) as usize, rules);
            }
        }
        zones.retain(&keep, &keep_in_flight);
        AccessRules {
            client_ip: ClientIpRules::new(client_ip),
            routes: out,
        }
    }

    /// The rules of a route entry, if it has any.
    pub fn route(&self, route: &Arc<sweety_config::Route>) -> Option<&RouteRules> {
        if self.routes.is_empty() {
            return None;
        }
        self.routes.get(&(Arc::as_ptr(route) as usize))
    }
}

fn route_concurrency(
    c: &ConcurrencyLimit,
    name: String,
    zones: &Zones,
    keep: &mut Vec<(String, RateLimitKey)>,
) -> RouteConcurrency {
    RouteConcurrency {
        header: match &c.key {
            RateLimitKey::Header(h) => HeaderName::from_bytes(h.as_bytes()).ok(),
            _ => None,
        },
        key: c.key.clone(),
        max: c.max.max(1),
        table: zones.in_flight((c.zone.clone().unwrap_or(name), c.key.clone()), keep),
        status: c.status,
        // Validation refuses entries that do not parse; were one left, it would exempt no one.
        exempt: parse_cidrs(&c.exempt).0,
    }
}

pin_project_lite::pin_project! {
    /// A response body holding in-flight guards until it is finished or dropped.
    struct Held {
        #[pin]
        inner: crate::body::Body,
        guards: Vec<InFlightGuard>,
    }
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.project();
        let r = this.inner.poll_frame(cx);
        if let std::task::Poll::Ready(None) = r {
            this.guards.clear();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Keeps `guards` (requests counted in flight) until the response body is done.
pub fn hold(
    resp: http::Response<crate::body::Body>,
    guards: Vec<InFlightGuard>,
) -> http::Response<crate::body::Body> {
    if guards.is_empty() {
        return resp;
    }
    resp.map(|inner| crate::body::boxed(Held { inner, guards }))
}

fn route_limit(
    r: &RateLimit,
    default_zone: String,
    zones: &Zones,
    keep: &mut Vec<ZoneKey>,
) -> RouteLimit {
    let key = ZoneKey {
        name: r.zone.clone().unwrap_or(default_zone),
        key: r.key.clone(),
        requests: r.requests.max(1),
        period: r.period.get().max(Duration::from_millis(1)),
        burst: r.burst,
        max_keys: r.max_keys.max(1),
    };
    RouteLimit {
        header: match &r.key {
            RateLimitKey::Header(h) => HeaderName::from_bytes(h.as_bytes()).ok(),
            _ => None,
        },
        key: r.key.clone(),
        limiter: zones.get(key, keep),
        status: r.status,
        // Validation refuses entries that do not parse; were one left, it would exempt no one.
        exempt: parse_cidrs(&r.exempt).0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn rules(trusted: &[&str], depth: u32) -> ClientIpRules {
        ClientIpRules::new(&ClientIp {
            trusted_proxies: trusted.iter().map(|s| s.to_string()).collect(),
            forwarded_for_depth: depth,
            ..ClientIp::default()
        })
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&XFF, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn xff_is_ignored_from_untrusted_peers() {
        let r = rules(&["10.0.0.0/8"], 3);
        assert_eq!(
            r.client(ip("192.0.2.1"), &xff(&["203.0.113.9"])),
            (ip("192.0.2.1"), 0)
        );
        let none = rules(&[], 3);
        assert_eq!(
            none.client(ip("10.0.0.1"), &xff(&["203.0.113.9"])),
            (ip("10.0.0.1"), 0)
        );
    }

    #[test]
    fn xff_depth_bounds_the_walk() {
        let h = xff(&["198.51.100.7, 10.0.0.3", "10.0.0.2"]);
        // Depth 1: only the last entry is believed; it is a trusted proxy itself.
        assert_eq!(
            rules(&["10.0.0.0/8"], 1).client(ip("10.0.0.1"), &h),
            (ip("10.0.0.2"), 1)
        );
        assert_eq!(
            rules(&["10.0.0.0/8"], 2).client(ip("10.0.0.1"), &h),
            (ip("10.0.0.3"), 2)
        );
        // Depth 3 reaches the first untrusted address and stops there.
        assert_eq!(
            rules(&["10.0.0.0/8"], 3).client(ip("10.0.0.1"), &h),
            (ip("198.51.100.7"), 3)
        );
        assert_eq!(
            rules(&["10.0.0.0/8"], 10).client(ip("10.0.0.1"), &h),
            (ip("198.51.100.7"), 3)
        );
        // An untrusted address stops the walk even with depth left.
        let h = xff(&["203.0.113.1, 198.51.100.7"]);
        assert_eq!(
            rules(&["10.0.0.0/8"], 5).client(ip("10.0.0.1"), &h),
            (ip("198.51.100.7"), 1)
        );
    }

    #[test]
    fn xff_garbage_and_ports() {
        let r = rules(&["127.0.0.1"], 2);
        assert_eq!(
            r.client(ip("127.0.0.1"), &xff(&["unknown"])),
            (ip("127.0.0.1"), 0)
        );
        assert_eq!(
            r.client(ip("127.0.0.1"), &xff(&["198.51.100.7:5555"])),
            (ip("198.51.100.7"), 1)
        );
        assert_eq!(
            r.client(ip("127.0.0.1"), &xff(&["[2001:db8::1]:80"])),
            (ip("2001:db8::1"), 1)
        );
        assert_eq!(
            r.client(ip("127.0.0.1"), &HeaderMap::new()),
            (ip("127.0.0.1"), 0)
        );
        let long = "1.1.1.1,".repeat(2000);
        assert_eq!(
            r.client(ip("127.0.0.1"), &xff(&[&long])),
            (ip("127.0.0.1"), 0)
        );
    }

    /// `exempt` networks pass rate and concurrency limits without counting (an IPv4-mapped
    /// address as its IPv4 address); every other client is limited as before.
    #[test]
    fn exempt_clients_pass_the_limits_and_others_are_limited() {
        let exempt = vec![
            Cidr::parse("10.0.0.0/8").unwrap(),
            Cidr::parse("2001:db8::/32").unwrap(),
        ];
        let route = RouteRules {
            limits: vec![RouteLimit {
                key: RateLimitKey::ClientIp,
                header: None,
                limiter: Arc::new(Limiter::new(1, Duration::from_secs(60), 0, 100)),
                status: 503,
                exempt: exempt.clone(),
            }],
            concurrency: vec![RouteConcurrency {
                key: RateLimitKey::Route,
                header: None,
                max: 1,
                table: Arc::new(InFlightTable::default()),
                status: 503,
                exempt,
            }],
            ..RouteRules::default()
        };
        let h = HeaderMap::new();
        let now = Instant::now();
        // Exempt clients: never refused, never counted (no guard held).
        let mut held = Vec::new();
        for c in ["10.1.2.3", "::ffff:10.9.9.9", "2001:db8::7"] {
            for _ in 0..5 {
                let g = route.check(ip(c), &h, now).expect(c);
                assert!(g.is_empty(), "{c} counted");
                held.extend(g);
            }
        }
        // Another client: one request per minute, one in flight for the whole route.
        let g = route.check(ip("192.0.2.1"), &h, now).unwrap();
        assert_eq!(g.len(), 1);
        let limited = Refusal::RateLimited {
            retry_after: 1,
            status: 503,
        };
        // The route's one slot is taken: another client is refused by the concurrency limit
        // (its own first request passes the rate limit), an exempt one is not.
        assert_eq!(route.check(ip("192.0.2.2"), &h, now).unwrap_err(), limited);
        assert!(route.check(ip("10.0.0.1"), &h, now).is_ok());
        drop(g);
        // The first client's bucket is empty.
        assert!(matches!(
            route.check(ip("192.0.2.1"), &h, now),
            Err(Refusal::RateLimited { status: 503, .. })
        ));
    }

    #[test]
    fn ipv4_mapped_clients_share_the_ipv4_key() {
        let mapped = ip("::ffff:192.0.2.1");
        let plain = ip("192.0.2.1");
        let h = HeaderMap::new();
        assert_eq!(
            key_bytes(&RateLimitKey::ClientIp, None, mapped, &h),
            key_bytes(&RateLimitKey::ClientIp, None, plain, &h)
        );
        assert_ne!(
            key_bytes(&RateLimitKey::ClientIp, None, ip("2001:db8::1"), &h),
            key_bytes(&RateLimitKey::ClientIp, None, plain, &h)
        );
        // One bucket: the mapped address exhausts the plain address's limit.
        let route = RouteRules {
            limits: vec![RouteLimit {
                key: RateLimitKey::ClientIp,
                header: None,
                limiter: Arc::new(Limiter::new(1, Duration::from_secs(60), 0, 100)),
                status: 429,
                exempt: vec![],
            }],
            ..RouteRules::default()
        };
        let t = Instant::now();
        assert!(route.check(plain, &h, t).is_ok());
        assert_eq!(
            route.check(mapped, &h, t).unwrap_err(),
            Refusal::RateLimited {
                retry_after: 60,
                status: 429
            }
        );
        // X-Forwarded-For entries are normalized the same way.
        let r = rules(&["127.0.0.1"], 1);
        assert_eq!(
            r.client(ip("127.0.0.1"), &xff(&["::ffff:198.51.100.7"])),
            (ip("198.51.100.7"), 1)
        );
        assert_eq!(
            crate::ctx::canonical_addr("[::ffff:192.0.2.1]:80".parse().unwrap()),
            "192.0.2.1:80".parse().unwrap()
        );
    }

    #[test]
    fn resolve_rewrites_peer_and_trims_xff() {
        let r = rules(&["127.0.0.0/8"], 2);
        let conn = Arc::new(ConnInfo {
            listener: "l".into(),
            peer: "127.0.0.1:4000".parse().unwrap(),
            local: "127.0.0.1:80".parse().unwrap(),
            tls: false,
            sni: None,
            client_cert: None,
            client_cert_verdict: Default::default(),
            forwarding: Default::default(),
            tls_version: None,
            tls_cipher: None,
            read_budget: None,
        });
        let mut h = xff(&["203.0.113.5, 198.51.100.7"]);
        let c = r.resolve(&conn, &mut h);
        assert_eq!(c.peer.ip(), ip("198.51.100.7"));
        assert_eq!(h.get(&XFF).unwrap(), "203.0.113.5");
        let mut h = HeaderMap::new();
        assert!(Arc::ptr_eq(&r.resolve(&conn, &mut h), &conn));
    }

    #[test]
    fn ip_rules_deny_first_then_allow() {
        let r = IpRules::new(&IpAccess {
            allow: vec!["10.0.0.0/8".into()],
            deny: vec!["10.9.0.0/16".into()],
        });
        assert!(r.permits(ip("10.1.2.3")));
        assert!(!r.permits(ip("10.9.2.3")));
        assert!(!r.permits(ip("192.0.2.1")));
        let deny_only = IpRules::new(&IpAccess {
            allow: vec![],
            deny: vec!["192.0.2.0/24".into()],
        });
        assert!(deny_only.permits(ip("10.1.2.3")) && !deny_only.permits(ip("192.0.2.9")));
    }

    #[test]
    fn token_bucket_burst_refill_and_retry_after() {
        let l = Limiter::new(2, Duration::from_secs(1), 1, 100);
        let t0 = Instant::now();
        // Capacity requests + burst = 3 at once.
        for _ in 0..3 {
            assert_eq!(l.take(b"a", t0), Ok(()));
        }
        let wait = l.take(b"a", t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(400) && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        // Another key has its own bucket.
        assert_eq!(l.take(b"b", t0), Ok(()));
        // 2 per second: after 500ms one token is back, not two.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(l.take(b"a", t1), Ok(()));
        assert!(l.take(b"a", t1).is_err());
        // Refill never exceeds the capacity.
        let t2 = t1 + Duration::from_secs(100);
        for _ in 0..3 {
            assert_eq!(l.take(b"a", t2), Ok(()));
        }
        assert!(l.take(b"a", t2).is_err());
    }

    #[test]
    fn key_table_is_bounded_lru() {
        let l = Limiter::new(1, Duration::from_secs(60), 0, SHARDS * 2);
        let t = Instant::now();
        for i in 0..10_000u32 {
            let _ = l.take(&i.to_be_bytes(), t);
        }
        assert!(l.keys() <= SHARDS * 2, "{}", l.keys());
        // A key just used is remembered (still exhausted); an evicted one starts full again.
        let recent = 9_999u32.to_be_bytes();
        assert!(l.take(&recent, t).is_err());
        assert_eq!(l.take(&0u32.to_be_bytes(), t), Ok(()));
    }

    #[test]
    fn in_flight_table_counts_and_forgets() {
        let t = Arc::new(InFlightTable::default());
        let a1 = t.try_acquire(b"a", 2).unwrap();
        let a2 = t.try_acquire(b"a", 2).unwrap();
        assert!(t.try_acquire(b"a", 2).is_none());
        let b = t.try_acquire(b"b", 2).unwrap();
        assert_eq!(t.keys(), 2);
        drop(a1);
        let a3 = t.try_acquire(b"a", 2).unwrap();
        drop((a2, a3, b));
        assert_eq!(t.keys(), 0, "keys without requests in flight are forgotten");
    }

    #[test]
    fn long_keys_are_bounded() {
        let l = Limiter::new(1, Duration::from_secs(60), 0, 10);
        let t = Instant::now();
        let a = vec![b'x'; 100_000];
        assert_eq!(l.take(&a, t), Ok(()));
        assert!(l.take(&a, t).is_err());
        let mut b = a.clone();
        b.push(b'y');
        assert_eq!(l.take(&b, t), Ok(()), "a different length is another key");
    }
}
