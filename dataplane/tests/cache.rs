//! The response cache end to end: a counting HTTP/1.1 backend behind Sweety, h2c and
//! HTTP/1.1 clients, the admin purge endpoint on a real socket, and metrics.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;

type Hits = Arc<Mutex<HashMap<String, usize>>>;

/// A backend counting requests per path. Bodies name the path, the hit number and the
/// request's `accept-language` / `x-tenant`, so tests see which fetch they got.
async fn origin() -> (SocketAddr, Hits) {
    let hits: Hits = Arc::default();
    let h = hits.clone();
    let addr = spawn_http_backend(move |req| {
        let h = h.clone();
        async move {
            let path = req.uri().path().to_string();
            let n = {
                let mut m = h.lock().unwrap();
                let e = m.entry(path.clone()).or_default();
                *e += 1;
                *e
            };
            let hv = |k: &str| {
                req.headers()
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string()
            };
            let body = format!("{path} #{n} {} {}", hv("accept-language"), hv("x-tenant"));
            let mut b = http::Response::builder().header("content-type", "text/plain");
            b = match path.as_str() {
                "/private" => b.header("cache-control", "private, max-age=60"),
                "/nostore" => b.header("cache-control", "no-store"),
                "/vary" => b
                    .header("cache-control", "max-age=60")
                    .header("vary", "Accept-Language"),
                "/swr" => b.header("cache-control", "no-transform"),
                "/slow" => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    b.header("cache-control", "max-age=60")
                }
                _ => b.header("cache-control", "public, max-age=60"),
            };
            b.body(Full::new(Bytes::from(body))).unwrap()
        }
    })
    .await;
    (addr, hits)
}

async fn start() -> (Harness, SocketAddr, Hits) {
    let (up, hits) = origin().await;
    let mut swr = proxy_route("swr", "/swr", "up");
    swr.filters.push(Filter::Cache(CachePolicy {
        ttl: Some(sweety_config::Duration::from_millis(500)),
        key_headers: vec![],
        stale_while_revalidate: Some(sweety_config::Duration::from_secs(30)),
        with_credentials: false,
    }));
    let mut all = proxy_route("all", "/", "up");
    all.filters.push(Filter::Cache(CachePolicy {
        key_headers: vec!["x-tenant".into()],
        ..CachePolicy::default()
    }));
    let cfg = Config {
        backends: vec![backend("up", up)],
        ..http_config(vec![vhost("c", &[], vec![swr, all])])
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr, hits)
}

struct Got {
    status: u16,
    x_cache: String,
    age: Option<String>,
    body: String,
}

async fn fetch(c: &Client, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Got {
    let mut b = http::Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        c.request(b.body(Full::new(Bytes::new())).unwrap()),
    )
    .await
    .expect("in time")
    .unwrap();
    let status = resp.status().as_u16();
    let x_cache = resp
        .headers()
        .get("x-cache")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let age = resp
        .headers()
        .get("age")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        x_cache,
        age,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn hits(h: &Hits, path: &str) -> usize {
    h.lock().unwrap().get(path).copied().unwrap_or(0)
}

#[tokio::test]
async fn hits_misses_and_bypasses_over_h2c_and_h1() {
    let (h, addr, origin_hits) = start().await;
    for c in [h2c_client(), h1_client()] {
        let path = if origin_hits.lock().unwrap().is_empty() {
            "/a?x=1"
        } else {
            "/b?x=1"
        };
        let first = fetch(&c, addr, path, &[]).await;
        assert_eq!((first.status, first.x_cache.as_str()), (200, "MISS"));
        for _ in 0..5 {
            let again = fetch(&c, addr, path, &[]).await;
            assert_eq!(again.x_cache, "HIT");
            assert_eq!(again.body, first.body);
            assert!(again.age.is_some());
        }
        // Another query string is another key.
        let other = fetch(&c, addr, &path.replace("x=1", "x=2"), &[]).await;
        assert_eq!(other.x_cache, "MISS");
    }
    assert_eq!(hits(&origin_hits, "/a"), 2);
    assert_eq!(hits(&origin_hits, "/b"), 2);

    let c = h2c_client();
    // private and no-store responses are never stored.
    for p in ["/private", "/nostore"] {
        assert_eq!(fetch(&c, addr, p, &[]).await.x_cache, "MISS");
        assert_eq!(fetch(&c, addr, p, &[]).await.x_cache, "MISS");
        assert_eq!(hits(&origin_hits, p), 2);
    }
    // Request-side: Authorization bypasses (no X-Cache), no-cache refetches.
    let g = fetch(&c, addr, "/a?x=1", &[("authorization", "Bearer t")]).await;
    assert_eq!(g.x_cache, "");
    let g = fetch(&c, addr, "/a?x=1", &[("cache-control", "no-cache")]).await;
    assert_eq!(g.x_cache, "MISS");
    assert_eq!(hits(&origin_hits, "/a"), 4);
    // Configured key headers split entries.
    let t1 = fetch(&c, addr, "/k", &[("x-tenant", "one")]).await;
    let t2 = fetch(&c, addr, "/k", &[("x-tenant", "two")]).await;
    assert_eq!((t1.x_cache.as_str(), t2.x_cache.as_str()), ("MISS", "MISS"));
    let t1b = fetch(&c, addr, "/k", &[("x-tenant", "one")]).await;
    assert_eq!(t1b.x_cache, "HIT");
    assert!(t1b.body.ends_with(" one"), "{}", t1b.body);
    // Vary: one entry per Accept-Language.
    let en = fetch(&c, addr, "/vary", &[("accept-language", "en")]).await;
    let fr = fetch(&c, addr, "/vary", &[("accept-language", "fr")]).await;
    assert_eq!((en.x_cache.as_str(), fr.x_cache.as_str()), ("MISS", "MISS"));
    let en2 = fetch(&c, addr, "/vary", &[("accept-language", "en")]).await;
    let fr2 = fetch(&c, addr, "/vary", &[("accept-language", "fr")]).await;
    assert_eq!((en2.x_cache.as_str(), fr2.x_cache.as_str()), ("HIT", "HIT"));
    assert!(en2.body.contains(" en ") && fr2.body.contains(" fr "));

    let text = h.runtime.shared.metrics.render();
    assert!(
        text.contains("sweety_cache_requests_total{result=\"hit\"}"),
        "{text}"
    );
    let e = &h.runtime.shared.metrics.edge;
    // Exactly the HITs asserted above (5 over h2c, 5 over h1, t1b, en2, fr2): bypasses, misses
    // and stale answers must not count as hits.
    assert_eq!(e.cache_hits.load(std::sync::atomic::Ordering::Relaxed), 13);
    assert!(e.cache_bytes.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn concurrent_misses_coalesce_into_one_fetch() {
    let (_h, addr, origin_hits) = start().await;
    let c = h2c_client();
    let mut tasks = Vec::new();
    for _ in 0..30 {
        let c = c.clone();
        tasks.push(tokio::spawn(
            async move { fetch(&c, addr, "/slow", &[]).await },
        ));
    }
    let mut miss = 0;
    for t in tasks {
        let g = t.await.unwrap();
        assert_eq!(g.body, "/slow #1 - -");
        if g.x_cache == "MISS" {
            miss += 1;
        } else {
            assert_eq!(g.x_cache, "HIT");
        }
    }
    assert_eq!(hits(&origin_hits, "/slow"), 1);
    assert_eq!(miss, 1);
}

#[tokio::test]
async fn stale_while_revalidate_serves_stale_then_refreshed() {
    let (_h, addr, origin_hits) = start().await;
    let c = h2c_client();
    // The backend sends no freshness at all; the route's TTL (500ms) applies.
    let a = fetch(&c, addr, "/swr", &[]).await;
    assert_eq!(
        (a.x_cache.as_str(), a.body.as_str()),
        ("MISS", "/swr #1 - -")
    );
    assert_eq!(fetch(&c, addr, "/swr", &[]).await.x_cache, "HIT");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = fetch(&c, addr, "/swr", &[]).await;
    assert_eq!(
        (s.x_cache.as_str(), s.body.as_str()),
        ("STALE", "/swr #1 - -")
    );
    // The background refresh lands shortly (bounded poll).
    let mut refreshed = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let g = fetch(&c, addr, "/swr", &[]).await;
        if g.body == "/swr #2 - -" {
            refreshed = Some(g);
            break;
        }
    }
    let r = refreshed.expect("refreshed entry served");
    assert_eq!(r.x_cache, "HIT");
    assert_eq!(hits(&origin_hits, "/swr"), 2);
}

#[tokio::test]
async fn admin_purge_by_host_and_prefix() {
    let (h, addr, origin_hits) = start().await;
    let admin =
        sweety_dataplane::admin::serve(h.runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let c = h1_client();
    for p in ["/img/1", "/img/2", "/css/1"] {
        assert_eq!(fetch(&c, addr, p, &[]).await.x_cache, "MISS");
        assert_eq!(fetch(&c, addr, p, &[]).await.x_cache, "HIT");
    }
    let purge = |q: &'static str, method: &'static str| {
        let c = c.clone();
        async move {
            let req = http::Request::builder()
                .method(method)
                .uri(format!("http://{admin}/cache/purge{q}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = c.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(
        purge("?host=other.test", "POST").await,
        (200, r#"{"purged":0}"#.into())
    );
    assert_eq!(
        purge("?host=127.0.0.1&prefix=/img/", "POST").await,
        (200, r#"{"purged":2}"#.into())
    );
    assert_eq!(fetch(&c, addr, "/img/1", &[]).await.x_cache, "MISS");
    assert_eq!(fetch(&c, addr, "/css/1", &[]).await.x_cache, "HIT");
    assert_eq!(purge("", "DELETE").await.0, 200);
    assert_eq!(fetch(&c, addr, "/css/1", &[]).await.x_cache, "MISS");
    assert_eq!(purge("", "GET").await.0, 405);
    assert_eq!(purge("?prefix=img", "POST").await.0, 400);
    assert_eq!(hits(&origin_hits, "/img/1"), 2);
    assert!(h
        .runtime
        .shared
        .metrics
        .render()
        .contains("sweety_cache_purged_total"));
}

/// GET `path` with `accept-encoding` (when given): status, `X-Cache`, `Content-Encoding`,
/// `Vary` and the raw body bytes.
async fn fetch_coded(
    c: &Client,
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> (u16, String, Option<String>, String, Bytes) {
    let mut b = http::Request::get(format!("http://{addr}{path}"));
    if let Some(a) = accept {
        b = b.header("accept-encoding", a);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        c.request(b.body(Full::new(Bytes::new())).unwrap()),
    )
    .await
    .expect("in time")
    .unwrap();
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (status, x_cache, coding, vary) = (
        resp.status().as_u16(),
        h("x-cache").unwrap_or_default(),
        h("content-encoding"),
        h("vary").unwrap_or_default(),
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, x_cache, coding, vary, body)
}

fn gunzip(b: &[u8]) -> String {
    use std::io::Read;
    let mut out = String::new();
    flate2::read::GzDecoder::new(b)
        .read_to_string(&mut out)
        .unwrap();
    out
}

/// A route that caches and compresses stores the coded variant: a hit is sent as stored (the
/// same gzip bytes, not compressed again), and a client accepting no coding gets its own
/// variant (the stored response varies on Accept-Encoding).
#[tokio::test]
async fn coded_variants_are_stored_and_hits_are_sent_as_stored() {
    let (up, origin_hits) = origin().await;
    let mut r = proxy_route("z", "/", "up");
    r.filters.push(Filter::Cache(CachePolicy::default()));
    r.filters.push(Filter::Compress(Compression {
        algorithms: vec![CompressionAlgorithm::Gzip],
        min_size: 0,
        ..Compression::default()
    }));
    let cfg = Config {
        backends: vec![backend("up", up)],
        ..http_config(vec![vhost("c", &[], vec![r])])
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let c = h2c_client();

    let (s, x, coding, vary, first) = fetch_coded(&c, addr, "/z", Some("gzip")).await;
    assert_eq!(
        (s, x.as_str(), coding.as_deref()),
        (200, "MISS", Some("gzip"))
    );
    assert!(
        vary.to_ascii_lowercase().contains("accept-encoding"),
        "{vary}"
    );
    assert_eq!(gunzip(&first), "/z #1 - -");
    for _ in 0..3 {
        let (_, x, coding, _, again) = fetch_coded(&c, addr, "/z", Some("gzip")).await;
        assert_eq!((x.as_str(), coding.as_deref()), ("HIT", Some("gzip")));
        assert_eq!(again, first, "the stored gzip bytes, as stored");
    }
    // No coding accepted: another variant, fetched and stored uncoded.
    let (_, x, coding, _, plain) = fetch_coded(&c, addr, "/z", None).await;
    assert_eq!((x.as_str(), coding), ("MISS", None));
    assert_eq!(&plain[..], b"/z #2 - -");
    let (_, x, coding, _, plain) = fetch_coded(&c, addr, "/z", None).await;
    assert_eq!((x.as_str(), coding), ("HIT", None));
    assert_eq!(&plain[..], b"/z #2 - -");
    assert_eq!(hits(&origin_hits, "/z"), 2);
    assert_eq!(
        h.runtime
            .shared
            .metrics
            .edge
            .cache_hits
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
}

/// A hit's head as a client sees it: every field in order, `date` and `age` checked for
/// form and left out (they follow the clock).
async fn hit_head(
    c: &Client,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> (Vec<(String, String)>, Bytes) {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut fields = Vec::new();
    for (n, v) in resp.headers() {
        let v = v.to_str().unwrap().to_string();
        match n.as_str() {
            "date" => assert!(httpdate::parse_http_date(&v).is_ok(), "{v}"),
            "age" => assert!(v.parse::<u64>().is_ok(), "{v}"),
            // Each response's own (random): one, 32 hex digits; compared by presence.
            "x-request-id" => {
                assert_eq!(v.len(), 32, "{v}");
                fields.push((n.as_str().to_string(), "<id>".into()));
            }
            _ => fields.push((n.as_str().to_string(), v)),
        }
    }
    assert!(resp.headers().contains_key("date"));
    assert_eq!(resp.headers().get_all("x-request-id").iter().count(), 1);
    // Hits say how old they are; the miss has no age.
    let hit = fields.contains(&("x-cache".into(), "HIT".into()));
    assert_eq!(resp.headers().contains_key("age"), hit, "{fields:?}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (fields, body)
}

/// Sweety's HTTP/2 engine sends a hit's stored head without copying it into a header map
/// (`cache::StoredHead`), and falls back to the map when a response filter needs it: either
/// way the client gets the fields, order, `x-cache`, `age`, lengths and metrics that hyper's
/// HTTP/2 server gives for the same hits.
#[tokio::test]
async fn engine_hits_send_the_same_heads_as_hyper_hits() {
    let mut seen = Vec::new();
    for engine in [Http2Engine::Hyper, Http2Engine::Sweety] {
        let (up, origin_hits) = origin().await;
        let mut plain = proxy_route("plain", "/p", "up");
        plain.filters.push(Filter::Cache(CachePolicy::default()));
        let mut filtered = proxy_route("filtered", "/f", "up");
        filtered.filters.push(Filter::Cache(CachePolicy::default()));
        filtered
            .filters
            .push(Filter::ResponseHeaders(HeaderModifier {
                add: vec![sweety_config::HeaderValue {
                    name: "x-added".into(),
                    value: "1".into(),
                }],
                ..HeaderModifier::default()
            }));
        let mut cfg = Config {
            backends: vec![backend("up", up)],
            ..http_config(vec![vhost("c", &[], vec![plain, filtered])])
        };
        cfg.limits.http2_engine = engine;
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        let c = h2c_client();
        let mut heads = Vec::new();
        for path in ["/p", "/f"] {
            let (miss, body) = hit_head(&c, addr, "GET", path).await;
            assert!(
                miss.contains(&("x-cache".into(), "MISS".into())),
                "{miss:?}"
            );
            for _ in 0..3 {
                let (hit, again) = hit_head(&c, addr, "GET", path).await;
                assert_eq!(again, body);
                assert!(hit.contains(&("x-cache".into(), "HIT".into())), "{hit:?}");
                let len = body.len().to_string();
                assert!(hit.contains(&("content-length".into(), len)), "{hit:?}");
                assert_eq!(hit.contains(&("x-added".into(), "1".into())), path == "/f");
                heads.push(hit);
            }
            // HEAD: the length a GET gets, no body.
            let (head, empty) = hit_head(&c, addr, "HEAD", path).await;
            assert!(empty.is_empty());
            assert!(head.contains(&("x-cache".into(), "HIT".into())), "{head:?}");
            assert!(head.contains(&("content-length".into(), body.len().to_string())));
            heads.push(head);
        }
        assert_eq!(hits(&origin_hits, "/p") + hits(&origin_hits, "/f"), 2);
        let m = &h.runtime.shared.metrics;
        assert_eq!(
            m.edge.cache_hits.load(std::sync::atomic::Ordering::Relaxed),
            8
        );
        // Each route: one miss from the backend, three GET hits and a HEAD hit from the cache
        // (no backend).
        for route in ["plain", "filtered"] {
            assert_eq!(m.requests.get("web", route, "up", "GET", 200), 1, "{route}");
            assert_eq!(m.requests.get("web", route, "-", "GET", 200), 3, "{route}");
            assert_eq!(m.requests.get("web", route, "-", "HEAD", 200), 1, "{route}");
        }
        seen.push(heads);
    }
    assert_eq!(seen[0], seen[1], "hyper's heads, then the engine's");
}

/// A reload reaches the requests of a live HTTP/2 connection on Sweety's engine at once: the
/// connection keeps the config snapshot between requests while it has streams, and checks per
/// request that no reload happened. A request to a backend that never answers holds a stream
/// for the whole test.
#[tokio::test]
async fn a_reload_reaches_an_open_engine_connection() {
    let hold = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hold_addr = hold.local_addr().unwrap();
    let (accepted, mut holding) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let (s, _) = hold.accept().await.unwrap();
        let _ = accepted.send(()).await;
        tokio::time::sleep(Duration::from_secs(20)).await;
        drop(s);
    });
    let cfg = |g: u64, body: &str| {
        let mut c = Config {
            backends: vec![backend("hold", hold_addr)],
            ..http_config(vec![vhost(
                "c",
                &[],
                vec![
                    proxy_route("hold", "/hold", "hold"),
                    fixed_route("r", "/", body),
                ],
            )])
        };
        c.generation = g;
        c.limits.http2_engine = Http2Engine::Sweety;
        c
    };
    let h = Harness::start(cfg(1, "one")).await;
    let addr = h.addr("web").await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = |path: &str| {
        http::Request::get(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let held = tokio::spawn(send.send_request(request("/hold")));
    tokio::time::timeout(Duration::from_secs(10), holding.recv())
        .await
        .expect("the held request reached its backend in time");
    for (g, body) in [(2, "two"), (3, "three"), (4, "four")] {
        let resp = send.send_request(request("/")).await.unwrap();
        let before = resp.into_body().collect().await.unwrap().to_bytes();
        h.runtime.apply(cfg(g, body)).await.unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(request("/")))
            .await
            .expect("in time")
            .unwrap();
        let after = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(after, body.as_bytes(), "before: {before:?}");
    }
    assert!(
        !held.is_finished(),
        "the held stream stayed open throughout"
    );
    held.abort();
}

/// CORS on a cached route decorates hits (whose head the engine then takes as a map) from
/// the request's `Origin` as it arrived, even when a request filter removes it before the
/// action, on both HTTP/2 servers.
#[tokio::test]
async fn cors_on_cached_hits_uses_the_origin_the_request_came_with() {
    for engine in [Http2Engine::Hyper, Http2Engine::Sweety] {
        let (up, _hits) = origin().await;
        let mut r = proxy_route("cors", "/", "up");
        r.filters.push(Filter::RequestHeaders(HeaderModifier {
            remove: vec!["origin".into()],
            ..HeaderModifier::default()
        }));
        r.filters.push(Filter::Cors(Cors {
            allow_origins: vec!["https://ok.test".into()],
            ..Cors::default()
        }));
        r.filters.push(Filter::Cache(CachePolicy::default()));
        let mut cfg = Config {
            backends: vec![backend("up", up)],
            ..http_config(vec![vhost("c", &[], vec![r])])
        };
        cfg.limits.http2_engine = engine;
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        let c = h2c_client();
        for (i, origin) in ["https://ok.test", "https://ok.test", "https://no.test"]
            .into_iter()
            .enumerate()
        {
            let req = http::Request::get(format!("http://{addr}/c"))
                .header("origin", origin)
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = c.request(req).await.unwrap();
            let hv = |k: &str| {
                resp.headers()
                    .get_all(k)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_string())
                    .collect::<Vec<_>>()
            };
            let want = if i == 0 { "MISS" } else { "HIT" };
            assert_eq!(hv("x-cache"), [want], "{engine:?} {i}");
            let allowed = origin == "https://ok.test";
            assert_eq!(
                hv("access-control-allow-origin"),
                if allowed {
                    vec![origin.to_string()]
                } else {
                    vec![]
                },
                "{engine:?} {i}"
            );
            assert!(
                hv("vary").iter().any(|v| v.eq_ignore_ascii_case("origin")),
                "{engine:?} {i}: {:?}",
                resp.headers()
            );
        }
    }
}
