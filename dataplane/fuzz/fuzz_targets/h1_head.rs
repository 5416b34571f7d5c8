//! The HTTP/1.1 request head path on arbitrary bytes: the connection's wire tracker
//! (`h1_wire`), then the first head as hyper reads it (httparse; `Content-Length` dropped when
//! `Transfer-Encoding` is there, as hyper does), then the request identity. Never panics; the
//! tracker's outcome does not depend on how the bytes are split; an accepted request has one
//! Host, a normalised origin-form path, and never had both `Transfer-Encoding` and
//! `Content-Length` on the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_dataplane::ctx::Protocol;
use sweety_dataplane::listen::h1_wire::{ConflictingFraming, Tracker, Wire};
use sweety_dataplane::identity::establish;
use sweety_dataplane::path_norm::{normalize, PathNormalization};

fuzz_target!(|input: &[u8]| {
    let Some((&cut, data)) = input.split_first() else {
        return;
    };
    // The tracker, fed whole and in two pieces: the same outcome.
    let wire = Wire::new();
    let mut whole = Tracker::new(wire.clone());
    whole.feed(data);
    let mut split = Tracker::new(Wire::new());
    let cut = usize::from(cut).min(data.len());
    split.feed(&data[..cut]);
    split.feed(&data[cut..]);
    assert_eq!(whole.heads(), split.heads());
    assert_eq!(whole.is_off(), split.is_off());

    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(_)) = req.parse(data) else {
        return;
    };
    let version = if req.version == Some(0) {
        http::Version::HTTP_10
    } else {
        http::Version::HTTP_11
    };
    let te = req
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
    let cl = req
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("content-length"));
    let mut b = http::Request::builder()
        .method(req.method.unwrap_or("GET"))
        .uri(req.path.unwrap_or("/"))
        .version(version);
    for h in req.headers.iter() {
        if te && h.name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        b = b.header(h.name, h.value);
    }
    let Ok(mut r) = b.body(sweety_dataplane::body::empty()) else {
        return;
    };
    if wire.next_request() {
        r.extensions_mut().insert(ConflictingFraming);
    }
    let policy = PathNormalization::default();
    if establish(&mut r, Protocol::Http1, &policy).is_ok() {
        assert!(!(te && cl), "both framing fields on the wire, yet accepted");
        assert!(r.headers().get_all(http::header::HOST).iter().count() <= 1);
        let path = r.uri().path();
        assert_eq!(normalize(path, &policy).as_deref(), Ok(path));
    }
});
