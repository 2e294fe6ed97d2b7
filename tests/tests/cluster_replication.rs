//! Replication across real nodes (issue 11): three `weir` processes on 127.0.0.1, a topic
//! with replication factor 3 and `min.insync.replicas=2`. Followers fetch from the leader
//! (replica fetchers), the leader's HW waits for its ISR, so an acks=all confluent-kafka
//! producer's acknowledged records are on every ISR member. The leader's node is
//! SIGKILLed: the controller elects a new leader from the ISR, producing goes on with two
//! replicas, the killed node restarts, catches up and rejoins the ISR, and at the end every
//! acknowledged record is read back exactly once, in order, and the three replicas' logs
//! are identical byte for byte.

use std::time::{Duration, Instant};

use kafka_protocol::messages::MetadataResponse;
use weir_tests::clients;
use weir_tests::cluster::{self, Cluster};

const AGREE_TIMEOUT: Duration = Duration::from_secs(60);
const TOPIC: &str = "replicated";

/// (leader, ISR) of partition 0 of `topic` in `m`.
fn placement(m: &MetadataResponse, topic: &str) -> Option<(i32, Vec<i32>)> {
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    let p = t.partitions.iter().find(|p| p.partition_index == 0)?;
    let mut isr: Vec<i32> = p.isr_nodes.iter().map(|n| n.0).collect();
    isr.sort();
    Some((p.leader_id.0, isr))
}

fn partition_dir(c: &mut Cluster, id: i32) -> std::path::PathBuf {
    c.node(id).data_dir().join(format!("{TOPIC}-0"))
}

/// Waits (bounded) until every node's replica log is identical; returns its length.
fn wait_identical(c: &mut Cluster, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let logs: Vec<Vec<u8>> = (1..=3)
            .map(|id| cluster::log_bytes(&partition_dir(c, id)))
            .collect();
        if !logs[0].is_empty() && logs.windows(2).all(|w| w[0] == w[1]) {
            return logs[0].len();
        }
        if Instant::now() >= deadline {
            let tails: Vec<String> = (1..=3)
                .map(|id| format!("--- node {id}:\n{}", c.node(id).log_tail(30)))
                .collect();
            panic!(
                "replica logs differ after {timeout:?}: lengths {:?}\n{}",
                logs.iter().map(Vec::len).collect::<Vec<_>>(),
                tails.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every live node reports partition 0 with a live leader and `isr_len` ISR
/// members; returns (leader, ISR).
fn wait_placement(c: &mut Cluster, isr_len: usize, timeout: Duration) -> (i32, Vec<i32>) {
    let deadline = Instant::now() + timeout;
    loop {
        let live = c.live();
        let seen: Vec<Option<(i32, Vec<i32>)>> = live
            .iter()
            .map(|id| c.metadata(*id).ok().and_then(|m| placement(&m, TOPIC)))
            .collect();
        if let Some(Some((leader, isr))) = seen.first().cloned() {
            let agreed = seen
                .iter()
                .all(|s| s.as_ref() == Some(&(leader, isr.clone())));
            if agreed && live.contains(&leader) && isr.len() == isr_len {
                return (leader, isr);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no placement with {isr_len} in sync: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn produce(
    c: &mut Cluster,
    via: i32,
    first_id: u64,
    n: u64,
    tag: &str,
) -> (Vec<clients::Sent>, Vec<clients::Acked>) {
    let bootstrap = c.node(via).bootstrap();
    let (p, log) = clients::producer(&bootstrap, "all", "none", &[("enable.idempotence", "true")])
        .expect("producer");
    let records = clients::make_records(first_id, n, tag, clients::now_ms());
    clients::produce_all(&p, TOPIC, &records, Some(0)).expect("produce");
    assert!(
        log.failed().is_empty(),
        "failed deliveries: {:?}",
        log.failed()
    );
    (records, log.acked())
}

#[test]
fn acks_all_survives_the_leaders_sigkill_and_the_replicas_end_identical() {
    let mut c = Cluster::start(3, &[("min.insync.replicas", "2")]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 3).expect("create"), 0);
    let (leader, isr) = wait_placement(&mut c, 3, AGREE_TIMEOUT);
    assert_eq!(isr, vec![1, 2, 3]);

    let (mut sent, mut acked) = produce(&mut c, leader, 0, 400, "first");
    wait_identical(&mut c, AGREE_TIMEOUT);

    // The leader dies; a member of the ISR takes over and acks=all goes on with two.
    c.node(leader).kill().expect("SIGKILL the leader");
    let (new_leader, isr) = wait_placement(&mut c, 2, AGREE_TIMEOUT);
    assert_ne!(new_leader, leader);
    assert!(
        !isr.contains(&leader),
        "the dead node left the ISR: {isr:?}"
    );
    let (s, a) = produce(&mut c, new_leader, 10_000, 400, "second");
    sent.extend(s);
    acked.extend(a);

    // Back up, it truncates to the new leader's log if it must, catches up, rejoins.
    c.node(leader).restart().expect("restart");
    let (_, isr) = wait_placement(&mut c, 3, AGREE_TIMEOUT);
    assert_eq!(isr, vec![1, 2, 3], "the restarted node rejoined the ISR");
    wait_identical(&mut c, AGREE_TIMEOUT);

    let bootstrap = c.node(new_leader).bootstrap();
    let got = clients::consume_to_end(&bootstrap, TOPIC, &[0]).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record, once, in order");
    assert_eq!(checked, 800);
}

/// Nodes that advertise a host name, not an IP: followers resolve it (off their shard's
/// thread, `node/src/resolve.rs`) and replicate, and acks=all works through them.
#[test]
fn followers_replicate_from_a_leader_advertised_by_host_name() {
    let (mut c, _net) =
        Cluster::start_faulty_advertising(3, "localhost", &[("min.insync.replicas", "3")])
            .expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 3).expect("create"), 0);
    let (leader, isr) = wait_placement(&mut c, 3, AGREE_TIMEOUT);
    assert_eq!(isr, vec![1, 2, 3]);
    // min.insync.replicas = 3: every record acknowledged went through both followers.
    let (sent, acked) = produce(&mut c, leader, 0, 200, "named");
    wait_identical(&mut c, AGREE_TIMEOUT);
    let bootstrap = c.node(leader).bootstrap();
    let got = clients::consume_to_end(&bootstrap, TOPIC, &[0]).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record, once, in order");
    assert_eq!(checked, 200);
}

/// A topic whose `segment.bytes` (64 KiB) is smaller than what a follower fetches at
/// once (`replica.fetch.max.bytes`, 1 MiB): under acks=all load, with the leader made to
/// answer follower fetches only once 200 KB are there (or 200 ms passed), every fetched
/// chunk holds several producer batches and is larger than a segment. The followers
/// append each chunk in parts that roll their logs between them, stay in the ISR, and
/// end with the leader's log byte for byte, in segments no larger than the setting.
/// Before, such a chunk was refused whole (RECORD_LIST_TOO_LARGE) and the followers
/// stalled on it for good: they left the ISR and acks=all stopped.
#[test]
fn followers_of_a_topic_with_segments_smaller_than_a_fetch_stay_in_sync() {
    let segment_bytes = 65_536;
    let mut c = Cluster::start(
        3,
        &[
            ("min.insync.replicas", "2"),
            ("replica.fetch.min.bytes", "200000"),
            ("replica.fetch.wait.max.ms", "200"),
            ("replica.lag.time.max.ms", "10000"),
        ],
    )
    .expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    let configs = [("segment.bytes", "65536")];
    let created = cluster::create_topic_with(addr, TOPIC, 1, 3, &configs).expect("create");
    assert_eq!(created, 0);
    let (leader, isr) = wait_placement(&mut c, 3, AGREE_TIMEOUT);
    assert_eq!(isr, vec![1, 2, 3]);

    // Batches of up to 30 KB (a segment takes two). A connection has one produce
    // request in process at a time, as in Kafka, so four producers write at once: each
    // fetch answer holds about a batch from each.
    let bootstrap = c.node(leader).bootstrap();
    let producers = 4;
    let (sent, acked) = std::thread::scope(|s| {
        let running: Vec<_> = (0..producers)
            .map(|k| {
                let bootstrap = bootstrap.clone();
                s.spawn(move || {
                    let settings = [("enable.idempotence", "true"), ("batch.size", "30000")];
                    let (p, log) =
                        clients::producer(&bootstrap, "all", "none", &settings).expect("producer");
                    let tag = format!("producer-{k}");
                    let sent = clients::make_records(k * 100_000, 5_000, &tag, clients::now_ms());
                    clients::produce_all(&p, TOPIC, &sent, Some(0)).expect("produce");
                    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
                    (sent, log.acked())
                })
            })
            .collect();
        let (mut sent, mut acked) = (Vec::new(), Vec::new());
        for r in running {
            let (s, a) = r.join().expect("a producer thread");
            sent.extend(s);
            acked.extend(a);
        }
        (sent, acked)
    });

    let m = c.metadata(leader).expect("metadata");
    assert_eq!(
        placement(&m, TOPIC),
        Some((leader, vec![1, 2, 3])),
        "every follower in sync\n{}",
        c.log_tails(30)
    );
    let bytes = wait_identical(&mut c, AGREE_TIMEOUT);
    for id in (1..=3).filter(|id| *id != leader) {
        let dir = partition_dir(&mut c, id);
        let mut segments: Vec<(std::path::PathBuf, u64)> = std::fs::read_dir(&dir)
            .expect("partition dir")
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| (e.path(), e.metadata().map_or(0, |m| m.len())))
            .collect();
        segments.sort();
        assert!(
            segments.len() as u64 >= bytes as u64 / segment_bytes,
            "node {id}: {} segments for {bytes} bytes",
            segments.len()
        );
        // The active (last) segment's file may be padded to a block; sealed ones are
        // trimmed to their batches.
        segments.pop();
        assert!(
            segments.iter().all(|(_, size)| *size <= segment_bytes),
            "node {id}: a sealed segment larger than segment.bytes: {segments:?}"
        );
    }
    let got = clients::consume_to_end(&bootstrap, TOPIC, &[0]).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record, once, in order");
    assert_eq!(checked, 20_000);
}
