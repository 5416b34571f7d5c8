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
}

impl FileBody {
    /// A body of `len` bytes of `file` starting at `offset`.
    pub(crate) fn new(file: File, offset: u64, len: u64) -> FileBody {
        let state = if len == 0 {
            State::Done
        } else {
            State::Idle(file, (offset != 0).then_some(offset))
        };
        FileBody {
            state,
            remaining: len,
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
                    let n = this.remaining.min(CHUNK_SIZE as u64) as usize;
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
