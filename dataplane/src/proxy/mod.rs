//! The reverse proxy: upstream connection pools (H1 keep-alive, h2c and h2 multiplexed),
//! weighted backend choice, endpoint load balancing, passive outlier ejection, forwarding
//! headers, retries, timeouts and mirrors.
//!
//! Request flow in [`Upstreams::forward`]:
//! 1. pick a backend of the route by weight (all weights 0: 500 "no backend");
//! 2. rewrite the head once: hop-by-hop headers out, forwarding headers in, per-backend header
//!    filters ([`forward`]);
//! 3. per try: pick an endpoint (round robin or least request over non-ejected endpoints,
//!    preferring one not tried yet), get a pooled or new connection ([`pool`]), send, wait for
//!    the response head within `route.timeouts.backend`, the backend's pauses bounded by
//!    `send_idle` / `read_idle` as nginx's `proxy_send_timeout` / `proxy_read_timeout`
//!    ([`idle`]);
//! 4. record the outcome for outlier ejection ([`outlier`]) and decide on a retry
//!    ([`forward::should_retry`]); errors become 502/504 replies ([`error`]).
//!
//! Retries happen only with a `route.retry` policy. The request body is handed to the
//! connection only once a connection is ready, so on connect errors it is still owned and any
//! request may be retried; after it was sent, only idempotent requests whose whole body is in
//! memory are: those without a body, and (with a retry policy) those with a `Content-Length`
//! of at most [`RETRY_BODY_LIMIT`], which are read before the first try. The whole-request
//! timeout is applied by the pipeline, not here. Other bodies stream both ways.

pub mod affinity;
mod backend;
pub mod balance;
pub mod error;
pub mod forward;
mod head;
mod health;
mod idle;
pub mod outlier;
pub mod pool;
pub mod tls;
mod upgrade;

pub use backend::held_bytes;
pub use error::{ErrorOrigin, ProxyError};

use crate::body::{empty, Body};
use crate::ctx::RequestCtx;
use crate::filters::modify_headers;
use crate::metrics::Metrics;
use backend::{BackendRt, EndpointRt, EndpointState};
use head::Head;
use http::header;
use http::{Request, Response};
use http_body_util::BodyExt;
use outlier::Health;
use pool::{Connector, Pool};
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sweety_config::{
    Backend, BackendProtocol, BackendTls, Filter, Mirror, ProxyAction, Route, SessionPersistence,
    WeightedBackend,
};
use tokio::sync::Semaphore;

/// Mirrored requests in flight at most; more are dropped and counted as `mirror_dropped`.
pub const MIRROR_IN_FLIGHT: usize = 64;
/// A mirrored request (connect, response and draining its body) is abandoned after this.
pub const MIRROR_TIMEOUT: Duration = Duration::from_secs(10);

/// What the proxy phase leaves on its response (an extension) for the metrics of the
/// response phase: the backend that answered and how long the response head took.
#[derive(Debug, Clone)]
pub struct UpstreamServed {
    /// The backend's metrics label (its config name, or `other` over the label cap).
    pub backend: Arc<str>,
    /// From sending the last try to its response head; `None` when no try got one.
    pub header_time: Option<Duration>,
}

/// Errors building upstreams from config.
#[derive(Debug, thiserror::Error)]
#[error("backends[{index}]: {message}")]
pub struct BuildError {
    /// Index of the backend in the config.
    pub index: usize,
    /// What is wrong.
    pub message: String,
}

/// All upstream backends of one config, with their pools and endpoint health.
#[derive(Debug)]
pub struct Upstreams {
    /// By name, looked up by every request. The names are the config's, not a client's, but in
    /// a shared cluster a tenant names its Services and routes: a keyed hash (foldhash, seeded
    /// at random per process: no list of names collides in every process) at about FNV's cost,
    /// not std's SipHash.
    backends: HashMap<String, Arc<BackendRt>, foldhash::fast::RandomState>,
    metrics: Arc<Metrics>,
    mirrors: Arc<Semaphore>,
}

fn valid_address(a: &str) -> bool {
    let host = tls::host_of(a);
    let port = a.rsplit_once(':').map(|(_, p)| p);
    !host.is_empty() && port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p != 0))
}

impl Upstreams {
    /// Builds upstreams for `backends`, reusing pools and endpoint state from `previous`
    /// (the running config's upstreams) where backend and endpoint are unchanged.
    ///
    /// A backend is "unchanged" when its name, protocol and TLS settings are equal; its
    /// endpoints then keep their warm connections, health and load by address. Other settings
    /// (weights, policy, timeouts, outlier thresholds, idle bound) take effect immediately.
    /// For `https`/`h2` without `tls`, the backend certificate is not verified.
    ///
    /// `read_ahead` (`limits.proxy_read_ahead`) bounds what each new backend connection reads
    /// ahead of the client (connections already pooled keep theirs).
    pub fn build(
        backends: &[Backend],
        previous: Option<&Upstreams>,
        metrics: Arc<Metrics>,
        read_ahead: u32,
    ) -> Result<Upstreams, BuildError> {
        Upstreams::build_with(
            backends,
            previous,
            metrics,
            read_ahead,
            sweety_config::Http2Client::default(),
        )
    }

    /// [`Upstreams::build`] with `h2_client` (`limits.http2_client`) for `h2c` and `h2`
    /// backends: a pool kept from `previous` opens connections of this client from now on
    /// (those it has of the other close as they empty).
    pub fn build_with(
        backends: &[Backend],
        previous: Option<&Upstreams>,
        metrics: Arc<Metrics>,
        read_ahead: u32,
        h2_client: sweety_config::Http2Client,
    ) -> Result<Upstreams, BuildError> {
        let mut out = HashMap::with_capacity_and_hasher(backends.len(), Default::default());
        for (index, b) in backends.iter().enumerate() {
            let err = |message: String| BuildError { index, message };
            if out.contains_key(&b.name) {
                return Err(err(format!("duplicate backend name {:?}", b.name)));
            }
            let tls_cfg = match b.protocol {
                BackendProtocol::Http1 | BackendProtocol::H2c => None,
                BackendProtocol::Https | BackendProtocol::H2 => {
                    let t = b.tls.clone().unwrap_or_else(BackendTls::default);
                    Some(
                        tls::client_config(&t, b.protocol == BackendProtocol::H2)
                            .map_err(|m| err(format!("tls: {m}")))?,
                    )
                }
            };
            let reuse = previous
                .and_then(|p| p.backends.get(&b.name))
                .filter(|p| p.config.protocol == b.protocol && p.config.tls == b.tls);
            let max_idle = b.max_idle_per_endpoint as usize;
            let mut endpoints = Vec::with_capacity(b.endpoints.len());
            for (i, e) in b.endpoints.iter().enumerate() {
                if !valid_address(&e.address) {
                    return Err(err(format!(
                        "endpoints[{i}]: address {:?} is not host:port",
                        e.address
                    )));
                }
                let old = reuse.and_then(|p| {
                    p.endpoints
                        .iter()
                        .find(|x| x.state.address == e.address)
                        .map(|x| x.state.clone())
                });
                let state = match old {
                    Some(s) => {
                        s.pool.set_max_idle(max_idle);
                        if b.health_check.is_none() {
                            // Checks turned off: nothing will ever mark it up again.
                            s.hc_up.store(true, std::sync::atomic::Ordering::Release);
                        }
                        s
                    }
                    None => Arc::new(EndpointState {
                        address: e.address.clone(),
                        pool: Arc::new(Pool::new(max_idle)),
                        health: Mutex::new(Health::default()),
                        in_flight: AtomicUsize::new(0),
                        hc_up: std::sync::atomic::AtomicBool::new(true),
                    }),
                };
                endpoints.push(EndpointRt {
                    token: backend::session_token(&e.address),
                    state,
                    weight: e.weight,
                });
            }
            let hash_table = b.hash.as_ref().map(|h| {
                let eps: Vec<(usize, &str, u32)> = b
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (i, e.address.as_str(), e.weight))
                    .collect();
                match h.algorithm {
                    sweety_config::HashAlgorithm::RingHash => balance::HashTable::ring(&eps),
                    sweety_config::HashAlgorithm::Maglev => balance::HashTable::maglev(&eps),
                }
            });
            let rt = BackendRt {
                label: metrics.backend_label(&b.name),
                hash_table,
                checks: health::Checks::default(),
                config: b.clone(),
                wrr: balance::SmoothWrr::new(endpoints.len()),
                endpoints,
                connector: Connector {
                    protocol: b.protocol,
                    tls: tls_cfg,
                    sni: b.tls.as_ref().and_then(|t| t.sni.clone()),
                    external: b.external,
                    read_ahead,
                    h2_client,
                },
                eject_lock: Mutex::new(()),
            };
            out.insert(b.name.clone(), Arc::new(rt));
        }
        Ok(Upstreams {
            backends: out,
            metrics,
            mirrors: previous
                .map(|p| p.mirrors.clone())
                .unwrap_or_else(|| Arc::new(Semaphore::new(MIRROR_IN_FLIGHT))),
        })
    }

    /// The names of the backends.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.backends.keys().map(String::as_str)
    }

    /// Idle pooled HTTP/1.1 connections of `backend` at `address` (`None` when unknown).
    /// Meant for tests and diagnostics.
    pub fn idle_connections(&self, backend: &str, address: &str) -> Option<usize> {
        let b = self.backends.get(backend)?;
        let e = b.endpoints.iter().find(|e| e.state.address == address)?;
        Some(e.state.pool.idle_count())
    }

    /// Open connections of `backend`'s endpoint `address` as `(active, idle)`
    /// ([`Pool::connections`]).
    pub fn connections(&self, backend: &str, address: &str) -> Option<(usize, usize)> {
        let b = self.backends.get(backend)?;
        let e = b.endpoints.iter().find(|e| e.state.address == address)?;
        Some(e.state.pool.connections())
    }

    /// Adds `sweety_upstream_connections` to a scrape: the open connections of every backend's
    /// pools by state (`active`, `idle`, [`Pool::connections`]), one pair of samples per
    /// backend label (backends over the label cap add up under `other`), zero included.
    pub fn expose_connections(&self, e: &mut crate::metrics::expo::Exposition) {
        let mut by_label: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
        for b in self.backends.values() {
            let sum = by_label.entry(&b.label).or_default();
            for ep in &b.endpoints {
                let (active, idle) = ep.state.pool.connections();
                sum.0 += active;
                sum.1 += idle;
            }
        }
        let f = e.family(
            "sweety_upstream_connections",
            prometheus_client::metrics::MetricType::Gauge,
            "Open upstream connections of the connection pools, by backend and state (active, idle).",
        );
        for (backend, (active, idle)) in by_label {
            for (state, n) in [("active", active), ("idle", idle)] {
                f.sample(
                    vec![("backend", backend.to_string()), ("state", state.into())],
                    crate::metrics::expo::Value::Gauge(n as i64),
                );
            }
        }
    }

    /// Starts the active health checks of every backend that has them and has not started
    /// yet. Must be called inside a tokio runtime (the runtime does, after each apply).
    pub fn start_health_checks(&self) {
        for b in self.backends.values() {
            health::start(b, &self.metrics);
        }
    }

    /// True when `backend`'s endpoint at `address` is up by active health checks (`None`
    /// when unknown). Meant for tests and diagnostics.
    pub fn endpoint_up(&self, backend: &str, address: &str) -> Option<bool> {
        let b = self.backends.get(backend)?;
        let e = b.endpoints.iter().find(|e| e.state.address == address)?;
        Some(e.state.hc_up.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Chooses an endpoint for a layer-4 connection from `client`: a backend of `backends`
    /// by weight, then an eligible endpoint (by the backend's client-IP hash when it has one,
    /// else its balancing policy). `None` when nothing is eligible.
    pub fn l4_target(
        &self,
        backends: &[sweety_config::WeightedBackend],
        client: std::net::IpAddr,
    ) -> Option<L4Target> {
        // A backend the config does not know (yet) gets no connections.
        let weight = |i: usize| {
            let b = &backends[i];
            if self.backends.contains_key(&b.backend) {
                b.weight
            } else {
                0
            }
        };
        let wi = balance::pick_by_weight(backends.len(), weight, &mut fastrand::Rng::new())?;
        let backend = self.backends.get(&backends[wi].backend)?.clone();
        let key = backend
            .config
            .hash
            .as_ref()
            .and_then(|h| affinity::hash_key(h, &http::HeaderMap::new(), client));
        let idx = key
            .and_then(|k| backend.pick_hashed(&k, &[]))
            .or_else(|| backend.pick(&[]))?;
        Some(L4Target { backend, idx })
    }

    fn fail(&self, e: &ProxyError) -> Response<Body> {
        self.metrics.upstream_error(e.metrics_label());
        tracing::debug!(error = %e, source = ?std::error::Error::source(e), "proxy error");
        e.to_response()
    }

    /// The reply to an error of `backend`, counted under its label.
    fn fail_on(&self, backend: &BackendRt, e: &ProxyError) -> Response<Body> {
        self.metrics
            .upstream_error_of(&backend.label, e.metrics_label());
        tracing::debug!(error = %e, source = ?std::error::Error::source(e), "proxy error");
        let mut r = e.to_response();
        r.extensions_mut().insert(UpstreamServed {
            backend: backend.label.clone(),
            header_time: None,
        });
        r
    }

    /// Records a try's outcome on endpoint `idx`, counting an ejection it causes.
    fn record(&self, backend: &BackendRt, idx: usize, success: bool) {
        if backend.record(idx, success) {
            self.metrics.upstream_ejections.inc(&backend.label);
        }
    }

    /// The backend of `action` for one request, chosen at random by weight.
    fn choose_backend<'a>(
        &'a self,
        action: &'a ProxyAction,
    ) -> Result<(&'a WeightedBackend, &'a Arc<BackendRt>), ProxyError> {
        let backends = &action.backends;
        let weight = |i: usize| backends[i].weight;
        let Some(wi) = balance::pick_by_weight(backends.len(), weight, &mut fastrand::Rng::new())
        else {
            return Err(ProxyError::NoBackend {
                reason: "every backend has weight 0".into(),
            });
        };
        let wb = &action.backends[wi];
        match self.backends.get(&wb.backend) {
            Some(b) => Ok((wb, b)),
            None => Err(ProxyError::NoBackend {
                reason: format!("unknown backend {:?}", wb.backend),
            }),
        }
    }

    /// Whether some backend of `action` with a weight has an endpoint that may take traffic
    /// now (weight > 0, not down by health checks, not ejected).
    pub fn has_endpoint(&self, action: &ProxyAction) -> bool {
        action.backends.iter().any(|wb| {
            wb.weight > 0
                && self
                    .backends
                    .get(&wb.backend)
                    .is_some_and(|b| !b.eligible().is_empty())
        })
    }

    /// Forwards `req` to one of `action`'s backends, honouring `route`'s timeouts and retry
    /// policy. Never fails: upstream errors become 502 (connect) or 504 (timeout) replies.
    pub async fn forward(
        &self,
        req: Request<Body>,
        action: &ProxyAction,
        route: &Route,
        ctx: &RequestCtx,
    ) -> Response<Body> {
        let (wb, backend) = match self.choose_backend(action) {
            Ok(x) => x,
            Err(e) => return self.fail(&e),
        };
        let started = Instant::now();
        // For the access log and the trace: what happened, on the response (only when the
        // log is on or the request is traced).
        let note = |mut resp: Response<Body>,
                    idx: Option<usize>,
                    status: Option<u16>,
                    tries: u32,
                    error: Option<&ProxyError>,
                    connect: Option<Duration>| {
            if ctx.log {
                resp.extensions_mut().insert(UpstreamInfo {
                    backend: backend.config.name.clone(),
                    address: idx.map(|i| backend.endpoints[i].state.address.clone()),
                    status,
                    header_us: Some(started.elapsed().as_micros() as u64),
                    connect_us: connect.map(|d| d.as_micros() as u64),
                    retries: tries.saturating_sub(1),
                    started,
                    error: error.map(ProxyError::metrics_label),
                });
            }
            resp
        };
        let (parts, body) = req.into_parts();
        let policy = route.retry.as_ref();
        // With a retry policy, a small body of an idempotent request is read into memory first
        // so that it can be sent again; other bodies stream and are never sent twice.
        let (body, buffered) = match retry_body_len(&parts, &body, policy.is_some()) {
            // In its own allocation: only such requests on routes with a retry policy read
            // their body here, and the forward future of every request stays small.
            Some(len) => match Box::pin(retry_buffer(body, len)).await {
                Ok(bytes) => (empty(), Some(bytes)),
                Err(resp) => return resp,
            },
            None => (body, None),
        };
        let replay: Option<bytes::Bytes> = match buffered {
            Some(b) => Some(b),
            None if forward::is_idempotent(&parts.method)
                && http_body::Body::is_end_stream(&body) =>
            {
                Some(bytes::Bytes::new())
            }
            None => None,
        };
        let replayable = replay.is_some();
        let affinity = Affinity::of(backend, &parts.headers, ctx);
        let h1 = matches!(
            backend.config.protocol,
            BackendProtocol::Http1 | BackendProtocol::Https
        );
        let head = Head::prepare(parts, ctx, Some(wb), h1);
        let mut body = Some(body);
        let mut tried: Vec<usize> = Vec::new();
        let mut tries = 0u32;
        // The last try's connection time (only measured for the log and the trace).
        let mut connect = None;
        loop {
            let Some(idx) = affinity.pick(backend, tries, &tried) else {
                let e = ProxyError::NoEndpoint {
                    backend: backend.config.name.clone(),
                };
                let resp = self.fail_on(backend, &e);
                return note(resp, tried.last().copied(), None, tries, Some(&e), None);
            };
            // Only a retry policy tries again (each `continue` below asks it): without one
            // the list stays empty, unallocated.
            if policy.is_some() {
                tried.push(idx);
            }
            tries += 1;
            if tries > 1 {
                self.metrics.upstream_retries.inc(&backend.label);
            }
            let sent = std::time::Instant::now();
            let b = match replay.as_ref().filter(|r| !r.is_empty()) {
                Some(r) => crate::body::full(r.clone()),
                None => body.take().unwrap_or_else(empty),
            };
            let (result, unsent) = backend
                .try_once(
                    idx,
                    &head,
                    b,
                    &route.timeouts,
                    replay.as_ref(),
                    ctx.log.then_some(&mut connect),
                )
                .await;
            body = unsent;
            match result {
                Ok(mut resp) => {
                    let header_time = sent.elapsed();
                    let status = resp.status().as_u16();
                    self.record(backend, idx, status < 500);
                    if forward::should_retry(
                        policy,
                        tries,
                        forward::TryOutcome::Status(status),
                        replayable,
                    ) && within_budget(policy, started)
                    {
                        tracing::debug!(status, tries, "retrying on upstream status");
                        Box::pin(backoff(policy)).await;
                        continue;
                    }
                    for f in &wb.filters {
                        if let Filter::ResponseHeaders(m) = f {
                            modify_headers(resp.headers_mut(), m);
                        }
                    }
                    affinity.issue(backend, idx, resp.headers_mut());
                    resp.extensions_mut().insert(UpstreamServed {
                        backend: backend.label.clone(),
                        header_time: Some(header_time),
                    });
                    return note(resp, Some(idx), Some(status), tries, None, connect);
                }
                Err(e) => {
                    if e.is_endpoint_failure() {
                        self.record(backend, idx, false);
                    }
                    let retry = (body.is_some() || replayable)
                        && forward::should_retry(
                            policy,
                            tries,
                            forward::TryOutcome::Error(&e),
                            replayable,
                        )
                        && within_budget(policy, started);
                    if !retry {
                        let resp = self.fail_on(backend, &e);
                        return note(resp, Some(idx), None, tries, Some(&e), connect);
                    }
                    self.metrics
                        .upstream_error_of(&backend.label, e.metrics_label());
                    tracing::debug!(error = %e, tries, "retrying after upstream error");
                    Box::pin(backoff(policy)).await;
                }
            }
        }
    }

    /// Sends a copy of the request head (without body) to `mirror`'s backend, fire-and-forget
    /// and bounded: when too many mirrors are in flight the copy is dropped.
    ///
    /// Request bodies are never mirrored: the copy has an empty body (and no
    /// `Content-Length`). The mirror's response is read and discarded. Must be called inside a
    /// tokio runtime.
    pub fn mirror(&self, parts: &http::request::Parts, mirror: &Mirror, ctx: &RequestCtx) {
        if mirror.percent <= 0.0 || fastrand::f64() * 100.0 >= mirror.percent {
            return;
        }
        let Some(backend) = self.backends.get(&mirror.backend).cloned() else {
            self.metrics.upstream_error("no_backend");
            return;
        };
        let Ok(permit) = self.mirrors.clone().try_acquire_owned() else {
            self.metrics.upstream_error("mirror_dropped");
            return;
        };
        let mut copy = Request::new(());
        *copy.method_mut() = parts.method.clone();
        *copy.uri_mut() = parts.uri.clone();
        *copy.version_mut() = parts.version;
        *copy.headers_mut() = parts.headers.clone();
        copy.headers_mut().remove(header::CONTENT_LENGTH);
        let (copy, ()) = copy.into_parts();
        let head = Head::prepare(copy, ctx, None, false);
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let run = async {
                let idx = backend.pick(&[])?;
                let none = bytes::Bytes::new();
                let (res, _) = backend
                    .try_once(idx, &head, empty(), &Default::default(), Some(&none), None)
                    .await;
                // An error of our own (a local limit) says nothing of the endpoint: not
                // recorded, as on the request path.
                match &res {
                    Ok(r) => _ = backend.record(idx, r.status().as_u16() < 500),
                    Err(e) if e.is_endpoint_failure() => _ = backend.record(idx, false),
                    Err(_) => {}
                }
                let mut body = res.ok()?.into_body();
                while let Some(frame) = body.frame().await {
                    frame.ok()?;
                }
                Some(())
            };
            if tokio::time::timeout(MIRROR_TIMEOUT, run)
                .await
                .ok()
                .flatten()
                .is_none()
            {
                metrics.upstream_error("mirror_failed");
            }
        });
    }
}

/// What the proxy did for one request, for the access log and the trace: a response
/// extension, set only when [`RequestCtx::log`] is on.
#[derive(Debug, Clone)]
pub struct UpstreamInfo {
    /// The backend chosen (by weight) for the request.
    pub backend: String,
    /// The endpoint of the last try (none when no endpoint could be picked).
    pub address: Option<String>,
    /// The status the endpoint answered with (none when no response came: connect error,
    /// reset, timeout).
    pub status: Option<u16>,
    /// Microseconds from the first try to the response head (or to the failure).
    pub header_us: Option<u64>,
    /// Microseconds the last try took to get its connection (a pooled one: about 0; a new
    /// one: TCP, TLS and the HTTP/2 handshake); none when it got none.
    pub connect_us: Option<u64>,
    /// Tries after the first.
    pub retries: u32,
    /// When the proxy call started (backend chosen, before the first try).
    pub started: Instant,
    /// The kind of error that ended the call (the `kind` label of
    /// `sweety_upstream_errors_total`), none when a response came.
    pub error: Option<&'static str>,
}

/// A request's session affinity towards one backend: the endpoint its session token names
/// (when still eligible) and its consistent-hash key. Shared by [`Upstreams::forward`] and
/// upgrades, so a WebSocket lands where the client's session (or hash) says.
struct Affinity<'a> {
    session: Option<&'a SessionPersistence>,
    token_in: Option<String>,
    sticky: Option<usize>,
    hash_key: Option<Vec<u8>>,
}

impl<'a> Affinity<'a> {
    fn of(backend: &'a BackendRt, headers: &http::HeaderMap, ctx: &RequestCtx) -> Affinity<'a> {
        let session = backend.config.session_persistence.as_ref();
        let token_in = session.and_then(|sp| affinity::token_from(headers, sp));
        let sticky = token_in.as_deref().and_then(|t| backend.by_token(t));
        let hash_key = match (&backend.config.hash, sticky) {
            (Some(h), None) => affinity::hash_key(h, headers, ctx.conn.peer.ip()),
            _ => None,
        };
        Affinity {
            session,
            token_in,
            sticky,
            hash_key,
        }
    }

    /// The endpoint for try number `tries` (0 first): the session's on the first try, else
    /// the hashed one, else the backend's balancing policy; preferring endpoints not in
    /// `tried`.
    fn pick(&self, backend: &BackendRt, tries: u32, tried: &[usize]) -> Option<usize> {
        if tries == 0 {
            if let Some(i) = self.sticky {
                return Some(i);
            }
        }
        self.hash_key
            .as_deref()
            .and_then(|k| backend.pick_hashed(k, tried))
            .or_else(|| backend.pick(tried))
    }

    /// Issues the session token of endpoint `idx` on the response, unless the client already
    /// sent that one.
    fn issue(&self, backend: &BackendRt, idx: usize, headers: &mut http::HeaderMap) {
        if let Some(sp) = self.session {
            let token = &backend.endpoints[idx].token;
            if self.token_in.as_deref() != Some(token.as_str()) {
                affinity::set_token(headers, sp, token);
            }
        }
    }
}

/// An endpoint chosen for a layer-4 connection.
#[derive(Debug)]
pub struct L4Target {
    backend: Arc<BackendRt>,
    idx: usize,
}

impl L4Target {
    /// The endpoint address (`host:port`).
    pub fn address(&self) -> &str {
        &self.backend.endpoints[self.idx].state.address
    }

    /// TCP to the endpoint ([`pool::connect_tcp`]: an ExternalName backend never reaches an
    /// internal address).
    pub async fn connect_tcp(&self) -> std::io::Result<tokio::net::TcpStream> {
        pool::connect_tcp(self.address(), self.backend.connector.external).await
    }

    /// The endpoint's addresses a connection may use ([`pool::resolve`]), for UDP.
    pub async fn resolve(&self) -> std::io::Result<Vec<std::net::SocketAddr>> {
        pool::resolve(self.address(), self.backend.connector.external).await
    }

    /// The backend's connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.backend.config.connect_timeout.get()
    }

    /// Whether the backend wants a PROXY protocol v2 header.
    pub fn send_proxy_protocol(&self) -> bool {
        self.backend.config.send_proxy_protocol
    }

    /// Records a connection attempt's outcome for outlier ejection.
    pub fn record(&self, ok: bool) {
        self.backend.record(self.idx, ok);
    }
}

/// Largest request body read into memory so that an idempotent request with a body can be
/// retried (only with a retry policy, and only with a `Content-Length` this small).
pub const RETRY_BODY_LIMIT: u64 = 64 * 1024;

/// With a retry policy (`retry`), the `Content-Length` of an idempotent request with a body
/// that [`retry_buffer`] reads into memory first: at most [`RETRY_BODY_LIMIT`]. `None`: the
/// request keeps its streaming body.
fn retry_body_len(parts: &http::request::Parts, body: &Body, retry: bool) -> Option<u64> {
    if !retry || !forward::is_idempotent(&parts.method) || http_body::Body::is_end_stream(body) {
        return None;
    }
    parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0 && n <= RETRY_BODY_LIMIT)
}

/// Reads the body of an idempotent request whose `Content-Length` is `len` (at most
/// [`RETRY_BODY_LIMIT`], from [`retry_body_len`]) into memory, so that a retry can send it
/// again. A client that breaks off or sends more or less than it announced gets 400.
async fn retry_buffer(body: Body, len: u64) -> Result<bytes::Bytes, Response<Body>> {
    // `len` is at most 64 KiB, so the casts cannot truncate.
    let mut buf = bytes::BytesMut::with_capacity(len as usize);
    let mut body = body;
    let bad = |why: &'static str| crate::body::text_response(http::StatusCode::BAD_REQUEST, why);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            // The body limits answer as they do elsewhere (the pipeline already refused a
            // Content-Length over max_request_body_bytes with 413).
            Err(e) => {
                return Err(match e.downcast_ref::<crate::limits::BodyLimitError>() {
                    Some(limit) => limit.response(),
                    None => bad("400 Bad Request: request body could not be read\n"),
                });
            }
        };
        // Trailers of an idempotent request with a small body are not kept.
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > len {
                return Err(bad(
                    "400 Bad Request: request body longer than its Content-Length\n",
                ));
            }
            buf.extend_from_slice(&data);
        }
    }
    if buf.len() as u64 != len {
        return Err(bad(
            "400 Bad Request: request body shorter than its Content-Length\n",
        ));
    }
    Ok(buf.freeze())
}

/// Whether another try, after the policy's backoff, would start within its `budget` counted
/// from `started` (the first try).
fn within_budget(policy: Option<&sweety_config::RetryPolicy>, started: Instant) -> bool {
    let Some(budget) = policy.and_then(|p| p.budget) else {
        return true;
    };
    let wait = policy
        .and_then(|p| p.backoff)
        .map_or(Duration::ZERO, |d| d.get());
    started.elapsed() + wait < budget.get()
}

async fn backoff(policy: Option<&sweety_config::RetryPolicy>) {
    if let Some(d) = policy.and_then(|p| p.backoff) {
        tokio::time::sleep(d.get()).await;
    }
}

/// The size of what a function returns, without calling it: for an `async fn`, the size of
/// its future (what every call writes into its caller's state, or into its box). Tests of the
/// request path's futures use it.
#[cfg(test)]
pub(crate) mod returned {
    macro_rules! returned {
        ($($name:ident($($a:ident),*);)*) => {$(
            /// The size of `f`'s return type.
            pub(crate) fn $name<F, $($a,)* R>(_f: &F) -> usize
            where
                F: FnOnce($($a),*) -> R,
            {
                std::mem::size_of::<R>()
            }
        )*};
    }
    /// Prints `sizes` (seen with `--nocapture`) and asserts each of `bounds`: a future named
    /// there that grew past its bound fails the test, by name.
    pub(crate) fn within_bounds(sizes: &[(&'static str, usize)], bounds: &[(&str, usize)]) {
        for (name, size) in sizes {
            eprintln!("{name:<28} {size:>6}");
        }
        for &(name, bound) in bounds {
            let got = sizes
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("no size for {name}"))
                .1;
            assert!(
                got <= bound,
                "{name}'s future grew to {got} bytes (bound {bound})"
            );
        }
    }

    returned! {
        of1(A);
        of2(A, B);
        of3(A, B, C);
        of4(A, B, C, D);
        of5(A, B, C, D, E);
        of6(A, B, C, D, E, G);
        of7(A, B, C, D, E, G, H);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::{ConnInfo, Protocol};
    use std::time::Instant;
    use sweety_config::Endpoint;

    const RA: u32 = sweety_config::DEFAULT_PROXY_READ_AHEAD;

    fn ctx() -> RequestCtx {
        RequestCtx {
            conn: Arc::new(ConnInfo {
                listener: "l".into(),
                peer: "192.0.2.1:5555".parse().unwrap(),
                local: "127.0.0.1:80".parse().unwrap(),
                tls: false,
                sni: None,
                client_cert: None,
                client_cert_verdict: Default::default(),
                forwarding: Default::default(),
                tls_version: None,
                tls_cipher: None,
                read_budget: None,
            }),
            protocol: Protocol::Http2,
            start: Instant::now(),
            log: false,
        }
    }

    fn backend(name: &str, addrs: &[&str]) -> Backend {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "endpoints": addrs.iter().map(|a| Endpoint { address: a.to_string(), weight: 1 }).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    /// The request path's futures, and what is moved through them, as sizes (printed with
    /// `--nocapture`).
    fn request_path_sizes() -> Vec<(&'static str, usize)> {
        use super::returned::*;
        use std::mem::size_of;
        let mut v = vec![
            ("Upstreams::forward", of5(&Upstreams::forward)),
            ("BackendRt::try_once", of7(&BackendRt::try_once)),
            ("proxy::retry_buffer", of2(&retry_buffer)),
            ("proxy::backoff", of1(&backoff)),
            ("Head", size_of::<Head>()),
            ("Affinity", size_of::<Affinity<'_>>()),
            ("Request<Body>", size_of::<Request<Body>>()),
            ("Response<Body>", size_of::<Response<Body>>()),
            ("http::request::Parts", size_of::<http::request::Parts>()),
            ("HeaderMap", size_of::<http::HeaderMap>()),
            ("Body", size_of::<Body>()),
        ];
        v.extend(pool::future_sizes());
        v
    }

    /// Every proxied request writes (and moves) these futures: opening a connection (TCP,
    /// TLS, the HTTP/2 handshake: ~7.8 KB in a debug build, twice in `within`) is boxed where
    /// it starts, so they stay within these bounds of a debug build (before: forward 18,320,
    /// try_once 17,088, the pool's acquire 16,168 bytes).
    #[test]
    fn request_path_futures_stay_small() {
        super::returned::within_bounds(
            &request_path_sizes(),
            &[
                ("Upstreams::forward", 4096),
                ("BackendRt::try_once", 3072),
                ("Pool::acquire_by", 1024),
                ("Pool::acquire_h2", 1024),
                ("Pool::open_h2", 1024),
            ],
        );
    }

    #[test]
    fn build_validates_and_reuses_state() {
        let m = Arc::new(Metrics::default());
        let b = vec![backend("a", &["127.0.0.1:1", "127.0.0.1:2"])];
        let first = Upstreams::build(&b, None, m.clone(), RA).unwrap();
        let again = Upstreams::build(&b, Some(&first), m.clone(), RA).unwrap();
        let same = |x: &Upstreams, y: &Upstreams, i: usize| {
            Arc::ptr_eq(
                &x.backends["a"].endpoints[i].state,
                &y.backends["a"].endpoints[i].state,
            )
        };
        assert!(same(&first, &again, 0) && same(&first, &again, 1));
        let mut changed = b.clone();
        changed[0].protocol = BackendProtocol::H2c;
        let other = Upstreams::build(&changed, Some(&again), m.clone(), RA).unwrap();
        assert!(!same(&again, &other, 0));

        let dup = vec![backend("a", &[]), backend("a", &[])];
        assert_eq!(
            Upstreams::build(&dup, None, m.clone(), RA)
                .unwrap_err()
                .index,
            1
        );
        let bad = vec![backend("a", &["nohost"])];
        assert!(Upstreams::build(&bad, None, m, RA).is_err());
    }

    #[test]
    fn h2_client_host_becomes_authority_and_h1_host() {
        let req = Request::builder()
            .uri("https://app.example:8443/p?q=1")
            .header("connection", "x-drop")
            .header("x-drop", "1")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let head = Head::prepare(parts, &ctx(), None, false);
        let h1 = head.build(empty(), "10.0.0.1:80", false, false);
        assert_eq!(h1.uri(), "/p?q=1");
        assert_eq!(h1.headers()["host"], "app.example:8443");
        assert_eq!(h1.headers()["x-forwarded-for"], "192.0.2.1");
        assert_eq!(h1.headers()["x-forwarded-host"], "app.example:8443");
        assert!(h1.headers().get("x-drop").is_none());
        let h2 = head.build(empty(), "10.0.0.1:80", true, true);
        assert_eq!(h2.uri(), "https://app.example:8443/p?q=1");
        assert!(h2.headers().get("host").is_none());
    }

    #[test]
    fn pick_skips_zero_weight_and_prefers_untried() {
        let m = Arc::new(Metrics::default());
        let mut b = backend("a", &["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        b.endpoints[1].weight = 0;
        let u = Upstreams::build(&[b], None, m, RA).unwrap();
        let rt = &u.backends["a"];
        for _ in 0..20 {
            assert_ne!(rt.pick(&[]), Some(1));
            assert_eq!(rt.pick(&[0]), Some(2));
        }
        // Everything tried: any eligible endpoint again.
        assert!(matches!(rt.pick(&[0, 2]), Some(0) | Some(2)));
    }

    proptest::proptest! {
        /// The pick by bit sets chooses as the listed one: the same endpoint under round robin
        /// (both states advance alike), one of the same candidates under least request, for
        /// any weights (0 among them), health-check verdicts, ejections (all of them: panic
        /// mode) and endpoints tried already.
        #[test]
        fn picks_by_bits_are_the_listed_ones(
            eps in proptest::collection::vec((0u32..3, proptest::bool::ANY, proptest::bool::ANY), 1..7),
            tried in proptest::collection::vec(0usize..7, 0..4),
            least in proptest::bool::ANY,
        ) {
            let addrs: Vec<String> = (0..eps.len()).map(|i| format!("127.0.0.1:{}", 1 + i)).collect();
            let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
            let mut b = backend("a", &refs);
            if least {
                b.lb = sweety_config::LbPolicy::LeastRequest;
            }
            b.outlier.consecutive_failures = 1;
            b.outlier.max_ejection_percent = 100;
            for (i, (w, _, _)) in eps.iter().enumerate() {
                b.endpoints[i].weight = *w;
            }
            let m = Arc::new(Metrics::default());
            let bits = Upstreams::build(&[b.clone()], None, m.clone(), RA).unwrap();
            let listed = Upstreams::build(&[b], None, m, RA).unwrap();
            for u in [&bits, &listed] {
                let rt = &u.backends["a"];
                for (i, (_, down, ejected)) in eps.iter().enumerate() {
                    rt.endpoints[i].state.hc_up.store(!down, std::sync::atomic::Ordering::Release);
                    if *ejected {
                        rt.record(i, false);
                    }
                }
            }
            let (a, b) = (&bits.backends["a"], &listed.backends["a"]);
            for _ in 0..8 {
                let x = a.pick(&tried);
                let y = b.pick_listed(&tried);
                if least {
                    let eligible = b.eligible();
                    let fresh: Vec<usize> =
                        eligible.iter().copied().filter(|i| !tried.contains(i)).collect();
                    let pool = if fresh.is_empty() { eligible } else { fresh };
                    proptest::prop_assert_eq!(x.is_some(), y.is_some());
                    proptest::prop_assert!(x.is_none_or(|i| pool.contains(&i)), "{:?} {:?}", x, pool);
                } else {
                    proptest::prop_assert_eq!(x, y);
                }
            }
        }
    }
}
