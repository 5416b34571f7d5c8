//! Response compression (`compress` route filter): gzip, brotli and zstd, chosen from the
//! client's `Accept-Encoding` (q-values, `*`, `q=0` exclusions; ties go to the route's
//! preference order), applied to proxied, static and fixed responses alike.
//!
//! A response is compressed only when it is a 200 (not 206, so Range replies pass through),
//! has no `Content-Encoding` yet (precompressed static files, already-compressed upstream
//! bodies), no `Cache-Control: no-transform`, a media type on the allowlist and no known
//! `Content-Length` below the minimum. `Vary: Accept-Encoding` is added to every response of
//! a compressible type, compressed or not, so shared caches keep the variants apart.
//!
//! The body is streamed: each frame from the inner body is fed to the encoder and whatever
//! output is ready is sent on; when the inner body has nothing ready, the encoder is flushed
//! so a slow stream (server-sent events) is never held back. Buffers are bounded by the input
//! frame size plus the encoder's fixed window (brotli's is set to 256 KiB).

use crate::body::{Body, BoxError};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body::{Frame, SizeHint};
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use sweety_config::{Compression, CompressionAlgorithm};

/// gzip level (1–9): 5 is nginx's sweet spot between ratio and CPU.
pub const GZIP_LEVEL: u32 = 5;
/// brotli quality (0–11) for on-the-fly compression.
pub const BROTLI_QUALITY: u32 = 4;
/// brotli window bits (256 KiB window bounds the encoder's memory).
pub const BROTLI_LGWIN: u32 = 18;
/// zstd level.
pub const ZSTD_LEVEL: i32 = 3;

/// A compiled `compress` filter.
#[derive(Debug, Clone)]
pub struct CompressPolicy {
    algorithms: Vec<CompressionAlgorithm>,
    min_size: u64,
    /// Exact types, lower-case.
    exact: Vec<String>,
    /// `type/*` prefixes, lower-case, with the slash (`text/`).
    prefixes: Vec<String>,
}

impl CompressPolicy {
    /// Compiles the filter; `None` when it turns compression off.
    pub fn compile(c: &Compression) -> Option<CompressPolicy> {
        if !c.enabled || c.algorithms.is_empty() {
            return None;
        }
        let mut exact = Vec::new();
        let mut prefixes = Vec::new();
        for m in &c.mime_types {
            let m = m.to_ascii_lowercase();
            match m.strip_suffix('*') {
                Some(p) => prefixes.push(p.to_string()),
                None => exact.push(m),
            }
        }
        Some(CompressPolicy {
            algorithms: c.algorithms.clone(),
            min_size: c.min_size,
            exact,
            prefixes,
        })
    }

    /// True when `content_type` (parameters allowed) is on the allowlist.
    pub fn type_allowed(&self, content_type: &str) -> bool {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        self.exact.contains(&essence)
            || self
                .prefixes
                .iter()
                .any(|p| essence.starts_with(p.as_str()))
    }
}

/// The codings of one `Accept-Encoding` value with their q-values in thousandths, in order
/// (the one parser of the header: compression here and precompressed static files use it).
///
/// A coding without `q` weighs 1000; an element with a malformed q-value is skipped, as if
/// absent; empty elements are skipped. Codings are returned as written (compare them without
/// regard to case).
pub(crate) fn accept_codings(value: &str) -> impl Iterator<Item = (&str, u16)> {
    value.split(',').filter_map(|element| {
        let mut parts = element.split(';');
        let coding = parts.next().unwrap_or("").trim();
        if coding.is_empty() {
            return None;
        }
        let mut q = Some(1000);
        for param in parts {
            if let Some((name, val)) = param.split_once('=') {
                if name.trim().eq_ignore_ascii_case("q") {
                    q = parse_q(val.trim());
                }
            }
        }
        Some((coding, q?))
    })
}

/// Parses an RFC 9110 qvalue (`0`, `0.5`, `1.000`) into thousandths; `None` when malformed.
pub(crate) fn parse_q(s: &str) -> Option<u16> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = 0;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// The coding to use for a request's `Accept-Encoding` values, among `offered` (in server
/// preference order). `None`: send the response as is.
pub fn negotiate<'a>(
    accept: impl Iterator<Item = &'a HeaderValue>,
    offered: &[CompressionAlgorithm],
) -> Option<CompressionAlgorithm> {
    // q-value per offered algorithm (in thousandths); None = not mentioned.
    let mut q: Vec<Option<u16>> = vec![None; offered.len()];
    let mut star: Option<u16> = None;
    for v in accept {
        let Ok(s) = v.to_str() else { continue };
        for (coding, qv) in accept_codings(s) {
            if coding == "*" {
                star = Some(qv);
                continue;
            }
            if let Some(i) = offered
                .iter()
                .position(|a| a.token().eq_ignore_ascii_case(coding))
            {
                q[i] = Some(q[i].map_or(qv, |old| old.max(qv)));
            }
        }
    }
    let mut best: Option<(usize, u16)> = None;
    for (i, qi) in q.iter().enumerate() {
        let v = qi.or(star).unwrap_or(0);
        if v > 0 && best.is_none_or(|(_, bq)| v > bq) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| offered[i])
}

/// Whether the response may be compressed at all (independently of the client).
fn eligible(
    policy: &CompressPolicy,
    method: &Method,
    headers: &HeaderMap,
    status: StatusCode,
) -> bool {
    if status != StatusCode::OK || *method == Method::HEAD {
        return false;
    }
    // (Content-Encoding is handled by the caller, before this, so coded variants keep Vary.)
    if headers.contains_key(header::CONTENT_RANGE) {
        return false;
    }
    let no_transform = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("no-transform"));
    if no_transform {
        return false;
    }
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        if len < policy.min_size {
            return false;
        }
    }
    true
}

/// Adds `Accept-Encoding` to `Vary` unless it (or `*`) is already there.
pub fn add_vary(headers: &mut HeaderMap) {
    let present = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.trim();
            t == "*" || t.eq_ignore_ascii_case("accept-encoding")
        });
    if !present {
        headers.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// Applies the policy to a response for a request with `method` and `Accept-Encoding`
/// values `accept`.
pub fn apply(
    policy: &CompressPolicy,
    method: &Method,
    accept: &[HeaderValue],
    resp: Response<Body>,
) -> Response<Body> {
    let typed = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| policy.type_allowed(ct));
    if !typed {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    if parts.headers.contains_key(header::CONTENT_ENCODING) {
        // Already a coded variant (e.g. a precompressed file): still keyed on Accept-Encoding.
        add_vary(&mut parts.headers);
        return Response::from_parts(parts, body);
    }
    if !eligible(policy, method, &parts.headers, parts.status) {
        if parts.status == StatusCode::OK || parts.status == StatusCode::PARTIAL_CONTENT {
            add_vary(&mut parts.headers);
        }
        return Response::from_parts(parts, body);
    }
    add_vary(&mut parts.headers);
    let Some(alg) = negotiate(accept.iter(), &policy.algorithms) else {
        return Response::from_parts(parts, body);
    };
    let h = &mut parts.headers;
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::ACCEPT_RANGES);
    h.insert(
        header::CONTENT_ENCODING,
        HeaderValue::from_static(alg.token()),
    );
    // A strong validator names exact bytes; the coded body is a different representation.
    if let Some(etag) = h.get(header::ETAG).and_then(|v| v.to_str().ok()) {
        if !etag.starts_with("W/") {
            if let Ok(w) = HeaderValue::from_str(&format!("W/{etag}")) {
                h.insert(header::ETAG, w);
            }
        }
    }
    Response::from_parts(parts, crate::body::boxed(CompressBody::new(body, alg)))
}

/// Where an encoder writes: a buffer the body drains after every write.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Sink {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Encoder {
    Gzip(flate2::write::GzEncoder<Sink>),
    Brotli(Box<brotli::CompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Encoder<'static, Sink>),
}

impl Encoder {
    fn new(alg: CompressionAlgorithm, sink: Sink) -> std::io::Result<Encoder> {
        Ok(match alg {
            CompressionAlgorithm::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                sink,
                flate2::Compression::new(GZIP_LEVEL),
            )),
            CompressionAlgorithm::Brotli => Encoder::Brotli(Box::new(
                brotli::CompressorWriter::new(sink, 16 * 1024, BROTLI_QUALITY, BROTLI_LGWIN),
            )),
            CompressionAlgorithm::Zstd => {
                Encoder::Zstd(zstd::stream::write::Encoder::new(sink, ZSTD_LEVEL)?)
            }
        })
    }

    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(data),
            Encoder::Brotli(e) => e.write_all(data),
            Encoder::Zstd(e) => e.write_all(data),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Brotli(e) => e.flush(),
            Encoder::Zstd(e) => e.flush(),
        }
    }

    fn finish(self) -> std::io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.finish().map(drop),
            // Writes the final block into the sink.
            Encoder::Brotli(e) => {
                e.into_inner();
                Ok(())
            }
            Encoder::Zstd(e) => e.finish().map(drop),
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body compressed on the fly.
    pub struct CompressBody {
        #[pin]
        inner: Body,
        encoder: Option<Encoder>,
        sink: Sink,
        // Input written since the last flush.
        dirty: bool,
        trailers: Option<HeaderMap>,
        init_error: Option<std::io::Error>,
        done: bool,
    }
}

impl CompressBody {
    /// Wraps `inner`, compressing with `alg`.
    pub fn new(inner: Body, alg: CompressionAlgorithm) -> CompressBody {
        let sink = Sink::default();
        let (encoder, init_error) = match Encoder::new(alg, sink.clone()) {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e)),
        };
        CompressBody {
            inner,
            encoder,
            sink,
            dirty: false,
            trailers: None,
            init_error,
            done: false,
        }
    }
}

fn data(v: Vec<u8>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    Poll::Ready(Some(Ok(Frame::data(Bytes::from(v)))))
}

impl http_body::Body for CompressBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Some(e) = this.init_error.take() {
            *this.done = true;
            return Poll::Ready(Some(Err(e.into())));
        }
        loop {
            if *this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => {
                        if d.is_empty() {
                            continue;
                        }
                        let Some(enc) = this.encoder.as_mut() else {
                            continue;
                        };
                        enc.write_all(&d)?;
                        *this.dirty = true;
                        let out = this.sink.take();
                        if !out.is_empty() {
                            return data(out);
                        }
                    }
                    Err(frame) => {
                        // Trailers end the body: finish the stream first.
                        if let Ok(t) = frame.into_trailers() {
                            *this.trailers = Some(t);
                        }
                        if let Some(enc) = this.encoder.take() {
                            enc.finish()?;
                        }
                        *this.done = true;
                        let out = this.sink.take();
                        if !out.is_empty() {
                            return data(out);
                        }
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    *this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if let Some(enc) = this.encoder.take() {
                        enc.finish()?;
                    }
                    *this.done = true;
                    let out = this.sink.take();
                    if !out.is_empty() {
                        return data(out);
                    }
                }
                Poll::Pending => {
                    if *this.dirty {
                        *this.dirty = false;
                        if let Some(enc) = this.encoder.as_mut() {
                            enc.flush()?;
                        }
                        let out = this.sink.take();
                        if !out.is_empty() {
                            return data(out);
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::io::Read;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    const ALL: [CompressionAlgorithm; 3] = [
        CompressionAlgorithm::Zstd,
        CompressionAlgorithm::Brotli,
        CompressionAlgorithm::Gzip,
    ];

    #[test]
    fn negotiation_follows_q_values_then_preference() {
        use CompressionAlgorithm::*;
        let n = |s: &str| negotiate([hv(s)].iter(), &ALL);
        assert_eq!(n("gzip"), Some(Gzip));
        assert_eq!(n("gzip, br"), Some(Brotli));
        assert_eq!(n("gzip, deflate, br, zstd"), Some(Zstd));
        assert_eq!(n("gzip;q=1.0, br;q=0.5"), Some(Gzip));
        assert_eq!(n("br;q=0.8, zstd;q=0.3, gzip;q=0.9"), Some(Gzip));
        assert_eq!(n("*"), Some(Zstd));
        assert_eq!(n("*;q=0.5, zstd;q=0"), Some(Brotli));
        assert_eq!(n("gzip;q=0"), None);
        assert_eq!(n("identity"), None);
        assert_eq!(n("deflate"), None);
        assert_eq!(n(""), None);
        // A malformed q-value drops the element (then `*` may cover the coding).
        assert_eq!(n("gzip;q=bogus"), None);
        assert_eq!(n("gzip;q=bogus, *;q=0.1"), Some(Zstd));
        assert_eq!(n("gzip; Q = 0.5"), Some(Gzip));
        assert_eq!(n("GZIP"), Some(Gzip));
        assert_eq!(
            negotiate([hv("br"), hv("gzip")].iter(), &[Gzip]),
            Some(Gzip)
        );
        assert_eq!(negotiate(std::iter::empty(), &ALL), None);
    }

    #[test]
    fn qvalues_parse() {
        assert_eq!(parse_q("0"), Some(0));
        assert_eq!(parse_q("0.25"), Some(250));
        assert_eq!(parse_q("0.125"), Some(125));
        assert_eq!(parse_q("1"), Some(1000));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("1.001"), None);
        assert_eq!(parse_q("1.5"), None);
        assert_eq!(parse_q("0.1234"), None);
        assert_eq!(parse_q("2"), None);
        assert_eq!(parse_q(""), None);
    }

    #[test]
    fn accept_codings_in_order_with_weights() {
        let v: Vec<_> = accept_codings("gzip, br;q=0.5 , ,zstd;q=x, *;q=0").collect();
        assert_eq!(v, vec![("gzip", 1000), ("br", 500), ("*", 0)]);
    }

    fn policy() -> CompressPolicy {
        CompressPolicy::compile(&Compression::default()).unwrap()
    }

    fn resp(status: u16, headers: &[(&str, &str)], body: &'static [u8]) -> Response<Body> {
        let mut r = Response::new(crate::body::full(body));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            r.headers_mut()
                .append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), hv(v));
        }
        r
    }

    #[test]
    fn mime_allowlist() {
        let p = policy();
        assert!(p.type_allowed("text/html; charset=utf-8"));
        assert!(p.type_allowed("Application/JSON"));
        assert!(p.type_allowed("image/svg+xml"));
        assert!(!p.type_allowed("image/png"));
        assert!(!p.type_allowed("application/octet-stream"));
        assert!(CompressPolicy::compile(&Compression {
            enabled: false,
            ..Compression::default()
        })
        .is_none());
    }

    #[test]
    fn skip_rules() {
        let p = policy();
        let big: &'static [u8] = &[b'a'; 1000];
        let gz = [hv("gzip")];
        let get = Method::GET;
        let cases: Vec<(Response<Body>, &Method, bool, bool)> = vec![
            // response, method, compressed?, vary?
            (
                resp(200, &[("content-type", "text/plain")], big),
                &get,
                true,
                true,
            ),
            (
                resp(200, &[("content-type", "image/png")], big),
                &get,
                false,
                false,
            ),
            (
                resp(
                    200,
                    &[("content-type", "text/plain"), ("content-encoding", "br")],
                    big,
                ),
                &get,
                false,
                true,
            ),
            (
                resp(
                    206,
                    &[
                        ("content-type", "text/plain"),
                        ("content-range", "bytes 0-9/1000"),
                    ],
                    big,
                ),
                &get,
                false,
                true,
            ),
            (
                resp(
                    200,
                    &[("content-type", "text/plain"), ("content-length", "10")],
                    b"0123456789",
                ),
                &get,
                false,
                true,
            ),
            (
                resp(
                    200,
                    &[
                        ("content-type", "text/plain"),
                        ("cache-control", "public, no-transform"),
                    ],
                    big,
                ),
                &get,
                false,
                true,
            ),
            (
                resp(404, &[("content-type", "text/plain")], big),
                &get,
                false,
                false,
            ),
            (
                resp(200, &[("content-type", "text/plain")], big),
                &Method::HEAD,
                false,
                true,
            ),
        ];
        for (i, (r, m, compressed, vary)) in cases.into_iter().enumerate() {
            let out = apply(&p, m, &gz, r);
            assert_eq!(
                out.headers()
                    .get("content-encoding")
                    .is_some_and(|v| v == "gzip"),
                compressed,
                "case {i}"
            );
            assert_eq!(out.headers().get("vary").is_some(), vary, "case {i}");
        }
        // No acceptable coding: untouched but Vary set.
        let out = apply(
            &p,
            &get,
            &[hv("identity")],
            resp(200, &[("content-type", "text/css")], big),
        );
        assert!(out.headers().get("content-encoding").is_none());
        assert_eq!(out.headers()["vary"], "Accept-Encoding");
    }

    async fn roundtrip(alg: CompressionAlgorithm, chunks: Vec<&'static [u8]>) -> Vec<u8> {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect();
        let inner = crate::body::boxed(http_body_util::StreamBody::new(
            futures_util::stream::iter(frames),
        ));
        let body = CompressBody::new(inner, alg);
        let bytes = body.collect().await.unwrap().to_bytes();
        let mut out = Vec::new();
        match alg {
            CompressionAlgorithm::Gzip => {
                flate2::read::GzDecoder::new(&bytes[..])
                    .read_to_end(&mut out)
                    .unwrap();
            }
            CompressionAlgorithm::Brotli => {
                brotli::Decompressor::new(&bytes[..], 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            CompressionAlgorithm::Zstd => {
                out = zstd::stream::decode_all(&bytes[..]).unwrap();
            }
        }
        out
    }

    #[tokio::test]
    async fn every_coding_round_trips_streamed_chunks() {
        let a: &'static [u8] = b"hello hello hello hello ";
        let b: &'static [u8] = &[b'x'; 70_000];
        let mut want = a.to_vec();
        want.extend_from_slice(b);
        want.extend_from_slice(a);
        for alg in ALL {
            assert_eq!(roundtrip(alg, vec![a, b, a]).await, want, "{alg:?}");
            assert_eq!(
                roundtrip(alg, vec![]).await,
                Vec::<u8>::new(),
                "{alg:?} empty"
            );
        }
    }

    #[tokio::test]
    async fn trailers_survive_compression() {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
            Ok(Frame::data(Bytes::from_static(b"abcabcabc"))),
            Ok(Frame::trailers({
                let mut t = HeaderMap::new();
                t.insert("x-sum", hv("9"));
                t
            })),
        ];
        let inner = crate::body::boxed(http_body_util::StreamBody::new(
            futures_util::stream::iter(frames),
        ));
        let collected = CompressBody::new(inner, CompressionAlgorithm::Gzip)
            .collect()
            .await
            .unwrap();
        assert_eq!(collected.trailers().unwrap()["x-sum"], "9");
        let mut out = String::new();
        flate2::read::GzDecoder::new(&collected.to_bytes()[..])
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "abcabcabc");
    }
}
