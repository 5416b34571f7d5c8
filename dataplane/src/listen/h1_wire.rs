//! HTTP/1.1 request framing as it came on the wire, for what hyper does not tell the pipeline:
//! a request head with both `Content-Length` and `Transfer-Encoding` (issue 16).
//!
//! hyper reads such a request as chunked (RFC 9112 §6.3: Transfer-Encoding overrides
//! Content-Length), removes `Content-Length` from the head it hands over and closes the
//! connection after the response. The request itself would still be routed and answered (a
//! 405 from a static route, a chunked upload to a backend). RFC 9112 §6.1 lets a server refuse
//! it; an edge must, as HAProxy and nginx do, because a backend or a proxy in front that reads
//! the other header frames the bytes differently (CL.TE / TE.CL smuggling). So
//! [`identity::establish`](crate::identity::establish) refuses it with 400 when the request
//! carries the [`ConflictingFraming`] mark this module's caller sets.
//!
//! [`Observed`] wraps a connection's reader and feeds every byte read to a [`Tracker`], which
//! follows the request stream as hyper does: a head (parsed with httparse, like hyper), then a
//! body of `Content-Length` bytes or chunked, then the next head. The first head with both
//! fields is recorded by its 1-based number on the connection ([`Wire::conflict_at`]); the
//! service numbers the requests hyper hands it ([`Wire::next_request`]) and marks that one.
//! hyper closes the connection after it, so no later head matters and tracking stops there.
//!
//! Tracking also stops, without marking anything, at whatever it does not follow exactly: an
//! upgrade or CONNECT (the bytes after it may be a tunnel), a head that does not parse, more
//! than [`MAX_HEAD`] bytes of head, a malformed chunk. Where it stopped is recorded
//! ([`Wire::untracked`]): the service ends the connection after answering that request (unless
//! the answer hands the connection over: 101, a CONNECT tunnel), so no later head goes
//! unchecked; hyper's own strict framing covers the request itself. The tracker keeps at most
//! [`MAX_HEAD`] bytes (the head being read), whatever the client sends.

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest request head followed (hyper's own read buffer limit is about 400 KiB; the
/// dataplane's `max_header_bytes` is far below).
pub const MAX_HEAD: usize = 256 * 1024;

/// Header fields a head may have for the tracker to follow it (hyper's default is 100).
const MAX_FIELDS: usize = 128;

pub use crate::identity::ConflictingFraming;

/// What a connection's [`Observed`] reader and its service share.
#[derive(Debug)]
pub struct Wire {
    /// The 1-based number of the first head with both framing fields; 0 for none yet.
    conflict: AtomicU64,
    /// Requests handed to the service so far.
    served: AtomicU64,
    /// The 1-based number of the head at which the tracker stopped following the stream (an
    /// upgrade, CONNECT, a conflict, or a head it does not follow exactly; the last head read
    /// when the stopping one was never counted); 0 while it follows. Later heads would go
    /// unchecked.
    untracked: AtomicU64,
}

impl Wire {
    /// A fresh connection's.
    pub fn new() -> Arc<Wire> {
        Arc::new(Wire {
            conflict: AtomicU64::new(0),
            served: AtomicU64::new(0),
            untracked: AtomicU64::new(0),
        })
    }

    /// Counts one request handed to the service; true when it is the one whose head had both
    /// framing fields. hyper hands HTTP/1.1 requests over one at a time, in wire order, and
    /// only after reading their heads (so the tracker has seen them).
    pub fn next_request(&self) -> bool {
        let n = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        self.conflict.load(Ordering::Relaxed) == n
    }

    /// Requests handed to the service so far (the number of the latest).
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Whether request `n` (1-based) is at or past the head where the tracker stopped: the
    /// service then ends the connection after its response (fail closed: no later request
    /// goes unchecked), unless the response hands the connection over (101, CONNECT tunnel).
    pub fn untracked(&self, n: u64) -> bool {
        let at = self.untracked.load(Ordering::Relaxed);
        at != 0 && n >= at
    }

    /// The 1-based number of the first head with both framing fields, if one was seen.
    pub fn conflict_at(&self) -> Option<u64> {
        match self.conflict.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a head (bytes kept in `head`).
    Head,
    /// Skipping a body of this many bytes.
    Fixed(u64),
    /// At the start of a chunk-size line; `size` accumulates its hex digits.
    Size { size: u64, digits: u8 },
    /// In a chunk extension or the whitespace after the size, up to the line's end.
    SizeRest { size: u64 },
    /// Skipping chunk data, then its CRLF.
    Data(u64),
    /// After chunk data: expecting CR or LF.
    DataEnd { cr: bool },
    /// After the last chunk: at the start of a trailer line (an empty line ends the body).
    TrailerStart { cr: bool },
    /// Inside a trailer line.
    Trailer,
    /// Not following any more (see the module docs).
    Off,
}

/// Follows a connection's request stream (see the module docs).
#[derive(Debug)]
pub struct Tracker {
    state: State,
    head: Vec<u8>,
    heads: u64,
    wire: Arc<Wire>,
}

impl Tracker {
    /// A tracker at the start of a connection, reporting to `wire`.
    pub fn new(wire: Arc<Wire>) -> Tracker {
        Tracker {
            state: State::Head,
            head: Vec::new(),
            heads: 0,
            wire,
        }
    }

    /// True once the tracker has stopped following the stream.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// Heads read in full so far.
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// Feeds the bytes read next.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.state {
                State::Off => break,
                State::Head => {
                    let n = self.feed_head(data);
                    data = &data[n..];
                }
                State::Fixed(left) => {
                    let n = (data.len() as u64).min(left);
                    data = &data[n as usize..];
                    self.state = if n == left {
                        State::Head
                    } else {
                        State::Fixed(left - n)
                    };
                }
                State::Data(left) => {
                    let n = (data.len() as u64).min(left);
                    data = &data[n as usize..];
                    self.state = if n == left {
                        State::DataEnd { cr: false }
                    } else {
                        State::Data(left - n)
                    };
                }
                _ => {
                    let b = data[0];
                    data = &data[1..];
                    self.state = self.chunk_byte(b);
                }
            }
        }
        if self.state == State::Off {
            let at = self.heads.max(1);
            let _ =
                self.wire
                    .untracked
                    .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// One byte of chunked framing (not chunk data).
    fn chunk_byte(&self, b: u8) -> State {
        match self.state {
            State::Size { size, digits } => match hex(b) {
                // More than 16 hex digits overflow (hyper refuses them).
                Some(_) if digits == 16 => State::Off,
                Some(d) => State::Size {
                    size: size << 4 | u64::from(d),
                    digits: digits + 1,
                },
                None if digits == 0 => State::Off,
                None => self.size_rest(size, b),
            },
            State::SizeRest { size } => self.size_rest(size, b),
            State::DataEnd { cr: false } if b == b'\r' => State::DataEnd { cr: true },
            State::DataEnd { .. } if b == b'\n' => State::Size { size: 0, digits: 0 },
            State::TrailerStart { cr: false } if b == b'\r' => State::TrailerStart { cr: true },
            State::TrailerStart { .. } if b == b'\n' => State::Head,
            State::TrailerStart { cr: false } => State::Trailer,
            State::Trailer if b == b'\n' => State::TrailerStart { cr: false },
            State::Trailer => State::Trailer,
            _ => State::Off,
        }
    }

    /// A byte after a chunk size's digits: its extension, whitespace or line end.
    fn size_rest(&self, size: u64, b: u8) -> State {
        match b {
            b'\n' if size == 0 => State::TrailerStart { cr: false },
            b'\n' => State::Data(size),
            // CR, whitespace and an extension (`;name=value`) up to the line's end; a bare CR
            // or a control character in it is hyper's error (the connection closes).
            b'\r' | b' ' | b'\t' | b';' | 0x21..=0x7e | 0x80..=0xff => State::SizeRest { size },
            _ => State::Off,
        }
    }

    /// Head bytes; returns how many of `data` were taken.
    fn feed_head(&mut self, data: &[u8]) -> usize {
        if self.head.is_empty() {
            // The common case: the whole head came in this read. Parse it where it is, without
            // copying it or scanning for its end first; anything else (a head split across
            // reads, one that does not parse) takes the path below, as if this one was not
            // tried. The outcome is the same: a head httparse completes ends at the first
            // empty line after its leading empty lines, which the path below finds and parses
            // in one or more steps (`same_outcome_whole_or_byte_by_byte` checks it).
            let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
            let mut req = httparse::Request::new(&mut []);
            if let Ok(httparse::Status::Complete(n)) =
                req.parse_with_uninit_headers(data, &mut fields)
            {
                if n <= MAX_HEAD {
                    self.state = self.head_state(&req);
                    return n;
                }
            }
        }
        // The head ends at the first empty line: look for "\n\n" or "\n\r\n" across the
        // bytes kept and the new ones, parsing only when one is there.
        let start = self.head.len().saturating_sub(2);
        let room = MAX_HEAD.saturating_sub(self.head.len());
        let take = data.len().min(room);
        self.head.extend_from_slice(&data[..take]);
        let Some(end) = blank_line_end(&self.head, start) else {
            if self.head.len() >= MAX_HEAD {
                self.stop();
            }
            return take;
        };
        let kept = self.head.len() - take;
        let used = end.saturating_sub(kept);
        let head = std::mem::take(&mut self.head);
        self.state = self.parse_head(&head[..end]);
        self.head = head;
        self.head.clear();
        used
    }

    /// The state after a complete head (`head` ends with its empty line).
    fn parse_head(&mut self, head: &[u8]) -> State {
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut []);
        match req.parse_with_uninit_headers(head, &mut fields) {
            Ok(httparse::Status::Complete(n)) if n == head.len() => self.head_state(&req),
            // Leading empty lines only (hyper skips them): still before a head.
            Ok(httparse::Status::Partial) if head.iter().all(|b| matches!(b, b'\r' | b'\n')) => {
                State::Head
            }
            _ => State::Off,
        }
    }

    /// The state after the complete head `req`.
    fn head_state(&mut self, req: &httparse::Request<'_, '_>) -> State {
        // An upgrade or CONNECT may turn the connection into a tunnel after this head.
        let mut upgrade = req.method == Some("CONNECT");
        let mut length: Option<u64> = None;
        let mut cl = false;
        let mut bad_cl = false;
        let mut te = false;
        for f in req.headers.iter() {
            if f.name.eq_ignore_ascii_case("transfer-encoding") {
                te = true;
            } else if f.name.eq_ignore_ascii_case("content-length") {
                // Any Content-Length counts for the conflict, even one hyper would not parse
                // (after Transfer-Encoding hyper skips it unread).
                cl = true;
                match crate::identity::content_length(f.value) {
                    Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                    _ => bad_cl = true,
                }
            } else if f.name.eq_ignore_ascii_case("upgrade") {
                upgrade = true;
            }
        }
        self.heads += 1;
        if te && cl {
            // The request after this head is this connection's last (hyper closes it).
            let _ = self.wire.conflict.compare_exchange(
                0,
                self.heads,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return State::Off;
        }
        if upgrade || bad_cl {
            return State::Off;
        }
        match (te, length) {
            (true, _) => State::Size { size: 0, digits: 0 },
            (false, Some(0) | None) => State::Head,
            (false, Some(n)) => State::Fixed(n),
        }
    }

    fn stop(&mut self) {
        self.state = State::Off;
        self.head = Vec::new();
    }
}

/// The end (exclusive) of the first empty line in `b` found at or after `from`.
fn blank_line_end(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < b.len() {
        if b[i] == b'\n' {
            if b.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

pin_project_lite::pin_project! {
    /// A connection whose reads are followed by a [`Tracker`] (writes pass through).
    pub struct Observed<I> {
        #[pin]
        inner: I,
        tracker: Tracker,
    }
}

impl<I> Observed<I> {
    /// Wraps `inner`, reporting to `wire`.
    pub fn new(inner: I, wire: Arc<Wire>) -> Observed<I> {
        Observed {
            inner,
            tracker: Tracker::new(wire),
        }
    }
}

impl<I: AsyncRead> AsyncRead for Observed<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.inner.poll_read(cx, buf);
        if !this.tracker.is_off() {
            this.tracker.feed(&buf.filled()[before..]);
        }
        r
    }
}

impl<I: AsyncWrite> AsyncWrite for Observed<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `input` in pieces of `step` bytes; returns the tracker and its wire.
    fn run(input: &[u8], step: usize) -> (Tracker, Arc<Wire>) {
        let wire = Wire::new();
        let mut t = Tracker::new(wire.clone());
        for piece in input.chunks(step.max(1)) {
            t.feed(piece);
        }
        (t, wire)
    }

    const KEEPALIVE: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n\
        POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
        POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\n\
        GET /last HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn follows_fixed_and_chunked_bodies_at_any_split() {
        for step in [1, 2, 3, 7, 64, 4096] {
            let (t, wire) = run(KEEPALIVE, step);
            assert_eq!(t.heads(), 4, "step {step}");
            assert!(!t.is_off(), "step {step}");
            assert_eq!(wire.conflict_at(), None);
        }
    }

    #[test]
    fn both_framing_fields_mark_that_request_in_either_order() {
        for conflict in [
            &b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            b"POST /x HTTP/1.1\r\nHost: a\r\ncontent-length: 0\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            // A Content-Length hyper skips unread after Transfer-Encoding, and an upgrade.
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: abc\r\n\r\n",
            b"POST /x HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let mut input = KEEPALIVE.to_vec();
            input.extend_from_slice(conflict);
            input.extend_from_slice(b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n");
            for step in [1, 5, 4096] {
                let (t, wire) = run(&input, step);
                assert_eq!(wire.conflict_at(), Some(5), "the fifth request, step {step}");
                assert!(t.is_off(), "nothing after it is followed");
                for n in 1..=5 {
                    assert_eq!(wire.next_request(), n == 5, "request {n}");
                }
            }
        }
    }

    #[test]
    fn upgrades_connect_and_bad_heads_stop_tracking_without_a_mark() {
        for input in [
            &b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"[..],
            b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
            b"GET / HTTP/9.9\r\nHost: a\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            let mut input = input.to_vec();
            input.extend_from_slice(
                b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            let (t, wire) = run(&input, 3);
            assert!(t.is_off(), "{:?}", String::from_utf8_lossy(&input));
            assert_eq!(wire.conflict_at(), None);
        }
    }

    #[test]
    fn leading_empty_lines_are_skipped_like_hyper_does() {
        let (t, _) = run(
            b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            1,
        );
        assert_eq!(t.heads(), 2);
        assert!(!t.is_off());
    }

    #[test]
    fn an_endless_head_is_not_kept() {
        let wire = Wire::new();
        let mut t = Tracker::new(wire);
        t.feed(b"GET / HTTP/1.1\r\n");
        let line = [b'a'; 1024];
        for _ in 0..(MAX_HEAD / 1024 + 2) {
            t.feed(&line);
        }
        assert!(t.is_off());
        assert!(t.head.capacity() == 0, "the buffer is freed");
        // A complete head longer than MAX_HEAD in one read is not followed either, whole or
        // in pieces; one of MAX_HEAD bytes exactly is.
        for (len, followed) in [(MAX_HEAD + 1, false), (MAX_HEAD, true)] {
            let mut head = b"GET / HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
            head.resize(len - 4, b'a');
            head.extend_from_slice(b"\r\n\r\n");
            assert_eq!(head.len(), len);
            for step in [len, 4096, 1] {
                let (t, wire) = run(&head, step);
                assert_eq!(!t.is_off(), followed, "{len} bytes in pieces of {step}");
                assert_eq!(
                    t.heads(),
                    u64::from(followed),
                    "{len} bytes in pieces of {step}"
                );
                assert_eq!(wire.untracked(1), !followed);
            }
        }
    }

    /// Every cut of a stream into two reads (so a head split at every byte, the rest coming
    /// whole) ends where reading it whole does: heads, conflict, where tracking stopped.
    #[test]
    fn a_cut_at_every_byte_changes_nothing() {
        let mut inputs = vec![KEEPALIVE.to_vec()];
        let mut conflict = KEEPALIVE.to_vec();
        conflict.extend_from_slice(
            b"\r\nPOST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
              0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        );
        inputs.push(conflict);
        inputs.push(
            b"GET / HTTP/1.1\nHost: a\n\nGET /b HTTP/1.1\r\nX: 1\r\n \tfolded\r\n\r\n".to_vec(),
        );
        for input in &inputs {
            let (whole, w1) = run(input, input.len());
            for cut in 0..=input.len() {
                let wire = Wire::new();
                let mut t = Tracker::new(wire.clone());
                t.feed(&input[..cut]);
                t.feed(&input[cut..]);
                assert_eq!(t.heads(), whole.heads(), "cut at {cut}");
                assert_eq!(t.state, whole.state, "cut at {cut}");
                assert_eq!(wire.conflict_at(), w1.conflict_at(), "cut at {cut}");
                for n in 1..=whole.heads() + 1 {
                    assert_eq!(wire.untracked(n), w1.untracked(n), "cut at {cut}");
                }
            }
        }
    }

    /// A line end, mostly CRLF (a head then parses), sometimes LF, a bare CR or none.
    fn line_end() -> impl Strategy<Value = &'static [u8]> {
        proptest::sample::select(vec![&b"\r\n"[..], b"\r\n", b"\r\n", b"\n", b"\r", b""])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// However the bytes are split, the tracker ends in the same place: head count,
        /// conflict and whether it still follows the stream.
        #[test]
        fn splits_do_not_change_the_outcome(
            cut in proptest::collection::vec(1usize..40, 1..20),
            tail in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut input = KEEPALIVE.to_vec();
            input.extend_from_slice(&tail);
            let (whole, w1) = run(&input, input.len());
            let wire = Wire::new();
            let mut t = Tracker::new(wire.clone());
            let mut rest = &input[..];
            for c in cut.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let n = (*c).min(rest.len());
                t.feed(&rest[..n]);
                rest = &rest[n..];
            }
            prop_assert_eq!(t.heads(), whole.heads());
            prop_assert_eq!(t.is_off(), whole.is_off());
            prop_assert_eq!(wire.conflict_at(), w1.conflict_at());
        }

        /// A head that comes whole in one read is parsed where it is; fed one byte at a time,
        /// it is kept, its end found, then parsed. Both end in the same place on any stream
        /// of requests built from head-like pieces (leading empty lines, bare CR or LF line
        /// ends, framing fields, upgrades, CONNECT, bodies, junk): state, bytes kept, heads,
        /// conflict, where tracking stopped.
        #[test]
        fn same_outcome_whole_or_byte_by_byte(
            messages in proptest::collection::vec(
                (
                    proptest::collection::vec(proptest::sample::select(vec![&b"\r\n"[..], b"\n"]), 0..2),
                    proptest::sample::select(vec![
                        &b"GET / HTTP/1.1"[..], b"POST /x HTTP/1.0", b"CONNECT a:1 HTTP/1.1",
                        b"GET /v HTTP/9.9", b"", b" GET / HTTP/1.1", b"GET  / HTTP/1.1",
                    ]),
                    proptest::collection::vec(
                        (
                            proptest::sample::select(vec![
                                &b"Host: a"[..], b"Content-Length: 3", b"content-length: 0",
                                b"Content-Length: 1, 1", b"Transfer-Encoding: chunked",
                                b"Upgrade: x", b"X: y", b"X : y", b"\x00: 1", b"Y:\xff",
                                b" folded", b"\tfolded",
                            ]),
                            line_end(),
                        ),
                        0..5,
                    ),
                    line_end(),
                    line_end(),
                    proptest::sample::select(vec![
                        &b""[..], b"abc", b"0\r\n\r\n", b"3;e\r\nabc\r\n0\r\nT: 1\r\n\r\n",
                        b"\r\n", b"\xff", b"zz\r\n",
                    ]),
                ),
                1..6,
            ),
        ) {
            let mut pieces: Vec<&[u8]> = Vec::new();
            for (leading, start, fields, end, blank, body) in &messages {
                pieces.extend(leading);
                pieces.push(start);
                pieces.push(end);
                for (f, e) in fields {
                    pieces.push(f);
                    pieces.push(e);
                }
                pieces.push(blank);
                pieces.push(body);
            }
            let input = pieces.concat();
            let (whole, w1) = run(&input, input.len());
            let (bytes, w2) = run(&input, 1);
            prop_assert_eq!(whole.state, bytes.state);
            prop_assert_eq!(&whole.head, &bytes.head);
            prop_assert_eq!(whole.heads(), bytes.heads());
            prop_assert_eq!(w1.conflict_at(), w2.conflict_at());
            for n in 1..=whole.heads() + 1 {
                prop_assert_eq!(w1.untracked(n), w2.untracked(n));
            }
        }
    }
}
