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
use crate::partition::Partition;
use crate::shard::now_ms;

/// Records per appended batch (a commit of many partitions becomes several batches).
const RECORDS_PER_BATCH_MAX: usize = 500;
/// Bytes asked of the log per read during replay.
const REPLAY_READ_BYTES: usize = 1 << 20;
/// Most bytes a compressed batch may inflate to during replay.
const REPLAY_DECOMPRESSED_MAX: usize = 64 << 20;

/// Appends `(key, value)` records (a `None` value is a tombstone).
async fn append(part: &Partition, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
    let now = now_ms();
    let mut records = records.into_iter().peekable();
    while records.peek().is_some() {
        let chunk = records
            .by_ref()
            .take(RECORDS_PER_BATCH_MAX)
            .map(|(k, v)| NewRecord {
                timestamp_ms: now,
                key: Some(k),
                value: v,
                headers: Vec::new(),
            });
        let batch = BatchBuilder {
            records: chunk.collect(),
            ..BatchBuilder::default()
        }
        .build()
        .map_err(|_| codes::UNKNOWN_SERVER_ERROR)?;
        let out = part.produce(batch, now).await;
        if out.error != codes::NONE {
            return Err(codes::COORDINATOR_NOT_AVAILABLE);
        }
    }
    Ok(())
}

/// Writes committed offsets.
pub async fn write_offsets(
    part: &Partition,
    group: &str,
    offsets: &[((String, i32), OffsetValue)],
) -> Result<(), i16> {
    let records = offsets
        .iter()
        .map(|((t, p), v)| {
            (
                schema::offset_key(group, t, *p),
                Some(schema::offset_value(v)),
            )
        })
        .collect();
    append(part, records).await
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
        let out = part.fetch(offset, REPLAY_READ_BYTES).await;
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
            offset: 1,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp_ms: commit_ms,
        }
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
        later.offset = 7;
        apply(&key, Some(&schema::offset_value(&later)), &mut groups, 0);
        assert_eq!(groups["g"].offsets[&("t".to_string(), 0)].offset, 7);
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
