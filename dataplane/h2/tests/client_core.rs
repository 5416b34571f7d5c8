//! The `client_core` fuzz target's harness (`fuzz/harness/client_core.rs`) in every test run:
//! its committed seeds, and property tests. Well-formed responses (any status, fields, body
//! pieces, trailers, header blocks cut into CONTINUATION frames) cut into reads anywhere arrive
//! exactly as sent; any bytes at all, whole or cut, give the same outcome within the bounds.

#[path = "../fuzz/harness/client_core.rs"]
mod harness;

use bytes::Bytes;
use harness::{drive, preface, response_frames, Outcome};
use proptest::prelude::*;

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
