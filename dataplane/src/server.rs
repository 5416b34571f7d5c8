//! TCP listeners and connection serving: the accept loop (gated by the backpressure core's
//! connection limit), the TLS handshake with SNI and ALPN, and hyper serving HTTP/1.1 and
//! HTTP/2 (h2 by ALPN on TLS, h2c by prior knowledge on plain TCP) into the shared pipeline.
//!
//! Connections of a listener that expects PROXY protocol headers read one first (bounded by
//! its timeout); layer-4 listeners (TCP, TLS passthrough) hand the connection to [`crate::l4`].
//!
//! hyper runs each HTTP/2 stream through [`StreamExecutor`]: polled once on the connection's
//! own task first, spawned only when it has to wait.
//!
//! Each listener drains gracefully when stopped: it stops accepting, asks every connection
//! to finish (HTTP/2 GOAWAY, HTTP/1.1 close after the current response) and waits up to the
//! drain timeout.

use crate::ctx::{ConnInfo, Protocol};
use crate::runtime::{BindKey, ListenerView, Shared};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Waker};
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
        drop(snap);
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
            serve_conn(
                shared,
                view,
                builder,
                handshake_timeout,
                stream,
                peer,
                watcher,
            )
            .await;
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

async fn serve_conn(
    shared: Arc<Shared>,
    view: Arc<ListenerView>,
    mut builder: hyper_util::server::conn::auto::Builder<StreamExecutor>,
    handshake_timeout: Duration,
    stream: TcpStream,
    peer: SocketAddr,
    watcher: Watcher,
) {
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
            serve_http(shared, conn, builder, TokioIo::new(tls), watcher).await;
        }
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
    if let Err(e) = watcher.watch(connection).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// hyper's executor for the tasks of a connection (one per HTTP/2 stream; upgrade pipes).
///
/// The task is polled once at once, inside the connection task that hands it over, with a
/// no-op waker; only when it is not finished then (it waits for a backend, a file, a request
/// body or flow-control window) is it spawned on the runtime, where its first poll registers
/// the real waker (a future re-checks its state on every poll, so nothing that happened in
/// between is missed). A response that is ready at once (cache hit, cached static file, fixed
/// reply, refusal) is answered without a task, a scheduler round trip or a cross-task wake-up;
/// its frames are queued on the connection, which writes them in the same poll. The limits
/// are unchanged: hyper accepts the stream (bounded by `max_concurrent_streams`) before
/// calling this, and the request pipeline takes its backpressure slot inside the task.
///
/// A panic in that first poll is caught and ends only that stream (as in a spawned task).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamExecutor;

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut = Box::pin(fut);
        let mut cx = Context::from_waker(Waker::noop());
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fut.as_mut().poll(&mut cx).is_pending()
        }));
        match first {
            Ok(true) => drop(tokio::spawn(fut)),
            Ok(false) => {}
            Err(_) => tracing::error!("a connection task panicked in its first poll"),
        }
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

        // A panic in the first poll ends that task only.
        StreamExecutor.execute(async {
            panic!("boom");
        });
    }
}
