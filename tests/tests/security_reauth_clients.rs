//! KIP-368 with a real client: confluent-kafka (librdkafka 2.16, which re-authenticates
//! at ~90% of the session lifetime the broker announces) keeps producing and consuming
//! over several lifetimes of `connections.max.reauth.ms` without an error or a lost
//! record, over SASL_PLAINTEXT (PLAIN) and SASL_SSL (SCRAM-SHA-512), and the broker counts
//! the re-authentications; a SCRAM user deleted while its producer is connected gets an
//! authentication error at its next re-authentication, and its connection is closed.

mod security_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use security_support::{SCRAM_USER, SecureBroker, json_object, run_client};

/// The session lifetime the broker is started with.
const LIFETIME_MS: &str = "2000";
/// How long each client runs: several lifetimes.
const RUN_SECONDS: &str = "7";

fn start() -> Result<SecureBroker> {
    SecureBroker::start(&[
        ("connections.max.reauth.ms", LIFETIME_MS),
        ("connection.failed.authentication.delay.ms", "0"),
        ("metrics.listener", "127.0.0.1:0"),
    ])
}

/// The value of counter `series` on the broker's Prometheus endpoint.
fn counter(b: &SecureBroker, series: &str) -> Result<f64> {
    let log = b.weir.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("metrics listening on"))
        .context("no metrics address logged")?;
    let addr = line.rsplit(' ').next().context("address")?.trim();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let value = text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    });
    Ok(value.unwrap_or(0.0))
}

#[test]
fn librdkafka_reauthenticates_and_loses_nothing_over_several_lifetimes() -> Result<()> {
    let b = start()?;
    b.add_scram_user("SCRAM-SHA-512")?;
    for listener in ["SASL_PLAINTEXT", "SASL_SSL"] {
        let topic = format!("reauth-{}", listener.to_ascii_lowercase().replace('_', "-"));
        let out = run_client(
            "reauth-produce",
            &b.client_conf(listener)?,
            &[&topic, RUN_SECONDS],
        )?;
        println!("{listener}: {out}");
    }
    // Two clients (producer, consumer) per listener, each renewing every ~1.8 s for
    // 7 s: several re-authentications each, and no connection closed for expiry.
    let renewed = counter(&b, "weir_sasl_reauthentications_total")?;
    println!("re-authentications: {renewed}");
    ensure!(renewed >= 8.0, "re-authentications: {renewed}");
    let expired = counter(&b, "weir_sasl_expired_connections_closed_total")?;
    ensure!(expired == 0.0, "connections closed for expiry: {expired}");
    Ok(())
}

#[test]
fn a_deleted_scram_users_producer_fails_its_reauthentication() -> Result<()> {
    let b = start()?;
    b.add_scram_user("SCRAM-SHA-512")?;
    let admin = json_object(&b.client_conf("PLAINTEXT")?);
    let out = run_client(
        "reauth-revoked",
        &b.client_conf("SASL_SSL")?,
        &["reauth-revoked", SCRAM_USER, "SCRAM-SHA-512", &admin],
    )?;
    println!("{out}");
    let refused = counter(
        &b,
        r#"weir_connections_refused_total{reason="authentication_failed"}"#,
    )?;
    ensure!(
        refused >= 1.0,
        "failed re-authentications counted: {refused}"
    );
    ensure!(
        b.weir.log_text().contains("SASL re-authentication failed"),
        "the refusal is logged"
    );
    Ok(())
}
