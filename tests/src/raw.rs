//! A blocking Kafka client over a bare `TcpStream`, for tests that need exact bytes on the
//! wire: garbage, bad sizes, truncated frames, unknown API keys or versions, corrupt batches.
//! Requests and responses are encoded and decoded with the `kafka-protocol` crate (it is a
//! trusted peer here: only the broker must survive untrusted input). Every read has a
//! timeout, and frame sizes read back are checked before allocating.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// How long one raw read or write may block.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response frame the raw client accepts.
const RESPONSE_BYTES_MAX: usize = 64 << 20;

/// One connection to the broker.
pub struct RawConn {
    stream: TcpStream,
    correlation_id: i32,
}

impl RawConn {
    /// Connects with bounded read/write timeouts.
    pub fn connect(addr: SocketAddr) -> Result<RawConn> {
        RawConn::connect_timeout(addr, IO_TIMEOUT)
    }

    /// Connects; `timeout` bounds the connect and every later read and write.
    pub fn connect_timeout(addr: SocketAddr, timeout: Duration) -> Result<RawConn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            correlation_id: 1,
        })
    }

    /// Writes bytes as they are: no framing added.
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Sends one request (framed, with a v1/v2 header as the API version requires) and
    /// returns its correlation id.
    pub fn send<Req: Encodable>(&mut self, api: ApiKey, version: i16, req: &Req) -> Result<i32> {
        let frame = self.frame(
            api as i16,
            version,
            api.request_header_version(version),
            req,
        )?;
        self.send_raw(&frame)?;
        Ok(self.correlation_id - 1)
    }

    /// Encodes a framed request for any api key number (also unknown ones) and header
    /// version; bumps the correlation id. The body is encoded at `version`.
    pub fn frame<Req: Encodable>(
        &mut self,
        api_key: i16,
        version: i16,
        header_version: i16,
        req: &Req,
    ) -> Result<BytesMut> {
        self.frame_claiming(api_key, version, header_version, version, req)
    }

    /// Like [`frame`](Self::frame), but the header claims `version` while the body is
    /// encoded at `body_version`: for versions no encoder knows (unsupported versions).
    pub fn frame_claiming<Req: Encodable>(
        &mut self,
        api_key: i16,
        version: i16,
        header_version: i16,
        body_version: i16,
        req: &Req,
    ) -> Result<BytesMut> {
        let header = RequestHeader::default()
            .with_request_api_key(api_key)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("weir-tests-raw")));
        self.correlation_id += 1;
        let mut body = BytesMut::new();
        header.encode(&mut body, header_version)?;
        req.encode(&mut body, body_version)?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(i32::try_from(body.len())?);
        frame.extend_from_slice(&body);
        Ok(frame)
    }

    /// The correlation id of the last request framed.
    pub fn last_correlation_id(&self) -> i32 {
        self.correlation_id - 1
    }

    /// Closes the write half: the broker reads EOF after what was sent.
    pub fn shutdown_write(&mut self) -> std::io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)
    }

    /// Reads one response frame (size-checked) and returns its body.
    pub fn recv_frame(&mut self) -> Result<Bytes> {
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .context("read frame size")?;
        let size = i32::from_be_bytes(size);
        let Ok(size) = usize::try_from(size) else {
            bail!("negative response size {size}");
        };
        if size > RESPONSE_BYTES_MAX {
            bail!("response of {size} bytes exceeds {RESPONSE_BYTES_MAX}");
        }
        let mut body = vec![0u8; size];
        self.stream
            .read_exact(&mut body)
            .context("read frame body")?;
        Ok(Bytes::from(body))
    }

    /// Reads one response, checks its correlation id, and decodes it.
    pub fn recv<Resp: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        correlation_id: i32,
    ) -> Result<Resp> {
        let mut body = self.recv_frame()?;
        let header = ResponseHeader::decode(&mut body, api.response_header_version(version))?;
        if header.correlation_id != correlation_id {
            bail!(
                "correlation id {} in response, expected {correlation_id}",
                header.correlation_id
            );
        }
        let resp = Resp::decode(&mut body, version)?;
        Ok(resp)
    }

    /// Send then receive.
    pub fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp> {
        let id = self.send(api, version, req)?;
        self.recv(api, version, id)
    }

    /// ApiVersions v0 (the version every broker must answer).
    pub fn api_versions(&mut self) -> Result<ApiVersionsResponse> {
        self.call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
    }

    /// Metadata v1 for all topics.
    pub fn metadata(&mut self) -> Result<MetadataResponse> {
        self.call(
            ApiKey::Metadata,
            1,
            &MetadataRequest::default().with_topics(None),
        )
    }

    /// Produce one batch's bytes to one partition; returns (error code, base offset).
    pub fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        acks: i16,
        batch: Bytes,
    ) -> Result<(i16, i64)> {
        let req = produce_request(topic, partition, acks, batch);
        let resp: ProduceResponse = self.call(ApiKey::Produce, 7, &req)?;
        let p = resp
            .responses
            .first()
            .and_then(|t| t.partition_responses.first())
            .context("empty produce response")?;
        Ok((p.error_code, p.base_offset))
    }

    /// Fetch v11 of one partition from `offset` (waits up to 500 ms for data); returns
    /// (error code, high watermark, records decoded from the returned batches).
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
    ) -> Result<(i16, i64, Vec<Record>)> {
        let part = FetchPartition::default()
            .with_partition(partition)
            .with_fetch_offset(offset)
            .with_partition_max_bytes(max_bytes);
        let topic = FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![part]);
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_session_epoch(-1)
            .with_topics(vec![topic]);
        let resp: FetchResponse = self.call(ApiKey::Fetch, 11, &req)?;
        let p = resp
            .responses
            .first()
            .and_then(|t| t.partitions.first())
            .context("empty fetch response")?;
        let mut records = Vec::new();
        if let Some(mut bytes) = p.records.clone() {
            // The broker's output, decoded by a trusted decoder; a batch cut at the
            // size limit ends the list (Kafka allows a partial last batch).
            while bytes.len() >= 61 {
                let Ok(set) = RecordBatchDecoder::decode(&mut bytes) else {
                    break;
                };
                records.extend(set.records);
            }
        }
        Ok((p.error_code, p.high_watermark, records))
    }

    /// Whether the broker closed this connection within `timeout`: a read returns EOF or
    /// a reset. Bytes the broker sent before closing are returned with `true`.
    pub fn wait_closed(&mut self, timeout: Duration) -> Result<(bool, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        self.stream
            .set_read_timeout(Some(Duration::from_millis(100)))?;
        let result = loop {
            if Instant::now() >= deadline {
                break (false, got);
            }
            match self.stream.read(&mut buf) {
                Ok(0) => break (true, got),
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.len() > RESPONSE_BYTES_MAX {
                        bail!("broker sent more than {RESPONSE_BYTES_MAX} bytes");
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e)
                    if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) =>
                {
                    break (true, got);
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.stream.set_read_timeout(Some(IO_TIMEOUT))?;
        Ok(result)
    }
}

/// A Produce request for one partition.
pub fn produce_request(topic: &str, partition: i32, acks: i16, batch: Bytes) -> ProduceRequest {
    let part = PartitionProduceData::default()
        .with_index(partition)
        .with_records(Some(batch));
    let topic = TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partition_data(vec![part]);
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![topic])
}

/// One record batch (v2) holding `values` (keys `k<i>`), uncompressed unless asked. A
/// Produce v3+ partition must carry exactly one batch (Kafka's
/// `ProduceRequest.validateRecords` refuses more with INVALID_RECORD).
pub fn record_batch(values: &[Vec<u8>], compression: Compression) -> Result<Bytes> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let now_ms = i64::try_from(now_ms)?;
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // kafka-protocol's encoder starts a new batch wherever offset - sequence
            // changes: a constant -1 gave one batch per record. This keeps them in one
            // batch whose baseSequence is -1 (no producer id, no sequence).
            sequence: i32::try_from(i).unwrap_or(i32::MAX).wrapping_sub(1),
            timestamp: now_ms,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::copy_from_slice(v)),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let opts = RecordEncodeOptions {
        version: 2,
        compression,
    };
    RecordBatchEncoder::encode(&mut buf, records.iter(), &opts)?;
    Ok(buf.freeze())
}

/// The same batch with one payload byte flipped, so its stored CRC-32C no longer matches.
pub fn with_bad_crc(batch: &Bytes) -> Bytes {
    let mut bytes = batch.to_vec();
    if let Some(last) = bytes.last_mut() {
        *last ^= 0xff;
    }
    Bytes::from(bytes)
}

/// The CRC-32C stored in a v2 batch header (bytes 17..21) and the one computed over
/// attributes..end: equal for a valid batch.
pub fn batch_crcs(batch: &[u8]) -> Option<(u32, u32)> {
    let mut stored = batch.get(17..21)?;
    let stored = stored.get_u32();
    Some((stored, crc32c::crc32c(batch.get(21..)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_batch_writes_one_batch_a_broker_accepts_with_every_codec() {
        let values: Vec<Vec<u8>> = (0..50).map(|i| vec![b'v'; i * 10]).collect();
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let batch = record_batch(&values, codec).expect("encodes");
            let batches: Vec<_> = wire::batch::split_batches(&batch).collect();
            assert_eq!(batches.len(), 1, "{codec:?}: one batch per partition");
            wire::batch::check_produced_batch(&batch).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            let header = wire::batch::read_header(&batch).expect("header");
            assert_eq!(header.records_count(), 50, "{codec:?}");
            assert_eq!(header.base_sequence().get(), -1, "{codec:?}: no sequence");
        }
    }
}
