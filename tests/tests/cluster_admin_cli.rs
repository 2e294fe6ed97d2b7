//! The operator commands against a real 3-node cluster: `weir topics create|list|
//! describe|delete|alter` and `weir cluster status`, run as an operator runs them (the
//! `weir` binary, against any node), their output checked against Metadata.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use weir_tests::broker::weir_binary;
use weir_tests::cluster::Cluster;
use weir_tests::process::run_bounded;

/// How long one `weir` command may run.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `weir ARGS...`; (exit success, stdout, stderr).
fn weir(args: &[&str]) -> (bool, String, String) {
    let bin = weir_binary().expect("weir binary");
    let out = run_bounded(Command::new(bin).args(args), CLI_TIMEOUT).expect("run weir");
    (out.ok(), out.stdout, out.stderr)
}

/// `weir topics ARGS... --bootstrap-server ADDR` must succeed; its stdout.
fn topics_ok(addr: &str, args: &[&str]) -> String {
    let mut all = vec!["topics", "--bootstrap-server", addr];
    all.extend_from_slice(args);
    let (ok, out, err) = weir(&all);
    assert!(ok, "weir {all:?} failed:\nstdout: {out}\nstderr: {err}");
    out
}

/// The partition lines of `describe` output: (partition, leader, replicas, isr).
fn partition_rows(describe: &str) -> Vec<(i32, String, Vec<i32>, Vec<i32>)> {
    let ids = |s: &str| -> Vec<i32> { s.split(',').filter_map(|x| x.parse().ok()).collect() };
    describe
        .lines()
        .filter(|l| l.starts_with('\t'))
        .filter_map(|l| {
            let field = |name: &str| {
                l.split('\t')
                    .find_map(|f| f.strip_prefix(name).map(str::to_string))
            };
            Some((
                field("Partition: ")?.parse().ok()?,
                field("Leader: ")?,
                ids(&field("Replicas: ")?),
                ids(&field("Isr: ")?),
            ))
        })
        .collect()
}

/// `describe` of `topic` through `addr` until `check` accepts its rows (bounded: the
/// other nodes learn the image a moment after the controller commits it).
fn describe_until(
    addr: &str,
    topic: &str,
    check: impl Fn(&str, &[(i32, String, Vec<i32>, Vec<i32>)]) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let args = ["topics", "--bootstrap-server", addr, "describe", topic];
        let (ok, out, err) = weir(&args);
        // A node that has not yet applied the controller's record does not know the topic
        // yet: that is the lag this loop waits out. Any other failure is a failure.
        let lagging = !ok && err.contains("UnknownTopicOrPartition");
        assert!(
            ok || lagging,
            "weir {args:?} failed:\nstdout: {out}\nstderr: {err}"
        );
        if ok && check(&out, &partition_rows(&out)) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "describe never matched; last:\n{out}{err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// AlterPartitionReassignments v0 of one partition to `replicas`, through `addr`: the
/// partition's error code.
fn reassign(addr: &str, topic: &str, partition: i32, replicas: &[i32]) -> i16 {
    use kafka_protocol::messages::alter_partition_reassignments_request::{
        ReassignablePartition, ReassignableTopic,
    };
    use kafka_protocol::messages::{
        AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, ApiKey, BrokerId,
        TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    let addr = addr.parse().expect("a node's address");
    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = AlterPartitionReassignmentsRequest::default().with_topics(vec![
        ReassignableTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![
                ReassignablePartition::default()
                    .with_partition_index(partition)
                    .with_replicas(Some(replicas.iter().map(|r| BrokerId(*r)).collect())),
            ]),
    ]);
    let resp: AlterPartitionReassignmentsResponse = conn
        .call(ApiKey::AlterPartitionReassignments, 0, &req)
        .expect("AlterPartitionReassignments");
    resp.responses[0].partitions[0].error_code
}

/// The partitions of `topic` that DescribeLogDirs v1 through `addr` lists.
fn log_dir_partitions(addr: &str, topic: &str) -> Vec<i32> {
    use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
    use kafka_protocol::messages::{
        ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    let addr = addr.parse().expect("a node's address");
    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = DescribeLogDirsRequest::default().with_topics(Some(vec![
        DescribableLogDirTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![0, 1]),
    ]));
    let resp: DescribeLogDirsResponse = conn
        .call(ApiKey::DescribeLogDirs, 1, &req)
        .expect("DescribeLogDirs");
    resp.results
        .iter()
        .flat_map(|r| r.topics.iter())
        .flat_map(|t| t.partitions.iter().map(|p| p.partition_index))
        .collect()
}

#[test]
fn topics_and_cluster_commands_manage_a_three_node_cluster() {
    let mut c = Cluster::start(3, &[]).expect("cluster");
    c.wait_agreed(3, Duration::from_secs(60), |_| true)
        .expect("agreed");
    let node2 = c.node(2).bootstrap();
    let node3 = c.node(3).bootstrap();

    // Created through one node, described through another.
    let out = topics_ok(
        &node2,
        &[
            "create",
            "orders",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--config",
            "retention.ms=3600000",
        ],
    );
    assert!(out.contains("Created topic orders."), "{out}");
    let described = describe_until(&node3, "orders", |_, rows| {
        rows.len() == 3 && rows.iter().all(|r| r.3.len() == 3)
    });
    assert!(
        described.contains(
            "Topic: orders\tPartitionCount: 3\tReplicationFactor: 3\tConfigs: retention.ms=3600000"
        ),
        "{described}"
    );
    let rows = partition_rows(&described);
    for (i, (partition, leader, replicas, isr)) in rows.iter().enumerate() {
        assert_eq!(*partition, i as i32);
        let mut sorted = replicas.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 2, 3], "{described}");
        let leader: i32 = leader.parse().expect("a leader");
        assert!(isr.contains(&leader), "{described}");
    }
    // Leaders spread: 3 partitions over 3 nodes land on more than one leader.
    let mut leaders: Vec<&String> = rows.iter().map(|r| &r.1).collect();
    leaders.dedup();
    assert!(leaders.len() > 1, "leaders not spread:\n{described}");

    // Explicit placement is honoured.
    topics_ok(
        &node3,
        &["create", "placed", "--replica-assignment", "3:1,1:2"],
    );
    let placed = describe_until(&node2, "placed", |_, rows| rows.len() == 2);
    let rows = partition_rows(&placed);
    assert_eq!(rows[0].2, vec![3, 1], "{placed}");
    assert_eq!(rows[1].2, vec![1, 2], "{placed}");
    // A reassignment to the replicas a partition has is nothing to do; any other is
    // refused (weir does not move replicas yet), never answered as if done.
    assert_eq!(reassign(&node2, "placed", 0, &[3, 1]), 0);
    assert_eq!(
        reassign(&node2, "placed", 1, &[2]),
        39,
        "INVALID_REPLICA_ASSIGNMENT"
    );
    // DescribeLogDirs lists the replicas the answering node holds, not every partition.
    assert_eq!(log_dir_partitions(&node2, "placed"), vec![1]);
    assert_eq!(log_dir_partitions(&node3, "placed"), vec![0]);

    // Alter: partitions, one config set, one removed.
    topics_ok(
        &node2,
        &[
            "alter",
            "orders",
            "--partitions",
            "4",
            "--config",
            "cleanup.policy=compact",
            "--delete-config",
            "retention.ms",
        ],
    );
    describe_until(&node3, "orders", |out, rows| {
        rows.len() == 4 && out.contains("Configs: cleanup.policy=compact\n")
    });

    // List, without and with internal topics.
    let listed = topics_ok(&node3, &["list"]);
    assert_eq!(listed.lines().collect::<Vec<_>>(), vec!["orders", "placed"]);

    // Errors are the Kafka error, and the exit status says so.
    let (ok, _, err) = weir(&[
        "topics",
        "--bootstrap-server",
        &node2,
        "create",
        "too-wide",
        "--partitions",
        "1",
        "--replication-factor",
        "4",
    ]);
    assert!(!ok, "replication factor 4 on 3 nodes was accepted");
    assert!(err.contains("InvalidReplicationFactor"), "{err}");
    let (ok, _, err) = weir(&["topics", "--bootstrap-server", &node2, "describe", "nope"]);
    assert!(!ok && err.contains("UnknownTopicOrPartition"), "{err}");

    // Cluster status: every node, the controller, nothing under-replicated once the ISRs
    // are full.
    let controller = c.controller(Duration::from_secs(30)).expect("controller");
    let (ok, status, err) = weir(&["cluster", "--bootstrap-server", &node3, "status"]);
    assert!(ok, "{err}");
    assert!(
        status.contains(&format!("controller {controller}\n")),
        "{status}"
    );
    for id in 1..=3 {
        assert!(
            status.lines().any(|l| l.starts_with(&format!("{id} "))),
            "node {id} missing:\n{status}"
        );
    }
    assert!(status.contains("offline partitions: 0"), "{status}");

    // Delete through a third node; gone everywhere.
    let node1 = c.node(1).bootstrap();
    let out = topics_ok(&node1, &["delete", "orders", "placed"]);
    assert!(out.contains("Deleted topic orders.") && out.contains("Deleted topic placed."));
    let deadline = Instant::now() + Duration::from_secs(30);
    for addr in [&node1, &node2, &node3] {
        loop {
            if topics_ok(addr, &["list"]).trim().is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "topics still listed on {addr}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// IncrementalAlterConfigs SET of broker `name` ("" the cluster default) through `addr`.
fn set_broker_config(addr: SocketAddr, name: &str, key: &str, value: &str) -> i16 {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::{
        ApiKey, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    };
    use kafka_protocol::protocol::StrBytes;
    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(StrBytes::from_string(key.to_string()))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_string(value.to_string()))),
            ]),
    ]);
    let resp: IncrementalAlterConfigsResponse = conn
        .call(ApiKey::IncrementalAlterConfigs, 1, &req)
        .expect("IncrementalAlterConfigs");
    resp.responses[0].error_code
}

/// (value, source) of `key` in DescribeConfigs of resource (`resource_type`, `name`)
/// through `addr`.
fn described(addr: SocketAddr, resource_type: i8, name: &str, key: &str) -> Option<(String, i8)> {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};
    use kafka_protocol::protocol::StrBytes;
    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configuration_keys(Some(vec![StrBytes::from_string(key.to_string())])),
    ]);
    let resp: DescribeConfigsResponse = conn
        .call(ApiKey::DescribeConfigs, 1, &req)
        .expect("DescribeConfigs");
    let r = &resp.results[0];
    assert_eq!(
        r.error_code, 0,
        "DescribeConfigs {name}: {:?}",
        r.error_message
    );
    r.configs
        .iter()
        .find(|c| c.name.as_str() == key)
        .and_then(|c| Some((c.value.as_ref()?.to_string(), c.config_source)))
}

/// Polls `described` until it is `want` (nodes apply the controller's record a moment
/// after it commits); bounded.
fn describe_config_until(
    addr: SocketAddr,
    resource_type: i8,
    name: &str,
    key: &str,
    want: (&str, i8),
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = described(addr, resource_type, name, key);
        if got
            .as_ref()
            .is_some_and(|(v, s)| v == want.0 && *s == want.1)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} of {name} through {addr}: {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kafka's DescribeConfigs sources and resource types.
const DYNAMIC_BROKER: i8 = 2;
const DYNAMIC_DEFAULT_BROKER: i8 = 3;
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

#[test]
fn a_cluster_wide_broker_default_set_through_one_node_reaches_every_node() {
    let mut c = Cluster::start(3, &[]).expect("cluster");
    c.wait_agreed(3, Duration::from_secs(60), |_| true)
        .expect("agreed");
    let addrs: Vec<SocketAddr> = (1..=3).map(|id| c.node(id).addr()).collect();
    let node2 = c.node(2).bootstrap();
    topics_ok(
        &node2,
        &[
            "create",
            "kept",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
        ],
    );

    // `kafka-configs --entity-default`: through node 1, for all.
    assert_eq!(
        set_broker_config(addrs[0], "", "log.retention.ms", "123456789"),
        0
    );
    // Node 3's own value, through node 3, wins there only.
    assert_eq!(
        set_broker_config(addrs[2], "3", "log.retention.ms", "987654321"),
        0
    );
    for (i, addr) in addrs.iter().enumerate() {
        let id = (i + 1).to_string();
        let want = if id == "3" {
            ("987654321", DYNAMIC_BROKER)
        } else {
            ("123456789", DYNAMIC_DEFAULT_BROKER)
        };
        describe_config_until(*addr, RESOURCE_BROKER, &id, "log.retention.ms", want);
        // A topic without its own retention follows the node's broker default.
        describe_config_until(*addr, RESOURCE_TOPIC, "kept", "retention.ms", want);
    }
    // A node's own set is refused through another node (Kafka's clients send it to that
    // node).
    assert_ne!(set_broker_config(addrs[0], "2", "log.retention.ms", "1"), 0);

    // Kept across a restart: it is in the quorum's log, not in the node's data dir.
    c.node(2).kill().expect("kill node 2");
    c.node(2).restart().expect("restart node 2");
    let addr2 = c.node(2).addr();
    describe_config_until(
        addr2,
        RESOURCE_BROKER,
        "2",
        "log.retention.ms",
        ("123456789", DYNAMIC_DEFAULT_BROKER),
    );
}

/// OffsetCommit (generation -1, as an admin's) of offset `at` for partitions `0..n` of
/// `topic` in `group`, sent to the group's coordinator found through `addr`.
fn commit_offsets(addr: SocketAddr, group: &str, topic: &str, n: i32, at: i64) {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        ApiKey, FindCoordinatorRequest, FindCoordinatorResponse, GroupId, OffsetCommitRequest,
        OffsetCommitResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    let deadline = Instant::now() + Duration::from_secs(30);
    let coordinator = loop {
        let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
        let req = FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.into()));
        let resp: FindCoordinatorResponse = conn
            .call(ApiKey::FindCoordinator, 2, &req)
            .expect("FindCoordinator");
        if resp.error_code == 0 {
            break format!("{}:{}", resp.host.as_str(), resp.port);
        }
        assert!(
            Instant::now() < deadline,
            "no coordinator: {}",
            resp.error_code
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let partitions = (0..n)
        .map(|p| {
            OffsetCommitRequestPartition::default()
                .with_partition_index(p)
                .with_committed_offset(at)
        })
        .collect();
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.into())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.into())))
                .with_partitions(partitions),
        ]);
    let mut conn =
        weir_tests::raw::RawConn::connect(coordinator.parse().expect("addr")).expect("connect");
    let resp: OffsetCommitResponse = conn
        .call(ApiKey::OffsetCommit, 2, &req)
        .expect("OffsetCommit");
    for p in &resp.topics[0].partitions {
        assert_eq!(
            p.error_code, 0,
            "OffsetCommit of {topic}-{}",
            p.partition_index
        );
    }
}

/// `weir groups` works through any node of a cluster, as kafka-consumer-groups.sh does:
/// the group's requests go to its coordinator, log ends to each partition's leader, and
/// `list` asks every node (before, only the coordinator itself could describe a group,
/// and `list` showed only the bootstrap node's groups).
#[test]
fn groups_are_listed_and_described_through_any_node() {
    let mut c = Cluster::start(3, &[("offsets.topic.replication.factor", "3")]).expect("cluster");
    c.wait_agreed(3, Duration::from_secs(60), |_| true)
        .expect("agreed");
    let via = c.node(1).bootstrap();
    topics_ok(
        &via,
        &[
            "create",
            "gt",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
        ],
    );
    let addr1 = c.node(1).addr();
    commit_offsets(addr1, "audit", "gt", 3, 0);
    for id in 1..=3 {
        let node = c.node(id).bootstrap();
        let (ok, out, err) = weir(&["groups", "--bootstrap-server", &node, "list"]);
        assert!(
            ok && out.contains("audit"),
            "list via node {id}:\n{out}{err}"
        );
        let (ok, out, err) = weir(&["groups", "--bootstrap-server", &node, "describe", "audit"]);
        assert!(ok, "describe via node {id}:\n{out}{err}");
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("gt ")).collect();
        assert_eq!(rows.len(), 3, "describe via node {id}:\n{out}");
        // Every partition's log end came from its leader (0 here: empty), never "-".
        assert!(
            rows.iter()
                .all(|r| r.split_whitespace().nth(3) == Some("0")),
            "describe via node {id}:\n{out}"
        );
    }
}
