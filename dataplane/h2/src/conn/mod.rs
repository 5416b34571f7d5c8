//! The server side of one HTTP/2 connection (RFC 9113): reads frames, runs the stream state
//! machine, hands each request to the connection's [`H2Service`], and writes responses under
//! both flow-control windows.
//!
//! Files: `driver` (the task's poll loop, deadlines, frame dispatch, SETTINGS, GOAWAY),
//! `streams` (stream state, requests, resets, responses), `flow` (DATA and the windows),
//! `guards` (flood counters), `head` (header blocks into requests).
//!
//! One task drives the connection and its streams. After each read it handles the complete
//! frames, answers every stream whose response is ready at once (cache hits, fixed replies,
//! refusals), then writes the whole batch with one `write`. A poll that took answers made
//! ready by another task (an h2c backend connection's, whose every read answers streams of many
//! connections) while other streams are still being answered holds its write for one turn of
//! the runtime (`Driver::should_defer_write`): the answers of that task's next read then go
//! in the same write, not one write (and segment) per answer. At most
//! [`INLINE_FIRST_POLLS`] requests are started per poll of the task: past that it yields
//! (the rest of the read waits in the buffer), so one connection cannot hold its worker. A
//! response that has to wait (backend, file) stays with its stream: the request future is
//! polled by this task, never spawned (no task, no hand-over between tasks per request), and
//! never awaited (one stream waiting never holds the others); it and every response body wake
//! the connection through [`Signal`] with the stream's id, and the driver then polls and
//! writes what is ready (a waiting future only when its own waker fired, never for a window
//! change). A stream that goes (the client's RST_STREAM, a reset of ours, the client's EOF or a
//! read error, the connection's end) drops its future: its backend request is cancelled with
//! it; a panic in that drop is caught and ends only the stream.
//!
//! The trade-off: all of one connection's request phases (routing, the backend's dial and TLS
//! handshake, the HTTP/1.1 exchange with it, filters) run on the worker that runs the
//! connection's task, one after another, where tasks of their own could have been stolen by
//! idle workers. Many connections spread over the workers as before; one connection carrying
//! many streams (a gRPC client, a fronting balancer) is served by one worker at a time. See
//! e2e/bench/HISTORY.md (one connection, 128 streams, two workers) for what that measured.
//! The futures also share the task's tokio coop budget (128 resource operations per poll);
//! the connection's socket writes are kept out of it (`Driver::poll_write`), so answers made
//! ready in a poll are written in that poll however much of the budget the futures spent,
//! while its reads stay under it (new work waits for the next poll, after the other tasks).
//!
//! Bounds: the read buffer holds at most one frame past `SETTINGS_MAX_FRAME_SIZE` (16 KiB);
//! the write buffer stops taking body data at `Settings::write_buffer` (plus one frame), and
//! the driver stops handling
//! frames (the rest of a read waits in the read buffer) and stops reading while it is over
//! that mark (a client that does not read its responses stops being read);
//! request bodies are bounded by the stream and connection windows we grant, re-opened only
//! as the pipeline consumes them; header blocks by `limits.max_header_bytes`. Floods (rapid
//! reset, SETTINGS/PING/PRIORITY/GOAWAY and acknowledgements, empty frames, frames that do
//! nothing: see `guards`) are counted per connection per second and
//! end the connection with GOAWAY ENHANCE_YOUR_CALM. A response held by a flow-control
//! window the client keeps at zero is reset after `send_timeout` (see `Stream::stalled`), or
//! at once after the client's EOF (no WINDOW_UPDATE can come: `Driver::cancel_blocked`);
//! one timer per connection serves every deadline, armed to the earliest.

use crate::body::{RecvBody, RecvShared, Signal, StreamWaker, Upgrade};
use crate::first_poll::INLINE_FIRST_POLLS;
use crate::frame::{self, flag, kind, setting, Head, Reason, HEADER_LEN, MAX_WINDOW};
use crate::hpack::{Decoder, Encoder, Field};
use crate::{Body, EncodedHead, H2Service};
use bytes::{Buf, Bytes, BytesMut};
use guards::Flood;
use head::{h_content_length, Continuation, NewHead};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri, Version};
use http_body::Body as _;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use streams::{Stream, StreamIds};

/// The connection's clock: tokio's, as std's [`Instant`] (the same time in production; under
/// a paused test clock, the paused time, so that the deadlines and the timer that waits for
/// them agree: with std's clock a paused runtime's timer fired at once and the driver re-polled
/// until the real time reached the deadline, seconds of busy loop per run of the fuzz harness).
pub(crate) fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// The default `Settings::write_buffer`: output bytes past which the driver stops taking
/// body data and stops reading.
pub const WRITE_HIGH: usize = 32 * 1024;
/// Largest empty read or write buffer an idle connection keeps.
const IDLE_BUFFER: usize = 16 * 1024 + HEADER_LEN;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024 + HEADER_LEN;
/// Our SETTINGS_MAX_FRAME_SIZE (the default; larger frames are a FRAME_SIZE_ERROR).
const LOCAL_MAX_FRAME: u32 = frame::DEFAULT_MAX_FRAME_SIZE;
/// Largest DATA frame written (bounds the output buffer past `Settings::write_buffer`).
const MAX_DATA_FRAME: usize = 32 * 1024;
/// DATA payloads of at least this many bytes are queued as they are (a reference to the
/// body's chunk) and gathered by a vectored write, instead of being copied into `write_buf`.
const GATHER_DATA: usize = 4 * 1024;
/// Most buffers handed to one vectored write.
const MAX_IOVECS: usize = 64;
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
/// Frames that deliver nothing (see `guards`) a client may send per second.
const MAX_GLITCHES_PER_SEC: u32 = 1_000;

/// The largest output buffer (bytes waiting to be written) of any connection so far.
static PEAK_OUTPUT: AtomicUsize = AtomicUsize::new(0);

/// The most output bytes any connection of this process has held at once: at most its
/// `Settings::write_buffer` plus one frame (what `limits.http2_write_buffer` bounds).
pub fn peak_output_bytes() -> usize {
    PEAK_OUTPUT.load(Ordering::Relaxed)
}

/// The connection's settings (the dataplane makes them from the config's limits).
#[derive(Debug, Clone)]
pub struct Settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS we announce and enforce.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: larger request header lists get 431.
    pub max_header_bytes: u32,
    /// Time for the client preface and for each header block to complete.
    pub header_read_timeout: Duration,
    /// A connection without streams for this long is closed (GOAWAY).
    pub idle_timeout: Duration,
    /// Resets (client RST_STREAM before the response finished, refused streams) per second.
    pub max_resets_per_sec: u32,
    /// Window of each request stream we grant.
    pub stream_window: u32,
    /// Window of the whole connection we grant.
    pub conn_window: u32,
    /// A stream whose response has bytes waiting for flow-control window (the stream's or
    /// the connection's) that the client does not open for this long is reset with
    /// RST_STREAM(CANCEL): a client answering PINGs with its windows at zero cannot hold a
    /// response, its request slot and its upstream connection for ever.
    pub send_timeout: Duration,
    /// Output bytes past which the connection stops taking response data and stops reading
    /// (at least one frame is always taken): the output buffer holds at most this plus one
    /// DATA frame (the TLS layer below keeps its own). Default [`WRITE_HIGH`].
    pub write_buffer: usize,
}

/// Why a connection ended other than cleanly.
#[derive(Debug, thiserror::Error)]
pub enum H2Error {
    /// A connection error we sent GOAWAY for.
    #[error("HTTP/2 connection error {0}: {1}")]
    Protocol(Reason, &'static str),
    /// The peer sent GOAWAY with an error.
    #[error("peer closed the connection with {0}")]
    Remote(Reason),
    /// The socket failed.
    #[error("HTTP/2 connection I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Client: the backend did not process the stream (REFUSED_STREAM, above the last
    /// stream id of its GOAWAY, or the request never reached it); it may go again.
    #[error("HTTP/2 stream refused by the backend (not processed)")]
    Refused,
    /// Client: the backend reset the stream.
    #[error("backend reset the HTTP/2 stream with {0}")]
    StreamReset(Reason),
    /// Client: we reset the stream, its response broke a rule.
    #[error("HTTP/2 stream error {0}: {1}")]
    Stream(Reason, &'static str),
    /// Client: the backend closed the connection.
    #[error("backend closed the HTTP/2 connection")]
    Closed,
    /// Client: the request body failed.
    #[error("request body: {0}")]
    RequestBody(crate::BoxError),
    /// Client: the request body's length differs from its `content-length`.
    #[error("request body length differs from its content-length")]
    RequestLength,
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

/// Serves one HTTP/2 connection (the client preface not yet read) until it ends.
/// `stop` turning true starts a graceful close (GOAWAY, in-flight streams finish).
pub async fn serve<I, S>(
    io: I,
    service: S,
    settings: Settings,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), H2Error>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: H2Service,
{
    serve_read(io, BytesMut::new(), service, settings, stop).await
}

/// [`serve`] for a connection whose first bytes (`read`: the client preface, perhaps more)
/// were already read from `io`.
pub async fn serve_read<I, S>(
    io: I,
    read: BytesMut,
    service: S,
    settings: Settings,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), H2Error>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: H2Service,
{
    let mut driver = Driver::new(io, service, settings, stop);
    if !read.is_empty() {
        driver.read_buf = read;
        driver.frames_pending = true;
    }
    std::future::poll_fn(|cx| driver.poll(cx)).await
}

struct Driver<I, S: H2Service> {
    io: I,
    /// What answers the requests.
    service: S,
    cfg: Settings,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    stop_seen: bool,
    signal: Arc<Signal>,
    ready: Vec<u32>,
    /// Wakers of closed streams for the next ones.
    spare_wakers: streams::Spares,
    /// Streams the batch of frames being handled started, for their first poll after it
    /// (`first_polls`).
    starting: Vec<u32>,

    read_buf: BytesMut,
    /// The output, in order: `out` (frozen frame bytes split off `write_buf`, and DATA payloads
    /// of at least [`GATHER_DATA`] bytes referenced, not copied), then `write_buf`.
    out: VecDeque<Bytes>,
    /// Bytes in `out`.
    out_len: usize,
    /// Whether the I/O gathers buffers in one write (`is_write_vectored`). Without it a
    /// vectored write would send only its first buffer, so large DATA payloads are copied
    /// into `write_buf` like small ones and `out` stays empty.
    gather: bool,
    write_buf: BytesMut,
    /// The most output bytes (`out` and `write_buf`) held at once (each new high recorded in
    /// [`PEAK_OUTPUT`]: a few times per connection).
    peak_output: usize,
    /// This poll's output waits for a wake-up registered with the runtime (see
    /// `Driver::should_defer_write`).
    write_deferred: bool,
    /// Written since the last completed flush: a TLS layer may hold what it accepted until
    /// it is flushed.
    unflushed: bool,
    /// The output holds DATA payload bytes.
    data_out: bool,
    /// The socket took some of that output since the keep-alive check last looked: the client
    /// is reading (our own control frames, which the kernel takes from a vanished client too,
    /// do not count).
    data_progress: bool,
    scratch: BytesMut,
    decoder: Decoder,
    /// A request head as built from a block of the decoder's run `.0` (see
    /// [`head::NewHead`]): handed out again, cloned, for a block that repeats it.
    kept_request: crate::hpack::KeptHead<http::request::Parts>,
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
    streams: HashMap<u32, Stream<S::Future>, StreamIds>,
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
    flood: Flood,
}

impl<I, S: H2Service> Drop for Driver<I, S> {
    fn drop(&mut self) {
        // The request futures still running are dropped here: their backend requests are
        // cancelled, and a panic in one's `Drop` is caught (a second panic while the driver
        // unwinds from its own would abort the process).
        for (id, s) in self.streams.drain() {
            if let Some(r) = &s.recv {
                r.fail("connection closed");
            }
            streams::drop_guarded(s.resp, id);
        }
    }
}

mod driver;
mod flow;
mod guards;
mod head;
mod streams;
#[cfg(test)]
mod tests;
