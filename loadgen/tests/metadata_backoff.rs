//! weir-loadgen against a fake broker whose topic stops existing: every Produce answers
//! UNKNOWN_TOPIC_OR_PARTITION and every later Metadata says the topic is unknown. The
//! producer must back off its metadata refreshes exponentially (retry.backoff.ms doubling
//! up to retry.backoff.max.ms) and rate-limit its warning, instead of asking (and printing
//! "metadata refresh failed") hundreds of times a second.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiVersionsResponse, BrokerId, MetadataResponse, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use wire::{api, frame, messages};

const LOADGEN: &str = env!("CARGO_BIN_EXE_weir-loadgen");
const TOPIC: &str = "gone";
/// The loadgen run must end within this (it produces for 3 s, then gives up on the rest).
const CMD_TIMEOUT: Duration = Duration::from_secs(120);
/// UNKNOWN_TOPIC_OR_PARTITION.
const UNKNOWN_TOPIC: i16 = 3;

#[derive(Default)]
struct Counts {
    metadata: AtomicU64,
    produce: AtomicU64,
}

fn api_versions() -> ApiVersionsResponse {
    let v = |k: i16, lo: i16, hi: i16| {
        ApiVersion::default()
            .with_api_key(k)
            .with_min_version(lo)
            .with_max_version(hi)
    };
    ApiVersionsResponse::default().with_api_keys(vec![
        v(api::PRODUCE, 3, 9),
        v(api::METADATA, 1, 12),
        v(api::API_VERSIONS, 0, 3),
    ])
}

fn metadata(port: u16, topic_exists: bool) -> MetadataResponse {
    let name = Some(TopicName(StrBytes::from_static_str(TOPIC)));
    let topic = if topic_exists {
        MetadataResponseTopic::default()
            .with_name(name)
            .with_partitions(vec![
                MetadataResponsePartition::default()
                    .with_partition_index(0)
                    .with_leader_id(BrokerId(0)),
            ])
    } else {
        MetadataResponseTopic::default()
            .with_name(name)
            .with_error_code(UNKNOWN_TOPIC)
    };
    MetadataResponse::default()
        .with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(0))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(i32::from(port)),
        ])
        .with_topics(vec![topic])
}

fn produce_refused() -> ProduceResponse {
    ProduceResponse::default().with_responses(vec![
        TopicProduceResponse::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_responses(vec![
                PartitionProduceResponse::default()
                    .with_index(0)
                    .with_error_code(UNKNOWN_TOPIC)
                    .with_base_offset(-1),
            ]),
    ])
}

/// Serves one connection until it closes.
fn serve(mut s: TcpStream, port: u16, counts: Arc<Counts>) {
    let mut prefix = [0u8; 4];
    while s.read_exact(&mut prefix).is_ok() {
        let size = i32::from_be_bytes(prefix) as usize;
        if size > 64 << 20 {
            return;
        }
        let mut body = vec![0u8; size];
        if s.read_exact(&mut body).is_err() {
            return;
        }
        let body = Bytes::from(body);
        let Ok((h, _)) = frame::parse_request_header(&body) else {
            return;
        };
        let (key, ver, corr) = (h.api_key, h.api_version, h.correlation_id);
        let out = match key {
            api::API_VERSIONS => messages::encode_response(corr, key, 0, &api_versions()),
            api::METADATA => {
                // The first Metadata (the loadgen's bootstrap) finds the topic; every
                // refresh after that finds it gone.
                let first = counts.metadata.fetch_add(1, Ordering::SeqCst) == 0;
                messages::encode_response(corr, key, ver, &metadata(port, first))
            }
            api::PRODUCE => {
                counts.produce.fetch_add(1, Ordering::SeqCst);
                messages::encode_response(corr, key, ver, &produce_refused())
            }
            _ => return,
        };
        let Ok(out) = out else { return };
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

#[test]
fn metadata_refresh_backs_off_and_its_warning_is_rate_limited() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let counts = Arc::new(Counts::default());
    let done = Arc::new(AtomicBool::new(false));
    let (c, d) = (counts.clone(), done.clone());
    let server = std::thread::spawn(move || {
        while !d.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let c = c.clone();
                    std::thread::spawn(move || serve(s, port, c));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });

    let bootstrap = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let mut child = Command::new(LOADGEN)
        .args([
            "produce",
            "--bootstrap",
            &bootstrap,
            "--topic",
            TOPIC,
            "--acks",
            "1",
            "--rate",
            "2000",
            "--record-size",
            "100",
            "--duration",
            "3s",
            "--retries",
            "1000000",
            "--retry-backoff-ms",
            "100",
            "--retry-backoff-max-ms",
            "1000",
            "--delivery-timeout-ms",
            "4000",
            // Kafka's rule: the delivery timeout covers linger.ms + request.timeout.ms.
            "--request-timeout-ms",
            "2000",
            "--quiet",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > CMD_TIMEOUT {
            let _ = child.kill();
            panic!("weir-loadgen took longer than {CMD_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stderr = reader.join().unwrap();
    done.store(true, Ordering::SeqCst);
    server.join().unwrap();

    let refreshes = counts.metadata.load(Ordering::SeqCst).saturating_sub(1);
    let produces = counts.produce.load(Ordering::SeqCst);
    let warnings = stderr.matches("metadata refresh failed").count();
    println!(
        "{elapsed:.1} s: {produces} produce requests, {refreshes} metadata refreshes, {warnings} warnings"
    );
    // The refusals kept coming, so the producer kept wanting fresh metadata...
    assert!(
        produces >= 10,
        "the producer sent too little: {produces}\n{stderr}"
    );
    assert!(refreshes >= 2, "no retried refresh: {refreshes}\n{stderr}");
    // ...but asked at most once per backoff step: 100, 200, 400, 800, then 1000 ms, i.e.
    // about one a second once backed off (plus slack for the run's end).
    let allowed = 5.0 + elapsed * 1.5;
    assert!(
        (refreshes as f64) <= allowed,
        "{refreshes} metadata refreshes in {elapsed:.1} s (at most {allowed:.0} allowed)\n{stderr}"
    );
    // One warning per 5 s at most (the first one, then a count of those held back).
    let allowed_warnings = 1.0 + elapsed / 5.0;
    assert!(
        (warnings as f64) <= allowed_warnings,
        "{warnings} warnings in {elapsed:.1} s\n{stderr}"
    );
}
