//! The vendored quinn-proto's loss detection timer, armed once per `poll_transmit` instead of
//! after every packet, and its in-flight packet count, kept instead of a walk of the sent
//! packets (vendor/README.md), under loss and reordering.
//!
//! A download from a quinn-proto server with the transport settings of Sweety's HTTP/3
//! listeners (`listen::quic::server_config`) to a quinn-proto client, both driven by hand on a
//! virtual clock (1 ms a hop), the datagrams handed over in memory: GSO batches of up to 10,
//! and in each direction a seeded share of the datagrams dropped and some swapped with the
//! next. In a debug build (how `cargo test` builds the vendored crates) every arming checks
//! that the timer ends where upstream's arming after each packet would have left it, and every
//! `has_in_flight` that the count agrees with upstream's walk; a difference panics in the
//! server's call. The test asserts that the download completes, whole and in order, and that
//! the server declared packets lost (the paths those checks guard ran).

mod common;

use bytes::BytesMut;
use quinn_proto::{
    Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, Event, StreamEvent, StreamId,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SERVER_ADDR: &str = "127.0.0.1:20700";
const CLIENT_ADDR: &str = "127.0.0.1:20701";
/// The download's length and its writes.
const TOTAL: usize = 400 * 1024;
static CHUNK: [u8; 16 * 1024] = [0xa5; 16 * 1024];
/// One hop: every datagram sent in a step arrives (or is lost) in the next.
const HOP: Duration = Duration::from_millis(1);
/// Steps at most (each bounded work); a download takes a few hundred to a few thousand.
const STEPS: usize = 200_000;

/// A small xorshift generator: the same seed, the same losses.
struct Rng(u64);

impl Rng {
    fn chance(&mut self, per_mille: u64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 1000 < per_mille
    }
}

/// The datagrams of a step on their way: some dropped, some swapped with the next.
fn deliver(rng: &mut Rng, sent: &mut Vec<Vec<u8>>, loss: u64) -> VecDeque<Vec<u8>> {
    let mut out: VecDeque<Vec<u8>> = sent.drain(..).filter(|_| !rng.chance(loss)).collect();
    for i in 1..out.len() {
        if rng.chance(100) {
            out.swap(i - 1, i);
        }
    }
    out
}

struct Download {
    now: Instant,
    server_ep: Endpoint,
    server: Option<(ConnectionHandle, Connection)>,
    stream: Option<StreamId>,
    written: usize,
    client_ep: Endpoint,
    client: (ConnectionHandle, Connection),
    request: Option<StreamId>,
    received: usize,
    finished: bool,
}

impl Download {
    fn new() -> Download {
        let (server_tls, client_tls) = common::quic::tls();
        let server_ep = common::quic::server_endpoint(server_tls);
        let now = Instant::now();
        let (client_ep, client) =
            common::quic::client(client_tls, None, SERVER_ADDR.parse().unwrap(), now);
        Download {
            now,
            server_ep,
            server: None,
            stream: None,
            written: 0,
            client_ep,
            client,
            request: None,
            received: 0,
            finished: false,
        }
    }

    fn server_recv(&mut self, d: Vec<u8>, out: &mut Vec<Vec<u8>>) {
        let from: SocketAddr = CLIENT_ADDR.parse().unwrap();
        let mut buf = Vec::new();
        match self
            .server_ep
            .handle(self.now, from, None, None, BytesMut::from(&d[..]), &mut buf)
        {
            Some(DatagramEvent::NewConnection(incoming)) => {
                buf.clear();
                let accepted = self.server_ep.accept(incoming, self.now, &mut buf, None);
                self.server = Some(accepted.unwrap());
            }
            Some(DatagramEvent::ConnectionEvent(_, ev)) => {
                if let Some((_, c)) = self.server.as_mut() {
                    c.handle_event(ev);
                }
            }
            Some(DatagramEvent::Response(t)) => out.push(buf[..t.size].to_vec()),
            None => {}
        }
    }

    fn client_recv(&mut self, d: Vec<u8>) {
        let from: SocketAddr = SERVER_ADDR.parse().unwrap();
        let mut buf = Vec::new();
        if let Some(DatagramEvent::ConnectionEvent(_, ev)) =
            self.client_ep
                .handle(self.now, from, None, None, BytesMut::from(&d[..]), &mut buf)
        {
            self.client.1.handle_event(ev);
        }
    }

    /// The server's events, the download's writes, its datagrams.
    fn server_step(&mut self, out: &mut Vec<Vec<u8>>) {
        let Some((ch, conn)) = self.server.as_mut() else {
            return;
        };
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(ev) = self.server_ep.handle_event(*ch, ev) {
                conn.handle_event(ev);
            }
        }
        while let Some(ev) = conn.poll() {
            if let Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) = ev {
                self.stream = conn.streams().accept(Dir::Bi);
            }
        }
        if let Some(id) = self.stream {
            while self.written < TOTAL {
                let chunk = &CHUNK[..CHUNK.len().min(TOTAL - self.written)];
                match conn.send_stream(id).write(chunk) {
                    Ok(n) if n > 0 => self.written += n,
                    _ => break,
                }
            }
            if self.written == TOTAL {
                let _ = conn.send_stream(id).finish();
            }
        }
        common::quic::transmit(conn, self.now, out);
    }

    /// The client's events, its request once connected, what it reads, its datagrams.
    fn client_step(&mut self, out: &mut Vec<Vec<u8>>) {
        let (ch, conn) = &mut self.client;
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(ev) = self.client_ep.handle_event(*ch, ev) {
                conn.handle_event(ev);
            }
        }
        while let Some(ev) = conn.poll() {
            if let Event::Connected = ev {
                let id = conn.streams().open(Dir::Bi).expect("a stream");
                conn.send_stream(id).write(b"GET /").unwrap();
                conn.send_stream(id).finish().unwrap();
                self.request = Some(id);
            }
        }
        if let Some(id) = self.request {
            let mut recv = conn.recv_stream(id);
            let read = recv.read(true);
            if let Ok(mut chunks) = read {
                loop {
                    match chunks.next(usize::MAX) {
                        Ok(Some(c)) => {
                            assert_eq!(c.offset, self.received as u64, "in order");
                            assert!(c.bytes.iter().all(|&b| b == 0xa5));
                            self.received += c.bytes.len();
                        }
                        Ok(None) => {
                            self.finished = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let _ = chunks.finalize();
            }
        }
        common::quic::transmit(conn, self.now, out);
    }

    /// Runs the download with `loss` per mille of the datagrams dropped each way.
    fn run(mut self, seed: u64, loss: u64) -> (Download, u64, Duration) {
        let start = self.now;
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
        let mut steps = 0;
        for _ in 0..STEPS {
            steps += 1;
            for d in deliver(&mut rng, &mut to_server, loss) {
                self.server_recv(d, &mut to_client);
            }
            for d in deliver(&mut rng, &mut to_client, loss) {
                self.client_recv(d);
            }
            self.client_step(&mut to_server);
            self.server_step(&mut to_client);
            if self.finished {
                break;
            }
            // The next hop, or the next timer if nothing is on its way.
            let mut next = self.now + HOP;
            if to_server.is_empty() && to_client.is_empty() {
                let timers = [
                    self.client.1.poll_timeout(),
                    self.server.as_mut().and_then(|(_, c)| c.poll_timeout()),
                ];
                next = timers.into_iter().flatten().min().unwrap_or(next).max(next);
            }
            self.now = next;
            self.client.1.handle_timeout(self.now);
            if let Some((_, c)) = self.server.as_mut() {
                c.handle_timeout(self.now);
            }
        }
        let took = self.now - start;
        (self, steps, took)
    }
}

#[test]
fn downloads_complete_under_loss_with_the_timer_armed_once_per_transmit() {
    let mut lost = 0;
    for (seed, loss) in [
        (1, 0),
        (2, 20),
        (3, 20),
        (4, 50),
        (5, 50),
        (6, 100),
        (7, 100),
        (8, 200),
    ] {
        let (d, steps, took) = Download::new().run(seed, loss);
        let stats = d.server.as_ref().expect("the server connection").1.stats();
        eprintln!(
            "seed {seed}, loss {loss}/1000: {} of {TOTAL} bytes in {steps} steps, {took:?} \
             virtual; server sent {} packets, {} lost, {} congestion events",
            d.received,
            stats.path.sent_packets,
            stats.path.lost_packets,
            stats.path.congestion_events,
        );
        assert!(
            d.finished,
            "seed {seed}, loss {loss}: the download finished"
        );
        assert_eq!(d.received, TOTAL, "seed {seed}, loss {loss}: every byte");
        if loss == 0 {
            assert_eq!(stats.path.lost_packets, 0, "nothing is lost without loss");
        }
        lost += stats.path.lost_packets;
    }
    assert!(lost > 0, "loss detection declared packets lost");
}
