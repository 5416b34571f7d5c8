//! The UDP socket of an HTTP/3 endpoint, closable by the reload: quinn reads and writes it
//! through [`quinn::AsyncUdpSocket`] from its endpoint and connection tasks, and quinn alone
//! would close it only once the last of those has ended (after the listener's connections
//! have drained). [`QuicSocket::close`] drops the socket on the caller's thread instead, so
//! its port is free when it returns, for a listener a later config binds there.
//!
//! A QUIC connection has no socket of its own: closing the endpoint's ends its connections
//! (after the close nothing is received and what is sent is dropped, as lost datagrams), so
//! the reload closes a removed listener's only when a new socket needs its port, and its
//! connections drain until then. The lock is a read lock held for one poll or one send, never across an await;
//! only the close takes it for writing.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::task::{ready, Context, Poll};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};

/// A UDP socket for a quinn endpoint that can be closed while quinn's tasks hold it.
#[derive(Debug)]
pub struct QuicSocket {
    io: RwLock<Option<UdpSocket>>,
    /// Offload and ECN state of the socket (no file descriptor of its own).
    state: UdpSocketState,
    local: SocketAddr,
}

impl QuicSocket {
    /// Wraps a bound, non-blocking UDP socket. Must be called inside a tokio runtime.
    pub fn new(sock: std::net::UdpSocket) -> io::Result<Arc<QuicSocket>> {
        let state = UdpSocketState::new((&sock).into())?;
        let local = sock.local_addr()?;
        Ok(Arc::new(QuicSocket {
            io: RwLock::new(Some(UdpSocket::from_std(sock)?)),
            state,
            local,
        }))
    }

    /// Closes the socket now: its port is free when this returns. False if it was closed
    /// already.
    pub fn close(&self) -> bool {
        let taken = self.io.write().unwrap_or_else(|e| e.into_inner()).take();
        taken.is_some()
    }

    /// Whether [`QuicSocket::close`] has been called.
    pub fn is_closed(&self) -> bool {
        self.read().is_none()
    }

    fn read(&self) -> RwLockReadGuard<'_, Option<UdpSocket>> {
        self.io.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl quinn::AsyncUdpSocket for QuicSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        Box::pin(Writable(self))
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        match self.read().as_ref() {
            Some(io) => io.try_io(Interest::WRITABLE, || self.state.send(io.into(), transmit)),
            // Closed: dropped, as a lost datagram.
            None => Ok(()),
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let io = self.read();
        // Closed: nothing arrives any more (the endpoint's task is woken by its other events).
        let Some(io) = io.as_ref() else {
            return Poll::Pending;
        };
        loop {
            ready!(io.poll_recv_ready(cx))?;
            if let Ok(n) = io.try_io(Interest::READABLE, || {
                self.state.recv(io.into(), bufs, meta)
            }) {
                return Poll::Ready(Ok(n));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

/// Waits until the socket can be written (at once once it is closed: the send drops).
#[derive(Debug)]
struct Writable(Arc<QuicSocket>);

impl quinn::UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        match self.0.read().as_ref() {
            Some(io) => io.poll_send_ready(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::AsyncUdpSocket;

    /// Closing frees the port at once while another holder of the socket (as quinn's tasks
    /// are) still has it; sends after the close are dropped without an error, nothing is
    /// received, and the poller does not wait.
    #[tokio::test]
    async fn close_frees_the_port_while_the_socket_is_held() {
        let sock = crate::listen::quic::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let s = QuicSocket::new(sock).unwrap();
        let held = s.clone();
        let addr = s.local_addr().unwrap();
        assert!(crate::listen::quic::bind_udp(addr).is_err(), "in use");
        assert!(!held.is_closed());
        assert!(s.close());
        assert!(!s.close(), "closed once");
        assert!(held.is_closed());
        let again = crate::listen::quic::bind_udp(addr).expect("the port is free");
        let payload = [1u8; 8];
        let t = Transmit {
            destination: again.local_addr().unwrap(),
            ecn: None,
            contents: &payload,
            segment_size: None,
            src_ip: None,
        };
        held.try_send(&t).unwrap();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut buf = [0u8; 64];
        let mut bufs = [IoSliceMut::new(&mut buf)];
        let mut meta = [RecvMeta::default()];
        assert!(held.poll_recv(&mut cx, &mut bufs, &mut meta).is_pending());
        let mut poller = held.clone().create_io_poller();
        assert!(matches!(
            poller.as_mut().poll_writable(&mut cx),
            Poll::Ready(Ok(()))
        ));
    }
}
