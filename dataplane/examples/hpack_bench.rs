//! HPACK microbenchmark: time per header block of `sweety_dataplane::hpack`, printed as
//! nanoseconds per block (no assertions; run it on a release build):
//!
//! ```sh
//! cargo run --release -p sweety-dataplane --example hpack_bench [ITERATIONS]
//! ```
//!
//! * `decode-literal`: a 7-field request (h2load-like) of literals without indexing, values
//!   Huffman-coded where that is shorter (what [`Encoder::field`] writes);
//! * `decode-raw`: the same literals with literal names and raw (not Huffman) values;
//! * `decode-indexed`: the same request once its fields are in the dynamic table: the steady
//!   state of a client that indexes (nghttp2, browsers), one octet per field;
//! * `encode-response`: `:status 200` plus content-type, content-length, date and server.

use bytes::BytesMut;
use std::hint::black_box;
use std::time::Instant;
use sweety_dataplane::hpack::{Decoder, Encoder};

const REQUEST: [(&str, &str); 7] = [
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/static/app.3f9c1e.js"),
    (":authority", "www.example.com"),
    ("user-agent", "h2load nghttp2/1.52.0"),
    ("accept-encoding", "gzip, deflate, br"),
    ("accept", "*/*"),
];

fn report(name: &str, iterations: u32, start: Instant) {
    let ns = start.elapsed().as_nanos() as f64 / f64::from(iterations);
    println!("{name:16} {ns:8.1} ns/block");
}

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);

    let mut literal = BytesMut::new();
    for (n, v) in REQUEST {
        Encoder::field(&mut literal, n.as_bytes(), v.as_bytes(), false);
    }

    // Literal with incremental indexing (0x40, literal name, raw value) for every field, then
    // the indexed block: newest entry is index 62, so field i is 62 + (6 - i).
    let mut priming = Vec::new();
    for (n, v) in REQUEST {
        priming.push(0x40);
        priming.push(n.len() as u8);
        priming.extend_from_slice(n.as_bytes());
        priming.push(v.len() as u8);
        priming.extend_from_slice(v.as_bytes());
    }
    // The same literals without indexing and without Huffman coding (name index or literal name).
    let mut raw = Vec::new();
    for (n, v) in REQUEST {
        raw.push(0x00);
        raw.push(n.len() as u8);
        raw.extend_from_slice(n.as_bytes());
        raw.push(v.len() as u8);
        raw.extend_from_slice(v.as_bytes());
    }
    let indexed: Vec<u8> = (0..REQUEST.len())
        .map(|i| 0x80 | (62 + REQUEST.len() - 1 - i) as u8)
        .collect();

    let mut d = Decoder::new();
    d.decode(&priming, 1 << 16, |_| {}).expect("priming block");
    let mut check = Vec::new();
    d.decode(&indexed, 1 << 16, |f| {
        check.push((f.name.to_vec(), f.value.to_vec()))
    })
    .expect("indexed block");
    assert_eq!(check.len(), REQUEST.len());
    assert!(check
        .iter()
        .zip(REQUEST)
        .all(|((n, v), (en, ev))| n == en.as_bytes() && v == ev.as_bytes()));

    for _ in 0..2 {
        let start = Instant::now();
        let mut octets = 0usize;
        for _ in 0..iterations {
            d.decode(black_box(&literal), 1 << 16, |f| {
                octets += f.name.len() + f.value.len()
            })
            .unwrap();
        }
        report("decode-literal", iterations, start);

        let start = Instant::now();
        for _ in 0..iterations {
            d.decode(black_box(&raw), 1 << 16, |f| {
                octets += f.name.len() + f.value.len()
            })
            .unwrap();
        }
        report("decode-raw", iterations, start);

        let start = Instant::now();
        for _ in 0..iterations {
            d.decode(black_box(&indexed), 1 << 16, |f| {
                octets += f.name.len() + f.value.len()
            })
            .unwrap();
        }
        report("decode-indexed", iterations, start);
        black_box(octets);

        let start = Instant::now();
        let mut dst = BytesMut::with_capacity(256);
        for _ in 0..iterations {
            dst.clear();
            Encoder::status(&mut dst, black_box(200));
            Encoder::field(&mut dst, b"content-type", b"application/javascript", false);
            Encoder::field(&mut dst, b"content-length", b"1024", false);
            Encoder::field(&mut dst, b"date", b"Sun, 22 Nov 2026 11:00:00 GMT", false);
            Encoder::field(&mut dst, b"server", b"sweety", false);
            black_box(&dst);
        }
        report("encode-response", iterations, start);
    }
    println!(
        "(block sizes: literal {} B, raw {} B, indexed {} B, request fields {})",
        literal.len(),
        raw.len(),
        indexed.len(),
        REQUEST.len()
    );
}
