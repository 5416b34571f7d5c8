//! The Prometheus text exposition of the dataplane's metrics, written by `prometheus-client`'s
//! encoder (names, `_total` suffixes, HELP/TYPE lines, label escaping, histogram buckets).
//!
//! The values are read from the dataplane's own lock-free counters at scrape time into an
//! [`Exposition`] (an owned snapshot), which the library encodes as one collector. The request
//! path never touches the library: see docs/observability.md for the measurement that chose
//! this split.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Labels of one sample: name and value pairs, in order.
pub type Labels = Vec<(&'static str, String)>;

/// One sample's value.
#[derive(Debug)]
pub enum Value {
    /// A counter's value.
    Counter(u64),
    /// A gauge's value.
    Gauge(i64),
    /// A histogram: sum (seconds), count, and per-bucket (not cumulative) counts by upper
    /// bound; the `+Inf` bucket is the count.
    Histogram {
        /// Sum of the observations.
        sum: f64,
        /// Number of observations.
        count: u64,
        /// `(upper bound, observations in this bucket only)`.
        buckets: Vec<(f64, u64)>,
    },
}

/// One metric family: its name as exposed (counters end in `_total`), help and samples.
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

impl Family {
    /// Adds one sample.
    pub fn sample(&mut self, labels: Labels, value: Value) -> &mut Family {
        self.samples.push((labels, value));
        self
    }
}

/// Everything one scrape exposes.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    /// Starts a family. `name` is the full exposed name (`..._total` for a counter).
    pub fn family(
        &mut self,
        name: &'static str,
        kind: MetricType,
        help: &'static str,
    ) -> &mut Family {
        self.families.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    /// An unlabelled counter.
    pub fn counter(&mut self, name: &'static str, help: &'static str, v: u64) {
        self.family(name, MetricType::Counter, help)
            .sample(Vec::new(), Value::Counter(v));
    }

    /// An unlabelled gauge.
    pub fn gauge(&mut self, name: &'static str, help: &'static str, v: i64) {
        self.family(name, MetricType::Gauge, help)
            .sample(Vec::new(), Value::Gauge(v));
    }

    /// The names of every family, as exposed (for checks of dashboards and alerts).
    pub fn names(&self) -> Vec<&'static str> {
        self.families.iter().map(|f| f.name).collect()
    }

    /// The Prometheus text format (version 0.0.4).
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::with_capacity(8192);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            // The library appends `_total` to counters itself.
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
                _ => f.name,
            };
            let mut m = encoder.encode_descriptor(name, f.help, None, f.kind)?;
            for (labels, value) in &f.samples {
                let mut s = m.encode_family(labels)?;
                match value {
                    Value::Counter(v) => s.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                    Value::Gauge(v) => s.encode_gauge(v)?,
                    Value::Histogram {
                        sum,
                        count,
                        buckets,
                    } => s.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

/// The metric names a text exposition declares (its `# TYPE` lines), with the `_bucket`,
/// `_sum` and `_count` series of histograms: what a query may name. With [`names_used`], the
/// one check (dataplane and controller tests) that a dashboard or alert rule names only
/// metrics that exist.
pub fn declared_names(scrape: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for l in scrape.lines() {
        let Some((name, kind)) = l.strip_prefix("# TYPE ").and_then(|r| r.split_once(' ')) else {
            continue;
        };
        names.insert(name.to_string());
        if kind == "histogram" {
            for s in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{s}"));
            }
        }
    }
    names
}

/// The whole identifiers (`[A-Za-z0-9_]+`) in `text` (a dashboard, alert rules) that start
/// with `prefix` and are longer than it.
pub fn names_used(text: &str, prefix: &str) -> std::collections::BTreeSet<String> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = text.as_bytes();
    let mut used = std::collections::BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].find(prefix) {
        let start = i + at;
        let mut end = start + prefix.len();
        while end < b.len() && ident(b[end]) {
            end += 1;
        }
        if (start == 0 || !ident(b[start - 1])) && end > start + prefix.len() {
            used.insert(text[start..end].to_string());
        }
        i = end;
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_gauges_histograms_with_escaped_labels() {
        let mut e = Exposition::default();
        e.family("x_requests_total", MetricType::Counter, "Requests.")
            .sample(vec![("route", "a\"b\\c\nd".into())], Value::Counter(3));
        e.gauge("x_open", "Open things.", -2);
        e.family("x_duration_seconds", MetricType::Histogram, "Time.")
            .sample(
                vec![("route", "r".into())],
                Value::Histogram {
                    sum: 0.5,
                    count: 3,
                    buckets: vec![(0.1, 1), (1.0, 1)],
                },
            );
        e.family("x_empty_total", MetricType::Counter, "Nothing yet.");
        assert_eq!(
            e.names(),
            [
                "x_requests_total",
                "x_open",
                "x_duration_seconds",
                "x_empty_total"
            ]
        );
        let text = e.render();
        assert_eq!(
            text,
            "# HELP x_requests_total Requests.\n\
             # TYPE x_requests_total counter\n\
             x_requests_total{route=\"a\\\"b\\\\c\\nd\"} 3\n\
             # HELP x_open Open things.\n\
             # TYPE x_open gauge\n\
             x_open -2\n\
             # HELP x_duration_seconds Time.\n\
             # TYPE x_duration_seconds histogram\n\
             x_duration_seconds_bucket{route=\"r\",le=\"0.1\"} 1\n\
             x_duration_seconds_bucket{route=\"r\",le=\"1\"} 2\n\
             x_duration_seconds_bucket{route=\"r\",le=\"+Inf\"} 3\n\
             x_duration_seconds_sum{route=\"r\"} 0.5\n\
             x_duration_seconds_count{route=\"r\"} 3\n\
             # HELP x_empty_total Nothing yet.\n\
             # TYPE x_empty_total counter\n"
        );
    }

    #[test]
    fn names_used_takes_whole_identifiers_and_declared_names_histogram_series() {
        let text = r#"rate(sweety_a_total[5m]) xsweety_b sweety_ "sweety_c_bucket{le=\"1\"}""#;
        let used: Vec<_> = names_used(text, "sweety_").into_iter().collect();
        assert_eq!(used, ["sweety_a_total", "sweety_c_bucket"]);
        let scrape = "# TYPE sweety_c histogram\n# TYPE sweety_a counter\nsweety_a_total 1\n";
        let declared: Vec<_> = declared_names(scrape).into_iter().collect();
        assert_eq!(
            declared,
            [
                "sweety_a",
                "sweety_c",
                "sweety_c_bucket",
                "sweety_c_count",
                "sweety_c_sum"
            ]
        );
    }
}
