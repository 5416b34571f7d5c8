//! External authentication (the `external_auth` route filter, ingress-nginx's `auth-url`,
//! nginx's `auth_request`): before a request is served, a subrequest asks an auth service
//! (oauth2-proxy, Authelia, …) whether it may pass. Runs in the pipeline's access phase
//! after the IP lists, limits and basic authentication, before every other request filter,
//! mirrors and the cache (`crate::pipeline`), for HTTP/1.1, HTTP/2 and HTTP/3 alike.
//!
//! **The subrequest** (as ingress-nginx's auth location sends it): the original method (or
//! `method`), to the auth URL's path and query, with the original request's headers minus the
//! hop-by-hop ones and the body framing (`Content-Length`, `Transfer-Encoding`, `Expect`:
//! **no body is ever sent**), `Host` set to the auth service, and `X-Original-URL`
//! (`scheme://host/uri`), `X-Original-Method`, `X-Auth-Request-Redirect` (`request_redirect`,
//! else the request URI), `X-Sent-From`, `X-Real-IP`, `X-Forwarded-For`/`-Proto`/`-Host` and
//! `Forwarded` (with `method`, also `X-Original-URI` and `X-Scheme`). The URI and host are the
//! normalised ones the router matched (`crate::identity`), so the decision is about the
//! request that is served. HTTP/1.1 over keep-alive connections (a pool per filter; one the
//! service closed while idle is replaced once, as the proxy does: `SendError::stale`); `https`
//! verifies the service against the well-known public CAs.
//!
//! **The answer**: 2xx lets the request through: each of `response_headers` is first removed
//! from the request (a client's own `X-Auth-Request-User` never reaches the backend, whatever
//! the answer) and then copied from the answer; the answer's `Set-Cookie` fields go to the
//! client on a 2xx/3xx final response (or on any with `always_set_cookie`), as nginx's
//! `add_header Set-Cookie $auth_cookie` does. 401 is answered 401 with the service's
//! `WWW-Authenticate`, or with `signin` a 302 to it carrying the original URL in
//! `signin_redirect_param` (nginx's `error_page 401 = <signin>`). 403 is answered 403.
//! Anything else, an unreachable service, an address the policy refuses, a timeout, an
//! answer head over [`MAX_RESPONSE_HEADER_BYTES`] is answered 500 and logged.
//!
//! **Bounds**: the whole subrequest (connect, answer head, draining at most
//! [`MAX_RESPONSE_BODY_BYTES`] of its body, which is discarded) takes at most `timeout`; at
//! most `max_in_flight` subrequests of one filter run at once (a request that finds none free
//! is answered 503 with `Retry-After` at once: the backpressure core's request slots are the
//! queue). With `restrict_addresses` (the controller
//! sets it: the URL is tenant input) the connection refuses loopback, link-local, metadata,
//! unspecified and the dataplane's own addresses after resolution — the ExternalName policy
//! of [`crate::proxy::pool::refused_address`].

use crate::body::{text_response, Body};
use crate::ctx::RequestCtx;
use crate::proxy::pool::{Connector, Pool};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt as _;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::ext_auth::{escape, parse_auth_url, parse_signin, Part, Signin, Var};
use sweety_config::{BackendProtocol, BackendTls, ExternalAuth};
use tokio::sync::Semaphore;

/// The largest auth answer head (names and values of its fields) accepted; a larger one is
/// answered 500.
pub const MAX_RESPONSE_HEADER_BYTES: usize = 64 * 1024;
/// At most this much of an auth answer's body is read (and discarded); past it the
/// connection is dropped rather than reused.
pub const MAX_RESPONSE_BODY_BYTES: usize = 64 * 1024;
/// Idle keep-alive connections kept per filter.
const MAX_IDLE: usize = 16;

static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
static X_SCHEME: HeaderName = HeaderName::from_static("x-scheme");
static X_SENT_FROM: HeaderName = HeaderName::from_static("x-sent-from");
static X_AUTH_REQUEST_REDIRECT: HeaderName = HeaderName::from_static("x-auth-request-redirect");

/// The compiled `external_auth` filter of one route.
pub struct ExtAuthRules {
    address: String,
    path_and_query: Uri,
    host: HeaderValue,
    method: Option<Method>,
    signin: Option<Signin>,
    redirect_param: String,
    response_headers: Vec<HeaderName>,
    request_redirect: Option<HeaderValue>,
    always_set_cookie: bool,
    timeout: Duration,
    slots: Semaphore,
    pool: Arc<Pool>,
    /// The connector, or why none could be made (every request is then answered 500).
    connector: Result<Connector, String>,
}

impl std::fmt::Debug for ExtAuthRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExtAuthRules({})", self.address)
    }
}

/// What the auth service decided.
#[derive(Debug)]
pub enum Decision {
    /// The request passes (its headers already carry what the answer granted); these
    /// `Set-Cookie` values go to the client with the response ([`Allowed::set_cookies`]).
    Allow(Allowed),
    /// The request is answered with this response (401, 302, 403, 500, 503).
    Deny(Response<Body>),
}

/// The cookies of an allowing answer.
#[derive(Debug, Default)]
pub struct Allowed {
    cookies: Vec<HeaderValue>,
    always: bool,
}

impl Allowed {
    /// Adds the auth answer's `Set-Cookie` values to `resp`: on a 2xx or 3xx status (nginx's
    /// `add_header` statuses), or on any with `always_set_cookie`.
    pub fn set_cookies<B>(self, resp: &mut Response<B>) {
        let s = resp.status();
        if self.always || s.is_success() || s.is_redirection() {
            for c in self.cookies {
                resp.headers_mut().append(header::SET_COOKIE, c);
            }
        }
    }
}

impl ExtAuthRules {
    /// Compiles the filter (validated; a value that does not compile leaves the filter
    /// answering 500, never open).
    pub fn new(a: &ExternalAuth) -> ExtAuthRules {
        let url = parse_auth_url(&a.url);
        let connector = url.as_ref().map_err(Clone::clone).and_then(|u| {
            let tls = if u.tls {
                let t = BackendTls {
                    well_known_ca: true,
                    ..Default::default()
                };
                Some(crate::proxy::tls::client_config(&t, false)?)
            } else {
                None
            };
            Ok(Connector {
                protocol: if u.tls {
                    BackendProtocol::Https
                } else {
                    BackendProtocol::Http1
                },
                tls,
                sni: None,
                external: a.restrict_addresses,
                // Room for an answer head over the limit to be read whole, then refused
                // with its size (see `MAX_RESPONSE_HEADER_BYTES`).
                read_ahead: 4 * MAX_RESPONSE_HEADER_BYTES as u32,
                h2_client: sweety_config::Http2Client::default(),
            })
        });
        let (address, path_and_query, host) = match &url {
            Ok(u) => (
                u.address(),
                u.path_and_query
                    .parse()
                    .unwrap_or_else(|_| Uri::from_static("/")),
                HeaderValue::from_str(&u.authority())
                    .unwrap_or_else(|_| HeaderValue::from_static("invalid")),
            ),
            Err(_) => (
                String::from("invalid"),
                Uri::from_static("/"),
                HeaderValue::from_static("invalid"),
            ),
        };
        let connector = connector.and_then(|c| {
            // The URI must have parsed too (validation checked its characters).
            if url
                .as_ref()
                .is_ok_and(|u| path_and_query != u.path_and_query.as_str())
            {
                return Err("the auth URL's path does not parse".into());
            }
            Ok(c)
        });
        ExtAuthRules {
            address,
            path_and_query,
            host,
            method: a.method.as_deref().and_then(|m| m.parse().ok()),
            signin: a
                .signin
                .as_deref()
                .and_then(|s| parse_signin(s, &a.signin_redirect_param).ok()),
            redirect_param: a.signin_redirect_param.clone(),
            response_headers: a
                .response_headers
                .iter()
                .filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                .collect(),
            request_redirect: a
                .request_redirect
                .as_deref()
                .and_then(|r| HeaderValue::from_str(r).ok()),
            always_set_cookie: a.always_set_cookie,
            timeout: a.timeout.get(),
            slots: Semaphore::new(a.max_in_flight.max(1) as usize),
            pool: Arc::new(Pool::new(MAX_IDLE)),
            connector,
        }
    }

    /// Asks the auth service about `req` (after the router: its URI and authority are the
    /// normalised ones; `host` is the router's host). On [`Decision::Allow`] `req` carries
    /// the granted headers and none of the client's copies of them.
    pub async fn check(&self, req: &mut Request<Body>, host: &str, ctx: &RequestCtx) -> Decision {
        // A client's own copies never reach the backend, whatever the answer.
        for h in &self.response_headers {
            req.headers_mut().remove(h);
        }
        let connector = match &self.connector {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(auth = %self.address, error = %e, "external auth is unusable");
                return Decision::Deny(error_response());
            }
        };
        // No queue: a filter whose subrequests are all in flight answers at once (the
        // request slots of the backpressure core are the queue).
        let Ok(_slot) = self.slots.try_acquire() else {
            tracing::warn!(auth = %self.address, "external auth: no subrequest slot free");
            let mut r = text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "503 Service Unavailable: too many authentication requests in flight, retry later\n",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Decision::Deny(r);
        };
        let sub = self.subrequest(req, host, ctx);
        let answer = tokio::time::timeout(self.timeout, self.ask(connector, sub)).await;
        let (status, headers) = match answer {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                tracing::warn!(auth = %self.address, error = %e, "external auth failed");
                return Decision::Deny(error_response());
            }
            Err(_) => {
                tracing::warn!(auth = %self.address, timeout = ?self.timeout, "external auth timed out");
                return Decision::Deny(error_response());
            }
        };
        let cookies = || {
            headers
                .get_all(header::SET_COOKIE)
                .iter()
                .cloned()
                .collect()
        };
        if status.is_success() {
            for h in &self.response_headers {
                for v in headers.get_all(h) {
                    req.headers_mut().append(h.clone(), v.clone());
                }
            }
            return Decision::Allow(Allowed {
                cookies: cookies(),
                always: self.always_set_cookie,
            });
        }
        let deny = match status {
            StatusCode::UNAUTHORIZED => match &self.signin {
                Some(s) => {
                    let mut r = Response::new(crate::body::empty());
                    *r.status_mut() = StatusCode::FOUND;
                    match HeaderValue::from_str(&self.signin_url(s, req, host, ctx)) {
                        Ok(v) => {
                            r.headers_mut().insert(header::LOCATION, v);
                            r
                        }
                        Err(_) => error_response(),
                    }
                }
                None => {
                    let mut r = text_response(
                        StatusCode::UNAUTHORIZED,
                        "401 Unauthorized: authentication required\n",
                    );
                    for v in headers.get_all(header::WWW_AUTHENTICATE) {
                        r.headers_mut().append(header::WWW_AUTHENTICATE, v.clone());
                    }
                    r
                }
            },
            StatusCode::FORBIDDEN => {
                text_response(StatusCode::FORBIDDEN, "403 Forbidden: access denied\n")
            }
            other => {
                tracing::warn!(auth = %self.address, status = other.as_u16(), "external auth answered neither 2xx, 401 nor 403");
                error_response()
            }
        };
        let mut deny = deny;
        Allowed {
            cookies: cookies(),
            always: self.always_set_cookie,
        }
        .set_cookies(&mut deny);
        Decision::Deny(deny)
    }

    /// The subrequest for `req` (see the module docs).
    fn subrequest(&self, req: &Request<Body>, host: &str, ctx: &RequestCtx) -> Request<()> {
        let mut headers = req.headers().clone();
        crate::proxy::forward::strip_hop_by_hop(&mut headers);
        for h in [
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::EXPECT,
        ] {
            headers.remove(h);
        }
        crate::proxy::forward::join_cookies(&mut headers);
        let scheme = ctx.scheme();
        let request_uri = request_uri(req.uri());
        let http_host = http_host(req, host);
        fn set(headers: &mut HeaderMap, name: &HeaderName, value: &str) {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(name, v);
            }
        }
        set(
            &mut headers,
            &X_ORIGINAL_URL,
            &format!("{scheme}://{http_host}{request_uri}"),
        );
        set(&mut headers, &X_ORIGINAL_METHOD, req.method().as_str());
        set(&mut headers, &X_SENT_FROM, "sweety");
        match &self.request_redirect {
            Some(v) => {
                headers.insert(&X_AUTH_REQUEST_REDIRECT, v.clone());
            }
            None => set(&mut headers, &X_AUTH_REQUEST_REDIRECT, request_uri),
        }
        if self.method.is_some() {
            set(&mut headers, &X_ORIGINAL_URI, request_uri);
            set(&mut headers, &X_SCHEME, scheme);
        }
        let client_host = HeaderValue::from_str(&http_host).ok();
        crate::proxy::forward::add_forwarding_headers(
            &mut headers,
            ctx.conn.peer.ip(),
            scheme,
            client_host.as_ref(),
        );
        headers.insert(header::HOST, self.host.clone());
        let mut sub = Request::new(());
        *sub.method_mut() = self.method.clone().unwrap_or_else(|| req.method().clone());
        *sub.uri_mut() = self.path_and_query.clone();
        *sub.headers_mut() = headers;
        sub
    }

    /// Sends the subrequest; the answer's status and head (its body read up to
    /// [`MAX_RESPONSE_BODY_BYTES`] and discarded).
    async fn ask(
        &self,
        connector: &Connector,
        sub: Request<()>,
    ) -> Result<(StatusCode, HeaderMap), String> {
        // A pooled connection the service closed while idle gets one more try on a new one,
        // as the proxy's (`SendError::stale`): the subrequest has no body, so it may be
        // sent again.
        let mut fresh_left = true;
        let resp = loop {
            let conn = self
                .pool
                .acquire(&self.address, connector)
                .await
                .map_err(|e| e.to_string())?;
            let reused = conn.reused;
            match conn
                .send(&self.pool, sub.clone().map(|()| crate::body::empty()))
                .await
            {
                Ok((resp, _)) => break resp,
                Err(e) if fresh_left && e.stale(reused, true) => fresh_left = false,
                Err(e) => return Err(e.error.to_string()),
            }
        };
        let size: usize = resp
            .headers()
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum();
        if size > MAX_RESPONSE_HEADER_BYTES {
            return Err(format!(
                "answer head of {size} bytes, over {MAX_RESPONSE_HEADER_BYTES}"
            ));
        }
        let (parts, mut body) = resp.into_parts();
        let mut read = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            if let Some(d) = frame.data_ref() {
                read += d.len();
                if read > MAX_RESPONSE_BODY_BYTES {
                    // Dropped unread: the connection closes instead of going back to the pool.
                    break;
                }
            }
        }
        Ok((parts.status, parts.headers))
    }

    /// The signin URL with its variables substituted and, unless it has it, the redirect
    /// parameter carrying the original URL (`scheme://host` + escaped request URI, as
    /// ingress-nginx adds `$pass_access_scheme://$http_host$escaped_request_uri`).
    fn signin_url(&self, s: &Signin, req: &Request<Body>, host: &str, ctx: &RequestCtx) -> String {
        let request_uri = request_uri(req.uri());
        let http_host = http_host(req, host);
        let mut out = String::new();
        for p in &s.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Var(Var::Host) => out.push_str(host),
                Part::Var(Var::HttpHost) => out.push_str(&http_host),
                Part::Var(Var::Scheme) => out.push_str(ctx.scheme()),
                Part::Var(Var::RequestUri) => out.push_str(request_uri),
                Part::Var(Var::EscapedRequestUri) => out.push_str(&escape(request_uri)),
            }
        }
        if !s.has_redirect_param {
            out.push(if s.has_query { '&' } else { '?' });
            out.push_str(&self.redirect_param);
            out.push('=');
            out.push_str(ctx.scheme());
            out.push_str("://");
            out.push_str(&http_host);
            out.push_str(&escape(request_uri));
        }
        out
    }
}

/// The request's path and query, as routed.
fn request_uri(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

/// The router's host with the port the client named, if any (nginx's `$http_host`).
fn http_host(req: &Request<Body>, host: &str) -> String {
    match crate::identity::raw_authority(req).rsplit_once(':') {
        Some((h, p))
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') =>
        {
            format!("{host}:{p}")
        }
        _ => host.to_string(),
    }
}

fn error_response() -> Response<Body> {
    text_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "500 Internal Server Error: the authentication service could not be asked\n",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(signin: Option<&str>, param: &str) -> ExtAuthRules {
        let mut a = ExternalAuth::new("http://auth.example:8080/verify?x=1");
        a.signin = signin.map(String::from);
        a.signin_redirect_param = param.into();
        ExtAuthRules::new(&a)
    }

    fn ctx(tls: bool) -> RequestCtx {
        RequestCtx {
            conn: Arc::new(crate::ctx::ConnInfo {
                listener: Arc::from("l"),
                peer: "192.0.2.7:5000".parse().unwrap(),
                local: "127.0.0.1:443".parse().unwrap(),
                tls,
                sni: None,
                client_cert: None,
                client_cert_verdict: Default::default(),
                forwarding: Default::default(),
                tls_version: None,
                tls_cipher: None,
                read_budget: None,
            }),
            protocol: crate::ctx::Protocol::Http1,
            start: std::time::Instant::now(),
            log: false,
        }
    }

    fn req(uri: &str, host: &str) -> Request<Body> {
        Request::builder()
            .uri(uri)
            .header(header::HOST, host)
            .header(header::CONTENT_LENGTH, "5")
            .header(header::CONNECTION, "x-hop")
            .header("x-hop", "1")
            .header("x-forwarded-for", "198.51.100.1")
            .body(crate::body::empty())
            .unwrap()
    }

    #[test]
    fn signin_adds_the_original_url_unless_present() {
        let r = req("/a%20b?c=d&e", "App.Example:8443");
        let c = ctx(true);
        let s = rules(Some("https://login.example/start"), "rd");
        let got = s.signin_url(s.signin.as_ref().unwrap(), &r, "app.example", &c);
        assert_eq!(
            got,
            "https://login.example/start?rd=https://app.example:8443%2Fa%2520b%3Fc%3Dd%26e"
        );
        let s = rules(Some("https://login.example/start?x=1"), "next");
        let got = s.signin_url(s.signin.as_ref().unwrap(), &r, "app.example", &c);
        assert!(
            got.starts_with("https://login.example/start?x=1&next=https://"),
            "{got}"
        );
        let s = rules(
            Some("https://$host/oauth2/start?rd=$escaped_request_uri"),
            "rd",
        );
        let got = s.signin_url(s.signin.as_ref().unwrap(), &r, "app.example", &c);
        assert_eq!(
            got,
            "https://app.example/oauth2/start?rd=%2Fa%2520b%3Fc%3Dd%26e"
        );
    }

    #[test]
    fn the_subrequest_carries_the_original_request_but_no_body() {
        let r = req("/p?q=1", "app.example");
        let s = rules(None, "rd");
        let sub = s.subrequest(&r, "app.example", &ctx(false));
        let h = sub.headers();
        assert_eq!(sub.uri(), "/verify?x=1");
        assert_eq!(sub.method(), Method::GET);
        assert_eq!(h[header::HOST], "auth.example:8080");
        assert_eq!(h["x-original-url"], "http://app.example/p?q=1");
        assert_eq!(h["x-original-method"], "GET");
        assert_eq!(h["x-auth-request-redirect"], "/p?q=1");
        assert_eq!(h["x-forwarded-host"], "app.example");
        assert_eq!(h["x-real-ip"], "192.0.2.7");
        assert!(h.get(header::CONTENT_LENGTH).is_none());
        assert!(h.get("x-hop").is_none() && h.get(header::CONNECTION).is_none());
        assert!(h.get("x-original-uri").is_none());
    }

    #[test]
    fn cookies_follow_nginx_add_header_statuses() {
        for (status, always, expect) in [
            (200, false, true),
            (302, false, true),
            (404, false, false),
            (500, false, false),
            (404, true, true),
        ] {
            let mut resp = Response::new(());
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            Allowed {
                cookies: vec![HeaderValue::from_static("s=1")],
                always,
            }
            .set_cookies(&mut resp);
            assert_eq!(
                resp.headers().contains_key(header::SET_COOKIE),
                expect,
                "{status}"
            );
        }
    }
}
