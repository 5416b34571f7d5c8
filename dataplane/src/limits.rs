//! The backpressure core shared by every protocol (H1, H2 and H3):
//!
//! * a global cap on open connections: the TCP accept loop waits for a [`ConnPermit`] before
//!   it accepts, so a full server stops accepting instead of failing connections; QUIC takes
//!   the same permit without waiting and refuses the connection attempt when none is free;
//! * global and per-listener caps on requests in flight: a request waits a bounded time for a
//!   slot ([`Backpressure::admit`]) and is answered 503 with `Retry-After` when none frees up;
//! * request bodies limited in size and idle time ([`LimitedBody`]);
//! * every limit hit counted in metrics by limit name.
//!
//! Permits are RAII guards: dropping the response body (after it is sent or the client went
//! away) releases the request's slot.

use crate::body::{Body, BoxError};
use crate::metrics::Metrics;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A resizable counting limit.
#[derive(Debug)]
pub struct Limit {
    sem: Arc<Semaphore>,
    max: std::sync::Mutex<usize>,
}

impl Limit {
    /// A limit of `max` concurrent holders.
    pub fn new(max: usize) -> Limit {
        Limit {
            sem: Arc::new(Semaphore::new(max)),
            max: std::sync::Mutex::new(max),
        }
    }

    /// Changes the maximum. Lowering it takes effect as current holders release.
    pub fn resize(&self, new_max: usize) {
        let mut max = self.max.lock().unwrap_or_else(|e| e.into_inner());
        if new_max > *max {
            self.sem.add_permits(new_max - *max);
        } else if new_max < *max {
            let mut excess = *max - new_max;
            excess -= self.sem.forget_permits(excess);
            if excess > 0 {
                // Reclaim the rest as holders release them.
                let sem = self.sem.clone();
                tokio::spawn(async move {
                    if let Ok(p) = sem.acquire_many_owned(excess as u32).await {
                        p.forget();
                    }
                });
            }
        }
        *max = new_max;
    }

    /// Takes a slot now if one is free.
    pub fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_owned().ok()
    }

    /// Waits up to `wait` for a slot.
    pub async fn acquire_within(&self, wait: Duration) -> Option<OwnedSemaphorePermit> {
        if let Some(p) = self.try_acquire() {
            return Some(p);
        }
        tokio::time::timeout(wait, self.sem.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Waits for a slot however long it takes.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        self.sem
            .clone()
            .acquire_owned()
            .await
            .expect("limit semaphores are never closed")
    }

    /// Free slots now.
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }
}

/// A held connection slot; also counts the connection as active in metrics.
#[derive(Debug)]
pub struct ConnPermit {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.metrics.active_connections.fetch_sub(1, Relaxed);
    }
}

/// A held request slot (global and per-listener); also counts the request as active.
#[derive(Debug)]
pub struct RequestPermit {
    _global: OwnedSemaphorePermit,
    _listener: Option<OwnedSemaphorePermit>,
    metrics: Arc<Metrics>,
}

impl Drop for RequestPermit {
    fn drop(&mut self) {
        self.metrics.active_requests.fetch_sub(1, Relaxed);
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// The global in-flight cap stayed full for the whole queue timeout.
    Global,
    /// The listener's in-flight cap stayed full.
    Listener,
}

/// The process-wide backpressure state. It outlives config reloads; limits are resized in
/// place when a new config changes them.
#[derive(Debug)]
pub struct Backpressure {
    connections: Limit,
    requests: Limit,
    metrics: Arc<Metrics>,
}

impl Backpressure {
    /// Creates the core with the given caps.
    pub fn new(max_connections: usize, max_requests: usize, metrics: Arc<Metrics>) -> Backpressure {
        Backpressure {
            connections: Limit::new(max_connections),
            requests: Limit::new(max_requests),
            metrics,
        }
    }

    /// Applies new caps from a reloaded config.
    pub fn resize(&self, max_connections: usize, max_requests: usize) {
        self.connections.resize(max_connections);
        self.requests.resize(max_requests);
    }

    /// Waits for a connection slot (the accept loop calls this before `accept`). A wait that
    /// does not succeed at once is counted as a `max_connections` hit.
    pub async fn connection(&self) -> ConnPermit {
        let permit = match self.connections.try_acquire() {
            Some(p) => p,
            None => {
                self.metrics.limit_hit("max_connections");
                self.connections.acquire().await
            }
        };
        self.metrics.active_connections.fetch_add(1, Relaxed);
        self.metrics.connections_total.fetch_add(1, Relaxed);
        ConnPermit {
            _permit: permit,
            metrics: self.metrics.clone(),
        }
    }

    /// Takes a connection slot now if one is free; otherwise counts a `max_connections` hit.
    /// For QUIC, where a connection attempt that cannot be served is refused at once rather
    /// than left queued.
    pub fn try_connection(&self) -> Option<ConnPermit> {
        let Some(permit) = self.connections.try_acquire() else {
            self.metrics.limit_hit("max_connections");
            return None;
        };
        self.metrics.active_connections.fetch_add(1, Relaxed);
        self.metrics.connections_total.fetch_add(1, Relaxed);
        Some(ConnPermit {
            _permit: permit,
            metrics: self.metrics.clone(),
        })
    }

    /// [`Backpressure::admit`] without waiting: the permit if both slots are free now, else
    /// `None` (nothing counted, no slot kept: then `admit` waits). A request admitted here
    /// builds no waiting future at all.
    pub fn try_admit(&self, listener: Option<&Limit>) -> Option<RequestPermit> {
        let global = self.requests.try_acquire()?;
        let listener_permit = match listener {
            Some(l) => Some(l.try_acquire()?),
            None => None,
        };
        Some(self.request_permit(global, listener_permit))
    }

    /// The permit of an admitted request, counted as active until dropped.
    fn request_permit(
        &self,
        global: OwnedSemaphorePermit,
        listener: Option<OwnedSemaphorePermit>,
    ) -> RequestPermit {
        self.metrics.active_requests.fetch_add(1, Relaxed);
        RequestPermit {
            _global: global,
            _listener: listener,
            metrics: self.metrics.clone(),
        }
    }

    /// Admits a request: takes a global slot and, if the listener has its own cap, a listener
    /// slot, each waiting at most `wait`. Counts the limit hit on failure.
    pub async fn admit(
        &self,
        listener: Option<&Limit>,
        wait: Duration,
    ) -> Result<RequestPermit, Rejected> {
        let Some(global) = self.requests.acquire_within(wait).await else {
            self.metrics.limit_hit("max_requests_in_flight");
            return Err(Rejected::Global);
        };
        let listener_permit = match listener {
            Some(l) => match l.acquire_within(wait).await {
                Some(p) => Some(p),
                None => {
                    self.metrics.limit_hit("listener_requests_in_flight");
                    return Err(Rejected::Listener);
                }
            },
            None => None,
        };
        Ok(self.request_permit(global, listener_permit))
    }
}

/// The error a [`LimitedBody`] fails with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyLimitError {
    /// More bytes than `max_request_body_bytes`.
    #[error("request body larger than the limit")]
    TooLarge,
    /// No data for longer than `body_idle_timeout`.
    #[error("request body idle for longer than the limit")]
    IdleTimeout,
}

impl BodyLimitError {
    /// The answer to a request that broke this limit: 413 or 408.
    pub fn response(self) -> http::Response<Body> {
        match self {
            BodyLimitError::TooLarge => crate::body::text_response(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                "413 Payload Too Large\n",
            ),
            BodyLimitError::IdleTimeout => crate::body::text_response(
                http::StatusCode::REQUEST_TIMEOUT,
                "408 Request Timeout\n",
            ),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request body with a size cap and an idle timeout between frames; counts bytes
    /// received in metrics and in the request's own count (`received`, read by the
    /// per-route byte counters and the access log when the response ends).
    pub struct LimitedBody {
        #[pin]
        inner: Body,
        remaining: u64,
        idle: Duration,
        #[pin]
        timer: Option<tokio::time::Sleep>,
        metrics: Arc<Metrics>,
        received: Option<Arc<AtomicU64>>,
    }
}

impl LimitedBody {
    /// Wraps `inner`; the bytes read are added to `received` too, when given.
    pub fn new(
        inner: Body,
        max_bytes: u64,
        idle: Duration,
        metrics: Arc<Metrics>,
        received: Option<Arc<AtomicU64>>,
    ) -> LimitedBody {
        LimitedBody {
            inner,
            remaining: max_bytes,
            idle,
            timer: None,
            metrics,
            received,
        }
    }
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.timer.set(None);
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    this.metrics.bytes_received.fetch_add(n, Relaxed);
                    if let Some(r) = this.received.as_ref() {
                        r.fetch_add(n, Relaxed);
                    }
                    if n > *this.remaining {
                        this.metrics.limit_hit("body_too_large");
                        return Poll::Ready(Some(Err(Box::new(BodyLimitError::TooLarge))));
                    }
                    *this.remaining -= n;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                if this.timer.is_none() {
                    this.timer.set(Some(tokio::time::sleep(*this.idle)));
                }
                if let Some(t) = this.timer.as_mut().as_pin_mut() {
                    if t.poll(cx).is_ready() {
                        this.metrics.limit_hit("body_idle_timeout");
                        return Poll::Ready(Some(Err(Box::new(BodyLimitError::IdleTimeout))));
                    }
                }
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn admits_up_to_the_cap_then_rejects_after_the_wait() {
        let m = Arc::new(Metrics::default());
        let bp = Backpressure::new(10, 2, m.clone());
        let a = bp.admit(None, Duration::from_millis(10)).await.unwrap();
        let _b = bp.admit(None, Duration::from_millis(10)).await.unwrap();
        assert_eq!(
            bp.admit(None, Duration::from_millis(20)).await.unwrap_err(),
            Rejected::Global
        );
        assert_eq!(m.limit_rejections.get(&"max_requests_in_flight"), 1);
        assert_eq!(m.active_requests.load(Relaxed), 2);
        drop(a);
        assert!(bp.admit(None, Duration::from_millis(10)).await.is_ok());
    }

    #[tokio::test]
    async fn a_waiting_request_gets_a_slot_freed_within_the_wait() {
        let m = Arc::new(Metrics::default());
        let bp = Arc::new(Backpressure::new(10, 1, m));
        let held = bp.admit(None, Duration::ZERO).await.unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(held);
        });
        assert!(bp.admit(None, Duration::from_secs(5)).await.is_ok());
    }

    #[tokio::test]
    async fn listener_cap_applies_on_top_of_the_global_one() {
        let m = Arc::new(Metrics::default());
        let bp = Backpressure::new(10, 100, m.clone());
        let l = Limit::new(1);
        let _a = bp.admit(Some(&l), Duration::ZERO).await.unwrap();
        assert_eq!(
            bp.admit(Some(&l), Duration::from_millis(5))
                .await
                .unwrap_err(),
            Rejected::Listener
        );
        assert_eq!(m.limit_rejections.get(&"listener_requests_in_flight"), 1);
        // The global slot taken by the rejected request was given back.
        assert_eq!(bp.requests.available(), 99);
    }

    #[tokio::test]
    async fn try_admit_takes_free_slots_or_nothing() {
        let m = Arc::new(Metrics::default());
        let bp = Backpressure::new(10, 2, m.clone());
        let l = Limit::new(1);
        let a = bp.try_admit(Some(&l)).expect("both slots free");
        assert_eq!(m.active_requests.load(Relaxed), 1);
        // The listener is full: nothing kept, nothing counted (admit counts after its wait).
        assert!(bp.try_admit(Some(&l)).is_none());
        assert_eq!(bp.requests.available(), 1);
        assert_eq!(m.limit_rejections.get(&"listener_requests_in_flight"), 0);
        let b = bp.try_admit(None).expect("a global slot");
        assert!(bp.try_admit(None).is_none());
        assert_eq!(m.active_requests.load(Relaxed), 2);
        drop((a, b));
        assert_eq!(m.active_requests.load(Relaxed), 0);
        assert_eq!((bp.requests.available(), l.available()), (2, 1));
    }

    #[tokio::test]
    async fn resize_grows_and_shrinks() {
        let l = Limit::new(2);
        l.resize(4);
        assert_eq!(l.available(), 4);
        l.resize(1);
        assert_eq!(l.available(), 1);
    }

    #[tokio::test]
    async fn limited_body_caps_size() {
        let m = Arc::new(Metrics::default());
        let body = LimitedBody::new(
            crate::body::full(vec![0u8; 100]),
            10,
            Duration::from_secs(5),
            m.clone(),
            None,
        );
        let err = body.collect().await.unwrap_err();
        assert_eq!(
            err.downcast_ref::<BodyLimitError>(),
            Some(&BodyLimitError::TooLarge)
        );
        assert_eq!(m.limit_rejections.get(&"body_too_large"), 1);
    }

    #[tokio::test]
    async fn limited_body_times_out_when_idle() {
        let m = Arc::new(Metrics::default());
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream = http_body_util::StreamBody::new(futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
        ));
        let body = LimitedBody::new(
            crate::body::boxed(stream),
            1000,
            Duration::from_millis(30),
            m.clone(),
            None,
        );
        let err = body.collect().await.unwrap_err();
        assert_eq!(
            err.downcast_ref::<BodyLimitError>(),
            Some(&BodyLimitError::IdleTimeout)
        );
    }
}
