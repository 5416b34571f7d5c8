//! WebSocket tunnelling end to end: a tokio-tungstenite echo backend behind Sweety, reached
//! by a tokio-tungstenite client over HTTP/1.1 Upgrade and over HTTP/2 extended CONNECT
//! (RFC 8441, hyper's h2c client); subprotocols pass both ways, the idle timeout closes
//! silent tunnels and open tunnels are counted in metrics and hold a request slot.

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use sweety_config::*;
use tokio_tungstenite::tungstenite::handshake::server::{Request as WsReq, Response as WsResp};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;

/// An echo WebSocket server that accepts the `chat` subprotocol when offered.
// The handshake callback's error type is tungstenite's.
#[allow(clippy::result_large_err)]
async fn echo_backend() -> SocketAddr {
    spawn_backend(move |s| async move {
        let cb = |req: &WsReq, mut resp: WsResp| {
            let offered = req
                .headers()
                .get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.split(',').any(|p| p.trim() == "chat"));
            if offered {
                resp.headers_mut()
                    .insert("sec-websocket-protocol", "chat".parse().unwrap());
            }
            Ok(resp)
        };
        let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(s, cb).await else {
            return;
        };
        while let Some(Ok(m)) = ws.next().await {
            if m.is_text() || m.is_binary() {
                if ws.send(m).await.is_err() {
                    return;
                }
            } else if m.is_close() {
                return;
            }
        }
    })
    .await
}

async fn start(idle: Duration) -> (Harness, SocketAddr) {
    start_with(idle, None).await
}

/// As [`start`], with the route's `timeouts.read_idle`.
async fn start_with(idle: Duration, read_idle: Option<Duration>) -> (Harness, SocketAddr) {
    let up = echo_backend().await;
    let mut route = proxy_route("ws", "/", "ws");
    route.timeouts.read_idle = read_idle.map(sweety_config::Duration);
    let mut cfg = Config {
        backends: vec![backend("ws", up)],
        ..http_config(vec![vhost("v", &[], vec![route])])
    };
    cfg.limits.websocket_idle_timeout = sweety_config::Duration(idle);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr)
}

async fn ws_connect(
    addr: SocketAddr,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio_tungstenite::client_async(format!("ws://{addr}/x"), tcp).await
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("finished in time")
}

#[tokio::test]
async fn http1_upgrade_echoes_and_passes_subprotocol() {
    let (h, addr) = start(Duration::from_secs(30)).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = http::Request::builder()
        .uri(format!("ws://{addr}/chat"))
        .header("host", addr.to_string())
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header(
            "sec-websocket-key",
            tokio_tungstenite::tungstenite::handshake::client::generate_key(),
        )
        .header("sec-websocket-protocol", "chat, other")
        .body(())
        .unwrap();
    let (mut ws, resp) = bounded(tokio_tungstenite::client_async(req, tcp))
        .await
        .expect("handshake through sweety");
    assert_eq!(resp.status(), 101);
    assert_eq!(resp.headers()["sec-websocket-protocol"], "chat");
    for i in 0..20 {
        let msg = format!("hello {i}");
        bounded(ws.send(Message::text(msg.clone()))).await.unwrap();
        let back = bounded(ws.next()).await.unwrap().unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), msg);
    }
    let big = vec![9u8; 200_000];
    bounded(ws.send(Message::binary(big.clone())))
        .await
        .unwrap();
    let back = bounded(ws.next()).await.unwrap().unwrap();
    assert_eq!(back.into_data().as_ref(), big.as_slice());

    // The open tunnel is counted and holds a request slot.
    let m = &h.runtime.shared.metrics;
    assert_eq!(m.websocket_tunnels.load(Relaxed), 1);
    assert_eq!(m.active_requests.load(Relaxed), 1);
    assert!(m.render().contains("sweety_websocket_tunnels 1"));
    bounded(ws.close(None)).await.unwrap();
    // Both slots are released once the tunnel ends (bounded poll).
    for _ in 0..250 {
        if m.websocket_tunnels.load(Relaxed) == 0 && m.active_requests.load(Relaxed) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(m.websocket_tunnels.load(Relaxed), 0);
    assert_eq!(m.active_requests.load(Relaxed), 0);
}

#[tokio::test]
async fn idle_tunnel_is_closed() {
    let (_h, addr) = start(Duration::from_millis(300)).await;
    echo_then_closed_when_quiet(addr).await;
}

/// The route's `read_idle` (ingress-nginx's `proxy-read-timeout`) is its tunnels' idle clock:
/// 300 ms closes a quiet tunnel although the dataplane-wide timeout is an hour.
#[tokio::test]
async fn route_read_idle_is_the_tunnels_idle_clock() {
    let (_h, addr) = start_with(Duration::from_secs(3600), Some(Duration::from_millis(300))).await;
    echo_then_closed_when_quiet(addr).await;
}

/// One message echoed, then silence longer than a 300 ms idle clock: the tunnel ends.
async fn echo_then_closed_when_quiet(addr: SocketAddr) {
    let (mut ws, _) = bounded(ws_connect(addr)).await.unwrap();
    bounded(ws.send(Message::text("ping"))).await.unwrap();
    assert_eq!(
        bounded(ws.next())
            .await
            .unwrap()
            .unwrap()
            .into_text()
            .unwrap()
            .as_str(),
        "ping"
    );
    // Silence for longer than the idle timeout (300 ms): the stream ends (EOF, Close or an
    // error), and not before the timeout.
    let quiet = std::time::Instant::now();
    let end = bounded(ws.next()).await;
    assert!(
        quiet.elapsed() >= Duration::from_millis(250),
        "closed after {:?}, before the idle timeout",
        quiet.elapsed()
    );
    assert!(
        matches!(end, None | Some(Ok(Message::Close(_))) | Some(Err(_))),
        "unexpected message {end:?}"
    );
}

#[tokio::test]
async fn non_websocket_backend_answer_is_relayed() {
    // A backend that answers the upgrade with 403 (a plain HTTP server).
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok((s, _)) = l.accept().await else { return };
        let svc = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(403)
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(
                        b"nope",
                    )))
                    .unwrap(),
            )
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), svc)
            .await;
    });
    let cfg = Config {
        backends: vec![backend("ws", up)],
        ..http_config(vec![vhost("v", &[], vec![proxy_route("ws", "/", "ws")])])
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let err = bounded(ws_connect(addr)).await.unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => assert_eq!(resp.status(), 403),
        other => panic!("expected an HTTP 403, got {other:?}"),
    }
    assert_eq!(h.runtime.shared.metrics.websocket_tunnels.load(Relaxed), 0);
}

#[tokio::test]
async fn http2_extended_connect_reaches_http1_backend() {
    let (h, addr) = start(Duration::from_secs(30)).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    // The server's SETTINGS_ENABLE_CONNECT_PROTOCOL arrives with its first SETTINGS frame.
    bounded(send.ready()).await.unwrap();
    let mut req = http::Request::builder()
        .method("CONNECT")
        .version(http::Version::HTTP_2)
        .uri(format!("http://{addr}/chat"))
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat")
        .body(http_body_util::Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let resp = bounded(send.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["sec-websocket-protocol"], "chat");
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    let upgraded = bounded(hyper::upgrade::on(resp)).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        Role::Client,
        None,
    )
    .await;
    for i in 0..10 {
        let msg = format!("over h2 {i}");
        bounded(ws.send(Message::text(msg.clone()))).await.unwrap();
        let back = bounded(ws.next()).await.unwrap().unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), msg);
    }
    assert_eq!(h.runtime.shared.metrics.websocket_tunnels.load(Relaxed), 1);
    bounded(ws.close(None)).await.unwrap();
}

/// A WebSocket backend that sends its `tag` as the first message, then echoes.
async fn tagged_backend(tag: &'static str) -> SocketAddr {
    spawn_backend(move |s| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
            return;
        };
        if ws.send(Message::text(tag)).await.is_err() {
            return;
        }
        while let Some(Ok(m)) = ws.next().await {
            if m.is_close() || ws.send(m).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// Opens a WebSocket through Sweety with `headers`; returns the backend's tag and the
/// handshake response's `Set-Cookie`.
async fn tagged_connect(addr: SocketAddr, headers: &[(&str, &str)]) -> (String, Option<String>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = http::Request::builder()
        .uri(format!("ws://{addr}/x"))
        .header("host", addr.to_string())
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header(
            "sec-websocket-key",
            tokio_tungstenite::tungstenite::handshake::client::generate_key(),
        );
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (mut ws, resp) = bounded(tokio_tungstenite::client_async(req.body(()).unwrap(), tcp))
        .await
        .expect("handshake through sweety");
    assert_eq!(resp.status(), 101);
    let cookie = resp
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_string());
    let tag = bounded(ws.next()).await.unwrap().unwrap();
    let _ = bounded(ws.close(None)).await;
    (tag.into_text().unwrap().to_string(), cookie)
}

/// Upgrades choose their endpoint like ordinary requests: the session cookie sticks (and is
/// issued on the 101), and consistent hashing by header keeps a key on one endpoint.
#[tokio::test]
async fn upgrades_follow_session_affinity_and_hashing() {
    let mut addrs = Vec::new();
    for tag in ["A", "B", "C"] {
        addrs.push(tagged_backend(tag).await);
    }
    let mut b = backend("ws", addrs[0]);
    b.endpoints = addrs
        .iter()
        .map(|a| Endpoint {
            address: a.to_string(),
            weight: 1,
        })
        .collect();
    b.session_persistence = Some(SessionPersistence {
        kind: SessionKind::Cookie,
        name: "route".into(),
        ttl: None,
        path: None,
        secure: false,
        http_only: false,
        same_site: None,
    });
    let cfg = Config {
        backends: vec![b.clone()],
        ..http_config(vec![vhost("v", &[], vec![proxy_route("ws", "/", "ws")])])
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;

    let (first, set) = tagged_connect(addr, &[]).await;
    let set = set.expect("the 101 carries the session cookie");
    let cookie = set.split(';').next().unwrap().to_string();
    assert!(cookie.starts_with("route="), "{set}");
    for _ in 0..9 {
        let (who, again) = tagged_connect(addr, &[("cookie", &cookie)]).await;
        assert_eq!(who, first, "the session cookie picks the endpoint");
        assert_eq!(again, None, "no new cookie for a valid session");
    }
    // Without the cookie, round robin reaches every endpoint.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..6 {
        seen.insert(tagged_connect(addr, &[]).await.0);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    h.runtime.shutdown().await;

    // Consistent hashing by header: each key stays on one endpoint, keys spread.
    b.session_persistence = None;
    b.hash = Some(HashPolicy {
        on: HashOn::Header("x-user".into()),
        algorithm: HashAlgorithm::Maglev,
    });
    let cfg = Config {
        backends: vec![b],
        ..http_config(vec![vhost("v", &[], vec![proxy_route("ws", "/", "ws")])])
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let mut owner = std::collections::HashMap::new();
    for round in 0..2 {
        for u in 0..12 {
            let user = format!("user-{u}");
            let (who, _) = tagged_connect(addr, &[("x-user", &user)]).await;
            let prev = owner.insert(user, who.clone());
            if round > 0 {
                assert_eq!(prev, Some(who), "a hashed key moved");
            }
        }
    }
    let used: std::collections::HashSet<_> = owner.values().collect();
    assert!(used.len() > 1, "keys spread over endpoints: {used:?}");
    h.runtime.shutdown().await;
}

/// An upgrade request with a chunked body (`Transfer-Encoding: chunked`) is refused 400 before
/// any backend sees it, on both HTTP/1.1 engines. A WebSocket handshake has no body (RFC 6455
/// §4.1: a GET), the tunnel would start after a body the proxy does not forward, and Sweety's
/// engine offers no upgrade to such a request. Before, the backend got the upgrade request,
/// answered 101, and the client got a 500 (Sweety's engine) with the backend's connection
/// dropped.
#[tokio::test]
async fn a_chunked_upgrade_request_is_refused_before_the_backend() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for engine in [Http1Engine::Sweety, Http1Engine::Hyper] {
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let s2 = seen.clone();
        let up = spawn_backend(move |s| {
            s2.fetch_add(1, Relaxed);
            // Counted, then closed: no backend may get this far.
            async move { drop(s) }
        })
        .await;
        let mut cfg = Config {
            backends: vec![backend("ws", up)],
            ..http_config(vec![vhost("v", &[], vec![proxy_route("ws", "/", "ws")])])
        };
        cfg.limits.http1_engine = engine;
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        c.shutdown().await.unwrap();
        let mut out = Vec::new();
        let _ = bounded(c.read_to_end(&mut out)).await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 400 "), "{engine:?}: {out}");
        assert!(out.contains("chunked"), "{engine:?}: {out}");
        assert_eq!(seen.load(Relaxed), 0, "{engine:?}: the backend saw it");
    }
}
