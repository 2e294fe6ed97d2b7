//! What the coordinators (group: `crate::group`, transaction: `crate::txn`) share: the
//! host of their internal topic's partitions on a shard — each partition opened and
//! replayed once, concurrent users waiting for that replay ([`PartitionLoads`]) — and
//! the coordinator's appends to them: records packed into batches within the topic's
//! limits, appended back to back ([`append_contiguous`]), and the replay read loop
//! ([`replay_batches`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::rc::Rc;

use bytes::Bytes;

use wire::batch::{BatchBuilder, NewRecord, split_batches};

use crate::event::Event;
use crate::partition::{Acks, Partition};
use crate::shard::now_ms;

/// Bytes asked of the log per read during replay.
const REPLAY_READ_BYTES: usize = 1 << 20;

mod codes {
    pub use crate::errors::{NONE, UNKNOWN_SERVER_ERROR};
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
}

/// The internal-topic partitions a coordinator has loaded on this shard, by index.
#[derive(Default)]
pub struct PartitionLoads {
    loaded: RefCell<BTreeMap<i32, Rc<Partition>>>,
    /// Partitions being replayed right now (others wait for the replay).
    loading: RefCell<HashMap<i32, Rc<Event>>>,
}

impl PartitionLoads {
    /// The loaded partition `index`, if it is.
    pub fn get(&self, index: i32) -> Option<Rc<Partition>> {
        self.loaded.borrow().get(&index).cloned()
    }

    /// Every loaded partition.
    pub fn all(&self) -> Vec<(i32, Rc<Partition>)> {
        self.loaded
            .borrow()
            .iter()
            .map(|(i, p)| (*i, p.clone()))
            .collect()
    }

    /// The loaded partition `index`; the first caller runs `replay` (which opens and
    /// replays it), later ones wait for that replay to end. A replay that failed leaves
    /// it unloaded (the next caller tries again); its waiters get
    /// COORDINATOR_LOAD_IN_PROGRESS and retry.
    pub async fn load<F, Fut>(&self, index: i32, replay: F) -> Result<Rc<Partition>, i16>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Rc<Partition>, i16>>,
    {
        if let Some(p) = self.get(index) {
            return Ok(p);
        }
        let waiting = self.loading.borrow().get(&index).cloned();
        if let Some(ev) = waiting {
            ev.listen().await;
            return self.get(index).ok_or(codes::COORDINATOR_LOAD_IN_PROGRESS);
        }
        let ev = Rc::new(Event::default());
        self.loading.borrow_mut().insert(index, ev.clone());
        let result = replay().await;
        if let Ok(p) = &result {
            self.loaded.borrow_mut().insert(index, p.clone());
        }
        self.loading.borrow_mut().remove(&index);
        ev.notify_all();
        result
    }
}

/// Feeds every batch of `part` from its log start to its HW to `f`, in offset order.
/// Returns how many batches were read.
pub async fn replay_batches(
    part: &Partition,
    mut f: impl FnMut(Bytes) -> Result<(), i16>,
) -> Result<u64, i16> {
    let end = part.high_watermark();
    let mut offset = part.log.log_start_offset();
    let mut batches = 0u64;
    // Every read moves `offset` forward by at least one batch; bound the loop anyway.
    let mut reads_left = end.get().saturating_sub(offset.get()).max(0) + 1;
    while offset < end && reads_left > 0 {
        reads_left -= 1;
        let out = part.fetch(offset, REPLAY_READ_BYTES).await;
        if out.error != codes::NONE {
            tracing::error!(
                topic = %part.topic,
                partition = part.index,
                offset = %offset,
                "replay read failed: error {}",
                out.error
            );
            return Err(codes::COORDINATOR_NOT_AVAILABLE);
        }
        if out.batches.is_empty() {
            break;
        }
        for chunk in out.batches {
            for range in split_batches(&chunk) {
                let range = range.map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
                let batch = chunk.slice(range);
                let header = wire::batch::read_header(&batch)
                    .map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
                offset = offset.max(header.next_offset());
                batches += 1;
                f(batch)?;
            }
        }
    }
    Ok(batches)
}

/// The coordinator's own appends: answered once the local append completed. On a single
/// node that is also when the HW covers them; with replicated `__consumer_offsets` the
/// coordinator will wait for the HW (acks=all, as Kafka's does).
const COORDINATOR_ACKS: Acks = Acks::Leader;
/// How long a coordinator append may take before it is answered REQUEST_TIMED_OUT.
const COORDINATOR_APPEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn far_deadline() -> std::time::Instant {
    std::time::Instant::now() + COORDINATOR_APPEND_TIMEOUT
}
/// Most bytes one record adds to a v2 batch besides its key and value bytes: length,
/// attributes, timestamp and offset deltas, key and value lengths (varints at their
/// widest), header count.
const RECORD_OVERHEAD_MAX: usize = 5 + 1 + 10 + 5 + 5 + 5 + 1;
/// A v2 batch header (Kafka's `RECORD_BATCH_OVERHEAD`).
const BATCH_HEADER_BYTES: usize = 61;

/// The largest batch the coordinator appends to `part`: the topic's `max.message.bytes`
/// (the log refuses larger ones), and never more than one segment holds.
pub fn batch_bytes_max(part: &Partition) -> usize {
    let segment = usize::try_from(part.log.config().segment_bytes).unwrap_or(usize::MAX);
    part.max_message_bytes().min(segment)
}

/// Packs `(key, value)` records (a `None` value is a tombstone), in order, into batches
/// of at most `max_bytes` each. A record too large for a batch of its own is
/// MESSAGE_TOO_LARGE.
pub fn build_batches(
    records: Vec<(Bytes, Option<Bytes>)>,
    max_bytes: usize,
    now: i64,
) -> Result<Vec<Bytes>, i16> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut estimate = BATCH_HEADER_BYTES;
    for (key, value) in records {
        let size = key.len() + value.as_ref().map_or(0, Bytes::len) + RECORD_OVERHEAD_MAX;
        if !batch.is_empty() && estimate + size > max_bytes {
            out.push(build_batch(std::mem::take(&mut batch), max_bytes)?);
            estimate = BATCH_HEADER_BYTES;
        }
        estimate += size;
        batch.push(NewRecord {
            timestamp_ms: now,
            key: Some(key),
            value,
            headers: Vec::new(),
        });
    }
    if !batch.is_empty() {
        out.push(build_batch(batch, max_bytes)?);
    }
    Ok(out)
}

/// One batch of `records`; MESSAGE_TOO_LARGE if it comes out above `max_bytes`.
pub fn build_batch(records: Vec<NewRecord>, max_bytes: usize) -> Result<Bytes, i16> {
    let batch = BatchBuilder {
        records,
        ..BatchBuilder::default()
    }
    .build()
    .map_err(|_| codes::UNKNOWN_SERVER_ERROR)?;
    if batch.len() > max_bytes {
        return Err(crate::errors::MESSAGE_TOO_LARGE);
    }
    Ok(batch)
}

/// Appends `batches` back to back — no other append of this shard lands between them —
/// and waits until all are written. Returns the offset of the first record.
///
/// The log assigns an append's offsets in the append's first poll (its contract, see
/// `storage::Log::append`), and every first poll runs here before this task yields. An
/// append that did not take its offsets at once stops the rest (never out of order).
pub async fn append_contiguous(part: &Partition, batches: Vec<Bytes>) -> Result<i64, i16> {
    let now = now_ms();
    let first = part.log.log_end_offset().get();
    let mut waiting = Vec::with_capacity(batches.len());
    for batch in batches {
        let before = part.log.log_end_offset();
        let mut append =
            Box::pin(part.produce(batch.into(), COORDINATOR_ACKS, far_deadline(), now));
        match futures_lite::future::poll_once(&mut append).await {
            Some(out) if out.error != codes::NONE => return Err(out.error),
            Some(_) => {}
            None if part.log.log_end_offset() > before => waiting.push(append),
            None => {
                tracing::error!(partition = part.index, "append did not take its offsets");
                return Err(codes::UNKNOWN_SERVER_ERROR);
            }
        }
    }
    for append in waiting {
        let out = append.await;
        if out.error != codes::NONE {
            return Err(out.error);
        }
    }
    Ok(first)
}
