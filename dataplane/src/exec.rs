//! How connection tasks run their streams: hyper's executor ([`StreamExecutor`]) polls each
//! stream once inline and spawns it only if it waits, and [`Batched`] answers every stream of
//! one read before the connection writes. Used by the listeners and the snapshot's hyper
//! builder; imports nothing of the dataplane's upper layers.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use sweety_h2::first_poll::{first_poll, INLINE_FIRST_POLLS};

/// A connection task's stream futures, not yet polled.
type Deferred = Vec<Pin<Box<dyn Future<Output = ()> + Send>>>;

thread_local! {
    /// Stream futures handed to [`StreamExecutor`] while a [`Batched`] connection is polled
    /// on this thread; `None` outside such a poll.
    pub(crate) static DEFERRED: RefCell<Option<Deferred>> = const { RefCell::new(None) };
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

/// [`first_poll`] for hyper's stream tasks, which nobody awaits.
pub(crate) fn spawn_unless_ready(fut: Pin<Box<dyn Future<Output = ()> + Send>>) {
    drop(first_poll(fut));
}

/// Most rounds (connection poll, then its new streams' first polls) in one poll of
/// [`Batched`] before it yields to the runtime.
const BATCH_ROUNDS: usize = 8;

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
