//! Metrics: per-shard registries of atomic counters, written by their own shard only
//! (relaxed adds, no lock, no shared cache line between shards), summed when scraped, and
//! a Prometheus text endpoint (`metrics.listener`, off by default) served by one plain
//! thread off the shards.
//!
//! Why not a metrics crate's registry: those keep one registry per process with a lock
//! around each label lookup, on the data path of every shard. Here a shard finds its
//! counters in its own table (an array by API key and version, a shard-local map by topic)
//! and only the scrape walks them all. The text exposition format is Prometheus's
//! documented one (`# HELP`, `# TYPE`, `name{labels} value`).

pub mod http;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// API keys counted (Kafka's keys are below this).
const API_KEYS: usize = 96;
/// Versions counted per API (higher versions are counted as this - 1).
const VERSIONS: usize = 24;
/// Upper bounds of the request latency buckets, in seconds.
const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// A latency histogram of atomics (cumulative buckets are computed at scrape).
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let s = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS_S.iter().position(|b| s <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

/// Bytes and records in and out of one topic, on one shard.
#[derive(Default)]
pub struct TopicCounters {
    pub bytes_in: AtomicU64,
    pub records_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub records_out: AtomicU64,
}

/// One shard's counters. Only that shard writes them.
pub struct ShardMetrics {
    requests: Vec<AtomicU64>,
    /// Requests that ended with the connection closed (undecodable, unsupported).
    closed: Vec<AtomicU64>,
    latency: Vec<Histogram>,
    topics: Mutex<BTreeMap<String, Arc<TopicCounters>>>,
    /// Gauges the shard publishes from its housekeeping.
    pub partitions_open: AtomicU64,
    pub fetch_response_bytes_held: AtomicU64,
    pub connections_open: AtomicU64,
    /// KIP-227 fetch sessions cached, their partitions, and sessions evicted (a count).
    pub fetch_sessions: AtomicU64,
    pub fetch_session_partitions: AtomicU64,
    pub fetch_session_evictions: AtomicU64,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            requests: (0..API_KEYS * VERSIONS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            closed: (0..API_KEYS).map(|_| AtomicU64::new(0)).collect(),
            latency: (0..API_KEYS).map(|_| Histogram::default()).collect(),
            topics: Mutex::new(BTreeMap::new()),
            partitions_open: AtomicU64::new(0),
            fetch_response_bytes_held: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            fetch_sessions: AtomicU64::new(0),
            fetch_session_partitions: AtomicU64::new(0),
            fetch_session_evictions: AtomicU64::new(0),
        }
    }
}

thread_local! {
    /// This shard thread's view of its topic counters: the data path looks here, without
    /// the registry's lock, which only a topic's first use takes.
    static TOPICS: RefCell<HashMap<String, Arc<TopicCounters>>> = RefCell::new(HashMap::new());
}

/// Most topics a shard keeps counters for (bounds memory under a flood of names).
const TOPICS_MAX: usize = 100_000;

impl ShardMetrics {
    /// Counts one request of `api_key` v`version` that took `elapsed`; `closed` when it
    /// ended the connection.
    pub fn request(&self, api_key: i16, version: i16, elapsed: Duration, closed: bool) {
        let (Ok(key), Ok(v)) = (usize::try_from(api_key), usize::try_from(version)) else {
            return;
        };
        if key >= API_KEYS {
            return;
        }
        let v = v.min(VERSIONS - 1);
        self.requests[key * VERSIONS + v].fetch_add(1, Ordering::Relaxed);
        if closed {
            self.closed[key].fetch_add(1, Ordering::Relaxed);
        }
        self.latency[key].observe(elapsed);
    }

    /// The counters of `topic` on this shard (call on the shard's own thread).
    pub fn topic(&self, topic: &str) -> Option<Arc<TopicCounters>> {
        if let Some(c) = TOPICS.with(|t| t.borrow().get(topic).cloned()) {
            return Some(c);
        }
        let mut registry = self.topics.lock().ok()?;
        if registry.len() >= TOPICS_MAX && !registry.contains_key(topic) {
            return None;
        }
        let c = registry.entry(topic.to_string()).or_default().clone();
        TOPICS.with(|t| t.borrow_mut().insert(topic.to_string(), c.clone()));
        Some(c)
    }

    /// Adds a produce's appended bytes and records to `topic`.
    pub fn produced(&self, topic: &str, bytes: u64, records: u64) {
        if let Some(c) = self.topic(topic) {
            c.bytes_in.fetch_add(bytes, Ordering::Relaxed);
            c.records_in.fetch_add(records, Ordering::Relaxed);
        }
    }

    /// Adds a fetch response's bytes and records to `topic`.
    pub fn fetched(&self, topic: &str, bytes: u64, records: u64) {
        if let Some(c) = self.topic(topic) {
            c.bytes_out.fetch_add(bytes, Ordering::Relaxed);
            c.records_out.fetch_add(records, Ordering::Relaxed);
        }
    }
}

/// Every shard's registry.
pub struct NodeMetrics {
    shards: Vec<ShardMetrics>,
}

impl NodeMetrics {
    pub fn new(shards: usize) -> NodeMetrics {
        NodeMetrics {
            shards: (0..shards.max(1))
                .map(|_| ShardMetrics::default())
                .collect(),
        }
    }

    /// Shard `i`'s registry (the last one for an out-of-range index).
    pub fn shard(&self, i: usize) -> &ShardMetrics {
        &self.shards[i.min(self.shards.len() - 1)]
    }

    /// The Prometheus text exposition of everything, summed over shards where the
    /// metric is node-wide, per shard where it says `shard`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_requests(&mut out);
        self.render_topics(&mut out);
        self.render_gauges(&mut out);
        out
    }

    fn render_requests(&self, out: &mut String) {
        let name = |key: usize| {
            i16::try_from(key)
                .ok()
                .and_then(wire::api::lookup)
                .map_or_else(|| format!("key{key}"), |e| e.name.to_string())
        };
        header(
            out,
            "weir_requests_total",
            "counter",
            "Requests served, by API and version.",
        );
        for key in 0..API_KEYS {
            for v in 0..VERSIONS {
                let n: u64 = self.sum(|s| &s.requests[key * VERSIONS + v]);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "weir_requests_total{{api=\"{}\",version=\"{v}\"}} {n}",
                        name(key)
                    );
                }
            }
        }
        header(
            out,
            "weir_request_errors_total",
            "counter",
            "Requests that closed their connection (undecodable or unsupported), by API.",
        );
        for key in 0..API_KEYS {
            let n = self.sum(|s| &s.closed[key]);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "weir_request_errors_total{{api=\"{}\"}} {n}",
                    name(key)
                );
            }
        }
        header(
            out,
            "weir_request_duration_seconds",
            "histogram",
            "Time from a request's frame to its response being ready, by API.",
        );
        for key in 0..API_KEYS {
            let count = self.sum(|s| &s.latency[key].count);
            if count == 0 {
                continue;
            }
            let api = name(key);
            let mut cumulative = 0;
            for (i, bound) in LATENCY_BUCKETS_S.iter().enumerate() {
                cumulative += self.sum(|s| &s.latency[key].buckets[i]);
                let _ = writeln!(
                    out,
                    "weir_request_duration_seconds_bucket{{api=\"{api}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "weir_request_duration_seconds_bucket{{api=\"{api}\",le=\"+Inf\"}} {count}"
            );
            let sum_s = self.sum(|s| &s.latency[key].sum_micros) as f64 / 1e6;
            let _ = writeln!(
                out,
                "weir_request_duration_seconds_sum{{api=\"{api}\"}} {sum_s}"
            );
            let _ = writeln!(
                out,
                "weir_request_duration_seconds_count{{api=\"{api}\"}} {count}"
            );
        }
    }

    fn render_topics(&self, out: &mut String) {
        let mut totals: BTreeMap<String, [u64; 4]> = BTreeMap::new();
        for s in &self.shards {
            let Ok(topics) = s.topics.lock() else {
                continue;
            };
            for (name, c) in topics.iter() {
                let t = totals.entry(name.clone()).or_default();
                t[0] += c.bytes_in.load(Ordering::Relaxed);
                t[1] += c.records_in.load(Ordering::Relaxed);
                t[2] += c.bytes_out.load(Ordering::Relaxed);
                t[3] += c.records_out.load(Ordering::Relaxed);
            }
        }
        let series = [
            (
                "weir_topic_bytes_in_total",
                "Record bytes appended by Produce, by topic.",
            ),
            (
                "weir_topic_records_in_total",
                "Records appended by Produce, by topic.",
            ),
            (
                "weir_topic_bytes_out_total",
                "Record bytes returned by Fetch, by topic.",
            ),
            (
                "weir_topic_records_out_total",
                "Records returned by Fetch, by topic.",
            ),
        ];
        for (i, (metric, help)) in series.iter().enumerate() {
            header(out, metric, "counter", help);
            for (topic, t) in &totals {
                let _ = writeln!(out, "{metric}{{topic=\"{}\"}} {}", escape(topic), t[i]);
            }
        }
    }

    fn render_gauges(&self, out: &mut String) {
        let gauges: [Gauge; 5] = [
            (
                "weir_partitions_open",
                "Partition logs open, by shard.",
                |s| &s.partitions_open,
            ),
            (
                "weir_fetch_response_buffer_bytes",
                "Bytes held by Fetch responses not yet written, by shard.",
                |s| &s.fetch_response_bytes_held,
            ),
            (
                "weir_connections_open",
                "Client connections open, by shard.",
                |s| &s.connections_open,
            ),
            (
                "weir_fetch_sessions",
                "KIP-227 incremental fetch sessions cached, by shard.",
                |s| &s.fetch_sessions,
            ),
            (
                "weir_fetch_session_partitions",
                "Partitions cached by fetch sessions, by shard.",
                |s| &s.fetch_session_partitions,
            ),
        ];
        for (metric, help, get) in gauges {
            header(out, metric, "gauge", help);
            for (i, s) in self.shards.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{metric}{{shard=\"{i}\"}} {}",
                    get(s).load(Ordering::Relaxed)
                );
            }
        }
        let evictions = "weir_fetch_session_evictions_total";
        header(
            out,
            evictions,
            "counter",
            "Fetch sessions evicted to make room for a new one.",
        );
        let n = self.sum(|s| &s.fetch_session_evictions);
        let _ = writeln!(out, "{evictions} {n}");
    }

    fn sum(&self, pick: impl Fn(&ShardMetrics) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|s| pick(s).load(Ordering::Relaxed))
            .sum()
    }
}

/// A per-shard gauge: name, help, and where it lives in a shard's registry.
type Gauge = (&'static str, &'static str, fn(&ShardMetrics) -> &AtomicU64);

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value in the text format: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_summed_and_the_text_format_is_prometheus() {
        let m = NodeMetrics::new(2);
        m.shard(0).request(0, 9, Duration::from_micros(300), false);
        m.shard(1).request(0, 9, Duration::from_millis(3), false);
        m.shard(1).request(1, 12, Duration::from_millis(30), true);
        m.shard(0).produced("orders", 100, 4);
        let text = m.render();
        assert!(
            text.contains("weir_requests_total{api=\"Produce\",version=\"9\"} 2"),
            "{text}"
        );
        assert!(text.contains("weir_request_errors_total{api=\"Fetch\"} 1"));
        assert!(
            text.contains("weir_request_duration_seconds_bucket{api=\"Produce\",le=\"0.0005\"} 1")
        );
        assert!(
            text.contains("weir_request_duration_seconds_bucket{api=\"Produce\",le=\"0.005\"} 2")
        );
        assert!(text.contains("weir_request_duration_seconds_count{api=\"Produce\"} 2"));
        assert!(text.contains("weir_topic_bytes_in_total{topic=\"orders\"} 100"));
        assert!(text.contains("weir_topic_records_in_total{topic=\"orders\"} 4"));
        assert!(text.contains("# TYPE weir_partitions_open gauge"));
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
