//! gRPC end to end with a hand-rolled gRPC backend (hyper, h2c or TLS h2, trailers) and real
//! clients (hyper h2c, quinn + h3 for HTTP/3): trailers pass through on HTTP/2 and HTTP/3;
//! Sweety's own errors (no route, upstream down, timeout, overload) arrive as HTTP 200
//! trailers-only replies with `grpc-status`, never a text body; gRPC-Web (binary and text) is
//! translated on routes with the `grpc` filter.

mod common;

use base64::Engine as _;
use bytes::Bytes;
use common::*;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use sweety_config::*;

/// One length-prefixed gRPC message.
fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut v = vec![0u8];
    v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    v.extend_from_slice(msg);
    Bytes::from(v)
}

/// A gRPC backend over h2c: `/echo.Echo/Say` echoes the request body with trailers
/// `grpc-status: 0`, `grpc-message: ok`, `x-trailer: yes`; paths under `/slow.` answer after
/// 1.5 s.
async fn grpc_backend() -> SocketAddr {
    grpc_backend_on(None).await
}

/// The same backend, over TLS (ALPN h2) when `tls` is given.
async fn grpc_backend_on(tls: Option<std::sync::Arc<rustls::ServerConfig>>) -> SocketAddr {
    spawn_backend(move |s| {
        let tls = tls.clone();
        async move {
            let svc = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    let ct = req.headers()["content-type"].to_str().unwrap().to_string();
                    assert!(
                        ct == "application/grpc+proto" || ct == "application/grpc",
                        "{ct}"
                    );
                    assert_eq!(req.headers()["te"], "trailers");
                    if req.uri().path().starts_with("/slow.") {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let mut t = http::HeaderMap::new();
                    t.insert("grpc-status", "0".parse().unwrap());
                    t.insert("grpc-message", "ok".parse().unwrap());
                    t.insert("x-trailer", "yes".parse().unwrap());
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                        vec![Ok(Frame::data(body)), Ok(Frame::trailers(t))];
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/grpc+proto")
                            .body(StreamBody::new(futures_util::stream::iter(frames)))
                            .unwrap(),
                    )
                },
            );
            let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            match tls {
                None => {
                    let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                }
                Some(cfg) => {
                    let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(s).await else {
                        return;
                    };
                    let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                }
            }
        }
    })
    .await
}

fn h2c_backend(name: &str, addr: SocketAddr) -> Backend {
    Backend {
        protocol: BackendProtocol::H2c,
        ..backend(name, addr)
    }
}

async fn start(client: Http2Client) -> (Harness, SocketAddr) {
    let up = grpc_backend().await;
    // A closed port for the "backend down" case.
    let (_refusing, closed) = common::refused_addr();
    let mut timed = proxy_route("timed", "/slow.Slow/", "g");
    timed.timeouts.request = Some(sweety_config::Duration::from_millis(300));
    let mut web = proxy_route("web", "/", "g");
    web.filters.push(Filter::Grpc(GrpcOptions { web: true }));
    let mut cfg = Config {
        backends: vec![h2c_backend("g", up), h2c_backend("down", closed)],
        ..http_config(vec![
            vhost(
                "g",
                &["g.test"],
                vec![
                    proxy_route("echo", "/echo.Echo/", "g"),
                    proxy_route("down", "/down.Down/", "down"),
                    timed,
                    proxy_route("slow", "/slow.Untimed/", "g"),
                ],
            ),
            vhost("web", &["web.test"], vec![web]),
        ])
    };
    cfg.listeners[0].max_requests_in_flight = Some(2);
    cfg.limits.queue_timeout = sweety_config::Duration::from_millis(50);
    cfg.limits.http2_client = client;
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr)
}

struct Reply {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
    trailers: Option<http::HeaderMap>,
}

async fn h2c_call(addr: SocketAddr, host: &str, path: &str, body: Bytes) -> Reply {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("POST")
        .version(http::Version::HTTP_2)
        .uri(format!("http://{host}{path}"))
        .header("content-type", "application/grpc+proto")
        .header("te", "trailers")
        .body(Full::new(body))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("answered in time")
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let collected = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("body in time")
        .unwrap();
    let trailers = collected.trailers().cloned();
    Reply {
        status,
        headers,
        body: collected.to_bytes(),
        trailers,
    }
}

async fn trailers_pass_through_h2c(client: Http2Client) {
    let (_h, addr) = start(client).await;
    let msg = grpc_frame(b"hello grpc");
    let r = h2c_call(addr, "g.test", "/echo.Echo/Say", msg.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/grpc+proto");
    assert_eq!(r.body, msg);
    let t = r.trailers.expect("trailers relayed");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(t["grpc-message"], "ok");
    assert_eq!(t["x-trailer"], "yes");
}

fn assert_grpc_error(r: &Reply, code: &str) {
    assert_eq!(r.status, 200, "gRPC errors are HTTP 200");
    assert_eq!(r.headers["grpc-status"], code, "{:?}", r.headers);
    assert!(r.headers.contains_key("grpc-message"));
    assert_eq!(r.headers["content-type"], "application/grpc");
    assert!(r.body.is_empty(), "no body, got {:?}", r.body);
}

async fn sweety_errors_are_trailers_only_grpc_statuses(client: Http2Client) {
    let (_h, addr) = start(client).await;
    let m = grpc_frame(b"x");
    // No route: UNIMPLEMENTED.
    let r = h2c_call(addr, "g.test", "/nope.Nope/Call", m.clone()).await;
    assert_grpc_error(&r, "12");
    assert_eq!(
        r.headers["grpc-message"],
        "404 Not Found: no route matches this host and path"
    );
    // Backend down: UNAVAILABLE.
    let r = h2c_call(addr, "g.test", "/down.Down/Call", m.clone()).await;
    assert_grpc_error(&r, "14");
    // Request timeout: DEADLINE_EXCEEDED.
    let r = h2c_call(addr, "g.test", "/slow.Slow/Call", m.clone()).await;
    assert_grpc_error(&r, "4");
}

async fn overload_is_unavailable_with_retry_after(client: Http2Client) {
    let (_h, addr) = start(client).await;
    let m = grpc_frame(b"x");
    // Two slow calls fill the listener's two in-flight slots (`/slow.Untimed/` has no
    // timeout).
    let a = tokio::spawn(h2c_call(addr, "g.test", "/slow.Untimed/Call", m.clone()));
    let b = tokio::spawn(h2c_call(addr, "g.test", "/slow.Untimed/Call", m.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = h2c_call(addr, "g.test", "/echo.Echo/Say", m.clone()).await;
    assert_grpc_error(&r, "14");
    assert_eq!(r.headers["retry-after"], "1");
    // The slow calls themselves succeed (the backend answers 200 with trailers).
    for t in [a, b] {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
    }
}

async fn grpc_web_binary_and_text_are_translated(client: Http2Client) {
    let (_h, addr) = start(client).await;
    let client = h1_client();
    let msg = grpc_frame(b"from the browser");
    let trailer_block = b"grpc-status: 0\r\ngrpc-message: ok\r\nx-trailer: yes\r\n";
    let mut want = msg.to_vec();
    want.push(0x80);
    want.extend_from_slice(&(trailer_block.len() as u32).to_be_bytes());
    want.extend_from_slice(trailer_block);

    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/echo.Echo/Say"))
        .header("host", "web.test")
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(Full::new(msg.clone()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/grpc-web+proto");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, want);

    let b64 = base64::engine::general_purpose::STANDARD;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/echo.Echo/Say"))
        .header("host", "web.test")
        .header("content-type", "application/grpc-web-text")
        .body(Full::new(Bytes::from(b64.encode(&msg))))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/grpc-web-text+proto"
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(b64.decode(&body).unwrap(), want);

    // A gRPC-Web error from Sweety itself is gRPC-shaped too.
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/x"))
        .header("host", "nowhere.test")
        .header("content-type", "application/grpc-web+proto")
        .body(Full::new(msg))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["grpc-status"], "12");
    assert_eq!(resp.headers()["content-type"], "application/grpc-web+proto");
}

/// A self-signed certificate for `name` (ALPN h2 only) and its PEM.
fn tls_server(name: &str) -> (std::sync::Arc<rustls::ServerConfig>, String) {
    let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    (std::sync::Arc::new(cfg), ck.cert.pem())
}

async fn trailers_pass_through_tls_h2_backend(client: Http2Client) {
    let (tls, ca) = tls_server("grpc.internal");
    let up = grpc_backend_on(Some(tls)).await;
    let b = Backend {
        protocol: BackendProtocol::H2,
        tls: Some(BackendTls {
            ca: Some(PemSource::Pem(ca)),
            sni: Some("grpc.internal".into()),
            ..BackendTls::default()
        }),
        ..backend("gs", up)
    };
    let mut cfg = Config {
        backends: vec![b],
        ..http_config(vec![vhost("g", &[], vec![proxy_route("echo", "/", "gs")])])
    };
    cfg.limits.http2_client = client;
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let msg = grpc_frame(b"over tls");
    let r = h2c_call(addr, "g.test", "/echo.Echo/Say", msg.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, msg);
    let t = r.trailers.expect("trailers relayed from the h2 backend");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(t["x-trailer"], "yes");
}

/// One gRPC call over HTTP/3 (quinn + h3, trusting `ca_pem`): status, headers, body, trailers.
async fn h3_call(addr: SocketAddr, ca_pem: &str, path: &str, body: Bytes) -> Reply {
    use bytes::Buf;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(crypto)));
    let conn = tokio::time::timeout(
        Duration::from_secs(5),
        endpoint.connect(addr, "localhost").unwrap(),
    )
    .await
    .expect("QUIC handshake in time")
    .unwrap();
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = driver.wait_idle().await;
    });
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/grpc+proto")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let call = async {
        let mut s = send.send_request(req).await.unwrap();
        s.send_data(body).await.unwrap();
        s.finish().await.unwrap();
        let resp = s.recv_response().await.unwrap();
        let mut out = bytes::BytesMut::new();
        while let Some(mut d) = s.recv_data().await.unwrap() {
            out.extend_from_slice(&d.copy_to_bytes(d.remaining()));
        }
        let trailers = s.recv_trailers().await.unwrap();
        Reply {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: out.freeze(),
            trailers,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("HTTP/3 call in time")
}

async fn trailers_and_errors_over_http3(client: Http2Client) {
    let up = grpc_backend().await;
    let (cert, ca) = cert_for("localhost");
    let mut cfg = Config {
        generation: 1,
        listeners: vec![Listener {
            tls: Some(ListenerTls {
                certificates: vec![cert],
                min_version: TlsVersion::Tls13,
                client_auth: None,
                host_client_auth: Vec::new(),
            }),
            http3: true,
            ..listener("tls", ListenerProtocol::Https)
        }],
        virtual_hosts: vec![vhost(
            "g",
            &[],
            vec![proxy_route("echo", "/echo.Echo/", "g")],
        )],
        backends: vec![h2c_backend("g", up)],
        ..Config::default()
    };
    cfg.limits.http2_client = client;
    let h = Harness::start(cfg).await;
    let quic = *h
        .runtime
        .bound_quic()
        .await
        .get("tls")
        .expect("QUIC endpoint bound");
    let msg = grpc_frame(b"over h3");
    let r = h3_call(quic, &ca, "/echo.Echo/Say", msg.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, msg);
    let t = r.trailers.expect("trailers relayed over HTTP/3");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(t["x-trailer"], "yes");
    // No route: a trailers-only gRPC error over HTTP/3 too.
    let r = h3_call(quic, &ca, "/none.None/X", msg).await;
    assert_grpc_error(&r, "12");
}

common::on_both_h2_clients!(
    trailers_pass_through_h2c,
    sweety_errors_are_trailers_only_grpc_statuses,
    overload_is_unavailable_with_retry_after,
    grpc_web_binary_and_text_are_translated,
    trailers_pass_through_tls_h2_backend,
    trailers_and_errors_over_http3,
);
