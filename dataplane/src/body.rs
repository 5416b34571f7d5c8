//! The one body type used by every handler and protocol adapter, plus constructors.
//!
//! Requests and responses are streamed as [`Body`], a boxed `http_body::Body` of [`Bytes`].
//! Protocol adapters (hyper for H1/H2, h3 for HTTP/3) convert their native bodies into it at
//! the edge, so handlers are written once.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// The streaming body type used throughout the dataplane (the HTTP/2 engine's), its boxed
/// error, an empty body and the boxing of any compatible body.
pub use sweety_h2::{boxed, empty, Body, BoxError};

/// A body holding `data` in full.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A short plain-text reply with the given status, e.g. for 404, 502 and 503.
pub fn text_response(status: http::StatusCode, text: &'static str) -> http::Response<Body> {
    let mut resp = http::Response::new(full(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    // Marks the reply as Sweety's own, so gRPC requests get it as grpc-status instead.
    resp.extensions_mut().insert(crate::grpc::Generated(text));
    resp
}
