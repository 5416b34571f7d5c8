//! Sweety's own HTTP/2 engine (`limits.http2_engine: sweety`) end to end, with real clients
//! (curl, h2load, hyper's HTTP/2 client, tokio-tungstenite over extended CONNECT) and a raw
//! frame client for the protocol corners and the abuse limits: many concurrent streams,
//! bodies larger than both flow-control windows, trailers both ways, WebSocket over RFC 8441,
//! GOAWAY on drain, refused streams, rapid reset, CONTINUATION/PING floods, oversized header
//! lists, window overflow, oversized frames, and the header-read and idle timeouts.

mod common;

use bytes::{Bytes, BytesMut};
use common::h2::Raw;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use sweety_config::*;
use sweety_dataplane::hpack::Encoder;
use sweety_h2::frame::{self, flag, kind, Reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every wait of these tests is bounded.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("finished in time")
}

fn sweety(mut cfg: Config) -> Config {
    cfg.limits.http2_engine = Http2Engine::Sweety;
    cfg
}

/// An HTTP/1.1 backend: `/echo` echoes the request body, `/slow` answers after 300 ms,
/// `/big/N` answers N bytes.
async fn backend_server() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let path = req.uri().path().to_string();
                        let body = if path == "/echo" {
                            req.into_body().collect().await.unwrap().to_bytes()
                        } else if path == "/cookies" {
                            // Every Cookie field the backend got, in order, one per line.
                            let cookies: Vec<&[u8]> = req
                                .headers()
                                .get_all(http::header::COOKIE)
                                .iter()
                                .map(|v| v.as_bytes())
                                .collect();
                            Bytes::from(cookies.join(&b"\n"[..]))
                        } else if path == "/slow" {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            Bytes::from_static(b"slow")
                        } else if let Some(n) = path.strip_prefix("/big/") {
                            let n: usize = n.parse().unwrap();
                            Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>())
                        } else {
                            Bytes::from_static(b"hello")
                        };
                        Ok::<_, Infallible>(http::Response::new(Full::new(body)))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// An h2c backend that answers with a body and trailers echoing the request's trailer.
async fn trailer_backend() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let collected = req.into_body().collect().await.unwrap();
                        let got = collected
                            .trailers()
                            .and_then(|t| t.get("x-req-trailer"))
                            .cloned()
                            .unwrap_or(http::HeaderValue::from_static("none"));
                        let data = collected.to_bytes();
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", http::HeaderValue::from_static("0"));
                        t.insert("x-echoed-trailer", got);
                        let frames = vec![
                            Ok::<_, Infallible>(Frame::data(data)),
                            Ok(Frame::trailers(t)),
                        ];
                        let body = StreamBody::new(futures_util::stream::iter(frames));
                        Ok::<_, Infallible>(http::Response::new(body))
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

async fn start(mut cfg_edit: impl FnMut(&mut Config)) -> (Harness, SocketAddr) {
    let up = backend_server().await;
    let trailers = trailer_backend().await;
    let mut tb = backend("trailers", trailers);
    tb.protocol = BackendProtocol::H2c;
    let mut cfg = sweety(Config {
        backends: vec![backend("up", up), tb],
        ..http_config(vec![vhost(
            "v",
            &[],
            vec![
                proxy_route("trailers", "/t", "trailers"),
                fixed_route("fixed", "/fixed", "fixed reply"),
                proxy_route("up", "/", "up"),
            ],
        )])
    });
    cfg_edit(&mut cfg);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr)
}

async fn curl(args: &[&str]) -> (String, String) {
    let out = bounded(
        tokio::process::Command::new("curl")
            .args(["-sS", "--max-time", "15"])
            .args(args)
            .output(),
    )
    .await
    .expect("curl runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn curl_and_h2load_get_answers_over_h2c_and_tls() {
    let (cert, pem) = cert_for("a.test");
    let (_h, addr) = start(|_| {}).await;
    let (out, err) = curl(&[
        "--http2-prior-knowledge",
        "-w",
        " %{http_version} %{http_code}",
        &format!("http://{addr}/fixed"),
    ])
    .await;
    assert_eq!(out, "fixed reply 2 200", "{err}");

    // TLS with ALPN h2.
    let mut https = listener("tls", ListenerProtocol::Https);
    https.tls = Some(ListenerTls {
        certificates: vec![cert],
        min_version: TlsVersion::Tls12,
        client_auth: None,
        host_client_auth: Vec::new(),
    });
    let h = Harness::start(sweety(Config {
        listeners: vec![https],
        virtual_hosts: vec![vhost("a", &[], vec![fixed_route("a", "/", "site A")])],
        ..Config::default()
    }))
    .await;
    let tls = h.addr("tls").await;
    let (alpn, status, body) = tls_get(tls, "a.test", &pem, &[b"h2"], "/").await.unwrap();
    assert_eq!(
        (alpn.as_slice(), status, body.as_str()),
        (&b"h2"[..], 200, "site A")
    );
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pem).unwrap();
    let (out, err) = curl(&[
        "--http2",
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &format!("a.test:{}:127.0.0.1", tls.port()),
        "-w",
        " %{http_version} %{http_code}",
        &format!("https://a.test:{}/", tls.port()),
    ])
    .await;
    assert_eq!(out, "site A 2 200", "{err}");

    // nghttp (h2c, prior knowledge), with its frame log: our SETTINGS, then the answer.
    let out = bounded(
        tokio::process::Command::new("nghttp")
            .args(["-v", "-t", "10", &format!("http://{addr}/fixed")])
            .output(),
    )
    .await
    .expect("nghttp runs");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("SETTINGS_ENABLE_CONNECT_PROTOCOL"), "{log}");
    assert!(log.contains(":status: 200"), "{log}");
    assert!(log.contains("fixed reply"), "{log}");

    // Many concurrent streams on few connections, h2c and TLS.
    for url in [
        format!("http://{addr}/fixed"),
        format!("https://127.0.0.1:{}/", tls.port()),
    ] {
        let out = bounded(
            tokio::process::Command::new("h2load")
                .args(["-n", "3000", "-c", "3", "-m", "100", &url])
                .output(),
        )
        .await
        .expect("h2load runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("3000 total, 3000 started, 3000 done, 3000 succeeded"),
            "{url}: {text}"
        );
    }
}

async fn h2c_sender(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<BoxedBody> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, BoxedBody>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

type BoxedBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

#[tokio::test]
async fn bodies_larger_than_both_windows_go_both_ways() {
    let (_h, addr) = start(|_| {}).await;
    let mut send = h2c_sender(addr).await;
    // 3 MiB up (stream window 256 KiB, connection window 1 MiB), streamed in 64 KiB chunks.
    let chunks: Vec<Result<Frame<Bytes>, Infallible>> = (0..48)
        .map(|i| Ok(Frame::data(Bytes::from(vec![i as u8; 64 * 1024]))))
        .collect();
    let body = BodyExt::boxed(StreamBody::new(futures_util::stream::iter(chunks)));
    let req = http::Request::post(format!("http://{addr}/echo"))
        .body(body)
        .unwrap();
    let resp = bounded(send.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = bounded(resp.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(got.len(), 48 * 64 * 1024);
    assert!(got
        .chunks(64 * 1024)
        .enumerate()
        .all(|(i, c)| c.iter().all(|b| *b == i as u8)));

    // 5 MB down, several streams at once on one connection (the client's default windows).
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            let req = http::Request::get(format!("http://{addr}/big/5000000"))
                .body(http_body_util::Empty::new().boxed())
                .unwrap();
            let resp = send.send_request(req).await.unwrap();
            assert_eq!(resp.headers()["content-length"], "5000000");
            let b = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(b.len(), 5_000_000);
            assert!(b.iter().enumerate().all(|(i, x)| *x == (i % 251) as u8));
        }));
    }
    for t in tasks {
        bounded(t).await.unwrap();
    }
}

async fn trailers_pass_both_ways(client: Http2Client) {
    let (_h, addr) = start(|c| c.limits.http2_client = client).await;
    trailers_round_trip(addr).await;
}

common::on_both_h2_clients!(trailers_pass_both_ways);

/// A POST with request trailers to the h2c backend; its response trailers echo them.
async fn trailers_round_trip(addr: SocketAddr) {
    let mut send = h2c_sender(addr).await;
    let mut t = http::HeaderMap::new();
    t.insert(
        "x-req-trailer",
        http::HeaderValue::from_static("from-client"),
    );
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"payload"))),
        Ok(Frame::trailers(t)),
    ];
    let req = http::Request::post(format!("http://{addr}/t"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap();
    let resp = bounded(send.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = bounded(resp.into_body().collect()).await.unwrap();
    let trailers = collected.trailers().cloned().expect("response trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-echoed-trailer"], "from-client");
    assert_eq!(&collected.to_bytes()[..], b"payload");
}

#[tokio::test]
async fn websocket_over_extended_connect() {
    use tokio_tungstenite::tungstenite::{protocol::Role, Message};
    // A WebSocket echo backend.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws_addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let h = Harness::start(sweety(Config {
        backends: vec![backend("ws", ws_addr)],
        ..http_config(vec![vhost("v", &[], vec![proxy_route("ws", "/", "ws")])])
    }))
    .await;
    let addr = h.addr("web").await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    bounded(send.ready()).await.unwrap();
    let mut req = http::Request::builder()
        .method("CONNECT")
        .version(http::Version::HTTP_2)
        .uri(format!("http://{addr}/chat"))
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let resp = bounded(send.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let upgraded = bounded(hyper::upgrade::on(resp)).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        Role::Client,
        None,
    )
    .await;
    // Messages larger than the stream windows too.
    for i in 0..5 {
        let msg = format!("over h2 {i} {}", "x".repeat(i * 100_000));
        bounded(ws.send(Message::text(msg.clone()))).await.unwrap();
        let back = bounded(ws.next()).await.unwrap().unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), msg);
    }
    assert_eq!(
        h.runtime
            .shared
            .metrics
            .websocket_tunnels
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    bounded(ws.close(None)).await.unwrap();
}

// ---------------------------------------------------------------- raw frames (common::h2::Raw)

fn block(fields: &[(&str, &str)]) -> BytesMut {
    let mut b = BytesMut::new();
    for (n, v) in fields {
        Encoder::field(&mut b, n.as_bytes(), v.as_bytes(), false);
    }
    b
}

fn get_block(path: &str) -> BytesMut {
    block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "a.test"),
        (":path", path),
    ])
}

fn headers_frame(id: u32, block: &[u8], end_stream: bool) -> BytesMut {
    let mut out = BytesMut::new();
    frame::put_headers(&mut out, id, block, end_stream, 16_384);
    out
}

#[tokio::test]
async fn drain_sends_goaway_and_in_flight_streams_finish() {
    let (h, addr) = start(|_| {}).await;
    let mut raw = Raw::connect(addr).await;
    raw.send(&headers_frame(1, &get_block("/slow"), true)).await;
    // Let the request reach the backend, then remove the listener (drain).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut cfg = Config::clone(&h.runtime.shared.snapshot().config);
    cfg.generation += 1;
    cfg.listeners.clear();
    let _ = h.runtime.apply(cfg).await;
    let mut saw_goaway = false;
    let mut got_body = false;
    while let Some((head, p)) = raw.frame().await {
        match head.kind {
            kind::GOAWAY => {
                assert_eq!(
                    Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]])),
                    Reason::NO_ERROR
                );
                assert_eq!(
                    u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                    1,
                    "last stream"
                );
                saw_goaway = true;
            }
            kind::DATA if head.stream == 1 => {
                assert_eq!(&p[..], b"slow");
                got_body = true;
            }
            _ => {}
        }
    }
    assert!(saw_goaway, "GOAWAY on drain");
    assert!(got_body, "the in-flight stream finished");
}

/// How a client leaves a proxied request waiting for its backend.
#[derive(Debug, Clone, Copy)]
enum Leave {
    /// RST_STREAM(CANCEL) on the stream.
    ResetStream,
    /// FIN on the connection (the server reads EOF).
    Eof,
    /// RST on the connection (the server's read fails).
    ResetConnection,
}

// A client that leaves a proxied request waiting for its backend (its RST_STREAM, the
// connection's EOF or its reset) cancels the backend request at once: the backend sees its
// connection closed, and the request's in-flight slot is free for the next (the limit is one).
// Before, EOF and a reset left the request running until the backend answered or the
// keep-alive PING went unanswered (idle_timeout + header_read_timeout, about 70 s); the
// bound here is 10 s. The H2 twin of access_log.rs
// a_client_gone_mid_request_cancels_the_backend_request_on_both_engines.
#[tokio::test]
async fn a_client_gone_mid_request_cancels_the_backend_request() {
    for leave in [Leave::ResetStream, Leave::Eof, Leave::ResetConnection] {
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
        let (h, addr) = start(|c| {
            c.limits.max_requests_in_flight = 1;
            c.backends.push(backend("hang", hang));
            c.virtual_hosts[0]
                .routes
                .insert(0, proxy_route("hang", "/hang", "hang"));
        })
        .await;
        let mut raw = Raw::connect(addr).await;
        raw.send(&headers_frame(1, &get_block("/hang"), true)).await;
        tokio::time::timeout(Duration::from_secs(10), arrived.recv())
            .await
            .expect("the request reaches the backend")
            .unwrap();
        let metrics = &h.runtime.shared.metrics;
        assert_eq!(metrics.active_requests.load(Relaxed), 1);
        match leave {
            Leave::ResetStream => {
                let mut rst = BytesMut::new();
                frame::put_rst(&mut rst, 1, Reason::CANCEL);
                raw.send(&rst).await;
            }
            Leave::Eof => raw.shut_write().await,
            Leave::ResetConnection => raw.reset(),
        }
        tokio::time::timeout(Duration::from_secs(10), gone.recv())
            .await
            .unwrap_or_else(|_| panic!("{leave:?}: the backend request is cancelled"))
            .unwrap();
        assert_eq!(metrics.active_requests.load(Relaxed), 0, "{leave:?}");
        // The one in-flight slot is free: the next request is answered, not refused.
        let got = bounded(get(&h2c_client(), &format!("http://{addr}/"), None)).await;
        assert_eq!(got, Ok((200, "hello".to_string())), "{leave:?}");
    }
}

#[tokio::test]
async fn head_gets_the_length_without_a_body() {
    let (_h, addr) = start(|_| {}).await;
    let mut raw = Raw::connect(addr).await;
    let head = block(&[
        (":method", "HEAD"),
        (":scheme", "http"),
        (":authority", "a.test"),
        (":path", "/fixed"),
    ]);
    raw.send(&headers_frame(1, &head, true)).await;
    raw.send(&headers_frame(3, &get_block("/fixed"), true))
        .await;
    // Stream 1 (HEAD) ends with its HEADERS, which carry the GET's length; stream 3 (GET)
    // carries the body. Read until both streams have ended.
    let mut decoder = sweety_dataplane::hpack::Decoder::new();
    let (mut head_ended, mut head_data, mut head_length) = (false, false, None);
    let (mut get_ended, mut get_body) = (false, Vec::new());
    while !(head_ended && get_ended) {
        let Some((h, p)) = raw.frame().await else {
            break;
        };
        match (h.kind, h.stream) {
            (kind::HEADERS, 1) => {
                head_ended = h.has(flag::END_STREAM);
                decoder
                    .decode(&p, 65_536, |f| {
                        if f.name == b"content-length" {
                            head_length = Some(String::from_utf8_lossy(f.value).into_owned());
                        }
                    })
                    .unwrap();
            }
            (kind::HEADERS, 3) => decoder.decode(&p, 65_536, |_| {}).unwrap(),
            (kind::DATA, 1) => head_data |= !p.is_empty(),
            (kind::DATA, 3) => {
                get_body.extend_from_slice(&p);
                get_ended = h.has(flag::END_STREAM);
            }
            _ => {}
        }
    }
    assert!(head_ended, "the HEAD response ends with its HEADERS");
    assert!(!head_data, "no DATA for HEAD");
    assert_eq!(
        head_length.as_deref(),
        Some("11"),
        "HEAD carries the length"
    );
    assert_eq!(get_body, b"fixed reply");
}

#[tokio::test]
async fn streams_past_max_concurrent_are_refused() {
    let (_h, addr) = start(|c| c.limits.max_concurrent_streams = 2).await;
    let mut raw = Raw::connect(addr).await;
    for id in [1, 3, 5] {
        raw.send(&headers_frame(id, &get_block("/slow"), true))
            .await;
    }
    let (h, p) = raw.until(kind::RST_STREAM).await.expect("a reset");
    assert_eq!(h.stream, 5);
    assert_eq!(
        Reason(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
        Reason::REFUSED_STREAM
    );
    // The two others are answered.
    let mut answered = 0;
    while answered < 2 {
        let (h, _) = raw.until(kind::DATA).await.expect("answers");
        if h.has(flag::END_STREAM) {
            answered += 1;
        }
    }
}

#[tokio::test]
async fn rapid_reset_is_answered_with_enhance_your_calm() {
    let (h, addr) = start(|c| c.limits.max_pending_reset_streams = 10).await;
    let mut raw = Raw::connect(addr).await;
    let mut out = BytesMut::new();
    for i in 0..100u32 {
        let id = 1 + 2 * i;
        frame::put_headers(&mut out, id, &get_block("/slow"), true, 16_384);
        frame::put_rst(&mut out, id, Reason::CANCEL);
    }
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));
    assert!(raw.frame().await.is_none() || raw.until(kind::GOAWAY).await.is_none());
    let hits = h.runtime.shared.metrics.render();
    assert!(hits.contains("h2_rapid_reset"), "counted in metrics");
}

#[tokio::test]
async fn continuation_and_ping_floods_end_the_connection() {
    let (_h, addr) = start(|c| c.limits.max_header_bytes = 4096).await;
    // A header block that never ends.
    let mut raw = Raw::connect(addr).await;
    let mut out = BytesMut::new();
    let junk = vec![b'a'; 8 * 1024];
    frame::put_head(&mut out, 0, kind::HEADERS, 0, 1);
    for _ in 0..64 {
        frame::put_head(&mut out, junk.len(), kind::CONTINUATION, 0, 1);
        out.extend_from_slice(&junk);
    }
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));

    // Empty CONTINUATION frames.
    let mut raw = Raw::connect(addr).await;
    let mut out = BytesMut::new();
    frame::put_head(&mut out, 0, kind::HEADERS, 0, 1);
    for _ in 0..1000 {
        frame::put_head(&mut out, 0, kind::CONTINUATION, 0, 1);
    }
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));

    // PINGs.
    let mut raw = Raw::connect(addr).await;
    let mut out = BytesMut::new();
    for i in 0..3000u64 {
        frame::put_head(&mut out, 8, kind::PING, 0, 0);
        out.extend_from_slice(&i.to_be_bytes());
    }
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));
}

#[tokio::test]
async fn protocol_errors_get_the_right_codes() {
    let (_h, addr) = start(|c| c.limits.max_header_bytes = 1024).await;
    // A header list past max_header_bytes: 431 on that stream, the connection goes on.
    let mut raw = Raw::connect(addr).await;
    let big = "v".repeat(2000);
    let mut fields = vec![
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "a.test"),
        (":path", "/fixed"),
    ];
    fields.push(("x-big", &big));
    raw.send(&headers_frame(1, &block(&fields), true)).await;
    let (h, p) = raw.until(kind::HEADERS).await.unwrap();
    assert_eq!(h.stream, 1);
    let mut status = None;
    sweety_dataplane::hpack::Decoder::new()
        .decode(&p, 1 << 16, |f| {
            if f.name == b":status" {
                status = Some(String::from_utf8_lossy(f.value).into_owned());
            }
        })
        .unwrap();
    assert_eq!(status.as_deref(), Some("431"));
    raw.send(&headers_frame(3, &get_block("/fixed"), true))
        .await;
    let (h, p) = raw.until(kind::DATA).await.unwrap();
    assert_eq!((h.stream, &p[..]), (3, &b"fixed reply"[..]));

    // Connection window overflow.
    let mut out = BytesMut::new();
    frame::put_window_update(&mut out, 0, 0x7fff_ffff);
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::FLOW_CONTROL_ERROR));

    // A frame larger than SETTINGS_MAX_FRAME_SIZE.
    let mut raw = Raw::connect(addr).await;
    let mut out = BytesMut::new();
    frame::put_head(&mut out, 20_000, kind::DATA, 0, 1);
    out.extend_from_slice(&vec![0; 20_000]);
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::FRAME_SIZE_ERROR));

    // A malformed request (upper-case header name): RST_STREAM PROTOCOL_ERROR only.
    let mut raw = Raw::connect(addr).await;
    let bad = block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        ("X-Upper", "1"),
    ]);
    raw.send(&headers_frame(1, &bad, true)).await;
    let (h, p) = raw.until(kind::RST_STREAM).await.unwrap();
    assert_eq!(h.stream, 1);
    assert_eq!(
        Reason(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
        Reason::PROTOCOL_ERROR
    );

    // Not the HTTP/2 preface, though it starts like it: left to HTTP/1.1, which refuses it.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 9];
    let n = bounded(s.read(&mut first)).await.unwrap_or(0);
    assert!(
        n == 0 || first.starts_with(b"HTTP/1.1 "),
        "{:?}",
        &first[..n]
    );
}

/// The header-read timeout (300 ms) and the idle timeout (1 s) differ, and the limit
/// counters and GOAWAY codes tell which one closed each connection.
#[tokio::test]
async fn header_read_and_idle_timeouts_close_connections() {
    let (h, addr) = start(|c| {
        c.limits.header_read_timeout = sweety_config::Duration(Duration::from_millis(300));
        c.limits.idle_timeout = sweety_config::Duration(Duration::from_secs(1));
    })
    .await;
    // A header block left unfinished (SETTINGS settled first: nothing may come between
    // HEADERS and its CONTINUATION, not even our SETTINGS ACK).
    let mut raw = Raw::connect(addr).await;
    raw.until(kind::SETTINGS)
        .await
        .expect("the server's SETTINGS");
    let mut out = BytesMut::new();
    let b = get_block("/fixed");
    frame::put_head(&mut out, b.len(), kind::HEADERS, flag::END_STREAM, 1);
    out.extend_from_slice(&b);
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::PROTOCOL_ERROR));
    assert!(raw.frame().await.is_none(), "then closed");
    assert_eq!(limit_hits(&h, "header_read_timeout"), 1);
    assert_eq!(limit_hits(&h, "idle_timeout"), 0);

    // An idle connection after a request.
    let mut raw = Raw::connect(addr).await;
    raw.send(&headers_frame(1, &get_block("/fixed"), true))
        .await;
    let (_, p) = raw.until(kind::DATA).await.unwrap();
    assert_eq!(&p[..], b"fixed reply");
    assert_eq!(raw.goaway().await, Some(Reason::NO_ERROR));
    assert!(raw.frame().await.is_none(), "then closed");
    assert_eq!(limit_hits(&h, "idle_timeout"), 1);
    assert_eq!(limit_hits(&h, "header_read_timeout"), 1, "unchanged");
}

/// The server's first SETTINGS frame, as (id, value) pairs.
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut raw = Raw::connect(addr).await;
    loop {
        let (h, p) = raw.frame().await.expect("the server's SETTINGS");
        if h.kind == kind::SETTINGS && !h.has(flag::ACK) {
            return frame::settings_params(&p).collect();
        }
    }
}

/// What Sweety's engine advertises (docs/config.md, HTTP/2 engine): hyper's h2 sends other
/// settings (MAX_FRAME_SIZE among them), so this tells the engines apart.
fn sweety_settings(max_streams: u32, max_header_bytes: u32) -> Vec<(u16, u32)> {
    use frame::setting;
    vec![
        (setting::MAX_CONCURRENT_STREAMS, max_streams),
        (setting::INITIAL_WINDOW_SIZE, 256 * 1024),
        (setting::MAX_HEADER_LIST_SIZE, max_header_bytes),
        (setting::ENABLE_CONNECT_PROTOCOL, 1),
    ]
}

#[tokio::test]
async fn the_engines_are_told_apart_by_their_settings() {
    let l = Limits::default();
    let (_h, addr) = start(|_| {}).await;
    assert_eq!(
        server_settings(addr).await,
        sweety_settings(l.max_concurrent_streams, l.max_header_bytes)
    );
}

#[tokio::test]
async fn the_hyper_engine_still_serves_http2_when_chosen() {
    let (_h, addr) = start(|c| c.limits.http2_engine = Http2Engine::Hyper).await;
    let l = Limits::default();
    let settings = server_settings(addr).await;
    assert_ne!(
        settings,
        sweety_settings(l.max_concurrent_streams, l.max_header_bytes),
        "hyper's h2 serves, not Sweety's engine"
    );
    let (out, err) = curl(&[
        "--http2-prior-knowledge",
        "-w",
        " %{http_version} %{http_code}",
        &format!("http://{addr}/fixed"),
    ])
    .await;
    assert_eq!(out, "fixed reply 2 200", "{err}");
    trailers_round_trip(addr).await;
}

/// Silent for the idle timeout (300 ms) with a stream open: PINGed, and closed when no
/// answer comes within the header-read timeout (800 ms; the counters tell it was the
/// keep-alive's).
#[tokio::test]
async fn a_silent_client_with_a_blocked_stream_is_pinged_then_dropped() {
    let (harness, addr) = start(|c| {
        c.limits.header_read_timeout = sweety_config::Duration(Duration::from_millis(800));
        c.limits.idle_timeout = sweety_config::Duration(Duration::from_millis(300));
    })
    .await;
    let mut raw = Raw::connect(addr).await;
    // No stream window: the response cannot be sent; then the client goes silent.
    let mut out = BytesMut::new();
    frame::put_settings(&mut out, &[(frame::setting::INITIAL_WINDOW_SIZE, 0)]);
    out.extend_from_slice(&headers_frame(1, &get_block("/big/100000"), true));
    raw.send(&out).await;
    let (h, p) = raw.until(kind::PING).await.expect("a keep-alive PING");
    assert!(!h.has(flag::ACK));
    assert_eq!(p.len(), 8);
    // Unanswered: the connection ends.
    assert!(
        raw.until(kind::DATA).await.is_none(),
        "closed, no data sent"
    );
    assert_eq!(limit_hits(&harness, "h2_keepalive_timeout"), 1);
    assert_eq!(limit_hits(&harness, "header_read_timeout"), 0);
    assert_eq!(limit_hits(&harness, "idle_timeout"), 0);
}

#[tokio::test]
async fn provoked_stream_errors_count_as_resets() {
    let (_h, addr) = start(|c| c.limits.max_pending_reset_streams = 10).await;
    let mut raw = Raw::connect(addr).await;
    raw.send(&headers_frame(1, &get_block("/fixed"), true))
        .await;
    let (h, _) = raw.until(kind::DATA).await.unwrap();
    assert!(h.has(flag::END_STREAM));
    // DATA on the closed stream, again and again: each is a STREAM_CLOSED reset we send.
    let mut out = BytesMut::new();
    for _ in 0..100 {
        frame::put_data(&mut out, 1, b"x", false);
    }
    raw.send(&out).await;
    assert_eq!(raw.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));
}

#[test]
fn the_engine_setting_is_parsed_and_checked() {
    let c = Config::from_yaml("version: 1\nlimits: {http2_engine: hyper}\n").unwrap();
    assert_eq!(c.limits.http2_engine, Http2Engine::Hyper);
    assert!(
        c.to_yaml().contains("http2_engine: hyper"),
        "the fallback is written"
    );
    let c = Config::from_yaml("version: 1\n").unwrap();
    assert_eq!(c.limits.http2_engine, Http2Engine::Sweety, "the default");
    assert!(
        !c.to_yaml().contains("http2_engine"),
        "the default is left out when written"
    );
    let err = Config::from_yaml("version: 1\nlimits: {http2_engine: h2}\n").unwrap_err();
    assert!(err.to_string().contains("http2_engine"), "{err}");
}

/// HTTP/2 clients may send each cookie crumb as its own field (RFC 9113 §8.2.3): an
/// HTTP/1.1 backend gets them as one Cookie header joined with "; ".
#[tokio::test]
async fn cookie_crumbs_reach_an_http1_backend_as_one_header() {
    use common::h2::{frame as h2frame, literal_field, open, request_block, Event, DATA};
    let (_h, addr) = start(|_| {}).await;
    let (mut rd, mut wr) = open(addr).await;
    let mut block = request_block("/cookies");
    literal_field(&mut block, "cookie", b"a=1");
    literal_field(&mut block, "cookie", b"b=2");
    literal_field(&mut block, "cookie", b"c=3");
    wr.write_all(&h2frame(
        kind::HEADERS,
        flag::END_STREAM | flag::END_HEADERS,
        1,
        &block,
    ))
    .await
    .unwrap();
    let ev = bounded(rd.until(
        &mut wr,
        "the response body",
        |e| matches!(e, Event::Frame(f) if f.stream == 1 && f.ty == DATA),
    ))
    .await;
    let Event::Frame(f) = ev else { unreachable!() };
    assert_eq!(String::from_utf8_lossy(&f.payload), "a=1; b=2; c=3");
}
