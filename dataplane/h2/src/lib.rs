//! `sweety-h2`: Sweety's own HTTP/2 (RFC 9113) engine. Its server side is used by the dataplane for
//! h2 (TLS with ALPN) and h2c (prior knowledge) connections when `limits.http2_engine` is
//! `sweety` (the default). It knows nothing of routes, caches or configs: each connection
//! hands its requests to an [`H2Service`], and the dataplane's request pipeline is one.
//!
//! * [`frame`]: frame header, types, flags, error codes, SETTINGS, frame writers.
//! * [`hpack`]: the header compression (RFC 7541) decoder and the table-less encoder.
//! * [`body`]: request bodies fed from DATA frames, the stream-to-connection wake-up path,
//!   and extended CONNECT (RFC 8441) tunnels.
//! * [`conn`]: the connection driver: state machine, flow control, limits, batching.
//! * [`client`]: the client side, for the proxy's h2c and h2 backends: one multiplexed
//!   connection, its frames checked as hostile input (`limits.http2_client: sweety`).
//! * [`conn_headers`]: connection-specific header fields (RFC 9110 §7.6.1, RFC 9113 §8.2.2),
//!   shared with the dataplane's HTTP/1.1 and HTTP/3 paths.
//! * [`first_poll`]: the inline first poll of a request future, spawned only if it waits.
//!
//! Depends on `bytes`, `http`, `http-body(-util)`, tokio's I/O traits and tasks, and
//! `tracing`/`httpdate`/`thiserror`; nothing of the dataplane.

#![forbid(unsafe_code)]

pub mod body;
pub mod client;
pub mod conn;
pub mod conn_headers;
pub mod first_poll;
pub mod frame;
pub mod hpack;

pub use body::{Upgrade, Upgraded};
pub use conn::{peak_output_bytes, serve, serve_read, H2Error, Settings, WRITE_HIGH};
pub use encoded::Encoded;
pub use frame::Reason;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

/// Boxed error carried by bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of requests and responses (the dataplane's body type too).
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> Body {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any compatible body.
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// What answers the requests of one HTTP/2 connection: one value per connection, owned by
/// its driver.
pub trait H2Service: Send {
    /// Response header fields the service has HPACK-encoded already (a cache hit's stored
    /// head), sent ahead of the fields of the response's map.
    type Head: EncodedHead;
    /// The answer to one request. [`conn`] polls it on the connection's own task (woken per
    /// stream), and drops it when the stream goes (a reset, the client's EOF, the connection's
    /// end): that cancels the request. It never becomes a task of its own, so it runs on the
    /// connection's worker: CPU-heavy work in it (a backend TLS handshake) is not spread over
    /// the runtime's workers, and anything blocking in it holds every stream of the connection.
    /// A large future is best boxed where it is built ([`box_in_place`]).
    type Future: Future<Output = (Response<Body>, Option<Self::Head>)> + Send + Unpin + 'static;

    /// Starts answering `request`, read at `now` (the clock reading of the batch of frames it
    /// came in).
    fn call(&mut self, request: Request<Body>, now: Instant) -> Self::Future;

    /// The connection hit a limit (`what`: `h2_rapid_reset`, `header_bytes`, `idle_timeout`…).
    fn limit_hit(&self, what: &'static str);

    /// The connection ends with a connection error: GOAWAY with `reason`, for `why`.
    fn connection_error(&self, reason: Reason, why: &'static str);

    /// A stream was reset with RST_STREAM(CANCEL) because its response waits for
    /// flow-control window after the client's EOF, when none can come (once per stream).
    fn blocked_at_eof(&self) {}

    /// The start of a poll of the connection: drop what the service keeps for requests if it
    /// is out of date (the dataplane drops a config snapshot older than the current one).
    fn on_poll(&mut self) {}

    /// The connection has no streams: hold nothing for requests (a reload frees the old
    /// config).
    fn on_idle(&mut self) {}
}

/// Header fields encoded ahead of time: [`encode`](EncodedHead::encode) appends their HPACK
/// encoding (no dynamic table: the encoding is valid on every connection).
pub trait EncodedHead: Send + 'static {
    /// Appends the encoded fields to `dst`.
    fn encode(&self, dst: &mut BytesMut);

    /// Whether the head has a field `name` (the driver adds `date` and `content-length` only
    /// when neither the head nor the map has them).
    fn contains(&self, name: &http::HeaderName) -> bool;
}

/// The [`H2Service::Head`] of a service that never has a pre-encoded head.
#[derive(Debug)]
pub enum NoHead {}

impl EncodedHead for NoHead {
    fn encode(&self, _: &mut BytesMut) {
        match *self {}
    }

    fn contains(&self, _: &http::HeaderName) -> bool {
        match *self {}
    }
}

/// The `:protocol` of an extended CONNECT request (RFC 8441, e.g. `websocket`), carried as
/// a request extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectProtocol(Box<str>);

impl ConnectProtocol {
    /// The protocol `p`.
    pub fn new(p: &str) -> ConnectProtocol {
        ConnectProtocol(p.into())
    }

    /// The protocol's name as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Boxes the value `make` returns, allocating first so that the optimizer can build it in
/// its heap slot (a request future is a few KiB; built on the stack, it is copied).
pub fn box_in_place<F>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::<F>::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}

/// HPACK-encodes one field of an `http` header map (name, value, sensitivity) into `dst`:
/// response heads, trailers and pre-encoded cache entries all go through here.
pub fn encode_field(dst: &mut bytes::BytesMut, name: &http::HeaderName, value: &http::HeaderValue) {
    crate::hpack::Encoder::field(
        dst,
        name.as_str().as_bytes(),
        value.as_bytes(),
        value.is_sensitive(),
    );
}

/// HPACK-encodes a response's fields (after `:status`): a pre-encoded head first (`head`,
/// from the service), then the fields of `headers`. Fields may also come pre-encoded as an
/// [`Encoded`] in `extensions` that the map still starts with; the bytes are the same as
/// encoding the whole map field by field.
pub fn encode_fields<H: EncodedHead>(
    dst: &mut bytes::BytesMut,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
    head: Option<&H>,
) {
    let mut skip = 0;
    if let Some(head) = head {
        head.encode(dst);
    } else if let Some(pre) = extensions.get::<Encoded>() {
        if let Some((block, n)) = pre.prefix_of(headers) {
            dst.extend_from_slice(block);
            skip = n;
        }
    }
    for (name, value) in headers.iter().skip(skip) {
        encode_field(dst, name, value);
    }
}

mod encoded {
    //! Pre-encoded response headers: a stored response's header fields HPACK-encoded once
    //! (the encoder never uses the dynamic table, so an encoding is valid on every
    //! connection), attached to responses as an extension.

    use bytes::{Bytes, BytesMut};
    use http::HeaderMap;
    use std::sync::Arc;

    /// The HPACK encoding of a header map's fields, in its iteration order, and what it was
    /// made from. The engine uses it only when the response's first fields are still these
    /// very values (the same allocations, which `values` keeps alive, so equal addresses mean
    /// equal bytes), in the same order, with the same sensitivity.
    #[derive(Clone, Debug)]
    pub struct Encoded(Arc<Inner>);

    #[derive(Debug)]
    struct Inner {
        block: Bytes,
        /// (name, value address, value length, sensitive) per field.
        fields: Vec<(http::HeaderName, usize, usize, bool)>,
        /// Keeps the values alive.
        _values: HeaderMap,
    }

    impl Encoded {
        /// Encodes `headers` (a clone shares their values).
        pub fn new(headers: &HeaderMap) -> Encoded {
            let mut block = BytesMut::new();
            let mut fields = Vec::with_capacity(headers.len());
            for (n, v) in headers.iter() {
                super::encode_field(&mut block, n, v);
                fields.push((
                    n.clone(),
                    v.as_bytes().as_ptr() as usize,
                    v.len(),
                    v.is_sensitive(),
                ));
            }
            Encoded(Arc::new(Inner {
                block: block.freeze(),
                fields,
                _values: headers.clone(),
            }))
        }

        /// The encoding of all the fields.
        pub fn block(&self) -> &[u8] {
            &self.0.block
        }

        /// If `headers` starts with exactly the encoded fields: their encoding and count.
        pub fn prefix_of(&self, headers: &HeaderMap) -> Option<(&[u8], usize)> {
            let mut it = headers.iter();
            for (name, addr, len, sensitive) in &self.0.fields {
                let (n, v) = it.next()?;
                let same = n == name
                    && v.as_bytes().as_ptr() as usize == *addr
                    && v.len() == *len
                    && v.is_sensitive() == *sensitive;
                if !same {
                    return None;
                }
            }
            Some((&self.0.block, self.0.fields.len()))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use http::HeaderValue;

        #[test]
        fn the_encoding_is_used_only_for_the_same_values_in_the_same_order() {
            let mut stored = HeaderMap::new();
            stored.insert("content-type", HeaderValue::from_static("text/plain"));
            stored.append("x-a", HeaderValue::from_str("1").unwrap());
            stored.append("x-a", HeaderValue::from_str("2").unwrap());
            let enc = Encoded::new(&stored);
            let mut expect = BytesMut::new();
            for (n, v) in stored.iter() {
                crate::hpack::Encoder::field(
                    &mut expect,
                    n.as_str().as_bytes(),
                    v.as_bytes(),
                    false,
                );
            }
            let mut resp = stored.clone();
            resp.insert("age", HeaderValue::from_static("3"));
            let (block, n) = enc.prefix_of(&resp).expect("a clone plus more fields");
            assert_eq!((block, n), (&expect[..], 3));
            // An equal value in a new allocation, a removed field, a sensitive flag: no.
            let mut changed = stored.clone();
            changed.insert("content-type", HeaderValue::from_str("text/plain").unwrap());
            assert!(enc.prefix_of(&changed).is_none());
            let mut removed = stored.clone();
            removed.remove("content-type");
            assert!(enc.prefix_of(&removed).is_none());
            let mut sensitive = stored.clone();
            sensitive
                .get_mut("content-type")
                .unwrap()
                .set_sensitive(true);
            assert!(enc.prefix_of(&sensitive).is_none());
        }
    }
}

/// The `date` response header value, formatted once per second per thread.
pub(crate) mod date {
    use http::HeaderValue;
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, Option<HeaderValue>)> = const { RefCell::new((0, None)) };
    }

    /// The current time as an HTTP date.
    pub(crate) fn now() -> HeaderValue {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with(|c| {
            let mut c = c.borrow_mut();
            if c.0 != secs || c.1.is_none() {
                let v = HeaderValue::from_str(&httpdate::fmt_http_date(now))
                    .expect("an HTTP date is a valid header value");
                *c = (secs, Some(v));
            }
            c.1.clone().expect("set above")
        })
    }

    #[cfg(test)]
    #[test]
    fn dates_are_http_dates() {
        let v = now();
        assert!(httpdate::parse_http_date(v.to_str().unwrap()).is_ok());
    }
}
