//! Transactions at the protocol level against a real `weir serve`: a transactional batch
//! to a partition not added to the transaction is refused with INVALID_TXN_STATE (KIP-890);
//! added, it is held behind the LSO for read_committed; aborted, read_committed gets the
//! records with `aborted_transactions` = [(producer id, first offset)] (read_uncommitted:
//! null), the partition directory holds a 34-byte `.txnindex` entry in Kafka's layout, and
//! both survive a restart; the old epoch is fenced after a second InitProducerId.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::requests::{create_topics, s};
use common::{Broker, Client};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
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
const NOT_ENOUGH_REPLICAS: i16 = 19;

fn topic_name(name: &str) -> TopicName {
    TopicName(s(name))
}

fn init(c: &mut Client) -> (i16, ProducerId, ProducerEpoch) {
    init_as(c, ProducerId(-1), ProducerEpoch(-1))
}

/// InitProducerId v4 naming the producer id and epoch the client has (KIP-360), or -1.
fn init_as(
    c: &mut Client,
    pid: ProducerId,
    epoch: ProducerEpoch,
) -> (i16, ProducerId, ProducerEpoch) {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str(TXN_ID))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get());
    let resp: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &req);
    (
        resp.error_code,
        ProducerId(resp.producer_id.0),
        ProducerEpoch(resp.producer_epoch),
    )
}

/// AddPartitionsToTxn v3 of partition 0 of each of `topics`; the error code of each.
fn add_partitions(
    c: &mut Client,
    pid: ProducerId,
    epoch: ProducerEpoch,
    topics: &[&str],
) -> Vec<i16> {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_v3_and_below_producer_id(pid.get().into())
        .with_v3_and_below_producer_epoch(epoch.get())
        .with_v3_and_below_topics(
            topics
                .iter()
                .map(|t| {
                    AddPartitionsToTxnTopic::default()
                        .with_name(topic_name(t))
                        .with_partitions(vec![0])
                })
                .collect(),
        );
    let resp: AddPartitionsToTxnResponse = c.call(api::ADD_PARTITIONS_TO_TXN, 3, &req);
    resp.results_by_topic_v3_and_below
        .iter()
        .map(|t| t.results_by_partition[0].partition_error_code)
        .collect()
}

fn add_partition(c: &mut Client, pid: ProducerId, epoch: ProducerEpoch) -> i16 {
    add_partitions(c, pid, epoch, &[TOPIC])[0]
}

fn end_txn(c: &mut Client, pid: ProducerId, epoch: ProducerEpoch, commit: bool) -> i16 {
    end_txn_v(c, pid, epoch, commit, 3)
}

fn end_txn_v(
    c: &mut Client,
    pid: ProducerId,
    epoch: ProducerEpoch,
    commit: bool,
    version: i16,
) -> i16 {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get())
        .with_committed(commit);
    let resp: EndTxnResponse = c.call(api::END_TXN, version, &req);
    resp.error_code
}

fn add_offsets_v(
    c: &mut Client,
    pid: ProducerId,
    epoch: ProducerEpoch,
    group: &str,
    version: i16,
) -> i16 {
    let req = AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get())
        .with_group_id(GroupId(s(group)));
    let resp: AddOffsetsToTxnResponse = c.call(api::ADD_OFFSETS_TO_TXN, version, &req);
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

/// Produce v7 (`acks`, with the transactional id) of `batch` to partition `index` of
/// `topic`; returns the partition's error code.
fn produce_to(c: &mut Client, topic: &str, index: i32, acks: i16, batch: Bytes) -> i16 {
    produce_as(c, Some(TXN_ID), (topic, index), acks, batch)
}

/// Produce v7 naming `txn_id` (or none).
fn produce_as(
    c: &mut Client,
    txn_id: Option<&'static str>,
    (topic, index): (&str, i32),
    acks: i16,
    batch: Bytes,
) -> i16 {
    let part = PartitionProduceData::default()
        .with_index(index)
        .with_records(Some(batch));
    let req = ProduceRequest::default()
        .with_transactional_id(txn_id.map(|id| TransactionalId(StrBytes::from_static_str(id))))
        .with_acks(acks)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![part]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 7, &req);
    resp.responses[0].partition_responses[0].error_code
}

/// Produce (acks=all) of `batch` to partition 0 of [`TOPIC`].
fn produce(c: &mut Client, batch: Bytes) -> i16 {
    produce_to(c, TOPIC, 0, -1, batch)
}

/// Fetch v11 of partition 0 of `topic` from 0 at `isolation`; returns the partition
/// response.
fn fetch_from(c: &mut Client, topic: &str, isolation: i8) -> fetch_response::PartitionData {
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
                .with_topic(topic_name(topic))
                .with_partitions(vec![p]),
        ]);
    let resp: FetchResponse = c.call(api::FETCH, 11, &req);
    resp.responses[0].partitions[0].clone()
}

/// Fetch of partition 0 of [`TOPIC`] at `isolation`.
fn fetch(c: &mut Client, isolation: i8) -> fetch_response::PartitionData {
    fetch_from(c, TOPIC, isolation)
}

/// A broker of `shards` shards with `sets`, the topics `(name, partitions)` created and
/// [`TXN_ID`]'s producer initialised: the broker, a client of it, the producer's id and
/// epoch.
fn start_with_producer(
    shards: usize,
    sets: &[(&str, &str)],
    topics: &[(&str, i32)],
) -> (Broker, Client, ProducerId, ProducerEpoch) {
    let broker = Broker::start(shards, sets);
    let mut c = broker.client();
    let created = create_topics(&mut c, topics);
    assert!(created.iter().all(|e| *e == 0), "CreateTopics: {created:?}");
    assert_eq!(created.len(), topics.len(), "CreateTopics");
    let (error, pid, epoch) = init(&mut c);
    assert_eq!(error, 0, "InitProducerId");
    (broker, c, pid, epoch)
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
    let (mut broker, mut c, pid, epoch) = start_with_producer(
        2,
        &[
            ("transaction.state.log.num.partitions", "4"),
            ("offsets.topic.num.partitions", "4"),
        ],
        &[(TOPIC, 1)],
    );
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
    // Versions before KIP-588 know fencing as INVALID_PRODUCER_EPOCH (Kafka maps it).
    for (v, want) in [(1, INVALID_PRODUCER_EPOCH), (3, PRODUCER_FENCED)] {
        assert_eq!(end_txn_v(&mut c, pid, epoch, true, v), want, "EndTxn v{v}");
        assert_eq!(
            add_offsets_v(&mut c, pid, epoch, "g", v),
            want,
            "AddOffsetsToTxn v{v}"
        );
    }
    assert!(broker.wait_log(
        "loaded transaction coordinator state",
        Duration::from_secs(10)
    ));
}

/// KIP-360: a producer that names its id and epoch gets the next epoch; a retry of that
/// call (its answer lost) gets the same answer, not PRODUCER_FENCED, unless a transaction
/// of the new epoch is open; once another instance has initialised, it is fenced.
#[test]
fn a_retried_init_producer_id_gets_its_epoch_again() {
    let (_broker, mut c, pid, epoch) = start_with_producer(1, &[], &[(TOPIC, 1)]);
    let bumped = init_as(&mut c, pid, epoch);
    assert_eq!(bumped.0, 0, "InitProducerId naming the current epoch");
    assert_eq!(bumped.1, pid);
    assert_eq!(bumped.2.get(), epoch.get() + 1);
    assert_eq!(
        init_as(&mut c, pid, epoch),
        bumped,
        "the retry: same answer"
    );
    assert_eq!(init_as(&mut c, pid, epoch), bumped, "and again");

    // While the new epoch has a transaction open a late retry is refused, not allowed
    // to abort it; once it has ended, the retry is answered as before (as Kafka does).
    assert_eq!(add_partition(&mut c, pid, bumped.2), 0);
    assert_eq!(init_as(&mut c, pid, epoch).0, PRODUCER_FENCED);
    assert_eq!(end_txn(&mut c, pid, bumped.2, false), 0);
    assert_eq!(init_as(&mut c, pid, epoch), bumped);

    // A new instance (no epoch named) forgets the last one: its retries are fenced too.
    let (error, _, fresh) = init(&mut c);
    assert_eq!(error, 0);
    assert_eq!(init_as(&mut c, pid, bumped.2).0, PRODUCER_FENCED);
    assert_eq!(
        init_as(&mut c, pid, fresh).0,
        0,
        "the current epoch still bumps"
    );
}

const BATCH_TOPIC: &str = "txb";
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const OPERATION_NOT_ATTEMPTED: i16 = 55;
const TRANSACTION_ABORTABLE: i16 = 120;

/// One transaction of an AddPartitionsToTxn v4+ batch: `partitions` of (topic, index).
fn batch_txn(
    id: &str,
    pid: ProducerId,
    epoch: ProducerEpoch,
    verify_only: bool,
    partitions: &[(&str, i32)],
) -> add_partitions_to_txn_request::AddPartitionsToTxnTransaction {
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (t, p) in partitions {
        match topics.last_mut() {
            Some(last) if last.name.0.as_str() == *t => last.partitions.push(*p),
            _ => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(topic_name(t))
                    .with_partitions(vec![*p]),
            ),
        }
    }
    add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(id.to_string())))
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get())
        .with_verify_only(verify_only)
        .with_topics(topics)
}

/// One transaction's answer: (id, [(topic, partition, code)]).
type TxnResult = (String, Vec<(String, i32, i16)>);

/// An AddPartitionsToTxn v4+ batch: (top-level error, per transaction).
fn add_batch(
    c: &mut Client,
    version: i16,
    txns: Vec<add_partitions_to_txn_request::AddPartitionsToTxnTransaction>,
) -> (i16, Vec<TxnResult>) {
    let req = AddPartitionsToTxnRequest::default().with_transactions(txns);
    let resp: AddPartitionsToTxnResponse = c.call(api::ADD_PARTITIONS_TO_TXN, version, &req);
    let results = resp
        .results_by_transaction
        .iter()
        .map(|r| {
            let per = r
                .topic_results
                .iter()
                .flat_map(|t| {
                    t.results_by_partition.iter().map(|p| {
                        (
                            t.name.0.to_string(),
                            p.partition_index,
                            p.partition_error_code,
                        )
                    })
                })
                .collect();
            (r.transactional_id.0.to_string(), per)
        })
        .collect();
    (resp.error_code, results)
}

fn owned(id: &str, per: &[(&str, i32, i16)]) -> TxnResult {
    let per = per
        .iter()
        .map(|(t, p, c)| (t.to_string(), *p, *c))
        .collect();
    (id.to_string(), per)
}

/// KIP-890's inter-broker AddPartitionsToTxn (v4, v5): advertised; a batch of
/// transactions answered per transaction and partition; verify_only answers whether each
/// partition is in the producer's ongoing transaction without adding it (v4:
/// INVALID_TXN_STATE for one that is not, v5: TRANSACTION_ABORTABLE), PRODUCER_FENCED for
/// an old epoch, and an unknown partition fails its transaction (the others
/// OPERATION_NOT_ATTEMPTED). Old weir served v0–v3 only and closed the connection.
#[test]
fn add_partitions_v4_v5_batch_and_verify_only() {
    let (_broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[("transaction.state.log.num.partitions", "4")],
        &[(BATCH_TOPIC, 2)],
    );
    let versions: ApiVersionsResponse =
        c.call(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    let advertised = versions
        .api_keys
        .iter()
        .find(|k| k.api_key == api::ADD_PARTITIONS_TO_TXN)
        .map(|k| (k.min_version, k.max_version));
    assert_eq!(advertised, Some((0, 5)));
    let t = BATCH_TOPIC;

    // A batch of two: one adds partition 0, the other's id has no producer.
    let (top, results) = add_batch(
        &mut c,
        4,
        vec![
            batch_txn(TXN_ID, pid, epoch, false, &[(t, 0)]),
            batch_txn(
                "no-such-txn",
                ProducerId(7),
                ProducerEpoch(0),
                false,
                &[(t, 0)],
            ),
        ],
    );
    assert_eq!(top, 0);
    assert_eq!(
        results,
        vec![
            owned(TXN_ID, &[(t, 0, 0)]),
            owned("no-such-txn", &[(t, 0, INVALID_PRODUCER_ID_MAPPING)]),
        ]
    );

    // Verify only: 0 is in the transaction, 1 is not (and stays out).
    let verify = |c: &mut Client, version: i16, e: ProducerEpoch| {
        add_batch(
            c,
            version,
            vec![batch_txn(TXN_ID, pid, e, true, &[(t, 0), (t, 1)])],
        )
    };
    let v4 = verify(&mut c, 4, epoch);
    assert_eq!(
        v4,
        (
            0,
            vec![owned(TXN_ID, &[(t, 0, 0), (t, 1, INVALID_TXN_STATE)])]
        )
    );
    let v5 = verify(&mut c, 5, epoch);
    assert_eq!(
        v5,
        (
            0,
            vec![owned(TXN_ID, &[(t, 0, 0), (t, 1, TRANSACTION_ABORTABLE)])]
        ),
        "verify_only added nothing"
    );
    let stale = ProducerEpoch(epoch.get().wrapping_sub(1));
    assert_eq!(
        verify(&mut c, 5, stale),
        (
            0,
            vec![owned(
                TXN_ID,
                &[(t, 0, PRODUCER_FENCED), (t, 1, PRODUCER_FENCED)]
            )]
        )
    );
    let unknown = add_batch(
        &mut c,
        5,
        vec![batch_txn(TXN_ID, pid, epoch, true, &[("nope", 0), (t, 0)])],
    );
    assert_eq!(
        unknown,
        (
            0,
            vec![owned(
                TXN_ID,
                &[
                    ("nope", 0, UNKNOWN_TOPIC_OR_PARTITION),
                    (t, 0, OPERATION_NOT_ATTEMPTED)
                ]
            )]
        )
    );

    // The client path agrees: partition 1 is refused, partition 0 taken.
    let produce_to = |c: &mut Client, index: i32| {
        produce_to(c, BATCH_TOPIC, index, -1, txn_batch(pid, epoch, 0, 1))
    };
    assert_eq!(produce_to(&mut c, 1), INVALID_TXN_STATE);
    assert_eq!(produce_to(&mut c, 0), 0);
}

/// IncrementalAlterConfigs SET `min.insync.replicas` of `topic`.
fn set_min_insync(c: &mut Client, topic: &str, n: u32) {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let res = AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(StrBytes::from_string(topic.to_string()))
        .with_configs(vec![
            AlterableConfig::default()
                .with_name(StrBytes::from_static_str("min.insync.replicas"))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_string(n.to_string()))),
        ]);
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![res]);
    let resp: IncrementalAlterConfigsResponse = c.call(api::INCREMENTAL_ALTER_CONFIGS, 1, &req);
    assert_eq!(resp.responses[0].error_code, 0, "alter {topic}");
}

/// (high watermark, last stable offset) of partition 0 of `topic` (read_committed).
fn stable(c: &mut Client, topic: &str) -> (i64, i64) {
    let p = fetch_from(c, topic, 1);
    (p.high_watermark, p.last_stable_offset)
}

/// Kafka completes a transaction found in PrepareCommit/PrepareAbort when its
/// coordinator loads `__transaction_state`: the markers are written at once, not at the
/// ticker's next round (`transaction.abort.timed.out.transaction.cleanup.interval.ms`,
/// 60 s here). Made to happen every run: the first partition of the transaction
/// ("a-held", `min.insync.replicas` raised above its one replica) cannot take a
/// replicated marker, so EndTxn logs PrepareCommit and fails with the markers not all
/// written — "b-data"'s is (markers go to every partition at once), "a-held"'s is not;
/// then "a-held" is fixed and the node SIGKILLed and restarted: "a-held"'s COMMIT
/// marker must be written within 15 s (old code: ~60 s, at the ticker's first round).
#[test]
fn a_transaction_found_ending_at_load_gets_its_markers_at_once() {
    const TICK_MS: &str = "60000";
    const RESUMED_WITHIN: Duration = Duration::from_secs(15);
    let (mut broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[
            ("transaction.state.log.num.partitions", "1"),
            (
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                TICK_MS,
            ),
        ],
        &[("a-held", 1), ("b-data", 1)],
    );
    for code in add_partitions(&mut c, pid, epoch, &["a-held", "b-data"]) {
        assert_eq!(code, 0);
    }
    assert_eq!(
        produce_to(&mut c, "b-data", 0, -1, txn_batch(pid, epoch, 0, 3)),
        0
    );
    assert_eq!(
        stable(&mut c, "b-data"),
        (3, 0),
        "open: held behind the LSO"
    );

    // "a-held" refuses replicated appends once its shard has the new config (probed
    // with an acks=all batch, refused before it is appended).
    set_min_insync(&mut c, "a-held", 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = || common::batch(&[b"probe"], 1_700_000_000_000);
    while produce_to(&mut c, "a-held", 0, -1, probe()) != NOT_ENOUGH_REPLICAS {
        assert!(Instant::now() < deadline, "a-held never refused acks=all");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ended = end_txn(&mut c, pid, epoch, true);
    assert_ne!(ended, 0, "EndTxn cannot finish: a marker is not replicated");
    // The markers go to every partition at once: b-data's is written (three records
    // and the COMMIT marker), a-held's is not.
    assert_eq!(stable(&mut c, "b-data"), (4, 4), "b-data's marker");
    // (a-held holds only the probes appended before its new config took effect.)
    let (held_hw, held_lso) = stable(&mut c, "a-held");
    assert_eq!(held_hw, held_lso, "nothing open in a-held");

    set_min_insync(&mut c, "a-held", 1);
    drop(c);
    broker.kill_and_restart();
    let started = Instant::now();
    let mut c = broker.client();
    loop {
        let (hw, lso) = stable(&mut c, "a-held");
        // The COMMIT marker, after the probes.
        if (hw, lso) == (held_hw + 1, held_hw + 1) {
            break;
        }
        assert!(
            started.elapsed() < RESUMED_WITHIN,
            "the ending transaction was not finished at load: a-held hw {hw}, lso {lso} \
             after {:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("markers written {:?} after the restart", started.elapsed());
    // Then CompleteCommit is logged.
    loop {
        let req = DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(StrBytes::from_static_str(TXN_ID))]);
        let resp: DescribeTransactionsResponse = c.call(api::DESCRIBE_TRANSACTIONS, 0, &req);
        let state = resp.transaction_states[0].transaction_state.to_string();
        if state == "CompleteCommit" {
            break;
        }
        assert!(started.elapsed() < RESUMED_WITHIN, "still {state}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// WriteTxnMarkers v1 of one marker for `pid` to partition 0 of [`TOPIC`], from
/// coordinator epoch `coordinator_epoch`: the partition's error code.
fn write_marker(c: &mut Client, pid: i64, commit: bool, coordinator_epoch: i32) -> i16 {
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    let req = WriteTxnMarkersRequest::default().with_markers(vec![
        WritableTxnMarker::default()
            .with_producer_id(pid.into())
            .with_producer_epoch(0)
            .with_transaction_result(commit)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(vec![
                WritableTxnMarkerTopic::default()
                    .with_name(topic_name(TOPIC))
                    .with_partition_indexes(vec![0]),
            ]),
    ]);
    let resp: WriteTxnMarkersResponse = c.call(api::WRITE_TXN_MARKERS, 1, &req);
    resp.markers[0].topics[0].partitions[0].error_code
}

/// A marker from an older coordinator epoch than one this partition already has for the
/// producer is a coordinator that lost its partition still writing: refused with
/// TRANSACTION_COORDINATOR_FENCED, nothing appended (else a late COMMIT or ABORT of an
/// ended transaction would end the producer's next one here). Kept across a restart.
#[test]
fn a_marker_from_an_older_coordinator_epoch_is_fenced() {
    const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
    let mut broker = Broker::start(1, &[]);
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[(TOPIC, 1)]), vec![0]);
    assert_eq!(write_marker(&mut c, 4242, true, 7), 0);
    let end = fetch(&mut c, 0).high_watermark;
    assert_eq!(end, 1, "the marker");
    assert_eq!(
        write_marker(&mut c, 4242, false, 6),
        TRANSACTION_COORDINATOR_FENCED
    );
    assert_eq!(fetch(&mut c, 0).high_watermark, end, "nothing appended");
    assert_eq!(
        write_marker(&mut c, 4242, true, 7),
        0,
        "the same epoch writes"
    );
    assert_eq!(
        write_marker(&mut c, 4243, true, 1),
        0,
        "another producer's own"
    );

    broker.restart();
    let mut c = broker.client();
    assert_eq!(
        write_marker(&mut c, 4242, false, 6),
        TRANSACTION_COORDINATOR_FENCED,
        "after a restart"
    );
    assert_eq!(write_marker(&mut c, 4242, false, 8), 0);
}

/// ListOffsets v7 of partition 0 of [`TOPIC`] by `timestamp` at `isolation`: (error,
/// offset).
fn list_offset(c: &mut Client, timestamp: i64, isolation: i8) -> (i16, i64) {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation)
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(topic_name(TOPIC))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(timestamp),
                ]),
        ]);
    let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, 7, &req);
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset)
}

/// A consumer's ListOffsets by timestamp (or -3, the max timestamp) finds only what it
/// may fetch: for read_committed nothing at or past the LSO, as Kafka answers; else a
/// consumer would seek into an open transaction it cannot read yet.
#[test]
fn list_offsets_by_time_stays_below_what_the_consumer_may_fetch() {
    let (_broker, mut c, pid, epoch) = start_with_producer(1, &[], &[(TOPIC, 1)]);
    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    assert_eq!(produce(&mut c, txn_batch(pid, epoch, 0, 2)), 0);
    assert_eq!(
        list_offset(&mut c, 0, 0),
        (0, 0),
        "read_uncommitted: the HW covers it"
    );
    assert_eq!(list_offset(&mut c, -3, 0).0, 0);
    assert_eq!(
        list_offset(&mut c, 0, 1),
        (0, -1),
        "read_committed: past the LSO"
    );
    assert_eq!(list_offset(&mut c, -3, 1), (0, -1));
    assert_eq!(end_txn(&mut c, pid, epoch, true), 0);
    assert_eq!(list_offset(&mut c, 0, 1), (0, 0), "committed: readable");
}

/// Transactional batches need the transactional id in the request (Kafka refuses them
/// with TRANSACTIONAL_ID_AUTHORIZATION_FAILED otherwise): without it, anyone allowed to
/// write the topic could append to another producer's open transaction.
#[test]
fn transactional_batches_without_a_transactional_id_are_refused() {
    const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    let (_broker, mut c, pid, epoch) = start_with_producer(1, &[], &[(TOPIC, 1)]);
    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    let batch = txn_batch(pid, epoch, 0, 1);
    assert_eq!(
        produce_as(&mut c, None, (TOPIC, 0), -1, batch.clone()),
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    );
    assert_eq!(fetch(&mut c, 0).high_watermark, 0, "nothing appended");
    assert_eq!(produce(&mut c, batch), 0, "with its transactional id");
}

/// A batch of a newer epoch than the open transaction's (a buggy or hostile client) is
/// checked with the coordinator like one that opens a transaction, and refused: appended,
/// it fenced the transaction's own COMMIT marker, which was then retried for ever, holding
/// the id in PrepareCommit and the partition's LSO where it was (Kafka's
/// `hasOngoingTransaction` compares the epoch too).
#[test]
fn a_batch_of_a_newer_epoch_inside_an_open_transaction_is_refused_and_the_commit_completes() {
    let (_broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[
            ("transaction.state.log.num.partitions", "2"),
            ("offsets.topic.num.partitions", "2"),
        ],
        &[(TOPIC, 1)],
    );
    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    assert_eq!(produce(&mut c, txn_batch(pid, epoch, 0, 2)), 0);
    let newer = ProducerEpoch(epoch.get() + 5);
    assert_ne!(
        produce(&mut c, txn_batch(pid, newer, 0, 1)),
        0,
        "a batch of an epoch the coordinator never gave out was appended"
    );
    assert_eq!(end_txn(&mut c, pid, epoch, true), 0, "EndTxn(commit)");
    // Two records and the COMMIT marker, all stable.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = fetch(&mut c, 1);
        if (p.high_watermark, p.last_stable_offset) == (3, 3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "HW / LSO {:?}",
            (p.high_watermark, p.last_stable_offset)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kafka refuses only an empty transactional id; a long one (here 300 bytes) is served,
/// not answered INVALID_REQUEST, which the Java client takes as fatal.
#[test]
fn a_long_transactional_id_is_served() {
    let broker = Broker::start(1, &[("transaction.state.log.num.partitions", "2")]);
    let mut c = broker.client();
    let long = "t".repeat(300);
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(long))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id((-1i64).into())
        .with_producer_epoch(-1);
    let resp: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &req);
    assert_eq!(resp.error_code, 0, "InitProducerId of a 300-byte id");
    assert!(resp.producer_id.0 >= 0);
}

/// TxnOffsetCommit of `offset` for [`TOPIC`]-0 in `group` by the producer; its code.
fn txn_offset_commit(
    c: &mut Client,
    pid: ProducerId,
    epoch: ProducerEpoch,
    group: &str,
    offset: i64,
) -> i16 {
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    let req = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get())
        .with_generation_id(-1)
        .with_topics(vec![
            TxnOffsetCommitRequestTopic::default()
                .with_name(topic_name(TOPIC))
                .with_partitions(vec![
                    TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset),
                ]),
        ]);
    let resp: TxnOffsetCommitResponse = c.call(api::TXN_OFFSET_COMMIT, 3, &req);
    resp.topics[0].partitions[0].error_code
}

/// Kafka 3.6+ checks a TxnOffsetCommit with the transaction coordinator (KIP-890): the
/// group's offsets partition must be in the ongoing transaction. Unchecked, a commit with
/// no AddOffsetsToTxn (or one late after its abort) opened a transaction in
/// `__consumer_offsets` that no marker would ever close.
#[test]
fn a_transactional_offset_commit_outside_the_transaction_is_refused() {
    let (_broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[
            ("transaction.state.log.num.partitions", "2"),
            ("offsets.topic.num.partitions", "2"),
        ],
        &[(TOPIC, 1)],
    );
    assert_ne!(
        txn_offset_commit(&mut c, pid, epoch, "g", 5),
        0,
        "TxnOffsetCommit without AddOffsetsToTxn"
    );
    let req = AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
        .with_producer_id(pid.get().into())
        .with_producer_epoch(epoch.get())
        .with_group_id(GroupId(s("g")));
    let resp: AddOffsetsToTxnResponse = c.call(api::ADD_OFFSETS_TO_TXN, 3, &req);
    assert_eq!(resp.error_code, 0, "AddOffsetsToTxn");
    assert_eq!(txn_offset_commit(&mut c, pid, epoch, "g", 5), 0);
    assert_eq!(
        txn_offset_commit(&mut c, pid, ProducerEpoch(epoch.get() - 1), "g", 6),
        INVALID_PRODUCER_EPOCH,
        "an older epoch is fenced"
    );
    assert_eq!(end_txn(&mut c, pid, epoch, false), 0);
    assert_ne!(
        txn_offset_commit(&mut c, pid, epoch, "g", 7),
        0,
        "a commit arriving after its transaction was aborted"
    );
}

/// A transaction's offsets, committed, replace only values written before its own
/// TxnOffsetCommit: a plain OffsetCommit appended while the transaction was open is newer
/// and stays (Kafka compares where each was appended), live and after a reload.
#[test]
fn a_committed_transaction_does_not_overwrite_a_newer_plain_offset_commit() {
    use common::requests::{commit_offsets, fetch_offsets};
    let (mut broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[
            ("transaction.state.log.num.partitions", "2"),
            ("offsets.topic.num.partitions", "2"),
        ],
        &[(TOPIC, 1)],
    );
    let add_offsets = |c: &mut Client, group: &str| {
        let req = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str(TXN_ID)))
            .with_producer_id(pid.get().into())
            .with_producer_epoch(epoch.get())
            .with_group_id(GroupId(s(group)));
        let resp: AddOffsetsToTxnResponse = c.call(api::ADD_OFFSETS_TO_TXN, 3, &req);
        assert_eq!(resp.error_code, 0, "AddOffsetsToTxn {group}");
    };
    // "newer": the plain commit lands after the transaction's; "older": before it.
    assert_eq!(commit_offsets(&mut c, "older", TOPIC, &[(0, 3, "")]), [0]);
    add_offsets(&mut c, "newer");
    add_offsets(&mut c, "older");
    assert_eq!(txn_offset_commit(&mut c, pid, epoch, "newer", 5), 0);
    assert_eq!(txn_offset_commit(&mut c, pid, epoch, "older", 5), 0);
    assert_eq!(commit_offsets(&mut c, "newer", TOPIC, &[(0, 10, "")]), [0]);
    assert_eq!(end_txn(&mut c, pid, epoch, true), 0);
    let committed = |c: &mut Client, group: &str| fetch_offsets(c, group, TOPIC, &[0])[0].0;
    assert_eq!(
        committed(&mut c, "newer"),
        10,
        "the plain commit after the txn's"
    );
    assert_eq!(
        committed(&mut c, "older"),
        5,
        "the txn's over an older plain commit"
    );
    broker.restart();
    let mut c = broker.client();
    assert_eq!(committed(&mut c, "newer"), 10, "after a reload");
    assert_eq!(committed(&mut c, "older"), 5, "after a reload");
}

/// InitProducerId after a finished transaction leaves the id Empty (Kafka's
/// `prepareIncrementProducerEpoch`), not in the old transaction's Complete* state: it is
/// described as Empty and an EndTxn with no transaction is INVALID_TXN_STATE.
#[test]
fn a_new_epoch_starts_with_no_transaction() {
    let (_broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[("transaction.state.log.num.partitions", "2")],
        &[(TOPIC, 1)],
    );
    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    assert_eq!(produce(&mut c, txn_batch(pid, epoch, 0, 1)), 0);
    assert_eq!(end_txn(&mut c, pid, epoch, true), 0);
    let (error, pid2, epoch2) = init(&mut c);
    assert_eq!(error, 0);
    let req = DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(StrBytes::from_static_str(TXN_ID))]);
    let resp: DescribeTransactionsResponse = c.call(api::DESCRIBE_TRANSACTIONS, 0, &req);
    assert_eq!(
        resp.transaction_states[0].transaction_state.as_str(),
        "Empty"
    );
    assert_eq!(end_txn(&mut c, pid2, epoch2, false), INVALID_TXN_STATE);
}

/// InitProducerId v4 of transactional id `id` with a new producer.
fn init_named(c: &mut Client, id: &str) -> (i16, ProducerId, ProducerEpoch) {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s(id))))
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

/// DescribeTransactions of `id`: its error code and state.
fn describe_named(c: &mut Client, id: &str) -> (i16, String) {
    let req =
        DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(s(id))]);
    let resp: DescribeTransactionsResponse = c.call(api::DESCRIBE_TRANSACTIONS, 0, &req);
    let state = &resp.transaction_states[0];
    (state.error_code, state.transaction_state.to_string())
}

/// The transactional ids ListTransactions shows.
fn listed_ids(c: &mut Client) -> Vec<String> {
    let resp: ListTransactionsResponse = c.call(
        api::LIST_TRANSACTIONS,
        0,
        &ListTransactionsRequest::default(),
    );
    assert_eq!(resp.error_code, 0, "ListTransactions");
    let mut ids: Vec<String> = resp
        .transaction_states
        .iter()
        .map(|t| t.transactional_id.to_string())
        .collect();
    ids.sort();
    ids
}

/// `transactional.id.expiration.ms` (Kafka's `removeExpiredTransactionalIds`): an id whose
/// transaction completed and that then stays unused past the expiration is removed — not
/// described, not listed — and a tombstone in `__transaction_state` keeps it removed
/// after a restart (restarted with the default expiration, so only the log can remove
/// it); an id with an ongoing transaction is kept, before and after the restart.
#[test]
fn a_transactional_id_unused_past_its_expiration_is_removed_and_an_open_one_kept() {
    const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    const OPEN_ID: &str = "open-txn";
    const GONE_WITHIN: Duration = Duration::from_secs(20);
    let (mut broker, mut c, pid, epoch) = start_with_producer(
        1,
        &[
            ("transaction.state.log.num.partitions", "2"),
            ("transactional.id.expiration.ms", "1000"),
            (
                "transaction.remove.expired.transaction.cleanup.interval.ms",
                "100",
            ),
        ],
        &[(TOPIC, 1), ("open-t", 1)],
    );
    // First the open one: its last update is older than the completed one's.
    let (error, open_pid, open_epoch) = init_named(&mut c, OPEN_ID);
    assert_eq!(error, 0, "InitProducerId {OPEN_ID}");
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(s(OPEN_ID)))
        .with_v3_and_below_producer_id(open_pid.get().into())
        .with_v3_and_below_producer_epoch(open_epoch.get())
        .with_v3_and_below_topics(vec![
            AddPartitionsToTxnTopic::default()
                .with_name(topic_name("open-t"))
                .with_partitions(vec![0]),
        ]);
    let resp: AddPartitionsToTxnResponse = c.call(api::ADD_PARTITIONS_TO_TXN, 3, &req);
    assert_eq!(
        resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
        0
    );
    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    assert_eq!(produce(&mut c, txn_batch(pid, epoch, 0, 1)), 0);
    assert_eq!(end_txn(&mut c, pid, epoch, true), 0);
    assert_eq!(
        describe_named(&mut c, TXN_ID),
        (0, "CompleteCommit".to_string())
    );
    let started = Instant::now();
    loop {
        let (error, state) = describe_named(&mut c, TXN_ID);
        if error == TRANSACTIONAL_ID_NOT_FOUND {
            break;
        }
        assert!(
            started.elapsed() < GONE_WITHIN,
            "{TXN_ID} still {state} (error {error}) after {:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{TXN_ID} expired {:?} after its commit", started.elapsed());
    assert_eq!(describe_named(&mut c, OPEN_ID), (0, "Ongoing".to_string()));
    assert_eq!(listed_ids(&mut c), vec![OPEN_ID.to_string()]);

    broker.restart_with(&[("transactional.id.expiration.ms", "604800000")]);
    let mut c = broker.client();
    assert_eq!(
        describe_named(&mut c, TXN_ID).0,
        TRANSACTIONAL_ID_NOT_FOUND,
        "{TXN_ID} after a restart"
    );
    assert_eq!(describe_named(&mut c, OPEN_ID), (0, "Ongoing".to_string()));
    assert_eq!(listed_ids(&mut c), vec![OPEN_ID.to_string()]);
    // A new producer of the expired id starts over.
    let (error, _, new_epoch) = init(&mut c);
    assert_eq!((error, new_epoch), (0, ProducerEpoch(0)));
}

/// DescribeProducers v0 of `partitions` of `topic`.
fn describe_producers(
    c: &mut Client,
    topic: &str,
    partitions: &[i32],
) -> Vec<describe_producers_response::PartitionResponse> {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let req = DescribeProducersRequest::default().with_topics(vec![
        TopicRequest::default()
            .with_name(topic_name(topic))
            .with_partition_indexes(partitions.to_vec()),
    ]);
    let resp: DescribeProducersResponse = c.call(api::DESCRIBE_PRODUCERS, 0, &req);
    assert_eq!(resp.topics.len(), 1, "one topic answered");
    resp.topics[0].partitions.clone()
}

/// DescribeProducers (KIP-664, `kafka-transactions.sh describe-producers` and
/// `find-hanging`): a partition's producers with their epoch, last sequence and
/// timestamp, and where an open transaction began; -1 once it is committed. Unknown
/// partitions get UNKNOWN_TOPIC_OR_PARTITION, a partition named twice one answer.
#[test]
fn describe_producers_lists_a_partitions_producers_and_open_transactions() {
    let (_broker, mut c, pid, epoch) = start_with_producer(2, &[], &[(TOPIC, 2)]);
    // An idempotent producer's two batches on partition 1.
    let plain = BatchBuilder {
        producer_id: ProducerId(pid.get() + 1_000_000),
        producer_epoch: ProducerEpoch(0),
        base_sequence: Sequence(0),
        records: (0..3)
            .map(|i| NewRecord::value(1_700_000_000_123, format!("p{i}")))
            .collect(),
        ..BatchBuilder::default()
    };
    let idem_pid = plain.producer_id;
    assert_eq!(
        produce_as(&mut c, None, (TOPIC, 1), -1, plain.build().expect("batch")),
        0
    );
    // The transactional producer's open transaction on partition 0, after one plain
    // record there.
    assert_eq!(add_partition(&mut c, pid, epoch), 0);
    let plain_first = BatchBuilder {
        records: vec![NewRecord::value(1_700_000_000_000, "x")],
        ..BatchBuilder::default()
    };
    assert_eq!(
        produce_as(
            &mut c,
            None,
            (TOPIC, 0),
            -1,
            plain_first.build().expect("batch")
        ),
        0
    );
    assert_eq!(produce(&mut c, txn_batch(pid, epoch, 0, 4)), 0);

    let parts = describe_producers(&mut c, TOPIC, &[0, 1, 0, 7]);
    assert_eq!(parts.len(), 3, "each partition answered once: {parts:?}");
    let p0 = parts.iter().find(|p| p.partition_index == 0).expect("p0");
    assert_eq!(p0.error_code, 0);
    assert_eq!(p0.active_producers.len(), 1, "{p0:?}");
    let t = &p0.active_producers[0];
    assert_eq!(
        (t.producer_id.0, t.producer_epoch),
        (pid.get(), i32::from(epoch.get()))
    );
    assert_eq!(t.last_sequence, 3, "4 records from sequence 0");
    assert_eq!(
        t.current_txn_start_offset, 1,
        "the transaction began after the plain record"
    );
    let p1 = parts.iter().find(|p| p.partition_index == 1).expect("p1");
    assert_eq!(p1.error_code, 0);
    let i = &p1.active_producers[0];
    assert_eq!(
        (i.producer_id.0, i.producer_epoch, i.last_sequence),
        (idem_pid.get(), 0, 2)
    );
    assert_eq!(i.last_timestamp, 1_700_000_000_123);
    assert_eq!(i.current_txn_start_offset, -1, "not transactional");
    let p7 = parts.iter().find(|p| p.partition_index == 7).expect("p7");
    assert_eq!(p7.error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION");
    let unknown = describe_producers(&mut c, "no-such-topic", &[0]);
    assert_eq!(unknown[0].error_code, 3);

    assert_eq!(end_txn(&mut c, pid, epoch, true), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p0 = describe_producers(&mut c, TOPIC, &[0]).remove(0);
        let start = p0.active_producers[0].current_txn_start_offset;
        if start == -1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the transaction stays open: {p0:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
