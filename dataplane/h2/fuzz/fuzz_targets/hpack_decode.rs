//! HPACK decoder (RFC 7541) on arbitrary header blocks, several per connection so the dynamic
//! table carries over. Input: [table size byte] then blocks, each [len u16 BE][bytes].
//! Checks: no panic; a block that decodes is within the list-size bound it was given; after a
//! `ListTooLarge` the decoder stays usable; what decodes re-encodes (table-less) into a block a
//! fresh decoder reads back as the same fields; a decoder without its memo of repeating
//! Huffman-coded values, fed the same blocks, answers each block the same (fields or error).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sweety_h2::hpack::{Decoder, Encoder, HpackError};

fuzz_target!(|data: &[u8]| {
    let Some((&size, mut rest)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::new();
    d.set_max_allowed_table_size(size as usize * 64);
    let mut reference = Decoder::new().without_memo();
    reference.set_max_allowed_table_size(size as usize * 64);
    // A small list bound for odd sizes, so the ListTooLarge path is reached too.
    let max_list = if size & 1 == 1 { 256 } else { 64 * 1024 };
    while rest.len() >= 2 {
        let len = (u16::from_be_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        let block = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let mut fields: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
        let mut list = 0usize;
        let r = d.decode(block, max_list, |f| {
            list += f.name.len() + f.value.len() + 32;
            fields.push((f.name.to_vec(), f.value.to_vec(), f.sensitive));
        });
        let mut expected: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
        let r_ref = reference.decode(block, max_list, |f| {
            expected.push((f.name.to_vec(), f.value.to_vec(), f.sensitive));
        });
        assert_eq!(r, r_ref, "the memo changed the result");
        assert_eq!(fields, expected, "the memo changed a field");
        match r {
            Ok(()) => {
                assert!(list <= max_list, "{list} bytes of fields past the {max_list} bound");
                // Round trip through the table-less encoder.
                let mut enc = BytesMut::new();
                for (n, v, s) in &fields {
                    Encoder::field(&mut enc, n, v, *s);
                }
                let mut again = Vec::new();
                Decoder::new()
                    .decode(&enc, usize::MAX, |f| {
                        again.push((f.name.to_vec(), f.value.to_vec(), f.sensitive))
                    })
                    .expect("our own encoding decodes");
                let names = |v: &Vec<(Vec<u8>, Vec<u8>, bool)>| {
                    v.iter().map(|(n, v, _)| (n.clone(), v.clone())).collect::<Vec<_>>()
                };
                assert_eq!(names(&fields), names(&again));
            }
            Err(HpackError::ListTooLarge { .. }) => {}
            // A connection error: the decoder refuses everything after it.
            Err(_) => {
                assert!(d.decode(b"\x82", max_list, |_| {}).is_err());
                return;
            }
        }
    }
});
