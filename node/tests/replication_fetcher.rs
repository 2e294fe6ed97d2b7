//! The replication fetcher against a real `weir serve` as its leader: a follower replica
//! in this test process (its own log on the real disk, node 2) fetches over TCP with
//! `replica_id` 2, the way a follower broker's shard will once the cluster assigns it.
//! It copies the leader's log byte for byte keeping offsets, learns the HW, resumes after
//! its own restart from its log end, parks on the leader instead of spinning when there
//! is nothing new, and realigns to (or, within the leader's log, follows) the leader's
//! log start after DeleteRecords there.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir::partition::Partition;
use weir::replication::client::BrokerConn;
use weir::replication::{FetcherConfig, ReplicaFetcher};
use weir::storage::prime_dma_probe;
use weir::storage::testing::run_on_shard;
use wire::{LeaderEpoch, NodeId, Offset, api};

const TOPIC: &str = "replicated";
const LEADER: NodeId = NodeId(0);
const FOLLOWER: NodeId = NodeId(2);
const ROUNDS_MAX: usize = 500;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Creates the topic; returns its id (the fetcher names topics by id, Fetch v13+).
fn create(c: &mut Client, partitions: i32) -> u128 {
    let t = CreatableTopic::default()
        .with_name(TopicName(s(TOPIC)))
        .with_num_partitions(partitions)
        .with_replication_factor(1);
    let resp: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    assert_eq!(resp.topics[0].error_code, 0);
    resp.topics[0].topic_id.as_u128()
}

/// `n` batches of two records each to `partition`.
fn produce(c: &mut Client, partition: i32, n: usize, tag: &str) {
    for i in 0..n {
        let value = format!("{tag}-{i}");
        let p = PartitionProduceData::default()
            .with_index(partition)
            .with_records(Some(batch(&[value.as_bytes(), b"second"], 1)));
        let req = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(s(TOPIC)))
                    .with_partition_data(vec![p]),
            ]);
        let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
        assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    }
}

/// The leader's records of `partition` from `offset` as a consumer fetch returns them,
/// and its HW.
fn leader_log(c: &mut Client, partition: i32, offset: i64) -> (Bytes, i64) {
    let p = FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(64 << 20);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_bytes(64 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s(TOPIC)))
                .with_partitions(vec![p]),
        ]);
    let resp: FetchResponse = c.call(api::FETCH, 12, &req);
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    (p.records.clone().unwrap_or_default(), p.high_watermark)
}

async fn open_follower(dir: &Path, index: i32, topic_id: u128) -> Rc<Partition> {
    let configs = BTreeMap::from([("segment.bytes".to_string(), "1048576".to_string())]);
    let p = Partition::open(dir, FOLLOWER, Arc::from(TOPIC), index, topic_id, configs)
        .await
        .expect("open follower replica");
    p.update_replica(|r| r.become_follower(LEADER, LeaderEpoch(0)));
    Rc::new(p)
}

/// A follower's whole log, from its log start to its end.
async fn read_log(p: &Partition) -> Vec<u8> {
    let end = p.log.log_end_offset();
    // A read returns what one source holds (disk or tail cache): read on to the end.
    let (mut log, mut at) = (Vec::new(), p.log.log_start_offset());
    for _ in 0..ROUNDS_MAX {
        if at >= end {
            break;
        }
        let read = p
            .log
            .read(at, 64 << 20, end)
            .await
            .expect("read follower log");
        log.extend(read.batches.concat());
        at = read.next_offset;
    }
    log
}

struct Caught {
    log: Vec<u8>,
    log_start: Offset,
    log_end: Offset,
    high_watermark: Offset,
    copied_bytes: u64,
    truncations: u64,
    idle_round: Duration,
}

/// Opens the follower in `dir`, fetches until its log end is `target`, then times one
/// round with nothing new.
fn catch_up(addr: SocketAddr, dir: std::path::PathBuf, topic_id: u128, target: i64) -> Caught {
    run_on_shard(move || async move {
        prime_dma_probe(&dir).await.expect("prime DMA probe");
        let p = open_follower(&dir.join(format!("{TOPIC}-0")), 0, topic_id).await;
        let config = FetcherConfig {
            wait_max: Duration::from_millis(200),
            ..FetcherConfig::default()
        };
        let fetcher = ReplicaFetcher::new(FOLLOWER, LEADER, addr, config);
        fetcher.follow((Arc::from(TOPIC), 0), p.clone());
        let mut conn = BrokerConn::connect(addr)
            .await
            .expect("connect to the leader");
        for _ in 0..ROUNDS_MAX {
            if p.log.log_end_offset() >= Offset(target) && p.high_watermark() >= Offset(target) {
                break;
            }
            fetcher.round(&mut conn).await.expect("fetch round");
        }
        let started = Instant::now();
        fetcher.round(&mut conn).await.expect("idle round");
        let idle_round = started.elapsed();
        let end = p.log.log_end_offset();
        let log = read_log(&p).await;
        let totals = fetcher.totals();
        let caught = Caught {
            log,
            log_start: p.log.log_start_offset(),
            log_end: end,
            high_watermark: p.high_watermark(),
            copied_bytes: totals.copied_bytes,
            truncations: totals.truncations,
            idle_round,
        };
        p.log.close().await.expect("close follower log");
        caught
    })
}

#[test]
fn a_follower_copies_its_leader_over_tcp_and_realigns_after_delete_records() {
    let broker = Broker::start(2, &[]);
    let addr: SocketAddr = broker.addr().parse().expect("broker address");
    let mut c = broker.client();
    let topic_id = create(&mut c, 1);
    produce(&mut c, 0, 30, "first");
    let follower_dir = tempfile::tempdir_in(common::test_root()).expect("tempdir");
    let dir = follower_dir.path().to_path_buf();

    let caught = catch_up(addr, dir.clone(), topic_id, 60);
    let (leader, hw) = leader_log(&mut c, 0, 0);
    assert_eq!(caught.log_end, Offset(60));
    assert_eq!(
        caught.log,
        leader.to_vec(),
        "the follower's log is the leader's, byte for byte"
    );
    assert_eq!(
        caught.high_watermark,
        Offset(hw),
        "the follower learned the leader's HW"
    );
    assert_eq!(
        caught.copied_bytes, 0,
        "one partition per fetch: appended in place"
    );
    assert!(
        caught.idle_round >= Duration::from_millis(150),
        "with nothing new the leader parks the fetch ({:?})",
        caught.idle_round
    );

    // More records while the follower is down; it resumes from its own log end.
    produce(&mut c, 0, 10, "second");
    let caught = catch_up(addr, dir.clone(), topic_id, 80);
    let (leader, _) = leader_log(&mut c, 0, 0);
    assert_eq!(caught.log_end, Offset(80));
    assert_eq!(caught.log, leader.to_vec(), "resumed, still identical");
    assert_eq!(caught.truncations, 0);

    // The leader drops records below 90 and moves on; a new follower starting empty is
    // below the leader's log start (OFFSET_OUT_OF_RANGE): it restarts its log there.
    produce(&mut c, 0, 10, "third");
    assert_eq!(
        catch_up(addr, dir.clone(), topic_id, 100).log_end,
        Offset(100)
    );
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(90),
                ]),
        ]);
    let resp: DeleteRecordsResponse = c.call(api::DELETE_RECORDS, 2, &req);
    assert_eq!(resp.topics[0].partitions[0].error_code, 0);
    let fresh = tempfile::tempdir_in(common::test_root()).expect("tempdir");
    let caught = catch_up(addr, fresh.path().to_path_buf(), topic_id, 100);
    assert_eq!(
        caught.log_start,
        Offset(90),
        "restarted at the leader's log start"
    );
    assert_eq!(caught.truncations, 1);
    let (leader, _) = leader_log(&mut c, 0, 90);
    assert_eq!(
        caught.log,
        leader.to_vec(),
        "identical from the log start on"
    );

    // The follower that had copied past 90 before the DeleteRecords catches up and moves
    // its log start to the leader's: after a failover it must not serve the records
    // deleted on the leader again.
    produce(&mut c, 0, 5, "fourth");
    let caught = catch_up(addr, dir.clone(), topic_id, 110);
    assert_eq!(
        caught.log_start,
        Offset(90),
        "followed the leader's log start"
    );
    assert_eq!(caught.truncations, 0);
    let (leader, _) = leader_log(&mut c, 0, 90);
    assert_eq!(
        caught.log,
        leader.to_vec(),
        "identical from the log start on"
    );
}

/// One fetcher follows every partition of a topic from its leader: one round answers all
/// of them and appends them together (the round waits for one DMA write, not one per
/// partition), and each follower log ends byte for byte its leader's, with its HW.
#[test]
fn one_fetcher_follows_many_partitions_and_each_log_is_its_leaders() {
    const PARTITIONS: i32 = 6;
    let broker = Broker::start(2, &[]);
    let addr: SocketAddr = broker.addr().parse().expect("broker address");
    let mut c = broker.client();
    let topic_id = create(&mut c, PARTITIONS);
    // A different number of batches per partition, so no log could pass for another.
    let batches = |p: i32| 3 + p as usize;
    for p in 0..PARTITIONS {
        produce(&mut c, p, batches(p), &format!("p{p}"));
    }
    let follower_dir = tempfile::tempdir_in(common::test_root()).expect("tempdir");
    let dir = follower_dir.path().to_path_buf();
    let (first_round, logs) = run_on_shard(move || async move {
        prime_dma_probe(&dir).await.expect("prime DMA probe");
        let fetcher = ReplicaFetcher::new(FOLLOWER, LEADER, addr, FetcherConfig::default());
        let mut followers = Vec::new();
        for index in 0..PARTITIONS {
            let p = open_follower(&dir, index, topic_id).await;
            fetcher.follow((Arc::from(TOPIC), index), p.clone());
            followers.push(p);
        }
        let mut conn = BrokerConn::connect(addr)
            .await
            .expect("connect to the leader");
        let first_round = fetcher.round(&mut conn).await.expect("first round");
        let caught_up = |p: &Partition, index: i32| {
            let end = Offset(2 * batches(index) as i64);
            p.log.log_end_offset() == end && p.high_watermark() == end
        };
        for _ in 0..ROUNDS_MAX {
            if followers.iter().zip(0..).all(|(p, i)| caught_up(p, i)) {
                break;
            }
            fetcher.round(&mut conn).await.expect("fetch round");
        }
        let mut logs = Vec::new();
        for p in &followers {
            logs.push((read_log(p).await, p.high_watermark()));
            p.log.close().await.expect("close follower log");
        }
        (first_round, logs)
    });
    let total: usize = (0..PARTITIONS).map(batches).sum();
    assert_eq!(
        first_round.appended_batches, total as u64,
        "the first round brought every partition's batches"
    );
    assert_eq!(
        first_round.appends_together, PARTITIONS as u64,
        "its appends were in flight together, not one after another"
    );
    for (index, (log, hw)) in (0..PARTITIONS).zip(logs) {
        let (leader, leader_hw) = leader_log(&mut c, index, 0);
        assert_eq!(log, leader.to_vec(), "partition {index}: the leader's log");
        assert_eq!(hw, Offset(leader_hw), "partition {index}: the leader's HW");
    }
}

/// A fetcher with nothing to fetch waits only until a paused partition may be fetched
/// again, or a partition is followed; never the whole `replica.fetch.wait.max.ms` (30 s
/// here): a partition the source refused is paused for `REFUSED_RETRY` (200 ms), and a
/// round that finds it paused returns about then; a round that finds nothing followed
/// returns as soon as a partition is.
#[test]
fn a_fetcher_with_nothing_to_fetch_wakes_for_a_paused_or_new_partition() {
    let broker = Broker::start(1, &[]);
    let addr: SocketAddr = broker.addr().parse().expect("broker address");
    let mut c = broker.client();
    let topic_id = create(&mut c, 1);
    produce(&mut c, 0, 2, "x");
    let follower_dir = tempfile::tempdir_in(common::test_root()).expect("tempdir");
    let dir = follower_dir.path().to_path_buf();
    let (paused_round, new_round, appended) = run_on_shard(move || async move {
        prime_dma_probe(&dir).await.expect("prime DMA probe");
        let config = FetcherConfig {
            wait_max: Duration::from_secs(30),
            ..FetcherConfig::default()
        };
        let fetcher = ReplicaFetcher::new(FOLLOWER, LEADER, addr, config);
        let mut conn = BrokerConn::connect(addr)
            .await
            .expect("connect to the leader");
        // A topic id the leader does not know: refused (UNKNOWN_TOPIC_ID), then paused.
        let stranger = open_follower(&dir.join("stranger"), 0, topic_id ^ 1).await;
        fetcher.follow((Arc::from("stranger"), 0), stranger.clone());
        let refused = fetcher.round(&mut conn).await.expect("refused round");
        assert_eq!(refused.paused, 1, "the source refused the unknown topic id");
        let started = Instant::now();
        fetcher
            .round(&mut conn)
            .await
            .expect("round with all paused");
        let paused_round = started.elapsed();
        fetcher.unfollow(&(Arc::from("stranger"), 0));
        stranger.log.close().await.expect("close");

        // Nothing followed: the round waits until a partition is.
        let p = open_follower(&dir.join(format!("{TOPIC}-0")), 0, topic_id).await;
        let started = Instant::now();
        let follow = async {
            fetcher.follow((Arc::from(TOPIC), 0), p.clone());
        };
        let (idle, ()) = futures_lite::future::zip(fetcher.round(&mut conn), follow).await;
        idle.expect("idle round");
        let new_round = started.elapsed();
        let mut appended = 0;
        for _ in 0..ROUNDS_MAX {
            if p.log.log_end_offset() >= Offset(2) {
                break;
            }
            appended += fetcher
                .round(&mut conn)
                .await
                .expect("round")
                .appended_batches;
        }
        p.log.close().await.expect("close");
        (paused_round, new_round, appended)
    });
    assert!(
        paused_round < Duration::from_secs(5),
        "a round with every partition paused took {paused_round:?}"
    );
    assert!(
        new_round < Duration::from_secs(5),
        "a round with nothing followed took {new_round:?} after a partition was followed"
    );
    assert!(appended > 0, "the newly followed partition was fetched");
}
