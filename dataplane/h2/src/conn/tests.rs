//! Tests of the connection driver over in-memory pipes, with a mock service.

use super::streams::Resp;
use super::*;
use http_body_util::BodyExt;

/// The service of these tests: every request gets a 404 text reply at once, as the
/// dataplane's pipeline answers a request no route matches.
struct NotFound;

impl H2Service for NotFound {
    type Head = crate::NoHead;
    type Future = std::future::Ready<(Response<Body>, Option<crate::NoHead>)>;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> Self::Future {
        let mut r = Response::new(full(Bytes::from_static(
            b"404 Not Found: no route matches this host and path\n",
        )));
        *r.status_mut() = http::StatusCode::NOT_FOUND;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        std::future::ready((r, None))
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

/// A body holding `data` in full.
fn full(data: Bytes) -> Body {
    http_body_util::Full::new(data)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The dataplane's default limits as connection settings.
fn settings() -> Settings {
    Settings {
        max_concurrent_streams: 128,
        max_header_bytes: 64 * 1024,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_resets_per_sec: 32,
        stream_window: 256 * 1024,
        conn_window: 1024 * 1024,
        send_timeout: Duration::from_secs(60),
        write_buffer: WRITE_HIGH,
    }
}

/// A driver over an in-memory pipe, serving [`NotFound`], and the client end.
async fn pipe_driver() -> tokio::io::DuplexStream {
    pipe_driver_sized(1 << 20).await
}

async fn pipe_driver_sized(pipe: usize) -> tokio::io::DuplexStream {
    pipe_driver_with(pipe, |_| {}).await
}

async fn pipe_driver_with(
    pipe: usize,
    edit: impl FnOnce(&mut Settings),
) -> tokio::io::DuplexStream {
    let (client, server) = tokio::io::duplex(pipe);
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut settings = settings();
    edit(&mut settings);
    tokio::spawn(async move {
        let _tx = _tx;
        let _ = serve(server, NotFound, settings, stop).await;
    });
    client
}

/// The first complete frame in `buf`, taken out of it.
fn take_frame(buf: &mut BytesMut) -> Option<(Head, Bytes)> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let h = Head::parse(buf);
    if buf.len() < HEADER_LEN + h.len as usize {
        return None;
    }
    let mut f = buf.split_to(HEADER_LEN + h.len as usize);
    f.advance(HEADER_LEN);
    Some((h, f.freeze()))
}

async fn read_frame(c: &mut tokio::io::DuplexStream, buf: &mut BytesMut) -> Option<(Head, Bytes)> {
    loop {
        if let Some(f) = take_frame(buf) {
            return Some(f);
        }
        let read = tokio::time::timeout(Duration::from_secs(10), c.read_buf(buf));
        if read.await.expect("a frame in time").ok()? == 0 {
            return None;
        }
    }
}

fn request(id: u32, end_stream: bool) -> BytesMut {
    let mut block = BytesMut::new();
    for (n, v) in [(":method", "GET"), (":scheme", "http"), (":path", "/")] {
        Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
    }
    let mut out = BytesMut::new();
    frame::put_headers(&mut out, id, &block, end_stream, 16_384);
    out
}

#[tokio::test]
async fn response_data_follows_the_peers_stream_window() {
    use tokio::io::AsyncWriteExt;
    let mut c = pipe_driver().await;
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    // A 5-byte initial stream window.
    frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 5)]);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut granted = 5;
    loop {
        let (h, p) = read_frame(&mut c, &mut buf).await.expect("frames");
        if h.kind != kind::DATA {
            continue;
        }
        assert!(
            p.len() <= 5,
            "a DATA frame within the 5-byte window: {}",
            p.len()
        );
        data.extend_from_slice(&p);
        assert!(
            data.len() <= granted,
            "{} bytes sent with a window of {granted}",
            data.len()
        );
        if h.has(flag::END_STREAM) {
            break;
        }
        if data.len() == granted {
            // Exhausted: nothing more until the window grows.
            let mut wu = BytesMut::new();
            frame::put_window_update(&mut wu, 1, 5);
            c.write_all(&wu).await.unwrap();
            granted += 5;
        }
    }
    assert!(String::from_utf8_lossy(&data).starts_with("404 Not Found"));
}

#[tokio::test]
async fn frames_on_closed_or_even_streams_get_the_right_errors() {
    use tokio::io::AsyncWriteExt;
    let mut c = pipe_driver().await;
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    loop {
        let (h, _) = read_frame(&mut c, &mut buf).await.unwrap();
        if h.kind == kind::DATA && h.has(flag::END_STREAM) {
            break;
        }
    }
    // DATA on the finished stream: a stream error.
    let mut out = BytesMut::new();
    frame::put_data(&mut out, 1, b"x", false);
    c.write_all(&out).await.unwrap();
    let (h, p) = loop {
        let f = read_frame(&mut c, &mut buf).await.unwrap();
        if f.0.kind == kind::RST_STREAM {
            break f;
        }
    };
    assert_eq!(
        (h.stream, &p[..]),
        (1, &Reason::STREAM_CLOSED.0.to_be_bytes()[..])
    );
    // A request on an even stream id: a connection error.
    c.write_all(&request(2, true)).await.unwrap();
    let (_, p) = loop {
        let f = read_frame(&mut c, &mut buf).await.unwrap();
        if f.0.kind == kind::GOAWAY {
            break f;
        }
    };
    assert_eq!(&p[4..8], &Reason::PROTOCOL_ERROR.0.to_be_bytes());
    assert_eq!(&p[..4], &1u32.to_be_bytes(), "last stream processed");
    assert!(read_frame(&mut c, &mut buf).await.is_none(), "then closed");
}

#[tokio::test]
async fn frames_after_our_reset_are_ignored_and_their_window_credited() {
    use tokio::io::AsyncWriteExt;
    // Few resets allowed: answering each DATA frame with a reset would end the connection.
    let mut c = pipe_driver_with(4 << 20, |s| s.max_resets_per_sec = 4).await;
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    // An upload: the 404 is answered early and the body is not wanted.
    out.extend_from_slice(&request(1, false));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    loop {
        let (h, p) = read_frame(&mut c, &mut buf).await.expect("frames");
        if h.kind == kind::RST_STREAM {
            assert_eq!(
                (h.stream, &p[..]),
                (1, &Reason::NO_ERROR.0.to_be_bytes()[..])
            );
            break;
        }
    }
    // What the client had sent before it saw the reset: the whole connection window of
    // DATA, trailers, a WINDOW_UPDATE and its own RST_STREAM.
    let mut out = BytesMut::new();
    let chunk = vec![b'x'; 16_384];
    for _ in 0..64 {
        frame::put_data(&mut out, 1, &chunk, false);
    }
    let mut block = BytesMut::new();
    Encoder::field(&mut block, b"x-trailer", b"1", false);
    frame::put_headers(&mut out, 1, &block, true, 16_384);
    frame::put_window_update(&mut out, 1, 100);
    frame::put_rst(&mut out, 1, Reason::CANCEL);
    frame::put_ping(&mut out, *b"12345678");
    c.write_all(&out).await.unwrap();
    let mut credit = 0u64;
    loop {
        let (h, p) = read_frame(&mut c, &mut buf).await.expect("no close");
        assert_ne!(h.kind, kind::RST_STREAM, "no reset for the ignored frames");
        assert_ne!(h.kind, kind::GOAWAY, "the connection stays up");
        if h.kind == kind::WINDOW_UPDATE && h.stream == 0 {
            credit += u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as u64;
        }
        if h.kind == kind::PING && h.has(flag::ACK) {
            break;
        }
    }
    assert!(
        credit >= 512 * 1024,
        "the ignored DATA is credited back: {credit}"
    );
    // And the connection still serves requests.
    c.write_all(&request(3, true)).await.unwrap();
    loop {
        let (h, _) = read_frame(&mut c, &mut buf).await.expect("a response");
        if h.kind == kind::HEADERS {
            assert_eq!(h.stream, 3);
            break;
        }
    }
}

#[tokio::test]
async fn an_error_after_a_graceful_goaway_keeps_its_last_stream_id() {
    use tokio::io::AsyncWriteExt;
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let (tx, stop) = tokio::sync::watch::channel(false);
    let settings = settings();
    tokio::spawn(async move {
        let _ = serve(server, NotFound, settings, stop).await;
    });
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    // No stream window: stream 1's response waits, so the connection stays up.
    frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    loop {
        let (h, _) = read_frame(&mut c, &mut buf).await.expect("frames");
        if h.kind == kind::HEADERS && h.stream == 1 {
            break;
        }
    }
    // Drain: a graceful GOAWAY naming stream 1.
    tx.send(true).unwrap();
    let (_, p) = loop {
        let f = read_frame(&mut c, &mut buf).await.expect("GOAWAY");
        if f.0.kind == kind::GOAWAY {
            break f;
        }
    };
    assert_eq!(&p[..8], &[0, 0, 0, 1, 0, 0, 0, 0]);
    // A stream the client opened before it saw that (ignored), then a connection error.
    let mut out = request(3, true);
    out.extend_from_slice(&request(4, true));
    c.write_all(&out).await.unwrap();
    let (_, p) = loop {
        let f = read_frame(&mut c, &mut buf).await.expect("a second GOAWAY");
        if f.0.kind == kind::GOAWAY {
            break f;
        }
    };
    assert_eq!(&p[4..8], &Reason::PROTOCOL_ERROR.0.to_be_bytes());
    assert_eq!(
        &p[..4],
        &1u32.to_be_bytes(),
        "the last-stream id does not grow"
    );
}

#[tokio::test]
async fn a_client_that_does_not_read_is_not_read_either() {
    use tokio::io::AsyncWrite;
    const PIPE: usize = 16 * 1024;
    // As many concurrent streams as the client wants: only the output bound stops it.
    let mut c = pipe_driver_with(PIPE, |s| s.max_concurrent_streams = 1 << 20).await;
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    // 20,000 requests (each answered with ~100 bytes), never reading the answers.
    for i in 0..20_000u32 {
        out.extend_from_slice(&request(1 + 2 * i, true));
    }
    let total = out.len();
    let mut written = 0;
    let mut stalled = 0;
    // Write without blocking; let the server run between attempts; stop once the
    // server has stopped taking bytes for many of its turns.
    while written < total && stalled < 200 {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut c).poll_write(&mut cx, &out[written..]) {
            Poll::Ready(Ok(n)) => {
                written += n;
                stalled = 0;
            }
            Poll::Ready(Err(e)) => panic!("{e}"),
            Poll::Pending => stalled += 1,
        }
        tokio::task::yield_now().await;
    }
    assert!(
        written < total,
        "the server kept reading a client that does not read"
    );
    // What it took in is bounded by its output buffer, not by what the client sent.
    let bound = PIPE + WRITE_HIGH + 2 * READ_CHUNK + 64 * 1024;
    assert!(written < bound, "read {written} bytes of requests");
}

/// A client's opening: the preface, an empty SETTINGS and the ACK of ours.
fn hello() -> BytesMut {
    let mut input = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut input, &[]);
    frame::put_settings_ack(&mut input);
    input
}

/// A driver polled by hand over a pipe that holds one byte (the client never reads, so
/// what the driver writes stays in its buffer), fed `input`, and the client end.
async fn hand_driver(
    edit: impl FnOnce(&mut Settings),
    input: &[u8],
) -> (
    Driver<tokio::io::DuplexStream, NotFound>,
    tokio::io::DuplexStream,
) {
    hand_driver_serving(NotFound, edit, input).await
}

/// [`hand_driver`] serving `service`.
async fn hand_driver_serving<S: H2Service>(
    service: S,
    edit: impl FnOnce(&mut Settings),
    input: &[u8],
) -> (Driver<tokio::io::DuplexStream, S>, tokio::io::DuplexStream) {
    let (mut c, server) = tokio::io::duplex(1);
    let (tx, stop) = tokio::sync::watch::channel(false);
    std::mem::forget(tx);
    let mut settings = settings();
    edit(&mut settings);
    let mut d = Driver::new(server, service, settings, stop);
    feed(&mut d, &mut c, input).await;
    (d, c)
}

/// Writes `input` through the one-byte pipe, polling the driver between the bytes.
async fn feed<S: H2Service>(
    d: &mut Driver<tokio::io::DuplexStream, S>,
    c: &mut tokio::io::DuplexStream,
    mut input: &[u8],
) {
    use tokio::io::AsyncWrite;
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..100_000 {
        if input.is_empty() {
            break;
        }
        if let Poll::Ready(Ok(n)) = Pin::new(&mut *c).poll_write(&mut cx, input) {
            input = &input[n..];
        }
        assert!(d.poll(&mut cx).is_pending());
        // Lets the tasks the test runs beside the driver run (backends, bodies).
        tokio::task::yield_now().await;
    }
    assert!(
        input.is_empty(),
        "the driver took the input ({:?} left {} wb {} rb {} streams {})",
        d.closing,
        input.len(),
        d.output_len(),
        d.read_buf.len(),
        d.streams.len()
    );
}

/// What the driver has written: the byte in the pipe, then its buffer.
fn written<S: H2Service>(
    d: &Driver<tokio::io::DuplexStream, S>,
    c: &mut tokio::io::DuplexStream,
) -> BytesMut {
    use tokio::io::AsyncRead;
    let mut cx = Context::from_waker(Waker::noop());
    let mut b = [0u8; 1];
    let mut rb = tokio::io::ReadBuf::new(&mut b);
    let _ = Pin::new(c).poll_read(&mut cx, &mut rb);
    let mut out = BytesMut::from(rb.filled());
    for seg in &d.out {
        out.extend_from_slice(seg);
    }
    out.extend_from_slice(&d.write_buf);
    out
}

fn frame_kinds(mut b: BytesMut) -> Vec<u8> {
    let mut kinds = Vec::new();
    while b.len() >= HEADER_LEN {
        let h = Head::parse(&b);
        kinds.push(h.kind);
        b.advance((HEADER_LEN + h.len as usize).min(b.len()));
    }
    kinds
}

/// A waker that counts its wakes.
struct Count(std::sync::atomic::AtomicUsize);
impl std::task::Wake for Count {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Polls once after `wait`, with a counting waker: returns the wakes the poll itself made.
async fn poll_after(d: &mut Driver<tokio::io::DuplexStream, NotFound>, wait: Duration) -> usize {
    tokio::time::sleep(wait).await;
    let count = Arc::new(Count(Default::default()));
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(
        d.poll(&mut cx).is_pending(),
        "still flushing to a full pipe"
    );
    count.0.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn a_header_block_timeout_sends_one_goaway_and_does_not_spin() {
    let hrt = Duration::from_millis(200);
    let mut input = hello();
    // A header block that never ends (no CONTINUATION follows).
    let mut block = BytesMut::new();
    Encoder::field(&mut block, b":method", b"GET", false);
    frame::put_head(&mut input, block.len(), kind::HEADERS, 0, 1);
    input.extend_from_slice(&block);
    let (mut d, mut c) = hand_driver(|s| s.header_read_timeout = hrt, &input).await;
    assert!(d.cont.is_some());
    let wakes = poll_after(&mut d, hrt * 2).await;
    let goaways = frame_kinds(written(&d, &mut c))
        .into_iter()
        .filter(|k| *k == kind::GOAWAY)
        .count();
    assert_eq!(goaways, 1, "one GOAWAY for the timeout");
    assert_eq!(wakes, 0, "the task does not wake itself: no busy loop");
    assert!(
        d.timer.deadline().into_std() > Instant::now(),
        "timer re-armed"
    );
    assert!(d.closing.is_some());
}

#[tokio::test]
async fn frames_left_from_an_earlier_read_start_their_requests_at_a_new_clock_reading() {
    // Frames kept while the output drained (`frames_pending`) may wait long after their
    // read: the requests they open must not start at that read's clock reading, or the
    // cache would judge freshness and Age at a past instant.
    let input = hello();
    let (mut d, _c) = hand_driver(|_| {}, &input).await;
    let old = Instant::now() - Duration::from_secs(30);
    d.batch_clock = old;
    d.last_active = old;
    d.frames_pending = true;
    assert!(d.output_len() < WRITE_HIGH);
    let mut cx = Context::from_waker(Waker::noop());
    let _ = d.poll(&mut cx);
    assert!(
        d.batch_clock >= old + Duration::from_secs(29),
        "the batch clock is read again for frames left from an earlier read"
    );
}

/// Ids are remembered as closed once, whether they close in order or not, and an id above
/// every remembered one skips the scan without being mistaken for a known one.
#[tokio::test]
async fn closed_ids_are_remembered_once_in_or_out_of_order() {
    let mut input = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut input, &[]);
    let (mut d, _c) = hand_driver(|_| {}, &input).await;
    for id in [5, 3, 5, 7, 3, 9, 1] {
        d.remember_closed(id);
    }
    assert_eq!(Vec::from(d.recently_closed.clone()), vec![5, 3, 7, 9, 1]);
    assert_eq!(d.recently_closed_max, 9);
}

#[tokio::test]
async fn an_idle_goaway_is_sent_once_and_does_not_spin() {
    let idle = Duration::from_millis(200);
    let input = hello();
    let (mut d, mut c) = hand_driver(
        |s| {
            s.idle_timeout = idle;
            s.header_read_timeout = idle;
        },
        &input,
    )
    .await;
    let wakes = poll_after(&mut d, idle * 2).await;
    let goaways = frame_kinds(written(&d, &mut c))
        .into_iter()
        .filter(|k| *k == kind::GOAWAY)
        .count();
    assert_eq!(goaways, 1, "one GOAWAY for the idle connection");
    assert_eq!(wakes, 0, "the task does not wake itself: no busy loop");
    assert!(d.going_away);
    assert!(d.close_deadline.is_some(), "the close is bounded");
    assert!(
        d.timer.deadline().into_std() > Instant::now(),
        "timer re-armed"
    );
}

#[tokio::test]
async fn blocked_streams_are_listed_once_and_forgotten_when_removed() {
    let mut input = BytesMut::from(&frame::PREFACE[..]);
    // No stream window: every response body waits.
    frame::put_settings(&mut input, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    frame::put_settings_ack(&mut input);
    for i in 0..10 {
        input.extend_from_slice(&request(1 + 2 * i, true));
    }
    let (mut d, mut c) = hand_driver(|s| s.max_resets_per_sec = 1000, &input).await;
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1000 {
        if d.blocked.len() == 10 {
            break;
        }
        tokio::task::yield_now().await;
        let _ = d.poll(&mut cx);
    }
    let mut listed = d.blocked.clone();
    listed.sort_unstable();
    assert_eq!(listed, (0..10).map(|i| 1 + 2 * i).collect::<Vec<u32>>());
    // One byte of window for stream 1: it sends it and waits again, listed once.
    let mut more = BytesMut::new();
    frame::put_window_update(&mut more, 1, 1);
    feed(&mut d, &mut c, &more).await;
    let _ = d.poll(&mut cx);
    assert_eq!(d.blocked.iter().filter(|b| **b == 1).count(), 1);
    // The client cancels them all: the list forgets them.
    let mut resets = BytesMut::new();
    for i in 0..10 {
        frame::put_rst(&mut resets, 1 + 2 * i, Reason::CANCEL);
    }
    feed(&mut d, &mut c, &resets).await;
    let _ = d.poll(&mut cx);
    assert!(d.streams.is_empty());
    assert!(
        d.blocked.is_empty(),
        "ids of removed streams: {:?}",
        d.blocked
    );
}

#[tokio::test]
async fn every_reset_we_send_remembers_the_stream_and_counts_the_clients() {
    let mut input = hello();
    // Stream 1: a content-length with END_STREAM and no body (reset before it opens);
    // stream 3: an upper-case header name (malformed).
    let mut block = BytesMut::new();
    for (n, v) in [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        ("content-length", "5"),
    ] {
        Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
    }
    frame::put_headers(&mut input, 1, &block, true, 16_384);
    let mut block = BytesMut::new();
    for (n, v) in [(":method", "GET"), (":scheme", "http"), (":path", "/")] {
        Encoder::field(&mut block, n.as_bytes(), v.as_bytes(), false);
    }
    Encoder::field(&mut block, b"X-Upper", b"1", false);
    frame::put_headers(&mut input, 3, &block, true, 16_384);
    let (d, _c) = hand_driver(|s| s.max_resets_per_sec = 100, &input).await;
    for id in [1, 3] {
        assert!(
            d.recently_closed.contains(&id),
            "stream {id} remembered closed"
        );
        assert!(
            d.locally_reset_set.contains(&id),
            "stream {id} remembered reset"
        );
    }
    assert_eq!(d.flood.resets, 2, "both resets are the client's doing");
}

/// An I/O that buffers what it accepts and pushes it out only on later writes or
/// on flush, as tokio-rustls does (its `poll_write` returns Ok(n) once rustls took the
/// plaintext even when the socket would block; `poll_flush` writes the TLS records).
struct TlsLike {
    inner: tokio::io::DuplexStream,
    pending: Vec<u8>,
}

impl TlsLike {
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        use tokio::io::AsyncWrite;
        while !self.pending.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                Poll::Ready(Ok(n)) => {
                    self.pending.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for TlsLike {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsLike {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let room = (64 * 1024usize).saturating_sub(self.pending.len());
        let n = room.min(buf.len());
        self.pending.extend_from_slice(&buf[..n]);
        let blocked = self.drain(cx)?.is_pending();
        if n == 0 && blocked {
            return Poll::Pending;
        }
        Poll::Ready(Ok(n))
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// Output a TLS-like stream accepted but could not send yet is flushed when the
// socket drains, not left until the next write.
#[tokio::test]
async fn output_buffered_by_the_tls_layer_is_flushed() {
    use tokio::io::AsyncWriteExt;
    // A socket that holds 16 bytes: the response cannot go out in one go.
    let (mut c, server) = tokio::io::duplex(16);
    let io = TlsLike {
        inner: server,
        pending: Vec::new(),
    };
    let (tx, stop) = tokio::sync::watch::channel(false);
    let settings = settings();
    tokio::spawn(async move {
        let _tx = tx;
        let _ = serve(io, NotFound, settings, stop).await;
    });
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let done = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let (h, _) = read_frame(&mut c, &mut buf).await.expect("frames");
            if h.stream == 1 && h.has(flag::END_STREAM) {
                break;
            }
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "the end of the response is stuck in the TLS layer's buffer"
    );
}

/// A server config (ALPN h2, a self-signed certificate for `h2.test`) and a client config
/// that trusts it.
fn tls_configs() -> (rustls::ServerConfig, Arc<rustls::ClientConfig>) {
    let ck = rcgen::generate_simple_self_signed(vec!["h2.test".into()]).unwrap();
    let cert = rustls::pki_types::CertificateDer::from(ck.cert.der().to_vec());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        ck.signing_key.serialize_der(),
    ));
    let mut server_cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)
    .unwrap();
    server_cfg.alpn_protocols = vec![b"h2".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let client_cfg = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    (server_cfg, client_cfg)
}

// The same over real tokio-rustls on a small pipe.
#[tokio::test]
async fn tls_response_tail_is_not_stuck_in_rustls() {
    use tokio::io::AsyncWriteExt;
    let (server_cfg, client_cfg) = tls_configs();
    let (client_io, server_io) = tokio::io::duplex(64);
    let (tx, stop) = tokio::sync::watch::channel(false);
    let settings = settings();
    tokio::spawn(async move {
        let _tx = tx;
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg))
            .accept(server_io)
            .await
            .unwrap();
        let _ = serve(tls, NotFound, settings, stop).await;
    });
    let name = rustls::pki_types::ServerName::try_from("h2.test").unwrap();
    let mut c = tokio_rustls::TlsConnector::from(client_cfg)
        .connect(name, client_io)
        .await
        .unwrap();
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    c.flush().await.unwrap();
    let mut buf = BytesMut::new();
    let done = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            while buf.len() >= HEADER_LEN {
                let h = Head::parse(&buf);
                if buf.len() < HEADER_LEN + h.len as usize {
                    break;
                }
                buf.advance(HEADER_LEN + h.len as usize);
                if h.stream == 1 && h.has(flag::END_STREAM) {
                    return;
                }
            }
            assert!(c.read_buf(&mut buf).await.unwrap() > 0, "closed");
        }
    })
    .await;
    assert!(done.is_ok(), "the end of the response is stuck in rustls");
}

// DATA refused by a stream error must still be credited to the
// connection window, on both stream-error paths (stream window, content-length).
#[tokio::test]
async fn data_refused_by_a_stream_error_is_credited_to_the_connection() {
    let input = hello();
    let (mut d, _c) = hand_driver(|s| s.max_resets_per_sec = 1000, &input).await;
    // Two open uploads (as if their requests were still being handled): stream 1 with
    // a 1 KiB window left, stream 3 with `content-length: 1`.
    for (id, window, cl) in [(1u32, 1024i64, None), (3, 256 * 1024, Some(1u64))] {
        let mut s = Stream::new(d.peer_initial_window, window);
        s.recv = Some(RecvShared::new(d.signal.clone(), id, 1 << 20));
        s.content_length = cl;
        d.streams.insert(id, s);
        d.last_stream = id;
    }
    let payload = Bytes::from(vec![0u8; 16_384]);
    for id in [1u32, 3] {
        let head = Head {
            len: 16_384,
            kind: kind::DATA,
            flags: 0,
            stream: id,
        };
        match d.on_data(head, payload.clone()) {
            Err(f @ Fault::Stream(..)) => d.fault(f),
            _ => panic!("a stream error expected"),
        }
    }
    assert!(d.streams.is_empty());
    let accounted = d.conn_recv_window + d.conn_release as i64 + d.signal.take_consumed() as i64;
    assert_eq!(
        accounted,
        d.cfg.conn_window as i64,
        "connection window lost for good: {} bytes",
        d.cfg.conn_window as i64 - accounted
    );
}

// A graceful drain of a connection without streams whose client does not read
// is given up after a bound (it had no close deadline: the GOAWAY waited in the buffer forever).
#[tokio::test]
async fn a_drained_connection_whose_client_does_not_read_is_closed() {
    let t = Duration::from_millis(200);
    let (mut c, server) = tokio::io::duplex(1);
    let (tx, stop) = tokio::sync::watch::channel(false);
    let mut settings = settings();
    settings.idle_timeout = t;
    settings.header_read_timeout = t;
    let mut d = Driver::new(server, NotFound, settings, stop);
    let input = hello();
    feed(&mut d, &mut c, &input).await;
    // The listener drains.
    tx.send(true).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    assert!(d.going_away && d.streams.is_empty() && d.output_len() > 0);
    let mut ended = false;
    for _ in 0..10 {
        tokio::time::sleep(t).await;
        if d.poll(&mut cx).is_ready() {
            ended = true;
            break;
        }
    }
    assert!(
        ended,
        "still open 2 s after the drain began (close deadline {:?})",
        d.close_deadline
    );
}

// A client that reads a long response steadily but sends no frame (its windows
// are large) is PINGed after `idle_timeout`, and the PING waits behind the queued output;
// the connection must not be closed as dead while the client keeps reading. On tokio's
// paused clock (the connection's clock follows it): 500 turns of 2 ms are 1 s, five idle
// timeouts, whatever the machine's load (on the wall clock it once read 71 bytes at load 16).
#[tokio::test(start_paused = true)]
async fn a_reading_client_is_not_closed_as_dead() {
    let t = Duration::from_millis(200);
    let input = hello();
    let (mut d, mut c) = hand_driver(
        |s| {
            s.idle_timeout = t;
            s.header_read_timeout = t;
        },
        &input,
    )
    .await;
    // Stream 1: a 4 MiB response, windows opened wide by the client up front.
    let mut s = Stream::new(MAX_WINDOW, d.cfg.stream_window as i64);
    s.recv_open = false;
    s.resp = Resp::Body(full(Bytes::from(vec![b'x'; 4 << 20])));
    d.streams.insert(1, s);
    d.last_stream = 1;
    d.conn_send_window = MAX_WINDOW;
    d.enqueue(1);
    // The client reads all the time (one byte per turn through the 1-byte pipe).
    use tokio::io::AsyncRead;
    let mut cx = Context::from_waker(Waker::noop());
    let start = clock();
    let mut got = 0usize;
    let mut ended = None;
    for _ in 0..500 {
        let mut b = [0u8; 1];
        let mut rb = tokio::io::ReadBuf::new(&mut b);
        if let Poll::Ready(Ok(())) = Pin::new(&mut c).poll_read(&mut cx, &mut rb) {
            got += rb.filled().len();
        }
        if let Poll::Ready(r) = d.poll(&mut cx) {
            ended = Some((clock() - start, r));
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        ended.is_none(),
        "closed as dead while its output was being read ({got} bytes read): {ended:?}"
    );
    assert_eq!(clock() - start, t * 5, "five idle timeouts went by");
    assert!(got > 100, "the client kept reading ({got} bytes)");
}

/// What a connection did after a burst of frames: ended with GOAWAY (its code), or answered
/// the PING sent after the burst (None); and the limits the driver reported hit (the guard
/// that fired).
/// `setup` may open streams; the burst waits for the reset of the stream it names.
async fn after_burst(
    setup: impl Fn(&mut BytesMut) -> Option<u32>,
    burst: impl Fn(&mut BytesMut),
) -> (Option<Reason>, Vec<String>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let ended = after_burst_on(log.clone(), setup, burst).await;
    let limits = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| l.strip_prefix("limit ").map(str::to_owned))
        .collect();
    (ended, limits)
}

async fn after_burst_on(
    log: Arc<Mutex<Vec<String>>>,
    setup: impl Fn(&mut BytesMut) -> Option<u32>,
    burst: impl Fn(&mut BytesMut),
) -> Option<Reason> {
    use tokio::io::AsyncWriteExt;
    let (mut c, server) = tokio::io::duplex(4 << 20);
    let (tx, stop) = tokio::sync::watch::channel(false);
    let mut settings = settings();
    settings.max_resets_per_sec = 32;
    tokio::spawn(async move {
        let _tx = tx;
        let _ = serve(server, Recording(log), settings, stop).await;
    });
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    // Stream 1 is answered in full (closed); `setup` may open or get others reset.
    out.extend_from_slice(&request(1, true));
    let reset = setup(&mut out);
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let (mut answered, mut was_reset) = (false, reset.is_none());
    while !(answered && was_reset) {
        let (h, _) = read_frame(&mut c, &mut buf)
            .await
            .expect("stream 1 answered");
        answered |= h.kind == kind::DATA && h.stream == 1 && h.has(flag::END_STREAM);
        was_reset |= h.kind == kind::RST_STREAM && Some(h.stream) == reset;
    }
    let mut out = BytesMut::new();
    burst(&mut out);
    frame::put_ping(&mut out, *b"sentinel");
    // The driver may stop reading once it has ended the connection.
    let _ = c.write_all(&out).await;
    loop {
        let (h, p) = read_frame(&mut c, &mut buf).await?;
        if h.kind == kind::GOAWAY {
            return Some(Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]])));
        }
        if h.kind == kind::PING && h.has(flag::ACK) && &p[..] == b"sentinel" {
            return None;
        }
    }
}

/// Frames that cost the server work and deliver nothing, sent by the thousand, end the
/// connection with GOAWAY ENHANCE_YOUR_CALM, each class by its own guard (the limit the
/// driver reports); 150 of each are served as usual and hit no limit.
#[tokio::test]
async fn floods_of_frames_that_do_nothing_end_with_enhance_your_calm() {
    type Setup = fn(&mut BytesMut) -> Option<u32>;
    type Put = fn(&mut BytesMut);
    let nothing: Setup = |_| None;
    // An upload that the service answers at once: the driver resets the stream after it.
    let reset_upload: Setup = |out| {
        out.extend_from_slice(&request(3, false));
        Some(3)
    };
    const GLITCH: &str = "h2_glitch_flood";
    const CONTROL: &str = "h2_control_flood";
    const EMPTY: &str = "h2_empty_frame_flood";
    let cases: [(&str, Setup, Put, &str); 11] = [
        (
            "unknown frame type",
            nothing,
            |out| frame::put_head(out, 0, 0x20, 0, 0),
            GLITCH,
        ),
        (
            "WINDOW_UPDATE on a closed stream",
            nothing,
            |out| frame::put_window_update(out, 1, 1),
            GLITCH,
        ),
        (
            "RST_STREAM on a closed stream",
            nothing,
            |out| frame::put_rst(out, 1, Reason::CANCEL),
            GLITCH,
        ),
        (
            "DATA on a stream we reset",
            reset_upload,
            |out| frame::put_data(out, 3, b"x", false),
            GLITCH,
        ),
        (
            "trailers (HEADERS with END_STREAM) on a stream we reset",
            reset_upload,
            |out| {
                let mut block = BytesMut::new();
                Encoder::field(&mut block, b"x-trailer", b"1", false);
                frame::put_headers(out, 3, &block, true, 16_384);
            },
            GLITCH,
        ),
        ("SETTINGS ACK", nothing, frame::put_settings_ack, CONTROL),
        (
            "PING ACK",
            nothing,
            |out| frame::put_ping_ack(out, b"12345678"),
            CONTROL,
        ),
        (
            "GOAWAY",
            nothing,
            |out| frame::put_goaway(out, 0, Reason::NO_ERROR, b""),
            CONTROL,
        ),
        (
            "PING",
            nothing,
            |out| frame::put_ping(out, *b"12345678"),
            CONTROL,
        ),
        (
            "SETTINGS",
            nothing,
            |out| frame::put_settings(out, &[]),
            CONTROL,
        ),
        (
            "empty DATA",
            reset_upload,
            |out| frame::put_data(out, 3, b"", false),
            EMPTY,
        ),
    ];
    let mut fails = Vec::new();
    for (name, setup, put, guard) in cases {
        let (few, limits) = after_burst(setup, |out| {
            for _ in 0..150 {
                put(out)
            }
        })
        .await;
        if few.is_some() || !limits.is_empty() {
            fails.push(format!(
                "{name}: 150 ended the connection with {few:?}, limits {limits:?}"
            ));
        }
        let (many, limits) = after_burst(setup, |out| {
            for _ in 0..3_000 {
                put(out)
            }
        })
        .await;
        if many != Some(Reason::ENHANCE_YOUR_CALM) || limits != [guard] {
            fails.push(format!(
                "{name}: 3,000 gave {many:?} by {limits:?}, want ENHANCE_YOUR_CALM by {guard}"
            ));
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// Streams opened and reset by the client at once (rapid reset, CVE-2023-44487) past
/// `max_resets_per_sec`: GOAWAY ENHANCE_YOUR_CALM.
#[tokio::test]
async fn rapid_resets_end_with_enhance_your_calm() {
    let got = after_burst(
        |_| None,
        |out| {
            for i in 0..100u32 {
                let id = 3 + 2 * i;
                out.extend_from_slice(&request(id, false));
                frame::put_rst(out, id, Reason::CANCEL);
            }
        },
    )
    .await;
    assert_eq!(
        got,
        (
            Some(Reason::ENHANCE_YOUR_CALM),
            vec!["h2_rapid_reset".into()]
        )
    );
}

/// [`NotFound`], recording what the driver tells its service.
struct Recording(Arc<Mutex<Vec<String>>>);

impl H2Service for Recording {
    type Head = crate::NoHead;
    type Future = std::future::Ready<(Response<Body>, Option<crate::NoHead>)>;

    fn call(&mut self, request: Request<Body>, now: Instant) -> Self::Future {
        self.0.lock().unwrap().push("call".into());
        NotFound.call(request, now)
    }

    fn limit_hit(&self, what: &'static str) {
        self.0.lock().unwrap().push(format!("limit {what}"));
    }

    fn connection_error(&self, reason: Reason, _why: &'static str) {
        self.0.lock().unwrap().push(format!("error {reason}"));
    }

    fn on_poll(&mut self) {
        let mut log = self.0.lock().unwrap();
        if log.last().is_none_or(|l| l != "poll") {
            log.push("poll".into());
        }
    }

    fn on_idle(&mut self) {
        let mut log = self.0.lock().unwrap();
        if log.last().is_none_or(|l| l != "idle") {
            log.push("idle".into());
        }
    }
}

#[tokio::test]
async fn the_service_hears_of_requests_idleness_and_the_connection_error() {
    use tokio::io::AsyncWriteExt;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let driver = tokio::spawn(serve(server, Recording(log.clone()), settings(), stop));
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    loop {
        let (h, _) = read_frame(&mut c, &mut buf).await.unwrap();
        if h.kind == kind::DATA && h.has(flag::END_STREAM) {
            break;
        }
    }
    // A request on an even stream id: a connection error, reported once.
    c.write_all(&request(2, true)).await.unwrap();
    while read_frame(&mut c, &mut buf).await.is_some() {}
    assert!(driver.await.unwrap().is_err());
    let log = log.lock().unwrap().clone();
    let at = |what: &str| log.iter().position(|l| l == what);
    assert_eq!(log.first().map(String::as_str), Some("poll"), "{log:?}");
    assert_eq!(log.iter().filter(|l| *l == "call").count(), 1, "{log:?}");
    let errors: Vec<_> = log.iter().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors, ["error PROTOCOL_ERROR"], "{log:?}");
    // Idle between the answered request and the error: the service may let go of what it
    // keeps for requests there.
    let idle = at("idle").expect("idle after the first stream");
    assert!(at("call").unwrap() < idle, "{log:?}");
    assert!(idle < at("error PROTOCOL_ERROR").unwrap(), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("limit")), "{log:?}");
}

/// Answers every request with a `len`-byte body, recording what the driver tells it.
struct Sized(usize, Arc<Mutex<Vec<String>>>);

impl H2Service for Sized {
    type Head = crate::NoHead;
    type Future = std::future::Ready<(Response<Body>, Option<crate::NoHead>)>;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> Self::Future {
        std::future::ready((Response::new(full(Bytes::from(vec![b'x'; self.0]))), None))
    }

    fn limit_hit(&self, what: &'static str) {
        self.1.lock().unwrap().push(format!("limit {what}"));
    }

    fn connection_error(&self, reason: Reason, _why: &'static str) {
        self.1.lock().unwrap().push(format!("error {reason}"));
    }
}

/// What happened to one stream while a client kept its connection alive.
#[derive(Debug, Default)]
struct Outcome {
    data: usize,
    ended: bool,
    reset: Option<Reason>,
    /// When the stream ended or was reset, from the start of [`watch`].
    after: Duration,
}

/// Reads the frames of stream `id` until it ends or is reset (at most 5 s), sending a PING
/// every 50 ms (the client is alive: the socket is never stalled) and `tick`'s frames every
/// `every`.
async fn watch(
    c: &mut tokio::io::DuplexStream,
    buf: &mut BytesMut,
    id: u32,
    every: Duration,
    mut tick: impl FnMut(&mut BytesMut),
) -> Outcome {
    use tokio::io::AsyncWriteExt;
    let start = Instant::now();
    let mut o = Outcome::default();
    let mut last_ping = start;
    let mut last_tick = start;
    while start.elapsed() < Duration::from_secs(5) {
        let mut out = BytesMut::new();
        if last_ping.elapsed() >= Duration::from_millis(50) {
            frame::put_ping(&mut out, *b"imalive!");
            last_ping = Instant::now();
        }
        if last_tick.elapsed() >= every {
            tick(&mut out);
            last_tick = Instant::now();
        }
        c.write_all(&out).await.unwrap();
        // Frames that arrive within 10 ms.
        loop {
            if let Some((h, f)) = take_frame(buf) {
                if h.kind == kind::GOAWAY {
                    panic!("the connection ended: {:?}", &f[..]);
                }
                if h.stream == id && h.kind == kind::DATA {
                    o.data += f.len();
                    o.ended = h.has(flag::END_STREAM);
                }
                if h.stream == id && h.kind == kind::RST_STREAM {
                    o.reset = Some(Reason(u32::from_be_bytes([f[0], f[1], f[2], f[3]])));
                }
                if o.ended || o.reset.is_some() {
                    o.after = start.elapsed();
                    return o;
                }
                continue;
            }
            let read = tokio::time::timeout(Duration::from_millis(10), c.read_buf(buf));
            match read.await {
                Ok(Ok(0)) | Ok(Err(_)) => panic!("the connection closed"),
                Ok(Ok(_)) => {}
                Err(_) => break,
            }
        }
    }
    o.after = start.elapsed();
    o
}

/// A client that keeps a stream's window, or the connection's, at zero while it answers
/// PINGs holds the response for `send_timeout`, then the stream is reset with CANCEL and its
/// slot is free; a client that opens its window a little at a time (each step within
/// `send_timeout`) gets its whole response however long it takes; the connection keeps
/// serving.
#[tokio::test]
async fn a_response_held_by_a_zero_window_is_reset_after_send_timeout() {
    use tokio::io::AsyncWriteExt;
    let t = Duration::from_millis(300);
    let log = Arc::new(Mutex::new(Vec::new()));
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut cfg = settings();
    cfg.send_timeout = t;
    cfg.idle_timeout = Duration::from_secs(10);
    let driver = tokio::spawn(serve(server, Sized(100_000, log.clone()), cfg, stop));
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    // No stream window at all.
    frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    frame::put_settings_ack(&mut out);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();

    // 1. The stream window stays at zero.
    let o = watch(&mut c, &mut buf, 1, Duration::MAX, |_| {}).await;
    assert_eq!((o.data, o.reset), (0, Some(Reason::CANCEL)), "{o:?}");
    assert!(o.after >= t - Duration::from_millis(20), "{o:?}");
    let hits = |log: &Arc<Mutex<Vec<String>>>| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| *l == "limit h2_send_timeout")
            .count()
    };
    assert_eq!(hits(&log), 1);

    // 2. Windows opened a little at a time, every half send_timeout: served in full
    // (65,535 bytes at once, then three steps of 12,000), though it takes longer than
    // send_timeout in all.
    let mut out = BytesMut::new();
    frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 65_535)]);
    out.extend_from_slice(&request(3, true));
    c.write_all(&out).await.unwrap();
    let o = watch(&mut c, &mut buf, 3, t / 2, |out| {
        frame::put_window_update(out, 0, 12_000);
        frame::put_window_update(out, 3, 12_000);
    })
    .await;
    assert!(o.ended && o.reset.is_none(), "{o:?}");
    assert_eq!(o.data, 100_000);
    assert!(o.after > t, "{o:?}");

    // 3. The connection window at zero (1,535 bytes left of it after stream 3): stream 5's
    // own window is open, but the response waits for the connection's, which never opens.
    c.write_all(&request(5, true)).await.unwrap();
    let o = watch(&mut c, &mut buf, 5, Duration::MAX, |_| {}).await;
    assert_eq!((o.data, o.reset), (1_535, Some(Reason::CANCEL)), "{o:?}");
    assert_eq!(hits(&log), 2);

    // 4. The connection still serves a client that opens its windows.
    let mut out = BytesMut::new();
    frame::put_window_update(&mut out, 0, 1 << 20);
    out.extend_from_slice(&request(7, true));
    frame::put_window_update(&mut out, 7, 1 << 20);
    c.write_all(&out).await.unwrap();
    let o = watch(&mut c, &mut buf, 7, Duration::MAX, |_| {}).await;
    assert!(o.ended && o.data == 100_000, "{o:?}");
    assert!(!driver.is_finished());
    let log = log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.starts_with("error")), "{log:?}");
}

/// The frames in `b`, in order.
fn frames_of(mut b: BytesMut) -> Vec<(Head, Bytes)> {
    let mut frames = Vec::new();
    while let Some(f) = take_frame(&mut b) {
        frames.push(f);
    }
    assert!(b.is_empty(), "whole frames only: {} bytes left", b.len());
    frames
}

/// The frames of stream `id` in `frames` as (type, END_STREAM, RST_STREAM's error code),
/// and whether a PING ACK follows the last of them.
fn stream_frames(frames: &[(Head, Bytes)], id: u32) -> (Vec<(u8, bool, Option<Reason>)>, bool) {
    let mut on_id = Vec::new();
    let mut ping_after = false;
    for (h, p) in frames {
        if h.stream == id {
            let code = (h.kind == kind::RST_STREAM)
                .then(|| Reason(u32::from_be_bytes([p[0], p[1], p[2], p[3]])));
            on_id.push((h.kind, h.has(flag::END_STREAM), code));
            ping_after = false;
        } else if h.kind == kind::PING && h.has(flag::ACK) {
            ping_after = true;
        }
    }
    (on_id, ping_after)
}

/// A 30-byte response body that tells its owner when it is dropped (the sender's drop).
struct Guarded {
    body: Body,
    _dropped: tokio::sync::oneshot::Sender<()>,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = crate::BoxError;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, crate::BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Answers its one request (head and a [`Guarded`] body) only once `gate` is released, as
/// a proxied backend answers later: the response is made in the request's own task.
struct Gated {
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
    dropped: Option<tokio::sync::oneshot::Sender<()>>,
}

impl H2Service for Gated {
    type Head = crate::NoHead;
    type Future = Pin<Box<dyn Future<Output = (Response<Body>, Option<crate::NoHead>)> + Send>>;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> Self::Future {
        let gate = self.gate.take().expect("one request");
        let body = Guarded {
            body: full(Bytes::from_static(b"hello from the h2spec backend\n")),
            _dropped: self.dropped.take().expect("one request"),
        };
        Box::pin(async move {
            let _ = gate.await;
            (Response::new(crate::boxed(body)), None)
        })
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

/// h2spec http2/5.1/8 when the client's RST_STREAM comes before the response: HEADERS
/// without END_STREAM, RST_STREAM(CANCEL), the response released only then, then DATA.
/// Nothing of the response is written on the reset stream (the request's task is aborted
/// and its body dropped), the stream's state and window are gone, and the late DATA gets
/// RST_STREAM(STREAM_CLOSED) (RFC 9113 §5.1: frames after the peer's RST_STREAM).
#[tokio::test]
async fn a_response_released_after_the_clients_reset_is_never_written() {
    let (gate_tx, gate) = tokio::sync::oneshot::channel();
    let (dropped, mut dropped_rx) = tokio::sync::oneshot::channel();
    let service = Gated {
        gate: Some(gate),
        dropped: Some(dropped),
    };
    let mut input = hello();
    input.extend_from_slice(&request(1, false));
    let (mut d, mut c) = hand_driver_serving(service, |_| {}, &input).await;
    assert!(
        matches!(d.streams.get(&1).map(|s| &s.resp), Some(Resp::Running(_))),
        "the response waits for the gate"
    );
    let mut rst = BytesMut::new();
    frame::put_rst(&mut rst, 1, Reason::CANCEL);
    feed(&mut d, &mut c, &rst).await;
    assert!(d.streams.is_empty() && d.queue.is_empty() && d.blocked.is_empty());
    // The service answers now (its task may already be gone: then the gate is not heard).
    let _ = gate_tx.send(());
    let dropped = tokio::time::timeout(Duration::from_secs(10), &mut dropped_rx).await;
    assert!(
        matches!(dropped, Ok(Err(_))),
        "the response body is dropped unsent"
    );
    let mut late = BytesMut::new();
    frame::put_data(&mut late, 1, b"test", true);
    frame::put_ping(&mut late, *b"h2spec!!");
    feed(&mut d, &mut c, &late).await;
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    let (on_1, ping_after) = stream_frames(&frames_of(written(&d, &mut c)), 1);
    assert_eq!(
        on_1,
        [(kind::RST_STREAM, false, Some(Reason::STREAM_CLOSED))],
        "no HEADERS or DATA on the reset stream; its late DATA is an error"
    );
    assert!(ping_after, "the connection goes on");
    assert!(d.streams.is_empty() && d.closing.is_none());
    // Every byte the client sent is credited back to the connection.
    assert_eq!(
        d.conn_recv_window + d.conn_release as i64,
        settings().conn_window as i64
    );
}

/// h2spec http2/5.1/8 when the response comes first (CI, TLS, loaded machine): the request
/// is answered before its body ended and the body is not wanted, so the stream is reset
/// with NO_ERROR (RFC 9113 §8.1); the client, which had not seen that, sends
/// RST_STREAM(CANCEL), then DATA. Frames the client sent before it saw our reset are
/// ignored, but after its own RST_STREAM it may send none (RFC 9113 §5.1): the DATA gets
/// RST_STREAM(STREAM_CLOSED), not silence.
#[tokio::test]
async fn frames_after_the_clients_own_reset_of_a_stream_we_reset_are_errors() {
    let mut input = hello();
    input.extend_from_slice(&request(1, false));
    let (mut d, mut c) = hand_driver(|_| {}, &input).await;
    assert!(d.locally_reset_set.contains(&1), "answered and reset");
    let mut late = BytesMut::new();
    frame::put_rst(&mut late, 1, Reason::CANCEL);
    frame::put_data(&mut late, 1, b"test", true);
    frame::put_ping(&mut late, *b"h2spec!!");
    feed(&mut d, &mut c, &late).await;
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    let (on_1, ping_after) = stream_frames(&frames_of(written(&d, &mut c)), 1);
    assert_eq!(
        on_1,
        [
            (kind::HEADERS, false, None),
            (kind::DATA, true, None),
            (kind::RST_STREAM, false, Some(Reason::NO_ERROR)),
            (kind::RST_STREAM, false, Some(Reason::STREAM_CLOSED)),
        ],
        "the late DATA is answered before the PING"
    );
    assert!(ping_after);
    assert!(d.streams.is_empty() && d.closing.is_none());
    assert_eq!(
        d.conn_recv_window + d.conn_release as i64,
        settings().conn_window as i64
    );
}

/// The driver's clock is the runtime's: a paused runtime's advance moves it (the deadlines and
/// the timer that waits for them then agree). With std's clock it stood still here, and the fuzz
/// harness (paused, auto-advancing) spun until the real time reached a deadline: 10 s per run of
/// the input libFuzzer reported as a timeout.
#[tokio::test(start_paused = true)]
async fn the_clock_is_the_runtimes() {
    let before = clock();
    tokio::time::advance(Duration::from_secs(30)).await;
    assert!(clock().duration_since(before) >= Duration::from_secs(30));
}

/// A body yielding its chunks one frame each.
struct Chunks(VecDeque<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, crate::BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// An I/O that takes a few bytes of the gathered buffers per write (1 to 6,999, varying), so
/// writes end inside frame heads, payloads and between them. With `gathers` false it says it
/// has no vectored writes (`is_write_vectored`), as tokio's default does, though it would
/// still take several buffers: the driver must then not hand it more than one.
struct Gathering {
    inner: tokio::io::DuplexStream,
    turn: usize,
    gathers: bool,
    pub vectored_writes: Arc<AtomicUsize>,
}

impl AsyncRead for Gathering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Gathering {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.turn += 1;
        if bufs.len() > 1 {
            self.vectored_writes.fetch_add(1, Ordering::Relaxed);
        }
        let max = 1 + (self.turn * 7_919) % 7_000;
        let mut gathered = Vec::new();
        for b in bufs {
            let n = b.len().min(max - gathered.len());
            gathered.extend_from_slice(&b[..n]);
            if gathered.len() == max {
                break;
            }
        }
        Pin::new(&mut self.inner).poll_write(cx, &gathered)
    }
    fn is_write_vectored(&self) -> bool {
        self.gathers
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// Large DATA payloads are queued by reference and gathered by vectored writes: whatever the
// writes take, the client gets the body's bytes in order, in frames within the peer's frame
// size, END_STREAM on the last; small payloads (copied) mix with them.
#[tokio::test]
async fn gathered_data_reaches_the_client_intact_whatever_the_writes_take() {
    let vectored = data_through_partial_writes(true).await;
    assert!(vectored > 0, "payloads were gathered");
}

// An I/O without vectored writes gets every payload copied into one buffer per write (a
// vectored write there would send only its first buffer, one syscall per segment), and the
// bodies arrive the same.
#[tokio::test]
async fn an_io_without_vectored_writes_is_never_handed_several_buffers() {
    let vectored = data_through_partial_writes(false).await;
    assert_eq!(vectored, 0, "no write carried more than one buffer");
}

/// Serves two 200,000-byte bodies cut into chunks of mixed sizes through a [`Gathering`] I/O
/// (`gathers` its `is_write_vectored`), checks what the client reads, and returns how many
/// writes carried more than one buffer.
async fn data_through_partial_writes(gathers: bool) -> usize {
    use tokio::io::AsyncWriteExt;
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Bytes> = [70_000, 1_000, 3, 20_000, 5_000, 100_000, 3_997]
        .iter()
        .scan(0, |at, &n| {
            let c = Bytes::copy_from_slice(&body[*at..*at + n]);
            *at += n;
            Some(c)
        })
        .collect();
    assert_eq!(chunks.iter().map(Bytes::len).sum::<usize>(), body.len());
    let (mut c, server) = tokio::io::duplex(4096);
    let vectored = Arc::new(AtomicUsize::new(0));
    let io = Gathering {
        inner: server,
        turn: 0,
        gathers,
        vectored_writes: vectored.clone(),
    };
    let (tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _tx = tx;
        let bodies = [
            Chunks(chunks.iter().cloned().collect()),
            Chunks(chunks.into()),
        ];
        let _ = serve(io, Bodies(bodies.into(), Arc::default()), settings(), stop).await;
    });
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 1 << 20)]);
    frame::put_window_update(&mut out, 0, 1 << 20);
    out.extend_from_slice(&request(1, true));
    out.extend_from_slice(&request(3, true));
    c.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut got: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut ended = [false; 2];
    // Bounded: every frame read either is one of the two streams' or ends the loop.
    while ended != [true, true] {
        let (h, p) = read_frame(&mut c, &mut buf).await.expect("frames");
        if h.kind != kind::DATA {
            continue;
        }
        assert!(p.len() <= frame::DEFAULT_MAX_FRAME_SIZE as usize);
        let i = (h.stream / 2) as usize;
        assert!(!ended[i], "nothing after END_STREAM on stream {}", h.stream);
        got[i].extend_from_slice(&p);
        ended[i] = h.has(flag::END_STREAM);
    }
    assert!(
        got[0] == body && got[1] == body,
        "both bodies arrive whole and in order"
    );
    vectored.load(Ordering::Relaxed)
}

/// A response body that ends (empty) once its sender is dropped.
struct Held(Option<tokio::sync::oneshot::Receiver<()>>);

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = crate::BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, crate::BoxError>>> {
        let Some(rx) = self.0.as_mut() else {
            return Poll::Ready(None);
        };
        std::task::ready!(Pin::new(rx).poll(cx)).ok();
        self.0 = None;
        Poll::Ready(None)
    }
}

/// Panics when dropped.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("a request future's drop panics");
    }
}

/// What one request of [`Scripted`] does.
enum Script {
    /// Answers once the gate opens; the sender tells when the future is dropped.
    Gate(
        tokio::sync::oneshot::Receiver<()>,
        tokio::sync::oneshot::Sender<()>,
    ),
    /// Panics in its first poll.
    Panic,
    /// Answers at once with a body that ends when the sender is dropped.
    Streaming(tokio::sync::oneshot::Receiver<()>),
    /// Never answers; its `Drop` panics.
    PanicsOnDrop,
    /// Answers once the gate opens, counting its polls.
    Counted(
        tokio::sync::oneshot::Receiver<()>,
        Arc<std::sync::atomic::AtomicUsize>,
    ),
}

/// Runs its requests' scripts in order.
struct Scripted(VecDeque<Script>);

impl H2Service for Scripted {
    type Head = crate::NoHead;
    type Future = Pin<Box<dyn Future<Output = (Response<Body>, Option<crate::NoHead>)> + Send>>;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> Self::Future {
        match self.0.pop_front().expect("a script per request") {
            Script::Gate(gate, dropped) => Box::pin(async move {
                let _dropped = dropped;
                let _ = gate.await;
                (Response::new(full(Bytes::from_static(b"answered\n"))), None)
            }),
            Script::Panic => Box::pin(async { panic!("a request future panics") }),
            Script::PanicsOnDrop => Box::pin(async move {
                let _bomb = PanicsOnDrop;
                std::future::pending::<()>().await;
                unreachable!("never answers")
            }),
            Script::Counted(mut gate, polls) => Box::pin(async move {
                std::future::poll_fn(|cx| {
                    polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Pin::new(&mut gate).poll(cx).map(|_| ())
                })
                .await;
                (Response::new(full(Bytes::from_static(b"answered\n"))), None)
            }),
            Script::Streaming(more) => {
                Box::pin(async move { (Response::new(crate::boxed(Held(Some(more)))), None) })
            }
        }
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

/// The request futures run on the connection's task, each on its own: a waiting one holds
/// no other (stream 3 is answered while stream 1 waits), one that panics resets only its
/// stream (INTERNAL_ERROR), the client's RST_STREAM drops its stream's future at once (its
/// backend request is cancelled: no task is left running it), and so does the connection's
/// end for every future still waiting.
#[tokio::test]
async fn request_futures_run_on_the_connection_and_go_with_their_stream() {
    use tokio::sync::oneshot::{channel, error::TryRecvError};
    let (gate1_tx, gate1) = channel();
    let (dropped1, mut dropped1_rx) = channel();
    let (gate3_tx, gate3) = channel();
    let (dropped3, mut dropped3_rx) = channel();
    let (_gate7_tx, gate7) = channel();
    let (dropped7, mut dropped7_rx) = channel();
    let service = Scripted(VecDeque::from([
        Script::Gate(gate1, dropped1),
        Script::Gate(gate3, dropped3),
        Script::Panic,
        Script::Gate(gate7, dropped7),
    ]));
    let mut input = hello();
    for id in [1, 3, 5, 7] {
        input.extend_from_slice(&request(id, true));
    }
    let (mut d, mut c) = hand_driver_serving(service, |_| {}, &input).await;
    for id in [1, 3, 7] {
        assert!(
            matches!(d.streams.get(&id).map(|s| &s.resp), Some(Resp::Running(_))),
            "stream {id} waits"
        );
    }
    assert!(!d.streams.contains_key(&5), "the panicking stream is gone");
    // Stream 3's answer comes: its waker marks it ready, the next poll answers it.
    gate3_tx.send(()).expect("stream 3 waits");
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    assert!(matches!(dropped3_rx.try_recv(), Err(TryRecvError::Closed)));
    assert!(!d.streams.contains_key(&3), "answered and closed");
    assert!(matches!(dropped1_rx.try_recv(), Err(TryRecvError::Empty)));
    let frames = frames_of(written(&d, &mut c));
    assert_eq!(stream_frames(&frames, 1).0, [], "stream 1 still waits");
    assert_eq!(
        stream_frames(&frames, 3).0,
        [(kind::HEADERS, false, None), (kind::DATA, true, None)]
    );
    assert_eq!(
        stream_frames(&frames, 5).0,
        [(kind::RST_STREAM, false, Some(Reason::INTERNAL_ERROR))]
    );
    // The client resets stream 1: its future is dropped with it, before the next poll.
    let mut rst = BytesMut::new();
    frame::put_rst(&mut rst, 1, Reason::CANCEL);
    feed(&mut d, &mut c, &rst).await;
    assert!(matches!(dropped1_rx.try_recv(), Err(TryRecvError::Closed)));
    assert!(
        gate1_tx.send(()).is_err(),
        "nobody waits for stream 1's answer"
    );
    assert!(!d.streams.contains_key(&1) && d.closing.is_none());
    // The connection's end drops the futures still waiting.
    assert!(matches!(dropped7_rx.try_recv(), Err(TryRecvError::Empty)));
    drop(d);
    assert!(matches!(dropped7_rx.try_recv(), Err(TryRecvError::Closed)));
}

/// A server I/O whose reads fail (a connection reset) once `fail` is set, and its writes
/// once `fail_writes` is.
struct ResetOnRead {
    inner: tokio::io::DuplexStream,
    fail: Arc<std::sync::atomic::AtomicBool>,
    fail_writes: Arc<std::sync::atomic::AtomicBool>,
}

impl AsyncRead for ResetOnRead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResetOnRead {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A driver over [`ResetOnRead`] that has read the client's opening and `requests` (each must
/// be waiting), with the client end and the two failure switches (reads, writes).
async fn faulty_driver<S: H2Service>(
    service: S,
    edit: impl FnOnce(&mut Settings),
    requests: &[u32],
) -> (
    Driver<ResetOnRead, S>,
    tokio::io::DuplexStream,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::AsyncWriteExt;
    let (mut c, server) = tokio::io::duplex(1 << 16);
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fail_writes = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let io = ResetOnRead {
        inner: server,
        fail: fail.clone(),
        fail_writes: fail_writes.clone(),
    };
    let (tx, stop) = tokio::sync::watch::channel(false);
    std::mem::forget(tx);
    let mut settings = settings();
    edit(&mut settings);
    let mut d = Driver::new(io, service, settings, stop);
    let mut input = hello();
    for &id in requests {
        input.extend_from_slice(&request(id, true));
    }
    c.write_all(&input)
        .await
        .expect("the pipe takes the requests");
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    for &id in requests {
        assert!(
            matches!(d.streams.get(&id).map(|s| &s.resp), Some(Resp::Running(_))),
            "stream {id} waits"
        );
    }
    (d, c, fail, fail_writes)
}

/// The client's end of the connection ends every request still waiting for its answer at
/// once: its future is dropped (its backend request cancelled), not kept until the backend
/// answers or the keep-alive PING goes unanswered (about 70 s). At EOF the waiting stream is
/// reset (CANCEL) and a response already being sent goes on; a read error (the client reset
/// the connection) ends the connection and every stream at once.
#[tokio::test]
async fn the_clients_eof_or_read_error_drops_the_waiting_futures() {
    use tokio::io::AsyncWriteExt;
    use tokio::sync::oneshot::{channel, error::TryRecvError};
    // EOF: stream 1 waits, stream 3's response is being sent (its body waits).
    let (_gate1_tx, gate1) = channel();
    let (dropped1, mut dropped1_rx) = channel();
    let (more3_tx, more3) = channel::<()>();
    let service = Scripted(VecDeque::from([
        Script::Gate(gate1, dropped1),
        Script::Streaming(more3),
    ]));
    let mut input = hello();
    for id in [1, 3] {
        input.extend_from_slice(&request(id, true));
    }
    let (mut d, mut c) = hand_driver_serving(service, |_| {}, &input).await;
    assert!(matches!(
        d.streams.get(&1).map(|s| &s.resp),
        Some(Resp::Running(_))
    ));
    assert!(matches!(
        d.streams.get(&3).map(|s| &s.resp),
        Some(Resp::Body(_))
    ));
    c.shutdown().await.expect("the client closes its side");
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending(), "stream 3 still sends");
    assert!(
        matches!(dropped1_rx.try_recv(), Err(TryRecvError::Closed)),
        "the waiting request is cancelled at EOF"
    );
    assert!(!d.streams.contains_key(&1));
    let frames = frames_of(written(&d, &mut c));
    assert_eq!(
        stream_frames(&frames, 1).0,
        [(kind::RST_STREAM, false, Some(Reason::CANCEL))]
    );
    assert!(d.streams.contains_key(&3), "a response being sent goes on");
    drop(more3_tx);

    // A read error: the connection ends with every stream.
    let (_gate_tx, gate) = channel();
    let (dropped, mut dropped_rx) = channel();
    let service = Scripted(VecDeque::from([Script::Gate(gate, dropped)]));
    let (mut d, _c, fail, _) = faulty_driver(service, |_| {}, &[1]).await;
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        matches!(d.poll(&mut cx), Poll::Ready(Err(_))),
        "a read error ends the connection"
    );
    assert!(
        matches!(dropped_rx.try_recv(), Err(TryRecvError::Closed)),
        "the waiting request is cancelled on a read error"
    );
    assert!(d.streams.is_empty());
}

/// A waiting request future is polled again only when its own waker fires: the client's
/// WINDOW_UPDATEs on its stream and SETTINGS raising INITIAL_WINDOW_SIZE (each queues every
/// stream) no longer re-poll it (before: one poll of the whole pipeline future per frame or
/// read batch). Its answer still comes in the poll after its waker fired.
#[tokio::test]
async fn window_changes_do_not_poll_a_waiting_future() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (gate_tx, gate) = tokio::sync::oneshot::channel();
    let polls = Arc::new(AtomicUsize::new(0));
    let service = Scripted(VecDeque::from([Script::Counted(gate, polls.clone())]));
    let mut input = hello();
    input.extend_from_slice(&request(1, true));
    let (mut d, mut c) = hand_driver_serving(service, |_| {}, &input).await;
    assert_eq!(polls.load(SeqCst), 1, "the first poll");
    let mut updates = BytesMut::new();
    for _ in 0..1_000 {
        frame::put_window_update(&mut updates, 1, 1);
    }
    for i in 0..10u32 {
        frame::put_settings(
            &mut updates,
            &[(setting::INITIAL_WINDOW_SIZE, frame::DEFAULT_WINDOW + i + 1)],
        );
    }
    feed(&mut d, &mut c, &updates).await;
    assert!(d.closing.is_none());
    assert_eq!(polls.load(SeqCst), 1, "window changes polled the future");
    gate_tx.send(()).expect("the future waits");
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    assert_eq!(polls.load(SeqCst), 2, "its waker fired: polled once more");
    assert!(!d.streams.contains_key(&1), "answered");
    let frames = frames_of(written(&d, &mut c));
    assert_eq!(
        stream_frames(&frames, 1).0,
        [(kind::HEADERS, false, None), (kind::DATA, true, None)]
    );
}

/// A request future whose `Drop` panics ends only its stream: the client's RST_STREAM drops it
/// (the panic is caught and logged), the connection and its other streams go on; the driver's
/// own drop with such futures still running does not panic (a panic there, while the driver
/// unwinds from another, would abort the process). Before, both panics went through the driver.
#[tokio::test]
async fn a_panic_dropping_a_future_ends_only_its_stream() {
    let (gate3_tx, gate3) = tokio::sync::oneshot::channel();
    let (dropped3, _dropped3_rx) = tokio::sync::oneshot::channel();
    let service = Scripted(VecDeque::from([
        Script::PanicsOnDrop,
        Script::Gate(gate3, dropped3),
        Script::PanicsOnDrop,
    ]));
    let mut input = hello();
    for id in [1, 3, 5] {
        input.extend_from_slice(&request(id, true));
    }
    let (mut d, mut c) = hand_driver_serving(service, |_| {}, &input).await;
    let mut rst = BytesMut::new();
    frame::put_rst(&mut rst, 1, Reason::CANCEL);
    feed(&mut d, &mut c, &rst).await;
    assert!(!d.streams.contains_key(&1) && d.closing.is_none());
    gate3_tx.send(()).expect("stream 3 waits");
    let mut cx = Context::from_waker(Waker::noop());
    assert!(d.poll(&mut cx).is_pending());
    let frames = frames_of(written(&d, &mut c));
    assert_eq!(
        stream_frames(&frames, 3).0,
        [(kind::HEADERS, false, None), (kind::DATA, true, None)],
        "the connection goes on"
    );
    assert!(d.streams.contains_key(&5));
    drop(d);
}

/// Every request waits until `open` turns true; each tells `arrived` when it is first polled.
struct Waiters {
    arrived: tokio::sync::mpsc::UnboundedSender<()>,
    open: tokio::sync::watch::Receiver<bool>,
}

impl H2Service for Waiters {
    type Head = crate::NoHead;
    type Future = Pin<Box<dyn Future<Output = (Response<Body>, Option<crate::NoHead>)> + Send>>;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> Self::Future {
        let arrived = self.arrived.clone();
        let mut open = self.open.clone();
        Box::pin(async move {
            let _ = arrived.send(());
            let _ = open.wait_for(|v| *v).await;
            (Response::new(full(Bytes::from_static(b"answered\n"))), None)
        })
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

/// On a multi-thread runtime, 32 requests waiting on one connection are 32 futures in its
/// streams, not 32 tasks (the runtime's alive tasks grow by the connection's task alone), and
/// an answer that comes from another task, on any worker, wakes the connection: every stream
/// is answered. Before 8ad2887 each waiting request was a task of its own (33 more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_no_tasks_and_wake_across_workers() {
    use tokio::io::AsyncWriteExt;
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let (open_tx, open) = tokio::sync::watch::channel(false);
    let service = Waiters {
        arrived: arrived_tx,
        open,
    };
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let conn = tokio::spawn(serve(server, service, settings(), stop));
    let mut input = hello();
    for i in 0..32u32 {
        input.extend_from_slice(&request(1 + 2 * i, true));
    }
    c.write_all(&input)
        .await
        .expect("the pipe takes the requests");
    for _ in 0..32 {
        tokio::time::timeout(Duration::from_secs(10), arrived.recv())
            .await
            .expect("every request reaches the service in time")
            .expect("the service is alive");
    }
    assert_eq!(
        metrics.num_alive_tasks(),
        before + 1,
        "the connection's task, and no task per waiting request"
    );
    // The answers come from another task.
    tokio::spawn(async move { open_tx.send(true) })
        .await
        .expect("the opener ran")
        .expect("the streams wait");
    let mut buf = BytesMut::new();
    let mut ended = 0;
    while ended < 32 {
        let (h, _) = read_frame(&mut c, &mut buf).await.expect("the answers");
        if h.kind == kind::DATA && h.has(flag::END_STREAM) {
            ended += 1;
        }
        assert_ne!(h.kind, kind::RST_STREAM, "no stream is reset");
        assert_ne!(h.kind, kind::GOAWAY, "the connection goes on");
    }
    conn.abort();
}

/// A graceful drain with a request still waiting: GOAWAY (NO_ERROR, last stream 1) goes out
/// at once, the waiting future is kept (not dropped), its answer is written when it comes,
/// and only then does the connection end, without error.
#[tokio::test]
async fn a_drain_waits_for_the_running_future_then_ends() {
    use tokio::io::AsyncWriteExt;
    use tokio::sync::oneshot::{channel, error::TryRecvError};
    let (gate_tx, gate) = channel();
    let (dropped, mut dropped_rx) = channel();
    let service = Scripted(VecDeque::from([Script::Gate(gate, dropped)]));
    let (mut c, server) = tokio::io::duplex(1 << 16);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let conn = tokio::spawn(serve(server, service, settings(), stop));
    let mut input = hello();
    input.extend_from_slice(&request(1, true));
    c.write_all(&input)
        .await
        .expect("the pipe takes the request");
    // The ACK of the client's SETTINGS: the batch with the request was handled.
    let mut buf = BytesMut::new();
    loop {
        let (h, _) = read_frame(&mut c, &mut buf)
            .await
            .expect("our SETTINGS ACK");
        if h.kind == kind::SETTINGS && h.has(flag::ACK) {
            break;
        }
    }
    stop_tx.send(true).expect("the connection listens");
    let (h, p) = read_frame(&mut c, &mut buf).await.expect("GOAWAY");
    assert_eq!(h.kind, kind::GOAWAY);
    assert_eq!(
        &p[..8],
        &[0, 0, 0, 1, 0, 0, 0, 0],
        "last stream 1, NO_ERROR"
    );
    assert!(
        matches!(dropped_rx.try_recv(), Err(TryRecvError::Empty)),
        "the waiting future is kept"
    );
    gate_tx.send(()).expect("stream 1 waits");
    let mut got = Vec::new();
    while let Some((h, _)) = read_frame(&mut c, &mut buf).await {
        got.push((h.kind, h.stream, h.has(flag::END_STREAM)));
    }
    assert_eq!(
        got,
        [(kind::HEADERS, 1, false), (kind::DATA, 1, true)],
        "the answer, then the end"
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "a clean end: {:?}",
        ended.map(|j| j.map(|r| r.map_err(|e| e.to_string())))
    );
}

/// A write error, and a keep-alive PING the client leaves unanswered, end the connection and
/// drop the request futures still waiting at once (their backend requests are cancelled).
#[tokio::test(start_paused = true)]
async fn a_write_error_or_an_unanswered_ping_drops_the_waiting_futures() {
    use tokio::io::AsyncWriteExt;
    use tokio::sync::oneshot::{channel, error::TryRecvError};
    let mut cx = Context::from_waker(Waker::noop());
    // A write error, on the answer to a PING.
    let (_gate_tx, gate) = channel();
    let (dropped, mut dropped_rx) = channel();
    let service = Scripted(VecDeque::from([Script::Gate(gate, dropped)]));
    let (mut d, mut c, _, fail_writes) = faulty_driver(service, |_| {}, &[1]).await;
    fail_writes.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut ping = BytesMut::new();
    frame::put_ping(&mut ping, *b"12345678");
    c.write_all(&ping).await.expect("the pipe takes the PING");
    assert!(
        matches!(d.poll(&mut cx), Poll::Ready(Err(_))),
        "a write error ends the connection"
    );
    assert!(matches!(dropped_rx.try_recv(), Err(TryRecvError::Closed)));
    assert!(d.streams.is_empty());

    // The keep-alive PING goes unanswered (the client is silent, its side open).
    let (_gate_tx, gate) = channel();
    let (dropped, mut dropped_rx) = channel();
    let service = Scripted(VecDeque::from([Script::Gate(gate, dropped)]));
    let t = Duration::from_secs(1);
    let edit = |s: &mut Settings| {
        s.idle_timeout = t;
        s.header_read_timeout = t;
    };
    let (mut d, _c, _, _) = faulty_driver(service, edit, &[1]).await;
    tokio::time::sleep(t).await;
    assert!(d.poll(&mut cx).is_pending());
    assert!(d.ping_sent.is_some(), "the keep-alive PING went out");
    assert!(
        matches!(dropped_rx.try_recv(), Err(TryRecvError::Empty)),
        "the request still waits for its answer"
    );
    for _ in 0..2 {
        tokio::time::sleep(t).await;
        let _ = d.poll(&mut cx);
    }
    assert!(
        matches!(dropped_rx.try_recv(), Err(TryRecvError::Closed)),
        "the unanswered PING ends the waiting request"
    );
    assert!(d.streams.is_empty());
}

/// The service of the coop budget test: its future spends the task's whole cooperative budget
/// (as a request future polling many backend sockets and timers does) before it answers, and
/// says that it found the budget spent.
struct BudgetSpender(Arc<std::sync::atomic::AtomicBool>);

type BoxedAnswer =
    Pin<Box<dyn Future<Output = (Response<Body>, Option<crate::NoHead>)> + Send + 'static>>;

impl H2Service for BudgetSpender {
    type Head = crate::NoHead;
    type Future = BoxedAnswer;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> BoxedAnswer {
        let spent = self.0.clone();
        Box::pin(std::future::poll_fn(move |cx| {
            // Bounded: tokio's budget is 128 units.
            for _ in 0..1_000 {
                let mut unit = std::pin::pin!(tokio::task::coop::consume_budget());
                if unit.as_mut().poll(cx).is_pending() {
                    spent.store(true, Ordering::Relaxed);
                    break;
                }
            }
            Poll::Ready((Response::new(full(Bytes::from_static(b"ok"))), None))
        }))
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

/// Review L2 of the stream futures change: the stream futures a connection polls spend its
/// task's coop budget, and the answers they made ready are still written in the same poll of
/// the connection (its socket writes are outside the budget, see `Driver::poll_write`), not a
/// scheduler tick later. One poll of the connection, by hand: the request's HEADERS and our
/// answer's HEADERS must be in the pipe after it. With the writes under the budget the pipe
/// stayed empty (the write got the budget's `Pending`).
#[tokio::test]
async fn answers_made_ready_by_futures_that_spent_the_budget_are_written_in_that_poll() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    out.extend_from_slice(&request(1, true));
    client.write_all(&out).await.unwrap();
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let spent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut conn = std::pin::pin!(serve(
        server,
        BudgetSpender(spent.clone()),
        settings(),
        stop
    ));
    // A fresh budget for the one poll below.
    tokio::task::yield_now().await;
    let pending = std::future::poll_fn(|cx| Poll::Ready(conn.as_mut().poll(cx).is_pending())).await;
    assert!(pending, "the connection goes on");
    assert!(
        spent.load(Ordering::Relaxed),
        "the future found the budget spent"
    );
    tokio::task::yield_now().await;
    // What that poll wrote, read without waiting (a later poll of the connection is not made).
    let mut buf = BytesMut::with_capacity(1 << 16);
    let read = {
        let mut read = std::pin::pin!(client.read_buf(&mut buf));
        std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await
    };
    assert!(
        matches!(read, Poll::Ready(Ok(n)) if n > 0),
        "nothing written in the poll: {read:?}"
    );
    let mut answered = false;
    while let Some((h, _)) = take_frame(&mut buf) {
        answered |= h.kind == kind::HEADERS && h.stream == 1;
    }
    assert!(answered, "no HEADERS for stream 1 in the poll's output");
}

/// A closed stream's waker is kept for the next stream only when nothing else holds it: a
/// clone still held (by a backend, a body) could otherwise wake the stream that reuses it.
/// A kept one becomes the next stream's, with its id, and wakes that stream.
/// An idle connection lets its spare stream wakers go with its other buffers (session 20's
/// review, L2: they stayed for the connection's life).
#[tokio::test]
async fn an_idle_connection_keeps_no_spare_wakers() {
    let (mut d, _c) = hand_driver(|_| {}, &hello()).await;
    for id in [1, 3] {
        d.spare_wakers.keep(Some(Arc::new(StreamWaker {
            signal: d.signal.clone(),
            id,
        })));
    }
    assert_eq!(d.spare_wakers.len(), 2);
    d.shrink_buffers();
    assert_eq!(d.spare_wakers.len(), 0);
}

/// `keep` itself refuses a waker with a clone left: the clone is dropped before `take`, so
/// only `keep`'s check can leave the list empty (`take` checks again, and with the clone
/// still held would hide a `keep` that kept it: session 20's review, L1). And `keep` keeps at
/// most [`SPARE_WAKERS`](super::streams::SPARE_WAKERS), however many streams close.
#[test]
fn only_wakers_nothing_else_holds_are_reused() {
    use super::streams::{Spares, SPARE_WAKERS};
    let signal = Arc::new(Signal::default());
    let waker = |id| {
        Arc::new(StreamWaker {
            signal: signal.clone(),
            id,
        })
    };
    let mut spares = Spares::default();
    let held = waker(1);
    let clone = Waker::from(held.clone());
    spares.keep(Some(held));
    drop(clone);
    assert_eq!(spares.len(), 0, "a waker with a clone left is not kept");
    assert!(spares.take(3).is_none());
    spares.keep(Some(waker(5)));
    let reused = spares.take(7).expect("kept");
    assert_eq!(reused.id, 7);
    Waker::from(reused).wake();
    let mut ready = Vec::new();
    signal.take(&mut ready, Waker::noop());
    assert_eq!(ready, [7]);
    assert!(spares.take(9).is_none(), "one spare, taken");
    for id in 0..2 * SPARE_WAKERS as u32 {
        spares.keep(Some(waker(2 * id + 11)));
    }
    assert_eq!(spares.len(), SPARE_WAKERS, "the spares are bounded");
}

/// A response body: `first` at once, then, once `gate` opens, `then` (if any) and its end.
/// The sender tells when the body is dropped (as a static file's body gives its read-ahead
/// chunks back).
struct AfterGate {
    first: Option<Bytes>,
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
    then: Option<Bytes>,
    _dropped: tokio::sync::oneshot::Sender<()>,
}

impl http_body::Body for AfterGate {
    type Data = Bytes;
    type Error = crate::BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, crate::BoxError>>> {
        if let Some(d) = self.first.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(d))));
        }
        if let Some(gate) = self.gate.as_mut() {
            std::task::ready!(Pin::new(gate).poll(cx)).ok();
            self.gate = None;
        }
        Poll::Ready(self.then.take().map(|d| Ok(http_body::Frame::data(d))))
    }
}

/// Answers each request at once with the next of its bodies, and counts the streams reset
/// for want of window after the client's EOF ([`H2Service::blocked_at_eof`]).
struct Bodies<B>(VecDeque<B>, Arc<std::sync::atomic::AtomicUsize>);

impl<B> H2Service for Bodies<B>
where
    B: http_body::Body<Data = Bytes, Error = crate::BoxError> + Send + 'static,
{
    type Head = crate::NoHead;
    type Future = std::future::Ready<(Response<Body>, Option<crate::NoHead>)>;

    fn call(&mut self, _request: Request<Body>, _now: Instant) -> Self::Future {
        let body = self.0.pop_front().expect("a body per request");
        std::future::ready((Response::new(crate::boxed(body)), None))
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}

    fn blocked_at_eof(&self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Everything the driver has written to the client end so far.
fn read_available(c: &mut tokio::io::DuplexStream) -> BytesMut {
    use tokio::io::AsyncRead;
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = BytesMut::new();
    loop {
        let mut b = [0u8; 4096];
        let mut rb = tokio::io::ReadBuf::new(&mut b);
        match Pin::new(&mut *c).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if !rb.filled().is_empty() => out.extend_from_slice(rb.filled()),
            _ => return out,
        }
    }
}

/// Per stream: DATA bytes, whether a DATA frame ended it, its RST_STREAM code.
type Tally = HashMap<u32, (usize, bool, Option<Reason>)>;

/// The [`Tally`] of `frames`, and the codes of their GOAWAY frames.
fn tally(frames: &[(Head, Bytes)]) -> (Tally, Vec<Reason>) {
    let mut streams = Tally::new();
    let mut goaways = Vec::new();
    for (h, p) in frames {
        let code = |at: usize| Reason(u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]));
        match h.kind {
            kind::DATA => {
                let e = streams.entry(h.stream).or_default();
                e.0 += p.len();
                e.1 |= h.has(flag::END_STREAM);
            }
            kind::RST_STREAM => streams.entry(h.stream).or_default().2 = Some(code(0)),
            kind::GOAWAY => goaways.push(code(4)),
            _ => {}
        }
    }
    (streams, goaways)
}

/// After the client's EOF (its write side shut, as a half-closed client's) no WINDOW_UPDATE
/// can come: a response waiting for window is reset (CANCEL) at once and its body dropped,
/// not held until `send_timeout` (an hour here), while a response with window still goes
/// out whole; one that runs out of window after the EOF is reset when it does, and one whose
/// window is used up but has nothing more to send still ends (an empty DATA needs none).
/// The client is told GOAWAY(NO_ERROR), and the connection ends when the last stream does.
#[tokio::test]
async fn at_the_clients_eof_streams_without_window_are_reset_and_the_rest_finish() {
    use tokio::io::AsyncWriteExt;
    use tokio::sync::oneshot::{channel, error::TryRecvError};
    const WINDOW: usize = 100;
    let mut gates = Vec::new();
    let mut dropped = Vec::new();
    let mut body = |first: usize, then: Option<usize>| {
        let (gate_tx, gate) = channel();
        let (dropped_tx, dropped_rx) = channel();
        gates.push(gate_tx);
        dropped.push(dropped_rx);
        AfterGate {
            first: Some(Bytes::from(vec![b'x'; first])),
            gate: Some(gate),
            then: then.map(|n| Bytes::from(vec![b'y'; n])),
            _dropped: dropped_tx,
        }
    };
    // Streams 1 and 3: 1,000 bytes at once, blocked after the window's 100. Stream 5: its
    // window opened wide, 50 bytes, then 500 after the EOF. Stream 7: the window's 100, then
    // 10 more after the EOF. Stream 9: the window's 100, then its end after the EOF.
    let eof_resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = || eof_resets.load(std::sync::atomic::Ordering::Relaxed);
    let service = Bodies(
        VecDeque::from([
            body(1_000, None),
            body(1_000, None),
            body(50, Some(500)),
            body(WINDOW, Some(10)),
            body(WINDOW, None),
        ]),
        eof_resets.clone(),
    );
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let (tx, stop) = tokio::sync::watch::channel(false);
    std::mem::forget(tx);
    let mut cfg = settings();
    cfg.send_timeout = Duration::from_secs(3600);
    let mut d = Driver::new(server, service, cfg, stop);
    let mut input = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut input, &[(setting::INITIAL_WINDOW_SIZE, WINDOW as u32)]);
    frame::put_settings_ack(&mut input);
    for id in [1, 3, 5, 7, 9] {
        input.extend_from_slice(&request(id, true));
    }
    frame::put_window_update(&mut input, 5, 10_000);
    c.write_all(&input).await.unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..4 {
        assert!(d.poll(&mut cx).is_pending());
    }
    let (before, goaways) = tally(&frames_of(read_available(&mut c)));
    assert!(goaways.is_empty());
    for (id, sent) in [(1, WINDOW), (3, WINDOW), (5, 50), (7, WINDOW), (9, WINDOW)] {
        assert_eq!(before.get(&id), Some(&(sent, false, None)), "stream {id}");
    }
    let conn_window = d.conn_send_window;
    for id in [1, 3] {
        assert!(d.streams[&id].waits_for_window(conn_window), "stream {id}");
    }
    assert_eq!(counted(), 0, "nothing is reset before the EOF");
    for (id, rx) in dropped.iter_mut().enumerate() {
        assert!(
            matches!(rx.try_recv(), Err(TryRecvError::Empty)),
            "body {id}"
        );
    }

    // The client's EOF: streams 1 and 3 go at once, with their bodies.
    c.shutdown().await.expect("the client shuts its side");
    assert!(
        d.poll(&mut cx).is_pending(),
        "streams 5, 7 and 9 wait for their bodies"
    );
    for k in [0, 1] {
        assert!(
            matches!(dropped[k].try_recv(), Err(TryRecvError::Closed)),
            "the blocked body {k} is dropped at the EOF"
        );
    }
    let mut open: Vec<u32> = d.streams.keys().copied().collect();
    open.sort();
    assert_eq!(open, [5, 7, 9]);
    let (at_eof, goaways) = tally(&frames_of(read_available(&mut c)));
    assert_eq!(at_eof.get(&1), Some(&(0, false, Some(Reason::CANCEL))));
    assert_eq!(at_eof.get(&3), Some(&(0, false, Some(Reason::CANCEL))));
    assert_eq!(goaways, [Reason::NO_ERROR]);
    assert_eq!(
        counted(),
        2,
        "the service is told of each stream reset at the EOF"
    );

    // The bodies go on: 5 has window for its 500 bytes, 7 has none for its 10, 9 ends.
    for g in gates.drain(..) {
        let _ = g.send(());
    }
    let mut ended = false;
    for _ in 0..8 {
        if let Poll::Ready(r) = d.poll(&mut cx) {
            r.expect("a clean end");
            ended = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(ended, "the connection ends with its last stream");
    let (after, goaways) = tally(&frames_of(read_available(&mut c)));
    assert_eq!(after.get(&5), Some(&(500, true, None)), "stream 5 finishes");
    assert_eq!(after.get(&7), Some(&(0, false, Some(Reason::CANCEL))));
    assert_eq!(after.get(&9), Some(&(0, true, None)), "stream 9 ends");
    assert!(goaways.is_empty(), "one GOAWAY");
    assert_eq!(counted(), 3, "and of stream 7, out of window after the EOF");
    for (k, rx) in dropped.iter_mut().enumerate() {
        assert!(
            matches!(rx.try_recv(), Err(TryRecvError::Closed)),
            "body {k}"
        );
    }
}

/// The same EOF over TLS: the client's close_notify (tokio-rustls' shutdown, which then shuts
/// the transport's write side) reads as EOF, and the server can still write. Stream 1 waits
/// for window after the first 100 bytes of its 100,000; at the close_notify it is reset with
/// CANCEL, GOAWAY(NO_ERROR) follows and the server closes its side too, where before the
/// connection stayed open for `send_timeout` (an hour here; the read is bounded at 10 s).
#[tokio::test]
async fn a_tls_close_notify_resets_the_streams_without_window() {
    use tokio::io::AsyncWriteExt;
    let (server_cfg, client_cfg) = tls_configs();
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (tx, stop) = tokio::sync::watch::channel(false);
    let mut cfg = settings();
    cfg.send_timeout = Duration::from_secs(3600);
    let log = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(async move {
        let _tx = tx;
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg))
            .accept(server_io)
            .await
            .unwrap();
        serve(tls, Sized(100_000, log), cfg, stop).await
    });
    let name = rustls::pki_types::ServerName::try_from("h2.test").unwrap();
    let mut c = tokio_rustls::TlsConnector::from(client_cfg)
        .connect(name, client_io)
        .await
        .unwrap();
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 100)]);
    frame::put_settings_ack(&mut out);
    out.extend_from_slice(&request(1, true));
    c.write_all(&out).await.unwrap();
    c.flush().await.unwrap();
    // Everything the server writes until it closes; the close_notify once stream 1 got its
    // window's 100 bytes.
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut shut = false;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            while let Some(f) = take_frame(&mut buf) {
                frames.push(f);
            }
            let got: usize = frames
                .iter()
                .filter(|(h, _)| h.stream == 1 && h.kind == kind::DATA)
                .map(|(_, p)| p.len())
                .sum();
            if got == 100 && !shut {
                c.shutdown().await.expect("close_notify sent");
                shut = true;
            }
            if c.read_buf(&mut buf).await.unwrap() == 0 {
                return;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server closed the connection");
    assert!(shut, "stream 1 got its window's 100 bytes first");
    let (streams, goaways) = tally(&frames);
    assert_eq!(streams.get(&1), Some(&(100, false, Some(Reason::CANCEL))));
    assert_eq!(goaways, [Reason::NO_ERROR]);
    let ended = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
}

/// [`NotFound`], keeping the head of every request it is given.
struct Keeping(Arc<Mutex<Vec<http::request::Parts>>>);

impl H2Service for Keeping {
    type Head = crate::NoHead;
    type Future = std::future::Ready<(Response<Body>, Option<crate::NoHead>)>;

    fn call(&mut self, request: Request<Body>, now: Instant) -> Self::Future {
        let (parts, body) = request.into_parts();
        self.0.lock().unwrap().push(parts.clone());
        NotFound.call(Request::from_parts(parts, body), now)
    }

    fn limit_hit(&self, _what: &'static str) {}

    fn connection_error(&self, _reason: Reason, _why: &'static str) {}
}

/// Request heads handed out again for a block that repeats the one before
/// (`Decoder::repeat`) are the requests the block decodes to. A client sends its first
/// request with literals that it indexes, then the same request as indexed fields (as
/// h2load and browsers do), broken by another path, a malformed request sent three times
/// (refused each time), and one refused after its head was built (a `content-length` with
/// END_STREAM, three times): each stream is answered or refused as its fields say, every
/// request reaches the service with the fields it was sent, and most share the kept head's
/// values (the same octets in memory: cloned, not decoded).
#[tokio::test]
async fn repeated_request_heads_are_the_requests_decoded() {
    use tokio::io::AsyncWriteExt;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let driver = tokio::spawn(serve(server, Keeping(log.clone()), settings(), stop));
    let lit = |b: &mut Vec<u8>, first: u8, name: &str, value: &str| {
        b.push(first);
        if first & 0x3f == 0 {
            b.push(name.len() as u8);
            b.extend_from_slice(name.as_bytes());
        }
        b.push(value.len() as u8);
        b.extend_from_slice(value.as_bytes());
    };
    // GET https, then :authority, user-agent, accept and x-trace into the table (62: x-trace,
    // 63: accept, 64: user-agent, 65: :authority).
    let mut first = vec![0x82, 0x87, 0x84];
    lit(&mut first, 0x40 | 1, "", "a.test");
    lit(&mut first, 0x40 | 58, "", "h2load nghttp2/1.52.0");
    lit(&mut first, 0x40 | 19, "", "*/*");
    lit(&mut first, 0x40, "x-trace", "abc");
    let again = vec![0x82, 0x87, 0x84, 0x80 | 65, 0x80 | 64, 0x80 | 63, 0x80 | 62];
    let mut other = vec![0x82, 0x87];
    lit(&mut other, 0x04, "", "/other");
    other.extend_from_slice(&again[3..]);
    let mut upper = again.clone();
    lit(&mut upper, 0x00, "X-Up", "1");
    let mut length = again.clone();
    lit(&mut length, 28, "", "5");
    let plan: Vec<(&[u8], Option<&str>)> = std::iter::once((&first[..], Some("/")))
        .chain(std::iter::repeat_n((&again[..], Some("/")), 30))
        .chain([(&other[..], Some("/other"))])
        .chain(std::iter::repeat_n((&again[..], Some("/")), 10))
        .chain(std::iter::repeat_n((&upper[..], None), 3))
        .chain(std::iter::repeat_n((&again[..], Some("/")), 5))
        .chain(std::iter::repeat_n((&length[..], None), 3))
        .chain(std::iter::repeat_n((&again[..], Some("/")), 5))
        .collect();
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    frame::put_settings(&mut out, &[]);
    for (k, (block, _)) in plan.iter().enumerate() {
        frame::put_headers(&mut out, 2 * k as u32 + 1, block, true, 16_384);
    }
    c.write_all(&out).await.unwrap();
    // Each stream's end: its answer's last DATA frame, or our RST_STREAM.
    let mut buf = BytesMut::new();
    let mut ends = std::collections::HashMap::new();
    while ends.len() < plan.len() {
        let (h, p) = read_frame(&mut c, &mut buf).await.expect("a frame");
        if h.kind == kind::DATA && h.has(flag::END_STREAM) {
            ends.insert(h.stream, None);
        } else if h.kind == kind::RST_STREAM {
            ends.insert(
                h.stream,
                Some(Reason(u32::from_be_bytes(p[..4].try_into().unwrap()))),
            );
        }
        assert_ne!(h.kind, kind::GOAWAY);
    }
    drop(c);
    let _ = driver.await;
    let log = log.lock().unwrap();
    let mut answered = log.iter();
    for (k, (_, path)) in plan.iter().enumerate() {
        let id = 2 * k as u32 + 1;
        match path {
            Some(path) => {
                assert_eq!(ends[&id], None, "stream {id}");
                let p = answered.next().expect("a request");
                assert_eq!(p.method, Method::GET);
                assert_eq!(
                    p.uri,
                    format!("https://a.test{path}").as_str(),
                    "stream {id}"
                );
                assert_eq!(p.version, Version::HTTP_2);
                let fields: Vec<(&str, &[u8])> = p
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes()))
                    .collect();
                let want: Vec<(&str, &[u8])> = vec![
                    ("user-agent", b"h2load nghttp2/1.52.0"),
                    ("accept", b"*/*"),
                    ("x-trace", b"abc"),
                ];
                assert_eq!(fields, want, "stream {id}");
                assert!(p.extensions.is_empty());
            }
            None => assert_eq!(ends[&id], Some(Reason::PROTOCOL_ERROR), "stream {id}"),
        }
    }
    assert!(answered.next().is_none());
    // The values of the requests that came from the kept head are the kept head's octets.
    let places: std::collections::HashSet<*const u8> = log
        .iter()
        .map(|p| p.headers["user-agent"].as_bytes().as_ptr())
        .collect();
    assert!(
        places.len() < log.len() / 4,
        "{} of {} requests decoded",
        places.len(),
        log.len()
    );
}

/// A pipe that counts the writes that took bytes (each a system call on a socket).
struct Writes {
    inner: tokio::io::DuplexStream,
    writes: Arc<AtomicUsize>,
}

impl AsyncRead for Writes {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Writes {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let w = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(w, Poll::Ready(Ok(n)) if n > 0) {
            eprintln!("DBG write {:?} {:?}", w, frame_kinds(BytesMut::from(buf)));
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        w
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A driver polled by hand over a [`Writes`] pipe, with three requests (streams 1, 3, 5)
/// waiting on gates, once its opening frames are in the pipe and read out, and a poll with
/// nothing to do made after that; the client end, the gates and the write count.
async fn hand_gated_three() -> (
    Driver<Writes, Scripted>,
    tokio::io::DuplexStream,
    VecDeque<tokio::sync::oneshot::Sender<()>>,
    Arc<AtomicUsize>,
) {
    use tokio::io::AsyncWriteExt;
    let mut gates = VecDeque::new();
    let mut scripts = VecDeque::new();
    for _ in 0..3 {
        let (tx, gate) = tokio::sync::oneshot::channel();
        let (dropped, _) = tokio::sync::oneshot::channel();
        gates.push_back(tx);
        scripts.push_back(Script::Gate(gate, dropped));
    }
    let (mut c, server) = tokio::io::duplex(1 << 16);
    let writes = Arc::new(AtomicUsize::new(0));
    let io = Writes {
        inner: server,
        writes: writes.clone(),
    };
    let (tx, stop) = tokio::sync::watch::channel(false);
    std::mem::forget(tx);
    let mut d = Driver::new(io, Scripted(scripts), settings(), stop);
    let mut input = hello();
    for id in [1, 3, 5] {
        input.extend_from_slice(&request(id, true));
    }
    c.write_all(&input)
        .await
        .expect("the pipe takes the requests");
    let mut cx = Context::from_waker(Waker::noop());
    let mut acked = false;
    for _ in 0..10 {
        assert!(d.poll(&mut cx).is_pending());
        acked |= pipe_frames(&mut c)
            .iter()
            .any(|(h, _)| h.kind == kind::SETTINGS && h.has(flag::ACK));
        if acked && d.streams.len() == 3 {
            break;
        }
    }
    assert!(acked && d.streams.len() == 3, "the opening is done");
    assert!(d.poll(&mut cx).is_pending());
    assert!(pipe_frames(&mut c).is_empty(), "nothing more to write");
    (d, c, gates, writes)
}

/// The whole frames in the pipe now (read without waiting).
fn pipe_frames(c: &mut tokio::io::DuplexStream) -> Vec<(Head, Bytes)> {
    use tokio::io::AsyncRead;
    let mut cx = Context::from_waker(Waker::noop());
    let mut b = vec![0u8; 1 << 16];
    let mut rb = tokio::io::ReadBuf::new(&mut b);
    let _ = Pin::new(c).poll_read(&mut cx, &mut rb);
    frames_of(BytesMut::from(rb.filled()))
}

/// The streams whose responses end in `frames`.
fn ended(frames: &[(Head, Bytes)]) -> Vec<u32> {
    frames
        .iter()
        .filter(|(h, _)| h.kind == kind::DATA && h.has(flag::END_STREAM))
        .map(|(h, _)| h.stream)
        .collect()
}

/// Answers made ready by another task (an HTTP/2 backend connection's task, which reads the
/// backend's responses for many client connections) wait for the connection's next poll while
/// other streams are still being answered: that poll comes after the runtime's next look at
/// the I/O driver (tokio's `yield_now`), when that task has read and answered more, and one
/// write carries them all. Here stream 1's answer, made ready by a task, is held by the poll
/// that takes it, and goes out with stream 3's (also a task's) in one write at the next poll;
/// stream 5's, made ready outside any task, is written at once. Before, each was written in
/// the poll that took it (checked: the pipe held stream 1's answer after the first poll).
#[tokio::test]
async fn answers_from_another_task_wait_for_the_next_poll_and_share_its_write() {
    let (mut d, mut c, mut gates, writes) = hand_gated_three().await;
    let mut cx = Context::from_waker(Waker::noop());
    let before = writes.load(Ordering::SeqCst);
    let gate1 = gates.pop_front().expect("three gates");
    tokio::spawn(async move { gate1.send(()) })
        .await
        .expect("the task ran")
        .expect("stream 1 waits");
    assert!(d.poll(&mut cx).is_pending());
    assert!(pipe_frames(&mut c).is_empty(), "stream 1's answer waits");
    assert!(d.output_len() > 0 && !d.streams.contains_key(&1));
    let gate3 = gates.pop_front().expect("three gates");
    tokio::spawn(async move { gate3.send(()) })
        .await
        .expect("the task ran")
        .expect("stream 3 waits");
    assert!(d.poll(&mut cx).is_pending());
    assert_eq!(ended(&pipe_frames(&mut c)), [1, 3]);
    assert_eq!(writes.load(Ordering::SeqCst) - before, 1, "one write");
    let _ = gates.pop_front().expect("three gates").send(());
    assert!(d.poll(&mut cx).is_pending());
    assert_eq!(ended(&pipe_frames(&mut c)), [5]);
    assert_eq!(writes.load(Ordering::SeqCst) - before, 2);
}

/// An answer made ready outside any task (the I/O driver's or the timer's wake-ups, which come
/// between task polls: a backend socket polled by the stream's own future) is written in the
/// poll that takes it, with other streams still waiting: holding it would add a turn of the
/// runtime (with the runtime idle, an epoll_wait) and gather nothing, the wake-ups of that
/// turn having come already. With every answer held for the next poll, stream 1's waited
/// (checked).
#[tokio::test]
async fn answers_made_ready_outside_a_task_are_written_in_the_poll_that_takes_them() {
    let (mut d, mut c, mut gates, _writes) = hand_gated_three().await;
    let mut cx = Context::from_waker(Waker::noop());
    let _ = gates.pop_front().expect("three gates").send(());
    assert!(d.poll(&mut cx).is_pending());
    assert_eq!(ended(&pipe_frames(&mut c)), [1]);
    assert!(d.streams.contains_key(&3), "stream 3 still waits");
}
