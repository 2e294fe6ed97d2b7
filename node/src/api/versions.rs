//! ApiVersions: the API keys this broker serves, with `wire`'s version ranges; a version
//! above ours gets UNSUPPORTED_VERSION and the table, encoded as v0 (KIP-511).

use super::Response;
use crate::proto::{self, Request};

/// Serves ApiVersions at any version.
pub fn handle(req: &Request) -> Response {
    // The body holds only the client's software name/version (v3+); it is not needed, and
    // a client that sends junk there still deserves the version list.
    let (resp, version) = if wire::api::api_versions_needs_fallback(req.version) {
        (wire::api::api_versions_fallback(proto::is_served_key), 0)
    } else {
        (
            wire::api::api_versions_response(proto::is_served_key),
            req.version,
        )
    };
    let encoded = wire::messages::encode_response(req.correlation_id, req.api_key, version, &resp);
    match encoded {
        Ok(frame) => Some(vec![frame]),
        Err(e) => {
            tracing::warn!("cannot encode ApiVersions v{version}: {e}");
            super::close()
        }
    }
}
