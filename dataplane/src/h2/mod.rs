//! Sweety's own server-side HTTP/2 (RFC 9113) connection layer, used for h2 (TLS with ALPN)
//! and h2c (prior knowledge) connections when `limits.http2_engine` is `sweety` (the default;
//! `hyper` selects hyper's). HTTP/1.1 stays on hyper.
//!
//! * [`frame`]: frame header, types, flags, error codes, SETTINGS, frame writers.
//! * [`body`]: request bodies fed from DATA frames, the stream-to-connection wake-up path,
//!   and extended CONNECT (RFC 8441) tunnels.
//! * [`conn`]: the connection driver: state machine, flow control, limits, batching.
//!
//! Headers are (de)compressed by [`crate::hpack`]; every request goes through
//! `pipeline::handle` like on every other protocol.

pub mod body;
pub mod conn;
pub mod frame;

pub use body::{Upgrade, Upgraded};
pub use conn::{serve, serve_read, H2Error, Settings};
pub use encoded::Encoded;

/// HPACK-encodes one field of an `http` header map (name, value, sensitivity) into `dst`:
/// response heads, trailers and pre-encoded cache entries all go through here.
fn encode_field(dst: &mut bytes::BytesMut, name: &http::HeaderName, value: &http::HeaderValue) {
    crate::hpack::Encoder::field(
        dst,
        name.as_str().as_bytes(),
        value.as_bytes(),
        value.is_sensitive(),
    );
}

/// HPACK-encodes a response's fields (after `:status`): a cache hit's stored head first
/// (`stored`), then the fields of `headers`. A cached response's stored fields come
/// pre-encoded either way (as a [`crate::cache::StoredHead`], or as an [`Encoded`] in
/// `extensions` that the map still starts with); the bytes are the same as encoding the map a
/// hit has on every other path, field by field.
pub(crate) fn encode_fields(
    dst: &mut bytes::BytesMut,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
    stored: Option<&crate::cache::StoredHead>,
) {
    let mut skip = 0;
    if let Some(head) = stored {
        // The fields a hit's map starts with: the stored ones, `age`, `x-cache`.
        dst.extend_from_slice(head.block());
        hit_fields(dst, head.age(), head.x_cache());
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

/// Appends the HPACK encoding of `age: {age}` and `x-cache: {how}`. Hits within a second of
/// each other mostly have the same pair: its encoding is kept per thread.
fn hit_fields(dst: &mut bytes::BytesMut, age: u64, how: &'static str) {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<(u64, &'static str, Vec<u8>)> = const { RefCell::new((0, "", Vec::new())) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != age || last.1 != how || last.2.is_empty() {
            let mut b = bytes::BytesMut::new();
            let mut digits = [0u8; 20];
            crate::hpack::Encoder::field(&mut b, b"age", decimal(age, &mut digits), false);
            crate::hpack::Encoder::field(&mut b, b"x-cache", how.as_bytes(), false);
            *last = (age, how, b.to_vec());
        }
        dst.extend_from_slice(&last.2);
    });
}

/// `n` in decimal ASCII, written into `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
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
    pub fn now() -> HeaderValue {
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

#[cfg(test)]
mod tests {
    #[test]
    fn hit_fields_are_encoded_as_a_map_would_have_them() {
        for (age, how) in [
            (0, "HIT"),
            (7, "HIT"),
            (7, "HIT"),
            (7, "STALE"),
            (123_456, "HIT"),
            (0, "HIT"),
        ] {
            let mut want = bytes::BytesMut::new();
            let mut map = http::HeaderMap::new();
            map.insert(http::header::AGE, http::HeaderValue::from(age));
            map.insert("x-cache", http::HeaderValue::from_static(how));
            for (n, v) in &map {
                super::encode_field(&mut want, n, v);
            }
            let mut got = bytes::BytesMut::from(&b"prefix"[..]);
            super::hit_fields(&mut got, age, how);
            assert_eq!(&got[..6], b"prefix");
            assert_eq!(&got[6..], &want[..], "{age} {how}");
        }
    }
}
