//! Bad input over raw sockets, while a well-behaved librdkafka producer keeps writing on
//! its own connection. Framing errors (garbage, a 2 GiB size, a truncated frame, an
//! unknown API key, an unserved version) close the offending connection; semantic errors
//! get their Kafka error code (CORRUPT_MESSAGE 2 for a bad CRC, MESSAGE_TOO_LARGE 10 above
//! `message.max.bytes`) and the connection stays usable; ApiVersions of an unknown version
//! gets a v0 answer with UNSUPPORTED_VERSION 35. Throughout, the good producer gets every
//! record acknowledged, a good consumer keeps reading, and nothing acknowledged is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest};
use kafka_protocol::records::Compression;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use weir_tests::clients::{self, Acked, DeliveryLog, Sent};
use weir_tests::raw::{self, RawConn};
use weir_tests::{Weir, WeirConfig};

const GOOD: &str = "good";
const BAD: &str = "bad";
const MESSAGE_MAX_BYTES: usize = 100_000;
/// How long the broker may take to close a connection it should close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

const CORRUPT_MESSAGE: i16 = 2;
const MESSAGE_TOO_LARGE: i16 = 10;
const UNSUPPORTED_VERSION: i16 = 35;

type Check = fn(&Weir) -> Result<()>;

#[test]
fn bad_input_gets_its_answer_and_good_clients_are_unaffected() -> Result<()> {
    let config = WeirConfig::shards(2).set("message.max.bytes", MESSAGE_MAX_BYTES);
    let weir = Weir::start(config)?;
    clients::create_topics(&weir.bootstrap(), &[GOOD, BAD], 2, &[])?;
    let good = GoodClient::start(&weir.bootstrap())?;
    let mut bystander = RawConn::connect(weir.addr())?;

    let checks: [(&str, Check); 10] = [
        ("garbage bytes", garbage_bytes),
        ("http request", http_request),
        ("size prefix 2 GiB", size_2_gib),
        ("size prefix 2 GiB - 1", size_2_gib_minus_1),
        ("negative size", negative_size),
        ("truncated frame", truncated_frame),
        ("unknown api key", unknown_api_key),
        ("unsupported version", unsupported_version),
        (
            "ApiVersions of unknown version",
            api_versions_unknown_version,
        ),
        ("wrong CRC and oversized batch", semantic_errors),
    ];
    let mut failures = Vec::new();
    for (name, check) in checks {
        if let Err(e) = check(&weir) {
            failures.push(format!("{name}: {e:#}"));
        }
        // The good producer keeps getting acks, and the broker still answers on a
        // connection that did nothing wrong.
        if let Err(e) = good.expect_progress() {
            failures.push(format!("after {name}: {e:#}"));
        }
        if let Err(e) = bystander.api_versions() {
            failures.push(format!("after {name}: bystander connection broken: {e:#}"));
            bystander = RawConn::connect(weir.addr())?;
        }
    }

    let (sent, acked, failed) = good.stop()?;
    ensure!(
        failed.is_empty(),
        "good producer had failures: {:?}",
        &failed[..failed.len().min(5)]
    );
    ensure!(
        acked.len() == sent.len() && !sent.is_empty(),
        "good producer: {} of {} acked",
        acked.len(),
        sent.len()
    );
    let got = clients::consume_to_end(&weir.bootstrap(), GOOD, &[0, 1])?;
    clients::verify(&sent, &acked, &got)?;
    if !failures.is_empty() {
        bail!(
            "{} checks failed:\n{}\nlog tail:\n{}",
            failures.len(),
            failures.join("\n"),
            weir.log_tail(30)
        );
    }
    Ok(())
}

/// Sent, acknowledged, failed (id, error).
type Outcome = (Vec<Sent>, Vec<Acked>, Vec<(u64, String)>);

/// A librdkafka producer (acks=all) writing to GOOD in a thread until stopped.
struct GoodClient {
    stop: Arc<AtomicBool>,
    log: Arc<DeliveryLog>,
    worker: thread::JoinHandle<Result<Vec<Sent>>>,
    /// Records a librdkafka consumer (assigned to GOOD's partitions) has read so far.
    consumed: Arc<AtomicUsize>,
    reader: thread::JoinHandle<Result<()>>,
}

impl GoodClient {
    fn start(bootstrap: &str) -> Result<GoodClient> {
        let (producer, log) = clients::producer(bootstrap, "all", "snappy", &[("linger.ms", "1")])?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let worker = thread::spawn(move || {
            let mut sent = Vec::new();
            let mut id = 0u64;
            // Bounded: at most 10,000 chunks of 20 records.
            while !s.load(Ordering::Relaxed) && id < 200_000 {
                let chunk = clients::make_records(id, 20, "good", clients::now_ms());
                clients::produce_all(&producer, GOOD, &chunk, None)?;
                sent.extend(chunk);
                id += 20;
                thread::sleep(Duration::from_millis(5));
            }
            Ok(sent)
        });
        let consumed = Arc::new(AtomicUsize::new(0));
        let reader = spawn_reader(bootstrap, Arc::clone(&stop), Arc::clone(&consumed))?;
        Ok(GoodClient {
            stop,
            log,
            worker,
            consumed,
            reader,
        })
    }

    /// Waits (bounded) until more records are acknowledged than now: the good client
    /// is making progress. Fails on any failed delivery so far.
    fn expect_progress(&self) -> Result<()> {
        let before = self.log.acked().len();
        let read_before = self.consumed.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.log.acked().len() < before + 20
            || self.consumed.load(Ordering::Relaxed) < read_before + 20
        {
            ensure!(
                self.log.failed().is_empty(),
                "good producer failed: {:?}",
                self.log.failed().first()
            );
            ensure!(
                Instant::now() < deadline,
                "good producer stalled at {before} acks for 10 s"
            );
            thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    fn stop(self) -> Result<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        match self.reader.join() {
            Ok(r) => r?,
            Err(_) => bail!("good consumer thread panicked"),
        }
        let sent = match self.worker.join() {
            Ok(r) => r?,
            Err(_) => bail!("good producer thread panicked"),
        };
        Ok((sent, self.log.acked(), self.log.failed()))
    }
}

/// A librdkafka consumer reading GOOD's partitions as they grow, until stopped.
fn spawn_reader(
    bootstrap: &str,
    stop: Arc<AtomicBool>,
    consumed: Arc<AtomicUsize>,
) -> Result<thread::JoinHandle<Result<()>>> {
    let c = clients::consumer(bootstrap, &[])?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..2 {
        tpl.add_partition_offset(GOOD, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(thread::spawn(move || {
        // Bounded by the stop flag, which the test always sets, and by a time limit.
        let deadline = Instant::now() + Duration::from_secs(300);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            match c.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => {
                    consumed.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                Some(Err(e)) => bail!("good consumer: {e}"),
            }
        }
        Ok(())
    }))
}

/// Sends `bytes` and expects the broker to close the connection.
fn expect_closed_after(weir: &Weir, bytes: &[u8]) -> Result<()> {
    let mut c = RawConn::connect(weir.addr())?;
    // The broker may close before all bytes are written; a write error is then fine.
    let _ = c.send_raw(bytes);
    let (closed, got) = c.wait_closed(CLOSE_TIMEOUT)?;
    ensure!(
        closed,
        "connection still open after {CLOSE_TIMEOUT:?} (got {} bytes back)",
        got.len()
    );
    ensure!(
        got.is_empty(),
        "broker answered {} bytes before closing",
        got.len()
    );
    Ok(())
}

fn garbage_bytes(weir: &Weir) -> Result<()> {
    // A plausible size (64) followed by 64 bytes of 0xff: api key -1 is no API.
    let mut b = BytesMut::new();
    b.put_i32(64);
    b.put_slice(&[0xff; 64]);
    expect_closed_after(weir, &b)?;
    // Pseudo-random bytes with a small size prefix.
    let mut b = BytesMut::new();
    b.put_i32(200);
    let mut x: u32 = 0x9e37_79b9;
    for _ in 0..200 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        b.put_u8((x >> 24) as u8);
    }
    expect_closed_after(weir, &b)
}

fn http_request(weir: &Weir) -> Result<()> {
    // "GET " read as a size is ~1.2 GB: above socket.request.max.bytes.
    expect_closed_after(weir, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

fn size_2_gib(weir: &Weir) -> Result<()> {
    let before = memory(weir)?;
    expect_closed_after(weir, &0x8000_0000u32.to_be_bytes())?;
    check_no_big_allocation(weir, before)
}

fn size_2_gib_minus_1(weir: &Weir) -> Result<()> {
    let before = memory(weir)?;
    let mut b = BytesMut::new();
    b.put_u32(0x7fff_ffff);
    b.put_slice(&[0u8; 1000]);
    expect_closed_after(weir, &b)?;
    check_no_big_allocation(weir, before)
}

fn negative_size(weir: &Weir) -> Result<()> {
    expect_closed_after(weir, &(-5i32).to_be_bytes())
}

/// A huge size prefix must be refused before allocating: neither RSS nor the peak
/// virtual size (an untouched allocation shows only there) grows by anything like it.
fn check_no_big_allocation(weir: &Weir, before: (u64, u64)) -> Result<()> {
    let (rss, peak) = (weir.rss_kib()?, weir.vm_peak_kib()?);
    ensure!(
        rss < before.0 + 256 * 1024,
        "RSS grew from {} KiB to {rss} KiB",
        before.0
    );
    ensure!(
        peak < before.1 + 1024 * 1024,
        "VmPeak grew from {} KiB to {peak} KiB",
        before.1
    );
    Ok(())
}

fn memory(weir: &Weir) -> Result<(u64, u64)> {
    Ok((weir.rss_kib()?, weir.vm_peak_kib()?))
}

fn truncated_frame(weir: &Weir) -> Result<()> {
    // A valid ApiVersions request cut short, then the client's half-close: the broker
    // sees EOF inside a frame and must close without answering.
    let mut c = RawConn::connect(weir.addr())?;
    let frame = c.frame(
        ApiKey::ApiVersions as i16,
        0,
        1,
        &ApiVersionsRequest::default(),
    )?;
    let mut cut = BytesMut::new();
    cut.put_i32(100);
    cut.put_slice(&frame[4..]);
    c.send_raw(&cut)?;
    c.shutdown_write()?;
    let (closed, got) = c.wait_closed(CLOSE_TIMEOUT)?;
    ensure!(
        closed && got.is_empty(),
        "closed={closed}, {} bytes back",
        got.len()
    );
    // A complete frame whose request body is cut inside a field (Metadata v1 claiming 5
    // topics and holding none) is malformed: closed as well.
    let mut c = RawConn::connect(weir.addr())?;
    let mut body = BytesMut::new();
    body.put_i16(ApiKey::Metadata as i16);
    body.put_i16(1);
    body.put_i32(7);
    body.put_i16(-1); // null client id
    body.put_i32(5); // five topics follow... and do not
    let mut f = BytesMut::new();
    f.put_i32(i32::try_from(body.len())?);
    f.put_slice(&body);
    c.send_raw(&f)?;
    let (closed, got) = c.wait_closed(CLOSE_TIMEOUT)?;
    ensure!(
        closed && got.is_empty(),
        "malformed body: closed={closed}, {} bytes back",
        got.len()
    );
    Ok(())
}

fn unknown_api_key(weir: &Weir) -> Result<()> {
    let mut c = RawConn::connect(weir.addr())?;
    let frame = c.frame(999, 0, 1, &ApiVersionsRequest::default())?;
    c.send_raw(&frame)?;
    let (closed, got) = c.wait_closed(CLOSE_TIMEOUT)?;
    ensure!(
        closed && got.is_empty(),
        "api key 999: closed={closed}, {} bytes back",
        got.len()
    );
    Ok(())
}

fn unsupported_version(weir: &Weir) -> Result<()> {
    // Metadata v200: no broker serves it; weir (like Kafka) closes the connection.
    let mut c = RawConn::connect(weir.addr())?;
    let frame = c.frame_claiming(
        ApiKey::Metadata as i16,
        200,
        2,
        12,
        &MetadataRequest::default(),
    )?;
    c.send_raw(&frame)?;
    let (closed, got) = c.wait_closed(CLOSE_TIMEOUT)?;
    ensure!(
        closed && got.is_empty(),
        "Metadata v200: closed={closed}, {} bytes back",
        got.len()
    );
    Ok(())
}

fn api_versions_unknown_version(weir: &Weir) -> Result<()> {
    let mut c = RawConn::connect(weir.addr())?;
    // The header claims v99; the body is a v3 body (what a newer client would send).
    let frame = c.frame_claiming(
        ApiKey::ApiVersions as i16,
        99,
        2,
        3,
        &ApiVersionsRequest::default(),
    )?;
    let correlation_id = c.last_correlation_id();
    c.send_raw(&frame)?;
    let mut body = c.recv_frame()?;
    // Response header v0 (correlation id only), then the body as ApiVersions v0.
    let resp_header =
        <kafka_protocol::messages::ResponseHeader as kafka_protocol::protocol::Decodable>::decode(
            &mut body, 0,
        )?;
    ensure!(
        resp_header.correlation_id == correlation_id,
        "correlation id {}",
        resp_header.correlation_id
    );
    let resp = <ApiVersionsResponse as kafka_protocol::protocol::Decodable>::decode(&mut body, 0)?;
    ensure!(
        resp.error_code == UNSUPPORTED_VERSION,
        "error code {}",
        resp.error_code
    );
    let av = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::ApiVersions as i16);
    ensure!(
        av.is_some_and(|k| k.min_version == 0 && k.max_version >= 2),
        "ApiVersions range {av:?}"
    );
    // The connection stays open and serves the version the client then picks.
    let again = c.api_versions()?;
    ensure!(
        again.error_code == 0,
        "ApiVersions v0 after the fallback: {}",
        again.error_code
    );
    Ok(())
}

fn semantic_errors(weir: &Weir) -> Result<()> {
    let mut c = RawConn::connect(weir.addr())?;
    let good = raw::record_batch(&[b"one".to_vec(), b"two".to_vec()], Compression::None)?;
    let (code, base) = c.produce(BAD, 0, -1, good.clone())?;
    ensure!(
        code == 0 && base == 0,
        "valid batch: error {code}, base offset {base}"
    );

    let bad = raw::with_bad_crc(&good);
    let (stored, computed) = raw::batch_crcs(&bad).unwrap_or_default();
    ensure!(stored != computed, "the test batch's CRC should be wrong");
    let (code, _) = c.produce(BAD, 0, -1, bad)?;
    ensure!(
        code == CORRUPT_MESSAGE,
        "bad CRC: error {code}, expected {CORRUPT_MESSAGE}"
    );

    // Incompressible values, so the batch is over the limit as sent.
    // One record: kafka-protocol's encoder may put each record in a batch of its own.
    let big = vec![noise(MESSAGE_MAX_BYTES * 3 / 2, 1)];
    let big = raw::record_batch(&big, Compression::None)?;
    ensure!(big.len() > MESSAGE_MAX_BYTES);
    let big_len = big.len();
    let (code, base) = c.produce(BAD, 1, 1, big)?;
    ensure!(
        code == MESSAGE_TOO_LARGE,
        "oversized batch of {big_len} bytes: error {code} (base offset {base}), expected {MESSAGE_TOO_LARGE}"
    );

    // Neither bad batch was appended; the connection still works; the valid one follows.
    let (code, base) = c.produce(BAD, 0, -1, good)?;
    ensure!(
        code == 0 && base == 2,
        "valid batch after errors: error {code}, base offset {base}"
    );
    let highs = clients::high_watermarks(&weir.bootstrap(), BAD, &[0, 1])?;
    ensure!(
        highs.get(&0) == Some(&4) && highs.get(&1) == Some(&0),
        "high watermarks {highs:?}"
    );
    Ok(())
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
