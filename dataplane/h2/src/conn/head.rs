//! Request header blocks: HEADERS and CONTINUATION framing, HPACK decoding under the
//! header-list limit, and the validation of a decoded block into an `http::Request`
//! (RFC 9113 §8.2, §8.3).

use super::*;

/// A header block being received over HEADERS and CONTINUATION frames.
pub(super) struct Continuation {
    pub(super) stream: u32,
    pub(super) end_stream: bool,
    pub(super) bad_priority: bool,
    pub(super) block: BytesMut,
}

impl<I: AsyncRead + AsyncWrite + Unpin, S: H2Service> Driver<I, S> {
    /// Largest encoded header block (HEADERS plus CONTINUATION) accepted: a block this large
    /// cannot decode within `max_header_bytes` by much, and past it the client is flooding.
    pub(super) fn max_block(&self) -> usize {
        self.cfg.max_header_bytes as usize + 16 * 1024
    }

    pub(super) fn on_headers(&mut self, head: Head, payload: &[u8]) -> FResult {
        let id = head.stream;
        if id == 0 {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut block = payload;
        if head.has(flag::PADDED) {
            block =
                frame::unpad(block).ok_or(Fault::Conn(Reason::PROTOCOL_ERROR, "bad padding"))?;
        }
        let mut bad_priority = false;
        if head.has(flag::PRIORITY) {
            if block.len() < 5 {
                return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "HEADERS priority"));
            }
            bad_priority = frame::priority_dependency(block) == id;
            block = &block[5..];
        }
        if block.len() > self.max_block() {
            self.service.limit_hit("header_bytes");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        let end_stream = head.has(flag::END_STREAM);
        if head.has(flag::END_HEADERS) {
            return self.on_header_block(id, end_stream, bad_priority, block);
        }
        if block.is_empty() {
            self.empty_flood()?;
        }
        let c = Continuation {
            stream: id,
            end_stream,
            bad_priority,
            block: BytesMut::from(block),
        };
        let now = clock();
        self.cont = Some((c, now));
        self.arm(now + self.cfg.header_read_timeout);
        Ok(())
    }

    pub(super) fn on_continuation(&mut self, head: Head, payload: &[u8]) -> FResult {
        let max_block = self.max_block();
        let Some((c, _)) = self.cont.as_mut() else {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without HEADERS",
            ));
        };
        if c.block.len() + payload.len() > max_block {
            self.service.limit_hit("header_bytes");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        c.block.extend_from_slice(payload);
        if !head.has(flag::END_HEADERS) {
            if payload.is_empty() {
                self.empty_flood()?;
            }
            return Ok(());
        }
        let (c, _) = self.cont.take().expect("checked above");
        self.on_header_block(c.stream, c.end_stream, c.bad_priority, &c.block)
    }

    pub(super) fn decode(&mut self, block: &[u8], trailers: bool) -> Result<DecodedBlock, Fault> {
        let mut h = DecodedBlock::default();
        let max = self.cfg.max_header_bytes as usize;
        let r = self.decoder.decode(block, max, |f| h.field(f, trailers));
        match r {
            Ok(()) => Ok(h),
            Err(e) if !e.is_connection_error() => {
                // Too large a header list: the block was decoded (the table is in sync); only
                // this request is refused.
                h.too_large = true;
                Ok(h)
            }
            Err(e) => Err(Self::hpack_failed(&e)),
        }
    }

    /// The connection error for a block that failed to decode.
    fn hpack_failed(e: &crate::hpack::HpackError) -> Fault {
        tracing::debug!(error = %e, "HPACK decoding failed");
        Fault::Conn(Reason::COMPRESSION_ERROR, "HPACK")
    }

    pub(super) fn on_header_block(
        &mut self,
        id: u32,
        end_stream: bool,
        bad_priority: bool,
        block: &[u8],
    ) -> FResult {
        if let Some(s) = self.streams.get(&id) {
            // Trailers (or a second HEADERS).
            let open = s.recv_open;
            let h = self.decode(block, true)?;
            if !open {
                return Err(Fault::Stream(id, Reason::STREAM_CLOSED));
            }
            if !end_stream || h.malformed.is_some() || h.too_large {
                return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
            }
            let s = self.streams.get_mut(&id).expect("present");
            if s.content_length.is_some_and(|cl| cl != s.received) {
                return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
            }
            s.recv_open = false;
            if let Some(r) = s.recv.take() {
                r.finish(Some(h.headers));
            }
            self.maybe_close(id);
            return Ok(());
        }
        if id.is_multiple_of(2) {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "even stream id"));
        }
        if id <= self.last_stream {
            let _ = self.decode(block, true)?;
            if self.locally_reset_set.contains(&id) {
                // Trailers of a stream we reset: decoded (the table stays in sync), dropped.
                return self.glitch();
            }
            if self.recently_closed.contains(&id) {
                return Err(Fault::Conn(
                    Reason::STREAM_CLOSED,
                    "HEADERS on a closed stream",
                ));
            }
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "stream id went backwards",
            ));
        }
        self.last_stream = id;
        let h = self.new_head(block)?;
        if self.going_away {
            // After our GOAWAY: not processed; the client may retry it elsewhere.
            if !end_stream {
                self.mark_reset(id);
            }
            return Ok(());
        }
        if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
            self.service.limit_hit("h2_refused_stream");
            // Before it acknowledged our SETTINGS the client may not know the limit: its
            // opening burst is refused (RFC 9113 §5.1.2, §6.5.2) without counting, up to
            // EARLY_REFUSALS per connection.
            let early = !self.settings_acked && self.early_refusals < EARLY_REFUSALS;
            let charge = if early {
                self.early_refusals += 1;
                Charge::Server
            } else {
                Charge::Client
            };
            return self.reset_stream(id, Reason::REFUSED_STREAM, charge);
        }
        if h.too_large() {
            // Answered, but counted like a reset: decoding an oversized block is the client's
            // cost to us, and looping them must not be free.
            self.service.limit_hit("header_bytes");
            self.scratch.clear();
            self.encoder.begin_block(&mut self.scratch);
            Encoder::status(&mut self.scratch, 431);
            frame::put_headers(
                &mut self.write_buf,
                id,
                &self.scratch,
                true,
                self.peer_max_frame,
            );
            if !end_stream {
                // The request body is not wanted.
                return self.reset_stream(id, Reason::NO_ERROR, Charge::Client);
            }
            self.remember_closed(id);
            return self.reset_flood();
        }
        if bad_priority || h.malformed().is_some() {
            if let Some(why) = h.malformed() {
                tracing::debug!(stream = id, why, "malformed HTTP/2 request");
            }
            return self.reset_stream(id, Reason::PROTOCOL_ERROR, Charge::Client);
        }
        self.start_stream(id, end_stream, h)
    }
}

/// A new stream's request head: decoded from its block, or the head kept from a block that
/// this one repeats.
///
/// A client sends the same request over and over (a load generator, a poller, a health
/// check): after its first request the block is the same octets each time, and with the
/// fields in the dynamic table, all indexed (no insert). When the decoder finds a block
/// repeats the one before with the same fields and the same table after it
/// (`Decoder::repeat`), the head built from that block's run is cloned instead of decoding,
/// validating and building the fields again: the same function of the same fields.
pub(super) enum NewHead {
    /// Decoded (and validated field by field).
    Decoded(DecodedBlock),
    /// The kept head of the decoder's current run: a valid request, not a tunnel.
    Kept(http::request::Parts),
}

impl NewHead {
    pub(super) fn too_large(&self) -> bool {
        matches!(self, NewHead::Decoded(h) if h.too_large)
    }

    pub(super) fn malformed(&self) -> Option<&'static str> {
        match self {
            NewHead::Decoded(h) => h.malformed,
            NewHead::Kept(_) => None,
        }
    }

    /// The request and whether it is an extended CONNECT (see [`DecodedBlock::into_request`]).
    pub(super) fn into_parts(self) -> Result<(http::request::Parts, bool), &'static str> {
        match self {
            NewHead::Decoded(h) => h.into_request().map(|(r, t)| (r.into_parts().0, t)),
            NewHead::Kept(p) => Ok((p, false)),
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin, S: H2Service> Driver<I, S> {
    /// A new stream's head: the kept one when `block` repeats its run, else decoded.
    fn new_head(&mut self, block: &[u8]) -> Result<NewHead, Fault> {
        let max = self.cfg.max_header_bytes as usize;
        match self.kept_request.repeat(&mut self.decoder, block, max) {
            Ok(Some(parts)) => Ok(NewHead::Kept(parts)),
            Ok(None) => self.decode(block, false).map(NewHead::Decoded),
            // (Not reached: the same octets decoded within the bound before.)
            Err(e) if !e.is_connection_error() => Ok(NewHead::Decoded(DecodedBlock {
                too_large: true,
                ..DecodedBlock::default()
            })),
            Err(e) => Err(Self::hpack_failed(&e)),
        }
    }

    /// Keeps the head of a new stream, valid and not a tunnel, when its block was the same
    /// octets twice in a row (likely again; a client whose requests never repeat costs no
    /// copy), unless one of its run is kept already.
    pub(super) fn keep_request(&mut self, parts: &http::request::Parts) {
        self.kept_request.keep(&self.decoder, || parts.clone());
    }
}

/// The request's `content-length`: none, one value, or an error (invalid or conflicting).
/// A value is 1*DIGIT (RFC 9110 §8.6): no sign, no spaces, at most 19 digits (as h2's server).
pub(super) fn h_content_length(h: &HeaderMap) -> Result<Option<u64>, ()> {
    let mut out = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let b = v.as_bytes();
        if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n: u64 = v.to_str().map_err(|_| ())?.parse().map_err(|_| ())?;
        if out.is_some_and(|o| o != n) {
            return Err(());
        }
        out = Some(n);
    }
    Ok(out)
}

/// The fields a request's header map has room for from its first field on: a request of up
/// to 5 fields and the 7 the pipeline and the proxy add (see [`DecodedBlock::try_field`]).
pub(super) const REQUEST_FIELDS: usize = 12;

/// A decoded request (or trailer) header block, validated field by field (RFC 9113 §8.2,
/// §8.3).
#[derive(Default)]
pub(super) struct DecodedBlock {
    method: Option<Method>,
    scheme: Option<http::uri::Scheme>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
    protocol: Option<Bytes>,
    headers: HeaderMap,
    regular_seen: bool,
    malformed: Option<&'static str>,
    /// Past `max_header_bytes` (answered with 431).
    too_large: bool,
}

impl DecodedBlock {
    pub(super) fn field(&mut self, f: Field<'_>, trailers: bool) {
        if self.malformed.is_some() {
            return;
        }
        if let Err(why) = self.try_field(f, trailers) {
            self.malformed = Some(why);
        }
    }

    pub(super) fn try_field(&mut self, f: Field<'_>, trailers: bool) -> Result<(), &'static str> {
        if let Some(pseudo) = f.name.strip_prefix(b":") {
            if trailers {
                return Err("pseudo-header in trailers");
            }
            if self.regular_seen {
                return Err("pseudo-header after a regular header");
            }
            let slot = match pseudo {
                b"method" => {
                    if self.method.is_some() {
                        return Err("duplicate :method");
                    }
                    self.method = Some(Method::from_bytes(f.value).map_err(|_| "invalid :method")?);
                    return Ok(());
                }
                b"scheme" => {
                    if self.scheme.is_some() {
                        return Err("duplicate :scheme");
                    }
                    self.scheme =
                        Some(http::uri::Scheme::try_from(f.value).map_err(|_| "invalid :scheme")?);
                    return Ok(());
                }
                b"authority" => &mut self.authority,
                b"path" => &mut self.path,
                b"protocol" => &mut self.protocol,
                _ => return Err("unknown pseudo-header"),
            };
            if slot.is_some() {
                return Err("duplicate pseudo-header");
            }
            *slot = Some(Bytes::copy_from_slice(f.value));
            return Ok(());
        }
        self.regular_seen = true;
        if f.name.iter().any(|b| b.is_ascii_uppercase()) {
            return Err("upper-case header name");
        }
        let name = HeaderName::from_bytes(f.name).map_err(|_| "invalid header name")?;
        if crate::conn_headers::is_connection_specific(name.as_str(), f.value) {
            return Err("connection-specific header");
        }
        let mut value = HeaderValue::from_bytes(f.value).map_err(|_| "invalid header value")?;
        if f.sensitive {
            value.set_sensitive(true);
        }
        if !trailers && self.headers.capacity() == 0 {
            // Room for the request's first fields and for what the proxy adds to them
            // (`Host` from `:authority`, `X-Request-Id`, four forwarding fields and
            // `X-Real-IP`) in one allocation: the map's default of 6 grew (a reallocation
            // and a rehash, ~900 instructions) as a proxied request's fields were added.
            self.headers.reserve(REQUEST_FIELDS);
        }
        self.headers.append(name, value);
        Ok(())
    }

    /// The request (body to be set) and whether it is an extended CONNECT (a tunnel).
    pub(super) fn into_request(self) -> Result<(Request<()>, bool), &'static str> {
        let DecodedBlock {
            method,
            scheme,
            authority,
            path,
            protocol,
            headers,
            ..
        } = self;
        let method = method.ok_or("missing :method")?;
        let mut tunnel = false;
        let uri = if method == Method::CONNECT {
            match &protocol {
                None => {
                    if scheme.is_some() || path.is_some() {
                        return Err("CONNECT with :scheme or :path");
                    }
                    let a = authority.ok_or("CONNECT without :authority")?;
                    Uri::from_maybe_shared(a).map_err(|_| "invalid :authority")?
                }
                Some(_) => {
                    // RFC 8441 §4: :scheme and :path are required.
                    if scheme.is_none() {
                        return Err("extended CONNECT without :scheme");
                    }
                    tunnel = true;
                    build_uri(scheme, authority, path)?
                }
            }
        } else {
            if protocol.is_some() {
                return Err(":protocol without CONNECT");
            }
            if scheme.is_none() {
                return Err("missing :scheme");
            }
            build_uri(scheme, authority, path)?
        };
        // A `host` differing from `:authority` is kept (RFC 9113 §8.3.1 makes refusing it a
        // SHOULD; hyper's server accepted it): routing uses `:authority` first, like hyper's
        // request URI did.
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_2;
        *req.headers_mut() = headers;
        if let Some(p) = &protocol {
            let p = std::str::from_utf8(p).map_err(|_| "invalid :protocol")?;
            req.extensions_mut().insert(crate::ConnectProtocol::new(p));
        }
        Ok((req, tunnel))
    }
}

pub(super) fn build_uri(
    scheme: Option<http::uri::Scheme>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
) -> Result<Uri, &'static str> {
    let path = path.ok_or("missing :path")?;
    if path.is_empty() {
        return Err("empty :path");
    }
    let mut parts = http::uri::Parts::default();
    if let (Some(s), Some(a)) = (scheme, authority) {
        parts.scheme = Some(s);
        parts.authority =
            Some(http::uri::Authority::from_maybe_shared(a).map_err(|_| "invalid :authority")?);
    }
    parts.path_and_query = Some(if path[..] == b"*"[..] {
        http::uri::PathAndQuery::from_static("*")
    } else {
        http::uri::PathAndQuery::from_maybe_shared(path).map_err(|_| "invalid :path")?
    });
    Uri::from_parts(parts).map_err(|_| "invalid request target")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<'a>(name: &'a str, value: &'a str) -> Field<'a> {
        Field {
            name: name.as_bytes(),
            value: value.as_bytes(),
            sensitive: false,
        }
    }

    fn head(fields: &[(&str, &str)], trailers: bool) -> DecodedBlock {
        let mut h = DecodedBlock::default();
        for (n, v) in fields {
            h.field(field(n, v), trailers);
        }
        h
    }

    #[test]
    fn requests_are_built_from_pseudo_headers() {
        let h = head(
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", "a.test:8443"),
                (":path", "/x?y=1"),
                ("accept", "*/*"),
            ],
            false,
        );
        assert!(h.malformed.is_none());
        let (r, tunnel) = h.into_request().unwrap();
        assert!(!tunnel);
        assert_eq!(r.uri(), "https://a.test:8443/x?y=1");
        assert_eq!(r.version(), Version::HTTP_2);
        assert_eq!(r.headers()["accept"], "*/*");
    }

    #[test]
    fn malformed_requests_are_refused() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(":method", "GET"), (":path", "/")], "missing :scheme"),
            (
                &[(":method", "GET"), (":scheme", "http"), (":path", "")],
                "empty :path",
            ),
            (&[(":scheme", "http"), (":path", "/")], "missing :method"),
            (
                &[(":method", "GET"), (":method", "GET")],
                "duplicate :method",
            ),
            (&[("a", "b"), (":method", "GET")], "pseudo after regular"),
            (&[(":status", "200")], "response pseudo-header"),
            (&[("Accept", "x")], "upper-case"),
            (&[("connection", "close")], "connection-specific"),
            (&[("te", "gzip")], "te"),
            (&[("x", "a\nb")], "newline in a value"),
            (
                &[
                    (":method", "CONNECT"),
                    (":authority", "a:1"),
                    (":path", "/"),
                ],
                "CONNECT with :path",
            ),
            (
                &[
                    (":method", "CONNECT"),
                    (":protocol", "websocket"),
                    (":authority", "a:1"),
                    (":path", "/chat"),
                ],
                "extended CONNECT without :scheme",
            ),
        ];
        for (fields, what) in cases {
            let h = head(fields, false);
            let bad = h.malformed.is_some() || h.into_request().is_err();
            assert!(bad, "{what} must be refused");
        }
        assert!(
            head(&[(":path", "/")], true).malformed.is_some(),
            "pseudo in trailers"
        );
        assert!(head(&[("te", "trailers")], false).malformed.is_none());
    }

    #[test]
    fn a_request_map_has_room_for_the_proxy_fields_and_trailers_do_not_reserve() {
        let h = head(&[(":method", "GET"), ("user-agent", "x")], false);
        assert!(h.headers.capacity() >= REQUEST_FIELDS);
        let (mut r, _) = {
            let mut h = h;
            h.scheme = Some(http::uri::Scheme::HTTPS);
            h.path = Some(Bytes::from_static(b"/"));
            h.into_request().unwrap()
        };
        let before = r.headers().capacity();
        for i in 0..REQUEST_FIELDS - 1 {
            r.headers_mut().insert(
                HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        assert_eq!(
            r.headers().capacity(),
            before,
            "no growth within REQUEST_FIELDS"
        );
        let t = head(&[("grpc-status", "0")], true);
        assert!(t.headers.capacity() < REQUEST_FIELDS);
    }

    #[test]
    fn extended_connect_is_a_tunnel_with_its_protocol() {
        let h = head(
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "http"),
                (":authority", "a.test"),
                (":path", "/chat"),
            ],
            false,
        );
        let (r, tunnel) = h.into_request().unwrap();
        assert!(tunnel);
        assert_eq!(
            r.extensions()
                .get::<crate::ConnectProtocol>()
                .unwrap()
                .as_str(),
            "websocket"
        );
    }

    #[test]
    fn content_length_must_be_one_valid_number() {
        let mut h = HeaderMap::new();
        assert_eq!(h_content_length(&h), Ok(None));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert_eq!(h_content_length(&h), Ok(Some(5)));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("6"));
        assert!(h_content_length(&h).is_err());
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("-1"));
        assert!(h_content_length(&h).is_err());
        for v in ["+5", " 5", "5 ", "05x", "", "12345678901234567890"] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
            assert!(h_content_length(&h).is_err(), "{v:?} accepted");
        }
    }
}
