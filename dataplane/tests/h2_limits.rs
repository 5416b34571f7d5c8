//! HTTP/2 abuse cases against a running dataplane (h2c, prior knowledge), with the raw client
//! of `common::h2` that writes frames by hand: rapid reset, CONTINUATION flood, SETTINGS and
//! PING floods, oversized header lists, WINDOW_UPDATE overflow on the connection and on a
//! stream, output and work bounds per read and per poll, timeouts.
//!
//! Each test asserts what the server really sends back (a GOAWAY and its code, a RST_STREAM,
//! a 431, or a closed connection) and that a fresh, normal request still succeeds afterwards.
//! They run on Sweety's own HTTP/2 engine (`limits.http2_engine: sweety`);
//! `SWEETY_TEST_H2_ENGINE=hyper` runs them on hyper's, except the few that test what only
//! Sweety's engine does (they set the engine themselves: the stalled header block, 431s
//! counted as resets, and the ones that drive the engine over a socket directly).
//! Every flood is bounded in frame count and in time.

mod common;

use common::h2::*;
use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use sweety_dataplane::hpack::Decoder;
use sweety_dataplane::pipeline::H2Pipeline;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// The request header list limit the tests configure (`limits.max_header_bytes`).
const MAX_HEADER_BYTES: u32 = 16 * 1024;

/// A backend that accepts connections and never answers, so a stream proxied to it stays open.
async fn silent_backend() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded: the tests open a handful of backend connections.
        while held.len() < 64 {
            let Ok((s, _)) = l.accept().await else { break };
            held.push(s);
        }
    });
    addr
}

async fn start() -> (Harness, SocketAddr) {
    start_with(|_| {}).await
}

/// [`start`] with some limits changed.
async fn start_with(limits: impl FnOnce(&mut sweety_config::Limits)) -> (Harness, SocketAddr) {
    let silent = silent_backend().await;
    let mut cfg = http_config(vec![vhost(
        "any",
        &[],
        vec![
            fixed_route("ok", "/", "ok"),
            proxy_route("hang", "/hang", "silent"),
        ],
    )]);
    cfg.backends = vec![backend("silent", silent)];
    cfg.limits.max_header_bytes = MAX_HEADER_BYTES;
    cfg.limits.http2_engine = if std::env::var("SWEETY_TEST_H2_ENGINE").as_deref() == Ok("hyper") {
        sweety_config::Http2Engine::Hyper
    } else {
        sweety_config::Http2Engine::Sweety
    };
    limits(&mut cfg.limits);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr)
}

/// Whether the tests that do not choose an engine run on Sweety's (the env's choice): what
/// it answers is asserted exactly (GOAWAY codes), hyper's only in general.
fn sweety_engine() -> bool {
    std::env::var("SWEETY_TEST_H2_ENGINE").as_deref() != Ok("hyper")
}

/// A fresh connection with an ordinary client still gets its answer.
async fn fresh_request_succeeds(addr: SocketAddr) {
    let got = get(&h2c_client(), &format!("http://{addr}/"), None).await;
    assert_eq!(
        got,
        Ok((200, "ok".to_string())),
        "a normal request after the abuse"
    );
}

/// Reads until the server ends the connection: a GOAWAY (its code) or a close. Panics if the
/// connection is still up after the phase bound.
async fn until_goaway_or_close(
    rd: &mut Reader,
    wr: &mut OwnedWriteHalf,
    what: &str,
) -> Option<Frame> {
    match rd
        .until(wr, what, |e| {
            matches!(e, Event::Frame(f) if f.ty == GOAWAY) || matches!(e, Event::Closed)
        })
        .await
    {
        Event::Frame(f) => Some(f),
        _ => None,
    }
}

/// HEADERS then RST_STREAM(CANCEL), 5000 times in a row: the server must end the connection
/// (GOAWAY with an error code, or a close) before the loop is over, and keep serving others.
#[tokio::test]
async fn rapid_reset_ends_the_abusive_connection() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    const PAIRS: u32 = 5000;
    let block = request_block("/");
    let mut batch = Vec::new();
    let mut write_failed = false;
    let sent = timeout(PHASE, async {
        for i in 0..PAIRS {
            let id = 2 * i + 1;
            batch.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &block));
            batch.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
            if batch.len() >= 16 * 1024 || i == PAIRS - 1 {
                if wr.write_all(&batch).await.is_err() {
                    write_failed = true;
                    return i;
                }
                batch.clear();
            }
        }
        PAIRS
    })
    .await;
    // Other connections are served while the abusive one is still open.
    fresh_request_succeeds(addr).await;
    let end =
        until_goaway_or_close(&mut rd, &mut wr, "GOAWAY or close after the rapid resets").await;
    if sweety_engine() {
        let g = end.as_ref().expect("a GOAWAY before the close");
        assert_eq!(g.error_code(), ENHANCE_YOUR_CALM, "{g:?}");
    }
    match &end {
        Some(g) => {
            assert_ne!(
                g.error_code(),
                NO_ERROR,
                "rapid reset ends with an error code: {g:?}"
            );
            let last = u32::from_be_bytes(g.payload[..4].try_into().unwrap()) & 0x7fff_ffff;
            assert!(
                last < 2 * PAIRS - 1,
                "GOAWAY came only after the last stream ({last})"
            );
            println!(
                "rapid reset: GOAWAY code {:#x}, last stream {last}, sent {sent:?}",
                g.error_code()
            );
        }
        None => {
            println!("rapid reset: connection closed, sent {sent:?}, write failed {write_failed}")
        }
    }
    fresh_request_succeeds(addr).await;
}

/// HEADERS without END_HEADERS, then CONTINUATION frames of valid literal fields, never
/// ending the block (up to 64 MiB): the server must cut the connection off (GOAWAY or close)
/// instead of reading the flood to its end.
#[tokio::test]
async fn continuation_flood_is_cut_off() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    const FRAMES: usize = 4096;
    const FRAME_LEN: usize = 16 * 1024 - 64;
    let mut fragment = Vec::new();
    while fragment.len() < FRAME_LEN {
        literal_field(&mut fragment, "x-flood", &[b'a'; 100]);
    }
    // Within SETTINGS_MAX_FRAME_SIZE (never decoded: the block never ends).
    fragment.truncate(FRAME_LEN);
    let writer = tokio::spawn(async move {
        let mut sent = 0usize;
        let r = timeout(PHASE, async {
            wr.write_all(&frame(HEADERS, 0, 1, &request_block("/")))
                .await?;
            for _ in 0..FRAMES {
                wr.write_all(&frame(CONTINUATION, 0, 1, &fragment)).await?;
                sent += 1;
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
        (sent, r)
    });
    // Read (without writing: the writer owns the write half) until GOAWAY or close.
    let deadline = Instant::now() + PHASE;
    let end = loop {
        match rd.next(deadline).await {
            Event::Frame(f) if f.ty == GOAWAY => break Some(f),
            Event::Frame(_) => {}
            Event::Closed => break None,
            Event::Timeout => panic!("CONTINUATION flood: neither GOAWAY nor close"),
        }
    };
    let (sent, result) = writer.await.unwrap();
    println!("CONTINUATION flood: {sent} of {FRAMES} frames sent, writer {result:?}, end {end:?}");
    assert!(
        sent < FRAMES,
        "the server read all {FRAMES} CONTINUATION frames ({} MiB) of one header block",
        (FRAMES * FRAME_LEN) >> 20
    );
    if let Some(g) = &end {
        assert_ne!(g.error_code(), NO_ERROR, "{g:?}");
    }
    if sweety_engine() {
        // The block grew past max_header_bytes + 16 KiB.
        assert_eq!(end.map(|g| g.error_code()), Some(ENHANCE_YOUR_CALM));
    }
    fresh_request_succeeds(addr).await;
}

/// Floods of SETTINGS or PING frames (20,000, not reading meanwhile). The server either refuses
/// them (GOAWAY with an error code, or a close), or answers each in order and stays usable:
/// after the flood, the ACK of a last PING comes after the earlier ACKs, and a request on the
/// same connection is answered.
async fn control_flood(ty: u8, payload: &[u8]) {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    const COUNT: usize = 20_000;
    let one = frame(ty, 0, 0, payload);
    let mut all = Vec::with_capacity(one.len() * COUNT);
    for _ in 0..COUNT {
        all.extend_from_slice(&one);
    }
    let marker = *b"sweety!!";
    all.extend(frame(PING, 0, 0, &marker));
    // Written whole by a task (never cut mid-frame). Not reading for up to 5 s: a server that
    // stops reading while its ACKs go unread (backpressure, fine too) keeps the write
    // waiting, and the reads below then let it finish.
    let mut writer = tokio::spawn(async move {
        let r = wr.write_all(&all).await;
        (wr, r)
    });
    let early = timeout(Duration::from_secs(5), &mut writer).await.ok();
    let backpressure = early.is_none();
    let mut acks = 0usize;
    let mut server_settings = false;
    let deadline = Instant::now() + PHASE;
    loop {
        match rd.next(deadline).await {
            Event::Frame(f) if f.ty == GOAWAY => {
                assert_ne!(f.error_code(), NO_ERROR, "{f:?}");
                if sweety_engine() {
                    // More than 1,000 SETTINGS/PING frames in a second.
                    assert_eq!(f.error_code(), ENHANCE_YOUR_CALM, "{f:?}");
                }
                println!(
                    "flood of type {ty}: GOAWAY code {:#x} after {acks} ACKs",
                    f.error_code()
                );
                fresh_request_succeeds(addr).await;
                return;
            }
            Event::Frame(f) if f.ty == PING && f.flags & ACK != 0 && f.payload == marker => break,
            Event::Frame(f) if f.ty == ty && f.flags & ACK != 0 => {
                if ty == PING {
                    assert_eq!(f.payload, payload, "a PING ACK echoes the payload");
                }
                acks += 1;
            }
            Event::Frame(f) if f.ty == SETTINGS && f.flags & ACK == 0 => server_settings = true,
            Event::Frame(_) => {}
            Event::Closed => {
                assert!(!sweety_engine(), "closed without GOAWAY after {acks} ACKs");
                println!("flood of type {ty}: closed after {acks} ACKs");
                fresh_request_succeeds(addr).await;
                return;
            }
            Event::Timeout => {
                panic!("flood of type {ty}: neither refused nor answered ({acks} ACKs)")
            }
        }
    }
    assert!(
        !sweety_engine(),
        "{COUNT} frames of type {ty} answered: no flood limit"
    );
    println!("flood of type {ty}: answered, {acks} ACKs for {COUNT} frames (backpressure: {backpressure})");
    let (mut wr, written) = match early {
        Some(done) => done.unwrap(),
        None => writer.await.unwrap(),
    };
    written.expect("the flood was written whole");
    if server_settings {
        wr.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
    }
    // SETTINGS ACKs: one per SETTINGS (RFC 9113 §6.5.3), plus one for our opening SETTINGS.
    // PING: one per PING is what the RFC asks; a server may drop some under load, but not
    // answer more than were sent.
    assert!(acks <= COUNT + 1, "{acks} ACKs for {COUNT} frames");
    if ty == SETTINGS {
        assert!(
            acks >= COUNT,
            "{acks} SETTINGS ACKs for {COUNT} SETTINGS frames"
        );
    }
    assert_eq!(request_on(&mut rd, &mut wr, 1, "/").await, 200);
    fresh_request_succeeds(addr).await;
}

#[tokio::test]
async fn settings_flood() {
    control_flood(SETTINGS, &[]).await;
}

#[tokio::test]
async fn ping_flood() {
    control_flood(PING, b"pingpong").await;
}

/// Header lists over the 16 KiB limit get a 431, a RST_STREAM or a GOAWAY. When the server
/// refuses only the stream, the connection stays usable, including the HPACK state: the refused
/// block inserted `x-sync: yes` into the dynamic table, and the next request refers to it by
/// index.
///
/// ~40 KB of fields in HEADERS + CONTINUATION frames.
#[tokio::test]
async fn oversized_header_list_across_continuation_is_refused() {
    let mut fields = Vec::new();
    for i in 0..40 {
        literal_field(&mut fields, &format!("x-big-{i}"), &[b'b'; 1000]);
    }
    assert!(fields.len() > 2 * MAX_HEADER_BYTES as usize);
    // Sweety's engine: the block is past max_header_bytes + 16 KiB, a flood.
    oversized_header_list(fields, Refusal::GoAway(ENHANCE_YOUR_CALM)).await;
}

/// 400 small fields in one HEADERS frame (~8 KB on the wire, ~20 KB of header list once the
/// 32 octets per field are counted, RFC 9113 §6.5.2).
#[tokio::test]
async fn oversized_header_list_in_one_frame_is_refused() {
    let mut fields = Vec::new();
    for i in 0..400 {
        literal_field(&mut fields, &format!("x-f-{i:03}"), b"0123456789");
    }
    assert!(fields.len() < 16 * 1024 - 100);
    oversized_header_list(fields, Refusal::Status431).await;
}

/// How Sweety's engine refuses a header list.
#[derive(Debug, PartialEq)]
enum Refusal {
    Status431,
    GoAway(u32),
}

async fn oversized_header_list(fields: Vec<u8>, sweety_refusal: Refusal) {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    let mut block = request_block("/");
    // Literal with incremental indexing, new name: lands at dynamic index 62.
    block.push(0x40);
    hpack_str(&mut block, b"x-sync");
    hpack_str(&mut block, b"yes");
    block.extend_from_slice(&fields);
    let mut frames = Vec::new();
    let chunks: Vec<&[u8]> = block.chunks(16 * 1024).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = i == chunks.len() - 1;
        let ty = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if last { END_HEADERS } else { 0 } | if i == 0 { END_STREAM } else { 0 };
        frames.extend(frame(ty, flags, 1, c));
    }
    wr.write_all(&frames).await.unwrap();
    let ev = rd
        .until(
            &mut wr,
            "a refusal of the oversized header list",
            |e| match e {
                Event::Frame(f) => {
                    f.ty == GOAWAY || (f.stream == 1 && (f.ty == HEADERS || f.ty == RST_STREAM))
                }
                Event::Closed => true,
                Event::Timeout => false,
            },
        )
        .await;
    if sweety_engine() {
        let got = match &ev {
            Event::Frame(f) if f.ty == HEADERS && f.status == Some(431) => Refusal::Status431,
            Event::Frame(f) if f.ty == GOAWAY => Refusal::GoAway(f.error_code()),
            other => panic!("refused with {other:?}"),
        };
        assert_eq!(got, sweety_refusal);
    }
    match ev {
        Event::Frame(f) if f.ty == HEADERS => {
            assert_eq!(
                f.status,
                Some(431),
                "oversized header list answered with {f:?}"
            );
            println!("oversized header list: 431");
        }
        Event::Frame(f) if f.ty == RST_STREAM => {
            println!(
                "oversized header list: RST_STREAM code {:#x}",
                f.error_code()
            )
        }
        Event::Frame(f) => {
            assert_ne!(f.error_code(), NO_ERROR, "{f:?}");
            println!("oversized header list: GOAWAY code {:#x}", f.error_code());
            fresh_request_succeeds(addr).await;
            return;
        }
        _ => {
            println!("oversized header list: connection closed");
            fresh_request_succeeds(addr).await;
            return;
        }
    }
    // Same connection, the next stream, with x-sync taken from the dynamic table (index 62).
    let mut next = request_block("/");
    next.push(0xbe);
    wr.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 3, &next))
        .await
        .unwrap();
    let ev = rd
        .until(
            &mut wr,
            "the response on stream 3",
            |e| matches!(e, Event::Frame(f) if f.stream == 3 || f.ty == GOAWAY),
        )
        .await;
    match ev {
        Event::Frame(f) if f.ty == HEADERS => assert_eq!(f.status, Some(200), "{f:?}"),
        other => panic!("the connection's HPACK state is out of sync after the refusal: {other:?}"),
    }
    fresh_request_succeeds(addr).await;
}

/// WINDOW_UPDATE on the connection that takes its window past 2^31-1: GOAWAY(FLOW_CONTROL_ERROR).
#[tokio::test]
async fn connection_window_overflow_is_a_flow_control_error() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    wr.write_all(&frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()))
        .await
        .unwrap();
    let end = until_goaway_or_close(&mut rd, &mut wr, "GOAWAY after the window overflow").await;
    let g = end.expect("a GOAWAY before the close (RFC 9113 §6.9.1)");
    assert_eq!(g.error_code(), FLOW_CONTROL_ERROR, "{g:?}");
    fresh_request_succeeds(addr).await;
}

/// WINDOW_UPDATE on an open stream (its response waits for a silent backend) that takes the
/// stream window past 2^31-1: RST_STREAM(FLOW_CONTROL_ERROR) on that stream only; the
/// connection goes on serving.
#[tokio::test]
async fn stream_window_overflow_is_a_stream_error() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    let mut out = frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &request_block("/hang"),
    );
    out.extend(frame(WINDOW_UPDATE, 0, 1, &0x7fff_ffffu32.to_be_bytes()));
    wr.write_all(&out).await.unwrap();
    let ev = rd
        .until(
            &mut wr,
            "RST_STREAM on stream 1",
            |e| matches!(e, Event::Frame(f) if f.stream == 1 || f.ty == GOAWAY),
        )
        .await;
    match ev {
        Event::Frame(f) if f.ty == RST_STREAM => {
            assert_eq!(f.error_code(), FLOW_CONTROL_ERROR, "{f:?}")
        }
        other => panic!("expected RST_STREAM(FLOW_CONTROL_ERROR) on stream 1: {other:?}"),
    }
    assert_eq!(request_on(&mut rd, &mut wr, 3, "/").await, 200);
    fresh_request_succeeds(addr).await;
}

/// With `max_concurrent_streams: 8`, the server advertises 8 and refuses streams past it
/// (RST_STREAM with REFUSED_STREAM or PROTOCOL_ERROR, RFC 9113 §5.1.2) while 8 are open
/// (their responses wait for a silent backend).
#[tokio::test]
async fn streams_past_the_concurrency_limit_are_refused() {
    let (_h, addr) = start_with(|l| l.max_concurrent_streams = 8).await;
    let (mut rd, mut wr) = open(addr).await;
    let ev = rd
        .until(
            &mut wr,
            "the server's SETTINGS",
            |e| matches!(e, Event::Frame(f) if f.ty == SETTINGS && f.flags & ACK == 0),
        )
        .await;
    let Event::Frame(settings) = ev else {
        unreachable!()
    };
    let advertised = settings
        .payload
        .chunks(6)
        .find(|p| p[..2] == [0, 3])
        .map(|p| u32::from_be_bytes(p[2..6].try_into().unwrap()));
    assert_eq!(
        advertised,
        Some(8),
        "SETTINGS_MAX_CONCURRENT_STREAMS in {settings:?}"
    );
    let mut out = Vec::new();
    for i in 0..12u32 {
        out.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            2 * i + 1,
            &request_block("/hang"),
        ));
    }
    wr.write_all(&out).await.unwrap();
    let mut refused = Vec::new();
    while refused.len() < 4 {
        let ev = rd
            .until(
                &mut wr,
                "RST_STREAM for the streams past 8",
                |e| matches!(e, Event::Frame(f) if f.ty == RST_STREAM || f.ty == GOAWAY),
            )
            .await;
        let Event::Frame(f) = ev else { unreachable!() };
        assert_eq!(
            f.ty, RST_STREAM,
            "a stream error, not a connection error: {f:?}"
        );
        assert!(
            [REFUSED_STREAM, PROTOCOL_ERROR].contains(&f.error_code()),
            "{f:?}"
        );
        refused.push(f.stream);
    }
    refused.sort_unstable();
    assert_eq!(
        refused,
        [17, 19, 21, 23],
        "the streams past the 8th are the refused ones"
    );
    fresh_request_succeeds(addr).await;
}

/// A connection that sends nothing at all (not even the preface) is closed once
/// `header_read_timeout` (here 1 s) has passed, whichever engine serves HTTP/2: the first
/// bytes, which tell h2c from HTTP/1.1, are read within it (hyper-util's auto builder
/// waited for them without a timeout).
#[tokio::test]
async fn silent_connection_is_closed() {
    let (_h, addr) =
        start_with(|l| l.header_read_timeout = sweety_config::Duration::from_secs(1)).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (rd, mut wr) = tcp.into_split();
    let mut rd = Reader {
        rd,
        hpack: Decoder::new(),
    };
    let end = until_goaway_or_close(&mut rd, &mut wr, "the close of a silent connection").await;
    assert!(
        end.is_none(),
        "nothing was sent, so no GOAWAY is expected either: {end:?}"
    );
    // The header-read timeout (1 s) closed it, not the idle timeout (60 s).
    assert_eq!(limit_hits(&_h, "header_read_timeout"), 1);
    assert_eq!(limit_hits(&_h, "idle_timeout"), 0);
    fresh_request_succeeds(addr).await;
}

/// A header block that is started (HEADERS without END_HEADERS) and never finished is cut
/// off once `header_read_timeout` (here 1 s) has passed: GOAWAY or close (slowloris over
/// HTTP/2). Sweety's engine only: hyper's h2 has no timeout for it.
#[tokio::test]
async fn unfinished_header_block_is_cut_off() {
    let (_h, addr) = start_with(|l| {
        l.header_read_timeout = sweety_config::Duration::from_secs(1);
        l.http2_engine = sweety_config::Http2Engine::Sweety;
    })
    .await;
    let (mut rd, mut wr) = open(addr).await;
    // Settle SETTINGS first: nothing but CONTINUATION may follow the HEADERS frame (§6.10),
    // so the wait below writes nothing, and leaves PINGs unanswered (a server's keep-alive
    // could end the connection too, but only after its own, longer timeout).
    rd.until(
        &mut wr,
        "the server's SETTINGS",
        |e| matches!(e, Event::Frame(f) if f.ty == SETTINGS && f.flags & ACK == 0),
    )
    .await;
    wr.write_all(&frame(HEADERS, 0, 1, &request_block("/")))
        .await
        .unwrap();
    let started = Instant::now();
    let deadline = started + PHASE;
    let end = loop {
        match rd.next(deadline).await {
            Event::Frame(f) if f.ty == GOAWAY => break Some(f),
            Event::Frame(_) => {}
            Event::Closed => break None,
            Event::Timeout => panic!("a stalled header block still holds the connection"),
        }
    };
    println!(
        "unfinished header block: {end:?} after {:?}",
        started.elapsed()
    );
    // GOAWAY PROTOCOL_ERROR from the header-read timeout (1 s), not the idle one (60 s).
    let g = end.expect("a GOAWAY before the close");
    assert_eq!(g.error_code(), PROTOCOL_ERROR, "{g:?}");
    assert_eq!(limit_hits(&_h, "header_read_timeout"), 1);
    assert_eq!(limit_hits(&_h, "idle_timeout"), 0);
    fresh_request_succeeds(addr).await;
}

/// The hand-written frame and header block helpers say what the tests think they say.
#[test]
fn frame_encoding() {
    assert_eq!(
        frame(DATA, END_STREAM, 5, b"ab"),
        [0, 0, 2, 0, 1, 0, 0, 0, 5, b'a', b'b']
    );
    let mut d = Decoder::new();
    let mut seen = Vec::new();
    d.decode(&request_block("/x"), 1 << 16, |f| {
        seen.push((f.name.to_vec(), f.value.to_vec()))
    })
    .unwrap();
    assert_eq!(
        seen,
        [
            (b":method".to_vec(), b"GET".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/x".to_vec()),
            (b":authority".to_vec(), b"localhost".to_vec()),
        ]
    );
}

/// A backend that reads and discards what it is sent and never answers: a request body
/// proxied to it is consumed as it arrives. Counts the body bytes it received (what follows
/// each connection's request head).
async fn draining_backend() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let body_bytes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = body_bytes.clone();
    tokio::spawn(async move {
        // Bounded: the test opens a few dozen backend connections.
        for _ in 0..64 {
            let Ok((mut s, _)) = l.accept().await else {
                break;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut head = Vec::new();
                let mut in_body = false;
                // Until the proxy closes the connection.
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut got = &buf[..n];
                    if !in_body {
                        head.extend_from_slice(got);
                        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        in_body = true;
                        got = &head[end + 4..];
                        counted.fetch_add(got.len(), std::sync::atomic::Ordering::SeqCst);
                        continue;
                    }
                    counted.fetch_add(got.len(), std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    (addr, body_bytes)
}

/// Many concurrent uploads, each smaller than the point where its stream window is re-opened,
/// together larger than the connection window: the bytes the backend consumed re-open the
/// connection window, so the client can send them all, and they all reach the backend.
#[tokio::test]
async fn concurrent_uploads_do_not_exhaust_the_connection_window() {
    let (drain, reached) = draining_backend().await;
    let mut cfg = http_config(vec![vhost(
        "any",
        &[],
        vec![proxy_route("drain", "/drain", "drain")],
    )]);
    cfg.backends = vec![backend("drain", drain)];
    cfg.limits.http2_engine = sweety_config::Http2Engine::Sweety;
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let (mut rd, mut wr) = open(addr).await;
    const STREAMS: u32 = 20;
    const PER_STREAM: usize = 60 * 1024;
    const CHUNK: usize = 15 * 1024;
    for i in 0..STREAMS {
        // POST /drain with its content-length (forwarded as it is: the backend's count is of
        // body bytes only), no END_STREAM: the body follows.
        let mut block = vec![0x83, 0x86];
        hpack_int(&mut block, 4, 4, 0x00);
        hpack_str(&mut block, b"/drain");
        hpack_int(&mut block, 1, 4, 0x00);
        hpack_str(&mut block, b"localhost");
        hpack_int(&mut block, 28, 4, 0x00);
        hpack_str(&mut block, PER_STREAM.to_string().as_bytes());
        wr.write_all(&frame(HEADERS, END_HEADERS, 1 + 2 * i, &block))
            .await
            .unwrap();
    }
    // The client's connection send window: the default until the server grows it.
    let mut window: i64 = 65_535;
    let chunk = vec![b'x'; CHUNK];
    let mut sent = 0usize;
    for _ in 0..PER_STREAM / CHUNK {
        for i in 0..STREAMS {
            while window < CHUNK as i64 {
                let ev = rd
                    .until(
                        &mut wr,
                        "connection WINDOW_UPDATE",
                        |e| matches!(e, Event::Frame(f) if f.ty == WINDOW_UPDATE && f.stream == 0),
                    )
                    .await;
                if let Event::Frame(f) = ev {
                    window += u32::from_be_bytes(f.payload[..4].try_into().unwrap()) as i64;
                }
            }
            wr.write_all(&frame(DATA, 0, 1 + 2 * i, &chunk))
                .await
                .unwrap();
            window -= CHUNK as i64;
            sent += CHUNK;
        }
    }
    assert_eq!(sent, STREAMS as usize * PER_STREAM);
    assert!(sent > 1024 * 1024, "more than the 1 MiB connection window");
    // Every byte reaches the backend (bounded wait).
    let deadline = Instant::now() + PHASE;
    while reached.load(std::sync::atomic::Ordering::SeqCst) < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), sent);
}

/// Oversized header lists answered with 431 count like resets: a client looping them (each
/// costs the server an HPACK decode of a large block) ends up with GOAWAY ENHANCE_YOUR_CALM
/// rather than being served 431s forever.
#[tokio::test]
async fn oversized_header_lists_count_towards_the_reset_limit() {
    // Sweety's engine (hyper's answers them all).
    let (_h, addr) = start_with(|l| {
        l.max_pending_reset_streams = 10;
        l.http2_engine = sweety_config::Http2Engine::Sweety;
    })
    .await;
    let (mut rd, mut wr) = open(addr).await;
    let mut fields = request_block("/");
    for i in 0..400 {
        literal_field(&mut fields, &format!("x-f-{i:03}"), b"0123456789");
    }
    let mut out = Vec::new();
    for i in 0..30u32 {
        out.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i, &fields));
    }
    // A marker: its ACK before any GOAWAY means all 30 were answered without a limit.
    out.extend(frame(PING, 0, 0, b"marker!!"));
    wr.write_all(&out).await.unwrap();
    let mut answered_431 = 0;
    let ev = rd
        .until(&mut wr, "GOAWAY or the PING ACK", |e| match e {
            Event::Frame(f) if f.ty == HEADERS && f.status == Some(431) => {
                answered_431 += 1;
                false
            }
            Event::Frame(f) => f.ty == GOAWAY || (f.ty == PING && f.flags & ACK != 0),
            _ => false,
        })
        .await;
    match ev {
        Event::Frame(f) if f.ty == GOAWAY => {
            assert_eq!(f.error_code(), ENHANCE_YOUR_CALM, "{f:?}");
            assert!(
                answered_431 <= 11,
                "{answered_431} answered before the limit"
            );
        }
        other => panic!("30 oversized header lists served without a limit: {other:?}"),
    }
    fresh_request_succeeds(addr).await;
}

/// A SETTINGS frame's INITIAL_WINDOW_SIZE entries are applied as one change, the last value
/// (not one walk over every stream per entry: 2,730 entries fit one frame). Seen from the
/// wire: a stream whose window is at the maximum survives a frame that raises the initial
/// window by one and then puts it back (applied entry by entry, the first one would overflow
/// the stream's window: GOAWAY FLOW_CONTROL_ERROR).
#[tokio::test]
async fn initial_window_size_entries_apply_as_one_change() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    // Stream 1 waits for a silent backend; its send window goes to 2^31-1.
    let mut out = frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &request_block("/hang"),
    );
    out.extend(frame(
        WINDOW_UPDATE,
        0,
        1,
        &(0x7fff_ffffu32 - 65_535).to_be_bytes(),
    ));
    let mut entries = Vec::new();
    for v in [65_536u32, 65_535] {
        entries.extend_from_slice(&4u16.to_be_bytes());
        entries.extend_from_slice(&v.to_be_bytes());
    }
    out.extend(frame(SETTINGS, 0, 0, &entries));
    out.extend(frame(PING, 0, 0, b"marker!!"));
    wr.write_all(&out).await.unwrap();
    let ev = rd
        .until(&mut wr, "the PING ACK", |e| {
            matches!(e, Event::Frame(f) if f.ty == GOAWAY || f.ty == PING && f.flags & ACK != 0)
                || matches!(e, Event::Closed)
        })
        .await;
    match ev {
        Event::Frame(f) if f.ty == PING => {}
        other => panic!("the net change of zero ended the connection: {other:?}"),
    }
    assert_eq!(request_on(&mut rd, &mut wr, 3, "/").await, 200);
}

/// The server side of a real TCP connection, handed to the engine directly: records the
/// largest write the engine offers (its whole output buffer, as it writes it in one call).
struct Recording {
    inner: TcpStream,
    largest_write: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl tokio::io::AsyncRead for Recording {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Recording {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.largest_write
            .fetch_max(buf.len(), std::sync::atomic::Ordering::SeqCst);
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves one accepted connection with Sweety's engine through [`Recording`].
async fn serve_recorded(
    h: &Harness,
    server: TcpStream,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use sweety_dataplane::ctx::ConnInfo;
    let largest = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peer = server.peer_addr().unwrap();
    let local = server.local_addr().unwrap();
    let io = Recording {
        inner: server,
        largest_write: largest.clone(),
    };
    let conn = std::sync::Arc::new(ConnInfo {
        listener: "web".into(),
        peer,
        local,
        tls: false,
        sni: None,
        client_cert: None,
        client_cert_verdict: Default::default(),
        forwarding: Default::default(),
        tls_version: None,
        tls_cipher: None,
        read_budget: None,
    });
    let snap = h.runtime.shared.snapshot();
    let settings = sweety_dataplane::listen::tcp::h2_settings(&snap.config.limits);
    drop(snap);
    let (tx, stop) = tokio::sync::watch::channel(false);
    let shared = h.runtime.shared.clone();
    tokio::spawn(async move {
        let _tx = tx;
        let _ = sweety_h2::serve(io, H2Pipeline::new(shared, conn), settings, stop).await;
    });
    largest
}

/// 2,000 GET requests of 12 bytes each arrive in one burst (the first read holds ~1,360 of
/// them): the engine handles frames only until its output reaches its bound, and handles the
/// rest once that has been written, so what one read queues is bounded (the answers are ~7
/// times the size of the requests). Every request is still answered.
#[tokio::test]
async fn one_read_queues_a_bounded_amount_of_output() {
    // The answers' bodies follow their HEADERS: the streams stay open until then.
    let (h, _) = start_with(|l| l.max_concurrent_streams = 10_000).await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    const REQUESTS: u32 = 2000;
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for i in 0..REQUESTS {
        // :method GET, :scheme http, :path / (static table indexes).
        out.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            1 + 2 * i,
            &[0x82, 0x86, 0x84],
        ));
    }
    // All of it is in the server's socket buffer before the engine reads.
    client.write_all(&out).await.unwrap();
    let largest = serve_recorded(&h, server).await;
    let (rd, mut wr) = client.into_split();
    let mut rd = Reader {
        rd,
        hpack: Decoder::new(),
    };
    let mut answered = 0;
    rd.until(&mut wr, "every answer", |e| {
        if let Event::Frame(f) = e {
            if f.ty == DATA && f.flags & END_STREAM != 0 {
                answered += 1;
            }
        }
        answered == REQUESTS || matches!(e, Event::Frame(f) if f.ty == GOAWAY)
    })
    .await;
    assert_eq!(answered, REQUESTS, "every request answered, no GOAWAY");
    let largest = largest.load(std::sync::atomic::Ordering::SeqCst);
    let bound = sweety_h2::conn::WRITE_HIGH + 4096;
    assert!(
        largest <= bound,
        "{largest} bytes of output queued at once (bound {bound})"
    );
}

/// Yields once: wakes itself and returns Pending, so the task goes to the back of the run
/// queue, behind the tasks already woken (tokio's `yield_now` defers it further).
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// One connection does not hold its worker: 2,000 requests arrive at once on this test's
/// single-threaded runtime, and another task, which runs whenever the connection's task
/// yields, sees at most 64 of them answered between two of its turns (the engine starts at
/// most 64 requests per poll, like the hyper path's inline first polls).
#[tokio::test]
async fn one_connection_yields_its_worker_between_batches_of_requests() {
    let (h, _) = start_with(|l| l.max_concurrent_streams = 10_000).await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    const REQUESTS: u64 = 2000;
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for i in 0..REQUESTS as u32 {
        out.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            1 + 2 * i,
            &[0x82, 0x86, 0x84],
        ));
    }
    client.write_all(&out).await.unwrap();
    let shared = h.runtime.shared.clone();
    let answered = move || -> u64 { shared.metrics.latency.iter().map(|h| h.count()).sum() };
    let before = answered();
    // Bounded: the connection answers everything well within this many turns.
    let ticker = tokio::spawn(async move {
        let (mut last, mut most) = (answered(), 0);
        for _ in 0..10_000_000u64 {
            YieldOnce(false).await;
            let now = answered();
            most = most.max(now - last);
            last = now;
            if now - before >= REQUESTS {
                break;
            }
        }
        (last - before, most)
    });
    serve_recorded(&h, server).await;
    let (rd, mut wr) = client.into_split();
    let mut rd = Reader {
        rd,
        hpack: Decoder::new(),
    };
    let mut ends = 0;
    rd.until(&mut wr, "every answer", |e| {
        if matches!(e, Event::Frame(f) if f.ty == DATA && f.flags & END_STREAM != 0) {
            ends += 1;
        }
        ends == REQUESTS || matches!(e, Event::Frame(f) if f.ty == GOAWAY)
    })
    .await;
    let (total, most) = ticker.await.unwrap();
    assert_eq!(total, REQUESTS);
    assert!(
        most <= 64,
        "{most} requests answered in one turn of the worker"
    );
}

/// DATA that a stream error refuses (here: past the request's `content-length: 1`) still
/// counted against the connection window, and is credited back with the stream's reset: 60
/// such uploads of 16 KiB (most of the 1 MiB connection window) get their bytes back in
/// connection WINDOW_UPDATEs, so the connection can go on taking request bodies.
#[tokio::test]
async fn data_refused_by_a_stream_error_is_credited_to_the_connection() {
    let (_h, addr) = start_with(|l| l.max_pending_reset_streams = 1000).await;
    let (mut rd, mut wr) = open(addr).await;
    // The server's first connection WINDOW_UPDATE grows the window from 65,535 to 1 MiB.
    let ev = rd
        .until(
            &mut wr,
            "the connection window",
            |e| matches!(e, Event::Frame(f) if f.ty == WINDOW_UPDATE && f.stream == 0),
        )
        .await;
    let Event::Frame(f) = ev else { unreachable!() };
    let window = 65_535 + u32::from_be_bytes(f.payload[..4].try_into().unwrap()) as usize;
    const UPLOADS: u32 = 60;
    const CHUNK: usize = 16_384;
    assert!(UPLOADS as usize * CHUNK <= window);
    let chunk = vec![b'x'; CHUNK];
    let mut out = Vec::new();
    for i in 0..UPLOADS {
        // POST /hang (a backend that never answers: the request stays open), 1-byte body.
        let mut block = vec![0x83, 0x86];
        hpack_int(&mut block, 4, 4, 0x00);
        hpack_str(&mut block, b"/hang");
        hpack_int(&mut block, 1, 4, 0x00);
        hpack_str(&mut block, b"localhost");
        hpack_int(&mut block, 28, 4, 0x00);
        hpack_str(&mut block, b"1");
        out.extend(frame(HEADERS, END_HEADERS, 1 + 2 * i, &block));
        out.extend(frame(DATA, 0, 1 + 2 * i, &chunk));
    }
    wr.write_all(&out).await.unwrap();
    let (mut credit, mut resets) = (0usize, 0);
    rd.until(&mut wr, "the refused DATA credited back", |e| {
        if let Event::Frame(f) = e {
            if f.ty == WINDOW_UPDATE && f.stream == 0 {
                credit += u32::from_be_bytes(f.payload[..4].try_into().unwrap()) as usize;
            }
            if f.ty == RST_STREAM && f.error_code() == PROTOCOL_ERROR {
                resets += 1;
            }
            assert_ne!(f.ty, GOAWAY, "{f:?}");
        }
        // Released whenever the window is below half: all but less than half of it.
        resets == UPLOADS && credit >= UPLOADS as usize * CHUNK - window / 2
    })
    .await;
}

/// An h2c connection that has finished its request and then only answers PINGs (as a
/// client's HTTP/2 stack does) is closed after `idle_timeout` with GOAWAY NO_ERROR, on either
/// engine: hyper has no idle timeout of its own (its keep-alive PINGs, answered, kept such a
/// connection open for good). The idle timeout (1 s) is far from the header-read timeout
/// (60 s, past this test's 20 s bound), and the limit counters tell which one closed it.
#[tokio::test]
async fn an_idle_h2c_connection_that_answers_pings_is_closed() {
    let (h, addr) = start_with(|l| {
        l.idle_timeout = sweety_config::Duration::from_secs(1);
        l.header_read_timeout = sweety_config::Duration::from_secs(60);
    })
    .await;
    let (mut rd, mut wr) = open(addr).await;
    assert_eq!(request_on(&mut rd, &mut wr, 1, "/").await, 200);
    let deadline = Instant::now() + PHASE;
    let goaway = loop {
        match rd.next(deadline).await {
            Event::Frame(f) if f.ty == GOAWAY => break f,
            Event::Frame(f) if f.ty == PING && f.flags & ACK == 0 => {
                wr.write_all(&frame(PING, ACK, 0, &f.payload))
                    .await
                    .unwrap();
            }
            Event::Frame(f) if f.ty == SETTINGS && f.flags & ACK == 0 => {
                wr.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
            }
            Event::Frame(_) => {}
            Event::Closed => panic!("closed without GOAWAY"),
            Event::Timeout => panic!("an idle connection answering PINGs is still open"),
        }
    };
    assert_eq!(goaway.error_code(), NO_ERROR, "{goaway:?}");
    // hyper's graceful shutdown waits for a PING round trip before it closes.
    let deadline = Instant::now() + PHASE;
    loop {
        match rd.next(deadline).await {
            Event::Closed => break,
            Event::Timeout => panic!("not closed after its GOAWAY"),
            Event::Frame(f) if f.ty == PING && f.flags & ACK == 0 => {
                let _ = wr.write_all(&frame(PING, ACK, 0, &f.payload)).await;
            }
            Event::Frame(f) => assert!(f.ty == GOAWAY || f.ty == PING, "{f:?}"),
        }
    }
    assert_eq!(limit_hits(&h, "idle_timeout"), 1);
    assert_eq!(limit_hits(&h, "header_read_timeout"), 0);
}

/// An upload that is mostly padding: the padding is credited back to the stream's window at
/// once (WINDOW_UPDATE on the stream), not only when enough content has been consumed to
/// queue the stream (such an upload would use up its window and stall).
#[tokio::test]
async fn padding_is_credited_to_the_stream_window() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    // POST /hang (a backend that never answers: the request stays open).
    let mut block = vec![0x83, 0x86];
    hpack_int(&mut block, 4, 4, 0x00);
    hpack_str(&mut block, b"/hang");
    hpack_int(&mut block, 1, 4, 0x00);
    hpack_str(&mut block, b"localhost");
    wr.write_all(&frame(HEADERS, END_HEADERS, 1, &block))
        .await
        .unwrap();
    // The server's SETTINGS (256 KiB stream windows) and connection WINDOW_UPDATE first: the
    // frames below exceed 65,535 bytes.
    rd.until(
        &mut wr,
        "the connection window",
        |e| matches!(e, Event::Frame(f) if f.ty == WINDOW_UPDATE && f.stream == 0),
    )
    .await;
    const PADDED: u8 = 0x8;
    let mut payload = vec![255u8, b'x'];
    payload.extend_from_slice(&[0u8; 255]);
    let mut out = Vec::new();
    // 400 frames of 257 bytes: 102,800 bytes, 102,400 of them padding, 400 of content (less
    // than the 64 KiB of consumed content after which the stream is credited anyway).
    for _ in 0..400 {
        out.extend(frame(DATA, PADDED, 1, &payload));
    }
    wr.write_all(&out).await.unwrap();
    let ev = rd
        .until(&mut wr, "a stream WINDOW_UPDATE", |e| {
            matches!(e, Event::Frame(f) if f.ty == WINDOW_UPDATE && f.stream == 1 || f.ty == GOAWAY || f.ty == RST_STREAM)
        })
        .await;
    let Event::Frame(f) = ev else { unreachable!() };
    assert_eq!(f.ty, WINDOW_UPDATE, "{f:?}");
    let credit = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
    assert!(credit >= 64 * 1024, "the padding credited: {credit}");
}

/// A `content-length` that is not 1*DIGIT (`+5`, ` 5`, `5 `; RFC 9110 §8.6) makes the request
/// malformed: RST_STREAM PROTOCOL_ERROR, not forwarded as it is.
#[tokio::test]
async fn a_content_length_that_is_not_digits_is_malformed() {
    let (_h, addr) = start().await;
    let (mut rd, mut wr) = open(addr).await;
    for (i, v) in ["+5", " 5", "5 "].into_iter().enumerate() {
        let id = 1 + 2 * i as u32;
        let mut block = vec![0x83, 0x86, 0x84];
        hpack_int(&mut block, 1, 4, 0x00);
        hpack_str(&mut block, b"localhost");
        hpack_int(&mut block, 28, 4, 0x00);
        hpack_str(&mut block, v.as_bytes());
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        out.extend(frame(DATA, END_STREAM, id, b"hello"));
        wr.write_all(&out).await.unwrap();
        let ev = rd
            .until(&mut wr, "the refusal", |e| {
                matches!(e, Event::Frame(f) if f.stream == id && (f.ty == HEADERS || f.ty == RST_STREAM) || f.ty == GOAWAY)
            })
            .await;
        let Event::Frame(f) = ev else { unreachable!() };
        assert_eq!(f.ty, RST_STREAM, "content-length {v:?}: {f:?}");
        assert_eq!(f.error_code(), PROTOCOL_ERROR, "content-length {v:?}");
    }
    assert_eq!(request_on(&mut rd, &mut wr, 7, "/").await, 200);
}

/// A client's opening burst, sent before it has seen our SETTINGS (so before it can know our
/// MAX_CONCURRENT_STREAMS), gets REFUSED_STREAM for the streams past the limit, and those
/// refusals are not counted as resets: 16 refusals with a limit of 8 resets per second, and
/// the connection goes on.
#[tokio::test]
async fn refusals_before_our_settings_are_acknowledged_are_not_counted() {
    let (_h, addr) = start_with(|l| {
        l.max_concurrent_streams = 4;
        l.max_pending_reset_streams = 8;
        l.http2_engine = sweety_config::Http2Engine::Sweety;
    })
    .await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (rd, mut wr) = tcp.into_split();
    let mut rd = Reader {
        rd,
        hpack: Decoder::new(),
    };
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for i in 0..20u32 {
        out.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            1 + 2 * i,
            &request_block("/hang"),
        ));
    }
    out.extend(frame(PING, 0, 0, b"marker!!"));
    wr.write_all(&out).await.unwrap();
    let mut refused = 0;
    let ev = rd
        .until(&mut wr, "the PING ACK", |e| {
            if matches!(e, Event::Frame(f) if f.ty == RST_STREAM && f.error_code() == REFUSED_STREAM)
            {
                refused += 1;
            }
            matches!(e, Event::Frame(f) if f.ty == GOAWAY || f.ty == PING && f.flags & ACK != 0)
        })
        .await;
    let Event::Frame(f) = ev else { unreachable!() };
    assert_eq!(f.ty, PING, "the opening burst ended the connection: {f:?}");
    assert_eq!(refused, 16);
}

/// Extended CONNECT (RFC 8441) requests that cannot be tunnels are malformed, reset with
/// PROTOCOL_ERROR before any backend is dialed: one without `:scheme` (§4 requires it), and
/// one whose HEADERS end the stream (a tunnel with no client side).
#[tokio::test]
async fn extended_connect_without_scheme_or_with_end_stream_is_malformed() {
    let (_h, addr) = start_with(|l| l.http2_engine = sweety_config::Http2Engine::Sweety).await;
    let (mut rd, mut wr) = open(addr).await;
    let connect = |scheme: bool| {
        // :method CONNECT, :protocol websocket, [:scheme http], :path /chat, :authority.
        let mut b = Vec::new();
        hpack_int(&mut b, 2, 4, 0x00);
        hpack_str(&mut b, b"CONNECT");
        literal_field(&mut b, ":protocol", b"websocket");
        if scheme {
            b.push(0x86);
        }
        hpack_int(&mut b, 4, 4, 0x00);
        hpack_str(&mut b, b"/chat");
        hpack_int(&mut b, 1, 4, 0x00);
        hpack_str(&mut b, b"localhost");
        b
    };
    for (id, block, flags) in [
        (1, connect(false), END_HEADERS),
        (3, connect(true), END_HEADERS | END_STREAM),
    ] {
        wr.write_all(&frame(HEADERS, flags, id, &block))
            .await
            .unwrap();
        let ev = rd
            .until(&mut wr, "the reset", |e| {
                matches!(e, Event::Frame(f) if f.stream == id && (f.ty == HEADERS || f.ty == RST_STREAM) || f.ty == GOAWAY)
            })
            .await;
        let Event::Frame(f) = ev else { unreachable!() };
        assert_eq!(f.ty, RST_STREAM, "stream {id}: {f:?}");
        assert_eq!(f.error_code(), PROTOCOL_ERROR, "stream {id}");
    }
    assert_eq!(request_on(&mut rd, &mut wr, 5, "/").await, 200);
}

/// A connection whose stream is still open when its listener's drain timeout (300 ms) has
/// passed (the backend never answers; the client answers PINGs, so no keep-alive check ends
/// it) is closed then: it had GOAWAY when the drain began, and the drain timeout bounds it.
#[tokio::test]
async fn connections_still_open_after_the_drain_timeout_are_closed() {
    let (h, addr) = start_with(|l| {
        l.drain_timeout = sweety_config::Duration(Duration::from_millis(300));
    })
    .await;
    let (mut rd, mut wr) = open(addr).await;
    wr.write_all(&frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &request_block("/hang"),
    ))
    .await
    .unwrap();
    rd.until(
        &mut wr,
        "the server's SETTINGS",
        |e| matches!(e, Event::Frame(f) if f.ty == SETTINGS && f.flags & ACK == 0),
    )
    .await;
    // The listener goes away.
    let mut cfg = sweety_config::Config::clone(&h.runtime.shared.snapshot().config);
    cfg.generation += 1;
    cfg.listeners.clear();
    h.runtime
        .apply(cfg)
        .await
        .expect("the config without the listener applies");
    let deadline = Instant::now() + PHASE;
    let mut goaway = None;
    loop {
        match rd.next(deadline).await {
            Event::Frame(f) if f.ty == GOAWAY => goaway = Some(f.error_code()),
            Event::Frame(f) if f.ty == PING && f.flags & ACK == 0 => {
                let _ = wr.write_all(&frame(PING, ACK, 0, &f.payload)).await;
            }
            Event::Frame(f) => assert_ne!(f.stream, 1, "the stream was not answered: {f:?}"),
            Event::Closed => break,
            Event::Timeout => panic!("still open long after the drain timeout"),
        }
    }
    assert_eq!(goaway, Some(NO_ERROR), "the drain's GOAWAY came first");
}
