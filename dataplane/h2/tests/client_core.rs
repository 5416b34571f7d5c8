//! The `client_core` fuzz target's harness (`fuzz/harness/client_core.rs`) in every test run:
//! its committed seeds, and property tests. Well-formed responses (any status, fields, body
//! pieces, trailers, header blocks cut into CONTINUATION frames) cut into reads anywhere arrive
//! exactly as sent; any bytes at all, whole or cut, give the same outcome within the bounds.

#[path = "../fuzz/harness/client_core.rs"]
mod harness;

use bytes::Bytes;
use harness::{drive, preface, response_frames, Outcome};
use http::{HeaderMap, Method};
use proptest::prelude::*;
use std::task::{Context, Waker};
use std::time::Instant;
use sweety_h2::client::core::{Core, Fault, HeadPoll, RequestHead};
use sweety_h2::frame::Reason;

/// Every committed seed runs clean, and each gets a response head on its first stream (the
/// fuzzer starts from inputs that reach the stream paths).
#[test]
fn committed_seeds_run_and_reach_the_streams() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/client_core");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        harness::run(&data);
        let opts = data[0];
        let mut input = preface();
        input.extend_from_slice(&data[1..]);
        let (outcomes, fault) = drive(usize::from(opts & 3) + 1, opts & 4 != 0, &input, &[], false);
        assert!(fault.is_none(), "{path:?}: {fault:?}");
        assert!(
            outcomes.iter().any(|o| o.head.is_some()),
            "{path:?}: no head: {outcomes:?}"
        );
        n += 1;
    }
    assert!(n >= 5, "seeds found: {n}");
}

fn field_name() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "content-type",
        "x-a",
        "set-cookie",
        "cache-control",
        "grpc-status",
        "x-long-name-of-a-field",
        "etag",
        "vary",
    ])
    .prop_map(str::to_owned)
}

fn field_value() -> impl Strategy<Value = String> {
    "[ -~]{0,40}".prop_map(|v| v.trim().to_owned())
}

fn fields(max: usize) -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((field_name(), field_value()), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A well-formed response, framed any way and cut into reads anywhere, arrives as sent,
    /// whether the stream is read after every read or at the end.
    #[test]
    fn well_formed_responses_arrive_as_sent(
        status in prop::sample::select(vec![200u16, 201, 206, 302, 400, 404, 418, 500, 503]),
        head in fields(8),
        body in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..3000), 0..5),
        trailers in prop::option::of(fields(4)),
        max_block in 8usize..200,
        cuts in prop::collection::vec(1usize..5000, 1..6),
        eager in any::<bool>(),
    ) {
        let body: Vec<Bytes> = body.into_iter().map(Bytes::from).collect();
        let mut input = preface();
        input.extend(response_frames(1, status, &head, &body, trailers.as_deref(), max_block));
        let (outcomes, fault) = drive(1, false, &input, &cuts, eager);
        prop_assert!(fault.is_none(), "{:?}", fault);
        let want_fields: Vec<(String, Vec<u8>)> =
            head.iter().map(|(n, v)| (n.clone(), v.clone().into_bytes())).collect();
        let mut got_fields = outcomes[0].head.clone().map(|h| h.1).unwrap_or_default();
        let mut want_sorted = want_fields.clone();
        // A header map groups a name's values: compare per name, in order.
        want_sorted.sort_by(|a, b| a.0.cmp(&b.0));
        got_fields.sort_by(|a, b| a.0.cmp(&b.0));
        let want = Outcome {
            head: Some((status, want_sorted)),
            data: body.concat(),
            // Fields that may not be trailers (RFC 9110 §6.5.1) are left out.
            trailers: trailers.map(|t| {
                let mut t: Vec<_> = t
                    .into_iter()
                    .filter(|(n, _)| !matches!(n.as_str(), "content-type" | "set-cookie" | "cache-control"))
                    .map(|(n, v)| (n, v.into_bytes()))
                    .collect();
                t.sort_by(|a, b| a.0.cmp(&b.0));
                t
            }),
            error: None,
            ended: true,
        };
        let mut got = outcomes[0].clone();
        got.head = got.head.map(|(s, _)| (s, got_fields));
        if let Some(t) = got.trailers.as_mut() {
            t.sort_by(|a, b| a.0.cmp(&b.0));
        }
        prop_assert_eq!(got, want);
    }

    /// Any bytes after a valid preface (frames of any kind, flags and ids, or none at all),
    /// for 1-4 requests: whole and cut into reads agree, and the bounds hold.
    #[test]
    fn any_backend_bytes_whole_or_cut_agree(
        opts in any::<u8>(),
        frames in prop::collection::vec(
            (0u8..11, any::<u8>(), 0u32..9, prop::collection::vec(any::<u8>(), 0..40)),
            0..12,
        ),
        tail in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let mut data = vec![opts | 8];
        for (kind, flags, stream, payload) in frames {
            let mut b = bytes::BytesMut::new();
            sweety_h2::frame::put_head(&mut b, payload.len(), kind, flags, stream);
            data.extend_from_slice(&b);
            data.extend_from_slice(&payload);
        }
        data.extend_from_slice(&tail);
        harness::run(&data);
    }
}

/// A frame as the backend sends it.
fn raw_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    v.push(kind);
    v.push(flags);
    v.extend_from_slice(&stream.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn goaway(last: u32) -> Vec<u8> {
    let mut p = last.to_be_bytes().to_vec();
    p.extend_from_slice(&0u32.to_be_bytes());
    raw_frame(7, 0, 0, &p)
}

/// A second GOAWAY with a lower last id, after output was written past where a stream the
/// first one refused had its HEADERS: the output is still cut only at frame boundaries of
/// live streams. Before, the refused stream's stale offsets were used again: the cut panicked
/// (`split_off` out of bounds) or fell inside a frame, dropping PING ACKs and leaving a
/// partial frame for the backend (found by a read-only review).
#[test]
fn a_second_goaway_never_cuts_inside_a_frame() {
    use http::{HeaderMap, Method};
    use std::time::Instant;
    use sweety_h2::client::core::{Config, Core, RequestHead};
    for pings in [1u8, 20] {
        let mut core = Core::new(Config {
            stream_window: 65535,
            conn_window: 1 << 20,
            max_header_list: 16384,
        });
        let none = HeaderMap::new();
        let path = format!("/{}", "a".repeat(200));
        let req = RequestHead {
            method: &Method::GET,
            scheme: "http",
            authority: b"backend.test",
            path: &path,
            headers: &none,
        };
        let now = Instant::now();
        core.open(&req, sweety_h2::empty()).unwrap();
        drop(core.take_output());
        core.feed(&raw_frame(4, 0, 0, &[]));
        core.process(Some(now));
        core.open(&req, sweety_h2::empty()).unwrap();
        // GOAWAY(1): stream 3's unwritten HEADERS leave the output; stream 3 stays listed.
        core.feed(&goaway(1));
        core.process(Some(now));
        drop(core.take_output());
        // A PING ACK written past where stream 3's HEADERS began.
        core.feed(&raw_frame(6, 0, 0, &[0; 8]));
        core.process(Some(now));
        drop(core.take_output());
        let mut input = Vec::new();
        for k in 0..pings {
            input.extend(raw_frame(6, 0, 0, &[k, 0, 0, 5, 1, 0, 0, 0]));
        }
        input.extend(goaway(0));
        core.feed(&input);
        core.process(Some(now));
        let out = core.take_output();
        let (mut rest, mut acks) = (&out[..], 0);
        while !rest.is_empty() {
            assert!(rest.len() >= 9, "a partial frame: {out:02x?}");
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            assert!(rest.len() >= 9 + len, "a partial frame: {out:02x?}");
            acks += usize::from(rest[3] == 6 && rest[4] == 1);
            rest = &rest[9 + len..];
        }
        assert_eq!(acks, usize::from(pings), "{out:02x?}");
    }
}

/// A backend resetting a stream whose HEADERS it cannot have read yet (still queued, not
/// written) breaks RFC 9113 §5.1 (the stream is idle for it): a connection error. Taken as a
/// refusal (REFUSED_STREAM), the request was handed back to go elsewhere and its HEADERS were
/// written here after all (the `client_core` target's refused-never-written oracle, which
/// this input fails without the change).
#[test]
fn a_reset_of_a_stream_not_yet_sent_is_a_connection_error() {
    // Through the harness: two requests (the second a POST with a body), the backend's
    // SETTINGS and RST_STREAM(3, REFUSED_STREAM) in its first read, before any write.
    let mut data = vec![0xc9u8];
    data.extend(raw_frame(3, 0, 3, &7u32.to_be_bytes()));
    harness::run(&data);
    // Directly: stream 1 written, stream 3 queued behind it.
    let mut core = stream_3_queued_then(raw_frame(3, 0, 3, &7u32.to_be_bytes()));
    assert!(
        matches!(core.fault(), Some(Fault::Local(r, _)) if *r == Reason::PROTOCOL_ERROR),
        "{:?}",
        core.fault()
    );
    let mut cx = Context::from_waker(Waker::noop());
    // Stream 3 never reached the backend: refused, its HEADERS cut, nothing of it written.
    assert!(matches!(
        core.poll_head(3, &mut cx),
        HeadPoll::Failed(sweety_h2::H2Error::Refused, Some(_), true)
    ));
    let kinds = frame_kinds(&core.take_output());
    assert!(!kinds.iter().any(|k| k.1 == 3), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&(7, 0)), "{kinds:?}");
}

/// A core of the harness's connection with two GETs open, stream 1 written and stream 3
/// queued behind it, that read the backend's preface (SETTINGS) and `frame`.
fn stream_3_queued_then(frame: Vec<u8>) -> Core {
    let none = HeaderMap::new();
    let req = RequestHead {
        method: &Method::GET,
        scheme: "http",
        authority: b"backend.test",
        path: "/",
        headers: &none,
    };
    let mut core = Core::new(harness::CONFIG);
    core.open(&req, sweety_h2::empty()).unwrap();
    drop(core.take_output());
    core.open(&req, sweety_h2::empty()).unwrap();
    let mut input = harness::preface();
    input.extend(frame);
    core.feed(&input);
    core.process(Some(Instant::now()));
    core
}

/// The (type, stream) of each whole frame of `out`.
fn frame_kinds(out: &[u8]) -> Vec<(u8, u32)> {
    let mut rest = out;
    let mut kinds = Vec::new();
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        kinds.push((
            rest[3],
            u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]),
        ));
        rest = &rest[(9 + len).min(rest.len())..];
    }
    kinds
}

/// Any frame but PRIORITY on a stream whose HEADERS are still queued breaks RFC 9113 §5.1 as a
/// RST_STREAM does (the stream is idle for the backend): DATA, HEADERS (a response to a request
/// it cannot have read) and WINDOW_UPDATE end the connection with PROTOCOL_ERROR, and the
/// unsent stream is refused with its body handed back and its HEADERS cut from the output.
/// PRIORITY is allowed on an idle stream and changes nothing. Without the check, DATA failed
/// only the stream, and HEADERS and WINDOW_UPDATE were taken.
#[test]
fn frames_on_a_stream_not_yet_sent_are_a_connection_error_but_priority() {
    let cases = [
        ("DATA", raw_frame(0, 0, 3, b"x")),
        // `:status: 200` (static index 8), END_HEADERS.
        ("HEADERS", raw_frame(1, 4, 3, &[0x88])),
        ("WINDOW_UPDATE", raw_frame(8, 0, 3, &100u32.to_be_bytes())),
    ];
    for (what, frame) in cases {
        let mut core = stream_3_queued_then(frame);
        assert!(
            matches!(core.fault(), Some(Fault::Local(r, _)) if *r == Reason::PROTOCOL_ERROR),
            "{what}: {:?}",
            core.fault()
        );
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            matches!(
                core.poll_head(3, &mut cx),
                HeadPoll::Failed(sweety_h2::H2Error::Refused, Some(_), true)
            ),
            "{what}"
        );
        let kinds = frame_kinds(&core.take_output());
        assert!(
            !kinds.iter().any(|k| k.1 == 3),
            "{what}: stream 3's frames went out: {kinds:?}"
        );
    }
    // PRIORITY (exclusive off, depends on 0, weight 16): no fault, stream 3 waits on.
    let mut core = stream_3_queued_then(raw_frame(2, 0, 3, &[0, 0, 0, 0, 15]));
    assert!(core.fault().is_none(), "{:?}", core.fault());
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(core.poll_head(3, &mut cx), HeadPoll::Pending));
    let kinds = frame_kinds(&core.take_output());
    assert!(
        kinds.contains(&(1, 3)),
        "stream 3's HEADERS still go: {kinds:?}"
    );
}
