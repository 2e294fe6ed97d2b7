//! The API table: every API key weir knows, the version range it advertises, and from which
//! version each API is "flexible" (compact encodings, tagged fields, header v2/v1).
//!
//! Why these ranges (the broker must serve every version it advertises, so no wider than
//! needed; see DESIGN.md "Known pitfalls"):
//!
//! - librdkafka < 2.11.1 enables a feature only if our range overlaps its exact versions:
//!   Produce 3 + Fetch 4 (record batch v2), Produce 7 + Fetch 10 (zstd), InitProducerId 0
//!   (idempotence), FindCoordinator 0, OffsetCommit 1..2, OffsetFetch 1, JoinGroup /
//!   SyncGroup / Heartbeat / LeaveGroup 0 (consumer groups), ListOffsets 1, SaslHandshake 0/1
//!   + SaslAuthenticate 0..1. Every range below includes those.
//! - kafkajs 2.2.4 and aiokafka 0.14 speak only non-flexible versions: Produce ≤ 7/8, Fetch
//!   ≤ 11, Metadata ≤ 5/6, ApiVersions ≤ 2. Every range starts at or below those.
//! - Modern librdkafka (2.16) prefers flexible versions; each range reaches the first
//!   flexible version at least (Produce 9, Fetch 12, Metadata 12, ...).
//! - Fetch reaches 17, the newest Kafka 4.0/4.1 version (v18, KIP-1166's follower high
//!   watermark, is newer): v13+ names topics by id (the broker keeps an id → name map per
//!   catalogue version), v15 moves replica_id into replica_state, v16 adds KIP-951 leader
//!   hints (current_leader, node_endpoints), v17 the follower's directory id (ignored).
//!   librdkafka ≥ 2.6 switches to topic ids at v13+; kafka-python infers "Kafka 3.9" from
//!   Fetch 17. ListOffsets reaches 10 (v7 max timestamp -3, v8 earliest local -4, v9
//!   latest tiered -5 — weir has no tiered storage, so -4 is the log start and -5 none —
//!   v10 a timeout weir does not need), Metadata 13 (a top-level error code, always 0),
//!   DeleteTopics 6 (by topic id). Produce stops at 9 (v10 adds only leader hints, v12 changes
//!   transaction semantics, v13 uses topic ids).
//! - Produce starts at v0 although weir stores only record batch v2: librdkafka < 2.11
//!   (Debian's 2.0.2) compresses with gzip, snappy or lz4 only if the broker's Produce range
//!   overlaps v0..v0 (rdkafka_msgset_writer.c; zstd needs v0..v7). Measured: with Produce
//!   3..9, kcat -z gzip/snappy/lz4 sent uncompressed batches. Produce v0–v2 requests are
//!   parsed by [`crate::produce`] and answered by its hand-written response encoder
//!   (kafka-protocol handles only v3+); their message format v0/v1 batches are refused per
//!   partition.
//! - Other lower bounds follow the `kafka-protocol` crate, which does not decode versions Kafka 4
//!   removed (e.g. OffsetCommit < 2, CreateTopics < 2); all client minimums above still fit.
//! - ApiVersions stops at 3; a client asking for 4 gets the KIP-511 fallback (v0 answer with
//!   UNSUPPORTED_VERSION and this table), see [`api_versions_fallback`].

use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::messages::api_versions_response::ApiVersion;

pub const PRODUCE: i16 = 0;
pub const FETCH: i16 = 1;
pub const LIST_OFFSETS: i16 = 2;
pub const METADATA: i16 = 3;
pub const OFFSET_COMMIT: i16 = 8;
pub const OFFSET_FETCH: i16 = 9;
pub const FIND_COORDINATOR: i16 = 10;
pub const JOIN_GROUP: i16 = 11;
pub const HEARTBEAT: i16 = 12;
pub const LEAVE_GROUP: i16 = 13;
pub const SYNC_GROUP: i16 = 14;
pub const DESCRIBE_GROUPS: i16 = 15;
pub const LIST_GROUPS: i16 = 16;
pub const SASL_HANDSHAKE: i16 = 17;
pub const API_VERSIONS: i16 = 18;
pub const CREATE_TOPICS: i16 = 19;
pub const DELETE_TOPICS: i16 = 20;
pub const DELETE_RECORDS: i16 = 21;
pub const INIT_PRODUCER_ID: i16 = 22;
pub const OFFSET_FOR_LEADER_EPOCH: i16 = 23;
pub const ADD_PARTITIONS_TO_TXN: i16 = 24;
pub const ADD_OFFSETS_TO_TXN: i16 = 25;
pub const END_TXN: i16 = 26;
pub const WRITE_TXN_MARKERS: i16 = 27;
pub const TXN_OFFSET_COMMIT: i16 = 28;
pub const DESCRIBE_ACLS: i16 = 29;
pub const CREATE_ACLS: i16 = 30;
pub const DELETE_ACLS: i16 = 31;
pub const DESCRIBE_CONFIGS: i16 = 32;
pub const ALTER_CONFIGS: i16 = 33;
pub const ALTER_REPLICA_LOG_DIRS: i16 = 34;
pub const DESCRIBE_LOG_DIRS: i16 = 35;
pub const SASL_AUTHENTICATE: i16 = 36;
pub const CREATE_PARTITIONS: i16 = 37;
pub const DELETE_GROUPS: i16 = 42;
pub const ELECT_LEADERS: i16 = 43;
pub const INCREMENTAL_ALTER_CONFIGS: i16 = 44;
pub const ALTER_PARTITION_REASSIGNMENTS: i16 = 45;
pub const LIST_PARTITION_REASSIGNMENTS: i16 = 46;
pub const OFFSET_DELETE: i16 = 47;
pub const DESCRIBE_USER_SCRAM_CREDENTIALS: i16 = 50;
pub const ALTER_USER_SCRAM_CREDENTIALS: i16 = 51;
pub const DESCRIBE_CLUSTER: i16 = 60;
pub const DESCRIBE_PRODUCERS: i16 = 61;
pub const DESCRIBE_TRANSACTIONS: i16 = 65;
pub const LIST_TRANSACTIONS: i16 = 66;

/// Kafka error code UNSUPPORTED_VERSION.
pub const ERROR_UNSUPPORTED_VERSION: i16 = 35;

/// One API as weir advertises it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiEntry {
    pub key: i16,
    pub name: &'static str,
    pub min_version: i16,
    pub max_version: i16,
    /// First version with compact encodings and tagged fields; `None` if never flexible.
    pub flexible_from: Option<i16>,
}

impl ApiEntry {
    /// Whether `version` of this API uses the flexible encoding (request header v2,
    /// response header v1). Defined for versions outside our range too, because a header
    /// must be parsed before the version can be refused.
    pub fn is_flexible(&self, version: i16) -> bool {
        self.flexible_from.is_some_and(|from| version >= from)
    }

    /// Whether weir advertises (and so must serve) this version.
    pub fn supports(&self, version: i16) -> bool {
        (self.min_version..=self.max_version).contains(&version)
    }
}

const fn entry(key: i16, name: &'static str, min: i16, max: i16, flex: i16) -> ApiEntry {
    ApiEntry {
        key,
        name,
        min_version: min,
        max_version: max,
        flexible_from: if flex < 0 { None } else { Some(flex) },
    }
}

/// Never flexible.
const NEVER: i16 = -1;

/// Every API weir knows, sorted by key.
pub const API_TABLE: &[ApiEntry] = &[
    entry(PRODUCE, "Produce", 0, 9, 9),
    entry(FETCH, "Fetch", 4, 17, 12),
    entry(LIST_OFFSETS, "ListOffsets", 1, 10, 6),
    entry(METADATA, "Metadata", 0, 13, 9),
    entry(OFFSET_COMMIT, "OffsetCommit", 2, 8, 8),
    entry(OFFSET_FETCH, "OffsetFetch", 1, 8, 6),
    entry(FIND_COORDINATOR, "FindCoordinator", 0, 4, 3),
    entry(JOIN_GROUP, "JoinGroup", 0, 7, 6),
    entry(HEARTBEAT, "Heartbeat", 0, 4, 4),
    entry(LEAVE_GROUP, "LeaveGroup", 0, 4, 4),
    entry(SYNC_GROUP, "SyncGroup", 0, 5, 4),
    entry(DESCRIBE_GROUPS, "DescribeGroups", 0, 5, 5),
    entry(LIST_GROUPS, "ListGroups", 0, 4, 3),
    entry(SASL_HANDSHAKE, "SaslHandshake", 0, 1, NEVER),
    // v4 changes nothing on the wire for weir (it names no features).
    entry(API_VERSIONS, "ApiVersions", 0, 4, 3),
    entry(CREATE_TOPICS, "CreateTopics", 2, 7, 5),
    entry(DELETE_TOPICS, "DeleteTopics", 1, 6, 4),
    entry(DELETE_RECORDS, "DeleteRecords", 0, 2, 2),
    entry(INIT_PRODUCER_ID, "InitProducerId", 0, 4, 2),
    entry(OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderEpoch", 2, 4, 4),
    entry(ADD_PARTITIONS_TO_TXN, "AddPartitionsToTxn", 0, 5, 3),
    entry(ADD_OFFSETS_TO_TXN, "AddOffsetsToTxn", 0, 3, 3),
    entry(END_TXN, "EndTxn", 0, 3, 3),
    entry(WRITE_TXN_MARKERS, "WriteTxnMarkers", 1, 1, 1),
    entry(TXN_OFFSET_COMMIT, "TxnOffsetCommit", 0, 3, 3),
    // Kafka 4.x defines v1-v3 (KIP-896 removed v0); librdkafka sends v1.
    entry(DESCRIBE_ACLS, "DescribeAcls", 1, 3, 2),
    entry(CREATE_ACLS, "CreateAcls", 1, 3, 2),
    entry(DELETE_ACLS, "DeleteAcls", 1, 3, 2),
    entry(DESCRIBE_CONFIGS, "DescribeConfigs", 1, 4, 4),
    entry(ALTER_CONFIGS, "AlterConfigs", 0, 2, 2),
    entry(ALTER_REPLICA_LOG_DIRS, "AlterReplicaLogDirs", 1, 2, 2),
    entry(DESCRIBE_LOG_DIRS, "DescribeLogDirs", 1, 4, 2),
    entry(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2, 2),
    entry(CREATE_PARTITIONS, "CreatePartitions", 0, 3, 2),
    entry(DELETE_GROUPS, "DeleteGroups", 0, 2, 2),
    entry(ELECT_LEADERS, "ElectLeaders", 0, 2, 2),
    entry(
        INCREMENTAL_ALTER_CONFIGS,
        "IncrementalAlterConfigs",
        0,
        1,
        1,
    ),
    entry(
        ALTER_PARTITION_REASSIGNMENTS,
        "AlterPartitionReassignments",
        0,
        1,
        0,
    ),
    entry(
        LIST_PARTITION_REASSIGNMENTS,
        "ListPartitionReassignments",
        0,
        0,
        0,
    ),
    entry(OFFSET_DELETE, "OffsetDelete", 0, 0, NEVER),
    entry(
        DESCRIBE_USER_SCRAM_CREDENTIALS,
        "DescribeUserScramCredentials",
        0,
        0,
        0,
    ),
    entry(
        ALTER_USER_SCRAM_CREDENTIALS,
        "AlterUserScramCredentials",
        0,
        0,
        0,
    ),
    entry(DESCRIBE_CLUSTER, "DescribeCluster", 0, 1, 0),
    entry(DESCRIBE_PRODUCERS, "DescribeProducers", 0, 0, 0),
    entry(DESCRIBE_TRANSACTIONS, "DescribeTransactions", 0, 0, 0),
    entry(LIST_TRANSACTIONS, "ListTransactions", 0, 0, 0),
];

/// The table entry for `api_key`, if weir knows it.
pub fn lookup(api_key: i16) -> Option<&'static ApiEntry> {
    API_TABLE
        .binary_search_by_key(&api_key, |e| e.key)
        .ok()
        .map(|i| &API_TABLE[i])
}

/// Whether weir's table includes `(api_key, api_version)`.
pub fn is_supported(api_key: i16, api_version: i16) -> bool {
    lookup(api_key).is_some_and(|e| e.supports(api_version))
}

/// Whether requests of `(api_key, api_version)` use the flexible encoding.
pub fn is_flexible(api_key: i16, api_version: i16) -> bool {
    lookup(api_key).is_some_and(|e| e.is_flexible(api_version))
}

/// The ApiVersions response listing the APIs for which `served(key)` is true: the broker
/// advertises only what it implements right now.
pub fn api_versions_response(served: impl Fn(i16) -> bool) -> ApiVersionsResponse {
    let api_keys = API_TABLE
        .iter()
        .filter(|e| served(e.key))
        .map(|e| {
            ApiVersion::default()
                .with_api_key(e.key)
                .with_min_version(e.min_version)
                .with_max_version(e.max_version)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(api_keys)
}

/// Whether an ApiVersions request at `version` must get the KIP-511 fallback.
pub fn api_versions_needs_fallback(version: i16) -> bool {
    lookup(API_VERSIONS).is_some_and(|e| version > e.max_version)
}

/// KIP-511: a client that sends ApiVersions above our maximum gets UNSUPPORTED_VERSION and
/// the table, encoded as ApiVersions v0 (response header v0), so that it can retry with a
/// version we speak. Encode the result with version 0.
pub fn api_versions_fallback(served: impl Fn(i16) -> bool) -> ApiVersionsResponse {
    api_versions_response(served).with_error_code(ERROR_UNSUPPORTED_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiKey;

    #[test]
    fn table_is_sorted_and_ranges_are_sane() {
        for pair in API_TABLE.windows(2) {
            assert!(pair[0].key < pair[1].key, "{} out of order", pair[1].name);
        }
        for e in API_TABLE {
            assert!(e.min_version <= e.max_version, "{}", e.name);
        }
    }

    /// The flexible thresholds agree with kafka-protocol's generated header versions for
    /// every version in range.
    #[test]
    fn flexible_versions_match_kafka_protocol() {
        for e in API_TABLE {
            let key = ApiKey::try_from(e.key).expect("kafka-protocol knows every key we list");
            for v in e.min_version..=e.max_version {
                let expected = key.request_header_version(v) == 2;
                assert_eq!(e.is_flexible(v), expected, "{} v{v}", e.name);
            }
        }
    }

    fn overlaps(key: i16, min: i16, max: i16) -> bool {
        lookup(key).is_some_and(|e| e.min_version <= max && min <= e.max_version)
    }

    /// librdkafka 2.0.2's feature map (rdkafka_feature.c): each feature needs all its ranges
    /// to overlap ours.
    #[test]
    fn librdkafka_2_0_2_features_are_enabled() {
        let needs: &[(i16, i16, i16)] = &[
            // rdkafka_msgset_writer.c: gzip/snappy/lz4 need Produce 0..0, zstd 0..7.
            (PRODUCE, 0, 0),
            (PRODUCE, 0, 7),
            (PRODUCE, 3, 3),
            (FETCH, 4, 4),
            (PRODUCE, 7, 7),
            (FETCH, 10, 10),
            (API_VERSIONS, 0, 0),
            (FIND_COORDINATOR, 0, 0),
            (OFFSET_COMMIT, 1, 2),
            (OFFSET_FETCH, 1, 1),
            (JOIN_GROUP, 0, 0),
            (SYNC_GROUP, 0, 0),
            (HEARTBEAT, 0, 0),
            (LEAVE_GROUP, 0, 0),
            (LIST_OFFSETS, 1, 1),
            (INIT_PRODUCER_ID, 0, 0),
            (SASL_HANDSHAKE, 0, 1),
            (SASL_AUTHENTICATE, 0, 1),
        ];
        for &(key, min, max) in needs {
            assert!(overlaps(key, min, max), "key {key} {min}..{max}");
        }
    }

    /// kafkajs 2.2.4 / aiokafka 0.14 need a non-flexible version of what they use.
    #[test]
    fn non_flexible_clients_have_a_version() {
        for &(key, client_max) in &[(PRODUCE, 7), (FETCH, 11), (METADATA, 5), (API_VERSIONS, 2)] {
            let e = lookup(key).expect("listed");
            assert!(e.min_version <= client_max);
            assert!(!e.is_flexible(client_max.min(e.max_version)));
        }
    }

    #[test]
    fn api_versions_lists_only_served_keys() {
        let resp = api_versions_response(|k| k == PRODUCE || k == API_VERSIONS);
        let keys: Vec<i16> = resp.api_keys.iter().map(|a| a.api_key).collect();
        assert_eq!(keys, vec![PRODUCE, API_VERSIONS]);
        assert_eq!(resp.api_keys[0].max_version, 9);
        assert_eq!(resp.api_keys[0].min_version, 0);
        let fallback = api_versions_fallback(|_| true);
        assert_eq!(fallback.error_code, ERROR_UNSUPPORTED_VERSION);
        assert_eq!(fallback.api_keys.len(), API_TABLE.len());
        assert!(api_versions_needs_fallback(5));
        assert!(!api_versions_needs_fallback(4));
    }
}
