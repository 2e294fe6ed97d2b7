//! Kafka-named configuration reaches behaviour, through `--set` and through a
//! `server.properties` file (`--config`): topic auto-creation with `num.partitions`,
//! `auto.create.topics.enable=false`, and `min.insync.replicas` above the replica count
//! (acks=all refused with NOT_ENOUGH_REPLICAS while acks=1 is served).

use std::time::Duration;

use anyhow::{Result, ensure};
use kafka_protocol::records::Compression;
use rdkafka::consumer::Consumer;
use weir_tests::clients;
use weir_tests::raw::{self, RawConn};
use weir_tests::{Weir, WeirConfig};

const NOT_ENOUGH_REPLICAS: i16 = 19;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

#[test]
fn producing_to_an_unknown_topic_creates_it_with_num_partitions() -> Result<()> {
    let weir = Weir::start(WeirConfig::shards(2).set("num.partitions", 3))?;
    let records = clients::make_records(0, 100, "auto", clients::now_ms());
    let (producer, log) = clients::producer(&weir.bootstrap(), "all", "none", &[])?;
    clients::produce_all(&producer, "auto-created", &records, None)?;
    ensure!(
        log.acked().len() == 100,
        "{} of 100 acked; failed {:?}",
        log.acked().len(),
        log.failed().first()
    );
    ensure!(clients::partition_count(&weir.bootstrap(), "auto-created")? == 3);
    let got = clients::consume_to_end(&weir.bootstrap(), "auto-created", &[0, 1, 2])?;
    clients::verify(&records, &log.acked(), &got)?;
    Ok(())
}

#[test]
fn auto_create_off_in_a_properties_file_refuses_unknown_topics() -> Result<()> {
    let config = WeirConfig {
        shards: Some(1),
        properties: vec![
            "# weir e2e".into(),
            "auto.create.topics.enable=false".into(),
        ],
        ..WeirConfig::default()
    };
    let weir = Weir::start(config)?;
    let c = clients::consumer(&weir.bootstrap(), &[("allow.auto.create.topics", "true")])?;
    let md = c.fetch_metadata(Some("never-created"), Duration::from_secs(10))?;
    let t = md.topics().iter().find(|t| t.name() == "never-created");
    ensure!(
        t.is_some_and(|t| t.partitions().is_empty() && t.error().is_some()),
        "metadata for an unknown topic: {:?}",
        t.map(|t| t.error())
    );
    let mut conn = RawConn::connect(weir.addr())?;
    let batch = raw::record_batch(&[b"x".to_vec()], Compression::None)?;
    let (code, _) = conn.produce("never-created", 0, 1, batch)?;
    ensure!(
        code == UNKNOWN_TOPIC_OR_PARTITION,
        "produce to an unknown topic: error {code}"
    );
    // Still unknown after the produce attempt.
    let md = c.fetch_metadata(Some("never-created"), Duration::from_secs(10))?;
    let t = md.topics().iter().find(|t| t.name() == "never-created");
    ensure!(
        t.is_some_and(|t| t.partitions().is_empty()),
        "the topic was created by the produce"
    );
    Ok(())
}

#[test]
fn min_insync_replicas_above_one_refuses_acks_all_only() -> Result<()> {
    let weir = Weir::start(WeirConfig::shards(1).set("min.insync.replicas", 2))?;
    clients::create_topics(&weir.bootstrap(), &["isr"], 1, &[])?;
    let mut conn = RawConn::connect(weir.addr())?;
    let batch = raw::record_batch(&[b"one".to_vec()], Compression::None)?;
    let (code, _) = conn.produce("isr", 0, -1, batch.clone())?;
    ensure!(
        code == NOT_ENOUGH_REPLICAS,
        "acks=all with min.insync.replicas=2: error {code}"
    );
    let (code, base) = conn.produce("isr", 0, 1, batch)?;
    ensure!(
        code == 0 && base == 0,
        "acks=1: error {code}, base offset {base}"
    );
    let highs = clients::high_watermarks(&weir.bootstrap(), "isr", &[0])?;
    ensure!(
        highs.get(&0) == Some(&1),
        "only the acks=1 batch is in the log: {highs:?}"
    );
    Ok(())
}

/// A `cluster.id` that cannot be used (here: empty) stops startup with its path named; the
/// id is never silently replaced, which would give the node another cluster's identity
/// (found by review).
#[test]
fn an_unusable_cluster_id_file_stops_startup_rather_than_being_replaced() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("cluster.id"), "")?;
    let mut cmd = std::process::Command::new(weir_tests::broker::weir_binary()?);
    cmd.arg("serve").arg("--data-dir").arg(dir.path()).args([
        "--listen",
        "127.0.0.1:0",
        "--set",
        "weir.shard.cpus=none",
    ]);
    let out = weir_tests::process::run_bounded(&mut cmd, Duration::from_secs(60))?;
    ensure!(
        !out.ok(),
        "started with an empty cluster.id: {}",
        out.text()
    );
    ensure!(out.text().contains("cluster.id"), "{}", out.text());
    ensure!(std::fs::read_to_string(dir.path().join("cluster.id"))?.is_empty());
    Ok(())
}
