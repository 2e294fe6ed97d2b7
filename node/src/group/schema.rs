//! The records of `__consumer_offsets`, in Kafka's own key/value schemas so that Kafka's
//! tooling can read weir's log (and a Kafka log can be replayed by weir).
//!
//! All integers are big-endian; a `string` is an int16 length then UTF-8 bytes (length -1 =
//! null for nullable strings); `bytes` is an int32 length then the bytes.
//!
//! ```text
//! key, offset commit   (version 1): int16 version, string group, string topic, int32 partition
//! key, group metadata  (version 2): int16 version, string group
//! value, offset commit (version 3): int16 version, int64 offset, int32 leader_epoch,
//!                                   string metadata, int64 commit_timestamp
//! value, group metadata (version 3): int16 version, string protocol_type, int32 generation,
//!     nullable string protocol, nullable string leader, int64 current_state_timestamp,
//!     int32 count, then per member: string member_id, nullable string group_instance_id,
//!     string client_id, string client_host, int32 rebalance_timeout, int32 session_timeout,
//!     bytes subscription, bytes assignment
//! ```
//!
//! Reading accepts every older value version (offset commit v0-v3, group metadata v0-v3).
//! A record with a null value is a tombstone: the key is deleted.

use bytes::{BufMut, Bytes, BytesMut};
use wire::{LeaderEpoch, Offset};

/// Key version of an offset commit (0 and 1 share the layout).
pub const KEY_OFFSET_COMMIT: i16 = 1;
/// Key version of a group's metadata.
pub const KEY_GROUP_METADATA: i16 = 2;
/// Value version weir writes for offset commits.
pub const VALUE_OFFSET_COMMIT: i16 = 3;
/// Value version weir writes for group metadata.
pub const VALUE_GROUP_METADATA: i16 = 3;

/// Why a stored record could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchemaError {
    #[error("record ends at byte {at}, {need} more needed")]
    Eof { at: usize, need: usize },
    #[error("unknown {what} version {version}")]
    Version { what: &'static str, version: i16 },
    #[error("bad {what} at byte {at}")]
    Invalid { what: &'static str, at: usize },
}

/// A decoded key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group(String),
}

/// A committed offset as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: Offset,
    /// The leader epoch of the committed offset's record, `LeaderEpoch::NONE` if unknown.
    pub leader_epoch: LeaderEpoch,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
    /// Where in `__consumer_offsets` the batch holding this value starts (not stored in
    /// the value; `Offset::NONE` until known). A transaction's commit compares it: its
    /// offsets replace only values written before its own batch (Kafka's `olderThan`).
    pub appended_at: Offset,
}

/// One member as stored in a group's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MemberValue {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A group's metadata as stored (written when a generation completes or the group empties).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub state_timestamp_ms: i64,
    pub members: Vec<MemberValue>,
}

fn put_str(out: &mut BytesMut, s: &str) {
    // Kafka strings are at most i16::MAX bytes; longer ones are cut at a char boundary.
    let mut end = s.len().min(i16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.put_i16(end as i16);
    out.put_slice(&s.as_bytes()[..end]);
}

fn put_opt_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.put_i16(-1),
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_i32(b.len() as i32);
    out.put_slice(b);
}

/// The key of an offset commit.
pub fn offset_key(group: &str, topic: &str, partition: i32) -> Bytes {
    let mut out = BytesMut::with_capacity(8 + group.len() + topic.len());
    out.put_i16(KEY_OFFSET_COMMIT);
    put_str(&mut out, group);
    put_str(&mut out, topic);
    out.put_i32(partition);
    out.freeze()
}

/// The key of a group's metadata.
pub fn group_key(group: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + group.len());
    out.put_i16(KEY_GROUP_METADATA);
    put_str(&mut out, group);
    out.freeze()
}

/// An offset commit value (version 3).
pub fn offset_value(v: &OffsetValue) -> Bytes {
    let mut out = BytesMut::with_capacity(24 + v.metadata.len());
    out.put_i16(VALUE_OFFSET_COMMIT);
    out.put_i64(v.offset.get());
    out.put_i32(v.leader_epoch.get());
    put_str(&mut out, &v.metadata);
    out.put_i64(v.commit_timestamp_ms);
    out.freeze()
}

/// A group metadata value (version 3).
pub fn group_value(v: &GroupValue) -> Bytes {
    let mut out = BytesMut::with_capacity(64);
    out.put_i16(VALUE_GROUP_METADATA);
    put_str(&mut out, &v.protocol_type);
    out.put_i32(v.generation);
    put_opt_str(&mut out, v.protocol.as_deref());
    put_opt_str(&mut out, v.leader.as_deref());
    out.put_i64(v.state_timestamp_ms);
    out.put_i32(v.members.len() as i32);
    for m in &v.members {
        put_str(&mut out, &m.member_id);
        put_opt_str(&mut out, m.instance_id.as_deref());
        put_str(&mut out, &m.client_id);
        put_str(&mut out, &m.client_host);
        out.put_i32(m.rebalance_timeout_ms);
        out.put_i32(m.session_timeout_ms);
        put_bytes(&mut out, &m.subscription);
        put_bytes(&mut out, &m.assignment);
    }
    out.freeze()
}

/// A bounds-checked reader over one key or value.
struct Reader<'a> {
    buf: &'a Bytes,
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SchemaError> {
        let have = self.buf.len() - self.at;
        if n > have {
            return Err(SchemaError::Eof {
                at: self.at,
                need: n - have,
            });
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn i16(&mut self) -> Result<i16, SchemaError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, SchemaError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> Result<i64, SchemaError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    fn opt_str(&mut self) -> Result<Option<String>, SchemaError> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        let at = self.at;
        let b = self.take(len as usize)?;
        let s = std::str::from_utf8(b).map_err(|_| SchemaError::Invalid { what: "string", at })?;
        Ok(Some(s.to_string()))
    }

    fn str(&mut self) -> Result<String, SchemaError> {
        let at = self.at;
        self.opt_str()?.ok_or(SchemaError::Invalid {
            what: "null string",
            at,
        })
    }

    fn bytes(&mut self) -> Result<Bytes, SchemaError> {
        let at = self.at;
        let len = self.i32()?;
        if len < 0 {
            return Ok(Bytes::new());
        }
        self.take(len as usize)?;
        Ok(self.buf.slice(at + 4..self.at))
    }
}

/// Decodes a record key.
pub fn decode_key(buf: &Bytes) -> Result<Key, SchemaError> {
    let mut r = Reader { buf, at: 0 };
    match r.i16()? {
        0 | 1 => Ok(Key::Offset {
            group: r.str()?,
            topic: r.str()?,
            partition: r.i32()?,
        }),
        2 => Ok(Key::Group(r.str()?)),
        version => Err(SchemaError::Version {
            what: "key",
            version,
        }),
    }
}

/// Decodes an offset commit value of any version 0..=3.
pub fn decode_offset_value(buf: &Bytes) -> Result<OffsetValue, SchemaError> {
    let mut r = Reader { buf, at: 0 };
    let version = r.i16()?;
    if !(0..=3).contains(&version) {
        return Err(SchemaError::Version {
            what: "offset value",
            version,
        });
    }
    let offset = Offset(r.i64()?);
    let leader_epoch = LeaderEpoch(if version >= 3 { r.i32()? } else { -1 });
    let metadata = r.str()?;
    let commit_timestamp_ms = r.i64()?;
    if version == 1 {
        r.i64()?; // expire_timestamp: retention is the broker's decision since Kafka 2.1
    }
    Ok(OffsetValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
        appended_at: Offset::NONE,
    })
}

/// Decodes a group metadata value of any version 0..=3.
pub fn decode_group_value(buf: &Bytes) -> Result<GroupValue, SchemaError> {
    let mut r = Reader { buf, at: 0 };
    let version = r.i16()?;
    if !(0..=3).contains(&version) {
        return Err(SchemaError::Version {
            what: "group value",
            version,
        });
    }
    let protocol_type = r.str()?;
    let generation = r.i32()?;
    let protocol = r.opt_str()?;
    let leader = r.opt_str()?;
    let state_timestamp_ms = if version >= 2 { r.i64()? } else { -1 };
    let count = r.i32()?;
    // Every member takes at least 18 bytes (v0: three empty strings, a timeout, two empty
    // byte arrays): bound the count by what is present.
    let left = buf.len() - r.at;
    if count < 0 || count as usize > left / MEMBER_MIN_BYTES {
        return Err(SchemaError::Invalid {
            what: "member count",
            at: r.at,
        });
    }
    let mut members = Vec::with_capacity(count as usize);
    for _ in 0..count {
        members.push(decode_member(&mut r, version)?);
    }
    Ok(GroupValue {
        protocol_type,
        generation,
        protocol,
        leader,
        state_timestamp_ms,
        members,
    })
}

/// The smallest stored member (version 0, every string and byte array empty).
const MEMBER_MIN_BYTES: usize = 18;

fn decode_member(r: &mut Reader<'_>, version: i16) -> Result<MemberValue, SchemaError> {
    let member_id = r.str()?;
    let instance_id = if version >= 3 { r.opt_str()? } else { None };
    let client_id = r.str()?;
    let client_host = r.str()?;
    let session_timeout_ms;
    let rebalance_timeout_ms;
    if version >= 1 {
        rebalance_timeout_ms = r.i32()?;
        session_timeout_ms = r.i32()?;
    } else {
        session_timeout_ms = r.i32()?;
        rebalance_timeout_ms = session_timeout_ms;
    }
    Ok(MemberValue {
        member_id,
        instance_id,
        client_id,
        client_host,
        rebalance_timeout_ms,
        session_timeout_ms,
        subscription: r.bytes()?,
        assignment: r.bytes()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_round_trip_and_layout() {
        let key = offset_key("g", "t", 7);
        assert_eq!(&key[..], &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 7]);
        let Ok(Key::Offset {
            group,
            topic,
            partition,
        }) = decode_key(&key)
        else {
            panic!("offset key");
        };
        assert_eq!((group.as_str(), topic.as_str(), partition), ("g", "t", 7));
        let v = OffsetValue {
            offset: Offset(42),
            leader_epoch: LeaderEpoch(3),
            metadata: "m".into(),
            commit_timestamp_ms: 1000,
            appended_at: Offset::NONE,
        };
        assert_eq!(decode_offset_value(&offset_value(&v)), Ok(v));
    }

    #[test]
    fn group_round_trip() {
        let v = GroupValue {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            state_timestamp_ms: 99,
            members: vec![MemberValue {
                member_id: "m1".into(),
                instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300,
                session_timeout_ms: 100,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        assert_eq!(decode_group_value(&group_value(&v)), Ok(v));
        assert_eq!(decode_key(&group_key("g")), Ok(Key::Group("g".into())));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            &[0, 9],
            &[0, 2, 0, 5, b'a'],
            &[0, 3, 0, 0, 0, 0, 0x7f, 0xff, 0xff],
        ] {
            let b = Bytes::copy_from_slice(bytes);
            assert!(decode_key(&b).is_err());
            assert!(decode_offset_value(&b).is_err());
            assert!(decode_group_value(&b).is_err());
        }
        let mut huge = BytesMut::new();
        huge.put_i16(3);
        put_str(&mut huge, "consumer");
        huge.put_i32(1);
        huge.put_i16(-1);
        huge.put_i16(-1);
        huge.put_i64(0);
        huge.put_i32(i32::MAX);
        assert!(decode_group_value(&huge.freeze()).is_err());
    }

    #[test]
    fn smallest_v0_members_are_accepted() {
        let mut v0 = BytesMut::new();
        v0.put_i16(0);
        put_str(&mut v0, "consumer");
        v0.put_i32(1);
        v0.put_i16(-1);
        v0.put_i16(-1);
        v0.put_i32(2);
        for _ in 0..2 {
            v0.put_bytes(0, 6); // member id, client id, client host: all empty
            v0.put_i32(10_000); // session timeout
            v0.put_bytes(0, 8); // subscription, assignment: empty
        }
        let v = decode_group_value(&v0.freeze()).expect("two 18-byte members");
        assert_eq!(v.members.len(), 2);
        assert_eq!(v.members[1].rebalance_timeout_ms, 10_000);
    }
}
