//! Metrics: counters and gauges kept in process by every stage of the data flow, rendered in
//! the Prometheus text format by the `/metrics` endpoint of `skipprd serve`.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// One series: metric name and its label pairs.
type Series = (&'static str, Vec<(&'static str, String)>);

struct Registry {
    values: BTreeMap<Series, f64>,
    help: BTreeMap<&'static str, (&'static str, &'static str)>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    values: BTreeMap::new(),
    help: BTreeMap::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Adds `v` to a counter.
pub fn add(name: &'static str, help: &'static str, labels: &[(&'static str, &str)], v: f64) {
    let mut r = registry();
    r.help.entry(name).or_insert((help, "counter"));
    let key = (
        name,
        labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
    );
    *r.values.entry(key).or_insert(0.0) += v;
}

/// Sets a gauge.
pub fn set(name: &'static str, help: &'static str, labels: &[(&'static str, &str)], v: f64) {
    let mut r = registry();
    r.help.entry(name).or_insert((help, "gauge"));
    let key = (
        name,
        labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
    );
    r.values.insert(key, v);
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

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Everything, in the Prometheus text exposition format.
pub fn render() -> String {
    let r = registry();
    let mut out = String::new();
    let mut last: Option<&str> = None;
    for ((name, labels), v) in &r.values {
        if last != Some(name) {
            if let Some((help, kind)) = r.help.get(name) {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            }
            last = Some(name);
        }
        out.push_str(name);
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            out.push_str(&format!("{{{}}}", l.join(",")));
        }
        out.push_str(&format!(" {v}\n"));
    }
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
        assert!(text.contains("# TYPE skippr_test_total counter"));
        assert!(text.contains("skippr_test_total{pipeline=\"a\\\"b\"} 3"));
        assert!(text.contains("# TYPE skippr_test_gauge gauge\nskippr_test_gauge 7.5"));
    }
}
