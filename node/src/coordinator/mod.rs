//! What the coordinators (group: `crate::group`, transaction: `crate::txn`) share: the
//! host of their internal topic's partitions on a shard — each partition served only while
//! this node leads it: opened and replayed once per leadership, concurrent users waiting
//! for that replay, forgotten when the leadership is lost ([`PartitionLoads`]) — and the
//! coordinator's appends to them: records packed into batches within the topic's limits,
//! appended back to back and acknowledged once replicated (acks=all: the HW covers them,
//! with the topic's `min.insync.replicas`; [`append_contiguous`], [`await_replicated`]),
//! the replay read loop ([`replay_batches`]) and Kafka's mapping of append errors to the
//! coordinator APIs' codes ([`WriteKind::code`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::rc::Rc;

use bytes::Bytes;

use wire::batch::{BatchBuilder, NewRecord, split_batches};

use wire::{LeaderEpoch, Offset};

use crate::event::Event;
use crate::partition::{Acks, Partition};
use crate::shard::context::ServiceContext;
use crate::shard::now_ms;

/// Bytes asked of the log per read during replay.
const REPLAY_READ_BYTES: usize = 1 << 20;

mod codes {
    pub use crate::errors::{
        KAFKA_STORAGE_ERROR, MESSAGE_TOO_LARGE, NONE, NOT_COORDINATOR, NOT_ENOUGH_REPLICAS,
        NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER, RECORD_LIST_TOO_LARGE,
        REQUEST_TIMED_OUT, UNKNOWN_SERVER_ERROR, UNKNOWN_TOPIC_OR_PARTITION,
    };
    pub const INVALID_FETCH_SIZE: i16 = 4;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
}

/// Whether `topic` is a coordinator's internal topic (its replicas' role changes load or
/// unload a coordinator).
pub fn is_coordinator_topic(topic: &str) -> bool {
    topic == crate::group::OFFSETS_TOPIC || topic == crate::txn::TXN_TOPIC
}

/// The open replica `tp` of an internal topic if this node leads it, with the leader
/// epoch it leads under: a coordinator serves only the partitions its node leads (a
/// follower's copy is the replication fetchers' to write). NOT_COORDINATOR otherwise.
pub async fn open_led(
    ctx: &ServiceContext<'_>,
    tp: &crate::shard::TopicPartition,
) -> Result<(Rc<Partition>, LeaderEpoch), i16> {
    let part = ctx.partition(tp).await.map_err(|code| match code {
        codes::NOT_LEADER_OR_FOLLOWER => codes::NOT_COORDINATOR,
        _ => codes::COORDINATOR_NOT_AVAILABLE,
    })?;
    let epoch = {
        let r = part.replica();
        if !r.is_leader() || part.leads_without_acknowledged() {
            return Err(codes::NOT_COORDINATOR);
        }
        r.leader_epoch()
    };
    Ok((part, epoch))
}

/// A loaded internal-topic partition with the leader epoch its coordinator state was
/// loaded under. Everything a coordinator writes goes through one of these: a write is
/// refused (NOT_LEADER_OR_FOLLOWER) once that leadership ended, even if this node leads
/// again under a newer epoch — the state loaded then may differ from what the writing
/// task saw (Kafka fences coordinator work by its coordinator epoch the same way).
#[derive(Clone)]
pub struct Led {
    part: Rc<Partition>,
    epoch: LeaderEpoch,
}

impl Led {
    /// The leader epoch the state was loaded under.
    pub fn epoch(&self) -> LeaderEpoch {
        self.epoch
    }

    /// Whether this node still leads the partition under that epoch.
    pub fn leads(&self) -> bool {
        self.part.leads_under(self.epoch)
    }
}

impl std::ops::Deref for Led {
    type Target = Partition;

    fn deref(&self) -> &Partition {
        &self.part
    }
}

/// The internal-topic partitions a coordinator has loaded on this shard, by index, each
/// with the leader epoch it was loaded under.
#[derive(Default)]
pub struct PartitionLoads {
    loaded: RefCell<BTreeMap<i32, (Rc<Partition>, LeaderEpoch)>>,
    /// Partitions being replayed right now (others wait for the replay).
    loading: RefCell<HashMap<i32, Rc<Event>>>,
}

impl PartitionLoads {
    /// The loaded partition `index` while this node still leads it under the epoch it was
    /// loaded at (else its coordinator must unload it: see [`Self::stale`]).
    pub fn get(&self, index: i32) -> Option<Led> {
        let loaded = self.loaded.borrow();
        let (part, epoch) = loaded.get(&index)?;
        let led = Led {
            part: part.clone(),
            epoch: *epoch,
        };
        led.leads().then_some(led)
    }

    /// Every loaded partition this node still leads.
    pub fn all(&self) -> Vec<(i32, Led)> {
        let loaded = self.loaded.borrow();
        let led = loaded.iter().map(|(i, (part, epoch))| {
            let led = Led {
                part: part.clone(),
                epoch: *epoch,
            };
            (*i, led)
        });
        led.filter(|(_, led)| led.leads()).collect()
    }

    /// Whether partition `index` is loaded (led or not) or being loaded.
    pub fn is_loaded(&self, index: i32) -> bool {
        self.loaded.borrow().contains_key(&index) || self.loading.borrow().contains_key(&index)
    }

    /// Loaded partitions this node no longer leads under the epoch they were loaded at
    /// (it follows now, or it lost and regained the lead: the log may have been truncated
    /// meanwhile). Their coordinator drops their state and calls [`Self::unload`].
    pub fn stale(&self) -> Vec<i32> {
        self.loaded
            .borrow()
            .iter()
            .filter(|(_, (p, epoch))| !p.leads_under(*epoch))
            .map(|(i, _)| *i)
            .collect()
    }

    /// Forgets partition `index` (its coordinator dropped the state it held).
    pub fn unload(&self, index: i32) {
        self.loaded.borrow_mut().remove(&index);
    }

    /// The loaded partition `index`; the first caller runs `replay` (which opens it if
    /// this node leads it, and replays it; see [`open_led`]), later ones wait for that
    /// replay to end. A replay that failed leaves it unloaded (the next caller tries
    /// again); its waiters get COORDINATOR_LOAD_IN_PROGRESS and retry. A partition loaded
    /// under an older leadership must have been unloaded first.
    pub async fn load<F, Fut>(&self, index: i32, replay: F) -> Result<Led, i16>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(Rc<Partition>, LeaderEpoch), i16>>,
    {
        if let Some(p) = self.get(index) {
            return Ok(p);
        }
        if self.loaded.borrow().contains_key(&index) {
            // Loaded under a leadership that ended: its coordinator unloads it first.
            return Err(codes::NOT_COORDINATOR);
        }
        let waiting = self.loading.borrow().get(&index).cloned();
        if let Some(ev) = waiting {
            ev.listen().await;
            return self.get(index).ok_or(codes::COORDINATOR_LOAD_IN_PROGRESS);
        }
        let ev = Rc::new(Event::default());
        self.loading.borrow_mut().insert(index, ev.clone());
        let result = replay().await;
        let result = result.map(|(part, epoch)| {
            self.loaded
                .borrow_mut()
                .insert(index, (part.clone(), epoch));
            Led { part, epoch }
        });
        self.loading.borrow_mut().remove(&index);
        ev.notify_all();
        result
    }
}

/// Which coordinator write failed: each maps an append's error to its API's code as
/// Kafka's `GroupMetadataManager` (offsets, group metadata) and
/// `TransactionStateManager` (transaction state) do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// OffsetCommit / TxnOffsetCommit.
    Offsets,
    /// A group's metadata (JoinGroup / SyncGroup / LeaveGroup) and tombstones.
    GroupMetadata,
    /// A transactional id's state.
    TxnState,
}

impl WriteKind {
    /// The code the client gets for an append that failed with `append_error`.
    pub fn code(self, append_error: i16) -> i16 {
        match append_error {
            codes::NONE => codes::NONE,
            codes::UNKNOWN_TOPIC_OR_PARTITION
            | codes::NOT_ENOUGH_REPLICAS
            | codes::NOT_ENOUGH_REPLICAS_AFTER_APPEND => codes::COORDINATOR_NOT_AVAILABLE,
            codes::NOT_LEADER_OR_FOLLOWER | codes::KAFKA_STORAGE_ERROR => codes::NOT_COORDINATOR,
            codes::REQUEST_TIMED_OUT => match self {
                WriteKind::Offsets => codes::REQUEST_TIMED_OUT,
                WriteKind::GroupMetadata => codes::REBALANCE_IN_PROGRESS,
                // The client retries: the state may or may not be replicated yet.
                WriteKind::TxnState => codes::COORDINATOR_NOT_AVAILABLE,
            },
            codes::MESSAGE_TOO_LARGE | codes::RECORD_LIST_TOO_LARGE | codes::INVALID_FETCH_SIZE => {
                match self {
                    WriteKind::Offsets => codes::INVALID_COMMIT_OFFSET_SIZE,
                    _ => codes::UNKNOWN_SERVER_ERROR,
                }
            }
            other => other,
        }
    }
}

/// Feeds every batch of `part` from its log start to its log end to `f`, in offset
/// order. Returns how many batches were read.
///
/// To the log end, not the HW, as Kafka's load does: a new leader's HW may lag what it
/// holds (it learns the HW from the old leader's next fetch answer, which never came), and
/// every record in a leader's log stays (followers truncate to the leader), so commits the
/// old coordinator acknowledged are all here even while the HW has not caught up.
pub async fn replay_batches(
    part: &Partition,
    mut f: impl FnMut(Bytes) -> Result<(), i16>,
) -> Result<u64, i16> {
    // Completed writes only: an append still in flight is not in the log yet.
    let end = part.replica().log_end();
    let mut offset = part.log.log_start_offset();
    let mut batches = 0u64;
    // Every read moves `offset` forward by at least one batch; bound the loop anyway.
    let mut reads_left = end.get().saturating_sub(offset.get()).max(0) + 1;
    while offset < end && reads_left > 0 {
        reads_left -= 1;
        let read = part
            .log
            .read_within(offset, REPLAY_READ_BYTES, usize::MAX, end)
            .await;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::error!(
                    topic = %part.topic,
                    partition = part.index,
                    offset = %offset,
                    "replay read failed: {e}"
                );
                return Err(codes::COORDINATOR_NOT_AVAILABLE);
            }
        };
        if read.batches.is_empty() {
            break;
        }
        for chunk in read.batches {
            for range in split_batches(&chunk) {
                let range = range.map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
                let batch = chunk.slice(range);
                let header = wire::batch::read_header(&batch)
                    .map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
                offset = offset.max(header.next_offset());
                batches += 1;
                f(batch)?;
            }
        }
    }
    Ok(batches)
}

/// The coordinator's own appends are acknowledged once replicated, as Kafka's are
/// (`requiredAcks = -1`): the HW covers them, with at least the topic's
/// `min.insync.replicas` in the ISR (else NOT_ENOUGH_REPLICAS before appending,
/// NOT_ENOUGH_REPLICAS_AFTER_APPEND after). On a single node the ISR is this node.
const COORDINATOR_ACKS: Acks = Acks::All;
/// How long a coordinator append may wait to be replicated before it is answered
/// REQUEST_TIMED_OUT (Kafka: the request timeout, 30 s).
const COORDINATOR_APPEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn far_deadline() -> std::time::Instant {
    std::time::Instant::now() + COORDINATOR_APPEND_TIMEOUT
}

/// Waits (acks=all) until the HW of `part` reaches `end` while this node leads under
/// `epoch`, at most [`COORDINATOR_APPEND_TIMEOUT`] (`Partition::await_replicated`). For
/// appends answered at the local write (a transactional offset commit, a marker).
pub async fn await_replicated(part: &Partition, epoch: LeaderEpoch, end: Offset) -> i16 {
    part.await_replicated(epoch, end, COORDINATOR_APPEND_TIMEOUT)
        .await
}

/// Refuses an acks=all write before it is appended while the ISR is below the topic's
/// `min.insync.replicas` (Kafka: NOT_ENOUGH_REPLICAS, nothing written).
pub fn check_insync(part: &Partition) -> Result<(), i16> {
    if part.replica().isr_len() < part.min_insync_replicas() {
        return Err(codes::NOT_ENOUGH_REPLICAS);
    }
    Ok(())
}

/// Most bytes one record adds to a v2 batch besides its key and value bytes: length,
/// attributes, timestamp and offset deltas, key and value lengths (varints at their
/// widest), header count.
const RECORD_OVERHEAD_MAX: usize = 5 + 1 + 10 + 5 + 5 + 5 + 1;
/// A v2 batch header (Kafka's `RECORD_BATCH_OVERHEAD`).
const BATCH_HEADER_BYTES: usize = 61;

/// The largest batch the coordinator appends to `part`: the topic's `max.message.bytes`
/// (the log refuses larger ones), and never more than one segment holds.
pub fn batch_bytes_max(part: &Partition) -> usize {
    let segment = usize::try_from(part.log.config().segment_bytes).unwrap_or(usize::MAX);
    part.max_message_bytes().min(segment)
}

/// Packs `(key, value)` records (a `None` value is a tombstone), in order, into batches
/// of at most `max_bytes` each. A record too large for a batch of its own is
/// MESSAGE_TOO_LARGE.
pub fn build_batches(
    records: Vec<(Bytes, Option<Bytes>)>,
    max_bytes: usize,
    now: i64,
) -> Result<Vec<Bytes>, i16> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut estimate = BATCH_HEADER_BYTES;
    for (key, value) in records {
        let size = key.len() + value.as_ref().map_or(0, Bytes::len) + RECORD_OVERHEAD_MAX;
        if !batch.is_empty() && estimate + size > max_bytes {
            out.push(build_batch(std::mem::take(&mut batch), max_bytes)?);
            estimate = BATCH_HEADER_BYTES;
        }
        estimate += size;
        batch.push(NewRecord {
            timestamp_ms: now,
            key: Some(key),
            value,
            headers: Vec::new(),
        });
    }
    if !batch.is_empty() {
        out.push(build_batch(batch, max_bytes)?);
    }
    Ok(out)
}

/// One batch of `records`; MESSAGE_TOO_LARGE if it comes out above `max_bytes`.
pub fn build_batch(records: Vec<NewRecord>, max_bytes: usize) -> Result<Bytes, i16> {
    let batch = BatchBuilder {
        records,
        ..BatchBuilder::default()
    }
    .build()
    .map_err(|_| codes::UNKNOWN_SERVER_ERROR)?;
    if batch.len() > max_bytes {
        return Err(crate::errors::MESSAGE_TOO_LARGE);
    }
    Ok(batch)
}

/// Appends `batches` back to back — no other append of this shard lands between them —
/// and waits until all are replicated (acks=all, see [`COORDINATOR_ACKS`]), while this
/// node leads `part` under the epoch its state was loaded at (else NOT_LEADER_OR_FOLLOWER,
/// before appending or while waiting). Returns the offset of the first record; errors
/// are the append's (callers map them with [`WriteKind::code`]).
///
/// The log assigns an append's offsets in the append's first poll (its contract, see
/// `storage::Log::append`), and every first poll runs here before this task yields. An
/// append that did not take its offsets at once stops the rest (never out of order).
pub async fn append_contiguous(part: &Led, batches: Vec<Bytes>) -> Result<i64, i16> {
    let now = now_ms();
    let epoch = part.epoch();
    // A rebuild after a cut of the log would park the first polls below.
    part.rebuild_producers().await?;
    if !part.leads() {
        return Err(codes::NOT_LEADER_OR_FOLLOWER);
    }
    let first = part.log.log_end_offset().get();
    let mut waiting = Vec::with_capacity(batches.len());
    for batch in batches {
        let before = part.log.log_end_offset();
        let mut append =
            Box::pin(part.produce(batch.into(), COORDINATOR_ACKS, far_deadline(), now));
        match futures_lite::future::poll_once(&mut append).await {
            Some(out) if out.error != codes::NONE => return Err(out.error),
            Some(_) => {}
            None if part.log.log_end_offset() > before => waiting.push(append),
            None => {
                tracing::error!(partition = part.index, "append did not take its offsets");
                return Err(codes::UNKNOWN_SERVER_ERROR);
            }
        }
    }
    let all = async {
        for append in waiting {
            let out = append.await;
            if out.error != codes::NONE {
                return Err(out.error);
            }
        }
        Ok(())
    };
    part.while_leading(epoch, all).await??;
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_errors_map_as_kafka_maps_them() {
        use WriteKind::*;
        for kind in [Offsets, GroupMetadata, TxnState] {
            assert_eq!(kind.code(codes::NONE), codes::NONE);
            assert_eq!(
                kind.code(codes::NOT_ENOUGH_REPLICAS),
                codes::COORDINATOR_NOT_AVAILABLE
            );
            assert_eq!(
                kind.code(codes::NOT_ENOUGH_REPLICAS_AFTER_APPEND),
                codes::COORDINATOR_NOT_AVAILABLE
            );
            assert_eq!(
                kind.code(codes::NOT_LEADER_OR_FOLLOWER),
                codes::NOT_COORDINATOR
            );
            assert_eq!(
                kind.code(codes::KAFKA_STORAGE_ERROR),
                codes::NOT_COORDINATOR
            );
        }
        assert_eq!(
            Offsets.code(codes::MESSAGE_TOO_LARGE),
            codes::INVALID_COMMIT_OFFSET_SIZE
        );
        assert_eq!(
            TxnState.code(codes::MESSAGE_TOO_LARGE),
            codes::UNKNOWN_SERVER_ERROR
        );
        assert_eq!(
            Offsets.code(codes::REQUEST_TIMED_OUT),
            codes::REQUEST_TIMED_OUT
        );
        assert_eq!(
            GroupMetadata.code(codes::REQUEST_TIMED_OUT),
            codes::REBALANCE_IN_PROGRESS
        );
        assert_eq!(
            TxnState.code(codes::REQUEST_TIMED_OUT),
            codes::COORDINATOR_NOT_AVAILABLE
        );
    }

    /// Partition 0 of `__transaction_state` in `data`, led by node 1 under epoch 1 with
    /// `replicas`, loaded into `loads`: the partition and its `Led`.
    async fn led_txn_partition(
        data: &std::path::Path,
        configs: BTreeMap<String, String>,
        replicas: &[wire::NodeId],
        loads: &PartitionLoads,
    ) -> (Rc<Partition>, Led) {
        let with = crate::partition::OpenWith {
            disk: crate::storage::Disk::Real,
            lead_epoch: Some(LeaderEpoch(1)),
        };
        let topic = std::sync::Arc::from(crate::txn::TXN_TOPIC);
        let me = wire::NodeId(1);
        let part = Partition::open_on(data, me, topic, 0, 7, configs, with);
        let part = Rc::new(part.await.expect("open"));
        part.update_replica(|r| r.become_leader(LeaderEpoch(1), vec![me], replicas));
        let led = loads.load(0, || async { Ok((part.clone(), LeaderEpoch(1))) });
        (part.clone(), led.await.expect("loaded"))
    }

    /// A coordinator task that outlived its leadership writes nothing, even once this
    /// node leads the partition again: the state loaded under the newer epoch may have
    /// moved on (another node's coordinator finished what the task was doing, and the
    /// producer began anew), and the task's write would overwrite it.
    #[test]
    fn a_write_loaded_under_an_ended_leadership_is_refused_after_the_node_leads_again() {
        use wire::NodeId;
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let seen = crate::storage::testing::run_on_shard(move || async move {
            let (me, other) = (NodeId(1), NodeId(2));
            let loads = PartitionLoads::default();
            let (part, led) = led_txn_partition(&data, BTreeMap::new(), &[me, other], &loads).await;
            let record = || build_batch(vec![NewRecord::value(0, "v")], 1 << 20);
            let wrote = append_contiguous(&led, vec![record().expect("batch")]).await;

            part.update_replica(|r| r.become_follower(other, LeaderEpoch(2)));
            part.update_replica(|r| r.become_leader(LeaderEpoch(3), vec![me], &[me, other]));
            let late = append_contiguous(&led, vec![record().expect("batch")]).await;
            (
                wrote,
                late,
                loads.get(0).is_none(),
                loads.stale(),
                part.log.log_end_offset(),
            )
        });
        let (wrote, late, unserved, stale, end) = seen;
        assert_eq!(wrote, Ok(0));
        assert_eq!(late, Err(codes::NOT_LEADER_OR_FOLLOWER));
        assert!(unserved, "the old load is not served under the new epoch");
        assert_eq!(stale, vec![0], "its coordinator must reload it");
        assert_eq!(end, wire::Offset(1), "nothing appended by the late write");
    }

    /// A coordinator write right after a cut of its partition's log (an out-of-space
    /// rollback) waits for the producer state's rebuild before its first poll, which
    /// must take offsets: a rebuild parked there was dropped mid-way and left every
    /// later append of the partition waiting for it.
    #[test]
    fn a_coordinator_write_after_a_cut_waits_for_the_rebuild_and_later_appends_go_on() {
        use wire::NodeId;
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let seen = crate::storage::testing::run_on_shard(move || async move {
            crate::storage::prime_dma_probe(&data).await.expect("probe");
            // Reads of the replay come from the disk, not the tail cache: the rebuild
            // really waits.
            let configs = BTreeMap::from([("tail.cache.bytes".to_string(), "1".to_string())]);
            let loads = PartitionLoads::default();
            let (part, led) = led_txn_partition(&data, configs, &[NodeId(1)], &loads).await;
            let record = || build_batch(vec![NewRecord::value(0, "v")], 1 << 20);
            for _ in 0..20 {
                let wrote = append_contiguous(&led, vec![record().expect("batch")]).await;
                assert!(wrote.is_ok(), "{wrote:?}");
            }
            part.log.truncate_to(wire::Offset(15)).await.expect("cut");
            let first = append_contiguous(&led, vec![record().expect("batch")]).await;
            let second = append_contiguous(&led, vec![record().expect("batch")]).await;
            (first, second, part.log.log_end_offset())
        });
        assert_eq!(seen, (Ok(15), Ok(16), wire::Offset(17)));
    }
}
