//! One measured run: producers and/or consumers on their own threads, a progress thread
//! printing a line per second and sampling consumer lag, and the summary at the end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use hdrhistogram::Histogram;
use wire::batch::Compression;

use crate::client::conn::Conn;
use crate::client::consumer::{
    Consumer, ConsumerConfig, LagSampler, Positions, RecordSink, Seen, StartAt, StartGate, Until,
};
use crate::client::group::{GroupReady, READY_TIMEOUT};
use crate::client::metadata::{self, Cluster};
use crate::client::payload::Stamp;
use crate::client::producer::{AckSink, Producer, ProducerConfig, ProducerStats, warn};
use crate::client::txn::TxnProducer;
use crate::schedule::{Pacer, Rate};
use crate::scrape::Scraper;
use crate::stats::{Clock, Recorder, Summary, progress_line};

/// How long consumers may take to catch up after the producers finish (the default of
/// [`LoadSpec::catch_up_timeout`]).
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// A consume-only run with no record count and no duration stops after this long idle.
const CONSUME_IDLE: Duration = Duration::from_secs(5);
/// Upper bound on any run, whatever the flags say.
pub const RUN_MAX: Duration = Duration::from_secs(24 * 3600);
const POLL: Duration = Duration::from_millis(20);

/// Set by SIGINT/SIGTERM once [`stop_on_signals`] is installed: producers and consumers
/// stop, and `quickstart` ends its sweep so its data dir and broker are cleaned up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether SIGINT or SIGTERM arrived (see [`stop_on_signals`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

extern "C" fn on_signal(_: libc::c_int) {
    // A second signal: the user insists; leave now (a spawned broker still gets its
    // parent-death signal).
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// Makes SIGINT and SIGTERM end the current run cleanly instead of killing the process.
pub fn stop_on_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches an atomic (and _exit), both async-signal-safe.
        unsafe { libc::signal(sig, handler) };
    }
}

/// Everything a run needs to know (the CLI fills it in).
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub bootstrap: String,
    pub topic: String,
    pub partitions: i32,
    pub producers: usize,
    pub consumers: usize,
    pub rate: Rate,
    pub records: Option<u64>,
    pub duration: Option<Duration>,
    pub warmup: Duration,
    pub producer: ProducerConfig,
    pub start: StartAt,
    pub fetch_max_wait_ms: i32,
    pub quiet: bool,
    /// Stamped into every record, so consumers ignore records of other runs.
    pub run_id: u64,
    /// Consume as this consumer group (else partitions are assigned manually).
    pub group: Option<String>,
    /// Consumers together read at most this many records/s (None: unthrottled).
    pub consume_rate: Option<f64>,
    /// Consumers fetch with isolation_level=1 (read_committed).
    pub read_committed: bool,
    /// Prometheus endpoints scraped once a second for follower lag (empty: none).
    pub metrics_urls: Vec<String>,
    /// With producers: how long the consumers may take, once the producers have finished,
    /// to read every acknowledged record; past it they are stopped and the run says how
    /// many they left unread ([`RunResult::consumers_behind`]).
    pub catch_up_timeout: Duration,
}

impl LoadSpec {
    /// A spec with Kafka-like defaults for `topic` at `bootstrap`.
    pub fn new(bootstrap: &str, topic: &str) -> Self {
        Self {
            bootstrap: bootstrap.to_string(),
            topic: topic.to_string(),
            partitions: 1,
            producers: 1,
            consumers: 1,
            rate: Rate::Max,
            records: None,
            duration: Some(Duration::from_secs(10)),
            warmup: Duration::ZERO,
            producer: ProducerConfig {
                topic: topic.to_string(),
                acks: -1,
                batch_size_bytes: 16_384,
                linger_ms: 5,
                max_in_flight: 5,
                retries: 10,
                retry_backoff_ms: 100,
                retry_backoff_max_ms: 1000,
                connections: 1,
                delivery_timeout_ms: 120_000,
                request_timeout_ms: 30_000,
                idempotent: false,
                compression: Compression::None,
                record_size_bytes: 1024,
                keys: None,
                buffer_memory_bytes: 32 << 20,
                transactional_id: None,
                txn_records: 100,
                transaction_timeout_ms: 60_000,
            },
            start: StartAt::Latest,
            fetch_max_wait_ms: 100,
            quiet: false,
            run_id: run_id(),
            group: None,
            consume_rate: None,
            read_committed: false,
            metrics_urls: Vec::new(),
            catch_up_timeout: CATCH_UP_TIMEOUT,
        }
    }
}

/// What a run produced.
pub struct RunResult {
    pub summary: Summary,
    pub publish_us: Histogram<u64>,
    pub e2e_us: Histogram<u64>,
    pub producer: ProducerStats,
    pub consumed: u64,
    /// The topic's partitions as the run found them (whatever `--partitions` said).
    pub partitions: usize,
    /// With producers and consumers: why the consumers stopped before reading every
    /// record the producers had acknowledged, and how many they left unread (`None`: they
    /// read them all, or the run was interrupted). The consumed counts and the e2e
    /// latencies leave those records out.
    pub consumers_behind: Option<String>,
}

/// Counts our records as consumers see them, and passes them on.
struct Counting {
    inner: Arc<dyn RecordSink>,
    ours: AtomicU64,
    all: AtomicU64,
    last_ns: AtomicU64,
}

impl RecordSink for Counting {
    fn consumed(&self, partition: i32, offset: i64, stamp: Option<Stamp>, now_ns: u64) {
        self.all.fetch_add(1, Ordering::Relaxed);
        if stamp.is_some() {
            self.ours.fetch_add(1, Ordering::Relaxed);
        }
        self.last_ns.store(now_ns, Ordering::Relaxed);
        self.inner.consumed(partition, offset, stamp, now_ns);
    }

    /// A batch at once: each counter moved once, not once per record (the consumer
    /// threads share them).
    fn consumed_all(&self, partition: i32, records: &[Seen], now_ns: u64) {
        let ours = records.iter().filter(|r| r.stamp.is_some()).count() as u64;
        self.all.fetch_add(records.len() as u64, Ordering::Relaxed);
        self.ours.fetch_add(ours, Ordering::Relaxed);
        self.last_ns.store(now_ns, Ordering::Relaxed);
        self.inner.consumed_all(partition, records, now_ns);
    }
}

/// A random-enough id for this process's records (no extra dependency needed).
pub fn run_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15
}

/// Connects to the bootstrap broker and makes sure the topic exists.
pub fn prepare_topic(spec: &LoadSpec) -> Result<Cluster> {
    let mut c =
        Conn::connect(&spec.bootstrap).with_context(|| format!("bootstrap {}", spec.bootstrap))?;
    metadata::ensure_topic(&mut c, &spec.topic, spec.partitions)
}

/// A producer built, connected and initialised, not yet pacing.
enum Ready {
    Plain(Producer),
    Txn(TxnProducer),
}

/// The consumer threads of a run, the gate they wait at until it starts, and word from
/// each as it ends.
struct Consumers {
    handles: Vec<JoinHandle<u64>>,
    gate: Arc<StartGate>,
    done: mpsc::Receiver<()>,
}

impl Consumers {
    fn none() -> Self {
        Self {
            handles: Vec::new(),
            gate: Arc::default(),
            done: mpsc::channel().1,
        }
    }

    /// Whether every consumer thread has ended (none will read anything more).
    fn all_ended(&self) -> bool {
        self.handles.iter().all(JoinHandle::is_finished)
    }

    /// Waits until every consumer has ended or `deadline` passes (then stops them).
    fn stop_at(&self, deadline: Instant, stop: &AtomicBool) {
        for _ in 0..self.handles.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
    }

    fn join(self) -> Result<u64> {
        let mut consumed = 0;
        for h in self.handles {
            consumed += h.join().map_err(|_| anyhow!("consumer thread panicked"))?;
        }
        Ok(consumed)
    }
}

/// Runs producers (if `produce`) and consumers (if `consume`) per `spec`.
///
/// The run's clock starts once everything is ready: consumers at their start offsets
/// (and, with `--group`, every one holding its assignment), producers connected (and
/// their producer ids or transactional ids initialised). Setup is neither in a record's
/// latency nor in the measured window.
pub fn run(
    spec: &LoadSpec,
    produce: bool,
    consume: bool,
    ack_sink: Arc<dyn AckSink>,
    record_sink: Arc<dyn RecordSink>,
) -> Result<RunResult> {
    let cluster = prepare_topic(spec)?;
    let clock = Clock::start();
    // Nothing is measured until the start below.
    let recorder = Arc::new(Recorder::unstarted());
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let stop_all = Arc::new(AtomicBool::new(false));
    let positions = Positions::new(cluster.partitions());
    let rid = spec.run_id;
    let counting = Arc::new(Counting {
        inner: record_sink,
        ours: AtomicU64::new(0),
        all: AtomicU64::new(0),
        last_ns: AtomicU64::new(0),
    });
    let group = spec.group.as_ref().filter(|_| consume).map(|g| {
        let members = consumer_threads(spec, &cluster);
        Arc::new(GroupReady::new(g, members, cluster.partitions()))
    });
    let consumers = if consume {
        let cs = (&positions, &recorder, &counting, &stop_consumers);
        start_consumers(spec, &cluster, cs, clock, rid, produce, group.as_ref())?
    } else {
        Consumers::none()
    };
    let producers = match get_ready(spec, produce, &cluster, clock, &recorder, &ack_sink, group) {
        Ok(p) => p,
        Err(e) => {
            // Consumers already running (joining, fetching) are told to stop.
            stop_consumers.store(true, Ordering::Relaxed);
            return Err(e);
        }
    };
    let start_ns = clock.now_ns();
    let warmup_end_ns = start_ns + spec.warmup.as_nanos() as u64;
    recorder.start(start_ns, warmup_end_ns);
    consumers.gate.open(clock.instant_at(start_ns));
    let scraper = Scraper::start(
        &spec.metrics_urls,
        &spec.topic,
        clock.instant_at(start_ns),
        spec.warmup,
    );
    let progress = start_progress(
        spec, &cluster, &positions, clock, &recorder, &stop_all, consume,
    );
    let mut pstats = ProducerStats::default();
    let mut caught_up = CatchUp::Read;
    if produce {
        let produced = spawn_producers(producers, spec, start_ns).and_then(join_producers);
        pstats = match produced {
            Ok(s) => s,
            Err(e) => {
                // Let the other threads wind down before reporting the failure.
                stop_consumers.store(true, Ordering::Relaxed);
                stop_all.store(true, Ordering::Relaxed);
                if let Some(s) = scraper {
                    s.finish();
                }
                return Err(e);
            }
        };
        if consume {
            // The lag as the producers finished: a run shorter than the progress thread's
            // first second has a sample too.
            final_lag_sample(spec, &cluster, &positions, clock, &recorder);
            if !interrupted() {
                caught_up = wait_caught_up(&counting, pstats.acked, &consumers, spec);
            }
            stop_consumers.store(true, Ordering::Relaxed);
        }
    } else if let Some(d) = spec.duration {
        // Consume-only for a duration: exactly that long from the start (the consumers'
        // own deadline, counted from the same start, is only a backstop).
        consumers.stop_at(clock.instant_at(warmup_end_ns) + d, &stop_consumers);
    }
    let consumed = consumers.join()?;
    if consume && !produce {
        final_lag_sample(spec, &cluster, &positions, clock, &recorder);
    }
    let end_ns = if produce {
        produce_end_ns(&recorder, &pstats)
    } else {
        counting
            .last_ns
            .load(Ordering::Relaxed)
            .max(warmup_end_ns + 1)
    };
    let read = counting.ours.load(Ordering::Relaxed);
    let consumers_behind = (produce && consume && !interrupted())
        .then(|| caught_up.shortfall(read, pstats.acked, spec.catch_up_timeout))
        .flatten();
    stop_all.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let mut summary = recorder.summary(end_ns);
    summary.failed_records = pstats.failed;
    if let Some(s) = scraper {
        summary.set_follower_lag(s.finish());
    }
    Ok(RunResult {
        summary,
        publish_us: recorder.publish_histogram(),
        e2e_us: recorder.e2e_histogram(),
        producer: pstats,
        consumed,
        partitions: cluster.partitions(),
        consumers_behind,
    })
}

/// Where the measured window of a run with producers ends: the later of the schedule's
/// end and the last ack. What the producers did after both (waiting for batches they then
/// gave up on at the delivery timeout) is not in the window, and acks that stopped early
/// (a broker gone) do not shorten it below the schedule.
fn produce_end_ns(recorder: &Recorder, pstats: &ProducerStats) -> u64 {
    recorder
        .last_ack_ns()
        .unwrap_or(0)
        .max(pstats.schedule_end_ns)
}

/// Waits for every producer; sums what they did.
fn join_producers(handles: Vec<JoinHandle<Result<ProducerStats>>>) -> Result<ProducerStats> {
    let mut total = ProducerStats::default();
    for h in handles {
        let s = h
            .join()
            .map_err(|_| anyhow!("producer thread panicked"))??;
        total.generated += s.generated;
        total.acked += s.acked;
        total.failed += s.failed;
        total.reconnects += s.reconnects;
        total.schedule_end_ns = total.schedule_end_ns.max(s.schedule_end_ns);
    }
    Ok(total)
}

/// How the wait for the consumers to read every acknowledged record ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CatchUp {
    /// They read them all.
    Read,
    /// Every consumer thread had ended first.
    Ended,
    /// The catch-up timeout passed first.
    TimedOut,
}

impl CatchUp {
    /// Why the consumers left records unread, if they did: `read` of this run's records
    /// read (duplicates included) against `acked` acknowledged.
    fn shortfall(self, read: u64, acked: u64, timeout: Duration) -> Option<String> {
        if read >= acked {
            return None;
        }
        let unread = acked - read;
        let why = match self {
            CatchUp::Ended => "the consumers ended".to_string(),
            CatchUp::Read | CatchUp::TimedOut => format!(
                "the consumers were stopped {:.0} s after the producers finished",
                timeout.as_secs_f64()
            ),
        };
        Some(format!(
            "{why} with {unread} of the {acked} acknowledged records unread \
             (consumed counts and e2e latency leave them out)"
        ))
    }
}

/// Waits (bounded by the spec's catch-up timeout) until the consumers have read `acked`
/// records of this run, or every consumer has ended. Polls: nothing announces a count.
fn wait_caught_up(
    counting: &Counting,
    acked: u64,
    consumers: &Consumers,
    spec: &LoadSpec,
) -> CatchUp {
    let deadline = Instant::now() + spec.catch_up_timeout;
    loop {
        if counting.ours.load(Ordering::Relaxed) >= acked {
            return CatchUp::Read;
        }
        if consumers.all_ended() {
            return CatchUp::Ended;
        }
        if Instant::now() >= deadline {
            return CatchUp::TimedOut;
        }
        std::thread::sleep(POLL);
    }
}

/// One more lag sample, at the end of producing (or of a consume-only run), recorded as
/// the progress thread's are: every run that consumed has at least one, however short.
fn final_lag_sample(
    spec: &LoadSpec,
    cluster: &Cluster,
    positions: &Positions,
    clock: Clock,
    recorder: &Recorder,
) {
    let mut sampler = LagSampler::new(cluster.clone(), &spec.topic);
    let sampled = sampler.sample(positions);
    let now = clock.now_ns();
    match sampled {
        Ok(lag) => recorder.record_lag(lag, now),
        Err(e) => {
            recorder.record_lag_unknown(now);
            warn(&format!("final lag sample failed: {e:#}"));
        }
    }
}

/// What must be ready before the run's clock starts: the producers (if `produce`), and
/// every consumer of the group (if any) holding its assignment, waited for (bounded).
fn get_ready(
    spec: &LoadSpec,
    produce: bool,
    cluster: &Cluster,
    clock: Clock,
    recorder: &Arc<Recorder>,
    sink: &Arc<dyn AckSink>,
    group: Option<Arc<GroupReady>>,
) -> Result<Vec<Ready>> {
    let producers = if produce {
        build_producers(spec, cluster, clock, recorder, sink)?
    } else {
        Vec::new()
    };
    if let Some(g) = group {
        // An error drops the producers built: they close their connections.
        g.wait(READY_TIMEOUT, interrupted)?;
    }
    Ok(producers)
}

/// Builds every producer and readies it: connections open, producer ids (idempotent) or
/// transactional ids initialised, before the schedule's clock starts. On an error the
/// producers already built are dropped, closing their connections.
fn build_producers(
    spec: &LoadSpec,
    cluster: &Cluster,
    clock: Clock,
    recorder: &Arc<Recorder>,
    sink: &Arc<dyn AckSink>,
) -> Result<Vec<Ready>> {
    let (n, rid) = (spec.producers.max(1) as u64, spec.run_id);
    let mut ready = Vec::new();
    for i in 0..n {
        let (cfg, c, r, s) = (
            spec.producer.clone(),
            cluster.clone(),
            recorder.clone(),
            sink.clone(),
        );
        if spec.producer.transactional_id.is_some() {
            let mut p = TxnProducer::new(cfg, c, clock, r, s, rid, i)?;
            p.prepare();
            ready.push(Ready::Txn(p));
        } else {
            let mut p = Producer::new(cfg, c, clock, r, s, rid, i)?;
            p.connect();
            ready.push(Ready::Plain(p));
        }
    }
    Ok(ready)
}

/// Starts each producer's schedule at `start_ns`, on its own thread.
fn spawn_producers(
    producers: Vec<Ready>,
    spec: &LoadSpec,
    start_ns: u64,
) -> Result<Vec<JoinHandle<Result<ProducerStats>>>> {
    let n = producers.len().max(1) as u64;
    let end_ns = spec
        .duration
        .map(|d| start_ns + (spec.warmup + d).as_nanos() as u64);
    let mut handles = Vec::new();
    for (i, p) in (0u64..).zip(producers) {
        let rate = match spec.rate {
            Rate::Max => Rate::Max,
            Rate::PerSec(r) => Rate::PerSec(r / n as f64),
        };
        let records = spec.records.map(|r| r / n + u64::from(i < r % n));
        // Producers start staggered by a fraction of one interval so they don't burst together.
        let offset_ns = match spec.rate {
            Rate::PerSec(r) => (i as f64 * 1e9 / r) as u64,
            Rate::Max => 0,
        };
        let pacer = Pacer::new(start_ns + offset_ns, rate, records, end_ns);
        let builder = std::thread::Builder::new().name(format!("producer-{i}"));
        let h = match p {
            Ready::Txn(p) => builder.spawn(move || p.run(pacer, &INTERRUPTED))?,
            Ready::Plain(p) => builder.spawn(move || p.run(pacer, &INTERRUPTED))?,
        };
        handles.push(h);
    }
    Ok(handles)
}

/// When the consumers of a run stop: their time counts from the run's start (the gate
/// opening), so setup (producers connecting, a group joining) takes none of it. Until the
/// start they wait at the gate, which the run opens or stops them at on every path; the
/// deadline there only bounds a run that did neither.
fn consumer_until(spec: &LoadSpec, with_producers: bool) -> Until {
    // Consume-only for a duration: `run` stops them at exactly its end; this is the
    // backstop. With producers, `run` stops them once they have caught up (bounded by the
    // catch-up timeout after the producers finish), and a backstop of their own could
    // only cut a catch-up short.
    let run_for = match (with_producers, spec.duration) {
        (false, Some(d)) => spec.warmup + d,
        _ => RUN_MAX,
    };
    let unbounded = !with_producers && spec.records.is_none() && spec.duration.is_none();
    Until {
        records: if with_producers { None } else { spec.records },
        consumed: Arc::new(AtomicU64::new(0)),
        deadline: Instant::now() + RUN_MAX,
        run_for: Some(run_for),
        idle: unbounded.then_some(CONSUME_IDLE),
        reach: BTreeMap::new(),
    }
}

/// The partitions of the `i`-th of `n` manually assigned consumers (none in group mode:
/// the group assigns them).
fn manual_partitions(spec: &LoadSpec, cluster: &Cluster, i: usize, n: usize) -> Vec<i32> {
    if spec.group.is_some() {
        return Vec::new();
    }
    (0..cluster.partitions())
        .filter(|p| p % n == i)
        .map(|p| p as i32)
        .collect()
}

/// Consumer threads of a run: one per `--consumers`, but no more than partitions when
/// assigned manually (a group gives a member without a partition an empty share).
fn consumer_threads(spec: &LoadSpec, cluster: &Cluster) -> usize {
    if spec.group.is_some() {
        spec.consumers.max(1)
    } else {
        spec.consumers.max(1).min(cluster.partitions())
    }
}

/// What the consumer threads share with the run: positions, the recorder, the counting
/// sink and their stop flag.
type Shared<'a> = (
    &'a Arc<Positions>,
    &'a Arc<Recorder>,
    &'a Arc<Counting>,
    &'a Arc<AtomicBool>,
);

/// Starts the consumer threads, waiting at their start gate. On an error the ones already
/// started are stopped.
fn start_consumers(
    spec: &LoadSpec,
    cluster: &Cluster,
    shared: Shared<'_>,
    clock: Clock,
    rid: u64,
    with_producers: bool,
    group: Option<&Arc<GroupReady>>,
) -> Result<Consumers> {
    let started = spawn_consumers(spec, cluster, shared, clock, rid, with_producers, group);
    if started.is_err() {
        shared.3.store(true, Ordering::Relaxed);
    }
    started
}

fn spawn_consumers(
    spec: &LoadSpec,
    cluster: &Cluster,
    (positions, recorder, sink, stop): Shared<'_>,
    clock: Clock,
    rid: u64,
    with_producers: bool,
    group: Option<&Arc<GroupReady>>,
) -> Result<Consumers> {
    let threads = consumer_threads(spec, cluster);
    let cfg = ConsumerConfig {
        topic: spec.topic.clone(),
        start: spec.start,
        max_wait_ms: spec.fetch_max_wait_ms,
        fetch_max_bytes: 64 << 20,
        partition_max_bytes: 8 << 20,
        group: spec.group.clone(),
        max_records_per_sec: spec.consume_rate.map(|r| r / threads as f64),
        read_committed: spec.read_committed,
        reset_out_of_range: true,
    };
    let consumer = |parts: Vec<i32>, s: Arc<dyn RecordSink>| {
        let (c, p, r) = (cluster.clone(), positions.clone(), recorder.clone());
        Consumer::new(cfg.clone(), c, parts, p, clock, r, s, rid)
    };
    if spec.group.is_some() {
        // Every partition starts where the run begins (unless the group committed an
        // offset); members then take whatever the group assigns them.
        let all = (0..cluster.partitions() as i32).collect();
        consumer(all, Arc::new(crate::client::consumer::NoRecordSink)).seek_start()?;
    }
    let n = threads;
    let until = consumer_until(spec, with_producers);
    let (done_tx, done) = mpsc::channel();
    let gate: Arc<StartGate> = Arc::default();
    let mut handles = Vec::new();
    for i in 0..n {
        let mut c = consumer(manual_partitions(spec, cluster, i, n), sink.clone());
        // Positions are set before any producer starts, so "latest" misses nothing.
        if spec.group.is_none() {
            c.seek_start()?;
        }
        if let Some(g) = group {
            c.report_to(g.clone(), i);
        }
        c.wait_for(gate.clone());
        let (stop, until, done_tx) = (stop.clone(), until.clone(), done_tx.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("consumer-{i}"))
                .spawn(move || {
                    let consumed = c.run(until, &stop);
                    let _ = done_tx.send(());
                    consumed
                })?,
        );
    }
    Ok(Consumers {
        handles,
        gate,
        done,
    })
}

/// The progress thread: closes each second, samples lag, prints the line.
fn start_progress(
    spec: &LoadSpec,
    cluster: &Cluster,
    positions: &Arc<Positions>,
    clock: Clock,
    recorder: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
    sample: bool,
) -> Option<JoinHandle<()>> {
    let (cluster, positions, recorder, stop) = (
        cluster.clone(),
        positions.clone(),
        recorder.clone(),
        stop.clone(),
    );
    let mut sampler = LagSampler::new(cluster, &spec.topic);
    let quiet = spec.quiet;
    std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || {
            let mut next = clock.now_ns() + 1_000_000_000;
            let max_ticks = RUN_MAX.as_secs();
            for _ in 0..max_ticks {
                while clock.now_ns() < next {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(POLL);
                }
                next += 1_000_000_000;
                let now = clock.now_ns();
                if sample {
                    match sampler.sample(&positions) {
                        Ok(lag) => recorder.record_lag(lag, now),
                        Err(e) => {
                            // Unknown, not the last value: the line says so, and the
                            // summary counts the samples that failed.
                            recorder.record_lag_unknown(now);
                            warn(&format!("lag sample failed: {e:#}"));
                        }
                    }
                }
                let sec = recorder.tick(now);
                if !quiet {
                    println!("{}", progress_line(&sec));
                }
            }
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::consumer::NoRecordSink;

    /// The consumers' time counts from the run's start (their gate opening), not from when
    /// they were built: a slow setup takes none of it. Until the start they wait at the
    /// gate, bounded only by the run's limit (the run opens it or stops them).
    #[test]
    fn consumers_count_their_time_from_the_start() {
        let mut spec = LoadSpec::new("127.0.0.1:1", "t");
        spec.duration = Some(Duration::from_secs(3));
        spec.warmup = Duration::from_secs(1);
        let built = Instant::now();
        let u = consumer_until(&spec, false);
        assert_eq!(u.run_for, Some(Duration::from_secs(4)));
        assert!(u.deadline >= built + RUN_MAX, "the wait at the gate");
        let u = consumer_until(&spec, true);
        assert_eq!(
            u.run_for,
            Some(RUN_MAX),
            "with producers the run stops them once caught up"
        );
        spec.duration = None;
        spec.records = Some(10);
        let u = consumer_until(&spec, false);
        assert_eq!((u.run_for, u.records), (Some(RUN_MAX), Some(10)));
    }

    /// Consumers that stopped with acknowledged records unread make the run say so, and
    /// why; having read them all (duplicates included) they do not.
    #[test]
    fn consumers_that_leave_records_unread_are_said_to() {
        let t = Duration::from_secs(30);
        assert_eq!(CatchUp::Read.shortfall(10, 10, t), None);
        assert_eq!(CatchUp::TimedOut.shortfall(12, 10, t), None);
        let why = CatchUp::TimedOut.shortfall(7, 10, t).unwrap_or_default();
        assert!(
            why.contains("3 of the 10 acknowledged records unread"),
            "{why}"
        );
        assert!(
            why.contains("stopped 30 s after the producers finished"),
            "{why}"
        );
        let why = CatchUp::Ended.shortfall(0, 10, t).unwrap_or_default();
        assert!(
            why.contains("the consumers ended with 10 of the 10"),
            "{why}"
        );
    }

    /// A batch counted at once moves the counters as its records one by one would.
    #[test]
    fn a_batch_counts_as_its_records() {
        let stamp = Stamp {
            run_id: 1,
            record_id: 2,
            intended_ns: 3,
        };
        let records = [
            Seen {
                offset: 5,
                stamp: Some(stamp),
                bytes: 10,
            },
            Seen {
                offset: 6,
                stamp: None,
                bytes: 10,
            },
            Seen {
                offset: 7,
                stamp: Some(stamp),
                bytes: 10,
            },
        ];
        let counting = || Counting {
            inner: Arc::new(NoRecordSink),
            ours: AtomicU64::new(0),
            all: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
        };
        let (one, all) = (counting(), counting());
        for r in &records {
            one.consumed(0, r.offset, r.stamp, 99);
        }
        all.consumed_all(0, &records, 99);
        for c in [&one, &all] {
            assert_eq!(c.all.load(Ordering::Relaxed), 3);
            assert_eq!(c.ours.load(Ordering::Relaxed), 2);
            assert_eq!(c.last_ns.load(Ordering::Relaxed), 99);
        }
    }
}
