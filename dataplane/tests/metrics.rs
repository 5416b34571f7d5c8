//! The dataplane's metrics as a Prometheus server sees them: real requests over real sockets
//! (success, 404, 502, upstream timeout, retry, cache hit, hostile hosts and paths), then a
//! scrape of the admin listener's `/metrics`, asserting the exact samples they produced. Also
//! checks that the Grafana dashboard and the PrometheusRule of the chart name only metrics
//! the dataplane exposes (the controller's are checked by the controller's tests).
//!
//! Every request is bounded by the client's and the backends' timeouts; every loop by a count.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;

/// A backend: `/slow` answers after 2 s, `/flaky` answers 503 the first time and 200 after,
/// `/cached` is cacheable, anything else 200.
async fn origin() -> SocketAddr {
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    spawn_http_backend(move |req| {
        let seen = seen.clone();
        async move {
            let path = req.uri().path().to_string();
            let n = {
                let mut m = seen.lock().unwrap();
                let e = m.entry(path.clone()).or_default();
                *e += 1;
                *e
            };
            let b = http::Response::builder();
            let b = match path.as_str() {
                "/slow" => {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    b.status(200)
                }
                "/flaky" if n == 1 => b.status(503),
                "/cached" => b.header("cache-control", "public, max-age=60"),
                _ => b.status(200),
            };
            b.body(Full::new(Bytes::from("ok"))).unwrap()
        }
    })
    .await
}

/// An address nothing listens on (bound, then closed).
async fn closed_port() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

async fn send(c: &Client, addr: SocketAddr, method: &str, path: &str, host: &str) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("bounded")
        .expect("response");
    let status = resp.status().as_u16();
    // Read the body: the request is counted when its response head is made, its bytes when
    // the body ends.
    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
    status
}

async fn scrape(admin: SocketAddr) -> String {
    let (status, text) = get(&h1_client(), &format!("http://{admin}/metrics"), None)
        .await
        .unwrap();
    assert_eq!(status, 200);
    text
}

fn lines_of<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[tokio::test]
async fn real_requests_produce_exact_samples_by_route_backend_method_and_code() {
    let up = origin().await;
    let (dead_a, dead_b) = (closed_port().await, closed_port().await);
    let mut flaky = proxy_route("default/flaky", "/flaky", "default/svc");
    flaky.retry = Some(RetryPolicy {
        attempts: 1,
        codes: vec![503],
        backoff: None,
        budget: None,
    });
    let mut slow = proxy_route("default/slow", "/slow", "default/svc");
    slow.timeouts.backend = Some(sweety_config::Duration::from_millis(200));
    let mut cached = proxy_route("default/cached", "/cached", "default/svc");
    cached.filters.push(Filter::Cache(CachePolicy::default()));
    let mut dead = backend("default/dead", dead_a);
    dead.endpoints.push(Endpoint {
        address: dead_b.to_string(),
        weight: 1,
    });
    dead.outlier.consecutive_failures = 2;
    let cfg = Config {
        backends: vec![backend("default/svc", up), dead],
        ..http_config(vec![vhost(
            "shop",
            &["shop.test"],
            vec![
                proxy_route("default/ok", "/ok", "default/svc"),
                flaky,
                slow,
                cached,
                proxy_route("default/dead", "/dead", "default/dead"),
                fixed_route("default/static", "/static", "hello"),
            ],
        )])
    };
    let h = Harness::start(cfg).await;
    let web = h.addr("web").await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let c = h1_client();
    let host = "shop.test";
    for _ in 0..3 {
        assert_eq!(send(&c, web, "GET", "/ok", host).await, 200);
    }
    assert_eq!(send(&c, web, "POST", "/ok", host).await, 200);
    assert_eq!(send(&c, web, "BREW", "/ok", host).await, 200);
    assert_eq!(send(&c, web, "GET", "/static", host).await, 200);
    assert_eq!(send(&c, web, "GET", "/nothing", host).await, 404);
    assert_eq!(send(&c, web, "GET", "/flaky", host).await, 200);
    assert_eq!(send(&c, web, "GET", "/slow", host).await, 504);
    for _ in 0..4 {
        assert_eq!(send(&c, web, "GET", "/dead", host).await, 502);
    }
    assert_eq!(send(&c, web, "GET", "/cached", host).await, 200);
    assert_eq!(send(&c, web, "GET", "/cached", host).await, 200);

    let text = scrape(admin).await;
    let req = |route: &str, backend: &str, method: &str, code: &str, n: u64| {
        format!("sweety_requests_total{{listener=\"web\",route=\"{route}\",backend=\"{backend}\",method=\"{method}\",code=\"{code}\"}} {n}")
    };
    let mut want = vec![
        req("-", "-", "GET", "404", 1),
        req("default/cached", "-", "GET", "200", 1),
        req("default/cached", "default/svc", "GET", "200", 1),
        req("default/dead", "default/dead", "GET", "502", 4),
        req("default/flaky", "default/svc", "GET", "200", 1),
        req("default/ok", "default/svc", "GET", "200", 3),
        req("default/ok", "default/svc", "POST", "200", 1),
        req("default/ok", "default/svc", "other", "200", 1),
        req("default/slow", "default/svc", "GET", "504", 1),
        req("default/static", "-", "GET", "200", 1),
    ];
    want.sort();
    let mut got = lines_of(&text, "sweety_requests_total{");
    got.sort();
    assert_eq!(got, want, "{text}");

    for line in [
        // Latency: every request of a triple; the upstream one only where a backend answered.
        "sweety_route_request_duration_seconds_count{listener=\"web\",route=\"default/ok\",backend=\"default/svc\"} 5",
        "sweety_upstream_response_duration_seconds_count{listener=\"web\",route=\"default/ok\",backend=\"default/svc\"} 5",
        "sweety_route_request_duration_seconds_count{listener=\"web\",route=\"default/slow\",backend=\"default/svc\"} 1",
        // The timed-out try: at least 0.1 s (the route's 0.2 s backend timeout), under 1 s.
        "sweety_route_request_duration_seconds_bucket{listener=\"web\",route=\"default/slow\",backend=\"default/svc\",le=\"0.1\"} 0",
        "sweety_route_request_duration_seconds_bucket{listener=\"web\",route=\"default/slow\",backend=\"default/svc\",le=\"1\"} 1",
        // Errors, retries and ejections by backend.
        "sweety_upstream_errors_total{backend=\"default/dead\",kind=\"connect\"} 4",
        "sweety_upstream_errors_total{backend=\"default/svc\",kind=\"timeout\"} 1",
        "sweety_upstream_retries_total{backend=\"default/svc\"} 1",
        "sweety_upstream_ejections_total{backend=\"default/dead\"} 1",
        // The cache: one miss, one hit.
        "sweety_cache_requests_total{result=\"hit\"} 1",
        "sweety_cache_requests_total{result=\"miss\"} 1",
        // By protocol: all 15 requests over HTTP/1.1.
        "sweety_request_duration_seconds_count{protocol=\"HTTP/1.1\"} 15",
        "sweety_config_reloads_total{result=\"success\"} 1",
        "sweety_config_apply_duration_seconds_count 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    // No upstream latency where no backend answered.
    assert!(!text.contains(
        "sweety_upstream_response_duration_seconds_count{listener=\"web\",route=\"default/dead\""
    ));
    assert!(!text.contains(
        "sweety_upstream_response_duration_seconds_count{listener=\"web\",route=\"default/static\""
    ));
}

#[tokio::test]
async fn hostile_hosts_paths_and_methods_make_no_series() {
    let cfg = http_config(vec![vhost(
        "shop",
        &["shop.test"],
        vec![fixed_route("default/static", "/static", "hello")],
    )]);
    let h = Harness::start(cfg).await;
    let web = h.addr("web").await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let c = h1_client();
    assert_eq!(send(&c, web, "GET", "/static", "shop.test").await, 200);
    assert_eq!(send(&c, web, "GET", "/nothing", "shop.test").await, 404);
    let before = scrape(admin).await;
    for i in 0..50 {
        let status = send(
            &c,
            web,
            ["GET", "EVIL-METHOD"][i % 2],
            &format!("/evil-path-{i}/%22%7D"),
            &format!("evil-host-{i}.example"),
        )
        .await;
        assert_eq!(status, 404);
        assert_eq!(
            send(&c, web, "GET", &format!("/static/evil-{i}"), "shop.test").await,
            200
        );
    }
    let after = scrape(admin).await;
    assert!(!after.contains("evil"), "client input in a label:\n{after}");
    let series = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect::<BTreeSet<_>>()
    };
    let new: Vec<_> = series(&after)
        .difference(&series(&before))
        .cloned()
        .collect();
    // The only new series: the other-method counter of the unrouted requests.
    assert_eq!(
        new,
        ["sweety_requests_total{listener=\"web\",route=\"-\",backend=\"-\",method=\"other\",code=\"404\"}"],
        "{after}"
    );
    assert!(after.lines().any(|l| l == "sweety_requests_total{listener=\"web\",route=\"-\",backend=\"-\",method=\"GET\",code=\"404\"} 26"));
    assert!(after.lines().any(|l| l == "sweety_requests_total{listener=\"web\",route=\"default/static\",backend=\"-\",method=\"GET\",code=\"200\"} 51"));
}

#[tokio::test]
async fn dashboard_and_alert_rules_name_only_exposed_dataplane_metrics() {
    let h = Harness::start(http_config(vec![])).await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let exposed = sweety_dataplane::metrics::expo::declared_names(&scrape(admin).await);
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut checked = 0;
    for file in [
        "deploy/grafana/sweety.json",
        "charts/sweety/files/prometheus-rules.yaml",
    ] {
        let Ok(text) = std::fs::read_to_string(format!("{root}/{file}")) else {
            assert_ne!(
                file, "deploy/grafana/sweety.json",
                "the dashboard is missing"
            );
            continue;
        };
        // The `sweety_*` names, not the controller's (checked by the controller's tests).
        let used: BTreeSet<String> = sweety_dataplane::metrics::expo::names_used(&text, "sweety_")
            .into_iter()
            .filter(|n| !n.starts_with("sweety_controller_"))
            .collect();
        assert!(!used.is_empty(), "{file} names no dataplane metric");
        let missing: Vec<_> = used.difference(&exposed).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics the dataplane does not expose: {missing:?}"
        );
        checked += used.len();
    }
    assert!(checked > 0);
}

#[tokio::test]
async fn tls_handshakes_errors_and_certificate_expiry_by_listener() {
    let (cert, ca) = cert_for("shop.test");
    let mut tls = listener("websecure", ListenerProtocol::Https);
    tls.tls = Some(ListenerTls {
        certificates: vec![cert],
        min_version: TlsVersion::default(),
        client_auth: None,
        host_client_auth: Vec::new(),
    });
    let cfg = Config {
        generation: 1,
        listeners: vec![tls],
        virtual_hosts: vec![vhost(
            "shop",
            &["shop.test"],
            vec![fixed_route("default/static", "/", "hello")],
        )],
        ..Config::default()
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("websecure").await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    for _ in 0..2 {
        let (_, status, _) = tls_get(addr, "shop.test", &ca, &[b"http/1.1"], "/")
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
    // A client that does not speak TLS: one failed handshake.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: shop.test\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    }
    let text = scrape(admin).await;
    let expiry = sweety_dataplane::tls::not_after(ca.as_bytes()).unwrap();
    for line in [
        "sweety_tls_handshakes_total{listener=\"websecure\",transport=\"tcp\",version=\"TLSv1.3\"} 2".to_string(),
        "sweety_tls_handshake_errors_total{listener=\"websecure\",transport=\"tcp\",reason=\"error\"} 1".to_string(),
        format!("sweety_tls_certificate_expiry_timestamp_seconds{{listener=\"websecure\",hostname=\"shop.test\"}} {expiry}"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(expiry > now, "a fresh certificate expires in the future");
    // A config without the listener: its per-listener series go (the maps hold the listeners
    // being served, not every name ever configured).
    h.runtime
        .apply(Config {
            generation: 2,
            listeners: vec![listener("web", ListenerProtocol::Http)],
            ..Config::default()
        })
        .await
        .unwrap();
    let text = scrape(admin).await;
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("sweety_tls_handshake") && l.contains("\"websecure\"")),
        "{text}"
    );
}

/// An origin whose `.../hold` answers once `release` turns true, whose `.../close` answers
/// with `Connection: close` (and closes), anything else at once.
async fn holding_origin(release: tokio::sync::watch::Receiver<bool>) -> SocketAddr {
    spawn_http_backend(move |req| {
        let mut release = release.clone();
        async move {
            let path = req.uri().path();
            if path.ends_with("/hold") {
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), release.wait_for(|go| *go)).await;
            }
            let mut resp = http::Response::new(Full::new(Bytes::from("ok")));
            if path.ends_with("/close") {
                resp.headers_mut()
                    .insert("connection", http::HeaderValue::from_static("close"));
            }
            resp
        }
    })
    .await
}

/// The `sweety_upstream_connections` samples of a scrape, as `backend state value` lines.
fn pool_lines(text: &str) -> Vec<String> {
    lines_of(text, "sweety_upstream_connections{")
        .into_iter()
        .map(|l| {
            let (labels, v) = l.rsplit_once(' ').unwrap();
            let labels = labels
                .trim_start_matches("sweety_upstream_connections{backend=\"")
                .replace("\",state=\"", " ")
                .replace("\"}", "");
            format!("{labels} {v}")
        })
        .collect()
}

/// Scrapes until the pool samples are `want` (an HTTP/1.1 connection returns to the idle
/// list from a task of its own once the response body is read), at most 5 s; then asserts.
async fn pools_become(admin: SocketAddr, want: &[&str]) {
    let mut got = Vec::new();
    for _ in 0..100 {
        got = pool_lines(&scrape(admin).await);
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(got, want);
}

/// `sweety_upstream_connections` from the pools themselves: sequential requests share one
/// kept-alive HTTP/1.1 connection (idle after), two held at once need two (active), an h2c
/// backend carries both on one connection; a backend nobody used shows zeros; connections the
/// origin closes leave the gauge.
async fn upstream_connections_active_and_idle_by_backend(client: Http2Client) {
    let (release, wait) = tokio::sync::watch::channel(false);
    let up = holding_origin(wait).await;
    let mut h2 = backend("default/h2", up);
    h2.protocol = BackendProtocol::H2c;
    let mut cfg = Config {
        backends: vec![
            backend("default/h1", up),
            h2,
            backend("default/unused", closed_port().await),
        ],
        ..http_config(vec![vhost(
            "shop",
            &["shop.test"],
            vec![
                proxy_route("default/one", "/one", "default/h1"),
                proxy_route("default/two", "/two", "default/h2"),
            ],
        )])
    };
    cfg.limits.http2_client = client;
    let h = Harness::start(cfg).await;
    let web = h.addr("web").await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let text = scrape(admin).await;
    assert!(text.contains("# HELP sweety_upstream_connections Open upstream connections"));
    assert!(text.contains("# TYPE sweety_upstream_connections gauge\n"));
    let zeros = [
        "default/h1 active 0",
        "default/h1 idle 0",
        "default/h2 active 0",
        "default/h2 idle 0",
        "default/unused active 0",
        "default/unused idle 0",
    ];
    assert_eq!(pool_lines(&text), zeros);

    let c = h1_client();
    for _ in 0..3 {
        assert_eq!(send(&c, web, "GET", "/one", "shop.test").await, 200);
        assert_eq!(send(&c, web, "GET", "/two", "shop.test").await, 200);
    }
    pools_become(
        admin,
        &[
            "default/h1 active 0",
            "default/h1 idle 1",
            "default/h2 active 0",
            "default/h2 idle 1",
            "default/unused active 0",
            "default/unused idle 0",
        ],
    )
    .await;

    // Two held requests per backend: HTTP/1.1 takes the idle connection and opens a second,
    // HTTP/2 puts both streams on its one connection.
    let mut held = Vec::new();
    for path in ["/one/hold", "/one/hold", "/two/hold", "/two/hold"] {
        let c = h1_client();
        held.push(tokio::spawn(async move {
            send(&c, web, "GET", path, "shop.test").await
        }));
    }
    pools_become(
        admin,
        &[
            "default/h1 active 2",
            "default/h1 idle 0",
            "default/h2 active 1",
            "default/h2 idle 0",
            "default/unused active 0",
            "default/unused idle 0",
        ],
    )
    .await;
    release.send(true).unwrap();
    for t in held {
        assert_eq!(t.await.unwrap(), 200);
    }
    pools_become(
        admin,
        &[
            "default/h1 active 0",
            "default/h1 idle 2",
            "default/h2 active 0",
            "default/h2 idle 1",
            "default/unused active 0",
            "default/unused idle 0",
        ],
    )
    .await;
    // The origin closes both HTTP/1.1 connections (one request on each): they leave.
    for _ in 0..2 {
        assert_eq!(send(&c, web, "GET", "/one/close", "shop.test").await, 200);
    }
    pools_become(
        admin,
        &[
            "default/h1 active 0",
            "default/h1 idle 0",
            "default/h2 active 0",
            "default/h2 idle 1",
            "default/unused active 0",
            "default/unused idle 0",
        ],
    )
    .await;
}

/// Backends past the label cap (`MAX_BACKENDS`) share the label `other`: their connections
/// add up there, and the gauge has one pair of samples per label, however many backends.
#[tokio::test]
async fn upstream_connections_over_the_backend_cap_add_up_under_other() {
    let (_release, wait) = tokio::sync::watch::channel(false);
    let up = holding_origin(wait).await;
    let unused = closed_port().await;
    let mut backends: Vec<Backend> = (0..sweety_dataplane::metrics::MAX_BACKENDS)
        .map(|i| backend(&format!("default/filler-{i}"), unused))
        .collect();
    backends.push(backend("default/late-a", up));
    backends.push(backend("default/late-b", up));
    let cfg = Config {
        backends,
        ..http_config(vec![vhost(
            "shop",
            &["shop.test"],
            vec![
                proxy_route("default/a", "/a", "default/late-a"),
                proxy_route("default/b", "/b", "default/late-b"),
            ],
        )])
    };
    let h = Harness::start(cfg).await;
    let web = h.addr("web").await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let c = h1_client();
    assert_eq!(send(&c, web, "GET", "/a", "shop.test").await, 200);
    assert_eq!(send(&c, web, "GET", "/b", "shop.test").await, 200);
    let mut got = Vec::new();
    for _ in 0..100 {
        got = pool_lines(&scrape(admin).await);
        if got.iter().any(|l| l == "other idle 2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(got.len(), 2 * (sweety_dataplane::metrics::MAX_BACKENDS + 1));
    let other: Vec<_> = got.iter().filter(|l| l.starts_with("other ")).collect();
    assert_eq!(other, ["other active 0", "other idle 2"]);
    assert!(!got.iter().any(|l| l.contains("late")), "{got:?}");
}

/// Sends `body` by `method` (no Host field: the h2c client's `:authority` is the address)
/// and returns the status and the number of response body bytes.
async fn send_body(
    c: &Client,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, u64) {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("bounded")
        .expect("response");
    let status = resp.status().as_u16();
    let got = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, got.len() as u64)
}

/// Scrapes until every line of `want` is in the scrape (a request's bytes are added when its
/// response body ends, which the server may see after the client has read the last byte), at
/// most 5 s; then asserts.
async fn scrape_has(admin: SocketAddr, want: &[String]) -> String {
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(admin).await;
        if want.iter().all(|w| text.lines().any(|l| l == w)) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for w in want {
        assert!(text.lines().any(|l| l == w), "{w} not in\n{text}");
    }
    text
}

/// `sweety_route_received_bytes_total` and `sweety_route_sent_bytes_total` by listener, route
/// and backend, exactly: request bodies over HTTP/1.1 and h2c echoed by the origin, downloads,
/// a cache miss then a hit (the hit's bytes under backend `-`), a fixed reply and a 404 (route
/// `-`); the totals match the unlabelled `sweety_received_bytes_total`/`sweety_sent_bytes_total`.
#[tokio::test]
async fn bytes_received_and_sent_by_route() {
    let up = spawn_http_backend(|req| async move {
        let path = req.uri().path().to_string();
        let body = http_body_util::BodyExt::collect(req.into_body())
            .await
            .unwrap()
            .to_bytes();
        let b = http::Response::builder();
        match path.as_str() {
            "/echo" => b.body(Full::new(body)).unwrap(),
            "/cached" => b
                .header("cache-control", "public, max-age=60")
                .body(Full::new(Bytes::from(vec![b'c'; 1500])))
                .unwrap(),
            _ => b.body(Full::new(Bytes::from(vec![b'd'; 1000]))).unwrap(),
        }
    })
    .await;
    let mut cached = proxy_route("default/cached", "/cached", "default/svc");
    cached.filters.push(Filter::Cache(CachePolicy::default()));
    let cfg = Config {
        backends: vec![backend("default/svc", up)],
        ..http_config(vec![vhost(
            "shop",
            &[],
            vec![
                proxy_route("default/echo", "/echo", "default/svc"),
                proxy_route("default/data", "/data", "default/svc"),
                cached,
                fixed_route("default/static", "/static", "hello"),
            ],
        )])
    };
    let h = Harness::start(cfg).await;
    let web = h.addr("web").await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let (h1, h2) = (h1_client(), h2c_client());
    assert_eq!(
        send_body(&h1, web, "POST", "/echo", vec![1; 300]).await,
        (200, 300)
    );
    assert_eq!(
        send_body(&h2, web, "PUT", "/echo", vec![2; 70_000]).await,
        (200, 70_000)
    );
    for _ in 0..2 {
        assert_eq!(
            send_body(&h1, web, "GET", "/data", vec![]).await,
            (200, 1000)
        );
    }
    for _ in 0..2 {
        assert_eq!(
            send_body(&h2, web, "GET", "/cached", vec![]).await,
            (200, 1500)
        );
    }
    for _ in 0..3 {
        assert_eq!(
            send_body(&h1, web, "GET", "/static", vec![]).await,
            (200, 5)
        );
    }
    let (status, not_found) = send_body(&h1, web, "GET", "/nothing", vec![]).await;
    assert_eq!(status, 404);
    assert!(not_found > 0);

    let line = |family: &str, route: &str, backend: &str, n: u64| {
        format!("{family}{{listener=\"web\",route=\"{route}\",backend=\"{backend}\"}} {n}")
    };
    let (rx, tx) = (
        "sweety_route_received_bytes_total",
        "sweety_route_sent_bytes_total",
    );
    let mut want = vec![
        line(rx, "default/echo", "default/svc", 70_300),
        line(tx, "default/echo", "default/svc", 70_300),
        line(rx, "default/data", "default/svc", 0),
        line(tx, "default/data", "default/svc", 2000),
        line(rx, "default/cached", "default/svc", 0),
        line(tx, "default/cached", "default/svc", 1500),
        line(rx, "default/cached", "-", 0),
        line(tx, "default/cached", "-", 1500),
        line(rx, "default/static", "-", 0),
        line(tx, "default/static", "-", 15),
        line(rx, "-", "-", 0),
        line(tx, "-", "-", not_found),
        "sweety_received_bytes_total 70300".to_string(),
        format!(
            "sweety_sent_bytes_total {}",
            70_300 + 2000 + 3000 + 15 + not_found
        ),
    ];
    let text = scrape_has(admin, &want).await;
    // Nothing else in the two families.
    want.truncate(12);
    want.sort();
    let mut got: Vec<&str> = lines_of(&text, "sweety_route_received_bytes_total{");
    got.extend(lines_of(&text, "sweety_route_sent_bytes_total{"));
    got.sort();
    assert_eq!(got, want);
    assert!(text.contains("# TYPE sweety_route_sent_bytes_total counter\n"));
    assert!(text.contains("# HELP sweety_route_received_bytes_total Request body bytes"));
}

common::on_both_h2_clients!(upstream_connections_active_and_idle_by_backend);
