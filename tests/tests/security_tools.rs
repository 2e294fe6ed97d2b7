//! The operator's tools against secured listeners of one node.
//!
//! weir-loadgen over every security protocol: TLS (with and without a client
//! certificate), SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 with and without TLS. Each
//! run produces and consumes (e2e) through the loadgen's own client, so the producer's
//! split connection (a reader thread beside the writer) runs over TLS too. A wrong
//! password, an untrusted broker certificate and a name the certificate does not carry
//! are refused with a non-zero exit and a message that says why; with endpoint
//! identification off, the name is not checked.
//!
//! `quickstart` sweeps a secured --bootstrap the same way.
//!
//! The `weir topics|groups|cluster|acls` commands log in with `--sasl-plain` on a
//! SASL_PLAINTEXT listener, and speak TLS with the loadgen's flags: SSL, mutual TLS and
//! SASL_SSL (SCRAM-SHA-512) succeed; an untrusted CA, a missing client certificate, a
//! name the certificate does not carry, a wrong password and a peer that never finishes
//! the handshake each fail in one line that says why, within a bounded time.

mod security_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use security_support::{
    PLAIN_PASSWORD, PLAIN_USER, SCRAM_PASSWORD, SCRAM_USER, SecureBroker, listener_addr,
};
use weir_tests::broker::{loadgen_binary, weir_binary};
use weir_tests::certs;
use weir_tests::process::{Bounded, run_bounded};
use weir_tests::{Weir, WeirConfig};

/// Records per run: enough for several produce requests and fetches.
const RECORDS: u64 = 2_000;
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn loadgen(args: &[String]) -> Result<Bounded> {
    let mut cmd = Command::new(loadgen_binary()?);
    cmd.args(args);
    run_bounded(&mut cmd, RUN_TIMEOUT)
}

/// An e2e run of [`RECORDS`] records on `topic` through `addr` with `security` flags;
/// returns (acknowledged, consumed) from its JSON summary.
fn e2e(dir: &Path, addr: &str, topic: &str, security: &[String]) -> Result<(u64, u64)> {
    let json = dir.join(format!("{topic}.json"));
    let mut args: Vec<String> = [
        "e2e",
        "--bootstrap",
        addr,
        "--topic",
        topic,
        "--partitions",
        "2",
        "--records",
        &RECORDS.to_string(),
        "--acks",
        "all",
        "--idempotent",
        "--quiet",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(json.display().to_string());
    args.extend(security.iter().cloned());
    let out = loadgen(&args)?;
    ensure!(out.ok(), "{topic}: weir-loadgen failed:\n{}", out.text());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).context("the JSON summary")?)?;
    let n = |k: &str| {
        summary[k]
            .as_u64()
            .with_context(|| format!("{k} in {summary}"))
    };
    Ok((n("records")?, n("consumed_records")?))
}

fn flags(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(k, v)| [format!("--{k}"), v.to_string()])
        .collect()
}

#[test]
fn the_loadgen_produces_and_consumes_over_every_security_protocol() -> Result<()> {
    // The SCRAM users a new single node starts with (as `kafka-storage format --add-scram`).
    let b = SecureBroker::start(&[(
        "scram.bootstrap.credentials",
        &format!(
            "SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}];\
             SCRAM-SHA-256=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"
        ),
    )])?;
    let dir = tempfile::tempdir()?;
    let ca = b.pki.ca_pem.display().to_string();
    let cert = b.pki.client_pem.display().to_string();
    let key = b.pki.client_key.display().to_string();
    let cases: Vec<(&str, &str, Vec<String>)> = vec![
        ("PLAINTEXT", "plain", vec![]),
        (
            "SSL",
            "ssl",
            flags(&[("security-protocol", "SSL"), ("ssl-ca-location", &ca)]),
        ),
        (
            "MTLS",
            "mtls",
            flags(&[
                ("security-protocol", "SSL"),
                ("ssl-ca-location", &ca),
                ("ssl-certificate-location", &cert),
                ("ssl-key-location", &key),
            ]),
        ),
        (
            "SASL_PLAINTEXT",
            "sasl-plain",
            flags(&[
                ("security-protocol", "SASL_PLAINTEXT"),
                ("sasl-mechanism", "PLAIN"),
                ("sasl-username", PLAIN_USER),
                ("sasl-password", PLAIN_PASSWORD),
            ]),
        ),
        (
            "SASL_PLAINTEXT",
            "sasl-scram-256",
            flags(&[
                ("security-protocol", "SASL_PLAINTEXT"),
                ("sasl-mechanism", "SCRAM-SHA-256"),
                ("sasl-username", SCRAM_USER),
                ("sasl-password", SCRAM_PASSWORD),
            ]),
        ),
        (
            "SASL_SSL",
            "sasl-ssl-scram-512",
            flags(&[
                ("security-protocol", "SASL_SSL"),
                ("ssl-ca-location", &ca),
                ("sasl-mechanism", "SCRAM-SHA-512"),
                ("sasl-username", SCRAM_USER),
                ("sasl-password", SCRAM_PASSWORD),
            ]),
        ),
    ];
    for (listener, topic, security) in &cases {
        let addr = b.addr(listener)?.to_string();
        let (acked, consumed) = e2e(dir.path(), &addr, topic, security)?;
        println!("{listener} {topic}: acknowledged {acked}, consumed {consumed}");
        ensure!(
            acked == RECORDS && consumed == RECORDS,
            "{topic} over {listener}: acknowledged {acked}, consumed {consumed}, wanted {RECORDS} each"
        );
    }
    // quickstart against a secured --bootstrap: its sweep (acks 0, 1, all) over SASL_SSL.
    let (_, _, sasl_ssl) = cases.last().context("the SASL_SSL case")?;
    let mut args: Vec<String> = ["quickstart", "--duration", "1s", "--bootstrap"]
        .map(String::from)
        .to_vec();
    args.push(b.addr("SASL_SSL")?.to_string());
    args.push("--report".into());
    args.push(dir.path().join("quickstart.html").display().to_string());
    args.extend(sasl_ssl.iter().cloned());
    let quick = loadgen(&args)?;
    ensure!(quick.ok(), "quickstart over SASL_SSL:\n{}", quick.text());
    ensure!(quick.stdout.contains("acks=all"), "{}", quick.stdout);
    Ok(())
}

#[test]
fn the_loadgen_says_why_it_cannot_connect_securely() -> Result<()> {
    let b = SecureBroker::start(&[])?;
    let produce = |listener: &str, security: &[(&str, &str)]| -> Result<String> {
        let mut args = vec![
            "produce".to_string(),
            "--bootstrap".into(),
            b.addr(listener)?.to_string(),
            "--records".into(),
            "10".into(),
            "--quiet".into(),
        ];
        args.extend(flags(security));
        let out = loadgen(&args)?;
        ensure!(
            !out.ok(),
            "{listener} {security:?} succeeded:\n{}",
            out.text()
        );
        Ok(out.stderr)
    };
    let wrong_password = produce(
        "SASL_PLAINTEXT",
        &[
            ("security-protocol", "SASL_PLAINTEXT"),
            ("sasl-username", PLAIN_USER),
            ("sasl-password", "not-the-password"),
        ],
    )?;
    ensure!(
        wrong_password.contains("authentication as") && wrong_password.contains("failed"),
        "{wrong_password}"
    );
    // The test CA is not among the public roots used when no CA file is given.
    let untrusted = produce("SSL", &[("security-protocol", "SSL")])?;
    ensure!(untrusted.contains("TLS handshake"), "{untrusted}");
    // quickstart's temporary weir is plaintext: security flags need --bootstrap.
    let temporary = loadgen(&["quickstart", "--security-protocol", "SSL"].map(String::from))?;
    ensure!(
        !temporary.ok() && temporary.stderr.contains("needs --bootstrap"),
        "{}",
        temporary.text()
    );
    // SASL flags on a plaintext protocol are a usage error, not silently ignored.
    let misuse = produce(
        "PLAINTEXT",
        &[("sasl-username", "x"), ("sasl-password", "y")],
    )?;
    ensure!(misuse.contains("SASL_PLAINTEXT or SASL_SSL"), "{misuse}");
    Ok(())
}

/// A node whose SSL listener presents a certificate of the test CA naming only
/// `localhost` (no IP address), so a client dialling 127.0.0.1 finds the name wrong.
struct LocalhostOnly {
    _weir: Weir,
    /// The SSL listener, as 127.0.0.1:port.
    addr: String,
    _certs: tempfile::TempDir,
    /// The test CA's PEM file.
    ca: String,
}

impl LocalhostOnly {
    fn start() -> Result<LocalhostOnly> {
        let certs_dir = tempfile::tempdir()?;
        let pki = certs::make(certs_dir.path())?;
        let weir = Weir::start(
            WeirConfig::shards(1)
                .set("listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0")
                .set(
                    "listener.security.protocol.map",
                    "PLAINTEXT:PLAINTEXT,SSL:SSL",
                )
                .set("ssl.keystore.type", "PEM")
                .set(
                    "ssl.keystore.location",
                    pki.localhost_only_keystore()?.display(),
                ),
        )?;
        Ok(LocalhostOnly {
            addr: listener_addr(&weir.log_text(), "SSL")?.to_string(),
            ca: pki.ca_pem.display().to_string(),
            _weir: weir,
            _certs: certs_dir,
        })
    }

    /// The flags of SSL to it with `--ssl-endpoint-identification-algorithm identification`.
    fn flags(&self, identification: &str) -> Vec<String> {
        flags(&[
            ("security-protocol", "SSL"),
            ("ssl-ca-location", &self.ca),
            ("ssl-endpoint-identification-algorithm", identification),
        ])
    }
}

/// Kafka's `ssl.endpoint.identification.algorithm`: with `https` (the default) a broker
/// whose certificate names only `localhost` is refused when dialled as 127.0.0.1; with
/// `none` the chain is still checked but the name is not.
#[test]
fn endpoint_identification_none_accepts_a_certificate_for_another_name() -> Result<()> {
    let b = LocalhostOnly::start()?;
    let run = |identification: &str| -> Result<Bounded> {
        let mut args: Vec<String> = [
            "produce",
            "--bootstrap",
            &b.addr,
            "--records",
            "10",
            "--quiet",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(b.flags(identification));
        loadgen(&args)
    };
    let strict = run("https")?;
    ensure!(!strict.ok(), "a certificate without 127.0.0.1 was accepted");
    ensure!(strict.stderr.contains("TLS handshake"), "{}", strict.stderr);
    let lax = run("none")?;
    ensure!(lax.ok(), "{}", lax.text());
    Ok(())
}

/// `weir topics|groups|cluster status --sasl-plain USER:PASSWORD` against a SASL_PLAINTEXT
/// listener: each logs in; without the flag the listener closes the connection and the
/// command says authentication may be needed; a wrong password is named as such.
#[test]
fn the_admin_commands_log_in_with_sasl_plain() -> Result<()> {
    let b = SecureBroker::start(&[])?;
    let addr = b.addr("SASL_PLAINTEXT")?.to_string();
    let creds = format!("{PLAIN_USER}:{PLAIN_PASSWORD}");
    let weir = weir_admin;
    let topic = [
        "topics",
        "--bootstrap-server",
        &addr,
        "--sasl-plain",
        &creds,
    ];
    let created = weir(&[&topic[..], &["create", "secured", "--partitions", "2"]].concat())?;
    ensure!(created.ok(), "{}", created.text());
    let listed = weir(&[&topic[..], &["list"]].concat())?;
    ensure!(
        listed.ok() && listed.stdout.contains("secured"),
        "{}",
        listed.text()
    );
    for (command, sub) in [("groups", "list"), ("cluster", "status"), ("acls", "list")] {
        let out = weir(&[
            command,
            "--bootstrap-server",
            &addr,
            "--sasl-plain",
            &creds,
            sub,
        ])?;
        ensure!(out.ok(), "weir {command} {sub}: {}", out.text());
    }
    let anonymous = weir(&["topics", "--bootstrap-server", &addr, "list"])?;
    ensure!(
        !anonymous.ok() && anonymous.stderr.contains("authentication"),
        "{}",
        anonymous.text()
    );
    let wrong = format!("{PLAIN_USER}:not-the-password");
    let refused = weir(&[
        "topics",
        "--bootstrap-server",
        &addr,
        "--sasl-plain",
        &wrong,
        "list",
    ])?;
    ensure!(
        !refused.ok() && refused.stderr.contains("SASL authentication"),
        "{}",
        refused.text()
    );
    Ok(())
}

/// How long a refused admin command may take: the TLS handshake is bounded at 10 s, the
/// rest is a process start and a round trip or two.
const REFUSAL_MAX: Duration = Duration::from_secs(30);

/// Runs `weir` with `args` (bounded by [`RUN_TIMEOUT`]).
fn weir_admin(args: &[&str]) -> Result<Bounded> {
    let mut cmd = Command::new(weir_binary()?);
    cmd.args(args);
    run_bounded(&mut cmd, RUN_TIMEOUT)
}

/// `weir <command> --bootstrap-server addr <security...> <rest...>`.
fn admin_args<'a>(
    command: &'a str,
    addr: &'a str,
    security: &'a [String],
    rest: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![command, "--bootstrap-server", addr];
    args.extend(security.iter().map(String::as_str));
    args.extend_from_slice(rest);
    args
}

/// Runs an admin command that must fail; checks it failed within [`REFUSAL_MAX`] with one
/// line on stderr, and returns that line.
fn admin_refused(args: &[&str]) -> Result<String> {
    let started = std::time::Instant::now();
    let out = weir_admin(args)?;
    let took = started.elapsed();
    ensure!(!out.ok(), "weir {args:?} succeeded:\n{}", out.text());
    ensure!(took < REFUSAL_MAX, "weir {args:?} took {took:?}");
    let stderr = out.stderr.trim();
    println!("weir {args:?} refused in {took:?}: {stderr}");
    ensure!(
        stderr.lines().count() == 1 && !stderr.contains("panicked"),
        "weir {args:?} did not say why in one line:\n{stderr}"
    );
    Ok(stderr.to_string())
}

/// A [`SecureBroker`] with the SCRAM user for SCRAM-SHA-512, the SASL_SSL listener's
/// mechanism.
fn scram_broker() -> Result<SecureBroker> {
    SecureBroker::start(&[(
        "scram.bootstrap.credentials",
        &format!("SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"),
    )])
}

/// The flags of SASL_SSL with SCRAM-SHA-512 as the SCRAM user with `password`.
fn sasl_ssl_flags(ca: &str, password: &str) -> Vec<String> {
    flags(&[
        ("security-protocol", "SASL_SSL"),
        ("ssl-ca-location", ca),
        ("sasl-mechanism", "SCRAM-SHA-512"),
        ("sasl-username", SCRAM_USER),
        ("sasl-password", password),
    ])
}

/// Every admin command over TLS (SSL), mutual TLS and SASL_SSL with SCRAM-SHA-512, with the
/// loadgen's flags: topics create/list/describe, groups list (which asks every node, at
/// the address Metadata gives for the listener), cluster status, acls list.
#[test]
fn the_admin_commands_speak_tls_and_sasl_ssl() -> Result<()> {
    let b = scram_broker()?;
    let ca = b.pki.ca_pem.display().to_string();
    let cert = b.pki.client_pem.display().to_string();
    let key = b.pki.client_key.display().to_string();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "SSL",
            flags(&[("security-protocol", "SSL"), ("ssl-ca-location", &ca)]),
        ),
        (
            "MTLS",
            flags(&[
                ("security-protocol", "SSL"),
                ("ssl-ca-location", &ca),
                ("ssl-certificate-location", &cert),
                ("ssl-key-location", &key),
            ]),
        ),
        ("SASL_SSL", sasl_ssl_flags(&ca, SCRAM_PASSWORD)),
    ];
    for (listener, security) in &cases {
        let addr = b.addr(listener)?.to_string();
        let topic = format!("admin-{}", listener.to_ascii_lowercase().replace('_', "-"));
        let run = |command: &str, rest: &[&str]| -> Result<Bounded> {
            let out = weir_admin(&admin_args(command, &addr, security, rest))?;
            ensure!(
                out.ok(),
                "weir {command} {rest:?} over {listener}:\n{}",
                out.text()
            );
            Ok(out)
        };
        run("topics", &["create", &topic, "--partitions", "2"])?;
        let listed = run("topics", &["list"])?;
        ensure!(listed.stdout.contains(&topic), "{}", listed.text());
        let described = run("topics", &["describe", &topic])?;
        ensure!(
            described.stdout.contains("PartitionCount: 2"),
            "{}",
            described.text()
        );
        run("groups", &["list"])?;
        let status = run("cluster", &["status"])?;
        ensure!(
            status.stdout.contains("offline partitions: 0"),
            "{}",
            status.text()
        );
        run("acls", &["list"])?;
    }
    Ok(())
}

/// An untrusted CA, a listener that wants a client certificate, a wrong SCRAM password
/// and a peer that never finishes the handshake: each admin command fails with one line
/// that names the cause, a non-zero exit, within a bounded time.
#[test]
fn the_admin_commands_say_why_they_cannot_connect_securely() -> Result<()> {
    let b = scram_broker()?;
    let ssl = b.addr("SSL")?.to_string();
    let rogue_ca = b.pki.dir.join("rogue-ca.pem");
    ensure!(rogue_ca.exists(), "{} missing", rogue_ca.display());
    let rogue_ca = rogue_ca.display().to_string();
    let ca = b.pki.ca_pem.display().to_string();
    // A CA file that did not sign the broker's certificate, and the public roots (the
    // default) that do not hold the test CA.
    for security in [
        flags(&[("security-protocol", "SSL"), ("ssl-ca-location", &rogue_ca)]),
        flags(&[("security-protocol", "SSL")]),
    ] {
        for (command, sub) in [("topics", "list"), ("cluster", "status"), ("acls", "list")] {
            let why = admin_refused(&admin_args(command, &ssl, &security, &[sub]))?;
            ensure!(
                why.contains("not signed by a trusted CA"),
                "{command} {security:?}: {why}"
            );
        }
    }
    let mtls = b.addr("MTLS")?.to_string();
    let no_cert = flags(&[("security-protocol", "SSL"), ("ssl-ca-location", &ca)]);
    let why = admin_refused(&admin_args("topics", &mtls, &no_cert, &["list"]))?;
    ensure!(why.contains("client certificate"), "{why}");
    let sasl_ssl = b.addr("SASL_SSL")?.to_string();
    let wrong_password = sasl_ssl_flags(&ca, "not-the-password");
    for (command, sub) in [("topics", "list"), ("groups", "list"), ("acls", "list")] {
        let why = admin_refused(&admin_args(command, &sasl_ssl, &wrong_password, &[sub]))?;
        ensure!(
            why.contains("SASL authentication (SCRAM-SHA-512) as") && why.contains("failed"),
            "{command}: {why}"
        );
    }
    // A plaintext listener closes a connection whose first bytes (the ClientHello) make
    // no Kafka frame: the command asks whether it dialled a TLS listener.
    let plain = b.addr("PLAINTEXT")?.to_string();
    let tls_to_plain = flags(&[("security-protocol", "SSL"), ("ssl-ca-location", &ca)]);
    let why = admin_refused(&admin_args("topics", &plain, &tls_to_plain, &["list"]))?;
    ensure!(why.contains("is it a TLS listener"), "{why}");
    // Something that accepts the connection and never says a word: the handshake times
    // out instead of hanging.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let silent_addr = silent.local_addr()?.to_string();
    let tls = flags(&[("security-protocol", "SSL"), ("ssl-ca-location", &ca)]);
    let why = admin_refused(&admin_args("cluster", &silent_addr, &tls, &["status"]))?;
    ensure!(
        why.contains("TLS handshake") && why.contains("timed out"),
        "{why}"
    );
    drop(silent);
    Ok(())
}

/// A broker whose certificate names only `localhost`, dialled as 127.0.0.1: refused with
/// the default `--ssl-endpoint-identification-algorithm https`, saying the name does not
/// match; accepted with `none` (the chain still checked).
#[test]
fn the_admin_commands_check_the_brokers_name_unless_told_not_to() -> Result<()> {
    let b = LocalhostOnly::start()?;
    let strict = b.flags("https");
    let why = admin_refused(&admin_args("topics", &b.addr, &strict, &["list"]))?;
    ensure!(why.contains("does not name 127.0.0.1"), "{why}");
    let lax = b.flags("none");
    for (command, rest) in [
        ("topics", &["create", "named", "--partitions", "1"][..]),
        ("topics", &["describe", "named"][..]),
        ("groups", &["list"][..]),
        ("cluster", &["status"][..]),
    ] {
        let out = weir_admin(&admin_args(command, &b.addr, &lax, rest))?;
        ensure!(out.ok(), "weir {command} {rest:?}: {}", out.text());
    }
    Ok(())
}
