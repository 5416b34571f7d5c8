//! Memory bounded by design under bulk load (issue 23): what a connection holds ahead of a
//! slow client stays within its caps, whatever the number of streams and the body size.
//! One HTTP/2 (h2c) client with ten streams of a 1 MiB body reads frame by frame, slower
//! than the server can read the body, while the test samples a process-wide count:
//!
//! * static files: the file bytes read and not yet released
//!   (`ReadAheadTotal::bytes`) stay within `limits.static_read_ahead` plus
//!   `UNBUDGETED_CHUNK` per stream, and the chunks taken in that budget's size stay within
//!   the process's `limits.static_read_ahead_total` when it is the smaller;
//! * proxied responses: the bytes taken from backend connections and not yet released
//!   (`proxy::held_bytes`) stay within one `limits.proxy_read_ahead` per stream (hyper's
//!   read buffer of each backend connection is bounded by the same setting);
//! * an HTTP/2 (h2c) backend, to a client that also grants window only for what it read:
//!   what the backend has produced and the client not yet received stays within the proxy's
//!   upstream stream window (`limits.proxy_read_ahead`) and a few chunks per stream, plus the
//!   output buffer and the client's window.
//!
//! * the tests of a static or HTTP/1.1 body: the output an HTTP/2 connection buffers (`sweety_h2::peak_output_bytes`, the
//!   largest of any ended connection) stays within `limits.http2_write_buffer` plus one frame.
//!
//! Counts, not timings; its own test binary, because the counts are process-wide. Bounded in
//! time and count.

mod common;

use common::h2 as raw2;
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sweety_config::*;
use sweety_dataplane::proxy::held_bytes;
use sweety_dataplane::static_files::{ReadAheadTotal, CHUNK_SIZE, UNBUDGETED_CHUNK};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

const FILE: usize = 1 << 20;
const STREAMS: u32 = 10;
const BUDGET: u32 = 64 * 1024;
const PROXY_READ_AHEAD: u32 = 16 * 1024;
/// `limits.http2_write_buffer` of every test here (the output peak is process-wide).
const WRITE_BUFFER: u32 = 16 * 1024;
/// One frame the output may take past `WRITE_BUFFER`: a DATA frame of the client's (default)
/// largest size, or a response's HEADERS, with its frame header.
const ONE_FRAME: usize = 16 * 1024 + 9;

/// Taken by the tests that serve files: [`unbudgeted_bytes`] counts the chunks outside a
/// budget of every file body in the process, so they run one at a time.
///
/// [`unbudgeted_bytes`]: sweety_dataplane::static_files::unbudgeted_bytes
static SERVING_FILES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_slow_h2_client_with_ten_streams_holds_one_budget_of_file_bytes() {
    let _one = SERVING_FILES.lock().await;
    let (_dir, h, total) = serve_big_file(|l| l.static_read_ahead = BUDGET).await;

    let (data, max_held) = slow_download(&h, "/big.bin", || total.bytes()).await;
    assert_eq!(data, FILE * STREAMS as usize, "every response whole");
    let bound = BUDGET as u64 + STREAMS as u64 * UNBUDGETED_CHUNK as u64;
    eprintln!("file bytes held ahead of the client: at most {max_held} (bound {bound})");
    assert!(max_held > 0, "the count saw the file being read");
    assert!(
        max_held <= bound,
        "{max_held} file bytes held ahead of the client, bound {bound} \
         (unbounded it is up to {STREAMS} x {CHUNK_SIZE})"
    );
    // Everything read was released once sent.
    assert_eq!(total.bytes(), 0);
}

/// `limits.static_read_ahead_total` below the connection's own budget: the chunks the
/// connection takes in `static_read_ahead`'s size are held against the process's total, which
/// follows the config and is never exceeded (past it the streams read `UNBUDGETED_CHUNK`
/// bytes at a time, outside both), and every response still arrives whole. The total's own
/// high-water mark is read, not a sample taken between frames (session 20's review, R2).
#[tokio::test]
async fn the_read_ahead_total_of_all_connections_caps_the_budgeted_chunks() {
    // Room for one chunk (128 KiB) but not for the two the connection's budget allows.
    const TOTAL: u64 = 160 * 1024;
    let _one = SERVING_FILES.lock().await;
    let (_dir, h, total) = serve_big_file(|l| {
        l.static_read_ahead = 2 * CHUNK_SIZE as u32;
        l.static_read_ahead_total = TOTAL;
    })
    .await;

    let (data, _) = slow_download(&h, "/big.bin", || total.held()).await;
    assert_eq!(data, FILE * STREAMS as usize, "every response whole");
    // The total's high-water mark is a debug build's (the tests' profile): a release build
    // keeps none.
    #[cfg(debug_assertions)]
    {
        let peak = total.peak();
        eprintln!("budgeted file bytes held, all connections: at most {peak} (total {TOTAL})");
        // The first chunk finds the total empty.
        assert!(
            peak >= CHUNK_SIZE as u64,
            "the connection's chunks were held against the total"
        );
        assert!(
            peak <= TOTAL,
            "{peak} bytes held against a total of {TOTAL} (the connection's own budget is {})",
            2 * CHUNK_SIZE
        );
    }
    assert_eq!(total.bytes(), 0, "every chunk released once sent");
}

/// Connections that never read can take the whole `limits.static_read_ahead_total` (one
/// client's 128, with the defaults and no `max_connections_per_client`): another client is
/// then slower, never stalled (session 20's review, R1). Two h2c connections ask for the file
/// and read nothing; each holds its one budgeted chunk (its window took the first 64 KiB of
/// it), so the total of two chunks is full. A third connection still downloads ten streams of
/// the file whole, `UNBUDGETED_CHUNK` at a time: the total stays full the whole time (it got
/// none of it) and is never passed.
#[tokio::test]
async fn connections_that_never_read_slow_the_others_and_never_stall_them() {
    const TOTAL: u64 = 2 * CHUNK_SIZE as u64;
    let _one = SERVING_FILES.lock().await;
    let (_dir, h, total) = serve_big_file(|l| {
        l.static_read_ahead = CHUNK_SIZE as u32;
        l.static_read_ahead_total = TOTAL;
    })
    .await;
    let addr = h.addr("web").await;

    let mut idle = Vec::new();
    for _ in 0..2 {
        let (rd, mut wr) = raw2::open_from("127.0.0.1", addr, &[]).await;
        let mut hello = raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]);
        let flags = raw2::END_STREAM | raw2::END_HEADERS;
        hello.extend(raw2::frame(
            raw2::HEADERS,
            flags,
            1,
            &raw2::request_block("/big.bin"),
        ));
        wr.write_all(&hello).await.unwrap();
        idle.push((rd, wr));
    }
    // A condition, bounded: both chunks taken.
    let deadline = Instant::now() + Duration::from_secs(30);
    while total.held() < TOTAL {
        assert!(
            Instant::now() < deadline,
            "held {} of {TOTAL}",
            total.held()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let (data, _) = slow_download(&h, "/big.bin", || total.held()).await;
    assert_eq!(data, FILE * STREAMS as usize, "every response whole");
    assert_eq!(
        total.held(),
        TOTAL,
        "the idle connections still hold the total"
    );
    #[cfg(debug_assertions)]
    assert_eq!(total.peak(), TOTAL, "never passed");

    // Their chunks go with their streams (cancelled: CANCEL is 0x8).
    for (_, wr) in &mut idle {
        let cancel = raw2::frame(raw2::RST_STREAM, 0, 1, &8u32.to_be_bytes());
        wr.write_all(&cancel).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while total.bytes() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still held",
            total.bytes()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A client that stops granting window and then shuts its write side (a half-close): no
/// WINDOW_UPDATE can come after its EOF, so the three streams waiting for window are reset
/// (CANCEL) at once and their read-ahead chunks given back, not held until `send_timeout`
/// (an hour here; each phase of the test is bounded far below it), while a stream that has
/// window still receives its whole file after the EOF; then GOAWAY, and the connection
/// closes when that stream is done. The fourth file is larger than the socket buffers can
/// hold, so it is still being sent when the EOF comes.
#[tokio::test]
async fn a_half_closed_h2_client_gets_its_blocked_streams_released_and_the_rest_served() {
    const HUGE: usize = 16 << 20;
    let _one = SERVING_FILES.lock().await;
    let (dir, h, total) = serve_big_file(|l| {
        l.send_timeout = sweety_config::Duration::from_secs(3600);
    })
    .await;
    std::fs::write(dir.path().join("huge.bin"), vec![3u8; HUGE]).unwrap();
    let start = total.bytes();
    let addr = h.addr("web").await;
    // The stream windows stay at the default 65,535; the connection's is opened wide.
    let (mut rd, mut wr) = raw2::open_from("127.0.0.1", addr, &[]).await;
    let grow = (0x7fff_ffffu32 - 65_535).to_be_bytes();
    let mut hello = raw2::frame(raw2::WINDOW_UPDATE, 0, 0, &grow);
    let flags = raw2::END_STREAM | raw2::END_HEADERS;
    for id in [1, 3, 5] {
        let block = raw2::request_block("/big.bin");
        hello.extend(raw2::frame(raw2::HEADERS, flags, id, &block));
    }
    wr.write_all(&hello).await.unwrap();
    let mut data = std::collections::HashMap::<u32, usize>::new();
    let blocked = |data: &std::collections::HashMap<u32, usize>| {
        [1, 3, 5].iter().all(|id| data.get(id) == Some(&65_535))
    };
    while !blocked(&data) {
        let ev = rd
            .until(
                &mut wr,
                "each stream's window of data",
                |ev| matches!(ev, raw2::Event::Frame(f) if f.ty == raw2::DATA),
            )
            .await;
        let raw2::Event::Frame(f) = ev else {
            unreachable!()
        };
        assert_eq!(f.flags & raw2::END_STREAM, 0, "{f:?}");
        *data.entry(f.stream).or_default() += f.payload.len();
    }
    assert!(
        total.bytes() > start,
        "the blocked streams hold the rest of their chunks"
    );
    // A fourth stream with window for its whole file: its response has started.
    let mut more = raw2::frame(raw2::HEADERS, flags, 7, &raw2::request_block("/huge.bin"));
    more.extend(raw2::frame(
        raw2::WINDOW_UPDATE,
        0,
        7,
        &(HUGE as u32).to_be_bytes(),
    ));
    wr.write_all(&more).await.unwrap();
    rd.until(
        &mut wr,
        "the fourth stream's response",
        |ev| matches!(ev, raw2::Event::Frame(f) if f.ty == raw2::HEADERS && f.stream == 7),
    )
    .await;

    // The half-close: the client reads on.
    wr.shutdown().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut resets = Vec::new();
    let (mut goaway, mut ended7, mut held_at_resets) = (None, false, None);
    loop {
        match rd.next(deadline).await {
            raw2::Event::Frame(f) => match f.ty {
                raw2::DATA => {
                    *data.entry(f.stream).or_default() += f.payload.len();
                    if f.stream == 7 && f.flags & raw2::END_STREAM != 0 {
                        ended7 = true;
                    }
                }
                raw2::RST_STREAM => {
                    resets.push((f.stream, f.error_code()));
                    if resets.len() == 3 {
                        held_at_resets = Some(total.bytes());
                    }
                }
                raw2::GOAWAY => goaway = Some(f.error_code()),
                _ => {}
            },
            raw2::Event::Closed => break,
            raw2::Event::Timeout => panic!(
                "the connection is still open: resets {resets:?}, data {data:?}, goaway {goaway:?}"
            ),
        }
    }
    resets.sort();
    assert_eq!(
        resets,
        [(1, raw2::CANCEL), (3, raw2::CANCEL), (5, raw2::CANCEL)]
    );
    assert_eq!(goaway, Some(raw2::NO_ERROR));
    for id in [1, 3, 5] {
        assert_eq!(data[&id], 65_535, "stream {id} got nothing more");
    }
    // Each reset is counted (before its RST_STREAM is written).
    let metrics = &h.runtime.shared.metrics;
    assert_eq!(metrics.edge_events.get(&"h2_blocked_at_eof"), 3);
    assert!(ended7, "the stream with window finished");
    assert_eq!(data[&7], HUGE);
    eprintln!(
        "file bytes held: {start} at the start, {:?} once the blocked streams were reset",
        held_at_resets
    );
    // Every chunk given back (the connection's task may still be ending: a bounded wait).
    let deadline = Instant::now() + Duration::from_secs(30);
    while total.bytes() != start {
        assert!(
            Instant::now() < deadline,
            "{} file bytes still held (start {start})",
            total.bytes()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A server of a temporary directory with `big.bin` ([`FILE`] bytes), its limits set by
/// `limits` after `http2_write_buffer` ([`WRITE_BUFFER`]), and its read-ahead total.
async fn serve_big_file(
    limits: impl FnOnce(&mut Limits),
) -> (tempfile::TempDir, Harness, Arc<ReadAheadTotal>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![7u8; FILE]).unwrap();
    let mut cfg = static_config(dir.path());
    cfg.limits.http2_write_buffer = WRITE_BUFFER;
    limits(&mut cfg.limits);
    let h = Harness::start(cfg).await;
    let total = h.runtime.shared.read_ahead_total.clone();
    (dir, h, total)
}

/// One h2c client of `h`'s listener with [`STREAMS`] streams of `path` (each [`FILE`] bytes),
/// windows wide open (only the socket paces the server), reading frame by frame with a short
/// pause every 16 frames (slower than the server), sampling `held` before each read. Returns
/// the DATA bytes received and the largest sample, once the output buffer's peak (of every
/// connection so far) was checked against [`WRITE_BUFFER`].
async fn slow_download(h: &Harness, path: &str, held: impl Fn() -> u64) -> (usize, u64) {
    let addr = h.addr("web").await;
    let (mut rd, mut wr) = raw2::open_from("127.0.0.1", addr, &[(0x4, 0x7fff_ffff)]).await;
    let grow = (0x7fff_ffffu32 - 65_535).to_be_bytes();
    wr.write_all(&raw2::frame(raw2::WINDOW_UPDATE, 0, 0, &grow))
        .await
        .unwrap();
    for i in 0..STREAMS {
        let block = raw2::request_block(path);
        let flags = raw2::END_STREAM | raw2::END_HEADERS;
        wr.write_all(&raw2::frame(raw2::HEADERS, flags, 1 + 2 * i, &block))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut data, mut ended, mut max_held, mut frames) = (0usize, 0u32, 0u64, 0u64);
    while ended < STREAMS {
        max_held = max_held.max(held());
        let ev = rd.next(deadline).await;
        let raw2::Event::Frame(f) = ev else {
            panic!("connection ended early: {ev:?} after {data} bytes");
        };
        frames += 1;
        match f.ty {
            raw2::SETTINGS if f.flags & raw2::ACK == 0 => {
                wr.write_all(&raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            raw2::HEADERS => assert_eq!(f.status, Some(200)),
            raw2::DATA => data += f.payload.len(),
            raw2::RST_STREAM | raw2::GOAWAY => panic!("stream reset: {f:?}"),
            _ => {}
        }
        if f.ty == raw2::DATA && f.flags & raw2::END_STREAM != 0 {
            ended += 1;
        }
        if frames % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let peak = sweety_h2::peak_output_bytes();
    let bound = WRITE_BUFFER as usize + ONE_FRAME;
    eprintln!("HTTP/2 output buffered: at most {peak} (bound {bound})");
    assert!(peak > 0, "the peak was recorded");
    assert!(
        peak <= bound,
        "an HTTP/2 connection buffered {peak} bytes of output, bound {bound}"
    );
    (data, max_held)
}

/// Taken by the tests that proxy: [`held_bytes`] counts the chunks of every backend body in the
/// process, so they run one at a time.
static PROXYING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_slow_h2_client_with_ten_streams_holds_one_proxy_read_ahead_per_stream() {
    let _alone = PROXYING.lock().await;
    let body = bytes::Bytes::from(vec![9u8; FILE]);
    let backend_addr = spawn_http_backend(move |_req| {
        let body = body.clone();
        async move { http::Response::new(http_body_util::Full::new(body)) }
    })
    .await;
    let mut cfg = http_config(vec![vhost("v", &[], vec![proxy_route("up", "/", "b")])]);
    cfg.backends = vec![backend("b", backend_addr)];
    cfg.limits.proxy_read_ahead = PROXY_READ_AHEAD;
    cfg.limits.http2_write_buffer = WRITE_BUFFER;
    let h = Harness::start(cfg).await;

    let (data, max_held) = slow_download(&h, "/big.bin", held_bytes).await;
    assert_eq!(data, FILE * STREAMS as usize, "every response whole");
    let bound = STREAMS as u64 * PROXY_READ_AHEAD as u64;
    eprintln!("proxied bytes held ahead of the client: at most {max_held} (bound {bound})");
    assert!(max_held > 0, "the count saw the responses");
    assert!(
        max_held <= bound,
        "{max_held} proxied bytes held ahead of the client, bound {bound} \
         (unbounded, hyper reads up to ~400 KiB at a time per backend connection)"
    );
    // Everything taken was released once sent.
    assert_eq!(held_bytes(), 0);
}

/// Bytes the h2c backend of [`a_slow_h2_client_of_an_h2c_backend_is_ahead_by_at_most_the_windows`]
/// has produced (hyper's HTTP/2 server pulls a body's next chunk as send capacity opens).
static PRODUCED: AtomicU64 = AtomicU64::new(0);
/// The h2c backend's body chunk.
const BACKEND_CHUNK: usize = 4 * 1024;
/// The client's stream window (SETTINGS_INITIAL_WINDOW_SIZE); its connection window stays the
/// default 65,535, re-opened by what it reads.
const CLIENT_WINDOW: u32 = 16 * 1024;
const CLIENT_CONN_WINDOW: u64 = 65_535;

/// An HTTP/2 backend (`protocol: h2c`) answers ten streams of 1 MiB to a client that reads
/// slowly and grants window only for what it read. The proxy's upstream stream window is
/// `limits.proxy_read_ahead`, so what the chain has taken from the backend's bodies and not yet
/// delivered stays within, per stream, that window, the chunks the proxy holds (at most two
/// DATA frames of the backend, each at most `BACKEND_CHUNK`) and the two chunks hyper's server
/// has in hand past its send capacity; plus, per connection, the HTTP/2 output buffer and
/// the client's connection window. Without the window, hyper's client grants 2 MiB per stream
/// and 5 MiB per connection: the backend sends megabytes ahead of the slow client.
async fn a_slow_h2_client_of_an_h2c_backend_is_ahead_by_at_most_the_windows(client: Http2Client) {
    let _alone = PROXYING.lock().await;
    PRODUCED.store(0, Ordering::Relaxed);
    let backend_addr = spawn_backend(|s| async move {
        let svc = hyper::service::service_fn(|_req: http::Request<hyper::body::Incoming>| {
            let chunks = futures_util::stream::unfold(0usize, |sent| async move {
                if sent >= FILE {
                    return None;
                }
                PRODUCED.fetch_add(BACKEND_CHUNK as u64, Ordering::Relaxed);
                let chunk = bytes::Bytes::from(vec![5u8; BACKEND_CHUNK]);
                let frame = http_body::Frame::data(chunk);
                Some((
                    Ok::<_, std::convert::Infallible>(frame),
                    sent + BACKEND_CHUNK,
                ))
            });
            let body = http_body_util::StreamBody::new(chunks);
            async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
        });
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
            .await;
    })
    .await;
    let mut cfg = http_config(vec![vhost("v", &[], vec![proxy_route("up", "/", "b")])]);
    cfg.backends = vec![Backend {
        protocol: BackendProtocol::H2c,
        ..backend("b", backend_addr)
    }];
    cfg.limits.proxy_read_ahead = PROXY_READ_AHEAD;
    cfg.limits.http2_write_buffer = WRITE_BUFFER;
    cfg.limits.http2_client = client;
    let h = Harness::start(cfg).await;

    let addr = h.addr("web").await;
    let (mut rd, mut wr) = raw2::open_from("127.0.0.1", addr, &[(0x4, CLIENT_WINDOW)]).await;
    for i in 0..STREAMS {
        let block = raw2::request_block("/big.bin");
        let flags = raw2::END_STREAM | raw2::END_HEADERS;
        wr.write_all(&raw2::frame(raw2::HEADERS, flags, 1 + 2 * i, &block))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut data, mut ended, mut frames) = (0u64, 0u32, 0u64);
    let mut max_ahead = 0u64;
    while ended < STREAMS {
        max_ahead = max_ahead.max(PRODUCED.load(Ordering::Relaxed) - data);
        let ev = rd.next(deadline).await;
        let raw2::Event::Frame(f) = ev else {
            panic!("connection ended early: {ev:?} after {data} bytes");
        };
        frames += 1;
        match f.ty {
            raw2::SETTINGS if f.flags & raw2::ACK == 0 => {
                wr.write_all(&raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            raw2::HEADERS => assert_eq!(f.status, Some(200)),
            raw2::DATA if !f.payload.is_empty() => {
                data += f.payload.len() as u64;
                // Re-open what was read: the connection's window, and the stream's unless
                // it ended.
                let n = (f.payload.len() as u32).to_be_bytes();
                let mut grant = raw2::frame(raw2::WINDOW_UPDATE, 0, 0, &n);
                if f.flags & raw2::END_STREAM == 0 {
                    grant.extend(raw2::frame(raw2::WINDOW_UPDATE, 0, f.stream, &n));
                }
                wr.write_all(&grant).await.unwrap();
            }
            raw2::RST_STREAM | raw2::GOAWAY => panic!("stream reset: {f:?}"),
            _ => {}
        }
        if f.ty == raw2::DATA && f.flags & raw2::END_STREAM != 0 {
            ended += 1;
        }
        if frames % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(
        data,
        (FILE * STREAMS as usize) as u64,
        "every response whole"
    );
    assert_eq!(PRODUCED.load(Ordering::Relaxed), data);
    let per_stream = PROXY_READ_AHEAD as u64 + 4 * BACKEND_CHUNK as u64;
    let bound = STREAMS as u64 * per_stream
        + (WRITE_BUFFER as usize + ONE_FRAME) as u64
        + CLIENT_CONN_WINDOW;
    eprintln!("h2c backend: produced ahead of the slow client at most {max_ahead} (bound {bound})");
    assert!(max_ahead > 0, "the count saw the responses");
    assert!(
        max_ahead <= bound,
        "the backend produced {max_ahead} bytes ahead of the slow client, bound {bound} \
         ({STREAMS} x {per_stream} + the output buffer + the client's window)"
    );
}

common::on_both_h2_clients!(a_slow_h2_client_of_an_h2c_backend_is_ahead_by_at_most_the_windows);
