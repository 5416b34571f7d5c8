//! The HTTP/1.1 server connection (`sweety_h1::server::serve`) on arbitrary client bytes,
//! over an in-memory pipe, with a service that reads each request body to its end and
//! answers with its length. The first byte picks the read size the client writes in (1..=64)
//! and small head limits for half of the runs.
//! Checks: no panic; the connection ends (the clock is paused, so the header-read timeout
//! fires at once when the input stops mid-head); what it wrote parses as whole responses,
//! each framed by its Content-Length, no more answers than requests the service saw plus
//! one refusal (and any 100 Continue).

#![no_main]

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sweety_h1::server::{self, RecvBody, Service, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

struct Svc(Arc<AtomicUsize>);

impl Service for Svc {
    type Body = Body;
    type Future = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;
    fn call(&mut self, req: Request<RecvBody>) -> Self::Future {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let n = match req.into_body().collect().await {
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
    let step = usize::from(sel & 0x3f) + 1;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let input = input.to_vec();
    rt.block_on(async move {
        let (c, s) = tokio::io::duplex(1 << 16);
        let calls = Arc::new(AtomicUsize::new(0));
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(server::serve(
            s,
            BytesMut::new(),
            Svc(calls.clone()),
            settings,
            rx,
        ));
        // The client writes and reads at once (a server blocked on a full pipe while the
        // client still writes would be the harness's deadlock, not the server's).
        let (mut rd, mut wr) = tokio::io::split(c);
        let writer = tokio::spawn(async move {
            for piece in input.chunks(step) {
                if wr.write_all(piece).await.is_err() {
                    break;
                }
                tokio::task::yield_now().await;
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
        // The output is whole responses, each framed by its Content-Length (the service's
        // answers and the refusals all have one; a 100 Continue has no body).
        let mut rest = &out[..];
        let mut answers = 0;
        while !rest.is_empty() {
            let mut fields = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut fields);
            let n = match resp.parse(rest) {
                Ok(httparse::Status::Complete(n)) => n,
                r => panic!(
                    "not a whole response head ({r:?}): {:?}",
                    String::from_utf8_lossy(rest)
                ),
            };
            let code = resp.code.unwrap_or(0);
            let len = resp
                .headers
                .iter()
                .find(|h| h.name == "content-length")
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok());
            assert!(code == 100 || len.is_some(), "an answer without a length");
            let len = len.unwrap_or(0);
            assert!(rest.len() >= n + len, "a body cut short");
            if code != 100 {
                answers += 1;
            }
            rest = &rest[n + len..];
        }
        // Every answer is to a request the service saw, or the one refusal that ends it.
        assert!(answers <= calls.load(Ordering::Relaxed) + 1);
    });
});
