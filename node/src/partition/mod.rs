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
use crate::send_turns::SendTurns;
use crate::storage::epochs::LeaderEpochCache;
use crate::storage::{Log, LogConfig, StorageError};

pub use produce::{
    Acks, COMPRESSION_LEVEL_DEFAULTS, ProduceOutcome, TopicCompression, compression_level_valid,
};
pub use read::{FetchOutcome, Isolation, ListedOffset, Lister, ReadFor};
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
    /// Where each leader epoch starts in the log (`leader-epoch-checkpoint`).
    epochs: RefCell<LeaderEpochCache>,
    /// Notified whenever the log end or the HW moves (wakes long-polling fetches and
    /// delayed acks=all produces).
    pub appended: Event,
    /// Notified when a follower's fetch reports another log start (wakes DeleteRecords
    /// waiting for the low watermark).
    pub log_starts_moved: Event,
    /// On a leader: when each follower's last fetch was answered with records (its next
    /// fetch closes the turnaround, `weir_follower_fetch_turnaround_seconds`).
    follower_answered: RefCell<BTreeMap<NodeId, std::time::Instant>>,
    /// A follower's truncation (or restart) is under way: set before its first await, so
    /// a replica an assignment makes leader meanwhile neither appends nor serves reads
    /// until the cut is done (Kafka serialises the two with `leaderIsrUpdateLock`).
    /// Otherwise an acks=1 append could be written and acknowledged, then cut, and
    /// followers could fetch, and move the HW over, records about to be cut.
    truncating: Cell<u32>,
    max_message_bytes: Cell<usize>,
    /// The topic's `min.insync.replicas`.
    min_insync: Cell<usize>,
    /// `cleanup.policy` includes compact: records without a key are refused.
    compacted: Cell<bool>,
    /// The topic's `compression.type`: the codec clients' batches are stored in.
    compression: Cell<TopicCompression>,
    /// The topic's `compression.gzip.level` and `compression.zstd.level` (KIP-390): what
    /// a batch rewritten into that codec is compressed at.
    compression_levels: Cell<wire::batch::Levels>,
    /// The shard's use clock when a request last took this partition (idle eviction).
    pub last_used: Cell<u64>,
    /// The checkpointed HW, while the log ends below it: it reopened without records this
    /// replica acknowledged (a power failure took the unsynced tail). As leader with
    /// another ISR member it fences its epoch and resigns
    /// ([`Partition::fence_if_lost`]); it is reported to the HW checkpoint instead of
    /// the current HW, so an eviction or a restart before the resignation does not forget
    /// it. Cleared once the log reaches it again, or when this replica leads alone.
    lost_hw: Cell<Option<Offset>>,
    /// This open created the partition's directory: no record of it can have been
    /// acknowledged here, whatever a checkpoint left by a deleted topic of the same name
    /// says.
    created: bool,
    /// A producer's transactional batches take turns here, in arrival order, from before
    /// the KIP-890 check (an await on the coordinator, maybe on another node) until
    /// their idempotence check ran: its pipelined batches then append in order. One
    /// queue per producer with batches in flight (other producers do not wait), removed
    /// by the last [`TxnTurns`] of it.
    txn_turns: RefCell<std::collections::HashMap<wire::ProducerId, Rc<SendTurns>>>,
}

/// A batch's place among its producer's transactional batches of one partition (see
/// `Partition::txn_turns`); dropping the last one of a producer removes its queue.
pub struct TxnTurns<'a> {
    partition: &'a Partition,
    producer: wire::ProducerId,
    pub turns: Rc<SendTurns>,
}

impl Drop for TxnTurns<'_> {
    fn drop(&mut self) {
        let mut all = self.partition.txn_turns.borrow_mut();
        // The map's reference and this one: nobody else of this producer is in flight.
        if Rc::strong_count(&self.turns) <= 2 {
            all.remove(&self.producer);
        }
    }
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

/// The topic's `compression.type`; `producer` (Kafka's default) if unset. Values were
/// checked when set (CreateTopics, AlterConfigs, the broker's config at startup).
fn compression(configs: &BTreeMap<String, String>) -> TopicCompression {
    configs
        .get("compression.type")
        .and_then(|v| TopicCompression::parse(v))
        .unwrap_or_default()
}

/// The topic's compression levels (KIP-390); each codec's default where unset or -1
/// (Kafka's "the codec's default" for gzip). Values were checked when set.
fn compression_levels(configs: &BTreeMap<String, String>) -> wire::batch::Levels {
    let mut levels = wire::batch::Levels::default();
    if let Some(l) = configs
        .get(produce::GZIP_LEVEL)
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        levels.gzip = l;
    }
    if let Some(l) = configs
        .get(produce::ZSTD_LEVEL)
        .and_then(|v| v.trim().parse::<i32>().ok())
    {
        levels.zstd = l;
    }
    levels
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

/// Kafka's `partition.metadata` in a partition directory (KIP-516): the topic id, so a
/// log dir read by Kafka's tools names its topic by id as Kafka would.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

/// Kafka's text for `partition.metadata`: version 0 and the id as Kafka prints a Uuid
/// (URL-safe base64 of its 16 bytes, no padding).
pub fn partition_metadata_text(topic_id: u128) -> String {
    use base64::Engine as _;
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(topic_id.to_be_bytes());
    format!("version: 0\ntopic_id: {id}\n")
}

/// How [`Partition::open_on`] opens: on which disk, and the leader epoch the replica
/// will append under if it leads (written into a new log's `leader-epoch-checkpoint`
/// while its directory is created, see [`create_if_new`]).
#[derive(Clone, Default)]
pub struct OpenWith {
    pub disk: crate::storage::Disk,
    pub lead_epoch: Option<LeaderEpoch>,
}

impl From<crate::storage::Disk> for OpenWith {
    fn from(disk: crate::storage::Disk) -> OpenWith {
        OpenWith {
            disk,
            lead_epoch: None,
        }
    }
}

/// Creates a new partition's directory with its metadata files, in glommio's blocking
/// pool: `partition.metadata` and, for a replica that will lead under `lead_epoch`, a
/// `leader-epoch-checkpoint` starting that epoch at offset 0 (an atomic write with two
/// fsyncs), so that the first append does not write it on the shard's thread. On ext4
/// this work took ~2.4 ms per partition, during which the shard answered nothing (a
/// producer's first write to 1,000 new partitions stopped it for 1.5–2.5 s).
/// `partition.metadata` is replaced without fsyncs: every open checks it and rewrites it
/// if it is missing or wrong, and the pool's fsyncs, one after another, set how fast
/// partitions are created. Returns the epoch cache of the new log, or `None` if the
/// directory already exists (the log is opened as before). A crash part-way leaves a
/// directory without some of the files: it then opens as an existing one, which writes
/// `partition.metadata` and starts its epochs at the first append, as a directory from
/// before these files would.
async fn create_if_new(
    dir: PathBuf,
    topic_id: u128,
    lead_epoch: Option<LeaderEpoch>,
) -> Result<Option<LeaderEpochCache>, StorageError> {
    glommio::executor()
        .spawn_blocking(move || {
            set_aside_if_stray(&dir, topic_id)?;
            match std::fs::symlink_metadata(&dir) {
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("stat", &dir, e)),
            }
            std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("create dir", &dir, e))?;
            if topic_id != 0 {
                let path = dir.join(PARTITION_METADATA_FILE);
                let text = partition_metadata_text(topic_id);
                crate::storage::replace_unsynced(&path, text.as_bytes())?;
            }
            let mut epochs = LeaderEpochCache::load(&dir)?;
            if let Some(epoch) = lead_epoch {
                epochs.assign(epoch, Offset(0))?;
            }
            Ok(Some(epochs))
        })
        .await
}

/// Sets aside a directory that a deleted incarnation of the topic left: its
/// `partition.metadata` names another topic id, because this node was down while the
/// topic was deleted and created again under the same name. Opened, it would serve the
/// old records at the new topic's offsets. It is renamed `<dir>.<old id>.<unix ms>-stray`
/// (Kafka's name for a stray log; nothing reads it again, an operator may delete it), and the
/// partition starts empty. A `partition.metadata` that names no id is left to
/// [`write_partition_metadata`].
fn set_aside_if_stray(dir: &Path, topic_id: u128) -> Result<(), StorageError> {
    if topic_id == 0 {
        return Ok(());
    }
    let path = dir.join(PARTITION_METADATA_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let Some((old_id, text_id)) = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("topic_id:"))
        .map(str::trim)
        .and_then(|id| Some((parse_topic_id(id)?, id)))
    else {
        return Ok(());
    };
    if old_id == topic_id {
        return Ok(());
    }
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    // Unique, as Kafka's random suffix is: a name set aside before is never replaced.
    let now_ms = crate::shard::now_ms();
    let aside = dir.with_file_name(format!("{name}.{text_id}.{now_ms}-stray"));
    tracing::warn!(dir = %dir.display(), aside = %aside.display(), old_topic_id = text_id, "a deleted topic's partition directory, left while this node was down, is set aside: the new topic of that name starts empty here");
    std::fs::rename(dir, &aside).map_err(|e| StorageError::io("rename", dir, e))?;
    if let Some(parent) = dir.parent() {
        crate::storage::sync_dir(parent)?;
    }
    Ok(())
}

/// A topic id as `partition.metadata` writes it (URL-safe base64 of 16 bytes, no
/// padding); `None` if it is not one.
fn parse_topic_id(text: &str) -> Option<u128> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    Some(u128::from_be_bytes(bytes.try_into().ok()?))
}

/// Loads an existing log's epoch cache and checks its `partition.metadata`, in glommio's
/// blocking pool (both may rewrite a file with fsyncs): see [`open_epochs`].
async fn open_existing_files(
    dir: PathBuf,
    topic_id: u128,
    (start, end): (Offset, Offset),
) -> Result<LeaderEpochCache, StorageError> {
    glommio::executor()
        .spawn_blocking(move || {
            write_partition_metadata(&dir, topic_id)?;
            open_epochs(&dir, start, end)
        })
        .await
}

/// Writes `partition.metadata` unless it already holds this id (one small atomic write
/// when a partition is first opened, or its directory predates the file).
fn write_partition_metadata(dir: &Path, topic_id: u128) -> Result<(), StorageError> {
    if topic_id == 0 {
        return Ok(());
    }
    let path = dir.join(PARTITION_METADATA_FILE);
    let text = partition_metadata_text(topic_id);
    match std::fs::read(&path) {
        Ok(old) if old == text.as_bytes() => Ok(()),
        // Created without an fsync (see `create_if_new`): a crash can leave it empty.
        Ok(old) if old.is_empty() => crate::storage::write_atomic(&path, text.as_bytes()),
        Ok(_) => {
            tracing::warn!(path = %path.display(), "partition.metadata names another topic id: rewritten");
            crate::storage::write_atomic(&path, text.as_bytes())
        }
        Err(_) => crate::storage::write_atomic(&path, text.as_bytes()),
    }
}

impl Partition {
    /// The turns of the producer of `records` if they are a transactional batch (see
    /// `txn_turns`); `None` for any other batch.
    pub fn txn_turns(&self, records: &[u8]) -> Option<TxnTurns<'_>> {
        let header = wire::batch::read_header(records).ok()?;
        let attributes = header.attributes();
        if !attributes.is_transactional() || attributes.is_control() {
            return None;
        }
        let producer = header.producer_id();
        let turns = Rc::clone(self.txn_turns.borrow_mut().entry(producer).or_default());
        Some(TxnTurns {
            partition: self,
            producer,
            turns,
        })
    }

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
        let with = OpenWith::default();
        Partition::open_on(data_dir, local, topic, index, topic_id, configs, with).await
    }

    /// [`open`](Self::open) with the log on a given disk (a simulated one in tests) and,
    /// for a new log, the epoch it will lead under (see [`OpenWith`]). A new partition's
    /// directory and metadata files are created in glommio's blocking pool, so call it
    /// on a glommio executor.
    pub async fn open_on(
        data_dir: &Path,
        local: NodeId,
        topic: Arc<str>,
        index: i32,
        topic_id: u128,
        configs: BTreeMap<String, String>,
        with: impl Into<OpenWith>,
    ) -> Result<Partition, StorageError> {
        let OpenWith { disk, lead_epoch } = with.into();
        let log_config = log_config(&configs)?;
        let dir = partition_dir(data_dir, &topic, index);
        let compacted = log_config.cleanup_policy.compact;
        let created = create_if_new(dir.clone(), topic_id, lead_epoch).await?;
        let log = Log::open_on(dir.clone(), log_config, disk).await?;
        let producer_config = ProducerStateConfig::from_configs(&configs);
        let producers =
            PartitionProducers::open(&log, producer_config, crate::shard::now_ms()).await?;
        let bounds = (log.log_start_offset(), log.log_end_offset());
        let fresh = created.is_some();
        let epochs = match created {
            // Nothing can have written into a directory this open just created; checked
            // anyway, since a wrong epoch cache decides what a follower truncates.
            Some(epochs) if bounds == (Offset(0), Offset(0)) => epochs,
            _ => open_existing_files(dir.clone(), topic_id, bounds).await?,
        };
        let leo = log.log_end_offset();
        Ok(Partition {
            topic,
            index,
            topic_id,
            max_message_bytes: Cell::new(max_message_bytes(&configs)),
            min_insync: Cell::new(min_insync(&configs)),
            compacted: Cell::new(compacted),
            compression: Cell::new(compression(&configs)),
            compression_levels: Cell::new(compression_levels(&configs)),
            configs: RefCell::new(configs),
            log: Rc::new(log),
            producers,
            replica: RefCell::new(ReplicaState::sole(local, leo)),
            epochs: RefCell::new(epochs),
            appended: Event::default(),
            log_starts_moved: Event::default(),
            follower_answered: RefCell::new(BTreeMap::new()),
            truncating: Cell::new(0),
            last_used: Cell::new(0),
            lost_hw: Cell::new(None),
            created: fresh,
            txn_turns: RefCell::new(std::collections::HashMap::new()),
        })
    }

    /// A replicated partition just opened: HW = min(checkpointed HW, LEO) instead of the
    /// sole replica's HW = LEO, since the log may end with records its ISR never had (see
    /// `storage::hw_checkpoint`). A log that ends below the checkpointed HW lost records
    /// it acknowledged: that is kept for [`fence_if_lost`](Self::fence_if_lost).
    pub fn restore_high_watermark(&self, checkpointed: Option<Offset>) {
        let start = self.log.log_start_offset();
        let end = self.log.log_end_offset();
        self.replica
            .borrow_mut()
            .restore_high_watermark(checkpointed, start);
        if let Some(hw) = checkpointed.filter(|hw| *hw > end && !self.created) {
            tracing::warn!(topic = %self.topic, partition = self.index, checkpointed_hw = %hw, log_end = %end, "reopened below its checkpointed high watermark: records this replica acknowledged are gone");
            self.lost_hw.set(Some(hw));
        }
        tracing::debug!(topic = %self.topic, partition = self.index, hw = %self.high_watermark(), "high watermark restored from the checkpoint");
    }

    /// Whether this open created the partition's directory (a new replica here).
    pub fn created(&self) -> bool {
        self.created
    }

    /// After every role change of a replica whose log reopened without records it
    /// acknowledged. Leading on under its epoch, it would make its followers, whose fetch
    /// offsets are past its end, cut those records. So while another ISR member may hold
    /// them, the epoch it leads under is fenced: no append, no read
    /// ([`leads_without_acknowledged`](Self::leads_without_acknowledged)), and
    /// [`needs_new_epoch`](Self::needs_new_epoch) makes the shard resign it; another ISR
    /// member leads under a newer epoch, and this one follows it and catches up. Leading
    /// alone, it is the best the partition has, and it leads.
    pub fn fence_if_lost(&self) {
        let Some(lost) = self.lost_hw.get() else {
            return;
        };
        if self.log.log_end_offset() >= lost {
            self.lost_hw.set(None);
            return;
        }
        let (leads, epoch, alone) = {
            let r = self.replica.borrow();
            (r.is_leader(), r.leader_epoch(), r.isr_len() <= 1)
        };
        if !leads {
            return;
        }
        if alone {
            tracing::warn!(topic = %self.topic, partition = self.index, %epoch, "leads without records it acknowledged: no other in-sync replica has them");
            self.lost_hw.set(None);
            return;
        }
        if !self.log.epoch_fenced(epoch) {
            tracing::warn!(topic = %self.topic, partition = self.index, %epoch, "leader epoch fenced: this log lost records it acknowledged, which another in-sync replica holds");
            self.log.fence_epoch(epoch);
        }
        assert!(
            self.leads_without_acknowledged(),
            "a leader lacking acknowledged records beside another ISR member serves nothing"
        );
    }

    /// The HW to checkpoint: the current one, or, while the log lacks records it had
    /// acknowledged, the HW that says so (see `lost_hw`).
    pub fn checkpoint_hw(&self) -> Offset {
        let hw = self.high_watermark();
        match self.lost_hw.get() {
            Some(lost) if self.log.log_end_offset() < lost => lost.max(hw),
            _ => hw,
        }
    }

    /// The merged config in force.
    pub fn configs(&self) -> BTreeMap<String, String> {
        self.configs.borrow().clone()
    }

    /// Applies changed topic configs (AlterConfigs) to the running log.
    pub fn reconfigure(&self, configs: BTreeMap<String, String>) -> Result<(), StorageError> {
        let log_config = log_config(&configs)?;
        self.compacted.set(log_config.cleanup_policy.compact);
        self.log.set_config(log_config);
        self.max_message_bytes.set(max_message_bytes(&configs));
        self.min_insync.set(min_insync(&configs));
        self.compression.set(compression(&configs));
        self.compression_levels.set(compression_levels(&configs));
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

    /// The topic's `min.insync.replicas` in force (the coordinators' acks=all appends).
    pub fn min_insync_replicas(&self) -> usize {
        self.min_insync.get()
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

    /// A replica that just became leader starts its epoch at its log end, as Kafka's
    /// `makeLeader` does, before any append: a follower that fetched the new leader's
    /// first records (say, a coordinator's marker) then fetches under that epoch, and the
    /// KIP-320 check must find it here. Without it the check answered "unknown epoch"
    /// (-1, -1), which on the wire reads as no divergence: the follower neither
    /// truncated nor counted as fetching, and left the ISR after
    /// `replica.lag.time.max.ms` while acks=all writes waited for it.
    ///
    /// The checkpoint is written and fsynced in the blocking pool, not on the shard's
    /// thread (a failover makes this node leader of many partitions at once); the first
    /// append under the epoch waits for it to be on disk (`note_epoch` flushes it), so no
    /// record of the epoch can be in the log while a crash could still take its entry
    /// (see `LeaderEpochCache::assign_in_background`).
    fn start_leader_epoch(&self) -> Result<(), i16> {
        let epoch = {
            let replica = self.replica.borrow();
            assert!(replica.is_leader(), "only a leader starts an epoch");
            replica.leader_epoch()
        };
        {
            let mut epochs = self.epochs.borrow_mut();
            let end = self.log.log_end_offset();
            self.drop_epochs_past(&mut epochs, end)?;
            epochs.assign_in_background(epoch, end);
        }
        let start = self.epochs.borrow().latest().filter(|(e, _)| *e == epoch);
        if let Some((_, start)) = start {
            self.replica.borrow_mut().epoch_started_at(start);
        }
        Ok(())
    }

    /// Applies a committed assignment (see [`ReplicaState::apply`]); a replica that
    /// becomes leader starts its epoch at its log end. A failure to checkpoint that is
    /// logged where it is written, and every leader append notes its epoch again.
    pub fn apply_assignment(&self, a: &replica::Assignment, now_ms: i64) -> replica::RoleChange {
        let mut change = replica::RoleChange::Unchanged;
        self.update_replica(|r| change = r.apply(a, now_ms));
        if change == replica::RoleChange::Lead {
            let _ = self.start_leader_epoch();
        }
        change
    }

    /// Records that appends under `epoch` start at `start` if `epoch` is new to this log
    /// (before the append, so the entry's offset is the epoch's first).
    /// An epoch entry a leader's change wrote in the background is on disk before the
    /// append (written here, on this thread, if the pool has not done it yet).
    fn note_epoch(&self, epoch: LeaderEpoch, start: Offset) -> Result<(), i16> {
        let mut epochs = self.epochs.borrow_mut();
        if let Err(e) = epochs.flush() {
            tracing::error!(topic = %self.topic, partition = self.index, "leader epoch checkpoint: {e}");
            return Err(errors::KAFKA_STORAGE_ERROR);
        }
        self.drop_epochs_past(&mut epochs, start)?;
        let assigned = epochs.assign(epoch, start);
        assigned.map(|_| ()).map_err(|e| {
            tracing::error!(topic = %self.topic, partition = self.index, "leader epoch checkpoint: {e}");
            errors::KAFKA_STORAGE_ERROR
        })
    }

    /// A follower's note of the epochs of the batches it copies (each starts at the first
    /// batch carrying it), as [`note_epoch`](Self::note_epoch) notes a leader's. The
    /// checkpoint is written and fsynced in the blocking pool, not on the shard's thread,
    /// and awaited: no record of a new epoch is appended before its entry is on disk (a
    /// log holding epoch-E records whose checkpoint lost E answers OffsetForLeaderEpoch
    /// wrongly after a restart). A failed write leaves the change for the next append to
    /// write again, which awaits it the same way.
    async fn note_copied_epochs(&self, headers: &[wire::batch::BatchHeader]) -> Result<(), i16> {
        let written = {
            let mut epochs = self.epochs.borrow_mut();
            for h in headers {
                let (epoch, start) = (h.partition_leader_epoch(), h.base_offset());
                // Entries past the start went with an out-of-space rollback's bytes.
                if epochs.latest().is_some_and(|(_, s)| s > start) {
                    epochs.truncate_from_end_unwritten(start.add(1));
                }
                epochs.assign_unwritten(epoch, start);
            }
            epochs.written_in_pool()
        };
        written.await.map_err(|e| {
            tracing::error!(topic = %self.topic, partition = self.index, "leader epoch checkpoint: {e}");
            errors::KAFKA_STORAGE_ERROR
        })
    }

    /// A cut of the log to `end` (a follower's truncation or restart) takes the epochs
    /// that start at or past it; the checkpoint is written in the blocking pool and
    /// awaited before the caller goes on, so nothing is appended past the cut while the
    /// file still holds those entries (after a restart they would claim offsets appended
    /// under other epochs since).
    async fn truncate_epochs(&self, end: Offset) -> Result<(), i16> {
        let written = {
            let mut epochs = self.epochs.borrow_mut();
            epochs.truncate_from_end_unwritten(end);
            epochs.written_in_pool()
        };
        written.await.map_err(|e| {
            tracing::error!(topic = %self.topic, partition = self.index, "leader epoch checkpoint: {e}");
            errors::KAFKA_STORAGE_ERROR
        })
    }

    /// An out-of-space rollback may have cut the log below where the latest epoch started
    /// (it began with appends that were never written): that entry goes with them, as a
    /// truncation would take it.
    fn drop_epochs_past(&self, epochs: &mut LeaderEpochCache, start: Offset) -> Result<(), i16> {
        if epochs.latest().is_some_and(|(_, s)| s > start)
            && let Err(e) = epochs.truncate_from_end(start.add(1))
        {
            tracing::error!(topic = %self.topic, partition = self.index, "leader epoch checkpoint: {e}");
            return Err(errors::KAFKA_STORAGE_ERROR);
        }
        Ok(())
    }

    /// Whether the leader epoch checkpoint holds every change (a new leader's entry is
    /// written in the background; see `start_leader_epoch`).
    pub fn epochs_durable(&self) -> bool {
        self.epochs.borrow().durable()
    }

    /// The thread that last wrote the leader epoch checkpoint (tests: which thread paid
    /// its fsyncs).
    pub fn epochs_written_by(&self) -> Option<std::thread::ThreadId> {
        self.epochs.borrow().written_by()
    }

    /// Whether this replica leads but may not append under its leader epoch: an
    /// out-of-space rollback cut offsets its followers had been served, or the log
    /// reopened without records it acknowledged (see `Log::epoch_fenced`,
    /// [`fence_if_lost`](Self::fence_if_lost)). Only a new leader epoch from the
    /// controller lifts it (`Shard::propose_resignations`).
    pub fn needs_new_epoch(&self) -> bool {
        let replica = self.replica.borrow();
        replica.is_leader() && self.log.epoch_fenced(replica.leader_epoch())
    }

    /// Whether this replica leads under an epoch fenced because its log lost records it
    /// acknowledged: it serves no reads until a newer epoch (see `lost_hw`).
    pub fn leads_without_acknowledged(&self) -> bool {
        self.lost_hw.get().is_some() && self.needs_new_epoch()
    }

    /// Whether this replica leads under `epoch` and may serve (it is not fenced for
    /// records its log lost).
    pub fn leads_under(&self, epoch: LeaderEpoch) -> bool {
        let leads = {
            let r = self.replica.borrow();
            r.is_leader() && r.leader_epoch() == epoch
        };
        leads && !self.leads_without_acknowledged()
    }

    /// OffsetForLeaderEpoch: where `epoch` ends in this replica's log, as (the largest
    /// epoch ≤ it, its end offset), after checking the caller's `current_epoch`.
    pub fn epoch_end_offset(
        &self,
        epoch: LeaderEpoch,
        current_epoch: LeaderEpoch,
    ) -> Result<(LeaderEpoch, Offset), i16> {
        self.replica
            .borrow()
            .check_epoch(current_epoch)
            .map_err(read::epoch_error)?;
        // Kafka answers OffsetForLeaderEpoch on leaders only: a follower's log may end
        // anywhere behind its leader's.
        if !self.replica.borrow().is_leader() || self.leads_without_acknowledged() {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        let end = self.log.log_end_offset();
        Ok(self.epochs.borrow().end_offset_for(epoch, end))
    }

    /// Where a follower cuts its log when its leader answers a fetch with a diverging
    /// epoch (KIP-320): our last epoch ends at `end` on the leader, where `epoch` is the
    /// largest epoch it has at or below ours. Kafka's rule (KIP-279):
    /// - the same epoch here: the smaller of the two ends;
    /// - an epoch unknown here: where the largest epoch below it ends here. The next
    ///   fetch names that epoch, so the answers step down until both logs agree (cutting
    ///   at the leader's `end` instead kept records the leader does not have, and drew the
    ///   same answer forever);
    /// - no epoch here at or below it: the leader's `end`;
    /// - `LeaderEpoch::NONE` (the leader has no epoch that old): the HW, which both hold.
    ///
    /// Never past this log's end.
    pub fn divergence_cut(&self, epoch: LeaderEpoch, end: Offset) -> Offset {
        let log_end = self.log.log_end_offset();
        if epoch == LeaderEpoch::NONE {
            return self.high_watermark().min(log_end);
        }
        let (ours, our_end) = self.epochs.borrow().end_offset_for(epoch, log_end);
        let cut = if ours == epoch {
            end.min(our_end)
        } else if ours == LeaderEpoch::NONE {
            end
        } else {
            our_end
        };
        cut.min(log_end)
    }

    /// The leader epochs of this log and where each starts.
    pub fn epoch_entries(&self) -> Vec<(LeaderEpoch, Offset)> {
        self.epochs.borrow().entries()
    }

    /// A follower cuts its log at `offset` (the end of the leader's matching epoch):
    /// everything from it on is removed, with the epochs that started there; producer
    /// state follows at the next append. Returns the new log end.
    pub async fn truncate_to(&self, offset: Offset) -> Result<Offset, i16> {
        if self.replica.borrow().is_leader() {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        let _cutting = Cutting::start(&self.truncating);
        let end = self.log.truncate_to(offset).await.map_err(|e| {
            tracing::error!(topic = %self.topic, partition = self.index, "truncation: {e}");
            storage_error_code(&e)
        })?;
        self.truncate_epochs(end).await?;
        self.replica.borrow_mut().truncated(end);
        tracing::info!(topic = %self.topic, partition = self.index, offset = %end, "truncated as follower");
        self.restart_epoch_if_leading()?;
        self.rebuild_producers().await?;
        Ok(end)
    }

    /// A follower whose log ends below its leader's log start starts over, empty, at
    /// `offset`: the epochs and the HW go with the records.
    pub async fn restart_at(&self, offset: Offset) -> Result<(), i16> {
        if self.replica.borrow().is_leader() {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        let _cutting = Cutting::start(&self.truncating);
        self.log.restart_at(offset).await.map_err(|e| {
            tracing::error!(topic = %self.topic, partition = self.index, "restart: {e}");
            storage_error_code(&e)
        })?;
        self.truncate_epochs(Offset(0)).await?;
        self.replica.borrow_mut().restarted(offset);
        tracing::info!(topic = %self.topic, partition = self.index, %offset, "follower log restarted at the leader's log start");
        self.restart_epoch_if_leading()?;
        self.rebuild_producers().await
    }

    /// Whether a follower's truncation is under way (see the `truncating` field): a
    /// leader does not append or serve reads meanwhile.
    pub fn truncating(&self) -> bool {
        self.truncating.get() > 0
    }

    /// An assignment may make this replica leader while its truncation waits for the
    /// disk (the log refuses appends meanwhile): its epoch, noted at the old log end,
    /// went with the cut, so it starts again at the new end.
    fn restart_epoch_if_leading(&self) -> Result<(), i16> {
        if !self.replica.borrow().is_leader() {
            return Ok(());
        }
        tracing::info!(topic = %self.topic, partition = self.index, "became leader during a truncation; the epoch starts at the new log end");
        self.start_leader_epoch()
    }

    /// Brings the producer state in line with every cut of the log so far (rebuilding it
    /// if one happened; see `PartitionProducers::follow_truncation`). After a truncation
    /// at once, not at the next append: this replica may lead next and answer
    /// read_committed fetches from it. Before an append whose first poll must take its
    /// offsets (arrival order, a coordinator's contiguous writes): a rebuild would
    /// otherwise park that poll.
    pub async fn rebuild_producers(&self) -> Result<(), i16> {
        // The produce path's case: nothing was cut, not even a clock read.
        if !self.producers.behind(&self.log) {
            return Ok(());
        }
        let now = crate::shard::now_ms();
        self.producers
            .follow_truncation(&self.log, now)
            .await
            .map_err(|e| {
                tracing::error!(topic = %self.topic, partition = self.index, "producer state rebuild: {e}");
                storage_error_code(&e)
            })
    }

    /// An append ending at `end` completed: the HW follows where the ISR allows. Not the
    /// log's end offset, which counts appends still being written.
    fn log_grew(&self, end: Offset) {
        self.replica.borrow_mut().local_log_end(end);
        self.appended.notify_all();
    }
}

/// The partition's epoch cache, in line with its recovered log: entries past the log end
/// (a torn tail was cut) are dropped; a log written before the cache existed — by a
/// single node, whose only epoch is [`replica::SOLE_LEADER_EPOCH`] — starts its cache there.
fn open_epochs(dir: &Path, start: Offset, end: Offset) -> Result<LeaderEpochCache, StorageError> {
    let mut epochs = LeaderEpochCache::load(dir)?;
    epochs.truncate_from_end(end)?;
    if epochs.latest().is_none() && end > start {
        epochs.assign(replica::SOLE_LEADER_EPOCH, start)?;
    }
    Ok(epochs)
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
        StorageError::OffsetSpanTooLarge { .. } => errors::INVALID_RECORD,
        StorageError::Closed { .. } => errors::NOT_LEADER_OR_FOLLOWER,
        // A follower's truncation holds the log: whoever appends is not its leader yet.
        StorageError::Truncating { .. } => errors::NOT_LEADER_OR_FOLLOWER,
        // This leader may not append under its epoch any more: the client looks for the
        // leader of the next one.
        StorageError::ServedRolledBack { .. } => errors::NOT_LEADER_OR_FOLLOWER,
        _ => errors::KAFKA_STORAGE_ERROR,
    }
}

/// Marks a partition's truncation as under way for as long as it lives (also when the
/// truncation's future is dropped mid-way). A count, so overlapping cuts keep the mark
/// until the last one ends.
struct Cutting<'a>(&'a Cell<u32>);

impl<'a> Cutting<'a> {
    fn start(count: &'a Cell<u32>) -> Cutting<'a> {
        count.set(count.get().saturating_add(1));
        Cutting(count)
    }
}

impl Drop for Cutting<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::epochs::CHECKPOINT_FILE;

    /// A new partition's directory comes with `partition.metadata` and the checkpoint of
    /// the epoch it will lead under; a crash that left the metadata empty (it is written
    /// without fsyncs) is repaired by the next open, which treats the directory as an
    /// existing log (and, as for any log, drops epochs starting at its end).
    #[test]
    fn a_new_partition_gets_its_files_and_an_empty_metadata_file_is_rewritten() {
        let root = tempfile::tempdir_in(crate::storage::test_dir_root()).expect("tempdir");
        let data = root.path().to_path_buf();
        let seen = crate::storage::testing::run_on_shard(move || async move {
            let topic: Arc<str> = Arc::from("t");
            let dir = partition_dir(&data, "t", 0);
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect(name);
            let with = OpenWith {
                disk: crate::storage::Disk::Real,
                lead_epoch: Some(LeaderEpoch(3)),
            };
            let configs = BTreeMap::new();
            let p = Partition::open_on(&data, NodeId(1), topic.clone(), 0, 7, configs, with);
            let p = p.await.expect("create");
            let created = (read(PARTITION_METADATA_FILE), read(CHECKPOINT_FILE));
            let epochs = p.epoch_entries();
            drop(p);
            std::fs::write(dir.join(PARTITION_METADATA_FILE), b"").expect("empty it");
            let p = Partition::open(&data, NodeId(1), topic, 0, 7, BTreeMap::new());
            let p = p.await.expect("reopen");
            (
                created,
                epochs,
                read(PARTITION_METADATA_FILE),
                p.epoch_entries(),
            )
        });
        let ((metadata, checkpoint), epochs, rewritten, reopened) = seen;
        assert_eq!(metadata, partition_metadata_text(7));
        assert_eq!(checkpoint, "0\n1\n3 0\n", "epoch 3 from offset 0");
        assert_eq!(epochs, vec![(LeaderEpoch(3), Offset(0))]);
        assert_eq!(
            rewritten,
            partition_metadata_text(7),
            "rewritten at the reopen"
        );
        assert!(
            reopened.is_empty(),
            "an empty log keeps no epoch at its end"
        );
    }
}
