//! The Fetch response, hand-encoded for the hot path as a list of chunks: small header
//! buffers weir writes, interleaved with the record `Bytes` passed in, untouched. Writing
//! the chunks in order (vectored write) sends the response; no record byte is copied.
//!
//! Layout for the versions weir advertises (4–17; v12+ is flexible):
//!
//! ```text
//! [size int32] [correlation_id int32] [tagged fields, v12+]
//! throttle_time_ms int32
//! error_code int16, session_id int32                    v7+
//! responses array of
//!   topic string                                        v4–v12
//!   topic_id uuid                                       v13+
//!   partitions array of
//!     partition_index int32, error_code int16, high_watermark int64
//!     last_stable_offset int64
//!     log_start_offset int64                            v5+
//!     aborted_transactions nullable array of (producer_id int64, first_offset int64
//!                                             [, tagged fields v12])
//!     preferred_read_replica int32                      v11+
//!     records nullable bytes                            <- record chunks go here
//!     [tagged fields v12+: 0 = diverging_epoch, 1 = current_leader]
//!   [tagged fields v12+]
//! [tagged fields v12+: 0 = node_endpoints, v16+]
//! ```
//!
//! A tagged field is written only when it differs from its default (Kafka's rule and
//! kafka-protocol's): a diverging epoch or current leader of (-1, -1) is left out.

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::{put_array_len, put_bytes_len, put_nullable_string, put_string, put_uvarint};
use crate::frame::{self, SIZE_PREFIX_BYTES};
use crate::{WireError, api};

/// An aborted transaction in the fetched range (read_committed consumers skip it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedTransaction {
    pub producer_id: i64,
    pub first_offset: i64,
}

/// KIP-320: the follower's log diverges from the leader's at this epoch/end offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DivergingEpoch {
    pub epoch: i32,
    pub end_offset: i64,
}

/// KIP-951: who leads a partition now (sent with NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CurrentLeader {
    pub leader_id: i32,
    pub leader_epoch: i32,
}

/// KIP-951 (v16+): the address of a node named by a partition's `current_leader`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEndpoint {
    pub node_id: i32,
    pub host: Bytes,
    pub port: i32,
    pub rack: Option<Bytes>,
}

/// One partition of a Fetch response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchPartitionResponse {
    pub partition_index: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// `None` encodes null (Kafka sends null when the isolation is read_uncommitted).
    pub aborted_transactions: Option<Vec<AbortedTransaction>>,
    pub preferred_read_replica: i32,
    /// The record batches, as slices of cached buffers or file reads. `None` encodes null.
    pub records: Option<Vec<Bytes>>,
    /// Sent at v12+.
    pub diverging_epoch: Option<DivergingEpoch>,
    /// Sent at v12+ (tag 1).
    pub current_leader: Option<CurrentLeader>,
}

impl Default for FetchPartitionResponse {
    fn default() -> Self {
        FetchPartitionResponse {
            partition_index: 0,
            error_code: 0,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            aborted_transactions: None,
            preferred_read_replica: -1,
            records: None,
            diverging_epoch: None,
            current_leader: None,
        }
    }
}

/// One topic of a Fetch response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchTopicResponse {
    /// Written at v4–v12.
    pub topic: Bytes,
    /// KIP-516 topic id, written instead of the name at v13+.
    pub topic_id: u128,
    pub partitions: Vec<FetchPartitionResponse>,
}

/// A whole Fetch response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchResponseParts {
    pub throttle_time_ms: i32,
    pub error_code: i16,
    pub session_id: i32,
    pub topics: Vec<FetchTopicResponse>,
    /// v16+ (top-level tag 0): endpoints of the leaders named in `current_leader`.
    pub node_endpoints: Vec<NodeEndpoint>,
}

/// Builds the chunk list: header bytes go into one buffer; at each record slice the buffer
/// is cut (`split`, no copy) so the slice sits between two header pieces.
struct Chunks {
    header: BytesMut,
    out: Vec<Bytes>,
    records_bytes: usize,
}

impl Chunks {
    fn push_records(&mut self, records: &[Bytes]) {
        let piece = self.header.split().freeze();
        self.out.push(piece);
        for r in records.iter().filter(|r| !r.is_empty()) {
            self.records_bytes += r.len();
            self.out.push(r.clone());
        }
    }
}

/// Encodes a Fetch response frame (size prefix included) at `version` as chunks. The sum of
/// the chunk lengths is the frame length.
pub fn encode_fetch_response(
    correlation_id: i32,
    version: i16,
    parts: &FetchResponseParts,
) -> Result<Vec<Bytes>, WireError> {
    if !api::is_supported(api::FETCH, version) {
        return Err(WireError::UnsupportedVersion {
            api_key: api::FETCH,
            api_version: version,
        });
    }
    let flexible = api::is_flexible(api::FETCH, version);
    let mut c = Chunks {
        // One allocation for every header piece: splitting never reallocates while the
        // estimate holds (it is an upper bound for the fields written below).
        header: BytesMut::with_capacity(header_bytes_max(parts)),
        out: Vec::with_capacity(1 + 2 * parts.topics.len()),
        records_bytes: 0,
    };
    // The size prefix is patched once the total is known: this first chunk stays mutable
    // until then because it is split off last.
    let mut first = BytesMut::with_capacity(SIZE_PREFIX_BYTES + 16);
    first.put_i32(0);
    frame::encode_response_header(correlation_id, i16::from(flexible), &mut first);
    c.header.put_i32(parts.throttle_time_ms);
    if version >= 7 {
        c.header.put_i16(parts.error_code);
        c.header.put_i32(parts.session_id);
    }
    put_array_len(&mut c.header, parts.topics.len(), flexible);
    for topic in &parts.topics {
        if version >= 13 {
            c.header.put_u128(topic.topic_id);
        } else {
            put_string(&mut c.header, &topic.topic, flexible);
        }
        put_array_len(&mut c.header, topic.partitions.len(), flexible);
        for p in &topic.partitions {
            encode_partition(&mut c, p, version, flexible)?;
        }
        if flexible {
            c.header.put_u8(0);
        }
    }
    if flexible {
        encode_top_tags(&mut c.header, parts, version);
    }
    let tail = c.header.split().freeze();
    c.out.push(tail);
    let total = first.len() + c.out.iter().map(Bytes::len).sum::<usize>() - SIZE_PREFIX_BYTES;
    let size = i32::try_from(total).map_err(|_| WireError::TooLarge {
        field: "fetch response size",
        offset: 0,
        size: total as u64,
        max: i32::MAX as u64,
    })?;
    first[..SIZE_PREFIX_BYTES].copy_from_slice(&size.to_be_bytes());
    c.out.insert(0, first.freeze());
    c.out.retain(|b| !b.is_empty());
    Ok(c.out)
}

fn encode_partition(
    c: &mut Chunks,
    p: &FetchPartitionResponse,
    version: i16,
    flexible: bool,
) -> Result<(), WireError> {
    let h = &mut c.header;
    h.put_i32(p.partition_index);
    h.put_i16(p.error_code);
    h.put_i64(p.high_watermark);
    h.put_i64(p.last_stable_offset);
    if version >= 5 {
        h.put_i64(p.log_start_offset);
    }
    match &p.aborted_transactions {
        None if flexible => h.put_u8(0),
        None => h.put_i32(-1),
        Some(list) => {
            put_array_len(h, list.len(), flexible);
            for a in list {
                h.put_i64(a.producer_id);
                h.put_i64(a.first_offset);
                if flexible {
                    h.put_u8(0);
                }
            }
        }
    }
    if version >= 11 {
        h.put_i32(p.preferred_read_replica);
    }
    let len = p
        .records
        .as_ref()
        .map(|list| list.iter().map(Bytes::len).sum::<usize>());
    if len.is_some_and(|n| n > i32::MAX as usize - 1) {
        return Err(WireError::TooLarge {
            field: "records",
            offset: 0,
            size: len.unwrap_or(0) as u64,
            max: i32::MAX as u64,
        });
    }
    put_bytes_len(h, len, flexible);
    if let Some(list) = &p.records {
        c.push_records(list);
    }
    if flexible {
        encode_partition_tags(&mut c.header, p);
    }
    Ok(())
}

/// Partition tagged fields at v12+, in tag order: diverging_epoch (0), current_leader (1).
/// weir never sends snapshot_id (2, KRaft's own fetches).
fn encode_partition_tags(h: &mut BytesMut, p: &FetchPartitionResponse) {
    let diverging = p
        .diverging_epoch
        .filter(|d| (d.epoch, d.end_offset) != (-1, -1));
    let leader = p
        .current_leader
        .filter(|l| (l.leader_id, l.leader_epoch) != (-1, -1));
    h.put_u8(u8::from(diverging.is_some()) + u8::from(leader.is_some()));
    if let Some(d) = diverging {
        h.put_u8(0); // tag 0
        put_uvarint(h, 4 + 8 + 1); // size of the struct
        h.put_i32(d.epoch);
        h.put_i64(d.end_offset);
        h.put_u8(0); // the struct's own tagged fields
    }
    if let Some(l) = leader {
        h.put_u8(1); // tag 1
        put_uvarint(h, 4 + 4 + 1);
        h.put_i32(l.leader_id);
        h.put_i32(l.leader_epoch);
        h.put_u8(0);
    }
}

/// Top-level tagged fields: node_endpoints (tag 0) at v16+ when there are any.
fn encode_top_tags(h: &mut BytesMut, parts: &FetchResponseParts, version: i16) {
    if version < 16 || parts.node_endpoints.is_empty() {
        h.put_u8(0);
        return;
    }
    let mut body = BytesMut::with_capacity(node_endpoints_bytes_max(&parts.node_endpoints));
    put_array_len(&mut body, parts.node_endpoints.len(), true);
    for n in &parts.node_endpoints {
        body.put_i32(n.node_id);
        put_string(&mut body, &n.host, true);
        body.put_i32(n.port);
        put_nullable_string(&mut body, n.rack.as_deref(), true);
        body.put_u8(0);
    }
    h.put_u8(1); // one tagged field
    h.put_u8(0); // tag 0
    put_uvarint(h, body.len() as u32);
    h.put_slice(&body);
}

/// An upper bound on the bytes of the node_endpoints tagged field.
fn node_endpoints_bytes_max(nodes: &[NodeEndpoint]) -> usize {
    5 + nodes
        .iter()
        .map(|n| 4 + 5 + n.host.len() + 4 + 5 + n.rack.as_ref().map_or(0, Bytes::len) + 1)
        .sum::<usize>()
}

/// An upper bound on the header bytes `encode_fetch_response` writes for `parts`.
fn header_bytes_max(parts: &FetchResponseParts) -> usize {
    // Top level: throttle, error, session, array length, tagged fields (count, tag,
    // size, node endpoints).
    let mut n = 4 + 2 + 4 + 5 + 1 + 1 + 5 + node_endpoints_bytes_max(&parts.node_endpoints);
    for t in &parts.topics {
        n += t.topic.len().max(16) + 5 + 5 + 1;
        for p in &t.partitions {
            // Fixed fields 42, aborted length 5, records length 5, tags 1 + 15 + 11.
            let aborted = p.aborted_transactions.as_ref().map_or(0, Vec::len);
            n += 42 + 5 + 17 * aborted + 5 + 27;
        }
    }
    n
}

/// Total bytes of a chunk list (the frame length, prefix included).
pub fn chunks_len(chunks: &[Bytes]) -> usize {
    chunks.iter().map(Bytes::len).sum()
}

/// Concatenates chunks (tests, and callers without vectored writes).
pub fn concat_chunks(chunks: &[Bytes]) -> Bytes {
    let mut out = BytesMut::with_capacity(chunks_len(chunks));
    for c in chunks {
        out.put_slice(c);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(records: Bytes) -> FetchResponseParts {
        FetchResponseParts {
            throttle_time_ms: 0,
            error_code: 0,
            session_id: 0,
            node_endpoints: Vec::new(),
            topics: vec![FetchTopicResponse {
                topic: Bytes::from_static(b"events"),
                topic_id: 7,
                partitions: vec![
                    FetchPartitionResponse {
                        partition_index: 0,
                        high_watermark: 10,
                        records: Some(vec![records.slice(..4), records.slice(4..)]),
                        ..FetchPartitionResponse::default()
                    },
                    FetchPartitionResponse {
                        partition_index: 1,
                        error_code: 6,
                        ..FetchPartitionResponse::default()
                    },
                ],
            }],
        }
    }

    #[test]
    fn record_chunks_are_the_callers_bytes() {
        let records = Bytes::from(vec![7u8; 1000]);
        for version in 4..=17 {
            let chunks = encode_fetch_response(1, version, &sample(records.clone())).expect("ok");
            let total = chunks_len(&chunks);
            let size = i32::from_be_bytes(chunks[0][..4].try_into().expect("4 bytes"));
            assert_eq!(size as usize + 4, total);
            let shared = chunks
                .iter()
                .filter(|c| c.as_ptr() >= records.as_ptr() && !c.is_empty())
                .filter(|c| c.as_ptr() < records.as_ptr().wrapping_add(records.len()))
                .count();
            assert_eq!(shared, 2, "v{version}: both record slices passed through");
        }
    }

    #[test]
    fn unsupported_version_is_refused() {
        let r = encode_fetch_response(1, 19, &FetchResponseParts::default());
        assert!(matches!(r, Err(WireError::UnsupportedVersion { .. })));
    }
}
