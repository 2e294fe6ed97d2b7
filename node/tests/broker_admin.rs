//! Topic administration against a real `weir serve`: CreateTopics (configs, validate_only,
//! refusals), Describe/Alter/IncrementalAlterConfigs, CreatePartitions, DeleteTopics, and
//! that topics and configs survive a restart.

mod common;

use common::Broker;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic(name: &str, partitions: i32, rf: i16, configs: &[(&str, &str)]) -> CreatableTopic {
    CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(rf)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(s(k))
                        .with_value(Some(s(v)))
                })
                .collect(),
        )
}

fn create(c: &mut common::Client, topics: Vec<CreatableTopic>, validate_only: bool) -> Vec<i16> {
    let req = CreateTopicsRequest::default()
        .with_topics(topics)
        .with_validate_only(validate_only)
        .with_timeout_ms(5000);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 7, &req);
    resp.topics.iter().map(|t| t.error_code).collect()
}

fn metadata(c: &mut common::Client, names: &[&str], allow_create: bool) -> MetadataResponse {
    let topics = names
        .iter()
        .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(s(n)))))
        .collect();
    let req = MetadataRequest::default()
        .with_topics(Some(topics))
        .with_allow_auto_topic_creation(allow_create);
    c.call(api::METADATA, 12, &req)
}

fn describe_topic(c: &mut common::Client, name: &str) -> Vec<(String, String, i8)> {
    let res = DescribeConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s(name));
    let resp: DescribeConfigsResponse = c.call(
        api::DESCRIBE_CONFIGS,
        4,
        &DescribeConfigsRequest::default().with_resources(vec![res]),
    );
    assert_eq!(resp.results[0].error_code, 0);
    resp.results[0]
        .configs
        .iter()
        .map(|e| {
            (
                e.name.to_string(),
                e.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                e.config_source,
            )
        })
        .collect()
}

fn config_of(entries: &[(String, String, i8)], key: &str) -> (String, i8) {
    let e = entries
        .iter()
        .find(|e| e.0 == key)
        .unwrap_or_else(|| panic!("{key} not described"));
    (e.1.clone(), e.2)
}

#[test]
fn create_validate_refuse_alter_grow_delete_and_persist() {
    let mut broker = Broker::start(2, &[("auto.create.topics.enable", "false")]);
    let mut c = broker.client();

    assert_eq!(create(&mut c, vec![topic("dry", 3, 1, &[])], true), vec![0]);
    let md = metadata(&mut c, &["dry"], true);
    assert_eq!(
        md.topics[0].error_code, 3,
        "validate_only must not create, and auto-create is off"
    );

    let refused = create(
        &mut c,
        vec![
            topic("rf3", 1, 3, &[]),
            topic("badcfg", 1, 1, &[("retention.ms", "soon")]),
            topic("unknowncfg", 1, 1, &[("no.such.key", "1")]),
            topic("bad/name", 1, 1, &[]),
            topic("zero", 0, 1, &[]),
        ],
        false,
    );
    assert_eq!(refused, vec![38, 40, 40, 17, 37]);

    assert_eq!(
        create(
            &mut c,
            vec![topic("orders", 2, -1, &[("retention.ms", "3600000")])],
            false
        ),
        vec![0]
    );
    assert_eq!(
        create(&mut c, vec![topic("orders", 2, 1, &[])], false),
        vec![36]
    );
    let md = metadata(&mut c, &["orders"], false);
    assert_eq!(md.topics[0].partitions.len(), 2);
    assert!(!md.topics[0].topic_id.is_nil());

    let cfg = describe_topic(&mut c, "orders");
    assert_eq!(
        config_of(&cfg, "retention.ms"),
        ("3600000".into(), 1),
        "topic override, source DYNAMIC_TOPIC_CONFIG"
    );
    assert_eq!(
        config_of(&cfg, "segment.bytes").1,
        5,
        "broker default, source DEFAULT_CONFIG"
    );

    let set = AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s("orders"))
        .with_configs(vec![
            AlterableConfig::default()
                .with_name(s("segment.bytes"))
                .with_config_operation(0)
                .with_value(Some(s("1048576"))),
            AlterableConfig::default()
                .with_name(s("cleanup.policy"))
                .with_config_operation(0)
                .with_value(Some(s("compact"))),
            AlterableConfig::default()
                .with_name(s("retention.ms"))
                .with_config_operation(1),
        ]);
    let resp: IncrementalAlterConfigsResponse = c.call(
        api::INCREMENTAL_ALTER_CONFIGS,
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![set]),
    );
    assert_eq!(resp.responses[0].error_code, 0);

    let grow = |count| {
        CreatePartitionsRequest::default().with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(TopicName(s("orders")))
                .with_count(count),
        ])
    };
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &grow(4));
    assert_eq!(resp.results[0].error_code, 0);
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &grow(3));
    assert_eq!(
        resp.results[0].error_code, 37,
        "shrinking is INVALID_PARTITIONS"
    );

    broker.restart();
    let mut c = broker.client();
    let md = metadata(&mut c, &["orders"], false);
    assert_eq!(md.topics[0].partitions.len(), 4, "partition count persists");
    let cfg = describe_topic(&mut c, "orders");
    assert_eq!(config_of(&cfg, "segment.bytes"), ("1048576".into(), 1));
    assert_eq!(config_of(&cfg, "cleanup.policy"), ("compact".into(), 1));
    assert_eq!(
        config_of(&cfg, "retention.ms").1,
        5,
        "deleted override falls back to the default"
    );
    // Partitions open (and get their directories) on first use: ListOffsets uses them.
    let parts = (0..4)
        .map(|p| {
            kafka_protocol::messages::list_offsets_request::ListOffsetsPartition::default()
                .with_partition_index(p)
                .with_timestamp(-1)
        })
        .collect();
    let list = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            kafka_protocol::messages::list_offsets_request::ListOffsetsTopic::default()
                .with_name(TopicName(s("orders")))
                .with_partitions(parts),
        ]);
    let listed: ListOffsetsResponse = c.call(api::LIST_OFFSETS, 6, &list);
    assert!(
        listed.topics[0]
            .partitions
            .iter()
            .all(|p| p.error_code == 0)
    );
    for p in 0..4 {
        assert!(broker.data_dir.path().join(format!("orders-{p}")).is_dir());
    }

    let del = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(s("orders")), TopicName(s("nope"))]);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 5, &del);
    let codes: Vec<i16> = resp.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![0, 3]);
    assert_eq!(metadata(&mut c, &["orders"], false).topics[0].error_code, 3);
    for p in 0..4 {
        assert!(
            !broker.data_dir.path().join(format!("orders-{p}")).exists(),
            "partition dirs removed"
        );
    }
}

/// A Metadata naming many unknown topics creates them in one catalogue write (one
/// "topics created" line), not one write per topic; a name that cannot be created
/// (invalid) is answered with its error beside the created ones.
#[test]
fn metadata_auto_creates_the_topics_of_one_request_in_one_write() {
    let broker = Broker::start(1, &[("num.partitions", "2")]);
    let mut c = broker.client();
    let names: Vec<String> = (0..100).map(|i| format!("auto-{i}")).collect();
    let mut asked: Vec<&str> = names.iter().map(String::as_str).collect();
    asked.insert(50, "bad/name");
    let md = metadata(&mut c, &asked, true);
    assert_eq!(md.topics.len(), 101);
    for t in &md.topics {
        let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
        if name == "bad/name" {
            assert_eq!(t.error_code, 17, "INVALID_TOPIC_EXCEPTION");
        } else {
            assert_eq!((t.error_code, t.partitions.len()), (0, 2), "{name}");
        }
    }
    assert!(broker.wait_log("topics created", std::time::Duration::from_secs(10)));
    let log = broker.log_tail(10_000);
    assert_eq!(log.matches("topics created").count(), 1, "{log}");
    assert_eq!(log.matches("topic created").count(), 0, "{log}");
}

#[test]
fn metadata_auto_creates_with_num_partitions() {
    let broker = Broker::start(1, &[("num.partitions", "3")]);
    let mut c = broker.client();
    let md = metadata(&mut c, &["auto"], true);
    assert_eq!(md.topics[0].error_code, 0);
    assert_eq!(md.topics[0].partitions.len(), 3);
    assert_eq!(md.brokers.len(), 1);
    assert_eq!(md.brokers[0].port, i32::from(broker.port));
    let md = metadata(&mut c, &["not-allowed"], false);
    assert_eq!(
        md.topics[0].error_code, 3,
        "allow_auto_topic_creation=false is honoured"
    );
    let all: MetadataResponse = c.call(
        api::METADATA,
        12,
        &MetadataRequest::default().with_topics(None),
    );
    assert_eq!(all.topics.len(), 1);
    let dc: DescribeClusterResponse =
        c.call(api::DESCRIBE_CLUSTER, 1, &DescribeClusterRequest::default());
    assert_eq!(dc.brokers.len(), 1);
    assert_eq!(
        dc.cluster_id.as_str(),
        md.cluster_id.as_ref().map(|c| c.as_str()).unwrap_or("")
    );
}

/// `broker.rack`: a single node answers its rack in Metadata and DescribeCluster (null
/// when unset, as Kafka).
#[test]
fn a_node_answers_its_rack() {
    for (sets, want) in [
        (vec![("broker.rack", "zone-b")], Some("zone-b")),
        (vec![], None),
    ] {
        let broker = Broker::start(1, &sets);
        let mut c = broker.client();
        let md: MetadataResponse = c.call(
            api::METADATA,
            12,
            &MetadataRequest::default().with_topics(None),
        );
        assert_eq!(md.brokers[0].rack.as_ref().map(|r| r.as_str()), want);
        let dc: DescribeClusterResponse =
            c.call(api::DESCRIBE_CLUSTER, 1, &DescribeClusterRequest::default());
        assert_eq!(dc.brokers[0].rack.as_ref().map(|r| r.as_str()), want);
    }
}

/// `__consumer_offsets` backs the group coordinators: deleting or growing it is refused.
#[test]
fn offsets_topic_cannot_be_deleted_or_grown() {
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    let find = FindCoordinatorRequest::default().with_key(s("g"));
    let resp: FindCoordinatorResponse = c.call(api::FIND_COORDINATOR, 3, &find);
    assert_eq!(resp.error_code, 0, "creates __consumer_offsets");
    let before = metadata(&mut c, &["__consumer_offsets"], false).topics[0]
        .partitions
        .len();
    assert!(before > 0);
    let grow = CreatePartitionsRequest::default().with_topics(vec![
        CreatePartitionsTopic::default()
            .with_name(TopicName(s("__consumer_offsets")))
            .with_count(before as i32 + 1),
    ]);
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &grow);
    assert_eq!(resp.results[0].error_code, 42, "INVALID_REQUEST");
    let del =
        DeleteTopicsRequest::default().with_topic_names(vec![TopicName(s("__consumer_offsets"))]);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 5, &del);
    assert_eq!(resp.responses[0].error_code, 42, "INVALID_REQUEST");
    let md = metadata(&mut c, &["__consumer_offsets"], false);
    assert_eq!(md.topics[0].error_code, 0);
    assert_eq!(md.topics[0].partitions.len(), before, "unchanged");
}

/// A single node takes explicit replica assignments naming itself (librdkafka's 0081 and
/// kafka-python's admin tests send `[[0]]`), and refuses any other node id.
#[test]
fn explicit_assignments_naming_this_node_are_accepted() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment;
    use kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment;
    const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    let b = Broker::start(1, &[]);
    let mut c = b.client();
    let placed = |name: &str, lists: &[&[i32]]| {
        topic(name, -1, -1, &[]).with_assignments(
            lists
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    CreatableReplicaAssignment::default()
                        .with_partition_index(i as i32)
                        .with_broker_ids(l.iter().map(|id| BrokerId(*id)).collect())
                })
                .collect(),
        )
    };
    assert_eq!(
        create(
            &mut c,
            vec![
                placed("one", &[&[0]]),
                placed("two", &[&[0], &[0]]),
                placed("elsewhere", &[&[5]]),
                placed("doubled", &[&[0, 0]]),
            ],
            false
        ),
        vec![0, 0, INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICA_ASSIGNMENT]
    );
    let m = metadata(&mut c, &["one", "two", "elsewhere"], false);
    let counts: Vec<(String, usize, i16)> = m
        .topics
        .iter()
        .map(|t| {
            let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
            (name, t.partitions.len(), t.error_code)
        })
        .collect();
    assert_eq!(
        counts,
        vec![
            ("one".to_string(), 1, 0),
            ("two".to_string(), 2, 0),
            ("elsewhere".to_string(), 0, 3)
        ]
    );
    let grow = |lists: &[&[i32]]| {
        CreatePartitionsRequest::default().with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(TopicName(s("two")))
                .with_count(2 + lists.len() as i32)
                .with_assignments(Some(
                    lists
                        .iter()
                        .map(|l| {
                            CreatePartitionsAssignment::default()
                                .with_broker_ids(l.iter().map(|id| BrokerId(*id)).collect())
                        })
                        .collect(),
                )),
        ])
    };
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &grow(&[&[7]]));
    assert_eq!(resp.results[0].error_code, INVALID_REPLICA_ASSIGNMENT);
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &grow(&[&[0], &[0]]));
    assert_eq!(resp.results[0].error_code, 0, "{resp:?}");
    let m = metadata(&mut c, &["two"], false);
    assert_eq!(m.topics[0].partitions.len(), 4);
}

/// CreatePartitions with a count of i32::MIN and a replica list: refused as
/// INVALID_PARTITIONS before any arithmetic on the count (a debug build once panicked on
/// `count - current`), and the broker goes on answering.
#[test]
fn create_partitions_with_a_count_of_i32_min_is_refused() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment;
    const INVALID_PARTITIONS: i16 = 37;
    let b = Broker::start(1, &[]);
    let mut c = b.client();
    assert_eq!(create(&mut c, vec![topic("p", 1, 1, &[])], false), vec![0]);
    for count in [i32::MIN, i32::MAX, 0] {
        let grow = CreatePartitionsRequest::default().with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(TopicName(s("p")))
                .with_count(count)
                .with_assignments(Some(vec![
                    CreatePartitionsAssignment::default().with_broker_ids(vec![BrokerId(0)]),
                ])),
        ]);
        let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &grow);
        assert_eq!(
            resp.results[0].error_code, INVALID_PARTITIONS,
            "count {count}"
        );
    }
    let mut fresh = b.client();
    let m = metadata(&mut fresh, &["p"], false);
    assert_eq!(
        m.topics[0].partitions.len(),
        1,
        "the broker answers, p unchanged"
    );
}

/// A topic named twice in one CreateTopics, DeleteTopics or CreatePartitions: every entry
/// naming it is answered INVALID_REQUEST and nothing is done for it, as Kafka answers; the
/// other topics of the request are handled.
#[test]
fn a_topic_named_twice_in_one_request_is_refused_for_each_entry() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    const INVALID_REQUEST: i16 = 42;
    let b = Broker::start(1, &[]);
    let mut c = b.client();
    let twice = vec![
        topic("d", 1, 1, &[]),
        topic("e", 1, 1, &[]),
        topic("d", 2, 1, &[]),
    ];
    assert_eq!(
        create(&mut c, twice, false),
        vec![INVALID_REQUEST, 0, INVALID_REQUEST]
    );
    let m = metadata(&mut c, &["d", "e"], false);
    let codes: Vec<i16> = m.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![3, 0], "d was not created, e was");
    let e_id = m.topics[1].topic_id;

    let grow = |name: &str, count: i32| {
        CreatePartitionsTopic::default()
            .with_name(TopicName(s(name)))
            .with_count(count)
    };
    let req = CreatePartitionsRequest::default().with_topics(vec![grow("e", 2), grow("e", 3)]);
    let resp: CreatePartitionsResponse = c.call(api::CREATE_PARTITIONS, 3, &req);
    let codes: Vec<i16> = resp.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![INVALID_REQUEST, INVALID_REQUEST]);
    assert_eq!(
        metadata(&mut c, &["e"], false).topics[0].partitions.len(),
        1
    );

    let by_name = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(s("e")), TopicName(s("e"))])
        .with_timeout_ms(5000);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 5, &by_name);
    let codes: Vec<i16> = resp.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![INVALID_REQUEST, INVALID_REQUEST]);
    let by_id = DeleteTopicsRequest::default()
        .with_topics(vec![
            DeleteTopicState::default().with_topic_id(e_id),
            DeleteTopicState::default().with_topic_id(e_id),
        ])
        .with_timeout_ms(5000);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 6, &by_id);
    let codes: Vec<i16> = resp.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![INVALID_REQUEST, INVALID_REQUEST]);
    assert_eq!(
        metadata(&mut c, &["e"], false).topics[0].error_code,
        0,
        "e is kept"
    );
}

/// AlterUserScramCredentials naming 200,000 deletions is refused as a whole
/// (INVALID_REQUEST for each) in linear time: the duplicate check once scanned the whole
/// request per entry before the size limit was looked at. The time is bounded against a
/// tenth-size request in the same run (linear: ~10 times as long, quadratic: ~100), or
/// 5 s, whichever is more.
#[test]
fn a_scram_alteration_with_200k_entries_is_refused_quickly() {
    use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialDeletion;
    const ENTRIES: usize = 200_000;
    let b = Broker::start(1, &[]);
    let mut c = b.client();
    let deletion = ScramCredentialDeletion::default()
        .with_name(s("u"))
        .with_mechanism(1);
    let small = AlterUserScramCredentialsRequest::default()
        .with_deletions(vec![deletion.clone(); ENTRIES / 10]);
    let started = std::time::Instant::now();
    let resp: AlterUserScramCredentialsResponse =
        c.call(api::ALTER_USER_SCRAM_CREDENTIALS, 0, &small);
    let base = started.elapsed();
    assert_eq!(resp.results.len(), ENTRIES / 10);
    let req = AlterUserScramCredentialsRequest::default().with_deletions(vec![deletion; ENTRIES]);
    let started = std::time::Instant::now();
    let resp: AlterUserScramCredentialsResponse =
        c.call(api::ALTER_USER_SCRAM_CREDENTIALS, 0, &req);
    let took = started.elapsed();
    assert_eq!(resp.results.len(), ENTRIES);
    assert!(
        resp.results.iter().all(|r| r.error_code == 42),
        "INVALID_REQUEST"
    );
    let bound = std::time::Duration::from_secs(5).max(base * 30);
    assert!(
        took < bound,
        "answered in {took:?} ({} entries: {base:?})",
        ENTRIES / 10
    );
}

/// IncrementalAlterConfigs APPEND / SUBTRACT on a list key start from the value in force,
/// the broker default when the topic has no override, as in Kafka: APPEND compact to a
/// topic that deletes by time makes it `delete,compact`, not `compact` (which would stop
/// time retention without anyone asking).
#[test]
fn append_to_cleanup_policy_starts_from_the_default() {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let broker = Broker::start(1, &[]);
    let mut c = broker.client();
    assert_eq!(create(&mut c, vec![topic("ap", 1, 1, &[])], false), vec![0]);
    let alter = |c: &mut common::Client, op: i8, value: &str| -> i16 {
        let resource = AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(s("ap"))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(s("cleanup.policy"))
                    .with_config_operation(op)
                    .with_value(Some(s(value))),
            ]);
        let resp: IncrementalAlterConfigsResponse = c.call(
            api::INCREMENTAL_ALTER_CONFIGS,
            1,
            &IncrementalAlterConfigsRequest::default().with_resources(vec![resource]),
        );
        resp.responses[0].error_code
    };
    assert_eq!(alter(&mut c, 2, "compact"), 0);
    let policy = config_of(&describe_topic(&mut c, "ap"), "cleanup.policy").0;
    assert_eq!(policy, "delete,compact");
    assert_eq!(alter(&mut c, 3, "delete"), 0);
    let policy = config_of(&describe_topic(&mut c, "ap"), "cleanup.policy").0;
    assert_eq!(policy, "compact");
}

/// IncrementalAlterConfigs SET on one key.
fn set_config(c: &mut common::Client, topic: &str, key: &str, value: &str) -> i16 {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let resource = AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(s(topic))
        .with_configs(vec![
            AlterableConfig::default()
                .with_name(s(key))
                .with_config_operation(0)
                .with_value(Some(s(value))),
        ]);
    let resp: IncrementalAlterConfigsResponse = c.call(
        api::INCREMENTAL_ALTER_CONFIGS,
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![resource]),
    );
    resp.responses[0].error_code
}

/// Two clients changing different keys of one topic at once, through two shards, both
/// keep their change: each is applied only to the overrides it was computed from, and
/// computed again when the other came first (before, the later whole-map write undid the
/// earlier key).
#[test]
fn concurrent_changes_of_different_keys_both_hold() {
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    assert_eq!(
        create(&mut c, vec![topic("both", 1, 1, &[])], false),
        vec![0]
    );
    let clients: Vec<_> = (0..2).map(|_| broker.client()).collect();
    let mut clients = clients.into_iter();
    let (mut a, mut b) = (clients.next().unwrap(), clients.next().unwrap());
    for round in 0..40 {
        let (ms, bytes) = (
            format!("{}", 3_600_000 + round),
            format!("{}", 1_000_000 + round),
        );
        let ms2 = ms.clone();
        let t = std::thread::spawn(move || {
            let code = set_config(&mut a, "both", "retention.ms", &ms2);
            (a, code)
        });
        let code_b = set_config(&mut b, "both", "retention.bytes", &bytes);
        let (back, code_a) = t.join().expect("thread");
        a = back;
        assert_eq!((code_a, code_b), (0, 0), "round {round}");
        let described = describe_topic(&mut c, "both");
        assert_eq!(config_of(&described, "retention.ms").0, ms, "round {round}");
        assert_eq!(
            config_of(&described, "retention.bytes").0,
            bytes,
            "round {round}"
        );
    }
}

/// DescribeConfigs names every listener, each by its own name, in `listeners` and
/// `advertised.listeners` (it gave the first one only, always as PLAINTEXT).
#[test]
fn describe_configs_lists_every_listener() {
    let broker = Broker::start(
        1,
        &[
            ("listeners", "PLAINTEXT://127.0.0.1:0,CLIENT://127.0.0.1:0"),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT",
            ),
            ("advertised.listeners", "CLIENT://client.example:9999"),
        ],
    );
    let mut c = broker.client();
    let keys = ["listeners", "advertised.listeners"].map(s);
    let res = DescribeConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(s("0"))
        .with_configuration_keys(Some(keys.to_vec()));
    let resp: DescribeConfigsResponse = c.call(
        api::DESCRIBE_CONFIGS,
        4,
        &DescribeConfigsRequest::default().with_resources(vec![res]),
    );
    let value = |k: &str| {
        resp.results[0]
            .configs
            .iter()
            .find(|e| e.name.as_str() == k)
            .and_then(|e| e.value.as_ref().map(|v| v.to_string()))
            .unwrap_or_default()
    };
    let listeners = value("listeners");
    assert!(
        listeners.starts_with("PLAINTEXT://127.0.0.1:")
            && listeners.contains(",CLIENT://127.0.0.1:"),
        "{listeners}"
    );
    let advertised = value("advertised.listeners");
    assert_eq!(
        advertised,
        format!(
            "PLAINTEXT://127.0.0.1:{},CLIENT://client.example:9999",
            broker.port
        )
    );
}

/// `delete.topic.enable=false` (an operator's guard against deleting data): DeleteTopics
/// is refused for every topic named, with TOPIC_DELETION_DISABLED, and the topic stays.
#[test]
fn delete_topic_enable_false_refuses_every_deletion() {
    let broker = Broker::start(1, &[("delete.topic.enable", "false")]);
    let mut c = broker.client();
    let t = CreatableTopic::default()
        .with_name(TopicName(s("kept")))
        .with_num_partitions(1)
        .with_replication_factor(1);
    assert_eq!(create(&mut c, vec![t], false), vec![0]);
    let del = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(s("kept")), TopicName(s("absent"))]);
    let resp: DeleteTopicsResponse = c.call(api::DELETE_TOPICS, 5, &del);
    let codes: Vec<i16> = resp.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![73, 73], "TOPIC_DELETION_DISABLED for each");
    let md = metadata(&mut c, &["kept"], false);
    assert_eq!(md.topics[0].error_code, 0, "the topic is still there");
}
