//! Load balancing as small pure pieces: weighted random choice (between a route's backends),
//! smooth weighted round robin and power-of-two-choices least-request (between a backend's
//! endpoints).
//!
//! Candidates are `(endpoint index, weight)` pairs; the caller has already removed ejected
//! endpoints and endpoints with weight 0.

use fastrand::Rng;
use std::sync::Mutex;

/// Picks an index with probability proportional to its weight. `None` when every weight is 0
/// (or there are none).
pub fn weighted_random(weights: &[u32], rng: &mut Rng) -> Option<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut x = rng.u64(0..total);
    for (i, &w) in weights.iter().enumerate() {
        let w = u64::from(w);
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
    let weights: Vec<u32> = candidates.iter().map(|c| c.1).collect();
    let a = weighted_random(&weights, rng)?;
    if candidates.len() == 1 {
        return Some(candidates[a].0);
    }
    let mut rest = weights.clone();
    rest[a] = 0;
    let Some(b) = weighted_random(&rest, rng) else {
        return Some(candidates[a].0);
    };
    let (ia, wa) = candidates[a];
    let (ib, wb) = candidates[b];
    // Compare load_a / wa with load_b / wb without division.
    let la = in_flight(ia) as u128 * u128::from(wb);
    let lb = in_flight(ib) as u128 * u128::from(wa);
    Some(if lb < la { ib } else { ia })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_random_respects_weights_and_zero() {
        let mut rng = Rng::with_seed(7);
        assert_eq!(weighted_random(&[0, 0], &mut rng), None);
        assert_eq!(weighted_random(&[], &mut rng), None);
        let mut counts = [0u32; 3];
        for _ in 0..10_000 {
            counts[weighted_random(&[1, 0, 3], &mut rng).unwrap()] += 1;
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
