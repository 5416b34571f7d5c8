//! A streaming body over a byte range of an open file, read in bounded chunks on the
//! blocking pool, so large files are never held in memory and only the range is read.

use crate::body::BoxError;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::fs::File;
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::task::JoinHandle;

/// Largest body frame the handler yields when streaming a file (large files are read
/// in chunks of this size; only small files are sent as one frame).
pub const CHUNK_SIZE: usize = 128 * 1024;

/// A request extension asking for smaller file chunks than [`CHUNK_SIZE`] (HTTP/3 sets it
/// from `http3.static_chunk_size`: each stream holds one chunk while QUIC paces it).
#[derive(Debug, Clone, Copy)]
pub struct ReadChunk(pub usize);

enum State {
    /// Waiting for the next poll; `Some(offset)` when a seek is still due.
    Idle(File, Option<u64>),
    /// A chunk read is in flight on the blocking pool.
    Reading(JoinHandle<io::Result<(File, Bytes)>>),
    Done,
}

/// Streams `remaining` bytes of a file starting at an offset, `CHUNK_SIZE` at a time.
pub(crate) struct FileBody {
    state: State,
    remaining: u64,
    chunk: usize,
}

impl FileBody {
    /// A body of `len` bytes of `file` starting at `offset`, read `chunk` bytes at a time
    /// (clamped to 1..=[`CHUNK_SIZE`]).
    pub(crate) fn new(file: File, offset: u64, len: u64, chunk: usize) -> FileBody {
        let state = if len == 0 {
            State::Done
        } else {
            State::Idle(file, (offset != 0).then_some(offset))
        };
        FileBody {
            state,
            remaining: len,
            chunk: chunk.clamp(1, CHUNK_SIZE),
        }
    }
}

/// Reads exactly `n` bytes (after an optional seek); a short file is an error, since the
/// response length was already promised.
fn read_chunk(mut file: File, seek: Option<u64>, n: usize) -> io::Result<(File, Bytes)> {
    if let Some(off) = seek {
        file.seek(SeekFrom::Start(off))?;
    }
    let mut buf = Vec::with_capacity(n);
    (&mut file).take(n as u64).read_to_end(&mut buf)?;
    if buf.len() != n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file shrank while being served",
        ));
    }
    Ok((file, Bytes::from(buf)))
}

impl http_body::Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            match std::mem::replace(&mut this.state, State::Done) {
                State::Done => return Poll::Ready(None),
                State::Idle(file, seek) => {
                    let n = this.remaining.min(this.chunk as u64) as usize;
                    let handle = tokio::task::spawn_blocking(move || read_chunk(file, seek, n));
                    this.state = State::Reading(handle);
                }
                State::Reading(mut handle) => {
                    let res = match Pin::new(&mut handle).poll(cx) {
                        Poll::Pending => {
                            this.state = State::Reading(handle);
                            return Poll::Pending;
                        }
                        Poll::Ready(res) => res,
                    };
                    return Poll::Ready(Some(match res {
                        Ok(Ok((file, bytes))) => {
                            this.remaining -= bytes.len() as u64;
                            if this.remaining > 0 {
                                this.state = State::Idle(file, None);
                            }
                            Ok(Frame::data(bytes))
                        }
                        Ok(Err(e)) => Err(e.into()),
                        Err(join) => Err(join.into()),
                    }));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::io::Write;

    /// Reads `body` to the end, returning the size of every data frame.
    async fn frame_sizes(mut body: FileBody) -> Vec<usize> {
        let mut sizes = Vec::new();
        // Bounded: a 40,000-byte body yields at most 40,000 frames.
        for _ in 0..40_000 {
            match body.frame().await {
                Some(f) => sizes.push(f.unwrap().into_data().unwrap().len()),
                None => break,
            }
        }
        sizes
    }

    #[tokio::test]
    async fn reads_in_the_requested_chunk_size_capped_at_chunk_size() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&vec![7u8; 40_000]).unwrap();
        let open = || File::open(tmp.path()).unwrap();
        let small = FileBody::new(open(), 0, 40_000, 16 * 1024);
        assert_eq!(frame_sizes(small).await, vec![16_384, 16_384, 7_232]);
        // From an offset, and a chunk above CHUNK_SIZE is clamped (the whole range fits one).
        let big = FileBody::new(open(), 1_000, 39_000, 10 * CHUNK_SIZE);
        assert_eq!(frame_sizes(big).await, vec![39_000]);
    }
}
