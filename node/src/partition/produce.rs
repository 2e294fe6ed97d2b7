//! Appends to a partition replica: the leader's append for clients (idempotence check,
//! offsets assigned, then acks: 1 answers once the local append completed, all once the HW
//! covers the batch — a delayed produce — and only while the ISR has at least
//! `min.insync.replicas`), and the follower's append that keeps the leader's offsets.
//! A client's batch in another codec than the topic's `compression.type` names is
//! rewritten in that codec before it is appended ([`TopicCompression`]); followers copy
//! the leader's bytes.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use wire::batch::{Compression, SnappyFraming, TimestampType, read_header, split_batches};
use wire::{LeaderEpoch, Offset};

use super::{Partition, storage_error_code, wire_error_code};
use crate::errors;
use crate::producer_state::entry::BatchMetadata;
use crate::producer_state::partition::{Marker, ProducerAppend, ReplicatedAppendFailed};
use crate::storage::AppendInfo;

/// Longest a resent duplicate waits for its original to be committed.
const DUPLICATE_WAIT: Duration = Duration::from_secs(30);

/// A Produce request's `acks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// 0: the client wants no answer (the append still happens).
    None,
    /// 1: answered once the leader has appended.
    Leader,
    /// -1: answered once every ISR member has the batch (the HW covers it).
    All,
}

impl Acks {
    /// Kafka's wire value; anything else is INVALID_REQUIRED_ACKS.
    pub fn from_wire(acks: i16) -> Option<Acks> {
        match acks {
            0 => Some(Acks::None),
            1 => Some(Acks::Leader),
            -1 => Some(Acks::All),
            _ => None,
        }
    }
}

/// A topic's `compression.type` (Kafka's `BrokerCompressionType`): `producer` stores each
/// batch as its producer compressed it, any other value stores every client batch in that
/// codec (`uncompressed` is none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TopicCompression {
    #[default]
    Producer,
    Codec(Compression),
}

impl TopicCompression {
    /// Kafka's values, as its validator takes them (exact, lower case).
    pub fn parse(value: &str) -> Option<TopicCompression> {
        let codec = match value.trim() {
            "producer" => return Some(TopicCompression::Producer),
            "uncompressed" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            _ => return None,
        };
        Some(TopicCompression::Codec(codec))
    }

    /// The codec a batch that arrived in `source` is stored in.
    pub fn target(self, source: Compression) -> Compression {
        match self {
            TopicCompression::Producer => source,
            TopicCompression::Codec(codec) => codec,
        }
    }
}

/// KIP-390's level keys (topic names; the broker's defaults have the same names).
pub const GZIP_LEVEL: &str = "compression.gzip.level";
pub const LZ4_LEVEL: &str = "compression.lz4.level";
pub const ZSTD_LEVEL: &str = "compression.zstd.level";

/// Kafka's default of each level key, as DescribeConfigs shows it: -1 is gzip's own
/// default (6); lz4's 9 picks among lz4-java's levels, which weir's lz4 does not have.
pub const COMPRESSION_LEVEL_DEFAULTS: [(&str, &str); 3] =
    [(GZIP_LEVEL, "-1"), (LZ4_LEVEL, "9"), (ZSTD_LEVEL, "3")];

/// Whether `value` is in Kafka's range for the level key `key` (gzip 1–9 or -1, lz4
/// 1–17, zstd -131072–22); `None` for any other key.
pub fn compression_level_valid(key: &str, value: &str) -> Option<bool> {
    let n = value.trim().parse::<i64>();
    let range = match key {
        GZIP_LEVEL => return Some(n.is_ok_and(|n| n == -1 || (1..=9).contains(&n))),
        LZ4_LEVEL => 1..=17,
        ZSTD_LEVEL => -131_072..=22,
        _ => return None,
    };
    Some(n.is_ok_and(|n| range.contains(&n)))
}

/// How the broker frames snappy when it compresses: xerial, as Kafka's Java code writes
/// it (every Kafka client reads it; librdkafka writes raw blocks, which a batch already
/// in snappy keeps).
const BROKER_SNAPPY_FRAMING: SnappyFraming = SnappyFraming::Xerial;

/// Result of appending one Produce partition's records.
#[derive(Clone, Debug)]
pub struct ProduceOutcome {
    pub error: i16,
    pub base_offset: Offset,
    /// The append time when the topic uses LogAppendTime, else -1.
    pub log_append_time_ms: i64,
    pub log_start_offset: Offset,
    /// The records (index in the batch) that made the batch fail (Produce v8+
    /// `record_errors`: librdkafka fails only these with the error, the others of the
    /// batch with "a different record failed").
    pub record_errors: Vec<i32>,
    /// A message for the error (Produce v8+ `error_message`).
    pub error_message: Option<&'static str>,
}

/// Why records were refused before appending: the error, the records that caused it
/// (indexes in the batch) and a message for the client.
#[derive(Debug)]
struct Refusal {
    error: i16,
    records: Vec<i32>,
    message: Option<&'static str>,
}

impl Refusal {
    fn code(error: i16) -> Refusal {
        Refusal {
            error,
            records: Vec::new(),
            message: None,
        }
    }

    fn said(error: i16, message: &'static str) -> Refusal {
        Refusal {
            message: Some(message),
            ..Refusal::code(error)
        }
    }
}

/// Kafka's message for a keyless record sent to a compacted topic.
const KEYLESS_IN_COMPACTED: &str = "Compacted topic cannot accept message without key";
/// Kafka's message for records outside `message.timestamp.before/after.max.ms`.
const TIMESTAMP_OUT_OF_RANGE: &str =
    "One or more records have been rejected due to invalid timestamp";
/// Why a batch within `max.message.bytes` as sent was refused once in the topic's codec.
const RECOMPRESSED_TOO_LARGE: &str = "Message batch exceeds the maximum configured message size once in the topic's compression.type";
/// Kafka's message for a Produce (v3+) partition carrying more than one batch.
const NOT_ONE_BATCH: &str =
    "Produce requests are only allowed to contain exactly one record batch per partition";

impl ProduceOutcome {
    /// A produce that appended nothing (`error` is a Kafka error code).
    pub fn failed(error: i16) -> ProduceOutcome {
        ProduceOutcome {
            error,
            base_offset: Offset::NONE,
            log_append_time_ms: -1,
            log_start_offset: Offset::NONE,
            record_errors: Vec::new(),
            error_message: None,
        }
    }

    fn refused(refusal: Refusal) -> ProduceOutcome {
        ProduceOutcome {
            record_errors: refusal.records,
            error_message: refusal.message,
            ..ProduceOutcome::failed(refusal.error)
        }
    }

    fn appended(info: &AppendInfo) -> ProduceOutcome {
        ProduceOutcome {
            error: errors::NONE,
            base_offset: info.first_offset,
            log_append_time_ms: info.log_append_time_ms.unwrap_or(-1),
            log_start_offset: info.log_start_offset,
            record_errors: Vec::new(),
            error_message: None,
        }
    }
}

impl Partition {
    /// A client's produce on the leader: validates every batch (CRC, sizes,
    /// `max.message.bytes`), appends them, then answers as `acks` asks, at the latest at
    /// `deadline` (REQUEST_TIMED_OUT). `records` is ideally a unique buffer (patched in
    /// place). A replica that does not lead answers NOT_LEADER_OR_FOLLOWER.
    pub async fn produce(
        &self,
        mut records: BytesMut,
        acks: Acks,
        deadline: Instant,
        now_ms: i64,
    ) -> ProduceOutcome {
        let epoch = {
            let replica = self.replica.borrow();
            if !replica.is_leader() || self.truncating() {
                return ProduceOutcome::failed(errors::NOT_LEADER_OR_FOLLOWER);
            }
            // Kafka checks before appending: with too few in-sync replicas an acks=all
            // batch is refused whole (NOT_ENOUGH_REPLICAS), nothing is written.
            if acks == Acks::All && replica.isr_len() < self.min_insync.get() {
                return ProduceOutcome::failed(errors::NOT_ENOUGH_REPLICAS);
            }
            // Offsets served to followers were rolled back: this epoch appends no more
            // (the log refuses it too; checked here so no epoch is noted for nothing).
            if self.log.epoch_fenced(replica.leader_epoch()) {
                return ProduceOutcome::failed(errors::NOT_LEADER_OR_FOLLOWER);
            }
            replica.leader_epoch()
        };
        let compression = self.compression.get();
        if let Err(refusal) = self.validate(&mut records, now_ms, compression) {
            return ProduceOutcome::refused(refusal);
        }
        if let Err(error) = self.note_epoch(epoch, self.log.log_end_offset()) {
            return ProduceOutcome::failed(error);
        }
        let started = Instant::now();
        let appended = self
            .producers
            .append(&self.log, records, epoch, now_ms)
            .await;
        crate::metrics::local(|m| m.produce_appended(started.elapsed()));
        let info = match appended {
            Ok(ProducerAppend::Appended(info)) => info,
            Ok(ProducerAppend::Duplicate(original)) => {
                return self.duplicate(original, acks, epoch).await;
            }
            Ok(ProducerAppend::Rejected(error)) => return ProduceOutcome::failed(error),
            Err(e) => {
                // One line per refused request: rate limited, as a full disk refuses every
                // produce of every client until space is back, and each line would wait on
                // the log's writer (the disk that is full, often). The log itself says
                // once when it stops and starts taking writes.
                crate::client_warn!(topic = %self.topic, partition = self.index, "append failed: {e}");
                return ProduceOutcome::failed(storage_error_code(&e));
            }
        };
        self.log_grew(info.last_offset.add(1));
        let outcome = ProduceOutcome::appended(&info);
        if acks != Acks::All {
            return outcome;
        }
        let (started, wait) = (
            Instant::now(),
            deadline.saturating_duration_since(Instant::now()),
        );
        let error = self
            .await_replicated(epoch, info.last_offset.add(1), wait)
            .await;
        crate::metrics::local(|m| m.replication_waited(started.elapsed()));
        ProduceOutcome { error, ..outcome }
    }

    /// The delayed produce of acks=all, and the coordinators' replicated writes: waits
    /// until the HW reaches `end` (every ISR member has what this leader wrote before it)
    /// while this replica leads under `epoch`, at most `wait`. Then the Kafka error to
    /// answer with: NONE; REQUEST_TIMED_OUT; NOT_LEADER_OR_FOLLOWER once it stopped
    /// leading under `epoch` (the new leader may cut the write, and a HW learned as a
    /// follower counts the new leader's records at its offsets); or
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below `min.insync.replicas`
    /// meanwhile (Kafka: the batch is in the log, but not as durable as asked).
    ///
    /// Run in a call from another shard, the call gives back its inbox slot first: a
    /// wait holds none (see `shard::mesh`), as Kafka parks a delayed produce in a
    /// purgatory holding no handler.
    pub async fn await_replicated(&self, epoch: LeaderEpoch, end: Offset, wait: Duration) -> i16 {
        crate::shard::mesh::InboxSlot::release_current();
        let replicated = async {
            loop {
                let moved = self.appended.listen();
                if self.high_watermark() >= end {
                    return true;
                }
                moved.await;
            }
        };
        let timeout = async {
            glommio::timer::sleep(wait).await;
            false
        };
        let waited = futures_lite::future::or(replicated, timeout);
        match self.while_leading(epoch, waited).await {
            Err(code) => code,
            Ok(false) => errors::REQUEST_TIMED_OUT,
            Ok(true) if self.replica.borrow().isr_len() < self.min_insync.get() => {
                errors::NOT_ENOUGH_REPLICAS_AFTER_APPEND
            }
            Ok(true) => errors::NONE,
        }
    }

    /// A resend of an appended batch: its original offsets once the original is committed
    /// under `epoch` (REQUEST_TIMED_OUT if that does not happen within 30 s, e.g. its
    /// append failed), whatever `acks` asks: a resend is told its offsets only once they
    /// cannot be cut. With acks=all the ISR must still have `min.insync.replicas`. If the
    /// log end moved back below the original meanwhile (an out-of-space rollback keeps the
    /// epoch) it is gone and others' records may be at its offsets: KAFKA_STORAGE_ERROR
    /// (retriable; the producer state forgets a rolled-back batch, so a resend after it
    /// is appended). Called right after the check that found the original, before any
    /// other task ran, so the count compared is the one that check saw.
    /// On a LogAppendTime topic it gets the original's append time, as Kafka answers.
    async fn duplicate(
        &self,
        original: BatchMetadata,
        acks: Acks,
        epoch: LeaderEpoch,
    ) -> ProduceOutcome {
        let (first, last) = (original.first_offset, original.last_offset);
        let truncations = self.log.truncations();
        let waited = self
            .await_replicated(epoch, last.add(1), DUPLICATE_WAIT)
            .await;
        let error = match waited {
            // Only a cut below the original's end can have taken it; a rollback of later
            // appends keeps it, written, and the resend is answered with its offsets.
            _ if self.log.cut_below_since(truncations, last.add(1)) => errors::KAFKA_STORAGE_ERROR,
            errors::NOT_ENOUGH_REPLICAS_AFTER_APPEND if acks != Acks::All => errors::NONE,
            code => code,
        };
        ProduceOutcome {
            error,
            base_offset: if error == errors::NONE {
                first
            } else {
                Offset::NONE
            },
            log_append_time_ms: match self.log.config().message_timestamp_type {
                TimestampType::LogAppendTime if error == errors::NONE => original.max_timestamp,
                _ => -1,
            },
            log_start_offset: self.log.log_start_offset(),
            record_errors: Vec::new(),
            error_message: None,
        }
    }

    /// Runs `work` while this replica leads under `epoch`: NOT_LEADER_OR_FOLLOWER as soon
    /// as it does not (role changes wake `appended`), and if it does not once `work` is
    /// done. Whatever waits on this leadership's HW — a delayed produce, a coordinator's
    /// write — waits through this.
    pub async fn while_leading<T>(
        &self,
        epoch: LeaderEpoch,
        work: impl Future<Output = T>,
    ) -> Result<T, i16> {
        let demoted = async {
            loop {
                let changed = self.appended.listen();
                if !self.leads_under(epoch) {
                    return Err(errors::NOT_LEADER_OR_FOLLOWER);
                }
                changed.await;
            }
        };
        let out = futures_lite::future::or(async { Ok(work.await) }, demoted).await?;
        if !self.leads_under(epoch) {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        Ok(out)
    }

    /// A follower's append of batches fetched from its leader: they keep the leader's
    /// offsets and epochs (offsets only grow from this replica's log end; gaps are the
    /// leader's cleaner's), and the producer state learns them as the leader's did, so
    /// idempotence survives a failover.
    pub async fn append_as_follower(
        &self,
        records: BytesMut,
        now_ms: i64,
    ) -> Result<AppendInfo, i16> {
        if self.replica.borrow().is_leader() {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        // The leader's batches continue this log (else the fetcher must truncate first):
        // offsets only grow. Gaps are the leader's cleaner's, as in Kafka. Checked before
        // any epoch is noted, so a refused append changes nothing.
        let mut headers = Vec::new();
        let mut next = self.log.log_end_offset();
        for range in split_batches(&records) {
            let range = range.map_err(|e| wire_error_code(&e))?;
            let header = *read_header(&records[range]).map_err(|e| wire_error_code(&e))?;
            if header.base_offset() < next {
                return Err(errors::OFFSET_OUT_OF_RANGE);
            }
            next = header.next_offset();
            headers.push(header);
        }
        // What the batches were checked against: while the epoch checkpoint is written
        // (an await) the replica may lead, follow another leader, or be cut and appended
        // to by the fetcher of a new leader. Any of these makes these batches the old
        // leader's, not this log's continuation: appended, they would diverge from the new
        // leader where its epoch cache could not see it.
        let checked_against = self.follower_position();
        self.note_copied_epochs(&headers).await?;
        if self.follower_position() != checked_against {
            return Err(errors::NOT_LEADER_OR_FOLLOWER);
        }
        let started = Instant::now();
        let from = self.log.log_end_offset();
        let appended = self
            .producers
            .append_replicated(&self.log, records, now_ms)
            .await;
        crate::metrics::local(|m| m.replica_appended(started.elapsed()));
        match appended {
            Ok(info) => {
                self.log_grew(info.last_offset.add(1));
                Ok(info)
            }
            Err(failed) => Err(self
                .replicated_append_failed(failed, from, checked_against)
                .await),
        }
    }

    /// After a follower's append failed, possibly partway (a chunk larger than a segment
    /// is appended in parts, and a later part may fail: out of space at the roll, an I/O
    /// error, a truncation meanwhile): the parts the log holds count as appended, and
    /// the epochs noted for the batches it does not hold go, so the log end, the epoch
    /// cache and the producer state (`append_replicated` rebuilt it) agree. The fetcher
    /// pauses the partition on the error and fetches again from the log end.
    ///
    /// `started` is [`Self::follower_position`] when the append began: the epochs are
    /// dropped only while the same leader and leader epoch hold. A new leader's fetcher
    /// may meanwhile have cut the log (which is why this append failed) and noted its
    /// epoch at the new log end; that entry is not this append's to drop.
    async fn replicated_append_failed(
        &self,
        failed: ReplicatedAppendFailed,
        from: Offset,
        started: (Option<wire::NodeId>, LeaderEpoch, Offset, u64),
    ) -> i16 {
        let end = self.log.log_end_offset();
        let (leader, epoch, ..) = self.follower_position();
        let same_leader = (leader, epoch) == (started.0, started.1);
        if let Some(info) = &failed.appended {
            self.log_grew(info.last_offset.add(1).min(end));
        }
        // A follower's epochs all come from batches it copied, so none may start at or
        // past its log end. Not on a leader (it became one meanwhile): its own epoch
        // starts at its log end before anything is appended under it.
        let leads = self.replica.borrow().is_leader();
        let stale = self.epochs.borrow().latest().is_some_and(|(_, s)| s >= end);
        if !leads
            && same_leader
            && stale
            && let Err(code) = self.truncate_epochs(end).await
        {
            return code;
        }
        tracing::warn!(topic = %self.topic, partition = self.index, %from, log_end = %end, "replicated append failed; refetching from the log end: {failed}");
        storage_error_code(&failed.error)
    }

    /// What a follower's append is checked against: this replica's leader (none while it
    /// leads) and leader epoch, its log end and how many times its log was cut.
    fn follower_position(&self) -> (Option<wire::NodeId>, LeaderEpoch, Offset, u64) {
        let replica = self.replica.borrow();
        let leader = (!replica.is_leader()).then(|| replica.leader());
        (
            leader,
            replica.leader_epoch(),
            self.log.log_end_offset(),
            self.log.truncations(),
        )
    }

    /// The producer of `records` if they are a transactional batch that would open a
    /// transaction here (its producer has none open in this partition under the batch's
    /// epoch): such a batch is checked with the transaction coordinator first (KIP-890).
    /// A batch of another epoch than the open transaction's is checked too: appended, it
    /// would fence that transaction's own markers and wedge it.
    pub fn opens_transaction(
        &self,
        records: &[u8],
    ) -> Option<(wire::ProducerId, wire::ProducerEpoch)> {
        let header = wire::batch::read_header(records).ok()?;
        let attributes = header.attributes();
        if !attributes.is_transactional() || attributes.is_control() {
            return None;
        }
        let pid = header.producer_id();
        let epoch = header.producer_epoch();
        if !pid.is_some() || self.producers.has_open_txn_at(pid, epoch) {
            return None;
        }
        Some((pid, epoch))
    }

    /// A coordinator's append of a batch it built (see
    /// `PartitionProducers::append_unchecked`), answered once the local append completed.
    pub async fn append_coordinator(
        &self,
        mut records: BytesMut,
        now_ms: i64,
    ) -> Result<Offset, i16> {
        let epoch = {
            let replica = self.replica.borrow();
            if !replica.is_leader() || self.truncating() {
                return Err(errors::NOT_LEADER_OR_FOLLOWER);
            }
            replica.leader_epoch()
        };
        // A coordinator's batches stay as it built them: Kafka pins its internal topics to
        // `compression.type=producer`.
        self.validate(&mut records, now_ms, TopicCompression::Producer)
            .map_err(|r| r.error)?;
        self.note_epoch(epoch, self.log.log_end_offset())?;
        let appended = self
            .producers
            .append_unchecked(&self.log, records, epoch, now_ms)
            .await
            .map_err(|e| storage_error_code(&e))?;
        let info = match appended {
            ProducerAppend::Appended(info) => info,
            ProducerAppend::Rejected(code) => return Err(code),
            ProducerAppend::Duplicate(_) => return Err(errors::UNKNOWN_SERVER_ERROR),
        };
        self.log_grew(info.last_offset.add(1));
        Ok(info.first_offset)
    }

    /// Writes a transaction marker (WriteTxnMarkers, or the local coordinator) on the
    /// leader; answered once the local append completed (the HW then covers it on a
    /// single node). Returns a Kafka error code.
    pub async fn write_marker(&self, marker: Marker, now_ms: i64) -> i16 {
        let epoch = {
            let replica = self.replica.borrow();
            if !replica.is_leader() || self.truncating() {
                return errors::NOT_LEADER_OR_FOLLOWER;
            }
            replica.leader_epoch()
        };
        if let Err(code) = self.note_epoch(epoch, self.log.log_end_offset()) {
            return code;
        }
        match self
            .producers
            .append_marker(&self.log, marker, epoch, now_ms)
            .await
        {
            Ok(Ok(offset)) => {
                self.log_grew(offset.add(1));
                errors::NONE
            }
            Ok(Err(code)) => code,
            Err(e) => {
                crate::client_warn!(topic = %self.topic, partition = self.index, "marker append failed: {e}");
                storage_error_code(&e)
            }
        }
    }

    /// Kafka's checks of a client's records before they are appended: exactly one batch
    /// (Produce v3+, the only versions that reach here), within `max.message.bytes`, and
    /// every record walked (`wire::batch::walk_produced_records`; a compressed batch is
    /// decompressed into a bounded buffer): a compacted topic refuses keyless records, a
    /// CreateTime topic records outside `message.timestamp.before/after.max.ms`. One batch
    /// bounds the decompression one request makes a shard do per partition. On a
    /// CreateTime topic a header `maxTimestamp` that is not the records' max is rewritten
    /// (with the CRC), as Kafka's `LogValidator` does. A batch in another codec than
    /// `compression` asks for is replaced by one in that codec (see
    /// [`Partition::check_records`]); once rewritten it too must be within
    /// `max.message.bytes` (Kafka's RecordTooLargeException, MESSAGE_TOO_LARGE). A batch
    /// kept as it came is neither copied nor reallocated.
    fn validate(
        &self,
        records: &mut BytesMut,
        now_ms: i64,
        compression: TopicCompression,
    ) -> Result<(), Refusal> {
        let range = {
            let mut batches = split_batches(records);
            let first = batches
                .next()
                .ok_or(Refusal::code(errors::INVALID_RECORD))?;
            let range = first.map_err(|e| Refusal::code(wire_error_code(&e)))?;
            match batches.next() {
                None => range,
                Some(Ok(_)) => return Err(Refusal::said(errors::INVALID_RECORD, NOT_ONE_BATCH)),
                Some(Err(e)) => return Err(Refusal::code(wire_error_code(&e))),
            }
        };
        let max_bytes = self.max_message_bytes.get();
        if range.len() > max_bytes {
            return Err(Refusal::code(errors::MESSAGE_TOO_LARGE));
        }
        let checked = self.check_records(&records[range.clone()], now_ms, compression)?;
        let range = match checked.rewritten {
            None => range,
            Some(batch) if batch.len() > max_bytes => {
                return Err(Refusal::said(
                    errors::MESSAGE_TOO_LARGE,
                    RECOMPRESSED_TOO_LARGE,
                ));
            }
            Some(batch) => {
                // The request's buffer held only this batch (checked above): replaced whole.
                // A Vec becomes a BytesMut without a copy.
                *records = BytesMut::from(Bytes::from(batch));
                0..records.len()
            }
        };
        if let Some(max) = checked.max_timestamp {
            set_max_timestamp(&mut records[range], max);
        }
        Ok(())
    }

    /// Walks every record of one batch (see [`Partition::validate`]). Returns what the
    /// walk learnt that the batch may need corrected, and the batch rewritten in the codec
    /// `compression` asks for when it came in another: from the records the walk already
    /// decompressed, so a batch is decompressed once, into a buffer bounded as the walk's.
    fn check_records(
        &self,
        batch: &[u8],
        now_ms: i64,
        compression: TopicCompression,
    ) -> Result<Checked, Refusal> {
        let header = *read_header(batch).map_err(|e| Refusal::code(wire_error_code(&e)))?;
        let invalid = |e: wire::WireError| Refusal::said(errors::INVALID_RECORD, why_invalid(&e));
        wire::batch::check_produced_header(&header).map_err(invalid)?;
        let decompressed_max =
            crate::storage::cleaner::decompressed_batch_bytes_max(self.max_message_bytes.get());
        // Borrowed from `batch` when it is not compressed: nothing copied.
        let records =
            wire::batch::uncompressed_records(batch, decompressed_max).map_err(invalid)?;
        let max_timestamp = self.check_each_record(&header, &records, now_ms)?;
        // validate_batch accepted only known codecs; Producer keeps whatever came.
        let source = header
            .attributes()
            .compression()
            .unwrap_or(Compression::None);
        let target = compression.target(source);
        let rewritten = match target == source {
            true => None,
            // Bounded by max.message.bytes as it is built: an oversized rewrite stops at
            // the bound instead of being built whole and refused after.
            false => Some(
                wire::batch::recompress::with_codec(
                    batch,
                    &records,
                    target,
                    BROKER_SNAPPY_FRAMING,
                    self.compression_levels.get(),
                    self.max_message_bytes.get(),
                )
                .map_err(|e| match e {
                    wire::WireError::TooLarge { .. } => {
                        Refusal::said(errors::MESSAGE_TOO_LARGE, RECOMPRESSED_TOO_LARGE)
                    }
                    e => {
                        tracing::warn!(topic = %self.topic, partition = self.index, "recompression to {target:?} failed: {e}");
                        Refusal::code(errors::UNKNOWN_SERVER_ERROR)
                    }
                })?,
            ),
        };
        let wrong_max = self.log.config().message_timestamp_type == TimestampType::CreateTime
            && header.max_timestamp() != max_timestamp;
        Ok(Checked {
            max_timestamp: wrong_max.then_some(max_timestamp),
            rewritten,
        })
    }

    /// The per-record checks of [`Partition::check_records`] over a batch's uncompressed
    /// `records`; returns the records' max timestamp.
    fn check_each_record(
        &self,
        header: &wire::batch::BatchHeader,
        records: &[u8],
        now_ms: i64,
    ) -> Result<i64, Refusal> {
        let compacted = self.compacted.get();
        let config = self.log.config();
        // With LogAppendTime the broker's clock replaces the records' timestamps.
        let create_time = config.message_timestamp_type == TimestampType::CreateTime;
        let earliest = now_ms.saturating_sub(config.message_timestamp_before_max_ms);
        let latest = now_ms.saturating_add(config.message_timestamp_after_max_ms);
        let (mut keyless, mut out_of_range) = (Vec::new(), Vec::new());
        let mut max_timestamp = i64::MIN;
        let count = header.records_count();
        let walked = wire::batch::walk_produced_records(records, count, |i, record| {
            let index = i32::try_from(i).unwrap_or(i32::MAX);
            // Kafka: a compacted topic refuses records without a key (the cleaner could
            // not tell which to keep), naming each such record.
            if compacted && record.key.is_none() {
                keyless.push(index);
            }
            let ts = header
                .base_timestamp()
                .saturating_add(record.timestamp_delta);
            max_timestamp = max_timestamp.max(ts);
            // Kafka's message.timestamp.before/after.max.ms, per record (KIP-937); -1 is
            // "no timestamp", not checked.
            if create_time && ts != -1 && (ts < earliest || ts > latest) {
                out_of_range.push(index);
            }
            Ok(())
        });
        if let Err(e) = walked {
            return Err(Refusal::said(errors::INVALID_RECORD, why_invalid(&e)));
        }
        if !out_of_range.is_empty() {
            // Kafka answers INVALID_TIMESTAMP when any record's timestamp is refused,
            // naming every refused record.
            let mut records = out_of_range;
            records.extend(keyless);
            records.sort_unstable();
            records.dedup();
            return Err(Refusal {
                error: errors::INVALID_TIMESTAMP,
                records,
                message: Some(TIMESTAMP_OUT_OF_RANGE),
            });
        }
        if !keyless.is_empty() {
            return Err(Refusal {
                error: errors::INVALID_RECORD,
                records: keyless,
                message: Some(KEYLESS_IN_COMPACTED),
            });
        }
        Ok(max_timestamp)
    }
}

/// What walking a produced batch found to correct.
struct Checked {
    /// The records' max timestamp, when the header's differs (CreateTime only).
    max_timestamp: Option<i64>,
    /// The batch in the topic's codec, when it came in another.
    rewritten: Option<Vec<u8>>,
}

/// Rewrites a batch's `maxTimestamp` and its CRC (which covers it).
fn set_max_timestamp(batch: &mut [u8], max_timestamp: i64) {
    /// Where the header's maxTimestamp sits, and the CRC and the bytes it covers.
    const MAX_TIMESTAMP: std::ops::Range<usize> = 35..43;
    const CRC: std::ops::Range<usize> = 17..21;
    const CRC_START: usize = 21;
    if batch.len() < wire::batch::BATCH_HEADER_SIZE {
        return;
    }
    batch[MAX_TIMESTAMP].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[CRC].copy_from_slice(&crc.to_be_bytes());
    debug_assert!(wire::batch::validate_batch(batch).is_ok());
}

/// A client-readable reason for a batch whose records do not walk.
fn why_invalid(e: &wire::WireError) -> &'static str {
    use wire::WireError as E;
    match e {
        E::Decompression { .. } => "Record batch could not be decompressed",
        E::TooLarge {
            field: "recordsCount",
            ..
        } => "Record batch holds fewer records than its recordsCount",
        E::TooLarge {
            field: "headersCount",
            ..
        } => "Record holds fewer headers than its headersCount",
        E::Invalid { reason, .. } => reason,
        E::UnexpectedEof { .. } => "Record runs past the end of its batch",
        _ => "Corrupt record batch",
    }
}
