//! The producer (batches built with `wire::batch::BatchBuilder`): per-partition batching, a window of in-flight requests per broker,
//! retries, idempotence (producer id + per-partition sequences), compression.
//!
//! Threads: one producer thread generates records on the [`Pacer`]'s schedule, batches
//! them and writes requests; one reader thread per broker connection decodes responses
//! and records acks. They share a [`LinkState`] per connection (in-flight requests and
//! batches returned for retry). Ownership of a batch moves producer → in flight → reader →
//! (acked | returned to producer | failed); it is never in two places.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use wire::batch::Compression;
use wire::{ProducerEpoch, ProducerId, Sequence, api};

use super::conn::{self, Conn};
use super::metadata::{self, Cluster};
use super::produce_wire::{self, BatchFields, BatchSource, Rec, RequestBuf, RequestFields, Values};
use super::security::Stream;
use super::{DUPLICATE_SEQUENCE_NUMBER, error_name, is_retriable, partition_for_key, payload};
use crate::schedule::{Next, Pacer};
use crate::stats::{Clock, Recorder};

/// Records generated per loop turn before the producer looks at its sockets again.
const GENERATE_BURST: usize = 256;
/// Records a new batch reserves room for at most: a batch of more regrows as it fills, and
/// with keys and many partitions (many open batches, most sent part-full on linger) the
/// reservations stay small (1,000 partitions × 1,024 × 56 B ≈ 57 MiB at most).
const BATCH_RECORDS_RESERVED_MAX: usize = 1_024;
/// Requests written per loop turn at most, before generating again.
const SEND_ROUNDS_MAX: usize = 64;
/// Longest the producer sleeps without re-checking anything.
const WAIT_MAX_NS: u64 = 50_000_000;
/// The shortest sleep: a wait for less sleeps this long instead, and the records that
/// fell due meanwhile are generated together. The producer never spins: at 100,000
/// records/s a record is due every 10 µs, and yielding until then kept a whole core busy
/// in `sched_yield` (measured: ~1 CPU-s per second), taken from the brokers on a shared
/// machine. A later wake-up is charged honestly (latency counts from each record's intended
/// send time): measured at 100,000 records/s on an RF 1 topic, p50 publish latency rose
/// by ~0.1 ms (timer slack and wake-up included) while p99 fell (docs/PERFORMANCE.md,
/// "The load generator's pacing").
const SLEEP_MIN_NS: u64 = 50_000;
/// Longest the producer waits for in-flight requests after the schedule ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
const NS_PER_MS: u64 = 1_000_000;
/// A repeated warning is printed at most once per this interval (with a count of the
/// ones held back), so a broker that keeps failing cannot flood stderr.
const WARN_EVERY_NS: u64 = 5_000_000_000;
/// New producer ids (after a batch was given up on) per producer at most: past it, a
/// partition with a sequence gap keeps failing, as it did before resets existed.
const PRODUCER_ID_RESETS_MAX: u32 = 100;
/// Doublings of the retry backoff at most (2^20 × the base is far beyond any max).
const BACKOFF_DOUBLINGS_MAX: u32 = 20;

/// How the producer behaves; the fields mirror Kafka's producer configs.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    pub topic: String,
    /// 0, 1 or -1 (all).
    pub acks: i16,
    pub batch_size_bytes: usize,
    pub linger_ms: u64,
    pub max_in_flight: usize,
    pub retries: u32,
    pub retry_backoff_ms: u64,
    /// Kafka's retry.backoff.max.ms: the exponential backoff's ceiling.
    pub retry_backoff_max_ms: u64,
    /// TCP connections per broker; partition p uses connection p mod this.
    pub connections: usize,
    pub delivery_timeout_ms: u64,
    /// Kafka's request.timeout.ms: sent as the Produce request's timeout, and how long a
    /// request may wait for its response before its connection is dropped and its batches
    /// are retried (within the delivery timeout).
    pub request_timeout_ms: i32,
    pub idempotent: bool,
    pub compression: Compression,
    pub record_size_bytes: usize,
    /// Keyed partitioning over this many distinct keys; `None` = round-robin per batch.
    pub keys: Option<u64>,
    /// Upper bound on bytes buffered in not-yet-acked batches (Kafka's buffer.memory).
    pub buffer_memory_bytes: usize,
    /// Kafka's transactional.id, as a prefix: producer i uses `PREFIX-i` and writes in
    /// transactions (client/txn.rs). `None`: no transactions.
    pub transactional_id: Option<String>,
    /// Records per transaction.
    pub txn_records: usize,
    /// Kafka's transaction.timeout.ms, sent in InitProducerId.
    pub transaction_timeout_ms: i32,
}

/// Told about the fate of every record (for `verify`).
pub trait AckSink: Send + Sync {
    /// Records `ids` were acknowledged at offsets `base_offset..` (`None` for acks=0).
    fn acked(&self, partition: i32, base_offset: Option<i64>, ids: &[u64]);
    /// Records `ids` were given up on.
    fn failed(&self, partition: i32, ids: &[u64]);
    /// Records `ids` belong to a transaction that was aborted (never committed): given up
    /// on, and a read_committed consumer must never see them.
    fn aborted(&self, partition: i32, ids: &[u64]) {
        self.failed(partition, ids);
    }
}

/// A sink that ignores everything.
pub struct NoSink;

impl AckSink for NoSink {
    fn acked(&self, _: i32, _: Option<i64>, _: &[u64]) {}
    fn failed(&self, _: i32, _: &[u64]) {}
}

/// What a producer did, for its caller.
#[derive(Clone, Debug, Default)]
pub struct ProducerStats {
    pub generated: u64,
    pub acked: u64,
    pub failed: u64,
    pub reconnects: u64,
    /// When the schedule ended (run clock, ns): its last record generated, or its time up.
    /// What the producer did after it (waiting for acks, giving batches up) is not
    /// schedule: the measured window ends at this or the last ack, whichever is later.
    pub schedule_end_ns: u64,
}

/// What a batch looks like on the wire, fixed on its first send (timestamp, sequence,
/// compressed bytes), so every retry sends exactly the same bytes.
struct Sealed {
    timestamp_ms: i64,
    compressed: Option<Vec<u8>>,
}

/// A batch for one partition. Records are kept as stamps (and keys); their values are
/// generated straight into the request buffer when the batch is written.
struct Batch {
    partition: i32,
    records: Vec<Rec>,
    bytes: usize,
    created_ns: u64,
    sealed: Option<Sealed>,
    base_sequence: Sequence,
    /// The producer id generation (`Producer::resets`) `base_sequence` belongs to.
    generation: u32,
    attempts: u32,
    retry_at_ns: u64,
}

impl Batch {
    fn ids(&self) -> Vec<u64> {
        self.records.iter().map(|r| r.stamp.record_id).collect()
    }

    fn intended(&self) -> impl Iterator<Item = u64> + '_ {
        self.records.iter().map(|r| r.stamp.intended_ns)
    }
}

/// Prints a warning at most once per [`WARN_EVERY_NS`], counting the ones held back.
#[derive(Default)]
struct Limited {
    last_ns: Option<u64>,
    held_back: u64,
}

impl Limited {
    fn warn(&mut self, now: u64, msg: &str) {
        if self
            .last_ns
            .is_some_and(|t| now.saturating_sub(t) < WARN_EVERY_NS)
        {
            self.held_back += 1;
            return;
        }
        match std::mem::take(&mut self.held_back) {
            0 => warn(msg),
            n => warn(&format!(
                "{msg} ({n} more like this in the last {}s)",
                WARN_EVERY_NS / 1_000_000_000
            )),
        }
        self.last_ns = Some(now);
    }
}

/// Exponential backoff from `base` doubling per attempt, capped at `max` (ns).
fn backoff_ns(base_ms: u64, max_ms: u64, attempt: u32) -> u64 {
    let doublings = attempt.saturating_sub(1).min(BACKOFF_DOUBLINGS_MAX);
    base_ms
        .saturating_mul(1 << doublings)
        .min(max_ms.max(base_ms))
        * NS_PER_MS
}

/// Where the producer stands with metadata refreshes.
#[derive(Default)]
struct Refresh {
    /// A response asked for one; not yet done successfully.
    wanted: bool,
    /// Failed refreshes in a row (drives the backoff).
    failures: u32,
    /// Not before this (ns).
    next_at_ns: u64,
    warn: Limited,
}

struct InFlight {
    correlation_id: i32,
    batches: Vec<Batch>,
    /// When the request was written (ns): its response is due by `request.timeout.ms`.
    sent_ns: u64,
}

#[derive(Default)]
struct LinkState {
    in_flight: VecDeque<InFlight>,
    returned: Vec<Batch>,
    broken: bool,
    acked: u64,
    failed: u64,
    /// Bytes of batches that left the producer for good (acked or failed).
    released_bytes: usize,
    /// A response said the partition moved: refresh metadata before retrying.
    refresh_metadata: bool,
    /// An idempotent batch (with a sequence) was given up on: the partition's sequences
    /// have a gap the broker will never fill.
    gave_up_sequenced: bool,
}

/// What the readers of the links handed over since the producer last looked.
#[derive(Default)]
struct Handover {
    acked: u64,
    failed: u64,
    released_bytes: usize,
    refresh_metadata: bool,
    gave_up_sequenced: bool,
    returned: Vec<Batch>,
}

impl Handover {
    /// Moves what `st` holds for the producer into this.
    fn take_from(&mut self, st: &mut LinkState) {
        self.acked += std::mem::take(&mut st.acked);
        self.failed += std::mem::take(&mut st.failed);
        self.released_bytes += std::mem::take(&mut st.released_bytes);
        self.refresh_metadata |= std::mem::take(&mut st.refresh_metadata);
        self.gave_up_sequenced |= std::mem::take(&mut st.gave_up_sequenced);
        self.returned.append(&mut st.returned);
    }
}

/// Wakes the producer thread when a response arrives.
#[derive(Default)]
struct Wake {
    seq: Mutex<u64>,
    cv: Condvar,
}

impl Wake {
    fn notify(&self) {
        let mut g = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        self.cv.notify_all();
    }

    fn current(&self) -> u64 {
        *self.seq.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait(&self, seen: u64, timeout: Duration) {
        let g = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .cv
            .wait_timeout_while(g, timeout, |s| *s == seen)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Everything a reader thread needs besides its socket.
#[derive(Clone)]
struct ReaderCtx {
    cfg: Arc<ProducerConfig>,
    clock: Clock,
    recorder: Arc<Recorder>,
    sink: Arc<dyn AckSink>,
    wake: Arc<Wake>,
    version: i16,
}

struct Link {
    addr: String,
    writer: Option<Stream>,
    state: Arc<Mutex<LinkState>>,
    reader: Option<JoinHandle<()>>,
    version: i16,
    next_correlation_id: i32,
    reconnect_at_ns: u64,
}

fn lock(s: &Mutex<LinkState>) -> std::sync::MutexGuard<'_, LinkState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection: its broker and which of the broker's `connections` it is.
type LinkKey = (i32, usize);

/// One producer: call [`Producer::run`] on its own thread.
pub struct Producer {
    cfg: Arc<ProducerConfig>,
    cluster: Cluster,
    clock: Clock,
    recorder: Arc<Recorder>,
    sink: Arc<dyn AckSink>,
    wake: Arc<Wake>,
    run_id: u64,
    producer_index: u64,
    producer_id: ProducerId,
    producer_epoch: ProducerEpoch,
    /// Batches not yet sent (or returned for retry), per partition, oldest first.
    queues: Vec<VecDeque<Batch>>,
    next_sequence: Vec<Sequence>,
    links: BTreeMap<LinkKey, Link>,
    buffered_bytes: usize,
    sticky_partition: usize,
    filler: Vec<u8>,
    stats: ProducerStats,
    /// The request buffer, reused (and written over in place) for every request.
    request: RequestBuf,
    /// Scratch for a records section before it is compressed.
    scratch: Vec<u8>,
    refresh: Refresh,
    send_warn: Limited,
    /// Idempotent producer: a batch with a sequence was given up on. No batch is sent
    /// until the in-flight ones are answered, then a new producer id is asked for and
    /// every partition's sequences start again at 0 (what Kafka's idempotent producer
    /// does), so the batches after the gap are not refused OUT_OF_ORDER_SEQUENCE_NUMBER
    /// for the rest of the run.
    reset_pending: bool,
    /// New producer ids asked for so far (bounded by [`PRODUCER_ID_RESETS_MAX`]).
    resets: u32,
    /// Not before this (ns): the last InitProducerId failed.
    reset_at_ns: u64,
}

impl Producer {
    /// Sets up a producer for `cluster`'s topic (connects lazily; asks for a producer id now
    /// if idempotent).
    pub fn new(
        cfg: ProducerConfig,
        cluster: Cluster,
        clock: Clock,
        recorder: Arc<Recorder>,
        sink: Arc<dyn AckSink>,
        run_id: u64,
        producer_index: u64,
    ) -> Result<Self> {
        let n = cluster.partitions();
        anyhow::ensure!(n > 0, "topic has no partitions");
        let (producer_id, producer_epoch) = if cfg.idempotent {
            let addr = cluster.leader_addr(0)?.to_string();
            let mut c = Conn::connect(&addr)?;
            metadata::init_producer_id(&mut c)?
        } else {
            (ProducerId::NONE, ProducerEpoch(-1))
        };
        Ok(Self {
            cfg: Arc::new(cfg),
            sticky_partition: (producer_index as usize) % n,
            queues: (0..n).map(|_| VecDeque::new()).collect(),
            next_sequence: vec![Sequence(0); n],
            cluster,
            clock,
            recorder,
            sink,
            wake: Arc::new(Wake::default()),
            run_id,
            producer_index,
            producer_id,
            producer_epoch,
            links: BTreeMap::new(),
            buffered_bytes: 0,
            filler: (0..65_536u32).map(|i| b'a' + (i % 26) as u8).collect(),
            stats: ProducerStats::default(),
            request: RequestBuf::default(),
            scratch: Vec::new(),
            refresh: Refresh::default(),
            send_warn: Limited::default(),
            reset_pending: false,
            resets: 0,
            reset_at_ns: 0,
        })
    }

    /// Connects every connection the topic's partitions will use, before the schedule
    /// starts, so connection setup (TCP, TLS, SASL, ApiVersions) is not charged to the
    /// first records' latency. A connection that fails is left to the send path, which
    /// tries again after the retry backoff.
    pub fn connect(&mut self) {
        let now = self.clock.now_ns();
        let conns = self.cfg.connections.max(1);
        let keys: BTreeSet<LinkKey> = (0..self.queues.len())
            .filter_map(|p| Some((*self.cluster.leaders.get(p)?, p % conns)))
            .collect();
        for key in keys {
            if let Err(e) = self.ensure_link(key, now) {
                warn(&format!("connecting to broker {}: {e:#}", key.0));
            }
        }
    }

    /// Runs the schedule to its end (or until `stop`), then waits for outstanding acks.
    pub fn run(mut self, mut pacer: Pacer, stop: &AtomicBool) -> Result<ProducerStats> {
        let mut generating = true;
        let mut drain_deadline_ns = u64::MAX;
        loop {
            let now = self.clock.now_ns();
            let seen = self.wake.current();
            self.service_links(now);
            self.reset_producer_id_if_due(now);
            let mut wait_until = now + WAIT_MAX_NS;
            if generating {
                match self.generate(&mut pacer, now, stop) {
                    Some(t) => wait_until = wait_until.min(t),
                    None => {
                        generating = false;
                        self.stats.schedule_end_ns = now;
                        drain_deadline_ns = now + DRAIN_TIMEOUT.as_nanos() as u64;
                    }
                }
            }
            let now = self.clock.now_ns();
            let (sent, ready_at) = self.send_ready(now, !generating);
            if let Some(t) = ready_at {
                wait_until = wait_until.min(t);
            }
            if sent {
                // Sending freed buffer space or window slots: look again before sleeping.
                wait_until = now;
            }
            if !generating && self.idle() {
                break;
            }
            if now >= drain_deadline_ns {
                self.abandon_outstanding();
                break;
            }
            self.wait(seen, wait_until);
        }
        self.shutdown();
        Ok(std::mem::take(&mut self.stats))
    }

    fn wait(&self, seen: u64, until_ns: u64) {
        let now = self.clock.now_ns();
        if until_ns <= now {
            return;
        }
        let d = (until_ns - now).max(SLEEP_MIN_NS);
        self.wake.wait(seen, Duration::from_nanos(d));
    }

    /// Generates the records due now. Returns when the next one is due, or `None` when the
    /// schedule is over.
    fn generate(&mut self, pacer: &mut Pacer, now: u64, stop: &AtomicBool) -> Option<u64> {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        for _ in 0..GENERATE_BURST {
            if self.buffered_bytes >= self.cfg.buffer_memory_bytes {
                // Back-pressure: the schedule keeps running; the delay shows in latency.
                // But it still ends on time: records it would have sent after its end are
                // not owed, and a broker that never frees the buffer must not keep the
                // run going past its duration.
                if pacer.time_is_up(now) {
                    self.schedule_cut_short(pacer.owed());
                    return None;
                }
                return Some(now + WAIT_MAX_NS);
            }
            match pacer.next(now) {
                Next::Done => return None,
                Next::WaitUntil(t) => return Some(t),
                Next::Due { intended_ns } => self.append(pacer.issued() - 1, intended_ns, now),
            }
        }
        Some(now)
    }

    /// The schedule ended with `owed` of its records never sent (the buffer was full):
    /// said, and counted once as `ClientBufferFull`, so the shortfall is not silent.
    fn schedule_cut_short(&self, owed: u64) {
        if owed == 0 {
            return;
        }
        self.recorder.record_error("ClientBufferFull", 1);
        warn(&format!(
            "producer {}: the schedule ended with {owed} records never sent \
             (buffer.memory full: the broker did not keep up)",
            self.producer_index
        ));
    }

    fn append(&mut self, seq_no: u64, intended_ns: u64, now: u64) {
        let id = (self.producer_index << payload::PRODUCER_SHIFT) | seq_no;
        let stamp = payload::Stamp {
            run_id: self.run_id,
            record_id: id,
            intended_ns,
        };
        let value_len = self.cfg.record_size_bytes.max(payload::HEADER_BYTES);
        let n = self.queues.len();
        let size_of = |key: &Option<Bytes>| value_len + key.as_ref().map_or(0, Bytes::len);
        let (key, p) = match self.cfg.keys {
            Some(k) => {
                let key = Bytes::from((seq_no % k.max(1)).to_string());
                let p = partition_for_key(&key, n);
                (Some(key), p)
            }
            None => {
                // Round-robin per batch (Kafka's sticky partitioner): stay on a partition
                // while its batch is open, move on when it fills or is sent.
                if !self.has_open_batch(self.sticky_partition, size_of(&None)) {
                    self.sticky_partition = (self.sticky_partition + 1) % n;
                }
                (None, self.sticky_partition)
            }
        };
        let size = size_of(&key);
        let rec = Rec { stamp, key };
        self.stats.generated += 1;
        self.buffered_bytes += size;
        let open = self.has_open_batch(p, size);
        let q = &mut self.queues[p];
        match q.back_mut().filter(|_| open) {
            Some(b) => {
                b.bytes += size;
                b.records.push(rec);
            }
            None => {
                // Room for a full batch up front: no regrowing (and copying) as it fills.
                let fits =
                    (self.cfg.batch_size_bytes / size.max(1)).clamp(1, BATCH_RECORDS_RESERVED_MAX);
                let mut records = Vec::with_capacity(fits);
                records.push(rec);
                q.push_back(Batch {
                    partition: p as i32,
                    records,
                    bytes: size,
                    created_ns: now,
                    sealed: None,
                    base_sequence: Sequence::NONE,
                    generation: 0,
                    attempts: 0,
                    retry_at_ns: 0,
                });
            }
        }
    }

    /// Whether partition `p` has an unsent batch with room for `size` more bytes.
    fn has_open_batch(&self, p: usize, size: usize) -> bool {
        self.queues[p]
            .back()
            .is_some_and(|b| b.sealed.is_none() && b.bytes + size <= self.cfg.batch_size_bytes)
    }

    /// Whether the front batch of `q` may go now; else when it may (ns), if ever.
    fn sendable(&self, b: &Batch, is_last: bool, now: u64, flush: bool) -> Result<(), u64> {
        if b.retry_at_ns > now {
            return Err(b.retry_at_ns);
        }
        let full = b.bytes >= self.cfg.batch_size_bytes
            || b.bytes + self.cfg.record_size_bytes > self.cfg.batch_size_bytes;
        let linger_end = b.created_ns + self.cfg.linger_ms * NS_PER_MS;
        if b.sealed.is_some() || !is_last || full || flush || linger_end <= now {
            Ok(())
        } else {
            Err(linger_end)
        }
    }

    /// Sends requests while brokers' windows have room and batches are ready (bounded
    /// rounds). Returns whether anything was sent and the earliest time something becomes
    /// ready.
    fn send_ready(&mut self, now: u64, flush: bool) -> (bool, Option<u64>) {
        if self.reset_pending {
            // Waiting for in-flight answers (a response wakes the producer) or for the
            // InitProducerId backoff.
            return (false, Some(self.reset_at_ns.max(now + SLEEP_MIN_NS)));
        }
        let mut sent_any = false;
        let mut next = None;
        for _ in 0..SEND_ROUNDS_MAX {
            let (sent, ready_at) = self.send_round(now, flush);
            next = ready_at;
            sent_any |= sent;
            if !sent {
                break;
            }
        }
        (sent_any, next)
    }

    /// One request per broker whose window has room, holding the front batch of each of its
    /// partitions that is ready.
    fn send_round(&mut self, now: u64, flush: bool) -> (bool, Option<u64>) {
        let mut next: Option<u64> = None;
        let mut per_link: BTreeMap<LinkKey, Vec<usize>> = BTreeMap::new();
        let conns = self.cfg.connections.max(1);
        for p in 0..self.queues.len() {
            let q = &self.queues[p];
            let Some(b) = q.front() else { continue };
            match self.sendable(b, q.len() == 1, now, flush) {
                Ok(()) => {
                    // A partition always uses the same connection: its batches stay in order.
                    let key = (self.cluster.leaders[p], p % conns);
                    per_link.entry(key).or_default().push(p);
                }
                Err(t) => next = Some(next.map_or(t, |n| n.min(t))),
            }
        }
        let mut sent = false;
        for (key, partitions) in per_link {
            match self.send_to(key, &partitions, now) {
                Ok(s) => sent |= s,
                Err(e) => {
                    // Counted once, where it happened: a failed connect in ensure_link,
                    // a lost connection when service_links tears it down.
                    if let Some(l) = self.links.get_mut(&key) {
                        lock(&l.state).broken = true;
                    }
                    let msg = format!("send to broker {}: {e:#}", key.0);
                    self.send_warn.warn(now, &msg);
                }
            }
        }
        (sent, next)
    }

    /// Sends the ready batches of `partitions` over link `key`; `Ok(false)` if nothing went.
    fn send_to(&mut self, key: LinkKey, partitions: &[usize], now: u64) -> Result<bool> {
        self.ensure_link(key, now)?;
        let Some(link) = self.links.get(&key) else {
            return Ok(false);
        };
        {
            let st = lock(&link.state);
            if st.broken || link.writer.is_none() || st.in_flight.len() >= self.cfg.max_in_flight {
                return Ok(false);
            }
        }
        let mut batches = Vec::with_capacity(partitions.len());
        for &p in partitions {
            let Some(mut b) = self.queues[p].pop_front() else {
                continue;
            };
            if self.expired(&b, now) {
                continue;
            }
            self.seal(&mut b)?;
            b.attempts += 1;
            batches.push(b);
        }
        if batches.is_empty() {
            return Ok(false);
        }
        self.write_request(key, batches)?;
        Ok(true)
    }

    /// Gives up on a batch past its delivery timeout.
    fn expired(&mut self, b: &Batch, now: u64) -> bool {
        let age_ms = now.saturating_sub(b.created_ns) / NS_PER_MS;
        if age_ms < self.cfg.delivery_timeout_ms {
            return false;
        }
        self.gave_up_on(b);
        self.buffered_bytes = self.buffered_bytes.saturating_sub(b.bytes);
        // One per batch given up on (its records are in `failed`).
        self.recorder.record_error("ClientDeliveryTimeout", 1);
        self.sink.failed(b.partition, &b.ids());
        self.stats.failed += b.records.len() as u64;
        true
    }

    /// Notes a batch given up on: if it had a sequence, the producer id must be renewed.
    fn gave_up_on(&mut self, b: &Batch) {
        if self.cfg.idempotent && b.sealed.is_some() {
            self.reset_pending = true;
        }
    }

    /// Once nothing is in flight, asks for a new producer id and restarts every
    /// partition's sequences at 0; batches numbered under the old id (returned for
    /// retry) are numbered again when next sent, so they go out with the new id in
    /// sequence (never as a "duplicate" of a number the new id already used).
    fn reset_producer_id_if_due(&mut self, now: u64) {
        if !self.reset_pending || now < self.reset_at_ns {
            return;
        }
        let in_flight = self
            .links
            .values()
            .any(|l| !lock(&l.state).in_flight.is_empty());
        if in_flight {
            return;
        }
        if self.resets >= PRODUCER_ID_RESETS_MAX {
            self.reset_pending = false;
            warn(&format!(
                "{PRODUCER_ID_RESETS_MAX} new producer ids already; not asking for another"
            ));
            return;
        }
        self.resets += 1;
        let fresh = self
            .cluster
            .leader_addr(0)
            .map(str::to_string)
            .and_then(|addr| Conn::connect(&addr))
            .and_then(|mut c| metadata::init_producer_id(&mut c));
        match fresh {
            Ok((id, epoch)) => {
                self.producer_id = id;
                self.producer_epoch = epoch;
                // Batches numbered under the old id are numbered again when sent (seal).
                self.next_sequence.fill(Sequence(0));
                self.reset_pending = false;
                warn(&format!(
                    "gave up on a batch: new producer id {} epoch {}, sequences from 0",
                    id.get(),
                    epoch.get()
                ));
            }
            Err(e) => {
                self.recorder.record_error("ClientInitProducerIdFailed", 1);
                let (base, max) = (self.cfg.retry_backoff_ms, self.cfg.retry_backoff_max_ms);
                self.reset_at_ns = now + backoff_ns(base, max, self.resets);
                warn(&format!("InitProducerId after a given-up batch: {e:#}"));
            }
        }
    }

    /// Fixes what a batch looks like on the wire (first send only): its sequence, its
    /// timestamp and, if compressed, its compressed records.
    fn seal(&mut self, b: &mut Batch) -> Result<()> {
        let p = b.partition as usize;
        // A batch numbered under an older producer id (returned for retry around a reset)
        // is numbered again, after everything the new id has sent on its partition.
        if self.cfg.idempotent && (b.sealed.is_none() || b.generation != self.resets) {
            b.base_sequence = self.next_sequence[p];
            b.generation = self.resets;
            self.next_sequence[p] = b.base_sequence.add_wrapping(b.records.len() as i32);
        }
        if b.sealed.is_some() {
            return Ok(());
        }
        let timestamp_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let compressed = match self.cfg.compression {
            Compression::None => None,
            codec => {
                let values = Values {
                    size: self.cfg.record_size_bytes,
                    filler: &self.filler,
                };
                let c =
                    produce_wire::compress_records(codec, &b.records, values, &mut self.scratch)
                        .map_err(|e| anyhow::anyhow!("compressing record batch: {e}"))?;
                Some(c)
            }
        };
        b.sealed = Some(Sealed {
            timestamp_ms,
            compressed,
        });
        Ok(())
    }

    /// Writes one Produce request for `batches` (all sealed) into the reused request buffer.
    fn encode_request(&mut self, version: i16, correlation_id: i32, batches: &[Batch]) {
        let sources: Vec<(i32, BatchSource<'_>)> = batches
            .iter()
            .map(|b| {
                let sealed = b.sealed.as_ref();
                let src = BatchSource {
                    fields: BatchFields {
                        producer_id: self.producer_id,
                        producer_epoch: self.producer_epoch,
                        base_sequence: b.base_sequence,
                        timestamp_ms: sealed.map_or(0, |s| s.timestamp_ms),
                        compression: self.cfg.compression,
                        transactional: false,
                    },
                    recs: &b.records,
                    compressed: sealed.and_then(|s| s.compressed.as_deref()),
                };
                (b.partition, src)
            })
            .collect();
        let req = RequestFields {
            version,
            correlation_id,
            acks: self.cfg.acks,
            timeout_ms: self.cfg.request_timeout_ms,
            topic: &self.cfg.topic,
            transactional_id: None,
        };
        let values = Values {
            size: self.cfg.record_size_bytes,
            filler: &self.filler,
        };
        self.request.write(req, &sources, values);
    }

    fn write_request(&mut self, key: LinkKey, batches: Vec<Batch>) -> Result<()> {
        let Some(link) = self.links.get_mut(&key) else {
            return Ok(());
        };
        let id = link.next_correlation_id;
        link.next_correlation_id = link.next_correlation_id.wrapping_add(1).max(1);
        let version = link.version;
        self.encode_request(version, id, &batches);
        let Some(link) = self.links.get_mut(&key) else {
            return Ok(());
        };
        let bytes = self.request.frame();
        let acks0 = self.cfg.acks == 0;
        if !acks0 {
            // In flight before the write, so the reader always finds it.
            lock(&link.state).in_flight.push_back(InFlight {
                correlation_id: id,
                batches,
                sent_ns: self.clock.now_ns(),
            });
            let Some(w) = link.writer.as_mut() else {
                anyhow::bail!("no connection");
            };
            return w.write_all(bytes).context("writing produce request");
        }
        let written = match link.writer.as_mut() {
            Some(w) => w.write_all(bytes).context("writing produce request"),
            None => Err(anyhow::anyhow!("no connection")),
        };
        if let Err(e) = written {
            // acks=0 never retries: these records are given up on, and say so.
            for b in &batches {
                self.sink.failed(b.partition, &b.ids());
                self.stats.failed += b.records.len() as u64;
                self.buffered_bytes = self.buffered_bytes.saturating_sub(b.bytes);
            }
            return Err(e);
        }
        // acks=0: "acknowledged" when the bytes are handed to the kernel.
        let now = self.clock.now_ns();
        for b in &batches {
            let rb = self.cfg.record_size_bytes as u64;
            self.recorder.record_acks(b.intended(), now, rb);
            self.sink.acked(b.partition, None, &b.ids());
            self.buffered_bytes = self.buffered_bytes.saturating_sub(b.bytes);
            self.stats.acked += b.records.len() as u64;
        }
        Ok(())
    }

    /// Connects link `key` if it is not live (at most once per retry backoff).
    fn ensure_link(&mut self, key: LinkKey, now: u64) -> Result<()> {
        let broker = key.0;
        if self.links.get(&key).is_some_and(|l| l.writer.is_some()) {
            return Ok(());
        }
        if self
            .links
            .get(&key)
            .is_some_and(|l| l.reconnect_at_ns > now)
        {
            return Ok(());
        }
        let addr = match self.cluster.brokers.get(&broker) {
            Some(a) => a.clone(),
            None => anyhow::bail!("unknown broker {broker}"),
        };
        let backoff = self.cfg.retry_backoff_ms * NS_PER_MS;
        match self.open_link(&addr) {
            Ok(link) => {
                if self.links.insert(key, link).is_some() {
                    self.stats.reconnects += 1;
                }
                Ok(())
            }
            Err(e) => {
                let placeholder = self.links.entry(key).or_insert_with(|| Link {
                    addr,
                    writer: None,
                    state: Arc::default(),
                    reader: None,
                    version: 0,
                    next_correlation_id: 1,
                    reconnect_at_ns: 0,
                });
                placeholder.reconnect_at_ns = now + backoff;
                self.recorder.record_error("ClientConnectFailed", 1);
                Err(e)
            }
        }
    }

    fn open_link(&self, addr: &str) -> Result<Link> {
        let c = Conn::connect(addr)?;
        let version = c.versions.pick(api::PRODUCE, 3, 9)?;
        let reader_stream = c.stream.try_clone()?;
        // The reader blocks until a response comes: an idle connection is not an error.
        // A request whose response is overdue (request.timeout.ms) is found by the
        // producer thread (service_links), which shuts the socket to wake this reader.
        reader_stream.set_read_timeout(None)?;
        let state: Arc<Mutex<LinkState>> = Arc::default();
        let ctx = ReaderCtx {
            cfg: self.cfg.clone(),
            clock: self.clock,
            recorder: self.recorder.clone(),
            sink: self.sink.clone(),
            wake: self.wake.clone(),
            version,
        };
        let st = state.clone();
        let reader = std::thread::Builder::new()
            .name("produce-reader".into())
            .spawn(move || read_loop(reader_stream, st, ctx))?;
        Ok(Link {
            addr: addr.to_string(),
            writer: Some(c.stream),
            state,
            reader: Some(reader),
            version,
            next_correlation_id: 1,
            reconnect_at_ns: 0,
        })
    }

    /// Collects batches the readers returned for retry and tears down broken links and
    /// links whose oldest request is past `request.timeout.ms`, returning their in-flight
    /// batches for retry too.
    fn service_links(&mut self, now: u64) {
        let mut got = Handover::default();
        // A request timeout that is not positive is none (the CLI refuses one).
        let timeout_ns = u64::try_from(self.cfg.request_timeout_ms)
            .ok()
            .filter(|&ms| ms > 0)
            .map_or(u64::MAX, |ms| ms * NS_PER_MS);
        for link in self.links.values_mut() {
            let mut st = lock(&link.state);
            got.take_from(&mut st);
            if link.writer.is_none() {
                continue;
            }
            let overdue = !st.broken
                && st
                    .in_flight
                    .front()
                    .is_some_and(|f| now.saturating_sub(f.sent_ns) >= timeout_ns);
            if !st.broken && !overdue {
                continue;
            }
            for f in st.in_flight.drain(..) {
                got.returned.extend(f.batches);
            }
            drop(st);
            // One count per connection torn down, named for why it was.
            let (name, why) = if overdue {
                (
                    "ClientRequestTimeout",
                    "no response within request.timeout.ms",
                )
            } else {
                ("ClientConnectionLost", "lost")
            };
            self.recorder.record_error(name, 1);
            close_link(link, &mut got);
            link.reconnect_at_ns = now;
            warn(&format!("connection to {}: {why}; will retry", link.addr));
        }
        self.stats.acked += got.acked;
        self.stats.failed += got.failed;
        self.buffered_bytes = self.buffered_bytes.saturating_sub(got.released_bytes);
        self.reset_pending |= got.gave_up_sequenced;
        let (refresh, returned) = (got.refresh_metadata, got.returned);
        self.refresh.wanted |= refresh;
        if self.refresh.wanted && now >= self.refresh.next_at_ns {
            self.refresh_metadata(now);
        }
        self.expire_fronts(now);
        for mut b in returned {
            if b.attempts > self.cfg.retries {
                self.gave_up_on(&b);
                // One per batch given up on (its records are in `failed`).
                self.recorder.record_error("ClientRetriesExhausted", 1);
                self.sink.failed(b.partition, &b.ids());
                self.stats.failed += b.records.len() as u64;
                self.buffered_bytes = self.buffered_bytes.saturating_sub(b.bytes);
                continue;
            }
            // Exponential per attempt, as Kafka's producer since retry.backoff.max.ms.
            let (base, max) = (self.cfg.retry_backoff_ms, self.cfg.retry_backoff_max_ms);
            b.retry_at_ns = now + backoff_ns(base, max, b.attempts);
            self.requeue(b);
        }
    }

    /// Asks any known broker for the topic's leaders again (after a leadership error).
    /// A failure backs off exponentially (retry.backoff.ms doubling up to
    /// retry.backoff.max.ms) and its warning is rate-limited: a broker that cannot serve
    /// the topic must not be asked (or complained about) hundreds of times a second.
    fn refresh_metadata(&mut self, now: u64) {
        let addrs: Vec<String> = self.cluster.brokers.values().cloned().collect();
        for addr in addrs {
            let fresh = Conn::connect(&addr)
                .and_then(|mut c| metadata::fetch(&mut c, &self.cfg.topic, false));
            if let Ok(Some(c)) = fresh
                && c.partitions() == self.cluster.partitions()
            {
                self.cluster = c;
                self.refresh.wanted = false;
                self.refresh.failures = 0;
                self.refresh.next_at_ns = now;
                return;
            }
        }
        self.refresh.failures = self.refresh.failures.saturating_add(1);
        let (base, max) = (self.cfg.retry_backoff_ms, self.cfg.retry_backoff_max_ms);
        self.refresh.next_at_ns = now + backoff_ns(base, max, self.refresh.failures);
        self.recorder.record_error("ClientMetadataRefreshFailed", 1);
        self.refresh.warn.warn(
            now,
            "metadata refresh failed; retrying with the old leaders",
        );
    }

    /// Gives up on the oldest batches of each partition once past the delivery timeout,
    /// even while their broker is unreachable.
    fn expire_fronts(&mut self, now: u64) {
        for p in 0..self.queues.len() {
            for _ in 0..self.queues[p].len() {
                let stale = self.queues[p].front().is_some_and(|b| {
                    now.saturating_sub(b.created_ns) / NS_PER_MS >= self.cfg.delivery_timeout_ms
                });
                if !stale {
                    break;
                }
                if let Some(b) = self.queues[p].pop_front() {
                    self.expired(&b, now);
                }
            }
        }
    }

    /// Puts a returned batch back in sequence order among the already-encoded batches at
    /// the front of its partition's queue, so retries never overtake each other.
    fn requeue(&mut self, b: Batch) {
        let q = &mut self.queues[b.partition as usize];
        // Batches of an older producer id get new numbers after the current id's.
        let current = self.resets;
        let seq_of = |x: &Batch| (x.generation != current, x.base_sequence.get());
        let pos = q
            .iter()
            .position(|x| x.sealed.is_none() || seq_of(x) > seq_of(&b))
            .unwrap_or(q.len());
        q.insert(pos, b);
    }

    fn idle(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
            && self.links.values().all(|l| {
                let st = lock(&l.state);
                st.in_flight.is_empty() && st.returned.is_empty()
            })
    }

    fn abandon_outstanding(&mut self) {
        let mut lost: Vec<Batch> = self.queues.iter_mut().flat_map(|q| q.drain(..)).collect();
        for l in self.links.values() {
            let mut st = lock(&l.state);
            for f in st.in_flight.drain(..) {
                lost.extend(f.batches);
            }
            lost.append(&mut st.returned);
        }
        for b in lost {
            // One per batch given up on (its records are in `failed`).
            self.recorder.record_error("ClientDeliveryTimeout", 1);
            self.sink.failed(b.partition, &b.ids());
            self.stats.failed += b.records.len() as u64;
        }
    }

    /// Closes every connection and ends its reader; what the readers handed over last
    /// goes into the stats.
    fn shutdown(&mut self) {
        for l in self.links.values_mut() {
            end_reader(l);
            let mut st = lock(&l.state);
            self.stats.acked += std::mem::take(&mut st.acked);
            self.stats.failed += std::mem::take(&mut st.failed);
        }
    }
}

/// A producer dropped without running (its run's setup failed after it connected, e.g. a
/// later producer or the group could not get ready) closes its connections and ends their
/// readers, which block without a read timeout: neither outlives it. After [`Producer::run`]
/// there is nothing left to close.
impl Drop for Producer {
    fn drop(&mut self) {
        for l in self.links.values_mut() {
            end_reader(l);
        }
    }
}

/// Shuts a link's socket (all its handles: the reader's too, so a reader blocked on it
/// wakes with an error and ends) and joins its reader. Bounded: the reader blocks only in
/// its socket read, and holds the link state only briefly.
fn end_reader(link: &mut Link) {
    if let Some(w) = link.writer.take() {
        let _ = w.shutdown(Shutdown::Both);
    }
    if let Some(h) = link.reader.take() {
        let _ = h.join();
    }
}

/// Closes a link's connection and ends its reader; what the reader handed over in the
/// meantime (a response it was handling as the connection went) and whatever is still in
/// flight go into `got`, not lost with the link's state when it is replaced.
fn close_link(link: &mut Link, got: &mut Handover) {
    end_reader(link);
    let mut st = lock(&link.state);
    got.take_from(&mut st);
    for f in st.in_flight.drain(..) {
        got.returned.extend(f.batches);
    }
}

/// Logs to stderr (the load generator's stdout is its report).
pub fn warn(msg: &str) {
    eprintln!("weir-loadgen: {msg}");
}

/// The reader thread of one connection: matches responses to in-flight requests in order.
fn read_loop(mut stream: Stream, state: Arc<Mutex<LinkState>>, ctx: ReaderCtx) {
    loop {
        let frame = match conn::read_frame(&mut stream) {
            Ok(f) => f,
            Err(_) => break,
        };
        let now = ctx.clock.now_ns();
        let Some(inflight) = lock(&state).in_flight.pop_front() else {
            break; // a response nobody asked for: the stream is out of step
        };
        let resp =
            conn::decode_response::<ProduceRequest>(frame, ctx.version, inflight.correlation_id);
        match resp {
            Ok(r) => handle_response(&ctx, &state, inflight.batches, &r, now),
            Err(_) => {
                lock(&state).in_flight.push_front(inflight);
                break;
            }
        }
        ctx.wake.notify();
    }
    lock(&state).broken = true;
    ctx.wake.notify();
}

fn handle_response(
    ctx: &ReaderCtx,
    state: &Mutex<LinkState>,
    batches: Vec<Batch>,
    resp: &ProduceResponse,
    now: u64,
) {
    let mut codes: BTreeMap<i32, (i16, i64)> = BTreeMap::new();
    for t in &resp.responses {
        for p in &t.partition_responses {
            codes.insert(p.index, (p.error_code, p.base_offset));
        }
    }
    let rb = ctx.cfg.record_size_bytes as u64;
    let mut acked = 0u64;
    let mut failed = 0u64;
    let mut released = 0usize;
    let mut refresh = false;
    let mut gave_up_sequenced = false;
    let mut returned = Vec::new();
    for b in batches {
        // A partition missing from the response is treated as a retriable network error.
        let (code, base) = codes.get(&b.partition).copied().unwrap_or((13, -1));
        if code == 0 || (code == DUPLICATE_SEQUENCE_NUMBER && ctx.cfg.idempotent) {
            ctx.recorder.record_acks(b.intended(), now, rb);
            let base = (code == 0).then_some(base);
            ctx.sink.acked(b.partition, base, &b.ids());
            acked += b.records.len() as u64;
            released += b.bytes;
            continue;
        }
        ctx.recorder.record_error(&error_name(code), 1);
        refresh |= metadata::is_leadership_error(code);
        if is_retriable(code, ctx.cfg.idempotent) {
            returned.push(b);
        } else {
            ctx.sink.failed(b.partition, &b.ids());
            failed += b.records.len() as u64;
            released += b.bytes;
            gave_up_sequenced |= ctx.cfg.idempotent;
        }
    }
    let mut st = lock(state);
    st.acked += acked;
    st.failed += failed;
    st.released_bytes += released;
    st.refresh_metadata |= refresh;
    st.gave_up_sequenced |= gave_up_sequenced;
    st.returned.append(&mut returned);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Rate;
    use std::net::{TcpListener, TcpStream};

    const MS: u64 = 1_000_000;

    fn producer(request_timeout_ms: i32) -> Producer {
        let cfg = ProducerConfig {
            topic: "t".into(),
            acks: 1,
            batch_size_bytes: 16_384,
            linger_ms: 0,
            max_in_flight: 5,
            retries: 10,
            retry_backoff_ms: 100,
            retry_backoff_max_ms: 1000,
            connections: 1,
            delivery_timeout_ms: 120_000,
            request_timeout_ms,
            idempotent: false,
            compression: Compression::None,
            record_size_bytes: 100,
            keys: None,
            buffer_memory_bytes: 32 << 20,
            transactional_id: None,
            txn_records: 100,
            transaction_timeout_ms: 60_000,
        };
        let cluster = Cluster {
            brokers: BTreeMap::from([(0, "127.0.0.1:1".to_string())]),
            leaders: vec![0],
        };
        let recorder = Arc::new(Recorder::new(0));
        Producer::new(
            cfg,
            cluster,
            Clock::start(),
            recorder,
            Arc::new(NoSink),
            1,
            0,
        )
        .expect("a non-idempotent producer does not connect")
    }

    /// Link (0, 0) of `p` on a real socket whose other end (returned, kept open by the
    /// caller) never answers, with its reader thread running.
    fn live_link(p: &mut Producer) -> TcpStream {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (server, _) = l.accept().expect("accept");
        let state: Arc<Mutex<LinkState>> = Arc::default();
        let ctx = ReaderCtx {
            cfg: p.cfg.clone(),
            clock: p.clock,
            recorder: p.recorder.clone(),
            sink: p.sink.clone(),
            wake: p.wake.clone(),
            version: 9,
        };
        let reader_stream = Stream::Plain(client.try_clone().expect("clone"));
        let st = state.clone();
        let reader = std::thread::spawn(move || read_loop(reader_stream, st, ctx));
        let link = Link {
            addr: "test".into(),
            writer: Some(Stream::Plain(client)),
            state,
            reader: Some(reader),
            version: 9,
            next_correlation_id: 1,
            reconnect_at_ns: 0,
        };
        p.links.insert((0, 0), link);
        server
    }

    fn errors(p: &Producer) -> BTreeMap<String, u64> {
        p.recorder.summary(1).errors
    }

    /// A write that fails and the teardown that follows are one lost connection, counted
    /// once (it was counted by both), and the batch goes back for a retry.
    #[test]
    fn a_connection_lost_on_write_counts_once() {
        let mut p = producer(30_000);
        let _server = live_link(&mut p);
        if let Some(w) = p.links.get(&(0, 0)).and_then(|l| l.writer.as_ref()) {
            // Every later write fails at once (EPIPE), before any reader could notice.
            w.shutdown(Shutdown::Write).expect("shutdown");
        }
        let now = p.clock.now_ns();
        for i in 0..10 {
            p.append(i, now, now);
        }
        let (sent, _) = p.send_ready(now, true);
        assert!(!sent);
        p.service_links(now);
        assert_eq!(
            errors(&p),
            BTreeMap::from([("ClientConnectionLost".to_string(), 1)])
        );
        assert_eq!(p.queues[0].len(), 1, "the batch is back for a retry");
        assert!(p.links.get(&(0, 0)).is_some_and(|l| l.writer.is_none()));
    }

    /// A request unanswered for request.timeout.ms drops its connection (waking and ending
    /// the reader blocked on it), counts one ClientRequestTimeout and returns its batches
    /// for a retry; before then nothing happens.
    #[test]
    fn an_unanswered_request_times_out() {
        let mut p = producer(100);
        let _server = live_link(&mut p);
        let now = p.clock.now_ns();
        for i in 0..10 {
            p.append(i, now, now);
        }
        let (sent, _) = p.send_ready(now, true);
        assert!(sent);
        assert!(p.queues[0].is_empty());
        // The request's own stamp, not a later clock reading: the verdicts below follow
        // from it alone, however long this thread is descheduled in between.
        let sent_ns = p
            .links
            .get(&(0, 0))
            .and_then(|l| lock(&l.state).in_flight.front().map(|f| f.sent_ns))
            .expect("the request is in flight");
        p.service_links(sent_ns + 99 * MS);
        assert!(errors(&p).is_empty(), "not overdue yet: {:?}", errors(&p));
        p.service_links(sent_ns + 100 * MS);
        assert_eq!(
            errors(&p),
            BTreeMap::from([("ClientRequestTimeout".to_string(), 1)])
        );
        assert_eq!(p.queues[0].len(), 1, "the batch is back for a retry");
        let b = &p.queues[0][0];
        assert!(
            b.retry_at_ns > sent_ns + 100 * MS,
            "after the retry backoff"
        );
        assert!(p.links.get(&(0, 0)).is_some_and(|l| l.writer.is_none()));
    }

    /// A producer dropped after connecting, without running (its run's setup failed),
    /// closes its connections and ends their readers: the broker sees the connection
    /// close, and the reader thread (which holds the recorder) is gone once drop returns.
    #[test]
    fn a_producer_dropped_before_its_run_closes_its_connections() {
        let mut p = producer(30_000);
        let mut server = live_link(&mut p);
        let recorder = p.recorder.clone();
        assert!(Arc::strong_count(&recorder) >= 3, "producer, reader, test");
        drop(p);
        assert_eq!(
            Arc::strong_count(&recorder),
            1,
            "the reader thread ended and was joined"
        );
        // Bounded: an open connection would block this read until the timeout instead.
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = [0u8; 1];
        let got = std::io::Read::read(&mut server, &mut buf);
        assert!(matches!(got, Ok(0)), "the connection is closed: {got:?}");
    }

    /// A producer whose buffer stays full still ends its open-loop schedule at the
    /// duration (it looked at the schedule only when it could take a record), and says
    /// that records were never sent.
    #[test]
    fn a_full_buffer_does_not_keep_the_schedule_running() {
        let mut p = producer(30_000);
        let mut pacer = Pacer::new(0, Rate::PerSec(1000.0), None, Some(1_000 * MS));
        let stop = AtomicBool::new(false);
        p.buffered_bytes = p.cfg.buffer_memory_bytes;
        assert!(p.generate(&mut pacer, 500 * MS, &stop).is_some());
        assert_eq!(p.generate(&mut pacer, 1_000 * MS, &stop), None);
        assert_eq!(
            errors(&p),
            BTreeMap::from([("ClientBufferFull".to_string(), 1)])
        );
        // With room it catches up instead: the overdue records go out late, timed from
        // their intended send times.
        let mut p = producer(30_000);
        let mut pacer = Pacer::new(0, Rate::PerSec(1000.0), None, Some(1_000 * MS));
        assert_eq!(p.generate(&mut pacer, 1_000 * MS, &stop), Some(1_000 * MS));
        assert_eq!(pacer.issued(), GENERATE_BURST as u64);
    }
}
