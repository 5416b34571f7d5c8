//! The chunked decoder (RFC 9112 §7.1) on arbitrary bytes. The first byte picks how the rest
//! is split into reads (1..=16 bytes each, or whole) and small limits for half of the runs, so
//! the bounds are reached too.
//! Checks: no panic; the outcome (data, end, trailers, error, what is left after the body) is
//! the same however the bytes arrive; data handed out is never empty and never more than the
//! input; a decoded body re-encoded and decoded again gives the same data and trailers.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sweety_h1::chunked::{self, Chunk, ChunkedError, Decoder, Limits};

type Outcome = Result<(Vec<u8>, Option<http::HeaderMap>, Vec<u8>), ChunkedError>;

fn run(input: &[u8], step: usize, limits: Limits) -> Outcome {
    let mut d = Decoder::new(limits);
    let mut buf = BytesMut::new();
    let (mut body, mut end) = (Vec::new(), None);
    let mut pos = 0;
    loop {
        while let Some(c) = d.decode(&mut buf)? {
            match c {
                Chunk::Data(b) => {
                    assert!(!b.is_empty());
                    body.extend_from_slice(&b);
                }
                Chunk::End(t) => {
                    assert!(end.is_none());
                    end = Some(t);
                }
            }
        }
        if pos == input.len() {
            break;
        }
        let n = step.min(input.len() - pos);
        buf.extend_from_slice(&input[pos..pos + n]);
        pos += n;
    }
    assert!(body.len() <= input.len());
    assert_eq!(d.is_done(), end.is_some());
    Ok((body, end, buf.to_vec()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let limits = if sel & 0x80 != 0 {
        Limits {
            max_ext_bytes: 8,
            max_trailer_bytes: 24,
            max_trailer_fields: 2,
        }
    } else {
        Limits::default()
    };
    let step = match sel & 0x1f {
        0 => usize::MAX,
        n => usize::from(n & 0xf) + 1,
    };
    let whole = run(input, usize::MAX, limits);
    let split = run(input, step, limits);
    match (&whole, &split) {
        (Ok((b1, e1, r1)), Ok((b2, e2, r2))) => {
            assert_eq!(b1, b2);
            assert_eq!(e1.is_some(), e2.is_some());
            if let Some(t) = e1 {
                assert_eq!(e1, e2);
                assert_eq!(r1, r2);
                let mut again = BytesMut::new();
                chunked::encode(&mut again, &[b1], t);
                let (b3, e3, r3) = run(&again, usize::MAX, Limits::default()).expect("re-encoded");
                assert_eq!(&b3, b1);
                assert_eq!(e3.as_ref(), Some(t));
                assert!(r3.is_empty());
            }
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("split changed the outcome: {whole:?} vs {split:?}"),
    }
});
