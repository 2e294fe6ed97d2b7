//! Shared setup of the security tests: a broker with one listener of each security
//! protocol (and a mutual-TLS one), test certificates, and the confluent-kafka driver
//! (tests/security/kafka_client.py) run from the interop venv.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use weir_tests::certs::{self, TestPki};
use weir_tests::{Weir, WeirConfig};

/// How long one client script may run (it bounds its own waits at 60 s each).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(240);
/// The SCRAM user the tests create, and its password.
pub const SCRAM_USER: &str = "alice";
pub const SCRAM_PASSWORD: &str = "alice-secret";
/// The PLAIN user configured in `sasl.plain.users`.
pub const PLAIN_USER: &str = "bob";
pub const PLAIN_PASSWORD: &str = "bob-secret";

/// A broker with listeners PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL and MTLS (SSL with
/// `ssl.client.auth=required`), and the certificates it was set up with.
pub struct SecureBroker {
    pub weir: Weir,
    pub pki: TestPki,
    _certs: tempfile::TempDir,
}

impl SecureBroker {
    pub fn start(extra: &[(&str, &str)]) -> Result<SecureBroker> {
        let dir = tempfile::tempdir()?;
        let pki = certs::make(dir.path())?;
        let keystore = pki.server_keystore()?;
        let read = |p: &PathBuf| std::fs::read_to_string(p).context("read pem");
        let mut config = WeirConfig::shards(2)
            .set(
                "listeners",
                "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,MTLS://127.0.0.1:0",
            )
            .set(
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL",
            )
            // A PEM keystore file (key + chain) for all TLS listeners ...
            .set("ssl.keystore.type", "PEM")
            .set("ssl.keystore.location", keystore.display())
            // ... but inline PEM values (KIP-651) on SASL_SSL, and an inline truststore.
            .set("listener.name.sasl_ssl.ssl.keystore.certificate.chain", read(&pki.server_pem)?)
            .set("listener.name.sasl_ssl.ssl.keystore.key", read(&pki.server_key)?)
            .set("listener.name.sasl_ssl.sasl.enabled.mechanisms", "SCRAM-SHA-512")
            .set("listener.name.mtls.ssl.client.auth", "required")
            .set("listener.name.mtls.ssl.truststore.certificates", read(&pki.ca_pem)?)
            .set("sasl.plain.users", format!("{PLAIN_USER}:{PLAIN_PASSWORD}"))
            .set("num.partitions", 2);
        for (k, v) in extra {
            config = config.set(k, v);
        }
        let weir = Weir::start(config)?;
        Ok(SecureBroker {
            weir,
            pki,
            _certs: dir,
        })
    }

    /// The bound address of listener `name`, from the ready line's `listeners` list.
    pub fn addr(&self, name: &str) -> Result<SocketAddr> {
        listener_addr(&self.weir.log_text(), name)
    }

    /// librdkafka settings for a client of listener `name`.
    pub fn client_conf(&self, name: &str) -> Result<Vec<(String, String)>> {
        let addr = self.addr(name)?.to_string();
        let ca = self.pki.ca_pem.display().to_string();
        let mut c = vec![("bootstrap.servers".to_string(), addr)];
        let mut add = |k: &str, v: &str| c.push((k.to_string(), v.to_string()));
        match name {
            "PLAINTEXT" => {}
            "SSL" => {
                add("security.protocol", "SSL");
                add("ssl.ca.location", &ca);
            }
            "MTLS" => {
                add("security.protocol", "SSL");
                add("ssl.ca.location", &ca);
                add(
                    "ssl.certificate.location",
                    &self.pki.client_pem.display().to_string(),
                );
                add(
                    "ssl.key.location",
                    &self.pki.client_key.display().to_string(),
                );
            }
            "SASL_PLAINTEXT" => {
                add("security.protocol", "SASL_PLAINTEXT");
                add("sasl.mechanism", "PLAIN");
                add("sasl.username", PLAIN_USER);
                add("sasl.password", PLAIN_PASSWORD);
            }
            "SASL_SSL" => {
                add("security.protocol", "SASL_SSL");
                add("ssl.ca.location", &ca);
                add("sasl.mechanism", "SCRAM-SHA-512");
                add("sasl.username", SCRAM_USER);
                add("sasl.password", SCRAM_PASSWORD);
            }
            other => bail!("no client settings for listener {other}"),
        }
        Ok(c)
    }

    /// Creates the SCRAM user over the PLAINTEXT listener (AlterUserScramCredentials).
    pub fn add_scram_user(&self, mechanism: &str) -> Result<()> {
        let conf = self.client_conf("PLAINTEXT")?;
        run_client("scram-add", &conf, &[SCRAM_USER, SCRAM_PASSWORD, mechanism])?;
        Ok(())
    }
}

/// The address of `name` in a ready line (shared with the cluster tests).
pub use weir_tests::peer_security::listener_addr;

pub use weir_tests::broker::python;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("security/kafka_client.py")
}

/// A JSON object of string pairs (paths and PEM-free values only: quotes and
/// backslashes escaped).
pub fn json_object(pairs: &[(String, String)]) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let items: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("\"{}\":\"{}\"", esc(k), esc(v)))
        .collect();
    format!("{{{}}}", items.join(","))
}

/// Runs the confluent-kafka driver; returns its `OK ...` line, or fails with its output.
pub fn run_client(action: &str, conf: &[(String, String)], args: &[&str]) -> Result<String> {
    run_client_json(action, &json_object(conf), args)
}

pub fn run_client_json(action: &str, conf: &str, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(python()?);
    cmd.arg(script()).arg(action).arg(conf).args(args);
    let out = run_bounded(cmd, CLIENT_TIMEOUT)?;
    let last = out.stdout.lines().last().unwrap_or_default().to_string();
    if !out.ok || !last.starts_with("OK") {
        bail!(
            "{action} failed: {last}\nstdout:\n{}\nstderr:\n{}",
            out.stdout,
            out.stderr
        );
    }
    Ok(last)
}

/// What a bounded child process printed.
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` with stdin closed, killing it after `timeout`.
pub fn run_bounded(mut cmd: Command, timeout: Duration) -> Result<Output> {
    run_bounded_input(&mut cmd, None, timeout)
}

/// [`run_bounded`] with `input` on stdin (weir_tests' shared helper, as an [`Output`]).
pub fn run_bounded_input(
    cmd: &mut Command,
    input: Option<&str>,
    timeout: Duration,
) -> Result<Output> {
    let out = weir_tests::process::run_bounded_input(cmd, input, timeout)?;
    Ok(Output {
        ok: out.ok(),
        stdout: out.stdout,
        stderr: out.stderr,
    })
}
