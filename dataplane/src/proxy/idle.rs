//! nginx's `proxy_send_timeout` / `proxy_read_timeout` for one try (`route.timeouts.send_idle`
//! / `read_idle`): clocks of the time the backend keeps us waiting between two successive
//! writes to it (reads from it), not deadlines of the whole request.
//!
//! Until the response head, a [`Clock`] follows the request: [`SendWatch`] wraps the request
//! body and records whether a chunk was handed to the connection and not taken yet (the
//! backend owes progress: `send_idle` runs from then), whether the whole request is out
//! (`read_idle` runs until the head arrives), or whether we wait for the client's next chunk
//! (no clock here: that is `limits.body_idle_timeout`). [`Clock::stalled`] resolves when the
//! running clock expires; the try then ends with [`ProxyError::Timeout`] (504).
//!
//! After the head, [`ReadIdle`] wraps the response body: its clock runs only while the
//! consumer waits for the backend's next chunk (a slow client does not count: that is
//! `limits.send_timeout`) and restarts at each chunk; when it expires the body fails, which
//! aborts the response (HTTP/1.1: the connection is closed; HTTP/2 and HTTP/3: the stream is
//! reset), as nginx does once the head has gone out.

use super::error::ProxyError;
use crate::body::{Body, BoxError};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// Where the request stands towards the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the client's next chunk: no clock of ours runs.
    Client,
    /// A chunk (or the head) was handed to the connection and not taken yet: `send_idle`.
    Writing,
    /// The whole request is out; waiting for the response head: `read_idle`.
    Sent,
}

/// The clock of one try until its response head.
#[derive(Debug)]
pub(super) struct Clock {
    rx: watch::Receiver<(Phase, Instant)>,
    send_idle: Option<Duration>,
    read_idle: Option<Duration>,
}

impl Clock {
    /// Starts the clock of a request about to be handed to a connection, and wraps its body
    /// (unchanged when neither timeout is set or the body is empty).
    pub(super) fn start(
        body: Body,
        send_idle: Option<Duration>,
        read_idle: Option<Duration>,
    ) -> (Body, Option<Clock>) {
        if send_idle.is_none() && read_idle.is_none() {
            return (body, None);
        }
        let done = http_body::Body::is_end_stream(&body);
        // The head is written first: the backend owes progress from now on.
        let phase = if done { Phase::Sent } else { Phase::Writing };
        let (tx, rx) = watch::channel((phase, Instant::now()));
        let body = if done {
            body
        } else {
            crate::body::boxed(SendWatch { inner: body, tx })
        };
        let clock = Clock {
            rx,
            send_idle,
            read_idle,
        };
        (body, Some(clock))
    }

    /// Resolves with the limit that elapsed when the backend kept the request waiting longer
    /// than `send_idle`, or kept us waiting for the head longer than `read_idle` after the
    /// request was out. Never resolves otherwise.
    pub(super) async fn stalled(mut self) -> Duration {
        let mut open = true;
        loop {
            let (phase, since) = *self.rx.borrow_and_update();
            let limit = match phase {
                Phase::Client => None,
                Phase::Writing => self.send_idle,
                Phase::Sent => self.read_idle,
            };
            let expiry = async {
                match limit {
                    Some(d) => tokio::time::sleep_until(since + d).await,
                    None => std::future::pending().await,
                }
            };
            if !open {
                expiry.await;
                return limit.unwrap_or_default();
            }
            tokio::select! {
                () = expiry => return limit.unwrap_or_default(),
                changed = self.rx.changed() => open = changed.is_ok(),
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The request body on its way to the backend, telling the [`Clock`] where it stands.
    struct SendWatch {
        #[pin]
        inner: Body,
        tx: watch::Sender<(Phase, Instant)>,
    }
}

impl http_body::Body for SendWatch {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        // Being asked for more means the connection took what it was handed.
        let polled = this.inner.as_mut().poll_frame(cx);
        let phase = match &polled {
            Poll::Pending => Phase::Client,
            Poll::Ready(Some(Ok(_))) if !this.inner.is_end_stream() => Phase::Writing,
            Poll::Ready(Some(Ok(_)) | None) => Phase::Sent,
            Poll::Ready(Some(Err(_))) => return polled,
        };
        this.tx.send_if_modified(|now| {
            // Waiting for the client again changes nothing; any chunk restarts the clock.
            if now.0 == phase && phase == Phase::Client {
                return false;
            }
            *now = (phase, Instant::now());
            true
        });
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A response body from the backend that fails after `idle` without a chunk while its
    /// consumer waits for one ([`ProxyError::Timeout`]).
    pub(super) struct ReadIdle {
        #[pin]
        inner: Body,
        idle: Duration,
        addr: String,
        #[pin]
        timer: Option<Sleep>,
    }
}

impl ReadIdle {
    /// Wraps the response body of `addr`.
    pub(super) fn wrap(inner: Body, idle: Duration, addr: &str) -> Body {
        crate::body::boxed(ReadIdle {
            inner,
            idle,
            addr: addr.to_string(),
            timer: None,
        })
    }
}

impl http_body::Body for ReadIdle {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Pending => {
                if this.timer.is_none() {
                    this.timer.set(Some(tokio::time::sleep(*this.idle)));
                }
                if let Some(t) = this.timer.as_mut().as_pin_mut() {
                    if t.poll(cx).is_ready() {
                        this.timer.set(None);
                        tracing::debug!(addr = %this.addr, "upstream response body idle; aborting");
                        let e = ProxyError::Timeout {
                            addr: std::mem::take(this.addr),
                            after: *this.idle,
                        };
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                }
                Poll::Pending
            }
            other => {
                this.timer.set(None);
                other
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
