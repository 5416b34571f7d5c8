//! The listener sockets of the reload side: which bind keys run, binding the ones a new config
//! adds before it is swapped in (TCP; UDP on the same port for HTTP/3; UDP of layer-4
//! listeners), starting their loops ([`crate::listen`]) once it serves, handing kept QUIC
//! endpoints their new TLS and transport config, and draining the removed ones.

use super::build::ListenerBuild;
use super::ApplyError;
use crate::listen::l4::udp::UdpListening;
use crate::listen::quic_socket::QuicSocket;
use crate::listen::tcp::Listening;
use crate::state::{BindKey, Shared, Snapshot, Transport};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use sweety_config::ListenerProtocol;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running layer-4 UDP listener; the reload closes its socket when it is removed (its
/// sessions end on `stop`).
struct RunningUdp {
    local: SocketAddr,
    socket: Arc<UdpListening>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A running TCP listener: the reload holds its socket ([`Listening`]) and closes it itself
/// when the listener is removed, before the reload returns, rather than leaving that to the
/// accept task: under load that task may not run before the next config binds the port
/// (a freed Gateway port is given to another listener at once), which then failed with
/// "address in use" on the dataplane's own socket.
struct RunningTcp {
    local: SocketAddr,
    listening: Arc<Listening>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A running HTTP/3 endpoint. Its socket ([`QuicSocket`]) is shared by its connections, so a
/// removed one keeps it while they drain ([`DrainingQuic`]).
struct RunningQuic {
    local: SocketAddr,
    endpoint: quinn::Endpoint,
    socket: Arc<QuicSocket>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Every running listener socket: TCP, UDP for HTTP/3, and UDP of layer-4 listeners, each
/// by bind key.
#[derive(Default)]
pub(super) struct Sockets {
    tcp: HashMap<BindKey, RunningTcp>,
    udp: HashMap<BindKey, RunningQuic>,
    l4udp: HashMap<BindKey, RunningUdp>,
    /// Removed HTTP/3 endpoints still draining (their tasks not finished when last looked).
    draining_quic: Vec<DrainingQuic>,
}

/// A removed HTTP/3 endpoint whose connections drain on its socket, unless a new config binds
/// an address that contends with it: then [`Sockets::release_udp`] closes the socket before
/// that bind, and the drain (its connections) ends once every bind of the config has
/// succeeded; if the config is rejected, the socket is bound again ([`Closed::Draining`]) and
/// the drain goes on. It holds no endpoint handle: quinn's endpoint (and its receive buffers)
/// goes when its task ends.
struct DrainingQuic {
    local: SocketAddr,
    socket: Arc<QuicSocket>,
    task: JoinHandle<()>,
}

/// The sockets bound for a config that does not serve yet, by bind key: started by
/// [`Sockets::start`] after the swap, closed if the config is rejected before (when it is
/// dropped: the QUIC sockets too, which quinn's endpoint task would otherwise hold until it
/// runs).
#[derive(Default)]
pub(super) struct Fresh {
    tcp: HashMap<BindKey, tokio::net::TcpListener>,
    quic: HashMap<BindKey, (quinn::Endpoint, Arc<QuicSocket>)>,
    l4udp: HashMap<BindKey, tokio::net::UdpSocket>,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        for (_, socket) in self.quic.values() {
            socket.close();
        }
    }
}

/// Whether sockets bound to `a` and `b` contend for one port: the same port and family, and
/// the same address or a wildcard on either side (IPv6 sockets are v6-only).
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The bind keys a new config keeps, by kind of socket: any other running one is removed by it.
struct Kept {
    tcp: HashSet<BindKey>,
    quic: HashSet<BindKey>,
    l4udp: HashSet<BindKey>,
}

impl Kept {
    fn of(views: &[ListenerBuild<'_>]) -> Kept {
        let mut kept = Kept {
            tcp: HashSet::new(),
            quic: HashSet::new(),
            l4udp: HashSet::new(),
        };
        for (_, l, _, quic, _) in views {
            let key = bind_key(l);
            if l.protocol == ListenerProtocol::Udp {
                kept.l4udp.insert(key);
                continue;
            }
            if quic.is_some() {
                kept.quic.insert(key.clone());
            }
            kept.tcp.insert(key);
        }
        kept
    }
}

/// A socket of a listener the new config removes, closed before the swap because a socket of
/// the new config contends with it (a listener whose address changes, say 0.0.0.0:P to
/// 127.0.0.1:P, or from port 0 to the port it had; or whose port changes transport, HTTPS
/// with HTTP/3 to a UDP listener or back): put back, bound again on its address, if the
/// config is rejected after all.
enum Closed {
    Tcp(Arc<Listening>, SocketAddr),
    Quic(Arc<QuicSocket>, SocketAddr),
    /// The socket of a removed HTTP/3 endpoint still draining ([`DrainingQuic`]), with its
    /// task: not put back once that has ended.
    Draining(Arc<QuicSocket>, SocketAddr, tokio::task::AbortHandle),
    L4Udp(Arc<UdpListening>, SocketAddr),
}

impl Closed {
    /// Binds the address again and puts the socket back (logged when that fails).
    fn reopen(self) {
        let (addr, result) = match self {
            // Its drain ended meanwhile: nothing is left to serve on it.
            Closed::Draining(_, _, task) if task.is_finished() => return,
            Closed::Quic(q, addr) | Closed::Draining(q, addr, _) => (
                addr,
                crate::listen::quic::bind_udp(addr).and_then(|s| q.reopen(s)),
            ),
            Closed::Tcp(l, addr) => (addr, bind_tcp(addr).map(|s| l.reopen(s))),
            Closed::L4Udp(u, addr) => (
                addr,
                crate::listen::quic::bind_udp(addr)
                    .and_then(tokio::net::UdpSocket::from_std)
                    .map(|s| u.reopen(s)),
            ),
        };
        match result {
            Ok(()) => tracing::info!(%addr, "config rejected: listener socket reopened"),
            Err(e) => {
                tracing::warn!(%addr, error = %e, "config rejected: listener socket not reopened")
            }
        }
    }
}

impl Sockets {
    /// Binds the listeners of `views` that are new, before anything is swapped: TCP, then UDP
    /// on the same port for HTTP/3 (a new ephemeral-port listener retries until both are
    /// free), and starts their QUIC endpoints (they queue handshakes until their loop runs).
    /// A socket of a removed listener that contends with one of them is closed first (see
    /// [`Closed`]; HTTP/3 endpoints still draining, [`Sockets::release_udp`]); on error they
    /// are all put back, and on success the drains whose sockets were closed end.
    pub(super) fn bind_new(&mut self, views: &[ListenerBuild<'_>]) -> Result<Fresh, ApplyError> {
        self.draining_quic.retain(|d| !d.task.is_finished());
        let mut closed = Vec::new();
        let result = self.bind_views(views, &Kept::of(views), &mut closed);
        if result.is_err() {
            // Every socket bound for the config is closed by now (dropped with it).
            for c in closed {
                c.reopen();
            }
        } else {
            self.end_released_drains(&closed);
        }
        result
    }

    /// [`Sockets::bind_new`]'s binding, recording in `closed` what it closed of the listeners
    /// that `kept` does not keep.
    fn bind_views(
        &mut self,
        views: &[ListenerBuild<'_>],
        kept: &Kept,
        closed: &mut Vec<Closed>,
    ) -> Result<Fresh, ApplyError> {
        let mut fresh = HashMap::new();
        let mut fresh_udp = HashMap::new();
        let mut fresh_l4udp = HashMap::new();
        for (i, l, _, _, _) in views {
            if l.protocol != ListenerProtocol::Udp {
                continue;
            }
            let key = bind_key(l);
            if self.l4udp.contains_key(&key) || fresh_l4udp.contains_key(&key) {
                continue;
            }
            self.free_udp(key.0, kept, closed);
            let sock = crate::listen::quic::bind_udp(key.0).map_err(|source| ApplyError::Bind {
                index: *i,
                name: l.name.clone(),
                addr: key.0,
                source,
            })?;
            let sock =
                tokio::net::UdpSocket::from_std(sock).map_err(|source| ApplyError::Bind {
                    index: *i,
                    name: l.name.clone(),
                    addr: key.0,
                    source,
                })?;
            fresh_l4udp.insert(key, sock);
        }
        for (i, l, _, quic, _) in views {
            if l.protocol == ListenerProtocol::Udp {
                continue; // Bound above.
            }
            let key = bind_key(l);
            let bind_err = |addr, source| ApplyError::Bind {
                index: *i,
                name: l.name.clone(),
                addr,
                source,
            };
            let want_udp =
                quic.is_some() && !self.udp.contains_key(&key) && !fresh_udp.contains_key(&key);
            if self.tcp.contains_key(&key) || fresh.contains_key(&key) {
                if want_udp {
                    let port = self
                        .tcp
                        .get(&key)
                        .map(|r| r.local.port())
                        .or_else(|| fresh.get(&key).and_then(local_port))
                        .unwrap_or(l.port);
                    let addr = SocketAddr::new(key.0.ip(), port);
                    self.free_udp(addr, kept, closed);
                    let sock =
                        crate::listen::quic::bind_udp(addr).map_err(|e| bind_err(addr, e))?;
                    fresh_udp.insert(key, sock);
                }
                continue;
            }
            let mut tries = 0;
            self.free_tcp(key.0, kept, closed);
            let (tcp, udp) = loop {
                let tcp = bind_tcp(key.0).map_err(|e| bind_err(key.0, e))?;
                if !want_udp {
                    break (tcp, None);
                }
                let addr = SocketAddr::new(key.0.ip(), local_port(&tcp).unwrap_or(l.port));
                if key.0.port() != 0 {
                    self.free_udp(addr, kept, closed);
                }
                match crate::listen::quic::bind_udp(addr) {
                    Ok(u) => break (tcp, Some(u)),
                    Err(e) if key.0.port() == 0 && tries < 8 => {
                        tries += 1;
                        tracing::debug!(%addr, error = %e, "UDP port taken; trying another");
                    }
                    Err(e) => return Err(bind_err(addr, e)),
                }
            };
            if let Some(u) = udp {
                fresh_udp.insert(key.clone(), u);
            }
            fresh.insert(key, tcp);
        }
        // Start the new QUIC endpoints (they queue handshakes until their loop runs).
        let mut out = Fresh {
            tcp: fresh,
            quic: HashMap::new(),
            l4udp: fresh_l4udp,
        };
        for (i, l, _, quic, _) in views {
            let key = bind_key(l);
            let (Some(sock), Some(cfg)) = (fresh_udp.remove(&key), quic) else {
                continue;
            };
            let addr = sock.local_addr().unwrap_or(key.0);
            let ep = crate::listen::quic::endpoint(sock, cfg.clone()).map_err(|source| {
                ApplyError::Bind {
                    index: *i,
                    name: l.name.clone(),
                    addr,
                    source,
                }
            })?;
            out.quic.insert(key, ep);
        }
        Ok(out)
    }

    /// Before a TCP bind on `addr` (not port 0): closes the running TCP listeners that `kept`
    /// does not keep and that contend with it, into `closed`.
    fn free_tcp(&self, addr: SocketAddr, kept: &Kept, closed: &mut Vec<Closed>) {
        if addr.port() == 0 {
            return;
        }
        for (key, r) in &self.tcp {
            if !kept.tcp.contains(key) && overlaps(r.local, addr) && r.listening.close() {
                tracing::info!(addr = %r.local, "removed listener closed first: its port is bound again");
                closed.push(Closed::Tcp(r.listening.clone(), r.local));
            }
        }
    }

    /// Before a UDP bind on `addr` (not port 0): closes the HTTP/3 endpoints still draining
    /// ([`Sockets::release_udp`]), and the running HTTP/3 endpoints and layer-4 UDP listeners
    /// that `kept` does not keep, that contend with it (into `closed`).
    fn free_udp(&self, addr: SocketAddr, kept: &Kept, closed: &mut Vec<Closed>) {
        if addr.port() == 0 {
            return;
        }
        self.release_udp(addr, closed);
        for (key, r) in &self.udp {
            if !kept.quic.contains(key) && overlaps(r.local, addr) && r.socket.close() {
                tracing::info!(addr = %r.local, "removed HTTP/3 listener closed first: its port is bound again");
                closed.push(Closed::Quic(r.socket.clone(), r.local));
            }
        }
        for (key, r) in &self.l4udp {
            if !kept.l4udp.contains(key) && overlaps(r.local, addr) && r.socket.close() {
                tracing::info!(addr = %r.local, "removed UDP listener closed first: its port is bound again");
                closed.push(Closed::L4Udp(r.socket.clone(), r.local));
            }
        }
    }

    /// Closes the sockets of removed HTTP/3 endpoints still draining that contend with a
    /// bind on `addr` (see [`overlaps`]), before that bind, into `closed`: their drains end
    /// only once the config's binds have all succeeded ([`Sockets::end_released_drains`]);
    /// until then their connections lose what is sent to them, as lost datagrams, and a
    /// rejected config puts the sockets back. The port is the dataplane's own, being
    /// released; a socket of another process on it still fails the bind.
    fn release_udp(&self, addr: SocketAddr, closed: &mut Vec<Closed>) {
        for d in &self.draining_quic {
            if overlaps(d.local, addr) && d.socket.close() {
                closed.push(Closed::Draining(
                    d.socket.clone(),
                    d.local,
                    d.task.abort_handle(),
                ));
            }
        }
    }

    /// Once the binds of a config have all succeeded: ends the drains whose sockets were
    /// closed for them (in `closed`). Their connections end with the task (their handles
    /// dropped; the close is not sent, the socket being gone), the endpoint with them.
    fn end_released_drains(&mut self, closed: &[Closed]) {
        let released = |d: &DrainingQuic| {
            closed
                .iter()
                .any(|c| matches!(c, Closed::Draining(q, ..) if Arc::ptr_eq(q, &d.socket)))
        };
        self.draining_quic.retain(|d| {
            if !released(d) {
                return true;
            }
            d.task.abort();
            tracing::info!(addr = %d.local, "removed HTTP/3 listener closed: its port is bound again");
            false
        });
    }

    /// The port the listener under `key` serves on: its running or fresh socket's (an
    /// ephemeral port resolved), else `configured`.
    pub(super) fn port(&self, fresh: &Fresh, key: &BindKey, configured: u16) -> u16 {
        self.tcp
            .get(key)
            .map(|r| r.local.port())
            .or_else(|| fresh.tcp.get(key).and_then(local_port))
            .or_else(|| self.l4udp.get(key).map(|r| r.local.port()))
            .or_else(|| {
                fresh
                    .l4udp
                    .get(key)
                    .and_then(|u| u.local_addr().ok())
                    .map(|a| a.port())
            })
            .unwrap_or(configured)
    }

    /// Whether an HTTP/3 endpoint runs, or was just bound, under `key`.
    pub(super) fn quic_up(&self, fresh: &Fresh, key: &BindKey) -> bool {
        self.udp.contains_key(key) || fresh.quic.contains_key(key)
    }

    /// After the swap: starts the loops of the `fresh` sockets. HTTP/3 endpoints: new ones
    /// start, kept ones get their config from `quic_configs` for new handshakes (established
    /// connections are untouched), removed ones drain.
    pub(super) fn start(
        &mut self,
        shared: &Arc<Shared>,
        mut fresh: Fresh,
        mut quic_configs: HashMap<BindKey, quinn::ServerConfig>,
    ) {
        for (key, sock) in std::mem::take(&mut fresh.tcp) {
            let local = sock.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let listening = Listening::new(sock);
            let task = tokio::spawn(crate::listen::tcp::run_tcp(
                shared.clone(),
                listening.clone(),
                key.clone(),
                stop_rx,
            ));
            let r = RunningTcp {
                local,
                listening,
                stop,
                task,
            };
            self.tcp.insert(key, r);
        }
        let mut removed = Vec::new();
        for (key, r) in std::mem::take(&mut self.udp) {
            match quic_configs.remove(&key) {
                Some(cfg) => {
                    r.endpoint.set_server_config(Some(cfg));
                    self.udp.insert(key, r);
                }
                None => {
                    let _ = r.stop.send(true);
                    if r.socket.is_closed() {
                        // Closed for a bind of this config: its connections cannot drain.
                        r.endpoint.close(0u32.into(), b"listener removed");
                    }
                    tracing::info!(addr = %r.local, "HTTP/3 listener removed; draining");
                    removed.push(DrainingQuic {
                        local: r.local,
                        socket: r.socket,
                        task: r.task,
                    });
                }
            }
        }
        self.draining_quic.extend(removed);
        for (key, (endpoint, socket)) in std::mem::take(&mut fresh.quic) {
            let local = endpoint.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::quic::run_quic(
                shared.clone(),
                endpoint.clone(),
                socket.clone(),
                key.clone(),
                stop_rx,
            ));
            let r = RunningQuic {
                local,
                endpoint,
                socket,
                stop,
                task,
            };
            self.udp.insert(key, r);
        }
        for (key, sock) in std::mem::take(&mut fresh.l4udp) {
            let local = sock.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let socket = UdpListening::new(sock);
            let task = tokio::spawn(crate::listen::l4::udp::run_udp(
                shared.clone(),
                socket.clone(),
                key.clone(),
                stop_rx,
            ));
            let r = RunningUdp {
                local,
                socket,
                stop,
                task,
            };
            self.l4udp.insert(key, r);
        }
    }

    /// Stops the TCP and layer-4 UDP listeners that `snap` (now serving) no longer has; their
    /// open connections drain (UDP sessions end). A removed listener's socket is closed here,
    /// before this returns: its port is free for the next config.
    pub(super) fn drain_removed(&mut self, snap: &Snapshot) {
        self.l4udp.retain(|key, r| {
            let keep = snap.listener_by_key(key).is_some();
            if !keep {
                r.socket.close();
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "UDP listener removed");
            }
            keep
        });
        self.tcp.retain(|key, r| {
            let keep = snap.listener_by_key(key).is_some();
            if !keep {
                r.listening.close();
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "listener removed; draining");
            }
            keep
        });
    }

    /// The local address of the TCP or layer-4 UDP socket under `key`.
    pub(super) fn local(&self, key: &BindKey) -> Option<SocketAddr> {
        self.tcp
            .get(key)
            .map(|r| r.local)
            .or_else(|| self.l4udp.get(key).map(|r| r.local))
    }

    /// The local address of the HTTP/3 endpoint under `key`.
    pub(super) fn local_quic(&self, key: &BindKey) -> Option<SocketAddr> {
        self.udp.get(key).map(|r| r.local)
    }

    /// Tells every listener to stop accepting (closing the TCP and layer-4 UDP sockets now); their tasks,
    /// which end once their connections have drained.
    pub(super) fn stop_all(&mut self) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        for (_, r) in self.tcp.drain() {
            r.listening.close();
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        for (_, r) in self.udp.drain() {
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        for (_, r) in self.l4udp.drain() {
            r.socket.close();
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        tasks
    }
}

/// The bind key of a configured listener.
pub(super) fn bind_key(l: &sweety_config::Listener) -> BindKey {
    let ip: IpAddr = l.address.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let name = (l.port == 0).then(|| Arc::<str>::from(l.name.as_str()));
    let transport = match l.protocol {
        ListenerProtocol::Udp => Transport::Udp,
        _ => Transport::Tcp,
    };
    (SocketAddr::new(ip, l.port), name, transport)
}

fn local_port(l: &tokio::net::TcpListener) -> Option<u16> {
    l.local_addr().ok().map(|a| a.port())
}

fn bind_tcp(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    tokio::net::TcpListener::from_std(sock.into())
}
