//! One partition replica on its owning shard: the [`Log`], the idempotent producers'
//! state, and the [`ReplicaState`] — role (leader or follower), leader epoch, and a high
//! watermark kept apart from the log end offset — plus the [`Event`] that wakes
//! long-polling fetches and delayed produces when the log or the HW moves.
//!
//! Lives on exactly one shard (`!Send`: `Rc<Log>`, `Cell`s); other shards reach it only
//! through that shard's typed calls (see `shard::mesh`).
//!
//! - [`replica`]: role, epoch, HW, ISR and followers' progress, with their invariants.
//! - `produce`: the leader's append (acks, delayed produce) and the follower's append
//!   that keeps the leader's offsets.
//! - `read`: Fetch for consumers (up to the HW) and followers (up to the LEO),
//!   ListOffsets, DeleteRecords.

pub mod replica;

mod produce;
mod read;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use wire::{LeaderEpoch, NodeId, Offset, WireError};

use crate::errors;
use crate::event::Event;
use crate::producer_state::ProducerStateConfig;
use crate::producer_state::partition::PartitionProducers;
use crate::storage::{Log, LogConfig, StorageError};

pub use produce::{Acks, ProduceOutcome};
pub use read::{FetchOutcome, Isolation, ListedOffset, ReadFor};
use replica::ReplicaState;

/// A partition replica owned by this shard.
pub struct Partition {
    pub topic: Arc<str>,
    pub index: i32,
    pub topic_id: u128,
    /// The merged topic config in force (broker defaults + overrides).
    configs: RefCell<BTreeMap<String, String>>,
    pub log: Rc<Log>,
    /// Idempotent producers' state (dedup, fencing), rebuilt when the log opens.
    pub producers: PartitionProducers,
    /// Role, leader epoch, HW (see [`replica`]).
    replica: RefCell<ReplicaState>,
    /// Notified whenever the log end or the HW moves (wakes long-polling fetches and
    /// delayed acks=all produces).
    pub appended: Event,
    max_message_bytes: Cell<usize>,
    /// The topic's `min.insync.replicas`.
    min_insync: Cell<usize>,
    /// The shard's use clock when a request last took this partition (idle eviction).
    pub last_used: Cell<u64>,
}

fn log_config(configs: &BTreeMap<String, String>) -> Result<LogConfig, StorageError> {
    LogConfig::from_pairs(configs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// The topic's `max.message.bytes` (a batch larger than this is refused).
fn max_message_bytes(configs: &BTreeMap<String, String>) -> usize {
    configs
        .get("max.message.bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::config::MESSAGE_MAX_BYTES_DEFAULT as usize)
}

/// The topic's `min.insync.replicas` (at least 1).
fn min_insync(configs: &BTreeMap<String, String>) -> usize {
    configs
        .get("min.insync.replicas")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1)
}

/// `<data_dir>/<topic>-<partition>`, Kafka's layout.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: i32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

impl Partition {
    /// Opens (and recovers) the partition's log, as its only replica on `local`: leader,
    /// ISR = {local}, HW = LEO (until the cluster assigns it otherwise).
    pub async fn open(
        data_dir: &Path,
        local: NodeId,
        topic: Arc<str>,
        index: i32,
        topic_id: u128,
        configs: BTreeMap<String, String>,
    ) -> Result<Partition, StorageError> {
        let log_config = log_config(&configs)?;
        let dir = partition_dir(data_dir, &topic, index);
        let log = Log::open(dir, log_config).await?;
        let producer_config = ProducerStateConfig::from_configs(&configs);
        let producers =
            PartitionProducers::open(&log, producer_config, crate::shard::now_ms()).await?;
        let leo = log.log_end_offset();
        Ok(Partition {
            topic,
            index,
            topic_id,
            max_message_bytes: Cell::new(max_message_bytes(&configs)),
            min_insync: Cell::new(min_insync(&configs)),
            configs: RefCell::new(configs),
            log: Rc::new(log),
            producers,
            replica: RefCell::new(ReplicaState::sole(local, leo)),
            appended: Event::default(),
            last_used: Cell::new(0),
        })
    }

    /// The merged config in force.
    pub fn configs(&self) -> BTreeMap<String, String> {
        self.configs.borrow().clone()
    }

    /// Applies changed topic configs (AlterConfigs) to the running log.
    pub fn reconfigure(&self, configs: BTreeMap<String, String>) -> Result<(), StorageError> {
        self.log.set_config(log_config(&configs)?);
        self.max_message_bytes.set(max_message_bytes(&configs));
        self.min_insync.set(min_insync(&configs));
        *self.configs.borrow_mut() = configs;
        Ok(())
    }

    /// The largest batch an append may carry (the topic's `max.message.bytes`).
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.get()
    }

    pub fn high_watermark(&self) -> Offset {
        self.replica.borrow().high_watermark()
    }

    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.replica.borrow().leader_epoch()
    }

    /// The replica state, to read (role, ISR size, leader).
    pub fn replica(&self) -> std::cell::Ref<'_, ReplicaState> {
        self.replica.borrow()
    }

    /// Changes the replica state (the controller's become-leader / become-follower) and
    /// wakes everything waiting on the partition, which re-checks its role.
    pub fn update_replica(&self, change: impl FnOnce(&mut ReplicaState)) {
        change(&mut self.replica.borrow_mut());
        self.appended.notify_all();
    }

    /// An append ending at `end` completed: the HW follows where the ISR allows. Not the
    /// log's end offset, which counts appends still being written.
    fn log_grew(&self, end: Offset) {
        self.replica.borrow_mut().local_log_end(end);
        self.appended.notify_all();
    }
}

/// The Kafka error a produce gets for a batch `wire` rejected.
pub fn wire_error_code(e: &WireError) -> i16 {
    match e {
        WireError::CrcMismatch { .. } | WireError::UnexpectedEof { .. } => errors::CORRUPT_MESSAGE,
        _ => errors::INVALID_RECORD,
    }
}

/// The Kafka error for a storage failure.
pub fn storage_error_code(e: &StorageError) -> i16 {
    match e {
        StorageError::OffsetOutOfRange { .. } => errors::OFFSET_OUT_OF_RANGE,
        StorageError::InvalidBatch { .. } => errors::CORRUPT_MESSAGE,
        StorageError::RecordSetTooLarge { .. } => errors::RECORD_LIST_TOO_LARGE,
        StorageError::Closed { .. } => errors::NOT_LEADER_OR_FOLLOWER,
        _ => errors::KAFKA_STORAGE_ERROR,
    }
}
