//! Protocol glue between the connection loop and the API handlers: which API versions weir
//! serves, request-header parsing, typed decode of request bodies and framed encode of
//! responses, on top of `kafka-protocol` 0.18.
//!
//! TODO(wire): replace with `wire::frame`, `wire::api` and `wire::messages` once they land;
//! this module keeps only what the broker needs meanwhile.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

/// One API weir serves and the inclusive version range it advertises.
#[derive(Clone, Copy, Debug)]
pub struct ApiRange {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
}

/// The APIs and versions weir serves. Ranges include the exact versions that old
/// librdkafka, kafkajs and aiokafka need (see DESIGN "Known pitfalls"); Produce/Fetch stop
/// below the versions that address topics by id only.
pub const SERVED: &[ApiRange] = &[
    ApiRange {
        key: ApiKey::Produce,
        min: 3,
        max: 9,
    },
    ApiRange {
        key: ApiKey::Fetch,
        min: 4,
        max: 12,
    },
    ApiRange {
        key: ApiKey::ListOffsets,
        min: 1,
        max: 7,
    },
    ApiRange {
        key: ApiKey::Metadata,
        min: 0,
        max: 12,
    },
    ApiRange {
        key: ApiKey::ApiVersions,
        min: 0,
        max: 3,
    },
    ApiRange {
        key: ApiKey::CreateTopics,
        min: 2,
        max: 7,
    },
    ApiRange {
        key: ApiKey::DeleteTopics,
        min: 1,
        max: 6,
    },
    ApiRange {
        key: ApiKey::DeleteRecords,
        min: 0,
        max: 2,
    },
    ApiRange {
        key: ApiKey::DescribeConfigs,
        min: 1,
        max: 4,
    },
    ApiRange {
        key: ApiKey::AlterConfigs,
        min: 0,
        max: 2,
    },
    ApiRange {
        key: ApiKey::CreatePartitions,
        min: 0,
        max: 3,
    },
    ApiRange {
        key: ApiKey::IncrementalAlterConfigs,
        min: 0,
        max: 1,
    },
    ApiRange {
        key: ApiKey::DescribeCluster,
        min: 0,
        max: 1,
    },
];

/// The served range of `key`, if weir serves it.
pub fn served_range(key: ApiKey) -> Option<ApiRange> {
    SERVED.iter().copied().find(|r| r.key == key)
}

/// A request whose header has been parsed; `body` is the rest of the frame.
#[derive(Debug)]
pub struct Request {
    pub api_key: ApiKey,
    pub header: RequestHeader,
    pub body: Bytes,
}

impl Request {
    pub fn version(&self) -> i16 {
        self.header.request_api_version
    }
}

/// Why a frame could not become a [`Request`].
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("frame of {0} bytes is too short for a request header")]
    Short(usize),
    #[error("unknown api key {0}")]
    UnknownKey(i16),
    #[error("bad request header for api key {key} v{version}: {reason}")]
    Header {
        key: i16,
        version: i16,
        reason: String,
    },
    #[error("cannot decode {key:?} v{version} body: {reason}")]
    Body {
        key: ApiKey,
        version: i16,
        reason: String,
    },
    #[error("cannot encode response: {0}")]
    Encode(String),
}

/// Parses the request header at the start of `frame` (the bytes after the size prefix).
/// An unsupported version of a known key still parses (ApiVersions must answer it).
pub fn parse_request(mut frame: Bytes) -> Result<Request, ProtoError> {
    if frame.len() < 8 {
        return Err(ProtoError::Short(frame.len()));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let api_key = ApiKey::try_from(raw_key).map_err(|_| ProtoError::UnknownKey(raw_key))?;
    // An ApiVersions request of a version newer than weir knows is parsed with header v1,
    // as Kafka does, so the client can be told which versions exist.
    let header_version = if api_key == ApiKey::ApiVersions && version > 3 {
        1
    } else {
        api_key.request_header_version(version)
    };
    let header =
        RequestHeader::decode(&mut frame, header_version).map_err(|e| ProtoError::Header {
            key: raw_key,
            version,
            reason: e.to_string(),
        })?;
    Ok(Request {
        api_key,
        header,
        body: frame,
    })
}

/// Decodes the typed body of `req`.
// TODO(wire::messages): kafka-protocol's array decoder reserves capacity from the
// untrusted element count; `wire::messages` is to bound counts by the frame size first.
pub fn decode<T: Decodable>(req: &Request) -> Result<T, ProtoError> {
    let mut body = req.body.clone();
    T::decode(&mut body, req.version()).map_err(|e| ProtoError::Body {
        key: req.api_key,
        version: req.version(),
        reason: e.to_string(),
    })
}

/// Encodes a whole response frame: size prefix, response header, body.
pub fn encode_response<T: Encodable>(req: &Request, body: &T) -> Result<BytesMut, ProtoError> {
    let version = req.version();
    let header_version = req.api_key.response_header_version(version);
    let size = body
        .compute_size(version)
        .map_err(|e| ProtoError::Encode(e.to_string()))?;
    let mut out = BytesMut::with_capacity(size + 16);
    out.put_i32(0);
    out.put_i32(req.header.correlation_id);
    if header_version >= 1 {
        out.put_u8(0); // empty tagged fields
    }
    body.encode(&mut out, version)
        .map_err(|e| ProtoError::Encode(e.to_string()))?;
    let len = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::MetadataRequest;

    #[test]
    fn header_then_typed_body() {
        let mut frame = BytesMut::new();
        let mut h = RequestHeader::default();
        h.request_api_key = ApiKey::Metadata as i16;
        h.request_api_version = 9;
        h.correlation_id = 42;
        h.encode(&mut frame, ApiKey::Metadata.request_header_version(9))
            .unwrap();
        MetadataRequest::default().encode(&mut frame, 9).unwrap();
        let req = parse_request(frame.freeze()).unwrap();
        assert_eq!(req.header.correlation_id, 42);
        let _: MetadataRequest = decode(&req).unwrap();
        assert!(matches!(
            parse_request(Bytes::from_static(&[0x7f, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0])),
            Err(ProtoError::UnknownKey(_))
        ));
        assert!(matches!(
            parse_request(Bytes::from_static(&[0, 3])),
            Err(ProtoError::Short(2))
        ));
    }
}
