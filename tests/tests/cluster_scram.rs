//! SCRAM credentials in a three-node cluster: an AlterUserScramCredentials sent to node 1
//! is a controller command committed through the metadata quorum, so node 3 (which never
//! saw the request) authenticates the user with SCRAM-SHA-512, and a deletion through
//! node 2 refuses the user everywhere. The salted credential, not the password, is what
//! the metadata holds.

mod security_support;

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use security_support::{
    SCRAM_PASSWORD, SCRAM_USER, json_object, listener_addr, run_client, run_client_json,
};
use weir_tests::cluster::Cluster;

/// Bound on every wait for the quorum (elections, catch-up on a loaded machine).
const AGREE_TIMEOUT: Duration = Duration::from_secs(90);

fn cluster() -> Result<Cluster> {
    Cluster::start(
        3,
        &[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            ),
            (
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms",
                "SCRAM-SHA-512",
            ),
            // A refused attempt answers at once (the test retries until the image has it).
            (
                "listener.name.sasl_plaintext.connection.failed.authentication.delay.ms",
                "0",
            ),
        ],
    )
}

/// The SCRAM exchange of `password` against node `id`'s SASL_PLAINTEXT listener.
fn scram_auth(c: &mut Cluster, id: i32, password: &str) -> Result<String> {
    // The last run's ready line: a restarted node binds new ephemeral ports.
    let log = c.node(id).log_text();
    let from = log.rfind("weir ready").unwrap_or(0);
    let addr = listener_addr(&log[from..], "SASL_PLAINTEXT")?;
    let conf = json_object(&[
        ("host".into(), addr.ip().to_string()),
        ("port".into(), addr.port().to_string()),
        ("user".into(), SCRAM_USER.into()),
        ("password".into(), password.into()),
        ("mechanism".into(), "SCRAM-SHA-512".into()),
    ]);
    run_client_json("scram-auth", &conf, &[])
}

/// Retries `f` (bounded) until it returns Ok.
fn eventually(what: &str, mut f: impl FnMut() -> Result<String>) -> Result<String> {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    loop {
        match f() {
            Ok(out) => return Ok(out),
            Err(e) if Instant::now() >= deadline => bail!("{what}: {e:#}"),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

fn plaintext_conf(c: &mut Cluster, id: i32) -> Vec<(String, String)> {
    vec![("bootstrap.servers".into(), c.node(id).bootstrap())]
}

#[test]
fn scram_user_created_on_one_node_authenticates_on_another() -> Result<()> {
    let mut c = cluster()?;
    c.controller(AGREE_TIMEOUT)?;
    // Unknown everywhere before.
    let before = scram_auth(&mut c, 3, SCRAM_PASSWORD);
    assert!(before.is_err(), "unknown user authenticated: {before:?}");

    let conf = plaintext_conf(&mut c, 1);
    eventually("scram-add via node 1", || {
        run_client(
            "scram-add",
            &conf,
            &[SCRAM_USER, SCRAM_PASSWORD, "SCRAM-SHA-512"],
        )
    })?;
    let out = eventually("SCRAM-SHA-512 on node 3", || {
        scram_auth(&mut c, 3, SCRAM_PASSWORD)
    })?;
    assert_eq!(out, "OK authenticated");
    let wrong = scram_auth(&mut c, 3, "not-the-password");
    assert!(wrong.is_err(), "a wrong password authenticated: {wrong:?}");
    // Node 3 describes it too (the image, not a local store).
    let conf3 = plaintext_conf(&mut c, 3);
    let described = run_client("scram-describe", &conf3, &[SCRAM_USER])?;
    assert!(described.contains("SCRAM_SHA_512"), "{described}");

    // A restarted node rebuilds the credential from the metadata log.
    c.node(3).terminate()?;
    c.node(3).restart()?;
    eventually("SCRAM-SHA-512 on node 3 after its restart", || {
        scram_auth(&mut c, 3, SCRAM_PASSWORD)
    })?;

    // A deletion through node 2 refuses the user on node 1.
    let conf2 = plaintext_conf(&mut c, 2);
    eventually("scram delete via node 2", || {
        run_client("scram-delete", &conf2, &[SCRAM_USER, "SCRAM-SHA-512"])
    })?;
    eventually("refusal on node 1", || {
        match scram_auth(&mut c, 1, SCRAM_PASSWORD) {
            Ok(out) => bail!("still authenticates: {out}"),
            Err(e) if format!("{e:#}").contains("SaslAuthenticate error") => Ok("refused".into()),
            Err(e) => bail!("{e:#}"),
        }
    })?;
    Ok(())
}
