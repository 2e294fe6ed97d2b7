//! Shared setup of the node-to-node security tests (`tests/cluster_tls.rs`,
//! `tests/cluster_peer_security.rs`): a test PKI with its server keystore, the config keys
//! of a cluster whose nodes talk TLS, and the waits and checks both make.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kafka_protocol::messages::MetadataResponse;

use crate::certs::{self, TestPki};
use crate::cluster::{Cluster, create_topic};

/// Bound on every wait for the quorum and replication (a loaded 2-core machine).
pub const AGREE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a voter kept out of the quorum is watched not to register (well past many
/// heartbeat intervals of 200 ms).
const KEPT_OUT_WATCH: Duration = Duration::from_secs(3);
/// Lines of each node's log a failure carries.
const TAIL_LINES: usize = 40;

/// A test PKI in a temporary directory (removed on drop) and the PEM server keystore
/// made from it.
pub struct PeerPki {
    pub pki: TestPki,
    pub keystore: PathBuf,
    _dir: tempfile::TempDir,
}

impl PeerPki {
    /// The server certificate names 127.0.0.1 and localhost.
    pub fn new() -> Result<PeerPki> {
        PeerPki::make(TestPki::server_keystore)
    }

    /// The server certificate names `DNS:localhost` only.
    pub fn localhost_only() -> Result<PeerPki> {
        PeerPki::make(TestPki::localhost_only_keystore)
    }

    fn make(keystore: impl Fn(&TestPki) -> Result<PathBuf>) -> Result<PeerPki> {
        let dir = tempfile::tempdir()?;
        let pki = certs::make(dir.path())?;
        let keystore = keystore(&pki)?;
        Ok(PeerPki {
            pki,
            keystore,
            _dir: dir,
        })
    }

    /// The CA every node trusts unless told otherwise.
    pub fn ca(&self) -> &Path {
        &self.pki.ca_pem
    }

    /// The PEM keystore of every TLS listener and, if given, the truststore.
    pub fn tls_keys(&self, truststore: Option<&Path>) -> Vec<(&'static str, String)> {
        let mut keys = vec![
            ("ssl.keystore.type", "PEM".to_string()),
            ("ssl.keystore.location", self.keystore.display().to_string()),
        ];
        if let Some(ca) = truststore {
            keys.push(("ssl.truststore.location", ca.display().to_string()));
        }
        keys
    }

    /// A PLAINTEXT listener (the harness's metadata reads and topic creation) and an SSL
    /// one, the inter-broker listener (and the clients'), both on 127.0.0.1; a controller
    /// port named `CONTROLLER` speaks SSL; replicated as [`replicated_keys`].
    pub fn ssl_between_nodes(&self, truststore: Option<&Path>) -> Vec<(&'static str, String)> {
        let mut keys = vec![
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0".to_string(),
            ),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:SSL".to_string(),
            ),
            ("inter.broker.listener.name", "SSL".to_string()),
        ];
        keys.extend(self.tls_keys(truststore));
        keys.extend(replicated_keys());
        keys
    }
}

/// RF 3 and `min.insync.replicas=2`: acks=all succeeds only while followers replicate.
pub fn replicated_keys() -> Vec<(&'static str, String)> {
    vec![
        ("default.replication.factor", "3".to_string()),
        ("min.insync.replicas", "2".to_string()),
    ]
}

/// Owned settings as [`Cluster::start`] takes them.
pub fn refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, s)| (*k, s.as_str())).collect()
}

/// Owned per-node settings as [`Cluster::start_per_node`] takes them.
pub fn per_node_refs<'a>(
    v: &'a [(i32, &'static str, String)],
) -> Vec<(i32, &'static str, &'a str)> {
    v.iter().map(|(id, k, s)| (*id, *k, s.as_str())).collect()
}

/// librdkafka settings of an SSL client of `bootstrap` trusting `ca`.
pub fn ssl_client(bootstrap: impl ToString, ca: &Path) -> Vec<(String, String)> {
    vec![
        ("bootstrap.servers".to_string(), bootstrap.to_string()),
        ("security.protocol".to_string(), "SSL".to_string()),
        ("ssl.ca.location".to_string(), ca.display().to_string()),
    ]
}

/// Every partition of `topic` has a leader and `n` replicas in sync.
pub fn all_in_sync(m: &MetadataResponse, topic: &str, n: usize) -> bool {
    m.topics.iter().any(|t| {
        t.name.as_ref().is_some_and(|x| x.as_str() == topic)
            && !t.partitions.is_empty()
            && t.partitions
                .iter()
                .all(|p| p.isr_nodes.len() == n && p.leader_id.0 >= 0)
    })
}

/// Creates `topic` through node 1, retried (bounded) while the cluster forms.
pub fn create_when_ready(c: &mut Cluster, topic: &str, partitions: i32, rf: i16) -> Result<()> {
    let addr = c.node(1).addr();
    let deadline = Instant::now() + AGREE_TIMEOUT;
    while create_topic(addr, topic, partitions, rf).context("create")? != 0 {
        ensure!(Instant::now() < deadline, "topic not created");
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

/// The address of `name` in a ready line `... listeners PLAINTEXT=127.0.0.1:1 SSL=..., ...`.
pub fn listener_addr(log: &str, name: &str) -> Result<SocketAddr> {
    let line = log
        .lines()
        .find(|l| l.contains("weir ready") && l.contains("listeners "))
        .context("no ready line with listeners")?;
    let list = line.split("listeners ").nth(1).context("listeners list")?;
    let prefix = format!("{name}=");
    list.split_whitespace()
        .find_map(|item| item.strip_prefix(&prefix))
        .map(|addr| addr.trim_end_matches(','))
        .context("listener not in the ready line")?
        .parse()
        .context("listener address")
}

/// Node `id`'s address of `listener`, from its last ready line (a restarted node binds
/// new ephemeral ports).
pub fn listener_of(c: &mut Cluster, id: i32, listener: &str) -> Result<SocketAddr> {
    let log = c.node(id).log_text();
    let from = log.rfind("weir ready").unwrap_or(0);
    listener_addr(&log[from..], listener)
}

/// `r`, its error carrying the tail of every node's log.
pub fn with_tails<T>(c: &mut Cluster, r: Result<T>) -> Result<T> {
    r.map_err(|e| {
        let tails: Vec<String> = (1..=c.nodes.len() as i32)
            .map(|id| format!("--- node {id}:\n{}", c.node(id).log_tail(TAIL_LINES)))
            .collect();
        e.context(tails.join("\n"))
    })
}

/// Waits (bounded) until the log of some node of `ids` satisfies `found`.
pub fn wait_for_log(
    c: &mut Cluster,
    ids: &[i32],
    what: &str,
    found: impl Fn(&str) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        if ids.iter().any(|id| found(&c.node(*id).log_text())) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("no node of {ids:?} logged {what:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits (bounded) until node 1 lists every node of `ids` as a registered broker (that
/// takes an active controller).
pub fn wait_registered(c: &mut Cluster, ids: &[i32]) -> Result<()> {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        let listed: Vec<i32> = c
            .metadata(1)
            .map(|m| m.brokers.iter().map(|b| b.node_id.0).collect())
            .unwrap_or_default();
        if ids.iter().all(|id| listed.contains(id)) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "nodes {ids:?} never registered: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Voter `id`, which cannot reach the quorum, stays out: still not a registered broker
/// after [`KEPT_OUT_WATCH`] (`why` says why it should not be one), and it was kept from
/// starting elections.
pub fn ensure_kept_out(c: &mut Cluster, id: i32, why: &str) -> Result<()> {
    // A negative check: nothing to wait on but the time it had to register.
    std::thread::sleep(KEPT_OUT_WATCH);
    let m = c.metadata(1)?;
    ensure!(
        m.brokers.iter().all(|b| b.node_id.0 != id),
        "node {id} registered {why}: {:?}",
        m.brokers
    );
    ensure!(
        c.node(id)
            .log_text()
            .contains("this voter starts no elections"),
        "node {id} was not kept from starting elections"
    );
    Ok(())
}
