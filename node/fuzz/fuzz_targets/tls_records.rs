//! TLS records arriving in pieces: a real rustls client talks to a server built from
//! weir's own listener setup (`security::tls::setup`, PEM keys as a user gives them), and
//! every byte the client sends reaches the server cut at fuzzer-chosen points, optionally
//! with one byte flipped. The server never panics and never hands out bytes the client
//! did not send: what it decrypts is always a prefix of the client's plaintext, and all of
//! it when nothing was flipped.
//!
//! Input: 20 header bytes (flip flag, flip position u16, flip mask, 16 chunk lengths), then
//! the plaintext the client writes.

#![no_main]

use std::io::{Read, Write};
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use weir::config::Properties;

const CERT: &str = include_str!("../testdata/cert.pem");
const KEY: &str = include_str!("../testdata/key.pem");
const HEADER: usize = 20;
/// Rounds of client → server → client; a TLS 1.3 handshake and its data need three.
const ROUNDS_MAX: usize = 16;

struct Fixture {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let mut props = Properties::default();
        props.set("ssl.keystore.type", "PEM");
        props.set("ssl.keystore.certificate.chain", CERT);
        props.set("ssl.keystore.key", KEY);
        let server = weir::security::tls::setup(&props, "SSL")
            .expect("weir's TLS setup")
            .config;
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(CERT.as_bytes()).expect("test certificate"))
            .expect("trusted test certificate");
        let client =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        Fixture {
            server,
            client: Arc::new(client),
        }
    })
}

/// Moves everything readable out of `server` into `into`.
fn drain(server: &mut ServerConnection, into: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    loop {
        match server.reader().read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => into.extend_from_slice(&buf[..n]),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER {
        return;
    }
    let (header, plaintext) = data.split_at(HEADER);
    let flip = header[0] & 1 == 1;
    let flip_at = usize::from(u16::from_le_bytes([header[1], header[2]]));
    let flip_mask = header[3] | 1;
    let chunks = &header[4..];
    let f = fixture();
    let name = ServerName::try_from("localhost").expect("server name");
    let mut client = ClientConnection::new(f.client.clone(), name).expect("client");
    let mut server = ServerConnection::new(f.server.clone()).expect("server");
    client
        .writer()
        .write_all(plaintext)
        .expect("client buffers plaintext");

    let mut sent = 0usize; // client → server bytes so far (where the flip lands)
    let mut chunk = 0usize;
    let mut received = Vec::new();
    let mut failed = false;
    'rounds: for _ in 0..ROUNDS_MAX {
        let mut wire = Vec::new();
        while client.wants_write() {
            if client.write_tls(&mut wire).is_err() {
                break;
            }
        }
        if flip && (sent..sent + wire.len()).contains(&flip_at) {
            wire[flip_at - sent] ^= flip_mask;
        }
        sent += wire.len();
        let mut at = 0;
        while at < wire.len() {
            let len = (usize::from(chunks[chunk % chunks.len()]) + 1).min(wire.len() - at);
            chunk += 1;
            let mut piece = &wire[at..at + len];
            at += len;
            // read_tls refuses more when its buffer is full: process, drain, and retry.
            for _ in 0..8 {
                if piece.is_empty() {
                    break;
                }
                let _ = server.read_tls(&mut piece);
                if server.process_new_packets().is_err() {
                    failed = true;
                    break 'rounds;
                }
                drain(&mut server, &mut received);
            }
        }
        let mut back = Vec::new();
        while server.wants_write() {
            if server.write_tls(&mut back).is_err() {
                break;
            }
        }
        let mut rd = &back[..];
        while !rd.is_empty() {
            match client.read_tls(&mut rd) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if client.process_new_packets().is_err() {
                break 'rounds;
            }
        }
        if wire.is_empty() && back.is_empty() {
            break;
        }
    }
    assert!(
        plaintext.starts_with(&received),
        "the server decrypted bytes the client never sent"
    );
    if !flip {
        assert!(!failed, "an intact stream was refused");
        assert_eq!(
            received.len(),
            plaintext.len(),
            "an intact stream lost bytes"
        );
    }
});
