//! Integration tests of the reverse proxy against real backend servers on 127.0.0.1:
//! HTTP/1.1, h2c, HTTP/1.1 over TLS and h2 over TLS, pooling, streaming both ways, error
//! replies, retries, outlier ejection, weighted splits, forwarding headers and mirrors.
//!
//! Every test is bounded by [`bounded`] and every load loop by a fixed count.

mod common;

use bytes::Bytes;
use common::spawn_backend;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use sweety_config::{Backend, Mirror, ProxyAction, Route, DEFAULT_PROXY_READ_AHEAD};
use sweety_dataplane::body::{boxed, empty, full, Body};
use sweety_dataplane::ctx::{ConnInfo, Protocol, RequestCtx};
use sweety_dataplane::metrics::Metrics;
use sweety_dataplane::proxy::Upstreams;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync,
>;

fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    Arc::new(move |r| Box::pin(f(r)))
}

/// A backend server counting connections and requests.
struct Server {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    hits: Arc<AtomicUsize>,
}

impl Server {
    fn address(&self) -> String {
        self.addr.to_string()
    }
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn spawn_server(tls: Option<Arc<rustls::ServerConfig>>, h: Handler) -> Server {
    let conns = Arc::new(AtomicUsize::new(0));
    let hits = Arc::new(AtomicUsize::new(0));
    let (c, hs) = (conns.clone(), hits.clone());
    let addr = spawn_backend(move |tcp| {
        c.fetch_add(1, Ordering::SeqCst);
        let (h, hs, tls) = (h.clone(), hs.clone(), tls.clone());
        async move {
            let svc = hyper::service::service_fn(move |req| {
                hs.fetch_add(1, Ordering::SeqCst);
                let h = h.clone();
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            match tls {
                None => {
                    let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                }
                Some(cfg) => {
                    let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await else {
                        return;
                    };
                    let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                }
            }
        }
    })
    .await;
    Server { addr, conns, hits }
}

/// A self-signed server certificate for `names` and its PEM (the CA to trust).
fn tls_server(names: &[&str]) -> (Arc<rustls::ServerConfig>, String) {
    let ck =
        rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (Arc::new(cfg), ck.cert.pem())
}

/// Echoes method, URI, version, the host (header or authority), headers and body.
fn echo() -> Handler {
    handler(|req: Request<Incoming>| async move {
        let host = req
            .headers()
            .get("host")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .unwrap_or_default();
        let mut s = format!(
            "{} {} {:?}\nauthority={host}\n",
            req.method(),
            req.uri().path(),
            req.version()
        );
        for (k, v) in req.headers() {
            s.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
        }
        let body = req.into_body().collect().await.unwrap().to_bytes();
        s.push_str(&format!("body={}\n", String::from_utf8_lossy(&body)));
        Response::new(full(s))
    })
}

fn status_handler(code: u16) -> Handler {
    handler(move |_req| async move {
        let mut r = Response::new(full("x"));
        *r.status_mut() = StatusCode::from_u16(code).unwrap();
        r
    })
}

fn ctx() -> RequestCtx {
    RequestCtx {
        conn: Arc::new(ConnInfo {
            listener: "test".into(),
            peer: "192.0.2.9:40000".parse().unwrap(),
            local: "127.0.0.1:8080".parse().unwrap(),
            tls: false,
            sni: None,
            client_cert: None,
            client_cert_verdict: Default::default(),
            forwarding: Default::default(),
            tls_version: None,
            tls_cipher: None,
            read_budget: None,
        }),
        protocol: Protocol::Http1,
        start: Instant::now(),
        log: false,
    }
}

fn backend(v: serde_json::Value) -> Backend {
    serde_json::from_value(v).unwrap()
}

fn action(backends: &[(&str, u32)]) -> ProxyAction {
    serde_json::from_value(json!({
        "backends": backends.iter().map(|(b, w)| json!({"backend": b, "weight": w})).collect::<Vec<_>>()
    }))
    .unwrap()
}

fn route(extra: serde_json::Value) -> Route {
    let mut v = json!({"name": "r", "action": {"fixed": {"status": 200}}});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::from_value(v).unwrap()
}

fn get(path: &str) -> Request<Body> {
    Request::builder()
        .uri(path)
        .header("host", "app.example")
        .body(empty())
        .unwrap()
}

async fn text(resp: Response<Body>) -> String {
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&b).into_owned()
}

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long")
}

fn upstreams(backends: Vec<Backend>) -> (Upstreams, Arc<Metrics>) {
    let m = Arc::new(Metrics::default());
    (
        Upstreams::build(&backends, None, m.clone(), DEFAULT_PROXY_READ_AHEAD).unwrap(),
        m,
    )
}

/// A request body fed from a channel.
struct ChanBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test]
async fn proxies_over_every_protocol() {
    bounded(async {
        let (tls_cfg, ca) = tls_server(&["localhost"]);
        let plain = spawn_server(None, echo()).await;
        let secure = spawn_server(Some(tls_cfg), echo()).await;
        let tls = json!({"ca": {"pem": ca}, "sni": "localhost"});
        let cases = [
            ("http1", &plain, None, "HTTP/1.1"),
            ("h2c", &plain, None, "HTTP/2.0"),
            ("https", &secure, Some(tls.clone()), "HTTP/1.1"),
            ("h2", &secure, Some(tls.clone()), "HTTP/2.0"),
        ];
        for (proto, server, tls, version) in cases {
            let mut b = json!({"name": "b", "protocol": proto, "endpoints": [{"address": server.address()}]});
            if let Some(t) = tls {
                b["tls"] = t;
            }
            let (u, _) = upstreams(vec![backend(b)]);
            let resp = u.forward(get("/hello?x=1"), &action(&[("b", 1)]), &route(json!({})), &ctx()).await;
            assert_eq!(resp.status(), StatusCode::OK, "{proto}");
            let body = text(resp).await;
            assert!(body.starts_with(&format!("GET /hello {version}\n")), "{proto}: {body}");
            assert!(body.contains("authority=app.example\n"), "{proto}: {body}");
        }
    })
    .await;
}

#[tokio::test]
async fn tls_verification_names_and_insecure_mode() {
    bounded(async {
        let (tls_cfg, ca) = tls_server(&["backend.internal"]);
        let server = spawn_server(Some(tls_cfg), echo()).await;
        let run = |tls: serde_json::Value| {
            let b = backend(json!({"name": "b", "protocol": "h2", "tls": tls,
                "endpoints": [{"address": server.address()}]}));
            async move {
                let (u, m) = upstreams(vec![b]);
                let resp = u
                    .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
                    .await;
                (resp.status(), m.upstream_errors_of_kind("tls"))
            }
        };
        // Wrong name: rejected.
        assert_eq!(
            run(json!({"ca": {"pem": ca}, "sni": "other.internal"})).await,
            (StatusCode::BAD_GATEWAY, 1)
        );
        // Accepted through subject_alt_names.
        assert_eq!(
            run(json!({"ca": {"pem": ca}, "sni": "other.internal",
                "subject_alt_names": ["backend.internal"]}))
            .await,
            (StatusCode::OK, 0)
        );
        // Untrusted CA: rejected.
        let (_, other_ca) = tls_server(&["backend.internal"]);
        assert_eq!(
            run(json!({"ca": {"pem": other_ca}, "sni": "backend.internal"})).await,
            (StatusCode::BAD_GATEWAY, 1)
        );
        // No CA: not verified.
        assert_eq!(run(json!({})).await, (StatusCode::OK, 0));
    })
    .await;
}

#[tokio::test]
async fn keep_alive_reuses_one_connection() {
    bounded(async {
        for proto in ["http1", "h2c"] {
            let server = spawn_server(None, echo()).await;
            let (u, _) = upstreams(vec![backend(
                json!({"name": "b", "protocol": proto, "endpoints": [{"address": server.address()}]}),
            )]);
            for _ in 0..20 {
                let resp = u.forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx()).await;
                assert_eq!(resp.status(), StatusCode::OK);
                text(resp).await;
                // Let the pool take the HTTP/1.1 connection back.
                for _ in 0..100 {
                    if proto == "h2c" || u.idle_connections("b", &server.address()) == Some(1) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            assert_eq!(server.hits(), 20);
            assert_eq!(server.conns.load(Ordering::SeqCst), 1, "{proto}");
        }
    })
    .await;
}

#[tokio::test]
async fn request_body_streams_to_backend() {
    bounded(async {
        let (first_tx, mut first_rx) = mpsc::channel::<Bytes>(1);
        let h = handler(move |req: Request<Incoming>| {
            let first_tx = first_tx.clone();
            async move {
                let mut body = req.into_body();
                let mut total = Vec::new();
                let mut first = true;
                while let Some(f) = body.frame().await {
                    if let Ok(d) = f.unwrap().into_data() {
                        if first {
                            first_tx.send(d.clone()).await.unwrap();
                            first = false;
                        }
                        total.extend_from_slice(&d);
                    }
                }
                Response::new(full(total))
            }
        });
        let server = spawn_server(None, h).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )]);
        let u = Arc::new(u);
        let (tx, rx) = mpsc::channel::<Bytes>(4);
        let req = Request::builder()
            .method("POST")
            .uri("/upload")
            .header("host", "app.example")
            .body(boxed(ChanBody(rx)))
            .unwrap();
        let u2 = u.clone();
        let call = tokio::spawn(async move {
            u2.forward(req, &action(&[("b", 1)]), &route(json!({})), &ctx())
                .await
        });
        tx.send(Bytes::from_static(b"hello ")).await.unwrap();
        // The backend sees the first chunk while the client still holds the rest.
        assert_eq!(first_rx.recv().await.unwrap(), "hello ");
        tx.send(Bytes::from_static(b"world")).await.unwrap();
        drop(tx);
        let resp = call.await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(text(resp).await, "hello world");
    })
    .await;
}

#[tokio::test]
async fn response_body_streams_back() {
    bounded(async {
        let (go_tx, go_rx) = mpsc::channel::<()>(1);
        let go_rx = Arc::new(tokio::sync::Mutex::new(go_rx));
        let h = handler(move |_req| {
            let go_rx = go_rx.clone();
            async move {
                let (tx, rx) = mpsc::channel::<Bytes>(1);
                tokio::spawn(async move {
                    tx.send(Bytes::from_static(b"first")).await.unwrap();
                    go_rx.lock().await.recv().await;
                    let _ = tx.send(Bytes::from_static(b"second")).await;
                });
                Response::new(boxed(ChanBody(rx)))
            }
        });
        for proto in ["http1", "h2c"] {
            let server = spawn_server(None, h.clone()).await;
            let (u, _) = upstreams(vec![backend(
                json!({"name": "b", "protocol": proto, "endpoints": [{"address": server.address()}]}),
            )]);
            let resp = u.forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx()).await;
            let mut body = resp.into_body();
            let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
            assert_eq!(first, "first", "{proto}");
            // Only now does the backend produce the second chunk.
            go_tx.send(()).await.unwrap();
            let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
            assert_eq!(second, "second", "{proto}");
        }
    })
    .await;
}

#[tokio::test]
async fn closed_port_is_502_with_clear_body() {
    bounded(async {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let (u, m) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": addr}]}),
        )]);
        let resp = u
            .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            text(resp).await,
            "502 Bad Gateway: upstream connect error\n"
        );
        assert_eq!(m.upstream_errors_of_kind("connect"), 1);
    })
    .await;
}

#[tokio::test]
async fn silent_backend_is_504() {
    bounded(async {
        let h = handler(|_req| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Response::new(empty())
        });
        let server = spawn_server(None, h).await;
        let (u, m) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )]);
        let r = route(json!({"timeouts": {"backend": "200ms"}}));
        let resp = u.forward(get("/"), &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            text(resp).await,
            "504 Gateway Timeout: upstream did not answer in time\n"
        );
        assert_eq!(m.upstream_errors_of_kind("timeout"), 1);
    })
    .await;
}

fn two_endpoints(a: &Server, b: &Server) -> Backend {
    backend(
        json!({"name": "b", "endpoints": [{"address": a.address()}, {"address": b.address()}],
        "outlier": {"consecutive_failures": 0}}),
    )
}

#[tokio::test]
async fn get_retried_on_503_against_another_endpoint() {
    bounded(async {
        let bad = spawn_server(None, status_handler(503)).await;
        let good = spawn_server(None, status_handler(200)).await;
        let (u, _) = upstreams(vec![two_endpoints(&bad, &good)]);
        let r = route(json!({"retry": {"attempts": 1, "codes": [503], "backoff": "1ms"}}));
        for _ in 0..10 {
            let resp = u.forward(get("/"), &action(&[("b", 1)]), &r, &ctx()).await;
            assert_eq!(resp.status(), StatusCode::OK);
        }
        assert!(bad.hits() >= 1, "the failing endpoint was tried");
        assert_eq!(good.hits(), 10);
    })
    .await;
}

/// `budget` (ingress-nginx's `proxy-next-upstream-timeout`): no try starts past it, the
/// backoff before it counted. A backoff longer than the budget leaves the first answer; with
/// room in the budget the same policy tries both endpoints.
#[tokio::test]
async fn no_retry_starts_past_the_budget() {
    bounded(async {
        let a = spawn_server(None, status_handler(503)).await;
        let b = spawn_server(None, status_handler(503)).await;
        let (u, _) = upstreams(vec![two_endpoints(&a, &b)]);
        let tight = route(json!({"retry":
            {"attempts": 1, "codes": [503], "backoff": "50ms", "budget": "10ms"}}));
        let resp = u
            .forward(get("/"), &action(&[("b", 1)]), &tight, &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(a.hits() + b.hits(), 1, "no second try past the budget");
        let roomy = route(json!({"retry":
            {"attempts": 1, "codes": [503], "backoff": "1ms", "budget": "1h"}}));
        let resp = u
            .forward(get("/"), &action(&[("b", 1)]), &roomy, &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            a.hits() + b.hits(),
            3,
            "both endpoints tried within the budget"
        );
    })
    .await;
}

#[tokio::test]
async fn post_with_body_not_retried_on_503() {
    bounded(async {
        let bad = spawn_server(None, status_handler(503)).await;
        let good = spawn_server(None, status_handler(200)).await;
        let (u, _) = upstreams(vec![two_endpoints(&bad, &good)]);
        let r = route(json!({"retry": {"attempts": 2, "codes": [503]}}));
        // Round robin starts with the first (failing) endpoint.
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .body(full("payload"))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!((bad.hits(), good.hits()), (1, 0));
    })
    .await;
}

#[tokio::test]
async fn connect_error_retried_for_post_with_body() {
    bounded(async {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = l.local_addr().unwrap().to_string();
        drop(l);
        let good = spawn_server(None, echo()).await;
        let (u, m) = upstreams(vec![backend(json!({"name": "b",
            "endpoints": [{"address": closed}, {"address": good.address()}]}))]);
        let r = route(json!({"retry": {"attempts": 1}}));
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .body(full("kept"))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(text(resp).await.contains("body=kept\n"));
        assert_eq!(m.upstream_errors_of_kind("connect"), 1);
    })
    .await;
}

/// A raw HTTP/1.1 backend: the first `fail` connections read the request head and then break
/// the connection (`reset`: RST by SO_LINGER 0; else a plain close), later ones answer 200
/// "ok". Counts connections.
async fn flaky_server(fail: usize, reset: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    let addr = spawn_backend(move |mut s| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65_536 {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            if n < fail {
                if reset {
                    let s = s.into_std().unwrap();
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(s);
                }
                return;
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    })
    .await;
    (addr, conns)
}

#[tokio::test]
async fn get_retried_after_backend_resets_or_closes_the_connection() {
    bounded(async {
        for reset in [true, false] {
            // Two broken tries, then an answer: attempts 2 (three tries) succeeds.
            let (addr, conns) = flaky_server(2, reset).await;
            let (u, m) = upstreams(vec![backend(
                json!({"name": "b", "endpoints": [{"address": addr.to_string()}],
                "outlier": {"consecutive_failures": 0}}),
            )]);
            let r = route(json!({"retry": {"attempts": 2, "backoff": "1ms"}}));
            let resp = u.forward(get("/"), &action(&[("b", 1)]), &r, &ctx()).await;
            assert_eq!(resp.status(), StatusCode::OK, "reset={reset}");
            assert_eq!(text(resp).await, "ok");
            assert_eq!(conns.load(Ordering::SeqCst), 3, "reset={reset}");
            assert_eq!(m.upstream_errors_of_kind("protocol"), 2, "reset={reset}");

            // Bounded: one retry is not enough for two broken tries; the error surfaces.
            let (addr, conns) = flaky_server(2, reset).await;
            let (u, _) = upstreams(vec![backend(
                json!({"name": "b", "endpoints": [{"address": addr.to_string()}],
                "outlier": {"consecutive_failures": 0}}),
            )]);
            let r = route(json!({"retry": {"attempts": 1}}));
            let resp = u.forward(get("/"), &action(&[("b", 1)]), &r, &ctx()).await;
            assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "reset={reset}");
            assert_eq!(conns.load(Ordering::SeqCst), 2, "reset={reset}");

            // Without a retry stanza nothing is retried.
            let (addr, conns) = flaky_server(1, reset).await;
            let (u, _) = upstreams(vec![backend(
                json!({"name": "b", "endpoints": [{"address": addr.to_string()}]}),
            )]);
            let resp = u
                .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
                .await;
            assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "reset={reset}");
            assert_eq!(conns.load(Ordering::SeqCst), 1, "reset={reset}");
        }
    })
    .await;
}

#[tokio::test]
async fn post_with_body_not_retried_after_the_backend_broke_the_connection() {
    bounded(async {
        let (addr, conns) = flaky_server(1, true).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": addr.to_string()}]}),
        )]);
        let r = route(json!({"retry": {"attempts": 3}}));
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .body(full("order #1"))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        // The body reached the backend: sending it again could apply it twice.
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(conns.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn get_retried_after_backend_timeout_with_backoff_and_bounded_attempts() {
    bounded(async {
        // The first `slow` requests hang (longer than the test); later ones answer at once.
        let slow_server = |slow: usize| {
            let n = Arc::new(AtomicUsize::new(0));
            handler(move |_req| {
                let i = n.fetch_add(1, Ordering::SeqCst);
                async move {
                    if i < slow {
                        tokio::time::sleep(Duration::from_secs(120)).await;
                    }
                    Response::new(full("fast"))
                }
            })
        };
        let server = spawn_server(None, slow_server(2)).await;
        let (u, m) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}],
            "outlier": {"consecutive_failures": 0}}),
        )]);
        let r = route(json!({"timeouts": {"backend": "100ms"},
            "retry": {"attempts": 2, "backoff": "50ms"}}));
        let t0 = Instant::now();
        let resp = u.forward(get("/"), &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(text(resp).await, "fast");
        assert_eq!(server.hits(), 3);
        assert_eq!(m.upstream_errors_of_kind("timeout"), 2);
        // A lower bound only: two timed-out tries and two backoffs must have passed.
        assert!(t0.elapsed() >= Duration::from_millis(300));

        // Every try times out: exactly 1 + attempts tries, then 504.
        let server = spawn_server(None, slow_server(usize::MAX)).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}],
            "outlier": {"consecutive_failures": 0}}),
        )]);
        let r = route(json!({"timeouts": {"backend": "100ms"}, "retry": {"attempts": 2}}));
        let resp = u.forward(get("/"), &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(server.hits(), 3);

        // A POST with a body is not sent twice after a timeout.
        let server = spawn_server(None, slow_server(usize::MAX)).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )]);
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .body(full("once"))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(server.hits(), 1);
    })
    .await;
}

fn put(body: &str) -> Request<Body> {
    Request::builder()
        .method("PUT")
        .uri("/doc")
        .header("content-length", body.len())
        .body(full(body.to_string()))
        .unwrap()
}

#[tokio::test]
async fn small_put_bodies_are_kept_for_retries_large_and_unsized_ones_stream() {
    bounded(async {
        let r = route(json!({"retry": {"attempts": 1, "codes": [503]}}));
        // A small PUT with Content-Length: read into memory, sent again to the good endpoint.
        let bad = spawn_server(None, status_handler(503)).await;
        let good = spawn_server(None, echo()).await;
        let (u, _) = upstreams(vec![two_endpoints(&bad, &good)]);
        let resp = u
            .forward(put("version 2"), &action(&[("b", 1)]), &r, &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body = text(resp).await;
        assert!(body.starts_with("PUT /doc"), "{body}");
        assert!(body.contains("body=version 2\n"), "{body}");
        assert_eq!((bad.hits(), good.hits()), (1, 1));

        // Larger than the limit: streamed, so never sent twice.
        let bad = spawn_server(None, status_handler(503)).await;
        let good = spawn_server(None, echo()).await;
        let (u, _) = upstreams(vec![two_endpoints(&bad, &good)]);
        let big = "x".repeat(sweety_dataplane::proxy::RETRY_BODY_LIMIT as usize + 1);
        let resp = u.forward(put(&big), &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!((bad.hits(), good.hits()), (1, 0));

        // No Content-Length (a streamed body): not buffered, not retried.
        let bad = spawn_server(None, status_handler(503)).await;
        let good = spawn_server(None, echo()).await;
        let (u, _) = upstreams(vec![two_endpoints(&bad, &good)]);
        let (tx, rx) = mpsc::channel(2);
        tx.send(Bytes::from_static(b"chunk")).await.unwrap();
        drop(tx);
        let req = Request::builder()
            .method("PUT")
            .uri("/doc")
            .body(boxed(ChanBody(rx)))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!((bad.hits(), good.hits()), (1, 0));

        // A small PUT whose body is shorter than announced is refused before any backend.
        let good = spawn_server(None, echo()).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": good.address()}]}),
        )]);
        let req = Request::builder()
            .method("PUT")
            .uri("/doc")
            .header("content-length", "10")
            .body(full("short"))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(good.hits(), 0);

        // A client that stalls while its small body is being read for retries hits the body
        // idle limit: 408, as the limit answers, and no backend sees the request.
        let (tx, rx) = mpsc::channel(2);
        tx.send(Bytes::from_static(b"part")).await.unwrap();
        let stalled = sweety_dataplane::limits::LimitedBody::new(
            boxed(ChanBody(rx)),
            1 << 20,
            Duration::from_millis(50),
            Arc::new(Metrics::default()),
            None,
        );
        let req = Request::builder()
            .method("PUT")
            .uri("/doc")
            .header("content-length", "10")
            .body(boxed(stalled))
            .unwrap();
        let resp = u.forward(req, &action(&[("b", 1)]), &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(good.hits(), 0);
        drop(tx);
    })
    .await;
}

#[tokio::test]
async fn small_put_retried_after_the_backend_broke_the_connection() {
    bounded(async {
        let (addr, conns) = flaky_server(1, true).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": addr.to_string()}],
            "outlier": {"consecutive_failures": 0}}),
        )]);
        let r = route(json!({"retry": {"attempts": 2}}));
        let resp = u
            .forward(put("same twice"), &action(&[("b", 1)]), &r, &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(conns.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn outlier_ejection_stops_traffic_to_failing_endpoint() {
    bounded(async {
        let bad = spawn_server(None, status_handler(500)).await;
        let good = spawn_server(None, status_handler(200)).await;
        let (u, _) = upstreams(vec![backend(json!({"name": "b",
            "endpoints": [{"address": bad.address()}, {"address": good.address()}],
            "outlier": {"consecutive_failures": 3, "base_ejection_time": "1m", "max_ejection_percent": 50}}))]);
        let mut errors = 0;
        for _ in 0..40 {
            let resp = u.forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx()).await;
            if resp.status() == StatusCode::INTERNAL_SERVER_ERROR {
                errors += 1;
            }
        }
        assert_eq!(bad.hits(), 3);
        assert_eq!(errors, 3);
        assert_eq!(good.hits(), 37);
    })
    .await;
}

/// Real sockets: an h2c backend allowing one stream per connection holds `H2_MAX_CONNS` (64)
/// requests in flight, one per connection; a request beyond finds the pool's cap reached.
/// That cap is our own limit and nothing of the request was sent: it is a 503 counted as
/// `local_overload`, never an endpoint failure, so three of them in a row (the outlier
/// threshold) eject nothing, and the held requests and the next one are answered.
#[tokio::test]
async fn the_h2_connection_cap_is_a_local_503_that_never_ejects() {
    use sweety_dataplane::proxy::pool::H2_MAX_CONNS;
    bounded(async {
        let hits = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let h = hits.clone();
        let addr = spawn_backend(move |tcp| {
            let (h, released) = (h.clone(), released.clone());
            async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let (h, mut released) = (h.clone(), released.clone());
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|r| *r).await;
                        Ok::<_, Infallible>(Response::new(full("ok")))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(1)
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            }
        })
        .await;
        let (u, m) = upstreams(vec![backend(json!({"name": "b", "protocol": "h2c",
            "endpoints": [{"address": addr.to_string()}],
            "outlier": {"consecutive_failures": 3, "base_ejection_time": "1m", "max_ejection_percent": 100}}))]);
        let (a, r) = (action(&[("b", 1)]), route(json!({})));
        let held = (0..H2_MAX_CONNS).map(|_| async {
            let resp = u.forward(get("/"), &a, &r, &ctx()).await;
            (resp.status(), text(resp).await)
        });
        let beyond = async {
            while hits.load(Ordering::SeqCst) < H2_MAX_CONNS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            for _ in 0..3 {
                let resp = u.forward(get("/"), &a, &r, &ctx()).await;
                assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(
                    text(resp).await,
                    "503 Service Unavailable: upstream connection limit reached\n"
                );
            }
            assert_eq!(m.upstream_errors_of_kind("local_overload"), 3);
            assert_eq!(m.upstream_errors_of_kind("connect"), 0);
            release.send_replace(true);
        };
        let (held, ()) = tokio::join!(futures_util::future::join_all(held), beyond);
        assert!(held.iter().all(|(s, b)| *s == StatusCode::OK && b == "ok"));
        assert_eq!(hits.load(Ordering::SeqCst), H2_MAX_CONNS);
        let ejected: u64 = m.upstream_ejections.snapshot().iter().map(|(_, n)| n).sum();
        assert_eq!(ejected, 0, "the endpoint was ejected for our own limit");
        let resp = u.forward(get("/"), &a, &r, &ctx()).await;
        assert_eq!(resp.status(), StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn weighted_split_roughly_respects_weights() {
    bounded(async {
        let one = spawn_server(None, status_handler(200)).await;
        let three = spawn_server(None, status_handler(200)).await;
        let zero = spawn_server(None, status_handler(200)).await;
        let (u, _) = upstreams(vec![
            backend(json!({"name": "one", "endpoints": [{"address": one.address()}]})),
            backend(json!({"name": "three", "endpoints": [{"address": three.address()}]})),
            backend(json!({"name": "zero", "endpoints": [{"address": zero.address()}]})),
        ]);
        let a = action(&[("one", 1), ("three", 3), ("zero", 0)]);
        for _ in 0..1_000 {
            let resp = u.forward(get("/"), &a, &route(json!({})), &ctx()).await;
            assert_eq!(resp.status(), StatusCode::OK);
            text(resp).await;
        }
        let (n1, n3) = (one.hits(), three.hits());
        assert_eq!(n1 + n3, 1_000);
        assert_eq!(zero.hits(), 0);
        assert!((150..350).contains(&n1), "one={n1} three={n3}");
    })
    .await;
}

#[tokio::test]
async fn all_zero_weights_is_500() {
    bounded(async {
        let (u, m) = upstreams(vec![backend(json!({"name": "b", "endpoints": []}))]);
        let resp = u
            .forward(get("/"), &action(&[("b", 0)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(m.upstream_errors_of_kind("no_backend"), 1);
        let resp = u
            .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(m.upstream_errors_of_kind("no_endpoint"), 1);
    })
    .await;
}

/// A client's forwarding fields, repeated and in mixed case, reach an HTTP/1.1 backend as
/// exactly one of each (ours, `X-Forwarded-For` carrying the trusted chain first) and two
/// `Forwarded` lines (the client's, then ours); a backend's request-header filter that removes
/// or sets one of these names still wins over the fields Sweety writes straight into the head.
#[tokio::test]
async fn forwarding_fields_reach_the_backend_once_and_a_backend_filter_wins() {
    bounded(async {
        let h = handler(|req: Request<Incoming>| async move {
            let mut s = String::new();
            for (k, v) in req.headers() {
                s.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
            }
            Response::new(full(s))
        });
        let server = spawn_server(None, h).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )]);
        let mk = || {
            Request::builder()
                .uri("/")
                .header("host", "app.example")
                .header("X-Forwarded-For", "203.0.113.1")
                .header("x-forwarded-for", "203.0.113.2")
                .header("X-Forwarded-Proto", "https")
                .header("X-Forwarded-Host", "evil.example")
                .header("X-Real-IP", "203.0.113.3")
                .header("Forwarded", "for=203.0.113.1")
                .body(empty())
                .unwrap()
        };
        let count = |seen: &str, n: &str| {
            seen.lines()
                .filter(|l| l.starts_with(&format!("{n}:")))
                .count()
        };
        let seen = text(
            u.forward(mk(), &action(&[("b", 1)]), &route(json!({})), &ctx())
                .await,
        )
        .await;
        for n in [
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "x-real-ip",
        ] {
            assert_eq!(count(&seen, n), 1, "{n}: {seen}");
        }
        assert_eq!(count(&seen, "forwarded"), 2, "{seen}");
        assert!(
            seen.contains("x-forwarded-for: 203.0.113.1, 203.0.113.2, 192.0.2.9\n"),
            "{seen}"
        );
        assert!(seen.contains("x-forwarded-host: app.example\n"), "{seen}");
        assert!(seen.contains("x-real-ip: 192.0.2.9\n"), "{seen}");
        let a: ProxyAction = serde_json::from_value(json!({"backends": [{"backend": "b",
            "filters": [{"request_headers": {"remove": ["x-forwarded-for", "forwarded"],
                "set": [{"name": "x-real-ip", "value": "1.1.1.1"}]}}]}]}))
        .unwrap();
        let seen = text(u.forward(mk(), &a, &route(json!({})), &ctx()).await).await;
        assert_eq!(count(&seen, "x-forwarded-for"), 0, "{seen}");
        assert_eq!(count(&seen, "forwarded"), 0, "{seen}");
        assert_eq!(count(&seen, "x-real-ip"), 1, "{seen}");
        assert!(seen.contains("x-real-ip: 1.1.1.1\n"), "{seen}");
    })
    .await;
}

#[tokio::test]
async fn hop_by_hop_stripped_and_forwarding_headers_set() {
    bounded(async {
        let h = handler(|req: Request<Incoming>| async move {
            let mut s = String::new();
            for (k, v) in req.headers() {
                s.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
            }
            Response::builder()
                .header("connection", "x-resp-secret")
                .header("x-resp-secret", "1")
                .header("keep-alive", "timeout=5")
                .header("x-resp-kept", "1")
                .body(full(s))
                .unwrap()
        });
        let server = spawn_server(None, h).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )]);
        let req = Request::builder()
            .uri("/")
            .header("host", "app.example")
            .header("connection", "keep-alive, x-secret")
            .header("x-secret", "s")
            .header("keep-alive", "timeout=5")
            .header("proxy-connection", "keep-alive")
            .header("upgrade", "websocket")
            .header("te", "trailers")
            .header("x-forwarded-for", "203.0.113.1")
            .header("x-kept", "k")
            .body(empty())
            .unwrap();
        let resp = u
            .forward(req, &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("x-resp-secret").is_none());
        assert!(resp.headers().get("keep-alive").is_none());
        assert!(resp.headers().get("connection").is_none());
        assert_eq!(resp.headers()["x-resp-kept"], "1");
        let seen = text(resp).await;
        for gone in ["x-secret:", "keep-alive:", "proxy-connection:", "upgrade:"] {
            assert!(!seen.contains(gone), "{gone} forwarded: {seen}");
        }
        for kept in [
            "host: app.example\n",
            "x-kept: k\n",
            "te: trailers\n",
            "x-forwarded-for: 203.0.113.1, 192.0.2.9\n",
            "x-forwarded-proto: http\n",
            "x-forwarded-host: app.example\n",
            "forwarded: for=192.0.2.9;proto=http;host=app.example\n",
        ] {
            assert!(seen.contains(kept), "missing {kept:?}: {seen}");
        }
    })
    .await;
}

#[tokio::test]
async fn h2_client_authority_becomes_host_and_backend_filters_apply() {
    bounded(async {
        let server = spawn_server(None, echo()).await;
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )]);
        let a: ProxyAction = serde_json::from_value(json!({"backends": [{"backend": "b",
            "filters": [{"request_headers": {"set": [{"name": "x-backend", "value": "b"}]}},
                        {"response_headers": {"add": [{"name": "x-served-by", "value": "b"}]}}]}]}))
        .unwrap();
        // An HTTP/2 client: no Host header, the authority is in the URI.
        let req = Request::builder()
            .uri("https://h2.example:8443/p")
            .version(http::Version::HTTP_2)
            .body(empty())
            .unwrap();
        let resp = u.forward(req, &a, &route(json!({})), &ctx()).await;
        assert_eq!(resp.headers()["x-served-by"], "b");
        let seen = text(resp).await;
        assert!(seen.starts_with("GET /p HTTP/1.1\n"), "{seen}");
        assert!(seen.contains("host: h2.example:8443\n"), "{seen}");
        assert!(seen.contains("x-backend: b\n"), "{seen}");
    })
    .await;
}

#[tokio::test]
async fn mirror_sends_head_without_body() {
    bounded(async {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let s2 = seen.clone();
        let h = handler(move |req: Request<Incoming>| {
            let seen = s2.clone();
            async move {
                let line = format!("{} {}", req.method(), req.uri().path());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                seen.lock()
                    .unwrap()
                    .push(format!("{line} body={}", body.len()));
                Response::new(full("ignored"))
            }
        });
        let mirror_server = spawn_server(None, h).await;
        let (u, m) = upstreams(vec![backend(
            json!({"name": "shadow", "endpoints": [{"address": mirror_server.address()}]}),
        )]);
        let (parts, _) = Request::builder()
            .method("POST")
            .uri("/m")
            .header("host", "app.example")
            .header("content-length", "7")
            .body(())
            .unwrap()
            .into_parts();
        let mirror = Mirror {
            backend: "shadow".into(),
            percent: 100.0,
        };
        u.mirror(&parts, &mirror, &ctx());
        let off = Mirror {
            backend: "shadow".into(),
            percent: 0.0,
        };
        u.mirror(&parts, &off, &ctx());
        for _ in 0..500 {
            if !seen.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*seen.lock().unwrap(), vec!["POST /m body=0".to_string()]);
        assert_eq!(m.upstream_errors_of_kind("mirror_dropped"), 0);
    })
    .await;
}

#[tokio::test]
async fn reload_keeps_warm_connections() {
    bounded(async {
        let server = spawn_server(None, echo()).await;
        let cfg = vec![backend(
            json!({"name": "b", "endpoints": [{"address": server.address()}]}),
        )];
        let m = Arc::new(Metrics::default());
        let first = Upstreams::build(&cfg, None, m.clone(), DEFAULT_PROXY_READ_AHEAD).unwrap();
        let resp = first
            .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        text(resp).await;
        for _ in 0..100 {
            if first.idle_connections("b", &server.address()) == Some(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let second = Upstreams::build(&cfg, Some(&first), m, DEFAULT_PROXY_READ_AHEAD).unwrap();
        drop(first);
        assert_eq!(second.idle_connections("b", &server.address()), Some(1));
        let resp = second
            .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(server.conns.load(Ordering::SeqCst), 1);
    })
    .await;
}

/// A backend handler that holds each request until `n` are in, then answers them all ("ok"):
/// `n` requests in flight at once, each on a connection of its own.
fn gathering(n: usize) -> Handler {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    handler(move |_req| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            Response::new(full("ok"))
        }
    })
}

/// Sends `n` GETs through `u` at once (the backend must gather them, see [`gathering`]), checks
/// each answer, then waits until every backend connection is idle or closed (the pool takes a
/// connection back once its response was read) and returns `(active, idle)` then.
async fn burst(u: &Upstreams, addr: &str, n: usize) -> (usize, usize) {
    let sends = (0..n).map(|_| async {
        let resp = u
            .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(text(resp).await, "ok");
    });
    futures_util::future::join_all(sends).await;
    loop {
        let (active, idle) = u.connections("b", addr).unwrap();
        if active == 0 {
            return (active, idle);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Real sockets: the idle pool follows demand. A burst of 100 requests in flight (more than the
/// 64 the pool used to keep) opens 100 backend connections, and every later burst of the same
/// size is served by them: no connection is closed and opened again. (With a fixed cap of 64,
/// every burst closed 36 connections and opened them again.)
#[tokio::test]
async fn bursts_reuse_the_connections_the_last_burst_opened() {
    bounded(async {
        const N: usize = 100;
        let server = spawn_server(None, gathering(N)).await;
        let addr = server.address();
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": addr}]}),
        )]);
        for round in 1..=3 {
            assert_eq!(burst(&u, &addr, N).await, (0, N), "round {round}");
            assert_eq!(server.conns.load(Ordering::SeqCst), N, "round {round}");
        }
        assert_eq!(server.hits(), 3 * N);
    })
    .await;
}

/// Real sockets: `max_idle_per_endpoint` stays the hard bound of the idle list. A burst of 40
/// keeps 10 connections; the next burst of 40 reuses those 10 and opens 30.
#[tokio::test]
async fn the_configured_idle_bound_holds_under_a_larger_burst() {
    bounded(async {
        const N: usize = 40;
        let server = spawn_server(None, gathering(N)).await;
        let addr = server.address();
        let (u, _) = upstreams(vec![backend(
            json!({"name": "b", "max_idle_per_endpoint": 10, "endpoints": [{"address": addr}]}),
        )]);
        assert_eq!(burst(&u, &addr, N).await, (0, 10));
        assert_eq!(server.conns.load(Ordering::SeqCst), N);
        assert_eq!(burst(&u, &addr, N).await, (0, 10));
        assert_eq!(server.conns.load(Ordering::SeqCst), N + (N - 10));
    })
    .await;
}

/// A raw HTTP/1.1 server that answers one request per connection with keep-alive, then closes
/// the connection without answering when a second request arrives on it. The first `together`
/// connections answer only once all of them are open (so that many are pooled at once).
async fn one_shot_keepalive_server(together: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let conns = Arc::new(AtomicUsize::new(0));
    let all_open = Arc::new(tokio::sync::Barrier::new(together.max(1)));
    let c = conns.clone();
    let addr = spawn_backend(move |mut s| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        let all_open = all_open.clone();
        async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            if n < together {
                all_open.wait().await;
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
            // Wait for the next request on this connection, then drop it unanswered.
            let _ = s.read(&mut chunk).await;
        }
    })
    .await;
    (addr, conns)
}

#[tokio::test]
async fn stale_pooled_connection_is_replaced_for_replayable_requests() {
    bounded(async {
        let (addr, conns) = one_shot_keepalive_server(0).await;
        let (u, m) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": addr.to_string()}]}),
        )]);
        for i in 0..3 {
            let resp = u
                .forward(get("/"), &action(&[("b", 1)]), &route(json!({})), &ctx())
                .await;
            assert_eq!(resp.status(), StatusCode::OK, "request {i}");
            assert_eq!(text(resp).await, "ok");
            for _ in 0..100 {
                if u.idle_connections("b", &addr.to_string()) == Some(1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(conns.load(Ordering::SeqCst), 3);
        assert_eq!(m.upstream_errors_of_kind("protocol"), 0);
        // A POST with a body on the stale connection is not replayed: 502.
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .body(full("once"))
            .unwrap();
        let resp = u
            .forward(req, &action(&[("b", 1)]), &route(json!({})), &ctx())
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(m.upstream_errors_of_kind("protocol"), 1);
    })
    .await;
}

/// A backend restart leaves every idle pooled HTTP/1.1 connection closed: the try after the
/// first stale one opens a new connection instead of taking the next idle one (which failed
/// the request with a 502, though a fresh connect would have served it; review s22c L3-1).
/// Two connections are pooled (the server answers each first request only once both are
/// open), then both die on their next request.
#[tokio::test]
async fn after_a_stale_pooled_connection_the_retry_opens_a_new_one() {
    bounded(async {
        let (addr, conns) = one_shot_keepalive_server(2).await;
        let addr = addr.to_string();
        let (u, m) = upstreams(vec![backend(
            json!({"name": "b", "endpoints": [{"address": addr}]}),
        )]);
        let (act, rt, cx) = (action(&[("b", 1)]), route(json!({})), ctx());
        let send = || u.forward(get("/"), &act, &rt, &cx);
        let (a, b) = tokio::join!(send(), send());
        for resp in [a, b] {
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(text(resp).await, "ok");
        }
        for _ in 0..200 {
            if u.idle_connections("b", &addr) == Some(2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(u.idle_connections("b", &addr), Some(2));
        let resp = send().await;
        assert_eq!(resp.status(), StatusCode::OK, "served on a new connection");
        assert_eq!(text(resp).await, "ok");
        assert_eq!(conns.load(Ordering::SeqCst), 3);
        assert_eq!(m.upstream_errors_of_kind("protocol"), 0);
    })
    .await;
}

#[tokio::test]
async fn mirrors_are_bounded_and_dropped_when_full() {
    bounded(async {
        let h = handler(|_req| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Response::new(empty())
        });
        let server = spawn_server(None, h).await;
        let (u, m) = upstreams(vec![backend(
            json!({"name": "shadow", "endpoints": [{"address": server.address()}]}),
        )]);
        let (parts, _) = get("/").into_parts();
        let mirror = Mirror {
            backend: "shadow".into(),
            percent: 100.0,
        };
        let extra = 6;
        for _ in 0..sweety_dataplane::proxy::MIRROR_IN_FLIGHT + extra {
            u.mirror(&parts, &mirror, &ctx());
        }
        assert_eq!(m.upstream_errors_of_kind("mirror_dropped"), extra as u64);
    })
    .await;
}
