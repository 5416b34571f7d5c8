//! `sweety-h1`: Sweety's own HTTP/1.1 (RFC 9112) message handling, for the proxy path of
//! issue 23. hyper's two HTTP/1.1 halves (the server for client connections, the client for
//! keep-alive backends) cost more instructions per proxied request than the whole budget of
//! 0.8x HAProxy's; this crate parses a head once into the form the dataplane uses and writes a
//! head straight from it, as `sweety-h2` does for HTTP/2.
//!
//! It knows nothing of routes or configs. Every byte it reads is hostile: each parser here is
//! bounded (head size, field count, chunk-size digits), refuses rather than guesses where
//! RFC 9112 allows a choice that could desync a peer (both `Content-Length` and
//! `Transfer-Encoding`, bare CR, obs-fold, a chunk size that overflows), and has a fuzz target
//! and property tests beside its unit tests.
//!
//! * [`chunked`]: the chunked transfer coding, an incremental decoder and the encoder, used by
//!   both halves.
//! * [`client`]: the client side for keep-alive backends (the proxy's `http1` and `https`
//!   backends): the request head written straight from the proxy's fields, the response head
//!   parsed once into [`http::Response`] without its hop-by-hop fields, bodies streamed both
//!   ways on the caller's task (no connection task, no channel), the read buffer bounded.
//! * [`server`]: one client connection served (`limits.http1_engine: sweety`): request heads
//!   parsed once into `http::Request`, bodies fed with backpressure, responses framed and
//!   written in order, keep-alive, pipelining, `Expect: 100-continue`, upgrades, timeouts and
//!   drain.
//!
//! Depends on `bytes`, `http`, `http-body`, `httparse`, tokio's I/O traits, timers and
//! channels, and `httpdate`/`thiserror`; nothing of the dataplane.

#![forbid(unsafe_code)]

pub mod chunked;
pub mod client;
mod name;
pub mod server;
