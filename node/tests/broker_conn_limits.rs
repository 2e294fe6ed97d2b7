//! Connection and frame limits against a real `weir serve`: large frames that stall are
//! bounded by `queued.max.request.bytes` and closed after `request.read.timeout.ms` while a
//! canary keeps its latency; idle connections go after `connections.max.idle.ms`;
//! `max.connections.per.ip` holds one address back but not another; a second broker on
//! the same address fails with "address in use"; the memory of a burst of large produces
//! is given back afterwards.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Broker, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn api_versions_ok(c: &mut Client) -> bool {
    let resp: ApiVersionsResponse = c.call(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    resp.error_code == 0 && resp.api_keys.iter().any(|k| k.api_key == api::PRODUCE)
}

/// Waits up to `timeout` for the broker to close `stream`; returns how long it took.
/// A read timeout is not a close (as in `Client::is_closed`), and the wait is bounded by
/// `timeout` rather than the client's read timeout.
fn closed_within(stream: &mut TcpStream, timeout: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut byte = [0u8; 1];
    while t0.elapsed() < timeout {
        let left = timeout
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).expect("read timeout");
        match stream.read(&mut byte) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Some(t0.elapsed()),
        }
    }
    None
}

fn status_kib(pid: u32, field: &str) -> u64 {
    weir_tests::broker::proc_status_kib(pid, field).expect("read /proc/PID/status")
}

fn percentile(mut samples: Vec<Duration>, p: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    samples.sort();
    let i = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[i]
}

/// A client that sends ApiVersions every few ms until stopped; returns its latencies.
fn canary(addr: String, stop: Arc<AtomicBool>) -> thread::JoinHandle<Vec<Duration>> {
    thread::spawn(move || {
        let mut c = Client::connect(&addr);
        let mut latencies = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t0 = Instant::now();
            assert!(api_versions_ok(&mut c), "the canary is answered");
            latencies.push(t0.elapsed());
            thread::sleep(Duration::from_millis(5));
        }
        latencies
    })
}

/// Stallers: clients that declare this much...
const DECLARED_FRAME_BYTES: usize = 100 << 20;
/// ...send this much of it, and stall.
const SENT_FRAME_BYTES: usize = 99 << 20;
const STALLERS: usize = 20;
/// The frame deadline in the test (`request.read.timeout.ms`).
const FRAME_TIMEOUT_MS: u64 = 2_000;
/// Peak RSS allowed: the 512 MiB default budget plus the broker's own ~100 MiB, with
/// margin. Without the budget 20 stallers pin 2 GiB.
const STALL_HWM_KIB_MAX: u64 = 700 * 1024;
/// Every staller is closed within this long (5 rounds of 4 budgeted frames at 2 s each,
/// plus sending 2 GiB on a loaded machine).
const STALL_CLOSE_TIMEOUT: Duration = Duration::from_secs(180);
const CANARY_P99_MAX: Duration = Duration::from_millis(50);
/// Above this 1-minute load average per CPU, other processes' run queues decide the
/// canary's tail (measured at 7-9 runnable tasks per CPU: p99 0.1-1.4 s, also with only
/// 4 stallers that all fit in the budget), so the latency bound is reported, not asserted.
const CANARY_LOAD_PER_CPU_MAX: f64 = 2.0;

/// The 1-minute load average divided by the CPU count.
fn load_per_cpu() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: f64 = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    load / cpus as f64
}

/// Sends the size prefix and most of a large frame, then waits for the broker to close the
/// connection; returns whether it did (while sending or after).
fn stall(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    s.set_write_timeout(Some(STALL_CLOSE_TIMEOUT))
        .expect("write timeout");
    let mut sent = s
        .write_all(&(DECLARED_FRAME_BYTES as i32).to_be_bytes())
        .is_ok();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..SENT_FRAME_BYTES / chunk.len() {
        if !sent {
            break;
        }
        // An error here is the broker closing us mid-frame: that counts as closed.
        sent = s.write_all(&chunk).is_ok();
    }
    closed_within(&mut s, STALL_CLOSE_TIMEOUT).is_some()
}

#[test]
fn stalled_large_frames_are_bounded_by_the_budget_and_closed_after_the_deadline() {
    let timeout = FRAME_TIMEOUT_MS.to_string();
    let broker = Broker::start(2, &[("request.read.timeout.ms", &timeout)]);
    let hwm_before = status_kib(broker.pid(), "VmHWM");
    // A baseline: what the canary sees on this machine right now without any staller.
    let stop = Arc::new(AtomicBool::new(false));
    let alone = canary(broker.addr(), stop.clone());
    thread::sleep(Duration::from_secs(2)); // the baseline's window, not a wait for a state
    stop.store(true, Ordering::Relaxed);
    let p99_alone = percentile(alone.join().expect("canary thread"), 0.99);
    let stop = Arc::new(AtomicBool::new(false));
    let canary = canary(broker.addr(), stop.clone());
    let addr: SocketAddr = broker.addr().parse().expect("addr");
    let t0 = Instant::now();
    let stallers: Vec<_> = (0..STALLERS)
        .map(|_| thread::spawn(move || stall(addr)))
        .collect();
    let closed = stallers
        .into_iter()
        .map(|h| h.join().unwrap_or(false))
        .filter(|c| *c)
        .count();
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let latencies = canary.join().expect("canary thread");
    let hwm = status_kib(broker.pid(), "VmHWM");
    let p99 = percentile(latencies.clone(), 0.99);
    eprintln!(
        "MEASURE stallers={STALLERS} declared={DECLARED_FRAME_BYTES} sent={SENT_FRAME_BYTES} \
         closed={closed} took_ms={} vm_hwm_before_kib={hwm_before} vm_hwm_kib={hwm} \
         canary_requests={} canary_p50_us={} canary_p99_us={} canary_max_us={} \
         canary_alone_p99_us={}",
        took.as_millis(),
        latencies.len(),
        percentile(latencies.clone(), 0.5).as_micros(),
        p99.as_micros(),
        percentile(latencies.clone(), 1.0).as_micros(),
        p99_alone.as_micros(),
    );
    assert_eq!(closed, STALLERS, "every stalled connection is closed");
    assert!(
        broker.log_contains("request.read.timeout.ms"),
        "the broker says why it closed them"
    );
    assert!(
        hwm < STALL_HWM_KIB_MAX,
        "peak RSS {hwm} KiB with {STALLERS} stalled 100 MiB frames (bound {STALL_HWM_KIB_MAX})"
    );
    assert!(latencies.len() >= 20, "the canary ran throughout");
    let load = load_per_cpu();
    if load > CANARY_LOAD_PER_CPU_MAX {
        eprintln!(
            "SKIP the canary latency bound: load average {load:.1} per CPU (other processes' run queues, not the broker, set the tail here)"
        );
    } else {
        // 50 ms, or twice the baseline on a machine too loaded for 50 ms.
        let bound = CANARY_P99_MAX.max(p99_alone * 2);
        assert!(
            p99 <= bound,
            "canary p99 {p99:?} while large frames were read and stalled (alone {p99_alone:?})"
        );
    }
    let mut after = broker.client();
    assert!(api_versions_ok(&mut after), "new connections are served");
}

fn fetch_request(topic: &'static str, max_wait_ms: i32) -> FetchRequest {
    let p = fetch_request::FetchPartition::default()
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            fetch_request::FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str(topic)))
                .with_partitions(vec![p]),
        ])
}

fn create_topic(c: &mut Client, topic: &'static str) {
    let md = MetadataRequest::default().with_topics(Some(vec![
        metadata_request::MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str(topic)))),
    ]));
    let resp: MetadataResponse = c.call(api::METADATA, 12, &md);
    assert_eq!(resp.topics[0].error_code, 0, "auto-created");
}

const IDLE_MS: u64 = 1_000;

#[test]
fn idle_connections_and_unfinished_frames_are_closed() {
    let idle_ms = IDLE_MS.to_string();
    let broker = Broker::start(
        1,
        &[
            ("connections.max.idle.ms", &idle_ms),
            ("request.read.timeout.ms", &idle_ms),
        ],
    );
    let mut idle = broker.client();
    assert!(api_versions_ok(&mut idle));
    let idle_since = Instant::now();
    let mut partial = broker.client();
    partial
        .stream
        .write_all(&100i32.to_be_bytes())
        .expect("write");
    partial.stream.write_all(&[0, 18]).expect("write");
    let mut polling = broker.client();
    create_topic(&mut polling, "idle");
    // A long poll three times the idle limit: in flight, so the connection is not idle.
    let sent = polling.send(api::FETCH, 12, &fetch_request("idle", 3 * IDLE_MS as i32));
    let mut busy = broker.client();
    // Requests every fifth of the limit: never idle.
    while idle_since.elapsed() < Duration::from_millis(3 * IDLE_MS) {
        assert!(api_versions_ok(&mut busy), "a busy connection stays open");
        thread::sleep(Duration::from_millis(IDLE_MS / 5));
    }
    let (got, resp): (i32, FetchResponse) = polling.recv(api::FETCH, 12);
    assert_eq!(got, sent, "the long poll is answered, not cut off as idle");
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
    let closed = closed_within(&mut idle.stream, Duration::from_secs(30));
    let waited = idle_since.elapsed();
    assert!(closed.is_some(), "an idle connection is closed");
    assert!(
        waited >= Duration::from_millis(IDLE_MS - 100),
        "not before connections.max.idle.ms: {waited:?}"
    );
    assert!(
        closed_within(&mut partial.stream, Duration::from_secs(30)).is_some(),
        "a frame cut short and left is closed after request.read.timeout.ms"
    );
    assert!(broker.wait_log("request.read.timeout.ms", Duration::from_secs(5)));
    assert!(
        api_versions_ok(&mut busy),
        "the busy connection is still served"
    );
    assert!(api_versions_ok(&mut polling), "so is the long-polling one");
}

/// A client socket bound to `source` (any 127.0.0.0/8 address reaches a 127.0.0.1
/// listener on Linux), connected to `addr`.
fn connect_from(source: &str, addr: &str) -> Client {
    let source: SocketAddr = format!("{source}:0").parse().expect("source");
    let target: SocketAddr = addr.parse().expect("addr");
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.bind(&source.into()).expect("bind the source address");
    sock.connect(&target.into()).expect("connect");
    // SAFETY: the descriptor is owned by `sock` and handed over to the stream.
    let stream = unsafe { TcpStream::from_raw_fd(sock.into_raw_fd()) };
    stream
        .set_read_timeout(Some(common::IO_TIMEOUT))
        .expect("timeout");
    Client::from_stream(stream)
}

/// Whether a fresh connection from `source` is served (a refused one is closed at once).
fn served_from(source: &str, addr: &str) -> bool {
    let mut c = connect_from(source, addr);
    let sent = c.send(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    match c.read_frame() {
        Some(frame) => {
            let (got, _resp): (i32, ApiVersionsResponse) =
                wire::messages::decode_response_as(api::API_VERSIONS, 3, &frame).expect("decode");
            got == sent
        }
        None => false,
    }
}

#[test]
fn max_connections_per_ip_holds_one_address_back_but_not_others() {
    let broker = Broker::start(
        2,
        &[
            ("max.connections.per.ip", "3"),
            ("max.connections.per.ip.overrides", "127.0.0.3:1"),
        ],
    );
    let addr = broker.addr();
    let mut open: Vec<Client> = (0..3).map(|_| connect_from("127.0.0.1", &addr)).collect();
    for c in &mut open {
        assert!(api_versions_ok(c));
    }
    assert!(
        !served_from("127.0.0.1", &addr),
        "the fourth connection from one address is refused"
    );
    assert!(broker.wait_log("max.connections.per.ip", Duration::from_secs(5)));
    assert!(
        served_from("127.0.0.2", &addr),
        "another address still gets in"
    );
    let mut third = connect_from("127.0.0.3", &addr);
    assert!(
        api_versions_ok(&mut third),
        "an override's first connection"
    );
    assert!(
        !served_from("127.0.0.3", &addr),
        "the override (1) applies to its address"
    );
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut served = false;
    while !served && Instant::now() < deadline {
        served = served_from("127.0.0.1", &addr);
    }
    assert!(served, "a slot freed by a closed connection is reused");
}

/// How long a second broker may take to refuse to start.
const SECOND_BROKER_EXIT_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn a_second_broker_on_the_same_address_fails_with_address_in_use() {
    let broker = Broker::start(2, &[]);
    let mut first = broker.client();
    assert!(api_versions_ok(&mut first));
    let other_dir = tempfile::tempdir_in(common::test_root()).expect("tempdir");
    for listen in [broker.addr(), format!("0.0.0.0:{}", broker.port)] {
        let mut second = Command::new(env!("CARGO_BIN_EXE_weir"))
            .arg("serve")
            .arg("--data-dir")
            .arg(other_dir.path())
            .args(["--listen", &listen, "--shards", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the second weir");
        // Bounded: a second weir that starts (the old behaviour) is killed, then fails
        // the assertions below.
        let deadline = Instant::now() + SECOND_BROKER_EXIT_TIMEOUT;
        while second.try_wait().expect("wait").is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let exited = second.try_wait().expect("wait");
        if exited.is_none() {
            let _ = second.kill();
        }
        let out = second.wait_with_output().expect("output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            exited.is_some_and(|s| !s.success()),
            "a second weir on {listen} must not start: {text}"
        );
        assert!(
            text.contains("address in use"),
            "and says why ({listen}): {text}"
        );
        assert!(!text.contains("weir ready"), "{text}");
    }
    assert!(api_versions_ok(&mut first), "the first keeps serving");
    for _ in 0..8 {
        assert!(
            api_versions_ok(&mut broker.client()),
            "every new connection reaches the first broker"
        );
    }
}

/// The burst: this many connections at once...
const BURST_CONNECTIONS: usize = 16;
/// ...each producing this many batches...
const BURST_PRODUCES: usize = 8;
/// ...of this size (between glibc's mmap threshold and its 32 MiB ceiling: such frames
/// are kept in the heap once freed).
const BURST_BATCH_BYTES: usize = 6 << 20;
/// RSS may stay this far above the baseline once the burst is over (the tail caches of
/// the two partitions hold 2 x 4 MiB; the rest is slack for allocator state).
const RSS_AFTER_BURST_KIB_MAX: u64 = 64 * 1024;
/// ...within this long after the last produce was answered (the broker trims its heap
/// 0.5 s after its request budget went unused; without that, glibc kept the memory for
/// 8 s to forever in the measurements).
const RSS_RETURN_TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn memory_of_a_burst_of_large_produces_is_given_back() {
    let max_message = (BURST_BATCH_BYTES + (1 << 20)).to_string();
    let broker = Broker::start(
        2,
        &[
            ("message.max.bytes", &max_message),
            ("num.partitions", "2"),
            // Logs keep recent batches in memory by design (an eighth of the machine's
            // memory by default): bounded small here, so what is measured is what the
            // requests held.
            ("log.tail.cache.max.bytes", "8388608"),
        ],
    );
    let pid = broker.pid();
    let mut warm = broker.client();
    create_topic(&mut warm, "burst");
    for p in 0..2 {
        produce(&mut warm, p, common::batch(&[b"warm"], 1));
    }
    let baseline = settled_rss_kib(pid);
    let value = vec![7u8; BURST_BATCH_BYTES];
    let batch = common::batch(&[&value], 1);
    let threads: Vec<_> = (0..BURST_CONNECTIONS)
        .map(|i| {
            let (addr, batch) = (broker.addr(), batch.clone());
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                for _ in 0..BURST_PRODUCES {
                    produce(&mut c, (i % 2) as i32, batch.clone());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("producer thread");
    }
    let peak = status_kib(pid, "VmHWM");
    drop(warm);
    let deadline = Instant::now() + RSS_RETURN_TIMEOUT;
    let mut after = status_kib(pid, "VmRSS");
    while after > baseline + RSS_AFTER_BURST_KIB_MAX && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        after = status_kib(pid, "VmRSS");
    }
    eprintln!(
        "MEASURE burst connections={BURST_CONNECTIONS} produces={BURST_PRODUCES} batch_bytes={BURST_BATCH_BYTES} \
         rss_baseline_kib={baseline} vm_hwm_kib={peak} rss_after_kib={after}"
    );
    assert!(
        peak > baseline + 64 * 1024,
        "the burst did use memory ({baseline} -> {peak} KiB)"
    );
    assert!(
        after <= baseline + RSS_AFTER_BURST_KIB_MAX,
        "RSS after the burst {after} KiB, baseline {baseline} KiB, peak {peak} KiB"
    );
}

fn produce(c: &mut Client, partition: i32, batch: bytes::Bytes) {
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            produce_request::TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("burst")))
                .with_partition_data(vec![
                    produce_request::PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch)),
                ]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 7, &req);
    let code = resp.responses[0].partition_responses[0].error_code;
    assert_eq!(code, 0, "produce accepted");
}

/// RSS once it stops moving (bounded wait).
fn settled_rss_kib(pid: u32) -> u64 {
    let mut last = status_kib(pid, "VmRSS");
    for _ in 0..50 {
        thread::sleep(Duration::from_millis(100));
        let now = status_kib(pid, "VmRSS");
        if now.abs_diff(last) < 512 {
            return now;
        }
        last = now;
    }
    last
}

/// The metrics endpoint's address, from the broker's log line.
fn metrics_addr(broker: &Broker) -> String {
    assert!(broker.wait_log("metrics listening on", Duration::from_secs(30)));
    let log = broker.log.lock().expect("log");
    let line = log
        .iter()
        .find(|l| l.contains("metrics listening on"))
        .expect("the line");
    line.rsplit(' ').next().expect("address").trim().to_string()
}

/// A client that asks for large responses and never reads them holds a few, not
/// `PIPELINE_MAX`: requests other than Produce and Fetch are handled one at a time, and no
/// frame is read while more than 1 MiB of responses wait to be written. (Each of 18 held
/// Metadata answers of a large catalog was tens of MB, per connection.) Once the client
/// reads, every response arrives, in order.
#[test]
fn a_client_that_never_reads_its_large_responses_holds_few_of_them() {
    let broker = Broker::start(1, &[("metrics.listener", "127.0.0.1:0")]);
    let metrics = metrics_addr(&broker);
    let handled = || {
        let text = common::scrape_metrics(&metrics, "/metrics");
        common::metric_value(&text, r#"weir_requests_total{api="Metadata",version="12"}"#)
            .unwrap_or(0.0) as usize
    };
    let mut c = broker.client();
    let started = Instant::now();
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(120_000)
        .with_topics(vec![
            create_topics_request::CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("wide")))
                .with_num_partitions(WIDE_PARTITIONS)
                .with_replication_factor(1),
        ]);
    let resp: CreateTopicsResponse = c.call(api::CREATE_TOPICS, 5, &create);
    assert_eq!(resp.topics[0].error_code, 0);
    eprintln!(
        "{WIDE_PARTITIONS} partitions created in {:?}",
        started.elapsed()
    );
    let all = MetadataRequest::default().with_topics(None);
    c.send(api::METADATA, 12, &all);
    let size = c.read_frame().expect("an answer").len();
    let before = handled();
    eprintln!("metadata answer {size} bytes, {before} handled so far");
    assert!(size > 256 << 10, "a large answer: {size} bytes");

    let mut hog = broker.client();
    let sent = 30;
    for _ in 0..sent {
        hog.send(api::METADATA, 12, &all);
    }
    // Watched for 3 s: the count rises while the socket buffers and the backlog take
    // answers, then stops.
    let watch_until = Instant::now() + Duration::from_secs(3);
    let mut most = 0;
    while Instant::now() < watch_until {
        most = most.max(handled() - before);
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("{most} of {sent} answers of {size} bytes handled while none was read");
    // What the kernel's buffers can take besides: the broker's send buffer at its
    // autotuned maximum and the client's receive buffer at its default (a socket that is
    // not read does not grow it); this machine's values, not assumed.
    let tcp = |file: &str, field: usize| -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{file}"))
            .ok()
            .and_then(|v| v.split_whitespace().nth(field)?.parse().ok())
            .unwrap_or(8 << 20)
    };
    let buffered = tcp("tcp_wmem", 2) + tcp("tcp_rmem", 1);
    let held_max = 3 + ((1 << 20) + buffered) / size;
    assert!(
        held_max < 16,
        "answers too small to tell ({size} bytes, {buffered} buffered)"
    );
    assert!(
        (1..=held_max).contains(&most),
        "{most} of {sent} answers of {size} bytes handled while none was read (at most {held_max})"
    );
    for i in 0..sent {
        let frame = hog.read_frame().unwrap_or_else(|| panic!("answer {i}"));
        assert_eq!(frame.len(), size, "answer {i}");
    }
    assert_eq!(handled(), before + sent);
}

/// Partitions of the topic whose Metadata answers are large.
const WIDE_PARTITIONS: i32 = 100_000;

/// Connections from one address that send only a 100 MB size prefix hold at most half of
/// the shard's request budget: another address's large Produce is read and answered at
/// once, not after `request.read.timeout.ms` closes them. (The budget is taken when the
/// prefix arrives; before, three such connections pinned a 256 MB share.)
#[test]
fn size_prefixes_from_one_address_leave_half_the_budget_to_others() {
    let max_message = (4 << 20).to_string();
    let broker = Broker::start(
        1,
        &[
            ("metrics.listener", "127.0.0.1:0"),
            ("queued.max.request.bytes", "268435456"),
            ("request.read.timeout.ms", "60000"),
            ("message.max.bytes", &max_message),
        ],
    );
    let metrics = metrics_addr(&broker);
    let held = || {
        let text = common::scrape_metrics(&metrics, "/metrics");
        common::metric_value(&text, r#"weir_request_budget_bytes{shard="0"}"#).unwrap_or(0.0) as u64
    };
    let mut c = broker.client();
    create_topic(&mut c, "burst");
    // Four connections from 127.0.0.2, each declaring a 100 MiB frame and sending nothing.
    let stallers: Vec<Client> = (0..4)
        .map(|_| {
            let mut s = connect_from("127.0.0.2", &broker.addr());
            s.stream
                .write_all(&(100i32 << 20).to_be_bytes())
                .expect("prefix");
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while held() < 100 << 20 {
        assert!(
            Instant::now() < deadline,
            "the first prefix takes its budget"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // A 2 MiB batch from 127.0.0.1: read and answered well within the frame timeout.
    let mut other = connect_from("127.0.0.1", &broker.addr());
    other
        .stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let value = vec![7u8; 2 << 20];
    let started = Instant::now();
    produce(&mut other, 0, common::batch(&[&value], 1));
    eprintln!(
        "a 2 MiB produce beside 4 stalled prefixes: {:?}",
        started.elapsed()
    );
    assert!(
        held() <= 128 << 20,
        "one address holds at most half the share ({} bytes held)",
        held()
    );
    drop(stallers);
}

/// With its log on a full disk (stderr on /dev/full, where every write fails with
/// ENOSPC), the node goes on serving: a log line that cannot be written is lost. tracing
/// reported the failed write with `eprintln!`, which panicked on the same stderr, and
/// the panicking shard stopped the node (SIGABRT).
#[test]
fn a_node_whose_log_cannot_be_written_keeps_serving() {
    use std::io::BufRead;
    let dir = tempfile::tempdir_in(common::test_root()).expect("tempdir");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(full)
        .spawn()
        .expect("run weir");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(at) = line.find("listening on ") {
                let _ = tx.send(line[at + "listening on ".len()..].trim().to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the ready line");
    // Each of these makes the node log a line (a refused frame, an auto-created topic).
    for i in 0..20 {
        let mut s = TcpStream::connect(&addr).expect("connect");
        let _ = s.write_all(&(-1i32).to_be_bytes());
        let _ = closed_within(&mut s, Duration::from_secs(10));
        let mut c = Client::connect(&addr);
        let topic = format!("logged-{i}");
        let md = MetadataRequest::default().with_topics(Some(vec![
            metadata_request::MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(topic)))),
        ]));
        let _: MetadataResponse = c.call(api::METADATA, 12, &md);
    }
    let mut c = Client::connect(&addr);
    assert!(api_versions_ok(&mut c), "still serving");
    assert!(child.try_wait().expect("wait").is_none(), "still running");
    let _ = child.kill();
    let _ = child.wait();
}
