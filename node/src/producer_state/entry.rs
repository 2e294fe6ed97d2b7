//! One producer's state in one partition: its epoch, the metadata of its last few batches
//! (the dedup window) and when it was last seen (for expiry).

use wire::{Offset, ProducerEpoch, Sequence};

/// How many of a producer's most recent batches are remembered for duplicate detection.
/// Kafka's clients keep at most 5 requests in flight per connection when idempotent
/// (`max.in.flight.requests.per.connection` ≤ 5), so any retry they can send is one of
/// the last 5 batches.
pub const BATCHES_RETAINED: usize = 5;

/// What is remembered of one appended batch: enough to recognise a resend and answer it
/// with the original offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMetadata {
    pub first_sequence: Sequence,
    pub last_sequence: Sequence,
    pub first_offset: Offset,
    pub last_offset: Offset,
    /// The batch's `maxTimestamp` as appended (returned to a duplicate's sender).
    pub max_timestamp: i64,
}

/// A producer id's state in one partition. The batches form a ring, oldest first; they
/// all belong to `epoch` (a new epoch clears them).
#[derive(Clone, Debug)]
pub struct ProducerEntry {
    epoch: ProducerEpoch,
    batches: [BatchMetadata; BATCHES_RETAINED],
    /// Index of the oldest batch in `batches`.
    head: u8,
    /// Number of valid batches, `1..=BATCHES_RETAINED` once the entry exists; 0 after a
    /// transaction marker moved the producer to a newer epoch (no batch of it yet).
    len: u8,
    /// Broker clock (ms) of the last append by this producer; drives expiry.
    last_seen_ms: i64,
    /// The newest coordinator epoch of this producer's transaction markers here (-1: none
    /// seen). A marker from an older coordinator epoch is a coordinator that lost its
    /// partition still writing: refused (Kafka's `coordinatorEpoch` check).
    coordinator_epoch: i32,
}

const EMPTY_BATCH: BatchMetadata = BatchMetadata {
    first_sequence: Sequence::NONE,
    last_sequence: Sequence::NONE,
    first_offset: Offset::NONE,
    last_offset: Offset::NONE,
    max_timestamp: -1,
};

impl ProducerEntry {
    /// A producer's entry created by its first appended batch.
    pub fn new(epoch: ProducerEpoch, first: BatchMetadata, now_ms: i64) -> ProducerEntry {
        let mut batches = [EMPTY_BATCH; BATCHES_RETAINED];
        batches[0] = first;
        ProducerEntry {
            epoch,
            batches,
            head: 0,
            len: 1,
            last_seen_ms: now_ms,
            coordinator_epoch: -1,
        }
    }

    /// A producer first seen through a transaction marker (it added this partition to a
    /// transaction but wrote nothing here): its epoch, no batch yet.
    pub fn marked(epoch: ProducerEpoch, coordinator_epoch: i32, now_ms: i64) -> ProducerEntry {
        let mut entry = ProducerEntry::new(epoch, EMPTY_BATCH, now_ms);
        entry.len = 0;
        entry.coordinator_epoch = coordinator_epoch;
        entry
    }

    pub fn coordinator_epoch(&self) -> i32 {
        self.coordinator_epoch
    }

    /// A marker of `coordinator_epoch` was appended: never moves back.
    pub fn note_coordinator_epoch(&mut self, coordinator_epoch: i32) {
        self.coordinator_epoch = self.coordinator_epoch.max(coordinator_epoch);
    }

    pub fn epoch(&self) -> ProducerEpoch {
        self.epoch
    }

    pub fn last_seen_ms(&self) -> i64 {
        self.last_seen_ms
    }

    /// The most recent batch: the one the next batch's sequence must follow. `None` when
    /// the epoch has no batch yet (after [`Self::fence_to`]).
    pub fn last_batch(&self) -> Option<&BatchMetadata> {
        let last = usize::from(self.len).checked_sub(1)?;
        Some(&self.batches[self.slot(last)])
    }

    /// A transaction marker of a newer epoch (the coordinator aborted the producer's
    /// transaction and fenced it): batches of older epochs are refused from now on, and the
    /// new epoch starts at sequence 0 (Kafka's `maybeUpdateProducerEpoch`).
    pub fn fence_to(&mut self, epoch: ProducerEpoch) {
        if epoch <= self.epoch {
            return;
        }
        self.epoch = epoch;
        self.head = 0;
        self.len = 0;
    }

    /// The retained batches, oldest first.
    pub fn batches(&self) -> impl ExactSizeIterator<Item = &BatchMetadata> + '_ {
        (0..usize::from(self.len)).map(move |i| &self.batches[self.slot(i)])
    }

    /// The retained batch with exactly this sequence range, if any. Kafka matches both
    /// ends: a resend is the same batch, never a re-split one.
    pub fn find_batch(&self, first: Sequence, last: Sequence) -> Option<&BatchMetadata> {
        self.batches()
            .find(|b| b.first_sequence == first && b.last_sequence == last)
    }

    /// Records an appended batch. A different epoch starts a fresh window: batches of an
    /// older epoch can never be resent successfully, so they need not be remembered.
    pub fn push(&mut self, epoch: ProducerEpoch, batch: BatchMetadata, now_ms: i64) {
        if epoch != self.epoch {
            let coordinator_epoch = self.coordinator_epoch;
            *self = ProducerEntry::new(epoch, batch, now_ms.max(self.last_seen_ms));
            self.coordinator_epoch = coordinator_epoch;
            return;
        }
        if usize::from(self.len) == BATCHES_RETAINED {
            self.batches[usize::from(self.head)] = batch;
            self.head = ((usize::from(self.head) + 1) % BATCHES_RETAINED) as u8;
        } else {
            let slot = self.slot(usize::from(self.len));
            self.batches[slot] = batch;
            self.len += 1;
        }
        // The clock passed in may step back (NTP); expiry must not move earlier for that.
        self.last_seen_ms = self.last_seen_ms.max(now_ms);
        debug_assert!(usize::from(self.len) <= BATCHES_RETAINED);
    }

    /// Rebuilds an entry from its parts (snapshot decoding). `batches` must be 1..=5
    /// batches, oldest first; returns `None` otherwise.
    pub fn from_parts(
        epoch: ProducerEpoch,
        batches: &[BatchMetadata],
        last_seen_ms: i64,
    ) -> Option<ProducerEntry> {
        let Some((first, rest)) = batches.split_first() else {
            // A fenced epoch with no batch yet (see `fence_to`).
            let mut entry = ProducerEntry::new(epoch, EMPTY_BATCH, last_seen_ms);
            entry.len = 0;
            return Some(entry);
        };
        if rest.len() >= BATCHES_RETAINED {
            return None;
        }
        let mut entry = ProducerEntry::new(epoch, *first, last_seen_ms);
        for b in rest {
            entry.push(epoch, *b, last_seen_ms);
        }
        Some(entry)
    }

    /// Forgets the batches at or past `end` (the log was cut there: an out-of-space
    /// rollback or a truncation), newest first. Returns false when no batch is left:
    /// the caller drops the entry, and the producer is unknown again.
    pub fn truncate_from(&mut self, end: Offset) -> bool {
        while self.last_batch().is_some_and(|b| b.last_offset >= end) {
            self.len -= 1;
        }
        self.len > 0
    }

    fn slot(&self, i: usize) -> usize {
        (usize::from(self.head) + i) % BATCHES_RETAINED
    }
}

/// Equal when they would answer every batch and marker alike: same epoch, same batches in
/// the same order, same clock, same coordinator epoch. Where the ring happens to start does not matter.
impl PartialEq for ProducerEntry {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch
            && self.last_seen_ms == other.last_seen_ms
            && self.coordinator_epoch == other.coordinator_epoch
            && self.batches().eq(other.batches())
    }
}

impl Eq for ProducerEntry {}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: i32, last: i32, offset: i64) -> BatchMetadata {
        BatchMetadata {
            first_sequence: Sequence(first),
            last_sequence: Sequence(last),
            first_offset: Offset(offset),
            last_offset: Offset(offset + i64::from(last - first)),
            max_timestamp: 1000 + offset,
        }
    }

    #[test]
    fn keeps_only_the_last_five_batches_oldest_first() {
        let mut e = ProducerEntry::new(ProducerEpoch(0), batch(0, 0, 0), 1);
        for i in 1..8 {
            e.push(ProducerEpoch(0), batch(i, i, i64::from(i)), 1);
        }
        let firsts: Vec<i32> = e.batches().map(|b| b.first_sequence.0).collect();
        assert_eq!(firsts, vec![3, 4, 5, 6, 7]);
        assert_eq!(e.last_batch().unwrap().last_sequence, Sequence(7));
        assert!(e.find_batch(Sequence(2), Sequence(2)).is_none());
        assert_eq!(
            e.find_batch(Sequence(3), Sequence(3)),
            Some(&batch(3, 3, 3))
        );
    }

    #[test]
    fn a_new_epoch_clears_the_window() {
        let mut e = ProducerEntry::new(ProducerEpoch(0), batch(0, 4, 0), 1);
        e.push(ProducerEpoch(1), batch(0, 1, 5), 2);
        assert_eq!(e.epoch(), ProducerEpoch(1));
        assert_eq!(e.batches().len(), 1);
        assert!(e.find_batch(Sequence(0), Sequence(4)).is_none());
    }

    #[test]
    fn from_parts_rejects_oversized_and_keeps_a_fenced_epoch() {
        let fenced = ProducerEntry::from_parts(ProducerEpoch(2), &[], 0).unwrap();
        assert_eq!(
            (fenced.epoch(), fenced.batches().len()),
            (ProducerEpoch(2), 0)
        );
        assert!(fenced.last_batch().is_none());
        let six: Vec<_> = (0..6).map(|i| batch(i, i, i64::from(i))).collect();
        assert!(ProducerEntry::from_parts(ProducerEpoch(0), &six, 0).is_none());
        let e = ProducerEntry::from_parts(ProducerEpoch(3), &six[1..], 9).unwrap();
        assert_eq!(e.batches().copied().collect::<Vec<_>>(), six[1..].to_vec());
        assert_eq!(e.last_seen_ms(), 9);
    }

    #[test]
    fn last_seen_never_moves_back() {
        let mut e = ProducerEntry::new(ProducerEpoch(0), batch(0, 0, 0), 100);
        e.push(ProducerEpoch(0), batch(1, 1, 1), 50);
        assert_eq!(e.last_seen_ms(), 100);
    }
}
