//! `verify`: did the broker keep what it acknowledged, exactly once, in order?
//!
//! Producers write uniquely numbered records (the id in each record's stamp). Every ack is
//! remembered. After producing (with faults injected by `--fault-cmd` meanwhile), a
//! consumer reads the topic from where it stood at the start, and the two are compared:
//!
//! - lost: acknowledged but never read back (with acks=0, "acknowledged" = written);
//! - duplicated: read back more than once (each extra copy counts);
//! - reordered: within a partition, a record read after a higher-numbered record of the
//!   same producer;
//! - unacknowledged: given up on by the client (may or may not be present).
//!
//! With `--transactional` the producers write in transactions (a record is acknowledged
//! only when its transaction's EndTxn(commit) succeeded) and the read-back is
//! read_committed; one more finding: aborted visible, records of transactions the
//! producer saw aborted that the read_committed consumer nevertheless returned (must be 0).

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::cli::Verify;
use crate::client::consumer::{RecordSink, StartAt};
use crate::client::metadata::Refresher;
use crate::client::payload::{PRODUCER_SHIFT, Stamp};
use crate::client::producer::{AckSink, warn};
use crate::report;
use crate::run;

/// Upper bound on the fault command's own runtime.
const FAULT_CMD_TIMEOUT: Duration = Duration::from_secs(60);
/// Most fault commands one run starts.
const MAX_FAULTS: u64 = 10_000;
/// A read_committed read-back waits for the LSO at most transaction.timeout.ms plus this.
const LSO_WAIT_EXTRA: Duration = Duration::from_secs(30);
const LSO_POLL: Duration = Duration::from_millis(100);
/// How long the read-back waits for every partition to have a leader after the faults.
const LAYOUT_WAIT: Duration = Duration::from_secs(30);

/// One bit per record of one producer, indexed by its sequence number (the low bits of
/// the record id): the ledger of a long run grows by bits per record, not by map entries.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    /// Sets bit `i`, growing to hold it; returns whether it was set already.
    fn set(&mut self, i: u64) -> bool {
        let (word, bit) = ((i / 64) as usize, i % 64);
        if word >= self.0.len() {
            self.0.resize(word + 1, 0);
        }
        let was = self.0[word] & (1 << bit) != 0;
        self.0[word] |= 1 << bit;
        was
    }

    fn get(&self, i: u64) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// How many bits it can hold without growing.
    fn capacity(&self) -> u64 {
        self.0.len() as u64 * 64
    }

    /// The set bits, in order.
    fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            (0..64u64)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| w as u64 * 64 + b)
        })
    }
}

/// What happened to one producer's records.
#[derive(Default)]
struct ProducerLedger {
    acked: Bits,
    failed: Bits,
    /// Records of aborted transactions (also in `failed`).
    aborted: Bits,
    /// Read back at least once.
    seen: Bits,
}

impl ProducerLedger {
    /// The sequence numbers the producer side recorded anything about.
    fn capacity(&self) -> u64 {
        self.acked
            .capacity()
            .max(self.failed.capacity())
            .max(self.aborted.capacity())
    }
}

/// Per partition, what the read-back saw, analysed as the records arrive (in order).
#[derive(Default)]
struct PartitionReads {
    findings: PartitionFindings,
    /// Highest record id read so far, per producer (for reordering).
    max_by_producer: HashMap<u64, u64>,
}

#[derive(Default)]
struct Ledger {
    /// By producer index (the high bits of a record id).
    producers: BTreeMap<u64, ProducerLedger>,
    /// Records read back with ids the producer side never recorded (none acknowledged),
    /// and how often each was read; bounded by what the topic holds past the ledger.
    stray: HashMap<u64, u64>,
    read: BTreeMap<i32, PartitionReads>,
    /// Per partition, the offset after the last record acknowledged with an offset: the
    /// read-back reads at least this far.
    acked_end: BTreeMap<i32, i64>,
}

/// A record id's producer and sequence number.
fn split_id(id: u64) -> (u64, u64) {
    (id >> PRODUCER_SHIFT, id & ((1 << PRODUCER_SHIFT) - 1))
}

impl Ledger {
    fn producer(&mut self, id: u64) -> (&mut ProducerLedger, u64) {
        let (producer, seq) = split_id(id);
        (self.producers.entry(producer).or_default(), seq)
    }

    /// Whether `id` is read for the first time (also remembers that it was read).
    fn first_read(&mut self, id: u64) -> bool {
        let (producer, seq) = split_id(id);
        match self.producers.get_mut(&producer) {
            Some(l) if seq < l.capacity() => !l.seen.set(seq),
            _ => {
                let n = self.stray.entry(id).or_insert(0);
                *n += 1;
                *n == 1
            }
        }
    }

    /// Heap bytes held for the records (bitmaps and strays), for the bound's test.
    #[cfg(test)]
    fn record_bytes(&self) -> usize {
        let bits = |b: &Bits| b.0.capacity() * 8;
        let producers: usize = self
            .producers
            .values()
            .map(|l| bits(&l.acked) + bits(&l.failed) + bits(&l.aborted) + bits(&l.seen))
            .sum();
        producers + self.stray.capacity() * 24
    }
}

/// Records acks (producer side) and reads (consumer side).
#[derive(Default)]
pub struct Recorder(Mutex<Ledger>);

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AckSink for Recorder {
    fn acked(&self, partition: i32, base: Option<i64>, ids: &[u64]) {
        let mut g = self.lock();
        for &id in ids {
            let (l, seq) = g.producer(id);
            l.acked.set(seq);
        }
        if let Some(base) = base.filter(|&b| b >= 0) {
            let end = base.saturating_add(ids.len() as i64);
            let e = g.acked_end.entry(partition).or_insert(end);
            *e = (*e).max(end);
        }
    }
    fn failed(&self, _partition: i32, ids: &[u64]) {
        let mut g = self.lock();
        for &id in ids {
            let (l, seq) = g.producer(id);
            l.failed.set(seq);
        }
    }
    fn aborted(&self, _partition: i32, ids: &[u64]) {
        let mut g = self.lock();
        for &id in ids {
            let (l, seq) = g.producer(id);
            l.failed.set(seq);
            l.aborted.set(seq);
        }
    }
}

impl RecordSink for Recorder {
    fn consumed(&self, partition: i32, _offset: i64, stamp: Option<Stamp>, _now_ns: u64) {
        let Some(s) = stamp else { return };
        let id = s.record_id;
        let mut g = self.lock();
        let first = g.first_read(id);
        let pr = g.read.entry(partition).or_default();
        pr.findings.read += 1;
        if !first {
            pr.findings.duplicated += 1;
            return;
        }
        let m = pr.max_by_producer.entry(split_id(id).0).or_insert(id);
        if id < *m {
            pr.findings.reordered += 1;
        }
        *m = (*m).max(id);
    }
}

/// Per-partition findings.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct PartitionFindings {
    pub read: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

/// The verdict (`--json` writes this).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Findings {
    pub acks: String,
    pub idempotent: bool,
    /// Transactions, read back read_committed.
    #[serde(default)]
    pub transactional: bool,
    pub sent: u64,
    pub acknowledged: u64,
    pub unacknowledged: u64,
    pub read_unique: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Records of transactions the producer saw aborted.
    #[serde(default)]
    pub aborted: u64,
    /// Of those, read back (by a read_committed consumer: must be 0).
    #[serde(default)]
    pub aborted_visible: u64,
    pub faults_injected: u64,
    /// Fault commands that exited non-zero, could not start, or timed out (not injected).
    #[serde(default)]
    pub faults_failed: u64,
    /// Errors of the read-back consumer, by name (a fetch that failed may hide records).
    #[serde(default)]
    pub read_back_errors: BTreeMap<String, u64>,
    /// Partitions the read-back stopped reading at OFFSET_OUT_OF_RANGE (their records
    /// past that point were not checked: the log was truncated or deleted under them).
    #[serde(default)]
    pub out_of_range_partitions: Vec<i32>,
    pub partitions: BTreeMap<i32, PartitionFindings>,
    /// Up to 20 lost record ids, for a first look.
    pub lost_examples: Vec<u64>,
}

impl Findings {
    /// Why `--strict` fails this run, one line each (empty: it passes).
    pub fn strict_failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        // Nothing acknowledged is nothing checked: a run of rejected writes is no pass.
        if self.acknowledged == 0 {
            why.push("nothing verified: no record was acknowledged".to_string());
        }
        if self.lost > 0 {
            why.push(format!("{} acknowledged records lost", self.lost));
        }
        if self.duplicated > 0 {
            why.push(format!("{} records duplicated", self.duplicated));
        }
        if self.aborted_visible > 0 {
            why.push(format!(
                "{} records of aborted transactions read back",
                self.aborted_visible
            ));
        }
        // Kafka's idempotent producer keeps each partition's records in order.
        if self.reordered > 0 && (self.idempotent || self.transactional) {
            why.push(format!(
                "{} records reordered by an idempotent producer",
                self.reordered
            ));
        }
        if self.faults_failed > 0 {
            why.push(format!("{} fault commands failed", self.faults_failed));
        }
        if !self.out_of_range_partitions.is_empty() {
            why.push(format!(
                "partitions {:?} out of range during the read-back",
                self.out_of_range_partitions
            ));
        }
        why
    }
}

/// Compares what was acknowledged with what was read.
fn analyse(ledger: &Ledger) -> Findings {
    let mut f = Findings::default();
    for (&p, pr) in &ledger.read {
        f.duplicated += pr.findings.duplicated;
        f.reordered += pr.findings.reordered;
        f.partitions.insert(p, pr.findings.clone());
    }
    f.read_unique = ledger.stray.len() as u64;
    let mut lost_examples = Vec::new();
    // Producers in order, sequence numbers in order: the lost ids come out sorted.
    for (&producer, l) in &ledger.producers {
        let id = |seq: u64| (producer << PRODUCER_SHIFT) | seq;
        f.read_unique += l.seen.ones().count() as u64;
        f.acknowledged += l.acked.ones().count() as u64;
        f.unacknowledged += l.failed.ones().filter(|&s| !l.acked.get(s)).count() as u64;
        for seq in l.acked.ones().filter(|&s| !l.seen.get(s)) {
            f.lost += 1;
            if lost_examples.len() < 20 {
                lost_examples.push(id(seq));
            }
        }
        f.aborted += l.aborted.ones().count() as u64;
        f.aborted_visible += l.aborted.ones().filter(|&s| l.seen.get(s)).count() as u64;
    }
    f.lost_examples = lost_examples;
    f
}

/// How many fault commands ran to success, and how many failed (non-zero exit, could
/// not start, timed out): a failed command injected no fault the run can claim.
#[derive(Default)]
struct FaultCounts {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// Runs the fault command every `every` until `stop`, each bounded by `timeout`.
fn fault_thread(
    cmd: String,
    every: Duration,
    timeout: Duration,
    stop: Arc<AtomicBool>,
    counts: Arc<FaultCounts>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut next = Instant::now() + every;
        // Bounded: one fault per interval, at most MAX_FAULTS in all.
        for _ in 0..MAX_FAULTS {
            while Instant::now() < next {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let started = Instant::now();
            let ok = run_fault(&cmd, timeout);
            eprintln!("weir-loadgen: fault command took {:?}", started.elapsed());
            let n = if ok { &counts.ok } else { &counts.failed };
            n.fetch_add(1, Ordering::Relaxed);
            next = Instant::now() + every;
        }
    })
}

/// Runs `cmd` with `sh -c` in a process group of its own; true if it exited 0 within
/// `timeout`. At the timeout the whole group is killed (not only `sh`: what it started
/// would live on).
fn run_fault(cmd: &str, timeout: Duration) -> bool {
    use std::os::unix::process::CommandExt;
    eprintln!("weir-loadgen: fault: {cmd}");
    let child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            warn(&format!("could not start the fault command: {e}"));
            return false;
        }
    };
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if !st.success() => {
                warn(&format!("fault command exited with {st}"));
                return false;
            }
            Ok(Some(_)) => return true,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                // The group's id is the child's pid (process_group(0)).
                if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
                    // SAFETY: kill(2) has no memory preconditions; the group is the one
                    // this child leads, not yet reaped, so its id cannot have been reused.
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                }
                let _ = child.kill();
                let _ = child.wait();
                warn(&format!(
                    "fault command timed out after {timeout:?}; killed"
                ));
                return false;
            }
        }
    }
}

/// Produce phase with faults, then a full read-back, then the comparison.
pub fn verify(v: &Verify) -> Result<Findings> {
    // Checked before the broker is touched.
    match (&v.fault_cmd, v.fault_every) {
        (Some(_), None) => bail!("--fault-cmd needs --fault-every"),
        (None, Some(_)) => bail!("--fault-every needs --fault-cmd"),
        _ => {}
    }
    let mut load = v.load.clone();
    if v.transactional && load.transactional_id.is_none() {
        load.transactional_id = Some(format!("weir-loadgen-verify-{:x}", run::run_id()));
    }
    // Transactional records are read back as Kafka's exactly-once consumers read them.
    load.read_committed |= load.transactional_id.is_some();
    let mut spec = load.spec(StartAt::Latest)?;
    let ledger = Arc::new(Recorder::default());
    // Positions at the start: the read-back covers exactly this run's range.
    let cluster = run::prepare_topic(&spec)?;
    let starts = start_offsets(&spec.topic, &cluster, LAYOUT_WAIT)?;
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(FaultCounts::default());
    let faults = match (&v.fault_cmd, v.fault_every) {
        (Some(c), Some(e)) => Some(fault_thread(
            c.clone(),
            e,
            FAULT_CMD_TIMEOUT,
            stop.clone(),
            counts.clone(),
        )),
        _ => None,
    };
    let produced = run::run(
        &spec,
        true,
        false,
        ledger.clone(),
        Arc::new(crate::client::consumer::NoRecordSink),
    );
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = faults
        && h.join().is_err()
    {
        warn("the fault thread panicked");
    }
    let produced = produced?;
    // Read back everything from the recorded start offsets, until idle.
    spec.start = StartAt::Earliest;
    spec.records = None;
    spec.duration = None;
    spec.quiet = true;
    // Leaders may have moved during the faults: the read-back asks where they are now.
    let mut cluster = current_layout(&spec.topic, &cluster)?;
    if spec.read_committed {
        let bound = Duration::from_millis(spec.producer.transaction_timeout_ms.max(0) as u64)
            + LSO_WAIT_EXTRA;
        wait_stable(&spec.topic, &mut cluster, bound)?;
    }
    let reach = ledger.lock().acked_end.clone();
    let read = read_back(&spec, &cluster, &starts, &reach, ledger.clone());
    let mut f = analyse(&ledger.lock());
    f.read_back_errors = read.errors;
    f.out_of_range_partitions = read.out_of_range;
    f.sent = produced.producer.generated;
    f.acks = v.load.acks.clone();
    f.idempotent = v.load.idempotent || spec.producer.transactional_id.is_some();
    f.transactional = spec.producer.transactional_id.is_some();
    f.faults_injected = counts.ok.load(Ordering::Relaxed);
    f.faults_failed = counts.failed.load(Ordering::Relaxed);
    println!("{}", findings_text(&f, read.records));
    if let Some(p) = &v.load.json {
        report::write_json(p, &f)?;
    }
    Ok(f)
}

/// The topic's layout now, asked of the brokers `old` names (waiting, bounded, for
/// partitions without a leader to get one).
fn current_layout(
    topic: &str,
    old: &crate::client::metadata::Cluster,
) -> Result<crate::client::metadata::Cluster> {
    let mut refresher = Refresher::default();
    let mut cluster = old.clone();
    let deadline = Instant::now() + LAYOUT_WAIT;
    let mut last = anyhow::anyhow!("no answer within {LAYOUT_WAIT:?}");
    // Bounded by the deadline; the refresher backs off between attempts.
    while Instant::now() < deadline {
        refresher.want();
        match refresher.refresh_if_due(&mut cluster, topic) {
            Ok(true) => return Ok(cluster),
            Ok(false) => std::thread::sleep(refresher.wait().min(LSO_POLL)),
            Err(e) => last = e,
        }
    }
    Err(last.context(format!("the layout of topic {topic} after the faults")))
}

/// Each partition's log end now (where this run's records will start), asked of its
/// leader. A partition that gets no offset (a refusal, a moved leader, a lost connection)
/// is asked again, after a metadata refresh with backoff, until every partition has one
/// or `wait` has passed: a partition left out would never be read back, and all its
/// records would be reported lost.
pub fn start_offsets(
    topic: &str,
    cluster: &crate::client::metadata::Cluster,
    wait: Duration,
) -> Result<BTreeMap<i32, i64>> {
    let mut cluster = cluster.clone();
    let mut refresher = Refresher::default();
    let mut out = BTreeMap::new();
    let mut last = anyhow::anyhow!("no answer");
    let deadline = Instant::now() + wait;
    // Bounded by the deadline; each round sleeps at least LSO_POLL.
    loop {
        if let Err(e) = refresher.refresh_if_due(&mut cluster, topic) {
            last = e;
        }
        for p in 0..cluster.partitions() {
            let part = p as i32;
            if out.contains_key(&part) {
                continue;
            }
            match start_offset(topic, &cluster, part) {
                Ok(o) => {
                    out.insert(part, o);
                }
                Err(e) => {
                    last = e;
                    refresher.want();
                }
            }
        }
        if out.len() == cluster.partitions() {
            return Ok(out);
        }
        if Instant::now() >= deadline {
            return Err(last.context(format!(
                "the start offsets of topic {topic}: {} of {} partitions answered within {wait:?}",
                out.len(),
                cluster.partitions()
            )));
        }
        std::thread::sleep(refresher.wait().max(LSO_POLL));
    }
}

/// One partition's log end, asked of its leader.
fn start_offset(topic: &str, cluster: &crate::client::metadata::Cluster, p: i32) -> Result<i64> {
    use crate::client::metadata::{LATEST, list_offsets_answers};
    let addr = cluster.leader_addr(p as usize)?;
    let mut c = crate::client::conn::Conn::connect(addr)?;
    match list_offsets_answers(&mut c, topic, &[p], LATEST, 0)?.get(&p) {
        Some(Ok(o)) => Ok(*o),
        Some(Err(code)) => bail!(
            "partition {p}: ListOffsets answered {}",
            crate::client::error_name(*code)
        ),
        None => bail!("partition {p}: left out of the ListOffsets answer"),
    }
}

/// Waits (up to `bound`) until every partition's last stable offset has reached its high
/// watermark: the last transactions' markers are written after EndTxn answers, and a
/// read_committed read-back that starts earlier could go idle below the LSO.
fn wait_stable(
    topic: &str,
    cluster: &mut crate::client::metadata::Cluster,
    bound: Duration,
) -> Result<()> {
    use crate::client::metadata::{LATEST, list_offsets_isolated};
    let deadline = Instant::now() + bound;
    let mut conns: BTreeMap<usize, crate::client::conn::Conn> = BTreeMap::new();
    let mut refresher = Refresher::default();
    // Bounded by the deadline; one round of ListOffsets per poll.
    while Instant::now() < deadline {
        // A partition that failed may have a new leader: ask (with backoff).
        if let Ok(true) = refresher.refresh_if_due(cluster, topic) {
            conns.clear();
        }
        let mut stable = true;
        for p in 0..cluster.partitions() {
            let part = [p as i32];
            let offsets = (|| {
                if let std::collections::btree_map::Entry::Vacant(e) = conns.entry(p) {
                    e.insert(crate::client::conn::Conn::connect(cluster.leader_addr(p)?)?);
                }
                let c = conns
                    .get_mut(&p)
                    .ok_or_else(|| anyhow::anyhow!("connection vanished"))?;
                let hw = list_offsets_isolated(c, topic, &part, LATEST, 0)?;
                let lso = list_offsets_isolated(c, topic, &part, LATEST, 1)?;
                Ok::<_, anyhow::Error>((hw.get(&part[0]).copied(), lso.get(&part[0]).copied()))
            })();
            match offsets {
                Ok((Some(hw), Some(lso))) if lso >= hw => {}
                Ok((Some(_), Some(_))) => stable = false,
                // Refused (a moved leader, say) or a lost connection.
                Ok(_) | Err(_) => {
                    conns.remove(&p);
                    refresher.want();
                    stable = false;
                }
            }
        }
        if stable {
            return Ok(());
        }
        std::thread::sleep(LSO_POLL);
    }
    warn(&format!(
        "the last stable offset did not reach the high watermark within {bound:?}; reading back anyway"
    ));
    Ok(())
}

/// What the read-back saw besides the records (which went to the ledger).
pub struct ReadBack {
    pub records: u64,
    /// The consumer's errors, by name.
    pub errors: BTreeMap<String, u64>,
    /// Partitions it stopped reading at OFFSET_OUT_OF_RANGE.
    pub out_of_range: Vec<i32>,
}

/// How long the read-back may take in all.
const READ_BACK_MAX: Duration = Duration::from_secs(600);
/// The read-back ends after this long without a record, once it has passed `reach`.
const READ_BACK_IDLE: Duration = Duration::from_secs(3);

/// Reads the topic from `starts` until every partition's position has passed its offset
/// in `reach` (the end of what was acknowledged) and then no record arrives for a few
/// seconds; at OFFSET_OUT_OF_RANGE it stops reading that partition instead of jumping
/// to the log start (which would hide the gap).
fn read_back(
    spec: &run::LoadSpec,
    cluster: &crate::client::metadata::Cluster,
    starts: &BTreeMap<i32, i64>,
    reach: &BTreeMap<i32, i64>,
    sink: Arc<Recorder>,
) -> ReadBack {
    use crate::client::consumer::{Consumer, ConsumerConfig, Positions, Until};
    let positions = Positions::new(cluster.partitions());
    for (&p, &o) in starts {
        if let Some(a) = positions.0.get(p as usize) {
            a.store(o, Ordering::Relaxed);
        }
    }
    let clock = crate::stats::Clock::start();
    let recorder = Arc::new(crate::stats::Recorder::new(0));
    let cfg = ConsumerConfig {
        topic: spec.topic.clone(),
        start: StartAt::Earliest,
        max_wait_ms: 200,
        fetch_max_bytes: 64 << 20,
        partition_max_bytes: 8 << 20,
        group: None,
        max_records_per_sec: None,
        read_committed: spec.read_committed,
        reset_out_of_range: false,
    };
    let parts = (0..cluster.partitions() as i32).collect();
    let c = Consumer::new(
        cfg,
        cluster.clone(),
        parts,
        positions.clone(),
        clock,
        recorder.clone(),
        sink,
        spec.run_id,
    );
    let until = Until {
        records: None,
        consumed: Arc::default(),
        deadline: Instant::now() + READ_BACK_MAX,
        run_for: None,
        idle: Some(READ_BACK_IDLE),
        reach: reach.clone(),
    };
    let records = c.run(until, &AtomicBool::new(false));
    // A partition that had a start offset and has none now was given up out of range.
    let out_of_range: Vec<i32> = starts
        .keys()
        .copied()
        .filter(|&p| positions.get(p as usize).is_none())
        .collect();
    let behind: Vec<(i32, i64, i64)> = reach
        .iter()
        .filter_map(|(&p, &end)| Some((p, positions.get(p as usize)?, end)))
        .filter(|&(_, pos, end)| pos < end)
        .collect();
    if !behind.is_empty() {
        warn(&format!(
            "the read-back stopped at {READ_BACK_MAX:?} below the acknowledged end of \
             (partition, position, acknowledged end) {behind:?}"
        ));
    }
    ReadBack {
        records,
        errors: recorder.summary(0).errors,
        out_of_range,
    }
}

fn findings_text(f: &Findings, read: u64) -> String {
    let mut t = format!(
        "verify: acks={} idempotent={} transactional={} faults={} faults failed={}\n  sent {}  acknowledged {}  unacknowledged {}  read {} ({} unique)\n  lost (acknowledged, not read back): {}\n  duplicated: {}\n  reordered: {}\n",
        f.acks,
        f.idempotent,
        f.transactional,
        f.faults_injected,
        f.faults_failed,
        f.sent,
        f.acknowledged,
        f.unacknowledged,
        read,
        f.read_unique,
        f.lost,
        f.duplicated,
        f.reordered
    );
    if f.acknowledged == 0 {
        t.push_str("  nothing verified: no record was acknowledged\n");
    }
    if !f.read_back_errors.is_empty() {
        t.push_str(&format!("  read-back errors: {:?}\n", f.read_back_errors));
    }
    if !f.out_of_range_partitions.is_empty() {
        t.push_str(&format!(
            "  out of range during the read-back (not read further): partitions {:?}\n",
            f.out_of_range_partitions
        ));
    }
    if f.transactional {
        t.push_str(&format!(
            "  aborted: {}  aborted visible (read_committed): {}\n",
            f.aborted, f.aborted_visible
        ));
    }
    for (p, pf) in &f.partitions {
        t.push_str(&format!(
            "  partition {p}: read {} duplicated {} reordered {}\n",
            pf.read, pf.duplicated, pf.reordered
        ));
    }
    if !f.lost_examples.is_empty() {
        t.push_str(&format!("  first lost ids: {:?}\n", f.lost_examples));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records `ids` read back from partition 0, the i-th at offset i.
    fn consume_ids(r: &Recorder, ids: &[u64]) {
        for (o, &id) in ids.iter().enumerate() {
            let stamp = Stamp {
                run_id: 0,
                record_id: id,
                intended_ns: 0,
            };
            r.consumed(0, o as i64, Some(stamp), 0);
        }
    }

    #[test]
    fn analysis_finds_loss_duplicates_and_reordering() {
        let r = Recorder::default();
        let p1 = 1u64 << PRODUCER_SHIFT;
        r.acked(0, Some(0), &[0, 1, 2, 3]);
        r.acked(0, Some(0), &[p1, p1 + 1]);
        r.failed(0, &[4]);
        // read: 0, 2, 1 (reordered), 2 again (duplicate), p1, p1+1; 3 lost.
        consume_ids(&r, &[0, 2, 1, 2, p1, p1 + 1]);
        let f = analyse(&r.lock());
        assert_eq!(f.acknowledged, 6);
        assert_eq!(f.lost, 1);
        assert_eq!(f.lost_examples, vec![3]);
        assert_eq!(f.duplicated, 1);
        assert_eq!(f.reordered, 1);
        assert_eq!(f.unacknowledged, 1);
        assert_eq!(f.read_unique, 5);
        assert_eq!(f.aborted_visible, 0);
    }

    #[test]
    fn analysis_counts_aborted_records_read_back() {
        let r = Recorder::default();
        r.acked(0, Some(0), &[0, 1]);
        r.aborted(0, &[2, 3]);
        consume_ids(&r, &[0, 1, 3]);
        let f = analyse(&r.lock());
        assert_eq!(f.aborted, 2);
        assert_eq!(f.aborted_visible, 1);
        assert_eq!(f.lost, 0);
        assert_eq!(f.unacknowledged, 2);
    }

    fn clean_run() -> Findings {
        Findings {
            acknowledged: 100,
            read_unique: 100,
            ..Findings::default()
        }
    }

    #[test]
    fn strict_fails_a_run_that_acknowledged_nothing() {
        assert!(clean_run().strict_failures().is_empty());
        let nothing = Findings::default();
        let why = nothing.strict_failures();
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].contains("nothing verified"), "{why:?}");
    }

    #[test]
    fn strict_fails_reordering_only_for_idempotent_or_transactional_producers() {
        let plain = Findings {
            reordered: 3,
            ..clean_run()
        };
        // Without idempotence, retries may reorder (as Kafka allows).
        assert!(plain.strict_failures().is_empty());
        let idempotent = Findings {
            idempotent: true,
            ..plain.clone()
        };
        assert_eq!(idempotent.strict_failures().len(), 1);
        let transactional = Findings {
            transactional: true,
            ..plain
        };
        assert_eq!(transactional.strict_failures().len(), 1);
    }

    /// A long run's ledger holds bits per record, not map entries (~50 bytes each).
    #[test]
    fn the_ledger_grows_by_bits_per_record() {
        const N: u64 = 1_000_000;
        let r = Recorder::default();
        let p1 = 1u64 << PRODUCER_SHIFT;
        let ids: Vec<u64> = (0..N).flat_map(|i| [i, p1 | i]).collect();
        for chunk in ids.chunks(1000) {
            r.acked(0, Some(0), chunk);
        }
        consume_ids(&r, &ids);
        let g = r.lock();
        let bytes = g.record_bytes();
        // Acked and seen bits of 2 M records: 0.5 MB; allow growth slack, far below 2 M
        // map entries.
        assert!(bytes < 2 << 20, "{bytes} bytes for {} records", 2 * N);
        let f = analyse(&g);
        assert_eq!(f.acknowledged, 2 * N);
        assert_eq!(f.read_unique, 2 * N);
        assert_eq!(f.lost, 0);
        assert_eq!(f.reordered, 0);
    }

    #[test]
    fn reads_the_producers_never_recorded_count_but_are_not_lost_or_acked() {
        let r = Recorder::default();
        r.acked(0, Some(0), &[0]);
        consume_ids(&r, &[0, 5000, 5000]);
        let f = analyse(&r.lock());
        assert_eq!(f.read_unique, 2);
        assert_eq!(f.duplicated, 1);
        assert_eq!(f.acknowledged, 1);
        assert_eq!(f.lost, 0);
    }

    #[test]
    fn strict_fails_a_run_whose_read_back_hit_out_of_range() {
        let f = Findings {
            out_of_range_partitions: vec![1],
            ..clean_run()
        };
        assert_eq!(f.strict_failures().len(), 1);
    }

    #[test]
    fn the_read_back_target_is_the_end_of_the_last_acknowledged_batch() {
        let r = Recorder::default();
        r.acked(0, Some(5), &[0, 1, 2]);
        r.acked(0, Some(0), &[3]);
        r.acked(1, Some(7), &[4]);
        // acks=0 has no offsets: no target.
        r.acked(2, None, &[5]);
        let ends = r.lock().acked_end.clone();
        assert_eq!(ends, BTreeMap::from([(0, 8), (1, 8)]));
    }

    #[test]
    fn strict_fails_a_run_whose_fault_command_failed() {
        let f = Findings {
            faults_failed: 1,
            ..clean_run()
        };
        assert_eq!(f.strict_failures().len(), 1);
    }

    #[test]
    fn fault_every_without_a_fault_command_is_refused() {
        use clap::Parser;
        // Nothing listens on port 1: the flags are refused before any connection.
        let args = ["weir-loadgen", "verify", "--bootstrap", "127.0.0.1:1"];
        let with = |extra: &[&str]| {
            let cli = crate::cli::Cli::parse_from(args.iter().chain(extra));
            let crate::cli::Cmd::Verify(v) = cli.cmd else {
                panic!("parsed verify")
            };
            verify(&v).expect_err("refused").to_string()
        };
        assert!(with(&["--fault-every", "1s"]).contains("--fault-every needs --fault-cmd"));
        assert!(with(&["--fault-cmd", "true"]).contains("--fault-cmd needs --fault-every"));
    }

    /// Waits (bounded) for `cond`.
    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_failing_fault_command_is_counted_as_failed_not_injected() {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FaultCounts::default());
        let h = fault_thread(
            "false".into(),
            Duration::from_millis(10),
            Duration::from_secs(10),
            stop.clone(),
            counts.clone(),
        );
        wait_for("a failed fault", || {
            counts.failed.load(Ordering::Relaxed) >= 1
        });
        stop.store(true, Ordering::Relaxed);
        h.join().expect("fault thread");
        assert_eq!(counts.ok.load(Ordering::Relaxed), 0);
        assert!(counts.failed.load(Ordering::Relaxed) >= 1);
    }

    /// Whether `pid` is a process that has not exited (a zombie has).
    fn alive(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
            .unwrap_or(false)
    }

    #[test]
    fn a_hung_fault_command_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("sleep.pid");
        let cmd = format!("sleep 100 & echo $! > {}; wait", pidfile.display());
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FaultCounts::default());
        let h = fault_thread(
            cmd,
            Duration::from_millis(10),
            Duration::from_millis(500),
            stop.clone(),
            counts.clone(),
        );
        wait_for("the timed-out fault", || {
            counts.failed.load(Ordering::Relaxed) >= 1
        });
        stop.store(true, Ordering::Relaxed);
        h.join().expect("fault thread");
        assert_eq!(counts.ok.load(Ordering::Relaxed), 0);
        let pid = std::fs::read_to_string(&pidfile).expect("the sleep's pid");
        let pid = pid.trim();
        wait_for("the sleep to be killed", || !alive(pid));
    }
}
