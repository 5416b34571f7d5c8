//! Frame layer (RFC 9113 §4.1, §6) on arbitrary bytes: the input is cut into frames the way
//! the driver cuts its read buffer (header, then `len` bytes), and each payload goes through
//! the parsers the driver applies by type (padding, priority fields, SETTINGS entries).
//! Checks: no panic, no read past a payload; a parsed header written back is the same 9 bytes
//! but for the reserved bit; unpadded content is a suffix-trimmed slice of the payload.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sweety_h2::frame::{self, flag, kind, Head, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while rest.len() >= HEADER_LEN {
        let h = Head::parse(rest);
        let mut back = BytesMut::new();
        frame::put_head(&mut back, h.len as usize, h.kind, h.flags, h.stream);
        // The reserved bit is the top bit of the stream identifier, the header's sixth byte.
        assert_eq!(&back[..5], &rest[..5]);
        assert_eq!(back[5], rest[5] & 0x7f, "only the reserved bit is dropped");
        assert_eq!(&back[6..HEADER_LEN], &rest[6..HEADER_LEN]);
        let Some(payload) = rest.get(HEADER_LEN..HEADER_LEN + h.len as usize) else {
            return;
        };
        rest = &rest[HEADER_LEN + h.len as usize..];
        let mut body = payload;
        if (h.kind == kind::DATA || h.kind == kind::HEADERS) && h.has(flag::PADDED) {
            match frame::unpad(payload) {
                Some(b) => {
                    assert!(b.len() < payload.len());
                    assert_eq!(b, &payload[1..1 + b.len()]);
                    body = b;
                }
                None => continue,
            }
        }
        if (h.kind == kind::HEADERS && h.has(flag::PRIORITY)) || h.kind == kind::PRIORITY {
            if body.len() >= 5 {
                let dep = frame::priority_dependency(body);
                assert!(dep <= 0x7fff_ffff);
            }
        }
        if h.kind == kind::SETTINGS && !h.has(flag::ACK) && body.len() % 6 == 0 {
            // Re-encoding the entries gives the payload back.
            let params: Vec<(u16, u32)> = body
                .chunks_exact(6)
                .map(|c| {
                    (
                        u16::from_be_bytes([c[0], c[1]]),
                        u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                    )
                })
                .collect();
            let mut again = BytesMut::new();
            frame::put_settings(&mut again, &params);
            assert_eq!(&again[HEADER_LEN..], body);
        }
    }
});
