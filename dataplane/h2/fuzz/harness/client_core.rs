//! The `client_core` fuzz target's harness, shared with `sweety-h2`'s tests of the committed
//! seeds and its property tests (`tests/client_core.rs`): the client connection's state
//! ([`sweety_h2::client::core::Core`], no transport) given a backend's bytes for a few open
//! requests.
//!
//! Input: one byte of options (bits 0-1: requests opened before the bytes, 1 to 4; bit 2: the
//! first is a HEAD; bit 3: prepend a valid SETTINGS so the fuzzer starts past the preface;
//! bits 4-7: how the bytes are cut into reads), then the backend's bytes.
//!
//! Oracle: the bytes fed whole and fed cut into reads give the same outcome (each stream's
//! head, body bytes, trailers or error; the connection's fault), the responses read only at
//! the end in both runs (reading grants window, which changes what the backend may send);
//! a third run reads the streams after every read, for panics and bounds. Bounds checked
//! after every read: less than one frame left unhandled, each stream's unread bytes within
//! the largest window we grant, all of them within the connection window, the output we
//! owe within 64 KiB, each head's fields within the header list bound.
//!
//! A fourth run ([`drive_late`]) lets the requests race the backend's bytes: nothing is
//! written before the first read, the last request (of two or more) has a body larger than
//! the default window, one more request opens after the first read, and the output is taken
//! (written) only after every other read. Oracle: every take is whole frames, and once a
//! stream was reported refused (`H2Error::Refused`: the caller may send it elsewhere), no
//! HEADERS, CONTINUATION or DATA frame of it is ever written.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method};
use std::task::{Context, Poll, Waker};
use std::time::Instant;
use sweety_h2::client::core::{Config, Core, HeadPoll, RequestHead, LOCAL_MAX_FRAME, WRITE_HIGH};
use sweety_h2::frame::{self, HEADER_LEN};
use sweety_h2::H2Error;

/// The bounds of the harness's connections (small, so the fuzzer reaches them).
pub(crate) const CONFIG: Config = Config {
    stream_window: 16 * 1024,
    conn_window: 96 * 1024,
    max_header_list: 2048,
};

/// A head's or trailer block's fields, in order.
pub(crate) type Fields = Vec<(String, Vec<u8>)>;

/// What became of one stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Outcome {
    /// `:status` and the fields of the final head.
    pub(crate) head: Option<(u16, Fields)>,
    /// The body's bytes.
    pub(crate) data: Vec<u8>,
    /// The trailer fields.
    pub(crate) trailers: Option<Fields>,
    /// The error that ended it.
    pub(crate) error: Option<String>,
    /// The body came to its end.
    pub(crate) ended: bool,
}

/// Every stream's outcome and the connection's fault.
pub(crate) type Run = (Vec<Outcome>, Option<String>);

fn fields(h: &HeaderMap) -> Fields {
    h.iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// A valid SETTINGS frame (no parameters): the backend's preface.
pub(crate) fn preface() -> Vec<u8> {
    let mut b = BytesMut::new();
    frame::put_settings(&mut b, &[]);
    b.to_vec()
}

/// Reads what stream `id` has into `o` (the head first); true once it is done with.
fn read_stream(core: &mut Core, id: u32, o: &mut Outcome, cx: &mut Context<'_>) -> bool {
    if o.ended || o.error.is_some() {
        return true;
    }
    if o.head.is_none() {
        match core.poll_head(id, cx) {
            HeadPoll::Pending => return false,
            HeadPoll::Failed(e, _, _) => {
                o.error = Some(e.to_string());
                return true;
            }
            HeadPoll::Ready(parts) => {
                let f = fields(&parts.headers);
                check_list(&f);
                o.head = Some((parts.status.as_u16(), f));
            }
            HeadPoll::Whole(parts, data, trailers) => {
                let f = fields(&parts.headers);
                check_list(&f);
                o.head = Some((parts.status.as_u16(), f));
                for d in data {
                    o.data.extend_from_slice(&d);
                }
                o.trailers = trailers.as_deref().map(fields);
                o.ended = true;
                return true;
            }
        }
    }
    loop {
        match core.poll_body(id, cx) {
            Poll::Pending => return false,
            Poll::Ready(None) => {
                o.ended = true;
                core.drop_stream(id);
                return true;
            }
            Poll::Ready(Some(Err(e))) => {
                o.error = Some(e.to_string());
                core.drop_stream(id);
                return true;
            }
            Poll::Ready(Some(Ok(f))) => match f.into_data() {
                Ok(d) => o.data.extend_from_slice(&d),
                Err(f) => {
                    let t = f.into_trailers().expect("data or trailers");
                    o.trailers = Some(fields(&t));
                }
            },
        }
    }
}

/// A head's fields are within the header list bound.
fn check_list(f: &Fields) {
    let list: usize = f.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
    assert!(
        list <= CONFIG.max_header_list as usize,
        "a head of {list} octets passed the {} bound",
        CONFIG.max_header_list
    );
}

/// What we may owe the backend after a read, the output taken after each read: its
/// acknowledgements.
const OWED: usize = 64 * 1024;

/// The bounds that hold after every read, with at most `owed` bytes for the backend.
fn check_bounds(core: &Core, owed: usize) {
    if core.fault().is_none() {
        assert!(
            core.read_buffered() < HEADER_LEN + LOCAL_MAX_FRAME as usize,
            "{} bytes left unhandled",
            core.read_buffered()
        );
    }
    let most = CONFIG.stream_window.max(frame::DEFAULT_WINDOW) as usize;
    let mut all = 0;
    for (id, n) in core.stream_buffered() {
        assert!(n <= most, "stream {id} holds {n} unread bytes");
        all += n;
    }
    assert!(all <= CONFIG.conn_window as usize, "{all} unread bytes");
    assert!(
        core.output_len() <= owed,
        "{} bytes owed",
        core.output_len()
    );
}

/// One run: `streams` requests opened (the first a HEAD when `head`), `input` fed in pieces
/// of the sizes `cuts` cycles through (none: whole), the streams read after every piece when
/// `eager`, else once at the end.
pub(crate) fn drive(streams: usize, head: bool, input: &[u8], cuts: &[usize], eager: bool) -> Run {
    let mut core = Core::new(CONFIG);
    let none = HeaderMap::new();
    let mut ids = Vec::new();
    for i in 0..streams {
        let req = RequestHead {
            method: if head && i == 0 {
                &Method::HEAD
            } else {
                &Method::GET
            },
            scheme: "http",
            authority: b"backend.test",
            path: "/",
            headers: &none,
        };
        match core.open(&req, sweety_h2::empty()) {
            Ok(id) => ids.push(id),
            Err(_) => unreachable!("a new connection takes a stream"),
        }
    }
    // The preface and the requests reach the backend before it answers (else a failure
    // would refuse them, unwritten, in one run and not in the other).
    drop(core.take_output());
    let mut outcomes = vec![Outcome::default(); ids.len()];
    let mut cx = Context::from_waker(Waker::noop());
    // One clock reading for the whole run: the flood counters see one second.
    let now = Instant::now();
    let mut at = 0;
    let mut k = 0;
    while at < input.len() {
        let n = if cuts.is_empty() {
            input.len()
        } else {
            k += 1;
            cuts[(k - 1) % cuts.len()].max(1)
        };
        let end = (at + n).min(input.len());
        core.feed(&input[at..end]);
        at = end;
        core.process(Some(now));
        check_bounds(&core, OWED);
        if eager {
            for (o, id) in outcomes.iter_mut().zip(&ids) {
                read_stream(&mut core, *id, o, &mut cx);
            }
        }
        // What we owe the backend goes out.
        drop(core.take_output());
    }
    for (o, id) in outcomes.iter_mut().zip(&ids) {
        read_stream(&mut core, *id, o, &mut cx);
    }
    (outcomes, core.fault().map(|f| format!("{f:?}")))
}

/// The request body of [`drive_late`]'s last request: more than the default stream window.
const LATE_BODY: usize = 70_000;

/// The frames written so far, parsed: the ids of the request frames (HEADERS, CONTINUATION,
/// DATA) of each take.
struct Written {
    /// The preface is still to come (the first take starts with it).
    preface: bool,
    /// Streams reported refused.
    refused: Vec<u32>,
}

impl Written {
    /// Takes what `core` owes the backend (written now): whole frames, none of a request
    /// reported refused.
    fn take(&mut self, core: &mut Core) {
        let out = core.take_output();
        let mut rest = &out[..];
        if self.preface && !rest.is_empty() {
            assert!(rest.starts_with(frame::PREFACE), "no preface: {out:02x?}");
            rest = &rest[frame::PREFACE.len()..];
            self.preface = false;
        }
        while !rest.is_empty() {
            assert!(rest.len() >= HEADER_LEN, "a partial frame head: {out:02x?}");
            let h = frame::Head::parse(rest);
            let n = HEADER_LEN + h.len as usize;
            assert!(rest.len() >= n, "a partial frame: {out:02x?}");
            let request = matches!(
                h.kind,
                frame::kind::HEADERS | frame::kind::CONTINUATION | frame::kind::DATA
            );
            assert!(
                !(request && self.refused.contains(&h.stream)),
                "stream {} was reported refused, then its {} frame written",
                h.stream,
                h.kind
            );
            rest = &rest[n..];
        }
    }
}

/// The run of the requests racing the backend's bytes (see the module docs): `streams`
/// requests opened (the first a HEAD when `head`, the last a POST with a body when there are
/// two or more), `input` fed in pieces of the sizes `cuts` cycles through, the streams read
/// and the bodies polled after every piece, the output written after every other piece.
pub(crate) fn drive_late(streams: usize, head: bool, input: &[u8], cuts: &[usize]) {
    let mut core = Core::new(CONFIG);
    let none = HeaderMap::new();
    let open = |core: &mut Core, i: usize, last: bool| {
        let method = match (i, last) {
            (0, _) if head => &Method::HEAD,
            (_, true) => &Method::POST,
            _ => &Method::GET,
        };
        let body = if last {
            sweety_h2::boxed(http_body_util::Full::new(Bytes::from(vec![
                b'x';
                LATE_BODY
            ])))
        } else {
            sweety_h2::empty()
        };
        let req = RequestHead {
            method,
            scheme: "http",
            authority: b"backend.test",
            path: "/",
            headers: &none,
        };
        core.open(&req, body).ok()
    };
    let mut ids = Vec::new();
    for i in 0..streams {
        ids.extend(open(&mut core, i, streams > 1 && i + 1 == streams));
    }
    let mut outcomes = vec![Outcome::default(); ids.len()];
    let mut written = Written {
        preface: true,
        refused: Vec::new(),
    };
    let refused = H2Error::Refused.to_string();
    let mut cx = Context::from_waker(Waker::noop());
    let now = Instant::now();
    let (mut at, mut k) = (0, 0);
    let mut step = |core: &mut Core, ids: &[u32], outcomes: &mut [Outcome], write: bool| {
        for (o, id) in outcomes.iter_mut().zip(ids) {
            read_stream(core, *id, o, &mut cx);
            if o.error.as_deref() == Some(refused.as_str()) && !written.refused.contains(id) {
                written.refused.push(*id);
            }
        }
        core.poll_send(&mut cx);
        if write {
            written.take(core);
        }
    };
    while at < input.len() {
        k += 1;
        let n = cuts[(k - 1) % cuts.len()].max(1);
        let end = (at + n).min(input.len());
        core.feed(&input[at..end]);
        at = end;
        core.process(Some(now));
        // Two reads' acknowledgements, and request bodies up to the output mark and a frame.
        check_bounds(&core, 2 * OWED + WRITE_HIGH + HEADER_LEN + 16 * 1024);
        if k == 1 {
            // One more request, opened after the backend's first bytes.
            if let Some(id) = open(&mut core, streams, false) {
                ids.push(id);
                outcomes.push(Outcome::default());
            }
        }
        step(&mut core, &ids, &mut outcomes, k % 2 == 0);
    }
    step(&mut core, &ids, &mut outcomes, true);
}

/// The fuzz target's body (see the module docs for the input).
pub(crate) fn run(data: &[u8]) {
    let Some((&opts, rest)) = data.split_first() else {
        return;
    };
    let streams = usize::from(opts & 3) + 1;
    let head = opts & 4 != 0;
    let mut input = Vec::with_capacity(rest.len() + 9);
    if opts & 8 != 0 {
        input.extend_from_slice(&preface());
    }
    input.extend_from_slice(rest);
    let cut = usize::from(opts >> 4);
    let cuts: Vec<usize> = [
        1, 2, 3, 5, 7, 9, 13, 17, 31, 64, 100, 257, 1000, 4099, 9, 10,
    ]
    .iter()
    .cycle()
    .skip(cut)
    .take(5)
    .copied()
    .collect();
    let whole = drive(streams, head, &input, &[], false);
    let split = drive(streams, head, &input, &cuts, false);
    assert_eq!(
        whole, split,
        "the same bytes cut into reads ({cuts:?}) differ"
    );
    drive(streams, head, &input, &cuts, true);
    drive_late(streams, head, &input, &cuts);
}

/// A response's frames for stream `id`: a head (`status`, `fields`), body pieces, optional
/// trailers, cut into HEADERS/CONTINUATION of at most `max_block` octets.
#[allow(dead_code)] // the property tests' (not the fuzz target's)
pub(crate) fn response_frames(
    id: u32,
    status: u16,
    head_fields: &[(String, String)],
    body: &[Bytes],
    trailers: Option<&[(String, String)]>,
    max_block: usize,
) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut block = BytesMut::new();
    sweety_h2::hpack::Encoder::status(&mut block, status);
    for (n, v) in head_fields {
        sweety_h2::hpack::Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
    }
    let end_at_head = body.is_empty() && trailers.is_none();
    frame::put_headers(&mut out, id, &block, end_at_head, max_block);
    for (i, d) in body.iter().enumerate() {
        let last = i + 1 == body.len() && trailers.is_none();
        frame::put_data(&mut out, id, d, last);
    }
    if let Some(t) = trailers {
        let mut block = BytesMut::new();
        for (n, v) in t {
            sweety_h2::hpack::Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
        }
        frame::put_headers(&mut out, id, &block, true, max_block);
    }
    out.to_vec()
}
