//! Per-endpoint connection pools on hyper's low-level client connections.
//!
//! * HTTP/1.1 (`http1`, `https`): keep-alive connections. After a response head arrives a
//!   small task waits until the connection is ready again (response body fully read) and puts
//!   it back on the endpoint's idle list, which is bounded by `max_idle_per_endpoint` (the
//!   oldest is closed first) and expires entries idle longer than [`IDLE_TIMEOUT`] (checked
//!   lazily on checkout and checkin). The most recently used connection is reused first.
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
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sweety_config::BackendProtocol;
use tokio::net::TcpStream;

/// Idle HTTP/1.1 connections older than this are closed instead of reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
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

/// Connections of one endpoint.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<Vec<Idle>>,
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
            idle: Mutex::new(Vec::new()),
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
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
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
        while let Some(i) = idle.pop() {
            if i.since.elapsed() < IDLE_TIMEOUT && !i.sender.is_closed() && i.sender.is_ready() {
                return Some(i.sender);
            }
        }
        None
    }

    fn checkin_h1(&self, sender: http1::SendRequest<Body>) {
        let max = self.max_idle.load(Ordering::Relaxed);
        if max == 0 || sender.is_closed() {
            return;
        }
        let now = Instant::now();
        // Entries from after `cutoff` are younger than IDLE_TIMEOUT: one clock reading for the
        // whole list (reading it per entry cost ~1,500 instructions per request with 100
        // clients' connections pooled).
        let cutoff = now.checked_sub(IDLE_TIMEOUT);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|i| cutoff.is_none_or(|c| i.since > c) && !i.sender.is_closed());
        while idle.len() >= max {
            idle.remove(0);
        }
        idle.push(Idle { sender, since: now });
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
                        let pool = pool.clone();
                        tokio::spawn(async move {
                            if s.ready().await.is_ok() {
                                pool.checkin_h1(s);
                            }
                        });
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
