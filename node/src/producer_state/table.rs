//! [`ProducerStateTable`]: one partition's producer state and the idempotence check that
//! every produced batch passes on the partition's owning shard before it is appended.
//!
//! The check follows Kafka's broker (`ProducerAppendInfo`, Kafka ≥ 2.5):
//!
//! | incoming batch (pid ≥ 0)                          | answer                          |
//! |---------------------------------------------------|---------------------------------|
//! | epoch or base sequence negative                   | reject (malformed)              |
//! | pid unknown, sequence 0                           | append                          |
//! | pid unknown, sequence ≠ 0                         | append (KIP-360) / UNKNOWN_PRODUCER_ID (Kafka ≤ 2.4 policy) |
//! | epoch < current epoch                             | INVALID_PRODUCER_EPOCH (47)     |
//! | epoch > current epoch, sequence 0                 | append (new epoch)              |
//! | epoch > current epoch, sequence ≠ 0               | OUT_OF_ORDER_SEQUENCE_NUMBER (45) |
//! | same epoch, same first+last sequence as one of the last 5 batches | duplicate: original offsets, nothing appended |
//! | same epoch, first sequence = last sequence + 1 (wrapping at `i32::MAX`) | append |
//! | same epoch, anything else                         | OUT_OF_ORDER_SEQUENCE_NUMBER (45) |
//!
//! Produce answers an old epoch with INVALID_PRODUCER_EPOCH at every version: Kafka's
//! brokers before 2.7 threw `ProducerFencedException`, which was mapped to code 47 then;
//! since 2.7 (KIP-588) they throw `InvalidProducerEpochException`, also 47. Code 90
//! (PRODUCER_FENCED) exists only on InitProducerId v4+ and the transaction APIs.

use std::collections::{BTreeMap, HashMap};

use wire::batch::BatchHeader;
use wire::{Offset, ProducerEpoch, ProducerId, Sequence};

use super::entry::{BatchMetadata, ProducerEntry};
use super::{
    INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER, ProducerStateConfig, UNKNOWN_PRODUCER_ID,
    UnknownProducerPolicy,
};

/// What to do with a batch that passed the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The batch has no producer id: append it; the table keeps nothing for it.
    NotIdempotent,
    /// New and in order: append it, then call [`ProducerStateTable::record_append`].
    Append,
    /// A resend of a batch already in the log: answer success with these original offsets
    /// and append nothing.
    Duplicate(BatchMetadata),
}

/// Why a batch was refused. Nothing is appended and the table is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("producer {producer_id}: epoch {epoch} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        current: ProducerEpoch,
    },
    #[error("producer {producer_id} epoch {epoch}: sequence {got}, expected {expected}")]
    OutOfOrderSequence {
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        got: Sequence,
        expected: Sequence,
    },
    #[error("producer {producer_id} is unknown and its batch starts at sequence {got}, not 0")]
    UnknownProducerId {
        producer_id: ProducerId,
        got: Sequence,
    },
}

impl Rejection {
    /// The Kafka error code a Produce response carries for this rejection.
    pub fn error_code(&self) -> i16 {
        match self {
            Rejection::InvalidProducerEpoch { .. } => INVALID_PRODUCER_EPOCH,
            Rejection::OutOfOrderSequence { .. } => OUT_OF_ORDER_SEQUENCE_NUMBER,
            Rejection::UnknownProducerId { .. } => UNKNOWN_PRODUCER_ID,
        }
    }
}

/// Running totals, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerStateCounters {
    /// Resent batches answered with their original offsets instead of being appended.
    pub duplicates_dropped: u64,
    /// Batches refused with OUT_OF_ORDER_SEQUENCE_NUMBER.
    pub out_of_order_rejections: u64,
    /// Batches refused with INVALID_PRODUCER_EPOCH (a fenced, older producer epoch).
    pub fenced_requests: u64,
    /// Batches refused with UNKNOWN_PRODUCER_ID (only under the Kafka ≤ 2.4 policy).
    pub unknown_producer_rejections: u64,
    /// Producer ids forgotten after `producer.id.expiration.ms` of silence.
    pub producers_expired: u64,
    /// Producer ids forgotten because the table was full (least recently seen first).
    pub producers_evicted: u64,
}

/// The producer state of one partition replica. It lives on the shard that owns the
/// partition and is touched only there, so it has no locks. Pure: no I/O, no clock; the
/// caller passes `now_ms`.
///
/// Bound: at most `config.max_producers` entries, each a fixed-size [`ProducerEntry`]
/// (5 batches × 32 bytes + epoch + clock ≈ 190 bytes, plus the hash map's slot), so a
/// partition's table never exceeds about `max_producers × 220` bytes.
#[derive(Clone, Debug)]
pub struct ProducerStateTable {
    config: ProducerStateConfig,
    producers: HashMap<ProducerId, ProducerEntry>,
    /// Open transactions in this partition: producer id → offset of its first batch in
    /// the transaction (Kafka's `currentTxnFirstOffset`). A transactional batch opens one
    /// if none is open; the producer's COMMIT or ABORT marker closes it. Bounded by the
    /// producers remembered (one per producer id).
    ongoing: BTreeMap<ProducerId, Offset>,
    counters: ProducerStateCounters,
}

/// What the producer state keeps of a COMMIT or ABORT marker appended here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkerSeen {
    /// The producer epoch in the marker batch's header.
    pub producer_epoch: ProducerEpoch,
    /// The coordinator epoch in the marker record's value.
    pub coordinator_epoch: i32,
}

/// A transaction that a marker closed in this partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: ProducerId,
    /// Offset of its first batch here.
    pub first_offset: Offset,
    /// Offset of the marker.
    pub last_offset: Offset,
}

impl ProducerStateTable {
    pub fn new(config: ProducerStateConfig) -> ProducerStateTable {
        ProducerStateTable {
            config,
            producers: HashMap::new(),
            ongoing: BTreeMap::new(),
            counters: ProducerStateCounters::default(),
        }
    }

    /// Decides what to do with an incoming batch; counts duplicates and rejections.
    /// Changes no producer state: call [`Self::record_append`] once the batch has offsets.
    pub fn check(&mut self, header: &BatchHeader) -> Result<Verdict, Rejection> {
        let verdict = self.classify(header);
        match &verdict {
            Ok(Verdict::Duplicate(_)) => {
                self.counters.duplicates_dropped += 1;
                crate::metrics::add(|m| &m.producer_duplicates, 1);
            }
            Err(Rejection::OutOfOrderSequence { .. }) => {
                self.counters.out_of_order_rejections += 1;
                crate::metrics::add(|m| &m.producer_out_of_order, 1);
            }
            Err(Rejection::InvalidProducerEpoch { .. }) => self.counters.fenced_requests += 1,
            Err(Rejection::UnknownProducerId { .. }) => {
                self.counters.unknown_producer_rejections += 1
            }
            Ok(Verdict::Append | Verdict::NotIdempotent) => {}
        }
        verdict
    }

    /// The pure decision behind [`Self::check`].
    pub fn classify(&self, header: &BatchHeader) -> Result<Verdict, Rejection> {
        let producer_id = header.producer_id();
        if !producer_id.is_some() {
            return Ok(Verdict::NotIdempotent);
        }
        let epoch = header.producer_epoch();
        let first = header.base_sequence();
        if epoch.0 < 0 {
            return Err(Rejection::InvalidProducerEpoch {
                producer_id,
                epoch,
                current: ProducerEpoch(0),
            });
        }
        let Some(entry) = self.producers.get(&producer_id) else {
            return self.classify_unknown(producer_id, epoch, first);
        };
        if epoch < entry.epoch() {
            return Err(Rejection::InvalidProducerEpoch {
                producer_id,
                epoch,
                current: entry.epoch(),
            });
        }
        let expected = if epoch > entry.epoch() {
            Sequence(0)
        } else if let Some(original) = entry.find_batch(first, header.last_sequence()) {
            return Ok(Verdict::Duplicate(*original));
        } else {
            // No batch of this epoch yet (a marker fenced the older one): start at 0.
            entry
                .last_batch()
                .map_or(Sequence(0), |b| b.last_sequence.add_wrapping(1))
        };
        if first == expected {
            Ok(Verdict::Append)
        } else {
            Err(Rejection::OutOfOrderSequence {
                producer_id,
                epoch,
                got: first,
                expected,
            })
        }
    }

    /// A producer with no state here: its first batch must start at 0, unless the state
    /// was lost (expiry) and the KIP-360 policy lets it continue where it was.
    fn classify_unknown(
        &self,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        first: Sequence,
    ) -> Result<Verdict, Rejection> {
        if first == Sequence(0) {
            return Ok(Verdict::Append);
        }
        if first.0 < 0 {
            return Err(Rejection::OutOfOrderSequence {
                producer_id,
                epoch,
                got: first,
                expected: Sequence(0),
            });
        }
        match self.config.unknown_producer {
            UnknownProducerPolicy::Accept => Ok(Verdict::Append),
            UnknownProducerPolicy::Reject => Err(Rejection::UnknownProducerId {
                producer_id,
                got: first,
            }),
        }
    }

    /// Records a batch that [`Self::check`] answered with [`Verdict::Append`] and that was
    /// given offsets starting at `first_offset`. Call it in the same synchronous step as
    /// the offset assignment (no `.await` between check and record), so that the next
    /// batch of the same producer — maybe already in flight — is checked against it.
    pub fn record_append(&mut self, header: &BatchHeader, first_offset: Offset, now_ms: i64) {
        let producer_id = header.producer_id();
        if !producer_id.is_some() || header.attributes().is_control() {
            return;
        }
        if header.attributes().is_transactional() {
            self.ongoing.entry(producer_id).or_insert(first_offset);
        }
        let batch = BatchMetadata {
            first_sequence: header.base_sequence(),
            last_sequence: header.last_sequence(),
            first_offset,
            last_offset: first_offset.add(i64::from(header.last_offset_delta.get())),
            max_timestamp: header.max_timestamp(),
        };
        let epoch = header.producer_epoch();
        if let Some(entry) = self.producers.get_mut(&producer_id) {
            entry.push(epoch, batch, now_ms);
            return;
        }
        if self.producers.len() >= self.config.max_producers {
            self.evict_least_recently_seen();
        }
        self.producers
            .insert(producer_id, ProducerEntry::new(epoch, batch, now_ms));
        debug_assert!(self.producers.len() <= self.config.max_producers.max(1));
    }

    /// Rebuild: feeds a batch read back from the log (offsets already in its header).
    /// No validation, like Kafka's replay: the log is the truth.
    pub fn replay(&mut self, header: &BatchHeader, now_ms: i64) {
        self.record_append(header, header.base_offset(), now_ms);
    }

    /// Forgets producers silent for `producer.id.expiration.ms` or longer. Returns how
    /// many were removed.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let limit_ms = self.config.producer_id_expiration_ms;
        let before = self.producers.len();
        // A producer with an open transaction stays (Kafka's rule): its marker must find it.
        let ongoing = &self.ongoing;
        self.producers.retain(|pid, e| {
            now_ms.saturating_sub(e.last_seen_ms()) < limit_ms || ongoing.contains_key(pid)
        });
        let removed = before - self.producers.len();
        self.counters.producers_expired += removed as u64;
        removed
    }

    /// Makes room when full: drops the least recently seen eighth of the producers in one
    /// pass (at least one), so a flood of new producer ids costs amortised O(1) each.
    fn evict_least_recently_seen(&mut self) {
        let mut seen: Vec<(i64, ProducerId)> = self
            .producers
            .iter()
            .map(|(pid, e)| (e.last_seen_ms(), *pid))
            .collect();
        let count = (seen.len() / 8).max(1).min(seen.len());
        if count == 0 {
            return;
        }
        seen.select_nth_unstable(count - 1);
        for (_, pid) in &seen[..count] {
            self.producers.remove(pid);
        }
        self.counters.producers_evicted += count as u64;
    }

    /// Forgets every batch at or past `end`, after the log was cut there (an
    /// out-of-space rollback, a truncation), so that a resend of a batch that is no longer
    /// in the log is appended again instead of answered as a duplicate. Producers left
    /// without batches are removed.
    pub fn truncate_from(&mut self, end: Offset) {
        self.producers.retain(|_, e| e.truncate_from(end));
        self.ongoing.retain(|_, first| *first < end);
    }

    /// A COMMIT or ABORT marker of `producer_id` was given `marker_offset`: its open
    /// transaction here (if it wrote here at all) is closed. A marker for a producer with
    /// no open transaction closes nothing (the coordinator writes markers to every
    /// partition it added, written to or not), but it is remembered, with its coordinator
    /// epoch, so that an older coordinator's late marker is refused (Kafka makes an entry
    /// for it too).
    pub fn complete_txn(
        &mut self,
        producer_id: ProducerId,
        marker: MarkerSeen,
        marker_offset: Offset,
        now_ms: i64,
    ) -> Option<CompletedTxn> {
        if let Some(entry) = self.producers.get_mut(&producer_id) {
            entry.fence_to(marker.producer_epoch);
            entry.note_coordinator_epoch(marker.coordinator_epoch);
        } else if producer_id.is_some() {
            if self.producers.len() >= self.config.max_producers {
                self.evict_least_recently_seen();
            }
            self.producers.insert(
                producer_id,
                ProducerEntry::marked(marker.producer_epoch, marker.coordinator_epoch, now_ms),
            );
        }
        let first_offset = self.ongoing.remove(&producer_id)?;
        assert!(
            first_offset < marker_offset,
            "marker at {marker_offset} before its transaction's first batch at {first_offset}"
        );
        Some(CompletedTxn {
            producer_id,
            first_offset,
            last_offset: marker_offset,
        })
    }

    /// Whether a marker of `coordinator_epoch` for `producer_id` comes from a coordinator
    /// older than one whose marker this partition already has.
    pub fn is_stale_coordinator(&self, producer_id: ProducerId, coordinator_epoch: i32) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.coordinator_epoch() > coordinator_epoch)
    }

    /// The first offset of the oldest open transaction: the LSO cannot pass it.
    pub fn first_unstable_offset(&self) -> Option<Offset> {
        self.ongoing.values().min().copied()
    }

    /// Whether `producer_id` has a transaction open here.
    pub fn has_ongoing(&self, producer_id: ProducerId) -> bool {
        self.ongoing.contains_key(&producer_id)
    }

    /// The first offset of `producer_id`'s open transaction here, if one is open.
    pub fn ongoing_first(&self, producer_id: ProducerId) -> Option<Offset> {
        self.ongoing.get(&producer_id).copied()
    }

    /// Open transactions (producer id, first offset), in producer-id order.
    pub fn ongoing_txns(&self) -> impl Iterator<Item = (ProducerId, Offset)> + '_ {
        self.ongoing.iter().map(|(p, o)| (*p, *o))
    }

    /// Restores an open transaction (snapshot loading).
    pub(super) fn insert_ongoing(&mut self, producer_id: ProducerId, first_offset: Offset) {
        self.ongoing.insert(producer_id, first_offset);
    }

    pub fn get(&self, producer_id: ProducerId) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// All producers, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, &ProducerEntry)> + '_ {
        self.producers.iter().map(|(pid, e)| (*pid, e))
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn counters(&self) -> ProducerStateCounters {
        self.counters
    }

    pub fn config(&self) -> &ProducerStateConfig {
        &self.config
    }

    /// Whether both tables hold the same producers with the same state (ignoring
    /// counters and config): the check that a rebuilt table equals the live one.
    pub fn same_producers(&self, other: &ProducerStateTable) -> bool {
        self.producers == other.producers && self.ongoing == other.ongoing
    }

    /// Inserts a whole entry (snapshot loading). Past the bound, the least recently seen
    /// are evicted as for live appends.
    /// Snapshot decoding: sets a listed producer's coordinator epoch; false if the
    /// producer is not in the table.
    pub(super) fn note_coordinator_epoch(
        &mut self,
        producer_id: ProducerId,
        coordinator_epoch: i32,
    ) -> bool {
        match self.producers.get_mut(&producer_id) {
            Some(entry) => {
                entry.note_coordinator_epoch(coordinator_epoch);
                true
            }
            None => false,
        }
    }

    pub(super) fn insert_entry(&mut self, producer_id: ProducerId, entry: ProducerEntry) {
        if !self.producers.contains_key(&producer_id)
            && self.producers.len() >= self.config.max_producers
        {
            self.evict_least_recently_seen();
        }
        self.producers.insert(producer_id, entry);
    }
}
