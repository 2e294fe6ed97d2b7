//! One damaged batch on disk, against a real `weir serve` (issue 10, finding 5): after a
//! clean restart the batches before the damage are served, only a fetch that reaches the
//! damaged batch gets KAFKA_STORAGE_ERROR (logged with file and byte position), `weir log
//! verify` lists the damaged position and exits non-zero, and DeleteRecords past the
//! damaged batch makes the rest of the log readable again.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_tests::process::run_bounded;
use wire::api;

/// How long a `weir log` command may run.
const CMD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
const TOPIC: &str = "dmg";
/// One record per batch, so a damaged batch hides exactly one offset.
const RECORDS: i64 = 300;
/// Small segments: the first ~90 batches are in a sealed segment.
const SEGMENT_BYTES: &str = "16384";
/// The damaged batch (offset), in the middle of the first segment.
const VICTIM: i64 = 40;
const KAFKA_STORAGE_ERROR: i16 = 56;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn value(i: i64) -> Vec<u8> {
    format!("record-{i:05}-{}", "v".repeat(100)).into_bytes()
}

fn create(c: &mut Client, partitions: i32) {
    let t = CreatableTopic::default()
        .with_name(TopicName(s(TOPIC)))
        .with_num_partitions(partitions)
        .with_replication_factor(1)
        .with_configs(vec![
            CreatableTopicConfig::default()
                .with_name(s("segment.bytes"))
                .with_value(Some(s(SEGMENT_BYTES))),
        ]);
    let req = CreateTopicsRequest::default().with_topics(vec![t]);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 7, &req);
    assert_eq!(resp.topics[0].error_code, 0);
}

fn produce(c: &mut Client, partition: i32, i: i64) {
    let p = PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(batch(&[value(i).as_slice()], i)));
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partition_data(vec![p]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!((p.error_code, p.base_offset), (0, i));
}

/// Fetches from `offset`; returns (error code, offsets of the records returned).
fn fetch(c: &mut Client, partition: i32, offset: i64) -> (i16, Vec<i64>) {
    let p = FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s(TOPIC)))
                .with_partitions(vec![p]),
        ]);
    let resp: FetchResponse = c.call(api::FETCH, 12, &req);
    let p = &resp.responses[0].partitions[0];
    let records = p.records.clone().unwrap_or_default();
    let mut offsets = Vec::new();
    for range in wire::batch::split_batches(&records) {
        let one = records.slice(range.unwrap());
        wire::batch::validate_batch(&one).expect("the node serves only CRC-valid batches");
        let (h, iter) = wire::batch::batch_records(&one, 1 << 20).unwrap();
        for rec in iter {
            let rec = rec.unwrap();
            let offset = h.base_offset().get() + i64::from(rec.offset_delta);
            assert_eq!(rec.value.unwrap().to_vec(), value(offset));
            offsets.push(offset);
        }
    }
    (p.error_code, offsets)
}

/// Reads from `from` to `end` fetch by fetch; every offset must come back once, in order.
fn read_all(c: &mut Client, partition: i32, from: i64, end: i64) {
    let mut next = from;
    // Bounded: every fetch must advance.
    for _ in 0..=(end - from) {
        if next == end {
            return;
        }
        let (err, offsets) = fetch(c, partition, next);
        assert_eq!(err, 0, "fetch at {next}");
        assert!(!offsets.is_empty(), "fetch at {next} returned nothing");
        assert_eq!(offsets[0], next);
        next = offsets.last().unwrap() + 1;
    }
    assert_eq!(next, end);
}

fn delete_records(c: &mut Client, partition: i32, offset: i64) -> (i16, i64) {
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(partition)
                        .with_offset(offset),
                ]),
        ]);
    let resp: DeleteRecordsResponse = c.call(api::DELETE_RECORDS, 2, &req);
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.low_watermark)
}

/// Byte position of the batch holding `offset` in a segment file of one-record batches.
fn batch_position(log_file: &Path, offset: i64) -> (u64, u64) {
    let bytes = std::fs::read(log_file).unwrap();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let h = wire::batch::read_header(&bytes[pos..]).unwrap();
        let size = h.total_size();
        if h.base_offset().get() == offset {
            return (pos as u64, size as u64);
        }
        pos += size;
    }
    panic!("offset {offset} not in {}", log_file.display());
}

fn flip(path: &Path, pos: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[pos as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

fn verify(path: &Path) -> (bool, String) {
    let out = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["log", "verify"])
            .arg(path),
        CMD_TIMEOUT,
    )
    .expect("weir log verify");
    (out.ok(), out.stdout)
}

/// Partition 0: the damage is in the header of a batch of a sealed segment (framing is
/// broken: the reader must find the next batch by itself). Partition 1: the damage is in
/// the records of a batch of a sealed segment (framing intact, CRC-32C fails). Partition 2
/// stays healthy.
#[test]
fn a_damaged_batch_hides_only_itself_and_delete_records_gets_past_it() {
    let mut broker = Broker::start(1, &[]);
    let mut c = broker.client();
    create(&mut c, 3);
    for i in 0..RECORDS {
        for partition in 0..3 {
            produce(&mut c, partition, i);
        }
    }
    let data_dir = broker.data_dir.path().to_path_buf();
    let pdir = |p: i32| -> PathBuf { data_dir.join(format!("{TOPIC}-{p}")) };
    let first = |p: i32| pdir(p).join(format!("{:020}.log", 0));
    let logs = std::fs::read_dir(pdir(0))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
        .count();
    assert!(logs >= 2, "the first segment is sealed: {logs} segments");
    // The sealed segment is never written again, so it can be damaged while the node
    // runs; the clean restart then reopens it.
    let (pos0, _) = batch_position(&first(0), VICTIM);
    let (pos1, size1) = batch_position(&first(1), VICTIM);
    assert!(size1 > 100);
    flip(&first(0), pos0 + 16); // magic
    flip(&first(1), pos1 + size1 - 20); // a record value byte
    broker.restart();
    let mut c = broker.client();

    for partition in 0..2 {
        let (err, offsets) = fetch(&mut c, partition, 0);
        assert_eq!(
            err, 0,
            "partition {partition}: the batches before the damage"
        );
        assert_eq!(
            offsets,
            (0..VICTIM).collect::<Vec<_>>(),
            "partition {partition}"
        );
        let (err, offsets) = fetch(&mut c, partition, VICTIM);
        assert_eq!(
            (err, offsets.len()),
            (KAFKA_STORAGE_ERROR, 0),
            "partition {partition}: the damaged batch"
        );
    }
    for (partition, pos) in [(0, pos0), (1, pos1)] {
        let needle = format!("{} at byte {pos}", first(partition).display());
        let logged = broker.wait_log(&needle, std::time::Duration::from_secs(30));
        assert!(logged, "log names {needle}");
    }
    read_all(&mut c, 2, 0, RECORDS);

    for (partition, pos) in [(0, pos0), (1, pos1)] {
        let (ok, text) = verify(&pdir(partition));
        assert!(!ok, "verify exits non-zero on damage:\n{text}");
        let needle = format!("damaged: {} at byte {pos}:", first(partition).display());
        assert!(text.contains(&needle), "{needle} in\n{text}");
        let skip = format!("DeleteRecords to offset {}", VICTIM + 1);
        assert!(text.contains(&skip), "{skip} in\n{text}");
        assert_eq!(text.matches("damaged:").count(), 1, "{text}");
    }
    let (ok, text) = verify(&pdir(2));
    assert!(ok, "a healthy partition verifies:\n{text}");

    // The operator's way past the damage: DeleteRecords up to the next valid batch.
    for partition in 0..2 {
        assert_eq!(
            delete_records(&mut c, partition, VICTIM + 1),
            (0, VICTIM + 1)
        );
        read_all(&mut c, partition, VICTIM + 1, RECORDS);
    }
    broker.restart();
    let mut c = broker.client();
    for partition in 0..2 {
        read_all(&mut c, partition, VICTIM + 1, RECORDS);
    }
}
