//! Scale benchmark for the controller → dataplane path (not a test: it prints numbers).
//!
//! Builds a snapshot with one Gateway and N HTTPRoutes (plus Services and EndpointSlices),
//! then measures, against a real `sweety-dataplane --control-socket` process:
//! - translate (`TranslateCache::update`, empty cache), hash (`Pusher::submit`) and
//!   push-until-Ack of the whole config;
//! - single-route changes: incremental translate (`TranslateCache::update`, the reconcile
//!   loop's path) + submit (tree hash over the items' digests) + push as an `ApplyDelta` until
//!   Ack, p50/p99 over M changes;
//! - dataplane RSS with N routes (from /proc/PID/status) and this process's RSS holding the
//!   snapshot of every object.
//!
//! Usage: scale SOCKET DATAPLANE_PID [ROUTES=5000] [CHANGES=200]
//! (e2e/bench/controller.sh starts the dataplane and runs this.)

use std::sync::Arc;
use std::time::{Duration, Instant};
use sweety_controller::push::{PushOptions, Pusher};
use sweety_controller::translate::{scale_world, Params, Snapshot, TranslateCache};
use sweety_gateway_api::httproutes::HttpRoute;

/// The same allocator as the controller binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_kib(pid: &str) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn hwm_kib(pid: &str) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used so far, from /proc/PID/stat (clock ticks of
/// 10 ms: meaningful summed over many changes, not for one).
fn cpu_ms(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at `) `.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    ticks as f64 * 10.0
}

/// CPU time this thread has run so far, in ms (/proc/thread-self/schedstat, nanoseconds):
/// what a step cost independent of how long other processes kept it waiting.
fn thread_cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e6)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn wait_acked(pusher: &Pusher, generation: u64) {
    let mut state = pusher.state();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        {
            let s = state.borrow_and_update();
            if s.acked >= generation {
                return;
            }
            if let Some((g, errors)) = &s.last_nack {
                if *g >= generation {
                    panic!("dataplane rejected generation {g}: {errors:?}");
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no Ack for generation {generation} within 30s"
        );
        let _ = tokio::time::timeout(left, state.changed()).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: scale SOCKET DATAPLANE_PID [ROUTES] [CHANGES]");
        std::process::exit(2);
    }
    let socket = &args[1];
    let pid = &args[2];
    let routes: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(5000);
    let changes: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(200);
    let params = Params {
        listen_address: "127.0.0.1".into(),
        ..Params::default()
    };

    let (mut snap, _): (Snapshot, _) =
        Snapshot::from_yaml(&scale_world(routes, 50)).expect("objects");
    let objects_total = 2 + routes + 100;
    let rss_idle = rss_kib(pid);

    let pusher = Pusher::spawn(PushOptions {
        socket: socket.into(),
        ..PushOptions::default()
    });
    // Wait for the connection so that the first push measures the push, not the connect.
    {
        let mut state = pusher.state();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !state.borrow_and_update().connected && Instant::now() < deadline {
            let _ = tokio::time::timeout(Duration::from_millis(100), state.changed()).await;
        }
    }
    // The controller's path: translate with the per-route cache (empty on the first run), then
    // `Pusher::submit` (hash, queue), then the push until the dataplane's Ack.
    let mut cache = TranslateCache::default();
    let t0 = Instant::now();
    let cpu0 = thread_cpu_ms();
    let out = cache.update(&snap, &params);
    let t_translate = t0.elapsed();
    let cpu_translate = thread_cpu_ms() - cpu0;
    let routes_out: usize = out
        .config
        .virtual_hosts
        .iter()
        .map(|v| v.value.routes.len())
        .sum();
    let t1 = Instant::now();
    let generation = pusher.submit(out.config.clone());
    let t_encode = t1.elapsed();
    let t2 = Instant::now();
    wait_acked(&pusher, generation).await;
    let t_push = t2.elapsed();
    let total = t0.elapsed();
    let bytes = pusher.metrics().last_config_bytes;
    println!("objects={objects_total} httproutes={routes} dataplane_routes={routes_out} apply_frame_bytes={bytes}");
    println!(
        "full: translate={:.1}ms digests+hash={:.1}ms encode+push+decode+validate+apply+ack={:.1}ms total={:.1}ms (target < 200ms); translate CPU {cpu_translate:.1}ms",
        ms(t_translate),
        ms(t_encode),
        ms(t_push),
        ms(total)
    );
    let rss_full = rss_kib(pid);

    // Single-route changes. The clock starts where the reconcile loop learns of a watch event
    // (the edited object is in the snapshot); then what `run.rs` does: translate with the
    // cache, `Pusher::submit`, and the dataplane applies and acknowledges.
    let mut lat = Vec::with_capacity(changes);
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    let (cpu_self, cpu_dp) = (cpu_ms("self"), cpu_ms(pid));
    for i in 0..changes {
        let idx = (i * 7919) % snap.http_routes.len();
        let mut route: HttpRoute = (*snap.http_routes[idx]).clone();
        if let Some(rules) = route.spec.rules.as_mut() {
            if let Some(m) = rules[0].matches.as_mut().and_then(|m| m.first_mut()) {
                if let Some(p) = m.path.as_mut() {
                    p.value = Some(format!("/api/v{i}"));
                }
            }
        }
        route.metadata.resource_version = Some(format!("{}", i + 2));
        snap.http_routes[idx] = Arc::new(route);
        let t = Instant::now();
        let config = cache.update(&snap, &params).config.clone();
        let t_tr = t.elapsed();
        assert_eq!(cache.stats().translated, 1, "one route translated again");
        let generation = pusher.submit(config);
        let t_sub = t.elapsed();
        wait_acked(&pusher, generation).await;
        let total = t.elapsed();
        lat.push(total);
        parts[0].push(t_tr);
        parts[1].push(t_sub - t_tr);
        parts[2].push(total - t_sub);
    }
    let per_change = |before: f64, now: f64| (now - before) / changes.max(1) as f64;
    let (cpu_self, cpu_dp) = (
        per_change(cpu_self, cpu_ms("self")),
        per_change(cpu_dp, cpu_ms(pid)),
    );
    lat.sort();
    for p in parts.iter_mut() {
        p.sort();
    }
    println!(
        "single route change → Ack over {changes} changes: p50={:.2}ms p99={:.2}ms max={:.2}ms (targets p50 < 10ms, p99 < 50ms)",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    let m = pusher.metrics();
    println!(
        "  pushes={} of which ApplyDelta={}; last frame {} bytes",
        m.pushes, m.deltas, m.last_config_bytes
    );
    println!(
        "  p50 parts: translate={:.2}ms digests+hash={:.2}ms delta+encode+push+apply+ack={:.2}ms",
        ms(pct(&parts[0], 0.5)),
        ms(pct(&parts[1], 0.5)),
        ms(pct(&parts[2], 0.5))
    );
    // CPU per change does not grow with other load on the machine, wall-clock latency does.
    println!(
        "  CPU per change: controller (translate + digests + delta + send)={cpu_self:.1}ms dataplane (decode + apply delta + validate + build + swap)={cpu_dp:.1}ms; load average {}",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    println!(
        "rss: dataplane idle={}KiB after the full push={}KiB after {changes} changes={}KiB peak={}KiB (target < 40MB at 5,000 routes); \
         this process holding {objects_total} objects and the translate cache={}KiB peak={}KiB (target < 200MB at 10,000 objects)",
        rss_idle,
        rss_full,
        rss_kib(pid),
        hwm_kib(pid),
        rss_kib("self"),
        hwm_kib("self")
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
