//! The HTTP/1.1 server connection (`sweety_h1::server::serve`) on arbitrary client bytes,
//! over an in-memory pipe, each input served twice: written whole (one write), and split at
//! arbitrary points (piece sizes 1..=64 from a generator the input seeds). The first byte picks
//! small head limits for half of the runs and the service:
//! * collect-first: reads each request body to its end, then answers with its length;
//! * echo-first: answers at once (200, the request's length if it has one) with a body that
//!   streams the request body back as it is read (a HEAD is collected first: its answer has
//!   no body to stream it through).
//!
//! Checks: no panic; the connection ends (the clock is paused, so the header-read timeout
//! fires at once when the input stops mid-head); what it wrote parses as whole responses,
//! each framed by its Content-Length or chunked (only the last may be cut short, when the body
//! it streams broke), no more answers than requests the service saw plus one refusal; and
//! the differential: the whole and the split run give the same requests to the service and
//! the same responses (status, fields but `date`, decoded body, cut short or not), `100
//! Continue` aside (it goes out only when the body is not already there).

#![no_main]

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use sweety_h1::server::{self, ConflictingFraming, RecvBody, Service, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// What the service saw of each request (its head), in order.
type Seen = Arc<Mutex<Vec<String>>>;

struct Svc {
    echo: bool,
    seen: Seen,
}

/// The request body streamed back, an error as the body's error.
struct Echo(RecvBody);

impl http_body::Body for Echo {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.0).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => match f.into_data() {
                Ok(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                // Trailers are not echoed: the body ends.
                Err(_) => Poll::Ready(None),
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

impl Service for Svc {
    type Body = Body;
    type Future = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;
    fn call(&mut self, req: Request<RecvBody>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let mut fields: Vec<String> = parts
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {v:?}"))
            .collect();
        fields.sort();
        self.seen.lock().unwrap().push(format!(
            "{} {} {:?} conflict={} {fields:?}",
            parts.method,
            parts.uri,
            parts.version,
            parts.extensions.get::<ConflictingFraming>().is_some()
        ));
        let echo = self.echo && parts.method != http::Method::HEAD;
        Box::pin(async move {
            if echo {
                return Response::new(Echo(body).boxed_unsync());
            }
            let n = match body.collect().await {
                Ok(c) => c.to_bytes().len().to_string(),
                Err(e) => e.to_string(),
            };
            Response::new(
                Full::new(Bytes::from(n))
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )
        })
    }
    fn limit_hit(&self, _: &'static str) {}
}

/// One response as the client read it.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    /// The fields but `date`, in order.
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// The connection ended inside its body.
    cut: bool,
}

/// Decodes a chunked body at the start of `b` strictly: (its data, bytes used), or the data
/// so far and None when the input ends first. Panics on anything but the engine's encoding.
fn chunked(b: &[u8]) -> (Vec<u8>, Option<usize>) {
    let mut data = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = b[at..].windows(2).position(|w| w == b"\r\n") else {
            return (data, None);
        };
        let line = std::str::from_utf8(&b[at..at + eol]).expect("chunk size is text");
        let size = usize::from_str_radix(line, 16).expect("chunk size is hex, no extension");
        at += eol + 2;
        if size == 0 {
            // Trailers (none are echoed), then the empty line.
            loop {
                let Some(eol) = b[at..].windows(2).position(|w| w == b"\r\n") else {
                    return (data, None);
                };
                at += eol + 2;
                if eol == 0 {
                    return (data, Some(at));
                }
            }
        }
        assert!(size > 0);
        if b.len() < at + size {
            data.extend_from_slice(&b[at..]);
            return (data, None);
        }
        data.extend_from_slice(&b[at..at + size]);
        at += size;
        if b.len() < at + 2 {
            return (data, None);
        }
        assert_eq!(&b[at..at + 2], b"\r\n", "a chunk ends with CRLF");
        at += 2;
    }
}

/// The responses in `out`, `100 Continue` left out; `seen`: the requests they answer, in
/// order (an answer to HEAD or CONNECT has no body whatever its fields say).
fn answers(out: &[u8], seen: &[String]) -> Vec<Answer> {
    let mut v: Vec<Answer> = Vec::new();
    let mut rest = out;
    while !rest.is_empty() {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        let n = match resp.parse(rest) {
            Ok(httparse::Status::Complete(n)) => n,
            r => panic!(
                "not a whole response head ({r:?}): {:?}",
                String::from_utf8_lossy(rest)
            ),
        };
        let status = resp.code.unwrap_or(0);
        let fields: Vec<(String, Vec<u8>)> = resp
            .headers
            .iter()
            .filter(|h| !h.name.eq_ignore_ascii_case("date"))
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        let field = |name: &str| {
            fields
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        let lengths = field("content-length");
        let te = field("transfer-encoding");
        assert!(lengths.len() <= 1 && te.len() <= 1, "one framing field");
        assert!(lengths.is_empty() || te.is_empty(), "never both framings");
        rest = &rest[n..];
        if status == 100 {
            assert!(lengths.is_empty() && te.is_empty());
            continue;
        }
        let bodiless = seen
            .get(v.len())
            .is_some_and(|r| r.starts_with("HEAD ") || r.starts_with("CONNECT "));
        let (body, cut) = if bodiless {
            (Vec::new(), false)
        } else if let Some(l) = lengths.first() {
            let len: usize = std::str::from_utf8(l).unwrap().parse().unwrap();
            if rest.len() < len {
                let b = rest.to_vec();
                rest = &[];
                (b, true)
            } else {
                let b = rest[..len].to_vec();
                rest = &rest[len..];
                (b, false)
            }
        } else if let Some(t) = te.first() {
            assert_eq!(&t[..], b"chunked");
            let (b, used) = chunked(rest);
            match used {
                Some(u) => {
                    rest = &rest[u..];
                    (b, false)
                }
                None => {
                    rest = &[];
                    (b, true)
                }
            }
        } else {
            // No framing: a 101 or 2xx to CONNECT (none here), or a body until the close.
            let b = rest.to_vec();
            rest = &[];
            (b, false)
        };
        assert!(!cut || rest.is_empty(), "only the last answer may be cut short");
        v.push(Answer {
            status,
            fields,
            body,
            cut,
        });
    }
    v
}

/// Serves `input` written in pieces of `sizes` (None: at once); the service's requests and the
/// raw output.
fn run(input: &[u8], settings: Settings, echo: bool, sizes: Option<u64>) -> (Vec<String>, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let input = input.to_vec();
    rt.block_on(async move {
        let (c, s) = tokio::io::duplex(1 << 16);
        let seen: Seen = Arc::default();
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(server::serve(
            s,
            BytesMut::new(),
            Svc {
                echo,
                seen: seen.clone(),
            },
            settings,
            rx,
        ));
        // The client writes and reads at once (a server blocked on a full pipe while the
        // client still writes would be the harness's deadlock, not the server's).
        let (mut rd, mut wr) = tokio::io::split(c);
        let writer = tokio::spawn(async move {
            match sizes {
                None => {
                    let _ = wr.write_all(&input).await;
                }
                Some(mut seed) => {
                    let mut rest = &input[..];
                    while !rest.is_empty() {
                        // xorshift: piece sizes 1..=64.
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let n = ((seed % 64) as usize + 1).min(rest.len());
                        if wr.write_all(&rest[..n]).await.is_err() {
                            break;
                        }
                        rest = &rest[n..];
                        tokio::task::yield_now().await;
                    }
                }
            }
            let _ = wr.shutdown().await;
        });
        let reader = tokio::spawn(async move {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        });
        let out = tokio::time::timeout(Duration::from_secs(3600), reader)
            .await
            .expect("the connection ends")
            .unwrap();
        let _ = writer.await;
        let _ = task.await;
        let seen = seen.lock().unwrap().clone();
        (seen, out)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let settings = if sel & 0x80 != 0 {
        Settings {
            max_head_bytes: 256,
            max_fields: 4,
            header_read_timeout: Duration::from_secs(5),
            ..Settings::default()
        }
    } else {
        Settings::default()
    };
    let echo = sel & 0x40 != 0;
    let seed = u64::from(sel & 0x3f) * 0x9e37_79b9 + 1;
    let (seen_whole, out_whole) = run(input, settings, echo, None);
    let (seen_split, out_split) = run(input, settings, echo, Some(seed));
    let whole = answers(&out_whole, &seen_whole);
    let split = answers(&out_split, &seen_split);
    // Every answer is to a request the service saw, or the one refusal that ends it.
    assert!(whole.len() <= seen_whole.len() + 1);
    assert!(split.len() <= seen_split.len() + 1);
    assert_eq!(seen_whole, seen_split, "the same requests, whole and split");
    assert_eq!(whole, split, "the same answers, whole and split");
});
