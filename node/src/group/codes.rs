//! Kafka error codes of the group APIs, by their protocol names (the broker's own list is
//! in `crate::errors`; these belong to the coordinator).

pub use crate::errors::{INVALID_REQUEST, NONE, UNKNOWN_SERVER_ERROR, UNKNOWN_TOPIC_OR_PARTITION};

pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
pub const NOT_COORDINATOR: i16 = 16;
pub const ILLEGAL_GENERATION: i16 = 22;
pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
pub const INVALID_GROUP_ID: i16 = 24;
pub const UNKNOWN_MEMBER_ID: i16 = 25;
pub const INVALID_SESSION_TIMEOUT: i16 = 26;
pub const REBALANCE_IN_PROGRESS: i16 = 27;
pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
pub const NON_EMPTY_GROUP: i16 = 68;
pub const GROUP_ID_NOT_FOUND: i16 = 69;
pub const MEMBER_ID_REQUIRED: i16 = 79;
pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
pub const FENCED_INSTANCE_ID: i16 = 82;
pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
/// KIP-447: an offset a pending transaction will change (OffsetFetch with require_stable).
pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
