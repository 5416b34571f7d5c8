//! HPACK decoder (RFC 7541) on arbitrary header blocks, several per connection so the dynamic
//! table carries over. Input: [table size byte] then blocks, each [len u16 BE][bytes].
//! Checks: no panic; a block that decodes is within the list-size bound it was given; after a
//! `ListTooLarge` the decoder stays usable; what decodes re-encodes (table-less) into a block a
//! fresh decoder reads back as the same fields; a decoder without its memo of repeating
//! Huffman-coded values, fed the same blocks, answers each block the same (fields or error);
//! the decoder under test watches for repeats: where `Decoder::repeat` takes a block as
//! decoded, the fields kept for its run are the reference's fields, and after every block
//! both tables hold the same entries. A length of `0xff00 + n` is no block: the previous
//! block again, `n + 1` times (runs long enough to fill a table are cheap to reach).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sweety_h2::hpack::{Decoder, Encoder, HpackError};

fuzz_target!(|data: &[u8]| {
    let Some((&size, mut rest)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::new().watching_repeats();
    d.set_max_allowed_table_size(size as usize * 64);
    let mut reference = Decoder::new().without_memo();
    reference.set_max_allowed_table_size(size as usize * 64);
    // A small list bound for odd sizes, so the ListTooLarge path is reached too.
    let max_list = if size & 1 == 1 { 256 } else { 64 * 1024 };
    // The fields of a block of the run `.0` (decoded twice in a row), for repeats.
    let mut kept: Option<(u64, Vec<(Vec<u8>, Vec<u8>, bool)>)> = None;
    let mut prev: &[u8] = &[];
    let mut pending_repeats = 0usize;
    while rest.len() >= 2 || pending_repeats > 0 {
        let block = if pending_repeats > 0 {
            pending_repeats -= 1;
            prev
        } else {
            let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            if len >= 0xff00 {
                pending_repeats = (len & 0xff) + 1;
                rest = &rest[2..];
                continue;
            }
            let len = len.min(rest.len() - 2);
            let block = &rest[2..2 + len];
            rest = &rest[2 + len..];
            block
        };
        prev = block;
        let mut fields: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
        let mut list = 0usize;
        let run = d.run();
        let repeat = match &kept {
            Some((r, _)) if *r == run => d.repeat(block, max_list),
            _ => Ok(false),
        };
        let r = match repeat {
            Ok(true) => {
                fields = kept.as_ref().expect("kept").1.clone();
                list = fields.iter().map(|(n, v, _)| n.len() + v.len() + 32).sum();
                Ok(())
            }
            Err(e) => Err(e),
            Ok(false) => {
                let r = d.decode(block, max_list, |f| {
                    list += f.name.len() + f.value.len() + 32;
                    fields.push((f.name.to_vec(), f.value.to_vec(), f.sensitive));
                });
                if r.is_ok() && d.repeats() >= 2 {
                    kept = Some((d.run(), fields.clone()));
                }
                r
            }
        };
        let mut expected: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
        let r_ref = reference.decode(block, max_list, |f| {
            expected.push((f.name.to_vec(), f.value.to_vec(), f.sensitive));
        });
        assert_eq!(r, r_ref, "the memo or a repeat changed the result");
        assert_eq!(fields, expected, "the memo or a repeat changed a field");
        assert!(
            d.dynamic_entries().eq(reference.dynamic_entries()),
            "a repeat left another table"
        );
        assert_eq!(d.table_size(), reference.table_size());
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
