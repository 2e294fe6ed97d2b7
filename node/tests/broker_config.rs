//! Configuration as an operator gives it: `--config server.properties`, `--set`, the
//! dedicated flags (advertised listener, node id) as clients see them in Metadata, and
//! background retention driven by topic configs.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Broker, batch, test_root};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_tests::process::run_bounded;
use wire::api;

/// How long a `weir serve` that must refuse to start may take to exit.
const CMD_TIMEOUT: Duration = Duration::from_secs(60);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[test]
fn config_file_set_and_flags_reach_clients() {
    let dir = tempfile::tempdir_in(test_root()).expect("tempdir");
    let props = dir.path().join("server.properties");
    std::fs::write(
        &props,
        "# a Kafka-style file\nnum.partitions=5\nnode.id=3\nauto.create.topics.enable = true\n",
    )
    .expect("write");
    // `--set` wins over the file; dedicated flags win over both.
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "1",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&props)
        .args([
            "--set",
            "num.partitions=7",
            "--node-id",
            "9",
            "--advertised-listener",
            "kafka.example:19092",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut child = ChildGuard(out);
    let port = wait_ready_port(&mut child.0);
    let mut c = common::Client::connect(&format!("127.0.0.1:{port}"));
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(s("auto")))),
        ]))
        .with_allow_auto_topic_creation(true);
    let md: MetadataResponse = c.call(api::METADATA, 12, &req);
    assert_eq!(
        md.topics[0].partitions.len(),
        7,
        "--set num.partitions=7 beats the file's 5"
    );
    assert_eq!(md.brokers[0].node_id.0, 9);
    assert_eq!(
        (md.brokers[0].host.as_str(), md.brokers[0].port),
        ("kafka.example", 19092)
    );
    assert_eq!(md.controller_id.0, 9);
    assert_eq!(md.topics[0].partitions[0].leader_id.0, 9);

    let mut bad = Command::new(env!("CARGO_BIN_EXE_weir"));
    bad.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--set",
        "num.partitions=lots",
        "--data-dir",
    ])
    .arg(dir.path().join("data2"));
    let bad = run_bounded(&mut bad, CMD_TIMEOUT).expect("run");
    assert!(!bad.ok(), "a bad value is refused at startup");
    assert!(bad.stderr.contains("num.partitions"), "naming the key");
}

struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_ready_port(child: &mut std::process::Child) -> u16 {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.split("listening on ").nth(1) {
            return rest
                .trim()
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("port");
        }
    }
    panic!("no ready line");
}

/// Creates `topic` (one partition, 1 KiB segments, `retention.ms` 60 s) and appends ten
/// 400-byte records stamped in 1970, far older than its retention: ten sealed segments.
fn create_with_expired_segments(c: &mut common::Client, topic: &str) {
    let cfg = |k: &str, v: &str| {
        CreatableTopicConfig::default()
            .with_name(s(k))
            .with_value(Some(s(v)))
    };
    let t = CreatableTopic::default()
        .with_name(TopicName(s(topic)))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(vec![
            cfg("segment.bytes", "1024"),
            cfg("retention.ms", "60000"),
        ]);
    let _: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![t]),
    );
    let value = vec![1u8; 400];
    for _ in 0..10 {
        let p = PartitionProduceData::default()
            .with_index(0)
            .with_records(Some(batch(&[&value], 1_000)));
        let req = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(1000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(s(topic)))
                    .with_partition_data(vec![p]),
            ]);
        let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
        assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    }
}

#[test]
fn background_retention_deletes_old_segments() {
    let broker = Broker::start(2, &[("log.retention.check.interval.ms", "100")]);
    let mut c = broker.client();
    create_with_expired_segments(&mut c, "old");
    let earliest = |c: &mut common::Client| {
        let p = ListOffsetsPartition::default()
            .with_partition_index(0)
            .with_timestamp(-2);
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(TopicName(s("old")))
                    .with_partitions(vec![p]),
            ]);
        let resp: ListOffsetsResponse = c.call(api::LIST_OFFSETS, 6, &req);
        resp.topics[0].partitions[0].offset
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut start = earliest(&mut c);
    while start < 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        start = earliest(&mut c);
    }
    // Every record is expired: the active segment goes too (rolled first, as Kafka's
    // retention does), and the log start reaches the log end.
    assert_eq!(
        start, 10,
        "retention advanced the log start offset to the log end"
    );
    assert!(broker.log_contains("retention deleted"));
}

/// Logs open on first use, so after a restart an untouched partition has no open log:
/// retention must still reach it (its old segments would otherwise stay forever).
#[test]
fn retention_reaches_partitions_not_opened_since_the_restart() {
    // No retention check during the first life: the old segments are still there at the
    // restart, and nothing opens the partition after it.
    let mut broker = Broker::start(2, &[("log.retention.check.interval.ms", "3600000")]);
    let mut c = broker.client();
    create_with_expired_segments(&mut c, "idle-old");
    drop(c);
    let dir = broker.data_dir.path().join("idle-old-0");
    let segments = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .expect("partition dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .count()
    };
    let before = segments(&dir);
    assert!(before > 1, "the produce rolled segments ({before})");
    broker.restart_with(&[("log.retention.check.interval.ms", "100")]);
    assert!(
        broker.wait_log("retention deleted", Duration::from_secs(30)),
        "retention ran on the partition nobody opened since the restart"
    );
    let after = segments(&dir);
    assert!(after < before, "segments {before} -> {after}");
    assert!(after >= 1, "the active segment is never deleted");
}

#[test]
fn a_second_broker_on_the_same_data_dir_is_refused() {
    let broker = Broker::start(1, &[]);
    let t0 = Instant::now();
    let mut second = Command::new(env!("CARGO_BIN_EXE_weir"));
    second
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "1",
            "--data-dir",
        ])
        .arg(broker.data_dir.path());
    let second = run_bounded(&mut second, CMD_TIMEOUT).expect("run");
    assert!(!second.ok(), "the second broker must not start");
    let stderr = &second.stderr;
    assert!(stderr.contains("in use by another weir"), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    // The first one is unaffected.
    let mut c = broker.client();
    let resp: ApiVersionsResponse = c.call(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    assert_eq!(resp.error_code, 0);
}
