//! Request ids (issue 21): every request carries exactly one `X-Request-Id`, which the
//! backend receives, the client gets back and the access log records.
//!
//! An id from the client is kept only when the peer is a trusted proxy (the
//! `client_ip.trusted_proxies` that also decide `X-Forwarded-For`, see
//! [`crate::access::ClientIpRules`]) and the id is 1 to [`MAX_LEN`] bytes of a small charset
//! ([`valid`]); any other incoming id is **replaced**, like Envoy's default
//! (`preserve_external_request_id: false`): an untrusted client must not choose the id under
//! which its request appears in our logs and the backend's (it could reuse another request's
//! id to confuse an investigation, or carry quotes, spaces and control characters into log
//! lines that do not escape them). Bounded length and charset keep a trusted proxy's id as
//! harmless.
//!
//! A new id is 32 lowercase hex digits (128 bits) from the per-thread `fastrand` generator
//! (seeded from the OS): unique in practice, cheap (no system call, no lock), not a secret.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

/// The header.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest incoming id kept (from a trusted proxy).
pub const MAX_LEN: usize = 128;

/// Whether an incoming id may be kept: 1 to [`MAX_LEN`] bytes of `A-Z a-z 0-9 - _ . : = + /`
/// (UUIDs, hex and base64 ids, W3C trace ids), nothing that needs escaping in a log line.
pub fn valid(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:=+/".contains(b))
}

/// A new id: 32 lowercase hex digits of 128 random bits (the most significant first).
///
/// The digits are the value's own allocation ([`bytes::Bytes::from_owner`]): the id is
/// cloned into the request's map and kept for the response, and a value copied from a slice
/// (a `Vec`'s bytes) allocates again at its first clone.
pub fn generate() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n = fastrand::u128(..);
    let mut buf = [0u8; 32];
    for (pair, byte) in buf.chunks_exact_mut(2).zip(n.to_be_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(buf))
        .expect("hex digits are a valid header value")
}

/// Leaves exactly one id in `headers` and returns it: the incoming one when `trusted` sent
/// exactly one [`valid`] id, else a new one (every incoming value removed).
pub fn establish(headers: &mut HeaderMap, trusted: bool) -> HeaderValue {
    if trusted {
        let mut values = headers.get_all(&X_REQUEST_ID).iter();
        if let (Some(v), None) = (values.next(), values.next()) {
            if valid(v.as_bytes()) {
                return v.clone();
            }
        }
    }
    let id = generate();
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_REQUEST_ID.clone(), HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    /// The digits are those of the random number, most significant first (as the id was
    /// written before it had an allocation of its own).
    #[test]
    fn generated_ids_spell_their_number_in_order() {
        fastrand::seed(7);
        let n = fastrand::u128(..);
        fastrand::seed(7);
        assert_eq!(generate(), format!("{n:032x}").as_str());
    }

    #[test]
    fn generated_ids_are_32_hex_digits_and_differ() {
        let a = generate();
        let b = generate();
        assert_eq!(a.len(), 32);
        assert!(a
            .as_bytes()
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn a_trusted_valid_id_is_kept_anything_else_replaced() {
        let mut h = with(&[b"abc-123"]);
        assert_eq!(establish(&mut h, true), "abc-123");
        assert_eq!(h.get_all(&X_REQUEST_ID).iter().count(), 1);
        // Untrusted: replaced, even when valid.
        let mut h = with(&[b"abc-123"]);
        let id = establish(&mut h, false);
        assert_ne!(id, "abc-123");
        assert_eq!(h.get_all(&X_REQUEST_ID).iter().collect::<Vec<_>>(), [&id]);
        // Trusted but hostile, too long or repeated: replaced.
        for values in [
            vec![&b"a\"b"[..]],
            vec![&b"a b"[..]],
            vec![&b"a\tb"[..]],
            vec![&b""[..]],
            vec![&[b'a'; MAX_LEN + 1][..]],
            vec![&b"one"[..], &b"two"[..]],
        ] {
            let mut h = with(&values);
            let id = establish(&mut h, true);
            assert_eq!(id.len(), 32, "{values:?}");
            assert_eq!(h.get_all(&X_REQUEST_ID).iter().count(), 1);
        }
        let mut h = with(&[&[b'a'; MAX_LEN][..]]);
        assert_eq!(establish(&mut h, true).len(), MAX_LEN);
        // Absent: generated and added.
        let mut h = HeaderMap::new();
        let id = establish(&mut h, true);
        assert_eq!(h.get(&X_REQUEST_ID), Some(&id));
    }

    proptest::proptest! {
        /// Whatever a client sends, exactly one id is left, and it is valid.
        #[test]
        fn exactly_one_valid_id_is_left(
            values in proptest::collection::vec(proptest::collection::vec(0x20u8..0x7f, 0..200), 0..4),
            trusted: bool,
        ) {
            let mut h = HeaderMap::new();
            for v in &values {
                h.append(X_REQUEST_ID.clone(), HeaderValue::from_bytes(v).unwrap());
            }
            let id = establish(&mut h, trusted);
            proptest::prop_assert!(valid(id.as_bytes()));
            proptest::prop_assert_eq!(h.get_all(&X_REQUEST_ID).iter().collect::<Vec<_>>(), vec![&id]);
        }
    }
}
