//! One hand-written HTTP/2 client for the tests that need the frames themselves (protocol
//! corners, abuse limits): frames and HPACK blocks written by hand, the server's frames read
//! with its response header blocks decoded by the crate's own HPACK decoder. `h2_limits` uses
//! [`Reader`] and [`open`] directly; `h2` the [`Raw`] wrapper, which speaks in the crate's
//! frame [`Head`]s.

use bytes::Bytes;
use std::net::SocketAddr;
use std::time::Duration;
use sweety_dataplane::hpack::Decoder;
use sweety_h2::frame::Head;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PRIORITY: u8 = 0x2;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY_FLAG: u8 = 0x20;

pub(crate) const NO_ERROR: u32 = 0x0;
pub(crate) const PROTOCOL_ERROR: u32 = 0x1;
pub(crate) const FLOW_CONTROL_ERROR: u32 = 0x3;
pub(crate) const REFUSED_STREAM: u32 = 0x7;
pub(crate) const CANCEL: u32 = 0x8;
pub(crate) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// How long any one phase may take before the test gives up (a bound, not an assertion).
pub(crate) const PHASE: Duration = Duration::from_secs(20);

pub(crate) fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(ty);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK string literal without Huffman coding.
pub(crate) fn hpack_str(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, s.len(), 7, 0);
    out.extend_from_slice(s);
}

pub(crate) fn hpack_int(out: &mut Vec<u8>, mut v: usize, prefix: u8, flags: u8) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// GET `path` on http://localhost, hand-encoded: :method GET, :scheme http (static indexes),
/// :path as a literal with the static name, :authority as a literal with the static name.
pub(crate) fn request_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86];
    hpack_int(&mut b, 4, 4, 0x00);
    hpack_str(&mut b, path.as_bytes());
    hpack_int(&mut b, 1, 4, 0x00);
    hpack_str(&mut b, b"localhost");
    b
}

/// One literal field without indexing and with a literal name.
pub(crate) fn literal_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(0x00);
    hpack_str(out, name.as_bytes());
    hpack_str(out, value);
}

#[derive(Debug)]
pub(crate) struct Frame {
    pub ty: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
    /// `:status` of a HEADERS frame.
    pub status: Option<u16>,
}

impl Frame {
    pub(crate) fn error_code(&self) -> u32 {
        let at = if self.ty == GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }
}

#[derive(Debug)]
pub(crate) enum Event {
    Frame(Frame),
    /// EOF or a reset: the server closed the connection.
    Closed,
    /// Nothing within the phase bound.
    Timeout,
}

/// The read side of a raw connection: frames, with response headers decoded in order.
pub(crate) struct Reader {
    pub rd: OwnedReadHalf,
    pub hpack: Decoder,
}

impl Reader {
    pub(crate) async fn next(&mut self, deadline: Instant) -> Event {
        let mut head = [0u8; 9];
        match tokio::time::timeout_at(deadline, self.rd.read_exact(&mut head)).await {
            Err(_) => return Event::Timeout,
            Ok(Err(_)) => return Event::Closed,
            Ok(Ok(_)) => {}
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        assert!(len <= 1 << 24, "frame length {len}");
        let mut payload = vec![0u8; len];
        match tokio::time::timeout_at(deadline, self.rd.read_exact(&mut payload)).await {
            Err(_) => return Event::Timeout,
            Ok(Err(_)) => return Event::Closed,
            Ok(Ok(_)) => {}
        }
        let ty = head[3];
        let flags = head[4];
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut status = None;
        if ty == HEADERS {
            assert!(
                flags & END_HEADERS != 0,
                "the server's responses fit one HEADERS frame"
            );
            assert_eq!(flags & 0x28, 0, "no padding or priority in responses");
            self.hpack
                .decode(&payload, 1 << 20, |f| {
                    if f.name == b":status" {
                        status = std::str::from_utf8(f.value)
                            .ok()
                            .and_then(|s| s.parse().ok());
                    }
                })
                .expect("the server's header block decodes");
        }
        Event::Frame(Frame {
            ty,
            flags,
            stream,
            payload,
            status,
        })
    }

    /// Reads until `want` accepts an event (frames it rejects are skipped; the server's
    /// SETTINGS are acknowledged through `wr`). Panics on timeout.
    pub(crate) async fn until(
        &mut self,
        wr: &mut OwnedWriteHalf,
        what: &str,
        mut want: impl FnMut(&Event) -> bool,
    ) -> Event {
        let deadline = Instant::now() + PHASE;
        loop {
            let ev = self.next(deadline).await;
            if let Event::Frame(f) = &ev {
                if f.ty == SETTINGS && f.flags & ACK == 0 {
                    let _ = wr.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
                }
            }
            if want(&ev) {
                return ev;
            }
            match ev {
                Event::Timeout => panic!("timed out waiting for {what}"),
                Event::Closed => panic!("connection closed while waiting for {what}"),
                Event::Frame(_) => {}
            }
        }
    }
}

/// Opens an h2c connection: preface and an empty SETTINGS frame.
pub(crate) async fn open(addr: SocketAddr) -> (Reader, OwnedWriteHalf) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    start(tcp, &[]).await
}

/// Opens an h2c connection from the local address `from` (in 127.0.0.0/8: per-client
/// limits), with the preface and a SETTINGS frame of `settings` (id, value).
pub(crate) async fn open_from(
    from: &str,
    addr: SocketAddr,
    settings: &[(u16, u32)],
) -> (Reader, OwnedWriteHalf) {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    start(s.connect(addr).await.unwrap(), settings).await
}

async fn start(tcp: TcpStream, settings: &[(u16, u32)]) -> (Reader, OwnedWriteHalf) {
    tcp.set_nodelay(true).unwrap();
    let (rd, mut wr) = tcp.into_split();
    let mut hello = PREFACE.to_vec();
    let mut params = Vec::new();
    for (id, v) in settings {
        params.extend_from_slice(&id.to_be_bytes());
        params.extend_from_slice(&v.to_be_bytes());
    }
    hello.extend(frame(SETTINGS, 0, 0, &params));
    wr.write_all(&hello).await.unwrap();
    (
        Reader {
            rd,
            hpack: Decoder::new(),
        },
        wr,
    )
}

/// Sends GET `path` on `stream` and waits for its response status.
pub(crate) async fn request_on(
    rd: &mut Reader,
    wr: &mut OwnedWriteHalf,
    stream: u32,
    path: &str,
) -> u16 {
    wr.write_all(&frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        stream,
        &request_block(path),
    ))
    .await
    .unwrap();
    let ev = rd
        .until(wr, "a response", |e| {
            matches!(e, Event::Frame(f) if f.stream == stream && (f.ty == HEADERS || f.ty == RST_STREAM)
                || f.ty == GOAWAY)
        })
        .await;
    match ev {
        Event::Frame(f) if f.ty == HEADERS => f.status.expect(":status"),
        other => panic!("no response on stream {stream}: {other:?}"),
    }
}

/// A raw connection that reads frame by frame: the server's SETTINGS are acknowledged as
/// they come, every read is bounded by [`PHASE`].
pub(crate) struct Raw {
    rd: Reader,
    wr: OwnedWriteHalf,
}

impl Raw {
    /// Opens an h2c connection: preface and an empty SETTINGS frame.
    pub(crate) async fn connect(addr: SocketAddr) -> Raw {
        let (rd, wr) = open(addr).await;
        Raw { rd, wr }
    }

    /// Writes `b` (the server may already have closed the connection: the reads tell).
    pub(crate) async fn send(&mut self, b: &[u8]) {
        let _ = self.wr.write_all(b).await;
    }

    /// The next frame, or None at EOF (or a reset connection). Panics after [`PHASE`].
    pub(crate) async fn frame(&mut self) -> Option<(Head, Bytes)> {
        match self.rd.next(Instant::now() + PHASE).await {
            Event::Frame(f) => {
                if f.ty == SETTINGS && f.flags & ACK == 0 {
                    self.send(&frame(SETTINGS, ACK, 0, &[])).await;
                }
                let head = Head {
                    len: f.payload.len() as u32,
                    kind: f.ty,
                    flags: f.flags,
                    stream: f.stream,
                };
                Some((head, Bytes::from(f.payload)))
            }
            Event::Closed => None,
            Event::Timeout => panic!("no frame within {PHASE:?}"),
        }
    }

    /// Reads until a frame of type `ty` (None at EOF).
    pub(crate) async fn until(&mut self, ty: u8) -> Option<(Head, Bytes)> {
        while let Some((h, p)) = self.frame().await {
            if h.kind == ty {
                return Some((h, p));
            }
        }
        None
    }

    /// Closes the client's sending side (FIN): the server reads EOF.
    pub(crate) async fn shut_write(&mut self) {
        let _ = self.wr.shutdown().await;
    }

    /// Resets the connection (RST, SO_LINGER 0): the server's read fails.
    pub(crate) fn reset(self) {
        let tcp = self
            .rd
            .rd
            .reunite(self.wr)
            .expect("the two halves of one stream");
        socket2::SockRef::from(&tcp)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER");
        drop(tcp);
    }

    /// Reads until GOAWAY and returns its error code (None at EOF without one).
    pub(crate) async fn goaway(&mut self) -> Option<sweety_h2::frame::Reason> {
        let (_, p) = self.until(GOAWAY).await?;
        Some(sweety_h2::frame::Reason(u32::from_be_bytes([
            p[4], p[5], p[6], p[7],
        ])))
    }
}
