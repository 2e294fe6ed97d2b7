//! Several `weir serve` processes forming one cluster on 127.0.0.1: node ids 1..=n, each
//! a voter of `controller.quorum.voters` on a controller port chosen here (free ephemeral
//! ports, kept across restarts), client ports ephemeral. Metadata is read with a raw
//! client and reduced to a canonical [`dump`] that nodes can be compared by.
//! [`Cluster::start_faulty`] puts fault proxies ([`FaultNet`]) between the nodes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::broker::{Weir, WeirConfig};
use crate::proxy::{FaultProxy, Mode};
use crate::raw::RawConn;

/// Metadata version the harness reads (leader epochs, offline replicas, cluster id).
const METADATA_VERSION: i16 = 9;
/// Tries of [`Cluster::start_faulty`] (a chosen controller port taken meanwhile).
const START_TRIES: usize = 3;
/// How long one request to a node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Ports on 127.0.0.1 for a node to bind itself (controller, fixed listeners), each free
/// when chosen and not handed out again by this process until its cursor has gone round
/// the whole range (over 20,000 ports here).
///
/// They come from below the kernel's ephemeral range (`ip_local_port_range`), where
/// nothing binds by itself: a port the kernel chose for `bind(0)` and that was released
/// again can be the next `bind(0)` of a test running beside (its proxy, its node's client
/// listener, an outgoing connection) before the node takes it. With ephemeral ports, two
/// tests of one binary once got the same controller port: one node failed to start and
/// another test's nodes formed two clusters.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    use std::sync::Mutex;
    /// Next candidate; starts at a per-process offset so two test processes differ.
    static CURSOR: Mutex<Option<u16>> = Mutex::new(None);
    const LOWEST: u16 = 10_000;
    let ceiling = ephemeral_range_start().max(LOWEST + 1_000);
    let span = u32::from(ceiling - LOWEST);
    let mut cursor = CURSOR.lock().unwrap_or_else(|e| e.into_inner());
    let mut next =
        cursor.unwrap_or_else(|| LOWEST + (std::process::id().wrapping_mul(7_919) % span) as u16);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..span {
        if ports.len() == n {
            break;
        }
        let port = next;
        next = if next + 1 >= ceiling {
            LOWEST
        } else {
            next + 1
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    *cursor = Some(next);
    if ports.len() < n {
        bail!("only {} free ports below {ceiling}", ports.len());
    }
    Ok(ports)
}

/// The first port of the kernel's ephemeral range (32768 if it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A cluster under test; dropping it kills every node.
pub struct Cluster {
    /// Node `i` has id `i + 1` (stopped ones stay, to restart).
    pub nodes: Vec<Weir>,
}

impl Cluster {
    /// Starts `n` voters with short (test) timeouts plus `extra` settings.
    pub fn start(n: usize, extra: &[(&str, &str)]) -> Result<Cluster> {
        Cluster::start_with_brokers(n, 0, extra)
    }

    /// Starts `n` voters with `extra`, then for node `id` the settings of `per_node`
    /// naming it (e.g. one node's own truststore).
    pub fn start_per_node(
        n: usize,
        extra: &[(&str, &str)],
        per_node: &[(i32, &str, &str)],
    ) -> Result<Cluster> {
        let voters = voters_on_free_ports(n)?;
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = i as i32 + 1;
            let mut config = node_config(i + 1, &voters, extra);
            for (_, k, v) in per_node.iter().filter(|(node, ..)| *node == id) {
                config = config.set(k, v);
            }
            nodes.push(Weir::start(config).with_context(|| format!("start node {id}"))?);
        }
        Ok(Cluster { nodes })
    }

    /// Starts `n` voters (ids 1..=n) and `brokers` broker-only nodes (ids after them).
    pub fn start_with_brokers(n: usize, brokers: usize, extra: &[(&str, &str)]) -> Result<Cluster> {
        let voters = voters_on_free_ports(n)?;
        let mut nodes = Vec::new();
        for i in 0..n + brokers {
            let config = node_config(i + 1, &voters, extra);
            nodes.push(Weir::start(config).with_context(|| format!("start node {}", i + 1))?);
        }
        Ok(Cluster { nodes })
    }

    /// [`start_with_brokers`](Self::start_with_brokers), with the data dir of each node
    /// named in `parents` made inside that directory (e.g. a small filesystem of its own).
    pub fn start_with_brokers_in(
        n: usize,
        brokers: usize,
        extra: &[(&str, &str)],
        parents: &[(i32, &std::path::Path)],
    ) -> Result<Cluster> {
        let voters = voters_on_free_ports(n)?;
        let mut nodes = Vec::new();
        for i in 0..n + brokers {
            let id = i as i32 + 1;
            let config = node_config(i + 1, &voters, extra);
            let weir = match parents.iter().find(|(node, _)| *node == id) {
                Some((_, parent)) => Weir::start_in(config, parent),
                None => Weir::start(config),
            };
            nodes.push(weir.with_context(|| format!("start node {id}"))?);
        }
        Ok(Cluster { nodes })
    }

    /// Starts `n` voters of `shards` shards each (the others run one shard): for what
    /// happens between a node's shards, e.g. a coordinator on another shard.
    pub fn start_sharded(n: usize, shards: usize, extra: &[(&str, &str)]) -> Result<Cluster> {
        let voters = voters_on_free_ports(n)?;
        let mut nodes = Vec::new();
        for i in 0..n {
            let mut config = node_config(i + 1, &voters, extra);
            config.shards = Some(shards);
            nodes.push(Weir::start(config).with_context(|| format!("start node {}", i + 1))?);
        }
        Ok(Cluster { nodes })
    }

    /// Starts `n` voters behind fault proxies ([`FaultNet`]): each node advertises a
    /// Kafka-aware proxy in front of its listener (clients and followers reach it through
    /// that), and names every other voter in `controller.quorum.voters` by a proxy of
    /// its own for that pair, so the controller traffic (Raft, heartbeats, forwarded
    /// writes) between any two nodes can be cut one way or both.
    ///
    /// The controller ports are chosen free and released before the nodes bind them; a
    /// port taken meanwhile (by any socket of a test running beside: proxies and their
    /// connections take many) fails a node's start, and the whole start is tried again.
    pub fn start_faulty(n: usize, extra: &[(&str, &str)]) -> Result<(Cluster, FaultNet)> {
        Cluster::start_faulty_advertising(n, "127.0.0.1", extra)
    }

    /// [`start_faulty`](Self::start_faulty), every node advertising its proxy by `host`
    /// (a name that resolves to 127.0.0.1, such as `localhost`) instead of the IP.
    pub fn start_faulty_advertising(
        n: usize,
        host: &str,
        extra: &[(&str, &str)],
    ) -> Result<(Cluster, FaultNet)> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Cluster::start_faulty_once(n, host, extra) {
                Ok(started) => return Ok(started),
                Err(e) if tries < START_TRIES => {
                    eprintln!("cluster start {tries} of {START_TRIES} failed, again: {e:#}");
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn start_faulty_once(
        n: usize,
        host: &str,
        extra: &[(&str, &str)],
    ) -> Result<(Cluster, FaultNet)> {
        let ports = free_ports(n)?;
        let real = |id: usize| SocketAddr::from(([127, 0, 0, 1], ports[id - 1]));
        let mut links = BTreeMap::new();
        for from in 1..=n {
            for to in (1..=n).filter(|to| *to != from) {
                let proxy = FaultProxy::tcp(Some(real(to)))?;
                links.insert((from as i32, to as i32), proxy);
            }
        }
        let listeners: Vec<FaultProxy> = (0..n)
            .map(|_| FaultProxy::kafka(None))
            .collect::<Result<_>>()?;
        let mut nodes = Vec::new();
        for id in 1..=n {
            let voters: Vec<String> = (1..=n)
                .map(|to| match links.get(&(id as i32, to as i32)) {
                    Some(p) => format!("{to}@{}", p.addr()),
                    None => format!("{to}@{}", real(to)),
                })
                .collect();
            let port = listeners[id - 1].addr().port();
            let advertised = format!("PLAINTEXT://{host}:{port}");
            let config =
                node_config(id, &voters.join(","), extra).set("advertised.listeners", advertised);
            let node = Weir::start(config).with_context(|| format!("start node {id}"))?;
            listeners[id - 1].set_target(node.addr());
            nodes.push(node);
        }
        Ok((Cluster { nodes }, FaultNet { listeners, links }))
    }

    /// The node with id `id`.
    pub fn node(&mut self, id: i32) -> &mut Weir {
        let i = usize::try_from(id - 1).unwrap_or(0);
        &mut self.nodes[i]
    }

    /// The last `lines` log lines of every node (live or not), for failure messages.
    pub fn log_tails(&mut self, lines: usize) -> String {
        (1..=self.nodes.len() as i32)
            .map(|id| format!("--- node {id}:\n{}", self.node(id).log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Ids of the running nodes.
    pub fn live(&mut self) -> Vec<i32> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_alive())
            .map(|i| i as i32 + 1)
            .collect()
    }

    /// Metadata (all topics) from node `id`.
    pub fn metadata(&mut self, id: i32) -> Result<MetadataResponse> {
        let addr = self.node(id).addr();
        metadata_at(addr)
    }

    /// Waits (bounded) until every live node reports the same dump with `want` brokers
    /// and a controller, and `check` accepts it; returns the dump.
    pub fn wait_agreed(
        &mut self,
        want_brokers: usize,
        timeout: Duration,
        check: impl Fn(&MetadataResponse) -> bool,
    ) -> Result<String> {
        self.wait_agreed_among(None, want_brokers, timeout, check)
    }

    /// [`wait_agreed`](Self::wait_agreed) over the nodes `among` only (`None`: every live
    /// node), e.g. the majority side of a network partition.
    pub fn wait_agreed_among(
        &mut self,
        among: Option<&[i32]>,
        want_brokers: usize,
        timeout: Duration,
        check: impl Fn(&MetadataResponse) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            let live = match among {
                Some(ids) => ids.to_vec(),
                None => self.live(),
            };
            let mut dumps = Vec::new();
            let mut ok = true;
            for id in &live {
                match self.metadata(*id) {
                    Ok(m) => {
                        ok &=
                            m.brokers.len() == want_brokers && m.controller_id.0 >= 0 && check(&m);
                        dumps.push(dump(&m));
                    }
                    Err(e) => {
                        ok = false;
                        dumps.push(format!("error: {e:#}"));
                    }
                }
            }
            if ok && dumps.windows(2).all(|w| w[0] == w[1]) {
                return Ok(dumps.swap_remove(0));
            }
            last = dumps
                .iter()
                .zip(&live)
                .map(|(d, id)| format!("node {id}:\n{d}"))
                .collect::<Vec<_>>()
                .join("\n");
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("nodes did not agree within {timeout:?}; last dumps:\n{last}")
    }

    /// The controller every live node reports, once they agree (bounded).
    pub fn controller(&mut self, timeout: Duration) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let live = self.live();
            let ids: Vec<i32> = live
                .iter()
                .filter_map(|id| self.metadata(*id).ok().map(|m| m.controller_id.0))
                .collect();
            if ids.len() == live.len()
                && ids.first().is_some_and(|c| live.contains(c))
                && ids.windows(2).all(|w| w[0] == w[1])
            {
                return Ok(ids[0]);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("no agreed live controller within {timeout:?}")
    }
}

/// A cluster node's settings: short (test) timeouts, then `extra`.
fn node_config(id: usize, voters: &str, extra: &[(&str, &str)]) -> WeirConfig {
    // Unpinned: by default every node would pin its shard 0 to CPU 0, and the whole
    // cluster would share one core.
    let mut config = WeirConfig::shards(1)
        .set("weir.shard.cpus", "none")
        .set("node.id", id)
        .set("controller.quorum.voters", voters)
        .set("broker.heartbeat.interval.ms", 200)
        .set("broker.session.timeout.ms", 3000)
        .set("controller.quorum.election.timeout.ms", 500);
    for (k, v) in extra {
        config = config.set(k, v);
    }
    config
}

/// The client id of node `id`'s replica fetchers (`node/src/replication/client.rs`).
pub fn fetcher_client_id(id: i32) -> String {
    format!("weir-replica-fetcher-{id}")
}

/// The fault proxies of a cluster from [`Cluster::start_faulty`].
pub struct FaultNet {
    /// Node `i + 1`'s advertised listener: a Kafka-aware proxy in front of its real one.
    pub listeners: Vec<FaultProxy>,
    /// `(from, to)`: where node `from` reaches voter `to`'s controller port.
    pub links: BTreeMap<(i32, i32), FaultProxy>,
}

impl FaultNet {
    /// The proxy in front of node `id`'s listener.
    ///
    /// # Panics
    /// On an id the cluster does not have (a test bug).
    pub fn listener(&self, id: i32) -> &FaultProxy {
        &self.listeners[usize::try_from(id - 1).unwrap_or(usize::MAX)]
    }

    /// The proxy node `from` reaches voter `to` through.
    ///
    /// # Panics
    /// On a pair the cluster does not have (a test bug).
    pub fn link(&self, from: i32, to: i32) -> &FaultProxy {
        &self.links[&(from, to)]
    }

    /// Applies `mode` to `follower`'s replica fetches from `leader` (at the leader's
    /// listener proxy); clients and other followers pass.
    pub fn cut_fetches(&self, follower: i32, leader: i32, mode: Mode) {
        self.listener(leader)
            .set_client_mode(&fetcher_client_id(follower), mode);
    }

    /// Applies `mode` to everything between node `x` and the others: the controller
    /// links both ways, `x`'s fetches from them and theirs from `x`. Clients (the test)
    /// still reach `x` and the others directly.
    pub fn isolate(&self, x: i32, mode: Mode) {
        for ((from, to), p) in &self.links {
            if *from == x || *to == x {
                p.set_mode(mode);
            }
        }
        let n = self.listeners.len() as i32;
        for other in (1..=n).filter(|o| *o != x) {
            self.cut_fetches(x, other, mode);
            self.cut_fetches(other, x, mode);
        }
    }

    /// Applies `mode` to everything between the nodes of `side` and the others (a network
    /// split: each side still reaches its own members). Clients (the test) reach all.
    pub fn split(&self, side: &[i32], mode: Mode) {
        for ((from, to), p) in &self.links {
            if side.contains(from) != side.contains(to) {
                p.set_mode(mode);
            }
        }
        let n = self.listeners.len() as i32;
        for a in side {
            for b in (1..=n).filter(|b| !side.contains(b)) {
                self.cut_fetches(*a, b, mode);
                self.cut_fetches(b, *a, mode);
            }
        }
    }

    /// Everything passes again; what a blackhole held flows on (a short cut: TCP
    /// delivers it late).
    pub fn heal(&self) {
        for p in self.links.values().chain(&self.listeners) {
            p.heal();
        }
    }

    /// Heals the cut of [`isolate`](Self::isolate)`(x, ..)` as TCP does after a long cut
    /// (the connections were given up): those connections are closed first, so nothing
    /// they held is delivered late; then everything passes.
    pub fn heal_dropping_held(&self, x: i32, timeout: Duration) -> Result<()> {
        self.isolate(x, Mode::Refuse);
        let n = self.listeners.len() as i32;
        for ((from, to), p) in &self.links {
            if *from == x || *to == x {
                p.wait_for(timeout, |p| p.stats().open == 0)?;
            }
        }
        for other in (1..=n).filter(|o| *o != x) {
            let (of_x, of_other) = (fetcher_client_id(x), fetcher_client_id(other));
            self.listener(other)
                .wait_for(timeout, |p| p.client_stats(&of_x).open == 0)?;
            self.listener(x)
                .wait_for(timeout, |p| p.client_stats(&of_other).open == 0)?;
        }
        self.heal();
        Ok(())
    }

    /// After node `id` restarted (a new ephemeral port): its proxy forwards there.
    pub fn retarget(&self, c: &mut Cluster, id: i32) {
        let addr = c.node(id).addr();
        self.listener(id).set_target(addr);
    }
}

/// The record batches of every `.log` segment in `dir`, concatenated in offset order, cut
/// at the end of the last whole batch (preallocated space and block padding dropped):
/// two replicas hold the same log when these bytes are equal.
pub fn log_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    segments.retain(|p| p.extension().is_some_and(|e| e == "log"));
    segments.sort();
    let mut out = Vec::new();
    for seg in segments {
        let bytes = std::fs::read(&seg).unwrap_or_default();
        let mut at = 0usize;
        while at + 12 <= bytes.len() {
            let len =
                i32::from_be_bytes([bytes[at + 8], bytes[at + 9], bytes[at + 10], bytes[at + 11]]);
            let Ok(len) = usize::try_from(len) else { break };
            if len == 0 || at + 12 + len > bytes.len() {
                break;
            }
            out.extend_from_slice(&bytes[at..at + 12 + len]);
            at += 12 + len;
        }
    }
    out
}

/// Metadata v9 for all topics from `addr`.
pub fn metadata_at(addr: SocketAddr) -> Result<MetadataResponse> {
    let mut conn = RawConn::connect_timeout(addr, CALL_TIMEOUT)?;
    conn.call(
        ApiKey::Metadata,
        METADATA_VERSION,
        &MetadataRequest::default().with_topics(None::<Vec<MetadataRequestTopic>>),
    )
}

/// CreateTopics (v5) of one topic at `addr`; returns its error code.
pub fn create_topic(addr: SocketAddr, name: &str, partitions: i32, rf: i16) -> Result<i16> {
    create_topic_with(addr, name, partitions, rf, &[])
}

/// CreateTopics (v5) of one topic at `addr` with topic configs (e.g. `segment.bytes`);
/// returns its error code.
pub fn create_topic_with(
    addr: SocketAddr,
    name: &str,
    partitions: i32,
    rf: i16,
    configs: &[(&str, &str)],
) -> Result<i16> {
    let mut conn = RawConn::connect_timeout(addr, CALL_TIMEOUT)?;
    let configs = configs
        .iter()
        .map(|(k, v)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_value(Some(StrBytes::from_string(v.to_string())))
        })
        .collect();
    let topic = CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_string(name.to_string())))
        .with_num_partitions(partitions)
        .with_replication_factor(rf)
        .with_configs(configs);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(30_000);
    let resp: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 5, &req)?;
    Ok(resp.topics.first().map_or(-1, |t| t.error_code))
}

/// CreateTopics (v5) of one topic at `addr` with explicit replica lists, one per
/// partition (the first replica leads); returns its error code.
pub fn create_topic_assigned(addr: SocketAddr, name: &str, lists: &[Vec<i32>]) -> Result<i16> {
    let mut conn = RawConn::connect_timeout(addr, CALL_TIMEOUT)?;
    let assignments = lists
        .iter()
        .enumerate()
        .map(|(p, replicas)| {
            CreatableReplicaAssignment::default()
                .with_partition_index(p as i32)
                .with_broker_ids(replicas.iter().map(|r| BrokerId(*r)).collect())
        })
        .collect();
    let topic = CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_string(name.to_string())))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(assignments);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(30_000);
    let resp: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 5, &req)?;
    Ok(resp.topics.first().map_or(-1, |t| t.error_code))
}

/// DeleteTopics (v4) of one topic at `addr`; returns its error code.
pub fn delete_topic(addr: SocketAddr, name: &str) -> Result<i16> {
    let mut conn = RawConn::connect_timeout(addr, CALL_TIMEOUT)?;
    let req = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(StrBytes::from_string(name.to_string()))])
        .with_timeout_ms(30_000);
    let resp: DeleteTopicsResponse = conn.call(ApiKey::DeleteTopics, 4, &req)?;
    Ok(resp.responses.first().map_or(-1, |t| t.error_code))
}

/// A canonical text of what a node says about the cluster: brokers (id, address),
/// controller, cluster id, and per topic per partition leader, epoch, replicas, ISR.
/// Two nodes agree when their dumps are byte for byte the same.
pub fn dump(m: &MetadataResponse) -> String {
    let mut out = String::new();
    let mut brokers: Vec<_> = m
        .brokers
        .iter()
        .map(|b| (b.node_id.0, b.host.to_string(), b.port))
        .collect();
    brokers.sort();
    let _ = writeln!(
        out,
        "cluster {:?} controller {}",
        m.cluster_id.as_ref().map(|c| c.to_string()),
        m.controller_id.0
    );
    for (id, host, port) in brokers {
        let _ = writeln!(out, "broker {id} {host}:{port}");
    }
    let mut topics: Vec<_> = m.topics.iter().collect();
    topics.sort_by_key(|t| t.name.as_ref().map(|n| n.0.to_string()));
    for t in topics {
        let name = t.name.as_ref().map_or(String::new(), |n| n.0.to_string());
        let _ = writeln!(out, "topic {name} error {}", t.error_code);
        let mut parts: Vec<_> = t.partitions.iter().collect();
        parts.sort_by_key(|p| p.partition_index);
        for p in parts {
            let ids = |v: &[kafka_protocol::messages::BrokerId]| {
                v.iter()
                    .map(|b| b.0.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let _ = writeln!(
                out,
                "  p{} leader {} epoch {} replicas [{}] isr [{}] error {}",
                p.partition_index,
                p.leader_id.0,
                p.leader_epoch,
                ids(&p.replica_nodes),
                ids(&p.isr_nodes),
                p.error_code
            );
        }
    }
    out
}

/// `controller.quorum.voters` for voters 1..=n, each on a free port of 127.0.0.1.
fn voters_on_free_ports(n: usize) -> Result<String> {
    let voters: Vec<String> = free_ports(n)?
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}@127.0.0.1:{p}", i + 1))
        .collect();
    Ok(voters.join(","))
}
