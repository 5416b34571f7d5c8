//! The reverse proxy: upstream connection pools (H1 keep-alive, h2c and h2 multiplexed),
//! weighted backend choice, endpoint load balancing, passive outlier ejection, forwarding
//! headers, retries, timeouts and mirrors.
//!
//! STUB: interface fixed, implementation pending (proxy helper).

use crate::body::{text_response, Body};
use crate::ctx::RequestCtx;
use crate::metrics::Metrics;
use http::{Request, Response, StatusCode};
use std::sync::Arc;
use sweety_config::{Backend, Mirror, ProxyAction, Route};

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
    _metrics: Arc<Metrics>,
}

impl Upstreams {
    /// Builds upstreams for `backends`, reusing pools and endpoint state from `previous`
    /// (the running config's upstreams) where backend and endpoint are unchanged.
    pub fn build(
        backends: &[Backend],
        previous: Option<&Upstreams>,
        metrics: Arc<Metrics>,
    ) -> Result<Upstreams, BuildError> {
        let _ = (backends, previous);
        Ok(Upstreams { _metrics: metrics })
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
        let _ = (req, action, route, ctx);
        text_response(StatusCode::BAD_GATEWAY, "proxy not implemented\n")
    }

    /// Sends a copy of the request head (without body) to `mirror`'s backend, fire-and-forget
    /// and bounded: when too many mirrors are in flight the copy is dropped.
    pub fn mirror(&self, parts: &http::request::Parts, mirror: &Mirror, ctx: &RequestCtx) {
        let _ = (parts, mirror, ctx);
    }
}
