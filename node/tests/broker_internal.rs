//! Internal topics and the group coordinator's own log, against a real `weir serve`:
//! clients cannot write, delete records of, create or re-configure `__consumer_offsets`
//! (committed offsets survive the attempts and a restart); a commit too large for one
//! batch is refused whole; topic names that differ only by `.` and `_` collide, as in
//! Kafka. (Compaction of `__consumer_offsets`: `offsets_compaction.rs`.)

mod common;

use common::requests::{
    EARLIEST, commit_offsets, create_topics, fetch_offsets, find_coordinator, list_offset, s,
};
use common::{Broker, Client};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use wire::api;
use wire::batch::{BatchBuilder, NewRecord};

const OFFSETS: &str = "__consumer_offsets";
const TXN_STATE: &str = "__transaction_state";
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
const TOPIC_ALREADY_EXISTS: i16 = 36;
const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;

fn metadata(c: &mut Client, name: &str, allow_create: bool) -> MetadataResponseTopic {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(s(name)))),
        ]))
        .with_allow_auto_topic_creation(allow_create);
    let resp: MetadataResponse = c.call(api::METADATA, 12, &req);
    resp.topics.into_iter().next().expect("one topic")
}

/// Produce (acks=1) of one batch to every partition in `partitions` of `topic`.
fn produce_to(c: &mut Client, topic: &str, partitions: i32, batch: &bytes::Bytes) -> Vec<i16> {
    let data = (0..partitions)
        .map(|p| {
            PartitionProduceData::default()
                .with_index(p)
                .with_records(Some(batch.clone()))
        })
        .collect();
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s(topic)))
                .with_partition_data(data),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    resp.responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
        .collect()
}

fn delete_records(c: &mut Client, topic: &str, partitions: i32) -> Vec<i16> {
    let ps = (0..partitions)
        .map(|p| {
            DeleteRecordsPartition::default()
                .with_partition_index(p)
                .with_offset(-1)
        })
        .collect();
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(ps),
        ]);
    let resp: DeleteRecordsResponse = c.call(api::DELETE_RECORDS, 2, &req);
    resp.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect()
}

/// AlterConfigs (the whole override set) of a topic; its error code.
fn alter(c: &mut Client, topic: &str, configs: &[(&str, &str)]) -> i16 {
    use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let res = AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s(topic))
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    AlterableConfig::default()
                        .with_name(s(k))
                        .with_value(Some(s(v)))
                })
                .collect(),
        );
    let req = AlterConfigsRequest::default().with_resources(vec![res]);
    let resp: AlterConfigsResponse = c.call(api::ALTER_CONFIGS, 2, &req);
    resp.responses[0].error_code
}

/// IncrementalAlterConfigs of one key (op 0 SET, 1 DELETE); its error code.
fn alter_one(c: &mut Client, topic: &str, key: &str, op: i8, value: Option<&str>) -> i16 {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let res = AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s(topic))
        .with_configs(vec![
            AlterableConfig::default()
                .with_name(s(key))
                .with_config_operation(op)
                .with_value(value.map(s)),
        ]);
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![res]);
    let resp: IncrementalAlterConfigsResponse = c.call(api::INCREMENTAL_ALTER_CONFIGS, 1, &req);
    resp.responses[0].error_code
}

/// The value of `key` as DescribeConfigs reports it for `topic`.
fn config_value(c: &mut Client, topic: &str, key: &str) -> String {
    let res = DescribeConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s(topic));
    let req = DescribeConfigsRequest::default().with_resources(vec![res]);
    let resp: DescribeConfigsResponse = c.call(api::DESCRIBE_CONFIGS, 4, &req);
    let entry = resp.results[0]
        .configs
        .iter()
        .find(|e| e.name.as_str() == key);
    let value = entry.and_then(|e| e.value.as_ref()).expect("described");
    value.to_string()
}

/// A client's attempts to write, truncate, pre-create and re-configure internal topics
/// are refused with Kafka's codes; the committed offsets survive them and a restart.
#[test]
fn internal_topics_refuse_client_writes_deletes_creates_and_config_changes() {
    let mut broker = Broker::start(2, &[("offsets.topic.num.partitions", "4")]);
    let mut c = broker.client();
    assert_eq!(
        create_topics(&mut c, &[(OFFSETS, 4), (TXN_STATE, 1)]),
        vec![INVALID_REQUEST, INVALID_REQUEST],
        "only the broker creates internal topics"
    );
    let txn = metadata(&mut c, TXN_STATE, true);
    assert_eq!(
        txn.error_code, UNKNOWN_TOPIC_OR_PARTITION,
        "not auto-created"
    );
    let offsets = metadata(&mut c, OFFSETS, false);
    assert_eq!(
        offsets.error_code, UNKNOWN_TOPIC_OR_PARTITION,
        "nothing created yet"
    );

    assert_eq!(create_topics(&mut c, &[("data", 2)]), vec![0]);
    find_coordinator(&mut c, "g");
    assert_eq!(
        commit_offsets(&mut c, "g", "data", &[(0, 5, "a"), (1, 7, "b")]),
        vec![0, 0]
    );
    assert_eq!(
        create_topics(&mut c, &[(OFFSETS, 4)]),
        vec![TOPIC_ALREADY_EXISTS]
    );
    let md = metadata(&mut c, OFFSETS, true);
    assert!(md.is_internal, "reported internal");
    assert_eq!(md.partitions.len(), 4);

    // A forged commit record for g/data/0 at offset 999, to every partition.
    let forged = weir::group::schema::OffsetValue {
        offset: wire::Offset(999),
        leader_epoch: wire::LeaderEpoch::NONE,
        metadata: "forged".into(),
        commit_timestamp_ms: 1,
        appended_at: wire::Offset::NONE,
    };
    let batch = BatchBuilder {
        records: vec![NewRecord {
            timestamp_ms: 1,
            key: Some(weir::group::schema::offset_key("g", "data", 0)),
            value: Some(weir::group::schema::offset_value(&forged)),
            headers: Vec::new(),
        }],
        ..BatchBuilder::default()
    }
    .build()
    .expect("batch");
    assert_eq!(
        produce_to(&mut c, OFFSETS, 4, &batch),
        vec![INVALID_TOPIC_EXCEPTION; 4]
    );
    assert_eq!(
        produce_to(&mut c, TXN_STATE, 1, &batch),
        vec![INVALID_TOPIC_EXCEPTION]
    );
    assert_eq!(
        delete_records(&mut c, OFFSETS, 4),
        vec![INVALID_TOPIC_EXCEPTION; 4]
    );
    assert_eq!(
        list_offset(&mut c, OFFSETS, 0, EARLIEST),
        0,
        "nothing deleted"
    );

    assert_eq!(
        alter(&mut c, OFFSETS, &[("retention.ms", "1")]),
        INVALID_CONFIG
    );
    assert_eq!(
        alter_one(&mut c, OFFSETS, "retention.ms", 0, Some("1")),
        INVALID_CONFIG
    );
    assert_eq!(
        alter_one(&mut c, OFFSETS, "retention.bytes", 0, Some("10")),
        INVALID_CONFIG
    );
    assert_eq!(
        alter_one(&mut c, OFFSETS, "retention.ms", 1, None),
        INVALID_CONFIG,
        "DELETE"
    );
    let policy = alter_one(&mut c, OFFSETS, "cleanup.policy", 0, Some("delete"));
    assert_eq!(policy, INVALID_CONFIG);
    let allowed = alter_one(&mut c, OFFSETS, "segment.bytes", 0, Some("2097152"));
    assert_eq!(allowed, 0, "changes that keep offsets are allowed");
    assert_eq!(config_value(&mut c, OFFSETS, "retention.ms"), "-1");
    assert_eq!(config_value(&mut c, OFFSETS, "cleanup.policy"), "compact");
    assert_eq!(config_value(&mut c, OFFSETS, "segment.bytes"), "2097152");

    drop(c);
    broker.restart();
    let mut c = broker.client();
    let got = fetch_offsets(&mut c, "g", "data", &[0, 1]);
    assert_eq!(
        got,
        vec![(5, "a".to_string()), (7, "b".to_string())],
        "intact"
    );
    assert_eq!(config_value(&mut c, OFFSETS, "retention.ms"), "-1");
}

/// A commit whose records do not fit one batch (`max.message.bytes`) is refused whole
/// with INVALID_COMMIT_OFFSET_SIZE: none of it is visible, before or after a restart.
/// (The old code wrote it in 500-record batches: the first was kept after the second was
/// refused, and loaded after a restart.)
#[test]
fn a_commit_too_large_for_one_batch_is_refused_whole() {
    let sets = [
        ("offsets.topic.num.partitions", "1"),
        ("message.max.bytes", "65536"),
    ];
    let mut broker = Broker::start(1, &sets);
    let mut c = broker.client();
    const COUNT: i32 = 520;
    assert_eq!(create_topics(&mut c, &[("big", COUNT)]), vec![0]);
    find_coordinator(&mut c, "g");
    let long = "m".repeat(4000);
    // 500 small records, then 20 x 4 KB: ~100 KB in all, over the 64 KiB batch limit.
    let offsets: Vec<(i32, i64, &str)> = (0..COUNT)
        .map(|p| {
            (
                p,
                10 + i64::from(p),
                if p < 500 { "" } else { long.as_str() },
            )
        })
        .collect();
    let codes = commit_offsets(&mut c, "g", "big", &offsets);
    assert_eq!(codes, vec![INVALID_COMMIT_OFFSET_SIZE; COUNT as usize]);
    let all: Vec<i32> = (0..COUNT).collect();
    let none = |got: &[(i64, String)]| got.iter().all(|(o, _)| *o == -1);
    assert!(
        none(&fetch_offsets(&mut c, "g", "big", &all)),
        "nothing applied"
    );
    // A commit that fits is still accepted.
    assert_eq!(commit_offsets(&mut c, "g", "big", &[(0, 3, "ok")]), vec![0]);
    drop(c);
    broker.restart();
    let mut c = broker.client();
    let got = fetch_offsets(&mut c, "g", "big", &all);
    assert_eq!(got[0], (3, "ok".to_string()));
    assert!(none(&got[1..]), "nothing of the refused commit was stored");
}

/// Kafka refuses a topic whose name differs from an existing one only by `.` and `_`
/// (INVALID_TOPIC_EXCEPTION), also inside one request and on auto-creation.
#[test]
fn topic_names_differing_only_by_dot_and_underscore_collide() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("t.1", 1)]), vec![0]);
    assert_eq!(
        create_topics(&mut c, &[("t_1", 1)]),
        vec![INVALID_TOPIC_EXCEPTION]
    );
    assert_eq!(
        create_topics(&mut c, &[("t.1", 1)]),
        vec![TOPIC_ALREADY_EXISTS]
    );
    assert_eq!(
        create_topics(&mut c, &[("a.b_c", 1), ("a_b.c", 1), ("a-b-c", 1)]),
        vec![0, INVALID_TOPIC_EXCEPTION, 0],
        "the second of a colliding pair in one request; '-' does not collide"
    );
    let auto = metadata(&mut c, "t_1", true);
    assert_eq!(
        auto.error_code, INVALID_TOPIC_EXCEPTION,
        "auto-create collides too"
    );
    assert_eq!(metadata(&mut c, "t.1", true).error_code, 0);
    let fresh = metadata(&mut c, "fresh_1", true);
    assert_eq!(fresh.error_code, 0, "auto-create of a free name works");
    assert_eq!(
        metadata(&mut c, "fresh.1", true).error_code,
        INVALID_TOPIC_EXCEPTION
    );
}

const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const REBALANCE_IN_PROGRESS: i16 = 27;

/// JoinGroup v3 (one step, no KIP-394 id) of `member` ("" = new) into `group`; the
/// answer's (error, member id, generation).
fn join_group(c: &mut Client, group: &str, member: &str) -> (i16, String, i32) {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    let req = JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(bytes::Bytes::from_static(b"subscription")),
        ]);
    let resp: JoinGroupResponse = c.call(api::JOIN_GROUP, 3, &req);
    (
        resp.error_code,
        resp.member_id.to_string(),
        resp.generation_id,
    )
}

/// The leader's SyncGroup (v3) assigning `assignment` to itself; (error, assignment).
fn sync_group(
    c: &mut Client,
    group: &str,
    generation: i32,
    member: &str,
    assignment: &'static [u8],
) -> (i16, bytes::Bytes) {
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    let req = SyncGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(s(member))
                .with_assignment(bytes::Bytes::from_static(assignment)),
        ]);
    let resp: SyncGroupResponse = c.call(api::SYNC_GROUP, 3, &req);
    (resp.error_code, resp.assignment)
}

fn heartbeat(c: &mut Client, group: &str, generation: i32, member: &str) -> i16 {
    let req = HeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id(generation)
        .with_member_id(s(member));
    let resp: HeartbeatResponse = c.call(api::HEARTBEAT, 2, &req);
    resp.error_code
}

/// Commits to a probe group (same `__consumer_offsets` partition: there is one) until
/// one answers `want`: the partition's shard applied the topic config change (bounded).
fn wait_commit_code(c: &mut Client, want: i16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = commit_offsets(c, "probe", "data", &[(0, 1, "")]);
        if got == vec![want] {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "commits never answered {want}: last {got:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Kafka's `doSyncGroup`: a leader's assignment that cannot be written to the group's
/// `__consumer_offsets` partition — here its ISR (this node) is below a raised
/// `min.insync.replicas`, what a cluster leader sees with its followers cut off — is
/// answered with the mapped error (NOT_ENOUGH_REPLICAS → COORDINATOR_NOT_AVAILABLE) and
/// no assignment, and the group rebalances; once the partition takes writes again the
/// member rejoins into a new generation and its assignment is stored (it survives a
/// restart). The old code answered NONE with the assignment and only logged the failed
/// write: members consumed under a generation no later coordinator would know.
#[test]
fn a_sync_whose_assignment_cannot_be_stored_is_refused_and_the_group_rebalances() {
    let mut broker = Broker::start(
        1,
        &[
            ("offsets.topic.num.partitions", "1"),
            ("group.initial.rebalance.delay.ms", "0"),
        ],
    );
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("data", 1)]), vec![0]);
    find_coordinator(&mut c, "g");
    let (code, member, generation) = join_group(&mut c, "g", "");
    assert_eq!((code, generation), (0, 1), "alone: generation 1 at once");

    assert_eq!(
        alter_one(&mut c, OFFSETS, "min.insync.replicas", 0, Some("2")),
        0
    );
    wait_commit_code(&mut c, COORDINATOR_NOT_AVAILABLE);
    let (code, assignment) = sync_group(&mut c, "g", generation, &member, b"p0");
    assert_eq!(
        code, COORDINATOR_NOT_AVAILABLE,
        "an assignment that was not stored is not handed out"
    );
    assert!(assignment.is_empty());
    assert_eq!(
        heartbeat(&mut c, "g", generation, &member),
        REBALANCE_IN_PROGRESS,
        "the group rebalances: the member is told to rejoin"
    );

    // Healed: the member rejoins, and the new generation's assignment is stored.
    assert_eq!(
        alter_one(&mut c, OFFSETS, "min.insync.replicas", 0, Some("1")),
        0
    );
    wait_commit_code(&mut c, 0);
    let (code, again, next) = join_group(&mut c, "g", &member);
    assert_eq!((code, again.as_str()), (0, member.as_str()), "rejoined");
    assert_eq!(next, generation + 1, "a new generation");
    let (code, assignment) = sync_group(&mut c, "g", next, &member, b"p0");
    assert_eq!((code, assignment.as_ref()), (0, b"p0".as_slice()));
    assert_eq!(heartbeat(&mut c, "g", next, &member), 0);

    drop(c);
    broker.restart();
    let mut c = broker.client();
    let req = DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]);
    let resp: DescribeGroupsResponse = c.call(api::DESCRIBE_GROUPS, 3, &req);
    let g = &resp.groups[0];
    assert_eq!(
        g.group_state.as_str(),
        "Stable",
        "replayed from the stored metadata"
    );
    assert_eq!(g.members.len(), 1);
    assert_eq!(g.members[0].member_assignment.as_ref(), b"p0");
}

/// JoinGroup v5 of the static member `instance` (`member` "" = its restart); the
/// answer's (error, member id, generation).
fn join_static(c: &mut Client, group: &str, member: &str, instance: &str) -> (i16, String, i32) {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    let req = JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_group_instance_id(Some(s(instance)))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(bytes::Bytes::from_static(b"subscription")),
        ]);
    let resp: JoinGroupResponse = c.call(api::JOIN_GROUP, 5, &req);
    (
        resp.error_code,
        resp.member_id.to_string(),
        resp.generation_id,
    )
}

fn heartbeat_static(
    c: &mut Client,
    group: &str,
    generation: i32,
    member: &str,
    instance: &str,
) -> i16 {
    let req = HeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_group_instance_id(Some(s(instance)));
    let resp: HeartbeatResponse = c.call(api::HEARTBEAT, 3, &req);
    resp.error_code
}

/// KIP-345 (Kafka's `updateStaticMemberAndRebalance`): a restarted static member of a
/// `Stable` group gets its new member id only once the group's metadata naming it is
/// stored. When the write fails the replacement is undone and the join answered with the
/// mapped error, so the old id still holds — here and in the log. The old code answered
/// NONE with the new id and only logged the failure: after a coordinator move the log's
/// old id came back, and the member's next request was fenced (fatal for its client).
#[test]
fn a_static_member_replacement_that_cannot_be_stored_is_refused_and_undone() {
    const FENCED_INSTANCE_ID: i16 = 82;
    let mut broker = Broker::start(
        1,
        &[
            ("offsets.topic.num.partitions", "1"),
            ("group.initial.rebalance.delay.ms", "0"),
        ],
    );
    let mut c = broker.client();
    assert_eq!(create_topics(&mut c, &[("data", 1)]), vec![0]);
    find_coordinator(&mut c, "g");
    let (code, old, generation) = join_static(&mut c, "g", "", "i1");
    assert_eq!((code, generation), (0, 1), "alone: generation 1 at once");
    let (code, _) = sync_group(&mut c, "g", generation, &old, b"p0");
    assert_eq!(code, 0);

    assert_eq!(
        alter_one(&mut c, OFFSETS, "min.insync.replicas", 0, Some("2")),
        0
    );
    wait_commit_code(&mut c, COORDINATOR_NOT_AVAILABLE);
    let (code, _, _) = join_static(&mut c, "g", "", "i1");
    assert_eq!(
        code, COORDINATOR_NOT_AVAILABLE,
        "a replacement that was not stored is not handed out"
    );
    assert_eq!(
        heartbeat_static(&mut c, "g", generation, &old, "i1"),
        0,
        "undone: the old member id still holds"
    );

    assert_eq!(
        alter_one(&mut c, OFFSETS, "min.insync.replicas", 0, Some("1")),
        0
    );
    wait_commit_code(&mut c, 0);
    let (code, new, again) = join_static(&mut c, "g", "", "i1");
    assert_eq!(
        (code, again),
        (0, generation),
        "replaced without a rebalance"
    );
    assert_ne!(new, old);
    assert_eq!(
        heartbeat_static(&mut c, "g", generation, &old, "i1"),
        FENCED_INSTANCE_ID
    );

    drop(c);
    broker.restart();
    let mut c = broker.client();
    find_coordinator(&mut c, "g");
    assert_eq!(
        heartbeat_static(&mut c, "g", generation, &new, "i1"),
        0,
        "the new id was stored before it was handed out"
    );
}

fn delete_group(c: &mut Client, group: &str) -> i16 {
    let req = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group))]);
    let resp: DeleteGroupsResponse = c.call(api::DELETE_GROUPS, 2, &req);
    resp.results[0].error_code
}

fn describe_state(c: &mut Client, group: &str) -> String {
    let req = DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
    let resp: DescribeGroupsResponse = c.call(api::DESCRIBE_GROUPS, 3, &req);
    resp.groups[0].group_state.to_string()
}

/// A group whose only trace is a KIP-394 member id handed out and never used is `Empty`,
/// and DeleteGroups deletes it (Kafka counts no pending member); it was refused with
/// NON_EMPTY_GROUP until the id's session timeout passed.
#[test]
fn an_empty_group_with_an_unused_pending_member_id_can_be_deleted() {
    const MEMBER_ID_REQUIRED: i16 = 79;
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    let broker = Broker::start(1, &[("offsets.topic.num.partitions", "1")]);
    let mut c = broker.client();
    find_coordinator(&mut c, "g");
    let req = JoinGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(bytes::Bytes::from_static(b"subscription")),
        ]);
    let resp: JoinGroupResponse = c.call(api::JOIN_GROUP, 4, &req);
    assert_eq!(resp.error_code, MEMBER_ID_REQUIRED);
    assert_eq!(describe_state(&mut c, "g"), "Empty");
    assert_eq!(delete_group(&mut c, "g"), 0, "an Empty group is deleted");
    assert_eq!(describe_state(&mut c, "g"), "Dead");
}

fn list_groups(c: &mut Client) -> Vec<String> {
    let resp: ListGroupsResponse = c.call(api::LIST_GROUPS, 3, &ListGroupsRequest::default());
    assert_eq!(resp.error_code, 0);
    resp.groups.iter().map(|g| g.group_id.to_string()).collect()
}

/// A JoinGroup refused outright (no protocol, an unknown member id) leaves no group
/// behind: it was created before the join was checked, and stayed (listed as Empty) until
/// the next retention check.
#[test]
fn a_refused_join_leaves_no_group() {
    const UNKNOWN_MEMBER_ID: i16 = 25;
    const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    let broker = Broker::start(1, &[("offsets.topic.num.partitions", "1")]);
    let mut c = broker.client();
    find_coordinator(&mut c, "g");
    let req = JoinGroupRequest::default()
        .with_group_id(GroupId(s("no-protocol")))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_protocol_type(s("consumer"));
    let resp: JoinGroupResponse = c.call(api::JOIN_GROUP, 3, &req);
    assert_eq!(resp.error_code, INCONSISTENT_GROUP_PROTOCOL);
    let (code, _, _) = join_group(&mut c, "unknown-member", "m-1");
    assert_eq!(code, UNKNOWN_MEMBER_ID);
    let (code, _, _) = join_group(&mut c, "joined", "");
    assert_eq!(code, 0);
    assert_eq!(list_groups(&mut c), vec!["joined".to_string()]);
}
