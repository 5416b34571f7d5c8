//! Decoding a backend's response body out of the connection's read buffer: by
//! `Content-Length`, chunked ([`crate::chunked`]) or until the backend closes.
//!
//! The decoder never reads past the body: whatever follows it in the buffer is left there
//! (the caller then knows the backend sent more than it declared, and closes the
//! connection). Small pieces are copied out so that the read buffer stays unshared and is
//! reused for the next read; larger ones are split off without a copy.

use super::head::ResponseFraming;
use crate::chunked::Chunk;
use bytes::{Buf, Bytes, BytesMut};

/// Body pieces of at most this many bytes are copied out of the read buffer (which then
/// stays unshared and reusable); larger ones are split off it.
pub const COPY_AT_MOST: usize = 4096;

/// What one decoding step found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The buffer holds no more of the body: read more.
    NeedMore,
    /// The body is complete.
    End,
    /// The body is complete, with these trailer fields (a chunked body's).
    Trailers(http::HeaderMap),
}

/// Why a response body is broken. The connection cannot be used any more.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    /// The backend closed the connection before the body's declared end.
    #[error("backend closed the connection {0} body bytes before the declared end")]
    Truncated(u64),
    /// The chunked framing is malformed or past its bounds.
    #[error("malformed chunked body: {0}")]
    Chunked(#[from] crate::chunked::ChunkedError),
    /// The backend closed the connection inside a chunked body.
    #[error("backend closed the connection inside a chunked body")]
    ChunkedTruncated,
}

/// Where a response body stands.
#[derive(Debug)]
pub enum Decoder {
    /// This many bytes are left.
    Length(u64),
    /// Chunked.
    Chunked(crate::chunked::Decoder),
    /// Until the connection closes.
    Close,
    /// Complete.
    Done,
}

/// The first `n` bytes of `buf`, copied when small, split off when not.
pub fn take(buf: &mut BytesMut, n: usize) -> Bytes {
    if n <= COPY_AT_MOST {
        let b = Bytes::copy_from_slice(&buf[..n]);
        buf.advance(n);
        b
    } else {
        buf.split_to(n).freeze()
    }
}

impl Decoder {
    /// The decoder of a body framed as `framing`.
    pub fn new(framing: ResponseFraming) -> Decoder {
        match framing {
            ResponseFraming::Empty | ResponseFraming::Length(0) => Decoder::Done,
            ResponseFraming::Length(n) => Decoder::Length(n),
            ResponseFraming::Chunked => Decoder::Chunked(crate::chunked::Decoder::new(
                crate::chunked::Limits::default(),
            )),
            ResponseFraming::Close => Decoder::Close,
        }
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Body bytes left when the length is known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// The next piece of the body from `buf`, consuming what it decodes (and nothing past the
    /// body's end).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, BodyError> {
        match self {
            Decoder::Done => Ok(Decoded::End),
            Decoder::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= n as u64;
                if *left == 0 {
                    *self = Decoder::Done;
                }
                Ok(Decoded::Data(take(buf, n)))
            }
            Decoder::Close => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = buf.len();
                Ok(Decoded::Data(take(buf, n)))
            }
            Decoder::Chunked(c) => match c.decode(buf)? {
                // Split off the buffer: a small piece is copied so that the buffer is
                // unshared again once the split is dropped.
                Some(Chunk::Data(d)) if d.len() <= COPY_AT_MOST => {
                    Ok(Decoded::Data(Bytes::copy_from_slice(&d)))
                }
                Some(Chunk::Data(d)) => Ok(Decoded::Data(d)),
                Some(Chunk::End(trailers)) => {
                    *self = Decoder::Done;
                    Ok(if trailers.is_empty() {
                        Decoded::End
                    } else {
                        Decoded::Trailers(trailers)
                    })
                }
                None if c.is_done() => {
                    *self = Decoder::Done;
                    Ok(Decoded::End)
                }
                None => Ok(Decoded::NeedMore),
            },
        }
    }

    /// The connection reached its end: fine for a close-delimited body (now complete), an
    /// error for a body that had a declared end not reached yet.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(())
            }
            Decoder::Length(n) => Err(BodyError::Truncated(*n)),
            Decoder::Chunked(_) => Err(BodyError::ChunkedTruncated),
        }
    }
}
