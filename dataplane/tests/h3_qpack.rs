//! The vendored h3's response-head QPACK encoder (vendor/README.md, "A response head is
//! encoded from its HeaderMap in place"): what `send_response` writes is what upstream's
//! encoder wrote, byte for byte, for every head without `x-request-id`; with one, the same
//! fields decode back and the id's value is written as it is (H bit clear, its length as a
//! 7-bit prefix integer, then its octets), for any value: lengths around the prefix integer's
//! boundaries (126, 127, 128, 254, 255, 256, ...) and octets 0x80-0xff.

use bytes::BufMut;
use h3::sweety_qpack::{decode, encode_response, encode_response_upstream};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;

/// Names of every kind the encoder tells apart: whole fields in the static table
/// (`content-length: 0`, `accept-ranges: bytes`), names in it (`content-type`, `date`), names
/// not in it (with the name's 3-bit length prefix at 6, 7 and 8 octets), and the request id.
const NAMES: &[&str] = &[
    "content-type",
    "content-length",
    "accept-ranges",
    "date",
    "etag",
    "last-modified",
    "cache-control",
    "vary",
    "set-cookie",
    "server",
    "alt-svc",
    "x-cache",
    "abcdef",
    "abcdefg",
    "abcdefgh",
    "x-request-id",
];

/// Lengths where a value's 7-bit prefix integer changes form, and small ones.
const EDGES: &[usize] = &[0, 1, 2, 31, 32, 33, 126, 127, 128, 129, 254, 255, 256, 300];

/// A field value of `len` octets: any octet a `HeaderValue` may hold (tab, 0x20-0x7e,
/// 0x80-0xff), or only those with short Huffman codes (hex digits, as a generated id).
fn value(len: usize, seed: u64, hex: bool) -> HeaderValue {
    let mut x = seed | 1;
    let v: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if hex {
                b"0123456789abcdef"[(x % 16) as usize]
            } else {
                // 0x09, 0x20-0x7e, 0x80-0xff
                match (x % 224) as u8 {
                    0 => b'\t',
                    b @ 1..=95 => 0x1f + b,
                    b => 0x80 + (b - 96),
                }
            }
        })
        .collect();
    HeaderValue::from_bytes(&v).expect("a valid field value")
}

/// The 7-bit prefix integer of a string length with the H bit clear (RFC 9204 §4.1.1 and
/// §4.1.2; RFC 7541 §5.1), written here independently of h3.
fn raw_length(len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    if len < 127 {
        out.put_u8(len as u8);
        return out;
    }
    out.put_u8(127);
    let mut rest = len - 127;
    while rest >= 128 {
        out.put_u8((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.put_u8(rest as u8);
    out
}

/// Encodes `head` both ways and checks them against each other and the decoder.
fn check(status: StatusCode, head: &HeaderMap) {
    let (ours, size) = encode_response(status, head).expect("encodes");
    let (theirs, their_size) = encode_response_upstream(status, head.clone()).expect("encodes");
    assert_eq!(size, their_size, "the field section size");
    let (fields, decoded_size) = decode(&ours).expect("decodes");
    assert_eq!(decoded_size, size);
    let mut expect = vec![(b":status".to_vec(), status.as_str().as_bytes().to_vec())];
    expect.extend(
        head.iter()
            .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())),
    );
    assert_eq!(fields, expect, "the fields decode back in order");
    assert_eq!(decode(&theirs).expect("decodes").0, expect);
    if !head.contains_key("x-request-id") {
        assert_eq!(ours, theirs, "byte for byte upstream's encoding");
    }
}

#[test]
fn a_request_id_is_written_as_it_is_at_any_length_and_octet() {
    for &len in EDGES {
        for hex in [true, false] {
            let id = value(len, len as u64 + 7, hex);
            let mut head = HeaderMap::new();
            head.insert("x-request-id", id.clone());
            check(StatusCode::OK, &head);
            let (ours, _) = encode_response(StatusCode::OK, &head).unwrap();
            // The block ends with the value's length, H bit clear, then its octets.
            let mut tail = raw_length(len);
            tail.extend_from_slice(id.as_bytes());
            assert!(
                ours.ends_with(&tail),
                "len {len}: {:02x?} does not end raw",
                &ours[..]
            );
            // Before it: the prefix, `:status: 200` (static index 25) and the name as
            // upstream writes it (a literal name, Huffman-coded: shorter).
            let (theirs, _) = encode_response_upstream(StatusCode::OK, head.clone()).unwrap();
            let name_end = ours.len() - tail.len();
            assert_eq!(ours[..name_end], theirs[..name_end], "len {len}");
            assert_eq!(ours[..3], [0, 0, 0xc0 | 25]);
        }
    }
    // A generated id (32 hex digits), as the dataplane sends it: 9 octets more than coded.
    let mut head = HeaderMap::new();
    head.insert("x-request-id", value(32, 99, true));
    let (ours, _) = encode_response(StatusCode::OK, &head).unwrap();
    let (theirs, _) = encode_response_upstream(StatusCode::OK, head.clone()).unwrap();
    let coded = sweety_h2::hpack::huffman::encoded_len(head["x-request-id"].as_bytes());
    assert!(coded < 32);
    assert_eq!(
        ours.len(),
        theirs.len() + 32 - coded,
        "32 raw octets, not {coded} coded"
    );
    // Another name with the same value is still Huffman-coded, as upstream does.
    let mut other = HeaderMap::new();
    other.insert("x-trace-id", value(32, 99, true));
    check(StatusCode::OK, &other);
}

#[test]
fn a_typical_static_response_head_is_upstreams_encoding() {
    let mut head = HeaderMap::new();
    head.insert("content-type", HeaderValue::from_static("text/html"));
    head.insert("content-length", HeaderValue::from_static("102400"));
    head.insert("accept-ranges", HeaderValue::from_static("bytes"));
    head.insert(
        "last-modified",
        HeaderValue::from_static("Sat, 28 Nov 2026 10:00:00 GMT"),
    );
    head.insert("etag", HeaderValue::from_static("\"6929a0e0-19000\""));
    head.append("set-cookie", HeaderValue::from_static("a=1"));
    head.append("set-cookie", HeaderValue::from_static("b=2"));
    for status in [200, 206, 304, 404, 500, 503, 299, 599] {
        check(StatusCode::from_u16(status).unwrap(), &head);
    }
    check(StatusCode::OK, &HeaderMap::new());
    let mut zero = HeaderMap::new();
    zero.insert("content-length", HeaderValue::from_static("0"));
    check(StatusCode::NO_CONTENT, &zero);
    let mut with_id = head.clone();
    with_id.insert("x-request-id", value(32, 5, true));
    check(StatusCode::OK, &with_id);
}

fn any_head() -> impl Strategy<Value = (u16, Vec<(usize, usize, u64, bool)>)> {
    let len = prop_oneof![
        proptest::sample::select(EDGES.to_vec()),
        0usize..400,
        Just(16_383 + 127),
        Just(16_384 + 127),
    ];
    (
        proptest::sample::select(vec![200u16, 204, 206, 301, 304, 404, 429, 500, 503]),
        proptest::collection::vec((0..NAMES.len(), len, any::<u64>(), any::<bool>()), 0..12),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any head: the fields decode back in order, the size is upstream's, and without a
    /// request id the octets are upstream's.
    #[test]
    fn any_head_decodes_back_and_matches_upstream((status, fields) in any_head()) {
        let mut head = HeaderMap::new();
        for (name, len, seed, hex) in fields {
            head.append(HeaderName::from_static(NAMES[name]), value(len, seed, hex));
        }
        check(StatusCode::from_u16(status).unwrap(), &head);
        head.remove("x-request-id");
        check(StatusCode::from_u16(status).unwrap(), &head);
    }
}
