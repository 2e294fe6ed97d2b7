//! The consumer: fetches its assigned partitions from their leaders, decodes records,
//! and reports each one (end-to-end latency from the stamp in its value) and its position.
//!
//! Partitions are assigned manually (partition i to consumer i mod n), or by a consumer
//! group (`group`): join, heartbeat, commit on rebalance and at the end. Fetches are full
//! (no KIP-227 incremental sessions: session epoch -1).
//!
//! Fetches read ahead: as soon as a response arrives, the next Fetch (from the offsets its
//! batch headers end at) is sent, and only then are the records decoded and CRC-checked,
//! so the broker works on the next response while the client checks this one.
//!
//! A throttled consumer (`ConsumerConfig::max_records_per_sec`) paces itself per batch and
//! publishes its position per batch, so the lag sampler sees the position advance at the
//! throttled rate.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use wire::api;
use wire::batch::{BATCH_HEADER_SIZE, batch_records, read_header};

use super::conn::Conn;
use super::error_name;
use super::group::{Beat, GroupMember, GroupReady};
use super::metadata::{self, Cluster, EARLIEST, LATEST, Refresher};
use super::payload::{self, Stamp};
use super::producer::warn;
use crate::stats::{Clock, Recorder};

/// Kafka error code OFFSET_OUT_OF_RANGE.
const OFFSET_OUT_OF_RANGE: i16 = 1;
/// Largest decompressed records section we accept from one batch.
const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;
/// Pause after a failed fetch before reconnecting.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);
/// A throttled consumer sleeps at most this long at a time (so `stop` is seen promptly).
const THROTTLE_SLEEP_MAX: Duration = Duration::from_millis(50);
/// A group member waiting for the run to start looks at its membership this often (it
/// heartbeats once a second): the group may rebalance while the other members join.
const START_WAIT_STEP: Duration = Duration::from_millis(100);

/// Opened when the run starts. Consumers fetch nothing before: a record read then would
/// fall before the measured run (and out of its counts), and a group member assigned
/// early would read what a later rebalance gives to another.
#[derive(Default)]
pub struct StartGate {
    /// When the run started, once it has.
    started_at: Mutex<Option<Instant>>,
    opened: Condvar,
}

impl StartGate {
    /// The run started at `at`: the consumers waiting here go.
    pub fn open(&self, at: Instant) {
        *self.started_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        self.opened.notify_all();
    }

    /// Waits up to `timeout` for the gate to open; when the run started, if it has.
    pub fn wait_open(&self, timeout: Duration) -> Option<Instant> {
        let g = self.started_at.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .opened
            .wait_timeout_while(g, timeout, |at| at.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *g
    }
}

/// Where a consumer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    Earliest,
    Latest,
}

/// How a consumer fetches.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    pub topic: String,
    pub start: StartAt,
    pub max_wait_ms: i32,
    pub fetch_max_bytes: i32,
    pub partition_max_bytes: i32,
    /// Consume as a member of this consumer group instead of a fixed assignment.
    pub group: Option<String>,
    /// Read at most this many records/s (this consumer alone); `None`: as fast as it can.
    pub max_records_per_sec: Option<f64>,
    /// Fetch with isolation_level=1: records up to the last stable offset only, aborted
    /// transactions' records skipped (the response's aborted_transactions + markers).
    pub read_committed: bool,
    /// On OFFSET_OUT_OF_RANGE, move to the log start (Kafka's auto.offset.reset=earliest);
    /// false: stop reading that partition (its position becomes unknown), for `verify`,
    /// where records skipped by a reset would pass for records never written.
    pub reset_out_of_range: bool,
}

/// A Fetch sent and not yet answered (one per broker: read-ahead depth 1).
struct Pending {
    correlation_id: i32,
    version: i16,
    parts: Vec<i32>,
}

/// Told about every record consumed (for `verify`).
pub trait RecordSink: Send + Sync {
    /// Record at `offset` of `partition`, fetched at `now_ns` (run clock).
    fn consumed(&self, partition: i32, offset: i64, stamp: Option<Stamp>, now_ns: u64);

    /// The records of one fetched batch of `partition`, in offset order. One by one
    /// unless a sink can do better: consumer threads share a sink, and what it updates
    /// per record they contend for.
    fn consumed_all(&self, partition: i32, records: &[Seen], now_ns: u64) {
        for r in records {
            self.consumed(partition, r.offset, r.stamp, now_ns);
        }
    }
}

/// One record a consumer counted.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub offset: i64,
    pub stamp: Option<Stamp>,
    /// Its value's length.
    pub bytes: u64,
}

/// Ignores records.
pub struct NoRecordSink;

impl RecordSink for NoRecordSink {
    fn consumed(&self, _: i32, _: i64, _: Option<Stamp>, _: u64) {}
}

/// The next offset each partition's consumer will read: shared with the lag sampler.
pub struct Positions(pub Vec<AtomicI64>);

impl Positions {
    pub fn new(partitions: usize) -> Arc<Self> {
        Arc::new(Self((0..partitions).map(|_| AtomicI64::new(-1)).collect()))
    }

    pub fn get(&self, p: usize) -> Option<i64> {
        self.0
            .get(p)
            .map(|a| a.load(Ordering::Relaxed))
            .filter(|&o| o >= 0)
    }

    fn set(&self, p: usize, offset: i64) {
        if let Some(a) = self.0.get(p) {
            a.store(offset, Ordering::Relaxed);
        }
    }
}

/// When a consumer stops (whichever comes first; `stop` always works).
#[derive(Clone, Debug)]
pub struct Until {
    /// Stop when all consumers sharing `consumed` have read this many records together.
    pub records: Option<u64>,
    pub consumed: Arc<AtomicU64>,
    /// Stop at this instant. A consumer waiting at a start gate waits until then at most;
    /// once the run starts, `run_for` (if any) replaces it.
    pub deadline: Instant,
    /// Stop this long after the run starts (its start gate opens): the consumers' time
    /// counts from the start, so however long the setup took (producers connecting, a
    /// group joining) none of it is taken from them. `None`: `deadline` stays.
    pub run_for: Option<Duration>,
    /// Stop after this long without a single record.
    pub idle: Option<Duration>,
    /// The idle rule applies only once each of these partitions' positions has reached
    /// its offset here (or is unknown: given up); `verify` waits for the offset after the
    /// last record it saw acknowledged, so a slow fetch is not taken for the end.
    pub reach: BTreeMap<i32, i64>,
}

/// One consumer over a fixed set of partitions.
pub struct Consumer {
    cfg: ConsumerConfig,
    cluster: Cluster,
    partitions: Vec<i32>,
    positions: Arc<Positions>,
    clock: Clock,
    recorder: Arc<Recorder>,
    sink: Arc<dyn RecordSink>,
    run_id: u64,
    conns: BTreeMap<i32, Conn>,
    consumed: u64,
    member: Option<GroupMember>,
    /// The Fetch in flight per broker.
    pending: BTreeMap<i32, Pending>,
    /// Where the next Fetch of each partition starts (ahead of `positions` while a
    /// response is being decoded).
    fetch_at: BTreeMap<i32, i64>,
    /// When throttling started (first record).
    throttle_start: Option<Instant>,
    /// Partition leaders are asked for again after a leadership error or a lost
    /// connection (the layout the consumer was built with goes stale when leaders move).
    refresh: Refresher,
    /// One batch's records, kept between batches.
    seen: Vec<Seen>,
    /// Told of each assignment this member takes (or that it could not join), as member
    /// number `.1` of the run's group.
    ready: Option<(Arc<GroupReady>, usize)>,
    /// Nothing is fetched before this opens (none: fetch at once).
    gate: Option<Arc<StartGate>>,
}

impl Consumer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: ConsumerConfig,
        cluster: Cluster,
        partitions: Vec<i32>,
        positions: Arc<Positions>,
        clock: Clock,
        recorder: Arc<Recorder>,
        sink: Arc<dyn RecordSink>,
        run_id: u64,
    ) -> Self {
        Self {
            cfg,
            cluster,
            partitions,
            positions,
            clock,
            recorder,
            sink,
            run_id,
            conns: BTreeMap::new(),
            consumed: 0,
            member: None,
            pending: BTreeMap::new(),
            fetch_at: BTreeMap::new(),
            throttle_start: None,
            refresh: Refresher::default(),
            seen: Vec::new(),
            ready: None,
            gate: None,
        }
    }

    /// Makes this consumer fetch nothing until `gate` opens (it joins its group first).
    pub fn wait_for(&mut self, gate: Arc<StartGate>) {
        self.gate = Some(gate);
    }

    /// Waits for the start gate, keeping up group membership meanwhile (a rebalance for a
    /// member that joins later needs this one to rejoin). Returns when the run started;
    /// `None` when the consumer is stopped, interrupted or past its deadline first, and
    /// then the group's wait is told why (the run cannot start with this member).
    fn wait_for_start(&mut self, until: &Until, stop: &AtomicBool) -> Option<Instant> {
        let Some(gate) = self.gate.clone() else {
            return Some(Instant::now());
        };
        // Bounded by `until.deadline`: every turn waits START_WAIT_STEP at most.
        let why = loop {
            if let Some(at) = gate.wait_open(START_WAIT_STEP) {
                return Some(at);
            }
            if stop.load(Ordering::Relaxed) {
                break "stopped before the run started";
            }
            if crate::run::interrupted() {
                break "interrupted before the run started";
            }
            if Instant::now() >= until.deadline {
                break "the run had not started by the consumer's deadline";
            }
            if let Err(e) = self.keep_membership() {
                warn(&format!("group membership: {e:#}"));
                self.recorder.record_error("ClientGroupFailed", 1);
                self.report_failed(&format!("group membership: {e:#}"));
            }
        };
        self.report_failed(why);
        None
    }

    /// Tells the run's group wait (if any) that this member cannot start, and why.
    fn report_failed(&self, why: &str) {
        if let Some((ready, member)) = &self.ready {
            ready.failed(*member, why);
        }
    }

    /// Reports this consumer's group assignments to `ready`, as member number `member`.
    pub fn report_to(&mut self, ready: Arc<GroupReady>, member: usize) {
        self.ready = Some((ready, member));
    }

    /// Sets every partition's start position (earliest or latest).
    pub fn seek_start(&mut self) -> Result<()> {
        let ts = match self.cfg.start {
            StartAt::Earliest => EARLIEST,
            StartAt::Latest => LATEST,
        };
        let topic = self.cfg.topic.clone();
        for (broker, parts) in self.by_broker() {
            let conn = self.conn(broker)?;
            let offs = metadata::list_offsets(conn, &topic, &parts, ts)?;
            for p in parts {
                let o = offs
                    .get(&p)
                    .copied()
                    .ok_or_else(|| anyhow::anyhow!("no start offset for partition {p}"))?;
                self.positions.set(p as usize, o);
            }
        }
        Ok(())
    }

    fn by_broker(&self) -> BTreeMap<i32, Vec<i32>> {
        let mut m: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for &p in &self.partitions {
            let leader = self.cluster.leaders.get(p as usize).copied().unwrap_or(-1);
            m.entry(leader).or_default().push(p);
        }
        m
    }

    fn conn(&mut self, broker: i32) -> Result<&mut Conn> {
        if !self.conns.contains_key(&broker) {
            let addr = self
                .cluster
                .brokers
                .get(&broker)
                .ok_or_else(|| anyhow::anyhow!("unknown broker {broker}"))?;
            let c = Conn::connect(addr)?;
            self.conns.insert(broker, c);
        }
        self.conns
            .get_mut(&broker)
            .ok_or_else(|| anyhow::anyhow!("connection vanished"))
    }

    /// Joins the configured group and takes its assignment; positions come from the
    /// group's committed offsets, else stay where the run's start put them.
    fn join_group(&mut self) -> Result<()> {
        let Some(group) = self.cfg.group.clone() else {
            return Ok(());
        };
        let (member, parts) = GroupMember::join(&self.cluster, &group, &self.cfg.topic)?;
        self.member = Some(member);
        self.take_assignment(parts)
    }

    fn take_assignment(&mut self, parts: Vec<i32>) -> Result<()> {
        let Some(m) = self.member.as_mut() else {
            return Ok(());
        };
        for (p, o) in m.committed(&parts)? {
            self.positions.set(p as usize, o);
        }
        if let Some((ready, member)) = &self.ready {
            ready.assigned(*member, m.generation(), &parts);
        }
        self.partitions = parts;
        // Fetches in flight were for the old assignment: drop them with their connections.
        self.forget_fetches();
        Ok(())
    }

    /// Commits the positions of this consumer's partitions.
    fn commit(&mut self) -> Result<()> {
        let offsets: BTreeMap<i32, i64> = self
            .partitions
            .iter()
            .filter_map(|&p| Some((p, self.positions.get(p as usize)?)))
            .collect();
        match self.member.as_mut() {
            Some(m) => m.commit(&offsets),
            None => Ok(()),
        }
    }

    /// Heartbeats; on a rebalance commits, rejoins and takes the new assignment.
    fn keep_membership(&mut self) -> Result<()> {
        let Some(m) = self.member.as_mut() else {
            return Ok(());
        };
        if m.heartbeat_if_due()? == Beat::Fine {
            return Ok(());
        }
        // Committing may fail once the generation is gone; the next owner then re-reads
        // from the last successful commit (at-least-once, as Kafka consumers do).
        let _ = self.commit();
        let parts = match self.member.as_mut() {
            Some(m) => m.rejoin()?,
            None => return Ok(()),
        };
        self.take_assignment(parts)
    }

    /// Fetches until `until` or `stop`; returns the number of records consumed.
    pub fn run(mut self, mut until: Until, stop: &AtomicBool) -> u64 {
        // A panic below still ends the run's wait for the group at once.
        let _report = ReportPanic(self.ready.clone());
        if let Err(e) = self.join_group() {
            warn(&format!("joining the group failed: {e:#}"));
            self.recorder.record_error("ClientGroupJoinFailed", 1);
            self.report_failed(&format!("joining failed: {e:#}"));
            return 0;
        }
        let Some(started_at) = self.wait_for_start(&until, stop) else {
            // The run never started: leave the group without committing anything.
            if let Some(m) = self.member.as_mut() {
                m.leave();
            }
            return 0;
        };
        if let Some(d) = until.run_for {
            until.deadline = started_at + d;
        }
        let consumed = self.fetch_loop(until, stop);
        if self.member.is_some() {
            if let Err(e) = self.commit() {
                warn(&format!("final commit failed: {e:#}"));
            }
            if let Some(m) = self.member.as_mut() {
                m.leave();
            }
        }
        consumed
    }

    fn fetch_loop(&mut self, until: Until, stop: &AtomicBool) -> u64 {
        let mut last_record = Instant::now();
        while !stop.load(Ordering::Relaxed)
            && !crate::run::interrupted()
            && Instant::now() < until.deadline
        {
            if let Err(e) = self.keep_membership() {
                warn(&format!("group membership: {e:#}"));
                self.recorder.record_error("ClientGroupFailed", 1);
                std::thread::sleep(RECONNECT_BACKOFF);
            }
            if until
                .records
                .is_some_and(|n| until.consumed.load(Ordering::Relaxed) >= n)
            {
                break;
            }
            if until.idle.is_some_and(|d| last_record.elapsed() >= d) && self.reached(&until.reach)
            {
                break;
            }
            if !self.refresh_leaders() {
                continue;
            }
            let before = self.consumed;
            for (broker, parts) in self.by_broker() {
                if let Err(e) = self.fetch_once(broker, &parts, stop) {
                    warn(&format!("fetch from broker {broker}: {e:#}"));
                    self.recorder.record_error("ClientFetchFailed", 1);
                    self.conns.remove(&broker);
                    self.pending.remove(&broker);
                    self.fetch_at.clear();
                    self.refresh.want();
                    std::thread::sleep(RECONNECT_BACKOFF);
                }
            }
            if self.consumed > before {
                last_record = Instant::now();
                until
                    .consumed
                    .fetch_add(self.consumed - before, Ordering::Relaxed);
            }
        }
        self.consumed
    }

    /// Whether every partition of this consumer in `reach` has been read up to its offset
    /// there (a partition with no position any more counts: it was given up).
    fn reached(&self, reach: &BTreeMap<i32, i64>) -> bool {
        self.partitions.iter().all(|p| {
            let target = reach.get(p).copied().unwrap_or(0);
            usize::try_from(*p)
                .ok()
                .and_then(|i| self.positions.get(i))
                .is_none_or(|pos| pos >= target)
        })
    }

    /// Asks for the partition leaders again when a fetch said they moved. Returns whether
    /// to fetch now; while the refresh backs off, it sleeps a bounded step instead, so a
    /// partition without a leader is not fetched in a tight loop.
    fn refresh_leaders(&mut self) -> bool {
        if !self.refresh.wanted() {
            return true;
        }
        let wait = self.refresh.wait();
        if !wait.is_zero() {
            std::thread::sleep(wait.min(THROTTLE_SLEEP_MAX));
            return false;
        }
        match self
            .refresh
            .refresh_if_due(&mut self.cluster, &self.cfg.topic)
        {
            Ok(_) => {
                // Fetches in flight went to the old leaders.
                self.forget_fetches();
                true
            }
            Err(e) => {
                self.recorder.record_error("ClientMetadataRefreshFailed", 1);
                warn(&format!("metadata refresh failed: {e:#}"));
                false
            }
        }
    }

    fn forget_fetches(&mut self) {
        for b in std::mem::take(&mut self.pending).into_keys() {
            self.conns.remove(&b);
        }
        self.fetch_at.clear();
    }

    /// Sends a Fetch of `parts` to `broker` from their next fetch offsets.
    fn send_fetch(&mut self, broker: i32, parts: &[i32]) -> Result<()> {
        let req = self.fetch_request(parts);
        let conn = self.conn(broker)?;
        let version = conn.versions.pick(api::FETCH, 4, 12)?;
        let correlation_id = conn.send(&req, version)?;
        let parts = parts.to_vec();
        self.pending.insert(
            broker,
            Pending {
                correlation_id,
                version,
                parts,
            },
        );
        Ok(())
    }

    /// One Fetch round trip with `broker`, read ahead: the next Fetch goes out before this
    /// response's records are decoded.
    fn fetch_once(&mut self, broker: i32, parts: &[i32], stop: &AtomicBool) -> Result<()> {
        if self.pending.get(&broker).is_none_or(|p| p.parts != parts) {
            if self.pending.contains_key(&broker) {
                // The partition set changed: the old answer is for other partitions.
                self.forget_fetches();
            }
            self.send_fetch(broker, parts)?;
        }
        let Some(pending) = self.pending.remove(&broker) else {
            return Ok(());
        };
        let conn = self.conn(broker)?;
        let resp: FetchResponse =
            conn.recv::<FetchRequest>(pending.version, pending.correlation_id)?;
        if resp.error_code != 0 {
            self.recorder.record_error(&error_name(resp.error_code), 1);
            self.refresh.want();
        }
        // Where each partition's next fetch starts: after the last whole batch returned.
        let mut clean = resp.error_code == 0;
        for t in &resp.responses {
            for pd in &t.partitions {
                if pd.error_code != 0 {
                    clean = false;
                    continue;
                }
                if let Some(records) = &pd.records
                    && let Some(end) = batches_end(records)
                {
                    let at = self.fetch_at.entry(pd.partition_index).or_insert(end);
                    *at = (*at).max(end);
                }
            }
        }
        if clean {
            self.refresh.healthy();
        }
        if clean && !stop.load(Ordering::Relaxed) {
            self.send_fetch(broker, parts)?;
        }
        for t in resp.responses {
            for pd in t.partitions {
                let aborted = Aborted::new(pd.aborted_transactions.as_deref().unwrap_or(&[]));
                let p = pd.partition_index;
                self.handle_partition(p, pd.error_code, pd.records, aborted, stop)?;
            }
        }
        Ok(())
    }

    /// Sleeps until this consumer's throttle allows another record (bounded steps).
    fn throttle(&mut self, stop: &AtomicBool) {
        let Some(rate) = self.cfg.max_records_per_sec else {
            return;
        };
        let start = *self.throttle_start.get_or_insert_with(Instant::now);
        let due = start + Duration::from_secs_f64(self.consumed as f64 / rate);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= due {
                return;
            }
            std::thread::sleep((due - now).min(THROTTLE_SLEEP_MAX));
        }
    }

    fn fetch_request(&self, parts: &[i32]) -> FetchRequest {
        let mut t = FetchTopic::default();
        t.topic = TopicName(StrBytes::from_string(self.cfg.topic.clone()));
        t.partitions = parts
            .iter()
            .filter_map(|&p| {
                let pos = self.positions.get(p as usize)?;
                let pos = self.fetch_at.get(&p).map_or(pos, |&a| a.max(pos));
                let mut fp = FetchPartition::default();
                fp.partition = p;
                fp.current_leader_epoch = -1;
                fp.fetch_offset = pos;
                fp.log_start_offset = -1;
                fp.partition_max_bytes = self.cfg.partition_max_bytes;
                Some(fp)
            })
            .collect();
        let mut req = FetchRequest::default();
        req.max_wait_ms = self.cfg.max_wait_ms;
        req.min_bytes = 1;
        req.max_bytes = self.cfg.fetch_max_bytes;
        req.session_epoch = -1;
        req.isolation_level = i8::from(self.cfg.read_committed);
        req.topics = vec![t];
        req
    }

    fn handle_partition(
        &mut self,
        p: i32,
        code: i16,
        records: Option<Bytes>,
        mut aborted: Aborted,
        stop: &AtomicBool,
    ) -> Result<()> {
        if code == OFFSET_OUT_OF_RANGE {
            self.recorder.record_error(&error_name(code), 1);
            if self.cfg.reset_out_of_range {
                return self.reset(p);
            }
            warn(&format!(
                "partition {p}: offset {} out of range; not reading it further",
                self.positions.get(p as usize).unwrap_or(-1)
            ));
            self.fetch_at.remove(&p);
            self.positions.set(p as usize, -1);
            return Ok(());
        }
        if code != 0 {
            // Any other partition error (a moved leader above all) is retried against a
            // fresh layout, after the refresh's backoff: never in a tight loop.
            self.recorder.record_error(&error_name(code), 1);
            self.refresh.want();
            return Ok(());
        }
        let Some(records) = records else {
            return Ok(());
        };
        let Some(mut pos) = self.positions.get(p as usize) else {
            return Ok(());
        };
        let now = self.clock.now_ns();
        let mut at = 0usize;
        // Walk batch headers; `batch_records` validates each batch (CRC once) as it decodes.
        for _ in 0..records.len() / BATCH_HEADER_SIZE + 1 {
            let Ok(h) = read_header(&records[at..]) else {
                break;
            };
            let end = at.saturating_add(h.total_size());
            if h.total_size() < BATCH_HEADER_SIZE || end > records.len() {
                break; // a truncated last batch is normal: the fetch hit its byte limit
            }
            let next = h.next_offset().get();
            let control = h.attributes().is_control();
            let batch = records.slice(at..end);
            at = end;
            // Kafka's consumer: every batch (also those before the position) moves the
            // aborted-transaction state, so an abort marker always closes its transaction.
            let skip_aborted = self.cfg.read_committed && aborted.skips(h, &batch);
            if next <= pos || control || skip_aborted {
                pos = pos.max(next);
                continue;
            }
            if self.cfg.max_records_per_sec.is_some() {
                // Paced per batch, and the position published per batch, so lag samples
                // see it move at the throttled rate.
                self.throttle(stop);
                let now = self.clock.now_ns();
                self.decode_batch(p, batch, pos, now);
                pos = next;
                self.positions.set(p as usize, pos);
                continue;
            }
            self.decode_batch(p, batch, pos, now);
            pos = next;
        }
        self.positions.set(p as usize, pos);
        Ok(())
    }

    /// Checks one fetched batch (CRC) and counts its records from `pos` on: each is
    /// walked in place (no allocation, no reference count per record), and the batch is
    /// recorded under one lock of the shared recorder.
    fn decode_batch(&mut self, p: i32, batch: Bytes, pos: i64, now: u64) {
        let checked = wire::batch::validate_batch(&batch).map(|view| view.header.base_offset());
        let base = match checked {
            Ok(base) => base.get(),
            Err(e) => return self.corrupt(p, &format!("undecodable batch: {e}")),
        };
        let mut seen = std::mem::take(&mut self.seen);
        seen.clear();
        let run_id = self.run_id;
        let walked = wire::batch::walk_batch(&batch, MAX_DECOMPRESSED_BYTES, |_, r| {
            let offset = base + i64::from(r.offset_delta);
            if offset >= pos {
                let value = r.value.unwrap_or(&[]);
                seen.push(Seen {
                    offset,
                    stamp: payload::decode(value).filter(|s| s.run_id == run_id),
                    bytes: value.len() as u64,
                });
            }
            Ok(())
        });
        self.sink.consumed_all(p, &seen, now);
        let stats = seen
            .iter()
            .map(|r| (r.stamp.map(|s| s.intended_ns), r.bytes));
        self.recorder.record_consumed_all(stats, now);
        self.consumed += seen.len() as u64;
        self.seen = seen;
        if let Err(e) = walked {
            self.corrupt(p, &format!("bad record: {e}"));
        }
    }

    fn corrupt(&self, p: i32, why: &str) {
        self.recorder.record_error("ClientCorruptBatch", 1);
        warn(&format!("partition {p}: {why}"));
    }

    fn reset(&mut self, p: i32) -> Result<()> {
        self.fetch_at.remove(&p);
        let leader = self.cluster.leaders.get(p as usize).copied().unwrap_or(-1);
        let topic = self.cfg.topic.clone();
        let conn = self.conn(leader)?;
        let offs = metadata::list_offsets(conn, &topic, &[p], EARLIEST)?;
        if let Some(&o) = offs.get(&p) {
            self.positions.set(p as usize, o);
        }
        Ok(())
    }
}

/// Tells a run's group wait that this member's thread panicked (it is dropped while the
/// thread unwinds), so the run fails at once with why instead of at the wait's timeout.
struct ReportPanic(Option<(Arc<GroupReady>, usize)>);

impl Drop for ReportPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some((ready, member)) = &self.0
        {
            ready.failed(*member, "the consumer thread panicked");
        }
    }
}

/// The aborted transactions of one partition's fetch response, applied as Kafka's
/// consumer does: a transaction whose first offset is at or before a batch's last offset
/// is open for that producer until its ABORT marker; its transactional batches are skipped.
pub struct Aborted {
    /// (first offset, producer id), sorted by first offset.
    pending: Vec<(i64, i64)>,
    next: usize,
    /// Producer ids whose aborted transaction is under way at the current batch.
    open: std::collections::HashSet<i64>,
}

/// Control record type of an ABORT marker (the marker key is version i16, type i16).
const CONTROL_TYPE_ABORT: i16 = 0;

impl Aborted {
    pub fn new(list: &[kafka_protocol::messages::fetch_response::AbortedTransaction]) -> Self {
        let mut pending: Vec<(i64, i64)> = list
            .iter()
            .map(|a| (a.first_offset, a.producer_id.0))
            .collect();
        pending.sort_unstable();
        Self {
            pending,
            next: 0,
            open: Default::default(),
        }
    }

    /// Whether the batch with header `h` (whole bytes `batch`) belongs to an aborted
    /// transaction and must be skipped; control batches update the state (and are
    /// skipped by the caller anyway).
    pub fn skips(&mut self, h: &wire::batch::BatchHeader, batch: &Bytes) -> bool {
        let last = h.last_offset().get();
        while let Some(&(first, pid)) = self.pending.get(self.next) {
            if first > last {
                break;
            }
            self.open.insert(pid);
            self.next += 1;
        }
        let pid = h.producer_id().get();
        if h.attributes().is_control() {
            if control_type(batch) == Some(CONTROL_TYPE_ABORT) {
                self.open.remove(&pid);
            }
            return false;
        }
        h.attributes().is_transactional() && self.open.contains(&pid)
    }
}

/// The control type of a control batch's (first) record: its key's second i16.
fn control_type(batch: &Bytes) -> Option<i16> {
    let (_, mut records) = batch_records(batch, MAX_DECOMPRESSED_BYTES).ok()?;
    let r = records.next()?.ok()?;
    let k = r.key.as_deref()?;
    let t = k.get(2..4)?;
    Some(i16::from_be_bytes([t[0], t[1]]))
}

/// The offset after the last whole batch in a fetched records section (`None`: no whole
/// batch). Reads batch headers only; records are checked later, when decoded.
fn batches_end(records: &[u8]) -> Option<i64> {
    let mut at = 0usize;
    let mut end = None;
    for _ in 0..records.len() / BATCH_HEADER_SIZE + 1 {
        let Ok(h) = read_header(&records[at..]) else {
            break;
        };
        let next = at.saturating_add(h.total_size());
        if h.total_size() < BATCH_HEADER_SIZE || next > records.len() {
            break;
        }
        end = Some(h.next_offset().get());
        at = next;
    }
    end
}

/// Total lag (log end offset minus position) over all partitions with a position.
///
/// Positions are read *before* ListOffsets is sent. Read after the answer (as before), a
/// consumer that keeps pace within one ListOffsets round trip had already passed the
/// returned end, so `(end - position).max(0)` was 0 in every sample however far behind
/// the consumer ran between samples at high rates; the quickstart showed "max lag 0"
/// at 287k records/s. Read first, records appended during the round trip count as lag
/// (an upper bound, by the round trip times the rate), never hidden.
///
/// A partition whose leader refused ListOffsets (or left it out) makes the whole sample an
/// error: the lag is then unknown, never counted as 0.
pub fn sample_lag(
    conns: &mut BTreeMap<i32, Conn>,
    cluster: &Cluster,
    topic: &str,
    positions: &Positions,
) -> Result<i64> {
    let mut by_broker: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for (p, &leader) in cluster.leaders.iter().enumerate() {
        by_broker.entry(leader).or_default().push(p as i32);
    }
    let before: Vec<Option<i64>> = (0..cluster.partitions())
        .map(|p| positions.get(p))
        .collect();
    let mut lag = 0i64;
    for (broker, parts) in by_broker {
        if let std::collections::btree_map::Entry::Vacant(e) = conns.entry(broker) {
            let addr = cluster
                .brokers
                .get(&broker)
                .ok_or_else(|| anyhow::anyhow!("unknown broker {broker}"))?;
            e.insert(Conn::connect(addr)?);
        }
        let Some(conn) = conns.get_mut(&broker) else {
            continue;
        };
        let ends = match metadata::list_offsets_answers(conn, topic, &parts, LATEST, 0) {
            Ok(e) => e,
            Err(e) => {
                conns.remove(&broker);
                return Err(e);
            }
        };
        for p in parts {
            let end = match ends.get(&p) {
                Some(Ok(end)) => *end,
                Some(Err(code)) => {
                    anyhow::bail!("partition {p}: ListOffsets answered {}", error_name(*code))
                }
                None => anyhow::bail!("partition {p}: left out of the ListOffsets answer"),
            };
            if let Some(&Some(pos)) = usize::try_from(p).ok().and_then(|p| before.get(p)) {
                lag += (end - pos).max(0);
            }
        }
    }
    Ok(lag)
}

/// Samples consumer lag once a second for the progress thread, following partition
/// leaders: a sample that fails (a refused partition, a lost connection) asks for the
/// layout again and, if the refresh's backoff allows, samples once more at once.
pub struct LagSampler {
    cluster: Cluster,
    topic: String,
    conns: BTreeMap<i32, Conn>,
    refresh: Refresher,
}

impl LagSampler {
    pub fn new(cluster: Cluster, topic: &str) -> Self {
        Self {
            cluster,
            topic: topic.to_string(),
            conns: BTreeMap::new(),
            refresh: Refresher::default(),
        }
    }

    /// Total lag over all partitions; an error when it is not known for every partition.
    pub fn sample(&mut self, positions: &Positions) -> Result<i64> {
        // Bounded: the first try, and one more after a refresh.
        let mut last = anyhow::anyhow!("no sample taken");
        for _ in 0..2 {
            if self.refresh.wanted() {
                match self.refresh.refresh_if_due(&mut self.cluster, &self.topic) {
                    Ok(true) => self.conns.clear(),
                    Ok(false) => return Err(last),
                    Err(e) => return Err(e.context(format!("after {last:#}"))),
                }
            }
            match sample_lag(&mut self.conns, &self.cluster, &self.topic, positions) {
                Ok(lag) => {
                    self.refresh.healthy();
                    return Ok(lag);
                }
                Err(e) => {
                    self.refresh.want();
                    last = e;
                }
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::AbortedTransaction;
    use wire::batch::{BatchBuilder, NewRecord, control_batch};
    use wire::{Offset, ProducerEpoch, ProducerId};

    fn txn_batch(base: i64, pid: i64, n: usize) -> Bytes {
        let records = (0..n)
            .map(|_| NewRecord {
                timestamp_ms: 0,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Vec::new(),
            })
            .collect();
        let b = BatchBuilder {
            base_offset: Offset(base),
            producer_id: ProducerId(pid),
            producer_epoch: ProducerEpoch(0),
            base_sequence: wire::Sequence(0),
            transactional: true,
            records,
            ..BatchBuilder::default()
        };
        b.build().unwrap()
    }

    fn marker(base: i64, pid: i64, commit: bool) -> Bytes {
        let b = control_batch(ProducerId(pid), ProducerEpoch(0), commit, 0, 0).unwrap();
        let mut v = b.to_vec();
        v[..8].copy_from_slice(&base.to_be_bytes());
        Bytes::from(v)
    }

    /// A consumer of `partitions` of a topic led by a broker nobody listens on.
    fn consumer(partitions: Vec<i32>) -> Consumer {
        let cfg = ConsumerConfig {
            topic: "t".into(),
            start: StartAt::Latest,
            max_wait_ms: 100,
            fetch_max_bytes: 1 << 20,
            partition_max_bytes: 1 << 20,
            group: None,
            max_records_per_sec: None,
            read_committed: false,
            reset_out_of_range: true,
        };
        let refused = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let cluster = Cluster {
            brokers: BTreeMap::from([(0, refused)]),
            leaders: vec![0],
        };
        let positions = Positions::new(1);
        positions.set(0, 0);
        Consumer::new(
            cfg,
            cluster,
            partitions,
            positions,
            Clock::start(),
            Arc::new(Recorder::new(0)),
            Arc::new(NoRecordSink),
            1,
        )
    }

    fn until(deadline: Instant, run_for: Option<Duration>) -> Until {
        Until {
            records: None,
            consumed: Arc::default(),
            deadline,
            run_for,
            idle: None,
            reach: BTreeMap::new(),
        }
    }

    /// A member whose run never starts (it was stopped, or its deadline passed) tells the
    /// group's wait why, which then ends at once instead of at its timeout.
    #[test]
    fn a_member_that_never_starts_tells_the_group_why() {
        let far = Instant::now() + Duration::from_secs(600);
        for (deadline, stopped, want) in [
            (
                Instant::now(),
                false,
                "had not started by the consumer's deadline",
            ),
            (far, true, "stopped before the run started"),
        ] {
            let ready = Arc::new(GroupReady::new("g", 1, 1));
            let mut c = consumer(Vec::new());
            c.report_to(ready.clone(), 0);
            c.wait_for(Arc::default()); // a gate that never opens
            assert_eq!(c.run(until(deadline, None), &AtomicBool::new(stopped)), 0);
            let e = ready
                .wait(Duration::from_secs(600), || false)
                .expect_err("the member failed");
            assert!(format!("{e:#}").contains(want), "{e:#}");
        }
    }

    /// A member whose thread panics tells the group's wait so.
    #[test]
    fn a_member_that_panics_tells_the_group() {
        let ready = Arc::new(GroupReady::new("g", 2, 2));
        let r = ready.clone();
        let h = std::thread::spawn(move || {
            let _report = ReportPanic(Some((r, 1)));
            panic!("a consumer thread panics (this test expects it)");
        });
        assert!(h.join().is_err());
        let e = ready
            .wait(Duration::from_secs(600), || false)
            .expect_err("the member failed");
        assert!(format!("{e:#}").contains("panicked"), "{e:#}");
    }

    /// The consumers' time counts from the run's start: a gate opened after the deadline
    /// the consumer was built with (a slow setup) still gives it `run_for` from the start.
    #[test]
    fn a_consumer_runs_for_its_time_from_the_start_however_long_the_setup() {
        const RUN_FOR: Duration = Duration::from_millis(500);
        let mut c = consumer(vec![0]);
        let gate: Arc<StartGate> = Arc::default();
        c.wait_for(gate.clone());
        let started = Instant::now();
        gate.open(started);
        // Built with a deadline the setup has already used up.
        let consumed = c.run(until(started, Some(RUN_FOR)), &AtomicBool::new(false));
        assert_eq!(consumed, 0, "nobody listens");
        let ran = started.elapsed();
        assert!(ran >= RUN_FOR, "stopped at the setup's deadline: {ran:?}");
        assert!(ran < Duration::from_secs(60), "{ran:?}");
    }

    /// Producer 7 aborts a transaction at 0..2 (marker at 2) and then commits one at 3..4
    /// (marker at 5); producer 8's transaction at 6..7 is aborted (marker 8). Only the
    /// committed one is delivered, as Kafka's consumer does.
    #[test]
    fn aborted_transactions_are_skipped_and_closed_by_their_markers() {
        let mut list = Vec::new();
        for (pid, first) in [(8, 6), (7, 0)] {
            let mut a = AbortedTransaction::default();
            a.producer_id = kafka_protocol::messages::ProducerId(pid);
            a.first_offset = first;
            list.push(a);
        }
        let mut ab = Aborted::new(&list);
        let batches = [
            (txn_batch(0, 7, 2), true),
            (marker(2, 7, false), false),
            (txn_batch(3, 7, 2), false),
            (marker(5, 7, true), false),
            (txn_batch(6, 8, 2), true),
            (marker(8, 8, false), false),
        ];
        for (i, (b, skipped)) in batches.iter().enumerate() {
            let h = read_header(b).unwrap();
            assert_eq!(ab.skips(h, b), *skipped, "batch {i}");
        }
    }
}
