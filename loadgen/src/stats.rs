//! Measurement: latency histograms, throughput, lag and error counts, per second and in total.
//!
//! Every time is a `u64` of nanoseconds since the run's [`Clock`] base, so the same code
//! records real runs and synthetic schedules (the coordinated-omission test drives it with
//! a virtual clock). Latencies are kept in microseconds in HdrHistograms (3 significant
//! digits, 1 µs .. 1 h) and reported in milliseconds.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::scrape::LagPoint;

/// Highest latency a histogram holds; larger values are clamped (and still counted).
pub const LATENCY_MAX_US: u64 = 3_600_000_000;
/// Kafka's perf tools count a megabyte as 2^20 bytes; so do we, to be comparable.
pub const BYTES_PER_MB: f64 = 1024.0 * 1024.0;
const NS_PER_US: u64 = 1_000;
const NS_PER_S: f64 = 1e9;

/// The run's time base: every timestamp is nanoseconds since `base`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn start() -> Self {
        Self {
            base: Instant::now(),
        }
    }

    /// Nanoseconds since the base.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The `Instant` at `ns` after the base, for sleeping until a deadline.
    pub fn instant_at(&self, ns: u64) -> Instant {
        self.base + std::time::Duration::from_nanos(ns)
    }
}

/// A fresh latency histogram in microseconds.
pub fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts (low ≥ 1, high ≥ 2·low, sigfig ≤ 5).
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).unwrap_or_else(|_| unreachable!())
}

/// Latency between two clock readings, in µs, clamped to the histogram's range.
pub fn latency_us(from_ns: u64, to_ns: u64) -> u64 {
    (to_ns.saturating_sub(from_ns) / NS_PER_US).clamp(1, LATENCY_MAX_US)
}

/// The percentiles we report, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub p9999: f64,
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of a µs histogram, in ms; `None` when it is empty (no samples is no
    /// latency, not a latency of 0 ms).
    pub fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Some(Self {
            p50: ms(0.50),
            p90: ms(0.90),
            p99: ms(0.99),
            p999: ms(0.999),
            p9999: ms(0.9999),
            max: h.max() as f64 / 1000.0,
        })
    }
}

/// A latency in ms for text output: `-` when there is none.
pub fn ms_text(ms: Option<f64>) -> String {
    ms.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// One second of a run, as printed on the progress line and plotted in the report.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Second {
    /// Seconds since the run started (end of this interval).
    pub t_s: f64,
    /// Whether this second lies (partly) inside the warm-up, excluded from the summary.
    pub warmup: bool,
    pub acked_records: u64,
    pub acked_mb: f64,
    pub consumed_records: u64,
    pub records_per_sec: f64,
    pub mb_per_sec: f64,
    pub consumed_per_sec: f64,
    /// Latencies of this second; `None` (JSON null) when it had no samples.
    pub publish_avg_ms: Option<f64>,
    pub publish_p99_ms: Option<f64>,
    pub publish_max_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    /// Consumer lag sampled at the end of this second; `None` (JSON null) when the sample
    /// failed (a partition's log end could not be read).
    pub lag_records: Option<i64>,
    pub errors: u64,
}

/// What a run measured, with the keys `--json` writes (documented in the README).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Records acknowledged (or, with acks=0, written) after the warm-up.
    pub records: u64,
    pub bytes: u64,
    /// Length of the measured window (warm-up excluded), seconds.
    pub duration_s: f64,
    pub records_per_sec: f64,
    pub mb_per_sec: f64,
    pub consumed_records: u64,
    /// The consumers' measured window, seconds: from the warm-up end to the later of the
    /// run's end and the last record consumed. Consumers that catch up after the
    /// producers stop keep reading past `duration_s`; their rate is over their own window.
    #[serde(default)]
    pub consumed_duration_s: f64,
    /// `consumed_records` (and their bytes) over `consumed_duration_s`.
    pub consumed_records_per_sec: f64,
    pub consumed_mb_per_sec: f64,
    /// `None` (JSON null) when nothing was acknowledged / consumed with a latency.
    pub publish_latency_ms: Option<Percentiles>,
    pub e2e_latency_ms: Option<Percentiles>,
    /// Highest lag of the samples taken after the warm-up that succeeded.
    pub lag_max_records: i64,
    /// Lag samples after the warm-up that failed (lag unknown then: not in the max).
    #[serde(default)]
    pub lag_unknown_samples: u64,
    /// Error counts by Kafka error name (or a `Client...` name for client-side failures).
    pub errors: BTreeMap<String, u64>,
    pub timeline: Vec<Second>,
    /// Highest follower lag after the warm-up, records and ms (with `--metrics-url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follower_lag_max_records: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follower_lag_max_ms: Option<f64>,
    /// One point per scrape (with `--metrics-url`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub follower_lag: Vec<LagPoint>,
}

impl Summary {
    /// Attaches the scraped follower lag and its maxima.
    pub fn set_follower_lag(&mut self, points: Vec<LagPoint>) {
        let max = crate::scrape::maxima(&points);
        self.follower_lag_max_records = max.map(|m| m.0);
        self.follower_lag_max_ms = max.map(|m| m.1);
        self.follower_lag = points;
    }
}

/// Counters of the second in progress.
struct Interval {
    start_ns: u64,
    acked: u64,
    acked_bytes: u64,
    consumed: u64,
    publish_sum_us: u64,
    publish: Histogram<u64>,
    e2e: Histogram<u64>,
    errors: u64,
}

impl Interval {
    fn new(start_ns: u64) -> Self {
        Self {
            start_ns,
            acked: 0,
            acked_bytes: 0,
            consumed: 0,
            publish_sum_us: 0,
            publish: new_histogram(),
            e2e: new_histogram(),
            errors: 0,
        }
    }
}

/// Acknowledged records in a row with the same latency and warm-up side.
#[derive(Clone, Copy, Debug)]
struct AckRun {
    latency_us: u64,
    /// Intended at or after the warm-up end.
    measured: bool,
    records: u64,
}

struct Inner {
    publish: Histogram<u64>,
    e2e: Histogram<u64>,
    records: u64,
    bytes: u64,
    consumed: u64,
    consumed_bytes: u64,
    /// When the last record counted in `consumed` was read.
    consumed_last_ns: u64,
    errors: BTreeMap<String, u64>,
    lag_now: Option<i64>,
    lag_max: i64,
    lag_unknown: u64,
    interval: Interval,
    timeline: Vec<Second>,
}

impl Inner {
    fn add_acks(&mut self, r: AckRun, record_bytes: u64) {
        let (us, n) = (r.latency_us, r.records);
        // Interval statistics include the warm-up so the progress line is never blank.
        self.interval.acked += n;
        self.interval.acked_bytes += n * record_bytes;
        self.interval.publish_sum_us += n * us;
        let _ = self.interval.publish.record_n(us, n);
        if r.measured {
            self.records += n;
            self.bytes += n * record_bytes;
            let _ = self.publish.record_n(us, n);
        }
    }

    /// One consumed record: counted in the interval always, in the summary when it was
    /// produced (intended) after the warm-up — or, when it has no stamp of this run (not
    /// one of ours, or from an earlier run), consumed after it; then it has no e2e latency.
    fn consumed_one(
        &mut self,
        produced_ns: Option<u64>,
        consumed_ns: u64,
        record_bytes: u64,
        warmup_end_ns: u64,
    ) {
        self.interval.consumed += 1;
        let measured = match produced_ns {
            None => consumed_ns >= warmup_end_ns,
            Some(produced_ns) => {
                let us = latency_us(produced_ns, consumed_ns);
                let _ = self.interval.e2e.record(us);
                let measured = produced_ns >= warmup_end_ns;
                if measured {
                    let _ = self.e2e.record(us);
                }
                measured
            }
        };
        if measured {
            self.consumed += 1;
            self.consumed_bytes += record_bytes;
            self.consumed_last_ns = self.consumed_last_ns.max(consumed_ns);
        }
    }
}

/// Shared recorder of one run; producers, consumers and the progress thread all feed it.
///
/// A record counts toward the summary when its *intended* send time is at or after the
/// warm-up end, so the open-loop schedule decides what is measured, not the ack time.
pub struct Recorder {
    warmup_end_ns: u64,
    inner: Mutex<Inner>,
}

impl Recorder {
    /// A recorder that ignores records intended before `warmup_end_ns`.
    pub fn new(warmup_end_ns: u64) -> Self {
        Self {
            warmup_end_ns,
            inner: Mutex::new(Inner {
                publish: new_histogram(),
                e2e: new_histogram(),
                records: 0,
                bytes: 0,
                consumed: 0,
                consumed_bytes: 0,
                consumed_last_ns: 0,
                errors: BTreeMap::new(),
                lag_now: None,
                lag_max: 0,
                lag_unknown: 0,
                interval: Interval::new(0),
                timeline: Vec::new(),
            }),
        }
    }

    /// The warm-up end this recorder measures from.
    pub fn warmup_end_ns(&self) -> u64 {
        self.warmup_end_ns
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panicking recorder thread must not take the measurements down with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records acknowledged at `acked_ns`, each intended for sending at `intended_ns[i]`,
    /// each carrying `record_bytes` of payload.
    ///
    /// Every record's own latency is recorded (the ack time of its batch minus its intended
    /// time), but a run of neighbours with the same latency in µs goes into the histograms
    /// as one `record_n`: the histograms are exactly those of one `record` per record, and
    /// a batch of a closed loop (whose records share a few creation times) costs a few
    /// histogram updates instead of two per record.
    pub fn record_acks<I>(&self, intended_ns: I, acked_ns: u64, record_bytes: u64)
    where
        I: IntoIterator,
        I::Item: Borrow<u64>,
    {
        let mut g = self.lock();
        let inner = &mut *g;
        let mut run: Option<AckRun> = None;
        for t in intended_ns {
            let t = *t.borrow();
            let next = AckRun {
                latency_us: latency_us(t, acked_ns),
                measured: t >= self.warmup_end_ns,
                records: 1,
            };
            match &mut run {
                Some(r) if r.latency_us == next.latency_us && r.measured == next.measured => {
                    r.records += 1;
                }
                _ => {
                    if let Some(r) = run.replace(next) {
                        inner.add_acks(r, record_bytes);
                    }
                }
            }
        }
        if let Some(r) = run {
            inner.add_acks(r, record_bytes);
        }
    }

    /// A record produced (intended) at `produced_ns` was consumed at `consumed_ns`.
    pub fn record_consumed(&self, produced_ns: Option<u64>, consumed_ns: u64, record_bytes: u64) {
        self.record_consumed_all([(produced_ns, record_bytes)], consumed_ns);
    }

    /// Records consumed together at `consumed_ns` (one fetched batch), each with when it
    /// was produced (intended) and its bytes: under one lock, since the consumer threads
    /// share the recorder and a lock per record was a seventh of a consumer's CPU.
    pub fn record_consumed_all(
        &self,
        records: impl IntoIterator<Item = (Option<u64>, u64)>,
        consumed_ns: u64,
    ) {
        let mut g = self.lock();
        for (produced_ns, record_bytes) in records {
            g.consumed_one(produced_ns, consumed_ns, record_bytes, self.warmup_end_ns);
        }
    }

    /// `n` failures with the given name (a Kafka error name or a `Client...` name).
    pub fn record_error(&self, name: &str, n: u64) {
        let mut g = self.lock();
        g.interval.errors += n;
        *g.errors.entry(name.to_string()).or_insert(0) += n;
    }

    /// The consumer lag sampled now (log end offset minus position, summed over partitions).
    pub fn record_lag(&self, lag_records: i64, now_ns: u64) {
        let mut g = self.lock();
        g.lag_now = Some(lag_records);
        if now_ns >= self.warmup_end_ns {
            g.lag_max = g.lag_max.max(lag_records);
        }
    }

    /// A lag sample failed: the lag is unknown now (not the last value, not 0); counted
    /// as an error `ClientLagUnknown` and in the summary's `lag_unknown_samples`.
    pub fn record_lag_unknown(&self, now_ns: u64) {
        let mut g = self.lock();
        g.lag_now = None;
        if now_ns >= self.warmup_end_ns {
            g.lag_unknown += 1;
        }
        drop(g);
        self.record_error("ClientLagUnknown", 1);
    }

    /// Closes the current second at `now_ns` and returns it (for the progress line).
    pub fn tick(&self, now_ns: u64) -> Second {
        let mut g = self.lock();
        let iv = std::mem::replace(&mut g.interval, Interval::new(now_ns));
        let secs = (now_ns.saturating_sub(iv.start_ns) as f64 / NS_PER_S).max(1e-9);
        let sec = Second {
            t_s: now_ns as f64 / NS_PER_S,
            warmup: iv.start_ns < self.warmup_end_ns,
            acked_records: iv.acked,
            acked_mb: iv.acked_bytes as f64 / BYTES_PER_MB,
            consumed_records: iv.consumed,
            records_per_sec: iv.acked as f64 / secs,
            mb_per_sec: iv.acked_bytes as f64 / BYTES_PER_MB / secs,
            consumed_per_sec: iv.consumed as f64 / secs,
            publish_avg_ms: (iv.acked > 0)
                .then(|| iv.publish_sum_us as f64 / iv.acked as f64 / 1000.0),
            publish_p99_ms: Percentiles::of(&iv.publish).map(|p| p.p99),
            publish_max_ms: Percentiles::of(&iv.publish).map(|p| p.max),
            e2e_p99_ms: Percentiles::of(&iv.e2e).map(|p| p.p99),
            lag_records: g.lag_now,
            errors: iv.errors,
        };
        g.timeline.push(sec.clone());
        sec
    }

    /// The summary of the window from the warm-up end to `end_ns`; the consumed rates are
    /// over the consumers' own window, which ends no earlier than their last record.
    pub fn summary(&self, end_ns: u64) -> Summary {
        let g = self.lock();
        let window =
            |end: u64| (end.saturating_sub(self.warmup_end_ns) as f64 / NS_PER_S).max(1e-9);
        let secs = window(end_ns);
        let consumed_secs = window(end_ns.max(g.consumed_last_ns));
        Summary {
            records: g.records,
            bytes: g.bytes,
            duration_s: secs,
            records_per_sec: g.records as f64 / secs,
            mb_per_sec: g.bytes as f64 / BYTES_PER_MB / secs,
            consumed_records: g.consumed,
            consumed_duration_s: consumed_secs,
            consumed_records_per_sec: g.consumed as f64 / consumed_secs,
            consumed_mb_per_sec: g.consumed_bytes as f64 / BYTES_PER_MB / consumed_secs,
            publish_latency_ms: Percentiles::of(&g.publish),
            e2e_latency_ms: Percentiles::of(&g.e2e),
            lag_max_records: g.lag_max,
            lag_unknown_samples: g.lag_unknown,
            errors: g.errors.clone(),
            timeline: g.timeline.clone(),
            follower_lag_max_records: None,
            follower_lag_max_ms: None,
            follower_lag: Vec::new(),
        }
    }

    /// The full publish histogram (µs), for the percentile-distribution plot.
    pub fn publish_histogram(&self) -> Histogram<u64> {
        self.lock().publish.clone()
    }

    /// The full end-to-end histogram (µs).
    pub fn e2e_histogram(&self) -> Histogram<u64> {
        self.lock().e2e.clone()
    }
}

/// The kafka-producer-perf-test style progress line for one second.
pub fn progress_line(s: &Second) -> String {
    let mut parts = Vec::new();
    if s.acked_records > 0 || s.consumed_records == 0 {
        parts.push(format!(
            "{} records acked, {:.1} records/sec ({:.2} MB/sec), {} ms avg latency, \
             {} ms p99, {} ms max latency",
            s.acked_records,
            s.records_per_sec,
            s.mb_per_sec,
            ms_text(s.publish_avg_ms),
            ms_text(s.publish_p99_ms),
            ms_text(s.publish_max_ms)
        ));
    }
    // A second without a lag sample (no consumers, or before the first) shows none; a
    // failed sample is counted among the errors.
    if s.consumed_records > 0 || s.lag_records.is_some_and(|l| l > 0) {
        parts.push(format!(
            "{} records consumed, {:.1} records/sec, {} ms e2e p99, lag {}",
            s.consumed_records,
            s.consumed_per_sec,
            ms_text(s.e2e_p99_ms),
            s.lag_records
                .map_or_else(|| "unknown".to_string(), |l| l.to_string())
        ));
    }
    if s.errors > 0 {
        parts.push(format!("{} errors", s.errors));
    }
    let mut line = parts.join("; ");
    if s.warmup {
        line.push_str(" (warm-up)");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_produce_only_second_shows_no_consumer_part() {
        let produced = Second {
            acked_records: 10,
            ..Second::default()
        };
        assert!(!progress_line(&produced).contains("consumed"));
        let behind = Second {
            lag_records: Some(5),
            ..Second::default()
        };
        assert!(progress_line(&behind).contains("lag 5"));
    }

    #[test]
    fn percentiles_of_uniform_latencies() {
        let r = Recorder::new(0);
        // 1..=1000 ms, one record each.
        for ms in 1..=1000u64 {
            r.record_acks([0], ms * 1_000_000, 100);
        }
        let s = r.summary(1_000_000_000);
        let p = s.publish_latency_ms.expect("acks were recorded");
        assert!((p.p50 - 500.0).abs() < 2.0, "{p:?}");
        assert!((p.p90 - 900.0).abs() < 2.0, "{p:?}");
        assert!((p.p99 - 990.0).abs() < 2.0, "{p:?}");
        assert!((p.max - 1000.0).abs() < 2.0, "{p:?}");
        assert_eq!(s.records, 1000);
        assert!((s.records_per_sec - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn a_batch_records_what_one_record_at_a_time_would() {
        // Runs of equal intended times (a closed loop's bursts), distinct ones (an open
        // loop) and both sides of the warm-up end, acknowledged together.
        let warmup_end = 1_000_000;
        let mut intended: Vec<u64> = vec![10; 300];
        intended.extend((0..500).map(|i| 900_000 + i * 1_700));
        intended.extend(vec![2_000_000; 40]);
        intended.push(10);
        let acked = 3_000_000;
        let batch = Recorder::new(warmup_end);
        let single = Recorder::new(warmup_end);
        batch.record_acks(intended.iter(), acked, 1000);
        for t in &intended {
            single.record_acks([*t], acked, 1000);
        }
        let (b, s) = (batch.lock(), single.lock());
        assert_eq!(b.publish, s.publish);
        assert_eq!(b.interval.publish, s.interval.publish);
        assert_eq!(
            (b.records, b.bytes, b.interval.acked, b.interval.acked_bytes),
            (s.records, s.bytes, s.interval.acked, s.interval.acked_bytes)
        );
        assert_eq!(b.interval.publish_sum_us, s.interval.publish_sum_us);
        assert_eq!(b.interval.acked, intended.len() as u64);
        assert!(
            b.records > 0 && b.records < b.interval.acked,
            "both sides of the warm-up"
        );
    }

    #[test]
    fn warmup_records_are_not_measured() {
        let r = Recorder::new(1_000_000_000);
        r.record_acks([500_000_000], 1_100_000_000, 10); // intended in warm-up
        r.record_acks([1_000_000_000], 1_002_000_000, 10); // first measured
        let s = r.summary(2_000_000_000);
        assert_eq!(s.records, 1);
        assert_eq!(s.bytes, 10);
        assert!(
            s.publish_latency_ms
                .is_some_and(|p| (p.max - 2.0).abs() < 0.01)
        );
        let sec = r.tick(2_000_000_000);
        assert_eq!(
            sec.acked_records, 2,
            "the progress line shows warm-up acks too"
        );
        assert!(sec.warmup);
    }

    /// Producers ran 10 s at 2,000 records/s; consumers throttled to 1,000 records/s
    /// took 20 s to read it all (catching up after the producers stopped). The consumed
    /// rate is what they read over their own 20 s, not over the 10 s produce window.
    #[test]
    fn the_consumed_rate_is_over_the_consumers_window() {
        let r = Recorder::new(0);
        let s_ns = 1_000_000_000u64;
        for i in 0..20_000u64 {
            let produced = i * s_ns / 2_000;
            r.record_acks([produced], produced + 1_000_000, 100);
            r.record_consumed(Some(produced), i * s_ns / 1_000, 100);
        }
        let s = r.summary(10 * s_ns);
        assert!((s.records_per_sec - 2_000.0).abs() < 1.0, "{s:?}");
        assert_eq!(s.consumed_records, 20_000);
        assert!(
            (s.consumed_records_per_sec - 1_000.0).abs() < 10.0,
            "consumed {} records/s",
            s.consumed_records_per_sec
        );
        let mb = 20_000.0 * 100.0 / BYTES_PER_MB / 20.0;
        assert!((s.consumed_mb_per_sec - mb).abs() < mb / 100.0, "{s:?}");
    }

    /// A run without consumers (or without acks) has no latency to report: no 0 ms.
    #[test]
    fn an_empty_histogram_is_no_value_not_zero() {
        let r = Recorder::new(0);
        r.record_acks([0], 2_000_000, 100);
        let j = serde_json::to_value(r.summary(1_000_000_000)).unwrap_or_default();
        assert!(j["publish_latency_ms"]["p99"].as_f64().is_some(), "{j}");
        assert!(j["e2e_latency_ms"].is_null(), "{j}");
        let sec = serde_json::to_value(r.tick(1_000_000_000)).unwrap_or_default();
        assert!(sec["e2e_p99_ms"].is_null(), "{sec}");
        let idle = serde_json::to_value(r.tick(2_000_000_000)).unwrap_or_default();
        for k in ["publish_avg_ms", "publish_p99_ms", "publish_max_ms"] {
            assert!(idle[k].is_null(), "{k}: {idle}");
        }
        let text = crate::report::summary_text(&Recorder::new(0).summary(1));
        assert!(
            text.contains("publish  latency ms: - (no samples)"),
            "{text}"
        );
        assert!(!text.contains("p50 0.00"), "{text}");
    }

    /// A batch recorded under one lock counts as its records one by one would: the
    /// warm-up rule (by intended time, or consumed time for records without a stamp), the
    /// bytes, the e2e histogram and the interval's count.
    #[test]
    fn a_batch_recorded_at_once_counts_as_its_records_one_by_one() {
        let warmup = 1_000_000;
        let batch = [
            (Some(500_000), 100),   // intended in the warm-up: interval only
            (Some(1_500_000), 200), // measured: 0.5 ms e2e
            (None, 300),            // not ours, consumed after the warm-up: counted
            (Some(1_900_000), 400),
        ];
        let (one, all) = (Recorder::new(warmup), Recorder::new(warmup));
        for (stamp, bytes) in batch {
            one.record_consumed(stamp, 2_000_000, bytes);
        }
        all.record_consumed_all(batch, 2_000_000);
        let (a, b) = (one.summary(3_000_000), all.summary(3_000_000));
        assert_eq!(a.consumed_records, 3);
        assert_eq!(b.consumed_records, a.consumed_records);
        assert_eq!(b.consumed_mb_per_sec, a.consumed_mb_per_sec);
        let e2e = |s: &Summary| serde_json::to_value(s.e2e_latency_ms).unwrap_or_default();
        assert_eq!(e2e(&b), e2e(&a));
        assert!(!e2e(&a).is_null());
        let (ta, tb) = (one.tick(3_000_000), all.tick(3_000_000));
        assert_eq!(
            serde_json::to_value(tb).unwrap_or_default(),
            serde_json::to_value(ta).unwrap_or_default()
        );
    }

    #[test]
    fn errors_are_counted_by_name() {
        let r = Recorder::new(0);
        r.record_error("NotLeaderOrFollower", 2);
        r.record_error("NotLeaderOrFollower", 1);
        r.record_error("ClientConnectionLost", 1);
        let s = r.summary(1);
        assert_eq!(s.errors.get("NotLeaderOrFollower"), Some(&3));
        assert_eq!(s.errors.get("ClientConnectionLost"), Some(&1));
    }
}
