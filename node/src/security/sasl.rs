//! SASL on the SASL_PLAINTEXT and SASL_SSL listeners: which mechanisms a listener offers,
//! the PLAIN users, and the per-connection state machine that SaslHandshake and
//! SaslAuthenticate drive (KIP-43, KIP-152). Until it reaches [`SaslState::Done`] the
//! connection serves nothing but ApiVersions, SaslHandshake and SaslAuthenticate.

use std::collections::BTreeMap;

use subtle::ConstantTimeEq;

use super::scram::{self, ScramMechanism, ScramServer};
use super::tls::listener_prop;
use crate::config::Properties;
use crate::metadata::Catalog;

/// Default `sasl.enabled.mechanisms`: what weir implements (Kafka's own default, GSSAPI,
/// is not offered).
pub const ENABLED_MECHANISMS_DEFAULT: &str = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512";
/// Default of `connection.failed.authentication.delay.ms` (Kafka's key; Kafka's default
/// is 100 ms, weir waits longer so that guessing passwords costs a second per try).
pub const FAILED_AUTH_DELAY_MS_DEFAULT: u64 = 1_000;
/// Default of `sasl.server.max.receive.size` (Kafka's key and default): the largest frame
/// read from a connection before it has authenticated.
pub const SERVER_MAX_RECEIVE_BYTES_DEFAULT: usize = 524_288;
/// Longest PLAIN message (authzid, user, password) accepted.
const PLAIN_MESSAGE_MAX_BYTES: usize = 4096;

/// A SASL mechanism weir speaks (shared with its clients' logins).
pub use wire::sasl::Mechanism;

/// What a SASL listener offers and checks against.
#[derive(Debug, Clone)]
pub struct SaslSetup {
    pub mechanisms: Vec<Mechanism>,
    /// PLAIN users and passwords (from `sasl.plain.users` and the JAAS form).
    plain_users: BTreeMap<String, String>,
    pub failed_auth_delay_ms: u64,
    /// `sasl.server.max.receive.size`: a larger frame before authentication closes the
    /// connection, so a stranger cannot make the broker buffer `socket.request.max.bytes`.
    pub max_receive_bytes: usize,
    /// KIP-368 `connections.max.reauth.ms` of each enabled mechanism (0: no lifetime).
    reauth_ms: Vec<(Mechanism, u64)>,
}

/// Reads the SASL keys of `listener`.
pub fn setup(props: &Properties, listener: &str) -> anyhow::Result<SaslSetup> {
    let get = |key: &str| listener_prop(props, listener, key);
    let text = get("sasl.enabled.mechanisms").unwrap_or(ENABLED_MECHANISMS_DEFAULT);
    let mut mechanisms = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let m = Mechanism::parse(name).ok_or_else(|| {
            anyhow::anyhow!("sasl.enabled.mechanisms: {name} is not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
        })?;
        mechanisms.push(m);
    }
    if mechanisms.is_empty() {
        anyhow::bail!("listener {listener}: sasl.enabled.mechanisms is empty");
    }
    let mut plain_users = BTreeMap::new();
    if let Some(list) = get("sasl.plain.users") {
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (user, password) = item
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("sasl.plain.users: expected USER:PASSWORD[,...]"))?;
            plain_users.insert(user.to_string(), password.to_string());
        }
    }
    // Kafka's own form: `listener.name.<l>.plain.sasl.jaas.config=... user_alice="pw";`
    let jaas_key = format!(
        "listener.name.{}.plain.sasl.jaas.config",
        listener.to_ascii_lowercase()
    );
    if let Some(jaas) = props.get(&jaas_key).or_else(|| get("sasl.jaas.config")) {
        plain_users.extend(jaas_users(jaas));
    }
    let failed_auth_delay_ms = match get("connection.failed.authentication.delay.ms") {
        None => FAILED_AUTH_DELAY_MS_DEFAULT,
        Some(v) => v.trim().parse().map_err(|_| {
            anyhow::anyhow!("connection.failed.authentication.delay.ms={v}: not a number")
        })?,
    };
    let max_receive_bytes = match get("sasl.server.max.receive.size") {
        None => SERVER_MAX_RECEIVE_BYTES_DEFAULT,
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=i32::MAX as usize).contains(n))
            .ok_or_else(|| {
                anyhow::anyhow!("sasl.server.max.receive.size={v}: expected a number of bytes > 0")
            })?,
    };
    let mut reauth_ms = Vec::with_capacity(mechanisms.len());
    for &m in &mechanisms {
        reauth_ms.push((m, reauth_ms_of(props, listener, m)?));
    }
    Ok(SaslSetup {
        mechanisms,
        plain_users,
        failed_auth_delay_ms,
        max_receive_bytes,
        reauth_ms,
    })
}

/// `connections.max.reauth.ms` of mechanism `m` on `listener`, the most specific form
/// first, as Kafka reads it: `listener.name.<l>.<mechanism>.`, then `listener.name.<l>.`,
/// then the broker-wide key; 0 (Kafka's default) when none is set.
fn reauth_ms_of(props: &Properties, listener: &str, m: Mechanism) -> anyhow::Result<u64> {
    let prefix = format!("listener.name.{}.", listener.to_ascii_lowercase());
    let by_mechanism = format!("{prefix}{}.{REAUTH_KEY}", m.name().to_ascii_lowercase());
    let by_listener = format!("{prefix}{REAUTH_KEY}");
    let found = [by_mechanism.as_str(), by_listener.as_str(), REAUTH_KEY]
        .into_iter()
        .find_map(|key| props.get(key).map(|v| (key, v)));
    let Some((key, v)) = found else {
        return Ok(0);
    };
    parse_reauth_ms(v).ok_or_else(|| anyhow::anyhow!("{key}={v}: {REAUTH_RANGE}"))
}

/// Kafka's key for the session lifetime (KIP-368).
pub const REAUTH_KEY: &str = "connections.max.reauth.ms";
/// What a `connections.max.reauth.ms` value must be.
pub const REAUTH_RANGE: &str = "expected milliseconds (0 or less: no session lifetime)";

/// A `connections.max.reauth.ms` value: milliseconds, 0 for none (Kafka: any value not
/// positive); `None` if not a number.
pub fn parse_reauth_ms(v: &str) -> Option<u64> {
    let ms = v.trim().parse::<i64>().ok()?;
    Some(u64::try_from(ms).unwrap_or(0))
}

/// The `user_NAME="PASSWORD"` options of a PlainLoginModule JAAS line.
fn jaas_users(jaas: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = jaas;
    while let Some(at) = rest.find("user_") {
        let after = &rest[at + 5..];
        let Some(eq) = after.find('=') else { break };
        let name = after[..eq].trim();
        let value = after[eq + 1..].trim_start();
        let Some(quoted) = value.strip_prefix('"') else {
            rest = &after[eq + 1..];
            continue;
        };
        let Some(close) = quoted.find('"') else { break };
        if !name.is_empty() && !name.contains(char::is_whitespace) {
            out.push((name.to_string(), quoted[..close].to_string()));
        }
        rest = &quoted[close + 1..];
    }
    out
}

/// Where one connection is in its authentication.
#[derive(Debug, Default)]
pub enum SaslState {
    /// The listener needs no SASL.
    #[default]
    NotRequired,
    /// Waiting for SaslHandshake.
    Handshake,
    /// A mechanism was chosen; waiting for the client's first token.
    Token(Mechanism),
    /// SCRAM: server-first sent; waiting for client-final.
    ScramFinal(Box<ScramServer>),
    /// Authenticated: everything is served.
    Done,
    /// Failed or broken off: the connection closes after the answer.
    Failed,
}

impl SaslState {
    /// Whether requests other than the SASL ones may be served.
    pub fn is_open(&self) -> bool {
        matches!(self, SaslState::NotRequired | SaslState::Done)
    }
}

/// The result of one SaslAuthenticate token.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Send this challenge; another token is expected.
    Challenge(Vec<u8>),
    /// Authenticated as `user`; send the final token (empty for PLAIN).
    Success { token: Vec<u8>, user: String },
    /// Refused: the reason is logged, the client gets SASL_AUTHENTICATION_FAILED.
    Failure(String),
}

/// Advances `state` by one client token. The state is `Failed` after a failure.
pub fn step(state: &mut SaslState, setup: &SaslSetup, catalog: &Catalog, token: &[u8]) -> Step {
    let taken = std::mem::replace(state, SaslState::Failed);
    let (next, step) = match taken {
        SaslState::Token(Mechanism::Plain) => match check_plain(setup, token) {
            Ok(user) => (
                SaslState::Done,
                Step::Success {
                    token: Vec::new(),
                    user,
                },
            ),
            Err(why) => (SaslState::Failed, Step::Failure(why)),
        },
        SaslState::Token(Mechanism::Scram(m)) => scram_first(m, catalog, token),
        SaslState::ScramFinal(server) => match server.finish(token) {
            Ok(v) => (
                SaslState::Done,
                Step::Success {
                    token: v,
                    user: server.user().to_string(),
                },
            ),
            Err(e) => (
                SaslState::Failed,
                Step::Failure(format!("user {:?}: {e}", server.user())),
            ),
        },
        other => {
            let why = format!("SaslAuthenticate in state {}", state_name(&other));
            (SaslState::Failed, Step::Failure(why))
        }
    };
    *state = next;
    step
}

fn scram_first(m: ScramMechanism, catalog: &Catalog, token: &[u8]) -> (SaslState, Step) {
    let first = match scram::parse_client_first(token) {
        Ok(f) => f,
        Err(e) => return (SaslState::Failed, Step::Failure(e.to_string())),
    };
    let Some(credential) = crate::metadata::scram::credential(catalog, &first.user, m) else {
        let why = format!(
            "user {:?}: {}",
            first.user,
            scram::ScramError::UnknownUser(m.name())
        );
        return (SaslState::Failed, Step::Failure(why));
    };
    let (server, server_first) = ScramServer::start(m, first, credential);
    (
        SaslState::ScramFinal(Box::new(server)),
        Step::Challenge(server_first),
    )
}

impl SaslSetup {
    /// KIP-368: how long a session authenticated with `m` lasts before the client must
    /// authenticate again on the same connection; `None` when it does not expire.
    /// (Kafka takes the smaller of this and the credential's expiry: PLAIN and SCRAM
    /// credentials have none.)
    pub fn session_lifetime_ms(&self, m: Mechanism) -> Option<u64> {
        self.reauth_ms
            .iter()
            .find(|(mechanism, _)| *mechanism == m)
            .map(|(_, ms)| *ms)
            .filter(|ms| *ms > 0)
    }

    /// Whether PLAIN `user` with `password` logs in here.
    pub fn check_plain(&self, user: &str, password: &str) -> bool {
        let token = format!("\0{user}\0{password}");
        check_plain(self, token.as_bytes()).is_ok()
    }
}

/// RFC 4616: `[authzid] NUL authcid NUL passwd`; an authzid must equal the user.
fn check_plain(setup: &SaslSetup, token: &[u8]) -> Result<String, String> {
    if token.len() > PLAIN_MESSAGE_MAX_BYTES {
        return Err("PLAIN message too long".into());
    }
    let mut parts = token.split(|b| *b == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed PLAIN message".into());
    };
    let user = std::str::from_utf8(user).map_err(|_| "user name is not UTF-8".to_string())?;
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(format!("user {user:?}: authzid differs from the user"));
    }
    let Some(expected) = setup.plain_users.get(user) else {
        return Err(format!("user {user:?}: unknown PLAIN user"));
    };
    if !bool::from(expected.as_bytes().ct_eq(password)) {
        return Err(format!("user {user:?}: wrong password"));
    }
    Ok(user.to_string())
}

pub fn state_name(state: &SaslState) -> &'static str {
    match state {
        SaslState::NotRequired => "not-required",
        SaslState::Handshake => "awaiting-handshake",
        SaslState::Token(_) => "awaiting-token",
        SaslState::ScramFinal(_) => "awaiting-scram-final",
        SaslState::Done => "authenticated",
        SaslState::Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_setup() -> SaslSetup {
        let mut p = Properties::default();
        p.set("sasl.plain.users", "alice:secret,bob:pw");
        p.set(
            "listener.name.client.plain.sasl.jaas.config",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="x" user_admin="x" user_carol="c-pw";"#,
        );
        setup(&p, "CLIENT").expect("setup")
    }

    #[test]
    fn plain_checks_user_and_password() {
        let s = plain_setup();
        let catalog = Catalog::default();
        let run = |token: &[u8]| {
            let mut state = SaslState::Token(Mechanism::Plain);
            let step = step(&mut state, &s, &catalog, token);
            (step, state.is_open())
        };
        assert_eq!(
            run(b"\0alice\0secret"),
            (
                Step::Success {
                    token: vec![],
                    user: "alice".into()
                },
                true
            )
        );
        assert!(
            matches!(run(b"carol\0carol\0c-pw").0, Step::Success { .. }),
            "JAAS users"
        );
        for bad in [
            &b"\0alice\0wrong"[..],
            b"\0nobody\0x",
            b"bob\0alice\0secret",
            b"alice",
            b"\0a\0b\0c",
        ] {
            let (step, open) = run(bad);
            assert!(matches!(step, Step::Failure(_)), "{bad:?}");
            assert!(!open);
        }
    }

    #[test]
    fn tokens_out_of_order_fail_and_mechanisms_parse() {
        let s = plain_setup();
        let mut state = SaslState::Handshake;
        assert!(matches!(
            step(&mut state, &s, &Catalog::default(), b"x"),
            Step::Failure(_)
        ));
        assert!(matches!(state, SaslState::Failed));
        assert_eq!(s.mechanisms.len(), 3);
        let mut p = Properties::default();
        p.set("sasl.enabled.mechanisms", "GSSAPI");
        assert!(setup(&p, "X").is_err());
    }

    proptest::proptest! {
        /// Any bytes in any state: a step never panics, and only a complete valid exchange
        /// can open the connection (random bytes never authenticate).
        #[test]
        fn arbitrary_tokens_never_panic_nor_authenticate(
            tokens in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 1..4),
            mech in 0usize..3,
        ) {
            let s = plain_setup();
            let mut catalog = Catalog::default();
            let m = ScramMechanism::Sha256;
            let salted = m.salted_password(b"pw", b"salt", scram::ITERATIONS_MIN);
            let cred = scram::ScramCredential::from_salted(m, b"salt", scram::ITERATIONS_MIN, &salted);
            catalog.scram_users.entry("u".into()).or_default().insert(m.name().into(), cred);
            let mechanism = [
                Mechanism::Plain,
                Mechanism::Scram(ScramMechanism::Sha256),
                Mechanism::Scram(ScramMechanism::Sha512),
            ][mech];
            let mut state = SaslState::Token(mechanism);
            for token in &tokens {
                let _ = step(&mut state, &s, &catalog, token);
                proptest::prop_assert!(!state.is_open(), "random bytes authenticated");
            }
        }
    }

    /// KIP-368's lifetime per mechanism: `listener.name.<l>.<mechanism>.` wins over
    /// `listener.name.<l>.`, which wins over the broker-wide key; unset is 0 (none); a
    /// value that is not milliseconds stops the setup with its key named.
    #[test]
    fn the_most_specific_reauth_key_gives_each_mechanisms_lifetime() {
        let scram = Mechanism::Scram(ScramMechanism::Sha512);
        let mut p = Properties::default();
        let none = setup(&p, "CLIENT").expect("setup");
        assert_eq!(none.session_lifetime_ms(Mechanism::Plain), None);
        p.set("connections.max.reauth.ms", "60000");
        let broker = setup(&p, "CLIENT").expect("setup");
        assert_eq!(broker.session_lifetime_ms(Mechanism::Plain), Some(60_000));
        p.set("listener.name.client.connections.max.reauth.ms", "30000");
        p.set(
            "listener.name.client.scram-sha-512.connections.max.reauth.ms",
            "0",
        );
        let s = setup(&p, "CLIENT").expect("setup");
        assert_eq!(s.session_lifetime_ms(Mechanism::Plain), Some(30_000));
        assert_eq!(s.session_lifetime_ms(scram), None, "0 turns it off");
        assert_eq!(
            setup(&p, "OTHER")
                .expect("setup")
                .session_lifetime_ms(scram),
            Some(60_000),
            "another listener has the broker-wide value"
        );
        p.set("listener.name.client.plain.connections.max.reauth.ms", "-5");
        let off = setup(&p, "CLIENT").expect("not positive: off, as Kafka");
        assert_eq!(off.session_lifetime_ms(Mechanism::Plain), None);
        p.set(
            "listener.name.client.plain.connections.max.reauth.ms",
            "soon",
        );
        let err = setup(&p, "CLIENT").expect_err("not a number").to_string();
        assert!(
            err.contains("listener.name.client.plain.connections.max.reauth.ms"),
            "{err}"
        );
    }

    #[test]
    fn scram_unknown_user_fails_at_once() {
        let s = plain_setup();
        let mut state = SaslState::Token(Mechanism::Scram(ScramMechanism::Sha512));
        let out = step(&mut state, &s, &Catalog::default(), b"n,,n=ghost,r=abc");
        assert!(matches!(out, Step::Failure(ref w) if w.contains("ghost")));
    }
}
