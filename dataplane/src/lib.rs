//! `sweety-dataplane`: one process that serves HTTP/1.1, HTTP/2 and HTTP/3 through one
//! request pipeline and one backpressure core, and swaps its config atomically.
//!
//! Layers, each naming only the ones below it (control → reload, admin → listen → pipeline →
//! state → {router, filters, proxy, cache, static_files, access, …} → exec;
//! `tests/layers.rs` checks it); see docs/architecture.md and docs/request-phases.md:
//! * [`control`]: the control socket the controller pushes configs on (`--control-socket`):
//!   frames only (decode, [`reload::Runtime::apply`], `Ack`/`Nack`).
//! * [`reload`]: hot reload through one entry point, `Runtime::apply(Change)`: validates and
//!   compiles a config (`reload::build`), binds, starts and drains listeners
//!   (`reload::sockets`), swaps the snapshot, keeps the base of the next delta.
//! * [`idle_purge`]: when the binary returns the allocator's freed memory to the OS (after
//!   an apply, and when the workers go idle).
//! * [`listen`]: listeners and protocol adapters: [`listen::tcp`] (H1, h2c, TLS with ALPN;
//!   HTTP/2 by the `sweety-h2` engine or hyper's), [`listen::quic`] (HTTP/3 over quinn + h3),
//!   [`listen::l4`] (TLS passthrough by SNI, TCP and UDP proxying).
//! * [`exec`]: how a connection task runs its streams (inline first poll, batched writes).
//! * [`send_timeout`]: the send-progress timeout of a client connection.
//! * [`quic_budget`]: the HTTP/3 send windows' one budget across connections
//!   (`http3.send_budget`), held in the snapshot's shared state.
//! * [`pipeline`]: the single request path shared by all protocols; also the HTTP/2 engine's
//!   `H2Service`.
//! * [`identity`]: the one authority, path and body framing of a request, settled first.
//! * [`path_norm`]: request path normalisation before routing.
//! * [`router`]: pure route table build and Gateway API precedence matching. No I/O.
//! * [`filters`]: header modifiers, redirects, rewrites and CORS as pure functions.
//! * [`static_files`]: the static-file handler (Range, conditionals, precompressed, cache).
//! * [`proxy`]: upstream pools, load balancing, outlier ejection, forwarding, mirrors.
//! * [`access`]: real client IP behind trusted proxies, IP allow/deny lists, rate limits.
//! * [`error_pages`]: listed error statuses replaced by a page backend's answer, and that
//!   backend serving routes without endpoints (`error_pages` filter).
//! * [`cache`]: the in-memory response cache (`cache` filter), purged through admin.
//! * [`compress`]: on-the-fly gzip/brotli/zstd of responses (`compress` filter).
//! * [`websocket`]: HTTP/1.1 Upgrade and HTTP/2 extended CONNECT tunnels to backends.
//! * [`grpc`]: gRPC-shaped errors and gRPC-Web translation.
//! * [`limits`]: the backpressure core: connection and in-flight limits, body limits.
//! * [`client_caps`]: per-client-address connection and request caps.
//! * [`state`]: the config snapshot every request reads and the state that outlives reloads.
//! * [`body`]: the boxed body type every handler speaks, and small constructors.
//! * [`ctx`]: per-connection and per-request context (listener, peer, protocol).
//! * [`tls`]: certificates, the SNI resolver, self-signed certificates.
//! * [`proxy_protocol`]: PROXY protocol v1/v2 headers, read on listeners and sent to backends.
//! * [`admin`]: health, readiness, metrics and config endpoints.
//! * [`metrics`]: counters and histograms, rendered in Prometheus text format.
//! * [`access_log`]: JSON access log written off the request path.
//! * [`trace`]: W3C trace context and OpenTelemetry spans exported over OTLP/HTTP.
//! * [`defaults`]: the embedded default config used when no `--config` is given.
//! * [`hpack`], [`conn_headers`]: from `sweety-h2`, shared with HTTP/1.1 and HTTP/3.

pub mod access;
pub mod access_log;
pub mod admin;
pub mod basic_auth;
pub mod body;
pub mod cache;
pub mod client_caps;
pub mod client_cert;
pub mod compress;
pub mod control;
pub mod ctx;
pub mod defaults;
pub mod error_pages;
pub mod exec;
pub mod ext_auth;
pub mod filters;
pub mod grpc;
pub mod identity;
pub mod idle_purge;
pub mod limits;
pub mod listen;
pub mod metrics;
pub mod path_norm;
pub mod pipeline;
pub mod proxy;
pub mod proxy_protocol;
pub mod quic_budget;
pub mod reload;
pub mod request_id;
pub mod router;
pub mod send_timeout;
pub mod state;
pub mod static_files;
pub mod tls;
pub mod trace;
pub mod websocket;

// The HTTP/2 engine's modules the other protocols share (connection-specific fields, HPACK).
pub use sweety_h2::{conn_headers, hpack};
