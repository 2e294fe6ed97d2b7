//! The replication metrics of a 3-node cluster (issue 17), scraped from the leader's
//! `metrics.listener` as Prometheus would: with every replica in sync nothing is
//! under-replicated; a follower SIGKILLed leaves the ISR (one shrink counted, one
//! partition under-replicated, its lag in records growing with what is produced); once it
//! restarts and catches up it rejoins (one expand counted, nothing under-replicated, lag 0),
//! and the followers' replica fetchers count the bytes they copied.
//!
//! KIP-392 (fetch from the closest replica), counted the same way: with the rack-aware
//! `replica.selector.class`, a librdkafka consumer whose `client.rack` is a follower's
//! rack is sent there by the leader and reads everything exactly once, in order, from
//! that follower; without the selector no follower serves it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::messages::MetadataResponse;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use weir_tests::clients;
use weir_tests::cluster::{self, Cluster};

const TIMEOUT: Duration = Duration::from_secs(90);
const TOPIC: &str = "metered";

/// (leader, sorted ISR) of partition 0 of `TOPIC`.
fn placement(m: &MetadataResponse) -> Option<(i32, Vec<i32>)> {
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == TOPIC))?;
    let p = t.partitions.iter().find(|p| p.partition_index == 0)?;
    let mut isr: Vec<i32> = p.isr_nodes.iter().map(|n| n.0).collect();
    isr.sort();
    Some((p.leader_id.0, isr))
}

/// Waits until node `via` reports `isr_len` in sync; returns (leader, ISR).
fn wait_isr(c: &mut Cluster, via: i32, isr_len: usize) -> (i32, Vec<i32>) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let seen = c.metadata(via).ok().and_then(|m| placement(&m));
        if let Some((leader, isr)) = &seen
            && *leader >= 0
            && isr.len() == isr_len
        {
            return (*leader, isr.clone());
        }
        assert!(Instant::now() < deadline, "no ISR of {isr_len}: {seen:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The metrics address node `id` logged last (a restart picks a new port).
fn metrics_addr(c: &mut Cluster, id: i32) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = c.node(id).log_text();
        if let Some(line) = text
            .lines()
            .rev()
            .find(|l| l.contains("metrics listening on"))
        {
            return line
                .rsplit(' ')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
        }
        assert!(
            Instant::now() < deadline,
            "node {id} logged no metrics address"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

/// The sum of the series of `name` whose labels contain `labels`.
fn total(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let is_it = rest.is_empty() || rest.starts_with('{');
            (is_it && rest.contains(labels)).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

/// Scrapes `addr` until `ready` holds (gauges are published once a second), bounded.
fn scrape_until(addr: &str, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = scrape(addr);
        if ready(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} not seen in\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn produce(c: &mut Cluster, via: i32, first_id: u64, n: u64) {
    let bootstrap = c.node(via).bootstrap();
    let (p, log) = clients::producer(&bootstrap, "1", "none", &[]).expect("producer");
    let records = clients::make_records(first_id, n, "m", clients::now_ms());
    clients::produce_all(&p, TOPIC, &records, Some(0)).expect("produce");
    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
}

#[test]
fn a_killed_follower_is_counted_under_replicated_and_its_return_as_an_isr_expand() {
    let extra = [
        ("metrics.listener", "127.0.0.1:0"),
        ("replica.lag.time.max.ms", "3000"),
        // The leader stays where it is when the follower returns.
        ("auto.leader.rebalance.enable", "false"),
    ];
    let mut c = Cluster::start(3, &extra).expect("start cluster");
    c.wait_agreed(3, TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 3).expect("create"), 0);
    let (leader, isr) = wait_isr(&mut c, 1, 3);
    assert_eq!(isr, vec![1, 2, 3]);
    let follower = *isr.iter().find(|n| **n != leader).expect("a follower");
    let at_leader = metrics_addr(&mut c, leader);
    produce(&mut c, leader, 0, 100);
    let lag_of = format!("follower=\"{follower}\"");
    let before = scrape_until(&at_leader, "followers caught up", |t| {
        t.contains("weir_follower_lag_records{")
            && total(t, "weir_follower_lag_records", "") == 0.0
            && total(t, "weir_under_replicated_partitions", "") == 0.0
    });
    let at_follower = metrics_addr(&mut c, follower);
    // The follower writes what it copies as a follower's writes, never as a leader's.
    let copied = scrape_until(
        &at_follower,
        "replica fetch bytes and follower writes",
        |t| {
            total(t, "weir_replica_fetch_bytes_total", "") > 0.0
                && total(t, "weir_storage_follower_writes_total", "") > 0.0
        },
    );
    assert_eq!(total(&copied, "weir_storage_leader_writes_total", ""), 0.0);
    let copied = total(&copied, "weir_replica_fetch_bytes_total", "");
    let shrinks = total(&before, "weir_isr_shrinks_total", "");
    let expands = total(&before, "weir_isr_expands_total", "");

    c.node(follower).kill().expect("SIGKILL the follower");
    wait_isr(&mut c, leader, 2);
    produce(&mut c, leader, 100, 50);
    let out = scrape_until(&at_leader, "one partition under-replicated", |t| {
        total(t, "weir_under_replicated_partitions", "") == 1.0
            && total(t, "weir_follower_lag_records", &lag_of) >= 50.0
    });
    assert!(total(&out, "weir_isr_shrinks_total", "") >= shrinks + 1.0);
    assert!(total(&out, "weir_storage_leader_writes_total", "") > 0.0);
    assert_eq!(total(&out, "weir_storage_follower_writes_total", ""), 0.0);
    assert_eq!(total(&out, "weir_isr_expands_total", ""), expands);
    assert!(total(&out, "weir_follower_caught_up_age_seconds", &lag_of) >= 3.0);

    c.node(follower).restart().expect("restart the follower");
    wait_isr(&mut c, leader, 3);
    let back = scrape_until(&at_leader, "the follower back in sync", |t| {
        total(t, "weir_under_replicated_partitions", "") == 0.0
            && total(t, "weir_follower_lag_records", "") == 0.0
    });
    assert!(total(&back, "weir_isr_expands_total", "") >= expands + 1.0);
    let again = metrics_addr(&mut c, follower);
    scrape_until(&again, "the restarted follower copies", |t| {
        total(t, "weir_replica_fetch_bytes_total", "") > 0.0
    });
    assert!(copied > 0.0);
}

/// Commands that change nothing (here CreateTopics the controller refuses: a replication
/// factor above the live nodes) are not announced to the shards, which would re-sync
/// every partition for each: `weir_controller_notices_total` stays put, and a real change
/// (a topic created) still moves it.
#[test]
fn refused_metadata_commands_announce_no_change_to_the_shards() {
    let extra = [("metrics.listener", "127.0.0.1:0")];
    let mut c = Cluster::start(3, &extra).expect("start cluster");
    c.wait_agreed(3, TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    let metrics = metrics_addr(&mut c, 1);
    let notices = || total(&scrape(&metrics), "weir_controller_notices_total", "");
    let before = notices();
    const REFUSED: usize = 20;
    for i in 0..REFUSED {
        let code = cluster::create_topic(addr, &format!("too-wide-{i}"), 1, 4).expect("create");
        assert_eq!(code, 38, "INVALID_REPLICATION_FACTOR");
    }
    let after = notices();
    // Other changes may happen meanwhile on a loaded machine (an ISR change), but not
    // one per refused command.
    assert!(
        after - before < (REFUSED / 2) as f64,
        "{before} -> {after} notices for {REFUSED} refused commands"
    );
    assert_eq!(
        cluster::create_topic(addr, "real", 1, 3).expect("create"),
        0
    );
    scrape_until(&metrics, "a notice for a real change", |t| {
        total(t, "weir_controller_notices_total", "") > after
    });
}

/// Kafka's rack-aware replica selector class.
const RACK_AWARE: &str = "org.apache.kafka.common.replica.RackAwareReplicaSelector";
/// Records produced for the fetch-from-follower tests.
const NEAR_RECORDS: u64 = 300;

/// The rack of node `id` in the fetch-from-follower tests.
fn rack_of(id: i32) -> &'static str {
    ["a", "b", "c"][usize::try_from(id - 1).expect("node ids from 1")]
}

/// Three nodes in racks a, b, c (plus `extra`), `TOPIC` with one partition on all three
/// and `NEAR_RECORDS` produced with acks=all; returns the cluster, the leader and a
/// follower.
fn racked_with_records(extra: &[(&str, &str)]) -> (Cluster, i32, i32) {
    let mut all = vec![
        ("metrics.listener", "127.0.0.1:0"),
        // The leader stays where it is for the whole test.
        ("auto.leader.rebalance.enable", "false"),
    ];
    all.extend_from_slice(extra);
    let racks: Vec<(i32, &str, &str)> =
        (1..=3).map(|id| (id, "broker.rack", rack_of(id))).collect();
    let mut c = Cluster::start_per_node(3, &all, &racks).expect("start cluster");
    c.wait_agreed(3, TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 3).expect("create"), 0);
    let (leader, isr) = wait_isr(&mut c, 1, 3);
    let follower = *isr.iter().find(|n| **n != leader).expect("a follower");
    let bootstrap = c.node(leader).bootstrap();
    let (p, log) = clients::producer(&bootstrap, "all", "none", &[]).expect("producer");
    let records = clients::make_records(0, NEAR_RECORDS, "near", clients::now_ms());
    clients::produce_all(&p, TOPIC, &records, Some(0)).expect("produce");
    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
    assert_eq!(log.acked().len(), NEAR_RECORDS as usize);
    (c, leader, follower)
}

/// Reads partition 0 of `TOPIC` from the start through `bootstrap` as a consumer in
/// `rack` until `NEAR_RECORDS` arrived, then a little longer (duplicates); checks every
/// record came once, in order.
fn consume_in_rack(bootstrap: &str, rack: &str) {
    let consumer = clients::consumer(bootstrap, &[("client.rack", rack)]).expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");
    let mut ids = Vec::new();
    let mut last_error: Option<KafkaError> = None;
    let deadline = Instant::now() + TIMEOUT;
    while ids.len() < NEAR_RECORDS as usize {
        assert!(
            Instant::now() < deadline,
            "read {} of {NEAR_RECORDS}; last client error: {last_error:?}",
            ids.len()
        );
        match consumer.poll(Duration::from_millis(200)) {
            None | Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Ok(m)) => ids.push(clients::header_id(&clients::to_got(&m))),
            Some(Err(e)) => last_error = Some(e),
        }
    }
    let extra_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < extra_until {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            ids.push(clients::header_id(&clients::to_got(&m)));
        }
    }
    let want: Vec<Option<u64>> = (0..NEAR_RECORDS).map(Some).collect();
    assert_eq!(ids, want, "every record once, in order");
}

/// KIP-392: the leader sends a consumer in a follower's rack to that follower, which
/// serves every record (counted there, and only there).
#[test]
fn a_consumer_in_a_followers_rack_reads_everything_from_that_follower() {
    let (mut c, leader, follower) = racked_with_records(&[("replica.selector.class", RACK_AWARE)]);
    let bootstrap = c.node(leader).bootstrap();
    consume_in_rack(&bootstrap, rack_of(follower));
    let at_follower = metrics_addr(&mut c, follower);
    let near = scrape(&at_follower);
    let served = total(&near, "weir_fetch_follower_records_total", "");
    assert!(
        served >= NEAR_RECORDS as f64,
        "the follower served {served}\n{near}"
    );
    assert!(total(&near, "weir_fetch_follower_reads_total", "") >= 1.0);
    let at_leader = metrics_addr(&mut c, leader);
    let sent = total(
        &scrape(&at_leader),
        "weir_fetch_preferred_read_replica_total",
        "",
    );
    assert!(sent >= 1.0, "the leader named a preferred read replica");
    let other = (1..=3)
        .find(|n| *n != leader && *n != follower)
        .expect("a third node");
    let at_other = metrics_addr(&mut c, other);
    let far = total(&scrape(&at_other), "weir_fetch_follower_records_total", "");
    assert_eq!(far, 0.0, "the follower in another rack served nothing");
}

/// Without a replica selector the leader serves every consumer itself: no follower
/// serves a record, whatever the client's rack.
#[test]
fn without_a_replica_selector_followers_serve_no_consumer() {
    let (mut c, leader, follower) = racked_with_records(&[]);
    let bootstrap = c.node(leader).bootstrap();
    consume_in_rack(&bootstrap, rack_of(follower));
    for id in 1..=3 {
        let at = metrics_addr(&mut c, id);
        let text = scrape(&at);
        assert_eq!(
            total(&text, "weir_fetch_follower_records_total", ""),
            0.0,
            "node {id}"
        );
        assert_eq!(
            total(&text, "weir_fetch_preferred_read_replica_total", ""),
            0.0,
            "node {id}"
        );
    }
}
