//! Framing and headers: the 4-byte size prefix, request headers v0/v1/v2, response headers v0/v1.
//!
//! Every Kafka message on a socket is `size: i32` followed by `size` bytes. A request's bytes
//! start with a request header (`api_key`, `api_version`, `correlation_id`, then from v1 a
//! nullable `client_id`, then from v2 tagged fields); a response's with a response header
//! (`correlation_id`, then from v1 tagged fields). Which header version a message uses
//! follows from whether its (api key, version) is "flexible" — see [`crate::api`].
//!
//! [`check_frame`] decides from the size prefix alone, before the caller allocates anything.

use bytes::{BufMut, Bytes, BytesMut};

use crate::WireError;
use crate::api;
use crate::codec::Reader;

/// Bytes of the size prefix in front of every request and response.
pub const SIZE_PREFIX_BYTES: usize = 4;

/// What the bytes at the start of a receive buffer amount to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameStatus {
    /// Not yet a whole frame: at least `need` bytes (prefix included) must be buffered in
    /// total before asking again. `need` is exact once the prefix is known.
    Incomplete { need: usize },
    /// A whole frame is buffered: `size` payload bytes follow the 4-byte prefix, so the frame
    /// spans `buf[4..4 + size]`.
    Complete { size: usize },
}

impl FrameStatus {
    /// Total bytes (prefix included) of a complete frame.
    pub fn total_bytes(self) -> Option<usize> {
        match self {
            FrameStatus::Complete { size } => Some(SIZE_PREFIX_BYTES + size),
            FrameStatus::Incomplete { .. } => None,
        }
    }
}

/// Looks at the start of `buf` and says whether it holds a whole frame. A negative size or
/// one above `max_size_bytes` is an error, found from the prefix alone so that nothing is
/// allocated for a frame that will be refused (`socket.request.max.bytes`).
pub fn check_frame(buf: &[u8], max_size_bytes: usize) -> Result<FrameStatus, WireError> {
    let Some(prefix) = buf.first_chunk::<SIZE_PREFIX_BYTES>() else {
        return Ok(FrameStatus::Incomplete {
            need: SIZE_PREFIX_BYTES,
        });
    };
    let size = i32::from_be_bytes(*prefix);
    if size < 0 {
        return Err(WireError::Invalid {
            field: "frame size",
            offset: 0,
            reason: "negative",
        });
    }
    let size = size as usize;
    if size > max_size_bytes {
        return Err(WireError::TooLarge {
            field: "frame size",
            offset: 0,
            size: size as u64,
            max: max_size_bytes as u64,
        });
    }
    let need = SIZE_PREFIX_BYTES + size;
    if buf.len() < need {
        return Ok(FrameStatus::Incomplete { need });
    }
    Ok(FrameStatus::Complete { size })
}

/// A decoded request header. `client_id` shares the request buffer (no copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// Absent in header v0; `None` when the client sent a null string.
    pub client_id: Option<Bytes>,
}

impl RequestHeader {
    /// The client id as text, if present and valid UTF-8.
    pub fn client_id_str(&self) -> Option<&str> {
        self.client_id
            .as_deref()
            .and_then(|b| std::str::from_utf8(b).ok())
    }
}

/// Which request header version (0, 1 or 2) a request with this api key and version carries.
/// Known keys only: an unknown key cannot be framed reliably, so it is an error.
pub fn request_header_version(api_key: i16, api_version: i16) -> Result<i16, WireError> {
    let Some(entry) = api::lookup(api_key) else {
        return Err(WireError::UnsupportedVersion {
            api_key,
            api_version,
        });
    };
    Ok(if entry.is_flexible(api_version) { 2 } else { 1 })
}

/// Which response header version (0 or 1) answers this request. ApiVersions always answers
/// with v0 (KIP-511): a client must be able to read it before it knows our versions.
pub fn response_header_version(api_key: i16, api_version: i16) -> Result<i16, WireError> {
    let Some(entry) = api::lookup(api_key) else {
        return Err(WireError::UnsupportedVersion {
            api_key,
            api_version,
        });
    };
    if api_key == api::API_VERSIONS {
        return Ok(0);
    }
    Ok(if entry.is_flexible(api_version) { 1 } else { 0 })
}

/// Parses the request header at the start of `frame` (the bytes after the size prefix).
/// Returns the header and the offset of the request body within `frame`. The header version
/// follows from the (api key, version) it names (see [`request_header_version`]).
pub fn parse_request_header(frame: &Bytes) -> Result<(RequestHeader, usize), WireError> {
    let mut r = Reader::over(frame);
    let api_key = r.i16("api_key")?;
    let api_version = r.i16("api_version")?;
    let header_version = request_header_version(api_key, api_version)?;
    parse_request_header_version(frame, header_version)
}

/// Parses a request header of an explicit version: v0 (api key, version, correlation id),
/// v1 (+ nullable client id), v2 (+ tagged fields). Header v0 is used only by
/// ControlledShutdown v0, which weir does not advertise; it is here for completeness.
pub fn parse_request_header_version(
    frame: &Bytes,
    header_version: i16,
) -> Result<(RequestHeader, usize), WireError> {
    let mut r = Reader::over(frame);
    let api_key = r.i16("api_key")?;
    let api_version = r.i16("api_version")?;
    let correlation_id = r.i32("correlation_id")?;
    // Header v1 and v2 both carry a classic (non-compact) nullable client id: Kafka kept it
    // non-compact in v2 so that any broker can read the client id of any request.
    let client_id = if header_version >= 1 {
        r.nullable_string_bytes("client_id")?
    } else {
        None
    };
    if header_version >= 2 {
        r.skip_tagged_fields()?;
    }
    let header = RequestHeader {
        api_key,
        api_version,
        correlation_id,
        client_id,
    };
    Ok((header, r.position()))
}

/// Writes a request header (for clients: the load generator and tests).
pub fn encode_request_header(header: &RequestHeader, out: &mut BytesMut) -> Result<(), WireError> {
    let header_version = request_header_version(header.api_key, header.api_version)?;
    out.put_i16(header.api_key);
    out.put_i16(header.api_version);
    out.put_i32(header.correlation_id);
    match &header.client_id {
        Some(id) => {
            let len = i16::try_from(id.len()).map_err(|_| WireError::TooLarge {
                field: "client_id",
                offset: 8,
                size: id.len() as u64,
                max: i16::MAX as u64,
            })?;
            out.put_i16(len);
            out.put_slice(id);
        }
        None => out.put_i16(-1),
    }
    if header_version >= 2 {
        out.put_u8(0); // no tagged fields
    }
    Ok(())
}

/// Writes a response header of the given version (0: correlation id; 1: plus empty tagged
/// fields).
pub fn encode_response_header(correlation_id: i32, header_version: i16, out: &mut BytesMut) {
    out.put_i32(correlation_id);
    if header_version >= 1 {
        out.put_u8(0);
    }
}

/// Parses a response header of the given version from the start of `frame`; returns the
/// correlation id and the body offset.
pub fn parse_response_header(frame: &[u8], header_version: i16) -> Result<(i32, usize), WireError> {
    let mut r = Reader::new(frame);
    let correlation_id = r.i32("correlation_id")?;
    if header_version >= 1 {
        r.skip_tagged_fields()?;
    }
    Ok((correlation_id, r.position()))
}

/// Appends a size prefix placeholder; [`finish_frame`] fills it in.
pub fn begin_frame(out: &mut BytesMut) -> usize {
    let start = out.len();
    out.put_i32(0);
    start
}

/// Fills in the size prefix written by [`begin_frame`] at `start`.
pub fn finish_frame(out: &mut BytesMut, start: usize) -> Result<(), WireError> {
    let size = out.len() - start - SIZE_PREFIX_BYTES;
    let size = i32::try_from(size).map_err(|_| WireError::TooLarge {
        field: "frame size",
        offset: start,
        size: size as u64,
        max: i32::MAX as u64,
    })?;
    out[start..start + SIZE_PREFIX_BYTES].copy_from_slice(&size.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_needs_prefix_then_body() {
        assert_eq!(
            check_frame(&[0, 0], 100),
            Ok(FrameStatus::Incomplete { need: 4 })
        );
        assert_eq!(
            check_frame(&[0, 0, 0, 3, 1], 100),
            Ok(FrameStatus::Incomplete { need: 7 })
        );
        let status = check_frame(&[0, 0, 0, 3, 1, 2, 3, 9], 100);
        assert_eq!(status, Ok(FrameStatus::Complete { size: 3 }));
        assert_eq!(status.ok().and_then(FrameStatus::total_bytes), Some(7));
    }

    #[test]
    fn frame_refuses_negative_and_oversized() {
        assert!(matches!(
            check_frame(&[0xff, 0xff, 0xff, 0xff], 100),
            Err(WireError::Invalid { .. })
        ));
        assert!(matches!(
            check_frame(&[0, 0, 0, 101], 100),
            Err(WireError::TooLarge { size: 101, .. })
        ));
        assert_eq!(
            check_frame(&[0, 0, 0, 100], 100),
            Ok(FrameStatus::Incomplete { need: 104 })
        );
    }

    fn roundtrip(api_key: i16, api_version: i16, client_id: Option<&'static [u8]>) {
        let header = RequestHeader {
            api_key,
            api_version,
            correlation_id: 77,
            client_id: client_id.map(Bytes::from_static),
        };
        let mut out = BytesMut::new();
        assert!(encode_request_header(&header, &mut out).is_ok());
        out.put_slice(b"body");
        let frame = out.freeze();
        let (parsed, body) = parse_request_header(&frame).expect("valid header");
        assert_eq!(parsed, header);
        assert_eq!(&frame[body..], b"body");
    }

    #[test]
    fn request_header_v1_and_v2_roundtrip() {
        roundtrip(api::PRODUCE, 7, Some(b"rdkafka"));
        roundtrip(api::PRODUCE, 9, Some(b"rdkafka"));
        roundtrip(api::METADATA, 12, None);
        roundtrip(api::API_VERSIONS, 3, Some(b""));
    }

    #[test]
    fn request_header_v2_skips_tagged_fields() {
        // ApiVersions v3, correlation 5, client id "ab", two tagged fields.
        let frame = Bytes::from_static(&[
            0, 18, 0, 3, 0, 0, 0, 5, 0, 2, b'a', b'b', 2, 0, 1, 0xaa, 7, 2, 0xbb, 0xcc, 0xee,
        ]);
        let (h, body) = parse_request_header(&frame).expect("valid header");
        assert_eq!(h.correlation_id, 5);
        assert_eq!(h.client_id_str(), Some("ab"));
        assert_eq!(body, frame.len() - 1);
    }

    #[test]
    fn request_header_truncated_or_unknown_is_error() {
        let frame = Bytes::from_static(&[0, 18, 0, 3, 0, 0, 0, 5, 0, 9, b'a']);
        assert!(matches!(
            parse_request_header(&frame),
            Err(WireError::UnexpectedEof { .. })
        ));
        let frame = Bytes::from_static(&[0x7f, 0, 0, 0, 0, 0, 0, 5, 0xff, 0xff]);
        assert!(matches!(
            parse_request_header(&frame),
            Err(WireError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn request_header_v0_has_no_client_id() {
        let frame = Bytes::from_static(&[0, 7, 0, 0, 0, 0, 0, 9, 0xaa]);
        let (h, body) = parse_request_header_version(&frame, 0).expect("v0 header");
        assert_eq!((h.api_key, h.correlation_id, h.client_id), (7, 9, None));
        assert_eq!(body, 8);
    }

    #[test]
    fn api_versions_responds_with_header_v0() {
        assert_eq!(response_header_version(api::API_VERSIONS, 3), Ok(0));
        assert_eq!(response_header_version(api::FETCH, 12), Ok(1));
        assert_eq!(response_header_version(api::FETCH, 11), Ok(0));
        let mut out = BytesMut::new();
        encode_response_header(9, 1, &mut out);
        assert_eq!(parse_response_header(&out, 1), Ok((9, 5)));
    }
}
