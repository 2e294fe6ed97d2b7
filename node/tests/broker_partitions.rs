//! Partition counts against a real `weir serve`: `max.partitions` (node-wide) and
//! `max.partitions.per.request` refuse with POLICY_VIOLATION (CreateTopics,
//! CreatePartitions, auto-creation); a 100,000-partition CreateTopics does not stall a
//! canary client on the same shard; partitions open on first use and idle ones close, so
//! a node under a low RLIMIT_NOFILE restarts and serves every partition; failed accepts
//! (EMFILE) back off and log rate-limited, and the node accepts again once files are free.
//!
//! The full-size measurement (100,000 partitions: create time, canary p99, one record
//! into each, restart to ready, RSS) is `#[ignore]`d:
//! `cargo test --release -p weir --test broker_partitions -- --ignored --nocapture`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Broker, Client, batch};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

const POLICY_VIOLATION: i16 = 44;
const PRODUCE_V: i16 = 9;
/// The canary's bound on its 99th percentile latency while another client creates.
const CANARY_P99_MAX: Duration = Duration::from_millis(50);
/// How long creating 150,000 partitions may take on any machine; a slower one may take
/// up to `CREATE_TIME_RATIO_MAX` times a 10,000-partition create measured in the same run.
const CREATE_TIME_MAX: Duration = Duration::from_secs(20);
const CREATE_TIME_RATIO_MAX: u32 = 40;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic(name: &str, partitions: i32) -> CreatableTopic {
    CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(1)
}

/// CreateTopics; one error code per topic, in order.
fn create(c: &mut Client, topics: Vec<CreatableTopic>, validate_only: bool) -> Vec<i16> {
    let req = CreateTopicsRequest::default()
        .with_topics(topics)
        .with_validate_only(validate_only)
        .with_timeout_ms(60_000);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 7, &req);
    resp.topics.iter().map(|t| t.error_code).collect()
}

fn grow(c: &mut Client, name: &str, count: i32) -> i16 {
    let req = CreatePartitionsRequest::default()
        .with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(TopicName(s(name)))
                .with_count(count),
        ])
        .with_timeout_ms(5000);
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &req);
    resp.results[0].error_code
}

/// Metadata for `names`; (error code, partition count) per topic.
fn metadata(c: &mut Client, names: &[&str], allow_create: bool) -> Vec<(i16, usize)> {
    let topics = names
        .iter()
        .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(s(n)))))
        .collect();
    let req = MetadataRequest::default()
        .with_topics(Some(topics))
        .with_allow_auto_topic_creation(allow_create);
    let resp: MetadataResponse = c.call(api::METADATA, 12, &req);
    resp.topics
        .iter()
        .map(|t| (t.error_code, t.partitions.len()))
        .collect()
}

/// One Produce (acks=1) of one record to each of `partitions`; their error codes.
fn produce_each(c: &mut Client, name: &str, partitions: std::ops::Range<i32>) -> Vec<i16> {
    let record = batch(&[b"v"], 1);
    let data = partitions
        .map(|p| {
            PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(record.clone()))
        })
        .collect();
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s(name)))
                .with_partition_data(data),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, PRODUCE_V, &req);
    resp.responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
        .collect()
}

/// ListOffsets latest for each of `partitions`; (error code, offset) per partition.
fn latest_offsets(c: &mut Client, name: &str, partitions: std::ops::Range<i32>) -> Vec<(i16, i64)> {
    let parts = partitions
        .map(|p| {
            ListOffsetsPartition::default()
                .with_partition_index(p)
                .with_timestamp(-1)
        })
        .collect();
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(s(name)))
                .with_partitions(parts),
        ]);
    let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, 6, &req);
    resp.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.error_code, p.offset)))
        .collect()
}

/// A client on its own connection that produces one small record at a time to
/// `canary-0` until stopped, recording each round trip.
struct Canary {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Duration>>,
}

impl Canary {
    /// Creates `canary` and starts producing to it.
    fn start(broker: &Broker) -> Canary {
        let mut c = broker.client();
        assert_eq!(create(&mut c, vec![topic("canary", 1)], false), vec![0]);
        Canary::start_existing(broker)
    }

    /// Starts producing to the existing `canary` topic.
    fn start_existing(broker: &Broker) -> Canary {
        let mut c = broker.client();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Acquire) {
                let t0 = Instant::now();
                assert_eq!(produce_each(&mut c, "canary", 0..1), vec![0]);
                samples.push(t0.elapsed());
                std::thread::sleep(Duration::from_millis(2));
            }
            samples
        });
        Canary { stop, thread }
    }

    /// Lets it run for `d` with nothing else going on, then stops it: a baseline.
    fn finish_after(self, d: Duration) -> (usize, Duration, Duration) {
        std::thread::sleep(d);
        self.finish()
    }

    /// Stops it; returns (samples, p99, max).
    fn finish(self) -> (usize, Duration, Duration) {
        self.stop.store(true, Ordering::Release);
        let mut samples = self.thread.join().expect("canary thread");
        samples.sort();
        let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
        let max = *samples.last().expect("samples");
        (samples.len(), p99, max)
    }
}

#[test]
fn partition_limits_refuse_with_policy_violation() {
    let sets = [
        ("max.partitions", "1000"),
        ("max.partitions.per.request", "400"),
        ("num.partitions", "100"),
    ];
    let broker = Broker::start(2, &sets);
    let mut c = broker.client();

    // Per request: the topic that would take the request past 400 is refused, the
    // others are created (Kafka answers per topic).
    let codes = create(
        &mut c,
        vec![topic("a", 200), topic("b", 250), topic("c", 100)],
        false,
    );
    assert_eq!(codes, vec![0, POLICY_VIOLATION, 0]);
    assert_eq!(
        create(&mut c, vec![topic("v", 401)], true),
        vec![POLICY_VIOLATION],
        "validate_only checks the same limit"
    );
    assert_eq!(metadata(&mut c, &["b"], false)[0].0, 3, "b was not created");

    // Node-wide: 300 exist; 650 more fit, then only 50.
    assert_eq!(create(&mut c, vec![topic("d", 300)], false), vec![0]);
    assert_eq!(create(&mut c, vec![topic("e", 350)], false), vec![0]);
    assert_eq!(
        create(&mut c, vec![topic("f", 51)], false),
        vec![POLICY_VIOLATION]
    );
    assert_eq!(
        grow(&mut c, "a", 251),
        POLICY_VIOLATION,
        "CreatePartitions too"
    );
    assert_eq!(
        metadata(&mut c, &["auto"], true)[0].0,
        POLICY_VIOLATION,
        "auto-creation (num.partitions=100) too"
    );
    assert_eq!(
        create(&mut c, vec![topic("g", 50)], false),
        vec![0],
        "exactly 1000 fits"
    );
    assert_eq!(
        metadata(&mut c, &["a", "g"], false),
        vec![(0, 200), (0, 50)]
    );

    // The limit holds after a restart (it counts the catalogue, not open logs).
    let mut broker = broker;
    broker.restart();
    let mut c = broker.client();
    assert_eq!(
        create(&mut c, vec![topic("h", 1)], false),
        vec![POLICY_VIOLATION]
    );
}

#[test]
fn creating_100000_partitions_does_not_stall_a_canary_on_the_same_shard() {
    // One shard: the canary's connection and partition share the creating shard.
    let broker = Broker::start(1, &[]);
    // A baseline first: on a loaded machine the canary is slow without any creation too.
    let (samples, p99_alone, max) = Canary::start(&broker).finish_after(Duration::from_secs(2));
    eprintln!("canary alone: {samples} samples, p99 {p99_alone:?}, max {max:?}");
    let mut c = broker.client();
    // The creation's time is bounded against a tenth-size one in the same run: linear
    // code takes ~15 times as long for the full size, quadratic ~225 times.
    let t_base = Instant::now();
    assert_eq!(create(&mut c, vec![topic("base", 10_000)], false), vec![0]);
    let base = t_base.elapsed();
    let canary = Canary::start_existing(&broker);
    let t0 = Instant::now();
    assert_eq!(create(&mut c, vec![topic("wide", 100_000)], false), vec![0]);
    let many: Vec<_> = (0..1000).map(|i| topic(&format!("many-{i}"), 50)).collect();
    assert!(create(&mut c, many, false).iter().all(|&e| e == 0));
    let created = t0.elapsed();
    // Let the canary run a little after the creation too.
    let more = Instant::now();
    while more.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(metadata(&mut c, &["many-999"], false), vec![(0, 50)]);
    let (samples, p99, max) = canary.finish();
    eprintln!(
        "150,000 partitions created in {created:?}; canary {samples} samples, p99 {p99:?}, max {max:?}"
    );
    // A second baseline after the creation: the machine's load (other tests) can change
    // between the first window and the creation's, so the bound uses the worse of the two.
    let (_, p99_after, _) = Canary::start_existing(&broker).finish_after(Duration::from_secs(2));
    eprintln!("canary alone again: p99 {p99_after:?}");
    let p99_alone = p99_alone.max(p99_after);
    let created_max = CREATE_TIME_MAX.max(base * CREATE_TIME_RATIO_MAX);
    assert!(
        created < created_max,
        "creation took {created:?} (10,000 partitions: {base:?})"
    );
    assert!(samples >= 20, "the canary ran ({samples} samples)");
    // 50 ms, or twice what the canary sees alone on a machine too loaded for 50 ms (the
    // old code stalled it for the whole creation: 16 s).
    let bound = CANARY_P99_MAX.max(p99_alone * 2);
    assert!(
        p99 <= bound,
        "canary p99 {p99:?} (max {max:?}), alone {p99_alone:?}"
    );

    assert_eq!(metadata(&mut c, &["wide"], false), vec![(0, 100_000)]);
    assert_eq!(produce_each(&mut c, "wide", 99_990..100_000), vec![0; 10]);
    assert_eq!(
        latest_offsets(&mut c, "wide", 99_990..100_000),
        vec![(0, 1); 10]
    );
}

#[test]
fn a_low_file_limit_still_serves_every_partition_across_restarts() {
    // 1024 files: far fewer than 3,000 partition logs with data.
    let mut broker = Broker::start_with_nofile(1024, 1, &[]);
    assert!(
        broker.wait_log("RLIMIT_NOFILE is 1024", Duration::from_secs(5)),
        "the startup check says the limit is too low"
    );
    assert!(broker.log_contains("ulimit -n"), "and what to set");
    let mut c = broker.client();
    assert_eq!(create(&mut c, vec![topic("wide", 5000)], false), vec![0]);
    for first in (0..3000).step_by(100) {
        let codes = produce_each(&mut c, "wide", first..first + 100);
        assert_eq!(codes, vec![0; 100], "partitions {first}..");
    }
    drop(c);
    let t0 = Instant::now();
    broker.restart();
    let ready = t0.elapsed();
    assert!(ready < Duration::from_secs(30), "restart took {ready:?}");
    let _log = LogOnPanic(&broker);
    let mut c = broker.client();
    // 100 partitions per request: the file budget closes idle logs between requests
    // (one request naming more than the file limit allows still fails, see README).
    for first in (0..3000).step_by(100) {
        let offsets = latest_offsets(&mut c, "wide", first..first + 100);
        assert_eq!(
            offsets,
            vec![(0, 1); 100],
            "partitions {first}.. kept their record"
        );
    }
    assert_eq!(produce_each(&mut c, "wide", 4990..5000), vec![0; 10]);
    assert!(
        !broker.log_contains("cannot open partition log"),
        "no partition failed to open"
    );
}

/// Prints the end of the broker's log if the test fails (it says why the node refused).
struct LogOnPanic<'a>(&'a Broker);

impl Drop for LogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.0.log.lock().map(|l| l.clone()).unwrap_or_default();
            for line in log.iter().rev().take(40).rev() {
                eprintln!("weir: {line}");
            }
        }
    }
}

/// Lines of the broker's log that contain `needle`.
fn count_log(broker: &Broker, needle: &str) -> usize {
    let log = broker.log.lock().expect("log");
    log.iter().filter(|l| l.contains(needle)).count()
}

#[test]
fn failed_accepts_back_off_and_the_node_recovers() {
    let broker = Broker::start_with_nofile(256, 1, &[]);
    let mut first = broker.client();
    assert_eq!(metadata(&mut first, &[], false), vec![]);
    // Far more connections than the process has files: the kernel completes each
    // handshake, weir's accept fails with EMFILE.
    let mut held = Vec::new();
    let addr: std::net::SocketAddr = broker.addr().parse().expect("addr");
    for _ in 0..400 {
        // Once the accept queue is full the kernel drops SYNs: stop there.
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    assert!(
        broker.wait_log("accept failed", Duration::from_secs(10)),
        "accept ran out of files"
    );
    // Three seconds of EMFILE: a tight loop would log hundreds of lines.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines = count_log(&broker, "accept failed");
    assert!(lines <= 3, "{lines} 'accept failed' lines in ~3 s");
    assert_eq!(
        metadata(&mut first, &[], false),
        vec![],
        "open connections are served"
    );

    drop(held);
    // Files are free again: within the longest backoff the node accepts a new client.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = Client::connect(&broker.addr());
        c.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let req = ApiVersionsRequest::default();
        if c.send(api::API_VERSIONS, 3, &req) > 0 && c.read_frame().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the node never accepted again");
    }
    assert!(broker.wait_log("accepting again", Duration::from_secs(5)));
}

/// VmHWM and VmRSS of `pid` in MiB.
fn memory_mib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

#[test]
#[ignore = "minutes: cargo test --release -p weir --test broker_partitions -- --ignored --nocapture"]
fn measure_100000_partitions_create_fill_restart() {
    let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut broker = Broker::start(shards, &[]);
    let canary = Canary::start(&broker);
    let mut c = broker.client();
    let t0 = Instant::now();
    assert_eq!(create(&mut c, vec![topic("wide", 100_000)], false), vec![0]);
    let created = t0.elapsed();
    let more = Instant::now();
    while more.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (samples, p99, max) = canary.finish();
    println!(
        "create 100,000 partitions: {created:?}; canary p99 {p99:?} max {max:?} ({samples} samples)"
    );

    let canary = Canary::start_existing(&broker);
    let t0 = Instant::now();
    for first in (0..100_000).step_by(1000) {
        assert_eq!(
            produce_each(&mut c, "wide", first..first + 1000),
            vec![0; 1000]
        );
    }
    let filled = t0.elapsed();
    let (samples, p99, max) = canary.finish();
    let pid = broker.pid();
    let (hwm, rss) = memory_mib(pid);
    println!(
        "one record into each: {filled:?}; canary p99 {p99:?} max {max:?} ({samples} samples); VmHWM {hwm} MiB, VmRSS {rss} MiB"
    );

    drop(c);
    let t0 = Instant::now();
    broker.restart();
    let ready = t0.elapsed();
    let mut c = broker.client();
    let t1 = Instant::now();
    assert_eq!(latest_offsets(&mut c, "wide", 0..1000), vec![(0, 1); 1000]);
    let first_reads = t1.elapsed();
    let (hwm, rss) = memory_mib(broker.pid());
    println!(
        "restart to ready: {ready:?}; ListOffsets of 1,000 partitions after: {first_reads:?}; VmHWM {hwm} MiB, VmRSS {rss} MiB"
    );
}
