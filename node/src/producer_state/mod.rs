//! Idempotent producers: exactly once and in order per partition, across retries and
//! restarts (seeds 000 §3.2.1, 002 "如何实现exactly-once"; DESIGN.md, Produce path step 3).
//!
//! - [`table`]: [`ProducerStateTable`], one per partition replica, owned by the shard
//!   that owns the partition (no locks), with the check every idempotent batch passes.
//! - [`entry`]: one producer id's state: epoch and its last 5 batches.
//! - [`snapshot`]: the `<offset:020>.snapshot` byte layout, file names and the recovery
//!   decision table (load the newest usable snapshot, replay the log after it).
//! - [`allocator`]: producer ids for InitProducerId (and the transaction coordinator's new
//!   ids), unique across restarts: a single node's persisted per-shard blocks, a
//!   cluster's blocks from the controller; and KIP-360 epoch bumps;
//!   [`init_producer_id`] is the request handler on top of it.
//! - [`partition`]: the table bound to a partition's storage log: check around each
//!   append, snapshots at segment roll and clean shutdown, rebuild when the log opens;
//!   KIP-890 verification guards (a producer's marker ends the verifications of its
//!   transactional appends under way there, which are then refused).
//!
//! # Produce path contract
//!
//! For each batch, in request order, on the owning shard, with no `.await` between the
//! check and the record:
//!
//! ```text
//! match table.check(header) {
//!     Ok(Verdict::NotIdempotent) => append, nothing recorded,
//!     Ok(Verdict::Append) => { first = log end offset; table.record_append(header, first, now_ms); append }
//!     Ok(Verdict::Duplicate(orig)) => answer NONE with orig.first_offset (wait for HW
//!                                     past orig.last_offset under acks=all), append nothing,
//!     Err(rejection) => answer rejection.error_code(), append nothing; later batches
//!                       are checked against the unchanged state,
//! }
//! ```
//!
//! A failed append leaves the table ahead of the log; the storage log then refuses all
//! writes until it is reopened, and reopening rebuilds the table from snapshot + log.

pub mod allocator;
pub mod entry;
pub mod init_producer_id;
pub mod partition;
pub mod snapshot;
pub mod table;

#[cfg(test)]
mod tests;

pub use allocator::{
    AllocatorError, IdRange, InitProducerIdOutcome, ProducerIdAllocator, ProducerIdBlockFile,
    fenced_error_code,
};
pub use entry::{BATCHES_RETAINED, BatchMetadata, ProducerEntry};
pub use snapshot::{
    RecoveryPlan, SnapshotError, decode_snapshot, encode_snapshot, parse_snapshot_file_name,
    plan_recovery, snapshot_file_name,
};
pub use table::{MarkerSeen, ProducerStateCounters, ProducerStateTable, Rejection, Verdict};

/// Kafka error code: the broker received an out of order sequence number.
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
/// Kafka error code: the producer attempted to produce with an old epoch.
pub const INVALID_PRODUCER_EPOCH: i16 = 47;
/// Kafka error code: the broker has no state for this producer id (Kafka ≤ 2.4 Produce).
pub const UNKNOWN_PRODUCER_ID: i16 = 59;
/// Kafka error code: a newer epoch of this producer exists (InitProducerId v4+ only).
pub const PRODUCER_FENCED: i16 = 90;

/// Kafka's default `producer.id.expiration.ms`: one day.
pub const PRODUCER_ID_EXPIRATION_MS_DEFAULT: i64 = 86_400_000;
/// Kafka's default `producer.id.expiration.check.interval.ms`: ten minutes.
pub const PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT: i64 = 600_000;
/// Default bound on producer ids remembered per partition (weir's own limit; Kafka bounds
/// only by expiry). About 2.2 MB per partition at most.
pub const MAX_PRODUCERS_PER_PARTITION_DEFAULT: usize = 10_000;

/// What a batch from a producer id this partition has no state for, starting at a
/// sequence other than 0, gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownProducerPolicy {
    /// Kafka ≥ 2.5 (KIP-360, KAFKA-7190): the state may have expired or been removed with
    /// old segments, so accept the batch and start tracking from it. This is what current
    /// clients (Java ≥ 2.5, librdkafka ≥ 1.7) expect, at every Produce version.
    Accept,
    /// Kafka 0.11–2.4: refuse with UNKNOWN_PRODUCER_ID (59), which makes the client reset
    /// its producer id or sequence.
    Reject,
}

/// Per-partition producer-state settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerStateConfig {
    /// `producer.id.expiration.ms`: forget a producer silent this long.
    pub producer_id_expiration_ms: i64,
    /// Most producer ids remembered per partition; least recently seen go first.
    pub max_producers: usize,
    pub unknown_producer: UnknownProducerPolicy,
}

impl ProducerStateConfig {
    /// The defaults, with `producer.id.expiration.ms` taken from `configs` when present
    /// and valid (a positive number of milliseconds).
    pub fn from_configs(configs: &std::collections::BTreeMap<String, String>) -> Self {
        let mut config = ProducerStateConfig::default();
        if let Some(ms) = configs
            .get("producer.id.expiration.ms")
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|ms| *ms > 0)
        {
            config.producer_id_expiration_ms = ms;
        }
        config
    }
}

impl Default for ProducerStateConfig {
    fn default() -> Self {
        ProducerStateConfig {
            producer_id_expiration_ms: PRODUCER_ID_EXPIRATION_MS_DEFAULT,
            max_producers: MAX_PRODUCERS_PER_PARTITION_DEFAULT,
            unknown_producer: UnknownProducerPolicy::Accept,
        }
    }
}
