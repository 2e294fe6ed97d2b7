//! Reads from a partition replica: Fetch for consumers (up to the HW, on the leader, or on
//! a follower up to the HW it learned: KIP-392) and for followers (up to the leader's log
//! end, recording the follower's progress, which may move the HW), with the request's
//! leader epoch checked (KIP-320); ListOffsets and DeleteRecords.

use bytes::Bytes;
use wire::{BrokerEpoch, LeaderEpoch, NodeId, Offset, ProducerId};

use super::replica::EpochCheck;
use super::{Partition, storage_error_code};
use crate::errors;
use crate::storage::StorageError;

/// Largest decompressed batch ListOffsets-by-time will look inside: any stored batch.
const DECOMPRESSED_BATCH_MAX_BYTES: usize = crate::storage::cleaner::STORED_DECOMPRESSED_BYTES_MAX;
/// Batches a ListOffsets-by-time passes over, after the one the time index found, before
/// it settles for the index's answer.
const TIME_SCAN_BATCHES_MAX: usize = 64;
/// How often DeleteRecords waiting for the low watermark looks again without a follower's
/// fetch waking it (a follower's node fenced meanwhile no longer counts).
const LOW_WATERMARK_RECHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// A consumer's `isolation_level`: read_uncommitted reads up to the HW, read_committed up
/// to the LSO (the first offset of the oldest open transaction, at most the HW).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    #[default]
    ReadUncommitted,
    ReadCommitted,
}

/// Who reads: a consumer (Fetch `replica_id` -1) or a follower replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFor {
    Consumer(Isolation),
    /// A follower's fetch: its node and the broker epoch of its process.
    Follower(NodeId, BrokerEpoch),
}

/// Result of one Fetch partition read.
#[derive(Clone, Debug)]
pub struct FetchOutcome {
    pub error: i16,
    pub high_watermark: Offset,
    pub last_stable_offset: Offset,
    pub log_start_offset: Offset,
    /// Whole batches, zero-copy slices of the log's buffers.
    pub batches: Vec<Bytes>,
    /// read_committed only: the aborted transactions (producer id, first offset) that
    /// overlap the returned batches; `None` for other readers (Kafka sends null).
    pub aborted: Option<Vec<(ProducerId, Offset)>>,
    /// KIP-320, to a follower: its log diverges from this leader's; the epoch (the
    /// largest at or below the one it last fetched) and where it ends here.
    pub diverging: Option<(LeaderEpoch, Offset)>,
    /// To an assigned follower: this answer carries a newer log start than the last one it
    /// was given (see `FollowerProgress::log_start_sent`), so its fetch is answered now,
    /// not parked.
    pub log_start_news: bool,
    /// KIP-392, to a consumer: read from this replica instead (no records come with it).
    pub preferred_read_replica: Option<NodeId>,
    /// KIP-392: a follower answered this consumer's read (counted once the Fetch is
    /// answered, not per read pass of a long poll).
    pub from_follower: bool,
}

impl FetchOutcome {
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(Bytes::len).sum()
    }

    /// The outcome of a read that could not run (`error` is a Kafka error code).
    pub fn refused(error: i16) -> FetchOutcome {
        FetchOutcome {
            error,
            high_watermark: Offset::NONE,
            last_stable_offset: Offset::NONE,
            log_start_offset: Offset::NONE,
            batches: Vec::new(),
            aborted: None,
            diverging: None,
            log_start_news: false,
            preferred_read_replica: None,
            from_follower: false,
        }
    }
}

/// Who asks ListOffsets, and so what it may be told (see [`Partition::list_offset_for`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Lister {
    /// `isolation_level` 1 (v2+): latest is the LSO, not the HW.
    pub read_committed: bool,
    /// A consumer (replica id -1): answered from what it may fetch.
    pub consumer: bool,
    /// A client request (v1+): while this leader's HW is below where its epoch began,
    /// latest is this error (KIP-207: OFFSET_NOT_AVAILABLE from v5, LEADER_NOT_AVAILABLE
    /// before), not an offset lower than the last leader answered.
    pub lagging_hw_error: Option<i16>,
}

/// A ListOffsets answer for one partition.
#[derive(Clone, Copy, Debug)]
pub struct ListedOffset {
    pub error: i16,
    pub timestamp: i64,
    pub offset: Offset,
    pub leader_epoch: LeaderEpoch,
}

impl ListedOffset {
    pub fn failed(error: i16) -> ListedOffset {
        ListedOffset {
            error,
            timestamp: -1,
            offset: Offset::NONE,
            leader_epoch: LeaderEpoch::NONE,
        }
    }
}

pub(super) fn epoch_error(check: EpochCheck) -> i16 {
    match check {
        EpochCheck::Fenced => errors::FENCED_LEADER_EPOCH,
        EpochCheck::Unknown => errors::UNKNOWN_LEADER_EPOCH,
    }
}

impl Partition {
    /// Checks that this replica leads and the request's epoch is current.
    /// A leader whose log lost records it acknowledged answers as no leader until a newer
    /// epoch (`Partition::fence_if_lost`): clients and followers wait for the next one.
    fn check_leader(&self, current_epoch: LeaderEpoch) -> Result<(), i16> {
        let leads = {
            let replica = self.replica.borrow();
            replica.check_epoch(current_epoch).map_err(epoch_error)?;
            replica.is_leader()
        };
        if leads && !self.truncating() && !self.leads_without_acknowledged() {
            Ok(())
        } else {
            Err(errors::NOT_LEADER_OR_FOLLOWER)
        }
    }

    /// How far `reader` may read now: the LSO for read_committed, the HW for other
    /// consumers and for replica ids this leader does not follow, the log end for its
    /// followers. A long poll waits for this to pass its offset.
    pub fn read_upper(&self, reader: ReadFor) -> Offset {
        match reader {
            ReadFor::Consumer(Isolation::ReadCommitted) => self.last_stable_offset(),
            ReadFor::Consumer(Isolation::ReadUncommitted) => self.high_watermark(),
            ReadFor::Follower(node, _) if !self.replica.borrow().has_follower(node) => {
                self.high_watermark()
            }
            ReadFor::Follower(..) => self.log.log_end_offset(),
        }
    }

    /// Whether a fetch by `reader` parked at `offset` has something to answer now: records
    /// past it, or (to a follower) a log start it has not been sent.
    pub fn fetch_ready(&self, reader: ReadFor, offset: Offset) -> bool {
        if self.read_upper(reader) > offset {
            return true;
        }
        match reader {
            ReadFor::Follower(node, _) => self
                .replica
                .borrow()
                .follower_log_start_unsent(node, self.log.log_start_offset()),
            ReadFor::Consumer(_) => false,
        }
    }

    /// Reads from `offset` for `reader`, at most `max_bytes` of records except that the
    /// first batch is returned whole up to `hard_max_bytes` (see `Log::read_within`). With
    /// `hard_max_bytes` 0 the log is not read at all: the outcome carries only the offsets
    /// and the error. A follower's read also records its progress (its LEO is `offset`).
    pub async fn fetch_within(
        &self,
        offset: Offset,
        reader: ReadFor,
        current_epoch: LeaderEpoch,
        max_bytes: usize,
        hard_max_bytes: usize,
        now_ms: i64,
    ) -> FetchOutcome {
        let bytes = (max_bytes, hard_max_bytes);
        let read = self.fetch_unnoted(offset, reader, current_epoch, bytes, now_ms);
        let mut out = read.await;
        self.note_log_start_sent(&mut out, reader);
        out
    }

    /// [`Self::fetch_within`] but for noting the log start the answer carries.
    async fn fetch_unnoted(
        &self,
        offset: Offset,
        reader: ReadFor,
        current_epoch: LeaderEpoch,
        (max_bytes, hard_max_bytes): (usize, usize),
        now_ms: i64,
    ) -> FetchOutcome {
        if let Err(code) = self.check_leader(current_epoch) {
            return FetchOutcome::refused(code);
        }
        let sizes = (max_bytes, hard_max_bytes);
        self.fetch_checked(offset, reader, sizes, now_ms).await
    }

    /// KIP-392: a consumer's read from this replica while it follows (Fetch v11+, where
    /// Kafka no longer fetches only from the leader). The same read as on a leader, bounded
    /// by what this replica knows: its own HW (learned from its leader, which may be
    /// ahead) and its LSO; an offset between its HW and its log end is answered empty (a
    /// long poll waits for this replica's HW), one past its log end OFFSET_OUT_OF_RANGE
    /// (Kafka's rule; the client goes back to the leader). The request's leader epoch is
    /// checked as a leader checks it (KIP-320). A replica that leads reads as a leader.
    pub async fn fetch_as_follower(
        &self,
        offset: Offset,
        isolation: Isolation,
        current_epoch: LeaderEpoch,
        (max_bytes, hard_max_bytes): (usize, usize),
        now_ms: i64,
    ) -> FetchOutcome {
        let reader = ReadFor::Consumer(isolation);
        if let Err(code) = self.check_follower(current_epoch) {
            return FetchOutcome::refused(code);
        }
        if self.replica.borrow().is_leader() {
            let read = self.fetch_within(
                offset,
                reader,
                current_epoch,
                max_bytes,
                hard_max_bytes,
                now_ms,
            );
            return read.await;
        }
        self.fetch_checked(offset, reader, (max_bytes, hard_max_bytes), now_ms)
            .await
    }

    /// The checks of a consumer's read on a follower: the request's epoch is this
    /// replica's, and the log is not being cut (a truncation lowers the HW as it
    /// completes; meanwhile the client is sent back to the leader).
    fn check_follower(&self, current_epoch: LeaderEpoch) -> Result<(), i16> {
        let replica = self.replica.borrow();
        replica.check_epoch(current_epoch).map_err(epoch_error)?;
        if !replica.is_leader() && self.truncating() {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        // An offline partition's replica (no leader) refuses clients: what it holds may
        // not be what the next leader keeps.
        if !replica.is_leader() && replica.leader() == crate::partition::replica::NO_LEADER {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        Ok(())
    }

    /// KIP-392, on a leader: the answer that sends a consumer to `replica`, without
    /// records but with this leader's offsets (Kafka's answer), after the usual checks.
    pub fn redirected(&self, replica: NodeId, current_epoch: LeaderEpoch) -> FetchOutcome {
        if let Err(code) = self.check_leader(current_epoch) {
            return FetchOutcome::refused(code);
        }
        FetchOutcome {
            error: errors::NONE,
            high_watermark: self.high_watermark(),
            last_stable_offset: self.last_stable_offset(),
            log_start_offset: self.log.log_start_offset(),
            batches: Vec::new(),
            aborted: None,
            diverging: None,
            log_start_news: false,
            preferred_read_replica: Some(replica),
            from_follower: false,
        }
    }

    /// [`Self::fetch_within`] after its checks passed.
    async fn fetch_checked(
        &self,
        offset: Offset,
        reader: ReadFor,
        (max_bytes, hard_max_bytes): (usize, usize),
        now_ms: i64,
    ) -> FetchOutcome {
        let lso = self.last_stable_offset();
        // Where the read stops: `read_upper`, which a long poll also waits on. A follower's
        // read first notes its progress; a replica id this leader does not follow (a client
        // posing as a replica, or a replica assigned before this leader applied it) reads
        // as a consumer does, with no progress noted.
        let upper = match reader {
            ReadFor::Follower(node, epoch) if self.replica.borrow().has_follower(node) => {
                if let Some(answered) = self.follower_answered.borrow_mut().remove(&node) {
                    crate::metrics::local(|m| m.follower_turned_around(answered.elapsed()));
                }
                let end = self.log.log_end_offset();
                let advanced = self
                    .replica
                    .borrow_mut()
                    .follower_fetched(node, epoch, offset, end, now_ms);
                if advanced {
                    self.appended.notify_all();
                }
                end
            }
            _ => self.read_upper(reader),
        };
        let hw = self.high_watermark();
        let committed = reader == ReadFor::Consumer(Isolation::ReadCommitted);
        let mut out = FetchOutcome {
            error: errors::NONE,
            high_watermark: hw,
            last_stable_offset: lso,
            log_start_offset: self.log.log_start_offset(),
            batches: Vec::new(),
            aborted: committed.then(Vec::new),
            diverging: None,
            log_start_news: false,
            preferred_read_replica: None,
            from_follower: false,
        };
        // In range up to the LEO, for consumers too (Kafka's rule): between the HW and
        // the LEO a consumer reads nothing yet. A new leader's HW, learned as a follower,
        // may lag the old leader's by a fetch round, and a consumer already past it must
        // not be told OFFSET_OUT_OF_RANGE (its reset policy would re-read or skip).
        if offset > self.log.log_end_offset() || offset < out.log_start_offset {
            out.error = errors::OFFSET_OUT_OF_RANGE;
            return out;
        }
        if offset >= upper {
            return out;
        }
        if hard_max_bytes == 0 {
            return out;
        }
        // Only the partition's own followers are noted as served (see
        // `Log::read_for_replica`): another replica id reads like a consumer would.
        let replica = match reader {
            ReadFor::Follower(node, _) => self.replica.borrow().has_follower(node),
            ReadFor::Consumer(_) => false,
        };
        let out = self
            .read_into(out, offset, (max_bytes, hard_max_bytes), upper, replica)
            .await;
        if let ReadFor::Follower(node, _) = reader
            && !out.batches.is_empty()
        {
            let now = std::time::Instant::now();
            self.follower_answered.borrow_mut().insert(node, now);
        }
        out
    }

    /// Notes the log start a follower's answer carries as sent to it, and flags the
    /// answer if that start is news to the follower. Every read of a follower's fetch
    /// passes here, the ones that find nothing new included, and a flagged read is
    /// answered at once (`api::fetch`), so what is noted is what its answer carries.
    fn note_log_start_sent(&self, out: &mut FetchOutcome, reader: ReadFor) {
        if let ReadFor::Follower(node, _) = reader
            && out.error == errors::NONE
            && out.log_start_offset != Offset::NONE
        {
            out.log_start_news = self
                .replica
                .borrow_mut()
                .follower_log_start_sent(node, out.log_start_offset);
        }
    }

    /// The log read of [`Self::fetch_within`], up to `upper`, into `out`; read_committed
    /// (its `aborted` is `Some`) also gets the aborted transactions of the returned range.
    /// `replica`: a follower's read, which the log notes when it goes past the written end.
    async fn read_into(
        &self,
        mut out: FetchOutcome,
        offset: Offset,
        (max_bytes, hard_max_bytes): (usize, usize),
        upper: Offset,
        replica: bool,
    ) -> FetchOutcome {
        let committed = out.aborted.is_some();
        let read = if replica {
            self.log
                .read_for_replica(offset, max_bytes, hard_max_bytes, upper)
                .await
        } else {
            self.log
                .read_within(offset, max_bytes, hard_max_bytes, upper)
                .await
        };
        match read {
            Ok(read) => {
                if committed && read.next_offset > offset {
                    let aborted = self.producers.aborted_overlapping(offset, read.next_offset);
                    out.aborted = Some(aborted);
                }
                out.batches = read.batches;
                out.log_start_offset = read.log_start_offset;
                out
            }
            Err(StorageError::OffsetOutOfRange { .. }) => {
                out.error = errors::OFFSET_OUT_OF_RANGE;
                out
            }
            Err(e) => {
                crate::client_warn!(topic = %self.topic, partition = self.index, "read failed: {e}");
                FetchOutcome::refused(storage_error_code(&e))
            }
        }
    }

    /// The last stable offset: no read_committed consumer reads past it. The first offset
    /// of the oldest open transaction, or the HW if that is lower (or none is open). Never
    /// below the log start (Kafka's rule): DeleteRecords or retention may move the start
    /// past an open transaction's first offset, and a latest answer below the start would
    /// send a read_committed consumer into OFFSET_OUT_OF_RANGE and back, in a loop.
    pub fn last_stable_offset(&self) -> Offset {
        let hw = self.high_watermark();
        let start = self.log.log_start_offset();
        let lso = self
            .producers
            .first_unstable_offset()
            .map_or(hw, |f| f.max(start).min(hw));
        debug_assert!(lso <= hw);
        lso
    }

    /// KIP-320, on the leader: a follower fetching at `offset` that last fetched under
    /// `last_fetched` diverges if that epoch ended here before `offset` (or is unknown
    /// here): it must truncate before fetching on. Kafka's check, on the epoch cache.
    pub fn diverging(
        &self,
        offset: Offset,
        last_fetched: LeaderEpoch,
    ) -> Option<(LeaderEpoch, Offset)> {
        if last_fetched == LeaderEpoch::NONE {
            return None;
        }
        let end = self.log.log_end_offset();
        let (epoch, epoch_end) = self.epochs.borrow().end_offset_for(last_fetched, end);
        let diverges = epoch == LeaderEpoch::NONE || epoch < last_fetched || epoch_end < offset;
        diverges.then_some((epoch, epoch_end))
    }

    /// The answer to a diverging follower: no records, and where to truncate. Its fetch
    /// offset says nothing about what it holds, so its progress is not recorded.
    pub fn diverged(
        &self,
        diverging: (LeaderEpoch, Offset),
        current_epoch: LeaderEpoch,
    ) -> FetchOutcome {
        // A follower serving a consumer (KIP-392) answers a diverging epoch as a leader
        // does (Kafka's readRecords checks it on every replica that reads).
        let checked = if self.replica.borrow().is_leader() {
            self.check_leader(current_epoch)
        } else {
            self.check_follower(current_epoch)
        };
        if let Err(code) = checked {
            return FetchOutcome::refused(code);
        }
        let hw = self.high_watermark();
        FetchOutcome {
            error: errors::NONE,
            high_watermark: hw,
            last_stable_offset: self.last_stable_offset(),
            log_start_offset: self.log.log_start_offset(),
            batches: Vec::new(),
            aborted: None,
            diverging: Some(diverging),
            log_start_news: false,
            preferred_read_replica: None,
            from_follower: false,
        }
    }

    /// A consumer's read of everything from `offset` up to the HW, at most `max_bytes`
    /// (the first batch whole).
    pub async fn fetch(&self, offset: Offset, max_bytes: usize) -> FetchOutcome {
        let reader = ReadFor::Consumer(Isolation::ReadUncommitted);
        let now = crate::shard::now_ms();
        self.fetch_within(
            offset,
            reader,
            LeaderEpoch::NONE,
            max_bytes,
            usize::MAX,
            now,
        )
        .await
    }

    /// ListOffsets: -2 earliest (and -4, earliest local), -1 latest (the HW), -3 max
    /// timestamp, -5 latest tiered (none), else the first
    /// offset whose timestamp is >= `timestamp`.
    pub async fn list_offset(&self, timestamp: i64, current_epoch: LeaderEpoch) -> ListedOffset {
        if let Err(code) = self.check_leader(current_epoch) {
            return ListedOffset::failed(code);
        }
        let found = |timestamp: i64, offset: Offset| ListedOffset {
            error: errors::NONE,
            timestamp,
            offset,
            leader_epoch: self.leader_epoch(),
        };
        match timestamp {
            // -4 (earliest local, KIP-405): without tiered storage the local log is the log.
            -2 | -4 => found(-1, self.log.log_start_offset()),
            // -5 (latest tiered): nothing is tiered, Kafka answers offset -1.
            -5 => found(-1, Offset::NONE),
            -1 => found(-1, self.high_watermark()),
            -3 => {
                let (ts, offset) = self.log.max_timestamp();
                if ts < 0 {
                    found(-1, Offset::NONE)
                } else {
                    // KIP-734: the first record with the max timestamp, not its batch's
                    // last (the batch's offset if it cannot be read).
                    let exact = self.first_record_with(offset, ts).await;
                    found(ts, exact.unwrap_or(offset))
                }
            }
            ts if ts < 0 => ListedOffset::failed(errors::UNSUPPORTED_VERSION),
            ts => match self.log.read_by_time(ts).await {
                Ok(Some((offset, found_ts))) => {
                    let exact = self.first_record_at(offset, ts).await;
                    let (ts, offset) = exact.unwrap_or((found_ts, offset));
                    found(ts, offset)
                }
                Ok(None) => found(-1, Offset::NONE),
                Err(e) => ListedOffset::failed(storage_error_code(&e)),
            },
        }
    }

    /// ListOffsets as `asker` may be answered. Kafka's order: the epoch and leadership
    /// checks first ([`list_offset`](Self::list_offset)), then the answer. A consumer is
    /// answered from what it may fetch: latest is the HW (the LSO for read_committed), and
    /// an offset found by time (or -3) counts only below it, else none (-1). A new leader
    /// whose HW is still below its epoch's start (KIP-207) refuses only what would come
    /// from the HW: latest, or a lookup by time that found nothing it may serve. Earliest
    /// is always answered, and the LSO never enters that check: a transaction open at the
    /// failover would otherwise hold it for minutes.
    pub async fn list_offset_for(
        &self,
        timestamp: i64,
        current_epoch: LeaderEpoch,
        asker: Lister,
    ) -> ListedOffset {
        let listed = self.list_offset(timestamp, current_epoch).await;
        if listed.error != errors::NONE || !asker.consumer {
            return listed;
        }
        let lagging = asker.lagging_hw_error.filter(|_| {
            self.replica()
                .epoch_start()
                .is_some_and(|start| start > self.high_watermark())
        });
        let fetchable = match asker.read_committed {
            true => self.last_stable_offset(),
            false => self.high_watermark(),
        };
        let by_time = timestamp >= 0 || timestamp == -3;
        match lagging {
            Some(code) if timestamp == -1 => ListedOffset::failed(code),
            _ if timestamp == -1 => ListedOffset {
                offset: fetchable,
                ..listed
            },
            Some(code) if by_time && listed.offset >= fetchable => ListedOffset::failed(code),
            None if by_time && listed.offset >= fetchable => ListedOffset {
                timestamp: -1,
                offset: Offset::NONE,
                ..listed
            },
            _ => listed,
        }
    }

    /// From the batch at `batch_offset` (found by the time index) on, the first record
    /// at or after `batch_offset` whose timestamp is >= `ts`, as (its timestamp, its
    /// offset): Kafka answers ListOffsets by time with that exact record, not the batch.
    /// A batch without such a record is passed over for the next, as Kafka's
    /// `LogSegment.findOffsetByTimestamp` does, at most [`TIME_SCAN_BATCHES_MAX`] of them.
    /// `None` if a batch cannot be read or none qualifies within the bound (the caller
    /// answers with the index's batch then).
    async fn first_record_at(&self, batch_offset: Offset, ts: i64) -> Option<(i64, Offset)> {
        let mut from = batch_offset;
        for _ in 0..TIME_SCAN_BATCHES_MAX {
            let read = self.log.read(from, 1, self.high_watermark()).await.ok()?;
            let batch = read.batches.into_iter().next()?;
            let header = *wire::batch::read_header(&batch).ok()?;
            if header.max_timestamp() >= ts
                && let Some(found) = first_record_in(&batch, batch_offset, |t| t >= ts).ok()?
            {
                return Some(found);
            }
            from = header.next_offset();
        }
        None
    }

    /// In the batch holding `offset` (the log's max-timestamp batch), the first record
    /// whose timestamp is `ts` and that is still in the log.
    async fn first_record_with(&self, offset: Offset, ts: i64) -> Option<Offset> {
        let read = self.log.read(offset, 1, Offset(i64::MAX)).await.ok()?;
        let batch = read.batches.into_iter().next()?;
        let start = self.log.log_start_offset();
        let (_, offset) = first_record_in(&batch, start, |t| t == ts).ok()??;
        Some(offset)
    }

    /// A follower learns its leader's log start (each fetch answer carries it): its own
    /// moves up to it, bounded by the HW it has learnt, so that records deleted on the
    /// leader (DeleteRecords, retention) are not served again after a failover.
    pub async fn follow_log_start(&self, leader_start: Offset) {
        if self.replica.borrow().is_leader() || leader_start <= self.log.log_start_offset() {
            return;
        }
        let target = leader_start.min(self.high_watermark());
        if let Err(e) = self.log.follow_log_start(target).await {
            tracing::warn!(topic = %self.topic, partition = self.index, "cannot follow the leader's log start: {e}");
        }
    }

    /// On a leader, a follower's fetch reported `log_start` as its log start (recorded
    /// only for an assigned follower; wakes DeleteRecords waiting for it).
    pub fn follower_log_start(&self, follower: NodeId, log_start: Offset) {
        let changed = self
            .replica
            .borrow_mut()
            .follower_log_start(follower, log_start);
        if changed {
            self.log_starts_moved.notify_all();
        }
    }

    /// On a leader, the low watermark: the smallest log start over this replica and its
    /// followers on nodes `alive` says are live (see `ReplicaState::low_watermark`).
    pub fn low_watermark(&self, alive: impl Fn(NodeId) -> bool) -> Option<Offset> {
        let start = self.log.log_start_offset();
        self.replica.borrow().low_watermark(start, alive)
    }

    /// DeleteRecords: `Offset::NONE` (-1) means "up to the HW". The leader moves its own
    /// log start, then answers once the low watermark (every live replica's log start,
    /// [`Self::low_watermark`]) reached the target, as Kafka's DelayedDeleteRecords:
    /// answered when only the leader had moved, a failover within the next fetch rounds
    /// elected a follower that still served the deleted records. Returns the low
    /// watermark, or a Kafka error: REQUEST_TIMED_OUT if the followers did not follow
    /// within `wait`, NOT_LEADER_OR_FOLLOWER if this replica stopped leading meanwhile.
    /// `alive` is asked afresh at each check (a node fenced meanwhile stops counting).
    ///
    /// Run in a call from another shard, the call gives back its inbox slot before
    /// waiting, as a delayed produce does.
    pub async fn delete_records(
        &self,
        offset: Offset,
        wait: std::time::Duration,
        alive: impl Fn(NodeId) -> bool,
    ) -> Result<Offset, i16> {
        self.check_leader(LeaderEpoch::NONE)?;
        let epoch = self.replica.borrow().leader_epoch();
        let hw = self.high_watermark();
        let target = if offset == Offset::NONE { hw } else { offset };
        if target > hw || target.get() < 0 {
            return Err(errors::OFFSET_OUT_OF_RANGE);
        }
        self.log
            .delete_records_before(target)
            .await
            .map_err(|e| storage_error_code(&e))?;
        // Parked follower fetches answer now with the new log start (see `api::fetch`),
        // so this waits a fetch round trip, not up to `replica.fetch.wait.max.ms`.
        self.appended.notify_all();
        crate::shard::mesh::InboxSlot::release_current();
        let reached = async {
            loop {
                let moved = self.log_starts_moved.listen();
                match self.low_watermark(&alive) {
                    Some(low) if low >= target => return Some(low),
                    Some(_) => {}
                    None => return None,
                }
                // A follower's fetch wakes this; the tick notices a node fenced meanwhile.
                let tick = glommio::timer::sleep(LOW_WATERMARK_RECHECK);
                futures_lite::future::or(moved, tick).await;
            }
        };
        let timeout = async {
            glommio::timer::sleep(wait).await;
            None
        };
        let waited = futures_lite::future::or(reached, timeout);
        match self.while_leading(epoch, waited).await? {
            Some(low) => Ok(low),
            None if !self.replica.borrow().is_leader() => Err(errors::NOT_LEADER_OR_FOLLOWER),
            None => Err(errors::REQUEST_TIMED_OUT),
        }
    }
}

/// In `batch`, the first record at or above `from` whose timestamp passes `wanted`, as
/// (its timestamp, its offset); `Err` if the batch cannot be decoded. Records are walked,
/// not decoded (their headers are skipped unread). A LogAppendTime batch has one
/// timestamp for all its records: its first record still in the log (at or above `from`).
fn first_record_in(
    batch: &bytes::Bytes,
    from: Offset,
    wanted: impl Fn(i64) -> bool,
) -> Result<Option<(i64, Offset)>, ()> {
    let (header, section) =
        wire::batch::records_section(batch, DECOMPRESSED_BATCH_MAX_BYTES).map_err(|_| ())?;
    if header.attributes().timestamp_type() == wire::batch::TimestampType::LogAppendTime {
        let offset = header.base_offset().max(from);
        let inside = offset <= header.last_offset();
        return Ok(
            (inside && wanted(header.max_timestamp())).then_some((header.max_timestamp(), offset))
        );
    }
    let mut found = None;
    let walked = wire::batch::walk_records(&section, header.records_count(), |_, record| {
        let ts = header
            .base_timestamp()
            .saturating_add(record.timestamp_delta);
        let offset = header.base_offset().add(i64::from(record.offset_delta));
        if found.is_none() && offset >= from && wanted(ts) {
            found = Some((ts, offset));
        }
        Ok(())
    });
    walked.map_err(|_| ())?;
    Ok(found)
}
