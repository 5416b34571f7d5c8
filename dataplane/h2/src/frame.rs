//! HTTP/2 frames (RFC 9113 §4 and §6): the 9-byte frame header, the frame types and flags,
//! error codes, SETTINGS parameters, and writers that append frames to a connection's output
//! buffer. Parsing checks the fixed-size frames' lengths and the stream-id rules that do not
//! need connection state; the connection driver ([`super::conn`]) does the rest.

use bytes::{BufMut, BytesMut};

/// Length of a frame header.
pub const HEADER_LEN: usize = 9;
/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE's initial value and floor.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
/// SETTINGS_MAX_FRAME_SIZE's ceiling.
pub const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;
/// Largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Initial flow-control window of streams and the connection.
pub const DEFAULT_WINDOW: u32 = 65_535;

/// Frame types.
pub mod kind {
    /// DATA (RFC 9113 §6.1): request or response body bytes.
    pub const DATA: u8 = 0x0;
    /// HEADERS (RFC 9113 §6.2): opens a stream with a header block, or carries trailers.
    pub const HEADERS: u8 = 0x1;
    /// PRIORITY (RFC 9113 §6.3): deprecated priority signal; checked for form, then ignored.
    pub const PRIORITY: u8 = 0x2;
    /// RST_STREAM (RFC 9113 §6.4): ends one stream with an error code.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS (RFC 9113 §6.5): connection parameters, or their acknowledgement.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE (RFC 9113 §6.6): server push, which a client must never send.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING (RFC 9113 §6.7): liveness and round-trip probe, answered with ACK.
    pub const PING: u8 = 0x6;
    /// GOAWAY (RFC 9113 §6.8): the sender stops accepting streams above the last id.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE (RFC 9113 §6.9): opens flow-control window of a stream or the connection.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION (RFC 9113 §6.10): the rest of a header block too large for one frame.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    /// DATA or HEADERS: the sender's last frame on this stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS or PING: an acknowledgement, not a new value (same bit as END_STREAM).
    pub const ACK: u8 = 0x1;
    /// HEADERS, PUSH_PROMISE or CONTINUATION: the header block is complete.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA or HEADERS: a pad-length byte and padding surround the payload.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: the payload starts with priority fields (checked for form, then ignored).
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameter identifiers.
pub mod setting {
    /// Largest HPACK dynamic table the sender's decoder allows (RFC 9113 §6.5.2).
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// Whether server push is allowed; a client may only send 0 or 1.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// Most streams the peer may have open at once.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// Initial flow-control window of every stream, in bytes.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// Largest frame payload the sender accepts, in bytes (16 KiB to 16 MiB - 1).
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    /// Advisory limit on a decoded header list's size (names + values + 32 per field).
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// Extended CONNECT (RFC 8441) is allowed: WebSocket over HTTP/2.
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
}

/// HTTP/2 error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub u32);

impl Reason {
    /// Graceful end of a stream or connection; not an error.
    pub const NO_ERROR: Reason = Reason(0x0);
    /// The peer broke the protocol; no more specific code applies.
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    /// The sender failed on its own side.
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    /// The peer sent more than its flow-control window allowed.
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    /// A SETTINGS frame was not acknowledged in time.
    pub const SETTINGS_TIMEOUT: Reason = Reason(0x4);
    /// A frame arrived on a stream already half-closed by its sender.
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    /// A frame had a size its type or SETTINGS_MAX_FRAME_SIZE forbids.
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    /// The stream was refused before any processing: the client may retry it.
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    /// The stream is no longer wanted.
    pub const CANCEL: Reason = Reason(0x8);
    /// The HPACK state could not be kept in sync: the connection must end.
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    /// The tunnel of a CONNECT request was reset or closed abnormally.
    pub const CONNECT_ERROR: Reason = Reason(0xa);
    /// The peer generates too much load (a flood); it should slow down.
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);

    /// The code's name, for logs and metrics.
    pub fn name(self) -> &'static str {
        match self.0 {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x3 => "FLOW_CONTROL_ERROR",
            0x4 => "SETTINGS_TIMEOUT",
            0x5 => "STREAM_CLOSED",
            0x6 => "FRAME_SIZE_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0x9 => "COMPRESSION_ERROR",
            0xa => "CONNECT_ERROR",
            0xb => "ENHANCE_YOUR_CALM",
            0xc => "INADEQUATE_SECURITY",
            0xd => "HTTP_1_1_REQUIRED",
            _ => "UNKNOWN",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Payload length in bytes (24 bits).
    pub len: u32,
    /// Frame type, one of [`kind`].
    pub kind: u8,
    /// Flag bits, see [`flag`] and [`Head::has`].
    pub flags: u8,
    /// Stream identifier (31 bits); 0 is the connection itself.
    pub stream: u32,
}

impl Head {
    /// Parses the first [`HEADER_LEN`] bytes of `b` (the reserved bit of the stream id is
    /// ignored, as RFC 9113 §4.1 requires).
    pub fn parse(b: &[u8]) -> Head {
        Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    /// Whether every bit of flag `f` is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f == f
    }
}

/// Appends a frame header.
pub fn put_head(dst: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len <= MAX_MAX_FRAME_SIZE as usize);
    let l = (len as u32).to_be_bytes();
    dst.put_slice(&[l[1], l[2], l[3], kind, flags]);
    dst.put_u32(stream & 0x7fff_ffff);
}

/// Strips the padding of a DATA or HEADERS payload (`PADDED` set): the content, or `None`
/// when the pad length is not smaller than the payload (a PROTOCOL_ERROR).
pub fn unpad(payload: &[u8]) -> Option<&[u8]> {
    let (&pad, rest) = payload.split_first()?;
    let end = rest.len().checked_sub(pad as usize)?;
    Some(&rest[..end])
}

/// The PRIORITY fields of a HEADERS or PRIORITY frame: the stream it depends on.
pub fn priority_dependency(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff
}

/// Appends a SETTINGS frame with these parameters.
pub fn put_settings(dst: &mut BytesMut, params: &[(u16, u32)]) {
    put_head(dst, params.len() * 6, kind::SETTINGS, 0, 0);
    for &(id, v) in params {
        dst.put_u16(id);
        dst.put_u32(v);
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn put_settings_ack(dst: &mut BytesMut) {
    put_head(dst, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends a PING (not an acknowledgement).
pub fn put_ping(dst: &mut BytesMut, data: [u8; 8]) {
    put_head(dst, 8, kind::PING, 0, 0);
    dst.put_slice(&data);
}

/// Appends a PING acknowledgement echoing `data`.
pub fn put_ping_ack(dst: &mut BytesMut, data: &[u8]) {
    put_head(dst, 8, kind::PING, flag::ACK, 0);
    dst.put_slice(data);
}

/// Appends a WINDOW_UPDATE.
pub fn put_window_update(dst: &mut BytesMut, stream: u32, increment: u32) {
    put_head(dst, 4, kind::WINDOW_UPDATE, 0, stream);
    dst.put_u32(increment & 0x7fff_ffff);
}

/// Appends a RST_STREAM.
pub fn put_rst(dst: &mut BytesMut, stream: u32, reason: Reason) {
    put_head(dst, 4, kind::RST_STREAM, 0, stream);
    dst.put_u32(reason.0);
}

/// Appends a GOAWAY with an optional debug text.
pub fn put_goaway(dst: &mut BytesMut, last_stream: u32, reason: Reason, debug: &[u8]) {
    put_head(dst, 8 + debug.len(), kind::GOAWAY, 0, 0);
    dst.put_u32(last_stream & 0x7fff_ffff);
    dst.put_u32(reason.0);
    dst.put_slice(debug);
}

/// Appends a DATA frame carrying `data`.
pub fn put_data(dst: &mut BytesMut, stream: u32, data: &[u8], end_stream: bool) {
    let flags = if end_stream { flag::END_STREAM } else { 0 };
    put_head(dst, data.len(), kind::DATA, flags, stream);
    dst.put_slice(data);
}

/// Appends an encoded header block as HEADERS plus as many CONTINUATION frames as
/// `max_frame` requires.
pub fn put_headers(
    dst: &mut BytesMut,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1));
    let first = chunks.next().unwrap_or(&[]);
    let last = block.len() <= max_frame;
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if last {
        flags |= flag::END_HEADERS;
    }
    dst.reserve(block.len() + HEADER_LEN * (1 + block.len() / max_frame.max(1)));
    put_head(dst, first.len(), kind::HEADERS, flags, stream);
    dst.put_slice(first);
    let mut rest = chunks.peekable();
    while let Some(c) = rest.next() {
        let f = if rest.peek().is_none() {
            flag::END_HEADERS
        } else {
            0
        };
        put_head(dst, c.len(), kind::CONTINUATION, f, stream);
        dst.put_slice(c);
    }
}

/// One SETTINGS parameter of a received frame.
pub fn settings_params(payload: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    payload.chunks_exact(6).map(|c| {
        (
            u16::from_be_bytes([c[0], c[1]]),
            u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_headers_round_trip_and_ignore_the_reserved_bit() {
        let mut b = BytesMut::new();
        put_head(&mut b, 0x01_02_03, kind::HEADERS, flag::END_HEADERS, 7);
        assert_eq!(b.len(), HEADER_LEN);
        let h = Head::parse(&b);
        assert_eq!(
            h,
            Head {
                len: 0x01_02_03,
                kind: kind::HEADERS,
                flags: flag::END_HEADERS,
                stream: 7
            }
        );
        assert!(h.has(flag::END_HEADERS) && !h.has(flag::END_STREAM));
        let raw = [0, 0, 0, kind::DATA, 0, 0x80, 0, 0, 3];
        assert_eq!(Head::parse(&raw).stream, 3, "reserved bit ignored");
    }

    #[test]
    fn padding_is_stripped_and_overlong_padding_refused() {
        assert_eq!(unpad(&[2, b'a', b'b', 0, 0]), Some(&b"ab"[..]));
        assert_eq!(unpad(&[0]), Some(&b""[..]));
        assert_eq!(unpad(&[3, 0, 0]), None, "pad length beyond the payload");
        assert_eq!(unpad(&[1, 0]), Some(&b""[..]));
        assert_eq!(unpad(&[]), None);
    }

    #[test]
    fn large_header_blocks_are_split_into_continuations() {
        let block: Vec<u8> = (0..40u8).collect();
        let mut b = BytesMut::new();
        put_headers(&mut b, 5, &block, true, 16);
        let mut at = 0;
        let mut frames = Vec::new();
        while at < b.len() {
            let h = Head::parse(&b[at..]);
            frames.push((h.kind, h.flags, h.len));
            at += HEADER_LEN + h.len as usize;
        }
        assert_eq!(
            frames,
            [
                (kind::HEADERS, flag::END_STREAM, 16),
                (kind::CONTINUATION, 0, 16),
                (kind::CONTINUATION, flag::END_HEADERS, 8)
            ]
        );
        let mut small = BytesMut::new();
        put_headers(&mut small, 1, b"abc", false, 16);
        assert_eq!(Head::parse(&small).flags, flag::END_HEADERS);
    }

    #[test]
    fn settings_and_control_frames_encode_as_specified() {
        let mut b = BytesMut::new();
        put_settings(&mut b, &[(setting::MAX_CONCURRENT_STREAMS, 100)]);
        assert_eq!(&b[..], &[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
        let params: Vec<_> = settings_params(&b[HEADER_LEN..]).collect();
        assert_eq!(params, [(3, 100)]);
        b.clear();
        put_goaway(&mut b, 9, Reason::ENHANCE_YOUR_CALM, b"x");
        assert_eq!(
            &b[..],
            &[0, 0, 9, 7, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0xb, b'x']
        );
        b.clear();
        put_window_update(&mut b, 1, 0x8000_0001);
        assert_eq!(&b[HEADER_LEN..], &[0, 0, 0, 1], "reserved bit cleared");
        assert_eq!(Reason::REFUSED_STREAM.name(), "REFUSED_STREAM");
    }
}
