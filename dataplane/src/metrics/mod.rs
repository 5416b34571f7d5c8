//! Dataplane metrics: atomic counters, gauges and latency histograms, exposed in the
//! Prometheus text format by [`Metrics::render`] through `prometheus-client`'s encoder
//! ([`expo`]). Every metric, its labels and their bounds: docs/observability.md.
//!
//! Hot-path updates are lock-free atomics; labelled counters take a read lock on a small map
//! and only a write lock the first time a label set is seen. Label values are names from the
//! config (listeners, routes, backends) or fixed words, never client input, and the
//! per-route and per-backend ones are capped ([`series`]).

pub mod expo;
pub mod series;

use crate::ctx::Protocol;
use expo::{Exposition, Value};
use prometheus_client::metrics::MetricType;
pub use series::{
    method_index, AtomicHistogram, Record, RequestSeries, MAX_BACKENDS, NO_BACKEND, OTHER,
};
use std::collections::HashMap;
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

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

    /// Keeps the counters whose key `keep` accepts.
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep(k));
    }

    /// Number of label sets counted.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True before anything was counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

/// A request latency histogram over [`LATENCY_BUCKETS`] (one per protocol): an
/// [`AtomicHistogram`], the one histogram type of the metrics.
#[derive(Debug)]
pub struct Histogram(AtomicHistogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(AtomicHistogram::new(&LATENCY_BUCKETS))
    }
}

impl std::ops::Deref for Histogram {
    type Target = AtomicHistogram;

    fn deref(&self) -> &AtomicHistogram {
        &self.0
    }
}

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

/// All dataplane metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests and their latency by listener, route, backend (method and status code).
    pub requests: RequestSeries,
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
    /// Upstream errors by backend and kind (`connect`, `connect_timeout`, `tls`, `timeout`,
    /// `protocol`, `no_endpoint`…).
    pub upstream_errors: LabeledCounter<(Arc<str>, &'static str)>,
    /// Tries after the first, by backend.
    pub upstream_retries: LabeledCounter<Arc<str>>,
    /// Endpoints ejected by outlier detection, by backend.
    pub upstream_ejections: LabeledCounter<Arc<str>>,
    /// Backend names given a label of their own so far (at most [`MAX_BACKENDS`]).
    backend_labels: Mutex<HashSet<Arc<str>>>,
    /// Time each config apply took (validate, build, bind, swap), success or not.
    pub config_apply: ApplyHistogram,
    /// TLS handshakes completed, by listener, transport (`tcp`, `quic`) and version.
    pub tls_handshakes: LabeledCounter<(Arc<str>, &'static str, &'static str)>,
    /// TLS handshakes failed, by listener, transport and reason (`error`, `timeout`).
    pub tls_handshake_errors: LabeledCounter<(Arc<str>, &'static str, &'static str)>,
    /// HTTP/3 requests received in 0-RTT early data, by listener.
    pub early_data_requests: LabeledCounter<Arc<str>>,
    /// QUIC connection migrations seen, by listener: the client's address changed (a new
    /// path quinn validated: NAT rebinding, Wi-Fi to cellular) between two requests of a
    /// connection, or before its end.
    pub quic_migrations: LabeledCounter<Arc<str>>,
    /// End of validity of the served certificates: (listener, first hostname, Unix seconds),
    /// at most [`MAX_CERTIFICATES`], set by each full config apply.
    pub certificates: Mutex<Vec<(String, String, i64)>>,
    /// Generation of the config being served.
    pub config_generation: AtomicU64,
    /// Successful config reloads.
    pub reloads_ok: AtomicU64,
    /// Rejected config reloads.
    pub reloads_failed: AtomicU64,
    /// Access log lines dropped because the writer fell behind.
    pub access_log_dropped: AtomicU64,
    /// Finished trace spans by outcome: `exported` (the receiver accepted them), `rejected`
    /// (the receiver answered success but counted them in `partial_success.rejected_spans`),
    /// `dropped` (the export queue was full), `failed` (the export request failed, was refused
    /// or timed out).
    pub trace_spans: LabeledCounter<&'static str>,
    /// Connections accepted, all time.
    pub connections_total: AtomicU64,
    /// Edge features: active health check results by backend label
    /// ([`Metrics::backend_label`]) and result (`pass`, `fail`), and endpoint state changes
    /// (`down`, `up`).
    pub health_checks: LabeledCounter<(Arc<str>, &'static str)>,
    /// Edge features: requests refused by access rules (`ip_denied`, `rate_limited`) and
    /// layer-4 and protocol events (`l4_no_route`, `udp_session_limit`, `proxy_protocol_error`,
    /// `h2_connection_error`, `h2_blocked_at_eof`…).
    pub edge_events: LabeledCounter<&'static str>,
    /// Response cache and WebSocket tunnel figures.
    pub edge: EdgeMetrics,
    /// Open WebSocket (upgrade) tunnels.
    pub websocket_tunnels: AtomicI64,
}

/// Most certificates in `sweety_tls_certificate_expiry_timestamp_seconds`.
pub const MAX_CERTIFICATES: usize = 500;

/// The config apply latency histogram.
#[derive(Debug)]
pub struct ApplyHistogram(pub AtomicHistogram);

/// Upper bounds (seconds) of the config apply histogram.
pub const APPLY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

impl Default for ApplyHistogram {
    fn default() -> Self {
        ApplyHistogram(AtomicHistogram::new(&APPLY_BUCKETS))
    }
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
    fn expose(&self, e: &mut Exposition, websocket_tunnels: i64) {
        let f = e.family(
            "sweety_cache_requests_total",
            MetricType::Counter,
            "Cacheable requests by result (hit, stale, miss).",
        );
        for (k, v) in [
            ("hit", &self.cache_hits),
            ("stale", &self.cache_stale),
            ("miss", &self.cache_misses),
        ] {
            f.sample(vec![("result", k.into())], Value::Counter(v.load(Relaxed)));
        }
        e.counter(
            "sweety_cache_evictions_total",
            "Cache entries evicted to stay within the byte bound.",
            self.cache_evictions.load(Relaxed),
        );
        e.counter(
            "sweety_cache_purged_total",
            "Cache entries removed by purge requests.",
            self.cache_purged.load(Relaxed),
        );
        e.gauge(
            "sweety_cache_bytes",
            "Bytes held by the response cache.",
            self.cache_bytes.load(Relaxed),
        );
        e.gauge(
            "sweety_cache_entries",
            "Entries held by the response cache.",
            self.cache_entries.load(Relaxed),
        );
        e.gauge(
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
    /// Counts one finished request: in the per-route series and in the latency histogram of
    /// its protocol. Returns the request's series (for its body bytes, counted later).
    pub fn record_request(&self, r: &Record<'_>, proto: Protocol) -> Arc<series::Series> {
        self.latency[proto_index(proto)].observe(r.elapsed);
        self.requests.record(r)
    }

    /// Counts one backpressure rejection.
    pub fn limit_hit(&self, limit: &'static str) {
        self.limit_rejections.inc(&limit);
    }

    /// Counts one upstream error where no backend is known (layer-4 targets, mirrors).
    pub fn upstream_error(&self, kind: &'static str) {
        static NONE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        let none = NONE.get_or_init(|| Arc::from(NO_BACKEND));
        self.upstream_errors.inc(&(none.clone(), kind));
    }

    /// Counts one upstream error of `backend` (a label from [`Metrics::backend_label`]).
    pub fn upstream_error_of(&self, backend: &Arc<str>, kind: &'static str) {
        self.upstream_errors.inc(&(backend.clone(), kind));
    }

    /// Upstream errors of `kind` over every backend (tests and diagnostics).
    pub fn upstream_errors_of_kind(&self, kind: &str) -> u64 {
        self.upstream_errors
            .snapshot()
            .into_iter()
            .filter(|((_, k), _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }

    /// The label value for a backend of the config: its name while fewer than
    /// [`MAX_BACKENDS`] names have one, else [`OTHER`]. Taken once per backend per config
    /// build, never per request.
    pub fn backend_label(&self, name: &str) -> Arc<str> {
        let mut set = self
            .backend_labels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(l) = set.get(name) {
            return l.clone();
        }
        if set.len() >= MAX_BACKENDS {
            return Arc::from(OTHER);
        }
        let l: Arc<str> = Arc::from(name);
        set.insert(l.clone());
        l
    }

    /// True when [`MAX_BACKENDS`] backend names have a label.
    pub fn backend_labels_full(&self) -> bool {
        self.backend_labels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
            >= MAX_BACKENDS
    }

    /// Keeps the labels of the backends in `live` only (after a config change), so that the
    /// cap counts the backends being served, and drops the per-backend counters of the others:
    /// the counter maps then hold at most [`MAX_BACKENDS`] backends (plus [`OTHER`] and
    /// [`NO_BACKEND`]) however many backends configs have named over time.
    pub fn retain_backend_labels(&self, live: &HashSet<&str>) {
        let mut labels = self
            .backend_labels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        labels.retain(|l| live.contains(&**l));
        let keep = |b: &Arc<str>| labels.contains(b) || &**b == OTHER || &**b == NO_BACKEND;
        self.upstream_errors.retain(|(b, _)| keep(b));
        self.upstream_retries.retain(keep);
        self.upstream_ejections.retain(keep);
        self.health_checks.retain(|(b, _)| keep(b));
    }

    /// Drops the per-listener counters (TLS handshakes, their failures, 0-RTT requests,
    /// QUIC migrations) of
    /// listeners not in `live` (after a config with new settings), so that those maps hold
    /// the listeners being served, not every name configs have used.
    pub fn retain_listeners(&self, live: &HashSet<&str>) {
        self.tls_handshakes.retain(|(l, _, _)| live.contains(&**l));
        self.tls_handshake_errors
            .retain(|(l, _, _)| live.contains(&**l));
        self.early_data_requests.retain(|l| live.contains(&**l));
        self.quic_migrations.retain(|l| live.contains(&**l));
    }

    /// Every family of a scrape, with its samples.
    pub fn exposition(&self) -> Exposition {
        let mut e = Exposition::default();
        self.requests.expose(&mut e);
        let f = e.family(
            "sweety_request_duration_seconds",
            MetricType::Histogram,
            "Request latency until the response head, by protocol.",
        );
        for (i, proto) in [Protocol::Http1, Protocol::Http2, Protocol::Http3]
            .iter()
            .enumerate()
        {
            f.sample(
                vec![("protocol", proto.as_str().into())],
                self.latency[i].value(),
            );
        }
        e.gauge(
            "sweety_active_connections",
            "Open client connections.",
            self.active_connections.load(Relaxed),
        );
        e.gauge(
            "sweety_active_requests",
            "Requests and streams in flight.",
            self.active_requests.load(Relaxed),
        );
        e.counter(
            "sweety_connections_total",
            "Client connections accepted.",
            self.connections_total.load(Relaxed),
        );
        e.counter(
            "sweety_received_bytes_total",
            "Request body bytes received.",
            self.bytes_received.load(Relaxed),
        );
        e.counter(
            "sweety_sent_bytes_total",
            "Response body bytes sent.",
            self.bytes_sent.load(Relaxed),
        );
        let f = e.family(
            "sweety_backpressure_rejections_total",
            MetricType::Counter,
            "Requests or connections refused by a limit.",
        );
        for (k, v) in self.limit_rejections.snapshot() {
            f.sample(vec![("limit", k.into())], Value::Counter(v));
        }
        let f = e.family(
            "sweety_upstream_errors_total",
            MetricType::Counter,
            "Upstream errors by backend and kind (retried tries included).",
        );
        for ((b, k), v) in self.upstream_errors.snapshot() {
            f.sample(
                vec![("backend", b.to_string()), ("kind", k.into())],
                Value::Counter(v),
            );
        }
        let f = e.family(
            "sweety_upstream_retries_total",
            MetricType::Counter,
            "Tries after the first, by backend.",
        );
        for (b, v) in self.upstream_retries.snapshot() {
            f.sample(vec![("backend", b.to_string())], Value::Counter(v));
        }
        let f = e.family(
            "sweety_upstream_ejections_total",
            MetricType::Counter,
            "Endpoints ejected by outlier detection, by backend.",
        );
        for (b, v) in self.upstream_ejections.snapshot() {
            f.sample(vec![("backend", b.to_string())], Value::Counter(v));
        }
        e.gauge(
            "sweety_config_generation",
            "Generation of the config being served.",
            self.config_generation.load(Relaxed) as i64,
        );
        let f = e.family(
            "sweety_config_reloads_total",
            MetricType::Counter,
            "Config reloads by result.",
        );
        f.sample(
            vec![("result", "success".into())],
            Value::Counter(self.reloads_ok.load(Relaxed)),
        );
        f.sample(
            vec![("result", "failure".into())],
            Value::Counter(self.reloads_failed.load(Relaxed)),
        );
        e.family(
            "sweety_config_apply_duration_seconds",
            MetricType::Histogram,
            "Time one config apply took (validate, build, bind, swap), success or not.",
        )
        .sample(Vec::new(), self.config_apply.0.value());
        let f = e.family(
            "sweety_tls_handshakes_total",
            MetricType::Counter,
            "TLS handshakes completed, by listener, transport (tcp, quic) and TLS version.",
        );
        for ((l, t, v), n) in self.tls_handshakes.snapshot() {
            f.sample(
                vec![
                    ("listener", l.to_string()),
                    ("transport", t.into()),
                    ("version", v.into()),
                ],
                Value::Counter(n),
            );
        }
        let f = e.family(
            "sweety_tls_handshake_errors_total",
            MetricType::Counter,
            "TLS handshakes failed, by listener, transport and reason (error, timeout).",
        );
        for ((l, t, r), n) in self.tls_handshake_errors.snapshot() {
            f.sample(
                vec![
                    ("listener", l.to_string()),
                    ("transport", t.into()),
                    ("reason", r.into()),
                ],
                Value::Counter(n),
            );
        }
        let f = e.family(
            "sweety_http3_early_data_requests_total",
            MetricType::Counter,
            "HTTP/3 requests received in 0-RTT early data, by listener.",
        );
        for (l, n) in self.early_data_requests.snapshot() {
            f.sample(vec![("listener", l.to_string())], Value::Counter(n));
        }
        let f = e.family(
            "sweety_http3_connection_migrations_total",
            MetricType::Counter,
            "QUIC connection migrations (the client's address changed on a validated path), by listener.",
        );
        for (l, n) in self.quic_migrations.snapshot() {
            f.sample(vec![("listener", l.to_string())], Value::Counter(n));
        }
        let f = e.family(
            "sweety_tls_certificate_expiry_timestamp_seconds",
            MetricType::Gauge,
            "End of validity (Unix time) of each served certificate, by listener and its first hostname.",
        );
        for (l, h, t) in self
            .certificates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            f.sample(
                vec![("listener", l.clone()), ("hostname", h.clone())],
                Value::Gauge(*t),
            );
        }
        e.counter(
            "sweety_access_log_dropped_total",
            "Access log lines dropped because the writer fell behind.",
            self.access_log_dropped.load(Relaxed),
        );
        let f = e.family(
            "sweety_trace_spans_total",
            MetricType::Counter,
            "Finished trace spans by outcome (exported; rejected: by the receiver's partial success; dropped: export queue full; failed: export failed).",
        );
        for (k, v) in self.trace_spans.snapshot() {
            f.sample(vec![("outcome", k.into())], Value::Counter(v));
        }
        let f = e.family(
            "sweety_health_checks_total",
            MetricType::Counter,
            "Active health check results and endpoint state changes by backend.",
        );
        for ((b, r), v) in self.health_checks.snapshot() {
            f.sample(
                vec![("backend", b.to_string()), ("result", r.into())],
                Value::Counter(v),
            );
        }
        let f = e.family(
            "sweety_edge_events_total",
            MetricType::Counter,
            "Access-rule refusals and layer-4 events by kind.",
        );
        for (k, v) in self.edge_events.snapshot() {
            f.sample(vec![("kind", k.into())], Value::Counter(v));
        }
        self.edge
            .expose(&mut e, self.websocket_tunnels.load(Relaxed));
        e
    }

    /// Renders everything in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        self.exposition().render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renders_requests_by_route_and_protocol_histogram() {
        let m = Metrics::default();
        let (l, r, b) = (
            Arc::<str>::from("web"),
            Arc::<str>::from("a\"b"),
            Arc::from("-"),
        );
        let rec = |status, ms| Record {
            listener: &l,
            route: &r,
            backend: &b,
            method: 0,
            status,
            elapsed: Duration::from_millis(ms),
            upstream: None,
        };
        m.record_request(&rec(204, 3), Protocol::Http2);
        m.record_request(&rec(503, 30), Protocol::Http2);
        m.limit_hit("max_requests_in_flight");
        m.upstream_error("connect");
        let text = m.render();
        for line in [
            "sweety_requests_total{listener=\"web\",route=\"a\\\"b\",backend=\"-\",method=\"GET\",code=\"204\"} 1\n",
            "sweety_requests_total{listener=\"web\",route=\"a\\\"b\",backend=\"-\",method=\"GET\",code=\"503\"} 1\n",
            "sweety_request_duration_seconds_bucket{protocol=\"HTTP/2\",le=\"0.005\"} 1\n",
            "sweety_request_duration_seconds_count{protocol=\"HTTP/2\"} 2\n",
            "sweety_backpressure_rejections_total{limit=\"max_requests_in_flight\"} 1\n",
            "sweety_upstream_errors_total{backend=\"-\",kind=\"connect\"} 1\n",
            "# TYPE sweety_requests_total counter\n",
            "# TYPE sweety_config_apply_duration_seconds histogram\n",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert_eq!(m.latency[1].count(), 2);
    }

    #[test]
    fn backend_labels_are_capped() {
        let m = Metrics::default();
        for i in 0..MAX_BACKENDS {
            assert_eq!(&*m.backend_label(&format!("b{i}")), format!("b{i}"));
        }
        assert_eq!(&*m.backend_label("one-too-many"), OTHER);
        assert_eq!(&*m.backend_label("b0"), "b0");
    }

    /// Configs that keep naming new backends: after each apply that fills the label set, the
    /// per-backend counters of backends no longer served go with their labels, so the maps
    /// stay bounded (they grew by one key per backend ever seen before).
    #[test]
    fn per_backend_counters_stay_bounded_across_config_churn() {
        let m = Metrics::default();
        for round in 0..3 * MAX_BACKENDS {
            let name = format!("gen{round}");
            let label = m.backend_label(&name);
            m.upstream_error_of(&label, "connect");
            m.upstream_retries.inc(&label);
            m.upstream_ejections.inc(&label);
            m.health_checks.inc(&(label.clone(), "pass"));
            if m.backend_labels_full() {
                m.retain_backend_labels(&HashSet::from([name.as_str()]));
            }
        }
        m.upstream_error("connect");
        for n in [
            m.upstream_errors.len(),
            m.upstream_retries.len(),
            m.upstream_ejections.len(),
            m.health_checks.len(),
        ] {
            assert!(n <= MAX_BACKENDS + 2, "{n} keys");
        }
        // The live backend and the no-backend series survive the pruning.
        let last: Arc<str> = Arc::from(format!("gen{}", 3 * MAX_BACKENDS - 1).as_str());
        assert_eq!(m.upstream_errors.get(&(last, "connect")), 1);
        assert_eq!(
            m.upstream_errors.get(&(Arc::from(NO_BACKEND), "connect")),
            1
        );
    }
}
