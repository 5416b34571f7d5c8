//! TCP listeners and connection serving: the accept loop (gated by the backpressure core's
//! connection limit), the TLS handshake with SNI and ALPN, and hyper serving HTTP/1.1 and
//! HTTP/2 (h2 by ALPN on TLS, h2c by prior knowledge on plain TCP) into the shared pipeline.
//!
//! Connections of a listener that expects PROXY protocol headers read one first (bounded by
//! its timeout); layer-4 listeners (TCP, TLS passthrough) hand the connection to [`crate::l4`].
//!
//! hyper runs each HTTP/2 stream through [`StreamExecutor`]: polled once on the connection's
//! own task first (after the connection's poll, see [`Batched`], so one write carries the
//! responses of all the streams of one read), spawned only when it has to wait.
//!
//! With `limits.http2_engine: sweety`, h2 (ALPN) and h2c (prior knowledge, the client preface
//! peeked) connections are served by Sweety's own HTTP/2 layer ([`crate::h2`]) instead; it
//! batches its writes the same way.
//!
//! Each listener drains gracefully when stopped: it stops accepting, asks every connection
//! to finish (HTTP/2 GOAWAY, HTTP/1.1 close after the current response) and waits up to the
//! drain timeout.

use crate::ctx::{ConnInfo, Protocol};
use crate::runtime::{BindKey, ListenerView, Shared};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Runs the accept loop of one TCP listener until `stop` turns true, then drains.
pub async fn run_tcp(
    shared: Arc<Shared>,
    listener: TcpListener,
    key: BindKey,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            p = shared.backpressure.connection() => p,
            _ = stop.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let snap = shared.snapshot();
        let Some(view) = snap.listener_by_key(&key).cloned() else {
            continue;
        };
        let builder = snap.http.clone();
        let handshake_timeout = snap.config.limits.header_read_timeout.get();
        let h2 = (snap.config.limits.http2_engine == sweety_config::Http2Engine::Sweety)
            .then(|| crate::h2::Settings::from_limits(&snap.config.limits));
        drop(snap);
        let drain = stop.clone();
        let watcher = graceful.watcher();
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut stream = stream;
            let mut peer = crate::ctx::canonical_addr(peer);
            // The address the client connected to: the PROXY header's destination when one
            // came in (the front proxy's address, forwarded as such to L4 backends).
            let mut dest = None;
            // PROXY protocol header first, when the listener expects one from this peer.
            if let Some(pp) = view
                .proxy_protocol
                .as_ref()
                .filter(|p| p.applies_to(peer.ip()))
            {
                let read = crate::proxy_protocol::read_header(&mut stream);
                match tokio::time::timeout(pp.timeout, read).await {
                    Ok(Ok(Some(a))) => {
                        peer = crate::ctx::canonical_addr(a.source);
                        dest = Some(a.destination);
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "PROXY protocol header refused");
                        shared.metrics.edge_events.inc(&"proxy_protocol_error");
                        return;
                    }
                    Err(_) => {
                        shared.metrics.edge_events.inc(&"proxy_protocol_timeout");
                        return;
                    }
                }
            }
            if view.l4.is_some() {
                let local = dest.unwrap_or_else(|| stream.local_addr().unwrap_or(peer));
                crate::l4::serve_tcp(shared, view, stream, peer, local).await;
                return;
            }
            let serving = Serving {
                builder,
                handshake_timeout,
                watcher,
                h2,
                drain,
            };
            serve_conn(shared, view, serving, stream, peer).await;
        });
    }
    drop(listener);
    let drain = shared.snapshot().config.limits.drain_timeout.get();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(addr = %key.0, "drain timeout: closing remaining connections");
    }
}

/// How one accepted connection is to be served.
struct Serving {
    builder: hyper_util::server::conn::auto::Builder<StreamExecutor>,
    handshake_timeout: Duration,
    /// Held while the connection is served: the listener's drain waits for it.
    watcher: Watcher,
    /// Sweety's HTTP/2 engine and its settings, when `limits.http2_engine` is `sweety`.
    h2: Option<crate::h2::Settings>,
    /// Turns true when the listener drains (GOAWAY for Sweety's HTTP/2 engine).
    drain: watch::Receiver<bool>,
}

async fn serve_conn(
    shared: Arc<Shared>,
    view: Arc<ListenerView>,
    serving: Serving,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let Serving {
        mut builder,
        handshake_timeout,
        watcher,
        h2,
        drain,
    } = serving;
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().unwrap_or(peer);
    match &view.tls {
        None => {
            let conn = Arc::new(ConnInfo {
                listener: view.name.clone(),
                peer,
                local,
                tls: false,
                sni: None,
            });
            if let Some(settings) = h2 {
                // h2c by prior knowledge: the client preface, peeked (HTTP/1.1 otherwise).
                match tokio::time::timeout(handshake_timeout, starts_with_preface(&stream)).await {
                    Ok(Ok(true)) => {
                        let r = crate::h2::serve(stream, shared, conn, settings, drain).await;
                        drop(watcher);
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "HTTP/2 connection ended with an error");
                        }
                        return;
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        shared.metrics.limit_hit("header_read_timeout");
                        return;
                    }
                }
            }
            serve_http(shared, conn, builder, TokioIo::new(stream), watcher).await;
        }
        Some(cfg) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg.clone());
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    shared.metrics.limit_hit("tls_handshake_timeout");
                    return;
                }
            };
            let (_, session) = tls.get_ref();
            let sni = session
                .server_name()
                .map(|s| Arc::<str>::from(s.to_ascii_lowercase()));
            let alpn_h2 = session.alpn_protocol() == Some(b"h2");
            match session.alpn_protocol() {
                Some(b"h2") => builder = builder.http2_only(),
                Some(b"http/1.1") => builder = builder.http1_only(),
                _ => {}
            }
            let conn = Arc::new(ConnInfo {
                listener: view.name.clone(),
                peer,
                local,
                tls: true,
                sni,
            });
            if let (true, Some(settings)) = (alpn_h2, h2) {
                let r = crate::h2::serve(tls, shared, conn, settings, drain).await;
                drop(watcher);
                if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP/2 connection ended with an error");
                }
                return;
            }
            serve_http(shared, conn, builder, TokioIo::new(tls), watcher).await;
        }
    }
}

/// Whether a cleartext connection starts with the HTTP/2 client preface (peeked, not
/// consumed). Decides at the first byte that differs; waits for more bytes while what came
/// so far is a prefix of the preface.
async fn starts_with_preface(stream: &TcpStream) -> std::io::Result<bool> {
    let preface = crate::h2::frame::PREFACE;
    let mut buf = [0u8; 24];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if buf[..n] != preface[..n] {
            return Ok(false);
        }
        if n == preface.len() {
            return Ok(true);
        }
        // A prefix of the preface so far (rare: it comes in one segment): peek again shortly.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn serve_http<I>(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    builder: hyper_util::server::conn::auto::Builder<StreamExecutor>,
    io: TokioIo<I>,
    watcher: Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let shared = shared.clone();
        let conn = conn.clone();
        async move {
            let protocol = if req.version() == http::Version::HTTP_2 {
                Protocol::Http2
            } else {
                Protocol::Http1
            };
            Ok::<_, Infallible>(
                crate::pipeline::handle(shared, conn, protocol, req.map(crate::body::boxed)).await,
            )
        }
    });
    // With upgrades: WebSocket (HTTP/1.1 Upgrade and HTTP/2 extended CONNECT) is tunnelled.
    let connection = builder
        .serve_connection_with_upgrades(io, service)
        .into_owned();
    if let Err(e) = Batched::new(watcher.watch(connection)).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// A connection task's stream futures, not yet polled.
type Deferred = Vec<Pin<Box<dyn Future<Output = ()> + Send>>>;

thread_local! {
    /// Stream futures handed to [`StreamExecutor`] while a [`Batched`] connection is polled
    /// on this thread; `None` outside such a poll.
    static DEFERRED: RefCell<Option<Deferred>> = const { RefCell::new(None) };
}

/// hyper's executor for the tasks of a connection (one per HTTP/2 stream; upgrade pipes).
///
/// The task is polled once at once on the connection's own task, with a no-op waker; only
/// when it is not finished then (it waits for a backend, a file, a request body or
/// flow-control window) is it spawned on the runtime, where its first poll registers the real
/// waker (a future re-checks its state on every poll, so nothing that happened in between is
/// missed). A response that is ready at once (cache hit, cached static file, fixed reply,
/// refusal) is answered without a task, a scheduler round trip or a cross-task wake-up.
///
/// Inside a [`Batched`] connection the first polls wait until the connection's poll returns,
/// so that every stream that arrived in one read is answered before the connection writes:
/// one write (and one TLS record run) for the batch instead of one per stream. The limits
/// are unchanged: hyper accepts a stream (bounded by `max_concurrent_streams`) before
/// handing it over, and the request pipeline takes its backpressure slot inside it.
///
/// A panic in that first poll is caught and ends only that stream (as in a spawned task).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamExecutor;

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let fut: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(fut);
        let fut = DEFERRED.with(|d| match d.borrow_mut().as_mut() {
            Some(batch) => {
                batch.push(fut);
                None
            }
            None => Some(fut),
        });
        if let Some(fut) = fut {
            spawn_unless_ready(fut);
        }
    }
}

/// What [`first_poll`] did with a future.
pub(crate) enum FirstPoll<T> {
    /// It finished in its first poll.
    Ready(T),
    /// It waits for something: it runs on as its own task.
    Spawned(tokio::task::JoinHandle<T>),
    /// It panicked (caught: only this future ends, as in a spawned task).
    Panicked,
}

/// Polls a request future once on the caller's task with a no-op waker, and spawns it when
/// it is not finished: its first poll on the runtime registers the real waker (a future
/// re-checks its state on every poll, so nothing that happened in between is missed). Both
/// HTTP/2 servers answer ready requests this way (hyper's through [`StreamExecutor`], Sweety's
/// engine in `h2::conn`), each capped at [`INLINE_FIRST_POLLS`] per connection poll.
pub(crate) fn first_poll<F>(mut fut: F) -> FirstPoll<F::Output>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    let mut cx = Context::from_waker(Waker::noop());
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pin::new(&mut fut).poll(&mut cx)
    }));
    match first {
        Ok(Poll::Ready(v)) => FirstPoll::Ready(v),
        Ok(Poll::Pending) => FirstPoll::Spawned(tokio::spawn(fut)),
        Err(_) => {
            tracing::error!("a request future panicked in its first poll");
            FirstPoll::Panicked
        }
    }
}

/// [`first_poll`] for hyper's stream tasks, which nobody awaits.
fn spawn_unless_ready(fut: Pin<Box<dyn Future<Output = ()> + Send>>) {
    drop(first_poll(fut));
}

/// Most rounds (connection poll, then its new streams' first polls) in one poll of
/// [`Batched`] before it yields to the runtime.
const BATCH_ROUNDS: usize = 8;

/// Most stream first polls run inline in one poll of a connection, so one connection sending
/// cheap requests (cache hits, refusals) cannot hold a single-threaded worker away from the
/// accept loop and the other connections: in [`Batched`] (hyper) later streams of that poll
/// are spawned; Sweety's engine stops handling frames and yields until its next poll.
pub(crate) const INLINE_FIRST_POLLS: usize = 64;

/// Collects the stream futures handed to [`StreamExecutor`] during one poll of a [`Batched`]
/// connection. Restores the thread's previous collector when dropped, also while a panic
/// unwinds out of the connection's poll (hyper runs HTTP/1 requests inside it): streams
/// collected by then are spawned rather than lost, and the thread is never left deferring.
struct Collecting {
    outer: Option<Deferred>,
    restored: bool,
}

impl Collecting {
    fn start() -> Collecting {
        let outer = DEFERRED.with(|d| d.borrow_mut().replace(Vec::new()));
        Collecting {
            outer,
            restored: false,
        }
    }

    /// Ends the collection; the streams collected.
    fn finish(mut self) -> Deferred {
        self.restore()
    }

    fn restore(&mut self) -> Deferred {
        self.restored = true;
        let outer = self.outer.take();
        DEFERRED
            .with(|d| std::mem::replace(&mut *d.borrow_mut(), outer))
            .unwrap_or_default()
    }
}

impl Drop for Collecting {
    fn drop(&mut self) {
        if !self.restored {
            for fut in self.restore() {
                drop(tokio::spawn(fut));
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// Drives a connection future so that the streams it hands to [`StreamExecutor`] during a
    /// poll get their first poll after it, then polls the connection again to write their
    /// responses together.
    pub struct Batched<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Batched<F> {
    /// Wraps a connection future.
    pub fn new(inner: F) -> Batched<F> {
        Batched { inner }
    }
}

impl<F: Future> Future for Batched<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let mut inline = 0usize;
        for _ in 0..BATCH_ROUNDS {
            let collecting = Collecting::start();
            let polled = this.inner.as_mut().poll(cx);
            let batch = collecting.finish();
            let ran = !batch.is_empty();
            for fut in batch {
                if inline < INLINE_FIRST_POLLS {
                    inline += 1;
                    spawn_unless_ready(fut);
                } else {
                    drop(tokio::spawn(fut));
                }
            }
            if polled.is_ready() || !ran {
                return polled;
            }
            // Responses were queued: poll the connection again so it writes them now.
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    #[tokio::test]
    async fn ready_tasks_run_inline_and_waiting_ones_are_spawned() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        StreamExecutor.execute(async move {
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 1, "a ready task finishes inside execute");

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let d = done.clone();
        StreamExecutor.execute(async move {
            let _ = rx.await;
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 1, "a waiting task is not finished yet");
        tx.send(()).unwrap();
        // The spawned task registered its real waker on its first poll and completes.
        tokio::time::timeout(Duration::from_secs(10), async {
            while done.load(SeqCst) != 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the spawned task completes");

        // A panic in the first poll ends that task only; later tasks still run inline.
        StreamExecutor.execute(async {
            panic!("boom");
        });
        let d = done.clone();
        StreamExecutor.execute(async move {
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 3, "execute runs inline after a panic");
    }

    #[tokio::test]
    async fn a_panicking_connection_poll_loses_no_stream_and_stops_deferring() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let conn = std::future::poll_fn(move |_| -> Poll<()> {
            let d = d.clone();
            StreamExecutor.execute(async move {
                d.fetch_add(1, SeqCst);
            });
            panic!("the request pipeline panicked inside the connection poll");
        });
        let mut batched = std::pin::pin!(Batched::new(conn));
        let mut cx = Context::from_waker(Waker::noop());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = batched.as_mut().poll(&mut cx);
        }));
        assert!(unwound.is_err());
        assert!(
            DEFERRED.with(|d| d.borrow().is_none()),
            "the thread is no longer collecting"
        );
        // The stream queued before the panic was spawned, not dropped.
        tokio::time::timeout(Duration::from_secs(10), async {
            while done.load(SeqCst) != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the collected stream runs");
    }

    #[tokio::test]
    async fn first_polls_inline_are_capped_per_connection_poll() {
        let inline = Arc::new(AtomicUsize::new(0));
        let i = inline.clone();
        let mut polls = 0;
        let conn = std::future::poll_fn(move |_| {
            polls += 1;
            if polls > 1 {
                return Poll::Ready(());
            }
            for _ in 0..INLINE_FIRST_POLLS + 10 {
                let i = i.clone();
                // Counts only when its first poll runs before the connection is polled again.
                StreamExecutor.execute(async move {
                    i.fetch_add(1, SeqCst);
                });
            }
            Poll::Pending
        });
        tokio::time::timeout(Duration::from_secs(10), Batched::new(conn))
            .await
            .expect("the connection finishes");
        assert_eq!(
            inline.load(SeqCst),
            INLINE_FIRST_POLLS,
            "the rest are spawned"
        );
        tokio::time::timeout(Duration::from_secs(10), async {
            while inline.load(SeqCst) != INLINE_FIRST_POLLS + 10 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the spawned streams run");
    }

    #[tokio::test]
    async fn batched_connections_answer_their_streams_then_poll_again() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = log.clone();
        let mut polls = 0;
        let conn = std::future::poll_fn(move |_| {
            polls += 1;
            l.lock().unwrap().push(format!("conn {polls}"));
            if polls > 1 {
                return Poll::Ready(());
            }
            for name in ["a", "b"] {
                let l = l.clone();
                StreamExecutor.execute(async move {
                    l.lock().unwrap().push(format!("stream {name}"));
                });
            }
            l.lock().unwrap().push("conn 1 returns".into());
            Poll::Pending
        });
        tokio::time::timeout(Duration::from_secs(10), Batched::new(conn))
            .await
            .expect("the connection is polled again at once and finishes");
        assert_eq!(
            *log.lock().unwrap(),
            ["conn 1", "conn 1 returns", "stream a", "stream b", "conn 2"]
        );
        // Outside a batched connection, tasks run at once again.
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        StreamExecutor.execute(async move {
            d.fetch_add(1, SeqCst);
        });
        assert_eq!(done.load(SeqCst), 1);
    }
}
