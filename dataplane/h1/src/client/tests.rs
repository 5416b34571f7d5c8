//! Unit and property tests of the client side: heads written and parsed, bodies decoded,
//! and whole exchanges over an in-memory transport that hands out the backend's bytes in
//! the pieces a test chooses.

use super::head::*;
use super::*;
use http_body_util::{BodyExt, Full};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

fn map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn shape(end: bool, exact: Option<u64>) -> BodyShape {
    BodyShape { end, exact }
}

#[test]
fn request_heads_carry_the_fields_and_the_body_framing() {
    let h = map(&[
        ("host", "old"),
        ("x-a", "1"),
        ("x-a", "2"),
        ("transfer-encoding", "gzip"),
    ]);
    let host = HeaderValue::from_static("app.example");
    let mut out = Vec::new();
    let f = write_request_head(
        &mut out,
        &Method::GET,
        "/p?q=1",
        Some(&host),
        &h,
        None,
        shape(true, Some(0)),
    );
    assert_eq!(f, RequestFraming::Empty);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "GET /p?q=1 HTTP/1.1\r\nhost: app.example\r\nx-a: 1\r\nx-a: 2\r\n\r\n"
    );
    // The map's Host when none is given; an empty POST says so.
    let mut out = Vec::new();
    let f = write_request_head(
        &mut out,
        &Method::POST,
        "/",
        None,
        &h,
        None,
        shape(true, Some(0)),
    );
    assert_eq!(f, RequestFraming::Empty);
    assert!(String::from_utf8(out)
        .unwrap()
        .ends_with("host: old\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 0\r\n\r\n"));
    // Known length, unknown length, the map's own Content-Length.
    let mut out = Vec::new();
    assert_eq!(
        write_request_head(
            &mut out,
            &Method::PUT,
            "/",
            None,
            &HeaderMap::new(),
            None,
            shape(false, Some(5))
        ),
        RequestFraming::Length(5)
    );
    assert!(out.ends_with(b"content-length: 5\r\n\r\n"));
    let mut out = Vec::new();
    assert_eq!(
        write_request_head(
            &mut out,
            &Method::POST,
            "/",
            None,
            &HeaderMap::new(),
            None,
            shape(false, None)
        ),
        RequestFraming::Chunked
    );
    assert!(out.ends_with(b"transfer-encoding: chunked\r\n\r\n"));
    let mut out = Vec::new();
    let cl = map(&[("content-length", "7")]);
    assert_eq!(
        write_request_head(
            &mut out,
            &Method::POST,
            "/",
            None,
            &cl,
            None,
            shape(false, None)
        ),
        RequestFraming::Length(7)
    );
    assert_eq!(out, b"POST / HTTP/1.1\r\ncontent-length: 7\r\n\r\n");
    // A malformed Content-Length is not written; the body's shape frames it.
    let mut out = Vec::new();
    let bad = map(&[("content-length", "7, 7")]);
    assert_eq!(
        write_request_head(
            &mut out,
            &Method::POST,
            "/",
            None,
            &bad,
            None,
            shape(false, None)
        ),
        RequestFraming::Chunked
    );
    assert!(!String::from_utf8(out).unwrap().contains("content-length"));
}

#[test]
fn extra_fields_follow_the_map_and_are_checked() {
    let name = |n: &'static str| http::header::HeaderName::from_static(n);
    let mut extra = ExtraFields::default();
    assert!(extra.is_empty());
    assert!(extra.push(&name("x-a"), b"1"));
    // A value with CR, LF, NUL or DEL is left out whole, as `HeaderValue` refuses it.
    for bad in [&b"a\r\nx-evil: 1"[..], b"a\nb", b"a\rb", b"a\0", b"a\x7f"] {
        assert!(!extra.push(&name("x-b"), bad), "{bad:?}");
    }
    // The fields only the head writer writes are refused, whatever their value.
    for n in [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "expect",
        "te",
        "upgrade",
        "trailer",
        "keep-alive",
        "proxy-connection",
    ] {
        assert!(!extra.push(&name(n), b"1"), "{n}");
    }
    // A line dropped before its end is left out.
    {
        let mut line = extra.line(&name("x-c"));
        line.put(b"half");
    }
    let mut line = extra.line(&name("forwarded"));
    line.put(b"for=1").put(b";proto=http");
    assert!(line.finish());
    assert_eq!(
        extra.as_bytes(),
        b"x-a: 1\r\nforwarded: for=1;proto=http\r\n"
    );
    assert_eq!(
        extra.iter().collect::<Vec<_>>(),
        [
            (&b"x-a"[..], &b"1"[..]),
            (&b"forwarded"[..], &b"for=1;proto=http"[..])
        ]
    );
    let mut out = Vec::new();
    let h = map(&[("x-m", "m")]);
    let f = write_request_head(
        &mut out,
        &Method::POST,
        "/",
        None,
        &h,
        Some(&extra),
        shape(false, Some(3)),
    );
    assert_eq!(f, RequestFraming::Length(3));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "POST / HTTP/1.1\r\nx-m: m\r\nx-a: 1\r\nforwarded: for=1;proto=http\r\n\
         content-length: 3\r\n\r\n"
    );
}

#[test]
fn shared_extra_fields_are_the_same_lines_and_copied_before_a_line_is_added() {
    let name = |n: &'static str| http::header::HeaderName::from_static(n);
    let mut extra = ExtraFields::with_capacity(64);
    assert!(extra.push(&name("x-a"), b"1"));
    let mut kept = extra.share();
    let handed = kept.clone();
    for f in [&extra, &kept, &handed] {
        assert_eq!(f.as_bytes(), b"x-a: 1\r\n");
        assert!(!f.is_empty());
        assert_eq!(f.iter().collect::<Vec<_>>(), [(&b"x-a"[..], &b"1"[..])]);
    }
    assert_eq!(kept, handed);
    // A line added to one copy changes that one only.
    assert!(extra.push(&name("x-b"), b"2"));
    assert_eq!(extra.as_bytes(), b"x-a: 1\r\nx-b: 2\r\n");
    assert!(!kept.push(&name("host"), b"h"));
    assert_eq!(kept.as_bytes(), b"x-a: 1\r\n");
    assert_eq!(handed.as_bytes(), b"x-a: 1\r\n");
    // Sharing what is shared already shares it again.
    let again = kept.share();
    assert_eq!(again, handed);
    // Empty lines shared stay empty.
    let mut none = ExtraFields::default();
    assert!(none.share().is_empty());
}

proptest::proptest! {
    /// An extra field is kept exactly when `HeaderValue` takes its value, and then the head
    /// parses with it as one more field of that value (its surrounding whitespace aside,
    /// which no parser keeps): no value can end its line or add a field.
    #[test]
    fn extra_fields_never_break_the_head(
        parts in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12), 1..4),
    ) {
        let value: Vec<u8> = parts.concat();
        let mut extra = ExtraFields::default();
        let mut line = extra.line(&http::header::HeaderName::from_static("x-v"));
        for p in &parts {
            line.put(p);
        }
        let kept = line.finish();
        proptest::prop_assert_eq!(kept, HeaderValue::from_bytes(&value).is_ok());
        let mut out = Vec::new();
        write_request_head(&mut out, &Method::GET, "/", None, &map(&[("x-m", "m")]), Some(&extra), shape(true, None));
        let mut fields = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut fields);
        let n = req.parse(&out);
        proptest::prop_assert!(matches!(n, Ok(httparse::Status::Complete(len)) if len == out.len()), "{:?}", out);
        let got: Vec<(String, Vec<u8>)> = req.headers.iter().map(|f| (f.name.to_string(), f.value.to_vec())).collect();
        let mut want = vec![("x-m".to_string(), b"m".to_vec())];
        if kept {
            want.push(("x-v".to_string(), value.trim_ascii().to_vec()));
        }
        proptest::prop_assert_eq!(got, want);
    }
}

fn parse(raw: &str) -> Result<Parsed, HeadError> {
    parse_response(raw.as_bytes(), false)
}

fn final_head(raw: &str, head_request: bool) -> ResponseHead {
    match parse_response(raw.as_bytes(), head_request).unwrap() {
        Parsed::Final(n, h) => {
            assert_eq!(n, raw.len());
            h
        }
        other => panic!("{raw:?}: {other:?}"),
    }
}

fn names(h: &ResponseHead) -> Vec<String> {
    h.response
        .headers()
        .iter()
        .map(|(n, v)| format!("{n}={}", v.to_str().unwrap()))
        .collect()
}

#[test]
fn response_heads_are_parsed_without_their_hop_by_hop_fields() {
    let h = final_head(
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\
         Keep-Alive: timeout=5\r\nProxy-Connection: x\r\nUpgrade: h2c\r\nTrailer: x\r\nTE: gzip\r\n\
         X-Keep: yes\r\nSet-Cookie: a\r\nSet-Cookie: b\r\n\r\n",
        false,
    );
    assert_eq!(h.response.status(), 200);
    assert_eq!(h.response.version(), http::Version::HTTP_11);
    assert_eq!(h.framing, ResponseFraming::Length(2));
    assert!(h.keep_alive);
    assert_eq!(
        names(&h),
        [
            "content-length=2",
            "x-keep=yes",
            "set-cookie=a",
            "set-cookie=b"
        ]
    );
    // TE naming trailers is kept as `te: trailers`, as the proxy's strip of a map does.
    let h = final_head(
        "HTTP/1.1 200 OK\r\nte: trailers;q=1, x\r\ncontent-length: 0\r\n\r\n",
        false,
    );
    assert_eq!(names(&h), ["content-length=0", "te=trailers"]);
    assert_eq!(h.framing, ResponseFraming::Length(0));
}

#[test]
fn response_framing_and_keep_alive() {
    let cases: &[(&str, bool, ResponseFraming, bool)] = &[
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            false,
            ResponseFraming::Length(5),
            true,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\ncontent-length: 5\r\n\r\n",
            false,
            ResponseFraming::Length(5),
            true,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            true,
            ResponseFraming::Empty,
            true,
        ),
        (
            "HTTP/1.1 204 No Content\r\n\r\n",
            false,
            ResponseFraming::Empty,
            true,
        ),
        (
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
            false,
            ResponseFraming::Empty,
            true,
        ),
        (
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            false,
            ResponseFraming::Chunked,
            true,
        ),
        (
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: Chunked\r\n\r\n",
            false,
            ResponseFraming::Chunked,
            true,
        ),
        (
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            false,
            ResponseFraming::Close,
            false,
        ),
        (
            "HTTP/1.1 200 OK\r\n\r\n",
            false,
            ResponseFraming::Close,
            false,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\n",
            false,
            ResponseFraming::Length(1),
            false,
        ),
        (
            "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
            false,
            ResponseFraming::Length(1),
            false,
        ),
        // Not even with keep-alive asked: the next request would be written as HTTP/1.1 and
        // may be chunked, which a 1.0 parser reads as a second request.
        (
            "HTTP/1.0 200 OK\r\ncontent-length: 1\r\nconnection: Keep-Alive\r\n\r\n",
            false,
            ResponseFraming::Length(1),
            false,
        ),
    ];
    for (raw, head_request, framing, keep_alive) in cases {
        let h = final_head(raw, *head_request);
        assert_eq!(
            (h.framing, h.keep_alive),
            (*framing, *keep_alive),
            "{raw:?}"
        );
    }
}

#[test]
fn ambiguous_or_malformed_response_heads_are_refused() {
    let refused: &[(&str, HeadError)] = &[
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
            HeadError::LengthAndEncoding,
        ),
        (
            "HTTP/1.1 204 OK\r\ncontent-length: 0\r\ntransfer-encoding: chunked\r\n\r\n",
            HeadError::LengthAndEncoding,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            HeadError::BadLength,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n",
            HeadError::BadLength,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 0x1\r\n\r\n",
            HeadError::BadLength,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            HeadError::BadLength,
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            HeadError::BadLength,
        ),
        (
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
            HeadError::BadEncoding,
        ),
        (
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            HeadError::BadEncoding,
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
            HeadError::UnaskedSwitch,
        ),
    ];
    for (raw, want) in refused {
        assert_eq!(parse(raw).unwrap_err(), *want, "{raw:?}");
    }
    for raw in [
        "HTTP/1.1 200 OK\r\nx: a\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nx : a\r\n\r\n",
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
    ] {
        assert!(
            matches!(parse(raw), Err(HeadError::Syntax(_))),
            "{raw:?}: {:?}",
            parse(raw)
        );
    }
    let many: String = (0..=MAX_FIELDS).map(|i| format!("x-{i}: v\r\n")).collect();
    assert_eq!(
        parse(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).unwrap_err(),
        HeadError::TooManyFields
    );
    assert!(matches!(
        parse("HTTP/1.1 200 OK\r\ncontent-le"),
        Ok(Parsed::Partial)
    ));
    assert!(matches!(
        parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"),
        Ok(Parsed::Interim(25))
    ));
}

/// One script step of the in-memory backend.
#[derive(Debug, Clone)]
enum Step {
    /// These bytes become readable (one read each).
    Send(Vec<u8>),
    /// Reads see the end of the stream.
    Close,
}

/// An in-memory transport: reads hand out the scripted backend bytes one piece per read (then
/// wait forever, or end when the script says so); writes are collected (and fail once `broken`).
#[derive(Debug, Clone)]
struct Mock(Arc<Mutex<MockState>>);

#[derive(Debug, Default)]
struct MockState {
    script: VecDeque<Step>,
    closed: bool,
    written: Vec<u8>,
    broken: bool,
    /// Write at most this many bytes per call (0: all).
    write_max: usize,
    /// Takes vectored writes whole (up to `write_max`), as a socket does (else the trait's
    /// default: the first non-empty slice).
    vectored: bool,
    /// Calls of `poll_write` and of `poll_write_vectored`.
    plain_writes: usize,
    vectored_writes: usize,
}

impl Mock {
    fn new(script: Vec<Step>) -> Mock {
        Mock(Arc::new(Mutex::new(MockState {
            script: script.into(),
            ..Default::default()
        })))
    }
    fn written(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap().written).into_owned()
    }
}

impl AsyncRead for Mock {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut s = self.0.lock().unwrap();
        match s.script.pop_front() {
            Some(Step::Send(mut b)) => {
                let n = b.len().min(buf.remaining());
                buf.put_slice(&b[..n]);
                if n < b.len() {
                    b.drain(..n);
                    s.script.push_front(Step::Send(b));
                }
                Poll::Ready(Ok(()))
            }
            Some(Step::Close) => {
                s.closed = true;
                Poll::Ready(Ok(()))
            }
            None if s.closed => Poll::Ready(Ok(())),
            None => Poll::Pending,
        }
    }
}

impl AsyncWrite for Mock {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut s = self.0.lock().unwrap();
        if s.broken {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        s.plain_writes += 1;
        let n = if s.write_max == 0 {
            buf.len()
        } else {
            buf.len().min(s.write_max)
        };
        s.written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let mut s = self.0.lock().unwrap();
        if !s.vectored {
            drop(s);
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return self.poll_write(cx, first);
        }
        s.vectored_writes += 1;
        if s.broken {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        let mut left = if s.write_max == 0 {
            usize::MAX
        } else {
            s.write_max
        };
        let mut n = 0;
        for b in bufs {
            let k = b.len().min(left);
            s.written.extend_from_slice(&b[..k]);
            n += k;
            left -= k;
        }
        Poll::Ready(Ok(n))
    }
    fn is_write_vectored(&self) -> bool {
        self.0.lock().unwrap().vectored
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

type Released = Arc<Mutex<Option<Conn<Mock>>>>;

/// Keeps a released connection in its slot.
struct IntoSlot(Released);

impl Release<Mock> for IntoSlot {
    fn release(self, conn: Conn<Mock>) {
        *self.0.lock().unwrap() = Some(conn);
    }
}

fn release_into(slot: &Released) -> IntoSlot {
    IntoSlot(slot.clone())
}

fn get_head<'a>(headers: &'a HeaderMap) -> RequestHead<'a> {
    RequestHead {
        method: &Method::GET,
        target: "/",
        host: None,
        headers,
        extra: None,
    }
}

fn empty() -> Full<Bytes> {
    Full::new(Bytes::new())
}

async fn collect<B: Body<Data = Bytes>>(b: B) -> Result<Vec<u8>, B::Error> {
    Ok(b.collect().await?.to_bytes().to_vec())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_small_response_releases_the_connection_as_its_head_arrives() {
    rt().block_on(async {
        let mock = Mock::new(vec![Step::Send(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok".to_vec())]);
        let slot = Released::default();
        let h = HeaderMap::new();
        let resp = Conn::new(mock.clone(), 16384).send(get_head(&h), empty(), release_into(&slot)).await.unwrap();
        assert!(slot.lock().unwrap().is_some(), "released with the head");
        assert!(resp.headers().get("connection").is_none());
        assert!(resp.body().size_hint().exact() == Some(2));
        assert_eq!(collect(resp.into_body()).await.unwrap(), b"ok");
        assert_eq!(mock.written(), "GET / HTTP/1.1\r\n\r\n");
        // The released connection carries the next request.
        mock.0.lock().unwrap().script.push_back(Step::Send(b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()));
        let conn = slot.lock().unwrap().take().unwrap();
        let resp = conn.send(get_head(&h), empty(), release_into(&slot)).await.unwrap();
        assert_eq!(resp.status(), 204);
        assert!(resp.body().is_end_stream());
        assert!(slot.lock().unwrap().is_some());
    });
}

/// A request whose body is copied in after its head (the usual request) leaves in one plain
/// write, not a vectored one with an empty second slice: on a socket a plain write is `send`,
/// the vectored one `writev`, whose VFS path costs more kernel time per call. A large body
/// chunk after the head still goes in one vectored write with it.
#[test]
fn a_small_request_leaves_in_one_plain_write_and_a_large_one_gathered() {
    rt().block_on(async {
        for (body, plain, vectored) in [(0usize, 1, 0), (100, 1, 0), (GATHER_AT_MOST + 1, 0, 1)] {
            let mock = Mock::new(vec![Step::Send(
                b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
            )]);
            mock.0.lock().unwrap().vectored = true;
            let slot = Released::default();
            let h = map(&[("content-length", &body.to_string())]);
            let post = RequestHead {
                method: &Method::POST,
                target: "/",
                ..get_head(&h)
            };
            let resp = Conn::new(mock.clone(), 16384)
                .send(
                    post,
                    Full::new(Bytes::from(vec![b'b'; body])),
                    release_into(&slot),
                )
                .await
                .unwrap();
            assert_eq!(resp.status(), 204);
            let s = mock.0.lock().unwrap();
            assert_eq!(
                (s.plain_writes, s.vectored_writes),
                (plain, vectored),
                "body {body}"
            );
            let end = s.written.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            assert_eq!(&s.written[end..], &vec![b'b'; body][..]);
        }
    });
}

#[test]
fn connections_are_released_only_after_a_clean_complete_response() {
    // (backend bytes, released?, body or error)
    let cases: Vec<(Vec<Step>, bool, Result<&str, ()>)> = vec![
        // Streamed in pieces: released at the last piece.
        (
            vec![
                Step::Send(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nab".to_vec()),
                Step::Send(b"cd".to_vec()),
                Step::Send(b"ef".to_vec()),
            ],
            true,
            Ok("abcdef"),
        ),
        // Chunked.
        (
            vec![
                Step::Send(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n".to_vec(),
                ),
                Step::Send(b"2\r\nde\r\n0\r\n\r\n".to_vec()),
            ],
            true,
            Ok("abcde"),
        ),
        // Asked to close.
        (
            vec![Step::Send(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".to_vec(),
            )],
            false,
            Ok("ok"),
        ),
        // More than declared: the extra bytes are not a response of ours.
        (
            vec![Step::Send(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA".to_vec(),
            )],
            false,
            Ok("ok"),
        ),
        (
            vec![
                Step::Send(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nok".to_vec()),
                Step::Send(b"okEXTRA".to_vec()),
            ],
            false,
            Ok("okok"),
        ),
        // Close-delimited.
        (
            vec![
                Step::Send(b"HTTP/1.1 200 OK\r\n\r\nto the end".to_vec()),
                Step::Close,
            ],
            false,
            Ok("to the end"),
        ),
        // Shorter than declared.
        (
            vec![
                Step::Send(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort".to_vec()),
                Step::Close,
            ],
            false,
            Err(()),
        ),
        (
            vec![
                Step::Send(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab".to_vec(),
                ),
                Step::Close,
            ],
            false,
            Err(()),
        ),
        (
            vec![Step::Send(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            )],
            false,
            Err(()),
        ),
    ];
    for (i, (script, released, want)) in cases.into_iter().enumerate() {
        rt().block_on(async {
            let slot = Released::default();
            let h = HeaderMap::new();
            let resp = Conn::new(Mock::new(script), 16384)
                .send(get_head(&h), empty(), release_into(&slot))
                .await
                .unwrap();
            let got = collect(resp.into_body()).await;
            match want {
                Ok(body) => assert_eq!(String::from_utf8(got.unwrap()).unwrap(), body, "case {i}"),
                Err(()) => assert!(got.is_err(), "case {i}: {got:?}"),
            }
            assert_eq!(slot.lock().unwrap().is_some(), released, "case {i}");
        });
    }
}

#[test]
fn chunked_trailers_come_after_the_data_and_the_connection_goes_back() {
    rt().block_on(async {
        let h = HeaderMap::new();
        let slot = Released::default();
        let mock = Mock::new(vec![Step::Send(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-t\r\n\r\n3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n".to_vec(),
        )]);
        let resp = Conn::new(mock, 16384)
            .send(get_head(&h), empty(), release_into(&slot))
            .await
            .unwrap();
        assert!(resp.headers().get("trailer").is_none());
        let mut body = resp.into_body();
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "abc");
        let trailers = body.frame().await.unwrap().unwrap().into_trailers().unwrap();
        assert_eq!(trailers["x-t"], "1");
        assert!(body.is_end_stream() && body.frame().await.is_none());
        assert!(slot.lock().unwrap().is_some(), "read whole: released");
    });
}

#[test]
fn refused_heads_and_early_closes_are_errors_that_say_what_was_sent() {
    rt().block_on(async {
        let h = HeaderMap::new();
        let slot = Released::default();
        // Both framings: refused.
        let mock = Mock::new(vec![Step::Send(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
        )]);
        let e = Conn::new(mock, 16384)
            .send(get_head(&h), empty(), release_into(&slot))
            .await
            .unwrap_err();
        assert!(
            matches!(e.error, Error::Head(HeadError::LengthAndEncoding)),
            "{e:?}"
        );
        assert!(e.unsent.is_none() && e.response_started);
        // Closed before any response byte: a disconnect, the request was sent.
        let e = Conn::new(Mock::new(vec![Step::Close]), 16384)
            .send(get_head(&h), empty(), release_into(&slot))
            .await
            .unwrap_err();
        assert!(
            e.error.is_disconnect() && !e.response_started && e.unsent.is_none(),
            "{e:?}"
        );
        // A head larger than the read buffer.
        let big = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(2000));
        let e = Conn::new(Mock::new(vec![Step::Send(big.into_bytes())]), 1024)
            .send(get_head(&h), empty(), release_into(&slot))
            .await
            .unwrap_err();
        assert!(matches!(e.error, Error::HeadTooLarge(1024)), "{e:?}");
        // Nothing written (the transport refuses the first write): the body comes back whole.
        let mock = Mock::new(vec![]);
        mock.0.lock().unwrap().broken = true;
        let post = RequestHead {
            method: &Method::POST,
            ..get_head(&h)
        };
        let e = Conn::new(mock, 16384)
            .send(
                post,
                Full::new(Bytes::from_static(b"payload")),
                release_into(&slot),
            )
            .await
            .unwrap_err();
        assert!(e.error.is_disconnect(), "{e:?}");
        let unsent = e.unsent.expect("given back");
        assert_eq!(unsent.size_hint().exact(), Some(7));
        assert_eq!(collect(unsent).await.unwrap(), b"payload");
        assert!(slot.lock().unwrap().is_none());
    });
}

/// A request body fed by the test, one chunk at a time.
#[derive(Debug)]
struct Chunks(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

#[test]
fn request_bodies_stream_chunked_and_an_early_response_keeps_them_going() {
    rt().block_on(async {
        let h = HeaderMap::new();
        let slot = Released::default();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        // The backend answers at once (an echo would), before the request body is out.
        let mock = Mock::new(vec![Step::Send(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n".to_vec(),
        )]);
        mock.0.lock().unwrap().write_max = 7;
        let post = RequestHead {
            method: &Method::POST,
            target: "/up",
            ..get_head(&h)
        };
        tx.send(Bytes::from_static(b"hello ")).await.unwrap();
        let resp = Conn::new(mock.clone(), 16384)
            .send(post, Chunks(rx), release_into(&slot))
            .await
            .unwrap();
        assert!(
            mock.written()
                .ends_with("transfer-encoding: chunked\r\n\r\n6\r\nhello \r\n"),
            "{}",
            mock.written()
        );
        let mut body = resp.into_body();
        tx.send(Bytes::from(vec![b'x'; 10_000])).await.unwrap();
        drop(tx);
        mock.0
            .lock()
            .unwrap()
            .script
            .push_back(Step::Send(b"abc".to_vec()));
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "abc"
        );
        assert!(body.frame().await.is_none());
        let want = format!("6\r\nhello \r\n2710\r\n{}\r\n0\r\n\r\n", "x".repeat(10_000));
        assert!(mock.written().ends_with(&want), "{}", mock.written());
        assert!(
            slot.lock().unwrap().is_some(),
            "request and response whole: released"
        );
    });
}

#[test]
fn request_bodies_longer_or_shorter_than_their_length_fail() {
    rt().block_on(async {
        let cl = map(&[("content-length", "3")]);
        let slot = Released::default();
        for body in ["ab", "abcd"] {
            let mock = Mock::new(vec![]);
            let post = RequestHead {
                method: &Method::POST,
                target: "/",
                host: None,
                headers: &cl,
                extra: None,
            };
            let e = Conn::new(mock, 16384)
                .send(
                    post,
                    Full::new(Bytes::from_static(body.as_bytes())),
                    release_into(&slot),
                )
                .await
                .unwrap_err();
            assert!(matches!(e.error, Error::RequestLength), "{body}: {e:?}");
        }
    });
}

#[test]
fn is_closed_sees_end_of_stream_and_unasked_bytes() {
    let mut live = Conn::new(Mock::new(vec![]), 16384);
    assert!(!live.is_closed());
    assert!(Conn::new(Mock::new(vec![Step::Close]), 16384).is_closed());
    assert!(Conn::new(Mock::new(vec![Step::Send(b"HTTP/1.1 200".to_vec())]), 16384).is_closed());
}

/// The bytes of a response carrying `body` framed as `chunked` (with these chunk sizes) or by
/// Content-Length.
fn encode_response(body: &[u8], chunks: Option<&[usize]>, keep_alive: bool) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nx-a: 1\r\n".to_vec();
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    match chunks {
        None => {
            out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
        }
        Some(sizes) => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
            let mut rest = body;
            let mut sizes = sizes.iter().cycle();
            while !rest.is_empty() {
                let n = (*sizes.next().unwrap()).clamp(1, rest.len());
                out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                out.extend_from_slice(&rest[..n]);
                out.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }
    out
}

/// A request body of these chunks, its length unknown, ended as its last chunk is taken.
#[derive(Debug)]
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 64, ..Default::default() })]

    /// Any request body, in chunks of any size (small ones gathered, large ones written from
    /// where they are), through a transport taking any number of bytes per write: what the
    /// backend receives is the head and the body framed as announced (chunked when its length
    /// is unknown, else exactly its Content-Length bytes).
    #[test]
    fn request_bodies_arrive_framed_as_announced(
        sizes in proptest::collection::vec(0usize..20_000, 0..6),
        declared in proptest::prelude::any::<bool>(),
        write_max in 0usize..5000,
        vectored in proptest::prelude::any::<bool>(),
    ) {
        let chunks: VecDeque<Bytes> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Bytes::from(vec![b'a' + i as u8; n]))
            .collect();
        let body: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let headers = if declared {
            map(&[("content-length", &body.len().to_string())])
        } else {
            HeaderMap::new()
        };
        let mock = Mock::new(vec![Step::Send(b"HTTP/1.1 204 No Content\r\n\r\n".to_vec())]);
        mock.0.lock().unwrap().write_max = write_max;
        mock.0.lock().unwrap().vectored = vectored;
        let slot = Released::default();
        let post = RequestHead { method: &Method::POST, target: "/", host: None, headers: &headers, extra: None };
        let resp = rt().block_on(Conn::new(mock.clone(), 16384).send(post, Frames(chunks), release_into(&slot)));
        proptest::prop_assert_eq!(resp.unwrap().status(), 204);
        proptest::prop_assert!(slot.lock().unwrap().is_some());
        let wire = mock.0.lock().unwrap().written.clone();
        let end = wire.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&wire[..end]).into_owned();
        let mut rest = BytesMut::from(&wire[end..]);
        if declared {
            proptest::prop_assert!(head.contains(&format!("content-length: {}\r\n", body.len())), "{}", head);
            proptest::prop_assert_eq!(&rest[..], &body[..]);
        } else if body.is_empty() && sizes.is_empty() {
            proptest::prop_assert!(head.contains("content-length: 0\r\n"), "{}", head);
            proptest::prop_assert!(rest.is_empty());
        } else {
            proptest::prop_assert!(head.contains("transfer-encoding: chunked\r\n"), "{}", head);
            let mut d = crate::chunked::Decoder::new(Default::default());
            let mut got = Vec::new();
            while let Some(c) = d.decode(&mut rest).unwrap() {
                match c {
                    crate::chunked::Chunk::Data(b) => got.extend_from_slice(&b),
                    crate::chunked::Chunk::End(_) => break,
                }
            }
            proptest::prop_assert!(d.is_done() && rest.is_empty());
            proptest::prop_assert_eq!(got, body);
        }
    }

    /// Any body, framed either way, read in any pieces and through any read buffer bound:
    /// comes out whole, no piece larger than the bound, and the connection is released exactly
    /// when the response allowed it.
    #[test]
    fn bodies_come_out_whole_in_bounded_pieces_whatever_the_reads(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20_000),
        chunked in proptest::prelude::any::<bool>(),
        sizes in proptest::collection::vec(1usize..5000, 1..4),
        cuts in proptest::collection::vec(1usize..3000, 1..8),
        keep_alive in proptest::prelude::any::<bool>(),
        read_ahead in 1024usize..20_000,
    ) {
        let wire = encode_response(&body, chunked.then_some(&sizes[..]), keep_alive);
        let mut script = Vec::new();
        let mut rest = &wire[..];
        let mut cut = cuts.iter().cycle();
        while !rest.is_empty() {
            let n = (*cut.next().unwrap()).min(rest.len());
            script.push(Step::Send(rest[..n].to_vec()));
            rest = &rest[n..];
        }
        let (got, largest, released) = rt().block_on(async {
            let h = HeaderMap::new();
            let slot = Released::default();
            let resp = Conn::new(Mock::new(script), read_ahead).send(get_head(&h), empty(), release_into(&slot)).await.unwrap();
            let mut b = resp.into_body();
            let mut got = Vec::new();
            let mut largest = 0;
            while let Some(f) = b.frame().await {
                let d = f.unwrap().into_data().unwrap();
                largest = largest.max(d.len());
                got.extend_from_slice(&d);
            }
            let released = slot.lock().unwrap().is_some();
            (got, largest, released)
        });
        proptest::prop_assert_eq!(got, body);
        proptest::prop_assert!(largest <= read_ahead);
        proptest::prop_assert_eq!(released, keep_alive);
    }

    /// Whatever the bytes, parsing never panics, never claims more than it was given, and a
    /// final head's map has no hop-by-hop field.
    #[test]
    fn any_bytes_parse_or_are_refused(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), head in proptest::prelude::any::<bool>()) {
        let mut with_status = b"HTTP/1.1 200 OK\r\n".to_vec();
        with_status.extend_from_slice(&raw);
        for input in [&raw[..], &with_status[..]] {
            match parse_response(input, head) {
                Ok(Parsed::Final(n, h)) => {
                    proptest::prop_assert!(n <= input.len());
                    for name in ["connection", "keep-alive", "transfer-encoding", "upgrade", "trailer", "proxy-connection"] {
                        proptest::prop_assert!(h.response.headers().get(name).is_none());
                    }
                }
                Ok(Parsed::Interim(n)) => proptest::prop_assert!(n <= input.len()),
                Ok(Parsed::Partial) | Err(_) => {}
            }
        }
    }
}

/// A body of one data frame and then trailer fields, of unknown length (sent chunked).
#[derive(Debug)]
struct WithTrailers(Option<Bytes>, Option<HeaderMap>);

impl Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(d) = self.0.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(d))));
        }
        Poll::Ready(self.1.take().map(|t| Ok(http_body::Frame::trailers(t))))
    }
}

// A client's trailer fields and its `Expect` never reach the backend: the trailers could
// carry a Host, forwarding or credential field the proxy never checked (a backend that merges
// trailers into the head would believe them), and `Expect: 100-continue` with a body sent at
// once would let a backend that answers early read the body as its next request.
#[test]
fn request_trailers_and_expect_never_reach_the_backend() {
    rt().block_on(async {
        let h = map(&[("expect", "100-continue"), ("x-a", "1")]);
        let slot = Released::default();
        let mock = Mock::new(vec![Step::Send(
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
        )]);
        let trailers = map(&[
            ("host", "admin.internal"),
            ("x-forwarded-for", "10.0.0.1"),
            ("authorization", "Basic YTpi"),
        ]);
        let post = RequestHead {
            method: &Method::POST,
            target: "/up",
            ..get_head(&h)
        };
        let body = WithTrailers(Some(Bytes::from_static(b"abc")), Some(trailers));
        let resp = Conn::new(mock.clone(), 16384)
            .send(post, body, release_into(&slot))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            mock.written(),
            "POST /up HTTP/1.1\r\nx-a: 1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        );
    });
}

// A backend that streams interim responses gets at most MAX_INTERIM of them read before the
// try fails; that many and then a final response is fine.
#[test]
fn interim_responses_are_bounded() {
    rt().block_on(async {
        let h = HeaderMap::new();
        let slot = Released::default();
        let interim = "HTTP/1.1 100 Continue\r\n\r\n";
        let fine = format!(
            "{}HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            interim.repeat(MAX_INTERIM)
        );
        let resp = Conn::new(Mock::new(vec![Step::Send(fine.into_bytes())]), 16384)
            .send(get_head(&h), empty(), release_into(&slot))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let endless = interim.repeat(MAX_INTERIM + 1);
        let e = Conn::new(Mock::new(vec![Step::Send(endless.into_bytes())]), 16384)
            .send(get_head(&h), empty(), release_into(&slot))
            .await
            .unwrap_err();
        assert!(matches!(e.error, Error::TooManyInterim), "{e:?}");
    });
}

// A `Connection` field may name at most MAX_FIELDS options: the names are collected once, so
// a head's cost stays fields x that bound however long the list.
#[test]
fn a_connection_field_naming_too_many_options_is_refused() {
    let opts: Vec<String> = (0..MAX_FIELDS).map(|i| format!("x-{i}")).collect();
    let ok = format!(
        "HTTP/1.1 200 OK\r\nconnection: {}\r\nx-5: dropped\r\ny: kept\r\ncontent-length: 0\r\n\r\n",
        opts.join(", ")
    );
    let h = final_head(&ok, false);
    assert_eq!(names(&h), ["y=kept", "content-length=0"]);
    let over = format!(
        "HTTP/1.1 200 OK\r\nconnection: {}, one-more\r\ncontent-length: 0\r\n\r\n",
        opts.join(", ")
    );
    assert!(matches!(parse(&over), Err(HeadError::InvalidField)));
}

// A GET or HEAD whose body has no known length goes chunked with `Connection: close`, and the
// connection is not reused: a backend that ignores bodies on GET would read the chunked body
// as a next request (no route or access rule saw it); told to close, it reads nothing after
// the first request. A POST's chunked body keeps the connection; so does a GET of known
// length. Before, the GET went chunked on a kept connection.
#[test]
fn a_body_on_a_method_that_gives_it_no_meaning_asks_the_backend_to_close() {
    rt().block_on(async {
        let h = HeaderMap::new();
        // (method, body: "chunked" of unknown length, "length" of 2 bytes, or "empty", closes)
        for (method, body, closes) in [
            (Method::GET, "chunked", true),
            (Method::HEAD, "chunked", true),
            (Method::OPTIONS, "chunked", true),
            (Method::POST, "chunked", false),
            (Method::GET, "length", true),
            (Method::DELETE, "length", true),
            (Method::TRACE, "length", true),
            (Method::POST, "length", false),
            (Method::PUT, "length", false),
            (Method::GET, "empty", false),
            (Method::DELETE, "empty", false),
        ] {
            let slot = Released::default();
            let mock = Mock::new(vec![Step::Send(
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
            )]);
            let req = RequestHead {
                method: &method,
                ..get_head(&h)
            };
            let conn = Conn::new(mock.clone(), 16384);
            let got = match body {
                "chunked" => {
                    let (tx, rx) = tokio::sync::mpsc::channel(1);
                    tx.send(Bytes::from_static(b"GET /admin HTTP/1.1\r\n\r\n"))
                        .await
                        .unwrap();
                    drop(tx);
                    let resp = conn.send(req, Chunks(rx), release_into(&slot)).await;
                    collect(resp.unwrap().into_body()).await.unwrap()
                }
                "length" => {
                    let full = Full::new(Bytes::from_static(b"{}"));
                    let resp = conn.send(req, full, release_into(&slot)).await;
                    collect(resp.unwrap().into_body()).await.unwrap()
                }
                _ => {
                    let full = Full::new(Bytes::new());
                    let resp = conn.send(req, full, release_into(&slot)).await;
                    collect(resp.unwrap().into_body()).await.unwrap()
                }
            };
            assert_eq!(got, b"");
            let written = mock.written();
            assert_eq!(
                written.contains("\r\nconnection: close\r\n"),
                closes,
                "{method} {body}: {written}"
            );
            assert_eq!(
                written.contains("\r\ntransfer-encoding: chunked\r\n"),
                body == "chunked",
                "{written}"
            );
            assert_eq!(
                slot.lock().unwrap().is_some(),
                !closes,
                "{method} {body} released"
            );
        }
    });
}
