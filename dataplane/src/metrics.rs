//! Dataplane metrics: atomic counters, gauges and a latency histogram, rendered in the
//! Prometheus text exposition format by [`Metrics::render`].
//!
//! Hot-path updates are lock-free atomics; labelled counters take a read lock on a small map
//! and only a write lock the first time a label set is seen.

use crate::ctx::Protocol;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A counter family keyed by a label tuple.
#[derive(Debug)]
pub struct LabeledCounter<K> {
    map: RwLock<HashMap<K, AtomicU64>>,
}

impl<K> Default for LabeledCounter<K> {
    fn default() -> Self {
        LabeledCounter {
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone + Ord> LabeledCounter<K> {
    /// Adds `n` to the counter for `key`.
    pub fn add(&self, key: &K, n: u64) {
        if let Some(c) = self.map.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            c.fetch_add(n, Relaxed);
            return;
        }
        let mut w = self.map.write().unwrap_or_else(|e| e.into_inner());
        w.entry(key.clone()).or_default().fetch_add(n, Relaxed);
    }

    /// Adds one.
    pub fn inc(&self, key: &K) {
        self.add(key, 1)
    }

    /// Current value for `key` (0 when never counted).
    pub fn get(&self, key: &K) -> u64 {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map_or(0, |c| c.load(Relaxed))
    }

    /// Snapshot sorted by key, for rendering.
    pub fn snapshot(&self) -> Vec<(K, u64)> {
        let r = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(K, u64)> = r
            .iter()
            .map(|(k, c)| (k.clone(), c.load(Relaxed)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// Upper bounds (seconds) of the request latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A fixed-bucket histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
    }
    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

/// Key of the request counter: listener, route, status class (1–5), protocol.
pub type RequestKey = (Arc<str>, Arc<str>, u8, &'static str);

/// The request counters: per listener and route, one counter per status class and protocol.
/// Counted once per request, so the lookup borrows the names (no reference counts taken) and
/// hashes them with FNV-1a (they come from the config, not from clients).
#[derive(Debug, Default)]
pub struct RequestCounters {
    map: RwLock<HashMap<Labels, Box<ClassCounters>, FnvBuild>>,
}

/// Counters by protocol (H1, H2, H3) and status class (1xx–5xx).
type ClassCounters = [[AtomicU64; 5]; 3];

/// A listener and route name pair, the key of [`RequestCounters`].
#[derive(Debug)]
struct Labels(Arc<str>, Arc<str>);

/// The names of a [`Labels`], owned or borrowed, so that a lookup needs no `Arc`.
trait LabelNames {
    fn names(&self) -> (&str, &str);
}

impl LabelNames for Labels {
    fn names(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl LabelNames for (&str, &str) {
    fn names(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn LabelNames + 'a> for Labels {
    fn borrow(&self) -> &(dyn LabelNames + 'a) {
        self
    }
}

impl Hash for dyn LabelNames + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.names().hash(h);
    }
}

impl PartialEq for dyn LabelNames + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for dyn LabelNames + '_ {}

// Hashed and compared exactly as its `dyn LabelNames` view (what `Borrow` requires).
impl Hash for Labels {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.names().hash(h);
    }
}

impl PartialEq for Labels {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for Labels {}

/// FNV-1a, for maps keyed by names from the config (not by what clients send).
pub struct Fnv(u64);

/// Builds [`Fnv`] hashers.
pub type FnvBuild = BuildHasherDefault<Fnv>;

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

impl RequestCounters {
    /// Counts one request of `listener` and `route` with status class `class` (1–5).
    pub fn inc(&self, listener: &Arc<str>, route: &Arc<str>, class: u8, proto: Protocol) {
        let (p, c) = (proto_index(proto), usize::from(class.clamp(1, 5) - 1));
        let names: &dyn LabelNames = &(&**listener, &**route);
        if let Some(cs) = self
            .map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(names)
        {
            cs[p][c].fetch_add(1, Relaxed);
            return;
        }
        let mut w = self.map.write().unwrap_or_else(|e| e.into_inner());
        w.entry(Labels(listener.clone(), route.clone()))
            .or_default()[p][c]
            .fetch_add(1, Relaxed);
    }

    /// Requests counted for these labels (0 when never counted).
    pub fn get(&self, listener: &str, route: &str, class: u8, proto: Protocol) -> u64 {
        let names: &dyn LabelNames = &(listener, route);
        let (p, c) = (proto_index(proto), usize::from(class.clamp(1, 5) - 1));
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(names)
            .map_or(0, |cs| cs[p][c].load(Relaxed))
    }

    /// Every label set counted so far, sorted by key, for rendering.
    pub fn snapshot(&self) -> Vec<(RequestKey, u64)> {
        let r = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut v = Vec::new();
        for (Labels(l, rt), cs) in r.iter() {
            for proto in [Protocol::Http1, Protocol::Http2, Protocol::Http3] {
                for (c, n) in cs[proto_index(proto)].iter().enumerate() {
                    let n = n.load(Relaxed);
                    if n > 0 {
                        v.push(((l.clone(), rt.clone(), c as u8 + 1, proto.as_str()), n));
                    }
                }
            }
        }
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// All dataplane metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests by listener, route, status class and protocol.
    pub requests: RequestCounters,
    /// Request latency by protocol (H1, H2, H3).
    pub latency: [Histogram; 3],
    /// Open client connections (TCP and QUIC).
    pub active_connections: AtomicI64,
    /// Requests (streams) being served.
    pub active_requests: AtomicI64,
    /// Request body bytes received from clients.
    pub bytes_received: AtomicU64,
    /// Response body bytes sent to clients.
    pub bytes_sent: AtomicU64,
    /// Backpressure rejections by limit name (`max_connections`, `max_requests_in_flight`,
    /// `listener_requests_in_flight`, `header_timeout`, `body_idle_timeout`, `body_too_large`…).
    pub limit_rejections: LabeledCounter<&'static str>,
    /// Upstream errors by kind (`connect`, `timeout`, `protocol`, `no_endpoint`…).
    pub upstream_errors: LabeledCounter<&'static str>,
    /// Generation of the config being served.
    pub config_generation: AtomicU64,
    /// Successful config reloads.
    pub reloads_ok: AtomicU64,
    /// Rejected config reloads.
    pub reloads_failed: AtomicU64,
    /// Access log lines dropped because the writer fell behind.
    pub access_log_dropped: AtomicU64,
    /// Connections accepted, all time.
    pub connections_total: AtomicU64,
    /// Edge features: active health check results by backend and result (`pass`, `fail`),
    /// and endpoint state changes (`down`, `up`).
    pub health_checks: LabeledCounter<(Arc<str>, &'static str)>,
    /// Edge features: requests refused by access rules (`ip_denied`, `rate_limited`) and
    /// layer-4 events (`l4_no_route`, `udp_session_limit`, `proxy_protocol_error`…).
    pub edge_events: LabeledCounter<&'static str>,
    /// Response cache and WebSocket tunnel figures.
    pub edge: EdgeMetrics,
    /// Open WebSocket (upgrade) tunnels.
    pub websocket_tunnels: AtomicI64,
}

/// Response cache counters (see `cache`).
#[derive(Debug, Default)]
pub struct EdgeMetrics {
    /// Fresh cache hits.
    pub cache_hits: AtomicU64,
    /// Stale entries served while revalidating.
    pub cache_stale: AtomicU64,
    /// Cacheable requests that went to the backend.
    pub cache_misses: AtomicU64,
    /// Entries evicted to stay within `cache.max_bytes`.
    pub cache_evictions: AtomicU64,
    /// Entries removed by purge requests.
    pub cache_purged: AtomicU64,
    /// Bytes held by the cache.
    pub cache_bytes: AtomicI64,
    /// Entries held by the cache.
    pub cache_entries: AtomicI64,
}

impl EdgeMetrics {
    fn render(&self, o: &mut String, websocket_tunnels: i64) {
        header(
            o,
            "sweety_cache_requests_total",
            "counter",
            "Cacheable requests by result (hit, stale, miss).",
        );
        for (k, v) in [
            ("hit", &self.cache_hits),
            ("stale", &self.cache_stale),
            ("miss", &self.cache_misses),
        ] {
            let _ = writeln!(
                o,
                "sweety_cache_requests_total{{result=\"{k}\"}} {}",
                v.load(Relaxed)
            );
        }
        counter(
            o,
            "sweety_cache_evictions_total",
            "Cache entries evicted to stay within the byte bound.",
            self.cache_evictions.load(Relaxed),
        );
        counter(
            o,
            "sweety_cache_purged_total",
            "Cache entries removed by purge requests.",
            self.cache_purged.load(Relaxed),
        );
        gauge(
            o,
            "sweety_cache_bytes",
            "Bytes held by the response cache.",
            self.cache_bytes.load(Relaxed),
        );
        gauge(
            o,
            "sweety_cache_entries",
            "Entries held by the response cache.",
            self.cache_entries.load(Relaxed),
        );
        gauge(
            o,
            "sweety_websocket_tunnels",
            "Open WebSocket (upgrade) tunnels.",
            websocket_tunnels,
        );
    }
}

fn proto_index(p: Protocol) -> usize {
    match p {
        Protocol::Http1 => 0,
        Protocol::Http2 => 1,
        Protocol::Http3 => 2,
    }
}

impl Metrics {
    /// Counts one finished request.
    pub fn record_request(
        &self,
        listener: &Arc<str>,
        route: &Arc<str>,
        status: u16,
        proto: Protocol,
        elapsed: Duration,
    ) {
        let class = (status / 100).clamp(1, 5) as u8;
        self.requests.inc(listener, route, class, proto);
        self.latency[proto_index(proto)].observe(elapsed);
    }

    /// Counts one backpressure rejection.
    pub fn limit_hit(&self, limit: &'static str) {
        self.limit_rejections.inc(&limit);
    }

    /// Counts one upstream error.
    pub fn upstream_error(&self, kind: &'static str) {
        self.upstream_errors.inc(&kind);
    }

    /// Renders everything in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let o = &mut out;
        header(o, "sweety_requests_total", "counter", "Requests served.");
        for ((l, r, c, p), v) in self.requests.snapshot() {
            let _ = writeln!(
                o,
                "sweety_requests_total{{listener=\"{}\",route=\"{}\",status_class=\"{}xx\",protocol=\"{}\"}} {v}",
                esc(&l),
                esc(&r),
                c,
                p
            );
        }
        header(
            o,
            "sweety_request_duration_seconds",
            "histogram",
            "Request latency until the response head.",
        );
        for (i, proto) in [Protocol::Http1, Protocol::Http2, Protocol::Http3]
            .iter()
            .enumerate()
        {
            let h = &self.latency[i];
            let mut cum = 0;
            for (b, le) in h.buckets.iter().zip(LATENCY_BUCKETS) {
                cum += b.load(Relaxed);
                let _ = writeln!(
                    o,
                    "sweety_request_duration_seconds_bucket{{protocol=\"{}\",le=\"{le}\"}} {cum}",
                    proto.as_str()
                );
            }
            let count = h.count.load(Relaxed);
            let _ = writeln!(
                o,
                "sweety_request_duration_seconds_bucket{{protocol=\"{}\",le=\"+Inf\"}} {count}",
                proto.as_str()
            );
            let _ = writeln!(
                o,
                "sweety_request_duration_seconds_sum{{protocol=\"{}\"}} {}",
                proto.as_str(),
                h.sum_micros.load(Relaxed) as f64 / 1e6
            );
            let _ = writeln!(
                o,
                "sweety_request_duration_seconds_count{{protocol=\"{}\"}} {count}",
                proto.as_str()
            );
        }
        gauge(
            o,
            "sweety_active_connections",
            "Open client connections.",
            self.active_connections.load(Relaxed),
        );
        gauge(
            o,
            "sweety_active_requests",
            "Requests and streams in flight.",
            self.active_requests.load(Relaxed),
        );
        counter(
            o,
            "sweety_connections_total",
            "Client connections accepted.",
            self.connections_total.load(Relaxed),
        );
        counter(
            o,
            "sweety_received_bytes_total",
            "Request body bytes received.",
            self.bytes_received.load(Relaxed),
        );
        counter(
            o,
            "sweety_sent_bytes_total",
            "Response body bytes sent.",
            self.bytes_sent.load(Relaxed),
        );
        header(
            o,
            "sweety_backpressure_rejections_total",
            "counter",
            "Requests or connections refused by a limit.",
        );
        for (k, v) in self.limit_rejections.snapshot() {
            let _ = writeln!(
                o,
                "sweety_backpressure_rejections_total{{limit=\"{k}\"}} {v}"
            );
        }
        header(
            o,
            "sweety_upstream_errors_total",
            "counter",
            "Upstream errors by kind.",
        );
        for (k, v) in self.upstream_errors.snapshot() {
            let _ = writeln!(o, "sweety_upstream_errors_total{{kind=\"{k}\"}} {v}");
        }
        gauge(
            o,
            "sweety_config_generation",
            "Generation of the config being served.",
            self.config_generation.load(Relaxed) as i64,
        );
        header(
            o,
            "sweety_config_reloads_total",
            "counter",
            "Config reloads by result.",
        );
        let _ = writeln!(
            o,
            "sweety_config_reloads_total{{result=\"success\"}} {}",
            self.reloads_ok.load(Relaxed)
        );
        let _ = writeln!(
            o,
            "sweety_config_reloads_total{{result=\"failure\"}} {}",
            self.reloads_failed.load(Relaxed)
        );
        counter(
            o,
            "sweety_access_log_dropped_total",
            "Access log lines dropped because the writer fell behind.",
            self.access_log_dropped.load(Relaxed),
        );
        header(
            o,
            "sweety_health_checks_total",
            "counter",
            "Active health check results and endpoint state changes by backend.",
        );
        for ((b, r), v) in self.health_checks.snapshot() {
            let _ = writeln!(
                o,
                "sweety_health_checks_total{{backend=\"{}\",result=\"{r}\"}} {v}",
                esc(&b)
            );
        }
        header(
            o,
            "sweety_edge_events_total",
            "counter",
            "Access-rule refusals and layer-4 events by kind.",
        );
        for (k, v) in self.edge_events.snapshot() {
            let _ = writeln!(o, "sweety_edge_events_total{{kind=\"{k}\"}} {v}");
        }
        self.edge.render(o, self.websocket_tunnels.load(Relaxed));
        out
    }
}

fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(o: &mut String, name: &str, help: &str, v: u64) {
    header(o, name, "counter", help);
    let _ = writeln!(o, "{name} {v}");
}

fn gauge(o: &mut String, name: &str, help: &str, v: i64) {
    header(o, name, "gauge", help);
    let _ = writeln!(o, "{name} {v}");
}

/// Escapes a label value.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counters_are_found_by_name_not_by_allocation() {
        let m = Metrics::default();
        let (l, r) = (Arc::<str>::from("web"), Arc::<str>::from("a"));
        m.record_request(&l, &r, 200, Protocol::Http2, Duration::from_micros(10));
        m.record_request(&l, &r, 204, Protocol::Http2, Duration::from_micros(10));
        // A config reload makes new `Arc`s with the same names: the same counters.
        let (l2, r2) = (Arc::<str>::from("web"), Arc::<str>::from("a"));
        m.record_request(&l2, &r2, 503, Protocol::Http2, Duration::from_micros(10));
        m.record_request(&l2, &r2, 99, Protocol::Http1, Duration::from_micros(10));
        m.record_request(&l2, &Arc::from("b"), 404, Protocol::Http3, Duration::ZERO);
        assert_eq!(m.requests.get("web", "a", 2, Protocol::Http2), 2);
        assert_eq!(m.requests.get("web", "a", 5, Protocol::Http2), 1);
        assert_eq!(m.requests.get("web", "a", 1, Protocol::Http1), 1);
        assert_eq!(m.requests.get("web", "a", 2, Protocol::Http1), 0);
        assert_eq!(m.requests.get("web", "b", 4, Protocol::Http3), 1);
        assert_eq!(m.requests.get("other", "a", 2, Protocol::Http2), 0);
        let snap: Vec<_> = m
            .requests
            .snapshot()
            .into_iter()
            .map(|((l, r, c, p), n)| (l.to_string(), r.to_string(), c, p, n))
            .collect();
        let s = |l: &str, r: &str, c, p, n| (l.to_string(), r.to_string(), c, p, n);
        assert_eq!(
            snap,
            [
                s("web", "a", 1, "HTTP/1.1", 1),
                s("web", "a", 2, "HTTP/2", 2),
                s("web", "a", 5, "HTTP/2", 1),
                s("web", "b", 4, "HTTP/3", 1),
            ]
        );
        assert_eq!(m.latency[1].count(), 3);
    }

    #[test]
    fn renders_labelled_requests_and_histogram() {
        let m = Metrics::default();
        let l: Arc<str> = "web".into();
        let r: Arc<str> = "a\"b".into();
        m.record_request(&l, &r, 204, Protocol::Http2, Duration::from_millis(3));
        m.record_request(&l, &r, 503, Protocol::Http2, Duration::from_millis(30));
        m.limit_hit("max_requests_in_flight");
        let text = m.render();
        assert!(text.contains(
            "sweety_requests_total{listener=\"web\",route=\"a\\\"b\",status_class=\"2xx\",protocol=\"HTTP/2\"} 1"
        ));
        assert!(text.contains("status_class=\"5xx\""));
        assert!(text.contains(
            "sweety_request_duration_seconds_bucket{protocol=\"HTTP/2\",le=\"0.005\"} 1"
        ));
        assert!(text.contains("sweety_request_duration_seconds_count{protocol=\"HTTP/2\"} 2"));
        assert!(text
            .contains("sweety_backpressure_rejections_total{limit=\"max_requests_in_flight\"} 1"));
    }
}
