//! W3C trace context on arbitrary bytes (the first byte picks the field): `traceparent`
//! never panics, and what it accepts formats back to the same trace and parent ids;
//! `tracestate` never panics and what it accepts is within its bounds; the request-level
//! reader always removes both fields and keeps a `tracestate` only beside a valid parent.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use sweety_dataplane::trace::context::*;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Some(p) = parse_traceparent(rest) {
                assert!(rest.len() == 55 || rest[55] == b'-');
                let again = format_traceparent(&p.trace_id, &p.parent_id, p.sampled());
                assert_eq!(&again[3..52], &rest[3..52]);
                assert_ne!(p.trace_id, [0; 16]);
                assert_ne!(p.parent_id, [0; 8]);
            }
        }
        1 => {
            if valid_tracestate(rest) {
                assert!(rest.len() <= MAX_TRACESTATE);
                assert!(rest.split(|&b| b == b',').filter(|m| m.iter().any(|&b| b != b' ' && b != b'\t')).count() <= MAX_TRACESTATE_MEMBERS);
            }
        }
        _ => {
            // Split into field lines at 0xff: the first is traceparent, the rest tracestate.
            let mut h = HeaderMap::new();
            let mut lines = rest.split(|&b| b == 0xff);
            if let Some(tp) = lines.next().and_then(|l| HeaderValue::from_bytes(l).ok()) {
                h.append(&TRACEPARENT, tp);
            }
            for l in lines.take(64) {
                if let Ok(v) = HeaderValue::from_bytes(l) {
                    h.append(&TRACESTATE, v);
                }
            }
            let got = take_incoming(&mut h);
            assert!(h.is_empty());
            if let Some(ts) = got.tracestate {
                assert!(got.parent.is_some());
                assert!(valid_tracestate(ts.as_bytes()));
            }
        }
    }
});
