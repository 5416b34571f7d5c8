//! The vendored quinn-proto's `SentPackets` (vendor/README.md), included from its source: the
//! workspace does not build quinn-proto's own tests, so they are here. It must answer every
//! question as upstream's `BTreeMap<u64, SentPacket>` did (the differential property test),
//! and its work and memory must stay bounded whatever a peer acknowledges: a range walks at
//! most the packets it yields plus `MAX_HOLES` holes, and the capacity follows the entries
//! down. The hostile shape is the read-only review's (session 20): one packet never
//! acknowledged, then ACK-only packets forgotten behind it by quinn's tail rule
//! (`PacketSpace::sent`), then duplicate ACK frames over the forgotten numbers.

#[allow(dead_code)]
#[path = "../../vendor/quinn-proto-0.11.19/src/connection/sent_packets.rs"]
mod sent_packets;

use proptest::prelude::*;
use sent_packets::{InFlight, SentPackets};
use std::collections::BTreeMap;
use std::ops::Bound;

/// A stand-in for quinn-proto's `SentPacket`: its size (0: not in flight) and an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packet {
    size: u16,
    id: u64,
}

impl InFlight for Packet {
    fn in_flight(&self) -> bool {
        self.size != 0
    }
}

type Ours = SentPackets<Packet>;
const MAX_HOLES: usize = Ours::MAX_HOLES;
const MIN_CAPACITY: usize = Ours::MIN_CAPACITY;

/// The bounds the module promises, checked after every operation.
fn check_bounds(ours: &Ours, map: &BTreeMap<u64, Packet>) {
    assert!(ours.holes() <= MAX_HOLES, "{} holes", ours.holes());
    assert!(ours.ends_live());
    let (len, capacity) = ours.storage();
    assert_eq!(len, map.len() + ours.holes());
    assert!(
        capacity <= (4 * len).max(MIN_CAPACITY),
        "capacity {capacity} for {len} entries"
    );
    assert_eq!(
        ours.has_in_flight(),
        map.values().any(|p| p.size != 0),
        "the in-flight count"
    );
}

/// Every range shape quinn-proto uses (and a few more) answers as the map's, and walks at
/// most what it yields plus `MAX_HOLES`.
fn check_range(ours: &Ours, map: &BTreeMap<u64, Packet>, lo: u64, hi: u64) {
    fn same<'a>(
        a: impl Iterator<Item = (&'a u64, &'a Packet)>,
        b: impl Iterator<Item = (&'a u64, &'a Packet)>,
    ) -> usize {
        let (a, b): (Vec<_>, Vec<_>) = (a.collect(), b.collect());
        assert_eq!(a, b);
        a.len()
    }
    let n = same(ours.range(lo..=hi), map.range(lo..=hi));
    assert!(ours.walked(lo..=hi) <= n + MAX_HOLES);
    let n = same(ours.range(lo..hi), map.range(lo..hi));
    assert!(ours.walked(lo..hi) <= n + MAX_HOLES);
    let above = (Bound::Excluded(lo), Bound::Unbounded);
    let n = same(ours.range(above), map.range(above));
    assert!(ours.walked(above) <= n + MAX_HOLES);
    let n = same(ours.range(..), map.range(..));
    assert!(ours.walked(..) <= n + MAX_HOLES);
    let below = (Bound::Unbounded, Bound::Excluded(hi));
    same(ours.range(below), map.range(below));
    let to_max = (Bound::Included(lo), Bound::Included(u64::MAX));
    same(ours.range(to_max), map.range(to_max));
}

#[derive(Debug, Clone)]
enum Op {
    /// Send the next packet, `skip` numbers after the last (quinn skips some), in flight or not.
    Send { skip: u8, in_flight: bool },
    /// Remove the oldest live packet (an in-order acknowledgement, or loss detection).
    RemoveOldest,
    /// Remove the `nth % live`-th live packet (an acknowledgement out of the middle).
    RemoveNth(usize),
    /// Remove whatever `number % (last + 2)` is (often nothing: a duplicate or unsent number).
    RemoveNumber(u64),
    /// Acknowledge `lo..=hi` as `on_ack_received` does: collect the range, then remove each.
    Ack(u64, u64),
    /// Retransmit-style mutation through `values_mut` of the first live packet.
    Touch,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, any::<bool>()).prop_map(|(skip, in_flight)| Op::Send { skip: skip / 2, in_flight }),
        2 => Just(Op::RemoveOldest),
        3 => any::<usize>().prop_map(Op::RemoveNth),
        1 => any::<u64>().prop_map(Op::RemoveNumber),
        2 => (any::<u64>(), 0u64..40).prop_map(|(lo, len)| Op::Ack(lo, len)),
        1 => Just(Op::Touch),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Differential: random sends, acknowledgements and removals in any order against the
    /// `BTreeMap` upstream uses, with every lookup and range compared and the bounds checked.
    #[test]
    fn sent_packets_answer_as_the_map(ops in proptest::collection::vec(op(), 1..600)) {
        let mut ours = Ours::default();
        let mut map = BTreeMap::<u64, Packet>::new();
        let mut next = 0u64;
        let mut id = 0u64;
        for op in ops {
            match op {
                Op::Send { skip, in_flight } => {
                    next += u64::from(skip);
                    id += 1;
                    let packet = Packet { size: if in_flight { 1200 } else { 0 }, id };
                    ours.insert(next, packet);
                    map.insert(next, packet);
                    next += 1;
                }
                Op::RemoveOldest => {
                    if let Some(&n) = map.keys().next() {
                        prop_assert_eq!(ours.remove(&n), map.remove(&n));
                    }
                }
                Op::RemoveNth(nth) => {
                    if !map.is_empty() {
                        let n = *map.keys().nth(nth % map.len()).unwrap();
                        prop_assert_eq!(ours.remove(&n), map.remove(&n));
                    }
                }
                Op::RemoveNumber(n) => {
                    let n = n % (next + 2);
                    prop_assert_eq!(ours.get(&n), map.get(&n));
                    prop_assert_eq!(ours.remove(&n), map.remove(&n));
                }
                Op::Ack(lo, len) => {
                    let lo = lo % (next + 2);
                    let hi = lo + len;
                    let acked: Vec<u64> = ours.range(lo..=hi).map(|(&n, _)| n).collect();
                    let expected: Vec<u64> = map.range(lo..=hi).map(|(&n, _)| n).collect();
                    prop_assert_eq!(&acked, &expected);
                    for n in acked {
                        prop_assert_eq!(ours.remove(&n), map.remove(&n));
                    }
                }
                Op::Touch => {
                    if let Some(p) = ours.values_mut().next() {
                        p.id += 1_000_000;
                    }
                    if let Some(p) = map.values_mut().next() {
                        p.id += 1_000_000;
                    }
                }
            }
            check_bounds(&ours, &map);
            if let Some((&first, _)) = map.iter().next() {
                prop_assert_eq!(&ours[&first], &map[&first]);
            }
            let a = next.saturating_sub(50);
            check_range(&ours, &map, a, next);
            check_range(&ours, &map, 0, a);
        }
        let ours: Vec<Packet> = ours.into_values().collect();
        let map: Vec<Packet> = map.into_values().collect();
        prop_assert_eq!(ours, map);
    }
}

/// The review's hostile shape (H1/M1): packet 0 is never acknowledged, then 2,035 ACK-only
/// packets are sent and the tail rule (at most 1,000 ACK-only packets after the last
/// ACK-eliciting one) forgets the oldest of them each time, out of the middle. Neither the
/// tail rule's search nor a duplicate ACK frame over the forgotten numbers may walk more than
/// `MAX_HOLES` holes, and once all is acknowledged the capacity is given back.
#[test]
fn forgotten_ack_only_packets_leave_no_run_of_holes() {
    const TAIL: usize = 1_000;
    let mut ours = Ours::default();
    ours.insert(0, Packet { size: 1200, id: 0 });
    let mut tail = 0;
    let mut most_walked = 0;
    for n in 1..=2_035u64 {
        if tail > TAIL {
            // `PacketSpace::sent`: the oldest packet after the last ACK-eliciting one (0).
            let above = (Bound::Excluded(0), Bound::Unbounded);
            let oldest = *ours.range(above).next().unwrap().0;
            // What `.next()` walked: the holes before it, and it.
            most_walked =
                most_walked.max(ours.walked((Bound::Excluded(0), Bound::Included(oldest))));
            assert!(ours.remove(&oldest).is_some());
        } else {
            tail += 1;
        }
        ours.insert(n, Packet { size: 0, id: n });
        assert!(ours.holes() <= MAX_HOLES);
        assert!(ours.ends_live());
    }
    // The search walked one live packet plus at most the holes (the reverted deque: up to
    // ~1,033 holes).
    assert!(most_walked <= 1 + MAX_HOLES, "{most_walked}");
    let first_tail = *ours.range(1..).next().unwrap().0;
    assert_eq!(first_tail, 2_035 - TAIL as u64);
    // Duplicate ACK frames over the forgotten numbers: nothing live there, at most the holes
    // walked, every time (the map walked nothing either; the reverted deque walked ~1,033).
    for _ in 0..100 {
        let forgotten = 1..=first_tail - 1;
        assert_eq!(ours.range(forgotten.clone()).count(), 0);
        assert!(ours.walked(forgotten) <= MAX_HOLES);
    }
    // All acknowledged: the storage follows the entries down.
    let (len, capacity) = ours.storage();
    assert!(len <= TAIL + 2 + MAX_HOLES, "{len}");
    assert!(capacity >= len);
    let numbers: Vec<u64> = ours.range(..).map(|(&n, _)| n).collect();
    for n in numbers {
        assert!(ours.remove(&n).is_some());
    }
    assert_eq!(ours.storage().0, 0);
    assert!(ours.storage().1 <= MIN_CAPACITY, "{:?}", ours.storage());
}

/// The review's M2: after a window's worth of packets in flight is acknowledged (in order, the
/// usual case, and every other one first, the worst for holes) the deque does not keep its
/// peak capacity.
#[test]
fn the_capacity_follows_the_packets_down() {
    for every_other_first in [false, true] {
        let mut ours = Ours::default();
        for n in 0..1_500u64 {
            ours.insert(n, Packet { size: 1200, id: n });
        }
        assert!(ours.storage().1 >= 1_500);
        if every_other_first {
            for n in (1..1_500u64).step_by(2) {
                assert!(ours.remove(&n).is_some());
                assert!(ours.holes() <= MAX_HOLES);
            }
        }
        for n in 0..1_500u64 {
            ours.remove(&n);
            let (len, capacity) = ours.storage();
            assert!(capacity <= (4 * len).max(MIN_CAPACITY), "{len} {capacity}");
        }
        assert!(!ours.has_in_flight());
        assert_eq!(ours.storage().0, 0);
    }
}

/// The removal that makes `MAX_HOLES + 1` holes compacts every one of them out, whether they
/// lie near the front (live packets before them move back) or near the back (those after them
/// move forward), and the packets stay as they were.
#[test]
fn compaction_removes_every_hole() {
    for near_front in [true, false] {
        let mut ours = Ours::default();
        let mut map = BTreeMap::new();
        for n in 0..400u64 {
            let packet = Packet { size: 1200, id: n };
            ours.insert(n, packet);
            map.insert(n, packet);
        }
        let first = if near_front {
            2
        } else {
            400 - 2 * (MAX_HOLES as u64 + 1) - 2
        };
        for k in 0..=MAX_HOLES as u64 {
            let n = first + 2 * k;
            assert_eq!(ours.remove(&n), map.remove(&n));
            let expected = if k == MAX_HOLES as u64 {
                0
            } else {
                k as usize + 1
            };
            assert_eq!(ours.holes(), expected, "near_front {near_front}, k {k}");
        }
        check_bounds(&ours, &map);
        check_range(&ours, &map, 0, 400);
        assert_eq!(ours.storage().0, map.len());
    }
}
