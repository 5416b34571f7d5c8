//! Tests of the HPACK codec: every RFC 7541 Appendix C example, table eviction and size
//! updates, every error path, and seeded randomized round trips.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

type Owned = Vec<(Vec<u8>, Vec<u8>, bool)>;

fn decode_all(d: &mut Decoder, block: &[u8], max: usize) -> Result<Owned, HpackError> {
    let mut out = Vec::new();
    d.decode(block, max, |f| {
        out.push((f.name.to_vec(), f.value.to_vec(), f.sensitive))
    })?;
    Ok(out)
}

fn fields(list: &[(&str, &str)]) -> Owned {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec(), false))
        .collect()
}

fn table(d: &Decoder) -> Vec<(String, String)> {
    d.dynamic_entries()
        .map(|(n, v)| {
            (
                String::from_utf8(n.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn owned_table(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

const BIG: usize = 1 << 20;

#[test]
fn c2_field_representations() {
    // C.2.1 literal with indexing.
    let mut d = Decoder::new();
    let got = decode_all(
        &mut d,
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"),
        BIG,
    )
    .unwrap();
    assert_eq!(got, fields(&[("custom-key", "custom-header")]));
    assert_eq!(table(&d), owned_table(&[("custom-key", "custom-header")]));
    assert_eq!(d.table_size(), 55);

    // C.2.2 literal without indexing.
    let mut d = Decoder::new();
    let got = decode_all(&mut d, &hex("040c 2f73 616d 706c 652f 7061 7468"), BIG).unwrap();
    assert_eq!(got, fields(&[(":path", "/sample/path")]));
    assert_eq!(d.table_size(), 0);

    // C.2.3 literal never indexed.
    let mut d = Decoder::new();
    let got = decode_all(
        &mut d,
        &hex("1008 7061 7373 776f 7264 0673 6563 7265 74"),
        BIG,
    )
    .unwrap();
    assert_eq!(got, vec![(b"password".to_vec(), b"secret".to_vec(), true)]);
    assert_eq!(d.table_size(), 0);

    // C.2.4 indexed.
    let mut d = Decoder::new();
    assert_eq!(
        decode_all(&mut d, &hex("82"), BIG).unwrap(),
        fields(&[(":method", "GET")])
    );
    assert_eq!(d.table_size(), 0);
}

/// C.3 (plain) and C.4 (Huffman): three requests on one connection.
fn requests(blocks: [&str; 3]) {
    let mut d = Decoder::new();
    let got = decode_all(&mut d, &hex(blocks[0]), BIG).unwrap();
    assert_eq!(
        got,
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(table(&d), owned_table(&[(":authority", "www.example.com")]));
    assert_eq!(d.table_size(), 57);

    let got = decode_all(&mut d, &hex(blocks[1]), BIG).unwrap();
    assert_eq!(
        got,
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ])
    );
    assert_eq!(
        table(&d),
        owned_table(&[
            ("cache-control", "no-cache"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(d.table_size(), 110);

    let got = decode_all(&mut d, &hex(blocks[2]), BIG).unwrap();
    assert_eq!(
        got,
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ])
    );
    assert_eq!(
        table(&d),
        owned_table(&[
            ("custom-key", "custom-value"),
            ("cache-control", "no-cache"),
            (":authority", "www.example.com"),
        ])
    );
    assert_eq!(d.table_size(), 164);
}

#[test]
fn c3_requests_without_huffman() {
    requests([
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ]);
}

#[test]
fn c4_requests_with_huffman() {
    requests([
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ]);
}

/// C.5 (plain) and C.6 (Huffman): three responses with a 256-octet table, with evictions.
fn responses(blocks: [&str; 3]) {
    let mut d = Decoder::with_table_size(256);
    let first = [
        (":status", "302"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("location", "https://www.example.com"),
    ];
    assert_eq!(
        decode_all(&mut d, &hex(blocks[0]), BIG).unwrap(),
        fields(&first)
    );
    assert_eq!(
        table(&d),
        owned_table(&[
            ("location", "https://www.example.com"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("cache-control", "private"),
            (":status", "302"),
        ])
    );
    assert_eq!(d.table_size(), 222);

    let mut second = first;
    second[0] = (":status", "307");
    assert_eq!(
        decode_all(&mut d, &hex(blocks[1]), BIG).unwrap(),
        fields(&second)
    );
    assert_eq!(
        table(&d),
        owned_table(&[
            (":status", "307"),
            ("location", "https://www.example.com"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("cache-control", "private"),
        ])
    );
    assert_eq!(d.table_size(), 222);

    let cookie = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    assert_eq!(
        decode_all(&mut d, &hex(blocks[2]), BIG).unwrap(),
        fields(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", "https://www.example.com"),
            ("content-encoding", "gzip"),
            ("set-cookie", cookie),
        ])
    );
    assert_eq!(
        table(&d),
        owned_table(&[
            ("set-cookie", cookie),
            ("content-encoding", "gzip"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
        ])
    );
    assert_eq!(d.table_size(), 215);
}

#[test]
fn c5_responses_without_huffman() {
    responses([
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
         2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
         6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d
         54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049
         5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e
         3d31",
    ]);
}

#[test]
fn c6_responses_with_huffman() {
    responses([
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
         2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
         77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
         9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ]);
}

#[test]
fn integer_examples_c1() {
    // C.1.1: 10 on a 5-bit prefix; C.1.2: 1337 on a 5-bit prefix; C.1.3: 42 on 8 bits.
    for (value, prefix, bytes) in [
        (10, 5, vec![0x0a]),
        (1337, 5, vec![0x1f, 0x9a, 0x0a]),
        (42, 8, vec![0x2a]),
    ] {
        let mut dst = BytesMut::new();
        encode_int(&mut dst, value, prefix, 0);
        assert_eq!(&dst[..], &bytes[..]);
        let mut pos = 0;
        assert_eq!(decode_int(&bytes, &mut pos, prefix).unwrap(), value);
        assert_eq!(pos, bytes.len());
    }
    // Prefix bits above the prefix are ignored by the decoder.
    let mut pos = 0;
    assert_eq!(decode_int(&[0xea], &mut pos, 5).unwrap(), 10);
    // The largest accepted value round-trips.
    let mut dst = BytesMut::new();
    encode_int(&mut dst, u32::MAX as usize, 5, 0);
    let mut pos = 0;
    assert_eq!(decode_int(&dst, &mut pos, 5).unwrap(), u32::MAX as usize);
}

#[test]
fn entry_larger_than_table_empties_it() {
    let mut d = Decoder::with_table_size(100);
    // custom-key: custom-header (55 octets) fits.
    decode_all(
        &mut d,
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"),
        BIG,
    )
    .unwrap();
    assert_eq!(d.table_size(), 55);
    // A second entry of 55 evicts the first.
    let got = decode_all(
        &mut d,
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6573"),
        BIG,
    )
    .unwrap();
    assert_eq!(got, fields(&[("custom-key", "custom-heades")]));
    assert_eq!(table(&d), owned_table(&[("custom-key", "custom-heades")]));
    // A 101-octet entry does not fit: the table is emptied and nothing is added, but the
    // field itself is still emitted.
    let mut block = hex("40 0a 6375 7374 6f6d 2d6b 6579 3b");
    block.extend_from_slice(&[b'x'; 59]);
    let got = decode_all(&mut d, &block, BIG).unwrap();
    assert_eq!(got, vec![(b"custom-key".to_vec(), vec![b'x'; 59], false)]);
    assert_eq!(d.table_size(), 0);
    assert_eq!(table(&d), Vec::<(String, String)>::new());
}

#[test]
fn indexed_name_evicted_by_its_own_insertion() {
    // Table of 64 octets holding custom-key: custom-header (55). A literal with indexing
    // naming dynamic entry 62 evicts that entry to make room, yet must keep its name.
    let mut d = Decoder::with_table_size(64);
    decode_all(
        &mut d,
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"),
        BIG,
    )
    .unwrap();
    let got = decode_all(&mut d, &hex("7e 03 616263"), BIG).unwrap();
    assert_eq!(got, fields(&[("custom-key", "abc")]));
    assert_eq!(table(&d), owned_table(&[("custom-key", "abc")]));
    assert_eq!(d.table_size(), 45);
    // And the new entry is addressable.
    assert_eq!(
        decode_all(&mut d, &hex("be"), BIG).unwrap(),
        fields(&[("custom-key", "abc")])
    );
}

#[test]
fn size_updates() {
    let mut d = Decoder::new();
    decode_all(
        &mut d,
        &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
        BIG,
    )
    .unwrap();
    decode_all(&mut d, &hex("5808 6e6f 2d63 6163 6865"), BIG).unwrap();
    assert_eq!(d.table_size(), 110);
    // Update to 60 evicts the older entry; two updates in a row at the start are fine.
    let got = decode_all(&mut d, &hex("3f21 3f1d be"), BIG).unwrap();
    assert_eq!(got, fields(&[("cache-control", "no-cache")]));
    assert_eq!(d.table_size(), 53);
    // Update to 0 empties the table; index 62 is then invalid.
    decode_all(&mut d, &hex("20"), BIG).unwrap();
    assert_eq!(d.table_size(), 0);
    assert_eq!(
        decode_all(&mut d, &hex("be"), BIG),
        Err(HpackError::InvalidIndex {
            index: 62,
            dynamic_len: 0
        })
    );

    // An update up to the advertised limit is fine, above it is an error.
    let mut d = Decoder::new();
    decode_all(&mut d, &hex("3fe11f"), BIG).unwrap(); // 4096
    assert_eq!(
        decode_all(&mut d, &hex("3fe21f"), BIG),
        Err(HpackError::SizeUpdateTooLarge {
            size: 4097,
            max: 4096
        })
    );
    let mut d = Decoder::new();
    d.set_max_allowed_table_size(8192);
    decode_all(&mut d, &hex("3fe13f 82"), BIG).unwrap(); // 8192
}

#[test]
fn size_update_after_field_is_an_error() {
    let mut d = Decoder::new();
    assert_eq!(
        decode_all(&mut d, &hex("82 20"), BIG),
        Err(HpackError::SizeUpdateNotAtStart)
    );
    assert_eq!(
        decode_all(&mut d, &hex("82"), BIG),
        Err(HpackError::Poisoned)
    );
}

#[test]
fn lowered_limit_requires_an_update() {
    let mut d = Decoder::new();
    d.set_max_allowed_table_size(100);
    assert_eq!(
        decode_all(&mut d, &hex("82"), BIG),
        Err(HpackError::SizeUpdateMissing { max: 100 })
    );

    let mut d = Decoder::new();
    d.set_max_allowed_table_size(100);
    assert_eq!(
        decode_all(&mut d, &hex(""), BIG),
        Err(HpackError::SizeUpdateMissing { max: 100 })
    );

    // Lowered to 50 then raised to 100: the smallest value must be signalled.
    let mut d = Decoder::new();
    d.set_max_allowed_table_size(50);
    d.set_max_allowed_table_size(100);
    assert_eq!(
        decode_all(&mut d, &hex("3f45 82"), BIG), // update to 100
        Err(HpackError::SizeUpdateMissing { max: 50 })
    );

    let mut d = Decoder::new();
    d.set_max_allowed_table_size(100);
    assert_eq!(
        decode_all(&mut d, &hex("3f2b 82"), BIG).unwrap(),
        fields(&[(":method", "GET")])
    );
    // Once signalled, later blocks need no update.
    assert_eq!(
        decode_all(&mut d, &hex("82"), BIG).unwrap(),
        fields(&[(":method", "GET")])
    );
}

#[test]
fn truncated_blocks() {
    let cases = [
        "ff",        // indexed, integer continuation missing
        "ff80",      // continuation byte says more follows
        "40",        // literal with indexing, name string missing
        "400a 6375", // name shorter than its length
        "4001 61",   // value missing
        "0405 2f73", // value shorter than its length
        "3f",        // size update integer missing
        "00 ff",     // name length integer missing its continuation
    ];
    for case in cases {
        let mut d = Decoder::new();
        assert_eq!(
            decode_all(&mut d, &hex(case), BIG),
            Err(HpackError::Truncated),
            "{case}"
        );
    }
}

#[test]
fn integer_overflow_and_invalid_indexes() {
    let invalid = |index, dynamic_len| HpackError::InvalidIndex { index, dynamic_len };
    // (a block decoded first on the same decoder, the block, its error)
    let cases = [
        // Six continuation octets.
        ("", "ff 80 80 80 80 80 01", HpackError::IntegerOverflow),
        // Five octets but above u32::MAX.
        ("", "ff ff ff ff ff 7f", HpackError::IntegerOverflow),
        // A string length that overflows.
        ("", "00 7f ff ff ff ff 7f", HpackError::IntegerOverflow),
        // Index 0, and the first index past the static table with an empty dynamic table.
        ("", "80", invalid(0, 0)),
        ("", "be", invalid(62, 0)),
        // Literal with an indexed name past the dynamic table.
        ("4001 61 01 62", "7f00 0161", invalid(63, 1)),
        ("", "0f30 0161", invalid(63, 0)),
    ];
    for (before, case, err) in cases {
        let mut d = Decoder::new();
        decode_all(&mut d, &hex(before), BIG).unwrap();
        assert_eq!(decode_all(&mut d, &hex(case), BIG), Err(err), "{case}");
    }
}

#[test]
fn huffman_errors_in_blocks() {
    let cases = [
        ("0084 ffffffff 0161", HpackError::HuffmanEos),
        ("0082 1fff 0161", HpackError::HuffmanPaddingTooLong),
        ("0001 61 8118", HpackError::HuffmanPaddingNotOnes),
    ];
    for (case, err) in cases {
        let mut d = Decoder::new();
        assert_eq!(
            decode_all(&mut d, &hex(case), BIG),
            Err(err.clone()),
            "{case}"
        );
        assert_eq!(
            decode_all(&mut d, &hex("82"), BIG),
            Err(HpackError::Poisoned)
        );
        assert!(err.is_connection_error());
    }
}

#[test]
fn list_too_large_keeps_the_table_in_sync() {
    let mut d = Decoder::new();
    // :method GET (42) + :path / (38) = 80, then a literal with indexing that is dropped
    // from the output but must still land in the table.
    let block = hex("82 84 400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572");
    let mut out = Vec::new();
    let err = d
        .decode(&block, 80, |f| out.push(f.name.to_vec()))
        .unwrap_err();
    assert_eq!(err, HpackError::ListTooLarge { max: 80 });
    assert!(!err.is_connection_error());
    assert_eq!(out, vec![b":method".to_vec(), b":path".to_vec()]);
    assert_eq!(table(&d), owned_table(&[("custom-key", "custom-header")]));
    // The decoder is still usable and the entry is there.
    assert_eq!(
        decode_all(&mut d, &hex("be"), 80).unwrap(),
        fields(&[("custom-key", "custom-header")])
    );
    // Exactly at the limit is fine.
    assert_eq!(
        decode_all(&mut d, &hex("8284"), 80).unwrap(),
        fields(&[(":method", "GET"), (":path", "/")])
    );
    // Indexed fields count too: many references to one big entry.
    let mut d = Decoder::new();
    let mut block = hex("400a 6375 7374 6f6d 2d6b 6579 7fe9 06");
    block.extend_from_slice(&[b'v'; 1000]);
    decode_all(&mut d, &block, BIG).unwrap();
    let refs = vec![0xbe; 100];
    assert_eq!(
        decode_all(&mut d, &refs, 16 * 1024),
        Err(HpackError::ListTooLarge { max: 16 * 1024 })
    );
    assert_eq!(
        decode_all(&mut d, &refs[..10], 16 * 1024).unwrap().len(),
        10
    );
}

#[test]
fn encoder_first_block_shrinks_the_peer_table_once() {
    let mut e = Encoder::new();
    let mut dst = BytesMut::new();
    e.begin_block(&mut dst);
    Encoder::status(&mut dst, 200);
    assert_eq!(&dst[..], &[0x20, 0x88]);
    dst.clear();
    e.begin_block(&mut dst);
    Encoder::status(&mut dst, 200);
    assert_eq!(&dst[..], &[0x88]);
}

#[test]
fn encoder_status() {
    for (status, index) in [
        (200, 8),
        (204, 9),
        (206, 10),
        (304, 11),
        (400, 12),
        (404, 13),
        (500, 14),
    ] {
        let mut dst = BytesMut::new();
        Encoder::status(&mut dst, status);
        assert_eq!(&dst[..], &[0x80 | index]);
    }
    for status in [
        100, 101, 201, 301, 302, 307, 403, 429, 502, 503, 999, 1000, 65535, 0,
    ] {
        let mut dst = BytesMut::new();
        Encoder::status(&mut dst, status);
        assert_eq!(dst[0], 0x08, "literal without indexing, name :status");
        let got = decode_all(&mut Decoder::new(), &dst, BIG).unwrap();
        assert_eq!(
            got,
            vec![(b":status".to_vec(), status.to_string().into_bytes(), false)]
        );
    }
    // "302" is shorter in Huffman (C.6.1).
    let mut dst = BytesMut::new();
    Encoder::status(&mut dst, 302);
    assert_eq!(&dst[..], &hex("08 82 6402")[..]);
}

#[test]
fn encoder_fields() {
    let enc = |name: &str, value: &str, sensitive: bool| {
        let mut dst = BytesMut::new();
        Encoder::field(&mut dst, name.as_bytes(), value.as_bytes(), sensitive);
        dst.to_vec()
    };
    // Whole field in the static table.
    assert_eq!(enc("accept-encoding", "gzip, deflate", false), [0x90]);
    assert_eq!(enc(":path", "/index.html", false), [0x85]);
    // Static name, literal value without indexing (Huffman, as in C.4.2).
    assert_eq!(
        enc("cache-control", "no-cache", false),
        hex("0f09 86 a8eb 1064 9cbf")
    );
    // Static name, value not shorter in Huffman: raw.
    assert_eq!(enc("content-length", "", false), hex("0f0d 00"));
    // Literal name (Huffman-coded "custom-key", as in C.4.3).
    assert_eq!(
        enc("custom-key", "custom-value", false),
        hex("00 88 25a8 49e9 5ba9 7d7f 89 25a8 49e9 5bb8 e8b4 bf")
    );
    // The request id's value: never Huffman-coded (a random value, coded shorter by 9 of its
    // 32 octets at ~15 instructions per octet); its name as any other literal name.
    let id = "0123456789abcdef0123456789abcdef";
    let mut expect = BytesMut::new();
    expect.put_u8(0);
    encode_str(&mut expect, b"x-request-id");
    // length 32 without the Huffman bit, then the digits as they are
    expect.put_u8(0x20);
    expect.extend_from_slice(id.as_bytes());
    for sensitive in [false, true] {
        let got = enc("x-request-id", id, sensitive);
        assert_eq!(got[0], if sensitive { 0x10 } else { 0 });
        assert_eq!(got[1..], expect[1..]);
        let back = decode_all(&mut Decoder::new(), &got, BIG).unwrap();
        assert_eq!(
            back,
            vec![(b"x-request-id".to_vec(), id.as_bytes().to_vec(), sensitive)]
        );
    }
    // Any value of it (a trusted proxy's id, up to 128 octets, or longer and of any octets
    // here): the length's prefix integer continues past 126, and octets of 0x80 and above
    // go as they are; each decodes back (session 21's review, L4-1).
    for value in [
        vec![b'a'; 126],
        vec![b'a'; 127],
        vec![b'a'; 128],
        vec![b'z'; 300],
        (0x80..=0xff).collect::<Vec<u8>>(),
    ] {
        let mut got = BytesMut::new();
        Encoder::field(&mut got, b"x-request-id", &value, false);
        let back = decode_all(&mut Decoder::new(), &got, BIG).unwrap();
        assert_eq!(back, vec![(b"x-request-id".to_vec(), value.clone(), false)]);
        let mut raw = BytesMut::new();
        encode_raw(&mut raw, &value);
        assert!(got.ends_with(&raw), "the value is written as it is");
    }
    // Other values of literal names are still coded (the custom-key case above), also an
    // id under another name.
    assert_eq!(
        enc("x-trace-id", id, false)[1..],
        {
            let mut e = BytesMut::new();
            e.put_u8(0);
            encode_str(&mut e, b"x-trace-id");
            encode_str(&mut e, id.as_bytes());
            e.to_vec()
        }[1..]
    );
    // Sensitive: never indexed, even when the whole field is in the static table.
    assert_eq!(enc("accept-encoding", "gzip, deflate", true)[0], 0x1f);
    let got = decode_all(
        &mut Decoder::new(),
        &enc("authorization", "secret", true),
        BIG,
    )
    .unwrap();
    assert_eq!(
        got,
        vec![(b"authorization".to_vec(), b"secret".to_vec(), true)]
    );
    let got = decode_all(&mut Decoder::new(), &enc("x-token", "abc", true), BIG).unwrap();
    assert_eq!(got, vec![(b"x-token".to_vec(), b"abc".to_vec(), true)]);
}

#[test]
fn static_name_index_matches_the_table() {
    for (name, _) in STATIC.iter() {
        let first = STATIC.iter().position(|(n, _)| n == name).unwrap() + 1;
        assert_eq!(
            static_name_index(name),
            Some(first),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    assert_eq!(static_name_index(b"x-custom"), None);
    assert_eq!(static_name_index(b"Content-Type"), None);
    assert_eq!(static_name_index(b""), None);
}

/// The slot look-up answers as a scan of the table for names near the table's: each name
/// with one octet changed (every position, a few values), cut short, or made longer.
#[test]
fn static_name_index_is_a_scan_of_the_table() {
    let scan = |name: &[u8]| STATIC.iter().position(|(n, _)| *n == name).map(|i| i + 1);
    let mut tried = 0;
    for (name, _) in STATIC.iter() {
        let mut near = vec![name[..name.len() - 1].to_vec(), [*name, b"s"].concat()];
        for i in 0..name.len() {
            for b in [b'a', b'e', b'-', b'A', b':', 0, 0xff] {
                let mut n = name.to_vec();
                n[i] = b;
                near.push(n);
            }
        }
        for n in near {
            assert_eq!(
                static_name_index(&n),
                scan(&n),
                "{:?}",
                String::from_utf8_lossy(&n)
            );
            tried += 1;
        }
    }
    assert_eq!(tried, 4_476, "names tried");
}

/// Seeded randomized round trip: blocks from [`Encoder`] decode to the same fields, and the
/// encoder never touches the decoder's dynamic table.
#[test]
fn random_round_trip() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_47ac);
    let names: Vec<&[u8]> = STATIC.iter().map(|(n, _)| *n).collect();
    let mut e = Encoder::new();
    let mut d = Decoder::new();
    for round in 0..2000 {
        let mut dst = BytesMut::new();
        e.begin_block(&mut dst);
        let status = rng.u16(..);
        Encoder::status(&mut dst, status);
        let mut expect: Owned = vec![(b":status".to_vec(), status.to_string().into_bytes(), false)];
        for _ in 0..rng.usize(0..12) {
            let name: Vec<u8> = match rng.u8(0..3) {
                0 => names[rng.usize(..names.len())].to_vec(),
                1 => (0..rng.usize(1..20)).map(|_| rng.u8(b'a'..=b'z')).collect(),
                _ => (0..rng.usize(0..40)).map(|_| rng.u8(..)).collect(),
            };
            let value: Vec<u8> = match rng.u8(0..4) {
                0 => STATIC[rng.usize(..STATIC.len())].1.to_vec(),
                1 => (0..rng.usize(0..60)).map(|_| rng.u8(b' '..=b'~')).collect(),
                2 => (0..rng.usize(0..300)).map(|_| rng.u8(..)).collect(),
                _ => (0..rng.usize(0..30)).map(|_| rng.u8(b'0'..=b'9')).collect(),
            };
            let sensitive = rng.u8(0..8) == 0;
            Encoder::field(&mut dst, &name, &value, sensitive);
            expect.push((name, value, sensitive));
        }
        let got = decode_all(&mut d, &dst, BIG).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(got, expect, "round {round}");
        assert_eq!(d.table_size(), 0);
    }
}

/// Randomized check of the dynamic table against a model: a test-only encoder that does
/// insert (literal with incremental indexing), references live entries, and sends size
/// updates, on a small table so evictions are frequent.
#[test]
fn random_dynamic_table_model() {
    let mut rng = fastrand::Rng::with_seed(7541);
    let mut d = Decoder::with_table_size(300);
    let mut model: VecDeque<(Vec<u8>, Vec<u8>)> = VecDeque::new(); // newest first
    let mut max = 300usize;
    let model_size = |m: &VecDeque<(Vec<u8>, Vec<u8>)>| {
        m.iter().map(|(n, v)| n.len() + v.len() + 32).sum::<usize>()
    };
    for round in 0..3000 {
        let mut block = BytesMut::new();
        let mut expect: Owned = Vec::new();
        if rng.u8(0..10) == 0 {
            max = rng.usize(0..=300);
            encode_int(&mut block, max, 5, 0x20);
            while model_size(&model) > max {
                model.pop_back();
            }
        }
        for _ in 0..rng.usize(1..6) {
            if !model.is_empty() && rng.bool() {
                let i = rng.usize(..model.len());
                encode_int(&mut block, 62 + i, 7, 0x80);
                let (n, v) = &model[i];
                expect.push((n.clone(), v.clone(), false));
                continue;
            }
            let value: Vec<u8> = (0..rng.usize(0..120)).map(|_| rng.u8(..)).collect();
            let name: Vec<u8> = if !model.is_empty() && rng.bool() {
                let i = rng.usize(..model.len());
                encode_int(&mut block, 62 + i, 6, 0x40);
                model[i].0.clone()
            } else {
                let name: Vec<u8> = (0..rng.usize(0..40)).map(|_| rng.u8(..)).collect();
                block.put_u8(0x40);
                encode_str(&mut block, &name);
                name
            };
            encode_str(&mut block, &value);
            expect.push((name.clone(), value.clone(), false));
            if name.len() + value.len() + 32 > max {
                model.clear();
            } else {
                model.push_front((name, value));
                while model_size(&model) > max {
                    model.pop_back();
                }
            }
        }
        let got = decode_all(&mut d, &block, BIG).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(got, expect, "round {round}");
        let entries: Vec<(Vec<u8>, Vec<u8>)> = d
            .dynamic_entries()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(entries, Vec::from(model.clone()), "round {round}");
        assert_eq!(d.table_size(), model_size(&model));
        // The byte buffer stays bounded (at most 4x the table size, see DynTable).
        assert!(
            d.table.buf.capacity() <= 4 * 300 + 4 * 120,
            "round {round}: {}",
            d.table.buf.capacity()
        );
    }
}

/// Random garbage never panics and never leaves an error-free decoder in a bad state.
#[test]
fn random_garbage_is_rejected_cleanly() {
    let mut rng = fastrand::Rng::with_seed(42);
    for _ in 0..20_000 {
        let len = rng.usize(0..64);
        let block: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let mut d = Decoder::new();
        let mut n = 0usize;
        let r = d.decode(&block, 4096, |f| n += f.name.len() + f.value.len() + 32);
        match r {
            Ok(()) => assert!(n <= 4096),
            Err(HpackError::ListTooLarge { .. }) => {
                assert!(d.decode(&[0x82], 4096, |_| {}).is_ok())
            }
            Err(_) => assert_eq!(d.decode(&[0x82], 4096, |_| {}), Err(HpackError::Poisoned)),
        }
    }
}

/// `field_raw` writes what `field` writes but for the strings, which go as they are: both
/// decode to the same fields, indexed static fields alike, the raw form never Huffman-coded.
#[test]
fn raw_fields_decode_as_the_coded_ones() {
    let list: &[(&str, &str, bool)] = &[
        (":method", "GET", false),
        (":method", "PATCH", false),
        (":path", "/", false),
        (":path", "/a/b?c=d", false),
        (":authority", "backend.test:8080", false),
        ("x-forwarded-for", "192.0.2.1, 198.51.100.7", false),
        ("authorization", "Bearer abc", true),
        ("accept-encoding", "gzip, deflate", false),
        ("x-long", &"v".repeat(300), false),
        ("", "", false),
    ];
    let (mut coded, mut raw) = (BytesMut::new(), BytesMut::new());
    for (n, v, s) in list {
        Encoder::field(&mut coded, n.as_bytes(), v.as_bytes(), *s);
        Encoder::field_raw(&mut raw, n.as_bytes(), v.as_bytes(), *s);
    }
    let mut a = Vec::new();
    Decoder::new()
        .decode(&coded, usize::MAX, |f| {
            a.push((f.name.to_vec(), f.value.to_vec(), f.sensitive))
        })
        .unwrap();
    let mut b = Vec::new();
    Decoder::new()
        .decode(&raw, usize::MAX, |f| {
            b.push((f.name.to_vec(), f.value.to_vec(), f.sensitive))
        })
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.len(), list.len());
    assert!(raw.len() > coded.len(), "the coded form is the shorter");
    // `:method: GET` is static entry 2, one octet either way.
    let mut get = BytesMut::new();
    Encoder::field_raw(&mut get, b":method", b"GET", false);
    assert_eq!(&get[..], &[0x82]);
}

/// One decoder over many blocks (its memo of coded values warm) decodes every block as a
/// fresh decoder does: repeated and changing Huffman-coded values of the fields the memo
/// keeps (`server`, `date`, `content-type`), values that differ in one coded octet, with and
/// without incremental indexing, sensitive ones, and values too long to keep.
#[test]
fn the_decode_memo_answers_as_the_decoder() {
    let mut rng = fastrand::Rng::with_seed(0x00de_c0de);
    let pool: Vec<Vec<u8>> = (0..6)
        .map(|i| format!("nginx/1.{i}2.1 value-{i}").into_bytes())
        .chain([
            b"Sat, 28 Nov 2026 16:50:05 GMT".to_vec(),
            b"text/plain".to_vec(),
        ])
        .collect();
    let mut d = Decoder::new();
    let mut hits = 0;
    for round in 0..3000 {
        let mut block = BytesMut::new();
        let mut expect: Owned = Vec::new();
        for _ in 0..rng.usize(1..6) {
            // server (54), date (33), content-type (31), and one the memo does not keep.
            let index = [54usize, 33, 31, 58][rng.usize(..4)];
            let value: Vec<u8> = match rng.u8(0..4) {
                0 | 1 => pool[rng.usize(..pool.len())].clone(),
                2 => {
                    let mut v = pool[rng.usize(..pool.len())].clone();
                    let i = rng.usize(..v.len());
                    v[i] = rng.u8(b' '..=b'~');
                    v
                }
                _ => (0..rng.usize(0..80)).map(|_| rng.u8(..)).collect(),
            };
            let (flags, prefix, sensitive) = match rng.u8(0..3) {
                0 => (0x40, 6, false),
                1 => (0x00, 4, false),
                _ => (0x10, 4, true),
            };
            encode_int(&mut block, index, prefix, flags);
            let huff = huffman::encoded_len(&value);
            encode_int(&mut block, huff, 7, 0x80);
            huffman::encode(&value, &mut block);
            hits += usize::from(d.memo.as_ref().is_some_and(|m| {
                let coded = &block[block.len() - huff..];
                m.get(coded).is_some()
            }));
            expect.push((STATIC[index - 1].0.to_vec(), value, sensitive));
        }
        let fresh = decode_all(&mut Decoder::new(), &block, BIG);
        let got = decode_all(&mut d, &block, BIG);
        assert_eq!(got, fresh, "round {round}");
        assert_eq!(got.unwrap_or_else(|e| panic!("round {round}: {e}")), expect);
    }
    assert!(hits > 1000, "the memo answered {hits} values");
}

/// [`Decoder::repeat`] against a decoder that decodes every block: over random sequences of
/// a few blocks (literals with incremental indexing of static and literal names, references
/// to dynamic entries with and without inserts, size updates, a block too long to keep, one
/// that fails the list bound) on a small table, where a repeat is taken the fields are those
/// kept for the run, and after every block both tables hold the same entries. Repeats are
/// taken (the table reaches its steady state), and a block that inserts and refers to the
/// table is never repeated.
#[test]
fn a_repeated_block_decodes_as_the_decoder_would() {
    let mut rng = fastrand::Rng::with_seed(0x0e9e_a75e);
    let lit = |b: &mut BytesMut, flags: u8, prefix: u8, index: usize, name: &[u8], v: &[u8]| {
        encode_int(b, index, prefix, flags);
        if index == 0 {
            encode_str(b, name);
        }
        encode_str(b, v);
    };
    // 0-1: independent with inserts (static names, a literal name); 2: dynamic references
    // only; 3: a reference and an insert; 4: indexed static fields only; 5: a size update;
    // 6: too long to keep; 7: an insert without indexing (no insert at all).
    let make = |which: usize| -> Vec<u8> {
        let mut b = BytesMut::new();
        match which {
            0 => {
                b.put_u8(0x88);
                lit(&mut b, 0x40, 6, 54, b"", b"nginx/1.22.1");
                lit(&mut b, 0x40, 6, 33, b"", b"Sun, 29 Nov 2026 12:30:00 GMT");
                lit(&mut b, 0x40, 6, 28, b"", b"12");
            }
            1 => {
                b.put_u8(0x88);
                lit(&mut b, 0x40, 6, 0, b"x-big", &[b'v'; 90]);
            }
            2 => {
                encode_int(&mut b, 62, 7, 0x80);
                encode_int(&mut b, 63, 7, 0x80);
            }
            3 => {
                encode_int(&mut b, 62, 7, 0x80);
                lit(&mut b, 0x40, 6, 31, b"", b"text/plain");
            }
            4 => {
                b.put_u8(0x88);
                b.put_u8(0x82);
            }
            5 => {
                encode_int(&mut b, 100, 5, 0x20);
                lit(&mut b, 0x40, 6, 54, b"", b"s");
            }
            6 => lit(&mut b, 0x40, 6, 0, b"x-long", &[b'l'; MAX_REPEAT_BLOCK]),
            _ => lit(&mut b, 0x00, 4, 54, b"", b"nginx"),
        }
        b.to_vec()
    };
    let blocks: Vec<Vec<u8>> = (0..8).map(make).collect();
    let mut repeated = 0;
    for round in 0..200 {
        let max = [150, 300, 1000][round % 3];
        let mut d = Decoder::with_table_size(max).watching_repeats();
        let mut reference = Decoder::with_table_size(max);
        let mut kept: Option<(u64, Owned)> = None;
        let mut which = rng.usize(..blocks.len());
        for step in 0..60 {
            // Runs of the same block, broken now and then.
            if rng.u8(0..6) == 0 {
                which = rng.usize(..blocks.len());
            }
            let block = &blocks[which];
            // A bound the block 1 run fails now and then: its table still moves.
            let list = if which == 1 && rng.u8(0..8) == 0 {
                64
            } else {
                BIG
            };
            let expect = decode_all(&mut reference, block, list);
            let run = d.run();
            let repeat = match &kept {
                Some((r, _)) if *r == run => d.repeat(block, list),
                _ => Ok(false),
            };
            let got = match repeat {
                Ok(true) => {
                    repeated += 1;
                    assert!(which != 3, "a block that inserts and refers was repeated");
                    Ok(kept.as_ref().unwrap().1.clone())
                }
                Err(e) => Err(e),
                Ok(false) => {
                    let got = decode_all(&mut d, block, list);
                    if got.is_ok() && d.repeats() >= 2 {
                        kept = Some((d.run(), got.clone().unwrap()));
                    }
                    got
                }
            };
            assert_eq!(got, expect, "round {round} step {step} block {which}");
            assert_eq!(table(&d), table(&reference), "round {round} step {step}");
            assert_eq!(d.table_size(), reference.table_size());
            if got.is_err() && !matches!(got, Err(HpackError::ListTooLarge { .. })) {
                break;
            }
        }
    }
    assert!(repeated > 1000, "{repeated} repeats");
}

/// The cases [`Decoder::repeat`] refuses: a block other than the last, one decoded with an
/// error, one with a size update, one too long to keep, one under a tighter list bound, one
/// that both refers to the table and inserts, a decoder that owes a size update, and a
/// decoder that does not watch for repeats. Before the table's steady state an inserting
/// block is decoded for the table (the table moves as a decode moves it); after it, nothing
/// moves.
#[test]
fn repeat_refuses_what_it_cannot_prove() {
    let server = {
        let mut b = BytesMut::new();
        b.put_u8(0x88);
        encode_int(&mut b, 54, 6, 0x40);
        encode_str(&mut b, b"nginx/1.22.1"); // 6 + 12 + 32 = 50 octets per entry
        b.to_vec()
    };
    let mut d = Decoder::with_table_size(200).watching_repeats();
    let mut reference = Decoder::with_table_size(200);
    assert_eq!(d.repeat(&server, BIG), Ok(false), "nothing decoded yet");
    let r0 = d.run();
    decode_all(&mut d, &server, BIG).unwrap();
    decode_all(&mut reference, &server, BIG).unwrap();
    assert_ne!(d.run(), r0, "a new run");
    assert_eq!(d.repeats(), 1);
    // 200 octets hold 4 entries: steady once an entry of the run was evicted (5 decodes).
    for n in 1..5 {
        assert_eq!(d.repeat(&server, BIG), Ok(true), "after {n}");
        decode_all(&mut reference, &server, BIG).unwrap();
        assert_eq!(
            table(&d),
            table(&reference),
            "decoded for the table after {n}"
        );
    }
    assert_eq!(d.repeats(), 5);
    let buf = d.table.buf.as_ptr();
    let head = d.table.head;
    for _ in 0..3 {
        assert_eq!(d.repeat(&server, BIG), Ok(true));
    }
    assert_eq!(
        (d.table.buf.as_ptr(), d.table.head, d.repeats()),
        (buf, head, 8),
        "steady: nothing moved"
    );
    assert_eq!(d.repeat(&server, 10), Ok(false), "a tighter list bound");
    assert_eq!(
        d.repeat(&server[..server.len() - 1], BIG),
        Ok(false),
        "other octets"
    );
    let run = d.run();
    assert_eq!(d.repeat(&server, BIG), Ok(true));
    assert_eq!(d.run(), run, "a repeat stays in its run");
    // A block that refers to the table and inserts.
    let mut both = vec![0xbe];
    both.extend_from_slice(&server[1..]);
    decode_all(&mut d, &both, BIG).unwrap();
    decode_all(&mut d, &both, BIG).unwrap();
    assert_eq!(d.repeat(&both, BIG), Ok(false));
    // A size update is never kept.
    let mut upd = BytesMut::new();
    encode_int(&mut upd, 200, 5, 0x20);
    upd.extend_from_slice(&server);
    decode_all(&mut d, &upd, BIG).unwrap();
    assert_eq!(d.repeats(), 0);
    assert_eq!(d.repeat(&upd, BIG), Ok(false));
    // A failed decode forgets the block.
    decode_all(&mut d, &[0x82], BIG).unwrap();
    decode_all(&mut d, &[0x82], BIG).unwrap();
    assert_eq!(
        d.repeat(&[0x82], BIG),
        Ok(true),
        "no insert: repeated at once"
    );
    assert!(decode_all(&mut d, &[0x82], 10).is_err());
    assert_eq!(d.repeat(&[0x82], BIG), Ok(false));
    // Too long to keep.
    let long = vec![0x82; MAX_REPEAT_BLOCK + 1];
    decode_all(&mut d, &long, BIG).unwrap();
    decode_all(&mut d, &long, BIG).unwrap();
    assert_eq!(d.repeat(&long, BIG), Ok(false));
    // A lowered limit requires a size update first.
    decode_all(&mut d, &[0x82], BIG).unwrap();
    d.set_max_allowed_table_size(0);
    assert_eq!(d.repeat(&[0x82], BIG), Ok(false));
    // Not watching.
    let mut plain = Decoder::new();
    decode_all(&mut plain, &[0x82], BIG).unwrap();
    assert_eq!(plain.repeat(&[0x82], BIG), Ok(false));
    assert_eq!(plain.repeats(), 0);
}
