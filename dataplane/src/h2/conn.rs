//! The server side of one HTTP/2 connection (RFC 9113): reads frames, runs the stream state
//! machine, hands each request to `pipeline::handle`, and writes responses under both
//! flow-control windows.
//!
//! One task drives the connection. After each read it handles the complete frames, answers
//! every stream whose response is ready at once (polled inline: cache hits, fixed replies,
//! refusals), then writes the whole batch with one `write`. At most
//! [`INLINE_FIRST_POLLS`] requests are started per poll of the task: past that it yields
//! (the rest of the read waits in the buffer), so one connection cannot hold its worker. A response that has to wait
//! (backend, file) runs as its own task; it and every response body wake the connection
//! through [`Signal`] with the stream's id, and the driver then writes what is ready.
//!
//! Bounds: the read buffer holds at most one frame past `SETTINGS_MAX_FRAME_SIZE` (16 KiB);
//! the write buffer stops taking body data at [`WRITE_HIGH`], and the driver stops handling
//! frames (the rest of a read waits in the read buffer) and stops reading while it is over
//! that mark (a client that does not read its responses stops being read);
//! request bodies are bounded by the stream and connection windows we grant, re-opened only
//! as the pipeline consumes them; header blocks by `limits.max_header_bytes`. Floods (rapid
//! reset, SETTINGS/PING/PRIORITY, empty frames) are counted per connection per second and
//! end the connection with GOAWAY ENHANCE_YOUR_CALM.

use super::body::{RecvBody, RecvShared, Signal, StreamWaker, Upgrade};
use super::frame::{self, flag, kind, setting, Head, Reason, HEADER_LEN, MAX_WINDOW};
use crate::body::Body;
use crate::cache::StoredHead;
use crate::ctx::ConnInfo;
use crate::hpack::{Decoder, Encoder, Field};
use crate::runtime::Shared;
use crate::server::{FirstPoll, INLINE_FIRST_POLLS};
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri, Version};
use http_body::Body as _;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::task::JoinHandle;

/// Output bytes past which the driver stops taking body data and stops reading.
pub const WRITE_HIGH: usize = 64 * 1024;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024 + HEADER_LEN;
/// Our SETTINGS_MAX_FRAME_SIZE (the default; larger frames are a FRAME_SIZE_ERROR).
const LOCAL_MAX_FRAME: u32 = frame::DEFAULT_MAX_FRAME_SIZE;
/// Largest DATA frame written (bounds the output buffer past [`WRITE_HIGH`]).
const MAX_DATA_FRAME: usize = 32 * 1024;
/// Most frames of one stream written before the driver turns to the next stream.
const FRAMES_PER_TURN: usize = 4;
/// Most rounds of (read, answer, write) in one poll before the task yields.
const ROUNDS: usize = 16;
/// Closed stream ids remembered to tell a frame on a closed stream (STREAM_CLOSED) from one
/// on a never-opened lower id (PROTOCOL_ERROR).
const RECENTLY_CLOSED: usize = 64;
/// Stream ids we reset, refused or ignored, remembered so that the frames the client sent
/// before it saw that are ignored (RFC 9113 §5.1) rather than answered and counted as resets.
const LOCALLY_RESET: usize = 1024;
/// Streams refused (past MAX_CONCURRENT_STREAMS) before the client acknowledged our SETTINGS
/// that are not counted as resets: a browser's opening burst (~100 streams) against a low
/// limit.
const EARLY_REFUSALS: u32 = 128;
/// SETTINGS, PING and PRIORITY frames, and empty DATA/CONTINUATION frames, a client may send
/// per second.
const MAX_CONTROL_PER_SEC: u32 = 1_000;
const MAX_EMPTY_PER_SEC: u32 = 200;

/// The connection's settings, from the config's limits.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_concurrent_streams: u32,
    pub max_header_bytes: u32,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// Resets (client RST_STREAM before the response finished, refused streams) per second.
    pub max_resets_per_sec: u32,
    /// Window of each request stream we grant.
    pub stream_window: u32,
    /// Window of the whole connection we grant.
    pub conn_window: u32,
}

impl Settings {
    /// Settings from the config's limits.
    pub fn from_limits(l: &sweety_config::Limits) -> Settings {
        Settings {
            max_concurrent_streams: l.max_concurrent_streams,
            max_header_bytes: l.max_header_bytes,
            header_read_timeout: l.header_read_timeout.get(),
            idle_timeout: l.idle_timeout.get(),
            max_resets_per_sec: l.max_pending_reset_streams,
            stream_window: 256 * 1024,
            conn_window: 1024 * 1024,
        }
    }
}

/// Why a connection ended other than cleanly.
#[derive(Debug, thiserror::Error)]
pub enum H2Error {
    /// A connection error we sent GOAWAY for.
    #[error("HTTP/2 connection error {0}: {1}")]
    Protocol(Reason, &'static str),
    /// The client sent GOAWAY with an error.
    #[error("client closed the connection with {0}")]
    Remote(Reason),
    /// The socket failed.
    #[error("HTTP/2 connection I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// An error while handling a frame: of the connection (GOAWAY) or one stream (RST_STREAM).
enum Fault {
    Conn(Reason, &'static str),
    Stream(u32, Reason),
}

type FResult = Result<(), Fault>;

/// Whose doing a stream reset is: the client's count towards the rapid-reset limit.
#[derive(Clone, Copy)]
enum Charge {
    Client,
    Server,
}

/// What a stream's response is doing.
enum Resp {
    /// The pipeline is working on it in its own task.
    Running(JoinHandle<(Response<Body>, Option<StoredHead>)>),
    /// HEADERS sent; the body is being sent.
    Body(Body),
    /// END_STREAM sent (or the stream reset).
    Done,
}

struct Stream {
    /// The request body's sink while the client may send data.
    recv: Option<Arc<RecvShared>>,
    recv_open: bool,
    /// What the client may still send on this stream.
    recv_window: i64,
    /// Consumed bytes not yet granted back.
    grant: usize,
    /// Bytes counted against the connection window, not yet released.
    unreleased: usize,
    content_length: Option<u64>,
    received: u64,
    send_window: i64,
    resp: Resp,
    /// Body data taken but not yet framed.
    pending: Bytes,
    /// The body has no more data (trailers may follow in `trailers`).
    body_done: bool,
    trailers: Option<Box<HeaderMap>>,
    waker: Option<Waker>,
    queued: bool,
    /// Listed in the driver's `blocked` (waiting for connection window).
    blocked: bool,
    /// Extended CONNECT: the tunnel's response body, sent instead of the response's on a 2xx.
    tunnel_body: Option<Body>,
    is_head: bool,
}

impl Stream {
    fn new(send_window: i64, recv_window: i64) -> Stream {
        Stream {
            recv: None,
            recv_open: true,
            recv_window,
            grant: 0,
            unreleased: 0,
            content_length: None,
            received: 0,
            send_window,
            resp: Resp::Done,
            pending: Bytes::new(),
            body_done: false,
            trailers: None,
            waker: None,
            queued: false,
            blocked: false,
            tunnel_body: None,
            is_head: false,
        }
    }

    fn finished(&self) -> bool {
        !self.recv_open && matches!(self.resp, Resp::Done)
    }
}

/// Hashing of stream ids: a multiplicative hash (the ids are a client's choice, but a
/// connection holds at most `max_concurrent_streams` of them, so collisions cost little).
#[derive(Default, Clone, Copy)]
struct StreamIds;

impl std::hash::BuildHasher for StreamIds {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The product's high bits are well mixed: fold them into the low ones too.
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A header block being received over HEADERS and CONTINUATION frames.
struct Continuation {
    stream: u32,
    end_stream: bool,
    bad_priority: bool,
    block: BytesMut,
}

/// Per-second counters of the flood guards.
struct Flood {
    since: Instant,
    resets: u32,
    control: u32,
    empty: u32,
}

impl Flood {
    /// Counts one event; true when the connection is over a limit.
    fn hit(&mut self, which: fn(&mut Flood) -> &mut u32, limit: u32) -> bool {
        let now = Instant::now();
        if now.duration_since(self.since) >= Duration::from_secs(1) {
            self.since = now;
            self.resets = 0;
            self.control = 0;
            self.empty = 0;
        }
        let c = which(self);
        *c += 1;
        *c > limit
    }
}

/// Serves one HTTP/2 connection (the client preface not yet read) until it ends.
/// `stop` turning true starts a graceful close (GOAWAY, in-flight streams finish).
pub async fn serve<I>(
    io: I,
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    settings: Settings,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), H2Error>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    serve_read(io, BytesMut::new(), shared, conn, settings, stop).await
}

/// [`serve`] for a connection whose first bytes (`read`: the client preface, perhaps more)
/// were already read from `io`.
pub async fn serve_read<I>(
    io: I,
    read: BytesMut,
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    settings: Settings,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), H2Error>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut driver = Driver::new(io, shared, conn, settings, stop);
    if !read.is_empty() {
        driver.read_buf = read;
        driver.frames_pending = true;
    }
    std::future::poll_fn(|cx| driver.poll(cx)).await
}

struct Driver<I> {
    io: I,
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    cfg: Settings,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    stop_seen: bool,
    signal: Arc<Signal>,
    ready: Vec<u32>,

    read_buf: BytesMut,
    write_buf: BytesMut,
    /// Written since the last completed flush: a TLS layer may hold what it accepted until
    /// it is flushed.
    unflushed: bool,
    /// `write_buf` holds DATA payload bytes.
    data_out: bool,
    /// The socket took some of that output since the keep-alive check last looked: the client
    /// is reading (our own control frames, which the kernel takes from a vanished client too,
    /// do not count).
    data_progress: bool,
    scratch: BytesMut,
    decoder: Decoder,
    encoder: Encoder,

    preface_done: bool,
    /// Complete frames wait in `read_buf`: handling stopped at the output bound; they are
    /// handled (before anything more is read) once the output has drained.
    frames_pending: bool,
    /// Requests polled inline in this poll of the connection: past [`INLINE_FIRST_POLLS`]
    /// the driver stops handling frames and yields (other connections on the worker run).
    inline_polls: usize,
    got_settings: bool,
    read_closed: bool,
    streams: HashMap<u32, Stream, StreamIds>,
    queue: VecDeque<u32>,
    blocked: Vec<u32>,
    last_stream: u32,
    recently_closed: VecDeque<u32>,
    /// The highest id ever put in `recently_closed`: a higher id cannot be in it, so the
    /// usual close (ids rising) skips the scan.
    recently_closed_max: u32,
    /// The clock reading of the batch of frames being handled (a read, or the frames left
    /// from one): the start of the requests it opens, for the cache's freshness and Age.
    batch_clock: Instant,
    /// Streams we sent RST_STREAM for (or ignored after GOAWAY), oldest first; bounded.
    locally_reset: VecDeque<u32>,
    locally_reset_set: std::collections::HashSet<u32>,
    cont: Option<(Continuation, Instant)>,

    peer_initial_window: i64,
    peer_max_frame: usize,
    conn_send_window: i64,
    conn_recv_window: i64,
    conn_release: usize,

    /// GOAWAY sent: no new streams; close when the streams are done.
    going_away: bool,
    /// The last-stream id of the first GOAWAY sent: a later one (a connection error after a
    /// graceful GOAWAY) repeats it, never a higher one (RFC 9113 §6.8).
    goaway_last: Option<u32>,
    /// A connection error: write the GOAWAY, then close.
    closing: Option<H2Error>,
    settings_sent_at: Instant,
    settings_acked: bool,
    /// Streams refused before the client acknowledged our SETTINGS, not counted as resets.
    early_refusals: u32,
    last_active: Instant,
    started: Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// When a closing connection gives up flushing.
    close_deadline: Option<Instant>,
    /// When the keep-alive PING went out (cleared by any frame read).
    ping_sent: Option<Instant>,
    /// The `date` value for the responses of one poll (read one clock per batch).
    date: Option<HeaderValue>,
    /// The config snapshot of the last request, reused while no reload happened
    /// (`Shared::snapshot_for`); dropped whenever the connection has no streams.
    snap: Option<(u64, Arc<crate::runtime::Snapshot>)>,
    flood: Flood,
}

impl<I: AsyncRead + AsyncWrite + Unpin> Driver<I> {
    fn new(
        io: I,
        shared: Arc<Shared>,
        conn: Arc<ConnInfo>,
        cfg: Settings,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Driver<I> {
        let now = Instant::now();
        let mut write_buf = BytesMut::with_capacity(4096);
        frame::put_settings(
            &mut write_buf,
            &[
                (setting::MAX_CONCURRENT_STREAMS, cfg.max_concurrent_streams),
                (setting::INITIAL_WINDOW_SIZE, cfg.stream_window),
                (setting::MAX_HEADER_LIST_SIZE, cfg.max_header_bytes),
                (setting::ENABLE_CONNECT_PROTOCOL, 1),
            ],
        );
        if cfg.conn_window > frame::DEFAULT_WINDOW {
            frame::put_window_update(&mut write_buf, 0, cfg.conn_window - frame::DEFAULT_WINDOW);
        }
        let first_deadline = now + cfg.header_read_timeout;
        Driver {
            io,
            shared,
            conn,
            stop: Box::pin(async move {
                let _ = stop.wait_for(|v| *v).await;
            }),
            stop_seen: false,
            signal: Arc::new(Signal::default()),
            ready: Vec::new(),
            read_buf: BytesMut::with_capacity(READ_CHUNK),
            write_buf,
            unflushed: false,
            data_out: false,
            data_progress: false,
            scratch: BytesMut::with_capacity(1024),
            decoder: Decoder::new(),
            encoder: Encoder::new(),
            preface_done: false,
            frames_pending: false,
            inline_polls: 0,
            got_settings: false,
            read_closed: false,
            streams: HashMap::default(),
            queue: VecDeque::new(),
            blocked: Vec::new(),
            last_stream: 0,
            recently_closed: VecDeque::new(),
            recently_closed_max: 0,
            batch_clock: Instant::now(),
            locally_reset: VecDeque::new(),
            locally_reset_set: Default::default(),
            cont: None,
            peer_initial_window: frame::DEFAULT_WINDOW as i64,
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE as usize,
            conn_send_window: frame::DEFAULT_WINDOW as i64,
            conn_recv_window: cfg.conn_window as i64,
            conn_release: 0,
            going_away: false,
            goaway_last: None,
            closing: None,
            settings_sent_at: now,
            settings_acked: false,
            early_refusals: 0,
            last_active: now,
            started: now,
            timer: Box::pin(tokio::time::sleep_until(first_deadline.into())),
            close_deadline: None,
            date: None,
            snap: None,
            ping_sent: None,
            flood: Flood {
                since: now,
                resets: 0,
                control: 0,
                empty: 0,
            },
            cfg,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), H2Error>> {
        self.date = None;
        self.inline_polls = 0;
        if !self.shared.is_current(&self.snap) {
            // A reload happened: hold no older config than the in-flight requests do.
            self.snap = None;
        }
        for _ in 0..ROUNDS {
            // Graceful close requested (listener drain, shutdown).
            if !self.stop_seen && self.stop.as_mut().poll(cx).is_ready() {
                self.stop_seen = true;
                self.go_away(Reason::NO_ERROR, b"");
            }
            // Streams that were woken.
            self.signal.take(&mut self.ready, cx.waker());
            let mut ready = std::mem::take(&mut self.ready);
            for id in ready.drain(..) {
                self.on_ready(id);
            }
            self.ready = ready;

            let mut progress = false;
            // Handle the frames left from the last read, or read and handle a batch of frames,
            // unless the output is not draining.
            if self.closing.is_none() && self.frames_pending && self.write_buf.len() < WRITE_HIGH {
                // Frames left from an earlier read may have waited for the output to drain:
                // their requests start now, not at that read.
                self.batch_clock = Instant::now();
                if let Err(f) = self.handle_frames() {
                    self.fault(f);
                }
                progress = true;
            } else if self.closing.is_none()
                && !self.read_closed
                && self.write_buf.len() < WRITE_HIGH
            {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(0)) => {
                        self.read_closed = true;
                        self.on_read_closed();
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        self.last_active = Instant::now();
                        self.batch_clock = self.last_active;
                        self.ping_sent = None;
                        if let Err(f) = self.handle_frames() {
                            self.fault(f);
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => {
                        self.read_closed = true;
                        self.on_read_closed();
                        if self.streams.is_empty() {
                            return Poll::Ready(Err(e.into()));
                        }
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }
            // Answer what is ready, then write once.
            if self.closing.is_none() {
                self.produce();
                self.release_windows();
            }
            match self.poll_write(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    self.abort_all();
                    return Poll::Ready(Err(e.into()));
                }
                Poll::Pending => {}
            }
            // Finished?
            let done = self.closing.is_some()
                || ((self.going_away || self.read_closed) && self.streams.is_empty());
            if done {
                // Only the final flush is left: bounded, whether or not the client reads (a
                // drained connection's GOAWAY to a client that does not read would wait forever).
                self.set_close_deadline();
            }
            if done && self.write_buf.is_empty() {
                let expired = self.close_deadline.is_some_and(|d| Instant::now() >= d);
                match Pin::new(&mut self.io).poll_shutdown(cx) {
                    Poll::Pending if !expired => {
                        let _ = self.poll_timer(cx);
                        return Poll::Pending;
                    }
                    _ => {
                        self.abort_all();
                        return Poll::Ready(match self.closing.take() {
                            Some(e) => Err(e),
                            None => Ok(()),
                        });
                    }
                }
            }
            if let Poll::Ready(()) = self.poll_timer(cx) {
                progress = true;
            }
            if self.frames_pending
                && self.inline_polls >= INLINE_FIRST_POLLS
                && self.closing.is_none()
                && self.write_buf.len() < WRITE_HIGH
            {
                // This poll's budget is spent: yield, and go on in the next poll.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let more_work = (!self.queue.is_empty() || self.frames_pending)
                && self.write_buf.len() < WRITE_HIGH;
            if !progress && !more_work {
                if self.streams.is_empty() {
                    // Idle: hold no config snapshot (a reload frees the old one).
                    self.snap = None;
                }
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    // ------------------------------------------------------------------ I/O

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        self.read_buf.reserve(READ_CHUNK);
        let fut = self.io.read_buf(&mut self.read_buf);
        let mut fut = std::pin::pin!(fut);
        fut.as_mut().poll(cx)
    }

    /// Writes the output buffer; Ready(Ok) when it is empty and flushed. The flush is
    /// retried until it completes, also in later polls with nothing new to write:
    /// tokio-rustls takes plaintext (`Ok(n)`) while the socket would block and sends the
    /// records only on a later write or flush, so the end of a response would otherwise wait
    /// for the connection's next output.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.write_buf.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, &self.write_buf) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    self.write_buf.advance(n);
                    self.unflushed = true;
                    self.data_progress |= self.data_out;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    if self.unflushed {
                        let _ = Pin::new(&mut self.io).poll_flush(cx)?;
                    }
                    return Poll::Pending;
                }
            }
        }
        self.data_out = false;
        if self.unflushed {
            std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Handles the deadlines that have passed, then re-arms the timer to the next one still in
    /// the future (a fired `Sleep` stays ready: returning without a reset would spin the task).
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let now = Instant::now();
        let fired = self.on_deadlines(now);
        let next = self.next_deadline(now);
        self.timer.as_mut().reset(next.into());
        // Registers the waker for the new deadline (it is in the future: pending).
        let _ = self.timer.as_mut().poll(cx);
        if fired {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Acts on every deadline at or before `now`; true when one did. Each action changes the
    /// state so that its deadline is no longer one of `next_deadline`'s.
    fn on_deadlines(&mut self, now: Instant) -> bool {
        if let Some(d) = self.close_deadline {
            if now >= d {
                // The client does not read: give up on the final flush.
                self.write_buf.clear();
                self.closing
                    .get_or_insert(H2Error::Protocol(Reason::NO_ERROR, "close timed out"));
                return true;
            }
        }
        if self.closing.is_some() {
            // Closing: only the close deadline counts.
            return false;
        }
        let hrt = self.cfg.header_read_timeout;
        if !self.got_settings && now >= self.started + hrt {
            self.shared.metrics.limit_hit("h2_preface_timeout");
            self.closing = Some(H2Error::Protocol(Reason::PROTOCOL_ERROR, "no preface"));
            self.set_close_deadline();
            return true;
        }
        if !self.settings_acked && now >= self.settings_ack_deadline() {
            self.fault(Fault::Conn(
                Reason::SETTINGS_TIMEOUT,
                "SETTINGS not acknowledged",
            ));
            return true;
        }
        if let Some((_, started)) = &self.cont {
            if now >= *started + hrt {
                self.shared.metrics.limit_hit("header_read_timeout");
                self.fault(Fault::Conn(Reason::PROTOCOL_ERROR, "header block timeout"));
                return true;
            }
        }
        if self.streams.is_empty() && self.got_settings {
            if !self.going_away && now >= self.last_active + self.cfg.idle_timeout {
                self.shared.metrics.limit_hit("idle_timeout");
                self.go_away(Reason::NO_ERROR, b"idle");
                self.set_close_deadline();
                return true;
            }
        } else if self.got_settings {
            // Streams are open but the client has been silent: is it still there? A PING,
            // and the connection ends when no frame comes within `header_read_timeout` (a response
            // waiting for flow-control window from a vanished client would wait forever).
            // A client reading our DATA is there, even if it sends nothing (large windows)
            // and our PING waits behind that DATA.
            if std::mem::take(&mut self.data_progress) {
                self.last_active = now;
                self.ping_sent = None;
                return false;
            }
            match self.ping_sent {
                None if now >= self.last_active + self.cfg.idle_timeout => {
                    frame::put_ping(&mut self.write_buf, *b"sweetyKA");
                    self.ping_sent = Some(now);
                    return true;
                }
                Some(at) if now >= at + hrt => {
                    self.shared.metrics.limit_hit("h2_keepalive_timeout");
                    self.fault(Fault::Conn(
                        Reason::NO_ERROR,
                        "keep-alive PING not answered",
                    ));
                    return true;
                }
                _ => {}
            }
        }
        false
    }

    /// The earliest deadline after `now` (at most one idle timeout away).
    fn next_deadline(&self, now: Instant) -> Instant {
        let hrt = self.cfg.header_read_timeout;
        let mut next = now + self.cfg.idle_timeout;
        let mut consider = |d: Instant| {
            if d > now && d < next {
                next = d;
            }
        };
        if let Some(d) = self.close_deadline {
            consider(d);
        }
        if self.closing.is_some() {
            return next;
        }
        if !self.got_settings {
            consider(self.started + hrt);
        }
        if !self.settings_acked {
            consider(self.settings_ack_deadline());
        }
        if let Some((_, started)) = &self.cont {
            consider(*started + hrt);
        }
        if self.streams.is_empty() && self.got_settings {
            if !self.going_away {
                consider(self.last_active + self.cfg.idle_timeout);
            }
        } else if self.got_settings {
            match self.ping_sent {
                None => consider(self.last_active + self.cfg.idle_timeout),
                Some(at) => consider(at + hrt),
            }
        }
        next
    }

    fn settings_ack_deadline(&self) -> Instant {
        self.settings_sent_at + self.cfg.header_read_timeout.max(Duration::from_secs(5))
    }

    /// Re-arms the timer when a deadline earlier than the current one appears. A timer that
    /// has already fired is left alone: `poll_timer` handles it and re-arms to the next
    /// deadline (every deadline is derived from the state, so none is lost).
    fn arm(&mut self, at: Instant) {
        let current = self.timer.deadline().into_std();
        if at < current && current > Instant::now() {
            self.timer.as_mut().reset(at.into());
        }
    }

    // ---------------------------------------------------------------- frames

    /// Handles the complete frames in the read buffer, until the output reaches
    /// [`WRITE_HIGH`] (what one read can make the connection queue is bounded: a read of
    /// 15-byte requests or PINGs would otherwise queue an answer to each); the rest wait
    /// (`frames_pending`) until the output has drained.
    fn handle_frames(&mut self) -> FResult {
        self.frames_pending = false;
        if !self.preface_done {
            let n = self.read_buf.len().min(frame::PREFACE.len());
            if self.read_buf[..n] != frame::PREFACE[..n] {
                self.closing = Some(H2Error::Protocol(Reason::PROTOCOL_ERROR, "bad preface"));
                return Ok(());
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            self.read_buf.advance(frame::PREFACE.len());
            self.preface_done = true;
        }
        while self.read_buf.len() >= HEADER_LEN && self.closing.is_none() {
            if self.write_buf.len() >= WRITE_HIGH || self.inline_polls >= INLINE_FIRST_POLLS {
                self.frames_pending = true;
                break;
            }
            let head = Head::parse(&self.read_buf);
            if head.len > LOCAL_MAX_FRAME {
                return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "frame too large"));
            }
            let total = HEADER_LEN + head.len as usize;
            if self.read_buf.len() < total {
                break;
            }
            if !self.got_settings {
                if head.kind != kind::SETTINGS || head.has(flag::ACK) {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "expected SETTINGS"));
                }
                self.got_settings = true;
                // From now on the idle timeout applies (the timer held the preface's deadline).
                self.arm(self.last_active + self.cfg.idle_timeout);
            }
            let r = if head.kind == kind::DATA {
                // DATA payloads go to request bodies as slices of the read buffer (no copy;
                // small ones are copied together there, see `body::COALESCE_BELOW`).
                let mut raw = self.read_buf.split_to(total);
                raw.advance(HEADER_LEN);
                if self.cont.is_some() {
                    Err(Fault::Conn(Reason::PROTOCOL_ERROR, "expected CONTINUATION"))
                } else {
                    self.on_data(head, raw.freeze())
                }
            } else {
                // Other frames are handled in place in the read buffer.
                let buf = std::mem::take(&mut self.read_buf);
                let r = self.frame(head, &buf[HEADER_LEN..total]);
                self.read_buf = buf;
                self.read_buf.advance(total);
                r
            };
            match r {
                Ok(()) => {}
                Err(Fault::Stream(id, reason)) => {
                    // Stream errors the client provokes count like its own resets.
                    self.reset_stream(id, reason, Charge::Client)?;
                }
                Err(f) => return Err(f),
            }
        }
        Ok(())
    }

    fn frame(&mut self, head: Head, payload: &[u8]) -> FResult {
        if let Some((c, _)) = &self.cont {
            if head.kind != kind::CONTINUATION || head.stream != c.stream {
                return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "expected CONTINUATION"));
            }
        }
        match head.kind {
            kind::HEADERS => self.on_headers(head, payload),
            kind::PRIORITY => {
                if head.stream == 0 {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                self.control_flood()?;
                if payload.len() != 5 {
                    return Err(Fault::Stream(head.stream, Reason::FRAME_SIZE_ERROR));
                }
                if frame::priority_dependency(payload) == head.stream {
                    return Err(Fault::Stream(head.stream, Reason::PROTOCOL_ERROR));
                }
                Ok(())
            }
            kind::RST_STREAM => self.on_rst(head, payload),
            kind::SETTINGS => self.on_settings(head, payload),
            kind::PUSH_PROMISE => Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "PUSH_PROMISE from a client",
            )),
            kind::PING => {
                if head.stream != 0 {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                if payload.len() != 8 {
                    return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "PING length"));
                }
                if !head.has(flag::ACK) {
                    self.control_flood()?;
                    frame::put_ping_ack(&mut self.write_buf, payload);
                }
                Ok(())
            }
            kind::GOAWAY => {
                if head.stream != 0 {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "GOAWAY length"));
                }
                // The client closes the connection when its streams are done (the idle
                // timeout bounds the wait); nothing to change here.
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                if code != 0 {
                    tracing::debug!(reason = %Reason(code), "client sent GOAWAY");
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => self.on_window_update(head, payload),
            kind::CONTINUATION => self.on_continuation(head, payload),
            // Unknown frame types are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }

    fn control_flood(&mut self) -> FResult {
        if self.flood.hit(|f| &mut f.control, MAX_CONTROL_PER_SEC) {
            self.shared.metrics.limit_hit("h2_control_flood");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "control frame flood",
            ));
        }
        Ok(())
    }

    fn empty_flood(&mut self) -> FResult {
        if self.flood.hit(|f| &mut f.empty, MAX_EMPTY_PER_SEC) {
            self.shared.metrics.limit_hit("h2_empty_frame_flood");
            return Err(Fault::Conn(Reason::ENHANCE_YOUR_CALM, "empty frame flood"));
        }
        Ok(())
    }

    fn reset_flood(&mut self) -> FResult {
        if self
            .flood
            .hit(|f| &mut f.resets, self.cfg.max_resets_per_sec)
        {
            self.shared.metrics.limit_hit("h2_rapid_reset");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "too many stream resets",
            ));
        }
        Ok(())
    }

    /// Largest encoded header block (HEADERS plus CONTINUATION) accepted: a block this large
    /// cannot decode within `max_header_bytes` by much, and past it the client is flooding.
    fn max_block(&self) -> usize {
        self.cfg.max_header_bytes as usize + 16 * 1024
    }

    fn is_idle(&self, id: u32) -> bool {
        id > self.last_stream
    }

    fn on_data(&mut self, head: Head, payload: Bytes) -> FResult {
        let id = head.stream;
        if id == 0 {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let len = payload.len();
        self.conn_recv_window -= len as i64;
        if self.conn_recv_window < 0 {
            return Err(Fault::Conn(
                Reason::FLOW_CONTROL_ERROR,
                "connection window exceeded",
            ));
        }
        let content = if head.has(flag::PADDED) {
            let Some(c) = frame::unpad(&payload) else {
                return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "bad padding"));
            };
            let start = 1;
            payload.slice(start..start + c.len())
        } else {
            payload
        };
        let end = head.has(flag::END_STREAM);
        if content.is_empty() && !end {
            self.empty_flood()?;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            self.conn_release += len;
            if self.locally_reset_set.contains(&id) {
                // Sent before the client saw our RST_STREAM: the window is credited back.
                return Ok(());
            }
            if self.is_idle(id) {
                return Err(Fault::Conn(
                    Reason::PROTOCOL_ERROR,
                    "DATA on an idle stream",
                ));
            }
            return Err(Fault::Stream(id, Reason::STREAM_CLOSED));
        };
        if !s.recv_open {
            self.conn_release += len;
            return Err(Fault::Stream(id, Reason::STREAM_CLOSED));
        }
        s.recv_window -= len as i64;
        if s.recv_window < 0 {
            // Counted against the connection window all the same (RFC 9113 §6.9): credited
            // back, as the stream is reset.
            self.conn_release += len;
            return Err(Fault::Stream(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.unreleased += len;
        // Padding is released at once (to the stream through `grant_stream`, queued below
        // when it is due: consumption alone may never queue a mostly padded upload).
        let padding = len - content.len();
        s.unreleased -= padding;
        self.conn_release += padding;
        s.grant += padding;
        let grant_due = padding > 0 && s.grant >= (self.cfg.stream_window as usize / 4).max(1);
        s.received += content.len() as u64;
        if s.content_length
            .is_some_and(|cl| s.received > cl || (end && s.received != cl))
        {
            // Not delivered: credited back, as the stream is reset.
            s.unreleased -= content.len();
            self.conn_release += content.len();
            return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
        }
        let n = content.len();
        let accepted = match &s.recv {
            Some(r) => r.push(content),
            None => false,
        };
        if !accepted {
            s.unreleased -= n;
            self.conn_release += n;
        }
        if end {
            s.recv_open = false;
            if let Some(r) = s.recv.take() {
                r.finish(None);
            }
            self.maybe_close(id);
        }
        if grant_due {
            self.enqueue(id);
        }
        Ok(())
    }

    fn on_headers(&mut self, head: Head, payload: &[u8]) -> FResult {
        let id = head.stream;
        if id == 0 {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut block = payload;
        if head.has(flag::PADDED) {
            block =
                frame::unpad(block).ok_or(Fault::Conn(Reason::PROTOCOL_ERROR, "bad padding"))?;
        }
        let mut bad_priority = false;
        if head.has(flag::PRIORITY) {
            if block.len() < 5 {
                return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "HEADERS priority"));
            }
            bad_priority = frame::priority_dependency(block) == id;
            block = &block[5..];
        }
        if block.len() > self.max_block() {
            self.shared.metrics.limit_hit("header_bytes");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        let end_stream = head.has(flag::END_STREAM);
        if head.has(flag::END_HEADERS) {
            return self.on_header_block(id, end_stream, bad_priority, block);
        }
        if block.is_empty() {
            self.empty_flood()?;
        }
        let c = Continuation {
            stream: id,
            end_stream,
            bad_priority,
            block: BytesMut::from(block),
        };
        let now = Instant::now();
        self.cont = Some((c, now));
        self.arm(now + self.cfg.header_read_timeout);
        Ok(())
    }

    fn on_continuation(&mut self, head: Head, payload: &[u8]) -> FResult {
        let max_block = self.max_block();
        let Some((c, _)) = self.cont.as_mut() else {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without HEADERS",
            ));
        };
        if c.block.len() + payload.len() > max_block {
            self.shared.metrics.limit_hit("header_bytes");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        c.block.extend_from_slice(payload);
        if !head.has(flag::END_HEADERS) {
            if payload.is_empty() {
                self.empty_flood()?;
            }
            return Ok(());
        }
        let (c, _) = self.cont.take().expect("checked above");
        self.on_header_block(c.stream, c.end_stream, c.bad_priority, &c.block)
    }

    fn decode(&mut self, block: &[u8], trailers: bool) -> Result<DecodedBlock, Fault> {
        let mut h = DecodedBlock::default();
        let max = self.cfg.max_header_bytes as usize;
        let r = self.decoder.decode(block, max, |f| h.field(f, trailers));
        match r {
            Ok(()) => Ok(h),
            Err(e) if !e.is_connection_error() => {
                // Too large a header list: the block was decoded (the table is in sync); only
                // this request is refused.
                h.too_large = true;
                Ok(h)
            }
            Err(e) => {
                tracing::debug!(error = %e, "HPACK decoding failed");
                Err(Fault::Conn(Reason::COMPRESSION_ERROR, "HPACK"))
            }
        }
    }

    fn on_header_block(
        &mut self,
        id: u32,
        end_stream: bool,
        bad_priority: bool,
        block: &[u8],
    ) -> FResult {
        if let Some(s) = self.streams.get(&id) {
            // Trailers (or a second HEADERS).
            let open = s.recv_open;
            let h = self.decode(block, true)?;
            if !open {
                return Err(Fault::Stream(id, Reason::STREAM_CLOSED));
            }
            if !end_stream || h.malformed.is_some() || h.too_large {
                return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
            }
            let s = self.streams.get_mut(&id).expect("present");
            if s.content_length.is_some_and(|cl| cl != s.received) {
                return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
            }
            s.recv_open = false;
            if let Some(r) = s.recv.take() {
                r.finish(Some(h.headers));
            }
            self.maybe_close(id);
            return Ok(());
        }
        if id.is_multiple_of(2) {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "even stream id"));
        }
        if id <= self.last_stream {
            let _ = self.decode(block, true)?;
            if self.locally_reset_set.contains(&id) {
                // Trailers of a stream we reset: decoded (the table stays in sync), dropped.
                return Ok(());
            }
            if self.recently_closed.contains(&id) {
                return Err(Fault::Conn(
                    Reason::STREAM_CLOSED,
                    "HEADERS on a closed stream",
                ));
            }
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "stream id went backwards",
            ));
        }
        self.last_stream = id;
        let h = self.decode(block, false)?;
        if self.going_away {
            // After our GOAWAY: not processed; the client may retry it elsewhere.
            if !end_stream {
                self.mark_reset(id);
            }
            return Ok(());
        }
        if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
            self.shared.metrics.limit_hit("h2_refused_stream");
            // Before it acknowledged our SETTINGS the client may not know the limit: its
            // opening burst is refused (RFC 9113 §5.1.2, §6.5.2) without counting, up to
            // EARLY_REFUSALS per connection.
            let early = !self.settings_acked && self.early_refusals < EARLY_REFUSALS;
            let charge = if early {
                self.early_refusals += 1;
                Charge::Server
            } else {
                Charge::Client
            };
            return self.reset_stream(id, Reason::REFUSED_STREAM, charge);
        }
        if h.too_large {
            // Answered, but counted like a reset: decoding an oversized block is the client's
            // cost to us, and looping them must not be free.
            self.shared.metrics.limit_hit("header_bytes");
            self.scratch.clear();
            self.encoder.begin_block(&mut self.scratch);
            Encoder::status(&mut self.scratch, 431);
            frame::put_headers(
                &mut self.write_buf,
                id,
                &self.scratch,
                true,
                self.peer_max_frame,
            );
            if !end_stream {
                // The request body is not wanted.
                return self.reset_stream(id, Reason::NO_ERROR, Charge::Client);
            }
            self.remember_closed(id);
            return self.reset_flood();
        }
        if bad_priority || h.malformed.is_some() {
            if let Some(why) = h.malformed {
                tracing::debug!(stream = id, why, "malformed HTTP/2 request");
            }
            return self.reset_stream(id, Reason::PROTOCOL_ERROR, Charge::Client);
        }
        self.start_stream(id, end_stream, h)
    }

    fn start_stream(&mut self, id: u32, end_stream: bool, h: DecodedBlock) -> FResult {
        let mut s = Stream::new(self.peer_initial_window, self.cfg.stream_window as i64);
        let request = match h.into_request() {
            // A tunnel whose client side ends at once cannot be one (the backend would be
            // dialed and switched for an empty, ended stream).
            Ok((_, true)) if end_stream => Err("extended CONNECT with END_STREAM"),
            r => r,
        }
        .map_err(|why| {
            tracing::debug!(stream = id, why, "malformed HTTP/2 request");
        });
        let Ok((req, tunnel)) = request else {
            return self.reset_stream(id, Reason::PROTOCOL_ERROR, Charge::Client);
        };
        let (mut parts, ()) = req.into_parts();
        s.content_length = h_content_length(&parts.headers)
            .map_err(|_| Fault::Stream(id, Reason::PROTOCOL_ERROR))?;
        if end_stream && s.content_length.is_some_and(|cl| cl != 0) {
            return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
        }
        s.is_head = parts.method == Method::HEAD;
        let body = if end_stream {
            s.recv_open = false;
            crate::body::empty()
        } else {
            let r = RecvShared::new(
                self.signal.clone(),
                id,
                (self.cfg.stream_window as usize / 4).max(1),
            );
            s.recv = Some(r.clone());
            let recv = RecvBody::new(r, s.content_length);
            if tunnel {
                let (up, out) = super::body::tunnel(recv);
                parts
                    .extensions
                    .insert(Upgrade(Arc::new(Mutex::new(Some(up)))));
                s.tunnel_body = Some(out);
                crate::body::empty()
            } else {
                crate::body::boxed(recv)
            }
        };
        let req = Request::from_parts(parts, body);
        let (shared, conn) = (self.shared.clone(), self.conn.clone());
        // The request's start: this batch's clock reading.
        let start = self.batch_clock;
        let snap = self.shared.snapshot_for(&mut self.snap);
        let fut = box_in_place(move || crate::pipeline::handle_h2(shared, conn, req, snap, start));
        self.streams.insert(id, s);
        // First poll inline: ready responses (cache hits, fixed replies, refusals) are
        // answered in this read's write without a task.
        self.inline_polls += 1;
        match crate::server::first_poll(fut) {
            FirstPoll::Ready((resp, stored)) => self.start_response(id, resp, stored),
            FirstPoll::Spawned(handle) => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.resp = Resp::Running(handle);
                }
                self.enqueue(id);
            }
            // Our fault, not the client's: not counted as a reset.
            FirstPoll::Panicked => {
                return self.reset_stream(id, Reason::INTERNAL_ERROR, Charge::Server)
            }
        }
        Ok(())
    }

    fn on_rst(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream == 0 {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on stream 0",
            ));
        }
        if payload.len() != 4 {
            return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "RST_STREAM length"));
        }
        if self.is_idle(head.stream) {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on an idle stream",
            ));
        }
        if let Some(s) = self.streams.get(&head.stream) {
            let unfinished = !matches!(s.resp, Resp::Done);
            self.drop_stream(head.stream, "stream reset by the client");
            if unfinished {
                self.reset_flood()?;
            }
        }
        Ok(())
    }

    fn on_settings(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream != 0 {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.has(flag::ACK) {
            if !payload.is_empty() {
                return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "SETTINGS ACK length"));
            }
            self.settings_acked = true;
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "SETTINGS length"));
        }
        self.control_flood()?;
        // INITIAL_WINDOW_SIZE changes every stream's window: only the frame's last value is
        // applied, once (a frame of 2,730 entries would otherwise walk the streams per entry).
        let mut initial_window = None;
        for (id, v) in frame::settings_params(payload) {
            match id {
                setting::ENABLE_PUSH | setting::ENABLE_CONNECT_PROTOCOL if v > 1 => {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "boolean setting"));
                }
                setting::INITIAL_WINDOW_SIZE => {
                    if v as i64 > MAX_WINDOW {
                        return Err(Fault::Conn(
                            Reason::FLOW_CONTROL_ERROR,
                            "INITIAL_WINDOW_SIZE",
                        ));
                    }
                    initial_window = Some(v as i64);
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE).contains(&v) {
                        return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "MAX_FRAME_SIZE"));
                    }
                    self.peer_max_frame = v as usize;
                }
                // The encoder never uses the dynamic table; the other settings do not
                // constrain a server.
                _ => {}
            }
        }
        if let Some(v) = initial_window {
            self.set_peer_initial_window(v)?;
        }
        frame::put_settings_ack(&mut self.write_buf);
        Ok(())
    }

    /// Applies the client's new INITIAL_WINDOW_SIZE to every stream's send window.
    fn set_peer_initial_window(&mut self, v: i64) -> FResult {
        let delta = v - self.peer_initial_window;
        self.peer_initial_window = v;
        if delta == 0 {
            return Ok(());
        }
        for s in self.streams.values_mut() {
            s.send_window += delta;
            if s.send_window > MAX_WINDOW {
                return Err(Fault::Conn(
                    Reason::FLOW_CONTROL_ERROR,
                    "stream window overflow",
                ));
            }
        }
        if delta > 0 {
            let ids: Vec<u32> = self.streams.keys().copied().collect();
            for id in ids {
                self.enqueue(id);
            }
        }
        Ok(())
    }

    fn on_window_update(&mut self, head: Head, payload: &[u8]) -> FResult {
        if payload.len() != 4 {
            return Err(Fault::Conn(
                Reason::FRAME_SIZE_ERROR,
                "WINDOW_UPDATE length",
            ));
        }
        let inc = (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
            & 0x7fff_ffff) as i64;
        if head.stream == 0 {
            if inc == 0 {
                return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "zero WINDOW_UPDATE"));
            }
            self.conn_send_window += inc;
            if self.conn_send_window > MAX_WINDOW {
                return Err(Fault::Conn(
                    Reason::FLOW_CONTROL_ERROR,
                    "connection window overflow",
                ));
            }
            for id in std::mem::take(&mut self.blocked) {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.blocked = false;
                }
                self.enqueue(id);
            }
            return Ok(());
        }
        if self.is_idle(head.stream) {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        let Some(s) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        if inc == 0 {
            return Err(Fault::Stream(head.stream, Reason::PROTOCOL_ERROR));
        }
        s.send_window += inc;
        if s.send_window > MAX_WINDOW {
            return Err(Fault::Stream(head.stream, Reason::FLOW_CONTROL_ERROR));
        }
        self.enqueue(head.stream);
        Ok(())
    }

    // --------------------------------------------------------------- streams

    fn enqueue(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            if !s.queued {
                s.queued = true;
                self.queue.push_back(id);
            }
        }
    }

    fn remember_closed(&mut self, id: u32) {
        if id <= self.recently_closed_max && self.recently_closed.contains(&id) {
            return;
        }
        self.recently_closed_max = self.recently_closed_max.max(id);
        if self.recently_closed.len() == RECENTLY_CLOSED {
            self.recently_closed.pop_front();
        }
        self.recently_closed.push_back(id);
    }

    /// Drops a removed stream's id from the `blocked` list.
    fn forget_blocked(&mut self, s: &Stream, id: u32) {
        if s.blocked {
            self.blocked.retain(|b| *b != id);
        }
    }

    /// Remembers a stream we reset, refused or ignored (bounded: the oldest is forgotten).
    fn mark_reset(&mut self, id: u32) {
        if !self.locally_reset_set.insert(id) {
            return;
        }
        if self.locally_reset.len() == LOCALLY_RESET {
            if let Some(old) = self.locally_reset.pop_front() {
                self.locally_reset_set.remove(&old);
            }
        }
        self.locally_reset.push_back(id);
    }

    /// Removes a stream: aborts its response, fails its request body, releases its window.
    fn drop_stream(&mut self, id: u32, why: &'static str) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        self.forget_blocked(&s, id);
        self.remember_closed(id);
        // The body's buffered bytes reach the connection window through `Signal::consumed`.
        if let Some(r) = &s.recv {
            r.fail(why);
            r.discard();
        }
        if let Resp::Running(h) = &s.resp {
            h.abort();
        }
    }

    /// Sends RST_STREAM for `id`, removes the stream if it was open, and remembers it as
    /// closed and as reset by us (its frames in flight are then ignored). A reset the client
    /// caused (refused or malformed stream, a frame it should not have sent) counts towards
    /// the rapid-reset limit: the error is the connection's end when it is over.
    fn reset_stream(&mut self, id: u32, reason: Reason, charge: Charge) -> FResult {
        frame::put_rst(&mut self.write_buf, id, reason);
        if reason != Reason::STREAM_CLOSED {
            // STREAM_CLOSED answers a frame on a stream both sides had closed: the next one is
            // answered the same way.
            self.mark_reset(id);
        }
        if self.streams.contains_key(&id) {
            self.drop_stream(id, "stream reset");
        } else {
            self.remember_closed(id);
        }
        match charge {
            Charge::Client => self.reset_flood(),
            Charge::Server => Ok(()),
        }
    }

    /// Removes a stream that is finished both ways. A response finished before the client
    /// finished its request gets RST_STREAM(NO_ERROR) (RFC 9113 §8.1).
    fn maybe_close(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if s.finished() {
            if let Some(s) = self.streams.remove(&id) {
                self.forget_blocked(&s, id);
                self.remember_closed(id);
            }
            if self.streams.is_empty() {
                // The idle timeout counts from the last stream's end (the timer may be set
                // later: the preface's deadline).
                self.last_active = Instant::now();
                self.arm(self.last_active + self.cfg.idle_timeout);
            }
        } else if matches!(s.resp, Resp::Done) && s.recv_open {
            let dropped = s.recv.as_ref().is_none_or(|r| r.dropped());
            if dropped {
                let _ = self.reset_stream(id, Reason::NO_ERROR, Charge::Server);
            }
        }
    }

    fn on_ready(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if let Some(r) = &s.recv {
            let consumed = r.take_consumed();
            // Stream window only: the connection's comes through `Signal::consumed`.
            let consumed = consumed.min(s.unreleased);
            s.unreleased -= consumed;
            if r.dropped() {
                // Nobody reads further data: stop granting (it is discarded on arrival).
                s.grant = 0;
                if matches!(s.resp, Resp::Done) {
                    self.maybe_close(id);
                    return;
                }
            } else {
                s.grant += consumed;
            }
        }
        self.enqueue(id);
    }

    fn release_windows(&mut self) {
        let half_conn = (self.cfg.conn_window / 2) as i64;
        // The flag first, then the count: a body consuming after the take sees the flag.
        self.signal.set_conn_low(self.conn_recv_window < half_conn);
        self.conn_release += self.signal.take_consumed();
        if self.conn_release > 0 && self.conn_recv_window < half_conn {
            let n = std::mem::take(&mut self.conn_release);
            self.conn_recv_window += n as i64;
            frame::put_window_update(&mut self.write_buf, 0, n as u32);
            self.signal.set_conn_low(self.conn_recv_window < half_conn);
        }
    }

    fn grant_stream(&mut self, id: u32) {
        let half = (self.cfg.stream_window as usize / 4).max(1);
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.recv_open && s.grant >= half {
            let n = std::mem::take(&mut s.grant);
            s.recv_window += n as i64;
            frame::put_window_update(&mut self.write_buf, id, n as u32);
        }
    }

    /// Encodes a response head and starts sending it. `stored`: a cache hit's stored head,
    /// sent ahead of the fields of `resp`'s map (its fields are never connection-specific).
    fn start_response(&mut self, id: u32, resp: Response<Body>, stored: Option<StoredHead>) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let (mut parts, body) = resp.into_parts();
        crate::conn_headers::strip(&mut parts.headers, crate::conn_headers::Te::Remove);
        let stored_has = |name: &HeaderName| stored.as_ref().is_some_and(|h| h.contains(name));
        if !parts.headers.contains_key(header::DATE) && !stored_has(&header::DATE) {
            let date = self.date.get_or_insert_with(super::date::now).clone();
            parts.headers.insert(header::DATE, date);
        }
        let mut body = body;
        // 204 and 304 never have a body (nor a length); HEAD gets the length a GET would get,
        // without the body (RFC 9110 §9.3.2, §15.3.5, §15.4.5).
        let no_body = matches!(
            parts.status,
            http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
        );
        if let Some(t) = s.tunnel_body.take() {
            if parts.status.is_success() {
                parts.headers.remove(header::CONTENT_LENGTH);
                body = t;
            }
        } else if !no_body && !body.is_end_stream() {
            if let Some(n) = body.size_hint().exact() {
                if !parts.headers.contains_key(header::CONTENT_LENGTH)
                    && !stored_has(&header::CONTENT_LENGTH)
                {
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
                }
            }
        }
        if s.is_head || no_body {
            body = crate::body::empty();
        }
        let end = body.is_end_stream();
        self.scratch.clear();
        self.encoder.begin_block(&mut self.scratch);
        Encoder::status(&mut self.scratch, parts.status.as_u16());
        super::encode_fields(
            &mut self.scratch,
            &parts.headers,
            &parts.extensions,
            stored.as_ref(),
        );
        frame::put_headers(
            &mut self.write_buf,
            id,
            &self.scratch,
            end,
            self.peer_max_frame,
        );
        if end {
            s.resp = Resp::Done;
            drop(body);
            self.maybe_close(id);
        } else {
            s.resp = Resp::Body(body);
            // Send what the body has now, in this batch.
            self.enqueue(id);
        }
    }

    fn stream_waker(&mut self, id: u32) -> Waker {
        let signal = self.signal.clone();
        let s = self.streams.get_mut(&id).expect("stream present");
        s.waker
            .get_or_insert_with(|| Waker::from(Arc::new(StreamWaker { signal, id })))
            .clone()
    }

    /// Sends what the queued streams have, fairly, until the output buffer is full.
    fn produce(&mut self) {
        // Bounded: a body yielding empty chunks forever cannot spin the task.
        let mut steps = 0usize;
        while self.write_buf.len() < WRITE_HIGH && steps < 10_000 {
            steps += 1;
            let Some(id) = self.queue.pop_front() else {
                break;
            };
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            s.queued = false;
            self.grant_stream(id);
            if self.step(id) {
                // A stream in the middle of a body chunk goes on first: its chunk is freed
                // before other streams' bodies are read (round-robin per write would hold one
                // chunk per stream at once: 1,000 streams x 128 KiB).
                let mid_chunk = self.streams.get(&id).is_some_and(|s| !s.pending.is_empty());
                if let Some(s) = self.streams.get_mut(&id) {
                    s.queued = true;
                    if mid_chunk {
                        self.queue.push_front(id);
                    } else {
                        self.queue.push_back(id);
                    }
                }
            }
        }
    }

    /// Advances one stream's response; true when it can do more right away.
    fn step(&mut self, id: u32) -> bool {
        // A response still being produced.
        if matches!(
            self.streams.get(&id).map(|s| &s.resp),
            Some(Resp::Running(_))
        ) {
            let waker = self.stream_waker(id);
            let s = self.streams.get_mut(&id).expect("present");
            let Resp::Running(h) = &mut s.resp else {
                unreachable!()
            };
            let mut cx = Context::from_waker(&waker);
            match Pin::new(h).poll(&mut cx) {
                Poll::Pending => return false,
                Poll::Ready(Ok((resp, stored))) => self.start_response(id, resp, stored),
                Poll::Ready(Err(e)) => {
                    tracing::error!(error = %e, "a request task failed");
                    let _ = self.reset_stream(id, Reason::INTERNAL_ERROR, Charge::Server);
                    return false;
                }
            }
            return false;
        }
        for _ in 0..FRAMES_PER_TURN {
            let Some(s) = self.streams.get_mut(&id) else {
                return false;
            };
            let Resp::Body(body) = &mut s.resp else {
                return false;
            };
            if s.pending.is_empty() && !s.body_done {
                // Noop waker first (a ready body needs none), the stream's waker if pending.
                let mut polled =
                    Pin::new(&mut *body).poll_frame(&mut Context::from_waker(Waker::noop()));
                if polled.is_pending() {
                    let waker = self.stream_waker(id);
                    let s = self.streams.get_mut(&id).expect("present");
                    let Resp::Body(body) = &mut s.resp else {
                        unreachable!()
                    };
                    polled = Pin::new(&mut *body).poll_frame(&mut Context::from_waker(&waker));
                }
                let s = self.streams.get_mut(&id).expect("present");
                let Resp::Body(body) = &mut s.resp else {
                    unreachable!()
                };
                match polled {
                    Poll::Pending => return false,
                    Poll::Ready(None) => s.body_done = true,
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(error = %e, stream = id, "response body failed");
                        let _ = self.reset_stream(id, Reason::INTERNAL_ERROR, Charge::Server);
                        return false;
                    }
                    Poll::Ready(Some(Ok(f))) => match f.into_data() {
                        Ok(d) => {
                            s.pending = d;
                            if body.is_end_stream() {
                                s.body_done = true;
                            }
                        }
                        Err(f) => {
                            if let Ok(t) = f.into_trailers() {
                                s.trailers = Some(Box::new(t));
                            }
                            s.body_done = true;
                        }
                    },
                }
            }
            let s = self.streams.get_mut(&id).expect("present");
            if !s.pending.is_empty() {
                let avail = s.send_window.min(self.conn_send_window);
                if avail <= 0 {
                    if !s.blocked {
                        s.blocked = true;
                        self.blocked.push(id);
                    }
                    return false;
                }
                let n = s
                    .pending
                    .len()
                    .min(avail as usize)
                    .min(self.peer_max_frame.min(MAX_DATA_FRAME));
                let chunk = s.pending.split_to(n);
                s.send_window -= n as i64;
                self.conn_send_window -= n as i64;
                let end = s.pending.is_empty() && s.body_done && s.trailers.is_none();
                frame::put_data(&mut self.write_buf, id, &chunk, end);
                self.data_out = true;
                if end {
                    s.resp = Resp::Done;
                    self.maybe_close(id);
                    return false;
                }
                if self.write_buf.len() >= WRITE_HIGH {
                    return true;
                }
                continue;
            }
            if s.body_done {
                match s.trailers.take() {
                    Some(t) => {
                        self.scratch.clear();
                        self.encoder.begin_block(&mut self.scratch);
                        for (name, value) in t.iter() {
                            super::encode_field(&mut self.scratch, name, value);
                        }
                        frame::put_headers(
                            &mut self.write_buf,
                            id,
                            &self.scratch,
                            true,
                            self.peer_max_frame,
                        );
                    }
                    None => frame::put_data(&mut self.write_buf, id, &[], true),
                }
                s.resp = Resp::Done;
                self.maybe_close(id);
                return false;
            }
        }
        true
    }

    fn on_read_closed(&mut self) {
        for s in self.streams.values_mut() {
            if let Some(r) = s.recv.take() {
                r.fail("connection closed");
            }
            s.recv_open = false;
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.maybe_close(id);
        }
    }

    /// Sends GOAWAY: no new streams; the connection closes when the open ones are done.
    fn go_away(&mut self, reason: Reason, debug: &[u8]) {
        if !self.going_away {
            self.going_away = true;
            let last = *self.goaway_last.get_or_insert(self.last_stream);
            frame::put_goaway(&mut self.write_buf, last, reason, debug);
        }
    }

    fn fault(&mut self, f: Fault) {
        match f {
            Fault::Stream(id, reason) => {
                if let Err(f) = self.reset_stream(id, reason, Charge::Client) {
                    self.fault(f);
                }
            }
            Fault::Conn(reason, why) => {
                if self.closing.is_some() {
                    // Already closing: one GOAWAY, one error.
                    return;
                }
                tracing::debug!(%reason, why, peer = %self.conn.peer, "HTTP/2 connection error");
                self.shared.metrics.edge_events.inc(&"h2_connection_error");
                // A second GOAWAY after a graceful one carries the error, with the first's id.
                self.going_away = false;
                self.go_away(reason, why.as_bytes());
                self.closing = Some(H2Error::Protocol(reason, why));
                self.abort_all();
                self.set_close_deadline();
            }
        }
    }

    fn set_close_deadline(&mut self) {
        if self.close_deadline.is_none() {
            let d = Instant::now() + self.cfg.header_read_timeout;
            self.close_deadline = Some(d);
            self.arm(d);
        }
    }

    fn abort_all(&mut self) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.drop_stream(id, "connection closed");
        }
    }
}

impl<I> Drop for Driver<I> {
    fn drop(&mut self) {
        for s in self.streams.values() {
            if let Some(r) = &s.recv {
                r.fail("connection closed");
            }
            if let Resp::Running(h) = &s.resp {
                h.abort();
            }
        }
    }
}

/// Boxes the value `make` returns, allocating first so that the optimizer can build it in
/// its heap slot (the request future is a few KiB; built on the stack, it is copied).
fn box_in_place<F>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::<F>::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}

/// The request's `content-length`: none, one value, or an error (invalid or conflicting).
/// A value is 1*DIGIT (RFC 9110 §8.6): no sign, no spaces, at most 19 digits (as h2's server).
fn h_content_length(h: &HeaderMap) -> Result<Option<u64>, ()> {
    let mut out = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let b = v.as_bytes();
        if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n: u64 = v.to_str().map_err(|_| ())?.parse().map_err(|_| ())?;
        if out.is_some_and(|o| o != n) {
            return Err(());
        }
        out = Some(n);
    }
    Ok(out)
}

/// A decoded request (or trailer) header block, validated field by field (RFC 9113 §8.2,
/// §8.3).
#[derive(Default)]
struct DecodedBlock {
    method: Option<Method>,
    scheme: Option<http::uri::Scheme>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
    protocol: Option<Bytes>,
    headers: HeaderMap,
    regular_seen: bool,
    malformed: Option<&'static str>,
    /// Past `max_header_bytes` (answered with 431).
    too_large: bool,
}

impl DecodedBlock {
    fn field(&mut self, f: Field<'_>, trailers: bool) {
        if self.malformed.is_some() {
            return;
        }
        if let Err(why) = self.try_field(f, trailers) {
            self.malformed = Some(why);
        }
    }

    fn try_field(&mut self, f: Field<'_>, trailers: bool) -> Result<(), &'static str> {
        if let Some(pseudo) = f.name.strip_prefix(b":") {
            if trailers {
                return Err("pseudo-header in trailers");
            }
            if self.regular_seen {
                return Err("pseudo-header after a regular header");
            }
            let slot = match pseudo {
                b"method" => {
                    if self.method.is_some() {
                        return Err("duplicate :method");
                    }
                    self.method = Some(Method::from_bytes(f.value).map_err(|_| "invalid :method")?);
                    return Ok(());
                }
                b"scheme" => {
                    if self.scheme.is_some() {
                        return Err("duplicate :scheme");
                    }
                    self.scheme =
                        Some(http::uri::Scheme::try_from(f.value).map_err(|_| "invalid :scheme")?);
                    return Ok(());
                }
                b"authority" => &mut self.authority,
                b"path" => &mut self.path,
                b"protocol" => &mut self.protocol,
                _ => return Err("unknown pseudo-header"),
            };
            if slot.is_some() {
                return Err("duplicate pseudo-header");
            }
            *slot = Some(Bytes::copy_from_slice(f.value));
            return Ok(());
        }
        self.regular_seen = true;
        if f.name.iter().any(|b| b.is_ascii_uppercase()) {
            return Err("upper-case header name");
        }
        let name = HeaderName::from_bytes(f.name).map_err(|_| "invalid header name")?;
        if crate::conn_headers::is_connection_specific(name.as_str(), f.value) {
            return Err("connection-specific header");
        }
        let mut value = HeaderValue::from_bytes(f.value).map_err(|_| "invalid header value")?;
        if f.sensitive {
            value.set_sensitive(true);
        }
        self.headers.append(name, value);
        Ok(())
    }

    /// The request (body to be set) and whether it is an extended CONNECT (a tunnel).
    fn into_request(self) -> Result<(Request<()>, bool), &'static str> {
        let DecodedBlock {
            method,
            scheme,
            authority,
            path,
            protocol,
            headers,
            ..
        } = self;
        let method = method.ok_or("missing :method")?;
        let mut tunnel = false;
        let uri = if method == Method::CONNECT {
            match &protocol {
                None => {
                    if scheme.is_some() || path.is_some() {
                        return Err("CONNECT with :scheme or :path");
                    }
                    let a = authority.ok_or("CONNECT without :authority")?;
                    Uri::from_maybe_shared(a).map_err(|_| "invalid :authority")?
                }
                Some(_) => {
                    // RFC 8441 §4: :scheme and :path are required.
                    if scheme.is_none() {
                        return Err("extended CONNECT without :scheme");
                    }
                    tunnel = true;
                    build_uri(scheme, authority, path)?
                }
            }
        } else {
            if protocol.is_some() {
                return Err(":protocol without CONNECT");
            }
            if scheme.is_none() {
                return Err("missing :scheme");
            }
            build_uri(scheme, authority, path)?
        };
        // A `host` differing from `:authority` is kept (RFC 9113 §8.3.1 makes refusing it a
        // SHOULD; hyper's server accepted it): routing uses `:authority` first, like hyper's
        // request URI did.
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_2;
        *req.headers_mut() = headers;
        if let Some(p) = &protocol {
            let p = std::str::from_utf8(p).map_err(|_| "invalid :protocol")?;
            req.extensions_mut().insert(hyper::ext::Protocol::from(p));
        }
        Ok((req, tunnel))
    }
}

fn build_uri(
    scheme: Option<http::uri::Scheme>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
) -> Result<Uri, &'static str> {
    let path = path.ok_or("missing :path")?;
    if path.is_empty() {
        return Err("empty :path");
    }
    let mut parts = http::uri::Parts::default();
    if let (Some(s), Some(a)) = (scheme, authority) {
        parts.scheme = Some(s);
        parts.authority =
            Some(http::uri::Authority::from_maybe_shared(a).map_err(|_| "invalid :authority")?);
    }
    parts.path_and_query = Some(if path[..] == b"*"[..] {
        http::uri::PathAndQuery::from_static("*")
    } else {
        http::uri::PathAndQuery::from_maybe_shared(path).map_err(|_| "invalid :path")?
    });
    Uri::from_parts(parts).map_err(|_| "invalid request target")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<'a>(name: &'a str, value: &'a str) -> Field<'a> {
        Field {
            name: name.as_bytes(),
            value: value.as_bytes(),
            sensitive: false,
        }
    }

    fn head(fields: &[(&str, &str)], trailers: bool) -> DecodedBlock {
        let mut h = DecodedBlock::default();
        for (n, v) in fields {
            h.field(field(n, v), trailers);
        }
        h
    }

    #[test]
    fn requests_are_built_from_pseudo_headers() {
        let h = head(
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", "a.test:8443"),
                (":path", "/x?y=1"),
                ("accept", "*/*"),
            ],
            false,
        );
        assert!(h.malformed.is_none());
        let (r, tunnel) = h.into_request().unwrap();
        assert!(!tunnel);
        assert_eq!(r.uri(), "https://a.test:8443/x?y=1");
        assert_eq!(r.version(), Version::HTTP_2);
        assert_eq!(r.headers()["accept"], "*/*");
    }

    #[test]
    fn malformed_requests_are_refused() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(":method", "GET"), (":path", "/")], "missing :scheme"),
            (
                &[(":method", "GET"), (":scheme", "http"), (":path", "")],
                "empty :path",
            ),
            (&[(":scheme", "http"), (":path", "/")], "missing :method"),
            (
                &[(":method", "GET"), (":method", "GET")],
                "duplicate :method",
            ),
            (&[("a", "b"), (":method", "GET")], "pseudo after regular"),
            (&[(":status", "200")], "response pseudo-header"),
            (&[("Accept", "x")], "upper-case"),
            (&[("connection", "close")], "connection-specific"),
            (&[("te", "gzip")], "te"),
            (&[("x", "a\nb")], "newline in a value"),
            (
                &[
                    (":method", "CONNECT"),
                    (":authority", "a:1"),
                    (":path", "/"),
                ],
                "CONNECT with :path",
            ),
            (
                &[
                    (":method", "CONNECT"),
                    (":protocol", "websocket"),
                    (":authority", "a:1"),
                    (":path", "/chat"),
                ],
                "extended CONNECT without :scheme",
            ),
        ];
        for (fields, what) in cases {
            let h = head(fields, false);
            let bad = h.malformed.is_some() || h.into_request().is_err();
            assert!(bad, "{what} must be refused");
        }
        assert!(
            head(&[(":path", "/")], true).malformed.is_some(),
            "pseudo in trailers"
        );
        assert!(head(&[("te", "trailers")], false).malformed.is_none());
    }

    #[test]
    fn extended_connect_is_a_tunnel_with_its_protocol() {
        let h = head(
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "http"),
                (":authority", "a.test"),
                (":path", "/chat"),
            ],
            false,
        );
        let (r, tunnel) = h.into_request().unwrap();
        assert!(tunnel);
        assert_eq!(
            r.extensions()
                .get::<hyper::ext::Protocol>()
                .unwrap()
                .as_str(),
            "websocket"
        );
        assert!(
            crate::websocket::upgrade_request(&r)
                == Some(crate::websocket::UpgradeRequest::ExtendedConnect)
        );
    }

    #[test]
    fn content_length_must_be_one_valid_number() {
        let mut h = HeaderMap::new();
        assert_eq!(h_content_length(&h), Ok(None));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert_eq!(h_content_length(&h), Ok(Some(5)));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("6"));
        assert!(h_content_length(&h).is_err());
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("-1"));
        assert!(h_content_length(&h).is_err());
        for v in ["+5", " 5", "5 ", "05x", "", "12345678901234567890"] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
            assert!(h_content_length(&h).is_err(), "{v:?} accepted");
        }
    }

    /// A driver over an in-memory pipe, with the default runtime (no listeners: every request
    /// gets the pipeline's 404 text reply), and the client end.
    async fn pipe_driver() -> (tokio::io::DuplexStream, crate::runtime::Runtime) {
        pipe_driver_sized(1 << 20).await
    }

    async fn pipe_driver_sized(pipe: usize) -> (tokio::io::DuplexStream, crate::runtime::Runtime) {
        pipe_driver_with(pipe, |_| {}).await
    }

    async fn pipe_driver_with(
        pipe: usize,
        edit: impl FnOnce(&mut Settings),
    ) -> (tokio::io::DuplexStream, crate::runtime::Runtime) {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let (client, server) = tokio::io::duplex(pipe);
        let conn = Arc::new(ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: false,
            sni: None,
        });
        let (_tx, stop) = tokio::sync::watch::channel(false);
        let mut settings = Settings::from_limits(&sweety_config::Limits::default());
        edit(&mut settings);
        let shared = rt.shared.clone();
        tokio::spawn(async move {
            let _tx = _tx;
            let _ = serve(server, shared, conn, settings, stop).await;
        });
        (client, rt)
    }

    async fn read_frame(
        c: &mut tokio::io::DuplexStream,
        buf: &mut BytesMut,
    ) -> Option<(Head, Bytes)> {
        loop {
            if buf.len() >= HEADER_LEN {
                let h = Head::parse(buf);
                if buf.len() >= HEADER_LEN + h.len as usize {
                    let mut f = buf.split_to(HEADER_LEN + h.len as usize);
                    f.advance(HEADER_LEN);
                    return Some((h, f.freeze()));
                }
            }
            let read = tokio::time::timeout(Duration::from_secs(10), c.read_buf(buf));
            if read.await.expect("a frame in time").ok()? == 0 {
                return None;
            }
        }
    }

    fn request(id: u32, end_stream: bool) -> BytesMut {
        let mut block = BytesMut::new();
        for (n, v) in [(":method", "GET"), (":scheme", "http"), (":path", "/")] {
            Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
        }
        let mut out = BytesMut::new();
        frame::put_headers(&mut out, id, &block, end_stream, 16_384);
        out
    }

    #[tokio::test]
    async fn response_data_follows_the_peers_stream_window() {
        use tokio::io::AsyncWriteExt;
        let (mut c, _rt) = pipe_driver().await;
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        // A 5-byte initial stream window.
        frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 5)]);
        out.extend_from_slice(&request(1, true));
        c.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut granted = 5;
        loop {
            let (h, p) = read_frame(&mut c, &mut buf).await.expect("frames");
            if h.kind != kind::DATA {
                continue;
            }
            assert!(
                p.len() <= 5,
                "a DATA frame within the 5-byte window: {}",
                p.len()
            );
            data.extend_from_slice(&p);
            assert!(
                data.len() <= granted,
                "{} bytes sent with a window of {granted}",
                data.len()
            );
            if h.has(flag::END_STREAM) {
                break;
            }
            if data.len() == granted {
                // Exhausted: nothing more until the window grows.
                let mut wu = BytesMut::new();
                frame::put_window_update(&mut wu, 1, 5);
                c.write_all(&wu).await.unwrap();
                granted += 5;
            }
        }
        assert!(String::from_utf8_lossy(&data).starts_with("404 Not Found"));
    }

    #[tokio::test]
    async fn frames_on_closed_or_even_streams_get_the_right_errors() {
        use tokio::io::AsyncWriteExt;
        let (mut c, _rt) = pipe_driver().await;
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut out, &[]);
        out.extend_from_slice(&request(1, true));
        c.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        loop {
            let (h, _) = read_frame(&mut c, &mut buf).await.unwrap();
            if h.kind == kind::DATA && h.has(flag::END_STREAM) {
                break;
            }
        }
        // DATA on the finished stream: a stream error.
        let mut out = BytesMut::new();
        frame::put_data(&mut out, 1, b"x", false);
        c.write_all(&out).await.unwrap();
        let (h, p) = loop {
            let f = read_frame(&mut c, &mut buf).await.unwrap();
            if f.0.kind == kind::RST_STREAM {
                break f;
            }
        };
        assert_eq!(
            (h.stream, &p[..]),
            (1, &Reason::STREAM_CLOSED.0.to_be_bytes()[..])
        );
        // A request on an even stream id: a connection error.
        c.write_all(&request(2, true)).await.unwrap();
        let (_, p) = loop {
            let f = read_frame(&mut c, &mut buf).await.unwrap();
            if f.0.kind == kind::GOAWAY {
                break f;
            }
        };
        assert_eq!(&p[4..8], &Reason::PROTOCOL_ERROR.0.to_be_bytes());
        assert_eq!(&p[..4], &1u32.to_be_bytes(), "last stream processed");
        assert!(read_frame(&mut c, &mut buf).await.is_none(), "then closed");
    }

    #[tokio::test]
    async fn frames_after_our_reset_are_ignored_and_their_window_credited() {
        use tokio::io::AsyncWriteExt;
        // Few resets allowed: answering each DATA frame with a reset would end the connection.
        let (mut c, _rt) = pipe_driver_with(4 << 20, |s| s.max_resets_per_sec = 4).await;
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut out, &[]);
        // An upload: the 404 is answered early and the body is not wanted.
        out.extend_from_slice(&request(1, false));
        c.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        loop {
            let (h, p) = read_frame(&mut c, &mut buf).await.expect("frames");
            if h.kind == kind::RST_STREAM {
                assert_eq!(
                    (h.stream, &p[..]),
                    (1, &Reason::NO_ERROR.0.to_be_bytes()[..])
                );
                break;
            }
        }
        // What the client had sent before it saw the reset: the whole connection window of
        // DATA, trailers, a WINDOW_UPDATE and its own RST_STREAM.
        let mut out = BytesMut::new();
        let chunk = vec![b'x'; 16_384];
        for _ in 0..64 {
            frame::put_data(&mut out, 1, &chunk, false);
        }
        let mut block = BytesMut::new();
        Encoder::field(&mut block, b"x-trailer", b"1", false);
        frame::put_headers(&mut out, 1, &block, true, 16_384);
        frame::put_window_update(&mut out, 1, 100);
        frame::put_rst(&mut out, 1, Reason::CANCEL);
        frame::put_ping(&mut out, *b"12345678");
        c.write_all(&out).await.unwrap();
        let mut credit = 0u64;
        loop {
            let (h, p) = read_frame(&mut c, &mut buf).await.expect("no close");
            assert_ne!(h.kind, kind::RST_STREAM, "no reset for the ignored frames");
            assert_ne!(h.kind, kind::GOAWAY, "the connection stays up");
            if h.kind == kind::WINDOW_UPDATE && h.stream == 0 {
                credit += u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as u64;
            }
            if h.kind == kind::PING && h.has(flag::ACK) {
                break;
            }
        }
        assert!(
            credit >= 512 * 1024,
            "the ignored DATA is credited back: {credit}"
        );
        // And the connection still serves requests.
        c.write_all(&request(3, true)).await.unwrap();
        loop {
            let (h, _) = read_frame(&mut c, &mut buf).await.expect("a response");
            if h.kind == kind::HEADERS {
                assert_eq!(h.stream, 3);
                break;
            }
        }
    }

    #[tokio::test]
    async fn an_error_after_a_graceful_goaway_keeps_its_last_stream_id() {
        use tokio::io::AsyncWriteExt;
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let (mut c, server) = tokio::io::duplex(1 << 20);
        let conn = Arc::new(ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: false,
            sni: None,
        });
        let (tx, stop) = tokio::sync::watch::channel(false);
        let settings = Settings::from_limits(&sweety_config::Limits::default());
        let shared = rt.shared.clone();
        tokio::spawn(async move {
            let _ = serve(server, shared, conn, settings, stop).await;
        });
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        // No stream window: stream 1's response waits, so the connection stays up.
        frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
        out.extend_from_slice(&request(1, true));
        c.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        loop {
            let (h, _) = read_frame(&mut c, &mut buf).await.expect("frames");
            if h.kind == kind::HEADERS && h.stream == 1 {
                break;
            }
        }
        // Drain: a graceful GOAWAY naming stream 1.
        tx.send(true).unwrap();
        let (_, p) = loop {
            let f = read_frame(&mut c, &mut buf).await.expect("GOAWAY");
            if f.0.kind == kind::GOAWAY {
                break f;
            }
        };
        assert_eq!(&p[..8], &[0, 0, 0, 1, 0, 0, 0, 0]);
        // A stream the client opened before it saw that (ignored), then a connection error.
        let mut out = request(3, true);
        out.extend_from_slice(&request(4, true));
        c.write_all(&out).await.unwrap();
        let (_, p) = loop {
            let f = read_frame(&mut c, &mut buf).await.expect("a second GOAWAY");
            if f.0.kind == kind::GOAWAY {
                break f;
            }
        };
        assert_eq!(&p[4..8], &Reason::PROTOCOL_ERROR.0.to_be_bytes());
        assert_eq!(
            &p[..4],
            &1u32.to_be_bytes(),
            "the last-stream id does not grow"
        );
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_is_not_read_either() {
        use tokio::io::AsyncWrite;
        const PIPE: usize = 16 * 1024;
        // As many concurrent streams as the client wants: only the output bound stops it.
        let (mut c, _rt) = pipe_driver_with(PIPE, |s| s.max_concurrent_streams = 1 << 20).await;
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut out, &[]);
        // 20,000 requests (each answered with ~100 bytes), never reading the answers.
        for i in 0..20_000u32 {
            out.extend_from_slice(&request(1 + 2 * i, true));
        }
        let total = out.len();
        let mut written = 0;
        let mut stalled = 0;
        // Write without blocking; let the server run between attempts; stop once the
        // server has stopped taking bytes for many of its turns.
        while written < total && stalled < 200 {
            let mut cx = Context::from_waker(Waker::noop());
            match Pin::new(&mut c).poll_write(&mut cx, &out[written..]) {
                Poll::Ready(Ok(n)) => {
                    written += n;
                    stalled = 0;
                }
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => stalled += 1,
            }
            tokio::task::yield_now().await;
        }
        assert!(
            written < total,
            "the server kept reading a client that does not read"
        );
        // What it took in is bounded by its output buffer, not by what the client sent.
        let bound = PIPE + WRITE_HIGH + 2 * READ_CHUNK + 64 * 1024;
        assert!(written < bound, "read {written} bytes of requests");
    }

    /// A client's opening: the preface, an empty SETTINGS and the ACK of ours.
    fn hello() -> BytesMut {
        let mut input = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut input, &[]);
        frame::put_settings_ack(&mut input);
        input
    }

    /// A driver polled by hand over a pipe that holds one byte (the client never reads, so
    /// what the driver writes stays in its buffer), fed `input`, and the client end.
    async fn hand_driver(
        rt: &crate::runtime::Runtime,
        edit: impl FnOnce(&mut Settings),
        input: &[u8],
    ) -> (Driver<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (mut c, server) = tokio::io::duplex(1);
        let conn = Arc::new(ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: false,
            sni: None,
        });
        let (tx, stop) = tokio::sync::watch::channel(false);
        std::mem::forget(tx);
        let mut settings = Settings::from_limits(&sweety_config::Limits::default());
        edit(&mut settings);
        let mut d = Driver::new(server, rt.shared.clone(), conn, settings, stop);
        feed(&mut d, &mut c, input).await;
        (d, c)
    }

    /// Writes `input` through the one-byte pipe, polling the driver between the bytes.
    async fn feed(
        d: &mut Driver<tokio::io::DuplexStream>,
        c: &mut tokio::io::DuplexStream,
        mut input: &[u8],
    ) {
        use tokio::io::AsyncWrite;
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..100_000 {
            if input.is_empty() {
                break;
            }
            if let Poll::Ready(Ok(n)) = Pin::new(&mut *c).poll_write(&mut cx, input) {
                input = &input[n..];
            }
            assert!(d.poll(&mut cx).is_pending());
            // Lets the request tasks run.
            tokio::task::yield_now().await;
        }
        assert!(
            input.is_empty(),
            "the driver took the input ({:?} left {} wb {} rb {} streams {})",
            d.closing,
            input.len(),
            d.write_buf.len(),
            d.read_buf.len(),
            d.streams.len()
        );
    }

    /// What the driver has written: the byte in the pipe, then its buffer.
    fn written(d: &Driver<tokio::io::DuplexStream>, c: &mut tokio::io::DuplexStream) -> BytesMut {
        use tokio::io::AsyncRead;
        let mut cx = Context::from_waker(Waker::noop());
        let mut b = [0u8; 1];
        let mut rb = tokio::io::ReadBuf::new(&mut b);
        let _ = Pin::new(c).poll_read(&mut cx, &mut rb);
        let mut out = BytesMut::from(rb.filled());
        out.extend_from_slice(&d.write_buf);
        out
    }

    fn frame_kinds(mut b: BytesMut) -> Vec<u8> {
        let mut kinds = Vec::new();
        while b.len() >= HEADER_LEN {
            let h = Head::parse(&b);
            kinds.push(h.kind);
            b.advance((HEADER_LEN + h.len as usize).min(b.len()));
        }
        kinds
    }

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Polls once after `wait`, with a counting waker: returns the wakes the poll itself made.
    async fn poll_after(d: &mut Driver<tokio::io::DuplexStream>, wait: Duration) -> usize {
        tokio::time::sleep(wait).await;
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(
            d.poll(&mut cx).is_pending(),
            "still flushing to a full pipe"
        );
        count.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_header_block_timeout_sends_one_goaway_and_does_not_spin() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let hrt = Duration::from_millis(200);
        let mut input = hello();
        // A header block that never ends (no CONTINUATION follows).
        let mut block = BytesMut::new();
        Encoder::field(&mut block, b":method", b"GET", false);
        frame::put_head(&mut input, block.len(), kind::HEADERS, 0, 1);
        input.extend_from_slice(&block);
        let (mut d, mut c) = hand_driver(&rt, |s| s.header_read_timeout = hrt, &input).await;
        assert!(d.cont.is_some());
        let wakes = poll_after(&mut d, hrt * 2).await;
        let goaways = frame_kinds(written(&d, &mut c))
            .into_iter()
            .filter(|k| *k == kind::GOAWAY)
            .count();
        assert_eq!(goaways, 1, "one GOAWAY for the timeout");
        assert_eq!(wakes, 0, "the task does not wake itself: no busy loop");
        assert!(
            d.timer.deadline().into_std() > Instant::now(),
            "timer re-armed"
        );
        assert!(d.closing.is_some());
    }

    #[tokio::test]
    async fn frames_left_from_an_earlier_read_start_their_requests_at_a_new_clock_reading() {
        // Frames kept while the output drained (`frames_pending`) may wait long after their
        // read: the requests they open must not start at that read's clock reading, or the
        // cache would judge freshness and Age at a past instant.
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let input = hello();
        let (mut d, _c) = hand_driver(&rt, |_| {}, &input).await;
        let old = Instant::now() - Duration::from_secs(30);
        d.batch_clock = old;
        d.last_active = old;
        d.frames_pending = true;
        assert!(d.write_buf.len() < WRITE_HIGH);
        let mut cx = Context::from_waker(Waker::noop());
        let _ = d.poll(&mut cx);
        assert!(
            d.batch_clock >= old + Duration::from_secs(29),
            "the batch clock is read again for frames left from an earlier read"
        );
    }

    /// Ids are remembered as closed once, whether they close in order or not, and an id above
    /// every remembered one skips the scan without being mistaken for a known one.
    #[tokio::test]
    async fn closed_ids_are_remembered_once_in_or_out_of_order() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let mut input = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut input, &[]);
        let (mut d, _c) = hand_driver(&rt, |_| {}, &input).await;
        for id in [5, 3, 5, 7, 3, 9, 1] {
            d.remember_closed(id);
        }
        assert_eq!(Vec::from(d.recently_closed.clone()), vec![5, 3, 7, 9, 1]);
        assert_eq!(d.recently_closed_max, 9);
    }

    #[tokio::test]
    async fn an_idle_goaway_is_sent_once_and_does_not_spin() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let idle = Duration::from_millis(200);
        let input = hello();
        let (mut d, mut c) = hand_driver(
            &rt,
            |s| {
                s.idle_timeout = idle;
                s.header_read_timeout = idle;
            },
            &input,
        )
        .await;
        let wakes = poll_after(&mut d, idle * 2).await;
        let goaways = frame_kinds(written(&d, &mut c))
            .into_iter()
            .filter(|k| *k == kind::GOAWAY)
            .count();
        assert_eq!(goaways, 1, "one GOAWAY for the idle connection");
        assert_eq!(wakes, 0, "the task does not wake itself: no busy loop");
        assert!(d.going_away);
        assert!(d.close_deadline.is_some(), "the close is bounded");
        assert!(
            d.timer.deadline().into_std() > Instant::now(),
            "timer re-armed"
        );
    }

    #[tokio::test]
    async fn blocked_streams_are_listed_once_and_forgotten_when_removed() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let mut input = BytesMut::from(&frame::PREFACE[..]);
        // No stream window: every response body waits.
        frame::put_settings(&mut input, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
        frame::put_settings_ack(&mut input);
        for i in 0..10 {
            input.extend_from_slice(&request(1 + 2 * i, true));
        }
        let (mut d, mut c) = hand_driver(&rt, |s| s.max_resets_per_sec = 1000, &input).await;
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..1000 {
            if d.blocked.len() == 10 {
                break;
            }
            tokio::task::yield_now().await;
            let _ = d.poll(&mut cx);
        }
        let mut listed = d.blocked.clone();
        listed.sort_unstable();
        assert_eq!(listed, (0..10).map(|i| 1 + 2 * i).collect::<Vec<u32>>());
        // One byte of window for stream 1: it sends it and waits again, listed once.
        let mut more = BytesMut::new();
        frame::put_window_update(&mut more, 1, 1);
        feed(&mut d, &mut c, &more).await;
        let _ = d.poll(&mut cx);
        assert_eq!(d.blocked.iter().filter(|b| **b == 1).count(), 1);
        // The client cancels them all: the list forgets them.
        let mut resets = BytesMut::new();
        for i in 0..10 {
            frame::put_rst(&mut resets, 1 + 2 * i, Reason::CANCEL);
        }
        feed(&mut d, &mut c, &resets).await;
        let _ = d.poll(&mut cx);
        assert!(d.streams.is_empty());
        assert!(
            d.blocked.is_empty(),
            "ids of removed streams: {:?}",
            d.blocked
        );
    }

    #[tokio::test]
    async fn every_reset_we_send_remembers_the_stream_and_counts_the_clients() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let mut input = hello();
        // Stream 1: a content-length with END_STREAM and no body (reset before it opens);
        // stream 3: an upper-case header name (malformed).
        let mut block = BytesMut::new();
        for (n, v) in [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("content-length", "5"),
        ] {
            Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
        }
        frame::put_headers(&mut input, 1, &block, true, 16_384);
        let mut block = BytesMut::new();
        for (n, v) in [(":method", "GET"), (":scheme", "http"), (":path", "/")] {
            Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
        }
        Encoder::field(&mut block, b"X-Upper", b"1", false);
        frame::put_headers(&mut input, 3, &block, true, 16_384);
        let (d, _c) = hand_driver(&rt, |s| s.max_resets_per_sec = 100, &input).await;
        for id in [1, 3] {
            assert!(
                d.recently_closed.contains(&id),
                "stream {id} remembered closed"
            );
            assert!(
                d.locally_reset_set.contains(&id),
                "stream {id} remembered reset"
            );
        }
        assert_eq!(d.flood.resets, 2, "both resets are the client's doing");
    }

    /// An I/O that buffers what it accepts and pushes it out only on later writes or
    /// on flush, as tokio-rustls does (its `poll_write` returns Ok(n) once rustls took the
    /// plaintext even when the socket would block; `poll_flush` writes the TLS records).
    struct TlsLike {
        inner: tokio::io::DuplexStream,
        pending: Vec<u8>,
    }

    impl TlsLike {
        fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            use tokio::io::AsyncWrite;
            while !self.pending.is_empty() {
                match Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                    Poll::Ready(Ok(n)) => {
                        self.pending.drain(..n);
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for TlsLike {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for TlsLike {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let room = (64 * 1024usize).saturating_sub(self.pending.len());
            let n = room.min(buf.len());
            self.pending.extend_from_slice(&buf[..n]);
            let blocked = self.drain(cx)?.is_pending();
            if n == 0 && blocked {
                return Poll::Pending;
            }
            Poll::Ready(Ok(n))
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            std::task::ready!(self.drain(cx))?;
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            std::task::ready!(self.drain(cx))?;
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    // Output a TLS-like stream accepted but could not send yet is flushed when the
    // socket drains, not left until the next write.
    #[tokio::test]
    async fn output_buffered_by_the_tls_layer_is_flushed() {
        use tokio::io::AsyncWriteExt;
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        // A socket that holds 16 bytes: the response cannot go out in one go.
        let (mut c, server) = tokio::io::duplex(16);
        let io = TlsLike {
            inner: server,
            pending: Vec::new(),
        };
        let conn = Arc::new(ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: true,
            sni: None,
        });
        let (tx, stop) = tokio::sync::watch::channel(false);
        let settings = Settings::from_limits(&sweety_config::Limits::default());
        let shared = rt.shared.clone();
        tokio::spawn(async move {
            let _tx = tx;
            let _ = serve(io, shared, conn, settings, stop).await;
        });
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut out, &[]);
        out.extend_from_slice(&request(1, true));
        c.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        let done = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                let (h, _) = read_frame(&mut c, &mut buf).await.expect("frames");
                if h.stream == 1 && h.has(flag::END_STREAM) {
                    break;
                }
            }
        })
        .await;
        assert!(
            done.is_ok(),
            "the end of the response is stuck in the TLS layer's buffer"
        );
    }

    // The same over real tokio-rustls on a small pipe.
    #[tokio::test]
    async fn tls_response_tail_is_not_stuck_in_rustls() {
        use tokio::io::AsyncWriteExt;
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["h2.test".into()]).unwrap();
        let cert = rustls::pki_types::CertificateDer::from(ck.cert.der().to_vec());
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()),
        );
        let mut server_cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        server_cfg.alpn_protocols = vec![b"h2".to_vec()];
        let client_cfg =
            crate::proxy::tls::client_config(&sweety_config::BackendTls::default(), true).unwrap();
        let (client_io, server_io) = tokio::io::duplex(64);
        let conn = Arc::new(ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: true,
            sni: None,
        });
        let (tx, stop) = tokio::sync::watch::channel(false);
        let settings = Settings::from_limits(&sweety_config::Limits::default());
        let shared = rt.shared.clone();
        tokio::spawn(async move {
            let _tx = tx;
            let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg))
                .accept(server_io)
                .await
                .unwrap();
            let _ = serve(tls, shared, conn, settings, stop).await;
        });
        let name = rustls::pki_types::ServerName::try_from("h2.test").unwrap();
        let mut c = tokio_rustls::TlsConnector::from(client_cfg)
            .connect(name, client_io)
            .await
            .unwrap();
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut out, &[]);
        out.extend_from_slice(&request(1, true));
        c.write_all(&out).await.unwrap();
        c.flush().await.unwrap();
        let mut buf = BytesMut::new();
        let done = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                while buf.len() >= HEADER_LEN {
                    let h = Head::parse(&buf);
                    if buf.len() < HEADER_LEN + h.len as usize {
                        break;
                    }
                    buf.advance(HEADER_LEN + h.len as usize);
                    if h.stream == 1 && h.has(flag::END_STREAM) {
                        return;
                    }
                }
                assert!(c.read_buf(&mut buf).await.unwrap() > 0, "closed");
            }
        })
        .await;
        assert!(done.is_ok(), "the end of the response is stuck in rustls");
    }

    // DATA refused by a stream error must still be credited to the
    // connection window, on both stream-error paths (stream window, content-length).
    #[tokio::test]
    async fn data_refused_by_a_stream_error_is_credited_to_the_connection() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let input = hello();
        let (mut d, _c) = hand_driver(&rt, |s| s.max_resets_per_sec = 1000, &input).await;
        // Two open uploads (as if their requests were still being handled): stream 1 with
        // a 1 KiB window left, stream 3 with `content-length: 1`.
        for (id, window, cl) in [(1u32, 1024i64, None), (3, 256 * 1024, Some(1u64))] {
            let mut s = Stream::new(d.peer_initial_window, window);
            s.recv = Some(RecvShared::new(d.signal.clone(), id, 1 << 20));
            s.content_length = cl;
            d.streams.insert(id, s);
            d.last_stream = id;
        }
        let payload = Bytes::from(vec![0u8; 16_384]);
        for id in [1u32, 3] {
            let head = Head {
                len: 16_384,
                kind: kind::DATA,
                flags: 0,
                stream: id,
            };
            match d.on_data(head, payload.clone()) {
                Err(f @ Fault::Stream(..)) => d.fault(f),
                _ => panic!("a stream error expected"),
            }
        }
        assert!(d.streams.is_empty());
        let accounted =
            d.conn_recv_window + d.conn_release as i64 + d.signal.take_consumed() as i64;
        assert_eq!(
            accounted,
            d.cfg.conn_window as i64,
            "connection window lost for good: {} bytes",
            d.cfg.conn_window as i64 - accounted
        );
    }

    // A graceful drain of a connection without streams whose client does not read
    // is given up after a bound (it had no close deadline: the GOAWAY waited in the buffer forever).
    #[tokio::test]
    async fn a_drained_connection_whose_client_does_not_read_is_closed() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let t = Duration::from_millis(200);
        let (mut c, server) = tokio::io::duplex(1);
        let conn = Arc::new(ConnInfo {
            listener: "x".into(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            tls: false,
            sni: None,
        });
        let (tx, stop) = tokio::sync::watch::channel(false);
        let mut settings = Settings::from_limits(&sweety_config::Limits::default());
        settings.idle_timeout = t;
        settings.header_read_timeout = t;
        let mut d = Driver::new(server, rt.shared.clone(), conn, settings, stop);
        let input = hello();
        feed(&mut d, &mut c, &input).await;
        // The listener drains.
        tx.send(true).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(d.poll(&mut cx).is_pending());
        assert!(d.going_away && d.streams.is_empty() && !d.write_buf.is_empty());
        let mut ended = false;
        for _ in 0..10 {
            tokio::time::sleep(t).await;
            if d.poll(&mut cx).is_ready() {
                ended = true;
                break;
            }
        }
        assert!(
            ended,
            "still open 2 s after the drain began (close deadline {:?})",
            d.close_deadline
        );
    }

    // A client that reads a long response steadily but sends no frame (its windows
    // are large) is PINGed after `idle_timeout`, and the PING waits behind the queued output;
    // the connection must not be closed as dead while the client keeps reading.
    #[tokio::test]
    async fn a_reading_client_is_not_closed_as_dead() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions::default()).unwrap();
        let t = Duration::from_millis(200);
        let input = hello();
        let (mut d, mut c) = hand_driver(
            &rt,
            |s| {
                s.idle_timeout = t;
                s.header_read_timeout = t;
            },
            &input,
        )
        .await;
        // Stream 1: a 4 MiB response, windows opened wide by the client up front.
        let mut s = Stream::new(MAX_WINDOW, d.cfg.stream_window as i64);
        s.recv_open = false;
        s.resp = Resp::Body(crate::body::full(Bytes::from(vec![b'x'; 4 << 20])));
        d.streams.insert(1, s);
        d.last_stream = 1;
        d.conn_send_window = MAX_WINDOW;
        d.enqueue(1);
        // The client reads all the time (one byte per turn through the 1-byte pipe).
        use tokio::io::AsyncRead;
        let mut cx = Context::from_waker(Waker::noop());
        let start = Instant::now();
        let mut got = 0usize;
        let mut ended = None;
        while start.elapsed() < t * 5 && ended.is_none() {
            let mut b = [0u8; 1];
            let mut rb = tokio::io::ReadBuf::new(&mut b);
            if let Poll::Ready(Ok(())) = Pin::new(&mut c).poll_read(&mut cx, &mut rb) {
                got += rb.filled().len();
            }
            if let Poll::Ready(r) = d.poll(&mut cx) {
                ended = Some((start.elapsed(), r));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(got > 100, "the client kept reading ({got} bytes)");
        assert!(
            ended.is_none(),
            "closed as dead while its output was being read ({got} bytes read): {ended:?}"
        );
    }

    #[test]
    fn flood_counters_reset_every_second() {
        let mut f = Flood {
            since: Instant::now(),
            resets: 0,
            control: 0,
            empty: 0,
        };
        for _ in 0..3 {
            assert!(!f.hit(|f| &mut f.resets, 3));
        }
        assert!(f.hit(|f| &mut f.resets, 3), "the fourth is over the limit");
        f.since -= Duration::from_secs(2);
        assert!(!f.hit(|f| &mut f.resets, 3), "a new second starts over");
    }
}
