//! The PROXY protocol v1/v2 reader on arbitrary bytes: never panics, never reads past the
//! header it accepts.
#![no_main]

use futures_util::FutureExt;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    // A byte slice is always ready: the future completes in its first poll.
    let got = sweety_dataplane::proxy_protocol::read_header(&mut rest)
        .now_or_never()
        .expect("reading from memory never waits");
    if got.is_ok() {
        let used = data.len() - rest.len();
        assert!(used <= 16 + sweety_dataplane::proxy_protocol::MAX_V2_PAYLOAD);
    }
});
