//! Cross-shard behaviour under load: hundreds of parked long polls must not hold back
//! produces routed to another shard (waits take no inbox slot), and every parked poll is
//! woken by the append.

mod common;

use std::time::{Duration, Instant};

use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

/// More parked polls than a shard's inbox admits at once from one peer (256).
const PARKED_POLLS: usize = 700;

fn name() -> TopicName {
    TopicName(StrBytes::from_static_str("hol"))
}

#[test]
fn parked_long_polls_do_not_block_cross_shard_produce() {
    let broker = Broker::start(2, &[]);
    let mut admin = broker.client();
    let t = CreatableTopic::default()
        .with_name(name())
        .with_num_partitions(2)
        .with_replication_factor(1);
    let _: CreateTopicsResponse = admin.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    // Each poll names both partitions, so whichever shard it lands on, it parks a wait on
    // the other shard too.
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(30_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default().with_topic(name()).with_partitions(
                (0..2)
                    .map(|p| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_partition_max_bytes(1 << 20)
                    })
                    .collect(),
            ),
        ]);
    let mut pollers: Vec<Client> = (0..PARKED_POLLS).map(|_| broker.client()).collect();
    for c in &mut pollers {
        c.send(api::FETCH, 12, &fetch);
    }
    std::thread::sleep(Duration::from_millis(500));

    let t0 = Instant::now();
    let parts = (0..2)
        .map(|p| {
            PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(batch(&[b"go"], 1)))
        })
        .collect();
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(name())
                .with_partition_data(parts),
        ]);
    let resp: ProduceResponse = broker.client().call(api::PRODUCE, 9, &req);
    let took = t0.elapsed();
    assert!(
        resp.responses[0]
            .partition_responses
            .iter()
            .all(|p| p.error_code == 0)
    );
    assert!(
        took < Duration::from_secs(10),
        "produce to both shards took {took:?} behind parked polls"
    );

    for c in &mut pollers {
        let (_, r): (i32, FetchResponse) = c.recv(api::FETCH, 12);
        let got: usize = r.responses[0]
            .partitions
            .iter()
            .map(|p| p.records.as_ref().map_or(0, |b| b.len()))
            .sum();
        assert!(got > 0, "every parked poll is woken with the new records");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "woken by the append, not by max_wait"
    );
}
