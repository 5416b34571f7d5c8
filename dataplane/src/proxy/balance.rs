//! Load balancing as small pure pieces: weighted random choice (between a route's backends),
//! smooth weighted round robin and power-of-two-choices least-request (between a backend's
//! endpoints).
//!
//! Candidates are `(endpoint index, weight)` pairs; the caller has already removed ejected
//! endpoints and endpoints with weight 0.

use fastrand::Rng;
use std::sync::Mutex;

/// Picks an index in `0..len` with probability proportional to `weight(index)`, without
/// collecting the weights (this runs per request and per layer-4 connection). `None` when every
/// weight is 0 (or `len` is 0).
pub fn pick_by_weight(len: usize, weight: impl Fn(usize) -> u32, rng: &mut Rng) -> Option<usize> {
    let total: u64 = (0..len).map(|i| u64::from(weight(i))).sum();
    if total == 0 {
        return None;
    }
    let mut x = rng.u64(0..total);
    for i in 0..len {
        let w = u64::from(weight(i));
        if x < w {
            return Some(i);
        }
        x -= w;
    }
    None
}

/// Smooth weighted round robin (the nginx algorithm): over any window of `sum(weights)` picks
/// each candidate is chosen exactly `weight` times, interleaved rather than in bursts.
#[derive(Debug, Default)]
pub struct SmoothWrr {
    /// Current weight per endpoint index of the backend.
    current: Mutex<Vec<i64>>,
}

impl SmoothWrr {
    /// State for a backend with `n` endpoints.
    pub fn new(n: usize) -> SmoothWrr {
        SmoothWrr {
            current: Mutex::new(vec![0; n]),
        }
    }

    /// Picks among `candidates` (`(endpoint index, weight > 0)`); returns the endpoint index.
    pub fn pick(&self, candidates: &[(usize, u32)]) -> Option<usize> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for &(idx, w) in candidates {
            if idx >= current.len() {
                current.resize(idx + 1, 0);
            }
            let w = i64::from(w);
            current[idx] += w;
            total += w;
            if best.is_none_or(|b| current[idx] > current[b]) {
                best = Some(idx);
            }
        }
        let b = best?;
        current[b] -= total;
        Some(b)
    }
}

/// Power of two random choices: draws two distinct candidates (weighted by weight) and keeps
/// the one with fewer requests in flight relative to its weight.
pub fn p2c(
    candidates: &[(usize, u32)],
    in_flight: impl Fn(usize) -> usize,
    rng: &mut Rng,
) -> Option<usize> {
    let a = pick_by_weight(candidates.len(), |i| candidates[i].1, rng)?;
    if candidates.len() == 1 {
        return Some(candidates[a].0);
    }
    let rest = |i: usize| if i == a { 0 } else { candidates[i].1 };
    let Some(b) = pick_by_weight(candidates.len(), rest, rng) else {
        return Some(candidates[a].0);
    };
    let (ia, wa) = candidates[a];
    let (ib, wb) = candidates[b];
    // Compare load_a / wa with load_b / wb without division.
    let la = in_flight(ia) as u128 * u128::from(wb);
    let lb = in_flight(ib) as u128 * u128::from(wa);
    Some(if lb < la { ib } else { ia })
}

/// A stable 64-bit hash (FNV-1a, then the splitmix64 finalizer for good bit spread): the same
/// on every replica and every run, so replicas agree on where a key goes.
pub fn stable_hash(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Virtual nodes per unit of weight on a hash ring.
const RING_NODES_PER_WEIGHT: u64 = 100;
/// Most virtual nodes on one ring (weights are scaled down to fit).
const RING_MAX_NODES: u64 = 100_000;
/// Maglev lookup table size (a prime; much larger than any endpoint count we expect).
pub const MAGLEV_SIZE: usize = 65_537;

/// A consistent-hash table over a backend's endpoints: ketama-style ring or Maglev.
#[derive(Debug)]
pub enum HashTable {
    /// Sorted `(point, endpoint index)`; a key goes to the first point at or after its hash.
    Ring(Vec<(u64, usize)>),
    /// Maglev table: slot to endpoint index.
    Maglev(Vec<u32>),
}

impl HashTable {
    /// A ring over `(endpoint index, name, weight)`; weight-0 endpoints get no nodes.
    pub fn ring(endpoints: &[(usize, &str, u32)]) -> HashTable {
        let total: u64 = endpoints.iter().map(|e| u64::from(e.2)).sum();
        let per = RING_MAX_NODES
            .checked_div(total)
            .map_or(0, |cap| RING_NODES_PER_WEIGHT.min(cap).max(1));
        let mut points = Vec::new();
        for &(idx, name, w) in endpoints {
            for k in 0..u64::from(w) * per {
                points.push((stable_hash(format!("{name}#{k}").as_bytes()), idx));
            }
        }
        points.sort_unstable();
        HashTable::Ring(points)
    }

    /// A Maglev table over `(endpoint index, name, weight)` (Eisenbud et al., NSDI 2016),
    /// weighted by giving each endpoint `weight` turns per round (weights reduced by their
    /// greatest common divisor).
    pub fn maglev(endpoints: &[(usize, &str, u32)]) -> HashTable {
        let live: Vec<&(usize, &str, u32)> = endpoints.iter().filter(|e| e.2 > 0).collect();
        if live.is_empty() {
            return HashTable::Maglev(Vec::new());
        }
        let g = live.iter().fold(0u32, |g, e| gcd(g, e.2)).max(1);
        let m = MAGLEV_SIZE as u64;
        let perms: Vec<(u64, u64)> = live
            .iter()
            .map(|e| {
                let offset = stable_hash(format!("{}#offset", e.1).as_bytes()) % m;
                let skip = stable_hash(format!("{}#skip", e.1).as_bytes()) % (m - 1) + 1;
                (offset, skip)
            })
            .collect();
        let mut next = vec![0u64; live.len()];
        let mut table = vec![u32::MAX; MAGLEV_SIZE];
        let mut filled = 0;
        'fill: loop {
            for (i, e) in live.iter().enumerate() {
                // Bounded: each turn fills one empty slot, and there are MAGLEV_SIZE of them.
                for _ in 0..(e.2 / g).min(1_000) {
                    let (offset, skip) = perms[i];
                    let mut c = (offset + next[i] * skip) % m;
                    while table[c as usize] != u32::MAX {
                        next[i] += 1;
                        c = (offset + next[i] * skip) % m;
                    }
                    table[c as usize] = e.0 as u32;
                    next[i] += 1;
                    filled += 1;
                    if filled == MAGLEV_SIZE {
                        break 'fill;
                    }
                }
            }
        }
        HashTable::Maglev(table)
    }

    /// The endpoint for `hash` among those `ok` accepts. The ring walks on clockwise past
    /// endpoints that are not accepted (only their keys move); Maglev rehashes up to 32 times.
    pub fn lookup(&self, hash: u64, ok: impl Fn(usize) -> bool) -> Option<usize> {
        match self {
            HashTable::Ring(points) => {
                if points.is_empty() {
                    return None;
                }
                let start = points.partition_point(|p| p.0 < hash);
                (0..points.len())
                    .map(|k| points[(start + k) % points.len()].1)
                    .find(|&i| ok(i))
            }
            HashTable::Maglev(table) => {
                if table.is_empty() {
                    return None;
                }
                let mut h = hash;
                for _ in 0..32 {
                    let i = table[(h % table.len() as u64) as usize] as usize;
                    if ok(i) {
                        return Some(i);
                    }
                    h = stable_hash(&h.to_le_bytes());
                }
                None
            }
        }
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u32) -> Vec<u64> {
        (0..n)
            .map(|i| stable_hash(format!("client-{i}").as_bytes()))
            .collect()
    }

    fn spread(t: &HashTable, n: usize, ok: impl Fn(usize) -> bool + Copy) -> Vec<usize> {
        let mut counts = vec![0; n];
        for k in keys(10_000) {
            counts[t.lookup(k, ok).unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn stable_hash_is_fixed() {
        // Replicas must agree: the value is part of the contract.
        assert_ne!(stable_hash(b"a"), stable_hash(b"b"));
        // Pinned values (FNV-1a 64 + splitmix64 finalizer, computed independently).
        assert_eq!(stable_hash(b"10.0.0.1:80"), 0xdbbc907f21531a73);
        assert_eq!(stable_hash(b""), 0xf52a15e9a9b5e89b);
    }

    fn eps() -> Vec<(usize, &'static str, u32)> {
        vec![
            (0, "10.0.0.1:80", 1),
            (1, "10.0.0.2:80", 1),
            (2, "10.0.0.3:80", 1),
            (3, "10.0.0.4:80", 1),
        ]
    }

    #[test]
    fn ring_hash_is_stable_and_balanced() {
        for t in [HashTable::ring(&eps()), HashTable::maglev(&eps())] {
            let counts = spread(&t, 4, |_| true);
            assert!(
                counts.iter().all(|&c| (1_800..3_200).contains(&c)),
                "{counts:?}"
            );
            // Same key, same endpoint, every time and for a table built again.
            let again = match &t {
                HashTable::Ring(_) => HashTable::ring(&eps()),
                HashTable::Maglev(_) => HashTable::maglev(&eps()),
            };
            for k in keys(1_000) {
                assert_eq!(t.lookup(k, |_| true), again.lookup(k, |_| true));
            }
        }
    }

    #[test]
    fn only_the_lost_endpoints_keys_move() {
        for t in [HashTable::ring(&eps()), HashTable::maglev(&eps())] {
            let mut moved = 0;
            for k in keys(10_000) {
                let before = t.lookup(k, |_| true).unwrap();
                let after = t.lookup(k, |i| i != 2).unwrap();
                assert_ne!(after, 2);
                if before != 2 {
                    assert_eq!(before, after, "a key of a surviving endpoint moved");
                } else {
                    moved += 1;
                }
            }
            assert!((1_800..3_200).contains(&moved), "{moved}");
        }
        // Removing an endpoint from the config moves about a quarter of the keys on a ring.
        let full = HashTable::ring(&eps());
        let less = HashTable::ring(&eps()[..3]);
        let changed = keys(10_000)
            .into_iter()
            .filter(|&k| full.lookup(k, |_| true) != less.lookup(k, |_| true))
            .count();
        assert!((1_800..3_200).contains(&changed), "{changed}");
    }

    #[test]
    fn weights_and_empty_tables() {
        let w = vec![(0, "a:1", 3), (1, "b:1", 1)];
        for t in [HashTable::ring(&w), HashTable::maglev(&w)] {
            let c = spread(&t, 2, |_| true);
            assert!((6_800..8_200).contains(&c[0]), "{c:?}");
        }
        assert_eq!(HashTable::ring(&[]).lookup(1, |_| true), None);
        assert_eq!(HashTable::maglev(&[]).lookup(1, |_| true), None);
        assert_eq!(HashTable::ring(&eps()).lookup(1, |_| false), None);
        assert_eq!(HashTable::maglev(&eps()).lookup(1, |_| false), None);
    }

    #[test]
    fn pick_by_weight_respects_weights_and_zero() {
        let mut rng = Rng::with_seed(7);
        assert_eq!(pick_by_weight(2, |_| 0, &mut rng), None);
        assert_eq!(pick_by_weight(0, |_| 1, &mut rng), None);
        let mut counts = [0u32; 3];
        for _ in 0..10_000 {
            counts[pick_by_weight(3, |i| [1, 0, 3][i], &mut rng).unwrap()] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((2_000..3_000).contains(&counts[0]), "{counts:?}");
        assert!((7_000..8_000).contains(&counts[2]), "{counts:?}");
    }

    #[test]
    fn smooth_wrr_exact_distribution_and_interleaving() {
        let wrr = SmoothWrr::new(3);
        let cands = [(0, 5), (1, 1), (2, 1)];
        let picks: Vec<usize> = (0..7).map(|_| wrr.pick(&cands).unwrap()).collect();
        // nginx's classic example: a a b a c a a
        assert_eq!(picks, vec![0, 0, 1, 0, 2, 0, 0]);
        let mut counts = [0; 3];
        for _ in 0..700 {
            counts[wrr.pick(&cands).unwrap()] += 1;
        }
        assert_eq!(counts, [500, 100, 100]);
    }

    #[test]
    fn smooth_wrr_over_a_subset() {
        let wrr = SmoothWrr::new(3);
        for _ in 0..10 {
            let p = wrr.pick(&[(0, 1), (2, 1)]).unwrap();
            assert_ne!(p, 1);
        }
        assert_eq!(wrr.pick(&[]), None);
    }

    #[test]
    fn p2c_picks_the_less_loaded() {
        let mut rng = Rng::with_seed(1);
        let load = |i: usize| [10, 0][i];
        for _ in 0..100 {
            assert_eq!(p2c(&[(0, 1), (1, 1)], load, &mut rng), Some(1));
        }
        // Weight-relative: 4 in flight at weight 4 beats 2 in flight at weight 1.
        let load = |i: usize| [2, 4][i];
        for _ in 0..100 {
            assert_eq!(p2c(&[(0, 1), (1, 4)], load, &mut rng), Some(1));
        }
        assert_eq!(p2c(&[(5, 1)], |_| 3, &mut rng), Some(5));
        assert_eq!(p2c(&[], |_| 0, &mut rng), None);
    }

    #[test]
    fn p2c_spreads_equal_load() {
        let mut rng = Rng::with_seed(3);
        let mut counts = [0; 3];
        for _ in 0..3_000 {
            counts[p2c(&[(0, 1), (1, 1), (2, 1)], |_| 0, &mut rng).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| c > 700), "{counts:?}");
    }
}
