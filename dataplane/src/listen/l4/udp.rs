//! UDP proxy listeners: a session per client address, each with its own connected upstream
//! socket, forgotten after `l4.udp_idle_timeout` without a datagram either way. The session
//! table is bounded by `l4.udp_max_sessions` and every session holds a slot of
//! `limits.max_connections`; datagrams from new clients past either bound are dropped and
//! counted (`udp_session_limit`, `udp_connection_limit` in `sweety_edge_events_total`).
//!
//! The listener's socket ([`UdpListening`]) is the reload's to close: a removed listener's
//! port is free when the apply that removes it returns, whether or not its tasks have run
//! since (its sessions end on `stop`, as before).

use crate::limits::ConnPermit;
use crate::state::{BindKey, Shared};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::ReadBuf;
use tokio::net::UdpSocket;
use tokio::sync::watch;

/// Largest datagram relayed, bytes.
const MAX_DATAGRAM: usize = 65_535;
/// Room kept in front of each received datagram for a PROXY v2 header, so the header is
/// written in place in front of the datagram instead of both being copied into a new buffer
/// per datagram.
const HEADROOM: usize = crate::proxy_protocol::V2_MAX_LEN;

struct Session {
    upstream: UdpSocket,
    /// Milliseconds since `epoch` of the last datagram either way.
    last: AtomicU64,
    /// PROXY v2 header prepended to each datagram to the backend, when it wants one.
    header: Option<Vec<u8>>,
    _permit: ConnPermit,
}

type Table = Arc<Mutex<HashMap<SocketAddr, Arc<Session>>>>;

/// A UDP proxy listener's socket, shared by its receive loop and its sessions' relays, that
/// the reload closes ([`UdpListening::close`]: dropped on the caller's thread, its port free
/// when it returns) instead of the last of those tasks once it has seen `stop`. Each use holds
/// a read lock for one poll, never across an await.
#[derive(Debug)]
pub struct UdpListening {
    socket: RwLock<Option<UdpSocket>>,
    /// The receive loop, waiting for a datagram or while the socket is closed: woken by a
    /// close (the socket it waits on is gone, and tokio forgets its waker with it) and by a
    /// reopen.
    waiting: futures_util::task::AtomicWaker,
    /// The relays waiting for room to send.
    writers: crate::listen::quic_socket::Writers,
}

impl UdpListening {
    /// Wraps a bound socket.
    pub fn new(socket: UdpSocket) -> Arc<UdpListening> {
        Arc::new(UdpListening {
            socket: RwLock::new(Some(socket)),
            waiting: Default::default(),
            writers: Default::default(),
        })
    }

    /// Puts a socket back after a close (a config that closed it for its own bind was
    /// rejected); the listener receives on it.
    pub fn reopen(&self, socket: UdpSocket) {
        *self.socket.write().unwrap_or_else(|e| e.into_inner()) = Some(socket);
        self.waiting.wake();
        self.writers.wake_all();
    }

    /// Closes the socket now; false if it was closed already. Its tasks end on `stop`.
    pub fn close(&self) -> bool {
        let taken = self
            .socket
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.waiting.wake();
        self.writers.wake_all();
        taken.is_some()
    }

    fn read(&self) -> RwLockReadGuard<'_, Option<UdpSocket>> {
        self.socket.read().unwrap_or_else(|e| e.into_inner())
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.read().as_ref().and_then(|s| s.local_addr().ok())
    }

    /// The next datagram into `buf`: its length and sender. While closed none comes (the
    /// caller stops on `stop`, sent with the close, unless the socket is put back).
    async fn recv_from(&self, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        std::future::poll_fn(|cx| {
            let socket = self.read();
            let Some(s) = socket.as_ref() else {
                self.waiting.register(cx.waker());
                return Poll::Pending;
            };
            let mut read = ReadBuf::new(buf);
            let Poll::Ready(from) = s.poll_recv_from(cx, &mut read) else {
                // Under the read lock: a close comes after this and wakes it.
                self.waiting.register(cx.waker());
                return Poll::Pending;
            };
            Poll::Ready(Ok((read.filled().len(), from?)))
        })
        .await
    }

    /// Sends `buf` to `to`; dropped once closed.
    async fn send_to(&self, buf: &[u8], to: SocketAddr) -> std::io::Result<usize> {
        let mut slot = crate::listen::quic_socket::Slot::default();
        std::future::poll_fn(|cx| match self.read().as_ref() {
            Some(s) => self
                .writers
                .poll(&mut slot, cx, |cx| s.poll_send_to(cx, buf, to)),
            None => Poll::Ready(Ok(0)),
        })
        .await
    }
}

/// Runs a UDP proxy listener on `socket` until `stop` turns true.
pub async fn run_udp(
    shared: Arc<Shared>,
    socket: Arc<UdpListening>,
    key: BindKey,
    mut stop: watch::Receiver<bool>,
) {
    let epoch = Instant::now();
    let table: Table = Arc::default();
    let mut buf = vec![0u8; HEADROOM + MAX_DATAGRAM];
    let local = socket.local_addr();
    loop {
        let (n, client) = tokio::select! {
            r = socket.recv_from(&mut buf[HEADROOM..]) => match r {
                Ok(x) => x,
                Err(e) => {
                    // ICMP errors surface here on some systems; keep serving.
                    tracing::debug!(error = %e, "UDP receive failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let existing = table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&client)
            .cloned();
        let session = match existing {
            Some(s) => s,
            None => match open(&shared, &key, &table, client, local, epoch, &socket, &stop).await {
                Some(s) => s,
                None => continue,
            },
        };
        session
            .last
            .store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        let start = match &session.header {
            Some(h) => {
                // encode_v2 writes at most V2_MAX_LEN bytes.
                let start = HEADROOM - h.len();
                buf[start..HEADROOM].copy_from_slice(h);
                start
            }
            None => HEADROOM,
        };
        let sent = session.upstream.send(&buf[start..HEADROOM + n]).await;
        if let Err(e) = sent {
            tracing::debug!(%client, error = %e, "UDP send to backend failed");
        }
    }
}

/// Opens a session for a new client: checks the bounds, picks an endpoint, connects an
/// upstream socket and spawns the task relaying replies until the session goes idle.
#[allow(clippy::too_many_arguments)]
async fn open(
    shared: &Arc<Shared>,
    key: &BindKey,
    table: &Table,
    client: SocketAddr,
    local: Option<SocketAddr>,
    epoch: Instant,
    socket: &Arc<UdpListening>,
    stop: &watch::Receiver<bool>,
) -> Option<Arc<Session>> {
    let snap = shared.snapshot();
    let view = snap.listener_by_key(key)?.clone();
    let l4 = view.l4.as_ref()?;
    let settings = snap.config.l4.clone();
    if table.lock().unwrap_or_else(|p| p.into_inner()).len() >= settings.udp_max_sessions as usize {
        shared.metrics.edge_events.inc(&"udp_session_limit");
        return None;
    }
    let Some(permit) = shared.backpressure.try_connection() else {
        shared.metrics.edge_events.inc(&"udp_connection_limit");
        return None;
    };
    let Some(route) = l4.route(None) else {
        shared.metrics.edge_events.inc(&"l4_no_route");
        return None;
    };
    let Some(target) = snap.upstreams.l4_target(&route.backends, client.ip()) else {
        shared.metrics.upstream_error("no_endpoint");
        return None;
    };
    drop(snap);
    let bind: SocketAddr = if client.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let upstream = match UdpSocket::bind(bind).await {
        Ok(u) => u,
        Err(e) => {
            shared.metrics.upstream_error("bind");
            tracing::debug!(error = %e, "UDP upstream socket");
            return None;
        }
    };
    // Resolved through the same check as every upstream connection (an ExternalName backend
    // never reaches an internal address).
    let connected = match target.resolve().await {
        Ok(addrs) => upstream.connect(&addrs[..]).await,
        Err(e) => Err(e),
    };
    if let Err(e) = connected {
        target.record(false);
        shared.metrics.upstream_error("connect");
        tracing::debug!(addr = %target.address(), error = %e, "UDP connect failed");
        return None;
    }
    let header = target
        .send_proxy_protocol()
        .then(|| crate::proxy_protocol::encode_v2(client, local.unwrap_or(client), true));
    drop(target);
    let session = Arc::new(Session {
        upstream,
        last: AtomicU64::new(epoch.elapsed().as_millis() as u64),
        header,
        _permit: permit,
    });
    table
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(client, session.clone());
    tokio::spawn(relay(
        session.clone(),
        table.clone(),
        socket.clone(),
        client,
        epoch,
        settings.udp_idle_timeout.get(),
        stop.clone(),
    ));
    Some(session)
}

/// Relays the backend's replies to `client` until the session is idle or the listener stops,
/// then removes the session.
async fn relay(
    session: Arc<Session>,
    table: Table,
    socket: Arc<UdpListening>,
    client: SocketAddr,
    epoch: Instant,
    idle: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let last = Duration::from_millis(session.last.load(Ordering::Relaxed));
        let idle_for = epoch.elapsed().saturating_sub(last);
        if idle_for >= idle {
            break;
        }
        tokio::select! {
            r = session.upstream.recv(&mut buf) => match r {
                Ok(n) => {
                    session.last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                    let _ = socket.send_to(&buf[..n], client).await;
                }
                // Connection refused by the backend (ICMP): wait for more client traffic.
                Err(_) => tokio::time::sleep(Duration::from_millis(10).min(idle)).await,
            },
            _ = tokio::time::sleep(idle - idle_for) => {}
            _ = stop.changed() => break,
        }
    }
    let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
    if t.get(&client).is_some_and(|s| Arc::ptr_eq(s, &session)) {
        t.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receive loop waiting on the socket when it is closed and put back in one step (a
    /// config rejected after closing it for its own bind; the loop does not run in between)
    /// receives on the socket put back.
    #[tokio::test]
    async fn a_receiver_waiting_across_a_close_and_a_reopen_receives_on_the_new_socket() {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let l = UdpListening::new(sock);
        let rx = {
            let l = l.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let (n, _) = l.recv_from(&mut buf).await.unwrap();
                buf[..n].to_vec()
            })
        };
        // The receiver waits on the socket.
        tokio::task::yield_now().await;
        assert!(l.close());
        l.reopen(UdpSocket::bind(addr).await.unwrap());
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.send_to(b"back", addr).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("received within 5 s")
            .unwrap();
        assert_eq!(got, b"back");
    }
}
