//! The seeds' replication scenarios (issue 11) as named tests against three real `weir`
//! nodes on 127.0.0.1: a restarted leader opens at its checkpointed HW (not its log end),
//! a lagging follower never leads with acknowledged records missing, and the
//! HW-propagation window (KIP-101) ends with no divergence, and a returning leader's
//! divergent tail is truncated by leader epoch. Followers are slowed with SIGSTOP/SIGCONT
//! or cut by the fault proxy (`weir_tests::proxy`, deterministic windows), leaders die by
//! SIGKILL.
//!
//! The 50-cycle soak (SIGKILL and restart of the busiest partition's leader under an
//! idempotent acks=all producer) is `#[ignore]`:
//! `cargo test -p weir-tests --test cluster_scenarios -- --ignored` (see tests/README.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, ListOffsetsRequest, ListOffsetsResponse, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::Producer;
use weir_tests::clients;
use weir_tests::cluster::{self, Cluster, FaultNet};
use weir_tests::proxy::Mode;
use weir_tests::raw::RawConn;

const AGREE_TIMEOUT: Duration = Duration::from_secs(90);
const TOPIC: &str = "scenario";

/// SIGSTOP (`stop`) or SIGCONT a node: it keeps its sockets but answers nothing.
fn pause(c: &mut Cluster, id: i32, stop: bool) {
    let pid = c.node(id).pid().expect("node running");
    let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
    // SAFETY: kill(2) on a child the harness holds and has not reaped.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// (leader, leader epoch, sorted ISR) of partition `p` of `topic` in `m`.
fn placement(m: &MetadataResponse, topic: &str, p: i32) -> Option<(i32, i32, Vec<i32>)> {
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    let part = t.partitions.iter().find(|x| x.partition_index == p)?;
    let mut isr: Vec<i32> = part.isr_nodes.iter().map(|n| n.0).collect();
    isr.sort();
    Some((part.leader_id.0, part.leader_epoch, isr))
}

/// Waits until every node of `ask` reports the same placement of partition `p` and `ok`
/// accepts it; returns it.
fn wait_placement(
    c: &mut Cluster,
    ask: &[i32],
    p: i32,
    ok: impl Fn(&(i32, i32, Vec<i32>)) -> bool,
) -> (i32, i32, Vec<i32>) {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        let seen: Vec<Option<(i32, i32, Vec<i32>)>> = ask
            .iter()
            .map(|id| c.metadata(*id).ok().and_then(|m| placement(&m, TOPIC, p)))
            .collect();
        if let Some(Some(first)) = seen.first()
            && seen.iter().all(|s| s.as_ref() == Some(first))
            && ok(first)
        {
            return first.clone();
        }
        assert!(Instant::now() < deadline, "placement not reached: {seen:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// ListOffsets (v4, read_uncommitted) latest of partition `p` at `id`: its HW when it
/// leads; `Err(code)` otherwise.
fn latest(c: &mut Cluster, id: i32, p: i32) -> Result<i64, i16> {
    list_offset(c, id, p, -1)
}

/// ListOffsets (v4, read_uncommitted) of partition `p` at `id` for `timestamp` (-1 latest,
/// -2 earliest); `Err(code)` for an error or no answer.
fn list_offset(c: &mut Cluster, id: i32, p: i32, timestamp: i64) -> Result<i64, i16> {
    let addr = c.node(id).addr();
    let Ok(mut conn) = RawConn::connect_timeout(addr, Duration::from_secs(10)) else {
        return Err(-1);
    };
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(p)
                        .with_current_leader_epoch(-1)
                        .with_timestamp(timestamp),
                ]),
        ]);
    let resp: Result<ListOffsetsResponse, _> = conn.call(ApiKey::ListOffsets, 4, &req);
    let part = resp
        .ok()
        .and_then(|r| r.topics.into_iter().next())
        .and_then(|t| t.partitions.into_iter().next())
        .ok_or(-1i16)?;
    if part.error_code != 0 {
        return Err(part.error_code);
    }
    Ok(part.offset)
}

/// Waits until `id` answers ListOffsets latest for `p` without an error; returns it.
fn wait_latest(c: &mut Cluster, id: i32, p: i32) -> i64 {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        match latest(c, id, p) {
            Ok(o) => return o,
            Err(code) => assert!(
                Instant::now() < deadline,
                "node {id} never answered ListOffsets: {code}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The HW `replication-offset-checkpoint` in `data_dir` holds for partition `p`, checking
/// the file is in Kafka's format (version 0, the count, `topic partition offset` lines).
fn checkpointed_hw(data_dir: &Path, p: i32) -> Option<i64> {
    let text = std::fs::read_to_string(data_dir.join("replication-offset-checkpoint")).ok()?;
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"), "version line: {text:?}");
    let count: usize = lines.next().and_then(|l| l.parse().ok()).expect("count");
    let entries: Vec<&str> = lines.collect();
    assert_eq!(entries.len(), count, "count line matches: {text:?}");
    entries.iter().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f.len(), 3, "`topic partition offset`: {l:?}");
        (f[0] == TOPIC && f[1] == p.to_string()).then(|| f[2].parse().expect("offset"))
    })
}

fn partition_dir(c: &mut Cluster, id: i32, p: i32) -> PathBuf {
    c.node(id).data_dir().join(format!("{TOPIC}-{p}"))
}

/// The `.log` segment files in `dir`, in offset order.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    segments.retain(|p| p.extension().is_some_and(|e| e == "log"));
    segments.sort();
    segments
}

/// The record batches of every `.log` segment in `dir`, concatenated in offset order, cut
/// at the end of the last whole batch; with the log end offset they reach.
fn log_bytes(dir: &Path) -> (Vec<u8>, i64) {
    let (mut out, mut end) = (Vec::new(), 0i64);
    for seg in segments(dir) {
        let bytes = std::fs::read(&seg).unwrap_or_default();
        let mut at = 0usize;
        while at + 27 <= bytes.len() {
            let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
            let Ok(len) = usize::try_from(i32::from_be_bytes(word(at + 8))) else {
                break;
            };
            if len == 0 || at + 12 + len > bytes.len() {
                break;
            }
            let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
            let last_delta = i32::from_be_bytes(word(at + 23));
            end = base + i64::from(last_delta) + 1;
            out.extend_from_slice(&bytes[at..at + 12 + len]);
            at += 12 + len;
        }
    }
    (out, end)
}

/// Waits until the replicas on `ids` hold identical logs (byte for byte); returns the
/// log end they share.
fn wait_identical(c: &mut Cluster, ids: &[i32], p: i32) -> i64 {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        let logs: Vec<(Vec<u8>, i64)> = ids
            .iter()
            .map(|id| log_bytes(&partition_dir(c, *id, p)))
            .collect();
        if !logs[0].0.is_empty() && logs.windows(2).all(|w| w[0] == w[1]) {
            return logs[0].1;
        }
        if Instant::now() >= deadline {
            let tails: Vec<String> = ids
                .iter()
                .map(|id| format!("--- node {id}:\n{}", c.node(*id).log_tail(30)))
                .collect();
            let ends: Vec<(usize, i64)> = logs.iter().map(|l| (l.0.len(), l.1)).collect();
            panic!(
                "replica logs differ: (bytes, end) {ends:?}\n{}",
                tails.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An idempotent acks=all producer writes `n` records (ids from `first_id`) to partition
/// 0 through node `via`; every delivery must succeed.
fn produce(
    c: &mut Cluster,
    via: i32,
    acks: &str,
    first_id: u64,
    n: u64,
    tag: &str,
) -> (Vec<clients::Sent>, Vec<clients::Acked>) {
    let bootstrap = c.node(via).bootstrap();
    let idempotent = if acks == "all" { "true" } else { "false" };
    let (p, log) = clients::producer(
        &bootstrap,
        acks,
        "none",
        &[("enable.idempotence", idempotent)],
    )
    .expect("producer");
    let records = clients::make_records(first_id, n, tag, clients::now_ms());
    clients::produce_all(&p, TOPIC, &records, Some(0)).expect("produce");
    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
    (records, log.acked())
}

fn start(extra: &[(&str, &str)]) -> Cluster {
    let mut c = Cluster::start(3, extra).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 3).expect("create"), 0);
    c
}

/// Part 1 of the checkpoint's reason to exist: a leader whose log ends past its HW (acks=1
/// records a stopped follower never fetched) is SIGKILLed and restarts while it still
/// leads (no quorum to move leadership while it is down). It must come back at its
/// checkpointed HW — opening at HW = LEO (the old code) exposes to consumers records the
/// ISR never had. Once the follower is back, the HW covers everything.
#[test]
fn a_restarted_leader_opens_at_its_checkpointed_high_watermark() {
    let mut c = start(&[
        ("min.insync.replicas", "1"),
        // Nobody leaves the ISR or is fenced during the test: the HW must wait.
        ("replica.lag.time.max.ms", "600000"),
        ("broker.session.timeout.ms", "60000"),
        ("replica.high.watermark.checkpoint.interval.ms", "0"),
    ]);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    let stopped = followers[1];

    let (mut sent, mut acked) = produce(&mut c, leader, "all", 0, 200, "all");
    assert_eq!(wait_latest(&mut c, leader, 0), 200);
    pause(&mut c, stopped, true);
    let (s, a) = produce(&mut c, leader, "1", 1_000, 100, "one");
    sent.extend(s);
    acked.extend(a);
    assert_eq!(
        wait_latest(&mut c, leader, 0),
        200,
        "the HW waits for the stopped ISR member"
    );
    // The leader's checkpoint (Kafka's format) says 200 before it dies.
    let dir = c.node(leader).data_dir().to_path_buf();
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while checkpointed_hw(&dir, 0) != Some(200) {
        assert!(Instant::now() < deadline, "no checkpoint of HW 200");
        std::thread::sleep(Duration::from_millis(100));
    }

    c.node(leader).kill().expect("SIGKILL the leader");
    c.node(leader).restart().expect("restart");
    let hw = wait_latest(&mut c, leader, 0);
    let (_, log_end) = log_bytes(&partition_dir(&mut c, leader, 0));
    assert_eq!(log_end, 300, "the restarted leader kept its acks=1 tail");
    assert_eq!(
        hw, 200,
        "a restarted leader's HW is its checkpointed one, not its log end {log_end}"
    );

    pause(&mut c, stopped, false);
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while wait_latest(&mut c, leader, 0) != 300 {
        assert!(Instant::now() < deadline, "the HW never covered the tail");
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_identical(&mut c, &[1, 2, 3], 0);
    let got = clients::consume_to_end(&c.node(leader).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(clients::verify(&sent, &acked, &got).expect("verify"), 300);
}

/// The seeds' lagging follower: with `min.insync.replicas=2` one follower is SIGSTOPped
/// while the leader takes acks=all writes (it leaves the ISR after
/// `replica.lag.time.max.ms`, acks go on with two); the leader dies. With unclean leader
/// election off, the lagging replica must not lead — the ISR's last member does — and once
/// it is back nothing acknowledged is missing anywhere.
#[test]
fn a_lagging_follower_never_leads_with_acknowledged_records_missing() {
    let mut c = start(&[
        ("min.insync.replicas", "2"),
        ("replica.lag.time.max.ms", "2000"),
        ("unclean.leader.election.enable", "false"),
    ]);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    let (in_sync, lagging) = (followers[0], followers[1]);

    let (mut sent, mut acked) = produce(&mut c, leader, "all", 0, 100, "a");
    pause(&mut c, lagging, true);
    // Blocks until the lagging one is out of the ISR, then acks=all goes on with two.
    let (s, a) = produce(&mut c, leader, "all", 1_000, 400, "b");
    sent.extend(s);
    acked.extend(a);
    let (_, _, isr) = wait_placement(&mut c, &[leader, in_sync], 0, |p| p.2.len() == 2);
    assert!(!isr.contains(&lagging), "the stopped follower left the ISR");
    let (lagging_bytes, lagging_end) = log_bytes(&partition_dir(&mut c, lagging, 0));
    assert!(
        lagging_end < 500,
        "the lagging replica misses acknowledged records ({lagging_end}, {} bytes)",
        lagging_bytes.len()
    );

    c.node(leader).kill().expect("SIGKILL the leader");
    pause(&mut c, lagging, false);
    // The only ISR member left leads; the lagging replica never does.
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let new_leader = loop {
        let seen: Vec<_> = [in_sync, lagging]
            .iter()
            .map(|id| c.metadata(*id).ok().and_then(|m| placement(&m, TOPIC, 0)))
            .collect();
        for s in seen.iter().flatten() {
            assert_ne!(s.0, lagging, "the lagging replica was elected: {s:?}");
        }
        if let [Some(a), Some(b)] = &seen[..]
            && a == b
            && a.0 == in_sync
        {
            break a.0;
        }
        assert!(Instant::now() < deadline, "no new leader: {seen:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The lagging one catches up from it and rejoins; acks=all needs both.
    wait_placement(&mut c, &[in_sync, lagging], 0, |p| p.2.len() == 2);
    let (s, a) = produce(&mut c, new_leader, "all", 10_000, 300, "c");
    sent.extend(s);
    acked.extend(a);
    c.node(leader).restart().expect("restart the old leader");
    wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3);
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 800);
    let got =
        clients::consume_to_end(&c.node(new_leader).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(clients::verify(&sent, &acked, &got).expect("verify"), 800);
}

/// The leader epochs in `dir`'s `leader-epoch-checkpoint`, as (epoch, start offset).
fn epoch_entries(dir: &Path) -> Vec<(i32, i64)> {
    let text = std::fs::read_to_string(dir.join("leader-epoch-checkpoint")).unwrap_or_default();
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (e, o) = l.split_once(' ')?;
            Some((e.parse().ok()?, o.parse().ok()?))
        })
        .collect()
}

/// Only a Fetch answer carrying the window test's batch (300 records of
/// [`clients::make_records`], ~50 KB) is this large; an answer with no records is ~100
/// bytes.
const BATCH_ANSWER_MIN_BYTES: usize = 16 << 10;

/// [`start`] behind fault proxies ([`Cluster::start_faulty`]).
fn start_faulty(extra: &[(&str, &str)]) -> (Cluster, FaultNet) {
    let (mut c, net) = Cluster::start_faulty(3, extra).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 3).expect("create"), 0);
    (c, net)
}

fn sorted(mut ids: Vec<i32>) -> Vec<i32> {
    ids.sort();
    ids
}

/// The lines of node `id`'s log (all its runs) that contain every one of `words`.
fn log_lines(c: &mut Cluster, id: i32, words: &[&str]) -> Vec<String> {
    c.node(id)
        .log_text()
        .lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .map(str::to_string)
        .collect()
}

/// The HW-propagation window (KIP-101), made to happen every run by the fault proxy. The
/// only follower in the ISR (the other one's fetches are cut: it left) fetches the last
/// acks=all batch — that answer passes the proxy — and its next fetch, at the new log
/// end, moves the leader's HW and acknowledges the producer; the answer to it, carrying
/// the new HW, is held by the proxy. The leader is SIGKILLed: the follower holds every
/// acknowledged record and, its checkpoint shows, a HW below them. It becomes leader
/// under a new epoch without cutting its log to its HW (its epoch checkpoint starts the
/// new epoch at its log end, 300), takes new writes, and the old leader returns and
/// follows: its log already ends at the end of its last epoch on the new leader, so
/// nothing is cut and nothing diverges — every replica byte-identical, every acknowledged
/// record present once.
#[test]
fn the_hw_propagation_window_loses_nothing_and_ends_without_divergence() {
    let (mut c, net) = start_faulty(&[
        ("min.insync.replicas", "2"),
        // Long enough that `next`, whose fetches stop once the proxy holds an answer, is
        // still in the ISR when the leader is killed, on a loaded machine; `cut` takes
        // this long to leave it.
        ("replica.lag.time.max.ms", "8000"),
        ("replica.high.watermark.checkpoint.interval.ms", "0"),
        // Housekeeping (and so the HW checkpoint) every 100 ms.
        ("log.retention.check.interval.ms", "100"),
    ]);
    let (old, epoch, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != old).collect();
    let (next, cut) = (followers[0], followers[1]);
    // `cut` leaves the ISR: the HW is what `old` and `next` both hold.
    net.cut_fetches(cut, old, Mode::Blackhole);
    let pair = sorted(vec![old, next]);
    wait_placement(&mut c, &[1, 2, 3], 0, |p| p.0 == old && p.2 == pair);
    // `next` gets the answer carrying the batch, and no later one.
    net.cut_fetches(
        next,
        old,
        Mode::HoldAfterResponse {
            min_bytes: BATCH_ANSWER_MIN_BYTES,
        },
    );

    // One batch: the 300 records are queued long before the linger ends.
    let bootstrap = c.node(old).bootstrap();
    let (producer, log) = clients::producer(
        &bootstrap,
        "all",
        "none",
        &[("enable.idempotence", "true"), ("linger.ms", "1000")],
    )
    .expect("producer");
    let mut sent = clients::make_records(0, 300, "before", clients::now_ms());
    clients::produce_all(&producer, TOPIC, &sent, Some(0)).expect("produce");
    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
    let mut acked = log.acked();
    assert_eq!(acked.len(), 300, "every acks=all record acknowledged");
    assert_eq!(
        latest(&mut c, old, 0),
        Ok(300),
        "the leader's HW covers them"
    );
    // The follower holds every one (its fetch at 300 moved the HW; the file may show the
    // append a moment later), and the window is open: the leader answered that fetch
    // (with HW 300) and the proxy holds the answer, so the follower's HW (checkpointed
    // every 100 ms) is below them — however late the kill comes.
    let next_dir = partition_dir(&mut c, next, 0);
    let fetcher = cluster::fetcher_client_id(next);
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let mut follower_hw = None;
    while log_bytes(&next_dir).1 != 300
        || follower_hw.is_none()
        || net.listener(old).client_stats(&fetcher).held_down == 0
    {
        assert!(
            Instant::now() < deadline,
            "the follower holds {} records, checkpointed HW {follower_hw:?}, proxy {:?}",
            log_bytes(&next_dir).1,
            net.listener(old).client_stats(&fetcher)
        );
        std::thread::sleep(Duration::from_millis(50));
        follower_hw = checkpointed_hw(c.node(next).data_dir(), 0);
    }
    c.node(old).kill().expect("SIGKILL the leader");
    drop(producer);
    let window_hw = follower_hw.unwrap_or(i64::MAX);
    assert!(
        window_hw < 300,
        "HW-propagation window missed: the follower's HW {window_hw} covers its log end 300"
    );

    // `next`, in the ISR, leads under a new epoch, its log intact (not cut to its HW).
    let (leader, new_epoch, _) =
        wait_placement(&mut c, &[next, cut], 0, |p| p.0 == next && p.1 > epoch);
    assert_eq!(log_bytes(&next_dir).1, 300, "the new leader kept its log");
    eprintln!(
        "window: the follower's HW {window_hw} below its log end 300; it leads in epoch \
         {new_epoch}"
    );
    // `cut` catches up from it and rejoins; the old leader's proxy passes again.
    net.heal();
    let pair = sorted(vec![next, cut]);
    wait_placement(&mut c, &[next, cut], 0, |p| p.2 == pair);
    let (s, a) = produce(&mut c, leader, "all", 10_000, 200, "after");
    sent.extend(s);
    acked.extend(a);
    let entries = epoch_entries(&next_dir);
    assert_eq!(
        entries.last(),
        Some(&(new_epoch, 300)),
        "the new epoch starts at the log end the follower had, not its HW: {entries:?}"
    );

    c.node(old).restart().expect("restart the old leader");
    net.retarget(&mut c, old);
    wait_placement(&mut c, &[1, 2, 3], 0, |p| p.0 == next && p.2.len() == 3);
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 500);
    // The old leader's log ended where its epoch ends on the new leader: nothing to cut
    // (a truncation to its HW would have dropped acknowledged records to fetch them
    // again), and its epochs are the new leader's.
    let cuts = log_lines(&mut c, old, &["truncated as follower"]);
    assert!(cuts.is_empty(), "the old leader cut its log: {cuts:?}");
    assert_eq!(
        epoch_entries(&partition_dir(&mut c, old, 0)),
        entries,
        "the old leader's epochs end at the new leader's boundary"
    );
    let got = clients::consume_to_end(&c.node(leader).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(clients::verify(&sent, &acked, &got).expect("verify"), 500);
}

/// A divergent tail (KIP-101/279): the leader takes acks=1 writes no follower gets (both
/// followers' fetches are cut; `replica.lag.time.max.ms` is long, so both stay in the ISR
/// and either may be elected), is SIGKILLed, a follower leads under a new epoch and takes
/// acks=all writes where the old tail was. The old leader returns as a follower: its
/// fetch names its last epoch, the new leader answers where that epoch ended (KIP-320's
/// diverging epoch, `node/src/replication/fetcher.rs`), and it truncates its tail there
/// — its log says so — and ends byte-identical to the new leader. The acks=1 records
/// never replicated are gone (the loss acks=1 accepts); no acks=all record is lost.
#[test]
fn a_returning_leader_truncates_its_divergent_tail_by_leader_epoch() {
    let (mut c, net) = start_faulty(&[
        ("min.insync.replicas", "2"),
        ("replica.lag.time.max.ms", "600000"),
    ]);
    let (old, epoch, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != old).collect();
    let (mut sent, mut acked) = produce(&mut c, old, "all", 0, 200, "replicated");
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 200);

    for f in &followers {
        net.cut_fetches(*f, old, Mode::Blackhole);
    }
    let (doomed, doomed_acked) = produce(&mut c, old, "1", 1_000, 100, "doomed");
    assert_eq!(
        doomed_acked.len(),
        100,
        "acks=1: the leader alone acknowledges"
    );
    assert_eq!(log_bytes(&partition_dir(&mut c, old, 0)).1, 300);
    for f in &followers {
        assert_eq!(
            log_bytes(&partition_dir(&mut c, *f, 0)).1,
            200,
            "follower {f} got none of the tail"
        );
    }
    assert_eq!(latest(&mut c, old, 0), Ok(200), "the HW waits for the ISR");

    c.node(old).kill().expect("SIGKILL the leader");
    // It is fenced and leaves the ISR; a follower leads in a new epoch.
    let (leader, new_epoch, _) = wait_placement(&mut c, &followers, 0, |p| {
        p.0 != old && p.0 > 0 && p.1 > epoch && p.2 == followers
    });
    let (s, a) = produce(&mut c, leader, "all", 10_000, 200, "new-epoch");
    sent.extend(s);
    acked.extend(a);
    let leader_dir = partition_dir(&mut c, leader, 0);
    let entries = epoch_entries(&leader_dir);
    assert_eq!(
        entries.last(),
        Some(&(new_epoch, 200)),
        "the new epoch starts where the replicated log ended: {entries:?}"
    );

    net.heal();
    c.node(old).restart().expect("restart the old leader");
    net.retarget(&mut c, old);
    wait_placement(&mut c, &[1, 2, 3], 0, |p| p.0 == leader && p.2.len() == 3);
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 400);
    let diverged = log_lines(&mut c, old, &["diverged from its leader"]);
    assert!(
        !diverged.is_empty(),
        "the old leader never saw its divergence:\n{}",
        c.node(old).log_tail(40)
    );
    let cuts = log_lines(&mut c, old, &["truncated as follower", "offset=200"]);
    assert!(
        !cuts.is_empty(),
        "the old leader did not cut its tail at 200 ({diverged:?}):\n{}",
        c.node(old).log_tail(40)
    );
    eprintln!(
        "the old leader's log:\n{}\n{}",
        diverged.join("\n"),
        cuts.join("\n")
    );
    assert_eq!(
        epoch_entries(&partition_dir(&mut c, old, 0)),
        entries,
        "the old leader's epochs are the new leader's"
    );
    let got = clients::consume_to_end(&c.node(leader).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(clients::verify(&sent, &acked, &got).expect("verify"), 400);
    let gone: std::collections::BTreeSet<u64> = doomed.iter().map(|r| r.id).collect();
    let back: Vec<u64> = got
        .iter()
        .filter_map(clients::header_id)
        .filter(|id| gone.contains(id))
        .collect();
    assert!(
        back.is_empty(),
        "acks=1 records never replicated came back: {back:?}"
    );
}

/// Partitions of the soak's topic; partition 0 takes half the records (the busiest).
const SOAK_PARTITIONS: i32 = 3;
/// Records the soak's producer sends per second (bounded load on a shared CI machine).
const SOAK_RATE: u64 = 400;

/// The partition record `id` goes to: 0 for every other one, else 1 or 2.
fn soak_partition(id: u64) -> i32 {
    match id % 4 {
        0 | 2 => 0,
        1 => 1,
        _ => 2,
    }
}

/// The Show: an idempotent acks=all producer writes numbered records while the
/// node leading the busiest partition is SIGKILLed and restarted, `cycles` times; each
/// cycle waits for a new leader, restarts the node and waits for the full ISR again. At
/// the end every acknowledged record is read back exactly once and in order per
/// partition, and the replicas' segment files are identical (every replica holds the
/// whole log, the HW covers it).
fn soak(cycles: usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut c = Cluster::start(3, &[("min.insync.replicas", "2")]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(
        cluster::create_topic(addr, TOPIC, SOAK_PARTITIONS, 3).expect("create"),
        0
    );
    for p in 0..SOAK_PARTITIONS {
        wait_placement(&mut c, &[1, 2, 3], p, |x| x.2.len() == 3 && x.0 > 0);
    }
    let bootstrap = (1..=3)
        .map(|id| c.node(id).bootstrap())
        .collect::<Vec<_>>()
        .join(",");
    let (producer, log) = clients::producer(
        &bootstrap,
        "all",
        "none",
        &[
            ("enable.idempotence", "true"),
            ("message.timeout.ms", "300000"),
            ("linger.ms", "2"),
        ],
    )
    .expect("producer");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = Vec::new();
            let started = Instant::now();
            let mut id = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let r = clients::make_records(id, 1, "soak", clients::now_ms()).remove(0);
                clients::send_one(&producer, TOPIC, &r, Some(soak_partition(id))).expect("send");
                sent.push(r);
                id += 1;
                let due = started + Duration::from_micros(id * 1_000_000 / SOAK_RATE);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            producer
                .flush(Duration::from_secs(300))
                .expect("flush after the soak");
            sent
        })
    };
    let cycle_started = Instant::now();
    for cycle in 0..cycles {
        let (leader, epoch, _) = wait_placement(&mut c, &[1, 2, 3], 0, |x| x.2.len() == 3);
        let at = Instant::now();
        c.node(leader)
            .kill()
            .expect("SIGKILL the busiest partition's leader");
        let live: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
        wait_placement(&mut c, &live, 0, |x| x.0 != leader && x.1 > epoch);
        let failover = at.elapsed();
        c.node(leader).restart().expect("restart");
        for p in 0..SOAK_PARTITIONS {
            wait_placement(&mut c, &[1, 2, 3], p, |x| x.2.len() == 3 && x.0 > 0);
        }
        eprintln!(
            "cycle {cycle}: killed node {leader} (epoch {epoch}); new leader in {failover:?}; \
             full ISR again after {:?}; {} acked so far",
            at.elapsed(),
            log.acked().len()
        );
    }
    stop.store(true, Ordering::SeqCst);
    let sent = writer.join().expect("writer thread");
    let acked = log.acked();
    eprintln!(
        "{cycles} cycles in {:?}: {} sent, {} acked, {} failed",
        cycle_started.elapsed(),
        sent.len(),
        acked.len(),
        log.failed().len()
    );
    assert!(
        log.failed().is_empty(),
        "failed deliveries: {:?}",
        &log.failed()[..log.failed().len().min(5)]
    );
    for p in 0..SOAK_PARTITIONS {
        wait_identical(&mut c, &[1, 2, 3], p);
    }
    let all: Vec<i32> = (0..SOAK_PARTITIONS).collect();
    // Restarted nodes listen on new ports.
    let bootstrap = c.node(1).bootstrap();
    let got = clients::consume_to_end(&bootstrap, TOPIC, &all).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record, once, in order");
    assert_eq!(checked, sent.len(), "every record sent was acknowledged");
}

/// A follower SIGKILLed with its writes in flight must not have acknowledged them: a
/// follower's fetch offset, which the leader counts into the HW, is the end of its
/// completed writes. Each cycle SIGKILLs a follower of the busiest partition under the
/// idempotent acks=all producer, restarts it at once (long before its session could
/// expire, so it stays in the ISR), waits for the controller to see its new broker epoch,
/// then SIGKILLs the leader, so the restarted follower may be elected: every acknowledged
/// record is read back once, in order, and the replicas end identical.
#[test]
fn a_follower_killed_while_writing_then_its_leader_loses_nothing_acknowledged() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const CYCLES: usize = 3;
    let mut c = Cluster::start(3, &[("min.insync.replicas", "2")]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(
        cluster::create_topic(addr, TOPIC, SOAK_PARTITIONS, 3).expect("create"),
        0
    );
    for p in 0..SOAK_PARTITIONS {
        wait_placement(&mut c, &[1, 2, 3], p, |x| x.2.len() == 3 && x.0 > 0);
    }
    let bootstrap = (1..=3)
        .map(|id| c.node(id).bootstrap())
        .collect::<Vec<_>>()
        .join(",");
    let (producer, log) = clients::producer(
        &bootstrap,
        "all",
        "none",
        &[
            ("enable.idempotence", "true"),
            ("message.timeout.ms", "300000"),
            ("linger.ms", "2"),
        ],
    )
    .expect("producer");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = Vec::new();
            let started = Instant::now();
            let mut id = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let r = clients::make_records(id, 1, "restart", clients::now_ms()).remove(0);
                clients::send_one(&producer, TOPIC, &r, Some(soak_partition(id))).expect("send");
                sent.push(r);
                id += 1;
                let due = started + Duration::from_micros(id * 1_000_000 / SOAK_RATE);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            producer
                .flush(Duration::from_secs(300))
                .expect("flush after the cycles");
            sent
        })
    };
    let restarts_seen = |c: &mut Cluster, follower: i32| -> usize {
        let node = format!("node={follower}");
        (1..=3)
            .map(|id| {
                log_lines(
                    c,
                    id,
                    &["node restarted: it registers a new broker epoch", &node],
                )
                .len()
            })
            .sum()
    };
    for cycle in 0..CYCLES {
        let (leader, epoch, _) = wait_placement(&mut c, &[1, 2, 3], 0, |x| x.2.len() == 3);
        let follower = (1..=3)
            .filter(|id| *id != leader)
            .nth(cycle % 2)
            .expect("two followers");
        let seen = restarts_seen(&mut c, follower);
        c.node(follower).kill().expect("SIGKILL a follower");
        c.node(follower).restart().expect("restart it at once");
        let deadline = Instant::now() + AGREE_TIMEOUT;
        while restarts_seen(&mut c, follower) == seen {
            assert!(
                Instant::now() < deadline,
                "the controller never saw node {follower} restart:\n{}",
                c.log_tails(30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c.node(leader).kill().expect("SIGKILL the leader");
        let live: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
        wait_placement(&mut c, &live, 0, |x| x.0 != leader && x.1 > epoch);
        c.node(leader).restart().expect("restart the leader");
        for p in 0..SOAK_PARTITIONS {
            wait_placement(&mut c, &[1, 2, 3], p, |x| x.2.len() == 3 && x.0 > 0);
        }
        eprintln!(
            "cycle {cycle}: follower {follower} restarted, leader {leader} killed; {} acked so far",
            log.acked().len()
        );
    }
    stop.store(true, Ordering::SeqCst);
    let sent = writer.join().expect("writer thread");
    let acked = log.acked();
    assert!(
        log.failed().is_empty(),
        "failed deliveries: {:?}",
        &log.failed()[..log.failed().len().min(5)]
    );
    for p in 0..SOAK_PARTITIONS {
        wait_identical(&mut c, &[1, 2, 3], p);
    }
    let all: Vec<i32> = (0..SOAK_PARTITIONS).collect();
    let got = clients::consume_to_end(&c.node(1).bootstrap(), TOPIC, &all).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record, once, in order");
    assert_eq!(checked, sent.len(), "every record sent was acknowledged");
}

/// A power failure's lost tail on a SIGKILLed node: its last segment cut to half its
/// length. Asserts the cut took some of the `acked` records (the log end falls below).
fn cut_last_segment_in_half(dir: &Path, acked: i64) {
    let segments = segments(dir);
    let last = segments.last().expect("a segment");
    let len = std::fs::metadata(last).expect("segment").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(last)
        .and_then(|f| f.set_len(len / 2))
        .expect("cut the segment");
    let cut_end = log_bytes(dir).1;
    assert!(
        cut_end < acked,
        "the cut took acknowledged records: {cut_end}"
    );
}

/// The three replicas end byte-identical at `end`, and a consumer through node `via`
/// reads every acknowledged record once, in order.
fn all_identical_and_read_back(
    c: &mut Cluster,
    via: i32,
    (sent, acked): (&[clients::Sent], &[clients::Acked]),
    end: i64,
) {
    assert_eq!(wait_identical(c, &[1, 2, 3], 0), end);
    let got = clients::consume_to_end(&c.node(via).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(
        clients::verify(sent, acked, &got).expect("verify"),
        end as usize
    );
}

/// A follower back from a power failure without records it had acknowledged: SIGKILLed,
/// its segment cut short (the unflushed tail a power failure takes), restarted. Its first
/// fetch under its new broker epoch starts below the HW, and the leader drops it from the
/// ISR at once. It does not wait out `replica.lag.time.max.ms` (two minutes here), so no
/// election can count on it for records it no longer holds. It catches up, rejoins, and
/// nothing acknowledged is lost.
#[test]
fn a_follower_back_without_acknowledged_records_leaves_the_isr_at_once() {
    const LOST: &str = "a follower restarted without records it had acknowledged";
    // A session long enough that the quick restart is not fenced (which would also
    // take the node out of the ISR, for another reason).
    let mut c = start(&[
        ("min.insync.replicas", "2"),
        ("replica.lag.time.max.ms", "120000"),
        ("broker.session.timeout.ms", "30000"),
    ]);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let (mut sent, mut acked) = produce(&mut c, leader, "all", 0, 500, "a");
    let dir = partition_dir(&mut c, follower, 0);
    assert_eq!(
        log_bytes(&dir).1,
        500,
        "the follower holds every acked record"
    );
    c.node(follower).kill().expect("SIGKILL the follower");
    cut_last_segment_in_half(&dir, 500);

    // A proposal whose ISR (logged as `isr=[NodeId(..), ..]`) does not name the follower.
    let leaving = |c: &mut Cluster| {
        let node = format!("NodeId({follower})");
        log_lines(c, leader, &["proposing an ISR change"])
            .into_iter()
            .any(|l| !l.contains(&node))
    };
    assert!(!leaving(&mut c), "no shrink before the restart");
    let started = Instant::now();
    c.node(follower).restart().expect("restart the follower");
    // Well before the two minutes of lag time: only the lost records can explain it.
    let deadline = started + Duration::from_secs(60);
    while log_lines(&mut c, leader, &[LOST, &format!("follower={follower}")]).is_empty()
        || !leaving(&mut c)
    {
        assert!(
            Instant::now() < deadline,
            "the leader kept node {follower} in the ISR:\n{}",
            log_lines(&mut c, leader, &["ISR"]).join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // It catches up and rejoins; acks=all goes on with all three.
    wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3);
    let (s, a) = produce(&mut c, leader, "all", 1_000, 300, "b");
    sent.extend(s);
    acked.extend(a);
    all_identical_and_read_back(&mut c, follower, (&sent, &acked), 800);
}

/// A power failure on the leader, then a restart quick enough that it still leads: its
/// log lost records it acknowledged (its segment is cut, as an unsynced tail is), and its
/// HW checkpoint says so. Leading on under the same epoch, it would make both followers,
/// which hold those records, cut them to its end (their fetch offsets are past it). It
/// must instead refuse to serve under that epoch and resign: a follower leads under a
/// newer one, and every acknowledged record survives.
#[test]
fn a_leader_back_without_acknowledged_records_resigns_and_loses_nothing() {
    const RESIGNS: &str = "leader resigns its epoch: its log reopened without records";
    // A session long enough that the quick restart is not fenced (which would move the
    // leadership for another reason).
    let mut c = start(&[
        ("min.insync.replicas", "2"),
        ("replica.lag.time.max.ms", "120000"),
        ("broker.session.timeout.ms", "30000"),
        ("replica.high.watermark.checkpoint.interval.ms", "0"),
    ]);
    let (leader, epoch, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let (mut sent, mut acked) = produce(&mut c, leader, "all", 0, 500, "a");
    let data_dir = c.node(leader).data_dir().to_path_buf();
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while checkpointed_hw(&data_dir, 0) != Some(500) {
        assert!(Instant::now() < deadline, "no checkpoint of HW 500");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.node(leader).kill().expect("SIGKILL the leader");
    let dir = partition_dir(&mut c, leader, 0);
    cut_last_segment_in_half(&dir, 500);
    c.node(leader).restart().expect("restart the leader");

    // Another node leads under a newer epoch. (The old leader leaves the ISR with its
    // resignation, but may be back in it by the time the placement is read.)
    let (now, new_epoch, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.0 > 0 && p.0 != leader);
    assert!(
        new_epoch > epoch,
        "a newer leader epoch: {new_epoch} after {epoch}"
    );
    assert!(
        !log_lines(&mut c, leader, &[RESIGNS]).is_empty(),
        "the old leader says why it resigned:\n{}",
        c.node(leader).log_tail(30)
    );
    // Neither follower cut anything: not to the damaged leader's end (the fetcher's
    // "truncating" lines), nor otherwise ("truncated as follower").
    for id in (1..=3).filter(|id| *id != leader) {
        let cuts = log_lines(&mut c, id, &["truncat"]);
        assert!(cuts.is_empty(), "node {id} cut its log: {cuts:?}");
    }
    // The old leader follows, catches up and rejoins; acks=all goes on with all three.
    let (s, a) = produce(&mut c, now, "all", 1_000, 300, "b");
    sent.extend(s);
    acked.extend(a);
    wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3);
    all_identical_and_read_back(&mut c, leader, (&sent, &acked), 800);
}

/// A node down while its topic is deleted and created again under the same name comes
/// back to the old incarnation's directory. It must not take those records for the new
/// topic's: its `partition.metadata` names the old topic id, so the directory is set
/// aside and the replica copies the new topic from its leader, ending byte-identical.
/// The node is a broker (not a voter): it starts from an empty catalogue, so it never
/// sees the old topic deleted, only the new one.
#[test]
fn a_deleted_topics_replica_is_not_taken_for_its_successors() {
    const ASIDE: &str = "a deleted topic's partition directory";
    const ALL: [i32; 4] = [1, 2, 3, 4];
    const BROKER: i32 = 4;
    // A session long enough that the stopped broker is still live when the topic is
    // created again, so the new topic is placed on it too; short enough that, should it
    // be chosen to lead, the leadership moves on soon.
    let extra = [
        ("min.insync.replicas", "1"),
        ("broker.session.timeout.ms", "20000"),
        ("replica.high.watermark.checkpoint.interval.ms", "0"),
    ];
    let mut c = Cluster::start_with_brokers(3, 1, &extra).expect("start cluster");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 4).expect("create"), 0);
    let (leader, _, _) = wait_placement(&mut c, &ALL, 0, |p| p.2.len() == 4 && p.0 > 0);
    // Three producers, so the old log has batches that end at 100 and 200.
    for i in 0..3 {
        produce(&mut c, leader, "all", i * 100, 100, "old");
    }
    let dir = partition_dir(&mut c, BROKER, 0);
    let data_dir = c.node(BROKER).data_dir().to_path_buf();
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while log_bytes(&dir).1 < 300 || checkpointed_hw(&data_dir, 0) != Some(300) {
        assert!(
            Instant::now() < deadline,
            "the broker never held and checkpointed the records"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.node(BROKER).kill().expect("SIGKILL the broker");
    assert_eq!(cluster::delete_topic(addr, TOPIC).expect("delete"), 0);
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while (1..=3).any(|id| {
        c.metadata(id)
            .ok()
            .is_none_or(|m| placement(&m, TOPIC, 0).is_some())
    }) {
        assert!(Instant::now() < deadline, "the topic was never deleted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 4).expect("create"), 0);
    // The new topic takes records before the broker is back (acks=1: the broker is
    // still in the ISR). Adopting the old directory, the broker would fetch from its
    // old end, learn that epoch 0 ends at 100 on the leader, cut its log there and keep
    // the old records below it: a replica diverged under the same offsets and epoch.
    let (now, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.0 > 0 && p.0 != BROKER);
    let (sent, acked) = produce(&mut c, now, "1", 10_000, 100, "new");
    c.node(BROKER).restart().expect("restart the broker");
    wait_placement(&mut c, &ALL, 0, |p| p.2.len() == 4 && p.0 > 0);
    assert_eq!(wait_identical(&mut c, &ALL, 0), 100);
    assert!(
        !log_lines(&mut c, BROKER, &[ASIDE]).is_empty(),
        "the old directory was set aside:\n{}",
        c.node(BROKER).log_tail(30)
    );
    // The old topic's checkpointed HW (300) is not read as records the new log lost.
    let lost = log_lines(&mut c, BROKER, &["below its checkpointed high watermark"]);
    assert!(
        lost.is_empty(),
        "a deleted topic's HW taken for a loss: {lost:?}"
    );
    assert!(checkpointed_hw(&data_dir, 0).is_some_and(|hw| hw <= 100));
    let got = clients::consume_to_end(&c.node(now).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(clients::verify(&sent, &acked, &got).expect("verify"), 100);
}

/// Five cycles of [`soak`]: in the default suite.
#[test]
fn the_busiest_leader_sigkilled_5_times_loses_nothing_acknowledged() {
    soak(5);
}

/// The 50 cycles: `cargo test -p weir-tests --test cluster_scenarios -- --ignored`.
#[test]
#[ignore = "50 SIGKILL cycles, several minutes"]
fn the_busiest_leader_sigkilled_50_times_loses_nothing_acknowledged() {
    soak(50);
}

/// A leader back with an empty data dir (wiped, or a new disk) under the same node id,
/// before its session expired. Its `directory.id` is new, so the controller takes it out
/// of every ISR and gives its leadership to another ISR member under a newer epoch: it
/// does not lead on at the old epoch with an empty log, which made its followers cut
/// every acknowledged record to match it. It follows, copies the log back and rejoins.
/// The node is a broker (not a voter), so only its partition data is lost, not the
/// quorum's state.
#[test]
fn a_leader_back_with_an_empty_data_dir_leaves_its_isr_and_loses_nothing() {
    const REPLACED: &str = "its storage was replaced";
    const BROKER: i32 = 4;
    const ALL: [i32; 4] = [1, 2, 3, 4];
    // A session long enough that the restart is not fenced (which would move the
    // leadership for another reason).
    let extra = [
        ("min.insync.replicas", "2"),
        ("replica.lag.time.max.ms", "120000"),
        ("broker.session.timeout.ms", "30000"),
    ];
    let mut c = Cluster::start_with_brokers(3, 1, &extra).expect("start cluster");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    let placed = cluster::create_topic_assigned(addr, TOPIC, &[vec![BROKER, 1, 2]]);
    assert_eq!(placed.expect("create"), 0);
    let (_, epoch, _) = wait_placement(&mut c, &ALL, 0, |p| p.2.len() == 3 && p.0 == BROKER);
    let (mut sent, mut acked) = produce(&mut c, BROKER, "all", 0, 500, "a");
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while [1, 2]
        .iter()
        .any(|id| log_bytes(&partition_dir(&mut c, *id, 0)).1 < 500)
    {
        assert!(
            Instant::now() < deadline,
            "the followers never held the records"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.node(BROKER).kill().expect("SIGKILL the leader");
    let data_dir = c.node(BROKER).data_dir().to_path_buf();
    std::fs::remove_dir_all(&data_dir).expect("wipe the leader's data dir");
    c.node(BROKER)
        .restart()
        .expect("restart the leader on an empty data dir");

    let (now, new_epoch, _) = wait_placement(&mut c, &ALL, 0, |p| p.0 > 0 && p.0 != BROKER);
    assert!(
        new_epoch > epoch,
        "a newer leader epoch: {new_epoch} after {epoch}"
    );
    assert!(
        (1..=3).any(|id| !log_lines(&mut c, id, &[REPLACED]).is_empty()),
        "the controller says the storage was replaced:\n{}",
        c.log_tails(30)
    );
    // Neither follower cut anything, and both still hold every acknowledged record.
    for id in [1, 2] {
        let cuts = log_lines(&mut c, id, &["truncat"]);
        assert!(cuts.is_empty(), "node {id} cut its log: {cuts:?}");
        let end = log_bytes(&partition_dir(&mut c, id, 0)).1;
        assert!(end >= 500, "node {id} holds up to {end}");
    }
    // The wiped node follows, copies everything back and rejoins the ISR.
    let (s, a) = produce(&mut c, now, "all", 1_000, 300, "b");
    sent.extend(s);
    acked.extend(a);
    wait_placement(&mut c, &ALL, 0, |p| p.2.len() == 3);
    assert_eq!(wait_identical(&mut c, &[1, 2, BROKER], 0), 800);
    let got = clients::consume_to_end(&c.node(now).bootstrap(), TOPIC, &[0]).expect("consume");
    assert_eq!(clients::verify(&sent, &acked, &got).expect("verify"), 800);
}

/// A broker-only node down while a topic is deleted (and not created again) starts from
/// an empty image, so it never sees the topic go: its directory stayed for ever. Once
/// its image registers this process (so it holds every change committed before), the
/// node removes the directories of topics the image does not have, and keeps those of
/// topics it has.
#[test]
fn a_topic_deleted_while_a_broker_was_down_leaves_no_directory_on_it() {
    const GONE: &str = "deleted-meanwhile";
    const BROKER: i32 = 4;
    let extra = [("min.insync.replicas", "1")];
    let mut c = Cluster::start_with_brokers(3, 1, &extra).expect("start cluster");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(cluster::create_topic(addr, TOPIC, 1, 4).expect("create"), 0);
    assert_eq!(cluster::create_topic(addr, GONE, 1, 4).expect("create"), 0);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3, 4], 0, |p| p.2.len() == 4 && p.0 > 0);
    produce(&mut c, leader, "all", 0, 100, "kept");
    let kept = partition_dir(&mut c, BROKER, 0);
    let gone = c.node(BROKER).data_dir().join(format!("{GONE}-0"));
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while !gone.join("partition.metadata").exists() || log_bytes(&kept).1 < 100 {
        assert!(
            Instant::now() < deadline,
            "the broker never held both partitions"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.node(BROKER).kill().expect("SIGKILL the broker");
    assert_eq!(cluster::delete_topic(addr, GONE).expect("delete"), 0);
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while (1..=3).any(|id| {
        c.metadata(id)
            .ok()
            .is_none_or(|m| placement(&m, GONE, 0).is_some())
    }) {
        assert!(Instant::now() < deadline, "the topic was never deleted");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.node(BROKER).restart().expect("restart the broker");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true)
        .expect("the broker is back");
    let deadline = Instant::now() + Duration::from_secs(20);
    while gone.exists() {
        assert!(
            Instant::now() < deadline,
            "the deleted topic's directory stayed:\n{}",
            c.node(BROKER).log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        log_bytes(&kept).1 >= 100,
        "the kept topic's directory was touched"
    );
}

/// DeleteRecords (v2) of partition 0 before `offset` at node `id`, waiting at most
/// `timeout_ms`: (error, low watermark).
fn delete_records(c: &mut Cluster, id: i32, offset: i64, timeout_ms: i32) -> (i16, i64) {
    delete_records_of(c, id, &[(TOPIC, offset)], timeout_ms)[0]
}

/// DeleteRecords (v2) of partition 0 of each named topic below its offset, in one request
/// at `id`: (error, low watermark) per topic, in request order.
fn delete_records_of(
    c: &mut Cluster,
    id: i32,
    topics: &[(&str, i64)],
    timeout_ms: i32,
) -> Vec<(i16, i64)> {
    delete_records_at(c.node(id).addr(), topics, timeout_ms)
}

/// [`delete_records_of`] at a node's address (callable from another thread).
fn delete_records_at(
    addr: std::net::SocketAddr,
    topics: &[(&str, i64)],
    timeout_ms: i32,
) -> Vec<(i16, i64)> {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
    let mut conn = RawConn::connect_timeout(addr, Duration::from_secs(10)).expect("connect");
    let named = topics
        .iter()
        .map(|(name, offset)| {
            DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_string(name.to_string())))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(*offset),
                ])
        })
        .collect();
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(timeout_ms)
        .with_topics(named);
    let resp: DeleteRecordsResponse = conn
        .call(ApiKey::DeleteRecords, 2, &req)
        .expect("DeleteRecords answered");
    resp.topics
        .iter()
        .map(|t| (t.partitions[0].error_code, t.partitions[0].low_watermark))
        .collect()
}

/// ListOffsets (v4) earliest of partition 0 at `id`: its log start when it leads.
fn earliest(c: &mut Cluster, id: i32) -> Result<i64, i16> {
    list_offset(c, id, 0, -2)
}

/// DeleteRecords is answered once every live replica moved its log start past the
/// deleted records (Kafka's low watermark, reported by the followers' fetches), not once
/// the leader alone had: a failover right after the answer elected a follower that had
/// not heard of it yet and served the deleted records again (found by review). A live
/// follower whose fetches are cut holds the answer back until the request's timeout
/// (REQUEST_TIMED_OUT); once they pass it is answered; and a leader SIGKILLed right after
/// an answer leaves a new leader whose log starts at the deleted offset.
#[test]
fn delete_records_waits_for_the_followers_and_survives_a_failover_right_after() {
    let (mut c, net) = start_faulty(&[
        ("min.insync.replicas", "2"),
        // The cut follower stays in the ISR: it is the low watermark that must wait.
        ("replica.lag.time.max.ms", "600000"),
    ]);
    let (old, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != old).collect();
    produce(&mut c, old, "all", 0, 200, "doomed");
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 200);

    net.cut_fetches(followers[1], old, Mode::Blackhole);
    let (error, _) = delete_records(&mut c, old, 50, 1_500);
    const REQUEST_TIMED_OUT: i16 = 7;
    assert_eq!(
        error, REQUEST_TIMED_OUT,
        "a live follower still holds 0..50"
    );
    assert_eq!(earliest(&mut c, old), Ok(50), "the leader's own log moved");
    net.heal();
    let (error, low) = delete_records(&mut c, old, 50, 30_000);
    assert_eq!((error, low), (0, 50), "answered once the follower followed");

    // Answered: every replica's log start is past 100. Kill the leader at once.
    let (error, low) = delete_records(&mut c, old, 100, 30_000);
    assert_eq!(error, 0);
    assert!(low >= 100, "low watermark {low}");
    c.node(old).kill().expect("SIGKILL the leader");
    let (leader, _, _) = wait_placement(&mut c, &followers, 0, |p| p.0 > 0 && p.0 != old);
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let start = loop {
        match earliest(&mut c, leader) {
            Ok(start) => break start,
            Err(code) => assert!(Instant::now() < deadline, "no ListOffsets answer: {code}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        start >= 100,
        "the new leader {leader} serves deleted records from {start}"
    );
}

/// The broker-level `unclean.leader.election.enable=true` (here every node's static
/// value) applies to a topic without its own, as in Kafka, instead of being accepted and
/// unused: a partition whose only ISR member dies is led by its live replica outside the
/// ISR (ISR that replica alone) rather than staying offline (found by review).
#[test]
fn the_broker_level_unclean_leader_election_default_elects_a_live_replica() {
    let (mut c, net) = Cluster::start_faulty(
        3,
        &[
            ("unclean.leader.election.enable", "true"),
            ("replica.lag.time.max.ms", "1000"),
        ],
    )
    .expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    let created = cluster::create_topic_assigned(addr, TOPIC, &[vec![1, 2]]).expect("create");
    assert_eq!(created, 0);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.0 > 0 && p.2.len() == 2);
    let other = if leader == 1 { 2 } else { 1 };
    // The other replica falls out of the ISR; then the ISR's only member dies.
    net.cut_fetches(other, leader, Mode::Blackhole);
    wait_placement(&mut c, &[1, 2, 3], 0, |p| {
        p.0 == leader && p.2 == vec![leader]
    });
    c.node(leader).kill().expect("SIGKILL the leader");
    let live: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    let (now, _, isr) = wait_placement(&mut c, &live, 0, |p| p.0 == other);
    assert_eq!((now, isr), (other, vec![other]));
}

/// One DeleteRecords naming two topics waits for both at once, as Kafka's one delayed
/// operation: the topic whose follower's fetches are cut times out (REQUEST_TIMED_OUT),
/// and the other, whose follower is healthy, is answered within the same wait. Before,
/// topics waited one after another: the second started only once the first had waited
/// out the timeout, deleted its records and answered REQUEST_TIMED_OUT (found by review).
#[test]
fn delete_records_of_several_topics_wait_together() {
    const REQUEST_TIMED_OUT: i16 = 7;
    let (mut c, net) = start_faulty(&[("replica.lag.time.max.ms", "600000")]);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    let addr = c.node(leader).addr();
    let healthy = "healthy";
    let created = cluster::create_topic_assigned(addr, healthy, &[vec![leader, followers[0]]])
        .expect("create");
    assert_eq!(created, 0);
    produce(&mut c, leader, "all", 0, 100, "cut");
    let bootstrap = c.node(leader).bootstrap();
    let (p, log) = clients::producer(&bootstrap, "all", "none", &[]).expect("producer");
    let records = clients::make_records(0, 100, "healthy", clients::now_ms());
    clients::produce_all(&p, healthy, &records, Some(0)).expect("produce");
    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 100);

    net.cut_fetches(followers[1], leader, Mode::Blackhole);
    let answers = delete_records_of(&mut c, leader, &[(TOPIC, 50), (healthy, 50)], 3_000);
    assert_eq!(
        answers[0].0, REQUEST_TIMED_OUT,
        "{TOPIC}: a follower is cut"
    );
    assert_eq!(
        answers[1],
        (0, 50),
        "{healthy}: its follower followed in time"
    );
}

/// DeleteRecords on a partition with no produce traffic is answered within a fetch round
/// trip, not after the followers' long polls (`replica.fetch.wait.max.ms`, 30 s here):
/// the leader's log start moving wakes the follower fetches parked on it, as an append
/// does, so they report the new start at once. Before, they learnt it only when their
/// poll ran out, and DeleteRecords (which waits for every live replica's log start)
/// waited that long (here: no answer within the raw client's 10 s read timeout).
#[test]
fn delete_records_on_an_idle_partition_wakes_the_parked_follower_fetches() {
    let mut c = start(&[
        ("replica.fetch.wait.max.ms", "30000"),
        ("replica.lag.time.max.ms", "600000"),
    ]);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    produce(&mut c, leader, "all", 0, 200, "idle");
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 200);

    let asked = Instant::now();
    let (error, low) = delete_records(&mut c, leader, 100, 25_000);
    let took = asked.elapsed();
    assert_eq!((error, low), (0, 100), "answered after {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "DeleteRecords took {took:?}: the followers' parked fetches were not woken"
    );
}

/// The same when the followers' fetches are in transit as the delete happens (answered
/// before it, not yet sent again): there is no parked fetch to wake, and before, the next
/// fetch found nothing new and parked, so DeleteRecords waited out the followers' long
/// poll (30 s here, past the request's 8 s: REQUEST_TIMED_OUT) — a flake risk of the
/// test above, which only a race hit. The fault proxy makes the race happen every run:
/// it holds the answers to the fetches one more batch wakes, the delete moves the log
/// start meanwhile, then the answers go on. The leader answers a follower's fetch at once
/// when the log start it carries is newer than the one that follower was last sent.
#[test]
fn delete_records_while_the_follower_fetches_are_in_transit_is_answered_in_a_round_trip() {
    let (mut c, net) = start_faulty(&[
        ("replica.fetch.wait.max.ms", "30000"),
        ("replica.lag.time.max.ms", "600000"),
    ]);
    let (leader, _, _) = wait_placement(&mut c, &[1, 2, 3], 0, |p| p.2.len() == 3 && p.0 > 0);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    produce(&mut c, leader, "all", 0, 200, "idle");
    assert_eq!(wait_identical(&mut c, &[1, 2, 3], 0), 200);

    // The followers' fetches parked at 200 are woken by one more batch; their answers
    // (read before the delete, with log start 0) are held on the way back.
    for f in &followers {
        net.cut_fetches(*f, leader, Mode::HoldResponses);
    }
    produce(&mut c, leader, "1", 200, 1, "wake");
    let held = |p: &weir_tests::proxy::FaultProxy| {
        followers
            .iter()
            .all(|f| p.client_stats(&cluster::fetcher_client_id(*f)).held_down > 0)
    };
    net.listener(leader)
        .wait_for(AGREE_TIMEOUT, held)
        .expect("both followers' answers held in transit");

    let addr = c.node(leader).addr();
    // Within the raw client's 10 s read timeout: a late answer is REQUEST_TIMED_OUT.
    let delete = std::thread::spawn(move || delete_records_at(addr, &[(TOPIC, 100)], 8_000));
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while earliest(&mut c, leader) != Ok(100) {
        assert!(
            Instant::now() < deadline,
            "the leader's log start never moved"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let released = Instant::now();
    for f in &followers {
        net.cut_fetches(*f, leader, Mode::Pass);
    }
    let answer = delete.join().expect("the DeleteRecords thread");
    let took = released.elapsed();
    assert_eq!(
        answer,
        vec![(0, 100)],
        "answered {took:?} after the release"
    );
    assert!(
        took < Duration::from_secs(5),
        "DeleteRecords took {took:?}: the followers' next fetches parked"
    );
}

/// Kafka's error for an InitProducerId the broker has no producer id block for: retriable.
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
/// The first producer id the controller hands out (`allocator::CONTROLLER_FIRST_PRODUCER_ID`):
/// above every id of the nodes' own per-shard ranges.
const CONTROLLER_FIRST_PRODUCER_ID: i64 = 1 << 62;

/// One idempotent InitProducerId (v4) on a new connection to `addr`: (error code,
/// producer id); `None` if the node does not answer (restarting).
fn init_producer_id(addr: std::net::SocketAddr) -> Option<(i16, i64)> {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
    let mut conn = RawConn::connect_timeout(addr, Duration::from_secs(20)).ok()?;
    let req = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1);
    let r: InitProducerIdResponse = conn.call(ApiKey::InitProducerId, 4, &req).ok()?;
    Some((r.error_code, r.producer_id.0))
}

/// A producer id from node `id`, retrying COORDINATOR_LOAD_IN_PROGRESS (no block from the
/// controller yet) as clients do, within `AGREE_TIMEOUT`.
fn new_producer_id(c: &mut Cluster, id: i32) -> i64 {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        let answer = init_producer_id(c.node(id).addr());
        if let Some((0, pid)) = answer {
            return pid;
        }
        assert!(
            matches!(answer, None | Some((COORDINATOR_LOAD_IN_PROGRESS, _)))
                && Instant::now() < deadline,
            "InitProducerId on node {id}: {answer:?}\n{}",
            c.log_tails(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Producer ids in a cluster come from the controller's counter in the metadata log
/// (Kafka's AllocateProducerIds, KIP-730), not from each node's data dir: a node back
/// with a wiped one hands out only ids above every id any node handed out before, by
/// construction. (Before, its fresh `producer-id-block` file started at a random block of
/// its own range: below every id of a node with a higher id, and perhaps among its own
/// old ones, which partitions still hold with their producers' sequences.)
#[test]
fn a_node_back_with_an_empty_data_dir_hands_out_only_new_producer_ids() {
    const WIPED: i32 = 2;
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let mut before = std::collections::BTreeSet::new();
    for id in [1, 2, 3] {
        for _ in 0..5 {
            let pid = new_producer_id(&mut c, id);
            assert!(before.insert(pid), "{pid} handed out twice: {before:?}");
        }
    }
    assert!(
        before.iter().all(|p| *p >= CONTROLLER_FIRST_PRODUCER_ID),
        "ids from the controller's counter: {before:?}"
    );
    let highest = *before.last().expect("ids");

    c.node(WIPED).kill().expect("SIGKILL");
    let data_dir = c.node(WIPED).data_dir().to_path_buf();
    std::fs::remove_dir_all(&data_dir).expect("wipe the data dir");
    c.node(WIPED)
        .restart()
        .expect("restart on an empty data dir");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)
        .expect("agree again");
    for _ in 0..5 {
        let pid = new_producer_id(&mut c, WIPED);
        assert!(
            pid > highest,
            "the wiped node handed out {pid}, not above {highest} (ids before: {before:?})"
        );
    }
}

/// InitProducerId needs the controller only for a shard's next block: without a quorum,
/// a shard with none answers the retriable COORDINATOR_LOAD_IN_PROGRESS after a bounded
/// wait (Kafka's answer when it has no block) and gets an id once the quorum is back;
/// and a shard's first block after the active controller died comes from the next one.
#[test]
fn init_producer_id_is_retriable_without_a_controller_and_works_after_a_new_one() {
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    c.node(2).kill().expect("SIGKILL node 2");
    c.node(3).kill().expect("SIGKILL node 3");
    let asked = Instant::now();
    let answer = init_producer_id(c.node(1).addr());
    assert_eq!(
        answer.map(|a| a.0),
        Some(COORDINATOR_LOAD_IN_PROGRESS),
        "node 1 alone, no block yet: {answer:?}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        asked.elapsed()
    );
    c.node(2).restart().expect("restart node 2");
    let first = new_producer_id(&mut c, 1);
    assert!(first >= CONTROLLER_FIRST_PRODUCER_ID, "{first}");

    c.node(3).restart().expect("restart node 3");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let leader = c.controller(AGREE_TIMEOUT).expect("a controller");
    // A node that has asked for no block yet, and is not the controller.
    let asker = if leader == 3 { 2 } else { 3 };
    c.node(leader)
        .kill()
        .expect("SIGKILL the active controller");
    let next = new_producer_id(&mut c, asker);
    assert!(
        next > first,
        "node {asker}'s id {next} after the controller {leader} died, not above {first}"
    );
}
