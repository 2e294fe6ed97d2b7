//! Every advertised version of every API this broker serves gets a decodable answer (no
//! encode failure that would close the connection), checked against a real `weir serve`
//! with a topic that has data, so the answers carry real partitions and records.

mod common;

use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use wire::api;

fn name() -> TopicName {
    TopicName(StrBytes::from_static_str("v"))
}

/// Sends `req` at every advertised version of `key` and decodes each answer.
fn every_version<R: Encodable, P: Decodable>(
    c: &mut Client,
    key: i16,
    req: impl Fn(i16) -> R,
) -> usize {
    let entry = api::lookup(key).expect("known key");
    assert!(weir::proto::is_served_key(key), "{} is served", entry.name);
    // kafka-protocol encodes Produce from v3 only; v0–v2 are checked by `old_produce_versions`.
    let min = if key == api::PRODUCE {
        3
    } else {
        entry.min_version
    };
    for v in min..=entry.max_version {
        let sent = c.send(key, v, &req(v));
        let frame = c
            .read_frame()
            .unwrap_or_else(|| panic!("{} v{v}: connection closed", entry.name));
        let (got, _): (i32, P) = wire::messages::decode_response_as(key, v, &frame)
            .unwrap_or_else(|e| panic!("{} v{v}: undecodable answer: {e}", entry.name));
        assert_eq!(got, sent, "{} v{v}", entry.name);
    }
    usize::try_from(entry.max_version - min + 1).expect("count")
}

/// Produce v0–v2 (advertised for old librdkafka's feature checks; they carry message
/// formats weir does not store): answered, per partition, UNSUPPORTED_FOR_MESSAGE_FORMAT.
fn old_produce_versions(c: &mut Client) -> usize {
    use std::io::Write;
    use wire::produce::{ProducePartition, ProduceRequestView, ProduceTopic};
    let mut n = 0;
    for v in 0..3 {
        let view = ProduceRequestView {
            version: v,
            transactional_id: None,
            acks: 1,
            timeout_ms: 1000,
            topics: vec![ProduceTopic {
                name: bytes::Bytes::from_static(b"v"),
                partitions: vec![ProducePartition {
                    index: 0,
                    records: Some(batch(&[b"old"], 5)),
                }],
            }],
        };
        let mut body = bytes::BytesMut::new();
        view.encode_body(&mut body);
        let mut frame = Vec::new();
        frame.extend_from_slice(&0i16.to_be_bytes());
        frame.extend_from_slice(&v.to_be_bytes());
        frame.extend_from_slice(&(100 + i32::from(v)).to_be_bytes());
        frame.extend_from_slice(&[0xff, 0xff]);
        frame.extend_from_slice(&body);
        c.stream
            .write_all(&common::raw_frame(&frame))
            .expect("write");
        let resp = c
            .read_frame()
            .unwrap_or_else(|| panic!("Produce v{v}: connection closed"));
        assert_eq!(
            &resp[..4],
            &(100 + i32::from(v)).to_be_bytes()[..],
            "Produce v{v}"
        );
        // topics[1] name "v" partitions[1] index 0, then the error code.
        let code_at = 4 + 4 + 2 + 1 + 4 + 4;
        assert_eq!(
            &resp[code_at..code_at + 2],
            &43i16.to_be_bytes()[..],
            "Produce v{v}: error"
        );
        n += 1;
    }
    n
}

#[test]
fn every_served_api_answers_at_every_advertised_version() {
    let broker = Broker::start(2, &[]);
    let mut c = broker.client();
    let topic = CreatableTopic::default()
        .with_name(name())
        .with_num_partitions(2)
        .with_replication_factor(1);
    let _: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default().with_topics(vec![topic]),
    );
    let mut answered = 0;

    answered += old_produce_versions(&mut c);
    answered += every_version::<_, ProduceResponse>(&mut c, api::PRODUCE, |_| {
        let p = PartitionProduceData::default()
            .with_index(0)
            .with_records(Some(batch(&[b"x", b"y"], 5)));
        ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(1000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(name())
                    .with_partition_data(vec![p]),
            ])
    });
    answered += every_version::<_, FetchResponse>(&mut c, api::FETCH, |_| {
        let p = FetchPartition::default()
            .with_partition(0)
            .with_fetch_offset(0)
            .with_partition_max_bytes(1 << 20);
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(name())
                    .with_partitions(vec![p]),
            ])
    });
    answered += every_version::<_, ListOffsetsResponse>(&mut c, api::LIST_OFFSETS, |_| {
        let ps = [-2, -1, 0]
            .iter()
            .enumerate()
            .map(|(i, ts)| {
                ListOffsetsPartition::default()
                    .with_partition_index(i as i32 % 2)
                    .with_timestamp(*ts)
            })
            .collect();
        ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(name())
                    .with_partitions(ps),
            ])
    });
    answered += every_version::<_, MetadataResponse>(&mut c, api::METADATA, |_| {
        MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name())),
        ]))
    });
    answered += every_version::<_, ApiVersionsResponse>(&mut c, api::API_VERSIONS, |_| {
        ApiVersionsRequest::default()
    });
    answered += every_version::<_, CreateTopicsResponse>(&mut c, api::CREATE_TOPICS, |v| {
        let t = CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(format!("ct{v}"))))
            .with_num_partitions(1)
            .with_replication_factor(1);
        CreateTopicsRequest::default().with_topics(vec![
            t,
            CreatableTopic::default()
                .with_name(name())
                .with_num_partitions(1)
                .with_replication_factor(1),
        ])
    });
    answered += every_version::<_, DeleteTopicsResponse>(&mut c, api::DELETE_TOPICS, |v| {
        let t = TopicName(StrBytes::from_string(format!("ct{}", v + 1)));
        if v >= 6 {
            DeleteTopicsRequest::default().with_topics(vec![
                kafka_protocol::messages::delete_topics_request::DeleteTopicState::default()
                    .with_name(Some(t)),
            ])
        } else {
            DeleteTopicsRequest::default().with_topic_names(vec![t])
        }
    });
    answered += every_version::<_, DeleteRecordsResponse>(&mut c, api::DELETE_RECORDS, |_| {
        use kafka_protocol::messages::delete_records_request::{
            DeleteRecordsPartition, DeleteRecordsTopic,
        };
        DeleteRecordsRequest::default().with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(name())
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(1)
                        .with_offset(0),
                ]),
        ])
    });
    answered += every_version::<_, DescribeConfigsResponse>(&mut c, api::DESCRIBE_CONFIGS, |_| {
        let r = |t: i8, n: &str| {
            DescribeConfigsResource::default()
                .with_resource_type(t)
                .with_resource_name(StrBytes::from_string(n.into()))
        };
        DescribeConfigsRequest::default().with_resources(vec![
            r(2, "v"),
            r(4, "0"),
            r(2, "missing"),
        ])
    });
    answered += every_version::<_, AlterConfigsResponse>(&mut c, api::ALTER_CONFIGS, |_| {
        use kafka_protocol::messages::alter_configs_request::{
            AlterConfigsResource, AlterableConfig,
        };
        let cfg = AlterableConfig::default()
            .with_name(StrBytes::from_static_str("retention.ms"))
            .with_value(Some(StrBytes::from_static_str("100000")));
        AlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_static_str("v"))
                .with_configs(vec![cfg]),
        ])
    });
    answered += every_version::<_, CreatePartitionsResponse>(&mut c, api::CREATE_PARTITIONS, |v| {
        use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
        CreatePartitionsRequest::default().with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(name())
                .with_count(3 + i32::from(v)),
        ])
    });
    answered += every_version::<_, IncrementalAlterConfigsResponse>(
        &mut c,
        api::INCREMENTAL_ALTER_CONFIGS,
        |_| {
            use kafka_protocol::messages::incremental_alter_configs_request::{
                AlterConfigsResource, AlterableConfig,
            };
            let cfg = AlterableConfig::default()
                .with_name(StrBytes::from_static_str("cleanup.policy"))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_static_str("delete")));
            IncrementalAlterConfigsRequest::default().with_resources(vec![
                AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_static_str("v"))
                    .with_configs(vec![cfg]),
            ])
        },
    );
    answered += every_version::<_, DescribeClusterResponse>(&mut c, api::DESCRIBE_CLUSTER, |_| {
        DescribeClusterRequest::default()
    });
    answered += transaction_apis(&mut c);
    answered += every_version::<_, OffsetForLeaderEpochResponse>(
        &mut c,
        api::OFFSET_FOR_LEADER_EPOCH,
        |_| {
            use kafka_protocol::messages::offset_for_leader_epoch_request::{
                OffsetForLeaderPartition, OffsetForLeaderTopic,
            };
            let p = OffsetForLeaderPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(0)
                .with_leader_epoch(0);
            OffsetForLeaderEpochRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![
                    OffsetForLeaderTopic::default()
                        .with_topic(name())
                        .with_partitions(vec![p]),
                ])
        },
    );
    // On a PLAINTEXT listener the SASL APIs answer ILLEGAL_SASL_STATE (as Kafka's do).
    answered += every_version::<_, SaslHandshakeResponse>(&mut c, api::SASL_HANDSHAKE, |_| {
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"))
    });
    answered +=
        every_version::<_, SaslAuthenticateResponse>(&mut c, api::SASL_AUTHENTICATE, |_| {
            SaslAuthenticateRequest::default()
        });
    answered += every_version::<_, AlterUserScramCredentialsResponse>(
        &mut c,
        api::ALTER_USER_SCRAM_CREDENTIALS,
        |_| {
            use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
            AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                ScramCredentialUpsertion::default()
                    .with_name(StrBytes::from_static_str("alice"))
                    .with_mechanism(2)
                    .with_iterations(4096)
                    .with_salt(bytes::Bytes::from_static(b"salt"))
                    .with_salted_password(bytes::Bytes::from_static(&[7; 64])),
            ])
        },
    );
    answered += every_version::<_, DescribeUserScramCredentialsResponse>(
        &mut c,
        api::DESCRIBE_USER_SCRAM_CREDENTIALS,
        |_| DescribeUserScramCredentialsRequest::default(),
    );
    answered += replica_apis_every_version(&mut c);
    assert!(answered >= 60, "{answered} (api, version) pairs answered");
}

/// The transaction APIs, for a transactional id the coordinator does not know (error
/// answers, but decodable ones at every version).
fn transaction_apis(c: &mut Client) -> usize {
    let txn = || TransactionalId(StrBytes::from_static_str("versions-txn"));
    let mut n = 0;
    n += every_version::<_, AddPartitionsToTxnResponse>(c, api::ADD_PARTITIONS_TO_TXN, |v| {
        use kafka_protocol::messages::add_partitions_to_txn_request::{
            AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
        };
        let topics = vec![
            AddPartitionsToTxnTopic::default()
                .with_name(name())
                .with_partitions(vec![0]),
        ];
        if v >= 4 {
            // KIP-890's inter-broker batch.
            let t = AddPartitionsToTxnTransaction::default()
                .with_transactional_id(txn())
                .with_producer_id(7.into())
                .with_verify_only(true)
                .with_topics(topics);
            return AddPartitionsToTxnRequest::default().with_transactions(vec![t]);
        }
        AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(txn())
            .with_v3_and_below_producer_id(7.into())
            .with_v3_and_below_topics(topics)
    });
    n += every_version::<_, AddOffsetsToTxnResponse>(c, api::ADD_OFFSETS_TO_TXN, |_| {
        AddOffsetsToTxnRequest::default()
            .with_transactional_id(txn())
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
    });
    n += every_version::<_, EndTxnResponse>(c, api::END_TXN, |_| {
        EndTxnRequest::default().with_transactional_id(txn())
    });
    n += every_version::<_, TxnOffsetCommitResponse>(c, api::TXN_OFFSET_COMMIT, |_| {
        TxnOffsetCommitRequest::default()
            .with_transactional_id(txn())
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_generation_id(-1)
    });
    n += every_version::<_, WriteTxnMarkersResponse>(c, api::WRITE_TXN_MARKERS, |_| {
        WriteTxnMarkersRequest::default()
    });
    n += every_version::<_, DescribeTransactionsResponse>(c, api::DESCRIBE_TRANSACTIONS, |_| {
        DescribeTransactionsRequest::default().with_transactional_ids(vec![txn()])
    });
    n += every_version::<_, ListTransactionsResponse>(c, api::LIST_TRANSACTIONS, |_| {
        ListTransactionsRequest::default()
    });
    n
}

/// The replica admin APIs (api/replicas.rs) at every advertised version.
fn replica_apis_every_version(c: &mut Client) -> usize {
    let mut answered =
        every_version::<_, DescribeLogDirsResponse>(c, api::DESCRIBE_LOG_DIRS, |_| {
            DescribeLogDirsRequest::default().with_topics(None)
        });
    answered +=
        every_version::<_, AlterReplicaLogDirsResponse>(c, api::ALTER_REPLICA_LOG_DIRS, |_| {
            AlterReplicaLogDirsRequest::default()
        });
    answered += every_version::<_, ElectLeadersResponse>(c, api::ELECT_LEADERS, |_| {
        use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
        ElectLeadersRequest::default().with_topic_partitions(Some(vec![
            TopicPartitions::default()
                .with_topic(name())
                .with_partitions(vec![0]),
        ]))
    });
    answered += every_version::<_, AlterPartitionReassignmentsResponse>(
        c,
        api::ALTER_PARTITION_REASSIGNMENTS,
        |_| AlterPartitionReassignmentsRequest::default(),
    );
    answered += every_version::<_, ListPartitionReassignmentsResponse>(
        c,
        api::LIST_PARTITION_REASSIGNMENTS,
        |_| ListPartitionReassignmentsRequest::default(),
    );
    answered
}
