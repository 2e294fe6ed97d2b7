//! Protocol glue between the connection loop and the API handlers, on top of `wire`:
//! which APIs this broker serves (versions come from `wire::api`'s table), request-header
//! parsing, typed decode of request bodies and framed encode of responses.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable};
use wire::WireError;
use wire::api;

/// The API keys this broker implements; their version ranges are `wire::api::API_TABLE`'s.
/// Only these are advertised in ApiVersions.
pub const SERVED_KEYS: &[i16] = &[
    api::PRODUCE,
    api::FETCH,
    api::LIST_OFFSETS,
    api::METADATA,
    api::API_VERSIONS,
    api::CREATE_TOPICS,
    api::DELETE_TOPICS,
    api::DELETE_RECORDS,
    api::DESCRIBE_CONFIGS,
    api::ALTER_CONFIGS,
    api::CREATE_PARTITIONS,
    api::INCREMENTAL_ALTER_CONFIGS,
    api::DESCRIBE_CLUSTER,
    api::INIT_PRODUCER_ID,
    api::OFFSET_FOR_LEADER_EPOCH,
    // Replica admin APIs, single-node answers (api/replicas.rs).
    api::ALTER_REPLICA_LOG_DIRS,
    api::DESCRIBE_LOG_DIRS,
    api::ELECT_LEADERS,
    api::ALTER_PARTITION_REASSIGNMENTS,
    api::LIST_PARTITION_REASSIGNMENTS,
    // Group coordinator (node/src/group, node/src/api/groups.rs).
    api::OFFSET_COMMIT,
    api::OFFSET_FETCH,
    api::FIND_COORDINATOR,
    api::JOIN_GROUP,
    api::HEARTBEAT,
    api::LEAVE_GROUP,
    api::SYNC_GROUP,
    api::DESCRIBE_GROUPS,
    api::LIST_GROUPS,
    api::DELETE_GROUPS,
    api::OFFSET_DELETE,
    // Transactions (node/src/txn, node/src/api/txn.rs).
    api::ADD_PARTITIONS_TO_TXN,
    api::ADD_OFFSETS_TO_TXN,
    api::END_TXN,
    api::WRITE_TXN_MARKERS,
    api::TXN_OFFSET_COMMIT,
    api::DESCRIBE_TRANSACTIONS,
    api::LIST_TRANSACTIONS,
    api::DESCRIBE_PRODUCERS,
    // Security (node/src/api/sasl.rs).
    api::SASL_HANDSHAKE,
    api::SASL_AUTHENTICATE,
    api::DESCRIBE_USER_SCRAM_CREDENTIALS,
    api::ALTER_USER_SCRAM_CREDENTIALS,
    // ACLs (node/src/api/acls.rs).
    api::DESCRIBE_ACLS,
    api::CREATE_ACLS,
    api::DELETE_ACLS,
];

/// Whether this broker implements `api_key` (at the versions `wire` lists).
pub fn is_served_key(api_key: i16) -> bool {
    SERVED_KEYS.contains(&api_key)
}

/// Whether `(api_key, version)` is served.
pub fn is_served(api_key: i16, version: i16) -> bool {
    is_served_key(api_key) && api::is_supported(api_key, version)
}

/// A request whose header has been parsed; `body` is the rest of the frame (shared).
#[derive(Debug)]
pub struct Request {
    pub api_key: i16,
    pub version: i16,
    pub correlation_id: i32,
    /// The header's client id (shares the frame buffer).
    pub client_id: Option<Bytes>,
    pub body: Bytes,
}

impl Request {
    pub fn version(&self) -> i16 {
        self.version
    }

    /// The API's name for log lines.
    pub fn api_name(&self) -> &'static str {
        api::lookup(self.api_key).map_or("unknown", |e| e.name)
    }

    /// The kafka-protocol key, for keys this broker serves.
    pub fn key(&self) -> Option<ApiKey> {
        ApiKey::try_from(self.api_key).ok()
    }
}

/// Parses the request header at the start of `frame` (the bytes after the size prefix).
/// Unknown keys fail (their header cannot be framed); unserved versions of known keys
/// parse, so that the dispatcher can answer or refuse them.
pub fn parse_request(frame: Bytes) -> Result<Request, WireError> {
    let (header, body_at) = wire::frame::parse_request_header(&frame)?;
    Ok(Request {
        api_key: header.api_key,
        version: header.api_version,
        correlation_id: header.correlation_id,
        client_id: header.client_id,
        body: frame.slice(body_at..),
    })
}

/// Decodes the typed body of `req` (array counts are bounded by the bytes present).
pub fn decode<T: Decodable>(req: &Request) -> Result<T, WireError> {
    wire::messages::decode_request_as(req.api_key, req.version, req.body.clone())
}

/// Encodes a whole response frame: size prefix, response header, body.
pub fn encode_response<T: Encodable>(req: &Request, body: &T) -> Result<Bytes, WireError> {
    wire::messages::encode_response(req.correlation_id, req.api_key, req.version, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::{MetadataRequest, RequestHeader};

    #[test]
    fn header_then_typed_body() {
        let mut frame = BytesMut::new();
        let h = RequestHeader::default()
            .with_request_api_key(api::METADATA)
            .with_request_api_version(9)
            .with_correlation_id(42);
        h.encode(&mut frame, 2).unwrap();
        MetadataRequest::default().encode(&mut frame, 9).unwrap();
        let req = parse_request(frame.freeze()).unwrap();
        assert_eq!(req.correlation_id, 42);
        assert_eq!(req.api_name(), "Metadata");
        let _: MetadataRequest = decode(&req).unwrap();
        assert!(parse_request(Bytes::from_static(&[0x7f, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0])).is_err());
        assert!(parse_request(Bytes::from_static(&[0, 3])).is_err());
        assert!(is_served(api::PRODUCE, 3));
        assert!(!is_served(api::PRODUCE, 99));
        assert!(is_served(api::WRITE_TXN_MARKERS, 1));
        assert!(is_served(api::SASL_HANDSHAKE, 1));
    }
}
