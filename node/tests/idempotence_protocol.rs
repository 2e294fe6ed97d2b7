//! Idempotent producers at the protocol level against a real `weir serve` process:
//! InitProducerId, then Produce requests whose batches are built with `wire` — resends,
//! gaps, fenced epochs, new epochs, sequence wrap, restarts (SIGTERM and SIGKILL).
//! Every test reads the partition back with Fetch, so "answered with the original
//! offsets" is checked together with "the log holds it once".

use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProducerId as KpProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use weir_tests::raw::RawConn;
use weir_tests::{Weir, WeirConfig};
use wire::batch::{BatchBuilder, NewRecord};
use wire::{ProducerEpoch, ProducerId, Sequence};

const TOPIC: &str = "idem";
const NONE: i16 = 0;
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_RECORD: i16 = 87;
const PRODUCER_FENCED: i16 = 90;
const ACKS_ALL: i16 = -1;

struct Node {
    weir: Weir,
    conn: RawConn,
}

impl Node {
    fn start() -> Result<Node> {
        let weir = Weir::start(WeirConfig::shards(1))?;
        let mut conn = RawConn::connect(weir.addr())?;
        create_topic(&mut conn)?;
        Ok(Node { weir, conn })
    }

    fn reconnect(&mut self) -> Result<()> {
        self.conn = RawConn::connect_timeout(self.weir.addr(), Duration::from_secs(10))?;
        Ok(())
    }

    /// InitProducerId (no transactional id); `current` is sent from v3 on.
    fn init(
        &mut self,
        version: i16,
        current: Option<(ProducerId, ProducerEpoch)>,
    ) -> Result<(i16, ProducerId, ProducerEpoch)> {
        let (pid, epoch) = current.map_or((-1, -1), |(p, e)| (p.get(), e.get()));
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(KpProducerId(pid))
            .with_producer_epoch(epoch);
        let resp: InitProducerIdResponse = self.conn.call(ApiKey::InitProducerId, version, &req)?;
        Ok((
            resp.error_code,
            ProducerId(resp.producer_id.0),
            ProducerEpoch(resp.producer_epoch),
        ))
    }

    fn new_producer(&mut self) -> Result<(ProducerId, ProducerEpoch)> {
        let (error, pid, epoch) = self.init(4, None)?;
        if error != NONE || !pid.is_some() {
            bail!("InitProducerId failed: error {error}, pid {pid}");
        }
        Ok((pid, epoch))
    }

    /// Produce v7, acks=all, one batch; returns (error code, base offset).
    fn produce(&mut self, batch: Bytes) -> Result<(i16, i64)> {
        self.conn.produce(TOPIC, 0, ACKS_ALL, batch)
    }

    /// Every record value in the partition, in offset order, with its offset.
    fn log(&mut self) -> Result<Vec<(i64, String)>> {
        let mut out = Vec::new();
        let mut offset = 0i64;
        // Bounded: each round returns at least one record or ends the loop.
        for _ in 0..1000 {
            let (error, hw, records) = self.conn.fetch(TOPIC, 0, offset, 1 << 20)?;
            if error != NONE {
                bail!("fetch at {offset}: error {error}");
            }
            for r in &records {
                let value = r
                    .value
                    .as_ref()
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                out.push((r.offset, value.unwrap_or_default()));
            }
            match records.last() {
                Some(last) if last.offset + 1 < hw => offset = last.offset + 1,
                _ => return Ok(out),
            }
        }
        bail!("partition did not end within 1000 fetches")
    }
}

fn create_topic(conn: &mut RawConn) -> Result<()> {
    let topic = CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
        .with_num_partitions(1)
        .with_replication_factor(1);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 4, &req)?;
    let code = resp
        .topics
        .first()
        .context("empty CreateTopics response")?
        .error_code;
    if code != NONE {
        bail!("CreateTopics: error {code}");
    }
    Ok(())
}

/// A batch of `count` records `"<tag>-<i>"` from (pid, epoch) starting at `first`.
fn batch(pid: ProducerId, epoch: ProducerEpoch, first: i32, count: i32, tag: &str) -> Bytes {
    let records = (0..count)
        .map(|i| NewRecord::value(1_700_000_000_000 + i64::from(i), format!("{tag}-{i}")))
        .collect();
    BatchBuilder {
        producer_id: pid,
        producer_epoch: epoch,
        base_sequence: Sequence(first),
        records,
        ..BatchBuilder::default()
    }
    .build()
    .expect("a batch built from test data")
}

fn plain_batch(count: i32, tag: &str) -> Bytes {
    batch(ProducerId::NONE, ProducerEpoch(-1), -1, count, tag)
}

fn values(log: &[(i64, String)]) -> Vec<&str> {
    log.iter().map(|(_, v)| v.as_str()).collect()
}

#[test]
fn the_same_batch_twice_is_answered_with_the_first_offsets_and_stored_once() -> Result<()> {
    let mut n = Node::start()?;
    assert_eq!(n.produce(plain_batch(2, "plain"))?, (NONE, 0));
    let (pid, epoch) = n.new_producer()?;
    assert_eq!(epoch, ProducerEpoch(0));
    let b = batch(pid, epoch, 0, 3, "a");
    assert_eq!(n.produce(b.clone())?, (NONE, 2));
    assert_eq!(
        n.produce(b)?,
        (NONE, 2),
        "the resend gets the original base offset"
    );
    assert_eq!(n.produce(batch(pid, epoch, 3, 1, "b"))?, (NONE, 5));
    let log = n.log()?;
    assert_eq!(
        values(&log),
        ["plain-0", "plain-1", "a-0", "a-1", "a-2", "b-0"]
    );
    Ok(())
}

#[test]
fn each_of_the_last_five_batches_resent_gets_its_original_offsets() -> Result<()> {
    let mut n = Node::start()?;
    let (pid, epoch) = n.new_producer()?;
    let batches: Vec<Bytes> = (0..7)
        .map(|i| batch(pid, epoch, i * 2, 2, &format!("b{i}")))
        .collect();
    let mut bases = Vec::new();
    for b in &batches {
        let (error, base) = n.produce(b.clone())?;
        assert_eq!(error, NONE);
        bases.push(base);
    }
    for i in (2..7).rev() {
        assert_eq!(
            n.produce(batches[i].clone())?,
            (NONE, bases[i]),
            "resend of batch {i}"
        );
    }
    let (error, _) = n.produce(batches[1].clone())?;
    assert_eq!(
        error, OUT_OF_ORDER_SEQUENCE_NUMBER,
        "older than the 5-batch window"
    );
    let log = n.log()?;
    assert_eq!(log.len(), 14, "every record exactly once: {log:?}");
    assert_eq!(
        log.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        (0..14).collect::<Vec<_>>()
    );
    Ok(())
}

#[test]
fn a_gap_is_refused_and_the_next_in_order_batch_is_accepted() -> Result<()> {
    let mut n = Node::start()?;
    let (pid, epoch) = n.new_producer()?;
    assert_eq!(n.produce(batch(pid, epoch, 0, 2, "a"))?.0, NONE);
    let (error, base) = n.produce(batch(pid, epoch, 5, 2, "gap"))?;
    assert_eq!((error, base), (OUT_OF_ORDER_SEQUENCE_NUMBER, -1));
    assert_eq!(n.produce(batch(pid, epoch, 2, 2, "b"))?, (NONE, 2));
    assert_eq!(values(&n.log()?), ["a-0", "a-1", "b-0", "b-1"]);
    Ok(())
}

#[test]
fn an_old_epoch_after_a_bump_is_fenced_and_a_new_epoch_starts_at_zero() -> Result<()> {
    let mut n = Node::start()?;
    let (pid, e0) = n.new_producer()?;
    assert_eq!(n.produce(batch(pid, e0, 0, 3, "e0"))?.0, NONE);
    // KIP-360: the same id and its current epoch bump the epoch.
    let (error, bumped_pid, e1) = n.init(3, Some((pid, e0)))?;
    assert_eq!((error, bumped_pid, e1), (NONE, pid, ProducerEpoch(1)));
    // A new epoch must start at sequence 0.
    let (error, _) = n.produce(batch(pid, e1, 3, 1, "e1-wrong"))?;
    assert_eq!(error, OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(n.produce(batch(pid, e1, 0, 2, "e1"))?, (NONE, 3));
    // The zombie with the old epoch is fenced, even for what would be its next batch.
    assert_eq!(
        n.produce(batch(pid, e0, 3, 1, "zombie"))?.0,
        INVALID_PRODUCER_EPOCH
    );
    // InitProducerId from the old epoch after a second bump: fenced, per version.
    assert_eq!(n.init(4, Some((pid, e1)))?, (NONE, pid, ProducerEpoch(2)));
    assert_eq!(n.init(4, Some((pid, e0)))?.0, PRODUCER_FENCED);
    assert_eq!(n.init(3, Some((pid, e0)))?.0, INVALID_PRODUCER_EPOCH);
    assert_eq!(values(&n.log()?), ["e0-0", "e0-1", "e0-2", "e1-0", "e1-1"]);
    Ok(())
}

#[test]
fn sequences_wrap_at_i32_max() -> Result<()> {
    let mut n = Node::start()?;
    let (pid, epoch) = n.new_producer()?;
    // A producer new to the partition may start at any sequence (Kafka ≥ 2.5, KIP-360).
    assert_eq!(n.produce(batch(pid, epoch, i32::MAX - 3, 2, "a"))?.0, NONE);
    // MAX-1, MAX, 0, 1: wraps inside the batch.
    let wrapping = batch(pid, epoch, i32::MAX - 1, 4, "w");
    assert_eq!(n.produce(wrapping.clone())?, (NONE, 2));
    assert_eq!(
        n.produce(wrapping)?,
        (NONE, 2),
        "a wrapped batch is recognised when resent"
    );
    assert_eq!(
        n.produce(batch(pid, epoch, 3, 1, "gap"))?.0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(n.produce(batch(pid, epoch, 2, 1, "c"))?, (NONE, 6));
    assert_eq!(
        values(&n.log()?),
        ["a-0", "a-1", "w-0", "w-1", "w-2", "w-3", "c-0"]
    );
    Ok(())
}

#[test]
fn an_idempotent_batch_must_come_alone() -> Result<()> {
    let mut n = Node::start()?;
    let (pid, epoch) = n.new_producer()?;
    let mut two = batch(pid, epoch, 0, 1, "x").to_vec();
    two.extend_from_slice(&batch(pid, epoch, 1, 1, "y"));
    assert_eq!(n.produce(Bytes::from(two))?.0, INVALID_RECORD);
    assert!(n.log()?.is_empty());
    Ok(())
}

/// After a restart (clean or crash) the resends of batches appended before it are still
/// duplicates, the next batch is in order, and new producer ids are new.
fn survives_restart(kill: bool) -> Result<()> {
    let mut n = Node::start()?;
    let (pid, epoch) = n.new_producer()?;
    let batches: Vec<Bytes> = (0..5)
        .map(|i| batch(pid, epoch, i * 3, 3, &format!("b{i}")))
        .collect();
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(n.produce(b.clone())?, (NONE, i as i64 * 3));
    }
    if kill {
        n.weir.kill()?;
    } else {
        n.weir.terminate()?;
        let snapshot = n
            .weir
            .data_dir()
            .join(format!("{TOPIC}-0"))
            .join("00000000000000000015.snapshot");
        assert!(
            snapshot.is_file(),
            "clean shutdown writes a snapshot at the log end"
        );
    }
    n.weir.restart()?;
    n.reconnect()?;
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(
            n.produce(b.clone())?,
            (NONE, i as i64 * 3),
            "resend of batch {i} after restart"
        );
    }
    assert_eq!(
        n.produce(batch(pid, epoch, 14, 1, "gap"))?.0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(n.produce(batch(pid, epoch, 15, 1, "next"))?, (NONE, 15));
    let (other, _) = n.new_producer()?;
    assert!(
        other.get() > pid.get(),
        "ids are never reused across restarts: {other} after {pid}"
    );
    let log = n.log()?;
    assert_eq!(log.len(), 16, "each record exactly once: {log:?}");
    Ok(())
}

#[test]
fn dedup_survives_a_clean_restart() -> Result<()> {
    survives_restart(false)
}

#[test]
fn dedup_survives_sigkill() -> Result<()> {
    survives_restart(true)
}

/// Only brokers write transaction markers: a client's control batch is refused with
/// INVALID_RECORD and not stored. Stored, it would be read as a marker by followers and by
/// the replay after a restart, and fence the producer it names to its epoch (here
/// i16::MAX), whose next batch would then be refused.
#[test]
fn a_control_batch_from_a_client_is_refused_and_fences_no_one() -> Result<()> {
    let mut n = Node::start()?;
    let (pid, epoch) = n.new_producer()?;
    assert_eq!(n.produce(batch(pid, epoch, 0, 1, "a"))?, (NONE, 0));
    let forged = BatchBuilder {
        producer_id: pid,
        producer_epoch: ProducerEpoch(i16::MAX),
        base_sequence: Sequence(0),
        control: true,
        records: vec![NewRecord {
            key: Some(Bytes::from_static(&[0, 0, 0, 0])),
            ..NewRecord::value(1_700_000_000_000, Bytes::from_static(&[0, 0, 0, 0, 0, 0]))
        }],
        ..BatchBuilder::default()
    }
    .build()
    .expect("a control batch");
    assert_eq!(n.produce(forged)?.0, INVALID_RECORD);
    n.weir.kill()?;
    n.weir.restart()?;
    n.reconnect()?;
    assert_eq!(n.produce(batch(pid, epoch, 1, 1, "b"))?, (NONE, 1));
    assert_eq!(values(&n.log()?), vec!["a-0", "b-0"]);
    Ok(())
}
