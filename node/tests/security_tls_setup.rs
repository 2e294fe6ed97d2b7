//! The TLS setup from Kafka's PEM keys (file and inline forms, per-listener prefix), its
//! refusals, and the principal of a real client certificate (made by the openssl CLI) in
//! Kafka's default form.

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use weir::config::Properties;
use weir::security::tls::{self, ClientAuth};
use weir_tests::certs;

#[test]
fn pem_keys_build_a_tls_setup_and_the_client_subject_is_the_principal() {
    let dir = tempfile::tempdir().expect("tmp");
    let pki = certs::make(dir.path()).expect("certificates");
    let keystore = pki.server_keystore().expect("keystore");
    let mut p = Properties::default();
    p.set("ssl.keystore.location", &keystore.display().to_string());
    let plain = tls::setup(&p, "SSL").expect("file keystore");
    assert_eq!(plain.client_auth, ClientAuth::None);
    assert_eq!(
        plain.handshake_timeout_ms,
        tls::HANDSHAKE_TIMEOUT_MS_DEFAULT
    );

    // Inline chain, key and truststore under the listener prefix, one-line PEM included.
    let read = |f: &std::path::Path| std::fs::read_to_string(f).expect("pem");
    let one_line = read(&pki.ca_pem).replace('\n', " ");
    p.set(
        "listener.name.mtls.ssl.keystore.certificate.chain",
        &read(&pki.server_pem),
    );
    p.set(
        "listener.name.mtls.ssl.keystore.key",
        &read(&pki.server_key),
    );
    p.set("listener.name.mtls.ssl.truststore.certificates", &one_line);
    p.set("listener.name.mtls.ssl.client.auth", "required");
    let mtls = tls::setup(&p, "MTLS").expect("inline keystore");
    assert_eq!(mtls.client_auth, ClientAuth::Required);

    let der = CertificateDer::from_pem_file(&pki.client_pem).expect("client cert");
    assert_eq!(
        tls::principal_of_certificate(&der).as_deref(),
        Some("CN=alice,O=weir"),
        "RFC 2253 order: most specific first"
    );
}

#[test]
fn bad_tls_keys_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let pki = certs::make(dir.path()).expect("certificates");
    let keystore = pki.server_keystore().expect("keystore");
    let ks = keystore.display().to_string();
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (vec![], "ssl.keystore.location"),
        (
            vec![
                ("ssl.keystore.location", ks.clone()),
                ("ssl.keystore.type", "JKS".into()),
            ],
            "ssl.keystore.type",
        ),
        (
            vec![
                ("ssl.keystore.location", ks.clone()),
                ("ssl.key.password", "x".into()),
            ],
            "ssl.key.password",
        ),
        (
            vec![
                ("ssl.keystore.location", ks.clone()),
                ("ssl.client.auth", "required".into()),
            ],
            "truststore",
        ),
        (
            vec![
                ("ssl.keystore.location", ks.clone()),
                ("ssl.client.auth", "maybe".into()),
            ],
            "ssl.client.auth",
        ),
        (
            vec![("ssl.keystore.location", "/nonexistent.pem".into())],
            "ssl.keystore.location",
        ),
        (
            vec![
                ("ssl.keystore.location", ks),
                ("ssl.handshake.timeout.ms", "0".into()),
            ],
            "ssl.handshake.timeout.ms",
        ),
    ];
    for (keys, named) in cases {
        let mut p = Properties::default();
        for (k, v) in &keys {
            p.set(k, v);
        }
        let err = match tls::setup(&p, "SSL") {
            Ok(_) => panic!("{keys:?} accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(named), "{keys:?}: {err}");
    }
}
