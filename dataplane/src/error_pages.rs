//! Error pages: the `error_pages` route filter ([`sweety_config::ErrorPages`]), as
//! ingress-nginx's `custom-http-errors` and `default-backend` annotations work.
//!
//! ingress-nginx writes `proxy_intercept_errors on` and one `error_page <code> =
//! @custom_<upstream>_<code>` per code into the location; the named location rewrites the URI to
//! `/`, sets `X-Code`, `X-Format` (`$http_accept`), `X-Original-URI` (`$request_uri`),
//! `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port` and `X-Request-ID`, and
//! proxies to the default backend with `proxy_intercept_errors off` (rootfs/etc/nginx/template/
//! nginx.tmpl, `CUSTOM_ERRORS`). Its `default-backend` annotation replaces the location's
//! upstream by the default backend's when the upstream has no endpoint
//! (internal/ingress/controller/controller.go, `custom-default-backend-`), with `X-Code: 503`
//! and the same headers but the request unchanged.
//!
//! Here, in phase 5 of the pipeline (see docs/request-phases.md):
//! - [`ErrorPagesRt::unavailable`]: before the proxy runs, a route whose backends have no
//!   endpoint that may take traffic sends the request, unchanged but for those headers, to the
//!   page backend instead; that answer passes as it is.
//! - [`ErrorPagesRt::intercepts`] / [`ErrorPagesRt::replace`]: after the action (and its
//!   request timeout), a listed status is replaced. The intercepted response's body is never
//!   read: it is held (unread, so bounded by the connection's read-ahead) until the page
//!   answers, then dropped. The page request goes through the proxy's own machinery
//!   ([`crate::proxy::Upstreams::forward`]: the page backend is an ordinary backend with its pools,
//!   balancing and health) with no body, no retry, and `timeout` bounding its answer and every
//!   pause of its body. Its answer is never intercepted again. When it gives none (no
//!   endpoint, connect error, timeout), the original response passes unchanged.
//!
//! Differences from ingress-nginx: the client gets the ORIGINAL status with the page's body
//! and content headers (nginx passes the page backend's status, which its example backend sets
//! from `X-Code` anyway), so a page backend answering 200 never turns an error into a success;
//! without a page backend Sweety's own short page is served (nginx: its built-in default
//! backend's 404); only the action's answers are intercepted (nginx also replaces its own
//! refusals of the location: `deny`, `limit_req`, `auth_basic`).

use crate::body::{empty, full, Body};
use crate::ctx::RequestCtx;
use crate::metrics::Metrics;
use crate::proxy::{UpstreamServed, Upstreams};
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use std::time::Duration;
use sweety_config::{Action, ErrorPages, ProxyAction, Route, Timeouts, WeightedBackend};

/// The status the page backend learns in `X-Code` when it serves an unavailable route.
const UNAVAILABLE: HeaderValue = HeaderValue::from_static("503");

/// The headers of a page answer the client gets (the others are the page backend's business).
const PAGE_HEADERS: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LENGTH,
];

/// A route's compiled `error_pages` filter.
#[derive(Debug)]
pub struct ErrorPagesRt {
    /// Bit `status - 400` is set for each listed status (400 to 599).
    codes: [u64; 4],
    /// The page backend as a proxy action, with the route its requests go by (no retry,
    /// `timeout` on the answer and on each pause of the body); none: the built-in page.
    page: Option<(ProxyAction, Route)>,
    /// Serve an unavailable route from the page backend.
    unavailable: bool,
    /// Fixed headers for the page backend.
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
}

/// What the pipeline carries for a route with error pages from its request filters to its
/// action.
#[derive(Debug)]
pub enum Plan<'a> {
    /// Intercept the listed statuses with this page request.
    Intercept(PageRequest),
    /// Served by this page backend's action: the route has no endpoint.
    Unavailable(&'a ProxyAction),
}

impl<'a> Plan<'a> {
    /// The action that serves the request: the page backend's when the route is unavailable,
    /// else the route's own.
    pub fn action(plan: Option<&Plan<'a>>, own: &'a ProxyAction) -> &'a ProxyAction {
        match plan {
            Some(Plan::Unavailable(page)) => page,
            _ => own,
        }
    }
}

/// What a page request needs of the request that was answered with an error, taken before the
/// request went to the backend.
#[derive(Debug)]
pub struct PageRequest {
    method: Method,
    version: Version,
    headers: HeaderMap,
    original_uri: Option<HeaderValue>,
}

impl ErrorPagesRt {
    /// Compiles the filter (already validated: codes 400-599, header names and values).
    pub fn compile(e: &ErrorPages) -> Result<ErrorPagesRt, String> {
        let mut codes = [0u64; 4];
        for &c in &e.codes {
            let bit = usize::from(
                c.checked_sub(400)
                    .filter(|b| *b < 200)
                    .ok_or_else(|| format!("status {c} is not from 400 to 599"))?,
            );
            codes[bit / 64] |= 1 << (bit % 64);
        }
        let timeout = e.timeout.get();
        let page = e.backend.as_ref().map(|b| {
            let action = ProxyAction {
                backends: vec![WeightedBackend {
                    backend: b.clone(),
                    weight: 1,
                    filters: Vec::new(),
                }],
            };
            let route = Route {
                name: format!("error-pages:{b}"),
                matches: Vec::new(),
                filters: Vec::new(),
                action: Action::Proxy(action.clone()),
                timeouts: Timeouts {
                    backend: Some(e.timeout),
                    read_idle: Some(e.timeout),
                    ..Default::default()
                },
                retry: None,
                max_request_body_bytes: None,
            };
            (action, route)
        });
        let headers = e
            .headers
            .iter()
            .map(|h| {
                let name = HeaderName::from_bytes(h.name.as_bytes())
                    .map_err(|_| format!("invalid header name {:?}", h.name))?;
                let value = HeaderValue::from_str(&h.value)
                    .map_err(|_| format!("invalid value of header {:?}", h.name))?;
                Ok((name, value))
            })
            .collect::<Result<_, String>>()?;
        Ok(ErrorPagesRt {
            codes,
            page,
            unavailable: e.unavailable,
            headers,
            timeout,
        })
    }

    /// Whether a response of this status is replaced by a page.
    pub fn intercepts(&self, status: StatusCode) -> bool {
        let Some(bit) = status.as_u16().checked_sub(400).map(usize::from) else {
            return false;
        };
        bit < 200 && self.codes[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// What a page request will need of this request, when the filter intercepts anything:
    /// taken before the route's request filters, as nginx's named location gets the client's
    /// own headers and `$request_uri`.
    pub fn page_request(&self, parts: &http::request::Parts) -> Option<PageRequest> {
        if self.codes == [0; 4] {
            return None;
        }
        let mut headers = parts.headers.clone();
        // HTTP/2 and HTTP/3 carry the host in the URI; the page request's URI is `/`.
        if let (false, Some(a)) = (headers.contains_key(header::HOST), parts.uri.authority()) {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                headers.insert(header::HOST, v);
            }
        }
        Some(PageRequest {
            method: parts.method.clone(),
            version: parts.version,
            headers,
            original_uri: parts
                .uri
                .path_and_query()
                .and_then(|p| HeaderValue::from_str(p.as_str()).ok()),
        })
    }

    /// The page backend's action when it must serve this request because no backend of
    /// `action` has an endpoint that may take traffic and the page backend has one (then `headers` get `X-Code: 503`,
    /// `X-Format` and the fixed headers, as ingress-nginx's custom default backend does).
    pub fn unavailable<'a>(
        &'a self,
        action: &ProxyAction,
        upstreams: &Upstreams,
        headers: &mut HeaderMap,
    ) -> Option<&'a ProxyAction> {
        let (page, _) = self.page.as_ref().filter(|_| self.unavailable)?;
        // As ingress-nginx, only a page backend with an endpoint takes over.
        if upstreams.has_endpoint(action) || !upstreams.has_endpoint(page) {
            return None;
        }
        self.mark(headers, UNAVAILABLE);
        Some(page)
    }

    /// Sets the page backend's headers: `X-Code`, `X-Format` (the client's `Accept`) and the
    /// fixed ones (`X-Request-ID` is the request's own, already set).
    fn mark(&self, headers: &mut HeaderMap, code: HeaderValue) {
        static X_CODE: HeaderName = HeaderName::from_static("x-code");
        static X_FORMAT: HeaderName = HeaderName::from_static("x-format");
        let format = headers.get(header::ACCEPT).cloned();
        headers.insert(X_CODE.clone(), code);
        match format {
            Some(f) => headers.insert(X_FORMAT.clone(), f),
            None => headers.remove(&X_FORMAT),
        };
        for (n, v) in &self.headers {
            headers.insert(n.clone(), v.clone());
        }
    }

    /// The response after the action: `resp` itself, or its page when the plan intercepts and
    /// its status is listed ([`ErrorPagesRt::replace`], counted as `error_page`).
    pub async fn finish(
        &self,
        plan: Plan<'_>,
        resp: Response<Body>,
        upstreams: &Upstreams,
        ctx: &RequestCtx,
        metrics: &Metrics,
    ) -> Response<Body> {
        match plan {
            Plan::Intercept(req) if self.intercepts(resp.status()) => {
                metrics.edge_events.inc(&"error_page");
                self.replace(upstreams, resp, req, ctx).await
            }
            _ => resp,
        }
    }

    /// The page for `original` (an intercepted status): the page backend's answer to `/`
    /// with the original status, or the built-in page; `original` itself when the page
    /// backend gives no answer in time.
    pub async fn replace(
        &self,
        upstreams: &Upstreams,
        original: Response<Body>,
        req: PageRequest,
        ctx: &RequestCtx,
    ) -> Response<Body> {
        let status = original.status();
        let Some((action, route)) = &self.page else {
            let (mut parts, _discarded) = original.into_parts();
            parts.headers.clear();
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            let text = format!(
                "{} {}\n",
                status.as_u16(),
                status.canonical_reason().unwrap_or("Error")
            );
            return Response::from_parts(parts, full(Bytes::from(text)));
        };
        static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
        let PageRequest {
            method,
            version,
            mut headers,
            original_uri,
        } = req;
        // No body: its framing goes, the rest of the client's head goes along as nginx sends it.
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        headers.remove(header::EXPECT);
        self.mark(&mut headers, HeaderValue::from(status.as_u16()));
        match original_uri {
            Some(u) => headers.insert(X_ORIGINAL_URI.clone(), u),
            None => headers.remove(&X_ORIGINAL_URI),
        };
        let mut page = Request::new(empty());
        *page.method_mut() = method;
        *page.version_mut() = version;
        *page.uri_mut() = Uri::from_static("/");
        *page.headers_mut() = headers;
        let answered =
            tokio::time::timeout(self.timeout, upstreams.forward(page, action, route, ctx))
                .await
                .ok()
                .filter(|p| {
                    p.extensions()
                        .get::<UpstreamServed>()
                        .is_some_and(|u| u.header_time.is_some())
                });
        let Some(page) = answered else {
            return original;
        };
        let (mut parts, _discarded) = original.into_parts();
        let (page_parts, body) = page.into_parts();
        parts.headers.clear();
        for name in PAGE_HEADERS {
            if let Some(v) = page_parts.headers.get(&name) {
                parts.headers.insert(name, v.clone());
            }
        }
        Response::from_parts(parts, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_codes_and_only_those_are_intercepted() {
        let rt = ErrorPagesRt::compile(&ErrorPages {
            codes: vec![400, 404, 463, 503, 599],
            ..Default::default()
        })
        .unwrap();
        for c in 100..1000u16 {
            let Ok(s) = StatusCode::from_u16(c) else {
                continue;
            };
            let want = [400, 404, 463, 503, 599].contains(&c);
            assert_eq!(rt.intercepts(s), want, "{c}");
        }
        assert!(ErrorPagesRt::compile(&ErrorPages {
            codes: vec![600],
            ..Default::default()
        })
        .is_err());
    }
}
