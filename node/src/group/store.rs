//! Reading and writing a coordinator's `__consumer_offsets` partition: appends of offset
//! commits, group metadata and tombstones as record batches, and the replay that
//! rebuilds every group of a partition after a start. Runs on the partition's shard.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use bytes::Bytes;
use kafka_protocol::messages::ConsumerProtocolSubscription;
use kafka_protocol::protocol::Decodable;
use wire::Offset;
use wire::batch::{BatchBuilder, NewRecord, batch_records};

use super::codes;
use super::schema::{self, GroupValue, Key, OffsetValue};
use super::state::{Group, Now, State};
use crate::coordinator::{
    Led, WriteKind, append_contiguous, batch_bytes_max, build_batch, build_batches, check_insync,
};
use crate::partition::Partition;
use crate::producer_state::partition::VerificationGuard;
use crate::shard::now_ms;

/// Most bytes a compressed batch may inflate to during replay.
const REPLAY_DECOMPRESSED_MAX: usize = 64 << 20;
/// Appends group metadata `records` in as few batches as the batch limit allows, back to
/// back, acknowledged once replicated; errors as Kafka maps them for group metadata.
async fn append(part: &Led, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
    let kind = WriteKind::GroupMetadata;
    let batches =
        build_batches(records, batch_bytes_max(part), now_ms()).map_err(|c| kind.code(c))?;
    append_contiguous(part, batches)
        .await
        .map(|_| ())
        .map_err(|c| kind.code(c))
}

/// Writes committed offsets: all of one commit in one batch, so that a commit is stored
/// whole or not at all (a batch is appended, and survives a crash, as a unit; a torn one
/// is cut off by recovery). A commit larger than one batch may be is refused with
/// INVALID_COMMIT_OFFSET_SIZE, as Kafka does, and nothing of it is written. Acknowledged
/// once replicated (acks=all); errors as Kafka maps them for offset commits. Returns
/// where the batch starts (`Offset::NONE` if there was nothing to write).
pub async fn write_offsets(
    part: &Led,
    group: &str,
    offsets: &[((String, i32), OffsetValue)],
) -> Result<Offset, i16> {
    if offsets.is_empty() {
        return Ok(Offset::NONE);
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
    let kind = WriteKind::Offsets;
    let batch = build_batch(records, batch_bytes_max(part)).map_err(|c| kind.code(c))?;
    append_contiguous(part, vec![batch])
        .await
        .map(Offset)
        .map_err(|c| kind.code(c))
}

/// Where a transactional offset commit's batch went (see [`append_txn_offsets`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnAt {
    /// The batch's first offset.
    pub batch: Offset,
    /// The first offset of the producer's transaction in this partition (this batch's,
    /// if it opened the transaction): with the producer id, names the transaction.
    pub txn_first: Offset,
    /// The offset after the batch: replicated once the HW reaches it.
    pub end: Offset,
}

/// The local write of an appended batch: an error means it is not in the log.
pub type Written<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), i16>> + 'a>>;

/// Appends a transactional offset commit (TxnOffsetCommit): one transactional batch with
/// the producer's id and epoch, applied only when the producer's COMMIT marker follows it
/// in this partition (live: `Coordinators::complete_txn`; at load: `replay`).
///
/// Returns as soon as the batch has its offsets — in the same synchronous step, so the
/// caller holds its offsets before any marker can follow it — with its local write still
/// to await; replication is the caller's to await (acks=all, from [`TxnAt::end`]).
/// `verified` is the KIP-890 verification begun on this partition before the
/// coordinator was asked: checked in that step too, so a commit verified before its
/// transaction was aborted cannot append after the ABORT marker (INVALID_TXN_STATE), where
/// it would open a transaction no coordinator will end. Errors as Kafka maps them for
/// offset commits.
pub async fn append_txn_offsets<'a>(
    part: &'a Led,
    group: &str,
    producer: (wire::ProducerId, wire::ProducerEpoch),
    verified: VerificationGuard,
    offsets: &[((String, i32), OffsetValue)],
) -> Result<(TxnAt, Written<'a>), i16> {
    let kind = WriteKind::Offsets;
    let batch = txn_offsets_batch(part, group, producer, offsets)?;
    if !part.leads() {
        return Err(kind.code(crate::errors::NOT_LEADER_OR_FOLLOWER));
    }
    check_insync(part).map_err(|c| kind.code(c))?;
    // The batch is built at base offset 0: its next offset is its record count.
    let count = wire::batch::read_header(&batch)
        .map(|h| h.next_offset().get())
        .map_err(|_| codes::UNKNOWN_SERVER_ERROR)?;
    // A rebuild after a cut of the log would park the first poll below.
    part.rebuild_producers().await.map_err(|c| kind.code(c))?;
    // From here to the first poll of the append, no await.
    if !part.producers.verification_holds(producer.0, verified) {
        return Err(crate::errors::INVALID_TXN_STATE);
    }
    let before = part.log.log_end_offset();
    let mut append = Box::pin(part.append_coordinator(bytes::BytesMut::from(&batch[..]), now_ms()));
    let first = futures_lite::future::poll_once(&mut append).await;
    if part.log.log_end_offset() <= before {
        return match first {
            Some(Err(code)) => Err(kind.code(code)),
            _ => {
                tracing::error!(
                    partition = part.index,
                    "offset commit did not take its offsets"
                );
                Err(codes::UNKNOWN_SERVER_ERROR)
            }
        };
    }
    let at = TxnAt {
        batch: before,
        txn_first: part.producers.open_txn_first(producer.0).unwrap_or(before),
        end: before.add(count),
    };
    assert!(
        at.txn_first <= at.batch,
        "transaction begins after its batch: {at:?}"
    );
    let written = async move {
        let done = match first {
            Some(done) => done,
            None => append.await,
        };
        done.map(|_| ()).map_err(|c| kind.code(c))
    };
    Ok((at, Box::pin(written)))
}

/// The transactional batch of a TxnOffsetCommit; INVALID_COMMIT_OFFSET_SIZE if it is
/// larger than the partition takes (nothing of it is written, as Kafka refuses it).
fn txn_offsets_batch(
    part: &Led,
    group: &str,
    producer: (wire::ProducerId, wire::ProducerEpoch),
    offsets: &[((String, i32), OffsetValue)],
) -> Result<Bytes, i16> {
    let records = offsets
        .iter()
        .map(|((t, p), v)| NewRecord {
            timestamp_ms: v.commit_timestamp_ms,
            key: Some(schema::offset_key(group, t, *p)),
            value: Some(schema::offset_value(v)),
            headers: Vec::new(),
        })
        .collect();
    let batch = BatchBuilder {
        producer_id: producer.0,
        producer_epoch: producer.1,
        transactional: true,
        records,
        ..BatchBuilder::default()
    }
    .build()
    .map_err(|_| codes::UNKNOWN_SERVER_ERROR)?;
    if batch.len() > batch_bytes_max(part) {
        return Err(codes::INVALID_COMMIT_OFFSET_SIZE);
    }
    Ok(batch)
}

/// A pending offset's key: (group, (topic, partition)).
pub type PendingKey = (String, (String, i32));

/// Transactional offset commits waiting for their producer's marker (Kafka's
/// `pendingTransactionalOffsetCommits`), by transaction: (producer id, first offset of
/// its transaction in this partition). One value per group and partition in each, the
/// latest: a transaction that commits the same offsets again and again (a consumer
/// committing every poll) holds one value each, not one per commit.
#[derive(Debug, Default)]
pub struct PendingTxnOffsets {
    txns: BTreeMap<(wire::ProducerId, Offset), HashMap<PendingKey, OffsetValue>>,
}

impl PendingTxnOffsets {
    pub fn new() -> PendingTxnOffsets {
        PendingTxnOffsets::default()
    }

    /// Holds the offsets of the batch at `at` of `producer` in its transaction; a value
    /// appended later replaces an earlier one of the same key.
    pub fn hold_batch(
        &mut self,
        producer: wire::ProducerId,
        at: TxnAt,
        group: &str,
        offsets: Vec<((String, i32), OffsetValue)>,
    ) {
        let held = self.txns.entry((producer, at.txn_first)).or_default();
        for (key, mut value) in offsets {
            value.appended_at = at.batch;
            hold(held, (group.to_string(), key), value);
        }
    }

    /// Drops what the batch at `at` held: its write failed, it is not in the log. (A
    /// value it replaced is not brought back: that batch is in the log, so a replay
    /// would apply it on COMMIT, but the live state has only the latest.)
    pub fn drop_batch(&mut self, producer: wire::ProducerId, at: TxnAt) {
        let key = (producer, at.txn_first);
        let Some(held) = self.txns.get_mut(&key) else {
            return;
        };
        held.retain(|_, v| v.appended_at != at.batch);
        if held.is_empty() {
            self.txns.remove(&key);
        }
    }

    /// Takes the offsets of every transaction of `producer` that a marker at `marker_at`
    /// closes: all begun before it (normally one; older ones would be leftovers the same
    /// marker closes in the log too).
    pub fn take_closed(
        &mut self,
        producer: wire::ProducerId,
        marker_at: Offset,
    ) -> Vec<(PendingKey, OffsetValue)> {
        let closed: Vec<_> = self
            .txns
            .range((producer, Offset(i64::MIN))..(producer, marker_at))
            .map(|(k, _)| *k)
            .collect();
        let mut done = Vec::new();
        for key in closed {
            if let Some(held) = self.txns.remove(&key) {
                done.extend(held);
            }
        }
        done
    }

    /// The (topic, partition)s of `group` that an open transaction will change.
    pub fn unstable(&self, group: &str) -> HashSet<(&str, i32)> {
        self.txns
            .values()
            .flat_map(|held| held.keys())
            .filter(|(g, _)| g == group)
            .map(|(_, (t, p))| (t.as_str(), *p))
            .collect()
    }

    /// Values held, all transactions together (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.txns.values().map(HashMap::len).sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// Replay: the first offset of `producer`'s transaction open in the log so far (the
    /// one held: markers met so far took the older ones), else `at`, where a batch read
    /// now opens one.
    fn open_or(&self, producer: wire::ProducerId, at: Offset) -> Offset {
        self.txns
            .range((producer, Offset(i64::MIN))..=(producer, Offset(i64::MAX)))
            .next_back()
            .map_or(at, |((_, first), _)| *first)
    }
}

/// Holds `value` under `key` unless a value appended later is held already.
fn hold(held: &mut HashMap<PendingKey, OffsetValue>, key: PendingKey, value: OffsetValue) {
    let later = held
        .get(&key)
        .is_some_and(|v| v.appended_at > value.appended_at);
    if !later {
        held.insert(key, value);
    }
}

/// Writes a group's metadata.
pub async fn write_group(part: &Led, group: &str, value: &GroupValue) -> Result<(), i16> {
    let record = (schema::group_key(group), Some(schema::group_value(value)));
    append(part, vec![record]).await
}

/// Deletes offsets (and the group's metadata if `whole_group`).
pub async fn tombstones(
    part: &Led,
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
    pending: &mut PendingTxnOffsets,
    now: Now,
) -> Result<u64, i16> {
    let mut applied = 0u64;
    crate::coordinator::replay_batches(part, |batch| {
        replay_batch(&batch, groups, pending, now, &mut applied)
    })
    .await?;
    groups.retain(|_, g| g.state != State::Empty || !g.offsets.is_empty() || g.generation > 0);
    Ok(applied)
}

/// Applies every record of one batch.
fn replay_batch(
    batch: &Bytes,
    groups: &mut HashMap<String, Group>,
    pending: &mut PendingTxnOffsets,
    now: Now,
    applied: &mut u64,
) -> Result<(), i16> {
    let (header, records) = batch_records(batch, REPLAY_DECOMPRESSED_MAX)
        .map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
    if header.attributes().is_control() {
        let done = pending.take_closed(header.producer_id(), header.base_offset());
        if crate::producer_state::partition::marker_type(batch) == Some(true) {
            apply_committed(groups, done, now);
        }
        return Ok(());
    }
    let at = header.base_offset();
    if header.attributes().is_transactional() {
        hold_pending(pending, header.producer_id(), at, records);
        return Ok(());
    }
    for record in records {
        let record = record.map_err(|_| codes::COORDINATOR_NOT_AVAILABLE)?;
        let Some(key) = record.key else { continue };
        apply(&key, record.value.as_ref(), at, groups, now);
        *applied += 1;
    }
    Ok(())
}

/// Holds a transactional batch's offset commits until its producer's marker.
fn hold_pending(
    pending: &mut PendingTxnOffsets,
    producer_id: wire::ProducerId,
    at: Offset,
    records: wire::batch::RecordIter,
) {
    let txn_first = pending.open_or(producer_id, at);
    let held = pending.txns.entry((producer_id, txn_first)).or_default();
    for record in records.flatten() {
        let (Some(key), Some(value)) = (record.key, record.value) else {
            continue;
        };
        let (
            Ok(Key::Offset {
                group,
                topic,
                partition,
            }),
            Ok(mut v),
        ) = (
            schema::decode_key(&key),
            schema::decode_offset_value(&value),
        )
        else {
            continue;
        };
        v.appended_at = at;
        hold(held, (group, (topic, partition)), v);
    }
    if held.is_empty() {
        pending.txns.remove(&(producer_id, txn_first));
    }
}

/// Applies the offset commits of a committed transaction. Each replaces only a value
/// written before the transaction's own batch: a plain OffsetCommit appended while the
/// transaction was open is newer and stays (Kafka's `completePendingTxnOffsetCommit`).
pub fn apply_committed(
    groups: &mut HashMap<String, Group>,
    done: Vec<(PendingKey, OffsetValue)>,
    now: Now,
) {
    for ((group, key), value) in done {
        let offsets = &mut groups
            .entry(group.clone())
            .or_insert_with(|| Group::new(&group, now))
            .offsets;
        let newer = offsets
            .get(&key)
            .is_some_and(|held| held.appended_at > value.appended_at);
        if !newer {
            offsets.insert(key, value);
        }
    }
}

/// Applies one stored record: the latest value per key wins; a tombstone deletes.
fn apply(
    key: &Bytes,
    value: Option<&Bytes>,
    at: Offset,
    groups: &mut HashMap<String, Group>,
    now: Now,
) {
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
                Some(Ok(mut v)) => {
                    v.appended_at = at;
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
        if let Some(sub) = subscription(m.metadata(&protocol)) {
            topics.extend(sub.topics.iter().map(|t| t.to_string()));
        }
    }
    topics
}

/// A consumer-protocol member's subscription, decoded within the same memory bound as a
/// request (`wire::messages::decoded_bytes_max`): a member's metadata is bytes its client
/// chose, up to a frame's size, and decoding empty topic names builds 16 times their
/// wire size. `None` if it does not decode within it.
fn subscription(mut meta: Bytes) -> Option<ConsumerProtocolSubscription> {
    if meta.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([meta[0], meta[1]]);
    let mut body = meta.split_off(2);
    let budget = wire::messages::decoded_bytes_max(body.len());
    kafka_protocol::protocol::with_decode_budget(budget, || {
        ConsumerProtocolSubscription::decode(&mut body, version.clamp(0, 3))
    })
    .ok()
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
    use wire::Offset;

    fn offset(commit_ms: i64) -> OffsetValue {
        OffsetValue {
            offset: Offset(1),
            leader_epoch: wire::LeaderEpoch::NONE,
            metadata: String::new(),
            commit_timestamp_ms: commit_ms,
            appended_at: Offset::NONE,
        }
    }

    /// Version 0 consumer-protocol metadata subscribing to `names`.
    fn subscription_metadata(names: usize, name: &str) -> Bytes {
        let mut meta = Vec::with_capacity(8 + names * (2 + name.len()));
        meta.extend_from_slice(&0i16.to_be_bytes());
        meta.extend_from_slice(&i32::try_from(names).expect("count").to_be_bytes());
        for _ in 0..names {
            meta.extend_from_slice(&i16::try_from(name.len()).expect("len").to_be_bytes());
            meta.extend_from_slice(name.as_bytes());
        }
        meta.extend_from_slice(&(-1i32).to_be_bytes()); // no user data
        Bytes::from(meta)
    }

    /// A member's subscription is decoded within a request's memory bound. Before, 10 MB
    /// of empty topic names (OffsetDelete reads every member's) decoded to 160 MB of
    /// strings, unbounded in the metadata's size.
    #[test]
    fn a_members_subscription_decodes_within_the_request_bound() {
        let real = subscription(subscription_metadata(10_000, "orders-eu-1")).expect("decodes");
        assert_eq!(real.topics.len(), 10_000);
        let hostile = subscription_metadata(5_000_000, "");
        assert!(hostile.len() < 11 << 20);
        assert!(
            subscription(hostile).is_none(),
            "5,000,000 empty names are more than the bound"
        );
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

    /// A marker takes the commits of the transactions it closes (begun before it) and
    /// leaves those of a later transaction of the same producer, appended after it while
    /// it was being replicated; within a transaction the latest value of a key wins.
    #[test]
    fn a_marker_takes_what_it_closes_and_the_latest_value_per_key() {
        let pid = wire::ProducerId(3);
        let mut pending = PendingTxnOffsets::new();
        let at = |batch: i64, txn_first: i64| TxnAt {
            batch: Offset(batch),
            txn_first: Offset(txn_first),
            end: Offset(batch + 1),
        };
        let key = ("t".to_string(), 0);
        let value = |o: i64| {
            let mut v = offset(0);
            v.offset = Offset(o);
            v
        };
        pending.hold_batch(pid, at(10, 10), "g", vec![(key.clone(), value(1))]);
        pending.hold_batch(pid, at(12, 10), "g", vec![(key.clone(), value(2))]);
        assert_eq!(pending.len(), 1, "one value per key in a transaction");
        // Marker at 14; the producer's next transaction began at 15 before it completed.
        pending.hold_batch(pid, at(15, 15), "g", vec![(key.clone(), value(3))]);
        let done = pending.take_closed(pid, Offset(14));
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].1.offset, done[0].1.appended_at),
            (Offset(2), Offset(12))
        );
        assert_eq!(pending.len(), 1, "the later transaction stays");
        assert_eq!(pending.unstable("g").len(), 1);
        // Its batch was not written after all: nothing of it stays.
        pending.drop_batch(pid, at(15, 15));
        assert!(pending.is_empty());
        assert!(pending.take_closed(pid, Offset(20)).is_empty());
    }

    #[test]
    fn retention_of_empty_groups() {
        let mut standalone = Group::new("s", Now::at(0));
        standalone.offsets.insert(("t".into(), 0), offset(100));
        standalone.offsets.insert(("t".into(), 1), offset(900));
        assert_eq!(
            expired_offsets(&standalone, 1000, 500),
            vec![("t".into(), 0)]
        );
        let mut consumer = Group::new("c", Now::at(0));
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
            Offset(1),
            &mut groups,
            Now::at(0),
        );
        let mut later = offset(2);
        later.offset = Offset(7);
        apply(
            &key,
            Some(&schema::offset_value(&later)),
            Offset(2),
            &mut groups,
            Now::at(0),
        );
        assert_eq!(groups["g"].offsets[&("t".to_string(), 0)].offset, Offset(7));
        apply(&key, None, Offset(2), &mut groups, Now::at(0));
        assert!(groups["g"].offsets.is_empty());
        let gv = GroupValue {
            protocol_type: "consumer".into(),
            generation: 4,
            ..GroupValue::default()
        };
        apply(
            &schema::group_key("g"),
            Some(&schema::group_value(&gv)),
            Offset(1),
            &mut groups,
            Now::at(0),
        );
        assert_eq!(groups["g"].generation, 4);
        apply(
            &schema::group_key("g"),
            None,
            Offset(2),
            &mut groups,
            Now::at(0),
        );
        assert!(!groups.contains_key("g"));
        apply(
            &Bytes::from_static(b"\x00"),
            None,
            Offset(2),
            &mut groups,
            Now::at(0),
        );
    }
}
