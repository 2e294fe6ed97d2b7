//! ApiVersions: the API keys and version ranges weir serves.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

use super::Response;
use crate::errors;
use crate::proto::{self, ProtoError, Request};

fn response(error_code: i16) -> ApiVersionsResponse {
    let keys = proto::SERVED
        .iter()
        .map(|r| {
            ApiVersion::default()
                .with_api_key(r.key as i16)
                .with_min_version(r.min)
                .with_max_version(r.max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(keys)
}

/// Serves a supported ApiVersions version.
pub fn handle(req: &Request) -> Result<Response, ProtoError> {
    // The body holds only client software name/version (v3+); a client that sends junk
    // there still deserves the version list, so decode errors are ignored.
    let _ = proto::decode::<ApiVersionsRequest>(req);
    let frame = proto::encode_response(req, &response(errors::NONE))?;
    Ok(Some(vec![frame.freeze()]))
}

/// Answers an ApiVersions request of an unknown version with UNSUPPORTED_VERSION, encoded
/// as v0 (every client can read v0), as Kafka does.
pub fn unsupported(req: &Request) -> Response {
    let mut as_v0 = Request {
        api_key: req.api_key,
        header: req.header.clone(),
        body: req.body.clone(),
    };
    as_v0.header.request_api_version = 0;
    match proto::encode_response(&as_v0, &response(errors::UNSUPPORTED_VERSION)) {
        Ok(frame) => Some(vec![frame.freeze()]),
        Err(_) => super::close(),
    }
}
