//! Differential test (issue 16): the same HTTP/2 frame sequences, written by hand, sent over
//! real sockets to the dataplane with `limits.http2_engine: sweety` and with `hyper`. The
//! class of outcome (a response and its status, a stream error, a connection error) must
//! agree, or the row is listed in [`DIFFERENCES`] with the reason (and then it must still
//! differ, so the list stays true). The table covers valid requests, malformed
//! pseudo-headers, connection-specific fields, content-length mismatches, frames on closed,
//! idle and even streams, window overflows, oversized frames, bad SETTINGS, CONTINUATION
//! misuse, PRIORITY self-dependency, bad padding and HPACK errors. Each row runs on a fresh
//! connection, bounded in time.

mod common;

use bytes::Bytes;
use common::h2 as raw2;
use common::h2::{frame, literal_field, Event};
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use sweety_config::*;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// What a client saw for a row: the strongest of what happened, a connection error before a
/// stream error before a response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    /// The watched stream got a response with this status, and no error followed.
    Response(u16),
    /// RST_STREAM (its code) and the connection went on.
    Stream(u32),
    /// GOAWAY with an error code, or the connection closed without one (`u32::MAX`).
    Conn(u32),
    /// Nothing of the above within the bound.
    Nothing,
}

impl Class {
    /// The class of outcome without its detail (status or code).
    fn kind(&self) -> &'static str {
        match self {
            Class::Response(_) => "response",
            Class::Stream(_) => "stream error",
            Class::Conn(_) => "connection error",
            Class::Nothing => "nothing",
        }
    }

    /// Whether two outcomes agree: the same class, and for responses the same status.
    fn agrees(&self, other: &Class) -> bool {
        match (self, other) {
            (Class::Response(a), Class::Response(b)) => a == b,
            _ => self.kind() == other.kind(),
        }
    }
}

/// Rows whose outcomes differ between the engines, and why; every other row must agree.
/// In each, both engines refuse; Sweety's engine answers with the stream error RFC 9113
/// asks for, hyper's (the `h2` crate, 0.4) ends the whole connection.
const DIFFERENCES: &[(&str, &str)] = &[
    (
        "DATA after END_STREAM",
        "RFC 9113 §5.1: DATA on a half-closed (remote) stream is a stream error STREAM_CLOSED \
         (Sweety); h2 ends the connection with PROTOCOL_ERROR for any DATA it does not expect \
         (proto/streams/recv.rs, whose own comment says it could be STREAM_CLOSED)",
    ),
    (
        "PRIORITY of 4 bytes",
        "RFC 9113 §6.3: a PRIORITY frame of other than 5 octets is a stream error \
         FRAME_SIZE_ERROR (Sweety); h2 makes every PRIORITY it cannot load, except a \
         self-dependency, a connection error PROTOCOL_ERROR (codec/framed_read.rs)",
    ),
    (
        "unknown pseudo-header",
        "RFC 9113 §8.3, §8.1.1: an undefined pseudo-header makes the request malformed, a \
         stream error PROTOCOL_ERROR (Sweety); h2 fails the header block and ends the \
         connection with PROTOCOL_ERROR",
    ),
    (
        "upper-case field name",
        "RFC 9113 §8.2.1: an upper-case field name makes the request malformed, a stream \
         error (Sweety); h2's HPACK decoder cannot make a header name of it and ends the \
         connection with PROTOCOL_ERROR",
    ),
    (
        "zero WINDOW_UPDATE on a stream",
        "RFC 9113 §6.9: a zero increment on a stream is a stream error PROTOCOL_ERROR \
         (Sweety); h2 rejects the frame while parsing it, before it looks at the stream, and \
         ends the connection (frame/window_update.rs)",
    ),
];

/// One frame sequence (sent after the preface, an empty SETTINGS and the ACK of the
/// server's) and the stream whose response it watches.
struct Row {
    name: &'static str,
    frames: Vec<u8>,
    watch: u32,
}

/// A request's fields: GET / on http://localhost, with `edit` applied (fields added,
/// removed or changed, in order).
fn fields(edit: impl FnOnce(&mut Vec<(&'static str, String)>)) -> Vec<u8> {
    let mut f: Vec<(&'static str, String)> = vec![
        (":method", "GET".into()),
        (":scheme", "http".into()),
        (":path", "/".into()),
        (":authority", "localhost".into()),
    ];
    edit(&mut f);
    let mut block = Vec::new();
    for (n, v) in &f {
        literal_field(&mut block, n, v.as_bytes());
    }
    block
}

fn set(f: &mut Vec<(&'static str, String)>, name: &'static str, value: &str) {
    match f.iter_mut().find(|(n, _)| *n == name) {
        Some(e) => e.1 = value.into(),
        None => f.push((name, value.into())),
    }
}

fn remove(f: &mut Vec<(&'static str, String)>, name: &str) {
    f.retain(|(n, _)| *n != name);
}

/// A POST to the proxied `/up` with the fields of `edit`.
fn post(edit: impl FnOnce(&mut Vec<(&'static str, String)>)) -> Vec<u8> {
    fields(|f| {
        set(f, ":method", "POST");
        set(f, ":path", "/up");
        edit(f);
    })
}

/// HEADERS carrying `block` on `stream`, in one frame.
fn headers(stream: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let flags = raw2::END_HEADERS | if end_stream { raw2::END_STREAM } else { 0 };
    frame(raw2::HEADERS, flags, stream, block)
}

fn get(stream: u32) -> Vec<u8> {
    headers(stream, &fields(|_| {}), true)
}

fn data(stream: u32, payload: &[u8], end_stream: bool) -> Vec<u8> {
    let flags = if end_stream { raw2::END_STREAM } else { 0 };
    frame(raw2::DATA, flags, stream, payload)
}

fn window_update(stream: u32, inc: u32) -> Vec<u8> {
    frame(raw2::WINDOW_UPDATE, 0, stream, &inc.to_be_bytes())
}

fn settings(params: &[(u16, u32)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (id, v) in params {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    frame(raw2::SETTINGS, 0, 0, &p)
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

fn row(name: &'static str, frames: Vec<u8>) -> Row {
    Row {
        name,
        frames,
        watch: 1,
    }
}

fn rows() -> Vec<Row> {
    let hello = b"hello".to_vec();
    let mut rows = vec![
        // Valid requests.
        row("GET", get(1)),
        row(
            "POST with content-length and its body",
            cat(&[
                headers(1, &post(|f| set(f, "content-length", "5")), false),
                data(1, &hello, true),
            ]),
        ),
        row(
            "POST without content-length",
            cat(&[headers(1, &post(|_| {}), false), data(1, &hello, true)]),
        ),
        row(
            "POST with trailers",
            cat(&[
                headers(1, &post(|_| {}), false),
                data(1, &hello, false),
                headers(
                    1,
                    &{
                        let mut b = Vec::new();
                        literal_field(&mut b, "x-trailer", b"1");
                        b
                    },
                    true,
                ),
            ]),
        ),
        row("header block split over CONTINUATION", {
            let block = fields(|_| {});
            let (a, b) = block.split_at(block.len() / 2);
            cat(&[
                frame(raw2::HEADERS, raw2::END_STREAM, 1, a),
                frame(raw2::CONTINUATION, raw2::END_HEADERS, 1, b),
            ])
        }),
        row(
            "unknown frame type, then GET",
            cat(&[frame(0x20, 0, 0, b"whatever"), get(1)]),
        ),
        row("padded HEADERS", {
            let mut p = vec![4u8];
            p.extend(fields(|_| {}));
            p.extend([0u8; 4]);
            frame(
                raw2::HEADERS,
                raw2::END_HEADERS | raw2::END_STREAM | raw2::PADDED,
                1,
                &p,
            )
        }),
        row(
            "PRIORITY for an idle stream, then GET",
            cat(&[frame(raw2::PRIORITY, 0, 3, &[0, 0, 0, 0, 16]), get(1)]),
        ),
        row(
            "te: trailers",
            headers(1, &fields(|f| set(f, "te", "trailers")), true),
        ),
        // Malformed requests (RFC 9113 §8.1.1, §8.3): stream errors.
        row(
            "no :method",
            headers(1, &fields(|f| remove(f, ":method")), true),
        ),
        row(
            "no :path",
            headers(1, &fields(|f| remove(f, ":path")), true),
        ),
        row(
            "empty :path",
            headers(1, &fields(|f| set(f, ":path", "")), true),
        ),
        row(
            "no :scheme",
            headers(1, &fields(|f| remove(f, ":scheme")), true),
        ),
        row(
            "two :path fields",
            headers(1, &fields(|f| f.push((":path", "/x".into()))), true),
        ),
        row(
            "pseudo-header after a regular field",
            headers(
                1,
                &fields(|f| {
                    remove(f, ":authority");
                    f.push(("x-a", "1".into()));
                    f.push((":authority", "localhost".into()));
                }),
                true,
            ),
        ),
        row(
            "unknown pseudo-header",
            headers(1, &fields(|f| f.push((":foo", "bar".into()))), true),
        ),
        row(
            ":status in a request",
            headers(1, &fields(|f| f.push((":status", "200".into()))), true),
        ),
        row(
            "upper-case field name",
            headers(1, &fields(|f| f.push(("X-Upper", "1".into()))), true),
        ),
        row(
            "connection: keep-alive",
            headers(1, &fields(|f| set(f, "connection", "keep-alive")), true),
        ),
        row(
            "te: gzip",
            headers(1, &fields(|f| set(f, "te", "gzip")), true),
        ),
        row(
            "transfer-encoding: chunked",
            headers(1, &fields(|f| set(f, "transfer-encoding", "chunked")), true),
        ),
        row(
            "upgrade: h2c",
            headers(1, &fields(|f| set(f, "upgrade", "h2c")), true),
        ),
        row(
            "CONNECT with :path and :scheme",
            headers(1, &fields(|f| set(f, ":method", "CONNECT")), true),
        ),
        // Content-length against the DATA frames (RFC 9113 §8.1.1).
        row(
            "content-length 5, 3 bytes of DATA",
            cat(&[
                headers(1, &post(|f| set(f, "content-length", "5")), false),
                data(1, b"hel", true),
            ]),
        ),
        row(
            "content-length 3, 5 bytes of DATA",
            cat(&[
                headers(1, &post(|f| set(f, "content-length", "3")), false),
                data(1, &hello, true),
            ]),
        ),
        row(
            "content-length 5 on HEADERS with END_STREAM",
            headers(1, &post(|f| set(f, "content-length", "5")), true),
        ),
        row(
            "content-length not a number",
            cat(&[
                headers(1, &post(|f| set(f, "content-length", "5x")), false),
                data(1, &hello, true),
            ]),
        ),
        // Stream states (RFC 9113 §5.1).
        row("DATA on stream 0", data(0, &hello, false)),
        row("DATA on an idle stream", data(1, &hello, true)),
        row(
            "DATA after END_STREAM",
            cat(&[get(1), data(1, &hello, true)]),
        ),
        row("HEADERS on an even stream", get(2)),
        Row {
            name: "stream ids going down",
            frames: cat(&[get(3), get(1)]),
            watch: 1,
        },
        row(
            "RST_STREAM on an idle stream",
            frame(raw2::RST_STREAM, 0, 1, &raw2::CANCEL.to_be_bytes()),
        ),
        row(
            "PUSH_PROMISE from a client",
            cat(&[
                headers(1, &post(|_| {}), false),
                frame(raw2::PUSH_PROMISE, raw2::END_HEADERS, 1, &{
                    let mut p = 2u32.to_be_bytes().to_vec();
                    p.extend(fields(|_| {}));
                    p
                }),
            ]),
        ),
        // Flow control (RFC 9113 §6.9).
        row(
            "connection window overflow",
            cat(&[window_update(0, 0x7fff_ffff), get(1)]),
        ),
        row(
            "stream window overflow",
            cat(&[
                headers(1, &post(|_| {}), false),
                window_update(1, 0x7fff_ffff),
            ]),
        ),
        row(
            "zero WINDOW_UPDATE on a stream",
            cat(&[headers(1, &post(|_| {}), false), window_update(1, 0)]),
        ),
        row(
            "zero WINDOW_UPDATE on the connection",
            cat(&[window_update(0, 0), get(1)]),
        ),
        row(
            "WINDOW_UPDATE of 5 bytes",
            cat(&[frame(raw2::WINDOW_UPDATE, 0, 0, &[0, 0, 0, 1, 0]), get(1)]),
        ),
        // Frame sizes (RFC 9113 §4.2).
        row(
            "DATA larger than SETTINGS_MAX_FRAME_SIZE",
            cat(&[
                headers(1, &post(|_| {}), false),
                data(1, &vec![b'x'; 16_385], true),
            ]),
        ),
        row(
            "HEADERS larger than SETTINGS_MAX_FRAME_SIZE",
            headers(1, &fields(|f| f.push(("x-big", "y".repeat(16_400)))), true),
        ),
        // SETTINGS (RFC 9113 §6.5).
        row(
            "SETTINGS length not a multiple of 6",
            cat(&[frame(raw2::SETTINGS, 0, 0, &[0, 4, 0, 0, 0]), get(1)]),
        ),
        row("ENABLE_PUSH 2", cat(&[settings(&[(0x2, 2)]), get(1)])),
        row(
            "INITIAL_WINDOW_SIZE 2^31",
            cat(&[settings(&[(0x4, 1 << 31)]), get(1)]),
        ),
        row(
            "MAX_FRAME_SIZE below 16384",
            cat(&[settings(&[(0x5, 100)]), get(1)]),
        ),
        row(
            "SETTINGS on a stream",
            cat(&[frame(raw2::SETTINGS, 0, 1, &[]), get(1)]),
        ),
        row(
            "SETTINGS ACK with a payload",
            cat(&[
                frame(raw2::SETTINGS, raw2::ACK, 0, &[0, 4, 0, 0, 0, 1]),
                get(1),
            ]),
        ),
        // CONTINUATION (RFC 9113 §6.10).
        row(
            "CONTINUATION without HEADERS",
            frame(raw2::CONTINUATION, raw2::END_HEADERS, 1, &fields(|_| {})),
        ),
        row("DATA inside a header block", {
            let block = fields(|_| {});
            let (a, b) = block.split_at(block.len() / 2);
            cat(&[
                frame(raw2::HEADERS, 0, 1, a),
                data(1, b"x", false),
                frame(raw2::CONTINUATION, raw2::END_HEADERS, 1, b),
            ])
        }),
        row("CONTINUATION of another stream", {
            let block = fields(|_| {});
            let (a, b) = block.split_at(block.len() / 2);
            cat(&[
                frame(raw2::HEADERS, raw2::END_STREAM, 1, a),
                frame(raw2::CONTINUATION, raw2::END_HEADERS, 3, b),
            ])
        }),
        // PRIORITY (RFC 9113 §5.3.1: a stream cannot depend on itself).
        row(
            "PRIORITY depending on its own stream",
            cat(&[
                headers(1, &post(|_| {}), false),
                frame(raw2::PRIORITY, 0, 1, &[0, 0, 0, 1, 16]),
            ]),
        ),
        row("HEADERS with a priority on its own stream", {
            let mut p = vec![0, 0, 0, 1, 16];
            p.extend(fields(|_| {}));
            frame(
                raw2::HEADERS,
                raw2::END_HEADERS | raw2::END_STREAM | raw2::PRIORITY_FLAG,
                1,
                &p,
            )
        }),
        row(
            "PRIORITY of 4 bytes",
            cat(&[
                headers(1, &post(|_| {}), false),
                frame(raw2::PRIORITY, 0, 1, &[0, 0, 0, 0]),
            ]),
        ),
        // Other frames.
        row(
            "PING of 7 bytes",
            cat(&[frame(raw2::PING, 0, 0, &[0; 7]), get(1)]),
        ),
        row(
            "PING on a stream",
            cat(&[frame(raw2::PING, 0, 1, &[0; 8]), get(1)]),
        ),
        row("padding longer than the HEADERS payload", {
            let mut p = vec![200u8];
            p.extend(fields(|_| {}));
            frame(
                raw2::HEADERS,
                raw2::END_HEADERS | raw2::END_STREAM | raw2::PADDED,
                1,
                &p,
            )
        }),
        row(
            "HPACK index past both tables",
            headers(1, &[0x80 | 0x3e], true),
        ),
        row("HPACK index 0", headers(1, &[0x80], true)),
    ];
    rows.sort_by_key(|r| r.name);
    rows
}

/// Sends `row` on a fresh connection and classifies what came back. A PING after the row's
/// frames marks where the server has read them all; the watch ends when the stream's
/// response has ended or an error came, or 500 ms after the PING's ACK, or at 5 s.
async fn run(addr: SocketAddr, row: &Row) -> Class {
    let (mut rd, mut wr) = raw2::open(addr).await;
    // The server's SETTINGS first (`until` acknowledges them), so that the row is read under them.
    rd.until(
        &mut wr,
        "the server's SETTINGS",
        |e| matches!(e, Event::Frame(f) if f.ty == raw2::SETTINGS && f.flags & raw2::ACK == 0),
    )
    .await;
    let mut out = row.frames.clone();
    out.extend(frame(raw2::PING, 0, 0, b"sentinel"));
    let _ = wr.write_all(&out).await;
    let end = Instant::now() + Duration::from_secs(5);
    let (mut status, mut reset, mut finished, mut acked) = (None, None, false, None);
    loop {
        let deadline = match acked {
            Some(at) => end.min(at + Duration::from_millis(500)),
            None => end,
        };
        let f = match rd.next(deadline).await {
            Event::Frame(f) => f,
            Event::Closed => return Class::Conn(u32::MAX),
            Event::Timeout => break,
        };
        match f.ty {
            raw2::SETTINGS if f.flags & raw2::ACK == 0 => {
                let _ = wr
                    .write_all(&frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                    .await;
            }
            raw2::GOAWAY if f.error_code() != raw2::NO_ERROR => {
                return Class::Conn(f.error_code());
            }
            raw2::RST_STREAM => reset = Some(f.error_code()),
            raw2::HEADERS if f.stream == row.watch => {
                status = status.or(f.status);
                finished |= f.flags & raw2::END_STREAM != 0;
            }
            raw2::DATA if f.stream == row.watch => finished |= f.flags & raw2::END_STREAM != 0,
            raw2::PING if f.flags & raw2::ACK != 0 && f.payload == b"sentinel" => {
                acked = Some(Instant::now());
            }
            _ => {}
        }
        if acked.is_some() && (finished || reset.is_some()) {
            break;
        }
    }
    match (reset, status) {
        (Some(code), _) => Class::Stream(code),
        (None, Some(s)) => Class::Response(s),
        (None, None) => Class::Nothing,
    }
}

/// An HTTP/1.1 backend that reads the request body and answers 200 `up`.
async fn reading_backend() -> SocketAddr {
    spawn_backend(|s| async move {
        let svc = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async {
            let _ = req.into_body().collect().await;
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"up"))))
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), svc)
            .await;
    })
    .await
}

async fn start(engine: Http2Engine, be: SocketAddr) -> (Harness, SocketAddr) {
    let mut cfg = http_config(vec![vhost(
        "v",
        &[],
        vec![
            proxy_route("up", "/up", "be"),
            fixed_route("root", "/", "ok\n"),
        ],
    )]);
    cfg.backends = vec![backend("be", be)];
    cfg.limits.http2_engine = engine;
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr)
}

#[tokio::test]
async fn both_http2_engines_agree_on_the_class_of_outcome() {
    let be = reading_backend().await;
    let (_sweety, sweety_addr) = start(Http2Engine::Sweety, be).await;
    let (_hyper, hyper_addr) = start(Http2Engine::Hyper, be).await;
    let rows = rows();
    let mut table = Vec::new();
    let mut fails = Vec::new();
    for r in &rows {
        let ours = run(sweety_addr, r).await;
        let theirs = run(hyper_addr, r).await;
        let listed = DIFFERENCES.iter().find(|(n, _)| *n == r.name);
        table.push(format!(
            "{:<48} sweety {ours:<18?} hyper {theirs:?}",
            r.name
        ));
        if ours == Class::Nothing || theirs == Class::Nothing {
            fails.push(format!(
                "{}: no outcome (sweety {ours:?}, hyper {theirs:?})",
                r.name
            ));
        }
        match (ours.agrees(&theirs), listed) {
            (true, None) => {}
            (false, Some(_)) => {}
            (false, None) => fails.push(format!(
                "{}: sweety {ours:?}, hyper {theirs:?} (not listed)",
                r.name
            )),
            (true, Some(_)) => fails.push(format!(
                "{}: listed as a difference but both give {ours:?}",
                r.name
            )),
        }
    }
    println!("{}", table.join("\n"));
    for (name, _) in DIFFERENCES {
        assert!(
            rows.iter().any(|r| r.name == *name),
            "DIFFERENCES names an unknown row: {name}"
        );
    }
    assert!(rows.len() >= 40, "{} rows", rows.len());
    assert!(
        fails.is_empty(),
        "{}\n\n{}",
        fails.join("\n"),
        table.join("\n")
    );
}
