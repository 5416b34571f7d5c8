//! Per-endpoint connection pools on hyper's low-level client connections.
//!
//! * HTTP/1.1 (`http1`, `https`): keep-alive connections. A connection goes back on the
//!   endpoint's idle list once it is ready again (its response read from the socket): at once
//!   when it already is as the response head arrives (a small response read whole with its
//!   head), else from a small task that waits for it. The most recently used connection is
//!   reused first. The idle list follows demand ([`Demand`]): it keeps at most as many
//!   connections as were in use at once at the peak of the current or the previous
//!   [`DEMAND_WINDOW`], never more than `max_idle_per_endpoint` (the hard bound), and none idle
//!   longer than [`IDLE_TIMEOUT`]; the oldest go first. So a burst of n requests in flight
//!   finds the n connections the last burst opened instead of opening them again (a fixed
//!   small cap under a larger load closes connections it needs a moment later, one new
//!   connection per few requests), and after the load falls the surplus is closed within two
//!   windows, by a timer task per pool (running while the list is not empty) when no request
//!   comes to do it.
//! * HTTP/2 (`h2c` prior knowledge, `h2` over TLS): one multiplexed connection per endpoint;
//!   another is opened when every open one carries [`H2_MAX_STREAMS`] streams or has died.
//!   Connection opening is serialised per endpoint so a burst shares one new connection.
//!
//! Upstream sockets get TCP_NODELAY and TCP keepalive. Host names in endpoint addresses are
//! resolved on every new connection.
//!
//! Each pool counts its open connections (a guard lives in every connection's task, so a
//! connection counts from its handshake until hyper's connection future ends, whoever closed
//! it); [`Pool::connections`] splits them into idle (an HTTP/1.1 connection on the idle list,
//! an HTTP/2 connection with no stream) and active (the rest) for
//! `sweety_upstream_connections`, at scrape time: the request path does nothing for it.

use super::error::ProxyError;
use crate::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use sweety_config::BackendProtocol;
use tokio::net::TcpStream;

/// Idle HTTP/1.1 connections older than this are closed instead of reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The period over which an endpoint's demand (HTTP/1.1 connections in use at once) is
/// measured; the idle list keeps what the peak of this window or the previous one needed, and
/// it is trimmed to that once per window even without traffic.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);
/// Streams we put on one HTTP/2 connection before opening another (the usual server limit).
pub const H2_MAX_STREAMS: usize = 100;

/// How to open connections to a backend's endpoints.
#[derive(Debug, Clone)]
pub struct Connector {
    /// Wire protocol.
    pub protocol: BackendProtocol,
    /// TLS config for `https`/`h2`.
    pub tls: Option<Arc<ClientConfig>>,
    /// SNI override (`BackendTls.sni`).
    pub sni: Option<String>,
    /// `Backend.external`: refuse internal addresses after resolution ([`refused_address`]).
    pub external: bool,
    /// `limits.proxy_read_ahead`: response bytes a new connection reads ahead of the client
    /// (HTTP/1.1: the read buffer's bound; HTTP/2: each stream's flow-control window).
    pub read_ahead: u32,
}

impl Connector {
    fn is_h2(&self) -> bool {
        matches!(self.protocol, BackendProtocol::H2 | BackendProtocol::H2c)
    }
}

#[derive(Debug)]
struct Idle {
    sender: http1::SendRequest<Body>,
    since: Instant,
}

#[derive(Debug, Clone)]
struct H2Conn {
    sender: http2::SendRequest<Body>,
    streams: Arc<AtomicUsize>,
}

/// The peak number of an endpoint's HTTP/1.1 connections in use at once (checked out for a
/// request, their response not yet read whole) in the current window of [`DEMAND_WINDOW`]
/// and in the one before it: how many idle connections the endpoint's traffic needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Demand {
    start: Instant,
    peak: usize,
    previous: usize,
}

impl Demand {
    fn new(now: Instant) -> Demand {
        Demand {
            start: now,
            peak: 0,
            previous: 0,
        }
    }

    /// Notes `in_use` connections in use at `now`, starting a new window when the current
    /// one is over (a window with no note at all counts as a peak of 0).
    fn note(&mut self, now: Instant, in_use: usize) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= DEMAND_WINDOW {
            self.previous = if elapsed < 2 * DEMAND_WINDOW {
                self.peak
            } else {
                0
            };
            self.peak = 0;
            self.start = now;
        }
        self.peak = self.peak.max(in_use);
    }

    /// Idle connections worth keeping: the larger of the two windows' peaks.
    fn wanted(&self) -> usize {
        self.peak.max(self.previous)
    }
}

/// An endpoint's idle HTTP/1.1 connections, oldest first, and the demand bounding them.
#[derive(Debug)]
struct IdleList {
    conns: VecDeque<Idle>,
    demand: Demand,
    /// A trimming task ([`Pool::reaper`]) runs for this list (while it is not empty).
    reaping: bool,
}

impl IdleList {
    /// Closes the connections idle since `cutoff` or longer (they are at the front) and the
    /// oldest beyond `keep`.
    fn trim(&mut self, cutoff: Option<Instant>, keep: usize) {
        while let Some(front) = self.conns.front() {
            if self.conns.len() > keep || cutoff.is_some_and(|c| front.since <= c) {
                self.conns.pop_front();
            } else {
                break;
            }
        }
    }
}

/// Connections of one endpoint.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<IdleList>,
    h2: Mutex<Vec<H2Conn>>,
    h2_connect: tokio::sync::Mutex<()>,
    max_idle: AtomicUsize,
    /// Connections open (handshake done, connection task running).
    open: Arc<AtomicUsize>,
}

/// Counts one open connection while it lives in the connection's task.
#[derive(Debug)]
struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    fn new(open: &Arc<AtomicUsize>) -> OpenGuard {
        open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(open.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Decrements an HTTP/2 connection's stream count when dropped (with the response body).
#[derive(Debug)]
pub struct StreamGuard(Arc<AtomicUsize>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
enum Sender {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>, StreamGuard),
}

/// A connection checked out for one request.
#[derive(Debug)]
pub struct Conn {
    sender: Sender,
    /// True when it came from the pool (it may have died since).
    pub reused: bool,
}

/// Why a send failed; `request` is given back when nothing was written.
#[derive(Debug)]
pub struct SendError {
    /// The cause.
    pub error: hyper::Error,
    /// The unsent request.
    pub request: Option<Request<Body>>,
}

impl SendError {
    /// Whether a request that failed this way on a connection from the pool (`reused`)
    /// deserves one more try on a new connection: hyper gave it back unsent, or, when it can
    /// be sent again (`replayable`: idempotent or no side effect, its whole body in memory),
    /// the connection closed before any response. Both are what a pooled connection the peer
    /// closed while it was idle looks like. Callers try at most once more.
    pub fn stale(&self, reused: bool, replayable: bool) -> bool {
        reused
            && (self.request.is_some()
                || (replayable && (self.error.is_incomplete_message() || self.error.is_canceled())))
    }
}

impl Pool {
    /// An empty pool keeping at most `max_idle` idle HTTP/1.1 connections.
    pub fn new(max_idle: usize) -> Pool {
        Pool {
            idle: Mutex::new(IdleList {
                conns: VecDeque::new(),
                demand: Demand::new(Instant::now()),
                reaping: false,
            }),
            h2: Mutex::new(Vec::new()),
            h2_connect: tokio::sync::Mutex::new(()),
            max_idle: AtomicUsize::new(max_idle),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Open connections as `(active, idle)`: idle are HTTP/1.1 connections waiting on the
    /// idle list and HTTP/2 connections carrying no stream; active are the other open ones
    /// (a request or a response body on them, or an HTTP/1.1 connection between its response
    /// and its return to the list). Read at scrape time.
    pub fn connections(&self) -> (usize, usize) {
        let open = self.open.load(Ordering::Relaxed);
        let idle_h1 = self
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .conns
            .iter()
            .filter(|i| !i.sender.is_closed())
            .count();
        let idle_h2 = self
            .h2
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|c| !c.sender.is_closed() && c.streams.load(Ordering::Acquire) == 0)
            .count();
        // A connection ending between the two reads is briefly on a list and no longer
        // open: never report more idle than open.
        let idle = (idle_h1 + idle_h2).min(open);
        (open - idle, idle)
    }

    /// Changes the idle bound (on config reload).
    pub fn set_max_idle(&self, n: usize) {
        self.max_idle.store(n, Ordering::Relaxed);
    }

    /// Idle HTTP/1.1 connections currently pooled.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .conns
            .len()
    }

    /// A connection to `addr`: pooled if one is usable, else a new one. The caller bounds the
    /// time this takes (connect timeout).
    pub async fn acquire(&self, addr: &str, c: &Connector) -> Result<Conn, ProxyError> {
        if c.is_h2() {
            return self.acquire_h2(addr, c).await;
        }
        if let Some(sender) = self.checkout_h1() {
            return Ok(Conn {
                sender: Sender::H1(sender),
                reused: true,
            });
        }
        match connect(addr, c, &self.open).await? {
            Opened::H1(s) => Ok(Conn {
                sender: Sender::H1(s),
                reused: false,
            }),
            Opened::H2(_) => unreachable!("h1 connector opened h2"),
        }
    }

    fn checkout_h1(&self) -> Option<http1::SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let mut now = None;
        while let Some(i) = idle.conns.pop_back() {
            // The newest first: when it is too old, so is every other one.
            if now
                .get_or_insert_with(Instant::now)
                .saturating_duration_since(i.since)
                >= IDLE_TIMEOUT
            {
                idle.conns.clear();
                return None;
            }
            if !i.sender.is_closed() && i.sender.is_ready() {
                return Some(i.sender);
            }
        }
        None
    }

    /// Puts a connection that is ready for its next request on the idle list, within the
    /// demand and the hard bound; starts the list's trimming task if none runs.
    fn checkin_h1(self: &Arc<Self>, sender: http1::SendRequest<Body>) {
        let max = self.max_idle.load(Ordering::Relaxed);
        if max == 0 || sender.is_closed() {
            return;
        }
        let now = Instant::now();
        // The list is in check-in order, so one clock reading and a look at its front find
        // every entry older than IDLE_TIMEOUT (a pass over the list per check-in cost ~1,500
        // instructions per request with 128 connections pooled).
        let cutoff = now.checked_sub(IDLE_TIMEOUT);
        let open = self.open.load(Ordering::Relaxed);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        // In use: the open connections not on the list, this one included.
        let in_use = open.saturating_sub(idle.conns.len()).max(1);
        idle.demand.note(now, in_use);
        let keep = idle.demand.wanted().min(max);
        idle.trim(cutoff, keep.saturating_sub(1));
        idle.conns.push_back(Idle { sender, since: now });
        if !idle.reaping && tokio::runtime::Handle::try_current().is_ok() {
            idle.reaping = true;
            tokio::spawn(Pool::reaper(Arc::downgrade(self)));
        }
    }

    /// Once per [`DEMAND_WINDOW`] while the pool lives and its idle list is not empty: closes
    /// the idle connections beyond the demand (so those of a past burst go within two windows
    /// of its end, traffic or not), the expired ones and those the backend closed.
    async fn reaper(pool: Weak<Pool>) {
        loop {
            tokio::time::sleep(DEMAND_WINDOW).await;
            let Some(pool) = pool.upgrade() else {
                return;
            };
            if !pool.reap(Instant::now()) {
                return;
            }
        }
    }

    /// One trimming pass at `now`; false (and the list marked as having no task) when the
    /// list is left empty.
    fn reap(&self, now: Instant) -> bool {
        let max = self.max_idle.load(Ordering::Relaxed);
        let open = self.open.load(Ordering::Relaxed);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let in_use = open.saturating_sub(idle.conns.len());
        idle.demand.note(now, in_use);
        let keep = idle.demand.wanted().min(max);
        idle.conns.retain(|i| !i.sender.is_closed());
        idle.trim(now.checked_sub(IDLE_TIMEOUT), keep);
        if idle.conns.is_empty() {
            idle.reaping = false;
            return false;
        }
        true
    }

    fn take_h2_stream(&self) -> Option<Conn> {
        let mut conns = self.h2.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain(|c| !c.sender.is_closed());
        let c = conns
            .iter()
            .filter(|c| c.sender.is_ready())
            .min_by_key(|c| c.streams.load(Ordering::Acquire))?;
        if c.streams.load(Ordering::Acquire) >= H2_MAX_STREAMS {
            return None;
        }
        c.streams.fetch_add(1, Ordering::AcqRel);
        Some(Conn {
            sender: Sender::H2(c.sender.clone(), StreamGuard(c.streams.clone())),
            reused: true,
        })
    }

    async fn acquire_h2(&self, addr: &str, c: &Connector) -> Result<Conn, ProxyError> {
        if let Some(conn) = self.take_h2_stream() {
            return Ok(conn);
        }
        let _opening = self.h2_connect.lock().await;
        if let Some(conn) = self.take_h2_stream() {
            return Ok(conn);
        }
        let Opened::H2(sender) = connect(addr, c, &self.open).await? else {
            unreachable!("h2 connector opened h1")
        };
        let streams = Arc::new(AtomicUsize::new(1));
        self.h2
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(H2Conn {
                sender: sender.clone(),
                streams: streams.clone(),
            });
        Ok(Conn {
            sender: Sender::H2(sender, StreamGuard(streams)),
            reused: false,
        })
    }
}

impl Conn {
    /// Sends `req` and waits for the response head. An HTTP/1.1 connection goes back to
    /// `pool` once the response body has been read; the returned guard (HTTP/2) must live as
    /// long as the response body.
    pub async fn send(
        self,
        pool: &Arc<Pool>,
        req: Request<Body>,
    ) -> Result<(Response<Incoming>, Option<StreamGuard>), SendError> {
        match self.sender {
            Sender::H1(mut s) => {
                if let Err(error) = s.ready().await {
                    return Err(SendError {
                        error,
                        request: Some(req),
                    });
                }
                let sent = s.try_send_request(req);
                match sent.await {
                    Ok(resp) => {
                        // A small response usually came whole with its head: the connection
                        // is ready now and goes back without a task of its own.
                        match s.poll_ready(&mut Context::from_waker(Waker::noop())) {
                            Poll::Ready(Ok(())) => pool.checkin_h1(s),
                            Poll::Ready(Err(_)) => {}
                            Poll::Pending => {
                                let pool = pool.clone();
                                tokio::spawn(async move {
                                    if s.ready().await.is_ok() {
                                        pool.checkin_h1(s);
                                    }
                                });
                            }
                        }
                        Ok((resp, None))
                    }
                    Err(mut e) => Err(SendError {
                        request: e.take_message(),
                        error: e.into_error(),
                    }),
                }
            }
            Sender::H2(mut s, guard) => {
                if let Err(error) = s.ready().await {
                    return Err(SendError {
                        error,
                        request: Some(req),
                    });
                }
                match s.try_send_request(req).await {
                    Ok(resp) => Ok((resp, Some(guard))),
                    Err(mut e) => Err(SendError {
                        request: e.take_message(),
                        error: e.into_error(),
                    }),
                }
            }
        }
    }
}

enum Opened {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>),
}

/// Why an address an external (ExternalName) endpoint resolved to must not be connected to:
/// loopback, unspecified, link-local (IPv4 169.254/16 with the cloud metadata address
/// 169.254.169.254, IPv6 fe80::/10), the IPv6 metadata address fd00:ec2::254, IPv4-mapped
/// forms of these, or an address of this host's own interfaces (the dataplane Pod: its admin
/// port and listeners). Checked on every new connection, after DNS resolution, so a name
/// re-pointed after the config was pushed is caught too.
pub fn refused_address(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    let why = match ip {
        IpAddr::V4(v4) if v4.octets() == [169, 254, 169, 254] => Some("a cloud metadata address"),
        IpAddr::V6(v6) if v6.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] => {
            Some("a cloud metadata address")
        }
        _ if ip.is_loopback() => Some("a loopback address"),
        _ if ip.is_unspecified() => Some("an unspecified address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("a link-local address"),
        IpAddr::V4(v4) if v4.is_broadcast() || v4.is_multicast() => Some("not a unicast address"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("not a unicast address"),
        _ => None,
    };
    if why.is_some() {
        return why;
    }
    // One of this host's (Pod's) own addresses: only those can be bound.
    std::net::UdpSocket::bind((ip, 0))
        .is_ok()
        .then_some("an address of the dataplane itself")
}

/// The addresses `addr` (`host:port`) resolves to that an upstream connection may use: all
/// of them, or with `external` (an ExternalName backend) those [`refused_address`] does not
/// name. Every upstream connection resolves here (HTTP pools, upgrades, L4 TCP and UDP, TCP
/// health checks), so the check cannot be skipped by one protocol path. When nothing is left
/// the error says why.
pub(crate) async fn resolve(addr: &str, external: bool) -> std::io::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    let mut refused = None;
    for sa in tokio::net::lookup_host(addr).await? {
        match external.then(|| refused_address(sa.ip())).flatten() {
            Some(why) => {
                refused = Some(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "{addr} resolves to {}, {why}, which an ExternalName backend may not reach",
                        sa.ip()
                    ),
                ))
            }
            None => out.push(sa),
        }
    }
    if out.is_empty() {
        return Err(refused.unwrap_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no address resolved")
        }));
    }
    Ok(out)
}

/// TCP to the first address of `addr` that answers (nodelay, keep-alive): the transport every
/// upstream connection starts with, pooled or not (see `upgrade`), L4 included. With
/// `external`, only the addresses [`resolve`] permits are tried.
pub(crate) async fn connect_tcp(addr: &str, external: bool) -> std::io::Result<TcpStream> {
    let mut last = None;
    for sa in resolve(addr, external).await? {
        match TcpStream::connect(sa).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                let ka = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60));
                let _ = socket2::SockRef::from(&s).set_tcp_keepalive(&ka);
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no address resolved")
    }))
}

/// A new connection to `addr`, counted in `open` while its connection task runs.
async fn connect(addr: &str, c: &Connector, open: &Arc<AtomicUsize>) -> Result<Opened, ProxyError> {
    let tcp = connect_tcp(addr, c.external)
        .await
        .map_err(|e| ProxyError::Connect {
            addr: addr.to_string(),
            source: e.into(),
        })?;
    match &c.tls {
        None => handshake(addr, TokioIo::new(tcp), c, open).await,
        Some(cfg) => {
            let stream = connect_tls(addr, c, cfg, tcp).await?;
            let tls_err = |e: String| ProxyError::Tls {
                addr: addr.to_string(),
                source: e.into(),
            };
            let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let want: &[u8] = if c.is_h2() { b"h2" } else { b"http/1.1" };
            // No ALPN at all: assume the server speaks what we asked for.
            if alpn.as_deref().is_some_and(|p| p != want) {
                return Err(tls_err(format!(
                    "backend negotiated ALPN {:?}, wanted {:?}",
                    String::from_utf8_lossy(alpn.as_deref().unwrap_or_default()),
                    String::from_utf8_lossy(want)
                )));
            }
            handshake(addr, TokioIo::new(stream), c, open).await
        }
    }
}

/// The TLS handshake with a backend over `tcp`: SNI from the connector (or `addr`'s host) and the
/// connector's verification. Shared by pooled connections and upgrade tunnels.
pub(super) async fn connect_tls(
    addr: &str,
    c: &Connector,
    cfg: &Arc<ClientConfig>,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ProxyError> {
    let tls_err = |e: String| ProxyError::Tls {
        addr: addr.to_string(),
        source: e.into(),
    };
    let name = super::tls::server_name(c.sni.as_deref(), addr).map_err(tls_err)?;
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| ProxyError::Tls {
            addr: addr.to_string(),
            source: e.into(),
        })
}

/// hyper's client handshake on a connected stream. What the connection reads ahead of the
/// client is bounded by `c.read_ahead`: an HTTP/1.1 connection reads into a buffer of at most
/// that many bytes, and reads again only once the body's last chunk was taken (hyper's body
/// channel holds one); an HTTP/2 stream's window is that size, re-opened as the body is taken.
async fn handshake<T>(
    addr: &str,
    io: T,
    c: &Connector,
    open: &Arc<AtomicUsize>,
) -> Result<Opened, ProxyError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let err = |e: hyper::Error| ProxyError::Connect {
        addr: addr.to_string(),
        source: e.into(),
    };
    // hyper's smallest HTTP/1.1 buffer bound is 8 KiB (it panics below; validation refuses
    // less); the HTTP/2 window cannot pass 2^31-1.
    let read_ahead = (c.read_ahead as usize).max(sweety_config::MIN_PROXY_READ_AHEAD as usize);
    if c.is_h2() {
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(read_ahead.min(i32::MAX as usize) as u32)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .handshake::<_, Body>(io)
            .await
            .map_err(err)?;
        let counted = OpenGuard::new(open);
        tokio::spawn(async move {
            let _counted = counted;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream h2 connection ended");
            }
        });
        Ok(Opened::H2(sender))
    } else {
        let (sender, conn) = http1::Builder::new()
            .max_buf_size(read_ahead)
            .handshake::<_, Body>(io)
            .await
            .map_err(err)?;
        let counted = OpenGuard::new(open);
        tokio::spawn(async move {
            let _counted = counted;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream h1 connection ended");
            }
        });
        Ok(Opened::H1(sender))
    }
}

#[cfg(test)]
mod demand_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn demand_is_the_larger_peak_of_this_window_and_the_last() {
        let t0 = Instant::now();
        let mut d = Demand::new(t0);
        assert_eq!(d.wanted(), 0);
        d.note(t0, 5);
        d.note(t0 + Duration::from_secs(1), 100);
        d.note(t0 + Duration::from_secs(2), 3);
        assert_eq!(d.wanted(), 100);
        // The next window: the last one's peak still counts.
        d.note(t0 + DEMAND_WINDOW, 2);
        assert_eq!((d.peak, d.previous, d.wanted()), (2, 100, 100));
        // The one after: only the window before it (peak 2) and its own.
        d.note(t0 + 2 * DEMAND_WINDOW, 1);
        assert_eq!((d.peak, d.previous, d.wanted()), (1, 2, 2));
        // Two silent windows: the demand is what is noted now.
        d.note(t0 + 5 * DEMAND_WINDOW, 0);
        assert_eq!((d.peak, d.previous, d.wanted()), (0, 0, 0));
        // A clock reading from before the window's start (another thread's) is in the window.
        d.note(t0, 7);
        assert_eq!(d.wanted(), 7);
    }

    /// A raw HTTP/1.1 backend answering every request of every connection "ok", keep-alive.
    async fn ok_backend() -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        addr
    }

    /// `n` connections in use at once, then all back on the idle list.
    async fn use_at_once(pool: &Arc<Pool>, addr: &str, n: usize) {
        let c = Connector {
            protocol: BackendProtocol::Http1,
            tls: None,
            sni: None,
            external: false,
            read_ahead: sweety_config::DEFAULT_PROXY_READ_AHEAD,
        };
        let mut conns = Vec::new();
        for _ in 0..n {
            conns.push(pool.acquire(addr, &c).await.unwrap());
        }
        for conn in conns {
            let req = Request::get("/")
                .header("host", "b")
                .body(crate::body::empty())
                .unwrap();
            let (resp, _) = conn.send(pool, req).await.unwrap();
            use http_body_util::BodyExt;
            assert_eq!(
                &resp.into_body().collect().await.unwrap().to_bytes()[..],
                b"ok"
            );
        }
        while pool.connections().0 != 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Real sockets: the idle list keeps a burst's connections for the rest of its window and
    /// the next, bounded by `max_idle`; a trimming pass two windows after the burst closes them.
    #[tokio::test]
    async fn idle_connections_follow_the_recent_peak_within_the_bound() {
        let addr = ok_backend().await;
        let wait_open = |pool: Arc<Pool>, want: usize| async move {
            while pool.connections() != (0, want) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        let run = async {
            // Bounded by max_idle: 8 in use at once, 3 kept.
            let small = Arc::new(Pool::new(3));
            use_at_once(&small, &addr, 8).await;
            assert_eq!(small.connections(), (0, 3));

            let pool = Arc::new(Pool::new(1024));
            use_at_once(&pool, &addr, 8).await;
            assert_eq!(pool.connections(), (0, 8));
            let t0 = Instant::now();
            assert!(pool.reap(t0));
            assert_eq!(pool.idle_count(), 8);
            // The next window still wants the burst's peak.
            assert!(pool.reap(t0 + DEMAND_WINDOW + Duration::from_millis(1)));
            assert_eq!(pool.idle_count(), 8);
            // Two windows on with nothing in use: all closed, the trimming task would end.
            assert!(!pool.reap(t0 + 3 * DEMAND_WINDOW + Duration::from_millis(2)));
            assert_eq!(pool.idle_count(), 0);
            assert!(!pool.idle.lock().unwrap().reaping);
            wait_open(pool.clone(), 0).await;
            // A new burst is served by new connections and kept again.
            use_at_once(&pool, &addr, 4).await;
            assert_eq!(pool.connections(), (0, 4));
        };
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("bounded");
    }
}

#[cfg(test)]
mod external_tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn internal_addresses_are_refused() {
        for refused in [
            "127.0.0.1",
            "127.3.2.1",
            "::1",
            "0.0.0.0",
            "::",
            "169.254.169.254",
            "169.254.1.1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
            "255.255.255.255",
            "224.0.0.1",
        ] {
            let ip: IpAddr = refused.parse().unwrap();
            assert!(refused_address(ip).is_some(), "{refused} must be refused");
        }
        // Documentation addresses are nobody's own here.
        for allowed in ["192.0.2.1", "2001:db8::1", "203.0.113.9"] {
            let ip: IpAddr = allowed.parse().unwrap();
            assert_eq!(refused_address(ip), None, "{allowed}");
        }
        assert_eq!(
            refused_address("169.254.169.254".parse().unwrap()),
            Some("a cloud metadata address")
        );
    }

    /// The Pod's own addresses: whatever non-loopback address this host routes from is local,
    /// so an ExternalName resolving to it is refused.
    #[test]
    fn own_interface_addresses_are_refused() {
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        if probe.connect("192.0.2.1:9").is_err() {
            return; // no route out of this network namespace: no own address to test
        }
        let own = probe.local_addr().unwrap().ip();
        assert_eq!(
            refused_address(own),
            Some("an address of the dataplane itself")
        );
    }

    /// Real sockets: a listener on loopback is reachable by address for an ordinary backend,
    /// refused for an external one whether named by a literal or a host name resolving to it.
    #[tokio::test]
    async fn external_endpoints_never_reach_loopback() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            let (_s, _) = listener.accept().await.unwrap();
        });
        let ok = connect_tcp(&format!("127.0.0.1:{port}"), false).await;
        assert!(ok.is_ok(), "{ok:?}");
        accept.await.unwrap();
        for addr in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
            let err = connect_tcp(&addr, true).await.unwrap_err();
            assert_eq!(
                err.kind(),
                std::io::ErrorKind::PermissionDenied,
                "{addr}: {err}"
            );
            assert!(err.to_string().contains("may not reach"), "{err}");
        }
        let err = connect_tcp("169.254.169.254:80", true).await.unwrap_err();
        assert!(err.to_string().contains("metadata"), "{err}");
    }
}
