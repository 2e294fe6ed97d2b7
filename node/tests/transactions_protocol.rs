//! Transactions at the protocol level against a real `weir serve`: a transactional batch
//! to a partition not added to the transaction is refused with INVALID_TXN_STATE (KIP-890);
//! added, it is held behind the LSO for read_committed; aborted, read_committed gets the
//! records with `aborted_transactions` = [(producer id, first offset)] (read_uncommitted:
//! null), the partition directory holds a 34-byte `.txnindex` entry in Kafka's layout, and
//! both survive a restart; the old epoch is fenced after a second InitProducerId.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Broker, Client};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;
use wire::batch::{BatchBuilder, NewRecord};
use wire::{ProducerEpoch, ProducerId, Sequence};

const TOPIC: &str = "txp";
const TXN_ID: &str = "raw-txn";
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const PRODUCER_FENCED: i16 = 90;

fn topic() -> TopicName {
    TopicName(StrBytes::from_static_str(TOPIC))
}

fn init(c: &mut Client) -> (i16, ProducerId, ProducerEpoch) {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str(TXN_ID))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1);
    let resp: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &req);
    (
        resp.error_code,
        ProducerId(resp.producer_id.0),
        ProducerEpoch(resp.producer_epoch),
    )
}

fn add_partition(c: &mut Client, pid: ProducerId, epoch: ProducerEpoch) -> i16 {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_v3_and_below_producer_id(pid.get().into())
        .with_v3_and_below_producer_epoch(epoch.get())
        .with_v3_and_below_topics(vec![
            AddPartitionsToTxnTopic::default()
                .with_name(topic())
                .with_partitions(vec![0]),
        ]);
    let resp: AddPartitionsToTxnResponse = c.call(api::ADD_PARTITIONS_TO_TXN, 3, &req);
    resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
}

fn end_txn(c: &mut Client, pid: ProducerId, epoch: ProducerEpoch, commit: bool) -> i16 {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get())
        .with_committed(commit);
    let resp: EndTxnResponse = c.call(api::END_TXN, 3, &req);
    resp.error_code
}

fn txn_batch(pid: ProducerId, epoch: ProducerEpoch, seq: i32, n: usize) -> Bytes {
    BatchBuilder {
        producer_id: pid,
        producer_epoch: epoch,
        base_sequence: Sequence(seq),
        transactional: true,
        records: (0..n)
            .map(|i| NewRecord::value(1_700_000_000_000, format!("v{i}")))
            .collect(),
        ..BatchBuilder::default()
    }
    .build()
    .expect("batch")
}

/// Produce v7 with the transactional id; returns the partition's error code.
fn produce(c: &mut Client, batch: Bytes) -> i16 {
    let part = PartitionProduceData::default()
        .with_index(0)
        .with_records(Some(batch));
    let req = ProduceRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str(TXN_ID))))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(topic())
                .with_partition_data(vec![part]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 7, &req);
    resp.responses[0].partition_responses[0].error_code
}

/// Fetch v11 of partition 0 from 0 at `isolation`; returns the partition response.
fn fetch(c: &mut Client, isolation: i8) -> fetch_response::PartitionData {
    let p = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_isolation_level(isolation)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(topic())
                .with_partitions(vec![p]),
        ]);
    let resp: FetchResponse = c.call(api::FETCH, 11, &req);
    resp.responses[0].partitions[0].clone()
}

fn aborted(p: &fetch_response::PartitionData) -> Option<Vec<(i64, i64)>> {
    p.aborted_transactions.as_ref().map(|list| {
        list.iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect()
    })
}

#[test]
fn produce_checks_the_transaction_and_aborts_are_indexed_across_restarts() {
    let mut broker = Broker::start(
        2,
        &[
            ("transaction.state.log.num.partitions", "4"),
            ("offsets.topic.num.partitions", "4"),
        ],
    );
    let mut c = broker.client();
    let created: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![
            CreatableTopic::default()
                .with_name(topic())
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]),
    );
    assert_eq!(created.topics[0].error_code, 0);
    let (error, pid, epoch) = init(&mut c);
    assert_eq!(error, 0);
    assert!(pid.is_some());

    // Not added to the transaction: refused, nothing appended.
    assert_eq!(
        produce(&mut c, txn_batch(pid, epoch, 0, 3)),
        INVALID_TXN_STATE
    );
    assert_eq!(fetch(&mut c, 0).high_watermark, 0);

    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    assert_eq!(produce(&mut c, txn_batch(pid, epoch, 0, 3)), 0);
    let held = fetch(&mut c, 1);
    assert_eq!((held.high_watermark, held.last_stable_offset), (3, 0));
    assert!(
        held.records.as_ref().is_none_or(Bytes::is_empty),
        "held behind the LSO"
    );

    assert_eq!(end_txn(&mut c, pid, epoch, false), 0);
    let check = |c: &mut Client| {
        let committed = fetch(c, 1);
        // Three records and the ABORT marker at 3.
        assert_eq!(
            (committed.high_watermark, committed.last_stable_offset),
            (4, 4)
        );
        assert_eq!(aborted(&committed), Some(vec![(pid.get(), 0)]));
        assert!(committed.records.as_ref().is_some_and(|r| !r.is_empty()));
        assert_eq!(aborted(&fetch(c, 0)), None, "read_uncommitted: null");
    };
    check(&mut c);
    let index = broker
        .data_dir
        .path()
        .join(format!("{TOPIC}-0/00000000000000000000.txnindex"));
    let bytes = std::fs::read(&index).expect("txnindex written");
    assert_eq!(bytes.len(), 34);
    assert_eq!(&bytes[0..2], &[0, 0], "version 0");
    assert_eq!(&bytes[2..10], &pid.get().to_be_bytes());
    assert_eq!(&bytes[10..18], &0i64.to_be_bytes(), "first offset");
    assert_eq!(
        &bytes[18..26],
        &3i64.to_be_bytes(),
        "last offset: the marker"
    );

    broker.restart();
    let mut c = broker.client();
    check(&mut c);

    // A second InitProducerId bumps the epoch: the old one is fenced everywhere.
    let (error, pid2, epoch2) = init(&mut c);
    assert_eq!((error, pid2), (0, pid));
    assert!(epoch2 > epoch);
    assert_eq!(add_partition(&mut c, pid, epoch), PRODUCER_FENCED);
    assert_eq!(
        produce(&mut c, txn_batch(pid, epoch, 3, 1)),
        INVALID_PRODUCER_EPOCH
    );
    assert!(broker.wait_log(
        "loaded transaction coordinator state",
        Duration::from_secs(10)
    ));
}
