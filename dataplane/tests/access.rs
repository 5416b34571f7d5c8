//! Integration tests of the access rules with real sockets on 127.0.0.1: rate limits (429 with
//! Retry-After, per client IP and per header), IP allow/deny lists (403), the real client IP
//! from trusted proxies' X-Forwarded-For, and PROXY protocol v1/v2 headers on a listener.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use std::time::Duration;
use sweety_config::*;
use sweety_dataplane::proxy_protocol::encode_v2;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long")
}

fn with_filters(mut r: Route, filters: Vec<Filter>) -> Route {
    r.filters = filters;
    r
}

fn rate(requests: u32, burst: u32, key: RateLimitKey) -> Filter {
    Filter::RateLimit(RateLimit {
        key,
        requests,
        period: sweety_config::Duration::from_secs(60),
        burst,
        max_keys: 1000,
        zone: None,
        status: DEFAULT_LIMIT_STATUS,
        exempt: vec![],
    })
}

/// GET with extra headers; returns status, Retry-After and body.
async fn get_with(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    get_headers(client, url, headers, "retry-after").await
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after_per_key() {
    bounded(async {
        let cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![
                with_filters(
                    fixed_route("by-ip", "/ip", "ok"),
                    vec![rate(2, 1, RateLimitKey::ClientIp)],
                ),
                with_filters(
                    fixed_route("by-header", "/user", "ok"),
                    vec![rate(1, 0, RateLimitKey::Header("x-user".into()))],
                ),
                fixed_route("free", "/free", "ok"),
            ],
        )]);
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        // requests + burst = 3 pass, the 4th is refused with a Retry-After.
        for i in 0..3 {
            let (s, _, _) = get_with(&c, &format!("{base}/ip"), &[]).await;
            assert_eq!(s, 200, "request {i}");
        }
        let (s, ra, body) = get_with(&c, &format!("{base}/ip"), &[]).await;
        assert_eq!(s, 429);
        let secs: u64 = ra.expect("Retry-After").parse().unwrap();
        assert!((1..=30).contains(&secs), "{secs}");
        assert!(body.contains("rate limit"), "{body}");
        // Other routes are not limited.
        for _ in 0..5 {
            assert_eq!(get_with(&c, &format!("{base}/free"), &[]).await.0, 200);
        }
        // Per header: each user has a bucket.
        let alice = [("x-user", "alice")];
        let bob = [("x-user", "bob")];
        assert_eq!(get_with(&c, &format!("{base}/user"), &alice).await.0, 200);
        assert_eq!(get_with(&c, &format!("{base}/user"), &alice).await.0, 429);
        assert_eq!(get_with(&c, &format!("{base}/user"), &bob).await.0, 200);

        // A reload with the same settings keeps the buckets (still exhausted)…
        let mut cfg2 = http_config(vec![vhost(
            "v",
            &[],
            vec![
                with_filters(
                    fixed_route("by-ip", "/ip", "ok"),
                    vec![rate(2, 1, RateLimitKey::ClientIp)],
                ),
                fixed_route("free", "/free", "ok"),
            ],
        )]);
        cfg2.generation = 2;
        h.runtime.apply(cfg2).await.unwrap();
        assert_eq!(get_with(&c, &format!("{base}/ip"), &[]).await.0, 429);
        // …and changed settings start a new zone.
        let mut cfg3 = http_config(vec![vhost(
            "v",
            &[],
            vec![with_filters(
                fixed_route("by-ip", "/ip", "ok"),
                vec![rate(5, 0, RateLimitKey::ClientIp)],
            )],
        )]);
        cfg3.generation = 3;
        h.runtime.apply(cfg3).await.unwrap();
        assert_eq!(get_with(&c, &format!("{base}/ip"), &[]).await.0, 200);
        assert_eq!(
            h.runtime.shared.rate_zones.len(),
            1,
            "old zones are forgotten"
        );
        let text = h.runtime.shared.metrics.render();
        assert!(
            text.contains("sweety_edge_events_total{kind=\"rate_limited\"} 3"),
            "{text}"
        );
    })
    .await;
}

/// `exempt` client networks (ingress-nginx's `limit-whitelist`) pass a rate limit and a
/// concurrency limit uncounted; a client outside them is limited as before, on the same route.
#[tokio::test]
async fn exempt_clients_pass_rate_and_concurrency_limits() {
    bounded(async {
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let be = gated_backend(gate.clone()).await;
        let exempt = |f: Filter| match f {
            Filter::RateLimit(r) => Filter::RateLimit(RateLimit {
                exempt: vec!["127.0.0.0/8".into()],
                ..r
            }),
            other => other,
        };
        let conn = |exempt: Vec<String>| {
            Filter::ConcurrencyLimit(ConcurrencyLimit {
                key: RateLimitKey::Route,
                max: 1,
                zone: None,
                status: 503,
                exempt,
            })
        };
        let mut cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![
                with_filters(
                    fixed_route("exempt", "/exempt", "ok"),
                    vec![exempt(rate(1, 0, RateLimitKey::ClientIp))],
                ),
                with_filters(
                    fixed_route("other", "/other", "ok"),
                    // 192.0.2.0/24 is not this client: still limited.
                    vec![Filter::RateLimit(RateLimit {
                        exempt: vec!["192.0.2.0/24".into()],
                        ..match rate(1, 0, RateLimitKey::ClientIp) {
                            Filter::RateLimit(r) => r,
                            _ => unreachable!(),
                        }
                    })],
                ),
                with_filters(
                    proxy_route("conn", "/conn", "be"),
                    vec![conn(vec!["127.0.0.1/32".into()])],
                ),
            ],
        )]);
        cfg.backends = vec![backend("be", be)];
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        for i in 0..5 {
            let (s, _, _) = get_with(&c, &format!("{base}/exempt"), &[]).await;
            assert_eq!(s, 200, "exempt request {i}");
        }
        assert_eq!(get_with(&c, &format!("{base}/other"), &[]).await.0, 200);
        assert_eq!(get_with(&c, &format!("{base}/other"), &[]).await.0, 429);
        // Two requests in flight (held at the backend) on a route allowing one: the exempt
        // client is not counted.
        let active = || {
            h.runtime
                .shared
                .metrics
                .active_requests
                .load(std::sync::atomic::Ordering::SeqCst)
        };
        let spawn = || {
            let (c, url) = (c.clone(), format!("{base}/conn"));
            tokio::spawn(async move { get_with(&c, &url, &[]).await.0 })
        };
        let (a, b) = (spawn(), spawn());
        for _ in 0..500 {
            if active() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(active(), 2, "both requests are in flight");
        gate.add_permits(2);
        assert_eq!((a.await.unwrap(), b.await.unwrap()), (200, 200));
    })
    .await;
}

#[tokio::test]
async fn ip_allow_and_deny_lists_answer_403() {
    bounded(async {
        let access = |allow: &[&str], deny: &[&str]| {
            Filter::IpAccess(IpAccess {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
            })
        };
        let cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![
                with_filters(
                    fixed_route("denied", "/denied", "no"),
                    vec![access(&[], &["127.0.0.0/8"])],
                ),
                with_filters(
                    fixed_route("allowed", "/allowed", "yes"),
                    vec![access(&["127.0.0.1/32", "10.0.0.0/8"], &[])],
                ),
                with_filters(
                    fixed_route("other", "/other", "no"),
                    vec![access(&["10.0.0.0/8"], &[])],
                ),
            ],
        )]);
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        let (s, _, body) = get_with(&c, &format!("{base}/denied"), &[]).await;
        assert_eq!((s, body.contains("not allowed")), (403, true));
        assert_eq!(get_with(&c, &format!("{base}/allowed"), &[]).await.0, 200);
        assert_eq!(get_with(&c, &format!("{base}/other"), &[]).await.0, 403);
        // X-Forwarded-For from an untrusted peer changes nothing.
        let spoof = [("x-forwarded-for", "10.1.2.3")];
        assert_eq!(get_with(&c, &format!("{base}/other"), &spoof).await.0, 403);
    })
    .await;
}

/// A backend answering with the X-Forwarded-For it received.
async fn xff_backend() -> std::net::SocketAddr {
    spawn_backend(move |s| async move {
        let svc =
            hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let xff = req
                    .headers()
                    .get("x-forwarded-for")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(xff))))
            });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
            .await;
    })
    .await
}

#[tokio::test]
async fn trusted_proxy_xff_gives_the_client_ip_to_rules_and_backends() {
    bounded(async {
        let be = xff_backend().await;
        let mut cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![
                with_filters(
                    proxy_route("limited", "/limited", "be"),
                    vec![rate(1, 0, RateLimitKey::ClientIp)],
                ),
                with_filters(
                    fixed_route("deny", "/deny", "x"),
                    vec![Filter::IpAccess(IpAccess {
                        allow: vec![],
                        deny: vec!["198.51.100.0/24".into()],
                    })],
                ),
            ],
        )]);
        cfg.backends = vec![backend("be", be)];
        cfg.client_ip = ClientIp {
            trusted_proxies: vec!["127.0.0.0/8".into(), "10.0.0.0/8".into()],
            forwarded_for_depth: 2,
            ..ClientIp::default()
        };
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        // The client is the first untrusted address from the right, within depth 2; the
        // backend sees the chain up to it, once.
        let xff = [("x-forwarded-for", "192.0.2.50, 203.0.113.9, 10.0.0.7")];
        let (s, _, body) = get_with(&c, &format!("{base}/limited"), &xff).await;
        assert_eq!((s, body.as_str()), (200, "192.0.2.50, 203.0.113.9"));
        // Same client again: limited; another client behind the same proxy: not.
        assert_eq!(get_with(&c, &format!("{base}/limited"), &xff).await.0, 429);
        let other = [("x-forwarded-for", "203.0.113.10")];
        let (s, _, body) = get_with(&c, &format!("{base}/limited"), &other).await;
        assert_eq!((s, body.as_str()), (200, "203.0.113.10"));
        // IP rules use it too.
        let denied = [("x-forwarded-for", "198.51.100.4")];
        assert_eq!(get_with(&c, &format!("{base}/deny"), &denied).await.0, 403);
        assert_eq!(get_with(&c, &format!("{base}/deny"), &other).await.0, 200);
    })
    .await;
}

/// Sends `prefix` then a GET on a raw connection; returns the response head's status line, or
/// `None` when the server closed the connection without answering.
async fn raw_get(addr: std::net::SocketAddr, prefix: &[u8], path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(prefix).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines()
        .next()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
}

#[tokio::test]
async fn proxy_protocol_v1_and_v2_set_the_client_address() {
    bounded(async {
        let mut cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![with_filters(
                fixed_route("r", "/", "ok"),
                vec![Filter::IpAccess(IpAccess {
                    allow: vec![],
                    deny: vec!["198.51.100.0/24".into()],
                })],
            )],
        )]);
        cfg.client_ip.proxy_protocol = vec!["web".into()];
        cfg.client_ip.proxy_protocol_timeout = sweety_config::Duration::from_millis(500);
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        let v1_denied = b"PROXY TCP4 198.51.100.7 127.0.0.1 5555 80\r\n";
        let v1_ok = b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80\r\n";
        assert_eq!(
            raw_get(addr, v1_denied, "/").await.as_deref(),
            Some("HTTP/1.1 403 Forbidden")
        );
        assert_eq!(
            raw_get(addr, v1_ok, "/").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        let v2_denied = encode_v2("198.51.100.9:1".parse().unwrap(), addr, false);
        let v2_ok = encode_v2(
            "[2001:db8::1]:1".parse().unwrap(),
            "[::1]:80".parse().unwrap(),
            false,
        );
        assert_eq!(
            raw_get(addr, &v2_denied, "/").await.as_deref(),
            Some("HTTP/1.1 403 Forbidden")
        );
        assert_eq!(
            raw_get(addr, &v2_ok, "/").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        assert_eq!(
            raw_get(addr, b"PROXY UNKNOWN\r\n", "/").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        // Without a header, or with a malformed one, the connection is closed unanswered.
        assert_eq!(raw_get(addr, b"", "/").await, None);
        assert_eq!(raw_get(addr, b"PROXY TCP4 1.2.3.4\r\n", "/").await, None);
        // A client that sends nothing is dropped after the header timeout.
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .expect("closed by the PROXY header timeout");
        assert!(matches!(n, Ok(0) | Err(_)));
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"proxy_protocol_error\"} 2"), "{text}");
        assert!(
            text.contains("kind=\"proxy_protocol_timeout\"} 1"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test]
async fn proxy_protocol_only_from_trusted_peers_when_configured() {
    bounded(async {
        let mut cfg = http_config(vec![vhost("v", &[], vec![fixed_route("r", "/", "ok")])]);
        cfg.client_ip.proxy_protocol = vec!["web".into()];
        // 127.0.0.1 is not trusted: it is served with its own address and sends no header.
        cfg.client_ip.trusted_proxies = vec!["10.0.0.0/8".into()];
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        assert_eq!(
            raw_get(addr, b"", "/").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        // A header from an untrusted peer is not believed: it is just a bad request.
        let got = raw_get(addr, b"PROXY TCP4 198.51.100.7 127.0.0.1 1 2\r\n", "/").await;
        assert_ne!(got.as_deref(), Some("HTTP/1.1 200 OK"));
    })
    .await;
}

#[tokio::test]
async fn edge_config_errors_are_reported_with_paths() {
    let mut cfg = http_config(vec![vhost(
        "v",
        &[],
        vec![with_filters(
            fixed_route("r", "/", "ok"),
            vec![
                Filter::RateLimit(RateLimit {
                    key: RateLimitKey::Header("bad header".into()),
                    requests: 0,
                    period: sweety_config::Duration::from_secs(1),
                    burst: 0,
                    max_keys: 10,
                    zone: None,
                    status: 200,
                    exempt: vec![],
                }),
                Filter::IpAccess(IpAccess {
                    allow: vec!["10.0.0.1/8".into()],
                    deny: vec![],
                }),
            ],
        )],
    )]);
    cfg.client_ip.trusted_proxies = vec!["nope".into()];
    cfg.client_ip.proxy_protocol = vec!["missing".into()];
    let runtime = sweety_dataplane::reload::Runtime::new(Default::default()).unwrap();
    let err = runtime.apply(cfg).await.unwrap_err().messages();
    let want = [
        "virtual_hosts[0].routes[0].filters[0].rate_limit.key.header",
        "virtual_hosts[0].routes[0].filters[0].rate_limit.requests",
        "virtual_hosts[0].routes[0].filters[0].rate_limit.status",
        "virtual_hosts[0].routes[0].filters[1].ip_access.allow[0]",
        "client_ip.trusted_proxies[0]",
        "client_ip.proxy_protocol[0]",
    ];
    for w in want {
        assert!(
            err.iter().any(|e| e.starts_with(&format!("{w}:"))),
            "{w} in {err:?}"
        );
    }
}

/// A backend whose responses wait until `gate` is opened.
async fn gated_backend(gate: std::sync::Arc<tokio::sync::Semaphore>) -> std::net::SocketAddr {
    spawn_backend(move |s| {
        let gate = gate.clone();
        async move {
            let svc = hyper::service::service_fn(move |_req| {
                let gate = gate.clone();
                async move {
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"done"),
                    )))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
        }
    })
    .await
}

#[tokio::test]
async fn concurrency_limit_counts_requests_in_flight_per_client() {
    bounded(async {
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let be = gated_backend(gate.clone()).await;
        let mut cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![with_filters(
                proxy_route("r", "/", "be"),
                vec![Filter::ConcurrencyLimit(ConcurrencyLimit {
                    key: RateLimitKey::Header("x-user".into()),
                    max: 2,
                    zone: None,
                    status: DEFAULT_LIMIT_STATUS,
                    exempt: vec![],
                })],
            )],
        )]);
        cfg.backends = vec![backend("be", be)];
        let h = Harness::start(cfg).await;
        let url = format!("http://{}/", h.addr("web").await);
        let c = h1_client();
        let alice = [("x-user", "alice")];
        // Two requests of alice in flight (held at the backend)…
        let first = tokio::spawn({
            let (c, url) = (c.clone(), url.clone());
            async move { get_with(&c, &url, &alice).await.0 }
        });
        let second = tokio::spawn({
            let (c, url) = (c.clone(), url.clone());
            async move { get_with(&c, &url, &alice).await.0 }
        });
        // …wait until both reached the backend (bounded polling).
        let active = || {
            h.runtime
                .shared
                .metrics
                .active_requests
                .load(std::sync::atomic::Ordering::SeqCst)
        };
        for _ in 0..500 {
            if active() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(active(), 2);
        // A third of alice's is refused at once.
        let (s, ra, _) = get_with(&c, &url, &alice).await;
        assert_eq!((s, ra.as_deref()), (429, Some("1")));
        // Bob is admitted meanwhile.
        let bob = tokio::spawn({
            let (c, url) = (c.clone(), url.clone());
            async move { get_with(&c, &url, &[("x-user", "bob")]).await.0 }
        });
        for _ in 0..500 {
            if active() >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            active(),
            3,
            "bob's request is in flight next to alice's two"
        );
        // Release everything: all succeed, and alice gets through again afterwards.
        gate.add_permits(3);
        assert_eq!(first.await.unwrap(), 200);
        assert_eq!(second.await.unwrap(), 200);
        assert_eq!(bob.await.unwrap(), 200);
        gate.add_permits(1);
        assert_eq!(get_with(&c, &url, &alice).await.0, 200);
    })
    .await;
}

/// A limit answers its own `status` (ingress-nginx's `limit-req-status-code` /
/// `limit-conn-status-code`; nginx's default 503), 429 when it names none; the refusal keeps
/// its Retry-After and text. Fails when the dataplane ignores `status` (every refusal 429).
#[tokio::test]
async fn limits_answer_their_configured_status() {
    bounded(async {
        let with_status = |f: Filter, status: u16| match f {
            Filter::RateLimit(r) => Filter::RateLimit(RateLimit { status, ..r }),
            Filter::ConcurrencyLimit(c) => {
                Filter::ConcurrencyLimit(ConcurrencyLimit { status, ..c })
            }
            other => other,
        };
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let be = gated_backend(gate.clone()).await;
        let concurrency = Filter::ConcurrencyLimit(ConcurrencyLimit {
            key: RateLimitKey::ClientIp,
            max: 1,
            zone: None,
            status: DEFAULT_LIMIT_STATUS,
            exempt: vec![],
        });
        let mut cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![
                with_filters(
                    fixed_route("default", "/default", "ok"),
                    vec![rate(1, 0, RateLimitKey::ClientIp)],
                ),
                with_filters(
                    fixed_route("nginx", "/nginx", "ok"),
                    vec![with_status(rate(1, 0, RateLimitKey::ClientIp), 503)],
                ),
                with_filters(
                    fixed_route("custom", "/custom", "ok"),
                    vec![with_status(rate(1, 0, RateLimitKey::ClientIp), 420)],
                ),
                with_filters(
                    proxy_route("conn", "/conn", "be"),
                    vec![with_status(concurrency, 503)],
                ),
            ],
        )]);
        cfg.backends = vec![backend("be", be)];
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        for (path, status) in [("/default", 429), ("/nginx", 503), ("/custom", 420)] {
            let url = format!("{base}{path}");
            assert_eq!(get_with(&c, &url, &[]).await.0, 200, "{path}");
            let (s, ra, body) = get_with(&c, &url, &[]).await;
            assert_eq!(s, status, "{path}: {body}");
            assert!(ra.is_some(), "{path}: Retry-After");
            assert!(body.contains("rate limit exceeded"), "{path}: {body}");
        }
        // One request in flight (held at the backend), the next is refused with 503.
        let first = tokio::spawn({
            let (c, url) = (c.clone(), format!("{base}/conn"));
            async move { get_with(&c, &url, &[]).await.0 }
        });
        let active = || {
            h.runtime
                .shared
                .metrics
                .active_requests
                .load(std::sync::atomic::Ordering::SeqCst)
        };
        for _ in 0..500 {
            if active() >= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(active(), 1);
        let (s, ra, _) = get_with(&c, &format!("{base}/conn"), &[]).await;
        assert_eq!((s, ra.as_deref()), (503, Some("1")));
        gate.add_permits(1);
        assert_eq!(first.await.unwrap(), 200);
    })
    .await;
}

#[tokio::test]
async fn proxy_protocol_comes_before_tls_on_https_listeners() {
    bounded(async {
        let (cert, pem) = cert_for("a.test");
        let mut https = listener("tls", ListenerProtocol::Https);
        https.tls = Some(ListenerTls {
            certificates: vec![cert],
            min_version: TlsVersion::Tls12,
            client_auth: None,
            host_client_auth: Vec::new(),
        });
        let mut cfg = Config {
            listeners: vec![https],
            virtual_hosts: vec![vhost(
                "a",
                &["a.test"],
                vec![with_filters(
                    fixed_route("r", "/", "secure ok"),
                    vec![Filter::IpAccess(IpAccess {
                        allow: vec![],
                        deny: vec!["198.51.100.0/24".into()],
                    })],
                )],
            )],
            ..Config::default()
        };
        cfg.client_ip.proxy_protocol = vec!["tls".into()];
        let h = Harness::start(cfg).await;
        let addr = h.addr("tls").await;
        let run = |source: &'static str| {
            let pem = pem.clone();
            async move {
                let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let header = encode_v2(source.parse().unwrap(), addr, false);
                tcp.write_all(&header).await.unwrap();
                let name = rustls_pki_types::ServerName::try_from("a.test").unwrap();
                let mut tls = tls_connector(&pem, &[b"http/1.1"])
                    .connect(name, tcp)
                    .await
                    .expect("TLS after the PROXY header");
                tls.write_all(b"GET / HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n")
                    .await
                    .unwrap();
                let mut out = Vec::new();
                let _ = tls.read_to_end(&mut out).await;
                let text = String::from_utf8_lossy(&out).into_owned();
                text.lines().next().unwrap_or_default().to_string()
            }
        };
        assert_eq!(run("198.51.100.20:1000").await, "HTTP/1.1 403 Forbidden");
        assert_eq!(run("203.0.113.20:1000").await, "HTTP/1.1 200 OK");
    })
    .await;
}

/// Behind a trusted load balancer that sends PROXY headers, `max_connections_per_client`
/// counts the client each header names, not the balancer (whose own connections would
/// otherwise be exempt as a trusted proxy's, turning the cap off for everyone).
#[tokio::test]
async fn the_per_client_connection_cap_counts_the_proxy_protocol_client() {
    bounded(async {
        let mut cfg = http_config(vec![vhost("v", &[], vec![fixed_route("r", "/", "ok")])]);
        cfg.client_ip.trusted_proxies = vec!["127.0.0.1".into()];
        cfg.client_ip.proxy_protocol = vec!["web".into()];
        cfg.limits.max_connections_per_client = 1;
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        let client = b"PROXY TCP4 192.0.2.7 127.0.0.1 5555 80\r\n";
        // The first connection of 192.0.2.7 stays open (keep-alive, answered).
        let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
        first.write_all(client).await.unwrap();
        first
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        first.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
        // A second one of the same client is closed unanswered; another client is served.
        assert_eq!(raw_get(addr, client, "/").await, None);
        assert!(limit_hits(&h, "client_connections") >= 1);
        let other = b"PROXY TCP4 192.0.2.8 127.0.0.1 5555 80\r\n";
        assert_eq!(
            raw_get(addr, other, "/").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        drop(first);
    })
    .await;
}
