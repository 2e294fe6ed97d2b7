//! Append order of pipelined produces while their partitions open, against a real
//! `weir serve`: one connection sends several Produce requests, each with a numbered
//! batch for every partition of a topic, before reading any answer; every batch must be
//! acknowledged and each partition must hold the batches in the order they were sent
//! (Kafka appends one connection's requests in order; a librdkafka producer with no
//! retries and 5 in flight counts on it). The partitions are not open when the requests
//! arrive: new ones (their directories are created in the blocking pool), and ones
//! closed as idle under `max.open.partitions` (reopened with DMA reads, after closing
//! others). See `shard::arrivals` for why that used to reorder.

mod common;

use common::requests::fetch_values;
use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

const PRODUCE_V: i16 = 9;
/// Produce requests in flight on the connection at once.
const PIPELINED: usize = 32;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create(c: &mut Client, name: &str, partitions: i32) {
    let t = CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(1);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(30_000);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 7, &req);
    assert_eq!(resp.topics[0].error_code, 0, "create {name}");
}

/// A Produce (acks=1) of one batch holding `value` to each of `partitions`.
fn produce_req(topic: &str, partitions: &[i32], value: &[u8]) -> ProduceRequest {
    let records = batch(&[value], 1);
    let data = partitions
        .iter()
        .map(|&p| {
            PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(records.clone()))
        })
        .collect();
    ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s(topic)))
                .with_partition_data(data),
        ])
}

/// Sends [`PIPELINED`] produce requests before reading any answer, request `k` carrying
/// the value `k` to every partition; returns each request's (partition, error, base
/// offset) answers, in request order.
fn produce_pipelined(c: &mut Client, topic: &str, partitions: &[i32]) -> Vec<Vec<(i32, i16, i64)>> {
    let sent: Vec<i32> = (0..PIPELINED)
        .map(|k| {
            let req = produce_req(topic, partitions, k.to_string().as_bytes());
            c.send(api::PRODUCE, PRODUCE_V, &req)
        })
        .collect();
    sent.iter()
        .map(|&correlation| {
            let (got, resp): (i32, ProduceResponse) = c.recv(api::PRODUCE, PRODUCE_V);
            assert_eq!(got, correlation, "responses come in request order");
            resp.responses
                .iter()
                .flat_map(|t| t.partition_responses.iter())
                .map(|p| (p.index, p.error_code, p.base_offset))
                .collect()
        })
        .collect()
}

/// Checks that every batch was acknowledged at increasing offsets in send order, and
/// that each partition holds `before` values then 0..PIPELINED, in that order.
fn check_order(
    answers: &[Vec<(i32, i16, i64)>],
    fetched: &[(i32, Vec<Vec<u8>>)],
    partitions: &[i32],
    before: &[&[u8]],
) {
    let mut last_offset = vec![-1i64; partitions.len()];
    for (k, answer) in answers.iter().enumerate() {
        assert_eq!(
            answer.len(),
            partitions.len(),
            "request {k}: one answer per partition"
        );
        for (i, &(index, error, base)) in answer.iter().enumerate() {
            assert_eq!(
                index, partitions[i],
                "request {k}: answers in request order"
            );
            assert_eq!(error, 0, "request {k}, partition {index}: not acknowledged");
            assert!(
                base > last_offset[i],
                "partition {index}: batch {k} appended at offset {base}, before the batch sent \
                 ahead of it (offset {})",
                last_offset[i]
            );
            last_offset[i] = base;
        }
    }
    let expected: Vec<Vec<u8>> = before
        .iter()
        .map(|v| v.to_vec())
        .chain((0..PIPELINED).map(|k| k.to_string().into_bytes()))
        .collect();
    assert_eq!(fetched.len(), partitions.len(), "every partition fetched");
    for (index, values) in fetched {
        let shown: Vec<String> = values
            .iter()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        assert_eq!(
            values, &expected,
            "partition {index} holds {shown:?}: not every batch, in send order"
        );
    }
}

/// New partitions, opened by the produces themselves; two shards, so half of the
/// partitions are reached over the cross-shard mesh.
#[test]
fn pipelined_produces_to_new_partitions_append_in_send_order() {
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    let partitions: Vec<i32> = (0..512).collect();
    create(&mut c, "fresh", 512);
    let answers = produce_pipelined(&mut c, "fresh", &partitions);
    let fetched = fetch_values(&mut c, "fresh", &partitions);
    check_order(&answers, &fetched, &partitions, &[]);
}

/// Partitions with data that were closed as idle: each reopens with DMA reads of its
/// segment, and past the open budget only after closing idle ones.
#[test]
fn pipelined_produces_to_reopening_partitions_append_in_send_order() {
    // 64 is the fewest open logs a shard keeps (`OPEN_PER_SHARD_MIN`).
    let broker = Broker::start(1, &[("max.open.partitions", "64")]);
    let mut c = broker.client();
    let partitions: Vec<i32> = (0..256).collect();
    create(&mut c, "reopen", 256);
    for chunk in partitions.chunks(32) {
        let resp: ProduceResponse = c.call(
            api::PRODUCE,
            PRODUCE_V,
            &produce_req("reopen", chunk, b"first"),
        );
        for p in resp
            .responses
            .iter()
            .flat_map(|t| t.partition_responses.iter())
        {
            assert_eq!(p.error_code, 0, "first record of partition {}", p.index);
        }
    }
    let answers = produce_pipelined(&mut c, "reopen", &partitions);
    let fetched = fetch_values(&mut c, "reopen", &partitions);
    check_order(&answers, &fetched, &partitions, &[b"first"]);
}
