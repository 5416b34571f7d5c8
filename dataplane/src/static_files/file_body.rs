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
//! All connections' budgeted chunks together also stay within one [`ReadAheadTotal`]
//! (`limits.static_read_ahead_total`): past it a stream reads [`UNBUDGETED_CHUNK`] bytes at a
//! time as past its connection's budget, so under many connections the process holds at most
//! `static_read_ahead_total + streams reading x UNBUDGETED_CHUNK` of file data, not
//! `connections x static_read_ahead`.
//!
//! Each chunk is counted once: a budgeted chunk in its [`ReadAheadTotal`] (what the limit
//! checks), any other in one process-wide count ([`unbudgeted_bytes`]);
//! [`ReadAheadTotal::bytes`] is their sum, the file data the process holds. (Every budgeted
//! chunk was counted twice before, in the total and in a global count of all chunks: two
//! atomic read-modify-writes at its read and two at its release, for the same bytes.)
//!
//! A chunk whose bytes are in the page cache (the common case for a served file) is read on
//! the runtime thread, without a hop to the blocking pool: `preadv2` with `RWF_NOWAIT` (Linux)
//! copies what is cached and never waits for the disk; whatever it did not return is read on
//! the blocking pool as before. A file system that refuses `RWF_NOWAIT` is not asked again for
//! that body. Reads are positional, so bodies may share one open file (the open-file cache).

use crate::body::BoxError;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::fs::File;
use std::future::Future;
use std::io;
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

/// File bytes read and not yet released in chunks outside any budget, all connections:
/// past a full [`ReadBudget`] or [`ReadAheadTotal`], or of a body without a budget.
static UNBUDGETED: AtomicU64 = AtomicU64::new(0);

/// File bytes held right now in chunks outside any budget, all connections together.
pub fn unbudgeted_bytes() -> u64 {
    UNBUDGETED.load(Ordering::Relaxed)
}

/// The file bytes all connections of the process together may hold in budgeted chunks
/// (`limits.static_read_ahead_total`; one in [`crate::state::Shared`], following the config).
///
/// A semaphore of bytes, by hand rather than tokio's `Semaphore`, whose limit a config reload
/// moves: tokio's releases every permit under its waiters' mutex (`batch_semaphore::release`:
/// a lock, a `fetch_add`, an unlock against one `fetch_sub` here) and `forget_permits` takes
/// back only permits not held, so lowering the limit below what is held would need a debt
/// kept beside it: more code on the hot path, no waiting to gain (a full total is never
/// waited for).
#[derive(Debug)]
pub struct ReadAheadTotal {
    limit: AtomicU64,
    held: AtomicU64,
    /// The most `held` has been: the tests' high-water mark, kept by debug builds only (the
    /// tests' profile), so that a release build's take of a budgeted chunk touches no counter
    /// but `held`.
    #[cfg(debug_assertions)]
    peak: AtomicU64,
}

impl Default for ReadAheadTotal {
    /// Unlimited until a config sets it.
    fn default() -> Self {
        ReadAheadTotal {
            limit: AtomicU64::new(u64::MAX),
            held: AtomicU64::new(0),
            #[cfg(debug_assertions)]
            peak: AtomicU64::new(0),
        }
    }
}

impl ReadAheadTotal {
    /// A total of `bytes`.
    pub fn new(bytes: u64) -> ReadAheadTotal {
        let total = ReadAheadTotal::default();
        total.set_limit(bytes);
        total
    }

    /// Follows the config's `limits.static_read_ahead_total`. Lowering it takes no chunk
    /// back: only new chunks find the total full.
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes held by budgeted chunks right now, all connections: what the limit checks.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes budgeted chunks held at once so far, all connections (debug builds
    /// only: a release build keeps no high-water mark).
    #[cfg(debug_assertions)]
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// File bytes held right now, budgeted or not: [`ReadAheadTotal::held`] and
    /// [`unbudgeted_bytes`] (the process has one total).
    pub fn bytes(&self) -> u64 {
        self.held() + unbudgeted_bytes()
    }

    /// Takes `n` bytes if they fit under the limit; never more than the limit in total.
    fn try_take(self: &Arc<Self>, n: u64) -> Option<TotalPermit> {
        let limit = self.limit.load(Ordering::Relaxed);
        let before = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                h.checked_add(n).filter(|&t| t <= limit)
            })
            .ok()?;
        // Within the limit: no overflow.
        #[cfg(debug_assertions)]
        self.peak.fetch_max(before + n, Ordering::Relaxed);
        // (A release build reads only whether the take fitted.)
        #[cfg(not(debug_assertions))]
        let _ = before;
        Some(TotalPermit {
            total: self.clone(),
            n,
        })
    }
}

/// `n` bytes of a [`ReadAheadTotal`], given back when dropped.
#[derive(Debug)]
struct TotalPermit {
    total: Arc<ReadAheadTotal>,
    n: u64,
}

impl Drop for TotalPermit {
    fn drop(&mut self) {
        self.total.held.fetch_sub(self.n, Ordering::Relaxed);
    }
}

/// What a budgeted chunk holds: its bytes of the connection's budget and of the total.
#[derive(Debug)]
struct Permit {
    _conn: OwnedSemaphorePermit,
    _total: TotalPermit,
}

/// The file bytes one connection may hold read ahead of its client, all its streams
/// together (`limits.static_read_ahead`), within the process's [`ReadAheadTotal`]. Cloned
/// into every request of the connection.
#[derive(Debug, Clone)]
pub struct ReadBudget {
    permits: Arc<Semaphore>,
    size: u32,
    total: Arc<ReadAheadTotal>,
}

impl ReadBudget {
    /// A budget of `bytes` (at least 1) within `total`.
    pub fn new(bytes: u32, total: Arc<ReadAheadTotal>) -> ReadBudget {
        let size = bytes.max(1);
        ReadBudget {
            permits: Arc::new(Semaphore::new(size as usize)),
            size,
            total,
        }
    }

    /// Bytes of this budget held by chunks read and not yet released.
    pub fn held(&self) -> usize {
        self.size as usize - self.permits.available_permits()
    }

    /// `n` bytes of both the connection's budget and the total, or `None` if either is full.
    fn take(&self, n: u32) -> Option<Permit> {
        let conn = self.permits.clone().try_acquire_many_owned(n).ok()?;
        let total = self.total.try_take(u64::from(n))?;
        Some(Permit {
            _conn: conn,
            _total: total,
        })
    }
}

enum State {
    /// Waiting for the next poll.
    Idle(Arc<File>),
    /// A chunk read is in flight on the blocking pool.
    Reading(JoinHandle<io::Result<(Arc<File>, Bytes)>>),
    Done,
}

/// Streams `remaining` bytes of a file starting at an offset, `CHUNK_SIZE` at a time.
pub(crate) struct FileBody {
    state: State,
    /// File position of the next chunk.
    offset: u64,
    remaining: u64,
    chunk: usize,
    budget: Option<ReadBudget>,
    /// Whether to try reading from the page cache on the runtime thread (off once the file
    /// system has refused `RWF_NOWAIT`).
    nowait: bool,
}

impl FileBody {
    /// A body of `len` bytes of `file` starting at `offset`, read `chunk` bytes at a time
    /// (clamped to 1..=[`CHUNK_SIZE`] and to the budget's size), each chunk taken from
    /// `budget` when there is one; from the page cache on the runtime thread when `inline`
    /// and it can, else on the blocking pool.
    pub(crate) fn new(
        file: Arc<File>,
        offset: u64,
        len: u64,
        chunk: usize,
        budget: Option<ReadBudget>,
        inline: bool,
    ) -> FileBody {
        let state = if len == 0 {
            State::Done
        } else {
            State::Idle(file)
        };
        let cap = budget.as_ref().map_or(CHUNK_SIZE, |b| b.size as usize);
        FileBody {
            state,
            offset,
            remaining: len,
            chunk: chunk.clamp(1, CHUNK_SIZE).min(cap),
            budget,
            nowait: inline && cfg!(target_os = "linux"),
        }
    }

    fn next_len(&self) -> usize {
        self.remaining.min(self.chunk as u64) as usize
    }
}

/// The bytes of one chunk and the budget they hold, released when the last `Bytes` referring
/// to them is dropped; without a budget, counted in [`UNBUDGETED`] until then.
struct Held {
    buf: Vec<u8>,
    permit: Option<Permit>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A budgeted chunk's bytes go back with its permit.
        if self.permit.is_none() {
            UNBUDGETED.fetch_sub(self.buf.len() as u64, Ordering::Relaxed);
        }
    }
}

/// The bytes of a chunk as a `Bytes` holding `permit` until they are dropped.
fn held(buf: Vec<u8>, permit: Option<Permit>) -> Bytes {
    if permit.is_none() {
        UNBUDGETED.fetch_add(buf.len() as u64, Ordering::Relaxed);
    }
    Bytes::from_owner(Held { buf, permit })
}

/// Reads the rest of a chunk of `n` bytes that starts at file position `offset` into `buf`,
/// which holds its first `buf.len()` bytes and has room for `n`; a short file is an error,
/// since the response length was already promised.
///
/// `buf` is allocated by the caller, on the runtime thread that later frees it: allocated on
/// the blocking-pool thread, each of up to `max_blocking_threads` threads kept its own
/// allocator pages of chunks (mimalloc returns a block to the heap of the thread that
/// allocated it), tens of MiB of RSS under bulk load.
fn read_chunk(
    file: Arc<File>,
    offset: u64,
    n: usize,
    mut buf: Vec<u8>,
    permit: Option<Permit>,
) -> io::Result<(Arc<File>, Bytes)> {
    // Bounded: every turn reads at least one byte or returns.
    while buf.len() < n {
        match read_at(&file, offset, &mut buf, n, false) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while being served",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((file, held(buf, permit)))
}

/// What a read from the page cache on the runtime thread got.
#[derive(Debug, PartialEq, Eq)]
enum Cached {
    /// The chunk holds this many bytes now (fewer than asked when the rest is not cached, or
    /// is past the file's end).
    Read(usize),
    /// The file system does not read without waiting (`RWF_NOWAIT` refused): do not ask again.
    Unsupported,
}

/// Reads the chunk of `n` bytes at `offset` into the empty `buf` (room for `n`), only what the
/// page cache holds: `preadv2(RWF_NOWAIT)` never waits for the disk. Errors other than "not
/// cached" are left to the blocking read that follows, which reports them.
fn read_cached(file: &File, offset: u64, buf: &mut Vec<u8>, n: usize) -> Cached {
    if !cfg!(target_os = "linux") {
        return Cached::Unsupported;
    }
    // Bounded: every turn reads at least one byte or ends the loop.
    while buf.len() < n {
        match read_at(file, offset, buf, n, true) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if buf.is_empty() && refuses_nowait(&e) => return Cached::Unsupported,
            Err(_) => break,
        }
    }
    Cached::Read(buf.len())
}

/// The errors of a file system (or kernel) that does not take `RWF_NOWAIT`.
fn refuses_nowait(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
    )
}

/// One positional read of the chunk's bytes `buf.len()..n` (the chunk starts at file position
/// `offset`), appended to `buf` without initialising its spare capacity first (chunks are up
/// to 128 KiB: zeroing each first cost as many instructions as encrypting it); with `nowait`,
/// only what the page cache holds. Returns the count read, 0 at the end of the file.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // the workspace's third `unsafe` in shipped code: the proof is inside
fn read_at(
    file: &File,
    offset: u64,
    buf: &mut Vec<u8>,
    n: usize,
    nowait: bool,
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let at = libc::off_t::try_from(offset + buf.len() as u64).map_err(io::Error::other)?;
    let want = n.saturating_sub(buf.len());
    let spare = buf.spare_capacity_mut();
    let iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: want.min(spare.len()),
    };
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: `iov` describes the first `iov_len` bytes of `buf`'s spare capacity: memory
    // `buf` owns, valid for writes, and not read or written by anything else while `buf` is
    // borrowed mutably here. preadv2 writes at most `iov_len` bytes there and returns how many
    // it wrote, or -1.
    let r = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, flags) };
    let r = usize::try_from(r).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: the kernel initialised the `r` bytes (r <= iov_len <= spare.len()) that follow
    // `buf.len()`; the length grows over exactly those.
    unsafe { buf.set_len(buf.len() + r.min(iov.iov_len)) };
    Ok(r)
}

/// The same with a zeroed buffer, where there is no preadv2 (and no `nowait`).
#[cfg(not(target_os = "linux"))]
fn read_at(
    file: &File,
    offset: u64,
    buf: &mut Vec<u8>,
    n: usize,
    nowait: bool,
) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    if nowait {
        return Err(io::ErrorKind::Unsupported.into());
    }
    let start = buf.len();
    buf.resize(n.max(start), 0);
    let r = file.read_at(&mut buf[start..], offset + start as u64);
    buf.truncate(start + *r.as_ref().unwrap_or(&0));
    r
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
                State::Idle(file) => {
                    let mut n = this.next_len();
                    let permit = match &this.budget {
                        None => None,
                        Some(b) => match b.take(n as u32) {
                            Some(p) => Some(p),
                            None => {
                                // Full: a small chunk outside it (see the module docs).
                                n = n.min(UNBUDGETED_CHUNK);
                                None
                            }
                        },
                    };
                    let offset = this.offset;
                    let mut buf = Vec::with_capacity(n);
                    if this.nowait {
                        match read_cached(&file, offset, &mut buf, n) {
                            Cached::Read(k) if k == n => {
                                this.offset += n as u64;
                                this.remaining -= n as u64;
                                if this.remaining > 0 {
                                    this.state = State::Idle(file);
                                }
                                return Poll::Ready(Some(Ok(Frame::data(held(buf, permit)))));
                            }
                            Cached::Read(_) => {}
                            Cached::Unsupported => this.nowait = false,
                        }
                    }
                    // The rest on the blocking pool.
                    let handle = tokio::task::spawn_blocking(move || {
                        read_chunk(file, offset, n, buf, permit)
                    });
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
                            this.offset += bytes.len() as u64;
                            this.remaining -= bytes.len() as u64;
                            if this.remaining > 0 {
                                this.state = State::Idle(file);
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
        let open = || Arc::new(File::open(tmp.path()).unwrap());
        let small = FileBody::new(open(), 0, 40_000, 16 * 1024, None, true);
        assert_eq!(frame_sizes(small).await, vec![16_384, 16_384, 7_232]);
        // From an offset, and a chunk above CHUNK_SIZE is clamped (the whole range fits one).
        let big = FileBody::new(open(), 1_000, 39_000, 10 * CHUNK_SIZE, None, true);
        assert_eq!(frame_sizes(big).await, vec![39_000]);
        // A chunk larger than the budget is clamped to it.
        let budget = ReadBudget::new(10_000, Arc::default());
        let capped = FileBody::new(open(), 0, 40_000, CHUNK_SIZE, Some(budget.clone()), true);
        assert_eq!(frame_sizes(capped).await, vec![10_000; 4]);
        assert_eq!(budget.held(), 0, "every chunk released once dropped");
    }

    /// Every way a chunk is read gives the file's bytes at the right offsets: from the page
    /// cache on the runtime thread, on the blocking pool, and the blocking pool finishing a
    /// chunk the page-cache read began.
    #[tokio::test]
    async fn chunks_read_from_the_cache_or_the_pool_are_the_files_bytes() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        let open = || Arc::new(File::open(tmp.path()).unwrap());
        for nowait in [true, false] {
            for (offset, len, chunk) in [
                (0, 300_000, CHUNK_SIZE),
                (1_000, 250_001, 16_384),
                (299_999, 1, 7),
            ] {
                let body = FileBody::new(open(), offset, len, chunk, None, nowait);
                let got = body.collect().await.unwrap().to_bytes();
                assert_eq!(&got[..], &data[offset as usize..(offset + len) as usize]);
            }
        }
        // The page-cache read: all of a cached range, a short count at the end of the file.
        if cfg!(target_os = "linux") {
            let mut buf = Vec::with_capacity(5_000);
            assert_eq!(
                read_cached(&open(), 10_000, &mut buf, 5_000),
                Cached::Read(5_000)
            );
            assert_eq!(&buf[..], &data[10_000..15_000]);
            let mut buf = Vec::with_capacity(5_000);
            assert_eq!(
                read_cached(&open(), 298_000, &mut buf, 5_000),
                Cached::Read(2_000)
            );
            assert_eq!(&buf[..], &data[298_000..]);
        }
        // The pool finishing a chunk whose first 100 bytes were read already.
        let mut first = Vec::with_capacity(20_000);
        first.extend_from_slice(&data[50_000..50_100]);
        let (_, bytes) = read_chunk(open(), 50_000, 20_000, first, None).unwrap();
        assert_eq!(&bytes[..], &data[50_000..70_000]);
        // Bodies sharing one open file read their own ranges.
        let shared = open();
        let a = FileBody::new(shared.clone(), 0, 100_000, 16_384, None, true);
        let b = FileBody::new(shared, 100_000, 100_000, 16_384, None, false);
        let (a, b) = tokio::join!(a.collect(), b.collect());
        assert_eq!(&a.unwrap().to_bytes()[..], &data[..100_000]);
        assert_eq!(&b.unwrap().to_bytes()[..], &data[100_000..200_000]);
        // A file shorter than promised is an error, not a short body.
        for nowait in [true, false] {
            let mut short = FileBody::new(open(), 280_000, 30_000, 16_384, None, nowait);
            assert_eq!(
                short
                    .frame()
                    .await
                    .unwrap()
                    .unwrap()
                    .into_data()
                    .unwrap()
                    .len(),
                16_384
            );
            assert!(short.frame().await.unwrap().is_err(), "nowait {nowait}");
        }
    }

    /// Two bodies sharing a budget of one chunk: while the first's chunk is alive the second
    /// reads `UNBUDGETED_CHUNK` bytes at a time outside the budget (it never waits), and
    /// takes budget again once the first's chunk is dropped.
    #[tokio::test]
    async fn bodies_sharing_a_full_budget_read_small_chunks_and_never_wait() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&vec![7u8; 200_000]).unwrap();
        let open = || Arc::new(File::open(tmp.path()).unwrap());
        let budget = ReadBudget::new(64_000, Arc::default());
        let mut a = FileBody::new(open(), 0, 200_000, 64_000, Some(budget.clone()), true);
        let mut b = FileBody::new(open(), 0, 200_000, 64_000, Some(budget.clone()), true);
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

    /// Two connections' budgets within one total of one chunk: while the first connection's
    /// chunk is alive the second connection, its own budget empty, reads `UNBUDGETED_CHUNK`
    /// bytes at a time (it never waits) and takes no budget; once the chunk is dropped both the
    /// total and the first connection's budget are free, and a full chunk is taken again. A
    /// config lowering the total takes effect at the next chunk.
    #[tokio::test]
    async fn connections_share_the_total_and_past_it_read_small_chunks() {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&vec![7u8; 200_000]).unwrap();
        let open = || Arc::new(File::open(tmp.path()).unwrap());
        let total = Arc::new(ReadAheadTotal::new(64_000));
        let one = ReadBudget::new(128_000, total.clone());
        let two = ReadBudget::new(128_000, total.clone());
        let mut a = FileBody::new(open(), 0, 200_000, 64_000, Some(one.clone()), true);
        let mut b = FileBody::new(open(), 0, 200_000, 64_000, Some(two.clone()), true);
        let first = a.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            (first.len(), one.held(), total.held()),
            (64_000, 64_000, 64_000)
        );
        let small = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            (small.len(), two.held(), total.held()),
            (UNBUDGETED_CHUNK, 0, 64_000)
        );
        drop(first);
        assert_eq!((one.held(), total.held()), (0, 0));
        let big = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            (big.len(), two.held(), total.held()),
            (64_000, 64_000, 64_000)
        );
        drop(big);
        total.set_limit(63_999);
        let small = a.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            (small.len(), one.held(), total.held()),
            (UNBUDGETED_CHUNK, 0, 0)
        );
    }
}
