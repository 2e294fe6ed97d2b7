//! Test and benchmark fixtures: build real v2 record batches (uncompressed) with a valid
//! CRC, as a producer would send them. Not used by the broker itself.

use bytes::{Bytes, BytesMut};
use wire::batch::{BATCH_HEADER_SIZE, BatchBuilder, NewRecord};

/// Builds one batch holding one record per entry of `values`, timestamps
/// `base_ts_ms + i`, with wire's builder. Offsets are 0-based deltas; the log assigns the
/// base offset.
pub fn build_batch(base_ts_ms: i64, values: &[&[u8]]) -> BytesMut {
    let records = values
        .iter()
        .zip(base_ts_ms..)
        .map(|(v, ts)| NewRecord::value(ts, Bytes::copy_from_slice(v)))
        .collect();
    let builder = BatchBuilder {
        records,
        ..BatchBuilder::default()
    };
    match builder.build() {
        Ok(b) => BytesMut::from(b),
        Err(e) => panic!("fixture batch cannot be built: {e}"),
    }
}

/// A batch of `records` records whose total size is close to `batch_bytes`.
pub fn batch_of_size(base_ts_ms: i64, records: usize, batch_bytes: usize) -> BytesMut {
    let per = (batch_bytes.saturating_sub(BATCH_HEADER_SIZE) / records.max(1)).saturating_sub(10);
    let value = vec![0xabu8; per.max(1)];
    let values: Vec<&[u8]> = (0..records.max(1)).map(|_| &value[..]).collect();
    build_batch(base_ts_ms, &values)
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
