//! `sweety-dataplane` binary (in progress).
fn main() {}
