//! `sweety-dataplane`: one process that serves HTTP/1.1, HTTP/2 and HTTP/3 through one
//! request pipeline and one backpressure core, and swaps its config atomically.
//!
//! Module map (each does one thing; see docs/request-phases.md for the request flow):
//! * [`body`]: the boxed body type every handler speaks, and small constructors.
//! * [`ctx`]: per-connection and per-request context (listener, peer, protocol).
//! * [`router`]: pure route table build and Gateway API precedence matching. No I/O.
//! * [`filters`]: header modifiers, redirects, rewrites and CORS as pure functions.
//! * [`static_files`]: the static-file handler (Range, conditionals, precompressed, cache).
//! * [`proxy`]: upstream pools, load balancing, outlier ejection, forwarding, mirrors.
//! * [`limits`]: the backpressure core: connection and in-flight limits, body limits.
//! * [`pipeline`]: the single request path shared by all protocols.
//! * [`tls`]: certificates, the SNI resolver, self-signed certificates.
//! * [`server`]: listeners and connection serving (H1/h2c and TLS with ALPN).
//! * [`h2`]: Sweety's own server-side HTTP/2 connection layer (`limits.http2_engine`).
//! * [`hpack`]: HPACK header compression (RFC 7541) for the HTTP/2 connection layer.
//! * [`h1_wire`]: HTTP/1.1 framing as read on the wire (both Content-Length and
//!   Transfer-Encoding, which hyper hides), for the request identity's 400.
//! * [`h3`]: HTTP/3 over QUIC (quinn + h3): the UDP endpoint and the thin adapter.
//! * [`runtime`]: the live config snapshot, hot reload and listener reconciliation.
//! * [`admin`]: health, readiness, metrics and config endpoints.
//! * [`control`]: the control socket the controller pushes configs on (`--control-socket`).
//! * [`metrics`]: counters and histograms, rendered in Prometheus text format.
//! * [`access_log`]: JSON access log written off the request path.
//! * [`defaults`]: the embedded default config used when no `--config` is given.
//! * [`access`]: real client IP behind trusted proxies, IP allow/deny lists, rate limits.
//! * [`proxy_protocol`]: PROXY protocol v1/v2 headers, read on listeners and sent to backends.
//! * [`l4`]: layer-4 listeners: TLS passthrough by SNI, TCP and UDP proxying.
//! * [`compress`]: on-the-fly gzip/brotli/zstd of responses (`compress` filter).
//! * [`cache`]: the in-memory response cache (`cache` filter), purged through admin.
//! * [`websocket`]: HTTP/1.1 Upgrade and HTTP/2 extended CONNECT tunnels to backends.
//! * [`grpc`]: gRPC-shaped errors and gRPC-Web translation.

pub mod access;
pub mod access_log;
pub mod admin;
pub mod body;
pub mod cache;
pub mod client_caps;
pub mod compress;
pub mod control;
pub mod ctx;
pub mod defaults;
pub mod filters;
pub mod grpc;
pub mod h1_wire;
pub mod h3;
pub mod identity;
pub mod l4;
pub mod limits;
pub mod metrics;
pub mod path_norm;
pub mod pipeline;
pub mod proxy;
pub mod proxy_protocol;
pub mod router;
pub mod runtime;
pub mod send_timeout;
pub mod server;
pub mod static_files;
pub mod tls;
pub mod websocket;

// The HTTP/2 engine's modules the other protocols share (connection-specific fields, HPACK).
pub use sweety_h2::{conn_headers, hpack};
