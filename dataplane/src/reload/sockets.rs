//! The listener sockets of the reload side: which bind keys run, binding the ones a new config
//! adds before it is swapped in (TCP; UDP on the same port for HTTP/3; UDP of layer-4
//! listeners), starting their loops ([`crate::listen`]) once it serves, handing kept QUIC
//! endpoints their new TLS and transport config, and draining the removed ones.

use super::build::ListenerBuild;
use super::ApplyError;
use crate::state::{BindKey, Shared, Snapshot};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use sweety_config::ListenerProtocol;
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Running {
    local: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

struct RunningQuic {
    local: SocketAddr,
    endpoint: quinn::Endpoint,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Every running listener socket: TCP, UDP for HTTP/3, and UDP of layer-4 listeners, each
/// by bind key.
#[derive(Default)]
pub(super) struct Sockets {
    tcp: HashMap<BindKey, Running>,
    udp: HashMap<BindKey, RunningQuic>,
    l4udp: HashMap<BindKey, Running>,
}

/// The sockets bound for a config that does not serve yet, by bind key: started by
/// [`Sockets::start`] after the swap, closed if the config is rejected before.
#[derive(Default)]
pub(super) struct Fresh {
    tcp: HashMap<BindKey, tokio::net::TcpListener>,
    quic: HashMap<BindKey, quinn::Endpoint>,
    l4udp: HashMap<BindKey, tokio::net::UdpSocket>,
}

impl Sockets {
    /// Binds the listeners of `views` that are new, before anything is swapped: TCP, then UDP
    /// on the same port for HTTP/3 (a new ephemeral-port listener retries until both are
    /// free), and starts their QUIC endpoints (they queue handshakes until their loop runs).
    pub(super) fn bind_new(&self, views: &[ListenerBuild<'_>]) -> Result<Fresh, ApplyError> {
        let running = &self.tcp;
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
            if running.contains_key(&key) || fresh.contains_key(&key) {
                if want_udp {
                    let port = running
                        .get(&key)
                        .map(|r| r.local.port())
                        .or_else(|| fresh.get(&key).and_then(local_port))
                        .unwrap_or(l.port);
                    let addr = SocketAddr::new(key.0.ip(), port);
                    let sock =
                        crate::listen::quic::bind_udp(addr).map_err(|e| bind_err(addr, e))?;
                    fresh_udp.insert(key, sock);
                }
                continue;
            }
            let mut tries = 0;
            let (tcp, udp) = loop {
                let tcp = bind_tcp(key.0).map_err(|e| bind_err(key.0, e))?;
                if !want_udp {
                    break (tcp, None);
                }
                let addr = SocketAddr::new(key.0.ip(), local_port(&tcp).unwrap_or(l.port));
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
        let mut fresh_quic = HashMap::new();
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
            fresh_quic.insert(key, ep);
        }
        Ok(Fresh {
            tcp: fresh,
            quic: fresh_quic,
            l4udp: fresh_l4udp,
        })
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
        fresh: Fresh,
        mut quic_configs: HashMap<BindKey, quinn::ServerConfig>,
    ) {
        for (key, sock) in fresh.tcp {
            let local = sock.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::tcp::run_tcp(
                shared.clone(),
                sock,
                key.clone(),
                stop_rx,
            ));
            self.tcp.insert(key, Running { local, stop, task });
        }
        self.udp.retain(|key, r| match quic_configs.remove(key) {
            Some(cfg) => {
                r.endpoint.set_server_config(Some(cfg));
                true
            }
            None => {
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "HTTP/3 listener removed; draining");
                false
            }
        });
        for (key, endpoint) in fresh.quic {
            let local = endpoint.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::quic::run_quic(
                shared.clone(),
                endpoint.clone(),
                key.clone(),
                stop_rx,
            ));
            let r = RunningQuic {
                local,
                endpoint,
                stop,
                task,
            };
            self.udp.insert(key, r);
        }
        for (key, sock) in fresh.l4udp {
            let local = sock.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::l4::udp::run_udp(
                shared.clone(),
                Arc::new(sock),
                key.clone(),
                stop_rx,
            ));
            self.l4udp.insert(key, Running { local, stop, task });
        }
    }

    /// Stops the TCP and layer-4 UDP listeners that `snap` (now serving) no longer has; their
    /// open connections drain.
    pub(super) fn drain_removed(&mut self, snap: &Snapshot) {
        let udp_l4 = |k: &BindKey| {
            snap.listener_by_key(k)
                .is_some_and(|v| v.protocol == ListenerProtocol::Udp)
        };
        self.l4udp.retain(|key, r| {
            let keep = udp_l4(key);
            if !keep {
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "UDP listener removed");
            }
            keep
        });
        self.tcp.retain(|key, r| {
            let keep = snap.listener_by_key(key).is_some() && !udp_l4(key);
            if !keep {
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
            .or_else(|| self.l4udp.get(key))
            .map(|r| r.local)
    }

    /// The local address of the HTTP/3 endpoint under `key`.
    pub(super) fn local_quic(&self, key: &BindKey) -> Option<SocketAddr> {
        self.udp.get(key).map(|r| r.local)
    }

    /// Tells every listener to stop accepting; their tasks, which end once their connections
    /// have drained.
    pub(super) fn stop_all(&mut self) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        for (_, r) in self.tcp.drain() {
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        for (_, r) in self.udp.drain() {
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        for (_, r) in self.l4udp.drain() {
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
    (SocketAddr::new(ip, l.port), name)
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
