//! The path normaliser on arbitrary bytes under every policy: never panics; a normalised path
//! starts with `/`, has no dot segment and is a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_dataplane::path_norm::{normalize, EscapedSlashes, PathNormalization};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(rest) else {
        return;
    };
    let policy = PathNormalization {
        enabled: true,
        merge_slashes: sel & 1 == 0,
        escaped_slashes: match (sel >> 1) % 3 {
            0 => EscapedSlashes::Reject,
            1 => EscapedSlashes::Decode,
            _ => EscapedSlashes::Keep,
        },
    };
    if let Ok(once) = normalize(path, &policy) {
        assert!(once.starts_with('/'));
        assert!(!once.split('/').any(|s| s == "." || s == ".."), "{once:?}");
        let twice = normalize(&once, &policy).expect("a normalised path normalises");
        assert_eq!(twice, once);
    }
});
