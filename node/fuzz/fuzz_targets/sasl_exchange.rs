//! The SASL exchange (SaslHandshake's chosen mechanism, then SaslAuthenticate tokens) fed
//! arbitrary tokens, in every mechanism weir offers. A step never panics; a failure always
//! leaves the connection `Failed`; and the only way to open a connection is a PLAIN token
//! naming a configured user with its password. SCRAM cannot be opened by a fuzzer: the
//! client proof depends on the server's random nonce, so a SCRAM exchange that opens is a
//! bug.
//!
//! Input: one byte picks the mechanism, then tokens, each preceded by its length (one byte).

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use weir::config::Properties;
use weir::metadata::Catalog;
use weir::security::sasl::{self, Mechanism, SaslSetup, SaslState, Step};
use weir::security::scram::{self, ScramCredential, ScramMechanism};

struct Fixture {
    setup: SaslSetup,
    catalog: Catalog,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let mut props = Properties::default();
        props.set("sasl.plain.users", "alice:secret");
        let setup = sasl::setup(&props, "CLIENT").expect("a valid SASL setup");
        let mut catalog = Catalog::default();
        for m in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            let salted = m.salted_password(b"secret", b"salt", scram::ITERATIONS_MIN);
            let cred = ScramCredential::from_salted(m, b"salt", scram::ITERATIONS_MIN, &salted);
            catalog
                .scram_users
                .entry("alice".into())
                .or_default()
                .insert(m.name().into(), cred);
        }
        Fixture { setup, catalog }
    })
}

/// The PLAIN tokens that may authenticate: `[authzid] NUL user NUL password`.
fn is_valid_plain(token: &[u8]) -> bool {
    token == b"\0alice\0secret" || token == b"alice\0alice\0secret"
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, mut rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let mechanism = match pick % 3 {
        0 => Mechanism::Plain,
        1 => Mechanism::Scram(ScramMechanism::Sha256),
        _ => Mechanism::Scram(ScramMechanism::Sha512),
    };
    let mut state = if pick & 0x80 != 0 {
        // A token before any handshake must fail.
        SaslState::Handshake
    } else {
        SaslState::Token(mechanism)
    };
    while let Some((&len, tail)) = rest.split_first() {
        let token = &tail[..usize::from(len).min(tail.len())];
        rest = &tail[token.len()..];
        let was_open = state.is_open();
        let step = sasl::step(&mut state, &f.setup, &f.catalog, token);
        if let Step::Failure(_) = step {
            assert!(
                matches!(state, SaslState::Failed),
                "a failure leaves the state failed"
            );
        }
        if state.is_open() && !was_open {
            assert_eq!(
                mechanism,
                Mechanism::Plain,
                "a SCRAM exchange opened on fuzzed tokens"
            );
            assert!(is_valid_plain(token), "PLAIN opened on {token:?}");
            assert!(matches!(step, Step::Success { ref user, .. } if user == "alice"));
        }
    }
});
