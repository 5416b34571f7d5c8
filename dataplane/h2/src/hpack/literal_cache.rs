//! The string literals of recent response field values that repeat, kept encoded per thread.
//!
//! Huffman-coding costs ~15 instructions per octet, and most of a proxied response's fields
//! repeat from one response to the next: `server`, `content-type`, `date` (the same for a
//! second), `cache-control`. The encoder never uses the dynamic table (its blocks must not
//! depend on the connection), so each response coded them again: ~2,300 instructions of a
//! proxied HTTP/2 request (issue 23, docs/benchmarks.md). This cache keeps the literal
//! (length prefix and octets, exactly what `encode_str` writes) of the last value seen in
//! each of [`SLOTS`] slots, chosen by the value's length and three of its octets; a hit copies
//! it. Only the values of the fields [`cacheable`] names are kept: fields whose values repeat
//! and are no secrets (never a cookie, an authorization or a location), and never a field
//! sent as sensitive. Field names the static table lacks are kept too (`x-request-id` on
//! every response): a name is no secret.

use std::cell::RefCell;

use bytes::BytesMut;

/// Slots per thread.
pub(crate) const SLOTS: usize = 64;

/// Longest value kept (a date is 29 octets, a media type with a charset ~30).
pub(crate) const MAX_VALUE: usize = 40;

/// Shortest value worth a lookup: below it, coding is as cheap as the lookup.
pub(crate) const MIN_VALUE: usize = 4;

/// Whether the values of the field with this static table index are kept: `accept-ranges`,
/// `access-control-allow-origin`, `cache-control`, `content-encoding`, `content-language`,
/// `content-type`, `date`, `etag`, `expires`, `last-modified`, `server`, `vary`, `via`.
pub(crate) fn cacheable(name_index: usize) -> bool {
    matches!(
        name_index,
        18 | 20 | 24 | 26 | 27 | 31 | 33 | 34 | 36 | 44 | 54 | 59 | 60
    )
}

/// One value and its literal; `value_len == 0`: empty.
#[derive(Clone, Copy)]
struct Slot {
    value_len: u8,
    literal_len: u8,
    value: [u8; MAX_VALUE],
    /// Length prefix (one octet: at most 40 octets) and the octets.
    literal: [u8; MAX_VALUE + 1],
}

const EMPTY: Slot = Slot {
    value_len: 0,
    literal_len: 0,
    value: [0; MAX_VALUE],
    literal: [0; MAX_VALUE + 1],
};

thread_local! {
    static CACHE: RefCell<[Slot; SLOTS]> = const { RefCell::new([EMPTY; SLOTS]) };
}

/// The slot of `v` (`MIN_VALUE <= v.len() <= MAX_VALUE`): the values of one field differ in
/// length or in their first, middle or last octet, and successive dates share a slot.
fn slot_of(v: &[u8]) -> usize {
    let n = v.len();
    let mix = n.wrapping_mul(7)
        ^ usize::from(v[0])
        ^ (usize::from(v[n / 2]) << 2)
        ^ (usize::from(v[n - 1]) << 3);
    mix % SLOTS
}

/// Appends the literal of `value` to `dst`: the cached one when this thread encoded the same
/// value last in its slot, else the one `code` appends, which is then kept.
pub(crate) fn encode(dst: &mut BytesMut, value: &[u8], code: impl FnOnce(&mut BytesMut, &[u8])) {
    if !(MIN_VALUE..=MAX_VALUE).contains(&value.len()) {
        code(dst, value);
        return;
    }
    let i = slot_of(value);
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let slot = &mut cache[i];
        if usize::from(slot.value_len) == value.len() && slot.value[..value.len()] == *value {
            dst.extend_from_slice(&slot.literal[..usize::from(slot.literal_len)]);
            return;
        }
        let start = dst.len();
        code(dst, value);
        let literal = &dst[start..];
        // A literal of at most 40 octets has a one-octet prefix: it always fits.
        if literal.len() <= slot.literal.len() {
            slot.value_len = value.len() as u8;
            slot.value[..value.len()].copy_from_slice(value);
            slot.literal_len = literal.len() as u8;
            slot.literal[..literal.len()].copy_from_slice(literal);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in coder that marks its output, so a test sees whether the cache answered.
    fn mark(dst: &mut BytesMut, v: &[u8]) {
        dst.extend_from_slice(&[v.len() as u8]);
        dst.extend_from_slice(v);
    }

    fn encoded(v: &[u8], calls: &mut usize) -> Vec<u8> {
        let mut dst = BytesMut::from(&b"x"[..]);
        encode(&mut dst, v, |d, v| {
            *calls += 1;
            mark(d, v)
        });
        assert_eq!(dst[0], b'x');
        dst[1..].to_vec()
    }

    #[test]
    fn a_repeated_value_is_coded_once_and_answered_the_same() {
        let mut calls = 0;
        let v = b"Sat, 28 Nov 2026 10:44:40 GMT";
        let first = encoded(v, &mut calls);
        assert_eq!(calls, 1);
        assert_eq!(encoded(v, &mut calls), first);
        assert_eq!(calls, 1);
        // The next second's date takes the same slot.
        let next = b"Sat, 28 Nov 2026 10:44:41 GMT";
        assert_eq!(slot_of(v), slot_of(next));
        assert_eq!(encoded(next, &mut calls)[1..], next[..]);
        assert_eq!(calls, 2);
        assert_eq!(encoded(v, &mut calls)[1..], v[..]);
        assert_eq!(calls, 3);
    }

    #[test]
    fn values_out_of_range_are_always_coded() {
        let mut calls = 0;
        for v in [&b"abc"[..], &[b'a'; MAX_VALUE + 1]] {
            encoded(v, &mut calls);
            encoded(v, &mut calls);
        }
        assert_eq!(calls, 4);
    }

    #[test]
    fn colliding_values_never_answer_for_each_other() {
        // Many values, many per slot: each answer is its own value's coding.
        let mut rng = fastrand::Rng::with_seed(3);
        let values: Vec<Vec<u8>> = (0..2000)
            .map(|_| {
                let n = rng.usize(MIN_VALUE..=MAX_VALUE);
                (0..n).map(|_| rng.u8(b'a'..b'e')).collect()
            })
            .collect();
        let mut calls = 0;
        for _ in 0..3 {
            for v in &values {
                let mut expect = Vec::new();
                expect.push(v.len() as u8);
                expect.extend_from_slice(v);
                assert_eq!(encoded(v, &mut calls), expect);
            }
        }
    }

    #[test]
    fn a_field_answered_by_the_cache_is_the_field_as_coded() {
        use super::super::{encode_int, encode_str, static_name_index, Encoder};
        let fields: [(&[u8], &[u8]); 4] = [
            (b"date", b"Sat, 28 Nov 2026 10:44:40 GMT"),
            (b"server", b"nginx/1.22.1"),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"vary", b"{}<>|\\^~"),
        ];
        for (name, value) in fields {
            let mut expect = BytesMut::new();
            encode_int(&mut expect, static_name_index(name).unwrap(), 4, 0);
            encode_str(&mut expect, value);
            for _ in 0..3 {
                let mut got = BytesMut::new();
                Encoder::field(&mut got, name, value, false);
                assert_eq!(got, expect);
            }
            // Sensitive: never indexed, and never taken from or put in the cache.
            let mut got = BytesMut::new();
            Encoder::field(&mut got, name, value, true);
            assert_eq!(got[0] & 0xf0, 0x10);
            assert_eq!(got[1..], expect[1..]);
        }
    }

    #[test]
    fn a_literal_name_answered_by_the_cache_is_the_name_as_coded() {
        use super::super::{encode_raw, encode_str, Encoder};
        for (name, value) in [
            (
                &b"x-request-id"[..],
                &b"0123456789abcdef0123456789abcdef"[..],
            ),
            (b"x-cache", b"HIT"),
            (b"x-a", b"v"),
        ] {
            let mut expect = BytesMut::new();
            expect.extend_from_slice(&[0]);
            encode_str(&mut expect, name);
            // the request id's value is written as it is (`raw_value`)
            if name == b"x-request-id" {
                encode_raw(&mut expect, value);
            } else {
                encode_str(&mut expect, value);
            }
            for sensitive in [false, false, true] {
                let mut got = BytesMut::new();
                Encoder::field(&mut got, name, value, sensitive);
                assert_eq!(got[0], if sensitive { 0x10 } else { 0 });
                assert_eq!(got[1..], expect[1..]);
            }
        }
    }

    #[test]
    fn only_repeating_non_secret_fields_are_kept() {
        let kept = |name: &[u8]| super::super::static_name_index(name).is_some_and(cacheable);
        for name in [
            &b"server"[..],
            b"date",
            b"content-type",
            b"cache-control",
            b"etag",
        ] {
            assert!(kept(name), "{}", String::from_utf8_lossy(name));
        }
        for name in [
            &b"set-cookie"[..],
            b"cookie",
            b"authorization",
            b"proxy-authorization",
            b"www-authenticate",
            b"location",
            b"content-length",
            b"x-request-id",
        ] {
            assert!(!kept(name), "{}", String::from_utf8_lossy(name));
        }
    }
}
