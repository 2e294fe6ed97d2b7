//! Distinct types for distinct numbers: an offset is not an epoch is not a sequence.

use std::fmt;

macro_rules! newtype {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw value, for encoding.
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }
    };
}

newtype!(
    /// A Kafka offset: the position of a record in a partition's log.
    Offset,
    i64
);
newtype!(
    /// The epoch of a partition's leader; stamped into every batch it appends.
    LeaderEpoch,
    i32
);
newtype!(
    /// A node (broker) of the cluster: `node.id`, a replica, a leader, a Fetch's
    /// `replica_id`. Negative values are Kafka's "not a broker" markers (a consumer's -1).
    NodeId,
    i32
);
newtype!(
    /// One run of a node's process (Kafka's broker epoch, KIP-380/903): drawn when the
    /// process starts, registered with the controller, and carried by its follower
    /// fetches, so that a restarted node is told apart from the run before it (which may
    /// have acknowledged records the restart lost). Compared only for equality; -1 is
    /// "unknown" (a fetch older than v15).
    BrokerEpoch,
    i64
);
newtype!(
    /// An idempotent or transactional producer's id; -1 means "none".
    ProducerId,
    i64
);
newtype!(
    /// A producer id's epoch; a higher epoch fences the lower.
    ProducerEpoch,
    i16
);
newtype!(
    /// A producer's per-partition sequence number of a record; wraps at `i32::MAX`.
    Sequence,
    i32
);

impl Offset {
    /// Kafka's "no offset" value.
    pub const NONE: Offset = Offset(-1);

    /// This offset plus `n` records.
    pub const fn add(self, n: i64) -> Offset {
        Offset(self.0 + n)
    }
}

impl LeaderEpoch {
    /// Kafka's "no epoch" value, carried by batches a client sends.
    pub const NONE: LeaderEpoch = LeaderEpoch(-1);
}

impl BrokerEpoch {
    /// Kafka's "no broker epoch".
    pub const NONE: BrokerEpoch = BrokerEpoch(-1);

    /// A new process's epoch: random, never negative (negative values are Kafka's
    /// markers).
    pub fn draw(random: u64) -> BrokerEpoch {
        BrokerEpoch((random >> 1) as i64)
    }
}

impl ProducerId {
    /// Kafka's "no producer id": a batch from a non-idempotent producer.
    pub const NONE: ProducerId = ProducerId(-1);

    /// Whether this is a real producer id (idempotent or transactional batch).
    pub const fn is_some(self) -> bool {
        self.0 >= 0
    }
}

impl Sequence {
    /// Kafka's "no sequence".
    pub const NONE: Sequence = Sequence(-1);

    /// The sequence `n` records after this one, wrapping at `i32::MAX` to 0 as Kafka does.
    pub const fn add_wrapping(self, n: i32) -> Sequence {
        let next = self.0 as i64 + n as i64;
        if next > i32::MAX as i64 {
            Sequence((next - i32::MAX as i64 - 1) as i32)
        } else {
            Sequence(next as i32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_wraps_like_kafka() {
        assert_eq!(Sequence(0).add_wrapping(5), Sequence(5));
        assert_eq!(Sequence(i32::MAX).add_wrapping(1), Sequence(0));
        assert_eq!(Sequence(i32::MAX - 1).add_wrapping(3), Sequence(1));
    }
}
