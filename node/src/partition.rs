//! One partition replica on its owning shard: the [`Log`], the high watermark, and the
//! [`Event`] that wakes long-polling fetches when records are appended.
//!
//! Lives on exactly one shard (`!Send`: `Rc<Log>`, `Cell`s); other shards reach it only
//! through that shard's inbox (see `shard`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use wire::batch::split_batches;
use wire::{LeaderEpoch, Offset, WireError};

use crate::errors;
use crate::event::Event;
use crate::producer_state::ProducerStateConfig;
use crate::producer_state::partition::{PartitionProducers, ProducerAppend, wait_committed};
use crate::storage::{Log, LogConfig, StorageError};

/// Largest decompressed batch ListOffsets-by-time will look inside.
const DECOMPRESSED_BATCH_MAX_BYTES: usize = 64 << 20;

/// Single-node leader epoch: weir does not change leaders yet.
pub const LEADER_EPOCH: LeaderEpoch = LeaderEpoch(0);

/// Result of appending one Produce partition's records.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProduceOutcome {
    pub error: i16,
    pub base_offset: i64,
    pub log_append_time_ms: i64,
    pub log_start_offset: i64,
}

/// Result of one Fetch partition read.
#[derive(Clone, Debug, Default)]
pub struct FetchOutcome {
    pub error: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// Whole batches, zero-copy slices of the log's buffers.
    pub batches: Vec<Bytes>,
}

impl FetchOutcome {
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(Bytes::len).sum()
    }

    /// The outcome of a read that could not run (`error` is a Kafka error code).
    pub fn refused(error: i16) -> FetchOutcome {
        FetchOutcome {
            error,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            ..Default::default()
        }
    }
}

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
    /// Single node: the HW is the end of the last append that completed.
    high_watermark: Cell<Offset>,
    /// Notified after every completed append (wakes long-polling fetches).
    pub appended: Event,
    max_message_bytes: Cell<usize>,
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

/// `<data_dir>/<topic>-<partition>`, Kafka's layout.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: i32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

impl Partition {
    /// Opens (and recovers) the partition's log.
    pub async fn open(
        data_dir: &Path,
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
            configs: RefCell::new(configs),
            log: Rc::new(log),
            producers,
            high_watermark: Cell::new(leo),
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
        *self.configs.borrow_mut() = configs;
        Ok(())
    }

    /// The largest batch an append may carry (the topic's `max.message.bytes`).
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.get()
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark.get()
    }

    /// Validates every batch (CRC, sizes, `max.message.bytes`), then appends them all.
    /// `records` is ideally a unique buffer (appended in place); a shared `Bytes` is copied.
    pub async fn produce(&self, records: impl Into<BytesMut>, now_ms: i64) -> ProduceOutcome {
        let records: BytesMut = records.into();
        if let Err(error) = self.validate(&records) {
            return ProduceOutcome {
                error,
                base_offset: -1,
                log_append_time_ms: -1,
                log_start_offset: -1,
            };
        }
        // The records are this request's own bytes (see `api::produce`): the log patches
        // offsets into them in place.
        let buf = records;
        let appended = match self
            .producers
            .append(&self.log, buf, LEADER_EPOCH, now_ms)
            .await
        {
            Ok(ProducerAppend::Appended(info)) => Ok(info),
            Ok(ProducerAppend::Duplicate(original)) => {
                return self
                    .duplicate(original.first_offset, original.last_offset)
                    .await;
            }
            Ok(ProducerAppend::Rejected(error)) => {
                return ProduceOutcome {
                    error,
                    base_offset: -1,
                    log_append_time_ms: -1,
                    log_start_offset: -1,
                };
            }
            Err(e) => Err(e),
        };
        match appended {
            Ok(info) => {
                let end = info.last_offset.add(1);
                if end > self.high_watermark.get() {
                    self.high_watermark.set(end);
                }
                self.appended.notify_all();
                ProduceOutcome {
                    error: errors::NONE,
                    base_offset: info.first_offset.get(),
                    log_append_time_ms: info.log_append_time_ms.unwrap_or(-1),
                    log_start_offset: info.log_start_offset.get(),
                }
            }
            Err(e) => {
                tracing::warn!(topic = %self.topic, partition = self.index, "append failed: {e}");
                ProduceOutcome {
                    error: storage_error_code(&e),
                    base_offset: -1,
                    log_append_time_ms: -1,
                    log_start_offset: -1,
                }
            }
        }
    }

    /// A resend of an appended batch: its original offsets once the original is committed
    /// (REQUEST_TIMED_OUT if that does not happen within 30 s, e.g. its append failed).
    async fn duplicate(&self, first: Offset, last: Offset) -> ProduceOutcome {
        let hw = || self.high_watermark.get();
        let committed = wait_committed(last, hw, &self.appended, Duration::from_secs(30)).await;
        ProduceOutcome {
            error: if committed {
                errors::NONE
            } else {
                errors::REQUEST_TIMED_OUT
            },
            base_offset: if committed { first.get() } else { -1 },
            log_append_time_ms: -1,
            log_start_offset: self.log.log_start_offset().get(),
        }
    }

    fn validate(&self, records: &[u8]) -> Result<(), i16> {
        if records.is_empty() {
            return Err(errors::INVALID_RECORD);
        }
        for range in split_batches(records) {
            let range = range.map_err(|e| wire_error_code(&e))?;
            if range.len() > self.max_message_bytes.get() {
                return Err(errors::MESSAGE_TOO_LARGE);
            }
        }
        Ok(())
    }

    /// Reads from `offset` up to the HW (both isolation levels: without transactions the
    /// LSO equals the HW).
    pub async fn fetch(&self, offset: i64, max_bytes: usize) -> FetchOutcome {
        self.fetch_within(offset, max_bytes, usize::MAX).await
    }

    /// Like [`fetch`](Self::fetch), but returns at most `hard_max_bytes` of records (not even
    /// a first batch past it; see `Log::read_within`). With `hard_max_bytes` 0 the log is
    /// not read at all: the outcome carries only the offsets and the error.
    pub async fn fetch_within(
        &self,
        offset: i64,
        max_bytes: usize,
        hard_max_bytes: usize,
    ) -> FetchOutcome {
        let hw = self.high_watermark.get();
        let mut out = FetchOutcome {
            error: errors::NONE,
            high_watermark: hw.get(),
            last_stable_offset: hw.get(),
            log_start_offset: self.log.log_start_offset().get(),
            batches: Vec::new(),
        };
        if offset == hw.get() {
            return out;
        }
        if offset > hw.get() || offset < out.log_start_offset {
            out.error = errors::OFFSET_OUT_OF_RANGE;
            return out;
        }
        if hard_max_bytes == 0 {
            return out;
        }
        let read = self
            .log
            .read_within(Offset(offset), max_bytes, hard_max_bytes, hw);
        match read.await {
            Ok(read) => {
                out.batches = read.batches;
                out.log_start_offset = read.log_start_offset.get();
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

    /// ListOffsets: -2 earliest, -1 latest, -3 max timestamp, else the first offset whose
    /// timestamp is >= `timestamp`. Returns (error, timestamp, offset).
    pub async fn list_offset(&self, timestamp: i64) -> (i16, i64, i64) {
        match timestamp {
            -2 => (errors::NONE, -1, self.log.log_start_offset().get()),
            -1 => (errors::NONE, -1, self.high_watermark.get().get()),
            -3 => {
                let (ts, offset) = self.log.max_timestamp();
                if ts < 0 {
                    (errors::NONE, -1, -1)
                } else {
                    (errors::NONE, ts, offset.get())
                }
            }
            ts if ts < 0 => (errors::UNSUPPORTED_VERSION, -1, -1),
            ts => match self.log.read_by_time(ts).await {
                Ok(Some((offset, found_ts))) => {
                    let exact = self.first_record_at(offset, ts).await;
                    let (ts, offset) = exact.unwrap_or((found_ts, offset.get()));
                    (errors::NONE, ts, offset)
                }
                Ok(None) => (errors::NONE, -1, -1),
                Err(e) => (storage_error_code(&e), -1, -1),
            },
        }
    }

    /// Within the batch at `batch_offset` (found by the time index), the first record whose
    /// timestamp is >= `ts`, as (its timestamp, its offset): Kafka answers ListOffsets by
    /// time with that exact record, not the batch. `None` if the batch cannot be read.
    async fn first_record_at(&self, batch_offset: Offset, ts: i64) -> Option<(i64, i64)> {
        let read = self
            .log
            .read(batch_offset, 1, self.high_watermark.get())
            .await
            .ok()?;
        let batch = read.batches.into_iter().next()?;
        let (header, records) =
            wire::batch::batch_records(&batch, DECOMPRESSED_BATCH_MAX_BYTES).ok()?;
        if header.attributes().timestamp_type() == wire::batch::TimestampType::LogAppendTime {
            return Some((header.max_timestamp(), header.base_offset().get()));
        }
        for record in records {
            let record = record.ok()?;
            let record_ts = header
                .base_timestamp()
                .saturating_add(record.timestamp_delta);
            let offset = header.base_offset().get() + i64::from(record.offset_delta);
            if record_ts >= ts && offset >= batch_offset.get() {
                return Some((record_ts, offset));
            }
        }
        None
    }

    /// DeleteRecords: -1 means "up to the HW". Returns (error, new low watermark).
    pub async fn delete_records(&self, offset: i64) -> (i16, i64) {
        let hw = self.high_watermark.get();
        let target = if offset == -1 { hw } else { Offset(offset) };
        if target > hw || target.get() < 0 {
            return (errors::OFFSET_OUT_OF_RANGE, -1);
        }
        match self.log.delete_records_before(target).await {
            Ok(start) => (errors::NONE, start.get()),
            Err(e) => (storage_error_code(&e), -1),
        }
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
