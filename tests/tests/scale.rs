//! Scale and memory on one node with 2 shards: 1,000 partitions (10 topics) are created,
//! produced to, consumed from, and survive a restart; RSS per idle partition replica is
//! measured. RSS stays bounded while a producer runs and a consumer stalls (pipelined
//! fetches never read), and while connections pile up (`max.connections` enforced).
//! Numbers are printed as `MEASURE ...` lines (see docs/PERFORMANCE.md, "broker memory").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use weir_tests::clients::{self, Sent};
use weir_tests::raw::RawConn;
use weir_tests::{Weir, WeirConfig};

const TOPICS: usize = 10;
const PARTITIONS_PER_TOPIC: i32 = 100;
const RECORDS_PER_PARTITION: u64 = 5;
/// Generous ceiling per idle partition (Redpanda budgets 2 MB); the aim is 256 KiB.
const RSS_PER_PARTITION_KIB_MAX: u64 = 2048;

fn topic_names() -> Vec<String> {
    (0..TOPICS).map(|t| format!("scale-{t:02}")).collect()
}

/// RSS once it stops changing by more than 1 MiB over 300 ms (bounded to 5 s).
fn settled_rss_kib(weir: &Weir) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = weir.rss_kib()?;
    loop {
        thread::sleep(Duration::from_millis(300));
        let now = weir.rss_kib()?;
        if now.abs_diff(last) < 1024 || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

#[test]
fn thousand_partitions_created_produced_consumed_and_restarted() -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(2))?;
    let bootstrap = weir.bootstrap();
    let rss_empty = settled_rss_kib(&weir)?;
    let anon_empty = weir.rss_anon_kib()?;
    let names = topic_names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let started = Instant::now();
    clients::create_topics(&bootstrap, &refs, PARTITIONS_PER_TOPIC, &[])?;
    let create_secs = started.elapsed().as_secs_f64();
    for name in &names {
        ensure!(clients::partition_count(&bootstrap, name)? == PARTITIONS_PER_TOPIC as usize);
    }
    let rss_created = settled_rss_kib(&weir)?;

    let (sent, acked) = produce_everywhere(&bootstrap, &names)?;
    let rss_written = settled_rss_kib(&weir)?;
    let anon_written = weir.rss_anon_kib()?;
    let all: Vec<i32> = (0..PARTITIONS_PER_TOPIC).collect();
    for name in &names {
        let got = clients::consume_to_end(&bootstrap, name, &all)?;
        ensure!(
            got.len() == (RECORDS_PER_PARTITION * PARTITIONS_PER_TOPIC as u64) as usize,
            "{name}: {} records",
            got.len()
        );
        let mine: Vec<_> = acked
            .iter()
            .filter(|(t, _)| t == name)
            .map(|(_, a)| *a)
            .collect();
        clients::verify(&sent, &mine, &got)?;
    }

    let status = weir.terminate()?;
    ensure!(status.success(), "exit {status}");
    let restart_started = Instant::now();
    weir.restart()?;
    let restart_secs = restart_started.elapsed().as_secs_f64();
    let bootstrap = weir.bootstrap();
    for name in &names {
        ensure!(clients::partition_count(&bootstrap, name)? == PARTITIONS_PER_TOPIC as usize);
        let got = clients::consume_to_end(&bootstrap, name, &all)?;
        let mine: Vec<_> = acked
            .iter()
            .filter(|(t, _)| t == name)
            .map(|(_, a)| *a)
            .collect();
        clients::verify(&sent, &mine, &got)?;
    }
    let rss_restarted = settled_rss_kib(&weir)?;
    let anon_restarted = weir.rss_anon_kib()?;

    let partitions = (TOPICS as u64) * PARTITIONS_PER_TOPIC as u64;
    let per_created = rss_created.saturating_sub(rss_empty) / partitions;
    let per_written = rss_written.saturating_sub(rss_empty) / partitions;
    eprintln!(
        "MEASURE partitions={partitions} shards=2 rss_empty_kib={rss_empty} rss_created_kib={rss_created} \
         rss_after_produce_kib={rss_written} rss_after_restart_kib={rss_restarted} \
         per_partition_created_kib={per_created} per_partition_after_produce_kib={per_written} \
         create_secs={create_secs:.2} restart_to_ready_secs={restart_secs:.2} \
         anon_empty_kib={anon_empty} anon_after_produce_kib={anon_written} \
         anon_after_restart_kib={anon_restarted}"
    );
    ensure!(
        per_written <= RSS_PER_PARTITION_KIB_MAX,
        "{per_written} KiB per partition"
    );
    Ok(())
}

/// Acknowledgements tagged with their topic.
type TopicAcks = Vec<(String, clients::Acked)>;

/// Records to every partition of every topic (explicit partitions); returns what was
/// sent and, per topic, the acknowledgements.
fn produce_everywhere(bootstrap: &str, names: &[String]) -> Result<(Vec<Sent>, TopicAcks)> {
    let (producer, log) = clients::producer(bootstrap, "all", "none", &[])?;
    let mut sent = Vec::new();
    let mut owner = Vec::new();
    let mut id = 0u64;
    for name in names {
        for p in 0..PARTITIONS_PER_TOPIC {
            let records = clients::make_records(id, RECORDS_PER_PARTITION, name, clients::now_ms());
            for r in &records {
                clients::send_one(&producer, name, r, Some(p))?;
                owner.push((r.id, name.clone()));
            }
            id += RECORDS_PER_PARTITION;
            sent.extend(records);
        }
    }
    rdkafka::producer::Producer::flush(&producer, clients::CLIENT_TIMEOUT)?;
    ensure!(
        log.failed().is_empty(),
        "failed: {:?}",
        &log.failed()[..log.failed().len().min(3)]
    );
    ensure!(
        log.acked().len() == sent.len(),
        "{} of {} acked",
        log.acked().len(),
        sent.len()
    );
    let topic_of: std::collections::BTreeMap<u64, String> = owner.into_iter().collect();
    let acked = log
        .acked()
        .into_iter()
        .filter_map(|a| Some((topic_of.get(&a.id)?.clone(), a)))
        .collect();
    Ok((sent, acked))
}

/// Raises this process's open-file soft limit to the hard limit (for many sockets).
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    lim.rlim_cur
}

const STALL_TOPIC: &str = "stall";
const STALL_BACKLOG_BYTES: usize = 64 << 20;
const STALLED_FETCHES: usize = 400;
const MAX_CONNECTIONS: usize = 400;
/// RSS may grow by at most this much while a consumer stalls and connections pile up.
const RSS_GROWTH_KIB_MAX: u64 = 256 * 1024;

#[test]
fn rss_bounded_with_stalled_consumer_and_many_connections() -> Result<()> {
    let weir = Weir::start(WeirConfig::shards(2).set("max.connections", MAX_CONNECTIONS))?;
    let bootstrap = weir.bootstrap();
    clients::create_topics(&bootstrap, &[STALL_TOPIC], 2, &[])?;
    fill_backlog(&bootstrap)?;
    let rss_base = settled_rss_kib(&weir)?;

    // A producer keeps writing while one consumer pipelines fetches and never reads:
    // 400 x 1 MiB of responses that must not pile up in the broker's memory.
    let stop = Arc::new(AtomicBool::new(false));
    let bg = background_producer(&bootstrap, Arc::clone(&stop));
    let mut stalled = RawConn::connect(weir.addr())?;
    let mut sent_fetches = 0;
    for _ in 0..STALLED_FETCHES {
        // The broker stops reading once its queue for us is full: writes then block
        // until the socket buffers fill, and time out. Either way we stop sending.
        if stalled
            .send(ApiKey::Fetch, 11, &fetch_all_request())
            .is_err()
        {
            break;
        }
        sent_fetches += 1;
    }
    let rss_stalled = peak_rss_over(&weir, Duration::from_secs(3))?;

    // Connections pile up beyond max.connections: the extra ones are refused.
    raise_nofile();
    let (served, refused, conns) = open_connections(&weir, MAX_CONNECTIONS + 100)?;
    let rss_conns = peak_rss_over(&weir, Duration::from_secs(1))?;
    stop.store(true, Ordering::Relaxed);
    let (bg_sent, bg_acked) = bg
        .join()
        .map_err(|_| anyhow::anyhow!("producer panicked"))??;
    drop(conns);
    drop(stalled);

    eprintln!(
        "MEASURE stalled_fetches_sent={sent_fetches} connections_served={served} connections_refused={refused} \
         rss_base_kib={rss_base} rss_peak_stalled_kib={rss_stalled} rss_peak_connections_kib={rss_conns} \
         background_acked={bg_acked}/{bg_sent}"
    );
    ensure!(
        rss_stalled < rss_base + RSS_GROWTH_KIB_MAX,
        "RSS {rss_base} -> {rss_stalled} KiB with a stalled consumer"
    );
    ensure!(
        rss_conns < rss_base + RSS_GROWTH_KIB_MAX,
        "RSS {rss_base} -> {rss_conns} KiB with many connections"
    );
    ensure!(
        bg_acked == bg_sent && bg_sent > 0,
        "background producer: {bg_acked} of {bg_sent} acked"
    );
    ensure!(
        refused >= 50,
        "max.connections={MAX_CONNECTIONS}: only {refused} of {} refused",
        MAX_CONNECTIONS + 100
    );
    ensure!(
        served >= MAX_CONNECTIONS - 50,
        "only {served} connections served"
    );
    // Once the crowd is gone, new clients are served again: as soon as the broker has
    // seen the closes (asynchronously, so retried for a bounded time).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let served = RawConn::connect(weir.addr()).and_then(|mut c| c.api_versions());
        match served {
            Ok(v) if v.error_code == 0 => break,
            other if Instant::now() >= deadline => {
                anyhow::bail!("not served again after the crowd left: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    Ok(())
}

fn fill_backlog(bootstrap: &str) -> Result<()> {
    let (producer, log) = clients::producer(bootstrap, "1", "none", &[])?;
    let n = (STALL_BACKLOG_BYTES / 10_000) as u64;
    let mut records = clients::make_records(0, n, "backlog", clients::now_ms());
    for r in &mut records {
        r.value = vec![(r.id % 251) as u8; 10_000];
    }
    clients::produce_all(&producer, STALL_TOPIC, &records, None)?;
    ensure!(
        log.acked().len() == records.len(),
        "backlog: {} of {n} acked",
        log.acked().len()
    );
    Ok(())
}

fn fetch_all_request() -> FetchRequest {
    let parts = (0..2)
        .map(|p| {
            FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)
        })
        .collect();
    let topic = FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_static_str(STALL_TOPIC)))
        .with_partitions(parts);
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        .with_max_bytes(2 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![topic])
}

type Joined = thread::JoinHandle<Result<(usize, usize)>>;

fn background_producer(bootstrap: &str, stop: Arc<AtomicBool>) -> Joined {
    let bootstrap = bootstrap.to_string();
    thread::spawn(move || {
        let (producer, log) = clients::producer(&bootstrap, "all", "lz4", &[])?;
        let mut sent = 0usize;
        let mut id = 1u64 << 40;
        // Bounded: at most 10,000 rounds.
        for _ in 0..10_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let chunk = clients::make_records(id, 50, "bg", clients::now_ms());
            clients::produce_all(&producer, STALL_TOPIC, &chunk, None)?;
            sent += chunk.len();
            id += 50;
            thread::sleep(Duration::from_millis(10));
        }
        Ok((sent, log.acked().len()))
    })
}

fn peak_rss_over(weir: &Weir, span: Duration) -> Result<u64> {
    let until = Instant::now() + span;
    let mut peak = weir.rss_kib()?;
    while Instant::now() < until {
        thread::sleep(Duration::from_millis(100));
        peak = peak.max(weir.rss_kib()?);
    }
    Ok(peak)
}

/// Opens `n` connections and asks each for ApiVersions; returns (answered, refused,
/// the open connections).
fn open_connections(weir: &Weir, n: usize) -> Result<(usize, usize, Vec<RawConn>)> {
    let mut conns = Vec::with_capacity(n);
    let mut refused = 0;
    for _ in 0..n {
        match RawConn::connect_timeout(weir.addr(), Duration::from_secs(1)) {
            Ok(c) => conns.push(c),
            Err(_) => refused += 1,
        }
    }
    // Ask all first, then read: a refused connection answers EOF at once.
    let mut asked = Vec::with_capacity(conns.len());
    for mut c in conns {
        match c.send(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default()) {
            Ok(id) => asked.push((c, id)),
            Err(_) => refused += 1,
        }
    }
    let mut served = 0;
    let mut kept = Vec::new();
    for (mut c, id) in asked {
        match c.recv::<ApiVersionsResponse>(ApiKey::ApiVersions, 0, id) {
            Ok(_) => {
                served += 1;
                kept.push(c);
            }
            Err(_) => refused += 1,
        }
    }
    Ok((served, refused, kept))
}
