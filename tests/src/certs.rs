//! Test certificates made on the spot with the `openssl` CLI: a CA, a server certificate
//! for 127.0.0.1/localhost (and one for localhost only) and client certificates, all EC
//! P-256, valid for two days.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The files of one test PKI.
pub struct TestPki {
    pub dir: PathBuf,
    pub ca_pem: PathBuf,
    pub server_pem: PathBuf,
    pub server_key: PathBuf,
    pub client_pem: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate signed by a different CA (not trusted by the broker).
    pub rogue_pem: PathBuf,
    pub rogue_key: PathBuf,
    /// A client certificate of the trusted CA that expired in 2020.
    pub expired_pem: PathBuf,
    pub expired_key: PathBuf,
}

/// Subject of the trusted client certificate; its principal is `User:CN=alice,O=weir`.
pub const CLIENT_SUBJECT: &str = "/O=weir/CN=alice";

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("run openssl (is it installed?)")?;
    if !out.status.success() {
        bail!(
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn ca(dir: &Path, name: &str) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    )
}

fn leaf(dir: &Path, ca_name: &str, name: &str, subject: &str, ext: &str) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    )?;
    std::fs::write(dir.join(format!("{name}.ext")), ext)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca_name}.pem"),
            "-CAkey",
            &format!("{ca_name}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    )
}

/// `openssl ca`'s minimal configuration: the only way the CLI sets validity dates in the
/// past (`x509 -days` cannot).
const CA_CONFIG: &str = "[ca]\ndefault_ca = ca_default\n[ca_default]\ndir = .\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\ndefault_md = sha256\npolicy = policy_any\nunique_subject = no\n[policy_any]\ncommonName = supplied\norganizationName = optional\n";

/// A client certificate of `ca` valid only on 2020-01-01.
fn expired(dir: &Path, ext: &str) -> Result<()> {
    std::fs::write(dir.join("ca.cnf"), CA_CONFIG)?;
    std::fs::write(dir.join("index.txt"), "")?;
    std::fs::write(dir.join("serial"), "01\n")?;
    std::fs::write(dir.join("expired.ext"), ext)?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/O=weir/CN=old",
            "-keyout",
            "expired.key",
            "-out",
            "expired.csr",
        ],
    )?;
    openssl(
        dir,
        &[
            "ca",
            "-batch",
            "-notext",
            "-config",
            "ca.cnf",
            "-cert",
            "ca.pem",
            "-keyfile",
            "ca.key",
            "-in",
            "expired.csr",
            "-out",
            "expired.pem",
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
            "-extfile",
            "expired.ext",
        ],
    )
}

/// Makes a CA, a server and a client certificate (and a rogue and an expired client) in
/// `dir`.
pub fn make(dir: &Path) -> Result<TestPki> {
    ca(dir, "ca")?;
    ca(dir, "rogue-ca")?;
    leaf(
        dir,
        "ca",
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )?;
    let client_ext = "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n";
    leaf(dir, "ca", "client", CLIENT_SUBJECT, client_ext)?;
    leaf(dir, "rogue-ca", "rogue", "/CN=mallory", client_ext)?;
    expired(dir, client_ext)?;
    Ok(TestPki {
        dir: dir.to_path_buf(),
        ca_pem: dir.join("ca.pem"),
        server_pem: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_pem: dir.join("client.pem"),
        client_key: dir.join("client.key"),
        rogue_pem: dir.join("rogue.pem"),
        rogue_key: dir.join("rogue.key"),
        expired_pem: dir.join("expired.pem"),
        expired_key: dir.join("expired.key"),
    })
}

impl TestPki {
    /// A PEM keystore file as Kafka reads it: the private key and the certificate chain.
    pub fn server_keystore(&self) -> Result<PathBuf> {
        let path = self.dir.join("server-keystore.pem");
        let mut text = std::fs::read_to_string(&self.server_key)?;
        text.push_str(&std::fs::read_to_string(&self.server_pem)?);
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// A PEM keystore of a server certificate of the trusted CA whose only name is
    /// `DNS:localhost` (no IP address): a peer dialled by 127.0.0.1 does not match it.
    pub fn localhost_only_keystore(&self) -> Result<PathBuf> {
        let name = "localhost-only";
        leaf(
            &self.dir,
            "ca",
            name,
            "/CN=localhost",
            "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
        )?;
        let path = self.dir.join(format!("{name}-keystore.pem"));
        let mut text = std::fs::read_to_string(self.dir.join(format!("{name}.key")))?;
        text.push_str(&std::fs::read_to_string(
            self.dir.join(format!("{name}.pem")),
        )?);
        std::fs::write(&path, text)?;
        Ok(path)
    }
}
