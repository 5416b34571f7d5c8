//! The controller's Prometheus metrics, kept and exposed with `prometheus-client`: counters,
//! gauges and label families are the library's; the duration histograms are our own atomic
//! ones (their count and sum are read by tests), encoded through the library's encoder.
//! [`Metrics::render`] writes the Prometheus text format (served on `/metrics`). Every metric
//! and its labels: docs/observability.md.

use crate::translate::status::{Condition, ObjectStatus};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the duration histograms.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative).
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    /// Record one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|le| secs <= *le) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
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
}

/// A shared [`Histogram`], as the registry holds it.
#[derive(Debug, Default, Clone)]
pub struct SharedHistogram(Arc<Histogram>);

impl std::ops::Deref for SharedHistogram {
    type Target = Histogram;
    fn deref(&self) -> &Histogram {
        &self.0
    }
}

impl EncodeMetric for SharedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .zip(self.0.counts.iter())
            .map(|(le, n)| (*le, n.load(Ordering::Relaxed)))
            .collect();
        let sum = self.0.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, self.0.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The watch events of [`crate::watch::Activity`], read at scrape time.
#[derive(Debug, Default, Clone)]
struct WatchEvents(Arc<OnceLock<Arc<crate::watch::Activity>>>);

impl EncodeMetric for WatchEvents {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let Some(w) = self.0.get() else {
            return Ok(());
        };
        for ((kind, passed), n) in w.events() {
            let outcome = if passed { "reconcile" } else { "ignored" };
            encoder
                .encode_family(&[("kind", kind), ("outcome", outcome)])?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// One label naming a kind or a cause.
type Label = [(&'static str, &'static str); 1];

/// The labels of `sweety_controller_objects`: kind, condition type, status.
type ConditionLabels = [(&'static str, String); 3];

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles run (snapshot → translate → submit to the pusher → offer the statuses to
    /// the status worker), all causes together; by cause in `reconcile_causes`.
    pub reconciles: AtomicU64,
    /// Reconciles by cause: `start`, or the kind of the first watch event it covers.
    reconcile_causes: Family<Label, Counter>,
    /// One reconcile; no API write happens inside it.
    pub reconcile_duration: SharedHistogram,
    /// From the first watch event a reconcile covers to the dataplane's Ack of the config it
    /// submitted (only reconciles that changed the config).
    pub event_to_ack: SharedHistogram,
    /// Statuses waiting to be written or in flight (see `status_worker`).
    pub status_queue_depth: Gauge<u64, AtomicU64>,
    /// One status write (or one object's Events), request(s) included.
    pub status_write_duration: SharedHistogram,
    /// Watch events by kind, passed on or ignored (status-only updates).
    pub watch: Arc<OnceLock<Arc<crate::watch::Activity>>>,
    /// Calls of the pure `translate`.
    pub translates: Counter,
    /// Time each `translate` call took.
    pub translate_duration: SharedHistogram,
    /// Translations that translated every route (the first, a change of the world, or the
    /// per-virtual-host memo not serving; see `TranslateCache::full_translates`).
    pub full_translates: Counter,
    /// Of those, plain translations because the memo could not serve.
    pub plain_translates: Counter,
    /// Time from submitting a config to the pusher to the dataplane's Ack of that generation
    /// (as the pusher received it).
    pub push_latency: SharedHistogram,
    /// Size of the last config submitted, JSON-encoded.
    pub config_bytes: Gauge<u64, AtomicU64>,
    /// Status subresources written (server-side apply calls) and Event sets published.
    pub status_writes: Counter,
    /// Syncs of the per-Gateway Services (each lists what it owns and applies what differs).
    pub service_syncs: Counter,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge<u64, AtomicU64>,
    /// Highest config generation submitted to the pusher.
    pub submitted_generation: Gauge<u64, AtomicU64>,
    /// Generation the dataplane last reported running (Ack or Hello).
    pub acked_generation: Gauge<u64, AtomicU64>,
    /// 1 while the pusher is connected to the dataplane.
    pub dataplane_connected: Gauge<u64, AtomicU64>,
    /// Objects in the last snapshot, by kind.
    objects: Family<Label, Gauge>,
    /// Objects `translate` reports a status for, by kind, condition type and that condition's
    /// status (see [`ConditionCounts`]).
    objects_by_condition: Family<ConditionLabels, Gauge>,
    /// Errors by `Error::kind()`.
    errors: Family<Label, Counter>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut m = Metrics {
            reconciles: AtomicU64::new(0),
            reconcile_causes: Family::default(),
            reconcile_duration: SharedHistogram::default(),
            event_to_ack: SharedHistogram::default(),
            status_queue_depth: Gauge::default(),
            status_write_duration: SharedHistogram::default(),
            watch: Arc::default(),
            translates: Counter::default(),
            translate_duration: SharedHistogram::default(),
            full_translates: Counter::default(),
            plain_translates: Counter::default(),
            push_latency: SharedHistogram::default(),
            config_bytes: Gauge::default(),
            status_writes: Counter::default(),
            service_syncs: Counter::default(),
            leader: Gauge::default(),
            submitted_generation: Gauge::default(),
            acked_generation: Gauge::default(),
            dataplane_connected: Gauge::default(),
            objects: Family::default(),
            objects_by_condition: Family::default(),
            errors: Family::default(),
            registry: Registry::default(),
        };
        // Names as exposed, less the `_total` the library adds to counters.
        let r = &mut m.registry;
        r.register(
            "sweety_controller_reconciles",
            "Reconciles run, by cause (start, or the kind of the first watch event covered).",
            m.reconcile_causes.clone(),
        );
        r.register(
            "sweety_controller_reconcile_duration_seconds",
            "Duration of one reconcile (snapshot, translate, submit, queue statuses; no API writes).",
            m.reconcile_duration.clone(),
        );
        r.register(
            "sweety_controller_watch_events",
            "Watch events by kind; outcome ignored: a status-only update.",
            WatchEvents(m.watch.clone()),
        );
        r.register(
            "sweety_controller_watch_event_to_ack_seconds",
            "Time from the first watch event a reconcile covers to the dataplane's Ack of its config.",
            m.event_to_ack.clone(),
        );
        r.register(
            "sweety_controller_translates",
            "Translations run.",
            m.translates.clone(),
        );
        r.register(
            "sweety_controller_translate_duration_seconds",
            "Duration of one translate.",
            m.translate_duration.clone(),
        );
        r.register(
            "sweety_controller_full_translates",
            "Translations that translated every route.",
            m.full_translates.clone(),
        );
        r.register(
            "sweety_controller_plain_translates",
            "Full translations because the per-virtual-host memo could not serve.",
            m.plain_translates.clone(),
        );
        r.register(
            "sweety_controller_push_latency_seconds",
            "Time from submitting a config to the pusher to the dataplane's Ack of it.",
            m.push_latency.clone(),
        );
        r.register(
            "sweety_controller_config_bytes",
            "Size of the last submitted config (JSON).",
            m.config_bytes.clone(),
        );
        r.register(
            "sweety_controller_status_writes",
            "Status subresource writes (and Event sets published).",
            m.status_writes.clone(),
        );
        r.register(
            "sweety_controller_gateway_service_syncs",
            "Syncs of the per-Gateway Services (API reads and writes): after a reconcile whose wanted Services changed or that followed a watch event of another kind than a route, after gaining the lease, and retries.",
            m.service_syncs.clone(),
        );
        r.register(
            "sweety_controller_status_queue_depth",
            "Statuses waiting to be written or in flight.",
            m.status_queue_depth.clone(),
        );
        r.register(
            "sweety_controller_status_write_duration_seconds",
            "Duration of one status write, requests included.",
            m.status_write_duration.clone(),
        );
        r.register(
            "sweety_controller_leader",
            "1 while this replica holds the leader lease.",
            m.leader.clone(),
        );
        r.register(
            "sweety_controller_submitted_generation",
            "Highest config generation submitted for the dataplane.",
            m.submitted_generation.clone(),
        );
        r.register(
            "sweety_controller_acked_generation",
            "Config generation the dataplane last reported running (Ack or Hello).",
            m.acked_generation.clone(),
        );
        r.register(
            "sweety_controller_dataplane_connected",
            "1 while the controller is connected to the dataplane's control socket.",
            m.dataplane_connected.clone(),
        );
        r.register(
            "sweety_controller_snapshot_objects",
            "Objects in the last snapshot, by kind.",
            m.objects.clone(),
        );
        r.register(
            "sweety_controller_objects",
            "Objects translate reports a status for, by kind, condition type and status (an object with several parents counts once per condition: False if any parent says False, else Unknown if any says Unknown, else True).",
            m.objects_by_condition.clone(),
        );
        r.register(
            "sweety_controller_errors",
            "Errors by kind.",
            m.errors.clone(),
        );
        m
    }
}

impl Metrics {
    /// Count one error of this kind (`Error::kind()`).
    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&[("kind", kind)]).inc();
    }

    /// Errors counted so far for one kind.
    pub fn errors_of(&self, kind: &'static str) -> u64 {
        self.errors.get(&[("kind", kind)]).map_or(0, |c| c.get())
    }

    /// Count one reconcile of this cause.
    pub fn reconciled(&self, cause: &'static str) {
        self.reconciles.fetch_add(1, Ordering::Relaxed);
        self.reconcile_causes
            .get_or_create(&[("cause", cause)])
            .inc();
    }

    /// Reconciles counted so far for one cause.
    pub fn reconciles_of(&self, cause: &'static str) -> u64 {
        self.reconcile_causes
            .get(&[("cause", cause)])
            .map_or(0, |c| c.get())
    }

    /// Replace the per-kind object counts.
    pub fn set_objects(&self, counts: &[(&'static str, usize)]) {
        for (kind, n) in counts {
            self.objects
                .get_or_create(&[("kind", kind)])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the number of objects of `kind` whose `condition` is `status` (0: the series goes).
    fn set_condition_count(&self, (kind, condition, status): &ConditionKey, n: u64) {
        let labels = [
            ("kind", kind.clone()),
            ("condition", condition.clone()),
            ("status", status.to_string()),
        ];
        if n == 0 {
            self.objects_by_condition.remove(&labels);
        } else {
            self.objects_by_condition
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The Prometheus text exposition (version 0.0.4) of every metric. A labelled family
    /// with no sample yet is left out (the library's rule).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// (kind, condition type, status) of `sweety_controller_objects`.
type ConditionKey = (String, String, &'static str);

/// Objects by kind, condition type and status, kept up to date from the statuses `translate`
/// wants as they change (the status worker adds an object's new wanted status and takes out
/// its old one: no pass over every object per reconcile). Bounded labels: the kinds and
/// condition types are `translate`'s own (a fixed set), the statuses True, False, Unknown.
#[derive(Debug, Default)]
pub struct ConditionCounts {
    counts: BTreeMap<ConditionKey, u64>,
    /// Keys changed since the last [`ConditionCounts::publish`].
    touched: BTreeSet<ConditionKey>,
}

impl ConditionCounts {
    /// Counts an object of `kind` with `status`.
    pub fn add(&mut self, kind: &str, status: &ObjectStatus) {
        for key in keys(kind, status) {
            *self.counts.entry(key.clone()).or_default() += 1;
            self.touched.insert(key);
        }
    }

    /// Takes out an object of `kind` counted with `status`.
    pub fn remove(&mut self, kind: &str, status: &ObjectStatus) {
        for key in keys(kind, status) {
            if let Some(n) = self.counts.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.counts.remove(&key);
                }
            }
            self.touched.insert(key);
        }
    }

    /// Sets the gauge of every key changed since the last call.
    pub fn publish(&mut self, metrics: &Metrics) {
        for key in std::mem::take(&mut self.touched) {
            let n = self.counts.get(&key).copied().unwrap_or(0);
            metrics.set_condition_count(&key, n);
        }
    }
}

/// The (kind, condition type, status) keys one object's status counts under: each condition
/// type once, False if any of its entries (route parents, policy ancestors) says False, else
/// Unknown if any says Unknown, else True. An Ingress status has no conditions.
fn keys(kind: &str, status: &ObjectStatus) -> Vec<ConditionKey> {
    let lists: Vec<&[Condition]> = match status {
        ObjectStatus::GatewayClass(s) => vec![&s.conditions],
        ObjectStatus::Gateway(s) => vec![&s.conditions],
        ObjectStatus::ListenerSet(s) => vec![&s.conditions],
        ObjectStatus::Route(s) => s.parents.iter().map(|p| &p.conditions[..]).collect(),
        ObjectStatus::Policy(s) => s.ancestors.iter().map(|p| &p.conditions[..]).collect(),
        ObjectStatus::Ingress(_) => Vec::new(),
        ObjectStatus::Site(s) => vec![&s.conditions],
        ObjectStatus::Conditions(c) => vec![c],
    };
    // Worst first: False, Unknown, True.
    let rank = |s: &str| match s {
        "False" => 0,
        "True" => 2,
        _ => 1,
    };
    let mut worst: BTreeMap<&str, u8> = BTreeMap::new();
    for c in lists.into_iter().flatten() {
        let r = rank(&c.status);
        let w = worst.entry(c.type_.as_str()).or_insert(r);
        *w = (*w).min(r);
    }
    worst
        .into_iter()
        .map(|(t, r)| {
            let status = ["False", "Unknown", "True"][usize::from(r)];
            (kind.to_string(), t.to_string(), status)
        })
        .collect()
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
        m.status_queue_depth.set(7);
        m.event_to_ack.observe(Duration::from_millis(4));
        m.full_translates.inc_by(5);
        m.plain_translates.inc_by(3);
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
        assert!(text.contains("sweety_controller_snapshot_objects{kind=\"Gateway\"} 4\n"));
        assert_eq!(m.errors_of("kube"), 2);
    }

    #[test]
    fn dashboard_and_alert_rules_name_only_exposed_controller_metrics() {
        let m = Metrics::default();
        // Every labelled family gets a sample, so that the scrape declares it.
        m.reconciled("start");
        m.error("kube");
        m.set_objects(&[("Gateway", 1)]);
        let _ = m.watch.set(Arc::default());
        // The dataplane's helpers: one check for both components' names.
        use sweety_dataplane::metrics::expo::{declared_names, names_used};
        let exposed = declared_names(&m.render());
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let mut checked = 0;
        for file in [
            "deploy/grafana/sweety.json",
            "charts/sweety/files/prometheus-rules.yaml",
        ] {
            let Ok(text) = std::fs::read_to_string(format!("{root}/{file}")) else {
                assert_ne!(
                    file, "deploy/grafana/sweety.json",
                    "the dashboard is missing"
                );
                continue;
            };
            let used = names_used(&text, "sweety_controller_");
            let missing: Vec<_> = used.difference(&exposed).collect();
            assert!(
                missing.is_empty(),
                "{file} uses metrics the controller does not expose: {missing:?}"
            );
            checked += used.len();
        }
        assert!(checked > 0);
    }
}
