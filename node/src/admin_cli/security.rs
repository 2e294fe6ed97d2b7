//! How the admin commands' connections are secured: the flags `weir-loadgen` takes
//! (Kafka's `security.protocol` and librdkafka's `ssl.*` / `sasl.*` properties as flags),
//! TLS by rustls over the blocking socket, SASL PLAIN or SCRAM-SHA-256/512.
//!
//! One setting holds for the whole process, as one Kafka client's config does for all its
//! connections: `main` installs it once ([`install`]) and every
//! [`Client::connect`](super::Client::connect) reads it, so the bootstrap connection and
//! every node a command then contacts are secured the same way.
//!
//! The TLS configuration is the node's own client builder (`security::tls`, also used
//! towards peers); the socket is one thread's, so `rustls::StreamOwned` drives it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rustls::{AlertDescription, CertificateError, ClientConnection, StreamOwned};

use crate::security::listener::SecurityProtocol;
use crate::security::peer::PeerSasl;
use crate::security::sasl::Mechanism;
use crate::security::tls;

/// How long a TCP connect may take before the command gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the whole TLS handshake may take (the broker's own bound on it is
/// `ssl.handshake.timeout.ms`, 10 s by default).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection security flags every admin command takes. Its `Debug` leaves the
/// passwords out.
#[derive(clap::Args, Clone, Default)]
pub struct SecurityArgs {
    /// Kafka's security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (default:
    /// PLAINTEXT, or SASL_PLAINTEXT with --sasl-plain).
    #[arg(long)]
    pub security_protocol: Option<String>,
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default PLAIN; with SASL_PLAINTEXT or
    /// SASL_SSL).
    #[arg(long)]
    pub sasl_mechanism: Option<String>,
    #[arg(long)]
    pub sasl_username: Option<String>,
    /// The password (visible to other users in the process list).
    #[arg(long)]
    pub sasl_password: Option<String>,
    /// Shorthand for --sasl-mechanism PLAIN --sasl-username USER --sasl-password PASSWORD.
    #[arg(long, value_name = "USER:PASSWORD", conflicts_with_all = ["sasl_username", "sasl_password", "sasl_mechanism"])]
    pub sasl_plain: Option<String>,
    /// PEM file of the CA(s) the broker's certificate must chain to; default: the public
    /// web roots (webpki-roots).
    #[arg(long)]
    pub ssl_ca_location: Option<PathBuf>,
    /// PEM client certificate (chain), for a listener with ssl.client.auth=required.
    #[arg(long)]
    pub ssl_certificate_location: Option<PathBuf>,
    /// PEM private key of --ssl-certificate-location.
    #[arg(long)]
    pub ssl_key_location: Option<PathBuf>,
    /// https: the broker's certificate must name the host dialled; none: any name (the
    /// chain is still checked).
    #[arg(long, default_value = "https")]
    pub ssl_endpoint_identification_algorithm: String,
}

impl std::fmt::Debug for SecurityArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |p: &Option<String>| p.as_ref().map(|_| "<hidden>");
        f.debug_struct("SecurityArgs")
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &hidden(&self.sasl_password))
            .field("sasl_plain", &hidden(&self.sasl_plain))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("ssl_certificate_location", &self.ssl_certificate_location)
            .field("ssl_key_location", &self.ssl_key_location)
            .field(
                "ssl_endpoint_identification_algorithm",
                &self.ssl_endpoint_identification_algorithm,
            )
            .finish()
    }
}

/// What every connection of this process does after TCP connects.
#[derive(Clone, Default)]
pub struct Security {
    /// TLS first, with this configuration (SSL, SASL_SSL).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Then SASL (SASL_PLAINTEXT, SASL_SSL): the node's own client credentials type, whose
    /// Debug never shows the password.
    pub sasl: Option<PeerSasl>,
    /// Where the trusted CAs came from, for error messages.
    ca: String,
}

impl SecurityArgs {
    /// Checks the flags together and builds the setting (reads the PEM files).
    pub fn build(&self) -> anyhow::Result<Security> {
        let plain = self.sasl_plain.as_deref().map(split_plain).transpose()?;
        let protocol = match (&self.security_protocol, &plain) {
            (Some(p), _) => SecurityProtocol::parse(p).ok_or_else(|| {
                anyhow!(
                    "--security-protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not {p:?}"
                )
            })?,
            // --sasl-plain alone means a SASL_PLAINTEXT listener, as before the flag had company.
            (None, Some(_)) => SecurityProtocol::SaslPlaintext,
            (None, None) => SecurityProtocol::Plaintext,
        };
        let sasl = self.sasl(protocol, plain)?;
        let ssl_flags = self.ssl_ca_location.is_some()
            || self.ssl_certificate_location.is_some()
            || self.ssl_key_location.is_some();
        if ssl_flags && !protocol.is_tls() {
            bail!("--ssl-* flags need --security-protocol SSL or SASL_SSL");
        }
        let tls = protocol.is_tls().then(|| self.tls_config()).transpose()?;
        let ca = match &self.ssl_ca_location {
            Some(p) => format!("--ssl-ca-location {}", p.display()),
            None => "the public roots; give the broker's CA with --ssl-ca-location".to_string(),
        };
        Ok(Security { tls, sasl, ca })
    }

    fn sasl(
        &self,
        protocol: SecurityProtocol,
        plain: Option<(String, String)>,
    ) -> anyhow::Result<Option<PeerSasl>> {
        let wanted = protocol.is_sasl();
        let creds = match (plain, &self.sasl_username, &self.sasl_password) {
            (Some(up), _, _) => Some(up),
            (None, Some(u), Some(p)) => Some((u.clone(), p.clone())),
            (None, None, None) => None,
            _ => bail!("--sasl-username and --sasl-password go together"),
        };
        match (wanted, creds) {
            (true, Some((user, password))) => {
                let name = self.sasl_mechanism.as_deref().unwrap_or("PLAIN");
                let mechanism = Mechanism::parse(&name.to_ascii_uppercase()).ok_or_else(|| {
                    anyhow!(
                        "--sasl-mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, not {name:?}"
                    )
                })?;
                Ok(Some(PeerSasl {
                    mechanism,
                    user,
                    password,
                }))
            }
            (true, None) => bail!(
                "--security-protocol {} needs --sasl-username and --sasl-password (or --sasl-plain)",
                protocol.name()
            ),
            (false, None) if self.sasl_mechanism.is_none() => Ok(None),
            (false, _) => bail!("SASL flags need --security-protocol SASL_PLAINTEXT or SASL_SSL"),
        }
    }

    fn tls_config(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let read = |path: &PathBuf, flag: &str| -> anyhow::Result<Vec<u8>> {
            let text = path.to_str().context("a PEM path that is not UTF-8")?;
            tls::pem_source(Some(text), None, flag)?.context("no PEM file")
        };
        let roots = match &self.ssl_ca_location {
            Some(p) => tls::roots_from_pem(&read(p, "--ssl-ca-location")?)
                .with_context(|| format!("--ssl-ca-location {}", p.display()))?,
            // No CA given: the public roots, as a client using the system's store would.
            None => {
                let mut roots = rustls::RootCertStore::empty();
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                roots
            }
        };
        let check_host = match self
            .ssl_endpoint_identification_algorithm
            .to_ascii_lowercase()
            .as_str()
        {
            "https" => true,
            "none" => false,
            other => bail!(
                "--ssl-endpoint-identification-algorithm must be https or none, not {other:?}"
            ),
        };
        let client_cert = match (&self.ssl_certificate_location, &self.ssl_key_location) {
            (Some(c), Some(k)) => {
                let chain = read(c, "--ssl-certificate-location")?;
                let key = read(k, "--ssl-key-location")?;
                Some(tls::chain_and_key(&chain, &key).context("the client certificate and key")?)
            }
            (None, None) => None,
            _ => bail!("--ssl-certificate-location and --ssl-key-location go together"),
        };
        tls::client_config_with(roots, check_host, client_cert)
    }
}

/// `USER:PASSWORD` of `--sasl-plain`.
fn split_plain(creds: &str) -> anyhow::Result<(String, String)> {
    let (user, password) = creds
        .split_once(':')
        .context("--sasl-plain wants USER:PASSWORD")?;
    Ok((user.to_string(), password.to_string()))
}

static SECURITY: OnceLock<Security> = OnceLock::new();

/// Builds the setting from `args` and makes it the one every later connection uses.
pub fn install(args: &SecurityArgs) -> anyhow::Result<()> {
    SECURITY
        .set(args.build()?)
        .map_err(|_| anyhow!("the connection security was already set"))
}

/// The process's security: plaintext unless [`install`] said otherwise.
pub fn current() -> &'static Security {
    SECURITY.get_or_init(Security::default)
}

/// What a [`Client`](super::Client) reads and writes: the socket, or TLS over it.
pub trait Duplex: Read + Write {}

impl<T: Read + Write> Duplex for T {}

/// Connects to `addr` (`host:port`) and secures the socket as [`current`] says; the TCP
/// connect and the TLS handshake are each bounded in time. `io_timeout` then bounds each
/// read and write.
pub fn connect(addr: &str, io_timeout: Duration) -> anyhow::Result<Box<dyn Duplex>> {
    let (sock, peer) = connect_tcp(addr)?;
    let Some(config) = &current().tls else {
        set_timeouts(&sock, io_timeout)?;
        return Ok(Box::new(sock));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let tls = handshake(sock, config, host, peer)
        .map_err(|e| explain(&e, host).unwrap_or(e))
        .with_context(|| format!("TLS handshake with {addr}"))?;
    set_timeouts(&tls.sock, io_timeout)?;
    Ok(Box::new(tls))
}

fn set_timeouts(sock: &TcpStream, timeout: Duration) -> io::Result<()> {
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))
}

/// A TCP connection to the first of `addr`'s addresses that answers within
/// [`CONNECT_TIMEOUT`].
fn connect_tcp(addr: &str) -> anyhow::Result<(TcpStream, SocketAddr)> {
    let mut last = None;
    for peer in addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
    {
        match TcpStream::connect_timeout(&peer, CONNECT_TIMEOUT) {
            Ok(sock) => return Ok((sock, peer)),
            Err(e) => last = Some(e),
        }
    }
    let e = last.map_or_else(|| anyhow!("no address"), anyhow::Error::from);
    Err(e.context(format!("connecting to {addr}")))
}

/// The TLS handshake on `sock`, all of it within [`HANDSHAKE_TIMEOUT`].
fn handshake(
    sock: TcpStream,
    config: &Arc<rustls::ClientConfig>,
    host: &str,
    peer: SocketAddr,
) -> anyhow::Result<StreamOwned<ClientConnection, TcpStream>> {
    let name = tls::server_name(host, peer);
    let mut conn = ClientConnection::new(Arc::clone(config), name).context("TLS setup")?;
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let timed_out = || {
        anyhow!(
            "timed out after {} s (is it a TLS listener?)",
            HANDSHAKE_TIMEOUT.as_secs()
        )
    };
    while conn.is_handshaking() {
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        // Each read and write waits at most what is left of the whole handshake's time
        // (`complete_io` reads on until the handshake is done, so a peer trickling bytes
        // would otherwise keep it going past the deadline).
        let mut within = UntilDeadline {
            sock: &sock,
            deadline,
        };
        match conn.complete_io(&mut within) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out());
            }
            // A plaintext listener reads the ClientHello as a frame of absurd size and
            // closes the connection.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(anyhow!(
                    "the broker closed the connection during the TLS handshake (is it a TLS \
                     listener? --security-protocol SSL and SASL_SSL need one)"
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(StreamOwned::new(conn, sock))
}

/// A socket whose every read and write is bounded by what is left until `deadline`
/// (`TimedOut` once it has passed).
struct UntilDeadline<'a> {
    sock: &'a TcpStream,
    deadline: Instant,
}

impl UntilDeadline<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        set_timeouts(self.sock, left)?;
        Ok(left)
    }
}

impl io::Read for UntilDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.left()?;
        io::Read::read(&mut self.sock, buf)
    }
}

impl io::Write for UntilDeadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.left()?;
        io::Write::write(&mut self.sock, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::Write::flush(&mut self.sock)
    }
}

/// A TLS failure said in the operator's terms, with the flag that changes it; `None` if
/// `e` is no TLS failure this knows. `host` is the host dialled.
pub(super) fn explain(e: &anyhow::Error, host: &str) -> Option<anyhow::Error> {
    let ca = &current().ca;
    let tls = e.chain().find_map(|c| {
        c.downcast_ref::<rustls::Error>().or_else(|| {
            c.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })?;
    let why = match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!("the broker's certificate is not signed by a trusted CA ({ca})")
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the broker's certificate does not name {host} \
             (--ssl-endpoint-identification-algorithm none skips this check)"
        ),
        rustls::Error::InvalidCertificate(other) => {
            format!("the broker's certificate is not valid: {other:?}")
        }
        rustls::Error::AlertReceived(
            alert @ (AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::HandshakeFailure),
        ) => format!(
            "the broker refused the connection ({alert:?}): it may want a client certificate \
             it trusts (--ssl-certificate-location, --ssl-key-location)"
        ),
        _ => return None,
    };
    Some(anyhow!(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that trickles a byte every 50 ms keeps each read short, but reads through
    /// [`UntilDeadline`] stop once the deadline has passed: what bounds a handshake with
    /// such a peer, which `complete_io` would otherwise read from for as long as it sends.
    #[test]
    fn reads_until_a_deadline_stop_at_it_however_the_peer_trickles() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let trickler = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            for _ in 0..100 {
                if s.write_all(&[0x16]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let sock = TcpStream::connect(addr).expect("connect");
        let started = Instant::now();
        let mut within = UntilDeadline {
            sock: &sock,
            deadline: started + Duration::from_millis(300),
        };
        let mut got = 0;
        let mut byte = [0u8; 1];
        let err = loop {
            match within.read(&mut byte) {
                Ok(n) => got += n,
                Err(e) => break e,
            }
            assert!(
                got < 100,
                "the peer's bytes ran out before the deadline stopped the reads"
            );
        };
        // TimedOut from the deadline check, or WouldBlock from the socket's own timeout
        // when a read was waiting as the deadline passed: the handshake takes both.
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
        assert!(got >= 1, "bytes came before the deadline");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "stopped near the deadline"
        );
        drop(sock);
        trickler.join().expect("trickler");
    }

    fn args(protocol: Option<&str>) -> SecurityArgs {
        SecurityArgs {
            security_protocol: protocol.map(str::to_string),
            ssl_endpoint_identification_algorithm: "https".to_string(),
            ..SecurityArgs::default()
        }
    }

    #[test]
    fn flags_that_do_not_fit_the_protocol_are_refused() {
        let err = |a: SecurityArgs| format!("{:#}", a.build().err().expect("refused"));
        let plain = args(None).build().expect("plaintext");
        assert!(plain.tls.is_none() && plain.sasl.is_none());
        let tls = args(Some("ssl"))
            .build()
            .expect("SSL with the public roots");
        assert!(tls.tls.is_some() && tls.sasl.is_none());
        assert!(err(args(Some("TLS"))).contains("--security-protocol"));
        assert!(err(args(Some("SASL_SSL"))).contains("--sasl-username"));
        let mut a = args(Some("PLAINTEXT"));
        a.sasl_username = Some("u".into());
        a.sasl_password = Some("p".into());
        assert!(err(a).contains("SASL_PLAINTEXT or SASL_SSL"));
        let mut a = args(Some("SASL_PLAINTEXT"));
        a.sasl_username = Some("u".into());
        assert!(err(a).contains("go together"));
        let mut a = args(None);
        a.ssl_ca_location = Some("/nonexistent/ca.pem".into());
        assert!(err(a).contains("SSL or SASL_SSL"));
        let mut a = args(Some("SSL"));
        a.ssl_ca_location = Some("/nonexistent/ca.pem".into());
        assert!(err(a).contains("/nonexistent/ca.pem"));
        let mut a = args(Some("SSL"));
        a.ssl_key_location = Some("/nonexistent/key.pem".into());
        assert!(err(a).contains("go together"));
        let mut a = args(Some("SSL"));
        a.ssl_endpoint_identification_algorithm = "ldap".into();
        assert!(err(a).contains("https or none"));
        let mut a = args(Some("SASL_SSL"));
        a.sasl_username = Some("u".into());
        a.sasl_password = Some("p".into());
        a.sasl_mechanism = Some("GSSAPI".into());
        assert!(err(a).contains("--sasl-mechanism"));
    }

    #[test]
    fn sasl_plain_alone_means_sasl_plaintext() {
        let mut a = args(None);
        a.sasl_plain = Some("bob:pw:with:colons".into());
        let s = a.build().expect("--sasl-plain");
        assert!(s.tls.is_none());
        let sasl = s.sasl.expect("SASL");
        assert_eq!(sasl.mechanism, Mechanism::Plain);
        assert_eq!(
            (sasl.user.as_str(), sasl.password.as_str()),
            ("bob", "pw:with:colons")
        );
        let mut a = args(Some("SASL_SSL"));
        a.sasl_plain = Some("bob:pw".into());
        let s = a.build().expect("--sasl-plain over SASL_SSL");
        assert!(s.tls.is_some() && s.sasl.is_some());
        let mut a = args(Some("SSL"));
        a.sasl_plain = Some("bob:pw".into());
        assert!(a.build().is_err());
        let mut a = args(None);
        a.sasl_plain = Some("no-colon".into());
        assert!(a.build().is_err());
    }
}
