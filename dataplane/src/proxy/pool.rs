//! Per-endpoint connection pools: HTTP/1.1 on Sweety's own client connections
//! ([`sweety_h1::client`]), HTTP/2 on Sweety's own ([`sweety_h2::client`],
//! `limits.http2_client: sweety`) or hyper's (`hyper`).
//!
//! * HTTP/1.1 (`http1`, `https`): keep-alive connections. A connection goes back on the
//!   endpoint's idle list once its response was read whole and neither side asked to close:
//!   at once when the response came whole with its head (a small response), else when its body
//!   reads its last byte ([`Checkin`]); a connection the backend closed or reset while idle is
//!   dropped when it is next looked at ([`sweety_h1::client::Conn::is_closed`]: at check-out,
//!   by the trimming task, at scrape time). The most recently used connection is
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
//!   another is opened when every open one carries [`H2_MAX_STREAMS`] streams (or, on Sweety's
//!   client, the backend's SETTINGS_MAX_CONCURRENT_STREAMS if lower; 0 counts as closing) or
//!   is closing (GOAWAY, error, EOF, stream ids used up), at most [`H2_MAX_CONNS`] of them
//!   (beyond, a request fails at once with [`ProxyError::LocalOverload`]: a 503, never
//!   counted against the endpoint). A pool holds the connections of the client its
//!   connector names only. Connections are opened in parallel, as many at once as the
//!   requests waiting for a stream need (a burst of 1,000 requests to a backend of 100
//!   streams per connection opens 10 together); a request that opens one gets its first
//!   stream, the others wait for an opening to end, or a stream of an open connection to be
//!   freed, and look again. An opening that fails
//!   fails the requests waiting for it with [`ProxyError::ConnectWaited`], which does not
//!   count against the endpoint (its opener's error does, once).
//!
//! Upstream sockets get TCP_NODELAY and TCP keepalive. Host names in endpoint addresses are
//! resolved on every new connection.
//!
//! Each pool counts its open connections (a guard lives in every HTTP/1.1 connection's
//! transport and in every HTTP/2 connection's task, so a connection counts from its handshake
//! until it is dropped or hyper's connection future ends, whoever closed it);
//! [`Pool::connections`] splits them into idle (an HTTP/1.1 connection on the idle list,
//! an HTTP/2 connection with no stream) and active (the rest) for
//! `sweety_upstream_connections`, at scrape time: the request path does nothing for it.

use super::error::ProxyError;
use super::head::Head;
use crate::body::{Body, BoxError};
use bytes::Bytes;
use http::header::HeaderValue;
use http::Response;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use sweety_config::{BackendProtocol, Http2Client};
use sweety_h1::client as h1;
use sweety_h2::client as h2s;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Idle HTTP/1.1 connections older than this are closed instead of reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The period over which an endpoint's demand (HTTP/1.1 connections in use at once) is
/// measured; the idle list keeps what the peak of this window or the previous one needed, and
/// it is trimmed to that once per window even without traffic.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);
/// Streams we put on one HTTP/2 connection before opening another (the usual server limit).
pub const H2_MAX_STREAMS: usize = 100;
/// HTTP/2 connections a pool (one endpoint) holds open at once; a request that would need
/// another fails at once with [`ProxyError::LocalOverload`] (a backend allowing one stream or none per connection does not
/// get a connection per request).
pub const H2_MAX_CONNS: usize = 64;

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
    /// `limits.http2_client`: whose HTTP/2 client `h2c` and `h2` backends get.
    pub h2_client: Http2Client,
}

impl Connector {
    fn is_h2(&self) -> bool {
        matches!(self.protocol, BackendProtocol::H2 | BackendProtocol::H2c)
    }
}

/// The transport of an HTTP/1.1 backend connection, counted open while it lives.
#[derive(Debug)]
pub struct BackendIo {
    stream: Stream,
    _open: OpenGuard,
}

#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for BackendIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.stream {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.stream {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.stream {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.stream {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.stream {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An HTTP/1.1 backend connection.
type H1Conn = h1::Conn<BackendIo>;

/// Puts an HTTP/1.1 connection whose response was read whole back on its pool's idle list.
#[derive(Debug)]
pub struct Checkin(Arc<Pool>);

impl h1::Release<BackendIo> for Checkin {
    fn release(self, conn: H1Conn) {
        self.0.checkin_h1(conn);
    }
}

/// A backend's response body: read by our HTTP/1.1 client, or an HTTP/2 one.
#[derive(Debug)]
pub enum UpstreamBody {
    /// From an HTTP/1.1 connection (which it owns until the body is read).
    H1(h1::ResponseBody<BackendIo, Body, Checkin>),
    /// From an HTTP/2 stream of hyper's client.
    H2(Incoming),
    /// From an HTTP/2 stream of Sweety's client.
    H2s(h2s::ResponseBody),
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::H1(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::H2(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::H2s(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::H1(b) => b.is_end_stream(),
            UpstreamBody::H2(b) => b.is_end_stream(),
            UpstreamBody::H2s(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::H1(b) => b.size_hint(),
            UpstreamBody::H2(b) => b.size_hint(),
            UpstreamBody::H2s(b) => b.size_hint(),
        }
    }
}

#[derive(Debug)]
struct Idle {
    conn: H1Conn,
    since: Instant,
}

#[derive(Debug, Clone)]
struct H2Conn {
    sender: H2Sender,
    streams: Arc<Streams>,
}

/// The streams an HTTP/2 connection carries now, counted by their [`StreamGuard`]s.
#[derive(Debug)]
struct Streams {
    n: AtomicUsize,
    /// The pool's waiting requests, woken when a stream is freed.
    wake: Arc<H2Wake>,
}

impl Streams {
    fn load(&self, order: Ordering) -> usize {
        self.n.load(order)
    }
}

/// What wakes the requests of a pool waiting for an HTTP/2 stream: an opening that ends, or a
/// stream freed on an open connection while any request waits (session 20's review, P3:
/// they waited for an opening that could hang up to the connect timeout, beside free
/// streams).
#[derive(Debug, Default)]
struct H2Wake {
    notify: tokio::sync::Notify,
    /// Requests waiting for a stream (every open connection being full), each counted by its
    /// [`Waiting`]: the one count of them. Raised under the pool's lock (where
    /// [`H2List::needs_another`]'s caller reads it), read by a [`StreamGuard`] without it.
    waiting: AtomicUsize,
}

/// The handle of an HTTP/2 connection, of either client.
#[derive(Debug, Clone)]
enum H2Sender {
    Hyper(http2::SendRequest<Body>),
    Sweety(h2s::SendRequest),
}

impl H2Sender {
    fn is_closed(&self) -> bool {
        match self {
            H2Sender::Hyper(s) => s.is_closed(),
            H2Sender::Sweety(s) => s.is_closing(),
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            H2Sender::Hyper(s) => s.is_ready(),
            H2Sender::Sweety(s) => !s.is_closing(),
        }
    }

    /// Streams this connection may carry at once.
    fn max_streams(&self) -> usize {
        match self {
            H2Sender::Hyper(_) => H2_MAX_STREAMS,
            H2Sender::Sweety(s) => s.max_streams().min(H2_MAX_STREAMS),
        }
    }

    fn client(&self) -> Http2Client {
        match self {
            H2Sender::Hyper(_) => Http2Client::Hyper,
            H2Sender::Sweety(_) => Http2Client::Sweety,
        }
    }

    fn sender(self, guard: StreamGuard) -> Sender {
        match self {
            H2Sender::Hyper(s) => Sender::H2(s, guard),
            H2Sender::Sweety(s) => Sender::H2s(s, guard),
        }
    }
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

/// An endpoint's HTTP/2 connections, those being opened and the requests waiting for them.
#[derive(Debug)]
struct H2List {
    conns: Vec<H2Conn>,
    /// Connections being opened (TCP, TLS, the HTTP/2 handshake), each by one request (its
    /// opener, which gets the connection's first stream); each counts towards
    /// [`H2_MAX_CONNS`] as an open one does.
    connecting: usize,
    /// Streams the connection opened last allows: what one being opened is expected to carry.
    per_conn: usize,
    /// Openings that failed (or timed out) so far: a request waiting when it moves fails with
    /// them, uncounted ([`ProxyError::ConnectWaited`]).
    failures: u64,
    /// The limit that elapsed when the last failed opening timed out.
    timed_out: Option<Duration>,
}

impl H2List {
    /// Whether a request finding no stream free (`waiting` others wait: [`H2Wake::waiting`])
    /// needs a connection of its own opened: more streams are wanted than the connections
    /// being opened will carry (each carries its opener's stream and `per_conn - 1` more).
    fn needs_another(&self, waiting: usize) -> bool {
        waiting + self.connecting + 1 > self.connecting * self.per_conn
    }
}

/// Connections of one endpoint.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<IdleList>,
    h2: Mutex<H2List>,
    /// Woken when an HTTP/2 opening ends (opened, failed or given up) or a stream is freed
    /// while requests wait.
    h2_wake: Arc<H2Wake>,
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

/// Decrements an HTTP/2 connection's stream count when dropped (with the response body),
/// and wakes the requests waiting for a stream if there are any (one load when none waits).
#[derive(Debug)]
pub struct StreamGuard(Arc<Streams>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, Ordering::SeqCst);
        // SeqCst with the waiter's count and its second look (acquire_h2): either it sees
        // the stream freed, or this sees it waiting and wakes it.
        // One stream, one request woken (all of them would herd onto the lock at every
        // stream freed); a woken request dropped meanwhile passes it on (tokio's Notify).
        if self.0.wake.waiting.load(Ordering::SeqCst) > 0 {
            self.0.wake.notify.notify_one();
        }
    }
}

#[derive(Debug)]
enum Sender {
    H1(H1Conn),
    H2(http2::SendRequest<Body>, StreamGuard),
    H2s(h2s::SendRequest, StreamGuard),
}

/// A connection checked out for one request.
#[derive(Debug)]
pub struct Conn {
    sender: Sender,
    /// True when it came from the pool (it may have died since).
    pub reused: bool,
}

/// Why a send failed; the body is given back (`unsent`) when no byte of the request was
/// written.
#[derive(Debug)]
pub struct SendError {
    /// The cause.
    pub error: BoxError,
    /// The body of the unsent request.
    pub unsent: Option<Body>,
    /// The backend closed or reset the connection before any byte of a response.
    pub closed_before_response: bool,
}

impl SendError {
    /// Whether a request that failed this way on a connection from the pool (`reused`)
    /// deserves one more try on a new connection: nothing of it was written, or, when it can
    /// be sent again (`replayable`: idempotent or no side effect, its whole body in memory),
    /// the connection closed before any response. Both are what a pooled connection the peer
    /// closed while it was idle looks like. Callers try at most once more.
    pub fn stale(&self, reused: bool, replayable: bool) -> bool {
        reused && (self.unsent.is_some() || (replayable && self.closed_before_response))
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
            h2: Mutex::new(H2List {
                conns: Vec::new(),
                connecting: 0,
                per_conn: H2_MAX_STREAMS,
                failures: 0,
                timed_out: None,
            }),
            h2_wake: Arc::default(),
            max_idle: AtomicUsize::new(max_idle),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Open connections as `(active, idle)`: idle are HTTP/1.1 connections waiting on the
    /// idle list and HTTP/2 connections carrying no stream; active are the other open ones
    /// (a request or a response body on them, or an HTTP/1.1 connection between its response
    /// and its return to the list). Read at scrape time.
    pub fn connections(&self) -> (usize, usize) {
        let idle_h1 = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            // Those the backend closed are closed here too (no longer open).
            idle.conns.retain_mut(|i| !i.conn.is_closed());
            idle.conns.len()
        };
        let open = self.open.load(Ordering::Relaxed);
        let idle_h2 = self
            .h2
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .conns
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
    /// time this takes; [`Pool::acquire_by`] bounds it itself.
    pub async fn acquire(&self, addr: &str, c: &Connector) -> Result<Conn, ProxyError> {
        self.acquire_by(addr, c, None, None).await
    }

    /// [`Pool::acquire`] within `limit` (the connect timeout) when given, and never past `by`
    /// (the request's own deadline, the route's backend timeout): a new connection that is not
    /// open by the earlier of `limit` after its connect began and `by` fails with
    /// [`ProxyError::ConnectTimeout`]; a request waiting for an HTTP/2 connection another
    /// request opens fails with [`ProxyError::ConnectWaited`] (at that earlier time, or at once
    /// when that opening fails), which does not count against the endpoint: its opener's error
    /// does, once. A waiting request that becomes an opener (the one it waited for went away)
    /// takes at most twice `limit`, and still ends by `by` (session 21's review, M2-2). A pooled
    /// connection needs no clock.
    pub async fn acquire_by(
        &self,
        addr: &str,
        c: &Connector,
        limit: Option<Duration>,
        by: Option<tokio::time::Instant>,
    ) -> Result<Conn, ProxyError> {
        if c.is_h2() {
            return self.acquire_h2(addr, c, limit, by).await;
        }
        if let Some(conn) = self.take_pooled(c) {
            return Ok(conn);
        }
        self.open_h1_by(addr, c, limit, by).await
    }

    /// A new HTTP/1.1 connection, never a pooled one, bounded as [`Pool::acquire_by`] bounds
    /// its connect: the try after a pooled connection turned out closed by the backend (its
    /// other idle connections, as old, are as likely closed: a backend that restarted).
    pub async fn open_h1_by(
        &self,
        addr: &str,
        c: &Connector,
        limit: Option<Duration>,
        by: Option<tokio::time::Instant>,
    ) -> Result<Conn, ProxyError> {
        let (deadline, limit) = deadline_from(tokio::time::Instant::now(), limit, by);
        match within(deadline, limit, addr, connect_boxed(addr, c, &self.open)).await? {
            Opened::H1(s) => Ok(Conn {
                sender: Sender::H1(s),
                reused: false,
            }),
            Opened::H2(_) | Opened::H2s(_) => unreachable!("h1 connector opened h2"),
        }
    }

    /// A pooled connection to use at once, without a wait or a connect: a stream on an open
    /// HTTP/2 connection with room, or an idle HTTP/1.1 connection; what [`Pool::acquire_by`]
    /// looks for first. A caller that finds one builds no acquire future: its unstarted
    /// state (~870 bytes in a release build) was copied into every request's future before
    /// its first poll.
    pub fn take_pooled(&self, c: &Connector) -> Option<Conn> {
        if c.is_h2() {
            return Pool::take_h2_stream(&mut self.h2_list(), c.h2_client);
        }
        self.checkout_h1().map(|conn| Conn {
            sender: Sender::H1(conn),
            reused: true,
        })
    }

    fn checkout_h1(&self) -> Option<H1Conn> {
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
            let mut i = i;
            if !i.conn.is_closed() {
                return Some(i.conn);
            }
        }
        None
    }

    /// Puts a connection that is ready for its next request on the idle list, within the
    /// demand and the hard bound; starts the list's trimming task if none runs.
    fn checkin_h1(self: &Arc<Self>, conn: H1Conn) {
        let max = self.max_idle.load(Ordering::Relaxed);
        if max == 0 {
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
        idle.conns.push_back(Idle { conn, since: now });
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
        idle.conns.retain_mut(|i| !i.conn.is_closed());
        idle.trim(now.checked_sub(IDLE_TIMEOUT), keep);
        if idle.conns.is_empty() {
            idle.reaping = false;
            return false;
        }
        true
    }

    /// A stream on the least loaded of the open HTTP/2 connections of `client` with room.
    fn take_h2_stream(list: &mut H2List, client: Http2Client) -> Option<Conn> {
        let conns = &mut list.conns;
        // Those of the other client (`limits.http2_client` changed) are let go: each closes
        // once its streams are done.
        conns.retain(|c| !c.sender.is_closed() && c.sender.client() == client);
        // The least loaded of those with room (each has its own limit).
        let c = conns
            .iter()
            .filter(|c| {
                c.sender.is_ready() && c.streams.load(Ordering::Acquire) < c.sender.max_streams()
            })
            .min_by_key(|c| c.streams.load(Ordering::Acquire))?;
        c.streams.n.fetch_add(1, Ordering::AcqRel);
        Some(Conn {
            sender: c.sender.clone().sender(StreamGuard(c.streams.clone())),
            reused: true,
        })
    }

    fn h2_list(&self) -> std::sync::MutexGuard<'_, H2List> {
        self.h2.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stream to `addr`: on an open connection with room, else on a connection opened for
    /// it, or for it and others. Openings run in parallel, as many as the requests waiting
    /// need ([`H2List::needs_another`]: 1,000 requests arriving at once to a backend allowing
    /// 100 streams per connection open 10 connections at once, not one after the other, and
    /// not 1,000), with the open ones at most [`H2_MAX_CONNS`]; past that, and with no opening
    /// left to wait for, a request fails at once with [`ProxyError::LocalOverload`]. A
    /// request that opens a connection gets its first stream; the others wait until an
    /// opening ends, then look again. When an opening fails, the requests waiting then open no
    /// more connections themselves: each takes a stream that is free or frees up from the
    /// other openings still under way, and fails with the failure
    /// ([`ProxyError::ConnectWaited`]: it counts once, against its opener) when none is left;
    /// when its opener gives up (the request was dropped) another request opens one.
    async fn acquire_h2(
        &self,
        addr: &str,
        c: &Connector,
        limit: Option<Duration>,
        by: Option<tokio::time::Instant>,
    ) -> Result<Conn, ProxyError> {
        let mut deadline = None;
        // Set once an opening failed while this request waited: from then on it opens none
        // itself, and fails with that failure only when no stream is free and no other
        // opening is left under way (one failed handshake out of several in flight must not
        // fail every request waiting for the others).
        let mut failed_while_waiting = false;
        loop {
            // Enabled under the lock below when the request waits, so that every wake from
            // then on reaches it: a freed stream's notify_one before its first poll would
            // otherwise be one stored permit, and a second such wake in that gap would be lost
            // (a request asleep beside a free stream; session 21's review, M2-1).
            let mut notified = std::pin::pin!(self.h2_wake.notify.notified());
            let wait = {
                let mut list = self.h2_list();
                if let Some(conn) = Pool::take_h2_stream(&mut list, c.h2_client) {
                    return Ok(conn);
                }
                let open = self.open.load(Ordering::Acquire);
                if failed_while_waiting && list.connecting == 0 {
                    return Err(ProxyError::ConnectWaited {
                        addr: addr.to_string(),
                        after: list.timed_out,
                    });
                }
                // Demand, not a wake: a waiting request dropped meanwhile lowers the count
                // without the lock, and a count read just before its drop is as good as one
                // read after it (the drop could have come after this decision).
                let waiting = self.h2_wake.waiting.load(Ordering::Relaxed);
                if !failed_while_waiting
                    && open + list.connecting < H2_MAX_CONNS
                    && list.needs_another(waiting)
                {
                    list.connecting += 1;
                    None
                } else if list.connecting == 0 {
                    // Our own bound, not the endpoint's failure: nothing is sent, nothing is
                    // ejected.
                    return Err(ProxyError::LocalOverload {
                        addr: addr.to_string(),
                        reason: "every HTTP/2 connection the pool may hold to the endpoint is full",
                    });
                } else {
                    // Counted and its guard built together, under the lock: whatever ends
                    // the request from here on (a return, a panic, a drop) uncounts it.
                    let waiting = Waiting::count(self);
                    // Enabled under the lock: an opening ending after it wakes it, and so does
                    // each freed stream (one notify_one each).
                    notified.as_mut().enable();
                    // A second look, now that a stream freed from here on wakes it (the
                    // guard's lock-free side: see StreamGuard's drop).
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if let Some(conn) = Pool::take_h2_stream(&mut list, c.h2_client) {
                        return Ok(conn);
                    }
                    Some((list.failures, waiting))
                }
            };
            let Some((failures, waiting)) = wait else {
                // A connect has the whole limit, also when its request waited first (its
                // opener went away): a timeout counted against the endpoint is then one the
                // endpoint took, not the rest of a wait (session 20's review, P2). Such a
                // request waits and connects for at most twice the limit, and never past `by`.
                let (connect_by, limit) = deadline_from(tokio::time::Instant::now(), limit, by);
                return self.open_h2(addr, c, connect_by, limit).await;
            };
            // The clock of the waits starts when the request first has to wait.
            let deadline = *deadline
                .get_or_insert_with(|| deadline_from(tokio::time::Instant::now(), limit, by).0);
            let woken = match deadline {
                Some(d) => tokio::time::timeout_at(d, notified).await.is_ok(),
                None => {
                    notified.await;
                    true
                }
            };
            drop(waiting);
            if !woken {
                return Err(ProxyError::ConnectWaited {
                    addr: addr.to_string(),
                    after: limit,
                });
            }
            if self.h2_list().failures != failures {
                failed_while_waiting = true;
            }
        }
    }

    /// Opens an HTTP/2 connection (counted in `connecting` by the caller) and takes its first
    /// stream; waiting requests are woken when it ends, whichever way.
    async fn open_h2(
        &self,
        addr: &str,
        c: &Connector,
        deadline: Option<tokio::time::Instant>,
        limit: Option<Duration>,
    ) -> Result<Conn, ProxyError> {
        let mut opening = Opening {
            pool: self,
            ended: false,
        };
        let sender = match within(deadline, limit, addr, connect_boxed(addr, c, &self.open)).await {
            Ok(Opened::H2(s)) => H2Sender::Hyper(s),
            Ok(Opened::H2s(s)) => H2Sender::Sweety(s),
            Ok(Opened::H1(_)) => unreachable!("h2 connector opened h1"),
            Err(e) => {
                let timed_out = match &e {
                    ProxyError::ConnectTimeout { after, .. } => Some(*after),
                    _ => None,
                };
                opening.end(Err(timed_out));
                return Err(e);
            }
        };
        let streams = Arc::new(Streams {
            n: AtomicUsize::new(1),
            wake: self.h2_wake.clone(),
        });
        opening.end(Ok(H2Conn {
            sender: sender.clone(),
            streams: streams.clone(),
        }));
        Ok(Conn {
            sender: sender.sender(StreamGuard(streams)),
            reused: false,
        })
    }
}

/// The earlier of `limit` from `now` and `by`, with the time from `now` to it (what a
/// [`ProxyError::ConnectTimeout`] reports).
fn deadline_from(
    now: tokio::time::Instant,
    limit: Option<Duration>,
    by: Option<tokio::time::Instant>,
) -> (Option<tokio::time::Instant>, Option<Duration>) {
    let d = match (limit.map(|l| now + l), by) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    (d, d.map(|d| d.saturating_duration_since(now)))
}

/// Bounds `connect` by `deadline` (a [`ProxyError::ConnectTimeout`] after `limit`).
async fn within<F, T>(
    deadline: Option<tokio::time::Instant>,
    limit: Option<Duration>,
    addr: &str,
    connect: F,
) -> Result<T, ProxyError>
where
    F: std::future::Future<Output = Result<T, ProxyError>>,
{
    match deadline {
        None => connect.await,
        Some(d) => tokio::time::timeout_at(d, connect)
            .await
            .unwrap_or_else(|_| {
                Err(ProxyError::ConnectTimeout {
                    addr: addr.to_string(),
                    after: limit.unwrap_or_default(),
                })
            }),
    }
}

/// One request waiting for an HTTP/2 opening or a freed stream, counted in
/// [`H2Wake::waiting`] while it lives (a dropped request no longer counts). Its drop takes
/// no lock: the count only sizes the openings ([`H2List::needs_another`]) and tells a freed
/// stream whether to wake anyone, and neither needs it lowered under the lock.
/// Built only by [`Waiting::count`], which counts it: the count and its guard come
/// together.
struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    /// Counts one more request waiting in `pool`, until the guard returned is dropped.
    fn count(pool: &'a Pool) -> Self {
        pool.h2_wake.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(pool)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.h2_wake.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One HTTP/2 opening, counted in [`H2List::connecting`] until it ends: opened (the connection
/// joins the list), failed ([`Opening::end`] with an error: a failure the waiting requests
/// share) or dropped unfinished (its request went away: the waiting requests look again, one
/// of them opens). The waiting requests are woken in every case.
struct Opening<'a> {
    pool: &'a Pool,
    ended: bool,
}

impl Opening<'_> {
    /// Ends the opening with the connection opened, or failed (`Err`: with the limit that
    /// elapsed when it timed out).
    fn end(&mut self, outcome: Result<H2Conn, Option<Duration>>) {
        self.ended = true;
        {
            let mut list = self.pool.h2_list();
            list.connecting -= 1;
            match outcome {
                Ok(conn) => {
                    list.per_conn = conn.sender.max_streams().max(1);
                    list.conns.push(conn);
                }
                Err(timed_out) => {
                    list.failures += 1;
                    list.timed_out = timed_out;
                }
            }
        }
        self.pool.h2_wake.notify.notify_waiters();
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.pool.h2_list().connecting -= 1;
            self.pool.h2_wake.notify.notify_waiters();
        }
    }
}

impl Conn {
    /// Sends the request `head` describes with `body` to `addr` (over TLS: `tls`) and waits
    /// for the response head. An HTTP/1.1 connection goes back to `pool` once the response
    /// was read whole (see the module docs); the returned guard (HTTP/2) must live as long as
    /// the response body.
    pub(super) async fn send_head(
        self,
        pool: &Arc<Pool>,
        head: &Head,
        body: Body,
        addr: &str,
        tls: bool,
    ) -> Result<(Response<UpstreamBody>, Option<StreamGuard>), SendError> {
        match self.sender {
            Sender::H1(conn) => {
                let fallback;
                let host = match &head.host {
                    Some(h) => Some(h),
                    None => {
                        fallback = HeaderValue::from_str(addr).ok();
                        fallback.as_ref()
                    }
                };
                let req = h1::RequestHead {
                    method: &head.method,
                    target: head.uri.path_and_query().map_or("/", |p| p.as_str()),
                    host,
                    headers: &head.headers,
                    extra: Some(&head.forwarding),
                };
                // `send_h1`'s body, inline: one future less nested on every HTTP/1.1 request
                // (each level keeps its own copy of the connection and the head).
                conn.send(req, body, Checkin(pool.clone()))
                    .await
                    .map(|resp| (resp.map(UpstreamBody::H1), None))
                    .map_err(h1_send_error)
            }
            Sender::H2(s, guard) => send_h2(s, guard, head.build(body, addr, true, tls)).await,
            Sender::H2s(s, guard) => {
                let headers = head.map();
                let authority = match &head.host {
                    Some(h) if is_authority(h) => h.as_bytes(),
                    _ => addr.as_bytes(),
                };
                let req = h2s::core::RequestHead {
                    method: &head.method,
                    scheme: if tls { "https" } else { "http" },
                    authority,
                    path: head.uri.path_and_query().map_or("/", |p| p.as_str()),
                    headers: &headers,
                };
                send_h2s(&s, guard, req, body).await
            }
        }
    }

    /// Sends `req` as it is (origin-form target and its own `Host` over HTTP/1.1) and waits
    /// for the response head, as [`Conn::send_head`] does.
    pub async fn send(
        self,
        pool: &Arc<Pool>,
        req: http::Request<Body>,
    ) -> Result<(Response<UpstreamBody>, Option<StreamGuard>), SendError> {
        match self.sender {
            Sender::H1(conn) => {
                let (parts, body) = req.into_parts();
                let req = h1::RequestHead {
                    method: &parts.method,
                    target: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
                    host: None,
                    headers: &parts.headers,
                    extra: None,
                };
                send_h1(conn, pool, req, body).await
            }
            Sender::H2(s, guard) => send_h2(s, guard, req).await,
            Sender::H2s(s, guard) => {
                let (parts, body) = req.into_parts();
                let authority = match (parts.uri.authority(), parts.headers.get(http::header::HOST))
                {
                    (Some(a), _) => a.as_str().as_bytes(),
                    (None, Some(h)) => h.as_bytes(),
                    (None, None) => b"",
                };
                let req = h2s::core::RequestHead {
                    method: &parts.method,
                    scheme: parts.uri.scheme_str().unwrap_or("http"),
                    authority,
                    path: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
                    headers: &parts.headers,
                };
                send_h2s(&s, guard, req, body).await
            }
        }
    }
}

/// Whether a Host value can be an HTTP/2 `:authority` (else the endpoint address is sent,
/// as for hyper's client, whose request URI needs one).
fn is_authority(h: &HeaderValue) -> bool {
    h.to_str()
        .is_ok_and(|s| s.parse::<http::uri::Authority>().is_ok())
}

async fn send_h2s(
    s: &h2s::SendRequest,
    guard: StreamGuard,
    req: h2s::core::RequestHead<'_>,
    body: Body,
) -> Result<(Response<UpstreamBody>, Option<StreamGuard>), SendError> {
    let failed = |e: h2s::SendError| SendError {
        error: e.error.into(),
        unsent: e.unsent,
        closed_before_response: e.closed_before_response,
    };
    let pending = s.send(req, body).map_err(failed)?;
    match pending.await {
        Ok(resp) => Ok((resp.map(UpstreamBody::H2s), Some(guard))),
        Err(e) => Err(failed(e)),
    }
}

async fn send_h1(
    conn: H1Conn,
    pool: &Arc<Pool>,
    req: h1::RequestHead<'_>,
    body: Body,
) -> Result<(Response<UpstreamBody>, Option<StreamGuard>), SendError> {
    conn.send(req, body, Checkin(pool.clone()))
        .await
        .map(|resp| (resp.map(UpstreamBody::H1), None))
        .map_err(h1_send_error)
}

/// A failed HTTP/1.1 send as the pool's [`SendError`].
fn h1_send_error(e: h1::SendError<Body>) -> SendError {
    SendError {
        closed_before_response: e.error.is_disconnect() && !e.response_started,
        error: e.error.into(),
        unsent: e.unsent.map(crate::body::boxed),
    }
}

async fn send_h2(
    mut s: http2::SendRequest<Body>,
    guard: StreamGuard,
    req: http::Request<Body>,
) -> Result<(Response<UpstreamBody>, Option<StreamGuard>), SendError> {
    if let Err(error) = s.ready().await {
        return Err(SendError {
            closed_before_response: false,
            error: error.into(),
            unsent: Some(req.into_body()),
        });
    }
    match s.try_send_request(req).await {
        Ok(resp) => Ok((resp.map(UpstreamBody::H2), Some(guard))),
        Err(mut e) => {
            let request = e.take_message();
            let error = e.into_error();
            Err(SendError {
                closed_before_response: error.is_incomplete_message() || error.is_canceled(),
                error: error.into(),
                unsent: request.map(http::Request::into_body),
            })
        }
    }
}

enum Opened {
    H1(H1Conn),
    H2(http2::SendRequest<Body>),
    H2s(h2s::SendRequest),
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

/// [`connect`] in its own allocation. Opening a connection (TCP, TLS, the HTTP/2 handshake)
/// is the cold path of a request, and its future is several KiB: held inline, it made every
/// request's forward future that large, and every request wrote and copied (moved) it.
fn connect_boxed<'a>(
    addr: &'a str,
    c: &'a Connector,
    open: &'a Arc<AtomicUsize>,
) -> Pin<Box<impl std::future::Future<Output = Result<Opened, ProxyError>> + Send + 'a>> {
    sweety_h2::box_in_place(|| connect(addr, c, open))
}

/// A new connection to `addr`, counted in `open` while it lives.
async fn connect(addr: &str, c: &Connector, open: &Arc<AtomicUsize>) -> Result<Opened, ProxyError> {
    let tcp = connect_tcp(addr, c.external)
        .await
        .map_err(|e| ProxyError::Connect {
            addr: addr.to_string(),
            source: e.into(),
        })?;
    match &c.tls {
        None if c.is_h2() && c.h2_client == Http2Client::Sweety => {
            h2s_handshake(addr, tcp, c, open).await
        }
        None if c.is_h2() => h2_handshake(addr, TokioIo::new(tcp), c, open).await,
        None => Ok(Opened::H1(h1_conn(Stream::Tcp(tcp), c, open))),
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
            if c.is_h2() && c.h2_client == Http2Client::Sweety {
                h2s_handshake(addr, stream, c, open).await
            } else if c.is_h2() {
                h2_handshake(addr, TokioIo::new(stream), c, open).await
            } else {
                Ok(Opened::H1(h1_conn(Stream::Tls(Box::new(stream)), c, open)))
            }
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

/// An HTTP/1.1 connection over `stream`, counted in `open` while it lives. Its read buffer
/// (what it reads ahead of the client, and the response head's bound) holds at most
/// `c.read_ahead` bytes; a body piece leaves it only when the body is polled.
fn h1_conn(stream: Stream, c: &Connector, open: &Arc<AtomicUsize>) -> H1Conn {
    let read_ahead = (c.read_ahead as usize).max(sweety_config::MIN_PROXY_READ_AHEAD as usize);
    h1::Conn::new(
        BackendIo {
            stream,
            _open: OpenGuard::new(open),
        },
        read_ahead,
    )
}

/// hyper's HTTP/2 client handshake on a connected stream. Each stream's window is
/// `c.read_ahead` (what the backend may send ahead of the client), re-opened as the body is
/// taken.
async fn h2_handshake<T>(
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
    // The HTTP/2 window cannot pass 2^31-1.
    let read_ahead = (c.read_ahead as usize).max(sweety_config::MIN_PROXY_READ_AHEAD as usize);
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(read_ahead.min(i32::MAX as usize) as u32)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .handshake::<_, Body>(io)
        .await
        .map_err(err)?;
    spawn_h2_conn(open, conn);
    Ok(Opened::H2(sender))
}

/// Runs an HTTP/2 connection's task (hyper's or Sweety's), counted open while it runs.
fn spawn_h2_conn<F, E>(open: &Arc<AtomicUsize>, conn: F)
where
    F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    let counted = OpenGuard::new(open);
    tokio::spawn(async move {
        let _counted = counted;
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream h2 connection ended");
        }
    });
}

/// Sweety's HTTP/2 client handshake on a connected stream (preface out, the backend's
/// SETTINGS in); the connection's task is spawned, counted open while it runs. Each stream's
/// window is `c.read_ahead` (what the backend may send ahead of the client), re-opened as
/// the body is taken; the connection's is that for every stream the pool puts on it; a
/// response head may hold `c.read_ahead` octets of fields, 16 KiB to 64 KiB (a head is not
/// a body: a large read-ahead does not make large heads welcome).
async fn h2s_handshake<T>(
    addr: &str,
    io: T,
    c: &Connector,
    open: &Arc<AtomicUsize>,
) -> Result<Opened, ProxyError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let read_ahead = c.read_ahead.max(sweety_config::MIN_PROXY_READ_AHEAD);
    let cfg = h2s::core::Config {
        stream_window: read_ahead,
        conn_window: read_ahead.saturating_mul(H2_MAX_STREAMS as u32),
        max_header_list: read_ahead.clamp(16 * 1024, 64 * 1024),
    };
    let (sender, conn) = h2s::handshake(io, cfg)
        .await
        .map_err(|e| ProxyError::Connect {
            addr: addr.to_string(),
            source: e.into(),
        })?;
    spawn_h2_conn(open, conn);
    Ok(Opened::H2s(sender))
}

/// The sizes of this module's futures on the request path (bytes), for
/// `proxy::tests::request_path_futures_stay_small`.
#[cfg(test)]
pub(super) fn future_sizes() -> Vec<(&'static str, usize)> {
    use super::returned::*;
    vec![
        ("Pool::acquire_by", of5(&Pool::acquire_by)),
        ("Pool::acquire_h2", of5(&Pool::acquire_h2)),
        ("Pool::open_h2", of5(&Pool::open_h2)),
        ("pool::connect", of3(&connect)),
        ("pool::connect_tls", of4(&connect_tls)),
        (
            "pool::h2_handshake",
            of4(&h2_handshake::<TokioIo<TcpStream>>),
        ),
        ("pool::h2s_handshake", of4(&h2s_handshake::<TcpStream>)),
        ("Conn::send_head", of6(&Conn::send_head)),
        ("pool::send_h1", of4(&send_h1)),
        ("pool::send_h2", of3(&send_h2)),
        ("pool::send_h2s", of4(&send_h2s)),
        ("h1::Conn::send", of4(&H1Conn::send::<Body, Checkin>)),
        (
            "h2s::ResponseFuture",
            std::mem::size_of::<h2s::ResponseFuture>(),
        ),
        ("Conn", std::mem::size_of::<Conn>()),
        ("UpstreamBody", std::mem::size_of::<UpstreamBody>()),
        (
            "h1::ResponseBody",
            std::mem::size_of::<h1::ResponseBody<BackendIo, Body, Checkin>>(),
        ),
        (
            "h2s::ResponseBody",
            std::mem::size_of::<h2s::ResponseBody>(),
        ),
        ("hyper Incoming", std::mem::size_of::<Incoming>()),
        ("SendError", std::mem::size_of::<SendError>()),
        ("ProxyError", std::mem::size_of::<ProxyError>()),
    ]
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
            h2_client: Http2Client::default(),
        };
        let mut conns = Vec::new();
        for _ in 0..n {
            conns.push(pool.acquire(addr, &c).await.unwrap());
        }
        let head = Head {
            method: http::Method::GET,
            uri: http::Uri::from_static("/"),
            headers: http::HeaderMap::new(),
            host: Some(HeaderValue::from_static("b")),
            forwarding: Default::default(),
        };
        for conn in conns {
            let (resp, _) = conn
                .send_head(pool, &head, crate::body::empty(), addr, false)
                .await
                .unwrap();
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

    /// Real sockets: an h2c backend whose SETTINGS allow no stream. Its connections are
    /// closing (not reused); the pool opens at most H2_MAX_CONNS of them, then fails at once.
    #[tokio::test]
    async fn a_backend_allowing_no_h2_stream_gets_a_bounded_number_of_connections() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    // SETTINGS: MAX_CONCURRENT_STREAMS (3) = 0; then read until the end.
                    let settings = [0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0];
                    if s.write_all(&settings).await.is_err() {
                        return;
                    }
                    let mut chunk = [0u8; 1024];
                    while matches!(s.read(&mut chunk).await, Ok(n) if n > 0) {}
                });
            }
        });
        let c = super::h2_open_tests::h2c();
        let pool = Arc::new(Pool::new(8));
        let mut held = Vec::new();
        let mut failed = None;
        for _ in 0..H2_MAX_CONNS + 8 {
            match pool.acquire(&addr, &c).await {
                Ok(conn) => {
                    assert!(!conn.reused);
                    held.push(conn);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        assert_eq!(held.len(), H2_MAX_CONNS);
        let e = failed.expect("the cap");
        assert!(matches!(e, ProxyError::LocalOverload { .. }), "{e:?}");
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
mod h2_client_tests {
    use super::*;

    /// An h2c backend (hyper's server) answering 200 with no body.
    async fn h2c_backend() -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_r| async {
                        Ok::<_, std::convert::Infallible>(Response::new(crate::body::empty()))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        addr
    }

    /// A pool whose connector's client changes (`limits.http2_client` reloaded) serves with
    /// the new client at once and lets the other's connections go: they close.
    #[tokio::test]
    async fn a_pool_lets_its_connections_of_the_other_client_go() {
        let addr = h2c_backend().await;
        let pool = Arc::new(Pool::new(8));
        let head = Head {
            method: http::Method::GET,
            uri: http::Uri::from_static("/"),
            headers: http::HeaderMap::new(),
            host: Some(HeaderValue::from_static("b.test")),
            forwarding: Default::default(),
        };
        let run = async {
            for client in [Http2Client::Sweety, Http2Client::Hyper, Http2Client::Sweety] {
                let c = Connector {
                    protocol: BackendProtocol::H2c,
                    tls: None,
                    sni: None,
                    external: false,
                    read_ahead: sweety_config::DEFAULT_PROXY_READ_AHEAD,
                    h2_client: client,
                };
                let conn = pool.acquire(&addr, &c).await.unwrap();
                let kind = match &conn.sender {
                    Sender::H2(..) => Http2Client::Hyper,
                    Sender::H2s(..) => Http2Client::Sweety,
                    Sender::H1(_) => panic!("an h2c connector gave HTTP/1.1"),
                };
                assert_eq!(kind, client);
                let (resp, _guard) = conn
                    .send_head(&pool, &head, crate::body::empty(), &addr, false)
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                drop(resp);
                assert!(pool
                    .h2
                    .lock()
                    .unwrap()
                    .conns
                    .iter()
                    .all(|h| h.sender.client() == client));
            }
            // The two let go closed: one connection open, idle.
            while pool.connections() != (0, 1) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), run)
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

#[cfg(test)]
mod h2_open_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::watch;

    /// What the raw h2c backend of these tests does with a connection once its gate opens.
    #[derive(Clone, Copy)]
    enum Answer {
        /// SETTINGS (MAX_CONCURRENT_STREAMS = `n` when given), then reads until the end.
        Settings(Option<u32>),
        /// Closes the connection before any frame: the handshake fails.
        Close,
    }

    /// A raw h2c backend counting the connections it accepted; each waits for the gate
    /// (`true`) before it answers (never, while the gate stays shut).
    async fn gated_backend(answer: Answer) -> (String, Arc<AtomicUsize>, watch::Sender<bool>) {
        let (gate, rx) = watch::channel(false);
        let (addr, accepted) = backend_of(vec![(answer, rx)]).await;
        (addr, accepted, gate)
    }

    /// A raw h2c backend counting the connections it accepted: the `k`th (from 0) waits for
    /// the gate of `answers[k]` (the last one's, past the end) to be `true`, then answers as
    /// it says.
    async fn backend_of(
        answers: Vec<(Answer, watch::Receiver<bool>)>,
    ) -> (String, Arc<AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let k = count.fetch_add(1, Ordering::SeqCst);
                let (answer, mut rx) = answers[k.min(answers.len() - 1)].clone();
                tokio::spawn(async move {
                    if rx.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    let mut settings = vec![0, 0, 0, 4, 0, 0, 0, 0, 0];
                    match answer {
                        Answer::Close => return,
                        Answer::Settings(None) => {}
                        Answer::Settings(Some(n)) => {
                            settings[2] = 6;
                            settings.extend_from_slice(&[0, 3]);
                            settings.extend_from_slice(&n.to_be_bytes());
                        }
                    }
                    if s.write_all(&settings).await.is_err() {
                        return;
                    }
                    let mut chunk = [0u8; 1024];
                    while matches!(s.read(&mut chunk).await, Ok(n) if n > 0) {}
                });
            }
        });
        (addr, accepted)
    }

    /// An h2c connector on Sweety's client.
    pub(super) fn h2c() -> Connector {
        Connector {
            protocol: BackendProtocol::H2c,
            tls: None,
            sni: None,
            external: false,
            read_ahead: sweety_config::DEFAULT_PROXY_READ_AHEAD,
            h2_client: Http2Client::Sweety,
        }
    }

    /// `n` requests asking `pool` for a stream at once, each on a task of its own.
    fn ask(
        pool: &Arc<Pool>,
        addr: &str,
        n: usize,
        limit: Option<Duration>,
    ) -> Vec<tokio::task::JoinHandle<Result<Conn, ProxyError>>> {
        (0..n)
            .map(|_| {
                let (pool, addr) = (pool.clone(), addr.to_string());
                tokio::spawn(async move { pool.acquire_by(&addr, &h2c(), limit, None).await })
            })
            .collect()
    }

    /// The requests of `pool` waiting for a stream.
    fn waiting_of(pool: &Pool) -> usize {
        pool.h2_wake.waiting.load(Ordering::SeqCst)
    }

    /// Yields until the pool has `connecting` openings in flight and `waiting` requests
    /// waiting for them.
    async fn until(pool: &Pool, connecting: usize, waiting: usize) {
        loop {
            {
                let list = pool.h2_list();
                if (list.connecting, waiting_of(pool)) == (connecting, waiting) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn bounded<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
        tokio::time::timeout(Duration::from_secs(30), f)
    }

    /// Runs a test's `run` within [`bounded`], then checks that the backend accepted
    /// `connections`.
    async fn finish(
        run: impl std::future::Future<Output = ()>,
        accepted: &AtomicUsize,
        connections: usize,
    ) {
        bounded(run).await.expect("bounded");
        assert_eq!(accepted.load(Ordering::SeqCst), connections);
    }

    /// What `asks` got: the connections served and the errors.
    async fn outcomes(
        asks: Vec<tokio::task::JoinHandle<Result<Conn, ProxyError>>>,
    ) -> (Vec<Conn>, Vec<ProxyError>) {
        let (mut held, mut errors) = (Vec::new(), Vec::new());
        for a in asks {
            match a.await.unwrap() {
                Ok(conn) => held.push(conn),
                Err(e) => errors.push(e),
            }
        }
        (held, errors)
    }

    /// The one error of `errors` counted against the endpoint (a failed opening counts once).
    fn counted_once(errors: &[ProxyError]) -> &ProxyError {
        let counted: Vec<_> = errors.iter().filter(|e| e.is_endpoint_failure()).collect();
        assert_eq!(counted.len(), 1, "{errors:?}");
        counted[0]
    }

    /// 250 requests at once to an endpoint with no connection open yet: 3 connections of up
    /// to 100 streams are opened at once (not one after the other, not one per request) and
    /// carry all 250.
    #[tokio::test]
    async fn a_burst_opens_the_connections_it_needs_at_once() {
        let (addr, accepted, gate) = gated_backend(Answer::Settings(None)).await;
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let asks = ask(&pool, &addr, 250, None);
            until(&pool, 3, 247).await;
            // All three are connected before any handshake ends: in parallel.
            while accepted.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            gate.send_replace(true);
            let mut conns = Vec::new();
            for a in asks {
                conns.push(a.await.unwrap().unwrap());
            }
            assert_eq!(conns.iter().filter(|c| !c.reused).count(), 3);
            let list = pool.h2_list();
            assert_eq!((list.connecting, waiting_of(&pool)), (0, 0));
            let streams: Vec<usize> = list
                .conns
                .iter()
                .map(|c| c.streams.load(Ordering::SeqCst))
                .collect();
            assert_eq!(streams.iter().sum::<usize>(), 250, "{streams:?}");
            assert!(streams.iter().all(|&n| n <= H2_MAX_STREAMS), "{streams:?}");
        };
        finish(run, &accepted, 3).await;
    }

    /// A backend allowing one stream per connection: 200 requests at once get at most
    /// H2_MAX_CONNS connections, however the openings interleave; the rest fail with the
    /// local overload (503, never counted against the endpoint).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_openings_never_pass_the_cap() {
        let (addr, accepted, gate) = gated_backend(Answer::Settings(Some(1))).await;
        gate.send_replace(true);
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let (mut held, mut overloaded) = (Vec::new(), 0);
            for a in ask(&pool, &addr, 200, Some(Duration::from_secs(20))) {
                match a.await.unwrap() {
                    Ok(c) => held.push(c),
                    Err(e) => {
                        assert!(matches!(e, ProxyError::LocalOverload { .. }), "{e:?}");
                        assert!(!e.is_endpoint_failure());
                        overloaded += 1;
                    }
                }
            }
            assert_eq!((held.len(), overloaded), (H2_MAX_CONNS, 200 - H2_MAX_CONNS));
            assert_eq!(pool.h2_list().connecting, 0);
        };
        finish(run, &accepted, H2_MAX_CONNS).await;
    }

    /// A failed opening fails the requests waiting for it with it, and counts once: its
    /// opener's error is the endpoint's failure, the 49 others' are not.
    #[tokio::test]
    async fn a_failed_opening_counts_once() {
        let (addr, accepted, gate) = gated_backend(Answer::Close).await;
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let asks = ask(&pool, &addr, 50, Some(Duration::from_secs(20)));
            until(&pool, 1, 49).await;
            gate.send_replace(true);
            let (held, errors) = outcomes(asks).await;
            assert!(held.is_empty());
            assert!(matches!(counted_once(&errors), ProxyError::Connect { .. }));
            for e in errors.iter().filter(|e| !e.is_endpoint_failure()) {
                assert!(
                    matches!(e, ProxyError::ConnectWaited { after: None, .. }),
                    "{e:?}"
                );
                assert_eq!(e.status(), 502);
                assert!(e.request_not_sent());
            }
        };
        finish(run, &accepted, 1).await;
    }

    /// Two openings in flight for 150 requests; the first handshake fails while the second is
    /// still under way: the requests waiting take the second connection's streams (100) and
    /// only those it cannot carry fail with the failure, uncounted (session 20's review, P1:
    /// every waiter failed with the first failure, 148 502s beside a connection about to open).
    #[tokio::test]
    async fn one_failed_opening_of_two_fails_only_what_the_other_cannot_carry() {
        let (first, first_rx) = watch::channel(false);
        let (second, second_rx) = watch::channel(false);
        // The first connection closes: its handshake fails.
        let (addr, accepted) = backend_of(vec![
            (Answer::Close, first_rx),
            (Answer::Settings(None), second_rx),
        ])
        .await;
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let asks = ask(&pool, &addr, 150, Some(Duration::from_secs(20)));
            until(&pool, 2, 148).await;
            while accepted.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            first.send_replace(true);
            until(&pool, 1, 148).await;
            second.send_replace(true);
            let (held, errors) = outcomes(asks).await;
            assert_eq!(held.len(), 100, "{errors:?}");
            assert!(matches!(counted_once(&errors), ProxyError::Connect { .. }));
            let waited = errors
                .iter()
                .filter(|e| matches!(e, ProxyError::ConnectWaited { after: None, .. }))
                .count();
            assert_eq!(waited, 49, "{errors:?}");
        };
        finish(run, &accepted, 2).await;
    }

    /// A slow opening: the waiting requests end at their own connect timeout (a 504 that does
    /// not count), the opener at its own (which does); the requests after them start afresh.
    #[tokio::test]
    async fn a_slow_opening_leaves_no_request_waiting_past_its_timeout() {
        let (addr, accepted, _gate) = gated_backend(Answer::Settings(None)).await;
        let pool = Arc::new(Pool::new(8));
        let limit = Duration::from_millis(300);
        let run = async {
            // An opener with no limit of its own (the caller bounds it): the waiters' clocks
            // end their waits.
            let opener = ask(&pool, &addr, 1, None);
            until(&pool, 1, 0).await;
            for a in ask(&pool, &addr, 10, Some(limit)) {
                let e = a.await.unwrap().expect_err("no connection");
                assert!(
                    matches!(e, ProxyError::ConnectWaited { after: Some(l), .. } if l == limit),
                    "{e:?}"
                );
                assert!(!e.is_endpoint_failure());
                assert_eq!(e.status(), 504);
            }
            assert_eq!(waiting_of(&pool), 0);
            opener.into_iter().for_each(|o| o.abort());
            until(&pool, 0, 0).await;
            // An opener with the limit times out, counted; its waiters fail with it, uncounted.
            let (held, errors) = outcomes(ask(&pool, &addr, 5, Some(limit))).await;
            assert!(held.is_empty());
            let counted = counted_once(&errors);
            assert!(matches!(counted, ProxyError::ConnectTimeout { .. }));
            assert!(errors.iter().all(|e| e.status() == 504), "{errors:?}");
            let list = pool.h2_list();
            assert_eq!((list.connecting, waiting_of(&pool)), (0, 0));
        };
        finish(run, &accepted, 2).await;
    }

    /// A dropped waiting request no longer counts as waiting; a dropped opener lets one of
    /// the waiting requests open instead, and they are served by it.
    #[tokio::test]
    async fn dropped_requests_free_their_places() {
        let (addr, accepted, gate) = gated_backend(Answer::Settings(None)).await;
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let opener = ask(&pool, &addr, 1, None).pop().unwrap();
            until(&pool, 1, 0).await;
            let mut waiters = ask(&pool, &addr, 10, None);
            until(&pool, 1, 10).await;
            for w in waiters.drain(..5) {
                w.abort();
                assert!(w.await.unwrap_err().is_cancelled());
            }
            until(&pool, 1, 5).await;
            opener.abort();
            assert!(opener.await.unwrap_err().is_cancelled());
            // One of the five opens; the four others wait for it.
            until(&pool, 1, 4).await;
            while accepted.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            gate.send_replace(true);
            for w in waiters {
                let served = w.await.unwrap();
                assert!(served.is_ok(), "{:?}", served.err());
            }
            let list = pool.h2_list();
            assert_eq!(
                (list.connecting, waiting_of(&pool), list.conns.len()),
                (0, 0, 1)
            );
        };
        finish(run, &accepted, 2).await;
    }

    /// A request (`limit`, `by`) that waits 9 s for another's opening, whose opener then goes
    /// away, so that it opens a connection itself: returned once the backend accepted that
    /// second connection (its gate still closed).
    async fn opens_after_a_wait(
        pool: &Arc<Pool>,
        addr: &str,
        accepted: &AtomicUsize,
        limit: Duration,
        by: Option<tokio::time::Instant>,
    ) -> tokio::task::JoinHandle<Result<Conn, ProxyError>> {
        let opener = ask(pool, addr, 1, None).pop().unwrap();
        until(pool, 1, 0).await;
        let waiter = {
            let (pool, addr) = (pool.clone(), addr.to_string());
            tokio::spawn(async move { pool.acquire_by(&addr, &h2c(), Some(limit), by).await })
        };
        until(pool, 1, 1).await;
        tokio::time::sleep(Duration::from_secs(9)).await;
        opener.abort();
        until(pool, 1, 0).await;
        while accepted.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        waiter
    }

    /// A request that waited for most of its connect timeout and then opens (its opener went
    /// away) has the whole timeout for its connect: a backend that takes 3 s past the request's
    /// first deadline, within 10 s of the connect, serves it; the spent wait used to end the
    /// connect early and count the timeout against the endpoint (session 20's review, P2).
    /// On tokio's paused clock: the seconds are the test's, not the machine's.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_that_opens_has_the_whole_connect_timeout() {
        let (addr, accepted, gate) = gated_backend(Answer::Settings(None)).await;
        let pool = Arc::new(Pool::new(8));
        let limit = Duration::from_secs(10);
        let run = async {
            let waiter = opens_after_a_wait(&pool, &addr, &accepted, limit, None).await;
            // Past the request's first deadline (10 s after it began to wait).
            tokio::time::sleep(Duration::from_secs(3)).await;
            gate.send_replace(true);
            let served = waiter.await.unwrap();
            assert!(matches!(&served, Ok(c) if !c.reused), "{:?}", served.err());
        };
        finish(run, &accepted, 2).await;
    }

    /// ... and never past the request's own deadline (`by`, the route's backend timeout): the
    /// same waiter with a deadline 12 s after it began, its own connect begun at 9 s, ends at
    /// 12 s with a timeout, where it took until the backend answered at 13 s (session 21's
    /// review, M2-2: up to one more limit past the route's deadline).
    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_that_opens_still_ends_by_its_deadline() {
        let (addr, accepted, gate) = gated_backend(Answer::Settings(None)).await;
        let pool = Arc::new(Pool::new(8));
        let limit = Duration::from_secs(10);
        let run = async {
            let by = tokio::time::Instant::now() + Duration::from_secs(12);
            let waiter = opens_after_a_wait(&pool, &addr, &accepted, limit, Some(by)).await;
            // 13 s after it began: it has ended, before the backend answers.
            tokio::time::sleep(Duration::from_secs(4)).await;
            assert!(waiter.is_finished(), "still connecting past its deadline");
            gate.send_replace(true);
            let ended = waiter.await.unwrap();
            assert!(
                matches!(&ended, Err(ProxyError::ConnectTimeout { after, .. }) if *after <= Duration::from_secs(3)),
                "{:?}",
                ended.as_ref().map(|c| c.reused)
            );
        };
        finish(run, &accepted, 2).await;
    }

    /// A request that panics while it waits is no longer counted as waiting: here a limit
    /// the clock cannot add (its deadline overflows the Instant in deadline_from, the step
    /// between the count and the wait). The count and its guard are built together under the
    /// lock; the guard used to be built after deadline_from, so that such a panic left the
    /// count high for ever, sizing openings and waking for a request gone (session 22's
    /// review, L1-1).
    #[tokio::test]
    async fn a_request_that_panics_while_waiting_is_no_longer_counted() {
        let (addr, accepted, gate) = gated_backend(Answer::Settings(None)).await;
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let opener = ask(&pool, &addr, 1, None).pop().unwrap();
            until(&pool, 1, 0).await;
            let waiter = ask(&pool, &addr, 1, Some(Duration::MAX)).pop().unwrap();
            assert!(waiter.await.unwrap_err().is_panic());
            assert_eq!(waiting_of(&pool), 0);
            gate.send_replace(true);
            let served = opener.await.unwrap();
            assert!(served.is_ok(), "{:?}", served.err());
        };
        finish(run, &accepted, 1).await;
    }

    /// A stream freed on an open connection wakes a request waiting while another opening
    /// hangs: a backend allowing 2 streams per connection, both taken, a third request opens a
    /// connection the backend never answers and a fourth waits for it; the first request's
    /// stream ends and the fourth is served on it (session 20's review, P3: it waited for the
    /// opening, up to its connect timeout; forever here, with none).
    #[tokio::test(start_paused = true)]
    async fn a_freed_stream_wakes_a_waiting_request() {
        let (_open, open_rx) = watch::channel(true);
        let (_shut, shut_rx) = watch::channel(false);
        let (addr, accepted) = backend_of(vec![
            (Answer::Settings(Some(2)), open_rx),
            (Answer::Settings(None), shut_rx),
        ])
        .await;
        let pool = Arc::new(Pool::new(8));
        let run = async {
            let mut first = Vec::new();
            for a in ask(&pool, &addr, 1, None)
                .into_iter()
                .chain(ask(&pool, &addr, 1, None))
            {
                first.push(a.await.unwrap().expect("served"));
            }
            let third = ask(&pool, &addr, 1, None).pop().unwrap();
            until(&pool, 1, 0).await;
            let fourth = ask(&pool, &addr, 1, None).pop().unwrap();
            until(&pool, 1, 1).await;
            drop(first.pop());
            let served = fourth.await.unwrap();
            assert!(matches!(&served, Ok(c) if c.reused), "{:?}", served.err());
            third.abort();
            let _ = third.await;
            until(&pool, 0, 0).await;
        };
        bounded(run)
            .await
            .expect("bounded: the waiting request was woken");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
