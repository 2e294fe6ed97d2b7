//! What the secure listeners refuse: a wrong password or an unknown user (answered with
//! SASL_AUTHENTICATION_FAILED after the failed-authentication delay, then closed), any
//! request before SASL completes (closed, nothing served), a TLS client without a trusted
//! (or with an expired) certificate under `ssl.client.auth=required` (handshake refused), plaintext bytes to a
//! TLS port, and a TLS client that stalls in its handshake (dropped at the deadline).

mod security_support;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use security_support::{
    PLAIN_PASSWORD, PLAIN_USER, SCRAM_USER, SecureBroker, json_object, run_client, run_client_json,
};
use weir_tests::raw::RawConn;

/// SASL_AUTHENTICATION_FAILED.
const SASL_AUTHENTICATION_FAILED: i16 = 58;
/// UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
/// The failed-authentication delay the broker is started with.
const DELAY_MS: u64 = 1_000;
/// The TLS handshake deadline the broker is started with.
const HANDSHAKE_TIMEOUT_MS: u64 = 1_500;
/// How long a refused connection may take to close (delays included), with margin for
/// a loaded CI machine.
const CLOSE_WITHIN: Duration = Duration::from_secs(20);

fn broker() -> Result<SecureBroker> {
    SecureBroker::start(&[
        (
            "connection.failed.authentication.delay.ms",
            &DELAY_MS.to_string(),
        ),
        (
            "ssl.handshake.timeout.ms",
            &HANDSHAKE_TIMEOUT_MS.to_string(),
        ),
    ])
}

/// SaslHandshake v1 then one SaslAuthenticate v1 with `token`; returns the
/// authentication's error code, how long it took, and whether the broker then closed.
fn plain_attempt(conn: &mut RawConn, token: &[u8]) -> Result<(i16, Duration, bool)> {
    let hs: SaslHandshakeResponse = conn.call(
        ApiKey::SaslHandshake,
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    )?;
    ensure!(hs.error_code == 0, "handshake error {}", hs.error_code);
    let started = Instant::now();
    let auth: SaslAuthenticateResponse = conn.call(
        ApiKey::SaslAuthenticate,
        1,
        &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::copy_from_slice(token)),
    )?;
    let took = started.elapsed();
    if auth.error_code != 0 {
        let (closed, _) = conn.wait_closed(CLOSE_WITHIN)?;
        return Ok((auth.error_code, took, closed));
    }
    Ok((0, took, false))
}

#[test]
fn wrong_password_or_unknown_user_is_refused_after_the_delay_and_closed() -> Result<()> {
    let b = broker()?;
    let addr = b.addr("SASL_PLAINTEXT")?;
    let wrong = format!("\0{PLAIN_USER}\0not-{PLAIN_PASSWORD}");
    let unknown = "\0mallory\0x".to_string();
    for token in [wrong, unknown] {
        let mut conn = RawConn::connect(addr)?;
        let (code, took, closed) = plain_attempt(&mut conn, token.as_bytes())?;
        ensure!(code == SASL_AUTHENTICATION_FAILED, "error {code}");
        ensure!(
            took >= Duration::from_millis(DELAY_MS - 100),
            "answered after {took:?}"
        );
        ensure!(
            closed,
            "the connection stays open after a failed authentication"
        );
    }
    // The right password on a fresh connection is served, Metadata included.
    let mut conn = RawConn::connect(addr)?;
    let ok = format!("\0{PLAIN_USER}\0{PLAIN_PASSWORD}");
    let (code, _, _) = plain_attempt(&mut conn, ok.as_bytes())?;
    ensure!(code == 0, "right password refused: {code}");
    ensure!(conn.metadata().is_ok(), "Metadata after authentication");
    // An unoffered mechanism is refused with the offered list.
    let mut conn = RawConn::connect(addr)?;
    let hs: SaslHandshakeResponse = conn.call(
        ApiKey::SaslHandshake,
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI")),
    )?;
    ensure!(
        hs.error_code == UNSUPPORTED_SASL_MECHANISM,
        "{}",
        hs.error_code
    );
    ensure!(hs.mechanisms.iter().any(|m| m.as_str() == "PLAIN"));
    // SCRAM with a wrong password through confluent-kafka: an authentication error.
    b.add_scram_user("SCRAM-SHA-512")?;
    let mut conf = b.client_conf("SASL_SSL")?;
    conf.retain(|(k, _)| k != "sasl.password");
    conf.push(("sasl.password".into(), "wrong".into()));
    let out = run_client("expect-auth-fail", &conf, &[])?;
    println!("SCRAM wrong password: {out}");
    let mut conf = b.client_conf("SASL_SSL")?;
    conf.retain(|(k, _)| k != "sasl.username");
    conf.push(("sasl.username".into(), format!("not-{SCRAM_USER}")));
    run_client("expect-auth-fail", &conf, &[])?;
    ensure!(
        b.weir.log_text().contains("SASL authentication failed"),
        "failed attempts are logged"
    );
    Ok(())
}

#[test]
fn a_request_before_authentication_closes_the_connection_unserved() -> Result<()> {
    let b = broker()?;
    let addr = b.addr("SASL_PLAINTEXT")?;
    // ApiVersions is served before authentication (clients need it to pick versions) ...
    let mut conn = RawConn::connect(addr)?;
    let versions: ApiVersionsResponse = conn.api_versions()?;
    for key in [ApiKey::SaslHandshake, ApiKey::SaslAuthenticate] {
        ensure!(
            versions.api_keys.iter().any(|k| k.api_key == key as i16),
            "{key:?} advertised"
        );
    }
    // ... Metadata is not: the connection closes with nothing written.
    conn.send(
        ApiKey::Metadata,
        1,
        &MetadataRequest::default().with_topics(None),
    )?;
    let (closed, got) = conn.wait_closed(CLOSE_WITHIN)?;
    ensure!(
        closed && got.is_empty(),
        "closed {closed}, {} bytes served",
        got.len()
    );
    // Also after a handshake, before the token.
    let mut conn = RawConn::connect(addr)?;
    let _: SaslHandshakeResponse = conn.call(
        ApiKey::SaslHandshake,
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    )?;
    conn.send(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?;
    let _: ApiVersionsResponse = conn.recv(ApiKey::ApiVersions, 0, conn.last_correlation_id())?;
    conn.send(
        ApiKey::Metadata,
        1,
        &MetadataRequest::default().with_topics(None),
    )?;
    let (closed, got) = conn.wait_closed(CLOSE_WITHIN)?;
    ensure!(
        closed && got.is_empty(),
        "closed {closed}, {} bytes served",
        got.len()
    );
    // The PLAINTEXT listener of the same node serves Metadata at once.
    let mut plain = RawConn::connect(b.addr("PLAINTEXT")?)?;
    ensure!(plain.metadata().is_ok());
    Ok(())
}

/// `tls-apiversions` against listener `name` with an optional client certificate.
fn tls_probe(b: &SecureBroker, name: &str, cert: Option<(&str, &str)>) -> Result<String> {
    let addr = b.addr(name)?;
    let mut conf = vec![
        ("host".to_string(), addr.ip().to_string()),
        ("ca".to_string(), b.pki.ca_pem.display().to_string()),
    ];
    if let Some((c, k)) = cert {
        conf.push(("cert".to_string(), c.to_string()));
        conf.push(("key".to_string(), k.to_string()));
    }
    // The port is a number in the JSON.
    let json = json_object(&conf).replacen('{', &format!("{{\"port\":{},", addr.port()), 1);
    run_client_json("tls-apiversions", &json, &[])
}

/// TLS records (handshake and requests, both ways) cut into 1..7-byte pieces are served.
#[test]
fn tls_records_arriving_in_pieces_are_served() -> Result<()> {
    let b = broker()?;
    let addr = b.addr("SSL")?;
    let conf = vec![
        ("host".to_string(), addr.ip().to_string()),
        ("ca".to_string(), b.pki.ca_pem.display().to_string()),
    ];
    let json = json_object(&conf).replacen('{', &format!("{{\"port\":{},", addr.port()), 1);
    let out = run_client_json("tls-pieces", &json, &[])?;
    println!("{out}");
    Ok(())
}

#[test]
fn mutual_tls_refuses_clients_without_a_trusted_certificate() -> Result<()> {
    let b = broker()?;
    let (cert, key) = (
        b.pki.client_pem.display().to_string(),
        b.pki.client_key.display().to_string(),
    );
    let trusted = tls_probe(&b, "MTLS", Some((&cert, &key)))?;
    ensure!(trusted == "OK answered", "trusted client: {trusted}");
    let none = tls_probe(&b, "MTLS", None)?;
    ensure!(none.starts_with("OK refused"), "no certificate: {none}");
    let (rcert, rkey) = (
        b.pki.rogue_pem.display().to_string(),
        b.pki.rogue_key.display().to_string(),
    );
    let rogue = tls_probe(&b, "MTLS", Some((&rcert, &rkey)))?;
    ensure!(
        rogue.starts_with("OK refused"),
        "untrusted certificate: {rogue}"
    );
    let (ecert, ekey) = (
        b.pki.expired_pem.display().to_string(),
        b.pki.expired_key.display().to_string(),
    );
    let expired = tls_probe(&b, "MTLS", Some((&ecert, &ekey)))?;
    ensure!(
        expired.starts_with("OK refused"),
        "expired certificate: {expired}"
    );
    ensure!(
        b.weir.log_text().to_lowercase().contains("expired"),
        "the expired certificate is named in the log"
    );
    // The SSL listener (ssl.client.auth=none) serves a client without a certificate.
    let ssl = tls_probe(&b, "SSL", None)?;
    ensure!(ssl == "OK answered", "SSL listener: {ssl}");
    Ok(())
}

#[test]
fn plaintext_to_a_tls_port_and_a_stalled_handshake_are_dropped() -> Result<()> {
    let b = broker()?;
    let addr = b.addr("SSL")?;
    // A Kafka request in the clear is not a TLS ClientHello: closed, nothing served.
    let mut conn = RawConn::connect(addr)?;
    conn.send(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?;
    let (closed, got) = conn.wait_closed(CLOSE_WITHIN)?;
    ensure!(closed, "plaintext to the TLS port left open");
    ensure!(
        got.len() < 64,
        "only a TLS alert may come back, got {} bytes",
        got.len()
    );
    // A client that connects and sends nothing is dropped at the handshake deadline.
    let started = Instant::now();
    let mut stall = RawConn::connect(addr)?;
    let (closed, _) = stall.wait_closed(CLOSE_WITHIN)?;
    let took = started.elapsed();
    ensure!(
        closed,
        "a stalled handshake is still open after {CLOSE_WITHIN:?}"
    );
    ensure!(
        took >= Duration::from_millis(HANDSHAKE_TIMEOUT_MS - 200),
        "dropped after {took:?}, before the deadline"
    );
    // Half a ClientHello, then nothing: dropped the same way.
    let mut half = RawConn::connect(addr)?;
    half.send_raw(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])?;
    let (closed, _) = half.wait_closed(CLOSE_WITHIN)?;
    ensure!(closed, "a half ClientHello is still open");
    ensure!(
        b.weir.log_text().contains("ssl.handshake.timeout.ms"),
        "the drop is logged"
    );
    Ok(())
}
