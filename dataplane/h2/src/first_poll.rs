//! The first poll of a request future on the connection's own task: a ready answer (cache
//! hit, fixed reply, refusal) costs no task; one that waits is spawned.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Most stream first polls run inline in one poll of a connection, so one connection sending
/// cheap requests (cache hits, refusals) cannot hold a single-threaded worker away from the
/// accept loop and the other connections: past it, the dataplane's hyper executor spawns the
/// later streams of that poll, and this crate's driver stops handling frames and yields until
/// its next poll.
pub const INLINE_FIRST_POLLS: usize = 64;

/// What [`first_poll`] did with a future.
pub enum FirstPoll<T> {
    /// It finished in its first poll.
    Ready(T),
    /// It waits for something: it runs on as its own task.
    Spawned(tokio::task::JoinHandle<T>),
    /// It panicked (caught: only this future ends, as in a spawned task).
    Panicked,
}

/// Polls a request future once on the caller's task with a no-op waker, and spawns it when
/// it is not finished: its first poll on the runtime registers the real waker (a future
/// re-checks its state on every poll, so nothing that happened in between is missed). hyper's
/// HTTP/2 server answers ready requests this way, through the dataplane's stream executor; this
/// crate's [`crate::conn`] keeps every request future in its stream instead (never spawned),
/// with the same cap of [`INLINE_FIRST_POLLS`] first polls per connection poll.
pub fn first_poll<F>(mut fut: F) -> FirstPoll<F::Output>
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
