//! Reading and writing a coordinator's `__consumer_offsets` partition: appends of offset
//! commits, group metadata and tombstones as record batches, and the replay that
//! rebuilds every group of a partition after a start. Runs on the partition's shard.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use kafka_protocol::messages::ConsumerProtocolSubscription;
use kafka_protocol::protocol::Decodable;
use wire::batch::{BatchBuilder, NewRecord, batch_records, split_batches};

use super::codes;
use super::schema::{self, GroupValue, Key, OffsetValue};
use super::state::{Group, State};
use crate::partition::{Acks, Partition};
use crate::shard::now_ms;
use wire::Offset;

/// Bytes asked of the log per read during replay.
const REPLAY_READ_BYTES: usize = 1 << 20;
/// The coordinator's own appends: answered once the local append completed. On a single
/// node that is also when the HW covers them; with replicated `__consumer_offsets` the
/// coordinator will wait for the HW (acks=all, as Kafka's does).
const COORDINATOR_ACKS: Acks = Acks::Leader;
/// How long a coordinator append may take before it is answered REQUEST_TIMED_OUT.
const COORDINATOR_APPEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn far_deadline() -> std::time::Instant {
    std::time::Instant::now() + COORDINATOR_APPEND_TIMEOUT
}
/// Most bytes a compressed batch may inflate to during replay.
const REPLAY_DECOMPRESSED_MAX: usize = 64 << 20;
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
fn build_batch(records: Vec<NewRecord>, max_bytes: usize) -> Result<Bytes, i16> {
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

/// Appends `records` in as few batches as the batch limit allows, back to back.
async fn append(part: &Partition, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
    let batches = build_batches(records, batch_bytes_max(part), now_ms())?;
    append_contiguous(part, batches)
        .await
        .map(|_| ())
        .map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)
}

/// Writes committed offsets: all of one commit in one batch, so that a commit is stored
/// whole or not at all (a batch is appended, and survives a crash, as a unit; a torn one
/// is cut off by recovery). A commit larger than one batch may be is refused with
/// INVALID_COMMIT_OFFSET_SIZE, as Kafka does, and nothing of it is written.
pub async fn write_offsets(
    part: &Partition,
    group: &str,
    offsets: &[((String, i32), OffsetValue)],
) -> Result<(), i16> {
    if offsets.is_empty() {
        return Ok(());
    }
    let records = offsets
        .iter()
        .map(|((t, p), v)| NewRecord {
            timestamp_ms: v.commit_timestamp_ms,
            key: Some(schema::offset_key(group, t, *p)),
            value: Some(schema::offset_value(v)),
            headers: Vec::new(),
        })
        .collect();
    let too_large = |code| match code {
        crate::errors::MESSAGE_TOO_LARGE | crate::errors::RECORD_LIST_TOO_LARGE => {
            codes::INVALID_COMMIT_OFFSET_SIZE
        }
        _ => codes::COORDINATOR_NOT_AVAILABLE,
    };
    let batch = build_batch(records, batch_bytes_max(part)).map_err(too_large)?;
    append_contiguous(part, vec![batch])
        .await
        .map(|_| ())
        .map_err(too_large)
}

/// Writes a group's metadata.
pub async fn write_group(part: &Partition, group: &str, value: &GroupValue) -> Result<(), i16> {
    let record = (schema::group_key(group), Some(schema::group_value(value)));
    append(part, vec![record]).await
}

/// Deletes offsets (and the group's metadata if `whole_group`).
pub async fn tombstones(
    part: &Partition,
    group: &str,
    offsets: &[(String, i32)],
    whole_group: bool,
) -> Result<(), i16> {
    let mut records: Vec<(Bytes, Option<Bytes>)> = offsets
        .iter()
        .map(|(t, p)| (schema::offset_key(group, t, *p), None))
        .collect();
    if whole_group {
        records.push((schema::group_key(group), None));
    }
    if records.is_empty() {
        return Ok(());
    }
    append(part, records).await
}

/// Replays the partition from its log start into `groups`. Returns the records applied.
pub async fn replay(
    part: &Partition,
    groups: &mut HashMap<String, Group>,
    now: i64,
) -> Result<u64, i16> {
    let end = part.high_watermark().get();
    let mut offset = part.log.log_start_offset().get();
    let mut applied = 0u64;
    // Every read moves `offset` forward by at least one batch; bound the loop anyway.
    let mut reads_left = end.saturating_sub(offset).max(0) + 1;
    while offset < end && reads_left > 0 {
        reads_left -= 1;
        let out = part.fetch(Offset(offset), REPLAY_READ_BYTES).await;
        if out.error != codes::NONE {
            tracing::error!(
                partition = part.index,
                offset,
                "replay read failed: error {}",
                out.error
            );
            return Err(codes::COORDINATOR_NOT_AVAILABLE);
        }
        if out.batches.is_empty() {
            break;
        }
        for chunk in &out.batches {
            let next = replay_chunk(chunk, groups, now, &mut applied)?;
            offset = offset.max(next);
        }
    }
    groups.retain(|_, g| g.state != State::Empty || !g.offsets.is_empty() || g.generation > 0);
    Ok(applied)
}

/// Applies every record of the batches in `chunk`; returns the offset after the last.
fn replay_chunk(
    chunk: &Bytes,
    groups: &mut HashMap<String, Group>,
    now: i64,
    applied: &mut u64,
) -> Result<i64, i16> {
    let mut next = 0;
    for range in split_batches(chunk) {
        let range = range.map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
        let batch = chunk.slice(range);
        let (header, records) = batch_records(&batch, REPLAY_DECOMPRESSED_MAX)
            .map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
        next = header.next_offset().get();
        if header.attributes().is_control() {
            continue;
        }
        for record in records {
            let record = record.map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
            let Some(key) = record.key else { continue };
            apply(&key, record.value.as_ref(), groups, now);
            *applied += 1;
        }
    }
    Ok(next)
}

/// Applies one stored record: the latest value per key wins; a tombstone deletes.
fn apply(key: &Bytes, value: Option<&Bytes>, groups: &mut HashMap<String, Group>, now: i64) {
    let key = match schema::decode_key(key) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!("skipping unreadable __consumer_offsets key: {e}");
            return;
        }
    };
    match key {
        Key::Offset {
            group,
            topic,
            partition,
        } => {
            let g = groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group, now));
            match value.map(schema::decode_offset_value) {
                None => {
                    g.offsets.remove(&(topic, partition));
                }
                Some(Ok(v)) => {
                    g.offsets.insert((topic, partition), v);
                }
                Some(Err(e)) => tracing::warn!(group, "skipping unreadable offset value: {e}"),
            }
        }
        Key::Group(group) => match value.map(schema::decode_group_value) {
            None => {
                groups.remove(&group);
            }
            Some(Ok(v)) => groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group, now))
                .restore(v, now),
            Some(Err(e)) => tracing::warn!(group, "skipping unreadable group value: {e}"),
        },
    }
}

/// Topics the group's members subscribe to (consumer protocol only).
pub fn subscribed_topics(g: &Group) -> BTreeSet<String> {
    let mut topics = BTreeSet::new();
    if g.protocol_type.as_deref() != Some("consumer") {
        return topics;
    }
    let protocol = g.protocol.clone().unwrap_or_default();
    for m in &g.members {
        let mut meta = m.metadata(&protocol);
        if meta.len() < 2 {
            continue;
        }
        let version = i16::from_be_bytes([meta[0], meta[1]]);
        let mut body = meta.split_off(2);
        if let Ok(sub) = ConsumerProtocolSubscription::decode(&mut body, version.clamp(0, 3)) {
            topics.extend(sub.topics.iter().map(|t| t.to_string()));
        }
    }
    topics
}

/// Offsets of `g` whose retention has run out (KIP-211): all of an empty group's once it
/// has been empty for `retention_ms`; for a group that never used group management
/// (no protocol type), each offset `retention_ms` after its commit.
pub fn expired_offsets(g: &Group, now: i64, retention_ms: i64) -> Vec<(String, i32)> {
    if g.state != State::Empty {
        return Vec::new();
    }
    let standalone = g.protocol_type.is_none();
    let group_expired = now - g.state_since_ms >= retention_ms;
    g.offsets
        .iter()
        .filter(|(_, v)| {
            if standalone {
                now - v.commit_timestamp_ms >= retention_ms
            } else {
                group_expired
            }
        })
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(commit_ms: i64) -> OffsetValue {
        OffsetValue {
            offset: Offset(1),
            leader_epoch: wire::LeaderEpoch::NONE,
            metadata: String::new(),
            commit_timestamp_ms: commit_ms,
        }
    }

    #[test]
    fn batches_stay_within_the_limit_and_keep_the_order() {
        let records: Vec<(Bytes, Option<Bytes>)> = (0..1000u32)
            .map(|i| {
                let key = Bytes::from(i.to_be_bytes().to_vec());
                let value = (i % 7 != 0).then(|| Bytes::from(vec![b'v'; (i % 300) as usize]));
                (key, value)
            })
            .collect();
        let max = 16 << 10;
        let batches = build_batches(records.clone(), max, 5).expect("fits");
        assert!(batches.len() > 1, "needs several batches");
        let mut seen = Vec::new();
        for batch in &batches {
            assert!(batch.len() <= max, "batch of {} bytes", batch.len());
            let (_, recs) = batch_records(batch, max).expect("valid batch");
            for r in recs {
                let r = r.expect("record");
                seen.push((r.key.expect("key"), r.value));
            }
        }
        assert_eq!(seen, records, "every record once, in order");
        let huge = vec![(Bytes::from_static(b"k"), Some(Bytes::from(vec![0u8; max])))];
        assert_eq!(
            build_batches(huge, max, 5),
            Err(crate::errors::MESSAGE_TOO_LARGE)
        );
        assert!(build_batches(Vec::new(), max, 5).expect("empty").is_empty());
    }

    #[test]
    fn retention_of_empty_groups() {
        let mut standalone = Group::new("s", 0);
        standalone.offsets.insert(("t".into(), 0), offset(100));
        standalone.offsets.insert(("t".into(), 1), offset(900));
        assert_eq!(
            expired_offsets(&standalone, 1000, 500),
            vec![("t".into(), 0)]
        );
        let mut consumer = Group::new("c", 0);
        consumer.protocol_type = Some("consumer".into());
        consumer.state_since_ms = 700;
        consumer.offsets.insert(("t".into(), 0), offset(100));
        assert!(
            expired_offsets(&consumer, 1000, 500).is_empty(),
            "empty for 300 ms only"
        );
        assert_eq!(expired_offsets(&consumer, 1200, 500).len(), 1);
        consumer.state = State::Stable;
        assert!(
            expired_offsets(&consumer, 5000, 500).is_empty(),
            "live groups keep offsets"
        );
    }

    #[test]
    fn apply_latest_wins_and_tombstones_delete() {
        let mut groups = HashMap::new();
        let key = schema::offset_key("g", "t", 0);
        apply(
            &key,
            Some(&schema::offset_value(&offset(1))),
            &mut groups,
            0,
        );
        let mut later = offset(2);
        later.offset = Offset(7);
        apply(&key, Some(&schema::offset_value(&later)), &mut groups, 0);
        assert_eq!(groups["g"].offsets[&("t".to_string(), 0)].offset, Offset(7));
        apply(&key, None, &mut groups, 0);
        assert!(groups["g"].offsets.is_empty());
        let gv = GroupValue {
            protocol_type: "consumer".into(),
            generation: 4,
            ..GroupValue::default()
        };
        apply(
            &schema::group_key("g"),
            Some(&schema::group_value(&gv)),
            &mut groups,
            0,
        );
        assert_eq!(groups["g"].generation, 4);
        apply(&schema::group_key("g"), None, &mut groups, 0);
        assert!(!groups.contains_key("g"));
        apply(&Bytes::from_static(b"\x00"), None, &mut groups, 0);
    }
}
