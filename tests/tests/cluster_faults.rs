//! Network faults between weir nodes, made by the fault proxies of
//! `Cluster::start_faulty` (`tests/src/proxy.rs`): every node advertises a Kafka-aware
//! proxy in front of its listener and reaches every other voter's controller port through
//! a proxy of its own for that pair.
//!
//! - Issue 11: one follower's fetches from the leader are blackholed: it leaves the ISR
//!   within `replica.lag.time.max.ms` (+ margin) and acks=all goes on with two; with the
//!   second cut too the ISR is the leader alone and acks=all is refused with
//!   NOT_ENOUGH_REPLICAS before anything is appended; healed, both rejoin, and every
//!   acknowledged record is read back once and the three replica logs are identical.
//! - Issue 12: a node cut from both others (controller links and replication, both ways)
//!   cannot commit a metadata change and does not name itself controller, while the
//!   majority keeps a controller and commits; its lease expires before the majority
//!   fences it, so it stops leading its partitions (produce: NOT_LEADER_OR_FOLLOWER);
//!   healed, it catches up to the same metadata. Run with the cut node a plain voter and
//!   with it the active controller.

use std::time::{Duration, Instant};

use kafka_protocol::messages::MetadataResponse;
use kafka_protocol::records::Compression;
use weir_tests::clients;
use weir_tests::cluster::{self, Cluster, FaultNet};
use weir_tests::proxy::Mode;
use weir_tests::raw::{self, RawConn};

/// Bound on every "until the nodes agree" wait (elections, leases, catch-up on a loaded
/// 2-core machine).
const AGREE_TIMEOUT: Duration = Duration::from_secs(60);
/// `replica.lag.time.max.ms` of the ISR test.
const LAG_MS: u64 = 2_000;
/// A cut follower leaves the ISR within the lag plus this: the leader's ISR check runs
/// every second, the change is committed by the controller and applied on every node
/// (generous for a loaded machine).
const ISR_MARGIN: Duration = Duration::from_secs(15);
const TOPIC: &str = "cut-off";
const NONE: i16 = 0;
const NOT_ENOUGH_REPLICAS: i16 = 19;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const REQUEST_TIMED_OUT: i16 = 7;
const TOPIC_ALREADY_EXISTS: i16 = 36;
/// Tries of one metadata write while a controller is being elected.
const WRITE_TRIES: usize = 40;

/// The last log lines of every node, for a failure message.
fn logs(c: &mut Cluster) -> String {
    (1..=c.nodes.len() as i32)
        .map(|id| format!("--- node {id}:\n{}", c.node(id).log_tail(40)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// (leader, sorted ISR) of partition `p` of `topic` in `m`.
fn placement(m: &MetadataResponse, topic: &str, p: i32) -> Option<(i32, Vec<i32>)> {
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    let part = t.partitions.iter().find(|x| x.partition_index == p)?;
    let mut isr: Vec<i32> = part.isr_nodes.iter().map(|n| n.0).collect();
    isr.sort();
    Some((part.leader_id.0, isr))
}

fn has_topic(m: &MetadataResponse, topic: &str) -> bool {
    placement(m, topic, 0).is_some()
}

/// Waits until every node reports partition 0 of [`TOPIC`] with a leader and exactly the
/// ISR `want`; returns the leader and how long it took.
fn wait_isr(c: &mut Cluster, want: &[i32], timeout: Duration) -> (i32, Duration) {
    let t0 = Instant::now();
    loop {
        let seen: Vec<Option<(i32, Vec<i32>)>> = (1..=3)
            .map(|id| c.metadata(id).ok().and_then(|m| placement(&m, TOPIC, 0)))
            .collect();
        if let Some(Some((leader, isr))) = seen.first().cloned()
            && leader > 0
            && isr == want
            && seen
                .iter()
                .all(|s| s.as_ref() == Some(&(leader, isr.clone())))
        {
            return (leader, t0.elapsed());
        }
        if t0.elapsed() > timeout {
            panic!("no ISR {want:?} within {timeout:?}: {seen:?}\n{}", logs(c));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Produces `n` numbered records (acks=all, idempotent) to partition 0 through `via`;
/// every one must be acknowledged.
fn produce(
    c: &mut Cluster,
    via: i32,
    first_id: u64,
    n: u64,
    tag: &str,
) -> (Vec<clients::Sent>, Vec<clients::Acked>) {
    let bootstrap = c.node(via).bootstrap();
    let (p, log) = clients::producer(&bootstrap, "all", "none", &[("enable.idempotence", "true")])
        .expect("producer");
    let records = clients::make_records(first_id, n, tag, clients::now_ms());
    clients::produce_all(&p, TOPIC, &records, Some(0)).expect("produce");
    assert!(
        log.failed().is_empty(),
        "{tag}: failed deliveries: {:?}",
        log.failed()
    );
    assert_eq!(log.acked().len(), n as usize, "{tag}: every record acked");
    (records, log.acked())
}

fn partition_dir(c: &mut Cluster, id: i32) -> std::path::PathBuf {
    c.node(id).data_dir().join(format!("{TOPIC}-0"))
}

/// Waits (bounded) until the three replica logs are identical; returns their length.
fn wait_identical(c: &mut Cluster, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let logs_now: Vec<Vec<u8>> = (1..=3)
            .map(|id| cluster::log_bytes(&partition_dir(c, id)))
            .collect();
        if !logs_now[0].is_empty() && logs_now.windows(2).all(|w| w[0] == w[1]) {
            return logs_now[0].len();
        }
        if Instant::now() >= deadline {
            panic!(
                "replica logs differ after {timeout:?}: lengths {:?}\n{}",
                logs_now.iter().map(Vec::len).collect::<Vec<_>>(),
                logs(c)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_follower_cut_off_leaves_the_isr_and_with_one_left_acks_all_is_refused() {
    let lag = LAG_MS.to_string();
    let (mut c, net) = Cluster::start_faulty(
        3,
        &[
            ("min.insync.replicas", "2"),
            ("replica.lag.time.max.ms", lag.as_str()),
        ],
    )
    .expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(
        cluster::create_topic(addr, TOPIC, 1, 3).expect("create"),
        NONE
    );
    let (leader, _) = wait_isr(&mut c, &[1, 2, 3], AGREE_TIMEOUT);
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    let (a, b) = (followers[0], followers[1]);

    let (mut sent, mut acked) = produce(&mut c, leader, 0, 300, "all-three");
    // The producer's records went through the leader's proxy, and so do the followers'
    // fetches: the cut below is on a path that was carrying them.
    let through = net
        .listener(leader)
        .client_stats(&cluster::fetcher_client_id(a));
    assert!(
        through.bytes_up > 0,
        "{a} fetched through the proxy: {through:?}"
    );

    // Follower a's fetches are blackholed: it leaves the ISR; two are enough.
    net.cut_fetches(a, leader, Mode::Blackhole);
    let mut rest = vec![leader, b];
    rest.sort();
    let (l, took) = wait_isr(&mut c, &rest, Duration::from_millis(LAG_MS) + ISR_MARGIN);
    assert_eq!(l, leader, "the leader stays");
    println!("follower {a} cut: out of the ISR after {took:?} (replica.lag.time.max.ms={LAG_MS})");
    let (s, k) = produce(&mut c, leader, 10_000, 300, "two-left");
    sent.extend(s);
    acked.extend(k);

    // Follower b too: the leader alone is below min.insync.replicas.
    net.cut_fetches(b, leader, Mode::Blackhole);
    let (_, took) = wait_isr(
        &mut c,
        &[leader],
        Duration::from_millis(LAG_MS) + ISR_MARGIN,
    );
    println!("follower {b} cut: out of the ISR after {took:?}");
    let before = cluster::log_bytes(&partition_dir(&mut c, leader));
    let mut conn =
        RawConn::connect_timeout(c.node(leader).addr(), Duration::from_secs(20)).expect("connect");
    for i in 0..3 {
        let batch = raw::record_batch(&[format!("refused-{i}").into_bytes()], Compression::None)
            .expect("batch");
        let (code, _) = conn.produce(TOPIC, 0, -1, batch).expect("produce");
        assert_eq!(code, NOT_ENOUGH_REPLICAS, "acks=all with the ISR below 2");
    }
    // librdkafka retries NOT_ENOUGH_REPLICAS until its message timeout: none delivered.
    let bootstrap = c.node(leader).bootstrap();
    let (p, log) = clients::producer(&bootstrap, "all", "none", &[("message.timeout.ms", "5000")])
        .expect("producer");
    let refused = clients::make_records(50_000, 50, "refused", clients::now_ms());
    clients::produce_all(&p, TOPIC, &refused, Some(0)).expect("flush");
    drop(p);
    assert!(
        log.acked().is_empty(),
        "acked with one in sync: {:?}",
        log.acked()
    );
    assert_eq!(log.failed().len(), refused.len(), "every delivery failed");
    println!("librdkafka with one in sync: {:?}", log.failed().first());
    // Refused before appending: the leader's log is byte for byte what it was.
    assert_eq!(
        cluster::log_bytes(&partition_dir(&mut c, leader)),
        before,
        "nothing of the refused produces reached the leader's log"
    );

    // Healed, both catch up and rejoin; acks=all works again.
    net.heal();
    let (l, took) = wait_isr(&mut c, &[1, 2, 3], AGREE_TIMEOUT);
    assert_eq!(l, leader);
    println!("healed: both back in the ISR after {took:?}");
    let (s, k) = produce(&mut c, leader, 20_000, 300, "healed");
    sent.extend(s);
    acked.extend(k);

    wait_identical(&mut c, AGREE_TIMEOUT);
    let got = clients::consume_to_end(&bootstrap, TOPIC, &[0]).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record, once, in order");
    assert_eq!(checked, 900);
    assert_eq!(
        got.len(),
        900,
        "nothing but the acknowledged records is readable"
    );
    let tags = |g: &clients::Got| {
        g.headers
            .iter()
            .find(|(k, _)| k == "tag")
            .map(|(_, v)| v.clone())
    };
    assert!(
        got.iter()
            .all(|g| tags(g).as_deref() != Some(b"refused".as_slice()) && g.headers.len() == 2),
        "no refused record readable"
    );
}

/// Creates `name` through one of `via` (in turn), retrying while no controller answers;
/// true once acknowledged ("already exists" after a retry counts: the first try made it).
fn create_via(via: &[i32], c: &mut Cluster, name: &str) -> bool {
    for attempt in 0..WRITE_TRIES {
        let id = via[attempt % via.len()];
        let addr = c.node(id).addr();
        match cluster::create_topic(addr, name, 1, 2) {
            Ok(NONE) => return true,
            Ok(TOPIC_ALREADY_EXISTS) if attempt > 0 => return true,
            Ok(_) | Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    false
}

/// `weir cluster status` through node `id`: its "controller N" line's N.
fn status_controller(c: &mut Cluster, id: i32) -> Option<i32> {
    let bin = weir_tests::broker::weir_binary().ok()?;
    let out = weir_tests::process::run_bounded(
        std::process::Command::new(bin).args([
            "cluster",
            "--bootstrap-server",
            &c.node(id).bootstrap(),
            "status",
        ]),
        Duration::from_secs(60),
    )
    .ok()?;
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("controller "))
        .and_then(|n| n.trim().parse().ok())
}

/// A 3-node cluster with a topic "before" (3 partitions, RF 3) in which one node `x` —
/// the active controller or a plain voter — was cut from both others and fenced by them.
struct Cut {
    c: Cluster,
    net: FaultNet,
    x: i32,
    majority: Vec<i32>,
    /// A partition of "before" that `x` led before the cut.
    led_by_x: i32,
}

fn cut_one_node(cut_the_controller: bool) -> Cut {
    let (mut c, net) = Cluster::start_faulty(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(
        cluster::create_topic(addr, "before", 3, 3).expect("create"),
        NONE
    );
    c.wait_agreed(3, AGREE_TIMEOUT, |m| {
        (0..3).all(|p| placement(m, "before", p).is_some_and(|(l, isr)| l > 0 && isr.len() == 3))
    })
    .expect("agree on the topic");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    let x = if cut_the_controller {
        controller
    } else {
        (1..=3).find(|id| *id != controller).expect("a voter")
    };
    let majority: Vec<i32> = (1..=3).filter(|id| *id != x).collect();
    // Leaders are spread: x leads one partition of "before".
    let m = c.metadata(x).expect("metadata");
    let led_by_x = (0..3)
        .find(|p| placement(&m, "before", *p).is_some_and(|(l, _)| l == x))
        .expect("x leads a partition");

    net.isolate(x, Mode::Blackhole);
    let t0 = Instant::now();
    // The majority agrees on a controller among itself, with x fenced (not a live broker).
    let dump = c
        .wait_agreed_among(Some(&majority), 2, AGREE_TIMEOUT, |m| {
            majority.contains(&m.controller_id.0)
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", logs(&mut c)));
    assert!(
        !dump.contains(&format!("broker {x} ")),
        "{x} fenced:\n{dump}"
    );
    println!(
        "node {x} cut: the majority fenced it after {:?}",
        t0.elapsed()
    );
    Cut {
        c,
        net,
        x,
        majority,
        led_by_x,
    }
}

fn minority_cut(cut_the_controller: bool) {
    let Cut {
        mut c,
        net,
        x,
        majority,
        led_by_x,
    } = cut_one_node(cut_the_controller);

    // The majority commits.
    let during = format!("during-{x}");
    assert!(
        create_via(&majority, &mut c, &during),
        "the majority commits"
    );
    c.wait_agreed_among(Some(&majority), 2, AGREE_TIMEOUT, |m| has_topic(m, &during))
        .expect("the majority agrees on it");

    // x cannot: its CreateTopics fails with a Kafka error, in bounded time.
    let t1 = Instant::now();
    let code = cluster::create_topic(c.node(x).addr(), "on-x", 1, 1).expect("an answer from x");
    let took = t1.elapsed();
    assert_eq!(code, REQUEST_TIMED_OUT, "CreateTopics through the cut node");
    assert!(took < Duration::from_secs(30), "answered in {took:?}");
    println!("CreateTopics on cut node {x}: error {code} after {took:?}");
    for id in &majority {
        let m = c.metadata(*id).expect("metadata");
        assert!(!has_topic(&m, "on-x"), "not committed by the cut node");
    }

    // The partition x led is led by the majority now. x, cut off, cannot know that, but
    // its lease expired (no heartbeat answered for broker.session.timeout.ms) before the
    // majority fenced it: it acknowledges nothing more, whatever the acks.
    let moved = c
        .metadata(majority[0])
        .ok()
        .and_then(|m| placement(&m, "before", led_by_x));
    assert!(
        moved
            .as_ref()
            .is_some_and(|(l, isr)| majority.contains(l) && !isr.contains(&x)),
        "the majority moved partition {led_by_x} away from {x}: {moved:?}"
    );
    let mut conn =
        RawConn::connect_timeout(c.node(x).addr(), Duration::from_secs(30)).expect("connect");
    let batch =
        raw::record_batch(&[b"to-the-cut-node".to_vec()], Compression::None).expect("batch");
    let all = conn
        .produce("before", led_by_x, -1, batch.clone())
        .expect("produce acks=all");
    let one = conn
        .produce("before", led_by_x, 1, batch)
        .expect("produce acks=1");
    println!(
        "produce to cut node {x}, partition {led_by_x} it led: acks=all -> {all:?}, acks=1 -> {one:?} (error, base offset)"
    );
    assert_eq!(
        all.0, NOT_LEADER_OR_FOLLOWER,
        "acks=all to a node whose lease expired"
    );
    assert_eq!(
        one.0, NOT_LEADER_OR_FOLLOWER,
        "acks=1 to a node whose lease expired"
    );

    // x does not become controller, and knows nothing the majority committed.
    let mx = c.metadata(x).expect("metadata of x");
    let majority_controller = c.metadata(majority[0]).expect("metadata").controller_id.0;
    println!(
        "cut node {x} says controller {} (`weir cluster status`: {:?}); the majority says {majority_controller}",
        mx.controller_id.0,
        status_controller(&mut c, x)
    );
    assert!(
        !has_topic(&mx, &during),
        "x cannot learn what it is cut from"
    );
    // Neither elected (a voter) nor kept (the old controller, without a quorum).
    assert_ne!(
        mx.controller_id.0, x,
        "the cut node does not name itself controller"
    );
    assert_eq!(status_controller(&mut c, x), Some(mx.controller_id.0));

    // Healed (the cut connections given up, as after a long cut): x catches up.
    net.heal_dropping_held(x, AGREE_TIMEOUT).expect("heal");
    let t2 = Instant::now();
    let dump = c
        .wait_agreed(3, AGREE_TIMEOUT, |m| {
            has_topic(m, "before") && has_topic(m, &during)
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", logs(&mut c)));
    println!("healed: node {x} caught up after {:?}", t2.elapsed());
    assert!(!dump.contains("topic on-x "), "{dump}");
    let bootstrap = c.node(majority[0]).bootstrap();
    let got = clients::consume_to_end(&bootstrap, "before", &[led_by_x]).expect("consume");
    assert!(
        got.iter()
            .all(|g| g.value.as_deref() != Some(b"to-the-cut-node".as_slice())),
        "nothing sent to the cut node is in the log"
    );
}

#[test]
fn a_cut_off_voter_cannot_commit_or_elect_itself_and_catches_up_when_healed() {
    minority_cut(false);
}

#[test]
fn a_cut_off_controller_is_replaced_cannot_commit_and_catches_up_when_healed() {
    minority_cut(true);
}

/// 5 voters split 2 | 3, the controller on the minority side with one other node. openraft
/// keeps the cut-off controller calling itself leader, and the other node's heartbeats
/// reach it; they must not renew that node's lease past what the majority's fence of it
/// expects, or it would acknowledge writes to a partition the majority has moved.
#[test]
fn a_node_cut_off_with_a_stale_controller_stops_acknowledging_before_its_partitions_move() {
    let (mut c, net) = Cluster::start_faulty(5, &[]).expect("start cluster");
    c.wait_agreed(5, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(
        cluster::create_topic(addr, "before", 5, 3).expect("create"),
        NONE
    );
    c.wait_agreed(5, AGREE_TIMEOUT, |m| {
        (0..5).all(|p| placement(m, "before", p).is_some_and(|(l, isr)| l > 0 && isr.len() == 3))
    })
    .expect("agree on the topic");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    let m = c.metadata(controller).expect("metadata");
    // d: another node leading a partition whose other replicas are all on the other side.
    let (d, led_by_d) = (0..5)
        .filter_map(|p| placement(&m, "before", p).map(|(l, isr)| (p, l, isr)))
        .find(|(_, l, isr)| *l != controller && !isr.contains(&controller))
        .map(|(p, l, _)| (l, p))
        .expect("a partition led away from the controller, without it in the ISR");
    let minority = [controller, d];
    let majority: Vec<i32> = (1..=5).filter(|id| !minority.contains(id)).collect();

    net.split(&minority, Mode::Blackhole);
    let t0 = Instant::now();
    c.wait_agreed_among(Some(&majority), 3, AGREE_TIMEOUT, |m| {
        majority.contains(&m.controller_id.0)
            && placement(m, "before", led_by_d).is_some_and(|(l, _)| majority.contains(&l))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", logs(&mut c)));
    println!(
        "split: the majority moved partition {led_by_d} from node {d} after {:?}",
        t0.elapsed()
    );
    let mut conn =
        RawConn::connect_timeout(c.node(d).addr(), Duration::from_secs(30)).expect("connect");
    let batch = raw::record_batch(&[b"to-the-minority".to_vec()], Compression::None);
    let one = conn
        .produce("before", led_by_d, 1, batch.expect("batch"))
        .expect("produce acks=1");
    println!("acks=1 to node {d} on the minority side: {one:?} (error, base offset)");
    assert_eq!(
        one.0, NOT_LEADER_OR_FOLLOWER,
        "a node whose controller lost its quorum holds no lease"
    );
    net.heal();
}

/// How long the half-healed node is watched once the controller answers it again:
/// many heartbeat intervals (200 ms) and well past its registration.
const HALF_HEALED_WATCH: Duration = Duration::from_secs(4);

/// Issue 11, the lease renew window: a node back from a cut long enough to be fenced
/// acts as a partition leader again only once its image holds what the controller
/// committed meanwhile. Node `x` — a voter that never campaigns (election timeout 60 s),
/// so it keeps following the controller through the cut, as a voter whose own election
/// has not started yet does — is cut from both others (connections refused) until the
/// majority fenced it and moved the partition it led. Then only its own links to the
/// others heal: its heartbeats reach the controller and are answered (the controller
/// registers it again), while the controller's log still cannot reach it, so its image
/// still names it leader of that partition. It must answer every produce to that
/// partition with an error, never NONE: the old code renewed its lease with the first
/// answered heartbeat and acknowledged acks=1 produces as the leader of the old epoch
/// (records the new leader never has). Fully healed, it catches up and refuses them as a
/// follower.
#[test]
fn a_node_back_from_a_cut_leads_nothing_before_its_image_caught_up() {
    let (mut c, net) = Cluster::start_faulty(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    let x = (1..=3).find(|id| *id != controller).expect("a voter");
    let majority: Vec<i32> = (1..=3).filter(|id| *id != x).collect();
    // Cut off, a candidate would not heartbeat at all; a follower does, and is answered
    // as soon as its own links pass again.
    c.node(x).terminate().expect("stop x");
    let election = (
        "controller.quorum.election.timeout.ms".to_string(),
        "60000".to_string(),
    );
    c.node(x).config_mut().sets.push(election);
    c.node(x).restart().expect("restart x");
    net.retarget(&mut c, x);
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", logs(&mut c)));
    let addr = c.node(majority[0]).addr();
    assert_eq!(
        cluster::create_topic(addr, "moved", 3, 3).expect("create"),
        NONE
    );
    c.wait_agreed(3, AGREE_TIMEOUT, |m| {
        (0..3).all(|p| placement(m, "moved", p).is_some_and(|(l, isr)| l > 0 && isr.len() == 3))
    })
    .expect("agree on the topic");
    let m = c.metadata(x).expect("metadata");
    let led_by_x = (0..3)
        .find(|p| placement(&m, "moved", *p).is_some_and(|(l, _)| l == x))
        .expect("x leads a partition");

    net.isolate(x, Mode::Refuse);
    c.wait_agreed_among(Some(&majority), 2, AGREE_TIMEOUT, |m| {
        placement(m, "moved", led_by_x)
            .is_some_and(|(l, isr)| majority.contains(&l) && !isr.contains(&x))
    })
    .unwrap_or_else(|e| panic!("the majority fences x and moves its partition: {e:#}"));

    // Half healed: x's links to the others pass, theirs to x stay refused.
    for o in &majority {
        net.link(x, *o).heal();
    }
    let mut conn =
        RawConn::connect_timeout(c.node(x).addr(), Duration::from_secs(30)).expect("connect");
    let batch =
        raw::record_batch(&[b"to-the-old-leader".to_vec()], Compression::None).expect("batch");
    let t0 = Instant::now();
    let mut registered: Option<Instant> = None;
    let mut answers: std::collections::BTreeMap<i16, usize> = Default::default();
    while registered.is_none_or(|t| t.elapsed() < HALF_HEALED_WATCH) {
        let (code, offset) = conn
            .produce("moved", led_by_x, 1, batch.clone())
            .expect("produce acks=1");
        *answers.entry(code).or_default() += 1;
        assert_ne!(
            code,
            NONE,
            "x acknowledged (offset {offset}) a produce to partition {led_by_x}, which moved \
             while it was cut off, after {:?}\n{}",
            t0.elapsed(),
            logs(&mut c)
        );
        // The controller answers x's heartbeats: it registers x again.
        if registered.is_none()
            && c.metadata(majority[0])
                .is_ok_and(|m| m.brokers.iter().any(|b| b.node_id.0 == x))
        {
            println!("x registered again {:?} after the half heal", t0.elapsed());
            registered = Some(Instant::now());
        }
        assert!(
            t0.elapsed() < AGREE_TIMEOUT,
            "x's heartbeats were never answered (not registered again)\n{}",
            logs(&mut c)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("half healed: x answered {answers:?} (code: count)");

    // Healed: x catches up, and refuses as a follower.
    net.heal();
    c.wait_agreed(3, AGREE_TIMEOUT, |m| {
        placement(m, "moved", led_by_x).is_some_and(|(l, _)| l > 0 && l != x)
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", logs(&mut c)));
    let (code, _) = conn
        .produce("moved", led_by_x, 1, batch)
        .expect("produce acks=1");
    assert_eq!(code, NOT_LEADER_OR_FOLLOWER, "x follows the partition now");
}

/// Clients that hold `max.connections` on a leader do not keep its followers out: the
/// dedicated inter-broker listener is exempt from the limit, as in Kafka (KIP-402). Both
/// followers are restarted while the clients' listener is full, and an acks=all produce
/// (which needs both back: the ISR does not shrink here) is still acknowledged.
#[test]
fn clients_at_max_connections_do_not_keep_restarted_followers_out() {
    const MAX: usize = 6;
    let max = MAX.to_string();
    let mut c = Cluster::start(
        3,
        &[
            ("listeners", "PLAINTEXT://127.0.0.1:0,REPL://127.0.0.1:0"),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,REPL:PLAINTEXT",
            ),
            ("inter.broker.listener.name", "REPL"),
            ("max.connections", max.as_str()),
            ("replica.lag.time.max.ms", "600000"),
        ],
    )
    .expect("cluster");
    c.wait_agreed(3, Duration::from_secs(60), |_| true)
        .expect("agreed");
    let via = c.node(2).addr();
    assert_eq!(cluster::create_topic(via, TOPIC, 1, 3).expect("create"), 0);
    let (leader, _) = wait_isr(&mut c, &[1, 2, 3], Duration::from_secs(60));
    let addr = c.node(leader).addr();
    // The clients' listener full: the producer's connection and MAX - 1 idle ones.
    let mut producer = RawConn::connect(addr).expect("producer connection");
    producer.api_versions().expect("served");
    let mut held = Vec::new();
    for _ in 1..MAX {
        let mut h = RawConn::connect(addr).expect("connect");
        h.api_versions().expect("served under the limit");
        held.push(h);
    }
    let mut over = RawConn::connect(addr).expect("connect");
    assert!(
        over.api_versions().is_err(),
        "a client past max.connections is refused"
    );
    for id in (1..=3).filter(|id| *id != leader) {
        c.node(id).kill().expect("kill follower");
        c.node(id).restart().expect("restart follower");
    }
    let batch = raw::record_batch(&[b"after".to_vec()], Compression::None).expect("batch");
    let (code, _) = producer
        .produce(TOPIC, 0, -1, batch)
        .expect("produce answered");
    assert_eq!(
        code,
        0,
        "acks=all with both followers back\n{}",
        logs(&mut c)
    );
    drop(held);
}
