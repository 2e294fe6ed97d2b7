//! Replication: followers copy their leaders by fetching (ISR, HW and epochs live in
//! `partition::replica`; the leader's side of a follower's Fetch is `partition::read`).
//!
//! - [`client`]: a broker's own connection to another broker (glommio, bounded, deadlines).
//! - [`fetcher`]: one replication fetcher per (shard, source node): one Fetch with this
//!   node's `replica_id` for every partition the shard follows from that node; appends
//!   keeping the leader's offsets, learns the HW, truncates by epoch (KIP-320).
//!
//! Who follows whom comes from the cluster metadata (the controller, `shard::replicas`);
//! a single node follows nobody.

pub mod client;
pub mod fetcher;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::FetchPartition;
use wire::Offset;

pub use fetcher::{FetcherConfig, ReplicaFetcher, RoundStats};

/// weir's one addition to the Fetch a follower sends (a tagged field of a fetch
/// partition, flexible versions only; a broker that does not know it skips it, as the
/// protocol says): where the follower's completed writes end, 8 bytes big-endian. A
/// follower sends it when it fetches from further on, because it asks for the next
/// records while it still writes the last ones (`ReplicaFetcher::round`). The leader
/// counts only the written end as the follower's log end for the HW and the ISR, so an
/// acknowledgement never covers a record a SIGKILL of the follower could still take.
/// Kafka needs no such field: its follower's fetch offset covers records in its page
/// cache, which outlive the process.
pub const WRITTEN_END_TAG: i32 = 0x7765;

/// The fetch partition `p` with the follower's written end `end` attached.
pub fn with_written_end(p: FetchPartition, end: Offset) -> FetchPartition {
    p.with_unknown_tagged_field(
        WRITTEN_END_TAG,
        Bytes::copy_from_slice(&end.get().to_be_bytes()),
    )
}

/// The written end a follower attached to `p`, if any (a malformed one is ignored: the
/// fetch offset stands).
pub fn written_end(p: &FetchPartition) -> Option<Offset> {
    let raw = p.unknown_tagged_fields.get(&WRITTEN_END_TAG)?;
    let bytes: [u8; 8] = raw.as_ref().try_into().ok()?;
    Some(Offset(i64::from_be_bytes(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::FetchRequest;
    use kafka_protocol::messages::fetch_request::FetchTopic;
    use kafka_protocol::protocol::{Decodable, Encodable};

    /// The written end survives the Fetch codec at the version the fetchers speak, and a
    /// partition without it has none.
    #[test]
    fn the_written_end_travels_in_a_tagged_field() {
        let with = with_written_end(FetchPartition::default().with_fetch_offset(11), Offset(9));
        let without = FetchPartition::default().with_partition(1);
        let req = FetchRequest::default().with_topics(vec![
            FetchTopic::default().with_partitions(vec![with, without]),
        ]);
        let mut buf = bytes::BytesMut::new();
        req.encode(&mut buf, 15).expect("encode");
        let back = FetchRequest::decode(&mut buf.freeze(), 15).expect("decode");
        let parts = &back.topics[0].partitions;
        assert_eq!(written_end(&parts[0]), Some(Offset(9)));
        assert_eq!(written_end(&parts[1]), None);
    }
}
