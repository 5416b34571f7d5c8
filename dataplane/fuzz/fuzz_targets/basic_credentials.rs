//! `basic_auth::credentials` on arbitrary `Authorization` values (one header, or two: the first
//! byte says how many and where the second starts). Checks: no panic; a user never contains
//! `:`; what is returned re-encodes to the header's token; two headers are always refused.
#![no_main]

use base64::Engine as _;
use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use libfuzzer_sys::fuzz_target;
use sweety_dataplane::basic_auth::{credentials, MAX_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let mut h = HeaderMap::new();
    let (first, second) = if sel & 1 == 1 && !rest.is_empty() {
        let at = usize::from(sel >> 1) % rest.len();
        (&rest[..at], Some(&rest[at..]))
    } else {
        (rest, None)
    };
    let Ok(v) = HeaderValue::from_bytes(first) else {
        return;
    };
    h.append(AUTHORIZATION, v);
    if let Some(s) = second {
        let Ok(v) = HeaderValue::from_bytes(s) else {
            return;
        };
        h.append(AUTHORIZATION, v);
    }
    let Some((user, password)) = credentials(&h) else {
        return;
    };
    assert!(second.is_none(), "two Authorization headers were accepted");
    assert!(first.len() <= MAX_HEADER_BYTES);
    assert!(!user.contains(&b':'));
    let sp = first.iter().position(|&b| b == b' ').expect("a scheme");
    assert!(first[..sp].eq_ignore_ascii_case(b"basic"));
    let mut joined = user;
    joined.push(b':');
    joined.extend_from_slice(&password);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&joined);
    assert_eq!(encoded.as_bytes(), first[sp..].trim_ascii());
});
