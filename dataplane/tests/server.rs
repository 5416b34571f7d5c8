//! Server-level integration tests with real sockets on 127.0.0.1: TLS with SNI and ALPN,
//! slowloris and overload protection, hot reload under load, rejected configs, listener
//! add/remove, the admin endpoints and real curl clients.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sweety_config::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn tls_selects_the_certificate_by_sni_and_negotiates_alpn() {
    let (cert_a, pem_a) = cert_for("a.test");
    let (cert_b, pem_b) = cert_for("b.test");
    let mut https = listener("tls", ListenerProtocol::Https);
    https.tls = Some(ListenerTls {
        certificates: vec![cert_a, cert_b],
        min_version: TlsVersion::Tls12,
        client_auth: None,
        host_client_auth: Vec::new(),
    });
    let cfg = Config {
        listeners: vec![https],
        virtual_hosts: vec![
            vhost("a", &["a.test"], vec![fixed_route("a", "/", "site A")]),
            vhost("b", &["b.test"], vec![fixed_route("b", "/", "site B")]),
        ],
        ..Config::default()
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("tls").await;

    let (alpn, status, body) = tls_get(addr, "a.test", &pem_a, &[b"h2", b"http/1.1"], "/")
        .await
        .unwrap();
    assert_eq!(
        (alpn.as_slice(), status, body.as_str()),
        (&b"h2"[..], 200, "site A")
    );
    let (alpn, status, body) = tls_get(addr, "b.test", &pem_b, &[b"http/1.1"], "/x")
        .await
        .unwrap();
    assert_eq!(
        (alpn.as_slice(), status, body.as_str()),
        (&b"http/1.1"[..], 200, "site B")
    );
    // b.test is served with B's certificate, which A's CA does not sign.
    let err = tls_get(addr, "b.test", &pem_a, &[b"h2"], "/")
        .await
        .unwrap_err();
    assert!(err.contains("handshake"), "{err}");
}

#[tokio::test]
async fn slowloris_connection_is_closed_after_the_header_timeout() {
    let mut cfg = http_config(vec![vhost("v", &[], vec![fixed_route("r", "/", "ok")])]);
    cfg.limits.header_read_timeout = sweety_config::Duration::from_millis(300);
    let h = Harness::start(cfg).await;
    let mut s = tokio::net::TcpStream::connect(h.addr("web").await)
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let start = Instant::now();
    let mut buf = Vec::new();
    // The server must close the connection (possibly after a 408) well before this bound.
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "connection still open after 5s");
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "closed before the timeout"
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "unexpected reply {text:?}"
    );
}

/// A backend that accepts connections and answers each request after `delay`.
async fn slow_backend(delay: Duration) -> std::net::SocketAddr {
    spawn_backend(move |mut s| async move {
        let mut buf = vec![0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    tokio::time::sleep(delay).await;
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nslow")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn overload_is_answered_with_503_and_retry_after_not_a_hang() {
    let be = slow_backend(Duration::from_millis(1500)).await;
    let mut cfg = http_config(vec![vhost(
        "v",
        &[],
        vec![proxy_route("slow", "/", "slow")],
    )]);
    cfg.backends = vec![backend("slow", be)];
    cfg.limits.max_requests_in_flight = 2;
    cfg.limits.queue_timeout = sweety_config::Duration::from_millis(100);
    cfg.limits.retry_after_seconds = 3;
    let h = Harness::start(cfg).await;
    let url = format!("http://{}/", h.addr("web").await);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let resp = reqwest_like(&url).await;
            (resp, start.elapsed())
        }));
    }
    let mut ok = 0;
    let mut rejected = 0;
    for t in tasks {
        let ((status, retry_after), elapsed) = t.await.unwrap();
        match status {
            200 => ok += 1,
            503 => {
                rejected += 1;
                assert_eq!(retry_after.as_deref(), Some("3"));
                assert!(
                    elapsed < Duration::from_millis(1200),
                    "503 took {elapsed:?}"
                );
            }
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(ok, 2, "exactly the two admitted requests succeed");
    assert_eq!(rejected, 4);
    let m = &h.runtime.shared.metrics;
    assert_eq!(m.limit_rejections.get(&"max_requests_in_flight"), 4);
}

async fn reqwest_like(url: &str) -> (u16, Option<String>) {
    let client = h1_client();
    let resp = client
        .request(
            http::Request::get(url)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let ra = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (resp.status().as_u16(), ra)
}

fn gen_config(generation: u64, extra_listener: bool) -> Config {
    let mut cfg = http_config(vec![vhost(
        "v",
        &[],
        vec![fixed_route("r", "/", &format!("gen-{generation}"))],
    )]);
    cfg.generation = generation;
    if extra_listener {
        cfg.listeners.push(Listener {
            address: "127.0.0.2".into(),
            ..listener("extra", ListenerProtocol::Http)
        });
    }
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_50_times_under_load_fails_no_request() {
    let h = Harness::start(gen_config(1, false)).await;
    let url = format!("http://{}/", h.addr("web").await);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for i in 0..4 {
        let client = if i % 2 == 0 {
            h1_client()
        } else {
            h2c_client()
        };
        let (url, stop, done) = (url.clone(), stop.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut n = 0u32;
            // Bounded: at most 5,000 requests per client, and until the reloads are over.
            while n < 5_000 && (!stop.load(Ordering::Relaxed) || n < 500) {
                match get(&client, &url, None).await {
                    Ok((200, body)) if body.starts_with("gen-") => {}
                    other => failures.push(format!("{other:?}")),
                }
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            failures
        }));
    }
    for g in 2..=51u64 {
        h.runtime
            .apply(gen_config(g, g % 2 == 0))
            .await
            .expect("reload applies");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        failures.first()
    );
    assert!(
        done.load(Ordering::Relaxed) >= 2_000,
        "only {} requests",
        done.load(Ordering::Relaxed)
    );
    let (status, body) = get(&h1_client(), &url, None).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "gen-51"));
    assert_eq!(
        h.runtime.shared.metrics.reloads_ok.load(Ordering::Relaxed),
        51
    );
}

#[tokio::test]
async fn an_invalid_config_is_rejected_whole_and_the_old_one_keeps_serving() {
    let h = Harness::start(gen_config(1, false)).await;
    let url = format!("http://{}/", h.addr("web").await);
    let mut bad = gen_config(2, false);
    bad.version = 99;
    bad.virtual_hosts[0].routes[0].matches[0].path = Some(PathMatch::Regex("([".into()));
    let err = h.runtime.apply(bad).await.unwrap_err();
    let messages = err.messages();
    assert!(
        messages.iter().any(|m| m.starts_with("version")),
        "{messages:?}"
    );
    assert!(messages.iter().any(|m| m.contains("regex")), "{messages:?}");
    let (status, body) = get(&h1_client(), &url, None).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "gen-1"));
    assert_eq!(
        h.runtime
            .shared
            .metrics
            .reloads_failed
            .load(Ordering::Relaxed),
        1
    );
    assert_eq!(h.runtime.shared.snapshot().config.generation, 1);
}

#[tokio::test]
async fn a_bind_failure_rejects_the_config_and_keeps_the_old_one() {
    let h = Harness::start(gen_config(1, false)).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = gen_config(2, false);
    cfg.listeners.push(Listener {
        port: taken.local_addr().unwrap().port(),
        ..listener("clash", ListenerProtocol::Http)
    });
    let err = h.runtime.apply(cfg).await.unwrap_err();
    assert!(err.to_string().contains("cannot bind"), "{err}");
    assert_eq!(h.runtime.shared.snapshot().config.generation, 1);
    let (status, _) = get(
        &h1_client(),
        &format!("http://{}/", h.addr("web").await),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn listeners_come_and_go_without_dropping_established_connections() {
    let h = Harness::start(gen_config(1, false)).await;
    let web = h.addr("web").await;
    // One HTTP/1.1 connection held across reloads.
    let tcp = tokio::net::TcpStream::connect(web).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = || {
        http::Request::get("/")
            .header("host", "x")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    assert_eq!(send.send_request(req()).await.unwrap().status(), 200);

    h.runtime.apply(gen_config(2, true)).await.unwrap();
    let extra = h.addr("extra").await;
    assert_eq!(
        get(&h1_client(), &format!("http://{extra}/"), None)
            .await
            .unwrap(),
        (200, "gen-2".to_string())
    );
    assert_eq!(h.addr("web").await, web, "kept listener keeps its socket");

    h.runtime.apply(gen_config(3, false)).await.unwrap();
    assert!(!h.runtime.bound().await.contains_key("extra"));
    let mut refused = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(extra).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "removed listener still accepts");

    // The held connection still works and sees the newest config.
    use http_body_util::BodyExt;
    let resp = send.send_request(req()).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"gen-3");
}

#[tokio::test]
async fn admin_reports_health_readiness_metrics_and_config() {
    let runtime = Arc::new(
        sweety_dataplane::reload::Runtime::new(sweety_dataplane::reload::RuntimeOptions {
            access_log: AccessLog {
                enabled: false,
                ..AccessLog::default()
            },
            ..Default::default()
        })
        .unwrap(),
    );
    let admin =
        sweety_dataplane::admin::serve(runtime.shared.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let c = h1_client();
    assert_eq!(
        get(&c, &format!("http://{admin}/healthz"), None)
            .await
            .unwrap()
            .0,
        200
    );
    assert_eq!(
        get(&c, &format!("http://{admin}/readyz"), None)
            .await
            .unwrap()
            .0,
        503
    );
    let cfg = gen_config(7, false);
    let (vhosts, backends) = (cfg.virtual_hosts.len(), cfg.backends.len());
    assert!(vhosts > 0);
    let hash = cfg.content_hash();
    runtime.apply(cfg).await.unwrap();
    assert_eq!(
        get(&c, &format!("http://{admin}/readyz"), None)
            .await
            .unwrap()
            .0,
        200
    );
    let web = runtime.bound().await["web"];
    get(&c, &format!("http://{web}/"), None).await.unwrap();
    let (_, metrics) = get(&c, &format!("http://{admin}/metrics"), None)
        .await
        .unwrap();
    assert!(
        metrics.contains("sweety_requests_total{listener=\"web\",route=\"r\",backend=\"-\",method=\"GET\",code=\"200\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("sweety_config_generation 7"));
    assert!(metrics.contains("sweety_config_reloads_total{result=\"success\"} 1"));
    let (_, config) = get(&c, &format!("http://{admin}/config"), None)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(v["generation"], 7);
    assert_eq!(v["hash"], hash);
    // The snapshot drops its copy of virtual hosts and backends but keeps their counts.
    assert_eq!(v["virtual_hosts"], vhosts);
    assert_eq!(v["backends"], backends);
}

#[tokio::test]
async fn curl_speaks_http1_and_h2c_prior_knowledge() {
    let h = Harness::start(gen_config(4, false)).await;
    let url = format!("http://{}/", h.addr("web").await);
    for flag in ["--http1.1", "--http2-prior-knowledge"] {
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "-o",
                "-",
                "-w",
                "\n%{http_version} %{http_code}",
                flag,
                &url,
            ])
            .output()
            .await
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let want_version = if flag == "--http1.1" { "1.1" } else { "2" };
        assert_eq!(
            text,
            format!("gen-4\n{want_version} 200"),
            "curl {flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn unknown_hosts_and_paths_get_404_and_misdirected_requests_421() {
    let (cert_a, pem_a) = cert_for("a.test");
    let (cert_b, _) = cert_for("b.test");
    let mut https = listener("tls", ListenerProtocol::Https);
    https.tls = Some(ListenerTls {
        certificates: vec![cert_a, cert_b],
        min_version: TlsVersion::Tls12,
        client_auth: None,
        host_client_auth: Vec::new(),
    });
    let mut cfg = http_config(vec![
        vhost("a", &["a.test"], vec![fixed_route("a", "/app", "A")]),
        vhost("b", &["b.test"], vec![fixed_route("b", "/", "B")]),
    ]);
    cfg.listeners.push(https);
    let h = Harness::start(cfg).await;
    let web = h.addr("web").await;
    let c = h1_client();
    assert_eq!(
        get(&c, &format!("http://{web}/app/x"), Some("a.test"))
            .await
            .unwrap(),
        (200, "A".into())
    );
    assert_eq!(
        get(&c, &format!("http://{web}/other"), Some("a.test"))
            .await
            .unwrap()
            .0,
        404
    );
    assert_eq!(
        get(&c, &format!("http://{web}/"), Some("nobody.test"))
            .await
            .unwrap()
            .0,
        404
    );
    // TLS for a.test, then a request for b.test on that connection.
    let tls = h.addr("tls").await;
    let (_, status, _) = tls_get_host(tls, "a.test", "b.test", &pem_a).await;
    assert_eq!(status, 421);
    let (_, status, body) = tls_get_host(tls, "a.test", "a.test", &pem_a).await;
    assert_eq!((status, body.as_str()), (200, "A"));
}

/// The table of the Gateway API conformance test
/// HTTPRouteHTTPSListenerDetectMisdirectedRequests: four HTTPS listeners on one port (no
/// hostname, `second-example.org`, `*.wildcard.org`, `fourth-example.wildcard.org`), one
/// certificate entry each. 421 only when the Host falls into another listener than the SNI.
#[tokio::test]
async fn misdirected_requests_follow_the_listener_chosen_by_sni() {
    let names = [
        "example.org",
        "second-example.org",
        "unknown-example.org",
        "*.wildcard.org",
    ];
    let (c, k) = sweety_dataplane::tls::self_signed(&names).unwrap();
    let cert = |h: &[&str]| Certificate {
        hostnames: h.iter().map(|s| s.to_string()).collect(),
        cert: PemSource::Pem(c.clone()),
        key: PemSource::Pem(k.clone()),
    };
    let mut https = listener("tls", ListenerProtocol::Https);
    https.http3 = false;
    https.tls = Some(ListenerTls {
        certificates: vec![
            cert(&[]),
            cert(&["second-example.org"]),
            cert(&["*.wildcard.org"]),
            cert(&["fourth-example.wildcard.org"]),
        ],
        min_version: TlsVersion::Tls12,
        client_auth: None,
        host_client_auth: Vec::new(),
    });
    let mut cfg = http_config(vec![
        vhost(
            "v1",
            &["example.org"],
            vec![fixed_route("r1", "/app", "V1")],
        ),
        vhost(
            "v2",
            &["second-example.org"],
            vec![fixed_route("r2", "/app", "V2")],
        ),
        vhost(
            "v3",
            &["*.wildcard.org"],
            vec![fixed_route("r3", "/app", "V3")],
        ),
        vhost(
            "v4",
            &["fourth-example.wildcard.org"],
            vec![fixed_route("r4", "/app", "V4")],
        ),
    ]);
    cfg.listeners.push(https);
    let h = Harness::start(cfg).await;
    let tls = h.addr("tls").await;
    let cases: &[(&str, &str, u16, &str)] = &[
        ("example.org", "example.org", 200, "V1"),
        ("example.org", "second-example.org", 421, ""),
        ("example.org", "unknown-example.org", 404, ""),
        ("second-example.org", "second-example.org", 200, "V2"),
        ("second-example.org", "example.org", 421, ""),
        ("second-example.org", "unknown-example.org", 421, ""),
        (
            "third-example.wildcard.org",
            "third-example.wildcard.org",
            200,
            "V3",
        ),
        (
            "third-example.wildcard.org",
            "fith-example.wildcard.org",
            200,
            "V3",
        ),
        (
            "third-example.wildcard.org",
            "fourth-example.wildcard.org",
            421,
            "",
        ),
        ("third-example.wildcard.org", "second-example.org", 421, ""),
        ("third-example.wildcard.org", "unknown-example.org", 421, ""),
        (
            "fourth-example.wildcard.org",
            "fourth-example.wildcard.org",
            200,
            "V4",
        ),
        (
            "fourth-example.wildcard.org",
            "fith-example.wildcard.org",
            421,
            "",
        ),
        ("unknown-example.org", "example.org", 200, "V1"),
        ("unknown-example.org", "unknown-example.org", 404, ""),
    ];
    for &(sni, host, want, body) in cases {
        let (_, status, got) = tls_get_host(tls, sni, host, &c).await;
        assert_eq!(status, want, "SNI {sni}, Host {host}: {got}");
        if want == 200 {
            assert_eq!(got, body, "SNI {sni}, Host {host}");
        }
    }
}

async fn tls_get_host(
    addr: std::net::SocketAddr,
    sni: &str,
    host: &str,
    ca: &str,
) -> (Vec<u8>, u16, String) {
    // tls_get sends Host = SNI for HTTP/1.1; build the mismatched request by hand over h2.
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tls_connector(ca, &[b"h2"])
        .connect(
            rustls_pki_types::ServerName::try_from(sni.to_string()).unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("https://{host}/app"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        b"h2".to_vec(),
        status,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let mut cfg = http_config(vec![vhost("v", &[], vec![fixed_route("r", "/", "ok")])]);
    cfg.limits.header_read_timeout = sweety_config::Duration::from_millis(300);
    cfg.limits.idle_timeout = sweety_config::Duration::from_millis(400);
    let h = Harness::start(cfg).await;
    let mut s = tokio::net::TcpStream::connect(h.addr("web").await)
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // Now idle: the server closes the connection after the idle timeout.
    let start = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "idle connection not closed: {read:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(250));
}

/// GET / over TLS (HTTP/1.1) to `addr` with SNI `sni`, trusting `server_ca`, presenting
/// `client` (certificate and key PEM) when given. Returns the status or the error.
async fn mtls_get(
    addr: std::net::SocketAddr,
    sni: &str,
    server_ca: &str,
    client: Option<(&str, &str)>,
) -> Result<u16, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(server_ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // With TLS 1.3 the server judges the client certificate after the client finished its
    // side of the handshake: a rejection arrives as an alert on the first read.
    tls.write_all(format!("GET / HTTP/1.1\r\nhost: {sni}\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf)).await;
    match read {
        Err(_) => return Err("no answer within 10 s".into()),
        Ok(Err(e)) if buf.is_empty() => return Err(format!("read: {e}")),
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&buf);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))
}

#[tokio::test]
async fn client_certificates_required_or_insecure_fallback() {
    let (trusted_ca, good_cert, good_key) = client_ca_and_cert("trusted client CA");
    let (_, other_cert, other_key) = client_ca_and_cert("unknown client CA");
    let (server_cert, server_ca) = cert_for("mtls.test");
    let https = |name: &str, mode: ClientAuthMode| {
        let mut l = listener(name, ListenerProtocol::Https);
        l.http3 = false;
        l.tls = Some(ListenerTls {
            certificates: vec![server_cert.clone()],
            min_version: TlsVersion::Tls12,
            client_auth: Some(ClientAuth {
                ca: PemSource::Pem(trusted_ca.clone()),
                mode,
            }),
            host_client_auth: Vec::new(),
        });
        l
    };
    let mut v = vhost("v", &[], vec![fixed_route("r", "/", "served")]);
    v.listeners = vec!["require".into(), "fallback".into()];
    let cfg = Config {
        listeners: vec![
            https("require", ClientAuthMode::Require),
            https("fallback", ClientAuthMode::AllowInsecureFallback),
        ],
        virtual_hosts: vec![v],
        ..Config::default()
    };
    let h = Harness::start(cfg).await;
    let require = h.addr("require").await;
    let fallback = h.addr("fallback").await;
    let good = Some((good_cert.as_str(), good_key.as_str()));
    let other = Some((other_cert.as_str(), other_key.as_str()));

    assert_eq!(
        mtls_get(require, "mtls.test", &server_ca, good).await,
        Ok(200)
    );
    let err = mtls_get(require, "mtls.test", &server_ca, other)
        .await
        .unwrap_err();
    assert!(
        err.contains("UnknownIssuer") || err.contains("alert"),
        "{err}"
    );
    let err = mtls_get(require, "mtls.test", &server_ca, None)
        .await
        .unwrap_err();
    assert!(
        err.contains("CertificateRequired") || err.contains("alert"),
        "{err}"
    );
    for client in [good, other, None] {
        assert_eq!(
            mtls_get(fallback, "mtls.test", &server_ca, client).await,
            Ok(200),
            "fallback serves every client"
        );
    }

    // A real curl client: with the trusted certificate it is served, without it refused.
    let dir = tempfile::tempdir().unwrap();
    let write = |n: &str, text: &str| {
        let p = dir.path().join(n);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let (ca, crt, key) = (
        write("server-ca.pem", &server_ca),
        write("client.pem", &good_cert),
        write("client.key", &good_key),
    );
    let url = format!("https://mtls.test:{}/", require.port());
    let resolve = format!("mtls.test:{}:127.0.0.1", require.port());
    let curl = |with_cert: bool| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sS", "--max-time", "5", "-o", "-", "-w", " %{http_code}"])
            .args(["--cacert", &ca, "--resolve", &resolve]);
        if with_cert {
            c.args(["--cert", &crt, "--key", &key]);
        }
        c.arg(&url);
        c
    };
    let out = curl(true).output().await.expect("curl runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "served 200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = curl(false).output().await.expect("curl runs");
    assert!(
        !out.status.success(),
        "curl without a certificate is refused"
    );
}
