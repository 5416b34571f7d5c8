//! The connection driver fed arbitrary client bytes over an in-memory pipe: see the harness
//! (`harness/conn_driver.rs`, also run on the committed seeds by `sweety-h2`'s
//! `tests/fuzz_seeds.rs`) for the input layout, the mock service and the checks.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/conn_driver.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
