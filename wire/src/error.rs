//! [`WireError`]: every way bytes can fail to be Kafka, with where and why.

/// A decoding or validation failure. Each variant names the field and the byte offset
/// (relative to the buffer the caller passed) so that a log line is enough to find the fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ended before a field did.
    #[error(
        "unexpected end of input reading {field} at offset {offset}: need {need} bytes, have {have}"
    )]
    UnexpectedEof {
        field: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },
    /// A length or count is larger than a limit (or than the bytes that could hold it).
    #[error("{field} at offset {offset} is {size}, above the maximum {max}")]
    TooLarge {
        field: &'static str,
        offset: usize,
        size: u64,
        max: u64,
    },
    /// A field holds a value that is never valid.
    #[error("invalid {field} at offset {offset}: {reason}")]
    Invalid {
        field: &'static str,
        offset: usize,
        reason: &'static str,
    },
    /// A record batch's stored CRC-32C does not match its bytes.
    #[error(
        "record batch at offset {offset}: CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"
    )]
    CrcMismatch {
        offset: usize,
        stored: u32,
        computed: u32,
    },
    /// A request for an API key or version weir does not speak.
    #[error("unsupported api key {api_key} version {api_version}")]
    UnsupportedVersion { api_key: i16, api_version: i16 },
    /// A message body the `kafka-protocol` codec refused (its reason is text, not a field).
    #[error("malformed api key {api_key} version {api_version}: {reason}")]
    Malformed {
        api_key: i16,
        api_version: i16,
        reason: String,
    },
    /// A compressed batch that does not decompress, or decompresses past the output bound.
    #[error("record batch: {codec} decompression failed: {reason}")]
    Decompression { codec: &'static str, reason: String },
}

impl WireError {
    /// The same error with its offset moved by `base`: for errors found in a sub-slice.
    pub fn shifted(self, base: usize) -> WireError {
        match self {
            WireError::UnexpectedEof {
                field,
                offset,
                need,
                have,
            } => WireError::UnexpectedEof {
                field,
                offset: offset + base,
                need,
                have,
            },
            WireError::TooLarge {
                field,
                offset,
                size,
                max,
            } => WireError::TooLarge {
                field,
                offset: offset + base,
                size,
                max,
            },
            WireError::Invalid {
                field,
                offset,
                reason,
            } => WireError::Invalid {
                field,
                offset: offset + base,
                reason,
            },
            WireError::CrcMismatch {
                offset,
                stored,
                computed,
            } => WireError::CrcMismatch {
                offset: offset + base,
                stored,
                computed,
            },
            other @ (WireError::UnsupportedVersion { .. }
            | WireError::Malformed { .. }
            | WireError::Decompression { .. }) => other,
        }
    }
}
