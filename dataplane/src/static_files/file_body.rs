//! A streaming body over a byte range of an open file, read in bounded chunks on the
//! blocking pool, so large files are never held in memory and only the range is read.
//!
//! A connection's file bodies share one [`ReadBudget`] (`limits.static_read_ahead` bytes):
//! a chunk's bytes count against the budget until the last reference to them is dropped
//! (written to the socket or framed into the output buffer). A stream that finds the budget
//! full still makes progress, [`UNBUDGETED_CHUNK`] bytes at a time: it never waits for other
//! streams (one the client pauses with its flow-control window must not stall the rest). So
//! the file bytes a connection holds ahead of its client are at most
//! `static_read_ahead + streams x UNBUDGETED_CHUNK`, where they were `streams x CHUNK_SIZE`.

use crate::body::BoxError;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::fs::File;
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// Largest body frame the handler yields when streaming a file (large files are read
/// in chunks of this size; only small files are sent as one frame).
pub const CHUNK_SIZE: usize = 128 * 1024;

/// The chunk a stream reads when its connection's [`ReadBudget`] is full (one HTTP/2 DATA
/// frame of the default size).
pub const UNBUDGETED_CHUNK: usize = 16 * 1024;

/// A request extension asking for smaller file chunks than [`CHUNK_SIZE`] (HTTP/3 sets it
/// from `http3.static_chunk_size`: each stream holds one chunk while QUIC paces it).
#[derive(Debug, Clone, Copy)]
pub struct ReadChunk(pub usize);

/// File bytes read and not yet released, all connections: what [`ReadBudget`]s hold.
static HELD: AtomicU64 = AtomicU64::new(0);

/// File bytes read ahead of clients right now, all connections together (the sum of what
/// their [`ReadBudget`]s hold, each at most its size).
pub fn read_ahead_bytes() -> u64 {
    HELD.load(Ordering::Relaxed)
}

/// The file bytes one connection may hold read ahead of its client, all its streams
/// together (`limits.static_read_ahead`). Cloned into every request of the connection.
#[derive(Debug, Clone)]
pub struct ReadBudget {
    permits: Arc<Semaphore>,
    size: u32,
}

impl ReadBudget {
    /// A budget of `bytes` (at least 1).
    pub fn new(bytes: u32) -> ReadBudget {
        let size = bytes.max(1);
        ReadBudget {
            permits: Arc::new(Semaphore::new(size as usize)),
            size,
        }
    }

    /// Bytes of this budget held by chunks read and not yet released.
    pub fn held(&self) -> usize {
        self.size as usize - self.permits.available_permits()
    }
}

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
    budget: Option<ReadBudget>,
}

impl FileBody {
    /// A body of `len` bytes of `file` starting at `offset`, read `chunk` bytes at a time
    /// (clamped to 1..=[`CHUNK_SIZE`] and to the budget's size), each chunk taken from
    /// `budget` when there is one.
    pub(crate) fn new(
        file: File,
        offset: u64,
        len: u64,
        chunk: usize,
        budget: Option<ReadBudget>,
    ) -> FileBody {
        let state = if len == 0 {
            State::Done
        } else {
            State::Idle(file, (offset != 0).then_some(offset))
        };
        let cap = budget.as_ref().map_or(CHUNK_SIZE, |b| b.size as usize);
        FileBody {
            state,
            remaining: len,
            chunk: chunk.clamp(1, CHUNK_SIZE).min(cap),
            budget,
        }
    }

    fn next_len(&self) -> usize {
        self.remaining.min(self.chunk as u64) as usize
    }
}

/// The bytes of one chunk and the budget they hold, released when the last `Bytes` referring
/// to them is dropped.
struct Held {
    buf: Vec<u8>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(self.buf.len() as u64, Ordering::Relaxed);
    }
}

/// Reads exactly `n` bytes into the empty `buf` (after an optional seek); a
/// short file is an error, since the response length was already promised.
///
/// `buf` is allocated by the caller, on the runtime thread that later frees it: allocated on
/// the blocking-pool thread, each of up to `max_blocking_threads` threads kept its own
/// allocator pages of chunks (mimalloc returns a block to the heap of the thread that
/// allocated it), tens of MiB of RSS under bulk load.
fn read_chunk(
    mut file: File,
    seek: Option<u64>,
    n: usize,
    mut buf: Vec<u8>,
    permit: Option<OwnedSemaphorePermit>,
) -> io::Result<(File, Bytes)> {
    if let Some(off) = seek {
        file.seek(SeekFrom::Start(off))?;
    }
    (&mut file).take(n as u64).read_to_end(&mut buf)?;
    if buf.len() != n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file shrank while being served",
        ));
    }
    HELD.fetch_add(n as u64, Ordering::Relaxed);
    Ok((
        file,
        Bytes::from_owner(Held {
            buf,
            _permit: permit,
        }),
    ))
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
                    let mut n = this.next_len();
                    let permit = match &this.budget {
                        None => None,
                        Some(b) => match b.permits.clone().try_acquire_many_owned(n as u32) {
                            Ok(p) => Some(p),
                            Err(_) => {
                                // Full: a small chunk outside it (see the module docs).
                                n = n.min(UNBUDGETED_CHUNK);
                                None
                            }
                        },
                    };
                    let buf = Vec::with_capacity(n);
                    let handle =
                        tokio::task::spawn_blocking(move || read_chunk(file, seek, n, buf, permit));
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
        let small = FileBody::new(open(), 0, 40_000, 16 * 1024, None);
        assert_eq!(frame_sizes(small).await, vec![16_384, 16_384, 7_232]);
        // From an offset, and a chunk above CHUNK_SIZE is clamped (the whole range fits one).
        let big = FileBody::new(open(), 1_000, 39_000, 10 * CHUNK_SIZE, None);
        assert_eq!(frame_sizes(big).await, vec![39_000]);
        // A chunk larger than the budget is clamped to it.
        let budget = ReadBudget::new(10_000);
        let capped = FileBody::new(open(), 0, 40_000, CHUNK_SIZE, Some(budget.clone()));
        assert_eq!(frame_sizes(capped).await, vec![10_000; 4]);
        assert_eq!(budget.held(), 0, "every chunk released once dropped");
    }

    /// Two bodies sharing a budget of one chunk: while the first's chunk is alive the second
    /// reads `UNBUDGETED_CHUNK` bytes at a time outside the budget (it never waits), and
    /// takes budget again once the first's chunk is dropped.
    #[tokio::test]
    async fn bodies_sharing_a_full_budget_read_small_chunks_and_never_wait() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&vec![7u8; 200_000]).unwrap();
        let open = || File::open(tmp.path()).unwrap();
        let budget = ReadBudget::new(64_000);
        let mut a = FileBody::new(open(), 0, 200_000, 64_000, Some(budget.clone()));
        let mut b = FileBody::new(open(), 0, 200_000, 64_000, Some(budget.clone()));
        let first = a.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!((first.len(), budget.held()), (64_000, 64_000));
        let small = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!((small.len(), budget.held()), (UNBUDGETED_CHUNK, 64_000));
        let slice = first.slice(0..10);
        drop(first);
        assert_eq!(budget.held(), 64_000, "a slice still holds the chunk");
        drop(slice);
        assert_eq!(budget.held(), 0);
        let big = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!((big.len(), budget.held()), (64_000, 64_000));
    }
}
