//! One request identity (issue 16): after a protocol adapter has parsed a request and before
//! anything else looks at it, [`establish`] settles the one authority, the one path and the
//! one body framing that routing, the 421 check, access rules, rate-limit keys, the cache key,
//! the access log and the upstream request all use. A request that has no such identity is
//! refused with 400 ([`IdentityError`]).
//!
//! * **Authority.** The URI authority (HTTP/1.1 absolute-form, HTTP/2 and HTTP/3 `:authority`)
//!   or else `Host`. Absolute-form replaces `Host` (RFC 9112 §3.2.2); on HTTP/2 and HTTP/3 a
//!   `host` that disagrees with `:authority` is refused (RFC 9113 §8.3.1, RFC 9114 §4.3.1). More
//!   than one `Host`, none on HTTP/1.1 (RFC 9112 §3.2), userinfo (RFC 9110 §4.2.4), an empty
//!   host or one that is not a valid authority: refused. The host is lower-cased without a
//!   trailing dot; `Host` is then set to it (with the port as sent) and the URI carries the same.
//! * **Path.** Normalised by [`crate::path_norm`]; the URI carries the normalised path (the
//!   query as it came). A target that is not origin-form (`*`, `?x`, authority-form) is refused.
//! * **Framing.** `Content-Length` must be one decimal number (repeated equal values are one);
//!   `Transfer-Encoding` is only `chunked` and never with `Content-Length` (RFC 9112 §6.1, as
//!   nginx and HAProxy refuse it); on HTTP/2 and HTTP/3 it is never allowed. A body that ended
//!   before its declared length is refused here; an HTTP/2 or HTTP/3 body that turns out
//!   shorter or longer than declared while streaming fails with [`FramingError`], which aborts
//!   the upstream request (hyper closes that upstream connection; it is never pooled).
//! * **Connection-named fields.** An HTTP/1.1 request's fields named in `Connection` are
//!   hop-by-hop (RFC 9110 §7.6.1): they are removed here, before route matching and filters
//!   can read them, except the ones the identity itself settles (`Host`, `Content-Length`,
//!   `Transfer-Encoding`) and those an upgrade needs (`Upgrade`, `Connection`, `TE`).

use crate::body::{Body, BoxError};
use crate::ctx::Protocol;
use crate::path_norm::{self, PathError, PathNormalization};
use bytes::Bytes;
use http::{header, HeaderValue, Request, Uri, Version};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Request extension: this HTTP/1.1 request had both `Content-Length` and `Transfer-Encoding`
/// on the wire (the first removed); set by Sweety's HTTP/1.1 engine (`sweety_h1::server`) or,
/// on hyper's, by the connection's wire tracker (`listen::h1_wire`); refused here.
pub use sweety_h1::server::ConflictingFraming;

/// Why a request has no single identity (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// More than one `Host` field.
    #[error("more than one Host header")]
    DuplicateHost,
    /// An HTTP/1.1 request without `Host`.
    #[error("HTTP/1.1 request without a Host header")]
    MissingHost,
    /// `:authority` (or absolute-form) and `host` name different hosts on HTTP/2 or HTTP/3.
    #[error(":authority and host disagree")]
    AuthorityMismatch,
    /// `user@` in the authority.
    #[error("userinfo in the authority")]
    Userinfo,
    /// The authority is empty or not a valid `host[:port]`.
    #[error("invalid authority")]
    BadAuthority,
    /// The path could not be normalised, or the target is not origin-form.
    #[error("{0}")]
    Path(#[from] PathError),
    /// `Content-Length` is not one decimal number.
    #[error("invalid or conflicting Content-Length")]
    BadContentLength,
    /// `Transfer-Encoding` with `Content-Length`, a coding other than `chunked`, or any on
    /// HTTP/2 and HTTP/3.
    #[error("Transfer-Encoding not allowed here")]
    BadTransferEncoding,
    /// The body ended before the declared `Content-Length`.
    #[error("request body shorter than its Content-Length")]
    ShortBody,
    /// The body's DATA did not add up to its `Content-Length` (found while reading it).
    #[error("{0}")]
    Framing(#[from] FramingError),
}

impl IdentityError {
    /// The 400 answer.
    pub fn response(&self) -> http::Response<Body> {
        let mut r = http::Response::new(crate::body::full(Bytes::from(format!(
            "400 Bad Request: {self}\n"
        ))));
        *r.status_mut() = http::StatusCode::BAD_REQUEST;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    }
}

/// Settles the request's identity in place (see the module docs).
pub fn establish(
    req: &mut Request<Body>,
    protocol: Protocol,
    paths: &PathNormalization,
) -> Result<(), IdentityError> {
    let authority = authority(req, protocol)?;
    framing(req, protocol)?;
    if protocol == Protocol::Http1 {
        drop_connection_named(req.headers_mut());
    }
    let uri = req.uri();
    let raw_path = uri.path();
    // `http` gives "/" for an empty origin-form path and the whole target for `*`.
    if raw_path.is_empty()
        || uri
            .path_and_query()
            .is_some_and(|p| p.as_str().starts_with('?'))
    {
        return Err(IdentityError::Path(PathError::NotOrigin));
    }
    let path = path_norm::normalize(raw_path, paths)?;
    let same_path = path == raw_path;
    let same_authority = match (&authority, uri.authority()) {
        (Some(a), Some(u)) => a.as_str() == u.as_str(),
        (_, None) => true,
        (None, Some(_)) => false,
    };
    if !(same_path && same_authority) {
        let mut s = String::with_capacity(
            uri.scheme_str().map_or(0, |x| x.len() + 3)
                + authority.as_ref().map_or(0, |a| a.as_str().len())
                + path.len()
                + uri.query().map_or(0, |q| q.len() + 1),
        );
        if let (Some(scheme), Some(a)) = (uri.scheme_str(), authority.as_ref()) {
            s.push_str(scheme);
            s.push_str("://");
            s.push_str(a.as_str());
        }
        s.push_str(&path);
        if let Some(q) = uri.query() {
            s.push('?');
            s.push_str(q);
        }
        *req.uri_mut() = s
            .parse::<Uri>()
            .map_err(|_| IdentityError::Path(PathError::BadEscape))?;
    }
    if let Some(a) = authority {
        // A `Host` already in its normal form (one field, checked above) stays as it is: the
        // field itself when the authority is it (nothing above removes or changes `Host`).
        let same_host = matches!(a, Normal::Host(_))
            || req
                .headers()
                .get(header::HOST)
                .is_some_and(|h| h.as_bytes() == a.as_bytes());
        if !same_host {
            let v = HeaderValue::from_str(a.as_str()).map_err(|_| IdentityError::BadAuthority)?;
            req.headers_mut().insert(header::HOST, v);
        }
    }
    Ok(())
}

/// A normalised authority: the request's own when it is in normal form already (the usual
/// `Host` and `:authority`: shared, not copied), else the normal form made of it.
#[derive(Debug)]
enum Normal {
    /// The `Host` field's value, normal already (visible ASCII: [`already_normal`] passed).
    Host(HeaderValue),
    /// The URI's authority, normal already.
    Uri(http::uri::Authority),
    /// Made by [`normalize_authority`] or [`normal_form`].
    Made(String),
}

impl Normal {
    fn as_str(&self) -> &str {
        match self {
            // Checked by `to_str` before it was found normal: never the default.
            Normal::Host(v) => v.to_str().unwrap_or_default(),
            Normal::Uri(a) => a.as_str(),
            Normal::Made(s) => s,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Normal::Host(v) => v.as_bytes(),
            a => a.as_str().as_bytes(),
        }
    }
}

/// The normalised authority (`host[:port]`, host lower-cased, no trailing dot); None for an
/// HTTP/1.0 request without one.
fn authority(req: &Request<Body>, protocol: Protocol) -> Result<Option<Normal>, IdentityError> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let field = hosts.next();
    if hosts.next().is_some() {
        return Err(IdentityError::DuplicateHost);
    }
    // The URI's authority was parsed with the URI (by the same rules as `Host` below): it is
    // not parsed again.
    let from_uri = req.uri().authority();
    if protocol == Protocol::Http1 && req.version() != Version::HTTP_10 && field.is_none() {
        return Err(IdentityError::MissingHost);
    }
    let host = match field {
        Some(h) => Some(h.to_str().map_err(|_| IdentityError::BadAuthority)?),
        None => None,
    };
    match (from_uri, host, field) {
        (Some(u), Some(h), _) if protocol != Protocol::Http1 => {
            let u = normal_form(u)?;
            if u != normalize_authority(h)? {
                return Err(IdentityError::AuthorityMismatch);
            }
            Ok(Some(Normal::Made(u)))
        }
        // What `normal_form` and `normalize_authority` would copy unchanged is kept as it is.
        (Some(u), _, _) if already_normal(u.as_str()) => Ok(Some(Normal::Uri(u.clone()))),
        (Some(u), _, _) => normal_form(u).map(|a| Some(Normal::Made(a))),
        (None, Some(h), Some(field)) if already_normal(h) => Ok(Some(Normal::Host(field.clone()))),
        (None, Some(h), _) => normalize_authority(h).map(|a| Some(Normal::Made(a))),
        (None, None, _) => Ok(None),
    }
}

/// `host[:port]` lower-cased, without a trailing dot on the host.
pub fn normalize_authority(raw: &str) -> Result<String, IdentityError> {
    if already_normal(raw) {
        return Ok(raw.to_owned());
    }
    if raw.contains('@') {
        return Err(IdentityError::Userinfo);
    }
    let a: http::uri::Authority = raw.parse().map_err(|_| IdentityError::BadAuthority)?;
    normal_form(&a)
}

/// Whether `s` is an authority in its normal form already, by one look at each byte: a host of
/// lower-case letters, digits, `-` and `.` (not empty, no leading or trailing dot, no `..`),
/// then optionally `:` and a port of 1 to 5 digits up to 65535. The usual `Host` and
/// `:authority` are; for them the parse and the checks of [`normal_form`] (several passes over
/// the string) would only give the same string back. Anything else (upper case, IPv6, a
/// trailing dot, userinfo, junk) goes the long way.
fn already_normal(s: &str) -> bool {
    // One pass: the host's bytes up to the first `:`, then the port's. `prev` starts as a dot
    // so that a leading dot fails like a doubled one.
    let b = s.as_bytes();
    let mut prev = b'.';
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'a'..=b'z' | b'0'..=b'9' | b'-' => {}
            b'.' if prev != b'.' => {}
            b':' => break,
            _ => return false,
        }
        prev = c;
        i += 1;
    }
    // Not empty, no trailing dot.
    if i == 0 || prev == b'.' {
        return false;
    }
    let Some(port) = b.get(i + 1..) else {
        return true;
    };
    if port.is_empty() || port.len() > 5 {
        return false;
    }
    let mut n: u32 = 0;
    for &c in port {
        if !c.is_ascii_digit() {
            return false;
        }
        n = n * 10 + u32::from(c - b'0');
    }
    n <= u32::from(u16::MAX)
}

/// [`normalize_authority`] of an authority parsed already (one allocation, the result).
fn normal_form(a: &http::uri::Authority) -> Result<String, IdentityError> {
    if already_normal(a.as_str()) {
        return Ok(a.as_str().to_owned());
    }
    if a.as_str().contains('@') {
        return Err(IdentityError::Userinfo);
    }
    let host = a.host();
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.starts_with('.') || host.contains("..") {
        return Err(IdentityError::BadAuthority);
    }
    let port = a.port();
    let mut out =
        String::with_capacity(host.len() + port.as_ref().map_or(0, |p| p.as_str().len() + 1));
    out.push_str(host);
    out.make_ascii_lowercase();
    if let Some(p) = port {
        out.push(':');
        out.push_str(p.as_str());
    }
    Ok(out)
}

/// A `Content-Length` value as the edge accepts it: one run of 1 to 19 ASCII digits (so it fits
/// a u64; no sign, space, list or other spelling). The H1 wire tracker reads heads by it too.
pub(crate) fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The framing checks; wraps an HTTP/2 or HTTP/3 body with a declared length in [`Framed`].
fn framing(req: &mut Request<Body>, protocol: Protocol) -> Result<(), IdentityError> {
    let h = req.headers();
    let mut declared: Option<u64> = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let n = content_length(v.as_bytes()).ok_or(IdentityError::BadContentLength)?;
        if declared.is_some_and(|d| d != n) {
            return Err(IdentityError::BadContentLength);
        }
        declared = Some(n);
    }
    // hyper removes `Content-Length` from an HTTP/1.1 head that also has
    // `Transfer-Encoding`; the connection's wire tracker marks such a request.
    if req.extensions().get::<ConflictingFraming>().is_some() {
        return Err(IdentityError::BadTransferEncoding);
    }
    let mut te = h.get_all(header::TRANSFER_ENCODING).iter();
    if let Some(first) = te.next() {
        let chunked_only = first.as_bytes().eq_ignore_ascii_case(b"chunked") && te.next().is_none();
        if protocol != Protocol::Http1 || declared.is_some() || !chunked_only {
            return Err(IdentityError::BadTransferEncoding);
        }
    }
    let Some(len) = declared else {
        return Ok(());
    };
    let ended = http_body::Body::is_end_stream(req.body());
    if ended && len > 0 {
        return Err(IdentityError::ShortBody);
    }
    // HTTP/1.1 bodies are read by exactly their Content-Length (hyper); HTTP/2 and HTTP/3
    // bodies are DATA frames that must add up to it.
    if protocol != Protocol::Http1 && !ended {
        let body = std::mem::replace(req.body_mut(), crate::body::empty());
        *req.body_mut() = crate::body::boxed(Framed {
            inner: body,
            remaining: len,
        });
    }
    Ok(())
}

/// Largest request body a locally answered route (static files, a fixed reply) reads before
/// it answers ([`settle_body`]).
pub const SETTLE_LIMIT: u64 = 64 * 1024;

/// Reads and drops the body of a request that a local action answers, up to [`SETTLE_LIMIT`]
/// bytes and `idle` between frames, so that its framing is judged (an HTTP/2 or HTTP/3 length
/// mismatch becomes the stream error it is) before the answer, not after. A longer or slower
/// body is left: the answer goes first and the protocol layer discards the rest.
pub async fn settle_body(body: Body, idle: std::time::Duration) -> Result<(), FramingError> {
    use http_body_util::BodyExt;
    if http_body::Body::is_end_stream(&body) {
        return Ok(());
    }
    let mut body = body;
    let mut seen = 0u64;
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) | Ok(None) => return Ok(()),
            Ok(Some(Err(e))) => {
                return Err(e
                    .downcast_ref::<FramingError>()
                    .copied()
                    .unwrap_or(FramingError::Shorter))
            }
            Ok(Some(Ok(f))) => {
                seen += f.data_ref().map_or(0, |d| d.len() as u64);
                if seen > SETTLE_LIMIT {
                    return Ok(());
                }
            }
        }
    }
}

/// Removes the fields named in `Connection` (see the module docs for the ones kept).
fn drop_connection_named(h: &mut http::HeaderMap) {
    if !h.contains_key(header::CONNECTION) {
        return;
    }
    let named: Vec<http::HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| http::HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| {
            ![
                header::HOST,
                header::CONTENT_LENGTH,
                header::TRANSFER_ENCODING,
                header::UPGRADE,
                header::CONNECTION,
                header::TE,
            ]
            .contains(n)
        })
        .collect();
    for n in named {
        h.remove(n);
    }
}

/// A request body whose DATA did not add up to its `Content-Length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// More DATA than declared.
    #[error("request body longer than its Content-Length")]
    Longer,
    /// The body ended before the declared length.
    #[error("request body shorter than its Content-Length")]
    Shorter,
}

pin_project_lite::pin_project! {
    /// A body that fails unless its DATA adds up to exactly the declared length.
    pub struct Framed {
        #[pin]
        inner: Body,
        remaining: u64,
    }
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    let n = d.len() as u64;
                    if n > *this.remaining {
                        *this.remaining = 0;
                        return Poll::Ready(Some(Err(Box::new(FramingError::Longer))));
                    }
                    *this.remaining -= n;
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(None) if *this.remaining > 0 => {
                *this.remaining = 0;
                Poll::Ready(Some(Err(Box::new(FramingError::Shorter))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0 && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// The request's authority as it came: `:authority`, else `Host` (empty when neither).
pub fn raw_authority<B>(req: &http::Request<B>) -> &str {
    req.uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn req(version: Version, uri: &str, fields: &[(&str, &str)]) -> Request<Body> {
        let mut b = Request::builder().version(version).uri(uri);
        for (k, v) in fields {
            b = b.header(*k, *v);
        }
        b.body(crate::body::empty()).unwrap()
    }

    fn run(p: Protocol, mut r: Request<Body>) -> Result<(String, String), IdentityError> {
        establish(&mut r, p, &PathNormalization::default())?;
        let host = r
            .headers()
            .get(header::HOST)
            .map(|h| h.to_str().unwrap().to_string())
            .unwrap_or_default();
        Ok((host, r.uri().to_string()))
    }

    #[test]
    fn http1_host_rules() {
        let h1 =
            |uri: &str, f: &[(&str, &str)]| run(Protocol::Http1, req(Version::HTTP_11, uri, f));
        assert_eq!(
            h1("/x", &[("host", "A.Test.:8080")]),
            Ok(("a.test:8080".into(), "/x".into()))
        );
        assert_eq!(h1("/x", &[]), Err(IdentityError::MissingHost));
        assert_eq!(
            h1("/x", &[("host", "a.test"), ("host", "b.test")]),
            Err(IdentityError::DuplicateHost)
        );
        assert_eq!(
            h1("http://b.test/x", &[("host", "a.test")]),
            Ok(("b.test".into(), "http://b.test/x".into()))
        );
        assert_eq!(
            h1("/x", &[("host", "u@a.test")]),
            Err(IdentityError::Userinfo)
        );
        assert_eq!(h1("/x", &[("host", "")]), Err(IdentityError::BadAuthority));
        assert_eq!(
            h1("/x", &[("host", "a b")]),
            Err(IdentityError::BadAuthority)
        );
        assert_eq!(
            h1("/x", &[("host", ":80")]),
            Err(IdentityError::BadAuthority)
        );
        // HTTP/1.0 may omit Host.
        assert_eq!(
            run(Protocol::Http1, req(Version::HTTP_10, "/x", &[])),
            Ok((String::new(), "/x".into()))
        );
    }

    #[test]
    fn http2_and_http3_authority_rules() {
        for p in [Protocol::Http2, Protocol::Http3] {
            let r = |uri: &str, f: &[(&str, &str)]| run(p, req(Version::HTTP_2, uri, f));
            assert_eq!(
                r("https://a.test/x", &[]),
                Ok(("a.test".into(), "https://a.test/x".into()))
            );
            assert_eq!(
                r("https://a.test/x", &[("host", "b.test")]),
                Err(IdentityError::AuthorityMismatch)
            );
            assert_eq!(
                r("https://a.test/x", &[("host", "A.TEST")]),
                Ok(("a.test".into(), "https://a.test/x".into()))
            );
            assert_eq!(
                r("/x", &[("host", "b.test")]),
                Ok(("b.test".into(), "/x".into()))
            );
            assert_eq!(
                r("https://A.test./x", &[]),
                Ok(("a.test".into(), "https://a.test/x".into()))
            );
            // The URI's own authority (not parsed again) is held to the same rules.
            assert_eq!(r("https://u@a.test/x", &[]), Err(IdentityError::Userinfo));
            assert_eq!(
                r("https://a..test/x", &[]),
                Err(IdentityError::BadAuthority)
            );
            assert_eq!(
                r("https://a.test:8443/x", &[("host", "a.test:8443")]),
                Ok(("a.test:8443".into(), "https://a.test:8443/x".into()))
            );
        }
    }

    #[test]
    fn paths_are_normalised_in_the_uri() {
        let r = |uri: &str| {
            run(
                Protocol::Http1,
                req(Version::HTTP_11, uri, &[("host", "a.test")]),
            )
        };
        assert_eq!(r("/x/../%61dmin?q=%2e").unwrap().1, "/admin?q=%2e");
        assert_eq!(r("http://a.test//admin").unwrap().1, "http://a.test/admin");
        assert_eq!(
            r("/a%2fb"),
            Err(IdentityError::Path(PathError::EscapedSlash))
        );
        assert_eq!(r("*"), Err(IdentityError::Path(PathError::NotOrigin)));
    }

    #[test]
    fn connection_named_fields_go_before_routing() {
        let mut r = req(
            Version::HTTP_11,
            "/",
            &[
                ("host", "a"),
                ("connection", "x-secret, Content-Length, upgrade, host"),
                ("x-secret", "1"),
                ("upgrade", "websocket"),
                ("x-keep", "1"),
            ],
        );
        establish(&mut r, Protocol::Http1, &PathNormalization::default()).unwrap();
        let h = r.headers();
        assert!(h.get("x-secret").is_none());
        for kept in ["host", "upgrade", "connection", "x-keep"] {
            assert!(h.contains_key(kept), "{kept}");
        }
    }

    #[test]
    fn framing_rules() {
        let h1 = |f: &[(&str, &str)]| {
            run(
                Protocol::Http1,
                req(Version::HTTP_11, "/", &[&[("host", "a")], f].concat()),
            )
        };
        assert!(h1(&[("content-length", "0")]).is_ok());
        assert!(h1(&[("content-length", "5"), ("content-length", "5")])
            .is_err_and(|e| e == IdentityError::ShortBody));
        assert_eq!(
            h1(&[("content-length", "5"), ("content-length", "6")]),
            Err(IdentityError::BadContentLength)
        );
        for bad in ["+5", "-1", "5, 5", " 5", "0x5", "", "99999999999999999999"] {
            assert_eq!(
                h1(&[("content-length", bad)]),
                Err(IdentityError::BadContentLength),
                "{bad:?}"
            );
        }
        assert!(h1(&[("transfer-encoding", "chunked")]).is_ok());
        assert!(h1(&[("transfer-encoding", "Chunked")]).is_ok());
        for bad in ["gzip", "chunked, chunked", "xchunked", "identity"] {
            assert_eq!(
                h1(&[("transfer-encoding", bad)]),
                Err(IdentityError::BadTransferEncoding),
                "{bad}"
            );
        }
        assert_eq!(
            h1(&[("transfer-encoding", "chunked"), ("content-length", "0")]),
            Err(IdentityError::BadTransferEncoding)
        );
        assert_eq!(
            run(
                Protocol::Http2,
                req(
                    Version::HTTP_2,
                    "/",
                    &[("host", "a"), ("transfer-encoding", "chunked")]
                )
            ),
            Err(IdentityError::BadTransferEncoding)
        );
    }

    fn streaming(chunks: Vec<&'static [u8]>) -> Body {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from_static(c))));
        crate::body::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    }

    async fn through(len: &str, chunks: Vec<&'static [u8]>) -> Result<usize, String> {
        let mut r = Request::builder()
            .version(Version::HTTP_2)
            .uri("https://a.test/")
            .header("content-length", len)
            .body(streaming(chunks))
            .unwrap();
        establish(&mut r, Protocol::Http2, &PathNormalization::default())
            .map_err(|e| e.to_string())?;
        let b = r.into_body().collect().await.map_err(|e| e.to_string())?;
        Ok(b.to_bytes().len())
    }

    #[tokio::test]
    async fn http2_bodies_must_add_up_to_their_length() {
        assert_eq!(through("5", vec![b"he", b"llo"]).await, Ok(5));
        assert!(through("5", vec![b"he"])
            .await
            .unwrap_err()
            .contains("shorter"));
        assert!(through("2", vec![b"hello"])
            .await
            .unwrap_err()
            .contains("longer"));
        assert!(through("0", vec![b"x"])
            .await
            .unwrap_err()
            .contains("longer"));
    }

    /// [`normalize_authority`] as it was before the [`already_normal`] shortcut: the reference.
    fn reference_normalize_authority(raw: &str) -> Result<String, IdentityError> {
        if raw.contains('@') {
            return Err(IdentityError::Userinfo);
        }
        let a: http::uri::Authority = raw.parse().map_err(|_| IdentityError::BadAuthority)?;
        let host = a.host();
        let host = host.strip_suffix('.').unwrap_or(host);
        if host.is_empty() || host.starts_with('.') || host.contains("..") {
            return Err(IdentityError::BadAuthority);
        }
        let mut out = host.to_ascii_lowercase();
        if let Some(p) = a.port() {
            out.push(':');
            out.push_str(p.as_str());
        }
        Ok(out)
    }

    /// [`already_normal`] as it was written first (split at the first `:`, then a check per
    /// rule): the one-pass version must say the same of every string.
    fn reference_already_normal(s: &str) -> bool {
        let (host, port) = match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        let h = host.as_bytes();
        let host_ok = h.first().is_some_and(|&c| c != b'.')
            && h.last().is_some_and(|&c| c != b'.')
            && h.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
            && !h.windows(2).any(|w| w == b"..");
        host_ok
            && port.is_none_or(|p| {
                (1..=5).contains(&p.len())
                    && p.bytes().all(|c| c.is_ascii_digit())
                    && p.parse::<u16>().is_ok()
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// The one-pass shortcut answers as the rule-by-rule one, for strings over the bytes
        /// its rules tell apart (dots, colons, digits, upper case, others) and for any string.
        #[test]
        fn the_one_pass_shortcut_is_the_reference_one(
            s in proptest::collection::vec(
                proptest::sample::select(b"a9z0-.:..::65536Z_@[] \xff".to_vec()), 0..20),
            any in ".{0,12}",
        ) {
            let s = String::from_utf8_lossy(&s).into_owned();
            proptest::prop_assert_eq!(already_normal(&s), reference_already_normal(&s), "{:?}", s);
            proptest::prop_assert_eq!(already_normal(&any), reference_already_normal(&any), "{:?}", any);
        }
    }

    #[test]
    fn usual_authorities_take_the_shortcut_and_others_do_not() {
        for s in [
            "a.test",
            "a.test:8443",
            "127.0.0.1:18540",
            "x-1.b:0",
            "a:65535",
            // A zero-padded port stays as sent, as the long way keeps it.
            "a:080",
            "a:00080",
        ] {
            assert!(already_normal(s), "{s}");
            assert_eq!(normalize_authority(s).as_deref(), Ok(s));
        }
        for s in [
            "A.test",
            "a.test.",
            ".a",
            "a..b",
            "a:",
            "a:65536",
            "a:123456",
            "a:1:2",
            "[::1]:80",
            "u@a",
            "",
            ":80",
            "a_b",
            "a.test.:80",
            "[fe80::1%25eth0]:80",
            "%61.test",
            "a:000080",
        ] {
            assert!(!already_normal(s), "{s}");
            assert_eq!(
                normalize_authority(s),
                reference_normalize_authority(s),
                "{s}"
            );
        }
    }

    proptest::proptest! {
        /// The same normal form, or the same refusal, as without the shortcut, for any string
        /// over the characters an authority is made of (and a few it must not have).
        #[test]
        fn the_shortcut_changes_no_authority(
            s in proptest::collection::vec(
                proptest::sample::select(b"aZ09.-:[]@_% ".to_vec()), 0..24)
        ) {
            let s = String::from_utf8(s).unwrap();
            proptest::prop_assert_eq!(normalize_authority(&s), reference_normalize_authority(&s));
            if let Ok(a) = s.parse::<http::uri::Authority>() {
                if !s.contains('@') {
                    proptest::prop_assert_eq!(normal_form(&a), reference_normalize_authority(&s));
                }
            }
            // Through `establish`, as a client's `Host`: the field the request goes on with
            // (kept as it is when already normal, else replaced) is the reference's normal
            // form, and what the reference refuses is refused.
            let got = run(Protocol::Http1, req(Version::HTTP_11, "/x", &[("host", &s)]));
            proptest::prop_assert_eq!(got.map(|(host, _)| host), reference_normalize_authority(&s));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// The same, for authorities put together from the pieces a hostile one is made of
        /// (random strings seldom are one): userinfo, upper case, `_`, `%` escapes, empty
        /// labels, leading, trailing and doubled dots, IPv6 with a zone, and ports that are
        /// empty, 0, zero-padded, over 65535, overlong or not digits. Each of the shortcut's
        /// checks (lower case, dots, port length and range) fails this test when left out.
        #[test]
        fn the_shortcut_changes_no_hostile_authority(
            user in proptest::sample::select(vec!["", "", "", "u@", "@", "u:p@"]),
            lead in proptest::sample::select(vec!["", "", "", "."]),
            labels in proptest::collection::vec(
                proptest::sample::select(vec![
                    "a", "test", "x-1", "0", "127", "A", "Ab", "_", "a_b", "%61", "", "", "-",
                ]),
                0..5,
            ),
            trail in proptest::sample::select(vec!["", "", "", ".", ".."]),
            ipv6 in proptest::option::weighted(
                0.1,
                proptest::sample::select(vec!["[::1]", "[fe80::1%25eth0]", "[::FFFF:1.2.3.4]"]),
            ),
            port in proptest::option::of(proptest::sample::select(vec![
                "", "0", "00", "080", "00080", "000080", "80", "65535", "65536", "99999",
                "123456", "8a", "1:2", " 80",
            ])),
        ) {
            let host = match ipv6 {
                Some(v6) => v6.to_owned(),
                None => format!("{lead}{}{trail}", labels.join(".")),
            };
            let s = match port {
                Some(p) => format!("{user}{host}:{p}"),
                None => format!("{user}{host}"),
            };
            proptest::prop_assert_eq!(normalize_authority(&s), reference_normalize_authority(&s));
            if let Ok(a) = s.parse::<http::uri::Authority>() {
                if !s.contains('@') {
                    proptest::prop_assert_eq!(normal_form(&a), reference_normalize_authority(&s));
                }
            }
            // Through `establish`, as a client's `Host` (as above).
            let got = run(Protocol::Http1, req(Version::HTTP_11, "/x", &[("host", &s)]));
            proptest::prop_assert_eq!(got.map(|(host, _)| host), reference_normalize_authority(&s));
        }
    }
}
