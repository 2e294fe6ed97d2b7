//! KIP-227 fetch sessions as real clients use them, seen on the wire: every Fetch between
//! the clients and weir crosses a recording proxy ([`weir_tests::fetch_tap`], the broker's
//! `advertised.listeners`) that decodes its session id, epoch and partitions.
//!
//! - A kafka-python consumer of 1,000 partitions: its first fetch is full (epoch 0, all
//!   1,000 listed, all answered, a session id given), every later one incremental (the
//!   same session, epoch 1, 2, 3, ..., only the partitions whose position moved, most of
//!   them none, answered with only the partitions that changed), and records produced
//!   while the session is open arrive, each once.
//! - A session eviction with `max.incremental.fetch.session.cache.slots=1`: kafka-python A
//!   holds the one slot, kafka-python B's larger session evicts it, A's next incremental
//!   fetch is answered FETCH_SESSION_ID_NOT_FOUND and A falls back to full fetches
//!   (answered sessionless, the slot is B's); a librdkafka consumer beside them uses no
//!   sessions at all (session id 0, epoch -1 on every fetch: librdkafka does not implement
//!   KIP-227). All three read every record exactly once, A and librdkafka including records
//!   produced after the eviction.
//!
//! The consumers are `fetch_sessions_support/kp_consume.py`, run with the interop venv's
//! Python (`WEIR_TEST_PYTHON`, default `target/interop-venv/bin/python`, installed by
//! `scripts/install-test-deps.sh`); without it the tests fail.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use weir_tests::broker::python;
use weir_tests::clients::{self, Sent};
use weir_tests::fetch_tap::{FetchExchange, FetchTap};
use weir_tests::{Weir, WeirConfig};

/// Longest a consumer process may take to read what it expects (its own deadline is
/// 240 s; this one only bounds the wait on a hung process).
const CONSUMER_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest the test waits for one step to show on the wire.
const WIRE_TIMEOUT: Duration = Duration::from_secs(120);
const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fetch_sessions_support/kp_consume.py")
}

/// A broker that advertises the tap, and the tap forwarding to it.
fn tapped(config: WeirConfig) -> Result<(FetchTap, Weir)> {
    let tap = FetchTap::start()?;
    let config = config.set(
        "advertised.listeners",
        format!("PLAINTEXT://{}", tap.addr()),
    );
    let weir = Weir::start(config)?;
    tap.set_target(weir.addr());
    Ok((tap, weir))
}

/// A kafka-python consumer process and the lines it printed so far.
struct PyConsumer {
    name: String,
    child: Child,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
}

fn collect(r: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(|l| l.ok()) {
            if let Ok(mut v) = l.lock() {
                v.push(line);
            }
        }
    });
    lines
}

impl PyConsumer {
    fn start(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        expect: usize,
        client_id: &str,
        stop_file: Option<&Path>,
    ) -> Result<PyConsumer> {
        let mut cmd = Command::new(python()?);
        cmd.arg(script())
            .args([bootstrap, topic])
            .arg(partitions.to_string())
            .arg(expect.to_string())
            .arg(client_id);
        if let Some(f) = stop_file {
            cmd.arg(f);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn the kafka-python consumer")?;
        let out = collect(child.stdout.take().context("stdout")?);
        let err = collect(child.stderr.take().context("stderr")?);
        Ok(PyConsumer {
            name: client_id.to_string(),
            child,
            out,
            err,
        })
    }

    /// Waits (bounded) for the process to end; returns (partition, offset, key) per record.
    fn finish(&mut self) -> Result<Vec<(i32, i64, String)>> {
        let deadline = Instant::now() + CONSUMER_TIMEOUT;
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                bail!("{} still running after {CONSUMER_TIMEOUT:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // The reader threads end at EOF, just after the exit; give them a moment.
        let done_by = Instant::now() + Duration::from_secs(10);
        while !self.lines().iter().any(|l| l.starts_with("DONE ")) && Instant::now() < done_by {
            if !status.success() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let err = self.err.lock().map(|e| e.join("\n")).unwrap_or_default();
        ensure!(status.success(), "{} failed ({status}):\n{err}", self.name);
        let mut got = Vec::new();
        for line in self.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if let ["REC", p, o, k] = f[..] {
                got.push((p.parse()?, o.parse()?, k.to_string()));
            }
        }
        Ok(got)
    }

    fn lines(&self) -> Vec<String> {
        self.out.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for PyConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Produces `records`, record i to `partition_of(i)`, and returns where each key went.
fn produce(
    bootstrap: &str,
    topic: &str,
    records: &[Sent],
    partition_of: impl Fn(usize) -> i32,
) -> Result<BTreeMap<String, i32>> {
    let (p, log) = clients::producer(bootstrap, "all", "none", &[])?;
    let mut want = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        clients::send_one(&p, topic, r, Some(partition_of(i)))?;
        want.insert(String::from_utf8(r.key.clone())?, partition_of(i));
    }
    rdkafka::producer::Producer::flush(&p, clients::CLIENT_TIMEOUT)?;
    ensure!(
        log.failed().is_empty(),
        "produce failed: {:?}",
        log.failed()
    );
    ensure!(log.acked().len() == records.len(), "not every record acked");
    Ok(want)
}

/// Every record of `want` (key → partition) read exactly once, in its partition, and each
/// partition's offsets dense from 0.
fn exactly_once(who: &str, want: &BTreeMap<String, i32>, got: &[(i32, i64, String)]) -> Result<()> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut offsets: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o, k) in got {
        *seen.entry(k.as_str()).or_default() += 1;
        offsets.entry(*p).or_default().push(*o);
        ensure!(
            want.get(k) == Some(p),
            "{who}: {k} read from partition {p}, sent to {:?}",
            want.get(k)
        );
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    ensure!(twice.is_empty(), "{who}: read more than once: {twice:?}");
    ensure!(
        seen.len() == want.len(),
        "{who}: read {} distinct records of {}",
        seen.len(),
        want.len()
    );
    for (p, mut o) in offsets {
        o.sort_unstable();
        ensure!(
            o.iter().copied().eq(0..o.len() as i64),
            "{who}: partition {p} offsets {o:?}"
        );
    }
    Ok(())
}

/// One exchange without its epoch: `s<id> <listed>/<forgotten> -> s<id> <answered>(<with
/// records>) [err N]`.
fn shape(e: &FetchExchange) -> String {
    let sent = e.sent.as_ref().map_or("?".to_string(), |s| {
        format!("s{} {}/{}", s.session_id, s.partitions, s.forgotten)
    });
    let answered = e.answered.as_ref().map_or("-".to_string(), |a| {
        let err = match a.error_code {
            0 => String::new(),
            code => format!(" err {code}"),
        };
        format!(
            "s{} {}({}){err}",
            a.session_id, a.partitions, a.with_records
        )
    });
    format!("{sent} -> {answered}")
}

/// The exchanges in order, runs of one shape folded: `e<first>..e<last> <shape> xN`.
fn summary(ex: &[FetchExchange]) -> String {
    let epoch = |e: &FetchExchange| e.sent.as_ref().map_or(i32::MIN, |s| s.session_epoch);
    let mut runs: Vec<(i32, i32, String, usize)> = Vec::new();
    for e in ex {
        let sh = shape(e);
        match runs.last_mut() {
            Some((_, last, prev, n)) if *prev == sh => {
                *last = epoch(e);
                *n += 1;
            }
            _ => runs.push((epoch(e), epoch(e), sh, 1)),
        }
    }
    runs.iter()
        .map(|(first, last, sh, n)| match (n, first == last) {
            (1, _) => format!("[e{first} {sh}]"),
            (_, true) => format!("[e{first} {sh} x{n}]"),
            (_, false) => format!("[e{first}..e{last} {sh} x{n}]"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn kafka_python_consumer_of_1000_partitions_fetches_incrementally() -> Result<()> {
    const TOPIC: &str = "wide";
    const PARTITIONS: i32 = 1000;
    const CLIENT: &str = "kp-wide";
    let (tap, weir) = tapped(WeirConfig::shards(2))?;
    let bootstrap = tap.addr().to_string();
    clients::create_topics(&weir.bootstrap(), &[TOPIC], PARTITIONS, &[])?;
    // 100 records before the consumer starts (every 10th partition), 300 while its session
    // is open (one each to 300 distinct partitions).
    let first = clients::make_records(0, 100, "before", clients::now_ms());
    let mut want = produce(&bootstrap, TOPIC, &first, |i| (i * 10) as i32)?;
    let mut kp = PyConsumer::start(&bootstrap, TOPIC, PARTITIONS, 400, CLIENT, None)?;

    // Idle incremental rounds: the session open, nothing listed, nothing answered.
    let idle = |e: &FetchExchange| {
        let listed = e
            .sent
            .as_ref()
            .is_some_and(|s| s.session_epoch > 0 && s.partitions == 0 && s.forgotten == 0);
        listed
            && e.answered
                .as_ref()
                .is_some_and(|a| a.error_code == 0 && a.partitions == 0)
    };
    tap.wait_for(CLIENT, WIRE_TIMEOUT, "3 idle incremental fetches", |ex| {
        ex.iter().filter(|e| idle(e)).count() >= 3
    })?;
    let mark = tap.exchanges_of(CLIENT).len();
    let second = clients::make_records(100, 300, "during", clients::now_ms());
    want.extend(produce(&bootstrap, TOPIC, &second, |i| {
        ((i * 7 + 1) % 1000) as i32
    })?);
    let got = kp.finish()?;
    exactly_once(CLIENT, &want, &got)?;

    let mut ex = tap.exchanges_of(CLIENT);
    println!("{CLIENT}: {} fetches: {}", ex.len(), summary(&ex));
    // The fetch in flight when the consumer closed has no answer.
    if ex.last().is_some_and(|e| e.answered.is_none()) {
        ex.pop();
    }
    let Some((full, rest)) = ex.split_first() else {
        bail!("no fetches")
    };
    let (Some(s), Some(a)) = (&full.sent, &full.answered) else {
        bail!("first fetch: {full:?}")
    };
    ensure!(
        (s.session_id, s.session_epoch, s.partitions) == (0, 0, 1000),
        "first fetch is full: {s:?}"
    );
    ensure!(
        a.error_code == 0 && a.session_id != 0,
        "a session was created: {a:?}"
    );
    ensure!(
        a.partitions == 1000,
        "a full fetch answers every partition: {a:?}"
    );
    let session = a.session_id;
    if let Some(i) = rest.iter().find(|e| idle(e)) {
        let (is, ia) = (i.sent.as_ref(), i.answered.as_ref());
        println!(
            "{CLIENT}: full fetch {} B request, {} B response; idle incremental {} B, {} B",
            s.bytes,
            a.bytes,
            is.map_or(0, |s| s.bytes),
            ia.map_or(0, |a| a.bytes)
        );
    }
    ensure!(
        rest.len() >= 5,
        "only {} fetches after the first",
        rest.len()
    );
    for (i, e) in rest.iter().enumerate() {
        let (Some(s), Some(a)) = (&e.sent, &e.answered) else {
            bail!("fetch {}: {e:?}", i + 1)
        };
        let epoch = i32::try_from(i + 1)?;
        ensure!(
            (s.session_id, s.session_epoch) == (session, epoch),
            "fetch {} is incremental: {s:?}",
            i + 1
        );
        ensure!(
            s.partitions < 1000,
            "fetch {} lists only what moved: {s:?}",
            i + 1
        );
        ensure!(
            (a.error_code, a.session_id) == (0, session),
            "fetch {} continues the session: {a:?}",
            i + 1
        );
        ensure!(
            a.partitions < 1000,
            "fetch {} answers only what changed: {a:?}",
            i + 1
        );
    }
    // Only moved partitions are listed: a partition's position moves when a response
    // returned records for it, and kafka-python lists again what it forgot while its
    // records were buffered; so up to each fetch, what was listed is at most what came
    // with records before it plus what was forgotten before it.
    let (mut listed, mut moved) = (0usize, 0usize);
    let mut previous = (full.answered.as_ref().map_or(0, |a| a.with_records), 0usize);
    for (i, e) in rest.iter().enumerate() {
        let (Some(s), Some(a)) = (&e.sent, &e.answered) else {
            bail!("fetch {}", i + 1)
        };
        moved += previous.0 + previous.1;
        listed += s.partitions;
        ensure!(
            listed <= moved,
            "fetch {}: {listed} listed so far, {moved} moved",
            i + 1
        );
        previous = (a.with_records, s.forgotten);
    }
    let idle_fetches = rest.iter().filter(|e| idle(e)).count();
    ensure!(idle_fetches >= 3, "{idle_fetches} idle incremental fetches");
    // Each of the 300 partitions written during the session came back with records in at
    // least one incremental response after the write began.
    // From the fetch in flight when the writes began: its request was recorded before
    // `mark`, and its answer may carry the first of them (kafka-python keeps one fetch in
    // flight per node).
    let with_records: usize = ex[mark.saturating_sub(1)..]
        .iter()
        .filter_map(|e| e.answered.as_ref())
        .map(|a| a.with_records)
        .sum();
    ensure!(
        with_records >= 300,
        "records of 300 partitions in incremental responses: {with_records}"
    );
    ensure!(tap.dropped() == 0);
    drop(weir);
    Ok(())
}

/// Reads `topic`'s partitions from the beginning with librdkafka until `expected` records
/// came (and half a second more for duplicates).
fn librdkafka_consume(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    client_id: &str,
) -> Result<Vec<(i32, i64, String)>> {
    let c = clients::consumer(bootstrap, &[("client.id", client_id)])?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut got = Vec::new();
    let deadline = Instant::now() + CONSUMER_TIMEOUT;
    let mut extra_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if extra_until.is_some_and(|t| now > t) {
            break;
        }
        ensure!(
            now < deadline,
            "{client_id}: {} of {expected} records",
            got.len()
        );
        match c.poll(Duration::from_millis(100)) {
            None | Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Ok(m)) => {
                let g = clients::to_got(&m);
                let key = g
                    .key
                    .map(String::from_utf8)
                    .transpose()?
                    .unwrap_or_default();
                got.push((g.partition, g.offset, key));
            }
            Some(Err(e)) => bail!("{client_id}: {e}"),
        }
        if got.len() >= expected && extra_until.is_none() {
            extra_until = Some(Instant::now() + Duration::from_millis(500));
        }
    }
    Ok(got)
}

#[test]
fn consumers_keep_working_across_a_session_eviction() -> Result<()> {
    const SMALL: &str = "evict-a";
    const BIG: &str = "evict-b";
    const RDK: &str = "rdk-sessionless";
    // One shard, so the one slot is the whole node's.
    let config = WeirConfig::shards(1).set("max.incremental.fetch.session.cache.slots", 1);
    let (tap, weir) = tapped(config)?;
    let bootstrap = tap.addr().to_string();
    clients::create_topics(&weir.bootstrap(), &[SMALL], 4, &[])?;
    clients::create_topics(&weir.bootstrap(), &[BIG], 8, &[])?;
    let first = clients::make_records(0, 200, "before", clients::now_ms());
    let mut want_a = produce(&bootstrap, SMALL, &first, |i| (i % 4) as i32)?;
    let bs = clients::make_records(1000, 100, "big", clients::now_ms());
    let want_b = produce(&bootstrap, BIG, &bs, |i| (i % 8) as i32)?;

    // A (4 partitions) takes the slot; librdkafka reads the same topic sessionless.
    let mut a = PyConsumer::start(&bootstrap, SMALL, 4, 400, "kp-a", None)?;
    let rdk = {
        let bootstrap = bootstrap.clone();
        std::thread::spawn(move || librdkafka_consume(&bootstrap, SMALL, 4, 400, RDK))
    };
    let incremental = |e: &FetchExchange| {
        e.sent.as_ref().is_some_and(|s| s.session_epoch >= 2)
            && e.answered
                .as_ref()
                .is_some_and(|r| r.error_code == 0 && r.session_id != 0)
    };
    tap.wait_for("kp-a", WIRE_TIMEOUT, "an incremental session", |ex| {
        ex.iter().any(incremental)
    })?;

    // B (8 partitions) is worth more: its session evicts A's.
    let stop = tempfile::NamedTempFile::new()?.into_temp_path();
    let stop_file = stop.to_path_buf();
    stop.close()?;
    let mut b = PyConsumer::start(&bootstrap, BIG, 8, 100, "kp-b", Some(&stop_file))?;
    tap.wait_for("kp-b", WIRE_TIMEOUT, "a session", |ex| {
        ex.iter().any(|e| {
            e.answered
                .as_ref()
                .is_some_and(|r| r.error_code == 0 && r.session_id != 0)
        })
    })?;
    let evicted_then_full = |ex: &[FetchExchange]| {
        ex.iter()
            .position(|e| {
                e.answered
                    .as_ref()
                    .is_some_and(|r| r.error_code == FETCH_SESSION_ID_NOT_FOUND)
            })
            .is_some_and(|i| {
                ex[i + 1..].iter().any(|e| {
                    e.sent
                        .as_ref()
                        .is_some_and(|s| (s.session_id, s.session_epoch) == (0, 0))
                        && e.answered.as_ref().is_some_and(|r| r.error_code == 0)
                })
            })
    };
    tap.wait_for(
        "kp-a",
        WIRE_TIMEOUT,
        "FETCH_SESSION_ID_NOT_FOUND, then a full fetch",
        evicted_then_full,
    )?;

    // Records after the eviction reach A (by full fetches) and librdkafka.
    let mark = tap.exchanges_of("kp-a").len();
    let second = clients::make_records(200, 200, "after", clients::now_ms());
    want_a.extend(produce(&bootstrap, SMALL, &second, |i| (i % 4) as i32)?);
    let got_a = a.finish()?;
    let got_rdk = rdk
        .join()
        .map_err(|_| anyhow::anyhow!("librdkafka thread panicked"))??;
    std::fs::write(&stop_file, b"stop")?;
    let got_b = b.finish()?;
    let _ = std::fs::remove_file(&stop_file);
    exactly_once("kp-a", &want_a, &got_a)?;
    exactly_once(RDK, &want_a, &got_rdk)?;
    exactly_once("kp-b", &want_b, &got_b)?;

    let ex_a = tap.exchanges_of("kp-a");
    let ex_b = tap.exchanges_of("kp-b");
    let ex_r = tap.exchanges_of(RDK);
    println!("kp-a: {} fetches: {}", ex_a.len(), summary(&ex_a));
    println!("kp-b: {} fetches: {}", ex_b.len(), summary(&ex_b));
    println!("{RDK}: {} fetches: {}", ex_r.len(), summary(&ex_r));
    // A: after the 70, only full fetches, answered sessionless (the slot is B's), and the
    // records written after the eviction came in them.
    let lost = ex_a
        .iter()
        .position(|e| {
            e.answered
                .as_ref()
                .is_some_and(|r| r.error_code == FETCH_SESSION_ID_NOT_FOUND)
        })
        .context("kp-a was evicted")?;
    for e in &ex_a[lost + 1..] {
        ensure!(e.is_full(), "kp-a falls back to full fetches: {e:?}");
        if let Some(r) = &e.answered {
            ensure!(
                (r.error_code, r.session_id) == (0, 0),
                "kp-a answered sessionless: {r:?}"
            );
        }
    }
    // From the fetch in flight at `mark` (see the other test): its answer may carry the
    // first of the later records.
    let after: usize = ex_a[mark.saturating_sub(1)..]
        .iter()
        .filter_map(|e| e.answered.as_ref())
        .map(|r| r.with_records)
        .sum();
    ensure!(
        after >= 4,
        "kp-a got the later records in full fetches ({after} partitions with records)"
    );
    // B: one session from its first fetch to its last.
    ensure!(
        ex_b.iter().skip(1).all(|e| !e.is_full()),
        "kp-b stays incremental"
    );
    // librdkafka: no session, ever.
    ensure!(ex_r.len() >= 2, "librdkafka fetched through the tap");
    for e in &ex_r {
        let s = e.sent.as_ref().context("decoded")?;
        ensure!(
            (s.session_id, s.session_epoch) == (0, -1),
            "librdkafka sessionless: {s:?}"
        );
        if let Some(r) = &e.answered {
            ensure!((r.error_code, r.session_id) == (0, 0), "{r:?}");
        }
    }
    ensure!(tap.dropped() == 0);
    drop(weir);
    Ok(())
}

/// utime + stime of `pid` so far, in seconds (`/proc/PID/stat` fields 14 and 15).
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .map(|&i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

/// Broker CPU per fetch of 1,000 idle partitions, full (sessionless, all 1,000 in request
/// and response) vs incremental (an open session: empty request, empty response), against
/// any binary: `WEIR_BIN=target/release/weir WEIR_FETCH_BENCH_FETCHES=5000 cargo test -p
/// weir-tests --test fetch_sessions_wire -- --ignored --nocapture` (the same measurement as
/// `node/tests/fetch_sessions.rs`'s ignored bench, which always uses its own profile's
/// binary). Prints µs per fetch; the incremental one must be the cheaper.
#[test]
#[ignore]
fn broker_cpu_per_fetch_of_1000_idle_partitions() -> Result<()> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    const PARTITIONS: i32 = 1000;
    const FETCHES_MAX: usize = 1_000_000;
    let fetches = std::env::var("WEIR_FETCH_BENCH_FETCHES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(500)
        .clamp(1, FETCHES_MAX);
    let weir = Weir::start(WeirConfig::shards(1))?;
    clients::create_topics(&weir.bootstrap(), &["idle"], PARTITIONS, &[])?;
    let pid = weir.pid().context("pid")?;
    // The first fetch opens 1,000 partition logs: give it time on a loaded machine.
    let mut c = weir_tests::raw::RawConn::connect_timeout(weir.addr(), Duration::from_secs(120))?;
    let fetch = |session: i32, epoch: i32, all: bool| {
        let parts = (0..PARTITIONS)
            .map(|p| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)
            })
            .collect::<Vec<_>>();
        let topics = match all {
            true => vec![
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_static_str("idle")))
                    .with_partitions(parts),
            ],
            false => Vec::new(),
        };
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_session_id(session)
            .with_session_epoch(epoch)
            .with_topics(topics)
    };
    let answered = |r: &FetchResponse| {
        r.responses
            .iter()
            .map(|t| t.partitions.len())
            .sum::<usize>()
    };
    let warm: FetchResponse = c
        .call(ApiKey::Fetch, 12, &fetch(0, -1, true))
        .with_context(|| format!("warm-up fetch; broker log:\n{}", weir.log_tail(15)))?;
    ensure!(answered(&warm) == PARTITIONS as usize);
    let full_req = fetch(0, -1, true);
    let cpu0 = cpu_secs(pid)?;
    for _ in 0..fetches {
        let r: FetchResponse = c.call(ApiKey::Fetch, 12, &full_req).context("full fetch")?;
        ensure!(answered(&r) == PARTITIONS as usize);
    }
    let full_cpu = cpu_secs(pid)? - cpu0;
    let opened: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch(0, 0, true))?;
    let id = opened.session_id;
    ensure!(id != 0, "a session");
    let cpu0 = cpu_secs(pid)?;
    for epoch in 1..=i32::try_from(fetches)? {
        let r: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch(id, epoch, false))?;
        ensure!((r.error_code, answered(&r)) == (0, 0));
    }
    let inc_cpu = cpu_secs(pid)? - cpu0;
    let per = |cpu: f64| cpu / fetches as f64 * 1e6;
    println!(
        "broker CPU per fetch of {PARTITIONS} idle partitions: full {:.0} µs, incremental {:.0} µs ({fetches} fetches each; {full_cpu:.2} s vs {inc_cpu:.2} s)",
        per(full_cpu),
        per(inc_cpu)
    );
    ensure!(
        inc_cpu < full_cpu,
        "incremental {inc_cpu:.2} s vs full {full_cpu:.2} s"
    );
    Ok(())
}
