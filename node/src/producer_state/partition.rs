//! [`PartitionProducers`]: a partition's [`ProducerStateTable`] bound to its storage
//! [`Log`]: the idempotence check around each append, snapshots at segment roll and
//! clean shutdown, and the rebuild (newest snapshot + log replay) when the log opens.
//!
//! Lives beside the log on the partition's owning shard; `RefCell` borrows are never held
//! across an `.await`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::pin::pin;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use wire::batch::{BatchHeader, batch_records, control_batch, read_header};
use wire::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};

use super::{
    BatchMetadata, MarkerSeen, PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT,
    ProducerStateConfig, ProducerStateCounters, ProducerStateTable, Verdict, decode_snapshot,
    encode_snapshot, parse_snapshot_file_name, plan_recovery, snapshot_file_name,
};
use crate::event::Event;
use crate::storage::{
    AbortedTxn, AppendInfo, Log, StorageError, TxnIndex, write_atomic, write_atomic_synced_later,
};

/// Snapshots kept on disk: the newest plus spares in case it is damaged.
pub const SNAPSHOTS_KEPT: usize = 3;
/// Bytes per log read while replaying after the snapshot.
const REPLAY_READ_BYTES: usize = 1 << 20;
/// Kafka error code INVALID_RECORD: idempotent batches must come alone (see `append`).
const INVALID_RECORD: i16 = 87;

/// What happened to a Produce partition's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProducerAppend {
    /// Appended (new batches, or batches without a producer id).
    Appended(AppendInfo),
    /// A resend of a batch in the log: answer with these offsets, nothing was appended.
    Duplicate(BatchMetadata),
    /// Refused with this Kafka error code; nothing was appended.
    Rejected(i16),
}

/// A follower's append that failed ([`PartitionProducers::append_replicated`]) after
/// `appended` (the parts before the one that failed, if any) went into the log.
#[derive(Debug)]
pub struct ReplicatedAppendFailed {
    pub appended: Option<AppendInfo>,
    pub error: StorageError,
}

impl std::fmt::Display for ReplicatedAppendFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.appended {
            Some(a) => write!(
                f,
                "{} (after appending {}..={})",
                self.error, a.first_offset, a.last_offset
            ),
            None => write!(f, "{}", self.error),
        }
    }
}

/// A partition's producer state, tied to its log.
#[derive(Debug)]
pub struct PartitionProducers {
    table: RefCell<ProducerStateTable>,
    /// Aborted transactions (the `.txnindex` files), for read_committed fetches.
    aborted: RefCell<TxnIndex>,
    last_expiry_ms: Cell<i64>,
    /// The log's truncation count the table matches (see [`Log::truncations`]).
    log_truncations: Cell<u64>,
    /// Set while the state is being rebuilt after a truncation: appends wait for it.
    rebuilding: RefCell<Option<Rc<Event>>>,
    /// KIP-890 verifications under way here, by producer (see [`Verifying`]). An entry
    /// lives only while a [`Verifying`] holds it, so there are at most as many as
    /// transactional appends in flight; a marker of the producer ends it early.
    verifications: RefCell<HashMap<ProducerId, Verification>>,
    /// The next [`VerificationGuard`] handed out (never reused while the log is open).
    next_guard: Cell<u64>,
}

/// Names one KIP-890 verification of a producer's transactional append in one partition
/// (Kafka's `VerificationGuard`): taken before the coordinator is asked, checked right
/// before the append. A COMMIT or ABORT marker of the producer written here in between
/// ends the verification, so a batch (or a coordinator's transactional offset commit)
/// checked against a transaction that has since ended cannot append after its marker and
/// open a transaction no coordinator knows of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerificationGuard(u64);

/// One producer's verification under way (`PartitionProducers::verifications`).
#[derive(Clone, Copy, Debug)]
struct Verification {
    epoch: ProducerEpoch,
    guard: VerificationGuard,
    /// [`Verifying`]s alive for it (concurrent TxnOffsetCommits of one producer share it).
    holders: u32,
}

/// Holds a producer's verification open in a partition until dropped (see
/// [`PartitionProducers::begin_verification`]).
pub struct Verifying<'a> {
    producers: &'a PartitionProducers,
    producer_id: ProducerId,
    guard: VerificationGuard,
}

impl Verifying<'_> {
    /// The guard to check right before the append.
    pub fn guard(&self) -> VerificationGuard {
        self.guard
    }

    /// Whether no marker of the producer was written here since the verification began.
    pub fn holds(&self) -> bool {
        self.producers
            .verification_holds(self.producer_id, self.guard)
    }
}

impl Drop for Verifying<'_> {
    fn drop(&mut self) {
        let mut all = self.producers.verifications.borrow_mut();
        let Some(v) = all.get_mut(&self.producer_id) else {
            return;
        };
        // Another verification (a newer epoch's) or none: this one already ended.
        if v.guard != self.guard {
            return;
        }
        assert!(
            v.holders > 0,
            "verification of {} held by nobody",
            self.producer_id
        );
        v.holders -= 1;
        if v.holders == 0 {
            all.remove(&self.producer_id);
        }
    }
}

impl PartitionProducers {
    /// Rebuilds the state of an opened log: loads the newest usable snapshot (damaged
    /// ones are deleted and the next older tried) and replays the batches after it.
    pub async fn open(
        log: &Log,
        config: ProducerStateConfig,
        now_ms: i64,
    ) -> Result<PartitionProducers, StorageError> {
        let (mut table, replay_from) = load_newest_snapshot(log, config);
        let mut aborted = TxnIndex::load(log.dir(), log.log_end_offset());
        let replayed = replay(log, &mut table, &mut aborted, replay_from, now_ms).await?;
        tracing::debug!(
            dir = %log.dir().display(),
            producers = table.len(),
            replay_from = %replay_from,
            replayed,
            "producer state rebuilt"
        );
        Ok(PartitionProducers {
            table: RefCell::new(table),
            aborted: RefCell::new(aborted),
            last_expiry_ms: Cell::new(now_ms),
            log_truncations: Cell::new(log.truncations()),
            rebuilding: RefCell::new(None),
            verifications: RefCell::new(HashMap::new()),
            next_guard: Cell::new(1),
        })
    }

    /// Begins a KIP-890 verification of a transactional append of `producer_id` at
    /// `epoch` here, before its coordinator is asked; it holds until the returned value is
    /// dropped or a marker of the producer is written here, whichever comes first. A
    /// verification of the same epoch already under way is shared (its guard returned
    /// again); one of an older epoch is ended; one of a newer epoch stays, and this one
    /// never holds.
    pub fn begin_verification(
        &self,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
    ) -> Verifying<'_> {
        let mut all = self.verifications.borrow_mut();
        let fresh = VerificationGuard(self.next_guard.get());
        let v = all.entry(producer_id).or_insert(Verification {
            epoch,
            guard: fresh,
            holders: 0,
        });
        if v.epoch > epoch {
            // An older epoch (a fenced instance still committing) gets a guard that never
            // holds and leaves the current epoch's alone: Kafka only ever raises the
            // entry's epoch. Replacing it made the current instance's TxnOffsetCommit
            // fail with INVALID_TXN_STATE once the fenced one's ended.
            self.next_guard.set(fresh.0 + 1);
            return Verifying {
                producers: self,
                producer_id,
                guard: fresh,
            };
        }
        if v.epoch != epoch {
            *v = Verification {
                epoch,
                guard: fresh,
                holders: 0,
            };
        }
        if v.guard == fresh {
            self.next_guard.set(fresh.0 + 1);
        }
        v.holders += 1;
        Verifying {
            producers: self,
            producer_id,
            guard: v.guard,
        }
    }

    /// Whether the verification `guard` of `producer_id` still holds: begun here, not
    /// dropped, and no marker of the producer written since. Checked in the same
    /// synchronous step as the append it allows.
    pub fn verification_holds(&self, producer_id: ProducerId, guard: VerificationGuard) -> bool {
        self.verifications
            .borrow()
            .get(&producer_id)
            .is_some_and(|v| v.guard == guard)
    }

    /// Verifications under way here (each held by a transactional append in flight).
    pub fn verifications_open(&self) -> usize {
        self.verifications.borrow().len()
    }

    /// The first offset of `producer_id`'s open transaction here, if it has one.
    pub fn open_txn_first(&self, producer_id: ProducerId) -> Option<Offset> {
        self.table.borrow().ongoing_first(producer_id)
    }

    /// Checks the records' producer sequence and appends them unless they are a
    /// duplicate or refused. Records must be validated whole batches.
    ///
    /// Kafka allows exactly one batch per partition from Produce v3; weir accepts more
    /// only when none carries a producer id, and refuses an idempotent batch that is not
    /// alone with INVALID_RECORD, as Kafka does.
    pub async fn append(
        &self,
        log: &Log,
        records: BytesMut,
        epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Result<ProducerAppend, StorageError> {
        self.expire_if_due(now_ms);
        // Before any append, plain ones included: one appended at offsets a truncation
        // freed would hide the truncation from the rebuild's check below.
        self.follow_truncation(log, now_ms).await?;
        let (header, batches) = match idempotent_header(&records) {
            None => {
                return Ok(ProducerAppend::Appended(
                    log.append(records, epoch, now_ms).await?,
                ));
            }
            Some(found) => found,
        };
        if batches != 1 {
            return Ok(ProducerAppend::Rejected(INVALID_RECORD));
        }
        let verdict = self.table.borrow_mut().check(&header);
        match verdict {
            Err(rejection) => Ok(ProducerAppend::Rejected(rejection.error_code())),
            Ok(Verdict::Duplicate(original)) => Ok(ProducerAppend::Duplicate(original)),
            Ok(Verdict::Append | Verdict::NotIdempotent) => {
                let info = self
                    .append_checked(log, records, &header, epoch, now_ms)
                    .await?;
                Ok(ProducerAppend::Appended(info))
            }
        }
    }

    /// Appends a checked batch and records it. The log assigns offsets (and rolls) in the
    /// first poll of its append, synchronously; the batch is recorded right after that
    /// poll, before anything else runs on this shard, so the next batch of the producer
    /// is checked against it. A roll snapshots the state as of the new segment's base
    /// first, so the snapshot holds exactly the batches below its offset.
    async fn append_checked(
        &self,
        log: &Log,
        records: BytesMut,
        header: &BatchHeader,
        epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Result<AppendInfo, StorageError> {
        let first = log.log_end_offset();
        let segments = log.segment_count();
        let mut append = pin!(log.append(records, epoch, now_ms));
        let first_poll = futures_lite::future::poll_once(&mut append).await;
        if log.log_end_offset() > first {
            if log.segment_count() > segments {
                self.snapshot(log.dir(), first, false);
            }
            // As stored: with LogAppendTime the log stamped the append time as the batch's
            // max timestamp, which a resend of it is answered with (as in Kafka).
            let mut stored = *header;
            if log.config().message_timestamp_type == wire::batch::TimestampType::LogAppendTime {
                stored.max_timestamp.set(now_ms);
            }
            self.table
                .borrow_mut()
                .record_append(&stored, first, now_ms);
        }
        match first_poll {
            Some(result) => result,
            None => append.await,
        }
    }

    /// The broker's own append of a batch it built (a coordinator's transactional offset
    /// commit: producer id and epoch, no sequence): no sequence check, but the batch is
    /// recorded, so a transactional one opens the producer's transaction here.
    ///
    /// A producer epoch older than the one this partition knows is refused
    /// (INVALID_PRODUCER_EPOCH, nothing appended), as for markers: a fenced producer's
    /// late TxnOffsetCommit would open a transaction that no coordinator will ever end,
    /// holding the partition's LSO (and its compaction) forever.
    pub async fn append_unchecked(
        &self,
        log: &Log,
        records: BytesMut,
        epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Result<ProducerAppend, StorageError> {
        self.follow_truncation(log, now_ms).await?;
        let Some((header, 1)) = idempotent_header(&records) else {
            let info = log.append(records, epoch, now_ms).await?;
            return Ok(ProducerAppend::Appended(info));
        };
        let known = self
            .table
            .borrow()
            .get(header.producer_id())
            .map(|e| e.epoch());
        if known.is_some_and(|e| header.producer_epoch() < e) {
            return Ok(ProducerAppend::Rejected(super::INVALID_PRODUCER_EPOCH));
        }
        let info = self
            .append_checked(log, records, &header, epoch, now_ms)
            .await?;
        Ok(ProducerAppend::Appended(info))
    }

    /// A follower's append of its leader's batches: no check (the leader checked them),
    /// offsets kept, and every idempotent batch recorded as the leader recorded it, so the
    /// follower's table matches the leader's when it takes over.
    ///
    /// A fetched chunk larger than what a segment takes is appended in parts, cut at
    /// batch boundaries ([`Log::replica_parts`]), so the log rolls between them (with a
    /// snapshot at each new segment's base, as at any roll) instead of refusing the chunk
    /// and stalling the follower on it. Each part takes its offsets before the next one
    /// starts; their writes are awaited together. A part that fails ends the append
    /// there, and the error carries the parts before it, which the log holds: the
    /// caller accounts for them and fetches again from the log end. Before, those parts
    /// were answered as a success and the failure went unseen (no pause, no warning).
    /// The producer state then follows the log at once (a rollback or a truncation that
    /// cut the failed parts takes what they recorded), not at the next append.
    pub async fn append_replicated(
        &self,
        log: &Log,
        records: BytesMut,
        now_ms: i64,
    ) -> Result<AppendInfo, ReplicatedAppendFailed> {
        let failed = |error| ReplicatedAppendFailed {
            appended: None,
            error,
        };
        self.follow_truncation(log, now_ms).await.map_err(failed)?;
        let parts = log.replica_parts(&records).map_err(failed)?;
        let appended = if parts.len() == 1 {
            self.append_replicated_part(log, records, now_ms)
                .await
                .map_err(failed)
        } else {
            self.append_replicated_parts(log, records, parts, now_ms)
                .await
        };
        if appended.is_err()
            && let Err(e) = self.follow_truncation(log, now_ms).await
        {
            tracing::warn!(dir = %log.dir().display(), "producer state after a failed replicated append: {e}");
        }
        appended
    }

    /// [`append_replicated`](Self::append_replicated) of a chunk cut in `parts`.
    async fn append_replicated_parts(
        &self,
        log: &Log,
        mut records: BytesMut,
        parts: Vec<usize>,
        now_ms: i64,
    ) -> Result<AppendInfo, ReplicatedAppendFailed> {
        /// A part whose first poll took its offsets: done, or its write still awaited.
        enum Started<F> {
            Done(AppendInfo),
            Writing(F),
        }
        let mut started = Vec::with_capacity(parts.len());
        let mut failed = None;
        for len in parts {
            let part = records.split_to(len);
            let mut append = Box::pin(self.append_replicated_part(log, part, now_ms));
            match futures_lite::future::poll_once(&mut append).await {
                // Refused (or failed at once): the parts after it would not continue the
                // log.
                Some(Err(e)) => {
                    failed = Some(e);
                    break;
                }
                Some(Ok(info)) => started.push(Started::Done(info)),
                None => started.push(Started::Writing(append)),
            }
        }
        let mut appended: Option<AppendInfo> = None;
        for part in started {
            let done = match part {
                Started::Done(info) => Ok(info),
                Started::Writing(append) => append.await,
            };
            match done {
                Ok(info) => appended = Some(appended.map_or(info, |a| a.followed_by(&info))),
                // A write cut by a rollback takes the later parts' bytes with it.
                Err(e) => {
                    failed.get_or_insert(e);
                    break;
                }
            }
        }
        match failed {
            None => appended.ok_or(ReplicatedAppendFailed {
                appended: None,
                error: StorageError::InvalidBatch {
                    position: 0,
                    reason: "no batches".into(),
                },
            }),
            Some(error) => Err(ReplicatedAppendFailed { appended, error }),
        }
    }

    /// One part of [`append_replicated`](Self::append_replicated): at most what a segment
    /// takes, or a single batch. Its first poll appends it in memory and records its
    /// batches; the rest waits for the write.
    async fn append_replicated_part(
        &self,
        log: &Log,
        records: BytesMut,
        now_ms: i64,
    ) -> Result<AppendInfo, StorageError> {
        let headers: Vec<(BatchHeader, Option<(bool, i32)>)> = batch_headers(&records)
            .into_iter()
            .zip(marker_types(&records))
            .collect();
        let first = log.log_end_offset();
        let segments = log.segment_count();
        let mut append = pin!(log.append_keeping_offsets(records, now_ms));
        let first_poll = futures_lite::future::poll_once(&mut append).await;
        if log.log_end_offset() > first {
            if log.segment_count() > segments {
                self.snapshot(log.dir(), first, false);
            }
            let mut table = self.table.borrow_mut();
            for (h, commit) in &headers {
                table.record_append(h, h.base_offset(), now_ms);
                if let Some((commit, coordinator_epoch)) = *commit {
                    let seen = MarkerSeen {
                        producer_epoch: h.producer_epoch(),
                        coordinator_epoch,
                    };
                    let done = table.complete_txn(h.producer_id(), seen, h.base_offset(), now_ms);
                    if let (false, Some(done)) = (commit, done) {
                        let lso = table.first_unstable_offset().unwrap_or(h.next_offset());
                        self.record_abort(log, done, lso);
                    }
                    self.verifications.borrow_mut().remove(&h.producer_id());
                }
            }
        }
        match first_poll {
            Some(result) => result,
            None => append.await,
        }
    }

    /// Appends a COMMIT (`commit`) or ABORT marker for `producer_id` — a control batch in
    /// Kafka's format — and closes the producer's open transaction here; an aborted one is
    /// recorded in the segment's `.txnindex`. The producer's epoch in the marker must not
    /// be older than the one this partition knows (else INVALID_PRODUCER_EPOCH, nothing
    /// appended). Returns the marker's offset.
    pub async fn append_marker(
        &self,
        log: &Log,
        marker: Marker,
        epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Result<Result<Offset, i16>, StorageError> {
        self.follow_truncation(log, now_ms).await?;
        let known = self
            .table
            .borrow()
            .get(marker.producer_id)
            .map(|e| e.epoch());
        if known.is_some_and(|e| marker.producer_epoch < e) {
            return Ok(Err(super::INVALID_PRODUCER_EPOCH));
        }
        if self
            .table
            .borrow()
            .is_stale_coordinator(marker.producer_id, marker.coordinator_epoch)
        {
            return Ok(Err(crate::errors::TRANSACTION_COORDINATOR_FENCED));
        }
        let batch = control_batch(
            marker.producer_id,
            marker.producer_epoch,
            marker.commit,
            marker.coordinator_epoch,
            now_ms,
        );
        let Ok(batch) = batch else {
            return Ok(Err(crate::errors::UNKNOWN_SERVER_ERROR));
        };
        let first = log.log_end_offset();
        let segments = log.segment_count();
        let mut append = pin!(log.append(BytesMut::from(&batch[..]), epoch, now_ms));
        let first_poll = futures_lite::future::poll_once(&mut append).await;
        if log.log_end_offset() > first {
            if log.segment_count() > segments {
                self.snapshot(log.dir(), first, false);
            }
            let (done, lso) = {
                let mut table = self.table.borrow_mut();
                let seen = MarkerSeen {
                    producer_epoch: marker.producer_epoch,
                    coordinator_epoch: marker.coordinator_epoch,
                };
                let done = table.complete_txn(marker.producer_id, seen, first, now_ms);
                (done, table.first_unstable_offset().unwrap_or(first.add(1)))
            };
            // In the step that gave the marker its offset: an append verified before it
            // (KIP-890) must not land after it.
            self.verifications.borrow_mut().remove(&marker.producer_id);
            if let (false, Some(done)) = (marker.commit, done) {
                self.record_abort(log, done, lso);
            }
        }
        match first_poll {
            Some(result) => result?,
            None => append.await?,
        };
        Ok(Ok(first))
    }

    /// Writes an aborted transaction to the txn index of the active segment. A failed
    /// write is logged: the entry is in memory, and a restart's replay adds it back only
    /// if the marker is after the snapshot, so it is worth a loud line.
    fn record_abort(&self, log: &Log, done: super::table::CompletedTxn, lso: Offset) {
        let txn = AbortedTxn {
            producer_id: done.producer_id,
            first_offset: done.first_offset,
            last_offset: done.last_offset,
            last_stable_offset: lso,
        };
        let base = log
            .segment_bases()
            .last()
            .copied()
            .unwrap_or(done.last_offset);
        if let Err(e) = self.aborted.borrow_mut().append(log.dir(), base, txn) {
            tracing::error!(dir = %log.dir().display(), "cannot write txn index: {e}");
        }
    }

    /// Whether `producer_id` has a transaction open in this partition.
    pub fn has_open_txn(&self, producer_id: ProducerId) -> bool {
        self.table.borrow().has_ongoing(producer_id)
    }

    /// Whether `producer_id` has a transaction open in this partition under `epoch` (a
    /// batch of another epoch is not part of it: Kafka's `hasOngoingTransaction`).
    pub fn has_open_txn_at(&self, producer_id: ProducerId, epoch: ProducerEpoch) -> bool {
        let table = self.table.borrow();
        table.has_ongoing(producer_id) && table.get(producer_id).is_some_and(|e| e.epoch() == epoch)
    }

    /// The first offset of the oldest open transaction in this partition.
    pub fn first_unstable_offset(&self) -> Option<Offset> {
        self.table.borrow().first_unstable_offset()
    }

    /// Aborted transactions overlapping `[from, upper)` (see [`TxnIndex::overlapping`]).
    pub fn aborted_overlapping(&self, from: Offset, upper: Offset) -> Vec<(ProducerId, Offset)> {
        self.aborted.borrow().overlapping(from, upper)
    }

    /// Aborted transactions overlapping `[from, upper)`, with their marker offsets (the
    /// log cleaner's [`crate::storage::CleanBounds`]).
    pub fn aborted_txns(&self, from: Offset, upper: Offset) -> Vec<AbortedTxn> {
        self.aborted.borrow().entries_overlapping(from, upper)
    }

    /// Whether the log was cut since the state last followed it (one counter compare).
    pub fn behind(&self, log: &Log) -> bool {
        log.truncations() != self.log_truncations.get()
    }

    /// After the log end moved back — a follower's truncation, a restart at the leader's
    /// log start, an out-of-space rollback — rebuilds the state from the log as it now
    /// is (Kafka's rule), before anything is checked or recorded against it. Forgetting
    /// only what lies past the cut is not enough: a transaction whose marker was cut is
    /// open again, and it must be, or the marker its coordinator writes again closes
    /// nothing and an aborted transaction's records read as committed. Appends call this
    /// first; truncations call it at once, so that a replica that leads next answers
    /// read_committed fetches from the rebuilt state. One rebuild at a time: the others
    /// wait for it, then check again.
    pub async fn follow_truncation(&self, log: &Log, now_ms: i64) -> Result<(), StorageError> {
        loop {
            let seen = log.truncations();
            if seen == self.log_truncations.get() {
                return Ok(());
            }
            let busy = self.rebuilding.borrow().clone();
            if let Some(done) = busy {
                done.listen().await;
                continue;
            }
            let done = Rc::new(Event::default());
            *self.rebuilding.borrow_mut() = Some(done.clone());
            // Cleared and announced however the rebuild ends, dropped mid-way included:
            // else every later append would wait for it forever.
            let guard = RebuildGuard {
                slot: &self.rebuilding,
                done,
            };
            let rebuilt = self.rebuild(log, now_ms).await;
            drop(guard);
            rebuilt?;
            self.log_truncations.set(seen);
        }
    }

    /// The newest snapshot at or below the log end, then the batches after it, as at
    /// open; snapshots past the end go, and `.txnindex` entries past it are dropped from
    /// the files too (`TxnIndex::load`). An emptied log (a restart at the leader's log
    /// start) keeps nothing, as Kafka's `truncateFullyAndStartAt`.
    async fn rebuild(&self, log: &Log, now_ms: i64) -> Result<(), StorageError> {
        let (start, end) = (log.log_start_offset(), log.log_end_offset());
        for offset in list_snapshots(log.dir()) {
            if offset > end || start == end {
                remove_snapshot(log.dir(), offset);
            }
        }
        let config = *self.table.borrow().config();
        let (mut table, from) = load_newest_snapshot(log, config);
        let mut aborted = TxnIndex::load(log.dir(), end);
        let replayed = replay(log, &mut table, &mut aborted, from, now_ms).await?;
        tracing::info!(
            dir = %log.dir().display(),
            end = %end,
            producers = table.len(),
            replay_from = %from,
            replayed,
            "producer state rebuilt after the log was cut"
        );
        *self.table.borrow_mut() = table;
        *self.aborted.borrow_mut() = aborted;
        Ok(())
    }

    /// Writes a snapshot at `offset` (the log end offset now) and prunes old ones.
    /// Failure only costs a longer replay at the next open, so it is logged, not fatal.
    /// `durable_now`: fsynced before returning (a clean shutdown's); else fsynced in the
    /// background (a roll's, on the append path).
    pub fn snapshot(&self, dir: &Path, offset: Offset, durable_now: bool) {
        let bytes = encode_snapshot(&self.table.borrow(), offset);
        let path = dir.join(snapshot_file_name(offset));
        let written = if durable_now {
            write_atomic(&path, &bytes)
        } else {
            write_atomic_synced_later(&path, &bytes)
        };
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), "producer state snapshot failed: {e}");
            return;
        }
        let mut offsets = list_snapshots(dir);
        offsets.sort_unstable_by(|a, b| b.cmp(a));
        for old in offsets.into_iter().skip(SNAPSHOTS_KEPT) {
            remove_snapshot(dir, old);
        }
    }

    /// Clean shutdown: a snapshot at the log end, so the next open replays nothing. Not
    /// while the table is behind a cut it has not rebuilt from (an out-of-space rollback
    /// with no append since): the table may hold what the cut removed (a transaction its
    /// rolled-back marker closed), and a snapshot at the log end would keep it for good;
    /// the next open replays from an older snapshot instead (found by review).
    pub fn close(&self, log: &Log) {
        if self.behind(log) {
            tracing::info!(dir = %log.dir().display(), "producer state behind a cut of its log: no snapshot at close, the next open replays");
        } else {
            self.snapshot(log.dir(), log.log_end_offset(), true);
        }
        let c = self.counters();
        if c != ProducerStateCounters::default() {
            tracing::info!(
                dir = %log.dir().display(),
                duplicates_dropped = c.duplicates_dropped,
                out_of_order_rejections = c.out_of_order_rejections,
                fenced_requests = c.fenced_requests,
                unknown_producer_rejections = c.unknown_producer_rejections,
                producers_expired = c.producers_expired,
                producers_evicted = c.producers_evicted,
                "producer state counters"
            );
        }
    }

    fn expire_if_due(&self, now_ms: i64) {
        if now_ms - self.last_expiry_ms.get() < PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT {
            return;
        }
        self.last_expiry_ms.set(now_ms);
        let removed = self.table.borrow_mut().expire(now_ms);
        if removed > 0 {
            tracing::debug!(removed, "expired idle producer ids");
        }
    }

    pub fn counters(&self) -> ProducerStateCounters {
        self.table.borrow().counters()
    }

    /// The producers this partition keeps state for, in producer-id order, as
    /// DescribeProducers (KIP-664) lists them. At most `max` of them.
    pub fn active(&self, max: usize) -> Vec<ActiveProducer> {
        let table = self.table.borrow();
        let mut all: Vec<ActiveProducer> = table
            .iter()
            .map(|(producer_id, e)| {
                let last = e.last_batch();
                ActiveProducer {
                    producer_id,
                    epoch: e.epoch(),
                    last_sequence: last.map_or(Sequence::NONE, |b| b.last_sequence),
                    last_timestamp: last.map_or(-1, |b| b.max_timestamp),
                    coordinator_epoch: e.coordinator_epoch(),
                    txn_start: table.ongoing_first(producer_id),
                }
            })
            .collect();
        all.sort_unstable_by_key(|p| p.producer_id);
        all.truncate(max);
        all
    }

    /// A copy of the table, for tests and inspection.
    pub fn table(&self) -> ProducerStateTable {
        self.table.borrow().clone()
    }
}

/// One producer's state in a partition, as DescribeProducers answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: ProducerId,
    pub epoch: ProducerEpoch,
    /// The last sequence of its last batch here (`Sequence::NONE`: none, only a marker).
    pub last_sequence: Sequence,
    /// The max timestamp of that batch (-1: none).
    pub last_timestamp: i64,
    /// The newest coordinator epoch of its markers here (-1: none).
    pub coordinator_epoch: i32,
    /// Where its open transaction here began, if one is open.
    pub txn_start: Option<Offset>,
}

/// Marks a rebuild in progress (`PartitionProducers::rebuilding`) until dropped.
struct RebuildGuard<'a> {
    slot: &'a RefCell<Option<Rc<Event>>>,
    done: Rc<Event>,
}

impl Drop for RebuildGuard<'_> {
    fn drop(&mut self) {
        self.slot.borrow_mut().take();
        self.done.notify_all();
    }
}

/// The first batch's header if any batch of `records` has a producer id, with the number
/// of batches. Records were validated by the caller; a header that cannot be read ends
/// the walk (the log's own check refuses such records).
fn idempotent_header(records: &[u8]) -> Option<(BatchHeader, usize)> {
    let mut pos = 0usize;
    let mut batches = 0usize;
    let mut first: Option<BatchHeader> = None;
    let mut idempotent = false;
    while pos < records.len() {
        let Ok(h) = read_header(&records[pos..]) else {
            break;
        };
        idempotent |= h.producer_id().is_some();
        first.get_or_insert(*h);
        batches += 1;
        pos += h.total_size().max(1);
    }
    if idempotent {
        first.map(|h| (h, batches))
    } else {
        None
    }
}

/// A transaction marker to append (see [`PartitionProducers::append_marker`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    /// COMMIT (true) or ABORT (false).
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Largest control batch decoded to read its marker type.
const CONTROL_BATCH_MAX_BYTES: usize = 4096;

/// For a control batch: `Some(true)` for a COMMIT marker, `Some(false)` for ABORT (the
/// record key: version int16, type int16 — 0 abort, 1 commit); `None` for a data batch or
/// a control record of another type.
pub fn marker_type(batch: &Bytes) -> Option<bool> {
    read_marker(batch).map(|(commit, _)| commit)
}

/// A marker batch's type (see [`marker_type`]) and coordinator epoch (the record value:
/// version int16, coordinator epoch int32; -1 when the value is missing or short).
fn read_marker(batch: &Bytes) -> Option<(bool, i32)> {
    let header = read_header(batch).ok()?;
    if !header.attributes().is_control() {
        return None;
    }
    let (_, mut records) = batch_records(batch, CONTROL_BATCH_MAX_BYTES).ok()?;
    let record = records.next()?.ok()?;
    let commit = match record.key?.get(2..4)? {
        [0, 0] => false,
        [0, 1] => true,
        _ => return None,
    };
    let coordinator_epoch = record
        .value
        .as_ref()
        .and_then(|v| v.get(2..6))
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(-1, i32::from_be_bytes);
    Some((commit, coordinator_epoch))
}

/// [`read_marker`] of each whole batch in `records`. Only control batches (a few dozen
/// bytes each) are copied out to be decoded: a follower's append passes whole fetch
/// responses through here, and copying those cost as much as the append's own copy.
fn marker_types(records: &[u8]) -> Vec<Option<(bool, i32)>> {
    let mut pos = 0usize;
    let mut out = Vec::new();
    while pos < records.len() {
        let Ok(h) = read_header(&records[pos..]) else {
            break;
        };
        let size = h.total_size().max(1);
        let end = (pos + size).min(records.len());
        out.push(if h.attributes().is_control() {
            read_marker(&Bytes::copy_from_slice(&records[pos..end]))
        } else {
            None
        });
        pos += size;
    }
    out
}

/// The headers of the whole batches in `records`.
fn batch_headers(records: &[u8]) -> Vec<BatchHeader> {
    let mut pos = 0usize;
    let mut out = Vec::new();
    while pos < records.len() {
        let Ok(h) = read_header(&records[pos..]) else {
            break;
        };
        out.push(*h);
        pos += h.total_size().max(1);
    }
    out
}

/// Applies the recovery table (see `snapshot`): returns the loaded (or empty) table and
/// the offset to replay from.
fn load_newest_snapshot(log: &Log, config: ProducerStateConfig) -> (ProducerStateTable, Offset) {
    let dir = log.dir();
    remove_temp_snapshots(dir);
    let mut offsets = list_snapshots(dir);
    // Each round removes one snapshot from the candidates, so this ends.
    loop {
        let plan = plan_recovery(
            &offsets,
            log.log_start_offset(),
            log.log_end_offset(),
            SNAPSHOTS_KEPT,
        );
        for stale in &plan.delete {
            remove_snapshot(dir, *stale);
        }
        let Some(offset) = plan.load else {
            return (ProducerStateTable::new(config), plan.replay_from);
        };
        let path = dir.join(snapshot_file_name(offset));
        let loaded = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| decode_snapshot(&b, offset, config).map_err(|e| e.to_string()));
        match loaded {
            Ok(table) => return (table, plan.replay_from),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring producer state snapshot: {e}");
                remove_snapshot(dir, offset);
                offsets.retain(|o| *o != offset && !plan.delete.contains(o));
            }
        }
    }
}

/// Feeds every batch in `[from, log end)` to the table. Returns how many were read.
async fn replay(
    log: &Log,
    table: &mut ProducerStateTable,
    aborted: &mut TxnIndex,
    from: Offset,
    now_ms: i64,
) -> Result<u64, StorageError> {
    let end = log.log_end_offset();
    let mut next = from;
    let mut batches = 0u64;
    // Each read returns at least one batch (one offset) or ends the loop.
    while next < end {
        let read = log.read(next, REPLAY_READ_BYTES, end).await?;
        if read.batches.is_empty() || read.next_offset <= next {
            tracing::warn!(at = %next, end = %end, "producer state replay stopped early");
            break;
        }
        for batch in &read.batches {
            if let Ok(h) = read_header(batch) {
                table.replay(h, now_ms);
                batches += 1;
                let Some((commit, coordinator_epoch)) = read_marker(batch) else {
                    continue;
                };
                let seen = MarkerSeen {
                    producer_epoch: h.producer_epoch(),
                    coordinator_epoch,
                };
                let done = table.complete_txn(h.producer_id(), seen, h.base_offset(), now_ms);
                if let (false, Some(done)) = (commit, done) {
                    let lso = table.first_unstable_offset().unwrap_or(h.next_offset());
                    let txn = AbortedTxn {
                        producer_id: done.producer_id,
                        first_offset: done.first_offset,
                        last_offset: done.last_offset,
                        last_stable_offset: lso,
                    };
                    // Missing from the files (lost in a crash): written back.
                    if aborted.insert(txn) {
                        let base = segment_of(log, done.last_offset);
                        if let Err(e) = aborted.append(log.dir(), base, txn) {
                            tracing::warn!("cannot rewrite txn index entry: {e}");
                        }
                    }
                }
            }
        }
        next = read.next_offset;
    }
    Ok(batches)
}

/// Base offset of the segment holding `offset`.
fn segment_of(log: &Log, offset: Offset) -> Offset {
    let bases = log.segment_bases();
    bases
        .iter()
        .rev()
        .find(|b| **b <= offset)
        .copied()
        .unwrap_or(offset)
}

fn list_snapshots(dir: &Path) -> Vec<Offset> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(parse_snapshot_file_name))
        .collect()
}

/// Removes `*.snapshot.tmp` left by a crash in the middle of an atomic write.
fn remove_temp_snapshots(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let is_temp = name
            .to_str()
            .and_then(|n| n.strip_suffix(".tmp"))
            .and_then(parse_snapshot_file_name)
            .is_some();
        if is_temp && let Err(e) = std::fs::remove_file(entry.path()) {
            tracing::warn!(path = %entry.path().display(), "cannot delete temp snapshot: {e}");
        }
    }
}

fn remove_snapshot(dir: &Path, offset: Offset) {
    let path = dir.join(snapshot_file_name(offset));
    if let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), "cannot delete producer state snapshot: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::testing::build_batch;
    use wire::{ProducerEpoch, ProducerId};

    #[test]
    fn marker_types_reads_each_control_batch_and_skips_data() {
        let marker = |commit| {
            control_batch(
                ProducerId(9),
                ProducerEpoch(1),
                commit,
                0,
                1_700_000_000_000,
            )
            .expect("a control batch")
        };
        let mut records = build_batch(1_700_000_000_000, &[b"a", b"bb"]);
        records.extend_from_slice(&marker(true));
        records.extend_from_slice(&build_batch(1_700_000_000_001, &[b"c"]));
        records.extend_from_slice(&marker(false));
        assert_eq!(
            marker_types(&records),
            vec![None, Some((true, 0)), None, Some((false, 0))]
        );
        // A cut-off last batch ends the list at the last whole header.
        let cut = records.len() - 3;
        assert_eq!(marker_types(&records[..cut]).len(), 4);
        assert!(marker_types(&records[..10]).is_empty());
    }
}
