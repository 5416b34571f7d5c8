//! A QUIC client that acknowledges almost nothing cannot make an HTTP/3 connection keep state
//! without bound (review-quinn2 N1, upstream quinn-proto 0.11.19; vendor/README.md).
//!
//! The server is a quinn-proto endpoint with the transport settings of Sweety's HTTP/3
//! listeners (`listen::quic::server_config`, default `http3` and `limits`) serving a download
//! that never ends; the client is quinn-proto too, both driven by hand on a virtual clock, the
//! datagrams handed over in memory. After the handshake the client keeps sending PINGs (each
//! two make the server send an ACK-only packet; its small receive windows keep the download
//! waiting on flow control, so quinn is free to send them) and, once a round, the harness
//! hands it only the server's OLDEST few ACK-only packets, which it acknowledges: the server's
//! largest acknowledged packet stays at the front, so nothing after it is ever declared lost,
//! and each acknowledgement resets the server's PTO backoff. Then the clock moves to the
//! server's next ACK-eliciting packet (its PTO probe, 26 ms later). Upstream forgets only the
//! ACK-only packets after the latest ACK-eliciting one (at most 1,001): every earlier run
//! stays, ~490 packets (~96 KB) a round, for as long as the client keeps sending. The vendored
//! quinn-proto closes such a connection (PROTOCOL_VIOLATION) once it keeps more packets than
//! its windows explain.
//!
//! What the server holds is counted by a global allocator (its own test binary): the bytes
//! allocated, and not yet freed, in the server's calls.

mod common;

use bytes::BytesMut;
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint,
    EndpointConfig, Event, StreamEvent, StreamId, TransportConfig, TransportErrorCode,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Forwards to the system allocator; counts the bytes allocated and freed on this thread
/// while [`SERVER`] is set (the server's calls, see [`srv`]).
struct Counting;

thread_local! {
    // Const-initialized, no destructor: touching them never allocates.
    static SERVER: Cell<bool> = const { Cell::new(false) };
    static SERVER_LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: the slots may be gone while a thread exits (then it is no server call).
    if SERVER.try_with(Cell::get).unwrap_or(false) {
        let _ = SERVER_LIVE.try_with(|n| n.set(n.get() + delta));
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter update has no effect on the memory returned.
#[allow(unsafe_code)] // a global allocator is an `unsafe impl`; the proof is above
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: same contract as the caller's (non-zero-size layout).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: `ptr` came from `System` with `layout`; `new_size` is the caller's, valid.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` as the server: what it allocates and frees is the server's.
fn srv<R>(f: impl FnOnce() -> R) -> R {
    SERVER.with(|s| s.set(true));
    let r = f();
    SERVER.with(|s| s.set(false));
    r
}

/// Bytes the server holds (allocated in its calls, not yet freed).
fn server_live() -> isize {
    SERVER_LIVE.with(Cell::get)
}

/// Addresses only: datagrams are handed over in memory, no socket is bound.
const SERVER_ADDR: &str = "127.0.0.1:20400";
const CLIENT_ADDR: &str = "127.0.0.1:20401";
/// Room for any datagram either side writes (quinn's largest UDP payload).
const BUF: usize = 65_536;
/// The download's writes.
static CHUNK: [u8; 16 * 1024] = [0x5a; 16 * 1024];

/// The server side: endpoint, its one connection, the download stream, how it ended.
struct Server {
    endpoint: Endpoint,
    conn: Option<(ConnectionHandle, Connection)>,
    download: Option<StreamId>,
    /// Bytes the download may still write: a little while the client behaves, then no end.
    to_write: usize,
    lost: Option<ConnectionError>,
    drained: bool,
}

/// A server datagram not handed to the client: whether it was an ACK-only packet, its bytes.
type Held = (bool, Vec<u8>);

struct Harness {
    now: Instant,
    server: Server,
    client_ep: Endpoint,
    client: (ConnectionHandle, Connection),
    /// The client's request stream, once opened.
    request: Option<StreamId>,
    to_server: VecDeque<Vec<u8>>,
    to_client: VecDeque<Vec<u8>>,
    /// Attack mode: server datagrams are held here instead of going to `to_client`.
    held: Option<VecDeque<Held>>,
    buf: Vec<u8>,
    /// Server datagrams sent so far, and how many of them were ACK-only.
    sent: u64,
    sent_ack_only: u64,
}

/// The sum of the server's frame counters but ACK: unchanged by a datagram iff it carried
/// only ACK (and PADDING) frames.
fn non_ack_frames(c: &Connection) -> u64 {
    let f = c.stats().frame_tx;
    f.ack_frequency
        + f.crypto
        + f.connection_close
        + f.data_blocked
        + f.datagram
        + u64::from(f.handshake_done)
        + f.immediate_ack
        + f.max_data
        + f.max_stream_data
        + f.max_streams_bidi
        + f.max_streams_uni
        + f.new_connection_id
        + f.new_token
        + f.path_challenge
        + f.path_response
        + f.ping
        + f.reset_stream
        + f.retire_connection_id
        + f.stream_data_blocked
        + f.streams_blocked_bidi
        + f.streams_blocked_uni
        + f.stop_sending
        + f.stream
}

impl Harness {
    /// A connected client and server, the request sent, the download under way.
    fn connected() -> Harness {
        let (server_tls, client_tls) = common::quic::tls();
        let h3 = sweety_config::Http3::default();
        let limits = sweety_config::Limits::default();
        let server_cfg =
            sweety_dataplane::listen::quic::server_config(server_tls, &h3, &limits, "test")
                .unwrap();
        let endpoint = srv(|| {
            Endpoint::new(
                Arc::new(EndpointConfig::default()),
                Some(Arc::new(server_cfg)),
                false,
                Some([7; 32]),
            )
        });

        // The client: small receive windows (the server's download waits on its flow control,
        // not on congestion control: quinn sends no ACK-only packet while congestion control
        // holds back data it has to send), no idle timeout of its own, and a congestion window
        // its PINGs never fill.
        let mut transport = TransportConfig::default();
        transport
            .max_idle_timeout(None)
            .stream_receive_window(quinn_proto::VarInt::from_u32(8 * 1024))
            .receive_window(quinn_proto::VarInt::from_u32(16 * 1024));
        let mut cc = quinn_proto::congestion::NewRenoConfig::default();
        cc.initial_window(1 << 40);
        transport.congestion_controller_factory(Arc::new(cc));
        let mut client_cfg =
            ClientConfig::new(Arc::new(QuicClientConfig::try_from(client_tls).unwrap()));
        client_cfg.transport_config(Arc::new(transport));
        let mut client_ep = Endpoint::new(
            Arc::new(EndpointConfig::default()),
            None,
            false,
            Some([9; 32]),
        );
        let now = Instant::now();
        let client = client_ep
            .connect(now, client_cfg, SERVER_ADDR.parse().unwrap(), "localhost")
            .unwrap();
        let mut h = Harness {
            now,
            server: Server {
                endpoint,
                conn: None,
                download: None,
                to_write: 256 * 1024,
                lost: None,
                drained: false,
            },
            client_ep,
            client,
            request: None,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            held: None,
            buf: Vec::with_capacity(BUF),
            sent: 0,
            sent_ack_only: 0,
        };
        // Handshake and request, every datagram delivered (bounded in steps).
        for _ in 0..50 {
            h.pump();
            if h.server.download.is_some() {
                break;
            }
            if h.server.conn.is_some() && h.request.is_none() {
                let conn = &mut h.client.1;
                if let Some(id) = conn.streams().open(Dir::Bi) {
                    conn.send_stream(id)
                        .write(b"GET /large HTTP/3\r\n")
                        .unwrap();
                    conn.send_stream(id).finish().unwrap();
                    h.request = Some(id);
                    continue;
                }
            }
            h.advance_once();
        }
        assert!(h.server.download.is_some(), "the download started");
        // A little of it delivered as a well-behaved client would: timers up to 100 ms ahead
        // fire (acknowledgement delays, probes), not the idle timeout.
        for _ in 0..200 {
            if h.next_timer() > h.now + Duration::from_millis(100) {
                break;
            }
            h.advance_once();
        }
        h
    }

    /// Moves both sides' datagrams until neither has anything to send (bounded).
    fn pump(&mut self) {
        for _ in 0..100_000 {
            self.flush_client();
            let mut moved = false;
            while let Some(d) = self.to_server.pop_front() {
                self.server_recv(&d);
                moved = true;
            }
            self.flush_server();
            while let Some(d) = self.to_client.pop_front() {
                self.client_recv(&d);
                moved = true;
            }
            if !moved && self.to_server.is_empty() {
                return;
            }
        }
        panic!("datagrams still moving after 100,000 exchanges");
    }

    /// The earlier side's next timer.
    fn next_timer(&mut self) -> Instant {
        let client = self.client.1.poll_timeout();
        let server = self
            .server
            .conn
            .as_mut()
            .and_then(|(_, c)| srv(|| c.poll_timeout()));
        match (client, server) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or_else(|| {
                panic!(
                    "no timer armed: server {:?} lost {:?}, client closed {}",
                    self.server.conn.is_some(),
                    self.server.lost,
                    self.client.1.is_closed()
                )
            }),
        }
    }

    /// The clock to the earlier side's next timer, which then fires; datagrams moved.
    fn advance_once(&mut self) {
        let next = self.next_timer();
        self.now = self.now.max(next);
        let now = self.now;
        self.client.1.handle_timeout(now);
        if let Some((_, c)) = self.server.conn.as_mut() {
            srv(|| c.handle_timeout(now));
        }
        self.pump();
    }

    fn client_recv(&mut self, d: &[u8]) {
        let now = self.now;
        let data = BytesMut::from(d);
        let from = SERVER_ADDR.parse().unwrap();
        if let Some(DatagramEvent::ConnectionEvent(_, ev)) =
            self.client_ep
                .handle(now, from, None, None, data, &mut self.buf)
        {
            self.client.1.handle_event(ev);
        }
        self.buf.clear();
    }

    fn flush_client(&mut self) {
        let now = self.now;
        let (ch, conn) = &mut self.client;
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(ev) = self.client_ep.handle_event(*ch, ev) {
                conn.handle_event(ev);
            }
        }
        while let Some(ev) = conn.poll() {
            if let Event::Stream(StreamEvent::Readable { id }) = ev {
                // The well-behaved part reads what arrives (the attack hands over no data).
                let mut recv = conn.recv_stream(id);
                if let Ok(mut chunks) = recv.read(true) {
                    while let Ok(Some(_)) = chunks.next(usize::MAX) {}
                    let _ = chunks.finalize();
                };
            }
        }
        while let Some(t) = conn.poll_transmit(now, 1, &mut self.buf) {
            self.to_server.push_back(self.buf[..t.size].to_vec());
            self.buf.clear();
        }
    }

    fn server_recv(&mut self, d: &[u8]) {
        let now = self.now;
        let from: SocketAddr = CLIENT_ADDR.parse().unwrap();
        let s = &mut self.server;
        let buf = &mut self.buf;
        srv(|| {
            let data = BytesMut::from(d);
            match s.endpoint.handle(now, from, None, None, data, buf) {
                Some(DatagramEvent::NewConnection(incoming)) => {
                    buf.clear();
                    let (ch, conn) = s.endpoint.accept(incoming, now, buf, None).unwrap();
                    s.conn = Some((ch, conn));
                }
                Some(DatagramEvent::ConnectionEvent(_, ev)) => {
                    if let Some((_, c)) = s.conn.as_mut() {
                        c.handle_event(ev);
                    }
                }
                Some(DatagramEvent::Response(_)) | None => {}
            }
        });
        self.buf.clear();
    }

    fn flush_server(&mut self) {
        let now = self.now;
        let s = &mut self.server;
        let Some((ch, conn)) = s.conn.as_mut() else {
            return;
        };
        srv(|| {
            while let Some(ev) = conn.poll_endpoint_events() {
                if ev.is_drained() {
                    s.drained = true;
                }
                if let Some(ev) = s.endpoint.handle_event(*ch, ev) {
                    conn.handle_event(ev);
                }
            }
            while let Some(ev) = conn.poll() {
                match ev {
                    Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) => {
                        s.download = conn.streams().accept(Dir::Bi);
                    }
                    Event::ConnectionLost { reason } => s.lost = Some(reason),
                    _ => {}
                }
            }
            // The download: as much as the send window takes, up to `to_write`.
            if let Some(id) = s.download {
                while s.to_write > 0 {
                    let chunk = &CHUNK[..CHUNK.len().min(s.to_write)];
                    match conn.send_stream(id).write(chunk) {
                        Ok(n) if n > 0 => s.to_write -= n,
                        _ => break,
                    }
                }
            }
        });
        loop {
            let before = non_ack_frames(conn);
            let t = srv(|| conn.poll_transmit(now, 1, &mut self.buf));
            let Some(t) = t else { break };
            let ack_only = non_ack_frames(conn) == before;
            self.sent += 1;
            self.sent_ack_only += u64::from(ack_only);
            let d = self.buf[..t.size].to_vec();
            self.buf.clear();
            match self.held.as_mut() {
                Some(held) => held.push_back((ack_only, d)),
                None => self.to_client.push_back(d),
            }
        }
        if s.drained {
            // The endpoint forgot it; what it held goes with it.
            let conn = s.conn.take();
            srv(|| drop(conn));
        }
    }

    /// One round of the attack: `pings` client PINGs (each two draw an ACK-only packet), the
    /// server's [`HANDED`] oldest held ACK-only packets handed to the client (the
    /// ACK-eliciting ones before them are dropped: never acknowledged), the clock to the
    /// server's next ACK-eliciting packet (its PTO probe). Returns the virtual time it took.
    fn attack_round(&mut self, pings: usize) -> Duration {
        let start = self.now;
        for _ in 0..pings {
            self.client.1.ping();
            self.pump();
        }
        let held = self.held.as_mut().expect("attack mode");
        let mut handed = 0;
        while let Some((ack_only, d)) = held.pop_front() {
            if ack_only {
                self.to_client.push_back(d);
                handed += 1;
                if handed == HANDED {
                    break;
                }
            }
        }
        let ack_eliciting = |h: &Harness| h.sent - h.sent_ack_only;
        let before = ack_eliciting(self);
        for _ in 0..64 {
            if self.server.conn.is_none() || ack_eliciting(self) > before {
                break;
            }
            self.advance_once();
        }
        self.now - start
    }
}

/// The server's oldest ACK-only packets handed to the client per round: quinn's client
/// acknowledges at once after more than 10 packets that did not ask for it.
const HANDED: usize = 12;

/// Client PINGs per round: 500 ACK-only packets from the server, below upstream's 1,001-packet
/// tail (which would forget the excess) so that every one of them is kept.
const PINGS: usize = 1_000;

/// The most packets the server keeps for one connection with Sweety's default windows (the
/// vendored quinn-proto's `max_sent_packets`): 1,001 + (512 KiB + 1 MiB) / 64.
fn limit() -> u64 {
    let h3 = sweety_config::Http3::default();
    1_001 + (u64::from(h3.send_window) + u64::from(h3.connection_receive_window)) / 64
}

/// What the server may hold above its state at the start of the attack: [`limit`] packets at
/// 256 bytes each (one costs ~200 in the B-tree of sent packets, measured with this test).
fn bound() -> isize {
    (limit() * 256) as isize
}

/// Rounds played at most. Measured: the server keeps ~490 more packets (~96 KB) a round and
/// closes the connection in round 58; without the limit it passes [`bound`] in round 74.
const ROUNDS: usize = 90;

#[test]
fn a_client_acknowledging_only_our_oldest_packets_is_closed_at_a_bound() {
    let mut h = Harness::connected();
    h.held = Some(VecDeque::new());
    h.server.to_write = usize::MAX;
    let base = server_live();
    eprintln!(
        "server holds {base} bytes at the start; limit {} packets, bound +{} bytes",
        limit(),
        bound()
    );
    for round in 1..=ROUNDS {
        let took = h.attack_round(PINGS);
        let grown = server_live() - base;
        let stats = h.server.conn.as_ref().map(|(_, c)| c.stats());
        eprintln!(
            "round {round}: +{grown} bytes, {} ACK-only of {} datagrams sent, {} ACK frames \
             received, {} packets lost, round took {took:?}",
            h.sent_ack_only,
            h.sent,
            stats.map_or(0, |s| s.frame_rx.acks),
            stats.map_or(0, |s| s.path.lost_packets),
        );
        assert!(
            grown <= bound(),
            "round {round}: the server holds {grown} bytes more than at the start, over \
             the bound {}: its state grows with the client's PINGs",
            bound()
        );
        if h.server.lost.is_some() {
            break;
        }
    }
    match &h.server.lost {
        Some(ConnectionError::TransportError(e))
            if e.code == TransportErrorCode::PROTOCOL_VIOLATION => {}
        other => panic!("the server closed the connection with PROTOCOL_VIOLATION: {other:?}"),
    }
    // The close timer (3 PTOs) drains the connection; the endpoint forgets it and what it held
    // is freed.
    for _ in 0..64 {
        if h.server.conn.is_none() {
            break;
        }
        h.advance_once();
    }
    assert!(h.server.conn.is_none(), "the closed connection drained");
    assert!(
        server_live() <= base,
        "the server holds {} bytes after the connection went, {base} before the attack",
        server_live()
    );
}
