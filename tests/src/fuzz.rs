//! A mutation fuzzer over TCP against a live `weir serve`: requests captured from real
//! clients (`wire/tests/fixtures/raw`) are mutated (bit flips, interesting integers over
//! length fields, truncation, insertions, deletions, splices of two requests, a changed
//! API version, a lying size prefix, partial frames, duplicated frames) and sent on many
//! connections at once, while the run checks that the node stays up (process alive, no
//! panic in its log), that its RSS stays bounded, and that a canary producer/consumer on
//! its own connection keeps working with a bounded p99 latency.
//!
//! Run it as `tests/tcp-fuzz.sh --minutes N` (release node); `node/tests/tcp_fuzz.rs` holds
//! the default-suite run and the long one.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;

use crate::raw::{self, RawConn};
use crate::{Weir, WeirConfig};

/// The topics the captured requests name (created up front, so mutated produces and
/// fetches reach real partitions), and the canary's own topic.
const FIXTURE_TOPICS: [&str; 12] = [
    "fx-kcat-none",
    "fx-kcat-gzip",
    "fx-kcat-snappy",
    "fx-kcat-lz4",
    "fx-kcat-zstd",
    "fx-kcat-idem",
    "fx-kpy-none",
    "fx-kpy-gzip",
    "fx-kpy-snappy",
    "fx-kpy-lz4",
    "fx-kpy-zstd",
    "fx-kpy-idem",
];
const CANARY_TOPIC: &str = "fuzz-canary";
/// Frames a fuzz connection sends before it closes (at most).
const FRAMES_PER_CONNECTION_MAX: u64 = 32;
/// How long one write or the final drain of a fuzz connection may block.
const CONNECTION_IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the monitor samples RSS and liveness.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);
/// Pause between canary round trips.
const CANARY_PAUSE: Duration = Duration::from_millis(5);
/// Largest frame the fuzzer builds (a splice or insertion cannot grow without bound).
const FRAME_BYTES_MAX: usize = 64 << 10;

/// What to run and what to assert.
#[derive(Clone, Debug)]
pub struct FuzzOptions {
    pub duration: Duration,
    /// Fuzzing connections open at once (one thread each).
    pub connections: usize,
    pub seed: u64,
    pub shards: usize,
    /// Frames sent per second over all connections (0: as fast as they go). Paced so the
    /// run measures what garbage does to the node, not a CPU-saturated machine.
    pub requests_per_second: u64,
    /// Largest allowed RSS growth over the start of the run (after warm-up), KiB.
    pub rss_growth_max_kib: u64,
    /// Largest allowed p99 of the canary's produce and fetch round trips.
    pub canary_p99_max: Duration,
}

impl Default for FuzzOptions {
    fn default() -> Self {
        FuzzOptions {
            duration: Duration::from_secs(60),
            connections: 8,
            seed: 1,
            shards: 2,
            requests_per_second: 1_000,
            rss_growth_max_kib: 256 << 10,
            canary_p99_max: Duration::from_millis(50),
        }
    }
}

/// What a run saw.
#[derive(Clone, Debug, Default)]
pub struct FuzzReport {
    pub seed: u64,
    pub elapsed: Duration,
    /// Frames written whole (mutated requests, duplicates, lying and cut frames).
    pub requests: u64,
    pub connections: u64,
    /// Connections the node closed (EOF or reset) before the fuzzer did.
    pub closed_by_node: u64,
    pub response_bytes: u64,
    pub connect_errors: u64,
    pub rss_start_kib: u64,
    pub rss_peak_kib: u64,
    pub rss_end_kib: u64,
    pub canary_ops: u64,
    pub canary_errors: Vec<String>,
    pub canary_p50: Duration,
    pub canary_p99: Duration,
    pub canary_max: Duration,
    /// Why the node is considered crashed (exit, panic line), if it is.
    pub crash: Option<String>,
}

impl fmt::Display for FuzzReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "tcp-fuzz seed {} ran {:.1} s",
            self.seed,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "  requests sent {} on {} connections ({} closed by the node, {} connect errors), {} response bytes",
            self.requests,
            self.connections,
            self.closed_by_node,
            self.connect_errors,
            self.response_bytes
        )?;
        writeln!(
            f,
            "  crashes {}{}",
            u8::from(self.crash.is_some()),
            self.crash
                .as_deref()
                .map(|c| format!(": {c}"))
                .unwrap_or_default()
        )?;
        writeln!(
            f,
            "  RSS start {} KiB, peak {} KiB, end {} KiB",
            self.rss_start_kib, self.rss_peak_kib, self.rss_end_kib
        )?;
        write!(
            f,
            "  canary {} round trips, {} errors, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.canary_ops,
            self.canary_errors.len(),
            ms(self.canary_p50),
            ms(self.canary_p99),
            ms(self.canary_max)
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl FuzzReport {
    /// The run's verdict: no crash, bounded RSS, a healthy canary.
    pub fn check(&self, opts: &FuzzOptions) -> Result<()> {
        if let Some(crash) = &self.crash {
            bail!("the node crashed (seed {}): {crash}", self.seed);
        }
        ensure!(self.requests > 0, "no request was sent");
        let growth = self.rss_peak_kib.saturating_sub(self.rss_start_kib);
        ensure!(
            growth <= opts.rss_growth_max_kib,
            "RSS grew by {growth} KiB (start {}, peak {}), more than {} KiB",
            self.rss_start_kib,
            self.rss_peak_kib,
            opts.rss_growth_max_kib
        );
        ensure!(
            self.canary_errors.is_empty(),
            "canary failed: {:?}",
            self.canary_errors
        );
        ensure!(self.canary_ops > 0, "the canary made no round trip");
        ensure!(
            self.canary_p99 <= opts.canary_p99_max,
            "canary p99 {:?} above {:?}",
            self.canary_p99,
            opts.canary_p99_max
        );
        Ok(())
    }
}

/// The captured requests (whole frames, size prefix included).
pub fn load_seeds() -> Result<Vec<Vec<u8>>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/fixtures/raw");
    let mut seeds = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.contains("-req-") && name.ends_with(".bin") {
            let bytes = std::fs::read(&path)?;
            ensure!(
                bytes.len() > 12,
                "{} is not a request frame",
                path.display()
            );
            seeds.push(bytes);
        }
    }
    seeds.sort();
    ensure!(
        !seeds.is_empty(),
        "no captured requests in {}",
        dir.display()
    );
    Ok(seeds)
}

/// SplitMix64: small, seeded, good enough to pick mutations.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `percent`%.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// Integers that break length and count fields: signs, boundaries, off-by-ones.
const INTERESTING_I32: [i32; 12] = [
    -1,
    0,
    1,
    -2,
    127,
    128,
    255,
    0x7fff,
    0x8000,
    0xffff,
    i32::MAX,
    i32::MIN,
];

/// How a mutated frame is delivered.
pub enum Delivery {
    /// Whole frames, back to back (more than one: duplicates, pipelined).
    Frames(Vec<Vec<u8>>),
    /// A frame whose size prefix lies, or a cut frame: the connection closes after it.
    Broken(Vec<u8>),
}

/// One mutated request, from the seeds.
pub fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Delivery {
    let seed = &seeds[rng.below(seeds.len())];
    let mut body = seed[4..].to_vec();
    for _ in 0..=rng.below(3) {
        mutate_body(rng, seeds, &mut body);
    }
    body.truncate(FRAME_BYTES_MAX);
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    match rng.below(100) {
        0..5 => {
            let lie = match rng.below(4) {
                0 => INTERESTING_I32[rng.below(INTERESTING_I32.len())],
                1 => body.len() as i32 + 1 + rng.below(1 << 16) as i32,
                2 => rng.below(body.len().max(1)) as i32,
                _ => rng.next_u64() as i32,
            };
            frame[..4].copy_from_slice(&lie.to_be_bytes());
            Delivery::Broken(frame)
        }
        5..10 => {
            frame.truncate(rng.below(frame.len()));
            Delivery::Broken(frame)
        }
        10..20 => Delivery::Frames(vec![frame; 2 + rng.below(3)]),
        _ => Delivery::Frames(vec![frame]),
    }
}

fn mutate_body(rng: &mut Rng, seeds: &[Vec<u8>], body: &mut Vec<u8>) {
    if body.is_empty() {
        return;
    }
    let len = body.len();
    match rng.below(10) {
        0 => {
            for _ in 0..=rng.below(8) {
                let at = rng.below(len);
                body[at] ^= 1 << rng.below(8);
            }
        }
        1 => {
            for _ in 0..=rng.below(4) {
                let at = rng.below(len);
                body[at] = [0x00, 0xff, 0x7f, 0x80, 0x01][rng.below(5)];
            }
        }
        2 => {
            // An interesting integer over what may be a length, count or varint field.
            let v = INTERESTING_I32[rng.below(INTERESTING_I32.len())];
            let at = rng.below(len);
            let bytes: &[u8] = if rng.chance(50) {
                &v.to_be_bytes()[2..]
            } else {
                &v.to_be_bytes()
            };
            for (i, b) in bytes.iter().enumerate() {
                if let Some(slot) = body.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
        3 => body.truncate(rng.below(len)),
        4 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let junk: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            body.splice(at..at, junk);
        }
        5 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            body.drain(at..at + n);
        }
        6 => {
            // A prefix of this request, the rest of another (same API key half the time).
            let same_key: Vec<&Vec<u8>> = seeds
                .iter()
                .filter(|s| s[4..6] == body[..2.min(len)])
                .collect();
            let other = if rng.chance(50) && !same_key.is_empty() {
                same_key[rng.below(same_key.len())]
            } else {
                &seeds[rng.below(seeds.len())]
            };
            let other = &other[4..];
            let cut = rng.below(len);
            let from = rng.below(other.len());
            body.truncate(cut);
            body.extend_from_slice(&other[from..]);
        }
        7 => {
            // A repeated slice: an array element (or a whole batch) twice.
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(256));
            let copy = body[at..at + n].to_vec();
            body.splice(at + n..at + n, copy);
        }
        8 if len >= 4 => {
            // The same body claimed at another API version.
            let v = rng.below(20) as i16;
            body[2..4].copy_from_slice(&v.to_be_bytes());
        }
        _ => {} // the captured request as it was: keeps real state changes going
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    connections: AtomicU64,
    closed_by_node: AtomicU64,
    response_bytes: AtomicU64,
    connect_errors: AtomicU64,
}

/// Starts a node, fuzzes it for `opts.duration`, and reports. Errors are for a run that
/// could not be set up; what the run found is in the report ([`FuzzReport::check`]).
pub fn run(opts: &FuzzOptions) -> Result<FuzzReport> {
    let seeds = Arc::new(load_seeds()?);
    // Auto-creation off: a mutated Metadata request could otherwise create topics
    // without bound, a real but separate resource question (partition limits).
    let config = WeirConfig::shards(opts.shards).set("auto.create.topics.enable", "false");
    let mut weir = Weir::start(config)?;
    let addr = weir.addr();
    create_topics(addr)?;
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let canary = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || canary_loop(addr, &stop))
    };
    let mut report = FuzzReport {
        seed: opts.seed,
        ..FuzzReport::default()
    };
    report.rss_start_kib = weir.rss_kib()?;
    report.rss_peak_kib = report.rss_start_kib;
    let workers: Vec<_> = (0..opts.connections)
        .map(|i| {
            let (stop, counters, seeds) =
                (Arc::clone(&stop), Arc::clone(&counters), Arc::clone(&seeds));
            let seed = opts
                .seed
                .wrapping_add(i as u64)
                .wrapping_mul(0x2545_f491_4f6c_dd1d);
            let gap = match u32::try_from(opts.requests_per_second) {
                Ok(0) => Duration::ZERO,
                Ok(r) => Duration::from_secs(opts.connections as u64) / r,
                Err(_) => Duration::ZERO,
            };
            thread::spawn(move || fuzz_loop(addr, seed, gap, &seeds, &stop, &counters))
        })
        .collect();
    let t0 = Instant::now();
    while t0.elapsed() < opts.duration {
        thread::sleep(SAMPLE_INTERVAL);
        if let Some(crash) = crashed(&mut weir) {
            report.crash = Some(crash);
            break;
        }
        if let Ok(rss) = weir.rss_kib() {
            report.rss_peak_kib = report.rss_peak_kib.max(rss);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    report.elapsed = t0.elapsed();
    let (ops, errors, mut latencies) = canary.join().unwrap_or_default();
    if report.crash.is_none() {
        report.crash = crashed(&mut weir);
        report.rss_end_kib = weir.rss_kib().unwrap_or(0);
        report.rss_peak_kib = report.rss_peak_kib.max(report.rss_end_kib);
    }
    if let Some(crash) = &mut report.crash {
        crash.push_str(&format!("\nlog tail:\n{}", weir.log_tail(40)));
    }
    latencies.sort();
    let pct = |p: usize| {
        latencies
            .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    report.canary_ops = ops;
    report.canary_errors = errors;
    report.canary_p50 = pct(50);
    report.canary_p99 = pct(99);
    report.canary_max = latencies.last().copied().unwrap_or_default();
    report.requests = counters.requests.load(Ordering::Relaxed);
    report.connections = counters.connections.load(Ordering::Relaxed);
    report.closed_by_node = counters.closed_by_node.load(Ordering::Relaxed);
    report.response_bytes = counters.response_bytes.load(Ordering::Relaxed);
    report.connect_errors = counters.connect_errors.load(Ordering::Relaxed);
    Ok(report)
}

/// Why the node counts as crashed, if it does: it exited, or it logged a panic.
fn crashed(weir: &mut Weir) -> Option<String> {
    if !weir.is_alive() {
        return Some("the weir process exited".into());
    }
    let log = weir.log_text();
    log.lines()
        .find(|l| l.contains("panicked"))
        .map(|l| format!("panic in the log: {l}"))
}

fn create_topics(addr: SocketAddr) -> Result<()> {
    let mut conn = RawConn::connect(addr)?;
    let topics = FIXTURE_TOPICS
        .iter()
        .chain([&CANARY_TOPIC])
        .map(|t| {
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(t)))
                .with_num_partitions(1)
                .with_replication_factor(1)
        })
        .collect();
    let req = CreateTopicsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 5, &req)?;
    for t in &resp.topics {
        ensure!(
            t.error_code == 0,
            "create {:?}: error {}",
            t.name,
            t.error_code
        );
    }
    Ok(())
}

/// One fuzzing thread: connection after connection of mutated frames until `stop`, one
/// frame per `gap` at most.
fn fuzz_loop(
    addr: SocketAddr,
    seed: u64,
    gap: Duration,
    seeds: &[Vec<u8>],
    stop: &AtomicBool,
    c: &Counters,
) {
    let mut rng = Rng::new(seed);
    let mut next_at = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, CONNECTION_IO_TIMEOUT) else {
            c.connect_errors.fetch_add(1, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        c.connections.fetch_add(1, Ordering::Relaxed);
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        let frames = 1 + rng.below(FRAMES_PER_CONNECTION_MAX as usize);
        let mut open = true;
        for _ in 0..frames {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let (chunks, last) = match mutate(&mut rng, seeds) {
                Delivery::Frames(f) => (f, false),
                Delivery::Broken(f) => (vec![f], true),
            };
            for chunk in &chunks {
                // Paced: one frame per `gap`, never bursting to catch up after a stall.
                next_at = (next_at + gap).max(Instant::now() - gap);
                if let Some(wait) = next_at.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                match write_all(&mut stream, chunk, &mut buf, c) {
                    Ok(()) => {
                        c.requests.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => open = false,
                }
                if !open {
                    break;
                }
            }
            if !open || last {
                break;
            }
        }
        if !open || drain_until_closed(&mut stream, &mut buf, c) {
            c.closed_by_node.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes all of `bytes` on a non-blocking stream, reading responses meanwhile (so a node
/// waiting for us to read never deadlocks with us). Bounded by [`CONNECTION_IO_TIMEOUT`].
fn write_all(stream: &mut TcpStream, bytes: &[u8], buf: &mut [u8], c: &Counters) -> Result<()> {
    let deadline = Instant::now() + CONNECTION_IO_TIMEOUT;
    let mut at = 0;
    while at < bytes.len() {
        match stream.write(&bytes[at..]) {
            Ok(0) => bail!("write returned 0"),
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if drain(stream, buf, c)? {
                    bail!("closed by the node");
                }
                ensure!(Instant::now() < deadline, "write timed out");
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if drain(stream, buf, c)? {
        bail!("closed by the node");
    }
    Ok(())
}

/// Reads what is there without blocking; true if the node closed the connection.
fn drain(stream: &mut TcpStream, buf: &mut [u8], c: &Counters) -> Result<bool> {
    // Bounded: a node answering faster than we read still yields after this many reads.
    for _ in 0..64 {
        match stream.read(buf) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                c.response_bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(_) => return Ok(true),
        }
    }
    Ok(false)
}

/// Reads answers for a while after the last frame; true if the node closed first.
fn drain_until_closed(stream: &mut TcpStream, buf: &mut [u8], c: &Counters) -> bool {
    let deadline = Instant::now() + Duration::from_millis(50);
    while Instant::now() < deadline {
        match drain(stream, buf, c) {
            Ok(false) => thread::sleep(Duration::from_millis(1)),
            Ok(true) | Err(_) => return true,
        }
    }
    false
}

/// The canary: produce one record, fetch it back, on its own connection, until `stop`.
/// Returns (round trips, errors, latency of every produce and fetch).
fn canary_loop(addr: SocketAddr, stop: &AtomicBool) -> (u64, Vec<String>, Vec<Duration>) {
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    let mut ops = 0u64;
    let mut conn = match RawConn::connect(addr) {
        Ok(c) => c,
        Err(e) => return (0, vec![format!("connect: {e:#}")], latencies),
    };
    while !stop.load(Ordering::Relaxed) && errors.len() < 10 {
        match canary_round(&mut conn, ops, &mut latencies) {
            Ok(()) => ops += 1,
            Err(e) => {
                errors.push(format!("round {ops}: {e:#}"));
                match RawConn::connect(addr) {
                    Ok(c) => conn = c,
                    Err(e) => errors.push(format!("reconnect: {e:#}")),
                }
            }
        }
        thread::sleep(CANARY_PAUSE);
    }
    (ops, errors, latencies)
}

fn canary_round(conn: &mut RawConn, i: u64, latencies: &mut Vec<Duration>) -> Result<()> {
    let value = format!("canary-{i}").into_bytes();
    let batch = raw::record_batch(std::slice::from_ref(&value), Compression::None)?;
    let t0 = Instant::now();
    let (err, offset) = conn.produce(CANARY_TOPIC, 0, 1, batch)?;
    latencies.push(t0.elapsed());
    ensure!(err == 0, "produce error {err}");
    ensure!(offset == i as i64, "produce offset {offset}, expected {i}");
    let t0 = Instant::now();
    let (err, _, records) = conn.fetch(CANARY_TOPIC, 0, offset, 1 << 20)?;
    latencies.push(t0.elapsed());
    ensure!(err == 0, "fetch error {err}");
    let got = records.first().and_then(|r| r.value.clone());
    ensure!(
        got.as_deref() == Some(value.as_slice()),
        "fetch at {offset} returned {got:?}"
    );
    Ok(())
}
