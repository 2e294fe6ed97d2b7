//! Compacted topics against a real weir and confluent-kafka (Python, librdkafka): a
//! `cleanup.policy=compact` topic with small segments gets 10,000 records over 100 keys,
//! tombstones for 10 of them and 2,000 more records; written with the cleaner off, then
//! the broker restarts with it on. The log on disk shrinks, and a consumer from offset 0
//! reads exactly the latest record of each key in the sealed segments (tombstones
//! included, `delete.retention.ms` is a day) plus the active segment, every record at the
//! offset the producer was told.
//!
//! The Python interpreter is `WEIR_TEST_PYTHON`, else `target/interop-venv/bin/python`
//! (made by `scripts/install-test-deps.sh`), e.g.
//! `WEIR_TEST_PYTHON=/work/main/target/interop-venv/bin/python cargo test -p weir-tests --test compaction`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use weir_tests::broker::python;
use weir_tests::process::run_bounded;
use weir_tests::{Weir, WeirConfig};

const TOPIC: &str = "compacted";
/// How long one run of the client script may take (its consume loop stops at 60 s).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the cleaner may take to compact the topic after the restart.
const CLEAN_TIMEOUT: Duration = Duration::from_secs(120);

/// A record as produced or consumed: offset, key, value (None: tombstone).
type Rec = (i64, String, Option<String>);

const SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
mode, bootstrap, topic = sys.argv[1:4]
def show(offset, key, value):
    print(f"{offset}\t{key}\t{'-' if value is None else value.decode()}")
if mode == "produce":
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"cleanup.policy": "compact", "segment.bytes": "16384",
              "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "86400000"}
    for f in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "batch.num.messages": 10})
    acked, failed = [], []
    def report(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            acked.append((msg.offset(), msg.key().decode(), msg.value()))
    sends = [(f"key-{i % 100}", f"v{i}-" + "x" * 40) for i in range(10000)]
    sends += [(f"key-{k}", None) for k in range(10)]
    sends += [(f"key-{10 + i % 90}", f"w{i}-" + "y" * 40) for i in range(2000)]
    for key, value in sends:
        p.produce(topic, key=key, value=None if value is None else value.encode(),
                  partition=0, on_delivery=report)
        p.poll(0)
    p.flush(60)
    if failed or len(acked) != len(sends):
        sys.exit(f"{len(acked)} of {len(sends)} acked; failures: {failed[:3]}")
    for offset, key, value in sorted(acked):
        show(offset, key, value)
elif mode == "consume":
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-check",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    c.assign([TopicPartition(topic, 0, 0)])
    deadline, last = time.time() + 60, -1
    while last < high - 1 and time.time() < deadline:
        msg = c.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            sys.exit(f"consume: {msg.error()}")
        last = msg.offset()
        show(msg.offset(), msg.key().decode(), msg.value())
    c.close()
    if last < high - 1:
        sys.exit(f"read up to {last}, high watermark {high}")
"#;

/// Runs the client script in `mode`; returns the records it printed.
fn client(mode: &str, bootstrap: &str) -> Result<Vec<Rec>> {
    let out = run_bounded(
        Command::new(python()?).args(["-c", SCRIPT, mode, bootstrap, TOPIC]),
        CLIENT_TIMEOUT,
    )
    .context("run python")?;
    if !out.ok() {
        bail!("{mode}: {}", out.stderr);
    }
    out.stdout
        .lines()
        .map(|line| {
            let mut f = line.splitn(3, '\t');
            let (Some(o), Some(k), Some(v)) = (f.next(), f.next(), f.next()) else {
                bail!("bad line {line:?}");
            };
            Ok((o.parse()?, k.to_owned(), (v != "-").then(|| v.to_owned())))
        })
        .collect()
}

/// The `.log` files of the partition: base offsets and total bytes.
fn segments(dir: &Path) -> Result<(Vec<i64>, u64)> {
    let mut bases = Vec::new();
    let mut bytes = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".log") {
            bases.push(stem.parse::<i64>()?);
            bytes += e.metadata()?.len();
        }
    }
    bases.sort();
    Ok((bases, bytes))
}

/// The offset in the partition's `cleaner-offset-checkpoint`, if written.
fn checkpoint(dir: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(dir.join("cleaner-offset-checkpoint")).ok()?;
    text.lines().nth(2)?.rsplit(' ').next()?.parse().ok()
}

#[test]
fn a_compacted_topic_reads_back_the_latest_value_of_each_key_at_its_offset() -> Result<()> {
    let config = WeirConfig::shards(1)
        .set("log.cleaner.enable", "false")
        .set("log.cleaner.backoff.ms", "100")
        .set("log.retention.check.interval.ms", "200");
    let mut weir = Weir::start(config)?;
    let produced = client("produce", &weir.bootstrap())?;
    ensure!(produced.len() == 12_010, "{} acked", produced.len());
    let dir = weir.data_dir().join(format!("{TOPIC}-0"));
    weir.terminate()?;
    let (bases, bytes_before) = segments(&dir)?;
    ensure!(bases.len() > 20, "small segments: {bases:?}");

    let sets = &mut weir.config_mut().sets;
    sets.retain(|(k, _)| k != "log.cleaner.enable");
    weir.restart()?;
    let active = *bases.last().context("no segments")?;
    let deadline = Instant::now() + CLEAN_TIMEOUT;
    // Bounded: the cleaner's checkpoint reaches the active segment, or the test fails.
    while checkpoint(&dir) != Some(active) {
        ensure!(
            Instant::now() < deadline,
            "not compacted in {CLEAN_TIMEOUT:?}: checkpoint {:?}\n{}",
            checkpoint(&dir),
            weir.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (after_bases, bytes_after) = segments(&dir)?;
    eprintln!(
        "partition log {bytes_before} -> {bytes_after} bytes, {} segments",
        after_bases.len()
    );
    ensure!(
        after_bases.first() == bases.first() && after_bases.iter().all(|b| bases.contains(b)),
        "cleaned (and merged) segments keep base offsets: {after_bases:?}"
    );
    ensure!(
        bytes_after * 4 < bytes_before,
        "the log shrank: {bytes_before} -> {bytes_after}"
    );

    let got = client("consume", &weir.bootstrap())?;
    let mut latest: BTreeMap<&str, &Rec> = BTreeMap::new();
    for r in produced.iter().filter(|r| r.0 < active) {
        latest.insert(&r.1, r);
    }
    let mut want: Vec<Rec> = latest.into_values().cloned().collect();
    want.extend(produced.iter().filter(|r| r.0 >= active).cloned());
    want.sort();
    ensure!(
        got.len() == want.len(),
        "read {} records, want {}",
        got.len(),
        want.len()
    );
    for (g, w) in got.iter().zip(&want) {
        ensure!(g == w, "read {g:?}, want {w:?}");
    }
    let tombstones = got.iter().filter(|r| r.2.is_none()).count();
    ensure!(
        tombstones == 10,
        "tombstones kept before delete.retention.ms: {tombstones}"
    );
    weir.terminate()?;
    Ok(())
}
