//! How the load generator's connections are secured: Kafka's `security.protocol`
//! (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), TLS by rustls, and SASL PLAIN or
//! SCRAM-SHA-256/512 (KIP-84, the messages from `wire::scram`).
//!
//! One setting holds for the whole process, as one Kafka client's config does for all its
//! connections: `main` installs it once from the flags ([`install`]) and every
//! [`Conn::connect`](super::conn::Conn::connect) reads it, so the many places that open a
//! connection (metadata, producers, consumers, coordinators) need no parameter for it.
//!
//! [`Stream`] is what a connection reads and writes: the TCP socket itself, or TLS over it.
//! The producer reads a connection on one thread while it writes on another (a cloned
//! socket), so TLS is driven sans-I/O: the rustls state is shared behind a mutex, each side
//! moves bytes on its own clone of the socket, and neither holds the lock while it blocks
//! on the socket.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::conn::Conn;

/// Largest PEM file read for a CA, certificate or key.
const PEM_FILE_MAX_BYTES: u64 = 1 << 20;
/// Bytes read from the socket at a time by a TLS connection (a TLS record is at most 16 KiB
/// of payload; a fetch answer arrives as many of them).
const TLS_READ_CHUNK: usize = 256 << 10;

/// Kafka's `sasl.mechanism` (the login itself is `wire::sasl`'s, shared with weir's
/// own clients).
pub use wire::sasl::Mechanism;

/// `--sasl-mechanism`, in any case.
fn parse_mechanism(s: &str) -> Result<Mechanism> {
    let upper = s.to_ascii_uppercase();
    Mechanism::parse(&upper).ok_or_else(|| {
        anyhow!("--sasl-mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, not {upper:?}")
    })
}

/// The credentials a SASL listener asks for.
#[derive(Clone, Debug)]
pub struct Sasl {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: String,
}

/// What every connection of this process does after TCP connects.
#[derive(Clone, Default)]
pub struct Security {
    /// TLS first, with this configuration (SSL, SASL_SSL).
    pub tls: Option<Arc<ClientConfig>>,
    /// Then SASL (SASL_PLAINTEXT, SASL_SSL).
    pub sasl: Option<Sasl>,
}

/// The flags that make a [`Security`] (librdkafka's property names, as flags).
#[derive(Clone, Debug, Default)]
pub struct SecurityFlags {
    pub protocol: String,
    pub sasl_mechanism: String,
    pub sasl_username: Option<String>,
    pub sasl_password: Option<String>,
    pub ssl_ca_location: Option<PathBuf>,
    pub ssl_certificate_location: Option<PathBuf>,
    pub ssl_key_location: Option<PathBuf>,
    /// `https` (the default: the broker's certificate must name the host dialled) or `none`.
    pub ssl_endpoint_identification_algorithm: String,
}

impl SecurityFlags {
    /// Checks the flags together and builds the setting (reads the PEM files).
    pub fn build(&self) -> Result<Security> {
        let (tls, sasl) = match self.protocol.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => (false, false),
            "SSL" => (true, false),
            "SASL_PLAINTEXT" => (false, true),
            "SASL_SSL" => (true, true),
            other => bail!(
                "--security-protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not {other:?}"
            ),
        };
        let sasl = match (sasl, &self.sasl_username, &self.sasl_password) {
            (true, Some(u), Some(p)) => Some(Sasl {
                mechanism: parse_mechanism(&self.sasl_mechanism)?,
                username: u.clone(),
                password: p.clone(),
            }),
            (true, _, _) => bail!(
                "--security-protocol {} needs --sasl-username and --sasl-password",
                self.protocol
            ),
            (false, None, None) => None,
            (false, _, _) => bail!(
                "--sasl-username/--sasl-password need --security-protocol SASL_PLAINTEXT or SASL_SSL"
            ),
        };
        let tls_flags = self.ssl_ca_location.is_some()
            || self.ssl_certificate_location.is_some()
            || self.ssl_key_location.is_some();
        if tls_flags && !tls {
            bail!("--ssl-* flags need --security-protocol SSL or SASL_SSL");
        }
        let tls = tls.then(|| self.tls_config()).transpose()?;
        Ok(Security { tls, sasl })
    }

    fn tls_config(&self) -> Result<Arc<ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ssl_ca_location {
            Some(p) => {
                for cert in pem_certs(p)? {
                    roots
                        .add(cert)
                        .with_context(|| format!("a CA certificate in {}", p.display()))?;
                }
            }
            // No CA given: the public roots, as a client using the system's store would.
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let roots = Arc::new(roots);
        let builder = match self
            .ssl_endpoint_identification_algorithm
            .to_ascii_lowercase()
            .as_str()
        {
            "https" => ClientConfig::builder().with_root_certificates(roots),
            "none" => {
                let webpki = WebPkiServerVerifier::builder(roots)
                    .build()
                    .context("building the certificate verifier")?;
                ClientConfig::builder()
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
            }
            other => bail!(
                "--ssl-endpoint-identification-algorithm must be https or none, not {other:?}"
            ),
        };
        let config = match (&self.ssl_certificate_location, &self.ssl_key_location) {
            (Some(c), Some(k)) => builder
                .with_client_auth_cert(pem_certs(c)?, pem_key(k)?)
                .context("the client certificate and key")?,
            (None, None) => builder.with_no_client_auth(),
            _ => bail!("--ssl-certificate-location and --ssl-key-location go together"),
        };
        Ok(Arc::new(config))
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .take(PEM_FILE_MAX_BYTES + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    if buf.len() as u64 > PEM_FILE_MAX_BYTES {
        bail!(
            "{} is larger than {PEM_FILE_MAX_BYTES} bytes",
            path.display()
        );
    }
    Ok(buf)
}

fn pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("certificates in {}", path.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", path.display());
    }
    Ok(certs)
}

fn pem_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(&read_pem(path)?)
        .with_context(|| format!("a private key in {}", path.display()))
}

/// `ssl.endpoint.identification.algorithm=none`: the chain must still lead to a trusted CA,
/// but the certificate need not name the host dialled (brokers advertised by an address
/// their certificate does not carry).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

static SECURITY: OnceLock<Security> = OnceLock::new();

/// Sets the process's security once, before the first connection. A second call with
/// another setting is refused (a library user running two loads in one process must use
/// the same one).
pub fn install(security: Security) -> Result<()> {
    SECURITY
        .set(security)
        .map_err(|_| anyhow!("the connection security was already set"))
}

/// The process's security: plaintext unless [`install`] said otherwise.
pub fn current() -> &'static Security {
    SECURITY.get_or_init(Security::default)
}

/// What a [`Conn`] reads and writes.
pub enum Stream {
    Plain(TcpStream),
    Tls(TlsStream),
}

impl Stream {
    /// Secures a connected socket as [`current`] says: the TLS handshake, if any, is done
    /// here, bounded by the socket's timeouts.
    pub fn secure(sock: TcpStream, host: &str) -> Result<Stream> {
        match &current().tls {
            None => Ok(Stream::Plain(sock)),
            Some(config) => TlsStream::handshake(sock, config, host).map(Stream::Tls),
        }
    }

    fn sock(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }

    /// A second handle on the same connection, for a thread that only reads while this one
    /// writes (or the reverse). Reading on both is not supported.
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(t) => Stream::Tls(TlsStream {
                sock: t.sock.try_clone()?,
                shared: Arc::clone(&t.shared),
                plain: Vec::new(),
                plain_at: 0,
                raw: Vec::new(),
            }),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock().shutdown(how)
    }

    /// Reads up to `size` bytes onto the end of `buf` (fewer only at end of stream).
    /// Plaintext reads straight into the Vec's spare capacity: the socket's own reader
    /// fills memory it was given uninitialised, where a reader with only `read` (this
    /// enum's) has every byte zeroed first — a memset of each whole fetch answer, an
    /// eighth of a consumer's CPU.
    pub fn read_body(&mut self, size: usize, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.take(size as u64).read_to_end(buf),
            Stream::Tls(t) => t.take(size as u64).read_to_end(buf),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock().set_read_timeout(t)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(_) => Ok(()),
        }
    }
}

/// The rustls state of one connection, shared by its clones.
struct TlsShared {
    conn: Mutex<ClientConnection>,
    /// Held from encrypting a write until its bytes are on the socket, so records leave
    /// in the order rustls numbered them.
    write_order: Mutex<()>,
}

/// TLS over a blocking socket, sans-I/O: see the module docs.
pub struct TlsStream {
    sock: TcpStream,
    shared: Arc<TlsShared>,
    /// Decrypted bytes not yet handed to the reader, from `plain_at`.
    plain: Vec<u8>,
    plain_at: usize,
    /// Where the reader's socket reads land, kept across reads (zeroed once, not per read).
    raw: Vec<u8>,
}

fn poisoned() -> io::Error {
    io::Error::other("a thread panicked holding the TLS state")
}

impl TlsStream {
    fn handshake(mut sock: TcpStream, config: &Arc<ClientConfig>, host: &str) -> Result<Self> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| anyhow!("{host:?} is not a TLS server name: {e}"))?;
        let mut conn = ClientConnection::new(Arc::clone(config), name).context("TLS setup")?;
        // Whole requests are encrypted at once (a produce can be megabytes); the bound on
        // what one write queues is the request itself.
        conn.set_buffer_limit(None);
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).context("TLS handshake")?;
        }
        Ok(TlsStream {
            sock,
            shared: Arc::new(TlsShared {
                conn: Mutex::new(conn),
                write_order: Mutex::new(()),
            }),
            plain: Vec::new(),
            plain_at: 0,
            raw: Vec::new(),
        })
    }

    /// Decrypts `raw` (bytes just read from the socket) into `self.plain`; an empty `raw`
    /// is the peer's end of stream.
    fn take_in(&mut self, raw: &[u8]) -> io::Result<()> {
        let mut conn = self.shared.conn.lock().map_err(|_| poisoned())?;
        let mut rest = raw;
        loop {
            // read_tls takes what fits its buffer; process each part before the next, and
            // drain the plaintext each time (rustls bounds what it holds decrypted).
            // An empty `raw` is read once: rustls takes it as the end of stream.
            let before = rest.len();
            conn.read_tls(&mut rest)?;
            if !raw.is_empty() && rest.len() == before {
                return Err(io::Error::other("TLS: received bytes not taken"));
            }
            conn.process_new_packets().map_err(io::Error::other)?;
            let mut reader = conn.reader();
            let mut chunk = [0u8; 16 << 10];
            loop {
                match reader.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => self.plain.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // No close_notify before the end: the caller sees the end of stream.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
            }
            if rest.is_empty() {
                return Ok(());
            }
        }
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.plain_at < self.plain.len() {
                let n = buf.len().min(self.plain.len() - self.plain_at);
                buf[..n].copy_from_slice(&self.plain[self.plain_at..self.plain_at + n]);
                self.plain_at += n;
                if self.plain_at == self.plain.len() {
                    self.plain.clear();
                    self.plain_at = 0;
                }
                return Ok(n);
            }
            if buf.is_empty() {
                return Ok(0);
            }
            let mut raw = std::mem::take(&mut self.raw);
            raw.resize(TLS_READ_CHUNK, 0);
            // The lock is not held here: the writer may encrypt while this blocks.
            let got = self.sock.read(&mut raw);
            let taken = got.and_then(|n| self.take_in(&raw[..n]).map(|()| n));
            self.raw = raw;
            let got = taken?;
            if got == 0 && self.plain.is_empty() {
                return Ok(0);
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _order = self.shared.write_order.lock().map_err(|_| poisoned())?;
        let mut out = Vec::with_capacity(buf.len() + 1024);
        {
            let mut conn = self.shared.conn.lock().map_err(|_| poisoned())?;
            conn.writer().write_all(buf)?;
            while conn.wants_write() {
                conn.write_tls(&mut out)?;
            }
        }
        // The TLS state is free again before this blocks on a full socket, so the reader
        // can go on decrypting answers (the broker may wait for us to read before it reads).
        self.sock.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Logs `conn` in with SASL as [`current`] says (after ApiVersions, as Kafka's clients do).
pub fn authenticate(conn: &mut Conn) -> Result<()> {
    let Some(sasl) = &current().sasl else {
        return Ok(());
    };
    let mechanism = sasl.mechanism.name();
    let hs_version = conn.versions.pick(17, 0, 1)?;
    let hs: SaslHandshakeResponse = conn.call(
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
        hs_version,
    )?;
    if hs.error_code != 0 {
        let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
        bail!(
            "SASL handshake for {mechanism} refused with error code {} (the broker offers {offered:?})",
            hs.error_code
        );
    }
    let auth_version = conn.versions.pick(36, 0, 2)?;
    let (mut login, mut token) =
        wire::sasl::Login::start(sasl.mechanism, &sasl.username, &sasl.password);
    loop {
        let resp: SaslAuthenticateResponse = conn.call(
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
            auth_version,
        )?;
        if resp.error_code != 0 {
            let why = resp.error_message.as_ref().map_or("", |m| m.as_str());
            bail!(
                "SASL {mechanism} authentication as {:?} failed: error code {} {why}",
                sasl.username,
                resp.error_code
            );
        }
        match login.answer(&resp.auth_bytes)? {
            Some(next) => token = next,
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(protocol: &str) -> SecurityFlags {
        SecurityFlags {
            protocol: protocol.to_string(),
            sasl_mechanism: "PLAIN".to_string(),
            ssl_endpoint_identification_algorithm: "https".to_string(),
            ..SecurityFlags::default()
        }
    }

    #[test]
    fn flags_that_do_not_fit_the_protocol_are_refused() {
        let ok = flags("plaintext").build().expect("plaintext");
        assert!(ok.tls.is_none() && ok.sasl.is_none());
        let tls = flags("SSL").build().expect("SSL with the public roots");
        assert!(tls.tls.is_some() && tls.sasl.is_none());
        let err = |f: SecurityFlags| format!("{:#}", f.build().err().expect("refused"));
        assert!(err(flags("TLS")).contains("--security-protocol"));
        assert!(err(flags("SASL_PLAINTEXT")).contains("--sasl-username"));
        let mut f = flags("PLAINTEXT");
        f.sasl_username = Some("u".into());
        f.sasl_password = Some("p".into());
        assert!(err(f).contains("SASL_PLAINTEXT or SASL_SSL"));
        let mut f = flags("PLAINTEXT");
        f.ssl_ca_location = Some("/nonexistent".into());
        assert!(err(f).contains("SSL or SASL_SSL"));
        let mut f = flags("SASL_SSL");
        f.sasl_username = Some("u".into());
        f.sasl_password = Some("p".into());
        f.sasl_mechanism = "GSSAPI".into();
        assert!(err(f).contains("--sasl-mechanism"));
        let mut f = flags("SSL");
        f.ssl_certificate_location = Some("/nonexistent".into());
        assert!(err(f).contains("go together"));
        let mut f = flags("SSL");
        f.ssl_ca_location = Some("/nonexistent/ca.pem".into());
        assert!(err(f).contains("/nonexistent/ca.pem"));
    }
}
