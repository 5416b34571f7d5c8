//! The access log and request ids end to end (issue 21): a real Sweety runtime with the log
//! written to a file, a real HTTP/1.1 origin, HTTP/1.1 and h2c clients on real sockets.
//! Each request's log line is read back and its field values checked: a proxied success, a
//! 404, a 502 (nothing listens), a 504 (route request timeout), a cache miss then hit, and a
//! hostile User-Agent/Referer sent as raw bytes. The `X-Request-Id` the origin received is
//! the one the client got back and the one logged; a client's own id is replaced.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;
use sweety_dataplane::reload::{Runtime, RuntimeOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An origin answering `id=<the X-Request-Id it received>`; `/slow` answers after 3 s. It
/// records every id it saw.
async fn origin() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    let addr = spawn_http_backend(move |req| {
        let seen = s2.clone();
        async move {
            let ids: Vec<String> = req
                .headers()
                .get_all("x-request-id")
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect();
            assert_eq!(ids.len(), 1, "exactly one id upstream: {ids:?}");
            seen.lock().unwrap().push(ids[0].clone());
            if req.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            let mut b = http::Response::builder().header("content-type", "text/plain");
            if req.uri().path().starts_with("/cached") {
                b = b.header("cache-control", "public, max-age=60");
            }
            let body = format!("id={}", ids[0]);
            b.body(Full::new(Bytes::from(body))).unwrap()
        }
    })
    .await;
    (addr, seen)
}

struct Setup {
    _runtime: Arc<Runtime>,
    addr: SocketAddr,
    /// The HTTPS listener (certificate for `localhost`, trusted by `ca`).
    tls_addr: SocketAddr,
    ca: String,
    origin: SocketAddr,
    dead: SocketAddr,
    /// Keeps `dead` refusing connections (common::refused_addr).
    _refusing: socket2::Socket,
    seen: Arc<Mutex<Vec<String>>>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// A runtime writing its access log (`format`) to a file in a temporary directory, with `cfg`
/// applied: the runtime, its bound listeners, the log's path, and the directory (kept while
/// the test runs).
async fn logging(
    cfg: Config,
    format: AccessLogFormat,
) -> (
    Arc<Runtime>,
    std::collections::HashMap<String, SocketAddr>,
    PathBuf,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let runtime = Arc::new(
        Runtime::new(RuntimeOptions {
            access_log: AccessLog {
                enabled: true,
                path: Some(log.clone()),
                buffer_lines: 1024,
                format,
            },
            ..RuntimeOptions::default()
        })
        .unwrap(),
    );
    runtime.apply(cfg).await.expect("config applies");
    let bound = runtime.bound().await;
    (runtime, bound, log, dir)
}

async fn start(format: AccessLogFormat) -> Setup {
    start_with(format, ClientIp::default()).await
}

async fn start_with(format: AccessLogFormat, client_ip: ClientIp) -> Setup {
    let (origin, seen) = origin().await;
    // A port nothing listens on.
    let (_refusing, dead) = common::refused_addr();
    let mut cached = proxy_route("cached", "/cached", "up");
    cached.filters.push(Filter::Cache(CachePolicy::default()));
    let mut slow = proxy_route("slow", "/slow", "up");
    slow.timeouts.request = Some(sweety_config::Duration::from_millis(300));
    let (cert, ca) = cert_for("localhost");
    let mut cfg = Config {
        backends: vec![backend("up", origin), backend("down", dead)],
        client_ip,
        ..http_config(vec![vhost(
            "app",
            &[],
            vec![
                cached,
                slow,
                proxy_route("down", "/down", "down"),
                proxy_route("ok", "/hello", "up"),
            ],
        )])
    };
    cfg.listeners.push(Listener {
        tls: Some(ListenerTls {
            certificates: vec![cert],
            min_version: TlsVersion::Tls12,
            client_auth: None,
            host_client_auth: Vec::new(),
        }),
        ..listener("tls", ListenerProtocol::Https)
    });
    let (runtime, bound, log, dir) = logging(cfg, format).await;
    let (addr, tls_addr) = (*bound.get("web").unwrap(), *bound.get("tls").unwrap());
    Setup {
        _runtime: runtime,
        addr,
        tls_addr,
        ca,
        origin,
        dead,
        _refusing,
        seen,
        log,
        _dir: dir,
    }
}

/// The first `n` lines of the log, waiting (bounded) for them.
async fn lines(path: &Path, n: usize) -> Vec<String> {
    for _ in 0..200 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: Vec<String> = text.lines().map(str::to_string).collect();
        if v.len() >= n {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "fewer than {n} log lines:\n{}",
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

async fn json_lines(path: &Path, n: usize) -> Vec<Value> {
    lines(path, n)
        .await
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

struct Got {
    status: u16,
    id: String,
    x_cache: Option<String>,
    body: String,
}

async fn fetch(c: &Client, addr: SocketAddr, path: &str) -> Got {
    let req = http::Request::get(format!("http://{addr}{path}"))
        .header("x-request-id", "client-chosen")
        .header("user-agent", "test-agent/1")
        .header("referer", "http://ref.test/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("in time")
        .unwrap();
    let ids: Vec<_> = resp.headers().get_all("x-request-id").iter().collect();
    assert_eq!(ids.len(), 1, "exactly one id returned");
    let id = ids[0].to_str().unwrap().to_string();
    let status = resp.status().as_u16();
    let x_cache = resp
        .headers()
        .get("x-cache")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        id,
        x_cache,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[tokio::test]
async fn every_outcome_is_logged_with_its_request_id_over_h1_and_h2() {
    let s = start(AccessLogFormat::Json).await;
    let mut n = 0;
    for (c, proto) in [(h1_client(), "HTTP/1.1"), (h2c_client(), "HTTP/2")] {
        let seen_before = s.seen.lock().unwrap().len();
        // Success through the origin: the id went upstream, came back, and is logged.
        let ok = fetch(&c, s.addr, "/hello?q=1").await;
        assert_eq!(ok.status, 200, "{}", ok.body);
        assert_ne!(
            ok.id, "client-chosen",
            "an untrusted client's id is replaced"
        );
        assert_eq!(ok.id.len(), 32);
        assert_eq!(
            ok.body,
            format!("id={}", ok.id),
            "the origin got the same id"
        );
        assert_eq!(s.seen.lock().unwrap()[seen_before], ok.id);
        // 404: no route for this path.
        let nf = fetch(&c, s.addr, "/nothing/here").await;
        assert_eq!(nf.status, 404);
        // 502: nothing listens.
        let bad = fetch(&c, s.addr, "/down").await;
        assert_eq!(bad.status, 502);
        // 504: the route's request timeout (300 ms) before the origin's answer (3 s).
        let slow = fetch(&c, s.addr, "/slow").await;
        assert_eq!(slow.status, 504);
        // Cache: a miss, then a hit served without the origin, with a fresh id.
        let path = format!("/cached/{proto}");
        let miss = fetch(&c, s.addr, &path).await;
        let hit = fetch(&c, s.addr, &path).await;
        assert_eq!(miss.x_cache.as_deref(), Some("MISS"));
        assert_eq!(hit.x_cache.as_deref(), Some("HIT"));
        assert_eq!(hit.body, format!("id={}", miss.id), "stored body");
        assert_ne!(hit.id, miss.id, "a hit gets its own id, not the stored one");

        n += 6;
        let all = json_lines(&s.log, n).await;
        let got = &all[n - 6..];
        let by_id = |id: &str| {
            got.iter()
                .find(|l| l["request_id"] == id)
                .unwrap_or_else(|| panic!("no line for {id}: {got:#?}"))
                .clone()
        };
        let l = by_id(&ok.id);
        assert_eq!(l["status"], 200);
        assert_eq!(l["protocol"], proto);
        assert_eq!(l["method"], "GET");
        assert_eq!(l["authority"], "127.0.0.1");
        assert_eq!(l["path"], "/hello?q=1");
        assert_eq!(l["route"], "ok");
        assert_eq!(l["listener"], "web");
        assert_eq!(l["client_addr"], "127.0.0.1");
        assert_eq!(l["real_client_ip"], "127.0.0.1");
        assert!(l["client_port"].as_u64().unwrap() > 0);
        assert_eq!(l["bytes_sent"], ok.body.len());
        assert_eq!(l["backend"], "up");
        assert_eq!(l["upstream_addr"], s.origin.to_string());
        assert_eq!(l["upstream_status"], 200);
        assert_eq!(l["retries"], 0);
        assert!(l["upstream_header_us"].as_u64().unwrap() <= l["duration_us"].as_u64().unwrap());
        assert_eq!(l["user_agent"], "test-agent/1");
        assert_eq!(l["referer"], "http://ref.test/");
        assert_eq!(l["tls"], false);
        assert!(l["time"].as_str().unwrap().ends_with('Z'));
        assert!(l.get("cache").is_none());

        let l = by_id(&nf.id);
        assert_eq!(
            (l["status"].clone(), l["route"].clone()),
            (404.into(), "-".into())
        );
        assert_eq!(l["path"], "/nothing/here");
        assert!(l.get("backend").is_none() && l.get("upstream_status").is_none());

        let l = by_id(&bad.id);
        assert_eq!(
            (l["status"].clone(), l["route"].clone()),
            (502.into(), "down".into())
        );
        assert_eq!(l["backend"], "down");
        assert_eq!(l["upstream_addr"], s.dead.to_string());
        assert!(l.get("upstream_status").is_none(), "no answer: {l}");

        let l = by_id(&slow.id);
        assert_eq!(
            (l["status"].clone(), l["route"].clone()),
            (504.into(), "slow".into())
        );
        let us = l["duration_us"].as_u64().unwrap();
        assert!((300_000..3_000_000).contains(&us), "{us}");

        assert_eq!(by_id(&miss.id)["cache"], "MISS");
        assert_eq!(by_id(&miss.id)["upstream_status"], 200);
        let l = by_id(&hit.id);
        assert_eq!(l["cache"], "HIT");
        assert!(
            l.get("upstream_addr").is_none(),
            "a hit never reached the origin"
        );
        assert_eq!(l["status"], 200);
    }
}

/// Raw bytes a client may put in header fields (quotes, backslashes, obs-text): the JSON
/// line still parses and the text line stays one line with its own quotes only.
#[tokio::test]
async fn hostile_header_values_do_not_break_a_line() {
    for format in [AccessLogFormat::Json, AccessLogFormat::Combined] {
        let s = start(format).await;
        let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let mut req = Vec::new();
        req.extend_from_slice(b"GET /hello/a%22b%0A?x=%22y%22 HTTP/1.1\r\nHost: app.test\r\n");
        req.extend_from_slice(b"User-Agent: a\"b\\c\xff\xfe d\" \"-\r\n");
        req.extend_from_slice(b"Referer: x\" [01/Jan/1970] \"GET / HTTP/1.1\" 200\r\n");
        req.extend_from_slice(b"X-Request-Id: \"evil\"\r\nConnection: close\r\n\r\n");
        tcp.write_all(&req).await.unwrap();
        let mut resp = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut resp)).await;
        let text = String::from_utf8_lossy(&resp).into_owned();
        assert!(text.starts_with("HTTP/1.1 "), "{text}");
        let line = lines(&s.log, 1).await.remove(0);
        match format {
            AccessLogFormat::Json => {
                let v: Value = serde_json::from_str(&line).unwrap();
                assert_eq!(v["user_agent"], "a\"b\\c\u{fffd}\u{fffd} d\" \"-");
                assert_eq!(v["referer"], "x\" [01/Jan/1970] \"GET / HTTP/1.1\" 200");
                assert_ne!(v["request_id"], "\"evil\"");
            }
            AccessLogFormat::Combined => {
                assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b)), "{line:?}");
                assert_eq!(line.matches('"').count(), 6, "{line}");
                assert!(line.contains("\"a\\x22b\\x5Cc\\xEF\\xBF\\xBD"), "{line}");
                assert!(!line.contains("evil"), "{line}");
            }
        }
    }
}

/// Behind a trusted proxy (127.0.0.1 here) a valid incoming id is kept end to end, and the
/// real client comes from `X-Forwarded-For`; an invalid one is still replaced.
#[tokio::test]
async fn a_trusted_proxys_request_id_is_kept() {
    let s = start_with(
        AccessLogFormat::Json,
        ClientIp {
            trusted_proxies: vec!["127.0.0.1/32".into()],
            ..ClientIp::default()
        },
    )
    .await;
    let c = h1_client();
    for (sent, kept) in [("edge-4f2a:7", true), ("has space", false)] {
        let req = http::Request::get(format!("http://{}/hello", s.addr))
            .header("x-request-id", sent)
            .header("x-forwarded-for", "198.51.100.9")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, format!("id={id}").as_bytes());
        assert_eq!(id == sent, kept, "{sent} -> {id}");
    }
    let l = json_lines(&s.log, 2).await;
    assert_eq!(l[0]["request_id"], "edge-4f2a:7");
    assert_eq!(l[0]["real_client_ip"], "198.51.100.9");
    assert_eq!(l[0]["client_addr"], "127.0.0.1");
    assert_ne!(l[1]["request_id"], "has space");
}

/// Over TLS the line names the server name, version and cipher suite the handshake agreed.
#[tokio::test]
async fn tls_fields_are_logged() {
    let s = start(AccessLogFormat::Json).await;
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let (_, status, body) = tls_get(s.tls_addr, "localhost", &s.ca, &[alpn], "/hello")
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let l = json_lines(&s.log, 2).await;
    for (l, proto) in l.iter().zip(["HTTP/1.1", "HTTP/2"]) {
        assert_eq!(l["protocol"], proto);
        assert_eq!(l["tls"], true);
        assert_eq!(l["listener"], "tls");
        assert_eq!(l["sni"], "localhost");
        assert_eq!(l["tls_version"], "TLSv1.3");
        assert!(
            l["tls_cipher"].as_str().unwrap().starts_with("TLS13_"),
            "{l}"
        );
    }
}

/// An HTTPS origin (self-signed, ALPN http/1.1) that waits `delay` after accepting a TCP
/// connection before its TLS handshake, and answers `got=<request body length>`.
async fn slow_handshake_origin(delay: Duration) -> SocketAddr {
    use rustls_pki_types::pem::PemObject;
    let (cert, key) = sweety_dataplane::tls::self_signed(&["localhost"]).unwrap();
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(Result::unwrap)
        .collect();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    spawn_backend(move |s| {
        let acceptor = acceptor.clone();
        async move {
            tokio::time::sleep(delay).await;
            let Ok(tls) = acceptor.accept(s).await else {
                return;
            };
            let svc = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    let n = req
                        .into_body()
                        .collect()
                        .await
                        .map_or(0, |b| b.to_bytes().len());
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                        format!("got={n}"),
                    ))))
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
        }
    })
    .await
}

/// `bytes_received`, `upstream_connect_us` and `upstream_response_us`: a 1234-byte POST over
/// HTTP/1.1 and a 70,000-byte PUT over h2c to an HTTPS origin whose handshake waits 300 ms
/// (the first try opens a connection: at least 300 ms to connect; the second reuses it: far
/// less), a GET (0 bytes), a connect failure (no connect time, no response time) and a fixed
/// reply (no upstream fields). Times are checked by their order and the origin's delay, not
/// by their speed.
#[tokio::test]
async fn bytes_received_and_upstream_connect_and_response_times_are_logged() {
    let delay = Duration::from_millis(300);
    let origin = slow_handshake_origin(delay).await;
    let (_refusing, dead) = common::refused_addr();
    let mut tls_up = backend("tls-up", origin);
    tls_up.protocol = BackendProtocol::Https;
    let cfg = Config {
        backends: vec![tls_up, backend("down", dead)],
        ..http_config(vec![vhost(
            "app",
            &[],
            vec![
                proxy_route("up", "/up", "tls-up"),
                proxy_route("down", "/down", "down"),
                fixed_route("fixed", "/fixed", "hello"),
            ],
        )])
    };
    let (_runtime, bound, log, _dir) = logging(cfg, AccessLogFormat::Json).await;
    let addr = *bound.get("web").unwrap();
    let send = |c: Client, method: &'static str, path: &'static str, len: usize| async move {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
            .await
            .expect("in time")
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let (h1, h2) = (h1_client(), h2c_client());
    assert_eq!(
        send(h1.clone(), "POST", "/up", 1234).await,
        (200, "got=1234".into())
    );
    assert_eq!(
        send(h2.clone(), "PUT", "/up", 70_000).await,
        (200, "got=70000".into())
    );
    assert_eq!(
        send(h1.clone(), "GET", "/up", 0).await,
        (200, "got=0".into())
    );
    assert_eq!(send(h1.clone(), "GET", "/down", 0).await.0, 502);
    assert_eq!(
        send(h1.clone(), "POST", "/fixed", 10).await,
        (200, "hello".into())
    );

    let l = json_lines(&log, 5).await;
    let us = |l: &Value, f: &str| l[f].as_u64().unwrap_or_else(|| panic!("no {f} in {l}"));
    // The first request opened the connection: TCP, then the 300 ms wait, then TLS.
    assert_eq!(l[0]["bytes_received"], 1234, "{}", l[0]);
    assert!(
        us(&l[0], "upstream_connect_us") >= delay.as_micros() as u64,
        "{}",
        l[0]
    );
    // The others reused it: no handshake to wait for.
    assert_eq!(l[1]["bytes_received"], 70_000, "{}", l[1]);
    assert_eq!(l[1]["protocol"], "HTTP/2");
    assert_eq!(l[2]["bytes_received"], 0, "{}", l[2]);
    for l in &l[1..3] {
        assert!(
            us(l, "upstream_connect_us") < delay.as_micros() as u64,
            "{l}"
        );
    }
    for l in &l[0..3] {
        assert_eq!(l["upstream_status"], 200);
        let (c, h, r, d) = (
            us(l, "upstream_connect_us"),
            us(l, "upstream_header_us"),
            us(l, "upstream_response_us"),
            us(l, "duration_us"),
        );
        assert!(
            c <= h && h <= r && r <= d,
            "connect {c} header {h} response {r} total {d}: {l}"
        );
    }
    // Nothing listens: no connection, no answer.
    assert_eq!(l[3]["status"], 502);
    assert!(l[3].get("upstream_header_us").is_some(), "{}", l[3]);
    assert!(l[3].get("upstream_connect_us").is_none(), "{}", l[3]);
    assert!(l[3].get("upstream_response_us").is_none(), "{}", l[3]);
    // Not proxied: the body is not read, no upstream fields.
    assert_eq!(l[4]["route"], "fixed");
    assert_eq!(l[4]["bytes_received"], 0);
    for f in [
        "upstream_connect_us",
        "upstream_response_us",
        "upstream_header_us",
    ] {
        assert!(l[4].get(f).is_none(), "{f}: {}", l[4]);
    }
}

// A client that closes its connection while its request waits for the backend: on both
// HTTP/1.1 engines the request is dropped at once, which closes the backend connection (the
// backend request is cancelled, not left to run to its timeout), and the request writes no
// access log line (hyper's engine drops the request's future before any response exists;
// Sweety's engine does the same). Before, Sweety's engine read nothing while the request ran
// and noticed the client only when it wrote the answer.
#[tokio::test]
async fn a_client_gone_mid_request_cancels_the_backend_request_on_both_engines() {
    for engine in [Http1Engine::Sweety, Http1Engine::Hyper] {
        let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
        let (gone_tx, mut gone) = tokio::sync::mpsc::unbounded_channel();
        // A backend that takes the request and never answers; it tells when its connection ends.
        let hang = spawn_backend(move |mut s| {
            let (arrived, gone) = (arrived_tx.clone(), gone_tx.clone());
            async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let _ = arrived.send(());
                }
                let _ = gone.send(());
            }
        })
        .await;
        let (origin, _seen) = origin().await;
        let mut cfg = Config {
            backends: vec![backend("up", origin), backend("hang", hang)],
            ..http_config(vec![vhost(
                "app",
                &[],
                vec![
                    proxy_route("hang", "/hang", "hang"),
                    proxy_route("ok", "/hello", "up"),
                ],
            )])
        };
        cfg.limits.http1_engine = engine;
        let (_runtime, bound, log, _dir) = logging(cfg, AccessLogFormat::Json).await;
        let addr = *bound.get("web").unwrap();
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /hang HTTP/1.1\r\nHost: app\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), arrived.recv())
            .await
            .expect("the request reaches the backend")
            .unwrap();
        drop(c);
        tokio::time::timeout(Duration::from_secs(10), gone.recv())
            .await
            .unwrap_or_else(|_| panic!("{engine:?}: the backend request is cancelled"))
            .unwrap();
        // The next request's line is the first: the abandoned one wrote none.
        let got = fetch(&h1_client(), addr, "/hello").await;
        assert_eq!(got.status, 200);
        let l = json_lines(&log, 1).await;
        assert_eq!(l.len(), 1, "{engine:?}: {l:?}");
        assert_eq!(l[0]["path"], "/hello", "{engine:?}");
    }
}
