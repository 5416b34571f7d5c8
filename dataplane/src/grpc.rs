//! gRPC at the edge.
//!
//! * Errors Sweety generates itself (overload, no route, upstream failure, timeouts…) for a
//!   gRPC request (`content-type: application/grpc*`) are answered the gRPC way: HTTP 200,
//!   "trailers-only" (`grpc-status` and `grpc-message` in the response head, empty body),
//!   never an HTML or text body. [`status_for`] maps the HTTP status of the would-be reply
//!   to a gRPC code (504 → DEADLINE_EXCEEDED, 404 → UNIMPLEMENTED, 502/503 → UNAVAILABLE…).
//! * Trailers of upstream responses flow through untouched (bodies are streamed frame by
//!   frame on every front end, and `TE: trailers` is kept towards the backend).
//! * gRPC-Web (`grpc` filter with `web: true`): `application/grpc-web[+proto]` and
//!   `application/grpc-web-text` requests are turned into gRPC for the backend (the text form
//!   is base64-decoded on the fly) and the response is turned back: the trailers become a
//!   final length-prefixed frame with flag `0x80` in the body, base64-encoded for the text
//!   form.

use crate::body::{Body, BoxError};
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// gRPC status codes used here.
pub mod code {
    /// Not an error.
    pub const OK: u8 = 0;
    /// Unknown error.
    pub const UNKNOWN: u8 = 2;
    /// The deadline expired.
    pub const DEADLINE_EXCEEDED: u8 = 4;
    /// Not allowed.
    pub const PERMISSION_DENIED: u8 = 7;
    /// Out of some resource (message too large).
    pub const RESOURCE_EXHAUSTED: u8 = 8;
    /// The method is not implemented (no route).
    pub const UNIMPLEMENTED: u8 = 12;
    /// Internal error.
    pub const INTERNAL: u8 = 13;
    /// The service is unavailable; a retry may work.
    pub const UNAVAILABLE: u8 = 14;
    /// No valid credentials.
    pub const UNAUTHENTICATED: u8 = 16;
}

/// Marks a response Sweety generated itself (not relayed from a backend), with its text.
#[derive(Debug, Clone, Copy)]
pub struct Generated(pub &'static str);

/// The kind of gRPC request, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcKind {
    /// `application/grpc[+…]`.
    Grpc,
    /// `application/grpc-web[+…]`.
    Web,
    /// `application/grpc-web-text[+…]`.
    WebText,
}

/// The gRPC kind of a request with these headers, if it is one.
pub fn kind(headers: &HeaderMap) -> Option<GrpcKind> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let ct = ct.split(';').next()?.trim();
    let rest = ct
        .get(..16)
        .filter(|p| p.eq_ignore_ascii_case("application/grpc"))
        .map(|_| &ct[16..])?;
    let starts = |p: &str| {
        rest.get(..p.len())
            .is_some_and(|x| x.eq_ignore_ascii_case(p))
            && matches!(rest.as_bytes().get(p.len()), None | Some(b'+'))
    };
    if starts("-web-text") {
        Some(GrpcKind::WebText)
    } else if starts("-web") {
        Some(GrpcKind::Web)
    } else if starts("") {
        Some(GrpcKind::Grpc)
    } else {
        None
    }
}

/// The gRPC code for a reply Sweety would have sent with this HTTP status.
pub fn status_for(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => code::INTERNAL,
        401 => code::UNAUTHENTICATED,
        403 => code::PERMISSION_DENIED,
        404 | 405 => code::UNIMPLEMENTED,
        408 | 504 => code::DEADLINE_EXCEEDED,
        413 | 431 => code::RESOURCE_EXHAUSTED,
        421 | 425 | 429 | 502 | 503 => code::UNAVAILABLE,
        500 => code::INTERNAL,
        _ => code::UNKNOWN,
    }
}

/// Percent-encodes a `grpc-message` (bytes outside printable ASCII, and `%`).
pub fn encode_message(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for b in msg.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A trailers-only gRPC error reply: HTTP 200, `grpc-status` and `grpc-message` in the head.
pub fn error_response(grpc_code: u8, message: &str, kind: GrpcKind) -> Response<Body> {
    let mut r = Response::new(crate::body::empty());
    let ct = match kind {
        GrpcKind::Grpc => "application/grpc",
        GrpcKind::Web => "application/grpc-web+proto",
        GrpcKind::WebText => "application/grpc-web-text+proto",
    };
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert(&GRPC_STATUS, HeaderValue::from(u16::from(grpc_code)));
    if let Ok(v) = HeaderValue::from_str(&encode_message(message.trim())) {
        h.insert(&GRPC_MESSAGE, v);
    }
    r
}

/// Turns a response Sweety generated into the gRPC form for a gRPC request; leaves relayed
/// responses (and successes) alone.
pub fn rewrite_generated(resp: Response<Body>, kind: GrpcKind) -> Response<Body> {
    let Some(Generated(text)) = resp.extensions().get::<Generated>().copied() else {
        return resp;
    };
    let status = resp.status();
    if status.is_success() {
        return resp;
    }
    let mut out = error_response(status_for(status), text, kind);
    // Keep Retry-After and CORS headers set on the original reply.
    for (name, value) in resp.headers() {
        if name == header::RETRY_AFTER || name.as_str().starts_with("access-control-") {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    out
}

// ---------------------------------------------------------------- gRPC-Web

/// Rewrites a gRPC-Web request head for a gRPC backend. The body must be wrapped with
/// [`web_request_body`].
pub fn web_request_head(headers: &mut HeaderMap, kind: GrpcKind) {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/grpc-web");
    let suffix = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .split_once('+')
        .map(|(_, s)| s.to_string());
    let new_ct = match suffix {
        Some(s) => format!("application/grpc+{s}"),
        None => "application/grpc".to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&new_ct) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::ACCEPT_ENCODING);
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    if kind == GrpcKind::WebText {
        headers.remove("x-accept-content-transfer-encoding");
    }
}

/// The request body for the backend: base64-decoded for `grpc-web-text`, as is otherwise.
pub fn web_request_body(body: Body, kind: GrpcKind) -> Body {
    match kind {
        GrpcKind::WebText => crate::body::boxed(Base64Decode {
            inner: body,
            carry: Vec::with_capacity(4),
        }),
        _ => body,
    }
}

/// Rewrites a backend's gRPC response into gRPC-Web of `kind`.
pub fn web_response(resp: Response<Body>, kind: GrpcKind) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let is_grpc = ct.starts_with("application/grpc");
    if !is_grpc {
        return Response::from_parts(parts, body);
    }
    let suffix = ct
        .split(';')
        .next()
        .unwrap_or("")
        .split_once('+')
        .map(|(_, s)| s.trim().to_string())
        .unwrap_or_else(|| "proto".to_string());
    let base = if kind == GrpcKind::WebText {
        "application/grpc-web-text"
    } else {
        "application/grpc-web"
    };
    if let Ok(v) = HeaderValue::from_str(&format!("{base}+{suffix}")) {
        parts.headers.insert(header::CONTENT_TYPE, v);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::TRAILER);
    let body = crate::body::boxed(WebResponseBody {
        inner: body,
        text: kind == GrpcKind::WebText,
        carry: Vec::with_capacity(3),
        done: false,
    });
    Response::from_parts(parts, body)
}

/// Encodes trailers as a gRPC-Web trailer frame (`0x80`, length, `name: value\r\n` lines).
pub fn trailer_frame(trailers: &HeaderMap) -> Bytes {
    let mut block = Vec::new();
    for (name, value) in trailers {
        block.extend_from_slice(name.as_str().as_bytes());
        block.extend_from_slice(b": ");
        block.extend_from_slice(value.as_bytes());
        block.extend_from_slice(b"\r\n");
    }
    let mut out = BytesMut::with_capacity(5 + block.len());
    out.put_u8(0x80);
    out.put_u32(block.len() as u32);
    out.extend_from_slice(&block);
    out.freeze()
}

pin_project_lite::pin_project! {
    /// A gRPC response body re-framed as gRPC-Web: data as is (or base64), trailers as a
    /// final frame.
    struct WebResponseBody {
        #[pin]
        inner: Body,
        text: bool,
        // Bytes not yet base64-encoded (fewer than 3).
        carry: Vec<u8>,
        done: bool,
    }
}

fn b64_chunk(carry: &mut Vec<u8>, data: &[u8], last: bool) -> Bytes {
    let mut buf = std::mem::take(carry);
    buf.extend_from_slice(data);
    let keep = if last { 0 } else { buf.len() % 3 };
    let split = buf.len() - keep;
    let out = base64::engine::general_purpose::STANDARD.encode(&buf[..split]);
    carry.extend_from_slice(&buf[split..]);
    Bytes::from(out)
}

impl http_body::Body for WebResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => {
                        if !*this.text {
                            return Poll::Ready(Some(Ok(Frame::data(d))));
                        }
                        let out = b64_chunk(this.carry, &d, false);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => {
                        *this.done = true;
                        let t = frame.into_trailers().unwrap_or_default();
                        let tf = trailer_frame(&t);
                        let out = if *this.text {
                            b64_chunk(this.carry, &tf, true)
                        } else {
                            tf
                        };
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    *this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    // No trailers from the backend (e.g. a trailers-only reply): just flush.
                    *this.done = true;
                    if *this.text && !this.carry.is_empty() {
                        let out = b64_chunk(this.carry, &[], true);
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Why a gRPC-Web text body could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("invalid base64 in grpc-web-text request body")]
pub struct Base64Error(#[source] base64::DecodeError);

pin_project_lite::pin_project! {
    /// Streams base64 decoding of a `grpc-web-text` request body (padding may appear
    /// between chunks: each 4-character group is decoded on its own).
    struct Base64Decode {
        #[pin]
        inner: Body,
        carry: Vec<u8>,
    }
}

fn decode_groups(carry: &mut Vec<u8>, data: &[u8], last: bool) -> Result<Bytes, Base64Error> {
    let mut buf = std::mem::take(carry);
    buf.extend(data.iter().copied().filter(|b| !b.is_ascii_whitespace()));
    let keep = if last { 0 } else { buf.len() % 4 };
    let split = buf.len() - keep;
    let mut out = Vec::with_capacity(split / 4 * 3);
    for group in buf[..split].chunks(4) {
        let d = base64::engine::general_purpose::STANDARD
            .decode(group)
            .map_err(Base64Error)?;
        out.extend_from_slice(&d);
    }
    carry.extend_from_slice(&buf[split..]);
    Ok(Bytes::from(out))
}

impl http_body::Body for Base64Decode {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => {
                        let out = decode_groups(this.carry, &d, false)?;
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(f) => return Poll::Ready(Some(Ok(f))),
                },
                Poll::Ready(None) => {
                    if this.carry.is_empty() {
                        return Poll::Ready(None);
                    }
                    let out = decode_groups(this.carry, &[], true)?;
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn ct(s: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_str(s).unwrap());
        h
    }

    #[test]
    fn kinds_from_content_type() {
        assert_eq!(kind(&ct("application/grpc")), Some(GrpcKind::Grpc));
        assert_eq!(kind(&ct("application/grpc+proto")), Some(GrpcKind::Grpc));
        assert_eq!(
            kind(&ct("Application/GRPC+json; x=y")),
            Some(GrpcKind::Grpc)
        );
        assert_eq!(kind(&ct("application/grpc-web")), Some(GrpcKind::Web));
        assert_eq!(kind(&ct("application/grpc-web+proto")), Some(GrpcKind::Web));
        assert_eq!(
            kind(&ct("application/grpc-web-text+proto")),
            Some(GrpcKind::WebText)
        );
        assert_eq!(kind(&ct("application/grpcx")), None);
        assert_eq!(kind(&ct("application/json")), None);
        assert_eq!(kind(&HeaderMap::new()), None);
    }

    #[test]
    fn generated_errors_become_trailers_only() {
        let table = [
            (503, code::UNAVAILABLE),
            (404, code::UNIMPLEMENTED),
            (502, code::UNAVAILABLE),
            (504, code::DEADLINE_EXCEEDED),
            (413, code::RESOURCE_EXHAUSTED),
            (500, code::INTERNAL),
            (418, code::UNKNOWN),
        ];
        for (http, grpc) in table {
            let mut r = crate::body::text_response(StatusCode::from_u16(http).unwrap(), "x\n");
            r.extensions_mut().insert(Generated("boom 100%\n"));
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            let out = rewrite_generated(r, GrpcKind::Grpc);
            assert_eq!(out.status(), 200);
            assert_eq!(out.headers()["grpc-status"], grpc.to_string().as_str());
            assert_eq!(out.headers()["grpc-message"], "boom 100%25");
            assert_eq!(out.headers()["content-type"], "application/grpc");
            assert_eq!(out.headers()["retry-after"], "1");
            assert!(http_body::Body::is_end_stream(out.body()));
        }
        // A relayed (not generated) error stays as it is.
        let r = Response::builder()
            .status(503)
            .body(crate::body::empty())
            .unwrap();
        assert_eq!(rewrite_generated(r, GrpcKind::Grpc).status(), 503);
    }

    #[test]
    fn message_encoding() {
        assert_eq!(encode_message("a b"), "a b");
        assert_eq!(encode_message("100%\n"), "100%25%0A");
        assert_eq!(encode_message("é"), "%C3%A9");
    }

    fn stream(frames: Vec<Frame<Bytes>>) -> Body {
        crate::body::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames.into_iter().map(Ok::<_, BoxError>),
        )))
    }

    #[tokio::test]
    async fn web_response_moves_trailers_into_the_body() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let msg = Bytes::from_static(b"\x00\x00\x00\x00\x02hi");
        let resp = Response::builder()
            .header("content-type", "application/grpc+proto")
            .body(stream(vec![
                Frame::data(msg.clone()),
                Frame::trailers(t.clone()),
            ]))
            .unwrap();
        let out = web_response(resp, GrpcKind::Web);
        assert_eq!(out.headers()["content-type"], "application/grpc-web+proto");
        let body = out.into_body().collect().await.unwrap();
        assert!(body.trailers().is_none());
        let mut want = msg.to_vec();
        want.extend_from_slice(b"\x80\x00\x00\x00\x10grpc-status: 0\r\n");
        assert_eq!(body.to_bytes(), want);

        let resp = Response::builder()
            .header("content-type", "application/grpc")
            .body(stream(vec![
                Frame::data(Bytes::from_static(b"\x00\x00\x00")),
                Frame::data(Bytes::from_static(b"\x00\x02hi")),
                Frame::trailers(t),
            ]))
            .unwrap();
        let out = web_response(resp, GrpcKind::WebText);
        assert_eq!(
            out.headers()["content-type"],
            "application/grpc-web-text+proto"
        );
        let text = out.into_body().collect().await.unwrap().to_bytes();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&text)
            .unwrap();
        assert_eq!(decoded, want);
    }

    #[tokio::test]
    async fn web_text_request_body_is_decoded_across_chunks() {
        let raw = b"\x00\x00\x00\x00\x05hello";
        let enc = base64::engine::general_purpose::STANDARD.encode(raw);
        let (a, b) = enc.split_at(5);
        // Padding between separately encoded chunks is allowed too.
        let extra = base64::engine::general_purpose::STANDARD.encode(b"!");
        let body = web_request_body(
            stream(vec![
                Frame::data(Bytes::from(a.to_string())),
                Frame::data(Bytes::from(b.to_string())),
                Frame::data(Bytes::from(extra)),
            ]),
            GrpcKind::WebText,
        );
        let got = body.collect().await.unwrap().to_bytes();
        let mut want = raw.to_vec();
        want.push(b'!');
        assert_eq!(got, want);
        let bad = web_request_body(
            stream(vec![Frame::data(Bytes::from_static(b"@@@@"))]),
            GrpcKind::WebText,
        );
        assert!(bad.collect().await.is_err());
    }

    #[test]
    fn web_request_head_rewrites_content_type() {
        let mut h = ct("application/grpc-web+proto");
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        web_request_head(&mut h, GrpcKind::Web);
        assert_eq!(h["content-type"], "application/grpc+proto");
        assert_eq!(h["te"], "trailers");
        assert!(h.get("content-length").is_none());
        let mut h = ct("application/grpc-web-text");
        web_request_head(&mut h, GrpcKind::WebText);
        assert_eq!(h["content-type"], "application/grpc");
    }
}
