//! The vendored quinn-proto wakes the streams blocked on a full send window only as far as the
//! free window serves (vendor/README.md), and a woken stream that never writes again does not
//! leave the others asleep.
//!
//! A quinn-proto server with the transport settings of Sweety's HTTP/3 listeners
//! (`listen::quic::server_config`) and its send window set to 64 KiB serves several downloads
//! on one connection to a quinn-proto client, both driven by hand on a virtual clock (1 ms a
//! hop), the datagrams handed over in memory. The server writes as quinn's `SendStream` does:
//! each stream writes until a write is refused (`WriteError::Blocked`), then only when the
//! connection reports it `Writable`, as quinn wakes a blocked writer's task. A "dropper" stream
//! models a write future dropped on a live stream: after its first wake-up it never writes,
//! finishes or is reset again, and stays open until the others are done.

mod common;

use bytes::BytesMut;
use quinn_proto::{
    Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, Event, StreamEvent, StreamId,
    WriteError,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SERVER_ADDR: &str = "127.0.0.1:21100";
const CLIENT_ADDR: &str = "127.0.0.1:21101";
/// Each download's length, and the server's writes.
const TOTAL: usize = 256 * 1024;
static CHUNK: [u8; 16 * 1024] = [0x5a; 16 * 1024];
/// The server's send window (`http3.send_window`'s role): four of the downloads' writes.
const WINDOW: u64 = 64 * 1024;
/// One hop: every datagram sent in a step arrives in the next.
const HOP: Duration = Duration::from_millis(1);
/// Steps at most; the downloads take a few hundred.
const STEPS: usize = 20_000;

/// A server stream as its writer sees it.
#[derive(Default)]
struct Writer {
    written: usize,
    /// Never writes again after its first wake-up.
    dropper: bool,
    wakes: usize,
    /// Wake-ups whose first write was refused: the window was full again.
    futile: usize,
}

struct Downloads {
    now: Instant,
    server_ep: Endpoint,
    server: Option<(ConnectionHandle, Connection)>,
    /// In the order the server accepted them (the client's order).
    order: Vec<StreamId>,
    writers: HashMap<StreamId, Writer>,
    /// How many of the first streams are droppers.
    droppers: usize,
    client_ep: Endpoint,
    client: (ConnectionHandle, Connection),
    streams: usize,
    requests: Vec<StreamId>,
    received: HashMap<StreamId, usize>,
    finished: HashMap<StreamId, bool>,
    /// Whether each datagram is handled as it comes (the client acknowledging every two
    /// packets, the server waking writers after each acknowledgement); else a step's
    /// datagrams are handled together (one acknowledgement of a whole flight: the window
    /// drains at once).
    each: bool,
}

impl Downloads {
    fn new(streams: usize, droppers: usize, each: bool) -> Downloads {
        let (server_tls, client_tls) = common::quic::tls();
        let server_ep = common::quic::server_endpoint(server_tls);
        let now = Instant::now();
        let (client_ep, client) =
            common::quic::client(client_tls, None, SERVER_ADDR.parse().unwrap(), now);
        Downloads {
            now,
            server_ep,
            server: None,
            order: Vec::new(),
            writers: HashMap::new(),
            droppers,
            client_ep,
            client,
            streams,
            requests: Vec::new(),
            received: HashMap::new(),
            finished: HashMap::new(),
            each,
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
                let (ch, mut conn) = self
                    .server_ep
                    .accept(incoming, self.now, &mut buf, None)
                    .unwrap();
                conn.set_send_window(WINDOW);
                self.server = Some((ch, conn));
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

    /// Writes on `id` until a write is refused or the download is written (then finishes it).
    /// Returns whether the first write was refused.
    fn write(conn: &mut Connection, id: StreamId, w: &mut Writer) -> bool {
        let mut first = true;
        while w.written < TOTAL {
            let chunk = &CHUNK[..CHUNK.len().min(TOTAL - w.written)];
            match conn.send_stream(id).write(chunk) {
                Ok(n) => w.written += n,
                Err(WriteError::Blocked) => return first,
                Err(e) => panic!("stream {id}: {e}"),
            }
            first = false;
        }
        conn.send_stream(id).finish().unwrap();
        false
    }

    /// The server's events (new streams written at once, blocked ones when woken), its
    /// datagrams.
    fn server_step(&mut self, out: &mut Vec<Vec<u8>>) {
        let Some((ch, conn)) = self.server.as_mut() else {
            return;
        };
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(ev) = self.server_ep.handle_event(*ch, ev) {
                conn.handle_event(ev);
            }
        }
        // As quinn: every event first (its connection driver wakes the writers' tasks), then
        // the writers (the tasks run).
        let (mut opened, mut woken) = (false, Vec::new());
        while let Some(ev) = conn.poll() {
            match ev {
                Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) => opened = true,
                Event::Stream(StreamEvent::Writable { id }) => woken.push(id),
                _ => {}
            }
        }
        for id in woken {
            let w = self.writers.get_mut(&id).expect("a known stream");
            w.wakes += 1;
            if !w.dropper && Self::write(conn, id, w) {
                w.futile += 1;
            }
        }
        while let Some(id) = opened.then(|| conn.streams().accept(Dir::Bi)).flatten() {
            let mut w = Writer {
                dropper: self.order.len() < self.droppers,
                ..Writer::default()
            };
            Self::write(conn, id, &mut w);
            self.order.push(id);
            self.writers.insert(id, w);
        }
        common::quic::transmit(conn, self.now, out);
    }

    /// The client's events, its requests once connected, what it reads, its datagrams.
    fn client_step(&mut self, out: &mut Vec<Vec<u8>>) {
        let (ch, conn) = &mut self.client;
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(ev) = self.client_ep.handle_event(*ch, ev) {
                conn.handle_event(ev);
            }
        }
        while let Some(ev) = conn.poll() {
            if let Event::Connected = ev {
                for _ in 0..self.streams {
                    let id = conn.streams().open(Dir::Bi).expect("a stream");
                    conn.send_stream(id).write(b"GET /").unwrap();
                    conn.send_stream(id).finish().unwrap();
                    self.requests.push(id);
                }
            }
        }
        for &id in &self.requests {
            let mut recv = conn.recv_stream(id);
            let Ok(mut chunks) = recv.read(true) else {
                continue;
            };
            loop {
                match chunks.next(usize::MAX) {
                    Ok(Some(c)) => {
                        let got = self.received.entry(id).or_default();
                        assert_eq!(c.offset, *got as u64, "in order");
                        *got += c.bytes.len();
                    }
                    Ok(None) => {
                        self.finished.insert(id, true);
                        break;
                    }
                    Err(_) => break,
                }
            }
            let _ = chunks.finalize();
        }
        common::quic::transmit(conn, self.now, out);
    }

    /// Whether every stream but the droppers was received whole.
    fn done(&self) -> bool {
        let writers = &self.requests[self.droppers.min(self.requests.len())..];
        !writers.is_empty()
            && writers.iter().all(|id| {
                self.finished.get(id) == Some(&true) && self.received.get(id) == Some(&TOTAL)
            })
    }

    /// Runs until `done` or `STEPS`; returns the steps taken.
    fn run(&mut self) -> usize {
        let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
        for step in 1..=STEPS {
            for d in std::mem::take(&mut to_server) {
                self.server_recv(d, &mut to_client);
                if self.each {
                    self.server_step(&mut to_client);
                }
            }
            for d in std::mem::take(&mut to_client) {
                self.client_recv(d);
                if self.each {
                    self.client_step(&mut to_server);
                }
            }
            self.client_step(&mut to_server);
            self.server_step(&mut to_client);
            if self.done() {
                return step;
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
        STEPS
    }

    fn totals(&self) -> (usize, usize) {
        let wakes = self.writers.values().map(|w| w.wakes).sum();
        let futile = self.writers.values().map(|w| w.futile).sum();
        (wakes, futile)
    }
}

/// The first of four blocked streams is woken and never writes again (its write future
/// dropped, the stream open): its share of the free window is owed to it only until the
/// window grows or nothing is buffered, and the three others are woken and complete.
#[test]
fn a_woken_writer_that_never_writes_again_leaves_no_other_writer_asleep() {
    for (droppers, each) in [(1, true), (4, true), (1, false), (4, false)] {
        let mut d = Downloads::new(droppers + 3, droppers, each);
        let steps = d.run();
        let (wakes, futile) = d.totals();
        eprintln!(
            "{droppers} dropper(s), each datagram apart: {each}: {steps} steps, {wakes} \
             wake-ups, {futile} futile"
        );
        for (i, id) in d.order.iter().enumerate().take(droppers) {
            let w = &d.writers[id];
            assert!(w.wakes >= 1, "dropper {i} was woken (the case under test)");
            assert!(w.written < TOTAL, "dropper {i} stopped writing");
        }
        assert!(
            d.done(),
            "{droppers} dropper(s), {each}: the other downloads completed ({steps} steps)"
        );
    }
}

/// Ten downloads share the window: a wake-up finds the window full again rarely (upstream
/// woke every blocked stream each time part of the window was free, and all but the first
/// found it full).
#[test]
fn blocked_writers_are_woken_only_as_far_as_the_free_window_serves() {
    let mut d = Downloads::new(10, 0, true);
    let steps = d.run();
    let (wakes, futile) = d.totals();
    eprintln!("10 downloads: {steps} steps, {wakes} wake-ups, {futile} futile");
    assert!(d.done(), "the downloads completed");
    assert!(
        futile * 4 <= wakes,
        "{futile} of {wakes} wake-ups found the window full"
    );
}
