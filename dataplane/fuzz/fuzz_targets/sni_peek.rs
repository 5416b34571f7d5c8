//! The ClientHello SNI peek on arbitrary bytes and limits: never panics; a prefix of a
//! complete hello never claims a different name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_dataplane::listen::l4::sni::{peek, Peek};

fuzz_target!(|data: &[u8]| {
    let max = 16 * 1024 + 5;
    if let Peek::Hello(name) = peek(data, max) {
        if let Some(n) = &name {
            assert_eq!(*n, n.to_ascii_lowercase());
        }
        // More bytes after a complete hello do not change it.
        let mut more = data.to_vec();
        more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert_eq!(peek(&more, max + 6), Peek::Hello(name));
    }
});
