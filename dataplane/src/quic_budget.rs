//! One budget for the response data quinn holds ahead of acknowledgements, shared by every
//! HTTP/3 connection of the process (`http3.send_budget`), so that memory under many bulk
//! downloads is bounded across connections, not only per connection.
//!
//! quinn buffers what a connection's streams write until the client acknowledges it, up to
//! the connection's send window (`quinn::Connection::set_send_window`). A connection with a
//! response in flight is *active*; the active connections share the budget:
//!
//! * every active connection's window is `clamp(budget / cap, MIN_SHARE, http3.send_window)`,
//!   where `cap` is a power of two at least the number of active connections (so a lone
//!   connection keeps its full `send_window` when the budget allows it);
//! * when the active count grows past `cap`, `cap` doubles and every active connection's
//!   window is lowered at once (a sweep: amortised O(1) per activation); when the count
//!   falls to a quarter of `cap` (or to one), `cap` follows it down and windows grow at each
//!   connection's next write ([`ConnShare::refresh`]), so no sweep is needed;
//! * a connection with no response in flight goes back to `MIN_SHARE`.
//!
//! Since at most `cap` connections are active and none has a window over `budget / cap` (or
//! `MIN_SHARE`), the windows of all connections together never exceed
//! `max(budget, active × MIN_SHARE) + idle × MIN_SHARE` ([`SendBudget::granted`] counts
//! them). Data already written stays buffered until acknowledged when a window is lowered:
//! quinn only refuses new writes past it.
//!
//! The state quinn keeps for the packets it sent and a client has not acknowledged (kept
//! packets, their frames, the streams' range sets; at most the connection's `send_window` and
//! 384 KiB each) has a process-wide budget too, the same `http3.send_budget`: every
//! connection of every listener counts it in one [`quinn_proto::SentStateTotal`]
//! ([`crate::state::Shared`]`::quic_sent_state`, in each listener's transport config). It is
//! not a split of the windows above: a share is given back once the response is written,
//! before it is acknowledged, and a lowered window frees nothing sent, so the state a client
//! leaves unacknowledged outlives the share it was sent under. Instead the vendored
//! quinn-proto counts what is kept: each connection adds its state to the total when it moved
//! 16 KiB (one atomic add, no lock), and while the total is at its budget a connection
//! holding 32 KiB or more sends no new data (probes and ACKs still go) and is closed only if
//! its own state grows 32 KiB past what it held then (never because others filled the
//! total). With `n` connections all of them keep at most `send_budget + n × ~88 KiB`
//! (instead of `n × 896 KiB` with the defaults); the vendored module `sent_state_total` has
//! the design and the arithmetic, which the tests below check.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The smallest window a connection is given: one 16 KiB chunk can always be in flight, so
/// every connection makes progress however many share the budget.
pub const MIN_SHARE: u64 = 16 * 1024;

/// Where a window is set: quinn's connection in the server, a recorder in unit tests.
pub trait Window: Send + Sync + 'static {
    /// Sets the connection's send window, bytes.
    fn set(&self, bytes: u64);
}

impl Window for quinn::Connection {
    fn set(&self, bytes: u64) {
        self.set_send_window(bytes);
    }
}

/// The process-wide budget (one in [`crate::state::Shared`]).
pub struct SendBudget {
    /// `http3.send_budget` of the latest config a connection started under.
    total: AtomicU64,
    /// The current `cap` (see the module docs); read without the lock by `refresh`.
    cap: AtomicUsize,
    active: Mutex<Active>,
    next_id: AtomicU64,
    /// The windows of all connections right now, summed.
    granted: AtomicU64,
    /// The largest `granted` seen.
    peak: AtomicU64,
}

struct Active {
    conns: HashMap<u64, Arc<dyn ShareOf>>,
}

/// What a sweep needs of an active connection.
trait ShareOf: Send + Sync {
    fn lower_to(&self, share: u64);
}

impl Default for SendBudget {
    fn default() -> Self {
        SendBudget {
            total: AtomicU64::new(u64::MAX),
            cap: AtomicUsize::new(1),
            active: Mutex::new(Active {
                conns: HashMap::new(),
            }),
            next_id: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }
}

impl SendBudget {
    /// Send-window bytes granted to all connections right now (the sum of their windows).
    pub fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }

    /// The largest [`SendBudget::granted`] so far.
    pub fn peak_granted(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn add_granted(&self, from: u64, to: u64) {
        if to >= from {
            let now = self.granted.fetch_add(to - from, Ordering::Relaxed) + (to - from);
            self.peak.fetch_max(now, Ordering::Relaxed);
        } else {
            self.granted.fetch_sub(from - to, Ordering::Relaxed);
        }
    }

    /// Follows the config's `http3.send_budget` (called as connections start).
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
    }

    /// The per-connection share at `cap`, before the connection's own `send_window` cap.
    fn share(&self, cap: usize) -> u64 {
        (self.total.load(Ordering::Relaxed) / cap.max(1) as u64).max(MIN_SHARE)
    }

    /// The share of a connection of the process right now, capped at its `max`.
    fn current(&self, max: u64) -> u64 {
        self.share(self.cap.load(Ordering::Acquire))
            .min(max)
            .max(MIN_SHARE)
    }

    /// A connection's handle on the budget; its window starts at [`MIN_SHARE`].
    pub fn connection<W: Window>(self: &Arc<Self>, window: W, max: u64) -> Arc<ConnShare<W>> {
        window.set(MIN_SHARE);
        self.add_granted(0, MIN_SHARE);
        Arc::new(ConnShare {
            budget: self.clone(),
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            window,
            max: max.max(MIN_SHARE),
            granted: AtomicU64::new(MIN_SHARE),
            in_flight: Mutex::new(0),
        })
    }
}

/// One connection's part of the budget: clone the `Arc` into its requests; each holds a
/// [`Responding`] while its response is being produced and sent.
pub struct ConnShare<W: Window> {
    budget: Arc<SendBudget>,
    id: u64,
    window: W,
    /// `http3.send_window`: the most this connection is given.
    max: u64,
    /// The window last set.
    granted: AtomicU64,
    /// Responses in flight; guards the join and leave of the active set.
    in_flight: Mutex<u32>,
}

impl<W: Window> ConnShare<W> {
    /// Sets the window to `to` if it differs (counted in [`SendBudget::granted`]).
    fn set(&self, to: u64) {
        let from = self.granted.swap(to, Ordering::AcqRel);
        if from != to {
            self.window.set(to);
            self.budget.add_granted(from, to);
        }
    }

    /// Marks a response in flight until the returned guard drops. The first one makes the
    /// connection active: it joins the budget, sweeping the others' windows down if the
    /// active count outgrew `cap`.
    pub fn responding(self: &Arc<Self>) -> Responding<W> {
        let mut n = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        if *n == 1 {
            let budget = &self.budget;
            let mut active = budget.active.lock().unwrap_or_else(|e| e.into_inner());
            active.conns.insert(self.id, self.clone());
            let count = active.conns.len();
            let mut cap = budget.cap.load(Ordering::Relaxed);
            if count > cap {
                while count > cap {
                    cap *= 2;
                }
                budget.cap.store(cap, Ordering::Release);
                let share = budget.share(cap);
                for c in active.conns.values() {
                    c.lower_to(share);
                }
            }
            self.set(budget.current(self.max));
        }
        Responding(self.clone())
    }

    /// Grows (or lowers) the window to the current share; one atomic comparison when nothing
    /// changed. Called before each write of a response.
    pub fn refresh(&self) {
        if self.granted.load(Ordering::Relaxed) == self.budget.current(self.max) {
            return;
        }
        // Under both locks (this order, as in `responding`), so that a sweep cannot run
        // between reading the share and setting it.
        let n = self.lock_in_flight();
        let _active = self.budget.active.lock().unwrap_or_else(|e| e.into_inner());
        if *n > 0 {
            self.set(self.budget.current(self.max));
        }
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, u32> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The window set now, bytes.
    pub fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }
}

impl<W: Window> ShareOf for ConnShare<W> {
    fn lower_to(&self, share: u64) {
        let to = share.min(self.max).max(MIN_SHARE);
        if self.granted.load(Ordering::Relaxed) > to {
            self.set(to);
        }
    }
}

impl<W: Window> Drop for ConnShare<W> {
    fn drop(&mut self) {
        self.budget.add_granted(*self.granted.get_mut(), 0);
    }
}

/// A response in flight on a connection (see [`ConnShare::responding`]).
pub struct Responding<W: Window>(Arc<ConnShare<W>>);

impl<W: Window> Drop for Responding<W> {
    fn drop(&mut self) {
        let share = &self.0;
        let mut n = share.lock_in_flight();
        *n -= 1;
        if *n == 0 {
            let budget = &share.budget;
            let mut active = budget.active.lock().unwrap_or_else(|e| e.into_inner());
            active.conns.remove(&share.id);
            let count = active.conns.len();
            let cap = budget.cap.load(Ordering::Relaxed);
            if count <= cap / 4 || count <= 1 {
                // Windows grow at each connection's next write (`refresh`).
                budget
                    .cap
                    .store(count.next_power_of_two().max(1), Ordering::Release);
            }
            drop(active);
            share.set(MIN_SHARE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn_proto::sent_state_total::SentStateShare;
    use quinn_proto::SentStateTotal;
    use std::sync::atomic::AtomicU64;

    /// Records the window a connection was given.
    #[derive(Clone, Default)]
    struct Rec(Arc<AtomicU64>);

    impl Window for Rec {
        fn set(&self, bytes: u64) {
            self.0.store(bytes, Ordering::Relaxed);
        }
    }

    const KIB: u64 = 1024;

    fn budget(total: u64) -> Arc<SendBudget> {
        let b = Arc::new(SendBudget::default());
        b.set_total(total);
        b
    }

    #[test]
    fn a_lone_connection_keeps_its_full_window_and_idles_at_the_minimum() {
        let b = budget(8192 * KIB);
        let rec = Rec::default();
        let c = b.connection(rec.clone(), 512 * KIB);
        assert_eq!(rec.0.load(Ordering::Relaxed), MIN_SHARE);
        let r1 = c.responding();
        let r2 = c.responding();
        assert_eq!(rec.0.load(Ordering::Relaxed), 512 * KIB);
        drop(r1);
        assert_eq!(c.granted(), 512 * KIB, "still one response in flight");
        drop(r2);
        assert_eq!(rec.0.load(Ordering::Relaxed), MIN_SHARE);
        // A budget under the window caps the lone connection too.
        let small = budget(100 * KIB);
        let c = small.connection(Rec::default(), 512 * KIB);
        let _r = c.responding();
        assert_eq!(c.granted(), 100 * KIB);
    }

    /// A connection of the sent-state arithmetic: its state and its part of the total.
    struct Sim {
        state: u64,
        share: SentStateShare,
    }

    /// Each connection's own budget and limit of sent-packet state with the defaults
    /// (`send_window` 512 KiB + 256 KiB, + 128 KiB), and the most one packet adds.
    const OWN_BUDGET: u64 = 768 * KIB;
    const OWN_LIMIT: u64 = 896 * KIB;
    const PACKET: u64 = 4 * KIB;

    /// Every connection sends (a packet at each check its budget allows) until none may:
    /// hostile clients acknowledging nothing. Returns the packets sent.
    fn fill(total: &SentStateTotal, conns: &mut [Sim]) -> u64 {
        let mut sent = 0;
        loop {
            let mut any = false;
            for c in conns.iter_mut() {
                c.share.check(total, c.state);
                if c.state < c.share.budget(OWN_BUDGET) {
                    c.state += PACKET;
                    sent += 1;
                    any = true;
                }
            }
            if !any {
                return sent;
            }
        }
    }

    #[test]
    fn the_sent_state_of_all_connections_stays_under_the_total_and_a_small_share_each() {
        use quinn_proto::sent_state_total::{EXCESS, FLOOR, FLUSH};
        let budget = 8192 * KIB;
        let total = SentStateTotal::new(budget);
        let n = 100u64;
        let mut conns: Vec<_> = (0..n)
            .map(|_| Sim {
                state: 0,
                share: SentStateShare::default(),
            })
            .collect();
        fill(&total, &mut conns);
        let sum: u64 = conns.iter().map(|c| c.state).sum();
        // The formula of the module docs; without the total each would keep its own budget
        // (n × 772 KiB, ~75 MiB).
        let bound = budget + n * (FLUSH + FLOOR + EXCESS + 2 * PACKET);
        assert!(sum <= bound, "{sum} bytes kept, over {bound}");
        assert!(sum >= budget, "the total filled: {sum}");
        // What was reported is within FLUSH a connection of what is kept.
        assert!(total.total().abs_diff(sum) <= n * FLUSH);
        // Every connection got at least the floor: none starved.
        assert!(conns.iter().all(|c| c.state >= FLOOR));
        // None is over its limit (none closed).
        for c in &mut conns {
            c.share.check(&total, c.state);
            assert!(c.state <= c.share.limit(OWN_LIMIT));
        }
        // Leaving, each takes its report with it.
        for c in &mut conns {
            c.share.withdraw(&total);
        }
        assert_eq!(total.total(), 0);
    }

    #[test]
    fn a_connection_is_closed_only_for_its_own_excess_while_the_total_is_full() {
        use quinn_proto::sent_state_total::{ACK_ONLY, EXCESS, FLOOR};
        let total = SentStateTotal::new(1024 * KIB);
        // A holds 700 KiB, sent while the total had room; its limit is its own.
        let mut a = Sim {
            state: 700 * KIB,
            share: SentStateShare::default(),
        };
        a.share.check(&total, a.state);
        assert!(!a.share.full());
        assert_eq!(a.share.limit(OWN_LIMIT), OWN_LIMIT);
        assert_eq!(a.share.ack_only(1_000), 1_000);
        // Others fill the total: A may send no new data, but what it holds is not held
        // against it: its limit is still over its state, by EXCESS.
        let mut others: Vec<_> = (0..2)
            .map(|_| Sim {
                state: 0,
                share: SentStateShare::default(),
            })
            .collect();
        fill(&total, &mut others);
        a.share.check(&total, a.state);
        assert!(a.share.full());
        assert_eq!(a.share.budget(OWN_BUDGET), FLOOR);
        assert_eq!(a.share.limit(OWN_LIMIT), a.state + EXCESS);
        assert_eq!(a.share.ack_only(1_000), ACK_ONLY);
        // Acknowledgements free 600 KiB, which the others take: A's limit follows what it
        // holds down (never under FLOOR + EXCESS) and does not come back up with probes its
        // peer leaves unacknowledged.
        a.state -= 600 * KIB;
        a.share.check(&total, a.state);
        fill(&total, &mut others);
        a.share.check(&total, a.state);
        assert!(a.share.full(), "the others took what A released");
        assert_eq!(a.share.limit(OWN_LIMIT), 100 * KIB + EXCESS);
        a.state += EXCESS;
        a.share.check(&total, a.state);
        assert!(
            a.state <= a.share.limit(OWN_LIMIT),
            "EXCESS of probes is allowed"
        );
        a.state += PACKET;
        a.share.check(&total, a.state);
        assert!(a.state > a.share.limit(OWN_LIMIT), "past it, closed");
        // A connection under the floor sends new data while the total is full, up to it.
        let mut b = Sim {
            state: 0,
            share: SentStateShare::default(),
        };
        fill(&total, std::slice::from_mut(&mut b));
        assert!(b.state >= FLOOR && b.state < FLOOR + PACKET, "{}", b.state);
        assert!(b.state <= b.share.limit(OWN_LIMIT));
        // Once the total has room again, limits and budgets are each connection's own.
        for c in others.iter_mut().chain([&mut a, &mut b]) {
            c.share.withdraw(&total);
        }
        a.share.check(&total, a.state);
        assert!(!a.share.full());
        assert_eq!(a.share.limit(OWN_LIMIT), OWN_LIMIT);
        assert_eq!(a.share.budget(OWN_BUDGET), OWN_BUDGET);
    }

    #[test]
    fn active_windows_never_sum_past_the_budget_as_connections_come_and_go() {
        let total = 1024 * KIB;
        let b = budget(total);
        let conns: Vec<_> = (0..100)
            .map(|_| {
                let rec = Rec::default();
                (rec.clone(), b.connection(rec, 512 * KIB))
            })
            .collect();
        let sum = |conns: &[(Rec, Arc<ConnShare<Rec>>)]| {
            for (rec, c) in conns {
                assert_eq!(
                    rec.0.load(Ordering::Relaxed),
                    c.granted(),
                    "quinn got the window"
                );
            }
            conns.iter().map(|(_, c)| c.granted()).sum::<u64>()
        };
        let mut guards = Vec::new();
        for (i, (_, c)) in conns.iter().enumerate() {
            guards.push(c.responding());
            // Every window is at most max(budget / active, MIN_SHARE); idle ones MIN_SHARE.
            let active = i as u64 + 1;
            let bound = total.max(active * MIN_SHARE) + (100 - active) * MIN_SHARE;
            assert!(
                sum(&conns) <= bound,
                "{} active: {} > {bound}",
                active,
                sum(&conns)
            );
            // Writes refresh their windows; still within the bound.
            for (_, c) in &conns[..=i] {
                c.refresh();
            }
            assert!(sum(&conns) <= bound);
        }
        // 100 active, cap 128: each has 8 KiB -> MIN_SHARE.
        assert!(conns.iter().all(|(_, c)| c.granted() == MIN_SHARE));
        // 90 leave: the other 10 grow at their next write (cap 32 at 32 active, then kept
        // until 8: 32 KiB each).
        guards.drain(..90);
        for (_, c) in &conns[90..] {
            c.refresh();
        }
        assert_eq!(sum(&conns[90..]), 10 * total / 32);
        assert!(conns[90..].iter().all(|(_, c)| c.granted() == total / 32));
        assert!(conns[..90].iter().all(|(_, c)| c.granted() == MIN_SHARE));
        // One joins again: still within the budget, and the lone one left gets all it may.
        let again = conns[0].1.responding();
        assert!(sum(&conns[90..]) + conns[0].1.granted() <= total);
        drop(guards);
        conns[0].1.refresh();
        assert_eq!(conns[0].1.granted(), 512 * KIB);
        drop(again);
        assert_eq!(sum(&conns), 100 * MIN_SHARE);
        assert_eq!(
            b.granted(),
            100 * MIN_SHARE,
            "the budget's own count agrees"
        );
        assert!(b.peak_granted() <= total + 100 * MIN_SHARE);
        drop(conns);
        assert_eq!(b.granted(), 0);
    }
}
