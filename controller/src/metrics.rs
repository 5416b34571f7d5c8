//! The controller's Prometheus metrics: a small fixed set of counters, gauges and histograms,
//! rendered in the text exposition format by [`Metrics::render`] (served on `/metrics`).
//!
//! Hand-rolled on atomics and one mutex for labelled series: the set is small and known, and the
//! hot path only bumps numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the duration histograms.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A latency histogram with fixed buckets.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    /// Record one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Number of observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of the observations so far (microsecond resolution).
    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.sum_us.load(Ordering::Relaxed))
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{le}\"}} {}",
                self.counts[i].load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Every metric the controller exports.
#[derive(Default)]
pub struct Metrics {
    /// Reconciles run (snapshot → translate → submit to the pusher → offer the statuses to
    /// the status worker), all causes together; by cause in `reconcile_causes`.
    pub reconciles: AtomicU64,
    /// Reconciles by cause: `start`, or the kind of the first watch event it covers.
    reconcile_causes: Mutex<BTreeMap<&'static str, u64>>,
    /// One reconcile; no API write happens inside it.
    pub reconcile_duration: Histogram,
    /// From the first watch event a reconcile covers to the dataplane's Ack of the config it
    /// submitted (only reconciles that changed the config).
    pub event_to_ack: Histogram,
    /// Statuses waiting to be written or in flight (see `status_worker`).
    pub status_queue_depth: AtomicU64,
    /// One status write (or one object's Events), request(s) included.
    pub status_write_duration: Histogram,
    /// Watch events by kind, passed on or ignored (status-only updates).
    pub watch: OnceLock<Arc<crate::watch::Activity>>,
    /// Calls of the pure `translate`.
    pub translates: AtomicU64,
    /// Time each `translate` call took.
    pub translate_duration: Histogram,
    /// Translations that translated every route (the first, a change of the world, or the
    /// per-virtual-host memo not serving; see `TranslateCache::full_translates`).
    pub full_translates: AtomicU64,
    /// Of those, plain translations because the memo could not serve.
    pub plain_translates: AtomicU64,
    /// Time from submitting a config to the pusher to the dataplane's Ack of that generation
    /// (as the pusher received it).
    pub push_latency: Histogram,
    /// Size of the last config submitted, JSON-encoded.
    pub config_bytes: AtomicU64,
    /// Status subresources written (server-side apply calls) and Event sets published.
    pub status_writes: AtomicU64,
    /// 1 while this replica holds the leader lease.
    pub leader: AtomicU64,
    /// Objects in the last snapshot, by kind.
    objects: Mutex<BTreeMap<&'static str, u64>>,
    /// Errors by `Error::kind()`.
    errors: Mutex<BTreeMap<&'static str, u64>>,
}

impl Metrics {
    /// Count one error of this kind (`Error::kind()`).
    pub fn error(&self, kind: &'static str) {
        let mut m = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(kind).or_default() += 1;
    }

    /// Errors counted so far for one kind.
    pub fn errors_of(&self, kind: &str) -> u64 {
        let m = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        m.get(kind).copied().unwrap_or(0)
    }

    /// Count one reconcile of this cause.
    pub fn reconciled(&self, cause: &'static str) {
        self.reconciles.fetch_add(1, Ordering::Relaxed);
        let mut m = self
            .reconcile_causes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *m.entry(cause).or_default() += 1;
    }

    /// Reconciles counted so far for one cause.
    pub fn reconciles_of(&self, cause: &str) -> u64 {
        let m = self
            .reconcile_causes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        m.get(cause).copied().unwrap_or(0)
    }

    /// Replace the per-kind object counts.
    pub fn set_objects(&self, counts: &[(&'static str, usize)]) {
        let mut m = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        for (kind, n) in counts {
            m.insert(kind, *n as u64);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let counter = |out: &mut String, name: &str, help: &str, v: &AtomicU64, ty: &str| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {ty}\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        let _ = writeln!(
            out,
            "# HELP sweety_controller_reconciles_total Reconciles run, by cause (start, or the kind of the first watch event covered).\n# TYPE sweety_controller_reconciles_total counter"
        );
        for (cause, n) in self
            .reconcile_causes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "sweety_controller_reconciles_total{{cause=\"{cause}\"}} {n}"
            );
        }
        self.reconcile_duration.render(
            &mut out,
            "sweety_controller_reconcile_duration_seconds",
            "Duration of one reconcile (snapshot, translate, submit, queue statuses; no API writes).",
        );
        if let Some(w) = self.watch.get() {
            let _ = writeln!(
                out,
                "# HELP sweety_controller_watch_events_total Watch events by kind; outcome ignored: a status-only update.\n# TYPE sweety_controller_watch_events_total counter"
            );
            for ((kind, passed), n) in w.events() {
                let outcome = if passed { "reconcile" } else { "ignored" };
                let _ = writeln!(
                    out,
                    "sweety_controller_watch_events_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        self.event_to_ack.render(
            &mut out,
            "sweety_controller_watch_event_to_ack_seconds",
            "Time from the first watch event a reconcile covers to the dataplane's Ack of its config.",
        );
        counter(
            &mut out,
            "sweety_controller_translates_total",
            "Translations run.",
            &self.translates,
            "counter",
        );
        self.translate_duration.render(
            &mut out,
            "sweety_controller_translate_duration_seconds",
            "Duration of one translate.",
        );
        counter(
            &mut out,
            "sweety_controller_full_translates_total",
            "Translations that translated every route.",
            &self.full_translates,
            "counter",
        );
        counter(
            &mut out,
            "sweety_controller_plain_translates_total",
            "Full translations because the per-virtual-host memo could not serve.",
            &self.plain_translates,
            "counter",
        );
        self.push_latency.render(
            &mut out,
            "sweety_controller_push_latency_seconds",
            "Time from submitting a config to the pusher to the dataplane's Ack of it.",
        );
        counter(
            &mut out,
            "sweety_controller_config_bytes",
            "Size of the last submitted config (JSON).",
            &self.config_bytes,
            "gauge",
        );
        counter(
            &mut out,
            "sweety_controller_status_writes_total",
            "Status subresource writes (and Event sets published).",
            &self.status_writes,
            "counter",
        );
        counter(
            &mut out,
            "sweety_controller_status_queue_depth",
            "Statuses waiting to be written or in flight.",
            &self.status_queue_depth,
            "gauge",
        );
        self.status_write_duration.render(
            &mut out,
            "sweety_controller_status_write_duration_seconds",
            "Duration of one status write, requests included.",
        );
        counter(
            &mut out,
            "sweety_controller_leader",
            "1 while this replica holds the leader lease.",
            &self.leader,
            "gauge",
        );
        let _ = writeln!(
            out,
            "# HELP sweety_controller_objects Objects in the last snapshot.\n# TYPE sweety_controller_objects gauge"
        );
        for (kind, n) in self
            .objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "sweety_controller_objects{{kind=\"{kind}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP sweety_controller_errors_total Errors by kind.\n# TYPE sweety_controller_errors_total counter"
        );
        for (kind, n) in self.errors.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "sweety_controller_errors_total{{kind=\"{kind}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_labels() {
        let m = Metrics::default();
        m.reconciled("start");
        m.reconciled("HTTPRoute");
        m.reconciled("HTTPRoute");
        m.status_queue_depth.store(7, Ordering::Relaxed);
        m.event_to_ack.observe(Duration::from_millis(4));
        m.full_translates.store(5, Ordering::Relaxed);
        m.plain_translates.store(3, Ordering::Relaxed);
        m.translate_duration.observe(Duration::from_millis(3));
        m.error("kube");
        m.error("kube");
        m.set_objects(&[("Gateway", 4)]);
        let text = m.render();
        assert!(
            text.contains("sweety_controller_reconciles_total{cause=\"HTTPRoute\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("sweety_controller_reconciles_total{cause=\"start\"} 1\n"));
        assert_eq!(m.reconciles.load(Ordering::Relaxed), 3);
        assert_eq!(m.reconciles_of("HTTPRoute"), 2);
        assert!(text.contains("sweety_controller_status_queue_depth 7\n"));
        assert!(
            text.contains("sweety_controller_watch_event_to_ack_seconds_bucket{le=\"0.005\"} 1\n")
        );
        assert!(
            text.contains("sweety_controller_translate_duration_seconds_bucket{le=\"0.0025\"} 0\n")
        );
        assert!(
            text.contains("sweety_controller_translate_duration_seconds_bucket{le=\"0.005\"} 1\n")
        );
        assert!(text.contains("sweety_controller_translate_duration_seconds_count 1\n"));
        assert!(text.contains("sweety_controller_full_translates_total 5\n"));
        assert!(text.contains("sweety_controller_plain_translates_total 3\n"));
        assert!(text.contains("sweety_controller_errors_total{kind=\"kube\"} 2\n"));
        assert!(text.contains("sweety_controller_objects{kind=\"Gateway\"} 4\n"));
        assert_eq!(m.errors_of("kube"), 2);
    }
}
