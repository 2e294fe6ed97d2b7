//! The authorizer against a real `weir serve`: one SASL_PLAINTEXT listener with PLAIN
//! users `admin` (a super user), `alice`, `bob`; ACLs made with CreateAcls by the super
//! user. Checks Kafka's rules per API: a principal with Read on topic X only cannot
//! produce to X, read Y, see Y in Metadata, delete topics, alter configs, or commit for a
//! group without Read on it; deny wins; prefixed and wildcard patterns; super users;
//! `allow.everyone.if.no.acl.found` both ways; Describe/Delete filters; ACLs survive a
//! restart.

mod common;

use bytes::Bytes;
use common::{Broker, Client, batch};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

const USERS: &str = "admin:admin-pw,alice:alice-pw,bob:bob-pw";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn start(extra: &[(&str, &str)]) -> Broker {
    let mut sets = vec![
        ("listeners", "SASL_PLAINTEXT://127.0.0.1:0"),
        ("sasl.enabled.mechanisms", "PLAIN"),
        ("sasl.plain.users", USERS),
        (
            "authorizer.class.name",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ),
        ("super.users", "User:admin"),
        ("connection.failed.authentication.delay.ms", "0"),
    ];
    sets.extend_from_slice(extra);
    Broker::start(2, &sets)
}

/// A connection authenticated as `user` (SASL PLAIN, password `<user>-pw`).
fn login(b: &Broker, user: &str) -> Client {
    let mut c = b.client();
    let hs: SaslHandshakeResponse = c.call(
        api::SASL_HANDSHAKE,
        1,
        &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
    );
    assert_eq!(hs.error_code, 0, "handshake");
    let token = format!("\0{user}\0{user}-pw");
    let auth: SaslAuthenticateResponse = c.call(
        api::SASL_AUTHENTICATE,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
    );
    assert_eq!(auth.error_code, 0, "authenticate {user}");
    c
}

fn acl(rt: i8, name: &str, pattern: i8, principal: &str, op: i8, perm: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(rt)
        .with_resource_name(s(name))
        .with_resource_pattern_type(pattern)
        .with_principal(s(principal))
        .with_host(s("*"))
        .with_operation(op)
        .with_permission_type(perm)
}

// Kafka's codes.
const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const CLUSTER: i8 = 4;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const MATCH: i8 = 2;
const ANY: i8 = 1;
const ALL: i8 = 2;
const READ: i8 = 3;
const WRITE: i8 = 4;
const DESCRIBE: i8 = 8;
const DENY: i8 = 2;
const ALLOW: i8 = 3;

const TOPIC_DENIED: i16 = 29;
const GROUP_DENIED: i16 = 30;
const CLUSTER_DENIED: i16 = 31;

fn create_acls(c: &mut Client, creations: Vec<AclCreation>) -> Vec<i16> {
    let resp: CreateAclsResponse = c.call(
        api::CREATE_ACLS,
        3,
        &CreateAclsRequest::default().with_creations(creations),
    );
    resp.results.iter().map(|r| r.error_code).collect()
}

fn create_topics(c: &mut Client, names: &[&str]) -> Vec<i16> {
    let topics = names
        .iter()
        .map(|n| {
            CreatableTopic::default()
                .with_name(TopicName(s(n)))
                .with_num_partitions(1)
                .with_replication_factor(1)
        })
        .collect();
    let resp: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default()
            .with_topics(topics)
            .with_timeout_ms(10_000),
    );
    resp.topics.iter().map(|t| t.error_code).collect()
}

fn produce(c: &mut Client, topic: &str) -> i16 {
    let p = PartitionProduceData::default()
        .with_index(0)
        .with_records(Some(batch(&[b"v"], 1)));
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s(topic)))
                .with_partition_data(vec![p]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    resp.responses[0].partition_responses[0].error_code
}

fn fetch(c: &mut Client, topic: &str) -> i16 {
    let p = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![p]),
        ]);
    let resp: FetchResponse = c.call(api::FETCH, 12, &req);
    resp.responses[0].partitions[0].error_code
}

/// A Fetch naming `topic` in `entries` topic entries, one partition each (indexes 0, 1,
/// ... repeating every `distinct`): the partitions answered, in order.
fn fetch_entries(c: &mut Client, topic: &str, entries: i32, distinct: i32) -> Vec<(i32, i16)> {
    let topics = (0..entries)
        .map(|i| {
            FetchTopic::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![FetchPartition::default().with_partition(i % distinct)])
        })
        .collect();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(topics);
    let resp: FetchResponse = c.call(api::FETCH, 12, &req);
    resp.responses
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition_index, p.error_code))
        })
        .collect()
}

/// Metadata for all topics: the names listed.
fn visible_topics(c: &mut Client) -> Vec<String> {
    let resp: MetadataResponse = c.call(
        api::METADATA,
        12,
        &MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false),
    );
    let mut names: Vec<String> = resp
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .filter(|n| !n.starts_with("__"))
        .collect();
    names.sort();
    names
}

/// Metadata for `topic` by name (auto-creation as asked): its error code.
fn metadata_of(c: &mut Client, topic: &str, create: bool) -> i16 {
    let resp: MetadataResponse = c.call(
        api::METADATA,
        12,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(s(topic)))),
            ]))
            .with_allow_auto_topic_creation(create),
    );
    resp.topics[0].error_code
}

fn delete_topic(c: &mut Client, topic: &str) -> i16 {
    let resp: DeleteTopicsResponse = c.call(
        api::DELETE_TOPICS,
        5,
        &DeleteTopicsRequest::default()
            .with_topic_names(vec![TopicName(s(topic))])
            .with_timeout_ms(10_000),
    );
    resp.responses[0].error_code
}

fn alter_retention(c: &mut Client, resource_type: i8, name: &str) -> i16 {
    let resource = AlterConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(s(name))
        .with_configs(vec![
            AlterableConfig::default()
                .with_name(s("retention.ms"))
                .with_config_operation(0)
                .with_value(Some(s("1"))),
        ]);
    let resp: IncrementalAlterConfigsResponse = c.call(
        api::INCREMENTAL_ALTER_CONFIGS,
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![resource]),
    );
    resp.responses[0].error_code
}

/// OffsetFetch v1 of `group` for `topic`'s partition 0: (offset, code) per partition.
fn offset_fetch_v1(c: &mut Client, group: &str, topic: &str) -> Vec<(i64, i16)> {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(vec![0]),
        ]));
    let resp: OffsetFetchResponse = c.call(api::OFFSET_FETCH, 1, &req);
    resp.topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.committed_offset, p.error_code))
        })
        .collect()
}

/// ElectLeaders (preferred) of `topic`'s partition 0 at `version`: the top-level code and
/// each partition's.
fn elect_leaders(c: &mut Client, topic: &str, version: i16) -> (i16, Vec<i16>) {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    let req = ElectLeadersRequest::default()
        .with_timeout_ms(5000)
        .with_topic_partitions(Some(vec![
            TopicPartitions::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![0]),
        ]));
    let resp: ElectLeadersResponse = c.call(api::ELECT_LEADERS, version, &req);
    let codes = resp
        .replica_election_results
        .iter()
        .flat_map(|r| r.partition_result.iter().map(|p| p.error_code))
        .collect();
    (resp.error_code, codes)
}

fn commit(c: &mut Client, group: &str, topic: &str) -> i16 {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(s(""))
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(1),
                ]),
        ]);
    let resp: OffsetCommitResponse = c.call(api::OFFSET_COMMIT, 8, &req);
    resp.topics[0].partitions[0].error_code
}

/// The issue's matrix: alice has Read on topic x only.
/// DescribeProducers of partition 0 of `topic`: its error code.
fn describe_producers(c: &mut Client, topic: &str) -> i16 {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let req = DescribeProducersRequest::default().with_topics(vec![
        TopicRequest::default()
            .with_name(TopicName(s(topic)))
            .with_partition_indexes(vec![0]),
    ]);
    let resp: DescribeProducersResponse = c.call(api::DESCRIBE_PRODUCERS, 0, &req);
    resp.topics[0].partitions[0].error_code
}

#[test]
fn a_principal_with_read_on_one_topic_can_do_nothing_else_and_super_users_can() {
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    assert_eq!(create_topics(&mut admin, &["x", "y"]), vec![0, 0]);
    assert_eq!(produce(&mut admin, "x"), 0, "super user produces");
    assert_eq!(
        create_acls(
            &mut admin,
            vec![acl(TOPIC, "x", LITERAL, "User:alice", READ, ALLOW)]
        ),
        vec![0]
    );
    let mut alice = login(&b, "alice");
    assert_eq!(fetch(&mut alice, "x"), 0, "Read on x");
    assert_eq!(produce(&mut alice, "x"), TOPIC_DENIED, "no Write on x");
    assert_eq!(fetch(&mut alice, "y"), TOPIC_DENIED, "no Read on y");
    assert_eq!(visible_topics(&mut alice), vec!["x"], "y is invisible");
    assert_eq!(
        metadata_of(&mut alice, "x", false),
        0,
        "Read implies Describe"
    );
    assert_eq!(metadata_of(&mut alice, "y", false), TOPIC_DENIED);
    assert_eq!(
        metadata_of(&mut alice, "new-one", true),
        TOPIC_DENIED,
        "auto-creation needs Create"
    );
    assert_eq!(delete_topic(&mut alice, "x"), TOPIC_DENIED);
    assert_eq!(
        describe_producers(&mut alice, "x"),
        0,
        "DescribeProducers needs Read"
    );
    assert_eq!(describe_producers(&mut alice, "y"), TOPIC_DENIED);
    assert_eq!(alter_retention(&mut alice, 2, "x"), TOPIC_DENIED);
    assert_eq!(
        alter_retention(&mut alice, 4, "0"),
        CLUSTER_DENIED,
        "broker configs"
    );
    assert_eq!(commit(&mut alice, "g", "x"), GROUP_DENIED, "no Read on g");
    // OffsetFetch v1 has no top-level code: each partition carries the denial (an empty
    // answer reads as "nothing committed" and the consumer would reset its position).
    assert_eq!(
        offset_fetch_v1(&mut alice, "g", "x"),
        vec![(-1, GROUP_DENIED)]
    );
    assert_eq!(
        create_acls(
            &mut alice,
            vec![acl(TOPIC, "y", LITERAL, "User:alice", ALL, ALLOW)]
        ),
        vec![CLUSTER_DENIED],
        "ACLs need Cluster Alter"
    );
    let topics_created = create_topics(&mut alice, &["z"]);
    assert_eq!(topics_created, vec![TOPIC_DENIED]);
    // ElectLeaders needs Cluster Alter; v0 has no top-level code: each partition says it
    // (the v0 answer could not be encoded before and the connection was closed).
    for v in [0, 2] {
        assert_eq!(
            elect_leaders(&mut alice, "x", v),
            (
                if v == 0 { 0 } else { CLUSTER_DENIED },
                vec![CLUSTER_DENIED]
            ),
            "ElectLeaders v{v}"
        );
    }
    // With Read on g she commits; the super user does everything.
    assert_eq!(
        create_acls(
            &mut admin,
            vec![acl(GROUP, "g", LITERAL, "User:alice", READ, ALLOW)]
        ),
        vec![0]
    );
    assert_eq!(commit(&mut alice, "g", "x"), 0);
    assert_eq!(visible_topics(&mut admin), vec!["x", "y"]);
    assert_eq!(alter_retention(&mut admin, 2, "y"), 0);
    assert_eq!(commit(&mut admin, "g2", "y"), 0);
    assert_eq!(delete_topic(&mut admin, "y"), 0);
}

/// A refused topic named in many entries is answered once per partition, at most a
/// request's worth of partitions, and without looking each entry up in the answer so far
/// (that was quadratic: 200,000 entries held the shard for minutes).
#[test]
fn a_fetch_naming_a_refused_topic_many_times_is_answered_once_per_partition() {
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    assert_eq!(create_topics(&mut admin, &["x", "y"]), vec![0, 0]);
    let mut alice = login(&b, "alice");
    let answered = fetch_entries(&mut alice, "y", 3, 2);
    assert_eq!(
        answered,
        vec![(0, TOPIC_DENIED), (1, TOPIC_DENIED)],
        "each once"
    );
    let started = std::time::Instant::now();
    let answered = fetch_entries(&mut alice, "y", 250_000, 150_000);
    assert_eq!(answered.len(), 100_000, "a request's worth of partitions");
    assert!(answered.iter().all(|(_, code)| *code == TOPIC_DENIED));
    let distinct: std::collections::HashSet<i32> = answered.iter().map(|(i, _)| *i).collect();
    assert_eq!(distinct.len(), answered.len(), "no partition twice");
    assert_eq!(fetch(&mut admin, "x"), 0, "the node serves on");
    eprintln!(
        "250,000 refused entries answered in {:?}",
        started.elapsed()
    );
}

#[test]
fn deny_wins_over_allow_and_prefixed_and_wildcard_patterns_match() {
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    let names = ["app.orders", "app.secret", "public", "other"];
    assert_eq!(create_topics(&mut admin, &names), vec![0; 4]);
    let codes = create_acls(
        &mut admin,
        vec![
            acl(TOPIC, "app.", PREFIXED, "User:bob", ALL, ALLOW),
            acl(TOPIC, "app.secret", LITERAL, "User:bob", WRITE, DENY),
            acl(TOPIC, "public", LITERAL, "User:*", READ, ALLOW),
            acl(TOPIC, "*", LITERAL, "User:alice", DESCRIBE, ALLOW),
        ],
    );
    assert_eq!(codes, vec![0; 4]);
    let mut bob = login(&b, "bob");
    assert_eq!(produce(&mut bob, "app.orders"), 0, "prefixed All");
    assert_eq!(produce(&mut bob, "app.secret"), TOPIC_DENIED, "deny wins");
    assert_eq!(fetch(&mut bob, "app.secret"), 0, "a Write deny leaves Read");
    assert_eq!(fetch(&mut bob, "public"), 0, "User:* matches bob");
    assert_eq!(produce(&mut bob, "other"), TOPIC_DENIED);
    assert_eq!(
        visible_topics(&mut bob),
        vec!["app.orders", "app.secret", "public"]
    );
    let mut alice = login(&b, "alice");
    assert_eq!(
        visible_topics(&mut alice),
        vec!["app.orders", "app.secret", "other", "public"],
        "Describe on the * literal"
    );
    assert_eq!(
        fetch(&mut alice, "other"),
        TOPIC_DENIED,
        "Describe is not Read"
    );
    assert_eq!(fetch(&mut alice, "public"), 0);
    // A DENY of All on the wildcard closes everything to alice, whatever else allows.
    assert_eq!(
        create_acls(
            &mut admin,
            vec![acl(TOPIC, "*", LITERAL, "User:alice", ALL, DENY)]
        ),
        vec![0]
    );
    assert_eq!(fetch(&mut alice, "public"), TOPIC_DENIED);
    assert!(visible_topics(&mut alice).is_empty());
}

#[test]
fn allow_everyone_if_no_acl_found_opens_only_resources_without_acls() {
    let open = start(&[("allow.everyone.if.no.acl.found", "true")]);
    let mut admin = login(&open, "admin");
    assert_eq!(create_topics(&mut admin, &["t", "u"]), vec![0, 0]);
    let mut alice = login(&open, "alice");
    assert_eq!(produce(&mut alice, "t"), 0, "no ACL on t: open");
    assert_eq!(
        create_acls(
            &mut admin,
            vec![acl(TOPIC, "t", LITERAL, "User:bob", WRITE, ALLOW)]
        ),
        vec![0]
    );
    assert_eq!(produce(&mut alice, "t"), TOPIC_DENIED, "t has ACLs now");
    assert_eq!(produce(&mut alice, "u"), 0);
    assert_eq!(produce(&mut login(&open, "bob"), "t"), 0);

    let closed = start(&[]);
    let mut admin = login(&closed, "admin");
    assert_eq!(create_topics(&mut admin, &["t"]), vec![0]);
    let mut alice = login(&closed, "alice");
    assert_eq!(
        produce(&mut alice, "t"),
        TOPIC_DENIED,
        "default false: closed"
    );
    assert!(visible_topics(&mut alice).is_empty());
}

fn describe_acls(c: &mut Client, name: Option<&str>, pattern: i8) -> Vec<(String, i8, usize)> {
    let req = DescribeAclsRequest::default()
        .with_resource_type_filter(ANY)
        .with_resource_name_filter(name.map(s))
        .with_pattern_type_filter(pattern)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_operation(ANY)
        .with_permission_type(ANY);
    let resp: DescribeAclsResponse = c.call(api::DESCRIBE_ACLS, 3, &req);
    assert_eq!(resp.error_code, 0);
    resp.resources
        .iter()
        .map(|r| (r.resource_name.to_string(), r.pattern_type, r.acls.len()))
        .collect()
}

#[test]
fn describe_and_delete_follow_kafkas_filters_and_acls_survive_a_restart() {
    let mut b = start(&[]);
    let mut admin = login(&b, "admin");
    let codes = create_acls(
        &mut admin,
        vec![
            acl(TOPIC, "app.", PREFIXED, "User:bob", READ, ALLOW),
            acl(TOPIC, "app.orders", LITERAL, "User:bob", WRITE, ALLOW),
            acl(TOPIC, "app.orders", LITERAL, "User:alice", READ, ALLOW),
            acl(TOPIC, "*", LITERAL, "User:alice", DESCRIBE, ALLOW),
            acl(
                CLUSTER,
                "kafka-cluster",
                LITERAL,
                "User:bob",
                DESCRIBE,
                ALLOW,
            ),
            acl(
                CLUSTER,
                "not-the-cluster",
                LITERAL,
                "User:bob",
                DESCRIBE,
                ALLOW,
            ),
        ],
    );
    assert_eq!(
        codes,
        vec![0, 0, 0, 0, 0, 42],
        "a cluster is named kafka-cluster"
    );
    let all = describe_acls(&mut admin, None, ANY);
    assert_eq!(all.len(), 4, "{all:?}");
    let matching = describe_acls(&mut admin, Some("app.orders"), MATCH);
    assert_eq!(
        matching,
        vec![
            ("*".into(), LITERAL, 1),
            ("app.".into(), PREFIXED, 1),
            ("app.orders".into(), LITERAL, 2)
        ]
    );
    let exact = describe_acls(&mut admin, Some("app.orders"), ANY);
    assert_eq!(exact, vec![("app.orders".into(), LITERAL, 2)]);
    let mut bob = login(&b, "bob");
    let describe: DescribeAclsResponse = bob.call(
        api::DESCRIBE_ACLS,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(ANY)
            .with_pattern_type_filter(ANY)
            .with_resource_name_filter(None)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(ANY)
            .with_permission_type(ANY),
    );
    assert_eq!(describe.error_code, 0, "bob has Cluster Describe");
    let mut alice = login(&b, "alice");
    let describe: DescribeAclsResponse = alice.call(
        api::DESCRIBE_ACLS,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(ANY)
            .with_pattern_type_filter(ANY)
            .with_resource_name_filter(None)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(ANY)
            .with_permission_type(ANY),
    );
    assert_eq!(describe.error_code, CLUSTER_DENIED);

    b.restart();
    let mut admin = login(&b, "admin");
    assert_eq!(describe_acls(&mut admin, None, ANY), all, "persisted");
    let filter = DeleteAclsFilter::default()
        .with_resource_type_filter(TOPIC)
        .with_pattern_type_filter(MATCH)
        .with_resource_name_filter(Some(s("app.orders")))
        .with_principal_filter(Some(s("User:bob")))
        .with_host_filter(None)
        .with_operation(ANY)
        .with_permission_type(ANY);
    let resp: DeleteAclsResponse = admin.call(
        api::DELETE_ACLS,
        3,
        &DeleteAclsRequest::default().with_filters(vec![filter]),
    );
    assert_eq!(resp.filter_results[0].error_code, 0);
    assert_eq!(resp.filter_results[0].matching_acls.len(), 2, "bob's two");
    let left = describe_acls(&mut admin, None, ANY);
    assert_eq!(
        left,
        vec![
            ("*".into(), LITERAL, 1),
            ("app.orders".into(), LITERAL, 1),
            ("kafka-cluster".into(), LITERAL, 1)
        ]
    );
    let mut bob = login(&b, "bob");
    assert_eq!(fetch(&mut bob, "app.orders"), TOPIC_DENIED, "his Read went");
}

/// Without `authorizer.class.name` nothing is checked (the old behaviour), and the ACL
/// APIs still store bindings.
#[test]
fn without_an_authorizer_everything_is_allowed() {
    let b = Broker::start(1, &[]);
    let mut c = b.client();
    assert_eq!(create_topics(&mut c, &["t"]), vec![0]);
    assert_eq!(
        create_acls(
            &mut c,
            vec![acl(TOPIC, "t", LITERAL, "User:bob", WRITE, DENY)]
        ),
        vec![0]
    );
    assert_eq!(produce(&mut c, "t"), 0);
    assert_eq!(describe_acls(&mut c, None, ANY).len(), 1);
}

fn init_producer_id(c: &mut Client, txn: Option<&str>) -> i16 {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(txn.map(|t| TransactionalId(s(t))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let resp: InitProducerIdResponse = c.call(api::INIT_PRODUCER_ID, 4, &req);
    resp.error_code
}

#[test]
fn idempotence_and_transactional_ids_need_their_acls_and_acl_apis_are_advertised() {
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    assert_eq!(create_topics(&mut admin, &["x"]), vec![0]);
    assert_eq!(
        create_acls(
            &mut admin,
            vec![acl(TOPIC, "x", LITERAL, "User:alice", READ, ALLOW)]
        ),
        vec![0]
    );
    let mut alice = login(&b, "alice");
    assert_eq!(
        init_producer_id(&mut alice, None),
        CLUSTER_DENIED,
        "idempotence needs Write on some topic or IdempotentWrite"
    );
    assert_eq!(init_producer_id(&mut alice, Some("tx1")), 53);
    let find: FindCoordinatorResponse = alice.call(
        api::FIND_COORDINATOR,
        3,
        &FindCoordinatorRequest::default()
            .with_key(s("tx1"))
            .with_key_type(1),
    );
    assert_eq!(find.error_code, 53, "Describe on the transactional id");
    const TXN_ID: i8 = 5;
    let codes = create_acls(
        &mut admin,
        vec![
            acl(TOPIC, "x", LITERAL, "User:alice", WRITE, ALLOW),
            acl(TXN_ID, "tx", PREFIXED, "User:alice", WRITE, ALLOW),
        ],
    );
    assert_eq!(codes, vec![0, 0]);
    assert_eq!(init_producer_id(&mut alice, None), 0, "Write on x");
    let find: FindCoordinatorResponse = alice.call(
        api::FIND_COORDINATOR,
        3,
        &FindCoordinatorRequest::default()
            .with_key(s("tx1"))
            .with_key_type(1),
    );
    assert_ne!(find.error_code, 53, "Write implies Describe");

    // AddPartitionsToTxn v4+ is inter-broker: ClusterAction, whatever the client's
    // transactional id and topic ACLs (a top-level error, no results); a super user
    // passes.
    let verify = |c: &mut Client| {
        use kafka_protocol::messages::add_partitions_to_txn_request::{
            AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
        };
        let t = AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(s("tx1")))
            .with_producer_id(7.into())
            .with_verify_only(true)
            .with_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(s("x")))
                    .with_partitions(vec![0]),
            ]);
        let req = AddPartitionsToTxnRequest::default().with_transactions(vec![t]);
        let resp: AddPartitionsToTxnResponse = c.call(api::ADD_PARTITIONS_TO_TXN, 5, &req);
        (resp.error_code, resp.results_by_transaction.len())
    };
    assert_eq!(verify(&mut alice), (CLUSTER_DENIED, 0));
    assert_eq!(verify(&mut admin), (0, 1));

    let versions: ApiVersionsResponse =
        alice.call(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    for key in [api::DESCRIBE_ACLS, api::CREATE_ACLS, api::DELETE_ACLS] {
        let v = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == key)
            .expect("ACL API advertised");
        assert_eq!((v.min_version, v.max_version), (1, 3));
    }
}

/// Kafka's `authorized_operations` bitmasks: the bit of each AclOperation code the
/// connection may do, for the resource type's supported operations.
fn bits(ops: &[i8]) -> i32 {
    ops.iter().fold(0, |m, op| m | (1 << op))
}

/// (topic bitmask of `topic` from Metadata v9, cluster bitmask from Metadata v9,
/// cluster bitmask from DescribeCluster, group bitmask from DescribeGroups v5).
fn operations(c: &mut Client, topic: &str, group: &str) -> (i32, i32, i32, i32) {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(s(topic)))),
        ]))
        .with_include_topic_authorized_operations(true)
        .with_include_cluster_authorized_operations(true);
    let m: MetadataResponse = c.call(api::METADATA, 9, &req);
    let t = m.topics.first().expect("the topic");
    assert_eq!(t.error_code, 0, "{m:?}");
    let dc: DescribeClusterResponse = c.call(
        api::DESCRIBE_CLUSTER,
        0,
        &DescribeClusterRequest::default().with_include_cluster_authorized_operations(true),
    );
    let dg: DescribeGroupsResponse = c.call(
        api::DESCRIBE_GROUPS,
        5,
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(s(group))])
            .with_include_authorized_operations(true),
    );
    let g = dg.groups.first().expect("the group");
    (
        t.topic_authorized_operations,
        m.cluster_authorized_operations,
        dc.cluster_authorized_operations,
        g.authorized_operations,
    )
}

#[test]
fn authorized_operations_are_the_principals_bitmasks() {
    // Kafka's AclOperation codes beyond the ones above.
    const CREATE: i8 = 5;
    const DELETE: i8 = 6;
    const ALTER: i8 = 7;
    const CLUSTER_ACTION: i8 = 9;
    const DESCRIBE_CONFIGS: i8 = 10;
    const ALTER_CONFIGS: i8 = 11;
    const IDEMPOTENT_WRITE: i8 = 12;
    let topic_all = bits(&[
        READ,
        WRITE,
        CREATE,
        DESCRIBE,
        DELETE,
        ALTER,
        DESCRIBE_CONFIGS,
        ALTER_CONFIGS,
    ]);
    let cluster_all = bits(&[
        CREATE,
        CLUSTER_ACTION,
        DESCRIBE_CONFIGS,
        ALTER_CONFIGS,
        IDEMPOTENT_WRITE,
        ALTER,
        DESCRIBE,
    ]);
    let group_all = bits(&[READ, DESCRIBE, DELETE]);

    // Without an authorizer every supported operation is allowed.
    let open = Broker::start(1, &[]);
    let mut c = open.client();
    assert_eq!(create_topics(&mut c, &["ops"]), vec![0]);
    assert_eq!(
        operations(&mut c, "ops", "g"),
        (topic_all, cluster_all, cluster_all, group_all)
    );

    // With one: a super user may do everything; alice what her ACLs (and their implied
    // Describe) allow.
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    assert_eq!(create_topics(&mut admin, &["ops"]), vec![0]);
    assert_eq!(
        operations(&mut admin, "ops", "g"),
        (topic_all, cluster_all, cluster_all, group_all)
    );
    assert_eq!(
        create_acls(
            &mut admin,
            vec![
                acl(TOPIC, "ops", LITERAL, "User:alice", READ, ALLOW),
                acl(GROUP, "g", LITERAL, "User:alice", READ, ALLOW),
                acl(
                    CLUSTER,
                    "kafka-cluster",
                    LITERAL,
                    "User:alice",
                    IDEMPOTENT_WRITE,
                    ALLOW
                ),
            ]
        ),
        vec![0, 0, 0]
    );
    let mut alice = login(&b, "alice");
    assert_eq!(
        operations(&mut alice, "ops", "g"),
        (
            bits(&[READ, DESCRIBE]),
            bits(&[IDEMPOTENT_WRITE]),
            bits(&[IDEMPOTENT_WRITE]),
            bits(&[READ, DESCRIBE])
        )
    );
}

/// An incremental fetch session reads its partitions without the request naming them:
/// each is authorized on every fetch, so a Read ACL deleted after the session began stops
/// the reads (TOPIC_AUTHORIZATION_FAILED), as Kafka does.
#[test]
fn a_fetch_session_stops_reading_a_topic_once_its_read_acl_is_deleted() {
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    assert_eq!(create_topics(&mut admin, &["watched"]), vec![0]);
    let allow = acl(TOPIC, "watched", LITERAL, "User:alice", READ, ALLOW);
    assert_eq!(create_acls(&mut admin, vec![allow]), vec![0]);
    assert_eq!(produce(&mut admin, "watched"), 0);
    let mut alice = login(&b, "alice");
    let session_fetch = |c: &mut Client, session: i32, epoch: i32, topics: Vec<FetchTopic>| {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_session_id(session)
            .with_session_epoch(epoch)
            .with_topics(topics);
        let resp: FetchResponse = c.call(api::FETCH, 12, &req);
        resp
    };
    let p = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    let t = FetchTopic::default()
        .with_topic(TopicName(s("watched")))
        .with_partitions(vec![p]);
    let full = session_fetch(&mut alice, 0, 0, vec![t]);
    assert_eq!(full.error_code, 0);
    assert!(full.session_id > 0, "a session was opened");
    assert_eq!(full.responses[0].partitions[0].error_code, 0);
    assert!(full.responses[0].partitions[0].records.is_some());

    let filter = DeleteAclsFilter::default()
        .with_resource_type_filter(TOPIC)
        .with_pattern_type_filter(MATCH)
        .with_resource_name_filter(Some(s("watched")))
        .with_principal_filter(Some(s("User:alice")))
        .with_host_filter(None)
        .with_operation(ANY)
        .with_permission_type(ANY);
    let resp: DeleteAclsResponse = admin.call(
        api::DELETE_ACLS,
        3,
        &DeleteAclsRequest::default().with_filters(vec![filter]),
    );
    assert_eq!(resp.filter_results[0].matching_acls.len(), 1);
    assert_eq!(produce(&mut admin, "watched"), 0, "new data to read");

    let next = session_fetch(&mut alice, full.session_id, 1, Vec::new());
    let answers: Vec<(i32, i16, bool)> = next
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            (
                p.partition_index,
                p.error_code,
                p.records.as_ref().is_some_and(|r| !r.is_empty()),
            )
        })
        .collect();
    assert_eq!(answers, vec![(0, TOPIC_DENIED, false)], "{next:?}");
}

/// DeleteTopics v6 by topic id: the id is resolved to its name first and Delete is asked
/// on that name, as Kafka does; a principal with only Read on the topic learns its id
/// from Metadata but cannot delete it by id. An id that names no topic is UNKNOWN_TOPIC_ID.
#[test]
fn delete_topics_by_id_asks_delete_on_the_resolved_name() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    let b = start(&[]);
    let mut admin = login(&b, "admin");
    assert_eq!(create_topics(&mut admin, &["t"]), vec![0]);
    let read_t = acl(TOPIC, "t", LITERAL, "User:alice", READ, ALLOW);
    assert_eq!(create_acls(&mut admin, vec![read_t]), vec![0]);
    let mut alice = login(&b, "alice");
    let meta: MetadataResponse = alice.call(
        api::METADATA,
        12,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(s("t")))),
            ]))
            .with_allow_auto_topic_creation(false),
    );
    let id = meta.topics[0].topic_id;
    assert!(!id.is_nil(), "Metadata v12 gives the id");
    let by_id = |c: &mut Client, id: uuid::Uuid| -> DeleteTopicsResponse {
        c.call(
            api::DELETE_TOPICS,
            6,
            &DeleteTopicsRequest::default()
                .with_topics(vec![DeleteTopicState::default().with_topic_id(id)])
                .with_timeout_ms(10_000),
        )
    };
    let resp = by_id(&mut alice, id);
    assert_eq!(resp.responses.len(), 1);
    assert_eq!(resp.responses[0].error_code, TOPIC_DENIED, "no Delete on t");
    assert_eq!(resp.responses[0].topic_id, id);
    assert_eq!(visible_topics(&mut admin), vec!["t"], "t is still there");
    let unknown = by_id(&mut alice, uuid::Uuid::from_u128(42));
    assert_eq!(unknown.responses[0].error_code, 100, "UNKNOWN_TOPIC_ID");
    // Bob may not even describe t: refused too, and its name is not given away.
    let mut bob = login(&b, "bob");
    let resp = by_id(&mut bob, id);
    assert_eq!(resp.responses[0].error_code, TOPIC_DENIED);
    assert_eq!(resp.responses[0].name, None, "bob cannot describe t");
    assert_eq!(visible_topics(&mut admin), vec!["t"]);
    // The super user deletes it by id.
    let resp = by_id(&mut admin, id);
    assert_eq!(resp.responses[0].error_code, 0);
    assert!(visible_topics(&mut admin).is_empty());
}

/// The BROKER resource's secrets (Kafka's PASSWORD keys, and weir's own keys holding
/// passwords) are described as Kafka describes them: value null, `is_sensitive`. A
/// secret set dynamically is not echoed back by the alter, its description or the log.
#[test]
fn describe_configs_hides_the_brokers_secrets() {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    const SECRET: &str = "jaas-s3cret";
    let b = start(&[("ssl.key.password", "key-s3cret")]);
    let mut admin = login(&b, "admin");
    let alter = |admin: &mut Client, key: &str, value: &str| {
        let resource = AlterConfigsResource::default()
            .with_resource_type(CLUSTER)
            .with_resource_name(s(""))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(s(key))
                    .with_config_operation(0)
                    .with_value(Some(s(value))),
            ]);
        let altered: IncrementalAlterConfigsResponse = admin.call(
            api::INCREMENTAL_ALTER_CONFIGS,
            1,
            &IncrementalAlterConfigsRequest::default().with_resources(vec![resource]),
        );
        assert!(!format!("{altered:?}").contains(SECRET));
        altered.responses[0].error_code
    };
    // weir reads the listener's JAAS config at startup only: a runtime change is refused
    // (a reported success that changed nothing would mislead), and not echoed.
    let jaas = format!(r#"PlainLoginModule required user_eve="{SECRET}";"#);
    let read_only = "listener.name.sasl_plaintext.plain.sasl.jaas.config";
    assert_ne!(
        alter(&mut admin, read_only, &jaas),
        0,
        "{read_only} is read-only"
    );
    // A Kafka secret weir does not use is stored and described as a secret.
    let secret_key = "listener.name.sasl_plaintext.ssl.keystore.password";
    assert_eq!(alter(&mut admin, secret_key, SECRET), 0);
    for version in [1, 4] {
        let resp: DescribeConfigsResponse = admin.call(
            api::DESCRIBE_CONFIGS,
            version,
            &DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(CLUSTER)
                    .with_resource_name(s(""))
                    .with_configuration_keys(None),
            ]),
        );
        let entries = &resp.results[0].configs;
        let find = |name: &str| entries.iter().find(|e| e.name.as_str() == name);
        for key in ["sasl.plain.users", "ssl.key.password", secret_key] {
            let e = find(key).unwrap_or_else(|| panic!("v{version}: {key} is described"));
            assert_eq!(e.value, None, "v{version}: {key} has no value shown");
            assert!(e.is_sensitive, "v{version}: {key} is sensitive");
        }
        let plain = find("num.partitions").expect("num.partitions");
        assert!(plain.value.is_some() && !plain.is_sensitive, "v{version}");
        let shown = format!("{resp:?}");
        for secret in ["admin-pw", "alice-pw", "key-s3cret", SECRET] {
            assert!(!shown.contains(secret), "v{version} shows {secret}");
        }
    }
    assert!(
        !b.log_contains(SECRET),
        "the log keeps the secret to itself"
    );
}
