//! The one request pipeline every protocol goes through (see docs/request-phases.md):
//!
//! 0. **identity**: one normalised authority and path, and checked body framing, or 400
//!    ([`crate::identity`]);
//! 1. **admit**: a request from TLS early data (HTTP/3 0-RTT) with an unsafe method gets 425
//!    Too Early; otherwise take a slot from the backpressure core (bounded wait, else 503 +
//!    Retry-After);
//! 2. **snapshot**: pin the current config; the request finishes on it even if a reload swaps
//!    in a newer one meanwhile;
//! 3. **route**: host (421 on a misdirected request), then path/method/headers/query (404);
//! 4. **request filters**: IP access lists and rate limits first, then basic authentication
//!    ([`crate::basic_auth`], 401), then external authentication ([`crate::ext_auth`]: a
//!    subrequest decides 401/302/403/500 or passes with its headers), then header modifiers, rewrites, redirects, CORS preflight,
//!    mirrors;
//! 5. **action**: proxy, static files or a fixed reply, under the route's request timeout;
//! 6. **response filters**: header modifiers, CORS, `Alt-Svc`;
//! 7. **account**: metrics at the response head; the access log line and the release of the
//!    request slot when the response body is finished or dropped.
//!
//! Protocol adapters (hyper for H1/H2, h3 for HTTP/3) only convert bodies and call [`handle`].

use crate::access_log::{now_ms, LogLine};
use crate::body::{text_response, Body, BoxError};
use crate::cache::StoredHead;
use crate::ctx::{ConnInfo, EarlyData, Protocol, RequestCtx};
use crate::filters::RequestOutcome;
use crate::limits::{LimitedBody, RequestPermit};
use crate::router::{Lookup, RequestHead};
use crate::state::{ListenerView, Shared};
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use std::borrow::Cow;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use sweety_config::Action;

/// Route label used when no route matched.
pub const NO_ROUTE: &str = crate::metrics::series::NO_ROUTE;

/// The backend label of a response no backend made.
fn no_backend() -> &'static Arc<str> {
    static NONE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Arc::from(crate::metrics::NO_BACKEND))
}

/// Serves one request through every phase. Never fails: every problem becomes a response.
pub async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    protocol: Protocol,
    req: Request<Body>,
) -> Response<Body> {
    let (mut resp, stored) = serve(shared, conn, protocol, req, None, Instant::now()).await;
    if let Some(head) = stored {
        head.materialize(&mut resp, false);
    }
    resp
}

/// The pipeline as Sweety's HTTP/2 engine's service for one connection. It keeps the
/// snapshot of its last request while no reload happened (`Shared::snapshot_for`), starts each
/// request at the engine's clock reading for the batch it came in, and lets a cache hit's
/// stored head go to the engine as it is (the engine sends it ahead of the map's fields)
/// when nothing in the response phase needs the map.
pub struct H2Pipeline {
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    snap: Option<(u64, Arc<crate::state::Snapshot>)>,
}

impl H2Pipeline {
    /// The service of one connection.
    pub fn new(shared: Arc<Shared>, conn: Arc<ConnInfo>) -> H2Pipeline {
        H2Pipeline {
            shared,
            conn,
            snap: None,
        }
    }
}

/// A request's answer as the engine runs it: the request future itself, boxed where it is
/// built (a wrapping `async fn` would copy the whole unstarted future, ~2.7 KB, per request).
type H2Answer =
    Pin<Box<dyn std::future::Future<Output = (Response<Body>, Option<StoredHead>)> + Send>>;

impl sweety_h2::H2Service for H2Pipeline {
    type Head = StoredHead;
    type Future = H2Answer;

    fn call(&mut self, req: Request<Body>, now: Instant) -> H2Answer {
        let (shared, conn) = (self.shared.clone(), self.conn.clone());
        let snap = self.shared.snapshot_for(&mut self.snap);
        sweety_h2::box_in_place(move || serve(shared, conn, Protocol::Http2, req, Some(snap), now))
    }

    fn limit_hit(&self, what: &'static str) {
        self.shared.metrics.limit_hit(what);
    }

    fn connection_error(&self, reason: sweety_h2::Reason, why: &'static str) {
        tracing::debug!(%reason, why, peer = %self.conn.peer, "HTTP/2 connection error");
        self.shared.metrics.edge_events.inc(&"h2_connection_error");
    }

    fn blocked_at_eof(&self) {
        self.shared.metrics.edge_events.inc(&"h2_blocked_at_eof");
    }

    fn on_poll(&mut self) {
        if !self.shared.is_current(&self.snap) {
            // A reload happened: hold no older config than the in-flight requests do.
            self.snap = None;
        }
    }

    fn on_idle(&mut self) {
        self.snap = None;
    }
}

/// The pipeline as Sweety's HTTP/1.1 engine's service for one connection: like
/// [`H2Pipeline`], it keeps the snapshot of its last request while no reload happened and
/// boxes each request future where it is built.
pub struct H1Pipeline {
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    snap: Option<(u64, Arc<crate::state::Snapshot>)>,
}

impl H1Pipeline {
    /// The service of one connection.
    pub fn new(shared: Arc<Shared>, conn: Arc<ConnInfo>) -> H1Pipeline {
        H1Pipeline {
            shared,
            conn,
            snap: None,
        }
    }
}

/// A request's answer as Sweety's HTTP/1.1 engine runs it.
type H1Answer = Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send>>;

impl sweety_h1::server::Service for H1Pipeline {
    type Body = Body;
    type Future = H1Answer;

    fn call(&mut self, req: Request<sweety_h1::server::RecvBody>) -> H1Answer {
        let (shared, conn) = (self.shared.clone(), self.conn.clone());
        let snap = self.shared.snapshot_for(&mut self.snap);
        // A request without a body (a GET's, the usual one) gets the empty body, which boxes
        // nothing: its own empty body is nothing but that (no feed, nothing to drop).
        let req = req.map(|b| {
            if http_body::Body::is_end_stream(&b) {
                crate::body::empty()
            } else {
                crate::body::boxed(b)
            }
        });
        sweety_h2::box_in_place(move || async move {
            let (mut resp, stored) = serve(
                shared,
                conn,
                Protocol::Http1,
                req,
                Some(snap),
                Instant::now(),
            )
            .await;
            if let Some(head) = stored {
                head.materialize(&mut resp, false);
            }
            resp
        })
    }

    fn limit_hit(&self, what: &'static str) {
        self.shared.metrics.limit_hit(what);
    }

    fn on_idle(&mut self) {
        self.snap = None;
    }
}

/// Phases 1–7 of one request. `snap`: the snapshot to use (else the current one); `start`:
/// when the request was read. A cache hit's stored head may come back beside the response
/// ([`StoredHead`]) instead of in its header map, when nothing in the response phase needs
/// the map: [`handle`] puts it into the map, the HTTP/2 engine sends it pre-encoded.
async fn serve(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    protocol: Protocol,
    req: Request<Body>,
    snap: Option<Arc<crate::state::Snapshot>>,
    start: Instant,
) -> (Response<Body>, Option<StoredHead>) {
    let snap = snap.unwrap_or_else(|| shared.snapshot());
    let view = snap.listener(&conn.listener);
    // The real client behind trusted proxies (see `crate::access`).
    let mut req = req;
    // The connection's peer, before trusted proxies name the real client.
    let peer = conn.peer;
    let trusted = snap.access.client_ip.is_trusted(peer.ip());
    // A client that is not a trusted proxy cannot claim another address, host or scheme.
    if !trusted {
        crate::proxy::forward::drop_client_forwarding(req.headers_mut());
    }
    // Exactly one X-Request-Id, kept only from a trusted proxy (see `crate::request_id`): the
    // backend gets it with the request, the client with the response, the log records it.
    let request_id = crate::request_id::establish(req.headers_mut(), trusted);
    let conn = if snap.access.client_ip.is_empty() {
        conn
    } else {
        snap.access.client_ip.resolve(&conn, req.headers_mut())
    };
    let limits = &snap.config.limits;

    // 0. one identity: authority, path and body framing (see `crate::identity`).
    let refused =
        crate::identity::establish(&mut req, protocol, &snap.config.path_normalization).err();

    // 1. admit
    let too_early = req.extensions().get::<EarlyData>().is_some()
        && !crate::ctx::early_data_allowed(req.method());
    // The client's share of the request slots (`limits.max_requests_per_client`).
    let client = if too_early || refused.is_some() {
        Ok(None)
    } else {
        shared
            .client_requests
            .try_take(conn.peer.ip(), limits.max_requests_per_client)
    };
    let over_client = client.is_err();
    // Boxed: the request future (moved per request) grows by a pointer, not by the slot.
    let client_slot = client.ok().flatten().map(Box::new);
    let permit = if too_early || refused.is_some() || over_client {
        None
    } else {
        let limit = view.and_then(|v| v.limit.as_deref());
        match shared.backpressure.try_admit(limit) {
            Some(p) => Some(p),
            None => shared
                .backpressure
                .admit(limit, limits.queue_timeout.get())
                .await
                .ok(),
        }
    };
    // Tracing (see `crate::trace`); off, one test of the config.
    let mut trace = match &snap.config.tracing {
        None => None,
        Some(_) => begin_trace(&shared, &mut req, &request_id, start),
    };
    let ctx = RequestCtx {
        conn,
        protocol,
        start,
        log: shared.access_log.enabled() || trace.is_some(),
    };
    let log = shared
        .access_log
        .enabled()
        .then(|| Box::new(LogStart::new(&req, peer, request_id.clone())));
    // What the response phase needs from the request (compression captures its own).
    let method = req.method().clone();
    let grpc = crate::grpc::kind(req.headers());
    // A host that asks for client certificates is not offered HTTP/3 (QUIC handshakes never
    // ask for one, so its requests there are answered 421).
    let no_alt_svc = view
        .and_then(|v| v.host_auth.as_deref())
        .is_some_and(|a| a.protects(&request_host(&req)));

    let served = if let Some(e) = refused {
        shared.metrics.limit_hit("malformed_request");
        Served::unrouted(e.response())
    } else if too_early {
        shared.metrics.limit_hit("early_data");
        let status = StatusCode::from_u16(425).expect("425 is a valid status");
        let r = text_response(status, "425 Too Early: retry after the handshake\n");
        Served::unrouted(r)
    } else if over_client || permit.is_none() {
        let (status, text) = if over_client {
            shared.metrics.limit_hit("client_requests");
            (
                StatusCode::TOO_MANY_REQUESTS,
                "429 Too Many Requests: too many requests in flight from this client\n",
            )
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "503 Service Unavailable: server overloaded, retry later\n",
            )
        };
        let mut r = text_response(status, text);
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(limits.retry_after_seconds),
        );
        Served::unrouted(r)
    } else {
        route_and_serve(&shared, &snap, view, &ctx, req).await
    };
    let Served {
        route: route_name,
        response: mut resp,
        matched: filters_entry,
        mut stored,
        received,
    } = served;

    // 6. response filters
    let alt_svc = view
        .and_then(|v| v.alt_svc.as_ref())
        .filter(|_| protocol != Protocol::Http3 && !no_alt_svc);
    if let Some(head) = stored.take() {
        // A hit's stored head stays out of the header map only if nothing below reads or
        // replaces its fields.
        let needs_map = filters_entry.as_ref().is_some_and(|m| {
            m.entry.filters.has_response_filters() || m.entry.filters.content().compress.is_some()
        }) || grpc.is_some()
            || alt_svc.is_some_and(|_| head.contains(&header::ALT_SVC))
            // A stored response's own id (its first request's) must not go out beside ours.
            || head.contains(&crate::request_id::X_REQUEST_ID);
        if needs_map {
            head.materialize(&mut resp, protocol == Protocol::Http2);
        } else {
            stored = Some(head);
        }
    }
    if let Some(m) = filters_entry {
        if m.entry.filters.has_response_filters() {
            let (mut parts, body) = resp.into_parts();
            m.entry.filters.on_response(m.origin.as_ref(), &mut parts);
            resp = Response::from_parts(parts, body);
        }
        if let Some(c) = &m.entry.filters.content().compress {
            resp = crate::compress::apply(c, &method, &m.accept_encoding, resp);
        }
    }
    if let Some(kind) = grpc {
        resp = crate::grpc::rewrite_generated(resp, kind);
    }
    if let Some(alt) = alt_svc {
        resp.headers_mut().insert(header::ALT_SVC, alt.clone());
    }
    resp.headers_mut()
        .insert(crate::request_id::X_REQUEST_ID.clone(), request_id);

    // 7. account
    let status = resp.status().as_u16();
    let series = {
        // The backend that answered, as the proxy phase left it (none: static content,
        // redirects, cache hits, refusals).
        let upstream = resp.extensions().get::<crate::proxy::UpstreamServed>();
        shared.metrics.record_request(
            &crate::metrics::Record {
                listener: &ctx.conn.listener,
                route: &route_name,
                backend: upstream.map_or(no_backend(), |u| &u.backend),
                method: crate::metrics::method_index(&method),
                status,
                elapsed: start.elapsed(),
                upstream: upstream.and_then(|u| u.header_time),
            },
            protocol,
        )
    };
    let mut log = log;
    let mut upstream = if ctx.log {
        resp.extensions_mut().remove::<crate::proxy::UpstreamInfo>()
    } else {
        None
    };
    if let Some(t) = trace.as_deref_mut() {
        t.upstream = if log.is_some() {
            upstream.clone()
        } else {
            upstream.take()
        };
    }
    if let Some(l) = log.as_deref_mut() {
        l.cache = match &stored {
            Some(head) => Some(head.x_cache()),
            None => resp
                .headers()
                .get("x-cache")
                .and_then(|v| match v.as_bytes() {
                    b"HIT" => Some("HIT"),
                    b"MISS" => Some("MISS"),
                    b"STALE" => Some("STALE"),
                    _ => None,
                }),
        };
        l.upstream = upstream;
    }
    let mut permit = permit;
    if let Some(slot) = resp
        .extensions_mut()
        .remove::<crate::websocket::PermitSlot>()
    {
        // An upgraded tunnel holds the request slot for its whole life.
        if let Some(p) = permit.take() {
            slot.hand_over(p);
        }
    }
    let finish = Finish {
        shared,
        ctx,
        status,
        series,
        received,
        route: route_name,
        log,
        trace,
        _permit: permit,
        _client: client_slot,
    };
    let resp = resp.map(|inner| {
        crate::body::boxed(AccountedBody {
            inner,
            sent: 0,
            finish: Some(finish),
        })
    });
    (resp, stored)
}

/// What phases 2–5 made of one request: its response and what the response phase needs.
struct Served<'a> {
    /// The matched route's name ([`NO_ROUTE`] when no route matched).
    route: Arc<str>,
    response: Response<Body>,
    /// The matched route, for the response filters.
    matched: Option<Matched<'a>>,
    /// A cache hit's stored head, kept out of the header map while nothing reads it.
    stored: Option<StoredHead>,
    /// Request body bytes the proxy read (proxied requests with a body).
    received: Option<Arc<AtomicU64>>,
}

impl<'a> Served<'a> {
    /// A response no route is accountable for (a refusal before routing, or no route matched).
    fn unrouted(response: Response<Body>) -> Served<'a> {
        Served {
            route: Arc::from(NO_ROUTE),
            response,
            matched: None,
            stored: None,
            received: None,
        }
    }

    /// A response of the matched route.
    fn routed(
        route: Arc<str>,
        response: Response<Body>,
        matched: Matched<'a>,
        stored: Option<StoredHead>,
    ) -> Served<'a> {
        Served {
            route,
            response,
            matched: Some(matched),
            stored,
            received: None,
        }
    }
}

/// The route a request matched, for the response filters.
struct Matched<'a> {
    entry: &'a crate::router::RouteEntry,
    /// The request's `Accept-Encoding` values when the route compresses (else empty).
    accept_encoding: Vec<HeaderValue>,
    /// The request's `Origin` (as it came, before the request filters) when the route has
    /// response filters (CORS uses it).
    origin: Option<HeaderValue>,
}

/// What [`route`] decided: the answer (a refusal, a redirect, a cache hit…), or the
/// route's action to run. `Acting` is not boxed: [`act`] takes it apart before any await (the
/// request into the action's own allocation, the rest into its future); boxed, it cost every
/// routed request an allocation and a copy of its ~450 bytes into fresh memory.
// Boxing `Answered` instead would allocate for every answered request.
#[allow(clippy::large_enum_variant)]
enum Routed<'a> {
    Answered(Served<'a>),
    Act(Acting<'a>),
    /// The route asks for credentials: checked (async) before the rest of phase 4.
    Auth(Box<Authenticating<'a>>),
}

/// A request waiting for its authentication (basic, then external).
struct Authenticating<'a> {
    basic: Option<Arc<crate::basic_auth::BasicAuthRules>>,
    external: Option<Arc<crate::ext_auth::ExtAuthRules>>,
    /// The router's host (the external check's `X-Original-URL` and signin use it).
    host: String,
    route_name: Arc<str>,
    matched: Matched<'a>,
    req: Request<Body>,
    cache_host: Option<String>,
    prefix: Option<&'a str>,
    in_flight: Vec<crate::access::InFlightGuard>,
}

/// What phase 5 (the action) needs from phases 2–4: the request, which [`start_action`]
/// takes whole, and what [`act`] keeps for the response phase.
struct Acting<'a> {
    route_name: Arc<str>,
    matched: Matched<'a>,
    request: ActionRequest<'a>,
    in_flight: Vec<crate::access::InFlightGuard>,
    /// What an error page request needs of this request, taken before the route's request
    /// filters (routes with error pages only).
    /// (One boxed field: the request future stays small.)
    pages: Option<Box<crate::error_pages::Plan<'a>>>,
}

/// The request as the route's action takes it ([`start_action`]), and how the action is to
/// run it.
struct ActionRequest<'a> {
    parts: http::request::Parts,
    body: Body,
    /// (Boxed: upgrades are rare, and the request future stays small.)
    upgrade: Option<Box<crate::websocket::UpgradeRequest>>,
    /// gRPC-Web translation of a proxy route.
    web: Option<crate::grpc::GrpcKind>,
    /// The cache policy and key of a cacheable request, and what the lookup found.
    cache: Option<(&'a sweety_config::CachePolicy, crate::cache::RequestKey)>,
    found: Option<crate::cache::Found>,
}

/// Phases 2–5. Phases 2–4 and a fresh cache hit are plain code ([`route`]), run when this is
/// called: a request they answer never builds the future of the action ([`act`]). A plain
/// function returning the future of what routing decided, not an `async fn`: that one kept
/// the request (its parameter) and the routing outcome beside the action's future, ~500
/// bytes more in every request's future.
fn route_and_serve<'a>(
    shared: &'a Shared,
    snap: &'a crate::state::Snapshot,
    view: Option<&'a ListenerView>,
    ctx: &'a RequestCtx,
    req: Request<Body>,
) -> impl std::future::Future<Output = Served<'a>> + use<'a> {
    use futures_util::future::Either;
    match route(shared, snap, view, ctx, req) {
        Routed::Answered(s) => Either::Left(std::future::ready(s)),
        Routed::Act(a) => Either::Right(Either::Left(act(shared, snap, ctx, a))),
        // Boxed: only requests to routes with authentication carry its future.
        Routed::Auth(a) => Either::Right(Either::Right(Box::pin(authenticated(
            shared, snap, view, ctx, *a,
        )))),
    }
}

/// Phase 4b (basic, then external authentication), then the rest of phase 4 and the action.
async fn authenticated<'a>(
    shared: &Shared,
    snap: &'a crate::state::Snapshot,
    view: Option<&ListenerView>,
    ctx: &RequestCtx,
    a: Authenticating<'a>,
) -> Served<'a> {
    let mut a = a;
    let refused = |a: Authenticating<'a>, r: Response<Body>| {
        shared.metrics.edge_events.inc(&"auth_refused");
        let r = crate::access::hold(r, a.in_flight);
        Served::routed(a.route_name, r, a.matched, None)
    };
    if let Some(basic) = &a.basic {
        if let Err(r) = basic.check(a.req.headers()).await {
            return refused(a, r);
        }
    }
    let mut allowed = None;
    if let Some(external) = a.external.clone() {
        match external.check(&mut a.req, &a.host, ctx).await {
            crate::ext_auth::Decision::Allow(ok) => allowed = Some(ok),
            crate::ext_auth::Decision::Deny(r) => return refused(a, r),
        }
    }
    let mut served = authorized(shared, snap, view, ctx, a).await;
    if let Some(ok) = allowed {
        ok.set_cookies(&mut served.response);
    }
    served
}

/// The rest of phase 4 and the action of an authenticated request.
async fn authorized<'a>(
    shared: &Shared,
    snap: &'a crate::state::Snapshot,
    view: Option<&ListenerView>,
    ctx: &RequestCtx,
    a: Authenticating<'a>,
) -> Served<'a> {
    // `route` only asks for authentication with a listener view.
    let Some(view) = view else {
        return Served::unrouted(text_response(
            StatusCode::NOT_FOUND,
            "404 Not Found: listener is being removed\n",
        ));
    };
    match after_access(
        shared,
        snap,
        view,
        ctx,
        a.req,
        a.cache_host,
        a.prefix,
        a.route_name,
        a.matched,
        a.in_flight,
    ) {
        Routed::Answered(s) => s,
        Routed::Act(a) => act(shared, snap, ctx, a).await,
        Routed::Auth(_) => unreachable!("after_access never asks for authentication"),
    }
}

/// Phases 2–4 and the cache's fresh hits.
fn route<'a>(
    shared: &Shared,
    snap: &'a crate::state::Snapshot,
    view: Option<&ListenerView>,
    ctx: &RequestCtx,
    mut req: Request<Body>,
) -> Routed<'a> {
    let Some(view) = view else {
        return Routed::Answered(Served::unrouted(text_response(
            StatusCode::NOT_FOUND,
            "404 Not Found: listener is being removed\n",
        )));
    };
    // Client certificates of the host (`host_client_auth`): the connection must have been
    // made for it, the certificate verify for it; the backend learns the outcome in the
    // `ssl-client-*` headers (see `crate::client_cert`), which only Sweety sets, on any host.
    crate::client_cert::strip_headers(req.headers_mut());
    if let Some(auth) = &view.host_auth {
        let h = request_host(&req).into_owned();
        let m = &shared.metrics;
        if let Some(r) = auth.check(&ctx.conn, ctx.protocol, &h, req.headers_mut(), m) {
            return Routed::Answered(Served::unrouted(r));
        }
    }
    let host = request_host(&req);
    if ctx.conn.tls {
        // A passthrough host is served by its backend's own TLS: a request for it on a
        // connection made for another name (HTTP/2 or HTTP/3 connection reuse under a shared
        // certificate) is told to connect again, which then passes through.
        if view
            .passthrough
            .as_ref()
            .is_some_and(|p| p.route_index(Some(&host)).is_some())
        {
            return Routed::Answered(Served::unrouted(text_response(
                StatusCode::MISDIRECTED_REQUEST,
                "421 Misdirected Request: host is passed through on its own connections\n",
            )));
        }
        if let Some(sni) = ctx.conn.sni.as_deref() {
            // 421 only when the Host falls into another certificate scope (Gateway
            // listener) than the SNI chose; the same scope's other names are served.
            if view
                .sni_scopes
                .as_ref()
                .is_some_and(|s| s.misdirected(sni, &host))
            {
                return Routed::Answered(Served::unrouted(text_response(
                    StatusCode::MISDIRECTED_REQUEST,
                    "421 Misdirected Request: host does not match the TLS server name\n",
                )));
            }
        }
    }
    let head = RequestHead {
        listener: &view.name,
        host: &host,
        method: req.method(),
        path: req.uri().path(),
        query: req.uri().query(),
        headers: req.headers(),
    };
    let (entry, prefix) = match snap.routes.lookup(&head) {
        Lookup::Matched(m) => (m.entry, m.prefix),
        Lookup::NoHost | Lookup::NoRoute => {
            return Routed::Answered(Served::unrouted(text_response(
                StatusCode::NOT_FOUND,
                "404 Not Found: no route matches this host and path\n",
            )));
        }
    };
    let route_name = entry.name.clone();
    // The body limit: the route's (`proxy-body-size`), else the dataplane's.
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        if len > body_limit(&entry.route, &snap.config.limits) {
            shared.metrics.limit_hit("body_too_large");
            return Routed::Answered(Served::unrouted(
                crate::limits::BodyLimitError::TooLarge.response(),
            ));
        }
    }
    // What compression needs from the request, kept only for routes that compress.
    let accept_encoding: Vec<HeaderValue> = match entry.filters.content().compress {
        Some(_) => req
            .headers()
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    let origin = if entry.filters.has_response_filters() {
        req.headers().get(header::ORIGIN).cloned()
    } else {
        None
    };
    let matched = Matched {
        entry,
        accept_encoding,
        origin,
    };

    // 4a. access rules: IP allow/deny lists (403), then rate and concurrency limits (their
    // status, 429 by default).
    let mut in_flight = Vec::new();
    if let Some(rules) = snap.access.route(&entry.route) {
        match rules.check(ctx.conn.peer.ip(), req.headers(), Instant::now()) {
            Ok(guards) => in_flight = guards,
            Err(refusal) => {
                let r = crate::access::refusal_response(refusal, &shared.metrics);
                return Routed::Answered(Served::routed(route_name, r, matched, None));
            }
        }
    }
    let cache_host: Option<String> = entry
        .filters
        .content()
        .cache
        .as_ref()
        .map(|_| host.to_string());
    // 4b. basic authentication (401), then external authentication (a subrequest), run by
    // `route_and_serve` (bcrypt runs off the event loop, the subrequest is async); before
    // every request filter, mirror and the cache.
    let rules = snap.access.route(&entry.route);
    let basic = rules.and_then(|r| r.basic_auth()).cloned();
    let external = rules.and_then(|r| r.external_auth()).cloned();
    if basic.is_some() || external.is_some() {
        return Routed::Auth(Box::new(Authenticating {
            basic,
            external,
            host: host.to_string(),
            route_name,
            matched,
            req,
            cache_host,
            prefix,
            in_flight,
        }));
    }
    after_access(
        shared, snap, view, ctx, req, cache_host, prefix, route_name, matched, in_flight,
    )
}

/// Phase 4 after the access rules (and authentication): request filters, mirrors, the
/// cache's fresh hits.
#[allow(clippy::too_many_arguments)]
fn after_access<'a>(
    shared: &Shared,
    snap: &'a crate::state::Snapshot,
    view: &ListenerView,
    ctx: &RequestCtx,
    req: Request<Body>,
    cache_host: Option<String>,
    prefix: Option<&'a str>,
    route_name: Arc<str>,
    matched: Matched<'a>,
    in_flight: Vec<crate::access::InFlightGuard>,
) -> Routed<'a> {
    let entry = matched.entry;
    let upgrade = crate::websocket::upgrade_request(&req);

    // 4. request filters
    let (mut parts, body) = req.into_parts();
    let page_request = entry
        .filters
        .content()
        .error_pages
        .as_ref()
        .and_then(|e| e.page_request(&parts));
    if let RequestOutcome::Respond(r) =
        entry
            .filters
            .on_request(&mut parts, ctx.scheme(), view.port, prefix)
    {
        return Routed::Answered(Served::routed(route_name, r, matched, None));
    }
    for m in entry.filters.mirrors() {
        snap.upstreams.mirror(&parts, m, ctx);
    }

    // What a proxy route with content filters does with this request: gRPC-Web
    // translation, or the cache (with its key).
    let route = &entry.route;
    let content = entry.filters.content();
    let web = match &route.action {
        Action::Proxy(_) if upgrade.is_none() => content
            .grpc
            .as_ref()
            .filter(|g| g.web)
            .and_then(|_| crate::grpc::kind(&parts.headers))
            .filter(|k| *k != crate::grpc::GrpcKind::Grpc),
        _ => None,
    };
    // A route without an endpoint is served by its page backend (`error_pages`), whose
    // answer passes as it is: not cached, never intercepted.
    let unavailable = match (&route.action, content.error_pages.as_deref()) {
        (Action::Proxy(p), Some(e)) => e.unavailable(p, &snap.upstreams, &mut parts.headers),
        _ => None,
    };
    let pages = match unavailable {
        Some(p) => {
            shared.metrics.edge_events.inc(&"default_backend");
            Some(Box::new(crate::error_pages::Plan::Unavailable(p)))
        }
        None => page_request.map(|r| Box::new(crate::error_pages::Plan::Intercept(r))),
    };
    let cache_key = match &route.action {
        Action::Proxy(_) if upgrade.is_none() && web.is_none() && unavailable.is_none() => content
            .cache
            .as_ref()
            .zip(cache_host)
            .and_then(|(cp, host)| {
                let key = crate::cache::request_key(
                    cp,
                    &parts.method,
                    &host,
                    &parts.uri,
                    &parts.headers,
                )?
                .scoped(ctx.scheme(), view.port, &entry.name);
                Some((cp, key))
            }),
        _ => None,
    };
    // A fresh cache hit is answered here, before the upstream path is built; what else the
    // lookup found goes on to `Cache::serve`.
    let mut found = None;
    if let Some((_, key)) = &cache_key {
        match shared.cache.fresh_hit(
            key,
            &parts.headers,
            ctx.start,
            ctx.protocol == Protocol::Http2,
        ) {
            Ok((hit, stored)) => {
                let hit = crate::access::hold(hit, in_flight);
                return Routed::Answered(Served::routed(route_name, hit, matched, stored));
            }
            Err(f) => found = f,
        }
    }
    Routed::Act(Acting {
        route_name,
        matched,
        request: ActionRequest {
            parts,
            body,
            upgrade: upgrade.map(Box::new),
            web,
            cache: cache_key,
            found,
        },
        in_flight,
        pages,
    })
}

/// Phase 5: starts the route's action with the request ([`start_action`]: the request's head
/// and body go into the action's own allocation now, before any await) and returns the future
/// of its answer under the route's request timeout, which holds what the response phase needs
/// and the action's future ([`ActionFuture`]), never the request. A plain function: as an
/// `async fn` it took [`Acting`] boxed (an allocation and a copy per request), or kept it
/// whole in its future. Inlined, so that the future is built where its caller keeps it
/// (returned from a call that is not inlined, a future is copied whole once more).
#[inline(always)]
fn act<'x, 'a: 'x>(
    shared: &'x Shared,
    snap: &'a crate::state::Snapshot,
    ctx: &'x RequestCtx,
    a: Acting<'a>,
) -> impl std::future::Future<Output = Served<'a>> + use<'x, 'a> {
    let Acting {
        route_name,
        matched,
        request,
        in_flight,
        pages,
    } = a;
    let mut received: Option<Arc<AtomicU64>> = None;
    let action = start_action(
        shared,
        snap,
        ctx,
        matched.entry,
        request,
        pages.as_deref(),
        &mut received,
    );
    async move {
        let entry = matched.entry;
        let content = entry.filters.content();
        let resp = match entry.route.timeouts.request {
            Some(t) => match tokio::time::timeout(t.get(), action).await {
                Ok(r) => r,
                Err(_) => {
                    shared.metrics.upstream_error("request_timeout");
                    text_response(
                        StatusCode::GATEWAY_TIMEOUT,
                        "504 Gateway Timeout: request timeout exceeded\n",
                    )
                }
            },
            None => action.await,
        };
        // Phase 5b: a listed status of the action replaced by the route's error page.
        let resp = match (content.error_pages.as_deref(), pages) {
            (Some(e), Some(plan)) => {
                Box::pin(e.finish(*plan, resp, &snap.upstreams, ctx, &shared.metrics)).await
            }
            (_, _) => resp,
        };
        let resp = crate::access::hold(resp, in_flight);
        let mut served = Served::routed(route_name, resp, matched, None);
        served.received = received;
        served
    }
}

/// The future of a route's action: an answer made at once (a fixed reply), or the action
/// running in its own allocation (the proxy's forwarding future is built in its box).
enum ActionFuture<'x> {
    Ready(Option<Response<Body>>),
    Running(Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send + 'x>>),
}

impl std::future::Future for ActionFuture<'_> {
    type Output = Response<Body>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<Body>> {
        match self.get_mut() {
            ActionFuture::Ready(r) => {
                Poll::Ready(r.take().expect("an action is not polled after its answer"))
            }
            ActionFuture::Running(f) => f.as_mut().poll(cx),
        }
    }
}

/// Starts `entry`'s action (phase 5) with the request: the proxy (WebSocket, gRPC-Web,
/// through the cache, or straight to the backend), static files or a fixed reply; `pages`:
/// the route's error page plan for this request. Sets `received` to the request body's byte
/// counter when a proxied request has a body.
fn start_action<'x, 'a: 'x>(
    shared: &'x Shared,
    snap: &'a crate::state::Snapshot,
    ctx: &'x RequestCtx,
    entry: &'a crate::router::RouteEntry,
    request: ActionRequest<'a>,
    pages: Option<&crate::error_pages::Plan<'a>>,
    received: &mut Option<Arc<AtomicU64>>,
) -> ActionFuture<'x> {
    let ActionRequest {
        mut parts,
        body,
        upgrade,
        web,
        cache,
        found: first,
    } = request;
    let limits = &snap.config.limits;
    let route = &entry.route;
    let content = entry.filters.content();
    match &route.action {
        Action::Proxy(p) => {
            let p = crate::error_pages::Plan::action(pages, p);
            if let Some(kind) = upgrade {
                return ActionFuture::Running(Box::pin(crate::websocket::proxy(
                    &snap.upstreams,
                    shared.metrics.clone(),
                    Request::from_parts(parts, body),
                    *kind,
                    p,
                    route,
                    ctx,
                    // The route's `read_idle` (ingress-nginx's `proxy-read-timeout`) is its
                    // tunnels' idle clock, as nginx's `proxy_read_timeout` is an upgraded
                    // connection's; else the dataplane-wide one.
                    route
                        .timeouts
                        .read_idle
                        .unwrap_or(limits.websocket_idle_timeout)
                        .get(),
                )));
            }
            // The request's body bytes, for the per-route counters and the access log
            // (a request without a body allocates nothing for it).
            // A body that has ended already (a GET's, the usual request) has nothing to cap,
            // time or count: it goes as it is, without the cap's wrapper (an allocation, and a
            // call through it for each look at the body).
            let body = if http_body::Body::is_end_stream(&body) {
                body
            } else {
                *received = Some(Arc::new(AtomicU64::new(0)));
                crate::body::boxed(LimitedBody::new(
                    body,
                    body_limit(route, limits),
                    limits.body_idle_timeout.get(),
                    shared.metrics.clone(),
                    received.clone(),
                ))
            };
            if let Some(kind) = web {
                crate::grpc::web_request_head(&mut parts.headers, kind);
                let body = crate::grpc::web_request_body(body, kind);
                let fetch = snap
                    .upstreams
                    .forward(Request::from_parts(parts, body), p, route, ctx);
                return ActionFuture::Running(Box::pin(async move {
                    crate::grpc::web_response(fetch.await, kind)
                }));
            }
            match cache {
                Some((cp, key)) => ActionFuture::Running(Box::pin(shared.cache.serve(
                    cp,
                    key,
                    parts,
                    body,
                    first,
                    move |parts, body| {
                        let coding = StoreCoding::of(content.compress.as_ref(), &parts);
                        let fetch =
                            snap.upstreams
                                .forward(Request::from_parts(parts, body), p, route, ctx);
                        async move { StoreCoding::apply(coding, fetch.await) }
                    },
                    move |parts| refresher(snap, entry, ctx, parts)(),
                ))),
                // Built in its box: `Box::pin` of the built future copies all of it
                // (~1,000 instructions of memcpy per proxied request).
                None => ActionFuture::Running(sweety_h2::box_in_place(|| {
                    snap.upstreams
                        .forward(Request::from_parts(parts, body), p, route, ctx)
                })),
            }
        }
        Action::Static(site) => {
            let files = &shared.static_files;
            let budget = ctx.conn.read_budget.as_ref();
            if http_body::Body::is_end_stream(&body) {
                return ActionFuture::Running(Box::pin(async move {
                    files.serve(site, &parts, budget).await
                }));
            }
            let idle = limits.body_idle_timeout.get();
            ActionFuture::Running(Box::pin(async move {
                if let Err(e) = crate::identity::settle_body(body, idle).await {
                    return crate::identity::IdentityError::from(e).response();
                }
                files.serve(site, &parts, budget).await
            }))
        }
        Action::Fixed(f) => {
            if http_body::Body::is_end_stream(&body) {
                return ActionFuture::Ready(Some(fixed_response(f)));
            }
            let idle = limits.body_idle_timeout.get();
            ActionFuture::Running(Box::pin(async move {
                if let Err(e) = crate::identity::settle_body(body, idle).await {
                    return crate::identity::IdentityError::from(e).response();
                }
                fixed_response(f)
            }))
        }
    }
}

/// A route's fixed reply.
fn fixed_response(f: &sweety_config::FixedResponse) -> Response<Body> {
    let mut r = Response::new(crate::body::full(Bytes::from(f.body.clone())));
    *r.status_mut() = StatusCode::from_u16(f.status).unwrap_or(StatusCode::OK);
    if let Some(ct) = f
        .content_type
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
    {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    } else if !f.body.is_empty() {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    r
}

/// Compression of a fetched response before the cache stores it, on routes that cache and
/// compress: the coded variant is stored (the `Vary: Accept-Encoding` that compression adds
/// keys variants by the request's `Accept-Encoding`), so a hit is sent as stored instead of
/// being compressed again on every hit. The response phase's own compression then finds
/// `Content-Encoding` set (or the client accepting no offered coding) and leaves it alone.
struct StoreCoding<'a> {
    policy: &'a crate::compress::CompressPolicy,
    method: http::Method,
    accept: Vec<HeaderValue>,
}

impl<'a> StoreCoding<'a> {
    fn of(
        policy: Option<&'a crate::compress::CompressPolicy>,
        parts: &http::request::Parts,
    ) -> Option<StoreCoding<'a>> {
        Some(StoreCoding {
            policy: policy?,
            method: parts.method.clone(),
            accept: parts
                .headers
                .get_all(header::ACCEPT_ENCODING)
                .iter()
                .cloned()
                .collect(),
        })
    }

    fn apply(coding: Option<StoreCoding<'_>>, resp: Response<Body>) -> Response<Body> {
        match coding {
            Some(c) => crate::compress::apply(c.policy, &c.method, &c.accept, resp),
            None => resp,
        }
    }
}

/// A `'static` re-fetch of a GET request (no body) for the cache's stale-while-revalidate.
fn refresher(
    snap: &crate::state::Snapshot,
    entry: &crate::router::RouteEntry,
    ctx: &RequestCtx,
    parts: &http::request::Parts,
) -> impl FnOnce() -> Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send>> {
    let upstreams = snap.upstreams.clone();
    let route = entry.route.clone();
    let ctx = RequestCtx {
        conn: ctx.conn.clone(),
        protocol: ctx.protocol,
        start: ctx.start,
        // A background refresh has no log line of its own.
        log: false,
    };
    let coding = StoreCoding::of(entry.filters.content().compress.as_ref(), parts)
        .map(|c| (c.policy.clone(), c.accept));
    let mut req = Request::new(crate::body::empty());
    *req.method_mut() = http::Method::GET;
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req.headers_mut().remove(header::CONTENT_LENGTH);
    move || {
        Box::pin(async move {
            match &route.action {
                Action::Proxy(p) => {
                    let resp = upstreams.forward(req, p, &route, &ctx).await;
                    match &coding {
                        Some((policy, accept)) => {
                            crate::compress::apply(policy, &http::Method::GET, accept, resp)
                        }
                        None => resp,
                    }
                }
                _ => text_response(StatusCode::NOT_FOUND, "not a proxy route\n"),
            }
        })
    }
}

/// The largest request body `route` accepts: its own `max_request_body_bytes` (`0`: no
/// limit), else the dataplane's `limits.max_request_body_bytes`.
fn body_limit(route: &sweety_config::Route, limits: &sweety_config::Limits) -> u64 {
    match route.max_request_body_bytes {
        Some(0) => u64::MAX,
        Some(n) => n,
        None => limits.max_request_body_bytes,
    }
}

/// The request host: `:authority` or `Host`, lower-cased, without port or trailing dot.
pub fn request_host<B>(req: &Request<B>) -> Cow<'_, str> {
    let raw = crate::identity::raw_authority(req);
    let no_port = strip_port(raw);
    let no_port = no_port.strip_suffix('.').unwrap_or(no_port);
    if no_port.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(no_port.to_ascii_lowercase())
    } else {
        Cow::Borrowed(no_port)
    }
}

/// The host of an authority: after any userinfo (`user@`), without a `:port` (digits only,
/// possibly none); an IPv6 literal up to its `]`. Byte loops: authorities are short, and
/// this runs once per request.
fn strip_port(authority: &str) -> &str {
    let b = authority.as_bytes();
    let mut start = b.len();
    while start > 0 && b[start - 1] != b'@' {
        start -= 1;
    }
    let host = &authority[start..];
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    let h = host.as_bytes();
    let mut end = h.len();
    while end > 0 && h[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end > 0 && h[end - 1] == b':' {
        &host[..end - 1]
    } else {
        host
    }
}

/// Takes part in the trace context of a request (tracing is on): see
/// [`crate::trace::Tracer::begin`]. Returns the request's trace when it is sampled.
fn begin_trace(
    shared: &Shared,
    req: &mut Request<Body>,
    request_id: &HeaderValue,
    start: Instant,
) -> Option<Box<crate::trace::RequestTrace>> {
    let tracer = shared.tracer.load_full()?;
    let method = req.method().clone();
    let mut t = tracer.begin(req.headers_mut(), &method, start)?;
    t.set_target(
        request_host(req).into_owned(),
        req.uri().path().to_owned(),
        request_id.clone(),
    );
    Some(t)
}

/// What the access log needs from the request, captured before the request is consumed
/// (only when the log is on: boxed, so the request future grows by a pointer).
struct LogStart {
    ts_ms: u64,
    /// The connection's peer (before trusted proxies name the real client).
    peer: std::net::SocketAddr,
    request_id: HeaderValue,
    method: String,
    host: String,
    path: String,
    user_agent: Option<String>,
    referer: Option<String>,
    /// `X-Cache` of the response (`HIT`, `MISS`, `STALE`), set at the response head.
    cache: Option<&'static str>,
    /// What the proxy did, set at the response head.
    upstream: Option<crate::proxy::UpstreamInfo>,
}

impl LogStart {
    fn new(req: &Request<Body>, peer: std::net::SocketAddr, request_id: HeaderValue) -> LogStart {
        let text = |name: header::HeaderName| {
            req.headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        LogStart {
            ts_ms: now_ms(),
            peer,
            request_id,
            method: req.method().as_str().to_owned(),
            host: request_host(req).into_owned(),
            path: req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned()),
            user_agent: text(header::USER_AGENT),
            referer: text(header::REFERER),
            cache: None,
            upstream: None,
        }
    }
}

/// Work done when the response body is finished or dropped.
struct Finish {
    shared: Arc<Shared>,
    ctx: RequestCtx,
    status: u16,
    /// The request's per-route series: its body bytes are counted there.
    series: Arc<crate::metrics::series::Series>,
    /// Request body bytes the proxy read, when the request had a body.
    received: Option<Arc<AtomicU64>>,
    route: Arc<str>,
    log: Option<Box<LogStart>>,
    /// The request's trace, when it is sampled.
    trace: Option<Box<crate::trace::RequestTrace>>,
    _permit: Option<RequestPermit>,
    /// The client's slot (`limits.max_requests_per_client`), released with the request's.
    _client: Option<Box<crate::client_caps::ClientSlot>>,
}

impl Finish {
    fn done(self, sent: u64) {
        if let Some(r) = &self.received {
            self.series.add_received(r.load(Relaxed));
        }
        if let Some(t) = self.trace {
            t.finish(crate::trace::Finished {
                route: &self.route,
                listener: &self.ctx.conn.listener,
                scheme: self.ctx.scheme(),
                protocol_version: match self.ctx.protocol {
                    Protocol::Http1 => "1.1",
                    Protocol::Http2 => "2",
                    Protocol::Http3 => "3",
                },
                client: self.ctx.conn.peer.ip(),
                status: self.status,
                bytes_sent: sent,
            });
        }
        if let Some(l) = self.log {
            let l = *l;
            let conn = &self.ctx.conn;
            let (mut upstream_connect_us, mut upstream_response_us) = (None, None);
            let (backend, upstream_addr, upstream_status, upstream_header_us, retries) = match l
                .upstream
            {
                Some(u) => {
                    // A backend answered: its response body ends with ours (it streams).
                    upstream_response_us = u.status.map(|_| u.started.elapsed().as_micros() as u64);
                    upstream_connect_us = u.connect_us;
                    (Some(u.backend), u.address, u.status, u.header_us, u.retries)
                }
                None => (None, None, None, None, 0),
            };
            self.shared.access_log.log(LogLine {
                ts_ms: l.ts_ms,
                request_id: String::from_utf8_lossy(l.request_id.as_bytes()).into_owned(),
                listener: conn.listener.clone(),
                client_addr: l.peer.ip(),
                client_port: l.peer.port(),
                real_client_ip: conn.peer.ip(),
                protocol: self.ctx.protocol.as_str(),
                method: l.method,
                authority: l.host,
                path: l.path,
                status: self.status,
                route: self.route,
                bytes_sent: sent,
                bytes_received: self.received.as_ref().map_or(0, |r| r.load(Relaxed)),
                duration_us: self.ctx.start.elapsed().as_micros() as u64,
                backend,
                upstream_addr,
                upstream_status,
                upstream_header_us,
                upstream_connect_us,
                upstream_response_us,
                retries,
                tls: conn.tls,
                sni: conn.sni.clone(),
                tls_version: conn.tls_version,
                tls_cipher: conn.tls_cipher,
                user_agent: l.user_agent,
                referer: l.referer,
                cache: l.cache,
            });
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that counts bytes sent and runs [`Finish`] when done or dropped,
    /// releasing the request's backpressure slot.
    struct AccountedBody {
        #[pin]
        inner: Body,
        sent: u64,
        finish: Option<Finish>,
    }
    impl PinnedDrop for AccountedBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(f) = this.finish.take() {
                f.done(*this.sent);
            }
        }
    }
}

impl http_body::Body for AccountedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let r = this.inner.poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    *this.sent += d.len() as u64;
                    if let Some(fin) = this.finish.as_ref() {
                        fin.shared
                            .metrics
                            .bytes_sent
                            .fetch_add(d.len() as u64, Relaxed);
                        fin.series.add_sent(d.len() as u64);
                    }
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                if let Some(f) = this.finish.take() {
                    f.done(*this.sent);
                }
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_lowercased_without_port() {
        let r = Request::builder()
            .uri("/")
            .header("host", "Example.COM:8443")
            .body(())
            .unwrap();
        assert_eq!(request_host(&r), "example.com");
        let r = Request::builder()
            .uri("https://a.test./x")
            .body(())
            .unwrap();
        assert_eq!(request_host(&r), "a.test");
        let r = Request::builder()
            .uri("/")
            .header("host", "[::1]:80")
            .body(())
            .unwrap();
        assert_eq!(request_host(&r), "[::1]");
        let r = Request::builder().uri("/").body(()).unwrap();
        assert_eq!(request_host(&r), "");
    }

    #[test]
    fn ports_and_userinfo_are_stripped_as_before() {
        // The earlier `rsplit_once` form, kept as the reference.
        fn reference(authority: &str) -> &str {
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            if host.starts_with('[') {
                return host.find(']').map_or(host, |i| &host[..=i]);
            }
            match host.rsplit_once(':') {
                Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
                _ => host,
            }
        }
        for a in [
            "",
            "a",
            "a.test",
            "a.test:8443",
            "a.test:",
            ":80",
            ":",
            "127.0.0.1:18440",
            "a:b",
            "a:1b",
            "a:1:2",
            "u@a.test:80",
            "u:p@a.test",
            "u@@h:1",
            "@",
            "u@",
            "[::1]",
            "[::1]:443",
            "u@[::1]:443",
            "[::1",
            "x]:1",
            "é.test:1",
            "a.test:٣",
        ] {
            assert_eq!(strip_port(a), reference(a), "{a:?}");
        }
    }
}
#[cfg(test)]
mod size_tests {
    /// The request future is moved (copied) a few times per request on its way into
    /// hyper's stream task: it must stay small. The upstream, static-file, cache, gRPC-Web and
    /// WebSocket futures are boxed on the paths that need them; unboxed, `forward` alone
    /// made it ~11.5 KB (debug build), ~2.3 KB without; 3,056 before the action's future was
    /// started in its box, 1,568 since.
    #[tokio::test]
    async fn handle_future_stays_small() {
        let rt = crate::reload::Runtime::new(crate::reload::RuntimeOptions::default()).unwrap();
        let conn = std::sync::Arc::new(crate::ctx::ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: false,
            sni: None,
            client_cert: None,
            client_cert_verdict: Default::default(),
            forwarding: Default::default(),
            tls_version: None,
            tls_cipher: None,
            read_budget: None,
        });
        let req = http::Request::new(crate::body::empty());
        let f = super::handle(rt.shared.clone(), conn, crate::ctx::Protocol::Http2, req);
        let size = std::mem::size_of_val(&f);
        assert!(size <= 2048, "the request future grew to {size} bytes");
    }

    /// The pipeline's futures on a proxied request's path, and what they hold, as sizes
    /// (printed with `--nocapture`).
    #[test]
    fn pipeline_futures_stay_small() {
        use crate::proxy::returned::*;
        use std::mem::size_of;
        let sizes = [
            ("pipeline::handle", of4(&super::handle)),
            ("pipeline::serve", of6(&super::serve)),
            ("pipeline::route_and_serve", of5(&super::route_and_serve)),
            ("pipeline::act", of4(&super::act)),
            ("pipeline::authenticated", of5(&super::authenticated)),
            (
                "Backpressure::admit",
                of3(&crate::limits::Backpressure::admit),
            ),
            ("identity::settle_body", of2(&crate::identity::settle_body)),
            ("Served", size_of::<super::Served<'_>>()),
            ("Acting", size_of::<super::Acting<'_>>()),
            ("ActionRequest", size_of::<super::ActionRequest<'_>>()),
            ("Finish", size_of::<super::Finish>()),
            ("AccountedBody", size_of::<super::AccountedBody>()),
            ("LimitedBody", size_of::<crate::limits::LimitedBody>()),
            ("RequestCtx", size_of::<crate::ctx::RequestCtx>()),
        ];
        // A debug build's sizes (before the action's future was started in its box and
        // `route_and_serve` returned the routing outcome's future: serve 2,792, act 1,408,
        // route_and_serve 1,952).
        crate::proxy::returned::within_bounds(
            &sizes,
            &[
                ("pipeline::serve", 2048),
                ("pipeline::route_and_serve", 1024),
                ("pipeline::act", 1024),
            ],
        );
    }
}
