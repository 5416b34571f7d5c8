//! Sweety patch (vendor/README.md): one budget for the sent-packet state of every connection
//! that shares a [`SentStateTotal`] (through its `TransportConfig`), so that what all of
//! them keep for peers that leave packets unacknowledged is bounded for the process, not
//! only for each connection.
//!
//! Each connection keeps an O(1) estimate of its sent-packet state `S` (its kept packets,
//! their spilled frames and retransmit boxes, its send streams' range entries:
//! `Connection::sent_state_bytes`), a budget `B` (`send_window` + 256 KiB) past which it sends
//! no new ACK-eliciting packet, and a limit `B` + 128 KiB past which it is closed
//! (PROTOCOL_VIOLATION). On top of that:
//!
//! * **What the total counts.** The sum of every connection's `S` as last reported. A
//!   connection reports at its checks (each ACK-eliciting datagram it starts, each 1-RTT
//!   packet it receives) only when `S` moved [`FLUSH`] (16 KiB) or more from what it
//!   reported, with one atomic add, and withdraws its report when dropped: no lock, and
//!   at most one atomic read-modify-write per 16 KiB of change. The total is within
//!   `FLUSH` per connection of the true sum.
//! * **Its budget** `T` (Sweety: `http3.send_budget`, the bytes of send window all
//!   connections share; a connection's own budget is likewise its window and a slack). The
//!   total is *full* when it is at `T` or more.
//! * **Past the budget, new data waits.** While the total is full, a connection holding
//!   [`FLOOR`] (32 KiB) or more starts no new ACK-eliciting packet (as at its own budget:
//!   retransmissions of lost data included, PTO probes and ACK-only packets still go, not
//!   counted as congestion-blocked); one under it still may, so every connection makes
//!   progress (32 KiB of state is ~120 full-size packets in flight) however full the total.
//!   And past [`ACK_ONLY`] (64) ACK-only packets kept in a space, instead of 1,001, the
//!   oldest is forgotten as each is sent (harmless: its acknowledgement only trims
//!   `pending_acks`, which any later acknowledgement also does), so a peer cannot grow the
//!   state by drawing ACKs.
//! * **What closes a connection: only its own excess.** While the total is full, a
//!   connection's limit becomes `min(its own limit, max(S, FLOOR) + EXCESS)` at each check,
//!   `S` read then ([`EXCESS`]: 32 KiB), and only goes down until the total is no longer full
//!   (then it is the connection's own limit again). At the check where the total is first
//!   seen full the limit is at least `S + EXCESS`: other connections filling the total never
//!   close a connection, they only stop its new data. It is closed only if, while it may
//!   send no new data, the state it keeps grows by `EXCESS` over what it held at a check:
//!   probes, ACK-only packets and range entries its peer leaves unacknowledged, which an
//!   honest peer acknowledges (or stops answering, and the PTO backs off: its idle timeout
//!   comes first).
//!
//! **The bound.** With `n` connections and `P` the most one packet adds (~4 KiB):
//! while the total is not full, `sum(S) <= T + n x (FLUSH + P)` (reports lag by less than
//! `FLUSH` and a packet). Once it is full, a connection's `S` stays under its limit,
//! `max(S at its first full check, FLOOR) + EXCESS`, and `S` at that check is at most what
//! it held when the total filled and a packet. So at all times
//!
//! `sum(S) <= T + n x (FLUSH + FLOOR + EXCESS + 2 P)`, ~88 KiB a connection,
//!
//! instead of `n x (B + 128 KiB)` (896 KiB a connection with Sweety's defaults). Between a
//! connection's checks only the packets it sends add to `S` (each ACK-eliciting datagram is a
//! check, and a peer that sends nothing gets only PTO probes, two per PTO with exponential
//! backoff) and the acknowledgements of the one packet being read (range entries: an
//! acknowledgement after a hole moves a packet's STREAM frames into them).
//!
//! Why not simply each connection's own budget following its share of the send window
//! (`http3.send_budget` split among the connections with a response in flight, Sweety's
//! `quic_budget`): a share is given back when the response is written, not when it is
//! acknowledged, and a lowered window frees nothing already sent, so the state of packets a
//! peer leaves unacknowledged outlives the share it was sent under; and the slack a
//! connection needs past its window (ACK-only packets, probes: 384 KiB) stays per
//! connection. The total above counts what is kept, not what was granted.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A connection reports its state to the total when it moved this much from its last report.
pub const FLUSH: u64 = 16 * 1024;
/// While the total is full, a connection holding less than this still sends new data.
pub const FLOOR: u64 = 32 * 1024;
/// While the total is full, a connection is closed once its state grows this much past what
/// it held at a check (or past [`FLOOR`]).
pub const EXCESS: u64 = 32 * 1024;
/// While the total is full, ACK-only packets kept per space past which the oldest is forgotten
/// as one is sent (1,000 otherwise).
pub const ACK_ONLY: u64 = 64;

/// The sent-packet state of all the connections sharing it, and its budget (module docs).
pub struct SentStateTotal {
    budget: AtomicU64,
    total: AtomicU64,
}

impl SentStateTotal {
    /// A total with this budget, bytes.
    pub fn new(budget: u64) -> Self {
        Self {
            budget: AtomicU64::new(budget),
            total: AtomicU64::new(0),
        }
    }

    /// Sets the budget, bytes (connections see it at their next check).
    pub fn set_budget(&self, budget: u64) {
        self.budget.store(budget, Ordering::Relaxed);
    }

    /// The budget, bytes.
    pub fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }

    /// The connections' state as last reported, summed, bytes.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Whether the total is at its budget or over.
    pub fn full(&self) -> bool {
        self.total() >= self.budget()
    }

    /// A connection's report moves from `from` to `to`.
    fn report(&self, from: u64, to: u64) {
        if to >= from {
            self.total.fetch_add(to - from, Ordering::Relaxed);
        } else {
            self.total.fetch_sub(from - to, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for SentStateTotal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentStateTotal")
            .field("budget", &self.budget())
            .field("total", &self.total())
            .finish()
    }
}

/// One connection's part of a [`SentStateTotal`]: what it reported and the limit it is held to
/// while the total is full. Public (hidden) for Sweety's unit tests of the arithmetic.
#[doc(hidden)]
#[derive(Debug)]
pub struct SentStateShare {
    /// What this connection added to the total.
    reported: u64,
    /// Whether the total was full at the last check.
    full: bool,
    /// While full: the least `max(S, FLOOR) + EXCESS` of the checks since it filled.
    held: u64,
}

impl Default for SentStateShare {
    fn default() -> Self {
        Self {
            reported: 0,
            full: false,
            held: u64::MAX,
        }
    }
}

impl SentStateShare {
    /// A check with the connection's state `bytes`: reports it if it moved [`FLUSH`] or more,
    /// and reads whether the total is full. Returns whether that changed.
    pub fn check(&mut self, total: &SentStateTotal, bytes: u64) -> bool {
        if bytes.abs_diff(self.reported) >= FLUSH {
            total.report(self.reported, bytes);
            self.reported = bytes;
        }
        let full = total.full();
        if full {
            self.held = self.held.min(bytes.max(FLOOR) + EXCESS);
        } else {
            self.held = u64::MAX;
        }
        let changed = full != self.full;
        self.full = full;
        changed
    }

    /// Whether the total was full at the last check.
    pub fn full(&self) -> bool {
        self.full
    }

    /// The state past which no new ACK-eliciting packet starts, given the connection's own.
    pub fn budget(&self, own: u64) -> u64 {
        if self.full { own.min(FLOOR) } else { own }
    }

    /// The state past which the connection is closed, given its own limit.
    pub fn limit(&self, own: u64) -> u64 {
        own.min(self.held)
    }

    /// ACK-only packets kept per space, given the connection's own number.
    pub fn ack_only(&self, own: u64) -> u64 {
        if self.full { own.min(ACK_ONLY) } else { own }
    }

    /// Withdraws this connection's report (it is dropped).
    pub fn withdraw(&mut self, total: &SentStateTotal) {
        total.report(self.reported, 0);
        self.reported = 0;
    }

    /// What this connection reported, bytes.
    pub fn reported(&self) -> u64 {
        self.reported
    }
}
