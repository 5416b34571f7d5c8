//! The listeners: accept loops and protocol adapters that turn connections into requests for
//! the pipeline ([`tcp`]: HTTP/1.1 and HTTP/2 over TCP and TLS, h2c detection, PROXY
//! protocol; [`quic`]: HTTP/3 over QUIC (its send budget across connections is
//! [`crate::quic_budget`]; its UDP socket [`quic_socket`], which the reload can close; its
//! reset and connection-ID keys [`quic_keys`], shared by the endpoints bound on one address);
//! [`l4`]: TCP, TLS-passthrough and UDP proxying; [`h1_wire`]: HTTP/1.1 framing as read on the
//! wire, for what hyper does not report).
//! Started and drained by `reload`; they read [`crate::state`] and call
//! [`crate::pipeline`], never `reload` or `control`.

pub mod h1_wire;
pub mod l4;
pub mod quic;
pub(crate) mod quic_keys;
pub mod quic_socket;
pub mod tcp;

/// A waker that counts its wakes: the listeners' tests of who is woken, and how often.
#[cfg(test)]
pub(crate) struct WakeCount(pub(crate) std::sync::atomic::AtomicUsize);

#[cfg(test)]
impl std::task::Wake for WakeCount {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
