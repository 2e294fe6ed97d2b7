//! One transactional id's state machine (Kafka's `TransactionMetadata`), pure: no I/O,
//! time passed in. The coordinator persists each new state before it acts on it.
//!
//! | state          | AddPartitions / AddOffsets       | EndTxn(commit)            | EndTxn(abort)            |
//! |----------------|----------------------------------|---------------------------|--------------------------|
//! | Empty          | → Ongoing                        | INVALID_TXN_STATE         | INVALID_TXN_STATE        |
//! | Ongoing        | → Ongoing (more partitions)      | → PrepareCommit           | → PrepareAbort           |
//! | PrepareCommit  | CONCURRENT_TRANSACTIONS          | CONCURRENT_TRANSACTIONS   | INVALID_TXN_STATE        |
//! | PrepareAbort   | CONCURRENT_TRANSACTIONS          | INVALID_TXN_STATE         | CONCURRENT_TRANSACTIONS  |
//! | CompleteCommit | → Ongoing                        | done (a retry)            | INVALID_TXN_STATE        |
//! | CompleteAbort  | → Ongoing                        | INVALID_TXN_STATE         | done (a retry)           |
//!
//! Prepare* → Complete* once every partition has its marker. A request with another
//! producer id gets INVALID_PRODUCER_ID_MAPPING, with another epoch PRODUCER_FENCED. An
//! AddPartitions that would take a transaction past [`PARTITIONS_MAX`] partitions adds
//! none and gets INVALID_REQUEST (Kafka has no such bound; its clients take an unexpected
//! code there as an abortable error, so the producer aborts and goes on).

use std::collections::BTreeSet;

use wire::{ProducerEpoch, ProducerId};

use crate::errors;

/// Most partitions one transaction may hold: what one stored value of it may list (the
/// log's reader refuses more, `schema::decode_value`).
pub const PARTITIONS_MAX: usize = 100_000;

/// Kafka's transaction states, with their `transaction_status` codes in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    pub fn code(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_code(code: i8) -> Option<TxnState> {
        Some(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name DescribeTransactions / ListTransactions show.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Markers are being written: the transaction is ending.
    pub fn is_preparing(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// A transactional id's metadata, as stored in `__transaction_state`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMetadata {
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// Partitions in the current transaction.
    pub partitions: BTreeSet<(String, i32)>,
    pub last_update_ms: i64,
    /// When the current transaction began (its first AddPartitions); -1 when none.
    pub start_ms: i64,
    /// The producer id and epoch that an InitProducerId naming them bumped from (KIP-360's
    /// `lastProducerEpoch`): a retry of that call, whose answer was lost, gets the current
    /// id and epoch again instead of PRODUCER_FENCED. `None` after any other bump (a new
    /// instance, a fence), so a zombie's retry stays fenced. Kept in memory only: Kafka's
    /// v0 value has no field for it, so a retry that spans a coordinator move is fenced.
    pub bumped_from: Option<(ProducerId, ProducerEpoch)>,
}

/// What an EndTxn leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndDecision {
    /// Persist this Prepare* state, write the markers, then complete.
    Prepare(TxnMetadata),
    /// The transaction already ended this way (a retried EndTxn): answer NONE.
    AlreadyDone,
}

impl TxnMetadata {
    /// A new transactional id, with no transaction.
    pub fn empty(
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        timeout_ms: i32,
        now_ms: i64,
    ) -> TxnMetadata {
        TxnMetadata {
            producer_id,
            producer_epoch,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            last_update_ms: now_ms,
            start_ms: -1,
            bumped_from: None,
        }
    }

    /// Whether an InitProducerId naming `(pid, epoch)` retries the one that made the
    /// current epoch, with no transaction of the current epoch open.
    pub fn is_init_retry(&self, pid: ProducerId, epoch: ProducerEpoch) -> bool {
        self.bumped_from == Some((pid, epoch))
            && matches!(
                self.state,
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
            )
    }

    /// The request's producer id and epoch must be the current ones.
    pub fn check_producer(&self, pid: ProducerId, epoch: ProducerEpoch) -> Result<(), i16> {
        if pid != self.producer_id {
            return Err(errors::INVALID_PRODUCER_ID_MAPPING);
        }
        if epoch != self.producer_epoch {
            return Err(errors::PRODUCER_FENCED);
        }
        Ok(())
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn: `None` when nothing changes (all already in
    /// an ongoing transaction: no write needed).
    pub fn add_partitions(
        &self,
        pid: ProducerId,
        epoch: ProducerEpoch,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<Option<TxnMetadata>, i16> {
        self.check_producer(pid, epoch)?;
        if self.state.is_preparing() || self.state == TxnState::PrepareEpochFence {
            return Err(errors::CONCURRENT_TRANSACTIONS);
        }
        if self.state == TxnState::Dead {
            return Err(errors::INVALID_PRODUCER_ID_MAPPING);
        }
        let ongoing = self.state == TxnState::Ongoing;
        if ongoing && partitions.iter().all(|p| self.partitions.contains(p)) {
            return Ok(None);
        }
        let mut next = self.clone();
        if !ongoing {
            next.partitions.clear();
            next.start_ms = now_ms;
        }
        next.state = TxnState::Ongoing;
        next.partitions.extend(partitions.iter().cloned());
        // Never a state the log's reader refuses (`schema::decode_value`): a replay would
        // skip it and an older state of the id win (a Prepare* lost behind an Ongoing).
        // Nothing is added; the producer aborts the transaction.
        if next.partitions.len() > PARTITIONS_MAX {
            return Err(errors::INVALID_REQUEST);
        }
        next.last_update_ms = now_ms;
        Ok(Some(next))
    }

    /// EndTxn: commit or abort.
    pub fn end(
        &self,
        pid: ProducerId,
        epoch: ProducerEpoch,
        commit: bool,
        now_ms: i64,
    ) -> Result<EndDecision, i16> {
        self.check_producer(pid, epoch)?;
        match (self.state, commit) {
            (TxnState::Ongoing, _) => Ok(EndDecision::Prepare(self.prepare(commit, now_ms))),
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
                Ok(EndDecision::AlreadyDone)
            }
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                Err(errors::CONCURRENT_TRANSACTIONS)
            }
            _ => Err(errors::INVALID_TXN_STATE),
        }
    }

    /// The Prepare* state of ending the ongoing transaction.
    pub fn prepare(&self, commit: bool, now_ms: i64) -> TxnMetadata {
        debug_assert_eq!(self.state, TxnState::Ongoing);
        let mut next = self.clone();
        next.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        next.last_update_ms = now_ms;
        next
    }

    /// Every marker is written: Complete*, no partitions.
    pub fn complete(&self, now_ms: i64) -> TxnMetadata {
        assert!(self.state.is_preparing(), "complete from {:?}", self.state);
        let mut next = self.clone();
        next.state = if self.state == TxnState::PrepareCommit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        next.partitions.clear();
        next.last_update_ms = now_ms;
        next.start_ms = -1;
        next
    }

    /// Whether the id may be forgotten at `now` (Kafka's `removeExpiredTransactionalIds`):
    /// no transaction open or ending, and no change for `expiration_ms`
    /// (`transactional.id.expiration.ms`).
    pub fn expired(&self, now_ms: i64, expiration_ms: i64) -> bool {
        matches!(
            self.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        ) && self.last_update_ms <= now_ms.saturating_sub(expiration_ms)
    }

    /// An ongoing transaction older than its timeout.
    pub fn timed_out(&self, now_ms: i64) -> bool {
        self.state == TxnState::Ongoing
            && self.start_ms >= 0
            && now_ms.saturating_sub(self.start_ms) > i64::from(self.timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> TxnMetadata {
        TxnMetadata::empty(ProducerId(7), ProducerEpoch(1), 1000, 0)
    }

    #[test]
    fn a_transaction_runs_through_kafkas_states() {
        let m = meta();
        let parts = [("t".to_string(), 0)];
        assert_eq!(
            m.end(ProducerId(7), ProducerEpoch(1), true, 1),
            Err(errors::INVALID_TXN_STATE)
        );
        let m = m
            .add_partitions(ProducerId(7), ProducerEpoch(1), &parts, 5)
            .unwrap()
            .unwrap();
        assert_eq!((m.state, m.start_ms), (TxnState::Ongoing, 5));
        assert_eq!(
            m.add_partitions(ProducerId(7), ProducerEpoch(1), &parts, 6),
            Ok(None)
        );
        let EndDecision::Prepare(p) = m.end(ProducerId(7), ProducerEpoch(1), true, 7).unwrap()
        else {
            panic!("prepare expected");
        };
        assert_eq!(p.state, TxnState::PrepareCommit);
        assert_eq!(
            p.add_partitions(ProducerId(7), ProducerEpoch(1), &parts, 8),
            Err(errors::CONCURRENT_TRANSACTIONS)
        );
        let c = p.complete(9);
        assert_eq!(c.state, TxnState::CompleteCommit);
        assert!(c.partitions.is_empty());
        assert_eq!(
            c.end(ProducerId(7), ProducerEpoch(1), true, 10),
            Ok(EndDecision::AlreadyDone)
        );
        assert_eq!(
            c.end(ProducerId(7), ProducerEpoch(1), false, 10),
            Err(errors::INVALID_TXN_STATE)
        );
    }

    #[test]
    fn other_producers_and_old_epochs_are_refused() {
        let m = meta();
        let parts = [("t".to_string(), 0)];
        assert_eq!(
            m.add_partitions(ProducerId(8), ProducerEpoch(1), &parts, 1),
            Err(errors::INVALID_PRODUCER_ID_MAPPING)
        );
        assert_eq!(
            m.add_partitions(ProducerId(7), ProducerEpoch(0), &parts, 1),
            Err(errors::PRODUCER_FENCED)
        );
    }

    #[test]
    fn only_an_id_with_no_transaction_open_or_ending_expires() {
        let parts = [("t".to_string(), 0)];
        assert!(!meta().expired(99, 100));
        assert!(meta().expired(100, 100));
        let ongoing = meta()
            .add_partitions(ProducerId(7), ProducerEpoch(1), &parts, 0)
            .unwrap()
            .unwrap();
        assert!(!ongoing.expired(1_000_000, 100));
        let preparing = ongoing.prepare(true, 0);
        assert!(!preparing.expired(1_000_000, 100));
        assert!(preparing.complete(0).expired(100, 100));
    }

    /// AddPartitions stops at the partitions a stored value may list (past them, the
    /// value was written and the replay skipped it): nothing of a request that would go
    /// past is added, and the transaction stays as it was.
    #[test]
    fn a_transaction_does_not_grow_past_what_its_stored_value_holds() {
        let (pid, epoch) = (ProducerId(7), ProducerEpoch(1));
        let most: Vec<(String, i32)> = (0..PARTITIONS_MAX as i32)
            .map(|i| ("t".to_string(), i))
            .collect();
        let full = meta()
            .add_partitions(pid, epoch, &most, 1)
            .expect("up to the bound")
            .expect("a new state");
        assert_eq!(full.partitions.len(), PARTITIONS_MAX);
        let one_more = [("u".to_string(), 0)];
        assert_eq!(
            full.add_partitions(pid, epoch, &one_more, 2),
            Err(errors::INVALID_REQUEST)
        );
        // Partitions it holds already still verify as added: nothing to write.
        assert_eq!(full.add_partitions(pid, epoch, &most[..3], 2), Ok(None));
        let past = [most.as_slice(), &one_more].concat();
        assert_eq!(
            meta().add_partitions(pid, epoch, &past, 1),
            Err(errors::INVALID_REQUEST),
            "a first request past the bound too"
        );
    }

    #[test]
    fn only_an_ongoing_transaction_times_out() {
        let m = meta()
            .add_partitions(ProducerId(7), ProducerEpoch(1), &[("t".to_string(), 0)], 10)
            .unwrap()
            .unwrap();
        assert!(!m.timed_out(1010));
        assert!(m.timed_out(1011));
        assert!(!meta().timed_out(1_000_000));
    }
}
