//! Property-based round trips for every API and version weir advertises.
//!
//! - Every (api key, version) in the table: request and response bodies built from
//!   plausible tokens are decoded; whatever decodes must re-encode and decode to the same
//!   value (and never panic). Default messages round-trip exactly.
//! - The hand-written hot path against kafka-protocol as the oracle: the Produce view parses
//!   what kafka-protocol encodes (and the reverse) for every Produce version; the chunked
//!   Fetch encoder writes byte-for-byte what kafka-protocol writes for every Fetch version.
//! - Rich generated Metadata and ApiVersions messages round-trip at every version.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use uuid::Uuid;
use wire::api::{self, API_TABLE};
use wire::fetch::{
    AbortedTransaction, CurrentLeader, DivergingEpoch, FetchPartitionResponse, FetchResponseParts,
    FetchTopicResponse, NodeEndpoint, concat_chunks, encode_fetch_response,
};
use wire::messages::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FetchResponse, MetadataRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, RequestKind, ResponseKind, TopicName,
    fetch_response, metadata_request, metadata_response, produce_request,
};
use wire::messages::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use wire::messages::{self, decode_response_as};
use wire::produce::{
    ProducePartition, ProducePartitionResponse, ProduceRequestView, ProduceResponseParts,
    ProduceTopic, ProduceTopicResponse, encode_produce_response,
};

/// Plausible protocol tokens: small integers of each width, short strings in both encodings,
/// small varints. Concatenations of these decode as real messages far more often than
/// uniform random bytes.
fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0i16..4).prop_map(|v| v.to_be_bytes().to_vec()),
        (-1i32..4).prop_map(|v| v.to_be_bytes().to_vec()),
        (0i64..4).prop_map(|v| v.to_be_bytes().to_vec()),
        Just(vec![0u8]),
        (0u8..4).prop_map(|v| vec![v]),
        "[a-z]{0,6}".prop_map(|s| {
            let mut v = (s.len() as i16).to_be_bytes().to_vec();
            v.extend_from_slice(s.as_bytes());
            v
        }),
        "[a-z]{0,6}".prop_map(|s| {
            let mut v = vec![s.len() as u8 + 1];
            v.extend_from_slice(s.as_bytes());
            v
        }),
    ]
}

fn body() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(token(), 0..24).prop_map(|ts| Bytes::from(ts.concat()))
}

fn all_versions() -> impl Iterator<Item = (i16, i16)> {
    API_TABLE
        .iter()
        .flat_map(|e| (e.min_version..=e.max_version).map(move |v| (e.key, v)))
}

fn request_reencodes(key: i16, version: i16, body: Bytes) {
    let Ok(first) = messages::decode_request(key, version, body) else {
        return;
    };
    let mut out = BytesMut::new();
    first
        .encode(&mut out, version)
        .expect("a decoded request re-encodes");
    let again = messages::decode_request(key, version, out.freeze()).expect("re-decodes");
    assert_eq!(again, first, "key {key} v{version}");
}

fn response_reencodes(key: i16, version: i16, body: Bytes) {
    let api_key = ApiKey::try_from(key).expect("known key");
    let mut b = body;
    let Ok(first) = ResponseKind::decode(api_key, &mut b, version) else {
        return;
    };
    let mut out = BytesMut::new();
    first
        .encode(&mut out, version)
        .expect("a decoded response re-encodes");
    let mut out = out.freeze();
    let again = ResponseKind::decode(api_key, &mut out, version).expect("re-decodes");
    assert_eq!(again, first, "key {key} v{version}");
}

#[test]
fn default_messages_roundtrip_at_every_advertised_version() {
    for (key, version) in all_versions() {
        let api_key = ApiKey::try_from(key).expect("known key");
        // An empty-bodied default: decode from the bytes kafka-protocol itself produces.
        let mut zero = Bytes::from(vec![0u8; 64]);
        if let Ok(req) = RequestKind::decode(api_key, &mut zero, version) {
            let mut out = BytesMut::new();
            req.encode(&mut out, version).expect("encodes");
            request_reencodes(key, version, out.freeze());
        }
        let mut zero = Bytes::from(vec![0u8; 64]);
        if let Ok(resp) = ResponseKind::decode(api_key, &mut zero, version) {
            let mut out = BytesMut::new();
            resp.encode(&mut out, version).expect("encodes");
            response_reencodes(key, version, out.freeze());
        }
    }
}

/// Found by `every_advertised_request_reencodes`: a tagged field numbered 2^31 or more
/// used to decode (its tag cast to a negative i32) and then be left out when encoding, so
/// the re-encoded body named one field more than it held. Such a tag is refused now.
#[test]
fn a_tag_past_i32_is_refused_not_dropped() {
    // ListGroups v3: one tagged field, tag 2^31 (varint 80 80 80 80 08), empty value.
    let body = Bytes::from_static(&[0x01, 0x80, 0x80, 0x80, 0x80, 0x08, 0x00]);
    assert!(messages::decode_request(16, 3, body).is_err());
    // The largest tag that fits still round-trips.
    let body = Bytes::from_static(&[0x01, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00]);
    request_reencodes(16, 3, body.clone());
    assert!(messages::decode_request(16, 3, body).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_advertised_request_reencodes(body in body()) {
        for (key, version) in all_versions() {
            request_reencodes(key, version, body.clone());
        }
    }

    #[test]
    fn every_advertised_response_reencodes(body in body()) {
        for (key, version) in all_versions() {
            response_reencodes(key, version, body.clone());
        }
    }
}

// ---- Produce: the hand-written view against kafka-protocol ----

fn produce_view(version: i16) -> impl Strategy<Value = ProduceRequestView> {
    let partition = (
        any::<i32>(),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..64)),
    )
        .prop_map(|(index, records)| ProducePartition {
            index,
            records: records.map(Bytes::from),
        });
    let topic = (
        "[a-zA-Z0-9._-]{1,20}",
        prop::collection::vec(partition, 0..4),
    )
        .prop_map(|(name, partitions)| ProduceTopic {
            name: Bytes::from(name),
            partitions,
        });
    (
        prop::option::of("[a-z0-9-]{0,12}"),
        prop_oneof![Just(-1i16), Just(0), Just(1)],
        any::<i32>(),
        prop::collection::vec(topic, 0..4),
    )
        .prop_map(move |(tx, acks, timeout_ms, topics)| ProduceRequestView {
            version,
            transactional_id: tx.map(Bytes::from),
            acks,
            timeout_ms,
            topics,
        })
}

fn to_kafka_protocol(view: &ProduceRequestView) -> ProduceRequest {
    let topics = view
        .topics
        .iter()
        .map(|t| {
            let name = StrBytes::from_utf8(t.name.clone()).expect("generated names are utf-8");
            produce_request::TopicProduceData::default()
                .with_name(TopicName(name))
                .with_partition_data(
                    t.partitions
                        .iter()
                        .map(|p| {
                            produce_request::PartitionProduceData::default()
                                .with_index(p.index)
                                .with_records(p.records.clone())
                        })
                        .collect(),
                )
        })
        .collect();
    ProduceRequest::default()
        .with_transactional_id(view.transactional_id.clone().map(|t| {
            wire::messages::kafka_protocol::messages::TransactionalId(
                StrBytes::from_utf8(t).expect("utf-8"),
            )
        }))
        .with_acks(view.acks)
        .with_timeout_ms(view.timeout_ms)
        .with_topic_data(topics)
}

/// Produce versions kafka-protocol also speaks (v3+); v0–v2 are weir's alone.
fn produce_case() -> impl Strategy<Value = ProduceRequestView> {
    let e = api::lookup(api::PRODUCE).expect("listed");
    (e.min_version.max(3)..=e.max_version).prop_flat_map(produce_view)
}

fn produce_old_case() -> impl Strategy<Value = ProduceRequestView> {
    (0i16..=2).prop_flat_map(produce_view).prop_map(|mut v| {
        v.transactional_id = None; // not in v0–v2
        v
    })
}

fn produce_response_case() -> impl Strategy<Value = (i16, ProduceResponseParts)> {
    let partition = (
        any::<i32>(),
        any::<i16>(),
        (any::<i64>(), any::<i64>(), any::<i64>()),
        prop::collection::vec((any::<i32>(), prop::option::of("[a-z ]{0,10}")), 0..2),
        prop::option::of("[a-z ]{0,10}"),
    )
        .prop_map(|(index, error_code, (base, append, start), errs, msg)| {
            ProducePartitionResponse {
                index,
                error_code,
                base_offset: base,
                log_append_time_ms: append,
                log_start_offset: start,
                record_errors: errs
                    .into_iter()
                    .map(|(i, m)| (i, m.map(Bytes::from)))
                    .collect(),
                error_message: msg.map(Bytes::from),
            }
        });
    let topic = ("[a-z0-9._-]{1,16}", prop::collection::vec(partition, 0..3)).prop_map(
        |(name, partitions)| ProduceTopicResponse {
            name: Bytes::from(name),
            partitions,
        },
    );
    (3i16..=9, prop::collection::vec(topic, 0..3), any::<i32>()).prop_map(
        |(version, topics, throttle_time_ms)| {
            (
                version,
                ProduceResponseParts {
                    topics,
                    throttle_time_ms,
                },
            )
        },
    )
}

/// The same response as kafka-protocol's type, with only the fields `version` carries.
fn produce_response_to_kp(parts: &ProduceResponseParts, version: i16) -> ProduceResponse {
    use wire::messages::kafka_protocol::messages::produce_response;
    let topics = parts
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let mut r = produce_response::PartitionProduceResponse::default()
                        .with_index(p.index)
                        .with_error_code(p.error_code)
                        .with_base_offset(p.base_offset)
                        .with_log_append_time_ms(p.log_append_time_ms);
                    if version >= 5 {
                        r = r.with_log_start_offset(p.log_start_offset);
                    }
                    if version >= 8 {
                        let errs = p
                            .record_errors
                            .iter()
                            .map(|(i, m)| {
                                produce_response::BatchIndexAndErrorMessage::default()
                                    .with_batch_index(*i)
                                    .with_batch_index_error_message(
                                        m.clone().map(|m| StrBytes::from_utf8(m).expect("utf-8")),
                                    )
                            })
                            .collect();
                        r = r.with_record_errors(errs).with_error_message(
                            p.error_message
                                .clone()
                                .map(|m| StrBytes::from_utf8(m).expect("utf-8")),
                        );
                    }
                    r
                })
                .collect();
            produce_response::TopicProduceResponse::default()
                .with_name(TopicName(
                    StrBytes::from_utf8(t.name.clone()).expect("utf-8"),
                ))
                .with_partition_responses(partitions)
        })
        .collect();
    ProduceResponse::default()
        .with_responses(topics)
        .with_throttle_time_ms(parts.throttle_time_ms)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn produce_view_reads_what_kafka_protocol_writes(view in produce_case()) {
        let mut out = BytesMut::new();
        to_kafka_protocol(&view).encode(&mut out, view.version).expect("encodes");
        let body = out.freeze();
        let parsed = ProduceRequestView::parse(&body, view.version).expect("parses");
        prop_assert_eq!(&parsed, &view);
    }

    #[test]
    fn produce_view_roundtrips_v0_to_v2(view in produce_old_case()) {
        let mut out = BytesMut::new();
        view.encode_body(&mut out);
        let body = out.freeze();
        let parsed = ProduceRequestView::parse(&body, view.version).expect("parses");
        prop_assert_eq!(&parsed, &view);
    }

    #[test]
    fn produce_response_matches_kafka_protocol_bytes((version, parts) in produce_response_case()) {
        let ours = encode_produce_response(3, version, &parts).expect("encodes");
        let expected = produce_response_to_kp(&parts, version);
        let theirs = messages::encode_response(3, api::PRODUCE, version, &expected).expect("encodes");
        prop_assert_eq!(ours, theirs);
    }

    #[test]
    fn kafka_protocol_reads_what_produce_view_writes(view in produce_case()) {
        let mut out = BytesMut::new();
        view.encode_body(&mut out);
        let mut body = out.freeze();
        let decoded = ProduceRequest::decode(&mut body, view.version).expect("decodes");
        prop_assert_eq!(decoded, to_kafka_protocol(&view));
        prop_assert!(body.is_empty());
    }
}

// ---- Fetch: the chunked encoder against kafka-protocol ----

fn fetch_partition() -> impl Strategy<Value = FetchPartitionResponse> {
    (
        any::<i32>(),
        any::<i16>(),
        (any::<i64>(), any::<i64>(), any::<i64>()),
        prop::option::of(prop::collection::vec(
            (any::<i64>(), any::<i64>()).prop_map(|(producer_id, first_offset)| {
                AbortedTransaction {
                    producer_id,
                    first_offset,
                }
            }),
            0..3,
        )),
        any::<i32>(),
        prop::option::of(prop::collection::vec(
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from),
            0..3,
        )),
        prop::option::of((-1i32..1000, -1i64..1_000_000)),
        prop::option::of((-1i32..5, -1i32..1000)),
    )
        .prop_map(
            |(index, err, (hw, lso, lstart), aborted, replica, records, div, leader)| {
                FetchPartitionResponse {
                    partition_index: index,
                    error_code: err,
                    high_watermark: hw,
                    last_stable_offset: lso,
                    log_start_offset: lstart,
                    aborted_transactions: aborted,
                    preferred_read_replica: replica,
                    records,
                    diverging_epoch: div
                        .map(|(epoch, end_offset)| DivergingEpoch { epoch, end_offset }),
                    current_leader: leader.map(|(leader_id, leader_epoch)| CurrentLeader {
                        leader_id,
                        leader_epoch,
                    }),
                }
            },
        )
}

fn fetch_parts() -> impl Strategy<Value = FetchResponseParts> {
    let topic = (
        "[a-z0-9._-]{1,16}",
        any::<u128>(),
        prop::collection::vec(fetch_partition(), 0..3),
    )
        .prop_map(|(name, topic_id, partitions)| FetchTopicResponse {
            topic: Bytes::from(name),
            topic_id,
            partitions,
        });
    let node = (
        any::<i32>(),
        "[a-z0-9.-]{0,20}",
        any::<i32>(),
        prop::option::of("[a-z0-9-]{0,8}"),
    )
        .prop_map(|(node_id, host, port, rack)| NodeEndpoint {
            node_id,
            host: Bytes::from(host),
            port,
            rack: rack.map(Bytes::from),
        });
    (
        any::<i32>(),
        any::<i16>(),
        any::<i32>(),
        prop::collection::vec(topic, 0..3),
        prop::collection::vec(node, 0..3),
    )
        .prop_map(
            |(throttle, err, session, topics, nodes)| FetchResponseParts {
                throttle_time_ms: throttle,
                error_code: err,
                session_id: session,
                topics,
                node_endpoints: nodes,
            },
        )
}

/// The same response as kafka-protocol's type, with only the fields `version` carries.
fn fetch_to_kafka_protocol(parts: &FetchResponseParts, version: i16) -> FetchResponse {
    let topics = parts
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| fetch_partition_to_kp(p, version))
                .collect();
            let t2 = fetch_response::FetchableTopicResponse::default().with_partitions(partitions);
            if version >= 13 {
                t2.with_topic_id(Uuid::from_u128(t.topic_id))
            } else {
                t2.with_topic(TopicName(
                    StrBytes::from_utf8(t.topic.clone()).expect("utf-8"),
                ))
            }
        })
        .collect();
    let mut resp = FetchResponse::default()
        .with_throttle_time_ms(parts.throttle_time_ms)
        .with_responses(topics);
    if version >= 16 {
        resp = resp.with_node_endpoints(
            parts
                .node_endpoints
                .iter()
                .map(|n| {
                    fetch_response::NodeEndpoint::default()
                        .with_node_id(wire::messages::kafka_protocol::messages::BrokerId(
                            n.node_id,
                        ))
                        .with_host(StrBytes::from_utf8(n.host.clone()).expect("utf-8"))
                        .with_port(n.port)
                        .with_rack(
                            n.rack
                                .clone()
                                .map(|r| StrBytes::from_utf8(r).expect("utf-8")),
                        )
                })
                .collect(),
        );
    }
    if version >= 7 {
        resp = resp
            .with_error_code(parts.error_code)
            .with_session_id(parts.session_id);
    }
    resp
}

fn fetch_partition_to_kp(
    p: &FetchPartitionResponse,
    version: i16,
) -> fetch_response::PartitionData {
    let records = p.records.as_ref().map(|list| concat_chunks(list));
    let aborted = p.aborted_transactions.as_ref().map(|list| {
        list.iter()
            .map(|a| {
                fetch_response::AbortedTransaction::default()
                    .with_producer_id(wire::messages::kafka_protocol::messages::ProducerId(
                        a.producer_id,
                    ))
                    .with_first_offset(a.first_offset)
            })
            .collect()
    });
    let mut d = fetch_response::PartitionData::default()
        .with_partition_index(p.partition_index)
        .with_error_code(p.error_code)
        .with_high_watermark(p.high_watermark)
        .with_last_stable_offset(p.last_stable_offset)
        .with_aborted_transactions(aborted)
        .with_records(records);
    if version >= 5 {
        d = d.with_log_start_offset(p.log_start_offset);
    }
    if version >= 11 {
        d = d.with_preferred_read_replica(wire::messages::kafka_protocol::messages::BrokerId(
            p.preferred_read_replica,
        ));
    }
    if version >= 12
        && let Some(div) = p.diverging_epoch
    {
        d = d.with_diverging_epoch(
            fetch_response::EpochEndOffset::default()
                .with_epoch(div.epoch)
                .with_end_offset(div.end_offset),
        );
    }
    if version >= 12
        && let Some(l) = p.current_leader
    {
        d = d.with_current_leader(
            fetch_response::LeaderIdAndEpoch::default()
                .with_leader_id(wire::messages::kafka_protocol::messages::BrokerId(
                    l.leader_id,
                ))
                .with_leader_epoch(l.leader_epoch),
        );
    }
    d
}

fn fetch_case() -> impl Strategy<Value = (i16, FetchResponseParts)> {
    let e = api::lookup(api::FETCH).expect("listed");
    (e.min_version..=e.max_version, fetch_parts())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fetch_encoder_matches_kafka_protocol_bytes((version, parts) in fetch_case()) {
        let chunks = encode_fetch_response(11, version, &parts).expect("encodes");
        let ours = concat_chunks(&chunks);
        let expected = fetch_to_kafka_protocol(&parts, version);
        let theirs = messages::encode_response(11, api::FETCH, version, &expected).expect("encodes");
        prop_assert_eq!(&ours, &theirs);
        let (corr, decoded) =
            decode_response_as::<FetchResponse>(api::FETCH, version, &ours.slice(4..)).expect("decodes");
        prop_assert_eq!(corr, 11);
        prop_assert_eq!(decoded, expected);
    }
}

// ---- Metadata and ApiVersions: rich messages at every version ----

fn metadata_request_case() -> impl Strategy<Value = (i16, MetadataRequest)> {
    let e = api::lookup(api::METADATA).expect("listed");
    (
        e.min_version..=e.max_version,
        prop::collection::vec("[a-z0-9._-]{1,20}", 0..5),
        any::<bool>(),
    )
        .prop_map(|(version, names, auto)| {
            let topics = names
                .into_iter()
                .map(|n| {
                    metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(n))))
                })
                .collect();
            let mut req = MetadataRequest::default().with_topics(Some(topics));
            if version >= 4 {
                req = req.with_allow_auto_topic_creation(auto);
            }
            (version, req)
        })
}

fn metadata_response_case() -> impl Strategy<Value = (i16, MetadataResponse)> {
    let e = api::lookup(api::METADATA).expect("listed");
    let broker = (0i32..10, "[a-z0-9.]{1,15}", 1i32..65535).prop_map(|(id, host, port)| {
        metadata_response::MetadataResponseBroker::default()
            .with_node_id(wire::messages::kafka_protocol::messages::BrokerId(id))
            .with_host(StrBytes::from_string(host))
            .with_port(port)
    });
    let partition = (0i32..100, 0i32..10, prop::collection::vec(0i32..10, 0..4)).prop_map(
        |(index, leader, replicas)| {
            let ids: Vec<_> = replicas
                .into_iter()
                .map(wire::messages::kafka_protocol::messages::BrokerId)
                .collect();
            metadata_response::MetadataResponsePartition::default()
                .with_partition_index(index)
                .with_leader_id(wire::messages::kafka_protocol::messages::BrokerId(leader))
                .with_replica_nodes(ids.clone())
                .with_isr_nodes(ids)
        },
    );
    let topic = (
        "[a-z0-9._-]{1,20}",
        prop::collection::vec(partition, 0..4),
        any::<i16>(),
    )
        .prop_map(|(name, partitions, err)| {
            metadata_response::MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name))))
                .with_error_code(err)
                .with_partitions(partitions)
        });
    (
        e.min_version..=e.max_version,
        prop::collection::vec(broker, 0..4),
        prop::collection::vec(topic, 0..4),
    )
        .prop_map(|(version, brokers, topics)| {
            (
                version,
                MetadataResponse::default()
                    .with_brokers(brokers)
                    .with_topics(topics),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn metadata_request_roundtrips((version, req) in metadata_request_case()) {
        let header = wire::frame::RequestHeader {
            api_key: api::METADATA,
            api_version: version,
            correlation_id: 5,
            client_id: Some(Bytes::from_static(b"prop")),
        };
        let frame = messages::encode_request(&header, &req).expect("encodes");
        let (h, kind) = messages::decode_request_frame(&frame.slice(4..)).expect("decodes");
        prop_assert_eq!(h, header);
        prop_assert_eq!(kind, RequestKind::Metadata(req));
    }

    #[test]
    fn metadata_response_roundtrips((version, resp) in metadata_response_case()) {
        let frame = messages::encode_response(8, api::METADATA, version, &resp).expect("encodes");
        let (corr, back) =
            decode_response_as::<MetadataResponse>(api::METADATA, version, &frame.slice(4..)).expect("decodes");
        prop_assert_eq!(corr, 8);
        prop_assert_eq!(back, resp);
    }

    #[test]
    fn api_versions_roundtrips(version in 0i16..=3, served in prop::collection::vec(any::<bool>(), API_TABLE.len())) {
        let resp = api::api_versions_response(|k| {
            API_TABLE.iter().position(|e| e.key == k).is_some_and(|i| served[i])
        });
        let frame = messages::encode_response(1, api::API_VERSIONS, version, &resp).expect("encodes");
        let (_, back) =
            decode_response_as::<ApiVersionsResponse>(api::API_VERSIONS, version, &frame.slice(4..)).expect("decodes");
        prop_assert_eq!(back.api_keys, resp.api_keys);
        let mut req_out = BytesMut::new();
        let req = if version >= 3 {
            ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("weir"))
                .with_client_software_version(StrBytes::from_static_str("1"))
        } else {
            ApiVersionsRequest::default()
        };
        req.encode(&mut req_out, version).expect("encodes");
        req_out.put_slice(&[]);
        let back = messages::decode_request(api::API_VERSIONS, version, req_out.freeze()).expect("decodes");
        prop_assert_eq!(back, RequestKind::ApiVersions(req));
    }
}

/// The token bodies must actually decode for most (key, version) pairs, or the re-encode
/// properties above would be vacuous. Counts distinct pairs that decoded at least once.
#[test]
fn token_bodies_reach_most_advertised_versions() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let pairs: Vec<(i16, i16)> = all_versions().collect();
    let mut req_hit = vec![false; pairs.len()];
    let mut resp_hit = vec![false; pairs.len()];
    for _ in 0..3000 {
        let b = body().new_tree(&mut runner).expect("tree").current();
        for (i, &(key, version)) in pairs.iter().enumerate() {
            if messages::decode_request(key, version, b.clone()).is_ok() {
                req_hit[i] = true;
            }
            let api_key = ApiKey::try_from(key).expect("known");
            if ResponseKind::decode(api_key, &mut b.clone(), version).is_ok() {
                resp_hit[i] = true;
            }
        }
    }
    let req = req_hit.iter().filter(|h| **h).count();
    let resp = resp_hit.iter().filter(|h| **h).count();
    eprintln!(
        "decoded at least once: requests {req}/{}, responses {resp}/{}",
        pairs.len(),
        pairs.len()
    );
    assert!(
        req * 10 >= pairs.len() * 8,
        "requests {req}/{}",
        pairs.len()
    );
    assert!(
        resp * 10 >= pairs.len() * 8,
        "responses {resp}/{}",
        pairs.len()
    );
}
