//! HTTP/3 over QUIC: the thin adapter between quinn + h3 and the one request pipeline.
//!
//! Everything protocol-independent (routing, filters, handlers, the backpressure core,
//! metrics and the access log) lives in [`crate::pipeline::handle`]; this module only:
//!
//! * binds UDP next to an HTTPS listener's TCP port and runs a quinn endpoint on it, whose
//!   rustls config shares the listener's SNI resolver (ALPN `h3`, TLS 1.3);
//! * takes a connection slot from the backpressure core for every QUIC connection (refusing
//!   the attempt when none is free), bounds concurrent request streams and flow-control
//!   windows per connection, and times out idle connections;
//! * gives each connection with a response in flight its share of `http3.send_budget` as
//!   quinn's send window ([`crate::quic_budget`]), so what quinn buffers for all connections
//!   together stays bounded, and counts every connection's sent-packet state in one total
//!   whose budget is also `http3.send_budget` (the same module);
//! * turns each request stream into an `http::Request<Body>` whose body streams from the QUIC
//!   stream, calls the pipeline with [`Protocol::Http3`], and streams the response back,
//!   awaiting every frame so QUIC flow control paces the handler (a static file is read
//!   chunk by chunk as the client acknowledges it, never buffered whole);
//! * marks requests received in 0-RTT early data (only possible when `http3.early_data` is
//!   on) so the pipeline answers unsafe methods 425 Too Early;
//! * drains on stop: GOAWAY on every connection, in-flight requests get the drain timeout.
//!
//! Every endpoint bound on one address shares its stateless-reset key and connection-ID
//! scheme with the endpoints bound there before and after it ([`crate::listen::quic_keys`]).
//!
//! quinn-udp uses UDP GSO (segmentation offload) and GRO where the kernel supports them; the
//! first endpoint logs what it found (info level). Static files are read in
//! `http3.static_chunk_size` chunks for HTTP/3 (a [`ReadChunk`] request extension), so a
//! stream waiting for the send window holds one small chunk, not 128 KiB; like HTTP/1.1's and
//! HTTP/2's, they are read from the page cache on the runtime thread first.

use crate::body::{Body, BoxError};
use crate::ctx::{ConnInfo, EarlyData, Protocol};
use crate::limits::ConnPermit;
use crate::listen::quic_socket::QuicSocket;
use crate::quic_budget::ConnShare;
use crate::state::{BindKey, ListenerView, Shared};
use crate::static_files::ReadChunk;
use bytes::{Buf, Bytes};
use h3::server::RequestStream;
use http::{header, Request, Response};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use quinn_proto::SentStateTotal;
use std::future::Future as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use sweety_config::{Congestion, Http3, Limits};
use tokio::sync::watch;

type QuicConn = h3_quinn::Connection;
type H3Conn = h3::server::Connection<QuicConn, Bytes>;
type Resolver = h3::server::RequestResolver<QuicConn, Bytes>;
type SendHalf = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvHalf = RequestStream<h3_quinn::RecvStream, Bytes>;
type Share = Arc<ConnShare<quinn::Connection>>;

/// The HTTP/3 application error code for a clean close.
const H3_NO_ERROR: quinn::VarInt = quinn::VarInt::from_u32(0x100);
/// H3_EXCESSIVE_LOAD (RFC 9114 §8.1): a connection over `limits.max_connections_per_client`.
const H3_EXCESSIVE_LOAD: quinn::VarInt = quinn::VarInt::from_u32(0x107);

/// The `Alt-Svc` value advertising HTTP/3 on `port`.
pub fn alt_svc(port: u16, max_age: Duration) -> http::HeaderValue {
    http::HeaderValue::from_str(&format!("h3=\":{port}\"; ma={}", max_age.as_secs()))
        .expect("Alt-Svc value is ASCII")
}

/// QUIC transport settings from the config.
pub fn transport_config(h3: &Http3, limits: &Limits) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(h3.max_concurrent_bidi_streams.into())
        // The peer's control and QPACK streams; HTTP/3 needs three.
        .max_concurrent_uni_streams(8u32.into())
        .stream_receive_window(h3.stream_receive_window.into())
        .receive_window(h3.connection_receive_window.into())
        .send_window(h3.send_window.into())
        .max_idle_timeout(limits.idle_timeout.get().try_into().ok())
        .initial_mtu(h3.initial_mtu)
        .send_fairness(h3.send_fairness);
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(h3.mtu_discovery_upper_bound.max(h3.initial_mtu));
    t.mtu_discovery_config(Some(mtu));
    if h3.ack_eliciting_threshold > 1 {
        let mut ack = quinn::AckFrequencyConfig::default();
        ack.ack_eliciting_threshold(h3.ack_eliciting_threshold.into());
        t.ack_frequency_config(Some(ack));
    }
    match h3.congestion {
        Congestion::Cubic => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::CubicConfig::default()))
        }
        Congestion::Bbr => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()))
        }
        Congestion::NewReno => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::NewRenoConfig::default()))
        }
    };
    t
}

/// The quinn server config of a listener: its QUIC rustls config plus the transport settings,
/// its connections counting their sent-packet state in `sent_state` (the process's one,
/// [`crate::quic_budget`]). `path` is the config path of the listener's `tls` section, for
/// errors.
pub fn server_config(
    tls: Arc<rustls::ServerConfig>,
    h3: &Http3,
    limits: &Limits,
    path: &str,
    sent_state: &Arc<SentStateTotal>,
) -> Result<quinn::ServerConfig, String> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| format!("{path}: cannot serve QUIC: {e}"))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = transport_config(h3, limits);
    transport.sent_state_total(Some(sent_state.clone()));
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}

/// Binds a UDP socket for QUIC on `addr` (IPv6 sockets are v6-only, as for TCP).
pub fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    // Larger buffers absorb bursts; the kernel caps them at net.core.*mem_max.
    let _ = sock.set_recv_buffer_size(2 * 1024 * 1024);
    let _ = sock.set_send_buffer_size(2 * 1024 * 1024);
    sock.bind(&addr.into())?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// Starts a quinn endpoint on a bound UDP socket; with the handle that closes the socket
/// ([`QuicSocket::close`]). Its reset key and connection IDs are those of every endpoint of
/// the process bound on the socket's address ([`crate::listen::quic_keys`]): a later endpoint
/// there resets the connections this one leaves behind when the reload closes its socket.
pub fn endpoint(
    sock: std::net::UdpSocket,
    config: quinn::ServerConfig,
) -> std::io::Result<(quinn::Endpoint, Arc<QuicSocket>)> {
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("no async runtime for quinn"))?;
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| match quinn::udp::UdpSocketState::new((&sock).into()) {
        Ok(state) => tracing::info!(
            gso_segments = state.max_gso_segments(),
            gro_segments = state.gro_segments(),
            "QUIC UDP offload (1 = not available)"
        ),
        Err(e) => tracing::info!(error = %e, "QUIC UDP offload unknown"),
    });
    let endpoint_config = crate::listen::quic_keys::endpoint_config(sock.local_addr()?)?;
    let socket = QuicSocket::new(sock)?;
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        endpoint_config,
        Some(config),
        socket.clone(),
        runtime,
    )?;
    Ok((endpoint, socket))
}

/// Runs the accept loop of one QUIC endpoint until `stop` turns true, then drains: GOAWAY on
/// every connection, up to the drain timeout for in-flight requests, then close, and its
/// `socket` with it (unless the reload closed it before, for a new listener on its port).
pub async fn run_quic(
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    socket: Arc<QuicSocket>,
    key: BindKey,
    mut stop: watch::Receiver<bool>,
) {
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
            _ = stop.changed() => break,
        };
        while conns.try_join_next().is_some() {}
        let Some(permit) = shared.backpressure.try_connection() else {
            incoming.refuse();
            continue;
        };
        let snap = shared.snapshot();
        let Some(view) = snap.listener_by_key(&key).cloned() else {
            incoming.refuse();
            continue;
        };
        shared
            .quic_send_budget
            .set_total(snap.config.http3.send_budget);
        shared
            .quic_sent_state
            .set_budget(snap.config.http3.send_budget);
        let settings = ConnSettings {
            send_window: snap.config.http3.send_window.into(),
            early_data: snap.config.http3.early_data,
            handshake_timeout: snap.config.limits.header_read_timeout.get(),
            max_header_bytes: snap.config.limits.max_header_bytes.into(),
            static_chunk: snap.config.http3.static_chunk_size as usize,
            read_ahead: snap.config.limits.static_read_ahead,
            send_timeout: snap.config.limits.send_timeout.get(),
            max_per_client: crate::listen::tcp::per_client_cap(
                &snap.access,
                snap.config.limits.max_connections_per_client,
                peer_of(&incoming).ip(),
            ),
        };
        drop(snap);
        conns.spawn(serve_conn(
            shared.clone(),
            view,
            incoming,
            settings,
            permit,
            drain_rx.clone(),
        ));
    }
    let _ = drain_tx.send(true);
    let drain = shared.snapshot().config.limits.drain_timeout.get();
    let all = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(drain, all).await.is_err() {
        tracing::warn!(addr = %key.0, "drain timeout: closing remaining QUIC connections");
        conns.abort_all();
    }
    endpoint.close(0u32.into(), b"shutdown");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    socket.close();
}

#[derive(Clone, Copy)]
struct ConnSettings {
    /// `http3.send_window`: the most of the send budget this connection may get.
    send_window: u64,
    early_data: bool,
    handshake_timeout: Duration,
    max_header_bytes: u64,
    static_chunk: usize,
    /// `limits.static_read_ahead`: the connection's file read-ahead budget.
    read_ahead: u32,
    /// `limits.send_timeout`: a response write the client does not accept within it resets
    /// the stream.
    send_timeout: Duration,
    /// `limits.max_connections_per_client` for this peer (0: not capped).
    max_per_client: u32,
}

fn peer_of(incoming: &quinn::Incoming) -> SocketAddr {
    crate::ctx::canonical_addr(incoming.remote_address())
}

/// Whether the handshake of a connection that accepted 0-RTT has completed. Requests that
/// arrive before it are early data.
struct Handshake {
    done: AtomicBool,
    pending: Mutex<Option<quinn::ZeroRttAccepted>>,
}

impl Handshake {
    fn complete() -> Handshake {
        Handshake {
            done: AtomicBool::new(true),
            pending: Mutex::new(None),
        }
    }

    /// True while the handshake is still in progress. quinn resolves the future in the same
    /// step that processes the client's Finished, before it surfaces any 1-RTT stream, so a
    /// request seen here while it is unresolved really did arrive in early data.
    fn in_early_data(&self) -> bool {
        if self.done.load(Ordering::Acquire) {
            return false;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let finished = match pending.as_mut() {
            None => true,
            Some(f) => {
                let waker = futures_util::task::noop_waker();
                let mut cx = Context::from_waker(&waker);
                Pin::new(f).poll(&mut cx).is_ready()
            }
        };
        if finished {
            *pending = None;
            self.done.store(true, Ordering::Release);
        }
        !finished
    }
}

async fn serve_conn(
    shared: Arc<Shared>,
    view: Arc<ListenerView>,
    incoming: quinn::Incoming,
    settings: ConnSettings,
    permit: ConnPermit,
    mut drain: watch::Receiver<bool>,
) {
    let _permit = permit;
    let peer = peer_of(&incoming);
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "QUIC connection attempt failed");
            return;
        }
    };
    let (conn, handshake) = if settings.early_data {
        match connecting.into_0rtt() {
            Ok((conn, accepted)) => (
                {
                    // 0.5-RTT: keys for early data are there; counted as a handshake now.
                    shared
                        .metrics
                        .tls_handshakes
                        .inc(&(view.name.clone(), "quic", "TLSv1.3"));
                    conn
                },
                Handshake {
                    done: AtomicBool::new(false),
                    pending: Mutex::new(Some(accepted)),
                },
            ),
            Err(connecting) => match handshake(&shared, &view.name, connecting, &settings).await {
                Some(c) => (c, Handshake::complete()),
                None => return,
            },
        }
    } else {
        match handshake(&shared, &view.name, connecting, &settings).await {
            Some(c) => (c, Handshake::complete()),
            None => return,
        }
    };
    // Counted once the handshake has proven the address (or 0-RTT was accepted), so that
    // spoofed Initials cannot use up another client's share.
    let _client_slot = match shared
        .client_conns
        .try_take(peer.ip(), settings.max_per_client)
    {
        Ok(slot) => slot,
        Err(_) => {
            shared.metrics.limit_hit("client_connections");
            conn.close(H3_EXCESSIVE_LOAD, b"too many connections from this address");
            return;
        }
    };
    let handshake = Arc::new(handshake);
    let sni = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
        .map(|s| Arc::<str>::from(s.to_ascii_lowercase()));
    let local = SocketAddr::new(
        conn.local_ip()
            .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
        view.port,
    );
    let info = Arc::new(ConnInfo {
        listener: view.name.clone(),
        peer,
        local,
        tls: true,
        sni,
        client_cert: None,
        client_cert_verdict: Default::default(),
        forwarding: Default::default(),
        // QUIC runs TLS 1.3 only (RFC 9001 §4.2); quinn does not expose the suite.
        tls_version: Some("TLSv1.3"),
        tls_cipher: None,
        read_budget: Some(crate::static_files::ReadBudget::new(
            settings.read_ahead,
            shared.read_ahead_total.clone(),
        )),
    });
    let quic = conn.clone();
    let share = shared
        .quic_send_budget
        .connection(conn.clone(), settings.send_window);
    let mut h3: H3Conn = match h3::server::builder()
        .max_field_section_size(settings.max_header_bytes)
        .build(h3_quinn::Connection::new(conn))
        .await
    {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "HTTP/3 connection setup failed");
            return;
        }
    };
    let mut requests = tokio::task::JoinSet::new();
    // The client's address as last seen: quinn migrates a connection to a new path it has
    // validated without telling (0.11 has no event), so a change is counted when the next
    // request comes or the connection ends. `info.peer` keeps the handshake's address (the
    // one the access rules and logs saw at the start).
    let mut remote = quic.remote_address();
    let mut migrated = |now: SocketAddr| {
        if now != remote {
            remote = now;
            shared.metrics.quic_migrations.inc(&view.name);
        }
    };
    let mut draining = *drain.borrow();
    if draining {
        let _ = h3.shutdown(1).await;
        quic.close(H3_NO_ERROR, b"");
        return;
    }
    loop {
        let accepted = tokio::select! {
            a = h3.accept() => a,
            _ = drain.changed(), if !draining => {
                draining = true;
                // GOAWAY: no new requests; those already accepted finish.
                let _ = h3.shutdown(1).await;
                if requests.is_empty() {
                    break;
                }
                continue;
            }
            // Once draining, the connection ends when its last request does.
            Some(_) = requests.join_next(), if draining => {
                if requests.is_empty() {
                    break;
                }
                continue;
            }
        };
        match accepted {
            Ok(Some(resolver)) => {
                migrated(quic.remote_address());
                while requests.try_join_next().is_some() {}
                // Boxed: the task then holds a pointer, not the ~4 KiB request future, which
                // the spawn, the task list and the completion would each copy.
                requests.spawn(Box::pin(serve_request(
                    shared.clone(),
                    info.clone(),
                    handshake.clone(),
                    share.clone(),
                    settings,
                    resolver,
                )));
            }
            Ok(None) => break,
            Err(e) => {
                if !e.is_h3_no_error() {
                    tracing::debug!(%peer, error = %e, "HTTP/3 connection ended with an error");
                }
                break;
            }
        }
    }
    while requests.join_next().await.is_some() {}
    migrated(quic.remote_address());
    quic.close(H3_NO_ERROR, b"");
}

async fn handshake(
    shared: &Shared,
    listener: &Arc<str>,
    connecting: quinn::Connecting,
    settings: &ConnSettings,
) -> Option<quinn::Connection> {
    let m = &shared.metrics;
    match tokio::time::timeout(settings.handshake_timeout, connecting).await {
        Ok(Ok(c)) => {
            m.tls_handshakes.inc(&(listener.clone(), "quic", "TLSv1.3"));
            Some(c)
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "QUIC handshake failed");
            m.tls_handshake_errors
                .inc(&(listener.clone(), "quic", "error"));
            None
        }
        Err(_) => {
            m.limit_hit("tls_handshake_timeout");
            m.tls_handshake_errors
                .inc(&(listener.clone(), "quic", "timeout"));
            None
        }
    }
}

/// One request stream: read the head, build the request, run the pipeline, send the response.
async fn serve_request(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    handshake: Arc<Handshake>,
    share: Share,
    settings: ConnSettings,
    resolver: Resolver,
) {
    let head = resolver.resolve_request();
    let (req, stream) = match tokio::time::timeout(settings.handshake_timeout, head).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(peer = %conn.peer, error = %e, "bad HTTP/3 request");
            return;
        }
        Err(_) => {
            shared.metrics.limit_hit("header_read_timeout");
            return;
        }
    };
    // A connection-specific field makes the request malformed (RFC 9114 §4.2, §4.1.2).
    let mut stream = stream;
    if req
        .headers()
        .iter()
        .any(|(n, v)| crate::conn_headers::is_connection_specific(n.as_str(), v.as_bytes()))
    {
        tracing::debug!(peer = %conn.peer, "HTTP/3 request with a connection-specific field");
        stream.stop_sending(h3::error::Code::H3_MESSAGE_ERROR);
        stream.stop_stream(h3::error::Code::H3_MESSAGE_ERROR);
        return;
    }
    let early = handshake.in_early_data();
    let (send, recv) = stream.split();
    let (mut parts, ()) = req.into_parts();
    parts.version = http::Version::HTTP_3;
    if early {
        parts.extensions.insert(EarlyData);
        shared.metrics.early_data_requests.inc(&conn.listener);
    }
    parts.extensions.insert(ReadChunk(settings.static_chunk));
    let body = RecvBody::new(recv, &parts.headers).primed().await;
    let req = Request::from_parts(parts, crate::body::boxed(body));
    // Boxed: the pipeline's future is most of a request's state (~6 KiB); inline, the task of
    // every stream would carry it from spawn until its last byte is acknowledged.
    let resp = Box::pin(crate::pipeline::handle(shared, conn, Protocol::Http3, req)).await;
    // Active (a share of `http3.send_budget`) while the response is sent.
    let _responding = share.responding();
    send_response(send, resp, &share, settings.send_timeout).await;
}

/// Sends the head, then every body frame, awaiting each so QUIC flow control paces the body.
/// Every write (head, DATA, trailers) the client does not accept within `send_timeout` resets
/// the stream: a zero stream window cannot hold the request slot for ever.
async fn send_response(
    mut send: SendHalf,
    resp: Response<Body>,
    share: &Share,
    send_timeout: Duration,
) {
    let (mut parts, mut body) = resp.into_parts();
    crate::conn_headers::strip(&mut parts.headers, crate::conn_headers::Te::Remove);
    let head = Response::from_parts(parts, ());
    let sent = tokio::time::timeout(send_timeout, send.send_response(head)).await;
    if !written(&mut send, sent) {
        return;
    }
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "response body failed; resetting the stream");
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return;
            }
        };
        share.refresh();
        let write = async {
            match frame.into_data() {
                Ok(data) if data.is_empty() => Ok(()),
                Ok(data) => send.send_data(data).await,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => send.send_trailers(trailers).await,
                    Err(_) => Ok(()),
                },
            }
        };
        let sent = tokio::time::timeout(send_timeout, write).await;
        if !written(&mut send, sent) {
            // Dropping the body releases the request slot.
            return;
        }
    }
    let _ = send.finish().await;
}

/// Whether one bounded response write went out; a stalled one resets the stream.
fn written(
    send: &mut SendHalf,
    sent: Result<Result<(), h3::error::StreamError>, tokio::time::error::Elapsed>,
) -> bool {
    match sent {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            // The client went away or reset the stream.
            tracing::debug!(error = %e, "HTTP/3 response not sent");
            false
        }
        Err(_) => {
            tracing::debug!("HTTP/3 client accepted no data within send_timeout");
            send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
            false
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvState {
    Data,
    Trailers,
    Done,
}

/// A request body streaming from an HTTP/3 request stream: DATA frames, then trailers. QUIC
/// flow control (`http3.stream_receive_window`) bounds what the client sends ahead; the
/// pipeline's body limits (size, idle time) apply on top, as for H1 and H2.
pub struct RecvBody {
    recv: RecvHalf,
    state: RecvState,
    peeked: Option<Option<Result<Frame<Bytes>, BoxError>>>,
    remaining: Option<u64>,
}

impl RecvBody {
    fn new(recv: RecvHalf, headers: &http::HeaderMap) -> RecvBody {
        let remaining = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        RecvBody {
            recv,
            state: RecvState::Data,
            peeked: None,
            remaining,
        }
    }

    /// Polls once without waiting, so a request whose stream already ended (a GET, usually)
    /// reports `is_end_stream`, which proxy retries and H1 framing rely on.
    async fn primed(mut self) -> RecvBody {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(f) = self.poll_next(cx) {
                self.peeked = Some(f);
            }
            Poll::Ready(())
        })
        .await;
        self
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            match self.state {
                RecvState::Data => match self.recv.poll_recv_data(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(Some(mut buf))) => {
                        let data = buf.copy_to_bytes(buf.remaining());
                        if let Some(r) = self.remaining.as_mut() {
                            *r = r.saturating_sub(data.len() as u64);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Poll::Ready(Ok(None)) => self.state = RecvState::Trailers,
                    Poll::Ready(Err(e)) => {
                        self.state = RecvState::Done;
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                },
                RecvState::Trailers => {
                    let r = self.recv.poll_recv_trailers(cx);
                    if r.is_ready() {
                        self.state = RecvState::Done;
                    }
                    return match r {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                        Poll::Ready(Ok(None)) => Poll::Ready(None),
                        Poll::Ready(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
                    };
                }
                RecvState::Done => return Poll::Ready(None),
            }
        }
    }
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(f) = this.peeked.take() {
            return Poll::Ready(f);
        }
        this.poll_next(cx)
    }

    fn is_end_stream(&self) -> bool {
        match &self.peeked {
            Some(None) => true,
            Some(Some(_)) => false,
            None => self.state == RecvState::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.is_end_stream() {
            return SizeHint::with_exact(0);
        }
        match (self.remaining, &self.peeked) {
            (Some(n), Some(Some(Ok(f)))) => {
                SizeHint::with_exact(n + f.data_ref().map_or(0, |d| d.len() as u64))
            }
            (Some(n), None) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_svc_names_the_port_and_max_age() {
        assert_eq!(
            alt_svc(8443, Duration::from_secs(86_400)),
            "h3=\":8443\"; ma=86400"
        );
    }

    #[test]
    fn transport_follows_the_config() {
        let h3 = Http3 {
            congestion: Congestion::Bbr,
            ..Http3::default()
        };
        // Every congestion choice builds, with and without the ACK frequency request and a
        // loopback-sized MTU bound.
        let _ = transport_config(
            &Http3 {
                ack_eliciting_threshold: 9,
                initial_mtu: 9000,
                mtu_discovery_upper_bound: 65527,
                send_fairness: false,
                ..Http3::default()
            },
            &Limits::default(),
        );
        for c in [Congestion::Cubic, Congestion::Bbr, Congestion::NewReno] {
            let _ = transport_config(
                &Http3 {
                    congestion: c,
                    ..h3.clone()
                },
                &Limits::default(),
            );
        }
    }

    #[test]
    fn handshake_complete_is_never_early() {
        assert!(!Handshake::complete().in_early_data());
    }
}
