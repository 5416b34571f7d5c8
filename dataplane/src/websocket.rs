//! WebSocket tunnelling for proxy routes.
//!
//! * HTTP/1.1: a request with `Connection: upgrade` and an `Upgrade` header is sent to an
//!   HTTP/1.1 backend on a fresh connection with the same `Upgrade`; on `101 Switching
//!   Protocols` the client gets the backend's 101 and both connections become a byte tunnel.
//! * HTTP/2 extended CONNECT (RFC 8441, `:protocol = websocket`): translated into an HTTP/1.1
//!   WebSocket handshake towards the backend (`GET` with a fresh `Sec-WebSocket-Key`); on the
//!   backend's 101 the client's stream gets `200` and becomes the tunnel. Subprotocol and
//!   extension headers are passed both ways.
//!
//! An HTTP/1.1 upgrade request with a chunked body is refused (400) before any backend sees
//! it: a WebSocket handshake has no body, and the tunnel would start after one.
//!
//! The forwarding proxy (`proxy::forward`) strips `Upgrade`/`Connection` as hop-by-hop; the
//! pipeline sends upgrade requests here instead. A tunnel is closed when neither side sent a
//! byte for `limits.websocket_idle_timeout`, and holds the request's backpressure slot (and a
//! `websocket_tunnels` gauge) for its whole life: the pipeline hands the slot over through the
//! [`PermitSlot`] response extension.

use crate::body::Body;
use crate::ctx::RequestCtx;
use crate::limits::RequestPermit;
use crate::metrics::Metrics;
use crate::proxy::Upstreams;
use base64::Engine as _;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sweety_config::{ProxyAction, Route};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

static SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
static SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");
static SEC_WEBSOCKET_VERSION: HeaderName = HeaderName::from_static("sec-websocket-version");

/// After one side of a tunnel closed, how long the other direction may still drain.
pub const HALF_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Bytes read at a time in each direction of a tunnel.
pub const TUNNEL_BUFFER: usize = 16 * 1024;

/// How a request asks for a WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeRequest {
    /// HTTP/1.1 `Upgrade` with this value.
    Http1(HeaderValue),
    /// HTTP/2 extended CONNECT with `:protocol = websocket`.
    ExtendedConnect,
}

/// Whether (and how) the request asks for a protocol upgrade.
pub fn upgrade_request<B>(req: &Request<B>) -> Option<UpgradeRequest> {
    if req.method() == Method::CONNECT {
        // `:protocol` as hyper's HTTP/2 server or Sweety's engine carries it.
        let ext = req.extensions();
        let proto = ext
            .get::<hyper::ext::Protocol>()
            .map(|p| p.as_str())
            .or_else(|| ext.get::<sweety_h2::ConnectProtocol>().map(|p| p.as_str()))?;
        return proto
            .eq_ignore_ascii_case("websocket")
            .then_some(UpgradeRequest::ExtendedConnect);
    }
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let wants = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !wants {
        return None;
    }
    // Only WebSocket is tunnelled; other upgrades (`h2c` from curl --http2…) are dropped as
    // hop-by-hop and the request is proxied normally.
    let v = req.headers().get(header::UPGRADE)?;
    let websocket = v
        .to_str()
        .ok()?
        .split(',')
        .any(|p| p.trim().eq_ignore_ascii_case("websocket"));
    websocket.then(|| UpgradeRequest::Http1(v.clone()))
}

/// A response extension through which the pipeline hands the request's backpressure slot to
/// the tunnel task.
#[derive(Clone, Debug)]
pub struct PermitSlot(Arc<Mutex<Option<oneshot::Sender<RequestPermit>>>>);

impl PermitSlot {
    /// Gives the permit to the tunnel (dropped at once when the tunnel never started).
    pub fn hand_over(&self, permit: RequestPermit) {
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(permit);
        }
    }
}

/// A fresh `Sec-WebSocket-Key` (16 random bytes, base64).
fn new_key() -> HeaderValue {
    let mut raw = [0u8; 16];
    fastrand::fill(&mut raw);
    let s = base64::engine::general_purpose::STANDARD.encode(raw);
    HeaderValue::from_str(&s).expect("base64 is a valid header value")
}

/// Proxies an upgrade request to `action`'s backend and, on success, spawns the tunnel.
#[allow(clippy::too_many_arguments)]
pub async fn proxy(
    upstreams: &Upstreams,
    metrics: Arc<Metrics>,
    mut req: Request<Body>,
    kind: UpgradeRequest,
    action: &ProxyAction,
    route: &Route,
    ctx: &RequestCtx,
    idle: Duration,
) -> Response<Body> {
    // An HTTP/1.1 upgrade request with a body of unknown length (chunked) is refused before
    // any backend sees it: the tunnel starts after the request's body, which would have to be
    // forwarded whole first, and a WebSocket handshake has none (RFC 6455 §4.1: a GET).
    // Sweety's HTTP/1.1 engine offers no upgrade to such a request, so a backend's 101 could
    // only end in a 500 after the backend took the upgrade.
    if matches!(kind, UpgradeRequest::Http1(_))
        && req.headers().contains_key(header::TRANSFER_ENCODING)
    {
        tracing::debug!("upgrade request with a chunked body refused");
        return crate::body::text_response(
            StatusCode::BAD_REQUEST,
            "400 Bad Request: an upgrade request may not have a chunked body\n",
        );
    }
    // Sweety's HTTP/2 engine hands the stream's tunnel over in an extension; hyper's
    // connections (HTTP/1.1, and HTTP/2 with `http2_engine: hyper`) through its upgrades.
    let h2_client = req
        .extensions_mut()
        .remove::<sweety_h2::Upgrade>()
        .and_then(|u| u.take());
    // Sweety's HTTP/1.1 engine hands the connection over through its own extension.
    let h1_client = req
        .extensions_mut()
        .remove::<sweety_h1::server::OnUpgrade>()
        .and_then(|u| u.take());
    let client_upgrade =
        (h2_client.is_none() && h1_client.is_none()).then(|| hyper::upgrade::on(&mut req));
    let (mut parts, _body) = req.into_parts();
    let upgrade_value = match &kind {
        UpgradeRequest::Http1(v) => v.clone(),
        UpgradeRequest::ExtendedConnect => {
            parts.method = Method::GET;
            parts.version = Version::HTTP_11;
            parts.headers.insert(&SEC_WEBSOCKET_KEY, new_key());
            if !parts.headers.contains_key(&SEC_WEBSOCKET_VERSION) {
                parts
                    .headers
                    .insert(&SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
            }
            parts.extensions.remove::<hyper::ext::Protocol>();
            parts.extensions.remove::<sweety_h2::ConnectProtocol>();
            HeaderValue::from_static("websocket")
        }
    };
    let resp = match upstreams
        .upgrade(parts, upgrade_value, action, route, ctx)
        .await
    {
        Ok(r) => r,
        Err(e) => return upstreams.error_reply(&e),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Refused: relay the backend's answer as an ordinary response.
        let (mut p, body) = resp.into_parts();
        crate::proxy::forward::strip_hop_by_hop(&mut p.headers);
        return Response::from_parts(p, crate::body::boxed(body));
    }
    let mut resp = resp;
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    let (bparts, _) = resp.into_parts();
    let mut out = Response::new(crate::body::empty());
    match kind {
        UpgradeRequest::Http1(_) => {
            *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            copy_upgrade_headers(&bparts.headers, out.headers_mut(), true);
        }
        UpgradeRequest::ExtendedConnect => {
            copy_upgrade_headers(&bparts.headers, out.headers_mut(), false);
        }
    }
    let (tx, rx) = oneshot::channel();
    out.extensions_mut()
        .insert(PermitSlot(Arc::new(Mutex::new(Some(tx)))));
    tokio::spawn(async move {
        // The pipeline sends the slot as soon as it has the response; a dropped sender means
        // there is nothing to hold.
        let permit = rx.await.ok();
        let r = match (h2_client, client_upgrade) {
            (None, None) if h1_client.is_some() => {
                let Some(client) = h1_client else {
                    return;
                };
                let (client, backend) = match tokio::join!(client, backend_upgrade) {
                    (Ok(c), Ok(b)) => (c, b),
                    (c, b) => {
                        tracing::debug!(client = ?c.err(), backend = ?b.err(), "upgrade failed");
                        return;
                    }
                };
                metrics.websocket_tunnels.fetch_add(1, Relaxed);
                tunnel(client, TokioIo::new(backend), idle).await
            }
            (Some(client), _) => {
                let backend = match backend_upgrade.await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::debug!(backend = ?e, "upgrade failed");
                        return;
                    }
                };
                metrics.websocket_tunnels.fetch_add(1, Relaxed);
                tunnel(client, TokioIo::new(backend), idle).await
            }
            (None, client_upgrade) => {
                let Some(client_upgrade) = client_upgrade else {
                    return;
                };
                let (client, backend) = match tokio::join!(client_upgrade, backend_upgrade) {
                    (Ok(c), Ok(b)) => (c, b),
                    (c, b) => {
                        tracing::debug!(client = ?c.err(), backend = ?b.err(), "upgrade failed");
                        return;
                    }
                };
                metrics.websocket_tunnels.fetch_add(1, Relaxed);
                tunnel(TokioIo::new(client), TokioIo::new(backend), idle).await
            }
        };
        metrics.websocket_tunnels.fetch_sub(1, Relaxed);
        tracing::debug!(result = ?r, "tunnel closed");
        drop(permit);
    });
    out
}

/// Copies the backend's 101 headers to the client's reply: every end-to-end header (the
/// subprotocol and extensions, and `Set-Cookie` and the like, e.g. a session-affinity token),
/// without hop-by-hop and framing headers. `h1`: the client speaks HTTP/1.1 and gets
/// `Connection`/`Upgrade`/`Sec-WebSocket-Accept` too.
fn copy_upgrade_headers(from: &HeaderMap, to: &mut HeaderMap, h1: bool) {
    let mut end_to_end = from.clone();
    crate::proxy::forward::strip_hop_by_hop(&mut end_to_end);
    for name in [
        &header::CONTENT_LENGTH,
        &header::TRANSFER_ENCODING,
        &SEC_WEBSOCKET_ACCEPT,
    ] {
        end_to_end.remove(name);
    }
    for (name, v) in end_to_end.iter() {
        to.append(name.clone(), v.clone());
    }
    if h1 {
        to.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(u) = from.get(header::UPGRADE) {
            to.insert(header::UPGRADE, u.clone());
        }
        if let Some(a) = from.get(&SEC_WEBSOCKET_ACCEPT) {
            to.insert(&SEC_WEBSOCKET_ACCEPT, a.clone());
        }
    }
}

/// How a tunnel ended.
#[derive(Debug, PartialEq, Eq)]
pub enum TunnelEnd {
    /// Both sides closed; bytes client→backend and backend→client.
    Closed(u64, u64),
    /// Nothing moved for the idle timeout.
    Idle,
    /// An I/O error.
    Error(std::io::ErrorKind),
}

/// Copies bytes both ways until both directions are closed, an error, or `idle` passes with
/// no byte in either direction.
pub async fn tunnel<A, B>(a: A, b: B, idle: Duration) -> TunnelEnd
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let touch = || last.store(start.elapsed().as_millis() as u64, Relaxed);
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = pump(&mut ar, &mut bw, &touch);
    let down = pump(&mut br, &mut aw, &touch);
    tokio::pin!(up, down);
    // When one side closes, the other direction gets a short grace to drain, then the
    // tunnel ends (a WebSocket is over once either peer has closed its connection).
    let copy = async {
        let (first, up_first) = tokio::select! {
            r = &mut up => (r, true),
            r = &mut down => (r, false),
        };
        let first = first?;
        let grace = idle.min(HALF_CLOSE_GRACE);
        let second = if up_first {
            tokio::time::timeout(grace, &mut down).await
        } else {
            tokio::time::timeout(grace, &mut up).await
        };
        let second = match second {
            Ok(r) => r?,
            Err(_) => 0,
        };
        Ok::<_, std::io::Error>(if up_first {
            (first, second)
        } else {
            (second, first)
        })
    };
    let watchdog = async {
        loop {
            let since = Duration::from_millis(last.load(Relaxed));
            let deadline = since + idle;
            let now = start.elapsed();
            if now >= deadline {
                return;
            }
            tokio::time::sleep(deadline - now).await;
        }
    };
    tokio::select! {
        r = copy => match r {
            Ok((up, down)) => TunnelEnd::Closed(up, down),
            Err(e) => TunnelEnd::Error(e.kind()),
        },
        _ = watchdog => TunnelEnd::Idle,
    }
}

async fn pump<R, W>(r: &mut R, w: &mut W, touch: &impl Fn()) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; TUNNEL_BUFFER];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            w.shutdown().await?;
            return Ok(total);
        }
        touch();
        w.write_all(&buf[..n]).await?;
        w.flush().await?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_h1_upgrades_only_with_connection_upgrade() {
        let r = Request::builder()
            .header("connection", "keep-alive, Upgrade")
            .header("upgrade", "websocket")
            .body(())
            .unwrap();
        assert_eq!(
            upgrade_request(&r),
            Some(UpgradeRequest::Http1(HeaderValue::from_static("websocket")))
        );
        let r = Request::builder()
            .header("upgrade", "websocket")
            .body(())
            .unwrap();
        assert_eq!(upgrade_request(&r), None);
        let r = Request::builder()
            .header("connection", "Upgrade, HTTP2-Settings")
            .header("upgrade", "h2c")
            .body(())
            .unwrap();
        assert_eq!(upgrade_request(&r), None);
        let r = Request::builder()
            .header("connection", "upgrade")
            .body(())
            .unwrap();
        assert_eq!(upgrade_request(&r), None);
        let mut r = Request::builder()
            .method("CONNECT")
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        assert_eq!(upgrade_request(&r), None);
        r.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        assert_eq!(upgrade_request(&r), Some(UpgradeRequest::ExtendedConnect));
        // As Sweety's HTTP/2 engine carries it.
        let mut r = Request::builder()
            .method("CONNECT")
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        r.extensions_mut()
            .insert(sweety_h2::ConnectProtocol::new("websocket"));
        assert_eq!(upgrade_request(&r), Some(UpgradeRequest::ExtendedConnect));
        r.extensions_mut()
            .insert(sweety_h2::ConnectProtocol::new("h3"));
        assert_eq!(upgrade_request(&r), None);
    }

    #[test]
    fn keys_are_16_bytes_base64() {
        let k = new_key();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(k.as_bytes())
            .unwrap();
        assert_eq!(raw.len(), 16);
        assert_ne!(new_key(), k);
    }

    #[tokio::test]
    async fn tunnel_copies_both_ways_and_closes_when_idle() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (backend, mut backend_peer) = tokio::io::duplex(1024);
        let t = tokio::spawn(tunnel(client, backend, Duration::from_millis(300)));
        client_peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        backend_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        backend_peer.write_all(b"pong").await.unwrap();
        client_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // Silence: the watchdog ends it.
        let end = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(end, TunnelEnd::Idle);

        let (client, client_peer) = tokio::io::duplex(64);
        let (backend, backend_peer) = tokio::io::duplex(64);
        drop(client_peer);
        drop(backend_peer);
        let end = tunnel(client, backend, Duration::from_secs(5)).await;
        assert!(
            matches!(end, TunnelEnd::Closed(0, 0) | TunnelEnd::Error(_)),
            "{end:?}"
        );
    }
}
