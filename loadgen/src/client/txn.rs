//! The transactional producer (`--transactional-id`): records go out in transactions of
//! `txn_records` each. FindCoordinator(key_type 1) → InitProducerId(transactional id,
//! transaction.timeout.ms) → per transaction AddPartitionsToTxn, Produce (transactional
//! batches: attributes bit 4, producer id / epoch / sequence), EndTxn(commit). A record
//! counts as acknowledged only when its transaction's EndTxn(commit) succeeded.
//!
//! One transaction at a time per producer; its Produce requests are pipelined up to
//! `max_in_flight` per broker. Errors follow Kafka's client rules:
//! - retriable coordinator errors (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
//!   COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS) and lost connections: re-find
//!   the coordinator / back off, and send the same request again;
//! - any other error before EndTxn(commit) was sent is abortable: EndTxn(abort), and the
//!   transaction's records are reported as aborted (no path leads to their commit: only
//!   EndTxn(commit) commits, and it was never sent);
//! - PRODUCER_FENCED / INVALID_PRODUCER_EPOCH: re-initialise without aborting;
//! - EndTxn(commit) sent but never answered with success: outcome unknown, records
//!   unacknowledged.
//!
//! After any failed transaction the producer re-initialises (InitProducerId bumps the
//! epoch and resolves whatever was left open), so sequence numbers restart at 0 whatever
//! the broker kept of the failed transaction's batches.
//!
//! Every connection's reads are bounded by request.timeout.ms: a response not received
//! within it drops the connection and counts one `ClientRequestTimeout` (a coordinator
//! request is then sent again, a Produce fails its transaction, as a lost connection does).
//! The coordinator and the partition leaders are connected to in [`TxnProducer::prepare`],
//! before the run's clock starts.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, EndTxnRequest, FindCoordinatorRequest, InitProducerIdRequest,
    ProduceRequest, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Request, StrBytes};
use wire::batch::Compression;
use wire::{ProducerEpoch, ProducerId, Sequence, api};

use super::conn::{self, Conn};
use super::metadata::{self, Cluster};
use super::produce_wire::{self, BatchFields, BatchSource, Rec, RequestBuf, RequestFields, Values};
use super::producer::{AckSink, ProducerConfig, ProducerStats, warn};
use super::{error_name, partition_for_key, payload};
use crate::schedule::{Next, Pacer};
use crate::stats::{Clock, Recorder};

const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const CONCURRENT_TRANSACTIONS: i16 = 51;
const PRODUCER_FENCED: i16 = 90;
/// Coordinator errors after which the same request is sent again (after a back-off).
const RETRIABLE_COORDINATOR: [i16; 4] = [
    NOT_COORDINATOR,
    COORDINATOR_NOT_AVAILABLE,
    COORDINATOR_LOAD_IN_PROGRESS,
    CONCURRENT_TRANSACTIONS,
];
/// Attempts of one coordinator request at most (besides its deadline).
const COORDINATOR_ATTEMPTS_MAX: u32 = 1_000;
/// Longest the producer sleeps waiting for the schedule without re-checking `stop`.
const WAIT_MAX: Duration = Duration::from_millis(50);
/// Doublings of the retry backoff at most.
const BACKOFF_DOUBLINGS_MAX: u32 = 20;

/// How a transaction ended, when it did not commit.
#[derive(Debug)]
enum Failed {
    /// Before EndTxn(commit) went out: the records can never be committed. `ongoing`: the
    /// coordinator may hold an open transaction (AddPartitionsToTxn succeeded).
    BeforeCommit {
        error: anyhow::Error,
        ongoing: bool,
        fenced: bool,
    },
    /// EndTxn(commit) sent, no success answer: committed or not, nobody knows.
    CommitUnknown(anyhow::Error),
}

/// What a coordinator request came back with, when not success.
#[derive(Debug)]
enum CallError {
    /// An error code that is not retriable here.
    Code(i16),
    /// Out of attempts or past the deadline (the last cause attached).
    GaveUp(anyhow::Error),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Code(c) => write!(f, "{}", error_name(*c)),
            CallError::GaveUp(e) => write!(f, "gave up: {e:#}"),
        }
    }
}

/// One batch of a transaction: its partition, records and (once produced) base offset.
struct TxnBatch {
    partition: i32,
    records: Vec<Rec>,
    base_sequence: Sequence,
    base_offset: Option<i64>,
}

/// One transactional producer: call [`TxnProducer::run`] on its own thread.
pub struct TxnProducer {
    cfg: Arc<ProducerConfig>,
    transactional_id: String,
    cluster: Cluster,
    clock: Clock,
    recorder: Arc<Recorder>,
    sink: Arc<dyn AckSink>,
    run_id: u64,
    producer_index: u64,
    producer_id: ProducerId,
    producer_epoch: ProducerEpoch,
    /// InitProducerId is due before the next transaction.
    need_init: bool,
    next_sequence: Vec<Sequence>,
    coordinator: Option<Conn>,
    /// Produce connections per broker id.
    leaders: BTreeMap<i32, Conn>,
    sticky_partition: usize,
    filler: Vec<u8>,
    request: RequestBuf,
    scratch: Vec<u8>,
    stats: ProducerStats,
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

impl TxnProducer {
    /// Sets up transactional producer `producer_index` (transactional id
    /// `PREFIX-index`); it connects and initialises in [`TxnProducer::prepare`], or else
    /// on its first transaction.
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
        let prefix = cfg
            .transactional_id
            .clone()
            .ok_or_else(|| anyhow!("a transactional producer needs a transactional id"))?;
        anyhow::ensure!(cfg.txn_records > 0, "--txn-records must be positive");
        Ok(Self {
            transactional_id: format!("{prefix}-{producer_index}"),
            cfg: Arc::new(cfg),
            sticky_partition: (producer_index as usize) % n,
            next_sequence: vec![Sequence(0); n],
            cluster,
            clock,
            recorder,
            sink,
            run_id,
            producer_index,
            producer_id: ProducerId::NONE,
            producer_epoch: ProducerEpoch(-1),
            need_init: true,
            coordinator: None,
            leaders: BTreeMap::new(),
            filler: (0..65_536u32).map(|i| b'a' + (i % 26) as u8).collect(),
            request: RequestBuf::default(),
            scratch: Vec::new(),
            stats: ProducerStats::default(),
        })
    }

    /// Finds the transaction coordinator, initialises the transactional id and connects to
    /// every partition leader before the schedule starts, so that setup is not charged to
    /// the first transaction's records. A failure is left to the first transaction, which
    /// tries again (and says why); a leader that cannot be reached counts one
    /// `ClientConnectFailed`.
    pub fn prepare(&mut self) {
        if self.need_init
            && let Err(e) = self.init()
        {
            warn(&format!(
                "{}: InitProducerId before the run: {e:#}",
                self.transactional_id
            ));
        }
        let mut brokers = self.cluster.leaders.clone();
        brokers.sort_unstable();
        brokers.dedup();
        for broker in brokers {
            if let Err(e) = self.leader(broker) {
                self.recorder.record_error("ClientConnectFailed", 1);
                warn(&format!(
                    "{}: connecting to broker {broker}: {e:#}",
                    self.transactional_id
                ));
            }
        }
    }

    /// Kafka's request.timeout.ms, the bound on every read of a response.
    fn request_timeout(&self) -> Duration {
        request_timeout(self.cfg.request_timeout_ms)
    }

    /// Counts a failed request on a connection that is then dropped: a response that did
    /// not come within request.timeout.ms (said so in the error returned), or a lost
    /// connection.
    fn connection_failed(&self, e: anyhow::Error) -> anyhow::Error {
        if !conn::is_timeout(&e) {
            self.recorder.record_error("ClientConnectionLost", 1);
            return e;
        }
        self.recorder.record_error("ClientRequestTimeout", 1);
        e.context(format!(
            "no response within request.timeout.ms ({} ms)",
            self.request_timeout().as_millis()
        ))
    }

    /// Runs the schedule to its end (or until `stop`), one transaction at a time.
    pub fn run(mut self, mut pacer: Pacer, stop: &AtomicBool) -> Result<ProducerStats> {
        // Bounded by the schedule: every turn consumes at least one record or ends.
        loop {
            let (batches, more) = self.collect(&mut pacer, stop);
            if !more {
                self.stats.schedule_end_ns = self.clock.now_ns();
            }
            if !batches.is_empty() {
                self.transaction(batches);
            }
            if !more {
                break;
            }
        }
        Ok(self.stats)
    }

    /// Takes up to `txn_records` records from the schedule, split into batches of at most
    /// `batch_size_bytes` per partition. `more` = the schedule is not over.
    fn collect(&mut self, pacer: &mut Pacer, stop: &AtomicBool) -> (Vec<TxnBatch>, bool) {
        let mut batches: Vec<TxnBatch> = Vec::new();
        // Index in `batches` of each partition's open batch.
        let mut open: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
        let value_len = self.cfg.record_size_bytes.max(payload::HEADER_BYTES);
        let n = self.next_sequence.len();
        let mut taken = 0usize;
        while taken < self.cfg.txn_records {
            if stop.load(Ordering::Relaxed) {
                return (batches, false);
            }
            let now = self.clock.now_ns();
            let intended_ns = match pacer.next(now) {
                Next::Done => return (batches, false),
                Next::WaitUntil(t) => {
                    let d = Duration::from_nanos(t.saturating_sub(now)).min(WAIT_MAX);
                    std::thread::sleep(d);
                    continue;
                }
                Next::Due { intended_ns } => intended_ns,
            };
            let seq_no = pacer.issued() - 1;
            let id = (self.producer_index << payload::PRODUCER_SHIFT) | seq_no;
            let stamp = payload::Stamp {
                run_id: self.run_id,
                record_id: id,
                intended_ns,
            };
            let (key, p) = match self.cfg.keys {
                Some(k) => {
                    let key = Bytes::from((seq_no % k.max(1)).to_string());
                    let p = partition_for_key(&key, n);
                    (Some(key), p as i32)
                }
                None => {
                    // Sticky per batch, as the idempotent producer: move on when full.
                    let sp = self.sticky_partition as i32;
                    if open
                        .get(&sp)
                        .is_some_and(|&(_, bytes)| bytes + value_len > self.cfg.batch_size_bytes)
                    {
                        self.sticky_partition = (self.sticky_partition + 1) % n;
                    }
                    (None, self.sticky_partition as i32)
                }
            };
            let size = value_len + key.as_ref().map_or(0, Bytes::len);
            let rec = Rec { stamp, key };
            self.stats.generated += 1;
            taken += 1;
            match open.get_mut(&p) {
                Some((i, bytes)) if *bytes + size <= self.cfg.batch_size_bytes => {
                    *bytes += size;
                    batches[*i].records.push(rec);
                }
                _ => {
                    open.insert(p, (batches.len(), size));
                    batches.push(TxnBatch {
                        partition: p,
                        records: vec![rec],
                        base_sequence: Sequence::NONE,
                        base_offset: None,
                    });
                }
            }
        }
        (batches, true)
    }

    /// One whole transaction; reports its records' fate to the sink.
    fn transaction(&mut self, mut batches: Vec<TxnBatch>) {
        let records: u64 = batches.iter().map(|b| b.records.len() as u64).sum();
        match self.try_transaction(&mut batches) {
            Ok(()) => {
                let now = self.clock.now_ns();
                let rb = self.cfg.record_size_bytes as u64;
                for b in &batches {
                    let intended = b.records.iter().map(|r| r.stamp.intended_ns);
                    self.recorder.record_acks(intended, now, rb);
                    self.sink.acked(b.partition, b.base_offset, &ids(b));
                }
                self.stats.acked += records;
            }
            Err(Failed::BeforeCommit {
                error,
                ongoing,
                fenced,
            }) => {
                warn(&format!(
                    "{}: transaction aborted ({records} records): {error:#}",
                    self.transactional_id
                ));
                // One per transaction (its records are in `failed`).
                self.recorder.record_error("ClientTxnAborted", 1);
                if ongoing && !fenced {
                    // Best effort: InitProducerId resolves it as an abort anyway.
                    if let Err(e) = self.end_txn(false) {
                        warn(&format!("{}: EndTxn(abort): {e}", self.transactional_id));
                    }
                }
                for b in &batches {
                    self.sink.aborted(b.partition, &ids(b));
                }
                self.stats.failed += records;
                self.need_init = true;
                self.refresh_leaders();
            }
            Err(Failed::CommitUnknown(e)) => {
                warn(&format!(
                    "{}: commit outcome unknown ({records} records): {e:#}",
                    self.transactional_id
                ));
                // One per transaction (its records are in `failed`).
                self.recorder.record_error("ClientTxnCommitUnknown", 1);
                for b in &batches {
                    self.sink.failed(b.partition, &ids(b));
                }
                self.stats.failed += records;
                self.need_init = true;
                self.refresh_leaders();
            }
        }
    }

    /// After a failed transaction (a moved leader, a lost connection among the likely
    /// causes), asks for the partition leaders again so the next one does not write to
    /// the old ones. Once per failed transaction: bounded by the schedule, and the next
    /// InitProducerId backs off on its own. A failed refresh keeps the old layout.
    fn refresh_leaders(&mut self) {
        match metadata::refresh(&self.cluster, &self.cfg.topic) {
            Ok(c) => {
                if c.leaders != self.cluster.leaders {
                    self.leaders.clear();
                }
                self.cluster = c;
            }
            Err(e) => {
                self.recorder.record_error("ClientMetadataRefreshFailed", 1);
                warn(&format!(
                    "{}: metadata refresh failed: {e:#}",
                    self.transactional_id
                ));
            }
        }
    }

    fn try_transaction(&mut self, batches: &mut [TxnBatch]) -> Result<(), Failed> {
        let before = |error: anyhow::Error, ongoing: bool| Failed::BeforeCommit {
            error,
            ongoing,
            fenced: false,
        };
        if self.need_init {
            self.init().map_err(|e| before(e, false))?;
        }
        let mut parts: Vec<i32> = batches.iter().map(|b| b.partition).collect();
        parts.sort_unstable();
        parts.dedup();
        match self.add_partitions(&parts) {
            Ok(()) => {}
            Err(CallError::Code(c)) if c == PRODUCER_FENCED || c == INVALID_PRODUCER_EPOCH => {
                return Err(Failed::BeforeCommit {
                    error: anyhow!("AddPartitionsToTxn: {}", error_name(c)),
                    ongoing: false,
                    fenced: true,
                });
            }
            // Some partitions may have been added: abort to be sure.
            Err(e) => return Err(before(anyhow!("AddPartitionsToTxn: {e}"), true)),
        }
        for b in batches.iter_mut() {
            let seq = &mut self.next_sequence[b.partition as usize];
            b.base_sequence = *seq;
            *seq = seq.add_wrapping(b.records.len() as i32);
        }
        let produced = self.produce(batches);
        if produced.is_err() {
            // Responses may still be due on these connections: start clean.
            self.leaders.clear();
        }
        produced.map_err(|e| {
            let fenced = e
                .downcast_ref::<ProduceCode>()
                .is_some_and(|c| c.0 == PRODUCER_FENCED || c.0 == INVALID_PRODUCER_EPOCH);
            Failed::BeforeCommit {
                error: e,
                ongoing: true,
                fenced,
            }
        })?;
        self.end_txn(true)
            .map_err(|e| Failed::CommitUnknown(anyhow!("EndTxn(commit): {e}")))
    }

    /// InitProducerId for the transactional id: a new epoch (the previous one fenced and
    /// its open transaction resolved), sequences from 0.
    fn init(&mut self) -> Result<()> {
        let mut req = InitProducerIdRequest::default();
        req.transactional_id = Some(TransactionalId(sb(&self.transactional_id)));
        req.transaction_timeout_ms = self.cfg.transaction_timeout_ms;
        req.producer_id = kafka_protocol::messages::ProducerId(-1);
        req.producer_epoch = -1;
        let resp = self
            .coordinator_call(&req, api::INIT_PRODUCER_ID, (0, 4), |r| r.error_code)
            .map_err(|e| anyhow!("InitProducerId: {e}"))?;
        // The answer comes from the broker: a missing id is its bug, reported as an
        // error of this transaction (the next one tries again), never a panic here.
        let producer_id = ProducerId(resp.producer_id.0);
        if !producer_id.is_some() {
            bail!("InitProducerId succeeded without a producer id");
        }
        self.producer_id = producer_id;
        self.producer_epoch = ProducerEpoch(resp.producer_epoch);
        self.next_sequence.fill(Sequence(0));
        self.need_init = false;
        Ok(())
    }

    fn add_partitions(&mut self, parts: &[i32]) -> Result<(), CallError> {
        let mut t = AddPartitionsToTxnTopic::default();
        t.name = TopicName(sb(&self.cfg.topic));
        t.partitions = parts.to_vec();
        let mut req = AddPartitionsToTxnRequest::default();
        req.v3_and_below_transactional_id = TransactionalId(sb(&self.transactional_id));
        req.v3_and_below_producer_id = kafka_protocol::messages::ProducerId(self.producer_id.get());
        req.v3_and_below_producer_epoch = self.producer_epoch.get();
        req.v3_and_below_topics = vec![t];
        // The first partition error that is not OPERATION_NOT_ATTEMPTED (55) speaks for all.
        self.coordinator_call(&req, api::ADD_PARTITIONS_TO_TXN, (0, 3), |r| {
            let codes = r
                .results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| &t.results_by_partition)
                .map(|p| p.partition_error_code);
            let mut first = 0;
            for c in codes {
                if c != 0 && (first == 0 || first == 55) {
                    first = c;
                }
            }
            if first == 0 { r.error_code } else { first }
        })
        .map(|_| ())
    }

    fn end_txn(&mut self, commit: bool) -> Result<(), CallError> {
        let mut req = EndTxnRequest::default();
        req.transactional_id = TransactionalId(sb(&self.transactional_id));
        req.producer_id = kafka_protocol::messages::ProducerId(self.producer_id.get());
        req.producer_epoch = self.producer_epoch.get();
        req.committed = commit;
        self.coordinator_call(&req, api::END_TXN, (0, 3), |r| r.error_code)
            .map(|_| ())
    }

    /// Sends `req` to the transaction coordinator until it answers with something other
    /// than a retriable coordinator error, re-finding the coordinator when it moved or the
    /// connection broke; bounded by attempts and the delivery timeout.
    fn coordinator_call<R: Request>(
        &mut self,
        req: &R,
        api_key: i16,
        (lo, hi): (i16, i16),
        code_of: impl Fn(&R::Response) -> i16,
    ) -> Result<R::Response, CallError> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.delivery_timeout_ms);
        let mut last = anyhow!("no attempt");
        for attempt in 1..=COORDINATOR_ATTEMPTS_MAX {
            if Instant::now() >= deadline {
                break;
            }
            if attempt > 1 {
                std::thread::sleep(self.backoff(attempt - 1));
            }
            let conn = match self.coordinator_conn() {
                Ok(c) => c,
                Err(e) => {
                    self.recorder.record_error("ClientCoordinatorNotFound", 1);
                    last = e;
                    continue;
                }
            };
            let answer = conn
                .versions
                .pick(api_key, lo, hi)
                .and_then(|v| conn.call(req, v));
            match answer {
                Ok(resp) => match code_of(&resp) {
                    0 => return Ok(resp),
                    c if RETRIABLE_COORDINATOR.contains(&c) => {
                        self.recorder.record_error(&error_name(c), 1);
                        if c == NOT_COORDINATOR || c == COORDINATOR_NOT_AVAILABLE {
                            self.coordinator = None;
                        }
                        last = anyhow!("{}", error_name(c));
                    }
                    c => {
                        self.recorder.record_error(&error_name(c), 1);
                        return Err(CallError::Code(c));
                    }
                },
                Err(e) => {
                    last = self.connection_failed(e);
                    self.coordinator = None;
                }
            }
        }
        Err(CallError::GaveUp(last))
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let (base, max) = (self.cfg.retry_backoff_ms, self.cfg.retry_backoff_max_ms);
        let doublings = attempt.saturating_sub(1).min(BACKOFF_DOUBLINGS_MAX);
        Duration::from_millis(base.saturating_mul(1 << doublings).min(max.max(base)))
    }

    /// The coordinator's connection, found through any broker (FindCoordinator with
    /// key_type 1: transaction).
    fn coordinator_conn(&mut self) -> Result<&mut Conn> {
        if self.coordinator.is_none() {
            let mut last = anyhow!("no brokers");
            let timeout = self.request_timeout();
            for addr in self.cluster.brokers.values() {
                match find_coordinator(addr, &self.transactional_id, timeout) {
                    Ok(c) => {
                        self.coordinator = Some(c);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            if self.coordinator.is_none() {
                return Err(last);
            }
        }
        self.coordinator
            .as_mut()
            .ok_or_else(|| anyhow!("coordinator connection vanished"))
    }

    /// Writes the transaction's batches to their leaders, at most `max_in_flight`
    /// requests outstanding per broker, one batch per partition per request (in sequence
    /// order). Any error fails the transaction (the caller aborts it).
    fn produce(&mut self, batches: &mut [TxnBatch]) -> Result<()> {
        // Per broker, requests as lists of batch indices.
        let mut queues: BTreeMap<i32, VecDeque<Vec<usize>>> = BTreeMap::new();
        let mut round_of: BTreeMap<i32, usize> = BTreeMap::new();
        for (i, b) in batches.iter().enumerate() {
            let leader = *self
                .cluster
                .leaders
                .get(b.partition as usize)
                .ok_or_else(|| anyhow!("no partition {}", b.partition))?;
            // The k-th batch of a partition goes in the broker's k-th request.
            let k = round_of.entry(b.partition).or_insert(0);
            let q = queues.entry(leader).or_default();
            while q.len() <= *k {
                q.push_back(Vec::new());
            }
            q[*k].push(i);
            *k += 1;
        }
        let window = self.cfg.max_in_flight.max(1);
        let mut in_flight: BTreeMap<i32, VecDeque<(i32, i16, Vec<usize>)>> = BTreeMap::new();
        // Bounded: every turn sends or receives at least one request.
        let total: usize = queues.values().map(VecDeque::len).sum();
        for _ in 0..=2 * total {
            for (&broker, q) in queues.iter_mut() {
                let f = in_flight.entry(broker).or_default();
                while f.len() < window {
                    let Some(req) = q.pop_front() else { break };
                    let (id, v) = self.send_produce(broker, batches, &req)?;
                    f.push_back((id, v, req));
                }
            }
            let mut any = false;
            for (&broker, f) in in_flight.iter_mut() {
                let Some((id, v, req)) = f.pop_front() else {
                    continue;
                };
                any = true;
                self.recv_produce(broker, id, v, batches, &req)?;
            }
            if !any && queues.values().all(VecDeque::is_empty) {
                return Ok(());
            }
        }
        bail!("produce did not finish in its bound of turns")
    }

    fn leader(&mut self, broker: i32) -> Result<&mut Conn> {
        if !self.leaders.contains_key(&broker) {
            let addr = self
                .cluster
                .brokers
                .get(&broker)
                .ok_or_else(|| anyhow!("unknown broker {broker}"))?;
            let c = Conn::connect_timed(addr, request_timeout(self.cfg.request_timeout_ms))?;
            self.leaders.insert(broker, c);
        }
        self.leaders
            .get_mut(&broker)
            .ok_or_else(|| anyhow!("connection vanished"))
    }

    fn send_produce(
        &mut self,
        broker: i32,
        batches: &[TxnBatch],
        req: &[usize],
    ) -> Result<(i32, i16)> {
        let sent = self.try_send_produce(broker, batches, req);
        if sent.is_err() {
            self.leaders.remove(&broker);
            self.stats.reconnects += 1;
            self.recorder.record_error("ClientConnectionLost", 1);
        }
        sent
    }

    fn try_send_produce(
        &mut self,
        broker: i32,
        batches: &[TxnBatch],
        req: &[usize],
    ) -> Result<(i32, i16)> {
        let (version, correlation_id) = {
            let c = self.leader(broker)?;
            (c.versions.pick(api::PRODUCE, 3, 9)?, c.next_id())
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let values = Values {
            size: self.cfg.record_size_bytes,
            filler: &self.filler,
        };
        let mut compressed: Vec<Option<Vec<u8>>> = Vec::with_capacity(req.len());
        for &i in req {
            compressed.push(if self.cfg.compression == Compression::None {
                None
            } else {
                let recs = &batches[i].records;
                let c = produce_wire::compress_records(
                    self.cfg.compression,
                    recs,
                    values,
                    &mut self.scratch,
                )
                .map_err(|e| anyhow!("compressing: {e}"))?;
                Some(c)
            });
        }
        let sources: Vec<(i32, BatchSource<'_>)> = req
            .iter()
            .zip(&compressed)
            .map(|(&i, c)| {
                let b = &batches[i];
                let src = BatchSource {
                    fields: BatchFields {
                        producer_id: self.producer_id,
                        producer_epoch: self.producer_epoch,
                        base_sequence: b.base_sequence,
                        timestamp_ms: ts,
                        compression: self.cfg.compression,
                        transactional: true,
                    },
                    recs: &b.records,
                    compressed: c.as_deref(),
                };
                (b.partition, src)
            })
            .collect();
        let fields = RequestFields {
            version,
            correlation_id,
            acks: self.cfg.acks,
            timeout_ms: self.cfg.request_timeout_ms,
            topic: &self.cfg.topic,
            transactional_id: Some(&self.transactional_id),
        };
        self.request.write(fields, &sources, values);
        let conn = self
            .leaders
            .get_mut(&broker)
            .ok_or_else(|| anyhow!("connection vanished"))?;
        conn.stream
            .write_all(self.request.frame())
            .context("writing produce request")?;
        Ok((correlation_id, version))
    }

    fn recv_produce(
        &mut self,
        broker: i32,
        correlation_id: i32,
        version: i16,
        batches: &mut [TxnBatch],
        req: &[usize],
    ) -> Result<()> {
        let resp = self
            .leader(broker)
            .and_then(|c| c.recv::<ProduceRequest>(version, correlation_id));
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                self.leaders.remove(&broker);
                return Err(self.connection_failed(e));
            }
        };
        let mut codes: BTreeMap<i32, (i16, i64)> = BTreeMap::new();
        for t in &resp.responses {
            for p in &t.partition_responses {
                codes.insert(p.index, (p.error_code, p.base_offset));
            }
        }
        for &i in req {
            let b = &mut batches[i];
            match codes.get(&b.partition) {
                Some(&(0, base)) => b.base_offset = Some(base),
                Some(&(c, _)) => {
                    self.recorder.record_error(&error_name(c), 1);
                    return Err(anyhow::Error::new(ProduceCode(c)))
                        .with_context(|| format!("produce to partition {}", b.partition));
                }
                None => bail!(
                    "partition {} missing from the produce response",
                    b.partition
                ),
            }
        }
        Ok(())
    }
}

/// A Produce error code, so the caller can tell fencing from other errors.
#[derive(Debug)]
struct ProduceCode(i16);

impl std::fmt::Display for ProduceCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", error_name(self.0))
    }
}

impl std::error::Error for ProduceCode {}

fn ids(b: &TxnBatch) -> Vec<u64> {
    b.records.iter().map(|r| r.stamp.record_id).collect()
}

/// request.timeout.ms as a read timeout (the CLI refuses one that is not positive; the
/// connection's default bounds such a one).
fn request_timeout(ms: i32) -> Duration {
    u64::try_from(ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map_or(conn::SOCKET_TIMEOUT, Duration::from_millis)
}

/// FindCoordinator(key_type 1) through `addr`; connects to the coordinator it names. Both
/// connections' reads are bounded by `timeout`.
fn find_coordinator(addr: &str, transactional_id: &str, timeout: Duration) -> Result<Conn> {
    let mut c = Conn::connect_timed(addr, timeout)?;
    let v = c.versions.pick(api::FIND_COORDINATOR, 1, 3)?;
    let mut req = FindCoordinatorRequest::default();
    req.key = sb(transactional_id);
    req.key_type = 1;
    let resp = c.call(&req, v)?;
    if resp.error_code != 0 {
        bail!("FindCoordinator: {}", error_name(resp.error_code));
    }
    Conn::connect_timed(&format!("{}:{}", resp.host.as_str(), resp.port), timeout)
}
