//! Node-to-node security beyond cluster_tls.rs: peer certificates checked against the
//! host a peer is dialled by (Kafka's `ssl.endpoint.identification.algorithm`, default
//! `https`), and SASL on the controller port (`controller.listener.names` mapped to
//! SASL_SSL, PLAIN from `listener.name.controller.plain.sasl.jaas.config`).
//!
//! Every node's TLS certificate here names `DNS:localhost` only. Peers registered as
//! `localhost:PORT` (and voters named `localhost:PORT`) verify it; peers registered by
//! 127.0.0.1 do not, unless the identification is switched off with an empty value.

mod security_support;

use std::path::Path;

use anyhow::{Result, ensure};
use security_support::run_client;
use weir_tests::cluster::{Cluster, free_ports};
use weir_tests::peer_security::{
    AGREE_TIMEOUT, PeerPki, all_in_sync, create_when_ready, ensure_kept_out, listener_of,
    per_node_refs, refs, replicated_keys, ssl_client, wait_for_log, wait_registered, with_tails,
};

const TOPIC: &str = "names-rf3";
const RECORDS: &str = "200";
/// `replica.lag.time.max.ms` of the refusal case: a follower that cannot fetch leaves
/// the ISR this long after it was created.
const LAG_MAX_MS: &str = "2000";

/// Creates the topic (3 partitions, RF 3) through node 1.
fn create(c: &mut Cluster) -> Result<()> {
    create_when_ready(c, TOPIC, 3, 3)
}

/// Produces with acks=all (idempotent) and reads it back, with the client settings
/// `conf` (Metadata names every node's address on the listener the client came
/// through): with min.insync.replicas=2 that succeeds only while followers replicate.
fn produce_consume(conf: &[(String, String)]) -> Result<String> {
    run_client("produce-consume", conf, &[TOPIC, RECORDS])
}

/// rustls's words for a certificate that does not name the host dialled (with and
/// without the names it holds).
const NAME_MISMATCH: [&str; 2] = ["not valid for name", "NotValidForName"];

fn name_refused(log: &str) -> bool {
    NAME_MISMATCH.iter().any(|n| log.contains(n))
}

/// Waits until some node's log holds `needle`.
fn wait_logged(c: &mut Cluster, ids: &[i32], needle: &str) -> Result<()> {
    wait_for_log(c, ids, needle, |log| log.contains(needle))
}

/// Peers registered as `localhost:PORT`, voters named `localhost:PORT`: the
/// localhost-only certificate matches both the replica fetchers' and the Raft
/// connections' host, the quorum forms and every follower replicates over TLS. (Before
/// the fix the fetchers checked the certificate against 127.0.0.1 and never fetched.)
#[test]
fn peers_dialled_by_name_verify_a_certificate_for_that_name() -> Result<()> {
    let pki = PeerPki::localhost_only()?;
    let ports = free_ports(6)?;
    let voters: Vec<String> = (0..3)
        .map(|i| format!("{}@localhost:{}", i + 1, ports[i]))
        .collect();
    let mut s = pki.ssl_between_nodes(Some(pki.ca()));
    s.push(("controller.listener.names", "CONTROLLER".into()));
    s.push(("controller.quorum.voters", voters.join(",")));
    let mut per_node = Vec::new();
    for id in 1..=3 {
        let ssl_port = ports[2 + id as usize];
        per_node.push((
            id,
            "listeners",
            format!("PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:{ssl_port}"),
        ));
        per_node.push((
            id,
            "advertised.listeners",
            format!("SSL://localhost:{ssl_port}"),
        ));
    }
    let mut c = Cluster::start_per_node(3, &refs(&s), &per_node_refs(&per_node))?;
    let r = by_name_body(&mut c, pki.ca());
    with_tails(&mut c, r)
}

fn by_name_body(c: &mut Cluster, ca: &Path) -> Result<()> {
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)?;
    // Through the PLAINTEXT listener every node is named by its PLAINTEXT address; the
    // SSL clients below are given the SSL listeners' `localhost` addresses.
    let m = c.metadata(1)?;
    ensure!(
        m.brokers.iter().all(|b| b.host.as_str() == "127.0.0.1"),
        "nodes are not named by their PLAINTEXT address: {:?}",
        m.brokers
    );
    create(c)?;
    let port = listener_of(c, 1, "SSL")?.port();
    let out = produce_consume(&ssl_client(format!("localhost:{port}"), ca))?;
    println!("by name: {out}");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| all_in_sync(m, TOPIC, 3))?;
    for id in 1..=3 {
        ensure!(
            !name_refused(&c.node(id).log_text()),
            "node {id} refused a peer's name"
        );
    }
    Ok(())
}

/// The same certificate, peers registered by 127.0.0.1 (the controller port plain, so
/// the quorum forms either way): with the default identification every follower refuses
/// its leader's certificate (logged), never fetches and leaves the ISR.
#[test]
fn a_certificate_without_the_dialled_address_is_refused() -> Result<()> {
    let pki = PeerPki::localhost_only()?;
    let mut s = pki.ssl_between_nodes(Some(pki.ca()));
    s.push(("replica.lag.time.max.ms", LAG_MAX_MS.into()));
    let mut c = Cluster::start(3, &refs(&s))?;
    let r = refused_body(&mut c);
    with_tails(&mut c, r)
}

fn refused_body(c: &mut Cluster) -> Result<()> {
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)?;
    create(c)?;
    wait_for_log(c, &[1, 2, 3], "a certificate name refused", name_refused)?;
    // Each leader alone in the ISR of its partitions.
    c.wait_agreed(3, AGREE_TIMEOUT, |m| all_in_sync(m, TOPIC, 1))?;
    Ok(())
}

/// `ssl.endpoint.identification.algorithm=` (empty): the host is not compared, the chain
/// still is. Peers by 127.0.0.1 and the controller port over TLS by 127.0.0.1 too: the
/// quorum forms and every follower replicates.
#[test]
fn an_empty_identification_algorithm_skips_the_host_check() -> Result<()> {
    let pki = PeerPki::localhost_only()?;
    let mut s = pki.ssl_between_nodes(Some(pki.ca()));
    s.push(("controller.listener.names", "CONTROLLER".into()));
    s.push(("ssl.endpoint.identification.algorithm", String::new()));
    let mut c = Cluster::start(3, &refs(&s))?;
    let r = no_identification_body(&mut c, pki.ca());
    with_tails(&mut c, r)
}

fn no_identification_body(c: &mut Cluster, ca: &Path) -> Result<()> {
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)?;
    let log = c.node(1).log_text();
    ensure!(
        log.contains("the controller port speaks TLS"),
        "no controller TLS"
    );
    create(c)?;
    let addr = listener_of(c, 1, "SSL")?;
    let mut conf = ssl_client(addr, ca);
    // The client's own check would refuse 127.0.0.1 too.
    conf.push((
        "ssl.endpoint.identification.algorithm".into(),
        "none".into(),
    ));
    let out = produce_consume(&conf)?;
    println!("no identification: {out}");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| all_in_sync(m, TOPIC, 3))?;
    Ok(())
}

const CONTROLLER_JAAS_GOOD: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="controller" password="controller-pw" user_controller="controller-pw";"#;
/// The rogue node accepts the right password (so the healthy voters' connections to it
/// succeed, the case `gate_elections` exists for) but presents a wrong one.
const CONTROLLER_JAAS_WRONG: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="controller" password="guessed" user_controller="controller-pw";"#;

/// The controller port over SASL_SSL; the inter-broker listener plain (the controller
/// port alone is under test).
fn sasl_settings(pki: &PeerPki) -> Vec<(&'static str, String)> {
    let mut s = vec![
        (
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL".into(),
        ),
        ("controller.listener.names", "CONTROLLER".into()),
        ("sasl.mechanism.controller.protocol", "PLAIN".into()),
    ];
    s.extend(pki.tls_keys(Some(pki.ca())));
    s.extend(replicated_keys());
    s
}

/// Three voters with the right password form the quorum over SASL_SSL and all register.
#[test]
fn a_quorum_forms_over_sasl_ssl() -> Result<()> {
    let pki = PeerPki::new()?;
    let mut s = sasl_settings(&pki);
    s.push((
        "listener.name.controller.plain.sasl.jaas.config",
        CONTROLLER_JAAS_GOOD.into(),
    ));
    let mut c = Cluster::start(3, &refs(&s))?;
    let r = sasl_forms_body(&mut c);
    with_tails(&mut c, r)
}

fn sasl_forms_body(c: &mut Cluster) -> Result<()> {
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)?;
    let log = c.node(1).log_text();
    ensure!(
        log.contains("the controller port asks for SASL") && log.contains("PLAIN as controller"),
        "node 1 does not ask for SASL on the controller port"
    );
    ensure!(log.contains("the controller port speaks TLS"), "no TLS");
    create(c)?;
    c.wait_agreed(3, AGREE_TIMEOUT, |m| all_in_sync(m, TOPIC, 3))?;
    Ok(())
}

/// Node 3 presents a wrong password: the voters refuse it (logged), it never registers,
/// and the healthy two keep a controller and serve metadata writes. Its election timeout
/// is the shortest, so without the SASL step in the election gate's probe it would bump
/// its term and keep the others from holding a leader (see cluster_tls.rs).
#[test]
fn a_voter_with_a_wrong_password_cannot_join() -> Result<()> {
    let pki = PeerPki::new()?;
    let s = sasl_settings(&pki);
    let key = "listener.name.controller.plain.sasl.jaas.config";
    let per_node = [
        (1, key, CONTROLLER_JAAS_GOOD),
        (2, key, CONTROLLER_JAAS_GOOD),
        (3, key, CONTROLLER_JAAS_WRONG),
        (3, "controller.quorum.election.timeout.ms", "200"),
    ];
    let mut c = Cluster::start_per_node(3, &refs(&s), &per_node)?;
    let r = wrong_password_body(&mut c);
    with_tails(&mut c, r)
}

fn wrong_password_body(c: &mut Cluster) -> Result<()> {
    wait_logged(c, &[1, 2], "controller port: SASL authentication failed")?;
    wait_logged(c, &[3], "refused: authentication failed")?;
    // Nodes 1 and 2 register (that takes an active controller) ...
    wait_registered(c, &[1, 2])?;
    // ... and take metadata writes (rf 2: node 3 is not a broker of the cluster).
    create_when_ready(c, TOPIC, 2, 2)?;
    ensure_kept_out(c, 3, "with a wrong password")
}

/// Inter-broker SASL with SCRAM-SHA-512 and no other user: the credential the fetchers
/// authenticate with comes from `scram.bootstrap.credentials` (Kafka's
/// `kafka-storage format --add-scram`), committed by the first controller. Followers
/// replicate, so acks=all succeeds and every replica is in sync. (Before, nothing could
/// create the user but a client's AlterUserScramCredentials.)
#[test]
fn inter_broker_scram_works_from_bootstrap_credentials() -> Result<()> {
    let mut c = Cluster::start(3, &refs(&inter_broker_scram(&[])))?;
    let r = scram_bootstrap_body(&mut c);
    with_tails(&mut c, r)
}

/// Settings of a cluster whose nodes replicate over SASL_PLAINTEXT with SCRAM-SHA-512,
/// plus `extra`.
fn inter_broker_scram(extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let jaas = r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";"#;
    let mut s: Vec<(&'static str, String)> = vec![
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0".into(),
        ),
        ("inter.broker.listener.name", "SASL_PLAINTEXT".into()),
        (
            "sasl.mechanism.inter.broker.protocol",
            "SCRAM-SHA-512".into(),
        ),
        (
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms",
            "SCRAM-SHA-512".into(),
        ),
        (
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config",
            jaas.into(),
        ),
        (
            "listener.name.sasl_plaintext.connection.failed.authentication.delay.ms",
            "0".into(),
        ),
        (
            "scram.bootstrap.credentials",
            "SCRAM-SHA-512=[name=admin,password=admin-secret]".into(),
        ),
    ];
    s.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    s.extend(replicated_keys());
    s
}

/// KIP-368 between nodes: with a 2 s session lifetime on the inter-broker listener, the
/// replica fetchers log in again on their connections before it ends, so replication
/// goes on (acks=all, every replica in sync) and no leader closes a fetcher's
/// connection for an expired session. (The cluster start, the topic and the round trip
/// take many lifetimes, with fetches every `replica.fetch.wait.max.ms`.)
#[test]
fn replica_fetchers_reauthenticate_within_the_session_lifetime() -> Result<()> {
    let settings = inter_broker_scram(&[("connections.max.reauth.ms", "2000")]);
    let mut c = Cluster::start(3, &refs(&settings))?;
    let r = scram_bootstrap_body(&mut c).and_then(|()| {
        for id in 1..=3 {
            let log = c.node(id).log_text();
            ensure!(
                !log.contains("after the SASL session expired"),
                "node {id} closed a connection whose session expired"
            );
        }
        Ok(())
    });
    with_tails(&mut c, r)
}

fn scram_bootstrap_body(c: &mut Cluster) -> Result<()> {
    c.wait_agreed(3, AGREE_TIMEOUT, |_| true)?;
    wait_logged(c, &[1, 2, 3], "bootstrap SCRAM credentials committed")?;
    create(c)?;
    let addr = listener_of(c, 1, "SASL_PLAINTEXT")?;
    let out = produce_consume(&[
        ("bootstrap.servers".into(), addr.to_string()),
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
        ("sasl.username".into(), "admin".into()),
        ("sasl.password".into(), "admin-secret".into()),
    ])?;
    println!("SCRAM between nodes: {out}");
    c.wait_agreed(3, AGREE_TIMEOUT, |m| all_in_sync(m, TOPIC, 3))?;
    Ok(())
}
