//! Message bodies through the `kafka-protocol` crate, in both directions.
//!
//! Broker side: [`decode_request`] turns a request body into kafka-protocol's typed request
//! ([`RequestKind`]), after checking that weir advertises the (api key, version);
//! [`encode_response`] writes a whole response frame (size prefix, response header, body).
//! Client side (the load generator, tests): [`encode_request`] and [`decode_response`].
//!
//! kafka-protocol is used through weir's patched copy (`wire/vendor/kafka-protocol`), which
//! refuses array counts larger than the bytes present before allocating; the frame size is
//! bounded by [`crate::frame::check_frame`] first, so decoding allocates at most a constant
//! factor of the frame size. The Produce and Fetch hot paths do not come here: see
//! [`crate::produce`] and [`crate::fetch`].

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::frame::{self, RequestHeader};
use crate::{WireError, api};

/// Re-export so that every crate uses the same kafka-protocol types as `wire`.
pub use kafka_protocol;

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
    RequestKind::decode(key, &mut body, api_version).map_err(|e| malformed(api_key, api_version, e))
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
    R::decode(&mut body, api_version).map_err(|e| malformed(api_key, api_version, e))
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
