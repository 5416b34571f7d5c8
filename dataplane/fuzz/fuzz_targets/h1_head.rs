//! The HTTP/1.1 request head path: bytes parsed as hyper parses them (httparse), then the
//! request identity (authority, framing, path). Never panics; an accepted request has one
//! Host, a normalised origin-form path, and no Transfer-Encoding beside Content-Length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_dataplane::ctx::Protocol;
use sweety_dataplane::identity::establish;
use sweety_dataplane::path_norm::{normalize, PathNormalization};

fuzz_target!(|data: &[u8]| {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(_)) = req.parse(data) else {
        return;
    };
    let version = if req.version == Some(0) {
        http::Version::HTTP_10
    } else {
        http::Version::HTTP_11
    };
    let mut b = http::Request::builder()
        .method(req.method.unwrap_or("GET"))
        .uri(req.path.unwrap_or("/"))
        .version(version);
    for h in req.headers.iter() {
        b = b.header(h.name, h.value);
    }
    let Ok(mut r) = b.body(sweety_dataplane::body::empty()) else {
        return;
    };
    let policy = PathNormalization::default();
    if establish(&mut r, Protocol::Http1, &policy).is_ok() {
        assert!(r.headers().get_all(http::header::HOST).iter().count() <= 1);
        let path = r.uri().path();
        assert_eq!(normalize(path, &policy).as_deref(), Ok(path));
        assert!(
            !(r.headers().contains_key(http::header::TRANSFER_ENCODING)
                && r.headers().contains_key(http::header::CONTENT_LENGTH))
        );
    }
});
