//! Message bodies through the `kafka-protocol` crate, in both directions.
//!
//! Broker side: [`decode_request`] turns a request body into kafka-protocol's typed request
//! ([`RequestKind`]), after checking that weir advertises the (api key, version);
//! [`encode_response`] writes a whole response frame (size prefix, response header, body).
//! Client side (the load generator, tests): [`encode_request`] and [`decode_response`].
//!
//! kafka-protocol is used through weir's patched copy (`wire/vendor/kafka-protocol`), which
//! refuses array counts larger than the bytes present before allocating, and charges what a
//! decode builds (each array element's size, each unknown tagged field) to a bound:
//! [`decoded_bytes_max`] of the body's size, past which the request is malformed. A frame
//! of one-byte elements (empty compact strings, 32 bytes each in memory) otherwise decoded
//! to 30-100 times its size: gigabytes from one 100 MB frame, before any handler could
//! refuse it. The Produce and Fetch hot paths do not come here: see [`crate::produce`]
//! and [`crate::fetch`].

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, with_decode_budget};

use crate::frame::{self, RequestHeader};
use crate::{WireError, api};

/// Re-export so that every crate uses the same kafka-protocol types as `wire`.
pub use kafka_protocol;

/// Decoded memory a request body of any size may build.
pub const DECODED_BYTES_BASE: usize = 64 << 10;
/// Decoded memory per body byte on top of the base. Real requests stay below it: a Fetch
/// partition (33 bytes at v12) decodes to about twice its size, a Metadata topic named
/// with one character (3 bytes at v1, 72 in memory) to 24 times, a DescribeConfigs
/// resource repeated without keys to 13 times. Empty strings (1 byte, 32 in memory) and
/// unknown tagged fields are past it.
pub const DECODED_BYTES_PER_BODY_BYTE: usize = 24;
/// Decoded memory no request may pass, whatever its size (a Fetch of 100,000 partitions
/// builds ~10 MB; only Produce carries bulk, as record bytes, which are not decoded here).
pub const DECODED_BYTES_MAX: usize = 64 << 20;

/// The bound on what decoding a request body of `body_len` bytes may build in memory
/// (array elements and unknown tagged fields; strings and bytes are slices of the body).
/// Vectors grow by doubling, so the memory held is at most twice this.
pub fn decoded_bytes_max(body_len: usize) -> usize {
    DECODED_BYTES_PER_BODY_BYTE
        .saturating_mul(body_len)
        .saturating_add(DECODED_BYTES_BASE)
        .min(DECODED_BYTES_MAX)
}

fn malformed(api_key: i16, api_version: i16, e: anyhow::Error) -> WireError {
    WireError::Malformed {
        api_key,
        api_version,
        reason: format!("{e:#}"),
    }
}

fn known_key(api_key: i16, api_version: i16) -> Result<ApiKey, WireError> {
    ApiKey::try_from(api_key).map_err(|_| WireError::UnsupportedVersion {
        api_key,
        api_version,
    })
}

fn supported_key(api_key: i16, api_version: i16) -> Result<ApiKey, WireError> {
    if !api::is_supported(api_key, api_version) {
        return Err(WireError::UnsupportedVersion {
            api_key,
            api_version,
        });
    }
    known_key(api_key, api_version)
}

/// Decodes a request body (the bytes after the request header) for an (api key, version)
/// weir advertises. Anything else is `UnsupportedVersion`; bytes the codec refuses are
/// `Malformed`.
pub fn decode_request(
    api_key: i16,
    api_version: i16,
    body: Bytes,
) -> Result<RequestKind, WireError> {
    let key = supported_key(api_key, api_version)?;
    let mut body = body;
    with_decode_budget(decoded_bytes_max(body.len()), || {
        RequestKind::decode(key, &mut body, api_version)
    })
    .map_err(|e| malformed(api_key, api_version, e))
}

/// Decodes a whole request frame (after the size prefix): header, then body.
pub fn decode_request_frame(frame: &Bytes) -> Result<(RequestHeader, RequestKind), WireError> {
    let (header, body_at) = frame::parse_request_header(frame)?;
    let body = frame.slice(body_at..);
    let request = decode_request(header.api_key, header.api_version, body)?;
    Ok((header, request))
}

/// Decodes one typed request body (when the caller already knows the type).
pub fn decode_request_as<R: Decodable>(
    api_key: i16,
    api_version: i16,
    body: Bytes,
) -> Result<R, WireError> {
    supported_key(api_key, api_version)?;
    let mut body = body;
    with_decode_budget(decoded_bytes_max(body.len()), || {
        R::decode(&mut body, api_version)
    })
    .map_err(|e| malformed(api_key, api_version, e))
}

/// Encodes a whole response frame: size prefix, response header (v0 or v1 as the API
/// and version require; always v0 for ApiVersions), body at `api_version`.
pub fn encode_response<R: Encodable>(
    correlation_id: i32,
    api_key: i16,
    api_version: i16,
    response: &R,
) -> Result<Bytes, WireError> {
    let header_version = frame::response_header_version(api_key, api_version)?;
    let body_size = response
        .compute_size(api_version)
        .map_err(|e| malformed(api_key, api_version, e))?;
    let mut out = BytesMut::with_capacity(frame::SIZE_PREFIX_BYTES + 5 + body_size);
    let start = frame::begin_frame(&mut out);
    frame::encode_response_header(correlation_id, header_version, &mut out);
    response
        .encode(&mut out, api_version)
        .map_err(|e| malformed(api_key, api_version, e))?;
    frame::finish_frame(&mut out, start)?;
    Ok(out.freeze())
}

/// Encodes a [`ResponseKind`] as a whole response frame.
pub fn encode_response_kind(
    correlation_id: i32,
    api_version: i16,
    response: &ResponseKind,
) -> Result<Bytes, WireError> {
    let api_key = response_key(response);
    let header_version = frame::response_header_version(api_key, api_version)?;
    let mut out = BytesMut::new();
    let start = frame::begin_frame(&mut out);
    frame::encode_response_header(correlation_id, header_version, &mut out);
    response
        .encode(&mut out, api_version)
        .map_err(|e| malformed(api_key, api_version, e))?;
    frame::finish_frame(&mut out, start)?;
    Ok(out.freeze())
}

/// The API key of a response.
pub fn response_key(response: &ResponseKind) -> i16 {
    match response {
        ResponseKind::Produce(_) => api::PRODUCE,
        ResponseKind::Fetch(_) => api::FETCH,
        ResponseKind::ListOffsets(_) => api::LIST_OFFSETS,
        ResponseKind::Metadata(_) => api::METADATA,
        ResponseKind::OffsetCommit(_) => api::OFFSET_COMMIT,
        ResponseKind::OffsetFetch(_) => api::OFFSET_FETCH,
        ResponseKind::FindCoordinator(_) => api::FIND_COORDINATOR,
        ResponseKind::JoinGroup(_) => api::JOIN_GROUP,
        ResponseKind::Heartbeat(_) => api::HEARTBEAT,
        ResponseKind::LeaveGroup(_) => api::LEAVE_GROUP,
        ResponseKind::SyncGroup(_) => api::SYNC_GROUP,
        ResponseKind::DescribeGroups(_) => api::DESCRIBE_GROUPS,
        ResponseKind::ListGroups(_) => api::LIST_GROUPS,
        ResponseKind::SaslHandshake(_) => api::SASL_HANDSHAKE,
        ResponseKind::ApiVersions(_) => api::API_VERSIONS,
        ResponseKind::CreateTopics(_) => api::CREATE_TOPICS,
        ResponseKind::DeleteTopics(_) => api::DELETE_TOPICS,
        ResponseKind::DeleteRecords(_) => api::DELETE_RECORDS,
        ResponseKind::InitProducerId(_) => api::INIT_PRODUCER_ID,
        ResponseKind::OffsetForLeaderEpoch(_) => api::OFFSET_FOR_LEADER_EPOCH,
        ResponseKind::AddPartitionsToTxn(_) => api::ADD_PARTITIONS_TO_TXN,
        ResponseKind::AddOffsetsToTxn(_) => api::ADD_OFFSETS_TO_TXN,
        ResponseKind::EndTxn(_) => api::END_TXN,
        ResponseKind::WriteTxnMarkers(_) => api::WRITE_TXN_MARKERS,
        ResponseKind::TxnOffsetCommit(_) => api::TXN_OFFSET_COMMIT,
        ResponseKind::DescribeConfigs(_) => api::DESCRIBE_CONFIGS,
        ResponseKind::AlterConfigs(_) => api::ALTER_CONFIGS,
        ResponseKind::SaslAuthenticate(_) => api::SASL_AUTHENTICATE,
        ResponseKind::CreatePartitions(_) => api::CREATE_PARTITIONS,
        ResponseKind::DeleteGroups(_) => api::DELETE_GROUPS,
        ResponseKind::AlterReplicaLogDirs(_) => api::ALTER_REPLICA_LOG_DIRS,
        ResponseKind::DescribeLogDirs(_) => api::DESCRIBE_LOG_DIRS,
        ResponseKind::ElectLeaders(_) => api::ELECT_LEADERS,
        ResponseKind::AlterPartitionReassignments(_) => api::ALTER_PARTITION_REASSIGNMENTS,
        ResponseKind::ListPartitionReassignments(_) => api::LIST_PARTITION_REASSIGNMENTS,
        ResponseKind::IncrementalAlterConfigs(_) => api::INCREMENTAL_ALTER_CONFIGS,
        ResponseKind::OffsetDelete(_) => api::OFFSET_DELETE,
        ResponseKind::DescribeCluster(_) => api::DESCRIBE_CLUSTER,
        ResponseKind::DescribeProducers(_) => api::DESCRIBE_PRODUCERS,
        ResponseKind::DescribeTransactions(_) => api::DESCRIBE_TRANSACTIONS,
        ResponseKind::ListTransactions(_) => api::LIST_TRANSACTIONS,
        // Keys weir does not advertise: -1 makes encoding fail with UnsupportedVersion.
        _ => -1,
    }
}

/// Client side: encodes a whole request frame (size prefix, request header, body).
pub fn encode_request<R: Encodable>(
    header: &RequestHeader,
    request: &R,
) -> Result<Bytes, WireError> {
    let mut out = BytesMut::new();
    let start = frame::begin_frame(&mut out);
    frame::encode_request_header(header, &mut out)?;
    request
        .encode(&mut out, header.api_version)
        .map_err(|e| malformed(header.api_key, header.api_version, e))?;
    frame::finish_frame(&mut out, start)?;
    Ok(out.freeze())
}

/// Client side: decodes a response frame (after the size prefix) of a request sent with
/// `(api_key, api_version)`; returns the correlation id and the typed response. Works for
/// any key kafka-protocol knows (a load generator may talk to a broker with a wider table).
pub fn decode_response(
    api_key: i16,
    api_version: i16,
    frame_bytes: &Bytes,
) -> Result<(i32, ResponseKind), WireError> {
    let key = known_key(api_key, api_version)?;
    let header_version = key.response_header_version(api_version);
    let (correlation_id, body_at) = frame::parse_response_header(frame_bytes, header_version)?;
    let mut body = frame_bytes.slice(body_at..);
    let response = ResponseKind::decode(key, &mut body, api_version)
        .map_err(|e| malformed(api_key, api_version, e))?;
    Ok((correlation_id, response))
}

/// Client side: decodes a response frame into a known type.
pub fn decode_response_as<R: Decodable>(
    api_key: i16,
    api_version: i16,
    frame_bytes: &Bytes,
) -> Result<(i32, R), WireError> {
    let key = known_key(api_key, api_version)?;
    let header_version = key.response_header_version(api_version);
    let (correlation_id, body_at) = frame::parse_response_header(frame_bytes, header_version)?;
    let mut body = frame_bytes.slice(body_at..);
    let response =
        R::decode(&mut body, api_version).map_err(|e| malformed(api_key, api_version, e))?;
    Ok((correlation_id, response))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest, MetadataResponse};
    use kafka_protocol::protocol::StrBytes;

    fn header(api_key: i16, api_version: i16) -> RequestHeader {
        RequestHeader {
            api_key,
            api_version,
            correlation_id: 42,
            client_id: Some(Bytes::from_static(b"test")),
        }
    }

    #[test]
    fn request_roundtrip_through_frame() {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("weir"))
            .with_client_software_version(StrBytes::from_static_str("0.1"));
        let bytes = encode_request(&header(api::API_VERSIONS, 3), &req).expect("encodes");
        let framed = frame::check_frame(&bytes, 1 << 20).expect("frame");
        assert_eq!(framed.total_bytes(), Some(bytes.len()));
        let (h, kind) = decode_request_frame(&bytes.slice(4..)).expect("decodes");
        assert_eq!(h.correlation_id, 42);
        assert_eq!(kind, RequestKind::ApiVersions(req));
    }

    /// Encodes `req` as a v`version` body and decodes it back through the bound.
    fn through_bound<R: Encodable + Decodable>(
        key: i16,
        version: i16,
        req: &R,
    ) -> Result<R, WireError> {
        let mut body = BytesMut::new();
        req.encode(&mut body, version).expect("encodes");
        decode_request_as::<R>(key, version, body.freeze())
    }

    #[test]
    fn large_real_requests_decode_within_their_bound() {
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        use kafka_protocol::messages::{FetchRequest, TopicName};
        let partitions = (0..100_000).map(|i| FetchPartition::default().with_partition(i));
        let fetch = FetchRequest::default().with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(partitions.collect()),
        ]);
        assert!(
            through_bound(api::FETCH, 12, &fetch).is_ok(),
            "100,000 partitions"
        );
        let topics = (0..200_000).map(|i| {
            let name = StrBytes::from_string(format!("topic{i:05}"));
            MetadataRequestTopic::default().with_name(Some(TopicName(name)))
        });
        let metadata = MetadataRequest::default().with_topics(Some(topics.collect()));
        assert!(
            through_bound(api::METADATA, 1, &metadata).is_ok(),
            "200,000 topics"
        );
    }

    #[test]
    fn one_byte_elements_are_refused_past_the_bound() {
        use kafka_protocol::messages::ListTransactionsRequest;
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        // Empty compact strings: one byte on the wire, 32 in memory.
        let filters = |n: usize| {
            ListTransactionsRequest::default().with_state_filters(vec![StrBytes::default(); n])
        };
        assert!(through_bound(api::LIST_TRANSACTIONS, 0, &filters(1_000)).is_ok());
        let r = through_bound(api::LIST_TRANSACTIONS, 0, &filters(3_000_000));
        assert!(matches!(r, Err(WireError::Malformed { .. })), "{r:?}");
        // An unknown tagged field on every element: a few bytes each, a B-tree node each.
        let tagged = |n: usize| {
            let topic = MetadataRequestTopic::default()
                .with_unknown_tagged_fields([(99, Bytes::new())].into_iter().collect());
            MetadataRequest::default().with_topics(Some(vec![topic; n]))
        };
        assert!(through_bound(api::METADATA, 9, &tagged(10)).is_ok());
        let r = through_bound(api::METADATA, 9, &tagged(20_000));
        assert!(matches!(r, Err(WireError::Malformed { .. })), "{r:?}");
        // The bound is per decode: the next one starts afresh.
        assert!(through_bound(api::METADATA, 9, &tagged(10)).is_ok());
    }

    #[test]
    fn unsupported_version_is_refused_before_decoding() {
        let r = decode_request(api::METADATA, 14, Bytes::new());
        assert!(matches!(r, Err(WireError::UnsupportedVersion { .. })));
        let r = decode_request(99, 0, Bytes::new());
        assert!(matches!(r, Err(WireError::UnsupportedVersion { .. })));
    }

    #[test]
    fn response_roundtrip_with_header_versions() {
        for version in [3i16, 9, 12] {
            let resp = MetadataResponse::default().with_throttle_time_ms(7);
            let bytes = encode_response(9, api::METADATA, version, &resp).expect("encodes");
            let (corr, back) =
                decode_response_as::<MetadataResponse>(api::METADATA, version, &bytes.slice(4..))
                    .expect("decodes");
            assert_eq!(corr, 9);
            assert_eq!(back, resp);
        }
    }

    #[test]
    fn api_versions_fallback_is_v0_with_error() {
        let resp = api::api_versions_fallback(|_| true);
        let bytes = encode_response(3, api::API_VERSIONS, 0, &resp).expect("encodes");
        // size, correlation id, error code 35 right after the v0 header.
        assert_eq!(&bytes[4..8], &3i32.to_be_bytes());
        assert_eq!(&bytes[8..10], &35i16.to_be_bytes());
        let (_, kind) = decode_response(api::API_VERSIONS, 0, &bytes.slice(4..)).expect("ok");
        let ResponseKind::ApiVersions(back) = kind else {
            panic!("wrong kind");
        };
        assert_eq!(back.api_keys.len(), api::API_TABLE.len());
    }

    #[test]
    fn huge_array_count_is_refused() {
        // Metadata v0: topics array claiming i32::MAX entries, 3 bytes present.
        let body = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 0, 1, b'a']);
        let r = decode_request(api::METADATA, 0, body);
        assert!(matches!(r, Err(WireError::Malformed { .. })));
        let _ = MetadataRequest::default();
    }
}
