//! Per-route and per-backend request series: `sweety_requests_total` by listener, route,
//! backend, method and exact status code, the request and upstream latency histograms and the
//! request and response body bytes (`sweety_route_received_bytes_total`,
//! `sweety_route_sent_bytes_total`) by listener, route and backend.
//!
//! Label values are config names only (the listener, the route and the backend as the config
//! names them), never what a client sends, and their number is capped: at most
//! [`MAX_ROUTES`] distinct routes, [`MAX_BACKENDS`] distinct backends and [`MAX_SERIES`]
//! (listener, route, backend) triples; beyond that a request is counted under the route and
//! backend [`OTHER`]. Each triple keeps at most [`MAX_CODES`] (method, status) pairs; further
//! pairs count under the method and code `other`. [`RequestSeries::retain_routes`] drops the
//! series of routes a new config no longer has, so the caps apply to live routes.
//!
//! The request path takes a read lock on one map and finds its triple by borrowed names
//! (FNV-hashed: they come from the config), then bumps atomics; a write lock is taken only the
//! first time a triple or a (method, status) pair is seen.

use super::expo::{Exposition, Labels, Value};
use super::FnvBuild;
use prometheus_client::metrics::MetricType;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Most distinct route label values; further routes count under [`OTHER`].
pub const MAX_ROUTES: usize = 500;
/// Most distinct backend label values; further backends count under [`OTHER`].
pub const MAX_BACKENDS: usize = 500;
/// Most (listener, route, backend) triples; further ones count under ([`OTHER`], [`OTHER`]).
pub const MAX_SERIES: usize = 1000;
/// Most (method, status) pairs per triple; further ones count under method and code `other`.
pub const MAX_CODES: usize = 32;
/// Route label of a request no route matched.
pub const NO_ROUTE: &str = "-";
/// Label value of what is over a cap.
pub const OTHER: &str = "other";
/// Backend label of a response no backend made (static content, redirects, cache hits,
/// refusals, no route).
pub const NO_BACKEND: &str = "-";

/// Upper bounds (seconds) of the per-route request and upstream latency histograms: 1 ms to
/// 60 s (the default upstream timeouts fall inside).
pub const ROUTE_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Methods counted by name; any other counts as `other`.
const METHODS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE", "other",
];

/// The `method` label of a request: its name when standard, else `other` (a client chooses
/// the method: an extension method never makes a series of its own).
pub fn method_index(m: &http::Method) -> u8 {
    match *m {
        http::Method::GET => 0,
        http::Method::HEAD => 1,
        http::Method::POST => 2,
        http::Method::PUT => 3,
        http::Method::DELETE => 4,
        http::Method::PATCH => 5,
        http::Method::OPTIONS => 6,
        http::Method::CONNECT => 7,
        http::Method::TRACE => 8,
        _ => 9,
    }
}

/// A fixed-bucket latency histogram on atomics.
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds (seconds).
    pub fn new(bounds: &'static [f64]) -> AtomicHistogram {
        AtomicHistogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The exposition value.
    pub fn value(&self) -> Value {
        Value::Histogram {
            sum: self.sum_micros.load(Relaxed) as f64 / 1e6,
            count: self.count.load(Relaxed),
            buckets: self
                .bounds
                .iter()
                .zip(self.buckets.iter())
                .map(|(b, n)| (*b, n.load(Relaxed)))
                .collect(),
        }
    }
}

/// The counters and histograms of one (listener, route, backend) triple.
#[derive(Debug)]
pub struct Series {
    listener: Arc<str>,
    route: Arc<str>,
    backend: Arc<str>,
    /// Requests by `(method index << 16) | status`; `u32::MAX` is the overflow pair.
    codes: RwLock<Vec<(u32, AtomicU64)>>,
    duration: AtomicHistogram,
    upstream: AtomicHistogram,
    received_bytes: AtomicU64,
    sent_bytes: AtomicU64,
}

const OVERFLOW_CODE: u32 = u32::MAX;

impl Series {
    fn new(listener: Arc<str>, route: Arc<str>, backend: Arc<str>) -> Series {
        Series {
            listener,
            route,
            backend,
            codes: RwLock::new(Vec::new()),
            duration: AtomicHistogram::new(&ROUTE_BUCKETS),
            upstream: AtomicHistogram::new(&ROUTE_BUCKETS),
            received_bytes: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
        }
    }

    /// Counts response body bytes sent to the client.
    pub fn add_sent(&self, n: u64) {
        self.sent_bytes.fetch_add(n, Relaxed);
    }

    /// Counts request body bytes received from the client.
    pub fn add_received(&self, n: u64) {
        self.received_bytes.fetch_add(n, Relaxed);
    }

    fn count(&self, key: u32) {
        {
            let r = self.codes.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, n)) = r.iter().find(|(k, _)| *k == key) {
                n.fetch_add(1, Relaxed);
                return;
            }
        }
        let mut w = self.codes.write().unwrap_or_else(|e| e.into_inner());
        let key = if w.iter().any(|(k, _)| *k == key) || w.len() < MAX_CODES - 1 {
            key
        } else {
            OVERFLOW_CODE
        };
        match w.iter().find(|(k, _)| *k == key) {
            Some((_, n)) => {
                n.fetch_add(1, Relaxed);
            }
            None => w.push((key, AtomicU64::new(1))),
        }
    }
}

/// The borrowed names of a triple, so that a lookup needs no `Arc`.
trait Names {
    fn names(&self) -> (&str, &str, &str);
}

/// The owned key of the lookup map.
#[derive(Debug)]
struct Key(Arc<str>, Arc<str>, Arc<str>);

impl Names for Key {
    fn names(&self) -> (&str, &str, &str) {
        (&self.0, &self.1, &self.2)
    }
}

impl Names for (&str, &str, &str) {
    fn names(&self) -> (&str, &str, &str) {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn Names + 'a> for Key {
    fn borrow(&self) -> &(dyn Names + 'a) {
        self
    }
}

impl Hash for dyn Names + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.names().hash(h);
    }
}

impl PartialEq for dyn Names + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for dyn Names + '_ {}

// Hashed and compared exactly as its `dyn Names` view (what `Borrow` requires).
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.names().hash(h);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for Key {}

#[derive(Debug, Default)]
struct Inner {
    /// By the names a request carries (each overflowing triple maps to a shared series).
    lookup: HashMap<Key, Arc<Series>, FnvBuild>,
    /// By label values: what is exposed.
    by_labels: HashMap<Key, Arc<Series>, FnvBuild>,
    routes: HashSet<Arc<str>>,
    backends: HashSet<Arc<str>>,
}

/// One finished request, as [`RequestSeries::record`] counts it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Listener name.
    pub listener: &'a Arc<str>,
    /// Route name (`-` when none matched).
    pub route: &'a Arc<str>,
    /// Backend name ([`NO_BACKEND`] when no backend made the response).
    pub backend: &'a Arc<str>,
    /// [`method_index`] of the request method.
    pub method: u8,
    /// Response status.
    pub status: u16,
    /// Time until the response head.
    pub elapsed: Duration,
    /// Time the backend took to send the response head (last try), when one did.
    pub upstream: Option<Duration>,
}

/// The per-route and per-backend series.
#[derive(Debug)]
pub struct RequestSeries {
    inner: RwLock<Inner>,
    /// This instance among all (a key of the per-thread [`RECENT`] answers).
    id: u64,
    /// Bumped whenever a triple may find another series than before
    /// ([`RequestSeries::retain_routes`]): older per-thread answers are not used.
    generation: AtomicU64,
}

impl Default for RequestSeries {
    fn default() -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        RequestSeries {
            inner: RwLock::default(),
            id: IDS.fetch_add(1, Relaxed),
            generation: AtomicU64::new(0),
        }
    }
}

/// Slots of [`RECENT`].
const RECENT_SLOTS: usize = 16;

/// A series a thread found for a triple of names, by the names' very `Arc`s (held here, so
/// their addresses cannot be reused by other names while the answer is kept).
struct Recent {
    owner: u64,
    generation: u64,
    listener: Arc<str>,
    route: Arc<str>,
    backend: Arc<str>,
    series: Arc<Series>,
}

thread_local! {
    /// The series of the triples this thread counted last, in slots by the names' addresses:
    /// a request of the same listener, route and backend (config names, the same `Arc`s
    /// until a reload) finds its series without the map's lock, hash and string compares
    /// (~300 instructions per request, issue 23).
    static RECENT: std::cell::RefCell<[Option<Recent>; RECENT_SLOTS]> =
        const { std::cell::RefCell::new([const { None }; RECENT_SLOTS]) };
}

/// The [`RECENT`] slot of a triple: its names' addresses mixed.
fn recent_slot(l: &Arc<str>, r: &Arc<str>, b: &Arc<str>) -> usize {
    let addr = |a: &Arc<str>| Arc::as_ptr(a).cast::<u8>() as usize;
    let mix = (addr(l) >> 4) ^ (addr(r) >> 3) ^ (addr(b) >> 5);
    (mix ^ (mix >> 7)) % RECENT_SLOTS
}

impl RequestSeries {
    /// Counts one finished request; returns its series, for the body bytes counted later
    /// ([`Series::add_sent`], [`Series::add_received`]).
    pub fn record(&self, r: &Record<'_>) -> Arc<Series> {
        let series = self.find(r.listener, r.route, r.backend);
        series.count((u32::from(r.method) << 16) | u32::from(r.status));
        series.duration.observe(r.elapsed);
        if let Some(u) = r.upstream {
            series.upstream.observe(u);
        }
        series
    }

    /// The series of a triple: the one this thread found last for the same `Arc`s, else
    /// the map's (kept for the next request).
    fn find(&self, listener: &Arc<str>, route: &Arc<str>, backend: &Arc<str>) -> Arc<Series> {
        let slot = recent_slot(listener, route, backend);
        let generation = self.generation.load(Acquire);
        let hit = RECENT.with(|recent| {
            let recent = recent.borrow();
            recent[slot]
                .as_ref()
                .filter(|c| {
                    c.owner == self.id
                        && c.generation == generation
                        && Arc::ptr_eq(&c.route, route)
                        && Arc::ptr_eq(&c.backend, backend)
                        && Arc::ptr_eq(&c.listener, listener)
                })
                .map(|c| c.series.clone())
        });
        if let Some(s) = hit {
            return s;
        }
        let names: &dyn Names = &(&**listener, &**route, &**backend);
        let found = self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .lookup
            .get(names)
            .cloned();
        let series = match found {
            Some(s) => s,
            None => self.insert(listener, route, backend),
        };
        RECENT.with(|recent| {
            recent.borrow_mut()[slot] = Some(Recent {
                owner: self.id,
                generation,
                listener: listener.clone(),
                route: route.clone(),
                backend: backend.clone(),
                series: series.clone(),
            });
        });
        series
    }

    #[cold]
    fn insert(&self, listener: &Arc<str>, route: &Arc<str>, backend: &Arc<str>) -> Arc<Series> {
        let mut w = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let names: &dyn Names = &(&**listener, &**route, &**backend);
        if let Some(s) = w.lookup.get(names) {
            return s.clone();
        }
        let other: Arc<str> = Arc::from(OTHER);
        let capped = |set: &mut HashSet<Arc<str>>, name: &Arc<str>, max: usize| {
            if set.contains(name) || set.len() < max {
                set.insert(name.clone());
                name.clone()
            } else {
                other.clone()
            }
        };
        let mut labels = Key(
            listener.clone(),
            capped(&mut w.routes, route, MAX_ROUTES),
            capped(&mut w.backends, backend, MAX_BACKENDS),
        );
        if !w.by_labels.contains_key(&labels as &dyn Names) && w.by_labels.len() >= MAX_SERIES {
            labels = Key(other.clone(), other.clone(), other.clone());
        }
        let series = w
            .by_labels
            .entry(Key(labels.0.clone(), labels.1.clone(), labels.2.clone()))
            .or_insert_with(|| Arc::new(Series::new(labels.0, labels.1, labels.2)))
            .clone();
        // The lookup map is bounded too: names past it find their series on the slow path.
        if w.lookup.len() < 4 * MAX_SERIES {
            w.lookup.insert(
                Key(listener.clone(), route.clone(), backend.clone()),
                series.clone(),
            );
        }
        series
    }

    /// Drops the series of routes not in `live` (after a config change), so that the caps
    /// count the routes being served. The overflow series stay.
    pub fn retain_routes(&self, live: &HashSet<&str>) {
        let mut w = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let keep = |k: &Key| live.contains(&*k.1) || &*k.1 == OTHER || &*k.1 == NO_ROUTE;
        // Names that overflowed may fit now: the lookup map refills as requests come.
        w.lookup.clear();
        w.by_labels.retain(|k, _| keep(k));
        let (routes, backends): (HashSet<Arc<str>>, HashSet<Arc<str>>) = w
            .by_labels
            .keys()
            .map(|k| (k.1.clone(), k.2.clone()))
            .unzip();
        let (mut routes, mut backends) = (routes, backends);
        routes.remove(OTHER);
        backends.remove(OTHER);
        w.routes = routes;
        w.backends = backends;
        // Under the write lock: a request that reads the new generation finds the new maps.
        self.generation.fetch_add(1, Release);
    }

    /// Requests counted under these label values (tests and diagnostics); `method` and `code`
    /// as exposed (`GET`, `200`).
    pub fn get(&self, listener: &str, route: &str, backend: &str, method: &str, code: u16) -> u64 {
        let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let names: &dyn Names = &(listener, route, backend);
        let Some(s) = r.by_labels.get(names) else {
            return 0;
        };
        let Some(m) = METHODS.iter().position(|x| *x == method) else {
            return 0;
        };
        let key = ((m as u32) << 16) | u32::from(code);
        let codes = s.codes.read().unwrap_or_else(|e| e.into_inner());
        codes
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(0, |(_, n)| n.load(Relaxed))
    }

    /// True when the route `name` has a label of its own.
    pub fn has_route(&self, name: &str) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .routes
            .contains(name)
    }

    /// Entries of the lookup map (emptied by [`RequestSeries::retain_routes`]).
    #[cfg(test)]
    pub(crate) fn lookup_len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .lookup
            .len()
    }

    /// True when a cap is reached (some request may count under [`OTHER`]).
    pub fn full(&self) -> bool {
        let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
        r.routes.len() >= MAX_ROUTES
            || r.backends.len() >= MAX_BACKENDS
            || r.by_labels.len() >= MAX_SERIES
    }

    /// Number of exposed (listener, route, backend) triples.
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_labels
            .len()
    }

    /// True before any request was counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the five families to a scrape.
    pub fn expose(&self, e: &mut Exposition) {
        let r = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<&Arc<Series>> = r.by_labels.values().collect();
        all.sort_by(|a, b| {
            (&a.listener, &a.route, &a.backend).cmp(&(&b.listener, &b.route, &b.backend))
        });
        let base = |s: &Series| -> Labels {
            vec![
                ("listener", s.listener.to_string()),
                ("route", s.route.to_string()),
                ("backend", s.backend.to_string()),
            ]
        };
        let f = e.family(
            "sweety_requests_total",
            MetricType::Counter,
            "Requests by listener, route, backend, method and status code.",
        );
        for s in &all {
            let mut codes: Vec<(u32, u64)> = s
                .codes
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(k, n)| (*k, n.load(Relaxed)))
                .collect();
            codes.sort_unstable();
            for (k, n) in codes {
                let mut l = base(s);
                if k == OVERFLOW_CODE {
                    l.push(("method", OTHER.into()));
                    l.push(("code", OTHER.into()));
                } else {
                    l.push(("method", METHODS[(k >> 16) as usize].into()));
                    l.push(("code", (k & 0xffff).to_string()));
                }
                f.sample(l, Value::Counter(n));
            }
        }
        let f = e.family(
            "sweety_route_request_duration_seconds",
            MetricType::Histogram,
            "Time until the response head, by listener, route and backend.",
        );
        for s in &all {
            f.sample(base(s), s.duration.value());
        }
        let f = e.family(
            "sweety_upstream_response_duration_seconds",
            MetricType::Histogram,
            "Time the backend took to send the response head (last try), by listener, route and backend.",
        );
        for s in all.iter().filter(|s| s.upstream.count() > 0) {
            f.sample(base(s), s.upstream.value());
        }
        let f = e.family(
            "sweety_route_received_bytes_total",
            MetricType::Counter,
            "Request body bytes received from clients (proxied requests), by listener, route and backend.",
        );
        for s in &all {
            f.sample(base(s), Value::Counter(s.received_bytes.load(Relaxed)));
        }
        let f = e.family(
            "sweety_route_sent_bytes_total",
            MetricType::Counter,
            "Response body bytes sent to clients, by listener, route and backend.",
        );
        for s in &all {
            f.sample(base(s), Value::Counter(s.sent_bytes.load(Relaxed)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(l: &'a Arc<str>, r: &'a Arc<str>, b: &'a Arc<str>, status: u16) -> Record<'a> {
        Record {
            listener: l,
            route: r,
            backend: b,
            method: 0,
            status,
            elapsed: Duration::from_millis(3),
            upstream: Some(Duration::from_millis(2)),
        }
    }

    #[test]
    fn counts_by_exact_code_and_method_and_exposes_histograms() {
        let s = RequestSeries::default();
        let (l, r, b) = (
            Arc::from("web"),
            Arc::from("ns/route"),
            Arc::from("ns/svc:80"),
        );
        s.record(&rec(&l, &r, &b, 200));
        s.record(&rec(&l, &r, &b, 200));
        s.record(&Record {
            method: method_index(&http::Method::POST),
            ..rec(&l, &r, &b, 503)
        });
        s.record(&Record {
            method: method_index(&http::Method::from_bytes(b"BREW").unwrap()),
            upstream: None,
            ..rec(&l, &r, &b, 418)
        });
        assert_eq!(s.get("web", "ns/route", "ns/svc:80", "GET", 200), 2);
        assert_eq!(s.get("web", "ns/route", "ns/svc:80", "POST", 503), 1);
        assert_eq!(s.get("web", "ns/route", "ns/svc:80", "other", 418), 1);
        let mut e = Exposition::default();
        s.expose(&mut e);
        let text = e.render();
        for line in [
            "sweety_requests_total{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\",method=\"GET\",code=\"200\"} 2\n",
            "sweety_requests_total{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\",method=\"POST\",code=\"503\"} 1\n",
            "sweety_requests_total{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\",method=\"other\",code=\"418\"} 1\n",
            "sweety_route_request_duration_seconds_bucket{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\",le=\"0.0025\"} 0\n",
            "sweety_route_request_duration_seconds_bucket{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\",le=\"0.005\"} 4\n",
            "sweety_route_request_duration_seconds_count{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\"} 4\n",
            "sweety_upstream_response_duration_seconds_count{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\"} 3\n",
            "sweety_upstream_response_duration_seconds_bucket{listener=\"web\",route=\"ns/route\",backend=\"ns/svc:80\",le=\"0.0025\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn routes_backends_series_and_codes_are_capped() {
        let (l, r, b): (Arc<str>, Arc<str>, Arc<str>) =
            (Arc::from("web"), Arc::from("r0"), Arc::from("be"));
        // Routes: MAX_ROUTES of their own, the rest under `other`.
        let s = RequestSeries::default();
        for i in 0..MAX_ROUTES + 10 {
            s.record(&rec(&l, &Arc::from(format!("r{i}")), &b, 200));
        }
        assert_eq!(s.len(), MAX_ROUTES + 1);
        assert_eq!(s.get("web", OTHER, "be", "GET", 200), 10);
        assert_eq!(s.get("web", "r0", "be", "GET", 200), 1);
        assert!(s.full());
        // Backends: the same.
        let s = RequestSeries::default();
        for i in 0..MAX_BACKENDS + 5 {
            s.record(&rec(&l, &r, &Arc::from(format!("b{i}")), 200));
        }
        assert_eq!(s.len(), MAX_BACKENDS + 1);
        assert_eq!(s.get("web", "r0", OTHER, "GET", 200), 5);
        // Triples as a whole (listeners are config names too).
        let s = RequestSeries::default();
        for i in 0..MAX_SERIES + 5 {
            s.record(&rec(&Arc::from(format!("l{i}")), &r, &b, 200));
        }
        assert_eq!(s.len(), MAX_SERIES + 1);
        assert_eq!(s.get(OTHER, OTHER, OTHER, "GET", 200), 5);
        // (method, status) pairs per triple.
        let s = RequestSeries::default();
        assert!(!s.full());
        for code in 100..700u16 {
            s.record(&rec(&l, &r, &b, code));
        }
        let mut e = Exposition::default();
        s.expose(&mut e);
        let text = e.render();
        let ours = text
            .lines()
            .filter(|x| {
                x.starts_with("sweety_requests_total{listener=\"web\",route=\"r0\",backend=\"be\",")
            })
            .count();
        assert_eq!(ours, MAX_CODES, "{text}");
        assert!(text.contains(&format!(
            "sweety_requests_total{{listener=\"web\",route=\"r0\",backend=\"be\",method=\"other\",code=\"other\"}} {}",
            600 - (MAX_CODES - 1)
        )));
    }

    #[test]
    fn a_thread_s_recent_answer_is_its_own_instance_s_and_names_by_content_agree() {
        let (l, r, b): (Arc<str>, Arc<str>, Arc<str>) =
            (Arc::from("web"), Arc::from("r"), Arc::from("be"));
        let one = RequestSeries::default();
        let two = RequestSeries::default();
        for _ in 0..3 {
            one.record(&rec(&l, &r, &b, 200));
        }
        two.record(&rec(&l, &r, &b, 200));
        // Other `Arc`s of the same names: the same series (found by content).
        let (l2, r2, b2): (Arc<str>, Arc<str>, Arc<str>) =
            (Arc::from("web"), Arc::from("r"), Arc::from("be"));
        one.record(&rec(&l2, &r2, &b2, 200));
        // Other names at any address: their own series.
        for i in 0..2 * RECENT_SLOTS {
            one.record(&rec(&l, &Arc::from(format!("r{i}")), &b, 200));
        }
        one.record(&rec(&l, &r, &b, 200));
        assert_eq!(one.get("web", "r", "be", "GET", 200), 5);
        assert_eq!(two.get("web", "r", "be", "GET", 200), 1);
        assert_eq!(one.get("web", "r0", "be", "GET", 200), 1);
        assert_eq!(one.len(), 1 + 2 * RECENT_SLOTS);
    }

    #[test]
    fn retain_routes_frees_the_cap() {
        let s = RequestSeries::default();
        let (l, b) = (Arc::from("web"), Arc::from("be"));
        for i in 0..MAX_ROUTES {
            s.record(&rec(&l, &Arc::from(format!("old{i}")), &b, 200));
        }
        let fresh: Arc<str> = Arc::from("fresh");
        s.record(&rec(&l, &fresh, &b, 200));
        assert_eq!(s.get("web", "fresh", "be", "GET", 200), 0, "over the cap");
        s.retain_routes(&HashSet::from(["fresh"]));
        s.record(&rec(&l, &fresh, &b, 200));
        assert_eq!(s.get("web", "fresh", "be", "GET", 200), 1);
        assert_eq!(s.get("web", "old0", "be", "GET", 200), 0);
    }
}
