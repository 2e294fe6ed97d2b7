//! The operator commands against a real 3-node cluster: `weir topics create|list|
//! describe|delete|alter` and `weir cluster status`, run as an operator runs them (the
//! `weir` binary, against any node), their output checked against Metadata.

use std::process::Command;
use std::time::{Duration, Instant};

use weir_tests::broker::weir_binary;
use weir_tests::cluster::Cluster;

/// Runs `weir ARGS...`; (exit success, stdout, stderr).
fn weir(args: &[&str]) -> (bool, String, String) {
    let bin = weir_binary().expect("weir binary");
    let out = Command::new(bin).args(args).output().expect("run weir");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
