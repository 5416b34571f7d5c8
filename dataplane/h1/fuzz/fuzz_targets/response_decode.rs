//! A backend's response, arbitrary bytes, read by the client side (`sweety_h1::client`) as the
//! proxy reads it: `Conn::send` of a GET (or HEAD) then the whole response body, over an
//! in-memory transport. The first byte picks the request method, the read buffer's bound
//! (1 KiB to 32 KiB) and how the rest is split into reads (1..=64 bytes each, or whole); the
//! transport ends after the rest.
//! Checks: no panic and no hang (every poll makes progress or ends); the outcome (head,
//! body, trailers, error kind, released or not) is the same however the bytes arrive; no body
//! piece is empty or larger than the read buffer's bound; a `Content-Length` body that ends
//! cleanly has exactly that length; a released connection had a keep-alive response read to
//! its end with nothing after it; a response refused for its framing is never released.

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

#[derive(Clone, Default)]
struct Slot(Arc<Mutex<bool>>);

/// Released, and nothing left unread behind the response (bytes a split read has not
/// reached yet would be found by the pool's idle check, as the whole read finds them in the
/// buffer and does not release).
impl Release<Wire> for Slot {
    fn release(self, conn: Conn<Wire>) {
        let wire = conn.get_ref();
        *self.0.lock().unwrap() = wire.pos == wire.data.len();
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
    let req = RequestHead { method: &method, target: "/", host: None, headers: &headers };
    let empty = http_body_util::Empty::<Bytes>::new();
    let resp = match now(Conn::new(wire, read_ahead).send(req, empty, slot.clone())) {
        Ok(r) => r,
        Err(e) => {
            assert!(e.unsent.is_none(), "the request was written");
            assert!(!*slot.0.lock().unwrap(), "released after an error");
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
    let released = *slot.0.lock().unwrap();
    if released {
        assert!(result.is_ok(), "released after a broken body");
    }
    Outcome::Response { status, headers, body: result, released }
}

fuzz_target!(|input: &[u8]| {
    let Some((&first, data)) = input.split_first() else {
        return;
    };
    let head_request = first & 1 == 1;
    let read_ahead = 1024 << ((first >> 1) & 5);
    let step = usize::from(first >> 4) * 4;
    let whole = run(data, 0, head_request, read_ahead);
    let split = run(data, step.max(1), head_request, read_ahead);
    assert_eq!(whole, split, "the outcome depends on how the bytes arrive");
});
