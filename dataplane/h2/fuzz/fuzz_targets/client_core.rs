//! The client connection's state fed arbitrary backend bytes, whole and cut into reads: see
//! the harness (`harness/client_core.rs`, also run on the committed seeds and by the property
//! tests of `sweety-h2`'s `tests/client_core.rs`) for the input layout and the oracle.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/client_core.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
