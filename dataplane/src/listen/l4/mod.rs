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
    match read_client_hello_into(stream, max, &mut buf).await {
        Ok(name) => Ok((buf, name)),
        Err(HelloError::Invalid(why) | HelloError::Closed(why)) => Err(why),
    }
}

/// Why no ClientHello was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloError {
    /// The bytes are not a ClientHello we can read (not TLS, malformed, over the limit);
    /// they are in the buffer.
    Invalid(&'static str),
    /// The client closed (or the read failed) before the ClientHello was complete.
    Closed(&'static str),
}

/// [`read_client_hello`] into `buf`, which keeps every byte read whatever the outcome (for
/// a caller that hands the connection on, replaying them).
pub async fn read_client_hello_into<S>(
    stream: &mut S,
    max: usize,
    buf: &mut Vec<u8>,
) -> Result<Option<String>, HelloError>
where
    S: AsyncRead + Unpin,
{
    let mut chunk = [0u8; 4096];
    loop {
        match sni::peek(buf, max) {
            sni::Peek::Hello(name) => return Ok(name),
            sni::Peek::Invalid(why) => return Err(HelloError::Invalid(why)),
            sni::Peek::NeedMore => {}
        }
        let room = max.saturating_sub(buf.len()).min(chunk.len());
        if room == 0 {
            return Err(HelloError::Invalid(
                "ClientHello larger than the peek limit",
            ));
        }
        let n = stream
            .read(&mut chunk[..room])
            .await
            .map_err(|_| HelloError::Closed("read error before the ClientHello completed"))?;
        if n == 0 {
            return Err(HelloError::Closed(
                "connection closed before the ClientHello completed",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// What the start of a connection to an `https` listener with passthrough hosts decided.
#[derive(Debug)]
pub enum Peeked {
    /// The ClientHello names a passthrough host: the route, and the bytes read, which go to
    /// the backend first.
    Pass(usize, Vec<u8>),
    /// Anything else (another name, no SNI, not a ClientHello we read): served here; the
    /// bytes read are replayed to the TLS handshake first.
    Serve(Vec<u8>),
    /// The client closed, or sent no complete ClientHello within `l4.peek_timeout`: closed.
    Closed,
}

/// Reads the ClientHello of a connection to an `https` listener with passthrough hosts
/// (`routes`), within `l4.max_peek_bytes` and the shorter of `l4.peek_timeout` and
/// `handshake_timeout` (the listener's TLS handshake bound, which the peek is part of), and
/// says where it goes.
pub async fn peek_passthrough(
    shared: &Shared,
    routes: &crate::router::l4::L4Listener,
    stream: &mut TcpStream,
    peer: SocketAddr,
    handshake_timeout: Duration,
) -> Peeked {
    let settings = shared.snapshot().config.l4.clone();
    let mut buf = Vec::new();
    let read = read_client_hello_into(stream, settings.max_peek_bytes as usize, &mut buf);
    let bound = settings.peek_timeout.get().min(handshake_timeout);
    match tokio::time::timeout(bound, read).await {
        Ok(Ok(name)) => match name.as_deref().and_then(|n| routes.route_index(Some(n))) {
            Some(i) => Peeked::Pass(i, buf),
            None => Peeked::Serve(buf),
        },
        Ok(Err(HelloError::Invalid(why))) => {
            // Not ours to judge: the handshake refuses it as it would without the peek.
            tracing::debug!(%peer, why, "HTTPS listener: no passthrough ClientHello");
            Peeked::Serve(buf)
        }
        Ok(Err(HelloError::Closed(_))) => Peeked::Closed,
        Err(_) => {
            shared.metrics.edge_events.inc(&"tls_peek_timeout");
            Peeked::Closed
        }
    }
}

/// Passes one connection of an `https` listener through to a passthrough route's backend:
/// `first` (the ClientHello read) is replayed first, then bytes are copied both ways as on a
/// `tls_passthrough` listener.
pub async fn pass_through(
    shared: Arc<Shared>,
    route: &crate::router::l4::L4RouteRt,
    stream: TcpStream,
    first: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
) {
    let _ = stream.set_nodelay(true);
    let snap = shared.snapshot();
    let idle = snap.config.l4.tcp_idle_timeout.get();
    let upstreams = snap.upstreams.clone();
    drop(snap);
    shared.metrics.edge_events.inc(&"https_passthrough");
    forward(
        &shared,
        upstreams,
        &route.backends,
        Client::Plain(stream),
        first,
        (peer, local),
        idle,
    )
    .await;
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
    let idle = settings.tcp_idle_timeout.get();
    forward(
        &shared,
        upstreams,
        &route.backends,
        client,
        first,
        (peer, local),
        idle,
    )
    .await;
}

/// The backend half of a layer-4 connection: pick an endpoint of `backends`, connect,
/// optionally send a PROXY v2 header, replay `first`, then copy both ways until both sides
/// close or nothing moved for `idle`.
async fn forward(
    shared: &Shared,
    upstreams: Arc<crate::proxy::Upstreams>,
    backends: &[sweety_config::WeightedBackend],
    client: Client,
    first: Vec<u8>,
    (peer, local): (SocketAddr, SocketAddr),
    idle: Duration,
) {
    let metrics = &shared.metrics;
    let Some(target) = upstreams.l4_target(backends, peer.ip()) else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use proptest::prelude::*;

    /// A reader that hands out one chunk per read, then EOF.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Chunks {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            if let Some(mut c) = this.0.pop_front() {
                let n = c.len().min(buf.remaining());
                buf.put_slice(&c[..n]);
                if n < c.len() {
                    this.0.push_front(c.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Chunks {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A real ClientHello from rustls for `name`, with `max_fragment` bytes of handshake per
    /// record when set (a fragmented hello).
    pub(super) fn client_hello(name: &str, max_fragment: Option<usize>) -> Vec<u8> {
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), server).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        let Some(max) = max_fragment else {
            return out;
        };
        let mut frag = Vec::new();
        for part in out[5..].chunks(max) {
            frag.extend_from_slice(&[0x16, 0x03, 0x01]);
            frag.extend_from_slice(&(part.len() as u16).to_be_bytes());
            frag.extend_from_slice(part);
        }
        frag
    }

    /// Splits `bytes` at the (sorted, deduplicated) cut points.
    fn split(bytes: &[u8], cuts: &[usize]) -> std::collections::VecDeque<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = std::collections::VecDeque::new();
        let mut at = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            if c > at {
                out.push_back(bytes[at..c].to_vec());
                at = c;
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// However the client's bytes arrive (any split into reads, any fragmentation of the
        /// hello into records, anything after it), the peek finds the name, and the replay
        /// of what it read followed by the connection is exactly what the client sent: no
        /// byte lost, repeated or reordered.
        #[test]
        fn the_peek_and_its_replay_give_back_every_byte_in_order(
            fragment in prop_oneof![Just(None), (1usize..300).prop_map(Some)],
            cuts in proptest::collection::vec(0usize..4096, 0..12),
            after in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut sent = client_hello("Pass.Example.com", fragment);
            sent.extend_from_slice(&after);
            let mut conn = Chunks(split(&sent, &cuts));
            let mut buf = Vec::new();
            let name = read_client_hello_into(&mut conn, 16 * 1024, &mut buf)
                .now_or_never()
                .expect("ready reads only");
            prop_assert_eq!(name, Ok(Some("pass.example.com".to_string())));
            prop_assert!(sent.starts_with(&buf));
            let mut replay = Replay::new(buf, conn);
            let mut got = Vec::new();
            replay.read_to_end(&mut got).now_or_never().unwrap().unwrap();
            prop_assert_eq!(got, sent);
        }

        /// Bytes that are not a ClientHello (a record header is 5 bytes; or one over the
        /// limit) are kept for the
        /// handshake that refuses them; a client gone before the end is told apart.
        #[test]
        fn invalid_and_truncated_input_keeps_what_was_read(
            junk in proptest::collection::vec(any::<u8>(), 5..64),
            cut in 0usize..4096,
        ) {
            let mut sent = junk.clone();
            sent[0] = b'G';
            let mut buf = Vec::new();
            let r = read_client_hello_into(&mut Chunks(split(&sent, &[])), 16 * 1024, &mut buf)
                .now_or_never()
                .unwrap();
            prop_assert!(matches!(r, Err(HelloError::Invalid(_))));
            prop_assert!(sent.starts_with(&buf) && !buf.is_empty());
            // Over the limit: invalid, with at most the limit read.
            let hello = client_hello("a.test", None);
            let mut buf = Vec::new();
            let r = read_client_hello_into(&mut Chunks(split(&hello, &[cut])), 64, &mut buf)
                .now_or_never()
                .unwrap();
            prop_assert!(matches!(r, Err(HelloError::Invalid(_))));
            prop_assert!(buf.len() <= 64 && hello.starts_with(&buf));
            // Truncated, then EOF: closed.
            let short = &hello[..cut % hello.len()];
            let mut buf = Vec::new();
            let r = read_client_hello_into(&mut Chunks(split(short, &[])), 16 * 1024, &mut buf)
                .now_or_never()
                .unwrap();
            prop_assert!(matches!(r, Err(HelloError::Closed(_))));
            prop_assert_eq!(&buf[..], short);
        }
    }
}
