//! The server side of HTTP/1.1 (RFC 9112): one connection's requests, read, answered by a
//! [`Service`] and written back in order.
//!
//! [`serve`] runs a connection to its end. Each request head is parsed once, with httparse,
//! straight into an `http::Request` whose header values share the head's bytes (no copy per
//! field). The service's future and the response body are polled on the connection's own task;
//! the request body is fed to the service through [`RecvBody`] one chunk at a time, read from
//! the socket only when the service asks for more (backpressure). A response head is written
//! into the connection's output buffer; small body data is copied after it, large data goes
//! out by vectored writes without a copy. Responses of pipelined requests whose heads are
//! already read are written together (one flush for the batch, bounded by [`FLUSH_AT`]); the
//! next head is read only once the previous response has been written.
//!
//! Refusals (the connection then closes): a head past [`Settings::max_head_bytes`] or with
//! more than [`Settings::max_fields`] fields (431), a head httparse refuses (invalid bytes,
//! obs-fold, bare CR), an unparsable target, an invalid or differing `Content-Length`, a
//! `Transfer-Encoding` whose last coding is not `chunked` or in HTTP/1.0 (400). A head with
//! both `Transfer-Encoding` and `Content-Length` is handed over without its `Content-Length`
//! and with the [`ConflictingFraming`] mark (the dataplane's identity phase answers 400), its
//! body unread, and the connection closes after the answer.
//!
//! Keep-alive follows RFC 9112 §9.3: HTTP/1.1 unless `Connection: close` (either side), HTTP/1.0
//! only with `Connection: keep-alive`; a response of unknown length to HTTP/1.0 is
//! close-delimited. A request body the service did not read to its end closes the connection
//! after the response (unless the rest is already buffered); the response says so
//! (`Connection: close`) when the service let go of the body before answering or answers
//! while it still comes (a 401 or 413 to an upload, a 200 from a backend that answered
//! early), and the connection then reads and
//! drops what the client still sends for a bounded time ([`LINGER_TIME`], [`LINGER_BYTES`]) so
//! that the close does not reset the answer away (refusals of a head linger too). A body the
//! service still holds when its answer has ended is fed no more and ends with
//! [`BodyError::Incomplete`], never as a shorter body that looks whole.
//! `Expect: 100-continue` gets its `100 Continue` when the service first polls the body. A
//! `101` answer to an upgrade request hands the connection (and every byte read past the head
//! the service did not take, in order) to the request's [`OnUpgrade`]; an upgrade request with
//! a chunked body is not offered one, and a body by length the service let go of before its
//! end turns the 101 into a 500 (its buffered part is gone, the tunnel would start inside it).
//!
//! While an answer is awaited with nothing of the request left to read, the connection reads
//! once into its empty buffer: a client that closed or reset the connection ends it then, and
//! the service's future (or the response body) is dropped, cancelling the backend request
//! (hyper's server does the same); bytes that come are the next pipelined request's, kept for
//! its turn.
//! Waiting for a head is bounded by [`Settings::header_read_timeout`] (also between
//! requests: an idle keep-alive connection closes then), and a drain signal closes an idle
//! connection at once and a busy one after its current response.

use crate::chunked::{self, Chunk, ChunkedError};
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{oneshot, watch};

/// Output buffered before the connection writes it out (and stops taking response data).
pub const FLUSH_AT: usize = 64 * 1024;

/// Body data up to this size is copied into the output buffer; larger data is written from
/// where it is (vectored).
const COPY_MAX: usize = 4096;

/// Bytes read from the socket at a time (at least).
const READ_CHUNK: usize = 16 * 1024;

/// How long a connection closing with a request body unread goes on reading (and dropping)
/// what the client still sends (nginx's `lingering_timeout`).
pub const LINGER_TIME: Duration = Duration::from_secs(5);

/// How many bytes a connection closing with a request body unread reads (and drops) at most.
pub const LINGER_BYTES: usize = 1 << 20;

/// Header fields a request head may have (hyper's default).
pub const DEFAULT_MAX_FIELDS: usize = 100;

/// A connection's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Bytes of one request head, its empty line included (431 past it).
    pub max_head_bytes: usize,
    /// Header fields of one request head (431 past it; at most [`MAX_FIELDS`]).
    pub max_fields: usize,
    /// Time to read a whole request head, from the moment the connection waits for it (after
    /// the previous response, or from the start). An idle keep-alive connection closes then.
    pub header_read_timeout: Duration,
    /// Bounds of chunked request bodies.
    pub chunked: chunked::Limits,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_head_bytes: 64 * 1024,
            max_fields: DEFAULT_MAX_FIELDS,
            header_read_timeout: Duration::from_secs(10),
            chunked: chunked::Limits::default(),
        }
    }
}

/// What answers the requests of one connection (one value per connection).
pub trait Service {
    /// The response body.
    type Body: Body<Data = Bytes> + Unpin;
    /// The answer to one request, polled on the connection's task.
    type Future: Future<Output = Response<Self::Body>> + Unpin;

    /// Starts answering `request`.
    fn call(&mut self, request: Request<RecvBody>) -> Self::Future;

    /// The connection hit a limit (`header_read_timeout`, `header_bytes`).
    fn limit_hit(&self, what: &'static str);

    /// The connection waits for a request with nothing of one read: hold nothing for
    /// requests (the dataplane drops its config snapshot, so a reload frees the old one).
    fn on_idle(&mut self) {}
}

/// The request extension set on a request whose head had both `Transfer-Encoding` and
/// `Content-Length` (its `Content-Length` removed, its body not read): the edge refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConflictingFraming;

/// An I/O the connection can be handed over as.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The connection after a `101 Switching Protocols`: the bytes the client sent after the
/// request head (read already) first, then the connection itself.
pub struct Upgraded {
    read: Bytes,
    io: Box<dyn Io>,
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded")
            .field("buffered", &self.read.len())
            .finish_non_exhaustive()
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The request extension of an upgrade request (`Connection: upgrade` with `Upgrade`): once
/// the service answers `101`, the connection comes out of [`OnUpgrade::take`]'s receiver.
#[derive(Clone, Debug)]
pub struct OnUpgrade(Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>);

impl OnUpgrade {
    /// Takes the receiver (once): it yields the connection after the 101 is written, or an
    /// error when the request was answered otherwise or the connection ended.
    pub fn take(&self) -> Option<oneshot::Receiver<Upgraded>> {
        lock(&self.0).take()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a request body ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The connection ended before the body did.
    #[error("connection closed before the request body ended")]
    Incomplete,
    /// The chunked body was malformed.
    #[error("malformed chunked request body: {0}")]
    Chunked(ChunkedError),
    /// The connection failed while reading the body.
    #[error("connection error while reading the request body")]
    Io,
}

/// What the connection and a request's body share.
#[derive(Debug, Default)]
struct Feed {
    /// One chunk read and not yet taken.
    chunk: Option<Bytes>,
    /// The end: trailers (possibly empty), or why the body failed.
    end: Option<Result<Option<HeaderMap>, BodyError>>,
    /// The body asked for data and found none.
    want: bool,
    /// The body was dropped: nothing more to feed.
    dropped: bool,
    body_waker: Option<Waker>,
    conn_waker: Option<Waker>,
}

impl Feed {
    fn wake_body(&mut self) {
        if let Some(w) = self.body_waker.take() {
            w.wake();
        }
    }
    fn wake_conn(&mut self) {
        if let Some(w) = self.conn_waker.take() {
            w.wake();
        }
    }
}

/// A request's body: empty, or fed by the connection as the service reads it.
#[derive(Debug)]
pub struct RecvBody {
    feed: Option<Arc<Mutex<Feed>>>,
    /// `Content-Length` bytes still to come (None: chunked).
    left: Option<u64>,
    ended: bool,
}

impl RecvBody {
    fn empty() -> RecvBody {
        RecvBody {
            feed: None,
            left: Some(0),
            ended: true,
        }
    }
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        if let Some(f) = &self.feed {
            let mut f = lock(f);
            f.dropped = true;
            f.wake_conn();
        }
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let Some(feed) = self.feed.clone() else {
            self.ended = true;
            return Poll::Ready(None);
        };
        let mut f = lock(&feed);
        if let Some(data) = f.chunk.take() {
            f.wake_conn();
            drop(f);
            if let Some(left) = self.left.as_mut() {
                *left = left.saturating_sub(data.len() as u64);
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match f.end.take() {
            Some(Ok(trailers)) => {
                drop(f);
                self.ended = true;
                Poll::Ready(
                    trailers
                        .filter(|t| !t.is_empty())
                        .map(|t| Ok(Frame::trailers(t))),
                )
            }
            Some(Err(e)) => {
                drop(f);
                self.ended = true;
                Poll::Ready(Some(Err(e)))
            }
            None => {
                f.want = true;
                if !f
                    .body_waker
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    f.body_waker = Some(cx.waker().clone());
                }
                f.wake_conn();
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.left == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// How a request body is framed on the wire.
#[derive(Debug)]
enum Framing {
    /// This many bytes left.
    Length(u64),
    Chunked(Box<chunked::Decoder>),
}

/// The connection's side of a request body.
struct Feeder {
    framing: Framing,
    feed: Arc<Mutex<Feed>>,
    /// `Expect: 100-continue` not answered yet.
    expect: bool,
    /// Fed to its end.
    done: bool,
    /// Failed on the wire (the connection cannot continue).
    broken: bool,
}

impl Drop for Feeder {
    /// A body the connection stops feeding before its end (the connection ended or was
    /// handed over) ends with [`BodyError::Incomplete`] at once, instead of waiting for a
    /// wake-up that never comes.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut f = self.feed.lock().unwrap_or_else(|p| p.into_inner());
        if f.end.is_none() {
            f.end = Some(Err(BodyError::Incomplete));
        }
        f.wake_body();
    }
}

/// A parsed request head's framing facts.
struct HeadInfo {
    keep_alive: bool,
    upgrade: bool,
    expect: bool,
    trailers_ok: bool,
    framing: Option<Framing>,
    conflict: bool,
}

/// Why a head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    TooLarge,
    Bad(&'static str),
}

/// The connection: its I/O, what was read and not used yet, what is to be written.
struct Conn<I> {
    io: I,
    rbuf: BytesMut,
    /// Output not yet in a queued segment (written after them).
    out: BytesMut,
    /// Output segments to write before `out`.
    queue: VecDeque<Bytes>,
    queued: usize,
    eof: bool,
    vectored: bool,
}

impl<I: AsyncRead + AsyncWrite + Unpin> Conn<I> {
    fn pending_out(&self) -> usize {
        self.queued + self.out.len()
    }

    /// Adds body data to the output: copied when small, queued as it is otherwise.
    fn push(&mut self, data: Bytes) {
        if data.len() <= COPY_MAX || !self.vectored {
            self.out.extend_from_slice(&data);
        } else {
            if !self.out.is_empty() {
                let head = self.out.split().freeze();
                self.queued += head.len();
                self.queue.push_back(head);
            }
            self.queued += data.len();
            self.queue.push_back(data);
        }
    }

    /// Writes out everything buffered, then flushes the I/O.
    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending_out() > 0 {
            let n = if self.vectored && !self.queue.is_empty() {
                let mut slices = [IoSlice::new(&[]); 16];
                let mut k = 0;
                for seg in self.queue.iter().take(15) {
                    slices[k] = IoSlice::new(seg);
                    k += 1;
                }
                if k < 16 && !self.out.is_empty() {
                    slices[k] = IoSlice::new(&self.out);
                    k += 1;
                }
                std::task::ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..k]))?
            } else if let Some(seg) = self.queue.front() {
                std::task::ready!(Pin::new(&mut self.io).poll_write(cx, seg))?
            } else {
                std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &self.out))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.consume_out(n);
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn consume_out(&mut self, mut n: usize) {
        while n > 0 {
            match self.queue.front_mut() {
                Some(seg) => {
                    let k = n.min(seg.len());
                    seg.advance(k);
                    self.queued -= k;
                    n -= k;
                    if seg.is_empty() {
                        self.queue.pop_front();
                    }
                }
                None => {
                    self.out.advance(n);
                    n = 0;
                }
            }
        }
        if self.out.is_empty() && self.out.capacity() < 4096 {
            // `advance` moved the start; give the buffer its room back.
            self.out.reserve(4096);
        }
    }

    /// Reads more bytes into `rbuf`. Ready(Ok(0)) at the end of the stream.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 2 {
            self.rbuf.reserve(READ_CHUNK);
        }
        let n = std::task::ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.rbuf
        ))?;
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(n))
    }

    /// After an answer that left a request body unread and shut the sending side: reads
    /// and drops what the client still sends, until it closes, for at most [`LINGER_TIME`]
    /// and [`LINGER_BYTES`] (nginx's lingering close). Closing at once with unread bytes
    /// would reset the connection, and a reset may destroy the answer in the client's
    /// receive buffer before it reads it (the 413 to an upload lost).
    async fn linger(&mut self) {
        let mut left = LINGER_BYTES;
        let mut deadline = std::pin::pin!(tokio::time::sleep(LINGER_TIME));
        poll_fn(|cx| loop {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            self.rbuf.clear();
            match self.poll_read_more(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(n)) => {
                    left = left.saturating_sub(n);
                    if left == 0 {
                        return Poll::Ready(());
                    }
                }
            }
        })
        .await
    }

    /// A request body the service let go of before its end: takes what of it is already
    /// buffered (reading no more). True when that was all of it; else the body stays marked
    /// as let go of (`dropped`).
    fn skip_buffered(&mut self, fd: &mut Feeder) -> io::Result<bool> {
        if fd.done || fd.broken {
            return Ok(fd.done);
        }
        {
            let mut f = lock(&fd.feed);
            f.chunk = None;
            f.want = false;
            f.dropped = false;
        }
        // With `want` false `poll_feed` only decodes what is buffered: it never waits.
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            self.poll_feed(&mut cx, fd)?;
            let mut f = lock(&fd.feed);
            if f.chunk.take().is_none() {
                // Still let go of: the mark stays, so the answer's rules see it.
                f.dropped = !fd.done;
                return Ok(fd.done);
            }
        }
    }

    /// While an answer is awaited and the request has nothing more to read (no body, or its
    /// end fed): notices a client that closed or reset the connection. It reads only into an
    /// empty buffer, so at most one read ahead: bytes that come are the next pipelined
    /// request's, kept for its turn, and nothing more is read (nor an end noticed) until then,
    /// as hyper's server does mid-message. Ready with the error the connection ends with.
    fn poll_client_gone(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.eof || !self.rbuf.is_empty() {
            return Poll::Pending;
        }
        match self.poll_read_more(cx) {
            Poll::Ready(Ok(0)) => Poll::Ready(io::ErrorKind::ConnectionAborted.into()),
            Poll::Ready(Err(e)) => Poll::Ready(e),
            Poll::Ready(Ok(_)) | Poll::Pending => Poll::Pending,
        }
    }

    /// Feeds the request body from what is read (reading more only when the body wants it).
    /// Makes what progress it can and registers for the rest; true when it handed the body
    /// a chunk or its end.
    fn poll_feed(&mut self, cx: &mut Context<'_>, fd: &mut Feeder) -> io::Result<bool> {
        let mut progressed = false;
        loop {
            if fd.done || fd.broken {
                return Ok(progressed);
            }
            let feed = fd.feed.clone();
            let mut f = lock(&feed);
            if f.dropped {
                return Ok(progressed);
            }
            if f.chunk.is_some() {
                f.conn_waker = Some(cx.waker().clone());
                return Ok(progressed);
            }
            // Decode what is buffered.
            if !self.rbuf.is_empty() {
                let step = match &mut fd.framing {
                    Framing::Length(left) => {
                        let n = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(self.rbuf.len());
                        *left -= n as u64;
                        f.chunk = Some(self.rbuf.split_to(n).freeze());
                        Ok((*left == 0).then_some(None))
                    }
                    Framing::Chunked(d) => match d.decode(&mut self.rbuf) {
                        Ok(Some(Chunk::Data(b))) => {
                            f.chunk = Some(b);
                            Ok(None)
                        }
                        Ok(Some(Chunk::End(t))) => Ok(Some(Some(t))),
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    },
                };
                match step {
                    Ok(Some(trailers)) => {
                        f.end = Some(Ok(trailers));
                        f.want = false;
                        fd.done = true;
                        f.wake_body();
                        return Ok(true);
                    }
                    Ok(None) if f.chunk.is_some() => {
                        f.want = false;
                        progressed = true;
                        f.wake_body();
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        f.end = Some(Err(BodyError::Chunked(e)));
                        fd.broken = true;
                        f.wake_body();
                        return Ok(true);
                    }
                }
            }
            // Nothing decodable buffered: read only when the body asks.
            if !f.want {
                f.conn_waker = Some(cx.waker().clone());
                return Ok(progressed);
            }
            drop(f);
            if fd.expect {
                fd.expect = false;
                self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            if self.pending_out() > 0 {
                match self.poll_flush_out(cx) {
                    Poll::Ready(r) => r?,
                    Poll::Pending => return Ok(progressed),
                }
            }
            match self.poll_read_more(cx) {
                Poll::Pending => return Ok(progressed),
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    let mut f = lock(&feed);
                    f.end = Some(Err(if self.eof {
                        BodyError::Incomplete
                    } else {
                        BodyError::Io
                    }));
                    fd.broken = true;
                    f.wake_body();
                    return Ok(true);
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
    }
}

/// The body chunk the connection split off its buffer and the service has not taken (the
/// start of what an upgrade hands over); the body is fed no more.
fn untaken_chunk(feeder: &mut Option<Feeder>) -> BytesMut {
    let Some(mut fd) = feeder.take() else {
        return BytesMut::new();
    };
    let chunk = lock(&fd.feed).chunk.take();
    // The rest goes to the tunnel: the body ends here for the service.
    fd.broken = true;
    match (chunk, &fd.framing) {
        (Some(c), Framing::Length(_)) => BytesMut::from(&c[..]),
        _ => BytesMut::new(),
    }
}

/// A `Content-Length` value: 1 to 19 ASCII digits.
fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The most header fields a request head may have, whatever [`Settings::max_fields`] says.
pub const MAX_FIELDS: usize = 128;

/// Room a request's header map is made with beyond its own fields: what a proxy adds before
/// it forwards the request (`X-Request-Id`, the five forwarding fields, `Host`), so that the
/// map is not grown (re-hashed and re-allocated) once or twice per request on the way.
pub const FIELD_ROOM: usize = 8;

/// What a request head's fields say of its framing and of the connection.
#[derive(Default)]
struct Fields {
    length: Option<u64>,
    has_cl: bool,
    bad_cl: bool,
    /// Whether the last `Transfer-Encoding` coding is `chunked` (None: no such field).
    te_chunked_last: Option<bool>,
    conn_close: bool,
    conn_keep_alive: bool,
    conn_upgrade: bool,
    has_upgrade: bool,
    expect_continue: bool,
    te_trailers: bool,
}

impl Fields {
    fn note(&mut self, name: &[u8], value: &[u8]) {
        let tokens = || {
            value
                .split(|&b| b == b',')
                .map(|t| t.trim_ascii())
                .filter(|t| !t.is_empty())
        };
        if name.eq_ignore_ascii_case(b"content-length") {
            self.has_cl = true;
            match content_length(value) {
                Some(n) if self.length.is_none_or(|l| l == n) => self.length = Some(n),
                _ => self.bad_cl = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Exactly one field of exactly `chunked`: a coding before it (`gzip, chunked`),
            // `identity`, or a second field is refused here rather than framed and left to a
            // later phase (HAProxy refuses chunked applied twice, nginx any coding but chunked).
            let only_chunked = value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            self.te_chunked_last = Some(self.te_chunked_last.is_none() && only_chunked);
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in tokens() {
                if t.eq_ignore_ascii_case(b"close") {
                    self.conn_close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    self.conn_keep_alive = true;
                } else if t.eq_ignore_ascii_case(b"upgrade") {
                    self.conn_upgrade = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.has_upgrade = true;
        } else if name.eq_ignore_ascii_case(b"expect") {
            self.expect_continue = value.eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"te") {
            self.te_trailers |= tokens().any(|t| t.eq_ignore_ascii_case(b"trailers"));
        }
    }
}

/// Parses a request head at the start of `buf`. Ok(None): incomplete.
#[allow(clippy::type_complexity)]
fn parse_head(
    buf: &mut BytesMut,
    settings: &Settings,
) -> Result<Option<(Request<RecvBody>, HeadInfo)>, Refusal> {
    if buf.is_empty() {
        // Nothing read yet (a kept-alive connection after its answers): incomplete.
        return Ok(None);
    }
    // The fields are not initialised first (httparse writes those it parses); the offsets of
    // each part are kept so that the head can be frozen once and the request's values share it.
    let cap = settings.max_fields.min(MAX_FIELDS);
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    // Only the head's first `max_head_bytes` are looked at: what is refused, and how, must not
    // depend on how many bytes past the limit one read happened to bring (a head malformed
    // after the limit is 431 whether it came whole or in pieces).
    let seen = buf.len().min(settings.max_head_bytes);
    let n = match req.parse_with_uninit_headers(&buf[..seen], &mut fields[..cap]) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if seen >= settings.max_head_bytes {
                return Err(Refusal::TooLarge);
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::TooLarge),
        Err(_) => return Err(Refusal::Bad("malformed request head")),
    };
    if n > settings.max_head_bytes {
        return Err(Refusal::TooLarge);
    }
    let base = buf.as_ptr() as usize;
    let off = |s: &[u8]| (s.as_ptr() as usize - base, s.len());
    let method = req.method.unwrap_or_default();
    let path = off(req.path.unwrap_or_default().as_bytes());
    let version = req.version.unwrap_or(1);
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| Refusal::Bad("bad method"))?;
    let count = req.headers.len();
    // The fields' places in the head: on the stack for a usual head, in a Vec past
    // `SMALL_HEAD` fields (zeroing room for `MAX_FIELDS` of them cost more, on every head).
    const SMALL_HEAD: usize = 16;
    let mut small = [[0u32; 4]; SMALL_HEAD];
    let mut large = Vec::new();
    let spans: &mut [[u32; 4]] = if count <= SMALL_HEAD {
        &mut small[..count]
    } else {
        large.resize(count, [0u32; 4]);
        &mut large
    };
    // What the connection needs of the fields, read while they are at hand.
    let mut f = Fields::default();
    for (span, h) in spans.iter_mut().zip(req.headers.iter()) {
        let (no, nl) = off(h.name.as_bytes());
        let (vo, vl) = off(h.value);
        *span = [no as u32, nl as u32, vo as u32, vl as u32];
        f.note(h.name.as_bytes(), h.value);
    }
    let head = buf.split_to(n).freeze();
    let slice = |o: u32, l: u32| head.slice(o as usize..(o + l) as usize);
    let uri = Uri::from_maybe_shared(slice(path.0 as u32, path.1 as u32))
        .map_err(|_| Refusal::Bad("bad request target"))?;
    let mut headers = HeaderMap::with_capacity(count + FIELD_ROOM);
    for &[no, nl, vo, vl] in spans.iter() {
        let name = crate::name::from_bytes(&head[no as usize..(no + nl) as usize])
            .map_err(|_| Refusal::Bad("bad header name"))?;
        let value = HeaderValue::from_maybe_shared(slice(vo, vl))
            .map_err(|_| Refusal::Bad("bad header value"))?;
        headers.append(name, value);
    }
    let Fields {
        length,
        has_cl,
        bad_cl,
        te_chunked_last,
        conn_close,
        conn_keep_alive,
        conn_upgrade,
        has_upgrade,
        expect_continue,
        te_trailers,
    } = f;
    let version = if version == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let keep_alive = match version {
        Version::HTTP_10 => !conn_close && conn_keep_alive,
        _ => !conn_close,
    };
    // HTTP/1.0 has no Upgrade (RFC 9110 §7.8: a 1.0 request's Upgrade is ignored), nor does
    // a request with a chunked body here: the bytes of its body the connection decoded are not
    // the bytes that came, so what follows the 101 could not be handed over as it came (a
    // server may ignore Upgrade, RFC 9110 §7.8).
    let upgrade =
        version == Version::HTTP_11 && has_upgrade && conn_upgrade && te_chunked_last.is_none();
    let expect = version == Version::HTTP_11 && expect_continue;
    let trailers_ok = te_trailers;
    let mut conflict = false;
    let framing = match te_chunked_last {
        Some(_) if version == Version::HTTP_10 => {
            return Err(Refusal::Bad("Transfer-Encoding in an HTTP/1.0 request"))
        }
        Some(false) => return Err(Refusal::Bad("Transfer-Encoding other than one chunked")),
        Some(true) if has_cl => {
            conflict = true;
            headers.remove(header::CONTENT_LENGTH);
            None
        }
        Some(true) => Some(Framing::Chunked(Box::new(chunked::Decoder::new(
            settings.chunked,
        )))),
        None if bad_cl => return Err(Refusal::Bad("invalid Content-Length")),
        None => match length {
            Some(n) if n > 0 => Some(Framing::Length(n)),
            _ => None,
        },
    };
    let mut request = Request::new(RecvBody::empty());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Ok(Some((
        request,
        HeadInfo {
            keep_alive,
            upgrade,
            expect,
            trailers_ok,
            framing,
            conflict,
        },
    )))
}

/// Serves one HTTP/1.1 connection until it closes. `first`: bytes already read from it.
/// `drain` turning true closes it gracefully (at once when idle, else after the current
/// response).
pub async fn serve<I, S>(
    io: I,
    first: BytesMut,
    mut service: S,
    settings: Settings,
    drain: watch::Receiver<bool>,
) -> io::Result<()>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service,
{
    let vectored = io.is_write_vectored();
    let mut rbuf = first;
    if rbuf.capacity() < READ_CHUNK {
        rbuf.reserve(READ_CHUNK - rbuf.len());
    }
    let mut c = Conn {
        io,
        rbuf,
        out: BytesMut::with_capacity(4096),
        queue: VecDeque::new(),
        queued: 0,
        eof: false,
        vectored,
    };
    // One timer and one drain wait for the whole connection, not one of each per head: each
    // costs a registration and a removal (a lock, a list or wheel update) per request.
    // `sleep` is armed at some deadline no later than the current head's (`armed`); when it
    // fires early (it was armed for an earlier head), it is set to the current one. The drain
    // wait is polled only while the connection is idle, and never again once it is ready.
    let timeout = settings.header_read_timeout;
    let mut sleep = std::pin::pin!(tokio::time::sleep(timeout));
    let mut armed: Option<tokio::time::Instant> = None;
    let mut drain_wait = drain.clone();
    let mut changed = std::pin::pin!(drain_wait.changed());
    loop {
        // The clock of this head: `header_read_timeout` from when the previous answers are all
        // written (they are flushed while waiting; a slow reader is `send_timeout`'s), once
        // for the whole head, however many reads bring it (a head trickled in byte by byte
        // must not restart it).
        let mut header_clock: Option<tokio::time::Instant> = None;
        // A head: from what is buffered, else read (flushing the previous answers first).
        let parsed = loop {
            match parse_head(&mut c.rbuf, &settings) {
                Ok(Some(p)) => break Ok(p),
                Ok(None) => {}
                Err(r) => break Err(r),
            }
            if c.eof {
                poll_fn(|cx| c.poll_flush_out(cx)).await?;
                return Ok(());
            }
            if *drain.borrow() && c.rbuf.is_empty() {
                poll_fn(|cx| c.poll_flush_out(cx)).await?;
                return Ok(());
            }
            if c.rbuf.is_empty() {
                service.on_idle();
            }
            let read = poll_fn(|cx| {
                if c.pending_out() > 0 {
                    if let Poll::Ready(r) = c.poll_flush_out(cx) {
                        r?;
                    }
                }
                if header_clock.is_none() && c.pending_out() == 0 {
                    let deadline = tokio::time::Instant::now() + timeout;
                    header_clock = Some(deadline);
                    if armed.is_none_or(|a| a > deadline) {
                        sleep.as_mut().reset(deadline);
                        armed = Some(deadline);
                    }
                }
                if let Poll::Ready(r) = c.poll_read_more(cx) {
                    return Poll::Ready(r.map(Some));
                }
                if c.rbuf.is_empty() && c.pending_out() == 0 {
                    if let Poll::Ready(r) = changed.as_mut().poll(cx) {
                        // A drain (or the listener gone): close now (the connection ends,
                        // so `changed` is polled no more after it was ready).
                        let _ = r;
                        return Poll::Ready(Ok(None));
                    }
                }
                if let Some(deadline) = header_clock {
                    while sleep.as_mut().poll(cx).is_ready() {
                        if tokio::time::Instant::now() >= deadline {
                            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                        }
                        // Armed for an earlier head: wait for this one's deadline.
                        sleep.as_mut().reset(deadline);
                        armed = Some(deadline);
                    }
                }
                Poll::Pending
            })
            .await;
            match read {
                Ok(Some(_)) => {}
                Ok(None) => {
                    poll_fn(|cx| c.poll_flush_out(cx)).await?;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    if !c.rbuf.is_empty() {
                        service.limit_hit("header_read_timeout");
                    }
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            // A client that sent nothing but whitespace and closed: nothing to answer.
        };
        let (mut request, info) = match parsed {
            Ok(p) => p,
            Err(refusal) => {
                let (status, why) = match refusal {
                    Refusal::TooLarge => {
                        service.limit_hit("header_bytes");
                        (
                            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                            "request head too large",
                        )
                    }
                    Refusal::Bad(why) => (StatusCode::BAD_REQUEST, why),
                };
                write_refusal(&mut c.out, status, why);
                poll_fn(|cx| c.poll_flush_out(cx)).await?;
                let _ = poll_fn(|cx| Pin::new(&mut c.io).poll_shutdown(cx)).await;
                // The client may still be sending (the rest of a long head, a body): closing
                // at once could reset the refusal away.
                c.linger().await;
                return Ok(());
            }
        };
        let is_head = request.method() == Method::HEAD;
        let is_connect = request.method() == Method::CONNECT;
        let version = request.version();
        let mut keep_alive = info.keep_alive && !info.conflict;
        let mut feeder = None;
        if let Some(framing) = info.framing {
            let feed = Arc::new(Mutex::new(Feed::default()));
            let left = match &framing {
                Framing::Length(n) => Some(*n),
                Framing::Chunked(_) => None,
            };
            *request.body_mut() = RecvBody {
                feed: Some(feed.clone()),
                left,
                ended: false,
            };
            feeder = Some(Feeder {
                framing,
                feed,
                expect: info.expect,
                done: false,
                broken: false,
            });
        }
        if info.conflict {
            request.extensions_mut().insert(ConflictingFraming);
        }
        let mut upgrade_tx = None;
        if info.upgrade {
            let (tx, rx) = oneshot::channel();
            upgrade_tx = Some(tx);
            request
                .extensions_mut()
                .insert(OnUpgrade(Arc::new(Mutex::new(Some(rx)))));
        }
        let mut fut = service.call(request);
        let response = poll_fn(|cx| {
            for _ in 0..4 {
                if let Poll::Ready(r) = Pin::new(&mut fut).poll(cx) {
                    return Poll::Ready(Ok(r));
                }
                // This answer waits: the answers batched before it go out meanwhile.
                if c.pending_out() > 0 {
                    if let Poll::Ready(r) = c.poll_flush_out(cx) {
                        r?;
                    }
                }
                let Some(fd) = feeder.as_mut() else {
                    return c.poll_client_gone(cx).map(Err);
                };
                if !c.poll_feed(cx, fd)? {
                    if !fd.done && !fd.broken && lock(&fd.feed).dropped {
                        // Let go of by the service: what of it is here is taken.
                        c.skip_buffered(fd)?;
                    }
                    if fd.done {
                        return c.poll_client_gone(cx).map(Err);
                    }
                    return Poll::Pending;
                }
                // A chunk handed over may let the service go on at once.
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
        let response: Response<S::Body> = match response {
            Ok(r) => r,
            Err(e) => {
                // The client went away (or the connection broke) before the answer: the
                // service's future is dropped here, cancelling what it waits for (the
                // backend request), as hyper's server does.
                drop(fut);
                return Err(e);
            }
        };
        drop(fut);
        let draining = *drain.borrow();
        let (mut parts, mut body) = response.into_parts();
        let status = parts.status;
        // 101 to an upgrade request: the connection is handed over after the head.
        // A body by length the service let go of before its end had its buffered part
        // thrown away: the tunnel would start inside the body, so no upgrade (the 101 is
        // replaced below, and the connection ends).
        let let_go = feeder
            .as_ref()
            .is_some_and(|fd| !fd.done && !fd.broken && lock(&fd.feed).dropped);
        if status == StatusCode::SWITCHING_PROTOCOLS && !let_go {
            if let Some(tx) = upgrade_tx.take() {
                write_head(
                    &mut c.out,
                    version,
                    &parts,
                    Framed::None,
                    ConnHeader::Upgrade,
                );
                poll_fn(|cx| c.poll_flush_out(cx)).await?;
                drop(body);
                // Every byte read past the head and not taken by the service goes to the
                // tunnel, in order: a body chunk split off the buffer but not taken (only a
                // body by length: an upgrade request with a chunked body is not offered the
                // upgrade, its framing is gone from what was decoded), then the buffer.
                let mut read = untaken_chunk(&mut feeder);
                let Conn { io, rbuf, .. } = c;
                let read = if read.is_empty() {
                    rbuf.freeze()
                } else {
                    read.extend_from_slice(&rbuf);
                    read.freeze()
                };
                let _ = tx.send(Upgraded {
                    read,
                    io: Box::new(io),
                });
                return Ok(());
            }
        }
        drop(upgrade_tx);
        // A body not to send (the service's answer replaced).
        let mut suppressed = false;
        if status.is_informational() {
            // Interim responses are not the service's to send; nor 101 without an upgrade.
            parts.status = StatusCode::INTERNAL_SERVER_ERROR;
            parts.headers.clear();
            keep_alive = false;
            suppressed = true;
        }
        let status = parts.status;
        let no_body_status = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
        let connect_ok = is_connect && status.is_success();
        if connect_ok {
            // No tunnel for a plain CONNECT: its 2xx ends the connection.
            keep_alive = false;
        }
        // A final answer before the body was asked for under `Expect: 100-continue`: no 100
        // may follow it (the client would read it as the start of its next response), and the
        // client may never send the body, so the connection ends after this response.
        if let Some(fd) = feeder.as_mut() {
            if std::mem::take(&mut fd.expect) && !fd.done {
                keep_alive = false;
            }
            // A body broken on the wire (framing, the client gone): where the next request
            // would start is unknown, so nothing after it is read as one; the connection
            // ends after this answer, which says so. (Before, only a body still under an
            // unanswered `Expect` did: the same bytes read in other pieces went on.)
            if fd.broken {
                keep_alive = false;
            }
            // An early answer to a body still coming (a 401 or 413 to an upload, or a backend's
            // 200 before the upload ended): the body is not read on after the answer, so the
            // connection ends after it, and the answer says so (`Connection: close`), so the
            // client sends nothing more on it and reads this answer before its unsent body
            // meets the close. Said when the service let go of the body (what of it is
            // buffered is taken first: all of it here keeps the connection), and when it
            // still holds it, whatever the status: whether it is read to its end while the
            // answer goes out cannot be known when the head is written, and a head saying
            // keep-alive must not be followed by a close.
            if !fd.done && !fd.broken {
                let dropped = lock(&fd.feed).dropped;
                let unread = !dropped || !c.skip_buffered(fd)?;
                if unread {
                    keep_alive = false;
                }
            }
        }
        // What the response's fields say of its framing and the connection (one pass).
        let (mut declared, mut te_present, mut says_close) = (None, false, false);
        for (name, value) in parts.headers.iter() {
            if name == header::CONTENT_LENGTH {
                declared = content_length(value.as_bytes());
            } else if name == header::TRANSFER_ENCODING {
                te_present = true;
            } else if name == header::CONNECTION {
                says_close |= value
                    .as_bytes()
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            }
        }
        if says_close || draining {
            keep_alive = false;
        }
        let hint = body.size_hint().exact();
        let framed = if suppressed {
            Framed::Length(0)
        } else if no_body_status || connect_ok {
            Framed::None
        } else if let Some(n) = declared.filter(|_| !te_present) {
            Framed::Length(n)
        } else if is_head && hint.is_none_or(|n| n == 0) {
            // A HEAD answer says no length it does not know (nor an implied 0).
            Framed::None
        } else if let Some(n) = hint.filter(|_| !te_present) {
            Framed::Length(n)
        } else if version == Version::HTTP_10 {
            keep_alive = false;
            Framed::Close
        } else {
            Framed::Chunked
        };
        let write_body = !(is_head || no_body_status || connect_ok || suppressed);
        let conn_mode = match (keep_alive, version) {
            (false, _) => ConnHeader::Close,
            (true, Version::HTTP_10) => ConnHeader::KeepAlive10,
            (true, _) => ConnHeader::KeepAlive,
        };
        write_head(&mut c.out, version, &parts, framed, conn_mode);
        drop(parts);
        let trailers_ok = info.trailers_ok;
        // The body, while the request body goes on being fed.
        if write_body {
            let mut left = match framed {
                Framed::Length(n) => n,
                _ => u64::MAX,
            };
            let result = poll_fn(|cx| loop {
                if let Some(fd) = feeder.as_mut() {
                    c.poll_feed(cx, fd)?;
                }
                if c.pending_out() >= FLUSH_AT {
                    std::task::ready!(c.poll_flush_out(cx))?;
                    continue;
                }
                if matches!(framed, Framed::Length(_)) && left == 0 {
                    return Poll::Ready(Ok::<_, io::Error>(true));
                }
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => {
                            if data.is_empty() {
                                continue;
                            }
                            match framed {
                                Framed::Length(_) => {
                                    if data.len() as u64 > left {
                                        // More than declared: the framing is broken.
                                        return Poll::Ready(Ok(false));
                                    }
                                    left -= data.len() as u64;
                                    c.push(data);
                                }
                                Framed::Chunked => {
                                    chunked::put_chunk_head(&mut c.out, data.len());
                                    c.push(data);
                                    c.out.extend_from_slice(chunked::CHUNK_END);
                                }
                                Framed::Close | Framed::None => c.push(data),
                            }
                        }
                        Err(frame) => {
                            if let (Ok(t), Framed::Chunked) = (frame.into_trailers(), framed) {
                                // Only to a client that said `TE: trailers`, and never a
                                // framing, routing or credential field.
                                let t: HeaderMap = if trailers_ok {
                                    t.iter()
                                        .filter(|(name, _)| !chunked::forbidden_trailer(name))
                                        .map(|(n, v)| (n.clone(), v.clone()))
                                        .collect()
                                } else {
                                    HeaderMap::new()
                                };
                                chunked::put_end(&mut c.out, &t);
                                left = 0;
                                return Poll::Ready(Ok(true));
                            }
                        }
                    },
                    Poll::Ready(Some(Err(_))) => return Poll::Ready(Ok(false)),
                    Poll::Ready(None) => {
                        return Poll::Ready(Ok(match framed {
                            Framed::Chunked => {
                                c.out.extend_from_slice(chunked::LAST_CHUNK);
                                true
                            }
                            Framed::Length(_) => left == 0,
                            Framed::Close | Framed::None => true,
                        }));
                    }
                    Poll::Pending => {
                        if c.pending_out() > 0 {
                            if let Poll::Ready(r) = c.poll_flush_out(cx) {
                                r?;
                            }
                        }
                        // A client gone while the body waits (a slow or silent backend)
                        // ends the connection now, not at the next write.
                        if feeder.as_ref().is_none_or(|fd| fd.done) {
                            if let Poll::Ready(e) = c.poll_client_gone(cx) {
                                return Poll::Ready(Err(e));
                            }
                        }
                        return Poll::Pending;
                    }
                }
            })
            .await?;
            if !result {
                // The body failed or broke its length: the client sees the connection end.
                poll_fn(|cx| c.poll_flush_out(cx)).await?;
                return Ok(());
            }
        }
        drop(body);
        // The request body: finished, or its rest already here, or the connection ends. A
        // request refused for its framing has its body unread too.
        let mut unread = info.conflict;
        if let Some(mut fd) = feeder.take().filter(|fd| !fd.done && !fd.broken) {
            if lock(&fd.feed).dropped {
                // The service let go of it: take what is already buffered, read no more.
                if !c.skip_buffered(&mut fd)? {
                    keep_alive = false;
                    unread = !fd.broken;
                }
            } else {
                // Still held after the answer (by a task the service handed it to): it is fed
                // no more, so it ends Incomplete after what it was handed, never as a shorter
                // body that looks whole; the connection ends.
                let mut f = lock(&fd.feed);
                f.end = Some(Err(BodyError::Incomplete));
                f.wake_body();
                keep_alive = false;
                unread = true;
            }
        }
        if !keep_alive {
            poll_fn(|cx| c.poll_flush_out(cx)).await?;
            let _ = poll_fn(|cx| Pin::new(&mut c.io).poll_shutdown(cx)).await;
            if unread {
                c.linger().await;
            }
            return Ok(());
        }
        if c.pending_out() >= FLUSH_AT {
            poll_fn(|cx| c.poll_flush_out(cx)).await?;
        }
    }
}

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framed {
    /// No body (and no length field) at all.
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (HTTP/1.0, unknown length).
    Close,
}

/// What the response head says of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnHeader {
    KeepAlive,
    /// HTTP/1.0 kept alive: says so.
    KeepAlive10,
    Close,
    Upgrade,
}

/// Writes a response head into `out`.
fn write_head(
    out: &mut BytesMut,
    version: Version,
    parts: &http::response::Parts,
    framed: Framed,
    conn: ConnHeader,
) {
    let status = parts.status;
    if version == Version::HTTP_11 && status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(if version == Version::HTTP_10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        out.extend_from_slice(status.as_str().as_bytes());
        out.extend_from_slice(b" ");
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let mut has_date = false;
    let mut said_close = false;
    let mut said_keep_alive = false;
    for (name, value) in parts.headers.iter() {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        if name == header::TRAILER && framed != Framed::Chunked {
            continue;
        }
        if name == header::DATE {
            has_date = true;
        } else if name == header::CONNECTION {
            let v = value.as_bytes();
            said_close |= v
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            said_keep_alive |= v
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"keep-alive"));
            if conn == ConnHeader::Close && !said_close {
                continue;
            }
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match conn {
        ConnHeader::Close if !said_close => out.extend_from_slice(b"connection: close\r\n"),
        ConnHeader::KeepAlive10 if !said_keep_alive => {
            out.extend_from_slice(b"connection: keep-alive\r\n")
        }
        _ => {}
    }
    match framed {
        Framed::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            put_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framed::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framed::None | Framed::Close => {
            // 304 keeps the length the full response would have (RFC 9110 §8.6).
            if parts.status == StatusCode::NOT_MODIFIED {
                if let Some(v) = parts.headers.get(header::CONTENT_LENGTH) {
                    out.extend_from_slice(b"content-length: ");
                    out.extend_from_slice(v.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
    }
    if !has_date {
        out.extend_from_slice(b"date: ");
        date::put(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends the decimal digits of `n`.
fn put_u64(out: &mut BytesMut, mut n: u64) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&d[i..]);
}

/// Writes a refusal of a request head: status, reason as a short text body, connection close.
fn write_refusal(out: &mut BytesMut, status: StatusCode, why: &str) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: ");
    put_u64(out, why.len() as u64 + 1);
    out.extend_from_slice(b"\r\ndate: ");
    date::put(out);
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(why.as_bytes());
    out.extend_from_slice(b"\n");
}

mod date {
    //! The `date` response field, formatted once per second per thread.

    use bytes::BytesMut;
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, [u8; 29])> = const { RefCell::new((0, [0; 29])) };
    }

    /// Appends the current time as an HTTP date (29 bytes).
    pub(super) fn put(out: &mut BytesMut) {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with(|c| {
            let mut c = c.borrow_mut();
            if c.0 != secs {
                let s = httpdate::fmt_http_date(now);
                let mut b = [0u8; 29];
                let n = s.len().min(29);
                b[..n].copy_from_slice(&s.as_bytes()[..n]);
                *c = (secs, b);
            }
            out.extend_from_slice(&c.1);
        })
    }

    #[cfg(test)]
    #[test]
    fn dates_are_http_dates() {
        let mut b = BytesMut::new();
        put(&mut b);
        assert!(httpdate::parse_http_date(std::str::from_utf8(&b).unwrap()).is_ok());
    }
}
