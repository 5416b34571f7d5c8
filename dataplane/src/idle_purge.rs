//! When to give the allocator's freed pages back to the OS: at once when the dataplane goes
//! idle or has applied a config, and not while it serves.
//!
//! mimalloc returns a freed page to the OS (`MADV_DONTNEED`) `purge_delay` after it was freed
//! (1 s by default), and only when a thread next allocates a page: under load that spares the
//! page faults of memory freed and needed again a moment later (issue 23: 1.7 page faults and
//! ~15 % of the CPU per proxied HTTP/2 request with the delay at 0), but an idle dataplane
//! allocates nothing, so it would keep what a burst of load or the previous config freed.
//! [`run`] watches the runtime: when a tick finds the workers were busy, the next tick that
//! finds them idle (less than [`ACTIVE_BUSY`] of work in [`TICK`]) calls `collect` once (the
//! binary's `mi_collect(true)`: the calling thread's empty pages back to the arenas, and every
//! arena's freed pages back to the OS at once, whichever thread freed them); a config apply
//! (counted by the reload metrics) calls it at the next tick, busy or not. An idle dataplane
//! does nothing more until it serves again, so freed memory is returned within ~2 ticks of
//! the load stopping. Measured in docs/benchmarks.md, "Memory under bulk load".

use crate::state::Shared;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often [`run`] looks at the runtime.
pub const TICK: Duration = Duration::from_millis(500);

/// Work within one [`TICK`] (summed over the runtime's workers) that counts as activity: far
/// above what an idle dataplane does in a tick (this task's own wake-up, a timer), far below
/// what one request per tick costs once TLS is involved.
pub const ACTIVE_BUSY: Duration = Duration::from_millis(1);

/// The decision of [`run`], apart from the clock and the runtime: fed the workers' total busy
/// time and the count of config applies at each tick, it says when to collect.
#[derive(Debug)]
pub struct IdleCollector {
    busy: Duration,
    applies: u64,
    /// Work was seen since the last collect.
    dirty: bool,
}

impl IdleCollector {
    /// Starts from the current totals (a collect just happened, or nothing needs one).
    pub fn new(busy: Duration, applies: u64) -> Self {
        Self {
            busy,
            applies,
            dirty: false,
        }
    }

    /// One tick: `busy` is the workers' total busy time so far, `applies` the config applies
    /// so far (both only grow). Whether to collect now: after an apply at once, after work
    /// once a tick shows none.
    pub fn tick(&mut self, busy: Duration, applies: u64) -> bool {
        let active = busy.saturating_sub(self.busy) >= ACTIVE_BUSY;
        self.busy = busy;
        if applies != self.applies {
            self.applies = applies;
            self.dirty = false;
            return true;
        }
        if active {
            self.dirty = true;
            return false;
        }
        std::mem::take(&mut self.dirty)
    }

    /// A collect took `took` of a worker's time: that is not activity to collect after.
    pub fn collected(&mut self, took: Duration) {
        self.busy += took;
    }
}

/// The total busy time of the current runtime's workers.
pub fn busy_total() -> Duration {
    let m = tokio::runtime::Handle::current().metrics();
    (0..m.num_workers())
        .map(|w| m.worker_total_busy_duration(w))
        .sum()
}

/// Config applies so far, successful or not (each builds, and drops, a config's worth).
fn applies(shared: &Shared) -> u64 {
    shared.metrics.reloads_ok.load(Relaxed) + shared.metrics.reloads_failed.load(Relaxed)
}

/// Calls `collect` on this runtime's thread whenever [`IdleCollector`] says so, forever.
/// Started once the first config serves, right after a collect.
pub async fn run(shared: Arc<Shared>, collect: fn()) {
    let mut state = IdleCollector::new(busy_total(), applies(&shared));
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if state.tick(busy_total(), applies(&shared)) {
            let t = Instant::now();
            collect();
            state.collected(t.elapsed());
            tracing::trace!(took = ?t.elapsed(), "freed memory returned");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn collects_once_after_work_when_a_tick_is_idle() {
        let mut c = IdleCollector::new(Duration::ZERO, 1);
        // Idle from the start: nothing to collect.
        assert!(!c.tick(Duration::ZERO, 1));
        assert!(!c.tick(MS / 10, 1));
        // Load: never while it lasts.
        assert!(!c.tick(300 * MS, 1));
        assert!(!c.tick(700 * MS, 1));
        // The first idle tick collects, once.
        assert!(c.tick(700 * MS + MS / 2, 1));
        c.collected(3 * MS);
        // The collect's own time is not activity; staying idle collects nothing more.
        assert!(!c.tick(703 * MS + MS / 2, 1));
        assert!(!c.tick(703 * MS + MS / 2, 1));
        // Load again, then idle again: one more.
        assert!(!c.tick(900 * MS, 1));
        assert!(c.tick(900 * MS, 1));
        assert!(!c.tick(900 * MS, 1));
    }

    #[test]
    fn an_apply_collects_at_the_next_tick_under_load_or_not() {
        let mut c = IdleCollector::new(Duration::ZERO, 1);
        assert!(c.tick(Duration::ZERO, 2));
        assert!(!c.tick(Duration::ZERO, 2));
        // Under load: at once, and the load seen before it is then forgotten...
        assert!(!c.tick(100 * MS, 2));
        assert!(c.tick(200 * MS, 3));
        assert!(!c.tick(200 * MS, 3));
        // ...but load after it collects when it stops.
        assert!(!c.tick(300 * MS, 3));
        assert!(c.tick(300 * MS, 3));
    }

    #[test]
    fn work_below_the_threshold_is_idle() {
        let mut c = IdleCollector::new(Duration::ZERO, 0);
        let mut busy = Duration::ZERO;
        for _ in 0..100 {
            busy += ACTIVE_BUSY - Duration::from_micros(1);
            assert!(!c.tick(busy, 0));
        }
        busy += ACTIVE_BUSY;
        assert!(!c.tick(busy, 0));
        assert!(c.tick(busy, 0));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn busy_total_grows_with_work_on_the_runtime() {
        let before = busy_total();
        // Busy without yielding, then park once so the worker publishes its busy time.
        let t = Instant::now();
        while t.elapsed() < 5 * MS {
            std::hint::spin_loop();
        }
        tokio::time::sleep(MS).await;
        assert!(busy_total() >= before + 5 * MS);
    }
}
