//! The chunked transfer coding (RFC 9112 §7.1): an incremental decoder for bodies read from a
//! peer and an encoder for bodies written to one. Both halves of the crate use it: the server
//! for request bodies, the client for backend responses.
//!
//! The decoder takes bytes as they arrive in a `BytesMut` and hands out body data as `Bytes`
//! split off that buffer (no copy); it never buffers more than one chunk line or the trailer
//! section, each bounded ([`Limits`]). It refuses rather than guesses wherever a lenient reading
//! could make two parsers disagree on where the body ends:
//! - a chunk size of more than [`MAX_SIZE_DIGITS`] hex digits (leading zeros count), or none;
//! - a line not ended by CRLF (a bare LF or CR), or data not followed by CRLF;
//! - control characters in a chunk extension, or extensions past their byte budget;
//! - a trailer section past its byte or field budget, or one httparse refuses (obs-fold,
//!   invalid names or values).
//!
//! Whitespace (SP, HTAB) between the size and a `;` or the CRLF is accepted (RFC 9112's BWS
//! before an extension; hyper and nginx accept it too). Extensions are checked and skipped.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Chunk-size digits accepted on one line, leading zeros included: 16 hex digits fill a `u64`,
/// so no size overflows and no peer can make the decoder read digits for ever.
pub const MAX_SIZE_DIGITS: usize = 16;

/// The bytes that end a chunked body with no trailer fields.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The CRLF after each chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";

/// Bounds of what one chunked body may make the decoder read beyond its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Chunk-extension bytes over the whole body (they are skipped, but each is read).
    pub max_ext_bytes: usize,
    /// Bytes of the trailer section, its final CRLF included.
    pub max_trailer_bytes: usize,
    /// Trailer fields.
    pub max_trailer_fields: usize,
}

impl Default for Limits {
    /// 16 KiB of extensions (hyper's budget), 16 KiB and 64 fields of trailers.
    fn default() -> Self {
        Self {
            max_ext_bytes: 16 * 1024,
            max_trailer_bytes: 16 * 1024,
            max_trailer_fields: 64,
        }
    }
}

/// Why a chunked body was refused. Every one ends the message: the connection cannot be
/// reused, since where the next message starts is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    /// A chunk line did not start with a hex digit, or had a byte other than a hex digit, BWS,
    /// `;` or CRLF after its size.
    #[error("invalid chunk size")]
    InvalidSize,
    /// More than [`MAX_SIZE_DIGITS`] digits in a chunk size.
    #[error("chunk size has more than 16 hex digits")]
    SizeTooLong,
    /// A CR not followed by LF, or an LF not preceded by CR, in a chunk line or after data.
    #[error("chunk line not ended by CRLF")]
    BadLineEnding,
    /// A control character in a chunk extension.
    #[error("invalid byte in a chunk extension")]
    InvalidExtension,
    /// Chunk extensions past [`Limits::max_ext_bytes`].
    #[error("chunk extensions too long")]
    ExtensionsTooLong,
    /// The trailer section is past [`Limits::max_trailer_bytes`] or
    /// [`Limits::max_trailer_fields`].
    #[error("trailer section too large")]
    TrailersTooLarge,
    /// The trailer section is not a valid field section.
    #[error("invalid trailer section")]
    InvalidTrailers,
}

/// What the decoder hands out.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    /// Body data, in order; never empty.
    Data(Bytes),
    /// The body ended; its trailer fields (empty when it had none). The bytes after it in the
    /// buffer belong to the next message.
    End(HeaderMap),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the size's hex digits; `digits` read so far.
    Size { size: u64, digits: usize },
    /// After the digits: BWS, then `;` or CR.
    AfterSize { size: u64 },
    /// Inside extensions, up to the CR.
    Ext { size: u64 },
    /// After the chunk line's CR.
    SizeLf { size: u64 },
    /// Inside a chunk's data; bytes left.
    Data { left: u64 },
    /// After the data, expecting CR.
    DataCr,
    /// After the data's CR, expecting LF.
    DataLf,
    /// After the last chunk: the trailer section up to its empty line.
    Trailers,
    /// The body ended.
    Done,
}

/// An incremental chunked-body decoder. Feed it the connection's read buffer after each read;
/// it consumes what it decodes and leaves what follows the body.
#[derive(Debug, Clone)]
pub struct Decoder {
    state: State,
    limits: Limits,
    ext_bytes: usize,
}

impl Decoder {
    /// A decoder at the start of a chunked body.
    pub fn new(limits: Limits) -> Self {
        Self {
            state: State::Size { size: 0, digits: 0 },
            limits,
            ext_bytes: 0,
        }
    }

    /// Whether the body has ended (after [`Chunk::End`] was handed out).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes what `buf` holds. `Ok(None)`: more bytes are needed (everything consumed that
    /// could be), or the body has ended. Data is split off `buf` as it comes, at most what the
    /// current chunk has left, so a caller bounds memory by how much it reads into `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, ChunkedError> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Data { left } => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data { left }
                    };
                    return Ok(Some(Chunk::Data(buf.split_to(n).freeze())));
                }
                State::Trailers => return self.trailers(buf),
                _ => {}
            }
            let Some(&b) = buf.first() else {
                return Ok(None);
            };
            buf.advance(1);
            self.state = match self.state {
                State::Size { size, digits } => match hex(b) {
                    Some(d) => {
                        if digits == MAX_SIZE_DIGITS {
                            return Err(ChunkedError::SizeTooLong);
                        }
                        State::Size {
                            size: size << 4 | u64::from(d),
                            digits: digits + 1,
                        }
                    }
                    None if digits == 0 => return Err(ChunkedError::InvalidSize),
                    None => self.after_size(size, b)?,
                },
                State::AfterSize { size } => self.after_size(size, b)?,
                State::Ext { size } => match b {
                    b'\r' => State::SizeLf { size },
                    b'\n' => return Err(ChunkedError::BadLineEnding),
                    b'\t' | 0x20..=0x7e | 0x80..=0xff => {
                        self.ext_bytes += 1;
                        if self.ext_bytes > self.limits.max_ext_bytes {
                            return Err(ChunkedError::ExtensionsTooLong);
                        }
                        State::Ext { size }
                    }
                    _ => return Err(ChunkedError::InvalidExtension),
                },
                State::SizeLf { size } => match b {
                    b'\n' if size == 0 => State::Trailers,
                    b'\n' => State::Data { left: size },
                    _ => return Err(ChunkedError::BadLineEnding),
                },
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    _ => return Err(ChunkedError::BadLineEnding),
                },
                State::DataLf => match b {
                    b'\n' => State::Size { size: 0, digits: 0 },
                    _ => return Err(ChunkedError::BadLineEnding),
                },
                State::Data { .. } | State::Trailers | State::Done => unreachable!("handled above"),
            };
        }
    }

    /// The byte after a size's digits (or after BWS following them).
    fn after_size(&mut self, size: u64, b: u8) -> Result<State, ChunkedError> {
        match b {
            b' ' | b'\t' => {
                // BWS counts against the extension budget, so a run of it is bounded too.
                self.ext_bytes += 1;
                if self.ext_bytes > self.limits.max_ext_bytes {
                    return Err(ChunkedError::ExtensionsTooLong);
                }
                Ok(State::AfterSize { size })
            }
            b';' => Ok(State::Ext { size }),
            b'\r' => Ok(State::SizeLf { size }),
            b'\n' => Err(ChunkedError::BadLineEnding),
            _ => Err(ChunkedError::InvalidSize),
        }
    }

    /// The trailer section: waits for its empty line (bounded), then parses it whole.
    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, ChunkedError> {
        if buf.starts_with(b"\r\n") {
            buf.advance(2);
            self.state = State::Done;
            return Ok(Some(Chunk::End(HeaderMap::new())));
        }
        let window = &buf[..buf.len().min(self.limits.max_trailer_bytes)];
        let end = window
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| i + 4);
        // A bare LF makes the section invalid: refuse it as soon as it is seen, whatever
        // follows (so the answer does not depend on how the bytes arrive).
        if has_bare_lf(&window[..end.unwrap_or(window.len())]) {
            return Err(ChunkedError::BadLineEnding);
        }
        let Some(end) = end else {
            if buf.len() >= self.limits.max_trailer_bytes {
                return Err(ChunkedError::TrailersTooLarge);
            }
            return Ok(None);
        };
        let section = &buf[..end];
        let mut fields = vec![httparse::EMPTY_HEADER; self.limits.max_trailer_fields];
        let parsed = match httparse::parse_headers(section, &mut fields) {
            Ok(httparse::Status::Complete((n, parsed))) if n == end => parsed,
            Err(httparse::Error::TooManyHeaders) => return Err(ChunkedError::TrailersTooLarge),
            _ => return Err(ChunkedError::InvalidTrailers),
        };
        let mut map = HeaderMap::with_capacity(parsed.len());
        for f in parsed.iter() {
            let name = HeaderName::from_bytes(f.name.as_bytes())
                .map_err(|_| ChunkedError::InvalidTrailers)?;
            let value =
                HeaderValue::from_bytes(f.value).map_err(|_| ChunkedError::InvalidTrailers)?;
            map.append(name, value);
        }
        buf.advance(end);
        self.state = State::Done;
        Ok(Some(Chunk::End(map)))
    }
}

/// An LF not preceded by CR.
fn has_bare_lf(b: &[u8]) -> bool {
    b.iter()
        .enumerate()
        .any(|(i, &c)| c == b'\n' && (i == 0 || b[i - 1] != b'\r'))
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Writes the line that starts a chunk of `len` bytes (`len` must not be 0: that is the last
/// chunk, [`LAST_CHUNK`] or [`put_end`]). The data and then [`CHUNK_END`] follow it; a writer
/// sends the three as one vectored write.
pub fn put_chunk_head(out: &mut impl BufMut, len: usize) {
    debug_assert!(len > 0, "a 0-size chunk ends the body");
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = len as u64;
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[i..]);
    out.put_slice(b"\r\n");
}

/// Whether a field may not be sent as a trailer (RFC 9110 §6.5.1): the rule of
/// `sweety-fields`, shared with `sweety-h2`.
pub use sweety_fields::forbidden_trailer;

/// Writes the end of a chunked body: the last chunk, the trailer fields, the empty line. A
/// writer of a message to a peer that did not write it leaves the [`forbidden_trailer`]
/// fields out first.
pub fn put_end(out: &mut impl BufMut, trailers: &HeaderMap) {
    out.put_slice(b"0\r\n");
    for (name, value) in trailers {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
}

/// Encodes a whole body into `out` (one chunk per slice, empty slices skipped, then the end).
/// For tests and for small bodies written at once.
pub fn encode(out: &mut BytesMut, chunks: &[&[u8]], trailers: &HeaderMap) {
    for c in chunks.iter().filter(|c| !c.is_empty()) {
        put_chunk_head(out, c.len());
        out.put_slice(c);
        out.put_slice(CHUNK_END);
    }
    put_end(out, trailers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The body, the trailers when it ended, and the bytes left after it.
    type Outcome = Result<(Vec<u8>, Option<HeaderMap>, Vec<u8>), ChunkedError>;

    /// Feeds `input` whole; returns the body, the trailers and what is left after the body.
    fn decode_all(input: &[u8]) -> Outcome {
        decode_split(input, &[input.len()])
    }

    /// Feeds `input` in pieces of the given sizes (cycled), decoding after each.
    fn decode_split(input: &[u8], sizes: &[usize]) -> Outcome {
        let mut d = Decoder::new(Limits::default());
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut end = None;
        let mut pos = 0;
        let mut k = 0;
        loop {
            while let Some(c) = d.decode(&mut buf)? {
                match c {
                    Chunk::Data(b) => {
                        assert!(!b.is_empty(), "Data is never empty");
                        body.extend_from_slice(&b);
                    }
                    Chunk::End(t) => {
                        assert!(end.is_none(), "End comes once");
                        end = Some(t);
                    }
                }
            }
            if pos == input.len() {
                break;
            }
            let n = sizes[k % sizes.len()].max(1).min(input.len() - pos);
            k += 1;
            buf.extend_from_slice(&input[pos..pos + n]);
            pos += n;
        }
        assert_eq!(d.is_done(), end.is_some());
        Ok((body, end, buf.to_vec()))
    }

    #[test]
    fn decodes_chunks_and_leaves_the_next_message() {
        let (body, end, rest) = decode_all(
            b"5\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\nGET / HTTP/1.1\r\n",
        )
        .unwrap();
        assert_eq!(body, b"helloabcdefghijklmnopqrstuvwxyz");
        assert!(end.unwrap().is_empty());
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn an_unfinished_body_is_not_done() {
        let (body, end, rest) = decode_all(b"5\r\nhel").unwrap();
        assert_eq!(body, b"hel");
        assert!(end.is_none());
        assert!(rest.is_empty());
        let (_, end, rest) = decode_all(b"0\r\n\r").unwrap();
        assert!(end.is_none());
        assert_eq!(rest, b"\r", "the trailer section waits for its empty line");
    }

    #[test]
    fn extensions_and_bws_are_skipped() {
        let (body, end, _) =
            decode_all(b"3 ;a=b;c=\"d e\"\r\nabc\r\n2\t\r\nde\r\n0;last\r\n\r\n").unwrap();
        assert_eq!(body, b"abcde");
        assert!(end.is_some());
    }

    #[test]
    fn trailers_are_parsed() {
        let (body, end, rest) =
            decode_all(b"1\r\nx\r\n0\r\nX-Sum: abc\r\nX-Two: 1\r\nx-two: 2\r\n\r\nnext").unwrap();
        assert_eq!(body, b"x");
        let t = end.unwrap();
        assert_eq!(t["x-sum"], "abc");
        assert_eq!(t.get_all("x-two").iter().count(), 2);
        assert_eq!(rest, b"next");
    }

    #[test]
    fn refusals() {
        let cases: &[(&[u8], ChunkedError)] = &[
            (b"\r\n", ChunkedError::InvalidSize),
            (b"g\r\n", ChunkedError::InvalidSize),
            (b"-1\r\n", ChunkedError::InvalidSize),
            (b"+1\r\n", ChunkedError::InvalidSize),
            (b"0x5\r\n", ChunkedError::InvalidSize),
            (b"5 5\r\n", ChunkedError::InvalidSize),
            (b"00000000000000001\r\n", ChunkedError::SizeTooLong),
            (b"10000000000000000\r\n", ChunkedError::SizeTooLong),
            (b"5\nhello\r\n", ChunkedError::BadLineEnding),
            (b"5\rhello\r\n", ChunkedError::BadLineEnding),
            (b"5\r\nhelloX\r\n", ChunkedError::BadLineEnding),
            (b"5\r\nhello\rX", ChunkedError::BadLineEnding),
            (b"5\r\nhello\n0\r\n\r\n", ChunkedError::BadLineEnding),
            (b"5;a\nb\r\n", ChunkedError::BadLineEnding),
            (b"5;a\x00\r\n", ChunkedError::InvalidExtension),
            (b"5;a\x7f\r\n", ChunkedError::InvalidExtension),
            (b"0\r\nX: a\n\r\n", ChunkedError::BadLineEnding),
            (b"0\r\nX: a\r\n\n", ChunkedError::BadLineEnding),
            (b"0\r\n\n", ChunkedError::BadLineEnding),
            (b"0\r\nX: a\r\n y\r\n\r\n", ChunkedError::InvalidTrailers),
            (b"0\r\nX a\r\n\r\n", ChunkedError::InvalidTrailers),
            (b"0\r\n: a\r\n\r\n", ChunkedError::InvalidTrailers),
        ];
        for (input, want) in cases {
            assert_eq!(
                decode_all(input).map(|_| ()),
                Err(*want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn the_largest_size_is_accepted_without_overflow() {
        let mut d = Decoder::new(Limits::default());
        let mut buf = BytesMut::from(&b"ffffffffffffffff\r\nab"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap(),
            Some(Chunk::Data(Bytes::from_static(b"ab")))
        );
        assert_eq!(d.state, State::Data { left: u64::MAX - 2 });
    }

    #[test]
    fn extension_budget_is_over_the_whole_body() {
        let limits = Limits {
            max_ext_bytes: 10,
            ..Limits::default()
        };
        let mut d = Decoder::new(limits);
        let mut ok = BytesMut::from(&b"1;aaaaa\r\nx\r\n1;bbbbb\r\ny\r\n"[..]);
        while d.decode(&mut ok).unwrap().is_some() {}
        assert!(ok.is_empty());
        let mut over = BytesMut::from(&b"1;c\r\n"[..]);
        assert_eq!(d.decode(&mut over), Err(ChunkedError::ExtensionsTooLong));
        let mut d = Decoder::new(limits);
        let mut bws = BytesMut::from(&b"1           \r\n"[..]);
        assert_eq!(d.decode(&mut bws), Err(ChunkedError::ExtensionsTooLong));
    }

    #[test]
    fn trailer_bounds() {
        let limits = Limits {
            max_trailer_bytes: 32,
            max_trailer_fields: 2,
            ..Limits::default()
        };
        let mut d = Decoder::new(limits);
        let mut buf = BytesMut::from(&b"0\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"[..]);
        assert_eq!(d.decode(&mut buf), Err(ChunkedError::TrailersTooLarge));
        let mut d = Decoder::new(limits);
        let mut buf = BytesMut::from(&b"0\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n"[..]);
        assert_eq!(d.decode(&mut buf), Err(ChunkedError::TrailersTooLarge));
        let mut d = Decoder::new(limits);
        let mut buf = BytesMut::from(&b"0\r\na: 1\r\nb: 2\r\n\r\n"[..]);
        let Some(Chunk::End(t)) = d.decode(&mut buf).unwrap() else {
            panic!("two fields fit")
        };
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn encoder_writes_hex_sizes_and_trailers() {
        let mut out = BytesMut::new();
        let mut t = HeaderMap::new();
        t.insert("x-sum", HeaderValue::from_static("1"));
        encode(&mut out, &[b"hello", b"", &[b'a'; 26]], &t);
        let mut want = b"5\r\nhello\r\n1a\r\n".to_vec();
        want.extend_from_slice(&[b'a'; 26]);
        want.extend_from_slice(b"\r\n0\r\nx-sum: 1\r\n\r\n");
        assert_eq!(&out[..], &want[..]);
        let mut out = BytesMut::new();
        encode(&mut out, &[], &HeaderMap::new());
        assert_eq!(&out[..], LAST_CHUNK);
        let mut out = BytesMut::new();
        put_chunk_head(&mut out, usize::MAX);
        assert_eq!(&out[..], format!("{:x}\r\n", usize::MAX).as_bytes());
    }

    fn arb_trailers() -> impl Strategy<Value = Vec<(String, String)>> {
        proptest::collection::vec(("[a-z][a-z0-9-]{0,8}", "[!-~]([ -~]{0,10}[!-~])?"), 0..4)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the encoder writes, the decoder reads back, however the bytes are split,
        /// and what follows the body is left untouched.
        #[test]
        fn encode_then_decode_round_trips(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
            trailers in arb_trailers(),
            splits in proptest::collection::vec(1usize..40, 1..8),
            after in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            let mut t = HeaderMap::new();
            for (n, v) in &trailers {
                t.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
            }
            let refs: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
            let mut wire = BytesMut::new();
            encode(&mut wire, &refs, &t);
            wire.extend_from_slice(&after);
            let (body, end, rest) = decode_split(&wire, &splits).unwrap();
            prop_assert_eq!(body, chunks.concat());
            prop_assert_eq!(end.unwrap(), t);
            prop_assert_eq!(rest, after);
        }

        /// On arbitrary bytes the decoder never panics, its result does not depend on how the
        /// bytes are split, and it never hands out more data than the input had.
        #[test]
        fn arbitrary_bytes_decode_the_same_however_split(
            input in proptest::collection::vec(
                prop_oneof![Just(b'0'), Just(b'1'), Just(b'a'), Just(b'\r'), Just(b'\n'), Just(b';'),
                            Just(b' '), Just(b':'), Just(b'x'), any::<u8>()],
                0..80),
            splits in proptest::collection::vec(1usize..10, 1..5),
        ) {
            let whole = decode_all(&input);
            let split = decode_split(&input, &splits);
            match (&whole, &split) {
                (Ok((b1, e1, r1)), Ok((b2, e2, r2))) => {
                    prop_assert_eq!(b1, b2);
                    prop_assert_eq!(e1.is_some(), e2.is_some());
                    if e1.is_some() {
                        prop_assert_eq!(e1, e2);
                        prop_assert_eq!(r1, r2);
                    }
                    prop_assert!(b1.len() <= input.len());
                }
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                _ => prop_assert!(false, "whole {:?} split {:?}", whole, split),
            }
        }
    }
}
