//! TLS for the SSL and SASL_SSL listeners: a rustls server configuration built from Kafka's
//! PEM keys (KIP-651), and the principal of a client certificate in Kafka's default form
//! (`User:` + the subject in RFC 2253 order, e.g. `User:CN=alice,O=weir`).
//!
//! Keys are looked up with the listener prefix first, as Kafka does:
//! `listener.name.<listener>.ssl.keystore.location`, then `ssl.keystore.location`.

use std::sync::Arc;

use anyhow::Context as _;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::config::Properties;

/// Default of weir's `ssl.handshake.timeout.ms`: a TLS client must finish its handshake
/// this long after the TCP connection was accepted, or it is dropped. Kafka bounds it only
/// by `connections.max.idle.ms` (10 minutes), which lets stalled handshakes hold
/// connection slots far too long.
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Largest PEM file weir reads for a keystore or truststore.
const PEM_FILE_MAX_BYTES: u64 = 1 << 20;

/// Kafka's `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

/// A listener's TLS setup.
pub struct TlsSetup {
    pub config: Arc<rustls::ServerConfig>,
    pub client_auth: ClientAuth,
    pub handshake_timeout_ms: u64,
}

/// The value of `key` for `listener`: the listener-prefixed key first.
pub fn listener_prop<'a>(props: &'a Properties, listener: &str, key: &str) -> Option<&'a str> {
    let prefixed = format!("listener.name.{}.{key}", listener.to_ascii_lowercase());
    props.get(&prefixed).or_else(|| props.get(key))
}

/// Builds the TLS setup of `listener` from its `ssl.*` keys.
pub fn setup(props: &Properties, listener: &str) -> anyhow::Result<TlsSetup> {
    let get = |key: &str| listener_prop(props, listener, key);
    for (key, want) in [("ssl.keystore.type", "PEM"), ("ssl.truststore.type", "PEM")] {
        if let Some(v) = get(key).filter(|v| !v.eq_ignore_ascii_case(want)) {
            anyhow::bail!("{key}={v}: weir reads PEM only (KIP-651)");
        }
    }
    if get("ssl.key.password").is_some_and(|v| !v.is_empty()) {
        anyhow::bail!(
            "ssl.key.password: encrypted private keys are not supported; give the key unencrypted (PKCS#8 or PKCS#1 PEM)"
        );
    }
    let (chain, key) = keystore(get, listener)?
    .with_context(|| format!("listener {listener}: ssl.keystore.location or ssl.keystore.certificate.chain is required"))?;
    let client_auth = match get("ssl.client.auth").map(str::trim) {
        None | Some("none") | Some("") => ClientAuth::None,
        Some("requested") => ClientAuth::Requested,
        Some("required") => ClientAuth::Required,
        Some(v) => anyhow::bail!("ssl.client.auth={v}: expected none, requested or required"),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = if client_auth == ClientAuth::None {
        builder.with_no_client_auth()
    } else {
        let roots = trust_roots(get, listener)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let verifier = match client_auth {
            ClientAuth::Requested => verifier.allow_unauthenticated(),
            _ => verifier,
        };
        builder.with_client_cert_verifier(verifier.build().context("client verifier")?)
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .with_context(|| format!("listener {listener}: certificate and key"))?;
    config.alpn_protocols.clear();
    let handshake_timeout_ms = match get("ssl.handshake.timeout.ms") {
        None => HANDSHAKE_TIMEOUT_MS_DEFAULT,
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|ms| *ms > 0)
            .with_context(|| format!("ssl.handshake.timeout.ms={v}: expected a number > 0"))?,
    };
    Ok(TlsSetup {
        config: Arc::new(config),
        client_auth,
        handshake_timeout_ms,
    })
}

/// The rustls client configuration a node uses towards a peer's TLS listener
/// `listener` (its inter-broker or controller listener): the peer's certificate checked
/// against this node's `ssl.truststore.*` of that listener, and this node's own
/// `ssl.keystore.*` presented as the client certificate (for `ssl.client.auth`), as Kafka
/// does for inter-broker connections. The certificate must name the host dialled
/// ([`server_name`]) unless `ssl.endpoint.identification.algorithm` is empty.
pub fn client_config(
    props: &Properties,
    listener: &str,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let get = |key: &str| listener_prop(props, listener, key);
    let roots = trust_roots(get, listener)
        .with_context(|| format!("listener {listener}: node-to-node TLS needs a truststore"))?;
    let check_host = endpoint_identification(get(ENDPOINT_IDENTIFICATION_KEY))?;
    let client_cert = keystore(get, listener)?;
    client_config_with(roots, check_host, client_cert)
        .with_context(|| format!("listener {listener}: client certificate and key"))
}

/// The listener's keystore (`ssl.keystore.*`): its certificate chain and private key, or
/// `None` if none is configured.
fn keystore<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    listener: &str,
) -> anyhow::Result<Option<CertAndKey>> {
    let Some(keystore) = pem_source(
        get("ssl.keystore.location"),
        get("ssl.keystore.certificate.chain"),
        "ssl.keystore.location",
    )?
    else {
        return Ok(None);
    };
    let key_pem = match get("ssl.keystore.key") {
        Some(k) => normalize_pem(k).into_bytes(),
        // Kafka's PEM keystore file holds the key and the chain together.
        None => keystore.clone(),
    };
    let pair = chain_and_key(&keystore, &key_pem)
        .with_context(|| format!("listener {listener}: keystore"))?;
    Ok(Some(pair))
}

/// A certificate chain and its private key.
pub type CertAndKey = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// A rustls client configuration (ring): the server's chain checked against `roots`, its
/// certificate checked to name the host dialled only if `check_host`, and `client_cert`
/// presented when the server asks for one. Shared by node-to-node connections and the
/// admin commands (`admin_cli`).
pub fn client_config_with(
    roots: rustls::RootCertStore,
    check_host: bool,
    client_cert: Option<CertAndKey>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("server certificate verifier")?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match check_host {
        true => builder.with_webpki_verifier(verifier),
        false => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier))),
    };
    let config = match client_cert {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
    };
    Ok(Arc::new(config))
}

/// The certificate chain in `chain_pem` and the private key in `key_pem` (the same text
/// when one PEM file holds both, as Kafka's PEM keystore does).
pub fn chain_and_key(chain_pem: &[u8], key_pem: &[u8]) -> anyhow::Result<CertAndKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("certificates: {e:?}"))?;
    if chain.is_empty() {
        anyhow::bail!("no certificate");
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| anyhow::anyhow!("private key: {e:?}"))?;
    Ok((chain, key))
}

/// Kafka's `ssl.endpoint.identification.algorithm`: `https` (the default) checks the
/// peer's certificate against the host it was dialled by; empty skips that check.
pub const ENDPOINT_IDENTIFICATION_KEY: &str = "ssl.endpoint.identification.algorithm";

/// Whether the host name is checked (`https`, the default) or not (empty).
fn endpoint_identification(value: Option<&str>) -> anyhow::Result<bool> {
    match value.map(str::trim) {
        None => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("https") => Ok(true),
        Some("") => Ok(false),
        Some(v) => anyhow::bail!("{ENDPOINT_IDENTIFICATION_KEY}={v}: expected https or empty"),
    }
}

/// A server certificate verifier for `ssl.endpoint.identification.algorithm=` (empty):
/// the chain must still lead to a trusted CA, be in its validity period and fit the
/// signatures, only the host name is not compared. webpki checks the chain before the
/// name (`WebPkiServerVerifier::verify_server_cert`), so a name error means the chain
/// passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match verified {
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

/// The name a node checks a peer's certificate against: the host it dialled (a DNS name,
/// or an IP literal), as Kafka does; the address's IP when the host is no valid name.
pub fn server_name(host: &str, addr: std::net::SocketAddr) -> ServerName<'static> {
    let host = host.trim().trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::IpAddress(addr.ip().into()))
}

/// The CA certificates client certificates are checked against.
fn trust_roots<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    listener: &str,
) -> anyhow::Result<rustls::RootCertStore> {
    let pem = pem_source(
        get("ssl.truststore.location"),
        get("ssl.truststore.certificates"),
        "ssl.truststore.location",
    )?
    .with_context(|| format!("listener {listener}: ssl.client.auth needs ssl.truststore.location or ssl.truststore.certificates"))?;
    roots_from_pem(&pem).with_context(|| format!("listener {listener}: the truststore"))
}

/// The CA certificates in PEM text (at least one).
pub fn roots_from_pem(pem: &[u8]) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| anyhow::anyhow!("a CA certificate: {e:?}"))?;
        roots.add(cert).context("a CA certificate")?;
    }
    if roots.is_empty() {
        anyhow::bail!("no CA certificate");
    }
    Ok(roots)
}

/// PEM text from a file (`location`) or inline (`inline`), whichever is set; errors name
/// `location_key` (a config key, or an admin command's flag).
pub fn pem_source(
    location: Option<&str>,
    inline: Option<&str>,
    location_key: &str,
) -> anyhow::Result<Option<Vec<u8>>> {
    if let Some(text) = inline {
        return Ok(Some(normalize_pem(text).into_bytes()));
    }
    let Some(path) = location else {
        return Ok(None);
    };
    let file = std::fs::File::open(path).with_context(|| format!("{location_key}={path}"))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, PEM_FILE_MAX_BYTES + 1),
        &mut bytes,
    )
    .with_context(|| format!("{location_key}={path}"))?;
    if bytes.len() as u64 > PEM_FILE_MAX_BYTES {
        anyhow::bail!("{location_key}={path}: larger than {PEM_FILE_MAX_BYTES} bytes");
    }
    Ok(Some(bytes))
}

/// Inline PEM in a properties value often arrives on one line (Kafka accepts that): put
/// the BEGIN/END markers and the base64 body on lines of their own again.
fn normalize_pem(text: &str) -> String {
    if text.contains('\n') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text.trim();
    while let Some(begin) = rest.find("-----BEGIN ") {
        let Some(open_end) = rest[begin + 11..].find("-----").map(|i| begin + 11 + i + 5) else {
            break;
        };
        let Some(end) = rest[open_end..].find("-----END ").map(|i| open_end + i) else {
            break;
        };
        let Some(close_end) = rest[end + 9..].find("-----").map(|i| end + 9 + i + 5) else {
            break;
        };
        out.push_str(&rest[begin..open_end]);
        out.push('\n');
        for word in rest[open_end..end].split_whitespace() {
            out.push_str(word);
            out.push('\n');
        }
        out.push_str(&rest[end..close_end]);
        out.push('\n');
        rest = &rest[close_end..];
    }
    out
}

/// Kafka's default principal of a TLS client: `User:` and the certificate's subject in
/// RFC 2253 form (most specific attribute first, `,` between, special characters escaped).
/// `None` if the certificate does not parse (it was verified, so that does not happen
/// with a real CA; the connection is then refused).
pub fn principal_of_certificate(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let registry = x509_parser::objects::oid_registry();
    let mut parts = Vec::new();
    for rdn in cert.subject().iter().collect::<Vec<_>>().into_iter().rev() {
        let attrs: Vec<String> = rdn
            .iter()
            .map(|a| {
                let name = x509_parser::objects::oid2abbrev(a.attr_type(), registry)
                    .map(str::to_string)
                    .unwrap_or_else(|_| a.attr_type().to_id_string());
                let value = a.as_str().map(rfc2253_escape).unwrap_or_default();
                format!("{name}={value}")
            })
            .collect();
        parts.push(attrs.join("+"));
    }
    Some(parts.join(","))
}

fn rfc2253_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let edge = (i == 0 && (c == ' ' || c == '#')) || (i + 1 == v.chars().count() && c == ' ');
        if edge || matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_pem_gets_its_lines_back() {
        let one = "-----BEGIN CERTIFICATE----- QUJD REVG -----END CERTIFICATE----- -----BEGIN CERTIFICATE----- R0hJ -----END CERTIFICATE-----";
        let fixed = normalize_pem(one);
        assert_eq!(
            fixed,
            "-----BEGIN CERTIFICATE-----\nQUJD\nREVG\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nR0hJ\n-----END CERTIFICATE-----\n"
        );
        assert_eq!(normalize_pem("a\nb"), "a\nb");
    }

    #[test]
    fn endpoint_identification_is_https_or_empty() {
        assert!(endpoint_identification(None).expect("default"));
        assert!(endpoint_identification(Some("HTTPS")).expect("https"));
        assert!(!endpoint_identification(Some("")).expect("empty"));
        assert!(!endpoint_identification(Some("  ")).expect("blank"));
        assert!(endpoint_identification(Some("ldap")).is_err());
    }

    #[test]
    fn server_name_is_the_dialled_host() {
        let addr: std::net::SocketAddr = "127.0.0.1:9092".parse().expect("addr");
        let dns = server_name("localhost", addr);
        assert!(matches!(dns, ServerName::DnsName(ref d) if d.as_ref() == "localhost"));
        let ip = server_name("10.0.0.7", addr);
        assert!(matches!(ip, ServerName::IpAddress(_)));
        assert_ne!(ip, ServerName::IpAddress(addr.ip().into()));
        let v6 = server_name("[::1]", addr);
        assert!(matches!(v6, ServerName::IpAddress(_)));
        // Not a name at all: the address it resolved to.
        let bad = server_name("bad host!", addr);
        assert_eq!(bad, ServerName::IpAddress(addr.ip().into()));
    }

    #[test]
    fn rfc2253_escapes_specials() {
        assert_eq!(rfc2253_escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(rfc2253_escape(" x "), "\\ x\\ ");
        assert_eq!(rfc2253_escape("alice"), "alice");
    }
}
