//! Real clients over every security protocol of one node at once: confluent-kafka
//! (librdkafka 2.16) and kcat (Debian's librdkafka 2.0.2) over SSL, mutual TLS,
//! SASL_PLAINTEXT with PLAIN and SCRAM-SHA-256, SASL_SSL with SCRAM-SHA-512, while the
//! PLAINTEXT listener keeps serving. Each round trip: topic created, records produced by
//! an idempotent producer (acks=all), consumed in a consumer group, offsets committed.

mod security_support;

use std::process::Command;

use anyhow::{Result, ensure};
use security_support::{SCRAM_PASSWORD, SCRAM_USER, SecureBroker, run_bounded_input, run_client};

/// Records per round trip.
const RECORDS: &str = "200";

#[test]
fn confluent_kafka_over_every_listener_at_once() -> Result<()> {
    let b = SecureBroker::start(&[])?;
    b.add_scram_user("SCRAM-SHA-512")?;
    b.add_scram_user("SCRAM-SHA-256")?;
    let described = run_client(
        "scram-describe",
        &b.client_conf("PLAINTEXT")?,
        &[SCRAM_USER],
    )?;
    ensure!(
        described.contains("SCRAM_SHA_256") && described.contains("SCRAM_SHA_512"),
        "{described}"
    );
    for listener in ["PLAINTEXT", "SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL"] {
        let topic = format!("t-{}", listener.to_ascii_lowercase().replace('_', "-"));
        let out = run_client("roundtrip", &b.client_conf(listener)?, &[&topic, RECORDS])?;
        println!("{listener}: {out}");
    }
    // SCRAM-SHA-256 over SASL_PLAINTEXT (the SASL_SSL listener offers SHA-512 only).
    let mut conf = b.client_conf("SASL_PLAINTEXT")?;
    for (k, v) in [
        ("sasl.mechanism", "SCRAM-SHA-256"),
        ("sasl.username", SCRAM_USER),
        ("sasl.password", SCRAM_PASSWORD),
    ] {
        conf.retain(|(key, _)| key != k);
        conf.push((k.to_string(), v.to_string()));
    }
    run_client("roundtrip", &conf, &["t-scram-256", RECORDS])?;
    // Metadata advertises the listener the client came through.
    for listener in ["PLAINTEXT", "SSL", "SASL_SSL"] {
        let out = run_client("metadata", &b.client_conf(listener)?, &[])?;
        let want = b.addr(listener)?.to_string();
        ensure!(
            out == format!("OK {want}"),
            "{listener}: {out}, want {want}"
        );
    }
    Ok(())
}

/// Debian's kcat with its own librdkafka: cargo's LD_LIBRARY_PATH holds the build's
/// librdkafka (compiled without OpenSSL), which would otherwise be loaded instead.
fn kcat() -> Command {
    let mut cmd = Command::new("kcat");
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

/// kcat arguments for listener `name` of `b`.
fn kcat_args(b: &SecureBroker, name: &str) -> Result<Vec<String>> {
    let mut args = Vec::new();
    for (k, v) in b.client_conf(name)? {
        if k == "bootstrap.servers" {
            args.extend(["-b".to_string(), v]);
        } else {
            args.extend(["-X".to_string(), format!("{k}={v}")]);
        }
    }
    Ok(args)
}

#[test]
fn kcat_over_ssl_mutual_tls_and_sasl_ssl() -> Result<()> {
    let b = SecureBroker::start(&[])?;
    b.add_scram_user("SCRAM-SHA-512")?;
    for listener in ["SSL", "MTLS", "SASL_SSL"] {
        let topic = format!("kcat-{}", listener.to_ascii_lowercase().replace('_', "-"));
        let lines: Vec<String> = (0..50).map(|i| format!("{listener}-{i}")).collect();
        let input = lines.join("\n") + "\n";
        let base = kcat_args(&b, listener)?;
        let mut produce = kcat();
        produce.args(&base).args(["-P", "-t", &topic, "-p", "0"]);
        let out = run_bounded_input(&mut produce, Some(&input), security_support::CLIENT_TIMEOUT)?;
        ensure!(out.ok, "{listener}: kcat -P failed: {}", out.stderr);
        let mut consume = kcat();
        consume
            .args(&base)
            .args(["-C", "-t", &topic, "-p", "0", "-o", "beginning", "-e", "-q"]);
        let out = run_bounded_input(&mut consume, None, security_support::CLIENT_TIMEOUT)?;
        ensure!(out.ok, "{listener}: kcat -C failed: {}", out.stderr);
        let got: Vec<&str> = out.stdout.lines().collect();
        ensure!(
            got == lines,
            "{listener}: got {} lines: {:?}",
            got.len(),
            &got[..got.len().min(3)]
        );
    }
    Ok(())
}
