//! The state of one client connection without its transport: what the backend's bytes do to
//! the streams (frames, HPACK, response heads, bodies, trailers, windows, SETTINGS, PING,
//! GOAWAY, RST_STREAM) and the bytes we owe it in return. The connection task
//! ([`super::Connection`]) feeds it what it reads and writes what it queues; requests and response
//! bodies ([`super::SendRequest`], [`super::ResponseBody`]) open, read and cancel streams in
//! it under the connection's lock. Kept apart from I/O so that the fuzz target can drive it
//! with any bytes, whole or split, and compare.
//!
//! Every byte from the backend is hostile: each frame is checked against RFC 9113's rules for
//! a client (a server may not open streams or push; SETTINGS values in range; windows never
//! past 2^31-1 nor below what was granted), header blocks are bounded in bytes
//! (`max_header_list`) and in CONTINUATION frames ([`MAX_CONTINUATIONS`]), interim responses
//! in number ([`MAX_INTERIM`]), response fields are validated (one `:status`, no other
//! pseudo-field, lower-case names, no connection-specific field, RFC 9113 §8.2.2), a body must
//! match its `content-length`, and frames that deliver nothing (empty DATA, PING, SETTINGS,
//! frames on streams we closed, unknown types) are counted per second: past the limits the
//! connection ends with GOAWAY ENHANCE_YOUR_CALM.

use crate::frame::{
    self, flag, kind, setting, Head, Reason, DEFAULT_WINDOW, HEADER_LEN, MAX_WINDOW,
};
use crate::hpack::{Decoder, Encoder, Field, HpackError, KeptHead};
use crate::{Body, BoxError, H2Error};
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use http::{Method, StatusCode, Version};
use http_body::Body as _;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Interim (1xx) responses accepted before the final one.
pub const MAX_INTERIM: usize = 16;
/// CONTINUATION frames accepted in one header block.
pub const MAX_CONTINUATIONS: usize = 64;
/// Fields accepted in one response head or trailer block (more fail the stream; a
/// `HeaderMap` holds at most 32,768 names).
pub const MAX_FIELDS: usize = 1_000;
/// The largest `max_header_list` a connection takes, whatever it is asked for.
pub const MAX_HEADER_LIST: u32 = 256 * 1024;
/// Our SETTINGS_MAX_FRAME_SIZE (the default; a larger frame is a FRAME_SIZE_ERROR).
pub const LOCAL_MAX_FRAME: u32 = frame::DEFAULT_MAX_FRAME_SIZE;
/// Output bytes past which request bodies are not polled and the backend is not read.
pub const WRITE_HIGH: usize = 64 * 1024;
/// Largest DATA frame we write, whatever the backend's SETTINGS_MAX_FRAME_SIZE.
const MAX_DATA_FRAME: usize = 16 * 1024;
/// SETTINGS, PING, PRIORITY and GOAWAY frames the backend may send per second.
pub const MAX_CONTROL_PER_SEC: u32 = 1_000;
/// Empty DATA and CONTINUATION frames (not ending anything) per second.
pub const MAX_EMPTY_PER_SEC: u32 = 200;
/// Frames that deliver nothing (a HEADERS block or WINDOW_UPDATE on a stream we closed, an
/// unknown frame type) per second.
pub const MAX_GLITCHES_PER_SEC: u32 = 1_000;
/// RST_STREAM frames per second.
pub const MAX_RESETS_PER_SEC: u32 = 1_000;

/// The bounds of one connection (the dataplane makes them from its limits).
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): what the backend may send
    /// of one response ahead of its consumer.
    pub stream_window: u32,
    /// The connection's receive window: what all streams together may hold unread.
    pub conn_window: u32,
    /// Largest response header list (SETTINGS_MAX_HEADER_LIST_SIZE, RFC 9113 §6.5.2 octets:
    /// name + value + 32 per field); a larger head fails its stream.
    pub max_header_list: u32,
}

impl Config {
    /// The bounds with every value in range (windows 1..=2^31-1, header list 1 KiB to
    /// [`MAX_HEADER_LIST`]).
    pub fn clamped(self) -> Config {
        let w = |v: u32| v.clamp(1, MAX_WINDOW as u32);
        Config {
            stream_window: w(self.stream_window),
            conn_window: w(self.conn_window).max(DEFAULT_WINDOW),
            max_header_list: self.max_header_list.clamp(1024, MAX_HEADER_LIST),
        }
    }
}

/// Why a connection ended (copied to each of its streams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// We found the backend breaking the protocol, or a bound, and sent GOAWAY.
    Local(Reason, &'static str),
    /// The backend sent GOAWAY with an error code.
    Remote(Reason),
    /// The transport failed.
    Io(std::io::ErrorKind, String),
    /// The connection task ended (dropped, or it panicked) before the connection did.
    Gone,
    /// The backend closed the connection.
    Eof,
    /// No frame came in answer to our PING.
    KeepAlive,
    /// Closed by us: idle, or every handle dropped.
    Idle,
}

impl Fault {
    fn to_error(&self) -> H2Error {
        match self {
            Fault::Local(r, why) => H2Error::Protocol(*r, why),
            Fault::Remote(r) => H2Error::Remote(*r),
            Fault::Io(k, m) => H2Error::Io(std::io::Error::new(*k, m.clone())),
            Fault::Eof => H2Error::Closed,
            Fault::KeepAlive => H2Error::Protocol(Reason::NO_ERROR, "no answer to PING"),
            Fault::Idle | Fault::Gone => H2Error::Closed,
        }
    }

    /// The backend went away rather than answered wrongly.
    fn is_disconnect(&self) -> bool {
        matches!(self, Fault::Io(..) | Fault::Eof | Fault::Remote(_))
    }
}

/// How one stream ended other than with its response.
#[derive(Debug)]
enum StreamFault {
    /// REFUSED_STREAM, or above the last stream id of the backend's GOAWAY, or its HEADERS
    /// never reached the transport: not processed, safe to send again.
    Refused,
    /// The backend reset it.
    Reset(Reason),
    /// We reset it: the response broke a rule.
    Local(Reason, &'static str),
    /// The connection ended.
    Conn(Fault),
    /// The request body failed.
    RequestBody(BoxError),
    /// The request body's length differs from its `content-length`.
    RequestLength,
}

/// A frame's error: of the connection (GOAWAY) or one stream (RST_STREAM).
enum Err {
    Conn(Reason, &'static str),
    Stream(u32, Reason, &'static str),
}

type FResult = Result<(), Err>;

/// Per-second counters of the flood guards.
#[derive(Debug)]
struct Flood {
    since: Option<Instant>,
    control: u32,
    empty: u32,
    glitches: u32,
    resets: u32,
}

impl Flood {
    fn hit(&mut self, now: Instant, which: fn(&mut Flood) -> &mut u32, limit: u32) -> bool {
        if self
            .since
            .is_none_or(|s| now.saturating_duration_since(s) >= Duration::from_secs(1))
        {
            *self = Flood {
                since: Some(now),
                control: 0,
                empty: 0,
                glitches: 0,
                resets: 0,
            };
        }
        let c = which(self);
        *c += 1;
        *c > limit
    }
}

/// Where a stream's response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recv {
    /// Waiting for the final head (after `interim` 1xx heads).
    Head { interim: usize },
    /// The head came; body and trailers follow.
    Body,
    /// END_STREAM received, or the stream ended.
    Done,
}

/// One stream: the request going out, the response coming in.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) id: u32,
    // Sending.
    send_window: i64,
    /// The request body, while it has more to give.
    body: Option<Body>,
    /// A frame was taken from the body: it can no longer be given back.
    body_polled: bool,
    /// Taken from the body, not yet framed.
    pending: Bytes,
    /// The body ended (after `pending`, and `pending_trailers` if any).
    body_end: bool,
    /// Boxed, as `trailers`: rare, and a map is 96 octets of every stream otherwise (the
    /// streams are pushed and swap-removed whole, one per request).
    pending_trailers: Option<Box<HeaderMap>>,
    /// END_STREAM (or RST_STREAM) queued.
    send_done: bool,
    /// The request's `content-length`, counted down as data goes.
    length_left: Option<u64>,
    /// Our bytes queued up to the start and to the end of this stream's HEADERS (frame
    /// boundaries: HEADERS and its CONTINUATION frames are queued together).
    headers_start: u64,
    headers_end: u64,
    /// The octets of its first HEADERS frame (frame header included): once they reached the
    /// transport the backend knows the stream (see [`Core::sent`]).
    headers_first: u32,
    // Receiving.
    recv: Recv,
    head_request: bool,
    /// The final head, until the request future takes it.
    head: Option<http::response::Parts>,
    recv_window: i64,
    /// Consumed bytes not yet granted back to the stream.
    unreleased: u32,
    data: VecDeque<Bytes>,
    queued: usize,
    trailers: Option<Box<HeaderMap>>,
    /// The body's length must be this (`content-length`; 0 for HEAD, 204, 304).
    expect_len: Option<u64>,
    received: u64,
    fault: Option<StreamFault>,
    /// A frame of the response came.
    pub(crate) response_started: bool,
    waker: Option<Waker>,
}

impl Stream {
    /// The stream is closed both ways (no frame of ours or the backend's is due).
    fn closed(&self) -> bool {
        self.send_done && self.recv == Recv::Done
    }
}

/// What the response future finds.
pub enum HeadPoll {
    /// The final head; the body follows on the stream.
    Ready(http::response::Parts),
    /// The final head and the whole body (data, trailers): the stream is closed and gone.
    Whole(
        http::response::Parts,
        VecDeque<Bytes>,
        Option<Box<HeaderMap>>,
    ),
    /// The stream failed: the error, the body if it can be sent again, and whether the
    /// connection closed before any response (`closed_before_response`).
    Failed(H2Error, Option<Body>, bool),
    /// Not yet (the waker is kept).
    Pending,
}

/// The connection's state.
pub struct Core {
    cfg: Config,
    decoder: Decoder,
    encoder: Encoder,
    /// Bytes read, not yet handled: at most one frame and one read past it.
    pub(crate) rbuf: BytesMut,
    /// Bytes to write.
    pub(crate) out: BytesMut,
    /// Bytes queued to `out` since the start, and bytes written.
    queued_total: u64,
    pub(crate) written_total: u64,
    pub(crate) streams: Vec<Stream>,
    /// The id of each of `streams`, in the same order: streams are looked up by id for
    /// every frame and every poll of a request, and a scan of this dense list touches a few
    /// cache lines where one of `streams` (hundreds of octets each, up to 100 streams in
    /// flight on a pooled connection) touched one per stream.
    ids: Vec<u32>,
    next_id: u32,
    /// The backend's SETTINGS came (its preface).
    pub(crate) preface_seen: bool,
    pub(crate) peer_max_streams: u32,
    peer_initial_window: i64,
    peer_max_frame: usize,
    /// The backend acknowledged our SETTINGS (our stream window holds from then on).
    settings_acked: bool,
    conn_send_window: i64,
    conn_recv_window: i64,
    conn_unreleased: u32,
    /// A header block being received: stream, END_STREAM, block, CONTINUATION frames.
    cont: Option<(u32, bool, BytesMut, usize)>,
    /// The last stream id of the backend's GOAWAY.
    pub(crate) goaway: Option<u32>,
    goaway_reason: Option<Reason>,
    /// The connection ended: why.
    pub(crate) fault: Option<Fault>,
    flood: Flood,
    /// The connection task, waiting.
    pub(crate) task_waker: Option<Waker>,
    /// Frames read since the last keep-alive tick.
    frames_read: u64,
    silent_ticks: u32,
    idle_ticks: u32,
    ping_out: bool,
    /// The first stream to send body data for (round robin).
    turn: usize,
    /// Scratch for header blocks.
    block: BytesMut,
    /// A final or interim response head as validated from a block of the decoder's run
    /// `.0` (see [`Core::on_block`]): handed out again, cloned, for a block that repeats it.
    kept: KeptHead<ResponseBlock>,
    /// Heads handed out from `kept`.
    heads_repeated: u64,
    /// The clock reading of the read being handled, taken when a flood counter needs it.
    now: Option<Instant>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("streams", &self.streams.len())
            .field("next_id", &self.next_id)
            .field("goaway", &self.goaway)
            .field("fault", &self.fault)
            .finish_non_exhaustive()
    }
}

/// The request fields a stream opens with.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// `:scheme` (`http` or `https`).
    pub scheme: &'a str,
    /// `:authority`.
    pub authority: &'a [u8],
    /// `:path` (path and query).
    pub path: &'a str,
    /// The fields; `host` and connection-specific ones are left out.
    pub headers: &'a HeaderMap,
}

/// One `content-length` value: 1 to 19 digits (RFC 9110 §8.6; 19 digits fit a u64).
fn parse_length(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// A response or trailer block being validated field by field (RFC 9113 §8.2, §8.3.2).
#[derive(Default, Clone)]
struct ResponseBlock {
    status: Option<u16>,
    headers: HeaderMap,
    /// Fields seen, up to [`MAX_FIELDS`].
    fields: usize,
    regular_seen: bool,
    malformed: Option<&'static str>,
    /// The `content-length`, read as the fields come (no look-up in the map afterwards):
    /// one value, repeats equal.
    length: Option<u64>,
    /// A `content-length` value was invalid (not 1 to 19 digits) or differed from another.
    bad_length: bool,
}

impl ResponseBlock {
    fn field(&mut self, f: Field<'_>, trailers: bool) {
        if self.malformed.is_none() {
            if let Err(why) = self.try_field(f, trailers) {
                self.malformed = Some(why);
            }
        }
    }

    fn try_field(&mut self, f: Field<'_>, trailers: bool) -> Result<(), &'static str> {
        self.fields += 1;
        if self.fields > MAX_FIELDS {
            return Err("too many fields");
        }
        if let Some(pseudo) = f.name.strip_prefix(b":") {
            if trailers {
                return Err("pseudo-header in trailers");
            }
            if self.regular_seen {
                return Err("pseudo-header after a regular field");
            }
            if pseudo != b"status" {
                return Err("pseudo-header other than :status in a response");
            }
            if self.status.is_some() {
                return Err("duplicate :status");
            }
            let v = f.value;
            if v.len() != 3 || !v.iter().all(u8::is_ascii_digit) || v[0] == b'0' {
                return Err("invalid :status");
            }
            self.status = Some(v.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0')));
            return Ok(());
        }
        self.regular_seen = true;
        if f.name.iter().any(u8::is_ascii_uppercase) {
            return Err("upper-case field name");
        }
        let name = HeaderName::from_bytes(f.name).map_err(|_| "invalid field name")?;
        if crate::conn_headers::is_connection_specific(name.as_str(), f.value)
            || name == http::header::TE
        {
            return Err("connection-specific field in a response");
        }
        let mut value = HeaderValue::from_bytes(f.value).map_err(|_| "invalid field value")?;
        if f.sensitive {
            value.set_sensitive(true);
        }
        if name == CONTENT_LENGTH {
            match parse_length(f.value) {
                Some(n) if self.length.is_none_or(|o| o == n) => self.length = Some(n),
                _ => self.bad_length = true,
            }
        }
        self.headers
            .try_append(name, value)
            .map_err(|_| "too many fields")?;
        Ok(())
    }
}

impl Core {
    /// A connection's state before any byte: our preface, SETTINGS and connection window
    /// are queued.
    pub fn new(cfg: Config) -> Core {
        let cfg = cfg.clamped();
        let mut out = BytesMut::with_capacity(128);
        out.extend_from_slice(frame::PREFACE);
        frame::put_settings(
            &mut out,
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::INITIAL_WINDOW_SIZE, cfg.stream_window),
                (setting::MAX_HEADER_LIST_SIZE, cfg.max_header_list),
            ],
        );
        if cfg.conn_window > DEFAULT_WINDOW {
            frame::put_window_update(&mut out, 0, cfg.conn_window - DEFAULT_WINDOW);
        }
        Core {
            cfg,
            decoder: Decoder::new().watching_repeats(),
            encoder: Encoder::new(),
            rbuf: BytesMut::new(),
            queued_total: out.len() as u64,
            out,
            written_total: 0,
            streams: Vec::new(),
            ids: Vec::new(),
            next_id: 1,
            preface_seen: false,
            // RFC 9113 §6.5.2 sets no initial limit; 100 until the backend says (the
            // usual value, and the pool's own bound).
            peer_max_streams: 100,
            peer_initial_window: i64::from(DEFAULT_WINDOW),
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE as usize,
            settings_acked: false,
            conn_send_window: i64::from(DEFAULT_WINDOW),
            conn_recv_window: i64::from(cfg.conn_window),
            conn_unreleased: 0,
            cont: None,
            goaway: None,
            goaway_reason: None,
            fault: None,
            flood: Flood {
                since: None,
                control: 0,
                empty: 0,
                glitches: 0,
                resets: 0,
            },
            task_waker: None,
            frames_read: 0,
            silent_ticks: 0,
            idle_ticks: 0,
            ping_out: false,
            turn: 0,
            block: BytesMut::new(),
            kept: KeptHead::default(),
            heads_repeated: 0,
            now: None,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// Hands the backend's bytes `b` to the read buffer (then [`Core::process`] them): the
    /// way in for tests and the fuzz target, which have no transport.
    pub fn feed(&mut self, b: &[u8]) {
        self.rbuf.extend_from_slice(b);
    }

    /// Bytes read and not yet handled (less than one frame once processed).
    pub fn read_buffered(&self) -> usize {
        self.rbuf.len()
    }

    /// The bytes queued for the backend, taken.
    pub fn take_output(&mut self) -> BytesMut {
        let out = self.out.split();
        self.written_total += out.len() as u64;
        out
    }

    /// Bytes queued for the backend.
    pub fn output_len(&self) -> usize {
        self.out.len()
    }

    /// Each stream's unread response bytes.
    pub fn stream_buffered(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.streams.iter().map(|s| (s.id, s.queued))
    }

    /// Response heads handed out again for a block that repeated the one before (see
    /// [`Core::on_block`]).
    pub fn heads_repeated(&self) -> u64 {
        self.heads_repeated
    }

    /// Why the connection ended, if it did.
    pub fn fault(&self) -> Option<&Fault> {
        self.fault.as_ref()
    }

    /// No new stream may open: the connection ended, the backend sent GOAWAY or allows no
    /// stream (SETTINGS_MAX_CONCURRENT_STREAMS 0), or the stream ids are used up.
    pub fn is_closing(&self) -> bool {
        self.fault.is_some()
            || self.goaway.is_some()
            || self.peer_max_streams == 0
            || self.next_id > MAX_WINDOW as u32
    }

    /// Makes `id` the next stream id (tests of the ids' exhaustion).
    #[cfg(test)]
    pub(crate) fn set_next_id(&mut self, id: u32) {
        self.next_id = id;
    }

    fn find(&self, id: u32) -> Option<usize> {
        let i = self.ids.iter().position(|&s| s == id);
        // The fuzz target and the tests run with debug assertions: the two lists agree.
        debug_assert!(self.ids.len() == self.streams.len());
        // In release builds too: a frame never reaches another request's stream, even if a
        // later change let the two lists disagree (one compare per look-up).
        i.filter(|&i| self.streams.get(i).is_some_and(|s| s.id == id))
    }

    /// Whether `id` was never opened by us (a server-opened id, or above ours).
    fn is_idle(&self, id: u32) -> bool {
        id.is_multiple_of(2) || id >= self.next_id
    }

    /// Whether stream `i`'s first HEADERS frame reached the transport. Until then the stream
    /// is idle for the backend (RFC 9113 §5.1): any frame of its on the stream but PRIORITY
    /// (HEADERS, DATA, WINDOW_UPDATE, RST_STREAM) is a connection error of type
    /// PROTOCOL_ERROR, which also refuses the stream (its HEADERS are cut from the output).
    /// The first frame, not the whole block: a header block larger than the backend's
    /// MAX_FRAME_SIZE goes out as HEADERS and CONTINUATIONs, and a backend may act on the
    /// HEADERS frame alone (refuse the stream with RST_STREAM(REFUSED_STREAM) when it is over
    /// its concurrency limit, as nghttp2 does) while the socket has not taken the rest yet.
    fn sent(&self, i: usize) -> bool {
        let s = &self.streams[i];
        s.headers_start + u64::from(s.headers_first) <= self.written_total
    }

    fn wake_task(&mut self) {
        if let Some(w) = self.task_waker.take() {
            w.wake();
        }
    }

    fn queue_len_changed(&mut self, before: usize) {
        self.queued_total += (self.out.len() - before) as u64;
    }

    // ------------------------------------------------------------------ requests

    /// Opens a stream for `req` with `body`: HEADERS queued (END_STREAM when the body is
    /// empty). Fails, giving the body back, when the connection takes no new stream.
    pub fn open(&mut self, req: &RequestHead<'_>, body: Body) -> Result<u32, (H2Error, Body)> {
        if let Some(f) = &self.fault {
            return Err((f.to_error(), body));
        }
        if self.is_closing() {
            return Err((H2Error::Refused, body));
        }
        let end = body.is_end_stream();
        let mut block = std::mem::take(&mut self.block);
        block.clear();
        self.encoder.begin_block(&mut block);
        Encoder::field_raw(
            &mut block,
            b":method",
            req.method.as_str().as_bytes(),
            false,
        );
        Encoder::field_raw(&mut block, b":scheme", req.scheme.as_bytes(), false);
        Encoder::field_raw(&mut block, b":authority", req.authority, false);
        Encoder::field_raw(&mut block, b":path", req.path.as_bytes(), false);
        // The request's content-length, read in the same pass: one valid value (repeats
        // equal), checked against the body as it goes.
        let mut length = None;
        let mut bad_length = false;
        for (n, v) in req.headers {
            if n == HOST
                || (crate::conn_headers::may_strip(n)
                    && crate::conn_headers::is_connection_specific(n.as_str(), v.as_bytes()))
            {
                continue;
            }
            if n == CONTENT_LENGTH {
                match parse_length(v.as_bytes()) {
                    Some(l) if length.is_none_or(|o| o == l) => length = Some(l),
                    _ => bad_length = true,
                }
            }
            Encoder::field_raw(
                &mut block,
                n.as_str().as_bytes(),
                v.as_bytes(),
                v.is_sensitive(),
            );
        }
        if bad_length || (end && length.is_some_and(|l| l != 0)) {
            self.block = block;
            return Err((H2Error::RequestLength, body));
        }
        let id = self.next_id;
        self.next_id += 2;
        let before = self.out.len();
        let headers_start = self.queued_total;
        frame::put_headers(&mut self.out, id, &block, end, self.peer_max_frame);
        let headers_first = HEADER_LEN + block.len().min(self.peer_max_frame.max(1));
        self.queue_len_changed(before);
        self.block = block;
        let recv_window = if self.settings_acked {
            i64::from(self.cfg.stream_window)
        } else {
            i64::from(self.cfg.stream_window.max(DEFAULT_WINDOW))
        };
        self.ids.push(id);
        self.streams.push(Stream {
            id,
            send_window: self.peer_initial_window,
            body: Some(body),
            body_polled: false,
            pending: Bytes::new(),
            body_end: end,
            pending_trailers: None,
            send_done: end,
            length_left: length,
            headers_start,
            headers_end: self.queued_total,
            // At most HEADER_LEN + the largest MAX_FRAME_SIZE (2^24 - 1).
            headers_first: headers_first as u32,
            recv: Recv::Head { interim: 0 },
            head_request: *req.method == Method::HEAD,
            head: None,
            recv_window,
            unreleased: 0,
            data: VecDeque::new(),
            queued: 0,
            trailers: None,
            expect_len: None,
            received: 0,
            fault: None,
            response_started: false,
            waker: None,
        });
        self.idle_ticks = 0;
        self.wake_task();
        Ok(id)
    }

    /// The response head of stream `id`, its failure, or `Pending` (the waker kept).
    pub fn poll_head(&mut self, id: u32, cx: &mut Context<'_>) -> HeadPoll {
        let Some(i) = self.find(id) else {
            return HeadPoll::Failed(H2Error::Closed, None, false);
        };
        let s = &mut self.streams[i];
        if let Some(h) = s.head.take() {
            if s.closed() && s.fault.is_none() {
                let data = std::mem::take(&mut s.data);
                let trailers = s.trailers.take();
                // The stream's data leaves its window for the response body: credited now.
                self.remove(i);
                return HeadPoll::Whole(h, data, trailers);
            }
            return HeadPoll::Ready(h);
        }
        if let Some(f) = s.fault.take() {
            // Not processed by the backend: the body goes back when nothing was taken from it.
            // (A stream whose bytes never reached the transport was made `Refused` when the
            // connection failed, and its frames cut from the output then.)
            let refused = matches!(f, StreamFault::Refused);
            let closed = match &f {
                StreamFault::Refused => true,
                StreamFault::Conn(c) => c.is_disconnect() && !s.response_started,
                _ => false,
            };
            let body = if refused && !s.body_polled {
                s.body.take()
            } else {
                None
            };
            let err = stream_error(f);
            self.remove(i);
            return HeadPoll::Failed(err, body, closed || refused);
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        HeadPoll::Pending
    }

    /// The next frame of stream `id`'s response body (`Ready(None)`: the end).
    pub fn poll_body(
        &mut self,
        id: u32,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, H2Error>>> {
        let Some(i) = self.find(id) else {
            return Poll::Ready(None);
        };
        let s = &mut self.streams[i];
        if let Some(d) = s.data.pop_front() {
            s.queued -= d.len();
            self.release(i, d.len());
            return Poll::Ready(Some(Ok(http_body::Frame::data(d))));
        }
        if let Some(f) = s.fault.take() {
            self.remove(i);
            return Poll::Ready(Some(Err(stream_error(f))));
        }
        if s.recv == Recv::Done {
            if let Some(t) = s.trailers.take() {
                return Poll::Ready(Some(Ok(http_body::Frame::trailers(*t))));
            }
            return Poll::Ready(None);
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Whether stream `id`'s response body has nothing more to give.
    pub(crate) fn body_ended(&self, id: u32) -> bool {
        self.find(id).is_none_or(|i| {
            let s = &self.streams[i];
            s.recv == Recv::Done && s.data.is_empty() && s.trailers.is_none() && s.fault.is_none()
        })
    }

    /// The bytes of stream `id`'s body still to come, when its length is known.
    pub(crate) fn body_left(&self, id: u32) -> Option<u64> {
        let s = &self.streams[self.find(id)?];
        s.expect_len
            .map(|l| l.saturating_sub(s.received) + s.queued as u64)
    }

    /// The handle of stream `id` is gone: a stream still open is reset with CANCEL, its
    /// unread data credited back to the connection, and it is forgotten.
    pub fn drop_stream(&mut self, id: u32) {
        let Some(i) = self.find(id) else {
            return;
        };
        if !self.streams[i].closed() && self.fault.is_none() {
            let before = self.out.len();
            frame::put_rst(&mut self.out, id, Reason::CANCEL);
            self.queue_len_changed(before);
        }
        self.remove(i);
        self.wake_task();
    }

    /// Forgets stream `i`, crediting its unread data back to the connection.
    fn remove(&mut self, i: usize) {
        let s = self.streams.swap_remove(i);
        self.ids.swap_remove(i);
        self.conn_unreleased = self.conn_unreleased.saturating_add(s.queued as u32);
        self.grant_conn();
        if self.turn >= self.streams.len() {
            self.turn = 0;
        }
    }

    /// `n` bytes of stream `i` were consumed: window updates once half a window is due.
    fn release(&mut self, i: usize, n: usize) {
        let half = (self.cfg.stream_window / 2).max(1);
        let s = &mut self.streams[i];
        s.unreleased = s.unreleased.saturating_add(n as u32);
        let before = self.out.len();
        if s.recv != Recv::Done && s.unreleased >= half && self.fault.is_none() {
            let inc = std::mem::take(&mut s.unreleased);
            s.recv_window += i64::from(inc);
            frame::put_window_update(&mut self.out, s.id, inc);
        }
        self.conn_unreleased = self.conn_unreleased.saturating_add(n as u32);
        self.queue_len_changed(before);
        self.grant_conn();
    }

    fn grant_conn(&mut self) {
        let half = self.cfg.conn_window / 2;
        if self.conn_unreleased >= half.max(1) && self.fault.is_none() {
            let inc = std::mem::take(&mut self.conn_unreleased);
            self.conn_recv_window += i64::from(inc);
            let before = self.out.len();
            frame::put_window_update(&mut self.out, 0, inc);
            self.queue_len_changed(before);
        }
        if !self.out.is_empty() {
            self.wake_task();
        }
    }

    // ------------------------------------------------------------------ sending bodies

    /// Polls request bodies for data the windows allow and frames it, round robin, until
    /// the output passes [`WRITE_HIGH`] or nothing more can go (public for the fuzz target,
    /// which sends bodies without a transport).
    pub fn poll_send(&mut self, cx: &mut Context<'_>) {
        if self.fault.is_some() || self.streams.is_empty() {
            return;
        }
        let n = self.streams.len();
        let start = self.turn.min(n - 1);
        for k in 0..n {
            if self.out.len() >= WRITE_HIGH {
                self.turn = (start + k) % n;
                return;
            }
            let i = (start + k) % n;
            if !self.streams[i].send_done {
                self.send_stream(i, cx);
            }
        }
        // Streams may have been removed (failed bodies).
        self.turn = 0;
    }

    fn send_stream(&mut self, i: usize, cx: &mut Context<'_>) {
        loop {
            let before = self.out.len();
            let s = &mut self.streams[i];
            if s.send_done {
                return;
            }
            if !s.pending.is_empty() {
                let n = s
                    .pending
                    .len()
                    .min(s.send_window.max(0) as usize)
                    .min(self.conn_send_window.max(0) as usize)
                    .min(self.peer_max_frame.min(MAX_DATA_FRAME));
                if n == 0 {
                    return;
                }
                let chunk = s.pending.split_to(n);
                let end = s.pending.is_empty() && s.body_end && s.pending_trailers.is_none();
                frame::put_data(&mut self.out, s.id, &chunk, end);
                s.send_window -= n as i64;
                self.conn_send_window -= n as i64;
                s.send_done = end;
                self.queue_len_changed(before);
                if self.out.len() >= WRITE_HIGH {
                    return;
                }
                continue;
            }
            if s.body_end {
                match s.pending_trailers.take() {
                    Some(t) => {
                        let mut block = std::mem::take(&mut self.block);
                        block.clear();
                        self.encoder.begin_block(&mut block);
                        for (n, v) in t.iter() {
                            if !crate::conn_headers::may_strip(n)
                                && !crate::conn_headers::forbidden_trailer(n)
                            {
                                Encoder::field_raw(
                                    &mut block,
                                    n.as_str().as_bytes(),
                                    v.as_bytes(),
                                    v.is_sensitive(),
                                );
                            }
                        }
                        let id = self.streams[i].id;
                        frame::put_headers(&mut self.out, id, &block, true, self.peer_max_frame);
                        self.block = block;
                    }
                    None => frame::put_data(&mut self.out, s.id, &[], true),
                }
                self.streams[i].send_done = true;
                self.queue_len_changed(before);
                return;
            }
            if self.out.len() >= WRITE_HIGH {
                return;
            }
            let Some(body) = s.body.as_mut() else {
                return;
            };
            let polled = Pin::new(body).poll_frame(cx);
            match polled {
                Poll::Pending => return,
                Poll::Ready(None) => {
                    s.body = None;
                    s.body_polled = true;
                    s.body_end = true;
                    if s.length_left.is_some_and(|l| l != 0) {
                        return self.fail_request(i, StreamFault::RequestLength);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    s.body_polled = true;
                    return self.fail_request(i, StreamFault::RequestBody(e));
                }
                Poll::Ready(Some(Ok(f))) => {
                    s.body_polled = true;
                    match f.into_data() {
                        Ok(d) => {
                            if let Some(left) = s.length_left.as_mut() {
                                match left.checked_sub(d.len() as u64) {
                                    Some(l) => *left = l,
                                    None => {
                                        return self.fail_request(i, StreamFault::RequestLength)
                                    }
                                }
                            }
                            s.pending = d;
                            if s.body.as_ref().is_some_and(|b| b.is_end_stream()) {
                                s.body = None;
                                s.body_end = true;
                                if s.length_left.is_some_and(|l| l != 0) {
                                    return self.fail_request(i, StreamFault::RequestLength);
                                }
                            }
                        }
                        Err(f) => {
                            s.body = None;
                            s.body_end = true;
                            if s.length_left.is_some_and(|l| l != 0) {
                                return self.fail_request(i, StreamFault::RequestLength);
                            }
                            s.pending_trailers = f
                                .into_trailers()
                                .ok()
                                .filter(|t| !t.is_empty())
                                .map(Box::new);
                        }
                    }
                }
            }
        }
    }

    /// The request of stream `i` cannot go on: reset with CANCEL, the response fails.
    fn fail_request(&mut self, i: usize, why: StreamFault) {
        let before = self.out.len();
        let s = &mut self.streams[i];
        frame::put_rst(&mut self.out, s.id, Reason::CANCEL);
        self.queue_len_changed(before);
        self.end_stream(i, why);
    }

    /// Ends stream `i` with `why` (kept for its handle), both ways.
    fn end_stream(&mut self, i: usize, why: StreamFault) {
        let s = &mut self.streams[i];
        s.send_done = true;
        s.body_end = true;
        s.pending = Bytes::new();
        s.pending_trailers = None;
        s.recv = Recv::Done;
        if s.fault.is_none() {
            s.fault = Some(why);
        }
        if s.body_polled {
            s.body = None;
        }
        // Unread data is dropped with the error.
        let queued = std::mem::take(&mut s.queued);
        s.data.clear();
        s.trailers = None;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        self.conn_unreleased = self.conn_unreleased.saturating_add(queued as u32);
    }

    // ------------------------------------------------------------------ frames in

    /// Handles every complete frame in the read buffer (`now`: the clock of the read; `None`:
    /// read when a flood counter first needs it, which the usual frames never do).
    pub fn process(&mut self, now: Option<Instant>) {
        self.now = now;
        while self.fault.is_none() && self.rbuf.len() >= HEADER_LEN {
            let head = Head::parse(&self.rbuf);
            if head.len > LOCAL_MAX_FRAME {
                self.conn_error(
                    Reason::FRAME_SIZE_ERROR,
                    "frame larger than SETTINGS_MAX_FRAME_SIZE",
                );
                break;
            }
            let total = HEADER_LEN + head.len as usize;
            if self.rbuf.len() < total {
                self.rbuf.reserve(total - self.rbuf.len());
                break;
            }
            self.rbuf.advance(HEADER_LEN);
            let payload = self.rbuf.split_to(head.len as usize);
            self.frames_read += 1;
            let r = if !self.preface_seen && (head.kind != kind::SETTINGS || head.has(flag::ACK)) {
                Err(Err::Conn(
                    Reason::PROTOCOL_ERROR,
                    "the backend's first frame is not SETTINGS",
                ))
            } else {
                self.on_frame(head, payload)
            };
            match r {
                Ok(()) => {}
                Err(Err::Conn(reason, why)) => self.conn_error(reason, why),
                Err(Err::Stream(id, reason, why)) => self.stream_error(id, reason, why),
            }
        }
        if !self.out.is_empty() {
            self.wake_task();
        }
    }

    fn on_frame(&mut self, head: Head, payload: BytesMut) -> FResult {
        if let Some((id, ..)) = &self.cont {
            if head.kind != kind::CONTINUATION || head.stream != *id {
                return Err(Err::Conn(
                    Reason::PROTOCOL_ERROR,
                    "header block interrupted",
                ));
            }
        }
        match head.kind {
            kind::DATA => self.on_data(head, payload.freeze()),
            kind::HEADERS => self.on_headers(head, &payload),
            kind::CONTINUATION => self.on_continuation(head, &payload),
            kind::PRIORITY => {
                if head.stream == 0 {
                    return Err(Err::Conn(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if payload.len() != 5 {
                    return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "PRIORITY length"));
                }
                self.control()
            }
            kind::RST_STREAM => self.on_rst(head, &payload),
            kind::SETTINGS => self.on_settings(head, &payload),
            kind::PUSH_PROMISE => Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "PUSH_PROMISE with push disabled",
            )),
            kind::PING => {
                if head.stream != 0 {
                    return Err(Err::Conn(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                if payload.len() != 8 {
                    return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "PING length"));
                }
                self.control()?;
                if head.has(flag::ACK) {
                    self.ping_out = false;
                } else {
                    let before = self.out.len();
                    frame::put_ping_ack(&mut self.out, &payload);
                    self.queue_len_changed(before);
                }
                Ok(())
            }
            kind::GOAWAY => self.on_goaway(head, &payload),
            kind::WINDOW_UPDATE => self.on_window_update(head, &payload),
            _ => self.glitch(),
        }
    }

    /// The clock of the read being handled (read once, when first needed).
    fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(crate::conn::clock)
    }

    fn control(&mut self) -> FResult {
        let now = self.now();
        if self.flood.hit(now, |f| &mut f.control, MAX_CONTROL_PER_SEC) {
            return Err(Err::Conn(Reason::ENHANCE_YOUR_CALM, "control frame flood"));
        }
        Ok(())
    }

    fn empty(&mut self) -> FResult {
        let now = self.now();
        if self.flood.hit(now, |f| &mut f.empty, MAX_EMPTY_PER_SEC) {
            return Err(Err::Conn(Reason::ENHANCE_YOUR_CALM, "empty frame flood"));
        }
        Ok(())
    }

    fn glitch(&mut self) -> FResult {
        let now = self.now();
        if self
            .flood
            .hit(now, |f| &mut f.glitches, MAX_GLITCHES_PER_SEC)
        {
            return Err(Err::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "flood of frames that do nothing",
            ));
        }
        Ok(())
    }

    fn on_settings(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream != 0 {
            return Err(Err::Conn(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.has(flag::ACK) {
            if !payload.is_empty() {
                return Err(Err::Conn(
                    Reason::FRAME_SIZE_ERROR,
                    "SETTINGS ACK with a payload",
                ));
            }
            self.control()?;
            if !self.settings_acked {
                self.settings_acked = true;
                // Our stream window holds from now on (the backend may have used the
                // default before).
                let delta = i64::from(self.cfg.stream_window)
                    - i64::from(self.cfg.stream_window.max(DEFAULT_WINDOW));
                for s in &mut self.streams {
                    s.recv_window += delta;
                }
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "SETTINGS length"));
        }
        if self.preface_seen {
            self.control()?;
        }
        self.preface_seen = true;
        let mut initial_window = None;
        for (id, v) in frame::settings_params(payload) {
            match id {
                setting::ENABLE_PUSH if v != 0 => {
                    return Err(Err::Conn(
                        Reason::PROTOCOL_ERROR,
                        "a server's SETTINGS_ENABLE_PUSH must be 0",
                    ));
                }
                setting::MAX_CONCURRENT_STREAMS => self.peer_max_streams = v,
                setting::INITIAL_WINDOW_SIZE => {
                    if i64::from(v) > MAX_WINDOW {
                        return Err(Err::Conn(
                            Reason::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    // Applied once, after the frame: the last value holds (a frame of
                    // thousands of entries does not walk the streams for each).
                    initial_window = Some(i64::from(v));
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE).contains(&v) {
                        return Err(Err::Conn(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        ));
                    }
                    self.peer_max_frame = v as usize;
                }
                setting::ENABLE_CONNECT_PROTOCOL if v > 1 => {
                    return Err(Err::Conn(
                        Reason::PROTOCOL_ERROR,
                        "SETTINGS_ENABLE_CONNECT_PROTOCOL above 1",
                    ));
                }
                // HEADER_TABLE_SIZE: our encoder never inserts into the backend's table (its
                // first block sizes it to 0), so any value is honoured. MAX_HEADER_LIST_SIZE
                // is advisory. Unknown parameters are ignored (RFC 9113 §6.5.2).
                _ => {}
            }
        }
        if let Some(w) = initial_window {
            let delta = w - self.peer_initial_window;
            self.peer_initial_window = w;
            for s in &mut self.streams {
                s.send_window += delta;
                if s.send_window > MAX_WINDOW {
                    return Err(Err::Conn(
                        Reason::FLOW_CONTROL_ERROR,
                        "stream window above 2^31-1",
                    ));
                }
            }
        }
        let before = self.out.len();
        frame::put_settings_ack(&mut self.out);
        self.queue_len_changed(before);
        Ok(())
    }

    fn on_goaway(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream != 0 {
            return Err(Err::Conn(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
        }
        if payload.len() < 8 {
            return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "GOAWAY length"));
        }
        self.control()?;
        let last =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let reason = Reason(u32::from_be_bytes([
            payload[4], payload[5], payload[6], payload[7],
        ]));
        let last = self.goaway.map_or(last, |l| l.min(last));
        self.goaway = Some(last);
        if reason != Reason::NO_ERROR {
            self.goaway_reason = Some(reason);
        }
        // Streams above `last` were not processed: they may go again elsewhere. Their frames
        // not yet written leave the output first: the backend never sees a request its
        // client was told to send elsewhere.
        self.cut_streams_above(last);
        for i in (0..self.streams.len()).rev() {
            let s = &self.streams[i];
            if s.id > last && s.fault.is_none() {
                // A stream with a response frame already was seen: reset, not refused.
                let why = if s.response_started {
                    StreamFault::Reset(Reason::REFUSED_STREAM)
                } else {
                    StreamFault::Refused
                };
                self.end_stream(i, why);
            }
        }
        Ok(())
    }

    /// Removes from the output every frame not yet begun of the live streams above `last`.
    /// Their frames all follow their HEADERS (ids grow with the order of the queue, and no
    /// stream opens after a GOAWAY), so the output is walked frame by frame from the first of
    /// their HEADERS not begun (or the end of a HEADERS begun): a frame boundary. A stream an
    /// earlier GOAWAY (or any fault) ended is left out: its offsets may point into output
    /// queued since, inside a frame or past the end. Its frames are gone already, but for the
    /// rest of a header block whose first frame was written before the stream was refused
    /// (bb14e0a): those CONTINUATIONs stay, and they lie before the cut, since a block is
    /// queued whole and no other frame comes between its frames (RFC 9113 §6.10).
    fn cut_streams_above(&mut self, last: u32) {
        let w = self.written_total;
        let start = self
            .streams
            .iter()
            .filter(|s| s.id > last && s.fault.is_none())
            .filter_map(|s| {
                [s.headers_start, s.headers_end]
                    .into_iter()
                    .find(|&b| b >= w)
            })
            .min();
        let Some(at) = start
            .and_then(|s| usize::try_from(s - w).ok())
            .filter(|&at| at <= self.out.len())
        else {
            return;
        };
        let tail = self.out.split_off(at);
        let mut rest = &tail[..];
        while rest.len() >= HEADER_LEN {
            let h = Head::parse(rest);
            let n = (HEADER_LEN + h.len as usize).min(rest.len());
            if h.stream <= last {
                self.out.extend_from_slice(&rest[..n]);
            }
            rest = &rest[n..];
        }
        self.queued_total = w + self.out.len() as u64;
    }

    /// Cuts the output at the first HEADERS of a live stream none of whose bytes were
    /// written (a frame boundary; what follows goes too), for a connection that ends. The
    /// cut point, from which on the streams are `Refused`: the backend never gets them.
    fn cut_unwritten(&mut self) -> Option<u64> {
        let w = self.written_total;
        let cut = self
            .streams
            .iter()
            .filter(|s| s.fault.is_none() && s.headers_start >= w)
            .map(|s| s.headers_start)
            .min()?;
        self.out.truncate((cut - w) as usize);
        self.queued_total = cut;
        Some(cut)
    }

    fn on_rst(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream == 0 {
            return Err(Err::Conn(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "RST_STREAM length"));
        }
        if self.is_idle(head.stream) {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on an idle stream",
            ));
        }
        let now = self.now();
        if self.flood.hit(now, |f| &mut f.resets, MAX_RESETS_PER_SEC) {
            return Err(Err::Conn(Reason::ENHANCE_YOUR_CALM, "reset flood"));
        }
        let reason = Reason(u32::from_be_bytes([
            payload[0], payload[1], payload[2], payload[3],
        ]));
        let Some(i) = self.find(head.stream) else {
            return self.glitch();
        };
        if !self.sent(i) {
            // Taken as a refusal, the request would go elsewhere and then be written here all
            // the same.
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on a stream not yet sent",
            ));
        }
        let s = &mut self.streams[i];
        if s.recv == Recv::Done && s.fault.is_none() && reason == Reason::NO_ERROR {
            // The response is whole: the backend wants no more of the request (RFC 9113
            // §8.1).
            s.send_done = true;
            s.body = None;
            s.pending = Bytes::new();
            return Ok(());
        }
        if s.recv == Recv::Done && s.fault.is_none() && s.send_done {
            return self.glitch();
        }
        // Refused only before any frame of a response: once one came, the request was seen.
        let why = if reason == Reason::REFUSED_STREAM && !s.response_started {
            StreamFault::Refused
        } else {
            StreamFault::Reset(reason)
        };
        self.end_stream(i, why);
        Ok(())
    }

    fn on_window_update(&mut self, head: Head, payload: &[u8]) -> FResult {
        if payload.len() != 4 {
            return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE length"));
        }
        let inc = i64::from(
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff,
        );
        if head.stream == 0 {
            if inc == 0 {
                return Err(Err::Conn(Reason::PROTOCOL_ERROR, "zero WINDOW_UPDATE"));
            }
            self.conn_send_window += inc;
            if self.conn_send_window > MAX_WINDOW {
                return Err(Err::Conn(
                    Reason::FLOW_CONTROL_ERROR,
                    "connection window above 2^31-1",
                ));
            }
            return Ok(());
        }
        if self.is_idle(head.stream) {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        let Some(i) = self.find(head.stream) else {
            return self.glitch();
        };
        if !self.sent(i) {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on a stream not yet sent",
            ));
        }
        if self.streams[i].fault.is_some() {
            // A stream that already failed (reset, kept for its handle): nothing to do, and
            // no reset reflected per frame.
            return self.glitch();
        }
        if inc == 0 {
            return Err(Err::Stream(
                head.stream,
                Reason::PROTOCOL_ERROR,
                "zero WINDOW_UPDATE",
            ));
        }
        let s = &mut self.streams[i];
        s.send_window += inc;
        if s.send_window > MAX_WINDOW {
            return Err(Err::Stream(
                head.stream,
                Reason::FLOW_CONTROL_ERROR,
                "stream window above 2^31-1",
            ));
        }
        Ok(())
    }

    fn on_data(&mut self, head: Head, payload: Bytes) -> FResult {
        let id = head.stream;
        if id == 0 {
            return Err(Err::Conn(Reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        if self.is_idle(id) {
            return Err(Err::Conn(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let len = payload.len();
        self.conn_recv_window -= len as i64;
        if self.conn_recv_window < 0 {
            return Err(Err::Conn(
                Reason::FLOW_CONTROL_ERROR,
                "connection window exceeded",
            ));
        }
        let content = if head.has(flag::PADDED) {
            let Some(c) = frame::unpad(&payload) else {
                return Err(Err::Conn(Reason::PROTOCOL_ERROR, "bad padding"));
            };
            let n = c.len();
            payload.slice(1..1 + n)
        } else {
            payload
        };
        let end = head.has(flag::END_STREAM);
        if content.is_empty() && !end {
            self.empty()?;
        }
        let Some(i) = self.find(id) else {
            // A stream we closed: credited back. An empty one delivers nothing even in
            // flight (data in flight after our reset is bounded by the window; these are not).
            self.conn_unreleased = self.conn_unreleased.saturating_add(len as u32);
            self.grant_conn();
            if content.is_empty() {
                return self.glitch();
            }
            return Ok(());
        };
        if !self.sent(i) {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "DATA on a stream not yet sent",
            ));
        }
        let s = &mut self.streams[i];
        if s.recv != Recv::Body {
            self.conn_unreleased = self.conn_unreleased.saturating_add(len as u32);
            self.grant_conn();
            let s = &self.streams[i];
            if s.fault.is_some() {
                // Already failed (refused, reset by us): in flight, dropped.
                if content.is_empty() {
                    return self.glitch();
                }
                return Ok(());
            }
            return Err(match s.recv {
                Recv::Head { .. } => {
                    Err::Stream(id, Reason::PROTOCOL_ERROR, "DATA before the response head")
                }
                _ => Err::Stream(id, Reason::STREAM_CLOSED, "DATA after END_STREAM"),
            });
        }
        s.recv_window -= len as i64;
        if s.recv_window < 0 {
            self.conn_unreleased = self.conn_unreleased.saturating_add(len as u32);
            return Err(Err::Stream(
                id,
                Reason::FLOW_CONTROL_ERROR,
                "stream window exceeded",
            ));
        }
        let padding = len - content.len();
        s.received += content.len() as u64;
        if s.expect_len
            .is_some_and(|l| s.received > l || (end && s.received != l))
        {
            self.conn_unreleased = self.conn_unreleased.saturating_add(len as u32);
            return Err(Err::Stream(
                id,
                Reason::PROTOCOL_ERROR,
                "response body length differs from its content-length",
            ));
        }
        if !content.is_empty() {
            s.queued += content.len();
            s.data.push_back(content);
        }
        s.response_started = true;
        if end {
            s.recv = Recv::Done;
        }
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        if padding > 0 {
            // Padding is nobody's to consume: released at once.
            self.release(i, padding);
        }
        Ok(())
    }

    fn max_block(&self) -> usize {
        self.cfg.max_header_list as usize + 16 * 1024
    }

    fn on_headers(&mut self, head: Head, payload: &[u8]) -> FResult {
        let id = head.stream;
        if id == 0 {
            return Err(Err::Conn(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        if self.is_idle(id) {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "HEADERS on an idle stream",
            ));
        }
        let mut block = payload;
        if head.has(flag::PADDED) {
            block = frame::unpad(block).ok_or(Err::Conn(Reason::PROTOCOL_ERROR, "bad padding"))?;
        }
        if head.has(flag::PRIORITY) {
            if block.len() < 5 {
                return Err(Err::Conn(Reason::FRAME_SIZE_ERROR, "HEADERS priority"));
            }
            block = &block[5..];
        }
        if block.len() > self.max_block() {
            return Err(Err::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        let end = head.has(flag::END_STREAM);
        if head.has(flag::END_HEADERS) {
            return self.on_block(id, end, block);
        }
        if block.is_empty() {
            self.empty()?;
        }
        self.cont = Some((id, end, BytesMut::from(block), 0));
        Ok(())
    }

    fn on_continuation(&mut self, head: Head, payload: &[u8]) -> FResult {
        let max = self.max_block();
        let Some((_, _, block, frames)) = self.cont.as_mut() else {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without HEADERS",
            ));
        };
        *frames += 1;
        if *frames > MAX_CONTINUATIONS {
            return Err(Err::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "too many CONTINUATION frames",
            ));
        }
        if block.len() + payload.len() > max {
            return Err(Err::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        block.extend_from_slice(payload);
        if !head.has(flag::END_HEADERS) {
            if payload.is_empty() {
                self.empty()?;
            }
            return Ok(());
        }
        let (id, end, block, _) = self.cont.take().expect("checked above");
        self.on_block(id, end, &block)
    }

    fn on_block(&mut self, id: u32, end: bool, block: &[u8]) -> FResult {
        let i = self.find(id);
        if i.is_some_and(|i| !self.sent(i)) {
            return Err(Err::Conn(
                Reason::PROTOCOL_ERROR,
                "HEADERS on a stream not yet sent",
            ));
        }
        let trailers = i.is_some_and(|i| !matches!(self.streams[i].recv, Recv::Head { .. }));
        let live = i.is_some_and(|i| self.streams[i].fault.is_none());
        let max = self.cfg.max_header_list as usize;
        // A backend answers the same request with the same head, octet for octet, over and
        // over (nginx codes `server`, `date` and `content-type` as literals with incremental
        // indexing and never refers to its table): when the decoder finds this block repeats
        // the one before with the same fields and the same table after it (`Decoder::repeat`),
        // the head validated from that block's run is handed out again. Heads only: the
        // validation differs for trailers.
        let head = live && !trailers;
        let repeated = match head {
            true => self.kept.repeat(&mut self.decoder, block, max),
            false => Ok(None),
        };
        let (h, r) = match repeated {
            Ok(Some(k)) => {
                self.heads_repeated += 1;
                (k, Ok(()))
            }
            Err(e) => (ResponseBlock::default(), Err(e)),
            Ok(None) => {
                let mut h = ResponseBlock::default();
                let r = if live {
                    self.decoder.decode(block, max, |f| h.field(f, trailers))
                } else {
                    // Decoded all the same: the table must stay in step with the backend's.
                    self.decoder.decode(block, max, |_| {})
                };
                if head && r.is_ok() && h.malformed.is_none() {
                    self.kept.keep(&self.decoder, || h.clone());
                }
                (h, r)
            }
        };
        let too_large = match r {
            Ok(()) => false,
            Err(HpackError::ListTooLarge { .. }) => true,
            Err(e) => {
                tracing::debug!(error = %e, "HPACK decoding of a backend's block failed");
                return Err(Err::Conn(Reason::COMPRESSION_ERROR, "HPACK"));
            }
        };
        let Some(i) = i else {
            return self.glitch();
        };
        if !live {
            // A block on a stream that already failed: decoded for the table, nothing more.
            return self.glitch();
        }
        if too_large {
            return Err(Err::Stream(
                id,
                Reason::CANCEL,
                "response header list larger than the limit",
            ));
        }
        if let Some(why) = h.malformed {
            return Err(Err::Stream(id, Reason::PROTOCOL_ERROR, why));
        }
        let s = &mut self.streams[i];
        s.response_started = true;
        match s.recv {
            Recv::Head { interim } => {
                let Some(status) = h.status else {
                    return Err(Err::Stream(
                        id,
                        Reason::PROTOCOL_ERROR,
                        "response without :status",
                    ));
                };
                if (100..200).contains(&status) {
                    if status == 101 || end {
                        return Err(Err::Stream(
                            id,
                            Reason::PROTOCOL_ERROR,
                            "101 or an interim response ending the stream",
                        ));
                    }
                    if interim + 1 > MAX_INTERIM {
                        return Err(Err::Stream(
                            id,
                            Reason::PROTOCOL_ERROR,
                            "too many interim responses",
                        ));
                    }
                    s.recv = Recv::Head {
                        interim: interim + 1,
                    };
                    return Ok(());
                }
                if h.bad_length {
                    return Err(Err::Stream(
                        id,
                        Reason::PROTOCOL_ERROR,
                        "invalid content-length",
                    ));
                }
                s.expect_len = if s.head_request || status == 204 || status == 304 {
                    Some(0)
                } else {
                    h.length
                };
                if end && s.expect_len.is_some_and(|l| l != 0) {
                    return Err(Err::Stream(
                        id,
                        Reason::PROTOCOL_ERROR,
                        "response body length differs from its content-length",
                    ));
                }
                let mut resp = http::Response::new(());
                *resp.status_mut() = StatusCode::from_u16(status)
                    .map_err(|_| Err::Stream(id, Reason::PROTOCOL_ERROR, "invalid :status"))?;
                *resp.version_mut() = Version::HTTP_2;
                *resp.headers_mut() = h.headers;
                s.head = Some(resp.into_parts().0);
                s.recv = if end { Recv::Done } else { Recv::Body };
            }
            Recv::Body => {
                if !end {
                    return Err(Err::Stream(
                        id,
                        Reason::PROTOCOL_ERROR,
                        "trailers without END_STREAM",
                    ));
                }
                if s.expect_len.is_some_and(|l| l != s.received) {
                    return Err(Err::Stream(
                        id,
                        Reason::PROTOCOL_ERROR,
                        "response body length differs from its content-length",
                    ));
                }
                // Fields that may not be trailers are left out (RFC 9110 §6.5.1).
                let mut t = h.headers;
                let forbidden: Vec<HeaderName> = t
                    .keys()
                    .filter(|n| crate::conn_headers::forbidden_trailer(n))
                    .cloned()
                    .collect();
                for n in forbidden {
                    t.remove(n);
                }
                s.trailers = Some(Box::new(t));
                s.recv = Recv::Done;
            }
            Recv::Done => {
                return Err(Err::Stream(
                    id,
                    Reason::STREAM_CLOSED,
                    "HEADERS after END_STREAM",
                ));
            }
        }
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        Ok(())
    }

    // ------------------------------------------------------------------ errors, ends

    /// We reset stream `id` for `why`.
    fn stream_error(&mut self, id: u32, reason: Reason, why: &'static str) {
        tracing::debug!(stream = id, %reason, why, "HTTP/2 backend stream error");
        let before = self.out.len();
        frame::put_rst(&mut self.out, id, reason);
        self.queue_len_changed(before);
        if let Some(i) = self.find(id) {
            self.end_stream(i, StreamFault::Local(reason, why));
        }
    }

    /// A connection error: GOAWAY queued, every stream ends.
    pub(crate) fn conn_error(&mut self, reason: Reason, why: &'static str) {
        tracing::debug!(%reason, why, "HTTP/2 backend connection error");
        self.fail_with(Fault::Local(reason, why), Some((reason, why)));
    }

    /// The connection ended for `fault`: every stream ends with it (those the backend
    /// refused or never got keep that).
    pub(crate) fn fail(&mut self, fault: Fault) {
        self.fail_with(fault, None);
    }

    /// [`Core::fail`], with the GOAWAY to queue after the output is cut.
    fn fail_with(&mut self, fault: Fault, goaway: Option<(Reason, &'static str)>) {
        if self.fault.is_some() {
            return;
        }
        let fault = match (&fault, self.goaway_reason) {
            (Fault::Eof | Fault::Io(..), Some(r)) => Fault::Remote(r),
            _ => fault,
        };
        // Streams none of whose bytes were written are cut from the output and refused
        // (decided now: nothing of theirs is written later).
        let cut = self.cut_unwritten();
        if let Some((reason, why)) = goaway {
            let before = self.out.len();
            frame::put_goaway(&mut self.out, 0, reason, why.as_bytes());
            self.queue_len_changed(before);
        }
        self.fault = Some(fault.clone());
        for i in 0..self.streams.len() {
            let s = &mut self.streams[i];
            if s.fault.is_none() && s.recv != Recv::Done {
                let unsent = cut.is_some_and(|c| s.headers_start >= c) && !s.response_started;
                let why = if unsent {
                    StreamFault::Refused
                } else {
                    StreamFault::Conn(fault.clone())
                };
                self.end_stream(i, why);
            } else {
                // A whole response stays readable; nothing more goes out.
                s.send_done = true;
                s.body = None;
                s.pending = Bytes::new();
            }
        }
        self.rbuf = BytesMut::new();
        self.cont = None;
    }

    /// The connection may end: it failed, or the backend's GOAWAY came and every stream
    /// is done with.
    pub(crate) fn finished(&self) -> bool {
        self.fault.is_some() || (self.goaway.is_some() && self.streams.iter().all(Stream::closed))
    }

    /// One keep-alive tick (every [`super::TICK`]): a PING after three silent ticks with
    /// streams open, the connection failed when a fourth passes without a frame; a
    /// connection without streams for `idle_ticks` ticks closes (GOAWAY).
    pub(crate) fn tick(&mut self, idle_ticks: u32) {
        if self.fault.is_some() {
            return;
        }
        if self.frames_read == 0 {
            self.silent_ticks += 1;
        } else {
            self.silent_ticks = 0;
            self.ping_out = false;
        }
        self.frames_read = 0;
        if self.streams.is_empty() {
            self.idle_ticks += 1;
            self.silent_ticks = 0;
            self.ping_out = false;
            if self.idle_ticks >= idle_ticks {
                let before = self.out.len();
                frame::put_goaway(&mut self.out, 0, Reason::NO_ERROR, b"idle");
                self.queue_len_changed(before);
                self.fail(Fault::Idle);
            }
            return;
        }
        self.idle_ticks = 0;
        if self.ping_out && self.silent_ticks >= 4 {
            self.fail(Fault::KeepAlive);
        } else if self.silent_ticks >= 3 && !self.ping_out {
            self.ping_out = true;
            let before = self.out.len();
            frame::put_ping(&mut self.out, *b"sweety\0\0");
            self.queue_len_changed(before);
        }
    }

    /// `n` bytes of `out` reached the transport.
    pub(crate) fn wrote(&mut self, n: usize) {
        self.out.advance(n);
        self.written_total += n as u64;
    }
}

fn stream_error(f: StreamFault) -> H2Error {
    match f {
        StreamFault::Refused => H2Error::Refused,
        StreamFault::Reset(r) => H2Error::StreamReset(r),
        StreamFault::Local(r, why) => H2Error::Stream(r, why),
        StreamFault::Conn(c) => c.to_error(),
        StreamFault::RequestBody(e) => H2Error::RequestBody(e),
        StreamFault::RequestLength => H2Error::RequestLength,
    }
}
