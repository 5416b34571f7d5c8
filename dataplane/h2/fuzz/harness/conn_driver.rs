//! The `conn_driver` fuzz target's harness, shared with `sweety-h2`'s test of the committed
//! seeds (`tests/fuzz_seeds.rs`), so that the test runs exactly what the fuzzer runs: the
//! connection driver fed client bytes over an in-memory pipe, with a mock service that reads
//! each request body (bounded) and answers 200 with its length. Input: one byte of options
//! (bit 0: prepend a valid preface and SETTINGS so the fuzzer starts past it; bits 1-2: how
//! the input is cut into writes; bit 3: the client closes its side after the input, so the
//! server reads EOF and cancels the requests still waiting; else it keeps it open and the
//! connection ends by the server's own timeouts), then the client's bytes.
//! Checks: no panic (also in the driver's debug assertions), the connection ends (the clock
//! is paused and auto-advances, so every timeout fires; the run is bounded), and what the
//! server writes is a sequence of whole frames, SETTINGS first.

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use sweety_h2::frame::{self, Head, Reason, HEADER_LEN};
use sweety_h2::{Body, H2Service, NoHead, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads the request body (at most 1 MiB) and answers 200 with its length.
struct Echo;

impl H2Service for Echo {
    type Head = NoHead;
    type Future = Pin<Box<dyn Future<Output = (Response<Body>, Option<NoHead>)> + Send>>;

    fn call(&mut self, req: Request<Body>, _now: Instant) -> Self::Future {
        Box::pin(async move {
            let mut body = req.into_body();
            let mut n = 0usize;
            while let Some(f) = body.frame().await {
                match f {
                    Ok(f) => {
                        if let Some(d) = f.data_ref() {
                            n += d.len();
                        }
                    }
                    Err(_) => break,
                }
                if n > 1 << 20 {
                    break;
                }
            }
            let b = http_body_util::Full::new(Bytes::from(n.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync();
            (Response::new(b), None)
        })
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

fn settings() -> Settings {
    Settings {
        max_concurrent_streams: 16,
        max_header_bytes: 16 * 1024,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_resets_per_sec: 32,
        stream_window: 64 * 1024,
        conn_window: 256 * 1024,
        send_timeout: Duration::from_secs(60),
        write_buffer: sweety_h2::WRITE_HIGH,
    }
}

/// Runs one input (options byte, then the client's bytes) and returns what the server wrote,
/// after checking it.
pub(crate) fn run(data: &[u8]) -> Vec<u8> {
    let Some((&opts, input)) = data.split_first() else {
        return Vec::new();
    };
    let mut bytes = BytesMut::new();
    if opts & 1 == 1 {
        bytes.extend_from_slice(frame::PREFACE);
        frame::put_settings(&mut bytes, &[]);
    }
    bytes.extend_from_slice(input);
    let cut = [1usize << 20, 7, 64, 1024][((opts >> 1) & 3) as usize];
    let eof = opts & 8 == 8;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let conn = tokio::spawn(sweety_h2::serve(server, Echo, settings(), stop));
        let (mut rd, mut wr) = tokio::io::split(client);
        let writer = async move {
            for chunk in bytes.chunks(cut) {
                if wr.write_all(chunk).await.is_err() {
                    break;
                }
            }
            if eof {
                let _ = wr.shutdown().await;
            }
            // The half is held (open, unless shut down) until the server ends the connection.
            std::future::pending::<std::convert::Infallible>().await
        };
        let reader = async move {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        };
        // The reader ends when the server closes the connection; the writer is dropped then.
        let out = tokio::select! {
            out = reader => out,
            never = writer => match never {},
        };
        // Every timeout fires on the paused clock: the connection ends within this bound.
        let ended = tokio::time::timeout(Duration::from_secs(3600), conn).await;
        assert!(ended.is_ok(), "the connection did not end");
        check_frames(&out);
        out
    })
}

/// What the server wrote: our SETTINGS first, then whole frames.
fn check_frames(mut out: &[u8]) {
    let mut first = true;
    while !out.is_empty() {
        assert!(out.len() >= HEADER_LEN, "a torn frame header");
        let h = Head::parse(out);
        if first {
            assert_eq!(
                h.kind,
                frame::kind::SETTINGS,
                "the server starts with SETTINGS"
            );
            first = false;
        }
        // DATA frames are at most 32 KiB (and the client's SETTINGS_MAX_FRAME_SIZE); the
        // other frames the server writes here are small.
        assert!(h.len as usize <= 32 * 1024, "a {}-byte frame", h.len);
        assert!(out.len() >= HEADER_LEN + h.len as usize, "a torn frame");
        out = &out[HEADER_LEN + h.len as usize..];
    }
}
