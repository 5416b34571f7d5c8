//! Idle HTTP/2 connections free their empty buffers (issue 23): a keep-alive connection that
//! served a large response holds, once idle, no more than one that served a small one
//! (sweety-h2's driver frees its empty read and write buffers over 16 KiB when it has no
//! stream left).
//!
//! Observed with a counting global allocator (its own test binary): the bytes the process
//! holds live with `CONNS` idle h2c connections after a small response each, then after a
//! 256 KiB response each. Without the freeing every connection keeps the output buffer the
//! large response grew (tens of KiB). Real sockets; the wait for the connections to go idle
//! is a bounded loop, the assertion a count.

mod common;

use common::h2 as raw2;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::time::Instant;

/// Forwards to the system allocator and keeps the bytes allocated and not yet freed, all
/// threads together.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter update has no effect on the memory returned.
#[allow(unsafe_code)] // a global allocator is an `unsafe impl`; the proof is above
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's (non-zero-size layout).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; `new_size` is the caller's, valid.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Idle connections compared.
const CONNS: usize = 16;
/// The large response: many DATA frames, so the output buffer grows to its cap.
const BIG: usize = 256 * 1024;
/// What one idle connection may hold more after the large response than after the small one:
/// HPACK table entries and map slots, a few hundred bytes; far below one output buffer
/// (the 32 KiB default `limits.http2_write_buffer` plus a frame).
const SLACK_PER_CONN: isize = 4 * 1024;

#[tokio::test]
async fn idle_h2_connections_hold_no_more_after_a_large_response_than_after_a_small_one() {
    let big = "b".repeat(BIG);
    let cfg = http_config(vec![vhost(
        "v",
        &[],
        vec![
            fixed_route("small", "/small", "ok"),
            fixed_route("big", "/big", &big),
        ],
    )]);
    drop(big);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;

    // Windows wide open: only the socket paces the server, whose output buffer fills.
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        let (rd, mut wr) = raw2::open_from("127.0.0.1", addr, &[(0x4, 0x7fff_ffff)]).await;
        let grow = (0x7fff_ffffu32 - 65_535).to_be_bytes();
        wr.write_all(&raw2::frame(raw2::WINDOW_UPDATE, 0, 0, &grow))
            .await
            .unwrap();
        conns.push((rd, wr));
    }

    // A small response on each (the first request warms what every request uses: route
    // metrics, the date header), then a second one: the baseline.
    for (stream, path) in [(1, "/small"), (3, "/small")] {
        for (rd, wr) in &mut conns {
            assert_eq!(fetch(rd, wr, stream, path).await, 2);
        }
    }
    let small = settled(&mut conns, isize::MIN).await;

    for (rd, wr) in &mut conns {
        assert_eq!(fetch(rd, wr, 5, "/big").await, BIG);
    }
    let bound = small + CONNS as isize * SLACK_PER_CONN;
    let large = settled(&mut conns, bound).await;
    eprintln!(
        "live bytes with {CONNS} idle h2 connections: {small} after a small response, \
         {large} after a {BIG}-byte one (bound {bound})"
    );
    assert!(
        large <= bound,
        "{CONNS} idle connections hold {} bytes more after a {BIG}-byte response than after \
         a 2-byte one: {} each (slack {SLACK_PER_CONN})",
        large - small,
        (large - small) / CONNS as isize
    );
    drop(conns);
    drop(h);
}

/// Sends GET `path` on `stream` and reads its response to the end; returns the body length.
async fn fetch(rd: &mut raw2::Reader, wr: &mut OwnedWriteHalf, stream: u32, path: &str) -> usize {
    let block = raw2::request_block(path);
    let flags = raw2::END_STREAM | raw2::END_HEADERS;
    wr.write_all(&raw2::frame(raw2::HEADERS, flags, stream, &block))
        .await
        .unwrap();
    let deadline = Instant::now() + raw2::PHASE;
    let mut body = 0;
    loop {
        let ev = rd.next(deadline).await;
        let raw2::Event::Frame(f) = ev else {
            panic!("no whole response on stream {stream}: {ev:?} after {body} bytes");
        };
        match f.ty {
            raw2::SETTINGS if f.flags & raw2::ACK == 0 => {
                wr.write_all(&raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            raw2::HEADERS => assert_eq!(f.status, Some(200)),
            raw2::DATA => body += f.payload.len(),
            raw2::RST_STREAM | raw2::GOAWAY => panic!("stream {stream} reset: {f:?}"),
            _ => {}
        }
        if f.stream == stream && f.flags & raw2::END_STREAM != 0 {
            return body;
        }
    }
}

/// Once every connection answered a PING (its response written, no stream left), the live
/// bytes of the process: sampled up to 50 times, 10 ms apart, until at most `bound` (a server
/// task may still be between its last write and its idle point when the ACK arrives).
async fn settled(conns: &mut [(raw2::Reader, OwnedWriteHalf)], bound: isize) -> isize {
    for (rd, wr) in conns.iter_mut() {
        wr.write_all(&raw2::frame(raw2::PING, 0, 0, b"idle?..."))
            .await
            .unwrap();
        rd.until(wr, "the PING's ACK", |e| {
            matches!(e, raw2::Event::Frame(f) if f.ty == raw2::PING && f.flags & raw2::ACK != 0)
        })
        .await;
    }
    let mut n = live();
    for _ in 0..50 {
        if n <= bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        n = live();
    }
    n
}
