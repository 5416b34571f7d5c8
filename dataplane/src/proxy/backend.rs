//! Runtime state of one backend: its endpoints (pool, health, load that survive reloads),
//! endpoint choice, outcome recording for outlier ejection, and one try of a request.

use super::balance;
use super::error::ProxyError;
use super::forward;
use super::head::Head;
use super::outlier::{self, Health};
use super::pool::{Connector, Pool, SendError, StreamGuard};
use crate::body::{empty, Body};
use bytes::Bytes;
use http::{Response, Version};
use http_body::Frame;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use sweety_config::{Backend, BackendProtocol, LbPolicy, Timeouts};

/// Backends of at most this many endpoints pick one with bit sets, without a list.
const PICK_SET: usize = 64;

/// State of one endpoint that survives config reloads: its pool, health and load.
#[derive(Debug)]
pub(super) struct EndpointState {
    pub(super) address: String,
    pub(super) pool: Arc<Pool>,
    pub(super) health: Mutex<Health>,
    pub(super) in_flight: AtomicUsize,
    /// False while active health checks find the endpoint down.
    pub(super) hc_up: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
pub(super) struct EndpointRt {
    pub(super) state: Arc<EndpointState>,
    pub(super) weight: u32,
    /// Its session-affinity token ([`session_token`] of the address), computed once.
    pub(super) token: String,
}

/// One backend of the running config.
#[derive(Debug)]
pub(super) struct BackendRt {
    pub(super) config: Backend,
    /// Its metrics label (`Metrics::backend_label`).
    pub(super) label: Arc<str>,
    pub(super) endpoints: Vec<EndpointRt>,
    pub(super) connector: Connector,
    pub(super) wrr: balance::SmoothWrr,
    pub(super) eject_lock: Mutex<()>,
    /// Consistent-hash table when `config.hash` is set.
    pub(super) hash_table: Option<balance::HashTable>,
    /// Active health check tasks, stopped when this backend is dropped.
    pub(super) checks: super::health::Checks,
}

/// The opaque session-affinity token naming an endpoint: a stable hash of its address, so
/// every replica issues and understands the same tokens and no address is revealed.
pub(super) fn session_token(address: &str) -> String {
    format!("{:016x}", balance::stable_hash(address.as_bytes()))
}

/// Counts a request in flight on an endpoint until dropped (with the response body).
#[derive(Debug)]
struct InFlight(Arc<EndpointState>);

impl InFlight {
    fn new(s: Arc<EndpointState>) -> InFlight {
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(s)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Proxied response bytes taken from backend connections and not yet released (framed or
/// written for the client), all streams together.
static HELD: AtomicU64 = AtomicU64::new(0);

/// Proxied response bytes the dataplane holds right now outside the backend connections'
/// own buffers: every chunk taken from a backend body until the last reference to it is
/// dropped. Each chunk is at most `limits.proxy_read_ahead` bytes.
pub fn held_bytes() -> u64 {
    HELD.load(Ordering::Relaxed)
}

/// A chunk of a backend's response body, counted in [`HELD`] while alive.
struct HeldChunk(Bytes);

impl HeldChunk {
    fn wrap(b: Bytes) -> Bytes {
        if b.is_empty() {
            return b;
        }
        HELD.fetch_add(b.len() as u64, Ordering::Relaxed);
        Bytes::from_owner(HeldChunk(b))
    }
}

impl AsRef<[u8]> for HeldChunk {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for HeldChunk {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0.len() as u64, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// The upstream response body, holding the endpoint's in-flight count and the HTTP/2
    /// stream slot until it is finished or dropped. Its chunks are counted in [`held_bytes`].
    struct Guarded<B> {
        #[pin]
        inner: B,
        guards: (InFlight, Option<StreamGuard>),
    }
}

impl<B: http_body::Body<Data = Bytes>> http_body::Body for Guarded<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project()
            .inner
            .poll_frame(cx)
            .map_ok(|f| f.map_data(HeldChunk::wrap))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl BackendRt {
    pub(super) fn healths(&self) -> Vec<&Mutex<Health>> {
        self.endpoints.iter().map(|e| &e.state.health).collect()
    }

    /// Endpoints that may take traffic: weight > 0, not down by active health checks, and
    /// not ejected (or all of those, in panic mode).
    pub(super) fn eligible(&self) -> Vec<usize> {
        let weighted = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.weight > 0 && e.state.hc_up.load(Ordering::Acquire));
        outlier::eligible(weighted.map(|(i, e)| (i, &e.state.health)), Instant::now())
    }

    /// The eligible endpoint `key` hashes to (preferring endpoints not in `tried`); `None`
    /// without a hash table or when nothing is eligible.
    pub(super) fn pick_hashed(&self, key: &[u8], tried: &[usize]) -> Option<usize> {
        let table = self.hash_table.as_ref()?;
        let eligible = self.eligible();
        let h = balance::stable_hash(key);
        table
            .lookup(h, |i| eligible.contains(&i) && !tried.contains(&i))
            .or_else(|| table.lookup(h, |i| eligible.contains(&i)))
    }

    /// The endpoint whose session token is `token`, when it is eligible.
    pub(super) fn by_token(&self, token: &str) -> Option<usize> {
        let idx = self.endpoints.iter().position(|e| e.token == token)?;
        self.eligible().contains(&idx).then_some(idx)
    }

    /// Picks an endpoint index: weight > 0, healthy, not ejected (or all in panic mode),
    /// preferring endpoints not in `tried`.
    pub(super) fn pick(&self, tried: &[usize]) -> Option<usize> {
        if self.endpoints.len() > PICK_SET {
            return self.pick_listed(tried);
        }
        // The same choice as `pick_listed`, with the endpoint sets as bits (this runs for
        // every proxied request; the lists cost two allocations).
        let now = Instant::now();
        let (mut up, mut healthy) = (0u64, 0u64);
        for (i, e) in self.endpoints.iter().enumerate() {
            if e.weight > 0 && e.state.hc_up.load(Ordering::Acquire) {
                up |= 1 << i;
                let h = e.state.health.lock().unwrap_or_else(|p| p.into_inner());
                if !h.is_ejected(now) {
                    healthy |= 1 << i;
                }
            }
        }
        // Panic mode: every endpoint ejected, all of them again.
        let eligible = if healthy != 0 { healthy } else { up };
        if eligible == 0 {
            return None;
        }
        let tried = tried
            .iter()
            .filter(|&&i| i < PICK_SET)
            .fold(0u64, |m, &i| m | 1 << i);
        let pool = match eligible & !tried {
            0 => eligible,
            fresh => fresh,
        };
        let mut cands = [(0usize, 0u32); PICK_SET];
        let mut n = 0;
        for (i, e) in self.endpoints.iter().enumerate() {
            if pool & (1 << i) != 0 {
                cands[n] = (i, e.weight);
                n += 1;
            }
        }
        self.pick_among(&cands[..n])
    }

    /// [`BackendRt::pick`] with lists, for backends of more than [`PICK_SET`] endpoints.
    pub(super) fn pick_listed(&self, tried: &[usize]) -> Option<usize> {
        let eligible = self.eligible();
        if eligible.is_empty() {
            return None;
        }
        let pool = if tried.is_empty() {
            eligible
        } else {
            let fresh: Vec<usize> = eligible
                .iter()
                .copied()
                .filter(|i| !tried.contains(i))
                .collect();
            if fresh.is_empty() {
                eligible
            } else {
                fresh
            }
        };
        let cands: Vec<(usize, u32)> = pool
            .into_iter()
            .map(|i| (i, self.endpoints[i].weight))
            .collect();
        self.pick_among(&cands)
    }

    /// The backend's policy over `cands` (`(endpoint index, weight)`, in index order).
    fn pick_among(&self, cands: &[(usize, u32)]) -> Option<usize> {
        match self.config.lb {
            LbPolicy::RoundRobin => self.wrr.pick(cands),
            LbPolicy::LeastRequest => balance::p2c(
                cands,
                |i| self.endpoints[i].state.in_flight.load(Ordering::Acquire),
                &mut fastrand::Rng::new(),
            ),
        }
    }

    /// Records a try's outcome for outlier ejection.
    /// Records a try's outcome; true when it ejected the endpoint.
    pub(super) fn record(&self, idx: usize, success: bool) -> bool {
        if success {
            // What `outlier::record` does with a success, without listing every endpoint.
            self.endpoints[idx]
                .state
                .health
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .succeeded();
            return false;
        }
        let ejected = outlier::record(
            &self.healths(),
            idx,
            success,
            &self.config.outlier,
            &self.eject_lock,
            Instant::now(),
        );
        if ejected {
            tracing::info!(
                backend = %self.config.name,
                endpoint = %self.endpoints[idx].state.address,
                "endpoint ejected after consecutive failures"
            );
        }
        ejected
    }

    /// One try against endpoint `idx`. Returns the result and, when the request was not
    /// sent, the body back (so the caller may retry any request).
    ///
    /// A pooled connection may have been closed by the backend while idle. When no byte of
    /// the request was written (the body comes back), or when a replayable request (`replay`: idempotent, and the
    /// whole body, possibly empty, is in memory) meets a connection closed before any response,
    /// the try goes once more on a new connection (HTTP/1.1: opened for it, never another idle
    /// one; HTTP/2: a stream of an open connection, the closed one being out of the pool).
    ///
    /// `timeouts` are the route's: `backend` bounds the whole try up to the response head,
    /// `connect` (else the backend's `connect_timeout`) the connection, `send_idle` and
    /// `read_idle` the backend's pauses ([`idle`](super::idle)).
    ///
    /// With `connect_time`, it is set to how long getting the connection that carried the
    /// request took (a pooled one: about nothing; a new one: TCP, TLS and the HTTP/2
    /// handshake), `None` when no connection was had.
    pub(super) async fn try_once(
        &self,
        idx: usize,
        head: &Head,
        body: Body,
        timeouts: &Timeouts,
        replay: Option<&Bytes>,
        mut connect_time: Option<&mut Option<Duration>>,
    ) -> (Result<Response<Body>, ProxyError>, Option<Body>) {
        let ep = &self.endpoints[idx].state;
        let addr = ep.address.as_str();
        let in_flight = InFlight::new(ep.clone());
        let backend_timeout = timeouts.backend.map(|d| d.get());
        let deadline = backend_timeout.map(|t| Instant::now() + t);
        let connect_timeout = timeouts
            .connect
            .unwrap_or(self.config.connect_timeout)
            .get();
        let read_idle = timeouts.read_idle.map(|d| d.get());
        let send_idle = timeouts.send_idle.map(|d| d.get());
        let h2 = matches!(
            self.config.protocol,
            BackendProtocol::H2 | BackendProtocol::H2c
        );
        let mut body = body;
        let mut allow_fresh = true;
        loop {
            let connecting = connect_time.as_deref_mut().map(|t| {
                *t = None;
                Instant::now()
            });
            // A pooled connection at once; else the connect timeout, and never past the
            // route's deadline: the pool ends a connect or a wait for one at the earlier of
            // the two. (The pool's future is made only when it is awaited: made for every
            // request, its ~870 bytes were copied into this future's state first.)
            // The try after a stale pooled HTTP/1.1 connection opens a new one: another idle
            // one is as old, and after a backend restart as closed (an HTTP/2 connection the
            // backend closed is out of the pool already).
            let pooled = allow_fresh || h2;
            let by = deadline.map(tokio::time::Instant::from_std);
            let conn = match pooled
                .then(|| ep.pool.take_pooled(&self.connector))
                .flatten()
            {
                Some(c) => c,
                None => {
                    // HTTP/1.1 has looked at its idle connections just now (or must not):
                    // it connects. HTTP/2 may wait for a stream or open a connection.
                    let got = if h2 {
                        ep.pool
                            .acquire_by(addr, &self.connector, Some(connect_timeout), by)
                            .await
                    } else {
                        ep.pool
                            .open_h1_by(addr, &self.connector, Some(connect_timeout), by)
                            .await
                    };
                    match got {
                        Err(e) => return (Err(e), Some(body)),
                        Ok(c) => c,
                    }
                }
            };
            if let (Some(t), Some(since)) = (connect_time.as_deref_mut(), connecting) {
                *t = Some(since.elapsed());
            }
            let reused = conn.reused;
            let (watched, clock) = super::idle::Clock::start(body, send_idle, read_idle);
            let has_clock = clock.is_some();
            let send = conn.send_head(&ep.pool, head, watched, addr, self.connector.tls.is_some());
            // Without a deadline or an idle clock nothing can end the wait but the send: it is
            // awaited alone (a select over two futures that never finish costs their set-up and
            // a poll of each at every wake-up). The clocks' futures are made in the other
            // branch only: made before it, they were kept (unpolled, ~500 bytes) beside the
            // send of every request.
            let sent = if deadline.is_none() && !has_clock {
                send.await
            } else {
                let deadline_passed = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d.into()).await,
                        None => std::future::pending().await,
                    }
                };
                let stalled = async {
                    match clock {
                        Some(c) => c.stalled().await,
                        None => std::future::pending().await,
                    }
                };
                let timed_out = |after: Duration| {
                    let e = ProxyError::Timeout {
                        addr: addr.to_string(),
                        after,
                    };
                    (Err(e), None)
                };
                tokio::select! {
                    r = send => r,
                    () = deadline_passed => return timed_out(backend_timeout.unwrap_or_default()),
                    after = stalled => return timed_out(after),
                }
            };
            match sent {
                Ok((resp, stream)) => {
                    let (mut parts, incoming) = resp.into_parts();
                    // An HTTP/1.1 head comes without its hop-by-hop fields already.
                    if h2 {
                        forward::strip_hop_by_hop(&mut parts.headers);
                    }
                    parts.version = Version::HTTP_11;
                    let guarded = Guarded {
                        inner: incoming,
                        guards: (in_flight, stream),
                    };
                    let mut body = crate::body::boxed(guarded);
                    if let Some(idle) = read_idle {
                        body = super::idle::ReadIdle::wrap(body, idle, addr);
                    }
                    return (Ok(Response::from_parts(parts, body)), None);
                }
                Err(e) => {
                    let again = allow_fresh && e.stale(reused, replay.is_some());
                    let SendError { error, unsent, .. } = e;
                    if let Some(unsent) = unsent {
                        body = unsent;
                        if again {
                            allow_fresh = false;
                            continue;
                        }
                        let e = ProxyError::Connect {
                            addr: addr.to_string(),
                            source: error,
                        };
                        return (Err(e), Some(body));
                    }
                    // Sent (a response never came): only a replayable request goes again.
                    if let (true, Some(bytes)) = (again, replay) {
                        allow_fresh = false;
                        body = if bytes.is_empty() {
                            empty()
                        } else {
                            crate::body::full(bytes.clone())
                        };
                        continue;
                    }
                    let e = ProxyError::Protocol {
                        addr: addr.to_string(),
                        source: error,
                    };
                    return (Err(e), None);
                }
            }
        }
    }
}
