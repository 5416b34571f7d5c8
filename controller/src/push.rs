//! Pushes config snapshots to the dataplane over its Unix control socket and tracks which
//! generation it has acknowledged. Frames are [`sweety_config::wire`]; the protocol is
//! described in docs/control-protocol.md.
//!
//! * [`Pusher::submit`] numbers a config (the next generation) only when its content hash
//!   changed. The hash is the per-item tree hash ([`sweety_config::delta::Digests`]). The
//!   config comes as [`ConfigItems`] (the translate cache's): items that did not change are
//!   the same allocations with their digests, so nothing is compared or serialized for them,
//!   and the pusher keeps no copy of the config (its latest and base configs share the
//!   translate cache's items).
//! * The first push on a connection is a full `Apply`; later ones are `ApplyDelta`s against
//!   the config last sent on the connection, carrying only changed items. A `Nack`ed delta
//!   (base mismatch, or a result the dataplane rejects) is followed by the full config.
//! * A submitted config is sent at once: bursts are coalesced before the pusher, by the
//!   reconcile loop's pacing ([`crate::run`]). Only the latest config is kept, so configs
//!   submitted while a frame is being written, or while the dataplane is unreachable, are
//!   replaced by the newest and never sent.
//! * On every connection the dataplane's `Hello` says which generation and hash it runs: a
//!   matching hash is not resent; otherwise the latest config is sent at once, renumbered
//!   above the dataplane's generation if needed, so generations keep increasing across
//!   restarts of either side.
//! * Connection failures are retried with exponential backoff up to
//!   [`PushOptions::max_backoff`].

use crate::config_items::ConfigItems;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::wire::{self, FrameHeader, Hello, Message, HEADER_LEN};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How long the dataplane has to say `Hello` after the connection is accepted.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing one frame may take before the connection is considered dead.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// First reconnect delay (doubles up to `max_backoff`).
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);

/// How to reach the dataplane.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// The dataplane's control socket (`sweety-dataplane --control-socket PATH`).
    pub socket: PathBuf,
    /// Longest wait between reconnect attempts (backoff doubles up to this).
    pub max_backoff: Duration,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            socket: PathBuf::from("/var/run/sweety/control.sock"),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// What the pusher knows about the dataplane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PushState {
    /// Connected to the dataplane right now.
    pub connected: bool,
    /// Highest generation submitted (assigned by `submit`, or by renumbering above a
    /// restarted dataplane's generation).
    pub submitted: u64,
    /// The generation the dataplane last reported running: from its `Ack`s, or from its
    /// `Hello` on (re)connect (which can be lower after a dataplane restart, until the latest
    /// config is resent and acknowledged). A `Hello` of content that is not ours, under a
    /// generation the latest config had to be renumbered above (a previous controller's),
    /// counts as 0: the configs submitted before it carry lower numbers, and it applied none
    /// of them.
    pub acked: u64,
    /// The last rejection of a full config (a rejected delta is sent again in full, whose
    /// answer counts): generation and the dataplane's errors (dropped on a reconnect
    /// once an `Ack` of that generation or a later one has superseded it).
    pub last_nack: Option<(u64, Vec<String>)>,
    /// When the pusher received the last `Ack` (for latency metrics).
    pub acked_at: Option<std::time::Instant>,
}

/// Push counters, for the controller's `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PushMetrics {
    /// Connections on which the dataplane said `Hello`.
    pub connects: u64,
    /// `Apply` frames sent.
    pub pushes: u64,
    /// `Ack`s received.
    pub acks: u64,
    /// `Nack`s received.
    pub nacks: u64,
    /// `ApplyDelta` frames sent (also counted in `pushes`).
    pub deltas: u64,
    /// Bytes of all `Apply` and `ApplyDelta` frames sent.
    pub bytes_sent: u64,
    /// Size of the last `Apply` or `ApplyDelta` frame.
    pub last_config_bytes: u64,
    /// Send → `Ack` time of the last acknowledged push.
    pub last_push_latency: Duration,
    /// Sum of send → `Ack` times over all acknowledged pushes (with `acks`: the mean).
    pub push_latency_total: Duration,
}

#[derive(Default)]
struct Counters {
    connects: AtomicU64,
    pushes: AtomicU64,
    acks: AtomicU64,
    nacks: AtomicU64,
    deltas: AtomicU64,
    bytes_sent: AtomicU64,
    last_config_bytes: AtomicU64,
    last_latency_us: AtomicU64,
    latency_total_us: AtomicU64,
}

/// The config to push, numbered. The items have `generation` 0 (the frame carries the
/// generation, so renumbering never touches them).
struct Latest {
    generation: u64,
    hash: String,
    body: Arc<ConfigItems>,
}

#[derive(Default)]
struct Queue {
    /// Highest generation used or seen (own submits and dataplane `Hello`s).
    highest: u64,
    latest: Option<Latest>,
    /// Generation and hash from the last dataplane `Hello`.
    dataplane: Option<(u64, String)>,
    /// The highest generation a `Hello` reported for other content than the latest config
    /// when that config was renumbered above it (a previous controller's numbering): no
    /// generation up to it is one of ours that the dataplane can run, so a `Hello` of other
    /// content at or below it acknowledges nothing of ours.
    foreign: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    state: watch::Sender<PushState>,
    counters: Counters,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Handle to the background push task. The task ends when every handle is dropped.
#[derive(Clone)]
pub struct Pusher {
    shared: Arc<Shared>,
    changed: watch::Sender<u64>,
    state: watch::Receiver<PushState>,
}

impl Pusher {
    /// Start the push task (needs a tokio runtime).
    pub fn spawn(options: PushOptions) -> Pusher {
        let (state_tx, state) = watch::channel(PushState::default());
        let (changed, changed_rx) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            state: state_tx,
            counters: Counters::default(),
        });
        tokio::spawn(run(shared.clone(), options, changed_rx));
        Pusher {
            shared,
            changed,
            state,
        }
    }

    /// Offer a config. When its content hash differs from the last submitted one it gets the
    /// next generation and is pushed at once; otherwise the current generation is returned and
    /// nothing is sent. Unchanged items are the same allocations as in the previous submit
    /// (the translate cache keeps them), so only the changed ones cost anything here and in
    /// the delta.
    pub fn submit(&self, items: ConfigItems) -> u64 {
        let hash = items.hash();
        let body = Arc::new(items);
        let generation = {
            let mut q = self.shared.queue();
            if let Some(l) = &q.latest {
                if l.hash == hash {
                    return l.generation;
                }
            }
            // A fresh controller whose first config is what the dataplane already runs adopts
            // the dataplane's generation (nothing is sent).
            let adopt = match (&q.latest, &q.dataplane) {
                (None, Some((g, h))) if *g > 0 && *h == hash => Some(*g),
                _ => None,
            };
            let generation = adopt.unwrap_or(q.highest + 1);
            q.highest = q.highest.max(generation);
            q.latest = Some(Latest {
                generation,
                hash,
                body,
            });
            generation
        };
        self.shared
            .state
            .send_modify(|s| s.submitted = s.submitted.max(generation));
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        generation
    }

    /// Watch the dataplane's state (connected, acked generation, last Nack).
    pub fn state(&self) -> watch::Receiver<PushState> {
        self.state.clone()
    }

    /// The push counters.
    pub fn metrics(&self) -> PushMetrics {
        let c = &self.shared.counters;
        PushMetrics {
            connects: c.connects.load(Relaxed),
            pushes: c.pushes.load(Relaxed),
            acks: c.acks.load(Relaxed),
            nacks: c.nacks.load(Relaxed),
            deltas: c.deltas.load(Relaxed),
            bytes_sent: c.bytes_sent.load(Relaxed),
            last_config_bytes: c.last_config_bytes.load(Relaxed),
            last_push_latency: Duration::from_micros(c.last_latency_us.load(Relaxed)),
            push_latency_total: Duration::from_micros(c.latency_total_us.load(Relaxed)),
        }
    }
}

/// Why a session ended.
enum End {
    /// Every `Pusher` handle is gone: stop.
    Dropped,
    /// The connection ended; reconnect.
    Closed(io::Error),
}

async fn run(shared: Arc<Shared>, opts: PushOptions, mut changed: watch::Receiver<u64>) {
    let max_backoff = opts.max_backoff.max(Duration::from_millis(1));
    let mut backoff = INITIAL_BACKOFF.min(max_backoff);
    let mut failing = false;
    loop {
        let end = match connect(&opts).await {
            Ok((stream, hello)) => {
                backoff = INITIAL_BACKOFF.min(max_backoff);
                failing = false;
                tracing::info!(
                    socket = %opts.socket.display(),
                    generation = hello.generation,
                    "connected to the dataplane"
                );
                session(&shared, &mut changed, stream, hello).await
            }
            Err(e) => End::Closed(e),
        };
        shared.state.send_if_modified(|s| {
            std::mem::replace(&mut s.connected, false) // modified when it was connected
        });
        match end {
            End::Dropped => return,
            End::Closed(e) if !failing => {
                failing = true;
                tracing::warn!(socket = %opts.socket.display(), error = %e, "dataplane control connection failed; retrying");
            }
            End::Closed(e) => {
                tracing::debug!(socket = %opts.socket.display(), error = %e, "dataplane still unreachable");
            }
        }
        let deadline = Instant::now() + backoff;
        backoff = (backoff * 2).min(max_backoff);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                r = changed.changed() => if r.is_err() { return },
            }
        }
    }
}

/// Connects and reads the dataplane's `Hello`.
async fn connect(opts: &PushOptions) -> io::Result<(UnixStream, Hello)> {
    let mut stream = UnixStream::connect(&opts.socket).await?;
    let first = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no Hello from the dataplane"))??;
    match first {
        Some(Message::Hello(h)) if h.version == wire::PROTOCOL_VERSION => Ok((stream, h)),
        Some(Message::Hello(h)) => Err(invalid(format!(
            "the dataplane speaks protocol version {}, this controller {}",
            h.version,
            wire::PROTOCOL_VERSION
        ))),
        Some(other) => Err(invalid(format!(
            "expected Hello, the dataplane sent {:?}",
            other.kind()
        ))),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the dataplane closed the connection before Hello",
        )),
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads one frame; `None` on a clean end of stream between frames.
async fn read_frame(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> io::Result<Option<Message>> {
    let mut hdr = [0u8; HEADER_LEN];
    match r.read_exact(&mut hdr).await {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        res => res?,
    };
    let header =
        FrameHeader::parse(&hdr).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut payload = vec![0u8; header.len as usize];
    r.read_exact(&mut payload).await?;
    Message::decode(header.kind, &payload)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies the dataplane's `Hello` to the queue: records its generation as used, renumbers
/// the latest config above it, and returns the generation already running there when its
/// hash matches the latest (nothing to send).
fn on_hello(shared: &Shared, hello: &Hello) -> Option<u64> {
    let mut guard = shared.queue();
    let q = &mut *guard;
    q.highest = q.highest.max(hello.generation);
    q.dataplane = Some((hello.generation, hello.hash.clone()));
    let highest = q.highest;
    let mut running = None;
    if let Some(l) = q.latest.as_mut() {
        let renumber = if !hello.hash.is_empty() && l.hash == hello.hash {
            running = Some(l.generation.max(hello.generation));
            (l.generation < hello.generation).then_some(hello.generation)
        } else if l.generation <= hello.generation {
            // Other content under a number of ours or above: not a config of ours (the latest
            // has our highest number, and the same number would be the same content).
            q.foreign = q.foreign.max(hello.generation);
            Some(highest + 1)
        } else {
            None
        };
        if let Some(g) = renumber {
            // The payload has no generation of its own: renumbering is free.
            l.generation = g;
        }
    }
    let latest = q.latest.as_ref().map(|l| l.generation).unwrap_or(0);
    q.highest = q.highest.max(latest);
    // The generation the dataplane runs, in our numbering: statuses are gated on the numbers
    // `submit` returned, which a foreign generation above them must not acknowledge.
    let acked = match running {
        Some(g) => g,
        None if hello.generation <= q.foreign => 0,
        None => hello.generation,
    };
    drop(guard);
    shared.state.send_modify(|s| {
        s.connected = true;
        s.submitted = s.submitted.max(latest);
        // A rejection an Ack has superseded goes: a restarted dataplane's lower generation
        // would otherwise make it the answer again for the generations above it.
        if s.last_nack.as_ref().is_some_and(|(g, _)| *g <= s.acked) {
            s.last_nack = None;
        }
        s.acked = acked;
    });
    running
}

struct Inflight {
    generation: u64,
    hash: String,
    sent: Instant,
    /// Sent as an `ApplyDelta`.
    delta: bool,
}

async fn session(
    shared: &Shared,
    changed: &mut watch::Receiver<u64>,
    stream: UnixStream,
    hello: Hello,
) -> End {
    let c = &shared.counters;
    c.connects.fetch_add(1, Relaxed);
    // Whatever was submitted before now is covered by the check below: send it at once.
    changed.borrow_and_update();
    // The generation last sent on (or already running behind) this connection.
    let mut attempted = on_hello(shared, &hello).unwrap_or(0);
    // Generation and hash the dataplane runs (from `Hello`, then from `Ack`s).
    let mut running = (hello.generation, hello.hash);
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<io::Result<Message>>(16);
    let _reader = AbortOnDrop(tokio::spawn(async move {
        loop {
            let m = read_frame(&mut rd).await.transpose();
            let stop = !matches!(m, Some(Ok(_)));
            let sent = match m {
                Some(m) => tx.send(m).await.is_ok(),
                None => false,
            };
            if stop || !sent {
                return;
            }
        }
    }));
    // The config last sent on this connection (the base of the next delta); `None` until
    // the first full `Apply`, and again after a `Nack`ed delta.
    let mut base: Option<(u64, Arc<ConfigItems>)> = None;
    let mut inflight: VecDeque<Inflight> = VecDeque::new();
    loop {
        let pending = {
            let q = shared.queue();
            q.latest
                .as_ref()
                .filter(|l| l.generation != attempted)
                .filter(|l| l.generation != running.0 || l.hash != running.1)
                .map(|l| (l.generation, l.hash.clone(), l.body.clone()))
        };
        // Every ready branch has its turn (`select!` picks at random), so Acks are read
        // between sends.
        tokio::select! {
            m = rx.recv() => match m {
                None => return End::Closed(io::Error::new(
                    io::ErrorKind::UnexpectedEof, "the dataplane closed the connection")),
                Some(Err(e)) => return End::Closed(e),
                Some(Ok(Message::Ack { generation })) => {
                    if let Some((latency, hash, _)) = settle(&mut inflight, generation) {
                        running = (generation, hash);
                        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                        c.last_latency_us.store(us, Relaxed);
                        c.latency_total_us.fetch_add(us, Relaxed);
                    }
                    c.acks.fetch_add(1, Relaxed);
                    tracing::debug!(generation, "dataplane acknowledged");
                    let at = std::time::Instant::now();
                    shared.state.send_modify(|s| {
                        s.acked = generation;
                        s.acked_at = Some(at);
                    });
                }
                Some(Ok(Message::Nack { generation, errors })) => {
                    // The dataplane kept its previous config: no base to build deltas on.
                    base = None;
                    c.nacks.fetch_add(1, Relaxed);
                    if settle(&mut inflight, generation).is_some_and(|s| s.2) {
                        // The delta did not apply (another base, or a rejected result): the
                        // same generation goes again as a full config. Not published: the
                        // full config's answer is the answer (a real error comes back with
                        // it; a "delta against generation ..." is ours, not the user's). A
                        // rejected delta of an older generation is likewise followed by a
                        // newer one (sent after it, on its base, so rejected and resent in
                        // full too, or sent in full), whose answer covers it.
                        if attempted == generation {
                            attempted = 0;
                        }
                        tracing::info!(generation, errors = ?errors, "dataplane rejected a delta; sending the full config");
                    } else {
                        tracing::error!(generation, errors = ?errors, "dataplane rejected the config");
                        shared.state.send_modify(|s| s.last_nack = Some((generation, errors)));
                    }
                }
                Some(Ok(other)) => return End::Closed(invalid(format!(
                    "unexpected {:?} frame from the dataplane", other.kind()))),
            },
            r = changed.changed() => if r.is_err() {
                return End::Dropped;
            },
            () = std::future::ready(()), if pending.is_some() => {
                let Some((generation, hash, body)) = pending else { continue };
                let delta = base
                    .as_ref()
                    .and_then(|(g, b)| body.delta_from(b, &hash).map(|d| (*g, d)));
                let encoded = match &delta {
                    Some((g, d)) => wire::encode_apply_delta(generation, *g, d),
                    None => wire::encode_apply_json(generation, &body.to_json()),
                };
                let frame = match encoded {
                    Ok(f) => f,
                    Err(e) => {
                        // Too large to ever send: report it like a rejection.
                        attempted = generation;
                        tracing::error!(generation, error = %e, "config cannot be pushed");
                        shared.state.send_modify(|s| {
                            s.last_nack = Some((generation, vec![e.to_string()]));
                        });
                        continue;
                    }
                };
                let len = frame.len() as u64;
                match tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&frame)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return End::Closed(e),
                    Err(_) => {
                        return End::Closed(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "writing to the dataplane timed out",
                        ))
                    }
                }
                attempted = generation;
                let is_delta = delta.is_some();
                inflight.push_back(Inflight {
                    generation,
                    hash,
                    sent: Instant::now(),
                    delta: is_delta,
                });
                base = Some((generation, body));
                c.pushes.fetch_add(1, Relaxed);
                if is_delta {
                    c.deltas.fetch_add(1, Relaxed);
                }
                c.bytes_sent.fetch_add(len, Relaxed);
                c.last_config_bytes.store(len, Relaxed);
                tracing::debug!(generation, bytes = len, "config pushed");
            }
        }
    }
}

/// Drops in-flight pushes up to `generation`; the send → reply time, the hash of that
/// generation and whether it was sent as a delta.
fn settle(inflight: &mut VecDeque<Inflight>, generation: u64) -> Option<(Duration, String, bool)> {
    let mut found = None;
    while let Some(f) = inflight.pop_front() {
        if f.generation > generation {
            inflight.push_front(f);
            break;
        }
        if f.generation == generation {
            found = Some((f.sent.elapsed(), f.hash, f.delta));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::wire::decode_frame;
    use sweety_config::Config;

    /// Reads the next Apply or ApplyDelta from a fake dataplane connection (10 s cap).
    async fn next_apply(s: &mut UnixStream, buf: &mut Vec<u8>) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((m, used)) = decode_frame(buf).unwrap() {
                buf.drain(..used);
                match m {
                    Message::Apply { generation, .. } | Message::ApplyDelta { generation, .. } => {
                        return generation
                    }
                    other => panic!("unexpected {:?}", other.kind()),
                }
            }
            let mut chunk = vec![0u8; 64 * 1024];
            let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
                .await
                .expect("an Apply within 10 s")
                .unwrap();
            assert!(n > 0, "the pusher closed the connection");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn items(body: &str) -> ConfigItems {
        ConfigItems::from_config(Config::from_yaml(&format!(
            "virtual_hosts: [{{name: v, routes: [{{name: r, action: {{fixed: {{status: 200, body: {body}}}}}}}]}}]"
        ))
        .unwrap())
    }

    /// Waits (at most 10 s) for the pusher's state to satisfy `pred`.
    async fn state_where(pusher: &Pusher, pred: impl Fn(&PushState) -> bool) -> PushState {
        let mut rx = pusher.state();
        let got = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| pred(s)))
            .await
            .map(|r| r.map(|s| s.clone()));
        match got {
            Ok(Ok(s)) => s,
            _ => panic!("state not reached within 10 s: {:?}", *rx.borrow()),
        }
    }

    fn hello(generation: u64) -> Vec<u8> {
        Message::Hello(Hello {
            version: wire::PROTOCOL_VERSION,
            generation,
            hash: String::new(),
        })
        .encode()
        .unwrap()
    }

    /// A pusher dialing a socket in a new temporary directory (removed when the returned
    /// guard drops), and the fake dataplane's listener on that socket.
    fn pusher_and_listener() -> (tempfile::TempDir, tokio::net::UnixListener, Pusher) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let pusher = Pusher::spawn(PushOptions {
            socket: path,
            max_backoff: Duration::from_millis(100),
        });
        (dir, listener, pusher)
    }

    /// Accepts the pusher's next connection as a dataplane running `generation`.
    async fn accept_hello(listener: &tokio::net::UnixListener, generation: u64) -> UnixStream {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(&hello(generation)).await.unwrap();
        s
    }

    /// A rejection that an Ack superseded does not come back when the dataplane restarts:
    /// its `Hello` lowers the acknowledged generation below the rejected one, and the gate
    /// of that generation's statuses must then say "pending", not the old rejection.
    #[tokio::test]
    async fn a_superseded_nack_does_not_come_back_with_a_restarted_dataplane() {
        use crate::status_writer::Gate;
        let (_dir, listener, pusher) = pusher_and_listener();
        let mut s = accept_hello(&listener, 0).await;
        let mut buf = Vec::new();
        assert_eq!(pusher.submit(items("one")), 1);
        assert_eq!(next_apply(&mut s, &mut buf).await, 1);
        let nack = Message::Nack {
            generation: 1,
            errors: vec!["cannot bind: Address already in use".into()],
        };
        s.write_all(&nack.encode().unwrap()).await.unwrap();
        let st = state_where(&pusher, |st| st.last_nack.is_some()).await;
        assert!(Gate::new(&st, 1).nack.is_some());
        // The rejected generation is acknowledged after all (sent again on a new
        // connection, as after a rejected delta).
        drop(s);
        let mut s = accept_hello(&listener, 0).await;
        let mut buf = Vec::new();
        assert_eq!(next_apply(&mut s, &mut buf).await, 1);
        let ack = Message::Ack { generation: 1 }.encode().unwrap();
        s.write_all(&ack).await.unwrap();
        let st = state_where(&pusher, |st| st.acked == 1).await;
        assert_eq!(Gate::new(&st, 1), Gate::open());
        // The dataplane restarts: generation 0 again until the config is resent.
        drop(s);
        let _s = accept_hello(&listener, 0).await;
        let st = state_where(&pusher, |st| st.connected && st.acked == 0).await;
        assert_eq!(st.last_nack, None);
        assert_eq!(Gate::new(&st, 1), Gate::default(), "pending, not rejected");
    }

    #[tokio::test]
    async fn a_submit_is_sent_at_once_and_an_unchanged_one_not_at_all() {
        let (_dir, listener, pusher) = pusher_and_listener();
        let mut s = accept_hello(&listener, 0).await;
        let mut buf = Vec::new();

        assert_eq!(pusher.submit(items("one")), 1);
        assert_eq!(next_apply(&mut s, &mut buf).await, 1);
        let ack = Message::Ack { generation: 1 }.encode().unwrap();
        s.write_all(&ack).await.unwrap();
        // The same content again keeps its generation; a change is the next one and is the
        // next frame (nothing was sent for the unchanged submit).
        assert_eq!(pusher.submit(items("one")), 1);
        assert_eq!(pusher.submit(items("two")), 2);
        assert_eq!(next_apply(&mut s, &mut buf).await, 2);
        assert_eq!(pusher.state().borrow().submitted, 2);
    }
}
