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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::cli::Verify;
use crate::client::consumer::{RecordSink, StartAt};
use crate::client::payload::{PRODUCER_SHIFT, Stamp};
use crate::client::producer::{AckSink, warn};
use crate::report;
use crate::run;

/// Upper bound on the fault command's own runtime.
const FAULT_CMD_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Ledger {
    acked: HashMap<u64, i32>,
    failed: HashSet<u64>,
    /// Per partition, (offset, record id) in the order read.
    read: BTreeMap<i32, Vec<(i64, u64)>>,
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
    fn acked(&self, partition: i32, _base: Option<i64>, ids: &[u64]) {
        let mut g = self.lock();
        for &id in ids {
            g.acked.insert(id, partition);
        }
    }
    fn failed(&self, _partition: i32, ids: &[u64]) {
        let mut g = self.lock();
        g.failed.extend(ids.iter().copied());
    }
}

impl RecordSink for Recorder {
    fn consumed(&self, partition: i32, offset: i64, stamp: Option<Stamp>, _now_ns: u64) {
        if let Some(s) = stamp {
            self.lock()
                .read
                .entry(partition)
                .or_default()
                .push((offset, s.record_id));
        }
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
    pub sent: u64,
    pub acknowledged: u64,
    pub unacknowledged: u64,
    pub read_unique: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub faults_injected: u64,
    pub partitions: BTreeMap<i32, PartitionFindings>,
    /// Up to 20 lost record ids, for a first look.
    pub lost_examples: Vec<u64>,
}

/// Compares what was acknowledged with what was read.
fn analyse(ledger: &Ledger) -> Findings {
    let mut f = Findings::default();
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for (&p, reads) in &ledger.read {
        let mut pf = PartitionFindings::default();
        let mut max_by_producer: HashMap<u64, u64> = HashMap::new();
        for &(_, id) in reads {
            pf.read += 1;
            let n = seen.entry(id).or_insert(0);
            *n += 1;
            if *n > 1 {
                pf.duplicated += 1;
                continue;
            }
            let producer = id >> PRODUCER_SHIFT;
            let m = max_by_producer.entry(producer).or_insert(id);
            if id < *m {
                pf.reordered += 1;
            }
            *m = (*m).max(id);
        }
        f.duplicated += pf.duplicated;
        f.reordered += pf.reordered;
        f.partitions.insert(p, pf);
    }
    f.read_unique = seen.len() as u64;
    f.acknowledged = ledger.acked.len() as u64;
    f.unacknowledged = ledger
        .failed
        .iter()
        .filter(|id| !ledger.acked.contains_key(id))
        .count() as u64;
    let mut lost: Vec<u64> = ledger
        .acked
        .keys()
        .filter(|id| !seen.contains_key(id))
        .copied()
        .collect();
    lost.sort_unstable();
    f.lost = lost.len() as u64;
    f.lost_examples = lost.into_iter().take(20).collect();
    f
}

/// Runs the fault command every `every` until `stop`; returns how many times it ran.
fn fault_thread(cmd: String, every: Duration, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        let mut next = Instant::now() + every;
        // Bounded: one fault per interval, at most 10 000 in all.
        while n < 10_000 {
            while Instant::now() < next {
                if stop.load(Ordering::Relaxed) {
                    return n;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if stop.load(Ordering::Relaxed) {
                return n;
            }
            let started = Instant::now();
            run_fault(&cmd);
            eprintln!("weir-loadgen: fault command took {:?}", started.elapsed());
            n += 1;
            next = Instant::now() + every;
        }
        n
    })
}

fn run_fault(cmd: &str) {
    eprintln!("weir-loadgen: fault: {cmd}");
    let child = Command::new("sh").arg("-c").arg(cmd).spawn();
    let Ok(mut child) = child else {
        warn("could not start the fault command");
        return;
    };
    let deadline = Instant::now() + FAULT_CMD_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if !st.success() => {
                warn(&format!("fault command exited with {st}"));
                return;
            }
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                warn("fault command timed out; killed");
                return;
            }
        }
    }
}

/// Produce phase with faults, then a full read-back, then the comparison.
pub fn verify(v: &Verify) -> Result<Findings> {
    let mut spec = v.load.spec(StartAt::Latest)?;
    let ledger = Arc::new(Recorder::default());
    // Positions at the start: the read-back covers exactly this run's range.
    let cluster = run::prepare_topic(&spec)?;
    let starts = start_offsets(&spec.bootstrap, &spec.topic, &cluster)?;
    let stop = Arc::new(AtomicBool::new(false));
    let faults = match (&v.fault_cmd, v.fault_every) {
        (Some(c), Some(e)) => Some(fault_thread(c.clone(), e, stop.clone())),
        (Some(_), None) => bail!("--fault-cmd needs --fault-every"),
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
    let faults_injected = faults.map_or(0, |h| h.join().unwrap_or(0));
    let produced = produced?;
    // Read back everything from the recorded start offsets, until idle.
    spec.start = StartAt::Earliest;
    spec.records = None;
    spec.duration = None;
    spec.quiet = true;
    let read = read_back(&spec, &cluster, &starts, ledger.clone())?;
    let mut f = analyse(&ledger.lock());
    f.sent = produced.producer.generated;
    f.acks = v.load.acks.clone();
    f.idempotent = v.load.idempotent;
    f.faults_injected = faults_injected;
    println!("{}", findings_text(&f, read));
    if let Some(p) = &v.load.json {
        report::write_json(p, &f)?;
    }
    Ok(f)
}

fn start_offsets(
    bootstrap: &str,
    topic: &str,
    cluster: &crate::client::metadata::Cluster,
) -> Result<BTreeMap<i32, i64>> {
    let _ = bootstrap;
    let mut out = BTreeMap::new();
    for p in 0..cluster.partitions() {
        let addr = cluster.leader_addr(p)?;
        let mut c = crate::client::conn::Conn::connect(addr)?;
        let o = crate::client::metadata::list_offsets(
            &mut c,
            topic,
            &[p as i32],
            crate::client::metadata::LATEST,
        )?;
        out.extend(o);
    }
    Ok(out)
}

/// Reads the topic from `starts` until no record arrives for a few seconds.
fn read_back(
    spec: &run::LoadSpec,
    cluster: &crate::client::metadata::Cluster,
    starts: &BTreeMap<i32, i64>,
    sink: Arc<Recorder>,
) -> Result<u64> {
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
    };
    let parts = (0..cluster.partitions() as i32).collect();
    let c = Consumer::new(
        cfg,
        cluster.clone(),
        parts,
        positions,
        clock,
        recorder,
        sink,
        spec.run_id,
    );
    let until = Until {
        records: None,
        consumed: Arc::default(),
        deadline: Instant::now() + Duration::from_secs(600),
        idle: Some(Duration::from_secs(3)),
    };
    Ok(c.run(until, &AtomicBool::new(false)))
}

fn findings_text(f: &Findings, read: u64) -> String {
    let mut t = format!(
        "verify: acks={} idempotent={} faults={}\n  sent {}  acknowledged {}  unacknowledged {}  read {} ({} unique)\n  lost (acknowledged, not read back): {}\n  duplicated: {}\n  reordered: {}\n",
        f.acks,
        f.idempotent,
        f.faults_injected,
        f.sent,
        f.acknowledged,
        f.unacknowledged,
        read,
        f.read_unique,
        f.lost,
        f.duplicated,
        f.reordered
    );
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

    #[test]
    fn analysis_finds_loss_duplicates_and_reordering() {
        let r = Recorder::default();
        let p1 = 1u64 << PRODUCER_SHIFT;
        r.acked(0, Some(0), &[0, 1, 2, 3]);
        r.acked(0, Some(0), &[p1, p1 + 1]);
        r.failed(0, &[4]);
        // read: 0, 2, 1 (reordered), 2 again (duplicate), p1, p1+1; 3 lost.
        for (o, id) in [(0, 0), (1, 2), (2, 1), (3, 2), (4, p1), (5, p1 + 1)] {
            r.consumed(
                0,
                o,
                Some(Stamp {
                    run_id: 0,
                    record_id: id,
                    intended_ns: 0,
                }),
                0,
            );
        }
        let f = analyse(&r.lock());
        assert_eq!(f.acknowledged, 6);
        assert_eq!(f.lost, 1);
        assert_eq!(f.lost_examples, vec![3]);
        assert_eq!(f.duplicated, 1);
        assert_eq!(f.reordered, 1);
        assert_eq!(f.unacknowledged, 1);
        assert_eq!(f.read_unique, 5);
    }
}
