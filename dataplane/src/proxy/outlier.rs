//! Passive outlier ejection: endpoints that fail `consecutive_failures` times in a row (5xx
//! replies, connect/TLS/protocol errors, timeouts) are ejected for
//! `base_ejection_time × 2^(times ejected − 1)`, capped at [`MAX_EJECTION`]. A success resets
//! the failure count. At most `max_ejection_percent` of a backend's endpoints are ejected at
//! once. When every endpoint is ejected the balancer falls back to all of them (panic mode).
//!
//! The ejection multiplier resets when an endpoint has stayed un-ejected for longer than
//! [`MAX_EJECTION`] since its last ejection ended.
//!
//! Time is passed in (`now`) so the logic is testable without sleeping.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use sweety_config::OutlierDetection;

/// Longest ejection, whatever the multiplier.
pub const MAX_EJECTION: Duration = Duration::from_secs(300);

/// Health of one endpoint.
#[derive(Debug, Default)]
pub struct Health {
    consecutive: u32,
    ejected_until: Option<Instant>,
    times_ejected: u32,
}

impl Health {
    /// True while ejected.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|t| t > now)
    }

    /// Records a success: the consecutive failures start again from 0.
    pub fn succeeded(&mut self) {
        self.consecutive = 0;
    }

    /// Consecutive failures counted so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }
}

/// Records one outcome for endpoint `idx` of a backend whose endpoints' health is `all`.
/// `eject_lock` serialises ejection decisions within the backend so the percentage cap holds.
/// Returns true when this outcome ejected the endpoint.
pub fn record(
    all: &[&Mutex<Health>],
    idx: usize,
    success: bool,
    cfg: &OutlierDetection,
    eject_lock: &Mutex<()>,
    now: Instant,
) -> bool {
    if success {
        all[idx]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .succeeded();
        return false;
    }
    if cfg.consecutive_failures == 0 {
        return false;
    }
    {
        let mut h = all[idx].lock().unwrap_or_else(|p| p.into_inner());
        h.consecutive = h.consecutive.saturating_add(1);
        if h.consecutive < cfg.consecutive_failures || h.is_ejected(now) {
            return false;
        }
    }
    let _guard = eject_lock.lock().unwrap_or_else(|p| p.into_inner());
    let ejected = all
        .iter()
        .enumerate()
        .filter(|(i, m)| *i != idx && m.lock().unwrap_or_else(|p| p.into_inner()).is_ejected(now))
        .count();
    let allowed =
        (ejected as u64 + 1) * 100 <= u64::from(cfg.max_ejection_percent) * all.len() as u64;
    let mut h = all[idx].lock().unwrap_or_else(|p| p.into_inner());
    if !allowed || h.is_ejected(now) {
        return false;
    }
    if let Some(until) = h.ejected_until {
        if now.saturating_duration_since(until) > MAX_EJECTION {
            h.times_ejected = 0;
        }
    }
    h.times_ejected = h.times_ejected.saturating_add(1);
    let factor = 1u32 << (h.times_ejected - 1).min(16);
    let time = cfg
        .base_ejection_time
        .get()
        .saturating_mul(factor)
        .min(MAX_EJECTION.max(cfg.base_ejection_time.get()));
    h.ejected_until = Some(now + time);
    h.consecutive = 0;
    true
}

/// The endpoints that may receive traffic: those not ejected, or all of them when every one is
/// ejected (panic mode). Input (the candidates with their health) and output are endpoint
/// indexes; the candidates are walked at most twice, without an intermediate list (this runs
/// for every proxied request).
pub fn eligible<'a, I>(candidates: I, now: Instant) -> Vec<usize>
where
    I: Iterator<Item = (usize, &'a Mutex<Health>)> + Clone,
{
    let healthy: Vec<usize> = candidates
        .clone()
        .filter(|(_, m)| !m.lock().unwrap_or_else(|p| p.into_inner()).is_ejected(now))
        .map(|(i, _)| i)
        .collect();
    if healthy.is_empty() {
        candidates.map(|(i, _)| i).collect()
    } else {
        healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::Duration as CfgDuration;

    fn cfg(n: u32, pct: u32) -> OutlierDetection {
        OutlierDetection {
            consecutive_failures: n,
            base_ejection_time: CfgDuration::from_secs(10),
            max_ejection_percent: pct,
        }
    }

    struct Set {
        h: Vec<Mutex<Health>>,
        lock: Mutex<()>,
    }

    impl Set {
        fn new(n: usize) -> Set {
            Set {
                h: (0..n).map(|_| Mutex::new(Health::default())).collect(),
                lock: Mutex::new(()),
            }
        }
        fn refs(&self) -> Vec<&Mutex<Health>> {
            self.h.iter().collect()
        }
        fn rec(&self, idx: usize, ok: bool, c: &OutlierDetection, now: Instant) -> bool {
            record(&self.refs(), idx, ok, c, &self.lock, now)
        }
        fn eligible(&self, now: Instant) -> Vec<usize> {
            eligible(self.h.iter().enumerate(), now)
        }
    }

    #[test]
    fn ejects_after_consecutive_failures_and_success_resets() {
        let s = Set::new(4);
        let c = cfg(3, 50);
        let t0 = Instant::now();
        assert!(!s.rec(0, false, &c, t0));
        assert!(!s.rec(0, false, &c, t0));
        assert!(!s.rec(0, true, &c, t0));
        assert!(!s.rec(0, false, &c, t0));
        assert!(!s.rec(0, false, &c, t0));
        assert_eq!(s.eligible(t0), vec![0, 1, 2, 3]);
        assert!(s.rec(0, false, &c, t0));
        assert_eq!(s.eligible(t0), vec![1, 2, 3]);
    }

    #[test]
    fn ejection_expires_and_doubles() {
        let s = Set::new(2);
        let c = cfg(1, 100);
        let t0 = Instant::now();
        assert!(s.rec(0, false, &c, t0));
        assert_eq!(s.eligible(t0 + Duration::from_secs(9)), vec![1]);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(s.eligible(t1), vec![0, 1]);
        // Second ejection lasts 20s.
        assert!(s.rec(0, false, &c, t1));
        assert_eq!(s.eligible(t1 + Duration::from_secs(19)), vec![1]);
        assert_eq!(s.eligible(t1 + Duration::from_secs(20)), vec![0, 1]);
        // Long healthy stretch: the multiplier resets to 1 (10s).
        let t2 = t1 + Duration::from_secs(20) + MAX_EJECTION + Duration::from_secs(1);
        assert!(s.rec(0, false, &c, t2));
        assert_eq!(s.eligible(t2 + Duration::from_secs(10)), vec![0, 1]);
    }

    #[test]
    fn ejection_time_is_capped() {
        let s = Set::new(2);
        let c = cfg(1, 100);
        let mut t = Instant::now();
        for _ in 0..12 {
            assert!(s.rec(0, false, &c, t));
            t += MAX_EJECTION;
        }
        assert_eq!(s.eligible(t - Duration::from_secs(1)), vec![1]);
        assert_eq!(s.eligible(t), vec![0, 1]);
    }

    #[test]
    fn max_ejection_percent_is_respected() {
        let s = Set::new(4);
        let c = cfg(1, 50);
        let t0 = Instant::now();
        assert!(s.rec(0, false, &c, t0));
        assert!(s.rec(1, false, &c, t0));
        assert!(!s.rec(2, false, &c, t0));
        assert!(!s.rec(3, false, &c, t0));
        assert_eq!(s.eligible(t0), vec![2, 3]);
    }

    #[test]
    fn panic_mode_when_all_ejected() {
        let s = Set::new(2);
        let c = cfg(1, 100);
        let t0 = Instant::now();
        assert!(s.rec(0, false, &c, t0));
        assert!(s.rec(1, false, &c, t0));
        assert_eq!(s.eligible(t0), vec![0, 1]);
    }

    #[test]
    fn disabled_when_zero() {
        let s = Set::new(2);
        let c = cfg(0, 100);
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(!s.rec(0, false, &c, t0));
        }
        assert_eq!(s.eligible(t0), vec![0, 1]);
    }
}
