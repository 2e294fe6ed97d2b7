//! Test and benchmark fixtures: build real v2 record batches (uncompressed) with a valid
//! CRC, as a producer would send them. Not used by the broker itself.

use bytes::{BufMut, BytesMut};
use wire::batch::{BATCH_HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2};

/// Builds one batch holding one record per entry of `values`, timestamps
/// `base_ts_ms + i`. Offsets are 0-based deltas; the log assigns the base offset.
pub fn build_batch(base_ts_ms: i64, values: &[&[u8]]) -> BytesMut {
    let mut records = BytesMut::new();
    for (i, value) in values.iter().enumerate() {
        let mut body = BytesMut::new();
        body.put_i8(0); // attributes
        put_varint(&mut body, i as i64); // timestampDelta
        put_varint(&mut body, i as i64); // offsetDelta
        put_varint(&mut body, -1); // null key
        put_varint(&mut body, value.len() as i64);
        body.put_slice(value);
        put_varint(&mut body, 0); // no headers
        put_varint(&mut records, body.len() as i64);
        records.put_slice(&body);
    }
    let count = values.len().max(1) as i32;
    let mut b = BytesMut::with_capacity(BATCH_HEADER_SIZE + records.len());
    b.put_i64(0); // baseOffset
    b.put_i32((BATCH_HEADER_SIZE - LOG_OVERHEAD + records.len()) as i32);
    b.put_i32(-1); // partitionLeaderEpoch
    b.put_u8(MAGIC_V2);
    b.put_u32(0); // crc, below
    b.put_i16(0); // attributes
    b.put_i32(count - 1); // lastOffsetDelta
    b.put_i64(base_ts_ms);
    b.put_i64(base_ts_ms + i64::from(count) - 1);
    b.put_i64(-1); // producerId
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(values.len() as i32);
    b.put_slice(&records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A batch of `records` records whose total size is close to `batch_bytes`.
pub fn batch_of_size(base_ts_ms: i64, records: usize, batch_bytes: usize) -> BytesMut {
    let per = (batch_bytes.saturating_sub(BATCH_HEADER_SIZE) / records.max(1)).saturating_sub(10);
    let value = vec![0xabu8; per.max(1)];
    let values: Vec<&[u8]> = (0..records.max(1)).map(|_| &value[..]).collect();
    build_batch(base_ts_ms, &values)
}

fn put_varint(buf: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

/// Runs `f` on a fresh single glommio executor thread and returns its output, the way a
/// shard would run it.
pub fn run_on_shard<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    let handle = glommio::LocalExecutorBuilder::default()
        .name("storage-test")
        .spawn(f);
    match handle.map(|h| h.join()) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("shard thread failed: {e}"),
        Err(e) => panic!("cannot start a glommio executor: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_batches_validate() {
        let b = build_batch(1000, &[b"a", b"bc", b""]);
        let view = wire::batch::validate_batch(&b).unwrap();
        assert_eq!(view.header.records_count(), 3);
        assert_eq!(view.header.max_timestamp(), 1002);
        let big = batch_of_size(0, 16, 16 * 1024);
        assert!(wire::batch::validate_batch(&big).is_ok());
        assert!(big.len() <= 16 * 1024 && big.len() > 15 * 1024);
    }
}
