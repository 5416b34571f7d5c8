//! The bridges between an HTTP/2 connection driver ([`crate::conn`]) and the service: the
//! request body handed to the [`crate::H2Service`] ([`RecvBody`], fed by the driver
//! from DATA frames, bounded by the stream's flow-control window, which the driver re-opens
//! only as the body is consumed), the wake-up path from a stream (response future or body,
//! request body consumption) to the connection task ([`Signal`], [`StreamWaker`]), and the
//! tunnel of an RFC 8441 extended CONNECT stream ([`Upgraded`]).

use crate::BoxError;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The streams of one connection that have something for the driver (a response ready, a
/// body frame ready, request body consumed), and the driver's waker.
#[derive(Default)]
pub struct Signal {
    inner: Mutex<SignalInner>,
    /// Request body bytes of all streams consumed (or discarded) whose connection window the
    /// driver has not yet re-opened; counted past a stream's END_STREAM too.
    conn_consumed: AtomicUsize,
    /// Set by the driver while the connection window it granted is below half: the first
    /// consumption after it looked wakes it.
    conn_low: AtomicBool,
}

#[derive(Default)]
struct SignalInner {
    ready: Vec<u32>,
    waker: Option<Waker>,
    /// The tokio task of the driver, as of its last `take`.
    task: Option<tokio::task::Id>,
    /// A stream was marked ready from inside another task's poll (not by the I/O driver or
    /// a timer, which wake between polls, nor by the driver's own task) since the last `take`.
    by_task: bool,
}

impl Signal {
    /// Marks stream `id` ready and wakes the driver.
    pub fn notify(&self, id: u32) {
        let by = tokio::task::try_id();
        let waker = {
            let mut s = lock(&self.inner);
            s.ready.push(id);
            s.by_task |= by.is_some() && by != s.task;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Counts `n` request body bytes consumed; wakes the driver if the connection window is low
    /// and these are the first bytes since it last took the count.
    pub fn consumed(&self, n: usize) {
        if n == 0 {
            return;
        }
        // SeqCst with `set_conn_low` then `take_consumed` in the driver: either the driver's
        // take sees these bytes, or this sees the flag and wakes it.
        let prev = self.conn_consumed.fetch_add(n, Ordering::SeqCst);
        if prev == 0 && self.conn_low.load(Ordering::SeqCst) {
            let waker = lock(&self.inner).waker.take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// Takes the count of consumed bytes for the connection window.
    pub fn take_consumed(&self) -> usize {
        self.conn_consumed.swap(0, Ordering::SeqCst)
    }

    /// Whether the driver wants to hear of consumption at once (its window is low).
    pub fn set_conn_low(&self, low: bool) {
        self.conn_low.store(low, Ordering::SeqCst);
    }

    /// Moves the ready streams into `out` and registers the driver's waker (and its task).
    /// True when one of them was marked ready by another task (see `SignalInner::by_task`):
    /// that task may make more of the connection's answers ready before the runtime's next
    /// turn.
    pub fn take(&self, out: &mut Vec<u32>, waker: &Waker) -> bool {
        let task = tokio::task::try_id();
        let mut s = lock(&self.inner);
        out.append(&mut s.ready);
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
        s.task = task;
        std::mem::take(&mut s.by_task)
    }
}

/// The waker of one stream's response future and body: marks the stream ready.
pub struct StreamWaker {
    /// The connection's ready set the stream's id is added to.
    pub signal: Arc<Signal>,
    /// The stream this waker marks ready.
    pub id: u32,
}

impl Wake for StreamWaker {
    fn wake(self: Arc<Self>) {
        self.signal.notify(self.id);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.signal.notify(self.id);
    }
}

/// Request body state shared by the driver and the [`RecvBody`].
pub struct RecvShared {
    state: Mutex<RecvState>,
    signal: Arc<Signal>,
    id: u32,
    /// Consumed bytes past which the driver is told to send WINDOW_UPDATE.
    notify_at: usize,
}

/// DATA payloads smaller than this are copied into a shared chunk (`RecvState::tail`)
/// rather than queued as their own slice of the connection's read buffer: each slice keeps
/// its whole read buffer alive (~16 KiB), and each queued chunk costs its own bookkeeping, so
/// 1-byte DATA frames would hold far more memory than the window they use. Larger payloads
/// stay zero-copy (at most two of them share one read buffer).
pub const COALESCE_BELOW: usize = 8 * 1024;
/// Capacity of a coalescing chunk.
const COALESCED_CHUNK: usize = 16 * 1024;

#[derive(Default)]
struct RecvState {
    data: VecDeque<Bytes>,
    /// Small payloads copied together; read after `data`.
    tail: BytesMut,
    /// Bytes in `data` and `tail`.
    buffered: usize,
    trailers: Option<HeaderMap>,
    end: bool,
    /// The stream was reset or the connection failed.
    error: Option<&'static str>,
    waker: Option<Waker>,
    /// Bytes consumed (or dropped) whose window the driver has not yet re-opened.
    consumed: usize,
    /// The body was dropped: further data is discarded.
    dropped: bool,
}

impl RecvShared {
    /// Shared state of stream `id`'s request body; the driver is woken through `signal` once `notify_at` bytes were consumed (time for a WINDOW_UPDATE).
    pub fn new(signal: Arc<Signal>, id: u32, notify_at: usize) -> Arc<RecvShared> {
        Arc::new(RecvShared {
            state: Mutex::new(RecvState::default()),
            signal,
            id,
            notify_at,
        })
    }

    /// Queues a DATA payload (small ones are copied together, see [`COALESCE_BELOW`]).
    /// Returns false when the body is gone (the bytes count as consumed at once).
    pub fn push(&self, data: Bytes) -> bool {
        let mut s = lock(&self.state);
        if s.dropped {
            return false;
        }
        if !data.is_empty() {
            s.buffered += data.len();
            if data.len() < COALESCE_BELOW {
                if s.tail.capacity() - s.tail.len() < data.len() {
                    s.seal_tail();
                    s.tail.reserve(COALESCED_CHUNK);
                }
                s.tail.extend_from_slice(&data);
            } else {
                s.seal_tail();
                s.data.push_back(data);
            }
        }
        let w = s.waker.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
        true
    }

    /// Ends the body, with trailers or not.
    pub fn finish(&self, trailers: Option<HeaderMap>) {
        let mut s = lock(&self.state);
        s.end = true;
        s.trailers = trailers;
        let w = s.waker.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Fails the body (stream reset, malformed content, connection gone).
    pub fn fail(&self, why: &'static str) {
        let mut s = lock(&self.state);
        if s.end {
            return;
        }
        s.error = Some(why);
        let w = s.waker.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Takes the count of consumed bytes whose window is to be re-opened.
    pub fn take_consumed(&self) -> usize {
        std::mem::take(&mut lock(&self.state).consumed)
    }

    /// Discards the buffered data (the stream is gone): its bytes count as consumed.
    pub fn discard(&self) {
        let mut s = lock(&self.state);
        let buffered = s.clear();
        drop(s);
        self.signal.consumed(buffered);
    }

    /// Whether the body was dropped by the pipeline.
    pub fn dropped(&self) -> bool {
        lock(&self.state).dropped
    }
}

impl RecvState {
    /// Queues the coalesced chunk (what follows goes after it).
    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            let chunk = self.tail.split().freeze();
            self.data.push_back(chunk);
        }
    }

    /// The next chunk of data, if any.
    fn pop(&mut self) -> Option<Bytes> {
        if let Some(d) = self.data.pop_front() {
            return Some(d);
        }
        if self.tail.is_empty() {
            return None;
        }
        Some(self.tail.split().freeze())
    }

    /// Drops the buffered data; its byte count.
    fn clear(&mut self) -> usize {
        self.data.clear();
        self.tail = BytesMut::new();
        std::mem::take(&mut self.buffered)
    }
}

/// The request body of an HTTP/2 stream, as the pipeline reads it.
pub struct RecvBody {
    shared: Arc<RecvShared>,
    /// Bytes still expected per `content-length`.
    remaining: Option<u64>,
}

impl RecvBody {
    /// The body over `shared`; `content_length` (the request's `content-length`, if any) is checked against the DATA received.
    pub fn new(shared: Arc<RecvShared>, content_length: Option<u64>) -> RecvBody {
        RecvBody {
            shared,
            remaining: content_length,
        }
    }
}

/// A request body error: the stream was reset or the connection closed mid-body.
#[derive(Debug, thiserror::Error)]
#[error("HTTP/2 request body: {0}")]
pub struct BodyError(pub &'static str);

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut s = lock(&self.shared.state);
        if let Some(d) = s.pop() {
            s.buffered -= d.len();
            s.consumed += d.len();
            let notify = s.consumed >= self.shared.notify_at;
            drop(s);
            self.shared.signal.consumed(d.len());
            if notify {
                self.shared.signal.notify(self.shared.id);
            }
            if let Some(r) = self.remaining.as_mut() {
                *r = r.saturating_sub(d.len() as u64);
            }
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = s.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if s.end {
            return Poll::Ready(None);
        }
        if let Some(e) = s.error {
            return Poll::Ready(Some(Err(Box::new(BodyError(e)))));
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let s = lock(&self.shared.state);
        s.end && s.buffered == 0 && s.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        let mut s = lock(&self.shared.state);
        s.dropped = true;
        let buffered = s.clear();
        s.consumed += buffered;
        drop(s);
        self.shared.signal.consumed(buffered);
        // The driver re-opens the connection window for what was buffered, and stops
        // granting stream window.
        self.shared.signal.notify(self.shared.id);
    }
}

/// Bytes buffered from the tunnel towards the client before the writer waits.
pub const TUNNEL_PIPE: usize = 64 * 1024;

/// The client side of an extended CONNECT tunnel: reads the stream's DATA, writes DATA back
/// (through a bounded pipe the driver drains under flow control).
pub struct Upgraded {
    recv: RecvBody,
    pending: Bytes,
    send: DuplexStream,
}

/// Creates a tunnel over a stream's request body; the second half is the response body the
/// driver sends once the CONNECT is answered with a 2xx.
pub fn tunnel(recv: RecvBody) -> (Upgraded, crate::Body) {
    let (a, b) = tokio::io::duplex(TUNNEL_PIPE);
    let up = Upgraded {
        recv,
        pending: Bytes::new(),
        send: a,
    };
    (
        up,
        crate::boxed(PipeBody {
            read: b,
            buf: BytesMut::new(),
        }),
    )
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        use http_body::Body as _;
        while self.pending.is_empty() {
            match Pin::new(&mut self.recv).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        self.pending = d;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, e)))
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.send).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_shutdown(cx)
    }
}

/// The response body of a tunnel: what the tunnel wrote, read from the pipe.
struct PipeBody {
    read: DuplexStream,
    /// Read buffer, kept between polls: a poll that finds nothing (an idle tunnel woken)
    /// allocates and zeroes nothing; after a read only the bytes handed out are replaced.
    buf: BytesMut,
}

/// Bytes read from a tunnel's pipe at a time.
const PIPE_READ: usize = 16 * 1024;

impl http_body::Body for PipeBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.buf.len() < PIPE_READ {
            this.buf.resize(PIPE_READ, 0);
        }
        let mut rb = ReadBuf::new(&mut this.buf[..]);
        match Pin::new(&mut this.read).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let n = rb.filled().len();
                if n == 0 {
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(Frame::data(this.buf.split_to(n).freeze()))))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The request extension through which the WebSocket proxy takes an extended CONNECT
/// stream's tunnel (instead of `hyper::upgrade::on`).
#[derive(Clone)]
pub struct Upgrade(pub Arc<Mutex<Option<Upgraded>>>);

impl Upgrade {
    /// Takes the tunnel (once).
    pub fn take(&self) -> Option<Upgraded> {
        lock(&self.0).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn request_body_yields_data_then_trailers_and_reports_consumption() {
        let signal = Arc::new(Signal::default());
        let shared = RecvShared::new(signal.clone(), 1, 4);
        let mut body = RecvBody::new(shared.clone(), Some(6));
        assert_eq!(body.size_hint().exact(), Some(6));
        assert!(shared.push(Bytes::from_static(b"abc")));
        let f = body.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "abc");
        let mut ready = Vec::new();
        signal.take(&mut ready, Waker::noop());
        assert!(ready.is_empty(), "3 bytes consumed: below the threshold");
        assert!(shared.push(Bytes::from_static(b"def")));
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        shared.finish(Some(t));
        let f = body.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "def");
        signal.take(&mut ready, Waker::noop());
        assert_eq!(ready, [1], "past the threshold the driver is told");
        assert_eq!(shared.take_consumed(), 6);
        assert_eq!(body.size_hint().exact(), Some(0));
        let f = body.frame().await.unwrap().unwrap();
        assert_eq!(f.into_trailers().unwrap()["grpc-status"], "0");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_dropped_body_releases_its_buffer_and_a_reset_fails_it() {
        let signal = Arc::new(Signal::default());
        let shared = RecvShared::new(signal.clone(), 3, 1 << 20);
        let body = RecvBody::new(shared.clone(), None);
        shared.push(Bytes::from_static(b"12345"));
        drop(body);
        assert!(shared.dropped());
        assert_eq!(
            shared.take_consumed(),
            5,
            "buffered bytes count as consumed"
        );
        assert!(
            !shared.push(Bytes::from_static(b"x")),
            "later data is refused"
        );

        let shared = RecvShared::new(signal, 5, 1 << 20);
        let mut body = RecvBody::new(shared.clone(), None);
        shared.fail("stream reset by the client");
        assert!(body.frame().await.unwrap().is_err());
    }

    #[tokio::test]
    async fn tiny_payloads_are_copied_together_and_free_the_read_buffer() {
        let signal = Arc::new(Signal::default());
        let shared = RecvShared::new(signal, 1, 1 << 20);
        let mut body = RecvBody::new(shared.clone(), None);
        // 10,000 one-byte DATA payloads, each a slice of the read buffer they arrived in,
        // then a large one (kept as it is), then one more small one.
        let read_buf = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        for i in 0..read_buf.len() {
            assert!(shared.push(read_buf.slice(i..i + 1)));
        }
        let large = Bytes::from(vec![7u8; COALESCE_BELOW]);
        shared.push(large.clone());
        shared.push(Bytes::from_static(b"z"));
        {
            let s = lock(&shared.state);
            assert!(
                s.data.len() <= 2,
                "{} chunks queued for 10,001 bytes",
                s.data.len()
            );
            assert_eq!(s.buffered, 10_000 + COALESCE_BELOW + 1);
        }
        assert!(
            read_buf.is_unique(),
            "the queued body keeps the read buffer alive"
        );
        let mut got = Vec::new();
        while let Some(f) = body.frame().await {
            got.extend_from_slice(&f.unwrap().into_data().unwrap());
            if got.len() == 10_000 + COALESCE_BELOW + 1 {
                break;
            }
        }
        assert_eq!(&got[..10_000], &read_buf[..], "in order");
        assert_eq!(&got[10_000..10_000 + COALESCE_BELOW], &large[..]);
        assert_eq!(got.last(), Some(&b'z'));
    }

    #[tokio::test]
    async fn an_idle_tunnel_poll_allocates_nothing() {
        use tokio::io::AsyncWriteExt;
        let (mut w, read) = tokio::io::duplex(TUNNEL_PIPE);
        let mut body = PipeBody {
            read,
            buf: BytesMut::new(),
        };
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        let (at, cap) = (body.buf.as_ptr(), body.buf.capacity());
        for _ in 0..3 {
            assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
            assert_eq!((body.buf.as_ptr(), body.buf.capacity()), (at, cap));
        }
        w.write_all(b"data").await.unwrap();
        let Poll::Ready(Some(Ok(f))) = Pin::new(&mut body).poll_frame(&mut cx) else {
            panic!("the data");
        };
        assert_eq!(f.into_data().unwrap(), "data");
    }

    #[tokio::test]
    async fn tunnels_read_the_request_stream_and_write_to_the_response_body() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let signal = Arc::new(Signal::default());
        let shared = RecvShared::new(signal, 1, 1 << 20);
        let (mut up, mut out) = tunnel(RecvBody::new(shared.clone(), None));
        shared.push(Bytes::from_static(b"ping"));
        let mut buf = [0u8; 16];
        let n = up.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ping");
        up.write_all(b"pong").await.unwrap();
        let f = out.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "pong");
        up.shutdown().await.unwrap();
        drop(up);
        assert!(
            out.frame().await.is_none(),
            "shutdown ends the response body"
        );
        shared.finish(None);
    }
}
