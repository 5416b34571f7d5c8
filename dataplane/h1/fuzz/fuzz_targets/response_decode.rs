//! A backend's response, arbitrary bytes, read by the client side (`sweety_h1::client`) as the
//! proxy reads it: `Conn::send` of a GET (or HEAD) then the whole response body, over an
//! in-memory transport. The first byte picks the request method, the read buffer's bound
//! (1, 2, 4, 8, 16 or 32 KiB) and how the rest is split into reads (1..=64 bytes each; each
//! input is also read whole); the transport ends after the rest.
//! Checks: no panic and no hang (every poll makes progress or ends); the outcome (head,
//! body, trailers, error kind, released or not) is the same however the bytes arrive; no body
//! piece is empty or larger than the read buffer's bound; a `Content-Length` body that ends
//! cleanly has exactly that length; a released connection had a keep-alive response read to
//! its end with nothing after it, by an oracle of its own ([`may_keep_alive`]: HTTP/1.1, no
//! `close`, a framing that ends), and with no byte left unread; a response refused for its
//! framing is never released.

#![no_main]

use bytes::Bytes;
use http::{HeaderMap, Method};
use http_body::Body;
use libfuzzer_sys::fuzz_target;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use sweety_h1::client::{Conn, Release, RequestHead};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Hands out `data` `step` bytes per read (0: all at once), then the end of the stream;
/// takes every write.
struct Wire {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl AsyncRead for Wire {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let left = self.data.len() - self.pos;
        let mut n = left.min(buf.remaining());
        if self.step > 0 {
            n = n.min(self.step);
        }
        let pos = self.pos;
        buf.put_slice(&self.data[pos..pos + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// (released, bytes the transport had not handed out yet when it was).
#[derive(Clone, Default)]
struct Slot(Arc<Mutex<(bool, usize)>>);

/// Records the release and what was left unread behind the response: bytes a split read
/// had not reached yet would be found by the pool's idle check (`is_closed`), as the whole
/// read finds them in its buffer and must not release.
impl Release<Wire> for Slot {
    fn release(self, mut conn: Conn<Wire>) {
        let wire = conn.get_ref();
        let unread = wire.data.len() - wire.pos;
        if unread > 0 {
            assert!(conn.is_closed(), "the idle check misses bytes behind the response");
        }
        *self.0.lock().unwrap() = (true, unread);
    }
}

/// Whether the first final response in `data` allows its connection to carry another
/// request, by a reading of its own: HTTP/1.1, no `close` in `Connection`, and a body that
/// ends by its framing (none for HEAD, 204 and 304; `Content-Length`; chunked as the last
/// coding), not by the connection closing. An upper bound: the client may still refuse it.
fn may_keep_alive(mut data: &[u8], head_request: bool) -> bool {
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let mut resp = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(n)) = resp.parse(data) else {
            return false;
        };
        let code = resp.code.unwrap_or(0);
        if (100..200).contains(&code) && code != 101 {
            data = &data[n..];
            continue;
        }
        if resp.version != Some(1) {
            return false;
        }
        let fields: &[httparse::Header<'_>] = resp.headers;
        let has = |name: &str| fields.iter().any(|f| f.name.eq_ignore_ascii_case(name));
        let tokens = |name: &str| -> Vec<String> {
            fields
                .iter()
                .filter(|f| f.name.eq_ignore_ascii_case(name))
                .flat_map(|f| String::from_utf8_lossy(f.value).split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>())
                // Empty list elements are ignored (RFC 9110 §5.6.1): `chunked,` is chunked.
                .filter(|t| !t.is_empty())
                .collect()
        };
        if tokens("connection").iter().any(|t| t == "close") {
            return false;
        }
        if head_request || code == 204 || code == 304 {
            return true;
        }
        if has("transfer-encoding") {
            return tokens("transfer-encoding").last().is_some_and(|t| t == "chunked");
        }
        return has("content-length");
    }
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Refused(String),
    Response {
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Result<(Vec<u8>, Option<HeaderMap>), String>,
        released: bool,
    },
}

/// Polls `f` to its end; the transport never waits, so each poll must finish.
fn now<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("waited on a transport that never waits"),
    }
}

fn run(data: &[u8], step: usize, head_request: bool, read_ahead: usize) -> Outcome {
    let wire = Wire { data: data.to_vec(), pos: 0, step };
    let slot = Slot::default();
    let headers = HeaderMap::new();
    let method = if head_request { Method::HEAD } else { Method::GET };
    let req = RequestHead { method: &method, target: "/", host: None, headers: &headers, extra: None };
    let empty = http_body_util::Empty::<Bytes>::new();
    let resp = match now(Conn::new(wire, read_ahead).send(req, empty, slot.clone())) {
        Ok(r) => r,
        Err(e) => {
            assert!(e.unsent.is_none(), "the request was written");
            assert!(!slot.0.lock().unwrap().0, "released after an error");
            return Outcome::Refused(format!("{:?}", std::mem::discriminant(&e.error)));
        }
    };
    let status = resp.status().as_u16();
    let declared = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let headers = resp.headers().iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let mut trailers = None;
    let result = loop {
        let frame = match Pin::new(&mut body).poll_frame(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(f) => f,
            Poll::Pending => panic!("the body waited on a transport that never waits"),
        };
        match frame {
            None => break Ok((got, trailers)),
            Some(Err(e)) => break Err(format!("{e}")),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => {
                    assert!(!d.is_empty() && d.len() <= read_ahead, "piece of {}", d.len());
                    assert!(trailers.is_none(), "data after trailers");
                    got.extend_from_slice(&d);
                    assert!(got.len() <= data.len());
                }
                Err(f) => trailers = Some(f.into_trailers().unwrap()),
            },
        }
    };
    if let (Ok((b, _)), Some(n), false, false) = (&result, declared, head_request, status == 204 || status == 304) {
        assert_eq!(b.len() as u64, n, "a clean Content-Length body has its length");
    }
    let (released, unread) = *slot.0.lock().unwrap();
    if released {
        assert!(result.is_ok(), "released after a broken body");
        assert!(may_keep_alive(data, head_request), "released a response that closes its connection");
    }
    // Bytes left behind the response: the pool's idle check drops the connection (see
    // `Slot`), as the whole read does not release it.
    let released = released && unread == 0;
    Outcome::Response { status, headers, body: result, released }
}

fuzz_target!(|input: &[u8]| {
    let Some((&first, data)) = input.split_first() else {
        return;
    };
    let head_request = first & 1 == 1;
    let read_ahead = 1024 << (((first >> 1) & 7) % 6);
    let step = 1 + usize::from(first >> 4) * 4 + usize::from((first >> 1) & 3);
    let whole = run(data, 0, head_request, read_ahead);
    let split = run(data, step, head_request, read_ahead);
    assert_eq!(whole, split, "the outcome depends on how the bytes arrive");
});
