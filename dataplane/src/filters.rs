//! Route filters as pure functions over request and response heads: header modifiers,
//! redirects, URL rewrites and CORS. Mirrors are only collected here; the proxy sends them.
//!
//! STUB: interface fixed, implementation pending (router helper).

use crate::body::Body;
use http::{HeaderMap, HeaderValue, Response};
use sweety_config::{Filter, HeaderModifier, Mirror};

/// What the request-side filters decided.
#[derive(Debug)]
pub enum RequestOutcome {
    /// Go on to the route's action.
    Continue,
    /// Answer now with this response (redirect, CORS preflight).
    Respond(Response<Body>),
}

/// A route's filters, compiled once per config (header names and values parsed).
#[derive(Debug, Default)]
pub struct CompiledFilters {
    filters: Vec<Filter>,
}

impl CompiledFilters {
    /// Compiles config filters; an error says which filter is invalid and why.
    pub fn compile(filters: &[Filter]) -> Result<CompiledFilters, String> {
        Ok(CompiledFilters {
            filters: filters.to_vec(),
        })
    }

    /// Applies request-side filters in order: request header modifiers, URL rewrite (path and
    /// Host / `:authority`), redirect and CORS preflight. `scheme` is the client's scheme,
    /// `port` the listener port the request arrived on and `prefix` the prefix the route's
    /// path match matched.
    pub fn on_request(
        &self,
        req: &mut http::request::Parts,
        scheme: &str,
        port: u16,
        prefix: Option<&str>,
    ) -> RequestOutcome {
        let _ = (req, scheme, port, prefix);
        RequestOutcome::Continue
    }

    /// Mirror filters, for the proxy to send.
    pub fn mirrors(&self) -> impl Iterator<Item = &Mirror> {
        self.filters.iter().filter_map(|f| match f {
            Filter::Mirror(m) => Some(m),
            _ => None,
        })
    }

    /// Applies response-side filters: response header modifiers and CORS headers (using the
    /// request's `Origin`).
    pub fn on_response(&self, origin: Option<&HeaderValue>, resp: &mut http::response::Parts) {
        let _ = (origin, resp);
    }
}

/// Applies an uncompiled header modifier (used for rarely-set per-backend filters).
pub fn modify_headers(headers: &mut HeaderMap, m: &HeaderModifier) {
    for r in &m.remove {
        headers.remove(r.as_str());
    }
    for s in &m.set {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(s.name.as_bytes()),
            HeaderValue::from_str(&s.value),
        ) {
            headers.insert(n, v);
        }
    }
    for a in &m.add {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(a.name.as_bytes()),
            HeaderValue::from_str(&a.value),
        ) {
            headers.append(n, v);
        }
    }
}
