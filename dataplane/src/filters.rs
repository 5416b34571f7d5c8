//! Route filters as pure functions over request and response heads: header modifiers,
//! redirects, URL rewrites and CORS. Mirrors are only collected here; the proxy sends them.
//!
//! Everything that can be parsed is parsed once, in [`CompiledFilters::compile`]: header names
//! and values, the redirect status, the rewrite authority and the CORS header values. Request
//! filters then run in config order; the first one that answers (a redirect or a CORS
//! preflight) stops the chain.
//!
//! Path replacement follows Gateway API semantics for both rewrites and redirects: `full`
//! replaces the whole path, `prefix` (ReplacePrefixMatch) replaces the part that the route's
//! path prefix matched, on segment boundaries, leaving exactly one `/` at the joint. The query
//! string is always kept.
//!
//! CORS follows the Gateway API conformance tests (`HTTPRouteCORS`,
//! `CORSAllowCredentialsBehavior`): an allowed preflight is answered `200` with the
//! `Access-Control-*` headers, a preflight from another origin is answered `403` without any,
//! and simple requests from an allowed origin get `Access-Control-Allow-Origin` and friends on
//! the response. An empty `allow_origins` list allows every origin, like `*`.

use crate::body::{self, Body};
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, CONTENT_LENGTH, HOST, LOCATION,
    ORIGIN, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use std::fmt::Write as _;
use sweety_config::{Cors, Filter, HeaderModifier, Mirror, PathRewrite, Redirect, UrlRewrite};

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
    /// Request-side filters, in config order.
    request: Vec<RequestFilter>,
    /// Response header modifiers, in config order.
    response: Vec<CompiledHeaderModifier>,
    /// The CORS policy (the first CORS filter), for responses.
    cors: Option<CompiledCors>,
    /// Mirror filters, in config order.
    mirrors: Vec<Mirror>,
    /// Content handling: compression, response cache, gRPC options (the last filter of each kind
    /// wins).
    content: ContentFilters,
}

/// The compiled `compress`, `cache`, `grpc` and `error_pages` filters of a route.
#[derive(Debug, Default, Clone)]
pub struct ContentFilters {
    /// Response compression (`None`: off).
    pub compress: Option<crate::compress::CompressPolicy>,
    /// Response caching (`None`: off).
    pub cache: Option<sweety_config::CachePolicy>,
    /// gRPC options.
    pub grpc: Option<sweety_config::GrpcOptions>,
    /// Error pages (`None`: responses pass as they are).
    pub error_pages: Option<std::sync::Arc<crate::error_pages::ErrorPagesRt>>,
}

#[derive(Debug)]
enum RequestFilter {
    Headers(CompiledHeaderModifier),
    Rewrite(CompiledRewrite),
    Redirect(CompiledRedirect),
    /// Answer preflights with the route's CORS policy (`CompiledFilters::cors`).
    CorsPreflight,
}

/// A header modifier with names and values parsed.
#[derive(Debug, Default)]
struct CompiledHeaderModifier {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl CompiledHeaderModifier {
    fn compile(m: &HeaderModifier) -> Result<Self, String> {
        let pair = |h: &sweety_config::HeaderValue| -> Result<(HeaderName, HeaderValue), String> {
            Ok((header_name(&h.name)?, header_value(&h.name, &h.value)?))
        };
        Ok(CompiledHeaderModifier {
            set: m.set.iter().map(pair).collect::<Result<_, _>>()?,
            add: m.add.iter().map(pair).collect::<Result<_, _>>()?,
            remove: m
                .remove
                .iter()
                .map(|n| header_name(n))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Removes, then sets (replacing every value), then appends; the same order as
    /// [`modify_headers`].
    fn apply(&self, headers: &mut HeaderMap) {
        for n in &self.remove {
            headers.remove(n);
        }
        for (n, v) in &self.set {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            headers.append(n.clone(), v.clone());
        }
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("invalid header name {name:?}"))
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("invalid value {value:?} for header {name:?}"))
}

#[derive(Debug)]
struct CompiledRewrite {
    /// New host: the `Host` header value and the URI authority.
    host: Option<(HeaderValue, http::uri::Authority)>,
    path: Option<CompiledPath>,
}

/// A [`PathRewrite`] ready to apply: a regex rewrite's pattern compiled once.
#[derive(Debug)]
enum CompiledPath {
    Full(String),
    Prefix(String),
    Regex(regex::Regex, String),
}

impl CompiledPath {
    fn compile(p: &PathRewrite) -> Result<Self, String> {
        Ok(match p {
            PathRewrite::Full(v) => CompiledPath::Full(v.clone()),
            PathRewrite::Prefix(v) => CompiledPath::Prefix(v.clone()),
            PathRewrite::Regex {
                pattern,
                substitution,
            } => CompiledPath::Regex(
                regex::Regex::new(pattern).map_err(|e| format!("invalid regex: {e}"))?,
                substitution.clone(),
            ),
        })
    }
}

#[derive(Debug)]
struct CompiledRedirect {
    scheme: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    path: Option<CompiledPath>,
    status: StatusCode,
}

/// An allowed origin.
#[derive(Debug)]
enum OriginPattern {
    /// Compared case-insensitively.
    Exact(String),
    /// `https://*.example.com`: the text before and after the `*`, lower-cased. The `*` stands
    /// for one or more host labels.
    Wildcard { before: String, after: String },
}

impl OriginPattern {
    fn matches(&self, origin: &str) -> bool {
        match self {
            OriginPattern::Exact(o) => o.eq_ignore_ascii_case(origin),
            OriginPattern::Wildcard { before, after } => {
                origin.len() > before.len() + after.len()
                    && starts_with_ignore_case(origin, before)
                    && ends_with_ignore_case(origin, after)
                    && origin[before.len()..origin.len() - after.len()]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            }
        }
    }
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

#[derive(Debug)]
struct CompiledCors {
    any_origin: bool,
    origins: Vec<OriginPattern>,
    /// `*` among the methods: the requested method is echoed.
    any_method: bool,
    methods: Option<HeaderValue>,
    /// `*` among the headers: the requested headers are echoed.
    any_header: bool,
    headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: Option<HeaderValue>,
}

/// `items` joined with `, ` as a header value, `None` when empty. With `skip_star`, `*` is
/// left out (it is handled by echoing the request instead).
fn joined(name: &str, items: &[String], skip_star: bool) -> Result<Option<HeaderValue>, String> {
    let items: Vec<&str> = items
        .iter()
        .map(String::as_str)
        .filter(|i| !(skip_star && *i == "*"))
        .collect();
    if items.is_empty() {
        return Ok(None);
    }
    header_value(name, &items.join(", ")).map(Some)
}

impl CompiledCors {
    fn compile(c: &Cors) -> Result<Self, String> {
        let mut origins = Vec::new();
        let mut any_origin = c.allow_origins.is_empty();
        for o in &c.allow_origins {
            if o == "*" {
                any_origin = true;
            } else if let Some((before, after)) = o.split_once('*') {
                if after.contains('*') {
                    return Err(format!("origin {o:?} has more than one '*'"));
                }
                origins.push(OriginPattern::Wildcard {
                    before: before.to_ascii_lowercase(),
                    after: after.to_ascii_lowercase(),
                });
            } else {
                origins.push(OriginPattern::Exact(o.clone()));
            }
        }
        for h in c.allow_headers.iter().chain(&c.expose_headers) {
            if h != "*" {
                header_name(h)?;
            }
        }
        Ok(CompiledCors {
            any_origin,
            origins,
            any_method: c.allow_methods.iter().any(|m| m == "*"),
            methods: joined("access-control-allow-methods", &c.allow_methods, true)?,
            any_header: c.allow_headers.iter().any(|h| h == "*"),
            headers: joined("access-control-allow-headers", &c.allow_headers, true)?,
            expose: joined("access-control-expose-headers", &c.expose_headers, false)?,
            credentials: c.allow_credentials,
            max_age: c.max_age.map(HeaderValue::from),
        })
    }

    fn allows(&self, origin: &HeaderValue) -> bool {
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        self.any_origin || self.origins.iter().any(|p| p.matches(origin))
    }

    /// The `Access-Control-Allow-Origin` value for an allowed origin: `*` when every origin
    /// is allowed without credentials, else the origin itself.
    fn allow_origin(&self, origin: &HeaderValue) -> HeaderValue {
        if self.any_origin && !self.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }

    /// Headers shared by preflight and actual responses of an allowed origin.
    fn decorate(&self, origin: &HeaderValue, headers: &mut HeaderMap) {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, self.allow_origin(origin));
        if self.credentials {
            headers.insert(
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        if let Some(e) = &self.expose {
            headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, e.clone());
        }
        add_vary_origin(headers);
    }

    /// The answer to a preflight (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`).
    fn preflight(&self, req: &http::request::Parts, origin: &HeaderValue) -> Response<Body> {
        let mut resp = Response::new(body::empty());
        let headers = resp.headers_mut();
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        if !self.allows(origin) {
            *resp.status_mut() = StatusCode::FORBIDDEN;
            add_vary_origin(resp.headers_mut());
            return resp;
        }
        self.decorate(origin, headers);
        let methods = if self.any_method {
            req.headers.get(ACCESS_CONTROL_REQUEST_METHOD).cloned()
        } else {
            self.methods.clone()
        };
        if let Some(m) = methods {
            headers.insert(ACCESS_CONTROL_ALLOW_METHODS, m);
        }
        let allow_headers = if self.any_header {
            req.headers.get(ACCESS_CONTROL_REQUEST_HEADERS).cloned()
        } else {
            self.headers.clone()
        };
        if let Some(h) = allow_headers {
            headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, h);
        }
        if let Some(a) = &self.max_age {
            headers.insert(ACCESS_CONTROL_MAX_AGE, a.clone());
        }
        resp
    }
}

/// Adds `Origin` to `Vary` unless it is already listed.
fn add_vary_origin(headers: &mut HeaderMap) {
    let present = headers.get_all(VARY).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("origin") || t.trim() == "*")
        })
    });
    if !present {
        headers.append(VARY, HeaderValue::from_static("Origin"));
    }
}

fn is_preflight(req: &http::request::Parts) -> bool {
    req.method == Method::OPTIONS
        && req.headers.contains_key(ORIGIN)
        && req.headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// The well-known port of a scheme.
fn well_known_port(scheme: &str) -> Option<u16> {
    match scheme {
        s if s.eq_ignore_ascii_case("http") => Some(80),
        s if s.eq_ignore_ascii_case("https") => Some(443),
        _ => None,
    }
}

/// Applies a path replacement to `path`. `prefix` is the prefix the route's path match
/// matched; a `prefix` replacement without one leaves the path as it is.
fn rewrite_path(path: &str, rewrite: &CompiledPath, prefix: Option<&str>) -> String {
    match rewrite {
        CompiledPath::Full(p) => p.clone(),
        CompiledPath::Prefix(replacement) => match prefix {
            Some(prefix) => replace_prefix(path, prefix, replacement),
            None => path.to_string(),
        },
        CompiledPath::Regex(re, substitution) => substitute(path, re, substitution),
    }
}

/// nginx's `rewrite`: when `re` is found in `path`, the whole path becomes `substitution`
/// with `$1`…`$9` replaced by the groups (an unmatched group is empty); otherwise `path`.
/// The result has its dot segments removed and runs of `/` merged (a group may end in `.`
/// next to a literal `.`): the backend never gets a path that climbs or differs from what
/// the request log shows.
fn substitute(path: &str, re: &regex::Regex, substitution: &str) -> String {
    let Some(caps) = re.captures(path) else {
        return path.to_string();
    };
    let mut out = String::with_capacity(substitution.len() + path.len());
    let mut rest = substitution;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digit = rest.as_bytes().get(at + 1).copied();
        match digit {
            Some(d @ b'1'..=b'9') => {
                if let Some(m) = caps.get(usize::from(d - b'0')) {
                    out.push_str(m.as_str());
                }
                rest = &rest[at + 2..];
            }
            // Refused by validation; kept literally if it ever came here.
            _ => {
                out.push('$');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    // Escaped slashes were judged on the request's path by the listener's policy: kept here.
    let policy = crate::path_norm::PathNormalization {
        escaped_slashes: crate::path_norm::EscapedSlashes::Keep,
        ..Default::default()
    };
    match crate::path_norm::normalize(&out, &policy) {
        Ok(p) => p.into_owned(),
        // Groups come from a normalised path and the literal part is checked: unreachable,
        // but never forward what could not be normalised.
        Err(_) => path.to_string(),
    }
}

/// Gateway API ReplacePrefixMatch: `/foo` → `/bar` turns `/foo/x` into `/bar/x` and `/foo`
/// into `/bar`; `/foo` → `/` turns `/foo/x` into `/x` and `/foo` into `/`.
fn replace_prefix(path: &str, prefix: &str, replacement: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let rest = match path.strip_prefix(prefix) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        // The prefix did not match on a segment boundary: keep the path.
        _ => return path.to_string(),
    };
    let mut out = String::with_capacity(replacement.len() + rest.len() + 1);
    out.push_str(replacement.trim_end_matches('/'));
    out.push_str(rest);
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    out
}

/// The request host without port: the URI authority's, else the `Host` header's.
fn request_host(req: &http::request::Parts) -> Option<String> {
    if let Some(h) = req.uri.host() {
        return Some(h.to_string());
    }
    let host = req.headers.get(HOST)?.to_str().ok()?;
    let authority: http::uri::Authority = host.parse().ok()?;
    Some(authority.host().to_string())
}

/// Replaces the path of `uri` (keeping its query, scheme and authority).
fn set_path(uri: &mut http::Uri, path: &str) {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let Ok(pq) = http::uri::PathAndQuery::try_from(pq) else {
        return;
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(pq);
    if let Ok(new) = http::Uri::from_parts(parts) {
        *uri = new;
    }
}

impl CompiledRewrite {
    fn apply(&self, req: &mut http::request::Parts, prefix: Option<&str>) {
        if let Some((value, authority)) = &self.host {
            req.headers.insert(HOST, value.clone());
            if req.uri.authority().is_some() {
                let mut parts = std::mem::take(&mut req.uri).into_parts();
                parts.authority = Some(authority.clone());
                if let Ok(uri) = http::Uri::from_parts(parts) {
                    req.uri = uri;
                }
            }
        }
        if let Some(rewrite) = &self.path {
            let path = rewrite_path(req.uri.path(), rewrite, prefix);
            set_path(&mut req.uri, &path);
        }
    }
}

impl CompiledRedirect {
    fn compile(r: &Redirect) -> Result<Self, String> {
        let status = StatusCode::from_u16(r.status)
            .ok()
            .filter(StatusCode::is_redirection)
            .ok_or_else(|| format!("invalid redirect status {}", r.status))?;
        Ok(CompiledRedirect {
            scheme: r.scheme.as_ref().map(|s| s.to_ascii_lowercase()),
            host: r.host.clone(),
            port: r.port,
            path: r.path.as_ref().map(CompiledPath::compile).transpose()?,
            status,
        })
    }

    /// The `Location` of the redirect, following Gateway API `RequestRedirect` rules.
    fn location(
        &self,
        req: &http::request::Parts,
        scheme: &str,
        listener_port: u16,
        prefix: Option<&str>,
    ) -> String {
        let out_scheme = self.scheme.as_deref().unwrap_or(scheme);
        let host = match &self.host {
            Some(h) => h.clone(),
            None => request_host(req).unwrap_or_default(),
        };
        let port = self.port.unwrap_or_else(|| match &self.scheme {
            Some(s) => well_known_port(s).unwrap_or(listener_port),
            None => listener_port,
        });
        let path = match &self.path {
            Some(rewrite) => rewrite_path(req.uri.path(), rewrite, prefix),
            None => req.uri.path().to_string(),
        };
        let mut loc = String::with_capacity(out_scheme.len() + host.len() + path.len() + 16);
        loc.push_str(out_scheme);
        loc.push_str("://");
        if host.contains(':') && !host.starts_with('[') {
            let _ = write!(loc, "[{host}]");
        } else {
            loc.push_str(&host);
        }
        if well_known_port(out_scheme) != Some(port) {
            let _ = write!(loc, ":{port}");
        }
        loc.push_str(&path);
        if let Some(q) = req.uri.query() {
            loc.push('?');
            loc.push_str(q);
        }
        loc
    }

    fn respond(
        &self,
        req: &http::request::Parts,
        scheme: &str,
        port: u16,
        prefix: Option<&str>,
    ) -> Response<Body> {
        let location = self.location(req, scheme, port, prefix);
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = self.status;
        let headers = resp.headers_mut();
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        match HeaderValue::try_from(location) {
            Ok(v) => {
                headers.insert(LOCATION, v);
            }
            // Only possible with a request host or path that is not a valid header value.
            Err(_) => *resp.status_mut() = StatusCode::BAD_REQUEST,
        }
        resp
    }
}

impl CompiledFilters {
    /// Compiles config filters; an error says which filter is invalid and why.
    pub fn compile(filters: &[Filter]) -> Result<CompiledFilters, String> {
        let mut out = CompiledFilters::default();
        for (i, f) in filters.iter().enumerate() {
            let kind = filter_kind(f);
            let err = |e: String| format!("filters[{i}] ({kind}): {e}");
            match f {
                Filter::RequestHeaders(m) => out.request.push(RequestFilter::Headers(
                    CompiledHeaderModifier::compile(m).map_err(err)?,
                )),
                Filter::ResponseHeaders(m) => out
                    .response
                    .push(CompiledHeaderModifier::compile(m).map_err(err)?),
                Filter::Redirect(r) => out.request.push(RequestFilter::Redirect(
                    CompiledRedirect::compile(r).map_err(err)?,
                )),
                Filter::Rewrite(r) => out
                    .request
                    .push(RequestFilter::Rewrite(compile_rewrite(r).map_err(err)?)),
                Filter::Mirror(m) => out.mirrors.push(m.clone()),
                Filter::Cors(c) => {
                    if out.cors.is_some() {
                        return Err(err("only one CORS filter is allowed per route".into()));
                    }
                    out.cors = Some(CompiledCors::compile(c).map_err(err)?);
                    out.request.push(RequestFilter::CorsPreflight);
                }
                // Applied by the pipeline before every other filter (see `crate::access`).
                Filter::RateLimit(_)
                | Filter::IpAccess(_)
                | Filter::ConcurrencyLimit(_)
                | Filter::BasicAuth(_)
                | Filter::ExternalAuth(_) => {}
                Filter::Compress(c) => {
                    out.content.compress = crate::compress::CompressPolicy::compile(c)
                }
                Filter::Cache(c) => out.content.cache = Some(c.clone()),
                Filter::Grpc(g) => out.content.grpc = Some(g.clone()),
                Filter::ErrorPages(e) => {
                    out.content.error_pages = Some(std::sync::Arc::new(
                        crate::error_pages::ErrorPagesRt::compile(e).map_err(err)?,
                    ))
                }
            }
        }
        Ok(out)
    }

    /// True when there are no filters at all.
    pub fn is_empty(&self) -> bool {
        self.request.is_empty()
            && self.response.is_empty()
            && self.cors.is_none()
            && self.mirrors.is_empty()
            && self.content.compress.is_none()
            && self.content.cache.is_none()
            && self.content.grpc.is_none()
            && self.content.error_pages.is_none()
    }

    /// The route's compression, cache and gRPC settings.
    pub fn content(&self) -> &ContentFilters {
        &self.content
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
        for f in &self.request {
            match f {
                RequestFilter::Headers(m) => m.apply(&mut req.headers),
                RequestFilter::Rewrite(r) => r.apply(req, prefix),
                RequestFilter::Redirect(r) => {
                    return RequestOutcome::Respond(r.respond(req, scheme, port, prefix))
                }
                RequestFilter::CorsPreflight => {
                    if let (Some(cors), true) = (&self.cors, is_preflight(req)) {
                        if let Some(origin) = req.headers.get(ORIGIN) {
                            return RequestOutcome::Respond(cors.preflight(req, origin));
                        }
                    }
                }
            }
        }
        RequestOutcome::Continue
    }

    /// Mirror filters, for the proxy to send.
    pub fn mirrors(&self) -> impl Iterator<Item = &Mirror> {
        self.mirrors.iter()
    }

    /// Whether [`CompiledFilters::on_response`] can change a response (header modifiers or
    /// CORS are configured).
    pub fn has_response_filters(&self) -> bool {
        !self.response.is_empty() || self.cors.is_some()
    }

    /// Applies response-side filters: response header modifiers and CORS headers (using the
    /// request's `Origin`).
    pub fn on_response(&self, origin: Option<&HeaderValue>, resp: &mut http::response::Parts) {
        for m in &self.response {
            m.apply(&mut resp.headers);
        }
        if let (Some(cors), Some(origin)) = (&self.cors, origin) {
            if cors.allows(origin) {
                cors.decorate(origin, &mut resp.headers);
            } else {
                add_vary_origin(&mut resp.headers);
            }
        }
    }
}

fn compile_rewrite(r: &UrlRewrite) -> Result<CompiledRewrite, String> {
    let host = match &r.host {
        Some(h) => Some((
            header_value("host", h)?,
            h.parse::<http::uri::Authority>()
                .map_err(|_| format!("invalid rewrite host {h:?}"))?,
        )),
        None => None,
    };
    Ok(CompiledRewrite {
        host,
        path: r.path.as_ref().map(CompiledPath::compile).transpose()?,
    })
}

fn filter_kind(f: &Filter) -> &'static str {
    match f {
        Filter::RequestHeaders(_) => "request_headers",
        Filter::ResponseHeaders(_) => "response_headers",
        Filter::Redirect(_) => "redirect",
        Filter::Rewrite(_) => "rewrite",
        Filter::Mirror(_) => "mirror",
        Filter::Cors(_) => "cors",
        Filter::RateLimit(_) => "rate_limit",
        Filter::IpAccess(_) => "ip_access",
        Filter::ConcurrencyLimit(_) => "concurrency_limit",
        Filter::BasicAuth(_) => "basic_auth",
        Filter::ExternalAuth(_) => "external_auth",
        Filter::Compress(_) => "compress",
        Filter::Cache(_) => "cache",
        Filter::Grpc(_) => "grpc",
        Filter::ErrorPages(_) => "error_pages",
    }
}

/// Applies an uncompiled header modifier (used for rarely-set per-backend filters).
///
/// Removes, then sets, then appends; entries whose name or value is invalid are skipped.
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

#[cfg(test)]
mod tests;
