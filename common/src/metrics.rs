//! Prometheus building blocks shared by the master's and the agent's `/metrics`
//! (feature `metrics`): a histogram of atomics (no lock on the path that observes),
//! a family of them told apart by one label, and the bucket bounds both use.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// A histogram of fixed buckets made of atomics only (prometheus-client's own
/// histogram takes a lock per observation).
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative; summed when encoded).
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum in millionths of the unit.
    sum_micros: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds (ascending; +Inf is implied).
    pub fn new(bounds: &'static [f64]) -> AtomicHistogram {
        AtomicHistogram {
            bounds,
            counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one value.
    pub fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// The sum, the count and the observations of each bucket alone (+Inf last),
    /// as prometheus-client's `encode_histogram` takes them: it adds them up into
    /// the cumulative `_bucket` lines itself.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(bound, n)| (*bound, n.load(Ordering::Relaxed)))
            .collect();
        let finite: u64 = buckets.iter().map(|(_, n)| n).sum();
        // Observed without a lock: the count may lag the buckets for a moment.
        let count = self.count.load(Ordering::Relaxed).max(finite);
        buckets.push((f64::INFINITY, count - finite));
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (sum, count, buckets)
    }
}

/// A process-wide histogram, registered in a per-scrape registry.
#[derive(Debug)]
pub struct Static(pub &'static AtomicHistogram);

impl EncodeMetric for Static {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.0.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Histograms of one metric told apart by one label whose values are fixed (a
/// step, a direction), each an [`AtomicHistogram`]: observing takes no lock and
/// allocates nothing. Every value is shown, observed or not.
#[derive(Debug)]
pub struct HistogramFamily {
    label: &'static str,
    values: &'static [&'static str],
    histograms: Vec<AtomicHistogram>,
}

impl HistogramFamily {
    /// One histogram with these bounds per value of `label`.
    pub fn new(
        label: &'static str,
        values: &'static [&'static str],
        bounds: &'static [f64],
    ) -> HistogramFamily {
        HistogramFamily {
            label,
            values,
            histograms: values
                .iter()
                .map(|_| AtomicHistogram::new(bounds))
                .collect(),
        }
    }

    /// Records one value in the histogram of the label value at `index` of the
    /// values it was made with (out of range: ignored).
    pub fn observe(&self, index: usize, value: f64) {
        if let Some(h) = self.histograms.get(index) {
            h.observe(value);
        }
    }

    /// The histogram of the label value at `index`.
    pub fn get(&self, index: usize) -> Option<&AtomicHistogram> {
        self.histograms.get(index)
    }
}

/// A process-wide histogram family, registered in a per-scrape registry.
#[derive(Debug)]
pub struct StaticFamily(pub &'static HistogramFamily);

impl EncodeMetric for StaticFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let family = self.0;
        for (value, h) in family.values.iter().zip(&family.histograms) {
            let labels = [(family.label, *value)];
            let (sum, count, buckets) = h.snapshot();
            encoder
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The text exposition (OpenMetrics) of a registry.
pub fn text(registry: &prometheus_client::registry::Registry) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        // Writing to a String cannot fail; an encoder error would be a bug.
        let _ = writeln!(out, "# metrics could not be encoded");
    }
    out
}

/// Bucket bounds for durations, in seconds (0.5 ms to 10 s).
pub const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Bucket bounds for sizes (batches, sets), in items.
pub const SIZES: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_exposed_cumulative_with_an_infinite_bucket() {
        static HISTOGRAM: std::sync::LazyLock<AtomicHistogram> =
            std::sync::LazyLock::new(|| AtomicHistogram::new(&[1.0, 2.0]));
        for v in [0.5, 1.5, 1.7, 9.0] {
            HISTOGRAM.observe(v);
        }
        let (sum, count, buckets) = HISTOGRAM.snapshot();
        assert_eq!(count, 4);
        assert!((sum - 12.7).abs() < 1e-6);
        assert_eq!(buckets, vec![(1.0, 1), (2.0, 2), (f64::INFINITY, 1)]);
        // What a scraper reads: each bucket counts everything at or below its bound.
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("commit_seconds", "Commits", Static(&HISTOGRAM));
        let out = text(&registry);
        for line in [
            "commit_seconds_bucket{le=\"1.0\"} 1",
            "commit_seconds_bucket{le=\"2.0\"} 3",
            "commit_seconds_bucket{le=\"inf\"} 4",
            "commit_seconds_count 4",
        ] {
            assert!(out.lines().any(|l| l == line), "no `{line}` in\n{out}");
        }
    }

    #[test]
    fn a_family_shows_every_label_value_with_its_own_histogram() {
        static FAMILY: std::sync::LazyLock<HistogramFamily> =
            std::sync::LazyLock::new(|| HistogramFamily::new("step", &["term", "kill"], &[1.0]));
        FAMILY.observe(1, 0.5);
        FAMILY.observe(1, 3.0);
        FAMILY.observe(7, 1.0);
        assert_eq!(FAMILY.get(0).map(|h| h.snapshot().1), Some(0));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("escalation_step_seconds", "Steps", StaticFamily(&FAMILY));
        let out = text(&registry);
        assert!(
            out.contains("# TYPE escalation_step_seconds histogram"),
            "{out}"
        );
        assert!(
            out.contains("escalation_step_seconds_count{step=\"term\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("escalation_step_seconds_count{step=\"kill\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("escalation_step_seconds_bucket{le=\"1.0\",step=\"kill\"} 1")
                || out.contains("escalation_step_seconds_bucket{step=\"kill\",le=\"1.0\"} 1"),
            "{out}"
        );
    }
}
