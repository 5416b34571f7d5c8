//! TCP listeners and connection serving: the accept loop (gated by the backpressure core's
//! connection limit), the TLS handshake with SNI and ALPN, and hyper serving HTTP/1.1 and
//! HTTP/2 (h2 by ALPN on TLS, h2c by prior knowledge on plain TCP) into the shared pipeline.
//!
//! Connections of a listener that expects PROXY protocol headers read one first (bounded by
//! its timeout); layer-4 listeners (TCP, TLS passthrough) hand the connection to [`crate::listen::l4`].
//!
//! hyper runs each HTTP/2 stream through [`StreamExecutor`]: polled once on the connection's
//! own task first (after the connection's poll, see [`Batched`], so one write carries the
//! responses of all the streams of one read), spawned only when it has to wait.
//!
//! With `limits.http2_engine: sweety`, h2 (ALPN) and h2c connections are served by Sweety's
//! own HTTP/2 engine (`sweety_h2`) instead; it batches its writes the same way. On cleartext
//! listeners the first bytes are read (within `header_read_timeout`) to tell h2c by prior
//! knowledge (the client preface) from HTTP/1.1, for either engine; hyper's HTTP/2
//! connections get the idle timeout hyper lacks (see [`serve_http`]).
//!
//! Each listener drains gracefully when stopped: it stops accepting, asks every connection
//! to finish (HTTP/2 GOAWAY, HTTP/1.1 close after the current response) and waits up to the
//! drain timeout; the connections still open then are closed (their tasks aborted).

use crate::ctx::{ConnInfo, Protocol};
use crate::exec::{Batched, StreamExecutor};
use crate::state::{BindKey, ListenerView, Shared};
use crate::static_files::ReadBudget;
use bytes::{Bytes, BytesMut};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A listening TCP socket whose accept loop ([`run_tcp`]) runs in its own task while the
/// reload that starts it keeps the power to close it: [`Listening::close`] drops the socket
/// on the caller's thread before it returns, so its port is free for the next bind at once,
/// whether or not the accept task has run since (its connections, which have sockets of their
/// own, drain when it is told to stop). A socket closed for a config that is then rejected is
/// put back ([`Listening::reopen`]) and the loop accepts on it. The lock is held for one poll
/// of `accept`, a close or a reopen, never across an await.
#[derive(Debug)]
pub struct Listening {
    slot: std::sync::Mutex<Slot>,
}

#[derive(Debug)]
struct Slot {
    socket: Option<TcpListener>,
    /// The accept loop, waiting for a connection or while the socket is closed: woken by a
    /// close (the socket it waits on is gone, and tokio forgets its waker with it) and by a
    /// reopen.
    waiting: Option<std::task::Waker>,
}

impl Listening {
    /// Wraps a bound, listening socket.
    pub fn new(listener: TcpListener) -> Arc<Listening> {
        Arc::new(Listening {
            slot: std::sync::Mutex::new(Slot {
                socket: Some(listener),
                waiting: None,
            }),
        })
    }

    /// Closes the socket now (its port is free when this returns); false if it was closed
    /// already. Connections it accepted are not touched; the accept loop waits (for `stop`,
    /// or a [`Listening::reopen`]).
    pub fn close(&self) -> bool {
        let (taken, waiting) = {
            let mut slot = self.lock();
            (slot.socket.take(), slot.waiting.take())
        };
        if let Some(w) = waiting {
            w.wake();
        }
        taken.is_some()
    }

    /// Puts a socket back after a [`Listening::close`]; the accept loop takes it up.
    pub fn reopen(&self, listener: TcpListener) {
        let mut slot = self.lock();
        slot.socket = Some(listener);
        if let Some(w) = slot.waiting.take() {
            w.wake();
        }
    }

    /// The socket's local address; None while closed.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.lock()
            .socket
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next accepted connection (none while the socket is closed).
    async fn accept(&self) -> std::io::Result<(TcpStream, SocketAddr)> {
        std::future::poll_fn(|cx| {
            let mut slot = self.lock();
            if let Some(Poll::Ready(accepted)) = slot.socket.as_ref().map(|l| l.poll_accept(cx)) {
                return Poll::Ready(accepted);
            }
            // Closed, or no connection yet (under the lock: a close comes after this).
            if !slot
                .waiting
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                slot.waiting = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// Runs the accept loop of one TCP listener until `stop` turns true, then drains.
pub async fn run_tcp(
    shared: Arc<Shared>,
    listener: Arc<Listening>,
    key: BindKey,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let bound = bound_address(&listener);
    // The connection tasks, aborted when the drain timeout has passed (finished ones are
    // taken out as they finish, also while the loop waits: the set holds only live
    // connections, not the futures of every connection since the last accept).
    let mut conns = tokio::task::JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let permit = tokio::select! {
            p = shared.backpressure.connection() => p,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            _ = stop.changed() => break,
        };
        // Finished connections are reaped while accept waits, keeping the permit taken.
        let accepted = loop {
            tokio::select! {
                r = listener.accept() => break Some(r),
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = stop.changed() => break None,
            }
        };
        let (stream, peer) = match accepted {
            None => break,
            Some(Ok(x)) => x,
            Some(Err(e)) => {
                // Out of file descriptors and the like: back off briefly, keep serving.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let snap = shared.snapshot();
        let Some(view) = snap.listener_by_key(&key).cloned() else {
            continue;
        };
        let builder = snap.http.clone();
        let handshake_timeout = snap.config.limits.header_read_timeout.get();
        let idle_timeout = snap.config.limits.idle_timeout.get();
        let send_timeout = snap.config.limits.send_timeout.get();
        let read_ahead = snap.config.limits.static_read_ahead;
        // The per-client cap is judged on the client's address: after a PROXY header.
        let access = (snap.config.limits.max_connections_per_client > 0).then(|| {
            (
                snap.access.clone(),
                snap.config.limits.max_connections_per_client,
            )
        });
        let h2 = (snap.config.limits.http2_engine == sweety_config::Http2Engine::Sweety)
            .then(|| h2_settings(&snap.config.limits));
        let h1 = (snap.config.limits.http1_engine == sweety_config::Http1Engine::Sweety)
            .then(|| h1_settings(&snap.config.limits));
        drop(snap);
        let drain = stop.clone();
        let watcher = graceful.watcher();
        let shared = shared.clone();
        conns.spawn(async move {
            let _permit = permit;
            let mut stream = stream;
            let mut peer = crate::ctx::canonical_addr(peer);
            // The address the client connected to: the PROXY header's destination when one
            // came in (the front proxy's address, forwarded as such to L4 backends).
            let mut dest = None;
            // PROXY protocol header first, when the listener expects one from this peer.
            if let Some(pp) = view
                .proxy_protocol
                .as_ref()
                .filter(|p| p.applies_to(peer.ip()))
            {
                let read = crate::proxy_protocol::read_header(&mut stream);
                match tokio::time::timeout(pp.timeout, read).await {
                    Ok(Ok(Some(a))) => {
                        peer = crate::ctx::canonical_addr(a.source);
                        dest = Some(a.destination);
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "PROXY protocol header refused");
                        shared.metrics.edge_events.inc(&"proxy_protocol_error");
                        return;
                    }
                    Err(_) => {
                        shared.metrics.edge_events.inc(&"proxy_protocol_timeout");
                        return;
                    }
                }
            }
            let per_client = access
                .as_ref()
                .map_or(0, |(a, max)| per_client_cap(a, *max, peer.ip()));
            let _client_slot = match shared.client_conns.try_take(peer.ip(), per_client) {
                Ok(slot) => slot,
                Err(_) => {
                    shared.metrics.limit_hit("client_connections");
                    return;
                }
            };
            if view.l4.is_some() {
                let local = dest.unwrap_or_else(|| local_address(bound, &stream, peer));
                crate::listen::l4::serve_tcp(shared, view, stream, peer, local).await;
                return;
            }
            // An https listener with passthrough hosts: its ClientHello says whether the
            // connection passes through or is served here (the bytes read replayed first).
            // Without them no byte is peeked.
            // The peek is part of the handshake: it and the TLS handshake after it share
            // `handshake_timeout` (a client trickling its hello does not get both clocks).
            let mut first = None;
            let mut handshake_timeout = handshake_timeout;
            if let Some(pt) = view.passthrough.clone() {
                use crate::listen::l4::Peeked;
                let started = tokio::time::Instant::now();
                let peeked = crate::listen::l4::peek_passthrough(
                    &shared,
                    &pt,
                    &mut stream,
                    peer,
                    handshake_timeout,
                )
                .await;
                handshake_timeout = handshake_timeout.saturating_sub(started.elapsed());
                match peeked {
                    Peeked::Pass(route, hello) => {
                        let local = dest.unwrap_or_else(|| local_address(bound, &stream, peer));
                        let route = &pt.routes[route];
                        crate::listen::l4::pass_through(shared, route, stream, hello, peer, local)
                            .await;
                        return;
                    }
                    Peeked::Serve(hello) => first = Some(hello),
                    Peeked::Closed => return,
                }
            }
            let serving = Serving {
                bound,
                builder,
                handshake_timeout,
                idle_timeout,
                send_timeout,
                read_ahead,
                watcher,
                h2,
                h1,
                drain,
            };
            serve_conn(shared, view, serving, stream, peer, first).await;
        });
    }
    // The reload closed it when it sent `stop`; closed here too should it not have.
    listener.close();
    drop(listener);
    let drain = shared.snapshot().config.limits.drain_timeout.get();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(addr = %key.0, "drain timeout: closing remaining connections");
        conns.abort_all();
    }
}

/// The address of every connection `listener` accepts, when it is bound to one address (not
/// a wildcard): a TCP socket accepted on such a listener has exactly the listener's address
/// and port, so a connection's own address need not be asked for (a getsockname(2) per
/// connection, one of the ~12 system calls of a connection carrying one request;
/// e2e/bench/HISTORY.md, session 21). None for a wildcard listener, whose connections each
/// have the address the client reached.
fn bound_address(listener: &Listening) -> Option<SocketAddr> {
    listener.local_addr().filter(|a| !a.ip().is_unspecified())
}

/// A connection's own address: its listener's (`bound`, see [`bound_address`]), else asked
/// of the socket (else the peer's, as before).
fn local_address(bound: Option<SocketAddr>, stream: &TcpStream, peer: SocketAddr) -> SocketAddr {
    bound.unwrap_or_else(|| stream.local_addr().unwrap_or(peer))
}

/// How one accepted connection is to be served.
struct Serving {
    /// The listener's address when it is bound to one (see [`bound_address`]).
    bound: Option<SocketAddr>,
    builder: hyper_util::server::conn::auto::Builder<StreamExecutor>,
    handshake_timeout: Duration,
    /// Closes hyper's HTTP/2 connections without requests for this long.
    idle_timeout: Duration,
    /// `limits.send_timeout` (see `crate::send_timeout`).
    send_timeout: Duration,
    /// `limits.static_read_ahead`: the connection's file read-ahead budget.
    read_ahead: u32,
    /// Held while the connection is served: the listener's drain waits for it.
    watcher: Watcher,
    /// Sweety's HTTP/2 engine and its settings, when `limits.http2_engine` is `sweety`.
    h2: Option<sweety_h2::Settings>,
    /// Sweety's HTTP/1.1 engine and its settings, when `limits.http1_engine` is `sweety`.
    h1: Option<sweety_h1::server::Settings>,
    /// Turns true when the listener drains (GOAWAY for Sweety's HTTP/2 engine).
    drain: watch::Receiver<bool>,
}

/// Serves one HTTP(S) connection. `first`: bytes already read from it (the ClientHello an
/// `https` listener with passthrough hosts peeked), handed to the TLS handshake first.
async fn serve_conn(
    shared: Arc<Shared>,
    view: Arc<ListenerView>,
    serving: Serving,
    stream: TcpStream,
    peer: SocketAddr,
    first: Option<Vec<u8>>,
) {
    let _ = stream.set_nodelay(true);
    let local = local_address(serving.bound, &stream, peer);
    let stream = crate::send_timeout::SendProgress::new(stream, serving.send_timeout);
    if view.tls.is_some() {
        match first {
            None => serve_tls(shared, view, serving, stream, peer, local).await,
            Some(first) => {
                let stream = crate::listen::l4::Replay::new(first, stream);
                serve_tls(shared, view, serving, stream, peer, local).await
            }
        }
        return;
    }
    let Serving {
        bound: _,
        builder,
        handshake_timeout,
        idle_timeout,
        send_timeout: _,
        read_ahead,
        watcher,
        h2,
        h1,
        drain,
    } = serving;
    if first.is_some() {
        // Peeked only on https listeners, which always have a TLS config: never here.
        return;
    }
    let mut stream = stream;
    let conn = Arc::new(ConnInfo {
        listener: view.name.clone(),
        peer,
        local,
        tls: false,
        sni: None,
        client_cert: None,
        client_cert_verdict: Default::default(),
        forwarding: Default::default(),
        tls_version: None,
        tls_cipher: None,
        read_budget: Some(ReadBudget::new(read_ahead, shared.read_ahead_total.clone())),
    });
    // h2c by prior knowledge or HTTP/1.1: told by the first bytes, read within the
    // header-read timeout (a client that sends nothing, or a part of the preface, is
    // closed then, whichever engine serves HTTP/2).
    let (is_h2, first) =
        match tokio::time::timeout(handshake_timeout, read_preface(&mut stream)).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return,
            Err(_) => {
                shared.metrics.limit_hit("header_read_timeout");
                return;
            }
        };
    match (is_h2, h2) {
        (true, Some(settings)) => {
            serve_h2(shared, conn, stream, first, settings, drain, watcher).await;
        }
        (true, None) => {
            let io = TokioIo::new(Prefixed::new(first.freeze(), stream));
            let idle = Some((idle_timeout, drain));
            serve_http(shared, conn, builder.http2_only(), io, watcher, idle).await;
        }
        (false, _) => match h1 {
            Some(settings) => serve_h1(shared, conn, stream, first, settings, drain, watcher).await,
            None => {
                let io = TokioIo::new(Prefixed::new(first.freeze(), stream));
                serve_http(shared, conn, builder, io, watcher, None).await;
            }
        },
    }
}

/// Serves one connection of an `https` listener: the TLS handshake (within the handshake
/// timeout), then HTTP/1.1 or HTTP/2 by ALPN. `stream` is the connection, or the connection
/// behind the ClientHello bytes peeked for passthrough.
async fn serve_tls<S>(
    shared: Arc<Shared>,
    view: Arc<ListenerView>,
    serving: Serving,
    stream: S,
    peer: SocketAddr,
    local: SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Serving {
        bound: _,
        mut builder,
        handshake_timeout,
        idle_timeout,
        send_timeout: _,
        read_ahead,
        watcher,
        h2,
        h1,
        drain,
    } = serving;
    let Some(cfg) = view.tls.as_ref() else {
        return;
    };
    let tls = match tokio::time::timeout(
        handshake_timeout,
        tls_accept(cfg, view.host_auth.as_deref(), stream),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            shared
                .metrics
                .tls_handshake_errors
                .inc(&(view.name.clone(), "tcp", "error"));
            return;
        }
        Err(_) => {
            shared.metrics.limit_hit("tls_handshake_timeout");
            shared
                .metrics
                .tls_handshake_errors
                .inc(&(view.name.clone(), "tcp", "timeout"));
            return;
        }
    };
    let (_, session) = tls.get_ref();
    // Named once: the metric's `version` label and the log's `tls_version`.
    let tls_version = match session.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => Some("TLSv1.3"),
        Some(rustls::ProtocolVersion::TLSv1_2) => Some("TLSv1.2"),
        _ => None,
    };
    shared
        .metrics
        .tls_handshakes
        .inc(&(view.name.clone(), "tcp", tls_version.unwrap_or("other")));
    let sni = session
        .server_name()
        .map(|s| Arc::<str>::from(s.to_ascii_lowercase()));
    let alpn_h2 = session.alpn_protocol() == Some(b"h2");
    let alpn_http1 = session.alpn_protocol() == Some(b"http/1.1");
    match session.alpn_protocol() {
        Some(b"h2") => builder = builder.http2_only(),
        Some(b"http/1.1") => builder = builder.http1_only(),
        _ => {}
    }
    let client_cert = session
        .peer_certificates()
        .map(|c| c.iter().map(|d| d.clone().into_owned()).collect());
    let conn = Arc::new(ConnInfo {
        listener: view.name.clone(),
        peer,
        local,
        tls: true,
        sni,
        client_cert,
        client_cert_verdict: Default::default(),
        forwarding: Default::default(),
        tls_version,
        tls_cipher: session
            .negotiated_cipher_suite()
            .and_then(|c| c.suite().as_str()),
        read_budget: Some(ReadBudget::new(read_ahead, shared.read_ahead_total.clone())),
    });
    if let (true, Some(settings)) = (alpn_h2, &h2) {
        serve_h2(
            shared,
            conn,
            tls,
            BytesMut::new(),
            settings.clone(),
            drain,
            watcher,
        )
        .await;
        return;
    }
    if let (false, Some(settings)) = (alpn_h2, h1) {
        let mut tls = tls;
        let first = if alpn_http1 {
            BytesMut::new()
        } else {
            // No ALPN: HTTP/2 by prior knowledge or HTTP/1.1, told by the first bytes (as on
            // cleartext listeners).
            match tokio::time::timeout(handshake_timeout, read_preface(&mut tls)).await {
                Ok(Ok((false, first))) => first,
                Ok(Ok((true, first))) => {
                    match h2 {
                        Some(h2) => serve_h2(shared, conn, tls, first, h2, drain, watcher).await,
                        None => {
                            let io = TokioIo::new(Prefixed::new(first.freeze(), tls));
                            let idle = Some((idle_timeout, drain));
                            serve_http(shared, conn, builder.http2_only(), io, watcher, idle).await;
                        }
                    }
                    return;
                }
                Ok(Err(_)) => return,
                Err(_) => {
                    shared.metrics.limit_hit("header_read_timeout");
                    return;
                }
            }
        };
        serve_h1(shared, conn, tls, first, settings, drain, watcher).await;
        return;
    }
    let idle = alpn_h2.then_some((idle_timeout, drain));
    serve_http(shared, conn, builder, TokioIo::new(tls), watcher, idle).await;
}

/// The TLS handshake of a connection: with the listener's config, or, when the listener has
/// `host_client_auth`, with the config of the entry the ClientHello's SNI falls under (it asks
/// for a client certificate; see `crate::client_cert`), read before the handshake goes on.
async fn tls_accept<S>(
    cfg: &Arc<rustls::ServerConfig>,
    host_auth: Option<&crate::client_cert::HostAuth>,
    stream: S,
) -> std::io::Result<tokio_rustls::server::TlsStream<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Some(host_auth) = host_auth else {
        return tokio_rustls::TlsAcceptor::from(cfg.clone())
            .accept(stream)
            .await;
    };
    let start =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
    let chosen = host_auth
        .handshake_config(start.client_hello().server_name())
        .unwrap_or(cfg)
        .clone();
    start.into_stream(chosen).await
}

/// Reads the first bytes of a cleartext connection until they are the HTTP/2 client preface
/// (true) or differ from it (false: HTTP/1.1, decided at the first byte that differs). Every
/// byte read is returned, for the server that takes the connection. Each read waits for the
/// socket to be readable (a client that sends part of the preface and stalls costs nothing
/// until the caller's timeout).
async fn read_preface<R>(io: &mut R) -> std::io::Result<(bool, BytesMut)>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let preface = sweety_h2::frame::PREFACE;
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        if io.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let n = buf.len().min(preface.len());
        if buf[..n] != preface[..n] {
            return Ok((false, buf));
        }
        if n == preface.len() {
            return Ok((true, buf));
        }
    }
}

/// A connection whose first bytes were already read (by [`read_preface`]): reads them
/// again first, then the connection.
struct Prefixed<I> {
    first: Bytes,
    io: I,
}

impl<I> Prefixed<I> {
    fn new(first: Bytes, io: I) -> Prefixed<I> {
        Prefixed { first, io }
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.first.is_empty() {
            let n = self.first.len().min(buf.remaining());
            buf.put_slice(&self.first.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The requests of one hyper HTTP/2 connection still open (response not finished), and
/// when the last one ended: its idle timeout.
struct Activity {
    open: AtomicUsize,
    last_end: std::sync::Mutex<Instant>,
}

impl Activity {
    fn start(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenRequest(self.clone())
    }

    /// When the connection has been without requests for `idle`: None while one is open.
    fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.last_end.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One open request of an [`Activity`]; ends when dropped (with its response body).
struct OpenRequest(Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        *self.0.last_end.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds its request open until it is finished or dropped.
struct Tracked {
    body: crate::body::Body,
    _open: OpenRequest,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves one HTTP/2 connection with Sweety's own engine (`limits.http2_engine: sweety`):
/// `first` holds the bytes already read from `io` (the client preface, perhaps more; empty
/// when none). `watcher` is held until the connection ends, so the listener's drain waits.
async fn serve_h2<I>(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    io: I,
    first: BytesMut,
    settings: sweety_h2::Settings,
    drain: watch::Receiver<bool>,
    watcher: Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let r = sweety_h2::serve_read(
        io,
        first,
        crate::pipeline::H2Pipeline::new(shared, conn),
        settings,
        drain,
    )
    .await;
    drop(watcher);
    if let Err(e) = r {
        tracing::debug!(error = %e, "HTTP/2 connection ended with an error");
    }
}

/// Serves one HTTP/1.1 connection with Sweety's own engine (`limits.http1_engine: sweety`):
/// `first` holds the bytes already read from `io`. `watcher` is held until the connection
/// ends, so the listener's drain waits; `drain` turning true closes it after the current
/// response (at once when idle).
async fn serve_h1<I>(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    io: I,
    first: BytesMut,
    settings: sweety_h1::server::Settings,
    drain: watch::Receiver<bool>,
    watcher: Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = crate::pipeline::H1Pipeline::new(shared, conn);
    // Not `Batched`: nothing under this engine hands futures to `StreamExecutor` (requests run
    // on the connection's task, backend connections on their own), so there is nothing to
    // batch, and its collection set-up would run at every poll.
    let r = sweety_h1::server::serve(io, first, service, settings, drain).await;
    drop(watcher);
    if let Err(e) = r {
        tracing::debug!(error = %e, "HTTP/1.1 connection ended with an error");
    }
}

/// Serves a connection with hyper (HTTP/1.1, or HTTP/2 when the builder is set so). `idle`,
/// for HTTP/2: the idle timeout and the listener's drain signal; hyper has no idle timeout of
/// its own (its keep-alive PINGs keep a silent connection open as long as the client answers
/// them), so the connection gets a graceful shutdown (GOAWAY) once it has had no open
/// request for the idle timeout (checked every idle timeout: closed between one and two
/// idle timeouts after its last response), or when the listener drains.
async fn serve_http<I>(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    builder: hyper_util::server::conn::auto::Builder<StreamExecutor>,
    io: TokioIo<I>,
    watcher: Watcher,
    idle: Option<(Duration, watch::Receiver<bool>)>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = idle.is_some().then(|| {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            last_end: std::sync::Mutex::new(Instant::now()),
        })
    });
    let tracked = activity.clone();
    let metrics = shared.clone();
    // HTTP/1.1 framing hyper does not report (both Content-Length and Transfer-Encoding).
    let wire = super::h1_wire::Wire::new();
    let io = TokioIo::new(super::h1_wire::Observed::new(io.into_inner(), wire.clone()));
    let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        let shared = shared.clone();
        let conn = conn.clone();
        let open = tracked.as_ref().map(|a| a.start());
        let protocol = if req.version() == http::Version::HTTP_2 {
            Protocol::Http2
        } else {
            Protocol::Http1
        };
        if protocol == Protocol::Http1 && wire.next_request() {
            req.extensions_mut()
                .insert(crate::identity::ConflictingFraming);
        }
        let number = wire.served();
        let wire = wire.clone();
        let connect = req.method() == http::Method::CONNECT;
        async move {
            let mut resp =
                crate::pipeline::handle(shared, conn, protocol, req.map(crate::body::boxed)).await;
            // Framing of later heads can no longer be checked: end the connection after this
            // response unless it hands the connection over.
            if protocol == Protocol::Http1
                && wire.untracked(number)
                && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS
                && !(connect && resp.status().is_success())
            {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, Infallible>(match open {
                Some(open) => resp.map(|body| crate::body::boxed(Tracked { body, _open: open })),
                None => resp,
            })
        }
    });
    // With upgrades: WebSocket (HTTP/1.1 Upgrade and HTTP/2 extended CONNECT) is tunnelled.
    let connection = builder
        .serve_connection_with_upgrades(io, service)
        .into_owned();
    let (Some((idle, mut drain)), Some(activity)) = (idle, activity) else {
        if let Err(e) = Batched::new(watcher.watch(connection)).await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        return;
    };
    let mut connection = Box::pin(connection);
    let mut stop = Box::pin(async move {
        let _ = drain.wait_for(|v| *v).await;
    });
    let mut timer = Box::pin(tokio::time::sleep(idle));
    let mut shutting = false;
    let served = std::future::poll_fn(move |cx| {
        if !shutting && stop.as_mut().poll(cx).is_ready() {
            shutting = true;
            connection.as_mut().graceful_shutdown();
        }
        if !shutting && timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match activity.idle_since() {
                Some(since) if now >= since + idle => {
                    metrics.metrics.limit_hit("idle_timeout");
                    shutting = true;
                    connection.as_mut().graceful_shutdown();
                }
                since => {
                    let next = since.map_or(now + idle, |s| s + idle);
                    timer.as_mut().reset(next.into());
                    // Registers the waker for the new deadline (in the future: pending).
                    let _ = timer.as_mut().poll(cx);
                }
            }
        }
        connection.as_mut().poll(cx)
    });
    let r = Batched::new(served).await;
    drop(watcher);
    if let Err(e) = r {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// `limits.max_connections_per_client` for a connection from `peer` (the client's address,
/// after any PROXY header); 0 (not capped) for a trusted proxy, which carries many clients.
pub fn per_client_cap(access: &crate::access::AccessRules, max: u32, peer: IpAddr) -> u32 {
    if max == 0 || access.client_ip.is_trusted(peer) {
        0
    } else {
        max
    }
}

/// The HTTP/1.1 engine's connection settings from the config's limits.
pub fn h1_settings(l: &sweety_config::Limits) -> sweety_h1::server::Settings {
    sweety_h1::server::Settings {
        max_head_bytes: l.max_header_bytes as usize,
        max_fields: sweety_h1::server::DEFAULT_MAX_FIELDS,
        header_read_timeout: l.header_read_timeout.get(),
        chunked: sweety_h1::chunked::Limits::default(),
    }
}

/// The HTTP/2 engine's connection settings from the config's limits.
pub fn h2_settings(l: &sweety_config::Limits) -> sweety_h2::Settings {
    sweety_h2::Settings {
        max_concurrent_streams: l.max_concurrent_streams,
        max_header_bytes: l.max_header_bytes,
        header_read_timeout: l.header_read_timeout.get(),
        idle_timeout: l.idle_timeout.get(),
        max_resets_per_sec: l.max_pending_reset_streams,
        stream_window: 256 * 1024,
        conn_window: 1024 * 1024,
        send_timeout: l.send_timeout.get(),
        write_buffer: l.http2_write_buffer as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::DEFERRED;
    use crate::listen::WakeCount as Count;
    use hyper::rt::Executor;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::task::Waker;
    use sweety_h2::first_poll::INLINE_FIRST_POLLS;

    /// An accept loop waiting for a connection when the socket is closed and put back in one
    /// step (a config rejected after closing it for its own bind; the loop does not run in
    /// between) accepts on the socket put back: the close wakes it, tokio having forgotten
    /// its waker with the socket.
    #[tokio::test]
    async fn an_accept_waiting_across_a_close_and_a_reopen_accepts_on_the_new_socket() {
        let l = Listening::new(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = l.local_addr().unwrap();
        let accepting = {
            let l = l.clone();
            tokio::spawn(async move { l.accept().await.map(|(_, peer)| peer) })
        };
        // The accept loop waits on the socket.
        tokio::task::yield_now().await;
        assert!(l.close());
        l.reopen(TcpListener::bind(addr).await.unwrap());
        let c = TcpStream::connect(addr).await.unwrap();
        let peer = tokio::time::timeout(Duration::from_secs(5), accepting)
            .await
            .expect("accepted within 5 s")
            .unwrap()
            .unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
    }

    /// The premise of `bound_address`: a connection accepted on a listener bound to one
    /// address has the listener's address and port (what getsockname says), for IPv4 and
    /// IPv6; a wildcard listener has none, so its connections are asked.
    #[tokio::test]
    async fn a_bound_listeners_connections_have_its_address() {
        for addr in ["127.0.0.1:0", "[::1]:0", "127.0.0.2:0"] {
            let Ok(l) = TcpListener::bind(addr).await else {
                continue; // no IPv6 loopback (or no 127.0.0.2) here
            };
            let l = Listening::new(l);
            let bound = bound_address(&l).expect("bound to one address");
            assert_eq!(bound, l.local_addr().unwrap());
            for _ in 0..3 {
                let c = TcpStream::connect(bound).await.unwrap();
                let (s, peer) = l.accept().await.unwrap();
                assert_eq!(s.local_addr().unwrap(), bound);
                assert_eq!(c.peer_addr().unwrap(), bound);
                assert_eq!(local_address(Some(bound), &s, peer), bound);
                assert_eq!(local_address(None, &s, peer), bound);
            }
        }
        let any = Listening::new(TcpListener::bind("0.0.0.0:0").await.unwrap());
        assert_eq!(bound_address(&any), None);
        let port = any.local_addr().unwrap().port();
        let c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (s, peer) = any.accept().await.unwrap();
        assert_eq!(
            local_address(bound_address(&any), &s, peer),
            c.peer_addr().unwrap()
        );
    }

    #[tokio::test]
    async fn a_partial_preface_is_waited_for_without_polling() {
        use tokio::io::AsyncWriteExt;
        let preface = sweety_h2::frame::PREFACE;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        c.write_all(&preface[..10]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = Box::pin(read_preface(&mut s));
        // The 10 bytes are read, then it waits for the socket: nothing wakes it meanwhile.
        for _ in 0..5 {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(count.0.load(SeqCst), 0, "woken with nothing to read");
        // The rest arrives: it is woken and decides, with every byte read kept.
        c.write_all(&preface[10..]).await.unwrap();
        c.write_all(b"more").await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("decided")
        .unwrap();
        assert!(count.0.load(SeqCst) > 0, "woken by the socket");
        assert!(got.0, "the HTTP/2 preface");
        assert!(got.1.starts_with(preface));

        // Not the preface: decided at the first byte that differs, the bytes kept.
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        c.write_all(b"PUT / HTTP/1.1\r\n").await.unwrap();
        let (h2, first) = tokio::time::timeout(Duration::from_secs(10), read_preface(&mut s))
            .await
            .unwrap()
            .unwrap();
        assert!(!h2);
        assert!(first.starts_with(b"PU"));
        // And they are read again first.
        let mut io = Prefixed::new(first.freeze(), s);
        let mut line = [0u8; 16];
        tokio::io::AsyncReadExt::read_exact(&mut io, &mut line)
            .await
            .unwrap();
        assert_eq!(&line, b"PUT / HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn ready_tasks_run_inline_and_waiting_ones_are_spawned() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        StreamExecutor.execute(async move {
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 1, "a ready task finishes inside execute");

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let d = done.clone();
        StreamExecutor.execute(async move {
            let _ = rx.await;
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 1, "a waiting task is not finished yet");
        tx.send(()).unwrap();
        // The spawned task registered its real waker on its first poll and completes.
        tokio::time::timeout(Duration::from_secs(10), async {
            while done.load(SeqCst) != 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the spawned task completes");

        // A panic in the first poll ends that task only; later tasks still run inline.
        StreamExecutor.execute(async {
            panic!("boom");
        });
        let d = done.clone();
        StreamExecutor.execute(async move {
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 3, "execute runs inline after a panic");
    }

    #[tokio::test]
    async fn a_panicking_connection_poll_loses_no_stream_and_stops_deferring() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let conn = std::future::poll_fn(move |_| -> Poll<()> {
            let d = d.clone();
            StreamExecutor.execute(async move {
                d.fetch_add(1, SeqCst);
            });
            panic!("the request pipeline panicked inside the connection poll");
        });
        let mut batched = std::pin::pin!(Batched::new(conn));
        let mut cx = Context::from_waker(Waker::noop());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = batched.as_mut().poll(&mut cx);
        }));
        assert!(unwound.is_err());
        assert!(
            DEFERRED.with(|d| d.borrow().is_none()),
            "the thread is no longer collecting"
        );
        // The stream queued before the panic was spawned, not dropped.
        tokio::time::timeout(Duration::from_secs(10), async {
            while done.load(SeqCst) != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the collected stream runs");
    }

    #[tokio::test]
    async fn first_polls_inline_are_capped_per_connection_poll() {
        let inline = Arc::new(AtomicUsize::new(0));
        let i = inline.clone();
        let mut polls = 0;
        let conn = std::future::poll_fn(move |_| {
            polls += 1;
            if polls > 1 {
                return Poll::Ready(());
            }
            for _ in 0..INLINE_FIRST_POLLS + 10 {
                let i = i.clone();
                // Counts only when its first poll runs before the connection is polled again.
                StreamExecutor.execute(async move {
                    i.fetch_add(1, SeqCst);
                });
            }
            Poll::Pending
        });
        tokio::time::timeout(Duration::from_secs(10), Batched::new(conn))
            .await
            .expect("the connection finishes");
        assert_eq!(
            inline.load(SeqCst),
            INLINE_FIRST_POLLS,
            "the rest are spawned"
        );
        tokio::time::timeout(Duration::from_secs(10), async {
            while inline.load(SeqCst) != INLINE_FIRST_POLLS + 10 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the spawned streams run");
    }

    #[tokio::test]
    async fn batched_connections_answer_their_streams_then_poll_again() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = log.clone();
        let mut polls = 0;
        let conn = std::future::poll_fn(move |_| {
            polls += 1;
            l.lock().unwrap().push(format!("conn {polls}"));
            if polls > 1 {
                return Poll::Ready(());
            }
            for name in ["a", "b"] {
                let l = l.clone();
                StreamExecutor.execute(async move {
                    l.lock().unwrap().push(format!("stream {name}"));
                });
            }
            l.lock().unwrap().push("conn 1 returns".into());
            Poll::Pending
        });
        tokio::time::timeout(Duration::from_secs(10), Batched::new(conn))
            .await
            .expect("the connection is polled again at once and finishes");
        assert_eq!(
            *log.lock().unwrap(),
            ["conn 1", "conn 1 returns", "stream a", "stream b", "conn 2"]
        );
        // Outside a batched connection, tasks run at once again.
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        StreamExecutor.execute(async move {
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 1);
    }
}
