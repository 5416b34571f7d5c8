//! The two heads of a backend exchange: the request head written straight from the proxy's
//! rewritten fields into one buffer, and the backend's response head parsed once with
//! httparse into the [`http`] types, its hop-by-hop fields left out as it is built.
//!
//! The response head is hostile input. It is bounded by the caller's buffer (its size bound
//! is the head's) and by [`MAX_FIELDS`]; its framing is refused rather than guessed when it
//! could desync the connection: `Content-Length` with `Transfer-Encoding`, differing or
//! malformed `Content-Length` values, `Transfer-Encoding` in an HTTP/1.0 response, `chunked`
//! that is not the last coding or is there twice, obs-fold, any 101 (upgrades go through
//! hyper's client, not this one), a `Connection` field naming more than [`MAX_FIELDS`]
//! options. An HTTP/1.0 response is never followed by another request on its connection.

use bytes::{BufMut, Bytes};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use std::mem::MaybeUninit;

/// Most fields a response head may have (hyper's default bound).
pub const MAX_FIELDS: usize = 100;

/// Room a response's header map is made with beyond the backend's fields: what the proxy may
/// add on the way to the client (`X-Request-Id`, a session cookie, a filter's fields), so that
/// the map is not grown (re-hashed and re-allocated) per response.
pub const FIELD_ROOM: usize = 4;

/// How a request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// No body.
    Empty,
    /// Exactly this many bytes (`Content-Length`).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// What the request's body is known to be before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyShape {
    /// The body has ended already (`is_end_stream`): nothing to send.
    pub end: bool,
    /// Its exact length when known (`size_hint().exact()`).
    pub exact: Option<u64>,
}

/// Methods whose requests carry a body as a rule: an empty one is announced as
/// `Content-Length: 0`, so the backend does not wait for one.
fn expects_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

/// Whether a request of `method` sent with `framing` asks the backend to close the connection
/// after its response (`Connection: close`), and the connection is then not reused: a GET,
/// HEAD, DELETE, OPTIONS or TRACE request with a body, whatever its framing (RFC 9110 gives
/// content on these methods no meaning). A backend that does not expect a body there and does
/// not read it (the "CL.0" desync: a static-file handler answering a GET without consuming
/// its `Content-Length` bytes, or a chunked body ignored) would read the body as the next
/// request on the connection: a request no route or access rule saw, and a response that
/// would go to the next client given the pooled connection. Told to close, it processes
/// nothing after the first request (RFC 9112 §9.6). The body still goes, as HAProxy and nginx
/// forward it (hyper's client sent none at all for a GET of unknown length, dropping the
/// client's body unseen); such a request costs one backend connection. HAProxy and nginx
/// keep the connection; Sweety does not trust every backend to frame what it does not expect.
pub fn closes_after(method: &Method, framing: RequestFraming) -> bool {
    let has_body = match framing {
        RequestFraming::Empty | RequestFraming::Length(0) => false,
        RequestFraming::Length(_) | RequestFraming::Chunked => true,
    };
    has_body
        && (*method == Method::GET
            || *method == Method::HEAD
            || *method == Method::DELETE
            || *method == Method::OPTIONS
            || *method == Method::TRACE)
}

/// The value of a `Content-Length` field when it is one decimal length (digits only, no
/// sign, no list), else `None`.
pub fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(b - b'0');
    }
    Some(n)
}

/// Field lines a caller adds to a request head beside its header map ([`RequestHead::extra`](super::RequestHead::extra)),
/// written after the map's fields: what a proxy adds to every request (the forwarding fields)
/// goes straight into the head this way, without a look-up and an insertion in the map each.
///
/// Every value is checked as it is added, with the rule of [`HeaderValue::from_bytes`] (no
/// CR, LF, NUL or DEL), so that nothing added can end a line early or smuggle a field; the
/// fields that frame the message or name its target (`Host`, `Content-Length`,
/// `Transfer-Encoding`, `Connection`, `Expect`, `TE`, `Upgrade`, `Trailer`, `Keep-Alive`) are
/// refused: [`write_request_head`] alone writes those.
#[derive(Debug, Default, Clone)]
pub struct ExtraFields {
    /// `name: value\r\n` lines (empty while `shared` holds them).
    buf: Vec<u8>,
    /// The lines, read only, when shared ([`ExtraFields::share`]): a clone is then a
    /// reference count, not a copy. A line added copies them back into `buf` first.
    shared: Option<Bytes>,
}

impl PartialEq for ExtraFields {
    fn eq(&self, other: &ExtraFields) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ExtraFields {}

impl ExtraFields {
    /// No fields, with room for `bytes` bytes of lines.
    pub fn with_capacity(bytes: usize) -> ExtraFields {
        ExtraFields {
            buf: Vec::with_capacity(bytes),
            shared: None,
        }
    }

    /// Whether no field was added.
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }

    /// The field lines as they are written (`name: value\r\n` each).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.shared {
            Some(b) => b,
            None => &self.buf,
        }
    }

    /// A copy of these fields that shares their bytes with this one and with every clone of
    /// either (a clone is then a reference count, not a copy of the lines): for lines kept
    /// and handed out again, as a connection's forwarding fields are. The same fields; a line
    /// added to either later copies the bytes first.
    pub fn share(&mut self) -> ExtraFields {
        if self.shared.is_none() {
            self.shared = Some(Bytes::from(std::mem::take(&mut self.buf)));
        }
        self.clone()
    }

    /// Starts the field `name`; its value is the parts [`Line::put`] adds, and it is kept
    /// only if [`Line::finish`] is called and every part was valid.
    pub fn line(&mut self, name: &HeaderName) -> Line<'_> {
        let ok = !framing_or_target(name);
        if let Some(shared) = self.shared.take() {
            self.buf = shared.to_vec();
        }
        let buf = &mut self.buf;
        let start = buf.len();
        buf.extend_from_slice(name.as_str().as_bytes());
        buf.extend_from_slice(b": ");
        Line {
            buf,
            start,
            ok,
            done: false,
        }
    }

    /// Adds `name: value` (see [`ExtraFields::line`]); false (nothing added) when the value
    /// has a byte a field value may not have or `name` is refused.
    pub fn push(&mut self, name: &HeaderName, value: &[u8]) -> bool {
        let mut line = self.line(name);
        line.put(value);
        line.finish()
    }

    /// The fields as (name, value) pairs, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.as_bytes()
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                let l = l.strip_suffix(b"\r").unwrap_or(l);
                let colon = l.iter().position(|&b| b == b':')?;
                Some((&l[..colon], &l[colon + 2..]))
            })
    }
}

/// One field being added to [`ExtraFields`]; dropped without [`Line::finish`], it is left out.
#[derive(Debug)]
pub struct Line<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
    ok: bool,
    done: bool,
}

impl Line<'_> {
    /// Appends `part` to the value (the line is left out at the end when `part` has a byte a
    /// field value may not have).
    pub fn put(&mut self, part: &[u8]) -> &mut Self {
        // No early exit: the check runs over short parts as a plain loop.
        self.ok &= part.iter().fold(true, |ok, &b| ok & valid_value_byte(b));
        self.buf.extend_from_slice(part);
        self
    }

    /// Ends the field; true when it was kept.
    pub fn finish(mut self) -> bool {
        self.done = true;
        if self.ok {
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.buf.truncate(self.start);
        }
        self.ok
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.buf.truncate(self.start);
        }
    }
}

/// A byte [`HeaderValue::from_bytes`] accepts: HTAB, SP, visible ASCII and obs-text.
fn valid_value_byte(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// Fields only [`write_request_head`] writes (see [`ExtraFields`]).
fn framing_or_target(name: &HeaderName) -> bool {
    let n = name.as_str();
    !n.starts_with("x-")
        && matches!(
            n,
            "host"
                | "content-length"
                | "transfer-encoding"
                | "connection"
                | "expect"
                | "te"
                | "upgrade"
                | "trailer"
                | "keep-alive"
                | "proxy-connection"
        )
}

/// Writes a request head into `out`: the request line (`method`, `target`: origin-form path
/// and query), `Host` (`host`, else the map's own), the fields of `headers` in their order,
/// the `extra` fields, and the framing of the body, and returns that framing.
///
/// The framing is the map's `Content-Length` when it has one valid value (the body must then
/// be exactly that long); else none for a body that has ended (with `Content-Length: 0` for
/// POST, PUT and PATCH), `Content-Length` for a body of known length, and chunked for the rest
/// (with `Connection: close` for a body on a method that gives it no meaning, see
/// [`closes_after`]).
/// `Transfer-Encoding` and malformed `Content-Length` fields of the map are not written: the
/// framing written is the one the body is sent with.
pub fn write_request_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    host: Option<&HeaderValue>,
    headers: &HeaderMap,
    extra: Option<&ExtraFields>,
    body: BodyShape,
) -> RequestFraming {
    let mut framing = None;
    let mut lengths = headers.get_all(http::header::CONTENT_LENGTH).iter();
    if let (Some(v), None) = (lengths.next(), lengths.next()) {
        framing = parse_length(v.as_bytes()).map(RequestFraming::Length);
    }
    out.reserve(64 + target.len() + headers.len() * 32);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    if let Some(h) = host {
        put_field(out, b"host", h.as_bytes());
    }
    for (name, value) in headers {
        let skip = match *name {
            http::header::HOST => host.is_some(),
            http::header::TRANSFER_ENCODING => true,
            // The body is sent at once, so a backend that answers early without `100
            // Continue` and keeps the connection would read the body as its next request
            // (nginx clears it toward upstreams too); the client's 100 is the server's.
            http::header::EXPECT => true,
            http::header::CONTENT_LENGTH => framing.is_none(),
            _ => false,
        };
        if !skip {
            put_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if let Some(extra) = extra {
        out.put_slice(extra.as_bytes());
    }
    let framing = match framing {
        Some(f) => f,
        None if body.end => {
            if expects_body(method) {
                put_field(out, b"content-length", b"0");
            }
            RequestFraming::Empty
        }
        None => match body.exact {
            Some(n) => {
                put_field(out, b"content-length", n.to_string().as_bytes());
                RequestFraming::Length(n)
            }
            None => {
                put_field(out, b"transfer-encoding", b"chunked");
                RequestFraming::Chunked
            }
        },
    };
    if closes_after(method, framing) {
        put_field(out, b"connection", b"close");
    }
    out.put_slice(b"\r\n");
    framing
}

fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body (a response to HEAD, 204, 304).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Until the backend closes the connection.
    Close,
}

/// A parsed final response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status, version (HTTP/1.1 whatever the backend spoke) and the end-to-end fields; the
    /// body is `()`.
    pub response: http::Response<()>,
    /// How the body is delimited.
    pub framing: ResponseFraming,
    /// Neither side asked to close: the connection may carry another request once this
    /// response was read whole.
    pub keep_alive: bool,
}

/// What [`parse_response`] found at the start of a buffer.
#[derive(Debug)]
pub enum Parsed {
    /// The head is not complete yet.
    Partial,
    /// An interim (1xx other than 101) response of this many bytes, to be skipped.
    Interim(usize),
    /// A final response head of this many bytes.
    Final(usize, ResponseHead),
}

/// Why a response head is refused. The connection cannot be used any more.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeadError {
    /// Not an HTTP/1.x response head (httparse's verdict: bad status line, bad field syntax,
    /// obs-fold, bare CR…).
    #[error("malformed response head: {0}")]
    Syntax(httparse::Error),
    /// More than [`MAX_FIELDS`] fields.
    #[error("response head has more than {MAX_FIELDS} fields")]
    TooManyFields,
    /// A field name or value the `http` types refuse.
    #[error("response head has an invalid field")]
    InvalidField,
    /// `Content-Length` malformed, or several that differ.
    #[error("response has an invalid Content-Length")]
    BadLength,
    /// Both `Content-Length` and `Transfer-Encoding`.
    #[error("response has both Content-Length and Transfer-Encoding")]
    LengthAndEncoding,
    /// `Transfer-Encoding` in an HTTP/1.0 response, or `chunked` applied twice.
    #[error("response has an invalid Transfer-Encoding")]
    BadEncoding,
    /// 101 Switching Protocols (this client sends no upgrade request).
    #[error("response switches protocols unasked")]
    UnaskedSwitch,
}

/// Whether `name` (any case) is hop-by-hop whatever its value: the connection-specific fields
/// and `Trailer` (what the proxy strips from every response).
fn always_hop_by_hop(name: &[u8]) -> bool {
    match name.len() {
        2 => name.eq_ignore_ascii_case(b"te"),
        7 => name.eq_ignore_ascii_case(b"upgrade") || name.eq_ignore_ascii_case(b"trailer"),
        10 => name.eq_ignore_ascii_case(b"connection") || name.eq_ignore_ascii_case(b"keep-alive"),
        16 => name.eq_ignore_ascii_case(b"proxy-connection"),
        17 => name.eq_ignore_ascii_case(b"transfer-encoding"),
        _ => false,
    }
}

/// The comma-separated elements of a field value, trimmed, empty ones left out.
fn elements(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
}

/// Parses a response head at the start of `buf` (a response to a HEAD request when
/// `head_request`).
///
/// The final head's map has the end-to-end fields only: `Connection` and every field it
/// names, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, `Trailer` and
/// `TE` are left out as it is built (a `TE` naming `trailers` is kept as `te: trailers`, as the
/// proxy's strip of a map does). The framing is read from the fields as they came.
pub fn parse_response(buf: &[u8], head_request: bool) -> Result<Parsed, HeadError> {
    // The fields are not initialised first: httparse writes those it parses (the default
    // parser configuration, as `Response::parse`'s).
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyFields),
        Err(e) => return Err(HeadError::Syntax(e)),
    };
    let code = resp.code.unwrap_or(0);
    if code == 101 {
        return Err(HeadError::UnaskedSwitch);
    }
    if (100..200).contains(&code) {
        return Ok(Parsed::Interim(len));
    }
    let status =
        StatusCode::from_u16(code).map_err(|_| HeadError::Syntax(httparse::Error::Status))?;
    let http10 = resp.version == Some(0);
    let fields = resp.headers;

    // Framing and the Connection options, from the fields as they came.
    let mut length: Option<u64> = None;
    let mut encoded = false;
    let mut chunked_last = false;
    let mut chunked_seen = false;
    let mut close = false;
    // The fields Connection names other than the ones left out anyway (`keep-alive`, the
    // usual value, names none: the per-field look-up is skipped), at most MAX_FIELDS.
    let mut named: Vec<&[u8]> = Vec::new();
    let mut te_trailers = false;
    for f in fields.iter() {
        let name = f.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            // A list of equal values is one length (RFC 9110 §8.6); anything else is refused.
            for e in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                let n = parse_length(e).ok_or(HeadError::BadLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::BadLength);
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // An empty field still says the body is encoded.
            encoded = true;
            for e in elements(f.value) {
                if e.eq_ignore_ascii_case(b"chunked") {
                    if chunked_seen {
                        return Err(HeadError::BadEncoding);
                    }
                    chunked_seen = true;
                    chunked_last = true;
                } else {
                    // A coding after chunked: the body is not chunked as a whole.
                    chunked_last = false;
                }
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for e in elements(f.value) {
                if e.eq_ignore_ascii_case(b"close") {
                    close = true;
                }
                // `close` names a field too (one called so is left out, as the strip does).
                if !always_hop_by_hop(e) {
                    if named.len() == MAX_FIELDS {
                        return Err(HeadError::InvalidField);
                    }
                    named.push(e);
                }
            }
        } else if name.eq_ignore_ascii_case(b"te") {
            te_trailers |= elements(f.value).any(|e| {
                e.split(|&b| b == b';')
                    .next()
                    .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
            });
        }
    }
    if encoded && length.is_some() {
        return Err(HeadError::LengthAndEncoding);
    }
    if encoded && http10 {
        return Err(HeadError::BadEncoding);
    }
    let framing = if head_request || code == 204 || code == 304 {
        ResponseFraming::Empty
    } else if encoded {
        if chunked_last {
            ResponseFraming::Chunked
        } else {
            ResponseFraming::Close
        }
    } else if let Some(n) = length {
        ResponseFraming::Length(n)
    } else {
        ResponseFraming::Close
    };
    // An HTTP/1.0 backend is never sent a second request: every request is written as
    // HTTP/1.1 and may be chunked, which a 1.0 parser would read as a second request.
    let keep_alive = framing != ResponseFraming::Close && !close && !http10;

    // The end-to-end fields. Their values share one copy of the head's bytes.
    let block = Bytes::copy_from_slice(&buf[..len]);
    let mut headers = HeaderMap::with_capacity(fields.len() + FIELD_ROOM);
    for f in fields.iter() {
        let name = f.name.as_bytes();
        if always_hop_by_hop(name) || named.iter().any(|e| e.eq_ignore_ascii_case(name)) {
            continue;
        }
        let name = crate::name::from_bytes(name).map_err(|_| HeadError::InvalidField)?;
        // The value's place in `buf` is its place in the copy.
        let at = f.value.as_ptr() as usize - buf.as_ptr() as usize;
        let value = HeaderValue::from_maybe_shared(block.slice(at..at + f.value.len()))
            .map_err(|_| HeadError::InvalidField)?;
        headers.append(name, value);
    }
    if te_trailers {
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = Version::HTTP_11;
    *response.headers_mut() = headers;
    Ok(Parsed::Final(
        len,
        ResponseHead {
            response,
            framing,
            keep_alive,
        },
    ))
}
