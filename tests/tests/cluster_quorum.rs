//! Three weir processes on 127.0.0.1 form one cluster through the controller quorum
//! (`controller.quorum.voters`): every node reports the same brokers, controller and
//! partition placement; the controller's node can be SIGKILLed and another takes over;
//! a random minority killed again and again under topic churn loses no acknowledged
//! change, and every node ends with the same metadata, byte for byte; librdkafka
//! produces and consumes through any node as bootstrap.
//!
//! The longer loop: `cargo test -p weir-tests --test cluster_quorum -- --ignored --nocapture`
//! (`CLUSTER_CYCLES`, default 20; `CLUSTER_FAILOVER_RUNS` for the failover timing, default 20).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use weir_tests::cluster::{self, Cluster};

/// Bound on every "until the nodes agree" wait: elections, lease expiry and catch-up on
/// a loaded 2-core machine.
const AGREE_TIMEOUT: Duration = Duration::from_secs(60);
/// Tries of one metadata write while a controller is being elected.
const WRITE_TRIES: usize = 40;
const NONE: i16 = 0;
const TOPIC_ALREADY_EXISTS: i16 = 36;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// The last log lines of every node, for a failure message.
fn logs(c: &mut Cluster) -> String {
    (1..=c.nodes.len() as i32)
        .map(|id| format!("--- node {id}:\n{}", c.node(id).log_tail(40)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Creates `name` through any live node, retrying while no controller answers; true once
/// acknowledged (an "already exists" after a retry counts: the first try was made).
fn create(c: &mut Cluster, name: &str, partitions: i32, rf: i16) -> bool {
    for attempt in 0..WRITE_TRIES {
        let live = c.live();
        let id = live[attempt % live.len()];
        let addr = c.node(id).addr();
        match cluster::create_topic(addr, name, partitions, rf) {
            Ok(NONE) => return true,
            Ok(TOPIC_ALREADY_EXISTS) if attempt > 0 => return true,
            Ok(_) | Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    false
}

fn delete(c: &mut Cluster, name: &str) -> bool {
    for attempt in 0..WRITE_TRIES {
        let live = c.live();
        let id = live[attempt % live.len()];
        let addr = c.node(id).addr();
        match cluster::delete_topic(addr, name) {
            Ok(NONE) => return true,
            Ok(UNKNOWN_TOPIC_OR_PARTITION) if attempt > 0 => return true,
            Ok(_) | Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    false
}

/// Replica sets and leaders of `topic` in `m`.
fn placement(m: &kafka_protocol::messages::MetadataResponse, topic: &str) -> Vec<(i32, Vec<i32>)> {
    m.topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.leader_id.0, p.replica_nodes.iter().map(|b| b.0).collect()))
                .collect()
        })
        .unwrap_or_default()
}

fn has_topic(m: &kafka_protocol::messages::MetadataResponse, topic: &str) -> bool {
    !placement(m, topic).is_empty()
}

#[test]
fn three_nodes_agree_and_a_topic_created_through_node_2_is_spread_over_all() {
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    let first = c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(
        first.contains("broker 1 ") && first.contains("broker 3 "),
        "{first}"
    );
    let addr = c.node(2).addr();
    assert_eq!(
        cluster::create_topic(addr, "spread", 6, 3).expect("create"),
        NONE
    );
    // Too many replicas for the live nodes.
    assert_eq!(
        cluster::create_topic(addr, "too-wide", 1, 4).expect("create"),
        38,
        "INVALID_REPLICATION_FACTOR"
    );
    let dump = c
        .wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, "spread"))
        .expect("every node has the topic");
    let m = c.metadata(1).expect("metadata");
    let parts = placement(&m, "spread");
    assert_eq!(parts.len(), 6, "{dump}");
    for (leader, replicas) in &parts {
        let set: BTreeSet<i32> = replicas.iter().copied().collect();
        assert_eq!(set, BTreeSet::from([1, 2, 3]), "{dump}");
        assert!(set.contains(leader), "{dump}");
    }
    let mut leaders: BTreeMap<i32, usize> = BTreeMap::new();
    for (leader, _) in &parts {
        *leaders.entry(*leader).or_default() += 1;
    }
    assert_eq!(leaders.len(), 3, "leaders spread: {leaders:?}\n{dump}");
    assert!(leaders.values().all(|n| *n == 2), "evenly: {leaders:?}");
}

/// `broker.rack` (Kafka's rack awareness): every node's rack is in Metadata, and a topic's
/// replicas are placed across racks. Racks a, b, b: every RF 2 partition has one replica
/// in a and one in b (round-robin over ids alone would put [2, 3] in b alone), and the
/// leaders still go round all three nodes.
#[test]
fn brokers_report_their_racks_and_replicas_are_spread_over_them() {
    let racks = [
        (1, "broker.rack", "a"),
        (2, "broker.rack", "b"),
        (3, "broker.rack", "b"),
    ];
    let mut c = Cluster::start_per_node(3, &[], &racks).expect("start cluster");
    let has_racks = |m: &kafka_protocol::messages::MetadataResponse| {
        m.brokers.iter().all(|b| {
            let want = racks
                .iter()
                .find(|(id, ..)| *id == b.node_id.0)
                .map(|r| r.2);
            b.rack.as_ref().map(|r| r.as_str()) == want
        })
    };
    c.wait_agreed(3, AGREE_TIMEOUT, has_racks)
        .expect("every node reports every node's rack");
    assert!(create(&mut c, "racked", 6, 2), "create\n{}", logs(&mut c));
    let dump = c
        .wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, "racked"))
        .expect("every node has the topic");
    let m = c.metadata(1).expect("metadata");
    let parts = placement(&m, "racked");
    assert_eq!(parts.len(), 6, "{dump}");
    for (_, replicas) in &parts {
        assert!(
            replicas.contains(&1) && replicas.len() == 2,
            "not over both racks: {replicas:?}\n{dump}"
        );
    }
    let leaders: BTreeSet<i32> = parts.iter().map(|(l, _)| *l).collect();
    assert_eq!(leaders, BTreeSet::from([1, 2, 3]), "{dump}");
}

/// Kills the controller's node, returns how long until the others agree on a new one.
fn kill_controller_and_time(c: &mut Cluster) -> (i32, Duration) {
    let old = c.controller(AGREE_TIMEOUT).expect("controller");
    c.node(old).kill().expect("kill");
    let t0 = Instant::now();
    let deadline = t0 + AGREE_TIMEOUT;
    loop {
        assert!(
            Instant::now() < deadline,
            "no new controller after killing {old}"
        );
        let new = c.controller(Duration::from_secs(5));
        if let Ok(new) = new
            && new != old
        {
            return (old, t0.elapsed());
        }
    }
}

#[test]
fn sigkill_of_the_controller_elects_another_and_the_node_catches_up_on_restart() {
    let runs: usize = std::env::var("CLUSTER_FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let mut times = Vec::new();
    for run in 0..runs {
        let (old, took) = kill_controller_and_time(&mut c);
        times.push(took);
        let name = format!("after-kill-{run}");
        assert!(
            create(&mut c, &name, 3, 2),
            "creation works without node {old}"
        );
        c.wait_agreed(2, AGREE_TIMEOUT, |m| has_topic(m, &name))
            .expect("the two survivors agree");
        c.node(old).restart().expect("restart");
        c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, &name))
            .expect("the restarted node caught up");
    }
    times.sort();
    let median = times[times.len() / 2];
    let max = times[times.len() - 1];
    println!(
        "SIGKILL of the controller -> new controller in Metadata: {runs} runs, median {median:?}, max {max:?}"
    );
}

/// Whether every partition of `topic` has a live leader other than `dead` in `m`.
fn led_without(m: &kafka_protocol::messages::MetadataResponse, topic: &str, dead: i32) -> bool {
    let parts = placement(m, topic);
    !parts.is_empty() && parts.iter().all(|(l, _)| *l >= 0 && *l != dead)
}

#[test]
fn sigkill_of_a_partition_leader_moves_its_partitions_to_the_isr() {
    let runs: usize = std::env::var("CLUSTER_FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let mut times = Vec::new();
    for run in 0..runs {
        let name = format!("led-{run}");
        assert!(create(&mut c, &name, 3, 3), "create {name}");
        c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, &name))
            .expect("agree on the topic");
        // A node that is not the controller: only the partition leader fails over.
        let controller = c.controller(AGREE_TIMEOUT).expect("controller");
        let victim = (1..=3)
            .find(|id| *id != controller)
            .expect("a non-controller");
        c.node(victim).kill().expect("kill");
        let t0 = Instant::now();
        let survivors: Vec<i32> = (1..=3).filter(|id| *id != victim).collect();
        loop {
            assert!(
                t0.elapsed() < AGREE_TIMEOUT,
                "partitions of {victim} not moved"
            );
            let moved = survivors.iter().all(|id| {
                c.metadata(*id)
                    .is_ok_and(|m| led_without(&m, &name, victim))
            });
            if moved {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        times.push(t0.elapsed());
        c.node(victim).restart().expect("restart");
        c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, &name))
            .expect("the restarted node caught up");
    }
    times.sort();
    let median = times[times.len() / 2];
    let max = times[times.len() - 1];
    println!(
        "SIGKILL of a partition leader's node -> new leader in Metadata (broker.session.timeout.ms=3000): {runs} runs, median {median:?}, max {max:?}"
    );
}

#[test]
fn rdkafka_produces_and_consumes_through_every_node_as_bootstrap() {
    use weir_tests::clients;
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "routed", 3, 3), "create");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, "routed"))
        .expect("agree on the topic");
    let (mut sent, mut acked) = (Vec::new(), Vec::new());
    for id in 1..=3 {
        let bootstrap = c.node(id).bootstrap();
        let (p, log) = clients::producer(&bootstrap, "all", "none", &[]).expect("producer");
        let tag = format!("via-{id}");
        let records =
            clients::make_records(u64::from(id as u32) * 1_000, 300, &tag, clients::now_ms());
        clients::produce_all(&p, "routed", &records, None).expect("produce");
        assert!(log.failed().is_empty(), "via node {id}: {:?}", log.failed());
        acked.extend(log.acked());
        sent.extend(records);
    }
    // Read back through another node than the last producer's.
    let bootstrap = c.node(1).bootstrap();
    let got = clients::consume_to_end(&bootstrap, "routed", &[0, 1, 2]).expect("consume");
    let checked = clients::verify(&sent, &acked, &got).expect("every acked record read back");
    assert_eq!(checked, 900);
}

#[test]
fn sigterm_moves_leadership_away_before_the_node_stops() {
    // A lease far longer than the test waits: only the controlled shutdown can move it.
    let mut c = Cluster::start(3, &[("broker.session.timeout.ms", "60000")]).expect("start");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "handover", 3, 3), "create");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, "handover"))
        .expect("agree on the topic");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    let victim = (1..=3)
        .find(|id| *id != controller)
        .expect("a non-controller");
    let t0 = Instant::now();
    let status = c.node(victim).terminate().expect("SIGTERM");
    assert!(status.success(), "clean exit: {status}");
    let survivors: Vec<i32> = (1..=3).filter(|id| *id != victim).collect();
    loop {
        let moved = survivors.iter().all(|id| {
            c.metadata(*id)
                .is_ok_and(|m| led_without(&m, "handover", victim))
        });
        if moved {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "partitions of {victim} not moved by its shutdown"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("SIGTERM -> leadership moved in {:?}", t0.elapsed());
}

#[test]
fn five_nodes_keep_committing_with_two_killed_and_the_two_catch_up() {
    let mut c = Cluster::start(5, &[]).expect("start cluster");
    c.wait_agreed(5, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "five-before", 5, 3), "create");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    // The controller and one other: a minority of two.
    let other = (1..=5).find(|id| *id != controller).expect("another node");
    for id in [controller, other] {
        c.node(id).kill().expect("kill");
    }
    assert!(
        create(&mut c, "five-during", 5, 3),
        "creation works with 3 of 5"
    );
    c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, "five-during"))
        .expect("the three agree once the two are fenced");
    for id in [controller, other] {
        c.node(id).restart().expect("restart");
    }
    c.wait_agreed(5, AGREE_TIMEOUT, |m| {
        has_topic(m, "five-before") && has_topic(m, "five-during")
    })
    .expect("all five agree");
}

#[test]
fn sigkill_of_every_node_then_restart_keeps_every_committed_topic() {
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    for i in 0..5 {
        assert!(
            create(&mut c, &format!("kept-{i}"), 2, 3),
            "create kept-{i}"
        );
    }
    assert!(delete(&mut c, "kept-0"), "delete kept-0");
    let before = c
        .wait_agreed(3, AGREE_TIMEOUT, |m| {
            has_topic(m, "kept-4") && !has_topic(m, "kept-0")
        })
        .expect("agree");
    for id in 1..=3 {
        c.node(id).kill().expect("kill");
    }
    for id in 1..=3 {
        c.node(id).restart().expect("restart");
    }
    let after = c
        .wait_agreed(3, AGREE_TIMEOUT, |m| {
            (1..5).all(|i| has_topic(m, &format!("kept-{i}")))
        })
        .expect("agree after the restart");
    assert!(!after.contains("topic kept-0 "), "{after}");
    let topics = |d: &str| {
        d.lines()
            .filter(|l| l.starts_with("topic "))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(topics(&before), topics(&after));
}

#[test]
fn a_broker_that_is_not_a_voter_joins_follows_the_image_and_forwards_writes() {
    let mut c = Cluster::start_with_brokers(3, 1, &[]).expect("start cluster");
    let dump = c.wait_agreed(4, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(dump.contains("broker 4 "), "{dump}");
    let addr = c.node(4).addr();
    assert_eq!(
        cluster::create_topic(addr, "via-broker", 4, 4).expect("create"),
        NONE
    );
    // Answered once node 4's own image has it.
    let m = c.metadata(4).expect("metadata");
    let parts = placement(&m, "via-broker");
    assert_eq!(parts.len(), 4, "{}", cluster::dump(&m));
    for (_, replicas) in &parts {
        let set: BTreeSet<i32> = replicas.iter().copied().collect();
        assert_eq!(set, BTreeSet::from([1, 2, 3, 4]));
    }
    c.wait_agreed(4, AGREE_TIMEOUT, |m| has_topic(m, "via-broker"))
        .expect("every node agrees");
    // Killed, it is fenced; restarted, it catches up.
    c.node(4).kill().expect("kill");
    assert!(create(&mut c, "while-away", 2, 3), "create");
    c.node(4).restart().expect("restart");
    c.wait_agreed(4, AGREE_TIMEOUT, |m| has_topic(m, "while-away"))
        .expect("the broker caught up");
}

fn churn(cycles: usize) {
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut present: BTreeSet<String> = BTreeSet::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    for cycle in 0..cycles {
        let victim = (rand() % 3) as i32 + 1;
        c.node(victim).kill().expect("kill");
        for k in 0..2 {
            let name = format!("churn-{cycle}-{k}");
            if !create(&mut c, &name, 2, 2) {
                panic!("create {name} without node {victim}\n{}", logs(&mut c));
            }
            present.insert(name);
        }
        if let Some(gone) = present
            .iter()
            .nth((rand() as usize) % present.len())
            .cloned()
        {
            assert!(delete(&mut c, &gone), "delete {gone}");
            present.remove(&gone);
            deleted.insert(gone);
        }
        c.node(victim).restart().expect("restart");
    }
    let dump = c
        .wait_agreed(3, AGREE_TIMEOUT, |m| {
            present.iter().all(|t| has_topic(m, t))
        })
        .expect("every node ends with the same metadata");
    for t in &deleted {
        assert!(
            !dump.contains(&format!("topic {t} ")),
            "{t} was deleted:\n{dump}"
        );
    }
}

#[test]
fn random_minority_sigkills_under_topic_churn_lose_no_acknowledged_change() {
    churn(10);
}

#[test]
#[ignore]
fn random_minority_sigkills_under_topic_churn_long() {
    let cycles = std::env::var("CLUSTER_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    churn(cycles);
}

/// Every partition of `topic` is led by its preferred (first) replica with a full ISR.
fn preferred_lead(m: &kafka_protocol::messages::MetadataResponse, topic: &str) -> bool {
    m.topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .is_some_and(|t| {
            !t.partitions.is_empty()
                && t.partitions.iter().all(|p| {
                    p.replica_nodes.first().map(|b| b.0) == Some(p.leader_id.0)
                        && p.isr_nodes.len() == p.replica_nodes.len()
                })
        })
}

/// Every partition of `topic` has its full ISR back (the returned node caught up).
fn isr_full(m: &kafka_protocol::messages::MetadataResponse, topic: &str) -> bool {
    m.topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .is_some_and(|t| {
            !t.partitions.is_empty()
                && t.partitions
                    .iter()
                    .all(|p| p.isr_nodes.len() == p.replica_nodes.len())
        })
}

/// Kills a node that is not the controller and prefers (leads) a partition of `topic`,
/// waits until the survivors lead all of them, restarts it and waits for full ISRs;
/// returns its id.
fn kill_preferred_and_return(c: &mut Cluster, topic: &str) -> i32 {
    c.wait_agreed(3, AGREE_TIMEOUT, |m| preferred_lead(m, topic))
        .expect("preferred replicas lead at creation");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    let victim = (1..=3)
        .find(|id| *id != controller)
        .expect("a non-controller");
    c.node(victim).kill().expect("kill");
    let survivors: Vec<i32> = (1..=3).filter(|id| *id != victim).collect();
    let t0 = Instant::now();
    while !survivors.iter().all(|id| {
        c.metadata(*id)
            .is_ok_and(|m| led_without(&m, topic, victim))
    }) {
        assert!(
            t0.elapsed() < AGREE_TIMEOUT,
            "{victim}'s partitions not moved"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.node(victim).restart().expect("restart");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| isr_full(m, topic))
        .unwrap_or_else(|e| panic!("{victim} did not rejoin the ISRs: {e:#}\n{}", logs(c)));
    victim
}

#[test]
fn a_returning_node_leads_its_preferred_partitions_again() {
    let mut c = Cluster::start(3, &[("leader.imbalance.check.interval.seconds", "1")])
        .expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "pref", 3, 3), "create");
    kill_preferred_and_return(&mut c, "pref");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| preferred_lead(m, "pref"))
        .unwrap_or_else(|e| panic!("leaders not rebalanced: {e:#}\n{}", logs(&mut c)));
}

#[test]
fn elect_leaders_gives_leadership_back_to_the_preferred_replica() {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    use kafka_protocol::messages::{
        ApiKey, ElectLeadersRequest, ElectLeadersResponse, MetadataResponse, TopicName,
    };
    const ELECTION_NOT_NEEDED: i16 = 84;
    let mut c =
        Cluster::start(3, &[("auto.leader.rebalance.enable", "false")]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "elect", 3, 3), "create");
    let victim = kill_preferred_and_return(&mut c, "elect");
    // Without the automatic rebalance the returned node leads nothing.
    let m: MetadataResponse = c.metadata(victim).expect("metadata");
    assert!(!preferred_lead(&m, "elect"), "{}", cluster::dump(&m));

    let addr = c.node(victim).addr();
    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = ElectLeadersRequest::default()
        .with_election_type(0)
        .with_timeout_ms(30_000)
        .with_topic_partitions(Some(vec![
            TopicPartitions::default()
                .with_topic(TopicName("elect".to_string().into()))
                .with_partitions(vec![0, 1, 2]),
        ]));
    let resp: ElectLeadersResponse = conn
        .call(ApiKey::ElectLeaders, 1, &req)
        .expect("ElectLeaders");
    let codes: BTreeMap<i32, i16> = resp
        .replica_election_results
        .iter()
        .flat_map(|t| t.partition_result.iter())
        .map(|p| (p.partition_id, p.error_code))
        .collect();
    let led_by_victim: BTreeSet<i32> = m
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .filter(|p| p.replica_nodes.first().map(|b| b.0) == Some(victim))
        .map(|p| p.partition_index)
        .collect();
    assert!(!led_by_victim.is_empty());
    for (p, code) in &codes {
        let want = if led_by_victim.contains(p) {
            NONE
        } else {
            ELECTION_NOT_NEEDED
        };
        assert_eq!(*code, want, "partition {p}: {resp:?}");
    }
    assert_eq!(codes.len(), 3, "{resp:?}");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| preferred_lead(m, "elect"))
        .expect("preferred leaders after ElectLeaders");
}

#[test]
fn kafka_python_creates_produces_and_consumes_through_different_nodes() {
    let py = weir_tests::broker::python().expect("python");
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("interop/python/cluster_kafka_python.py");
    let (a, b, d) = (
        c.node(1).bootstrap(),
        c.node(2).bootstrap(),
        c.node(3).bootstrap(),
    );
    let out = weir_tests::process::run_bounded(
        std::process::Command::new(py)
            .arg(&script)
            .args([&a, &b, &d, "kp-routed"]),
        Duration::from_secs(300),
    )
    .expect("run kafka-python");
    let text = out.text();
    assert!(out.ok(), "{text}\n{}", logs(&mut c));
    assert!(text.contains("ok: 300 records"), "{text}");
}

/// Every node has two listeners, PLAINTEXT (inter-broker) and CLIENT: a client is told
/// every node's address on the listener it came through (Kafka's rule), in Metadata,
/// DescribeCluster and FindCoordinator. Before, each node registered one address and
/// a CLIENT client was sent to the PLAINTEXT ports.
#[test]
fn clients_are_given_the_addresses_of_the_listener_they_came_through() {
    use kafka_protocol::messages::{
        ApiKey, DescribeClusterRequest, DescribeClusterResponse, FindCoordinatorRequest,
        FindCoordinatorResponse,
    };
    use weir_tests::peer_security::listener_of;
    use weir_tests::raw::RawConn;
    let extra = [
        ("listeners", "PLAINTEXT://127.0.0.1:0,CLIENT://127.0.0.1:0"),
        (
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT",
        ),
        ("inter.broker.listener.name", "PLAINTEXT"),
        ("offsets.topic.replication.factor", "3"),
        ("offsets.topic.num.partitions", "3"),
    ];
    let mut c = Cluster::start(3, &extra).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let mut ports: BTreeMap<&str, BTreeMap<i32, u16>> = BTreeMap::new();
    for name in ["PLAINTEXT", "CLIENT"] {
        for id in 1..=3 {
            let addr = listener_of(&mut c, id, name).expect("listener");
            ports.entry(name).or_default().insert(id, addr.port());
        }
    }
    let deadline = Instant::now() + AGREE_TIMEOUT;
    for name in ["PLAINTEXT", "CLIENT"] {
        let want = &ports[name];
        let at = std::net::SocketAddr::from(([127, 0, 0, 1], want[&2]));
        // Nodes register their listeners with their first heartbeat: wait for all three.
        let brokers = loop {
            let m = cluster::metadata_at(at).expect("metadata");
            let got: BTreeMap<i32, u16> = m
                .brokers
                .iter()
                .map(|b| (b.node_id.0, u16::try_from(b.port).unwrap_or(0)))
                .collect();
            if &got == want || Instant::now() >= deadline {
                break got;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(&brokers, want, "Metadata through {name}");
        let mut conn = RawConn::connect_timeout(at, Duration::from_secs(10)).expect("connect");
        let dc: DescribeClusterResponse = conn
            .call(
                ApiKey::DescribeCluster,
                0,
                &DescribeClusterRequest::default(),
            )
            .expect("DescribeCluster");
        let got: BTreeMap<i32, u16> = dc
            .brokers
            .iter()
            .map(|b| (b.broker_id.0, u16::try_from(b.port).unwrap_or(0)))
            .collect();
        assert_eq!(&got, want, "DescribeCluster through {name}");
        // The coordinator's partition is created on first use; retried until it leads.
        let coordinator = loop {
            let req = FindCoordinatorRequest::default()
                .with_key(kafka_protocol::protocol::StrBytes::from_static_str("g"));
            let r: FindCoordinatorResponse = conn
                .call(ApiKey::FindCoordinator, 3, &req)
                .expect("FindCoordinator");
            if r.error_code == NONE || Instant::now() >= deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            coordinator.error_code, NONE,
            "FindCoordinator through {name}"
        );
        let port = u16::try_from(coordinator.port).unwrap_or(0);
        assert_eq!(
            Some(&port),
            want.get(&coordinator.node_id.0),
            "FindCoordinator through {name}: {coordinator:?}"
        );
    }
}

/// CreateTopics that nothing passes writes no metadata command: answered at once even
/// with no quorum to write to (it waited for a commit of an empty command, up to 15 s).
/// `validate_only` checks the replication factor against the live nodes, as Kafka's
/// controller does.
#[test]
fn create_topics_with_nothing_to_create_writes_nothing_and_validate_only_checks_placement() {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use weir_tests::raw::RawConn;
    let call = |addr, name: &str, rf: i16, validate_only: bool| -> i16 {
        let mut conn = RawConn::connect_timeout(addr, Duration::from_secs(10)).expect("connect");
        let topic = CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_string())))
            .with_num_partitions(1)
            .with_replication_factor(rf);
        let req = CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(30_000)
            .with_validate_only(validate_only);
        let resp: CreateTopicsResponse = conn
            .call(ApiKey::CreateTopics, 5, &req)
            .expect("CreateTopics");
        resp.topics.first().map_or(-1, |t| t.error_code)
    };
    let mut c = Cluster::start(3, &[]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    assert_eq!(
        call(addr, "wide", 4, true),
        38,
        "validate_only, RF 4 of 3 nodes"
    );
    assert_eq!(call(addr, "wide", 3, true), NONE, "validate_only, RF 3");
    assert!(create(&mut c, "there", 1, 3), "create");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| has_topic(m, "there"))
        .expect("every node has it");
    c.node(2).kill().expect("kill 2");
    c.node(3).kill().expect("kill 3");
    let started = Instant::now();
    assert_eq!(call(addr, "there", 1, false), TOPIC_ALREADY_EXISTS);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered without a quorum write: {:?}",
        started.elapsed()
    );
}

/// A broker-only node restarted while no voter runs serves no client until it has the
/// quorum's image (Kafka's broker enables request processing once caught up with the
/// metadata log): no ready line meanwhile — it would answer Metadata with no topics —
/// and once a voter majority is back its first Metadata lists the topic.
#[test]
fn a_broker_only_node_restarted_without_a_quorum_serves_no_one_until_it_has_the_image() {
    /// How long the restarted broker is watched for a ready line: well past the time one
    /// takes to start here (with the image, about a second).
    const NOT_READY_FOR: Duration = Duration::from_secs(6);
    let mut c = Cluster::start_with_brokers(3, 1, &[]).expect("start cluster");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "kept", 2, 3), "create");
    c.wait_agreed(4, AGREE_TIMEOUT, |m| has_topic(m, "kept"))
        .expect("every node has it");
    for id in 1..=4 {
        c.node(id).kill().expect("kill");
    }
    let (voters, brokers) = c.nodes.split_at_mut(3);
    let broker = &mut brokers[0];
    std::thread::scope(|scope| {
        let restarted = scope.spawn(|| broker.restart().map(|()| Instant::now()));
        let watched = Instant::now();
        while watched.elapsed() < NOT_READY_FOR {
            assert!(
                !restarted.is_finished(),
                "the broker-only node became ready with no quorum, after {:?}",
                watched.elapsed()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let voters_back = Instant::now();
        for v in voters.iter_mut() {
            v.restart().expect("restart a voter");
        }
        let ready_at = restarted
            .join()
            .expect("restart thread")
            .expect("the broker-only node became ready once the voters were back");
        assert!(ready_at > voters_back, "ready before the voters were back");
    });
    let m = c.metadata(4).expect("metadata");
    assert!(
        has_topic(&m, "kept"),
        "the first Metadata of the restarted broker-only node: {}",
        cluster::dump(&m)
    );
}

/// Clears the immutable flag it set, whatever the test's outcome (the temp dir must be
/// removable).
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn set(path: std::path::PathBuf) -> anyhow::Result<Immutable> {
        let out = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&path)
            .output()?;
        anyhow::ensure!(out.status.success(), "chattr +i: {out:?}");
        Ok(Immutable(path))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// The active controller's Raft files cannot be written (here: its controller directory
/// made immutable, as a failed disk would refuse them): openraft stops its core, and the
/// node halts rather than go on renewing leases and answering heartbeats as leader from
/// metadata that no longer moves. The other voters carry on (found by review).
#[test]
fn a_controller_whose_raft_files_cannot_be_written_halts_and_the_others_carry_on()
-> anyhow::Result<()> {
    let mut cluster = Cluster::start(3, &[])?;
    let leader = cluster.controller(Duration::from_secs(60))?;
    let other = if leader == 1 { 2 } else { 1 };
    let dir = cluster.node(leader).data_dir().join("controller");
    let guard = Immutable::set(dir)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while cluster.node(leader).is_alive() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {leader} still runs:\n{}",
            cluster.log_tails(30)
        );
        // Each creation is a commit the leader must record.
        let addr = cluster.node(other).addr();
        let _ = cluster::create_topic(addr, &format!("t{n}"), 1, 1);
        n += 1;
    }
    drop(guard);
    let log = cluster.node(leader).log_text();
    anyhow::ensure!(log.contains("Raft core stopped"), "{log}");
    let next = cluster.controller(Duration::from_secs(60))?;
    anyhow::ensure!(next != leader);
    let addr = cluster.node(other).addr();
    anyhow::ensure!(
        cluster::create_topic(addr, "after", 1, 2)? == 0,
        "the quorum of two commits"
    );
    Ok(())
}

/// A second process started with the node id of a running broker (its own data dir and
/// ports, a copied config) is refused by the controller while the first heartbeats: it
/// never registers, gets no image, never becomes ready and says why; the first stays
/// the registered node 4 (at its address) and keeps leading its partition. Before, the
/// two took turns registering, and both renewed leases as leader of the same partitions.
#[test]
fn a_second_process_with_a_running_nodes_id_is_refused_and_the_first_keeps_leading() {
    const REFUSED: &str = "the controller refuses this node's heartbeats";
    /// How long node 4 must stay the first process (many heartbeat intervals).
    const WATCH: Duration = Duration::from_secs(4);
    let mut c = Cluster::start_with_brokers(3, 1, &[]).expect("start cluster");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    let created = cluster::create_topic_assigned(addr, "dup", &[vec![4, 1, 2]]);
    assert_eq!(created.expect("create"), NONE);
    c.wait_agreed(4, AGREE_TIMEOUT, |m| {
        placement(m, "dup") == [(4, vec![4, 1, 2])]
    })
    .expect("node 4 leads dup");
    let first = c.node(4).addr();
    let config = c.node(4).config_mut().clone();
    let mut second = weir_tests::broker::Weir::start_until(config, REFUSED)
        .unwrap_or_else(|e| panic!("the second process is refused: {e:#}\n{}", logs(&mut c)));
    let watched = Instant::now();
    while watched.elapsed() < WATCH {
        for id in 1..=3 {
            let m = c.metadata(id).expect("metadata");
            let four = m.brokers.iter().find(|b| b.node_id.0 == 4).map(|b| b.port);
            assert_eq!(
                four,
                Some(i32::from(first.port())),
                "node {id} names another process as node 4: {}",
                cluster::dump(&m)
            );
            assert_eq!(placement(&m, "dup"), [(4, vec![4, 1, 2])]);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = second.log_text();
    assert!(
        !text.contains("weir ready"),
        "the second process became ready:\n{}",
        second.log_tail(30)
    );
    second.kill().expect("kill the second process");
    // The first one still answers as node 4.
    c.metadata(4).expect("node 4 answers");
}

/// ElectLeaders PREFERRED with a null partition list (every partition): as Kafka, the
/// partitions whose preferred replica already leads are left out, and every other one is
/// listed with its result: here PREFERRED_LEADER_NOT_AVAILABLE for the partitions whose
/// preferred replica is down. Before, every result but NONE was dropped, so the answer
/// was empty and said nothing of the partitions that could not be elected.
#[test]
fn elect_leaders_of_every_partition_lists_those_it_could_not_elect() {
    use kafka_protocol::messages::{ApiKey, ElectLeadersRequest, ElectLeadersResponse};
    const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
    let mut c =
        Cluster::start(3, &[("auto.leader.rebalance.enable", "false")]).expect("start cluster");
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true).expect("agree");
    assert!(create(&mut c, "every", 3, 3), "create");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| preferred_lead(m, "every"))
        .expect("preferred replicas lead at creation");
    let controller = c.controller(AGREE_TIMEOUT).expect("controller");
    let victim = (1..=3)
        .find(|id| *id != controller)
        .expect("a non-controller");
    let m = c.metadata(victim).expect("metadata");
    let preferred_by_victim: BTreeSet<i32> = placement(&m, "every")
        .iter()
        .enumerate()
        .filter(|(_, (_, replicas))| replicas.first() == Some(&victim))
        .map(|(p, _)| p as i32)
        .collect();
    assert!(!preferred_by_victim.is_empty(), "{}", cluster::dump(&m));
    c.node(victim).kill().expect("kill");
    let survivors: Vec<i32> = (1..=3).filter(|id| *id != victim).collect();
    let t0 = Instant::now();
    while !survivors.iter().all(|id| {
        c.metadata(*id)
            .is_ok_and(|m| led_without(&m, "every", victim))
    }) {
        assert!(
            t0.elapsed() < AGREE_TIMEOUT,
            "{victim}'s partitions not moved"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let addr = c.node(controller).addr();
    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = ElectLeadersRequest::default()
        .with_election_type(0)
        .with_timeout_ms(30_000)
        .with_topic_partitions(None);
    let resp: ElectLeadersResponse = conn
        .call(ApiKey::ElectLeaders, 1, &req)
        .expect("ElectLeaders");
    let listed: BTreeMap<(String, i32), i16> = resp
        .replica_election_results
        .iter()
        .flat_map(|t| {
            t.partition_result
                .iter()
                .map(|p| ((t.topic.0.to_string(), p.partition_id), p.error_code))
        })
        .collect();
    let want: BTreeMap<(String, i32), i16> = preferred_by_victim
        .iter()
        .map(|p| (("every".to_string(), *p), PREFERRED_LEADER_NOT_AVAILABLE))
        .collect();
    assert_eq!(listed, want, "{resp:?}");
}

/// (leader, ISR) of partition 0 of `topic` as node `id` reports it.
fn leader_and_isr(c: &mut Cluster, id: i32, topic: &str) -> Option<(i32, Vec<i32>)> {
    let m = c.metadata(id).ok()?;
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    let p = t.partitions.iter().find(|p| p.partition_index == 0)?;
    Some((p.leader_id.0, p.isr_nodes.iter().map(|b| b.0).collect()))
}

/// Waits until the voters report (leader, ISR) of `topic`-0 that `ok` accepts.
fn wait_leader_and_isr(c: &mut Cluster, topic: &str, ok: impl Fn(&(i32, Vec<i32>)) -> bool) {
    let t0 = Instant::now();
    loop {
        let seen: Vec<_> = (1..=3).map(|id| leader_and_isr(c, id, topic)).collect();
        if seen.iter().all(|s| s.as_ref().is_some_and(&ok)) {
            return;
        }
        assert!(
            t0.elapsed() < AGREE_TIMEOUT,
            "not reached: {seen:?}\n{}",
            logs(c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A partition whose last ISR member is gone for good stays offline (no clean election
/// can lead it), and ElectLeaders UNCLEAN is the way out, as in Kafka: its live replica
/// that had left the ISR leads under a new epoch with the ISR itself alone, and takes
/// writes again. Before, UNCLEAN always answered ELIGIBLE_LEADERS_NOT_AVAILABLE.
#[test]
fn elect_leaders_unclean_brings_back_a_partition_whose_isr_is_gone() {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    use kafka_protocol::messages::{ApiKey, ElectLeadersRequest, ElectLeadersResponse, TopicName};
    const TOPIC: &str = "unclean";
    let mut c = Cluster::start_with_brokers(3, 2, &[]).expect("start cluster");
    c.wait_agreed(5, AGREE_TIMEOUT, |_| true).expect("agree");
    let addr = c.node(1).addr();
    let created = cluster::create_topic_assigned(addr, TOPIC, &[vec![4, 5]]);
    assert_eq!(created.expect("create"), NONE);
    wait_leader_and_isr(&mut c, TOPIC, |(l, isr)| *l == 4 && isr.len() == 2);
    // 5 dies: fenced, it leaves the ISR. Then 4, the last ISR member, for good.
    c.node(5).kill().expect("kill 5");
    wait_leader_and_isr(&mut c, TOPIC, |(l, isr)| *l == 4 && *isr == [4]);
    c.node(4).kill().expect("kill 4");
    wait_leader_and_isr(&mut c, TOPIC, |(l, isr)| *l == -1 && *isr == [4]);
    // 5 is back, but not in the ISR: still offline.
    c.node(5).restart().expect("restart 5");
    c.wait_agreed(4, AGREE_TIMEOUT, |_| true)
        .expect("5 registered");
    wait_leader_and_isr(&mut c, TOPIC, |(l, _)| *l == -1);

    let mut conn = weir_tests::raw::RawConn::connect(addr).expect("connect");
    let req = ElectLeadersRequest::default()
        .with_election_type(1)
        .with_timeout_ms(30_000)
        .with_topic_partitions(Some(vec![
            TopicPartitions::default()
                .with_topic(TopicName(TOPIC.to_string().into()))
                .with_partitions(vec![0]),
        ]));
    let resp: ElectLeadersResponse = conn
        .call(ApiKey::ElectLeaders, 1, &req)
        .expect("ElectLeaders");
    let codes: Vec<i16> = resp
        .replica_election_results
        .iter()
        .flat_map(|t| t.partition_result.iter().map(|p| p.error_code))
        .collect();
    assert_eq!(codes, [NONE], "{resp:?}");
    wait_leader_and_isr(&mut c, TOPIC, |(l, isr)| *l == 5 && *isr == [5]);
    let bootstrap = c.node(5).bootstrap();
    let (p, log) = weir_tests::clients::producer(&bootstrap, "all", "none", &[]).expect("producer");
    let records = weir_tests::clients::make_records(0, 50, "u", weir_tests::clients::now_ms());
    weir_tests::clients::produce_all(&p, TOPIC, &records, Some(0)).expect("produce");
    assert!(log.failed().is_empty(), "failed: {:?}", log.failed());
    assert_eq!(log.acked().len(), 50);
}
