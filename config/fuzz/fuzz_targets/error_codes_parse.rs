//! `error_pages::parse_codes` on arbitrary text (ingress-nginx's `custom-http-errors`
//! annotation, a tenant's value). Checks: no panic; what it accepts is a non-empty, sorted list
//! of distinct codes from 400 to 599 that `check_error_pages` accepts, and each accepted code
//! appears in the text as an item of its own (nothing is invented).

#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_config::error_pages::{check_error_pages, parse_codes, ErrorPages};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(codes) = parse_codes(text) else {
        return;
    };
    assert!(!codes.is_empty(), "{text:?}");
    assert!(codes.windows(2).all(|w| w[0] < w[1]), "{text:?}");
    let items: Vec<&str> = text.split(',').map(|i| i.trim()).collect();
    for c in &codes {
        assert!((400..=599).contains(c), "{text:?}");
        assert!(items.contains(&c.to_string().as_str()), "{c} from {text:?}");
    }
    let e = ErrorPages {
        codes,
        ..Default::default()
    };
    assert!(check_error_pages(&e).is_empty(), "{text:?}");
});
