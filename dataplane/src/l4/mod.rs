//! Layer-4 listeners: TLS passthrough routed by SNI (the ClientHello is peeked, never
//! terminated), TCP proxying and UDP proxying with a bounded session table.
//!
//! TCP and TLS-passthrough connections come through the same accept loop as HTTP
//! ([`crate::server::run_tcp`]), so they hold a slot of `limits.max_connections` and follow
//! hot reloads the same way: the socket is kept while a listener with the same bind key
//! exists, and each new connection uses the routes of the current snapshot. UDP listeners
//! run [`udp::run_udp`]; each UDP session holds a connection slot too.

pub mod sni;
pub mod udp;

use crate::runtime::{ListenerView, Shared};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::{Listener, ListenerProtocol, WeightedBackend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Copy buffer per direction of a TCP proxy connection, bytes.
const COPY_BUF: usize = 16 * 1024;

/// One compiled layer-4 route.
#[derive(Debug)]
pub struct L4RouteRt {
    /// Route name.
    pub name: Arc<str>,
    /// Exact SNI names (lower-case).
    exact: Vec<String>,
    /// Wildcard suffixes (`.example.com` for `*.example.com`).
    wildcard: Vec<String>,
    /// Backends by weight.
    pub backends: Vec<WeightedBackend>,
}

/// The layer-4 part of a listener.
#[derive(Debug)]
pub struct L4Listener {
    /// Protocol (`tcp`, `udp` or `tls_passthrough`).
    pub protocol: ListenerProtocol,
    /// Routes in config order.
    pub routes: Vec<L4RouteRt>,
}

impl L4Listener {
    /// Compiles the routes of an L4 listener; `None` for HTTP(S) listeners.
    pub fn compile(l: &Listener) -> Option<Arc<L4Listener>> {
        if !matches!(
            l.protocol,
            ListenerProtocol::Tcp | ListenerProtocol::Udp | ListenerProtocol::TlsPassthrough
        ) {
            return None;
        }
        let routes = l
            .l4_routes
            .iter()
            .map(|r| {
                let (mut exact, mut wildcard) = (Vec::new(), Vec::new());
                for h in &r.hostnames {
                    let h = h.trim_end_matches('.').to_ascii_lowercase();
                    match h.strip_prefix('*') {
                        Some(suffix) => wildcard.push(suffix.to_string()),
                        None => exact.push(h),
                    }
                }
                L4RouteRt {
                    name: r.name.as_str().into(),
                    exact,
                    wildcard,
                    backends: r.backends.clone(),
                }
            })
            .collect();
        Some(Arc::new(L4Listener {
            protocol: l.protocol,
            routes,
        }))
    }

    /// The route for a connection with this SNI: an exact name first, then the longest
    /// matching wildcard, then a route without hostnames. TCP and UDP listeners use their
    /// first route.
    pub fn route(&self, sni: Option<&str>) -> Option<&L4RouteRt> {
        if self.protocol != ListenerProtocol::TlsPassthrough {
            return self.routes.first();
        }
        let any = || {
            self.routes
                .iter()
                .find(|r| r.exact.is_empty() && r.wildcard.is_empty())
        };
        let Some(sni) = sni else {
            return any();
        };
        if let Some(r) = self
            .routes
            .iter()
            .find(|r| r.exact.iter().any(|e| e == sni))
        {
            return Some(r);
        }
        let mut best: Option<(&L4RouteRt, usize)> = None;
        for r in &self.routes {
            for w in &r.wildcard {
                // `*.example.com` matches `a.example.com` and `a.b.example.com`, not the apex.
                if sni.len() > w.len()
                    && sni.ends_with(w.as_str())
                    && best.is_none_or(|b| w.len() > b.1)
                {
                    best = Some((r, w.len()));
                }
            }
        }
        best.map(|b| b.0).or_else(any)
    }
}

/// Reads the start of a TLS connection until the ClientHello is complete (at most `max`
/// bytes); returns the bytes read (to be replayed to the backend) and the SNI.
pub async fn read_client_hello(
    stream: &mut TcpStream,
    max: usize,
) -> Result<(Vec<u8>, Option<String>), &'static str> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = vec![0u8; 4096];
    loop {
        match sni::peek(&buf, max) {
            sni::Peek::Hello(name) => return Ok((buf, name)),
            sni::Peek::Invalid(why) => return Err(why),
            sni::Peek::NeedMore => {}
        }
        let room = max.saturating_sub(buf.len()).min(chunk.len());
        if room == 0 {
            return Err("ClientHello larger than the peek limit");
        }
        let n = stream
            .read(&mut chunk[..room])
            .await
            .map_err(|_| "read error before the ClientHello completed")?;
        if n == 0 {
            return Err("connection closed before the ClientHello completed");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Serves one accepted TCP connection of a `tcp` or `tls_passthrough` listener: pick the
/// route (by SNI for passthrough), an endpoint, connect, optionally send a PROXY v2 header,
/// replay the peeked bytes and copy both ways until both sides close or the idle timeout.
pub async fn serve_tcp(
    shared: Arc<Shared>,
    view: Arc<ListenerView>,
    mut stream: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
) {
    let Some(l4) = view.l4.clone() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let snap = shared.snapshot();
    let settings = snap.config.l4.clone();
    let metrics = shared.metrics.clone();
    let mut first = Vec::new();
    let route = if l4.protocol == ListenerProtocol::TlsPassthrough {
        let max = settings.max_peek_bytes as usize;
        match tokio::time::timeout(
            settings.peek_timeout.get(),
            read_client_hello(&mut stream, max),
        )
        .await
        {
            Ok(Ok((bytes, name))) => {
                first = bytes;
                l4.route(name.as_deref())
            }
            Ok(Err(why)) => {
                tracing::debug!(%peer, why, "TLS passthrough: no usable ClientHello");
                metrics.edge_events.inc(&"tls_peek_invalid");
                return;
            }
            Err(_) => {
                metrics.edge_events.inc(&"tls_peek_timeout");
                return;
            }
        }
    } else {
        l4.route(None)
    };
    let Some(route) = route else {
        metrics.edge_events.inc(&"l4_no_route");
        return;
    };
    let Some(target) = snap.upstreams.l4_target(&route.backends, peer.ip()) else {
        metrics.upstream_error("no_endpoint");
        return;
    };
    drop(snap);
    let addr = target.address().to_string();
    let upstream =
        match tokio::time::timeout(target.connect_timeout(), TcpStream::connect(&addr)).await {
            Ok(Ok(s)) => {
                target.record(true);
                s
            }
            Ok(Err(e)) => {
                target.record(false);
                metrics.upstream_error("connect");
                tracing::debug!(%addr, error = %e, "L4 connect failed");
                return;
            }
            Err(_) => {
                target.record(false);
                metrics.upstream_error("connect_timeout");
                return;
            }
        };
    let send_pp = target.send_proxy_protocol();
    drop(target);
    let mut upstream = upstream;
    let _ = upstream.set_nodelay(true);
    if send_pp {
        let header = crate::proxy_protocol::encode_v2(peer, local, false);
        if upstream.write_all(&header).await.is_err() {
            return;
        }
    }
    if !first.is_empty() && upstream.write_all(&first).await.is_err() {
        return;
    }
    drop(first);
    pipe(stream, upstream, settings.tcp_idle_timeout.get()).await;
}

/// Copies both ways, concurrently, until both directions are closed or nothing moved for
/// `idle`. A side that closes has its write half shut down on the other side (half-close is
/// kept); an error in one direction ends that direction.
pub async fn pipe(mut a: TcpStream, mut b: TcpStream, idle: Duration) {
    let epoch = std::time::Instant::now();
    let last = std::sync::atomic::AtomicU64::new(0);
    let touch = || {
        last.store(
            epoch.elapsed().as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        )
    };
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let both = async {
        tokio::join!(
            one_way(&mut ar, &mut bw, &touch),
            one_way(&mut br, &mut aw, &touch)
        )
    };
    let watchdog = async {
        loop {
            let quiet = epoch.elapsed().saturating_sub(Duration::from_millis(
                last.load(std::sync::atomic::Ordering::Relaxed),
            ));
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    };
    tokio::select! {
        _ = both => {}
        _ = watchdog => {}
    }
}

async fn one_way<R, W>(r: &mut R, w: &mut W, touch: &impl Fn())
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = w.shutdown().await;
                return;
            }
            Ok(n) => {
                touch();
                if w.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                touch();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(routes: serde_json::Value) -> Arc<L4Listener> {
        let l: Listener = serde_json::from_value(serde_json::json!({
            "name": "tls", "port": 0, "protocol": "tls_passthrough", "l4_routes": routes,
        }))
        .unwrap();
        L4Listener::compile(&l).unwrap()
    }

    #[test]
    fn sni_routing_precedence() {
        let b = serde_json::json!([{"backend": "x"}]);
        let l = listener(serde_json::json!([
            {"name": "wild", "hostnames": ["*.example.com"], "backends": b},
            {"name": "deep", "hostnames": ["*.api.example.com"], "backends": b},
            {"name": "exact", "hostnames": ["www.example.com"], "backends": b},
            {"name": "any", "backends": b},
        ]));
        let name = |sni: Option<&str>| l.route(sni).map(|r| r.name.to_string());
        assert_eq!(name(Some("www.example.com")).as_deref(), Some("exact"));
        assert_eq!(name(Some("a.example.com")).as_deref(), Some("wild"));
        assert_eq!(name(Some("v1.api.example.com")).as_deref(), Some("deep"));
        assert_eq!(name(Some("example.com")).as_deref(), Some("any"));
        assert_eq!(name(None).as_deref(), Some("any"));
        let strict = listener(serde_json::json!([
            {"name": "only", "hostnames": ["a.test"], "backends": b},
        ]));
        assert!(strict.route(Some("b.test")).is_none());
        assert!(strict.route(None).is_none());
    }
}
