//! Conformance with Kafka where client test suites (librdkafka's, kafka-python's) found
//! weir different: unknown config keys warned about at startup, topic configs Kafka 3.x
//! accepts, broker configs described and altered, and the replica admin APIs answered
//! truthfully for a single node.

mod common;

use std::time::Duration;

use common::Broker;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create(c: &mut common::Client, name: &str, partitions: i32, configs: &[(&str, &str)]) -> i16 {
    let topic = CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(1)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(s(k))
                        .with_value(Some(s(v)))
                })
                .collect(),
        );
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(5000);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 7, &req);
    resp.topics[0].error_code
}

/// A typo'd key and a Kafka key weir has no use for are each named in one warning line.
#[test]
fn unknown_and_ignored_config_keys_are_warned_about_by_name() {
    let broker = Broker::start(
        1,
        &[
            ("foo.bar", "1"),
            ("num.replica.fetchers", "2"),
            ("num.partitions", "2"),
        ],
    );
    let wait = Duration::from_secs(10);
    assert!(broker.wait_log("unknown config key foo.bar", wait));
    assert!(broker.wait_log(
        "config key num.replica.fetchers is a Kafka setting weir does not use",
        wait
    ));
    assert!(
        !broker.log_contains("num.partitions is"),
        "keys weir uses are not warned about"
    );
}

/// `message.format.version` (0092_mixed_msgver): Kafka 3.x accepts it and ignores it.
#[test]
fn message_format_version_is_accepted_as_a_topic_config() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    let code = create(&mut c, "msgver", 1, &[("message.format.version", "0.10.0")]);
    assert_eq!(code, 0, "CreateTopics with message.format.version");
    let res = alter_configs_request::AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s("msgver"))
        .with_configs(vec![
            alter_configs_request::AlterableConfig::default()
                .with_name(s("message.format.version"))
                .with_value(Some(s("2.8"))),
        ]);
    let resp: AlterConfigsResponse = c.call(
        api::ALTER_CONFIGS,
        2,
        &AlterConfigsRequest::default().with_resources(vec![res]),
    );
    assert_eq!(resp.responses[0].error_code, 0, "{resp:?}");
}

/// Produces one batch to `topic`/`partition` (acks=1); (error code, log_append_time_ms).
fn produce_one(c: &mut common::Client, topic: &str, partition: i32) -> (i16, i64) {
    let records = common::batch(&[b"one", b"two", b"three"], 1_700_000_000_000);
    let part = produce_request::PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(records));
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            produce_request::TopicProduceData::default()
                .with_name(TopicName(s(topic)))
                .with_partition_data(vec![part]),
        ]);
    let r: ProduceResponse = c.call(api::PRODUCE, 9, &produce);
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.log_append_time_ms)
}

/// DescribeLogDirs: the data dir, every partition with its size on disk, no lag.
#[test]
fn describe_log_dirs_reports_the_data_dir_and_partition_sizes() {
    // An ack waits for fdatasync, so the batch is in the file when DescribeLogDirs looks.
    let broker = Broker::start(2, &[("log.flush.on.ack", "true")]);
    let mut c = broker.client();
    assert_eq!(create(&mut c, "dirs", 2, &[]), 0);
    assert_eq!(produce_one(&mut c, "dirs", 1).0, 0);

    for version in [1, 4] {
        let resp: DescribeLogDirsResponse = c.call(
            api::DESCRIBE_LOG_DIRS,
            version,
            &DescribeLogDirsRequest::default().with_topics(None),
        );
        assert_eq!(resp.results.len(), 1, "one log dir");
        let dir = &resp.results[0];
        assert_eq!(dir.error_code, 0);
        let expected = std::fs::canonicalize(broker.data_dir.path()).expect("data dir");
        assert_eq!(dir.log_dir.as_str(), expected.display().to_string());
        let topic = dir
            .topics
            .iter()
            .find(|t| t.name.as_str() == "dirs")
            .expect("topic listed");
        let size = |p: i32| {
            topic
                .partitions
                .iter()
                .find(|x| x.partition_index == p)
                .map(|x| (x.partition_size, x.offset_lag))
        };
        assert_eq!(size(0), Some((0, 0)), "nothing written to partition 0");
        let (written, lag) = size(1).expect("partition 1");
        assert!(written > 0, "partition 1 holds the batch: {written}");
        assert_eq!(lag, 0);
        if version >= 4 {
            assert!(dir.total_bytes > 0 && dir.usable_bytes > 0, "{dir:?}");
        }
    }
}

/// ElectLeaders, reassignments and log-dir moves: truthful answers of a single node.
#[test]
fn replica_admin_apis_answer_for_a_single_node() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    assert_eq!(create(&mut c, "elect", 1, &[]), 0);

    let tp = elect_leaders_request::TopicPartitions::default()
        .with_topic(TopicName(s("elect")))
        .with_partitions(vec![0, 5]);
    let req = ElectLeadersRequest::default()
        .with_election_type(0)
        .with_topic_partitions(Some(vec![tp]))
        .with_timeout_ms(5000);
    let r: ElectLeadersResponse = c.call(api::ELECT_LEADERS, 2, &req);
    let codes: Vec<i16> = r.replica_election_results[0]
        .partition_result
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(
        codes,
        vec![84, 3],
        "ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION"
    );

    let reassign = |replicas: Option<Vec<i32>>| {
        let p = alter_partition_reassignments_request::ReassignablePartition::default()
            .with_partition_index(0)
            .with_replicas(replicas.map(|r| r.into_iter().map(BrokerId).collect()));
        AlterPartitionReassignmentsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![
                alter_partition_reassignments_request::ReassignableTopic::default()
                    .with_name(TopicName(s("elect")))
                    .with_partitions(vec![p]),
            ])
    };
    let mut code = |replicas| {
        let r: AlterPartitionReassignmentsResponse =
            c.call(api::ALTER_PARTITION_REASSIGNMENTS, 0, &reassign(replicas));
        r.responses[0].partitions[0].error_code
    };
    assert_eq!(code(Some(vec![0])), 0, "already on node 0");
    assert_eq!(code(Some(vec![1])), 39, "INVALID_REPLICA_ASSIGNMENT");
    assert_eq!(code(None), 85, "NO_REASSIGNMENT_IN_PROGRESS");

    let r: ListPartitionReassignmentsResponse = c.call(
        api::LIST_PARTITION_REASSIGNMENTS,
        0,
        &ListPartitionReassignmentsRequest::default().with_timeout_ms(5000),
    );
    assert_eq!((r.error_code, r.topics.len()), (0, 0));

    let dir = std::fs::canonicalize(broker.data_dir.path()).expect("data dir");
    let move_to = |path: &str| {
        AlterReplicaLogDirsRequest::default().with_dirs(vec![
            alter_replica_log_dirs_request::AlterReplicaLogDir::default()
                .with_path(s(path))
                .with_topics(vec![
                    alter_replica_log_dirs_request::AlterReplicaLogDirTopic::default()
                        .with_name(TopicName(s("elect")))
                        .with_partitions(vec![0]),
                ]),
        ])
    };
    let r: AlterReplicaLogDirsResponse = c.call(
        api::ALTER_REPLICA_LOG_DIRS,
        2,
        &move_to(&dir.display().to_string()),
    );
    assert_eq!(r.results[0].partitions[0].error_code, 0);
    let r: AlterReplicaLogDirsResponse =
        c.call(api::ALTER_REPLICA_LOG_DIRS, 1, &move_to("/nonexistent/dir"));
    assert_eq!(
        r.results[0].partitions[0].error_code, 57,
        "LOG_DIR_NOT_FOUND"
    );
}

/// (name, value, read_only, source) of every config DescribeConfigs gives for a resource.
fn describe(
    c: &mut common::Client,
    kind: i8,
    name: &str,
) -> Vec<(String, Option<String>, bool, i8)> {
    let res = describe_configs_request::DescribeConfigsResource::default()
        .with_resource_type(kind)
        .with_resource_name(s(name));
    let resp: DescribeConfigsResponse = c.call(
        api::DESCRIBE_CONFIGS,
        4,
        &DescribeConfigsRequest::default().with_resources(vec![res]),
    );
    assert_eq!(resp.results[0].error_code, 0, "{resp:?}");
    resp.results[0]
        .configs
        .iter()
        .map(|e| {
            (
                e.name.to_string(),
                e.value.as_ref().map(|v| v.to_string()),
                e.read_only,
                e.config_source,
            )
        })
        .collect()
}

fn find<'a>(
    entries: &'a [(String, Option<String>, bool, i8)],
    key: &str,
) -> &'a (String, Option<String>, bool, i8) {
    entries
        .iter()
        .find(|e| e.0 == key)
        .unwrap_or_else(|| panic!("{key} not described"))
}

/// IncrementalAlterConfigs on the BROKER resource; the resource's (code, message).
fn alter_broker(c: &mut common::Client, ops: &[(&str, i8, &str)]) -> (i16, String) {
    let configs = ops
        .iter()
        .map(|(k, op, v)| {
            incremental_alter_configs_request::AlterableConfig::default()
                .with_name(s(k))
                .with_config_operation(*op)
                .with_value(Some(s(v)))
        })
        .collect();
    let res = incremental_alter_configs_request::AlterConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(s("0"))
        .with_configs(configs);
    let resp: IncrementalAlterConfigsResponse = c.call(
        api::INCREMENTAL_ALTER_CONFIGS,
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![res]),
    );
    let r = &resp.responses[0];
    let msg = r.error_message.as_ref().map(|m| m.to_string());
    (r.error_code, msg.unwrap_or_default())
}

/// DescribeConfigs lists every broker key with its source; the dynamic topic defaults
/// change at runtime and persist; keys weir reads only at startup are refused (0081,
/// kafka-python's broker-configs tests).
#[test]
fn broker_configs_are_described_and_dynamic_ones_altered() {
    let mut broker = Broker::start(1, &[("num.partitions", "3")]);
    let mut c = broker.client();
    let all = describe(&mut c, 4, "0");
    assert!(all.len() > 40, "{} broker keys", all.len());
    let adv = find(&all, "advertised.listeners");
    assert!(
        adv.1
            .as_deref()
            .is_some_and(|v| v.starts_with("PLAINTEXT://127.0.0.1:"))
    );
    assert_eq!((adv.2, adv.3), (true, 4), "read-only, static");
    assert_eq!(find(&all, "num.partitions").1.as_deref(), Some("3"));
    assert_eq!(find(&all, "num.partitions").3, 4, "set with --set: static");
    assert!(!find(&all, "log.retention.ms").2, "dynamic");
    assert_eq!(find(&all, "group.max.size").3, 5, "default");
    // The transaction coordinator's keys show the values it runs with (7 days, 15 min).
    let expiry = find(&all, "transactional.id.expiration.ms");
    assert_eq!((expiry.1.as_deref(), expiry.3), (Some("604800000"), 5));
    let max_timeout = find(&all, "transaction.max.timeout.ms");
    assert_eq!(max_timeout.1.as_deref(), Some("900000"));
    assert!(find(&all, "log.dirs").1.is_some());
    let threads = find(&all, "background.threads");
    assert_eq!(
        (threads.1.as_deref(), threads.2),
        (None, false),
        "Kafka-dynamic, unused"
    );

    // librdkafka 0081's own broker alterations.
    let set_append = [
        ("background.threads", 0, "9"),
        ("log.cleanup.policy", 2, "compact"),
    ];
    assert_eq!(alter_broker(&mut c, &set_append).0, 0);
    let all = describe(&mut c, 4, "0");
    let policy = find(&all, "log.cleanup.policy");
    assert_eq!(policy.1.as_deref(), Some("delete,compact"));
    assert_eq!(policy.3, 2, "DYNAMIC_BROKER_CONFIG");
    assert_eq!(find(&all, "background.threads").1.as_deref(), Some("9"));
    let del_sub = [
        ("background.threads", 1, ""),
        ("log.cleanup.policy", 3, "compact"),
    ];
    assert_eq!(alter_broker(&mut c, &del_sub).0, 0);
    let all = describe(&mut c, 4, "0");
    assert_eq!(
        find(&all, "log.cleanup.policy").1.as_deref(),
        Some("delete")
    );
    assert_eq!(find(&all, "background.threads").1, None, "deleted");
    let alter = alter_configs_request::AlterConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(s("0"))
        .with_configs(vec![
            alter_configs_request::AlterableConfig::default()
                .with_name(s("sasl.kerberos.min.time.before.relogin"))
                .with_value(Some(s("58000"))),
        ]);
    let r: AlterConfigsResponse = c.call(
        api::ALTER_CONFIGS,
        2,
        &AlterConfigsRequest::default().with_resources(vec![alter]),
    );
    assert_eq!(r.responses[0].error_code, 0, "{r:?}");

    // Refused, with a reason.
    let (code, msg) = alter_broker(&mut c, &[("num.partitions", 0, "8")]);
    assert_eq!(code, 40, "INVALID_CONFIG");
    assert!(msg.contains("cannot be changed while weir runs"), "{msg}");
    assert_eq!(alter_broker(&mut c, &[("foo.bar", 0, "1")]).0, 40);
    assert_eq!(
        alter_broker(&mut c, &[("log.retention.ms", 0, "soon")]).0,
        40
    );

    // A dynamic default reaches partitions already open: the next append is stamped.
    assert_eq!(create(&mut c, "stamped", 1, &[]), 0);
    assert_eq!(produce_one(&mut c, "stamped", 0), (0, -1), "CreateTime");
    let log_append = [("log.message.timestamp.type", 0, "LogAppendTime")];
    assert_eq!(alter_broker(&mut c, &log_append).0, 0);
    let (code, stamp) = produce_one(&mut c, "stamped", 0);
    assert_eq!(code, 0);
    assert!(stamp > 1_700_000_000_000, "LogAppendTime at once: {stamp}");
    assert_eq!(
        alter_broker(&mut c, &[("log.message.timestamp.type", 1, "")]).0,
        0
    );

    // A dynamic topic default reaches topics without their own override, and persists.
    assert_eq!(create(&mut c, "plain", 1, &[]), 0);
    assert_eq!(
        alter_broker(&mut c, &[("log.retention.ms", 0, "123456")]).0,
        0
    );
    let topic = describe(&mut c, 2, "plain");
    let retention = find(&topic, "retention.ms");
    assert_eq!(retention.1.as_deref(), Some("123456"));
    assert_eq!(retention.3, 3, "DYNAMIC_DEFAULT_BROKER_CONFIG");
    broker.restart();
    let mut c = broker.client();
    let all = describe(&mut c, 4, "0");
    let retention = find(&all, "log.retention.ms");
    assert_eq!((retention.1.as_deref(), retention.3), (Some("123456"), 2));
    let topic = describe(&mut c, 2, "plain");
    assert_eq!(find(&topic, "retention.ms").1.as_deref(), Some("123456"));
}
