//! Restart under load: two librdkafka producers (acks=1 and acks=all, no retries so the
//! client never duplicates) write continuously while the broker is stopped by SIGTERM or
//! killed by SIGKILL; after a restart on the same data dir every acknowledged record is
//! there exactly once, in order, with its bytes; and the log keeps growing after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use weir_tests::clients::{self, Acked, DeliveryLog, Sent};
use weir_tests::{Weir, WeirConfig};

const TOPIC: &str = "restart";
const PARTITIONS: i32 = 4;
/// The broker is stopped once each producer has this many acknowledgements...
const ACKS_BEFORE_STOP: usize = 1000;
/// ...which must come within this long.
const LOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound on records one producer sends (the loop also stops on the flag).
const RECORDS_PER_PRODUCER_MAX: u64 = 2_000_000;

/// What one producer sent and what the broker acknowledged.
type Outcome = (Vec<Sent>, Vec<Acked>);

struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<thread::JoinHandle<Result<Outcome>>>,
    /// Each producer's delivery log, registered once its producer exists.
    logs: Arc<Mutex<Vec<Arc<DeliveryLog>>>>,
}

impl Load {
    /// Waits (bounded) until every producer has `n` acknowledgements.
    fn wait_acks(&self, n: usize) -> Result<()> {
        let deadline = Instant::now() + LOAD_TIMEOUT;
        loop {
            let counts: Vec<usize> = {
                let logs = self.logs.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                logs.iter().map(|l| l.acked().len()).collect()
            };
            if counts.len() == self.workers.len() && counts.iter().all(|c| *c >= n) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "producers acknowledged {counts:?}, waited {LOAD_TIMEOUT:?} for {n} each"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Starts one producer thread per acks setting; ids are disjoint per producer.
fn start_load(bootstrap: &str) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let logs = Arc::new(Mutex::new(Vec::new()));
    let workers = [("1", 0u64), ("all", 1u64 << 40)]
        .into_iter()
        .map(|(acks, first_id)| {
            let (bootstrap, stop) = (bootstrap.to_string(), Arc::clone(&stop));
            let logs = Arc::clone(&logs);
            thread::spawn(move || produce_until(&bootstrap, acks, first_id, &stop, &logs))
        })
        .collect();
    Load {
        stop,
        workers,
        logs,
    }
}

fn produce_until(
    bootstrap: &str,
    acks: &str,
    first_id: u64,
    stop: &AtomicBool,
    logs: &Mutex<Vec<Arc<DeliveryLog>>>,
) -> Result<(Vec<Sent>, Vec<Acked>)> {
    let extra = [
        ("message.send.max.retries", "0"),
        ("message.timeout.ms", "5000"),
        ("linger.ms", "2"),
        ("queue.buffering.max.messages", "20000"),
    ];
    let (producer, log) = clients::producer(bootstrap, acks, "lz4", &extra)?;
    logs.lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .push(Arc::clone(&log));
    let tag = format!("acks={acks}");
    let mut sent = Vec::new();
    let mut id = first_id;
    while !stop.load(Ordering::Relaxed) && id < first_id + RECORDS_PER_PRODUCER_MAX {
        let chunk = clients::make_records(id, 100, &tag, clients::now_ms());
        for r in &chunk {
            // A dead broker fills the local queue; that is expected here, not a failure.
            if clients::send_one(&producer, TOPIC, r, None).is_err() {
                break;
            }
        }
        id += 100;
        sent.extend(chunk);
        thread::sleep(Duration::from_millis(1));
    }
    // Unsent or unacknowledged records fail by message.timeout.ms; the flush is bounded.
    let _ = rdkafka::producer::Producer::flush(&producer, Duration::from_secs(15));
    Ok((sent, log.acked()))
}

fn stop_load(load: Load) -> Result<(Vec<Sent>, Vec<Acked>)> {
    load.stop.store(true, Ordering::Relaxed);
    let (mut sent, mut acked) = (Vec::new(), Vec::new());
    for w in load.workers {
        let (s, a) = w
            .join()
            .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
        sent.extend(s);
        acked.extend(a);
    }
    Ok((sent, acked))
}

fn restart_mid_load(kill: bool) -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(2))?;
    clients::create_topics(&weir.bootstrap(), &[TOPIC], PARTITIONS, &[])?;
    let load = start_load(&weir.bootstrap());
    if let Err(e) = load.wait_acks(ACKS_BEFORE_STOP) {
        // Stop the producers too, so they do not outlive the failed test.
        load.stop.store(true, Ordering::Relaxed);
        return Err(e);
    }
    let status = if kill {
        weir.kill()?
    } else {
        weir.terminate()?
    };
    let (sent, acked) = stop_load(load)?;
    if !kill {
        ensure!(
            status.success(),
            "SIGTERM exit status {status}; log:\n{}",
            weir.log_tail(30)
        );
    }
    ensure!(
        acked.len() > 1000,
        "only {} records acknowledged before the stop",
        acked.len()
    );
    let acked_all = acked.iter().filter(|a| a.id >= 1 << 40).count();
    ensure!(
        acked_all > 0 && acked_all < acked.len(),
        "need acks from both producers: {acked_all} of {}",
        acked.len()
    );

    weir.restart().context("restart on the same data dir")?;
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let got = clients::consume_to_end(&weir.bootstrap(), TOPIC, &all)?;
    clients::verify(&sent, &acked, &got)
        .map_err(|e| e.context(format!("after restart; log:\n{}", weir.log_tail(30))))?;

    // The restarted log takes new records after the old ones.
    let more = clients::make_records(1 << 50, 1000, "after", clients::now_ms());
    let (producer, log) = clients::producer(&weir.bootstrap(), "all", "none", &[])?;
    clients::produce_all(&producer, TOPIC, &more, None)?;
    ensure!(
        log.acked().len() == more.len(),
        "after restart: {} of 1000 acked",
        log.acked().len()
    );
    let got2 = clients::consume_to_end(&weir.bootstrap(), TOPIC, &all)?;
    ensure!(
        got2.len() == got.len() + more.len(),
        "{} records after, {} before + 1000",
        got2.len(),
        got.len()
    );
    let mut sent_all = sent;
    sent_all.extend(more);
    let mut acked_all = acked;
    acked_all.extend(log.acked());
    clients::verify(&sent_all, &acked_all, &got2)?;
    eprintln!(
        "restart ({}): {} records acknowledged before the stop, {} in the log after restart",
        if kill { "SIGKILL" } else { "SIGTERM" },
        acked_all.len() - 1000,
        got.len()
    );
    Ok(())
}

#[test]
fn sigterm_mid_load_keeps_every_acknowledged_record() -> Result<()> {
    restart_mid_load(false)
}

#[test]
fn sigkill_mid_load_keeps_every_acknowledged_record() -> Result<()> {
    restart_mid_load(true)
}

/// A clean stop and start three times with nothing in flight, the last time with a
/// different shard count: records, partition counts and topic configs all survive.
#[test]
fn topics_and_records_survive_repeated_clean_restarts() -> Result<()> {
    let mut weir = Weir::start(WeirConfig::shards(2))?;
    clients::create_topics(
        &weir.bootstrap(),
        &["persist"],
        3,
        &[("retention.ms", "86400000")],
    )?;
    let records = clients::make_records(0, 3000, "persist", clients::now_ms());
    let (producer, log) = clients::producer(&weir.bootstrap(), "all", "zstd", &[])?;
    clients::produce_all(&producer, "persist", &records, None)?;
    drop(producer);
    let acked = log.acked();
    ensure!(acked.len() == records.len());
    let started = Instant::now();
    // Round 2 restarts with one shard instead of two: partitions change owners.
    for (round, shards) in [(0, 2), (1, 2), (2, 1)] {
        let status = weir.terminate()?;
        ensure!(status.success(), "round {round}: exit {status}");
        weir.config_mut().shards = Some(shards);
        weir.restart()?;
        let retention = clients::topic_config(&weir.bootstrap(), "persist", "retention.ms")?;
        ensure!(
            retention.as_deref() == Some("86400000"),
            "round {round}: retention.ms {retention:?}"
        );
        ensure!(clients::partition_count(&weir.bootstrap(), "persist")? == 3);
        let got = clients::consume_to_end(&weir.bootstrap(), "persist", &[0, 1, 2])?;
        ensure!(
            got.len() == records.len(),
            "round {round}: {} records",
            got.len()
        );
        clients::verify(&records, &acked, &got)?;
    }
    if started.elapsed() > Duration::from_secs(120) {
        bail!("three restarts took {:?}", started.elapsed());
    }
    Ok(())
}
