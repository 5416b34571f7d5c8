//! Instructions per "record one finished request" in the dataplane's per-route series:
//! `hand` is the dataplane's own `RequestSeries::record` (dataplane/src/metrics/series.rs,
//! compiled in from the source tree: lookup by borrowed names, a small map of (method, code)
//! counters, two atomic histograms); `lib`
//! records the same with prometheus-client's `Family` and `Histogram`; `none` only loops.
//! Count with `valgrind --tool=callgrind` (see Cargo.toml) and subtract the `none` run.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram as PcHistogram;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Default)]
struct Fnv(u64);
impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for x in b {
            h ^= u64::from(*x);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}
type FnvB = BuildHasherDefault<Fnv>;

#[derive(Clone, Hash, PartialEq, Eq, Debug, EncodeLabelSet)]
struct ReqLabels {
    route: Arc<str>,
    backend: Arc<str>,
    method: &'static str,
    code: u16,
}
#[derive(Clone, Hash, PartialEq, Eq, Debug, EncodeLabelSet)]
struct RbLabels {
    route: Arc<str>,
    backend: Arc<str>,
}

struct Lib {
    req: Family<ReqLabels, Counter>,
    dur: Family<RbLabels, PcHistogram, fn() -> PcHistogram>,
    up: Family<RbLabels, PcHistogram, fn() -> PcHistogram>,
}
fn mk() -> PcHistogram {
    PcHistogram::new(BUCKETS)
}
impl Lib {
    #[inline(never)]
    fn record(
        &self,
        route: &Arc<str>,
        backend: &Arc<str>,
        method: &'static str,
        code: u16,
        d: Duration,
        up: Duration,
    ) {
        self.req
            .get_or_create(&ReqLabels {
                route: route.clone(),
                backend: backend.clone(),
                method,
                code,
            })
            .inc();
        let rb = RbLabels {
            route: route.clone(),
            backend: backend.clone(),
        };
        self.dur.get_or_create(&rb).observe(d.as_secs_f64());
        self.up.get_or_create(&rb).observe(up.as_secs_f64());
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap();
    let n: u64 = std::env::args().nth(2).unwrap().parse().unwrap();
    let threads: u64 = std::env::args().nth(3).map_or(1, |t| t.parse().unwrap());
    let route: Arc<str> = "httproute/default/shop/rule-0".into();
    let backend: Arc<str> = "default/shop-svc:8080".into();
    let slot = Arc::new(series::RequestSeries::default());
    let listener: Arc<str> = "websecure".into();
    let lib = Arc::new(Lib {
        req: Family::default(),
        dur: Family::new_with_constructor(mk),
        up: Family::new_with_constructor(mk),
    });
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (mode, route, backend, slot, lib, listener) = (
                mode.clone(),
                route.clone(),
                backend.clone(),
                slot.clone(),
                lib.clone(),
                listener.clone(),
            );
            std::thread::spawn(move || {
                for i in 0..n / threads {
                    let code = if i % 16 == 0 { 404 } else { 200 };
                    let d = Duration::from_micros(300 + (i % 7) * 100 + t);
                    match mode.as_str() {
                        "none" => {
                            std::hint::black_box((&route, &backend, code, d));
                        }
                        "hand" => slot.record(&series::Record {
                            listener: &listener,
                            route: &route,
                            backend: &backend,
                            method: 0,
                            status: std::hint::black_box(code),
                            elapsed: d,
                            upstream: Some(d / 2),
                        }),
                        "lib" => lib.record(
                            &route,
                            &backend,
                            "read",
                            std::hint::black_box(code),
                            d,
                            d / 2,
                        ),
                        _ => panic!(),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut s = String::new();
    if mode == "lib" {
        let mut r = prometheus_client::registry::Registry::default();
        r.register("x_requests", "h", lib.req.clone());
        prometheus_client::encoding::prometheus_text::encode(&mut s, &r).unwrap();
    }
    eprintln!("{}", s.len());
}

// The dataplane's metrics modules, compiled from its sources (they name `super::expo` and
// `super::FnvBuild`: the crate root here).
#[path = "../../../../dataplane/src/metrics/expo.rs"]
#[allow(dead_code)]
mod expo;
#[path = "../../../../dataplane/src/metrics/series.rs"]
#[allow(dead_code)]
mod series;
use FnvB as FnvBuild;
