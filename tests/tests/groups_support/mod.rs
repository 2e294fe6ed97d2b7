//! Shared pieces of the consumer-group tests: a weir configured for short sessions, group
//! members (rdkafka consumers on their own threads that commit after processing each
//! record, and kcat processes that can be SIGKILLed), a background producer, and
//! `weir groups describe` parsed into rows.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientContext, TopicPartitionList};
use weir_tests::clients::{self, TestProducer};
use weir_tests::{Weir, WeirConfig};

/// How long one `weir groups` command may run.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a member's poll loop may take to notice a pause (one poll is 50 ms).
const PAUSE_WAIT: Duration = Duration::from_secs(5);

/// Session timeout every member uses (the broker's minimum is lowered to allow it).
pub const SESSION_MS: u64 = 4000;

/// A weir with short group timers: 2 shards, 4 `__consumer_offsets` partitions.
pub fn start_weir() -> Result<Weir> {
    let config = WeirConfig::shards(2)
        .set("group.min.session.timeout.ms", 1000)
        .set("group.initial.rebalance.delay.ms", 0)
        .set("offsets.topic.num.partitions", 4);
    Weir::start(config)
}

/// What one member saw, shared with its thread.
#[derive(Default, Clone, Debug)]
pub struct Seen {
    pub assignment: BTreeSet<i32>,
    /// Every record processed, in order: (partition, offset).
    pub processed: Vec<(i32, i64)>,
    /// Processed records whose commit failed (these may be delivered again).
    pub uncommitted: BTreeSet<(i32, i64)>,
    /// Partitions revoked, one set per revocation.
    pub revoked: Vec<BTreeSet<i32>>,
    /// The poll loop saw a pause.
    pub idle: bool,
}

struct Ctx(Arc<Mutex<Seen>>);

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let parts = tpl.elements().iter().map(|e| e.partition()).collect();
            lock(&self.0).revoked.push(parts);
        }
    }
}

fn lock(m: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// An rdkafka group member polling on its own thread.
pub struct Member {
    pub name: String,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    /// While set, the member stays in the group (librdkafka heartbeats in the
    /// background) but processes nothing.
    paused: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Member {
    /// Joins `group` on `topic` with `strategy` (range, roundrobin, cooperative-sticky).
    pub fn start(
        bootstrap: &str,
        group: &str,
        topic: &str,
        strategy: &str,
        name: &str,
    ) -> Result<Member> {
        Member::start_with(bootstrap, group, topic, strategy, name, &[])
    }

    /// [`Member::start`] with extra client settings (e.g. `group.instance.id`).
    pub fn start_with(
        bootstrap: &str,
        group: &str,
        topic: &str,
        strategy: &str,
        name: &str,
        extra: &[(&str, &str)],
    ) -> Result<Member> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut cfg = clients::base_config(bootstrap);
        cfg.set("group.id", group)
            .set("client.id", name)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", SESSION_MS.to_string())
            .set("heartbeat.interval.ms", "500")
            .set("partition.assignment.strategy", strategy)
            .set("fetch.wait.max.ms", "100");
        for (k, v) in extra {
            cfg.set(*k, *v);
        }
        let consumer: BaseConsumer<Ctx> = cfg
            .create_with_context(Ctx(seen.clone()))
            .context("create member")?;
        consumer.subscribe(&[topic]).context("subscribe")?;
        let paused = Arc::new(AtomicBool::new(false));
        let (s, st, pa) = (seen.clone(), stop.clone(), paused.clone());
        let thread = thread::spawn(move || poll_loop(consumer, s, st, pa));
        Ok(Member {
            name: name.to_string(),
            seen,
            stop,
            paused,
            thread: Some(thread),
        })
    }

    /// Stops (or resumes) processing without leaving the group. Pausing returns once
    /// the poll loop has seen it (no record is processed after that); it panics if the
    /// loop has not within 5 s (it ended, or is stuck in a call), since the test would
    /// otherwise go on with a member still processing.
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        if !paused {
            return;
        }
        let deadline = Instant::now() + PAUSE_WAIT;
        while !lock(&self.seen).idle {
            assert!(
                Instant::now() < deadline,
                "member {} did not pause within {PAUSE_WAIT:?}",
                self.name
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn seen(&self) -> Seen {
        lock(&self.seen).clone()
    }

    pub fn assignment(&self) -> BTreeSet<i32> {
        lock(&self.seen).assignment.clone()
    }

    /// Stops polling and closes the consumer (LeaveGroup).
    pub fn leave(&mut self) -> Result<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(r) => r?,
                Err(_) => bail!("member {} panicked", self.name),
            }
        }
        Ok(self.seen())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls, "processes" (records) each record, then commits it synchronously.
fn poll_loop(
    c: BaseConsumer<Ctx>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let pause = paused.load(Ordering::SeqCst);
        lock(&seen).idle = pause;
        if pause {
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
            let key = (m.partition(), m.offset());
            lock(&seen).processed.push(key);
            if c.commit_message(&m, CommitMode::Sync).is_err() {
                lock(&seen).uncommitted.insert(key);
            }
        }
        if let Ok(tpl) = c.assignment() {
            lock(&seen).assignment = tpl.elements().iter().map(|e| e.partition()).collect();
        }
    }
    drop(c);
    Ok(())
}

/// A kcat group member (librdkafka 2.0.2, auto-commit) in its own process.
pub struct KcatMember {
    child: Child,
    pub seen: Arc<Mutex<Vec<(i32, i64)>>>,
    reader: Option<JoinHandle<()>>,
}

impl KcatMember {
    pub fn start(bootstrap: &str, group: &str, topic: &str, client_id: &str) -> Result<KcatMember> {
        let session = format!("session.timeout.ms={SESSION_MS}");
        let client = format!("client.id={client_id}");
        // Debian's kcat with its own librdkafka: cargo's LD_LIBRARY_PATH holds the
        // build's librdkafka, which would otherwise be loaded instead.
        let mut child = Command::new("kcat")
            .env_remove("LD_LIBRARY_PATH")
            .args([
                "-b", bootstrap, "-G", group, topic, "-q", "-u", "-f", "%p %o\\n",
            ])
            .args([
                "-X",
                "auto.offset.reset=earliest",
                "-X",
                &session,
                "-X",
                &client,
            ])
            .args([
                "-X",
                "heartbeat.interval.ms=500",
                "-X",
                "auto.commit.interval.ms=300",
            ])
            .args(["-X", "partition.assignment.strategy=range"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn kcat (scripts/install-test-deps.sh installs it)")?;
        let out = child.stdout.take().context("kcat stdout")?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let reader = thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut it = line.split_whitespace().map(str::parse::<i64>);
                if let (Some(Ok(p)), Some(Ok(o)), Ok(mut v)) = (it.next(), it.next(), s.lock()) {
                    v.push((p as i32, o));
                }
            }
        });
        Ok(KcatMember {
            child,
            seen,
            reader: Some(reader),
        })
    }

    /// SIGKILL: no LeaveGroup, no last commit.
    pub fn kill(&mut self) -> Result<Vec<(i32, i64)>> {
        self.child.kill().context("SIGKILL kcat")?;
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        Ok(self.seen.lock().map(|v| v.clone()).unwrap_or_default())
    }
}

impl Drop for KcatMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Produces records to every partition of `topic` in turn until stopped.
pub struct BackgroundProducer {
    stop: Arc<AtomicBool>,
    pub sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl BackgroundProducer {
    pub fn start(
        producer: TestProducer,
        topic: &str,
        partitions: i32,
        per_sec: u64,
    ) -> BackgroundProducer {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (st, se, topic) = (stop.clone(), sent.clone(), topic.to_string());
        let thread = thread::spawn(move || {
            let pause = Duration::from_micros(1_000_000 / per_sec.max(1));
            let mut i: u64 = 0;
            while !st.load(Ordering::SeqCst) && i < 1_000_000 {
                let payload = format!("record-{i}");
                let rec = BaseRecord::<(), _, _>::with_opaque_to(&topic, Box::new(i))
                    .payload(&payload)
                    .partition((i % partitions as u64) as i32);
                if producer.send(rec).is_ok() {
                    i += 1;
                    se.store(i, Ordering::SeqCst);
                }
                thread::sleep(pause);
            }
            producer.flush(Duration::from_secs(30)).context("flush")?;
            Ok(())
        });
        BackgroundProducer {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    pub fn stop(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("producer thread panicked"),
            None => Ok(()),
        }
    }
}

/// One row of `weir groups describe`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub topic: String,
    pub partition: i32,
    pub committed: Option<i64>,
    pub log_end: Option<i64>,
    pub lag: Option<i64>,
    pub member: Option<String>,
    pub client_id: Option<String>,
}

/// The text `weir groups describe GROUP` prints.
pub fn describe_text(weir: &Weir, group: &str) -> Result<String> {
    let bootstrap = weir.bootstrap();
    let args = [
        "groups",
        "--bootstrap-server",
        &bootstrap,
        "describe",
        group,
    ];
    let out = weir_tests::process::run_bounded(
        Command::new(weir_tests::broker::weir_binary()?).args(args),
        CLI_TIMEOUT,
    )
    .context("run weir groups describe")?;
    if !out.ok() {
        bail!("weir groups describe: {}", out.stderr);
    }
    Ok(out.stdout)
}

/// The member lines of `weir groups describe` (after the partition table). Fails if the
/// members section is missing or its count differs from the header's `MEMBERS N`, so a
/// change of the output format cannot pass for "no members".
pub fn describe_members(weir: &Weir, group: &str) -> Result<Vec<String>> {
    let text = describe_text(weir, group)?;
    let count = text
        .lines()
        .next()
        .and_then(|head| head.split(" MEMBERS ").nth(1))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .with_context(|| format!("no MEMBERS count in the header:\n{text}"))?;
    let Some(section) = text.split("\n\n").nth(1) else {
        bail!("no members section (after a blank line):\n{text}");
    };
    let mut lines = section.lines();
    if !lines.next().is_some_and(|h| h.starts_with("MEMBER-ID")) {
        bail!("the members section has no MEMBER-ID header:\n{text}");
    }
    let members: Vec<String> = lines.map(str::to_string).collect();
    if members.len() != count {
        bail!(
            "{} member lines, header says {count}:\n{text}",
            members.len()
        );
    }
    Ok(members)
}

/// Runs `weir groups describe GROUP` against the node and parses it: (header, rows).
pub fn describe(weir: &Weir, group: &str) -> Result<(String, Vec<Row>)> {
    let text = describe_text(weir, group)?;
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default().to_string();
    let opt = |s: &str| (s != "-").then(|| s.to_string());
    let num = |s: &str| s.parse::<i64>().ok();
    let rows = lines
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 8).then(|| Row {
                topic: f[0].to_string(),
                partition: f[1].parse().unwrap_or(-1),
                committed: num(f[2]),
                log_end: num(f[3]),
                lag: num(f[4]),
                member: opt(f[5]),
                client_id: opt(f[7]),
            })
        })
        .collect();
    Ok((header, rows))
}

/// Partitions each client id owns per `weir groups describe`.
pub fn owners(rows: &[Row]) -> BTreeMap<String, BTreeSet<i32>> {
    let mut m: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for r in rows {
        if let Some(c) = &r.client_id {
            m.entry(c.clone()).or_default().insert(r.partition);
        }
    }
    m
}

/// Waits (bounded) until `cond` holds; returns how long it took.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond()? {
            return Ok(start.elapsed());
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// Topic partition list helper.
pub fn tpl(topic: &str, partitions: &[i32]) -> Result<TopicPartitionList> {
    let mut t = TopicPartitionList::new();
    for p in partitions {
        t.add_partition(topic, *p);
    }
    Ok(t)
}
