//! Primitive readers and writers: big-endian integers, varints, strings, tagged fields.
//!
//! [`Reader`] checks every length against the bytes present before it slices, and reports
//! failures as [`WireError`] with the field name and the byte offset. It never allocates:
//! byte fields come back as `Bytes` slices of the caller's buffer when it has one.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

use crate::WireError;

/// Tagged fields per section above which a message is refused: Kafka defines a handful, so
/// a large count is garbage, and skipping each costs work.
pub const TAGGED_FIELDS_MAX: u32 = 1024;

/// A bounds-checked cursor over a byte slice.
pub struct Reader<'a> {
    buf: &'a [u8],
    owner: Option<&'a Bytes>,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over plain bytes: byte fields are copied out if asked for as `Bytes`.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            buf,
            owner: None,
            pos: 0,
        }
    }

    /// A reader whose byte fields are zero-copy slices of `owner`.
    pub fn over(owner: &'a Bytes) -> Reader<'a> {
        Reader {
            buf: owner,
            owner: Some(owner),
            pos: 0,
        }
    }

    /// A zero-copy reader starting at `pos`.
    pub fn over_at(owner: &'a Bytes, pos: usize) -> Reader<'a> {
        Reader {
            buf: owner,
            owner: Some(owner),
            pos: pos.min(owner.len()),
        }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    fn eof(&self, field: &'static str, need: usize) -> WireError {
        WireError::UnexpectedEof {
            field,
            offset: self.pos,
            need,
            have: self.remaining(),
        }
    }

    /// Advances past `n` bytes and returns their range.
    pub fn take(&mut self, field: &'static str, n: usize) -> Result<Range<usize>, WireError> {
        if n > self.remaining() {
            return Err(self.eof(field, n));
        }
        let range = self.pos..self.pos + n;
        self.pos += n;
        Ok(range)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let range = self.take(field, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[range]);
        Ok(out)
    }

    pub fn i8(&mut self, field: &'static str) -> Result<i8, WireError> {
        Ok(i8::from_be_bytes(self.array(field)?))
    }

    pub fn i16(&mut self, field: &'static str) -> Result<i16, WireError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    pub fn i32(&mut self, field: &'static str) -> Result<i32, WireError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    pub fn i64(&mut self, field: &'static str) -> Result<i64, WireError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// The next byte, if any, without advancing.
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// An unsigned LEB128 varint of at most 5 bytes (32 bits).
    pub fn uvarint(&mut self, field: &'static str) -> Result<u32, WireError> {
        // One byte is the common case (small lengths, counts and deltas), and it is read
        // once per field of every produced record: no loop for it.
        if let Some(byte) = self.peek().filter(|b| b & 0x80 == 0) {
            self.pos += 1;
            return Ok(u32::from(byte));
        }
        let start = self.pos;
        let mut value: u32 = 0;
        for i in 0..5 {
            let Some(byte) = self.peek() else {
                return Err(self.eof(field, 1));
            };
            self.pos += 1;
            value |= u32::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if i == 4 && byte > 0x0f {
                    break;
                }
                return Ok(value);
            }
        }
        Err(WireError::Invalid {
            field,
            offset: start,
            reason: "unsigned varint longer than 32 bits",
        })
    }

    /// A zigzag varint of at most 5 bytes (i32).
    pub fn varint(&mut self, field: &'static str) -> Result<i32, WireError> {
        let raw = self.uvarint(field)?;
        Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
    }

    /// A zigzag varlong of at most 10 bytes (i64).
    pub fn varlong(&mut self, field: &'static str) -> Result<i64, WireError> {
        if let Some(byte) = self.peek().filter(|b| b & 0x80 == 0) {
            self.pos += 1;
            let raw = i64::from(byte);
            return Ok((raw >> 1) ^ -(raw & 1));
        }
        let start = self.pos;
        let mut raw: u64 = 0;
        for i in 0..10 {
            let Some(byte) = self.peek() else {
                return Err(self.eof(field, 1));
            };
            self.pos += 1;
            raw |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if i == 9 && byte > 0x01 {
                    break;
                }
                return Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64));
            }
        }
        Err(WireError::Invalid {
            field,
            offset: start,
            reason: "varlong longer than 64 bits",
        })
    }

    /// The bytes in `range` as `Bytes`: a slice of the owner, or a copy without one.
    pub fn bytes_of(&self, range: Range<usize>) -> Bytes {
        match self.owner {
            Some(owner) => owner.slice(range),
            None => Bytes::copy_from_slice(&self.buf[range]),
        }
    }

    /// The bytes in `range` of the underlying slice.
    pub fn slice_of(&self, range: Range<usize>) -> &'a [u8] {
        &self.buf[range]
    }

    /// A classic nullable string/bytes with an i16 length (-1 = null).
    pub fn nullable_string_bytes(
        &mut self,
        field: &'static str,
    ) -> Result<Option<Bytes>, WireError> {
        let at = self.pos;
        let len = self.i16(field)?;
        if len < 0 {
            return if len == -1 {
                Ok(None)
            } else {
                Err(negative(field, at))
            };
        }
        let range = self.take(field, len as usize)?;
        Ok(Some(self.bytes_of(range)))
    }

    /// A classic non-null string with an i16 length.
    pub fn string_bytes(&mut self, field: &'static str) -> Result<Bytes, WireError> {
        let at = self.pos;
        self.nullable_string_bytes(field)?
            .ok_or_else(|| negative(field, at))
    }

    /// A compact nullable string/bytes: uvarint length + 1 (0 = null).
    pub fn compact_nullable_bytes(
        &mut self,
        field: &'static str,
    ) -> Result<Option<Bytes>, WireError> {
        let len = self.uvarint(field)?;
        if len == 0 {
            return Ok(None);
        }
        let range = self.take(field, (len - 1) as usize)?;
        Ok(Some(self.bytes_of(range)))
    }

    /// A compact non-null string.
    pub fn compact_bytes(&mut self, field: &'static str) -> Result<Bytes, WireError> {
        let at = self.pos;
        self.compact_nullable_bytes(field)?
            .ok_or_else(|| negative(field, at))
    }

    /// A string in the flexible or classic encoding.
    pub fn string(&mut self, field: &'static str, flexible: bool) -> Result<Bytes, WireError> {
        if flexible {
            self.compact_bytes(field)
        } else {
            self.string_bytes(field)
        }
    }

    /// A nullable string in the flexible or classic encoding.
    pub fn nullable_string(
        &mut self,
        field: &'static str,
        flexible: bool,
    ) -> Result<Option<Bytes>, WireError> {
        if flexible {
            self.compact_nullable_bytes(field)
        } else {
            self.nullable_string_bytes(field)
        }
    }

    /// Nullable bytes with an i32 length (classic) or compact length (flexible).
    pub fn nullable_bytes(
        &mut self,
        field: &'static str,
        flexible: bool,
    ) -> Result<Option<Range<usize>>, WireError> {
        let at = self.pos;
        let len: i64 = if flexible {
            i64::from(self.uvarint(field)?) - 1
        } else {
            i64::from(self.i32(field)?)
        };
        if len < 0 {
            return if len == -1 {
                Ok(None)
            } else {
                Err(negative(field, at))
            };
        }
        Ok(Some(self.take(field, len as usize)?))
    }

    /// An array length (classic i32 or compact uvarint), checked against the bytes left:
    /// every element of every Kafka array takes at least `min_element_bytes`, so a count
    /// that cannot fit is refused before anyone sizes a buffer from it. Null is `None`.
    pub fn array_len(
        &mut self,
        field: &'static str,
        flexible: bool,
        min_element_bytes: usize,
    ) -> Result<Option<usize>, WireError> {
        let at = self.pos;
        let len: i64 = if flexible {
            i64::from(self.uvarint(field)?) - 1
        } else {
            i64::from(self.i32(field)?)
        };
        if len < 0 {
            return if len == -1 {
                Ok(None)
            } else {
                Err(negative(field, at))
            };
        }
        let max = self.remaining() / min_element_bytes.max(1);
        if len as u64 > max as u64 {
            return Err(WireError::TooLarge {
                field,
                offset: at,
                size: len as u64,
                max: max as u64,
            });
        }
        Ok(Some(len as usize))
    }

    /// Skips a tagged-fields section (flexible versions): count, then (tag, size, bytes).
    pub fn skip_tagged_fields(&mut self) -> Result<(), WireError> {
        let at = self.pos;
        let count = self.uvarint("tagged fields")?;
        if count > TAGGED_FIELDS_MAX {
            return Err(WireError::TooLarge {
                field: "tagged fields",
                offset: at,
                size: u64::from(count),
                max: u64::from(TAGGED_FIELDS_MAX),
            });
        }
        for _ in 0..count {
            self.uvarint("tag")?;
            let size = self.uvarint("tagged field size")?;
            self.take("tagged field", size as usize)?;
        }
        Ok(())
    }
}

fn negative(field: &'static str, offset: usize) -> WireError {
    WireError::Invalid {
        field,
        offset,
        reason: "negative length",
    }
}

/// Appends an unsigned varint.
pub fn put_uvarint(out: &mut impl BufMut, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Appends a zigzag varint.
pub fn put_varint(out: &mut impl BufMut, value: i32) {
    put_uvarint(out, ((value << 1) ^ (value >> 31)) as u32);
}

/// Appends a zigzag varlong.
pub fn put_varlong(out: &mut impl BufMut, value: i64) {
    let mut raw = ((value << 1) ^ (value >> 63)) as u64;
    while raw >= 0x80 {
        out.put_u8((raw as u8) | 0x80);
        raw >>= 7;
    }
    out.put_u8(raw as u8);
}

/// Bytes an unsigned varint takes.
pub fn uvarint_size(value: u32) -> usize {
    match value {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0xfff_ffff => 4,
        _ => 5,
    }
}

/// Bytes a zigzag varint takes.
pub fn varint_size(value: i32) -> usize {
    uvarint_size(((value << 1) ^ (value >> 31)) as u32)
}

/// Bytes a zigzag varlong takes.
pub fn varlong_size(value: i64) -> usize {
    let mut raw = ((value << 1) ^ (value >> 63)) as u64;
    let mut n = 1;
    while raw >= 0x80 {
        raw >>= 7;
        n += 1;
    }
    n
}

/// Appends a string in the flexible (compact) or classic encoding. Lengths above the
/// encoding's limit are cut short by the caller's contract (topic names are ≤ 249 bytes).
pub fn put_string(out: &mut BytesMut, s: &[u8], flexible: bool) {
    if flexible {
        put_uvarint(out, s.len() as u32 + 1);
    } else {
        out.put_i16(s.len() as i16);
    }
    out.put_slice(s);
}

/// Appends a nullable string in the flexible or classic encoding.
pub fn put_nullable_string(out: &mut BytesMut, s: Option<&[u8]>, flexible: bool) {
    match s {
        Some(s) => put_string(out, s, flexible),
        None if flexible => out.put_u8(0),
        None => out.put_i16(-1),
    }
}

/// Appends an array length in the flexible or classic encoding.
pub fn put_array_len(out: &mut BytesMut, len: usize, flexible: bool) {
    if flexible {
        put_uvarint(out, len as u32 + 1);
    } else {
        out.put_i32(len as i32);
    }
}

/// Appends a nullable-bytes length (i32 classic, compact uvarint flexible).
pub fn put_bytes_len(out: &mut BytesMut, len: Option<usize>, flexible: bool) {
    match (len, flexible) {
        (Some(n), true) => put_uvarint(out, n as u32 + 1),
        (Some(n), false) => out.put_i32(n as i32),
        (None, true) => out.put_u8(0),
        (None, false) => out.put_i32(-1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_roundtrip_at_edges() {
        for v in [0, 1, -1, 63, -64, 64, i32::MAX, i32::MIN, 300, -300] {
            let mut out = BytesMut::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_size(v));
            assert_eq!(Reader::new(&out).varint("v"), Ok(v));
        }
        for v in [0i64, -1, i64::MAX, i64::MIN, 1 << 40] {
            let mut out = BytesMut::new();
            put_varlong(&mut out, v);
            assert_eq!(out.len(), varlong_size(v));
            assert_eq!(Reader::new(&out).varlong("v"), Ok(v));
        }
    }

    /// The one-byte fast path and the loop agree: every encoded length reads back with the
    /// reader just past it, and every truncation is an end-of-input error.
    #[test]
    fn varints_of_every_length_read_back_and_truncations_are_refused() {
        let ints = (0..32).flat_map(|b| {
            [
                1i32 << b,
                (1i32 << b).wrapping_sub(1),
                (1i32 << b).wrapping_neg(),
            ]
        });
        for v in ints {
            let mut out = BytesMut::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out);
            assert_eq!(r.varint("v"), Ok(v));
            assert_eq!(r.position(), out.len(), "{v}");
            for cut in 0..out.len() {
                let err = Reader::new(&out[..cut]).varint("v");
                assert!(
                    matches!(err, Err(WireError::UnexpectedEof { .. })),
                    "{v} cut at {cut}"
                );
            }
        }
        let longs = (0..64).flat_map(|b| {
            [
                1i64 << b,
                (1i64 << b).wrapping_sub(1),
                (1i64 << b).wrapping_neg(),
            ]
        });
        for v in longs {
            let mut out = BytesMut::new();
            put_varlong(&mut out, v);
            let mut r = Reader::new(&out);
            assert_eq!(r.varlong("v"), Ok(v));
            assert_eq!(r.position(), out.len(), "{v}");
            for cut in 0..out.len() {
                let err = Reader::new(&out[..cut]).varlong("v");
                assert!(
                    matches!(err, Err(WireError::UnexpectedEof { .. })),
                    "{v} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn overlong_varints_are_refused() {
        let six = [0x80u8, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert!(Reader::new(&six).uvarint("v").is_err());
        let big5 = [0xffu8, 0xff, 0xff, 0xff, 0x1f];
        assert!(Reader::new(&big5).uvarint("v").is_err());
        let eleven = [0x80u8; 11];
        assert!(Reader::new(&eleven).varlong("v").is_err());
    }

    #[test]
    fn array_len_is_bounded_by_bytes_left() {
        let buf = [0x7f, 0xff, 0xff, 0xff, 1, 2, 3];
        let err = Reader::new(&buf).array_len("topics", false, 1);
        assert!(matches!(err, Err(WireError::TooLarge { max: 3, .. })));
        let buf = [0, 0, 0, 2, 1, 2, 3];
        assert_eq!(Reader::new(&buf).array_len("t", false, 1), Ok(Some(2)));
        assert_eq!(Reader::new(&[0]).array_len("t", true, 1), Ok(None));
    }
}
