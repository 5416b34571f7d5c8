//! Layer-4 listeners: TLS routed by SNI (the ClientHello is peeked; a route either passes
//! the TLS bytes through untouched or terminates TLS here with the listener's certificates
//! and forwards the plaintext), TCP proxying and UDP proxying with a bounded session table.
//!
//! TCP and TLS-passthrough connections come through the same accept loop as HTTP
//! ([`crate::listen::tcp::run_tcp`]), so they hold a slot of `limits.max_connections` and follow
//! hot reloads the same way: the socket is kept while a listener with the same bind key
//! exists, and each new connection uses the routes of the current snapshot. UDP listeners
//! run [`udp::run_udp`]; each UDP session holds a connection slot too.

pub mod sni;
pub mod udp;

use crate::state::{ListenerView, Shared};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Copy buffer per direction of a TCP proxy connection, bytes.
const COPY_BUF: usize = 16 * 1024;

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

/// Serves one accepted TCP connection of a `tcp`, `tls_passthrough` or `tls` listener: pick
/// the route (by SNI for the TLS kinds), terminate TLS when the route says so, pick an
/// endpoint, connect, optionally send a PROXY v2 header, replay the peeked bytes (passthrough)
/// and copy both ways until both sides close or the idle timeout.
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
    let handshake_timeout = snap.config.limits.header_read_timeout.get();
    let upstreams = snap.upstreams.clone();
    drop(snap);
    let metrics = shared.metrics.clone();
    let mut first = Vec::new();
    let route = if l4.routes_by_sni() {
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
                tracing::debug!(%peer, why, "TLS listener: no usable ClientHello");
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
    // A terminating route: finish the handshake (the ClientHello already read is replayed to
    // rustls) before a backend connection is spent on the client.
    let client = if route.terminate {
        let Some(cfg) = view.tls.clone() else {
            metrics.edge_events.inc(&"l4_no_certificate");
            return;
        };
        let replay = Replay::new(std::mem::take(&mut first), stream);
        let accept = tokio_rustls::TlsAcceptor::from(cfg).accept(replay);
        match tokio::time::timeout(handshake_timeout, accept).await {
            Ok(Ok(tls)) => Client::Tls(Box::new(tls)),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                metrics.edge_events.inc(&"l4_tls_handshake_failed");
                return;
            }
            Err(_) => {
                metrics.edge_events.inc(&"l4_tls_handshake_timeout");
                return;
            }
        }
    } else {
        Client::Plain(stream)
    };
    let Some(target) = upstreams.l4_target(&route.backends, peer.ip()) else {
        metrics.upstream_error("no_endpoint");
        return;
    };
    drop(upstreams);
    let addr = target.address().to_string();
    let upstream = match tokio::time::timeout(target.connect_timeout(), target.connect_tcp()).await
    {
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
    let idle = settings.tcp_idle_timeout.get();
    match client {
        Client::Plain(mut stream) => {
            let (ar, aw) = stream.split();
            pipe(ar, aw, upstream, idle).await;
        }
        Client::Tls(tls) => {
            let (ar, aw) = tokio::io::split(*tls);
            pipe(ar, aw, upstream, idle).await;
        }
    }
}

/// The client side of a layer-4 connection: as accepted, or with TLS terminated here.
enum Client {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<Replay<TcpStream>>>),
}

/// A stream that first yields bytes already read from it (the peeked ClientHello), then
/// reads on; writes go straight through.
pub struct Replay<S> {
    head: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Replay<S> {
    /// `head` is returned by the first reads, before anything from `inner`.
    pub fn new(head: Vec<u8>, inner: S) -> Replay<S> {
        Replay {
            head,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.head.len() {
            let n = (this.head.len() - this.pos).min(buf.remaining());
            buf.put_slice(&this.head[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.head.len() {
                this.head = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Copies both ways between the client (its read and write halves) and `upstream`,
/// concurrently, until both directions are closed or nothing moved for `idle`. A side that
/// closes has its write half shut down on the other side (half-close is kept); an error in
/// one direction ends that direction.
pub async fn pipe<R, W>(mut ar: R, mut aw: W, mut upstream: TcpStream, idle: Duration)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let epoch = std::time::Instant::now();
    let last = std::sync::atomic::AtomicU64::new(0);
    let touch = || {
        last.store(
            epoch.elapsed().as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        )
    };
    let (mut br, mut bw) = upstream.split();
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
