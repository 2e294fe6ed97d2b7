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
pub mod snapshot;

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

/// Upper bounds of the fsync latency buckets, in seconds (an SSD's fdatasync is 0.1-5 ms).
const FSYNC_BUCKETS_S: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0,
];
/// Upper bounds of the replication round trip's phase buckets, in seconds (finer than
/// request latency's below 10 ms: an acks=all round trip on one machine is 1-10 ms).
const REPLICATION_BUCKETS_S: [f64; 17] = [
    0.00005, 0.0001, 0.0002, 0.0004, 0.0007, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.02, 0.05, 0.1, 0.5, 2.0,
];
/// Upper bounds of the produce batch size buckets, in bytes.
const BATCH_BUCKETS_BYTES: [f64; 10] = [
    256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];
/// Upper bounds of the group-commit buckets: appends made durable by one fdatasync.
const GROUP_COMMIT_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// A histogram of atomics over fixed bucket bounds (cumulative counts are computed at
/// scrape). The sum is kept in integer units of `unit` (1e-6 for seconds: microseconds).
struct Histogram {
    bounds: &'static [f64],
    unit: f64,
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_units: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(&LATENCY_BUCKETS_S, 1e-6)
    }
}

impl Histogram {
    fn new(bounds: &'static [f64], unit: f64) -> Histogram {
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        assert!(unit > 0.0);
        Histogram {
            bounds,
            unit,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_units: AtomicU64::new(0),
        }
    }

    fn observe(&self, elapsed: Duration) {
        self.observe_value(elapsed.as_secs_f64());
    }

    /// Counts one observation of `v` (in the metric's unit: seconds, bytes, appends).
    fn observe_value(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let units = (v / self.unit).round();
        let units = if units.is_finite() && units > 0.0 {
            units.min(u64::MAX as f64) as u64
        } else {
            0
        };
        self.sum_units.fetch_add(units, Ordering::Relaxed);
    }
}

/// Why a connection was refused (`weir_connections_refused_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `max.connections` reached, node-wide.
    MaxConnections = 0,
    /// `max.connections.per.ip` reached for the client's address.
    MaxConnectionsPerIp = 1,
    /// SASL authentication failed (the connection closes after the answer).
    AuthenticationFailed = 2,
    /// The TLS handshake failed or timed out.
    TlsHandshake = 3,
}

impl Refusal {
    const ALL: [Refusal; 4] = [
        Refusal::MaxConnections,
        Refusal::MaxConnectionsPerIp,
        Refusal::AuthenticationFailed,
        Refusal::TlsHandshake,
    ];

    fn label(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::MaxConnectionsPerIp => "max_connections_per_ip",
            Refusal::AuthenticationFailed => "authentication_failed",
            Refusal::TlsHandshake => "tls_handshake",
        }
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
    /// Kafka's request time split, by API: read to handler start (queue), and response
    /// ready to written (send); `latency` is the handler's time (local + remote).
    queue: Vec<Histogram>,
    send: Vec<Histogram>,
    topics: Mutex<BTreeMap<String, Arc<TopicCounters>>>,
    /// Gauges the shard publishes from its housekeeping.
    pub partitions_open: AtomicU64,
    pub fetch_response_bytes_held: AtomicU64,
    pub connections_open: AtomicU64,
    /// Bytes of this shard's request budget (`queued.max.request.bytes`) held by frames.
    pub request_budget_bytes_held: AtomicU64,
    /// Record bytes per partition of a Produce.
    produce_batch: Histogram,
    /// Time a Fetch waited for data (`max_wait_ms`), and an acks=all append for its ISR.
    fetch_wait: Histogram,
    produce_replication_wait: Histogram,
    /// The acks=all round trip's phases: the leader's own append until written (Kafka's
    /// local time), a follower's Fetch until its response arrived, a follower's append
    /// until written, and on the leader a follower's turnaround (records answered to its
    /// next fetch of the partition).
    produce_local: Histogram,
    replica_fetch_response: Histogram,
    replica_append: Histogram,
    follower_turnaround: Histogram,
    /// Storage: appends, fdatasyncs of segment files, their latency, and how many appends
    /// one group-commit fdatasync made durable.
    pub storage_appends: AtomicU64,
    /// Segment writes (one per I/O round of a log, maybe several DMA writes), split by
    /// whether they carry batches this node assigned offsets to (a leader's) or copied.
    pub storage_leader_writes: AtomicU64,
    pub storage_follower_writes: AtomicU64,
    pub storage_fdatasyncs: AtomicU64,
    fsync_latency: Histogram,
    group_commit: Histogram,
    /// Idempotence: resent batches answered from the dedup window, and refused ones.
    pub producer_duplicates: AtomicU64,
    pub producer_out_of_order: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    /// KIP-368: SASL re-authentications that succeeded, and connections closed because
    /// their session expired before they re-authenticated.
    pub sasl_reauthentications: AtomicU64,
    pub sasl_sessions_expired: AtomicU64,
    /// Replication: committed ISR changes seen by a leader, and its fetchers' traffic.
    pub isr_shrinks: AtomicU64,
    pub isr_expands: AtomicU64,
    pub replica_fetch_bytes: AtomicU64,
    pub replica_fetch_errors: AtomicU64,
    /// KIP-392: consumer partition reads a leader sent to a closer replica, and those a
    /// follower answered with records (and their records).
    pub fetch_preferred_read_replica: AtomicU64,
    pub fetch_follower_reads: AtomicU64,
    pub fetch_follower_records: AtomicU64,
    /// What the shard's housekeeping computed from its state, replaced once per tick.
    pub snapshot: Mutex<snapshot::ShardSnapshot>,
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
            queue: (0..API_KEYS).map(|_| Histogram::default()).collect(),
            send: (0..API_KEYS).map(|_| Histogram::default()).collect(),
            topics: Mutex::new(BTreeMap::new()),
            partitions_open: AtomicU64::new(0),
            fetch_response_bytes_held: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            request_budget_bytes_held: AtomicU64::new(0),
            produce_batch: Histogram::new(&BATCH_BUCKETS_BYTES, 1.0),
            fetch_wait: Histogram::default(),
            produce_replication_wait: Histogram::default(),
            produce_local: Histogram::new(&REPLICATION_BUCKETS_S, 1e-6),
            replica_fetch_response: Histogram::new(&REPLICATION_BUCKETS_S, 1e-6),
            replica_append: Histogram::new(&REPLICATION_BUCKETS_S, 1e-6),
            follower_turnaround: Histogram::new(&REPLICATION_BUCKETS_S, 1e-6),
            storage_appends: AtomicU64::new(0),
            storage_leader_writes: AtomicU64::new(0),
            storage_follower_writes: AtomicU64::new(0),
            storage_fdatasyncs: AtomicU64::new(0),
            fsync_latency: Histogram::new(&FSYNC_BUCKETS_S, 1e-6),
            group_commit: Histogram::new(&GROUP_COMMIT_BUCKETS, 1.0),
            producer_duplicates: AtomicU64::new(0),
            producer_out_of_order: AtomicU64::new(0),
            refused: Default::default(),
            sasl_reauthentications: AtomicU64::new(0),
            sasl_sessions_expired: AtomicU64::new(0),
            isr_shrinks: AtomicU64::new(0),
            isr_expands: AtomicU64::new(0),
            replica_fetch_bytes: AtomicU64::new(0),
            replica_fetch_errors: AtomicU64::new(0),
            fetch_preferred_read_replica: AtomicU64::new(0),
            fetch_follower_reads: AtomicU64::new(0),
            fetch_follower_records: AtomicU64::new(0),
            snapshot: Mutex::default(),
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

thread_local! {
    /// The registry of the shard running on this thread, for layers that do not hold the
    /// shard (storage, producer state, replica state): one thread-local read, no lock.
    static LOCAL: RefCell<Option<(Arc<NodeMetrics>, usize)>> = const { RefCell::new(None) };
}

/// Makes shard `shard`'s registry the one [`local`] finds on this thread.
pub fn bind_thread(node: Arc<NodeMetrics>, shard: usize) {
    LOCAL.with(|l| *l.borrow_mut() = Some((node, shard)));
}

/// Runs `f` on this thread's shard registry; nothing on a thread no shard runs on (unit
/// tests, tools), so the layers below stay usable without a node.
pub fn local(f: impl FnOnce(&ShardMetrics)) {
    LOCAL.with(|l| {
        if let Some((node, i)) = l.borrow().as_ref() {
            f(node.shard(*i));
        }
    });
}

/// Counts a leader's committed ISR change from `old` to `new`: a shrink if a member left,
/// an expand if one joined (both if one was swapped for another).
pub fn isr_changed(old: &[wire::NodeId], new: &[wire::NodeId]) {
    if old.iter().any(|n| !new.contains(n)) {
        add(|m| &m.isr_shrinks, 1);
    }
    if new.iter().any(|n| !old.contains(n)) {
        add(|m| &m.isr_expands, 1);
    }
}

/// Adds `n` to the counter `pick` of this thread's shard registry.
pub fn add(pick: fn(&ShardMetrics) -> &AtomicU64, n: u64) {
    local(|m| {
        pick(m).fetch_add(n, Ordering::Relaxed);
    });
}

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

    /// Counts the queue time of a request (frame read to handler start).
    pub fn queued(&self, api_key: i16, elapsed: Duration) {
        if let Some(h) = usize::try_from(api_key)
            .ok()
            .and_then(|k| self.queue.get(k))
        {
            h.observe(elapsed);
        }
    }

    /// Counts the send time of a response (ready to written to the socket).
    pub fn sent(&self, api_key: i16, elapsed: Duration) {
        if let Some(h) = usize::try_from(api_key).ok().and_then(|k| self.send.get(k)) {
            h.observe(elapsed);
        }
    }

    /// One partition's records of a Produce, `bytes` long.
    pub fn produce_batch(&self, bytes: u64) {
        self.produce_batch.observe_value(bytes as f64);
    }

    /// A Fetch waited `elapsed` for data (0 when it answered at once).
    pub fn fetch_waited(&self, elapsed: Duration) {
        self.fetch_wait.observe(elapsed);
    }

    /// An acks=all append waited `elapsed` for its ISR.
    pub fn replication_waited(&self, elapsed: Duration) {
        self.produce_replication_wait.observe(elapsed);
    }

    /// A leader's append for a Produce took `elapsed` until its own write completed.
    pub fn produce_appended(&self, elapsed: Duration) {
        self.produce_local.observe(elapsed);
    }

    /// A replication fetcher's Fetch took `elapsed` until its response arrived (the
    /// leader's long poll included).
    pub fn replica_fetched(&self, elapsed: Duration) {
        self.replica_fetch_response.observe(elapsed);
    }

    /// A follower's append of fetched records took `elapsed` until written.
    pub fn replica_appended(&self, elapsed: Duration) {
        self.replica_append.observe(elapsed);
    }

    /// On a leader: a follower's next fetch of a partition arrived `elapsed` after its
    /// previous one was answered with records.
    pub fn follower_turned_around(&self, elapsed: Duration) {
        self.follower_turnaround.observe(elapsed);
    }

    /// One fdatasync of a segment file took `elapsed`; `appends` is how many appends it
    /// made durable when it was a group commit (None for seals and truncations).
    pub fn fdatasync(&self, elapsed: Duration, appends: Option<u64>) {
        self.storage_fdatasyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_latency.observe(elapsed);
        if let Some(n) = appends.filter(|n| *n > 0) {
            self.group_commit.observe_value(n as f64);
        }
    }

    /// A SASL re-authentication succeeded (KIP-368).
    pub fn reauthenticated(&self) {
        self.sasl_reauthentications.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed because its SASL session expired (KIP-368).
    pub fn session_expired(&self) {
        self.sasl_sessions_expired.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection refused (or closed unserved) for `why`.
    pub fn refused(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
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

    /// Drops the counters of a deleted `topic` on this shard (call on the shard's own
    /// thread): a deleted topic leaves the scrape, and its slot under [`TOPICS_MAX`]
    /// goes back for new names.
    pub fn forget_topic(&self, topic: &str) {
        TOPICS.with(|t| t.borrow_mut().remove(topic));
        if let Ok(mut registry) = self.topics.lock() {
            registry.remove(topic);
        }
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
        self.render_phases(&mut out);
        self.render_topics(&mut out);
        self.render_gauges(&mut out);
        self.render_node_histograms(&mut out);
        self.render_counters(&mut out);
        render_controller_notices(&mut out);
        snapshot::render(&self.shards, &mut out);
        out
    }

    /// The queue and send parts of Kafka's request time split, by API.
    fn render_phases(&self, out: &mut String) {
        let phases: [HistogramFamily<[Histogram]>; 2] = [
            (
                "weir_request_queue_seconds",
                "Time from a request's frame being read to its handler starting (Kafka's queue time), by API.",
                |s| &s.queue,
            ),
            (
                "weir_request_send_seconds",
                "Time to write a ready response to the socket (Kafka's send time), by API.",
                |s| &s.send,
            ),
        ];
        for (metric, help, pick) in phases {
            header(out, metric, "histogram", help);
            for key in 0..API_KEYS {
                let hs: Vec<&Histogram> = self.shards.iter().map(|s| &pick(s)[key]).collect();
                if hs
                    .iter()
                    .map(|h| h.count.load(Ordering::Relaxed))
                    .sum::<u64>()
                    == 0
                {
                    continue;
                }
                let label = format!("api=\"{}\"", api_name(key));
                write_histogram(out, metric, &label, &hs);
            }
        }
    }

    /// Node-wide histograms (summed over shards).
    fn render_node_histograms(&self, out: &mut String) {
        let all: [HistogramFamily<Histogram>; 9] = [
            (
                "weir_produce_batch_size_bytes",
                "Record bytes of one partition of a Produce request.",
                |s| &s.produce_batch,
            ),
            (
                "weir_fetch_wait_seconds",
                "Time a Fetch waited for data within its max_wait_ms (Kafka's remote time of Fetch).",
                |s| &s.fetch_wait,
            ),
            (
                "weir_produce_replication_wait_seconds",
                "Time an acks=all append waited for its ISR (Kafka's remote time of Produce), per partition.",
                |s| &s.produce_replication_wait,
            ),
            (
                "weir_produce_local_seconds",
                "Time a Produce's append took on the leader until its own write completed (Kafka's local time), per partition.",
                |s| &s.produce_local,
            ),
            (
                "weir_replica_fetch_response_seconds",
                "Time a replication fetcher's Fetch took until its response arrived (the leader's long poll included).",
                |s| &s.replica_fetch_response,
            ),
            (
                "weir_replica_append_seconds",
                "Time a follower's append of fetched records took until written.",
                |s| &s.replica_append,
            ),
            (
                "weir_follower_fetch_turnaround_seconds",
                "On a leader: time from answering a follower's fetch with records to its next fetch of that partition.",
                |s| &s.follower_turnaround,
            ),
            (
                "weir_storage_fsync_seconds",
                "Latency of fdatasync on segment files.",
                |s| &s.fsync_latency,
            ),
            (
                "weir_storage_group_commit_appends",
                "Appends made durable by one group-commit fdatasync.",
                |s| &s.group_commit,
            ),
        ];
        for (metric, help, pick) in all {
            header(out, metric, "histogram", help);
            let hs: Vec<&Histogram> = self.shards.iter().map(pick).collect();
            write_histogram(out, metric, "", &hs);
        }
    }

    /// Node-wide counters (summed over shards).
    fn render_counters(&self, out: &mut String) {
        let counters: [Gauge; 15] = [
            (
                "weir_storage_appends_total",
                "Appends to partition logs.",
                |s| &s.storage_appends,
            ),
            (
                "weir_storage_leader_writes_total",
                "Segment writes of batches this node assigned offsets to (appends per write: appends / writes).",
                |s| &s.storage_leader_writes,
            ),
            (
                "weir_storage_follower_writes_total",
                "Segment writes of batches copied from a leader.",
                |s| &s.storage_follower_writes,
            ),
            (
                "weir_storage_fdatasyncs_total",
                "fdatasync calls on segment files (group commit: fewer than appends).",
                |s| &s.storage_fdatasyncs,
            ),
            (
                "weir_producer_duplicates_total",
                "Resent idempotent batches answered from the dedup window instead of appended.",
                |s| &s.producer_duplicates,
            ),
            (
                "weir_producer_out_of_order_total",
                "Idempotent batches refused with OUT_OF_ORDER_SEQUENCE_NUMBER.",
                |s| &s.producer_out_of_order,
            ),
            (
                "weir_isr_shrinks_total",
                "Committed ISR changes that removed a replica, seen by the partition's leader.",
                |s| &s.isr_shrinks,
            ),
            (
                "weir_isr_expands_total",
                "Committed ISR changes that added a replica, seen by the partition's leader.",
                |s| &s.isr_expands,
            ),
            (
                "weir_replica_fetch_bytes_total",
                "Record bytes the replication fetchers appended to follower logs.",
                |s| &s.replica_fetch_bytes,
            ),
            (
                "weir_replica_fetch_errors_total",
                "Replication fetch rounds or connects that failed (the fetcher reconnects).",
                |s| &s.replica_fetch_errors,
            ),
            (
                "weir_fetch_preferred_read_replica_total",
                "Consumer Fetch partitions this leader answered with a closer replica to read from (KIP-392).",
                |s| &s.fetch_preferred_read_replica,
            ),
            (
                "weir_fetch_follower_reads_total",
                "Consumer Fetch partitions this node answered with records as a follower (KIP-392).",
                |s| &s.fetch_follower_reads,
            ),
            (
                "weir_fetch_follower_records_total",
                "Records this node served to consumers as a follower (KIP-392).",
                |s| &s.fetch_follower_records,
            ),
            (
                "weir_sasl_reauthentications_total",
                "SASL re-authentications that succeeded on a live connection (KIP-368).",
                |s| &s.sasl_reauthentications,
            ),
            (
                "weir_sasl_expired_connections_closed_total",
                "Connections closed at a request after their SASL session expired (KIP-368).",
                |s| &s.sasl_sessions_expired,
            ),
        ];
        for (metric, help, get) in counters {
            header(out, metric, "counter", help);
            let _ = writeln!(out, "{metric} {}", self.sum(get));
        }
        let metric = "weir_connections_refused_total";
        header(
            out,
            metric,
            "counter",
            "Connections refused or closed unserved, by reason.",
        );
        for why in Refusal::ALL {
            let n = self.sum(|s| &s.refused[why as usize]);
            let _ = writeln!(out, "{metric}{{reason=\"{}\"}} {n}", why.label());
        }
    }

    fn render_requests(&self, out: &mut String) {
        let name = api_name;
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
            let sum_s = self.sum(|s| &s.latency[key].sum_units) as f64 / 1e6;
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
        let gauges: [Gauge; 6] = [
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
                "weir_request_budget_bytes",
                "Bytes of queued.max.request.bytes held by request frames being read or handled, by shard.",
                |s| &s.request_budget_bytes_held,
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

/// The name of API `key` as Kafka spells it (`key{N}` for an unknown one).
fn api_name(key: usize) -> String {
    i16::try_from(key)
        .ok()
        .and_then(wire::api::lookup)
        .map_or_else(|| format!("key{key}"), |e| e.name.to_string())
}

/// Writes the series of one histogram summed over `hs` (one per shard), with `labels`
/// (`a="b"`, or empty) before `le`.
fn write_histogram(out: &mut String, metric: &str, labels: &str, hs: &[&Histogram]) {
    let Some(first) = hs.first() else {
        return;
    };
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (i, bound) in first.bounds.iter().enumerate() {
        cumulative += hs
            .iter()
            .map(|h| h.buckets[i].load(Ordering::Relaxed))
            .sum::<u64>();
        let _ = writeln!(
            out,
            "{metric}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
        );
    }
    let count: u64 = hs.iter().map(|h| h.count.load(Ordering::Relaxed)).sum();
    let units: u64 = hs.iter().map(|h| h.sum_units.load(Ordering::Relaxed)).sum();
    let _ = writeln!(out, "{metric}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{metric}_sum{braces} {}", units as f64 * first.unit);
    let _ = writeln!(out, "{metric}_count{braces} {count}");
}

/// Histograms of a family: name, help, and where they live in a shard's registry.
type HistogramFamily<H> = (&'static str, &'static str, fn(&ShardMetrics) -> &H);

/// A per-shard gauge: name, help, and where it lives in a shard's registry.
type Gauge = (&'static str, &'static str, fn(&ShardMetrics) -> &AtomicU64);

pub(crate) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value in the text format: backslash, quote and newline escaped.
pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Image changes the controller announced to this node's shards (a cluster node; each
/// notice makes every shard re-sync its partitions, so a climbing count with no metadata
/// change is churn worth finding).
fn render_controller_notices(out: &mut String) {
    use std::fmt::Write as _;
    let n = crate::controller::bridge::WAKES.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP weir_controller_notices_total Metadata image changes announced to this node's shards (each re-syncs its partitions).\n# TYPE weir_controller_notices_total counter\nweir_controller_notices_total {n}"
    );
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
    #[test]
    fn the_new_families_sum_over_shards_and_keep_the_text_format() {
        let m = NodeMetrics::new(2);
        m.shard(0).fdatasync(Duration::from_micros(80), Some(3));
        m.shard(1).fdatasync(Duration::from_millis(3), None);
        m.shard(0).produce_batch(1000);
        m.shard(1).produce_batch(5000);
        m.shard(1).refused(Refusal::MaxConnectionsPerIp);
        m.shard(0).queued(0, Duration::from_micros(50));
        m.shard(0).sent(1, Duration::from_micros(50));
        m.shard(1).isr_shrinks.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = m.shard(1).snapshot.lock() {
            s.under_replicated = 1;
            s.high_watermarks.insert((Arc::from("t"), 0), 10);
            s.groups.push(snapshot::GroupSnapshot {
                id: "g".into(),
                state: "Stable",
                members: 2,
                offsets: vec![(Arc::from("t"), 0, 4), (Arc::from("u"), 0, 1)],
            });
        }
        let text = m.render();
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        has("weir_storage_fdatasyncs_total 2");
        has("weir_storage_fsync_seconds_bucket{le=\"0.0001\"} 1");
        has("weir_storage_fsync_seconds_count 2");
        has("weir_storage_group_commit_appends_count 1");
        has("weir_storage_group_commit_appends_sum 3");
        has("weir_produce_batch_size_bytes_bucket{le=\"1024\"} 1");
        has("weir_produce_batch_size_bytes_sum 6000");
        has("weir_connections_refused_total{reason=\"max_connections_per_ip\"} 1");
        has("weir_connections_refused_total{reason=\"max_connections\"} 0");
        has("weir_request_queue_seconds_count{api=\"Produce\"} 1");
        has("weir_request_send_seconds_count{api=\"Fetch\"} 1");
        has("weir_isr_shrinks_total 1");
        has("weir_under_replicated_partitions{shard=\"1\"} 1");
        has("weir_group_members{group=\"g\"} 2");
        has("weir_group_state{group=\"g\",state=\"Stable\"} 1");
        has("weir_group_lag_records{group=\"g\",topic=\"t\",partition=\"0\"} 6");
        assert!(!text.contains("topic=\"u\""), "no HW known, no lag series");
        // Every family has its HELP and TYPE once.
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = l.split(' ').nth(2).unwrap_or_default();
            let help = format!("# HELP {name} ");
            assert_eq!(text.matches(&help).count(), 1, "{name}");
        }
    }

    #[test]
    fn isr_changes_count_shrinks_and_expands_on_the_bound_shard() {
        let node = Arc::new(NodeMetrics::new(1));
        bind_thread(node.clone(), 0);
        let (a, b, c) = (wire::NodeId(1), wire::NodeId(2), wire::NodeId(3));
        isr_changed(&[a, b, c], &[a, b]);
        isr_changed(&[a, b], &[a, b, c]);
        isr_changed(&[a, b], &[a, c]);
        isr_changed(&[a, b], &[a, b]);
        let s = node.shard(0);
        assert_eq!(s.isr_shrinks.load(Ordering::Relaxed), 2);
        assert_eq!(s.isr_expands.load(Ordering::Relaxed), 2);
    }
}
