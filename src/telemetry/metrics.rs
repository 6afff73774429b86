//! Metrics: counters and gauges kept in process by every stage of the data flow, held in a
//! `prometheus-client` registry and rendered (OpenMetrics text) by the `/metrics` endpoint of
//! `skipprd serve`, and of `skipprd sync` when `skippr.metrics.listen` is set (see `endpoint`).
//!
//! Stages name a metric where they count it (`add`, `set`); the family is registered on first
//! use, so the set of metrics stays next to the code that produces them.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label pairs of one series.
type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter<f64, AtomicU64>>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Buckets of the duration histograms, in seconds: 10 ms to 2 minutes.
const SECONDS_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0,
];

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

#[derive(Default)]
struct Metrics {
    registry: Registry,
    counters: HashMap<&'static str, Counters>,
    gauges: HashMap<&'static str, Gauges>,
    histograms: HashMap<&'static str, Histograms>,
}

static METRICS: LazyLock<Mutex<Metrics>> = LazyLock::new(Mutex::default);

fn metrics() -> MutexGuard<'static, Metrics> {
    METRICS.lock().unwrap_or_else(|e| e.into_inner())
}

fn labels(labels: &[(&'static str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// The registry adds the period that ends a help text, and the `_total` that ends a counter.
fn help_text(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

/// Adds `v` to a counter (its name ends in `_total`).
pub fn add(name: &'static str, help: &'static str, l: &[(&'static str, &str)], v: f64) {
    let family = {
        let mut m = metrics();
        let Metrics {
            registry, counters, ..
        } = &mut *m;
        counters
            .entry(name)
            .or_insert_with(|| {
                let family = Counters::default();
                let base = name.strip_suffix("_total").unwrap_or(name);
                registry.register(base, help_text(help), family.clone());
                family
            })
            .clone()
    };
    family.get_or_create(&labels(l)).inc_by(v);
}

/// Sets a gauge.
pub fn set(name: &'static str, help: &'static str, l: &[(&'static str, &str)], v: f64) {
    let family = {
        let mut m = metrics();
        let Metrics {
            registry, gauges, ..
        } = &mut *m;
        gauges
            .entry(name)
            .or_insert_with(|| {
                let family = Gauges::default();
                registry.register(name, help_text(help), family.clone());
                family
            })
            .clone()
    };
    family.get_or_create(&labels(l)).set(v);
}

/// Observes a duration in seconds in a histogram (buckets from 10 ms to 2 minutes).
pub fn observe_seconds(name: &'static str, help: &'static str, l: &[(&'static str, &str)], v: f64) {
    let family = {
        let mut m = metrics();
        let Metrics {
            registry,
            histograms,
            ..
        } = &mut *m;
        histograms
            .entry(name)
            .or_insert_with(|| {
                let family =
                    Histograms::new_with_constructor(seconds_histogram as fn() -> Histogram);
                registry.register(name, help_text(help), family.clone());
                family
            })
            .clone()
    };
    family.get_or_create(&labels(l)).observe(v);
}

/// A gateway statement was answered as a lookup by primary key, without the planner.
pub fn key_lookup() {
    add(
        "skippr_key_lookups_total",
        "Gateway statements answered as lookups by primary key (planned once, at Parse).",
        &[],
        1.0,
    );
}

/// A statement of the gateway finished.
pub fn query_done(elapsed: Duration, ok: bool) {
    let status = if ok { "ok" } else { "error" };
    add(
        "skippr_queries_total",
        "Statements run through the gateway, by outcome.",
        &[("status", status)],
        1.0,
    );
    add(
        "skippr_query_seconds_total",
        "Time spent running gateway statements, in seconds.",
        &[],
        elapsed.as_secs_f64(),
    );
}

/// The media type of `render`'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything, in the OpenMetrics text format (which Prometheus scrapes).
pub fn render() -> String {
    let m = metrics();
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        add(
            "skippr_test_total",
            "A test counter.",
            &[("pipeline", "a\"b")],
            2.0,
        );
        add(
            "skippr_test_total",
            "A test counter.",
            &[("pipeline", "a\"b")],
            1.0,
        );
        set("skippr_test_gauge", "A test gauge.", &[], 7.5);
        let text = render();
        assert!(text.contains("# HELP skippr_test A test counter.\n# TYPE skippr_test counter"));
        assert!(
            text.contains("skippr_test_total{pipeline=\"a\\\"b\"} 3.0"),
            "{text}"
        );
        assert!(text.contains("# TYPE skippr_test_gauge gauge\nskippr_test_gauge 7.5"));
        assert!(text.ends_with("# EOF\n"));
    }
}
