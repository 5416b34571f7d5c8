//! The client side of HTTP/2 (RFC 9113) for h2c (prior knowledge) and h2-over-TLS backends:
//! many requests at once on one connection, on this crate's frames and HPACK.
//!
//! [`handshake`] writes the preface, our SETTINGS (push off, each stream's window, the
//! response header list bound) and the connection window, and waits for the backend's
//! SETTINGS: a peer that does not speak HTTP/2 fails here, before any request. It returns a
//! [`SendRequest`] (cloned freely) and the [`Connection`] future, which the caller spawns: it
//! alone owns the transport, reads and handles the backend's frames ([`core::Core`]), polls
//! request bodies as the windows allow and writes.
//!
//! [`SendRequest::send`] opens a stream under the connection's lock: the HEADERS block is
//! encoded straight from the caller's fields into the output (no request value is built; the
//! table-less encoder of [`crate::hpack`], strings as they are: `Encoder::field_raw`) and the connection task is woken to write it. The
//! returned [`ResponseFuture`] gives the final head (interim 1xx skipped, at most
//! [`core::MAX_INTERIM`]); the [`ResponseBody`] its data and trailers, each chunk granting
//! its bytes back to the windows as it is taken (a WINDOW_UPDATE once half a window is due).
//! A response that came whole before its head was asked for is handed over whole, the stream
//! already gone. Dropping the future or the body of a stream still open resets it (CANCEL).
//!
//! Retry safety: a request the backend refused (REFUSED_STREAM, or a stream above the last
//! id of its GOAWAY) or whose HEADERS never reached the transport fails with
//! [`H2Error::Refused`], and its body comes back ([`SendError::unsent`]) when nothing was
//! taken from it; [`SendError::closed_before_response`] says the connection went away before
//! any response frame.
//!
//! Keep-alive: every [`TICK`] the connection looks at what it read; with streams open and
//! three silent ticks it sends a PING, and a fourth silent tick fails the connection. A
//! connection without streams for [`IDLE_TICKS`] ticks, or whose handles are all gone, closes
//! with GOAWAY.
//!
//! Bounds: the read buffer holds one frame (16 KiB, our SETTINGS_MAX_FRAME_SIZE) and one read
//! past it; the output stops taking body data past [`core::WRITE_HIGH`], and the backend
//! stops being read past four times that (only acknowledgements can take it there); each
//! stream holds at most its window of unread response data. The connection's window does not
//! bound what the streams hold together by itself (a body handed over whole, or data taken
//! from a stream, is credited back while its consumer may still hold it): the caller bounds
//! the streams per connection (the dataplane's pool: 100, each of a window of its
//! read-ahead). The limits on the backend's frames are in [`core`].

pub mod core;

use self::core::{Config, Core, Fault, HeadPoll, RequestHead};
use crate::{Body, H2Error};
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// The keep-alive clock's period.
pub const TICK: Duration = Duration::from_secs(10);
/// Ticks without a stream after which a connection closes (90 s).
pub const IDLE_TICKS: u32 = 9;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024 + crate::frame::HEADER_LEN;
/// Output bytes past which the backend is not read.
const READ_STOP: usize = 4 * core::WRITE_HIGH;
/// Rounds of (read, handle, write) in one poll of the connection before it yields.
const ROUNDS: usize = 16;

struct Shared {
    core: Mutex<Core>,
    /// No new stream: the connection ended or the backend sent GOAWAY.
    closing: AtomicBool,
    /// The backend's SETTINGS_MAX_CONCURRENT_STREAMS.
    max_streams: AtomicU32,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Opens streams on one connection; cheap to clone.
#[derive(Clone)]
pub struct SendRequest {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SendRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRequest")
            .field("closing", &self.is_closing())
            .finish()
    }
}

impl Drop for SendRequest {
    fn drop(&mut self) {
        // The last handle but the task's: the task closes the connection once no stream is
        // left, so it is woken to see that now rather than at its next tick.
        if Arc::strong_count(&self.shared) == 2 {
            let w = self.shared.lock().task_waker.take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

/// A failed request.
#[derive(Debug)]
pub struct SendError {
    /// The cause.
    pub error: H2Error,
    /// The request body, when the backend cannot have processed the request and nothing was
    /// taken from the body: it may go again, on another connection.
    pub unsent: Option<Body>,
    /// The connection went away (or refused the stream) before any frame of a response.
    pub closed_before_response: bool,
}

/// Opens a client connection over `io`: our preface out, the backend's SETTINGS in. The
/// returned [`Connection`] must be spawned (or polled) for anything to happen.
pub async fn handshake<T>(io: T, cfg: Config) -> Result<(SendRequest, Connection<T>), H2Error>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let shared = Arc::new(Shared {
        core: Mutex::new(Core::new(cfg)),
        closing: AtomicBool::new(false),
        max_streams: AtomicU32::new(100),
    });
    let mut conn = Connection {
        shared: shared.clone(),
        io,
        tick: Box::pin(tokio::time::sleep(TICK)),
        tick_registered: false,
    };
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = Pin::new(&mut conn).poll(cx) {
            return Poll::Ready(Err(r.err().unwrap_or(H2Error::Closed)));
        }
        let core = shared.lock();
        if core.fault.is_some() {
            // Failed with the backend's first frames (its GOAWAY may still be unwritten).
            return Poll::Ready(Err(fault_error(&core)));
        }
        if core.preface_seen {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await?;
    // The task that runs it from now on registers its own waker with the timer.
    conn.tick_registered = false;
    Ok((SendRequest { shared }, conn))
}

impl SendRequest {
    /// No new stream can open here (the connection ended, or the backend is going away).
    pub fn is_closing(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// The backend's SETTINGS_MAX_CONCURRENT_STREAMS (100 until it says).
    pub fn max_streams(&self) -> usize {
        self.shared.max_streams.load(Ordering::Relaxed) as usize
    }

    /// Opens a stream for `req` with `body`. Fails at once, the body given back, when the
    /// connection takes no new stream.
    pub fn send(&self, req: RequestHead<'_>, body: Body) -> Result<ResponseFuture, SendError> {
        let mut core = self.shared.lock();
        let opened = core.open(&req, body);
        if core.is_closing() {
            // The ids ran out with this stream: no other opens here.
            self.shared.closing.store(true, Ordering::Release);
        }
        match opened {
            Ok(id) => Ok(ResponseFuture {
                shared: Some(self.shared.clone()),
                id,
            }),
            Err((error, body)) => {
                let retry =
                    matches!(error, H2Error::Refused | H2Error::Closed) || core.fault.is_some();
                Err(SendError {
                    error,
                    unsent: retry.then_some(body),
                    closed_before_response: retry,
                })
            }
        }
    }
}

/// The response head of one stream.
pub struct ResponseFuture {
    /// `None` once the head (or the failure) was handed out.
    shared: Option<Arc<Shared>>,
    id: u32,
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("id", &self.id)
            .finish()
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<ResponseBody>, SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        let Some(shared) = self.shared.as_ref() else {
            return Poll::Ready(Err(SendError {
                error: H2Error::Closed,
                unsent: None,
                closed_before_response: false,
            }));
        };
        let polled = shared.lock().poll_head(id, cx);
        let body = |state| ResponseBody { state };
        match polled {
            HeadPoll::Pending => Poll::Pending,
            HeadPoll::Ready(parts) => {
                let shared = self.shared.take().expect("checked above");
                Poll::Ready(Ok(http::Response::from_parts(
                    parts,
                    body(State::Streaming { shared, id }),
                )))
            }
            HeadPoll::Whole(parts, data, trailers) => {
                self.shared = None;
                Poll::Ready(Ok(http::Response::from_parts(
                    parts,
                    body(State::Whole(data, trailers)),
                )))
            }
            HeadPoll::Failed(error, unsent, closed_before_response) => {
                self.shared = None;
                Poll::Ready(Err(SendError {
                    error,
                    unsent,
                    closed_before_response,
                }))
            }
        }
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.lock().drop_stream(self.id);
        }
    }
}

/// A response body from one stream.
pub struct ResponseBody {
    state: State,
}

enum State {
    /// Read whole before the head was asked for (the stream is gone).
    Whole(VecDeque<Bytes>, Option<Box<HeaderMap>>),
    /// Read from the stream as it is polled.
    Streaming { shared: Arc<Shared>, id: u32 },
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            State::Whole(d, _) => write!(f, "ResponseBody(whole, {} pieces)", d.len()),
            State::Streaming { id, .. } => write!(f, "ResponseBody(stream {id})"),
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = H2Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H2Error>>> {
        match &mut self.state {
            State::Whole(data, trailers) => Poll::Ready(match data.pop_front() {
                Some(d) => Some(Ok(Frame::data(d))),
                None => trailers.take().map(|t| Ok(Frame::trailers(*t))),
            }),
            State::Streaming { shared, id } => shared.lock().poll_body(*id, cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            State::Whole(d, t) => d.is_empty() && t.is_none(),
            State::Streaming { shared, id } => shared.lock().body_ended(*id),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Whole(d, _) => SizeHint::with_exact(d.iter().map(|b| b.len() as u64).sum()),
            State::Streaming { shared, id } => match shared.lock().body_left(*id) {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let State::Streaming { shared, id } = &self.state {
            shared.lock().drop_stream(*id);
        }
    }
}

/// The connection task: owns the transport. Ends when the connection does.
pub struct Connection<T> {
    shared: Arc<Shared>,
    io: T,
    tick: Pin<Box<tokio::time::Sleep>>,
    /// The timer holds this task's waker (false: poll it once more).
    tick_registered: bool,
}

impl<T> std::fmt::Debug for Connection<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

/// Reads what `io` has into `buf` (`Ok(0)`: the end of the stream).
fn poll_read_buf<T: AsyncRead + Unpin>(
    io: &mut T,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    let fut = io.read_buf(buf);
    let mut fut = std::pin::pin!(fut);
    fut.as_mut().poll(cx)
}

fn io_fault(e: &std::io::Error) -> Fault {
    Fault::Io(e.kind(), e.to_string())
}

/// One poll of a connection's task: keep-alive ticks, then rounds of reading, handling,
/// polling request bodies and writing. `orphan`: no handle is left but the task's.
fn drive<T: AsyncRead + AsyncWrite + Unpin>(
    io: &mut T,
    tick: &mut Pin<Box<tokio::time::Sleep>>,
    tick_registered: &mut bool,
    orphan: bool,
    core: &mut Core,
    cx: &mut Context<'_>,
) -> Poll<Result<(), H2Error>> {
    // The timer is polled (its waker registered) once per task and again only once it has
    // fired: polling it on every wake-up cost the request path for nothing.
    if *tick_registered && !tick.is_elapsed() {
        // Registered, not due.
    } else {
        *tick_registered = true;
        while tick.as_mut().poll(cx).is_ready() {
            if core.fault.is_some() {
                // The GOAWAY we owe could not be written in a whole tick: give up.
                return Poll::Ready(Err(fault_error(core)));
            }
            core.tick(IDLE_TICKS);
            let next = tokio::time::Instant::now() + TICK;
            tick.as_mut().reset(next);
        }
    }
    if core.fault.is_none() && orphan {
        // Nobody can send on it any more, and no stream is left.
        core.fail(Fault::Idle);
    }
    for _ in 0..ROUNDS {
        let mut again = false;
        // Read on while our output waits (a backend blocked writing to us may read nothing
        // until we do): what comes is bounded by our windows, and the answers it asks for
        // (PING and SETTINGS acknowledgements) by the flood limits and this mark.
        if core.fault.is_none() && core.out.len() < READ_STOP {
            core.rbuf.reserve(READ_CHUNK);
            match poll_read_buf(&mut *io, &mut core.rbuf, cx) {
                Poll::Ready(Ok(0)) => core.fail(Fault::Eof),
                Poll::Ready(Ok(_)) => {
                    core.process(None);
                    again = true;
                }
                Poll::Ready(Err(e)) => core.fail(io_fault(&e)),
                Poll::Pending => {}
            }
        }
        core.poll_send(cx);
        // Bodies stopped at the output mark have not registered a wake-up: once the output
        // moves, they are polled again.
        let stopped = core.out.len() >= core::WRITE_HIGH;
        let mut wrote = false;
        while !core.out.is_empty() {
            match Pin::new(&mut *io).poll_write(cx, &core.out) {
                Poll::Ready(Ok(0)) => {
                    core.fail(Fault::Io(
                        std::io::ErrorKind::WriteZero,
                        "write zero".into(),
                    ));
                    core.out.clear();
                }
                Poll::Ready(Ok(n)) => {
                    core.wrote(n);
                    wrote = true;
                }
                Poll::Ready(Err(e)) => {
                    core.fail(io_fault(&e));
                    core.out.clear();
                }
                Poll::Pending => break,
            }
        }
        if wrote && core.out.is_empty() {
            if let Poll::Ready(Err(e)) = Pin::new(&mut *io).poll_flush(cx) {
                core.fail(io_fault(&e));
            }
        }
        if core.finished() && core.out.is_empty() {
            let _ = Pin::new(&mut *io).poll_shutdown(cx);
            return Poll::Ready(match &core.fault {
                None | Some(Fault::Idle | Fault::Eof) => Ok(()),
                Some(_) => Err(fault_error(core)),
            });
        }
        // Streams woken by what was read may have body data to send: once more.
        if !(again || (stopped && wrote)) {
            return Poll::Pending;
        }
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}

fn fault_error(core: &Core) -> H2Error {
    match &core.fault {
        Some(Fault::Local(r, why)) => H2Error::Protocol(*r, why),
        Some(Fault::Remote(r)) => H2Error::Remote(*r),
        Some(Fault::Io(k, m)) => H2Error::Io(std::io::Error::new(*k, m.clone())),
        Some(Fault::KeepAlive) => H2Error::Protocol(crate::Reason::NO_ERROR, "no answer to PING"),
        _ => H2Error::Closed,
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Future for Connection<T> {
    type Output = Result<(), H2Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let orphan = Arc::strong_count(&this.shared) == 1;
        let shared = &this.shared;
        let mut core = shared.lock();
        // Wake-ups from inside this poll (a stream opened by what it reads) are not needed.
        core.task_waker = None;
        let r = drive(
            &mut this.io,
            &mut this.tick,
            &mut this.tick_registered,
            orphan,
            &mut core,
            cx,
        );
        shared
            .max_streams
            .store(core.peer_max_streams, Ordering::Relaxed);
        match r {
            Poll::Pending => {
                shared.closing.store(core.is_closing(), Ordering::Release);
                core.task_waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Poll::Ready(r) => {
                if core.fault.is_none() {
                    core.fail(Fault::Eof);
                }
                shared.closing.store(true, Ordering::Release);
                Poll::Ready(r)
            }
        }
    }
}

impl<T> Drop for Connection<T> {
    /// However the task ends (its end, dropped, a panic), the connection is closing and
    /// every stream still waiting fails: nothing waits on a task that is gone.
    fn drop(&mut self) {
        let mut core = self.shared.lock();
        core.fail(Fault::Gone);
        self.shared.closing.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
