//! Sweety patch (vendor/README.md): the packets of one packet number space that were sent and
//! are neither acknowledged nor lost yet, in place of upstream's `BTreeMap<u64, SentPacket>`,
//! which cost a tree insertion for every packet sent and a tree removal for every packet
//! acknowledged.
//!
//! Packet numbers only grow, so a packet is appended at the back, and acknowledgements and loss
//! detection remove mostly from the front. A packet removed from elsewhere leaves a hole that
//! keeps its number, so that a lookup stays a binary search. What bounds the work and memory,
//! whatever a peer acknowledges and in whatever order:
//!
//! * holes at either end are dropped at once, so every hole lies between two live packets;
//! * there are never more than [`SentPackets::MAX_HOLES`] holes: the removal that would make
//!   one more compacts them all out (at most O(live) moves, of the packets on the shorter side
//!   of the holes, once per `MAX_HOLES + 1` removals from the middle, each of which removes a
//!   packet we sent). So a range walks at most the live packets
//!   it yields plus `MAX_HOLES` holes, after two binary searches, however many holes a peer's
//!   acknowledgements (or the forgetting of ACK-only packets behind an unacknowledged one) made;
//! * the storage is given back: when the capacity is over four times the entries (and over
//!   [`SentPackets::MIN_CAPACITY`]) it is shrunk to twice them, so a connection does not keep
//!   its peak for life.
//!
//! Iteration yields the live packets only, in packet number order, as the map's did. This file
//! uses `std` only: the dataplane's `tests/quinn_sent_packets.rs` includes it and checks it
//! against a `BTreeMap` (quinn-proto's own tests are not built in the workspace).

use std::{
    collections::VecDeque,
    ops::{Bound, Index, RangeBounds},
};

/// What [`SentPackets`] needs to know of a packet
pub(super) trait InFlight {
    /// Whether the packet counts towards congestion control (upstream: `size != 0`)
    fn in_flight(&self) -> bool;
}

/// The sent packets of a space not yet acknowledged or lost (see the module's comment)
#[derive(Debug)]
pub(super) struct SentPackets<T> {
    /// Packet numbers, strictly increasing, each with its packet or a hole (`None`); the first
    /// and the last entry are never holes
    entries: VecDeque<(u64, Option<T>)>,
    /// Entries that are not holes
    live: usize,
    /// Live packets that count towards congestion control
    in_flight: usize,
    /// Bounds of the numbers of the holes made since the last compaction (all holes lie within
    /// them; holes dropped at the ends may have left them wider than needed)
    holes_lo: u64,
    holes_hi: u64,
}

impl<T> Default for SentPackets<T> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            live: 0,
            in_flight: 0,
            holes_lo: u64::MAX,
            holes_hi: 0,
        }
    }
}

impl<T: InFlight> SentPackets<T> {
    /// The most holes kept; the removal that would make one more compacts them out
    pub(super) const MAX_HOLES: usize = 32;
    /// Capacity (entries) kept however few entries there are
    pub(super) const MIN_CAPACITY: usize = 16;

    /// Records packet `number`, larger than any recorded before
    pub(super) fn insert(&mut self, number: u64, packet: T) {
        debug_assert!(self.entries.back().is_none_or(|&(n, _)| n < number));
        self.live += 1;
        self.in_flight += usize::from(packet.in_flight());
        self.entries.push_back((number, Some(packet)));
    }

    /// Whether any live packet counts towards congestion control
    pub(super) fn has_in_flight(&self) -> bool {
        self.in_flight != 0
    }

    /// Index of the first entry whose number is not below `number`
    fn lower_bound(&self, number: u64) -> usize {
        match (self.entries.front(), self.entries.back()) {
            (Some(&(first, _)), _) if first >= number => 0,
            (_, Some(&(last, _))) if last < number => self.entries.len(),
            _ => self.entries.partition_point(|&(n, _)| n < number),
        }
    }

    fn index_of(&self, number: u64) -> Option<usize> {
        let i = self.lower_bound(number);
        (self.entries.get(i)?.0 == number).then_some(i)
    }

    /// The packet numbered `number`, if it is live
    pub(super) fn get(&self, number: &u64) -> Option<&T> {
        self.entries[self.index_of(*number)?].1.as_ref()
    }

    /// Stops tracking packet `number` and returns it, if it is live
    pub(super) fn remove(&mut self, number: &u64) -> Option<T> {
        let i = self.index_of(*number)?;
        let packet = self.entries[i].1.take()?;
        self.live -= 1;
        self.in_flight -= usize::from(packet.in_flight());
        self.holes_lo = self.holes_lo.min(*number);
        self.holes_hi = self.holes_hi.max(*number);
        // At most `MAX_HOLES + 1` entries each: every hole lies between two live packets.
        while matches!(self.entries.front(), Some((_, None))) {
            self.entries.pop_front();
        }
        while matches!(self.entries.back(), Some((_, None))) {
            self.entries.pop_back();
        }
        if self.entries.len() - self.live > Self::MAX_HOLES {
            self.compact();
        }
        let len = self.entries.len();
        if self.entries.capacity() > (4 * len).max(Self::MIN_CAPACITY) {
            self.entries.shrink_to((2 * len).max(Self::MIN_CAPACITY));
        }
        Some(packet)
    }

    /// Removes every hole, moving the live packets on the shorter side of them: those after
    /// the first hole towards the front, or those before the last hole towards the back. The
    /// holes left behind an unacknowledged packet by the forgetting of ACK-only packets (the
    /// oldest of a long tail, one by one) are near the front: only the packets before them move.
    fn compact(&mut self) {
        let len = self.entries.len();
        // Every hole lies in `first..=last`.
        let first = self.lower_bound(self.holes_lo);
        let last = self.lower_bound(self.holes_hi).min(len - 1);
        if len - first <= last + 1 {
            let mut kept = first;
            for i in first..len {
                if self.entries[i].1.is_some() {
                    self.entries.swap(kept, i);
                    kept += 1;
                }
            }
            self.entries.truncate(kept);
        } else {
            let mut start = last + 1;
            for i in (0..=last).rev() {
                if self.entries[i].1.is_some() {
                    start -= 1;
                    self.entries.swap(start, i);
                }
            }
            self.entries.drain(..start);
        }
        self.holes_lo = u64::MAX;
        self.holes_hi = 0;
    }

    /// The entries (live or holes) a range of packet numbers covers, as indices `start..end`
    fn span(&self, range: &impl RangeBounds<u64>) -> (usize, usize) {
        let len = self.entries.len();
        let start = match range.start_bound() {
            Bound::Included(&n) => self.lower_bound(n),
            Bound::Excluded(&n) => n.checked_add(1).map_or(len, |n| self.lower_bound(n)),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&n) => n.checked_add(1).map_or(len, |n| self.lower_bound(n)),
            Bound::Excluded(&n) => self.lower_bound(n),
            Bound::Unbounded => len,
        };
        (start, end.max(start))
    }

    /// The live packets whose numbers are in `range`, in number order (an empty iterator for a
    /// reversed range, where the map panicked; quinn-proto never asks for one)
    pub(super) fn range(&self, range: impl RangeBounds<u64>) -> impl Iterator<Item = (&u64, &T)> {
        let (start, end) = self.span(&range);
        self.entries
            .range(start..end)
            .filter_map(|(n, p)| Some((n, p.as_ref()?)))
    }

    /// The live packets, in number order
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().filter_map(|(_, p)| p.as_mut())
    }

    /// The live packets, in number order
    pub(super) fn into_values(self) -> impl Iterator<Item = T> {
        self.entries.into_iter().filter_map(|(_, p)| p)
    }

    /// Entries (live or holes) that `range` walks: the work of a call of [`Self::range`]
    #[cfg(test)]
    pub(super) fn walked(&self, range: impl RangeBounds<u64>) -> usize {
        let (start, end) = self.span(&range);
        end - start
    }

    /// Entries that are holes
    #[cfg(test)]
    pub(super) fn holes(&self) -> usize {
        self.entries.len() - self.live
    }

    /// Entries stored (live or holes) and the capacity allocated for them
    #[cfg(test)]
    pub(super) fn storage(&self) -> (usize, usize) {
        (self.entries.len(), self.entries.capacity())
    }

    /// Whether the first and last entries are live (every hole lies between live packets)
    #[cfg(test)]
    pub(super) fn ends_live(&self) -> bool {
        self.entries.front().is_none_or(|(_, p)| p.is_some())
            && self.entries.back().is_none_or(|(_, p)| p.is_some())
    }
}

impl<T: InFlight> Index<&u64> for SentPackets<T> {
    type Output = T;
    fn index(&self, number: &u64) -> &T {
        self.get(number).expect("no sent packet of this number")
    }
}
