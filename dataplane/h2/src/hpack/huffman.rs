//! The HPACK Huffman code (RFC 7541 §5.2 and Appendix B): an encoder and a table-driven
//! decoder.
//!
//! The code is canonical, so only the code length of each symbol is written down here
//! (`LENS`, transcribed from Appendix B); the codes themselves and the decoder's state
//! machine are computed at compile time by `const fn`s. The decoder consumes four bits per
//! step: its state is an internal node of the code tree (257 leaves, so 256 internal nodes,
//! which fits a `u8`), and each of the 256 × 16 transitions says where the walk ends up,
//! whether it completed a symbol on the way, and whether it ran into EOS.
//!
//! [`decode`], [`encoded_len`] and [`encode`] are public for the HTTP/3 front's QPACK, whose
//! string literals use the same code (RFC 9204 §4.1.2): the dataplane's patched h3 crate
//! (vendor/h3-0.0.8) codes its field strings with them.

use bytes::{BufMut, BytesMut};

use super::HpackError;

/// Code length in bits of each symbol 0..=255 and EOS (256), RFC 7541 Appendix B.
#[rustfmt::skip]
const LENS: [u8; 257] = [
    // 0..=31: control characters
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    // 32..=63: ' ' .. '?'
     6, 10, 10, 12, 13,  6,  8, 11, 10, 10,  8, 11,  8,  6,  6,  6,
     5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8, 15,  6, 12, 10,
    // 64..=95: '@' .. '_'
    13,  6,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,
     7,  7,  7,  7,  7,  7,  7,  7,  8,  7,  8, 13, 19, 13, 14,  6,
    // 96..=127: '`' .. DEL
    15,  5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,  6,  5,
     6,  7,  6,  5,  5,  6,  7,  7,  7,  7,  7, 15, 11, 14, 13, 28,
    // 128..=191
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    // 192..=255
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    // EOS
    30,
];

/// The symbol number of EOS, which must never appear in a decoded string (§5.2).
const EOS: u16 = 256;

/// Assigns canonical codes: by increasing length, and by symbol value within a length.
/// Compilation fails if the lengths do not describe a complete prefix code.
const fn build_codes() -> [u32; 257] {
    let mut codes = [0u32; 257];
    let mut code: u64 = 0;
    let mut len = 1;
    while len <= 30 {
        let mut sym = 0;
        while sym < 257 {
            if LENS[sym] == len {
                codes[sym] = code as u32;
                code += 1;
            }
            sym += 1;
        }
        if len < 30 {
            code <<= 1;
        }
        len += 1;
    }
    // Kraft equality: the 30-bit codes end exactly at 2^30, so every bit string decodes.
    assert!(
        code == 1 << 30,
        "Huffman code lengths do not form a complete code"
    );
    codes
}

/// Code of each symbol, aligned to the least significant bit (the "as hex" column).
const CODES: [u32; 257] = build_codes();

/// Each octet's code and length in one word, `code << 8 | length`: one load per octet in
/// [`encode_short`].
const PACKED: [u64; 256] = {
    let mut packed = [0u64; 256];
    let mut sym = 0;
    while sym < 256 {
        packed[sym] = (CODES[sym] as u64) << 8 | LENS[sym] as u64;
        sym += 1;
    }
    packed
};

/// Marks a child slot of [`TREE`] that is a leaf; the low bits are the symbol.
const LEAF: u16 = 0x8000;

/// The code tree: 256 internal nodes (0 is the root), each with a child per bit. A child is
/// either another node's number or `LEAF | symbol`.
const fn build_tree() -> [[u16; 2]; 256] {
    let mut nodes = [[0u16; 2]; 256];
    let mut next = 1usize;
    let mut sym = 0;
    while sym < 257 {
        let code = CODES[sym];
        let mut bit = LENS[sym] as u32;
        let mut node = 0usize;
        while bit > 1 {
            bit -= 1;
            let b = ((code >> bit) & 1) as usize;
            if nodes[node][b] == 0 {
                nodes[node][b] = next as u16;
                next += 1;
            }
            node = nodes[node][b] as usize;
        }
        nodes[node][(code & 1) as usize] = LEAF | sym as u16;
        sym += 1;
    }
    assert!(
        next == 256,
        "a complete code over 257 symbols has 256 internal nodes"
    );
    nodes
}

const TREE: [[u16; 2]; 256] = build_tree();

/// How a string may end in a given state (§5.2: padding is the most significant bits of
/// EOS, so all ones, and at most 7 of them).
const END_OK: u8 = 0;
const END_NOT_ONES: u8 = 1;
const END_TOO_LONG: u8 = 2;

const fn build_end() -> [u8; 256] {
    let mut end = [END_NOT_ONES; 256];
    end[0] = END_OK;
    let mut node = 0usize;
    let mut depth = 1;
    // The all-ones path reaches its first leaf (EOS) at depth 30.
    while depth < 30 {
        node = TREE[node][1] as usize;
        end[node] = if depth <= 7 { END_OK } else { END_TOO_LONG };
        depth += 1;
    }
    end
}

const END: [u8; 256] = build_end();

/// One decoder step: four input bits from state `s` lead to state `next`; `EMIT` says a
/// symbol (`sym`) was completed on the way, `FAIL` that the bits spelled EOS.
#[derive(Clone, Copy)]
struct Step {
    next: u8,
    sym: u8,
    flags: u8,
}

const EMIT: u8 = 1;
const FAIL: u8 = 2;

const fn build_steps() -> [[Step; 16]; 256] {
    let mut steps = [[Step {
        next: 0,
        sym: 0,
        flags: 0,
    }; 16]; 256];
    let mut state = 0;
    while state < 256 {
        let mut nibble = 0;
        while nibble < 16 {
            let mut node = state;
            let mut step = Step {
                next: 0,
                sym: 0,
                flags: 0,
            };
            let mut bit = 4;
            while bit > 0 {
                bit -= 1;
                let child = TREE[node][(nibble >> bit) & 1];
                if child & LEAF == 0 {
                    node = child as usize;
                    continue;
                }
                if child & !LEAF == EOS {
                    step.flags = FAIL;
                    break;
                }
                // Codes are at least 5 bits long, so four bits complete at most one symbol.
                step.flags = EMIT;
                step.sym = (child & !LEAF) as u8;
                node = 0;
            }
            step.next = node as u8;
            steps[state][nibble] = step;
            nibble += 1;
        }
        state += 1;
    }
    steps
}

static STEPS: [[Step; 16]; 256] = build_steps();

/// Decodes a Huffman-coded string literal, appending the octets to `dst`. Fails on the EOS
/// symbol, on padding longer than 7 bits and on padding that is not the high bits of EOS
/// (RFC 7541 §5.2); `dst` may then hold part of the string.
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), HpackError> {
    // The shortest code is 5 bits, so the output is at most 8/5 of the input.
    dst.reserve(src.len() + src.len() / 2 + src.len() / 8 + 1);
    let mut state = 0usize;
    for &byte in src {
        for nibble in [byte >> 4, byte & 0x0f] {
            let step = STEPS[state][nibble as usize];
            if step.flags & FAIL != 0 {
                return Err(HpackError::HuffmanEos);
            }
            if step.flags & EMIT != 0 {
                dst.push(step.sym);
            }
            state = step.next as usize;
        }
    }
    match END[state] {
        END_OK => Ok(()),
        END_TOO_LONG => Err(HpackError::HuffmanPaddingTooLong),
        _ => Err(HpackError::HuffmanPaddingNotOnes),
    }
}

/// Length in octets of `src` once Huffman-coded.
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| LENS[b as usize] as usize).sum();
    bits.div_ceil(8)
}

/// Appends the Huffman coding of `src` ([`encoded_len`]`(src)` octets) to `dst`, padded with
/// the high bits of EOS.
pub fn encode<B: BufMut>(src: &[u8], dst: &mut B) {
    // Holds at most 31 pending bits plus one 30-bit code; bits above those are stale and
    // never written out. Written 32 bits at a time.
    let mut acc: u64 = 0;
    let mut pending: u32 = 0;
    for &b in src {
        let n = LENS[b as usize] as u32;
        acc = (acc << n) | CODES[b as usize] as u64;
        pending += n;
        if pending >= 32 {
            pending -= 32;
            dst.put_u32((acc >> pending) as u32);
        }
    }
    // Pad to a whole octet with ones, then write the rest high octet first.
    let pad = (8 - pending % 8) % 8;
    acc = (acc << pad) | ((1 << pad) - 1);
    pending += pad;
    while pending > 0 {
        pending -= 8;
        dst.put_u8((acc >> pending) as u8);
    }
}

/// The longest string [`encode_short`] takes: its coding, shorter, has a length below 127,
/// which a string literal's 7-bit prefix holds in its one octet.
pub(crate) const SHORT: usize = 127;

/// Appends the string literal of `src` (at most [`SHORT`] octets) Huffman-coded, its length
/// octet first, when the coding is strictly shorter than `src`; otherwise appends nothing and
/// returns false. One pass over `src` into a buffer on the stack, given up as soon as the
/// coding cannot be shorter: a response's field values (dates, server names, types, lengths,
/// ids) are coded for every response, and [`encoded_len`] followed by [`encode`] reads each
/// octet twice and writes through `BytesMut`'s capacity checks four octets at a time.
pub(crate) fn encode_short(src: &[u8], dst: &mut BytesMut) -> bool {
    debug_assert!(src.len() <= SHORT);
    let limit = src.len();
    // The length octet, then at most `limit - 1` < 127 coded octets.
    let mut out = [0u8; SHORT + 1];
    let mut n = 1;
    // As in `encode`: at most 31 pending bits plus one 30-bit code.
    let mut acc: u64 = 0;
    let mut pending: u32 = 0;
    for &b in src {
        let e = PACKED[b as usize];
        let len = (e & 0xff) as u32;
        acc = (acc << len) | (e >> 8);
        pending += len;
        if pending >= 32 {
            pending -= 32;
            // n - 1 coded octets so far, four more: no longer shorter once n + 3 >= limit.
            if n + 3 >= limit {
                return false;
            }
            out[n..n + 4].copy_from_slice(&((acc >> pending) as u32).to_be_bytes());
            n += 4;
        }
    }
    // Pad to a whole octet with ones (EOS's high bits), then the rest high octet first.
    let pad = (8 - pending % 8) % 8;
    acc = (acc << pad) | ((1 << pad) - 1);
    pending += pad;
    let total = n + (pending / 8) as usize;
    if total > limit {
        return false;
    }
    while pending > 0 {
        pending -= 8;
        out[n] = (acc >> pending) as u8;
        n += 1;
    }
    out[0] = 0x80 | (total - 1) as u8;
    dst.extend_from_slice(&out[..total]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes from the "as hex" column of RFC 7541 Appendix B: the first and last symbol of
    /// every code length plus a few more, so a mistyped length shifts a checked code.
    #[test]
    fn codes_match_appendix_b() {
        let expected: &[(usize, u32, u8)] = &[
            (0, 0x1ff8, 13),
            (1, 0x7fffd8, 23),
            (2, 0xfffffe2, 28),
            (9, 0xffffea, 24),
            (10, 0x3ffffffc, 30),
            (13, 0x3ffffffd, 30),
            (22, 0x3ffffffe, 30),
            (31, 0xffffffb, 28),
            (b' ' as usize, 0x14, 6),
            (b'!' as usize, 0x3f8, 10),
            (b'#' as usize, 0xffa, 12),
            (b'&' as usize, 0xf8, 8),
            (b'\'' as usize, 0x7fa, 11),
            (b'0' as usize, 0x0, 5),
            (b'/' as usize, 0x18, 6),
            (b':' as usize, 0x5c, 7),
            (b'<' as usize, 0x7ffc, 15),
            (b'>' as usize, 0xffb, 12),
            (b'?' as usize, 0x3fc, 10),
            (b'X' as usize, 0xfc, 8),
            (b'Z' as usize, 0xfd, 8),
            (b'\\' as usize, 0x7fff0, 19),
            (b'^' as usize, 0x3ffc, 14),
            (b'`' as usize, 0x7ffd, 15),
            (b't' as usize, 0x9, 5),
            (b'z' as usize, 0x7b, 7),
            (b'{' as usize, 0x7ffe, 15),
            (b'|' as usize, 0x7fc, 11),
            (b'}' as usize, 0x3ffd, 14),
            (b'~' as usize, 0x1ffd, 13),
            (127, 0xffffffc, 28),
            (128, 0xfffe6, 20),
            (129, 0x3fffd2, 22),
            (153, 0x1fffdc, 21),
            (176, 0x1fffe0, 21),
            (192, 0x3ffffe0, 26),
            (195, 0x7fff1, 19),
            (199, 0x1ffffec, 25),
            (203, 0x7ffffde, 27),
            (220, 0xffffffd, 28),
            (226, 0xfffed, 20),
            (231, 0x7ffff3, 23),
            (236, 0xfffff4, 24),
            (249, 0xffffffe, 28),
            (254, 0x7fffff0, 27),
            (255, 0x3ffffee, 26),
            (256, 0x3fffffff, 30),
        ];
        for &(sym, code, len) in expected {
            assert_eq!((CODES[sym], LENS[sym]), (code, len), "symbol {sym}");
        }
    }

    fn dec(src: &[u8]) -> Result<Vec<u8>, HpackError> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    #[test]
    fn every_octet_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let mut enc = BytesMut::new();
        encode(&all, &mut enc);
        assert_eq!(enc.len(), encoded_len(&all));
        assert_eq!(dec(&enc).unwrap(), all);
        for b in 0..=255u8 {
            let mut enc = BytesMut::new();
            encode(&[b, b, b], &mut enc);
            assert_eq!(dec(&enc).unwrap(), [b, b, b], "octet {b}");
        }
    }

    #[test]
    fn rfc_strings() {
        // RFC 7541 C.4.1 and C.6.1.
        let www = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        assert_eq!(dec(&www).unwrap(), b"www.example.com");
        let mut enc = BytesMut::new();
        encode(b"www.example.com", &mut enc);
        assert_eq!(&enc[..], &www);
        assert_eq!(dec(&[0x64, 0x02]).unwrap(), b"302");
        assert_eq!(dec(&[]).unwrap(), b"");
    }

    /// What `encode_short` must append: the literal by the two-pass [`encode`] when its
    /// coding is strictly shorter, else nothing.
    fn reference_short(src: &[u8]) -> Option<Vec<u8>> {
        let len = encoded_len(src);
        if len >= src.len() {
            return None;
        }
        let mut out = BytesMut::new();
        out.extend_from_slice(&[0x80 | len as u8]);
        encode(src, &mut out);
        Some(out.to_vec())
    }

    fn check_short(src: &[u8]) {
        let mut dst = BytesMut::from(&b"ab"[..]);
        let coded = encode_short(src, &mut dst);
        let expect = reference_short(src);
        assert_eq!(coded, expect.is_some(), "{src:?}");
        assert_eq!(&dst[..2], b"ab", "{src:?}");
        assert_eq!(&dst[2..], expect.as_deref().unwrap_or_default(), "{src:?}");
        if coded {
            assert_eq!(dec(&dst[3..]).unwrap(), src);
        }
    }

    #[test]
    fn the_one_pass_coding_is_the_two_pass_one() {
        check_short(b"");
        check_short(b"www.example.com");
        check_short(b"Sat, 28 Nov 2026 10:11:44 GMT");
        check_short(b"nginx/1.22.1");
        check_short(&[b'0'; SHORT]);
        check_short(&[b'e'; SHORT]);
        check_short(&[0xff; SHORT]);
        // At every length, strings around the break-even point: short codes with one long
        // one placed anywhere, and random octets from narrow and full alphabets.
        let mut rng = fastrand::Rng::with_seed(7);
        for len in 0..=SHORT {
            for at in [0, len / 2, len.saturating_sub(1)] {
                let mut s = vec![b'a'; len];
                if len > 0 {
                    s[at] = b'<';
                }
                check_short(&s);
            }
            for alphabet in [
                &b"0123456789"[..],
                b"abcdefghijklmnopqrstuvwxyz-./:; ",
                b"!\"<>[]^`{|}~",
            ] {
                let s: Vec<u8> = (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect();
                check_short(&s);
            }
            for _ in 0..20 {
                let s: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                check_short(&s);
                let s: Vec<u8> = (0..len).map(|_| rng.u8(32..127)).collect();
                check_short(&s);
            }
        }
    }

    #[test]
    fn rejects_eos() {
        // 30 ones (EOS) and two padding ones.
        assert_eq!(dec(&[0xff, 0xff, 0xff, 0xff]), Err(HpackError::HuffmanEos));
        // 'a' (00011) then EOS.
        assert_eq!(
            dec(&[0x1f, 0xff, 0xff, 0xff, 0xfe]),
            Err(HpackError::HuffmanEos)
        );
    }

    #[test]
    fn rejects_long_padding() {
        // 'a' = 00011 + 11 padding is fine; a whole extra byte of ones is 11 bits of padding.
        assert_eq!(dec(&[0x1f]).unwrap(), b"a");
        assert_eq!(dec(&[0x1f, 0xff]), Err(HpackError::HuffmanPaddingTooLong));
        assert_eq!(dec(&[0xff]), Err(HpackError::HuffmanPaddingTooLong));
    }

    #[test]
    fn rejects_non_ones_padding() {
        // 'a' = 00011 then padding 000.
        assert_eq!(dec(&[0x18]), Err(HpackError::HuffmanPaddingNotOnes));
        // '0' = 00000 then 110.
        assert_eq!(dec(&[0x06]), Err(HpackError::HuffmanPaddingNotOnes));
    }
}
